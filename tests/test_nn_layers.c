/* test_nn_layers.c - the "nn_layers" suite: the layer library of nn/ (linear, layer norm,
 * batch norm, dropout, initialization) and its modules.
 *
 * Every forward and every backward rule is compared with a plain double-precision loop
 * written here (over shapes, operand layouts and float dtypes); the rules are also checked
 * against central differences with nb_gradcheck. Also: running-statistics updates, dropout
 * statistics and determinism (generator state, thread count), init distributions and
 * PyTorch's fan/gain formulas, module parameter names and shapes, flat parameters,
 * train/eval switching, and the user errors. The init, module, error and hook tests are in
 * test_nn_modules.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_nn_layers.h"
#include "testutil.h"

static const nb_dtype k_float[] = {NB_F32, NB_F64, NB_F16, NB_BF16};
#define N_FLOAT 4

/* ---- references ------------------------------------------------------------------------------ */
/* y (M, N) = x (M, K) @ w (N, K)^T + b */
static void ref_linear(const double *x, const double *w, const double *b, int64_t M,
                       int64_t N, int64_t K, double *y) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = b ? b[j] : 0;
            for (int64_t k = 0; k < K; k++) s += x[i * K + k] * w[j * K + k];
            y[i * N + j] = s;
        }
}

/* Layer norm of rows (N, D); also its backward for output gradient g when dx != NULL. */
static void ref_layer_norm(const double *x, const double *w, const double *b, int64_t N,
                           int64_t D, double eps, double *y, const double *g, double *dx,
                           double *dw, double *db) {
    if (dw) memset(dw, 0, sizeof(double) * (size_t)D);
    if (db) memset(db, 0, sizeof(double) * (size_t)D);
    for (int64_t i = 0; i < N; i++) {
        const double *xr = x + i * D;
        double m = 0, v = 0;
        for (int64_t j = 0; j < D; j++) m += xr[j];
        m /= (double)D;
        for (int64_t j = 0; j < D; j++) v += (xr[j] - m) * (xr[j] - m);
        v /= (double)D;
        double r = 1 / sqrt(v + eps);
        for (int64_t j = 0; j < D; j++)
            y[i * D + j] = (xr[j] - m) * r * (w ? w[j] : 1) + (b ? b[j] : 0);
        if (!g) continue;
        const double *gr = g + i * D;
        double s1 = 0, s2 = 0;
        for (int64_t j = 0; j < D; j++) {
            double gw = gr[j] * (w ? w[j] : 1), xh = (xr[j] - m) * r;
            s1 += gw;
            s2 += gw * xh;
            if (dw) dw[j] += gr[j] * xh;
            if (db) db[j] += gr[j];
        }
        for (int64_t j = 0; j < D; j++) {
            double gw = gr[j] * (w ? w[j] : 1), xh = (xr[j] - m) * r;
            dx[i * D + j] = r * (gw - s1 / (double)D - xh * s2 / (double)D);
        }
    }
}

/* Batch norm of x (N, C, S). Training: batch stats (biased var), returned in bm/bv (bv
 * unbiased, for the running update). Eval: rm/rv. Backward into dx/dw/db when g != NULL. */
