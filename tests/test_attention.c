/* test_attention.c - the "attention" suite: nb_causal_attention (forward, backward, dropout,
 * layouts, threads, allocation, errors), its packed form nb_causal_attention_qkv (equal to
 * the split form, gradcheck, errors), both on the meta and guard devices and with operands on
 * two devices, and the vectorized f32 tanh / gelu kernels.
 *
 * Attention results are compared with a plain double-precision loop written here (explicit
 * masked softmax, explicit gradient formulas), over shapes that include T = 1, T not a multiple
 * of the kernel's row block, D = 1 and empty tensors, over the float dtypes, and over three
 * operand layouts: contiguous, transposed storage (last dim not contiguous) and the permuted
 * (B, T, 3, H, D) slices of a fused qkv projection. The rule is also checked against central
 * differences (nb_gradcheck), with and without dropout. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/attention.h"
#include "cpu/elementwise.h"
#include "testutil.h"

static const nb_dtype k_float[] = {NB_F32, NB_F64, NB_F16, NB_BF16};

#define CLOSE(t, ref, tol) tu_assert_close((t), (ref), nb_shape(t), nb_ndim(t), (tol))

static void make_grad(nb_tensor *t) { ck_assert(nb_set_requires_grad(t, true) == NB_OK); }

static void backward_with(nb_tensor *y, nb_tensor *g) {
    nb_backward_opts o = nb_backward_defaults();
    o.grad_output = g;
    ck_assert_msg(nb_backward_ex(y, &o) == NB_OK, "backward: %s", nb_last_error());
}

/* t's elements in its own dtype, row-major, in host memory the caller frees: nb_read works on
 * any device, so the bitwise comparisons below do not depend on where t lives. */
static void *host_bytes(const nb_tensor *t) {
    size_t bytes = nb_dtype_size(nb_tensor_dtype(t)) * (size_t)nb_numel(t);
    void *buf = malloc(bytes ? bytes : 1);
    ck_assert_msg(nb_read(t, buf, nb_numel(t), nb_tensor_dtype(t)) == NB_OK, "read: %s",
                  nb_last_error());
    return buf;
}

/* ---- reference ------------------------------------------------------------------------------
 * q, k, v, go: (B, H, T, D) row-major doubles. keep: (B, H, T, T) mask or NULL, dscale the
 * factor of kept weights. Writes o (and dq, dk, dv when go is given). */
typedef struct ref_geom {
    int64_t B, H, T, D;
    double scale, dscale;
    const uint8_t *keep;
} ref_geom;

static void ref_attention(const ref_geom *g, const double *q, const double *k, const double *v,
                          const double *go, double *o, double *dq, double *dk, double *dv) {
    const int64_t T = g->T, D = g->D, n = g->B * g->H * T * D;
    double *p = malloc(sizeof(double) * (size_t)(T + 1)), *dp = malloc(sizeof(double) * (size_t)(T + 1));
    if (go)
        for (int64_t i = 0; i < n; i++) dq[i] = dk[i] = dv[i] = 0;
    for (int64_t bh = 0; bh < g->B * g->H; bh++) {
        const double *qs = q + bh * T * D, *ks = k + bh * T * D, *vs = v + bh * T * D;
        for (int64_t t = 0; t < T; t++) {
            double mx = -INFINITY, sum = 0;
            for (int64_t s = 0; s <= t; s++) {
                double a = 0;
                for (int64_t d = 0; d < D; d++) a += qs[t * D + d] * ks[s * D + d];
                p[s] = a * g->scale;
                mx = fmax(mx, p[s]);
            }
            for (int64_t s = 0; s <= t; s++) sum += (p[s] = exp(p[s] - mx));
            for (int64_t s = 0; s <= t; s++) p[s] /= sum;
            for (int64_t d = 0; d < D; d++) {
                double a = 0;
                for (int64_t s = 0; s <= t; s++) {
                    double m = g->keep ? g->keep[(bh * T + t) * T + s] * g->dscale : 1;
                    a += p[s] * m * vs[s * D + d];
                }
                o[(bh * T + t) * D + d] = a;
            }
            if (!go) continue;
            const double *gt = go + (bh * T + t) * D;
            double dsum = 0;
            for (int64_t s = 0; s <= t; s++) {
                double m = g->keep ? g->keep[(bh * T + t) * T + s] * g->dscale : 1, a = 0;
                for (int64_t d = 0; d < D; d++) {
                    a += gt[d] * vs[s * D + d];
                    dv[(bh * T + s) * D + d] += p[s] * m * gt[d];
                }
                dp[s] = a * m;
                dsum += p[s] * dp[s];
            }
            for (int64_t s = 0; s <= t; s++) {
                double ds = p[s] * (dp[s] - dsum) * g->scale;
                for (int64_t d = 0; d < D; d++) {
                    dq[(bh * T + t) * D + d] += ds * ks[s * D + d];
                    dk[(bh * T + s) * D + d] += ds * qs[t * D + d];
                }
            }
        }
    }
    free(p), free(dp);
}

/* ---- operand layouts --------------------------------------------------------------------------
 * 0: contiguous (B, H, T, D); 1: transposed storage (tu_noncontig); 2: slice j of a
 * (B, T, 3, H, D) tensor, permuted to (B, H, T, D). Layout 2 makes all three from one base. */
enum { L_CONTIG, L_TRANSPOSED, L_QKV, L_COUNT };

static void make_qkv(const int64_t *sh, nb_dtype dt, int layout, uint64_t seed, nb_tensor **qkv) {
    if (layout == L_QKV) {
        int64_t s5[5] = {sh[0], sh[2], 3, sh[1], sh[3]};
        nb_tensor *base = tu_random(s5, 5, dt, -1.5, 1.5, seed);
        for (int j = 0; j < 3; j++)
            qkv[j] = nb_permute(nb_select(base, 2, j), (int[]){0, 2, 1, 3}, 4);
        return;
    }
    for (int j = 0; j < 3; j++) {
        qkv[j] = tu_random(sh, 4, dt, -1.5, 1.5, seed + (uint64_t)j);
        if (layout == L_TRANSPOSED) qkv[j] = tu_noncontig(qkv[j]);
    }
}

