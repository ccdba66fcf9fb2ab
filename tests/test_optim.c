/* test_optim.c - the "optim" suite: optimizers, parameter groups, zero_grad, state save and
 * load, gradient clipping and learning-rate schedules. Reference values come from PyTorch
 * 1.13 through the committed files in tests/fixtures/optim/ (written by
 * tools/make_optim_fixtures.py, whose docstring describes the format), so the suite does not
 * need PyTorch. The clipping and schedule tests are in test_optim_clip.c, the fixture reader
 * in test_optim.h. */
#include <float.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>
#include "test_optim.h"
#include "testutil.h"

#ifndef NB_SOURCE_DIR
#define NB_SOURCE_DIR "."
#endif


/* ---- optimizer cases ------------------------------------------------------------------------- */
static const char *const pnames[NP] = {"w", "b", "s"};

static void case_load(ocase *c, const char *name) {
    fx_load(&c->f, name);
    for (int i = 0; i < NP; i++) {
        double d[NB_MAX_DIMS + 1];
        const char *l = fx_line(&c->f, "param %d ", i);
        ck_assert(l);
        int k = fx_nums(l, d, NB_MAX_DIMS + 1);
        c->ndim[i] = (int)d[0];
        ck_assert_int_eq(k, 1 + c->ndim[i]);
        for (int j = 0; j < c->ndim[i]; j++) c->shape[i][j] = (int64_t)d[1 + j];
    }
    double s;
    ck_assert(fx_nums(fx_line(&c->f, "steps "), &s, 1) == 1);
    c->steps = (int)s;
}

/* Fresh leaf parameters holding the fixture's initial values (in the current scope). */
static void make_params(const ocase *c, nb_dtype dt, nb_tensor **ps) {
    for (int i = 0; i < NP; i++) {
        double v[64];
        int k = fx_nums(fx_line(&c->f, "init %d ", i), v, 64);
        ck_assert_int_eq(k, tu_numel(c->shape[i], c->ndim[i]));
        ps[i] = tu_tensor(v, c->shape[i], c->ndim[i], dt);
        nb_set_requires_grad(ps[i], true);
    }
}

/* The parameters of group g as a list (names and tensors point into static arrays). */
static const char *group_line(const ocase *c, int g, nb_tensor **ps, nb_tensor **gt,
                              const char **gn, nb_params *out) {
    const char *l = fx_line(&c->f, "group %d ", g);
    if (!l) return NULL;
    out->count = 0;
    for (const char *s = l; *s && *s != ' ';) {
        char *end;
        int i = (int)strtol(s, &end, 10);
        s = end;
        gt[out->count] = ps[i];
        gn[out->count++] = pnames[i];
        if (*s == ',') s++;
    }
    out->tensors = gt;
    out->names = gn;
    return l;
}

static nb_optim *make_optim(const ocase *c, nb_tensor **ps) {
    const char *ol = fx_line(&c->f, "optim ");
    char kind[16];
    ck_assert(sscanf(ol, "%15s", kind) == 1);
    nb_tensor *gt[NP];
    const char *gn[NP];
    nb_params g0;
    ck_assert(group_line(c, 0, ps, gt, gn, &g0));
    bool ams = fx_opt(ol, "amsgrad") != 0, maxi = fx_opt(ol, "maximize") != 0;
    nb_optim *opt = NULL;
    if (!strcmp(kind, "sgd")) {
        nb_sgd_opts o = nb_sgd_defaults();
        o.lr = fx_opt_or(ol, "lr", o.lr);
        o.momentum = fx_opt_or(ol, "momentum", o.momentum);
        o.dampening = fx_opt_or(ol, "dampening", o.dampening);
        o.weight_decay = fx_opt_or(ol, "weight_decay", o.weight_decay);
        o.nesterov = fx_opt(ol, "nesterov") != 0;
        o.maximize = maxi;
        opt = nb_sgd_new(&g0, &o);
    } else if (!strcmp(kind, "adam") || !strcmp(kind, "adamw")) {
        nb_adam_opts o = !strcmp(kind, "adam") ? nb_adam_defaults() : nb_adamw_defaults();
        o.lr = fx_opt_or(ol, "lr", o.lr);
        o.betas[0] = fx_opt_or(ol, "betas0", o.betas[0]);
        o.betas[1] = fx_opt_or(ol, "betas1", o.betas[1]);
        o.eps = fx_opt_or(ol, "eps", o.eps);
        o.weight_decay = fx_opt_or(ol, "weight_decay", o.weight_decay);
        o.amsgrad = ams;
        o.maximize = maxi;
        opt = !strcmp(kind, "adam") ? nb_adam_new(&g0, &o) : nb_adamw_new(&g0, &o);
    } else if (!strcmp(kind, "rmsprop")) {
        nb_rmsprop_opts o = nb_rmsprop_defaults();
        o.lr = fx_opt_or(ol, "lr", o.lr);
        o.alpha = fx_opt_or(ol, "alpha", o.alpha);
        o.eps = fx_opt_or(ol, "eps", o.eps);
        o.weight_decay = fx_opt_or(ol, "weight_decay", o.weight_decay);
        o.momentum = fx_opt_or(ol, "momentum", o.momentum);
        o.centered = fx_opt(ol, "centered") != 0;
        o.maximize = maxi;
        opt = nb_rmsprop_new(&g0, &o);
    } else if (!strcmp(kind, "adagrad")) {
        nb_adagrad_opts o = nb_adagrad_defaults();
        o.lr = fx_opt_or(ol, "lr", o.lr);
        o.lr_decay = fx_opt_or(ol, "lr_decay", o.lr_decay);
        o.weight_decay = fx_opt_or(ol, "weight_decay", o.weight_decay);
        o.initial_accumulator_value =
            fx_opt_or(ol, "initial_accumulator_value", o.initial_accumulator_value);
        o.eps = fx_opt_or(ol, "eps", o.eps);
        o.maximize = maxi;
        opt = nb_adagrad_new(&g0, &o);
    }
    ck_assert_msg(opt != NULL, "%s: %s", kind, nb_last_error());
    ck_assert_str_eq(nb_optim_name(opt), kind);
    for (int g = 1;; g++) {
        nb_params gp;
        const char *l = group_line(c, g, ps, gt, gn, &gp);
        if (!l) break;
        nb_group_opts o = nb_group_defaults(); /* NAN: the optimizer's value */
        o.lr = fx_opt_or(l, "lr", NAN);
        o.weight_decay = fx_opt_or(l, "weight_decay", NAN);
        o.momentum = fx_opt_or(l, "momentum", NAN);
        o.dampening = fx_opt_or(l, "dampening", NAN);
        o.betas[0] = fx_opt_or(l, "betas0", NAN);
        o.betas[1] = fx_opt_or(l, "betas1", NAN);
        o.eps = fx_opt_or(l, "eps", NAN);
        o.alpha = fx_opt_or(l, "alpha", NAN);
        ck_assert_msg(nb_optim_add_group(opt, &gp, &o) == g, "%s", nb_last_error());
    }
    return opt;
}

