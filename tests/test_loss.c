/* test_loss.c - the "loss" suite: cross entropy, NLL, MSE, L1 and BCE with logits, each
 * checked (values and gradients) against plain double-precision reference loops over a
 * table of layouts ((N, C), (N, C, d1), (N, C, d1, d2), (C), empty batches, rows longer
 * than a kernel block, maps wider than a column block), dtypes, target dtypes, reductions,
 * ignore_index (including every target ignored) and label smoothing; large logits; central
 * difference gradient checks; f32 against f64 backward; non-contiguous inputs; thread-count
 * determinism; and every class of user error, without leaks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static const nb_dtype float_dtypes[] = {NB_F32, NB_F64, NB_F16, NB_BF16};
static const nb_reduction reductions[] = {NB_REDUCTION_MEAN, NB_REDUCTION_SUM,
                                          NB_REDUCTION_NONE};
#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- reference class-index losses ----------------------------------------------------------- */
typedef struct geom {
    int64_t N, C, D;
} geom;

static geom geom_of(const int64_t *s, int nd) {
    geom g = {1, s[nd == 1 ? 0 : 1], 1};
    if (nd > 1) g.N = s[0];
    for (int d = 2; d < nd; d++) g.D *= s[d];
    return g;
}

/* The target shape of scores of shape s (s without the class dim). */
static int target_shape(const int64_t *s, int nd, int64_t *ts) {
    int n = 0;
    for (int d = 0; d < nd; d++)
        if (d != (nd == 1 ? 0 : 1)) ts[n++] = s[d];
    return n;
}

static bool ref_ignored(const nb_cross_entropy_opts *o, int64_t t) {
    return o->has_ignore_index && t == o->ignore_index;
}

static double ref_lse(const double *x, geom g, int64_t n, int64_t d) {
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < g.C; c++) m = fmax(m, x[(n * g.C + c) * g.D + d]);
    for (int64_t c = 0; c < g.C; c++) s += exp(x[(n * g.C + c) * g.D + d] - m);
    return m + log(s);
}

/* Per-position losses (0 where ignored); returns the number of counted positions. */
static int64_t ref_cls_loss(const double *x, const int64_t *t, geom g,
                            const nb_cross_entropy_opts *o, bool ce, double *loss) {
    int64_t cnt = 0;
    for (int64_t n = 0; n < g.N; n++)
        for (int64_t d = 0; d < g.D; d++) {
            int64_t p = n * g.D + d, tt = t[p];
            loss[p] = 0;
            if (ref_ignored(o, tt)) continue;
            cnt++;
            if (!ce) {
                loss[p] = -x[(n * g.C + tt) * g.D + d];
                continue;
            }
            double l = ref_lse(x, g, n, d), eps = o->label_smoothing, smooth = 0;
            for (int64_t c = 0; c < g.C; c++) smooth += l - x[(n * g.C + c) * g.D + d];
            loss[p] = (1 - eps) * (l - x[(n * g.C + tt) * g.D + d]);
            if (eps > 0) loss[p] += eps * smooth / (double)g.C;
        }
    return cnt;
}

/* d(sum_p w[p] loss[p]) / dx. */
static void ref_cls_grad(const double *x, const int64_t *t, geom g,
                         const nb_cross_entropy_opts *o, bool ce, const double *w,
                         double *grad) {
    for (int64_t n = 0; n < g.N; n++)
        for (int64_t d = 0; d < g.D; d++) {
            int64_t p = n * g.D + d, tt = t[p];
            bool ig = ref_ignored(o, tt);
            double l = ig || !ce ? 0 : ref_lse(x, g, n, d), eps = o->label_smoothing;
            for (int64_t c = 0; c < g.C; c++) {
                int64_t i = (n * g.C + c) * g.D + d;
                if (ig) grad[i] = 0;
                else if (!ce) grad[i] = c == tt ? -w[p] : 0;
                else grad[i] = w[p] * (exp(x[i] - l) - eps / (double)g.C - (c == tt ? 1 - eps : 0));
            }
        }
}

/* Reduce per-position losses as the op does; returns the number of output values. */
static int64_t ref_reduce(const double *loss, int64_t P, int64_t cnt, nb_reduction r,
                          double *out) {
    if (r == NB_REDUCTION_NONE) {
        memcpy(out, loss, sizeof(double) * (size_t)P);
        return P;
    }
    double s = 0;
    for (int64_t p = 0; p < P; p++) s += loss[p];
    out[0] = r == NB_REDUCTION_SUM ? s : s / (double)cnt;
    return 1;
}

/* Gradient weights per position for reduction r (g: the upstream gradient of NONE). */
static void ref_weights(nb_reduction r, int64_t P, int64_t cnt, const double *g, double *w) {
    for (int64_t p = 0; p < P; p++)
        w[p] = r == NB_REDUCTION_NONE ? g[p]
               : r == NB_REDUCTION_SUM ? 1
                                        : (cnt ? 1.0 / (double)cnt : 0);
}

/* Random targets in [0, C) (seeded), with every third position set to ignore when
 * has_ignore_index and ignore_index is not a class. */
static void make_targets(int64_t *t, int64_t P, int64_t C, const nb_cross_entropy_opts *o,
                         uint64_t seed) {
    double *u = malloc(sizeof(double) * (size_t)(P ? P : 1));
    tu_fill_uniform(u, P, 0, (double)C, seed);
    for (int64_t p = 0; p < P; p++) {
        t[p] = (int64_t)u[p];
        if (o->has_ignore_index && (o->ignore_index < 0 || o->ignore_index >= C) && p % 3 == 1)
            t[p] = o->ignore_index;
    }
    free(u);
}

static nb_tensor *target_tensor(const int64_t *t, const int64_t *shape, int nd, nb_dtype dt) {
    int64_t P = tu_numel(shape, nd);
    double *v = malloc(sizeof(double) * (size_t)(P ? P : 1));
    for (int64_t p = 0; p < P; p++) v[p] = (double)t[p];
    nb_tensor *r = tu_tensor(v, shape, nd, dt);
    free(v);
    return r;
}

/* Forward (every reduction) and backward of cross_entropy (ce) or nll_loss on scores of
 * shape xs and dtype dt against the references. xin: the scores to use (NULL: random). */
