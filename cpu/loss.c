/* cpu/loss.c - CPU kernels of the losses (tensor/kernels/loss.h): fused log-softmax + NLL
 * (cross entropy) forward and backward, NLL, binary cross entropy with logits, each
 * reducing with a fixed-order sum. The class-index kernels validate the targets first (one
 * sequential scan, which also counts the positions not ignored), so an out-of-range target
 * fails before anything is written.
 *
 * Cross entropy layout: the scores are (N, C, D) with the class dim in the middle.
 *   - D == 1 ((N, C) logits, the usual classifier head): every row is dense; it is read in
 *     blocks of BLK elements (converted to f32 for half types) in two passes, max and sum
 *     of exp, then the loss is formed from the target's score. The backward is one pass
 *     per row writing (softmax - target distribution) * scale.
 *   - D > 1 ((N, C, H, W) segmentation-style maps): blocks of up to COLW adjacent
 *     positions are processed together; each class contributes a dense run of the block's
 *     width, so the inner loops are vectors over positions.
 * Only the per-position log-sum-exp is kept for the backward (N * D values): no (N, C)
 * temporary besides the gradient itself.
 *
 * Determinism (docs/architecture.md rule 5): rows are split over threads (nabla's workers,
 * nb__parallel_range), but each row's sums run in a fixed order, and sums over positions go
 * through loss_sum, whose order depends only on the count. */
#include <math.h>
#include <string.h>

#include "cpu/backend.h"
#include "cpu/cpu_impl.h"
#include "cpu/fastmath.h"
#include "nabla/memory.h"

#define BLK 512   /* row block (stack buffers of 2-4 KiB)               */
#define COLW 64   /* positions per column block of the D > 1 path       */
#define SUMB 256  /* most partial sums loss_sum and the BCE use */

/* exp is nb__fast_expf (cpu/fastmath.h). */

static inline double ce_exp(double x) { return exp(x); }

/* ---- loads and stores in the compute type ------------------------------------------------- */
/* n contiguous elements at p as f32: p itself for f32, else converted into buf. */
static inline const float *ld_f32(const char *p, nb_dtype dt, int64_t n, float *buf) {
    if (dt == NB_F32) return (const float *)p;
    if (dt == NB_F16) nb__f16_to_f32_n((const uint16_t *)p, buf, n);
    else nb__bf16_to_f32_n((const uint16_t *)p, buf, n);
    return buf;
}
static inline const double *ld_f64(const char *p, nb_dtype dt, int64_t n, double *buf) {
    (void)dt, (void)n, (void)buf;
    return (const double *)p;
}
/* Where to compute n output elements destined for p: p itself, or buf (then fl_* stores). */
static inline float *wr_f32(char *p, nb_dtype dt, float *buf) {
    return dt == NB_F32 ? (float *)p : buf;
}
static inline double *wr_f64(char *p, nb_dtype dt, double *buf) {
    (void)dt, (void)buf;
    return (double *)p;
}
static inline void fl_f32(char *p, nb_dtype dt, const float *v, int64_t n) {
    if (dt == NB_F16) nb__f32_to_f16_n(v, (uint16_t *)p, n);
    else if (dt == NB_BF16) nb__f32_to_bf16_n(v, (uint16_t *)p, n);
}
static inline void fl_f64(char *p, nb_dtype dt, const double *v, int64_t n) {
    (void)p, (void)dt, (void)v, (void)n;
}

/* One element of a float array of dtype dt, as a double. */
static inline double elem(const char *x, nb_dtype dt, int64_t i) {
    switch (dt) {
    case NB_F32: return ((const float *)x)[i];
    case NB_F64: return ((const double *)x)[i];
    case NB_F16: return nb_f16_to_f32(((const uint16_t *)x)[i]);
    default: return nb_bf16_to_f32(((const uint16_t *)x)[i]);
    }
}