/* Steps [from, to): install the fixture's gradients (none where it has none), step, and
 * compare with PyTorch when check. */
static void run_steps(const ocase *c, nb_optim *opt, nb_tensor **ps, nb_dtype dt, int from,
                      int to, bool check) {
    for (int s = from; s < to; s++) {
        for (int i = 0; i < NP; i++) {
            double v[64];
            const char *l = fx_line(&c->f, "grad %d %d ", s, i);
            if (l) {
                fx_nums(l, v, 64);
                ASSERT_OK(nb_set_grad(ps[i], tu_tensor(v, c->shape[i], c->ndim[i], dt)));
            } else {
                nb_clear_grad(ps[i]);
            }
        }
        ASSERT_OK(nb_step(opt));
        for (int i = 0; check && i < NP; i++) {
            double v[64];
            const char *l = fx_line(&c->f, "expect %s %d %d ", dt == NB_F32 ? "f32" : "f64", s, i);
            ck_assert(l);
            fx_nums(l, v, 64);
            tu_assert_close(ps[i], v, c->shape[i], c->ndim[i], dt == NB_F32 ? 1e-6 : 1e-12);
        }
    }
}

static const char *const optim_cases[] = {
    "sgd_plain", "sgd_momentum", "sgd_dampening", "sgd_nesterov", "sgd_wd", "sgd_maximize",
    "sgd_groups", "adam", "adam_wd", "adam_amsgrad", "adam_maximize", "adamw", "adamw_amsgrad",
    "adamw_groups", "rmsprop", "rmsprop_centered_momentum", "rmsprop_momentum", "adagrad",
    "adagrad_full",
};
#define NCASES ((int)(sizeof optim_cases / sizeof optim_cases[0]))

/* Every optimizer and option combination against PyTorch, in f32 and f64. */
START_TEST(test_vs_pytorch) {
    ocase c;
    case_load(&c, optim_cases[_i]);
    for (int d = 0; d < 2; d++) {
        nb_dtype dt = d ? NB_F64 : NB_F32;
        nb_scope_begin();
        nb_tensor *ps[NP];
        make_params(&c, dt, ps);
        nb_optim *opt = make_optim(&c, ps);
        run_steps(&c, opt, ps, dt, 0, c.steps, true);
        nb_optim_free(opt);
        nb_scope_end();
    }
    fx_free(&c.f);
}
END_TEST

/* a and b hold the same bytes: read in their own dtype (no conversion) from any device. */
static bool same_bits(const nb_tensor *a, const nb_tensor *b) {
    if (nb_numel(a) != nb_numel(b) || a->dtype != b->dtype) return false;
    size_t len = (size_t)nb_numel(a) * nb_dtype_size(a->dtype);
    char *ba = malloc(len ? len : 1), *bb = malloc(len ? len : 1);
    ck_assert(nb_read(a, ba, nb_numel(a), a->dtype) == NB_OK);
    ck_assert(nb_read(b, bb, nb_numel(b), b->dtype) == NB_OK);
    bool same = memcmp(ba, bb, len) == 0;
    free(ba);
    free(bb);
    return same;
}

/* Save after two steps, load into a fresh optimizer over copies of the parameters, and
 * continue: the result is bit-identical to the uninterrupted run, state included. */
START_TEST(test_state_roundtrip) {
    ocase c;
    case_load(&c, optim_cases[_i]);
    for (int d = 0; d < 2; d++) {
        nb_dtype dt = d ? NB_F64 : NB_F32;
        nb_scope_begin();
        nb_tensor *pa[NP], *pb[NP], *pc[NP];
        make_params(&c, dt, pa);
        make_params(&c, dt, pb);
        nb_optim *a = make_optim(&c, pa), *b = make_optim(&c, pb);
        run_steps(&c, a, pa, dt, 0, c.steps, false);
        run_steps(&c, b, pb, dt, 0, 2, false);
        /* The checkpoint: copies of the parameters and of the state. */
        const nb_params *st = nb_optim_state(b);
        ck_assert(st);
        nb_tensor **saved = malloc(sizeof(nb_tensor *) * (size_t)st->count);
        for (int i = 0; i < st->count; i++) saved[i] = nb_clone(st->tensors[i]);
        for (int i = 0; i < NP; i++) {
            pc[i] = nb_clone(pb[i]);
            nb_set_requires_grad(pc[i], true);
        }
        nb_optim *o = make_optim(&c, pc);
        ASSERT_OK(nb_optim_load_state(o, st->names, saved, st->count));
        nb_optim_free(b);
        run_steps(&c, o, pc, dt, 2, c.steps, false);
        for (int i = 0; i < NP; i++)
            ck_assert_msg(same_bits(pa[i], pc[i]), "%s: parameter %d differs after resume",
                          optim_cases[_i], i);
        const nb_params *sa = nb_optim_state(a), *so = nb_optim_state(o);
        ck_assert_int_eq(sa->count, so->count);
        for (int i = 0; i < sa->count; i++) {
            ck_assert_str_eq(sa->names[i], so->names[i]);
            ck_assert_msg(same_bits(sa->tensors[i], so->tensors[i]), "state %s differs",
                          sa->names[i]);
        }
        free(saved);
        nb_optim_free(a);
        nb_optim_free(o);
        nb_scope_end();
    }
    fx_free(&c.f);
}
END_TEST

