/* test_recompute.c - the "recompute" suite: activation checkpointing (nb_recompute,
 * nb_module_set_recompute, the GPT's recompute setting). Losses and every gradient are
 * bit-identical to running without it, dropout on; leaf hooks run once per leaf; the
 * generators end where they would; activation memory is lower (full: within the "1/L of the
 * activations plus one block's" bound); and failures (a replay that fails or does other
 * work, an input written in place) are error values. */
#include <stdlib.h>
#include <string.h>

#include <nabla/autocast.h>
#include <nabla/gpt.h>
#include "testutil.h"

/* ---- a plain module: linear -> gelu -> dropout -> linear, its dropout from a generator ---- */
typedef struct {
    nb_generator *gen;
    int calls;      /* forward calls of the module's own function */
    int fail_from;  /* > 0: the call with this number fails (a replay, say) */
    bool swap;      /* from the second call on, read w2 where the first read w1 */
} mlp_self;

/* A caller-owned random f32 tensor (tu_random's intermediates die with a scope). */
static nb_tensor *rnd(const int64_t *shape, int ndim, uint64_t seed) {
    nb_scope_begin();
    nb_tensor *t = nb_keep(tu_random(shape, ndim, NB_F32, -1, 1, seed));
    nb_scope_end();
    return t;
}

static nb_tensor *mlp_forward(nb_module *m, nb_tensor *x) {
    mlp_self *s = nb_module_self(m);
    s->calls++;
    if (s->fail_from > 0 && s->calls >= s->fail_from) {
        nb_set_error(NB_EINVAL, "mlp: failing on call %d as asked", s->calls);
        return NULL;
    }
    nb_tensor *w1 = nb_module_param(m, "w1");
    if (s->swap && s->calls > 1) w1 = nb_module_param(m, "w3");
    nb_tensor *h = nb_gelu(nb_linear(x, w1, nb_module_param(m, "b1")));
    h = nb_dropout(h, 0.25, true, s->gen);
    return nb_add(x, nb_linear(h, nb_module_param(m, "w2"), NULL)); /* a residual: x used twice */
}

static const nb_module_vtable mlp_vt = {.type_name = "TestMLP", .forward = mlp_forward};

static nb_module *mlp_new(mlp_self *s, int64_t C, uint64_t seed) {
    nb_generator *g = nb_generator_new(seed);
    nb_module *m = nb_module_new(&mlp_vt, s);
    nb_module_add_parameter(m, "w1", nb_randn((int64_t[]){2 * C, C}, 2, NB_F32, g));
    nb_module_add_parameter(m, "b1", nb_randn((int64_t[]){2 * C}, 1, NB_F32, g));
    nb_module_add_parameter(m, "w2", nb_randn((int64_t[]){C, 2 * C}, 2, NB_F32, g));
    nb_module_add_parameter(m, "w3", nb_randn((int64_t[]){2 * C, C}, 2, NB_F32, g));
    nb_generator_free(g);
    return m;
}

static void count_hook(nb_tensor *leaf, void *ctx) {
    (void)leaf;
    (*(int *)ctx)++;
}

/* Two modules in a row (the second reading the first's output), sum of squares as the loss;
 * grads of x and every parameter copied out (caller frees). Returns the loss bytes. */
typedef struct {
    float loss;
    nb_tensor *grads[9]; /* x, then m1's 4 and m2's 4 parameters */
    uint64_t gen_offset;
    int hook_calls[8];
} run_out;