static void ref_batch_norm(const double *x, int64_t N, int64_t C, int64_t S, const double *w,
                           const double *b, bool training, const double *rm, const double *rv,
                           double eps, double *y, double *bm, double *bv, const double *g,
                           double *dx, double *dw, double *db) {
    int64_t M = N * S;
    for (int64_t c = 0; c < C; c++) {
        double m = 0, v = 0;
        for (int64_t n = 0; n < N; n++)
            for (int64_t s = 0; s < S; s++) m += x[(n * C + c) * S + s];
        m /= (double)M;
        for (int64_t n = 0; n < N; n++)
            for (int64_t s = 0; s < S; s++) {
                double d = x[(n * C + c) * S + s] - m;
                v += d * d;
            }
        if (bm) bm[c] = m, bv[c] = v / (double)(M - 1);
        v /= (double)M;
        if (!training) m = rm[c], v = rv[c];
        double r = 1 / sqrt(v + eps), wc = w ? w[c] : 1, sg = 0, sgx = 0;
        for (int64_t n = 0; n < N; n++)
            for (int64_t s = 0; s < S; s++) {
                int64_t i = (n * C + c) * S + s;
                double xh = (x[i] - m) * r;
                y[i] = xh * wc + (b ? b[c] : 0);
                if (g) sg += g[i], sgx += g[i] * xh;
            }
        if (!g) continue;
        if (dw) dw[c] = sgx;
        if (db) db[c] = sg;
        for (int64_t n = 0; n < N; n++)
            for (int64_t s = 0; s < S; s++) {
                int64_t i = (n * C + c) * S + s;
                double xh = (x[i] - m) * r;
                dx[i] = training ? wc * r * (g[i] - sg / (double)M - xh * sgx / (double)M)
                                 : wc * r * g[i];
            }
    }
}

/* ---- linear ---------------------------------------------------------------------------------- */
typedef struct lin_case {
    int64_t xs[3];
    int xnd;
    int64_t out;
    bool bias;
    int layout; /* 0 dense, 1 x transposed storage, 2 w transposed storage, 3 x padded rows */
} lin_case;

static const lin_case k_lin[] = {
    {{3, 4}, 2, 5, true, 0},  {{3, 4}, 2, 5, false, 0}, {{2, 3, 4}, 3, 5, true, 0},
    {{4}, 1, 3, true, 0},     {{1, 4}, 2, 1, true, 0},  {{0, 4}, 2, 3, true, 0},
    {{3, 0}, 2, 2, true, 0},  {{3, 0}, 2, 2, false, 0}, {{3, 4}, 2, 5, true, 1},
    {{2, 3, 4}, 3, 5, true, 1}, {{3, 4}, 2, 5, true, 2}, {{3, 4}, 2, 5, false, 3},
    {{5, 7}, 2, 6, true, 0},
};
#define N_LIN ((int)(sizeof k_lin / sizeof k_lin[0]))

/* Operands of a case (in the current scope). */
static void lin_operands(const lin_case *c, nb_dtype dt, uint64_t seed, nb_tensor **x,
                         nb_tensor **w, nb_tensor **b) {
    int64_t K = c->xs[c->xnd - 1];
    if (c->layout == 3) {
        int64_t wide[3];
        memcpy(wide, c->xs, sizeof wide);
        wide[c->xnd - 1] = K + 3;
        *x = nb_narrow(tu_random(wide, c->xnd, dt, -1, 1, seed), c->xnd - 1, 1, K);
    } else {
        *x = tu_random(c->xs, c->xnd, dt, -1, 1, seed);
        if (c->layout == 1) *x = tu_noncontig(*x);
    }
    *w = tu_random((int64_t[]){c->out, K}, 2, dt, -1, 1, seed + 1);
    if (c->layout == 2) *w = tu_noncontig(*w);
    *b = c->bias ? tu_random(&c->out, 1, dt, -1, 1, seed + 2) : NULL;
}

START_TEST(test_linear_forward) {
    nb_scope_begin();
    for (int ci = 0; ci < N_LIN; ci++) {
        const lin_case *c = &k_lin[ci];
        for (int di = 0; di < N_FLOAT; di++) {
            nb_tensor *x, *w, *b;
            lin_operands(c, k_float[di], 10 + (uint64_t)ci, &x, &w, &b);
            nb_tensor *y = nb_linear(x, w, b);
            ck_assert_msg(y, "case %d %s: %s", ci, nb_dtype_name(k_float[di]), nb_last_error());
            ck_assert_int_eq(nb_tensor_dtype(y), k_float[di]);
            int64_t K = c->xs[c->xnd - 1], M = tu_numel(c->xs, c->xnd - 1), oshape[3];
            memcpy(oshape, c->xs, sizeof oshape);
            oshape[c->xnd - 1] = c->out;
            double *xv = tu_values(x), *wv = tu_values(w), *bv = b ? tu_values(b) : NULL;
            double *ref = malloc(sizeof(double) * (size_t)(M * c->out + 1));
            ref_linear(xv, wv, bv, M, c->out, K, ref);
            tu_assert_close(y, ref, oshape, c->xnd, tu_tol(k_float[di]));
            free(xv), free(wv), free(bv), free(ref);
        }
    }
    nb_scope_end();
}
END_TEST

