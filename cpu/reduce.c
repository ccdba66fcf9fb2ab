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
 * f64; integers and bool in int64 (sums wrap in two's complement as PyTorch's do).
 *
 * The block loads and block reductions both this file and the softmax kernel
 * (cpu/softmax.c) use are in cpu/reduce_blocks.h. */
#include "cpu/backend.h"
#include "cpu/fastmath.h"
#include "cpu/reduce.h"
#include "cpu/reduce_blocks.h"

#include <float.h>
#include <math.h>
#include <string.h>

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


/* The family's entries of the kernel table (the backward kernels are in cpu/reduce_back.c). */
void nb__cpu_register_reduce(nb__kernels *k) {
    k->reduce = nb__cpu_reduce;
    k->softmax = nb__cpu_softmax;
    k->softmax_backward = nb__cpu_softmax_backward;
    k->extreme_backward = nb__cpu_extreme_backward;
}