static inline int64_t tgt_at(const nb__cls_operands *a, int64_t p) {
    return a->tdt == NB_I64 ? ((const int64_t *)a->target)[p]
                            : (int64_t)((const int32_t *)a->target)[p];
}
static inline bool is_ignored(const nb__cls_operands *a, int64_t t) {
    return a->has_ignore && t == a->ignore_index;
}

static int threads_for(int64_t work) {
    int nt = nb__threads_for(work, NB__GRAIN);
    return nt < 1 ? 1 : nt;
}

/* Row pieces, kept out of line (GCC does not vectorize them once inlined into the
 * dtype-dispatching row loops). f64 sums accumulate in a fixed (lane-wise, then combined)
 * order that depends only on n. */
#define NB__OUTLINE __attribute__((noinline))
NB__OUTLINE static float rmax_sum_f32(const float *restrict b, int64_t n, float m, double *sx) {
    double s = 0;
#pragma omp simd reduction(max : m) reduction(+ : s)
    for (int64_t i = 0; i < n; i++) {
        m = b[i] > m ? b[i] : m;
        s += (double)b[i];
    }
    *sx += s;
    return m;
}
NB__OUTLINE static double rmax_sum_f64(const double *restrict b, int64_t n, double m, double *sx) {
    double s = 0;
#pragma omp simd reduction(max : m) reduction(+ : s)
    for (int64_t i = 0; i < n; i++) {
        m = b[i] > m ? b[i] : m;
        s += b[i];
    }
    *sx += s;
    return m;
}
NB__OUTLINE static double rsumexp_f32(const float *restrict b, int64_t n, float m) {
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += (double)nb__fast_expf(b[i] - m);
    return s;
}
NB__OUTLINE static double rsumexp_f64(const double *restrict b, int64_t n, double m) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += exp(b[i] - m);
    return s;
}
/* o = (exp(b - l) - off) * sc */
NB__OUTLINE static void rgrad_f32(const float *restrict b, float *restrict o, int64_t n, float l,
                      float off, float sc) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) o[i] = (nb__fast_expf(b[i] - l) - off) * sc;
}
NB__OUTLINE static void rgrad_f64(const double *restrict b, double *restrict o, int64_t n, double l,
                      double off, double sc) {
    for (int64_t i = 0; i < n; i++) o[i] = (exp(b[i] - l) - off) * sc;
}

/* The loss of one position from its log-sum-exp l, target score xt and score sum sx. */
static inline double ce_finish(const nb__cls_operands *a, double l, double xt, double sx) {
    double s = a->smoothing, r = (1 - s) * (l - xt);
    /* Skipped at s == 0, so a -inf score elsewhere in the row does not give 0 * inf. */
    if (s > 0) r += s * (l - sx / (double)a->C);
    return r;
}

/* Scan the targets in order: NB_OK with *count the number of positions that are not
 * ignored, or NB_EINDEX naming the first target that is neither ignored nor in [0, C). */
static nb_status check_targets(const char *op, const nb__cls_operands *a, int64_t *count) {
    int64_t P = a->N * a->D, n = 0;
    for (int64_t p = 0; p < P; p++) {
        int64_t t = tgt_at(a, p);
        if (is_ignored(a, t)) continue;
        if (t < 0 || t >= a->C)
            return nb__error(NB_EINDEX, "%s: target %lld is out of range for %lld classes", op,
                             (long long)t, (long long)a->C);
        n++;
    }
    *count = n;
    return NB_OK;
}

/* ---- cross entropy, stamped for the two compute types -------------------------------------
 * T: compute type; S: suffix of the load/store helpers; EXP: exp in T. */
