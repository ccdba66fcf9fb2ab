/* cpu/reduce.c - CPU kernels for the reductions (sum, mean, var, std, logsumexp, amax/amin,
 * max/min with indices, argmax/argmin) and the fused softmax / log_softmax.
 *
 * Plan of a reduction: the input's dims are sorted by decreasing stride (so a permuted but
 * dense tensor reads in memory order), size-1 dims dropped and neighbours of the same kind
 * (kept / reduced) merged where the strides allow. Then one of two loops runs:
 *   - row path, when the innermost dim is reduced (sum over the last dim, full sums): each
 *     output element reduces runs of the innermost dim, loaded in blocks of RBLK elements
 *     (zero-copy when the input is already in the compute type and dense);
 *   - column path, when the innermost dim is kept (sum over dim 0 of an (N, D) matrix, the
 *     bias gradient) or the reduced rows are very short: W adjacent outputs are accumulated
 *     together, one input row piece at a time, so the inner loop is a vector over D.
 * Determinism (docs/architecture.md rule 5): the order in which an output element accumulates its
 * inputs depends only on shapes and strides. Long reductions are cut into chunks whose
 * size depends only on the reduced count, and the chunk partials are combined in order, so
 * splitting the work over threads (by outputs or by chunks) never changes a result.
 *
 * Compute types: f32/f16/bf16 are computed in f32, sums (also of exps) as short f32 partial
 * sums of at most 16 terms added in f64 (see f32_fsum), squared deviations in f64; f64 in
 * f64; integers and bool in int64 (sums wrap in two's complement as PyTorch's do). */
#include "cpu/backend.h"
#include "cpu/fastmath.h"
#include "cpu/reduce.h"

#include <float.h>
#include <math.h>
#include <string.h>

#define RBLK 1024          /* elements per loaded block (stack buffers of 8 KiB) */
#define CHUNK_MIN 16384    /* a reduction longer than this is cut into chunks ...  */
#define MAX_CHUNKS 256     /* ... of at least CHUNK_MIN elements, at most this many */
#define COLW 256           /* widest column block of the column path                */

typedef enum ctype { CT_F32, CT_F64, CT_I64 } ctype;

static ctype ctype_of(nb_dtype dt) {
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
static const float *load_f32(const char *p, nb_dtype dt, int64_t st, int64_t n, float *buf) {
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

static const double *load_f64(const char *p, int64_t st, int64_t n, double *buf) {
    const double *q = (const double *)p;
    if (st == 1) return q;
    for (int64_t i = 0; i < n; i++) buf[i] = q[i * st];
    return buf;
}

static const int64_t *load_i64(const char *p, nb_dtype dt, int64_t st, int64_t n,
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
    static double SFX##_sum(const T *x, int64_t n) {                                       \
        double a[16] = {0};                                                                \
        int64_t i = 0;                                                                     \
        for (; i + 16 <= n; i += 16)                                                       \
            for (int k = 0; k < 16; k++) a[k] += x[i + k];                                 \
        for (int k = 0; i < n; i++, k++) a[k] += x[i];                                     \
        for (int w = 8; w > 0; w /= 2)                                                     \
            for (int k = 0; k < w; k++) a[k] += a[k + w];                                  \
        return a[0];                                                                       \
    }                                                                                      \
    static double SFX##_sqdev(const T *x, int64_t n, double m) {                           \
        double s = 0;                                                                      \
        _Pragma("omp simd reduction(+ : s)") for (int64_t i = 0; i < n; i++) {             \
            double d = (double)x[i] - m;                                                   \
            s += d * d;                                                                    \
        }                                                                                  \
        return s;                                                                          \
    }                                                                                      \
    /* NaN-propagating max / min: the ordered compare skips NaNs, a flag remembers them. */ \
    static T SFX##_max(const T *x, int64_t n) {                                            \
        T m = -(T)INFINITY;                                                                \
        int nan = 0;                                                                       \
        _Pragma("omp simd reduction(max : m) reduction(| : nan)") for (int64_t i = 0;      \
                                                                       i < n; i++) {       \
            m = x[i] > m ? x[i] : m;                                                       \
            nan |= x[i] != x[i];                                                           \
        }                                                                                  \
        return nan ? (T)NAN : m;                                                           \
    }                                                                                      \
    static T SFX##_min(const T *x, int64_t n) {                                            \
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
    static int64_t SFX##_argext(const T *x, int64_t n, bool is_max, T *val) {              \
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

static double f64_sumexp(const double *x, int64_t n, double shift) {
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
 * -Dwerror=true). Every function that does is static to this file, so no call crosses an
 * ABI boundary and the warning says nothing here. */
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

