/* test_nn_devices.c - the nn_layers suite's device cases: layer norm, batch norm and
 * dropout on the meta and guard devices and with operands on two devices, and moving
 * modules between devices (nb_module_to). Registered by nb_suite_nn_layers. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* As in test_nn_layers.c: t against ref over t's own shape; backward from y with a given
 * output gradient; mark a leaf. */
#define CLOSE(t, ref, tol) tu_assert_close((t), (ref), nb_shape(t), nb_ndim(t), (tol))
static void backward_with(nb_tensor *y, nb_tensor *g) {
    nb_backward_opts bo = nb_backward_defaults();
    bo.grad_output = g;
    ck_assert_msg(nb_backward_ex(y, &bo) == NB_OK, "backward: %s", nb_last_error());
}
static void make_grad(nb_tensor *t) { ck_assert(nb_set_requires_grad(t, true) == NB_OK); }

/* ---- devices ---------------------------------------------------------------------------------
 * Layer norm, batch norm and dropout on the meta device (shapes, dtypes and gradients with no
 * data), on the guard device (bit for bit the CPU's results: the op definitions and their
 * backward rules never touch device memory, the kernels do), and with operands on two devices
 * (NB_EDEVICE). */
#define GUARD ((nb_device){NB_DEVICE_GUARD, 0})

/* t (a CPU tensor that does not require grad) copied to dev as a leaf that requires grad when
 * grad is set; NULL stays NULL. */
static nb_tensor *moved(nb_tensor *t, nb_device dev, bool grad) {
    if (!t) return NULL;
    nb_tensor *r = nb_to_device(t, dev);
    ck_assert_msg(r, "to_device: %s", nb_last_error());
    if (grad) make_grad(r);
    return r;
}

/* g (a guard tensor) holds exactly c's values (c on the CPU), same shape and dtype. */
static void expect_same(nb_tensor *c, nb_tensor *g, const char *what) {
    ck_assert_msg(c && g, "%s: missing (%s)", what, nb_last_error());
    tu_expect_on(g, GUARD, nb_shape(c), nb_ndim(c), nb_tensor_dtype(c), what);
    nb_tensor *h = nb_to_device(g, NB_CPU);
    ck_assert_msg(h, "%s: %s", what, nb_last_error());
    double *a = tu_values(c), *b = tu_values(h);
    for (int64_t i = 0; i < nb_numel(c); i++)
        ck_assert_msg(a[i] == b[i] || (isnan(a[i]) && isnan(b[i])),
                      "%s[%lld]: cpu %.17g, guard %.17g", what, (long long)i, a[i], b[i]);
    free(a), free(b);
}

