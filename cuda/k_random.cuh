// cuda/k_random.cuh - private: the per-block and per-element math of the random kernels
// (cuda/k_random.cu), as __host__ __device__ functions, so that the kernels run them on the
// GPU and tests/cuda_host/random.cu runs the very same functions on the host against the CPU
// backend (cpu/random.c; the layout is specified in tensor/random.c). UNVERIFIED ON A GPU:
// only the host side of these functions has been run.
//
//   nbr::block_words(a, b, w)     the 4 Philox words of block b (relative to a->offset):
//                                 counter (offset + b, stream), key seed (tensor/philox.h)
//   nbr::block_values(a, b, v, q) the values of the elements of block b (a->per_block of
//                                 them): doubles v[k] (float distributions) or integers
//                                 q[k] (NB__RANDOM_INT), by cpu/random.c's transforms in its
//                                 operation order, never FMA-contracted on the device
//   nbr::store(a, dst, v, q)      one element converted to out's dtype as the CPU stores it
//                                 (uniform's below-hi replacement included)
//   nb__kh_dtype_size(dt)         bytes per element (cuda/khelp.h; 0: not a dtype)
//   nbr::view_offset(v, e)        element offset of row-major element e of a strided view
//   nbr::swap_index(a, k)         randperm: the partner j of swap k (of i = n - 1 - k)
//   nbr::rp_reserve / rp_commit / rp_clear
//                                 randperm's three phases of a round, on one position
//
// Bit-exactness: uniform, randint and bernoulli use exact integer and IEEE operations only:
// the same bits as the CPU on any device. normal uses log, sqrt, cos and sin in double:
// sqrt is correctly rounded everywhere, but the device's log (CUDA's, within 1 ulp) and its
// cos/sin (sincos_small below, within about 2 ulp) may differ from glibc's in the last bits
// of the double for some inputs;
// after rounding to f32/f16/bf16 such a difference survives only when the double lies
// within an ulp of a rounding boundary (about 1 element in 10^8); f64 normals may differ
// in the last bits more often. On the host, these functions use glibc, like the CPU.
#ifndef NABLA_CUDA_K_RANDOM_CUH
#define NABLA_CUDA_K_RANDOM_CUH

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda/khelp.h"
#include "tensor/kernels.h"
#include "tensor/philox.h"