static void run_two(bool recompute, run_out *out) {
    const int64_t C = 8;
    nb_generator *gen = nb_generator_new(7);
    mlp_self s1 = {.gen = gen}, s2 = {.gen = NULL}; /* the second draws from the default */
    nb_module *m1 = mlp_new(&s1, C, 1), *m2 = mlp_new(&s2, C, 2);
    nb_module_set_recompute(m1, recompute, gen);
    nb_module_set_recompute(m2, recompute, NULL);
    nb_manual_seed(99);
    memset(out, 0, sizeof *out);
    nb_module *ms[2] = {m1, m2};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 4; i++)
            ck_assert_int_ge(nb_register_grad_hook(nb_parameters(ms[k])->tensors[i], count_hook,
                                                   &out->hook_calls[4 * k + i]), 0);
    nb_tensor *x = rnd((int64_t[]){3, 5, C}, 3, 5);
    nb_set_requires_grad(x, true);
    nb_scope_begin();
    nb_tensor *y = nb_forward(m2, nb_forward(m1, nb_mul_scalar(x, 1.5)));
    nb_tensor *loss = nb_sum(nb_mul(y, y), NULL, 0, false);
    ck_assert_ptr_nonnull(loss);
    ck_assert_int_eq(nb_backward(loss), NB_OK);
    ck_assert_int_eq(nb_read(loss, &out->loss, 1, NB_F32), NB_OK);
    nb_scope_end();
    out->grads[0] = nb_clone(nb_grad(x));
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 4; i++) {
            nb_tensor *g = nb_grad(nb_parameters(ms[k])->tensors[i]);
            out->grads[1 + 4 * k + i] = g ? nb_clone(g) : NULL;
        }
    out->gen_offset = nb_generator_offset(gen) * 1000003u + nb_generator_offset(NULL);
    ck_assert_int_eq(s1.calls, recompute ? 2 : 1);
    nb_tensor_free(x);
    nb_module_free(m1);
    nb_module_free(m2);
    nb_generator_free(gen);
}

static void free_run(run_out *r) {
    for (int i = 0; i < 9; i++) nb_tensor_free(r->grads[i]);
}

START_TEST(test_module_bit_identical) {
    run_out a, b;
    run_two(false, &a);
    run_two(true, &b);
    ck_assert(memcmp(&a.loss, &b.loss, sizeof a.loss) == 0);
    for (int i = 0; i < 9; i++) {
        if (i == 4 || i == 8) { /* w3 is never read */
            ck_assert_ptr_null(a.grads[i]);
            ck_assert_ptr_null(b.grads[i]);
            continue;
        }
        ck_assert_msg(a.grads[i] && b.grads[i], "gradient %d missing", i);
        tu_assert_same_bytes(a.grads[i], b.grads[i]);
    }
    ck_assert_uint_eq(a.gen_offset, b.gen_offset); /* the replays drew nothing */
    for (int i = 0; i < 8; i++) {
        int want = (i % 4 == 3) ? 0 : 1;
        ck_assert_int_eq(a.hook_calls[i], want);
        ck_assert_int_eq(b.hook_calls[i], want); /* once per leaf per backward */
    }
    free_run(&a);
    free_run(&b);
}
END_TEST

/* A function that is not a module, nested recompute, inputs without grad, grad mode off, and
 * backward twice with retain_graph. */
static nb_tensor *inner_fn(nb_tensor *const *in, int n, void *ctx) {
    (void)n;
    return nb_tanh(nb_mul(in[0], (nb_tensor *)ctx));
}
static nb_tensor *outer_fn(nb_tensor *const *in, int n, void *ctx) {
    (void)n;
    nb_tensor *a = nb_recompute(inner_fn, in, 1, ctx, NULL);
    return nb_mul(nb_sin(a), in[1]);
}