static void check_cls(bool ce, const int64_t *xs, int xnd, nb_dtype dt, nb_dtype tdt,
                      nb_cross_entropy_opts o, nb_tensor *xin, const int64_t *tin,
                      uint64_t seed) {
    nb_scope_begin();
    geom g = geom_of(xs, xnd);
    int64_t ts[NB_MAX_DIMS];
    int tnd = target_shape(xs, xnd, ts);
    int64_t P = g.N * g.D, X = P * g.C;
    nb_tensor *x = xin ? xin : tu_random(xs, xnd, dt, -3, 3, seed);
    ck_assert(nb_set_requires_grad(x, true) == NB_OK);
    double *xv = tu_values(x);
    int64_t *tv = malloc(sizeof(int64_t) * (size_t)(P ? P : 1));
    if (tin) memcpy(tv, tin, sizeof(int64_t) * (size_t)P);
    else make_targets(tv, P, g.C, &o, seed + 1);
    nb_tensor *t = target_tensor(tv, ts, tnd, tdt);
    double *loss = malloc(sizeof(double) * (size_t)(P ? P : 1));
    double *ref = malloc(sizeof(double) * (size_t)(P ? P : 1));
    double *w = malloc(sizeof(double) * (size_t)(P ? P : 1));
    double *gref = malloc(sizeof(double) * (size_t)(X ? X : 1));
    int64_t cnt = ref_cls_loss(xv, tv, g, &o, ce, loss);
    double tol = tu_tol(dt) * 4;
    for (int ri = 0; ri < NELEM(reductions); ri++) {
        o.reduction = reductions[ri];
        nb_tensor *y = ce ? nb_cross_entropy(x, t, &o) : nb_nll_loss(x, t, &o);
        ck_assert_msg(y != NULL, "%s", nb_last_error());
        ck_assert_int_eq(nb_tensor_dtype(y), dt);
        ref_reduce(loss, P, cnt, o.reduction, ref);
        if (o.reduction == NB_REDUCTION_NONE) tu_assert_close(y, ref, ts, tnd, tol);
        else tu_assert_close(y, ref, NULL, 0, tol);
        /* backward */
        nb_tensor *gout = NULL;
        double *gv = NULL;
        if (o.reduction == NB_REDUCTION_NONE) {
            gout = tu_random(ts, tnd, dt, 0.5, 1.5, seed + 7);
            gv = tu_values(gout);
        }
        nb_backward_opts bo = nb_backward_defaults();
        bo.grad_output = gout;
        ck_assert_msg(nb_backward_ex(y, &bo) == NB_OK, "%s", nb_last_error());
        ref_weights(o.reduction, P, cnt, gv, w);
        ref_cls_grad(xv, tv, g, &o, ce, w, gref);
        nb_tensor *gx = nb_grad(x);
        ck_assert(gx != NULL);
        ck_assert_int_eq(nb_tensor_dtype(gx), dt);
        tu_assert_close(gx, gref, xs, xnd, tol);
        nb_clear_grad(x);
        free(gv);
    }
    free(xv), free(tv), free(loss), free(ref), free(w), free(gref);
    nb_scope_end();
}

typedef struct layout {
    int nd;
    int64_t s[4];
} layout;

static const layout cls_layouts[] = {
    {2, {5, 7}},      {3, {3, 4, 5}},  {4, {2, 3, 2, 3}}, {1, {6}},
    {2, {0, 4}},      {3, {2, 3, 70}}, /* D > one column block */
    {2, {3, 600}},    /* C > one row block */
    {2, {4, 1}},      /* one class */
};

static nb_cross_entropy_opts cls_opts(int i) {
    nb_cross_entropy_opts o = nb_cross_entropy_defaults(); /* mean, ignore_index -100 off */
    o.has_ignore_index = i == 1 || i == 2 || i == 4;
    if (i == 2) o.ignore_index = 1;
    o.label_smoothing = i == 3 || i == 4 ? 0.1 : i > 4 ? 1.0 : 0;
    return o;
}

START_TEST(test_cross_entropy) {
    int k = 0;
    for (int li = 0; li < NELEM(cls_layouts); li++)
        for (int di = 0; di < NELEM(float_dtypes); di++)
            for (int oi = 0; oi < 6; oi++, k++)
                check_cls(true, cls_layouts[li].s, cls_layouts[li].nd, float_dtypes[di],
                          k % 2 ? NB_I32 : NB_I64, cls_opts(oi), NULL, NULL, (uint64_t)k);
}
END_TEST

START_TEST(test_nll_loss) {
    int k = 0;
    for (int li = 0; li < NELEM(cls_layouts); li++)
        for (int di = 0; di < NELEM(float_dtypes); di++)
            for (int oi = 0; oi < 3; oi++, k++)
                check_cls(false, cls_layouts[li].s, cls_layouts[li].nd, float_dtypes[di],
                          k % 2 ? NB_I32 : NB_I64, cls_opts(oi), NULL, NULL, (uint64_t)k + 99);
}
END_TEST

/* Every target ignored: mean is NaN (0 / 0, as PyTorch), sum 0, none zeros; gradients 0. */
START_TEST(test_cls_all_ignored) {
    nb_scope_begin();
    for (int ce = 0; ce < 2; ce++)
        for (int di = 0; di < 2; di++) {
            nb_tensor *x = tu_random((int64_t[]){3, 4}, 2, float_dtypes[di], -2, 2, 5);
            ck_assert(nb_set_requires_grad(x, true) == NB_OK);
            nb_tensor *t = nb_full((int64_t[]){3}, 1, NB_I64, -100);
            nb_cross_entropy_opts o = nb_cross_entropy_defaults();
            o.has_ignore_index = true, o.ignore_index = -100, o.label_smoothing = ce ? 0.1 : 0;
            const double zeros[12] = {0};
            for (int ri = 0; ri < 3; ri++) {
                o.reduction = reductions[ri];
                nb_tensor *y = ce ? nb_cross_entropy(x, t, &o) : nb_nll_loss(x, t, &o);
                ck_assert_msg(y != NULL, "%s", nb_last_error());
                if (o.reduction == NB_REDUCTION_MEAN) ck_assert(isnan(nb_item_f64(y)));
                else tu_assert_close(y, zeros, (int64_t[]){3}, o.reduction == NB_REDUCTION_NONE ? 1 : 0, 0);
                nb_backward_opts bo = nb_backward_defaults();
                bo.grad_output = o.reduction == NB_REDUCTION_NONE
                                     ? nb_ones((int64_t[]){3}, 1, float_dtypes[di])
                                     : NULL;
                nb_backward_ex(y, &bo);
                tu_assert_close(nb_grad(x), zeros, ((int64_t[]){3, 4}), 2, 0);
                nb_clear_grad(x);
            }
        }
    nb_scope_end();
}
END_TEST

/* Logits of +-1000 stay finite (the log-sum-exp is shifted by the row max). */
START_TEST(test_cls_large_logits) {
    static const double xv[] = {1000, -1000, 0, 5, -1000, -1000, -1000, -1000,
                                1000, 1000, -1000, 0};
    static const int64_t tv[] = {1, 2, 0};
    for (int di = 0; di < 2; di++)
        for (int oi = 0; oi < 4; oi += 3) {
            nb_scope_begin();
            nb_tensor *x = tu_tensor(xv, (int64_t[]){3, 4}, 2, float_dtypes[di]);
            check_cls(true, (int64_t[]){3, 4}, 2, float_dtypes[di], NB_I64, cls_opts(oi), x, tv,
                      1);
            nb_cross_entropy_opts ceo = nb_cross_entropy_defaults();
            ceo.reduction = NB_REDUCTION_NONE;
            nb_tensor *y = nb_cross_entropy(
                x, tu_tensor((double[]){1, 2, 0}, (int64_t[]){3}, 1, NB_I64), &ceo);
            double *v = tu_values(y);
            /* 2000: lse 1000 minus -1000; log(4); log(2) */
            ck_assert(fabs(v[0] - 2000) < 1e-3 && fabs(v[1] - log(4)) < 1e-5 &&
                      fabs(v[2] - log(2)) < 1e-5);
            free(v);
            nb_scope_end();
        }
    /* (N, C, d) layout too */
    nb_scope_begin();
    nb_tensor *x = tu_tensor(xv, (int64_t[]){1, 4, 3}, 3, NB_F32);
    check_cls(true, (int64_t[]){1, 4, 3}, 3, NB_F32, NB_I32, cls_opts(3), x, tv, 2);
    nb_scope_end();
}
END_TEST

