/* test_index.c - the "index" suite: index_select, gather, scatter_add, embedding,
 * masked_fill, one_hot, tril/triu, cat, stack, split and chunk.
 *
 * Each op is run table-driven over shapes (empty, size-1, 0-dim where sensible), every
 * dtype, contiguous and non-contiguous inputs, and compared with a plain reference loop
 * over the input values read back as doubles. A last test walks every user error. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "testutil.h"

static const nb_dtype ALL[] = {NB_F32, NB_F64, NB_F16, NB_BF16, NB_I32, NB_I64, NB_U8, NB_BOOL};
#define NALL ((int)(sizeof ALL / sizeof ALL[0]))
static const nb_dtype IDX[] = {NB_I32, NB_I64};

static int64_t ravel(const int64_t *p, const int64_t *shape, int nd) {
    int64_t r = 0;
    for (int d = 0; d < nd; d++) r = r * shape[d] + p[d];
    return r;
}

/* v rounded to what dtype dt stores (integers wrap, bool is v != 0). */
static double cast_to(double v, nb_dtype dt) {
    uint64_t b = 0;
    nb__store_f64(&b, dt, v);
    return nb__load_f64(&b, dt);
}

/* An index tensor of dtype dt with values uniform in [lo, hi) (integers). */
static nb_tensor *rand_index(const int64_t *shape, int nd, int64_t lo, int64_t hi, nb_dtype dt,
                             uint64_t seed) {
    return tu_random(shape, nd, dt, (double)lo, (double)hi, seed);
}

static nb_tensor *maybe_nc(nb_tensor *t, int nc) { return nc ? tu_noncontig(t) : t; }

static nb_tensor *data(const int64_t *shape, int nd, nb_dtype dt, uint64_t seed) {
    return tu_random(shape, nd, dt, -8, 8, seed);
}

/* ---- index_select -------------------------------------------------------------------------- */
typedef struct {
    int nd;
    int64_t shape[4];
    int dim;
    int64_t m; /* index length */
} sel_case;

static const sel_case SEL[] = {
    {3, {5, 4, 3}, 0, 7},  {3, {5, 4, 3}, 1, 2},  {3, {5, 4, 3}, 2, 5},
    {3, {5, 4, 3}, -1, 4}, {3, {3, 8, 16}, 1, 5}, {2, {6, 9}, -2, 3},
    {1, {7}, 0, 9},        {2, {4, 6}, 1, 0},     {3, {3, 0, 2}, 0, 2},
    {0, {0}, 0, 1},        {2, {1, 1}, 0, 3},
};

static void check_index_select(nb_tensor *x, int dim, nb_tensor *index) {
    int nd = nb_ndim(x), d = dim < 0 ? dim + nd : dim;
    const int64_t *xs = nb_shape(x);
    int64_t m = nb_numel(index), osh[4];
    memcpy(osh, xs, sizeof(int64_t) * (size_t)nd);
    if (nd) osh[d] = m;
    double *xv = tu_values(x), *iv = tu_values(index);
    int64_t n = tu_numel(osh, nd);
    double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        int64_t p[4] = {0};
        tu_unravel(i, osh, nd, p);
        if (nd) p[d] = (int64_t)iv[p[d]];
        ref[i] = xv[ravel(p, xs, nd)];
    }
    nb_tensor *y = nb_index_select(x, dim, index);
    tu_assert_close(y, ref, osh, nd, 0);
    ck_assert_int_eq(nb_tensor_dtype(y), nb_tensor_dtype(x));
    free(xv), free(iv), free(ref);
}

START_TEST(test_index_select) {
    nb_scope_begin();
    for (size_t c = 0; c < sizeof SEL / sizeof SEL[0]; c++) {
        const sel_case *k = &SEL[c];
        int d = k->dim < 0 ? k->dim + k->nd : k->dim;
        int64_t lim = k->nd ? k->shape[d] : 1;
        for (int t = 0; t < NALL; t++)
            for (int it = 0; it < 2; it++)
                for (int nc = 0; nc < 2; nc++) {
                    nb_scope_begin();
                    nb_tensor *x = maybe_nc(data(k->shape, k->nd, ALL[t], 10 + c), nc);
                    nb_tensor *idx = rand_index(&k->m, 1, 0, lim ? lim : 1, IDX[it], 20 + c);
                    check_index_select(x, k->dim, maybe_nc(idx, nc));
                    nb_scope_end();
                }
    }
    /* strided leading dim with contiguous rows (the memcpy path over a strided base) */
    for (int t = 0; t < NALL; t++) {
        nb_tensor *big = data((int64_t[]){10, 8}, 2, ALL[t], 3);
        nb_tensor *x = nb_slice(big, 0, 1, 10, 2); /* (5, 8), row stride 16 */
        nb_tensor *cols = nb_narrow(big, 1, 2, 5);  /* (10, 5), row stride 8 */
        nb_tensor *idx = tu_tensor((double[]){4, 0, 0, 2}, (int64_t[]){4}, 1, NB_I64);
        check_index_select(x, 0, idx);
        check_index_select(cols, 0, idx);
        check_index_select(cols, 1, idx);
    }
    /* 0-dim index picks one position and keeps the dim */
    nb_tensor *x = data((int64_t[]){4, 3}, 2, NB_F32, 5);
    nb_tensor *y = nb_index_select(x, 1, nb_scalar(2, NB_I64));
    ck_assert_int_eq(nb_ndim(y), 2);
    ck_assert_int_eq(nb_shape(y)[1], 1);
    ck_assert(nb_get_f64(y, (int64_t[]){3, 0}) == nb_get_f64(x, (int64_t[]){3, 2}));
    nb_scope_end();
}
END_TEST

/* ---- gather -------------------------------------------------------------------------------- */
typedef struct {
    int nd;
    int64_t xshape[4], ishape[4];
    int dim;
} gather_case;

static const gather_case GAT[] = {
    {3, {4, 5, 3}, {6, 5, 2}, 0}, {3, {4, 5, 3}, {4, 7, 3}, 1}, {3, {4, 5, 3}, {2, 5, 4}, 2},
    {3, {4, 5, 3}, {1, 3, 7}, -1}, {2, {3, 4}, {3, 4}, 1},       {1, {6}, {10}, 0},
    {2, {3, 4}, {0, 4}, 0},        {2, {3, 1}, {2, 1}, -2},      {0, {0}, {0}, 0},
};

