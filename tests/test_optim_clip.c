/* test_optim_clip.c - the optim suite's gradient clipping and learning-rate schedule tests
 * (against PyTorch's values in tests/fixtures/optim/, and their rules and errors); added to
 * the suite's TCase by nb_tests_optim_clip (tests/test_optim.c). */
#include <float.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>
#include "test_optim.h"
#include "testutil.h"

/* ---- clipping -------------------------------------------------------------------------------- */
static const char *const clip_cases[] = {"clip_l2", "clip_inf", "clip_l1", "clip_l3_noclip"};

START_TEST(test_clip_vs_pytorch) {
    ocase c;
    fx_load(&c.f, clip_cases[_i]);
    for (int i = 0; i < NP; i++) {
        double d[NB_MAX_DIMS + 1];
        int k = fx_nums(fx_line(&c.f, "param %d ", i), d, NB_MAX_DIMS + 1);
        c.ndim[i] = (int)d[0];
        ck_assert_int_eq(k, 1 + c.ndim[i]);
        for (int j = 0; j < c.ndim[i]; j++) c.shape[i][j] = (int64_t)d[1 + j];
    }
    const char *cl = fx_line(&c.f, "clip");
    double want_total;
    fx_nums(fx_line(&c.f, "total "), &want_total, 1);
    for (int d = 0; d < 2; d++) {
        nb_dtype dt = d ? NB_F64 : NB_F32;
        nb_scope_begin();
        nb_tensor *ps[NP];
        for (int i = 0; i < NP; i++) {
            ps[i] = nb_zeros(c.shape[i], c.ndim[i], dt);
            double v[64];
            const char *l = fx_line(&c.f, "grad 0 %d ", i);
            if (l) fx_nums(l, v, 64), nb_set_grad(ps[i], tu_tensor(v, c.shape[i], c.ndim[i], dt));
        }
        nb_params list = {NP, ps, NULL};
        double p = fx_opt_or(cl, "norm_type", 2);
        double total = nb_clip_grad_norm(&list, fx_opt(cl, "max_norm"), p);
        ck_assert_msg(fabs(total - want_total) <= 1e-6 * want_total, "%s: norm %.9g, PyTorch %.9g",
                      clip_cases[_i], total, want_total);
        for (int i = 0; i < NP; i++) {
            double v[64];
            const char *l = fx_line(&c.f, "expect f32 0 %d ", i);
            if (!l) {
                ck_assert(nb_grad(ps[i]) == NULL);
                continue;
            }
            fx_nums(l, v, 64);
            tu_assert_close(nb_grad(ps[i]), v, c.shape[i], c.ndim[i], 1e-6);
        }
        nb_scope_end();
    }
    fx_free(&c.f);
}
END_TEST

