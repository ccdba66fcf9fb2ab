/* test_nn_conv.c - the "nn_conv" suite: nb_conv2d and the pools (max, average, adaptive
 * average) against double-precision direct loops over tables of configurations (stride,
 * padding, dilation, groups incl. depthwise, 1x1, non-square kernels, batch 1 and 3, more
 * images than weight-gradient chunks, non-contiguous inputs, every float dtype), under each
 * f32 implementation built in (im2col + GEMM, oneDNN); input, weight and bias gradients
 * against direct loops and nb_gradcheck; f32 and half backward vs f64; thread-count
 * independence (1 vs 2 threads bit for bit, forward and backward); the bf16 kernels (bf16
 * x, w, gy with f32 sums: against direct loops at the kernel and the op level, under
 * autocast through the casts, 1 vs 2 vs 3 threads bit for bit); the modules'
 * initialization and forward; and every class of user error. The pooling tests are in
 * test_nn_pool.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/backend.h"
#include "cpu/conv.h"
#include "test_nn_conv.h"
#include "testutil.h"

/* The f32 implementations built in: im2col + GEMM always, oneDNN's primitives when built in
 * (forced on for every size, so the small test shapes reach it too). */
static int conv_impls(nb__conv_impl *out) {
    int n = 0;
    out[n++] = NB__CONV_IM2COL;
    if (nb_gemm_provider_available(NB_GEMM_DNNL)) out[n++] = NB__CONV_DNNL;
    return n;
}
static const char *impl_name(nb__conv_impl i) { return i == NB__CONV_DNNL ? "dnnl" : "im2col"; }

/* ---- convolution: reference and configurations -------------------------------------------- */
typedef struct conv_cfg {
    int64_t N, C, H, W, O, KH, KW, sh, sw, ph, pw, dh, dw, groups;
    bool bias, noncontig;
} conv_cfg;

static const conv_cfg k_convs[] = {
    /* N  C  H   W  O KH KW sh sw ph pw dh dw g  bias  noncontig */
    {1, 1, 5, 5, 1, 3, 3, 1, 1, 0, 0, 1, 1, 1, false, false},   /* plain */
    {3, 2, 7, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, true, false},    /* pad 1, batch 3 */
    {2, 3, 8, 9, 5, 3, 2, 2, 2, 1, 0, 1, 1, 1, true, true},     /* stride 2, non-square */
    {2, 4, 9, 9, 6, 3, 3, 1, 2, 2, 2, 2, 2, 2, true, false},    /* dilation 2, groups 2 */
    {1, 4, 6, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 4, true, true},     /* depthwise */
    {3, 8, 5, 5, 8, 3, 3, 2, 1, 1, 1, 1, 1, 4, false, false},   /* groups 4, 2 out/group */
    {2, 6, 4, 5, 3, 1, 1, 1, 1, 0, 0, 1, 1, 1, true, true},     /* 1x1 (no im2col) */
    {2, 6, 4, 5, 4, 1, 1, 1, 1, 0, 0, 1, 1, 2, true, false},    /* grouped 1x1 */
    {1, 3, 5, 7, 2, 1, 1, 2, 2, 1, 1, 1, 1, 1, true, false},    /* 1x1, stride 2, padded */
    {3, 2, 10, 10, 3, 5, 3, 3, 2, 2, 1, 1, 2, 1, true, true},   /* stride 3 */
    {1, 1, 3, 3, 2, 3, 3, 1, 1, 0, 0, 1, 1, 1, true, false},    /* 1x1 output */
    {2, 3, 4, 4, 2, 2, 2, 1, 1, 0, 2, 1, 1, 1, true, false},    /* padding only in W */
    {0, 2, 4, 4, 3, 3, 3, 1, 1, 0, 0, 1, 1, 1, true, false},    /* empty batch */
    {6, 16, 12, 12, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, true, false}, /* big enough for threads */
    {37, 2, 5, 4, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, true, true},     /* > 1 image per dW chunk */
    /* few taps (the direct kernels, cpu/conv_direct.c): a CNN's first layer, rows of 28
     * (a full and a masked vector block), and of 41 (several blocks, a short tail) */
    {5, 1, 28, 28, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, true, false},
    {3, 1, 6, 41, 3, 3, 3, 1, 1, 1, 2, 1, 1, 1, true, true},
};
#define N_CONVS ((int)(sizeof k_convs / sizeof k_convs[0]))

static int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
    return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

static void conv_shapes(const conv_cfg *c, int64_t xs[4], int64_t ws[4], int64_t ys[4]) {
    int64_t x[4] = {c->N, c->C, c->H, c->W}, w[4] = {c->O, c->C / c->groups, c->KH, c->KW};
    int64_t y[4] = {c->N, c->O, conv_out(c->H, c->KH, c->sh, c->ph, c->dh),
                    conv_out(c->W, c->KW, c->sw, c->pw, c->dw)};
    memcpy(xs, x, sizeof x), memcpy(ws, w, sizeof w), memcpy(ys, y, sizeof y);
}

/* The direct 7-deep loop, in double. */
static double *ref_conv(const conv_cfg *c, const double *x, const double *w, const double *b) {
    int64_t xs[4], ws[4], ys[4];
    conv_shapes(c, xs, ws, ys);
    int64_t Cg = c->C / c->groups, Og = c->O / c->groups, OH = ys[2], OW = ys[3];
    double *y = calloc((size_t)(tu_numel(ys, 4) + 1), sizeof(double));
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t o = 0; o < c->O; o++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    double s = b ? b[o] : 0;
                    int64_t g = o / Og;
                    for (int64_t ci = 0; ci < Cg; ci++)
                        for (int64_t ki = 0; ki < c->KH; ki++)
                            for (int64_t kj = 0; kj < c->KW; kj++) {
                                int64_t ih = oh * c->sh - c->ph + ki * c->dh;
                                int64_t iw = ow * c->sw - c->pw + kj * c->dw;
                                if (ih < 0 || ih >= c->H || iw < 0 || iw >= c->W) continue;
                                s += x[((n * c->C + g * Cg + ci) * c->H + ih) * c->W + iw] *
                                     w[((o * Cg + ci) * c->KH + ki) * c->KW + kj];
                            }
                    y[((n * c->O + o) * OH + oh) * OW + ow] = s;
                }
    return y;
}

static nb_tensor *run_conv(const conv_cfg *c, nb_tensor *x, nb_tensor *w, nb_tensor *b) {
    return nb_conv2d(x, w, b, (int64_t[]){c->sh, c->sw}, (int64_t[]){c->ph, c->pw},
                     (int64_t[]){c->dh, c->dw}, c->groups);
}

