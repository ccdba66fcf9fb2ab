/* test_reduce.c - the "reduce" suite: sum, mean, var, std, logsumexp, amax, amin, max/min
 * with indices, argmax/argmin, softmax and log_softmax, each checked against plain
 * double-precision reference loops over a table of shapes (0-dim, empty, size-1 dims,
 * several dims, negative dims, keepdim, long rows that span blocks and chunks) and dtypes,
 * on contiguous and non-contiguous inputs; thread-count determinism; and every class of
 * user error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static const nb_dtype all_dtypes[] = {NB_F32, NB_F64, NB_F16, NB_BF16,
                                      NB_I32, NB_I64, NB_U8,  NB_BOOL};
static const nb_dtype float_dtypes[] = {NB_F32, NB_F64, NB_F16, NB_BF16};
#define NDT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Random inputs in a range that suits the dtype (bool: 0/1, u8: 0..199). */
static nb_tensor *rand_for(const int64_t *shape, int ndim, nb_dtype dt, uint64_t seed) {
    switch (dt) {
    case NB_BOOL: return tu_random(shape, ndim, dt, 0, 2, seed);
    case NB_U8: return tu_random(shape, ndim, dt, 0, 200, seed);
    case NB_I32: case NB_I64: return tu_random(shape, ndim, dt, -50, 50, seed);
    default: return tu_random(shape, ndim, dt, -3, 3, seed);
    }
}

/* ---- reference reductions ------------------------------------------------------------------ */
typedef enum rop { R_SUM, R_MEAN, R_VAR, R_STD, R_LSE, R_AMAX, R_AMIN, R_COUNT } rop;
static const char *rop_name[] = {"sum", "mean", "var", "std", "logsumexp", "amax", "amin"};

/* Output linear index of every input element (row-major over the kept dims). */
static int64_t *out_index(const int64_t *shape, int ndim, const bool *mask) {
    int64_t n = tu_numel(shape, ndim), idx[NB_MAX_DIMS];
    int64_t *oi = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        tu_unravel(i, shape, ndim, idx);
        int64_t o = 0;
        for (int d = 0; d < ndim; d++)
            if (!mask[d]) o = o * shape[d] + idx[d];
        oi[i] = o;
    }
    return oi;
}

static void ref_reduce(rop op, const double *x, const int64_t *shape, int ndim,
                       const bool *mask, int corr, double *out, int64_t nout) {
    int64_t n = tu_numel(shape, ndim);
    int64_t *oi = out_index(shape, ndim, mask);
    double *cnt = calloc((size_t)nout + 1, sizeof(double));
    double *acc = calloc((size_t)nout + 1, sizeof(double));
    for (int64_t i = 0; i < n; i++) cnt[oi[i]] += 1;
    for (int64_t o = 0; o < nout; o++)
        out[o] = op == R_AMAX || op == R_LSE ? -INFINITY : op == R_AMIN ? INFINITY : 0;
    for (int64_t i = 0; i < n; i++) { /* sums, or the max / min */
        double v = x[i], *r = &out[oi[i]];
        if (op == R_AMAX || op == R_LSE) *r = (isnan(*r) || isnan(v)) ? NAN : fmax(*r, v);
        else if (op == R_AMIN) *r = (isnan(*r) || isnan(v)) ? NAN : fmin(*r, v);
        else *r += v;
    }
    if (op == R_MEAN || op == R_VAR || op == R_STD)
        for (int64_t o = 0; o < nout; o++) out[o] /= cnt[o];
    if (op == R_VAR || op == R_STD) {
        for (int64_t i = 0; i < n; i++) acc[oi[i]] += (x[i] - out[oi[i]]) * (x[i] - out[oi[i]]);
        for (int64_t o = 0; o < nout; o++) {
            out[o] = acc[o] / fmax(0, cnt[o] - corr);
            if (op == R_STD) out[o] = sqrt(out[o]);
        }
    }
    if (op == R_LSE) {
        for (int64_t i = 0; i < n; i++) {
            double m = out[oi[i]];
            acc[oi[i]] += exp(x[i] - (isinf(m) ? 0 : m));
        }
        for (int64_t o = 0; o < nout; o++)
            out[o] = log(acc[o]) + (isinf(out[o]) ? 0 : out[o]);
    }
    free(oi);
    free(cnt);
    free(acc);
}

static nb_tensor *call_rop(rop op, nb_tensor *x, const int *dims, int ndims, int corr,
                           bool keepdim) {
    switch (op) {
    case R_SUM: return nb_sum(x, dims, ndims, keepdim);
    case R_MEAN: return nb_mean(x, dims, ndims, keepdim);
    case R_VAR: return nb_var(x, dims, ndims, corr, keepdim);
    case R_STD: return nb_std(x, dims, ndims, corr, keepdim);
    case R_LSE: return nb_logsumexp(x, dims, ndims, keepdim);
    case R_AMAX: return nb_amax(x, dims, ndims, keepdim);
    default: return nb_amin(x, dims, ndims, keepdim);
    }
}

typedef struct rcase {
    int ndim;
    int64_t shape[4];
    int ndims; /* 0: dims = NULL (all) */
    int dims[4];
    bool keepdim;
} rcase;

