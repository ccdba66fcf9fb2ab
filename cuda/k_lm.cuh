// cuda/k_lm.cuh - private: the per-thread and per-element math of the language-model
// family's CUDA kernels (cuda/k_lm.cu: RMSNorm, rotary embeddings, the SwiGLU product), as
// __host__ __device__ functions so that tests/cuda_host/lm.cu runs the same code on the host,
// in the kernels' order, against the CPU backend (cpu/lm.c and cpu/lm_tmpl.h are the spec).
// C++ (nvcc), templated over the compute type T (float or double). Unverified on a GPU.
//
// Arithmetic follows the CPU kernels operation by operation, with nbn::mul / add / sub
// (cuda/k_norm.cuh: not contracted into fused multiply-adds on the GPU) and the CPU's own f32
// exponential (nbc_expf, cuda/k_core_math.cuh). Sums are in double; their order is fixed by
// the shape: a row is summed by one block (thread t adds elements t, t + bs, ... in order,
// then nb_block_sum's tree), the weight gradient's rows in chunks (nbn::ln_chunks) added in
// chunk order. The CPU sums in another fixed order, so the two agree to double rounding.
// cos and sin are computed in double (nbc_cos, nbc_sin) and rounded to T, as the CPU rounds
// libm's cos and sin.
#ifndef NABLA_CUDA_K_LM_CUH
#define NABLA_CUDA_K_LM_CUH

#include <math.h>
#include <stdint.h>

#include "cuda/k_core_math.cuh"
#include "cuda/k_norm.cuh"

namespace nbl {

using nbn::add;
using nbn::mul;
using nbn::sub;

// ---- RMSNorm --------------------------------------------------------------------------------
// Thread tid's partial sum of x^2 over a row of D.
template <typename T> NB_HD double rms_part(const T *x, int64_t D, int tid, int bs) {
    double s = 0;
    for (int64_t j = tid; j < D; j += bs) {
        const double d = (double)x[j];
        s = add(s, mul(d, d));
    }
    return s;
}
NB_HD double rms_rstd(double ss, int64_t D, double eps) {
    return 1.0 / sqrt(add(D ? ss / (double)D : 0.0, eps));
}
// y[j] = (x * r) * w[j]
template <typename T> NB_HD T rms_y(T x, T r, const T *w, int64_t j) {
    const T v = mul(x, r);
    return w ? mul(v, w[j]) : v;
}
// Backward: thread tid's partial of sum (g w) x over the row (g w rounded to T first).
template <typename T>
NB_HD double rmsb_part(const T *g, const T *w, const T *x, int64_t D, int tid, int bs) {
    double s = 0;
    for (int64_t j = tid; j < D; j += bs) {
        const T gw = w ? mul(g[j], w[j]) : g[j];
        s = add(s, mul((double)gw, (double)x[j]));
    }
    return s;
}
// c = r^2 mean(g w x), rounded to T
template <typename T> NB_HD T rmsb_c(double r, double s, int64_t D) {
    return (T)mul(mul(r, r), D ? s / (double)D : 0.0);
}
// dx[j] = r (g w - x c)
template <typename T> NB_HD T rmsb_dx(T g, T x, const T *w, int64_t j, T r, T c) {
    const T gw = w ? mul(g, w[j]) : g;
    return mul(r, sub(gw, mul(x, c)));
}
// dw stage 1: column j's partial of sum g (x r) over rows [r0, r1).
template <typename T>
NB_HD double rmsp_col(const T *g, const T *x, const double *rstd, int64_t D, int64_t j,
                      int64_t r0, int64_t r1) {
    double s = 0;
    for (int64_t i = r0; i < r1; i++)
        s = add(s, (double)mul(g[i * D + j], mul(x[i * D + j], (T)rstd[i])));
    return s;
}

// ---- rotary ---------------------------------------------------------------------------------
// The inverse frequency of pair i (tensor/kernels/lm.h): f32 as Hugging Face computes it.
NB_HD float rot_inv(float, int64_t i, int64_t D, double base) {
    const float e = (float)(2 * i) / (float)D;
    return 1.0f / powf((float)base, e);
}
NB_HD double rot_inv(double, int64_t i, int64_t D, double base) {
    return 1.0 / pow(base, (double)(2 * i) / (double)D);
}
// cos and sin of position pos for pair i.
template <typename T>
NB_HD void rot_cs(int64_t pos, int64_t i, int64_t D, double base, T *c, T *s) {
    const T ang = mul((T)pos, rot_inv(T(0), i, D, base));
    *c = (T)nbc_cos((double)ang);
    *s = (T)nbc_sin((double)ang);
}
// The rotated pair (a, b) = (x[i], x[i + D/2]); inverse: by the opposite angle.
template <typename T> NB_HD void rot_pair(T a, T b, T c, T s, bool inverse, T *y1, T *y2) {
    if (inverse) {
        *y1 = add(mul(a, c), mul(b, s));
        *y2 = sub(mul(b, c), mul(a, s));
    } else {
        *y1 = sub(mul(a, c), mul(b, s));
        *y2 = add(mul(b, c), mul(a, s));
    }
}

// ---- SwiGLU ---------------------------------------------------------------------------------
NB_HD float glu_exp(float x) { return nbc_expf(x); }
NB_HD double glu_exp(double x) { return exp(x); }
// silu(a) * b = a / (1 + exp(-a)) * b
template <typename T> NB_HD T glu_y(T a, T b) { return mul(a / add((T)1, glu_exp(-a)), b); }
// With e = 1 + exp(-a) and s = 1 / e: da = g b s (1 + a (1 - s)), db = g a / e.
template <typename T> NB_HD T glu_e(T a) { return add((T)1, glu_exp(-a)); }
template <typename T> NB_HD T glu_da(T g, T a, T b, T e) {
    const T s = (T)1 / e;
    return mul(mul(g, b), mul(s, add((T)1, mul(a, sub((T)1, s)))));
}
template <typename T> NB_HD T glu_db(T g, T a, T e) { return mul(g, a / e); }

} // namespace nbl

#endif
