/* cpu/reduce_blocks.h - private to cpu/reduce.c and cpu/softmax.c: the building blocks of
 * the CPU reductions - blocks of the input loaded in the compute type, block sums, squared
 * deviations, extremes and arg-extremes over dense arrays, and the fast f32 sums (f32
 * partials of at most 16 elements added in f64). Static inline: each file has its own copy. */
#ifndef NABLA_CPU_REDUCE_BLOCKS_H
#define NABLA_CPU_REDUCE_BLOCKS_H

#include <float.h>
#include <math.h>
#include <string.h>

#include "cpu/backend.h"
#include "cpu/fastmath.h"

#define RBLK 1024          /* elements per loaded block (stack buffers of 8 KiB) */
#define CHUNK_MIN 16384    /* a reduction longer than this is cut into chunks ...  */
#define MAX_CHUNKS 256     /* ... of at least CHUNK_MIN elements, at most this many */
#define COLW 256           /* widest column block of the column path                */

typedef enum ctype { CT_F32, CT_F64, CT_I64 } ctype;

static inline ctype ctype_of(nb_dtype dt) {
    switch (dt) {
    case NB_F32: case NB_F16: case NB_BF16: return CT_F32;
    case NB_F64: return CT_F64;
    default: return CT_I64;
    }
}

/* exp is nb__fast_expf (cpu/fastmath.h). */

/* ---- loading blocks in the compute type ------------------------------------------------------
 * p: first element, st: stride in elements. Returns p itself when it is already a dense
 * array of the compute type, else fills buf (n <= RBLK). */
static inline const float *load_f32(const char *p, nb_dtype dt, int64_t st, int64_t n,
                                    float *buf) {
    if (dt == NB_F32) {
        const float *q = (const float *)p;
        if (st == 1) return q;
        for (int64_t i = 0; i < n; i++) buf[i] = q[i * st];
    } else {
        const uint16_t *q = (const uint16_t *)p;
        if (dt == NB_F16) {
            if (st == 1) nb__f16_to_f32_n(q, buf, n);
            else for (int64_t i = 0; i < n; i++) buf[i] = nb_f16_to_f32(q[i * st]);
        } else { /* bf16 is the top half of an f32: a shift, exact for every value */
            uint32_t *u = (uint32_t *)buf;
            if (st == 1) { /* the common case, kept apart so that it vectorizes */
#pragma omp simd
                for (int64_t i = 0; i < n; i++) u[i] = (uint32_t)q[i] << 16;
            } else {
                for (int64_t i = 0; i < n; i++) u[i] = (uint32_t)q[i * st] << 16;
            }
        }
    }
    return buf;
}

static inline const double *load_f64(const char *p, int64_t st, int64_t n, double *buf) {
    const double *q = (const double *)p;
    if (st == 1) return q;
    for (int64_t i = 0; i < n; i++) buf[i] = q[i * st];
    return buf;
}

static inline const int64_t *load_i64(const char *p, nb_dtype dt, int64_t st, int64_t n,
                               int64_t *buf) {
    switch (dt) {
    case NB_I64: {
        const int64_t *q = (const int64_t *)p;
        if (st == 1) return q;
        for (int64_t i = 0; i < n; i++) buf[i] = q[i * st];
        break;
    }
    case NB_I32: {
        const int32_t *q = (const int32_t *)p;
        for (int64_t i = 0; i < n; i++) buf[i] = q[i * st];
        break;
    }
    case NB_U8: {
        const uint8_t *q = (const uint8_t *)p;
        for (int64_t i = 0; i < n; i++) buf[i] = q[i * st];
        break;
    }
    default: { /* NB_BOOL: one byte, any non-zero is true */
        const uint8_t *q = (const uint8_t *)p;
        for (int64_t i = 0; i < n; i++) buf[i] = q[i * st] != 0;
        break;
    }
    }
    return buf;
}

/* ---- block reductions over dense arrays of the compute type ----------------------------------
 * Each reduces n >= 1 elements with one SIMD accumulator; callers add block results in
 * order, so the association is fixed by the block boundaries. */
