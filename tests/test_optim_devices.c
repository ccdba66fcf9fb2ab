/* test_optim_devices.c - the optim suite's device cases: every update kernel and clipping on
 * the guard device bit for bit the CPU's, optimizer steps on meta parameters, and the errors
 * of parameters, gradients and state on different devices. Registered by nb_suite_optim. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* ---- devices: guard, meta, mixed ------------------------------------------------------------- */
#define GUARD ((nb_device){NB_DEVICE_GUARD, 0})

/* Optimizer configurations covering every update kernel and every state slot. */
#define NKINDS 7
static nb_optim *make_kind(int k, const nb_params *ps) {
    switch (k) {
    case 0: {
        nb_sgd_opts o = nb_sgd_defaults();
        o.lr = 0.1, o.momentum = 0.9, o.nesterov = true, o.weight_decay = 0.01;
        return nb_sgd_new(ps, &o);
    }
    case 1: {
        nb_sgd_opts o = nb_sgd_defaults();
        o.lr = 0.1, o.maximize = true;
        return nb_sgd_new(ps, &o);
    }
    case 2: {
        nb_adam_opts o = nb_adam_defaults();
        o.lr = 0.01, o.amsgrad = true, o.weight_decay = 0.1;
        return nb_adam_new(ps, &o);
    }
    case 3: {
        nb_adamw_opts o = nb_adamw_defaults();
        o.lr = 0.01;
        return nb_adamw_new(ps, &o);
    }
    case 4: {
        nb_rmsprop_opts o = nb_rmsprop_defaults();
        o.centered = true, o.momentum = 0.5, o.weight_decay = 0.1;
        return nb_rmsprop_new(ps, &o);
    }
    case 5: return nb_rmsprop_new(ps, NULL);
    default: {
        nb_adagrad_opts o = nb_adagrad_defaults();
        o.lr_decay = 0.1, o.initial_accumulator_value = 0.5;
        return nb_adagrad_new(ps, &o);
    }
    }
}

/* a and b (on any devices) hold the same values bit for bit (NaN equal to NaN). */
static void assert_same_values(const nb_tensor *a, const nb_tensor *b, const char *what) {
    ck_assert_int_eq(nb_numel(a), nb_numel(b));
    double *va = tu_values(a), *vb = tu_values(b);
    for (int64_t i = 0; i < nb_numel(a); i++)
        ck_assert_msg(va[i] == vb[i] || (isnan(va[i]) && isnan(vb[i])),
                      "%s: element %lld differs: %.17g vs %.17g", what, (long long)i, va[i],
                      vb[i]);
    free(va);
    free(vb);
}

static bool on(const nb_tensor *t, nb_device_type type) {
    return nb_tensor_device(t).type == type;
}

/* tu_random on the CPU whatever the default device: the reference side of the CPU-guard
 * comparisons (the tensor itself when the default is the CPU). */
static nb_tensor *cpu_random(const int64_t *shape, int ndim, nb_dtype dt, double lo, double hi,
                             uint64_t seed) {
    nb_tensor *t = nb_to_device(tu_random(shape, ndim, dt, lo, hi, seed), NB_CPU);
    ck_assert_msg(t != NULL, "%s", nb_last_error());
    return t;
}

/* Every update on the guard device gives the CPU's values exactly (same kernels): the step
 * driver, state allocation, strided gradients and state save/load across devices never touch
 * device memory from the host. */
