// cuda/k_loss.cuh - private to cuda/k_loss.cu and tests/cuda_host/loss.cu: the math of the
// loss family's CUDA kernels as __host__ __device__ functions (the row helpers of
// cuda/k_reduce.cuh for the log-sum-exp), so that the host checks run what the kernels run,
// in the same order. UNVERIFIED on a GPU.
//
//   ce_tgt / ce_ignored / ce_valid     the target of a position and its status
//   ce_finish                          the loss of a position from lse, x_t and sum x (the
//                                      CPU's formula, label smoothing included)
//   ce_col<T>                          cross entropy of one position of (N, C, D): the
//                                      CPU's two passes over the classes (D > 1, or few
//                                      classes: ce_use_rows)
//   ce_bwd_at<T> / ce_bwd_elem<T> / nll_bwd_elem<T>
//                                      one element of the input gradient
//   bce_loss / bce_grads               binary cross entropy with logits of one element
//   cls_factor                         the backward's scale (1 / count for a mean, read on
//                                      the device)
//   ls_store                           a double stored as a float dtype (nb__store_f64)
//
// Targets outside [0, C) that are not ignored: the CPU kernel returns NB_EINDEX before
// writing anything. A kernel cannot return a status without a host read of device memory
// (docs/architecture.md rule 1 keeps kernels to arithmetic; no host syncs), so the CUDA
// forward never reads out of bounds and makes that position's loss and lse NaN instead:
// the reduced loss is NaN. The backward writes 0 there.
#ifndef NABLA_CUDA_K_LOSS_CUH
#define NABLA_CUDA_K_LOSS_CUH

#include "cuda/k_reduce.cuh"