START_TEST(test_norm_meta) {
    nb_scope_begin();
    static const nb_dtype dts[] = {NB_F32, NB_F64, NB_F16, NB_BF16};
    for (int di = 0; di < 4; di++) {
        nb_dtype dt = dts[di];
        /* layer norm, with and without the affine parameters */
        const int64_t xs[3] = {2, 3, 5}, ds[1] = {5};
        nb_tensor *x = nb_empty_on(NB_META, xs, 3, dt), *w = nb_empty_on(NB_META, ds, 1, dt);
        nb_tensor *b = nb_empty_on(NB_META, ds, 1, dt);
        make_grad(x), make_grad(w), make_grad(b);
        nb_tensor *y = nb_layer_norm(x, w, b, 1e-5);
        tu_expect_on(y, NB_META, xs, 3, dt, "layer_norm");
        backward_with(y, nb_ones_on(NB_META, xs, 3, dt));
        tu_expect_on(nb_grad(x), NB_META, xs, 3, dt, "layer_norm dx");
        tu_expect_on(nb_grad(w), NB_META, ds, 1, dt, "layer_norm dw");
        tu_expect_on(nb_grad(b), NB_META, ds, 1, dt, "layer_norm db");
        nb_clear_grad(x);
        y = nb_layer_norm(x, NULL, NULL, 1e-5);
        tu_expect_on(y, NB_META, xs, 3, dt, "layer_norm (no affine)");
        backward_with(y, nb_ones_on(NB_META, xs, 3, dt));
        tu_expect_on(nb_grad(x), NB_META, xs, 3, dt, "layer_norm dx (no affine)");

        /* batch norm: training with and without running statistics, eval */
        const int64_t bs[4] = {4, 3, 2, 2}, cs[1] = {3};
        nb_tensor *xb = nb_empty_on(NB_META, bs, 4, dt), *wb = nb_empty_on(NB_META, cs, 1, dt);
        nb_tensor *bb = nb_empty_on(NB_META, cs, 1, dt);
        nb_tensor *rm = nb_zeros_on(NB_META, cs, 1, NB_F32);
        nb_tensor *rv = nb_ones_on(NB_META, cs, 1, NB_F32);
        make_grad(xb), make_grad(wb), make_grad(bb);
        for (int mode = 0; mode < 3; mode++) {
            nb_clear_grad(xb), nb_clear_grad(wb), nb_clear_grad(bb);
            nb_tensor *yb = nb_batch_norm(xb, mode == 1 ? NULL : rm, mode == 1 ? NULL : rv, wb, bb,
                                          mode < 2, 0.1, 1e-5);
            tu_expect_on(yb, NB_META, bs, 4, dt, "batch_norm");
            backward_with(yb, nb_ones_on(NB_META, bs, 4, dt));
            tu_expect_on(nb_grad(xb), NB_META, bs, 4, dt, "batch_norm dx");
            tu_expect_on(nb_grad(wb), NB_META, cs, 1, dt, "batch_norm dw");
            tu_expect_on(nb_grad(bb), NB_META, cs, 1, dt, "batch_norm db");
        }
        tu_expect_on(rm, NB_META, cs, 1, NB_F32, "running_mean");

        /* dropout: no mask is drawn, but the generator moves as on the CPU */
        const int64_t ps[2] = {10, 7};
        nb_generator *gm = nb_generator_new(4), *gc = nb_generator_new(4);
        nb_tensor *xd = nb_empty_on(NB_META, ps, 2, dt);
        make_grad(xd);
        nb_tensor *yd = nb_dropout(xd, 0.3, true, gm);
        tu_expect_on(yd, NB_META, ps, 2, dt, "dropout");
        ck_assert_ptr_nonnull(nb_dropout(tu_random(ps, 2, dt, -1, 1, 1), 0.3, true, gc));
        ck_assert_uint_eq(nb_generator_offset(gm), nb_generator_offset(gc));
        ck_assert_uint_eq(nb_generator_offset(gm), (70 + 3) / 4);
        backward_with(yd, nb_ones_on(NB_META, ps, 2, dt));
        tu_expect_on(nb_grad(xd), NB_META, ps, 2, dt, "dropout dx");
        nb_generator_free(gm), nb_generator_free(gc);
    }
    /* reading a meta result is an error, not a crash */
    nb_tensor *y = nb_layer_norm(nb_empty_on(NB_META, (int64_t[]){2, 4}, 2, NB_F32), NULL, NULL,
                                 1e-5);
    ck_assert_ptr_nonnull(y);
    ck_assert_ptr_null(nb_data(y));
    nb_scope_end();
}
END_TEST