/* Backward against the reference: dx = G W, dw = G^T X, db = column sums of G, for dense,
 * transposed and padded operands and for dense, transposed and expanded output gradients. */
START_TEST(test_linear_backward) {
    nb_scope_begin();
    for (int ci = 0; ci < N_LIN; ci++) {
        const lin_case *c = &k_lin[ci];
        for (int di = 0; di < N_FLOAT; di++) {
            nb_dtype dt = k_float[di];
            for (int gl = 0; gl < 3; gl++) {
                nb_tensor *x, *w, *b;
                lin_operands(c, dt, 40 + (uint64_t)ci, &x, &w, &b);
                make_grad(x), make_grad(w);
                if (b) make_grad(b);
                nb_tensor *y = nb_linear(x, w, b);
                ck_assert_msg(y, "%s", nb_last_error());
                int64_t K = c->xs[c->xnd - 1], M = tu_numel(c->xs, c->xnd - 1), N = c->out;
                nb_tensor *g = tu_random(nb_shape(y), nb_ndim(y), dt, -1, 1, 77);
                if (gl == 1) g = tu_noncontig(g);
                if (gl == 2) /* every row the same: stride 0 over the leading dims */
                    g = nb_expand(tu_random(&N, 1, dt, -1, 1, 78), nb_shape(y), nb_ndim(y));
                backward_with(y, g);
                double *xv = tu_values(x), *wv = tu_values(w), *gv = tu_values(g);
                double *dx = calloc((size_t)(M * K + 1), sizeof(double));
                double *dw = calloc((size_t)(N * K + 1), sizeof(double));
                double *db = calloc((size_t)(N + 1), sizeof(double));
                for (int64_t i = 0; i < M; i++)
                    for (int64_t j = 0; j < N; j++) {
                        db[j] += gv[i * N + j];
                        for (int64_t k = 0; k < K; k++) {
                            dx[i * K + k] += gv[i * N + j] * wv[j * K + k];
                            dw[j * K + k] += gv[i * N + j] * xv[i * K + k];
                        }
                    }
                double tol = dt == NB_F32 ? 1e-5 : tu_tol(dt) * 2;
                CLOSE(nb_grad(x), dx, tol);
                CLOSE(nb_grad(w), dw, tol);
                if (b) CLOSE(nb_grad(b), db, tol);
                ck_assert_int_eq(nb_tensor_dtype(nb_grad(w)), dt);
                free(xv), free(wv), free(gv), free(dx), free(dw), free(db);
            }
        }
    }
    nb_scope_end();
}
END_TEST

static nb_tensor *f_linear(nb_tensor *const *in, int n, void *ctx) {
    int mode = *(int *)ctx;
    nb_tensor *x = mode == 1 ? nb_transpose(in[0], 0, 1) : in[0];
    return nb_linear(x, in[1], n > 2 ? in[2] : NULL);
}