namespace nbl {

using namespace nbr;

constexpr int kFinishThreads = 1024; // the one block that reduces over positions
constexpr int kBcePartials = 1024;   // most blocks of the BCE sum (one partial each)

NB_HD int64_t ce_tgt(const nb__cls_operands *a, int64_t p) {
    return a->tdt == NB_I64 ? ((const int64_t *)a->target)[p]
                            : (int64_t)((const int32_t *)a->target)[p];
}
NB_HD bool ce_ignored(const nb__cls_operands *a, int64_t t) {
    return a->has_ignore && t == a->ignore_index;
}
NB_HD bool ce_valid(const nb__cls_operands *a, int64_t t) {
    return !ce_ignored(a, t) && t >= 0 && t < a->C;
}

NB_HD double ce_finish(const nb__cls_operands *a, double l, double xt, double sx) {
    double s = a->smoothing, r = (1 - s) * (l - xt);
    if (s > 0) r += s * (l - sx / (double)a->C);
    return r;
}

// A double stored as dtype dt (f32, f64, f16, bf16), rounded as nb__store_f64 rounds.
NB_HD void ls_store(void *p, nb_dtype dt, int64_t i, double v) {
    switch (dt) {
    case NB_F32: ((float *)p)[i] = (float)v; break;
    case NB_F64: ((double *)p)[i] = v; break;
    case NB_F16: ((uint16_t *)p)[i] = nb__kh_f16_from_f32((float)v); break;
    default: ((uint16_t *)p)[i] = nb__kh_bf16_from_f32((float)v); break;
    }
}

// A block per row for (N, C) scores with C > 64; else a thread per position (ce_col).
NB_HD bool ce_use_rows(const nb__cls_operands *a) { return a->D == 1 && a->C > 64; }

// A position's loss into the scratch of the sum, and (reduction NONE) into out.
NB_HD void cls_put(double *loss, void *none_out, nb_dtype xdt, int64_t p, double v) {
    loss[p] = v;
    if (none_out) ls_store(none_out, xdt, p, v);
}

// The loss and lse of a row (D == 1) from the block's max M, sum of exps S and sum SX.
template <typename T>
NB_HD void ce_row_result(const nb__cls_operands *a, const T *xr, int64_t t, acc_t<T> M, double S,
                         double SX, double *loss, acc_t<T> *lse) {
    double l = (double)M + log(S);
    *loss = ce_finish(a, l, (double)sm_ld(xr + t), SX);
    *lse = (acc_t<T>)l;
}

// Position (n, d) of (N, C, D): xb points at x[n, 0, d]; the CPU's column passes.
template <typename T>
NB_HD void ce_col(const nb__cls_operands *a, const T *xb, int64_t t, double *loss, acc_t<T> *lse) {
    using A = acc_t<T>;
    const int64_t C = a->C, D = a->D;
    A m = (A)-INFINITY;
    double sx = 0, s = 0;
    for (int64_t c = 0; c < C; c++) {
        A b = sm_ld(xb + c * D);
        m = b > m ? b : m;
        sx += (double)b;
    }
    for (int64_t c = 0; c < C; c++) s += (double)sm_exp(sm_ld(xb + c * D) - m);
    double l = (double)m + log(s);
    *loss = ce_finish(a, l, (double)sm_ld(xb + t * D), sx);
    *lse = (A)l;
}

// The scale of the backward: 1 / count for a mean (0 when every target is ignored), else 1.
NB_HD double cls_factor(nb__loss_reduce r, const int64_t *count) {
    if (r != NB__LOSS_MEAN) return 1.0;
    int64_t n = *count;
    return n ? 1.0 / (double)n : 0.0;
}

// dx element (n, c, d) of (N, C, D); ce_bwd_elem: element i in row-major order.
template <typename T>
NB_HD void ce_bwd_at(const nb__cls_operands *a, const acc_t<T> *lse, const double *g, int64_t gs,
                     double factor, T *dx, int64_t n, int64_t c, int64_t d) {
    using A = acc_t<T>;
    const int64_t C = a->C, D = a->D, p = n * D + d, i = (n * C + c) * D + d;
    int64_t t = ce_tgt(a, p);
    if (!ce_valid(a, t)) {
        sm_st(dx + i, (A)0);
        return;
    }
    const T *x = (const T *)a->x;
    A sc = (A)(factor * g[p * gs]), l = lse[p];
    A off = (A)(a->smoothing / (double)C), hit = (A)(1 - a->smoothing);
    sm_st(dx + i, (sm_exp(sm_ld(x + i) - l) - off - (c == t ? hit : (A)0)) * sc);
}
template <typename T>
NB_HD void ce_bwd_elem(const nb__cls_operands *a, const acc_t<T> *lse, const double *g, int64_t gs,
                       double factor, T *dx, int64_t i) {
    const int64_t C = a->C, D = a->D;
    int64_t n = i / (C * D), rem = i - n * C * D, c = rem / D, d = rem - c * D;
    ce_bwd_at<T>(a, lse, g, gs, factor, dx, n, c, d);
}

template <typename T>
NB_HD void nll_bwd_elem(const nb__cls_operands *a, const double *g, int64_t gs, double factor,
                        T *dx, int64_t i) {
    const int64_t C = a->C, D = a->D;
    int64_t n = i / (C * D), rem = i - n * C * D, c = rem / D, d = rem - c * D, p = n * D + d;
    int64_t t = ce_tgt(a, p);
    if (ce_valid(a, t) && c == t)
        ls_store(dx, a->xdt, i, -factor * g[p * gs]);
    else
        ls_store(dx, a->xdt, i, 0.0);
}

// NLL loss of position p (NaN for a target out of range).
template <typename T> NB_HD double nll_pos(const nb__cls_operands *a, int64_t p) {
    const int64_t C = a->C, D = a->D;
    int64_t t = ce_tgt(a, p), n = p / D, d = p - n * D;
    if (ce_ignored(a, t)) return 0;
    if (t < 0 || t >= C) return (double)NAN;
    return -(double)sm_ld((const T *)a->x + (n * C + t) * D + d);
}

// ---- binary cross entropy with logits (f64 math, as the CPU) ------------------------------------
NB_HD double bce_ld(const char *p, nb_dtype ct, int64_t i) {
    return ct == NB_F64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}
NB_HD void bce_st(char *p, nb_dtype ct, int64_t i, double v) {
    if (ct == NB_F64)
        ((double *)p)[i] = v;
    else
        ((float *)p)[i] = (float)v;
}
NB_HD double softplus_neg(double x) { return log1p(exp(-fabs(x))) + fmax(-x, 0.0); }
NB_HD double bce_loss(const nb__bce_operands *a, int64_t i) {
    double x = bce_ld(a->x, a->ct, i), y = bce_ld(a->y, a->ct, i);
    double w = a->pw ? 1 + (bce_ld(a->pw, a->ct, i % a->pw_period) - 1) * y : 1;
    return (1 - y) * x + w * softplus_neg(x);
}
NB_HD void bce_grads(const nb__bce_backward_args *b, int64_t i) {
    const nb__bce_operands *a = &b->in;
    double x = bce_ld(a->x, a->ct, i), y = bce_ld(a->y, a->ct, i);
    double pw = a->pw ? bce_ld(a->pw, a->ct, i % a->pw_period) : 1;
    double G = b->factor * bce_ld(b->g, a->ct, i * b->gstride);
    double sp = softplus_neg(x);
    if (b->dx) {
        double e = exp(-fabs(x)), sig = x >= 0 ? e / (1 + e) : 1 / (1 + e);
        bce_st(b->dx, a->ct, i, G * ((1 - y) - (1 + (pw - 1) * y) * sig));
    }
    if (b->dy) bce_st(b->dy, a->ct, i, G * (-x + (pw - 1) * sp));
    if (b->dpw) bce_st(b->dpw, a->ct, i, G * y * sp);
}
// Blocks of the BCE forward's first pass (one partial sum each): depends on n only.
NB_HD int64_t bce_blocks(int64_t n) {
    int64_t b = (n + 255) / 256;
    return b < 1 ? 1 : b > kBcePartials ? kBcePartials : b;
}

} // namespace nbl

#endif