START_TEST(test_guard_matches_cpu) {
    nb_scope_begin();
    const int64_t sw[2] = {3, 4}, sb[1] = {40000};
    nb_tensor *wc = cpu_random(sw, 2, NB_F32, -1, 1, 1), *bc = cpu_random(sb, 1, NB_F64, -1, 1, 2);
    nb_tensor *wg = nb_to_device(wc, GUARD), *bg = nb_to_device(bc, GUARD);
    ck_assert(wg && bg);
    const char *names[2] = {"w", "b"};
    nb_params pc = {2, (nb_tensor *[]){wc, bc}, names}, pg = {2, (nb_tensor *[]){wg, bg}, names};
    nb_optim *oc = make_kind(_i, &pc), *og = make_kind(_i, &pg);
    ck_assert_msg(oc && og, "%s", nb_last_error());
    for (int s = 0; s < 5; s++) {
        nb_tensor *gw = cpu_random(sw, 2, NB_F32, -1, 1, 10 + (uint64_t)s);
        nb_tensor *gb = cpu_random(sb, 1, NB_F64, -2, 2, 20 + (uint64_t)s);
        ASSERT_OK(nb_set_grad(wc, gw));
        ASSERT_OK(nb_set_grad(bc, gb));
        /* w's guard gradient is a strided view: the step packs it on the device */
        nb_tensor *gwt = nb_to_device(nb_contiguous(nb_transpose(gw, 0, 1)), GUARD);
        ASSERT_OK(nb_set_grad(wg, nb_transpose(gwt, 0, 1)));
        ck_assert(!nb_is_contiguous(nb_grad(wg)));
        ASSERT_OK(nb_set_grad(bg, nb_to_device(gb, GUARD)));
        ASSERT_OK(nb_step(oc));
        ASSERT_OK(nb_step(og));
        if (s == 2) {
            /* swap the states across devices: loading moves them to the parameters' devices */
            const nb_params *sg = nb_optim_state(og);
            ck_assert(sg);
            for (int i = 0; i < sg->count; i++)
                if (nb_ndim(sg->tensors[i]) > 0) ck_assert(on(sg->tensors[i], NB_DEVICE_GUARD));
            ASSERT_OK(nb_optim_load_state(oc, sg->names, sg->tensors, sg->count));
            const nb_params *sc = nb_optim_state(oc);
            for (int i = 0; i < sc->count; i++) ck_assert(on(sc->tensors[i], NB_DEVICE_CPU));
            ASSERT_OK(nb_optim_load_state(og, sc->names, sc->tensors, sc->count));
            sg = nb_optim_state(og);
            for (int i = 0; i < sg->count; i++)
                if (nb_ndim(sg->tensors[i]) > 0) ck_assert(on(sg->tensors[i], NB_DEVICE_GUARD));
        }
    }
    assert_same_values(wg, wc, "w");
    assert_same_values(bg, bc, "b");
    const nb_params *sc = nb_optim_state(oc);
    int nc = sc->count;
    nb_tensor **tc = malloc(sizeof(nb_tensor *) * (size_t)nc);
    for (int i = 0; i < nc; i++) tc[i] = sc->tensors[i];
    const nb_params *sg = nb_optim_state(og);
    ck_assert_int_eq(sg->count, nc);
    for (int i = 0; i < nc; i++) assert_same_values(sg->tensors[i], tc[i], sg->names[i]);
    free(tc);
    /* zero_grad keeps working on the device */
    ASSERT_OK(nb_zero_grad(og));
    nb_optim_free(oc);
    nb_optim_free(og);
    nb_scope_end();
}
END_TEST

/* Clipping on the guard device: the same norms and clipped gradients as on the CPU, for a
 * large (parallel) f32, a strided f32 and a bf16 gradient. */
START_TEST(test_clip_guard) {
    nb_scope_begin();
    const int64_t sa[1] = {70000}, sb[2] = {3, 4}, sh[1] = {5};
    nb_tensor *pc[3] = {nb_zeros_on(NB_CPU, sa, 1, NB_F32), nb_zeros_on(NB_CPU, sb, 2, NB_F32),
                        nb_zeros_on(NB_CPU, sh, 1, NB_BF16)};
    nb_tensor *pg[3] = {nb_zeros_on(GUARD, sa, 1, NB_F32), nb_zeros_on(GUARD, sb, 2, NB_F32),
                        nb_zeros_on(GUARD, sh, 1, NB_BF16)};
    nb_tensor *g[3] = {cpu_random(sa, 1, NB_F32, -1, 1, 1), cpu_random(sb, 2, NB_F32, -10, 10, 2),
                       cpu_random(sh, 1, NB_BF16, -4, 4, 3)};
    for (int i = 0; i < 3; i++) {
        ASSERT_OK(nb_set_grad(pc[i], nb_clone(g[i])));
        nb_tensor *d = nb_to_device(g[i], GUARD);
        if (i == 1) d = nb_transpose(nb_to_device(nb_contiguous(nb_transpose(g[i], 0, 1)), GUARD),
                                     0, 1);
        ASSERT_OK(nb_set_grad(pg[i], d));
    }
    ck_assert(!nb_is_contiguous(nb_grad(pg[1])));
    nb_params lc = {3, pc, NULL}, lg = {3, pg, NULL};
    const double types[4] = {INFINITY, 1, 3, 2};
    for (int k = 0; k < 4; k++) {
        double nc = nb_clip_grad_norm(&lc, 5.0, types[k]);
        double ng = nb_clip_grad_norm(&lg, 5.0, types[k]);
        ck_assert_msg(nc > 0 && nc == ng, "norm_type %g: cpu %.17g guard %.17g", types[k], nc, ng);
        for (int i = 0; i < 3; i++) assert_same_values(nb_grad(pg[i]), nb_grad(pc[i]), "clip");
    }
    ck_assert(!nb_is_contiguous(nb_grad(pg[1])));
    ASSERT_OK(nb_clip_grad_value(&lc, 0.01));
    ASSERT_OK(nb_clip_grad_value(&lg, 0.01));
    for (int i = 0; i < 3; i++) assert_same_values(nb_grad(pg[i]), nb_grad(pc[i]), "value");
    nb_scope_end();
}
END_TEST

