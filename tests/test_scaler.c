/* test_scaler.c - the "scaler" suite: f32 master weights of f16/bf16 parameters (optim/),
 * the dynamic loss scaler (optim/scaler.c: GradScaler's skip, backoff and growth exactly,
 * the fused unscale and inf/NaN check, the stop when the scale underflows), an f16 model
 * whose gradients underflow without the scaler and train with it, and the round trip of
 * the master weights and the scaler's state through nb_optim_state and checkpoints. */
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* A leaf of dtype dt holding vals (n elements), requiring grad. */
static nb_tensor *leaf(const double *vals, int64_t n, nb_dtype dt) {
    nb_tensor *t = tu_tensor(vals, &n, 1, dt);
    ASSERT_OK(nb_set_requires_grad(t, true));
    return t;
}

/* Install a gradient of dtype dt with the values g (a fresh tensor, as backward makes). */
static void set_grad(nb_tensor *p, const double *g, nb_dtype dt) {
    int64_t n = nb_numel(p);
    ASSERT_OK(nb_set_grad(p, tu_tensor(g, &n, 1, dt)));
}

static bool same_bits(nb_tensor *a, nb_tensor *b) {
    if (a->dtype != b->dtype || nb_numel(a) != nb_numel(b)) return false;
    void *x = tu_raw_values(a), *y = tu_raw_values(b);
    bool same = memcmp(x, y, (size_t)nb_numel(a) * nb_dtype_size(a->dtype)) == 0;
    free(x);
    free(y);
    return same;
}

/* ---- master weights ---------------------------------------------------------------------- */
/* An f16/bf16 parameter steps exactly as an f32 parameter with the same gradients does, and
 * holds that f32 value rounded: small updates accumulate in the master instead of being
 * rounded away (SGD's 1e-4 steps on 1.0 are below f16's half ulp there, 4.9e-4). */
START_TEST(test_master_weights) {
    static const nb_dtype half[2] = {NB_F16, NB_BF16};
    for (int h = 0; h < 2; h++) {
        for (int kind = 0; kind < 2; kind++) {
            nb_scope_begin();
            const double p0[4] = {1.0, -0.5, 2.0, 0.25};
            nb_tensor *ph = leaf(p0, 4, half[h]), *pf = leaf(p0, 4, NB_F32);
            nb_params lh = {.tensors = &ph, .count = 1}, lf = {.tensors = &pf, .count = 1};
            nb_optim *oh, *of;
            if (kind == 0) {
                nb_sgd_opts so = nb_sgd_defaults();
                so.lr = 1e-4;
                so.momentum = 0.9;
                oh = nb_sgd_new(&lh, &so), of = nb_sgd_new(&lf, &so);
            } else {
                nb_adamw_opts ao = nb_adamw_defaults();
                ao.lr = 1e-4;
                oh = nb_adamw_new(&lh, &ao), of = nb_adamw_new(&lf, &ao);
            }
            ck_assert_msg(oh && of, "%s", nb_last_error());
            for (int s = 0; s < 50; s++) {
                /* gradients representable in the half type, so both see the same values */
                const double g[4] = {1.0, -0.5 + s / 64.0, 0.125, 3.0};
                set_grad(ph, g, half[h]);
                set_grad(pf, g, NB_F32);
                ASSERT_OK(nb_step(oh));
                ASSERT_OK(nb_step(of));
            }
            /* the parameter is the f32 result rounded; the state is f32 and identical */
            ck_assert(same_bits(ph, nb_to_dtype(pf, half[h])));
            const nb_params *sh = nb_optim_state(oh), *sf = nb_optim_state(of);
            ck_assert_int_eq(sh->count, sf->count + 1);
            int masters = 0;
            for (int i = 0; i < sh->count; i++) {
                if (strncmp(sh->names[i], "master.", 7) == 0) {
                    masters++;
                    ck_assert(same_bits(sh->tensors[i], pf));
                    continue;
                }
                int j = 0;
                while (j < sf->count && strcmp(sf->names[j], sh->names[i]) != 0) j++;
                ck_assert_msg(j < sf->count, "unexpected state %s", sh->names[i]);
                ck_assert_msg(same_bits(sh->tensors[i], sf->tensors[j]), "%s differs",
                              sh->names[i]);
            }
            ck_assert_int_eq(masters, 1);
            /* the f32 master moved by 50 * lr-sized steps; a half update would not have */
            double v[4];
            ASSERT_OK(nb_read(ph, v, 4, NB_F64));
            ck_assert_msg(v[0] < 1.0, "the f16/bf16 parameter never moved: %g", v[0]);
            /* a half gradient of the wrong kind (i32) is refused, naming the parameter */
            nb_optim_free(oh);
            nb_optim_free(of);
            nb_scope_end();
        }
    }
    /* an integer parameter is still refused, with the accepted dtypes in the message */
    nb_scope_begin();
    nb_tensor *pi = nb_zeros((int64_t[]){2}, 1, NB_I32);
    nb_params li = {.tensors = &pi, .count = 1};
    tu_assert_error(nb_adam_new(&li, NULL), NB_EDTYPE, "f16/bf16 with f32 master weights");
    nb_scope_end();
}
END_TEST