#define DEF_FLOAT_BLOCKS(T, SFX)                                                           \
    /* 16 independent f64 lanes so the adds are not one dependency chain (the sum must  \
     * keep up with memory bandwidth); lanes are then added in a fixed tree. */           \
    static inline double SFX##_sum(const T *x, int64_t n) {                                \
        double a[16] = {0};                                                                \
        int64_t i = 0;                                                                     \
        for (; i + 16 <= n; i += 16)                                                       \
            for (int k = 0; k < 16; k++) a[k] += x[i + k];                                 \
        for (int k = 0; i < n; i++, k++) a[k] += x[i];                                     \
        for (int w = 8; w > 0; w /= 2)                                                     \
            for (int k = 0; k < w; k++) a[k] += a[k + w];                                  \
        return a[0];                                                                       \
    }                                                                                      \
    static inline double SFX##_sqdev(const T *x, int64_t n, double m) {                    \
        double s = 0;                                                                      \
        _Pragma("omp simd reduction(+ : s)") for (int64_t i = 0; i < n; i++) {             \
            double d = (double)x[i] - m;                                                   \
            s += d * d;                                                                    \
        }                                                                                  \
        return s;                                                                          \
    }                                                                                      \
    /* NaN-propagating max / min: the ordered compare skips NaNs, a flag remembers them. */ \
    static inline T SFX##_max(const T *x, int64_t n) {                                     \
        T m = -(T)INFINITY;                                                                \
        int nan = 0;                                                                       \
        _Pragma("omp simd reduction(max : m) reduction(| : nan)") for (int64_t i = 0;      \
                                                                       i < n; i++) {       \
            m = x[i] > m ? x[i] : m;                                                       \
            nan |= x[i] != x[i];                                                           \
        }                                                                                  \
        return nan ? (T)NAN : m;                                                           \
    }                                                                                      \
    static inline T SFX##_min(const T *x, int64_t n) {                                     \
        T m = (T)INFINITY;                                                                 \
        int nan = 0;                                                                       \
        _Pragma("omp simd reduction(min : m) reduction(| : nan)") for (int64_t i = 0;      \
                                                                       i < n; i++) {       \
            m = x[i] < m ? x[i] : m;                                                       \
            nan |= x[i] != x[i];                                                           \
        }                                                                                  \
        return nan ? (T)NAN : m;                                                           \
    }                                                                                      \
    /* First index of the extreme: find the value (vectorized), then its first position. */ \
    static inline int64_t SFX##_argext(const T *x, int64_t n, bool is_max, T *val) {       \
        T m = is_max ? SFX##_max(x, n) : SFX##_min(x, n);                                  \
        *val = m;                                                                          \
        if (m != m) {                                                                      \
            for (int64_t i = 0; i < n; i++)                                                \
                if (x[i] != x[i]) return i;                                                \
        }                                                                                  \
        for (int64_t i = 0; i < n; i++)                                                    \
            if (x[i] == m) return i;                                                       \
        return 0;                                                                          \
    }

DEF_FLOAT_BLOCKS(float, f32)
DEF_FLOAT_BLOCKS(double, f64)

static inline double f64_sumexp(const double *x, int64_t n, double shift) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += exp(x[i] - shift);
    return s;
}

/* ---- fast f32 sums ---------------------------------------------------------------------------
 * Converting every f32 to f64 before adding (f32_sum) costs so many instructions per cache
 * line that a read-only stream keeps too few loads in flight (~0.55 of memcpy bandwidth).
 * f32_fsum sums sub-blocks of SB elements in f32 with 64 independent lanes (4 elements
 * each, then a fixed tree down to 16 lanes) and adds each sub-block's 16 lane sums into 16
 * f64 lanes: every f32 rounding is inside a sum of at most 16 elements, the long
 * accumulation is in f64 (~1e-10 relative error on 16M uniform values), and the order
 * depends only on n. An f32 lane can overflow where an f64 sum would not (values near
 * FLT_MAX); an overflowed or NaN lane makes the f64 total non-finite, and then the elements
 * are summed again the exact way, so every result is that of f32_sum but for rounding.
 * GCC / clang vector extensions give 16-lane vectors (one AVX-512 register, or two AVX
 * ones) whatever the compiler's preferred vector width. */
typedef float nb__v16f __attribute__((vector_size(64)));
typedef float nb__v8f __attribute__((vector_size(32)));
typedef double nb__v8d __attribute__((vector_size(64)));
/* Without AVX-512 (an x86-64-v3 build, a native build on an AVX2 CPU) GCC warns that
 * passing and returning these 64-byte vectors changes the ABI (-Wpsabi, an error under
 * -Dwerror=true). Every function that does is static to the file that includes this
 * header, so no call crosses an ABI boundary and the warning says nothing here. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

#define SB 256          /* elements of an f32 sub-block (a multiple of 64) */
#define PF_DIST 4096    /* software prefetch distance in bytes (see pf_block) */