START_TEST(test_function_nested) {
    nb_tensor *w = rnd((int64_t[]){4, 6}, 2, 1);
    nb_tensor *x = rnd((int64_t[]){4, 6}, 2, 2);
    nb_tensor *z = rnd((int64_t[]){6}, 1, 3); /* needs no grad */
    nb_set_requires_grad(w, true);
    nb_set_requires_grad(x, true);
    nb_tensor *ref[2] = {NULL, NULL};
    for (int mode = 0; mode < 2; mode++) {
        nb_clear_grad(w);
        nb_clear_grad(x);
        nb_scope_begin();
        nb_tensor *y = mode ? nb_recompute(outer_fn, (nb_tensor *[]){x, z}, 2, w, NULL)
                            : outer_fn((nb_tensor *[]){x, z}, 2, w);
        ck_assert_ptr_nonnull(y);
        ck_assert(nb_requires_grad(y));
        nb_tensor *loss = nb_sum(y, NULL, 0, false);
        nb_backward_opts o = nb_backward_defaults();
        o.retain_graph = true;
        ck_assert_int_eq(nb_backward_ex(loss, &o), NB_OK);
        ck_assert_int_eq(nb_backward(loss), NB_OK); /* twice: gradients double */
        nb_scope_end();
        if (!mode) {
            ref[0] = nb_clone(nb_grad(w)), ref[1] = nb_clone(nb_grad(x));
        } else {
            tu_assert_same_bytes(ref[0], nb_grad(w));
            tu_assert_same_bytes(ref[1], nb_grad(x));
        }
    }
    ck_assert_ptr_null(nb_grad(z));
    /* grad mode off, or nothing requiring grad: a plain result, no node */
    nb_scope_begin();
    nb_tensor *y;
    NB_NO_GRAD_BEGIN
    y = nb_recompute(outer_fn, (nb_tensor *[]){x, z}, 2, w, NULL);
    ck_assert(y && !nb_requires_grad(y));
    NB_NO_GRAD_END
    nb_tensor *c = rnd((int64_t[]){4, 6}, 2, 4);
    y = nb_recompute(inner_fn, &c, 1, z, NULL);
    ck_assert(y && !nb_requires_grad(y) && nb_is_leaf(y));
    /* the parameter alone requires grad: the result still records */
    y = nb_recompute(inner_fn, &c, 1, w, NULL);
    ck_assert(y && nb_requires_grad(y));
    nb_clear_grad(w);
    ck_assert_int_eq(nb_backward(nb_sum(y, NULL, 0, false)), NB_OK);
    ck_assert_ptr_nonnull(nb_grad(w));
    nb_scope_end(); /* frees c */
    nb_tensor_free(ref[0]), nb_tensor_free(ref[1]);
    nb_tensor_free(w), nb_tensor_free(x), nb_tensor_free(z);
}
END_TEST

START_TEST(test_errors) {
    const int64_t C = 4;
    mlp_self s = {0};
    nb_module *m = mlp_new(&s, C, 1);
    nb_module_set_recompute(m, true, NULL);
    nb_tensor *x = rnd((int64_t[]){2, C}, 2, 5);
    nb_set_requires_grad(x, true);

    /* the replay fails: the backward returns its error */
    s = (mlp_self){.fail_from = 2};
    nb_scope_begin();
    nb_tensor *y = nb_forward(m, x);
    ck_assert_ptr_nonnull(y);
    ASSERT_ST(nb_backward(nb_sum(y, NULL, 0, false)), NB_EINVAL,
              "failed when replayed: mlp: failing on call 2");
    nb_scope_end();

    /* the forward fails: NULL and its error */
    s = (mlp_self){.fail_from = 1};
    nb_scope_begin();
    tu_assert_error(nb_forward(m, x), NB_EINVAL, "failing on call 1");
    nb_scope_end();

    /* the replay reads a parameter the first run did not */
    s = (mlp_self){.swap = true};
    nb_scope_begin();
    y = nb_forward(m, x);
    ASSERT_ST(nb_backward(nb_sum(y, NULL, 0, false)), NB_ESTATE, "first run did not");
    nb_scope_end();

    /* an input written in place after the forward */
    s = (mlp_self){0};
    nb_scope_begin();
    nb_tensor *x2 = nb_mul_scalar(x, 2.0);
    y = nb_forward(m, x2);
    NB_NO_GRAD_BEGIN
    ck_assert_int_eq(nb_fill_(x2, 1.0), NB_OK);
    NB_NO_GRAD_END
    ASSERT_ST(nb_backward(nb_sum(y, NULL, 0, false)), NB_EINVAL, "modified in place");
    nb_scope_end();

    /* a tensor requiring grad computed outside the function, read through ctx */
    nb_scope_begin();
    nb_tensor *outside = nb_mul_scalar(x, 3.0);
    tu_assert_error(nb_recompute(inner_fn, &x, 1, outside, NULL), NB_EINVAL,
                    "computed outside it by mul");
    nb_scope_end();

    /* argument errors */
    tu_assert_error(nb_recompute(NULL, &x, 1, NULL, NULL), NB_ENULL, "fn is NULL");
    tu_assert_error(nb_recompute(inner_fn, NULL, 1, x, NULL), NB_EINVAL, "inputs NULL");
    ASSERT_ST(nb_module_set_recompute(NULL, true, NULL), NB_ENULL, "module is NULL");
    nb_gpt_config bad = nb_gpt_config_defaults();
    bad.recompute = (nb_gpt_recompute)7;
    tu_assert_error(nb_gpt_new(&bad, NULL), NB_EINVAL, "recompute");

    nb_tensor_free(x);
    nb_module_free(m);
}
END_TEST

