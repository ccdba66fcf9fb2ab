/* test_grad_reduce.c - backward rules of the reductions (var, std, logsumexp, amax/amin,
 * max/min values), softmax / log_softmax, matmul, the indexing ops (index_select, gather,
 * scatter_add, embedding, masked_fill, tril/triu) and cat / stack.
 *
 * Most checks are nb_gradcheck in f64 over tiny shapes: several dims, keepdim on and off,
 * negative dims, non-contiguous inputs (f transposes its input first), every form of
 * matmul, repeated indices. Then: exact gradients for ties (amax splits, max picks the
 * returned index), the fused softmax kernels on shapes that reach their block paths against
 * a double reference, f32 and half backward against f64, "one node per op" (internal ops run
 * with grad mode off), no gradients for integer results, and no system allocation in a
 * repeated forward + backward loop. */
#include <string.h>

#include "autograd/autograd_impl.h"
#include "testutil.h"

/* ---- helpers ------------------------------------------------------------------------------- */
static nb_tensor *leaf(nb_tensor *t) {
    ck_assert(t != NULL);
    ck_assert(nb_set_requires_grad(t, true) == NB_OK);
    return t;
}

static nb_tensor *rnd_leaf(const int64_t *shape, int ndim, uint64_t seed) {
    return leaf(tu_random(shape, ndim, NB_F64, -1, 1, seed));
}

static nb_tensor *idx_tensor(const double *v, const int64_t *shape, int ndim, nb_dtype dt) {
    return tu_tensor(v, shape, ndim, dt);
}

#define GRADCHECK(f, ins, n, ctx, what)                                                     \
    do {                                                                                   \
        nb_status st_ = nb_gradcheck((f), (ins), (n), (ctx), NULL);                        \
        ck_assert_msg(st_ == NB_OK, "%s: %s", (what), nb_last_error());                    \
    } while (0)

/* ---- reductions ---------------------------------------------------------------------------- */
enum { R_SUM, R_MEAN, R_VAR, R_STD, R_LSE, R_AMAX, R_AMIN, R_MAX, R_MIN, R_SOFTMAX, R_LOGSOFTMAX };
static const char *rname[] = {"sum", "mean", "var", "std", "logsumexp", "amax", "amin",
                              "max", "min", "softmax", "log_softmax"};

typedef struct {
    int op;
    int dims[3], nd; /* set-of-dims reductions; dims[0] is the dim of max/min/softmax */
    bool keep, trans;
    int corr;
} red_ctx;

static nb_tensor *f_red(nb_tensor *const *in, int n, void *vc) {
    (void)n;
    const red_ctx *c = vc;
    nb_tensor *x = c->trans ? nb_transpose(in[0], 0, 1) : in[0];
    const int *d = c->nd ? c->dims : NULL;
    switch (c->op) {
    case R_SUM: return nb_sum(x, d, c->nd, c->keep);
    case R_MEAN: return nb_mean(x, d, c->nd, c->keep);
    case R_VAR: return nb_var(x, d, c->nd, c->corr, c->keep);
    case R_STD: return nb_std(x, d, c->nd, c->corr, c->keep);
    case R_LSE: return nb_logsumexp(x, d, c->nd, c->keep);
    case R_AMAX: return nb_amax(x, d, c->nd, c->keep);
    case R_AMIN: return nb_amin(x, d, c->nd, c->keep);
    case R_MAX: return nb_max_dim(x, c->dims[0], c->keep, NULL);
    case R_MIN: {
        nb_tensor *idx = NULL;
        nb_tensor *v = nb_min_dim(x, c->dims[0], c->keep, &idx);
        ck_assert(idx != NULL && !nb_requires_grad(idx));
        return v;
    }
    case R_SOFTMAX: return nb_softmax(x, c->dims[0]);
    default: return nb_log_softmax(x, c->dims[0]);
    }
}

START_TEST(test_reductions) {
    nb_scope_begin();
    /* (2, 3, 4) directly, or stored as (3, 2, 4) and transposed inside f */
    nb_tensor *x = rnd_leaf((int64_t[]){2, 3, 4}, 3, 11);
    nb_tensor *xt = rnd_leaf((int64_t[]){3, 2, 4}, 3, 12);
    const struct { int dims[3], nd; } dl[] = {
        {{0}, 1}, {{-1}, 1}, {{0, 2}, 2}, {{2, -2}, 2}, {{0}, 0} /* all */};
    for (int op = R_SUM; op <= R_AMIN; op++) {
        for (size_t k = 0; k < sizeof dl / sizeof dl[0]; k++) {
            for (int v = 0; v < 4; v++) {
                red_ctx c = {.op = op, .nd = dl[k].nd, .keep = v & 1, .trans = v & 2,
                             .corr = (int)(k % 3)};
                memcpy(c.dims, dl[k].dims, sizeof c.dims);
                char what[96];
                snprintf(what, sizeof what, "%s dims#%zu keep %d trans %d corr %d", rname[op], k,
                         c.keep, c.trans, c.corr);
                if (op == R_STD && c.corr == 2) c.corr = 0;
                GRADCHECK(f_red, (nb_tensor *[]){c.trans ? xt : x}, 1, &c, what);
            }
        }
    }
    /* a 0-dim input */
    nb_tensor *s = leaf(tu_tensor((double[]){0.7}, NULL, 0, NB_F64));
    for (int op = R_SUM; op <= R_LOGSOFTMAX; op++) {
        if (op == R_VAR || op == R_STD) continue; /* one element: var is NaN */
        red_ctx c = {.op = op, .dims = {-1}, .nd = op <= R_AMIN ? 0 : 1};
        GRADCHECK(f_red, (nb_tensor *[]){s}, 1, &c, rname[op]);
    }
    nb_scope_end();
}
END_TEST

START_TEST(test_max_min_softmax) {
    nb_scope_begin();
    nb_tensor *x = rnd_leaf((int64_t[]){2, 3, 4}, 3, 21);
    nb_tensor *xt = rnd_leaf((int64_t[]){3, 2, 4}, 3, 22);
    int dims[] = {0, 1, 2, -1, -3};
    for (int op = R_MAX; op <= R_LOGSOFTMAX; op++) {
        for (int k = 0; k < 5; k++) {
            for (int v = 0; v < 4; v++) {
                if (op >= R_SOFTMAX && (v & 1)) continue; /* no keepdim */
                red_ctx c = {.op = op, .dims = {dims[k]}, .keep = v & 1, .trans = v & 2};
                char what[64];
                snprintf(what, sizeof what, "%s dim %d keep %d trans %d", rname[op], dims[k],
                         c.keep, c.trans);
                GRADCHECK(f_red, (nb_tensor *[]){c.trans ? xt : x}, 1, &c, what);
            }
        }
    }
    nb_scope_end();
}
END_TEST