/* State names and contents for Adam after one step. */
START_TEST(test_state_names) {
    nb_scope_begin();
    nb_tensor *w = tu_random((int64_t[]){2, 3}, 2, NB_F32, -1, 1, 1);
    nb_tensor *b = tu_random((int64_t[]){3}, 1, NB_F32, -1, 1, 2);
    nb_params ps = {2, (nb_tensor *[]){w, b}, (const char *[]){"layer.weight", "layer.bias"}};
    nb_adam_opts ao = nb_adam_defaults();
    ao.amsgrad = true;
    nb_optim *opt = nb_adam_new(&ps, &ao);
    const nb_params *st = nb_optim_state(opt);
    ck_assert_int_eq(st->count, 5); /* no parameter state before the first step */
    ck_assert_str_eq(st->names[0], "param_groups.0.lr");
    ck_assert_double_eq(nb_item_f64(st->tensors[0]), 1e-3);
    nb_set_grad(w, tu_random((int64_t[]){2, 3}, 2, NB_F32, -1, 1, 3));
    ASSERT_OK(nb_step(opt)); /* b has no gradient: skipped, no state */
    st = nb_optim_state(opt);
    const char *want[] = {"exp_avg.layer.weight", "exp_avg_sq.layer.weight",
                          "max_exp_avg_sq.layer.weight", "step.layer.weight",
                          "param_groups.0.lr", "param_groups.0.weight_decay",
                          "param_groups.0.beta1", "param_groups.0.beta2", "param_groups.0.eps"};
    ck_assert_int_eq(st->count, 9);
    for (int i = 0; i < 9; i++) ck_assert_str_eq(st->names[i], want[i]);
    ck_assert_int_eq(nb_tensor_dtype(st->tensors[3]), NB_I64);
    ck_assert_int_eq(nb_item_i64(st->tensors[3]), 1);
    ck_assert_int_eq(nb_ndim(st->tensors[0]), 2);
    ck_assert_double_eq(nb_item_f64(st->tensors[7]), 0.999);
    nb_optim_free(opt);
    nb_scope_end();
}
END_TEST

/* load_state rejects missing, unexpected, duplicate, mis-shaped and mistyped entries and
 * leaves the optimizer as it was. */
START_TEST(test_state_errors) {
    nb_scope_begin();
    nb_tensor *w = tu_random((int64_t[]){2, 3}, 2, NB_F32, -1, 1, 1);
    nb_params ps = {1, (nb_tensor *[]){w}, (const char *[]){"w"}};
    nb_optim *opt = nb_adam_new(&ps, NULL);
    nb_set_grad(w, tu_random((int64_t[]){2, 3}, 2, NB_F32, -1, 1, 3));
    ASSERT_OK(nb_step(opt));
    const nb_params *st = nb_optim_state(opt);
    ck_assert_int_eq(st->count, 8); /* exp_avg, exp_avg_sq, step, 5 group values */
    char copies[8][64]; /* the list's names die with the next nb_optim_state call */
    const char *names[9];
    nb_tensor *ts[9];
    for (int i = 0; i < 8; i++) {
        snprintf(copies[i], sizeof copies[i], "%s", st->names[i]);
        names[i] = copies[i];
        ts[i] = nb_clone(st->tensors[i]);
    }
    nb_tensor *wrong_shape = nb_zeros((int64_t[]){6}, 1, NB_F32);
    nb_tensor *wrong_dtype = nb_zeros((int64_t[]){2, 3}, 2, NB_F64);
    /* missing */
    ASSERT_ST(nb_optim_load_state(opt, names + 1, ts + 1, 7), NB_EINVAL, "missing 'exp_avg.w'");
    /* unexpected name, unknown parameter, hyperparameter of another optimizer */
    names[8] = "foo.w", ts[8] = ts[0];
    ASSERT_ST(nb_optim_load_state(opt, names, ts, 9), NB_EINVAL, "unexpected entry 'foo.w'");
    names[8] = "exp_avg.nope";
    ASSERT_ST(nb_optim_load_state(opt, names, ts, 9), NB_EINVAL, "no parameter");
    names[8] = "param_groups.0.momentum";
    ASSERT_ST(nb_optim_load_state(opt, names, ts, 9), NB_EINVAL, "unexpected");
    names[8] = "param_groups.1.lr";
    ASSERT_ST(nb_optim_load_state(opt, names, ts, 9), NB_EINVAL, "fewer groups");
    names[8] = "max_exp_avg_sq.w";
    ASSERT_ST(nb_optim_load_state(opt, names, ts, 9), NB_EINVAL, "not used");
    names[8] = "exp_avg.w";
    ASSERT_ST(nb_optim_load_state(opt, names, ts, 9), NB_EINVAL, "appears twice");
    /* shapes and dtypes */
    nb_tensor *keep = ts[0];
    ts[0] = wrong_shape;
    ASSERT_ST(nb_optim_load_state(opt, names, ts, 8), NB_ESHAPE,
              "has shape [6] but the parameter has shape [2,3]");
    ts[0] = wrong_dtype;
    ASSERT_ST(nb_optim_load_state(opt, names, ts, 8), NB_EDTYPE, "is f64 but the parameter is f32");
    ts[0] = keep;
    keep = ts[2];
    ts[2] = nb_scalar(-1, NB_I64);
    ASSERT_ST(nb_optim_load_state(opt, names, ts, 8), NB_EINVAL, "whole number");
    ts[2] = keep;
    /* a bad hyperparameter value */
    keep = ts[5];
    ts[5] = nb_scalar(1.5, NB_F64); /* beta1 */
    ck_assert_str_eq(names[5], "param_groups.0.beta1");
    ASSERT_ST(nb_optim_load_state(opt, names, ts, 8), NB_EINVAL, "betas[0]");
    ts[5] = keep;
    /* nothing changed; a correct load works, and only group entries reset the state */
    st = nb_optim_state(opt);
    ck_assert_int_eq(st->count, 8);
    ck_assert_int_eq(nb_item_i64(st->tensors[2]), 1);
    ck_assert_double_eq(nb_optim_get_lr(opt, 0), 1e-3);
    ASSERT_OK(nb_optim_load_state(opt, names, ts, 8));
    ASSERT_OK(nb_optim_load_state(opt, names + 3, ts + 3, 5));
    ck_assert_int_eq(nb_optim_state(opt)->count, 5);
    ASSERT_ST(nb_optim_load_state(opt, NULL, ts, 3), NB_ENULL, NULL);
    nb_optim_free(opt);
    nb_scope_end();
}
END_TEST