START_TEST(test_linear_gradcheck) {
    nb_scope_begin();
    int mode = 0;
    nb_tensor *x = tu_random((int64_t[]){3, 4}, 2, NB_F64, -1, 1, 1);
    nb_tensor *w = tu_random((int64_t[]){2, 4}, 2, NB_F64, -1, 1, 2);
    nb_tensor *b = tu_random((int64_t[]){2}, 1, NB_F64, -1, 1, 3);
    make_grad(x), make_grad(w), make_grad(b);
    ck_assert_msg(nb_gradcheck(f_linear, (nb_tensor *[]){x, w, b}, 3, &mode, NULL) == NB_OK,
                  "%s", nb_last_error());
    /* 3-D input without bias, from f32 leaves */
    nb_tensor *x3 = tu_random((int64_t[]){2, 2, 3}, 3, NB_F32, -1, 1, 4);
    nb_tensor *w3 = tu_random((int64_t[]){2, 3}, 2, NB_F32, -1, 1, 5);
    make_grad(x3), make_grad(w3);
    ck_assert_msg(nb_gradcheck(f_linear, (nb_tensor *[]){x3, w3}, 2, &mode, NULL) == NB_OK,
                  "%s", nb_last_error());
    /* a transposed (column-major) input */
    mode = 1;
    nb_tensor *xt = tu_random((int64_t[]){4, 3}, 2, NB_F64, -1, 1, 6);
    make_grad(xt);
    ck_assert_msg(nb_gradcheck(f_linear, (nb_tensor *[]){xt, w, b}, 3, &mode, NULL) == NB_OK,
                  "%s", nb_last_error());
    nb_scope_end();
}
END_TEST

/* ---- layer norm ------------------------------------------------------------------------------ */
typedef struct ln_case {
    int64_t xs[3];
    int xnd;
    bool w, b, noncontig;
} ln_case;

static const ln_case k_ln[] = {
    {{4, 8}, 2, true, true, false},  {{2, 3, 5}, 3, true, true, false},
    {{4, 8}, 2, false, false, false}, {{4, 8}, 2, true, false, true},
    {{3, 1}, 2, true, true, false},  {{0, 5}, 2, true, true, false},
    {{7}, 1, false, true, false},    {{6, 37}, 2, true, true, true},
};
#define N_LN ((int)(sizeof k_ln / sizeof k_ln[0]))

START_TEST(test_layer_norm) {
    nb_scope_begin();
    const double eps = 1e-5;
    for (int ci = 0; ci < N_LN; ci++) {
        const ln_case *c = &k_ln[ci];
        int64_t D = c->xs[c->xnd - 1], N = tu_numel(c->xs, c->xnd - 1);
        for (int di = 0; di < N_FLOAT; di++) {
            nb_dtype dt = k_float[di];
            nb_tensor *x = tu_random(c->xs, c->xnd, dt, -2, 3, 100 + (uint64_t)ci);
            if (c->noncontig) x = tu_noncontig(x);
            nb_tensor *w = c->w ? tu_random(&D, 1, dt, 0.5, 1.5, 7) : NULL;
            nb_tensor *b = c->b ? tu_random(&D, 1, dt, -1, 1, 8) : NULL;
            make_grad(x);
            if (w) make_grad(w);
            if (b) make_grad(b);
            nb_tensor *y = nb_layer_norm(x, w, b, eps);
            ck_assert_msg(y, "case %d: %s", ci, nb_last_error());
            ck_assert_int_eq(nb_tensor_dtype(y), dt);
            nb_tensor *g = tu_random(c->xs, c->xnd, dt, -1, 1, 9);
            backward_with(y, g);
            double *xv = tu_values(x), *wv = w ? tu_values(w) : NULL, *bv = b ? tu_values(b) : NULL;
            double *gv = tu_values(g);
            size_t n = (size_t)(N * D + 1);
            double *ry = malloc(sizeof(double) * n), *rdx = malloc(sizeof(double) * n);
            double *rdw = malloc(sizeof(double) * (size_t)(D + 1)),
                   *rdb = malloc(sizeof(double) * (size_t)(D + 1));
            ref_layer_norm(xv, wv, bv, N, D, eps, ry, gv, rdx, rdw, rdb);
            double tol = dt == NB_F32 ? 1e-5 : tu_tol(dt) * 4;
            CLOSE(y, ry, tol);
            CLOSE(nb_grad(x), rdx, dt == NB_F32 ? 1e-4 : tol);
            if (w) CLOSE(nb_grad(w), rdw, dt == NB_F32 ? 1e-5 : tol * 4);
            if (b) CLOSE(nb_grad(b), rdb, dt == NB_F32 ? 1e-5 : tol * 4);
            free(xv), free(wv), free(bv), free(gv), free(ry), free(rdx), free(rdw), free(rdb);
        }
    }
    nb_scope_end();
}
END_TEST