static double fwd_tol(nb_dtype dt) { return dt == NB_F32 ? 2e-6 : tu_tol(dt) * 2; }

/* ---- forward --------------------------------------------------------------------------------- */
static const int64_t k_shapes[][4] = {
    {1, 1, 1, 1}, {2, 3, 5, 4}, {1, 2, 37, 8}, {2, 1, 70, 1}, {1, 1, 33, 16},
    {1, 2, 1, 5}, {2, 2, 0, 4}, {0, 2, 3, 4},  {1, 1, 3, 0},
};
#define N_SHAPES (sizeof k_shapes / sizeof k_shapes[0])

START_TEST(test_forward) {
    nb_scope_begin();
    for (size_t si = 0; si < N_SHAPES; si++)
        for (int di = 0; di < 4; di++)
            for (int layout = 0; layout < L_COUNT; layout++)
                for (int sc = 0; sc < 2; sc++) {
                    const int64_t *sh = k_shapes[si];
                    nb_dtype dt = k_float[di];
                    nb_tensor *in[3];
                    make_qkv(sh, dt, layout, 10 + si, in);
                    double scale = sc ? 0.3 : 0;
                    nb_tensor *o = nb_causal_attention(in[0], in[1], in[2], scale, 0, true, NULL);
                    ck_assert_msg(o, "%s", nb_last_error());
                    ck_assert_int_eq(nb_tensor_dtype(o), dt);
                    double *q = tu_values(in[0]), *k = tu_values(in[1]), *v = tu_values(in[2]);
                    int64_t n = tu_numel(sh, 4);
                    double *r = malloc(sizeof(double) * (size_t)(n + 1));
                    ref_geom g = {sh[0], sh[1], sh[2], sh[3],
                                  sc ? 0.3 : (sh[3] ? 1 / sqrt((double)sh[3]) : 1), 1, NULL};
                    ref_attention(&g, q, k, v, NULL, r, NULL, NULL, NULL);
                    tu_assert_close(o, r, sh, 4, fwd_tol(dt));
                    free(q), free(k), free(v), free(r);
                }
    nb_scope_end();
}
END_TEST

/* ---- backward against the reference, and f32 against f64 -------------------------------------- */
START_TEST(test_backward) {
    nb_scope_begin();
    static const int64_t shapes[][4] = {{1, 1, 1, 1}, {2, 3, 5, 4}, {1, 2, 37, 8},
                                        {2, 1, 70, 1}, {1, 1, 33, 16}, {2, 2, 0, 4}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int di = 0; di < 4; di++)
            for (int layout = 0; layout < L_COUNT; layout++) {
                const int64_t *sh = shapes[si];
                nb_dtype dt = k_float[di];
                nb_tensor *in[3];
                make_qkv(sh, dt, layout, 20 + si, in);
                /* leaves to differentiate: the base of the views (or the tensors themselves) */
                nb_tensor *leaf[3];
                for (int j = 0; j < 3; j++) {
                    leaf[j] = nb_contiguous(in[j]);
                    leaf[j] = nb_clone(leaf[j]);
                    make_grad(leaf[j]);
                }
                nb_tensor *use[3];
                for (int j = 0; j < 3; j++) {
                    /* the op sees the layout under test; gradients flow back to the leaves */
                    if (layout == L_CONTIG) use[j] = leaf[j];
                    else if (layout == L_TRANSPOSED)
                        use[j] = nb_transpose(nb_contiguous(nb_transpose(leaf[j], 2, 3)), 2, 3);
                    else
                        use[j] = nb_transpose(nb_contiguous(nb_transpose(leaf[j], 1, 2)), 1, 2);
                }
                nb_tensor *o = nb_causal_attention(use[0], use[1], use[2], 0.4, 0, true, NULL);
                ck_assert_msg(o, "%s", nb_last_error());
                nb_tensor *go = tu_random(sh, 4, dt, -1, 1, 30 + si);
                backward_with(o, go);
                double *q = tu_values(leaf[0]), *k = tu_values(leaf[1]), *v = tu_values(leaf[2]);
                double *gv = tu_values(go);
                int64_t n = tu_numel(sh, 4);
                size_t bytes = sizeof(double) * (size_t)(n + 1);
                double *r = malloc(bytes), *dq = malloc(bytes), *dk = malloc(bytes),
                       *dv = malloc(bytes);
                ref_geom g = {sh[0], sh[1], sh[2], sh[3], 0.4, 1, NULL};
                ref_attention(&g, q, k, v, gv, r, dq, dk, dv);
                double tol = dt == NB_F32 ? 2e-5 : tu_tol(dt) * 4;
                tu_assert_close(o, r, sh, 4, tol);
                tu_assert_close(nb_grad(leaf[0]), dq, sh, 4, tol);
                tu_assert_close(nb_grad(leaf[1]), dk, sh, 4, tol);
                tu_assert_close(nb_grad(leaf[2]), dv, sh, 4, tol);
                ck_assert_int_eq(nb_tensor_dtype(nb_grad(leaf[0])), dt);
                free(q), free(k), free(v), free(gv), free(r), free(dq), free(dk), free(dv);
            }
    /* f32 backward equals the f64 one within f32 tolerance, on the GPT-like layout */
    const int64_t sh[4] = {2, 2, 45, 8};
    nb_tensor *x[2][3], *o[2];
    for (int pr = 0; pr < 2; pr++) {
        for (int j = 0; j < 3; j++) {
            x[pr][j] = tu_random(sh, 4, pr ? NB_F64 : NB_F32, -2, 2, 40 + (uint64_t)j);
            make_grad(x[pr][j]);
        }
        o[pr] = nb_causal_attention(x[pr][0], x[pr][1], x[pr][2], 0, 0, true, NULL);
        backward_with(o[pr], tu_random(sh, 4, pr ? NB_F64 : NB_F32, -1, 1, 50));
    }
    for (int j = 0; j < 3; j++) {
        double *r = tu_values(nb_grad(x[1][j]));
        tu_assert_close(nb_grad(x[0][j]), r, sh, 4, 2e-5);
        free(r);
    }
    /* only some inputs requiring grad */
    nb_tensor *a = tu_random(sh, 4, NB_F32, -1, 1, 60), *b = tu_random(sh, 4, NB_F32, -1, 1, 61);
    make_grad(b);
    nb_tensor *y = nb_causal_attention(a, a, b, 0, 0, true, NULL);
    backward_with(y, tu_random(sh, 4, NB_F32, -1, 1, 62));
    ck_assert_ptr_nonnull(nb_grad(b));
    ck_assert_ptr_null(nb_grad(a));
    nb_scope_end();
}
END_TEST

