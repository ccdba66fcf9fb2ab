/* test_gpt.c - the "gpt" suite: models/gpt's GPT against PyTorch's nanoGPT (logits, loss
 * and every gradient, from fixtures made by tools/make_gpt_fixture.py with weights under
 * nanoGPT's names), gradient accumulation equivalence, a short training run that must
 * learn, save/load round trips, sampling determinism, dropout, and argument errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nabla/gpt.h>
#include "testutil.h"

#ifndef NB_SOURCE_DIR
#define NB_SOURCE_DIR "."
#endif
#define FIXTURES NB_SOURCE_DIR "/tests/fixtures/gpt/"

static const nb_gpt_config *tiny_cfg(void) {
    static nb_gpt_config c;
    c = nb_gpt_config_defaults();
    c.vocab_size = 64, c.block_size = 16, c.n_layer = 2, c.n_head = 2, c.n_embd = 16;
    return &c;
}
static const nb_gpt_config *nobias_cfg(void) {
    static nb_gpt_config c;
    c = nb_gpt_config_defaults();
    c.vocab_size = 64, c.block_size = 8, c.n_layer = 1, c.n_head = 4, c.n_embd = 16;
    c.no_bias = true, c.gelu_tanh = true;
    return &c;
}

/* max |a - r| over the elements, and max |r|. */
static void max_diff(const nb_tensor *a, const nb_tensor *r, double *diff, double *scale) {
    ck_assert_int_eq(nb_numel(a), nb_numel(r));
    double *x = tu_values(a), *y = tu_values(r);
    *diff = 0, *scale = 0;
    for (int64_t i = 0; i < nb_numel(a); i++) {
        double d = fabs(x[i] - y[i]);
        if (!(d <= *diff)) *diff = d; /* NaN propagates */
        if (fabs(y[i]) > *scale) *scale = fabs(y[i]);
    }
    free(x);
    free(y);
}

/* a matches r to rel * max|r| (elementwise, scaled by the tensor's largest entry). */
static void assert_rel(const nb_tensor *a, const nb_tensor *r, double rel, const char *what) {
    double d, s;
    max_diff(a, r, &d, &s);
    ck_assert_msg(d <= rel * s + 1e-7, "%s: max |diff| %g exceeds %g x max |ref| %g", what, d,
                  rel, s);
}

static nb_module *fixture_model(const char *name, const nb_gpt_config *cfg) {
    char path[512];
    snprintf(path, sizeof path, FIXTURES "%s.safetensors", name);
    nb_module *m = nb_gpt_new(cfg, NULL);
    ck_assert_ptr_nonnull(m);
    /* strict: the file's names and the model's must be the same set, nanoGPT's */
    nb_status st = nb_module_load(m, path, true);
    ck_assert_msg(st == NB_OK, "%s", nb_last_error());
    return m;
}

static nb_safetensors *fixture_io(const char *name) {
    char path[512];
    snprintf(path, sizeof path, FIXTURES "%s_io.safetensors", name);
    nb_safetensors *f = nb_safetensors_open(path);
    ck_assert_msg(f != NULL, "%s", nb_last_error());
    return f;
}

/* (a) logits, loss and all gradients equal PyTorch's nanoGPT (f64 reference, f32 here). */
START_TEST(test_nanogpt_fixture) {
    nb_scope_begin();
    nb_module *m = fixture_model("tiny", tiny_cfg());
    nb_safetensors *io = fixture_io("tiny");
    /* the fixture's tensors are CPU tensors: the inputs go to the model's (default) device */
    nb_tensor *idx = nb_to_device(nb_safetensors_get(io, "idx"), nb_default_device());
    nb_tensor *tgt = nb_to_device(nb_safetensors_get(io, "targets"), nb_default_device());
    nb_tensor *logits = nb_forward(m, idx);
    ck_assert_ptr_nonnull(logits);
    ck_assert_int_eq(nb_ndim(logits), 3);
    ck_assert_int_eq(nb_size(logits, 2), 64);
    assert_rel(logits, nb_safetensors_get(io, "logits"), 1e-4, "logits");
    nb_tensor *loss = nb_gpt_loss(m, idx, tgt);
    double ref = nb_item_f64(nb_safetensors_get(io, "loss"));
    ck_assert_msg(fabs(nb_item_f64(loss) - ref) <= 1e-5 * ref, "loss %.8f vs %.8f",
                  nb_item_f64(loss), ref);
    ck_assert_int_eq(nb_backward(loss), NB_OK);
    const nb_params *ps = nb_parameters(m);
    ck_assert_int_eq(ps->count, 2 + 12 * 2 + 2); /* wte, wpe, 12 per block, ln_f */
    for (int i = 0; i < ps->count; i++) {
        char name[256];
        snprintf(name, sizeof name, "grad.%s", ps->names[i]);
        ck_assert_msg(nb_safetensors_find(io, name) >= 0, "fixture lacks %s", name);
        ck_assert_ptr_nonnull(nb_grad(ps->tensors[i]));
        /* the tied wte gets both the embedding's and the head's gradient */
        assert_rel(nb_grad(ps->tensors[i]), nb_safetensors_get(io, name), 1e-4, name);
    }
    nb_safetensors_close(io);
    nb_module_free(m);
    nb_scope_end();
}
END_TEST

