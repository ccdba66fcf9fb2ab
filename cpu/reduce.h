/* cpu/reduce.h - private: the CPU kernels behind the reductions of tensor/ops/reduce.c
 * (sum, mean, var, std, logsumexp, amax/amin, max/min with indices, argmax/argmin) and the
 * fused softmax / log_softmax. Kernels do arithmetic only: the op definitions check the
 * arguments, pick output shapes and dtypes and allocate the outputs. */
#ifndef NABLA_CPU_REDUCE_H
#define NABLA_CPU_REDUCE_H

#include <stdbool.h>
#include <stdint.h>

#include "tensor/tensor_impl.h"
#include "cpu/cpu_impl.h" /* transitional: the kernels move to kernel args */

/* What a reduction computes over the reduced elements x of each output element. */
typedef enum nb__rkind {
    NB__RK_SUM,    /* sum x                                       (post DIV: the mean) */
    NB__RK_VAR,    /* sum (x - mean(x))^2                (post DIV / SQRT_DIV: var, std) */
    NB__RK_LSE,    /* log(sum exp(x - m)) + m, m = max x (0 where the max is infinite) */
    NB__RK_MAX,    /* max x, NaN propagates; -inf (or the type's min) if empty          */
    NB__RK_MIN,    /* min x, NaN propagates                                             */
    NB__RK_ARGMAX, /* max x and the index of its first occurrence (NaN is the max)     */
    NB__RK_ARGMIN, /* min x and the index of its first occurrence (NaN is the min)     */
} nb__rkind;

/* What is done with the result a before it is stored (in f64, rounded once to the
 * output dtype). Integer outputs are stored exactly, without post-processing. */
typedef enum nb__rpost {
    NB__RP_NONE,     /* a             */
    NB__RP_DIV,      /* a / den       */
    NB__RP_SQRT_DIV, /* sqrt(a / den) */
} nb__rpost;

typedef struct nb__rspec {
    nb__rkind kind;
    nb__rpost post;
    double den;
    /* Contiguous output with the kept dims of the input in order (keepdim or not, the
     * layout is the same). May be NULL for ARGMAX/ARGMIN when only indices are wanted. */
    nb_tensor *out;
    /* ARGMAX/ARGMIN only: I64 indices shaped like out (may be NULL). */
    nb_tensor *idx;
} nb__rspec;

/* Reduce x over the dims d with reduced[d] (x->ndim entries; nothing is reduced for a 0-dim
 * x). Integer and bool inputs accumulate in int64 (sums wrap like PyTorch's), f32/f16/bf16
 * sum in f64 the f32 partial sums of at most 16 elements (error ~1e-10 relative on 16M
 * uniform values; blocks that overflow in f32 are redone in f64), f64 in f64. VAR and LSE
 * are single kernel calls (a fused two-pass per block of the input, blocks merged exactly
 * as Chan's / the log-sum-exp rescaling rule say), so they need no temporaries. The order
 * of accumulation depends only on the shapes and strides, never on the thread count.
 * Reductions over zero elements store the empty value of the kind (sum 0, VAR 0 before the
 * division, LSE -inf, MAX -inf). */
void nb__cpu_reduce(const nb_tensor *x, const bool *reduced, const nb__rspec *spec);

/* out = softmax(x) (or log_softmax) along dim. x is contiguous, float, with out's shape and
 * dtype; x and out may be the same tensor (the op copies a strided input into out and runs
 * in place). Passes: the row max, exp(x - max) written and summed, the scaling (in cache). */
void nb__cpu_softmax(const nb_tensor *x, nb_tensor *out, int dim, bool log);

#endif
