/* cpu/reduce_back.h - private: fused CPU kernels of the backward rules of tensor/ops/reduce.c
 * and tensor/ops/index.c (softmax / log_softmax backward, and the ordered index_add behind
 * the gradients of index_select and embedding). Arithmetic only: the rules pick shapes and
 * dtypes and allocate the outputs. */
#ifndef NABLA_CPU_REDUCE_BACK_H
#define NABLA_CPU_REDUCE_BACK_H

#include <stdbool.h>
#include <stdint.h>

#include "tensor/tensor_impl.h"
#include "cpu/cpu_impl.h" /* transitional: the kernels move to kernel args */

/* Gradient of softmax (log = false) or log_softmax (log = true) along dim, from the op's
 * OUTPUT y and the output gradient g:
 *     softmax:      dx = y * (g - sum_dim(g * y))
 *     log_softmax:  dx = g - exp(y) * sum_dim(g)
 * y, g and dx are contiguous, of the same shape and float dtype; f16/bf16 are computed in
 * f32, row sums accumulate in f64. Deterministic for any thread count. */
void nb__cpu_softmax_backward(const nb_tensor *y, const nb_tensor *g, nb_tensor *dx, int dim,
                              bool log);

/* out[.., idx[m], ..] += src[.., m, ..] along dim, for m = 0, 1, ... in that order (so a
 * repeated index accumulates in index order, whatever the thread count). out is contiguous
 * f32 or f64 (the accumulation type); src is contiguous, of any float dtype, laid out as
 * out's shape with shape[dim] replaced by numel(idx); idx is contiguous I32/I64 with values
 * already checked to lie in [0, out.shape[dim]). A 0-dim out counts as shape [1]. */
void nb__cpu_index_add(nb_tensor *out, int dim, const nb_tensor *idx, const nb_tensor *src);

#endif