static const rcase red_cases[] = {
    {0, {0}, 0, {0}, false},                 /* 0-dim, all */
    {0, {0}, 1, {-1}, true},                 /* 0-dim, dim -1 */
    {1, {7}, 0, {0}, false},
    {1, {7}, 1, {0}, true},
    {2, {3, 4}, 1, {1}, false},
    {2, {3, 4}, 1, {0}, false},              /* column path */
    {2, {3, 4}, 1, {-1}, true},
    {2, {3, 4}, 2, {1, 0}, false},           /* all dims listed */
    {3, {2, 3, 4}, 2, {0, 2}, false},        /* reduced dims around a kept one */
    {3, {2, 3, 4}, 1, {1}, true},            /* middle dim: column path per group */
    {3, {2, 1, 5}, 1, {1}, false},           /* size-1 reduced dim */
    {3, {1, 3, 1}, 0, {0}, true},
    {4, {2, 3, 4, 5}, 2, {-1, -3}, false},
    {4, {2, 3, 4, 5}, 3, {0, 1, 3}, true},
    {3, {4, 0, 3}, 1, {1}, false},           /* empty reduced dim */
    {3, {4, 0, 3}, 1, {0}, true},            /* empty output */
    {2, {3, 2100}, 1, {1}, false},           /* rows spanning several blocks */
    {2, {2100, 3}, 1, {0}, false},           /* long column path */
    {1, {33000}, 0, {0}, false},             /* chunked full reduction */
    {2, {300, 70}, 1, {0}, true},            /* column blocks narrower than the row */
    {2, {40, 5}, 1, {1}, false},             /* short rows, read as columns */
    {3, {3, 20, 5}, 2, {0, 2}, true},        /* short rows under an outer reduced dim */
};

static bool case_empty_reduce(const rcase *c, const bool *mask) {
    for (int d = 0; d < c->ndim; d++)
        if (mask[d] && c->shape[d] == 0) return true;
    return false;
}

static int expected_shape(const rcase *c, const bool *mask, int64_t *shape) {
    int n = 0;
    for (int d = 0; d < c->ndim; d++) {
        if (!mask[d]) shape[n++] = c->shape[d];
        else if (c->keepdim) shape[n++] = 1;
    }
    return n;
}

static void case_mask(const rcase *c, bool *mask) {
    for (int d = 0; d < NB_MAX_DIMS; d++) mask[d] = c->ndims == 0;
    for (int i = 0; i < c->ndims; i++)
        if (c->ndim) mask[(c->dims[i] + c->ndim) % c->ndim] = true;
}

static void check_rop(rop op, nb_dtype dt) {
    for (size_t ci = 0; ci < sizeof red_cases / sizeof red_cases[0]; ci++) {
        const rcase *c = &red_cases[ci];
        bool mask[NB_MAX_DIMS];
        case_mask(c, mask);
        int64_t oshape[NB_MAX_DIMS];
        int ond = expected_shape(c, mask, oshape);
        int64_t nout = tu_numel(oshape, ond);
        for (int nc = 0; nc < 2; nc++) {
            nb_tensor *x = rand_for(c->shape, c->ndim, dt, 100 + ci);
            if (nc) x = tu_noncontig(x);
            double *xv = tu_values(x);
            for (int corr = 0; corr < ((op == R_VAR || op == R_STD) ? 2 : 1); corr++) {
                const int *dims = c->ndims ? c->dims : NULL;
                nb_tensor *y = call_rop(op, x, dims, c->ndims, 1 - corr, c->keepdim);
                if ((op == R_AMAX || op == R_AMIN) && case_empty_reduce(c, mask)) {
                    tu_assert_error(y, NB_ESHAPE, rop_name[op]);
                    continue;
                }
                ck_assert_msg(y, "%s %s case %zu: %s", rop_name[op], nb_dtype_name(dt), ci,
                              nb_last_error());
                nb_dtype want = op == R_SUM && !nb_dtype_is_float(dt) ? NB_I64 : dt;
                ck_assert_msg(nb_tensor_dtype(y) == want, "%s %s: dtype %s", rop_name[op],
                              nb_dtype_name(dt), nb_dtype_name(nb_tensor_dtype(y)));
                double *ref = malloc(sizeof(double) * (size_t)(nout + 1));
                ref_reduce(op, xv, c->shape, c->ndim, mask, 1 - corr, ref, nout);
                if (want == NB_BOOL)
                    for (int64_t o = 0; o < nout; o++) ref[o] = ref[o] != 0;
                tu_assert_close(y, ref, oshape, ond, tu_tol(want));
                free(ref);
            }
            free(xv);
        }
    }
}

START_TEST(test_sum) {
    nb_scope_begin();
    for (int i = 0; i < NDT(all_dtypes); i++) check_rop(R_SUM, all_dtypes[i]);
    nb_scope_end();
}
END_TEST

START_TEST(test_mean) {
    nb_scope_begin();
    for (int i = 0; i < NDT(float_dtypes); i++) check_rop(R_MEAN, float_dtypes[i]);
    nb_scope_end();
}
END_TEST

START_TEST(test_var_std) {
    nb_scope_begin();
    for (int i = 0; i < NDT(float_dtypes); i++) {
        check_rop(R_VAR, float_dtypes[i]);
        check_rop(R_STD, float_dtypes[i]);
    }
    /* A large mean and a small spread: a one-pass sum of squares would lose it all. */
    double v[4] = {1e8 + 1, 1e8 + 2, 1e8 + 3, 1e8 + 4};
    nb_tensor *x = tu_tensor(v, (int64_t[]){4}, 1, NB_F64);
    tu_assert_close(nb_var(x, NULL, 0, 1, false), (double[]){5.0 / 3}, NULL, 0, 1e-12);
    tu_assert_close(nb_std(x, NULL, 0, 0, false), (double[]){sqrt(1.25)}, NULL, 0, 1e-12);
    nb_scope_end();
}
END_TEST

START_TEST(test_logsumexp) {
    nb_scope_begin();
    for (int i = 0; i < NDT(float_dtypes); i++) check_rop(R_LSE, float_dtypes[i]);
    /* Large values (no overflow), infinities, NaN. */
    double v[12] = {1000, 1000, -INFINITY, -INFINITY, INFINITY, 1, NAN, 1, 0, 0, -1000, -1000};
    for (int i = 0; i < NDT(float_dtypes); i++) {
        nb_dtype dt = float_dtypes[i];
        nb_tensor *x = tu_tensor(v, (int64_t[]){6, 2}, 2, dt);
        double ref[6] = {1000 + log(2.0), -INFINITY, INFINITY, NAN, log(2.0),
                         -1000 + log(2.0)};
        tu_assert_close(nb_logsumexp(x, (int[]){1}, 1, false), ref, (int64_t[]){6}, 1,
                        tu_tol(dt));
    }
    nb_scope_end();
}
END_TEST