START_TEST(test_nanogpt_fixture_nobias) {
    nb_scope_begin();
    nb_module *m = fixture_model("nobias", nobias_cfg());
    ck_assert_ptr_null(nb_module_find(m, "transformer.h.0.attn.c_attn.bias"));
    ck_assert_ptr_null(nb_module_find(m, "transformer.ln_f.bias"));
    nb_safetensors *io = fixture_io("nobias");
    nb_module_train(m, false);
    /* the fixture's idx is a CPU tensor: it goes to the model's (default) device */
    nb_tensor *idx = nb_to_device(nb_safetensors_get(io, "idx"), nb_default_device());
    nb_tensor *logits = nb_forward(m, idx);
    ck_assert_ptr_nonnull(logits);
    assert_rel(logits, nb_safetensors_get(io, "logits"), 1e-4, "logits");
    /* A shorter sequence is the prefix of the longer one's (causality). */
    nb_tensor *short_logits = nb_forward(m, nb_narrow(idx, 1, 0, 5));
    assert_rel(short_logits, nb_narrow(logits, 1, 0, 5), 1e-6, "prefix logits");
    nb_safetensors_close(io);
    nb_module_free(m);
    nb_scope_end();
}
END_TEST

/* Initialization: nanoGPT's names and shapes, N(0, 0.02) and the scaled residual init. */
START_TEST(test_init) {
    nb_scope_begin();
    nb_generator *g = nb_generator_new(7);
    nb_gpt_config c = nb_gpt_config_defaults();
    c.vocab_size = 256, c.block_size = 32, c.n_layer = 2, c.n_head = 2, c.n_embd = 64;
    nb_module *m = nb_gpt_new(&c, g);
    ck_assert_ptr_nonnull(m);
    const nb_gpt_config *rc = nb_gpt_get_config(m);
    ck_assert_int_eq(rc->vocab_size, 256);
    const nb_params *ps = nb_parameters(m);
    ck_assert_str_eq(ps->names[0], "transformer.wte.weight");
    ck_assert_str_eq(ps->names[1], "transformer.wpe.weight");
    ck_assert_str_eq(ps->names[2], "transformer.h.0.ln_1.weight");
    ck_assert_str_eq(ps->names[4], "transformer.h.0.attn.c_attn.weight");
    ck_assert_str_eq(ps->names[ps->count - 1], "transformer.ln_f.bias");
    nb_tensor *ca = nb_module_find(m, "transformer.h.1.attn.c_attn.weight");
    ck_assert_int_eq(nb_size(ca, 0), 192);
    ck_assert_int_eq(nb_size(ca, 1), 64);
    ck_assert_int_eq(nb_size(nb_module_find(m, "transformer.h.1.mlp.c_proj.weight"), 1), 256);
    /* 12 C^2 + 13 C per layer, V C + T C + 2 C outside */
    ck_assert_int_eq(nb_num_parameters(m), 2 * (12 * 64 * 64 + 13 * 64) + 256 * 64 + 32 * 64 + 128);
    double s1 = nb_item_f64(nb_std(nb_module_find(m, "transformer.wte.weight"), NULL, 0, 1, false));
    double s2 = nb_item_f64(nb_std(nb_module_find(m, "transformer.h.0.mlp.c_proj.weight"), NULL,
                                   0, 1, false));
    ck_assert_msg(fabs(s1 - 0.02) < 0.001, "wte std %g", s1);
    ck_assert_msg(fabs(s2 - 0.01) < 0.001, "c_proj std %g (0.02 / sqrt(2 n_layer))", s2);
    ck_assert_double_eq(nb_item_f64(nb_sum(nb_module_find(m, "transformer.h.0.mlp.c_fc.bias"),
                                           NULL, 0, false)), 0.0);
    ck_assert_double_eq(nb_item_f64(nb_mean(nb_module_find(m, "transformer.h.0.ln_2.weight"),
                                            NULL, 0, false)), 1.0);
    /* W3's size and FLOP count as the PyTorch peer reports them */
    nb_module *w3 = nb_gpt_new(NULL, g);
    ck_assert_int_eq(nb_num_parameters(w3), 3257856);
    ck_assert_msg(fabs(nb_gpt_train_flops(NULL, 16, 128) / 1e9 - 42.68) < 0.005, "%g",
                  nb_gpt_train_flops(NULL, 16, 128));
    nb_module_free(w3);
    nb_module_free(m);
    nb_generator_free(g);
    nb_scope_end();
}
END_TEST