static double f32_fsum(const float *x, int64_t n, bool pf) {
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
static double f32_expsum(const float *x, int64_t n, float sh, float *out) {
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

static int64_t i64_sum(const int64_t *x, int64_t n) {
    uint64_t s = 0; /* unsigned: wraps without undefined behaviour */
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += (uint64_t)x[i];
    return (int64_t)s;
}

static int64_t i64_argext(const int64_t *x, int64_t n, bool is_max, int64_t *val) {
    int64_t m = x[0], k = 0;
    for (int64_t i = 1; i < n; i++)
        if (is_max ? x[i] > m : x[i] < m) m = x[i], k = i;
    *val = m;
    return k;
}

/* ---- partial states --------------------------------------------------------------------------
 * The running result of one output element. Partials are combined in index order, later
 * into earlier:
 *   SUM      d (float compute) or i (int64)
 *   VAR      n elements, mean m, sum of squared deviations d (merged with Chan's formula)
 *   LSE      max m, d = sum exp(x - shift(m)) (rescaled to the larger max when merged)
 *   MAX/MIN  d or i;  ARGMAX/ARGMIN  d or i, and idx */
typedef struct rstate {
    double d, m;
    int64_t i, idx, n;
} rstate;

typedef struct rctx {
    nb__rkind kind;
    ctype ct;
    nb_dtype dt;     /* input dtype */
    size_t es;       /* input element size */
    const char *in;  /* input first element */
    /* the reduced dims (row path: the last is the segment dim) */
    int nr;
    int64_t rshape[NB_MAX_DIMS], rin[NB_MAX_DIMS];
    int64_t R;
    const nb__reduce_args *a; /* the outputs: out, out_dtype, idx, post, den */
} rctx;

/* Shift of the LSE sums: the max, or 0 where it is infinite (then x - max would be NaN for
 * the infinite elements; PyTorch's logsumexp does the same). */
static double lse_shift(double m) { return isinf(m) ? 0.0 : m; }

static rstate st_init(nb__rkind k) {
    rstate s = {0, 0, 0, 0, 0};
    if (k == NB__RK_MAX || k == NB__RK_ARGMAX || k == NB__RK_LSE)
        s.d = -INFINITY, s.i = INT64_MIN;
    if (k == NB__RK_MIN || k == NB__RK_ARGMIN) s.d = INFINITY, s.i = INT64_MAX;
    if (k == NB__RK_LSE) s.d = 0, s.m = -INFINITY;
    return s;
}

/* d * exp(e), where a zero sum stays zero even if exp(e) overflows. */
static double rescale(double d, double e) { return d == 0 ? 0 : d * exp(e); }

static rstate st_combine(nb__rkind k, rstate a, rstate b) {
    switch (k) {
    case NB__RK_SUM:
        a.d += b.d;
        a.i = (int64_t)((uint64_t)a.i + (uint64_t)b.i);
        return a;
    case NB__RK_VAR: {
        if (b.n == 0) return a;
        if (a.n == 0) return b;
        double na = (double)a.n, nb = (double)b.n, n = na + nb, delta = b.m - a.m;
        a.m += delta * (nb / n);
        a.d += b.d + delta * delta * (na * nb / n);
        a.n += b.n;
        return a;
    }
    case NB__RK_LSE: {
        if (isnan(a.m) || isnan(b.m)) return (rstate){.d = NAN, .m = NAN};
        double m = b.m > a.m ? b.m : a.m, sh = lse_shift(m);
        a.d = rescale(a.d, lse_shift(a.m) - sh) + rescale(b.d, lse_shift(b.m) - sh);
        a.m = m;
        return a;
    }
    case NB__RK_MAX:
        a.d = (isnan(a.d) || isnan(b.d)) ? NAN : (b.d > a.d ? b.d : a.d);
        a.i = b.i > a.i ? b.i : a.i;
        return a;
    case NB__RK_MIN:
        a.d = (isnan(a.d) || isnan(b.d)) ? NAN : (b.d < a.d ? b.d : a.d);
        a.i = b.i < a.i ? b.i : a.i;
        return a;
    default: {
        /* b comes later: it wins only when strictly more extreme (first index on ties); a
         * NaN beats every number, and the first NaN stays. The integer field decides for
         * int compute, where d stays at its initial value in both. */
        bool mx = k == NB__RK_ARGMAX;
        bool better = (isnan(b.d) && !isnan(a.d)) || (mx ? b.d > a.d : b.d < a.d) ||
                      (mx ? b.i > a.i : b.i < a.i);
        return better ? b : a;
    }
    }
}

/* Reduce n elements at p (stride st), whose first has reduced index base. Each block is
 * in L1 while its two passes (VAR: mean, then deviations; LSE: max, then exp) run. */
static rstate run_elems(const rctx *c, const char *p, int64_t st, int64_t n, int64_t base,
                        rstate acc) {
    union { float f[RBLK]; double d[RBLK]; int64_t i[RBLK]; } buf;
    for (int64_t o = 0; o < n; o += RBLK) {
        int64_t m = n - o < RBLK ? n - o : RBLK;
        const char *q = p + o * st * (int64_t)c->es;
        rstate b = st_init(c->kind);
        bool mx = c->kind == NB__RK_ARGMAX;
        if (c->ct == CT_F32) {
            const float *x = load_f32(q, c->dt, st, m, buf.f);
            switch (c->kind) {
            case NB__RK_SUM: b.d = f32_fsum(x, m, x != buf.f); break;
            case NB__RK_VAR:
                b.n = m, b.m = f32_fsum(x, m, x != buf.f) / (double)m;
                b.d = f32_sqdev(x, m, b.m);
                break;
            case NB__RK_LSE:
                b.m = f32_max(x, m), b.d = f32_expsum(x, m, (float)lse_shift(b.m), NULL);
                break;
            case NB__RK_MAX: b.d = f32_max(x, m); break;
            case NB__RK_MIN: b.d = f32_min(x, m); break;
            default: {
                float v;
                b.idx = base + o + f32_argext(x, m, mx, &v);
                b.d = v;
            }
            }
        } else if (c->ct == CT_F64) {
            const double *x = load_f64(q, st, m, buf.d);
            switch (c->kind) {
            case NB__RK_SUM: b.d = f64_sum(x, m); break;
            case NB__RK_VAR:
                b.n = m, b.m = f64_sum(x, m) / (double)m, b.d = f64_sqdev(x, m, b.m);
                break;
            case NB__RK_LSE: b.m = f64_max(x, m), b.d = f64_sumexp(x, m, lse_shift(b.m)); break;
            case NB__RK_MAX: b.d = f64_max(x, m); break;
            case NB__RK_MIN: b.d = f64_min(x, m); break;
            default: b.idx = base + o + f64_argext(x, m, mx, &b.d);
            }
        } else {
            const int64_t *x = load_i64(q, c->dt, st, m, buf.i);
            int64_t v;
            switch (c->kind) {
            case NB__RK_SUM: b.i = i64_sum(x, m); break;
            case NB__RK_MAX: case NB__RK_MIN:
                i64_argext(x, m, c->kind == NB__RK_MAX, &v);
                b.i = v;
                break;
            case NB__RK_ARGMAX: case NB__RK_ARGMIN:
                b.idx = base + o + i64_argext(x, m, mx, &v);
                b.i = v;
                break;
            default: NB__ASSERT(!"float-only reduction kind on an integer input");
            }
        }
        acc = st_combine(c->kind, acc, b);
    }
    return acc;
}

/* Reduced linear indices [a, b) of the output element whose input starts at `in`: walks
 * the segments (runs of the innermost reduced dim) that the range covers. */
static rstate reduce_range(const rctx *c, const char *in, int64_t a, int64_t b) {
    rstate acc = st_init(c->kind);
    if (c->kind == NB__RK_SUM && c->dt == NB_F32 && c->nr == 1 && c->rin[0] == 1) {
        /* Dense f32 sums (over the last dim, or whole contiguous tensors): the blocks that
         * run_elems would make, added in the same order, without the per-block state
         * copies (measured ~40% of the time of an in-cache sum over rows of 1024). */
        const float *x = (const float *)in + a;
        for (int64_t o = 0; o < b - a; o += RBLK)
            acc.d += f32_fsum(x + o, b - a - o < RBLK ? b - a - o : RBLK, true);
        return acc;
    }
    int64_t L = c->nr ? c->rshape[c->nr - 1] : 1, st = c->nr ? c->rin[c->nr - 1] : 0;
    while (a < b) {
        int64_t seg = a / L, t = a % L, n = L - t < b - a ? L - t : b - a;
        int64_t off = t * st;
        for (int d = c->nr - 2; d >= 0 && seg; d--) {
            off += (seg % c->rshape[d]) * c->rin[d];
            seg /= c->rshape[d];
        }
        acc = run_elems(c, in + off * (int64_t)c->es, st, n, a, acc);
        a += n;
    }
    return acc;
}

/* ---- storing results ------------------------------------------------------------------------- */
static void finalize(const rctx *c, int64_t off, rstate s) {
    const nb__reduce_args *sp = c->a;
    if (sp->idx) sp->idx[off] = s.idx;
    if (!sp->out) return;
    char *p = sp->out;
    nb_dtype odt = sp->out_dtype;
    if (!nb_dtype_is_float(odt)) { /* integer results: exact, no post-processing */
        switch (odt) {
        case NB_I64: ((int64_t *)p)[off] = s.i; break;
        case NB_I32: ((int32_t *)p)[off] = (int32_t)s.i; break;
        case NB_U8: ((uint8_t *)p)[off] = (uint8_t)s.i; break;
        default: ((uint8_t *)p)[off] = s.i != 0; break;
        }
        return;
    }
    double v = c->ct == CT_I64 ? (double)s.i : s.d;
    if (c->kind == NB__RK_LSE) v = log(s.d) + lse_shift(s.m);
    if (sp->post == NB__RP_DIV) v = v / sp->den;
    else if (sp->post == NB__RP_SQRT_DIV) v = sqrt(v / sp->den);
    switch (odt) {
    case NB_F32: ((float *)p)[off] = (float)v; break;
    case NB_F64: ((double *)p)[off] = v; break;
    case NB_F16: ((uint16_t *)p)[off] = nb_f32_to_f16((float)v); break;
    default: ((uint16_t *)p)[off] = nb_f32_to_bf16((float)v); break;
    }
}

/* ---- geometry ------------------------------------------------------------------------------ */
typedef struct rdim {
    int64_t size, in, out;
    bool red;
} rdim;

/* Sorted, merged dims of x (outer to inner); returns their count. */
static int plan_dims(const nb__view *x, const bool *reduced, rdim *dims) {
    int n = 0;
    int64_t ostride = 1;
    rdim tmp[NB_MAX_DIMS];
    for (int d = x->ndim - 1; d >= 0; d--) { /* output strides: kept dims, contiguous */
        if (x->shape[d] == 1) continue;
        tmp[n] = (rdim){x->shape[d], x->strides[d], reduced[d] ? 0 : ostride, reduced[d]};
        if (!reduced[d]) ostride *= x->shape[d];
        n++;
    }
    /* tmp is inner to outer; insertion-sort by decreasing input stride, stable in the
     * original (outer to inner) order. */
    for (int i = 0; i < n; i++) dims[i] = tmp[n - 1 - i];
    for (int i = 1; i < n; i++) {
        rdim v = dims[i];
        int j = i;
        while (j > 0 && dims[j - 1].in < v.in) dims[j] = dims[j - 1], j--;
        dims[j] = v;
    }
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m > 0) {
            rdim *p = &dims[m - 1];
            const rdim *q = &dims[i];
            if (p->red == q->red && p->in == q->in * q->size &&
                (q->red || p->out == q->out * q->size)) {
                p->size *= q->size;
                p->in = q->in;
                p->out = q->out;
                continue;
            }
        }
        dims[m++] = dims[i];
    }
    return m;
}

