/* test_autograd.c - the autograd engine: gradients through views and copies, accumulation,
 * broadcasting, hooks and their order, retain_graph, grad mode, in-place guards, errors,
 * and that graphs are freed (no leak, no growth). Per-op rules are checked in
 * test_grad_ops.c with gradcheck. */
#include <string.h>

#include "autograd/autograd_impl.h"
#include "testutil.h"

static nb_tensor *leaf(const double *v, const int64_t *shape, int ndim) {
    nb_tensor *t = tu_tensor(v, shape, ndim, NB_F64);
    ck_assert(nb_set_requires_grad(t, true) == NB_OK);
    return t;
}

START_TEST(test_views_and_copies) {
    nb_scope_begin();
    double v[12];
    for (int i = 0; i < 12; i++) v[i] = i;
    nb_tensor *x = leaf(v, (int64_t[]){3, 4}, 2);
    ck_assert(nb_is_leaf(x) && nb_requires_grad(x));
    /* y = clone(transpose(x)[1:3, :]).view(6) as f32 */
    nb_tensor *y = nb_to_dtype(nb_view(nb_clone(nb_narrow(nb_transpose(x, 0, 1), 0, 1, 2)),
                                       (int64_t[]){6}, 1), NB_F32);
    ck_assert(y && nb_requires_grad(y) && !nb_is_leaf(y));
    nb_tensor *g = tu_tensor((double[]){1, 2, 3, 4, 5, 6}, (int64_t[]){6}, 1, NB_F32);
    nb_backward_opts bo = nb_backward_defaults();
    bo.grad_output = g;
    ck_assert(nb_backward_ex(y, &bo) == NB_OK);
    /* y[k] = x[k % 3][1 + k / 3] */
    double ref[12] = {0};
    for (int k = 0; k < 6; k++) ref[(k % 3) * 4 + 1 + k / 3] = k + 1;
    tu_assert_close(nb_grad(x), ref, ((int64_t[]){3, 4}), 2, 0);
    ck_assert_int_eq(nb_tensor_dtype(nb_grad(x)), NB_F64);
    nb_scope_end();
}
END_TEST

START_TEST(test_accumulation_and_expand) {
    nb_scope_begin();
    nb_tensor *x = leaf((double[]){1, 2, 3}, (int64_t[]){3}, 1);
    /* two uses of x (select and expand) accumulate; expand sums back over the new dim */
    nb_tensor *e = nb_expand(nb_unsqueeze(x, 0), (int64_t[]){2, 3}, 2);
    nb_tensor *g = tu_tensor((double[]){1, 1, 1, 10, 10, 10}, (int64_t[]){2, 3}, 2, NB_F64);
    nb_backward_opts bo = nb_backward_defaults();
    bo.grad_output = g;
    ck_assert(nb_backward_ex(e, &bo) == NB_OK);
    tu_assert_close(nb_grad(x), ((double[]){11, 11, 11}), ((int64_t[]){3}), 1, 0);
    /* a second backward accumulates into .grad */
    nb_tensor *s = nb_select(x, 0, 2);
    ck_assert(nb_backward(s) == NB_OK);
    tu_assert_close(nb_grad(x), ((double[]){11, 11, 12}), ((int64_t[]){3}), 1, 0);
    nb_clear_grad(x);
    ck_assert(nb_grad(x) == NULL);
    nb_tensor *s2 = nb_slice(x, 0, 0, 3, 2);
    nb_backward_opts bo2 = nb_backward_defaults();
    bo2.grad_output = nb_ones((int64_t[]){2}, 1, NB_F64);
    ck_assert(nb_backward_ex(s2, &bo2) == NB_OK);
    tu_assert_close(nb_grad(x), ((double[]){1, 0, 1}), ((int64_t[]){3}), 1, 0);
    nb_scope_end();
}
END_TEST

typedef struct {
    int order[8];
    int n;
    nb_tensor *leaves[4];
} hook_log;

static void log_hook(nb_tensor *t, void *ctx) {
    hook_log *l = ctx;
    for (int i = 0; i < 4; i++)
        if (l->leaves[i] == t) l->order[l->n++] = i;
    ck_assert(nb_grad(t) != NULL); /* complete when the hook runs */
}