static nb_optim *make_adamw(nb_module *m, double lr) {
    nb_params decay, no_decay;
    ck_assert_int_eq(nb_params_split_decay(nb_parameters(m), &decay, &no_decay), NB_OK);
    nb_adamw_opts ao = nb_adamw_defaults();
    ao.lr = lr, ao.weight_decay = 0.1;
    nb_optim *o = nb_adamw_new(&decay, &ao);
    ck_assert_ptr_nonnull(o);
    nb_group_opts go = nb_group_defaults();
    go.weight_decay = 0;
    ck_assert_int_ge(nb_optim_add_group(o, &no_decay, &go), 0);
    nb_params_deinit(&decay);
    nb_params_deinit(&no_decay);
    return o;
}

/* (c) N micro-batches with accumulation give the step of one N-times-larger batch. */
START_TEST(test_grad_accum) {
    nb_scope_begin();
    nb_gpt_config c = *tiny_cfg();
    nb_generator *g1 = nb_generator_new(3), *g2 = nb_generator_new(3);
    nb_module *a = nb_gpt_new(&c, g1), *b = nb_gpt_new(&c, g2);
    nb_optim *oa = make_adamw(a, 1e-3), *ob = make_adamw(b, 1e-3);
    nb_tensor *x = tu_random((int64_t[]){6, 16}, 2, NB_I64, 0, 63.4, 1);
    nb_tensor *y = tu_random((int64_t[]){6, 16}, 2, NB_I64, 0, 63.4, 2);
    nb_tensor *xs[3], *ys[3];
    for (int i = 0; i < 3; i++) xs[i] = nb_narrow(x, 0, 2 * i, 2), ys[i] = nb_narrow(y, 0, 2 * i, 2);
    double na, nb;
    double la = nb_gpt_train_step(a, oa, NULL, xs, ys, 3, 0.5, &na);
    double lb = nb_gpt_train_step(b, ob, NULL, &x, &y, 1, 0.5, &nb);
    ck_assert_msg(fabs(la - lb) < 1e-6, "loss %.9f vs %.9f", la, lb);
    ck_assert_msg(fabs(na - nb) < 1e-6 * nb, "grad norm %.9f vs %.9f", na, nb);
    ck_assert_msg(na > 0.5, "the test should clip (norm %g)", na);
    const nb_params *pa = nb_parameters(a), *pb = nb_parameters(b);
    for (int i = 0; i < pa->count; i++) {
        assert_rel(nb_grad(pa->tensors[i]), nb_grad(pb->tensors[i]), 1e-5, pa->names[i]);
        double d, s;
        max_diff(pa->tensors[i], pb->tensors[i], &d, &s);
        ck_assert_msg(d <= 1e-6, "%s: weights differ by %g after one step", pa->names[i], d);
    }
    nb_optim_free(oa);
    nb_optim_free(ob);
    nb_module_free(a);
    nb_module_free(b);
    nb_generator_free(g1);
    nb_generator_free(g2);
    nb_scope_end();
}
END_TEST

/* (c2) A non-finite gradient is never applied: after a step whose loss and gradients are
 * NaN (a NaN in one weight), every other weight and the optimizer state are as they were. */