START_TEST(test_amax_amin) {
    nb_scope_begin();
    for (int i = 0; i < NDT(all_dtypes); i++) {
        check_rop(R_AMAX, all_dtypes[i]);
        check_rop(R_AMIN, all_dtypes[i]);
    }
    /* NaN propagates, wherever it sits in a long row (blocks, chunks, columns). */
    int64_t n = 40000;
    double *v = calloc((size_t)n, sizeof(double));
    for (int64_t i = 0; i < n; i++) v[i] = (double)(i % 1000);
    v[n - 5] = NAN;
    for (int i = 0; i < NDT(float_dtypes); i++) {
        nb_tensor *x = tu_tensor(v, &n, 1, float_dtypes[i]);
        ck_assert(isnan(nb_item_f64(nb_amax(x, NULL, 0, false))));
        ck_assert(isnan(nb_item_f64(nb_amin(x, NULL, 0, false))));
        nb_tensor *c = nb_view(x, (int64_t[]){n / 8, 8}, 2); /* column path */
        double *xv = tu_values(x), ref[8];
        for (int j = 0; j < 8; j++) {
            ref[j] = -INFINITY;
            for (int64_t k = j; k < n; k += 8) ref[j] = isnan(xv[k]) || isnan(ref[j]) ? NAN : fmax(ref[j], xv[k]);
        }
        ck_assert(isnan(ref[3]) && !isnan(ref[2]));
        tu_assert_close(nb_amax(c, (int[]){0}, 1, false), ref, (int64_t[]){8}, 1, 0);
        free(xv);
    }
    free(v);
    nb_scope_end();
}
END_TEST

/* ---- max/min with indices, argmax/argmin ---------------------------------------------------- */
typedef struct dcase {
    int ndim;
    int64_t shape[4];
    int dim;
    bool keepdim;
} dcase;

static const dcase dim_cases[] = {
    {0, {0}, 0, false},  {1, {5}, 0, false},       {2, {3, 4}, 1, false},
    {2, {3, 4}, 0, true}, {3, {2, 3, 4}, 1, false}, {3, {2, 3, 4}, -1, true},
    {2, {4, 1}, 1, false}, {2, {0, 3}, 1, false},   {2, {3, 2100}, 1, false},
    {2, {2100, 3}, 0, false}, {2, {20, 300}, 0, false}, {2, {40, 5}, 1, false},
};

/* First index of the extreme along dim (NaN is the extreme); values and indices. */
static void ref_argext(const double *x, const int64_t *shape, int ndim, int dim, bool mx,
                       double *val, double *idx) {
    int64_t outer = 1, L = ndim ? shape[dim] : 1, inner = 1;
    for (int d = 0; d < ndim; d++) {
        if (d < dim) outer *= shape[d];
        if (d > dim) inner *= shape[d];
    }
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < inner; j++) {
            double best = x[o * L * inner + j];
            int64_t k = 0;
            for (int64_t l = 1; l < L; l++) {
                double v = x[(o * L + l) * inner + j];
                if ((isnan(v) && !isnan(best)) || (mx ? v > best : v < best)) best = v, k = l;
            }
            val[o * inner + j] = best;
            idx[o * inner + j] = (double)k;
        }
}

static void check_dim_op(nb_dtype dt, bool mx) {
    for (size_t ci = 0; ci < sizeof dim_cases / sizeof dim_cases[0]; ci++) {
        const dcase *c = &dim_cases[ci];
        int dim = c->ndim ? (c->dim + c->ndim) % c->ndim : 0;
        int64_t oshape[NB_MAX_DIMS];
        int ond = 0;
        for (int d = 0; d < c->ndim; d++)
            if (d != dim) oshape[ond++] = c->shape[d];
            else if (c->keepdim) oshape[ond++] = 1;
        int64_t nout = tu_numel(oshape, ond);
        for (int nc = 0; nc < 2; nc++) {
            /* Few distinct values, so ties are common and the first index matters. */
            nb_tensor *x = tu_random(c->shape, c->ndim, dt, 0, dt == NB_BOOL ? 2 : 4, 7 + ci);
            if (nc) x = tu_noncontig(x);
            double *xv = tu_values(x);
            double *val = malloc(sizeof(double) * (size_t)(nout + 1));
            double *idx = malloc(sizeof(double) * (size_t)(nout + 1));
            ref_argext(xv, c->shape, c->ndim, dim, mx, val, idx);
            nb_tensor *ind = NULL;
            nb_tensor *y = mx ? nb_max_dim(x, c->dim, c->keepdim, &ind)
                              : nb_min_dim(x, c->dim, c->keepdim, &ind);
            ck_assert_msg(y && ind, "%s case %zu: %s", nb_dtype_name(dt), ci, nb_last_error());
            ck_assert(nb_tensor_dtype(y) == dt && nb_tensor_dtype(ind) == NB_I64);
            tu_assert_close(y, val, oshape, ond, 0);
            tu_assert_close(ind, idx, oshape, ond, 0);
            nb_tensor *a = mx ? nb_argmax(x, c->dim, c->keepdim)
                              : nb_argmin(x, c->dim, c->keepdim);
            tu_assert_close(a, idx, oshape, ond, 0);
            ck_assert(nb_tensor_dtype(a) == NB_I64);
            ck_assert(nb_max_dim(x, c->dim, c->keepdim, NULL) != NULL); /* indices unwanted */
            free(xv);
            free(val);
            free(idx);
        }
    }
}