START_TEST(test_ties) {
    nb_scope_begin();
    /* amax splits g evenly among ties; max (values) sends it to the returned index */
    nb_tensor *x = leaf(tu_tensor((double[]){1, 3, 3, 2, 5, 5, 5, 0}, (int64_t[]){2, 4}, 2,
                                  NB_F64));
    nb_tensor *g = tu_tensor((double[]){6, 12}, (int64_t[]){2}, 1, NB_F64);
    nb_backward_opts bo = nb_backward_defaults();
    bo.grad_output = g;
    ck_assert(nb_backward_ex(nb_amax(x, (int[]){1}, 1, false), &bo) == NB_OK);
    tu_assert_close(nb_grad(x), ((double[]){0, 3, 3, 0, 4, 4, 4, 0}), ((int64_t[]){2, 4}), 2, 0);
    nb_clear_grad(x);
    /* amax over everything: the 3 fives share 1 */
    ck_assert(nb_backward(nb_amax(x, NULL, 0, false)) == NB_OK);
    tu_assert_close(nb_grad(x), ((double[]){0, 0, 0, 0, 1. / 3, 1. / 3, 1. / 3, 0}),
                    ((int64_t[]){2, 4}), 2, 1e-15);
    nb_clear_grad(x);
    nb_backward_opts bo2 = nb_backward_defaults();
    bo2.grad_output = nb_reshape(g, (int64_t[]){2, 1}, 2);
    ck_assert(nb_backward_ex(nb_max_dim(x, -1, true, NULL), &bo2) == NB_OK);
    tu_assert_close(nb_grad(x), ((double[]){0, 6, 0, 0, 12, 0, 0, 0}), ((int64_t[]){2, 4}), 2, 0);
    nb_clear_grad(x);
    /* amin and min over dim 0: columns (1, 1) and (0, 0) tie, (3, 5) and (2, 0) do not */
    nb_tensor *y = leaf(tu_tensor((double[]){1, 3, 0, 2, 1, 5, 0, 0}, (int64_t[]){2, 4}, 2,
                                  NB_F64));
    nb_tensor *g4 = tu_tensor((double[]){2, 4, 6, 8}, (int64_t[]){4}, 1, NB_F64);
    nb_backward_opts bo3 = nb_backward_defaults();
    bo3.grad_output = g4;
    ck_assert(nb_backward_ex(nb_amin(y, (int[]){0}, 1, false), &bo3) == NB_OK);
    tu_assert_close(nb_grad(y), ((double[]){1, 4, 3, 0, 1, 0, 3, 8}), ((int64_t[]){2, 4}), 2, 0);
    nb_clear_grad(y);
    nb_tensor *idx = NULL;
    nb_backward_opts bo4 = nb_backward_defaults();
    bo4.grad_output = g4;
    ck_assert(nb_backward_ex(nb_min_dim(y, 0, false, &idx), &bo4) == NB_OK);
    tu_assert_close(nb_grad(y), ((double[]){2, 4, 6, 0, 0, 0, 0, 8}), ((int64_t[]){2, 4}), 2, 0);
    tu_assert_close(idx, ((double[]){0, 0, 0, 1}), ((int64_t[]){4}), 1, 0);
    nb_scope_end();
}
END_TEST

/* Reference softmax / log_softmax backward in double over (O, L, D) with the dim in the
 * middle; x and g are row-major. */
static void ref_softmax_bw(const double *x, const double *g, double *dx, int64_t O, int64_t L,
                           int64_t D, bool lg) {
    for (int64_t o = 0; o < O; o++)
        for (int64_t j = 0; j < D; j++) {
#define AT(l) ((o * L + (l)) * D + j)
            double m = -INFINITY, s = 0, dot = 0, gs = 0;
            for (int64_t l = 0; l < L; l++) m = fmax(m, x[AT(l)]);
            for (int64_t l = 0; l < L; l++) s += exp(x[AT(l)] - m);
            for (int64_t l = 0; l < L; l++) {
                double y = exp(x[AT(l)] - m) / s;
                dot += g[AT(l)] * y, gs += g[AT(l)];
            }
            for (int64_t l = 0; l < L; l++) {
                double y = exp(x[AT(l)] - m) / s;
                dx[AT(l)] = lg ? g[AT(l)] - y * gs : y * (g[AT(l)] - dot);
            }
#undef AT
        }
}

START_TEST(test_softmax_kernels) {
    /* Shapes that reach the multi-block row path (L > 1024) and the column path with several
     * blocks (D > 128), in every float dtype, against the double reference. */
    nb_scope_begin();
    const struct { int64_t shape[3]; int dim; } cases[] = {
        {{2, 1500, 1}, 1}, {{2, 5, 300}, 1}, {{3, 7, 1}, 1}, {{4, 6, 1}, 0}};
    const nb_dtype dts[] = {NB_F64, NB_F32, NB_F16, NB_BF16};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t *sh = cases[c].shape;
        int dim = cases[c].dim;
        int64_t O = 1, L = sh[dim], D = 1, numel = sh[0] * sh[1] * sh[2];
        for (int d = 0; d < dim; d++) O *= sh[d];
        for (int d = dim + 1; d < 3; d++) D *= sh[d];
        for (int lg = 0; lg < 2; lg++) {
            for (size_t t = 0; t < 4; t++) {
                nb_scope_begin();
                nb_tensor *x = leaf(tu_random(sh, 3, dts[t], -3, 3, 31 + c));
                nb_tensor *g = tu_random(sh, 3, dts[t], -1, 1, 41 + c);
                nb_tensor *y = lg ? nb_log_softmax(x, dim) : nb_softmax(x, dim);
                nb_backward_opts bo = nb_backward_defaults();
                bo.grad_output = g;
                ck_assert(nb_backward_ex(y, &bo) == NB_OK);
                double *xv = tu_values(x), *gv = tu_values(g), *ref = malloc(sizeof(double) * (size_t)numel);
                ref_softmax_bw(xv, gv, ref, O, L, D, lg);
                /* half: |error| relative to the largest gradient of a row is what matters */
                double tol = dts[t] == NB_F64 ? 1e-12 : dts[t] == NB_F32 ? 2e-5 : dts[t] == NB_F16 ? 4e-3 : 3e-2;
                double *dv = tu_values(nb_grad(x));
                for (int64_t i = 0; i < numel; i++)
                    ck_assert_msg(fabs(dv[i] - ref[i]) <= tol * (1 + fabs(ref[i])),
                                  "case %zu lg %d %s at %lld: %g vs %g", c, lg,
                                  nb_dtype_name(dts[t]), (long long)i, dv[i], ref[i]);
                ck_assert_int_eq(nb_tensor_dtype(nb_grad(x)), dts[t]);
                free(xv), free(gv), free(ref), free(dv);
                nb_scope_end();
            }
        }
    }
    /* a grad_output of another dtype than the output is converted */
    nb_tensor *x = leaf(tu_random((int64_t[]){2, 3}, 2, NB_F32, -1, 1, 5));
    nb_tensor *y = nb_softmax(x, 1);
    nb_backward_opts bo2 = nb_backward_defaults();
    bo2.grad_output = nb_ones((int64_t[]){2, 3}, 2, NB_F64);
    ck_assert(nb_backward_ex(y, &bo2) == NB_OK);
    tu_assert_close(nb_grad(x), ((double[]){0, 0, 0, 0, 0, 0}), ((int64_t[]){2, 3}), 2, 1e-6);
    nb_scope_end();
}
END_TEST

