/* tensor/trace.h - private: the library's own spans for the timeline trace and the op
 * profiler (the public side is nabla/trace.h; tensor/trace.c records and writes them).
 *
 * Every instrumented place is one span: NB__SPAN_BEGIN before the work, NB__SPAN_END after
 * it, on the same thread:
 *
 *     int tok = NB__SPAN_BEGIN("linear", "gemm", NB__CAT_OP);
 *     st = be->k.gemm(a);
 *     NB__SPAN_END_WORK(tok, flops, bytes);
 *
 * When neither tracing nor profiling is on, NB__SPAN_BEGIN is one load of a global flag and
 * one predictable branch, and NB__SPAN_END a test of a zero token: no clock is read, nothing
 * is called. The flag starts in an "unknown" state, so the first span anywhere reads the
 * NB_TRACE / NB_PROFILE environment variables (and leaves the flag 0 when neither is set).
 *
 * Names and details must be strings that live as long as the process (literals, the op
 * names of tensor/op_table.h): the trace keeps the pointers until it writes the file. Spans
 * nest per thread; a token is 0 for "not recorded" and otherwise the span's depth + 1, so
 * an end whose begin was not recorded (tracing switched on in between) does nothing.
 *
 * Plain C with GCC builtins (no stdatomic.h): the kernel interface includes it through
 * tensor/backend.h, and the kernels (cpu/gemm.c) use it too. */
#ifndef NABLA_TENSOR_TRACE_H
#define NABLA_TENSOR_TRACE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Categories: the "cat" of a trace event and the "Kind" column of the profiler table. */
typedef enum nb__cat {
    NB__CAT_OP,       /* a kernel call of an op (tensor/backend.h); detail = the kernel */
    NB__CAT_MODULE,   /* nb_forward of a module; name = its type name */
    NB__CAT_BACKWARD, /* nb_backward as a whole, and one backward rule per tape node */
    NB__CAT_GEMM,     /* one GEMM of the CPU provider; detail = the provider */
    NB__CAT_COMM,     /* collectives: start, run on the communication thread, wait */
    NB__CAT_DDP,      /* data parallel: bucket launches, waits, the exposed part of a step */
    NB__CAT_DATA,     /* the loader: producing a batch, waiting for one */
    NB__CAT_IO,       /* checkpoints: snapshot, write, read */
    NB__CAT_OPTIM,    /* optimizer steps, gradient clipping */
    NB__CAT_USER,     /* nb_trace_begin / nb_trace_end */
    NB__CAT_COUNT
} nb__cat;

/* bit 0: tracing, bit 1: profiling, bit 7: not yet initialised (read the environment). */
#define NB__TRACE_TRACING 1
#define NB__TRACE_PROFILING 2
#define NB__TRACE_UNINIT 128
extern int nb__trace_flags;

#define NB__TRACE_ACTIVE() \
    __builtin_expect(__atomic_load_n(&nb__trace_flags, __ATOMIC_RELAXED) != 0, 0)

/* Slow paths (tensor/trace.c): only called when NB__TRACE_ACTIVE(). */
int nb__span_begin(const char *name, const char *detail, nb__cat cat);
/* End the span of token tok; flops and bytes (0: unknown) are its work, which the trace
 * writes as arguments and the profiler turns into GFLOP/s and GB/s. */
void nb__span_end(int tok, int64_t flops, int64_t bytes);
/* The same with one integer argument named key (a bucket number, a byte count) that the
 * trace writes; key is a literal. */
void nb__span_end_arg(int tok, const char *key, int64_t value);

#define NB__SPAN_BEGIN(name, detail, cat) \
    (NB__TRACE_ACTIVE() ? nb__span_begin((name), (detail), (cat)) : 0)
#define NB__SPAN_END(tok)                      \
    do {                                       \
        if (tok) nb__span_end((tok), 0, 0);    \
    } while (0)
#define NB__SPAN_END_WORK(tok, flops, bytes)          \
    do {                                              \
        if (tok) nb__span_end((tok), (flops), (bytes)); \
    } while (0)
#define NB__SPAN_END_ARG(tok, key, value)               \
    do {                                                \
        if (tok) nb__span_end_arg((tok), (key), (value)); \
    } while (0)

/* A finished interval measured elsewhere (t0_ns, t1_ns from nb__trace_now_ns), drawn as an
 * async slice on its own row (Perfetto groups async slices by name): an allreduce from its
 * start to the wait that saw it complete. id tells concurrent ones apart. */
void nb__trace_async(const char *name, nb__cat cat, int64_t id, int64_t t0_ns, int64_t t1_ns,
                     const char *key, int64_t value);
/* The clock of the trace (CLOCK_MONOTONIC, nanoseconds). */
int64_t nb__trace_now_ns(void);

/* The host allocator's bytes in use and cached, as counters (at most one event per thread
 * per 20 microseconds). */
void nb__trace_memory(int64_t in_use, int64_t cached);

/* Names the calling thread's row in the trace ("loader", "comm"); name is a literal. */
void nb__trace_thread_name(const char *name);

#ifdef __cplusplus
}
#endif

#endif