START_TEST(test_gather) {
    nb_scope_begin();
    for (size_t c = 0; c < sizeof GAT / sizeof GAT[0]; c++) {
        const gather_case *k = &GAT[c];
        int nd = k->nd, d = k->dim < 0 ? k->dim + nd : k->dim;
        int64_t lim = nd ? k->xshape[d] : 1, n = tu_numel(k->ishape, nd);
        for (int t = 0; t < NALL; t++)
            for (int it = 0; it < 2; it++)
                for (int nc = 0; nc < 2; nc++) {
                    nb_scope_begin();
                    nb_tensor *x = maybe_nc(data(k->xshape, nd, ALL[t], 30 + c), nc);
                    nb_tensor *idx =
                        maybe_nc(rand_index(k->ishape, nd, 0, lim, IDX[it], 40 + c), nc);
                    double *xv = tu_values(x), *iv = tu_values(idx);
                    double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
                    for (int64_t i = 0; i < n; i++) {
                        int64_t p[4] = {0};
                        tu_unravel(i, k->ishape, nd, p);
                        if (nd) p[d] = (int64_t)iv[i];
                        ref[i] = xv[ravel(p, k->xshape, nd)];
                    }
                    tu_assert_close(nb_gather(x, k->dim, idx), ref, k->ishape, nd, 0);
                    free(xv), free(iv), free(ref);
                    nb_scope_end();
                }
    }
    nb_scope_end();
}
END_TEST

/* ---- scatter_add --------------------------------------------------------------------------- */
typedef struct {
    int nd;
    int64_t xshape[4], ishape[4], sshape[4];
    int dim;
} scatter_case;

static const scatter_case SCA[] = {
    {3, {4, 5, 3}, {6, 5, 3}, {6, 5, 3}, 0},  /* contiguous path, collisions */
    {3, {4, 5, 3}, {3, 7, 2}, {4, 7, 3}, 1},  /* general path: src larger than index */
    {3, {4, 5, 3}, {4, 5, 6}, {4, 5, 6}, -1}, /* contiguous path along the last dim */
    {2, {3, 4}, {2, 3}, {3, 4}, 0},
    {1, {5}, {9}, {9}, 0},
    {2, {3, 4}, {0, 4}, {0, 4}, 0},
    {0, {0}, {0}, {0}, 0},
};

static double *scatter_ref(const double *xv, const int64_t *xs, const double *iv,
                           const int64_t *is, const double *sv, const int64_t *ss, int nd, int d,
                           nb_dtype dt) {
    int64_t nx = tu_numel(xs, nd), ni = tu_numel(is, nd);
    double *ref = malloc(sizeof(double) * (size_t)(nx ? nx : 1));
    memcpy(ref, xv, sizeof(double) * (size_t)nx);
    for (int64_t i = 0; i < ni; i++) {
        int64_t p[4] = {0}, q[4] = {0};
        tu_unravel(i, is, nd, p);
        memcpy(q, p, sizeof q);
        if (nd) q[d] = (int64_t)iv[i];
        ref[ravel(q, xs, nd)] += sv[ravel(p, ss, nd)];
    }
    for (int64_t i = 0; i < nx; i++) ref[i] = cast_to(ref[i], dt);
    return ref;
}

START_TEST(test_scatter_add) {
    nb_scope_begin();
    for (size_t c = 0; c < sizeof SCA / sizeof SCA[0]; c++) {
        const scatter_case *k = &SCA[c];
        int nd = k->nd, d = k->dim < 0 ? k->dim + nd : k->dim;
        int64_t lim = nd ? k->xshape[d] : 1;
        for (int t = 0; t < NALL; t++)
            for (int it = 0; it < 2; it++)
                for (int nc = 0; nc < 2; nc++) {
                    nb_scope_begin();
                    nb_tensor *x = maybe_nc(data(k->xshape, nd, ALL[t], 50 + c), nc);
                    nb_tensor *src = maybe_nc(data(k->sshape, nd, ALL[t], 60 + c), nc);
                    nb_tensor *idx =
                        maybe_nc(rand_index(k->ishape, nd, 0, lim, IDX[it], 70 + c), nc);
                    double *xv = tu_values(x), *iv = tu_values(idx), *sv = tu_values(src);
                    double *ref = scatter_ref(xv, k->xshape, iv, k->ishape, sv, k->sshape, nd,
                                              d, ALL[t]);
                    nb_tensor *y = nb_scatter_add(x, k->dim, idx, src);
                    tu_assert_close(y, ref, k->xshape, nd, tu_tol(ALL[t]));
                    ck_assert_int_eq(nb_tensor_dtype(y), ALL[t]);
                    ck_assert(!nb_shares_storage(y, x));
                    /* x itself is unchanged (scatter_add returns a new tensor) */
                    double *xv2 = tu_values(x);
                    ck_assert(memcmp(xv, xv2, sizeof(double) * (size_t)nb_numel(x)) == 0);
                    free(xv), free(iv), free(sv), free(ref), free(xv2);
                    nb_scope_end();
                }
    }
    nb_scope_end();
}
END_TEST

/* Many additions into few elements, large enough to run on several threads: the result
 * must be bit-identical with one thread (fixed order), on both kernel paths. */
START_TEST(test_scatter_add_deterministic) {
    nb_scope_begin();
    int64_t xs[2] = {64, 40}, is[2] = {2048, 40};
    for (int nc = 0; nc < 2; nc++) {
        nb_tensor *x = data(xs, 2, NB_F32, 1);
        nb_tensor *src = maybe_nc(tu_random(is, 2, NB_F32, -1, 1, 2), nc);
        nb_tensor *idx = rand_index(is, 2, 0, 64, NB_I64, 3);
        nb_tensor *a = nb_scatter_add(x, 0, idx, src);
#ifdef _OPENMP
        int saved = omp_get_max_threads();
        omp_set_num_threads(1);
#endif
        nb_tensor *b = nb_scatter_add(x, 0, idx, src);
#ifdef _OPENMP
        omp_set_num_threads(saved);
#endif
        ck_assert(a && b);
        void *ra = tu_raw_values(a), *rb = tu_raw_values(b);
        ck_assert(memcmp(ra, rb, sizeof(float) * 64 * 40) == 0);
        free(ra), free(rb);
        double *xv = tu_values(x), *iv = tu_values(idx), *sv = tu_values(src);
        double *ref = scatter_ref(xv, xs, iv, is, sv, is, 2, 0, NB_F64);
        tu_assert_close(a, ref, xs, 2, 1e-4);
        free(xv), free(iv), free(sv), free(ref);
    }
    nb_scope_end();
}
END_TEST