START_TEST(test_hooks) {
    nb_scope_begin();
    hook_log log = {0};
    nb_tensor *a = leaf((double[]){1, 2}, (int64_t[]){2}, 1);
    nb_tensor *b = leaf((double[]){3, 4}, (int64_t[]){2}, 1);
    log.leaves[0] = a, log.leaves[1] = b;
    ck_assert_int_ge(nb_register_grad_hook(a, log_hook, &log), 0);
    int hb = nb_register_grad_hook(b, log_hook, &log);
    ck_assert_int_ge(hb, 0);
    /* a is used first in the forward, b last: b's gradient completes first */
    nb_tensor *ua = nb_unsqueeze(a, 0), *ub = nb_unsqueeze(b, 0);
    nb_tensor *both = nb_cat((nb_tensor *[]){nb_clone(ua), nb_clone(ub)}, 2, 0);
    if (nb_requires_grad(both)) { /* cat's rule comes with the ops' rules */
        nb_backward_opts bo2 = nb_backward_defaults();
        bo2.grad_output = nb_ones_like(both);
        ck_assert(nb_backward_ex(both, &bo2) == NB_OK);
        ck_assert_int_eq(log.n, 2);
        ck_assert_int_eq(log.order[0], 1);
        ck_assert_int_eq(log.order[1], 0);
    }
    /* a leaf used twice: its hook runs once, after both contributions */
    log.n = 0;
    nb_tensor *ea = nb_expand(nb_unsqueeze(a, 0), (int64_t[]){3, 2}, 2);
    nb_backward_opts bo = nb_backward_defaults();
    bo.grad_output = nb_ones((int64_t[]){3, 2}, 2, NB_F64);
    ck_assert(nb_backward_ex(ea, &bo) == NB_OK);
    ck_assert_int_eq(log.n, 1);
    ck_assert(nb_remove_grad_hook(b, hb) == NB_OK);
    ck_assert(nb_remove_grad_hook(b, hb) == NB_EINVAL);
    nb_clear_error();
    ck_assert_int_eq(nb_register_grad_hook(nb_clone(a), log_hook, &log), NB_EINVAL); /* not a leaf */
    nb_clear_error();
    nb_scope_end();
}
END_TEST

START_TEST(test_retain_graph) {
    nb_scope_begin();
    nb_tensor *x = leaf((double[]){1, 2, 3}, (int64_t[]){3}, 1);
    nb_tensor *y = nb_select(nb_clone(x), 0, 1);
    nb_backward_opts bo = nb_backward_defaults();
    bo.retain_graph = true;
    ck_assert(nb_backward_ex(y, &bo) == NB_OK);
    ck_assert(nb_backward(y) == NB_OK); /* second time works, then frees */
    tu_assert_close(nb_grad(x), ((double[]){0, 2, 0}), ((int64_t[]){3}), 1, 0);
    ck_assert_int_eq(nb_backward(y), NB_ESTATE);
    ck_assert(strstr(nb_last_error(), "retain_graph") != NULL);
    nb_clear_error();
    nb_scope_end();
}
END_TEST

