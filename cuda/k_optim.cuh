// cuda/k_optim.cuh - private: the per-element and per-lane math of the optim kernels
// (cuda/k_optim.cu), as __host__ __device__ functions, so that the kernels run them on the
// GPU and tests/cuda_host/optim.cu runs the very same functions on the host against the CPU
// backend (cpu/optim_kernels.c, the spec). UNVERIFIED ON A GPU: only the host side of these
// functions has been run.
//
// Bit-exactness with the CPU. cpu/optim_kernels.c is compiled as ISO C17 (no FP
// contraction) and rounds every scalar to the element type first; these functions keep its
// operation order exactly and do every multiply, add, divide and square root through
// nbo::mul/add/div/sqrt, which on the device are the round-to-nearest intrinsics
// (__fmul_rn, __dadd_rn, ...): nvcc may never contract them into an FMA, so each element's
// result has the CPU's bits.
//
//   nbo::sgd_c<T>, adam_c<T>, rmsprop_c<T>, adagrad_c<T>
//                        the per-step constants, rounded to T as the CPU rounds them
//   nbo::sgd_elem / adam_elem / rmsprop_elem / adagrad_elem
//                        one element's update (parameter and state, in place)
//   nbo::scale_elem / clamp_elem / unscale_elem
//                        clip_scale, clip_clamp, amp_unscale on one element
//   nbo::lane_pow_sum(x, dt, s, l, lane, p)
//                        clip_abs_pow_sum's partial of one lane of one chunk, in the CPU's
//                        order (chunks of kChunk elements, kLanes accumulators; lane k sums
//                        elements k, k + kLanes, ... of its chunk in order)
//   nbo::chunk_total(lanes) / nbo::max_nan(m, v)
//                        the lanes of a chunk added in lane order; the NaN-sticky max step
#ifndef NABLA_CUDA_K_OPTIM_CUH
#define NABLA_CUDA_K_OPTIM_CUH

#include <math.h>
#include <stdint.h>

#include "cuda/khelp.h"
#include "tensor/kernels.h"