START_TEST(test_max_min_dim) {
    nb_scope_begin();
    for (int i = 0; i < NDT(all_dtypes); i++) {
        check_dim_op(all_dtypes[i], true);
        check_dim_op(all_dtypes[i], false);
    }
    /* NaN is both the max and the min; its first index wins, in rows and in columns. */
    double v[8] = {1, NAN, 3, NAN, 5, 2, 7, 0};
    for (int i = 0; i < NDT(float_dtypes); i++) {
        nb_tensor *x = tu_tensor(v, (int64_t[]){2, 4}, 2, float_dtypes[i]);
        nb_tensor *ind;
        nb_tensor *m = nb_max_dim(x, 1, false, &ind);
        double *mv = tu_values(m);
        ck_assert(isnan(mv[0]) && mv[1] == 7);
        free(mv);
        tu_assert_close(ind, ((double[]){1, 2}), (int64_t[]){2}, 1, 0);
        tu_assert_close(nb_argmin(x, 1, false), ((double[]){1, 3}), (int64_t[]){2}, 1, 0);
        tu_assert_close(nb_argmax(x, 0, false), ((double[]){1, 0, 1, 0}), (int64_t[]){4}, 1,
                        0);
        tu_assert_close(nb_argmin(x, 0, false), ((double[]){0, 0, 0, 0}), (int64_t[]){4}, 1,
                        0);
    }
    nb_scope_end();
}
END_TEST

/* ---- softmax -------------------------------------------------------------------------------- */
static void ref_softmax(const double *x, const int64_t *shape, int ndim, int dim, bool lg,
                        double *y) {
    int64_t outer = 1, L = ndim ? shape[dim] : 1, inner = 1;
    for (int d = 0; d < ndim; d++) {
        if (d < dim) outer *= shape[d];
        if (d > dim) inner *= shape[d];
    }
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < inner; j++) {
            double m = -INFINITY, s = 0;
            for (int64_t l = 0; l < L; l++) m = fmax(m, x[(o * L + l) * inner + j]);
            for (int64_t l = 0; l < L; l++) s += exp(x[(o * L + l) * inner + j] - m);
            for (int64_t l = 0; l < L; l++) {
                int64_t k = (o * L + l) * inner + j;
                y[k] = lg ? x[k] - m - log(s) : exp(x[k] - m) / s;
            }
        }
}

static const dcase sm_cases[] = {
    {0, {0}, 0, false},   {1, {5}, 0, false},        {2, {3, 4}, 1, false},
    {2, {3, 4}, 0, false}, {3, {2, 3, 4}, 1, false}, {3, {2, 3, 300}, 1, false},
    {2, {2, 3000}, -1, false}, {2, {0, 4}, 1, false}, {2, {4, 1}, 1, false},
    {2, {4, 0}, 1, false},
};

START_TEST(test_softmax) {
    nb_scope_begin();
    for (int i = 0; i < NDT(float_dtypes); i++) {
        nb_dtype dt = float_dtypes[i];
        for (size_t ci = 0; ci < sizeof sm_cases / sizeof sm_cases[0]; ci++) {
            const dcase *c = &sm_cases[ci];
            int dim = c->ndim ? (c->dim + c->ndim) % c->ndim : 0;
            for (int nc = 0; nc < 2; nc++) {
                nb_tensor *x = tu_random(c->shape, c->ndim, dt, -10, 10, 3 + ci);
                if (nc) x = tu_noncontig(x);
                double *xv = tu_values(x);
                int64_t n = nb_numel(x);
                double *ref = malloc(sizeof(double) * (size_t)(n + 1));
                for (int lg = 0; lg < 2; lg++) {
                    ref_softmax(xv, c->shape, c->ndim, dim, lg, ref);
                    nb_tensor *y = lg ? nb_log_softmax(x, c->dim) : nb_softmax(x, c->dim);
                    ck_assert_msg(y, "%s case %zu: %s", nb_dtype_name(dt), ci, nb_last_error());
                    ck_assert(nb_tensor_dtype(y) == dt && nb_is_contiguous(y));
                    tu_assert_close(y, ref, c->shape, c->ndim, tu_tol(dt));
                }
                free(ref);
                free(xv);
            }
        }
        /* Masked entries give exact zeros; a NaN or an all -inf row gives NaN (PyTorch). */
        double v[9] = {0, -INFINITY, 1, NAN, 1, 2, -INFINITY, -INFINITY, -INFINITY};
        nb_tensor *x = tu_tensor(v, (int64_t[]){3, 3}, 2, dt);
        double e = exp(1.0);
        tu_assert_close(nb_softmax(x, 1),
                        ((double[]){1 / (1 + e), 0, e / (1 + e), NAN, NAN, NAN, NAN, NAN, NAN}),
                        ((int64_t[]){3, 3}), 2, tu_tol(dt));
        nb_tensor *xt = nb_transpose(x, 0, 1); /* the same through the column path */
        double *yt = tu_values(nb_contiguous(nb_softmax(nb_contiguous(xt), 0)));
        ck_assert(yt[3] == 0 && isnan(yt[1]) && isnan(yt[8]));
        free(yt);
    }
    nb_scope_end();
}
END_TEST

/* The vectorized exp inside softmax: relative accuracy over the whole f32 range, including
 * results that are subnormal. Rows [0, -t] give exp(-t) / (1 + exp(-t)). */
START_TEST(test_softmax_exp_accuracy) {
    nb_scope_begin();
    enum { N = 2000 };
    static double v[2 * N];
    for (int i = 0; i < N; i++) v[2 * i] = 0, v[2 * i + 1] = -110.0 * i / N;
    for (int colpath = 0; colpath < 2; colpath++) {
        nb_tensor *x = tu_tensor(v, (int64_t[]){N, 2}, 2, NB_F32);
        if (colpath) x = nb_contiguous(nb_transpose(x, 0, 1)); /* (2, N), softmax over dim 0 */
        double *y = tu_values(nb_softmax(x, colpath ? 0 : 1));
        for (int i = 0; i < N; i++) {
            double t = (float)v[2 * i + 1], r = exp(t) / (1 + exp(t));
            double got = colpath ? y[N + i] : y[2 * i + 1];
            double tol = 6e-7 * r + 3e-45; /* a few ulp, normal or subnormal */
            ck_assert_msg(fabs(got - r) <= tol, "exp(%g): %.9g vs %.9g", t, got, r);
        }
        free(y);
    }
    nb_scope_end();
}
END_TEST

/* Expanded (stride 0), permuted and sliced views give the results of their contiguous
 * copies (up to rounding: the association may differ). */