/* ---- gradient checks ------------------------------------------------------------------------ */
typedef struct cls_ctx {
    nb_cross_entropy_opts o;
    bool ce, transpose;
} cls_ctx;

static nb_tensor *f_cls(nb_tensor *const *in, int n, void *ctx) {
    (void)n;
    const cls_ctx *c = ctx;
    nb_tensor *x = c->transpose ? nb_transpose(in[0], 0, 1) : in[0];
    return c->ce ? nb_cross_entropy(x, in[1], &c->o) : nb_nll_loss(x, in[1], &c->o);
}

static void gradcheck_cls(bool ce, const int64_t *xs, int xnd, nb_cross_entropy_opts o,
                          bool transpose, uint64_t seed) {
    nb_scope_begin();
    int64_t ts[NB_MAX_DIMS], ss[NB_MAX_DIMS];
    int tnd = target_shape(xs, xnd, ts);
    memcpy(ss, xs, sizeof(int64_t) * (size_t)xnd);
    if (transpose) ss[0] = xs[1], ss[1] = xs[0];
    geom g = geom_of(xs, xnd);
    int64_t P = g.N * g.D, tv[64];
    make_targets(tv, P, g.C, &o, seed);
    nb_tensor *x = tu_random(ss, xnd, NB_F64, -2, 2, seed + 1);
    ck_assert(nb_set_requires_grad(x, true) == NB_OK);
    nb_tensor *in[2] = {x, target_tensor(tv, ts, tnd, NB_I64)};
    cls_ctx c = {o, ce, transpose};
    ck_assert_msg(nb_gradcheck(f_cls, in, 2, &c, NULL) == NB_OK, "%s", nb_last_error());
    nb_scope_end();
}

START_TEST(test_gradcheck_cls) {
    for (int ri = 0; ri < 3; ri++) {
        nb_cross_entropy_opts o = cls_opts(4);
        o.reduction = reductions[ri];
        gradcheck_cls(true, (int64_t[]){3, 4}, 2, o, false, 1);
        gradcheck_cls(true, (int64_t[]){3, 4}, 2, cls_opts(0), true, 2); /* non-contiguous */
        gradcheck_cls(true, (int64_t[]){2, 3, 2}, 3, o, false, 3);
        nb_cross_entropy_opts plain = cls_opts(0);
        plain.reduction = reductions[ri];
        gradcheck_cls(false, (int64_t[]){3, 4}, 2, plain, false, 4);
        gradcheck_cls(false, (int64_t[]){2, 3, 2}, 3, cls_opts(1), false, 5);
    }
}
END_TEST

/* f32 backward against the f64 one on the same values. */
START_TEST(test_cls_f32_vs_f64) {
    nb_scope_begin();
    int64_t xs[] = {6, 9}, tv[6];
    nb_cross_entropy_opts o = cls_opts(4);
    make_targets(tv, 6, 9, &o, 3);
    nb_tensor *t = target_tensor(tv, (int64_t[]){6}, 1, NB_I64);
    nb_tensor *x32 = tu_random(xs, 2, NB_F32, -4, 4, 9);
    nb_tensor *x64 = nb_to_dtype(x32, NB_F64);
    nb_set_requires_grad(x32, true);
    nb_set_requires_grad(x64, true);
    ck_assert(nb_backward(nb_cross_entropy(x32, t, &o)) == NB_OK);
    ck_assert(nb_backward(nb_cross_entropy(x64, t, &o)) == NB_OK);
    double *g64 = tu_values(nb_grad(x64));
    tu_assert_close(nb_grad(x32), g64, xs, 2, 1e-6);
    free(g64);
    nb_scope_end();
}
END_TEST

/* A non-contiguous (transposed) input gives the same loss and gradient as a contiguous one. */
START_TEST(test_cls_noncontig) {
    static const layout ls[] = {{2, {5, 7}}, {3, {2, 3, 4}}};
    for (int li = 0; li < 2; li++)
        for (int di = 0; di < 2; di++) {
            nb_scope_begin();
            nb_tensor *x = tu_noncontig(tu_random(ls[li].s, ls[li].nd, float_dtypes[di], -3, 3, 4));
            ck_assert(!nb_is_contiguous(x));
            check_cls(true, ls[li].s, ls[li].nd, float_dtypes[di], NB_I64, cls_opts(4), x, NULL,
                      11);
            check_cls(false, ls[li].s, ls[li].nd, float_dtypes[di], NB_I32, cls_opts(1), x, NULL,
                      12);
            nb_scope_end();
        }
}
END_TEST

/* Same bits with 1 thread and with several (rows big enough to be split). */
START_TEST(test_cls_threads) {
    nb_scope_begin();
    int64_t xs[] = {64, 1200}, tv[64];
    nb_cross_entropy_opts o = cls_opts(4);
    make_targets(tv, 64, 1200, &o, 8);
    nb_tensor *t = target_tensor(tv, (int64_t[]){64}, 1, NB_I64);
    nb_tensor *x = tu_random(xs, 2, NB_F32, -5, 5, 8);
    nb_set_requires_grad(x, true);
    int saved = nb_get_num_threads();
    double l[2];
    float *gr[2];
    for (int r = 0; r < 2; r++) {
        nb_set_num_threads(r ? 4 : 1);
        nb_tensor *y = nb_cross_entropy(x, t, &o);
        l[r] = nb_item_f64(y);
        ck_assert(nb_backward(y) == NB_OK);
        gr[r] = malloc(sizeof(float) * 64 * 1200);
        ck_assert(nb_read(nb_grad(x), gr[r], 64 * 1200, NB_F32) == NB_OK);
        nb_clear_grad(x);
    }
    nb_set_num_threads(saved);
    ck_assert(l[0] == l[1]);
    ck_assert(memcmp(gr[0], gr[1], sizeof(float) * 64 * 1200) == 0);
    free(gr[0]), free(gr[1]);
    nb_scope_end();
}
END_TEST

