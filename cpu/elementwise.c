/* cpu/elementwise.c - CPU kernels of the elementwise ops (unary math, broadcasting binary
 * arithmetic and comparisons, where) and the fused kernels of their backward rules.
 *
 * Every kernel is an nb__iter_fn: it gets one row of n elements per operand with byte
 * strides and does arithmetic only; tensor/ops/elementwise.c has already chosen the
 * compute dtype and converted the operands (docs/architecture.md rule 1). Each kernel has a
 * contiguous fast path (plain loops over restrict pointers that the compiler vectorizes),
 * a fast path for a broadcast scalar operand (stride 0), and a general strided path.
 *
 * The kernels are stamped out by macros per dtype from one expression per op, and found
 * through one table indexed by [op][dtype]. f16/bf16 kernels convert blocks of NB__BLK
 * elements to f32 on the stack, run the f32 kernel and round back (docs/architecture.md rule 7).
 *
 * Integer arithmetic wraps around (two's complement, like PyTorch) and is written on
 * unsigned types so that overflow is never undefined behaviour in C. There is no integer
 * division here: div is true division and always runs in a float dtype. */

/* We never read errno after math calls; without this GCC cannot vectorize sqrt and keeps
 * a slow path around every libm call. On AVX-512 machines 512-bit vectors make the
 * polynomial exp (and everything built on it) about 1.4x faster, which keeps exp and
 * sigmoid memory-bound; GCC otherwise prefers 256-bit vectors. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-math-errno")
#if defined(__AVX512F__)
#pragma GCC target("prefer-vector-width=512")
#endif
#endif

#include "cpu/backend.h"
#include "cpu/elementwise.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

typedef uint8_t nb__u8bool; /* NB_BOOL storage: one byte holding 0 or 1 */

/* The shared vectorizable exp and bit helpers live in elementwise.h (nb__fast_expf). */
static inline float f32_from_bits(uint32_t u) { return nb__f32_from_bits(u); }
static inline uint32_t f32_bits(float f) { return nb__f32_bits(f); }
static inline float expf_v(float x) { return nb__fast_expf(x); }

float nb__cpu_expf(float x) { return expf_v(x); }

/* ---- vectorizable f32 tanh and normal CDF -------------------------------------------------
 * Written branch-free (both candidates computed, then selected) so the unary loops stay
 * vectorized; the f64 kernels keep libm. Coefficients were fitted for nabla (least squares
 * on Chebyshev nodes against 40-digit references, then rounded to f32); the test suite
 * sweeps them against the double-precision libm results. */

/* exp(hi + lo) where lo (|lo| < ~4) would lose its low bits in the sum: the reduction takes
 * k ln2 off hi first (exact, as in expf_v), then adds lo. Clamps like expf_v. */
static inline float expf2_v(float hi, float lo) {
    float s = hi + lo;
    float sc = s > -104.0f ? s : -104.0f;
    sc = sc < 89.0f ? sc : 89.0f;
    bool clamped = !(s > -104.0f && s < 89.0f);
    hi = clamped ? sc : hi;
    lo = clamped ? 0.0f : lo;
    const float magic = 12582912.0f;
    float t = NB__MADD(sc, 1.44269504088896341f, magic);
    float kf = t - magic;
    int32_t k = (int32_t)(f32_bits(t) - f32_bits(magic));
    float r = NB__MADD(kf, -0.693359375f, hi);
    r = r + lo;
    r = NB__MADD(kf, 2.12194440e-4f, r);
    float p = 1.0f / 5040.0f;
    p = NB__MADD(p, r, 1.0f / 720.0f);
    p = NB__MADD(p, r, 1.0f / 120.0f);
    p = NB__MADD(p, r, 1.0f / 24.0f);
    p = NB__MADD(p, r, 1.0f / 6.0f);
    p = NB__MADD(p, r, 0.5f);
    p = NB__MADD(p, r, 1.0f);
    p = NB__MADD(p, r, 1.0f);
    int32_t k1 = k / 2, k2 = k - k1;
    float y = p * f32_from_bits((uint32_t)(k1 + 127) << 23) *
              f32_from_bits((uint32_t)(k2 + 127) << 23);
    return isnan(s) ? s : y;
}

/* tanh: below |x| = 0.625 the odd polynomial x + x^3 p(x^2) (fit error 2e-9 relative);
 * above, 1 - 2 / (exp(2|x|) + 1) with the sign put back, which has no cancellation there
 * (the result is >= 0.55). exp overflows to inf for |x| > 44, giving exactly +-1. Max error
 * measured over a sweep of [-16, 16]: 1.4 ulp. */
static inline float tanhf_v(float x) {
    float a = fabsf(x), s = x * x;
    float p = 2.29584126e-3f;
    p = NB__MADD(p, s, -8.34698049e-3f);
    p = NB__MADD(p, s, 2.17699609e-2f);
    p = NB__MADD(p, s, -5.39594059e-2f);
    p = NB__MADD(p, s, 1.33333043e-1f);
    p = NB__MADD(p, s, -3.33333332e-1f);
    float small = NB__MADD(x * s, p, x);
    float big = 1.0f - 2.0f / (expf_v(2.0f * a) + 1.0f);
    /* the sign of x on both (the polynomial alone would turn -0 into +0) */
    return copysignf(a < 0.625f ? small : big, x);
}

/* Phi(-a) = erfc(a / sqrt 2) / 2 for a >= 0, the lower tail of the standard normal CDF,
 * with relative (not just absolute) accuracy far into the tail. With z = a / sqrt 2 and
 * t = 1 / (1 + z / 2), erfc(z) = t exp(-z^2) Q(t) where Q is smooth on t in (0, 1] and
 * between 0.28 and 1 (degree-11 fit in t - 0.587 for z <= 9.5, max relative error 1e-8).
 * exp(-a^2 / 2) is computed from the exact pair a * a = a2 + e (FMA), so the large exponent
 * adds no rounding error of its own; the caller gets it too (*gauss) for the derivative.
 * a >= 15 gives 0 (the true value is below 4e-51); NaN gives 0 (callers propagate NaN
 * through x). */