/* Input and output element offsets of the i-th combination of dims[0..n) (row-major). */
static void unravel(int64_t i, int n, const int64_t *shape, const int64_t *sa,
                    const int64_t *sb, int64_t *oa, int64_t *ob) {
    int64_t a = 0, b = 0;
    for (int d = n - 1; d >= 0; d--) {
        int64_t k = i % shape[d];
        i /= shape[d];
        a += k * sa[d];
        if (sb) b += k * sb[d];
    }
    *oa = a;
    if (ob) *ob = b;
}

/* ---- row path ------------------------------------------------------------------------------ */
typedef struct row_job {
    const rctx *c;
    int nk;
    const int64_t *kshape, *kin, *kout;
    const char *in; /* few outputs: the current output's input */
    rstate *parts;
    int64_t csize, nch;
} row_job;

/* Few long reductions: chunks [lo, hi) of one output into parts[]. */
static void row_chunks(int64_t lo, int64_t hi, void *p) {
    const row_job *j = p;
    const int64_t R = j->c->R;
    for (int64_t ch = lo; ch < hi; ch++) {
        int64_t b = (ch + 1) * j->csize < R ? (ch + 1) * j->csize : R;
        j->parts[ch] = reduce_range(j->c, j->in, ch * j->csize, b);
    }
}