static nb_tensor *f_layer_norm(nb_tensor *const *in, int n, void *ctx) {
    (void)ctx;
    return nb_layer_norm(in[0], n > 1 ? in[1] : NULL, n > 2 ? in[2] : NULL, 1e-5);
}

START_TEST(test_layer_norm_gradcheck) {
    nb_scope_begin();
    nb_tensor *x = tu_random((int64_t[]){3, 5}, 2, NB_F64, -2, 2, 1);
    nb_tensor *w = tu_random((int64_t[]){5}, 1, NB_F64, 0.5, 1.5, 2);
    nb_tensor *b = tu_random((int64_t[]){5}, 1, NB_F64, -1, 1, 3);
    make_grad(x), make_grad(w), make_grad(b);
    ck_assert_msg(nb_gradcheck(f_layer_norm, (nb_tensor *[]){x, w, b}, 3, NULL, NULL) == NB_OK,
                  "%s", nb_last_error());
    ck_assert_msg(nb_gradcheck(f_layer_norm, (nb_tensor *[]){x}, 1, NULL, NULL) == NB_OK, "%s",
                  nb_last_error());
    nb_scope_end();
}
END_TEST

/* ---- batch norm ------------------------------------------------------------------------------ */
typedef struct bn_case {
    int64_t xs[4];
    int xnd;
    bool affine;
} bn_case;

static const bn_case k_bn[] = {
    {{6, 3}, 2, true}, {{2, 3, 2, 2}, 4, true}, {{4, 2, 5}, 3, false}, {{3, 4, 3, 3}, 4, true},
};
#define N_BN ((int)(sizeof k_bn / sizeof k_bn[0]))

START_TEST(test_batch_norm) {
    nb_scope_begin();
    const double eps = 1e-5, mom = 0.1;
    for (int ci = 0; ci < N_BN; ci++) {
        const bn_case *c = &k_bn[ci];
        int64_t N = c->xs[0], C = c->xs[1], S = tu_numel(c->xs + 2, c->xnd - 2);
        for (int di = 0; di < N_FLOAT; di++) {
            nb_dtype dt = k_float[di];
            nb_tensor *w = c->affine ? tu_random(&C, 1, dt, 0.5, 1.5, 5) : NULL;
            nb_tensor *b = c->affine ? tu_random(&C, 1, dt, -1, 1, 6) : NULL;
            nb_tensor *rm = nb_zeros(&C, 1, NB_F32), *rv = nb_ones(&C, 1, NB_F32);
            double refm[16], refv[16], bm[16], bv[16];
            for (int64_t k = 0; k < C; k++) refm[k] = 0, refv[k] = 1;
            int64_t n = tu_numel(c->xs, c->xnd);
            double *ry = malloc(sizeof(double) * (size_t)n),
                   *rdx = malloc(sizeof(double) * (size_t)n);
            double rdw[16], rdb[16];
            for (int step = 0; step < 3; step++) {
                bool training = step < 2; /* two training steps, then eval */
                nb_tensor *x = tu_random(c->xs, c->xnd, dt, -2, 3, 200 + (uint64_t)(ci * 8 + step));
                if (step == 1) x = tu_noncontig(x);
                make_grad(x);
                if (w) make_grad(w), make_grad(b), nb_clear_grad(w), nb_clear_grad(b);
                nb_tensor *y = nb_batch_norm(x, rm, rv, w, b, training, mom, eps);
                ck_assert_msg(y, "case %d: %s", ci, nb_last_error());
                nb_tensor *g = tu_random(c->xs, c->xnd, dt, -1, 1, 300 + (uint64_t)step);
                backward_with(y, g);
                double *xv = tu_values(x), *gv = tu_values(g);
                double *wv = w ? tu_values(w) : NULL, *bvv = b ? tu_values(b) : NULL;
                /* eval normalizes with the stored (f32) running statistics */
                double *rm0 = tu_values(rm), *rv0 = tu_values(rv);
                ref_batch_norm(xv, N, C, S, wv, bvv, training, rm0, rv0, eps, ry, bm, bv, gv, rdx,
                               rdw, rdb);
                free(rm0), free(rv0);
                if (training)
                    for (int64_t k = 0; k < C; k++) {
                        refm[k] = (1 - mom) * refm[k] + mom * bm[k];
                        refv[k] = (1 - mom) * refv[k] + mom * bv[k];
                    }
                double tol = dt == NB_F32 ? 1e-5 : tu_tol(dt) * 4;
                CLOSE(y, ry, tol);
                CLOSE(nb_grad(x), rdx, dt == NB_F32 ? 1e-4 : tol * 2);
                if (w) CLOSE(nb_grad(w), rdw, dt == NB_F32 ? 1e-5 : tol * 4);
                if (b) CLOSE(nb_grad(b), rdb, dt == NB_F32 ? 1e-5 : tol * 4);
                CLOSE(rm, refm, dt == NB_F32 || dt == NB_F64 ? 1e-6 : tol);
                CLOSE(rv, refv, dt == NB_F32 || dt == NB_F64 ? 1e-6 : tol);
                free(xv), free(gv), free(wv), free(bvv);
            }
            free(ry), free(rdx);
        }
    }
    nb_scope_end();
}
END_TEST