/* ---- gradcheck ----------------------------------------------------------------------------------- */
typedef struct gc_ctx {
    int mode;        /* 0: q, k, v given; 1: given as (B, T, H, D), transposed here; 2: one qkv;
                      * 3: one packed (B, T, 3C) qkv through nb_causal_attention_qkv, 2 heads */
    double p;        /* dropout */
    nb_generator *gen;
} gc_ctx;

static nb_tensor *f_attention(nb_tensor *const *in, int n, void *ctx_) {
    gc_ctx *c = ctx_;
    (void)n;
    /* every evaluation must draw the same dropout mask */
    if (c->gen) nb_generator_set_offset(c->gen, 3);
    if (c->mode == 3) return nb_causal_attention_qkv(in[0], 2, 0, c->p, true, c->gen);
    if (c->mode == 2) {
        nb_tensor *t[3];
        for (int j = 0; j < 3; j++) t[j] = nb_permute(nb_select(in[0], 2, j), (int[]){0, 2, 1, 3}, 4);
        return nb_causal_attention(t[0], t[1], t[2], 0, c->p, true, c->gen);
    }
    if (c->mode == 1)
        return nb_causal_attention(nb_transpose(in[0], 1, 2), nb_transpose(in[1], 1, 2),
                                   nb_transpose(in[2], 1, 2), 0.7, c->p, true, c->gen);
    return nb_causal_attention(in[0], in[1], in[2], 0, c->p, true, c->gen);
}

START_TEST(test_gradcheck) {
    nb_scope_begin();
    nb_generator *gen = nb_generator_new(99);
    static const int64_t shapes[][4] = {{1, 2, 3, 2}, {2, 1, 4, 3}, {1, 1, 1, 2}};
    for (int dropout = 0; dropout < 2; dropout++) {
        gc_ctx c = {0, dropout ? 0.3 : 0, dropout ? gen : NULL};
        for (size_t si = 0; si < 3; si++) {
            nb_tensor *in[3];
            for (int j = 0; j < 3; j++) {
                in[j] = tu_random(shapes[si], 4, NB_F64, -1, 1, 70 + si * 3 + (uint64_t)j);
                make_grad(in[j]);
            }
            c.mode = 0;
            ck_assert_msg(nb_gradcheck(f_attention, in, 3, &c, NULL) == NB_OK, "%s",
                          nb_last_error());
        }
        /* transposed views */
        nb_tensor *tv[3];
        for (int j = 0; j < 3; j++) {
            tv[j] = tu_random((int64_t[]){2, 3, 2, 2}, 4, NB_F64, -1, 1, 80 + (uint64_t)j);
            make_grad(tv[j]);
        }
        c.mode = 1;
        ck_assert_msg(nb_gradcheck(f_attention, tv, 3, &c, NULL) == NB_OK, "%s", nb_last_error());
        /* one fused (B, T, 3, H, D) input, from an f32 leaf */
        nb_tensor *qkv = tu_random((int64_t[]){1, 4, 3, 2, 2}, 5, NB_F32, -1, 1, 90);
        make_grad(qkv);
        c.mode = 2;
        ck_assert_msg(nb_gradcheck(f_attention, &qkv, 1, &c, NULL) == NB_OK, "%s",
                      nb_last_error());
        /* the packed op: (B, T, 3C) with C = 2 heads x 2 */
        nb_tensor *packed = tu_random((int64_t[]){2, 5, 12}, 3, NB_F64, -1, 1, 91);
        make_grad(packed);
        c.mode = 3;
        ck_assert_msg(nb_gradcheck(f_attention, &packed, 1, &c, NULL) == NB_OK, "%s",
                      nb_last_error());
    }
    nb_generator_free(gen);
    nb_scope_end();
}
END_TEST

/* ---- the packed form ------------------------------------------------------------------------------
 * nb_causal_attention_qkv must equal the split form (nb_split, view, transpose, the checked op
 * above, merge) exactly: the kernels see the same strides, and a split's backward only adds
 * zeros. Forward and qkv gradient, with and without dropout, over shapes and float dtypes. */
static void expect_identical(nb_tensor *a, nb_tensor *b, const char *what) {
    int64_t n = nb_numel(a);
    ck_assert_int_eq(n, nb_numel(b));
    double *x = malloc(sizeof(double) * (size_t)(n + 1)), *y = malloc(sizeof(double) * (size_t)(n + 1));
    ck_assert(nb_read(a, x, n, NB_F64) == NB_OK && nb_read(b, y, n, NB_F64) == NB_OK);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(x[i] == y[i] || (isnan(x[i]) && isnan(y[i])),
                      "%s[%lld]: packed %.17g, split %.17g", what, (long long)i, x[i], y[i]);
    free(x);
    free(y);
}

