/* test_nn_pool.c - the nn_conv suite's pooling tests: max, average and adaptive average
 * pooling against double-precision direct loops over a table of configurations, max pooling's
 * NaN and infinity handling, gradients (nb_gradcheck, f32 against f64), the modules, and
 * every class of user error; added to the suite's "pool2d" TCase by nb_tests_nn_pool
 * (tests/test_nn_conv.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/backend.h"
#include "cpu/conv.h"
#include "test_nn_conv.h"
#include "testutil.h"

/* ---- pooling ------------------------------------------------------------------------------------ */
typedef struct pool_cfg {
    int64_t N, C, H, W, kh, kw, sh, sw, ph, pw; /* N == 0: a 3-D (C, H, W) input */
    bool noncontig;
} pool_cfg;

static const pool_cfg k_pools[] = {
    {2, 3, 6, 6, 2, 2, 0, 0, 0, 0, false},  /* the 2x2/2 fast path, stride 0 -> kernel */
    {1, 2, 7, 5, 3, 3, 2, 2, 1, 1, true},   /* padding, overlapping windows */
    {2, 1, 5, 8, 2, 3, 1, 2, 1, 1, false},  /* stride != kernel */
    {1, 2, 4, 4, 4, 4, 1, 1, 2, 2, false},  /* padding = kernel/2 */
    {1, 1, 9, 7, 3, 2, 3, 1, 0, 1, true},   /* leftover rows dropped (no ceil mode) */
    {3, 2, 5, 5, 1, 1, 2, 2, 0, 0, false},  /* kernel 1 */
    {0, 3, 6, 5, 2, 2, 2, 1, 1, 0, false},  /* 3-D input */
    {2, 2, 6, 6, 2, 2, 2, 2, 1, 1, false},  /* 2x2/2 with padding: not the fast path */
    {1, 2, 6, 40, 2, 2, 0, 0, 0, 0, true},  /* fast path, 20 outputs per row (16 + 4) */
    {1, 1, 5, 41, 2, 2, 0, 0, 0, 0, false}, /* fast path, odd sizes (last row/column unused) */
};
#define N_POOLS ((int)(sizeof k_pools / sizeof k_pools[0]))

static int pool_shapes(const pool_cfg *c, int64_t *xs, int64_t *ys, int64_t *planes,
                       int64_t *OH, int64_t *OW) {
    int64_t sh = c->sh ? c->sh : c->kh, sw = c->sw ? c->sw : c->kw;
    *OH = (c->H + 2 * c->ph - c->kh) / sh + 1;
    *OW = (c->W + 2 * c->pw - c->kw) / sw + 1;
    int nd = 0;
    if (c->N) xs[nd] = ys[nd] = c->N, nd++;
    xs[nd] = ys[nd] = c->C, nd++;
    xs[nd] = c->H, ys[nd] = *OH, nd++;
    xs[nd] = c->W, ys[nd] = *OW, nd++;
    *planes = (c->N ? c->N : 1) * c->C;
    return nd;
}

/* kind 0: max, 1: avg counting padding, 2: avg without padding. */
static double *ref_pool(const pool_cfg *c, int kind, const double *x) {
    int64_t xs[4], ys[4], P, OH, OW;
    pool_shapes(c, xs, ys, &P, &OH, &OW);
    int64_t sh = c->sh ? c->sh : c->kh, sw = c->sw ? c->sw : c->kw;
    double *y = malloc(sizeof(double) * (size_t)(P * OH * OW));
    for (int64_t p = 0; p < P; p++)
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                double m = -INFINITY, s = 0;
                int64_t cnt = 0;
                for (int64_t i = 0; i < c->kh; i++)
                    for (int64_t j = 0; j < c->kw; j++) {
                        int64_t h = oh * sh - c->ph + i, w = ow * sw - c->pw + j;
                        if (h < 0 || h >= c->H || w < 0 || w >= c->W) continue;
                        double v = x[(p * c->H + h) * c->W + w];
                        m = (v > m || isnan(v)) ? v : m;
                        s += v, cnt++;
                    }
                /* count_include_pad: the window clipped to the padded input. */
                int64_t h0 = oh * sh - c->ph, w0 = ow * sw - c->pw;
                int64_t h1 = h0 + c->kh < c->H + c->ph ? h0 + c->kh : c->H + c->ph;
                int64_t w1 = w0 + c->kw < c->W + c->pw ? w0 + c->kw : c->W + c->pw;
                double div = kind == 1 ? (double)((h1 - h0) * (w1 - w0)) : (double)cnt;
                y[(p * OH + oh) * OW + ow] = kind == 0 ? m : s / div;
            }
    return y;
}