#define NB__CE_KERNELS(T, S, EXP)                                                          \
    static void ce_rows_fwd_##S(const nb__cls_operands *a, int64_t n, double *loss, T *lse) { \
        const int64_t C = a->C, es = (int64_t)nb_dtype_size(a->xdt);                      \
        const char *xr = a->x + n * C * es;                                                \
        int64_t t = tgt_at(a, n);                                                          \
        if (is_ignored(a, t)) {                                                            \
            loss[n] = 0;                                                                   \
            lse[n] = 0;                                                                    \
            return;                                                                        \
        }                                                                                  \
        T buf[BLK], m = -INFINITY;                                                         \
        double sx = 0, s = 0;                                                              \
        for (int64_t c0 = 0; c0 < C; c0 += BLK) {                                          \
            int64_t k = C - c0 < BLK ? C - c0 : BLK;                                       \
            m = rmax_sum_##S(ld_##S(xr + c0 * es, a->xdt, k, buf), k, m, &sx);             \
        }                                                                                  \
        for (int64_t c0 = 0; c0 < C; c0 += BLK) {                                          \
            int64_t k = C - c0 < BLK ? C - c0 : BLK;                                       \
            s += rsumexp_##S(ld_##S(xr + c0 * es, a->xdt, k, buf), k, m);                  \
        }                                                                                  \
        double l = (double)m + log(s);                                                     \
        loss[n] = ce_finish(a, l, elem(xr, a->xdt, t), sx);                                \
        lse[n] = (T)l;                                                                     \
    }                                                                                      \
                                                                                           \
    static void ce_cols_fwd_##S(const nb__cls_operands *a, int64_t n, int64_t d0, int64_t w,  \
                                double *loss, T *lse) {                                    \
        const int64_t C = a->C, D = a->D, es = (int64_t)nb_dtype_size(a->xdt);            \
        const char *xb = a->x + (n * C * D + d0) * es;                                     \
        T buf[COLW], m[COLW];                                                              \
        double s[COLW], sx[COLW];                                                          \
        for (int64_t j = 0; j < w; j++) m[j] = -INFINITY, s[j] = 0, sx[j] = 0;             \
        for (int64_t c = 0; c < C; c++) {                                                  \
            const T *b = ld_##S(xb + c * D * es, a->xdt, w, buf);                          \
            _Pragma("omp simd")                                                            \
            for (int64_t j = 0; j < w; j++) {                                              \
                m[j] = b[j] > m[j] ? b[j] : m[j];                                          \
                sx[j] += b[j];                                                             \
            }                                                                              \
        }                                                                                  \
        for (int64_t c = 0; c < C; c++) {                                                  \
            const T *b = ld_##S(xb + c * D * es, a->xdt, w, buf);                          \
            _Pragma("omp simd")                                                            \
            for (int64_t j = 0; j < w; j++) s[j] += (double)EXP(b[j] - m[j]);              \
        }                                                                                  \
        for (int64_t j = 0; j < w; j++) {                                                  \
            int64_t p = n * D + d0 + j, t = tgt_at(a, p);                                  \
            if (is_ignored(a, t)) {                                                        \
                loss[p] = 0;                                                               \
                lse[p] = 0;                                                                \
                continue;                                                                  \
            }                                                                              \
            double l = (double)m[j] + log(s[j]);                                           \
            loss[p] = ce_finish(a, l, elem(xb, a->xdt, t * D + j), sx[j]);                 \
            lse[p] = (T)l;                                                                 \
        }                                                                                  \
    }                                                                                      \
                                                                                           \
    static void ce_rows_bwd_##S(const nb__cls_operands *a, int64_t n, const T *lse,           \
                                const double *g, int64_t gs, double factor, char *dx) {    \
        const int64_t C = a->C, es = (int64_t)nb_dtype_size(a->xdt);                      \
        const char *xr = a->x + n * C * es;                                                \
        char *dr = dx + n * C * es;                                                        \
        int64_t t = tgt_at(a, n);                                                          \
        if (is_ignored(a, t)) {                                                            \
            memset(dr, 0, (size_t)(C * es));                                               \
            return;                                                                        \
        }                                                                                  \
        const T sc = (T)(factor * g[n * gs]), l = lse[n];                                  \
        const T off = (T)(a->smoothing / (double)C), hit = (T)(1 - a->smoothing);          \
        T buf[BLK], obuf[BLK];                                                             \
        for (int64_t c0 = 0; c0 < C; c0 += BLK) {                                          \
            int64_t k = C - c0 < BLK ? C - c0 : BLK;                                       \
            const T *b = ld_##S(xr + c0 * es, a->xdt, k, buf);                             \
            T *o = wr_##S(dr + c0 * es, a->xdt, obuf);                                     \
            rgrad_##S(b, o, k, l, off, sc);                                                \
            if (t >= c0 && t < c0 + k) o[t - c0] = (EXP(b[t - c0] - l) - off - hit) * sc;  \
            fl_##S(dr + c0 * es, a->xdt, o, k);                                            \
        }                                                                                  \
    }                                                                                      \
                                                                                           \
    static void ce_cols_bwd_##S(const nb__cls_operands *a, int64_t n, int64_t d0, int64_t w,  \
                                const T *lse, const double *g, int64_t gs, double factor,  \
                                char *dx) {                                                \
        const int64_t C = a->C, D = a->D, es = (int64_t)nb_dtype_size(a->xdt);            \
        const int64_t base = (n * C * D + d0) * es;                                        \
        const T off = (T)(a->smoothing / (double)C), one = (T)(1 - a->smoothing);          \
        T buf[COLW], obuf[COLW], sc[COLW], l[COLW];                                        \
        int64_t tt[COLW];                                                                  \
        for (int64_t j = 0; j < w; j++) {                                                  \
            int64_t p = n * D + d0 + j, t = tgt_at(a, p);                                  \
            bool ig = is_ignored(a, t);                                                    \
            /* An ignored position gets exp(x - inf) = 0 times a zero scale. */            \
            sc[j] = ig ? (T)0 : (T)(factor * g[p * gs]);                                   \
            l[j] = ig ? (T)INFINITY : lse[p];                                              \
            tt[j] = ig ? -1 : t;                                                           \
        }                                                                                  \
        for (int64_t c = 0; c < C; c++) {                                                  \
            const T *b = ld_##S(a->x + base + c * D * es, a->xdt, w, buf);                 \
            T *o = wr_##S(dx + base + c * D * es, a->xdt, obuf);                           \
            _Pragma("omp simd")                                                            \
            for (int64_t j = 0; j < w; j++)                                                \
                o[j] = (EXP(b[j] - l[j]) - off - (tt[j] == c ? one : (T)0)) * sc[j];       \
            fl_##S(dx + base + c * D * es, a->xdt, o, w);                                  \
        }                                                                                  \
    }