/* Master weights through nb_optim_state / nb_optim_load_state: resuming from a copy of the
 * state continues bit for bit; a state without the master entry (as an older file) makes
 * the master from the parameter; a master of the wrong dtype is refused. */
START_TEST(test_master_roundtrip) {
    nb_scope_begin();
    const double p0[3] = {1.0, 0.5, -2.0};
    nb_tensor *pa = leaf(p0, 3, NB_BF16), *pb = leaf(p0, 3, NB_BF16);
    nb_params la = {.tensors = &pa, .count = 1}, lb = {.tensors = &pb, .count = 1};
    nb_adam_opts ao = nb_adam_defaults();
    ao.lr = 3e-3;
    nb_optim *a = nb_adam_new(&la, &ao), *b = nb_adam_new(&lb, &ao);
    const double g[3] = {0.5, -0.25, 1.0};
    for (int s = 0; s < 3; s++) {
        set_grad(pa, g, NB_BF16);
        set_grad(pb, g, NB_BF16);
        ASSERT_OK(nb_step(a));
        ASSERT_OK(nb_step(b));
    }
    const nb_params *st = nb_optim_state(b);
    nb_tensor *saved[16];
    ck_assert_int_le(st->count, 16);
    for (int i = 0; i < st->count; i++) saved[i] = nb_clone(st->tensors[i]);
    nb_tensor *pc = nb_clone(pb);
    nb_set_requires_grad(pc, true);
    nb_params lc = {.tensors = &pc, .count = 1};
    nb_optim *c = nb_adam_new(&lc, &ao);
    /* a master of the wrong dtype is refused and changes nothing */
    int mi = 0;
    while (mi < st->count && strncmp(st->names[mi], "master.", 7) != 0) mi++;
    ck_assert_int_lt(mi, st->count);
    nb_tensor *keep = saved[mi];
    saved[mi] = nb_to_dtype(keep, NB_F64);
    ASSERT_ST(nb_optim_load_state(c, st->names, saved, st->count), NB_EDTYPE,
              "master weights are f32");
    saved[mi] = keep;
    ASSERT_OK(nb_optim_load_state(c, st->names, saved, st->count));
    for (int s = 0; s < 5; s++) {
        set_grad(pa, g, NB_BF16);
        set_grad(pc, g, NB_BF16);
        ASSERT_OK(nb_step(a));
        ASSERT_OK(nb_step(c));
    }
    ck_assert(same_bits(pa, pc));
    /* Without the master entry, the master is the parameter's value: the load works. */
    const char *names[16];
    nb_tensor *ts[16];
    int n = 0;
    for (int i = 0; i < st->count; i++)
        if (i != mi) names[n] = st->names[i], ts[n++] = saved[i];
    nb_optim *d = nb_adam_new(&lc, &ao);
    ASSERT_OK(nb_optim_load_state(d, names, ts, n));
    ck_assert(nb_optim_state(d)->count == n + 1);
    nb_optim_free(a);
    nb_optim_free(b);
    nb_optim_free(c);
    nb_optim_free(d);
    nb_scope_end();
}
END_TEST