/* ---- groups, lr access, decay split ---------------------------------------------------------- */
START_TEST(test_groups) {
    nb_scope_begin();
    nb_tensor *w = tu_random((int64_t[]){4, 3}, 2, NB_F32, -1, 1, 1);
    nb_tensor *e = tu_random((int64_t[]){5, 2, 2}, 3, NB_F32, -1, 1, 2);
    nb_tensor *b = tu_random((int64_t[]){4}, 1, NB_F32, -1, 1, 3);
    nb_tensor *g = tu_random((int64_t[]){3}, 1, NB_F32, -1, 1, 4);
    nb_params all = {4, (nb_tensor *[]){w, b, e, g}, (const char *[]){"w", "b", "e", "g"}};
    nb_params decay, no_decay;
    ASSERT_OK(nb_params_split_decay(&all, &decay, &no_decay));
    ck_assert_int_eq(decay.count, 2);
    ck_assert_int_eq(no_decay.count, 2);
    ck_assert(decay.tensors[0] == w && decay.tensors[1] == e);
    ck_assert(no_decay.tensors[0] == b && no_decay.tensors[1] == g);
    ck_assert_str_eq(no_decay.names[1], "g");
    nb_adamw_opts ao = nb_adamw_defaults();
    ao.lr = 6e-4, ao.betas[1] = 0.95, ao.weight_decay = 0.1;
    nb_optim *opt = nb_adamw_new(&decay, &ao);
    nb_group_opts nd = nb_group_defaults();
    nd.weight_decay = 0;
    ck_assert_int_eq(nb_optim_add_group(opt, &no_decay, &nd), 1);
    nb_params_deinit(&decay);
    nb_params_deinit(&no_decay);
    ck_assert_int_eq(nb_optim_num_groups(opt), 2);
    nb_group_opts go;
    ASSERT_OK(nb_optim_group_opts(opt, 1, &go));
    ck_assert_double_eq(go.weight_decay, 0);
    ck_assert_double_eq(go.lr, 6e-4);          /* inherited */
    ck_assert_double_eq(go.betas[1], 0.95);
    ck_assert(isnan(go.momentum) && isnan(go.alpha)); /* adamw has neither */
    ASSERT_OK(nb_optim_group_opts(opt, 0, &go));
    ck_assert_double_eq(go.weight_decay, 0.1);
    const nb_params *ps = nb_optim_params(opt);
    ck_assert_int_eq(ps->count, 4);
    ck_assert(ps->tensors[2] == b);
    ck_assert_str_eq(ps->names[3], "g");
    /* lr access */
    ASSERT_OK(nb_optim_set_lr(opt, 1, 0.5));
    ck_assert_double_eq(nb_optim_get_lr(opt, 1), 0.5);
    ck_assert_double_eq(nb_optim_get_lr(opt, 0), 6e-4);
    ASSERT_OK(nb_optim_set_lr(opt, -1, 0.25));
    ck_assert_double_eq(nb_optim_get_lr(opt, 0), 0.25);
    ASSERT_ST(nb_optim_set_lr(opt, 2, 0.1), NB_EINDEX, "group 2 out of range");
    ASSERT_ST(nb_optim_set_lr(opt, 0, -1), NB_EINVAL, "lr must be");
    ck_assert(isnan(nb_optim_get_lr(opt, 7)));
    nb_clear_error();
    /* group errors */
    nb_tensor *x = tu_random((int64_t[]){2}, 1, NB_F32, -1, 1, 5);
    nb_params px = {1, (nb_tensor *[]){x}, (const char *[]){"x"}};
    nb_group_opts bad = nb_group_defaults();
    bad.momentum = 0.9;
    tu_assert_error_at(nb_optim_add_group(opt, &px, &bad) < 0,
                       NB_EINVAL, "adamw has no momentum", __FILE__, __LINE__);
    bad = nb_group_defaults();
    bad.betas[0] = 1.0;
    tu_assert_error_at(nb_optim_add_group(opt, &px, &bad) < 0,
                       NB_EINVAL, "betas[0] must be in [0, 1)", __FILE__, __LINE__);
    nb_params dup = {1, (nb_tensor *[]){w}, (const char *[]){"w2"}};
    tu_assert_error_at(nb_optim_add_group(opt, &dup, NULL) < 0, NB_EINVAL,
                       "already in group 0", __FILE__, __LINE__);
    nb_params dupname = {1, (nb_tensor *[]){x}, (const char *[]){"w"}};
    tu_assert_error_at(nb_optim_add_group(opt, &dupname, NULL) < 0, NB_EINVAL,
                       "two parameters are named 'w'", __FILE__, __LINE__);
    ck_assert_int_eq(nb_optim_num_groups(opt), 2);
    ck_assert_int_eq(nb_optim_add_group(opt, &px, NULL), 2);
    nb_optim_free(opt);
    /* parameters without names are named by their index */
    nb_params anon = {2, (nb_tensor *[]){w, b}, NULL};
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 0.1, so.momentum = 0.9;
    opt = nb_sgd_new(&anon, &so);
    nb_set_grad(b, nb_ones_like(b));
    ASSERT_OK(nb_step(opt));
    ck_assert_str_eq(nb_optim_state(opt)->names[0], "momentum_buffer.1");
    nb_optim_free(opt);
    nb_scope_end();
}
END_TEST

/* ---- zero_grad ------------------------------------------------------------------------------- */
START_TEST(test_zero_grad) {
    nb_scope_begin();
    nb_tensor *a = tu_random((int64_t[]){3}, 1, NB_F32, -1, 1, 1);
    nb_tensor *b = tu_random((int64_t[]){2, 2}, 2, NB_F32, -1, 1, 2);
    nb_set_requires_grad(a, true);
    nb_set_requires_grad(b, true);
    nb_params ps = {2, (nb_tensor *[]){a, b}, (const char *[]){"a", "b"}};
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 0.1;
    nb_optim *opt = nb_sgd_new(&ps, &so);
    /* a: an ordinary gradient from backward; b: a view into a flat gradient buffer */
    ASSERT_OK(nb_backward(nb_sum(nb_mul(a, a), NULL, 0, false)));
    nb_tensor *flat = nb_full((int64_t[]){8}, 1, NB_F32, 3.0);
    nb_tensor *bg = nb_view(nb_narrow(flat, 0, 2, 4), (int64_t[]){2, 2}, 2);
    ASSERT_OK(nb_set_grad(b, bg));
    ck_assert(nb_grad(a) != NULL);
    ASSERT_OK(nb_zero_grad(opt));
    ck_assert(nb_grad(a) == NULL);              /* set to none */
    ck_assert(nb_grad(b) == bg);                /* kept, zeroed in place */
    double want[8] = {3, 3, 0, 0, 0, 0, 3, 3};
    tu_assert_close(flat, want, (int64_t[]){8}, 1, 0);
    /* backward accumulates into the kept view, and step reads it */
    ASSERT_OK(nb_backward(nb_sum(nb_mul_scalar(b, 2), NULL, 0, false)));
    double want2[8] = {3, 3, 2, 2, 2, 2, 3, 3};
    tu_assert_close(flat, want2, (int64_t[]){8}, 1, 0);
    double *b0 = tu_values(b);
    ASSERT_OK(nb_step(opt));
    double *b1 = tu_values(b);
    for (int i = 0; i < 4; i++) ck_assert_double_eq_tol(b1[i], b0[i] - 0.2, 1e-6);
    free(b0);
    free(b1);
    nb_optim_free(opt);
    nb_scope_end();
}
END_TEST

/* A model with flat parameter memory trains through views: the flat buffers change in place
 * and zero_grad keeps the gradient views. Written as docs/architecture.md's training step. */