/* ---- MSE and L1 --------------------------------------------------------------------------- */
static void check_pointwise(bool l1, const int64_t *s, int nd, nb_dtype dt, uint64_t seed) {
    nb_scope_begin();
    int64_t n = tu_numel(s, nd);
    nb_tensor *p = tu_random(s, nd, dt, -2, 2, seed), *t = tu_random(s, nd, dt, -2, 2, seed + 1);
    if (n > 1) { /* make one pair equal: l1's gradient there is sign(0) = 0 */
        NB_NO_GRAD_BEGIN
        nb_copy_(nb_narrow(nb_flatten(p, 0, -1), 0, 0, 1), nb_narrow(nb_flatten(t, 0, -1), 0, 0, 1));
        NB_NO_GRAD_END
    }
    ck_assert(nb_set_requires_grad(p, true) == NB_OK);
    ck_assert(nb_set_requires_grad(t, true) == NB_OK);
    double *pv = tu_values(p), *tv = tu_values(t);
    double *e = malloc(sizeof(double) * (size_t)(n ? n : 1));
    double *gp = malloc(sizeof(double) * (size_t)(n ? n : 1));
    double *gt = malloc(sizeof(double) * (size_t)(n ? n : 1));
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = pv[i] - tv[i];
        e[i] = l1 ? fabs(d) : d * d;
        sum += e[i];
    }
    for (int ri = 0; ri < 3; ri++) {
        nb_reduction r = reductions[ri];
        nb_tensor *y = l1 ? nb_l1_loss(p, t, r) : nb_mse_loss(p, t, r);
        ck_assert_msg(y != NULL, "%s", nb_last_error());
        double red = r == NB_REDUCTION_SUM ? sum : sum / (double)n;
        if (r == NB_REDUCTION_NONE) tu_assert_close(y, e, s, nd, tu_tol(dt) * 4);
        else tu_assert_close(y, &red, NULL, 0, tu_tol(dt) * 4);
        nb_tensor *gout = r == NB_REDUCTION_NONE ? tu_random(s, nd, dt, 0.5, 1.5, seed + 2) : NULL;
        double *gv = gout ? tu_values(gout) : NULL;
        nb_backward_opts bo = nb_backward_defaults();
        bo.grad_output = gout;
        nb_status st = nb_backward_ex(y, &bo);
        ck_assert_msg(st == NB_OK, "%s", nb_last_error());
        for (int64_t i = 0; i < n; i++) {
            double w = gv ? gv[i] : r == NB_REDUCTION_SUM ? 1 : 1.0 / (double)n;
            double d = pv[i] - tv[i];
            gp[i] = w * (l1 ? (d > 0) - (d < 0) : 2 * d);
            gt[i] = -gp[i];
        }
        tu_assert_close(nb_grad(p), gp, s, nd, tu_tol(dt) * 4);
        tu_assert_close(nb_grad(t), gt, s, nd, tu_tol(dt) * 4);
        nb_clear_grad(p);
        nb_clear_grad(t);
        free(gv);
    }
    free(pv), free(tv), free(e), free(gp), free(gt);
    nb_scope_end();
}

static const layout pw_layouts[] = {{2, {3, 4}}, {1, {5}}, {0, {0}}, {2, {0, 3}}, {3, {2, 3, 2}}};

START_TEST(test_mse_l1) {
    int k = 0;
    for (int l1 = 0; l1 < 2; l1++)
        for (int li = 0; li < NELEM(pw_layouts); li++)
            for (int di = 0; di < NELEM(float_dtypes); di++, k++)
                check_pointwise(l1, pw_layouts[li].s, pw_layouts[li].nd, float_dtypes[di],
                                (uint64_t)k);
}
END_TEST

typedef struct red_ctx {
    nb_reduction r;
    int which; /* 0 mse, 1 l1, 2 bce */
    bool transpose;
} red_ctx;

static nb_tensor *f_pointwise(nb_tensor *const *in, int n, void *ctx) {
    const red_ctx *c = ctx;
    nb_tensor *a = c->transpose ? nb_transpose(in[0], 0, 1) : in[0];
    if (c->which == 0) return nb_mse_loss(a, in[1], c->r);
    if (c->which == 1) return nb_l1_loss(a, in[1], c->r);
    return nb_bce_with_logits(a, in[1], n > 2 ? in[2] : NULL, c->r);
}

START_TEST(test_gradcheck_pointwise) {
    for (int ri = 0; ri < 3; ri++)
        for (int which = 0; which < 3; which++) {
            nb_scope_begin();
            red_ctx c = {reductions[ri], which, ri == 1};
            nb_tensor *a = tu_random((int64_t[]){3, 2}, 2, NB_F64, -2, 2, 1);
            nb_tensor *b = tu_random((int64_t[]){2, 3}, 2, NB_F64, which == 2 ? 0 : -2, which == 2 ? 1 : 2, 2);
            nb_tensor *pw = tu_random((int64_t[]){3}, 1, NB_F64, 0.5, 3, 3);
            if (!c.transpose) a = nb_reshape(a, (int64_t[]){2, 3}, 2);
            nb_set_requires_grad(a, true);
            nb_set_requires_grad(b, true);
            nb_set_requires_grad(pw, true);
            nb_tensor *in[3] = {a, b, pw};
            ck_assert_msg(nb_gradcheck(f_pointwise, in, which == 2 ? 3 : 2, &c, NULL) == NB_OK,
                          "%s", nb_last_error());
            if (which == 2) /* without pos_weight */
                ck_assert_msg(nb_gradcheck(f_pointwise, in, 2, &c, NULL) == NB_OK, "%s",
                              nb_last_error());
            nb_scope_end();
        }
}
END_TEST

/* ---- BCE with logits ---------------------------------------------------------------------- */
/* The textbook form -[pw y log s + (1 - y) log(1 - s)], s = sigmoid(x), and its
 * derivatives: a reference independent of the kernel's stable formula (for moderate x). */
static double sigm(double x) { return 1 / (1 + exp(-x)); }
static double bce_naive(double x, double y, double pw) {
    return -(pw * y * log(sigm(x)) + (1 - y) * log(1 - sigm(x)));
}