START_TEST(test_packed_qkv) {
    static const int64_t shapes[][4] = {/* B, T, H, D */
                                        {2, 5, 3, 4}, {1, 37, 2, 8}, {2, 1, 1, 3}, {1, 70, 4, 1},
                                        {2, 0, 2, 2}, {0, 3, 2, 2}};
    nb_generator *ga = nb_generator_new(5), *gb = nb_generator_new(5);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int di = 0; di < 4; di++)
            for (int drop = 0; drop < 2; drop++) {
                nb_scope_begin();
                const int64_t B = shapes[si][0], T = shapes[si][1], H = shapes[si][2];
                const int64_t C = H * shapes[si][3];
                const nb_dtype dt = k_float[di];
                const double p = drop ? 0.25 : 0;
                nb_tensor *a = tu_random((int64_t[]){B, T, 3 * C}, 3, dt, -1.5, 1.5, 300 + si);
                nb_tensor *b = nb_clone(a);
                make_grad(a);
                make_grad(b);
                nb_tensor *go = tu_random((int64_t[]){B, T, C}, 3, dt, -1, 1, 400 + si);
                ck_assert(nb_generator_set_offset(ga, 7) == NB_OK);
                ck_assert(nb_generator_set_offset(gb, 7) == NB_OK);
                nb_tensor *ya = nb_causal_attention_qkv(a, H, 0, p, true, ga);
                ck_assert_msg(ya != NULL, "%s", nb_last_error());
                ck_assert_int_eq(nb_ndim(ya), 3);
                ck_assert_int_eq(nb_size(ya, 2), C);
                nb_tensor *part[3];
                ck_assert_int_eq(nb_split(b, C, 2, part, 3), 3);
                for (int j = 0; j < 3; j++)
                    part[j] = nb_transpose(nb_view(part[j], (int64_t[]){B, T, H, C / H}, 4), 1, 2);
                nb_tensor *yb = nb_causal_attention(part[0], part[1], part[2], 0, p, true, gb);
                yb = nb_reshape(nb_transpose(yb, 1, 2), (int64_t[]){B, T, C}, 3);
                ck_assert_uint_eq(nb_generator_offset(ga), nb_generator_offset(gb));
                expect_identical(ya, yb, "output");
                backward_with(ya, go);
                backward_with(yb, go);
                expect_identical(nb_grad(a), nb_grad(b), "grad qkv");
                nb_scope_end();
            }
    nb_generator_free(ga);
    nb_generator_free(gb);
}
END_TEST

/* ---- dropout ------------------------------------------------------------------------------------ */
START_TEST(test_dropout) {
    nb_scope_begin();
    const int64_t sh[4] = {2, 2, 37, 5}, msh[4] = {2, 2, 37, 37};
    const int64_t n = tu_numel(sh, 4);
    nb_tensor *in[3];
    make_qkv(sh, NB_F64, L_CONTIG, 100, in);
    nb_generator *gen = nb_generator_new(1234);
    /* p = 0 and eval mode: exactly no dropout, generator untouched */
    nb_tensor *plain = nb_causal_attention(in[0], in[1], in[2], 0, 0, false, gen);
    nb_tensor *p0 = nb_causal_attention(in[0], in[1], in[2], 0, 0, true, gen);
    nb_tensor *ev = nb_causal_attention(in[0], in[1], in[2], 0, 0.5, false, gen);
    double *plain_v = host_bytes(plain), *p0_v = host_bytes(p0), *ev_v = host_bytes(ev);
    ck_assert(memcmp(plain_v, p0_v, sizeof(double) * (size_t)n) == 0);
    ck_assert(memcmp(plain_v, ev_v, sizeof(double) * (size_t)n) == 0);
    free(plain_v), free(p0_v), free(ev_v);
    ck_assert_uint_eq(nb_generator_offset(gen), 0);

    for (int di = 0; di < 2; di++) {
        nb_dtype dt = k_float[di];
        nb_tensor *x[3];
        for (int j = 0; j < 3; j++) {
            x[j] = nb_clone(nb_to_dtype(in[j], dt));
            make_grad(x[j]);
        }
        const double p = 0.3;
        ck_assert(nb_generator_set_offset(gen, 11) == NB_OK);
        nb_tensor *o = nb_causal_attention(x[0], x[1], x[2], 0, p, true, gen);
        ck_assert_msg(o, "%s", nb_last_error());
        /* the generator moved past the reserved (B, H, T, T) draw */
        ck_assert_uint_eq(nb_generator_offset(gen), 11 + (uint64_t)(tu_numel(msh, 4) + 3) / 4);
        /* the mask is nb_bernoulli's draw from the same place in the stream */
        nb_generator *g2 = nb_generator_new(1234);
        nb_generator_set_offset(g2, 11);
        nb_tensor *mask = nb_bernoulli(msh, 4, NB_U8, 1.0 - p, g2);
        nb_generator_free(g2);
        uint8_t *keep = host_bytes(mask);
        int64_t kept = 0;
        for (int64_t i = 0; i < tu_numel(msh, 4); i++) kept += keep[i];
        ck_assert(kept > 0 && kept < tu_numel(msh, 4));
        nb_tensor *go = tu_random(sh, 4, dt, -1, 1, 101);
        backward_with(o, go);
        double *q = tu_values(in[0]), *k = tu_values(in[1]), *v = tu_values(in[2]);
        double *gv = tu_values(go);
        size_t bytes = sizeof(double) * (size_t)n;
        double *r = malloc(bytes), *dq = malloc(bytes), *dk = malloc(bytes), *dv = malloc(bytes);
        ref_geom g = {sh[0], sh[1], sh[2], sh[3], 1 / sqrt(5.0), 1 / (1 - p), keep};
        ref_attention(&g, q, k, v, gv, r, dq, dk, dv);
        double tol = dt == NB_F32 ? 2e-5 : 1e-11;
        CLOSE(o, r, tol);
        CLOSE(nb_grad(x[0]), dq, tol);
        CLOSE(nb_grad(x[1]), dk, tol);
        CLOSE(nb_grad(x[2]), dv, tol);
        free(q), free(k), free(v), free(gv), free(r), free(dq), free(dk), free(dv), free(keep);
    }
    /* p = 1 drops everything */
    nb_tensor *z = nb_causal_attention(in[0], in[1], in[2], 0, 1, true, gen);
    double *zv = tu_values(z);
    for (int64_t i = 0; i < n; i++) ck_assert(zv[i] == 0);
    free(zv);
    nb_generator_free(gen);
    nb_scope_end();
}
END_TEST