START_TEST(test_grad_mode_and_guards) {
    nb_scope_begin();
    nb_tensor *x = leaf((double[]){1, 2}, (int64_t[]){2}, 1);
    ck_assert(nb_grad_enabled());
    bool prev = nb_set_grad_enabled(false);
    ck_assert(prev);
    nb_tensor *y = nb_clone(x);
    ck_assert(!nb_requires_grad(y) && nb_is_leaf(y));
    ck_assert(nb_fill_(x, 5) == NB_OK); /* in place allowed with grad mode off */
    nb_set_grad_enabled(prev);
    NB_NO_GRAD_BEGIN
    ck_assert(!nb_grad_enabled());
    NB_NO_GRAD_END
    ck_assert(nb_grad_enabled());
    /* in place into a tensor that requires grad, grad mode on: refused */
    ck_assert_int_eq(nb_fill_(x, 1), NB_EINVAL);
    ck_assert(strstr(nb_last_error(), "requires grad") != NULL);
    nb_clear_error();
    /* detach makes a new leaf that shares storage */
    nb_tensor *d = nb_detach(x);
    ck_assert(!nb_requires_grad(d) && nb_shares_storage(d, x));
    /* errors */
    ck_assert_int_eq(nb_backward(d), NB_EINVAL); /* does not require grad */
    nb_clear_error();
    ck_assert_int_eq(nb_backward(nb_clone(x)), NB_EINVAL); /* 2 elements, no grad_output */
    ck_assert(strstr(nb_last_error(), "grad_output") != NULL);
    nb_clear_error();
    nb_backward_opts bo = nb_backward_defaults();
    bo.grad_output = nb_ones((int64_t[]){3}, 1, NB_F64);
    ck_assert_int_eq(nb_backward_ex(nb_clone(x), &bo), NB_ESHAPE);
    nb_clear_error();
    ck_assert_int_eq(nb_set_requires_grad(nb_arange(0, 3, 1, NB_I64), true), NB_EDTYPE);
    nb_clear_error();
    ck_assert_int_eq(nb_set_requires_grad(nb_clone(x), true), NB_EINVAL); /* not a leaf */
    nb_clear_error();
    /* backward on a leaf itself */
    nb_tensor *s = leaf((double[]){7}, (int64_t[]){1}, 1);
    ck_assert(nb_backward(s) == NB_OK);
    tu_assert_close(nb_grad(s), ((double[]){1}), ((int64_t[]){1}), 1, 0);
    nb_scope_end();
}
END_TEST

START_TEST(test_set_grad_flat) {
    /* A gradient installed with nb_set_grad (a view into a flat buffer) is accumulated in
     * place: the data-parallel and ZeRO layout survives backward. */
    nb_scope_begin();
    nb_tensor *flat = nb_zeros((int64_t[]){8}, 1, NB_F64);
    nb_tensor *x = leaf((double[]){1, 2, 3}, (int64_t[]){3}, 1);
    nb_tensor *gv = nb_narrow(flat, 0, 2, 3);
    ck_assert(nb_set_grad(x, gv) == NB_OK);
    nb_backward_opts bo = nb_backward_defaults();
    bo.grad_output = nb_full((int64_t[]){3}, 1, NB_F64, 2);
    ck_assert(nb_backward_ex(nb_clone(x), &bo) == NB_OK);
    ck_assert(nb_grad(x) == gv);
    tu_assert_close(flat, ((double[]){0, 0, 2, 2, 2, 0, 0, 0}), ((int64_t[]){8}), 1, 0);
    ck_assert_int_eq(nb_set_grad(x, nb_zeros((int64_t[]){2}, 1, NB_F64)), NB_ESHAPE);
    nb_clear_error();
    nb_scope_end();
}
END_TEST

START_TEST(test_graph_freed) {
    nb_scope_begin();
    nb_tensor *x = leaf((double[]){1, 2, 3, 4}, (int64_t[]){2, 2}, 2);
    nb_alloc_stats a, b;
    for (int step = 0; step < 30; step++) {
        if (step == 10) nb_alloc_get_stats(&a);
        nb_scope_begin();
        nb_tensor *y = nb_select(nb_transpose(nb_clone(x), 0, 1), 0, 1);
        nb_backward_opts bo = nb_backward_defaults();
        bo.grad_output = nb_ones((int64_t[]){2}, 1, NB_F64);
        ck_assert(nb_backward_ex(y, &bo) == NB_OK);
        nb_scope_end();
    }
    nb_alloc_get_stats(&b);
    ck_assert_int_eq(b.bytes_live, a.bytes_live);
    ck_assert_int_eq(b.system_allocs, a.system_allocs);
    tu_assert_close(nb_grad(x), ((double[]){0, 30, 0, 30}), ((int64_t[]){2, 2}), 2, 0);
    nb_scope_end();
}
END_TEST

/* Writes into a tensor saved for backward would give silently wrong gradients: every
 * in-place write bumps its storage's version and backward refuses a stale saved tensor. */