static nb_tensor *run_pool(const pool_cfg *c, int kind, nb_tensor *x) {
    /* a 0 in the table is PyTorch's stride=None: NULL (the kernel size) when both are */
    int64_t k[2] = {c->kh, c->kw}, p[2] = {c->ph, c->pw};
    int64_t s[2] = {c->sh ? c->sh : c->kh, c->sw ? c->sw : c->kw};
    const int64_t *sp = c->sh || c->sw ? s : NULL;
    if (kind == 0) return nb_maxpool2d(x, k, sp, p);
    return nb_avgpool2d(x, k, sp, p, kind == 1);
}

START_TEST(test_pool2d_forward) {
    for (int di = 0; di < 4; di++) {
        nb_dtype dt = k_float_dtypes[di];
        for (int i = 0; i < N_POOLS; i++) {
            const pool_cfg *c = &k_pools[i];
            for (int kind = 0; kind < 3; kind++) {
                nb_scope_begin();
                int64_t xs[4], ys[4], P, OH, OW;
                int nd = pool_shapes(c, xs, ys, &P, &OH, &OW);
                nb_tensor *x = tu_random(xs, nd, dt, -2, 2, 40 + i);
                if (c->noncontig) x = tu_noncontig(x);
                double *vx = tu_values(x), *ref = ref_pool(c, kind, vx);
                nb_tensor *y = run_pool(c, kind, x);
                ck_assert_msg(y != NULL, "config %d kind %d: %s", i, kind, nb_last_error());
                ck_assert_int_eq(nb_tensor_dtype(y), dt);
                tu_assert_close(y, ref, ys, nd, kind == 0 ? 0 : tu_tol(dt));
                free(vx), free(ref);
                nb_scope_end();
            }
        }
    }
}
END_TEST

START_TEST(test_maxpool2d_special_values) {
    nb_scope_begin();
    /* NaN propagates; -inf is a value like any other; padding never wins. */
    double v[16] = {1, NAN, 3, 4, 5, 6, 7, 8, -INFINITY, -INFINITY, 2, 1, -INFINITY,
                    -INFINITY, 0, -5};
    nb_tensor *x = tu_tensor(v, (int64_t[]){1, 1, 4, 4}, 4, NB_F32);
    nb_tensor *y = nb_maxpool2d(x, (int64_t[]){2, 2}, NULL, NULL);
    double r[4] = {NAN, 8, -INFINITY, 2};
    tu_assert_close(y, r, ((int64_t[]){1, 1, 2, 2}), 4, 0);
    nb_tensor *yp = nb_maxpool2d(tu_tensor((double[]){-3, -2, -4, -1}, (int64_t[]){1, 1, 2, 2},
                                           4, NB_F32),
                                    (int64_t[]){2, 2}, (int64_t[]){1, 1}, (int64_t[]){1, 1});
    double rp[9] = {-3, -2, -2, -3, -1, -1, -4, -1, -1};
    tu_assert_close(yp, rp, ((int64_t[]){1, 1, 3, 3}), 4, 0);
    /* The gradient goes to the maximum only (ties: the first one). */
    nb_tensor *xt = tu_tensor((double[]){1, 5, 5, 2}, (int64_t[]){1, 1, 2, 2}, 4, NB_F64);
    ck_assert(nb_set_requires_grad(xt, true) == NB_OK);
    nb_tensor *yt = nb_maxpool2d(xt, (int64_t[]){2, 2}, NULL, NULL);
    ck_assert(backward_with(yt, nb_ones_like(yt)) == NB_OK);
    double rg[4] = {0, 1, 0, 0};
    tu_assert_close(nb_grad(xt), rg, ((int64_t[]){1, 1, 2, 2}), 4, 0);
    nb_scope_end();
}
END_TEST

