// cuda/k_core_math.cuh - private: the per-element math of the core family's CUDA kernels
// (cuda/k_core.cu: copy, fill, ew, ew_backward), written once as __host__ __device__
// functions so that tests/cuda_host/core.cu runs the very same code on the host and compares
// it with the CPU backend (cpu/convert.c, cpu/elementwise.c: the spec). UNVERIFIED ON A GPU:
// no GPU was available when this was written; only the host side has been run.
//
//   nbc_offsets4<I>(it, i, &o0..)   byte offsets of element i of the four operands of an
//                                   nb__iter (one index decode for all of them)
//   nbc_copy_at(it, o0, o1)         copy one element, converting dtypes like cpu/convert.c
//   nbc_copy_chunk8<ESI, ESO>(it, j) 8 elements of a contiguous f32/bf16/f16 conversion
//   nbc_fill_bytes(dt, v, &bits)    the bytes fill stores (nb__store_f64's conversion)
//   nbc_ew_at<S>(a, o0, o1, o2, o3) one element of an ew kernel in storage type S
//   nbc_bw_at<S>(a, o0, o1, o2, o3) one element of an ew_backward kernel
//   nbc_ew_val<S> / nbc_bw_val<S>   the same math on loaded values (the vector fast path)
//   nbc_*_path, nbc_*_thread          the kernels' choice of path and their thread bodies
//   nbc_ew_supported / nbc_bw_supported
//                                   the (op, dtype) pairs handled (= nb__ew_supported and
//                                   nb__ew_backward_supported; the host check compares)
//
// The math follows the CPU kernels expression by expression: f32/f16/bf16 compute in f32
// (the half types load to f32 and round once, with the CPU's rounding), f64 in f64,
// integers wrap around on unsigned types, bool add/maximum are "or", mul/minimum "and".
// exp, tanh, sigmoid, silu, gelu, gelu_tanh in f32 use the CPU's own polynomials
// (cpu/fastmath.h, cpu/elementwise.c) with fmaf where the CPU writes NB__MADD (fmaf on FMA
// machines). Products that the device compiler could fuse with an add (which the CPU, built
// as ISO C, never does) go through nbc_mulf/nbc_muld, which are not contracted on the GPU.
// log, log1p, pow, erfc and the f64 functions call the C math library on the host and CUDA's
// math library on the device (within CUDA's documented ulp bounds of each other); sin and cos
// are computed here (nbc_sin, nbc_cos) on both sides.
//
// Edge cases, as the CPU: there is no integer division or modulo (div runs in float dtypes
// only, nb__ew_supported), so no integer division by zero exists; float x / 0 is +-inf or NaN
// (IEEE). Integer pow with a negative exponent gives 1 ^ -n = 1, (-1) ^ -n = +-1, else 0.
// NaN: maximum/minimum return NaN when either operand is NaN; comparisons with NaN are false
// (ne true); clamp and relu keep NaN; the half types round NaN to a quiet NaN; a float to
// integer conversion (copy, fill) gives 0 for NaN and saturates at the int64 range, narrower
// integer types wrap.
#ifndef NABLA_CUDA_K_CORE_MATH_CUH
#define NABLA_CUDA_K_CORE_MATH_CUH

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include <vector_types.h> // uint4 (host and device)

#include "cuda/khelp.h"
#include "tensor/kernels.h"

#ifdef __CUDA_ARCH__
#define NBC_UNROLL _Pragma("unroll")
#else
#define NBC_UNROLL
#endif

