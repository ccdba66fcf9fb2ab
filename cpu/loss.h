/* cpu/loss.h - private: the CPU kernels behind the losses of nn/loss.c (cross entropy,
 * NLL, binary cross entropy with logits) and the fixed-order sum they reduce with.
 * Kernels do arithmetic only: nn/loss.c checks the arguments, validates the targets,
 * picks shapes and dtypes and allocates every output and temporary. */
#ifndef NABLA_CPU_LOSS_H
#define NABLA_CPU_LOSS_H

#include <stdbool.h>
#include <stdint.h>

#include "tensor/tensor_impl.h"
#include "cpu/cpu_impl.h" /* transitional: the kernels move to kernel args */

/* Class-index losses. The scores x are a contiguous (N, C, D) array (D is the product of
 * the dims after the class dim, 1 for (N, C) input) of dtype xdt (f32, f64, f16, bf16);
 * target is a contiguous (N, D) array of I32/I64 class indices, each in [0, C) or equal
 * to ignore_index (when has_ignore). Position p = n * D + d. */
typedef struct nb__cls_args {
    const char *x;
    nb_dtype xdt;
    int64_t N, C, D;
    const void *target;
    nb_dtype tdt;
    bool has_ignore;
    int64_t ignore_index;
    double smoothing; /* label smoothing in [0, 1] (cross entropy only) */
} nb__cls_args;

/* Scan the targets in order: returns the number of positions that are not ignored, or -1
 * with *bad set to the first target that is neither ignored nor in [0, C). */
int64_t nb__cpu_cls_check_targets(const nb__cls_args *a, int64_t *bad);

/* Cross entropy: loss[p] = (1 - s) * (lse - x_t) + s * (lse - mean_c x_c) with lse the
 * log-sum-exp over the C classes (0 at ignored positions), and the per-position lse into
 * lse_out (float for f32/f16/bf16 scores, double for f64; 0 at ignored positions). One
 * fused, numerically stable pass per row (max, sum of exp, loss); f32/f16/bf16 compute in
 * f32 with f64 sums. */
void nb__cpu_cross_entropy_fwd(const nb__cls_args *a, double *loss, void *lse_out);
/* dx = (softmax(x) - (1 - s) * onehot(t) - s / C) * factor * g[p * gstride], 0 at ignored
 * positions; dx has x's dtype and layout. lse as written by the forward. */
void nb__cpu_cross_entropy_bwd(const nb__cls_args *a, const void *lse, const double *g,
                               int64_t gstride, double factor, char *dx);

/* NLL: loss[p] = -x[n, t, d] (0 at ignored positions). */
void nb__cpu_nll_fwd(const nb__cls_args *a, double *loss);
/* dx = 0 except dx[n, t, d] = -factor * g[p * gstride] at positions not ignored. */
void nb__cpu_nll_bwd(const nb__cls_args *a, const double *g, int64_t gstride, double factor,
                     char *dx);

/* Sum of v[0..n) in an order that depends only on n (blocks summed in parallel, partial
 * sums added in order), so the result does not depend on the thread count. */
double nb__cpu_loss_sum(const double *v, int64_t n);
/* dst[i] = src[i] converted to dt (round to nearest even), i < n. */
void nb__cpu_loss_store(char *dst, nb_dtype dt, const double *src, int64_t n);

/* Binary cross entropy with logits over n elements. x, y are contiguous arrays of the
 * compute dtype ct (NB_F32 or NB_F64); pw (may be NULL) is read as pw[i % pw_period]. */
typedef struct nb__bce_args {
    const char *x, *y, *pw;
    nb_dtype ct;
    int64_t n, pw_period;
} nb__bce_args;

/* loss_i = (1 - y) x + (1 + (pw - 1) y) softplus(-x), softplus(-x) computed as
 * log1p(exp(-|x|)) + max(-x, 0) (never overflows); written to out (dtype ct) when out is
 * not NULL. Returns the sum of the losses, in an order that depends only on n. */
double nb__cpu_bce_fwd(const nb__bce_args *a, char *out);
/* With G = factor * g[i * gstride] (g of dtype ct), each of dx, dy, dpw that is not NULL
 * (n elements of dtype ct) gets
 *   dx  = G ((1 - y) - (1 + (pw - 1) y) sigmoid(-x)),
 *   dy  = G (-x + (pw - 1) softplus(-x)),
 *   dpw = G y softplus(-x)  (per element; the caller sums it to pw's shape). */
void nb__cpu_bce_bwd(const nb__bce_args *a, const char *g, int64_t gstride, double factor,
                     char *dx, char *dy, char *dpw);

#endif