/* ---- embedding ----------------------------------------------------------------------------- */
static void check_embedding(nb_tensor *w, nb_tensor *idx) {
    int nd = nb_ndim(idx);
    int64_t D = nb_shape(w)[1], n = nb_numel(idx), osh[NB_MAX_DIMS];
    memcpy(osh, nb_shape(idx), sizeof(int64_t) * (size_t)nd);
    osh[nd] = D;
    double *wv = tu_values(w), *iv = tu_values(idx);
    double *ref = malloc(sizeof(double) * (size_t)(n * D + 1));
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < D; j++) ref[i * D + j] = wv[(int64_t)iv[i] * D + j];
    tu_assert_close(nb_embedding(w, idx), ref, osh, nd + 1, 0);
    free(wv), free(iv), free(ref);
}

START_TEST(test_embedding) {
    nb_scope_begin();
    struct {
        int nd;
        int64_t shape[3];
    } ishapes[] = {{2, {2, 3}}, {1, {7}}, {0, {0}}, {1, {0}}, {3, {2, 0, 3}}};
    for (int t = 0; t < NALL; t++)
        for (int it = 0; it < 2; it++)
            for (size_t s = 0; s < sizeof ishapes / sizeof ishapes[0]; s++)
                for (int64_t D = 3; D <= 6; D += 3) {
                    nb_scope_begin();
                    nb_tensor *w = data((int64_t[]){10, D}, 2, ALL[t], 80 + (uint64_t)D);
                    nb_tensor *idx =
                        rand_index(ishapes[s].shape, ishapes[s].nd, 0, 10, IDX[it], 90 + s);
                    check_embedding(w, idx);
                    check_embedding(tu_noncontig(w), maybe_nc(idx, ishapes[s].nd >= 1));
                    /* a column slice: rows stay contiguous but are 8 apart */
                    nb_tensor *big = data((int64_t[]){10, 8}, 2, ALL[t], 7);
                    check_embedding(nb_narrow(big, 1, 1, D), idx);
                    nb_scope_end();
                }
    nb_scope_end();
}
END_TEST

/* ---- masked_fill --------------------------------------------------------------------------- */
START_TEST(test_masked_fill) {
    nb_scope_begin();
    struct {
        int xnd, mnd;
        int64_t xs[3], ms[3];
    } cases[] = {
        {3, 3, {3, 4, 5}, {3, 4, 5}}, {3, 2, {3, 4, 5}, {4, 5}}, {3, 1, {3, 4, 5}, {5}},
        {3, 2, {3, 4, 5}, {4, 1}},    {3, 3, {3, 4, 5}, {1, 1, 5}}, {3, 0, {3, 4, 5}, {0}},
        {0, 0, {0}, {0}},             {2, 1, {0, 5}, {5}},       {2, 2, {2, 1}, {2, 1}},
    };
    const double values[] = {2.5, -3};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int t = 0; t < NALL; t++)
            for (int nc = 0; nc < 2; nc++)
                for (int v = 0; v < 2; v++) {
                    nb_scope_begin();
                    int xnd = cases[c].xnd, mnd = cases[c].mnd;
                    const int64_t *xs = cases[c].xs, *ms = cases[c].ms;
                    nb_tensor *x = maybe_nc(data(xs, xnd, ALL[t], 100 + c), nc);
                    nb_tensor *mask = maybe_nc(tu_random(ms, mnd, NB_BOOL, -1, 1, 110 + c), nc);
                    int64_t n = tu_numel(xs, xnd);
                    double *xv = tu_values(x), *mv = tu_values(mask);
                    double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
                    double fill = cast_to(values[v], ALL[t]);
                    for (int64_t i = 0; i < n; i++) {
                        int64_t p[3] = {0}, q[3] = {0};
                        tu_unravel(i, xs, xnd, p);
                        for (int j = 0; j < mnd; j++)
                            q[j] = ms[j] == 1 ? 0 : p[j + xnd - mnd];
                        ref[i] = mv[ravel(q, ms, mnd)] != 0 ? fill : xv[i];
                    }
                    nb_tensor *y = nb_masked_fill(x, mask, values[v]);
                    tu_assert_close(y, ref, xs, xnd, 0);
                    ck_assert_int_eq(nb_tensor_dtype(y), ALL[t]);
                    free(xv), free(mv), free(ref);
                    nb_scope_end();
                }
    nb_scope_end();
}
END_TEST

/* ---- one_hot ------------------------------------------------------------------------------- */
START_TEST(test_one_hot) {
    nb_scope_begin();
    struct {
        int nd;
        int64_t shape[2];
    } cases[] = {{2, {2, 3}}, {1, {5}}, {0, {0}}, {1, {0}}, {2, {3, 1}}};
    const int64_t classes[] = {4, 6, -1};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int t = 0; t < NALL; t++)
            for (int it = 0; it < 2; it++)
                for (int nc = 0; nc < 2; nc++)
                    for (int k = 0; k < 3; k++) {
                        int nd = cases[c].nd;
                        int64_t n = tu_numel(cases[c].shape, nd);
                        if (classes[k] == -1 && n == 0) continue; /* an error, tested below */
                        nb_scope_begin();
                        nb_tensor *idx = maybe_nc(
                            rand_index(cases[c].shape, nd, 0, 4, IDX[it], 120 + c), nc);
                        double *iv = tu_values(idx);
                        int64_t C = classes[k];
                        if (C == -1) {
                            C = 0;
                            for (int64_t i = 0; i < n; i++)
                                if ((int64_t)iv[i] + 1 > C) C = (int64_t)iv[i] + 1;
                        }
                        int64_t osh[3] = {0};
                        memcpy(osh, cases[c].shape, sizeof(int64_t) * (size_t)nd);
                        osh[nd] = C;
                        double *ref = calloc((size_t)(n * C + 1), sizeof(double));
                        for (int64_t i = 0; i < n; i++) ref[i * C + (int64_t)iv[i]] = 1;
                        nb_tensor *y = nb_one_hot(idx, classes[k], ALL[t]);
                        tu_assert_close(y, ref, osh, nd + 1, 0);
                        ck_assert_int_eq(nb_tensor_dtype(y), ALL[t]);
                        free(iv), free(ref);
                        nb_scope_end();
                    }
    nb_scope_end();
}
END_TEST