START_TEST(test_norm_guard) {
    nb_scope_begin();
    static const nb_dtype dts[] = {NB_F32, NB_F64, NB_F16, NB_BF16};
    for (int di = 0; di < 4; di++) {
        nb_dtype dt = dts[di];
        /* layer norm on a transposed view (dense() copies it on the device) */
        const int64_t xs[3] = {3, 7, 6}, D = 7;
        nb_tensor *x = tu_random_cpu(xs, 3, dt, -2, 3, 10), *w = tu_random_cpu(&D, 1, dt, 0.5, 1.5, 11);
        nb_tensor *b = tu_random_cpu(&D, 1, dt, -1, 1, 12);
        nb_tensor *g = tu_random_cpu((int64_t[]){3, 6, 7}, 3, dt, -1, 1, 13);
        nb_tensor *xg = moved(x, GUARD, true), *wg = moved(w, GUARD, true);
        nb_tensor *bg = moved(b, GUARD, true), *gg = moved(g, GUARD, false);
        make_grad(x), make_grad(w), make_grad(b);
        nb_tensor *y = nb_layer_norm(nb_transpose(x, 1, 2), w, b, 1e-5);
        nb_tensor *yg = nb_layer_norm(nb_transpose(xg, 1, 2), wg, bg, 1e-5);
        expect_same(y, yg, "layer_norm");
        backward_with(y, g);
        backward_with(yg, gg);
        expect_same(nb_grad(x), nb_grad(xg), "layer_norm dx");
        expect_same(nb_grad(w), nb_grad(wg), "layer_norm dw");
        expect_same(nb_grad(b), nb_grad(bg), "layer_norm db");

        /* batch norm: two training steps updating strided f64 running statistics, then eval */
        const int64_t bs[3] = {5, 3, 4}, C = 3;
        nb_tensor *wb = tu_random_cpu(&C, 1, dt, 0.5, 1.5, 20), *bb = tu_random_cpu(&C, 1, dt, -1, 1, 21);
        nb_tensor *stats = tu_random_cpu((int64_t[]){3, 2}, 2, NB_F64, 0.5, 1.5, 22);
        nb_tensor *statsg = moved(stats, GUARD, false);
        nb_tensor *rm = nb_select(stats, 1, 0), *rv = nb_select(stats, 1, 1);
        nb_tensor *rmg = nb_select(statsg, 1, 0), *rvg = nb_select(statsg, 1, 1);
        nb_tensor *wbg = moved(wb, GUARD, true), *bbg = moved(bb, GUARD, true);
        make_grad(wb), make_grad(bb);
        for (int step = 0; step < 3; step++) {
            bool training = step < 2;
            nb_tensor *xb = tu_random_cpu(bs, 3, dt, -2, 3, 30 + (uint64_t)step);
            nb_tensor *gb = tu_random_cpu(bs, 3, dt, -1, 1, 40 + (uint64_t)step);
            nb_tensor *xbg = moved(xb, GUARD, true), *gbg = moved(gb, GUARD, false);
            make_grad(xb);
            nb_clear_grad(wb), nb_clear_grad(bb), nb_clear_grad(wbg), nb_clear_grad(bbg);
            nb_tensor *yb = nb_batch_norm(xb, rm, rv, wb, bb, training, 0.1, 1e-5);
            nb_tensor *ybg = nb_batch_norm(xbg, rmg, rvg, wbg, bbg, training, 0.1, 1e-5);
            expect_same(yb, ybg, "batch_norm");
            expect_same(rm, rmg, "running_mean");
            expect_same(rv, rvg, "running_var");
            backward_with(yb, gb);
            backward_with(ybg, gbg);
            expect_same(nb_grad(xb), nb_grad(xbg), "batch_norm dx");
            expect_same(nb_grad(wb), nb_grad(wbg), "batch_norm dw");
            expect_same(nb_grad(bb), nb_grad(bbg), "batch_norm db");
        }
        /* the running statistics moved */
        double *sv = tu_values(stats);
        ck_assert(sv[0] != sv[1] || sv[2] != sv[3]);
        free(sv);

        /* dropout from the same generator state */
        const int64_t n = 5000;
        nb_tensor *xd = tu_random_cpu(&n, 1, dt, 1, 2, 50), *gd = tu_random_cpu(&n, 1, dt, -1, 1, 51);
        nb_tensor *xdg = moved(xd, GUARD, true), *gdg = moved(gd, GUARD, false);
        make_grad(xd);
        nb_generator *g1 = nb_generator_new(8), *g2 = nb_generator_new(8);
        nb_tensor *yd = nb_dropout(xd, 0.4, true, g1), *ydg = nb_dropout(xdg, 0.4, true, g2);
        expect_same(yd, ydg, "dropout");
        ck_assert_uint_eq(nb_generator_offset(g1), nb_generator_offset(g2));
        backward_with(yd, gd);
        backward_with(ydg, gdg);
        expect_same(nb_grad(xd), nb_grad(xdg), "dropout dx");
        nb_generator_free(g1), nb_generator_free(g2);
    }
    /* the kernels are there on both devices */
    static const char *const kernels[] = {"layer_norm",       "layer_norm_backward",
                                          "batch_norm_stats", "batch_norm_apply",
                                          "batch_norm_backward", "dropout"};
    for (int i = 0; i < 6; i++) {
        ck_assert_msg(nb_device_supports(NB_CPU, kernels[i]), "cpu lacks %s", kernels[i]);
        ck_assert_msg(nb_device_supports(GUARD, kernels[i]), "guard lacks %s", kernels[i]);
    }
    nb_scope_end();
}
END_TEST