START_TEST(test_adaptive_avgpool2d_forward) {
    static const int64_t cfgs[][4] = {{6, 6, 3, 3}, {7, 5, 3, 2}, {5, 5, 5, 5},
                                      {4, 4, 7, 6}, {9, 7, 1, 1}, {10, 3, 4, 2}};
    for (int di = 0; di < 4; di++) {
        nb_dtype dt = k_float_dtypes[di];
        for (int i = 0; i < 6; i++) {
            nb_scope_begin();
            int64_t H = cfgs[i][0], W = cfgs[i][1], OH = cfgs[i][2], OW = cfgs[i][3];
            int64_t xs[4] = {2, 3, H, W}, ys[4] = {2, 3, OH, OW};
            nb_tensor *x = tu_random(xs, 4, dt, -2, 2, 60 + i);
            if (i % 2) x = tu_noncontig(x);
            double *vx = tu_values(x), *ref = malloc(sizeof(double) * (size_t)(6 * OH * OW));
            for (int64_t p = 0; p < 6; p++)
                for (int64_t oh = 0; oh < OH; oh++)
                    for (int64_t ow = 0; ow < OW; ow++) {
                        int64_t h0 = (int64_t)floor((double)(oh * H) / (double)OH);
                        int64_t h1 = (int64_t)ceil((double)((oh + 1) * H) / (double)OH);
                        int64_t w0 = (int64_t)floor((double)(ow * W) / (double)OW);
                        int64_t w1 = (int64_t)ceil((double)((ow + 1) * W) / (double)OW);
                        double s = 0;
                        for (int64_t h = h0; h < h1; h++)
                            for (int64_t w = w0; w < w1; w++) s += vx[(p * H + h) * W + w];
                        ref[(p * OH + oh) * OW + ow] = s / (double)((h1 - h0) * (w1 - w0));
                    }
            nb_tensor *y = nb_adaptive_avgpool2d(x, OH, OW);
            tu_assert_close(y, ref, ys, 4, tu_tol(dt));
            free(vx), free(ref);
            nb_scope_end();
        }
    }
}
END_TEST

typedef struct pool_gctx {
    const pool_cfg *c;
    int kind; /* 0 max, 1 avg incl. pad, 2 avg excl. pad, 3 adaptive */
} pool_gctx;

static nb_tensor *pool_f(nb_tensor *const *in, int n, void *ctx) {
    (void)n;
    const pool_gctx *k = ctx;
    if (k->kind == 3) return nb_adaptive_avgpool2d(in[0], k->c->kh, k->c->kw);
    return run_pool(k->c, k->kind, in[0]);
}

START_TEST(test_pool2d_gradcheck) {
    static const pool_cfg cfgs[] = {
        {1, 2, 4, 4, 2, 2, 0, 0, 0, 0, false},
        {1, 1, 5, 4, 3, 2, 1, 2, 1, 1, false},  /* overlapping windows with padding */
        {2, 1, 4, 3, 2, 2, 1, 1, 1, 0, false},
    };
    for (int i = 0; i < 3; i++) {
        for (int kind = 0; kind < 4; kind++) {
            nb_scope_begin();
            int64_t xs[4], ys[4], P, OH, OW;
            int nd = pool_shapes(&cfgs[i], xs, ys, &P, &OH, &OW);
            nb_tensor *x = tu_random(xs, nd, NB_F64, -1, 1, 80 + i);
            ck_assert(nb_set_requires_grad(x, true) == NB_OK);
            /* adaptive: reuse (kh, kw) as the output size (down and up sampling). */
            pool_cfg c = cfgs[i];
            if (kind == 3) c.kh = 3 + i, c.kw = 2;
            pool_gctx k = {&c, kind};
            nb_status st = nb_gradcheck(pool_f, &x, 1, &k, NULL);
            ck_assert_msg(st == NB_OK, "config %d kind %d: %s", i, kind, nb_last_error());
            nb_scope_end();
        }
    }
}
END_TEST