START_TEST(test_conv2d_forward) {
    nb__conv_impl impls[2];
    int nimpl = conv_impls(impls);
    for (int ii = 0; ii < nimpl; ii++)
    for (int di = 0; di < 4; di++) {
        nb__conv2d_set_impl(impls[ii]);
        nb_dtype dt = k_float_dtypes[di];
        for (int i = 0; i < N_CONVS; i++) {
            const conv_cfg *c = &k_convs[i];
            /* Half types: a few configurations are enough (same code after conversion). */
            if ((dt == NB_F16 || dt == NB_BF16) && i % 4 != 1) continue;
            nb_scope_begin();
            int64_t xs[4], ws[4], ys[4];
            conv_shapes(c, xs, ws, ys);
            nb_tensor *x = tu_random(xs, 4, dt, -1, 1, 100 + i);
            nb_tensor *w = tu_random(ws, 4, dt, -1, 1, 200 + i);
            nb_tensor *b = c->bias ? tu_random(&c->O, 1, dt, -1, 1, 300 + i) : NULL;
            if (c->noncontig) x = tu_noncontig(x), w = tu_noncontig(w);
            double *vx = tu_values(x), *vw = tu_values(w), *vb = b ? tu_values(b) : NULL;
            double *ref = ref_conv(c, vx, vw, vb);
            nb_tensor *y = run_conv(c, x, w, b);
            ck_assert_msg(y != NULL, "config %d %s %s: %s", i, nb_dtype_name(dt),
                          impl_name(impls[ii]), nb_last_error());
            ck_assert_int_eq(nb_tensor_dtype(y), dt);
            /* Sums of up to ~150 products of values in [-1, 1]. */
            double tol = dt == NB_F32 ? 1e-5 : dt == NB_F64 ? 1e-12 : tu_tol(dt);
            tu_assert_close(y, ref, ys, 4, tol);
            free(vx), free(vw), free(vb), free(ref);
            nb_scope_end();
        }
    }
    nb__conv2d_set_impl(NB__CONV_AUTO);
}
END_TEST

/* ---- gradients ------------------------------------------------------------------------------- */
typedef struct conv_ctx {
    const conv_cfg *c;
    bool transpose_x; /* build a non-contiguous x inside f */
} conv_ctx;

static nb_tensor *conv_f(nb_tensor *const *in, int n, void *ctx) {
    const conv_ctx *k = ctx;
    nb_tensor *x = in[0];
    if (k->transpose_x) x = nb_transpose(x, 2, 3); /* in[0] is stored (N, C, W, H) */
    return run_conv(k->c, x, in[1], n > 2 ? in[2] : NULL);
}

START_TEST(test_conv2d_gradcheck) {
    static const conv_cfg cfgs[] = {
        {2, 2, 4, 4, 2, 3, 3, 1, 1, 1, 1, 1, 1, 1, true, false},
        {1, 2, 5, 4, 2, 2, 3, 2, 1, 1, 0, 2, 1, 1, true, false},  /* stride, dilation */
        {2, 4, 3, 3, 4, 2, 2, 1, 1, 0, 1, 1, 1, 2, true, false},  /* groups 2 */
        {1, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 3, true, false},  /* depthwise */
        {2, 3, 2, 3, 2, 1, 1, 1, 1, 0, 0, 1, 1, 1, true, false},  /* 1x1 */
    };
    for (int i = 0; i < 5; i++) {
        const conv_cfg *c = &cfgs[i];
        for (int variant = 0; variant < 4; variant++) {
            /* 0: x, w, b; 1: only w (first layer); 2: only x; 3: non-contiguous x, no bias */
            if (variant == 3 && i > 1) continue;
            nb_scope_begin();
            int64_t xs[4], ws[4], ys[4];
            conv_shapes(c, xs, ws, ys);
            conv_ctx k = {c, variant == 3};
            if (k.transpose_x) {
                int64_t t = xs[2];
                xs[2] = xs[3], xs[3] = t;
            }
            nb_tensor *x = tu_random(xs, 4, NB_F64, -1, 1, 10 + i);
            nb_tensor *w = tu_random(ws, 4, NB_F64, -1, 1, 20 + i);
            nb_tensor *b = tu_random(&c->O, 1, NB_F64, -1, 1, 30 + i);
            ck_assert(nb_set_requires_grad(x, variant != 1) == NB_OK);
            ck_assert(nb_set_requires_grad(w, variant != 2) == NB_OK);
            ck_assert(nb_set_requires_grad(b, variant == 0) == NB_OK);
            nb_status st = nb_gradcheck(conv_f, (nb_tensor *[]){x, w, b}, variant == 3 ? 2 : 3,
                                        &k, NULL);
            ck_assert_msg(st == NB_OK, "config %d variant %d: %s", i, variant, nb_last_error());
            nb_scope_end();
        }
    }
}
END_TEST

/* Gradients of sum(conv(x, w, b) * r) for x, w, b of dtype dt, as f64 arrays. */
static void conv_grads(const conv_cfg *c, nb_dtype dt, double *out[3]) {
    nb_scope_begin();
    int64_t xs[4], ws[4], ys[4];
    conv_shapes(c, xs, ws, ys);
    nb_tensor *x = tu_random(xs, 4, dt, -1, 1, 1);
    nb_tensor *w = tu_random(ws, 4, dt, -1, 1, 2);
    nb_tensor *b = tu_random(&c->O, 1, dt, -1, 1, 3);
    nb_tensor *r = tu_random(ys, 4, dt, -1, 1, 4);
    nb_tensor *ins[3] = {x, w, b};
    for (int i = 0; i < 3; i++) ck_assert(nb_set_requires_grad(ins[i], true) == NB_OK);
    nb_tensor *y = run_conv(c, x, w, b);
    ck_assert_msg(y && backward_with(y, r) == NB_OK, "%s", nb_last_error());
    for (int i = 0; i < 3; i++) {
        ck_assert(nb_grad(ins[i]) != NULL);
        ck_assert_int_eq(nb_tensor_dtype(nb_grad(ins[i])), dt);
        out[i] = tu_values(nb_grad(ins[i]));
    }
    nb_scope_end();
}

/* d(sum(y * r))/d(x, w, b) by direct loops, in double. */
static void ref_conv_backward(const conv_cfg *c, const double *x, const double *w,
                              const double *r, double *gx, double *gw, double *gb) {
    int64_t xs[4], ws[4], ys[4];
    conv_shapes(c, xs, ws, ys);
    int64_t Cg = c->C / c->groups, Og = c->O / c->groups, OH = ys[2], OW = ys[3];
    memset(gx, 0, sizeof(double) * (size_t)tu_numel(xs, 4));
    memset(gw, 0, sizeof(double) * (size_t)tu_numel(ws, 4));
    memset(gb, 0, sizeof(double) * (size_t)c->O);
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t o = 0; o < c->O; o++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    double g = r[((n * c->O + o) * OH + oh) * OW + ow];
                    gb[o] += g;
                    for (int64_t ci = 0; ci < Cg; ci++)
                        for (int64_t ki = 0; ki < c->KH; ki++)
                            for (int64_t kj = 0; kj < c->KW; kj++) {
                                int64_t ih = oh * c->sh - c->ph + ki * c->dh;
                                int64_t iw = ow * c->sw - c->pw + kj * c->dw;
                                if (ih < 0 || ih >= c->H || iw < 0 || iw >= c->W) continue;
                                int64_t xi = ((n * c->C + o / Og * Cg + ci) * c->H + ih) * c->W + iw;
                                int64_t wi = ((o * Cg + ci) * c->KH + ki) * c->KW + kj;
                                gx[xi] += g * w[wi];
                                gw[wi] += g * x[xi];
                            }
                }
}