/* Outputs [lo, hi), each over its chunks in order. */
static void row_outputs(int64_t lo, int64_t hi, void *p) {
    const row_job *j = p;
    const rctx *c = j->c;
    const int64_t R = c->R, csize = j->csize;
    for (int64_t o = lo; o < hi; o++) {
        int64_t ioff, ooff;
        unravel(o, j->nk, j->kshape, j->kin, j->kout, &ioff, &ooff);
        const char *in = c->in + ioff * (int64_t)c->es;
        rstate acc = reduce_range(c, in, 0, R < csize ? R : csize);
        for (int64_t ch = 1; ch < j->nch; ch++) {
            int64_t b = (ch + 1) * csize < R ? (ch + 1) * csize : R;
            acc = st_combine(c->kind, acc, reduce_range(c, in, ch * csize, b));
        }
        finalize(c, ooff, acc);
    }
}

static void row_path(const rctx *c, int nk, const int64_t *kshape, const int64_t *kin,
                     const int64_t *kout, int64_t nout) {
    int64_t R = c->R;
    int64_t csize = (R + MAX_CHUNKS - 1) / MAX_CHUNKS;
    csize = (csize + RBLK - 1) / RBLK * RBLK;
    if (csize < CHUNK_MIN) csize = CHUNK_MIN;
    int64_t nch = (R + csize - 1) / csize;
    int nt = nb__threads_for(nout * R, NB__GRAIN);
    if (nch > 1 && nout < 4 * (int64_t)nt) {
        /* Few long reductions: threads share each output's chunks. */
        for (int64_t o = 0; o < nout; o++) {
            int64_t ioff, ooff;
            unravel(o, nk, kshape, kin, kout, &ioff, &ooff);
            rstate parts[MAX_CHUNKS];
            row_job j = {.c = c, .in = c->in + ioff * (int64_t)c->es, .parts = parts,
                         .csize = csize, .nch = nch};
            nb__parallel_range(nch, nt, row_chunks, &j);
            rstate acc = parts[0];
            for (int64_t ch = 1; ch < nch; ch++) acc = st_combine(c->kind, acc, parts[ch]);
            finalize(c, ooff, acc);
        }
        return;
    }
    row_job j = {.c = c, .nk = nk, .kshape = kshape, .kin = kin, .kout = kout,
                 .csize = csize, .nch = nch};
    nb__parallel_range(nout, nt, row_outputs, &j);
}

/* ---- column path ----------------------------------------------------------------------------
 * One task: w <= COLW adjacent outputs (the innermost kept dim, input stride sin) of group
 * g; every reduced position r adds one row piece of w elements, in order r = 0, 1, ...
 * VAR and LSE take two passes over the task's rows (the mean / max first). */
typedef struct colgeo {
    int64_t D, sin, sout;  /* innermost kept dim */
    int ng;                /* the other kept dims */
    const int64_t *gshape, *gin, *gout;
} colgeo;

typedef enum cpass { CP_SUM, CP_SQDEV, CP_SUMEXP, CP_MAX, CP_MIN, CP_ARGMAX, CP_ARGMIN } cpass;

/* Per-column accumulators of a task. */
typedef struct colacc {
    double d[COLW];  /* sums; f64 extremes */
    float f[COLW];   /* f32 extremes */
    int64_t i[COLW]; /* int64 sums / extremes */
    int64_t ix[COLW];
    double pm[COLW]; /* SQDEV: the mean; SUMEXP: the shift */
    float pf[COLW];
} colacc;

static void advance(int nr, const int64_t *shape, const int64_t *st, int64_t *idx,
                    int64_t *off) {
    for (int d = nr - 1; d >= 0; d--) {
        *off += st[d];
        if (++idx[d] < shape[d]) return;
        *off -= st[d] * shape[d];
        idx[d] = 0;
    }
}

/* CP_SUM of dense f32 or bf16 row pieces under one reduced dim (row stride rs elements):
 * strips of 32 columns, each summed over all the rows in registers. Every column still adds
 * its rows in the order r = 0, 1, ... into a double starting at 0, so the sums are the
 * general loop's bits; the general loop keeps its COLW accumulators in memory and converts
 * bf16 through a buffer, which made the bias gradients' column sums compute-bound. */