namespace nbo {

// The CPU's chunking of clip_abs_pow_sum / clip_abs_max (cpu/optim_kernels.c CHUNK, LANES).
constexpr int64_t kChunk = 16384;
constexpr int kLanes = 8;

// ---- IEEE operations, never contracted --------------------------------------------------------
#if defined(__CUDA_ARCH__)
NB_HD float mul(float a, float b) { return __fmul_rn(a, b); }
NB_HD double mul(double a, double b) { return __dmul_rn(a, b); }
NB_HD float add(float a, float b) { return __fadd_rn(a, b); }
NB_HD double add(double a, double b) { return __dadd_rn(a, b); }
NB_HD float div(float a, float b) { return __fdiv_rn(a, b); }
NB_HD double div(double a, double b) { return __ddiv_rn(a, b); }
NB_HD float sqrt_(float a) { return __fsqrt_rn(a); }
NB_HD double sqrt_(double a) { return __dsqrt_rn(a); }
#else
NB_HD float mul(float a, float b) { return a * b; }
NB_HD double mul(double a, double b) { return a * b; }
NB_HD float add(float a, float b) { return a + b; }
NB_HD double add(double a, double b) { return a + b; }
NB_HD float div(float a, float b) { return a / b; }
NB_HD double div(double a, double b) { return a / b; }
NB_HD float sqrt_(float a) { return sqrtf(a); }
NB_HD double sqrt_(double a) { return sqrt(a); }
#endif

// ---- SGD ----------------------------------------------------------------------------------------
template <typename T> struct sgd_c {
    T wd, mom, omd, nlr;
    bool use_wd, neg, use_buf, init, nest;
};
template <typename T> static inline sgd_c<T> sgd_consts(const nb__sgd_step_args *a) {
    sgd_c<T> c;
    c.wd = (T)a->weight_decay;
    c.mom = (T)a->momentum;
    c.omd = (T)(1.0 - a->dampening);
    c.nlr = (T)(-a->lr);
    c.use_wd = a->weight_decay != 0;
    c.neg = a->maximize;
    c.use_buf = a->buf != NULL;
    c.init = a->init_buf;
    c.nest = a->nesterov;
    return c;
}
// d = maximize ? -g : g;  d += wd * p;  buf = init ? d : buf * mom + omd * d;
// d = nesterov ? d + mom * buf : buf;  p += -lr * d  (buf NULL: p += -lr * d directly)
template <typename T>
NB_HD void sgd_elem(const sgd_c<T> &c, T *p, const T *g, T *buf, int64_t i) {
    T d = c.neg ? -g[i] : g[i];
    if (c.use_wd) d = add(d, mul(c.wd, p[i]));
    if (c.use_buf) {
        T bb = c.init ? d : add(mul(buf[i], c.mom), mul(c.omd, d));
        buf[i] = bb;
        d = c.nest ? add(d, mul(c.mom, bb)) : bb;
    }
    p[i] = add(p[i], mul(c.nlr, d));
}

// ---- Adam / AdamW ---------------------------------------------------------------------------
template <typename T> struct adam_c {
    T b1, omb1, b2, omb2, wd, decay, bc2, eps, nss;
    bool l2, dec, neg, ams;
};
template <typename T> static inline adam_c<T> adam_consts(const nb__adam_step_args *a) {
    adam_c<T> c;
    c.b1 = (T)a->beta1;
    c.omb1 = (T)(1.0 - a->beta1);
    c.b2 = (T)a->beta2;
    c.omb2 = (T)(1.0 - a->beta2);
    c.wd = (T)a->weight_decay;
    c.decay = (T)(1.0 - a->lr * a->weight_decay);
    c.bc2 = (T)a->bc2_sqrt;
    c.eps = (T)a->eps;
    c.nss = (T)(-a->step_size);
    c.l2 = !a->decoupled && a->weight_decay != 0;
    c.dec = a->decoupled;
    c.neg = a->maximize;
    c.ams = a->vmax != NULL;
    return c;
}
// g = maximize ? -g : g;  Adam: g += wd * p;  AdamW: p *= 1 - lr * wd;
// m = m * b1 + (1 - b1) * g;  v = v * b2 + (1 - b2) * g * g;  vmax = max(vmax, v) (NaN stays);
// p += -step_size * m / (sqrt(v or vmax) / bc2_sqrt + eps)
template <typename T>
NB_HD void adam_elem(const adam_c<T> &c, T *p, const T *g, T *m, T *v, T *vmax, int64_t i) {
    T gi = c.neg ? -g[i] : g[i];
    T pi = p[i];
    if (c.l2) gi = add(gi, mul(c.wd, pi));
    if (c.dec) pi = mul(pi, c.decay);
    T mi = add(mul(m[i], c.b1), mul(c.omb1, gi));
    T vi = add(mul(v[i], c.b2), mul(mul(c.omb2, gi), gi));
    m[i] = mi;
    v[i] = vi;
    if (c.ams) {
        T mx = vmax[i];
        mx = (mx >= vi || mx != mx) ? mx : vi;
        vmax[i] = mx;
        vi = mx;
    }
    T denom = add(div(sqrt_(vi), c.bc2), c.eps);
    p[i] = add(pi, div(mul(c.nss, mi), denom));
}

// ---- RMSprop --------------------------------------------------------------------------------
template <typename T> struct rmsprop_c {
    T al, omal, wd, eps, mom, nlr;
    bool use_wd, neg, centered, use_buf;
};
template <typename T> static inline rmsprop_c<T> rmsprop_consts(const nb__rmsprop_step_args *a) {
    rmsprop_c<T> c;
    c.al = (T)a->alpha;
    c.omal = (T)(1.0 - a->alpha);
    c.wd = (T)a->weight_decay;
    c.eps = (T)a->eps;
    c.mom = (T)a->momentum;
    c.nlr = (T)(-a->lr);
    c.use_wd = a->weight_decay != 0;
    c.neg = a->maximize;
    c.centered = a->gavg != NULL;
    c.use_buf = a->buf != NULL;
    return c;
}
// g = maximize ? -g : g;  g += wd * p;  sq = sq * alpha + (1 - alpha) * g * g;
// centered: ga = ga * alpha + (1 - alpha) * g, avg = sqrt(sq + (-1) * ga * ga) + eps;
// else avg = sqrt(sq) + eps;  momentum: buf = buf * mom + 1 * g / avg, p += -lr * buf;
// else p += -lr * g / avg
template <typename T>
NB_HD void rmsprop_elem(const rmsprop_c<T> &c, T *p, const T *g, T *sq, T *buf, T *ga,
                        int64_t i) {
    T gi = c.neg ? -g[i] : g[i];
    if (c.use_wd) gi = add(gi, mul(c.wd, p[i]));
    T s = add(mul(sq[i], c.al), mul(mul(c.omal, gi), gi));
    sq[i] = s;
    T avg;
    if (c.centered) {
        T gai = add(mul(ga[i], c.al), mul(c.omal, gi));
        ga[i] = gai;
        avg = sqrt_(add(s, mul(mul((T)(-1), gai), gai)));
    } else {
        avg = sqrt_(s);
    }
    avg = add(avg, c.eps);
    if (c.use_buf) {
        T b = add(mul(buf[i], c.mom), div(mul((T)1, gi), avg));
        buf[i] = b;
        p[i] = add(p[i], mul(c.nlr, b));
    } else {
        p[i] = add(p[i], div(mul(c.nlr, gi), avg));
    }
}

// ---- Adagrad --------------------------------------------------------------------------------
template <typename T> struct adagrad_c {
    T wd, eps, nclr;
    bool use_wd, neg;
};
template <typename T> static inline adagrad_c<T> adagrad_consts(const nb__adagrad_step_args *a) {
    adagrad_c<T> c;
    c.wd = (T)a->weight_decay;
    c.eps = (T)a->eps;
    c.nclr = (T)(-a->clr);
    c.use_wd = a->weight_decay != 0;
    c.neg = a->maximize;
    return c;
}
// g = maximize ? -g : g;  g += wd * p;  sum += 1 * g * g;  p += -clr * g / (sqrt(sum) + eps)
template <typename T>
NB_HD void adagrad_elem(const adagrad_c<T> &c, T *p, const T *g, T *sum, int64_t i) {
    T gi = c.neg ? -g[i] : g[i];
    if (c.use_wd) gi = add(gi, mul(c.wd, p[i]));
    T s = add(sum[i], mul(mul((T)1, gi), gi));
    sum[i] = s;
    T sd = add(sqrt_(s), c.eps);
    p[i] = add(p[i], div(mul(c.nclr, gi), sd));
}

// ---- element loads and stores of any float dtype (f32 math for the half types) --------------
NB_HD double load_d(const void *x, nb_dtype dt, int64_t i) {
    switch (dt) {
    case NB_F32: return (double)((const float *)x)[i];
    case NB_F64: return ((const double *)x)[i];
    case NB_F16: return (double)nb__kh_f32_from_f16(((const uint16_t *)x)[i]);
    default: return (double)nb__kh_f32_from_bf16(((const uint16_t *)x)[i]);
    }
}
NB_HD float load_h(const uint16_t *x, bool f16, int64_t i) {
    return f16 ? nb__kh_f32_from_f16(x[i]) : nb__kh_f32_from_bf16(x[i]);
}
NB_HD void store_h(uint16_t *x, bool f16, int64_t i, float v) {
    x[i] = f16 ? nb__kh_f16_from_f32(v) : nb__kh_bf16_from_f32(v);
}

// ---- clip_scale / clip_clamp: one element in place ------------------------------------------
// x *= s: f64 in f64; f32 and the half types by s rounded to f32, half results rounded once.
NB_HD void scale_elem(void *x, nb_dtype dt, int64_t i, double s) {
    switch (dt) {
    case NB_F64: ((double *)x)[i] = mul(((double *)x)[i], s); return;
    case NB_F32: ((float *)x)[i] = mul(((float *)x)[i], (float)s); return;
    default: {
        bool f16 = dt == NB_F16;
        store_h((uint16_t *)x, f16, i, mul(load_h((uint16_t *)x, f16, i), (float)s));
        return;
    }
    }
}
// x = min(max(x, lo), hi) as `v < lo ? lo : v` then `v > hi ? hi : v` (NaN passes through).
template <typename T> NB_HD T clamp_val(T v, T l, T h) {
    v = v < l ? l : v;
    return v > h ? h : v;
}
NB_HD void clamp_elem(void *x, nb_dtype dt, int64_t i, double lo, double hi) {
    switch (dt) {
    case NB_F64: ((double *)x)[i] = clamp_val(((double *)x)[i], lo, hi); return;
    case NB_F32: ((float *)x)[i] = clamp_val(((float *)x)[i], (float)lo, (float)hi); return;
    default: {
        bool f16 = dt == NB_F16;
        store_h((uint16_t *)x, f16, i,
                clamp_val(load_h((uint16_t *)x, f16, i), (float)lo, (float)hi));
        return;
    }
    }
}

// ---- amp_unscale: one element; returns whether x[i] is inf or NaN ---------------------------
// out[i] = x[i] * inv (inv = inv_scale rounded to f32; f64 multiplies by it widened back).
NB_HD bool unscale_elem(const void *x, void *out, nb_dtype dt, nb_dtype ot, int64_t i,
                        float inv) {
    switch (dt) {
    case NB_F64: {
        double v = ((const double *)x)[i];
        ((double *)out)[i] = mul(v, (double)inv);
        return !isfinite(v);
    }
    case NB_F32: {
        float v = ((const float *)x)[i];
        ((float *)out)[i] = mul(v, inv);
        return !isfinite(v);
    }
    default: {
        bool f16 = dt == NB_F16;
        float v = load_h((const uint16_t *)x, f16, i);
        bool bad = !isfinite(v);
        v = mul(v, inv);
        if (ot == NB_F32) ((float *)out)[i] = v;
        else store_h((uint16_t *)out, f16, i, v);
        return bad;
    }
    }
}

// ---- clip_abs_pow_sum / clip_abs_max --------------------------------------------------------
// |x|^p of one element in double: p == 2 and p == 1 exactly as the CPU; other p through pow
// (the device's pow may differ from glibc's in the last bit).
NB_HD double abs_pow(double v, double p) {
    v = fabs(v);
    return p == 2 ? mul(v, v) : p == 1 ? v : pow(v, p);
}
// Element i of x of dtype DT as double (DT fixed at compile time: a clean inner loop).
template <int DT> NB_HD double load_t(const void *x, int64_t i) {
    return DT == NB_F32   ? (double)((const float *)x)[i]
           : DT == NB_F64 ? ((const double *)x)[i]
           : DT == NB_F16 ? (double)nb__kh_f32_from_f16(((const uint16_t *)x)[i])
                          : (double)nb__kh_f32_from_bf16(((const uint16_t *)x)[i]);
}
// Lane `lane` of the chunk [s, s + l): sum of |x[s + i]|^p for i = lane, lane + kLanes, ...
// added in that order from 0 (the CPU's accumulator acc[lane]). The loads do not depend on
// the sum, so the unrolled loop keeps several in flight.
template <int DT>
NB_HD double lane_pow_sum_t(const void *x, int64_t s, int64_t l, int lane, double p) {
    double acc = 0;
    if (p == 2) {
#if defined(__CUDA_ARCH__)
#pragma unroll 8
#endif
        for (int64_t i = lane; i < l; i += kLanes) {
            double v = fabs(load_t<DT>(x, s + i));
            acc = add(acc, mul(v, v));
        }
    } else {
        for (int64_t i = lane; i < l; i += kLanes) acc = add(acc, abs_pow(load_t<DT>(x, s + i), p));
    }
    return acc;
}
NB_HD double lane_pow_sum(const void *x, nb_dtype dt, int64_t s, int64_t l, int lane,
                          double p) {
    switch (dt) {
    case NB_F32: return lane_pow_sum_t<NB_F32>(x, s, l, lane, p);
    case NB_F64: return lane_pow_sum_t<NB_F64>(x, s, l, lane, p);
    case NB_F16: return lane_pow_sum_t<NB_F16>(x, s, l, lane, p);
    default: return lane_pow_sum_t<NB_BF16>(x, s, l, lane, p);
    }
}
// A chunk's value: its lanes added in lane order from 0.
NB_HD double chunk_total(const double *lanes) {
    double t = 0;
    for (int k = 0; k < kLanes; k++) t = add(t, lanes[k]);
    return t;
}
// One step of max |x| with NaN sticky: a NaN m stays, a NaN v wins.
NB_HD double max_nan(double m, double v) {
    if (m != m) return m;
    return (v <= m) ? m : v;
}

}  // namespace nbo

#endif