START_TEST(test_conv2d_backward_reference) {
    /* f64 (im2col + GEMM), then f32 under each implementation. */
    nb__conv_impl impls[2];
    int nimpl = conv_impls(impls);
    for (int pass = 0; pass <= nimpl; pass++)
    for (int i = 0; i < N_CONVS * 3; i++) {
        /* variant 0: all inputs require grad; 1: only w and b (a first layer); 2: only x */
        const conv_cfg *c = &k_convs[i % N_CONVS];
        int variant = i / N_CONVS;
        nb_dtype dt = pass == 0 ? NB_F64 : NB_F32;
        if (pass > 0) nb__conv2d_set_impl(impls[pass - 1]);
        double tol = pass == 0 ? 1e-12 : 2e-5;
        nb_scope_begin();
        int64_t xs[4], ws[4], ys[4];
        conv_shapes(c, xs, ws, ys);
        nb_tensor *x = tu_random(xs, 4, dt, -1, 1, 500 + i);
        nb_tensor *w = tu_random(ws, 4, dt, -1, 1, 600 + i);
        nb_tensor *b = tu_random(&c->O, 1, dt, -1, 1, 700 + i);
        nb_tensor *r = tu_random(ys, 4, dt, -1, 1, 800 + i);
        if (c->noncontig) x = tu_noncontig(x), w = tu_noncontig(w), r = tu_noncontig(r);
        nb_tensor *ins[3] = {x, w, b};
        bool req[3] = {variant != 1, variant != 2, variant != 2};
        for (int k = 0; k < 3; k++) ck_assert(nb_set_requires_grad(ins[k], req[k]) == NB_OK);
        nb_tensor *y = run_conv(c, x, w, c->bias ? b : NULL);
        ck_assert_msg(y && backward_with(y, r) == NB_OK, "config %d pass %d: %s", i, pass,
                      nb_last_error());
        double *vx = tu_values(x), *vw = tu_values(w), *vr = tu_values(r);
        double *gx = malloc(sizeof(double) * (size_t)(tu_numel(xs, 4) + 1));
        double *gw = malloc(sizeof(double) * (size_t)(tu_numel(ws, 4) + 1));
        double *gb = malloc(sizeof(double) * (size_t)c->O);
        ref_conv_backward(c, vx, vw, vr, gx, gw, gb);
        if (req[0]) tu_assert_close(nb_grad(x), gx, xs, 4, tol);
        else ck_assert(nb_grad(x) == NULL);
        if (req[1]) tu_assert_close(nb_grad(w), gw, ws, 4, tol);
        else ck_assert(nb_grad(w) == NULL);
        if (c->bias && req[2]) tu_assert_close(nb_grad(b), gb, &c->O, 1, tol);
        else ck_assert(nb_grad(b) == NULL);
        free(vx), free(vw), free(vr), free(gx), free(gw), free(gb);
        nb_scope_end();
    }
    nb__conv2d_set_impl(NB__CONV_AUTO);
}
END_TEST

START_TEST(test_conv2d_backward_f32_vs_f64) {
    const conv_cfg *cs[] = {&k_convs[1], &k_convs[3], &k_convs[5], &k_convs[13]};
    for (int i = 0; i < 4; i++) {
        const conv_cfg *c = cs[i];
        int64_t xs[4], ws[4], ys[4];
        conv_shapes(c, xs, ws, ys);
        double *g64[3], *g32[3];
        conv_grads(c, NB_F64, g64);
        conv_grads(c, NB_F32, g32);
        /* f32 inputs are the f64 values rounded: compare against f64 with f32 tolerance
         * scaled by the sum lengths (up to N*OH*OW terms for dW and db). */
        nb_scope_begin();
        const int64_t *shapes[3] = {xs, ws, &c->O};
        int nds[3] = {4, 4, 1};
        for (int k = 0; k < 3; k++) {
            nb_tensor *t = tu_tensor(g32[k], shapes[k], nds[k], NB_F64);
            tu_assert_close(t, g64[k], shapes[k], nds[k], 2e-4);
            free(g64[k]), free(g32[k]);
        }
        nb_scope_end();
    }
}
END_TEST

START_TEST(test_conv2d_half_backward) {
    /* bf16 / f16 inputs: gradients come back in the input dtype, close to f64's. */
    const conv_cfg *c = &k_convs[1];
    int64_t xs[4], ws[4], ys[4];
    conv_shapes(c, xs, ws, ys);
    double *g64[3];
    conv_grads(c, NB_F64, g64);
    nb_dtype halves[2] = {NB_F16, NB_BF16};
    for (int h = 0; h < 2; h++) {
        double *gh[3];
        conv_grads(c, halves[h], gh);
        nb_scope_begin();
        const int64_t *shapes[3] = {xs, ws, &c->O};
        int nds[3] = {4, 4, 1};
        for (int k = 0; k < 3; k++) {
            /* Inputs rounded to half: compare loosely (relative to the gradient's scale). */
            nb_tensor *t = tu_tensor(gh[k], shapes[k], nds[k], NB_F64);
            tu_assert_close(t, g64[k], shapes[k], nds[k], halves[h] == NB_BF16 ? 0.1 : 0.02);
            free(gh[k]);
        }
        nb_scope_end();
    }
    for (int k = 0; k < 3; k++) free(g64[k]);
}
END_TEST

/* Forward output and the three gradients as raw f32 values (read back through nb_read, so
 * on any device), with n threads. */
static void conv_run_threads_dt(const conv_cfg *c, nb_dtype dt, int threads, float *out[4],
                                int64_t sizes[4]) {
    nb_set_num_threads(threads);
    nb_scope_begin();
    int64_t xs[4], ws[4], ys[4];
    conv_shapes(c, xs, ws, ys);
    nb_tensor *x = tu_random(xs, 4, dt, -1, 1, 7);
    nb_tensor *w = tu_random(ws, 4, dt, -1, 1, 8);
    nb_tensor *b = tu_random(&c->O, 1, dt, -1, 1, 9);
    nb_tensor *r = tu_random(ys, 4, dt, -1, 1, 10);
    nb_tensor *ins[3] = {x, w, b};
    for (int i = 0; i < 3; i++) ck_assert(nb_set_requires_grad(ins[i], true) == NB_OK);
    nb_tensor *y = run_conv(c, x, w, b);
    ck_assert(backward_with(y, r) == NB_OK);
    nb_tensor *ts[4] = {y, nb_grad(x), nb_grad(w), nb_grad(b)};
    for (int i = 0; i < 4; i++) {
        sizes[i] = nb_numel(ts[i]);
        out[i] = malloc(sizeof(float) * (size_t)sizes[i]);
        ck_assert_msg(nb_read(ts[i], out[i], sizes[i], NB_F32) == NB_OK, "%s",
                      nb_last_error());
    }
    nb_scope_end();
}

static void conv_run_threads(const conv_cfg *c, int threads, float *out[4], int64_t sizes[4]) {
    conv_run_threads_dt(c, NB_F32, threads, out, sizes);
}