START_TEST(test_saved_tensor_versions) {
    nb_scope_begin();
    /* the example: l = sum(w * x); x written in place before backward */
    nb_tensor *w = leaf((double[]){1, 1}, (int64_t[]){2}, 1);
    nb_tensor *x = tu_tensor((double[]){2, 2}, (int64_t[]){2}, 1, NB_F64);
    nb_tensor *l = nb_sum(nb_mul(w, x), NULL, 0, false);
    char want[200]; /* versions count writes: making x wrote it already */
    snprintf(want, sizeof want, "backward: a tensor saved by mul was modified in place after it "
             "was saved (version %llu, expected %llu); clone it before writing to it",
             (unsigned long long)nb__version_of(x) + 1, (unsigned long long)nb__version_of(x));
    ASSERT_OK(nb_fill_(x, 5));
    ASSERT_ST(nb_backward(l), NB_EINVAL, want);
    ck_assert(nb_grad(w) == NULL); /* refused before any gradient was accumulated */
    /* every in-place writer is seen, also through a view of the saved tensor */
    nb_tensor *src = tu_tensor((double[]){2}, (int64_t[]){1}, 1, NB_F64);
    for (int k = 0; k < 4; k++) {
        nb_tensor *xk = tu_tensor((double[]){2, 2}, (int64_t[]){2}, 1, NB_F64);
        nb_tensor *lk = nb_sum(nb_mul(w, xk), NULL, 0, false);
        nb_tensor *part = nb_narrow(xk, 0, 1, 1);
        switch (k) {
        case 0: ASSERT_OK(nb_copy_(part, src)); break;
        case 1: ASSERT_OK(nb_add_(part, src)); break;
        case 2: ASSERT_OK(nb_uniform_(part, 0, 1, NULL)); break;
        default: ASSERT_OK(nb_normal_(part, 0, 1, NULL)); break;
        }
        ASSERT_ST(nb_backward(lk), NB_EINVAL, "saved by mul");
        nb_clear_error();
    }
    /* a write into a tensor that is not saved (add saves nothing), or after backward: fine */
    nb_tensor *y = tu_tensor((double[]){2, 2}, (int64_t[]){2}, 1, NB_F64);
    nb_tensor *la = nb_sum(nb_add(w, y), NULL, 0, false);
    ASSERT_OK(nb_fill_(y, 5));
    ASSERT_OK(nb_backward(la));
    tu_assert_close(nb_grad(w), ((double[]){1, 1}), ((int64_t[]){2}), 1, 0);
    nb_clear_grad(w);
    nb_tensor *x2 = tu_tensor((double[]){2, 2}, (int64_t[]){2}, 1, NB_F64);
    ASSERT_OK(nb_backward(nb_sum(nb_mul(w, x2), NULL, 0, false)));
    ASSERT_OK(nb_fill_(x2, 5));
    tu_assert_close(nb_grad(w), ((double[]){2, 2}), ((int64_t[]){2}), 1, 0);
    /* a saved output: exp saves its result */
    nb_tensor *e = nb_exp(w);
    nb_tensor *le = nb_sum(e, NULL, 0, false);
    NB_NO_GRAD_BEGIN
    ASSERT_OK(nb_fill_(e, 0));
    NB_NO_GRAD_END
    ASSERT_ST(nb_backward(le), NB_EINVAL, "a tensor saved by exp was modified in place");
    nb_clear_error();
    nb_scope_end();
}
END_TEST

/* A training loop (the optimizer writes the parameters between iterations) is unaffected;
 * a step between a forward and its backward is caught, as in PyTorch. */
START_TEST(test_saved_versions_training) {
    nb_scope_begin();
    nb_tensor *w = leaf((double[]){1, 2}, (int64_t[]){2}, 1);
    nb_tensor *x = tu_tensor((double[]){3, 4}, (int64_t[]){2}, 1, NB_F64);
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 0.1;
    nb_optim *opt = nb_sgd_new(&(nb_params){.count = 1, .tensors = &w}, &so);
    ck_assert(opt != NULL);
    for (int it = 0; it < 3; it++) {
        nb_scope_begin();
        nb_tensor *l = nb_sum(nb_mul(nb_mul(w, w), x), NULL, 0, false); /* saves w */
        ASSERT_OK(nb_zero_grad(opt));
        ASSERT_OK(nb_backward(l));
        ASSERT_OK(nb_step(opt));
        nb_scope_end();
    }
    nb_scope_begin();
    nb_tensor *l = nb_sum(nb_mul(nb_mul(w, w), x), NULL, 0, false);
    nb_backward_opts bo = nb_backward_defaults();
    bo.retain_graph = true;
    ASSERT_OK(nb_backward_ex(l, &bo));
    ASSERT_OK(nb_step(opt)); /* w changes under the graph that saved it */
    ASSERT_ST(nb_backward(l), NB_EINVAL, "a tensor saved by mul was modified in place");
    nb_clear_error();
    nb_scope_end();
    nb_optim_free(opt);
    nb_scope_end();
}
END_TEST

