/* cpu/reduce.h - private: the CPU kernels behind the reductions of tensor/ops/reduce.c
 * (sum, mean, var, std, logsumexp, amax/amin, max/min with indices, argmax/argmin) and the
 * fused softmax / log_softmax. Kernels do arithmetic only: they see pointers and geometry
 * (tensor/kernels/reduce.h); the op definitions check the arguments, pick output shapes and
 * dtypes and allocate the outputs. cpu/reduce.c registers them all
 * (nb__cpu_register_reduce): its reductions, the softmax of cpu/softmax.c and the backward
 * kernels of cpu/reduce_back.c. */
#ifndef NABLA_CPU_REDUCE_H
#define NABLA_CPU_REDUCE_H

#include "cpu/cpu_impl.h"

/* The `reduce` kernel. CPU specifics: f32/f16/bf16 sum in f64 the f32 partial sums of at
 * most 16 elements (error ~1e-10 relative on 16M uniform values; blocks that overflow in
 * f32 are redone in f64), f64 in f64. VAR and LSE are single calls (a fused two-pass per
 * block of the input, blocks merged exactly as Chan's / the log-sum-exp rescaling rule
 * say), so they need no temporaries. The order of accumulation depends only on the shapes
 * and strides, never on the thread count. */
nb_status nb__cpu_reduce(const nb__reduce_args *a);

/* The `softmax` kernel. Passes: the row max, exp(x - max) written and summed, the scaling
 * (in cache). */
nb_status nb__cpu_softmax(const nb__softmax_args *a);

/* cpu/reduce_back.c: the `softmax_backward` kernel (f16/bf16 computed in f32, row sums
 * accumulated in f64, deterministic for any thread count) and the `extreme_backward`
 * kernel. */
nb_status nb__cpu_softmax_backward(const nb__softmax_backward_args *a);
nb_status nb__cpu_extreme_backward(const nb__extreme_backward_args *a);

#endif