/* ---- the GPT --------------------------------------------------------------------------------- */
typedef struct {
    float loss;
    nb_params copy;
    int64_t act_peak; /* peak bytes above those live before the forward */
} gpt_out;

static void run_gpt(const nb_gpt_config *base, nb_gpt_recompute r, int64_t B, gpt_out *out) {
    nb_gpt_config cfg = *base;
    cfg.recompute = r;
    nb_generator *init = nb_generator_new(3), *dg = nb_generator_new(11);
    cfg.dropout_gen = dg;
    nb_module *m = nb_gpt_new(&cfg, init);
    ck_assert_ptr_nonnull(m);
    const int64_t T = cfg.block_size;
    nb_tensor *idx = nb_randint((int64_t[]){B, T}, 2, NB_I64, 0, cfg.vocab_size, init);
    nb_tensor *tgt = nb_randint((int64_t[]){B, T}, 2, NB_I64, 0, cfg.vocab_size, init);
    nb_alloc_stats st;
    nb_alloc_get_stats(&st);
    int64_t base_live = st.bytes_live;
    nb_alloc_reset_peak();
    nb_scope_begin();
    nb_tensor *loss = nb_gpt_loss(m, idx, tgt);
    ck_assert_ptr_nonnull(loss);
    ck_assert_int_eq(nb_backward(loss), NB_OK);
    ck_assert_int_eq(nb_read(loss, &out->loss, 1, NB_F32), NB_OK);
    nb_scope_end();
    nb_alloc_get_stats(&st);
    out->act_peak = st.bytes_peak - base_live;
    const nb_params *ps = nb_parameters(m);
    out->copy.count = ps->count;
    out->copy.tensors = calloc((size_t)ps->count, sizeof(nb_tensor *));
    for (int i = 0; i < ps->count; i++) {
        ck_assert_msg(nb_grad(ps->tensors[i]) != NULL, "%s has no gradient", ps->names[i]);
        out->copy.tensors[i] = nb_clone(nb_grad(ps->tensors[i]));
    }
    nb_tensor_free(idx), nb_tensor_free(tgt);
    nb_module_free(m);
    nb_generator_free(init), nb_generator_free(dg);
}

static void free_gpt(gpt_out *o) {
    for (int i = 0; i < o->copy.count; i++) nb_tensor_free(o->copy.tensors[i]);
    free(o->copy.tensors);
}

START_TEST(test_gpt_bit_identical) {
    nb_gpt_config cfg = nb_gpt_config_defaults();
    cfg.vocab_size = 64, cfg.block_size = 16, cfg.n_layer = 3, cfg.n_head = 2, cfg.n_embd = 32;
    cfg.dropout = 0.2;
    gpt_out ref, o;
    run_gpt(&cfg, NB_GPT_RECOMPUTE_NONE, 3, &ref);
    for (int r = NB_GPT_RECOMPUTE_ATTN; r <= NB_GPT_RECOMPUTE_FULL; r++) {
        run_gpt(&cfg, (nb_gpt_recompute)r, 3, &o);
        ck_assert_msg(memcmp(&ref.loss, &o.loss, sizeof o.loss) == 0, "recompute %d: loss %.9g "
                      "vs %.9g", r, (double)o.loss, (double)ref.loss);
        ck_assert_int_eq(o.copy.count, ref.copy.count);
        for (int i = 0; i < o.copy.count; i++) tu_assert_same_bytes(ref.copy.tensors[i], o.copy.tensors[i]);
        free_gpt(&o);
    }
    free_gpt(&ref);
}
END_TEST

/* Activation memory: the peak above the model's own bytes during one forward and backward
 * (parameter gradients included). What one block costs is told from a 1-layer run; full
 * recompute must stay within the 1-layer run's peak plus, for each further layer, its
 * input and its parameters' gradients, plus one block's worth (the replay's activations):
 * "1/L of the activations plus one block's". */