START_TEST(test_nonfinite_not_applied) {
    nb_scope_begin();
    nb_gpt_config c = *tiny_cfg();
    nb_generator *g = nb_generator_new(3);
    nb_module *m = nb_gpt_new(&c, g);
    nb_optim *o = make_adamw(m, 1e-3);
    nb_tensor *x = tu_random((int64_t[]){2, 16}, 2, NB_I64, 0, 63.4, 1);
    nb_tensor *y = tu_random((int64_t[]){2, 16}, 2, NB_I64, 0, 63.4, 2);
    double norm;
    ck_assert(isfinite(nb_gpt_train_step(m, o, NULL, &x, &y, 1, 0, &norm))); /* state exists */
    const nb_params *ps = nb_parameters(m);
    int bad = -1; /* a LayerNorm weight: every later activation is NaN */
    for (int i = 0; i < ps->count && bad < 0; i++)
        if (strstr(ps->names[i], "ln_1.weight")) bad = i;
    ck_assert_int_ge(bad, 0);
    bool prev = nb_set_grad_enabled(false);
    ck_assert_int_eq(nb_fill_(ps->tensors[bad], NAN), NB_OK);
    nb_set_grad_enabled(prev);
    nb_tensor *before[64], *state[128];
    ck_assert_int_le(ps->count, 64);
    for (int i = 0; i < ps->count; i++) before[i] = nb_clone(ps->tensors[i]);
    const nb_params *st = nb_optim_state(o);
    ck_assert_int_le(st->count, 128);
    int n_state = st->count;
    for (int i = 0; i < n_state; i++) state[i] = nb_clone(st->tensors[i]);
    nb_optim_state_release(o);
    nb_clear_error();
    double l = nb_gpt_train_step(m, o, NULL, &x, &y, 1, 1.0, &norm);
    ck_assert_msg(isnan(l) && isnan(norm), "loss %g, norm %g", l, norm);
    ck_assert_int_eq(nb_last_status(), NB_OK); /* not an error: the caller decides */
    for (int i = 0; i < ps->count; i++) tu_assert_same_bytes(before[i], ps->tensors[i]);
    st = nb_optim_state(o);
    ck_assert_int_eq(st->count, n_state);
    for (int i = 0; i < n_state; i++) tu_assert_same_bytes(state[i], st->tensors[i]);
    nb_optim_state_release(o);
    nb_optim_free(o);
    nb_module_free(m);
    nb_generator_free(g);
    nb_scope_end();
}
END_TEST

/* (c3) nb_gpt_train_step_ex with a loss scaler: a power-of-two scale gives the bits of the
 * unscaled step; a scale that overflows the loss skips the step (weights unchanged, not an
 * error) and halves the scale. */
START_TEST(test_train_step_scaler) {
    nb_scope_begin();
    nb_gpt_config c = *tiny_cfg();
    nb_generator *g1 = nb_generator_new(3), *g2 = nb_generator_new(3);
    nb_module *a = nb_gpt_new(&c, g1), *b = nb_gpt_new(&c, g2);
    nb_optim *oa = make_adamw(a, 1e-3), *ob = make_adamw(b, 1e-3);
    nb_tensor *x = tu_random((int64_t[]){2, 16}, 2, NB_I64, 0, 63.4, 1);
    nb_tensor *y = tu_random((int64_t[]){2, 16}, 2, NB_I64, 0, 63.4, 2);
    nb_grad_scaler_opts so = nb_grad_scaler_defaults();
    so.init_scale = 1024;
    nb_grad_scaler *gs = nb_grad_scaler_new(&so);
    ck_assert_ptr_nonnull(gs);
    double na, nb;
    nb_gpt_step_opts o = nb_gpt_step_defaults();
    o.grad_clip = 0.5;
    double lb = nb_gpt_train_step_ex(b, ob, &x, &y, 1, &o, &nb);
    o.scaler = gs;
    double la = nb_gpt_train_step_ex(a, oa, &x, &y, 1, &o, &na);
    ck_assert(isfinite(la) && la == lb && na == nb);
    const nb_params *pa = nb_parameters(a), *pb = nb_parameters(b);
    for (int i = 0; i < pa->count; i++) tu_assert_same_bytes(pa->tensors[i], pb->tensors[i]);
    ck_assert_int_eq(nb_grad_scaler_num_steps(gs), 1);
    nb_grad_scaler_free(gs);

    so.init_scale = 1e300; /* the scaled f32 loss is inf: every gradient inf/NaN */
    gs = nb_grad_scaler_new(&so);
    o.scaler = gs;
    nb_tensor *before[64];
    ck_assert_int_le(pa->count, 64);
    for (int i = 0; i < pa->count; i++) before[i] = nb_clone(pa->tensors[i]);
    nb_clear_error();
    la = nb_gpt_train_step_ex(a, oa, &x, &y, 1, &o, &na);
    ck_assert_msg(isfinite(la) && !isfinite(na), "loss %g, norm %g", la, na);
    ck_assert_int_eq(nb_last_status(), NB_OK);
    ck_assert(nb_grad_scaler_skipped(gs));
    ck_assert_int_eq(nb_grad_scaler_num_skipped(gs), 1);
    ck_assert(nb_grad_scaler_get_scale(gs) == 5e299);
    for (int i = 0; i < pa->count; i++) tu_assert_same_bytes(before[i], pa->tensors[i]);
    o.ddp = (nb_ddp *)1, o.zero = (nb_zero *)1; /* never dereferenced: refused first */
    ck_assert(isnan(nb_gpt_train_step_ex(a, oa, &x, &y, 1, &o, &na)));
    ck_assert_int_eq(nb_last_status(), NB_EINVAL);
    nb_clear_error();
    nb_grad_scaler_free(gs);
    nb_optim_free(oa);
    nb_optim_free(ob);
    nb_module_free(a);
    nb_module_free(b);
    nb_generator_free(g1);
    nb_generator_free(g2);
    nb_scope_end();
}
END_TEST