START_TEST(test_norm_two_devices) {
    nb_scope_begin();
    /* the operands are on the default device (the CPU unless NB_TEST_DEVICE says) and meta */
    char dev[32], d_m[48], m_d[48];
    nb_device_name(nb_default_device(), dev, sizeof dev);
    snprintf(d_m, sizeof d_m, "%s and meta", dev);
    snprintf(m_d, sizeof m_d, "meta and %s", dev);
    nb_tensor *x = tu_random((int64_t[]){4, 3}, 2, NB_F32, -1, 1, 1);
    nb_tensor *c3 = tu_random((int64_t[]){3}, 1, NB_F32, 0.5, 1.5, 2);
    nb_tensor *m3 = nb_ones_on(NB_META, (int64_t[]){3}, 1, NB_F32);
    tu_assert_error(nb_layer_norm(x, m3, NULL, 1e-5), NB_EDEVICE, d_m);
    tu_assert_error(nb_layer_norm(x, c3, m3, 1e-5), NB_EDEVICE, d_m);
    tu_assert_error(nb_batch_norm(x, NULL, NULL, m3, NULL, true, 0.1, 1e-5), NB_EDEVICE, d_m);
    tu_assert_error(nb_batch_norm(x, m3, m3, NULL, NULL, false, 0.1, 1e-5), NB_EDEVICE, d_m);
    tu_assert_error(nb_batch_norm(x, c3, m3, c3, c3, true, 0.1, 1e-5), NB_EDEVICE, d_m);
    nb_tensor *xm = nb_ones_on(NB_META, (int64_t[]){4, 3}, 2, NB_F32);
    tu_assert_error(nb_layer_norm(xm, c3, NULL, 1e-5), NB_EDEVICE, m_d);
    tu_assert_error(nb_batch_norm(xm, c3, c3, NULL, NULL, true, 0.1, 1e-5), NB_EDEVICE, m_d);
    /* a module's buffers (on the default device) with a meta input */
    nb_module *bn = nb_batch_norm1d_new(3, NULL);
    tu_assert_error(nb_forward(bn, xm), NB_EDEVICE, m_d);
    nb_module_free(bn);
    nb_scope_end();
}
END_TEST

TCase *nb_tcase_norm_devices(void) {
    TCase *tc = tcase_create("norm_devices");
    tcase_add_test(tc, test_norm_meta);
    tcase_add_test(tc, test_norm_guard);
    tcase_add_test(tc, test_norm_two_devices);
    return tc;
}

/* ==== nb_module_to ============================================================================
 * Moving a module between devices: parameters, gradients, buffers and flat buffers move;
 * tensor identities, names and requires_grad stay; values survive a round trip through the
 * guard device (whose memory the host cannot touch); a module moved to meta keeps its
 * shapes. */
#define MT_GUARD ((nb_device){NB_DEVICE_GUARD, 0})

static bool mt_on(const nb_tensor *t, nb_device_type type) {
    return t && nb_tensor_device(t).type == type;
}

/* Every parameter, gradient (where there is one) and buffer of m is on `type`. */
static void mt_assert_on(nb_module *m, nb_device_type type) {
    const nb_params *p = nb_parameters(m), *b = nb_buffers(m);
    for (int i = 0; i < p->count; i++) {
        ck_assert_msg(mt_on(p->tensors[i], type), "parameter %s", p->names[i]);
        ck_assert(nb_requires_grad(p->tensors[i]));
        nb_tensor *g = nb_grad(p->tensors[i]);
        ck_assert_msg(!g || mt_on(g, type), "gradient of %s", p->names[i]);
    }
    for (int i = 0; i < b->count; i++)
        ck_assert_msg(mt_on(b->tensors[i], type), "buffer %s", b->names[i]);
}

/* An MLP with a buffer-holding layer, in eval mode (forward does not change the buffers). */
static nb_module *mt_mlp(void) {
    nb_module *m = nb_sequential_new(nb_linear_new(4, 8, NULL), nb_batch_norm1d_new(8, NULL),
                                     nb_relu_new(), nb_linear_new(8, 3, NULL), NULL);
    ck_assert(m);
    nb_module_train(m, false);
    return m;
}

/* All parameter values and gradients of m, concatenated (caller frees). */
static double *mt_snapshot(nb_module *m, bool grads, int64_t *n) {
    const nb_params *p = nb_parameters(m);
    int64_t total = 0;
    for (int i = 0; i < p->count; i++) total += nb_numel(p->tensors[i]);
    double *v = malloc(sizeof(double) * (size_t)(total ? total : 1)), *o = v;
    for (int i = 0; i < p->count; i++) {
        nb_tensor *t = grads ? nb_grad(p->tensors[i]) : p->tensors[i];
        ck_assert(t);
        double *x = tu_values(t);
        memcpy(o, x, sizeof(double) * (size_t)nb_numel(t));
        o += nb_numel(t);
        free(x);
    }
    *n = total;
    return v;
}