START_TEST(test_flat_model) {
    nb_module *model = nb_sequential_new(nb_linear_new(4, 8, NULL), nb_relu_new(),
                                     nb_linear_new(8, 3, NULL), NULL);
    ck_assert(model);
    ASSERT_OK(nb_module_flatten_parameters(model, 0));
    nb_sgd_opts so2 = nb_sgd_defaults();
    so2.lr = 0.05f, so2.momentum = 0.9f;
    nb_optim *opt = nb_sgd_new(nb_parameters(model), &so2);
    ck_assert(opt);
    nb_tensor *fp = nb_module_flat_params(model), *fg = nb_module_flat_grads(model);
    double first = 0, last = 0;
    for (int it = 0; it < 20; it++) {
        nb_scope_begin();
        nb_tensor *x = tu_random((int64_t[]){16, 4}, 2, NB_F32, -1, 1, 7);
        nb_tensor *y = nb_argmax(x, 1, false); /* learnable: the largest of the first 3 inputs */
        nb_tensor *yy = nb_minimum_scalar(y, 2);
        nb_tensor *loss = nb_cross_entropy(nb_forward(model, x), yy, NULL);
        ck_assert_msg(loss, "%s", nb_last_error());
        nb_zero_grad(opt);
        nb_backward(loss);
        nb_step(opt);
        if (it == 0) first = nb_item_f64(loss);
        last = nb_item_f64(loss);
        nb_scope_end();
    }
    ck_assert_msg(last < first, "loss did not decrease: %g -> %g", first, last);
    /* the parameters are still views of the flat buffer, and so are the gradients */
    const nb_params *ps = nb_parameters(model);
    for (int i = 0; i < ps->count; i++) {
        ck_assert(nb_shares_storage(ps->tensors[i], fp));
        ck_assert(nb_shares_storage(nb_grad(ps->tensors[i]), fg));
    }
    nb_zero_grad(opt);
    for (int i = 0; i < ps->count; i++) ck_assert(nb_shares_storage(nb_grad(ps->tensors[i]), fg));
    nb_optim_free(opt);
    nb_module_free(model);
}
END_TEST

/* ---- larger parameters: the parallel path against a double reference loop -------------------- */
START_TEST(test_large_adamw) {
    nb_scope_begin();
    const int64_t n = 100003;
    nb_tensor *p = tu_random(&n, 1, NB_F64, -1, 1, 11);
    double *p0 = tu_values(p);
    nb_params ps = {1, (nb_tensor *[]){p}, (const char *[]){"p"}};
    nb_adamw_opts ao = nb_adamw_defaults();
    ao.lr = 0.01, ao.weight_decay = 0.1, ao.amsgrad = true;
    nb_optim *opt = nb_adamw_new(&ps, &ao);
    double *m = calloc((size_t)n, sizeof(double)), *v = calloc((size_t)n, sizeof(double));
    double *vm = calloc((size_t)n, sizeof(double));
    for (int s = 1; s <= 3; s++) {
        nb_tensor *g = tu_random(&n, 1, NB_F64, -s, s, 100 + (uint64_t)s);
        double *gv = tu_values(g);
        nb_set_grad(p, g);
        ASSERT_OK(nb_step(opt));
        double bc1 = 1 - pow(0.9, s), bc2 = 1 - pow(0.999, s);
        for (int64_t i = 0; i < n; i++) {
            p0[i] *= 1 - 0.01 * 0.1;
            m[i] = 0.9 * m[i] + 0.1 * gv[i];
            v[i] = 0.999 * v[i] + 0.001 * gv[i] * gv[i];
            vm[i] = fmax(vm[i], v[i]);
            p0[i] -= 0.01 / bc1 * m[i] / (sqrt(vm[i]) / sqrt(bc2) + 1e-8);
        }
        free(gv);
    }
    tu_assert_close(p, p0, &n, 1, 1e-12);
    free(p0), free(m), free(v), free(vm);
    nb_optim_free(opt);
    nb_scope_end();
}
END_TEST

/* Empty parameters are fine, and after the first step an update allocates nothing. */
START_TEST(test_empty_and_steady) {
    nb_scope_begin();
    nb_tensor *e = nb_zeros((int64_t[]){2, 0}, 2, NB_F32);
    nb_tensor *w = tu_random((int64_t[]){300}, 1, NB_F32, -1, 1, 1);
    nb_params ps = {2, (nb_tensor *[]){e, w}, (const char *[]){"e", "w"}};
    nb_adam_opts ao = nb_adam_defaults();
    ao.amsgrad = true;
    nb_rmsprop_opts ro = nb_rmsprop_defaults();
    ro.centered = true, ro.momentum = 0.5;
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 0.1, so.momentum = 0.9, so.nesterov = true;
    nb_optim *opts[3] = {nb_adam_new(&ps, &ao), nb_rmsprop_new(&ps, &ro), nb_sgd_new(&ps, &so)};
    nb_set_grad(e, nb_zeros((int64_t[]){2, 0}, 2, NB_F32));
    nb_set_grad(w, tu_random((int64_t[]){300}, 1, NB_F32, -1, 1, 2));
    for (int k = 0; k < 3; k++) {
        ck_assert(opts[k]);
        for (int i = 0; i < 2; i++) ASSERT_OK(nb_step(opts[k]));
    }
    ck_assert(nb_clip_grad_norm(&ps, 1.0, 2) > 0);
    nb_alloc_stats a, b;
    nb_alloc_get_stats(&a);
    for (int i = 0; i < 10; i++)
        for (int k = 0; k < 3; k++) ASSERT_OK(nb_step(opts[k]));
    nb_alloc_get_stats(&b);
    ck_assert_int_eq(a.allocs, b.allocs);
    for (int k = 0; k < 3; k++) nb_optim_free(opts[k]);
    nb_scope_end();
}
END_TEST

/* ---- step errors ----------------------------------------------------------------------------- */
/* Options are read as written (docs/conventions.md): a zero is a zero, never the default
 * (issue 17 item 4). The behavioural checks use fully written compound literals, so they
 * compile against the old API too, where they failed: 0 became PyTorch's default there. */