/* x of shape s, pw of shape ps (pnd < 0: no pos_weight). */
static void check_bce(const int64_t *s, int nd, const int64_t *ps, int pnd, nb_dtype dt,
                      uint64_t seed) {
    nb_scope_begin();
    int64_t n = tu_numel(s, nd), idx[NB_MAX_DIMS];
    nb_tensor *x = tu_random(s, nd, dt, -4, 4, seed), *y = tu_random(s, nd, dt, 0, 1, seed + 1);
    nb_tensor *pw = pnd >= 0 ? tu_random(ps, pnd, dt, 0.5, 3, seed + 2) : NULL;
    nb_set_requires_grad(x, true);
    nb_set_requires_grad(y, true);
    if (pw) nb_set_requires_grad(pw, true);
    double *xv = tu_values(x), *yv = tu_values(y), *pv = pw ? tu_values(pw) : NULL;
    int64_t pn = pw ? nb_numel(pw) : 1;
    double *w = malloc(sizeof(double) * (size_t)(n ? n : 1));
    int64_t *pi = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    double *l = malloc(sizeof(double) * (size_t)(n ? n : 1));
    double *gx = malloc(sizeof(double) * (size_t)(n ? n : 1));
    double *gy = malloc(sizeof(double) * (size_t)(n ? n : 1));
    double *gp = calloc((size_t)pn, sizeof(double));
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        /* the pos_weight element broadcast to element i */
        tu_unravel(i, s, nd, idx);
        int64_t j = 0;
        for (int d = 0; d < pnd; d++) j = j * ps[d] + (ps[d] == 1 ? 0 : idx[nd - pnd + d]);
        pi[i] = j;
        w[i] = pv ? pv[j] : 1;
        l[i] = bce_naive(xv[i], yv[i], w[i]);
        sum += l[i];
    }
    double tol = tu_tol(dt) * 8;
    for (int ri = 0; ri < 3; ri++) {
        nb_reduction r = reductions[ri];
        nb_tensor *out = nb_bce_with_logits(x, y, pw, r);
        ck_assert_msg(out != NULL, "%s", nb_last_error());
        ck_assert_int_eq(nb_tensor_dtype(out), dt);
        double red = r == NB_REDUCTION_SUM ? sum : sum / (double)n;
        if (r == NB_REDUCTION_NONE) tu_assert_close(out, l, s, nd, tol);
        else tu_assert_close(out, &red, NULL, 0, tol);
        nb_tensor *gout = r == NB_REDUCTION_NONE ? tu_random(s, nd, dt, 0.5, 1.5, seed + 3) : NULL;
        double *gv = gout ? tu_values(gout) : NULL;
        nb_backward_opts bo = nb_backward_defaults();
        bo.grad_output = gout;
        ck_assert_msg(nb_backward_ex(out, &bo) == NB_OK, "%s", nb_last_error());
        memset(gp, 0, sizeof(double) * (size_t)pn);
        for (int64_t i = 0; i < n; i++) {
            double G = gv ? gv[i] : r == NB_REDUCTION_SUM ? 1 : 1.0 / (double)n;
            double sg = sigm(xv[i]);
            gx[i] = G * (sg * (1 - yv[i] + w[i] * yv[i]) - w[i] * yv[i]);
            gy[i] = G * (-w[i] * log(sg) + log(1 - sg));
            gp[pi[i]] += G * -yv[i] * log(sg);
        }
        tu_assert_close(nb_grad(x), gx, s, nd, tol);
        tu_assert_close(nb_grad(y), gy, s, nd, tol);
        if (pw) tu_assert_close(nb_grad(pw), gp, ps, pnd, tol * 4);
        nb_clear_grad(x);
        nb_clear_grad(y);
        if (pw) nb_clear_grad(pw);
        free(gv);
    }
    free(xv), free(yv), free(pv), free(w), free(pi), free(l), free(gx), free(gy), free(gp);
    nb_scope_end();
}

START_TEST(test_bce_with_logits) {
    static const struct {
        layout x, pw; /* pw.nd < 0: none */
    } cases[] = {
        {{2, {3, 4}}, {-1, {0}}}, {{2, {3, 4}}, {1, {4}}},      {{1, {5}}, {1, {1}}},
        {{0, {0}}, {-1, {0}}},    {{2, {0, 3}}, {1, {3}}},      {{3, {2, 3, 5}}, {2, {1, 5}}},
        {{3, {2, 3, 5}}, {2, {3, 1}}}, /* not along the last dim: the general path */
        {{3, {2, 3, 5}}, {0, {0}}},
    };
    int k = 0;
    for (int ci = 0; ci < NELEM(cases); ci++)
        for (int di = 0; di < NELEM(float_dtypes); di++, k++)
            check_bce(cases[ci].x.s, cases[ci].x.nd, cases[ci].pw.s, cases[ci].pw.nd,
                      float_dtypes[di], (uint64_t)k);
}
END_TEST

START_TEST(test_bce_large_logits) {
    nb_scope_begin();
    static const double xv[] = {1000, 1000, -1000, -1000, 1000, -1000};
    static const double yv[] = {0, 1, 1, 0, 0.5, 1};
    for (int di = 0; di < 2; di++) {
        nb_tensor *x = tu_tensor(xv, (int64_t[]){6}, 1, float_dtypes[di]);
        nb_tensor *y = tu_tensor(yv, (int64_t[]){6}, 1, float_dtypes[di]);
        nb_set_requires_grad(x, true);
        nb_tensor *l = nb_bce_with_logits(x, y, NULL, NB_REDUCTION_NONE);
        tu_assert_close(l, ((double[]){1000, 0, 1000, 0, 500, 1000}), ((int64_t[]){6}), 1, 1e-6);
        nb_tensor *pw = nb_full((int64_t[]){1}, 1, float_dtypes[di], 2);
        l = nb_bce_with_logits(x, y, pw, NB_REDUCTION_SUM);
        tu_assert_close(l, ((double[]){1000 + 0 + 2000 + 0 + 500 + 2000}), NULL, 0, 1e-6);
        ck_assert(nb_backward(l) == NB_OK);
        /* dx = sigmoid(x) (1 - y + pw y) - pw y */
        tu_assert_close(nb_grad(x), ((double[]){1, 0, -2, 0, 0.5, -2}), ((int64_t[]){6}), 1, 1e-6);
    }
    nb_scope_end();
}
END_TEST