START_TEST(test_strided_views) {
    nb_scope_begin();
    for (int i = 0; i < NDT(all_dtypes); i++) {
        nb_dtype dt = all_dtypes[i];
        nb_tensor *base = rand_for((int64_t[]){4, 6, 40}, 3, dt, 11);
        nb_tensor *views[3] = {
            nb_expand(nb_narrow(base, 0, 1, 1), (int64_t[]){5, 6, 40}, 3),
            nb_permute(base, (int[]){2, 0, 1}, 3),
            nb_slice(nb_slice(base, 2, 1, 40, 3), 0, 0, 4, 2),
        };
        for (int v = 0; v < 3; v++) {
            nb_tensor *x = views[v], *xc = nb_contiguous(x);
            ck_assert(x && xc && !nb_is_contiguous(x));
            nb_dtype sdt = nb_dtype_is_float(dt) ? dt : NB_I64;
            for (int d = 0; d < 3; d++) {
                int dims2[2] = {d, (d + 1) % 3};
                nb_tensor *got[4] = {nb_sum(x, dims2, 2, false), nb_amax(x, &d, 1, true),
                                     nb_argmin(x, d, false), NULL};
                nb_tensor *want[4] = {nb_sum(xc, dims2, 2, false), nb_amax(xc, &d, 1, true),
                                      nb_argmin(xc, d, false), NULL};
                if (nb_dtype_is_float(dt)) {
                    got[3] = nb_softmax(x, d);
                    want[3] = nb_softmax(xc, d);
                }
                for (int k = 0; k < 4 && got[k]; k++) {
                    double *w = tu_values(want[k]);
                    tu_assert_close(got[k], w, nb_shape(want[k]), nb_ndim(want[k]),
                                    k == 0 ? tu_tol(sdt) : k == 3 ? tu_tol(dt) : 0);
                    free(w);
                }
            }
        }
    }
    nb_scope_end();
}
END_TEST

/* ---- determinism ---------------------------------------------------------------------------- */
static void *bytes_of(nb_tensor *t) {
    ck_assert_msg(t != NULL, "%s", nb_last_error());
    size_t n = (size_t)nb_numel(t) * nb_dtype_size(nb_tensor_dtype(t));
    void *p = malloc(n + 1);
    /* Same dtype: nb_read copies the bytes unchanged, from any device. */
    ck_assert(nb_read(t, p, nb_numel(t), nb_tensor_dtype(t)) == NB_OK);
    return p;
}

START_TEST(test_determinism) {
    nb_scope_begin();
    int saved = nb_get_num_threads();
    int64_t n = 1 << 18;
    nb_tensor *x = tu_random(&n, 1, NB_F32, -1, 1, 42);
    nb_tensor *m = nb_view(x, (int64_t[]){4, n / 4}, 2);
    nb_tensor *t = nb_view(x, (int64_t[]){n / 64, 64}, 2);
    size_t sizes[7];
    void *res[2][7];
    for (int r = 0; r < 2; r++) {
        nb_set_num_threads(r + 1);
        nb_tensor *ys[7] = {
            nb_sum(x, NULL, 0, false),  nb_sum(m, (int[]){1}, 1, false),
            nb_sum(t, (int[]){0}, 1, false), nb_var(m, (int[]){1}, 1, 1, false),
            nb_logsumexp(x, NULL, 0, false), nb_softmax(t, 0), nb_argmax(m, 1, false),
        };
        for (int i = 0; i < 7; i++) {
            res[r][i] = bytes_of(ys[i]);
            sizes[i] = (size_t)nb_numel(ys[i]) * nb_dtype_size(nb_tensor_dtype(ys[i]));
        }
    }
    nb_set_num_threads(saved);
    for (int i = 0; i < 7; i++) {
        ck_assert_msg(memcmp(res[0][i], res[1][i], sizes[i]) == 0,
                      "result %d differs between 1 and 2 threads", i);
        free(res[0][i]);
        free(res[1][i]);
    }
    /* A row reduced alone or among others (chunks split by output or shared by threads)
     * gives the same bits. */
    double whole = nb_item_f64(nb_sum(nb_select(m, 0, 2), NULL, 0, false));
    double *rows = tu_values(nb_sum(m, (int[]){1}, 1, false));
    ck_assert(whole == rows[2]);
    free(rows);
    nb_scope_end();
}
END_TEST