static nb_tensor *f_arith(nb_tensor *const *in, int n, void *ctx) {
    (void)n, (void)ctx;
    /* (x * y - y) + x with y broadcast over rows; reduced over dim 1 (mean) and kept */
    nb_tensor *z = nb_add(nb_sub(nb_mul(in[0], in[1]), in[1]), in[0]);
    return nb_mean(nb_transpose(z, 0, 1), (int[]){0}, 1, true);
}

static nb_tensor *f_cube(nb_tensor *const *in, int n, void *ctx) {
    (void)n, (void)ctx;
    return nb_mul(in[0], nb_mul(in[0], in[0]));
}

/* Options are read as written (issue 17 item 4): atol = rtol = 0 is an exact comparison, not
 * the defaults, so the central difference's truncation error (eps^2 x''' / 6) is reported. */
START_TEST(test_gradcheck_opts) {
    nb_scope_begin();
    nb_gradcheck_opts d = nb_gradcheck_defaults();
    ck_assert(d.eps == 1e-6 && d.atol == 1e-5 && d.rtol == 1e-3 && d.seed == 0);
    nb_tensor *x = tu_random((int64_t[]){4}, 1, NB_F64, 0.5, 1, 9);
    ck_assert(nb_set_requires_grad(x, true) == NB_OK);
    nb_gradcheck_opts loose = nb_gradcheck_defaults();
    loose.eps = 1e-2, loose.atol = 1e-5, loose.rtol = 1e-3;
    ck_assert_msg(nb_gradcheck(f_cube, &x, 1, NULL, &loose) == NB_OK, "%s", nb_last_error());
    nb_gradcheck_opts exact = nb_gradcheck_defaults();
    exact.eps = 1e-2, exact.atol = 0, exact.rtol = 0;
    ck_assert_int_eq(nb_gradcheck(f_cube, &x, 1, NULL, &exact), NB_EINVAL);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "numeric"));
    nb_gradcheck_opts gco = nb_gradcheck_defaults();
    gco.atol = 1, gco.eps = 0, gco.rtol = 0;
    ck_assert_int_eq(nb_gradcheck(f_cube, &x, 1, NULL, &gco), NB_EINVAL); /* eps 0 */
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "eps must be > 0"));
    nb_clear_error();
    nb_scope_end();
}
END_TEST

START_TEST(test_gradcheck_basic) {
    nb_scope_begin();
    nb_tensor *x = tu_random((int64_t[]){3, 4}, 2, NB_F32, -1, 1, 7);
    nb_tensor *y = tu_random((int64_t[]){4}, 1, NB_F32, -1, 1, 8);
    ck_assert(nb_set_requires_grad(x, true) == NB_OK && nb_set_requires_grad(y, true) == NB_OK);
    ck_assert_msg(nb_gradcheck(f_arith, (nb_tensor *[]){x, y}, 2, NULL, NULL) == NB_OK, "%s",
                  nb_last_error());
    /* and the f32 backward agrees with the analytic f64 one */
    nb_tensor *s = nb_sum(f_arith((nb_tensor *[]){x, y}, 2, NULL), NULL, 0, false);
    ck_assert(nb_backward(s) == NB_OK);
    double *gy = tu_values(nb_grad(y)), *xv = tu_values(x);
    for (int j = 0; j < 4; j++) { /* s = sum_i mean_j z_ij: d/dy_j = sum_i (x_ij - 1) / 4 */
        double ref = 0;
        for (int i = 0; i < 3; i++) ref += (xv[i * 4 + j] - 1) / 4;
        ck_assert_msg(fabs(gy[j] - ref) < 1e-5, "%g vs %g", gy[j], ref);
    }
    free(gy), free(xv);
    nb_scope_end();
}
END_TEST