START_TEST(test_pool2d_backward_f32_vs_f64) {
    const pool_cfg *c = &k_pools[1];
    for (int kind = 0; kind < 4; kind++) {
        double *g[2];
        int64_t xs[4], ys[4], P, OH, OW;
        int nd = pool_shapes(c, xs, ys, &P, &OH, &OW);
        pool_gctx k = {c, kind};
        nb_dtype dts[2] = {NB_F64, NB_F32};
        for (int d = 0; d < 2; d++) {
            nb_scope_begin();
            nb_tensor *x = tu_random(xs, nd, dts[d], -1, 1, 90);
            ck_assert(nb_set_requires_grad(x, true) == NB_OK);
            nb_tensor *y = pool_f(&x, 1, &k);
            nb_tensor *r = tu_random(nb_shape(y), nb_ndim(y), dts[d], -1, 1, 91);
            ck_assert(backward_with(y, r) == NB_OK);
            ck_assert_int_eq(nb_tensor_dtype(nb_grad(x)), dts[d]);
            g[d] = tu_values(nb_grad(x));
            nb_scope_end();
        }
        nb_scope_begin();
        tu_assert_close(tu_tensor(g[1], xs, nd, NB_F64), g[0], xs, nd, 1e-5);
        nb_scope_end();
        free(g[0]), free(g[1]);
    }
}
END_TEST

START_TEST(test_pool2d_modules) {
    nb_scope_begin();
    nb_tensor *x = tu_random((int64_t[]){2, 3, 7, 6}, 4, NB_F32, -1, 1, 3);
    nb_pool2d_opts po = nb_pool2d_defaults(3, 2);
    po.stride[0] = 2;
    po.padding[0] = po.padding[1] = 1;
    nb_module *mp = nb_maxpool2d_new(3, 2, &po);
    po = nb_pool2d_defaults(2, 2);
    po.padding[0] = 1;
    po.exclude_pad = true;
    nb_module *ap = nb_avgpool2d_new(2, 2, &po);
    nb_module *ad = nb_adaptive_avgpool2d_new(3, 2);
    ck_assert(mp && ap && ad);
    ck_assert_str_eq(nb_module_type(mp), "MaxPool2d");
    ck_assert_str_eq(nb_module_type(ap), "AvgPool2d");
    ck_assert_str_eq(nb_module_type(ad), "AdaptiveAvgPool2d");
    ck_assert_int_eq(nb_num_parameters(mp) + nb_num_parameters(ap) + nb_num_parameters(ad), 0);
    nb_tensor *ys[3] = {nb_forward(mp, x), nb_forward(ap, x), nb_forward(ad, x)};
    nb_tensor *rs[3] = {
        nb_maxpool2d(x, (int64_t[]){3, 2}, (int64_t[]){2, 2}, (int64_t[]){1, 1}),
        nb_avgpool2d(x, (int64_t[]){2, 2}, NULL, (int64_t[]){1, 0}, false),
        nb_adaptive_avgpool2d(x, 3, 2)};
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(ys[i] && rs[i], "%s", nb_last_error());
        double *r = tu_values(rs[i]);
        tu_assert_close(ys[i], r, nb_shape(rs[i]), 4, 0);
        free(r);
    }
    /* Default stride = kernel. */
    nb_module *m2 = nb_maxpool2d_new(2, 2, NULL);
    nb_tensor *y2 = nb_forward(m2, x);
    ck_assert(y2 && nb_shape(y2)[2] == 3 && nb_shape(y2)[3] == 3);
    nb_module_free(mp), nb_module_free(ap), nb_module_free(ad), nb_module_free(m2);
    nb_scope_end();
}
END_TEST