START_TEST(test_conv2d_thread_independent) {
    int saved = nb_get_num_threads();
    static const conv_cfg cfgs[] = {
        {6, 16, 12, 12, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, true, false},
        {5, 8, 14, 14, 8, 1, 1, 1, 1, 0, 0, 1, 1, 2, true, false},   /* 1x1 grouped */
        {17, 8, 16, 16, 16, 3, 3, 2, 2, 1, 1, 1, 1, 1, true, false}, /* 17 images, 16 parts */
        {4, 16, 12, 12, 16, 3, 3, 1, 1, 1, 1, 1, 1, 16, true, false}, /* depthwise */
        {19, 1, 28, 28, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, true, false},   /* direct kernels */
    };
    nb__conv_impl impls[3] = {NB__CONV_AUTO};
    int nimpl = 1 + conv_impls(impls + 1);
    for (int ii = 0; ii < nimpl; ii++)
    for (int i = 0; i < (int)(sizeof cfgs / sizeof cfgs[0]); i++) {
        nb__conv2d_set_impl(impls[ii]);
        float *a[4], *b[4];
        int64_t na[4], nb[4];
        conv_run_threads(&cfgs[i], 1, a, na);
        conv_run_threads(&cfgs[i], 2, b, nb);
        for (int k = 0; k < 4; k++) {
            ck_assert_int_eq(na[k], nb[k]);
            ck_assert_msg(memcmp(a[k], b[k], sizeof(float) * (size_t)na[k]) == 0,
                          "config %d, tensor %d differs between 1 and 2 threads (impl %d)", i,
                          k, (int)impls[ii]);
            free(a[k]), free(b[k]);
        }
    }
    nb_set_num_threads(saved);
    nb__conv2d_set_impl(NB__CONV_AUTO);
}
END_TEST