/* ---- errors --------------------------------------------------------------------------------- */
START_TEST(test_errors) {
    nb_scope_begin();
    nb_tensor *x = tu_random((int64_t[]){2, 3}, 2, NB_F32, 0, 1, 1);
    nb_tensor *xi = tu_random((int64_t[]){2, 3}, 2, NB_I32, 0, 5, 1);
    nb_tensor *e = nb_zeros((int64_t[]){0, 3}, 2, NB_F32);

    /* bad dims: the message names the op, the dim and the ndim */
    tu_assert_error(nb_sum(x, (int[]){2}, 1, false), NB_EDIM, "sum: dim 2");
    tu_assert_error(nb_mean(x, (int[]){-3}, 1, false), NB_EDIM, "2 dims");
    tu_assert_error(nb_var(x, (int[]){5}, 1, 1, false), NB_EDIM, "var");
    tu_assert_error(nb_amax(x, (int[]){0, 7}, 2, false), NB_EDIM, "amax");
    tu_assert_error(nb_max_dim(x, 2, false, NULL), NB_EDIM, "max: dim 2");
    tu_assert_error(nb_argmin(x, -3, false), NB_EDIM, "argmin");
    tu_assert_error(nb_softmax(x, 2), NB_EDIM, "softmax: dim 2");
    tu_assert_error(nb_log_softmax(x, -3), NB_EDIM, "log_softmax");
    tu_assert_error(nb_sum(nb_scalar(1, NB_F32), (int[]){1}, 1, false), NB_EDIM, "0 dims");
    tu_assert_error(nb_sum(x, (int[]){0}, -1, false), NB_EINVAL, "sum");

    /* a dim listed twice */
    tu_assert_error(nb_sum(x, (int[]){1, -1}, 2, false), NB_EDIM, "more than once");
    tu_assert_error(nb_std(x, (int[]){0, 0}, 2, 1, false), NB_EDIM, "std: dim 0");

    /* dtypes: float-only ops refuse integers (as PyTorch's mean/var/std do) */
    tu_assert_error(nb_mean(xi, NULL, 0, false), NB_EDTYPE, "mean: input dtype i32");
    tu_assert_error(nb_var(xi, NULL, 0, 1, false), NB_EDTYPE, "var");
    tu_assert_error(nb_std(xi, NULL, 0, 1, false), NB_EDTYPE, "std");
    tu_assert_error(nb_logsumexp(xi, NULL, 0, false), NB_EDTYPE, "logsumexp");
    tu_assert_error(nb_softmax(xi, 0), NB_EDTYPE, "softmax");
    tu_assert_error(nb_log_softmax(nb_to_dtype(x, NB_BOOL), 0), NB_EDTYPE, "log_softmax");

    /* no identity: extremes over an empty dim */
    tu_assert_error(nb_amax(e, NULL, 0, false), NB_ESHAPE, "amax: cannot reduce over dim 0");
    tu_assert_error(nb_amin(e, (int[]){0}, 1, true), NB_ESHAPE, "[0,3]");
    tu_assert_error(nb_max_dim(e, 0, false, NULL), NB_ESHAPE, "max");
    tu_assert_error(nb_argmax(e, 0, false), NB_ESHAPE, "argmax");
    ck_assert(nb_argmax(e, 1, false) != NULL); /* the empty dim is kept: fine */
    nb_tensor *ind = x;
    tu_assert_error(nb_min_dim(e, 0, false, &ind), NB_ESHAPE, "min");
    ck_assert(ind == NULL);

    /* but sums and means over nothing are defined */
    tu_assert_close(nb_sum(e, NULL, 0, false), (double[]){0}, NULL, 0, 0);
    tu_assert_close(nb_mean(e, (int[]){0}, 1, false), ((double[]){NAN, NAN, NAN}),
                    (int64_t[]){3}, 1, 0);
    tu_assert_close(nb_logsumexp(e, NULL, 0, false), (double[]){-INFINITY}, NULL, 0, 0);

    /* NULL inputs, and a NULL propagating from a failed inner op keeps its error */
    tu_assert_error(nb_sum(NULL, NULL, 0, false), NB_ENULL, "sum");
    tu_assert_error(nb_mean(NULL, NULL, 0, false), NB_ENULL, "mean");
    tu_assert_error(nb_var(NULL, NULL, 0, 1, false), NB_ENULL, "var");
    tu_assert_error(nb_std(NULL, NULL, 0, 1, false), NB_ENULL, "std");
    tu_assert_error(nb_logsumexp(NULL, NULL, 0, false), NB_ENULL, "logsumexp");
    tu_assert_error(nb_amax(NULL, NULL, 0, false), NB_ENULL, "amax");
    tu_assert_error(nb_amin(NULL, NULL, 0, false), NB_ENULL, "amin");
    tu_assert_error(nb_max_dim(NULL, 0, false, NULL), NB_ENULL, "max");
    tu_assert_error(nb_min_dim(NULL, 0, false, NULL), NB_ENULL, "min");
    tu_assert_error(nb_argmax(NULL, 0, false), NB_ENULL, "argmax");
    tu_assert_error(nb_argmin(NULL, 0, false), NB_ENULL, "argmin");
    tu_assert_error(nb_softmax(NULL, 0), NB_ENULL, "softmax");
    tu_assert_error(nb_log_softmax(NULL, 0), NB_ENULL, "log_softmax");
    tu_assert_error(nb_sum(nb_mean(xi, NULL, 0, false), NULL, 0, false), NB_EDTYPE, "mean");
    nb_scope_end();
}
END_TEST

/* The blocked f32 summation falls back to exact-order f64 accumulation when a block
 * overflows, so sums near FLT_MAX stay finite where the true result is. */
START_TEST(test_sum_near_overflow) {
    nb_scope_begin();
    double v40[40];
    for (int i = 0; i < 40; i++) v40[i] = 3e38;
    nb_tensor *m = nb_mean(tu_tensor(v40, (int64_t[]){40}, 1, NB_F32), NULL, 0, false);
    ck_assert_msg(nb_item_f64(m) == (double)3e38f, "mean %g", nb_item_f64(m));
    nb_tensor *s = nb_sum(tu_tensor((double[]){3e38, 3e38, -3e38}, (int64_t[]){3}, 1, NB_F32),
                          NULL, 0, false);
    ck_assert_msg(nb_item_f64(s) == (double)3e38f, "sum %g", nb_item_f64(s));
    nb_scope_end();
}
END_TEST

/* ---- devices -------------------------------------------------------------------------------
 * Every op on the meta device (shape and dtype only, no kernel runs) and on the guard device
 * (memory unreadable outside kernels: a host dereference in an op definition crashes), where
 * it must give exactly the CPU's values (the same kernels run). */
#define GUARD_DEV ((nb_device){NB_DEVICE_GUARD, 0})
enum { D_SUM, D_MEAN, D_VAR, D_STD, D_LSE, D_AMAX, D_AMIN, D_MAX_V, D_MAX_I, D_MIN_V, D_MIN_I,
       D_ARGMAX, D_ARGMIN, D_SOFTMAX, D_LOGSOFTMAX, D_COUNT };
static const char *dop_name[] = {"sum", "mean", "var", "std", "logsumexp", "amax", "amin",
                                 "max values", "max indices", "min values", "min indices",
                                 "argmax", "argmin", "softmax", "log_softmax"};

static bool dop_float_only(int op) {
    return op == D_MEAN || op == D_VAR || op == D_STD || op == D_LSE || op == D_SOFTMAX ||
           op == D_LOGSOFTMAX;
}