#define STRIP 32
static void col_sum_strips(const char *in, nb_dtype dt, int64_t R, int64_t rs, int64_t w,
                           double *da) {
    for (int64_t j0 = 0; j0 < w; j0 += STRIP) {
        const int64_t nw = w - j0 < STRIP ? w - j0 : STRIP;
        double acc[STRIP] = {0};
        if (nw < STRIP) { /* the last, narrow strip */
            for (int64_t r = 0; r < R; r++)
                for (int64_t l = 0; l < nw; l++) {
                    float f;
                    if (dt == NB_BF16) {
                        uint32_t u = (uint32_t)((const uint16_t *)in)[r * rs + j0 + l] << 16;
                        memcpy(&f, &u, sizeof f);
                    } else {
                        f = ((const float *)in)[r * rs + j0 + l];
                    }
                    acc[l] += f;
                }
        } else if (dt == NB_BF16) {
            const uint16_t *q = (const uint16_t *)in + j0;
            for (int64_t r = 0; r < R; r++, q += rs) {
                float f[STRIP];
                for (int l = 0; l < STRIP; l++) {
                    uint32_t u = (uint32_t)q[l] << 16;
                    memcpy(&f[l], &u, sizeof(float));
                }
                for (int l = 0; l < STRIP; l++) acc[l] += f[l];
            }
        } else {
            const float *q = (const float *)in + j0;
            for (int64_t r = 0; r < R; r++, q += rs)
                for (int l = 0; l < STRIP; l++) acc[l] += q[l];
        }
        memcpy(da + j0, acc, sizeof(double) * (size_t)nw);
    }
}

static void col_pass(const rctx *c, const char *in, int64_t sin, int64_t w, cpass k,
                     colacc *A) {
    if (k == CP_SUM && sin == 1 && c->nr == 1 && (c->dt == NB_F32 || c->dt == NB_BF16)) {
        for (int64_t j = 0; j < w; j++) A->f[j] = 0, A->i[j] = 0, A->ix[j] = 0;
        col_sum_strips(in, c->dt, c->R, c->rin[0], w, A->d);
        return;
    }
    bool mx = k == CP_MAX || k == CP_ARGMAX;
    double init = k == CP_MAX || k == CP_ARGMAX ? -INFINITY
                  : k == CP_MIN || k == CP_ARGMIN ? INFINITY : 0;
    for (int64_t j = 0; j < w; j++) {
        A->d[j] = init, A->f[j] = (float)init, A->ix[j] = 0;
        A->i[j] = k == CP_SUM ? 0 : mx ? INT64_MIN : INT64_MAX;
    }
    double *da = A->d, *pm = A->pm;
    float *fa = A->f, *pf = A->pf;
    int64_t *ia = A->i, *ix = A->ix;
    union { float f[COLW]; double d[COLW]; int64_t i[COLW]; } buf;
    int64_t ridx[NB_MAX_DIMS] = {0}, roff = 0;
    for (int64_t r = 0; r < c->R; r++) {
        const char *p = in + roff * (int64_t)c->es;
        if (c->ct == CT_F32) {
            const float *x = load_f32(p, c->dt, sin, w, buf.f);
            switch (k) {
            case CP_SUM:
#pragma omp simd
                for (int64_t j = 0; j < w; j++) da[j] += x[j];
                break;
            case CP_SQDEV:
#pragma omp simd
                for (int64_t j = 0; j < w; j++) {
                    double d = (double)x[j] - pm[j];
                    da[j] += d * d;
                }
                break;
            case CP_SUMEXP:
#pragma omp simd
                for (int64_t j = 0; j < w; j++) da[j] += nb__fast_expf(x[j] - pf[j]);
                break;
            case CP_MAX: case CP_MIN:
#pragma omp simd
                for (int64_t j = 0; j < w; j++) {
                    bool b = (mx ? x[j] > fa[j] : x[j] < fa[j]) || x[j] != x[j];
                    fa[j] = b ? x[j] : fa[j];
                }
                break;
            default:
#pragma omp simd
                for (int64_t j = 0; j < w; j++) {
                    bool b = (mx ? x[j] > fa[j] : x[j] < fa[j]) ||
                             (x[j] != x[j] && fa[j] == fa[j]);
                    fa[j] = b ? x[j] : fa[j];
                    ix[j] = b ? r : ix[j];
                }
            }
        } else if (c->ct == CT_F64) {
            const double *x = load_f64(p, sin, w, buf.d);
            switch (k) {
            case CP_SUM:
                for (int64_t j = 0; j < w; j++) da[j] += x[j];
                break;
            case CP_SQDEV:
                for (int64_t j = 0; j < w; j++) da[j] += (x[j] - pm[j]) * (x[j] - pm[j]);
                break;
            case CP_SUMEXP:
                for (int64_t j = 0; j < w; j++) da[j] += exp(x[j] - pm[j]);
                break;
            case CP_MAX: case CP_MIN:
                for (int64_t j = 0; j < w; j++) {
                    bool b = (mx ? x[j] > da[j] : x[j] < da[j]) || x[j] != x[j];
                    da[j] = b ? x[j] : da[j];
                }
                break;
            default:
                for (int64_t j = 0; j < w; j++) {
                    bool b = (mx ? x[j] > da[j] : x[j] < da[j]) ||
                             (x[j] != x[j] && da[j] == da[j]);
                    da[j] = b ? x[j] : da[j];
                    ix[j] = b ? r : ix[j];
                }
            }
        } else {
            const int64_t *x = load_i64(p, c->dt, sin, w, buf.i);
            if (k == CP_SUM) {
                for (int64_t j = 0; j < w; j++)
                    ia[j] = (int64_t)((uint64_t)ia[j] + (uint64_t)x[j]);
            } else {
                for (int64_t j = 0; j < w; j++) {
                    bool b = mx ? x[j] > ia[j] : x[j] < ia[j];
                    ia[j] = b ? x[j] : ia[j];
                    ix[j] = b ? r : ix[j];
                }
            }
        }
        advance(c->nr, c->rshape, c->rin, ridx, &roff);
    }
    if (c->ct == CT_F32 && k >= CP_MAX) /* f32 extremes are reported in d */
        for (int64_t j = 0; j < w; j++) da[j] = fa[j];
}