START_TEST(test_gpt_memory) {
    nb_gpt_config cfg = nb_gpt_config_defaults();
    cfg.vocab_size = 64, cfg.block_size = 64, cfg.n_layer = 1, cfg.n_head = 4, cfg.n_embd = 64;
    cfg.dropout = 0.1;
    const int64_t B = 4, L = 6;
    gpt_out one, none, attn, full;
    run_gpt(&cfg, NB_GPT_RECOMPUTE_NONE, B, &one);
    cfg.n_layer = L;
    run_gpt(&cfg, NB_GPT_RECOMPUTE_NONE, B, &none);
    run_gpt(&cfg, NB_GPT_RECOMPUTE_ATTN, B, &attn);
    run_gpt(&cfg, NB_GPT_RECOMPUTE_FULL, B, &full);
    /* parameter gradients are part of each peak: the same in every run of L layers */
    const int64_t block = (none.act_peak - one.act_peak) / (L - 1);
    const int64_t C = cfg.n_embd, input = B * cfg.block_size * C * 4;
    const int64_t grads = (12 * C * C + 13 * C) * 4; /* one block's parameter gradients */
    fprintf(stderr, "recompute memory (L %lld): none %lld, attn %lld, full %lld bytes; one "
            "layer %lld, per block %lld\n", (long long)L, (long long)none.act_peak,
            (long long)attn.act_peak, (long long)full.act_peak, (long long)one.act_peak,
            (long long)block);
    if (nb_default_device().type == NB_DEVICE_CPU) { /* the host allocator's own figures */
        ck_assert_int_lt(full.act_peak, none.act_peak);
        ck_assert_int_le(attn.act_peak, none.act_peak);
        ck_assert_int_le(full.act_peak, one.act_peak + (L - 1) * (input + grads) + block);
    }
    free_gpt(&one), free_gpt(&none), free_gpt(&attn), free_gpt(&full);
}
END_TEST

/* Under bf16 autocast the replay computes in bf16 as the forward did (the engine runs the
 * backward rules with autocast off): gradients bit-identical to no recompute. */
static nb_tensor *mm_fn(nb_tensor *const *in, int n, void *ctx) {
    (void)n;
    return nb_tanh(nb_matmul(in[0], (nb_tensor *)ctx));
}

START_TEST(test_autocast_replay) {
    nb_tensor *w = rnd((int64_t[]){16, 8}, 2, 11), *x = rnd((int64_t[]){4, 16}, 2, 12);
    ck_assert_int_eq(nb_set_requires_grad(w, true), NB_OK);
    ck_assert_int_eq(nb_set_requires_grad(x, true), NB_OK);
    nb_tensor *g[2][2];
    for (int rc = 0; rc < 2; rc++) {
        nb_clear_grad(w), nb_clear_grad(x);
        nb_scope_begin();
        ck_assert_int_eq(nb_autocast_begin(NB_BF16), NB_OK);
        nb_tensor *y = rc ? nb_recompute(mm_fn, &x, 1, w, NULL) : mm_fn(&x, 1, w);
        ck_assert_ptr_nonnull(y);
        nb_tensor *l = nb_sum(nb_to_dtype(y, NB_F32), NULL, 0, false);
        ck_assert_int_eq(nb_autocast_end(), NB_OK);
        ck_assert_int_eq(nb_backward(l), NB_OK);
        nb_scope_end();
        g[rc][0] = nb_clone(nb_grad(w)), g[rc][1] = nb_clone(nb_grad(x));
    }
    for (int i = 0; i < 2; i++) {
        tu_assert_same_bytes(g[0][i], g[1][i]);
        nb_tensor_free(g[0][i]), nb_tensor_free(g[1][i]);
    }
    nb_tensor_free(w), nb_tensor_free(x);
}
END_TEST

Suite *nb_suite_recompute(void) {
    Suite *s = suite_create("recompute");
    TCase *tc = tcase_create("recompute");
    tcase_add_test(tc, test_module_bit_identical);
    tcase_add_test(tc, test_function_nested);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_gpt_bit_identical);
    tcase_add_test(tc, test_gpt_memory);
    tcase_add_test(tc, test_autocast_replay);
    suite_add_tcase(s, tc);
    return s;
}