/* A model of elementwise ops only: y = x * w + b (w, b of x's shape). */
static nb_tensor *affine_forward(nb_module *m, nb_tensor *x) {
    return nb_add(nb_mul(x, nb_module_param(m, "w")), nb_module_param(m, "b"));
}
static const nb_module_vtable affine_vt = {.type_name = "Affine", .forward = affine_forward};

static nb_module *affine(const int64_t *shape) {
    nb_module *m = nb_module_new(&affine_vt, NULL);
    ck_assert(m);
    ck_assert(nb_module_add_parameter(m, "w", tu_random(shape, 2, NB_F32, -1, 1, 5)));
    ck_assert(nb_module_add_parameter(m, "b", tu_random(shape, 2, NB_F32, -1, 1, 6)));
    return m;
}

/* Forward and backward on a meta model: gradients on meta, of the parameters' shapes. */
static void meta_backward(nb_module *m, const int64_t *shape) {
    nb_tensor *x = nb_ones_on(NB_META, shape, 2, NB_F32);
    nb_tensor *y = nb_forward(m, x);
    ck_assert_msg(y, "%s", nb_last_error());
    ck_assert(on(y, NB_DEVICE_META));
    nb_tensor *gy = nb_ones_on(NB_META, shape, 2, NB_F32);
    nb_backward_opts bo = nb_backward_defaults();
    bo.grad_output = gy;
    ASSERT_OK(nb_backward_ex(y, &bo));
}

/* An optimizer step on the meta device: state is created (on meta, with the parameters'
 * shapes), the step count advances, no kernel runs and nothing fails; clipping reports NaN
 * (no values) without an error. */
START_TEST(test_meta_step) {
    nb_scope_begin();
    const int64_t shape[2] = {3, 4};
    nb_module *m = affine(shape);
    ASSERT_OK(nb_module_to(m, NB_META));
    nb_optim *o = make_kind(_i, nb_parameters(m));
    ck_assert_msg(o, "%s", nb_last_error());
    for (int s = 0; s < 2; s++) {
        nb_scope_begin();
        ASSERT_OK(nb_zero_grad(o));
        meta_backward(m, shape);
        nb_tensor *gw = nb_grad(nb_module_param(m, "w"));
        ck_assert(gw && on(gw, NB_DEVICE_META));
        ck_assert(nb_ndim(gw) == 2 && nb_shape(gw)[0] == 3 && nb_shape(gw)[1] == 4);
        nb_clear_error();
        double norm = nb_clip_grad_norm(nb_parameters(m), 1.0, 2);
        ck_assert_msg(isnan(norm) && nb_last_status() == NB_OK, "norm %g: %s", norm,
                      nb_last_error());
        ASSERT_OK(nb_clip_grad_value(nb_parameters(m), 0.5));
        ASSERT_OK(nb_step(o));
        nb_scope_end();
    }
    const nb_params *st = nb_optim_state(o);
    ck_assert(st);
    int nslots = 0;
    for (int i = 0; i < st->count; i++) {
        nb_tensor *t = st->tensors[i];
        if (strncmp(st->names[i], "step.", 5) == 0) {
            ck_assert_double_eq(nb_item_f64(t), 2);
        } else if (strncmp(st->names[i], "param_groups.", 13) != 0) {
            ck_assert_msg(on(t, NB_DEVICE_META), "%s", st->names[i]);
            ck_assert(nb_ndim(t) == 2 && nb_shape(t)[0] == 3 && nb_shape(t)[1] == 4);
            nslots++;
        }
    }
    ck_assert_int_gt(nslots + (_i == 1 || _i == 3 ? 2 : 0), 0); /* plain sgd has no state */
    ck_assert(on(nb_module_param(m, "w"), NB_DEVICE_META));
    nb_optim_free(o);
    nb_module_free(m);
    nb_scope_end();
}
END_TEST

/* Operands on two devices are an error, with nothing updated; state made before the model
 * moved is reported, and loading it again moves it; meta state cannot be loaded into a CPU
 * optimizer. Schedule state may come from another device. */
