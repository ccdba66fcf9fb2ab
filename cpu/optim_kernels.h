/* optim_kernels.h - private: the fused optimizer update loops and the gradient-clipping
 * reductions (cpu/optim_kernels.c). Arithmetic only, over contiguous f32 or f64 arrays of n
 * elements; the optimizer (optim/) decides hyperparameters, state allocation and order.
 *
 * Each update follows PyTorch's single-tensor algorithm operation by operation, with
 * scalars rounded to the array's type as PyTorch's CPU kernels do, so f32 results stay
 * within an ulp or so of PyTorch's. Elements are independent: results never depend on the
 * thread count. Ranges make the same kernels usable on shards of a flat buffer. */
#ifndef NABLA_CPU_OPTIM_KERNELS_H
#define NABLA_CPU_OPTIM_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "nabla/tensor.h"

/* SGD. buf is NULL when momentum == 0; init_buf: the buffer is new (first step), so it
 * becomes the gradient (after weight decay) instead of being decayed. */
typedef struct nb__sgd_kargs {
    double lr, momentum, dampening, weight_decay;
    bool nesterov, maximize, init_buf;
} nb__sgd_kargs;
void nb__cpu_sgd(nb_dtype dt, void *param, const void *grad, void *buf, int64_t n,
                 const nb__sgd_kargs *a);

/* Adam / AdamW. step_size = lr / (1 - beta1^t) and bc2_sqrt = sqrt(1 - beta2^t) are
 * computed by the caller in double; decoupled: AdamW's p *= 1 - lr * weight_decay instead
 * of adding weight_decay * p to the gradient. vmax is NULL unless amsgrad. */
typedef struct nb__adam_kargs {
    double lr, beta1, beta2, eps, weight_decay, step_size, bc2_sqrt;
    bool decoupled, maximize;
} nb__adam_kargs;
void nb__cpu_adam(nb_dtype dt, void *param, const void *grad, void *m, void *v, void *vmax,
                  int64_t n, const nb__adam_kargs *a);

/* RMSprop. buf is NULL unless momentum > 0; gavg is NULL unless centered. */
typedef struct nb__rmsprop_kargs {
    double lr, alpha, eps, weight_decay, momentum;
    bool maximize;
} nb__rmsprop_kargs;
void nb__cpu_rmsprop(nb_dtype dt, void *param, const void *grad, void *sq, void *buf,
                     void *gavg, int64_t n, const nb__rmsprop_kargs *a);

/* Adagrad. clr = lr / (1 + (step - 1) * lr_decay), computed by the caller. */
typedef struct nb__adagrad_kargs {
    double clr, eps, weight_decay;
    bool maximize;
} nb__adagrad_kargs;
void nb__cpu_adagrad(nb_dtype dt, void *param, const void *grad, void *sum, int64_t n,
                     const nb__adagrad_kargs *a);

/* ---- clipping (f32, f64, f16, bf16) ---------------------------------------------------------
 * Sum of |x|^p in f64 (p == 1 and p == 2 fast), and max |x|; fixed-size chunks summed in
 * order, so the result is independent of the thread count. NaN propagates into both. */
double nb__cpu_abs_pow_sum(nb_dtype dt, const void *x, int64_t n, double p);
double nb__cpu_abs_max(nb_dtype dt, const void *x, int64_t n);
/* x *= s (s rounded to x's type first, as PyTorch multiplies by a tensor of that type). */
void nb__cpu_scale_inplace(nb_dtype dt, void *x, int64_t n, double s);
/* x = min(max(x, lo), hi). */
void nb__cpu_clamp_inplace(nb_dtype dt, void *x, int64_t n, double lo, double hi);

#endif