static void col_task(const rctx *c, const colgeo *g, int64_t grp, int64_t j0, int64_t w) {
    int64_t goff_in, goff_out;
    unravel(grp, g->ng, g->gshape, g->gin, g->gout, &goff_in, &goff_out);
    const char *in = c->in + (goff_in + j0 * g->sin) * (int64_t)c->es;
    int64_t obase = goff_out + j0 * g->sout;
    colacc A;
    double first[COLW]; /* VAR: the mean; LSE: the max */
    switch (c->kind) {
    case NB__RK_SUM: col_pass(c, in, g->sin, w, CP_SUM, &A); break;
    case NB__RK_VAR:
        col_pass(c, in, g->sin, w, CP_SUM, &A);
        for (int64_t j = 0; j < w; j++) A.pm[j] = first[j] = A.d[j] / (double)c->R;
        col_pass(c, in, g->sin, w, CP_SQDEV, &A);
        break;
    case NB__RK_LSE:
        col_pass(c, in, g->sin, w, CP_MAX, &A);
        for (int64_t j = 0; j < w; j++) {
            first[j] = A.d[j];
            A.pm[j] = lse_shift(A.d[j]), A.pf[j] = (float)A.pm[j];
        }
        col_pass(c, in, g->sin, w, CP_SUMEXP, &A);
        break;
    case NB__RK_MAX: col_pass(c, in, g->sin, w, CP_MAX, &A); break;
    case NB__RK_MIN: col_pass(c, in, g->sin, w, CP_MIN, &A); break;
    case NB__RK_ARGMAX: col_pass(c, in, g->sin, w, CP_ARGMAX, &A); break;
    case NB__RK_ARGMIN: col_pass(c, in, g->sin, w, CP_ARGMIN, &A); break;
    }
    bool two = c->kind == NB__RK_VAR || c->kind == NB__RK_LSE;
    for (int64_t j = 0; j < w; j++) {
        rstate s = {.d = A.d[j], .m = two ? first[j] : 0, .i = A.i[j], .idx = A.ix[j]};
        finalize(c, obase + j * g->sout, s);
    }
}

typedef struct col_job {
    const rctx *c;
    const colgeo *g;
    int64_t nb, W;
} col_job;

static void col_run(int64_t t, void *p) {
    const col_job *j = p;
    int64_t j0 = (t % j->nb) * j->W;
    col_task(j->c, j->g, t / j->nb, j0, j->g->D - j0 < j->W ? j->g->D - j0 : j->W);
}

static void col_path(const rctx *c, int nk, const int64_t *kshape, const int64_t *kin,
                     const int64_t *kout, int64_t nout) {
    colgeo g = {kshape[nk - 1], kin[nk - 1], kout[nk - 1], nk - 1, kshape, kin, kout};
    int64_t ngrp = nout / g.D;
    int nt = nb__threads_for(nout * c->R, NB__GRAIN);
    /* The block width only splits work (each output's order is r = 0, 1, ...), so it may
     * depend on the thread count: narrow it until every thread has a task. */
    int64_t W = COLW;
    while (W > 16 && ngrp * ((g.D + W - 1) / W) < 2 * nt) W /= 2;
    int64_t nb = (g.D + W - 1) / W;
    col_job j = {c, &g, nb, W};
    nb__run_tasks(ngrp * nb, nt, col_run, &j);
}

nb_status nb__cpu_reduce(const nb__reduce_args *a) {
    const nb__view *x = &a->x;
    const bool *reduced = a->reduced;
    rctx c = {.kind = a->kind, .ct = ctype_of(x->dtype), .dt = x->dtype,
              .es = nb_dtype_size(x->dtype), .in = x->data, .a = a};
    int64_t nout = 1, R = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (reduced[d]) R *= x->shape[d];
        else nout *= x->shape[d];
    }
    c.R = R;
    if (nout == 0) return NB_OK;
    if (R == 0) { /* empty reductions: the initial state of every output */
        for (int64_t o = 0; o < nout; o++) finalize(&c, o, st_init(c.kind));
        return NB_OK;
    }
    rdim dims[NB_MAX_DIMS];
    int n = plan_dims(x, reduced, dims);
    int nk = 0;
    int64_t kshape[NB_MAX_DIMS], kin[NB_MAX_DIMS], kout[NB_MAX_DIMS];
    for (int i = 0; i < n; i++) {
        if (dims[i].red) {
            c.rshape[c.nr] = dims[i].size, c.rin[c.nr] = dims[i].in, c.nr++;
        } else {
            kshape[nk] = dims[i].size, kin[nk] = dims[i].in, kout[nk] = dims[i].out, nk++;
        }
    }
    /* Short innermost reductions (a few elements per output, e.g. (N, 4) over the last
     * dim) cost more in per-output overhead than in arithmetic on the row path; the
     * column path takes them W outputs at a time with strided loads instead. The choice
     * depends only on the shape, so results stay independent of the thread count. */
    bool inner_kept = n > 0 && !dims[n - 1].red;
    bool short_rows = !inner_kept && nk > 0 && c.nr > 0 && c.rshape[c.nr - 1] < 16 &&
                      kshape[nk - 1] >= 16;
    if (inner_kept || short_rows) col_path(&c, nk, kshape, kin, kout, nout);
    else row_path(&c, nk, kshape, kin, kout, nout);
    return NB_OK;
}