static inline float ncdf_tail_v(float a, float *gauss) {
    a = a < 15.0f ? a : 15.0f;
    /* t = c / (c + a) as t0 + tlo: an error in t moves q about twice as much (through the
     * factor t and through Q), so the rounding of c + a (2Sum) and of the division
     * (FMA residual) are carried in tlo. */
    const float c = 2.82842712f;
    float d = c + a, ap = d - c, cp = d - ap;
    float de = (c - cp) + (a - ap); /* c + a = d + de exactly */
    float t0 = c / d;
    float tlo = (NB__MADD(-t0, d, c) - t0 * de) * (t0 * (1.0f / 2.82842712f)); /* / d */
    float u = (t0 - 0.586956501f) + tlo;
    float p = -3.100700863e-2f;
    p = NB__MADD(p, u, 3.107219189e-2f);
    p = NB__MADD(p, u, 3.334905207e-2f);
    p = NB__MADD(p, u, -7.126717269e-2f);
    p = NB__MADD(p, u, -2.408058150e-3f);
    p = NB__MADD(p, u, 1.138484254e-1f);
    p = NB__MADD(p, u, -4.668257758e-2f);
    p = NB__MADD(p, u, -2.050457895e-1f);
    p = NB__MADD(p, u, 7.945910096e-2f);
    p = NB__MADD(p, u, 5.885713100e-1f);
    p = NB__MADD(p, u, 7.871958613e-1f);
    p = NB__MADD(p, u, 5.748564005e-1f);
    float a2 = a * a;
    float g = expf2_v(-0.5f * a2, -0.5f * NB__MADD(a, a, -a2)); /* a * a = a2 + e exactly */
    *gauss = g;
    float h = 0.5f * p * g;
    return NB__MADD(h, t0, h * tlo);
}

/* gelu(x) = x Phi(x), Phi(x) = 1 - Phi(-x) for x >= 0. */
static inline float gelu_v(float x) {
    float g, q = ncdf_tail_v(fabsf(x), &g);
    return x * (x < 0 ? q : 1.0f - q);
}

/* gelu'(x) = Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi). */
static inline float dgelu_v(float x) {
    float g, q = ncdf_tail_v(fabsf(x), &g);
    return (x < 0 ? q : 1.0f - q) + x * (0.398942280f * g);
}

float nb__cpu_tanhf(float x) { return tanhf_v(x); }
float nb__cpu_geluf(float x) { return gelu_v(x); }
float nb__cpu_gelu_gradf(float x) { return dgelu_v(x); }

/* ---- software prefetch ----------------------------------------------------------------------
 * A unary kernel with a long body (exp is ~40 instructions per vector) keeps few cache lines
 * in flight, and the hardware prefetcher alone left exp at ~60% of memcpy bandwidth on the
 * reference VM. Contiguous unary loops therefore run in blocks of NB__PF_ELEMS elements and
 * prefetch the input NB__PF_DIST bytes ahead of each block (measured: ~1.3x for exp with 2
 * threads). Prefetches past the end are harmless hints; the address is formed as an integer
 * so no out-of-bounds pointer is ever created. */
#define NB__PF_ELEMS 256
#define NB__PF_DIST 2048

static inline void prefetch_ahead(const void *p, size_t block_bytes) {
    uintptr_t a = (uintptr_t)p + NB__PF_DIST;
    for (size_t off = 0; off < block_bytes; off += 64) __builtin_prefetch((const void *)(a + off));
}

/* ---- kernel stamps ------------------------------------------------------------------------
 * PRE: statements run once per call (reading parameters from ctx); EXPR: the result from x
 * (unary) or a, b (binary). */
#define NB__UNARY(NAME, TI, TO, PRE, EXPR)                                                  \
    static void NAME(char **p, const int64_t *s, int64_t n, void *ctx_) {                  \
        const nb__ew_ctx *ctx = ctx_;                                                      \
        (void)ctx;                                                                         \
        PRE                                                                                \
        if (s[0] == (int64_t)sizeof(TO) && s[1] == (int64_t)sizeof(TI)) {                  \
            TO *restrict o_ = (TO *)p[0];                                                  \
            const TI *restrict x_ = (const TI *)p[1];                                      \
            for (int64_t i0 = 0; i0 < n; i0 += NB__PF_ELEMS) {                             \
                int64_t e_ = n - i0 < NB__PF_ELEMS ? n : i0 + NB__PF_ELEMS;                \
                prefetch_ahead(x_ + i0, NB__PF_ELEMS * sizeof(TI));                        \
                for (int64_t i = i0; i < e_; i++) {                                        \
                    const TI x = x_[i];                                                    \
                    o_[i] = (TO)(EXPR);                                                    \
                }                                                                          \
            }                                                                              \
        } else {                                                                           \
            for (int64_t i = 0; i < n; i++) {                                              \
                const TI x = *(const TI *)(p[1] + i * s[1]);                               \
                *(TO *)(p[0] + i * s[0]) = (TO)(EXPR);                                     \
            }                                                                              \
        }                                                                                  \
    }

/* A, B: the names EXPR uses for the two inputs (a, b for the forward ops; g, x for the
 * backward kernels, which read the output gradient and a saved tensor). */
#define NB__BINARY_V(NAME, TI, TO, A, B, PRE, EXPR)                                         \
    static void NAME(char **p, const int64_t *s, int64_t n, void *ctx_) {                  \
        const nb__ew_ctx *ctx = ctx_;                                                      \
        (void)ctx;                                                                         \
        PRE                                                                                \
        const int64_t so = (int64_t)sizeof(TO), si = (int64_t)sizeof(TI);                  \
        if (s[0] == so && s[1] == si && s[2] == si) {                                      \
            TO *restrict o_ = (TO *)p[0];                                                  \
            const TI *restrict a_ = (const TI *)p[1], *restrict b_ = (const TI *)p[2];     \
            for (int64_t i = 0; i < n; i++) {                                              \
                const TI A = a_[i], B = b_[i];                                             \
                o_[i] = (TO)(EXPR);                                                        \
            }                                                                              \
        } else if (s[0] == so && s[1] == si && s[2] == 0) {                                \
            TO *restrict o_ = (TO *)p[0];                                                  \
            const TI *restrict a_ = (const TI *)p[1];                                      \
            const TI B = *(const TI *)p[2];                                                \
            for (int64_t i = 0; i < n; i++) {                                              \
                const TI A = a_[i];                                                        \
                o_[i] = (TO)(EXPR);                                                        \
            }                                                                              \
        } else if (s[0] == so && s[1] == 0 && s[2] == si) {                                \
            TO *restrict o_ = (TO *)p[0];                                                  \
            const TI *restrict b_ = (const TI *)p[2];                                      \
            const TI A = *(const TI *)p[1];                                                \
            for (int64_t i = 0; i < n; i++) {                                              \
                const TI B = b_[i];                                                        \
                o_[i] = (TO)(EXPR);                                                        \
            }                                                                              \
        } else {                                                                           \
            for (int64_t i = 0; i < n; i++) {                                              \
                const TI A = *(const TI *)(p[1] + i * s[1]);                               \
                const TI B = *(const TI *)(p[2] + i * s[2]);                               \
                *(TO *)(p[0] + i * s[0]) = (TO)(EXPR);                                     \
            }                                                                              \
        }                                                                                  \
    }