START_TEST(test_clip) {
    nb_scope_begin();
    /* f64 reference loop, a non-contiguous gradient, and half-precision gradients */
    nb_tensor *a = nb_zeros((int64_t[]){70000}, 1, NB_F32);
    nb_tensor *b = nb_zeros((int64_t[]){3, 4}, 2, NB_F32);
    nb_tensor *h = nb_zeros((int64_t[]){5}, 1, NB_BF16);
    nb_tensor *ga = tu_random((int64_t[]){70000}, 1, NB_F32, -1, 1, 1);
    nb_tensor *gb = tu_noncontig(tu_random((int64_t[]){3, 4}, 2, NB_F32, -10, 10, 2));
    nb_tensor *gh = tu_random((int64_t[]){5}, 1, NB_BF16, -4, 4, 3);
    nb_set_grad(a, ga), nb_set_grad(b, gb), nb_set_grad(h, gh);
    double *va = tu_values(ga), *vb = tu_values(gb), *vh = tu_values(gh);
    double ss = 0, mx = 0;
    for (int i = 0; i < 70000; i++) ss += va[i] * va[i], mx = fmax(mx, fabs(va[i]));
    for (int i = 0; i < 12; i++) ss += vb[i] * vb[i], mx = fmax(mx, fabs(vb[i]));
    for (int i = 0; i < 5; i++) ss += vh[i] * vh[i], mx = fmax(mx, fabs(vh[i]));
    nb_params list = {3, (nb_tensor *[]){a, b, h}, NULL};
    ck_assert(nb_clip_grad_norm(&list, INFINITY, INFINITY) == mx);
    double norm = nb_clip_grad_norm(&list, 5.0, 2);
    ck_assert_double_eq_tol(norm, sqrt(ss), 1e-12 * sqrt(ss));
    double s = 5.0 / (sqrt(ss) + 1e-6);
    for (int i = 0; i < 12; i++) vb[i] = (float)(vb[i] * (float)s);
    tu_assert_close(gb, vb, nb_shape(gb), 2, 1e-7);
    ck_assert(!nb_is_contiguous(nb_grad(b)));
    ck_assert_double_eq_tol(nb_clip_grad_norm(&list, INFINITY, 2), 5.0, 2e-3);
    /* the same norm with any thread count */
    nb_set_num_threads(1);
    double n1 = nb_clip_grad_norm(&list, INFINITY, 2);
    nb_set_num_threads(2);
    double n2 = nb_clip_grad_norm(&list, INFINITY, 2);
    nb_set_num_threads(0);
    ck_assert(n1 == n2);
    /* clip by value */
    ASSERT_OK(nb_clip_grad_value(&list, 0.01));
    double *vb2 = tu_values(gb);
    for (int i = 0; i < 12; i++) vb[i] = fmin(fmax(vb[i], -0.01), 0.01);
    tu_assert_close(gb, vb, nb_shape(gb), 2, 1e-7);
    free(vb2);
    /* a NaN anywhere makes the max norm NaN: in an early chunk of a long gradient, and in
     * a gradient before others with finite values */
    float *pn = malloc(sizeof(float) * 70000);
    for (int i = 0; i < 70000; i++) pn[i] = i == 10 ? NAN : 1.0f;
    nb_tensor *gn = nb_from_buffer(pn, (int64_t[]){70000}, 1, NB_F32);
    free(pn);
    nb_set_grad(a, gn);
    ck_assert(isnan(nb_clip_grad_norm(&list, INFINITY, INFINITY)));
    nb_params first = {2, (nb_tensor *[]){a, b}, NULL};
    ck_assert(isnan(nb_clip_grad_norm(&first, INFINITY, INFINITY)));
    nb_set_grad(a, ga);
    /* errors */
    ck_assert(nb_clip_grad_norm(NULL, 1, 2) == NB_ENULL);
    nb_clear_error();
    ck_assert(nb_clip_grad_norm(&list, -1, 2) == NB_EINVAL);
    nb_clear_error();
    ck_assert(nb_clip_grad_norm(&list, 1, -2) == NB_EINVAL);
    nb_clear_error();
    ASSERT_ST(nb_clip_grad_value(&list, -1), NB_EINVAL, "clip must be >= 0");
    free(va), free(vb), free(vh);
    nb_scope_end();
}
END_TEST

/* ---- schedules ------------------------------------------------------------------------------- */
static const char *const sched_cases[] = {
    "sched_step", "sched_multistep", "sched_exponential", "sched_cosine", "sched_cosine_nowarmup",
    "sched_linear", "sched_onecycle", "sched_onecycle_opts",
};

static nb_sched_opts sched_from(const char *l, int64_t *milestones) {
    char kind[16];
    ck_assert(sscanf(l, "%15s", kind) == 1);
    static const char *const kinds[] = {"constant", "step", "multistep", "exponential",
                                        "cosine", "linear", "onecycle"};
    nb_sched_kind sk = NB_SCHED_CONSTANT;
    for (int k = 0; k < 7; k++)
        if (!strcmp(kind, kinds[k])) sk = (nb_sched_kind)k;
    nb_sched_opts o = nb_sched_defaults(sk);
    o.gamma = fx_opt_or(l, "gamma", o.gamma);
    o.step_size = (int64_t)fx_opt_or(l, "step_size", (double)o.step_size);
    o.warmup_steps = (int64_t)fx_opt_or(l, "warmup_steps", (double)o.warmup_steps);
    o.total_steps = (int64_t)fx_opt_or(l, "total_steps", (double)o.total_steps);
    o.min_lr = fx_opt_or(l, "min_lr", o.min_lr);
    o.max_lr = fx_opt_or(l, "max_lr", o.max_lr);
    o.pct_start = fx_opt_or(l, "pct_start", o.pct_start);
    o.div_factor = fx_opt_or(l, "div_factor", o.div_factor);
    o.final_div_factor = fx_opt_or(l, "final_div_factor", o.final_div_factor);
    o.cycle_momentum = fx_opt(l, "cycle_momentum") != 0;
    const char *m = strstr(l, "milestones=");
    if (m) {
        for (const char *s = m + 11; *s && *s != ' ';) {
            char *end;
            milestones[o.num_milestones++] = strtol(s, &end, 10);
            s = end;
            if (*s == ',') s++;
        }
        o.milestones = milestones;
    }
    return o;
}