static void mt_assert_same(const double *a, const double *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(a[i] == b[i], "element %lld: %.17g vs %.17g", (long long)i, a[i], b[i]);
}

static void mt_round_trip(bool flat) {
    nb_scope_begin();
    /* the trip starts and ends on the CPU, whatever the default device (no-ops on the CPU) */
    nb_module *m = mt_mlp();
    ck_assert(nb_module_to(m, NB_CPU) == NB_OK);
    if (flat) ck_assert(nb_module_flatten_parameters(m, 0) == NB_OK);
    nb_tensor *x = nb_to_device(tu_random((int64_t[]){5, 4}, 2, NB_F32, -1, 1, 3), NB_CPU);
    nb_tensor *y0 = nb_forward(m, x);
    backward_with(y0, nb_ones_on(NB_CPU, nb_shape(y0), 2, NB_F32));
    double *y0v = tu_values(y0);
    int64_t np, ng;
    double *p0 = mt_snapshot(m, false, &np), *g0 = mt_snapshot(m, true, &ng);
    const nb_params *p = nb_parameters(m);
    int count = p->count;
    nb_tensor *ids[8];
    const char *names[8];
    ck_assert_int_le(count, 8);
    for (int i = 0; i < count; i++) ids[i] = p->tensors[i], names[i] = strdup(p->names[i]);

    ck_assert_msg(nb_module_to(m, MT_GUARD) == NB_OK, "%s", nb_last_error());
    mt_assert_on(m, NB_DEVICE_GUARD);
    p = nb_parameters(m);
    ck_assert_int_eq(p->count, count);
    for (int i = 0; i < count; i++) {
        ck_assert_ptr_eq(p->tensors[i], ids[i]); /* the same tensors, names and flags */
        ck_assert_str_eq(p->names[i], names[i]);
    }
    nb_tensor *fp = nb_module_flat_params(m), *fg = nb_module_flat_grads(m);
    if (flat) {
        ck_assert(mt_on(fp, NB_DEVICE_GUARD) && mt_on(fg, NB_DEVICE_GUARD));
        for (int i = 0; i < count; i++) {
            ck_assert(nb_shares_storage(p->tensors[i], fp));
            ck_assert(nb_shares_storage(nb_grad(p->tensors[i]), fg));
        }
    }
    ck_assert(nb_module_to(m, MT_GUARD) == NB_OK); /* already there: nothing to do */
    ck_assert(nb_module_to(m, NB_CPU) == NB_OK);
    mt_assert_on(m, NB_DEVICE_CPU);
    if (flat)
        for (int i = 0; i < count; i++) {
            ck_assert(nb_shares_storage(p->tensors[i], nb_module_flat_params(m)));
            ck_assert(nb_shares_storage(nb_grad(p->tensors[i]), nb_module_flat_grads(m)));
        }
    int64_t np1, ng1;
    double *p1 = mt_snapshot(m, false, &np1), *g1 = mt_snapshot(m, true, &ng1);
    ck_assert(np1 == np && ng1 == ng);
    mt_assert_same(p1, p0, np);
    mt_assert_same(g1, g0, ng);
    nb_tensor *y1 = nb_forward(m, x);
    ck_assert(y1);
    double *y1v = tu_values(y1);
    mt_assert_same(y1v, y0v, nb_numel(y0));
    for (int i = 0; i < count; i++) free(nb__unconst(names[i]));
    free(y0v), free(y1v), free(p0), free(p1), free(g0), free(g1);
    nb_module_free(m);
    nb_scope_end();
}

START_TEST(test_module_to_guard) {
    mt_round_trip(false);
    mt_round_trip(true);
}
END_TEST

/* An elementwise model runs forward and backward on the guard device after the move (and
 * after flattening there), with the CPU's values. */
static nb_tensor *mt_affine_forward(nb_module *m, nb_tensor *x) {
    return nb_add(nb_mul(x, nb_module_param(m, "w")), nb_module_param(m, "b"));
}
static const nb_module_vtable mt_affine_vt = {.type_name = "Affine", .forward = mt_affine_forward};