/* ---- threads, allocation ---------------------------------------------------------------------- */
START_TEST(test_threads) {
    nb_scope_begin();
    const int64_t sh[4] = {4, 4, 64, 16};
    const size_t bytes = sizeof(float) * (size_t)tu_numel(sh, 4);
    nb_tensor *in[3];
    make_qkv(sh, NB_F32, L_QKV, 110, in);
    nb_tensor *go = tu_random(sh, 4, NB_F32, -1, 1, 111);
    int saved = nb_get_num_threads();
    nb_tensor *out[2], *grads[2][3];
    nb_generator *gen = nb_generator_new(5);
    for (int r = 0; r < 2; r++) {
        nb_set_num_threads(r + 1);
        nb_tensor *x[3];
        for (int j = 0; j < 3; j++) {
            x[j] = nb_clone(in[j]);
            make_grad(x[j]);
        }
        nb_generator_set_offset(gen, 0);
        out[r] = nb_contiguous(nb_causal_attention(x[0], x[1], x[2], 0, 0.1, true, gen));
        backward_with(out[r], go);
        for (int j = 0; j < 3; j++) grads[r][j] = nb_contiguous(nb_grad(x[j]));
    }
    nb_set_num_threads(saved);
    void *a = host_bytes(out[0]), *b = host_bytes(out[1]);
    ck_assert(memcmp(a, b, bytes) == 0);
    free(a), free(b);
    for (int j = 0; j < 3; j++) {
        a = host_bytes(grads[0][j]), b = host_bytes(grads[1][j]);
        ck_assert(memcmp(a, b, bytes) == 0);
        free(a), free(b);
    }
    nb_generator_free(gen);
    nb_scope_end();
}
END_TEST

/* bf16 operands go to the CPU kernels as bf16 (with AVX512-BF16 the products run in bf16
 * with f32 sums, the weights and score gradients rounded to bf16 once; else each slice is
 * widened for the f32 kernel): the output and the three gradients stay within a few bf16
 * roundings of the f32 kernel's on the widened inputs (which the widening path matches
 * bit for bit), with dropout, through both ops, with the same bits at 1, 2 and 3 threads. */
static void bf16_run(const int64_t *bthc, int64_t H, bool packed, nb_dtype dt, nb_tensor *base,
                     nb_tensor *go, nb_generator *gen, nb_tensor **out, nb_tensor **grad) {
    const int64_t B = bthc[0], T = bthc[1], C = bthc[2];
    nb_tensor *a = nb_clone(nb_to_dtype(base, dt));
    make_grad(a);
    nb_generator_set_offset(gen, 3);
    nb_tensor *y;
    if (packed) {
        y = nb_causal_attention_qkv(a, H, 0, 0.2, true, gen);
    } else {
        nb_tensor *part[3];
        ck_assert_int_eq(nb_split(a, C, 2, part, 3), 3);
        for (int j = 0; j < 3; j++)
            part[j] = nb_transpose(nb_view(part[j], (int64_t[]){B, T, H, C / H}, 4), 1, 2);
        y = nb_causal_attention(part[0], part[1], part[2], 0, 0.2, true, gen);
        if (y) y = nb_reshape(nb_transpose(y, 1, 2), (int64_t[]){B, T, C}, 3);
    }
    ck_assert_msg(y != NULL, "%s", nb_last_error());
    backward_with(y, nb_to_dtype(go, dt));
    *out = nb_to_dtype(y, NB_BF16);
    *grad = nb_to_dtype(nb_grad(a), NB_BF16);
    ck_assert_int_eq(nb_tensor_dtype(nb_grad(a)), dt);
}

START_TEST(test_bf16_operands) {
    nb_scope_begin();
    const int64_t bthc[3] = {2, 70, 24}, H = 3;
    nb_tensor *base = tu_random((int64_t[]){2, 70, 72}, 3, NB_BF16, -2, 2, 500);
    nb_tensor *go = tu_random(bthc, 3, NB_BF16, -1, 1, 501);
    nb_generator *gen = nb_generator_new(77);
    int saved = nb_get_num_threads();
    for (int mode = 0; mode < 4; mode++) {
        const bool packed = mode & 1, native = mode < 2; /* native: where the build has it */
        const bool was = nb__cpu_attention_native_bf16(native);
        nb_tensor *ro, *rg, *o[3], *g[3];
        bf16_run(bthc, H, packed, NB_F32, base, go, gen, &ro, &rg);
        double *rov = tu_values(ro), *rgv = tu_values(rg);
        for (int nt = 1; nt <= 3; nt++) {
            nb_set_num_threads(nt);
            bf16_run(bthc, H, packed, NB_BF16, base, go, gen, &o[nt - 1], &g[nt - 1]);
            if (nt == 1 && !native) { /* widened per slice: the f32 kernel's bits */
                tu_assert_same_bytes(o[0], ro);
                tu_assert_same_bytes(g[0], rg);
            } else if (nt == 1) {
                tu_assert_close(o[0], rov, bthc, 3, 8e-3);
                tu_assert_close(g[0], rgv, nb_shape(rg), 3, 8e-3);
            } else {
                tu_assert_same_bytes(o[nt - 1], o[0]);
                tu_assert_same_bytes(g[nt - 1], g[0]);
            }
        }
        nb_set_num_threads(saved);
        nb__cpu_attention_native_bf16(was);
        free(rov), free(rgv);
    }
    nb_generator_free(gen);
    nb_scope_end();
}
END_TEST

START_TEST(test_no_alloc) {
    nb_scope_begin();
    const int64_t sh[4] = {2, 2, 40, 8};
    nb_tensor *in[3];
    make_qkv(sh, NB_F32, L_CONTIG, 120, in);
    for (int j = 0; j < 3; j++) make_grad(in[j]);
    nb_tensor *go = tu_random(sh, 4, NB_F32, -1, 1, 121);
    nb_alloc_stats st;
    int64_t before = 0;
    for (int it = 0; it < 6; it++) {
        if (it == 3) {
            nb_alloc_get_stats(&st);
            before = st.system_allocs;
        }
        nb_scope_begin();
        nb_tensor *o = nb_causal_attention(in[0], in[1], in[2], 0, 0.2, true, NULL);
        backward_with(o, go);
        nb_scope_end();
    }
    nb_alloc_get_stats(&st);
    ck_assert_int_eq(st.system_allocs, before);
    nb_scope_end();
}
END_TEST