START_TEST(test_zero_is_zero) {
    nb_scope_begin();
    const int64_t n = 5;
    double g1[5] = {0.5, -1, 2e-3, -3e-3, 0.25}, g2[5] = {-0.2, 0.3, 1e-3, 4e-3, -0.5};
    double *gs[2] = {g1, g2};
    /* AdamW, weight_decay 0 and betas {0, 0.99}: no decay and m = g */
    nb_tensor *p = tu_random(&n, 1, NB_F64, -1, 1, 3);
    double *want = tu_values(p), v[5] = {0};
    nb_params ps = {1, (nb_tensor *[]){p}, (const char *[]){"p"}};
    nb_adamw_opts ao = nb_adamw_defaults();
    ao.lr = 0.1, ao.betas[0] = 0, ao.betas[1] = 0.99, ao.eps = 1e-8, ao.weight_decay = 0;
    nb_optim *opt = nb_adamw_new(&ps, &ao);
    for (int s = 1; s <= 2; s++) {
        nb_set_grad(p, tu_tensor(gs[s - 1], &n, 1, NB_F64));
        ASSERT_OK(nb_step(opt));
        for (int i = 0; i < n; i++) {
            double g = gs[s - 1][i];
            v[i] = 0.99 * v[i] + 0.01 * g * g;
            want[i] -= 0.1 * g / (sqrt(v[i]) / sqrt(1 - pow(0.99, s)) + 1e-8);
        }
    }
    tu_assert_close(p, want, &n, 1, 1e-12);
    nb_group_opts go;
    ASSERT_OK(nb_optim_group_opts(opt, 0, &go));
    ck_assert_double_eq(go.weight_decay, 0);
    ck_assert_double_eq(go.betas[0], 0);
    /* a group's weight_decay 0 is 0, not the optimizer's 0.5 */
    nb_optim_free(opt);
    nb_adamw_opts ao2 = nb_adamw_defaults();
    ao2.lr = 0.1, ao2.betas[0] = 0.9, ao2.betas[1] = 0.999, ao2.eps = 1e-8, ao2.weight_decay = 0.5;
    opt = nb_adamw_new(&ps, &ao2);
    nb_tensor *q = tu_random(&n, 1, NB_F64, -1, 1, 4);
    nb_group_opts gq = nb_group_defaults();
    gq.lr = 0.1, gq.weight_decay = 0, gq.betas[0] = 0.9, gq.betas[1] = 0.999, gq.eps = 1e-8;
    ck_assert_int_eq(
        nb_optim_add_group(opt, &(nb_params){1, (nb_tensor *[]){q}, (const char *[]){"q"}}, &gq),
        1);
    ASSERT_OK(nb_optim_group_opts(opt, 1, &go));
    ck_assert_double_eq(go.weight_decay, 0);
    nb_optim_free(opt);
    free(want);
    /* RMSprop alpha 0: the square average is the last squared gradient */
    p = tu_random(&n, 1, NB_F64, -1, 1, 5);
    want = tu_values(p);
    ps.tensors[0] = p;
    nb_rmsprop_opts rmo = nb_rmsprop_defaults();
    rmo.lr = 0.01, rmo.alpha = 0, rmo.eps = 1e-8;
    opt = nb_rmsprop_new(&ps, &rmo);
    nb_set_grad(p, tu_tensor(g1, &n, 1, NB_F64));
    ASSERT_OK(nb_step(opt));
    for (int i = 0; i < n; i++) want[i] -= 0.01 * g1[i] / (fabs(g1[i]) + 1e-8);
    tu_assert_close(p, want, &n, 1, 1e-12);
    nb_optim_free(opt);
    free(want);
    /* Adagrad eps 0: a step of exactly lr * sign(g) */
    p = tu_random(&n, 1, NB_F64, -1, 1, 6);
    want = tu_values(p);
    ps.tensors[0] = p;
    nb_adagrad_opts ago = nb_adagrad_defaults();
    ago.lr = 0.1, ago.eps = 0;
    opt = nb_adagrad_new(&ps, &ago);
    nb_set_grad(p, tu_tensor(g1, &n, 1, NB_F64));
    ASSERT_OK(nb_step(opt));
    for (int i = 0; i < n; i++) want[i] -= 0.1 * (g1[i] > 0 ? 1 : -1);
    tu_assert_close(p, want, &n, 1, 1e-15);
    nb_optim_free(opt);
    free(want);
    /* schedules: gamma 0 is 0; a one-cycle base_momentum 0 is 0 */
    nb_sched_opts so = nb_sched_defaults(NB_SCHED_STEP);
    so.step_size = 2, so.gamma = 0;
    ck_assert_double_eq(nb_sched_lr_at(&so, 1.0, 1), 1.0);
    ck_assert_double_eq(nb_sched_lr_at(&so, 1.0, 2), 0);
    so = nb_sched_defaults(NB_SCHED_ONECYCLE);
    so.total_steps = 10, so.max_lr = 1, so.pct_start = 0.3, so.div_factor = 25;
    so.final_div_factor = 1e4, so.cycle_momentum = true, so.base_momentum = 0;
    so.max_momentum = 0.95;
    ck_assert_double_eq_tol(nb_sched_momentum_at(&so, 2), 0, 1e-15); /* the peak of lr */
    /* clip: norm_type 0 is an error, not the 2-norm */
    nb_set_grad(p, tu_tensor(g1, &n, 1, NB_F64));
    ck_assert(nb_clip_grad_norm(&ps, 1.0, 0) == NB_EINVAL);
    nb_clear_error();
    nb_scope_end();
}
END_TEST

/* The constructors give the documented defaults; NULL options are the same. */
/* A one-stage pipeline's stage: the loss sum(w^2) / 2 (gradient w). */
static nb_tensor *pipe_stage(void *ctx, int chunk, int micro, nb_tensor *input) {
    (void)chunk, (void)micro, (void)input;
    nb_tensor *w = ctx;
    return nb_mul_scalar(nb_sum(nb_mul(w, w), NULL, 0, false), 0.5);
}

/* nb_pipe_opts: the constructor's values, and every field read as written (a 0 that used to
 * mean "1" is refused). */
START_TEST(test_pipe_opts_as_written) {
    nb_pipe_opts d = nb_pipe_defaults();
    ck_assert(d.schedule == NB_PIPE_1F1B && d.n_micro == 1 && d.virtual_stages == 1 &&
              d.act_shape == NULL && d.act_ndim == 0 && d.act_dtype == NB_F32 &&
              !d.forward_only && d.loss_scale == 1.0);
    nb_scope_begin();
    nb_comm *self = nb_comm_self();
    nb_tensor *w = nb_full((int64_t[]){3}, 1, NB_F32, 2.0);
    nb_set_requires_grad(w, true);
    nb_pipe_opts z = nb_pipe_defaults(); /* virtual_stages 0 */
    z.schedule = NB_PIPE_1F1B, z.n_micro = 1, z.virtual_stages = 0, z.loss_scale = 0;
    ck_assert(isnan(nb_pipe_run(self, &z, pipe_stage, w, NULL)));
    ck_assert_int_eq(nb_last_status(), NB_EINVAL);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "got 0 and 0 (start from nb_pipe_defaults()"));
    z.virtual_stages = 1; /* loss_scale still 0 */
    ck_assert(isnan(nb_pipe_run(self, &z, pipe_stage, w, NULL)));
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "got 1 and 0"));
    ck_assert_ptr_null(nb_grad(w));
    /* from the constructor: runs; loss_scale scales the gradient, not the returned loss */
    d.loss_scale = 4;
    double loss = nb_pipe_run(self, &d, pipe_stage, w, NULL);
    ck_assert_msg(loss == 6.0, "loss %g: %s", loss, nb_last_error());
    ck_assert_ptr_nonnull(nb_grad(w));
    ck_assert_double_eq(nb_item_f64(nb_sum(nb_grad(w), NULL, 0, false)), 3 * 2.0 * 4);
    nb_comm_free(self);
    nb_scope_end();
}
END_TEST

