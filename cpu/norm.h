/* cpu/norm.h - private: the CPU kernels behind the fused layers of nn/ (layer norm,
 * batch norm, the bias rows of linear, dropout). cpu/norm.c registers the norm family's
 * entries of the kernel table (tensor/kernels/norm.h has their arguments); the functions
 * below are their typed bodies. Kernels do arithmetic only: the op definitions in nn/ check
 * arguments, pick shapes and dtypes, and hand in dense buffers in the compute type (f32 for
 * f32/f16/bf16, f64 for f64).
 *
 * Statistics (mean, rstd) are kept in double whatever the compute type, and every sum is
 * accumulated in double in an order that depends only on the shapes: reductions over rows
 * (the weight and bias gradients of layer norm, the per-channel sums of batch norm) are
 * cut into at most NB__NORM_MAX_CHUNKS chunks of rows chosen from the shape alone, each
 * chunk's partials are summed in row order, and the chunk partials are then combined in
 * chunk order. So results never depend on the thread count (docs/architecture.md rule 5).
 *
 * The functions that need scratch memory take it from the host allocator and return
 * NB_ENOMEM (with the last error set) when it is not available; the others cannot fail. */
#ifndef NABLA_CPU_NORM_H
#define NABLA_CPU_NORM_H

#include <stdbool.h>
#include <stdint.h>

#include "cpu/cpu_impl.h"

#define NB__NORM_MAX_CHUNKS 64

/* ---- layer norm over the last dim: x, y, g, dx are (N, D) row-major ------------------------
 * Forward: mean[i], rstd[i] = 1 / sqrt(biased var + eps) of row i, and
 *     y = (x - mean) * rstd * w + b   (w, b of D elements, either may be NULL).
 * Backward: with xhat = (x - mean) * rstd and gw = g * w (g if w is NULL),
 *     dx = rstd * (gw - mean_j(gw) - xhat * mean_j(gw * xhat))
 *     dw = sum_i g * xhat,  db = sum_i g.
 * dx, dw, db may each be NULL when not wanted. */
void nb__cpu_layer_norm_fwd_f32(const float *x, const float *w, const float *b, float *y,
                                double *mean, double *rstd, int64_t N, int64_t D, double eps);
void nb__cpu_layer_norm_fwd_f64(const double *x, const double *w, const double *b, double *y,
                                double *mean, double *rstd, int64_t N, int64_t D, double eps);
nb_status nb__cpu_layer_norm_bwd_f32(const float *g, const float *x, const float *w,
                                     const double *mean, const double *rstd, float *dx,
                                     float *dw, float *db, int64_t N, int64_t D);
nb_status nb__cpu_layer_norm_bwd_f64(const double *g, const double *x, const double *w,
                                     const double *mean, const double *rstd, double *dx,
                                     double *dw, double *db, int64_t N, int64_t D);

/* ---- batch norm: x, y, g, dx are (N, C, S) row-major (S = product of the spatial dims) ------
 * Stats: per-channel mean and biased variance over the N * S elements of each channel
 * (two passes: the mean, then the squared deviations from it).
 * Apply: y = (x - mean[c]) * rstd[c] * w[c] + b[c] (w, b may be NULL).
 * Backward: with M = N * S, xhat = (x - mean) * rstd,
 *     batch statistics (training): dx = w * rstd * (g - sum(g) / M - xhat * sum(g * xhat) / M)
 *     fixed statistics (eval):     dx = w * rstd * g
 *     dw = sum g * xhat,  db = sum g   (sums per channel). dx, dw, db may be NULL. */
nb_status nb__cpu_batch_norm_stats_f32(const float *x, int64_t N, int64_t C, int64_t S,
                                       double *mean, double *var);
nb_status nb__cpu_batch_norm_stats_f64(const double *x, int64_t N, int64_t C, int64_t S,
                                       double *mean, double *var);
void nb__cpu_batch_norm_apply_f32(const float *x, float *y, int64_t N, int64_t C, int64_t S,
                                  const double *mean, const double *rstd, const float *w,
                                  const float *b);
void nb__cpu_batch_norm_apply_f64(const double *x, double *y, int64_t N, int64_t C, int64_t S,
                                  const double *mean, const double *rstd, const double *w,
                                  const double *b);
nb_status nb__cpu_batch_norm_bwd_f32(const float *g, const float *x, int64_t N, int64_t C,
                                     int64_t S, const double *mean, const double *rstd,
                                     const float *w, bool batch_stats, float *dx, float *dw,
                                     float *db);
nb_status nb__cpu_batch_norm_bwd_f64(const double *g, const double *x, int64_t N, int64_t C,
                                     int64_t S, const double *mean, const double *rstd,
                                     const double *w, bool batch_stats, double *dx,
                                     double *dw, double *db);

/* ---- dropout: out[i] = x[i] * (mask[i] * scale), n dense elements of float dtype dt (f32,
 * f64, f16 or bf16; half types computed in f32 and rounded once). x and out may alias. */
void nb__cpu_dropout(const void *x, const uint8_t *mask, void *out, int64_t n, nb_dtype dt,
                     double scale);

#endif
