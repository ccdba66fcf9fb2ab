/* nabla/trace.h - where the time goes: a timeline trace (Chrome trace event format, opens
 * in Perfetto and chrome://tracing) and an op profiler (a table like torch.profiler's key
 * averages). docs/observability.md explains both.
 *
 * Usage:
 *     nb_trace_start("trace.json");       // or run the program with NB_TRACE=trace.json
 *     nb_profile_start();                 // or NB_PROFILE=1 (the table goes to stderr at exit)
 *     for (int step = 0; step < 10; step++) {
 *         nb_trace_begin("step");         // a span of your own, nested around the library's
 *         nb_scope_begin();
 *         nb_tensor *loss = nb_cross_entropy(nb_forward(model, x), y, NULL);
 *         nb_zero_grad(opt);
 *         nb_backward(loss);
 *         nb_step(opt);
 *         nb_scope_end();
 *         nb_trace_end();
 *         nb_trace_counter("loss_scale", 1.0);
 *     }
 *     nb_trace_stop();                    // writes the file
 *     nb_profile_print(stderr, NB_PROFILE_SORT_SELF);
 *     nb_profile_stop();
 *
 * What is recorded: the forward of every module (nb_forward), every op's kernel call, each
 * node of a backward, each GEMM, collectives (start, run, wait) and data parallel buckets,
 * the loader, checkpoints, optimizer steps, and the host allocator's bytes in use. Off (the
 * default), each of those places costs one test of a global flag.
 *
 * The trace: events are kept in per-thread buffers and written when a buffer fills, at
 * nb_trace_stop and at exit. pid is the rank (nb_trace_set_rank; the communicators call it,
 * and mpirun's or Slurm's rank variables are read at start), tid the thread. With more than
 * one rank each rank writes its own file: "%r" in the path is replaced by the rank, and a
 * path without it gets ".rank<r>" appended; nabla-merge-traces (tools/merge-traces in the
 * source tree) joins the files.
 *
 * The profiler: per (name, kind) the calls, the total time (the span from begin to end),
 * the self time (total minus the nested spans), their share of the wall time since
 * nb_profile_start, and GFLOP/s or GB/s where the op knows its work.
 *
 * Environment (read at the first span): NB_TRACE=PATH starts the trace; NB_PROFILE=1 the
 * profiler with the table on stderr at exit, NB_PROFILE=PATH with the table in that file
 * (%r as above); NB_PROFILE_SORT=self|total|calls orders it (default self).
 *
 * Ownership: names passed in are copied; nothing is returned that the caller frees.
 * Threads: spans and counters may be recorded from any thread; start, stop, print and
 * reset are for one thread at a time. */
#ifndef NABLA_TRACE_H
#define NABLA_TRACE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "nabla/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the timeline trace ------------------------------------------------------------------ */
/* Start recording into path (NB_EINVAL for an empty path, NB_ESTATE when a trace is already
 * being recorded). The file is opened when the first buffer is written (NB_EIO then shows
 * in nb_trace_stop). */
nb_status nb_trace_start(const char *path);
/* Write what is left and close the file; the path written (with the rank) is reported by
 * nb_trace_path until the next start. NB_OK when no trace was running. */
nb_status nb_trace_stop(void);
bool nb_trace_enabled(void);
/* The file the trace writes (or wrote), "" when none. */
const char *nb_trace_path(void);
/* The rank and world size this process records under (pid and the file name). */
void nb_trace_set_rank(int rank, int size);

/* A span of your own on the calling thread: begin and end nest like parentheses. name is
 * copied. Cheap no-ops when neither the trace nor the profiler runs. */
void nb_trace_begin(const char *name);
void nb_trace_end(void);
/* A counter sample (drawn as a graph of its own): name is copied. */
void nb_trace_counter(const char *name, double value);

/* ---- the op profiler --------------------------------------------------------------------- */
typedef enum nb_profile_sort {
    NB_PROFILE_SORT_SELF,   /* self time, largest first */
    NB_PROFILE_SORT_TOTAL,  /* total time, largest first */
    NB_PROFILE_SORT_CALLS,  /* number of calls, most first */
} nb_profile_sort;

/* Start (or restart: the statistics are cleared) profiling. */
nb_status nb_profile_start(void);
/* Stop collecting; the statistics stay for nb_profile_print until the next start. */
void nb_profile_stop(void);
bool nb_profile_enabled(void);
/* Print the table (rows of every thread, the rank in the header) to f. NB_ENULL for f NULL. */
nb_status nb_profile_print(FILE *f, nb_profile_sort sort);

/* One row of the table, summed over threads, and the totals the table's footer gives. */
typedef struct nb_profile_row {
    int64_t calls;
    double total_s, self_s;
    int64_t flops, bytes;   /* summed work of the calls that reported it, 0 if none */
} nb_profile_row;
/* The row of name (and kind, or NULL for the sum over every kind): false if none. */
bool nb_profile_row_get(const char *name, const char *kind, nb_profile_row *out);
typedef struct nb_profile_totals {
    double wall_s;     /* since nb_profile_start (to nb_profile_stop if stopped) */
    double covered_s;  /* time inside outermost spans, on the thread that has the most */
    int rows;
} nb_profile_totals;
void nb_profile_get_totals(nb_profile_totals *out);

#ifdef __cplusplus
}
#endif

#endif
