/* tensor/kernels/optim.h - private: arguments of the optim kernels (the fused optimizer
 * updates and the reductions and in-place ops behind gradient clipping). C17 and nvcc;
 * included through tensor/kernels.h.
 *
 * Every array is contiguous, of n elements of `dtype`, in the memory of the device the
 * kernel runs on. The updates follow PyTorch's single-tensor algorithms operation by
 * operation, rounding scalars to the element type first; the op definitions (optim/) decide
 * hyperparameters, the step count and the state, and compute the per-step scalars
 * (bias corrections, the decayed learning rate) in double on the host. */
#ifndef NABLA_TENSOR_KERNELS_OPTIM_H
#define NABLA_TENSOR_KERNELS_OPTIM_H

/* sgd_step: d = maximize ? -g : g;  d += weight_decay * p;
 * buf = init_buf ? d : momentum * buf + (1 - dampening) * d;
 * d = nesterov ? d + momentum * buf : buf;  p -= lr * d.
 * dtype: NB_F32 or NB_F64. param, grad, buf: [n]; buf is NULL when momentum == 0 (then
 * p -= lr * d directly). init_buf: the buffer is new (first step): it becomes d. */
typedef struct nb__sgd_step_args {
    nb_dtype dtype;
    int64_t n;
    void *param;
    const void *grad;
    void *buf;
    double lr, momentum, dampening, weight_decay;
    bool nesterov, maximize, init_buf;
} nb__sgd_step_args;

/* adam_step (Adam and AdamW): g = maximize ? -g : g;  Adam: g += weight_decay * p;
 * AdamW (decoupled): p *= 1 - lr * weight_decay;  m = beta1 * m + (1 - beta1) * g;
 * v = beta2 * v + (1 - beta2) * g * g;  amsgrad: vmax = max(vmax, v), used instead of v;
 * p -= step_size * m / (sqrt(v) / bc2_sqrt + eps).
 * step_size = lr / (1 - beta1^t) and bc2_sqrt = sqrt(1 - beta2^t), t the step count.
 * dtype: NB_F32 or NB_F64. param, grad, m (exp_avg), v (exp_avg_sq), vmax
 * (max_exp_avg_sq): [n]; vmax is NULL unless amsgrad. */
typedef struct nb__adam_step_args {
    nb_dtype dtype;
    int64_t n;
    void *param;
    const void *grad;
    void *m, *v, *vmax;
    double lr, beta1, beta2, eps, weight_decay, step_size, bc2_sqrt;
    bool decoupled, maximize;
} nb__adam_step_args;

/* rmsprop_step: g = maximize ? -g : g;  g += weight_decay * p;
 * sq = alpha * sq + (1 - alpha) * g * g;  centered: gavg = alpha * gavg + (1 - alpha) * g,
 * avg = sqrt(sq - gavg^2) + eps, else avg = sqrt(sq) + eps;
 * momentum > 0: buf = momentum * buf + g / avg, p -= lr * buf; else p -= lr * g / avg.
 * dtype: NB_F32 or NB_F64. param, grad, sq (square_avg), buf (momentum_buffer), gavg
 * (grad_avg): [n]; buf is NULL unless momentum > 0, gavg NULL unless centered. */
typedef struct nb__rmsprop_step_args {
    nb_dtype dtype;
    int64_t n;
    void *param;
    const void *grad;
    void *sq, *buf, *gavg;
    double lr, alpha, eps, weight_decay, momentum;
    bool maximize;
} nb__rmsprop_step_args;

/* adagrad_step: g = maximize ? -g : g;  g += weight_decay * p;  sum += g * g;
 * p -= clr * g / (sqrt(sum) + eps), clr = lr / (1 + (t - 1) * lr_decay) with t the step
 * count. dtype: NB_F32 or NB_F64. param, grad, sum: [n]. */
typedef struct nb__adagrad_step_args {
    nb_dtype dtype;
    int64_t n;
    void *param;
    const void *grad;
    void *sum;
    double clr, eps, weight_decay;
    bool maximize;
} nb__adagrad_step_args;

/* clip_abs_pow_sum: *result = sum of |x|^p (p > 0 finite; 1 and 2 fast), accumulated in
 * double over fixed-size chunks added in order, so the value never depends on the thread
 * count; NaN propagates. clip_abs_max: *result = max |x| (0 for n == 0; NaN wins).
 * dtype: any float dtype. x: [n]. result: one double in the memory of the device the
 * kernel runs on (so a GPU kernel writes it without a host round trip; optim/clip.c gives
 * each gradient a slot of one buffer and reads the slots back once), written by the kernel
 * (not touched on the meta device, where no kernel runs). p is ignored by clip_abs_max. */
typedef struct nb__clip_reduce_args {
    nb_dtype dtype;
    int64_t n;
    const void *x;
    double p;
    double *result;
} nb__clip_reduce_args;

/* clip_scale: x *= s, s rounded to x's dtype first (f32 for f16/bf16, as PyTorch
 * multiplies half tensors in f32 by an f32 coefficient).
 * clip_clamp: x = min(max(x, lo), hi), bounds rounded the same way.
 * dtype: any float dtype. x: [n], updated in place. s: clip_scale only; lo, hi:
 * clip_clamp only. */
typedef struct nb__clip_inplace_args {
    nb_dtype dtype;
    int64_t n;
    void *x;
    double s, lo, hi;
} nb__clip_inplace_args;

/* amp_unscale (the loss scaler's fused unscale and inf/NaN check, optim/scaler.c):
 * out[i] = x[i] * inv_scale, and *found_inf = 1 when some x[i] is inf or NaN (otherwise
 * *found_inf is left as it is, so one flag collects many calls). Half and f32 inputs are
 * multiplied in f32 by inv_scale rounded to f32 (PyTorch's GradScaler), f64 in f64.
 * dtype: any float dtype, of x. out_dtype: dtype (out may then be x: in place) or NB_F32
 * (a half gradient unscaled into an f32 buffer, so that small gradients do not underflow
 * again). x, out: [n]. found_inf: one double in the memory of the kernel's device, shared by
 * the calls of one unscale and read back once (not touched on meta). */
typedef struct nb__amp_unscale_args {
    nb_dtype dtype, out_dtype;
    int64_t n;
    const void *x;
    void *out;
    double inv_scale;
    double *found_inf;
} nb__amp_unscale_args;

#define NB__K_OPTIM(X)                                                                     \
    X(sgd_step, nb__sgd_step_args, "fused SGD update (momentum, Nesterov, weight decay)")  \
    X(adam_step, nb__adam_step_args, "fused Adam/AdamW update (AMSGrad optional)")         \
    X(rmsprop_step, nb__rmsprop_step_args, "fused RMSprop update (centered, momentum)")    \
    X(adagrad_step, nb__adagrad_step_args, "fused Adagrad update")                         \
    X(clip_abs_pow_sum, nb__clip_reduce_args, "sum of |x|^p in f64, to a double in device memory")     \
    X(clip_abs_max, nb__clip_reduce_args, "max |x|, to a double in device memory")                     \
    X(clip_scale, nb__clip_inplace_args, "x *= s in place")                                \
    X(clip_clamp, nb__clip_inplace_args, "x = clamp(x, lo, hi) in place")                  \
    X(amp_unscale, nb__amp_unscale_args, "loss scaling: x * inv_scale with an inf/NaN flag")

#endif