/* ---- tril / triu --------------------------------------------------------------------------- */
START_TEST(test_tril_triu) {
    nb_scope_begin();
    struct {
        int nd;
        int64_t shape[4];
    } cases[] = {{2, {4, 5}}, {2, {5, 4}}, {4, {2, 3, 4, 5}}, {3, {3, 0, 4}},
                 {2, {1, 1}}, {3, {2, 1, 6}}};
    const int64_t ks[] = {-100, -2, -1, 0, 1, 3, 100, INT64_MAX, INT64_MIN};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int t = 0; t < NALL; t++)
            for (int nc = 0; nc < 2; nc++) {
                nb_scope_begin();
                int nd = cases[c].nd;
                const int64_t *sh = cases[c].shape;
                nb_tensor *x = maybe_nc(data(sh, nd, ALL[t], 130 + c), nc);
                int64_t n = tu_numel(sh, nd);
                double *xv = tu_values(x);
                double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
                for (size_t kk = 0; kk < sizeof ks / sizeof ks[0]; kk++)
                    for (int lower = 0; lower < 2; lower++) {
                        int64_t k = ks[kk];
                        for (int64_t i = 0; i < n; i++) {
                            int64_t p[4];
                            tu_unravel(i, sh, nd, p);
                            int64_t diff = p[nd - 1] - p[nd - 2]; /* j - i */
                            bool keep = lower ? diff <= k : diff >= k;
                            ref[i] = keep ? xv[i] : 0;
                        }
                        nb_tensor *y = lower ? nb_tril(x, k) : nb_triu(x, k);
                        tu_assert_close(y, ref, sh, nd, 0);
                    }
                free(xv), free(ref);
                nb_scope_end();
            }
    nb_scope_end();
}
END_TEST

/* ---- cat ------------------------------------------------------------------------------------- */
START_TEST(test_cat) {
    nb_scope_begin();
    const int64_t base[3] = {2, 3, 4};
    for (int dim = -3; dim < 3; dim++)
        for (int t = 0; t < NALL; t++)
            for (int nc = 0; nc < 2; nc++) {
                nb_scope_begin();
                int d = dim < 0 ? dim + 3 : dim;
                nb_tensor *xs[3];
                double *xv[3];
                int64_t sh[3][3], start[4] = {0};
                for (int i = 0; i < 3; i++) {
                    memcpy(sh[i], base, sizeof base);
                    sh[i][d] = i + 1;
                    xs[i] = maybe_nc(data(sh[i], 3, ALL[t], 140 + (uint64_t)i), nc && i != 1);
                    xv[i] = tu_values(xs[i]);
                    start[i + 1] = start[i] + i + 1;
                }
                int64_t osh[3];
                memcpy(osh, base, sizeof base);
                osh[d] = 6;
                double ref[2 * 3 * 4 * 6];
                for (int64_t i = 0; i < tu_numel(osh, 3); i++) {
                    int64_t p[3];
                    tu_unravel(i, osh, 3, p);
                    int w = p[d] < start[1] ? 0 : p[d] < start[2] ? 1 : 2;
                    p[d] -= start[w];
                    ref[i] = xv[w][ravel(p, sh[w], 3)];
                }
                nb_tensor *y = nb_cat(xs, 3, dim);
                tu_assert_close(y, ref, osh, 3, 0);
                ck_assert_int_eq(nb_tensor_dtype(y), ALL[t]);
                for (int i = 0; i < 3; i++) free(xv[i]);
                nb_scope_end();
            }
    /* promotion like PyTorch */
    const nb_dtype pairs[][2] = {{NB_F32, NB_I32}, {NB_I32, NB_I64}, {NB_U8, NB_BOOL},
                                 {NB_F16, NB_BF16}, {NB_BOOL, NB_F64}, {NB_F16, NB_F32}};
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
        nb_tensor *a = data((int64_t[]){2, 2}, 2, pairs[p][0], 1);
        nb_tensor *b = data((int64_t[]){1, 2}, 2, pairs[p][1], 2);
        nb_tensor *y = nb_cat((nb_tensor *[]){a, b}, 2, 0);
        nb_dtype want = nb_dtype_promote(pairs[p][0], pairs[p][1]);
        ck_assert_int_eq(nb_tensor_dtype(y), want);
        double *av = tu_values(a), *bv = tu_values(b), ref[6];
        for (int i = 0; i < 4; i++) ref[i] = cast_to(av[i], want);
        for (int i = 0; i < 2; i++) ref[4 + i] = cast_to(bv[i], want);
        tu_assert_close(y, ref, ((int64_t[]){3, 2}), 2, 0);
        free(av), free(bv);
    }
    /* legacy: 1-D empty tensors are skipped whatever the others' shape */
    nb_tensor *e = nb_zeros((int64_t[]){0}, 1, NB_F32);
    nb_tensor *x = data((int64_t[]){2, 3}, 2, NB_F32, 4);
    double *xv = tu_values(x);
    tu_assert_close(nb_cat((nb_tensor *[]){e, x, e}, 3, 1), xv, ((int64_t[]){2, 3}), 2, 0);
    tu_assert_close(nb_cat((nb_tensor *[]){e, e}, 2, 0), xv, ((int64_t[]){0}), 1, 0);
    /* a piece empty along dim, and a single tensor (a copy, not a view) */
    nb_tensor *z = nb_zeros((int64_t[]){2, 0}, 2, NB_F32);
    tu_assert_close(nb_cat((nb_tensor *[]){z, x, z}, 3, -1), xv, ((int64_t[]){2, 3}), 2, 0);
    nb_tensor *one = nb_cat(&x, 1, 0);
    tu_assert_close(one, xv, ((int64_t[]){2, 3}), 2, 0);
    ck_assert(!nb_shares_storage(one, x));
    free(xv);
    nb_scope_end();
}
END_TEST