static inline nb__v16f vld(const float *p) {
    nb__v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* A long streaming loop with work per element (convert, exp) keeps few cache lines in
 * flight and the hardware prefetcher alone leaves bandwidth unused; prefetching the lines
 * of the block PF_DIST bytes ahead fixes that (cpu/elementwise.c does the same). The address
 * is an integer, so no out-of-bounds pointer is formed; prefetches are hints and never fault. */
static inline void pf_block(const float *p, size_t bytes) {
    uintptr_t a = (uintptr_t)p + PF_DIST;
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch((const void *)(a + o));
}

static inline nb__v16f sb_sum(const float *p) {
    nb__v16f a0 = vld(p), a1 = vld(p + 16), a2 = vld(p + 32), a3 = vld(p + 48);
    for (int k = 64; k < SB; k += 64) {
        a0 += vld(p + k), a1 += vld(p + k + 16);
        a2 += vld(p + k + 32), a3 += vld(p + k + 48);
    }
    return (a0 + a1) + (a2 + a3);
}

static inline void add_f64(nb__v8d *d0, nb__v8d *d1, nb__v16f s) {
    nb__v8f lo, hi;
    memcpy(&lo, &s, sizeof lo);
    memcpy(&hi, (const char *)&s + sizeof lo, sizeof hi);
    *d0 += __builtin_convertvector(lo, nb__v8d);
    *d1 += __builtin_convertvector(hi, nb__v8d);
}

static inline double fold_f64(nb__v8d d0, nb__v8d d1) {
    double a[16];
    memcpy(a, &d0, sizeof d0);
    memcpy(a + 8, &d1, sizeof d1);
    for (int w = 8; w > 0; w /= 2)
        for (int k = 0; k < w; k++) a[k] += a[k + w];
    return a[0];
}

/* The sub-block sums of x[0, n) accumulated into (d0, d1); the last partial sub-block is
 * summed 16 lanes at a time, its last vector padded with zeros (adding +0 is exact). */
static inline void fsum_into(const float *x, int64_t n, nb__v8d *d0, nb__v8d *d1, bool pf) {
    int64_t i = 0;
    for (; i + SB <= n; i += SB) {
        if (pf) pf_block(x + i, SB * sizeof(float));
        add_f64(d0, d1, sb_sum(x + i));
    }
    if (i == n) return;
    nb__v16f a = {0};
    for (; i + 16 <= n; i += 16) a += vld(x + i);
    if (i < n) {
        float t[16] = {0};
        memcpy(t, x + i, (size_t)(n - i) * sizeof(float));
        a += vld(t);
    }
    add_f64(d0, d1, a);
}

static inline double f32_fsum(const float *x, int64_t n, bool pf) {
    nb__v8d d0 = {0}, d1 = {0};
    fsum_into(x, n, &d0, &d1, pf);
    double r = fold_f64(d0, d1);
    return isfinite(r) ? r : f32_sum(x, n);
}

/* sum exp(x - sh), summed as f32_fsum sums; the exps are also written to out unless it is
 * NULL. The terms are at most 1 when sh is the max; when it is 0 because the max is +inf,
 * that element's exp is inf anyway, so an f32 overflow cannot change a result. simdlen(16):
 * the 16-lane loads of fsum_into are then forwarded from the exp loop's stores (8-lane
 * stores, the compiler's default width here, cannot be, and stall), and 16 lanes are also
 * ~1.5x faster for this exp. */
static inline double f32_expsum(const float *x, int64_t n, float sh, float *out) {
    float tmp[SB];
    nb__v8d d0 = {0}, d1 = {0};
    for (int64_t i = 0; i < n; i += SB) {
        int64_t m = n - i < SB ? n - i : SB;
        const float *xb = x + i;
        float *e = out ? out + i : tmp;
        pf_block(xb, SB * sizeof(float));
#pragma omp simd simdlen(16)
        for (int64_t k = 0; k < m; k++) e[k] = nb__fast_expf(xb[k] - sh);
        fsum_into(e, m, &d0, &d1, false);
    }
    return fold_f64(d0, d1);
}

static inline int64_t i64_sum(const int64_t *x, int64_t n) {
    uint64_t s = 0; /* unsigned: wraps without undefined behaviour */
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += (uint64_t)x[i];
    return (int64_t)s;
}

static inline int64_t i64_argext(const int64_t *x, int64_t n, bool is_max, int64_t *val) {
    int64_t m = x[0], k = 0;
    for (int64_t i = 1; i < n; i++)
        if (is_max ? x[i] > m : x[i] < m) m = x[i], k = i;
    *val = m;
    return k;
}

#endif
