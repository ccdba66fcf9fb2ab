// tests/cuda_host/cuhost.h - the nvcc-compiled host checks of the CUDA backend's shared
// index and number math (cuda/khelp.h and the __host__ __device__ parts of the kernel
// files), run without a GPU: nvcc compiles these files, their __host__ __device__
// functions run on the CPU, and the results are compared with libnabla's CPU code.
//
// One file per kernel family (tests/cuda_host/<family>.cu) defines
// `void cuhost_<family>(cuhost *t)`; main.cu runs them all and prints a Check-style summary
// line, which tools/run-tests reads. CUHOST_CHECK(t, cond, fmt, ...) counts a check and
// prints the message of a failing one.
#ifndef NABLA_TESTS_CUHOST_H
#define NABLA_TESTS_CUHOST_H

#include <stddef.h>
#include <stdio.h>

typedef struct cuhost {
    long checks, failures;
    const char *family;
} cuhost;

#define CUHOST_CHECK(t, cond, ...)                                                          \
    do {                                                                                   \
        (t)->checks++;                                                                     \
        if (!(cond)) {                                                                     \
            (t)->failures++;                                                               \
            fprintf(stderr, "%s:%d: [%s] check failed: %s: ", __FILE__, __LINE__,          \
                    (t)->family, #cond);                                                   \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fputc('\n', stderr);                                                           \
        }                                                                                  \
    } while (0)

/* The CPU backend's kernel table (tests/cuda_host/cpu_ref.c): the reference. */
#ifdef __cplusplus
extern "C" {
#endif
struct nb__kernels;
const struct nb__kernels *cuhost_cpu(void);
/* Struct layouts as gcc sees them (layout.c): name, size (or offset), alignment. */
typedef struct cuhost_layout_row {
    const char *name;
    size_t size, align;
} cuhost_layout_row;
extern const cuhost_layout_row cuhost_layout_c[];
extern const int cuhost_layout_c_n;
#ifdef __cplusplus
}
#endif

#define CUHOST_FAMILIES(X)                                                                 \
    X(helpers) X(layout) X(core) X(reduce) X(index) X(matmul) X(norm) X(attention) X(conv) X(loss)  \
    X(optim) X(random) X(lm)

#ifdef __cplusplus
#define CUHOST_DECL(f) void cuhost_##f(cuhost *t);
CUHOST_FAMILIES(CUHOST_DECL)
#undef CUHOST_DECL
#endif

#endif