typedef struct bn_ctx {
    nb_tensor *rm, *rv;
    bool training;
} bn_ctx;

static nb_tensor *f_batch_norm(nb_tensor *const *in, int n, void *ctx) {
    bn_ctx *c = ctx;
    return nb_batch_norm(in[0], c->rm, c->rv, n > 1 ? in[1] : NULL, n > 2 ? in[2] : NULL,
                         c->training, 0.1, 1e-5);
}

START_TEST(test_batch_norm_gradcheck) {
    nb_scope_begin();
    nb_tensor *x = tu_random((int64_t[]){4, 3}, 2, NB_F64, -2, 2, 1);
    nb_tensor *x4 = tu_random((int64_t[]){2, 2, 2, 2}, 4, NB_F64, -2, 2, 2);
    nb_tensor *w = tu_random((int64_t[]){3}, 1, NB_F64, 0.5, 1.5, 3);
    nb_tensor *b = tu_random((int64_t[]){3}, 1, NB_F64, -1, 1, 4);
    nb_tensor *w2 = tu_random((int64_t[]){2}, 1, NB_F64, 0.5, 1.5, 5);
    make_grad(x), make_grad(x4), make_grad(w), make_grad(b), make_grad(w2);
    bn_ctx train = {tu_random((int64_t[]){3}, 1, NB_F64, -1, 1, 6),
                    tu_random((int64_t[]){3}, 1, NB_F64, 0.5, 2, 7), true};
    ck_assert_msg(nb_gradcheck(f_batch_norm, (nb_tensor *[]){x, w, b}, 3, &train, NULL) == NB_OK,
                  "%s", nb_last_error());
    bn_ctx nostats = {NULL, NULL, true};
    ck_assert_msg(nb_gradcheck(f_batch_norm, (nb_tensor *[]){x4, w2}, 2, &nostats, NULL) == NB_OK,
                  "%s", nb_last_error());
    bn_ctx eval = {train.rm, train.rv, false};
    ck_assert_msg(nb_gradcheck(f_batch_norm, (nb_tensor *[]){x, w, b}, 3, &eval, NULL) == NB_OK,
                  "%s", nb_last_error());
    nb_scope_end();
}
END_TEST