/* ---- the loss scaler ------------------------------------------------------------------- */
/* GradScaler's rules exactly: unscale divides by the scale; an inf or NaN gradient skips the
 * step (parameters and state unchanged) and multiplies the scale by backoff_factor, resetting
 * the count of clean steps; growth_interval clean steps in a row multiply it by
 * growth_factor. */
START_TEST(test_scaler_rules) {
    nb_scope_begin();
    const double p0[2] = {1.0, 2.0};
    nb_tensor *p = leaf(p0, 2, NB_F32);
    nb_params lp = {.tensors = &p, .count = 1};
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 0.5;
    nb_optim *opt = nb_sgd_new(&lp, &so);
    nb_grad_scaler_opts go = nb_grad_scaler_defaults();
    go.init_scale = 8;
    go.growth_interval = 3;
    nb_grad_scaler *gs = nb_grad_scaler_new(&go);
    ck_assert(gs);
    /* f: finite, i: inf, n: nan; expected scale after each update */
    const char *seq = "fffinfffff";
    const double want[10] = {8, 8, 16, 8, 4, 4, 4, 8, 8, 8};
    double x[2] = {1.0, 2.0};
    int64_t skipped = 0;
    for (int s = 0; s < 10; s++) {
        double scale = nb_grad_scaler_get_scale(gs);
        double g[2] = {scale * 0.25, scale * -0.5};
        if (seq[s] == 'i') g[1] = INFINITY;
        if (seq[s] == 'n') g[0] = NAN;
        set_grad(p, g, NB_F32);
        ASSERT_OK(nb_grad_scaler_step(gs, opt));
        ck_assert_int_eq(nb_grad_scaler_skipped(gs), seq[s] != 'f');
        if (seq[s] == 'f') {
            x[0] -= 0.5 * 0.25;
            x[1] -= 0.5 * -0.5;
        } else {
            skipped++;
        }
        double v[2];
        ASSERT_OK(nb_read(p, v, 2, NB_F64));
        ck_assert_msg(v[0] == x[0] && v[1] == x[1], "step %d: p = (%g, %g), want (%g, %g)", s,
                      v[0], v[1], x[0], x[1]);
        ASSERT_OK(nb_grad_scaler_update(gs));
        ck_assert_msg(nb_grad_scaler_get_scale(gs) == want[s], "step %d: scale %g, want %g", s,
                      nb_grad_scaler_get_scale(gs), want[s]);
    }
    ck_assert_int_eq(nb_grad_scaler_num_steps(gs), 10);
    ck_assert_int_eq(nb_grad_scaler_num_skipped(gs), skipped);
    /* unscale then step: one unscale per step, as PyTorch */
    set_grad(p, (double[]){8, 8}, NB_F32);
    ASSERT_OK(nb_grad_scaler_unscale(gs, opt));
    double gv[2];
    ASSERT_OK(nb_read(nb_grad(p), gv, 2, NB_F64));
    ck_assert(gv[0] == 1 && gv[1] == 1);
    ASSERT_ST(nb_grad_scaler_unscale(gs, opt), NB_ESTATE, "once per step");
    ASSERT_OK(nb_grad_scaler_step(gs, opt));
    ASSERT_ST(nb_grad_scaler_step(gs, opt), NB_ESTATE, "already called");
    ASSERT_OK(nb_grad_scaler_update(gs));
    ASSERT_ST(nb_grad_scaler_update(gs), NB_ESTATE, "no nb_grad_scaler_step");
    nb_grad_scaler_free(gs);

    /* The defaults: 2^16, doubled after exactly 2000 clean steps. */
    gs = nb_grad_scaler_new(NULL);
    ck_assert(nb_grad_scaler_get_scale(gs) == 65536.0);
    so.lr = 1e-30;
    nb_optim_free(opt);
    opt = nb_sgd_new(&lp, &so);
    for (int s = 0; s < 2000; s++) {
        ck_assert(nb_grad_scaler_get_scale(gs) == 65536.0);
        set_grad(p, (double[]){1, 1}, NB_F32);
        ASSERT_OK(nb_grad_scaler_step(gs, opt));
        ASSERT_OK(nb_grad_scaler_update(gs));
    }
    ck_assert(nb_grad_scaler_get_scale(gs) == 131072.0);
    nb_grad_scaler_free(gs);

    /* bad options name the option and the value */
    go = nb_grad_scaler_defaults();
    go.growth_factor = 1;
    tu_assert_error(nb_grad_scaler_new(&go), NB_EINVAL, "growth_factor must be finite and > 1");
    go = nb_grad_scaler_defaults();
    go.backoff_factor = 1;
    tu_assert_error(nb_grad_scaler_new(&go), NB_EINVAL, "backoff_factor must be in (0, 1)");
    nb_optim_free(opt);
    nb_scope_end();
}
END_TEST