START_TEST(test_module_to_guard_compute) {
    nb_scope_begin();
    const int64_t shape[2] = {3, 4};
    nb_module *m[2]; /* m[0] on the CPU whatever the default device, m[1] moved to guard */
    for (int k = 0; k < 2; k++) {
        m[k] = nb_module_new(&mt_affine_vt, NULL);
        nb_module_add_parameter(m[k], "w", tu_random_cpu(shape, 2, NB_F32, -1, 1, 1));
        nb_module_add_parameter(m[k], "b", tu_random_cpu(shape, 2, NB_F32, -1, 1, 2));
    }
    ck_assert(nb_module_to(m[1], MT_GUARD) == NB_OK);
    /* flattening on the device makes the flat buffers there */
    ck_assert_msg(nb_module_flatten_parameters(m[1], 0) == NB_OK, "%s", nb_last_error());
    ck_assert(mt_on(nb_module_flat_params(m[1]), NB_DEVICE_GUARD));
    ck_assert(mt_on(nb_module_flat_grads(m[1]), NB_DEVICE_GUARD));
    nb_tensor *x = tu_random_cpu(shape, 2, NB_F32, -2, 2, 3);
    nb_tensor *g = tu_random_cpu(shape, 2, NB_F32, -1, 1, 4);
    nb_tensor *yc = nb_forward(m[0], x);
    nb_tensor *yg = nb_forward(m[1], nb_to_device(x, MT_GUARD));
    ck_assert_msg(yg && mt_on(yg, NB_DEVICE_GUARD), "%s", nb_last_error());
    backward_with(yc, g);
    backward_with(yg, nb_to_device(g, MT_GUARD));
    double *vc = tu_values(yc);
    CLOSE(yg, vc, 0);
    free(vc);
    for (int i = 0; i < 2; i++) {
        const char *n = i ? "b" : "w";
        nb_tensor *gg = nb_grad(nb_module_param(m[1], n));
        ck_assert(mt_on(gg, NB_DEVICE_GUARD));
        double *gc = tu_values(nb_grad(nb_module_param(m[0], n)));
        CLOSE(nb_to_device(gg, NB_CPU), gc, 0);
        free(gc);
    }
    nb_module_free(m[0]);
    nb_module_free(m[1]);
    nb_scope_end();
}
END_TEST

/* To meta: shapes and dtypes stay, values go; coming back from meta is an error that leaves
 * the module as it was. */
START_TEST(test_module_to_meta) {
    nb_scope_begin();
    nb_module *m = mt_mlp();
    const nb_params *p = nb_parameters(m);
    int count = p->count;
    int64_t shapes[8][2];
    int ndims[8];
    ck_assert_int_le(count, 8);
    for (int i = 0; i < count; i++) {
        ndims[i] = nb_ndim(p->tensors[i]);
        for (int d = 0; d < ndims[i]; d++) shapes[i][d] = nb_shape(p->tensors[i])[d];
    }
    ck_assert(nb_module_to(m, NB_META) == NB_OK);
    mt_assert_on(m, NB_DEVICE_META);
    p = nb_parameters(m);
    for (int i = 0; i < count; i++) {
        nb_tensor *t = p->tensors[i];
        ck_assert_int_eq(nb_ndim(t), ndims[i]);
        for (int d = 0; d < ndims[i]; d++) ck_assert_int_eq(nb_shape(t)[d], shapes[i][d]);
        ck_assert(nb_tensor_dtype(t) == NB_F32);
    }
    ck_assert_int_eq(nb_num_parameters(m), 4 * 8 + 8 + 8 + 8 + 8 * 3 + 3);
    nb_tensor *w = p->tensors[0];
    ck_assert(nb_data(w) == NULL);
    nb_clear_error();
    ck_assert(nb_module_to(m, NB_CPU) == NB_EDEVICE);
    ck_assert(strstr(nb_last_error(), "module_to") && strstr(nb_last_error(), "meta"));
    mt_assert_on(m, NB_DEVICE_META);
    ck_assert(nb_module_to(NULL, NB_CPU) == NB_ENULL);
    nb_module_free(m);
    nb_scope_end();
}
END_TEST

TCase *nb_tcase_module_to(void) {
    TCase *tc = tcase_create("module_to");
    tcase_add_test(tc, test_module_to_guard);
    tcase_add_test(tc, test_module_to_guard_compute);
    tcase_add_test(tc, test_module_to_meta);
    return tc;
}