/* ---- errors ------------------------------------------------------------------------------------- */
START_TEST(test_errors) {
    nb_scope_begin();
    const int64_t sh[4] = {1, 2, 3, 4};
    nb_tensor *q = tu_random(sh, 4, NB_F32, -1, 1, 1), *k = tu_random(sh, 4, NB_F32, -1, 1, 2);
    nb_tensor *v = tu_random(sh, 4, NB_F32, -1, 1, 3);
    tu_assert_error(nb_causal_attention(NULL, k, v, 0, 0, false, NULL), NB_ENULL, NULL);
    tu_assert_error(nb_causal_attention(q, k, NULL, 0, 0, false, NULL), NB_ENULL, NULL);
    nb_tensor *q3 = tu_random((int64_t[]){2, 3, 4}, 3, NB_F32, -1, 1, 4);
    tu_assert_error(nb_causal_attention(q3, q3, q3, 0, 0, false, NULL), NB_ESHAPE, "4-D");
    nb_tensor *k2 = tu_random((int64_t[]){1, 2, 5, 4}, 4, NB_F32, -1, 1, 5);
    tu_assert_error(nb_causal_attention(q, k2, v, 0, 0, false, NULL), NB_ESHAPE, "same shape");
    nb_tensor *v2 = tu_random((int64_t[]){1, 2, 3, 6}, 4, NB_F32, -1, 1, 6);
    tu_assert_error(nb_causal_attention(q, k, v2, 0, 0, false, NULL), NB_ESHAPE, "[1,2,3,6]");
    nb_tensor *k64 = tu_random(sh, 4, NB_F64, -1, 1, 7);
    tu_assert_error(nb_causal_attention(q, k64, v, 0, 0, false, NULL), NB_EDTYPE, "same dtype");
    nb_tensor *qi = tu_random(sh, 4, NB_I32, -3, 3, 8);
    tu_assert_error(nb_causal_attention(qi, qi, qi, 0, 0, false, NULL), NB_EDTYPE, "i32");
    tu_assert_error(nb_causal_attention(q, k, v, 0, 1.5, true, NULL), NB_EINVAL, "[0, 1]");
    tu_assert_error(nb_causal_attention(q, k, v, 0, -0.1, true, NULL), NB_EINVAL, "[0, 1]");
    tu_assert_error(nb_causal_attention(q, k, v, NAN, 0, true, NULL), NB_EINVAL, "scale");
    /* the packed form */
    nb_tensor *p = tu_random((int64_t[]){1, 3, 12}, 3, NB_F32, -1, 1, 9);
    tu_assert_error(nb_causal_attention_qkv(NULL, 2, 0, 0, false, NULL), NB_ENULL, NULL);
    tu_assert_error(nb_causal_attention_qkv(q, 2, 0, 0, false, NULL), NB_ESHAPE, "3-D");
    tu_assert_error(nb_causal_attention_qkv(p, 0, 0, 0, false, NULL), NB_EINVAL, "n_head");
    tu_assert_error(nb_causal_attention_qkv(p, 3, 0, 0, false, NULL), NB_ESHAPE, "3 * n_head");
    nb_tensor *p0 = tu_random((int64_t[]){1, 3, 0}, 3, NB_F32, -1, 1, 10);
    tu_assert_error(nb_causal_attention_qkv(p0, 1, 0, 0, false, NULL), NB_ESHAPE, "head_dim");
    nb_tensor *pi = tu_random((int64_t[]){1, 3, 12}, 3, NB_I64, -3, 3, 11);
    tu_assert_error(nb_causal_attention_qkv(pi, 2, 0, 0, false, NULL), NB_EDTYPE, "i64");
    tu_assert_error(nb_causal_attention_qkv(p, 2, 0, 2, true, NULL), NB_EINVAL, "[0, 1]");
    tu_assert_error(nb_causal_attention_qkv(p, 2, INFINITY, 0, true, NULL), NB_EINVAL, "scale");
    nb_scope_end();
}
END_TEST

/* ---- devices ------------------------------------------------------------------------------------
 * Both ops on the meta device (shapes, dtypes, gradients with no data; the generator moves as
 * on the CPU), on the guard device (bit for bit the CPU's results, dropout included: the op
 * definitions and backward rules never touch device memory) and with q, k, v on two devices. */
#define GUARD ((nb_device){NB_DEVICE_GUARD, 0})

/* g (a guard tensor) holds exactly c's values (c on the CPU). */
static void expect_same_on_guard(nb_tensor *c, nb_tensor *g, const char *what) {
    ck_assert_msg(c && g, "%s: missing (%s)", what, nb_last_error());
    tu_expect_on(g, GUARD, nb_shape(c), nb_ndim(c), nb_tensor_dtype(c), what);
    expect_identical(c, nb_to_device(g, NB_CPU), what);
}

START_TEST(test_meta) {
    nb_scope_begin();
    for (int di = 0; di < 4; di++) {
        const nb_dtype dt = k_float[di];
        for (int drop = 0; drop < 2; drop++) {
            const double p = drop ? 0.2 : 0;
            nb_generator *gm = nb_generator_new(3), *gc = nb_generator_new(3);
            /* split form, on transposed views of (B, T, H, D) leaves */
            const int64_t bthd[4] = {2, 9, 3, 4}, sh[4] = {2, 3, 9, 4};
            nb_tensor *in[3], *use[3];
            for (int j = 0; j < 3; j++) {
                in[j] = nb_empty_on(NB_META, bthd, 4, dt);
                make_grad(in[j]);
                use[j] = nb_transpose(in[j], 1, 2);
            }
            nb_tensor *o = nb_causal_attention(use[0], use[1], use[2], 0, p, true, gm);
            tu_expect_on(o, NB_META, sh, 4, dt, "causal_attention");
            backward_with(o, nb_ones_on(NB_META, sh, 4, dt));
            for (int j = 0; j < 3; j++) tu_expect_on(nb_grad(in[j]), NB_META, bthd, 4, dt, "grad");
            /* the packed form */
            const int64_t ps[3] = {2, 9, 36}, os[3] = {2, 9, 12};
            nb_tensor *qkv = nb_empty_on(NB_META, ps, 3, dt);
            make_grad(qkv);
            nb_tensor *y = nb_causal_attention_qkv(qkv, 3, 0, p, true, gm);
            tu_expect_on(y, NB_META, os, 3, dt, "causal_attention_qkv");
            backward_with(y, nb_ones_on(NB_META, os, 3, dt));
            tu_expect_on(nb_grad(qkv), NB_META, ps, 3, dt, "grad qkv");
            /* the generator moved exactly as on the CPU */
            nb_tensor *c[3];
            for (int j = 0; j < 3; j++) c[j] = tu_random_cpu(sh, 4, dt, -1, 1, 5 + (uint64_t)j);
            ck_assert_ptr_nonnull(nb_causal_attention(c[0], c[1], c[2], 0, p, true, gc));
            ck_assert_ptr_nonnull(
                nb_causal_attention_qkv(tu_random_cpu(ps, 3, dt, -1, 1, 8), 3, 0, p, true, gc));
            ck_assert_uint_eq(nb_generator_offset(gm), nb_generator_offset(gc));
            ck_assert(drop ? nb_generator_offset(gm) > 0 : nb_generator_offset(gm) == 0);
            nb_generator_free(gm), nb_generator_free(gc);
        }
    }
    nb_scope_end();
}
END_TEST