NB__CE_KERNELS(float, f32, nb__fast_expf)
NB__CE_KERNELS(double, f64, ce_exp)
#undef NB__CE_KERNELS

/* What the cross entropy loops read: rows (D == 1) or column blocks of COLW positions
 * (D > 1, task = n * nbk + block), one task computing the same whichever piece holds it. */
typedef struct ce_job {
    const nb__cls_operands *a;
    bool f64;
    int64_t nbk;        /* column blocks per row (D > 1) */
    double *loss;       /* forward: per-position losses */
    void *lse;          /* forward: log-sum-exps written */
    const void *lse_in; /* backward: the forward's log-sum-exps */
    const double *g;    /* backward: g, gstride, factor, dx as cross_entropy_bwd's */
    int64_t gstride;
    double factor;
    char *dx;
} ce_job;

static void ce_rows_fwd(int64_t lo, int64_t hi, void *ctx) {
    const ce_job *j = ctx;
    for (int64_t n = lo; n < hi; n++) {
        if (j->f64) ce_rows_fwd_f64(j->a, n, j->loss, (double *)j->lse);
        else ce_rows_fwd_f32(j->a, n, j->loss, (float *)j->lse);
    }
}

static void ce_cols_fwd(int64_t lo, int64_t hi, void *ctx) {
    const ce_job *j = ctx;
    const int64_t D = j->a->D, nbk = j->nbk;
    for (int64_t task = lo; task < hi; task++) {
        int64_t n = task / nbk, d0 = (task % nbk) * COLW, w = D - d0 < COLW ? D - d0 : COLW;
        if (j->f64) ce_cols_fwd_f64(j->a, n, d0, w, j->loss, (double *)j->lse);
        else ce_cols_fwd_f32(j->a, n, d0, w, j->loss, (float *)j->lse);
    }
}