START_TEST(test_option_defaults) {
    nb_adam_opts a = nb_adam_defaults(), aw = nb_adamw_defaults();
    ck_assert(a.lr == 1e-3 && a.betas[0] == 0.9 && a.betas[1] == 0.999 && a.eps == 1e-8 &&
              a.weight_decay == 0 && !a.amsgrad && !a.maximize);
    ck_assert(aw.lr == 1e-3 && aw.betas[0] == 0.9 && aw.betas[1] == 0.999 && aw.eps == 1e-8 &&
              aw.weight_decay == 1e-2);
    nb_rmsprop_opts r = nb_rmsprop_defaults();
    ck_assert(r.lr == 1e-2 && r.alpha == 0.99 && r.eps == 1e-8 && r.weight_decay == 0 &&
              r.momentum == 0 && !r.centered);
    nb_adagrad_opts d = nb_adagrad_defaults();
    ck_assert(d.lr == 1e-2 && d.lr_decay == 0 && d.weight_decay == 0 &&
              d.initial_accumulator_value == 0 && d.eps == 1e-10);
    nb_sgd_opts s = nb_sgd_defaults();
    ck_assert(s.lr == 0 && s.momentum == 0 && s.dampening == 0 && s.weight_decay == 0);
    nb_group_opts g = nb_group_defaults();
    ck_assert(isnan(g.lr) && isnan(g.weight_decay) && isnan(g.momentum) && isnan(g.dampening) &&
              isnan(g.betas[0]) && isnan(g.betas[1]) && isnan(g.eps) && isnan(g.alpha) &&
              isnan(g.lr_decay) && isnan(g.initial_accumulator_value));
    nb_sched_opts c = nb_sched_defaults(NB_SCHED_ONECYCLE);
    ck_assert(c.kind == NB_SCHED_ONECYCLE && isnan(c.max_lr) && c.pct_start == 0.3 &&
              c.div_factor == 25 && c.final_div_factor == 1e4 && c.base_momentum == 0.85 &&
              c.max_momentum == 0.95 && !c.cycle_momentum && c.total_steps == 0);
    ck_assert(nb_sched_defaults(NB_SCHED_STEP).gamma == 0.1);
    ck_assert(nb_sched_defaults(NB_SCHED_MULTISTEP).gamma == 0.1);
    ck_assert(nb_sched_defaults(NB_SCHED_EXPONENTIAL).gamma == 0); /* required */
    /* NULL options and the constructors' values make the same optimizer */
    nb_scope_begin();
    nb_tensor *w = nb_zeros((int64_t[]){2}, 1, NB_F32);
    nb_params ps = {1, (nb_tensor *[]){w}, (const char *[]){"w"}};
    nb_optim *o1 = nb_rmsprop_new(&ps, NULL), *o2 = nb_rmsprop_new(&ps, &r);
    nb_group_opts g1, g2;
    ASSERT_OK(nb_optim_group_opts(o1, 0, &g1));
    ASSERT_OK(nb_optim_group_opts(o2, 0, &g2));
    ck_assert(g1.lr == g2.lr && g1.alpha == g2.alpha && g1.eps == g2.eps);
    /* a group from nb_group_defaults() inherits everything; the getter's output round-trips */
    nb_tensor *u = nb_zeros((int64_t[]){2}, 1, NB_F32), *t = nb_zeros((int64_t[]){2}, 1, NB_F32);
    ck_assert_int_eq(nb_optim_add_group(o1, &(nb_params){1, (nb_tensor *[]){u},
                                                         (const char *[]){"u"}}, &g), 1);
    ck_assert_int_eq(nb_optim_add_group(o1, &(nb_params){1, (nb_tensor *[]){t},
                                                         (const char *[]){"t"}}, &g1), 2);
    ASSERT_OK(nb_optim_group_opts(o1, 1, &g2));
    ck_assert(g2.lr == 1e-2 && g2.alpha == 0.99 && isnan(g2.betas[0]));
    nb_optim_free(o1);
    nb_optim_free(o2);
    /* SGD's lr has no default */
    tu_assert_error(nb_sgd_new(&ps, &s), NB_EINVAL, "lr must be > 0");
    /* one-cycle max_lr NAN (the default) peaks at each group's lr */
    c.total_steps = 10;
    ck_assert_double_eq_tol(nb_sched_lr_at(&c, 0.5, 2), 0.5, 1e-15);
    c.max_lr = -1;
    ck_assert(isnan(nb_sched_lr_at(&c, 0.5, 2)));
    nb_clear_error();
    nb_scope_end();
}
END_TEST