/* (d) A short run on a small repetitive text must learn it. */
START_TEST(test_training_learns) {
    nb_scope_begin();
    const char *s = "In the beginning God created the heaven and the earth. ";
    char text[4096] = "";
    while (strlen(text) + strlen(s) < sizeof text) strcat(text, s);
    /* nb_text_sample cuts its windows from host tokens (documented): the text stays on the CPU */
    nb_tensor *tok = nb_to_device(
        nb_from_buffer(text, (int64_t[]){(int64_t)strlen(text)}, 1, NB_U8), NB_CPU);
    nb_generator *init = nb_generator_new(11), *bg = nb_generator_new(12), *dg = nb_generator_new(13);
    nb_gpt_config c = nb_gpt_config_defaults();
    c.vocab_size = 256, c.block_size = 32, c.n_layer = 2, c.n_head = 2, c.n_embd = 32;
    c.dropout = 0.05, c.dropout_gen = dg;
    nb_module *m = nb_gpt_new(&c, init);
    nb_optim *o = make_adamw(m, 3e-3);
    /* x and y on the default device: nb_text_sample fills them through the host */
    nb_tensor *x = nb_empty((int64_t[]){8, 32}, 2, NB_I64), *y = nb_empty((int64_t[]){8, 32}, 2, NB_I64);
    double first = NAN, last = 0;
    for (int step = 0; step < 120; step++) {
        ck_assert_int_eq(nb_text_sample(tok, bg, x, y), NB_OK);
        double l = nb_gpt_train_step(m, o, NULL, &x, &y, 1, 1.0, NULL);
        ck_assert_msg(!isnan(l), "%s", nb_last_error());
        if (step == 0) first = l;
        if (step >= 115) last += l / 5;
    }
    ck_assert_msg(fabs(first - log(256.0)) < 0.1, "initial loss %g should be near ln 256", first);
    /* The text repeats with period 55: a model that learns it predicts most bytes from the
     * few before them. This one reaches ~0.53 (mean of steps 116-120); the unigram entropy
     * of the text is 2.5, so < 1.0 needs attention across positions to work. */
    ck_assert_msg(last < 1.0, "loss after 120 steps %g (from %g)", last, first);
    nb_optim_free(o);
    nb_module_free(m);
    nb_generator_free(init);
    nb_generator_free(bg);
    nb_generator_free(dg);
    nb_scope_end();
}
END_TEST