START_TEST(test_pool2d_errors) {
    nb_scope_begin();
    nb_tensor *x = tu_random((int64_t[]){2, 3, 5, 5}, 4, NB_F32, -1, 1, 1);
    int64_t k2[2] = {2, 2};
    tu_assert_error(nb_maxpool2d(tu_random((int64_t[]){5, 5}, 2, NB_F32, 0, 1, 1), k2, NULL,
                                 NULL),
                    NB_ESHAPE, "maxpool2d: input must be 4-D (N, C, H, W) or 3-D");
    tu_assert_error(nb_maxpool2d(x, (int64_t[]){0, 2}, NULL, NULL), NB_EINVAL,
                    "kernel size and stride must be positive");
    tu_assert_error(nb_maxpool2d(x, k2, (int64_t[]){-1, 1}, NULL), NB_EINVAL, "stride");
    tu_assert_error(nb_maxpool2d(x, k2, NULL, (int64_t[]){2, 0}), NB_EINVAL,
                    "at most half the kernel size");
    tu_assert_error(nb_avgpool2d(x, (int64_t[]){6, 2}, NULL, NULL, true), NB_ESHAPE,
                    "larger than the padded input");
    tu_assert_error(nb_avgpool2d(x, k2, NULL, (int64_t[]){0, -1}, true), NB_EINVAL, "padding");
    tu_assert_error(nb_maxpool2d(x, NULL, NULL, NULL), NB_ENULL, "kernel");
    tu_assert_error(nb_maxpool2d(NULL, k2, NULL, NULL), NB_ENULL, NULL);
    nb_tensor *xi = tu_random((int64_t[]){1, 1, 4, 4}, 4, NB_I64, 0, 9, 1);
    tu_assert_error(nb_maxpool2d(xi, k2, NULL, NULL), NB_EDTYPE, "i64");
    tu_assert_error(nb_avgpool2d(xi, k2, NULL, NULL, true), NB_EDTYPE, "i64");
    tu_assert_error(nb_adaptive_avgpool2d(xi, 2, 2), NB_EDTYPE, "i64");
    tu_assert_error(nb_adaptive_avgpool2d(x, 0, 2), NB_EINVAL, "output size");
    tu_assert_error(nb_adaptive_avgpool2d(tu_random((int64_t[]){1, 2, 0, 3}, 4, NB_F32, 0, 1, 1),
                                          1, 1),
                    NB_ESHAPE, "empty spatial");
    tu_assert_error(nb_maxpool2d_new(0, 2, NULL), NB_EINVAL, "kernel size");
    nb_pool2d_opts po = nb_pool2d_defaults(2, 2);
    po.stride[0] = 2, po.stride[1] = 2, po.padding[0] = 2, po.padding[1] = 0;
    tu_assert_error(nb_avgpool2d_new(2, 2, &po), NB_EINVAL, "padding");
    /* options are read as written (issue 17 item 4): stride 0 is an error, not the kernel
     * size, which nb_pool2d_defaults(kh, kw) gives */
    nb_pool2d_opts po2 = nb_pool2d_defaults(2, 2);
    po2.stride[0] = po2.stride[1] = 0, po2.padding[0] = 1, po2.padding[1] = 1;
    tu_assert_error(nb_maxpool2d_new(2, 2, &po2), NB_EINVAL, "stride [0,0] must be positive");
    tu_assert_error(nb_maxpool2d(tu_random((int64_t[]){1, 1, 4, 4}, 4, NB_F32, -1, 1, 1),
                                 (int64_t[]){2, 2}, (int64_t[]){0, 2}, NULL),
                    NB_EINVAL, "stride");
    nb_pool2d_opts pd = nb_pool2d_defaults(3, 2);
    ck_assert(pd.stride[0] == 3 && pd.stride[1] == 2 && pd.padding[0] == 0 &&
              pd.padding[1] == 0 && !pd.exclude_pad);
    tu_assert_error(nb_adaptive_avgpool2d_new(2, -1), NB_EINVAL, "output size");
    nb_module *m = nb_maxpool2d_new(7, 7, NULL);
    tu_assert_error(nb_forward(m, x), NB_ESHAPE, "larger than the padded input");
    nb_module_free(m);
    nb_scope_end();
}
END_TEST

/* ---- ReLU fused into max pooling ------------------------------------------------------------ */
/* x of shape xs with values from {-2, -1, -0, 0, 1, 2} (ties, zeros of both signs, windows
 * whose maximum is <= 0) and, with nan, a NaN; the same values in every dtype. */
