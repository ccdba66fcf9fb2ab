/* fastmath.h - private: a branch-free, vectorizable f32 exp shared by the CPU kernels
 * (softmax, log-sum-exp, cross-entropy, their backwards). libm's expf does not vectorize.
 *
 * exp(x) = 2^n * exp(r), n = round(x / ln 2), |r| <= ln2 / 2; a degree-7 Taylor polynomial
 * is accurate to ~1e-8 relative there, below f32 rounding. 2^n is applied as two factors so
 * results in the subnormal range and up to FLT_MAX come out right. Clamping gives
 * exp(-inf) = 0 and exp(+inf) = inf; NaN passes through. The FMA choice is fixed per build,
 * so results are deterministic. */
#ifndef NABLA_CPU_FASTMATH_H
#define NABLA_CPU_FASTMATH_H

#include <math.h>
#include <stdint.h>

#ifdef __FMA__
#define NB__MADD(a, b, c) fmaf((a), (b), (c))
#else
#define NB__MADD(a, b, c) ((a) * (b) + (c))
#endif

static inline float nb__fast_expf(float x) {
    float xc = x > -104.0f ? x : -104.0f; /* a NaN becomes -104 here and is put back below */
    xc = xc < 89.0f ? xc : 89.0f;
    float fn = NB__MADD(xc, 1.44269504088896341f, 12582912.0f); /* round via 1.5 * 2^23 */
    fn -= 12582912.0f;
    float r = NB__MADD(fn, -0.693359375f, xc); /* ln2 split: exact high part */
    r = NB__MADD(fn, 2.12194440e-4f, r);
    float p = 1.0f / 5040.0f;
    p = NB__MADD(p, r, 1.0f / 720.0f);
    p = NB__MADD(p, r, 1.0f / 120.0f);
    p = NB__MADD(p, r, 1.0f / 24.0f);
    p = NB__MADD(p, r, 1.0f / 6.0f);
    p = NB__MADD(p, r, 0.5f);
    p = NB__MADD(p, r, 1.0f);
    p = NB__MADD(p, r, 1.0f);
    int32_t n = (int32_t)fn, n1 = n / 2, n2 = n - n1;
    union { uint32_t u; float f; } s1 = {.u = (uint32_t)(n1 + 127) << 23},
                                   s2 = {.u = (uint32_t)(n2 + 127) << 23};
    float y = p * s1.f * s2.f;
    return isnan(x) ? x : y;
}

#endif