/* ---- stack ----------------------------------------------------------------------------------- */
START_TEST(test_stack) {
    nb_scope_begin();
    struct {
        int nd;
        int64_t shape[2];
    } cases[] = {{2, {2, 3}}, {0, {0}}, {2, {0, 2}}, {1, {4}}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int nd = cases[c].nd;
        const int64_t *sh = cases[c].shape;
        for (int dim = -(nd + 1); dim <= nd; dim++)
            for (int t = 0; t < NALL; t++)
                for (int nc = 0; nc < 2; nc++) {
                    nb_scope_begin();
                    int d = dim < 0 ? dim + nd + 1 : dim;
                    nb_tensor *xs[3];
                    double *xv[3];
                    for (int i = 0; i < 3; i++) {
                        xs[i] = maybe_nc(data(sh, nd, ALL[t], 150 + (uint64_t)i), nc && i != 2);
                        xv[i] = tu_values(xs[i]);
                    }
                    int64_t osh[3];
                    for (int i = 0, k = 0; i <= nd; i++) osh[i] = i == d ? 3 : sh[k++];
                    int64_t n = tu_numel(osh, nd + 1);
                    double ref[3 * 6];
                    for (int64_t i = 0; i < n; i++) {
                        int64_t p[3], q[2] = {0};
                        tu_unravel(i, osh, nd + 1, p);
                        for (int j = 0, k = 0; j <= nd; j++)
                            if (j != d) q[k++] = p[j];
                        ref[i] = xv[p[d]][ravel(q, sh, nd)];
                    }
                    nb_tensor *y = nb_stack(xs, 3, dim);
                    tu_assert_close(y, ref, osh, nd + 1, 0);
                    ck_assert_int_eq(nb_tensor_dtype(y), ALL[t]);
                    for (int i = 0; i < 3; i++) free(xv[i]);
                    nb_scope_end();
                }
    }
    nb_tensor *a = data((int64_t[]){2}, 1, NB_F32, 1), *b = data((int64_t[]){2}, 1, NB_F64, 2);
    ck_assert_int_eq(nb_tensor_dtype(nb_stack((nb_tensor *[]){a, b}, 2, 0)), NB_F64);
    nb_scope_end();
}
END_TEST

/* ---- split / chunk ----------------------------------------------------------------------- */
/* Checks pieces of t along d: sizes as expected, views of t, values equal to t's. */
static void check_pieces(nb_tensor *t, int d, nb_tensor **out, int count,
                         const int64_t *sizes, int want) {
    ck_assert_int_eq(count, want);
    int nd = nb_ndim(t);
    double *tv = tu_values(t);
    int64_t start = 0;
    for (int i = 0; i < count; i++) {
        int64_t sh[NB_MAX_DIMS];
        memcpy(sh, nb_shape(t), sizeof(int64_t) * (size_t)nd);
        sh[d] = sizes[i];
        int64_t n = tu_numel(sh, nd);
        double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
        for (int64_t j = 0; j < n; j++) {
            int64_t p[NB_MAX_DIMS];
            tu_unravel(j, sh, nd, p);
            p[d] += start;
            ref[j] = tv[ravel(p, nb_shape(t), nd)];
        }
        tu_assert_close(out[i], ref, sh, nd, 0);
        ck_assert(nb_shares_storage(out[i], t));
        start += sizes[i];
        free(ref);
    }
    ck_assert_int_eq(start, nb_shape(t)[d]);
    free(tv);
}