static void ce_rows_bwd(int64_t lo, int64_t hi, void *ctx) {
    const ce_job *j = ctx;
    for (int64_t n = lo; n < hi; n++) {
        if (j->f64)
            ce_rows_bwd_f64(j->a, n, (const double *)j->lse_in, j->g, j->gstride, j->factor,
                            j->dx);
        else
            ce_rows_bwd_f32(j->a, n, (const float *)j->lse_in, j->g, j->gstride, j->factor,
                            j->dx);
    }
}

static void ce_cols_bwd(int64_t lo, int64_t hi, void *ctx) {
    const ce_job *j = ctx;
    const int64_t D = j->a->D, nbk = j->nbk;
    for (int64_t task = lo; task < hi; task++) {
        int64_t n = task / nbk, d0 = (task % nbk) * COLW, w = D - d0 < COLW ? D - d0 : COLW;
        if (j->f64)
            ce_cols_bwd_f64(j->a, n, d0, w, (const double *)j->lse_in, j->g, j->gstride,
                            j->factor, j->dx);
        else
            ce_cols_bwd_f32(j->a, n, d0, w, (const float *)j->lse_in, j->g, j->gstride,
                            j->factor, j->dx);
    }
}

/* Per-position losses (f64) and log-sum-exps (lse_out: float for f32/f16/bf16 scores, double
 * for f64; 0 at ignored positions). One fused, numerically stable pass per row (max, sum of
 * exp, loss); f32/f16/bf16 compute in f32 with f64 sums. */
static void cross_entropy_fwd(const nb__cls_operands *a, double *loss, void *lse_out) {
    const int64_t N = a->N, D = a->D;
    if (N * D == 0) return;
    int nt = threads_for(N * a->C * D);
    const int64_t nbk = (D + COLW - 1) / COLW;
    ce_job j = {.a = a, .f64 = a->xdt == NB_F64, .nbk = nbk, .loss = loss, .lse = lse_out};
    if (D == 1) nb__parallel_range(N, nt, ce_rows_fwd, &j);
    else nb__parallel_range(N * nbk, nt, ce_cols_fwd, &j);
}

/* dx = (softmax(x) - (1 - s) * onehot(t) - s / C) * factor * g[p * gstride], 0 at ignored
 * positions; dx has x's dtype and layout. lse as written by the forward. */
static void cross_entropy_bwd(const nb__cls_operands *a, const void *lse, const double *g,
                              int64_t gstride, double factor, char *dx) {
    const int64_t N = a->N, D = a->D;
    if (N * a->C * D == 0) return;
    int nt = threads_for(N * a->C * D);
    const int64_t nbk = (D + COLW - 1) / COLW;
    ce_job j = {.a = a, .f64 = a->xdt == NB_F64, .nbk = nbk, .lse_in = lse, .g = g,
                .gstride = gstride, .factor = factor, .dx = dx};
    if (D == 1) nb__parallel_range(N, nt, ce_rows_bwd, &j);
    else nb__parallel_range(N * nbk, nt, ce_cols_bwd, &j);
}

/* ---- NLL ----------------------------------------------------------------------------------- */
/* loss[p] = -x[n, t, d] (0 at ignored positions). */
static void nll_fwd(const nb__cls_operands *a, double *loss) {
    const int64_t C = a->C, D = a->D, P = a->N * D;
    for (int64_t p = 0; p < P; p++) {
        int64_t t = tgt_at(a, p), n = p / D, d = p % D;
        loss[p] = is_ignored(a, t) ? 0 : -elem(a->x, a->xdt, (n * C + t) * D + d);
    }
}