/* A loss that is NaN at every step: every step is skipped, the scale halves from 2^16 and
 * falls below 1 at the 17th update, which stops with a message naming the step. */
START_TEST(test_scaler_underflow_stops) {
    nb_scope_begin();
    const double p0[2] = {1.0, 2.0};
    nb_tensor *p = leaf(p0, 2, NB_F16);
    nb_params lp = {.tensors = &p, .count = 1};
    nb_optim *opt = nb_adam_new(&lp, NULL);
    nb_grad_scaler *gs = nb_grad_scaler_new(NULL);
    nb_status st = NB_OK;
    int s = 0;
    while (st == NB_OK && s < 100) {
        nb_scope_begin();
        nb_zero_grad(opt);
        nb_tensor *loss = nb_mul_scalar(nb_sum(p, NULL, 0, false), NAN);
        ASSERT_OK(nb_backward(nb_grad_scaler_scale(gs, loss)));
        ASSERT_OK(nb_grad_scaler_step(gs, opt));
        ck_assert(nb_grad_scaler_skipped(gs));
        st = nb_grad_scaler_update(gs);
        s++;
        nb_scope_end();
    }
    ck_assert_int_eq(s, 17);
    tu_assert_error_at(st != NB_OK, NB_ESTATE, "fell to 0.5 (below min_scale 1) at step 17",
                       __FILE__, __LINE__);
    double v[2];
    ASSERT_OK(nb_read(p, v, 2, NB_F64));
    ck_assert(v[0] == 1.0 && v[1] == 2.0); /* never stepped */
    nb_grad_scaler_free(gs);
    nb_optim_free(opt);
    nb_scope_end();
}
END_TEST

/* f16 least squares whose loss carries a small weight (1e-7, as an auxiliary loss term):
 * the gradient reaching the f16 prediction is ~3e-9, below half of f16's smallest
 * subnormal, so without loss scaling every gradient is zero and the model does not learn;
 * with the scaler (and f32 master weights) it fits. Returns the final mean squared error
 * over the initial one. */