/* Norm backward sums and dropout masks must not depend on the thread count. */
START_TEST(test_thread_independence) {
    nb_scope_begin();
    int saved = nb_get_num_threads();
    nb_tensor *x = tu_random((int64_t[]){512, 256}, 2, NB_F32, -2, 2, 1);
    nb_tensor *w = tu_random((int64_t[]){256}, 1, NB_F32, 0.5, 1.5, 2);
    nb_tensor *b = tu_random((int64_t[]){256}, 1, NB_F32, -1, 1, 3);
    nb_tensor *xb = tu_random((int64_t[]){8, 16, 32, 32}, 4, NB_F32, -2, 2, 4);
    nb_tensor *wb = tu_random((int64_t[]){16}, 1, NB_F32, 0.5, 1.5, 5);
    make_grad(x), make_grad(w), make_grad(b), make_grad(xb), make_grad(wb);
    nb_generator *gen = nb_generator_new(99);
    double *res[2][6];
    for (int k = 0; k < 2; k++) {
        nb_set_num_threads(k == 0 ? 1 : 4);
        nb_clear_grad(x), nb_clear_grad(w), nb_clear_grad(b), nb_clear_grad(xb),
            nb_clear_grad(wb);
        nb_tensor *y = nb_layer_norm(x, w, b, 1e-5);
        backward_with(y, tu_random(nb_shape(y), 2, NB_F32, -1, 1, 6));
        nb_tensor *yb = nb_batch_norm(xb, NULL, NULL, wb, NULL, true, 0.1, 1e-5);
        backward_with(yb, tu_random(nb_shape(yb), 4, NB_F32, -1, 1, 7));
        nb_generator_set_offset(gen, 5);
        nb_tensor *d = nb_dropout(tu_random((int64_t[]){100000}, 1, NB_F32, 1, 2, 8), 0.5,
                                  true, gen);
        nb_tensor *outs[6] = {nb_grad(w), nb_grad(b), nb_grad(x), yb, nb_grad(wb), d};
        for (int i = 0; i < 6; i++) res[k][i] = tu_values(outs[i]);
    }
    nb_set_num_threads(saved);
    int64_t sizes[6] = {256, 256, 512 * 256, 8 * 16 * 32 * 32, 16, 100000};
    for (int i = 0; i < 6; i++) {
        ck_assert_msg(memcmp(res[0][i], res[1][i], sizeof(double) * (size_t)sizes[i]) == 0,
                      "result %d differs between 1 and 4 threads", i);
        free(res[0][i]), free(res[1][i]);
    }
    nb_generator_free(gen);
    nb_scope_end();
}
END_TEST