static nb_tensor *relu_pool_input(const int64_t *xs, int nd, nb_dtype dt, unsigned seed,
                                  bool nan) {
    static const double vals[6] = {-2, -1, -0.0, 0, 1, 2};
    int64_t n = tu_numel(xs, nd);
    double *u = malloc(sizeof(double) * (size_t)n);
    tu_fill_uniform(u, n, 0, 6, seed);
    for (int64_t i = 0; i < n; i++) u[i] = vals[(int)u[i] % 6];
    if (nan && n > 3) u[3] = NAN;
    nb_tensor *x = tu_tensor(u, xs, nd, dt);
    free(u);
    return x;
}

/* pool(x) as nb_relu_maxpool2d (fused 1), the two ops (0) or a Sequential of ReLU and
 * MaxPool2d (2); its gradient for the upstream gradient r. */
static nb_tensor *relu_pool_run(const pool_cfg *c, int how, nb_tensor *x, nb_tensor *r,
                                nb_tensor **gx) {
    int64_t k[2] = {c->kh, c->kw}, p[2] = {c->ph, c->pw};
    int64_t s[2] = {c->sh ? c->sh : c->kh, c->sw ? c->sw : c->kw};
    nb_tensor *xg = nb_detach(x);
    ck_assert(nb_set_requires_grad(xg, true) == NB_OK);
    nb_tensor *y = NULL;
    if (how == 0) y = nb_maxpool2d(nb_relu(xg), k, s, p);
    if (how == 1) y = nb_relu_maxpool2d(xg, k, s, p);
    nb_module *m = NULL;
    if (how == 2) {
        nb_pool2d_opts po = nb_pool2d_defaults(c->kh, c->kw);
        po.stride[0] = s[0], po.stride[1] = s[1], po.padding[0] = p[0], po.padding[1] = p[1];
        m = nb_sequential_new(nb_relu_new(), nb_maxpool2d_new(c->kh, c->kw, &po), NULL);
        y = nb_forward(m, xg);
    }
    ck_assert_msg(y != NULL, "%s", nb_last_error());
    ck_assert(backward_with(y, r) == NB_OK);
    *gx = nb_grad(xg);
    nb_module_free(m);
    return y;
}

START_TEST(test_relu_maxpool2d_same_bits) {
    /* Fused (the op, the module option, nb_sequential's fusion) against ReLU then the pool,
     * bit for bit, values and gradients, f32 and f64, every configuration (the 2x2/2 fast
     * path, padding, overlapping windows). */
    for (int di = 0; di < 2; di++) {
        nb_dtype dt = di ? NB_F64 : NB_F32;
        for (int i = 0; i < N_POOLS; i++) {
            for (int nan = 0; nan < 2; nan++) {
                nb_scope_begin();
                const pool_cfg *c = &k_pools[i];
                int64_t xs[4], ys[4], P, OH, OW;
                int nd = pool_shapes(c, xs, ys, &P, &OH, &OW);
                nb_tensor *x = relu_pool_input(xs, nd, dt, 60 + (unsigned)i, nan);
                if (c->noncontig) x = tu_noncontig(x);
                nb_tensor *r = tu_random(ys, nd, dt, -1, 1, 70 + (unsigned)i);
                nb_tensor *g0, *g;
                nb_tensor *y0 = relu_pool_run(c, 0, x, r, &g0);
                for (int how = 1; how < 3; how++) {
                    nb_tensor *y = relu_pool_run(c, how, x, r, &g);
                    tu_assert_same_bytes(y, y0);
                    tu_assert_same_bytes(g, g0);
                }
                nb_scope_end();
            }
        }
    }
}
END_TEST

static nb_tensor *relu_pool_f(nb_tensor *const *in, int n, void *ctx) {
    (void)n;
    const pool_cfg *c = ctx;
    return nb_relu_maxpool2d(in[0], (int64_t[]){c->kh, c->kw}, (int64_t[]){c->sh, c->sw},
                             (int64_t[]){c->ph, c->pw});
}

