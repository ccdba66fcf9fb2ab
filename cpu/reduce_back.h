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

#endif