/* ---- dropout --------------------------------------------------------------------------------- */
START_TEST(test_dropout) {
    nb_scope_begin();
    nb_generator *gen = nb_generator_new(7);
    const int64_t n = 20000;
    for (int di = 0; di < N_FLOAT; di++) {
        nb_dtype dt = k_float[di];
        nb_tensor *x = tu_random(&n, 1, dt, 1, 2, 1);
        make_grad(x);
        double p = 0.3, scale = 1 / (1 - p);
        nb_generator_set_offset(gen, 0);
        nb_tensor *y = nb_dropout(x, p, true, gen);
        ck_assert_msg(y, "%s", nb_last_error());
        ck_assert_int_eq(nb_tensor_dtype(y), dt);
        nb_tensor *g = tu_random(&n, 1, dt, -1, 1, 2);
        backward_with(y, g);
        double *xv = tu_values(x), *yv = tu_values(y), *gv = tu_values(g);
        double *gx = tu_values(nb_grad(x));
        int64_t zeros = 0;
        double tol = tu_tol(dt);
        for (int64_t i = 0; i < n; i++) {
            bool kept = yv[i] != 0;
            zeros += !kept;
            double want = kept ? xv[i] * scale : 0;
            ck_assert_msg(fabs(yv[i] - want) <= tol * (1 + fabs(want)), "y[%lld]", (long long)i);
            double gwant = kept ? gv[i] * scale : 0;
            ck_assert_msg(fabs(gx[i] - gwant) <= tol * (1 + fabs(gwant)), "grad[%lld]",
                          (long long)i);
        }
        double frac = (double)zeros / (double)n;
        ck_assert_msg(fabs(frac - p) < 0.02, "dropped fraction %g for p %g", frac, p);
        /* Same generator state -> same mask; the generator advanced. */
        nb_generator_set_offset(gen, 0);
        double *y2 = tu_values(nb_dropout(x, p, true, gen));
        ck_assert(memcmp(yv, y2, sizeof(double) * (size_t)n) == 0);
        ck_assert(nb_generator_offset(gen) > 0);
        double *y3 = tu_values(nb_dropout(x, p, true, gen));
        ck_assert(memcmp(yv, y3, sizeof(double) * (size_t)n) != 0);
        free(xv), free(yv), free(gv), free(gx), free(y2), free(y3);
    }
    /* eval / p = 0: x itself; p = 1: zeros with zero gradients */
    nb_tensor *x = tu_random((int64_t[]){3, 4}, 2, NB_F32, 1, 2, 3);
    ck_assert_ptr_eq(nb_dropout(x, 0.5, false, gen), x);
    ck_assert_ptr_eq(nb_dropout(x, 0.0, true, gen), x);
    make_grad(x);
    nb_tensor *z = nb_dropout(x, 1.0, true, NULL);
    double zeros[12] = {0};
    CLOSE(z, zeros, 0);
    backward_with(z, nb_ones((int64_t[]){3, 4}, 2, NB_F32));
    CLOSE(nb_grad(x), zeros, 0);
    /* a non-contiguous input */
    nb_tensor *xn = tu_noncontig(tu_random((int64_t[]){5, 6}, 2, NB_F64, 1, 2, 4));
    nb_tensor *yn = nb_dropout(xn, 0.5, true, gen);
    double *xv = tu_values(xn), *yv = tu_values(yn);
    for (int i = 0; i < 30; i++) ck_assert(yv[i] == 0 || fabs(yv[i] - 2 * xv[i]) < 1e-15);
    free(xv), free(yv);
    nb_generator_free(gen);
    nb_scope_end();
}
END_TEST

static nb_tensor *f_dropout(nb_tensor *const *in, int n, void *ctx) {
    (void)n;
    nb_generator_set_offset(ctx, 0); /* the same mask on every call */
    return nb_dropout(in[0], 0.4, true, ctx);
}

START_TEST(test_dropout_gradcheck) {
    nb_scope_begin();
    nb_generator *gen = nb_generator_new(3);
    nb_tensor *x = tu_random((int64_t[]){4, 5}, 2, NB_F64, -1, 1, 1);
    make_grad(x);
    nb_status st = nb_gradcheck(f_dropout, &x, 1, gen, NULL);
    nb_generator_free(gen);
    ck_assert_msg(st == NB_OK, "%s", nb_last_error());
    nb_scope_end();
}
END_TEST

Suite *nb_suite_nn_layers(void) {
    Suite *s = suite_create("nn_layers");
    struct {
        const char *name;
        const TTest *fn;
    } cases[] = {
        {"linear_forward", test_linear_forward},
        {"linear_backward", test_linear_backward},
        {"linear_gradcheck", test_linear_gradcheck},
        {"layer_norm", test_layer_norm},
        {"layer_norm_gradcheck", test_layer_norm_gradcheck},
        {"batch_norm", test_batch_norm},
        {"batch_norm_gradcheck", test_batch_norm_gradcheck},
        {"thread_independence", test_thread_independence},
        {"dropout", test_dropout},
        {"dropout_gradcheck", test_dropout_gradcheck},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_add_test(tc, cases[i].fn);
        suite_add_tcase(s, tc);
    }
    nb_tests_nn_modules(s); /* test_nn_modules.c */
    suite_add_tcase(s, nb_tcase_norm_devices()); /* tests/test_nn_devices.c */
    suite_add_tcase(s, nb_tcase_module_to());
    return s;
}