/* ---- softmax ------------------------------------------------------------------------------
 * The input is seen as (O, L, D) with the softmax dim in the middle. D == 1: each row is
 * dense; f32 rows get a max pass, a pass writing exp(x - max) and summing it, and a scaling
 * pass over the output while it sits in cache (f64 and half rows: max, sum of exp, write).
 * D > 1: blocks of W columns get max, sum of exp, write, vectorized across the columns. A NaN
 * makes its whole row NaN and a row of -inf gives NaN, as in PyTorch. x may alias y: every
 * pass reads an element before the last pass writes it. */

/* Max of a dense f32 row, NaNs ignored: softmax needs no NaN flag, since a NaN makes the sum
 * of exps NaN and with it every output of its row, whatever the max is. This is the pass
 * that reads the row from memory, so it prefetches. */
typedef int32_t nb__v16i __attribute__((vector_size(64)));

static inline nb__v16f vmax(nb__v16f a, nb__v16f b) {
    nb__v16i c = b > a;
    return (nb__v16f)((c & (nb__v16i)b) | (~c & (nb__v16i)a));
}

static float f32_rowmax(const float *x, int64_t n) {
    nb__v16f m0 = (nb__v16f){0} - INFINITY, m1 = m0, m2 = m0, m3 = m0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        pf_block(x + i, 64 * sizeof(float));
        m0 = vmax(m0, vld(x + i)), m1 = vmax(m1, vld(x + i + 16));
        m2 = vmax(m2, vld(x + i + 32)), m3 = vmax(m3, vld(x + i + 48));
    }
    for (; i + 16 <= n; i += 16) m0 = vmax(m0, vld(x + i));
    float a[16];
    m0 = vmax(vmax(m0, m1), vmax(m2, m3));
    memcpy(a, &m0, sizeof a);
    float m = a[0];
    for (int k = 1; k < 16; k++) m = a[k] > m ? a[k] : m;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* The max; exp(x - max) written to y (log_softmax: only summed) and summed; then the scaling
 * pass over y, still in cache for rows that fit it. */
static void softmax_row_f32(const float *x, float *y, int64_t L, bool lg) {
    float m = f32_rowmax(x, L);
    double s = f32_expsum(x, L, m, lg ? NULL : y);
    if (!lg) {
        float inv = (float)(1.0 / s);
#pragma omp simd simdlen(16)
        for (int64_t i = 0; i < L; i++) y[i] *= inv;
    } else {
        float ls = (float)log(s);
#pragma omp simd simdlen(16)
        for (int64_t i = 0; i < L; i++) y[i] = (x[i] - m) - ls;
    }
}

static void softmax_row_f64(const double *x, double *y, int64_t L, bool lg) {
    double m = f64_max(x, L), s = f64_sumexp(x, L, m);
    if (!lg) {
        double inv = 1.0 / s;
        for (int64_t i = 0; i < L; i++) y[i] = exp(x[i] - m) * inv;
    } else {
        double ls = log(s);
        for (int64_t i = 0; i < L; i++) y[i] = (x[i] - m) - ls;
    }
}

static void store_f32_as(char *dst, nb_dtype dt, const float *src, int64_t n) {
    if (dt == NB_F32) memcpy(dst, src, (size_t)n * sizeof(float));
    else if (dt == NB_F16) nb__f32_to_f16_n(src, (uint16_t *)dst, n);
    else nb__f32_to_bf16_n(src, (uint16_t *)dst, n);
}

/* f16 / bf16 rows: blocks converted to f32 on the stack; exp is recomputed in the last pass
 * so the only rounding to the half type is the final one. */
static void softmax_row_half(const char *x, char *y, nb_dtype dt, int64_t L, bool lg) {
    float buf[RBLK];
    float m = -INFINITY;
    for (int64_t o = 0; o < L; o += RBLK) {
        int64_t n = L - o < RBLK ? L - o : RBLK;
        float b = f32_max(load_f32(x + o * 2, dt, 1, n, buf), n);
        m = (m != m || b != b) ? NAN : (b > m ? b : m);
    }
    double s = 0;
    for (int64_t o = 0; o < L; o += RBLK) {
        int64_t n = L - o < RBLK ? L - o : RBLK;
        s += f32_expsum(load_f32(x + o * 2, dt, 1, n, buf), n, m, NULL);
    }
    float inv = (float)(1.0 / s), ls = (float)log(s);
    for (int64_t o = 0; o < L; o += RBLK) {
        int64_t n = L - o < RBLK ? L - o : RBLK;
        load_f32(x + o * 2, dt, 1, n, buf);
        if (!lg) {
#pragma omp simd
            for (int64_t i = 0; i < n; i++) buf[i] = nb__fast_expf(buf[i] - m) * inv;
        } else {
#pragma omp simd
            for (int64_t i = 0; i < n; i++) buf[i] = (buf[i] - m) - ls;
        }
        store_f32_as(y + o * 2, dt, buf, n);
    }
}