/* op of x along the dims (set-of-dims ops) or dims[0] (the others). */
static nb_tensor *dev_op(int op, nb_tensor *x, const int *dims, int nd, bool keep) {
    nb_tensor *i = NULL, *v;
    switch (op) {
    case D_SUM: return nb_sum(x, dims, nd, keep);
    case D_MEAN: return nb_mean(x, dims, nd, keep);
    case D_VAR: return nb_var(x, dims, nd, 1, keep);
    case D_STD: return nb_std(x, dims, nd, 0, keep);
    case D_LSE: return nb_logsumexp(x, dims, nd, keep);
    case D_AMAX: return nb_amax(x, dims, nd, keep);
    case D_AMIN: return nb_amin(x, dims, nd, keep);
    case D_MAX_V: return nb_max_dim(x, dims[0], keep, NULL);
    case D_MAX_I: v = nb_max_dim(x, dims[0], keep, &i); return v ? i : NULL;
    case D_MIN_V: return nb_min_dim(x, dims[0], keep, NULL);
    case D_MIN_I: v = nb_min_dim(x, dims[0], keep, &i); return v ? i : NULL;
    case D_ARGMAX: return nb_argmax(x, dims[0], keep);
    case D_ARGMIN: return nb_argmin(x, dims[0], keep);
    case D_SOFTMAX: return nb_softmax(x, dims[0]);
    default: return nb_log_softmax(x, dims[0]);
    }
}

START_TEST(test_meta_device) {
    nb_scope_begin();
    const int64_t shape[] = {2, 3, 4};
    const nb_dtype dts[] = {NB_F32, NB_F16, NB_I32};
    for (int t = 0; t < NDT(dts); t++) {
        nb_tensor *x = nb_empty_on(NB_META, shape, 3, dts[t]);
        ck_assert(x != NULL);
        for (int op = 0; op < D_COUNT; op++) {
            if (dop_float_only(op) && !nb_dtype_is_float(dts[t])) continue;
            for (int keep = 0; keep < 2; keep++) {
                nb_tensor *y = dev_op(op, x, (int[]){-2}, 1, keep);
                ck_assert_msg(y != NULL, "%s on meta: %s", dop_name[op], nb_last_error());
                ck_assert(nb_tensor_device(y).type == NB_DEVICE_META);
                /* dim 1 reduced: (2, 1, 4) or (2, 4); softmax keeps the shape */
                bool same = op == D_SOFTMAX || op == D_LOGSOFTMAX;
                int64_t want[3] = {2, 3, 4};
                int wnd = 3;
                if (!same && keep) want[1] = 1;
                if (!same && !keep) want[1] = 4, wnd = 2;
                ck_assert_int_eq(y->ndim, wnd);
                for (int d = 0; d < wnd; d++)
                    ck_assert_msg(y->shape[d] == want[d], "%s: dim %d", dop_name[op], d);
                nb_dtype wdt = op == D_MAX_I || op == D_MIN_I || op == D_ARGMAX ||
                                       op == D_ARGMIN || (op == D_SUM && !nb_dtype_is_float(dts[t]))
                                   ? NB_I64 : dts[t];
                ck_assert_msg(y->dtype == wdt, "%s: dtype %s", dop_name[op],
                              nb_dtype_name(y->dtype));
                ck_assert(nb_data(y) == NULL);
            }
        }
        /* all dims, and two of three */
        nb_tensor *s = nb_sum(x, NULL, 0, false);
        ck_assert(s && s->ndim == 0 && nb_tensor_device(s).type == NB_DEVICE_META);
        s = nb_amax(x, (int[]){0, 2}, 2, true);
        ck_assert(s && s->ndim == 3 && s->shape[0] == 1 && s->shape[1] == 3 && s->shape[2] == 1);
    }
    /* argument errors are still found on meta */
    nb_tensor *e = nb_empty_on(NB_META, (int64_t[]){0, 3}, 2, NB_F32);
    tu_assert_error(nb_amax(e, NULL, 0, false), NB_ESHAPE, "amax: cannot reduce over dim 0");
    tu_assert_error(nb_softmax(e, 2), NB_EDIM, "softmax");
    tu_assert_error(nb_mean(nb_empty_on(NB_META, (int64_t[]){2}, 1, NB_I64), NULL, 0, false),
                    NB_EDTYPE, "mean");
    nb_scope_end();
}
END_TEST

/* y (on some device) equals the CPU result ref exactly, after copying it back. */
static void assert_same(nb_tensor *y, nb_tensor *ref, const char *what) {
    ck_assert_msg(y != NULL, "%s: %s", what, nb_last_error());
    ck_assert_msg(nb_tensor_device(y).type == NB_DEVICE_GUARD, "%s: not on guard", what);
    nb_tensor *h = nb_to_device(y, NB_CPU);
    ck_assert_msg(h != NULL, "%s: %s", what, nb_last_error());
    ck_assert_msg(h->dtype == ref->dtype, "%s: dtype", what);
    ck_assert_int_eq(h->ndim, ref->ndim);
    for (int d = 0; d < ref->ndim; d++) ck_assert(h->shape[d] == ref->shape[d]);
    double *a = tu_values(h), *b = tu_values(ref);
    for (int64_t i = 0; i < nb_numel(ref); i++)
        ck_assert_msg(a[i] == b[i] || (isnan(a[i]) && isnan(b[i])), "%s [%lld]: %g vs %g",
                      what, (long long)i, a[i], b[i]);
    free(a);
    free(b);
}