START_TEST(test_errors) {
    nb_scope_begin();
    nb_tensor *w = tu_random((int64_t[]){2, 3}, 2, NB_F32, -1, 1, 1);
    nb_params ps = {1, (nb_tensor *[]){w}, (const char *[]){"w"}};
    nb_sgd_opts so = nb_sgd_defaults();
    tu_assert_error(nb_sgd_new(&ps, &so), NB_EINVAL, "sgd: lr must be > 0");
    tu_assert_error(nb_sgd_new(&ps, NULL), NB_EINVAL, "sgd: lr must be > 0");
    nb_sgd_opts so2 = nb_sgd_defaults();
    so2.lr = -0.1;
    tu_assert_error(nb_sgd_new(&ps, &so2), NB_EINVAL, "lr must be > 0");
    nb_sgd_opts so3 = nb_sgd_defaults();
    so3.lr = 0.1, so3.nesterov = true;
    tu_assert_error(nb_sgd_new(&ps, &so3), NB_EINVAL,
                    "nesterov momentum requires a momentum > 0 and zero dampening");
    nb_sgd_opts so4 = nb_sgd_defaults();
    so4.lr = 0.1, so4.momentum = 0.9, so4.dampening = 0.1, so4.nesterov = true;
    tu_assert_error(nb_sgd_new(&ps, &so4), NB_EINVAL, "nesterov");
    nb_sgd_opts so5 = nb_sgd_defaults();
    so5.lr = 0.1, so5.momentum = -1;
    tu_assert_error(nb_sgd_new(&ps, &so5), NB_EINVAL, "momentum must be >= 0");
    nb_adam_opts ao = nb_adam_defaults();
    ao.betas[0] = 0.9, ao.betas[1] = 1.0, ao.lr = 0, ao.eps = 0;
    tu_assert_error(nb_adam_new(&ps, &ao), NB_EINVAL, "adam: betas[1] must be in [0, 1), got 1");
    nb_adam_opts ao2 = nb_adam_defaults();
    ao2.betas[0] = -0.5, ao2.betas[1] = 0, ao2.lr = 0, ao2.eps = 0;
    tu_assert_error(nb_adamw_new(&ps, &ao2), NB_EINVAL, "betas[0]");
    nb_adam_opts ao3 = nb_adam_defaults();
    ao3.lr = -1, ao3.betas[0] = ao3.betas[1] = 0, ao3.eps = 0;
    tu_assert_error(nb_adam_new(&ps, &ao3), NB_EINVAL, "adam: lr must be >= 0");
    nb_adam_opts ao4 = nb_adam_defaults();
    ao4.eps = -1, ao4.lr = 0, ao4.betas[0] = ao4.betas[1] = 0;
    tu_assert_error(nb_adam_new(&ps, &ao4), NB_EINVAL, "eps must be >= 0");
    nb_adam_opts ao5 = nb_adam_defaults();
    ao5.weight_decay = -1, ao5.lr = 0, ao5.betas[0] = ao5.betas[1] = 0, ao5.eps = 0;
    tu_assert_error(nb_adamw_new(&ps, &ao5), NB_EINVAL, "weight_decay");
    nb_rmsprop_opts rmo = nb_rmsprop_defaults();
    rmo.alpha = -1, rmo.lr = 0, rmo.eps = 0;
    tu_assert_error(nb_rmsprop_new(&ps, &rmo), NB_EINVAL, "rmsprop: alpha");
    nb_adagrad_opts ago = nb_adagrad_defaults();
    ago.lr_decay = -1, ago.lr = 0, ago.eps = 0;
    tu_assert_error(nb_adagrad_new(&ps, &ago), NB_EINVAL, "lr_decay");
    nb_adagrad_opts ago2 = nb_adagrad_defaults();
    ago2.initial_accumulator_value = NAN, ago2.lr = 0, ago2.eps = 0;
    tu_assert_error(nb_adagrad_new(&ps, &ago2), NB_EINVAL, "initial_accumulator_value");
    tu_assert_error(nb_adam_new(NULL, NULL), NB_ENULL, "params is NULL");
    /* (f16/bf16 parameters get f32 master weights: tests/test_scaler.c) */
    nb_tensor *h = nb_zeros((int64_t[]){2}, 1, NB_I32);
    nb_params hp = {1, (nb_tensor *[]){h}, (const char *[]){"h"}};
    tu_assert_error(nb_adam_new(&hp, NULL), NB_EDTYPE, "'h' is i32");
    nb_tensor *nc = nb_transpose(w, 0, 1);
    nb_params ncp = {1, (nb_tensor *[]){nc}, (const char *[]){"t"}};
    tu_assert_error(nb_adam_new(&ncp, NULL), NB_EINVAL, "not contiguous");
    nb_params twice = {2, (nb_tensor *[]){w, w}, (const char *[]){"a", "b"}};
    tu_assert_error(nb_adam_new(&twice, NULL), NB_EINVAL, "listed twice");
    /* defaults and explicit zeros */
    nb_optim *opt = nb_adamw_new(&ps, NULL);
    nb_group_opts go;
    ASSERT_OK(nb_optim_group_opts(opt, 0, &go));
    ck_assert_double_eq(go.lr, 1e-3);
    ck_assert_double_eq(go.weight_decay, 1e-2);
    ck_assert_double_eq(go.eps, 1e-8);
    ck_assert_double_eq(go.betas[0], 0.9);
    nb_optim_free(opt);
    nb_adamw_opts zo = nb_adamw_defaults();
    zo.weight_decay = 0, zo.betas[0] = 0;
    opt = nb_adamw_new(&ps, &zo);
    ASSERT_OK(nb_optim_group_opts(opt, 0, &go));
    ck_assert_double_eq(go.weight_decay, 0);
    ck_assert_double_eq(go.betas[0], 0);
    ck_assert_double_eq(go.betas[1], 0.999);
    /* a gradient of the wrong dtype: nothing is updated */
    nb_tensor *v = tu_random((int64_t[]){3}, 1, NB_F32, -1, 1, 2);
    nb_params pv = {1, (nb_tensor *[]){v}, (const char *[]){"v"}};
    ck_assert_int_eq(nb_optim_add_group(opt, &pv, NULL), 1);
    nb_set_grad(w, nb_ones_like(w));
    nb_set_grad(v, nb_ones((int64_t[]){3}, 1, NB_F64));
    double *w0 = tu_values(w);
    ASSERT_ST(nb_step(opt), NB_EDTYPE, "the gradient of 'v' is f64 but the parameter is f32");
    tu_assert_close(w, w0, nb_shape(w), 2, 0);
    ck_assert_int_eq(nb_optim_state(opt)->count, 10); /* no parameter state either */
    free(w0);
    ASSERT_ST(nb_step(NULL), NB_ENULL, NULL);
    ASSERT_ST(nb_zero_grad(NULL), NB_ENULL, NULL);
    nb_optim_free(opt);
    nb_optim_free(NULL);
    nb_scope_end();
}
END_TEST

Suite *nb_suite_optim(void) {
    Suite *s = suite_create("optim");
    TCase *tc = tcase_create("optim");
    tcase_add_loop_test(tc, test_vs_pytorch, 0, NCASES);
    tcase_add_loop_test(tc, test_state_roundtrip, 0, NCASES);
    tcase_add_test(tc, test_state_names);
    tcase_add_test(tc, test_state_errors);
    tcase_add_test(tc, test_groups);
    tcase_add_test(tc, test_zero_grad);
    tcase_add_test(tc, test_flat_model);
    tcase_add_test(tc, test_large_adamw);
    tcase_add_test(tc, test_empty_and_steady);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_zero_is_zero);
    tcase_add_test(tc, test_option_defaults);
    tcase_add_test(tc, test_pipe_opts_as_written);
    nb_tests_optim_clip(tc); /* test_optim_clip.c */
    suite_add_tcase(s, tc);
    suite_add_tcase(s, nb_tcase_optim_devices()); /* tests/test_optim_devices.c */
    return s;
}