START_TEST(test_guard) {
    nb_scope_begin();
    for (int di = 0; di < 4; di++) {
        const nb_dtype dt = k_float[di];
        for (int drop = 0; drop < 2; drop++) {
            const double p = drop ? 0.25 : 0;
            nb_generator *g1 = nb_generator_new(21), *g2 = nb_generator_new(21);
            /* split form on the (B, T, 3, H, D) slices of one fused tensor, each slice a leaf
             * (so the gradients are the op's own (B, T, H, D)-layout views) */
            const int64_t s5[5] = {2, 37, 3, 2, 5}, sh[4] = {2, 2, 37, 5};
            nb_tensor *base = tu_random_cpu(s5, 5, dt, -1.5, 1.5, 60 + (uint64_t)di);
            nb_tensor *baseg = nb_to_device(base, GUARD);
            ck_assert_msg(baseg, "%s", nb_last_error());
            nb_tensor *t[3], *tg[3];
            for (int j = 0; j < 3; j++) {
                t[j] = nb_detach(nb_permute(nb_select(base, 2, j), (int[]){0, 2, 1, 3}, 4));
                tg[j] = nb_detach(nb_permute(nb_select(baseg, 2, j), (int[]){0, 2, 1, 3}, 4));
                make_grad(t[j]), make_grad(tg[j]);
            }
            nb_tensor *o = nb_causal_attention(t[0], t[1], t[2], 0, p, true, g1);
            nb_tensor *og = nb_causal_attention(tg[0], tg[1], tg[2], 0, p, true, g2);
            expect_same_on_guard(o, og, "causal_attention");
            nb_tensor *go = tu_random_cpu(sh, 4, dt, -1, 1, 70);
            backward_with(o, go);
            backward_with(og, nb_to_device(go, GUARD));
            for (int j = 0; j < 3; j++)
                expect_same_on_guard(nb_grad(t[j]), nb_grad(tg[j]), "grad of a slice");
            /* contiguous operands (contiguous gradients) */
            nb_tensor *c[3], *cg[3];
            for (int j = 0; j < 3; j++) {
                c[j] = tu_random_cpu(sh, 4, dt, -1, 1, 80 + (uint64_t)j);
                cg[j] = nb_to_device(c[j], GUARD);
                make_grad(c[j]), make_grad(cg[j]);
            }
            o = nb_causal_attention(c[0], c[1], c[2], 0.3, p, true, g1);
            og = nb_causal_attention(cg[0], cg[1], cg[2], 0.3, p, true, g2);
            expect_same_on_guard(o, og, "causal_attention (contiguous)");
            backward_with(o, go);
            backward_with(og, nb_to_device(go, GUARD));
            for (int j = 0; j < 3; j++) expect_same_on_guard(nb_grad(c[j]), nb_grad(cg[j]), "grad");
            /* the packed form */
            const int64_t ps[3] = {2, 37, 30}, os[3] = {2, 37, 10};
            nb_tensor *qkv = tu_random_cpu(ps, 3, dt, -1.5, 1.5, 90), *qkvg = nb_to_device(qkv, GUARD);
            make_grad(qkv), make_grad(qkvg);
            nb_tensor *y = nb_causal_attention_qkv(qkv, 2, 0, p, true, g1);
            nb_tensor *yg = nb_causal_attention_qkv(qkvg, 2, 0, p, true, g2);
            expect_same_on_guard(y, yg, "causal_attention_qkv");
            nb_tensor *gy = tu_random_cpu(os, 3, dt, -1, 1, 91);
            backward_with(y, gy);
            backward_with(yg, nb_to_device(gy, GUARD));
            expect_same_on_guard(nb_grad(qkv), nb_grad(qkvg), "grad qkv");
            ck_assert_uint_eq(nb_generator_offset(g1), nb_generator_offset(g2));
            nb_generator_free(g1), nb_generator_free(g2);
        }
    }
    ck_assert(nb_device_supports(NB_CPU, "attention") && nb_device_supports(GUARD, "attention"));
    ck_assert(nb_device_supports(NB_CPU, "attention_backward") &&
              nb_device_supports(GUARD, "attention_backward"));
    nb_scope_end();
}
END_TEST

START_TEST(test_two_devices) {
    nb_scope_begin();
    /* q and k are on the default device (the CPU unless NB_TEST_DEVICE says), km on meta */
    char dev[32], d_m[48], m_d[48];
    nb_device_name(nb_default_device(), dev, sizeof dev);
    snprintf(d_m, sizeof d_m, "%s and meta", dev);
    snprintf(m_d, sizeof m_d, "meta and %s", dev);
    const int64_t sh[4] = {1, 2, 3, 4};
    nb_tensor *q = tu_random(sh, 4, NB_F32, -1, 1, 1), *k = tu_random(sh, 4, NB_F32, -1, 1, 2);
    nb_tensor *km = nb_zeros_on(NB_META, sh, 4, NB_F32);
    tu_assert_error(nb_causal_attention(q, km, k, 0, 0, false, NULL), NB_EDEVICE, d_m);
    tu_assert_error(nb_causal_attention(km, km, q, 0, 0, false, NULL), NB_EDEVICE, m_d);
    /* the device check comes before the other checks */
    nb_tensor *k3 = nb_zeros_on(NB_META, (int64_t[]){2, 3, 4}, 3, NB_F32);
    tu_assert_error(nb_causal_attention(q, k3, k, 0, 0, false, NULL), NB_EDEVICE, d_m);
    nb_scope_end();
}
END_TEST