#define NB__BINARY(NAME, TI, TO, EXPR) NB__BINARY_V(NAME, TI, TO, a, b, , EXPR)

/* Three inputs g, a, b of one float type (the backward kernels of binary ops). */
#define NB__TERNARY(NAME, T, PRE, EXPR)                                                     \
    static void NAME(char **p, const int64_t *s, int64_t n, void *ctx_) {                  \
        const nb__ew_ctx *ctx = ctx_;                                                      \
        (void)ctx;                                                                         \
        PRE                                                                                \
        const int64_t es = (int64_t)sizeof(T);                                             \
        if (s[0] == es && s[1] == es && s[2] == es && (s[3] == es || s[3] == 0)) {         \
            T *restrict o_ = (T *)p[0];                                                    \
            const T *restrict g_ = (const T *)p[1], *restrict a_ = (const T *)p[2];        \
            const T *restrict b_ = (const T *)p[3];                                        \
            if (s[3] == 0) {                                                               \
                const T b = *b_;                                                           \
                for (int64_t i = 0; i < n; i++) {                                          \
                    const T g = g_[i], a = a_[i];                                          \
                    o_[i] = (T)(EXPR);                                                     \
                }                                                                          \
            } else {                                                                       \
                for (int64_t i = 0; i < n; i++) {                                          \
                    const T g = g_[i], a = a_[i], b = b_[i];                               \
                    o_[i] = (T)(EXPR);                                                     \
                }                                                                          \
            }                                                                              \
        } else {                                                                           \
            for (int64_t i = 0; i < n; i++) {                                              \
                const T g = *(const T *)(p[1] + i * s[1]);                                 \
                const T a = *(const T *)(p[2] + i * s[2]);                                 \
                const T b = *(const T *)(p[3] + i * s[3]);                                 \
                *(T *)(p[0] + i * s[0]) = (T)(EXPR);                                       \
            }                                                                              \
        }                                                                                  \
    }

/* ---- f16 / bf16: blocks through f32 ------------------------------------------------------ */
#define NB__BLK 256

static void half_load(float *dst, const char *src, int64_t stride, int64_t m, bool bf) {
    if (stride == 2) {
        if (bf) nb__bf16_to_f32_n((const uint16_t *)src, dst, m);
        else nb__f16_to_f32_n((const uint16_t *)src, dst, m);
        return;
    }
    for (int64_t i = 0; i < m; i++) {
        uint16_t h;
        memcpy(&h, src + i * stride, 2);
        dst[i] = bf ? nb_bf16_to_f32(h) : nb_f16_to_f32(h);
    }
}

static void half_store(char *dst, int64_t stride, const float *src, int64_t m, bool bf) {
    if (stride == 2) {
        if (bf) nb__f32_to_bf16_n(src, (uint16_t *)dst, m);
        else nb__f32_to_f16_n(src, (uint16_t *)dst, m);
        return;
    }
    for (int64_t i = 0; i < m; i++) {
        uint16_t h = bf ? nb_f32_to_bf16(src[i]) : nb_f32_to_f16(src[i]);
        memcpy(dst + i * stride, &h, 2);
    }
}

static void half_unary(nb__iter_fn f32, bool bf, char **p, const int64_t *s, int64_t n,
                       void *ctx) {
    float in[NB__BLK], out[NB__BLK];
    for (int64_t i0 = 0; i0 < n; i0 += NB__BLK) {
        int64_t m = n - i0 < NB__BLK ? n - i0 : NB__BLK;
        half_load(in, p[1] + i0 * s[1], s[1], m, bf);
        char *fp[2] = {(char *)out, (char *)in};
        const int64_t fs[2] = {4, 4};
        f32(fp, fs, m, ctx);
        half_store(p[0] + i0 * s[0], s[0], out, m, bf);
    }
}

/* out_half false: the f32 kernel writes NB_BOOL results straight into the output. A
 * stride-0 operand (broadcast, or the scalar of a *_scalar op) is converted once. */
static void half_binary(nb__iter_fn f32, bool bf, bool out_half, char **p, const int64_t *s,
                        int64_t n, void *ctx) {
    const nb__ew_ctx *c = ctx;
    float ab[NB__BLK], bb[NB__BLK], ob[NB__BLK], a1 = 0, b1 = 0;
    bool a_one = s[1] == 0, b_one = s[2] == 0 || (c && c->b_scalar);
    if (a_one) half_load(&a1, p[1], 2, 1, bf);
    if (c && c->b_scalar) b1 = (float)c->p0;
    else if (b_one) half_load(&b1, p[2], 2, 1, bf);
    for (int64_t i0 = 0; i0 < n; i0 += NB__BLK) {
        int64_t m = n - i0 < NB__BLK ? n - i0 : NB__BLK;
        if (!a_one) half_load(ab, p[1] + i0 * s[1], s[1], m, bf);
        if (!b_one) half_load(bb, p[2] + i0 * s[2], s[2], m, bf);
        char *fp[3] = {out_half ? (char *)ob : p[0] + i0 * s[0],
                       a_one ? (char *)&a1 : (char *)ab, b_one ? (char *)&b1 : (char *)bb};
        const int64_t fs[3] = {out_half ? 4 : s[0], a_one ? 0 : 4, b_one ? 0 : 4};
        f32(fp, fs, m, ctx);
        if (out_half) half_store(p[0] + i0 * s[0], s[0], ob, m, bf);
    }
}

/* Backward kernels of binary ops: operands (out, g, a, b), all half. b_scalar: b is the
 * f32 value (float)p0 (the scalar of a *_scalar op, as the forward used it). */
static void half_ternary(nb__iter_fn f32, bool bf, char **p, const int64_t *s, int64_t n,
                         void *ctx) {
    const nb__ew_ctx *c = ctx;
    float in[3][NB__BLK], one[3] = {0}, ob[NB__BLK];
    bool is_one[3];
    for (int k = 0; k < 3; k++) {
        is_one[k] = s[k + 1] == 0 || (k == 2 && c && c->b_scalar);
        if (k == 2 && c && c->b_scalar) one[k] = (float)c->p0;
        else if (is_one[k]) half_load(&one[k], p[k + 1], 2, 1, bf);
    }
    for (int64_t i0 = 0; i0 < n; i0 += NB__BLK) {
        int64_t m = n - i0 < NB__BLK ? n - i0 : NB__BLK;
        char *fp[4] = {(char *)ob};
        int64_t fs[4] = {4};
        for (int k = 0; k < 3; k++) {
            if (!is_one[k]) half_load(in[k], p[k + 1] + i0 * s[k + 1], s[k + 1], m, bf);
            fp[k + 1] = is_one[k] ? (char *)&one[k] : (char *)in[k];
            fs[k + 1] = is_one[k] ? 0 : 4;
        }
        f32(fp, fs, m, ctx);
        half_store(p[0] + i0 * s[0], s[0], ob, m, bf);
    }
}