// ---- products the device must not fuse into an FMA ----------------------------------------
NB_HD float nbc_mulf(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
NB_HD double nbc_muld(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}

// ---- iterator offsets -------------------------------------------------------------------
// Byte offsets of element i of operands 0..3 (operands past it->nargs get 0). I: the index
// type of the decode, uint32_t when numel < 2^31 (a 32-bit division costs a fraction of a
// 64-bit one on the GPU), else int64_t.
template <typename I>
NB_HD void nbc_offsets4(const nb__iter *it, I i, int64_t *o0, int64_t *o1, int64_t *o2,
                        int64_t *o3) {
    int64_t r0 = 0, r1 = 0, r2 = 0, r3 = 0;
    int na = it->nargs;
    for (int d = it->ndim - 1; d >= 0; d--) {
        I n = (I)it->shape[d];
        I q = n > 1 ? i / n : i;
        int64_t idx = (int64_t)(i - q * n);
        r0 += idx * it->strides[0][d];
        if (na > 1) r1 += idx * it->strides[1][d];
        if (na > 2) r2 += idx * it->strides[2][d];
        if (na > 3) r3 += idx * it->strides[3][d];
        i = q;
    }
    *o0 = r0;
    *o1 = r1;
    *o2 = r2;
    *o3 = r3;
}

// ---- dtype loads and stores by run-time dtype (tensor/dtype.c) ------------------------------
NB_HD bool nbc_is_int(nb_dtype dt) { return dt == NB_I32 || dt == NB_I64 || dt == NB_U8; }

NB_HD double nbc_load_f64(const char *p, nb_dtype dt) {
    switch (dt) {
    case NB_F32: return *(const float *)p;
    case NB_F64: return *(const double *)p;
    case NB_F16: return nb__kh_f32_from_f16(*(const uint16_t *)p);
    case NB_BF16: return nb__kh_f32_from_bf16(*(const uint16_t *)p);
    case NB_I32: return *(const int32_t *)p;
    case NB_I64: return (double)*(const int64_t *)p;
    case NB_U8: return *(const uint8_t *)p;
    default: return *(const uint8_t *)p ? 1.0 : 0.0;
    }
}

// Float to integer: truncation toward zero, NaN gives 0, int64 saturates, narrower types wrap.
NB_HD int64_t nbc_to_i64(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775807.0) return INT64_MAX;
    if (v <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v;
}

NB_HD void nbc_store_f64(char *p, nb_dtype dt, double v) {
    switch (dt) {
    case NB_F32: *(float *)p = (float)v; break;
    case NB_F64: *(double *)p = v; break;
    case NB_F16: *(uint16_t *)p = nb__kh_f16_from_f32((float)v); break;
    case NB_BF16: *(uint16_t *)p = nb__kh_bf16_from_f32((float)v); break;
    case NB_I32: *(int32_t *)p = (int32_t)(uint32_t)(uint64_t)nbc_to_i64(v); break;
    case NB_I64: *(int64_t *)p = nbc_to_i64(v); break;
    case NB_U8: *(uint8_t *)p = (uint8_t)(uint64_t)nbc_to_i64(v); break;
    default: *(uint8_t *)p = v != 0.0; break;
    }
}

NB_HD int64_t nbc_load_int(const char *p, nb_dtype dt) {
    return dt == NB_I64 ? *(const int64_t *)p
           : dt == NB_I32 ? *(const int32_t *)p
                          : *(const uint8_t *)p;
}

// ---- copy (cpu/convert.c) -------------------------------------------------------------------
// One element from in (offset o1) to out (offset o0). Same dtype: the bytes move unchanged
// (NaN payloads too). f32 <-> f16/bf16: the half rounding. Integer/bool from integer: exact
// through int64 (wrapping). Everything else through double.
NB_HD void nbc_copy_at(const nb__iter *it, int64_t o0, int64_t o1) {
    nb_dtype od = it->dtype[0], id = it->dtype[1];
    char *o = it->data[0] + o0;
    const char *in = it->data[1] + o1;
    if (od == id) {
        switch (nb__kh_dtype_size(od)) {
        case 1: *(uint8_t *)o = *(const uint8_t *)in; break;
        case 2: *(uint16_t *)o = *(const uint16_t *)in; break;
        case 4: *(uint32_t *)o = *(const uint32_t *)in; break;
        default: *(uint64_t *)o = *(const uint64_t *)in; break;
        }
        return;
    }
    bool half_out = od == NB_F16 || od == NB_BF16, half_in = id == NB_F16 || id == NB_BF16;
    if ((half_out && id == NB_F32) || (half_in && od == NB_F32)) {
        float v = id == NB_F32    ? *(const float *)in
                  : id == NB_BF16 ? nb__kh_f32_from_bf16(*(const uint16_t *)in)
                                  : nb__kh_f32_from_f16(*(const uint16_t *)in);
        if (od == NB_F32) *(float *)o = v;
        else if (od == NB_BF16) *(uint16_t *)o = nb__kh_bf16_from_f32(v);
        else *(uint16_t *)o = nb__kh_f16_from_f32(v);
        return;
    }
    if (nbc_is_int(id) && (nbc_is_int(od) || od == NB_BOOL)) {
        int64_t v = nbc_load_int(in, id);
        switch (od) {
        case NB_I64: *(int64_t *)o = v; break;
        case NB_I32: *(int32_t *)o = (int32_t)(uint32_t)(uint64_t)v; break;
        case NB_U8: *(uint8_t *)o = (uint8_t)(uint64_t)v; break;
        default: *(uint8_t *)o = v != 0; break;
        }
        return;
    }
    nbc_store_f64(o, od, nbc_load_f64(in, id));
}

// fill: the element's bytes (little-endian in the low nb__kh_dtype_size(dt) bytes of *bits).
NB_HD void nbc_fill_bytes(nb_dtype dt, double v, uint64_t *bits) {
    char b[8] = {0};
    nbc_store_f64(b, dt, v);
    memcpy(bits, b, 8);
}

// ---- the CPU's vectorizable f32 functions (cpu/fastmath.h, cpu/elementwise.c) ----------------
NB_HD float nbc_bits_f(uint32_t u) { return nb__kh_bits_f32(u); }
NB_HD uint32_t nbc_f_bits(float f) { return nb__kh_f32_bits(f); }

NB_HD float nbc_expf(float x) {
    float xc = x > -104.0f ? x : -104.0f; // a NaN becomes -104 here and is put back below
    xc = xc < 89.0f ? xc : 89.0f;
    float fn = fmaf(xc, 1.44269504088896341f, 12582912.0f);
    fn -= 12582912.0f;
    float r = fmaf(fn, -0.693359375f, xc);
    r = fmaf(fn, 2.12194440e-4f, r);
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    int32_t n = (int32_t)fn, n1 = n / 2, n2 = n - n1;
    float y = p * nbc_bits_f((uint32_t)(n1 + 127) << 23) * nbc_bits_f((uint32_t)(n2 + 127) << 23);
    return x != x ? x : y;
}

// exp(hi + lo) (expf2_v of cpu/elementwise.c).
NB_HD float nbc_expf2(float hi, float lo) {
    float s = hi + lo;
    float sc = s > -104.0f ? s : -104.0f;
    sc = sc < 89.0f ? sc : 89.0f;
    bool clamped = !(s > -104.0f && s < 89.0f);
    hi = clamped ? sc : hi;
    lo = clamped ? 0.0f : lo;
    const float magic = 12582912.0f;
    float t = fmaf(sc, 1.44269504088896341f, magic);
    float kf = t - magic;
    int32_t k = (int32_t)(nbc_f_bits(t) - nbc_f_bits(magic));
    float r = fmaf(kf, -0.693359375f, hi);
    r = r + lo;
    r = fmaf(kf, 2.12194440e-4f, r);
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    int32_t k1 = k / 2, k2 = k - k1;
    float y = p * nbc_bits_f((uint32_t)(k1 + 127) << 23) * nbc_bits_f((uint32_t)(k2 + 127) << 23);
    return s != s ? s : y;
}

NB_HD float nbc_tanhf(float x) {
    float a = fabsf(x), s = x * x;
    float p = 2.29584126e-3f;
    p = fmaf(p, s, -8.34698049e-3f);
    p = fmaf(p, s, 2.17699609e-2f);
    p = fmaf(p, s, -5.39594059e-2f);
    p = fmaf(p, s, 1.33333043e-1f);
    p = fmaf(p, s, -3.33333332e-1f);
    float small = fmaf(x * s, p, x);
    float big = 1.0f - 2.0f / (nbc_expf(2.0f * a) + 1.0f);
    return copysignf(a < 0.625f ? small : big, x);
}

// Phi(-a) for a >= 0 and exp(-a^2/2) in *gauss (ncdf_tail_v of cpu/elementwise.c).
NB_HD float nbc_ncdf_tail(float a, float *gauss) {
    a = a < 15.0f ? a : 15.0f;
    const float c = 2.82842712f;
    float d = c + a, ap = d - c, cp = d - ap;
    float de = (c - cp) + (a - ap);
    float t0 = c / d;
    float tlo = nbc_mulf(fmaf(-t0, d, c) - nbc_mulf(t0, de), t0 * (1.0f / 2.82842712f));
    float u = (t0 - 0.586956501f) + tlo;
    float p = -3.100700863e-2f;
    p = fmaf(p, u, 3.107219189e-2f);
    p = fmaf(p, u, 3.334905207e-2f);
    p = fmaf(p, u, -7.126717269e-2f);
    p = fmaf(p, u, -2.408058150e-3f);
    p = fmaf(p, u, 1.138484254e-1f);
    p = fmaf(p, u, -4.668257758e-2f);
    p = fmaf(p, u, -2.050457895e-1f);
    p = fmaf(p, u, 7.945910096e-2f);
    p = fmaf(p, u, 5.885713100e-1f);
    p = fmaf(p, u, 7.871958613e-1f);
    p = fmaf(p, u, 5.748564005e-1f);
    float a2 = a * a;
    float g = nbc_expf2(-0.5f * a2, -0.5f * fmaf(a, a, -a2));
    *gauss = g;
    float h = 0.5f * p * g;
    return fmaf(h, t0, h * tlo);
}

NB_HD float nbc_geluf(float x) {
    float g, q = nbc_ncdf_tail(fabsf(x), &g);
    return x * (x < 0 ? q : 1.0f - q);
}
NB_HD float nbc_dgeluf(float x) {
    float g, q = nbc_ncdf_tail(fabsf(x), &g);
    return (x < 0 ? q : 1.0f - q) + nbc_mulf(x, 0.398942280f * g);
}

#define NBC_GELU_K 0.7978845608028654 // sqrt(2 / pi)
#define NBC_GELU_C 0.044715
#define NBC_INV_SQRT_2PI 0.3989422804014327
#define NBC_SQRT1_2 0.70710678118654752440

NB_HD float nbc_gelu_tanhf(float x) {
    float cube = nbc_mulf(0.044715f * x * x, x);
    return x / (1.0f + nbc_expf(-2.0f * (float)NBC_GELU_K * (x + cube)));
}
NB_HD double nbc_gelu_tanh(double x) {
    double cube = nbc_muld(0.044715 * x * x, x);
    return 0.5 * x * (1.0 + tanh(NBC_GELU_K * (x + cube)));
}
NB_HD float nbc_dgelu_tanhf(float x) {
    const float k = (float)NBC_GELU_K, c = (float)NBC_GELU_C;
    float s = 1.0f / (1.0f + nbc_expf(-2.0f * k * (x + nbc_mulf(c * x * x, x))));
    float t = nbc_mulf(2.0f * x * s * (1.0f - s) * k, 1.0f + nbc_mulf(3.0f * c * x, x));
    return s + t;
}
NB_HD double nbc_dgelu_tanh(double x) {
    double t = tanh(NBC_GELU_K * (x + nbc_muld(NBC_GELU_C * x * x, x)));
    double a = nbc_muld(0.5, 1.0 + t);
    double b = nbc_muld(0.5 * x * (1.0 - nbc_muld(t, t)) * NBC_GELU_K,
                        1.0 + nbc_muld(3.0 * NBC_GELU_C * x, x));
    return a + b;
}
NB_HD float nbc_dsiluf(float x) {
    float s = 1.0f / (1.0f + nbc_expf(-x));
    return s * (1.0f + nbc_mulf(x, 1.0f - s));
}
NB_HD double nbc_dsilu(double x) {
    double s = 1.0 / (1.0 + exp(-x));
    return s * (1.0 + nbc_muld(x, 1.0 - s));
}
NB_HD double nbc_dgelu(double x) {
    return nbc_muld(0.5, erfc(x * -NBC_SQRT1_2)) +
           nbc_muld(x * NBC_INV_SQRT_2PI, exp(-0.5 * x * x));
}

// ---- sin and cos ------------------------------------------------------------------------------
// CUDA's sin/cos keep a Payne-Hanek argument reduction in local memory, which this build
// refuses (-warn-lmem-usage), so both sides compute sin(x) = sinpi(r), r = x / pi mod 2, with
// r exact to ~2^-100 in double-double: x = M 2^e (M a 53-bit integer) times 1/pi split into
// 53-bit integers d_k (1/pi = sum d_k 2^(-53 (k+1))); only the five products M d_k whose
// scaled value is not a multiple of 2 matter, each an exact pair (fma), reduced mod 2 and
// summed with error-free additions. f32 calls it in double and rounds once. Accuracy: within
// 1 ulp (f32) / 2 ulps (f64) of the C library's sinf/sin (checked by tests/cuda_host/core.cu).
#define NBC_INV_PI_D(X)                                                                    \
    X(2867080569611329.0) X(2907075704234986.0) X(3720129793271142.0)                      \
    X(2781886859440779.0) X(1033398051496375.0) X(1281786957642332.0) X(27645557876550.0)  \
    X(2549213665005144.0) X(5236372294607711.0) X(2917513453753144.0)                      \
    X(7891938382417998.0) X(3534594005178831.0) X(5801591886822905.0)                      \
    X(1415500946145275.0) X(6780002083060806.0) X(1597612785383067.0)                      \
    X(2230851055164276.0) X(8598725538398164.0) X(3198796862454521.0)                      \
    X(4375892670926780.0) X(2905540718754655.0) X(6231970361182912.0)                      \
    X(3590025487691439.0)
#define NBC_INV_PI_ENTRY(v) v,
static __constant__ const double nbc_inv_pi_dev[23] = {NBC_INV_PI_D(NBC_INV_PI_ENTRY)};
static const double nbc_inv_pi_host[23] = {NBC_INV_PI_D(NBC_INV_PI_ENTRY)};
#undef NBC_INV_PI_ENTRY

NB_HD double nbc_inv_pi_d(int k) {
#ifdef __CUDA_ARCH__
    return nbc_inv_pi_dev[k];
#else
    return nbc_inv_pi_host[k];
#endif
}

// v minus the multiple of 2 toward zero (fmod(v, 2)): exact, in (-2, 2), the sign of v.
NB_HD double nbc_mod2(double v) { return v - 2.0 * trunc(v * 0.5); }

// (sh, sl) += a with the rounding error of sh + a kept in sl (two-sum), sh taken mod 2.
NB_HD void nbc_dd_add_mod2(double a, double *sh, double *sl) {
    double s = *sh + a, bb = s - *sh;
    *sl += (*sh - (s - bb)) + (a - bb);
    *sh = nbc_mod2(s);
}

// x / pi mod 2 as h + l, h in [-1, 1), |l| <= ulp(h) / 2. x finite, |x| >= 2^-27.
NB_HD void nbc_x_over_pi(double x, double *h, double *l) {
    int ex;
    double m = frexp(x, &ex); // x = m 2^ex, 0.5 <= |m| < 1
    double M = ldexp(m, 53);  // integer, |M| < 2^53
    int e = ex - 53;          // x = M 2^e
    int k0 = e > 1 ? (e - 1) / 53 : 0;
    double sh = 0.0, sl = 0.0;
    for (int k = k0; k < k0 + 5 && k < 23; k++) {
        double d = nbc_inv_pi_d(k);
        double p = M * d, q = fma(M, d, -p); // M d = p + q exactly
        int sc = e - 53 * (k + 1);
        nbc_dd_add_mod2(nbc_mod2(ldexp(p, sc)), &sh, &sl);
        nbc_dd_add_mod2(nbc_mod2(ldexp(q, sc)), &sh, &sl);
    }
    double s = sh + sl, err = sl - (s - sh); // fast two-sum (|sh| >= |sl| or sh == 0)
    s -= 2.0 * rint(s * 0.5);                 // into [-1, 1], exact
    *h = s;
    *l = err;
}

NB_HD double nbc_sin(double x) {
    if (x != x || fabs(x) == INFINITY) return x - x; // NaN
    if (fabs(x) < 0x1p-27) return x;
    double h, l;
    nbc_x_over_pi(x, &h, &l);
    return sinpi(h) + nbc_muld(3.141592653589793 * l, cospi(h));
}

NB_HD double nbc_cos(double x) {
    if (x != x || fabs(x) == INFINITY) return x - x;
    if (fabs(x) < 0x1p-27) return 1.0;
    double h, l;
    nbc_x_over_pi(x, &h, &l);
    return cospi(h) - nbc_muld(3.141592653589793 * l, sinpi(h));
}

// ---- ops: which kind each op of NB__OPS is ---------------------------------------------------
// One constant per op, looked up through a table generated from NB__OPS: an op added to
// tensor/op_table.h without a line here fails to compile.
enum nbc_kind { NBC_NONE, NBC_UNARY, NBC_BINARY, NBC_CMP, NBC_WHERE };
#define NBC_KIND(name, kind) constexpr nbc_kind nbc_kind_##name = kind;
NBC_KIND(NEG, NBC_UNARY) NBC_KIND(ABS, NBC_UNARY) NBC_KIND(EXP, NBC_UNARY)
NBC_KIND(LOG, NBC_UNARY) NBC_KIND(LOG1P, NBC_UNARY) NBC_KIND(SQRT, NBC_UNARY)
NBC_KIND(RSQRT, NBC_UNARY) NBC_KIND(SIN, NBC_UNARY) NBC_KIND(COS, NBC_UNARY)
NBC_KIND(TANH, NBC_UNARY) NBC_KIND(SIGMOID, NBC_UNARY) NBC_KIND(RELU, NBC_UNARY)
NBC_KIND(GELU, NBC_UNARY) NBC_KIND(GELU_TANH, NBC_UNARY) NBC_KIND(SILU, NBC_UNARY)
NBC_KIND(POW_SCALAR, NBC_UNARY) NBC_KIND(CLAMP, NBC_UNARY)
NBC_KIND(ADD, NBC_BINARY) NBC_KIND(SUB, NBC_BINARY) NBC_KIND(MUL, NBC_BINARY)
NBC_KIND(DIV, NBC_BINARY) NBC_KIND(POW, NBC_BINARY) NBC_KIND(MAXIMUM, NBC_BINARY)
NBC_KIND(MINIMUM, NBC_BINARY)
NBC_KIND(EQ, NBC_CMP) NBC_KIND(NE, NBC_CMP) NBC_KIND(LT, NBC_CMP) NBC_KIND(LE, NBC_CMP)
NBC_KIND(GT, NBC_CMP) NBC_KIND(GE, NBC_CMP) NBC_KIND(WHERE, NBC_WHERE)
// not elementwise: other kernel families
NBC_KIND(SUM, NBC_NONE) NBC_KIND(MEAN, NBC_NONE) NBC_KIND(VAR, NBC_NONE) NBC_KIND(STD, NBC_NONE)
NBC_KIND(LOGSUMEXP, NBC_NONE) NBC_KIND(AMAX, NBC_NONE) NBC_KIND(AMIN, NBC_NONE)
NBC_KIND(MAX_DIM, NBC_NONE) NBC_KIND(MIN_DIM, NBC_NONE) NBC_KIND(ARGMAX, NBC_NONE)
NBC_KIND(ARGMIN, NBC_NONE) NBC_KIND(SOFTMAX, NBC_NONE) NBC_KIND(LOG_SOFTMAX, NBC_NONE)
NBC_KIND(MATMUL, NBC_NONE) NBC_KIND(INDEX_SELECT, NBC_NONE) NBC_KIND(GATHER, NBC_NONE)
NBC_KIND(SCATTER_ADD, NBC_NONE) NBC_KIND(EMBEDDING, NBC_NONE) NBC_KIND(MASKED_FILL, NBC_NONE)
NBC_KIND(ONE_HOT, NBC_NONE) NBC_KIND(TRIL, NBC_NONE) NBC_KIND(TRIU, NBC_NONE)
NBC_KIND(CAT, NBC_NONE) NBC_KIND(STACK, NBC_NONE) NBC_KIND(COPY, NBC_NONE)
NBC_KIND(TO_DTYPE, NBC_NONE) NBC_KIND(VIEW, NBC_NONE) NBC_KIND(PERMUTE, NBC_NONE)
NBC_KIND(NARROW, NBC_NONE) NBC_KIND(EXPAND, NBC_NONE) NBC_KIND(SLICE, NBC_NONE)
NBC_KIND(SELECT, NBC_NONE) NBC_KIND(CONV2D, NBC_NONE) NBC_KIND(MAXPOOL2D, NBC_NONE)
NBC_KIND(AVGPOOL2D, NBC_NONE) NBC_KIND(ADAPTIVE_AVGPOOL2D, NBC_NONE)
NBC_KIND(LAYER_NORM, NBC_NONE) NBC_KIND(BATCH_NORM, NBC_NONE) NBC_KIND(DROPOUT, NBC_NONE)
NBC_KIND(CROSS_ENTROPY, NBC_NONE) NBC_KIND(NLL_LOSS, NBC_NONE)
NBC_KIND(BCE_WITH_LOGITS, NBC_NONE) NBC_KIND(LINEAR, NBC_NONE) NBC_KIND(ATTENTION, NBC_NONE)
NBC_KIND(ATTENTION_QKV, NBC_NONE) NBC_KIND(TO_DEVICE, NBC_NONE) NBC_KIND(RECOMPUTE, NBC_NONE)
NBC_KIND(COLLECTIVE, NBC_NONE) NBC_KIND(RMS_NORM, NBC_NONE) NBC_KIND(ROTARY, NBC_NONE)
NBC_KIND(SWIGLU, NBC_NONE)
#undef NBC_KIND

NB_HD nbc_kind nbc_op_kind(nb__op op) {
    switch (op) {
#define NBC_KIND_CASE(name, str, arity, grad) case NB__OP_##name: return nbc_kind_##name;
        NB__OPS(NBC_KIND_CASE)
#undef NBC_KIND_CASE
    default: return NBC_NONE;
    }
}

// The (op, dtype) pairs of nb__ew_supported (tensor/ops/elementwise.c).
NB_HD bool nbc_ew_supported(nb__op op, nb_dtype dt) {
    bool fl = dt == NB_F32 || dt == NB_F64 || dt == NB_F16 || dt == NB_BF16;
    bool in = nbc_is_int(dt);
    switch (op) {
    case NB__OP_EXP: case NB__OP_LOG: case NB__OP_LOG1P: case NB__OP_SQRT:
    case NB__OP_RSQRT: case NB__OP_SIN: case NB__OP_COS: case NB__OP_TANH:
    case NB__OP_SIGMOID: case NB__OP_GELU: case NB__OP_GELU_TANH: case NB__OP_SILU:
    case NB__OP_DIV:
        return fl;
    case NB__OP_NEG: case NB__OP_RELU: case NB__OP_POW_SCALAR: case NB__OP_CLAMP:
    case NB__OP_SUB: case NB__OP_POW:
        return fl || in;
    case NB__OP_ABS: case NB__OP_ADD: case NB__OP_MUL: case NB__OP_MAXIMUM:
    case NB__OP_MINIMUM:
        return fl || in || dt == NB_BOOL;
    default: {
        nbc_kind k = nbc_op_kind(op);
        return (k == NBC_CMP || k == NBC_WHERE) && (unsigned)dt < NB_DTYPE_COUNT;
    }
    }
}

// The pairs of nb__ew_backward_supported.
NB_HD bool nbc_bw_supported(nb__op op, int input, nb_dtype dt) {
    bool fl = dt == NB_F32 || dt == NB_F64 || dt == NB_F16 || dt == NB_BF16;
    if (!fl || input < 0 || input > 1) return false;
    switch (op) {
    case NB__OP_ABS: case NB__OP_EXP: case NB__OP_LOG: case NB__OP_LOG1P: case NB__OP_SQRT:
    case NB__OP_RSQRT: case NB__OP_SIN: case NB__OP_COS: case NB__OP_TANH:
    case NB__OP_SIGMOID: case NB__OP_RELU: case NB__OP_GELU: case NB__OP_GELU_TANH:
    case NB__OP_SILU: case NB__OP_POW_SCALAR: case NB__OP_CLAMP:
        return input == 0;
    case NB__OP_DIV: return input == 1;
    case NB__OP_POW: case NB__OP_MAXIMUM: case NB__OP_MINIMUM: return true;
    default: return false;
    }
}

// ---- value math ------------------------------------------------------------------------------
// Forward, f32 (also the f16/bf16 compute type). x0: the unary input or a; x1: b.
NB_HD float nbc_ew_f32(nb__op op, const nb__ew_ctx *c, float x, float b) {
    switch (op) {
    case NB__OP_NEG: return -x;
    case NB__OP_ABS: return fabsf(x);
    case NB__OP_EXP: return nbc_expf(x);
    case NB__OP_LOG: return logf(x);
    case NB__OP_LOG1P: return log1pf(x);
    case NB__OP_SQRT: return sqrtf(x);
    case NB__OP_RSQRT: return 1.0f / sqrtf(x);
    case NB__OP_SIN: return (float)nbc_sin(x);
    case NB__OP_COS: return (float)nbc_cos(x);
    case NB__OP_TANH: return nbc_tanhf(x);
    case NB__OP_SIGMOID: return 1.0f / (1.0f + nbc_expf(-x));
    case NB__OP_RELU: return x < 0 ? 0.0f : x;
    case NB__OP_GELU: return nbc_geluf(x);
    case NB__OP_GELU_TANH: return nbc_gelu_tanhf(x);
    case NB__OP_SILU: return x / (1.0f + nbc_expf(-x));
    case NB__OP_POW_SCALAR: {
        const float e = (float)c->p0;
        return e == 2.0f ? x * x : e == 0.5f ? sqrtf(x) : e == 1.0f ? x : powf(x, e);
    }
    case NB__OP_CLAMP: {
        const float lo = (float)c->p0, hi = (float)c->p1;
        float y = x < lo ? lo : x;
        return y > hi ? hi : y;
    }
    case NB__OP_ADD: return x + b;
    case NB__OP_SUB: return x - b;
    case NB__OP_MUL: return x * b;
    case NB__OP_DIV: return x / b;
    case NB__OP_POW: return powf(x, b);
    case NB__OP_MAXIMUM: return x != x || x > b ? x : b;
    case NB__OP_MINIMUM: return x != x || x < b ? x : b;
    default: return 0.0f;
    }
}

NB_HD double nbc_ew_f64(nb__op op, const nb__ew_ctx *c, double x, double b) {
    switch (op) {
    case NB__OP_NEG: return -x;
    case NB__OP_ABS: return fabs(x);
    case NB__OP_EXP: return exp(x);
    case NB__OP_LOG: return log(x);
    case NB__OP_LOG1P: return log1p(x);
    case NB__OP_SQRT: return sqrt(x);
    case NB__OP_RSQRT: return 1.0 / sqrt(x);
    case NB__OP_SIN: return nbc_sin(x);
    case NB__OP_COS: return nbc_cos(x);
    case NB__OP_TANH: return tanh(x);
    case NB__OP_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case NB__OP_RELU: return x < 0 ? 0.0 : x;
    case NB__OP_GELU: return 0.5 * x * erfc(x * -NBC_SQRT1_2);
    case NB__OP_GELU_TANH: return nbc_gelu_tanh(x);
    case NB__OP_SILU: return x / (1.0 + exp(-x));
    case NB__OP_POW_SCALAR: {
        const double e = c->p0;
        return e == 2.0 ? x * x : e == 0.5 ? sqrt(x) : e == 1.0 ? x : pow(x, e);
    }
    case NB__OP_CLAMP: {
        const double lo = c->p0, hi = c->p1;
        double y = x < lo ? lo : x;
        return y > hi ? hi : y;
    }
    case NB__OP_ADD: return x + b;
    case NB__OP_SUB: return x - b;
    case NB__OP_MUL: return x * b;
    case NB__OP_DIV: return x / b;
    case NB__OP_POW: return pow(x, b);
    case NB__OP_MAXIMUM: return x != x || x > b ? x : b;
    case NB__OP_MINIMUM: return x != x || x < b ? x : b;
    default: return 0.0;
    }
}

// Integer x ^ e by squaring, wrapping (U: the unsigned type the arithmetic runs in).
template <typename T, typename U> NB_HD T nbc_ipow(T x, uint64_t e) {
    U r = 1, b = (U)x;
    while (e) {
        if (e & 1u) r = (U)(r * b);
        b = (U)(b * b);
        e >>= 1;
    }
    return (T)r;
}
// A tensor pow's exponent: negative exponents give 1 ^ -n = 1, (-1) ^ -n = +-1, else 0.
template <typename T, typename U> NB_HD T nbc_ipow_t(T x, T e) {
    if constexpr ((T)-1 > (T)0) { // uint8: e >= 0
        return nbc_ipow<T, U>(x, (uint64_t)e);
    } else {
        if (e >= 0) return nbc_ipow<T, U>(x, (uint64_t)e);
        return x == 1 ? (T)1 : x == -1 ? (e % 2 != 0 ? (T)-1 : (T)1) : (T)0;
    }
}

template <typename T, typename U> NB_HD T nbc_ew_int(nb__op op, const nb__ew_ctx *c, T x, T b) {
    const bool is_unsigned = (T)-1 > (T)0;
    switch (op) {
    case NB__OP_NEG: return (T)((U)0 - (U)x);
    case NB__OP_ABS:
        return is_unsigned || !(x < (T)0) ? x : (T)((U)0 - (U)x);
    case NB__OP_RELU: return is_unsigned || !(x < (T)0) ? x : (T)0;
    case NB__OP_CLAMP: {
        const T lo = (T)c->i0, hi = (T)c->i1;
        T y = x < lo ? lo : x;
        return y > hi ? hi : y;
    }
    case NB__OP_POW_SCALAR: return nbc_ipow<T, U>(x, (uint64_t)c->i0);
    case NB__OP_ADD: return (T)((U)x + (U)b);
    case NB__OP_SUB: return (T)((U)x - (U)b);
    case NB__OP_MUL: return (T)((U)x * (U)b);
    case NB__OP_POW: return nbc_ipow_t<T, U>(x, b);
    case NB__OP_MAXIMUM: return x > b ? x : b;
    case NB__OP_MINIMUM: return x < b ? x : b;
    default: return (T)0;
    }
}

// bool (values 0 or 1): add and maximum are "or", mul and minimum "and", abs the identity.
NB_HD uint8_t nbc_ew_bool(nb__op op, uint8_t x, uint8_t b) {
    switch (op) {
    case NB__OP_ADD: case NB__OP_MAXIMUM: return x | b;
    case NB__OP_MUL: case NB__OP_MINIMUM: return x & b;
    default: return x; // abs
    }
}

template <typename C> NB_HD bool nbc_cmp(nb__op op, C a, C b) {
    switch (op) {
    case NB__OP_EQ: return a == b;
    case NB__OP_NE: return a != b;
    case NB__OP_LT: return a < b;
    case NB__OP_LE: return a <= b;
    case NB__OP_GT: return a > b;
    default: return a >= b; // GE
    }
}

// Backward, f32: unary ops (g, x) with x the saved tensor; binary ops (g, a, b) for input.
NB_HD float nbc_bw_f32(nb__op op, int input, const nb__ew_ctx *c, float g, float x, float b) {
    switch (op) {
    case NB__OP_ABS: return x > 0 ? g : x < 0 ? -g : x * g;
    case NB__OP_EXP: return g * x;
    case NB__OP_LOG: return g / x;
    case NB__OP_LOG1P: return g / (1.0f + x);
    case NB__OP_SQRT: return g / (2.0f * x);
    case NB__OP_RSQRT: return -0.5f * g * (x * x * x);
    case NB__OP_SIN: return g * (float)nbc_cos(x);
    case NB__OP_COS: return -g * (float)nbc_sin(x);
    case NB__OP_TANH: return g * (1.0f - nbc_mulf(x, x));
    case NB__OP_SIGMOID: return g * x * (1.0f - x);
    case NB__OP_RELU: return x <= 0 ? 0.0f : g;
    case NB__OP_GELU: return g * nbc_dgeluf(x);
    case NB__OP_GELU_TANH: return g * nbc_dgelu_tanhf(x);
    case NB__OP_SILU: return g * nbc_dsiluf(x);
    case NB__OP_POW_SCALAR: {
        const float e = (float)c->p0;
        return e == 0.0f   ? 0.0f
               : e == 1.0f ? g
               : e == 2.0f ? g * 2.0f * x
                           : g * e * powf(x, e - 1.0f);
    }
    case NB__OP_CLAMP: {
        const float lo = (float)c->p0, hi = (float)c->p1;
        return x >= lo && x <= hi ? g : 0.0f;
    }
    // binary: x is a
    case NB__OP_DIV: return -g * (x / b) / b;
    case NB__OP_POW:
        if (input == 0) return b == 0 ? 0.0f : g * b * powf(x, b - 1);
        return x == 0 && b >= 0 ? 0.0f : g * powf(x, b) * logf(x);
    case NB__OP_MAXIMUM:
        if (input == 0) return x == b ? g * 0.5f : x < b ? 0.0f : g;
        return x == b ? g * 0.5f : x > b ? 0.0f : g;
    case NB__OP_MINIMUM:
        if (input == 0) return x == b ? g * 0.5f : x > b ? 0.0f : g;
        return x == b ? g * 0.5f : x < b ? 0.0f : g;
    default: return 0.0f;
    }
}

NB_HD double nbc_bw_f64(nb__op op, int input, const nb__ew_ctx *c, double g, double x,
                        double b) {
    switch (op) {
    case NB__OP_ABS: return x > 0 ? g : x < 0 ? -g : x * g;
    case NB__OP_EXP: return g * x;
    case NB__OP_LOG: return g / x;
    case NB__OP_LOG1P: return g / (1.0 + x);
    case NB__OP_SQRT: return g / (2.0 * x);
    case NB__OP_RSQRT: return -0.5 * g * (x * x * x);
    case NB__OP_SIN: return g * nbc_cos(x);
    case NB__OP_COS: return -g * nbc_sin(x);
    case NB__OP_TANH: return g * (1.0 - nbc_muld(x, x));
    case NB__OP_SIGMOID: return g * x * (1.0 - x);
    case NB__OP_RELU: return x <= 0 ? 0.0 : g;
    case NB__OP_GELU: return g * nbc_dgelu(x);
    case NB__OP_GELU_TANH: return g * nbc_dgelu_tanh(x);
    case NB__OP_SILU: return g * nbc_dsilu(x);
    case NB__OP_POW_SCALAR: {
        const double e = c->p0;
        return e == 0.0 ? 0.0 : e == 1.0 ? g : e == 2.0 ? g * 2.0 * x : g * e * pow(x, e - 1.0);
    }
    case NB__OP_CLAMP: return x >= c->p0 && x <= c->p1 ? g : 0.0;
    case NB__OP_DIV: return -g * (x / b) / b;
    case NB__OP_POW:
        if (input == 0) return b == 0 ? 0.0 : g * b * pow(x, b - 1);
        return x == 0 && b >= 0 ? 0.0 : g * pow(x, b) * log(x);
    case NB__OP_MAXIMUM:
        if (input == 0) return x == b ? g * 0.5 : x < b ? 0.0 : g;
        return x == b ? g * 0.5 : x > b ? 0.0 : g;
    case NB__OP_MINIMUM:
        if (input == 0) return x == b ? g * 0.5 : x > b ? 0.0 : g;
        return x == b ? g * 0.5 : x < b ? 0.0 : g;
    default: return 0.0;
    }
}

// ---- storage types ---------------------------------------------------------------------------
// S: how an operand is stored; C: the type its math runs in; ld/st convert.
struct nbc_bf16 { uint16_t bits; };
struct nbc_f16 { uint16_t bits; };
struct nbc_bool { uint8_t v; };

enum { NBC_C_F32, NBC_C_F64, NBC_C_INT, NBC_C_BOOL }; // nbc_t<S>::kind

template <typename S> struct nbc_t;
template <> struct nbc_t<float> {
    static constexpr int kind = NBC_C_F32;
    using C = float;
    __host__ __device__ static C ld(const char *p) { return *(const float *)p; }
    __host__ __device__ static void st(char *p, C v) { *(float *)p = v; }
};
template <> struct nbc_t<double> {
    static constexpr int kind = NBC_C_F64;
    using C = double;
    __host__ __device__ static C ld(const char *p) { return *(const double *)p; }
    __host__ __device__ static void st(char *p, C v) { *(double *)p = v; }
};
template <> struct nbc_t<nbc_bf16> {
    static constexpr int kind = NBC_C_F32;
    using C = float;
    __host__ __device__ static C ld(const char *p) { return nb__kh_f32_from_bf16(*(const uint16_t *)p); }
    __host__ __device__ static void st(char *p, C v) { *(uint16_t *)p = nb__kh_bf16_from_f32(v); }
};
template <> struct nbc_t<nbc_f16> {
    static constexpr int kind = NBC_C_F32;
    using C = float;
    __host__ __device__ static C ld(const char *p) { return nb__kh_f32_from_f16(*(const uint16_t *)p); }
    __host__ __device__ static void st(char *p, C v) { *(uint16_t *)p = nb__kh_f16_from_f32(v); }
};
template <typename T, int K> struct nbc_tint {
    static constexpr int kind = K;
    using C = T;
    __host__ __device__ static C ld(const char *p) { return *(const T *)p; }
    __host__ __device__ static void st(char *p, C v) { *(T *)p = v; }
};
template <> struct nbc_t<int32_t> : nbc_tint<int32_t, NBC_C_INT> { using U = uint32_t; };
template <> struct nbc_t<int64_t> : nbc_tint<int64_t, NBC_C_INT> { using U = uint64_t; };
template <> struct nbc_t<uint8_t> : nbc_tint<uint8_t, NBC_C_INT> { using U = uint32_t; };
template <> struct nbc_t<nbc_bool> : nbc_tint<uint8_t, NBC_C_BOOL> {};

template <typename S> constexpr bool nbc_is_half = sizeof(S) == 2 && nbc_t<S>::kind == NBC_C_F32;

// Forward value: x the unary input or a, b the second input (ignored by unary ops).
template <typename S>
NB_HD typename nbc_t<S>::C nbc_ew_val(const nb__ew_args *a, typename nbc_t<S>::C x,
                                      typename nbc_t<S>::C b) {
    if constexpr (nbc_t<S>::kind == NBC_C_F32) {
        return nbc_ew_f32(a->op, &a->ctx, x, b);
    } else if constexpr (nbc_t<S>::kind == NBC_C_F64) {
        return nbc_ew_f64(a->op, &a->ctx, x, b);
    } else if constexpr (nbc_t<S>::kind == NBC_C_BOOL) {
        return nbc_ew_bool(a->op, x, b);
    } else {
        return nbc_ew_int<typename nbc_t<S>::C, typename nbc_t<S>::U>(a->op, &a->ctx, x, b);
    }
}

// Operand k (1-based) of a binary kernel: f16/bf16 with b_scalar read b as (float)p0.
template <typename S>
NB_HD typename nbc_t<S>::C nbc_ld_b(const nb__ew_args *a, const char *p) {
    if constexpr (nbc_is_half<S>) {
        if (a->ctx.b_scalar) return (float)a->ctx.p0;
    }
    return nbc_t<S>::ld(p);
}

// One element of ew at the operands' byte offsets (in the kernel's compute dtype S).
template <typename S>
NB_HD void nbc_ew_at(const nb__ew_args *a, int64_t o0, int64_t o1, int64_t o2, int64_t o3) {
    using T = nbc_t<S>;
    const nb__iter *it = &a->it;
    switch (nbc_op_kind(a->op)) {
    case NBC_UNARY: {
        auto x = T::ld(it->data[1] + o1);
        T::st(it->data[0] + o0, nbc_ew_val<S>(a, x, x));
        break;
    }
    case NBC_BINARY: {
        auto x = T::ld(it->data[1] + o1);
        auto b = nbc_ld_b<S>(a, it->data[2] + o2);
        T::st(it->data[0] + o0, nbc_ew_val<S>(a, x, b));
        break;
    }
    case NBC_CMP: {
        auto x = T::ld(it->data[1] + o1);
        auto b = nbc_ld_b<S>(a, it->data[2] + o2);
        *(uint8_t *)(it->data[0] + o0) = nbc_cmp(a->op, x, b);
        break;
    }
    case NBC_WHERE: {
        const char *src = *(const uint8_t *)(it->data[1] + o1) ? it->data[2] + o2 : it->data[3] + o3;
        char *dst = it->data[0] + o0;
        if (sizeof(S) == 8) *(uint64_t *)dst = *(const uint64_t *)src;
        else if (sizeof(S) == 4) *(uint32_t *)dst = *(const uint32_t *)src;
        else if (sizeof(S) == 2) *(uint16_t *)dst = *(const uint16_t *)src;
        else *(uint8_t *)dst = *(const uint8_t *)src;
        break;
    }
    default: break;
    }
}

// Backward value: unary ops (g, x); binary ops (g, a, b).
template <typename S>
NB_HD typename nbc_t<S>::C nbc_bw_val(const nb__ew_args *a, typename nbc_t<S>::C g,
                                      typename nbc_t<S>::C x, typename nbc_t<S>::C b) {
    if constexpr (nbc_t<S>::kind == NBC_C_F64) return nbc_bw_f64(a->op, a->input, &a->ctx, g, x, b);
    else return nbc_bw_f32(a->op, a->input, &a->ctx, g, x, b);
}

// One element of ew_backward (float S only). Unary: (gin, g, x); binary: (gin, g, a, b).
// f16/bf16 with b_scalar read the last operand as (float)p0, as the CPU's half kernels do.
template <typename S>
NB_HD void nbc_bw_at(const nb__ew_args *a, int64_t o0, int64_t o1, int64_t o2, int64_t o3) {
    using T = nbc_t<S>;
    const nb__iter *it = &a->it;
    auto g = T::ld(it->data[1] + o1);
    if (nbc_op_kind(a->op) == NBC_UNARY) {
        auto x = nbc_ld_b<S>(a, it->data[2] + o2);
        T::st(it->data[0] + o0, nbc_bw_val<S>(a, g, x, x));
    } else {
        auto x = T::ld(it->data[2] + o2);
        auto b = nbc_ld_b<S>(a, it->data[3] + o3);
        T::st(it->data[0] + o0, nbc_bw_val<S>(a, g, x, b));
    }
}

// ---- the 16-byte vector fast path --------------------------------------------------------------
// Chunk j (elements j*V .. j*V+V-1, V = 16 / sizeof(S)) of an ew (BW false) or ew_backward
// (BW true) kernel whose operands are all contiguous S (f32 or bf16), 16-byte aligned, with
// NIN inputs: one 16-byte load per input, the value math per lane, one 16-byte store.
template <typename S> struct nbc_vec;
template <> struct nbc_vec<float> {
    static constexpr int V = 4;
    __host__ __device__ static float get(const uint4 &w, int k) {
        uint32_t u = k == 0 ? w.x : k == 1 ? w.y : k == 2 ? w.z : w.w;
        return nb__kh_bits_f32(u);
    }
    __host__ __device__ static void put(uint4 &w, int k, float v) {
        uint32_t u = nb__kh_f32_bits(v);
        if (k == 0) w.x = u; else if (k == 1) w.y = u; else if (k == 2) w.z = u; else w.w = u;
    }
};
template <> struct nbc_vec<nbc_bf16> {
    static constexpr int V = 8;
    __host__ __device__ static float get(const uint4 &w, int k) {
        uint32_t u = (k >> 1) == 0 ? w.x : (k >> 1) == 1 ? w.y : (k >> 1) == 2 ? w.z : w.w;
        return nb__kh_f32_from_bf16((uint16_t)(k & 1 ? u >> 16 : u & 0xffffu));
    }
    __host__ __device__ static void put(uint4 &w, int k, float v) {
        uint32_t h = nb__kh_bf16_from_f32(v);
        uint32_t *q = (k >> 1) == 0 ? &w.x : (k >> 1) == 1 ? &w.y : (k >> 1) == 2 ? &w.z : &w.w;
        *q = k & 1 ? (*q & 0xffffu) | (h << 16) : (*q & 0xffff0000u) | h;
    }
};

template <typename S, int NIN, bool BW>
NB_HD void nbc_vec_chunk(const nb__ew_args *a, int64_t j) {
    using VT = nbc_vec<S>;
    const nb__iter *it = &a->it;
    uint4 in0 = ((const uint4 *)it->data[1])[j];
    uint4 in1 = NIN > 1 ? ((const uint4 *)it->data[2])[j] : in0;
    uint4 in2 = NIN > 2 ? ((const uint4 *)it->data[3])[j] : in1;
    uint4 out = in0;
    NBC_UNROLL
    for (int k = 0; k < VT::V; k++) {
        float x0 = VT::get(in0, k), x1 = VT::get(in1, k), x2 = VT::get(in2, k);
        float y = BW ? nbc_bw_val<S>(a, x0, x1, x2) : nbc_ew_val<S>(a, x0, x1);
        VT::put(out, k, y);
    }
    ((uint4 *)it->data[0])[j] = out;
}

// ---- copy between f32, bf16 and f16, vectorized ---------------------------------------------
// Chunk j (elements 8j .. 8j+7) of a copy whose two operands are contiguous, 16-byte aligned
// and of two different dtypes among f32 (ES 4), bf16 and f16 (ES 2): one or two 16-byte loads,
// the conversion of nbc_copy_at per element, one or two 16-byte stores.
NB_HD uint32_t nbc_u4_word(const uint4 &w, int i) {
    return i == 0 ? w.x : i == 1 ? w.y : i == 2 ? w.z : w.w;
}
NB_HD void nbc_u4_set(uint4 &w, int i, uint32_t v) {
    if (i == 0) w.x = v; else if (i == 1) w.y = v; else if (i == 2) w.z = v; else w.w = v;
}

template <int ESI, int ESO> NB_HD void nbc_copy_chunk8(const nb__iter *it, int64_t j) {
    const nb_dtype id = it->dtype[1], od = it->dtype[0];
    const uint4 *src = (const uint4 *)it->data[1] + j * (ESI / 2);
    uint4 *dst = (uint4 *)it->data[0] + j * (ESO / 2);
    uint4 in0 = src[0], in1 = ESI == 4 ? src[1] : in0;
    uint4 out0 = in0, out1 = in0;
    NBC_UNROLL
    for (int k = 0; k < 8; k++) {
        float v;
        if (ESI == 4) {
            v = nb__kh_bits_f32(nbc_u4_word(k < 4 ? in0 : in1, k & 3));
        } else {
            uint32_t w = nbc_u4_word(in0, k >> 1);
            uint16_t h = (uint16_t)(k & 1 ? w >> 16 : w & 0xffffu);
            v = id == NB_BF16 ? nb__kh_f32_from_bf16(h) : nb__kh_f32_from_f16(h);
        }
        if (ESO == 4) {
            nbc_u4_set(k < 4 ? out0 : out1, k & 3, nb__kh_f32_bits(v));
        } else {
            uint32_t h = od == NB_BF16 ? nb__kh_bf16_from_f32(v) : nb__kh_f16_from_f32(v);
            uint32_t w = nbc_u4_word(out0, k >> 1);
            w = k & 1 ? (w & 0xffffu) | (h << 16) : (w & 0xffff0000u) | h;
            nbc_u4_set(out0, k >> 1, w);
        }
    }
    dst[0] = out0;
    if (ESO == 4) dst[1] = out1;
}

// ---- the kernels' thread bodies and their choice of path ----------------------------------
// Each kernel of cuda/k_core.cu is one call of a body below with (thread index, thread
// count) of its grid-stride loop, so the host check runs the whole kernel: a loop over the
// threads of a (small) grid, the path picked by the same nbc_*_path function as the launcher.
enum nbc_path {
    NBC_PATH_VEC1, NBC_PATH_VEC2, NBC_PATH_VEC3, // 16-byte vectors, 1..3 inputs
    NBC_PATH_1D,                                 // ndim 1: offset i * stride
    NBC_PATH_ND32, NBC_PATH_ND64,                // index decode in 32 / 64 bits
    NBC_PATH_MEMCPY, NBC_PATH_MEMSET             // copy of one dtype / fill of zero, flat
};

NB_HD bool nbc_aligned16(const nb__iter *it) {
    for (int k = 0; k < it->nargs; k++)
        if ((uintptr_t)it->data[k] % 16 != 0) return false;
    return true;
}
// every operand flat with stride es (one contiguous run)
NB_HD bool nbc_contiguous_all(const nb__iter *it, int64_t es) {
    if (it->ndim != 1) return false;
    for (int k = 0; k < it->nargs; k++)
        if (it->strides[k][0] != es) return false;
    return true;
}
NB_HD nbc_path nbc_strided_path(const nb__iter *it) {
    return it->ndim == 1 ? NBC_PATH_1D
           : it->numel < ((int64_t)1 << 31) ? NBC_PATH_ND32 : NBC_PATH_ND64;
}

template <typename S> constexpr bool nbc_has_vec =
    std::is_same<S, float>::value || std::is_same<S, nbc_bf16>::value;

template <typename S, bool BW> NB_HD nbc_path nbc_ew_path(const nb__ew_args *a) {
    const nb__iter *it = &a->it;
    if constexpr (nbc_has_vec<S>) {
        nbc_kind kind = nbc_op_kind(a->op);
        bool scalar_b = nbc_is_half<S> && a->ctx.b_scalar; // b is not in memory
        if (!scalar_b && (BW || kind == NBC_UNARY || kind == NBC_BINARY) &&
            nbc_contiguous_all(it, (int64_t)sizeof(S)) && nbc_aligned16(it))
            return (nbc_path)(NBC_PATH_VEC1 + (it->nargs - 2));
    }
    return nbc_strided_path(it);
}

template <typename S, bool BW>
NB_HD void nbc_ew_elem(const nb__ew_args *a, int64_t o0, int64_t o1, int64_t o2, int64_t o3) {
    if constexpr (BW) nbc_bw_at<S>(a, o0, o1, o2, o3);
    else nbc_ew_at<S>(a, o0, o1, o2, o3);
}

template <typename S, bool BW, typename I>
NB_HD void nbc_ew_nd_thread(const nb__ew_args *a, int64_t t, int64_t nt) {
    for (int64_t i = t; i < a->it.numel; i += nt) {
        int64_t o0, o1, o2, o3;
        nbc_offsets4<I>(&a->it, (I)i, &o0, &o1, &o2, &o3);
        nbc_ew_elem<S, BW>(a, o0, o1, o2, o3);
    }
}

template <typename S, bool BW> NB_HD void nbc_ew_1d_thread(const nb__ew_args *a, int64_t t, int64_t nt) {
    const nb__iter *it = &a->it;
    const int64_t s0 = it->strides[0][0], s1 = it->strides[1][0];
    const int64_t s2 = it->nargs > 2 ? it->strides[2][0] : 0;
    const int64_t s3 = it->nargs > 3 ? it->strides[3][0] : 0;
    for (int64_t i = t; i < it->numel; i += nt) nbc_ew_elem<S, BW>(a, i * s0, i * s1, i * s2, i * s3);
}

// The chunks, then the last numel % V elements one per thread (grids have >= 32 threads).
template <typename S, int NIN, bool BW>
NB_HD void nbc_ew_vec_thread(const nb__ew_args *a, int64_t t, int64_t nt) {
    constexpr int V = nbc_vec<S>::V;
    const int64_t nch = a->it.numel / V;
    for (int64_t j = t; j < nch; j += nt) nbc_vec_chunk<S, NIN, BW>(a, j);
    const int64_t i = nch * V + t;
    if (i < a->it.numel) {
        const int64_t o = i * (int64_t)sizeof(S);
        nbc_ew_elem<S, BW>(a, o, o, o, o);
    }
}

// copy: MEMCPY, VEC1 (f32 -> bf16/f16, 8 a chunk), VEC2 (bf16/f16 -> f32), or strided.
NB_HD bool nbc_is_halfish(nb_dtype dt) { return dt == NB_F32 || dt == NB_BF16 || dt == NB_F16; }
NB_HD nbc_path nbc_copy_path(const nb__iter *it) {
    nb_dtype od = it->dtype[0], id = it->dtype[1];
    if (od == id && nbc_contiguous_all(it, nb__kh_dtype_size(od))) return NBC_PATH_MEMCPY;
    if (od != id && nbc_is_halfish(od) && nbc_is_halfish(id) && (od == NB_F32 || id == NB_F32) &&
        it->ndim == 1 && it->strides[0][0] == nb__kh_dtype_size(od) &&
        it->strides[1][0] == nb__kh_dtype_size(id) && nbc_aligned16(it))
        return id == NB_F32 ? NBC_PATH_VEC1 : NBC_PATH_VEC2;
    return nbc_strided_path(it);
}

template <typename I> NB_HD void nbc_copy_nd_thread(const nb__iter *it, int64_t t, int64_t nt) {
    for (int64_t i = t; i < it->numel; i += nt) {
        int64_t o0, o1, o2, o3;
        nbc_offsets4<I>(it, (I)i, &o0, &o1, &o2, &o3);
        nbc_copy_at(it, o0, o1);
    }
}
NB_HD void nbc_copy_1d_thread(const nb__iter *it, int64_t t, int64_t nt) {
    const int64_t s0 = it->strides[0][0], s1 = it->strides[1][0];
    for (int64_t i = t; i < it->numel; i += nt) nbc_copy_at(it, i * s0, i * s1);
}
template <int ESI, int ESO> NB_HD void nbc_copy_vec_thread(const nb__iter *it, int64_t t, int64_t nt) {
    const int64_t nch = it->numel / 8;
    for (int64_t j = t; j < nch; j += nt) nbc_copy_chunk8<ESI, ESO>(it, j);
    const int64_t i = nch * 8 + t;
    if (i < it->numel) nbc_copy_at(it, i * ESO, i * ESI);
}

// fill: MEMSET when the bytes are zero over a flat operand, else strided stores of W.
NB_HD nbc_path nbc_fill_path(const nb__iter *it, uint64_t bits) {
    if (bits == 0 && nbc_contiguous_all(it, nb__kh_dtype_size(it->dtype[0]))) return NBC_PATH_MEMSET;
    return nbc_strided_path(it);
}
template <typename W, typename I>
NB_HD void nbc_fill_nd_thread(const nb__iter *it, W v, int64_t t, int64_t nt) {
    for (int64_t i = t; i < it->numel; i += nt) {
        int64_t o0, o1, o2, o3;
        nbc_offsets4<I>(it, (I)i, &o0, &o1, &o2, &o3);
        *(W *)(it->data[0] + o0) = v;
    }
}
template <typename W> NB_HD void nbc_fill_1d_thread(const nb__iter *it, W v, int64_t t, int64_t nt) {
    const int64_t s0 = it->strides[0][0];
    for (int64_t i = t; i < it->numel; i += nt) *(W *)(it->data[0] + i * s0) = v;
}

#endif