/* ---- matmul ------------------------------------------------------------------------------- */
typedef struct {
    bool ta, tb; /* transpose the last two dims of the input before the product */
} mm_ctx;

static nb_tensor *f_mm(nb_tensor *const *in, int n, void *vc) {
    (void)n;
    const mm_ctx *c = vc;
    nb_tensor *a = c->ta ? nb_transpose(in[0], -1, -2) : in[0];
    nb_tensor *b = c->tb ? nb_transpose(in[1], -1, -2) : in[1];
    return nb_matmul(a, b);
}

START_TEST(test_matmul) {
    nb_scope_begin();
    const struct {
        int64_t a[4], b[4];
        int na, nb;
        bool ta, tb;
    } cases[] = {
        {{3}, {3}, 1, 1, false, false},                   /* dot */
        {{3}, {3, 2}, 1, 2, false, false},                /* vector @ matrix */
        {{2, 3}, {3}, 2, 1, false, false},                /* matrix @ vector */
        {{2, 3}, {3, 4}, 2, 2, false, false},
        {{3, 2}, {3, 4}, 2, 2, true, false},              /* transposed operands */
        {{2, 3}, {4, 3}, 2, 2, false, true},
        {{3, 2}, {4, 3}, 2, 2, true, true},
        {{2, 2, 3}, {3, 4}, 3, 2, false, false},          /* batch @ matrix (folded dB) */
        {{2, 3, 2}, {3, 4}, 3, 2, true, false},           /* ... with a transposed A */
        {{2, 3}, {2, 3, 4}, 2, 3, false, false},          /* matrix @ batch */
        {{2, 1, 2, 3}, {3, 3, 2}, 4, 3, false, false},    /* broadcast batch dims */
        {{1, 2, 3}, {2, 2, 3}, 3, 3, false, true},
        {{3}, {2, 3, 2}, 1, 3, false, false},             /* 1-D @ batch */
        {{2, 2, 3}, {3}, 3, 1, false, false},             /* batch @ 1-D */
        {{2, 1, 2, 3}, {3}, 4, 1, false, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nb_tensor *a = rnd_leaf(cases[i].a, cases[i].na, 100 + i);
        nb_tensor *b = rnd_leaf(cases[i].b, cases[i].nb, 200 + i);
        mm_ctx c = {cases[i].ta, cases[i].tb};
        char what[32];
        snprintf(what, sizeof what, "matmul case %zu", i);
        GRADCHECK(f_mm, ((nb_tensor *[]){a, b}), 2, &c, what);
    }
    /* only one operand requires grad */
    nb_tensor *a = rnd_leaf((int64_t[]){2, 3}, 2, 7);
    nb_tensor *b = tu_random((int64_t[]){3, 2}, 2, NB_F64, -1, 1, 8);
    GRADCHECK(f_mm, ((nb_tensor *[]){a, b}), 2, &(mm_ctx){0}, "a only");
    GRADCHECK(f_mm, ((nb_tensor *[]){b, a}), 2, &((mm_ctx){true, true}), "b only");
    /* an empty inner dim: zero gradients of the right shapes */
    nb_tensor *e0 = leaf(nb_zeros((int64_t[]){2, 0}, 2, NB_F64));
    nb_tensor *e1 = leaf(nb_zeros((int64_t[]){0, 3}, 2, NB_F64));
    nb_tensor *z = nb_matmul(e0, e1);
    nb_backward_opts bo = nb_backward_defaults();
    bo.grad_output = nb_ones((int64_t[]){2, 3}, 2, NB_F64);
    ck_assert(nb_backward_ex(z, &bo) == NB_OK);
    ck_assert_int_eq(nb_numel(nb_grad(e0)), 0);
    ck_assert_int_eq(nb_size(nb_grad(e1), 1), 3);
    nb_scope_end();
}
END_TEST

/* ---- indexing ------------------------------------------------------------------------------- */
enum { I_SELECT, I_GATHER, I_SCATTER, I_EMBED, I_MASKED, I_TRIL, I_TRIU };
typedef struct {
    int op, dim;
    int64_t k;
    bool trans;
} ix_ctx;

/* in[0]: x (or weight), in[1]: index / mask, in[2]: src (scatter_add). */
static nb_tensor *f_ix(nb_tensor *const *in, int n, void *vc) {
    (void)n;
    const ix_ctx *c = vc;
    nb_tensor *x = c->trans ? nb_transpose(in[0], 0, -1) : in[0];
    switch (c->op) {
    case I_SELECT: return nb_index_select(x, c->dim, in[1]);
    case I_GATHER: return nb_gather(x, c->dim, in[1]);
    case I_SCATTER: return nb_scatter_add(x, c->dim, in[1], in[2]);
    case I_EMBED: return nb_embedding(x, in[1]);
    case I_MASKED: return nb_masked_fill(x, in[1], -2.5);
    case I_TRIL: return nb_tril(x, c->k);
    default: return nb_triu(x, c->k);
    }
}

START_TEST(test_indexing) {
    nb_scope_begin();
    nb_tensor *x = rnd_leaf((int64_t[]){2, 3, 4}, 3, 51);
    nb_tensor *xt = rnd_leaf((int64_t[]){4, 3, 2}, 3, 52); /* transposed (0, -1) in f */
    /* index_select with repeated indices, i32 and i64, several dims */
    nb_tensor *i0 = idx_tensor((double[]){1, 0, 1, 1}, (int64_t[]){4}, 1, NB_I64);
    nb_tensor *i1 = idx_tensor((double[]){2, 2, 0}, (int64_t[]){3}, 1, NB_I32);
    nb_tensor *i2 = idx_tensor((double[]){3, 0, 3, 1, 3}, (int64_t[]){5}, 1, NB_I64);
    const struct { int dim; nb_tensor *idx; } sel[] = {{0, i0}, {1, i1}, {-2, i1}, {2, i2}, {-1, i2}};
    for (size_t i = 0; i < 5; i++)
        for (int t = 0; t < 2; t++) {
            ix_ctx c = {.op = I_SELECT, .dim = sel[i].dim, .trans = t};
            GRADCHECK(f_ix, ((nb_tensor *[]){t ? xt : x, sel[i].idx}), 2, &c, "index_select");
        }
    /* gather / scatter_add (x and a src larger than the index) */
    nb_tensor *gi = idx_tensor((double[]){0, 3, 3, 1, 3, 0, 2, 2, 2, 2}, (int64_t[]){2, 1, 5}, 3, NB_I64);
    nb_tensor *gj = idx_tensor((double[]){2, 2, 0, 2, 1, 1}, (int64_t[]){1, 3, 2}, 3, NB_I32);
    for (int t = 0; t < 2; t++) {
        ix_ctx c = {.op = I_GATHER, .dim = 2, .trans = t};
        GRADCHECK(f_ix, ((nb_tensor *[]){t ? xt : x, gi}), 2, &c, "gather dim 2");
        c.dim = -2;
        GRADCHECK(f_ix, ((nb_tensor *[]){t ? xt : x, gj}), 2, &c, "gather dim -2");
    }
    nb_tensor *src = rnd_leaf((int64_t[]){2, 2, 6}, 3, 53);
    ix_ctx sc = {.op = I_SCATTER, .dim = -1};
    GRADCHECK(f_ix, ((nb_tensor *[]){x, gi, src}), 3, &sc, "scatter_add dim -1");
    nb_tensor *src2 = rnd_leaf((int64_t[]){1, 3, 2}, 3, 54);
    sc.dim = 1;
    GRADCHECK(f_ix, ((nb_tensor *[]){x, gj, src2}), 3, &sc, "scatter_add dim 1");
    /* embedding: 2-D indices with repeats */
    nb_tensor *w = rnd_leaf((int64_t[]){5, 3}, 2, 55);
    nb_tensor *ei = idx_tensor((double[]){4, 0, 4, 2, 4, 0}, (int64_t[]){2, 3}, 2, NB_I64);
    ix_ctx ec = {.op = I_EMBED};
    GRADCHECK(f_ix, ((nb_tensor *[]){w, ei}), 2, &ec, "embedding");
    /* masked_fill with broadcast masks */
    nb_tensor *m1 = idx_tensor((double[]){1, 0, 1}, (int64_t[]){3, 1}, 2, NB_BOOL);
    nb_tensor *m2 = idx_tensor((double[]){0, 1, 1, 0}, (int64_t[]){4}, 1, NB_BOOL);
    for (int t = 0; t < 2; t++) {
        ix_ctx c = {.op = I_MASKED, .trans = t};
        GRADCHECK(f_ix, ((nb_tensor *[]){t ? xt : x, m1}), 2, &c, "masked_fill [3,1]");
        GRADCHECK(f_ix, ((nb_tensor *[]){t ? xt : x, m2}), 2, &c, "masked_fill [4]");
    }
    /* tril / triu over the last two dims, several diagonals */
    for (int op = I_TRIL; op <= I_TRIU; op++)
        for (int64_t k = -1; k <= 1; k++)
            for (int t = 0; t < 2; t++) {
                ix_ctx c = {.op = op, .k = k, .trans = t};
                GRADCHECK(f_ix, ((nb_tensor *[]){t ? xt : x}), 1, &c, "tril/triu");
            }
    nb_scope_end();
}
END_TEST

START_TEST(test_index_exact) {
    /* Repeated indices accumulate: exact values (and the f32 kernel path). */
    nb_scope_begin();
    nb_tensor *w = leaf(nb_zeros((int64_t[]){4, 2}, 2, NB_F32));
    nb_tensor *ei = idx_tensor((double[]){3, 1, 3, 3}, (int64_t[]){2, 2}, 2, NB_I32);
    nb_tensor *g = tu_tensor((double[]){1, 2, 3, 4, 5, 6, 7, 8}, (int64_t[]){2, 2, 2}, 3, NB_F32);
    nb_backward_opts bo = nb_backward_defaults();
    bo.grad_output = g;
    ck_assert(nb_backward_ex(nb_embedding(w, ei), &bo) == NB_OK);
    tu_assert_close(nb_grad(w), ((double[]){0, 0, 3, 4, 0, 0, 13, 16}), ((int64_t[]){4, 2}), 2, 0);
    ck_assert_int_eq(nb_tensor_dtype(nb_grad(w)), NB_F32);
    /* index_select of a bf16 input: the gradient comes back in bf16 */
    nb_tensor *xb = leaf(nb_zeros((int64_t[]){3}, 1, NB_BF16));
    nb_tensor *ii = idx_tensor((double[]){2, 2, 0, 2}, (int64_t[]){4}, 1, NB_I64);
    nb_tensor *gb = tu_tensor((double[]){1, 2, 4, 8}, (int64_t[]){4}, 1, NB_BF16);
    nb_backward_opts bo2 = nb_backward_defaults();
    bo2.grad_output = gb;
    ck_assert(nb_backward_ex(nb_index_select(xb, 0, ii), &bo2) == NB_OK);
    tu_assert_close(nb_grad(xb), ((double[]){4, 0, 11}), ((int64_t[]){3}), 1, 0);
    ck_assert_int_eq(nb_tensor_dtype(nb_grad(xb)), NB_BF16);
    /* a wide embedding (D split over threads when there are several) */
    int64_t V = 7, D = 300, N = 64;
    nb_tensor *wd = leaf(nb_zeros((int64_t[]){V, D}, 2, NB_F64));
    double iv[64];
    for (int i = 0; i < N; i++) iv[i] = (i * 5) % V;
    nb_tensor *id = idx_tensor(iv, (int64_t[]){N}, 1, NB_I64);
    nb_tensor *gd = tu_random((int64_t[]){N, D}, 2, NB_F64, -1, 1, 9);
    nb_backward_opts bo3 = nb_backward_defaults();
    bo3.grad_output = gd;
    ck_assert(nb_backward_ex(nb_embedding(wd, id), &bo3) == NB_OK);
    double *gv = tu_values(gd), *ref = calloc((size_t)(V * D), sizeof(double));
    for (int i = 0; i < N; i++)
        for (int j = 0; j < D; j++) ref[(int64_t)iv[i] * D + j] += gv[i * D + j];
    tu_assert_close(nb_grad(wd), ref, ((int64_t[]){V, D}), 2, 1e-14);
    free(gv), free(ref);
    nb_scope_end();
}
END_TEST

/* ---- cat / stack ---------------------------------------------------------------------------- */
typedef struct {
    bool stack, trans;
    int dim;
} join_ctx;

static nb_tensor *f_join(nb_tensor *const *in, int n, void *vc) {
    const join_ctx *c = vc;
    nb_tensor *ts[4];
    for (int i = 0; i < n; i++) ts[i] = in[i];
    if (c->trans) ts[1] = nb_transpose(in[1], 0, 1);
    return c->stack ? nb_stack(ts, n, c->dim) : nb_cat(ts, n, c->dim);
}

START_TEST(test_join) {
    nb_scope_begin();
    /* cat along dim 0, 1 / -1 and a 3-D middle dim; input 1 is non-contiguous */
    nb_tensor *a0 = rnd_leaf((int64_t[]){1, 3}, 2, 61), *b0 = rnd_leaf((int64_t[]){3, 2}, 2, 62),
              *c0 = rnd_leaf((int64_t[]){3, 3}, 2, 63);
    GRADCHECK(f_join, ((nb_tensor *[]){a0, b0, c0}), 3, &((join_ctx){.trans = true, .dim = 0}), "cat 0");
    nb_tensor *a1 = rnd_leaf((int64_t[]){2, 1}, 2, 64), *b1 = rnd_leaf((int64_t[]){3, 2}, 2, 65),
              *c1 = rnd_leaf((int64_t[]){2, 2}, 2, 66);
    GRADCHECK(f_join, ((nb_tensor *[]){a1, b1, c1}), 3, &((join_ctx){.trans = true, .dim = 1}), "cat 1");
    GRADCHECK(f_join, ((nb_tensor *[]){a1, b1, c1}), 3, &((join_ctx){.trans = true, .dim = -1}), "cat -1");
    nb_tensor *a2 = rnd_leaf((int64_t[]){2, 1, 2}, 3, 67), *b2 = rnd_leaf((int64_t[]){2, 3, 2}, 3, 68);
    GRADCHECK(f_join, ((nb_tensor *[]){a2, b2, a2}), 3, &((join_ctx){.dim = -2}), "cat 3-D, repeated input");
    /* stack along every dim */
    nb_tensor *s0 = rnd_leaf((int64_t[]){2, 3}, 2, 69), *s1 = rnd_leaf((int64_t[]){3, 2}, 2, 70),
              *s2 = rnd_leaf((int64_t[]){2, 3}, 2, 71);
    for (int d = -3; d <= 2; d++) {
        char what[32];
        snprintf(what, sizeof what, "stack dim %d", d);
        GRADCHECK(f_join, ((nb_tensor *[]){s0, s1, s2}), 3, &((join_ctx){.stack = true, .trans = true, .dim = d}), what);
    }
    /* mixed dtypes and a legacy empty input: gradients in each input's dtype and shape */
    nb_tensor *m32 = leaf(tu_random((int64_t[]){2, 2}, 2, NB_F32, -1, 1, 72));
    nb_tensor *m64 = leaf(tu_random((int64_t[]){1, 2}, 2, NB_F64, -1, 1, 73));
    nb_tensor *emp = leaf(nb_zeros((int64_t[]){0}, 1, NB_F32));
    nb_tensor *cat = nb_cat((nb_tensor *[]){m32, emp, m64}, 3, 0);
    ck_assert_int_eq(nb_tensor_dtype(cat), NB_F64);
    nb_backward_opts bo = nb_backward_defaults();
    bo.grad_output = tu_tensor((double[]){1, 2, 3, 4, 5, 6}, (int64_t[]){3, 2}, 2, NB_F64);
    ck_assert(nb_backward_ex(cat, &bo) == NB_OK);
    tu_assert_close(nb_grad(m32), ((double[]){1, 2, 3, 4}), ((int64_t[]){2, 2}), 2, 0);
    tu_assert_close(nb_grad(m64), ((double[]){5, 6}), ((int64_t[]){1, 2}), 2, 0);
    ck_assert_int_eq(nb_tensor_dtype(nb_grad(m32)), NB_F32);
    ck_assert_int_eq(nb_numel(nb_grad(emp)), 0);
    nb_scope_end();
}
END_TEST

/* ---- f32 / half against f64 ------------------------------------------------------------- */
/* A chain over many of the rules: embedding -> matmul -> softmax / log_softmax -> reductions. */
static nb_tensor *chain(nb_tensor *w, nb_tensor *v, nb_tensor *idx, nb_tensor *mask) {
    nb_tensor *e = nb_embedding(w, idx);                      /* (2, 3, 4) */
    nb_tensor *h = nb_matmul(e, v);                           /* (2, 3, 5) */
    nb_tensor *p = nb_softmax(h, -1), *lp = nb_log_softmax(h, 1);
    nb_tensor *mx = nb_max_dim(lp, 1, true, NULL);            /* (2, 1, 5) */
    nb_tensor *c = nb_cat((nb_tensor *[]){p, lp, nb_masked_fill(h, mask, 0)}, 3, 1); /* (2, 9, 5) */
    nb_tensor *t = nb_tril(nb_add(c, mx), 1);
    nb_tensor *s = nb_stack((nb_tensor *[]){nb_std(t, (int[]){1}, 1, 1, false),
                                            nb_logsumexp(t, (int[]){-2}, 1, false),
                                            nb_var(t, (int[]){1}, 1, 0, false),
                                            nb_amax(t, (int[]){1}, 1, false)}, 4, 0);
    nb_tensor *gsel = nb_gather(s, 0, idx_tensor((double[]){1, 3, 0, 2, 2}, (int64_t[]){1, 1, 5}, 3, NB_I64));
    return nb_add(nb_sum(s, NULL, 0, false), nb_sum(nb_index_select(gsel, 2, idx_tensor((double[]){4, 4, 1}, (int64_t[]){3}, 1, NB_I32)), NULL, 0, false));
}

static nb_tensor *f_chain(nb_tensor *const *in, int n, void *vc) {
    (void)n, (void)vc;
    return chain(in[0], in[1], in[2], in[3]);
}

/* A copy of t as a new leaf of dtype dt. */
static nb_tensor *leaf_as(nb_tensor *t, nb_dtype dt) {
    return leaf(nb_to_dtype(nb_detach(t), dt));
}

START_TEST(test_dtypes_agree) {
    nb_scope_begin();
    nb_tensor *idx = idx_tensor((double[]){0, 5, 2, 5, 5, 1}, (int64_t[]){2, 3}, 2, NB_I64);
    nb_tensor *mask = idx_tensor((double[]){1, 0, 0, 1, 0}, (int64_t[]){5}, 1, NB_BOOL);
    nb_tensor *w = rnd_leaf((int64_t[]){6, 4}, 2, 81), *v = rnd_leaf((int64_t[]){4, 5}, 2, 82);
    GRADCHECK(f_chain, ((nb_tensor *[]){w, v, idx, mask}), 4, NULL, "chain f64");
    ck_assert(nb_backward(chain(w, v, idx, mask)) == NB_OK);
    double *gw = tu_values(nb_grad(w)), *gv = tu_values(nb_grad(v));
    const struct { nb_dtype dt; double tol; } dts[] = {{NB_F32, 1e-4}, {NB_F16, 3e-2}, {NB_BF16, 1.5e-1}};
    for (size_t i = 0; i < 3; i++) {
        nb_scope_begin();
        nb_tensor *w2 = leaf_as(w, dts[i].dt), *v2 = leaf_as(v, dts[i].dt);
        nb_tensor *loss = chain(w2, v2, idx, mask);
        ck_assert_msg(loss != NULL, "%s", nb_last_error());
        ck_assert(nb_backward(loss) == NB_OK);
        ck_assert_int_eq(nb_tensor_dtype(nb_grad(w2)), dts[i].dt);
        ck_assert_int_eq(nb_tensor_dtype(nb_grad(v2)), dts[i].dt);
        tu_assert_close(nb_grad(w2), gw, ((int64_t[]){6, 4}), 2, dts[i].tol);
        tu_assert_close(nb_grad(v2), gv, ((int64_t[]){4, 5}), 2, dts[i].tol);
        nb_scope_end();
    }
    free(gw), free(gv);
    nb_scope_end();
}
END_TEST

/* ---- one node per op, integer results, grad mode ------------------------------------------ */
static void assert_leaf_edge(const nb_tensor *y, nb__op op, int i, const nb_tensor *in) {
    ck_assert_msg(y && y->grad_fn, "%s", nb_last_error());
    ck_assert_str_eq(nb__op_names[y->grad_fn->op], nb__op_names[op]);
    ck_assert(y->grad_fn->edges[i].leaf == in);
}

START_TEST(test_one_node) {
    nb_scope_begin();
    /* half matmul converts internally: still one MATMUL node straight on the leaves */
    nb_tensor *a = leaf(tu_random((int64_t[]){2, 3}, 2, NB_F16, -1, 1, 1));
    nb_tensor *b = leaf(tu_random((int64_t[]){3, 2}, 2, NB_F16, -1, 1, 2));
    nb_tensor *y = nb_matmul(a, b);
    assert_leaf_edge(y, NB__OP_MATMUL, 0, a);
    assert_leaf_edge(y, NB__OP_MATMUL, 1, b);
    nb_backward_opts bo = nb_backward_defaults();
    bo.grad_output = nb_ones_like(y);
    ck_assert(nb_backward_ex(y, &bo) == NB_OK);
    ck_assert_int_eq(nb_tensor_dtype(nb_grad(a)), NB_F16);
    /* a layout the GEMM cannot read is copied internally: the edge is still the slice */
    nb_tensor *big = leaf(tu_random((int64_t[]){4, 6}, 2, NB_F32, -1, 1, 3));
    nb_tensor *sl = nb_slice(nb_slice(big, 0, 0, 4, 2), 1, 0, 6, 2); /* (2, 3), strides 12, 2 */
    nb_tensor *y2 = nb_matmul(sl, nb_transpose(sl, 0, 1));
    ck_assert(y2 && y2->grad_fn && y2->grad_fn->op == NB__OP_MATMUL);
    ck_assert(y2->grad_fn->edges[0].node && y2->grad_fn->edges[0].node->op == NB__OP_SLICE);
    /* scatter_add clones / converts internally */
    for (int h = 0; h < 2; h++) {
        nb_dtype dt = h ? NB_BF16 : NB_F32;
        nb_tensor *x = leaf(nb_zeros((int64_t[]){3}, 1, dt));
        nb_tensor *src = leaf(nb_ones((int64_t[]){4}, 1, dt));
        nb_tensor *idx = idx_tensor((double[]){2, 0, 2, 2}, (int64_t[]){4}, 1, NB_I64);
        nb_tensor *z = nb_scatter_add(x, 0, idx, src);
        assert_leaf_edge(z, NB__OP_SCATTER_ADD, 0, x);
        assert_leaf_edge(z, NB__OP_SCATTER_ADD, 2, src);
        tu_assert_close(z, ((double[]){1, 0, 3}), ((int64_t[]){3}), 1, 0);
        nb_tensor *g = tu_tensor((double[]){1, 2, 3}, (int64_t[]){3}, 1, dt);
        nb_backward_opts bo2 = nb_backward_defaults();
        bo2.grad_output = g;
        ck_assert(nb_backward_ex(z, &bo2) == NB_OK);
        tu_assert_close(nb_grad(x), ((double[]){1, 2, 3}), ((int64_t[]){3}), 1, 0);
        tu_assert_close(nb_grad(src), ((double[]){3, 1, 3, 3}), ((int64_t[]){4}), 1, 0);
    }
    /* cat / stack: one node over all inputs */
    tu_assert_error(nb_cat((nb_tensor *[]){a, b, a}, 3, 0), NB_ESHAPE, "cat"); /* (2,3), (3,2) */
    nb_clear_error();
    nb_tensor *c2 = nb_cat((nb_tensor *[]){a, nb_transpose(b, 0, 1), a}, 3, 0);
    ck_assert(c2 && c2->grad_fn && c2->grad_fn->op == NB__OP_CAT && c2->grad_fn->ninputs == 3);
    nb_tensor *s = nb_stack((nb_tensor *[]){a, a}, 2, 1);
    assert_leaf_edge(s, NB__OP_STACK, 1, a);
    /* integer results never need gradients; grad mode off records nothing */
    nb_tensor *x = leaf(tu_random((int64_t[]){2, 3}, 2, NB_F32, -1, 1, 4));
    nb_tensor *idx = NULL;
    nb_tensor *mv = nb_max_dim(x, 1, false, &idx);
    ck_assert(nb_requires_grad(mv) && !nb_requires_grad(idx) && idx->grad_fn == NULL);
    ck_assert(!nb_requires_grad(nb_argmax(x, 0, false)));
    ck_assert(!nb_requires_grad(nb_argmin(x, -1, true)));
    ck_assert(!nb_requires_grad(nb_one_hot(idx, 3, NB_F32)));
    NB_NO_GRAD_BEGIN
    ck_assert(!nb_requires_grad(nb_softmax(x, 0)));
    ck_assert(!nb_requires_grad(nb_matmul(x, nb_transpose(x, 0, 1))));
    ck_assert(!nb_requires_grad(nb_cat((nb_tensor *[]){x, x}, 2, 0)));
    ck_assert(!nb_requires_grad(nb_max_dim(x, 0, false, NULL)));
    NB_NO_GRAD_END
    /* an op that fails records nothing and returns NULL */
    ck_assert(nb_matmul(x, x) == NULL);
    nb_clear_error();
    ck_assert(nb_max_dim(x, 5, false, &idx) == NULL && idx == NULL);
    nb_clear_error();
    nb_scope_end();
}
END_TEST

START_TEST(test_no_alloc_steady) {
    nb_scope_begin();
    nb_tensor *idx = idx_tensor((double[]){0, 5, 2, 5, 5, 1}, (int64_t[]){2, 3}, 2, NB_I64);
    nb_tensor *mask = idx_tensor((double[]){1, 0, 0, 1, 0}, (int64_t[]){5}, 1, NB_BOOL);
    nb_tensor *w = leaf(tu_random((int64_t[]){6, 4}, 2, NB_F32, -1, 1, 91));
    nb_tensor *v = leaf(tu_random((int64_t[]){4, 5}, 2, NB_F32, -1, 1, 92));
    nb_alloc_stats before, after;
    for (int step = 0; step < 25; step++) {
        if (step == 8) nb_alloc_get_stats(&before);
        nb_scope_begin();
        nb_tensor *loss = chain(w, v, idx, mask);
        ck_assert(nb_backward(loss) == NB_OK);
        nb_scope_end();
    }
    nb_alloc_get_stats(&after);
    ck_assert_int_eq(after.system_allocs, before.system_allocs);
    ck_assert_int_eq(after.bytes_live, before.bytes_live);
    nb_scope_end();
}
END_TEST

/* ---- thread-count independence ----------------------------------------------------------- */
/* The gradient of x for y = op(x) and a fixed grad_output, computed with nt threads. */
static double *grad_with_threads(int nt, int which, nb_tensor *x0, nb_tensor *aux) {
    nb_set_num_threads(nt);
    nb_scope_begin();
    nb_tensor *x = leaf(nb_clone(x0)), *y;
    switch (which) {
    case 0: y = nb_softmax(x, -1); break;                   /* row path */
    case 1: y = nb_log_softmax(x, 1); break;                /* column path */
    case 2: y = nb_embedding(x, aux); break;                /* index_add over columns */
    default: y = nb_index_select(x, 1, aux); break;        /* index_add over outer slices */
    }
    nb_tensor *g = tu_random(nb_shape(y), nb_ndim(y), NB_F32, -1, 1, 77);
    nb_backward_opts bo = nb_backward_defaults();
    bo.grad_output = g;
    ck_assert(nb_backward_ex(y, &bo) == NB_OK);
    double *v = tu_values(nb_grad(x));
    nb_scope_end();
    return v;
}

START_TEST(test_thread_independent) {
    nb_scope_begin();
    int prev = nb_get_num_threads();
    double iv[300];
    for (int i = 0; i < 300; i++) iv[i] = (i * 7) % 40;
    nb_tensor *idx = idx_tensor(iv, (int64_t[]){300}, 1, NB_I64);
    const struct { int64_t shape[3]; int ndim; } xs[] = {
        {{8, 9000}, 2}, {{4, 50, 400}, 3}, {{40, 1024}, 2}, {{32, 40, 8}, 3}};
    for (int w = 0; w < 4; w++) {
        nb_tensor *x0 = tu_random(xs[w].shape, xs[w].ndim, NB_F32, -2, 2, 5 + w);
        double *a = grad_with_threads(1, w, x0, idx), *b = grad_with_threads(4, w, x0, idx);
        ck_assert_msg(memcmp(a, b, sizeof(double) * (size_t)nb_numel(x0)) == 0, "case %d", w);
        free(a), free(b);
    }
    nb_set_num_threads(prev);
    nb_scope_end();
}
END_TEST

/* ---- devices -------------------------------------------------------------------------------
 * Every differentiable reduce op backward on the meta device (gradients of the right shape,
 * nothing read) and on the guard device (memory unreadable outside kernels), where the
 * gradient must equal the CPU's exactly (the same kernels run). The backward's initial
 * gradient is passed explicitly, on the output's device. */
#define GUARD_DEV ((nb_device){NB_DEVICE_GUARD, 0})

/* The configurations every device test runs: each op, dims/keepdim, strided or not. */
static int dev_cases(red_ctx *cs) {
    int n = 0;
    const struct { int dims[3], nd; } dl[] = {{{1}, 1}, {{-1}, 1}, {{0, 2}, 2}, {{0}, 0}};
    for (int op = R_SUM; op <= R_LOGSOFTMAX; op++)
        for (int k = 0; k < 4; k++) {
            if (op >= R_MAX && (k == 2 || k == 3)) continue; /* one dim only */
            for (int v = 0; v < 4; v++) {
                if (op >= R_SOFTMAX && (v & 1)) continue;
                red_ctx c = {.op = op, .nd = op >= R_MAX ? 1 : dl[k].nd, .keep = v & 1,
                             .trans = v & 2, .corr = 1};
                memcpy(c.dims, dl[k].dims, sizeof c.dims);
                cs[n++] = c;
            }
        }
    return n;
}

static void case_name(const red_ctx *c, char *buf, size_t n) {
    snprintf(buf, n, "%s dims[0]=%d nd=%d keep=%d trans=%d", rname[c->op], c->dims[0], c->nd,
             c->keep, c->trans);
}

START_TEST(test_meta_backward) {
    nb_scope_begin();
    red_ctx cs[256];
    int n = dev_cases(cs);
    const nb_dtype dts[] = {NB_F32, NB_BF16};
    for (int t = 0; t < 2; t++) {
        for (int i = 0; i < n; i++) {
            char what[96];
            case_name(&cs[i], what, sizeof what);
            nb_scope_begin();
            nb_tensor *x = leaf(nb_empty_on(NB_META, (int64_t[]){3, 4, 5}, 3, dts[t]));
            nb_tensor *y = f_red(&x, 1, &cs[i]);
            ck_assert_msg(y != NULL, "%s: %s", what, nb_last_error());
            ck_assert_msg(nb_requires_grad(y), "%s: no node", what);
            nb_tensor *g = nb_ones_on(NB_META, y->shape, y->ndim, y->dtype);
            nb_backward_opts bo = nb_backward_defaults();
            bo.grad_output = g;
            ck_assert_msg(nb_backward_ex(y, &bo) == NB_OK, "%s: %s", what, nb_last_error());
            nb_tensor *gx = nb_grad(x);
            ck_assert_msg(gx != NULL, "%s: no grad", what);
            ck_assert(nb_tensor_device(gx).type == NB_DEVICE_META);
            ck_assert_msg(gx->dtype == dts[t], "%s: grad dtype %s", what, nb_dtype_name(gx->dtype));
            ck_assert_int_eq(gx->ndim, 3);
            for (int d = 0; d < 3; d++) ck_assert(gx->shape[d] == x->shape[d]);
            nb_scope_end();
        }
    }
    nb_scope_end();
}
END_TEST

START_TEST(test_guard_backward) {
    nb_scope_begin();
    red_ctx cs[256];
    int n = dev_cases(cs);
    const nb_dtype dts[] = {NB_F32, NB_F64, NB_F16};
    for (int t = 0; t < 3; t++) {
        /* (3, 4, 40): the trans cases see it as (4, 3, 40). The reference runs on the CPU
         * whatever the default device (where tu_random makes its tensors). */
        nb_tensor *x0 = nb_to_device(
            tu_random((int64_t[]){3, 4, 40}, 3, dts[t], -2, 2, 31 + (uint64_t)t), NB_CPU);
        for (int i = 0; i < n; i++) {
            char what[96];
            case_name(&cs[i], what, sizeof what);
            nb_scope_begin(); /* few live guard blocks: each kernel call opens all of them */
            nb_tensor *x = leaf(nb_clone(x0)), *xg = leaf(nb_to_device(x0, GUARD_DEV));
            nb_tensor *y = f_red(&x, 1, &cs[i]), *yg = f_red(&xg, 1, &cs[i]);
            ck_assert_msg(y && yg, "%s: %s", what, nb_last_error());
            nb_tensor *g = nb_to_device(tu_random(y->shape, y->ndim, y->dtype, -1, 1, 7),
                                        NB_CPU);
            nb_tensor *gg = nb_to_device(g, GUARD_DEV);
            nb_backward_opts bo = nb_backward_defaults();
            bo.grad_output = g;
            ck_assert(nb_backward_ex(y, &bo) == NB_OK);
            nb_backward_opts bo2 = nb_backward_defaults();
            bo2.grad_output = gg;
            ck_assert_msg(nb_backward_ex(yg, &bo2) == NB_OK, "%s: %s", what, nb_last_error());
            ck_assert(nb_tensor_device(nb_grad(xg)).type == NB_DEVICE_GUARD);
            nb_tensor *a = nb_to_device(nb_grad(xg), NB_CPU);
            ck_assert_msg(a != NULL, "%s: %s", what, nb_last_error());
            ck_assert(a->dtype == nb_grad(x)->dtype);
            double *va = tu_values(a), *vb = tu_values(nb_grad(x));
            for (int64_t k = 0; k < nb_numel(x0); k++)
                ck_assert_msg(va[k] == vb[k] || (isnan(va[k]) && isnan(vb[k])),
                              "%s %s [%lld]: %g vs %g", what, nb_dtype_name(dts[t]),
                              (long long)k, va[k], vb[k]);
            free(va), free(vb);
            nb_scope_end();
        }
    }
    nb_scope_end();
}
END_TEST

/* Backward with the output gradient on another device than the saved tensors fails
 * cleanly, as do indices changed behind autograd's back after max/min. */
START_TEST(test_backward_errors) {
    nb_scope_begin();
    const int ops[] = {R_VAR, R_STD, R_LSE, R_AMAX, R_MAX, R_MIN, R_SOFTMAX, R_LOGSOFTMAX};
    char dev[32];
    nb_device_name(nb_default_device(), dev, sizeof dev);
    for (int i = 0; i < (int)(sizeof ops / sizeof ops[0]); i++) {
        nb_tensor *x = leaf(nb_empty_on(NB_META, (int64_t[]){2, 3}, 2, NB_F32));
        red_ctx c = {.op = ops[i], .dims = {1}, .nd = 1, .corr = 1};
        nb_tensor *y = f_red(&x, 1, &c);
        ck_assert(y != NULL);
        nb_tensor *g = nb_ones(y->shape, y->ndim, y->dtype); /* on the default device */
        nb_backward_opts bo = nb_backward_defaults();
        bo.grad_output = g;
        nb_status st = nb_backward_ex(y, &bo);
        ck_assert_msg(st == NB_EDEVICE, "%s: status %d (%s)", rname[ops[i]], (int)st,
                      nb_last_error());
        ck_assert_msg(strstr(nb_last_error(), dev) && strstr(nb_last_error(), "meta"), "%s: %s",
                      rname[ops[i]], nb_last_error());
    }
    nb_tensor *x = leaf(tu_tensor((double[]){1, 5, 2, 7, 0, 3}, (int64_t[]){2, 3}, 2, NB_F32));
    nb_tensor *idx = NULL, *v = nb_max_dim(x, 1, false, &idx);
    ck_assert(v && idx);
    /* Overwritten in place (nb_copy_ writes on any device, unlike nb_data): the version
     * counter catches it before any rule runs, leaving the graph intact. */
    uint64_t v0 = nb__version_of(idx);
    ck_assert(nb_copy_(nb_slice(idx, 0, 1, 2, 1), nb_scalar(3, NB_I64)) == NB_OK);
    nb_tensor *s = nb_sum(v, NULL, 0, false);
    ASSERT_ST(nb_backward(s), NB_EINVAL, "a tensor saved by max was modified in place");
    /* A write the counter cannot see (as through nb_data): the rule still checks the index
     * before using it. */
    atomic_store(&idx->storage->version, v0);
    ck_assert(nb_backward(s) == NB_EINDEX);
    ck_assert_msg(strstr(nb_last_error(), "index 3 is out of range"), "%s", nb_last_error());
    nb_scope_end();
}
END_TEST

Suite *nb_suite_grad_reduce(void) {
    Suite *s = suite_create("grad_reduce");
    TCase *tc = tcase_create("rules");
    tcase_add_test(tc, test_reductions);
    tcase_add_test(tc, test_max_min_softmax);
    tcase_add_test(tc, test_ties);
    tcase_add_test(tc, test_softmax_kernels);
    tcase_add_test(tc, test_matmul);
    tcase_add_test(tc, test_indexing);
    tcase_add_test(tc, test_index_exact);
    tcase_add_test(tc, test_join);
    tcase_add_test(tc, test_dtypes_agree);
    tcase_add_test(tc, test_one_node);
    tcase_add_test(tc, test_no_alloc_steady);
    tcase_add_test(tc, test_thread_independent);
    tcase_add_test(tc, test_meta_backward);
    tcase_add_test(tc, test_guard_backward);
    tcase_add_test(tc, test_backward_errors);
    suite_add_tcase(s, tc);
    return s;
}