/* ---- errors ------------------------------------------------------------------------------ */
START_TEST(test_loss_errors) {
    nb_alloc_stats before, after;
    nb_clear_error(); /* NULL inputs keep a pending error: start from none */
    nb_alloc_get_stats(&before);
    nb_scope_begin();
    nb_tensor *x = tu_random((int64_t[]){4, 10}, 2, NB_F32, -1, 1, 1);
    nb_tensor *t = tu_tensor((double[]){1, 2, 3, 4}, (int64_t[]){4}, 1, NB_I64);
    nb_tensor *t12 = tu_tensor((double[]){1, 12, 3, 4}, (int64_t[]){4}, 1, NB_I64);
    nb_tensor *tneg = tu_tensor((double[]){1, -1, 3, 4}, (int64_t[]){4}, 1, NB_I32);
    nb_tensor *t100 = tu_tensor((double[]){1, -100, 3, 4}, (int64_t[]){4}, 1, NB_I64);
    nb_set_requires_grad(x, true);
    /* NULL inputs */
    tu_assert_error(nb_cross_entropy(NULL, t, NULL), NB_ENULL, "cross_entropy");
    tu_assert_error(nb_cross_entropy(x, NULL, NULL), NB_ENULL, "cross_entropy");
    tu_assert_error(nb_nll_loss(NULL, t, NULL), NB_ENULL, "nll_loss");
    tu_assert_error(nb_mse_loss(NULL, x, 0), NB_ENULL, "mse_loss");
    tu_assert_error(nb_l1_loss(x, NULL, 0), NB_ENULL, "l1_loss");
    tu_assert_error(nb_bce_with_logits(NULL, x, NULL, 0), NB_ENULL, "bce_with_logits");
    tu_assert_error(nb_bce_with_logits(x, NULL, NULL, 0), NB_ENULL, "bce_with_logits");
    /* target shape */
    tu_assert_error(nb_cross_entropy(x, tu_tensor((double[]){1, 2, 3}, (int64_t[]){3}, 1, NB_I64),
                                     NULL),
                    NB_ESHAPE, "cross_entropy: target shape [3] does not match input shape [4,10]");
    tu_assert_error(nb_cross_entropy(x, nb_zeros((int64_t[]){4, 1}, 2, NB_I64), NULL), NB_ESHAPE,
                    "target shape");
    tu_assert_error(nb_cross_entropy(nb_zeros((int64_t[]){2, 3, 4}, 3, NB_F32),
                                     nb_zeros((int64_t[]){2, 3}, 2, NB_I64), NULL),
                    NB_ESHAPE, "expected target shape [2,4]");
    tu_assert_error(nb_cross_entropy(nb_scalar(1, NB_F32), nb_scalar(0, NB_I64), NULL),
                    NB_ESHAPE, "class dim");
    tu_assert_error(nb_nll_loss(x, nb_zeros((int64_t[]){5}, 1, NB_I64), NULL), NB_ESHAPE,
                    "nll_loss: target shape");
    /* out-of-range targets: found before anything is computed on the CPU; on CUDA by the
     * kernel, which reports them, with the CPU's words, at the read of the loss */
    tu_assert_index_error(nb_cross_entropy(x, t12, NULL), NB_EINDEX,
                          "cross_entropy: target 12 is out of range for 10 classes");
    tu_assert_index_error(nb_cross_entropy(x, tneg, NULL), NB_EINDEX,
                          "cross_entropy: target -1 is out of range for 10 classes");
    tu_assert_index_error(nb_cross_entropy(x, t100, NULL), NB_EINDEX,
                          "target -100 is out of range");
    nb_cross_entropy_opts ceo = nb_cross_entropy_defaults();
    ceo.has_ignore_index = true, ceo.ignore_index = -1;
    tu_assert_index_error(nb_cross_entropy(x, t100, &ceo), NB_EINDEX, "target -100");
    tu_assert_index_error(nb_nll_loss(x, t12, NULL), NB_EINDEX,
                          "nll_loss: target 12 is out of range for 10 classes");
    /* dtypes */
    tu_assert_error(nb_cross_entropy(x, nb_zeros((int64_t[]){4}, 1, NB_F32), NULL), NB_EDTYPE,
                    "i32 or i64, got f32");
    tu_assert_error(nb_cross_entropy(x, nb_zeros((int64_t[]){4}, 1, NB_U8), NULL), NB_EDTYPE,
                    "got u8");
    tu_assert_error(nb_cross_entropy(nb_zeros((int64_t[]){4, 10}, 2, NB_I64), t, NULL),
                    NB_EDTYPE, "floating point");
    tu_assert_error(nb_nll_loss(x, nb_zeros((int64_t[]){4}, 1, NB_BOOL), NULL), NB_EDTYPE,
                    "nll_loss: target");
    nb_cross_entropy_opts ceo2 = nb_cross_entropy_defaults();
    ceo2.label_smoothing = -0.1;
    /* options */
    tu_assert_error(nb_cross_entropy(x, t, &ceo2), NB_EINVAL, "label_smoothing must be in [0, 1]");
    nb_cross_entropy_opts ceo3 = nb_cross_entropy_defaults();
    ceo3.label_smoothing = 1.5;
    tu_assert_error(nb_cross_entropy(x, t, &ceo3), NB_EINVAL, "label_smoothing");
    nb_cross_entropy_opts ceo4 = nb_cross_entropy_defaults();
    ceo4.label_smoothing = NAN;
    tu_assert_error(nb_cross_entropy(x, t, &ceo4), NB_EINVAL, "label_smoothing");
    nb_cross_entropy_opts ceo5 = nb_cross_entropy_defaults();
    ceo5.label_smoothing = 0.1;
    tu_assert_error(nb_nll_loss(x, t, &ceo5), NB_EINVAL, "label_smoothing is not supported");
    nb_cross_entropy_opts ceo6 = nb_cross_entropy_defaults();
    ceo6.reduction = 7;
    tu_assert_error(nb_cross_entropy(x, t, &ceo6), NB_EINVAL, "unknown reduction 7");
    /* mse / l1 */
    nb_tensor *p3 = nb_zeros((int64_t[]){3}, 1, NB_F32), *p31 = nb_zeros((int64_t[]){3, 1}, 2, NB_F32);
    tu_assert_error(nb_mse_loss(p3, p31, NB_REDUCTION_MEAN), NB_ESHAPE,
                    "mse_loss: pred shape [3] and target shape [3,1] differ");
    tu_assert_error(nb_l1_loss(p31, p3, NB_REDUCTION_SUM), NB_ESHAPE, "l1_loss: pred shape");
    tu_assert_error(nb_mse_loss(nb_zeros((int64_t[]){3}, 1, NB_I32), p3, 0), NB_EDTYPE,
                    "mse_loss: pred must have a floating point dtype");
    tu_assert_error(nb_l1_loss(p3, nb_zeros((int64_t[]){3}, 1, NB_I64), 0), NB_EDTYPE,
                    "l1_loss: target");
    tu_assert_error(nb_mse_loss(p3, p3, (nb_reduction)-1), NB_EINVAL, "unknown reduction");
    /* bce */
    tu_assert_error(nb_bce_with_logits(x, p3, NULL, 0), NB_ESHAPE,
                    "bce_with_logits: target shape [3] must equal logits shape [4,10]");
    tu_assert_error(nb_bce_with_logits(x, x, nb_ones((int64_t[]){4}, 1, NB_F32), 0), NB_ESHAPE,
                    "bce_with_logits");
    tu_assert_error(nb_bce_with_logits(x, x, nb_ones((int64_t[]){2, 4, 10}, 3, NB_F32), 0),
                    NB_ESHAPE, "pos_weight of shape [2,4,10] does not broadcast");
    tu_assert_error(nb_bce_with_logits(x, nb_zeros((int64_t[]){4, 10}, 2, NB_I64), NULL, 0),
                    NB_EDTYPE, "target must have a floating point dtype");
    tu_assert_error(nb_bce_with_logits(x, x, nb_ones((int64_t[]){10}, 1, NB_I32), 0), NB_EDTYPE,
                    "pos_weight");
    tu_assert_error(nb_bce_with_logits(x, x, NULL, (nb_reduction)3), NB_EINVAL,
                    "unknown reduction 3");
    /* a NULL from an earlier failure propagates, keeping the first error */
    tu_assert_error(nb_cross_entropy(nb_reshape(x, (int64_t[]){7}, 1), t, NULL), NB_ESHAPE,
                    NULL);
    ck_assert(!nb_grad(x));
    nb_scope_end();
    nb_alloc_get_stats(&after);
    ck_assert_int_eq(after.bytes_live, before.bytes_live);
}
END_TEST

/* ---- devices: meta (shapes only) and guard (no host access to device memory) ---------------- */
#define GUARD ((nb_device){NB_DEVICE_GUARD, 0})

typedef struct dev_loss {
    const char *what;
    int op; /* 0 cross_entropy, 1 nll_loss, 2 bce_with_logits, 3 mse_loss, 4 l1_loss */
    nb_dtype dt, tdt;
    int64_t xs[4];
    int nd;
    nb_cross_entropy_opts o; /* o.reduction for every op; the fields only (dl_opts) */
    bool pw;                 /* bce: a pos_weight over the last dim */
} dev_loss;