START_TEST(test_sched_vs_pytorch) {
    fx f;
    fx_load(&f, sched_cases[_i]);
    int64_t ms[16];
    nb_sched_opts o = sched_from(fx_line(&f, "sched "), ms);
    double base = 0;
    fx_nums(fx_line(&f, "base "), &base, 1);
    nb_scope_begin();
    nb_tensor *w = nb_zeros((int64_t[]){2}, 1, NB_F32);
    nb_params ps = {1, (nb_tensor *[]){w}, (const char *[]){"w"}};
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = base, so.momentum = 0.9;
    nb_optim *opt = nb_sgd_new(&ps, &so);
    nb_sched *s = nb_sched_new(opt, &o);
    ck_assert_msg(s, "%s", nb_last_error());
    int t = 0;
    for (;; t++) {
        double want, got = nb_optim_get_lr(opt, 0);
        const char *l = fx_line(&f, "lr %d ", t);
        if (!l) break;
        fx_nums(l, &want, 1);
        ck_assert_msg(fabs(got - want) <= 1e-12 * fmax(1e-3, fabs(want)), "%s t=%d: %.17g vs %.17g",
                      sched_cases[_i], t, got, want);
        ck_assert(nb_sched_lr_at(&o, base, t) == got);
        if ((l = fx_line(&f, "momentum %d ", t))) {
            fx_nums(l, &want, 1);
            nb_group_opts go;
            nb_optim_group_opts(opt, 0, &go);
            ck_assert_double_eq_tol(go.momentum, want, 1e-12);
        }
        ck_assert_int_eq(nb_sched_last_step(s), t);
        ASSERT_OK(nb_step(opt));
        if (fx_line(&f, "lr %d ", t + 1)) ASSERT_OK(nb_sched_step(s));
    }
    ck_assert(t > 5);
    if (o.kind == NB_SCHED_ONECYCLE) ASSERT_ST(nb_sched_step(s), NB_EINVAL, "total_steps");
    /* state: save at step 3, load into a new schedule, and it continues identically */
    ASSERT_OK(nb_sched_set_step(s, 3));
    const nb_params *st = nb_sched_state(s);
    ck_assert_int_eq(st->count, 2);
    nb_tensor *saved[2] = {nb_clone(st->tensors[0]), nb_clone(st->tensors[1])};
    ASSERT_OK(nb_sched_step(s));
    double lr4 = nb_optim_get_lr(opt, 0);
    nb_sched *s2 = nb_sched_new(opt, &o);
    ASSERT_OK(nb_sched_load_state(s2, st->names, saved, 2));
    ck_assert_int_eq(nb_sched_last_step(s2), 3);
    ASSERT_OK(nb_sched_step(s2));
    ck_assert(nb_optim_get_lr(opt, 0) == lr4);
    nb_sched_free(s2);
    nb_sched_free(s);
    nb_optim_free(opt);
    nb_scope_end();
    fx_free(&f);
}
END_TEST