/* dx = 0 except dx[n, t, d] = -factor * g[p * gstride] at positions not ignored. */
static void nll_bwd(const nb__cls_operands *a, const double *g, int64_t gstride, double factor,
                    char *dx) {
    const int64_t C = a->C, D = a->D, P = a->N * D;
    const size_t es = nb_dtype_size(a->xdt);
    /* Zero bits are 0.0 in every float dtype. */
    memset(dx, 0, (size_t)(a->N * C * D) * es);
    for (int64_t p = 0; p < P; p++) {
        int64_t t = tgt_at(a, p), n = p / D, d = p % D;
        if (is_ignored(a, t)) continue;
        nb__store_f64(dx + (size_t)((n * C + t) * D + d) * es, a->xdt, -factor * g[p * gstride]);
    }
}

/* ---- sums ----------------------------------------------------------------------------------- */
/* Block size for a deterministic sum of n terms: at most SUMB blocks, at least 4096 terms
 * per block, so the order depends only on n. */
static int64_t sum_block(int64_t n) {
    int64_t bs = n / SUMB + 1;
    return bs < 4096 ? 4096 : bs;
}

/* Blocks [lo, hi) of bs terms of v (n in all): part[b] = the block's sum in index order. */
typedef struct sum_job {
    const double *v;
    int64_t n, bs;
    double *part;
} sum_job;

static void sum_blocks(int64_t lo, int64_t hi, void *ctx) {
    const sum_job *j = ctx;
    for (int64_t b = lo; b < hi; b++) {
        int64_t e = (b + 1) * j->bs < j->n ? (b + 1) * j->bs : j->n;
        double s = 0;
        for (int64_t i = b * j->bs; i < e; i++) s += j->v[i];
        j->part[b] = s;
    }
}

/* Sum of v[0..n) in an order that depends only on n (blocks summed in parallel, partial
 * sums added in order), so the result does not depend on the thread count. */
static double loss_sum(const double *v, int64_t n) {
    const int64_t bs = sum_block(n), nbk = (n + bs - 1) / bs;
    double part[SUMB];
    int nt = threads_for(n);
    sum_job j = {v, n, bs, part};
    nb__parallel_range(nbk, nt, sum_blocks, &j);
    double s = 0;
    for (int64_t b = 0; b < nbk; b++) s += part[b];
    return s;
}

/* dst[i] = src[i] converted to dt (round to nearest even), i < n. */
static void loss_store(char *dst, nb_dtype dt, const double *src, int64_t n) {
    const size_t es = nb_dtype_size(dt);
    if (dt == NB_F64) {
        memcpy(dst, src, (size_t)n * es);
        return;
    }
    for (int64_t i = 0; i < n; i++) nb__store_f64(dst + (size_t)i * es, dt, src[i]);
}

/* ---- binary cross entropy with logits -------------------------------------------------------
 * Computed in f64 for both compute types (f32 arrays are widened on load): the loss has a
 * log1p and an exp per element, so the wider type costs little and keeps f32 results
 * correctly rounded. */
static inline double ld_ct(const char *p, nb_dtype ct, int64_t i) {
    return ct == NB_F64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}
static inline void st_ct(char *p, nb_dtype ct, int64_t i, double v) {
    if (ct == NB_F64) ((double *)p)[i] = v;
    else ((float *)p)[i] = (float)v;
}
/* softplus(-x) = log(1 + exp(-x)) without overflow. */
static inline double softplus_neg(double x) { return log1p(exp(-fabs(x))) + fmax(-x, 0.0); }

