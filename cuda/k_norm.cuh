// cuda/k_norm.cuh - private: the per-thread and per-element math of the norm kernels
// (cuda/k_norm.cu), as __host__ __device__ functions so that tests/cuda_host/norm.cu runs
// the same code on the host, in the kernels' reduction order, against the CPU backend
// (cpu/norm_tmpl.h is the spec). C++ (nvcc), templated over the compute type T (float or
// double; the norm ops hand in f32 for f32/f16/bf16 tensors and f64 for f64).
//
// Arithmetic follows the CPU kernels operation by operation, in T where they use T and in
// double where they use double. Products are written with nbn::mul / add / sub, which on
// the GPU are the _rn intrinsics: nvcc would otherwise contract a * b + c into one fused
// multiply-add, whose single rounding differs from the CPU's two (the CPU library is
// compiled without contraction). Sums are in double. Unverified on a GPU.
//
// Reduction orders (fixed by the shape alone, so the same bits on every run):
//   - a row (layer norm) or a (channel, chunk) slice (batch norm) is summed by one block:
//     thread t adds its elements t, t + bs, t + 2 bs, ... in order (*_part functions), then
//     nb_block_sum (cuda/kcommon.cuh) adds the bs partials in its fixed tree order;
//   - layer norm's dw/db: the rows are cut into ln_chunks(N, D) chunks; one thread per
//     (column, chunk) sums its rows in order into a double partial (lnp_col), then one
//     thread per column adds the chunks' partials in chunk order (sum_chunks);
//   - batch norm's per-channel sums: the M = N * S values of a channel are cut into
//     bn_chunks(M) contiguous chunks, one block each, then added in chunk order (sum_chunks).
#ifndef NABLA_CUDA_K_NORM_CUH
#define NABLA_CUDA_K_NORM_CUH

#include <math.h>
#include <stdint.h>

#include "cuda/khelp.h"