/* ---- vectorized tanh and gelu ---------------------------------------------------------------------
 * Swept against libm in double: tanh within 2 ulp of the result, gelu within 4.5 ulp (relative,
 * for results above the subnormal range), gelu's derivative within 4 ulp of the larger of its
 * two terms Phi(x) and x phi(x) (it crosses zero near x = -0.75, where a relative bound means
 * nothing). Without FMA the exact a^2 split is lost and the far tails are looser. */
#ifdef __FMA__
#define GELU_ULP 4.5
#else
#define GELU_ULP 64.0
#endif

static double ulp_of(double r) {
    float rf = (float)fabs(r);
    return fmax(0x1p-149, (double)nextafterf(rf, INFINITY) - (double)rf);
}
static double r_gelu(double x) { return 0.5 * x * erfc(-x / sqrt(2.0)); }
static double r_phi_term(double x) { return x * exp(-0.5 * x * x) / sqrt(2 * M_PI); }

START_TEST(test_tanh_gelu_accuracy) {
    double w[3] = {0};
    float at[3] = {0};
    const int64_t N = 400000;
    for (int64_t i = 0; i <= N; i++) {
        /* dense near 0, where the branches meet, and out to where results saturate */
        double u = -1.0 + 2.0 * (double)i / (double)N;
        float x = (float)(u * u * u * 16.0);
        double rt = tanh((double)x), rg = r_gelu(x), rp = 0.5 * erfc(-x / sqrt(2.0)),
               rf = r_phi_term(x);
        double e0 = fabs((double)nb__cpu_tanhf(x) - rt) / ulp_of(rt);
        double e1 = fabs(rg) < 1e-37 ? 0 : fabs((double)nb__cpu_geluf(x) - rg) / ulp_of(rg);
        double big = fmax(fabs(rp), fabs(rf));
        double e2 = big < 1e-37 ? 0 : fabs((double)nb__cpu_gelu_gradf(x) - (rp + rf)) / ulp_of(big);
        double e[3] = {e0, e1, e2};
        for (int k = 0; k < 3; k++)
            if (e[k] > w[k]) w[k] = e[k], at[k] = x;
    }
    ck_assert_msg(w[0] <= 2.0, "tanh: %.2f ulp at %.9g", w[0], (double)at[0]);
    ck_assert_msg(w[1] <= GELU_ULP, "gelu: %.2f ulp at %.9g", w[1], (double)at[1]);
    ck_assert_msg(w[2] <= GELU_ULP, "gelu': %.2f ulp at %.9g", w[2], (double)at[2]);
    /* specials */
    ck_assert(nb__cpu_tanhf(0.0f) == 0 && signbit(nb__cpu_tanhf(-0.0f)));
    ck_assert(nb__cpu_tanhf(INFINITY) == 1 && nb__cpu_tanhf(-INFINITY) == -1);
    ck_assert(nb__cpu_tanhf(50) == 1 && nb__cpu_tanhf(-9.5f) == -1);
    ck_assert(isnan(nb__cpu_tanhf(NAN)) && isnan(nb__cpu_geluf(NAN)) &&
              isnan(nb__cpu_gelu_gradf(NAN)));
    ck_assert(nb__cpu_tanhf(1e-30f) == 1e-30f);
    ck_assert(nb__cpu_geluf(INFINITY) == INFINITY && nb__cpu_geluf(-40) == 0);
    ck_assert(nb__cpu_gelu_gradf(0) == 0.5f && nb__cpu_gelu_gradf(40) == 1);

    /* through the ops (the vectorized loops, f32), forward and backward */
    nb_scope_begin();
    const int64_t n = 100003;
    double *xs = malloc(sizeof(double) * (size_t)n), *rt = malloc(sizeof(double) * (size_t)n),
           *rg = malloc(sizeof(double) * (size_t)n), *rd = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        xs[i] = (double)(float)(-9.0 + 18.0 * (double)i / (double)(n - 1));
        rt[i] = tanh(xs[i]);
        rg[i] = r_gelu(xs[i]);
        rd[i] = 0.5 * erfc(-xs[i] / sqrt(2.0)) + r_phi_term(xs[i]);
    }
    nb_tensor *x = tu_tensor(xs, &n, 1, NB_F32);
    make_grad(x);
    nb_tensor *t = nb_tanh(x), *g = nb_gelu(x);
    double *tv = tu_values(t), *gv = tu_values(g);
    for (int64_t i = 0; i < n; i++) {
        ck_assert_msg(fabs(tv[i] - rt[i]) <= 2 * ulp_of(rt[i]), "tanh(%g)", xs[i]);
        ck_assert_msg(fabs(rg[i]) < 1e-37 || fabs(gv[i] - rg[i]) <= GELU_ULP * ulp_of(rg[i]),
                      "gelu(%g) = %.9g, expected %.9g", xs[i], gv[i], rg[i]);
    }
    backward_with(g, nb_ones(&n, 1, NB_F32));
    double *dv = tu_values(nb_grad(x));
    for (int64_t i = 0; i < n; i++) {
        double big = fmax(0.5 * erfc(-xs[i] / sqrt(2.0)), fabs(r_phi_term(xs[i])));
        ck_assert_msg(fabs(dv[i] - rd[i]) <= GELU_ULP * ulp_of(big), "gelu'(%g) = %.9g, expected %.9g",
                      xs[i], dv[i], rd[i]);
    }
    free(xs), free(rt), free(rg), free(rd), free(tv), free(gv), free(dv);
    nb_scope_end();
}
END_TEST

Suite *nb_suite_attention(void) {
    Suite *s = suite_create("attention");
    struct {
        const char *name;
        const TTest *fn;
    } cases[] = {
        {"forward", test_forward},
        {"backward", test_backward},
        {"gradcheck", test_gradcheck},
        {"packed_qkv", test_packed_qkv},
        {"dropout", test_dropout},
        {"threads", test_threads},
        {"bf16_operands", test_bf16_operands},
        {"no_alloc", test_no_alloc},
        {"errors", test_errors},
        {"tanh_gelu_accuracy", test_tanh_gelu_accuracy},
        {"meta", test_meta},
        {"guard", test_guard},
        {"two_devices", test_two_devices},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_add_test(tc, cases[i].fn);
        suite_add_tcase(s, tc);
    }
    return s;
}