/* (e) save/load round trips (model file, checkpoint) and deterministic sampling. */
START_TEST(test_save_load_sample) {
    nb_scope_begin();
    char dir[] = "/tmp/nb_gpt_XXXXXX", path[600], ck[600];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(ck, sizeof ck, "%s/run.ckpt", dir);
    nb_generator *g1 = nb_generator_new(1), *g2 = nb_generator_new(2);
    nb_gpt_config c = nb_gpt_config_defaults();
    c.vocab_size = 256, c.block_size = 12, c.n_layer = 2, c.n_head = 4, c.n_embd = 16;
    nb_module *a = nb_gpt_new(&c, g1), *b = nb_gpt_new(&c, g2), *d = nb_gpt_new(&c, g2);
    ck_assert_int_eq(nb_module_save(a, path), NB_OK);
    ck_assert_int_eq(nb_checkpoint_save(ck, &(nb_checkpoint){.model = a, .step = 5}), NB_OK);
    nb_gpt_config fc = nb_gpt_config_defaults();
    fc.n_head = 4;
    ck_assert_int_eq(nb_gpt_config_from_file(ck, &fc), NB_OK);
    ck_assert_int_eq(fc.vocab_size, 256);
    ck_assert_int_eq(fc.block_size, 12);
    ck_assert_int_eq(fc.n_layer, 2);
    ck_assert_int_eq(fc.n_embd, 16);
    ck_assert(!fc.no_bias);
    ck_assert_int_eq(nb_gpt_load(b, path), NB_OK);
    ck_assert_int_eq(nb_gpt_load(d, ck), NB_OK);
    nb_tensor *idx = tu_random((int64_t[]){2, 12}, 2, NB_I64, 0, 255.4, 5);
    nb_tensor *la = nb_forward(a, idx), *lb = nb_forward(b, idx), *ld = nb_forward(d, idx);
    assert_rel(lb, la, 0, "logits after nb_module_save + nb_gpt_load");
    assert_rel(ld, la, 0, "logits after a checkpoint + nb_gpt_load");

    const int64_t prompt[3] = {'a', 'b', 'c'};
    int64_t o1[20], o2[20], o3[20], o4[20];
    ck_assert_int_eq(nb_gpt_generate(a, prompt, 3, 20, NULL, o1), NB_OK); /* greedy */
    nb_gpt_sample_opts sp4 = nb_gpt_sample_defaults();
    ck_assert_int_eq(nb_gpt_generate(b, prompt, 3, 20, &sp4, o2), NB_OK);
    ck_assert_mem_eq(o1, o2, sizeof o1);
    nb_gpt_sample_opts sp = nb_gpt_sample_defaults();
    sp.temperature = 2, sp.top_k = 1;
    /* top_k 1 at any temperature is greedy too */
    ck_assert_int_eq(nb_gpt_generate(a, prompt, 3, 20, &sp, o3), NB_OK);
    ck_assert_mem_eq(o1, o3, sizeof o1);
    /* sampling repeats with the same generator state, and stays in the vocabulary */
    nb_generator *s1 = nb_generator_new(9), *s2 = nb_generator_new(9);
    nb_gpt_sample_opts sp2 = nb_gpt_sample_defaults();
    sp2.temperature = 1, sp2.gen = s1;
    ck_assert_int_eq(nb_gpt_generate(a, prompt, 3, 20, &sp2, o3), NB_OK);
    nb_gpt_sample_opts sp3 = nb_gpt_sample_defaults();
    sp3.temperature = 1, sp3.gen = s2;
    ck_assert_int_eq(nb_gpt_generate(b, prompt, 3, 20, &sp3, o4), NB_OK);
    ck_assert_mem_eq(o3, o4, sizeof o3);
    bool differs = false;
    for (int i = 0; i < 20; i++) {
        ck_assert(o3[i] >= 0 && o3[i] < 256);
        differs |= o3[i] != o1[i];
    }
    ck_assert_msg(differs, "an untrained model sampled at temperature 1 should not be greedy");
    ck_assert(nb_module_is_training(a)); /* restored after generation */

    /* a model of another shape is refused, with a message naming the tensor */
    nb_gpt_config c3 = c;
    c3.n_layer = 3;
    nb_module *e = nb_gpt_new(&c3, g2);
    ck_assert_int_eq(nb_gpt_load(e, path), NB_EINVAL);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "transformer.h.2"));
    c3.n_layer = 1;
    nb_module *f = nb_gpt_new(&c3, g2);
    ck_assert_int_eq(nb_gpt_load(f, path), NB_EINVAL);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "transformer.h.1"));
    nb_module_free(e);
    nb_module_free(f);
    unlink(path);
    unlink(ck);
    rmdir(dir);
    nb_module_free(a);
    nb_module_free(b);
    nb_module_free(d);
    nb_generator_free(g1);
    nb_generator_free(g2);
    nb_generator_free(s1);
    nb_generator_free(s2);
    nb_scope_end();
}
END_TEST

/* Contexts longer than block_size are cropped to the last block_size tokens. */
START_TEST(test_generate_long) {
    nb_scope_begin();
    nb_gpt_config c = nb_gpt_config_defaults();
    c.vocab_size = 16, c.block_size = 4, c.n_layer = 1, c.n_head = 1, c.n_embd = 8;
    nb_module *m = nb_gpt_new(&c, NULL);
    int64_t prompt[6] = {1, 2, 3, 4, 5, 6}, out[10], ref;
    ck_assert_int_eq(nb_gpt_generate(m, prompt, 6, 10, NULL, out), NB_OK);
    /* the first new token is the argmax after the last 4 prompt tokens */
    nb_tensor *logits = nb_forward(m, nb_from_buffer(prompt + 2, (int64_t[]){1, 4}, 2, NB_I64));
    ref = nb_item_i64(nb_argmax(nb_select(nb_select(logits, 0, 0), 0, 3), 0, false));
    ck_assert_int_eq(out[0], ref);
    nb_module_free(m);
    nb_scope_end();
}
END_TEST

/* Dropout acts in training mode only, and is reproducible from its generator. */
START_TEST(test_dropout) {
    nb_scope_begin();
    nb_generator *dg = nb_generator_new(5);
    nb_gpt_config c = nb_gpt_config_defaults();
    c.vocab_size = 32, c.block_size = 8, c.n_layer = 1, c.n_head = 2, c.n_embd = 8, c.dropout = 0.3;
    c.dropout_gen = dg;
    nb_module *m = nb_gpt_new(&c, NULL);
    nb_tensor *idx = tu_random((int64_t[]){2, 8}, 2, NB_I64, 0, 31.4, 3);
    nb_tensor *t1 = nb_forward(m, idx);
    nb_generator_set_offset(dg, 0);
    nb_tensor *t2 = nb_forward(m, idx);
    assert_rel(t2, t1, 0, "same dropout stream");
    nb_tensor *t3 = nb_forward(m, idx); /* the stream moved on */
    double d, s;
    max_diff(t3, t1, &d, &s);
    ck_assert_msg(d > 1e-3, "dropout masks should differ between calls");
    nb_module_train(m, false);
    nb_tensor *e1 = nb_forward(m, idx), *e2 = nb_forward(m, idx);
    assert_rel(e2, e1, 0, "eval mode is deterministic");
    max_diff(e1, t1, &d, &s);
    ck_assert_msg(d > 1e-3, "eval mode should not drop");
    nb_module_free(m);
    nb_generator_free(dg);
    nb_scope_end();
}
END_TEST

