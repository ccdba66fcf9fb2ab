/* tensor/kernels/norm.h - private: arguments of the norm kernels (layer norm, batch norm,
 * dropout's masked scaling). C17 and nvcc; included through tensor/kernels.h.
 *
 * The op definitions (nn/norm.c, nn/dropout.c) hand in dense row-major buffers in the
 * compute dtype `dtype`: NB_F32 (for f32, f16 and bf16 inputs) or NB_F64. The statistics
 * mean and rstd (1 / std) are always f64 device buffers, written by the forward and reused
 * by the backward. Every pointer is device memory of the operands' device. Optional
 * operands (w, b) and unwanted gradients (dx, dw, db) are NULL. */
#ifndef NABLA_TENSOR_KERNELS_NORM_H
#define NABLA_TENSOR_KERNELS_NORM_H

#ifdef __cplusplus
extern "C" {
#endif

/* layer_norm over the last dim of x (N, D):
 *   mean[i], rstd[i] = 1 / sqrt(biased var + eps) of row i   (N each, written)
 *   y = (x - mean) * rstd * w + b                           (N, D; w, b: D or NULL) */
typedef struct nb__layer_norm_args {
    nb_dtype dtype;
    int64_t N, D;
    double eps;
    const void *x, *w, *b;
    void *y;
    double *mean, *rstd;
} nb__layer_norm_args;

/* layer_norm_backward for the output gradient g (N, D), with xhat = (x - mean) * rstd and
 * gw = g * w (g when w is NULL):
 *   dx = rstd * (gw - mean_j(gw) - xhat * mean_j(gw * xhat))   (N, D)
 *   dw = sum_i g * xhat,  db = sum_i g                        (D each) */
typedef struct nb__layer_norm_backward_args {
    nb_dtype dtype;
    int64_t N, D;
    const void *g, *x, *w;
    const double *mean, *rstd;
    void *dx, *dw, *db;
} nb__layer_norm_backward_args;

/* batch_norm_stats: the per-channel mean and rstd = 1 / sqrt(var + eps) (C each, written)
 * that normalize x (N, C, S) (S = product of the spatial dims).
 *   training: the batch statistics over the M = N * S values of each channel (biased
 *     variance); when running_mean.data is not NULL the running statistics are updated in
 *     place, r = (1 - momentum) * r + momentum * batch, the variance's batch value unbiased
 *     (times M / (M - 1)) as PyTorch does.
 *   eval (training false): the running statistics themselves; x is not read.
 * running_mean, running_var: 1-D views of C elements, any float dtype and stride; data
 * NULL when there are none (training only). */
typedef struct nb__batch_norm_stats_args {
    nb_dtype dtype;
    int64_t N, C, S;
    const void *x;
    bool training;
    double momentum, eps;
    nb__view running_mean, running_var;
    double *mean, *rstd;
} nb__batch_norm_stats_args;

/* batch_norm_apply: y = (x - mean[c]) * rstd[c] * w[c] + b[c], x and y (N, C, S), w and b
 * C elements or NULL. */
typedef struct nb__batch_norm_apply_args {
    nb_dtype dtype;
    int64_t N, C, S;
    const void *x, *w, *b;
    void *y;
    const double *mean, *rstd;
} nb__batch_norm_apply_args;

/* batch_norm_backward for g (N, C, S), with M = N * S, xhat = (x - mean) * rstd:
 *   batch_stats (training): dx = w * rstd * (g - sum(g) / M - xhat * sum(g * xhat) / M)
 *   fixed statistics (eval): dx = w * rstd * g
 *   dw = sum g * xhat,  db = sum g   (per channel, C each) */
typedef struct nb__batch_norm_backward_args {
    nb_dtype dtype;
    int64_t N, C, S;
    const void *g, *x, *w;
    const double *mean, *rstd;
    bool batch_stats;
    void *dx, *dw, *db;
} nb__batch_norm_backward_args;

/* dropout: out[i] = x[i] * (mask[i] * scale) over n dense elements of float dtype `dtype`
 * (f32, f64, f16 or bf16; half types computed in f32 and rounded once); mask is u8 (0 or 1,
 * drawn by the op with nb_bernoulli). x and out may alias. */
typedef struct nb__dropout_args {
    nb_dtype dtype;
    int64_t n;
    const void *x;
    const uint8_t *mask;
    void *out;
    double scale;
} nb__dropout_args;

#ifdef __cplusplus
}
#endif

#define NB__K_NORM(X)                                                                      \
    X(layer_norm, nb__layer_norm_args, "layer norm forward with row statistics")           \
    X(layer_norm_backward, nb__layer_norm_backward_args, "layer norm dx, dw, db")          \
    X(batch_norm_stats, nb__batch_norm_stats_args,                                         \
      "batch norm mean and 1/std per channel, running statistics update")                  \
    X(batch_norm_apply, nb__batch_norm_apply_args, "batch norm normalize and affine")      \
    X(batch_norm_backward, nb__batch_norm_backward_args, "batch norm dx, dw, db")          \
    X(dropout, nb__dropout_args, "dropout: x times a u8 keep mask times a scale")

#endif