/* ---- end-of-backward callbacks and gradient guards (the engine's side of data parallel) ---- */
typedef struct end_log {
    int hooks, calls, hooks_at_call; /* hooks run so far; callback runs; hooks seen by it */
    nb_status seen, ret;             /* the status the callback got; what it returns */
    nb_tensor *spoil;                /* written in place by the hook (fails the backward) */
} end_log;

static nb_status end_cb(void *ctx, nb_status backward_status) {
    end_log *l = ctx;
    l->calls++, l->hooks_at_call = l->hooks, l->seen = backward_status;
    if (l->ret != NB_OK) return nb__error(l->ret, "end_cb: refused");
    nb__error(NB_EIO, "end_cb: an unrelated error that must not replace backward's");
    return NB_OK;
}

static void queue_hook(nb_tensor *t, void *ctx) {
    end_log *l = ctx;
    (void)t;
    l->hooks++;
    ck_assert(nb__queue_backward_end(end_cb, l) == NB_OK); /* every time: runs once */
    if (l->spoil) nb_fill_(l->spoil, 0);
}

static nb_status guard_fn(const nb_tensor *leaf, void *ctx, const char *who) {
    (void)leaf;
    return *(bool *)ctx ? nb__error(NB_ESTATE, "%s: guarded", who) : NB_OK;
}

/* ---- pre-backward hooks (the engine's side of ZeRO stage 3) -------------------------------- */
typedef struct pre_log {
    int calls, grads_seen; /* hook runs; leaf gradients present when it ran */
    nb_tensor *leaf;
    nb_status ret;
} pre_log;

static nb_status pre_hook(void *ctx) {
    pre_log *l = ctx;
    l->calls++;
    if (l->leaf && nb_grad(l->leaf)) l->grads_seen++;
    return l->ret == NB_OK ? NB_OK : nb__error(l->ret, "pre_hook: refused");
}

START_TEST(test_pre_backward_hooks) {
    nb_scope_begin();
    nb_tensor *w = tu_random((int64_t[]){3}, 1, NB_F32, -1, 1, 1);
    nb_tensor *x = tu_random((int64_t[]){3}, 1, NB_F32, -1, 1, 2);
    ASSERT_OK(nb_set_requires_grad(w, true));
    nb_tensor *y = nb_mul(w, x); /* a "module's output": its rule makes w's gradient */
    pre_log l = {.leaf = w};
    ASSERT_OK(nb__register_pre_backward_hook(y, pre_hook, &l));
    ASSERT_ST(nb__register_pre_backward_hook(w, pre_hook, &l), NB_EINVAL, "not produced");
    ASSERT_ST(nb__register_pre_backward_hook(y, NULL, &l), NB_ENULL, "fn is NULL");
    nb_backward_opts bo = nb_backward_defaults();
    bo.retain_graph = true;
    /* it runs once per backward, before the rule (no gradient of w yet) */
    ASSERT_OK(nb_backward_ex(nb_sum(nb_exp(y), NULL, 0, false), &bo));
    ck_assert_int_eq(l.calls, 1);
    ck_assert_int_eq(l.grads_seen, 0);
    ck_assert_ptr_nonnull(nb_grad(w));
    /* hooks run in registration order; a failure fails the backward, no gradient moves */
    pre_log l2 = {0};
    ASSERT_OK(nb__register_pre_backward_hook(y, pre_hook, &l2));
    nb_tensor *g0 = nb_clone(nb_grad(w));
    l.ret = NB_ECOMM;
    ASSERT_ST(nb_backward(nb_sum(y, NULL, 0, false)), NB_ECOMM, "pre_hook: refused");
    ck_assert_int_eq(l.calls, 2);
    ck_assert_int_eq(l2.calls, 0); /* the first failed: the second does not run */
    tu_assert_same_bytes(nb_grad(w), g0);
    nb_scope_end();
}
END_TEST