#define NB__HALF_UNARY(name)                                                                \
    static void name##_f16(char **p, const int64_t *s, int64_t n, void *ctx) {             \
        half_unary(name##_f32, false, p, s, n, ctx);                                       \
    }                                                                                      \
    static void name##_bf16(char **p, const int64_t *s, int64_t n, void *ctx) {            \
        half_unary(name##_f32, true, p, s, n, ctx);                                        \
    }
#define NB__HALF_BINARY(name, out_half)                                                     \
    static void name##_f16(char **p, const int64_t *s, int64_t n, void *ctx) {             \
        half_binary(name##_f32, false, out_half, p, s, n, ctx);                            \
    }                                                                                      \
    static void name##_bf16(char **p, const int64_t *s, int64_t n, void *ctx) {            \
        half_binary(name##_f32, true, out_half, p, s, n, ctx);                             \
    }

/* ---- unary float ops ------------------------------------------------------------------------
 * X(name, f32 expression, f64 expression) of x. gelu uses Phi(x) = erfc(-x/sqrt2)/2 (f32:
 * ncdf_tail_v), which stays accurate in the far negative tail where 1 + erf(x/sqrt2)
 * cancels. gelu_tanh uses the identity 0.5 (1 + tanh(u)) = sigmoid(2u), which needs only
 * exp. */
#define NB__GELU_K 0.7978845608028654 /* sqrt(2 / pi) */
#define NB__UNARY_FLOAT_OPS(X)                                                              \
    X(neg, -x, -x)                                                                          \
    X(abs, fabsf(x), fabs(x))                                                               \
    X(exp, expf_v(x), exp(x))                                                               \
    X(log, logf(x), log(x))                                                                 \
    X(log1p, log1pf(x), log1p(x))                                                           \
    X(sqrt, sqrtf(x), sqrt(x))                                                              \
    X(rsqrt, 1.0f / sqrtf(x), 1.0 / sqrt(x))                                                \
    X(sin, sinf(x), sin(x))                                                                 \
    X(cos, cosf(x), cos(x))                                                                 \
    X(tanh, tanhf_v(x), tanh(x))                                                            \
    X(sigmoid, 1.0f / (1.0f + expf_v(-x)), 1.0 / (1.0 + exp(-x)))                           \
    X(relu, x < 0 ? 0.0f : x, x < 0 ? 0.0 : x)                                              \
    X(gelu, gelu_v(x), 0.5 * x * erfc(x * -M_SQRT1_2))                                      \
    X(gelu_tanh,                                                                            \
      x / (1.0f + expf_v(-2.0f * (float)NB__GELU_K * (x + 0.044715f * x * x * x))),         \
      0.5 * x * (1.0 + tanh(NB__GELU_K * (x + 0.044715 * x * x * x))))                      \
    X(silu, x / (1.0f + expf_v(-x)), x / (1.0 + exp(-x)))

#define NB__STAMP_UNARY_FLOAT(name, e32, e64)                                               \
    NB__UNARY(name##_f32, float, float, , e32)                                              \
    NB__UNARY(name##_f64, double, double, , e64)                                            \
    NB__HALF_UNARY(name)
NB__UNARY_FLOAT_OPS(NB__STAMP_UNARY_FLOAT)

/* ---- bf16 gelu by table ---------------------------------------------------------------------
 * A bf16 input has only 65536 values, so the exact GELU of a bf16 tensor (the f32 kernel's
 * result rounded to bf16, as half_unary gives it) and the f32 derivative its backward
 * multiplies by are tabulated once: 128 KiB of bf16 results and 256 KiB of f32 slopes,
 * filled by gelu_v and dgelu_v themselves. The kernels then read a table instead of ~60
 * instructions of polynomial per element, and give the same bits as the f32 path. */
static uint16_t g_gelu_bf16_tab[65536];
static float g_dgelu_bf16_tab[65536];
static pthread_once_t g_gelu_tab_once = PTHREAD_ONCE_INIT;

static inline uint16_t bf16_round(float f) {
    uint32_t x = f32_bits(f);
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? (x >> 16) | 0x40u : rounded);
}

static void gelu_tab_init(void) {
    float x[NB__BLK], y[NB__BLK], d[NB__BLK];
    for (uint32_t h0 = 0; h0 < 65536; h0 += NB__BLK) {
        for (int i = 0; i < NB__BLK; i++) x[i] = f32_from_bits((h0 + (uint32_t)i) << 16);
        for (int i = 0; i < NB__BLK; i++) y[i] = gelu_v(x[i]);
        for (int i = 0; i < NB__BLK; i++) d[i] = dgelu_v(x[i]);
        for (int i = 0; i < NB__BLK; i++) {
            g_gelu_bf16_tab[h0 + (uint32_t)i] = bf16_round(y[i]);
            g_dgelu_bf16_tab[h0 + (uint32_t)i] = d[i];
        }
    }
}

/* Contiguous runs by table; others through f32 blocks (gelu_bf16, the same bits). */
static void gelu_tab_bf16(char **p, const int64_t *s, int64_t n, void *ctx) {
    if (s[0] != 2 || s[1] != 2) {
        gelu_bf16(p, s, n, ctx);
        return;
    }
    pthread_once(&g_gelu_tab_once, gelu_tab_init);
    const uint16_t *restrict tab = g_gelu_bf16_tab;
    uint16_t *restrict o = (uint16_t *)p[0];
    const uint16_t *restrict x = (const uint16_t *)p[1];
    for (int64_t i = 0; i < n; i++) o[i] = tab[x[i]];
}

/* pow_scalar: p0 is the exponent; the common exponents take exact shortcuts (as PyTorch). */
NB__UNARY(pow_scalar_f32, float, float, const float e = (float)ctx->p0;,
          e == 2.0f ? x * x : e == 0.5f ? sqrtf(x) : e == 1.0f ? x : powf(x, e))
NB__UNARY(pow_scalar_f64, double, double, const double e = ctx->p0;,
          e == 2.0 ? x * x : e == 0.5 ? sqrt(x) : e == 1.0 ? x : pow(x, e))
NB__HALF_UNARY(pow_scalar)

/* clamp: p0 = lo, p1 = hi. NaN stays NaN; lo > hi gives hi everywhere (as PyTorch). */
#define NB__CLAMP_EXPR(x) ((x) < lo ? lo : (x)) > hi ? hi : ((x) < lo ? lo : (x))
NB__UNARY(clamp_f32, float, float,
          const float lo = (float)ctx->p0; const float hi = (float)ctx->p1;, NB__CLAMP_EXPR(x))
NB__UNARY(clamp_f64, double, double, const double lo = ctx->p0; const double hi = ctx->p1;,
          NB__CLAMP_EXPR(x))
NB__HALF_UNARY(clamp)

/* ---- unary integer ops ---------------------------------------------------------------------
 * Integer x ^ e by squaring with wrap-around; e >= 0 (checked by the op definition). */
#define NB__IPOW(T, U)                                                                      \
    static inline T ipow_##T(T x, uint64_t e) {                                            \
        U r = 1, b = (U)x;                                                                 \
        while (e) {                                                                        \
            if (e & 1u) r = (U)(r * b);                                                    \
            b = (U)(b * b);                                                                \
            e >>= 1;                                                                       \
        }                                                                                  \
        return (T)r;                                                                       \
    }