/* What the BCE loops read: the operands, and the forward's or the backward's own fields. */
typedef struct bce_job {
    const nb__bce_operands *a;
    char *out;     /* forward: the losses, or NULL */
    int64_t bs;    /* forward: terms per partial sum */
    double *part;  /* forward: one sum per block */
    const char *g; /* backward: g, gstride, factor, dx, dy, dpw as bce_bwd's */
    int64_t gstride;
    double factor;
    char *dx, *dy, *dpw;
} bce_job;

/* Blocks [lo, hi) of bs terms: part[b] = the block's losses summed in index order. */
static void bce_fwd_blocks(int64_t lo, int64_t hi, void *ctx) {
    const bce_job *j = ctx;
    const nb__bce_operands *a = j->a;
    const int64_t n = a->n, bs = j->bs;
    char *out = j->out;
    for (int64_t b = lo; b < hi; b++) {
        int64_t e = (b + 1) * bs < n ? (b + 1) * bs : n;
        double s = 0;
        for (int64_t i = b * bs; i < e; i++) {
            double x = ld_ct(a->x, a->ct, i), y = ld_ct(a->y, a->ct, i);
            double w = a->pw ? 1 + (ld_ct(a->pw, a->ct, i % a->pw_period) - 1) * y : 1;
            double v = (1 - y) * x + w * softplus_neg(x);
            if (out) st_ct(out, a->ct, i, v);
            s += v;
        }
        j->part[b] = s;
    }
}

/* The losses written to out (dtype ct) when out is not NULL; returns their sum, in an order
 * that depends only on n. */
static double bce_fwd(const nb__bce_operands *a, char *out) {
    const int64_t n = a->n, bs = sum_block(n), nbk = (n + bs - 1) / bs;
    double part[SUMB];
    int nt = nb__threads_for(n, NB__GRAIN / 8); /* costly math: a smaller grain */
    if (nt < 1) nt = 1;
    bce_job j = {.a = a, .out = out, .bs = bs, .part = part};
    nb__parallel_range(nbk, nt, bce_fwd_blocks, &j);
    double s = 0;
    for (int64_t b = 0; b < nbk; b++) s += part[b];
    return s;
}

/* Elements [lo, hi) of the backward; each element on its own. */
static void bce_bwd_range(int64_t lo, int64_t hi, void *ctx) {
    const bce_job *j = ctx;
    const nb__bce_operands *a = j->a;
    const char *g = j->g;
    const int64_t gstride = j->gstride;
    const double factor = j->factor;
    char *dx = j->dx, *dy = j->dy, *dpw = j->dpw;
    for (int64_t i = lo; i < hi; i++) {
        double x = ld_ct(a->x, a->ct, i), y = ld_ct(a->y, a->ct, i);
        double pw = a->pw ? ld_ct(a->pw, a->ct, i % a->pw_period) : 1;
        double G = factor * ld_ct(g, a->ct, i * gstride);
        double sp = softplus_neg(x);
        if (dx) {
            /* sigmoid(-x), from whichever exp cannot overflow */
            double e = exp(-fabs(x)), sig = x >= 0 ? e / (1 + e) : 1 / (1 + e);
            st_ct(dx, a->ct, i, G * ((1 - y) - (1 + (pw - 1) * y) * sig));
        }
        if (dy) st_ct(dy, a->ct, i, G * (-x + (pw - 1) * sp));
        if (dpw) st_ct(dpw, a->ct, i, G * y * sp);
    }
}

/* dx, dy, dpw (each may be NULL) as tensor/kernels/loss.h says, from G = factor *
 * g[i * gstride]. */
static void bce_bwd(const nb__bce_operands *a, const char *g, int64_t gstride, double factor,
                    char *dx, char *dy, char *dpw) {
    const int64_t n = a->n;
    int nt = nb__threads_for(n, NB__GRAIN / 8);
    if (nt < 1) nt = 1;
    bce_job j = {.a = a, .g = g, .gstride = gstride, .factor = factor,
                 .dx = dx, .dy = dy, .dpw = dpw};
    nb__parallel_range(n, nt, bce_bwd_range, &j);
}