START_TEST(test_errors) {
    nb_scope_begin();
    nb_gpt_config cfg = nb_gpt_config_defaults();
    cfg.n_embd = 10, cfg.n_head = 3;
    tu_assert_error(nb_gpt_new(&cfg, NULL), NB_EINVAL, "divide");
    nb_gpt_config cfg2 = nb_gpt_config_defaults();
    cfg2.dropout = 1.0;
    tu_assert_error(nb_gpt_new(&cfg2, NULL), NB_EINVAL, "dropout");
    nb_gpt_config cfg3 = nb_gpt_config_defaults();
    cfg3.n_layer = -1;
    tu_assert_error(nb_gpt_new(&cfg3, NULL), NB_EINVAL, "positive");
    nb_gpt_config c = nb_gpt_config_defaults();
    c.vocab_size = 16, c.block_size = 4, c.n_layer = 1, c.n_head = 1, c.n_embd = 8;
    nb_module *m = nb_gpt_new(&c, NULL);
    tu_assert_error(nb_forward(m, nb_zeros((int64_t[]){1, 5}, 2, NB_I64)), NB_ESHAPE, "block_size");
    tu_assert_error(nb_forward(m, nb_zeros((int64_t[]){1, 4}, 2, NB_F32)), NB_EINVAL, "dtype");
    tu_assert_error(nb_forward(m, nb_zeros((int64_t[]){4}, 1, NB_I64)), NB_EINVAL, "(B, T)");
    /* a token past the vocabulary (on CUDA reported by the read of the logits) */
    tu_assert_index_error(nb_forward(m, nb_full((int64_t[]){1, 4}, 2, NB_I64, 16)), NB_EINDEX,
                          "index 16 is out of range");
    tu_assert_error(nb_forward(m, NULL), NB_ENULL, "");
    tu_assert_error(nb_gpt_loss(m, nb_zeros((int64_t[]){1, 4}, 2, NB_I64),
                             nb_zeros((int64_t[]){1, 3}, 2, NB_I64)), NB_ESHAPE, "targets");
    nb_module *lin = nb_linear_new(2, 2, NULL);
    tu_assert_error(nb_gpt_loss(lin, NULL, NULL), NB_EINVAL, "not a GPT");
    ck_assert_ptr_null(nb_gpt_get_config(lin));
    int64_t p[2] = {3, 16}, out[2];
    ck_assert_int_eq(nb_gpt_generate(m, p, 2, 2, NULL, out), NB_EINDEX);
    ck_assert_int_eq(nb_gpt_generate(m, p, 0, 2, NULL, out), NB_EINVAL);
    nb_gpt_sample_opts sp = nb_gpt_sample_defaults();
    sp.temperature = -1;
    ck_assert_int_eq(nb_gpt_generate(m, p, 1, 2, &sp, out), NB_EINVAL);
    ck_assert_int_eq(nb_gpt_load(m, "/nonexistent/model.safetensors"), NB_EIO);
    ck_assert(isnan(nb_gpt_train_step(m, NULL, NULL, NULL, NULL, 1, 0, NULL)));
    nb_module_free(lin);
    nb_module_free(m);
    nb_scope_end();
}
END_TEST

/* The whole GPT on the meta device: the model builds without memory, forward, backward and
 * an AdamW step run their checks and shape inference only (proving every op on the path
 * is device-free), and the parameter count matches the real model. */
static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void meta_train_step(nb_module *m, int64_t B, int64_t T, int64_t V) {
    nb_scope_begin();
    nb_tensor *x = nb_zeros_on(NB_META, (int64_t[]){B, T}, 2, NB_I64);
    nb_tensor *y = nb_zeros_on(NB_META, (int64_t[]){B, T}, 2, NB_I64);
    nb_tensor *logits = nb_forward(m, x);
    ck_assert_msg(logits != NULL, "%s", nb_last_error());
    ck_assert(nb_device_equal(nb_tensor_device(logits), NB_META));
    ck_assert_int_eq(nb_ndim(logits), 3);
    ck_assert_int_eq(nb_shape(logits)[2], V);
    nb_tensor *loss = nb_gpt_loss(m, x, y);
    ck_assert_msg(loss != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_ndim(loss), 0);
    ck_assert_msg(nb_backward(loss) == NB_OK, "%s", nb_last_error());
    const nb_params *ps = nb_parameters(m);
    for (int i = 0; i < ps->count; i++) {
        nb_tensor *g = nb_grad(ps->tensors[i]);
        ck_assert_msg(g != NULL, "no gradient for %s", ps->names[i]);
        ck_assert(nb_device_equal(nb_tensor_device(g), NB_META));
        ck_assert_int_eq(nb_numel(g), nb_numel(ps->tensors[i]));
    }
    nb_scope_end();
}

