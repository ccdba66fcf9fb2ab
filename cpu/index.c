/* cpu/index.c - CPU kernels of the indexing ops: index_select (and embedding through it),
 * gather, scatter_add, the ordered index_add of their backward rules, masked_fill, one_hot,
 * tril/triu, and the index min/max scan (tensor/kernels/index.h has their arguments).
 *
 * Element moves do not care about the dtype, only its size: the loops are written once as
 * always-inline functions taking the element size, and called from a switch with the
 * constants 1, 2, 4 and 8, so each copy becomes a single load and store. Where a whole
 * contiguous block moves at once (rows of an embedding table, the kept part of a triangle)
 * it is one memcpy. Work is split over threads by output position only, so no two threads
 * ever write the same element and the results never depend on the thread count.
 *
 * The op definitions (tensor/ops/index.c) never read index values: every kernel taking an
 * index scans it first (one parallel min/max pass) and fails with the op's NB_EINDEX
 * message before writing anything, so a bad index is an error, never an out-of-bounds
 * access. index_add trusts its index: its callers pass one a forward pass checked. */
#include <string.h>

#include "cpu/backend.h"
#include "cpu/cpu_impl.h"

#define NB__INLINE static inline __attribute__((always_inline))

/* Geometry with 0-dim operands seen as one-element 1-D ones, so every loop has a dim. */
typedef struct {
    int nd;
    int64_t shape[NB_MAX_DIMS];
    int64_t strides[NB_MAX_DIMS];
} nb__geom;

static void geom_of(const nb__view *v, nb__geom *g) {
    if (v->ndim == 0) {
        g->nd = 1;
        g->shape[0] = 1;
        g->strides[0] = 1;
        return;
    }
    g->nd = v->ndim;
    memcpy(g->shape, v->shape, sizeof g->shape);
    memcpy(g->strides, v->strides, sizeof g->strides);
}

static int64_t view_numel(const nb__view *v) {
    int64_t n = 1;
    for (int d = 0; d < v->ndim; d++) n *= v->shape[d];
    return n;
}

/* As nb_is_contiguous: row-major strides, size-1 dims may have any stride. */
static bool view_contiguous(const nb__view *v) {
    int64_t expect = 1;
    for (int d = v->ndim - 1; d >= 0; d--) {
        if (v->shape[d] == 1) continue;
        if (v->shape[d] == 0) return true;
        if (v->strides[d] != expect) return false;
        expect *= v->shape[d];
    }
    return true;
}