static double train_f16(bool scaled) {
    nb_scope_begin();
    enum { B = 64, D = 8 };
    double xs[B * D], wt[D], ys[B], w0[D] = {0};
    tu_fill_uniform(xs, B * D, -1, 1, 11);
    tu_fill_uniform(wt, D, -1, 1, 12);
    for (int b = 0; b < B; b++) {
        ys[b] = 0;
        for (int d = 0; d < D; d++) ys[b] += xs[b * D + d] * wt[d];
    }
    nb_tensor *x = tu_tensor(xs, (int64_t[]){B, D}, 2, NB_F16);
    nb_tensor *y = tu_tensor(ys, (int64_t[]){B, 1}, 2, NB_F32);
    nb_tensor *w = tu_tensor(w0, (int64_t[]){D, 1}, 2, NB_F16);
    ASSERT_OK(nb_set_requires_grad(w, true));
    nb_params lw = {.tensors = &w, .count = 1};
    nb_adam_opts ao = nb_adam_defaults();
    ao.lr = 0.02;
    ao.eps = 1e-12;
    nb_optim *opt = nb_adam_new(&lw, &ao);
    nb_grad_scaler_opts go = nb_grad_scaler_defaults();
    go.enabled = scaled;
    nb_grad_scaler *gs = nb_grad_scaler_new(&go);
    double first = 0, last = 0;
    for (int s = 0; s < 400; s++) {
        nb_scope_begin();
        nb_tensor *pred = nb_to_dtype(nb_matmul(x, w), NB_F32);
        nb_tensor *mse = nb_mse_loss(pred, y, NB_REDUCTION_MEAN);
        nb_tensor *loss = nb_mul_scalar(mse, 1e-7);
        double m;
        ASSERT_OK(nb_read(mse, &m, 1, NB_F64));
        if (s == 0) first = m;
        last = m;
        ASSERT_OK(nb_zero_grad(opt));
        ASSERT_OK(nb_backward(nb_grad_scaler_scale(gs, loss)));
        ASSERT_OK(nb_grad_scaler_step_update(gs, opt));
        nb_scope_end();
    }
    nb_grad_scaler_free(gs);
    nb_optim_free(opt);
    nb_scope_end();
    return last / first;
}

START_TEST(test_scaler_trains_f16) {
    double plain = train_f16(false), scaled = train_f16(true);
    ck_assert_msg(plain > 0.99, "without scaling the f16 gradients should underflow to zero "
                  "(loss ratio %g)", plain);
    ck_assert_msg(scaled < 1e-3, "with the scaler the f16 model should fit (loss ratio %g)",
                  scaled);
}
END_TEST

/* Checkpoints keep the scaler's state and the master weights: saving after N steps and
 * resuming into fresh objects continues bit for bit; a file without "scaler." entries (one
 * written before loss scaling) loads and leaves the scaler as it was. */