START_TEST(test_meta_model) {
    nb_scope_begin();
    nb_module *cpu = nb_gpt_new(NULL, NULL);
    nb_device prev = nb_set_default_device(NB_META);
    nb_module *m = nb_gpt_new(NULL, NULL);
    nb_set_default_device(prev);
    ck_assert_ptr_nonnull(m);
    ck_assert_int_eq(nb_num_parameters(m), nb_num_parameters(cpu));
    ck_assert_int_eq(nb_num_parameters(m), 3257856);
    const nb_params *ps = nb_parameters(m);
    for (int i = 0; i < ps->count; i++)
        ck_assert(nb_device_equal(nb_tensor_device(ps->tensors[i]), NB_META));
    /* forward + backward, then an AdamW step and gradient clipping, all on meta */
    meta_train_step(m, 16, 128, 256);
    nb_optim *opt = make_adamw(m, 1e-3);
    double norm = nb_clip_grad_norm(nb_optim_params(opt), 1.0, 2.0);
    ck_assert(isnan(norm)); /* no data: documented as NaN, nothing scaled */
    ck_assert_msg(nb_step(opt) == NB_OK, "%s", nb_last_error());
    nb_optim_free(opt);
    /* moving the real model to meta keeps its shapes */
    ck_assert_int_eq(nb_module_to(cpu, NB_META), NB_OK);
    ck_assert_int_eq(nb_num_parameters(cpu), 3257856);
    meta_train_step(cpu, 2, 64, 256);
    nb_module_free(cpu);
    nb_module_free(m);
    nb_scope_end();
}
END_TEST

/* GPT-2 XL (1.5B parameters) on meta: built in well under a second, nothing allocated,
 * and a full forward and backward of one 1024-token sequence run shape inference only. */
START_TEST(test_meta_1p5b) {
    nb_scope_begin();
    nb_gpt_config c = nb_gpt_config_defaults();
    c.vocab_size = 50257, c.block_size = 1024, c.n_layer = 48, c.n_head = 25, c.n_embd = 1600;
    nb_alloc_stats before, after;
    nb_alloc_get_stats(&before);
    double t0 = seconds_now();
    nb_device prev = nb_set_default_device(NB_META);
    nb_module *m = nb_gpt_new(&c, NULL);
    nb_set_default_device(prev);
    double built = seconds_now() - t0;
    ck_assert_msg(m != NULL, "%s", nb_last_error());
    int64_t C = 1600, L = 48, V = 50257, T = 1024;
    int64_t expect = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C; /* 1,557,611,200 */
    ck_assert_int_eq(nb_num_parameters(m), expect);
    ck_assert_int_gt(nb_num_parameters(m), 1500000000);
    nb_alloc_get_stats(&after);
    /* host memory: module and tensor headers only (a few hundred KB), never the weights */
    ck_assert_int_lt(after.bytes_peak - before.bytes_peak, 16 << 20);
    fprintf(stderr, "gpt meta: %lld parameters built in %.3f s, %lld bytes of host memory\n",
            (long long)nb_num_parameters(m), built,
            (long long)(after.bytes_peak - before.bytes_peak));
    ck_assert_msg(built < 1.0, "building the 1.5B model on meta took %.3f s", built);
    meta_train_step(m, 1, T, V);
    nb_module_free(m);
    nb_scope_end();
}
END_TEST

Suite *nb_suite_gpt(void) {
    Suite *s = suite_create("gpt");
    TCase *tc = tcase_create("gpt");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_nanogpt_fixture);
    tcase_add_test(tc, test_nanogpt_fixture_nobias);
    tcase_add_test(tc, test_init);
    tcase_add_test(tc, test_grad_accum);
    tcase_add_test(tc, test_nonfinite_not_applied);
    tcase_add_test(tc, test_train_step_scaler);
    tcase_add_test(tc, test_training_learns);
    tcase_add_test(tc, test_save_load_sample);
    tcase_add_test(tc, test_generate_long);
    tcase_add_test(tc, test_dropout);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_meta_model);
    tcase_add_test(tc, test_meta_1p5b);
    suite_add_tcase(s, tc);
    return s;
}