START_TEST(test_split_chunk) {
    nb_scope_begin();
    nb_tensor *out[16];
    for (int nc = 0; nc < 2; nc++) {
        nb_tensor *t = maybe_nc(data((int64_t[]){10, 6}, 2, NB_F32, 9), nc);
        check_pieces(t, 0, out, nb_split(t, 3, 0, out, 16), (int64_t[]){3, 3, 3, 1}, 4);
        check_pieces(t, 0, out, nb_split(t, 5, 0, out, 2), (int64_t[]){5, 5}, 2);
        check_pieces(t, 0, out, nb_split(t, 20, 0, out, 16), (int64_t[]){10}, 1);
        check_pieces(t, 1, out, nb_split(t, 4, -1, out, 16), (int64_t[]){4, 2}, 2);
        check_pieces(t, 1, out, nb_split(t, 1, 1, out, 16), (int64_t[]){1, 1, 1, 1, 1, 1}, 6);
        check_pieces(t, 0, out, nb_chunk(t, 3, 0, out, 16), (int64_t[]){4, 4, 2}, 3);
        check_pieces(t, 1, out, nb_chunk(t, 4, 1, out, 16), (int64_t[]){2, 2, 2}, 3);
        check_pieces(t, 0, out, nb_chunk(t, 20, -2, out, 16),
                     (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 10);
        check_pieces(t, 1, out, nb_chunk(t, 1, -1, out, 1), (int64_t[]){6}, 1);
        /* writing through a piece is visible in t */
        ck_assert_int_eq(nb_chunk(t, 2, 0, out, 16), 2);
        ck_assert(nb_fill_(out[1], 42) == NB_OK);
        ck_assert(nb_get_f64(t, (int64_t[]){7, 3}) == 42);
    }
    nb_tensor *e = nb_zeros((int64_t[]){0, 3}, 2, NB_I32);
    check_pieces(e, 0, out, nb_split(e, 2, 0, out, 16), (int64_t[]){0}, 1);
    check_pieces(e, 0, out, nb_split(e, 0, 0, out, 16), (int64_t[]){0}, 1);
    check_pieces(e, 0, out, nb_chunk(e, 3, 0, out, 16), (int64_t[]){0, 0, 0}, 3);
    check_pieces(e, 1, out, nb_chunk(e, 2, 1, out, 16), (int64_t[]){2, 1}, 2);
    /* pieces outlive the scope they were made in when kept, like any op result */
    nb_tensor *x = data((int64_t[]){4}, 1, NB_F64, 3);
    nb_scope_begin();
    ck_assert_int_eq(nb_split(x, 2, 0, out, 16), 2);
    nb_keep(out[1]);
    nb_scope_end();
    ck_assert(nb_get_f64(out[1], (int64_t[]){1}) == nb_get_f64(x, (int64_t[]){3}));
    nb_scope_end();
}
END_TEST

/* ---- multi-threaded paths ----------------------------------------------------------------- */
/* Runs expr with 2 threads and with 1 and checks the results are bit-identical; sizes are
 * just above the threshold where kernels split work, with odd row lengths so that thread
 * chunks start in the middle of rows. */
static void set_threads(int n) {
#ifdef _OPENMP
    omp_set_num_threads(n);
#else
    (void)n;
#endif
}

#define TWICE(EXPR)                                                                        \
    do {                                                                                   \
        set_threads(2);                                                                    \
        nb_tensor *a_ = (EXPR);                                                            \
        set_threads(1);                                                                    \
        nb_tensor *b_ = (EXPR);                                                            \
        set_threads(saved);                                                                \
        tu_assert_same_bytes(a_, b_);                                                               \
    } while (0)

START_TEST(test_parallel_paths) {
    nb_scope_begin();
#ifdef _OPENMP
    int saved = omp_get_max_threads();
#else
    int saved = 1;
#endif
    nb_tensor *x = data((int64_t[]){50, 257}, 2, NB_F32, 1);
    nb_tensor *gi = rand_index((int64_t[]){301, 257}, 2, 0, 50, NB_I64, 2);
    TWICE(nb_gather(x, 0, gi));
    TWICE(nb_gather(tu_noncontig(x), 0, gi));
    /* the reference for one of them, to tie the parallel result to the definition */
    double *xv = tu_values(x), *iv = tu_values(gi), *ref = malloc(sizeof(double) * 301 * 257);
    for (int64_t i = 0; i < 301 * 257; i++) ref[i] = xv[(int64_t)iv[i] * 257 + i % 257];
    tu_assert_close(nb_gather(x, 0, gi), ref, ((int64_t[]){301, 257}), 2, 0);
    free(xv), free(iv), free(ref);

    nb_tensor *big = data((int64_t[]){3001, 33}, 2, NB_F16, 3);
    nb_tensor *si = rand_index((int64_t[]){2500}, 1, 0, 3001, NB_I32, 4);
    TWICE(nb_index_select(big, 0, si));                  /* row memcpy path */
    TWICE(nb_index_select(tu_noncontig(big), 0, si));    /* general path, dim first */
    nb_tensor *ci = rand_index((int64_t[]){31}, 1, 0, 33, NB_I64, 5);
    TWICE(nb_index_select(big, 1, ci));                  /* general path, dim last */
    TWICE(nb_embedding(big, gi));
    TWICE(nb_tril(tu_noncontig(data((int64_t[]){2, 200, 201}, 3, NB_F64, 6)), 3));
    TWICE(nb_triu(data((int64_t[]){2, 200, 201}, 3, NB_U8, 7), -5));
    TWICE(nb_one_hot(rand_index((int64_t[]){20001}, 1, 0, 5, NB_I64, 8), -1, NB_BF16));
    nb_tensor *mx = data((int64_t[]){301, 257}, 2, NB_I32, 9);
    TWICE(nb_masked_fill(mx, tu_random((int64_t[]){257}, 1, NB_BOOL, -1, 1, 10), 5));
    /* out-of-range values found by the parallel min/max scan */
    nb_tensor *bad = nb_clone(gi);
    nb_tensor *bad_at = nb_select(nb_select(bad, 0, 300), 0, 254); /* element 301*257-3 */
    ck_assert(nb_fill_(bad_at, 50) == NB_OK);
    set_threads(2);
    tu_assert_index_error(nb_gather(x, 0, bad), NB_EINDEX, "index 50 is out of range");
    ck_assert(nb_fill_(bad_at, -7) == NB_OK);
    tu_assert_index_error(nb_gather(x, 0, bad), NB_EINDEX, "index -7 is out of range");
    set_threads(saved);
    nb_scope_end();
}
END_TEST

/* ---- user errors ----------------------------------------------------------------------------- */
/* bytes the allocator has handed out: unchanged across a failing call means no leak */
static int64_t live_bytes(void) {
    nb_alloc_stats st;
    nb_alloc_get_stats(&st);
    return st.bytes_live;
}

START_TEST(test_index_errors) {
    nb_scope_begin();
    nb_clear_error();
    nb_tensor *x = data((int64_t[]){10, 4}, 2, NB_F32, 1);
    nb_tensor *i12 = tu_tensor((double[]){1, 12, 3}, (int64_t[]){3}, 1, NB_I64);
    nb_tensor *ineg = tu_tensor((double[]){1, -1}, (int64_t[]){2}, 1, NB_I32);
    nb_tensor *ok = tu_tensor((double[]){1, 2}, (int64_t[]){2}, 1, NB_I64);
    nb_tensor *fidx = tu_tensor((double[]){1, 2}, (int64_t[]){2}, 1, NB_F32);
    nb_tensor *u8idx = tu_tensor((double[]){1, 2}, (int64_t[]){2}, 1, NB_U8);
    nb_tensor *i2d = tu_tensor((double[]){1, 2}, (int64_t[]){1, 2}, 2, NB_I64);

    /* index_select */
    tu_assert_index_error(nb_index_select(x, 0, i12), NB_EINDEX,
                    "index_select: index 12 is out of range for dim 0 of size 10");
    tu_assert_index_error(nb_index_select(x, 0, ineg), NB_EINDEX, "index -1 is out of range");
    tu_assert_index_error(nb_index_select(x, 1, nb_narrow(i12, 0, 1, 1)), NB_EINDEX,
                    "for dim 1 of size 4");
    tu_assert_error(nb_index_select(x, 0, fidx), NB_EDTYPE, "i32 or i64");
    tu_assert_error(nb_index_select(x, 0, u8idx), NB_EDTYPE, "got u8");
    tu_assert_error(nb_index_select(x, 0, i2d), NB_ESHAPE, "1-D");
    tu_assert_error(nb_index_select(x, 2, ok), NB_EDIM, "index_select");
    tu_assert_error(nb_index_select(x, -3, ok), NB_EDIM, "dim -3");
    tu_assert_error(nb_index_select(nb_scalar(1, NB_F32), 0, ok), NB_ESHAPE, "0-dim");
    tu_assert_error(nb_index_select(NULL, 0, ok), NB_ENULL, "index_select");
    tu_assert_error(nb_index_select(x, 0, NULL), NB_ENULL, "'index'");

    /* gather */
    nb_tensor *g12 = tu_tensor((double[]){0, 1, 2, 4}, (int64_t[]){2, 2}, 2, NB_I64);
    tu_assert_index_error(nb_gather(x, 1, g12), NB_EINDEX,
                    "gather: index 4 is out of range for dim 1 of size 4");
    nb_tensor *gneg = tu_tensor((double[]){0, -2}, (int64_t[]){2, 1}, 2, NB_I32);
    tu_assert_index_error(nb_gather(x, 0, gneg), NB_EINDEX, "index -2 is out of range");
    tu_assert_error(nb_gather(x, 0, ok), NB_ESHAPE, "dims");
    nb_tensor *wide = nb_zeros((int64_t[]){2, 5}, 2, NB_I64);
    tu_assert_error(nb_gather(x, 0, wide), NB_ESHAPE, "at dim 1");
    tu_assert_error(nb_gather(x, 0, nb_zeros((int64_t[]){2, 2}, 2, NB_F64)), NB_EDTYPE, "f64");
    tu_assert_error(nb_gather(x, 5, g12), NB_EDIM, "gather");
    tu_assert_error(nb_gather(NULL, 0, g12), NB_ENULL, "gather");
    tu_assert_error(nb_gather(x, 0, NULL), NB_ENULL, "gather");
    /* the check runs before anything is written and a failing call leaks nothing, even
     * when the index had to be made contiguous first */
    nb_tensor *gnc = tu_noncontig(tu_tensor((double[]){0, 1, 9, 10}, (int64_t[]){2, 2}, 2,
                                            NB_I64));
    int64_t live = live_bytes();
    tu_assert_index_error(nb_gather(x, 0, gnc), NB_EINDEX, "index 10 is out of range");
    ck_assert_int_eq(live_bytes(), live);

    /* scatter_add */
    nb_tensor *src = data((int64_t[]){2, 2}, 2, NB_F32, 2);
    tu_assert_index_error(nb_scatter_add(x, 1, g12, src), NB_EINDEX,
                    "scatter_add: index 4 is out of range for dim 1 of size 4");
    tu_assert_index_error(nb_scatter_add(x, 0, gneg, src), NB_EINDEX, "index -2");
    tu_assert_error(nb_scatter_add(x, 0, g12, nb_zeros((int64_t[]){2, 2}, 2, NB_F64)),
                    NB_EDTYPE, "src has dtype f64");
    tu_assert_error(nb_scatter_add(x, 0, g12, nb_zeros((int64_t[]){2, 1}, 2, NB_F32)),
                    NB_ESHAPE, "larger than src");
    tu_assert_error(nb_scatter_add(x, 0, g12, nb_zeros((int64_t[]){4}, 1, NB_F32)),
                    NB_ESHAPE, "src has 1");
    tu_assert_error(nb_scatter_add(x, 0, ok, src), NB_ESHAPE, "dims");
    tu_assert_error(nb_scatter_add(x, 0, wide, nb_zeros((int64_t[]){2, 5}, 2, NB_F32)),
                    NB_ESHAPE, "at dim 1");
    tu_assert_error(nb_scatter_add(x, 0, nb_zeros((int64_t[]){2, 2}, 2, NB_BOOL), src),
                    NB_EDTYPE, "i32 or i64");
    tu_assert_error(nb_scatter_add(x, -3, g12, src), NB_EDIM, "scatter_add");
    tu_assert_error(nb_scatter_add(x, 0, g12, NULL), NB_ENULL, "'src'");

    /* embedding */
    nb_tensor *w = data((int64_t[]){10, 3}, 2, NB_F32, 3);
    tu_assert_index_error(nb_embedding(w, i12), NB_EINDEX,
                    "embedding: index 12 is out of range for dim 0 of size 10");
    tu_assert_index_error(nb_embedding(w, ineg), NB_EINDEX, "index -1");
    tu_assert_error(nb_embedding(nb_zeros((int64_t[]){10}, 1, NB_F32), ok), NB_ESHAPE, "2-D");
    tu_assert_error(nb_embedding(w, fidx), NB_EDTYPE, "i32 or i64");
    tu_assert_error(nb_embedding(NULL, ok), NB_ENULL, "embedding");
    tu_assert_error(nb_embedding(w, NULL), NB_ENULL, "embedding");

    /* masked_fill */
    nb_tensor *m = nb_zeros((int64_t[]){4}, 1, NB_BOOL);
    tu_assert_error(nb_masked_fill(x, nb_zeros((int64_t[]){4}, 1, NB_U8), 1), NB_EDTYPE,
                    "bool");
    tu_assert_error(nb_masked_fill(x, nb_zeros((int64_t[]){3}, 1, NB_BOOL), 1), NB_ESHAPE,
                    "cannot be broadcast");
    tu_assert_error(nb_masked_fill(x, nb_zeros((int64_t[]){2, 10, 4}, 3, NB_BOOL), 1),
                    NB_ESHAPE, "[2,10,4]");
    tu_assert_error(nb_masked_fill(NULL, m, 1), NB_ENULL, "masked_fill");
    tu_assert_error(nb_masked_fill(x, NULL, 1), NB_ENULL, "masked_fill");

    /* one_hot */
    tu_assert_index_error(nb_one_hot(ineg, 3, NB_F32), NB_EINDEX, "non-negative");
    tu_assert_index_error(nb_one_hot(i12, 5, NB_F32), NB_EINDEX, "index 12 is out of range for 5");
    tu_assert_error(nb_one_hot(nb_zeros((int64_t[]){0}, 1, NB_I64), -1, NB_F32), NB_EINVAL,
                    "empty");
    tu_assert_error(nb_one_hot(ok, -2, NB_F32), NB_EINVAL, "num_classes");
    tu_assert_error(nb_one_hot(fidx, 3, NB_F32), NB_EDTYPE, "i32 or i64");
    tu_assert_error(nb_one_hot(ok, 3, NB_DTYPE_COUNT), NB_EDTYPE, "dtype");
    tu_assert_error(nb_one_hot(NULL, 3, NB_F32), NB_ENULL, "one_hot");

    /* tril / triu */
    tu_assert_error(nb_tril(ok, 0), NB_ESHAPE, "tril: input must have at least 2 dims");
    tu_assert_error(nb_triu(nb_scalar(1, NB_F32), 0), NB_ESHAPE, "triu");
    tu_assert_error(nb_tril(NULL, 0), NB_ENULL, "tril");

    /* cat */
    nb_tensor *a = nb_zeros((int64_t[]){2, 3}, 2, NB_F32), *b = nb_zeros((int64_t[]){2, 4}, 2, NB_F32);
    tu_assert_error(nb_cat((nb_tensor *[]){a, b}, 2, 0), NB_ESHAPE,
                    "cat: tensor 1 has shape [2,4] but tensor 0 has shape [2,3]");
    ck_assert(nb_cat((nb_tensor *[]){a, b}, 2, 1) != NULL);
    tu_assert_error(nb_cat((nb_tensor *[]){a, nb_zeros((int64_t[]){2, 3, 1}, 3, NB_F32)}, 2, 0),
                    NB_ESHAPE, "dims");
    tu_assert_error(nb_cat((nb_tensor *[]){a, b}, 2, 2), NB_EDIM, "cat");
    tu_assert_error(nb_cat((nb_tensor *[]){a, b}, 2, -3), NB_EDIM, "cat");
    tu_assert_error(nb_cat((nb_tensor *[]){a}, 0, 0), NB_EINVAL, "non-empty");
    tu_assert_error(nb_cat(NULL, 2, 0), NB_ENULL, "cat");
    tu_assert_error(nb_cat((nb_tensor *[]){a, NULL}, 2, 0), NB_ENULL, "tensors[1]");
    tu_assert_error(nb_cat((nb_tensor *[]){nb_scalar(1, NB_F32), nb_scalar(2, NB_F32)}, 2, 0),
                    NB_ESHAPE, "0-dim");

    /* stack */
    tu_assert_error(nb_stack((nb_tensor *[]){a, b}, 2, 0), NB_ESHAPE,
                    "stack: tensor 1 has shape [2,4] but tensor 0 has shape [2,3]");
    tu_assert_error(nb_stack((nb_tensor *[]){a, a}, 2, 3), NB_EDIM, "stack");
    tu_assert_error(nb_stack((nb_tensor *[]){a, a}, 2, -4), NB_EDIM, "stack");
    tu_assert_error(nb_stack((nb_tensor *[]){a}, 0, 0), NB_EINVAL, "non-empty");
    tu_assert_error(nb_stack((nb_tensor *[]){NULL, a}, 2, 0), NB_ENULL, "tensors[0]");

    /* split / chunk: errors are negative statuses; out[] is left alone and nothing leaks */
    nb_tensor *sentinel = x, *out[3] = {sentinel, sentinel, sentinel};
    live = live_bytes();
    ck_assert_int_eq(nb_split(x, 3, 0, out, 3), NB_EINVAL); /* needs 4 */
    ck_assert(strstr(nb_last_error(), "4 pieces do not fit in out[] of 3") != NULL);
    ck_assert_int_eq(nb_chunk(x, 4, 1, out, 3), NB_EINVAL); /* needs 4 */
    ck_assert_int_eq(nb_split(x, 3, 0, NULL, 0), NB_EINVAL);
    ck_assert_int_eq(live_bytes(), live);
    for (int i = 0; i < 3; i++) ck_assert(out[i] == sentinel);
    ck_assert_int_eq(nb_split(x, 0, 0, out, 3), NB_EINVAL);
    ck_assert_int_eq(nb_split(x, -2, 0, out, 3), NB_EINVAL);
    ck_assert_int_eq(nb_split(x, 5, 2, out, 3), NB_EDIM);
    ck_assert_int_eq(nb_split(nb_scalar(1, NB_F32), 1, 0, out, 3), NB_EDIM);
    ck_assert_int_eq(nb_chunk(x, 0, 0, out, 3), NB_EINVAL);
    ck_assert_int_eq(nb_chunk(x, 2, -3, out, 3), NB_EDIM);
    nb_clear_error();
    ck_assert_int_eq(nb_split(NULL, 2, 0, out, 3), NB_ENULL);
    ck_assert_int_eq(nb_chunk(NULL, 2, 0, out, 3), NB_ENULL);
    nb_clear_error();

    /* NULL inputs from a failed inner op keep the first error */
    ck_assert(nb_gather(nb_index_select(x, 0, i12), 0, ok) == NULL);
    ck_assert_int_eq(nb_last_status(), NB_EINDEX);
    ck_assert(strstr(nb_last_error(), "index_select") != NULL);
    nb_clear_error();
    nb_scope_end();
}
END_TEST

Suite *nb_suite_index(void) {
    Suite *s = suite_create("index");
    struct {
        const char *name;
        const TTest *fn;
    } cases[] = {
        {"index_select", test_index_select},
        {"gather", test_gather},
        {"scatter_add", test_scatter_add},
        {"scatter_add_deterministic", test_scatter_add_deterministic},
        {"embedding", test_embedding},
        {"masked_fill", test_masked_fill},
        {"one_hot", test_one_hot},
        {"tril_triu", test_tril_triu},
        {"cat", test_cat},
        {"stack", test_stack},
        {"split_chunk", test_split_chunk},
        {"parallel_paths", test_parallel_paths},
        {"errors", test_index_errors},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_add_test(tc, cases[i].fn);
        suite_add_tcase(s, tc);
    }
    nb_tcases_index_devices(s); /* tests/test_index_devices.c */
    return s;
}