#define DL_MEAN NB_REDUCTION_MEAN
#define DL_SUM NB_REDUCTION_SUM
#define DL_NONE NB_REDUCTION_NONE
static const dev_loss dev_losses[] = {
    {"ce mean ignore smoothing", 0, NB_F32, NB_I64, {6, 7}, 2,
     {.reduction = DL_MEAN, .has_ignore_index = true, .ignore_index = 1, .label_smoothing = 0.1},
     false},
    {"ce none 4-D f16", 0, NB_F16, NB_I32, {2, 4, 3, 5}, 4, {.reduction = DL_NONE}, false},
    {"ce sum f64 3-D", 0, NB_F64, NB_I64, {3, 5, 70}, 3, {.reduction = DL_SUM}, false},
    {"ce mean (C)", 0, NB_BF16, NB_I64, {9}, 1, {.reduction = DL_MEAN}, false},
    {"nll mean ignore", 1, NB_F64, NB_I32, {5, 6}, 2,
     {.reduction = DL_MEAN, .has_ignore_index = true, .ignore_index = 2}, false},
    {"nll none", 1, NB_F32, NB_I64, {2, 3, 4}, 3, {.reduction = DL_NONE}, false},
    {"bce mean pos_weight", 2, NB_F32, NB_F32, {3, 4}, 2, {.reduction = DL_MEAN}, true},
    {"bce none bf16", 2, NB_BF16, NB_BF16, {2, 5}, 2, {.reduction = DL_NONE}, true},
    {"bce sum f64", 2, NB_F64, NB_F64, {7}, 1, {.reduction = DL_SUM}, false},
    {"mse none", 3, NB_F32, NB_F32, {3, 4}, 2, {.reduction = DL_NONE}, false},
    {"mse mean", 3, NB_F32, NB_F32, {3, 4}, 2, {.reduction = DL_MEAN}, false},
    {"mse sum f64", 3, NB_F64, NB_F64, {2, 3, 2}, 3, {.reduction = DL_SUM}, false},
    {"l1 none", 4, NB_F64, NB_F64, {5}, 1, {.reduction = DL_NONE}, false},
    {"l1 mean", 4, NB_F32, NB_F32, {4, 3}, 2, {.reduction = DL_MEAN}, false},
    {"l1 sum bf16", 4, NB_BF16, NB_BF16, {6}, 1, {.reduction = DL_SUM}, false},
};

static bool dl_cls(const dev_loss *c) { return c->op <= 1; }
/* Inputs: scores / logits / pred, target, pos_weight; every float one requires grad. */
static int dl_ninputs(const dev_loss *c) { return c->op == 2 && c->pw ? 3 : 2; }
static int dl_ngrad(const dev_loss *c) { return dl_cls(c) ? 1 : dl_ninputs(c); }

/* The options of c's row, from the defaults. */
static nb_cross_entropy_opts dl_opts(const dev_loss *c) {
    nb_cross_entropy_opts o = nb_cross_entropy_defaults();
    o.reduction = c->o.reduction, o.has_ignore_index = c->o.has_ignore_index;
    o.ignore_index = c->o.ignore_index, o.label_smoothing = c->o.label_smoothing;
    return o;
}

static nb_tensor *dl_run(const dev_loss *c, nb_tensor *const *in) {
    nb_reduction r = c->o.reduction;
    nb_cross_entropy_opts o = dl_opts(c);
    switch (c->op) {
    case 0: return nb_cross_entropy(in[0], in[1], &o);
    case 1: return nb_nll_loss(in[0], in[1], &o);
    case 2: return nb_bce_with_logits(in[0], in[1], c->pw ? in[2] : NULL, r);
    case 3: return nb_mse_loss(in[0], in[1], r);
    default: return nb_l1_loss(in[0], in[1], r);
    }
}

static void dl_inputs(const dev_loss *c, nb_tensor **in) {
    in[0] = tu_random(c->xs, c->nd, c->dt, -3, 3, 21);
    if (dl_cls(c)) {
        int64_t ts[4];
        int tn = target_shape(c->xs, c->nd, ts);
        int64_t C = c->xs[c->nd == 1 ? 0 : 1];
        in[1] = tu_random(ts, tn, c->tdt, 0, (double)(C - 1), 22);
    } else {
        in[1] = tu_random(c->xs, c->nd, c->tdt, c->op == 2 ? 0 : -1, 1, 22);
    }
    if (dl_ninputs(c) == 3) in[2] = tu_random(&c->xs[c->nd - 1], 1, c->dt, 0.5, 2, 23);
}

/* The loss on copies of in[] on dev (the float inputs leaves that require grad), then a
 * backward with a fixed random gradient; y and the gradients come back on the CPU. */
static nb_tensor *dl_forward_backward(const dev_loss *c, nb_device dev, nb_tensor *const *in,
                                      nb_tensor **grads) {
    nb_tensor *xs[3] = {NULL, NULL, NULL};
    for (int i = 0; i < dl_ninputs(c); i++) {
        xs[i] = nb_detach(nb_to_device(in[i], dev));
        ck_assert(xs[i] != NULL);
        if (i < dl_ngrad(c)) ck_assert(nb_set_requires_grad(xs[i], true) == NB_OK);
    }
    nb_tensor *y = dl_run(c, xs);
    ck_assert_msg(y != NULL, "%s: %s", c->what, nb_last_error());
    ck_assert(nb_device_equal(nb_tensor_device(y), dev));
    nb_tensor *g = tu_random(nb_shape(y), nb_ndim(y), nb_tensor_dtype(y), -1, 1, 24);
    nb_backward_opts bo = nb_backward_defaults();
    bo.grad_output = nb_to_device(g, dev);
    nb_status st = nb_backward_ex(y, &bo);
    ck_assert_msg(st == NB_OK, "%s: %s", c->what, nb_last_error());
    for (int i = 0; i < dl_ngrad(c); i++) {
        ck_assert(nb_device_equal(nb_tensor_device(nb_grad(xs[i])), dev));
        grads[i] = nb_to_device(nb_grad(xs[i]), NB_CPU);
    }
    return nb_to_device(y, NB_CPU);
}

static void assert_same(nb_tensor *got, nb_tensor *want) {
    double *v = tu_values(want);
    tu_assert_close(got, v, nb_shape(want), nb_ndim(want), 0);
    free(v);
}

/* On the guard device every loss gives the CPU's values and gradients bit for bit (the guard
 * runs the CPU kernels), target validation included: the op definitions never touch device
 * memory. */