START_TEST(test_relu_maxpool2d_gradcheck) {
    static const pool_cfg cfgs[] = {
        {1, 2, 4, 6, 2, 2, 2, 2, 0, 0, false},  /* the 2x2/2 fast path */
        {1, 1, 5, 4, 3, 2, 1, 2, 1, 1, false},  /* overlapping windows with padding */
    };
    for (int i = 0; i < 2; i++) {
        nb_scope_begin();
        int64_t xs[4], ys[4], P, OH, OW;
        int nd = pool_shapes(&cfgs[i], xs, ys, &P, &OH, &OW);
        nb_tensor *x = tu_random(xs, nd, NB_F64, -1, 1, 85 + (unsigned)i);
        ck_assert(nb_set_requires_grad(x, true) == NB_OK);
        nb_status st = nb_gradcheck(relu_pool_f, &x, 1, (void *)(uintptr_t)&cfgs[i], NULL);
        ck_assert_msg(st == NB_OK, "config %d: %s", i, nb_last_error());
        nb_scope_end();
    }
}
END_TEST

START_TEST(test_relu_maxpool2d_options) {
    nb_scope_begin();
    /* the module option runs the fused op; average pooling has no relu option */
    nb_tensor *x = tu_random((int64_t[]){2, 3, 6, 6}, 4, NB_F32, -1, 1, 4);
    nb_pool2d_opts po = nb_pool2d_defaults(2, 2);
    po.relu = true;
    nb_module *m = nb_maxpool2d_new(2, 2, &po);
    ck_assert(m != NULL);
    nb_tensor *y = nb_forward(m, x);
    nb_tensor *r = nb_maxpool2d(nb_relu(x), (int64_t[]){2, 2}, NULL, NULL);
    ck_assert(y && r);
    tu_assert_same_bytes(y, r);
    nb_module_free(m);
    tu_assert_error(nb_avgpool2d_new(2, 2, &po), NB_EINVAL, "max pooling only");
    tu_assert_error(nb_relu_maxpool2d(x, (int64_t[]){7, 7}, NULL, NULL), NB_ESHAPE,
                    "larger than the padded input");
    /* the Sequential keeps its modules and their names */
    nb_module *s = nb_sequential_new(nb_relu_new(), nb_maxpool2d_new(2, 2, NULL), NULL);
    ck_assert_int_eq(nb_module_num_children(s), 2);
    /* on the CPU (a backend with pool_relu) the op and the Sequential run the fused kernel:
     * no ReLU pass of its own; the two ops, the control, do run one */
    nb_profile_row row;
    for (int how = 0; how < 3; how++) {
        ck_assert_int_eq(nb_profile_start(), NB_OK);
        nb_tensor *o = how == 0 ? nb_maxpool2d(nb_relu(x), (int64_t[]){2, 2}, NULL, NULL)
                     : how == 1 ? nb_relu_maxpool2d(x, (int64_t[]){2, 2}, NULL, NULL)
                                : nb_forward(s, x);
        nb_profile_stop();
        ck_assert_msg(o != NULL, "%s", nb_last_error());
        int64_t relu_calls = nb_profile_row_get("relu", NULL, &row) ? row.calls : 0;
        ck_assert_msg(how == 0 ? relu_calls > 0 : relu_calls == 0,
                      "way %d ran %lld ReLU kernels", how, (long long)relu_calls);
    }
    nb_module_free(s);
    nb_scope_end();
}
END_TEST

void nb_tests_nn_pool(TCase *tc) {
    tcase_add_test(tc, test_relu_maxpool2d_same_bits);
    tcase_add_test(tc, test_relu_maxpool2d_gradcheck);
    tcase_add_test(tc, test_relu_maxpool2d_options);
    tcase_add_test(tc, test_pool2d_forward);
    tcase_add_test(tc, test_maxpool2d_special_values);
    tcase_add_test(tc, test_adaptive_avgpool2d_forward);
    tcase_add_test(tc, test_pool2d_gradcheck);
    tcase_add_test(tc, test_pool2d_backward_f32_vs_f64);
    tcase_add_test(tc, test_pool2d_modules);
    tcase_add_test(tc, test_pool2d_errors);
}