/* Columns [0, w) of L rows of stride D elements starting at x / y (f32, f16, bf16). */
static void softmax_cols_f32(const char *x, char *y, nb_dtype dt, int64_t L, int64_t D,
                             int64_t w, bool lg) {
    int64_t rs = D * (int64_t)nb_dtype_size(dt);
    float m[COLW], a[COLW], buf[COLW], ob[COLW];
    double s[COLW];
    for (int64_t j = 0; j < w; j++) m[j] = -INFINITY, s[j] = 0;
    for (int64_t l = 0; l < L; l++) {
        const float *r = load_f32(x + l * rs, dt, 1, w, buf);
#pragma omp simd
        for (int64_t j = 0; j < w; j++) m[j] = (r[j] > m[j] || r[j] != r[j]) ? r[j] : m[j];
    }
    for (int64_t l = 0; l < L; l++) {
        const float *r = load_f32(x + l * rs, dt, 1, w, buf);
#pragma omp simd
        for (int64_t j = 0; j < w; j++) s[j] += nb__fast_expf(r[j] - m[j]);
    }
    for (int64_t j = 0; j < w; j++) a[j] = lg ? (float)log(s[j]) : (float)(1.0 / s[j]);
    for (int64_t l = 0; l < L; l++) {
        const float *r = load_f32(x + l * rs, dt, 1, w, buf);
        if (!lg) {
#pragma omp simd
            for (int64_t j = 0; j < w; j++) ob[j] = nb__fast_expf(r[j] - m[j]) * a[j];
        } else {
#pragma omp simd
            for (int64_t j = 0; j < w; j++) ob[j] = (r[j] - m[j]) - a[j];
        }
        store_f32_as(y + l * rs, dt, ob, w);
    }
}

static void softmax_cols_f64(const double *x, double *y, int64_t L, int64_t D, int64_t w,
                             bool lg) {
    double m[COLW], s[COLW];
    for (int64_t j = 0; j < w; j++) m[j] = -INFINITY, s[j] = 0;
    for (int64_t l = 0; l < L; l++)
        for (int64_t j = 0; j < w; j++) {
            double v = x[l * D + j];
            m[j] = (v > m[j] || v != v) ? v : m[j];
        }
    for (int64_t l = 0; l < L; l++)
        for (int64_t j = 0; j < w; j++) s[j] += exp(x[l * D + j] - m[j]);
    for (int64_t j = 0; j < w; j++) s[j] = lg ? log(s[j]) : 1.0 / s[j];
    for (int64_t l = 0; l < L; l++)
        for (int64_t j = 0; j < w; j++) {
            double v = x[l * D + j] - m[j];
            y[l * D + j] = lg ? v - s[j] : exp(v) * s[j];
        }
}

typedef struct softmax_job {
    const char *xp;
    char *yp;
    nb_dtype dt;
    int64_t es, L, D, W, nb;
    bool lg;
} softmax_job;

/* D == 1: dense rows o in [lo, hi). */
static void softmax_rows(int64_t lo, int64_t hi, void *p) {
    const softmax_job *j = p;
    const int64_t L = j->L, es = j->es;
    for (int64_t o = lo; o < hi; o++) {
        const char *xr = j->xp + o * L * es;
        char *yr = j->yp + o * L * es;
        if (j->dt == NB_F32) softmax_row_f32((const float *)xr, (float *)yr, L, j->lg);
        else if (j->dt == NB_F64) softmax_row_f64((const double *)xr, (double *)yr, L, j->lg);
        else softmax_row_half(xr, yr, j->dt, L, j->lg);
    }
}

/* D > 1: blocks t in [lo, hi) of W columns of one outer index. */
static void softmax_blocks(int64_t lo, int64_t hi, void *p) {
    const softmax_job *j = p;
    const int64_t L = j->L, D = j->D, W = j->W, es = j->es;
    for (int64_t t = lo; t < hi; t++) {
        int64_t o = t / j->nb, j0 = (t % j->nb) * W, w = D - j0 < W ? D - j0 : W;
        int64_t off = (o * L * D + j0) * es;
        if (j->dt == NB_F64)
            softmax_cols_f64((const double *)(j->xp + off), (double *)(j->yp + off), L, D, w,
                             j->lg);
        else softmax_cols_f32(j->xp + off, j->yp + off, j->dt, L, D, w, j->lg);
    }
}

nb_status nb__cpu_softmax(const nb__softmax_args *a) {
    int64_t O = a->outer, L = a->len, D = a->inner;
    if (O * L * D == 0) return NB_OK;
    bool lg = a->log;
    nb_dtype dt = a->dtype;
    int64_t es = (int64_t)nb_dtype_size(dt);
    const char *xp = a->x;
    char *yp = a->y;
    int nt = nb__threads_for(O * L * D, NB__GRAIN);
    softmax_job j = {.xp = xp, .yp = yp, .dt = dt, .es = es, .L = L, .D = D, .lg = lg};
    if (D == 1) {
        nb__parallel_range(O, nt, softmax_rows, &j);
        return NB_OK;
    }
    int64_t W = COLW;
    while (W > 16 && O * ((D + W - 1) / W) < 2 * nt) W /= 2;
    j.W = W, j.nb = (D + W - 1) / W;
    nb__parallel_range(O * j.nb, nt, softmax_blocks, &j);
    return NB_OK;
}

/* The family's entries of the kernel table (the backward kernels are in cpu/reduce_back.c). */
void nb__cpu_register_reduce(nb__kernels *k) {
    k->reduce = nb__cpu_reduce;
    k->softmax = nb__cpu_softmax;
    k->softmax_backward = nb__cpu_softmax_backward;
    k->extreme_backward = nb__cpu_extreme_backward;
}