NB__IPOW(int32_t, uint32_t)
NB__IPOW(int64_t, uint64_t)
NB__IPOW(uint8_t, uint32_t)

/* Negative integer exponents of a tensor pow: 1 ^ -n = 1, (-1) ^ -n = +-1, else 0 (the
 * integer part of the true result; 0 ^ -n is defined as 0 rather than failing). */
#define NB__IPOW_SIGNED(T)                                                                  \
    static inline T ipow_signed_##T(T x, T e) {                                            \
        if (e >= 0) return ipow_##T(x, (uint64_t)e);                                       \
        return x == 1 ? 1 : x == -1 ? (e % 2 != 0 ? -1 : 1) : 0;                            \
    }
NB__IPOW_SIGNED(int32_t)
NB__IPOW_SIGNED(int64_t)

#define NB__STAMP_UNARY_INT(sfx, T, U)                                                      \
    NB__UNARY(neg_##sfx, T, T, , (T)((U)0 - (U)x))                                          \
    NB__UNARY(clamp_##sfx, T, T, const T lo = (T)ctx->i0; const T hi = (T)ctx->i1;,         \
              NB__CLAMP_EXPR(x))                                                            \
    NB__UNARY(pow_scalar_##sfx, T, T, const uint64_t e = (uint64_t)ctx->i0;, ipow_##T(x, e))
NB__STAMP_UNARY_INT(i32, int32_t, uint32_t)
NB__STAMP_UNARY_INT(i64, int64_t, uint64_t)
NB__STAMP_UNARY_INT(u8, uint8_t, uint32_t)
NB__UNARY(abs_i32, int32_t, int32_t, , x < 0 ? (int32_t)(0u - (uint32_t)x) : x)
NB__UNARY(abs_i64, int64_t, int64_t, , x < 0 ? (int64_t)(0u - (uint64_t)x) : x)
NB__UNARY(relu_i32, int32_t, int32_t, , x < 0 ? 0 : x)
NB__UNARY(relu_i64, int64_t, int64_t, , x < 0 ? 0 : x)
/* Unsigned (and bool) values are their own abs and relu. */
NB__UNARY(ident_u8, uint8_t, uint8_t, , x)

/* ---- binary ops ----------------------------------------------------------------------------
 * maximum/minimum propagate NaN (either operand) as PyTorch does. */
#define NB__MAX_EXPR (a != a || a > b ? a : b)
#define NB__MIN_EXPR (a != a || a < b ? a : b)

#define NB__STAMP_CMP(sfx, T)                                                               \
    NB__BINARY(eq_##sfx, T, nb__u8bool, a == b)                                             \
    NB__BINARY(ne_##sfx, T, nb__u8bool, a != b)                                             \
    NB__BINARY(lt_##sfx, T, nb__u8bool, a < b)                                              \
    NB__BINARY(le_##sfx, T, nb__u8bool, a <= b)                                             \
    NB__BINARY(gt_##sfx, T, nb__u8bool, a > b)                                              \
    NB__BINARY(ge_##sfx, T, nb__u8bool, a >= b)

#define NB__STAMP_BINARY_FLOAT(sfx, T, POW)                                                 \
    NB__BINARY(add_##sfx, T, T, a + b)                                                      \
    NB__BINARY(sub_##sfx, T, T, a - b)                                                      \
    NB__BINARY(mul_##sfx, T, T, a * b)                                                      \
    NB__BINARY(div_##sfx, T, T, a / b)                                                      \
    NB__BINARY(pow_##sfx, T, T, POW(a, b))                                                  \
    NB__BINARY(maximum_##sfx, T, T, NB__MAX_EXPR)                                           \
    NB__BINARY(minimum_##sfx, T, T, NB__MIN_EXPR)                                           \
    NB__STAMP_CMP(sfx, T)
NB__STAMP_BINARY_FLOAT(f32, float, powf)
NB__STAMP_BINARY_FLOAT(f64, double, pow)

#define NB__STAMP_HALF_BINARY(name) NB__HALF_BINARY(name, true)
#define NB__STAMP_HALF_CMP(name) NB__HALF_BINARY(name, false)
NB__STAMP_HALF_BINARY(add)
NB__STAMP_HALF_BINARY(sub)
NB__STAMP_HALF_BINARY(mul)
NB__STAMP_HALF_BINARY(div)
NB__STAMP_HALF_BINARY(pow)
NB__STAMP_HALF_BINARY(maximum)
NB__STAMP_HALF_BINARY(minimum)
NB__STAMP_HALF_CMP(eq)
NB__STAMP_HALF_CMP(ne)
NB__STAMP_HALF_CMP(lt)
NB__STAMP_HALF_CMP(le)
NB__STAMP_HALF_CMP(gt)
NB__STAMP_HALF_CMP(ge)

#define NB__STAMP_BINARY_INT(sfx, T, U, POW)                                                \
    NB__BINARY(add_##sfx, T, T, (U)a + (U)b)                                                \
    NB__BINARY(sub_##sfx, T, T, (U)a - (U)b)                                                \
    NB__BINARY(mul_##sfx, T, T, (U)a * (U)b)                                                \
    NB__BINARY(pow_##sfx, T, T, POW(a, b))                                                  \
    NB__BINARY(maximum_##sfx, T, T, a > b ? a : b)                                          \
    NB__BINARY(minimum_##sfx, T, T, a < b ? a : b)                                          \
    NB__STAMP_CMP(sfx, T)
#define NB__POW_U8(a, b) ipow_uint8_t((a), (uint64_t)(b))
NB__STAMP_BINARY_INT(i32, int32_t, uint32_t, ipow_signed_int32_t)
NB__STAMP_BINARY_INT(i64, int64_t, uint64_t, ipow_signed_int64_t)
NB__STAMP_BINARY_INT(u8, uint8_t, uint32_t, NB__POW_U8)

/* bool: add is logical or, mul logical and (as PyTorch); the values are 0 or 1. */
NB__BINARY(or_bool, nb__u8bool, nb__u8bool, a | b)
NB__BINARY(and_bool, nb__u8bool, nb__u8bool, a & b)
NB__STAMP_CMP(bool, nb__u8bool)

/* ---- where ---------------------------------------------------------------------------------
 * Operands (out, cond, a, b); only the element size matters, so one kernel per size. */
#define NB__WHERE(NAME, T)                                                                  \
    static void NAME(char **p, const int64_t *s, int64_t n, void *ctx_) {                  \
        (void)ctx_;                                                                        \
        const int64_t es = (int64_t)sizeof(T);                                             \
        if (s[0] == es && s[1] == 1 && s[2] == es && s[3] == es) {                         \
            T *restrict o_ = (T *)p[0];                                                    \
            const nb__u8bool *restrict c_ = (const nb__u8bool *)p[1];                      \
            const T *restrict a_ = (const T *)p[2], *restrict b_ = (const T *)p[3];        \
            for (int64_t i = 0; i < n; i++) o_[i] = c_[i] ? a_[i] : b_[i];                 \
        } else {                                                                           \
            for (int64_t i = 0; i < n; i++)                                                \
                *(T *)(p[0] + i * s[0]) = *(const nb__u8bool *)(p[1] + i * s[1])          \
                                              ? *(const T *)(p[2] + i * s[2])              \
                                              : *(const T *)(p[3] + i * s[3]);             \
        }                                                                                  \
    }
NB__WHERE(where_1, uint8_t)
NB__WHERE(where_2, uint16_t)
NB__WHERE(where_4, uint32_t)
NB__WHERE(where_8, uint64_t)

/* ---- the table ------------------------------------------------------------------------------ */
#define NB__FLOATS(name)                                                                    \
    [NB_F32] = name##_f32, [NB_F64] = name##_f64, [NB_F16] = name##_f16,                    \
    [NB_BF16] = name##_bf16
#define NB__INTS(name) [NB_I32] = name##_i32, [NB_I64] = name##_i64, [NB_U8] = name##_u8
#define NB__ALL_CMP(name) {NB__FLOATS(name), NB__INTS(name), [NB_BOOL] = name##_bool}

static const nb__iter_fn ew_table[NB__OP_COUNT][NB_DTYPE_COUNT] = {
    [NB__OP_NEG] = {NB__FLOATS(neg), NB__INTS(neg)},
    [NB__OP_ABS] = {NB__FLOATS(abs), [NB_I32] = abs_i32, [NB_I64] = abs_i64,
                    [NB_U8] = ident_u8, [NB_BOOL] = ident_u8},
    [NB__OP_EXP] = {NB__FLOATS(exp)},
    [NB__OP_LOG] = {NB__FLOATS(log)},
    [NB__OP_LOG1P] = {NB__FLOATS(log1p)},
    [NB__OP_SQRT] = {NB__FLOATS(sqrt)},
    [NB__OP_RSQRT] = {NB__FLOATS(rsqrt)},
    [NB__OP_SIN] = {NB__FLOATS(sin)},
    [NB__OP_COS] = {NB__FLOATS(cos)},
    [NB__OP_TANH] = {NB__FLOATS(tanh)},
    [NB__OP_SIGMOID] = {NB__FLOATS(sigmoid)},
    [NB__OP_RELU] = {NB__FLOATS(relu), [NB_I32] = relu_i32, [NB_I64] = relu_i64,
                     [NB_U8] = ident_u8},
    [NB__OP_GELU] = {[NB_F32] = gelu_f32, [NB_F64] = gelu_f64, [NB_F16] = gelu_f16,
                     [NB_BF16] = gelu_tab_bf16},
    [NB__OP_GELU_TANH] = {NB__FLOATS(gelu_tanh)},
    [NB__OP_SILU] = {NB__FLOATS(silu)},
    [NB__OP_POW_SCALAR] = {NB__FLOATS(pow_scalar), NB__INTS(pow_scalar)},
    [NB__OP_CLAMP] = {NB__FLOATS(clamp), NB__INTS(clamp)},
    [NB__OP_ADD] = {NB__FLOATS(add), NB__INTS(add), [NB_BOOL] = or_bool},
    [NB__OP_SUB] = {NB__FLOATS(sub), NB__INTS(sub)},
    [NB__OP_MUL] = {NB__FLOATS(mul), NB__INTS(mul), [NB_BOOL] = and_bool},
    [NB__OP_DIV] = {NB__FLOATS(div)},
    [NB__OP_POW] = {NB__FLOATS(pow), NB__INTS(pow)},
    [NB__OP_MAXIMUM] = {NB__FLOATS(maximum), NB__INTS(maximum), [NB_BOOL] = or_bool},
    [NB__OP_MINIMUM] = {NB__FLOATS(minimum), NB__INTS(minimum), [NB_BOOL] = and_bool},
    [NB__OP_EQ] = NB__ALL_CMP(eq),
    [NB__OP_NE] = NB__ALL_CMP(ne),
    [NB__OP_LT] = NB__ALL_CMP(lt),
    [NB__OP_LE] = NB__ALL_CMP(le),
    [NB__OP_GT] = NB__ALL_CMP(gt),
    [NB__OP_GE] = NB__ALL_CMP(ge),
    [NB__OP_WHERE] = {[NB_F32] = where_4, [NB_F64] = where_8, [NB_F16] = where_2,
                      [NB_BF16] = where_2, [NB_I32] = where_4, [NB_I64] = where_8,
                      [NB_U8] = where_1, [NB_BOOL] = where_1},
};

nb__iter_fn nb__cpu_ew_kernel(nb__op op, nb_dtype dt) {
    if ((int)op < 0 || op >= NB__OP_COUNT || (int)dt < 0 || dt >= NB_DTYPE_COUNT) return NULL;
    return ew_table[op][dt];
}

int64_t nb__cpu_ew_grain(nb__op op) {
    switch (op) {
    /* libm calls cost tens of cycles per element: split smaller tensors across threads. */
    case NB__OP_LOG:
    case NB__OP_LOG1P:
    case NB__OP_SIN:
    case NB__OP_COS:
    case NB__OP_GELU:
    case NB__OP_POW:
    case NB__OP_POW_SCALAR: return NB__GRAIN / 8;
    default: return NB__GRAIN;
    }
}

/* ---- backward kernels ------------------------------------------------------------------------
 * One pass computing an input's gradient from the output gradient g, so a rule makes one
 * tensor instead of a chain of temporaries. Unary kernels read (g, x), where x is the
 * saved tensor named in elementwise.h (the input, or the output where the derivative is
 * cheaper from it); binary kernels read (g, a, b). The conventions at non-differentiable
 * points follow PyTorch (see tensor/ops/elementwise.c). f16/bf16 compute in f32 and
 * round once. */
#define NB__INV_SQRT_2PI 0.3989422804014327 /* 1 / sqrt(2 pi) */
#define NB__GELU_C 0.044715

/* d/dx gelu_tanh(x) = s + 2 x s (1 - s) k (1 + 3 c x^2), s = sigmoid(2u) = (1 + tanh u) / 2,
 * u = k (x + c x^3): the same sigmoid identity the f32 forward uses. */
static inline float dgelu_tanh_f32(float x) {
    const float k = (float)NB__GELU_K, c = (float)NB__GELU_C;
    float s = 1.0f / (1.0f + expf_v(-2.0f * k * (x + c * x * x * x)));
    return s + 2.0f * x * s * (1.0f - s) * k * (1.0f + 3.0f * c * x * x);
}
static inline double dgelu_tanh_f64(double x) {
    double t = tanh(NB__GELU_K * (x + NB__GELU_C * x * x * x));
    return 0.5 * (1.0 + t) +
           0.5 * x * (1.0 - t * t) * NB__GELU_K * (1.0 + 3.0 * NB__GELU_C * x * x);
}
/* d/dx x sigmoid(x) = s (1 + x (1 - s)). */
static inline float dsilu_f32(float x) {
    float s = 1.0f / (1.0f + expf_v(-x));
    return s * (1.0f + x * (1.0f - s));
}
static inline double dsilu_f64(double x) {
    double s = 1.0 / (1.0 + exp(-x));
    return s * (1.0 + x * (1.0 - s));
}

/* X(name, PRE f32, f32 expression, PRE f64, f64 expression) of g and x. abs: x * g at 0
 * gives 0 (and NaN for NaN x, as g * sign(x)). relu reads its output, so NaN passes g
 * (PyTorch's threshold_backward). */
#define NB__UNARY_BW_OPS(X)                                                                 \
    X(abs, , x > 0 ? g : x < 0 ? -g : x * g, , x > 0 ? g : x < 0 ? -g : x * g)             \
    X(exp, , g * x, , g * x)                                                                \
    X(log, , g / x, , g / x)                                                                \
    X(log1p, , g / (1.0f + x), , g / (1.0 + x))                                            \
    X(sqrt, , g / (2.0f * x), , g / (2.0 * x))                                              \
    X(rsqrt, , -0.5f * g * (x * x * x), , -0.5 * g * (x * x * x))                           \
    X(sin, , g * cosf(x), , g * cos(x))                                                     \
    X(cos, , -g * sinf(x), , -g * sin(x))                                                   \
    X(tanh, , g * (1.0f - x * x), , g * (1.0 - x * x))                                      \
    X(sigmoid, , g * x * (1.0f - x), , g * x * (1.0 - x))                                   \
    X(relu, , x <= 0 ? 0.0f : g, , x <= 0 ? 0.0 : g)                                        \
    X(gelu, , g * dgelu_v(x), ,                                                             \
      g * (0.5 * erfc(x * -M_SQRT1_2) + x * NB__INV_SQRT_2PI * exp(-0.5 * x * x)))        \
    X(gelu_tanh, , g * dgelu_tanh_f32(x), , g * dgelu_tanh_f64(x))                          \
    X(silu, , g * dsilu_f32(x), , g * dsilu_f64(x))                                         \
    X(pow_scalar, const float e = (float)ctx->p0;,                                          \
      e == 0.0f ? 0.0f : e == 1.0f ? g : e == 2.0f ? g * 2.0f * x : g * e * powf(x, e - 1.0f), \
      const double e = ctx->p0;,                                                            \
      e == 0.0 ? 0.0 : e == 1.0 ? g : e == 2.0 ? g * 2.0 * x : g * e * pow(x, e - 1.0))     \
    X(clamp, const float lo = (float)ctx->p0; const float hi = (float)ctx->p1;,             \
      x >= lo && x <= hi ? g : 0.0f, const double lo = ctx->p0; const double hi = ctx->p1;,  \
      x >= lo && x <= hi ? g : 0.0)

#define NB__STAMP_UNARY_BW(name, pre32, e32, pre64, e64)                                    \
    NB__BINARY_V(name##_bw_f32, float, float, g, x, pre32, e32)                             \
    NB__BINARY_V(name##_bw_f64, double, double, g, x, pre64, e64)                           \
    NB__HALF_BINARY(name##_bw, true)
NB__UNARY_BW_OPS(NB__STAMP_UNARY_BW)

/* gelu's bf16 backward: g * gelu'(x) with the slope from the table (gelu_tab_init), the
 * product in f32 and rounded once, as gelu_bw_bf16 computes it. Both operands contiguous
 * bf16; other layouts go through gelu_bw_bf16. */
static void gelu_bw_tab_bf16(char **p, const int64_t *s, int64_t n, void *ctx) {
    if (s[0] != 2 || s[1] != 2 || s[2] != 2) {
        gelu_bw_bf16(p, s, n, ctx);
        return;
    }
    pthread_once(&g_gelu_tab_once, gelu_tab_init);
    const float *restrict tab = g_dgelu_bf16_tab;
    uint16_t *restrict o = (uint16_t *)p[0];
    const uint16_t *restrict g = (const uint16_t *)p[1], *restrict x = (const uint16_t *)p[2];
    for (int64_t i = 0; i < n; i++)
        o[i] = bf16_round(f32_from_bits((uint32_t)g[i] << 16) * tab[x[i]]);
}

/* X(name, f32 expression, f64 expression) of g, a, b (POW: f32 and f64 pow functions).
 * pow: d/da is 0 where b == 0, d/db is 0 where a == 0 and b >= 0 (PyTorch's masks, which
 * keep 0 ^ 0 and 0 ^ b from producing 0 * inf = NaN). maximum/minimum: a tie splits g
 * in half; NaN (no order) passes g to both inputs, as PyTorch's where/masked_fill form. */
#define NB__BINARY_BW_OPS(X, POW, LOG, HALF)                                                \
    X(div_b, -g * (a / b) / b)                                                              \
    X(pow_a, b == 0 ? 0 : g * b * POW(a, b - 1))                                            \
    X(pow_b, a == 0 && b >= 0 ? 0 : g * POW(a, b) * LOG(a))                                 \
    X(maximum_a, a == b ? g * HALF : a < b ? 0 : g)                                         \
    X(maximum_b, a == b ? g * HALF : a > b ? 0 : g)                                         \
    X(minimum_a, a == b ? g * HALF : a > b ? 0 : g)                                         \
    X(minimum_b, a == b ? g * HALF : a < b ? 0 : g)
#define NB__STAMP_TERNARY_F32(name, e) NB__TERNARY(name##_bw_f32, float, , e)
#define NB__STAMP_TERNARY_F64(name, e) NB__TERNARY(name##_bw_f64, double, , e)
#define NB__STAMP_TERNARY_HALF(name, e)                                                     \
    static void name##_bw_f16(char **p, const int64_t *s, int64_t n, void *ctx) {          \
        half_ternary(name##_bw_f32, false, p, s, n, ctx);                                  \
    }                                                                                      \
    static void name##_bw_bf16(char **p, const int64_t *s, int64_t n, void *ctx) {         \
        half_ternary(name##_bw_f32, true, p, s, n, ctx);                                   \
    }
NB__BINARY_BW_OPS(NB__STAMP_TERNARY_F32, powf, logf, 0.5f)
NB__BINARY_BW_OPS(NB__STAMP_TERNARY_F64, pow, log, 0.5)
NB__BINARY_BW_OPS(NB__STAMP_TERNARY_HALF, , , )

#define NB__BW(name) {NB__FLOATS(name##_bw)}
static const nb__iter_fn bw_table[NB__OP_COUNT][2][NB_DTYPE_COUNT] = {
    [NB__OP_ABS] = {NB__BW(abs)},
    [NB__OP_EXP] = {NB__BW(exp)},
    [NB__OP_LOG] = {NB__BW(log)},
    [NB__OP_LOG1P] = {NB__BW(log1p)},
    [NB__OP_SQRT] = {NB__BW(sqrt)},
    [NB__OP_RSQRT] = {NB__BW(rsqrt)},
    [NB__OP_SIN] = {NB__BW(sin)},
    [NB__OP_COS] = {NB__BW(cos)},
    [NB__OP_TANH] = {NB__BW(tanh)},
    [NB__OP_SIGMOID] = {NB__BW(sigmoid)},
    [NB__OP_RELU] = {NB__BW(relu)},
    [NB__OP_GELU] = {{[NB_F32] = gelu_bw_f32, [NB_F64] = gelu_bw_f64, [NB_F16] = gelu_bw_f16,
                      [NB_BF16] = gelu_bw_tab_bf16}},
    [NB__OP_GELU_TANH] = {NB__BW(gelu_tanh)},
    [NB__OP_SILU] = {NB__BW(silu)},
    [NB__OP_POW_SCALAR] = {NB__BW(pow_scalar)},
    [NB__OP_CLAMP] = {NB__BW(clamp)},
    [NB__OP_DIV] = {[1] = {NB__FLOATS(div_b_bw)}},
    [NB__OP_POW] = {NB__BW(pow_a), NB__BW(pow_b)},
    [NB__OP_MAXIMUM] = {NB__BW(maximum_a), NB__BW(maximum_b)},
    [NB__OP_MINIMUM] = {NB__BW(minimum_a), NB__BW(minimum_b)},
};

nb__iter_fn nb__cpu_ew_bw_kernel(nb__op op, int input, nb_dtype dt) {
    if ((int)op < 0 || op >= NB__OP_COUNT || input < 0 || input > 1 || (int)dt < 0 ||
        dt >= NB_DTYPE_COUNT)
        return NULL;
    return bw_table[op][input][dt];
}

/* ---- the kernel table's entries --------------------------------------------------------------- */
/* f16/bf16 inputs of an f32 op (the backend's ew_half_in_f32): blocks of NB__BLK elements
 * of each such input widened into f32 on the stack, then the f32 kernel over the block. A
 * stride-0 input is widened once. The values are those of converting the inputs first. */
typedef struct mixed_ctx {
    nb__iter_fn f32;
    void *ctx;
    int nargs;
    const nb_dtype *dt; /* the iterator's operand dtypes */
} mixed_ctx;

static void half_in_f32(char **p, const int64_t *s, int64_t n, void *vctx) {
    const mixed_ctx *m = vctx;
    float buf[NB__ITER_MAX_ARGS][NB__BLK];
    char *fp[NB__ITER_MAX_ARGS];
    int64_t fs[NB__ITER_MAX_ARGS];
    bool half[NB__ITER_MAX_ARGS] = {false};
    for (int k = 0; k < m->nargs; k++) {
        half[k] = k > 0 && (m->dt[k] == NB_BF16 || m->dt[k] == NB_F16);
        if (half[k] && s[k] == 0) half_load(buf[k], p[k], 2, 1, m->dt[k] == NB_BF16);
    }
    for (int64_t i0 = 0; i0 < n; i0 += NB__BLK) {
        const int64_t b = n - i0 < NB__BLK ? n - i0 : NB__BLK;
        for (int k = 0; k < m->nargs; k++) {
            if (!half[k]) {
                fp[k] = p[k] + i0 * s[k], fs[k] = s[k];
                continue;
            }
            if (s[k] != 0) half_load(buf[k], p[k] + i0 * s[k], s[k], b, m->dt[k] == NB_BF16);
            fp[k] = (char *)buf[k], fs[k] = s[k] == 0 ? 0 : 4;
        }
        m->f32(fp, fs, b, m->ctx);
    }
}

static nb_status cpu_ew(const nb__ew_args *a) {
    nb__iter_fn fn = nb__cpu_ew_kernel(a->op, a->dtype);
    if (!fn)
        return nb__error(NB_EUNSUPPORTED, "%s: no cpu kernel for %s", nb__op_names[a->op],
                         nb_dtype_name(a->dtype));
    nb__ew_ctx c = a->ctx;
    bool mixed = false;
    for (int k = 1; k < a->it.nargs; k++)
        mixed |= a->dtype == NB_F32 && (a->it.dtype[k] == NB_BF16 || a->it.dtype[k] == NB_F16);
    if (mixed) {
        mixed_ctx m = {.f32 = fn, .ctx = &c, .nargs = a->it.nargs, .dt = a->it.dtype};
        nb__iter_for_each(&a->it, half_in_f32, &m, nb__cpu_ew_grain(a->op));
        return NB_OK;
    }
    nb__iter_for_each(&a->it, fn, &c, nb__cpu_ew_grain(a->op));
    return NB_OK;
}

static nb_status cpu_ew_backward(const nb__ew_args *a) {
    nb__iter_fn fn = nb__cpu_ew_bw_kernel(a->op, a->input, a->dtype);
    if (!fn)
        return nb__error(NB_EUNSUPPORTED, "%s: no cpu backward kernel for input %d in %s",
                         nb__op_names[a->op], a->input, nb_dtype_name(a->dtype));
    nb__ew_ctx c = a->ctx;
    nb__iter_for_each(&a->it, fn, &c, nb__cpu_ew_grain(a->op));
    return NB_OK;
}

void nb__cpu_register_core(nb__kernels *k) {
    nb__cpu_register_convert(k);
    k->ew = cpu_ew;
    k->ew_backward = cpu_ew_backward;
}