START_TEST(test_sched) {
    nb_scope_begin();
    nb_tensor *w = nb_zeros((int64_t[]){2}, 1, NB_F32), *v = nb_zeros((int64_t[]){2}, 1, NB_F32);
    nb_params pw = {1, (nb_tensor *[]){w}, (const char *[]){"w"}};
    nb_params pv = {1, (nb_tensor *[]){v}, (const char *[]){"v"}};
    nb_adam_opts ao = nb_adam_defaults();
    ao.lr = 0.1;
    nb_optim *opt = nb_adam_new(&pw, &ao);
    nb_group_opts gl = nb_group_defaults();
    gl.lr = 0.01;
    nb_optim_add_group(opt, &pv, &gl);
    /* every group follows the schedule from its own base lr */
    nb_sched_opts so = nb_sched_defaults(NB_SCHED_COSINE);
    so.warmup_steps = 2, so.total_steps = 6;
    nb_sched *s = nb_sched_new(opt, &so);
    ck_assert_double_eq_tol(nb_optim_get_lr(opt, 0), 0.05, 1e-15);
    ck_assert_double_eq_tol(nb_optim_get_lr(opt, 1), 0.005, 1e-15);
    ASSERT_OK(nb_sched_set_step(s, 100));
    ck_assert_double_eq(nb_optim_get_lr(opt, 0), 0);
    ck_assert_double_eq(nb_optim_get_lr(opt, 1), 0);
    nb_sched_free(s);
    /* constant; onecycle cycles Adam's beta1 */
    nb_optim_set_lr(opt, -1, 0.1);
    so = nb_sched_defaults(NB_SCHED_CONSTANT);
    s = nb_sched_new(opt, &so);
    ASSERT_OK(nb_sched_step(s));
    ck_assert_double_eq(nb_optim_get_lr(opt, 1), 0.1);
    nb_sched_free(s);
    so = nb_sched_defaults(NB_SCHED_ONECYCLE);
    so.total_steps = 10, so.cycle_momentum = true;
    s = nb_sched_new(opt, &so);
    nb_group_opts go;
    nb_optim_group_opts(opt, 1, &go);
    ck_assert_double_eq(go.betas[0], 0.95);
    ck_assert_double_eq_tol(nb_optim_get_lr(opt, 1), 0.1 / 25, 1e-15);
    /* a group added later is an error, not a silent mismatch */
    nb_tensor *u = nb_zeros((int64_t[]){2}, 1, NB_F32);
    nb_optim_add_group(opt, &(nb_params){1, (nb_tensor *[]){u}, (const char *[]){"u"}}, NULL);
    ASSERT_ST(nb_sched_step(s), NB_ESTATE, "make the schedule after adding the groups");
    /* the state is checked */
    const nb_params *st = nb_sched_state(s);
    nb_tensor *bad[2] = {st->tensors[0], nb_zeros((int64_t[]){5}, 1, NB_F64)};
    ASSERT_ST(nb_sched_load_state(s, st->names, bad, 2), NB_ESHAPE, "base_lrs");
    ASSERT_ST(nb_sched_load_state(s, (const char *[]){"last_step", "foo"}, bad, 2), NB_EINVAL,
              "unexpected entry 'foo'");
    ASSERT_ST(nb_sched_load_state(s, st->names, bad, 1), NB_EINVAL, "missing 'base_lrs'");
    nb_sched_free(s);
    nb_sched_opts sco = nb_sched_defaults(NB_SCHED_STEP);
    sco.gamma = 0;
    /* option errors */
    tu_assert_error(nb_sched_new(opt, &sco), NB_EINVAL, "step_size must be > 0");
    nb_sched_opts sco2 = nb_sched_defaults(NB_SCHED_COSINE);
    tu_assert_error(nb_sched_new(opt, &sco2), NB_EINVAL, "total_steps must be > 0");
    nb_sched_opts sco3 = nb_sched_defaults(NB_SCHED_LINEAR);
    sco3.total_steps = 5, sco3.warmup_steps = 6;
    tu_assert_error(nb_sched_new(opt, &sco3), NB_EINVAL, "warmup_steps");
    nb_sched_opts sco4 = nb_sched_defaults(NB_SCHED_EXPONENTIAL);
    tu_assert_error(nb_sched_new(opt, &sco4), NB_EINVAL, "gamma is required");
    nb_sched_opts sco5 = nb_sched_defaults(NB_SCHED_MULTISTEP);
    sco5.milestones = (int64_t[]){5, 2}, sco5.num_milestones = 2, sco5.gamma = 0;
    tu_assert_error(nb_sched_new(opt, &sco5), NB_EINVAL, "non-decreasing");
    nb_sched_opts sco6 = nb_sched_defaults(NB_SCHED_CONSTANT);
    tu_assert_error(nb_sched_new(NULL, &sco6), NB_ENULL, NULL);
    nb_sched_opts sco7 = nb_sched_defaults(NB_SCHED_CONSTANT);
    ck_assert(isnan(nb_sched_lr_at(&sco7, 0.1, -1)));
    nb_clear_error();
    nb_optim_free(opt);
    nb_tensor *x = nb_zeros((int64_t[]){2}, 1, NB_F32);
    opt = nb_adagrad_new(&(nb_params){1, (nb_tensor *[]){x}, (const char *[]){"x"}}, NULL);
    so = nb_sched_defaults(NB_SCHED_ONECYCLE);
    so.total_steps = 5, so.cycle_momentum = true;
    tu_assert_error(nb_sched_new(opt, &so), NB_EINVAL, "adagrad has neither");
    nb_optim_free(opt);
    nb_scope_end();
}
END_TEST

void nb_tests_optim_clip(TCase *tc) {
    tcase_add_loop_test(tc, test_clip_vs_pytorch, 0, (int)(sizeof clip_cases / sizeof *clip_cases));
    tcase_add_test(tc, test_clip);
    tcase_add_loop_test(tc, test_sched_vs_pytorch, 0,
                        (int)(sizeof sched_cases / sizeof *sched_cases));
    tcase_add_test(tc, test_sched);
}