namespace nbn {

// ---- uncontracted arithmetic ----------------------------------------------------------------
NB_HD float mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
NB_HD double mul(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}
NB_HD float add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
NB_HD double add(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}
NB_HD float sub(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}
NB_HD double sub(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dsub_rn(a, b);
#else
    return a - b;
#endif
}

// ---- geometry (shape only) ------------------------------------------------------------------
// Threads of a layer-norm row block: a warp per 128 elements, 1 to 8 warps.
NB_HD int ln_threads(int64_t D) {
    int64_t w = (D + 127) / 128;
    return (int)(32 * (w < 1 ? 1 : w > 8 ? 8 : w));
}
// Row chunks of layer norm's dw/db: at least 16 rows each, at most 256 chunks, and at
// most 2^21 partials per gradient (the scratch stays within 32 MiB for any D).
NB_HD int64_t ln_chunks(int64_t N, int64_t D) {
    int64_t c = (N + 15) / 16, cap = D > 0 ? ((int64_t)1 << 21) / D : 256;
    if (cap > 256) cap = 256;
    return c < 1 ? 1 : c > cap ? (cap < 1 ? 1 : cap) : c;
}
// Chunks of a batch-norm channel's M values: at least 4096 each, at most 64.
NB_HD int64_t bn_chunks(int64_t M) {
    int64_t c = (M + 4095) / 4096;
    return c < 1 ? 1 : c > 64 ? 64 : c;
}
constexpr int kBnThreads = 256;  // threads of a batch-norm partial-sum block
constexpr int kColThreads = 256; // threads of the per-column / per-channel kernels

// ---- layer norm -----------------------------------------------------------------------------
// Thread tid's partial sum of x over a row of D (elements tid, tid + bs, ...).
template <typename T> NB_HD double ln_part_sum(const T *x, int64_t D, int tid, int bs) {
    double s = 0;
    for (int64_t j = tid; j < D; j += bs) s = add(s, (double)x[j]);
    return s;
}
// ... of (x - m)^2.
template <typename T> NB_HD double ln_part_dev2(const T *x, int64_t D, double m, int tid, int bs) {
    double s = 0;
    for (int64_t j = tid; j < D; j += bs) {
        double d = sub((double)x[j], m);
        s = add(s, mul(d, d));
    }
    return s;
}
// The mean from the row's sum, and 1 / std from the sum of squared deviations.
NB_HD double ln_mean(double sum, int64_t D) { return D ? sum / (double)D : 0.0; }
NB_HD double ln_rstd(double dev2, int64_t D, double eps) {
    double v = D ? dev2 / (double)D : 0.0;
    return 1.0 / sqrt(add(v, eps));
}
// y[j] from x[j] with the row's mean and rstd already in T.
template <typename T> NB_HD T ln_y(T x, T m, T r, const T *w, const T *b, int64_t j) {
    T v = mul(sub(x, m), r);
    if (w) v = mul(v, w[j]);
    if (b) v = add(v, b[j]);
    return v;
}

// Backward, dx: thread tid's partials of s1 = sum gw and s2 = sum gw * xhat over the row.
template <typename T>
NB_HD void lnb_part(const T *g, const T *x, const T *w, T m, T r, int64_t D, int tid, int bs,
                    double *s1, double *s2) {
    double a = 0, c = 0;
    for (int64_t j = tid; j < D; j += bs) {
        T gw = w ? mul(g[j], w[j]) : g[j];
        T xh = mul(sub(x[j], m), r);
        a = add(a, (double)gw);
        c = add(c, (double)mul(gw, xh));
    }
    *s1 = a;
    *s2 = c;
}
// dx[j] = r * (g w - c1 - (x - m) r c2), with c1 = (T)(s1 / D), c2 = (T)(s2 / D).
template <typename T> NB_HD T lnb_dx(T g, T x, const T *w, int64_t j, T m, T r, T c1, T c2) {
    T t = w ? mul(g, w[j]) : g;
    t = sub(t, c1);
    T u = mul(mul(sub(x, m), r), c2);
    return mul(r, sub(t, u));
}
// dw/db stage 1: column j's partials over rows [r0, r1).
template <typename T>
NB_HD void lnp_col(const T *g, const T *x, const double *mean, const double *rstd, int64_t D,
                   int64_t j, int64_t r0, int64_t r1, double *pw, double *pb) {
    double sw = 0, sb = 0;
    for (int64_t i = r0; i < r1; i++) {
        T m = (T)mean[i], r = (T)rstd[i], gv = g[i * D + j];
        sw = add(sw, (double)mul(gv, mul(sub(x[i * D + j], m), r)));
        sb = add(sb, (double)gv);
    }
    *pw = sw;
    *pb = sb;
}
// Rows of chunk ch of nch over N (the CPU's split formula).
NB_HD int64_t chunk_lo(int64_t N, int64_t ch, int64_t nch) { return N * ch / nch; }

// Stage 2: entry j of part (nch rows of `width`) summed over the chunks in order.
NB_HD double sum_chunks(const double *part, int64_t nch, int64_t width, int64_t j) {
    double s = 0;
    for (int64_t ch = 0; ch < nch; ch++) s = add(s, part[ch * width + j]);
    return s;
}

// ---- batch norm -----------------------------------------------------------------------------
// Thread tid's partials over values [m0, m1) of channel c (value v = n * S + s lives at
// x[(n * C + c) * S + s]). kind 0: sum x; 1: sum (x - mean)^2; 2: sum g (*p1) and
// sum g (x - mean) (*p2).
template <typename T>
NB_HD void bn_part(int kind, const T *x, const T *g, int64_t C, int64_t S, int64_t c, double mean,
                   int64_t m0, int64_t m1, int tid, int bs, double *p1, double *p2) {
    double a = 0, b = 0;
    for (int64_t v = m0 + tid; v < m1; v += bs) {
        int64_t n = v / S, s = v - n * S, at = (n * C + c) * S + s;
        if (kind == 0) {
            a = add(a, (double)x[at]);
        } else if (kind == 1) {
            double d = sub((double)x[at], mean);
            a = add(a, mul(d, d));
        } else {
            a = add(a, (double)g[at]);
            b = add(b, mul((double)g[at], sub((double)x[at], mean)));
        }
    }
    *p1 = a;
    *p2 = b;
}

// A float of any dtype as double and back (running statistics: 1-D views of any float
// dtype), as the CPU's nb__load_f64 / nb__store_f64 do.
NB_HD double ld_any(const char *p, nb_dtype dt) {
    switch (dt) {
    case NB_F32: return *(const float *)p;
    case NB_F64: return *(const double *)p;
    case NB_F16: return nb__kh_f32_from_f16(*(const uint16_t *)p);
    case NB_BF16: return nb__kh_f32_from_bf16(*(const uint16_t *)p);
    default: return 0.0;
    }
}
NB_HD void st_any(char *p, nb_dtype dt, double v) {
    switch (dt) {
    case NB_F32: *(float *)p = (float)v; break;
    case NB_F64: *(double *)p = v; break;
    case NB_F16: *(uint16_t *)p = nb__kh_f16_from_f32((float)v); break;
    case NB_BF16: *(uint16_t *)p = nb__kh_bf16_from_f32((float)v); break;
    default: break;
    }
}
// Element c of a 1-D view (strides in elements) of a float dtype.
NB_HD char *view_at(const nb__view &v, int64_t c) {
    int64_t es = v.dtype == NB_F64 ? 8 : v.dtype == NB_F32 ? 4 : 2;
    return v.data + c * v.strides[0] * es;
}
// r = (1 - momentum) * r + momentum * v * factor
NB_HD void bn_blend(char *r, nb_dtype dt, double v, double momentum, double factor) {
    st_any(r, dt, add(mul(sub(1.0, momentum), ld_any(r, dt)), mul(mul(momentum, v), factor)));
}

// y from x for channel c: (x - m) * a + sh, a = (T)rstd * w (or 1), sh = b (or 0).
template <typename T>
NB_HD T bn_y(T x, int64_t c, const double *mean, const double *rstd, const T *w, const T *b) {
    T a = mul((T)rstd[c], w ? w[c] : (T)1);
    return add(mul(sub(x, (T)mean[c]), a), b ? b[c] : (T)0);
}

// Backward dx for channel c from the channel sums sg = sum g, sgd = sum g (x - mean).
template <typename T>
NB_HD T bn_dx(T g, T x, int64_t c, const double *mean, const double *rstd, const T *w,
              bool batch_stats, const double *sg, const double *sgd, int64_t M) {
    double ad = mul(rstd[c], w ? (double)w[c] : 1.0);
    T a = (T)ad;
    if (!batch_stats) return mul(a, g);
    T k = 0, q = 0;
    if (M > 0) {
        k = (T)(mul(ad, sg[c]) / (double)M);
        q = (T)(mul(mul(mul(ad, rstd[c]), rstd[c]), sgd[c]) / (double)M);
    }
    return sub(sub(mul(a, g), k), mul(sub(x, (T)mean[c]), q));
}

// ---- dropout --------------------------------------------------------------------------------
// out[i] = x[i] * (mask[i] * scale) for a float dtype: f32 and f64 in their own type, f16
// and bf16 in f32 rounded once (the CPU's nb__cpu_dropout).
NB_HD void dropout_el(const void *x, const uint8_t *mask, void *out, int64_t i, nb_dtype dt,
                      double scale) {
    float fs = (float)scale, fm = (float)mask[i];
    switch (dt) {
    case NB_F32: ((float *)out)[i] = mul(((const float *)x)[i], mul(fm, fs)); break;
    case NB_F64:
        ((double *)out)[i] = mul(((const double *)x)[i], mul((double)mask[i], scale));
        break;
    case NB_F16:
        ((uint16_t *)out)[i] =
            nb__kh_f16_from_f32(mul(nb__kh_f32_from_f16(((const uint16_t *)x)[i]), mul(fm, fs)));
        break;
    case NB_BF16:
        ((uint16_t *)out)[i] =
            nb__kh_bf16_from_f32(mul(nb__kh_f32_from_bf16(((const uint16_t *)x)[i]), mul(fm, fs)));
        break;
    default: break;
    }
}

} // namespace nbn

#endif