START_TEST(test_backward_end_callbacks) {
    nb_scope_begin();
    end_log l = {0};
    ASSERT_ST(nb__queue_backward_end(end_cb, &l), NB_ESTATE, "no backward is running");
    nb_tensor *a = tu_random((int64_t[]){3}, 1, NB_F32, -1, 1, 1);
    nb_tensor *b = tu_random((int64_t[]){3}, 1, NB_F32, -1, 1, 2);
    ASSERT_OK(nb_set_requires_grad(a, true));
    ASSERT_OK(nb_set_requires_grad(b, true));
    ck_assert_int_ge(nb_register_grad_hook(a, queue_hook, &l), 0);
    ck_assert_int_ge(nb_register_grad_hook(b, queue_hook, &l), 0);
    /* once, after every hook, with the backward's status */
    ASSERT_OK(nb_backward(nb_sum(nb_mul(a, b), NULL, 0, false)));
    ck_assert_int_eq(l.calls, 1);
    ck_assert_int_eq(l.hooks_at_call, 2);
    ck_assert_int_eq(l.seen, NB_OK);
    /* a callback's failure is backward's */
    l = (end_log){.ret = NB_ECOMM};
    ASSERT_ST(nb_backward(nb_sum(nb_mul(a, b), NULL, 0, false)), NB_ECOMM, "end_cb: refused");
    ck_assert_int_eq(l.calls, 1);
    /* a backward that fails part-way still runs it, and keeps its own error */
    nb_tensor *x = tu_random((int64_t[]){3}, 1, NB_F32, -1, 1, 4); /* saved by a * x, written
                                                                     * by b's hook */
    l = (end_log){.spoil = x};
    nb_clear_grad(a);
    nb_tensor *ax = nb_mul(a, x), *bb = nb_mul(b, b); /* bb's rule runs first (the later) */
    nb_tensor *z = nb_sum(nb_add(ax, bb), NULL, 0, false);
    ASSERT_ST(nb_backward(z), NB_EINVAL, "modified in place after it was saved");
    ck_assert_int_eq(l.calls, 1); /* b's hook ran first and queued it */
    ck_assert_int_eq(l.seen, NB_EINVAL);

    /* gradient guards: nb_step asks before updating anything */
    bool refuse = true;
    nb_tensor *w = tu_random((int64_t[]){3}, 1, NB_F32, -1, 1, 3);
    ASSERT_OK(nb_set_requires_grad(w, true));
    ASSERT_OK(nb__set_grad_guard(w, guard_fn, &refuse));
    ASSERT_ST(nb__set_grad_guard(w, guard_fn, &l), NB_ESTATE, "already guarded");
    ASSERT_OK(nb_backward(nb_sum(w, NULL, 0, false)));
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 1;
    nb_optim *o = nb_sgd_new(&(nb_params){.count = 1, .tensors = &w}, &so);
    ck_assert_ptr_nonnull(o);
    double *before = tu_values(w);
    ASSERT_ST(nb_step(o), NB_ESTATE, "step: guarded");
    tu_assert_close(w, before, (int64_t[]){3}, 1, 0);
    ASSERT_OK(nb__set_grad_guard(w, NULL, &l)); /* another's ctx: stays */
    ASSERT_ST(nb_step(o), NB_ESTATE, "step: guarded");
    refuse = false;
    ASSERT_OK(nb_step(o));
    ASSERT_OK(nb__set_grad_guard(w, NULL, &refuse));
    free(before);
    nb_optim_free(o);
    nb_scope_end();
}
END_TEST

Suite *nb_suite_autograd(void) {
    Suite *s = suite_create("autograd");
    TCase *tc = tcase_create("engine");
    tcase_add_test(tc, test_views_and_copies);
    tcase_add_test(tc, test_accumulation_and_expand);
    tcase_add_test(tc, test_hooks);
    tcase_add_test(tc, test_backward_end_callbacks);
    tcase_add_test(tc, test_retain_graph);
    tcase_add_test(tc, test_grad_mode_and_guards);
    tcase_add_test(tc, test_set_grad_flat);
    tcase_add_test(tc, test_graph_freed);
    tcase_add_test(tc, test_saved_tensor_versions);
    tcase_add_test(tc, test_saved_versions_training);
    tcase_add_test(tc, test_gradcheck_basic);
    tcase_add_test(tc, test_gradcheck_opts);
    tcase_add_test(tc, test_pre_backward_hooks);
    suite_add_tcase(s, tc);
    return s;
}