START_TEST(test_scaler_checkpoint) {
    nb_scope_begin();
    char *dir = tu_make_dir();
    char *path = tu_path_in(dir, "run.ckpt"), *old = tu_path_in(dir, "old.ckpt");
    nb_module *ma = NULL, *mb = NULL;
    nb_optim *oa = NULL, *ob = NULL;
    nb_grad_scaler *ga = NULL, *gb = NULL;
    nb_grad_scaler_opts go = nb_grad_scaler_defaults();
    go.init_scale = 1024;
    go.growth_interval = 2;
    nb_tensor *x = tu_random((int64_t[]){4, 3}, 2, NB_F16, -1, 1, 5);
    for (int r = 0; r < 2; r++) {
        nb_linear_opts lo = nb_linear_defaults();
        lo.dtype = NB_F16;
        nb_generator *gen = nb_generator_new(7);
        lo.gen = gen;
        nb_module *m = nb_linear_new(3, 2, &lo);
        nb_generator_free(gen);
        nb_adam_opts ao = nb_adam_defaults();
        ao.lr = 0.01;
        nb_optim *o = nb_adam_new(nb_parameters(m), &ao);
        nb_grad_scaler *g = nb_grad_scaler_new(&go);
        ck_assert(m && o && g);
        if (r == 0) ma = m, oa = o, ga = g;
        else mb = m, ob = o, gb = g;
    }
    /* steps 0..5 on a; the loss is inf at step 2 (skipped) */
    for (int s = 0; s < 6; s++) {
        nb_scope_begin();
        nb_tensor *loss = nb_sum(nb_to_dtype(nb_forward(ma, x), NB_F32), NULL, 0, false);
        if (s == 2) loss = nb_mul_scalar(loss, INFINITY);
        nb_zero_grad(oa);
        ASSERT_OK(nb_backward(nb_grad_scaler_scale(ga, loss)));
        ASSERT_OK(nb_grad_scaler_step(ga, oa));
        ASSERT_OK(nb_grad_scaler_update(ga));
        if (s == 3) {
            nb_checkpoint ck = {.model = ma, .optim = oa, .scaler = ga, .step = s};
            ASSERT_OK(nb_checkpoint_save(path, &ck));
            nb_checkpoint ck_old = {.model = ma, .optim = oa, .step = s};
            ASSERT_OK(nb_checkpoint_save(old, &ck_old));
        }
        nb_scope_end();
    }
    /* the older file: the scaler keeps its own (fresh) state */
    nb_checkpoint cb = {.model = mb, .optim = ob, .scaler = gb};
    ASSERT_OK(nb_checkpoint_load(old, &cb));
    ck_assert(nb_grad_scaler_get_scale(gb) == 1024 && nb_grad_scaler_num_steps(gb) == 0);
    memset(cb.run_id, 0, sizeof cb.run_id);
    ASSERT_OK(nb_checkpoint_load(path, &cb));
    ck_assert_int_eq(cb.step, 3);
    ck_assert_int_eq(nb_grad_scaler_num_steps(gb), 4);
    ck_assert_int_eq(nb_grad_scaler_num_skipped(gb), 1);
    for (int s = 4; s < 6; s++) {
        nb_scope_begin();
        nb_tensor *loss = nb_sum(nb_to_dtype(nb_forward(mb, x), NB_F32), NULL, 0, false);
        nb_zero_grad(ob);
        ASSERT_OK(nb_backward(nb_grad_scaler_scale(gb, loss)));
        ASSERT_OK(nb_grad_scaler_step(gb, ob));
        ASSERT_OK(nb_grad_scaler_update(gb));
        nb_scope_end();
    }
    ck_assert(nb_grad_scaler_get_scale(ga) == nb_grad_scaler_get_scale(gb));
    const nb_params *pa = nb_parameters(ma), *pb = nb_parameters(mb);
    for (int i = 0; i < pa->count; i++)
        ck_assert_msg(same_bits(pa->tensors[i], pb->tensors[i]), "%s differs after resume",
                      pa->names[i]);
    /* the scaler's state loader checks its entries */
    const nb_params *gst = nb_grad_scaler_state(ga);
    ck_assert_int_eq(gst->count, 4);
    ASSERT_ST(nb_grad_scaler_load_state(gb, gst->names, gst->tensors, 3), NB_EINVAL,
              "missing 'skipped'");
    nb_grad_scaler_free(ga);
    nb_grad_scaler_free(gb);
    nb_optim_free(oa);
    nb_optim_free(ob);
    nb_module_free(ma);
    nb_module_free(mb);
    free(path);
    free(old);
    tu_rm_dir(dir);
    nb_scope_end();
}
END_TEST

Suite *nb_suite_scaler(void) {
    Suite *s = suite_create("scaler");
    TCase *tc = tcase_create("scaler");
    tcase_add_test(tc, test_master_weights);
    tcase_add_test(tc, test_master_roundtrip);
    tcase_add_test(tc, test_scaler_rules);
    tcase_add_test(tc, test_scaler_underflow_stops);
    tcase_add_test(tc, test_scaler_trains_f16);
    tcase_add_test(tc, test_scaler_checkpoint);
    suite_add_tcase(s, tc);
    return s;
}