static inline int64_t idx_at(const void *p, bool i64, int64_t i) {
    return i64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

/* memcpy with a constant size compiles to one move (and is safe for unaligned buffers
 * wrapped with nb_wrap_buffer). */
NB__INLINE void copy_elem(char *dst, const char *src, size_t es) { memcpy(dst, src, es); }

static int threads_for(int64_t work) {
    int nt = nb__threads_for(work, NB__GRAIN);
    return nt < 1 ? 1 : nt;
}

/* ---- index range ----------------------------------------------------------------------- */
/* The scan takes a few pieces per thread, as nb__parallel_range would, but numbers them so
 * that each piece leaves its partial in its own slot; at most this many (the partials live
 * on the stack, and more pieces would not shorten a scan bound by memory). */
#define MINMAX_PIECES 64

typedef struct {
    const void *p;
    bool i64;
    int64_t n, npieces;
    int64_t lo[MINMAX_PIECES], hi[MINMAX_PIECES];
} minmax_job;

static void minmax_task(int64_t t, void *ctx) {
    minmax_job *j = ctx;
    int64_t b = j->n * t / j->npieces, e = j->n * (t + 1) / j->npieces;
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    if (j->i64) {
        const int64_t *p = (const int64_t *)j->p;
        for (int64_t i = b; i < e; i++) {
            lo = p[i] < lo ? p[i] : lo;
            hi = p[i] > hi ? p[i] : hi;
        }
    } else {
        const int32_t *p = (const int32_t *)j->p;
        for (int64_t i = b; i < e; i++) {
            lo = p[i] < lo ? p[i] : lo;
            hi = p[i] > hi ? p[i] : hi;
        }
    }
    j->lo[t] = lo;
    j->hi[t] = hi;
}

/* Smallest and largest value of a contiguous I32/I64 index (INT64_MAX, INT64_MIN if empty).
 * Min and max do not depend on how the pieces fall or in which order their partials combine. */
static void index_minmax(const nb__view *idx, int64_t *mn, int64_t *mx) {
    int64_t n = view_numel(idx);
    int nt = threads_for(n);
    int64_t np = nt > 1 ? 4 * (int64_t)nt : 1;
    if (np > MINMAX_PIECES) np = MINMAX_PIECES;
    if (np > n) np = n;
    minmax_job j;
    j.p = idx->data;
    j.i64 = idx->dtype == NB_I64;
    j.n = n;
    j.npieces = np;
    nb__run_tasks(np, nt, minmax_task, &j);
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (int64_t t = 0; t < np; t++) {
        lo = j.lo[t] < lo ? j.lo[t] : lo;
        hi = j.hi[t] > hi ? j.hi[t] : hi;
    }
    *mn = lo;
    *mx = hi;
}

/* NB_OK when every value of idx lies in [0, size), else the op's range error naming the
 * smallest value if negative, else the largest. */
static nb_status check_range(const nb__view *idx, int64_t size, const char *op, int dim) {
    if (view_numel(idx) == 0) return NB_OK;
    int64_t mn, mx;
    index_minmax(idx, &mn, &mx);
    if (mn >= 0 && mx < size) return NB_OK;
    return nb__error(NB_EINDEX, "%s: index %lld is out of range for dim %d of size %lld", op,
                     (long long)(mn < 0 ? mn : mx), dim, (long long)size);
}

static nb_status cpu_index_minmax(const nb__index_minmax_args *a) {
    index_minmax(&a->index, a->out_min, a->out_max);
    return NB_OK;
}

/* ---- gather-like copies ------------------------------------------------------------------
 * g holds the OUTPUT shape with the STRIDES of x. Output element i (row-major position p)
 * comes from x at p with p[dim] replaced by an index value: the index at linear position i
 * (gather: index has the output's shape) or at p[dim] (index_select: a 1-D index). */
NB__INLINE void gather_span(char *o, const char *xp, const nb__geom *g, int dim, const void *ip,
                            bool i64, bool linear, int64_t begin, int64_t end, size_t es) {
    int last = g->nd - 1;
    int64_t p[NB_MAX_DIMS];
    int64_t rem = begin;
    for (int d = last; d >= 0; d--) {
        p[d] = rem % g->shape[d];
        rem /= g->shape[d];
    }
    const int64_t sdim = g->strides[dim], slast = g->strides[last];
    int64_t i = begin;
    while (i < end) {
        int64_t base = 0;
        for (int d = 0; d < last; d++)
            if (d != dim) base += p[d] * g->strides[d];
        int64_t run = g->shape[last] - p[last];
        if (run > end - i) run = end - i;
        if (dim == last) {
            for (int64_t r = 0; r < run; r++) {
                int64_t k = idx_at(ip, i64, linear ? i + r : p[last] + r);
                copy_elem(o + (i + r) * (int64_t)es, xp + (base + k * sdim) * (int64_t)es, es);
            }
        } else if (linear) {
            base += p[last] * slast;
            for (int64_t r = 0; r < run; r++) {
                int64_t k = idx_at(ip, i64, i + r);
                copy_elem(o + (i + r) * (int64_t)es,
                          xp + (base + k * sdim + r * slast) * (int64_t)es, es);
            }
        } else {
            /* index_select with dim before the last: the whole row shares one index */
            base += p[last] * slast + idx_at(ip, i64, p[dim]) * sdim;
            for (int64_t r = 0; r < run; r++)
                copy_elem(o + (i + r) * (int64_t)es, xp + (base + r * slast) * (int64_t)es, es);
        }
        i += run;
        p[last] += run;
        for (int d = last; d > 0 && p[d] >= g->shape[d]; d--) {
            p[d] = 0;
            p[d - 1]++;
        }
    }
}

static void gather_span_es(char *o, const char *xp, const nb__geom *g, int dim, const void *ip,
                           bool i64, bool linear, int64_t begin, int64_t end, size_t es) {
    switch (es) {
    case 1: gather_span(o, xp, g, dim, ip, i64, linear, begin, end, 1); break;
    case 2: gather_span(o, xp, g, dim, ip, i64, linear, begin, end, 2); break;
    case 4: gather_span(o, xp, g, dim, ip, i64, linear, begin, end, 4); break;
    case 8: gather_span(o, xp, g, dim, ip, i64, linear, begin, end, 8); break;
    default: NB__ASSERT(!"unexpected element size");
    }
}

typedef struct {
    char *o;
    const char *xp;
    const nb__geom *g;
    int dim;
    const void *ip;
    bool i64, linear;
    size_t es;
} gather_job;

static void gather_piece(int64_t b, int64_t e, void *ctx) {
    const gather_job *j = ctx;
    gather_span_es(j->o, j->xp, j->g, j->dim, j->ip, j->i64, j->linear, b, e, j->es);
}

static void gather_run(const nb__view *out, const nb__view *x, const nb__geom *g, int dim,
                       const nb__view *idx, bool linear) {
    int64_t n = view_numel(out);
    gather_job j = {out->data, x->data, g, dim, idx->data, idx->dtype == NB_I64, linear,
                    nb_dtype_size(x->dtype)};
    nb__parallel_range(n, threads_for(n), gather_piece, &j);
}

/* index_select's rows [lo, hi) when each picked row is one contiguous block of x. */
typedef struct {
    char *o;
    const char *xp;
    const nb__geom *gx;
    int dim;
    int64_t m;
    const void *ip;
    bool i64;
    size_t es;
    int64_t rowbytes;
} select_job;

static void select_rows(int64_t lo, int64_t hi, void *ctx) {
    const select_job *j = ctx;
    const nb__geom *gx = j->gx;
    for (int64_t r = lo; r < hi; r++) {
        int64_t oi = r / j->m, k = r % j->m, base = 0;
        for (int d = j->dim - 1; d >= 0; d--) {
            base += (oi % gx->shape[d]) * gx->strides[d];
            oi /= gx->shape[d];
        }
        base += idx_at(j->ip, j->i64, k) * gx->strides[j->dim];
        memcpy(j->o + r * j->rowbytes, j->xp + base * (int64_t)j->es, (size_t)j->rowbytes);
    }
}

static nb_status cpu_index_select(const nb__index_select_args *a) {
    const nb__view *x = &a->x, *idx = &a->index;
    int dim = a->dim;
    nb__geom gx;
    geom_of(x, &gx);
    nb_status st = check_range(idx, gx.shape[dim], a->op, dim);
    if (st != NB_OK || view_numel(&a->out) == 0) return st;
    int64_t m = view_numel(idx);
    /* Fast path: the block x[..., k, ...] (dims after dim) is contiguous, so each picked
     * row is one memcpy (embedding tables, row selection of matrices). */
    int64_t inner = 1;
    bool block = true;
    for (int d = gx.nd - 1; d > dim; d--) {
        if (gx.shape[d] != 1 && gx.strides[d] != inner) block = false;
        inner *= gx.shape[d];
    }
    if (block && inner >= 4) {
        size_t es = nb_dtype_size(x->dtype);
        int64_t outer = 1;
        for (int d = 0; d < dim; d++) outer *= gx.shape[d];
        int64_t rows = outer * m;
        select_job j = {a->out.data, x->data, &gx, dim, m, idx->data, idx->dtype == NB_I64,
                        es, inner * (int64_t)es};
        nb__parallel_range(rows, threads_for(rows * inner), select_rows, &j);
        return NB_OK;
    }
    nb__geom g = gx;
    g.shape[dim] = m;
    gather_run(&a->out, x, &g, dim, idx, false);
    return NB_OK;
}

static nb_status cpu_gather(const nb__gather_args *a) {
    nb__geom g, gx;
    geom_of(&a->x, &gx);
    nb_status st = check_range(&a->index, gx.shape[a->dim], a->op, a->dim);
    if (st != NB_OK || view_numel(&a->out) == 0) return st;
    geom_of(&a->out, &g);
    memcpy(g.strides, gx.strides, sizeof g.strides);
    gather_run(&a->out, &a->x, &g, a->dim, &a->index, true);
    return NB_OK;
}

/* ---- scatter_add ------------------------------------------------------------------------- */
static inline size_t dt_size(nb_dtype dt) {
    return dt == NB_F64 || dt == NB_I64 ? 8 : dt == NB_F32 || dt == NB_I32 ? 4 : 1;
}

/* *o += *s in dtype dt. Integers wrap around (computed unsigned, so overflow is defined, as
 * two's complement wrap in PyTorch); bool adds as logical or. */
NB__INLINE void add_elem(char *o, const char *s, nb_dtype dt) {
    switch (dt) {
#define NB__ADD_AS(T)                                                                        \
    {                                                                                      \
        T a, b;                                                                            \
        memcpy(&a, o, sizeof a);                                                           \
        memcpy(&b, s, sizeof b);                                                           \
        a = (T)(a + b);                                                                    \
        memcpy(o, &a, sizeof a);                                                           \
        break;                                                                             \
    }
    case NB_F32: NB__ADD_AS(float)
    case NB_F64: NB__ADD_AS(double)
    case NB_I32: NB__ADD_AS(uint32_t)
    case NB_I64: NB__ADD_AS(uint64_t)
    case NB_U8: NB__ADD_AS(uint8_t)
#undef NB__ADD_AS
    case NB_BOOL: *o = (char)((*o | *s) != 0); break;
    default: NB__ASSERT(!"scatter_add kernel: unsupported dtype");
    }
}

typedef struct {
    int nd, dim;
    char *o;
    const char *s;
    const void *ip;
    bool i64;
    int64_t ishape[NB_MAX_DIMS], istr[NB_MAX_DIMS], os[NB_MAX_DIMS], ss[NB_MAX_DIMS];
} nb__scatter;

/* General strides: for each position q of the non-dim dims of index (q in [qb, qe)), walk
 * dim in increasing order. Distinct q write distinct output elements. */
NB__INLINE void scatter_general(const nb__scatter *c, int64_t qb, int64_t qe, nb_dtype dt) {
    int64_t es = (int64_t)dt_size(dt), n = c->ishape[c->dim];
    for (int64_t q = qb; q < qe; q++) {
        int64_t rem = q, ob = 0, sb = 0, ib = 0;
        for (int d = c->nd - 1; d >= 0; d--) {
            if (d == c->dim) continue;
            int64_t x = rem % c->ishape[d];
            rem /= c->ishape[d];
            ob += x * c->os[d], sb += x * c->ss[d], ib += x * c->istr[d];
        }
        for (int64_t j = 0; j < n; j++) {
            int64_t k = idx_at(c->ip, c->i64, ib + j * c->istr[c->dim]);
            add_elem(c->o + (ob + k * c->os[c->dim]) * es, c->s + (sb + j * c->ss[c->dim]) * es,
                     dt);
        }
    }
}

/* Contiguous src and index of the output's shape except along dim: output (O, N, inner),
 * index and src (O, n, inner). A work item is one outer position o and a block of inner
 * positions [i0, i1); j runs outside the inner loop so rows stream through the cache, and
 * each output element still receives its additions in increasing j. */
NB__INLINE void scatter_fast(const nb__scatter *c, int64_t N, int64_t inner, int64_t nblk,
                             int64_t w, nb_dtype dt) {
    int64_t es = (int64_t)dt_size(dt), n = c->ishape[c->dim];
    int64_t o = w / nblk, b = w % nblk;
    int64_t i0 = inner * b / nblk, i1 = inner * (b + 1) / nblk;
    for (int64_t j = 0; j < n; j++) {
        int64_t row = (o * n + j) * inner, orow = o * N * inner;
        for (int64_t i = i0; i < i1; i++) {
            int64_t k = idx_at(c->ip, c->i64, row + i);
            add_elem(c->o + (orow + k * inner + i) * es, c->s + (row + i) * es, dt);
        }
    }
}

#define NB__SCATTER_DISPATCH(dt, CALL)                                                     \
    switch (dt) {                                                                          \
    case NB_F32: CALL(NB_F32); break;                                                      \
    case NB_F64: CALL(NB_F64); break;                                                      \
    case NB_I32: CALL(NB_I32); break;                                                      \
    case NB_I64: CALL(NB_I64); break;                                                      \
    case NB_U8: CALL(NB_U8); break;                                                        \
    case NB_BOOL: CALL(NB_BOOL); break;                                                    \
    default: NB__ASSERT(!"scatter_add kernel: unsupported dtype");                         \
    }

static void scatter_general_dt(const nb__scatter *c, int64_t qb, int64_t qe, nb_dtype dt) {
#define NB__CALL(D) scatter_general(c, qb, qe, D)
    NB__SCATTER_DISPATCH(dt, NB__CALL)
#undef NB__CALL
}

static void scatter_fast_dt(const nb__scatter *c, int64_t N, int64_t inner, int64_t nblk,
                            int64_t w, nb_dtype dt) {
#define NB__CALL(D) scatter_fast(c, N, inner, nblk, w, D)
    NB__SCATTER_DISPATCH(dt, NB__CALL)
#undef NB__CALL
}

typedef struct {
    const nb__scatter *c;
    nb_dtype dt;
    int64_t N, inner, nblk; /* the fast path's geometry */
} scatter_job;

static void scatter_fast_piece(int64_t lo, int64_t hi, void *ctx) {
    const scatter_job *j = ctx;
    for (int64_t w = lo; w < hi; w++) scatter_fast_dt(j->c, j->N, j->inner, j->nblk, w, j->dt);
}

static void scatter_general_piece(int64_t lo, int64_t hi, void *ctx) {
    const scatter_job *j = ctx;
    scatter_general_dt(j->c, lo, hi, j->dt);
}

static nb_status cpu_scatter_add(const nb__scatter_add_args *a) {
    int dim = a->dim;
    nb__scatter c;
    nb__geom gi, go, gs;
    geom_of(&a->index, &gi);
    geom_of(&a->out, &go);
    geom_of(&a->src, &gs);
    nb_status st = check_range(&a->index, go.shape[dim], a->op, dim);
    int64_t total = view_numel(&a->index);
    if (st != NB_OK || total == 0) return st;
    c.nd = gi.nd;
    c.dim = dim;
    c.o = a->out.data;
    c.s = a->src.data;
    c.ip = a->index.data;
    c.i64 = a->index.dtype == NB_I64;
    memcpy(c.ishape, gi.shape, sizeof c.ishape);
    memcpy(c.istr, gi.strides, sizeof c.istr);
    memcpy(c.os, go.strides, sizeof c.os);
    memcpy(c.ss, gs.strides, sizeof c.ss);
    nb_dtype dt = a->out.dtype;

    bool fast = view_contiguous(&a->src) && view_contiguous(&a->out);
    for (int d = 0; d < c.nd && fast; d++)
        fast = gs.shape[d] == gi.shape[d] && (d == dim || go.shape[d] == gi.shape[d]);
    int nt = threads_for(total);
    if (fast) {
        int64_t outer = 1, inner = 1;
        for (int d = 0; d < dim; d++) outer *= gi.shape[d];
        for (int d = dim + 1; d < c.nd; d++) inner *= gi.shape[d];
        /* enough blocks of inner positions that every thread gets work */
        int64_t nblk = outer >= nt ? 1 : (nt + outer - 1) / outer;
        if (nblk > inner) nblk = inner;
        scatter_job j = {&c, dt, go.shape[dim], inner, nblk};
        nb__parallel_range(outer * nblk, nt, scatter_fast_piece, &j);
        return NB_OK;
    }
    scatter_job j = {&c, dt, 0, 0, 0};
    nb__parallel_range(total / gi.shape[dim], nt, scatter_general_piece, &j);
    return NB_OK;
}

/* ---- masked_fill --------------------------------------------------------------------------- */
typedef struct {
    const char *value;
    size_t es;
} nb__mf_ctx;

NB__INLINE void mf_loop(char **ptrs, const int64_t *st, int64_t n, const char *val, size_t es) {
    char *o = ptrs[0];
    const char *x = ptrs[1], *m = ptrs[2];
    for (int64_t i = 0; i < n; i++, o += st[0], x += st[1], m += st[2])
        copy_elem(o, *m ? val : x, es);
}

static void mf_fn(char **ptrs, const int64_t *strides, int64_t n, void *ctx) {
    const nb__mf_ctx *c = ctx;
    switch (c->es) {
    case 1: mf_loop(ptrs, strides, n, c->value, 1); break;
    case 2: mf_loop(ptrs, strides, n, c->value, 2); break;
    case 4: mf_loop(ptrs, strides, n, c->value, 4); break;
    case 8: mf_loop(ptrs, strides, n, c->value, 8); break;
    default: NB__ASSERT(!"unexpected element size");
    }
}

static nb_status cpu_masked_fill(const nb__masked_fill_args *a) {
    nb__mf_ctx c = {(const char *)&a->value, nb_dtype_size(a->it.dtype[0])};
    nb__iter_for_each(&a->it, mf_fn, &c, NB__GRAIN);
    return NB_OK;
}

/* ---- one_hot ------------------------------------------------------------------------------- */
typedef struct {
    char *o;
    const void *ip;
    bool i64;
    size_t es;
    int64_t rowbytes;
    const void *one; /* the value of the hot element, es bytes */
} one_hot_job;

static void one_hot_rows(int64_t lo, int64_t hi, void *ctx) {
    const one_hot_job *j = ctx;
    /* Zero bits are 0 in every dtype (including +0.0 in the half types). */
    for (int64_t i = lo; i < hi; i++) {
        char *row = j->o + i * j->rowbytes;
        memset(row, 0, (size_t)j->rowbytes);
        memcpy(row + idx_at(j->ip, j->i64, i) * (int64_t)j->es, j->one, j->es);
    }
}

static nb_status cpu_one_hot(const nb__one_hot_args *a) {
    const nb__view *out = &a->out, *idx = &a->index;
    int64_t n = view_numel(idx), C = out->shape[out->ndim - 1];
    if (n == 0) return NB_OK;
    int64_t mn, mx;
    index_minmax(idx, &mn, &mx);
    if (mn < 0)
        return nb__error(NB_EINDEX, "one_hot: class index %lld is negative; class values must "
                         "be non-negative", (long long)mn);
    if (mx >= C)
        return nb__error(NB_EINDEX, "one_hot: class index %lld is out of range for %lld "
                         "classes", (long long)mx, (long long)C);
    size_t es = nb_dtype_size(out->dtype);
    one_hot_job j = {out->data, idx->data, idx->dtype == NB_I64, es, C * (int64_t)es, &a->one};
    nb__parallel_range(n, threads_for(n * C), one_hot_rows, &j);
    return NB_OK;
}
/* ---- tril / triu ------------------------------------------------------------------------- */
NB__INLINE void copy_strided(char *dst, const char *src, int64_t sstride, int64_t n, size_t es) {
    for (int64_t j = 0; j < n; j++) copy_elem(dst + j * (int64_t)es, src + j * sstride, es);
}

static void copy_strided_es(char *dst, const char *src, int64_t sstride, int64_t n, size_t es) {
    switch (es) {
    case 1: copy_strided(dst, src, sstride, n, 1); break;
    case 2: copy_strided(dst, src, sstride, n, 2); break;
    case 4: copy_strided(dst, src, sstride, n, 4); break;
    case 8: copy_strided(dst, src, sstride, n, 8); break;
    default: NB__ASSERT(!"unexpected element size");
    }
}

typedef struct {
    const nb__view *x;
    char *o;
    const char *xp;
    int64_t R, C, k, srow, scol, rowbytes;
    size_t es;
    bool lower;
} tri_job;

static void tri_rows(int64_t lo_row, int64_t hi_row, void *ctx) {
    const tri_job *job = ctx;
    const nb__view *x = job->x;
    int nd = x->ndim;
    int64_t C = job->C, k = job->k;
    size_t es = job->es;
    for (int64_t r = lo_row; r < hi_row; r++) {
        int64_t b = r / job->R, i = r % job->R, base = i * job->srow;
        for (int d = nd - 3; d >= 0; d--) {
            base += (b % x->shape[d]) * x->strides[d];
            b /= x->shape[d];
        }
        /* kept columns [lo, hi): tril keeps j <= i + k, triu keeps j >= i + k */
        int64_t lo = job->lower ? 0 : i + k, hi = job->lower ? i + k + 1 : C;
        lo = lo < 0 ? 0 : lo > C ? C : lo;
        hi = hi < lo ? lo : hi > C ? C : hi;
        char *orow = job->o + r * job->rowbytes;
        memset(orow, 0, (size_t)(lo * (int64_t)es));
        memset(orow + hi * (int64_t)es, 0, (size_t)((C - hi) * (int64_t)es));
        if (hi == lo) continue;
        const char *src = job->xp + (base + lo * job->scol) * (int64_t)es;
        if (job->scol == 1)
            memcpy(orow + lo * (int64_t)es, src, (size_t)((hi - lo) * (int64_t)es));
        else copy_strided_es(orow + lo * (int64_t)es, src, job->scol * (int64_t)es, hi - lo, es);
    }
}

static nb_status cpu_tri(const nb__tri_args *a) {
    const nb__view *x = &a->x;
    int nd = x->ndim;
    NB__ASSERT(nd >= 2);
    int64_t R = x->shape[nd - 2], C = x->shape[nd - 1], numel = view_numel(x);
    int64_t rows = numel / (C ? C : 1), k = a->k;
    if (numel == 0) return NB_OK;
    size_t es = nb_dtype_size(x->dtype);
    /* Clamp k so i + k cannot overflow; beyond +-(R + C) every k behaves the same. */
    if (k > R + C) k = R + C;
    if (k < -(R + C)) k = -(R + C);
    tri_job j = {x, a->out.data, x->data, R, C, k, x->strides[nd - 2], x->strides[nd - 1],
                 C * (int64_t)es, es, a->lower};
    nb__parallel_range(rows, threads_for(rows * C), tri_rows, &j);
    return NB_OK;
}

/* ---- index_add -----------------------------------------------------------------------------
 * The gradient of index_select and embedding. Parallel only over work that touches disjoint
 * outputs: the O outer slices and, when there are fewer slices than threads (embedding:
 * O == 1), blocks of at least IA_MINW columns of D. Each output element is therefore
 * accumulated by one thread, in index order. */
#define IA_MINW 64 /* narrowest column block index_add splits D into */

/* dst[0, w) += src[0, w): f32 accumulator, src of dtype sdt (f32, f16, bf16). */
static void add_row_f32(float *dst, const char *src, nb_dtype sdt, int64_t w) {
    if (sdt == NB_F32) {
        const float *s = (const float *)src;
#pragma omp simd
        for (int64_t j = 0; j < w; j++) dst[j] += s[j];
        return;
    }
    float buf[256];
    for (int64_t o = 0; o < w; o += 256) {
        int64_t n = w - o < 256 ? w - o : 256;
        const uint16_t *h = (const uint16_t *)(src + o * 2);
        if (sdt == NB_F16) nb__f16_to_f32_n(h, buf, n);
        else nb__bf16_to_f32_n(h, buf, n);
#pragma omp simd
        for (int64_t j = 0; j < n; j++) dst[o + j] += buf[j];
    }
}

static void add_row_f64(double *dst, const char *src, nb_dtype sdt, int64_t w) {
    if (sdt == NB_F64) {
        const double *s = (const double *)src;
#pragma omp simd
        for (int64_t j = 0; j < w; j++) dst[j] += s[j];
        return;
    }
    int64_t es = (int64_t)nb_dtype_size(sdt);
    for (int64_t j = 0; j < w; j++) dst[j] += nb__load_f64(src + j * es, sdt);
}

typedef struct {
    char *op;
    const char *sp;
    const void *ip;
    bool i64;
    nb_dtype odt, sdt;
    int64_t oes, ses, S, M, D, nblk;
} index_add_job;

/* Task t: outer slice t / nblk, column block t % nblk, every index row in order. */
static void index_add_task(int64_t t, void *ctx) {
    const index_add_job *j = ctx;
    int64_t o = t / j->nblk, b = t % j->nblk, D = j->D;
    int64_t j0 = D * b / j->nblk, w = D * (b + 1) / j->nblk - j0;
    for (int64_t m = 0; m < j->M; m++) {
        int64_t r = idx_at(j->ip, j->i64, m);
        char *dst = j->op + ((o * j->S + r) * D + j0) * j->oes;
        const char *s = j->sp + ((o * j->M + m) * D + j0) * j->ses;
        if (j->odt == NB_F64) add_row_f64((double *)dst, s, j->sdt, w);
        else add_row_f32((float *)dst, s, j->sdt, w);
    }
}

static nb_status cpu_index_add(const nb__index_add_args *a) {
    const nb__view *out = &a->out;
    int dim = a->dim;
    int64_t O = 1, S = 1, D = 1, M = view_numel(&a->index);
    for (int d = 0; d < out->ndim; d++) {
        if (d < dim) O *= out->shape[d];
        else if (d == dim) S = out->shape[d];
        else D *= out->shape[d];
    }
    if (O * M * D == 0) return NB_OK;
    int nt = nb__threads_for(O * M * D, NB__GRAIN);
    /* Tasks: one per outer slice, each split into nblk column blocks when the slices alone
     * cannot occupy the threads. */
    int64_t nblk = 1;
    if (O < nt) {
        int64_t want = (nt + O - 1) / O, most = (D + IA_MINW - 1) / IA_MINW;
        nblk = want < most ? want : most;
    }
    int64_t ntask = O * nblk;
    if (ntask < nt) nt = (int)ntask;
    nb_dtype odt = out->dtype, sdt = a->src.dtype;
    index_add_job j = {out->data, a->src.data, a->index.data, a->index.dtype == NB_I64, odt,
                       sdt, (int64_t)nb_dtype_size(odt), (int64_t)nb_dtype_size(sdt), S, M, D,
                       nblk};
    nb__run_tasks(ntask, nt, index_add_task, &j);
    return NB_OK;
}

/* ---- the kernel table's entries ----------------------------------------------------------- */
void nb__cpu_register_index(nb__kernels *k) {
    k->index_select = cpu_index_select;
    k->gather = cpu_gather;
    k->scatter_add = cpu_scatter_add;
    k->index_add = cpu_index_add;
    k->masked_fill = cpu_masked_fill;
    k->one_hot = cpu_one_hot;
    k->index_minmax = cpu_index_minmax;
    k->tri = cpu_tri;
}