/* ---- the kernels ---------------------------------------------------------------------------- */
/* Forward of cross_entropy (ce) and nll_loss: validate, per-position losses in f64, then the
 * reduced value (or the per-position values) into out. */
static nb_status cls_forward(const nb__cls_loss_args *a, bool ce) {
    const nb__cls_operands *in = &a->in;
    int64_t count = 0;
    nb_status st = check_targets(a->op, in, &count);
    if (st != NB_OK) return st;
    const int64_t P = in->N * in->D;
    /* Per-position f64 losses: straight into out when that is what it holds. */
    bool direct = a->reduction == NB__LOSS_NONE && in->xdt == NB_F64;
    size_t bytes = (size_t)P * sizeof(double);
    double *lp = direct ? (double *)a->out : nb_host_alloc(bytes > 64 ? bytes : 64);
    if (!lp) return NB_ENOMEM;
    if (ce) cross_entropy_fwd(in, lp, a->lse);
    else nll_fwd(in, lp);
    if (a->reduction == NB__LOSS_NONE) {
        if (!direct) loss_store(a->out, in->xdt, lp, P);
    } else {
        double total = loss_sum(lp, P);
        /* A mean over no counted target is 0 / 0 = NaN, as in PyTorch. */
        nb__store_f64(a->out, in->xdt,
                      a->reduction == NB__LOSS_SUM ? total : total / (double)count);
    }
    if (!direct) nb_host_free(lp);
    if (a->count) *a->count = count;
    return NB_OK;
}

/* Backward of cross_entropy (ce) and nll_loss: the reduction's factor, then dx. */
static nb_status cls_backward(const nb__cls_loss_backward_args *a, bool ce) {
    int64_t gs = a->reduction == NB__LOSS_NONE ? 1 : 0;
    double factor = 1.0;
    if (a->reduction == NB__LOSS_MEAN) {
        NB__ASSERT(a->count);
        int64_t count = *a->count;
        /* All targets ignored: every position gets a zero gradient (no 1 / 0 anywhere). */
        factor = count ? 1.0 / (double)count : 0.0;
    }
    if (ce) cross_entropy_bwd(&a->in, a->lse, a->g, gs, factor, a->dx);
    else nll_bwd(&a->in, a->g, gs, factor, a->dx);
    return NB_OK;
}

static nb_status cpu_cross_entropy(const nb__cls_loss_args *a) { return cls_forward(a, true); }
static nb_status cpu_nll_loss(const nb__cls_loss_args *a) { return cls_forward(a, false); }
static nb_status cpu_cross_entropy_backward(const nb__cls_loss_backward_args *a) {
    return cls_backward(a, true);
}
static nb_status cpu_nll_loss_backward(const nb__cls_loss_backward_args *a) {
    return cls_backward(a, false);
}

static nb_status cpu_bce_with_logits(const nb__bce_args *a) {
    bool none = a->reduction == NB__LOSS_NONE;
    double total = bce_fwd(&a->in, none ? a->out : NULL);
    if (!none)
        nb__store_f64(a->out, a->out_dt,
                      a->reduction == NB__LOSS_SUM ? total : total / (double)a->in.n);
    return NB_OK;
}

static nb_status cpu_bce_with_logits_backward(const nb__bce_backward_args *a) {
    bce_bwd(&a->in, a->g, a->gstride, a->factor, a->dx, a->dy, a->dpw);
    return NB_OK;
}

void nb__cpu_register_loss(nb__kernels *k) {
    k->cross_entropy = cpu_cross_entropy;
    k->cross_entropy_backward = cpu_cross_entropy_backward;
    k->nll_loss = cpu_nll_loss;
    k->nll_loss_backward = cpu_nll_loss_backward;
    k->bce_with_logits = cpu_bce_with_logits;
    k->bce_with_logits_backward = cpu_bce_with_logits_backward;
}