START_TEST(test_device_errors) {
    nb_scope_begin();
    const int64_t shape[2] = {2, 3};
    /* The messages name the default device, where the tests' tensors live; the model moves
     * to another device with data: the guard device, or the CPU when guard is the default. */
    nb_device other = nb_default_device().type == NB_DEVICE_CPU ? GUARD : NB_CPU;
    char dn[32], odn[32], on_msg[64], state_msg[128];
    nb_device_name(nb_default_device(), dn, sizeof dn);
    nb_device_name(other, odn, sizeof odn);
    snprintf(on_msg, sizeof on_msg, "operands on %s and meta", dn);
    snprintf(state_msg, sizeof state_msg, "the state of 'w' is on %s but the parameter is on %s",
             dn, odn);
    /* a parameter with a meta gradient */
    nb_tensor *w = tu_random(shape, 2, NB_F32, -1, 1, 1);
    nb_params ps = {1, (nb_tensor *[]){w}, (const char *[]){"w"}};
    nb_optim *o = nb_adam_new(&ps, NULL);
    ASSERT_OK(nb_set_grad(w, nb_ones_on(NB_META, shape, 2, NB_F32)));
    double *w0 = tu_values(w);
    ASSERT_ST(nb_step(o), NB_EDEVICE, on_msg);
    tu_assert_close(w, w0, shape, 2, 0);
    ck_assert_int_eq(nb_optim_state(o)->count, 5); /* hyperparameters only: no state made */
    free(w0);
    nb_optim_free(o);

    /* moving the model after the optimizer made state */
    nb_module *m = affine(shape);
    o = nb_adam_new(nb_parameters(m), NULL);
    nb_tensor *mw = nb_module_param(m, "w"), *mb = nb_module_param(m, "b");
    ASSERT_OK(nb_set_grad(mw, nb_ones(shape, 2, NB_F32)));
    ASSERT_OK(nb_set_grad(mb, nb_ones(shape, 2, NB_F32)));
    ASSERT_OK(nb_step(o));
    ASSERT_OK(nb_module_to(m, other));
    ck_assert(nb_module_param(m, "w") == mw && on(mw, other.type));
    ck_assert(on(nb_grad(mw), other.type));
    double *before = tu_values(mw);
    ASSERT_ST(nb_step(o), NB_EDEVICE, state_msg);
    tu_assert_close(mw, before, shape, 2, 0);
    const nb_params *st = nb_optim_state(o);
    ASSERT_OK(nb_optim_load_state(o, st->names, st->tensors, st->count));
    ASSERT_OK(nb_step(o));
    st = nb_optim_state(o);
    for (int i = 0; i < st->count; i++)
        if (nb_ndim(st->tensors[i]) > 0) ck_assert(on(st->tensors[i], other.type));
    free(before);
    nb_optim_free(o);

    /* meta state into a CPU optimizer */
    ASSERT_OK(nb_module_to(m, NB_META));
    o = nb_adam_new(nb_parameters(m), NULL);
    meta_backward(m, shape);
    ASSERT_OK(nb_step(o));
    nb_module *c = affine(shape);
    nb_optim *oc = nb_adam_new(nb_parameters(c), NULL);
    st = nb_optim_state(o);
    ASSERT_ST(nb_optim_load_state(oc, st->names, st->tensors, st->count), NB_EDEVICE,
              "optim_load_state (adam): 'exp_avg.w'");
    ck_assert_int_eq(nb_optim_state(oc)->count, 5); /* unchanged */
    nb_optim_free(oc);
    nb_optim_free(o);
    nb_module_free(c);
    nb_module_free(m);

    nb_sgd_opts so2 = nb_sgd_defaults();
    so2.lr = 0.1;
    /* schedule state read from the guard device */
    o = nb_sgd_new(&ps, &so2);
    nb_sched_opts so = nb_sched_defaults(NB_SCHED_COSINE);
    so.total_steps = 10;
    nb_sched *s = nb_sched_new(o, &so);
    for (int i = 0; i < 3; i++) ASSERT_OK(nb_sched_step(s));
    double lr = nb_optim_get_lr(o, 0);
    const nb_params *ss = nb_sched_state(s);
    nb_tensor *moved[2];
    for (int i = 0; i < 2; i++) moved[i] = nb_to_device(ss->tensors[i], GUARD);
    const char *snames[2] = {ss->names[0], ss->names[1]};
    ASSERT_OK(nb_sched_set_step(s, 0));
    ASSERT_OK(nb_sched_load_state(s, snames, moved, 2));
    ck_assert_int_eq(nb_sched_last_step(s), 3);
    ck_assert_double_eq(nb_optim_get_lr(o, 0), lr);
    nb_sched_free(s);
    nb_optim_free(o);
    nb_scope_end();
}
END_TEST

TCase *nb_tcase_optim_devices(void) {
    TCase *tc = tcase_create("optim_devices");
    tcase_add_loop_test(tc, test_guard_matches_cpu, 0, NKINDS);
    tcase_add_test(tc, test_clip_guard);
    tcase_add_loop_test(tc, test_meta_step, 0, NKINDS);
    tcase_add_test(tc, test_device_errors);
    return tc;
}