START_TEST(test_loss_guard) {
    for (int i = 0; i < NELEM(dev_losses); i++) {
        const dev_loss *c = &dev_losses[i];
        nb_scope_begin();
        nb_tensor *in[3], *gc[3], *gg[3];
        dl_inputs(c, in);
        nb_tensor *yc = dl_forward_backward(c, NB_CPU, in, gc);
        nb_tensor *yg = dl_forward_backward(c, GUARD, in, gg);
        assert_same(yg, yc);
        for (int k = 0; k < dl_ngrad(c); k++) assert_same(gg[k], gc[k]);
        nb_scope_end();
    }
    nb_scope_begin();
    /* Every target ignored: a mean of NaN, zero gradients, on the guard too. */
    nb_tensor *x = nb_detach(nb_to_device(tu_random((int64_t[]){3, 4}, 2, NB_F32, -2, 2, 5),
                                          GUARD));
    ck_assert(nb_set_requires_grad(x, true) == NB_OK);
    nb_tensor *t = nb_full_on(GUARD, (int64_t[]){3}, 1, NB_I64, -100);
    nb_cross_entropy_opts o = nb_cross_entropy_defaults();
    o.has_ignore_index = true, o.ignore_index = -100;
    nb_tensor *y = nb_cross_entropy(x, t, &o);
    ck_assert(y != NULL);
    ck_assert(isnan(nb_item_f64(nb_to_device(y, NB_CPU))));
    nb_backward_opts bo = nb_backward_defaults();
    bo.grad_output = nb_ones_on(GUARD, NULL, 0, NB_F32);
    ck_assert(nb_backward_ex(y, &bo) == NB_OK);
    const double zeros[12] = {0};
    tu_assert_close(nb_to_device(nb_grad(x), NB_CPU), zeros, ((int64_t[]){3, 4}), 2, 0);
    /* An out-of-range target is found by the kernel, with the same message. */
    nb_tensor *t12 = nb_to_device(tu_tensor((double[]){1, 12, 3}, (int64_t[]){3}, 1, NB_I64),
                                  GUARD);
    tu_assert_error(nb_cross_entropy(x, t12, NULL), NB_EINDEX,
                    "cross_entropy: target 12 is out of range for 4 classes");
    tu_assert_error(nb_nll_loss(x, t12, &o), NB_EINDEX,
                    "nll_loss: target 12 is out of range for 4 classes");
    nb_scope_end();
}
END_TEST

/* On meta every loss infers its output's shape and dtype and records; the backward gives
 * meta gradients of the inputs' shapes; nothing is computed, validated or read. */
START_TEST(test_loss_meta) {
    for (int i = 0; i < NELEM(dev_losses); i++) {
        const dev_loss *c = &dev_losses[i];
        nb_scope_begin();
        nb_tensor *in[3], *xs[3];
        dl_inputs(c, in);
        nb_tensor *ref = dl_run(c, in); /* the CPU result: the expected shape and dtype */
        ck_assert(ref != NULL);
        for (int k = 0; k < dl_ninputs(c); k++) {
            xs[k] = nb_empty_on(NB_META, nb_shape(in[k]), nb_ndim(in[k]), nb_tensor_dtype(in[k]));
            if (k < dl_ngrad(c)) ck_assert(nb_set_requires_grad(xs[k], true) == NB_OK);
        }
        nb_tensor *y = dl_run(c, xs);
        ck_assert_msg(y != NULL, "%s: %s", c->what, nb_last_error());
        ck_assert(nb_tensor_device(y).type == NB_DEVICE_META);
        ck_assert_int_eq(nb_tensor_dtype(y), nb_tensor_dtype(ref));
        ck_assert_int_eq(nb_ndim(y), nb_ndim(ref));
        for (int d = 0; d < nb_ndim(y); d++) ck_assert_int_eq(nb_shape(y)[d], nb_shape(ref)[d]);
        nb_tensor *g = nb_ones_on(NB_META, nb_shape(y), nb_ndim(y), nb_tensor_dtype(y));
        nb_backward_opts bo = nb_backward_defaults();
        bo.grad_output = g;
        nb_status st = nb_backward_ex(y, &bo);
        ck_assert_msg(st == NB_OK, "%s: %s", c->what, nb_last_error());
        for (int k = 0; k < dl_ngrad(c); k++) {
            nb_tensor *gk = nb_grad(xs[k]);
            ck_assert_msg(gk != NULL, "%s: input %d has no gradient", c->what, k);
            ck_assert(nb_tensor_device(gk).type == NB_DEVICE_META);
            ck_assert_int_eq(nb_tensor_dtype(gk), nb_tensor_dtype(in[k]));
            ck_assert_int_eq(nb_ndim(gk), nb_ndim(in[k]));
            for (int d = 0; d < nb_ndim(in[k]); d++)
                ck_assert_int_eq(nb_shape(gk)[d], nb_shape(in[k])[d]);
        }
        nb_scope_end();
    }
}
END_TEST

/* x and t are on the default device, whose name the messages give. */
START_TEST(test_loss_mixed_devices) {
    nb_scope_begin();
    char dev[32], ce_msg[96], nll_msg[96], bce_msg[96];
    nb_device_name(nb_default_device(), dev, sizeof dev);
    snprintf(ce_msg, sizeof ce_msg, "cross_entropy: operands on %s and meta", dev);
    snprintf(nll_msg, sizeof nll_msg, "nll_loss: operands on meta and %s", dev);
    snprintf(bce_msg, sizeof bce_msg, "bce_with_logits: operands on %s and meta", dev);
    nb_tensor *x = tu_random((int64_t[]){4, 10}, 2, NB_F32, -1, 1, 1);
    nb_tensor *t = tu_tensor((double[]){1, 2, 3, 4}, (int64_t[]){4}, 1, NB_I64);
    nb_tensor *xm = nb_to_device(x, NB_META), *tm = nb_to_device(t, NB_META);
    tu_assert_error(nb_cross_entropy(x, tm, NULL), NB_EDEVICE, ce_msg);
    tu_assert_error(nb_nll_loss(xm, t, NULL), NB_EDEVICE, nll_msg);
    tu_assert_error(nb_bce_with_logits(x, xm, NULL, 0), NB_EDEVICE, "bce_with_logits");
    tu_assert_error(nb_bce_with_logits(x, x, nb_ones_on(NB_META, (int64_t[]){10}, 1, NB_F32), 0),
                    NB_EDEVICE, bce_msg);
    tu_assert_error(nb_mse_loss(xm, x, 0), NB_EDEVICE, "mse_loss");
    tu_assert_error(nb_l1_loss(x, xm, 0), NB_EDEVICE, "l1_loss");
    nb_scope_end();
}
END_TEST

Suite *nb_suite_loss(void) {
    Suite *s = suite_create("loss");
    struct {
        const char *name;
        const TTest *fn;
    } cases[] = {
        {"cross_entropy", test_cross_entropy},
        {"nll_loss", test_nll_loss},
        {"all_ignored", test_cls_all_ignored},
        {"large_logits", test_cls_large_logits},
        {"cls_f32_vs_f64", test_cls_f32_vs_f64},
        {"cls_noncontig", test_cls_noncontig},
        {"cls_threads", test_cls_threads},
        {"mse_l1", test_mse_l1},
        {"bce_with_logits", test_bce_with_logits},
        {"bce_large_logits", test_bce_large_logits},
        {"errors", test_loss_errors},
        {"gradcheck_cls", test_gradcheck_cls},
        {"gradcheck_pointwise", test_gradcheck_pointwise},
        {"guard", test_loss_guard},
        {"meta", test_loss_meta},
        {"mixed_devices", test_loss_mixed_devices},
    };
    for (int i = 0; i < NELEM(cases); i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_add_test(tc, cases[i].fn);
        suite_add_tcase(s, tc);
    }
    return s;
}