namespace nbr {

#if defined(__CUDA_ARCH__)
NB_HD double mul(double a, double b) { return __dmul_rn(a, b); }
NB_HD double add(double a, double b) { return __dadd_rn(a, b); }
NB_HD double sub(double a, double b) { return __dsub_rn(a, b); }
NB_HD uint64_t mulhi64(uint64_t a, uint64_t b) { return __umul64hi(a, b); }
#else
NB_HD double mul(double a, double b) { return a * b; }
NB_HD double add(double a, double b) { return a + b; }
NB_HD double sub(double a, double b) { return a - b; }
NB_HD uint64_t mulhi64(uint64_t a, uint64_t b) {
    return (uint64_t)(((unsigned __int128)a * b) >> 64);
}
#endif

constexpr double kTwoPi = 6.283185307179586476925286766559;
constexpr double kInv24 = 1.0 / 16777216.0;
constexpr double kInv32 = 1.0 / 4294967296.0;
constexpr double kInv53 = 1.0 / 9007199254740992.0;

NB_HD void block_words(uint64_t seed, uint64_t stream, uint64_t offset, uint64_t b,
                       uint32_t w[4]) {
    uint64_t c = offset + b;
    nb__philox_block((uint32_t)c, (uint32_t)(c >> 32), (uint32_t)stream,
                     (uint32_t)(stream >> 32), (uint32_t)seed, (uint32_t)(seed >> 32), w);
}

NB_HD uint64_t word64(const uint32_t w[4], int k) {
    return ((uint64_t)w[2 * k] << 32) | w[2 * k + 1];
}

// sin and cos of t for 0 <= t < 8 without the huge-argument reduction of the device's
// sin/cos (Payne-Hanek, which needs a local-memory array, and the build forbids local
// memory): t = pi x + d with x = t / pi rounded and d its residual (two FMAs with pi split
// in two doubles), then sin(t) = sinpi(x) + cospi(x) d and cos(t) = cospi(x) - sinpi(x) d
// (the d^2 terms are below 1e-31). sincospi reduces x exactly, so the result is within
// sincospi's error (an ulp or two) of the true sin and cos of the double t.
NB_HD void sincos_small(double t, double *s, double *c) {
    const double inv_pi = 0.31830988618379067154, pi_hi = 3.141592653589793116;
    const double pi_lo = 1.2246467991473532072e-16;
    double x = t * inv_pi;
    double d = fma(-pi_hi, x, t);
    d = fma(-pi_lo, x, d);
    double sp, cp;
    sincospi(x, &sp, &cp);
    *s = fma(cp, d, sp);
    *c = fma(-sp, d, cp);
}

// Box-Muller: (r cos(2 pi u2), r sin(2 pi u2)) with r = sqrt(-2 ln u1), scaled: a + b * z.
// The host (and so the host checks) uses glibc's cos and sin like the CPU; the device uses
// sincos_small (see the header for what that means for bit-exactness).
NB_HD void box_muller(double u1, double u2, double a, double b, double *z0, double *z1) {
    double r = sqrt(mul(-2.0, log(u1)));
    double t = mul(kTwoPi, u2), ct, st;
#if defined(__CUDA_ARCH__)
    sincos_small(t, &st, &ct);
#else
    ct = cos(t);
    st = sin(t);
#endif
    *z0 = add(a, mul(b, mul(r, ct)));
    *z1 = add(a, mul(b, mul(r, st)));
}

// Values of the elements of block b (cpu/random.c rng_values): v[k] for float
// distributions, q[k] for NB__RANDOM_INT, k < a->per_block.
NB_HD void block_values(const nb__random_args *a, uint64_t b, double v[4], int64_t q[4]) {
    uint32_t w[4];
    block_words(a->seed, a->stream, a->offset, b, w);
    const bool four = a->per_block == 4;
    switch (a->dist) {
    case NB__RANDOM_UNIFORM: {
        double span = sub(a->b, a->a);
        if (four) {
            for (int k = 0; k < 4; k++)
                v[k] = add(a->a, mul(span, mul((double)(w[k] >> 8), kInv24)));
        } else {
            for (int k = 0; k < 2; k++)
                v[k] = add(a->a, mul(span, mul((double)(word64(w, k) >> 11), kInv53)));
        }
        break;
    }
    case NB__RANDOM_NORMAL:
        if (four) {
            box_muller(mul(add((double)w[0], 1.0), kInv32), mul((double)w[1], kInv32), a->a,
                       a->b, &v[0], &v[1]);
            box_muller(mul(add((double)w[2], 1.0), kInv32), mul((double)w[3], kInv32), a->a,
                       a->b, &v[2], &v[3]);
        } else {
            box_muller(mul(add((double)(word64(w, 0) >> 11), 1.0), kInv53),
                       mul((double)(word64(w, 1) >> 11), kInv53), a->a, a->b, &v[0], &v[1]);
        }
        break;
    case NB__RANDOM_INT:
        if (four) {
            for (int k = 0; k < 4; k++)
                q[k] = (int64_t)((uint64_t)a->ilo + (((uint64_t)w[k] * a->range) >> 32));
        } else {
            for (int k = 0; k < 2; k++)
                q[k] = (int64_t)((uint64_t)a->ilo + mulhi64(word64(w, k), a->range));
        }
        break;
    case NB__RANDOM_BERNOULLI:
        for (int k = 0; k < 4; k++) v[k] = (mul((double)w[k], kInv32) < a->a) ? 1.0 : 0.0;
        break;
    }
}

// A float value into a float dtype (cpu/random.c rng_store_f); clamp: uniform with b > a,
// a result that reaches b is replaced by the largest value of the dtype below b.
NB_HD void store_f(const nb__random_args *a, bool clamp, char *dst, double x) {
    const double hi = a->b;
    switch (a->out.dtype) {
    case NB_F64: *(double *)dst = (clamp && x >= hi) ? a->below_hi_d : x; return;
    case NB_F32: {
        float f = (float)x;
        *(float *)dst = (clamp && (double)f >= hi) ? a->below_hi_f : f;
        return;
    }
    case NB_F16:
    case NB_BF16: {
        const bool f16 = a->out.dtype == NB_F16;
        float f = (float)x;
        uint16_t h = f16 ? nb__kh_f16_from_f32(f) : nb__kh_bf16_from_f32(f);
        if (clamp) {
            float back = f16 ? nb__kh_f32_from_f16(h) : nb__kh_f32_from_bf16(h);
            if ((double)back >= hi) h = a->below_hi_h;
        }
        *(uint16_t *)dst = h;
        return;
    }
    case NB_I32: *(int32_t *)dst = (int32_t)x; return;
    case NB_I64: *(int64_t *)dst = (int64_t)x; return;
    case NB_U8: *(uint8_t *)dst = (uint8_t)x; return;
    case NB_BOOL: *(bool *)dst = x != 0.0; return;
    default: return;
    }
}

// One element (value v or q, as block_values made it) into dst in out's dtype
// (cpu/random.c rng_store).
NB_HD void store(const nb__random_args *a, char *dst, double v, int64_t q) {
    if (a->dist != NB__RANDOM_INT) {
        store_f(a, a->dist == NB__RANDOM_UNIFORM && a->b > a->a, dst, v);
        return;
    }
    switch (a->out.dtype) {
    case NB_I64: *(int64_t *)dst = q; return;
    case NB_I32: *(int32_t *)dst = (int32_t)q; return;
    case NB_U8: *(uint8_t *)dst = (uint8_t)q; return;
    case NB_BOOL: *(bool *)dst = q != 0; return;
    default: store_f(a, false, dst, (double)q); return;
    }
}

// Element offset (in elements) of row-major element e of view v.
NB_HD int64_t view_offset(const nb__view *v, int64_t e) {
    int64_t off = 0;
    for (int d = v->ndim - 1; d >= 0; d--) {
        int64_t n = v->shape[d];
        int64_t q = n > 1 ? e / n : e;
        off += (e - q * n) * v->strides[d];
        e = q;
    }
    return off;
}

// Whether v is row-major without gaps (size-1 dims ignored), as cpu/random.c decides.
NB_HD bool view_contiguous(const nb__view *v) {
    int64_t expect = 1;
    for (int d = v->ndim - 1; d >= 0; d--) {
        if (v->shape[d] == 1) continue;
        if (v->strides[d] != expect) return false;
        expect *= v->shape[d];
    }
    return true;
}

// randperm: swap k (k = 0 .. n-2) exchanges positions i = n - 1 - k and
// j = (x * (i + 1)) >> 64, x the k-th 64-bit word of the stream (block k / 2, word k % 2).
NB_HD int64_t swap_index(const nb__randperm_args *a, int64_t k) {
    uint32_t w[4];
    block_words(a->seed, a->stream, a->offset, (uint64_t)(k / 2), w);
    int64_t i = a->n - 1 - k;
    return (int64_t)mulhi64(word64(w, (int)(k % 2)), (uint64_t)(i + 1));
}

// randperm's rounds of deterministic reservations (k_random.cu), one position i per call.
// J[i]: j_i >= 0 a pending swap; -2 - j_i committed in this round (its reservations still
// to clear); -1 done (and position 0, which has no swap). R[k]: the highest pending swap
// that reserved position k, -1 none. A round is reserve, commit, clear over every i, each
// phase finished before the next starts; within a phase the order does not matter.
NB_HD void rp_reserve(const int64_t *J, long long *R, int64_t i) {
    int64_t j = J[i];
    if (j < 0) return;
#if defined(__CUDA_ARCH__)
    atomicMax(&R[i], (long long)i); // integer max: the same result in any order
    atomicMax(&R[j], (long long)i);
#else
    if (R[i] < i) R[i] = i;
    if (R[j] < i) R[j] = i;
#endif
}
NB_HD long long rp_load(const long long *r) {
#if defined(__CUDA_ARCH__)
    return __ldcg(r); // at L2, where the atomics wrote (no stale L1 line)
#else
    return *r;
#endif
}
// A swap that holds both its reservations has no pending earlier swap on its positions:
// it commits (the round's committed swaps touch disjoint positions).
NB_HD void rp_commit(int64_t *p, int64_t *J, const long long *R, int64_t i) {
    int64_t j = J[i];
    if (j < 0 || rp_load(&R[i]) != i || rp_load(&R[j]) != i) return;
    int64_t t = p[i];
    p[i] = p[j];
    p[j] = t;
    J[i] = -2 - j;
}
// Grid-wide rounds k_random.cu launches for n: the rounds needed grow like 2 log2(n) (host
// emulation: 22 for n = 1000, 45 for 10^6, 53 for 4 * 10^6); a one-block tail kernel
// finishes any rest.
NB_HD int rp_grid_rounds(int64_t n) {
    int lg = 0;
    while (lg < 63 && ((int64_t)1 << lg) < n) lg++;
    return 2 * lg + 16;
}

// Clears position i's reservations; returns whether swap i is still pending.
NB_HD bool rp_clear(int64_t *J, long long *R, int64_t i) {
    int64_t j = J[i];
    if (j == -1) return false;
    R[i] = -1;
    R[j >= 0 ? j : -2 - j] = -1;
    if (j >= 0) return true;
    J[i] = -1;
    return false;
}

}  // namespace nbr

#endif