/* ---- bf16 ------------------------------------------------------------------------------------ */
/* n bf16 values uniform in [-1, 1] (a fixed sequence from seed) and their exact doubles. */
static uint16_t *bf16_random(int64_t n, unsigned seed, double **vals) {
    uint16_t *h = malloc(sizeof(uint16_t) * (size_t)(n + 1));
    *vals = malloc(sizeof(double) * (size_t)(n + 1));
    uint64_t st = 0x9e3779b97f4a7c15ull * (seed + 1);
    for (int64_t i = 0; i < n; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        float f = (float)((double)(st >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        h[i] = nb_f32_to_bf16(f);
        (*vals)[i] = nb_bf16_to_f32(h[i]);
    }
    return h;
}

/* |got - ref| <= tol * (1 + |ref|) for n values. */
static void assert_near(const char *what, int cfg, const double *got, const double *ref,
                        int64_t n, double tol) {
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(fabs(got[i] - ref[i]) <= tol * (1 + fabs(ref[i])),
                      "config %d %s[%lld] = %.9g, expected %.9g", cfg, what, (long long)i,
                      got[i], ref[i]);
}

START_TEST(test_conv2d_bf16_kernel) {
    /* The CPU kernels called with NB_BF16 (bf16 x, w, gy; f32 bias and weight/bias
     * gradients; bf16 y and gx) against direct loops over the same bf16 values, under each
     * implementation (im2col: widened to f32; dnnl forced on for every size: oneDNN's bf16
     * convolution and the bf16 GEMM where nb_conv_bf16_native()). Products of bf16 values
     * are exact in f32, so the error is the f32 sums plus one rounding to bf16 (2^-9). */
    const nb__kernels *k = &nb__cpu_backend()->k;
    nb__conv_impl impls[2];
    int nimpl = conv_impls(impls);
    for (int ii = 0; ii < nimpl; ii++)
    for (int i = 0; i < N_CONVS; i++) {
        nb__conv2d_set_impl(impls[ii]);
        const conv_cfg *c = &k_convs[i];
        int64_t xs[4], ws[4], ys[4];
        conv_shapes(c, xs, ws, ys);
        int64_t nx = tu_numel(xs, 4), nw = tu_numel(ws, 4), ny = tu_numel(ys, 4);
        double *vx, *vw, *vr, *vb = malloc(sizeof(double) * (size_t)c->O);
        uint16_t *x = bf16_random(nx, 40 + (unsigned)i, &vx);
        uint16_t *w = bf16_random(nw, 50 + (unsigned)i, &vw);
        uint16_t *r = bf16_random(ny, 60 + (unsigned)i, &vr);
        float *b = malloc(sizeof(float) * (size_t)c->O);
        for (int64_t o = 0; o < c->O; o++) b[o] = (float)(0.25 * (double)(o % 5) - 0.5), vb[o] = b[o];
        uint16_t *y = malloc(sizeof(uint16_t) * (size_t)(ny + 1));
        uint16_t *gx = malloc(sizeof(uint16_t) * (size_t)(nx + 1));
        float *gw = malloc(sizeof(float) * (size_t)(nw + 1)), *gb = malloc(sizeof(float) * (size_t)c->O);
        nb__conv2d_geom g = {.N = c->N, .C = c->C, .H = c->H, .W = c->W, .O = c->O, .KH = c->KH,
                             .KW = c->KW, .OH = ys[2], .OW = ys[3], .sh = c->sh, .sw = c->sw,
                             .ph = c->ph, .pw = c->pw, .dh = c->dh, .dw = c->dw,
                             .groups = c->groups};
        nb__conv2d_args fa = {.g = g, .dtype = NB_BF16, .x = x, .w = w, .b = c->bias ? b : NULL,
                              .y = y};
        ck_assert_msg(k->conv2d(&fa) == NB_OK, "config %d: %s", i, nb_last_error());
        nb__conv2d_backward_args ba = {.g = g, .dtype = NB_BF16, .x = x, .w = w, .gy = r,
                                       .gx = gx, .gw = gw, .gb = gb};
        ck_assert_msg(k->conv2d_backward(&ba) == NB_OK, "config %d: %s", i, nb_last_error());
        double *ref = ref_conv(c, vx, vw, c->bias ? vb : NULL);
        double *rgx = malloc(sizeof(double) * (size_t)(nx + 1));
        double *rgw = malloc(sizeof(double) * (size_t)(nw + 1));
        double *rgb = malloc(sizeof(double) * (size_t)c->O);
        ref_conv_backward(c, vx, vw, vr, rgx, rgw, rgb);
        double *got = malloc(sizeof(double) * (size_t)(nx + nw + ny + c->O + 1));
        for (int64_t j = 0; j < ny; j++) got[j] = nb_bf16_to_f32(y[j]);
        assert_near("y", i, got, ref, ny, 4e-3);
        for (int64_t j = 0; j < nx; j++) got[j] = nb_bf16_to_f32(gx[j]);
        assert_near("gx", i, got, rgx, nx, 4e-3);
        for (int64_t j = 0; j < nw; j++) got[j] = gw[j];
        assert_near("gw", i, got, rgw, nw, 1e-5);
        for (int64_t j = 0; j < c->O; j++) got[j] = gb[j];
        assert_near("gb", i, got, rgb, c->O, 1e-5);
        free(got), free(ref), free(rgx), free(rgw), free(rgb);
        free(x), free(w), free(r), free(b), free(y), free(gx), free(gw), free(gb);
        free(vx), free(vw), free(vr), free(vb);
    }
    nb__conv2d_set_impl(NB__CONV_AUTO);
}
END_TEST

START_TEST(test_conv2d_bf16_path) {
    /* nb_conv_bf16_native / _path say how bf16 convolutions run, and agree; NB_CONV=im2col
     * turns the native path off (the f32 code then widens every bf16 convolution). */
    bool native = nb_conv_bf16_native();
    const char *path = nb_conv_bf16_path();
    ck_assert(path != NULL);
    ck_assert_msg(native == (strstr(path, "dnnl convolution bf16") == path), "%d: %s", native,
                  path);
    if (!native) ck_assert(strstr(path, "f32 convolution after conversion") == path);
    nb__conv2d_set_impl(NB__CONV_IM2COL);
    ck_assert(!nb_conv_bf16_native());
    ck_assert(strstr(nb_conv_bf16_path(), "NB_CONV=im2col") != NULL || !nb_gemm_provider_available(NB_GEMM_DNNL));
    nb__conv2d_set_impl(NB__CONV_AUTO);
    ck_assert(nb_conv_bf16_native() == native);
}
END_TEST

START_TEST(test_conv2d_bf16_autocast) {
    /* Under autocast bf16, f32 leaves: y is bf16, the gradients come back through the casts
     * as f32, and match direct loops over the bf16-rounded values (gx and the weight
     * gradient are each rounded to bf16 once: PyTorch's autocast rounds them too). */
    nb__conv_impl impls[2];
    int nimpl = conv_impls(impls);
    const conv_cfg *cs[] = {&k_convs[1], &k_convs[3], &k_convs[6], &k_convs[13], &k_convs[14]};
    for (int ii = 0; ii < nimpl; ii++)
    for (int i = 0; i < 5; i++) {
        nb__conv2d_set_impl(impls[ii]);
        const conv_cfg *c = cs[i];
        nb_scope_begin();
        int64_t xs[4], ws[4], ys[4];
        conv_shapes(c, xs, ws, ys);
        nb_tensor *x = tu_random(xs, 4, NB_F32, -1, 1, 70 + i);
        nb_tensor *w = tu_random(ws, 4, NB_F32, -1, 1, 71 + i);
        nb_tensor *b = tu_random(&c->O, 1, NB_F32, -1, 1, 72 + i);
        nb_tensor *r = tu_random(ys, 4, NB_BF16, -1, 1, 73 + i);
        nb_tensor *ins[3] = {x, w, b};
        for (int j = 0; j < 3; j++) ck_assert(nb_set_requires_grad(ins[j], true) == NB_OK);
        ck_assert(nb_autocast_begin(NB_BF16) == NB_OK);
        nb_tensor *y = run_conv(c, x, w, b);
        ck_assert(nb_autocast_end() == NB_OK);
        ck_assert_msg(y != NULL, "%s", nb_last_error());
        ck_assert_int_eq(nb_tensor_dtype(y), NB_BF16);
        ck_assert_msg(backward_with(y, r) == NB_OK, "%s", nb_last_error());
        for (int j = 0; j < 3; j++) ck_assert_int_eq(nb_tensor_dtype(nb_grad(ins[j])), NB_F32);
        /* the reference: the bf16-rounded x, w and the f32 bias (the kernel's bias is f32,
         * but autocast rounds b to bf16 first) */
        nb_tensor *xb = nb_to_dtype(x, NB_BF16), *wb = nb_to_dtype(w, NB_BF16);
        nb_tensor *bb = nb_to_dtype(b, NB_BF16);
        double *vx = tu_values(xb), *vw = tu_values(wb), *vb = tu_values(bb), *vr = tu_values(r);
        double *ref = ref_conv(c, vx, vw, vb);
        tu_assert_close(y, ref, ys, 4, 4e-3);
        double *gx = malloc(sizeof(double) * (size_t)(tu_numel(xs, 4) + 1));
        double *gw = malloc(sizeof(double) * (size_t)(tu_numel(ws, 4) + 1));
        double *gb = malloc(sizeof(double) * (size_t)c->O);
        ref_conv_backward(c, vx, vw, vr, gx, gw, gb);
        tu_assert_close(nb_grad(x), gx, xs, 4, 4e-3);
        tu_assert_close(nb_grad(w), gw, ws, 4, 4e-3);
        tu_assert_close(nb_grad(b), gb, &c->O, 1, 4e-3);
        free(vx), free(vw), free(vb), free(vr), free(ref), free(gx), free(gw), free(gb);
        nb_scope_end();
    }
    nb__conv2d_set_impl(NB__CONV_AUTO);
}
END_TEST

START_TEST(test_conv2d_bf16_thread_independent) {
    /* The bf16 kernels give the same bits at 1, 2 and 3 threads (forward, all gradients). */
    int saved = nb_get_num_threads();
    static const conv_cfg cfgs[] = {
        {6, 16, 12, 12, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, true, false},
        {5, 8, 14, 14, 8, 1, 1, 1, 1, 0, 0, 1, 1, 2, true, false},    /* 1x1 grouped */
        {17, 8, 16, 16, 16, 3, 3, 2, 2, 1, 1, 1, 1, 1, true, false},  /* 17 images, 16 parts */
        {4, 16, 12, 12, 16, 3, 3, 1, 1, 1, 1, 1, 1, 16, true, false}, /* depthwise */
        {8, 32, 14, 14, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, true, false},  /* a CNN's second layer */
    };
    nb__conv_impl impls[3] = {NB__CONV_AUTO};
    int nimpl = 1 + conv_impls(impls + 1);
    for (int ii = 0; ii < nimpl; ii++)
    for (int i = 0; i < 5; i++) {
        nb__conv2d_set_impl(impls[ii]);
        float *a[4], *b[4];
        int64_t na[4], nb[4];
        conv_run_threads_dt(&cfgs[i], NB_BF16, 1, a, na);
        for (int t = 2; t <= 3; t++) {
            conv_run_threads_dt(&cfgs[i], NB_BF16, t, b, nb);
            for (int k = 0; k < 4; k++) {
                ck_assert_int_eq(na[k], nb[k]);
                ck_assert_msg(memcmp(a[k], b[k], sizeof(float) * (size_t)na[k]) == 0,
                              "config %d, tensor %d differs between 1 and %d threads (impl %d)",
                              i, k, t, (int)impls[ii]);
                free(b[k]);
            }
        }
        for (int k = 0; k < 4; k++) free(a[k]);
    }
    nb_set_num_threads(saved);
    nb__conv2d_set_impl(NB__CONV_AUTO);
}
END_TEST

/* ---- the Conv2d module ------------------------------------------------------------------------ */
START_TEST(test_conv2d_module) {
    nb_scope_begin();
    nb_generator *gen = nb_generator_new(42);
    nb_conv2d_opts cvo = nb_conv2d_defaults();
    cvo.stride[0] = 1, cvo.stride[1] = 1, cvo.dilation[0] = 1, cvo.dilation[1] = 1, cvo.groups = 2;
    cvo.padding[0] = 1, cvo.padding[1] = 2, cvo.gen = gen;
    nb_module *m = nb_conv2d_new(8, 16, 3, 5, &cvo);
    ck_assert_msg(m != NULL, "%s", nb_last_error());
    ck_assert_str_eq(nb_module_type(m), "Conv2d");
    nb_tensor *w = nb_module_param(m, "weight"), *b = nb_module_param(m, "bias");
    ck_assert(w && b);
    ck_assert(nb_requires_grad(w) && nb_requires_grad(b));
    int64_t wshape[4] = {16, 4, 3, 5};
    for (int i = 0; i < 4; i++) ck_assert_int_eq(nb_shape(w)[i], wshape[i]);
    ck_assert_int_eq(nb_ndim(b), 1);
    ck_assert_int_eq(nb_shape(b)[0], 16);
    ck_assert_int_eq(nb_num_parameters(m), 16 * 4 * 3 * 5 + 16);
    /* U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = 4*3*5 = 60: bounds, mean and spread. */
    double bound = 1 / sqrt(60.0), *v = tu_values(w);
    double lo = 1, hi = -1, mean = 0, sq = 0;
    int64_t n = nb_numel(w);
    for (int64_t i = 0; i < n; i++) {
        lo = fmin(lo, v[i]), hi = fmax(hi, v[i]);
        mean += v[i], sq += v[i] * v[i];
    }
    mean /= (double)n;
    double sd = sqrt(sq / (double)n - mean * mean);
    ck_assert(lo >= -bound && hi <= bound);
    ck_assert(lo < -0.9 * bound && hi > 0.9 * bound);
    ck_assert(fabs(mean) < 0.1 * bound);
    ck_assert(fabs(sd - bound / sqrt(3.0)) < 0.1 * bound);
    free(v);
    v = tu_values(b);
    for (int i = 0; i < 16; i++) ck_assert(fabs(v[i]) <= bound);
    free(v);
    /* The same seed gives the same weights. */
    nb_generator *gen2 = nb_generator_new(42);
    nb_conv2d_opts cvo2 = nb_conv2d_defaults();
    cvo2.stride[0] = 1, cvo2.stride[1] = 1, cvo2.dilation[0] = 1, cvo2.dilation[1] = 1;
    cvo2.groups = 2, cvo2.padding[0] = 1, cvo2.padding[1] = 2, cvo2.gen = gen2;
    nb_module *m2 = nb_conv2d_new(8, 16, 3, 5, &cvo2);
    double *v1 = tu_values(w);
    tu_assert_close(nb_module_param(m2, "weight"), v1, wshape, 4, 0);
    free(v1);
    /* Forward = the functional form with the module's options. */
    nb_tensor *x = tu_random((int64_t[]){2, 8, 6, 7}, 4, NB_F32, -1, 1, 5);
    nb_tensor *y = nb_forward(m, x);
    nb_tensor *yr = nb_conv2d(x, w, b, NULL, (int64_t[]){1, 2}, NULL, 2);
    ck_assert(y && yr);
    double *vr = tu_values(yr);
    tu_assert_close(y, vr, nb_shape(yr), 4, 0);
    free(vr);
    /* A backward through the module reaches its parameters. */
    ck_assert(backward_with(y, nb_ones_like(y)) == NB_OK);
    ck_assert(nb_grad(w) && nb_grad(b));
    /* No bias; stride and dilation. */
    nb_conv2d_opts c3 = nb_conv2d_defaults();
    c3.no_bias = true;
    c3.stride[0] = c3.stride[1] = 2;
    c3.dilation[0] = 2;
    nb_module *m3 = nb_conv2d_new(3, 4, 3, 3, &c3);
    ck_assert(m3 && !nb_module_param(m3, "bias"));
    nb_tensor *y3 = nb_forward(m3, tu_random((int64_t[]){1, 3, 9, 9}, 4, NB_F32, -1, 1, 6));
    ck_assert(y3 && nb_shape(y3)[2] == 3 && nb_shape(y3)[3] == 4);
    nb_module_free(m), nb_module_free(m2), nb_module_free(m3);
    nb_generator_free(gen), nb_generator_free(gen2);
    nb_scope_end();
}
END_TEST

START_TEST(test_conv2d_errors) {
    nb_scope_begin();
    nb_tensor *x = tu_random((int64_t[]){2, 4, 6, 6}, 4, NB_F32, -1, 1, 1);
    nb_tensor *w = tu_random((int64_t[]){8, 4, 3, 3}, 4, NB_F32, -1, 1, 2);
    nb_tensor *b = tu_random((int64_t[]){8}, 1, NB_F32, -1, 1, 3);
    nb_tensor *x3 = tu_random((int64_t[]){3, 28, 28}, 3, NB_F32, -1, 1, 4);
    tu_assert_error(nb_conv2d(x3, w, b, NULL, NULL, NULL, 1), NB_ESHAPE,
                    "conv2d: input must be 4-D (N, C, H, W), got [3,28,28]");
    tu_assert_error(nb_conv2d(x, x3, NULL, NULL, NULL, NULL, 1), NB_ESHAPE, "weight must be 4-D");
    nb_tensor *w5 = tu_random((int64_t[]){8, 5, 3, 3}, 4, NB_F32, -1, 1, 2);
    tu_assert_error(nb_conv2d(x, w5, b, NULL, NULL, NULL, 1), NB_ESHAPE, "input channels");
    tu_assert_error(nb_conv2d(x, w, b, NULL, NULL, NULL, 3), NB_EINVAL, "groups=3");
    tu_assert_error(nb_conv2d(x, w, b, NULL, NULL, NULL, 0), NB_EINVAL, "groups");
    tu_assert_error(nb_conv2d(x, w, b, NULL, NULL, NULL, 2), NB_ESHAPE, "input channels");
    tu_assert_error(nb_conv2d(x, w, b, (int64_t[]){0, 1}, NULL, NULL, 1), NB_EINVAL, "stride");
    tu_assert_error(nb_conv2d(x, w, b, NULL, (int64_t[]){-1, 0}, NULL, 1), NB_EINVAL,
                    "padding");
    tu_assert_error(nb_conv2d(x, w, b, NULL, NULL, (int64_t[]){1, 0}, 1), NB_EINVAL,
                    "dilation");
    nb_tensor *wbig = tu_random((int64_t[]){8, 4, 7, 3}, 4, NB_F32, -1, 1, 2);
    tu_assert_error(nb_conv2d(x, wbig, b, NULL, NULL, NULL, 1), NB_ESHAPE,
                    "larger than the padded input");
    tu_assert_error(nb_conv2d(x, w, b, NULL, NULL, (int64_t[]){3, 1}, 1), NB_ESHAPE,
                    "larger than the padded input");
    ck_assert(nb_conv2d(x, wbig, b, NULL, (int64_t[]){1, 0}, NULL, 1) != NULL);
    nb_tensor *b7 = tu_random((int64_t[]){7}, 1, NB_F32, -1, 1, 3);
    tu_assert_error(nb_conv2d(x, w, b7, NULL, NULL, NULL, 1), NB_ESHAPE, "bias");
    nb_tensor *w64 = tu_random((int64_t[]){8, 4, 3, 3}, 4, NB_F64, -1, 1, 2);
    tu_assert_error(nb_conv2d(x, w64, NULL, NULL, NULL, NULL, 1), NB_EDTYPE, "weight is f64");
    nb_tensor *xi = tu_random((int64_t[]){2, 4, 6, 6}, 4, NB_I32, -3, 3, 1);
    nb_tensor *wi = tu_random((int64_t[]){8, 4, 3, 3}, 4, NB_I32, -3, 3, 1);
    tu_assert_error(nb_conv2d(xi, wi, NULL, NULL, NULL, NULL, 1), NB_EDTYPE, "i32");
    tu_assert_error(nb_conv2d(NULL, w, b, NULL, NULL, NULL, 1), NB_ENULL, NULL);
    tu_assert_error(nb_conv2d(x, NULL, b, NULL, NULL, NULL, 1), NB_ENULL, NULL);
    /* Module constructor. */
    tu_assert_error(nb_conv2d_new(0, 4, 3, 3, NULL), NB_EINVAL, "positive");
    tu_assert_error(nb_conv2d_new(4, 4, 0, 3, NULL), NB_EINVAL, "positive");
    nb_conv2d_opts co = nb_conv2d_defaults();
    co.groups = 4;
    tu_assert_error(nb_conv2d_new(4, 6, 3, 3, &co), NB_EINVAL, "groups");
    co = nb_conv2d_defaults();
    co.padding[0] = -1;
    tu_assert_error(nb_conv2d_new(4, 4, 3, 3, &co), NB_EINVAL, "padding");
    nb_conv2d_opts cvo = nb_conv2d_defaults();
    cvo.padding[0] = 1, cvo.padding[1] = 1, cvo.stride[0] = cvo.stride[1] = 0;
    cvo.dilation[0] = cvo.dilation[1] = 0, cvo.groups = 0;
    /* options are read as written (issue 17 item 4): stride, dilation or groups 0 is an
     * error, not 1 */
    tu_assert_error(nb_conv2d_new(4, 4, 3, 3, &cvo), NB_EINVAL,
                    "stride and dilation must be positive");
    co = nb_conv2d_defaults();
    ck_assert(co.stride[0] == 1 && co.stride[1] == 1 && co.padding[0] == 0 &&
              co.padding[1] == 0 && co.dilation[0] == 1 && co.dilation[1] == 1 &&
              co.groups == 1 && !co.no_bias && !co.gen);
    co.groups = 0;
    tu_assert_error(nb_conv2d_new(4, 4, 3, 3, &co), NB_EINVAL, "groups");
    /* A module's forward reports the op's error. */
    nb_module *m = nb_conv2d_new(3, 4, 3, 3, NULL);
    tu_assert_error(nb_forward(m, x), NB_ESHAPE, "input channels");
    nb_module_free(m);
    nb_scope_end();
}
END_TEST

/* ---- devices: meta (shapes only) and guard (no host access to device memory) ---------------- */
#define GUARD ((nb_device){NB_DEVICE_GUARD, 0})

/* One op of the family on inputs in[0..n); ctx picks the op and its options. */
typedef struct dev_case {
    const char *what;
    int op; /* 0 conv2d, 1 maxpool2d, 2 avgpool2d, 3 adaptive_avgpool2d */
    int64_t k[2], s[2], p[2], groups;
    bool cip;
    nb_dtype dt;
    int64_t xs[4], ws[4]; /* ws[0] == 0: no weight (pools) */
    bool bias;
} dev_case;

static const dev_case k_dev_cases[] = {
    {"conv2d f32", 0, {0}, {1, 1}, {1, 1}, 1, false, NB_F32, {2, 3, 7, 6}, {4, 3, 3, 3}, true},
    {"conv2d f64 grouped strided", 0, {0}, {2, 1}, {0, 1}, 2, false, NB_F64, {2, 4, 7, 6},
     {6, 2, 3, 2}, false},
    {"conv2d 1x1 bf16", 0, {0}, {1, 1}, {0, 0}, 1, false, NB_BF16, {1, 4, 5, 5}, {2, 4, 1, 1},
     true},
    {"conv2d f32 larger", 0, {0}, {1, 1}, {1, 1}, 1, false, NB_F32, {4, 16, 12, 12},
     {16, 16, 3, 3}, true},
    {"maxpool2d 2x2", 1, {2, 2}, {2, 2}, {0, 0}, 0, false, NB_F32, {2, 3, 8, 6}, {0}, false},
    {"maxpool2d padded f64", 1, {3, 3}, {2, 2}, {1, 1}, 0, false, NB_F64, {2, 2, 7, 5}, {0},
     false},
    {"avgpool2d excl pad f16", 2, {3, 2}, {2, 1}, {1, 1}, 0, false, NB_F16, {1, 2, 7, 5}, {0},
     false},
    {"avgpool2d incl pad", 2, {2, 2}, {1, 1}, {1, 1}, 0, true, NB_F32, {2, 2, 5, 5}, {0}, false},
    {"adaptive_avgpool2d", 3, {3, 2}, {0}, {0}, 0, false, NB_F32, {2, 3, 7, 5}, {0}, false},
};
#define N_DEV_CASES ((int)(sizeof k_dev_cases / sizeof k_dev_cases[0]))

static int dev_ninputs(const dev_case *c) { return c->op == 0 ? (c->bias ? 3 : 2) : 1; }

static nb_tensor *dev_run(const dev_case *c, nb_tensor *const *in) {
    switch (c->op) {
    case 0: return nb_conv2d(in[0], in[1], c->bias ? in[2] : NULL, c->s, c->p, NULL,
                             c->groups);
    case 1: return nb_maxpool2d(in[0], c->k, c->s, c->p);
    case 2: return nb_avgpool2d(in[0], c->k, c->s, c->p, c->cip);
    default: return nb_adaptive_avgpool2d(in[0], c->k[0], c->k[1]);
    }
}

/* The case's CPU inputs (random, fixed seeds). */
static int dev_inputs(const dev_case *c, nb_tensor **in) {
    in[0] = tu_random(c->xs, 4, c->dt, -1, 1, 11);
    if (c->op == 0) {
        in[1] = tu_random(c->ws, 4, c->dt, -1, 1, 12);
        if (c->bias) in[2] = tu_random(c->ws, 1, c->dt, -1, 1, 13);
    }
    return dev_ninputs(c);
}

/* The case on copies of in[] on dev, as leaves that require grad, then a backward with a
 * fixed random gradient; y and the gradients come back on the CPU. */
static nb_tensor *dev_forward_backward(const dev_case *c, nb_device dev, nb_tensor *const *in,
                                       nb_tensor **grads) {
    nb_tensor *xs[3] = {NULL, NULL, NULL};
    int n = dev_ninputs(c);
    for (int i = 0; i < n; i++) {
        xs[i] = nb_detach(nb_to_device(in[i], dev));
        ck_assert_msg(xs[i] && nb_set_requires_grad(xs[i], true) == NB_OK, "%s", nb_last_error());
    }
    nb_tensor *y = dev_run(c, xs);
    ck_assert_msg(y != NULL, "%s on %d: %s", c->what, (int)dev.type, nb_last_error());
    ck_assert(nb_device_equal(nb_tensor_device(y), dev));
    nb_tensor *g = tu_random(nb_shape(y), nb_ndim(y), c->dt, -1, 1, 14);
    ck_assert_msg(backward_with(y, nb_to_device(g, dev)) == NB_OK, "%s: %s", c->what,
                  nb_last_error());
    for (int i = 0; i < n; i++) {
        ck_assert(nb_device_equal(nb_tensor_device(nb_grad(xs[i])), dev));
        grads[i] = nb_to_device(nb_grad(xs[i]), NB_CPU);
    }
    return nb_to_device(y, NB_CPU);
}

/* On the guard device every op gives the CPU's values and gradients bit for bit (the guard
 * runs the CPU kernels): the op definitions never touch device memory. */
START_TEST(test_conv_pool_guard) {
    nb__conv_impl impls[2];
    int nimpl = conv_impls(impls);
    for (int ii = 0; ii < nimpl; ii++)
    for (int i = 0; i < N_DEV_CASES; i++) {
        const dev_case *c = &k_dev_cases[i];
        if (ii > 0 && c->op != 0) continue;
        nb__conv2d_set_impl(impls[ii]);
        nb_scope_begin();
        nb_tensor *in[3], *gc[3], *gg[3];
        int n = dev_inputs(c, in);
        nb_tensor *yc = dev_forward_backward(c, NB_CPU, in, gc);
        nb_tensor *yg = dev_forward_backward(c, GUARD, in, gg);
        double *v = tu_values(yc);
        tu_assert_close(yg, v, nb_shape(yc), nb_ndim(yc), 0);
        free(v);
        for (int k = 0; k < n; k++) {
            v = tu_values(gc[k]);
            tu_assert_close(gg[k], v, nb_shape(gc[k]), nb_ndim(gc[k]), 0);
            free(v);
        }
        nb_scope_end();
    }
    nb__conv2d_set_impl(NB__CONV_AUTO);
}
END_TEST

/* On meta every op infers its output's shape and dtype and records; the backward gives
 * meta gradients of the inputs' shapes; nothing is computed or read. */
START_TEST(test_conv_pool_meta) {
    for (int i = 0; i < N_DEV_CASES; i++) {
        const dev_case *c = &k_dev_cases[i];
        nb_scope_begin();
        nb_tensor *in[3], *cpu_grads[3], *xs[3];
        int n = dev_inputs(c, in);
        nb_tensor *ref = dev_run(c, in); /* the computed result: the expected shape */
        ck_assert(ref != NULL);
        for (int k = 0; k < n; k++) {
            xs[k] = nb_empty_on(NB_META, nb_shape(in[k]), nb_ndim(in[k]), c->dt);
            ck_assert(nb_set_requires_grad(xs[k], true) == NB_OK);
        }
        nb_tensor *y = dev_run(c, xs);
        ck_assert_msg(y != NULL, "%s: %s", c->what, nb_last_error());
        ck_assert(nb_tensor_device(y).type == NB_DEVICE_META);
        ck_assert_int_eq(nb_tensor_dtype(y), c->dt);
        ck_assert_int_eq(nb_ndim(y), nb_ndim(ref));
        for (int d = 0; d < nb_ndim(y); d++) ck_assert_int_eq(nb_shape(y)[d], nb_shape(ref)[d]);
        nb_tensor *g = nb_ones_on(NB_META, nb_shape(y), nb_ndim(y), c->dt);
        ck_assert_msg(backward_with(y, g) == NB_OK, "%s: %s", c->what, nb_last_error());
        for (int k = 0; k < n; k++) {
            cpu_grads[k] = nb_grad(xs[k]);
            ck_assert_msg(cpu_grads[k] != NULL, "%s: input %d has no gradient", c->what, k);
            ck_assert(nb_tensor_device(cpu_grads[k]).type == NB_DEVICE_META);
            ck_assert_int_eq(nb_tensor_dtype(cpu_grads[k]), c->dt);
            ck_assert_int_eq(nb_ndim(cpu_grads[k]), nb_ndim(in[k]));
            for (int d = 0; d < nb_ndim(in[k]); d++)
                ck_assert_int_eq(nb_shape(cpu_grads[k])[d], nb_shape(in[k])[d]);
        }
        nb_scope_end();
    }
}
END_TEST

/* x, w, b are on the default device, whose name the messages give. */
START_TEST(test_conv_pool_mixed_devices) {
    nb_scope_begin();
    char dev[32], msg_dm[96], msg_md[96];
    nb_device_name(nb_default_device(), dev, sizeof dev);
    snprintf(msg_dm, sizeof msg_dm, "conv2d: operands on %s and meta", dev);
    snprintf(msg_md, sizeof msg_md, "conv2d: operands on meta and %s", dev);
    nb_tensor *x = tu_random((int64_t[]){1, 2, 5, 5}, 4, NB_F32, -1, 1, 1);
    nb_tensor *w = tu_random((int64_t[]){3, 2, 3, 3}, 4, NB_F32, -1, 1, 2);
    nb_tensor *b = tu_random((int64_t[]){3}, 1, NB_F32, -1, 1, 3);
    nb_tensor *xm = nb_to_device(x, NB_META), *wm = nb_to_device(w, NB_META);
    nb_tensor *bm = nb_to_device(b, NB_META);
    tu_assert_error(nb_conv2d(x, wm, b, NULL, NULL, NULL, 1), NB_EDEVICE, msg_dm);
    tu_assert_error(nb_conv2d(xm, w, NULL, NULL, NULL, NULL, 1), NB_EDEVICE, msg_md);
    tu_assert_error(nb_conv2d(x, w, bm, NULL, NULL, NULL, 1), NB_EDEVICE, "conv2d");
    /* A pool's gradient on another device than its output. */
    ck_assert(nb_set_requires_grad(x, true) == NB_OK);
    nb_tensor *y = nb_maxpool2d(x, (int64_t[]){2, 2}, NULL, NULL);
    ck_assert(y != NULL);
    ck_assert(backward_with(y, nb_ones_on(NB_META, nb_shape(y), 4, NB_F32)) == NB_EDEVICE);
    ck_assert(nb_grad(x) == NULL);
    nb_scope_end();
}
END_TEST

Suite *nb_suite_nn_conv(void) {
    Suite *s = suite_create("nn_conv");
    TCase *tc = tcase_create("conv2d");
    tcase_add_test(tc, test_conv2d_forward);
    tcase_add_test(tc, test_conv2d_backward_reference);
    tcase_add_test(tc, test_conv2d_gradcheck);
    tcase_add_test(tc, test_conv2d_backward_f32_vs_f64);
    tcase_add_test(tc, test_conv2d_half_backward);
    tcase_add_test(tc, test_conv2d_thread_independent);
    tcase_add_test(tc, test_conv2d_bf16_kernel);
    tcase_add_test(tc, test_conv2d_bf16_path);
    tcase_add_test(tc, test_conv2d_bf16_autocast);
    tcase_add_test(tc, test_conv2d_bf16_thread_independent);
    tcase_add_test(tc, test_conv2d_module);
    tcase_add_test(tc, test_conv2d_errors);
    suite_add_tcase(s, tc);
    TCase *tp = tcase_create("pool2d");
    nb_tests_nn_pool(tp); /* test_nn_pool.c */
    suite_add_tcase(s, tp);
    TCase *td = tcase_create("devices");
    tcase_add_test(td, test_conv_pool_guard);
    tcase_add_test(td, test_conv_pool_meta);
    tcase_add_test(td, test_conv_pool_mixed_devices);
    suite_add_tcase(s, td);
    return s;
}