START_TEST(test_guard_device) {
    nb_scope_begin();
    /* long enough rows for the block paths; dims of both kinds innermost */
    const int64_t shape[] = {3, 5, 70};
    const nb_dtype dts[] = {NB_F32, NB_F64, NB_BF16, NB_I32, NB_BOOL};
    const struct { int dims[2], nd; } dl[] = {{{-1}, 1}, {{0}, 1}, {{1}, 1}, {{0, 2}, 2}};
    for (int t = 0; t < NDT(dts); t++) {
        /* the reference on the CPU whatever the default device (where rand_for makes it) */
        nb_tensor *x = nb_to_device(rand_for(shape, 3, dts[t], 100 + (uint64_t)t), NB_CPU);
        /* contiguous, and a strided view of the same layout on both devices (the order of
         * accumulation depends on the strides) */
        nb_tensor *xg0 = nb_to_device(x, GUARD_DEV);
        ck_assert(xg0 != NULL);
        nb_tensor *xs[2] = {x, nb_transpose(nb_contiguous(nb_transpose(x, 0, 2)), 0, 2)};
        nb_tensor *xgs[2] = {xg0, nb_transpose(nb_contiguous(nb_transpose(xg0, 0, 2)), 0, 2)};
        ck_assert(xgs[1] && !nb_is_contiguous(xgs[1]));
        for (int c = 0; c < 2; c++) {
            nb_tensor *xg = xgs[c];
            for (int op = 0; op < D_COUNT; op++) {
                if (dop_float_only(op) && !nb_dtype_is_float(dts[t])) continue;
                for (int k = 0; k < NDT(dl); k++) {
                    int nd = op <= D_AMIN ? dl[k].nd : 1;
                    if (op > D_AMIN && k == 3) continue;
                    for (int keep = 0; keep < 2; keep++) {
                        char what[96];
                        snprintf(what, sizeof what, "%s %s dims[0]=%d nd=%d keep=%d strided=%d",
                                 dop_name[op], nb_dtype_name(dts[t]), dl[k].dims[0], nd, keep,
                                 c);
                        nb_scope_begin(); /* few live guard blocks: each call opens all */
                        nb_tensor *ref = dev_op(op, xs[c], dl[k].dims, nd, keep);
                        ck_assert_msg(ref != NULL, "%s: %s", what, nb_last_error());
                        assert_same(dev_op(op, xg, dl[k].dims, nd, keep), ref, what);
                        nb_scope_end();
                    }
                }
            }
        }
        nb_tensor *xg = nb_to_device(x, GUARD_DEV);
        assert_same(nb_sum(xg, NULL, 0, false), nb_sum(x, NULL, 0, false), "sum all");
    }
    /* a 0-dim input and an empty one */
    nb_tensor *z = nb_to_device(tu_tensor((double[]){2.5}, NULL, 0, NB_F32), NB_CPU);
    nb_tensor *zg = nb_to_device(z, GUARD_DEV);
    assert_same(nb_softmax(zg, 0), nb_softmax(z, 0), "softmax 0-dim");
    assert_same(nb_argmax(zg, 0, false), nb_argmax(z, 0, false), "argmax 0-dim");
    nb_tensor *e = nb_zeros_on(NB_CPU, (int64_t[]){0, 3}, 2, NB_F32);
    nb_tensor *eg = nb_to_device(e, GUARD_DEV);
    assert_same(nb_sum(eg, (int[]){0}, 1, false), nb_sum(e, (int[]){0}, 1, false), "sum empty");
    assert_same(nb_logsumexp(eg, NULL, 0, false), nb_logsumexp(e, NULL, 0, false), "lse empty");
    nb_scope_end();
}
END_TEST

/* Column sums (sum over dim 0 of a dense (R, C) f32 or bf16 tensor: the bias gradients) run
 * in register strips on the CPU; each column must still add its rows in order r = 0, 1, ...
 * into a double, rounded once to the output dtype: the same bits as that loop, at 1, 2 and
 * 3 threads, whatever the strip and task widths. */
START_TEST(test_column_sum_order) {
    nb_scope_begin();
    const int64_t shapes[][2] = {{300, 100}, {77, 45}, {5, 33}, {129, 257}, {64, 32}, {2, 1}};
    const nb_dtype dts[2] = {NB_F32, NB_BF16};
    int saved = nb_get_num_threads();
    for (int nt = 1; nt <= 3; nt++) {
        nb_set_num_threads(nt);
        for (int di = 0; di < 2; di++)
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                const int64_t R = shapes[si][0], C = shapes[si][1];
                nb_tensor *x = tu_random_cpu(shapes[si], 2, dts[di], -3, 3, 40 + si);
                nb_tensor *y = nb_sum(x, (int[]){0}, 1, false);
                ck_assert_msg(y != NULL, "%s", nb_last_error());
                double *xv = tu_values(x);
                void *yv = tu_raw_values(y);
                for (int64_t j = 0; j < C; j++) {
                    double acc = 0;
                    for (int64_t r = 0; r < R; r++) acc += xv[r * C + j];
                    float f = (float)acc;
                    if (dts[di] == NB_F32) {
                        ck_assert_msg(!memcmp(&f, (float *)yv + j, sizeof f),
                                      "f32 (%lld, %lld) column %lld at %d threads: %.9g, not "
                                      "%.9g", (long long)R, (long long)C, (long long)j, nt,
                                      (double)((float *)yv)[j], (double)f);
                    } else {
                        uint16_t h = nb_f32_to_bf16(f);
                        ck_assert_msg(h == ((uint16_t *)yv)[j],
                                      "bf16 (%lld, %lld) column %lld at %d threads",
                                      (long long)R, (long long)C, (long long)j, nt);
                    }
                }
                free(xv), free(yv);
            }
    }
    nb_set_num_threads(saved);
    nb_scope_end();
}
END_TEST

Suite *nb_suite_reduce(void) {
    Suite *s = suite_create("reduce");
    TCase *tc;
#define NB_TC(name)                                                                        \
    tc = tcase_create(#name);                                                              \
    tcase_add_test(tc, name);                                                              \
    suite_add_tcase(s, tc)
    NB_TC(test_sum);
    NB_TC(test_mean);
    NB_TC(test_var_std);
    NB_TC(test_logsumexp);
    NB_TC(test_amax_amin);
    NB_TC(test_max_min_dim);
    NB_TC(test_softmax);
    NB_TC(test_softmax_exp_accuracy);
    NB_TC(test_strided_views);
    NB_TC(test_determinism);
    NB_TC(test_column_sum_order);
    NB_TC(test_errors);
    NB_TC(test_sum_near_overflow);
    NB_TC(test_meta_device);
    NB_TC(test_guard_device);
#undef NB_TC
    return s;
}
