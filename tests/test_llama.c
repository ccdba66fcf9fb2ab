/* test_llama.c - the "llama" suite: the Llama of nabla/llama.h. Its module tree holds exactly
 * Hugging Face's parameter names and shapes; forward and backward give every shape and
 * gradient; the whole step runs on the meta device; save and load round-trip bit for bit; the
 * key/value cache gives the logits of the whole sequence and generation with it the same tokens
 * as without; activation checkpointing changes nothing; bad configurations and another
 * architecture's files are refused clearly. Against transformers' LlamaForCausalLM, both ways,
 * on the committed fixtures of tools/make_llama_fixture.py: a model saved by transformers
 * loads and gives its logits, and the model nabla builds from seed 1234 gives the logits
 * transformers computed from nabla's saved file (loaded there with strict loading). With
 * NB_LLAMA_EXPORT=dir the "hf" case writes that file for the script. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define FIXTURES NB_SOURCE_DIR "/tests/fixtures/"

/* The fixtures' config (tools/make_llama_fixture.py). */
static const nb_llama_config *tiny(void) {
    static nb_llama_config c;
    c = nb_llama_config_defaults();
    c.vocab_size = 64, c.block_size = 32, c.n_layer = 2, c.n_head = 4, c.n_kv_head = 2;
    c.n_embd = 32, c.n_inner = 48, c.rope_theta = 500, c.norm_eps = 1e-5;
    return &c;
}

static nb_module *make(const nb_llama_config *c, uint64_t seed) {
    nb_generator *g = nb_generator_new(seed);
    nb_module *m = nb_llama_new(c, g);
    nb_generator_free(g);
    ck_assert_msg(m, "%s", nb_last_error());
    return m;
}

static nb_tensor *tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
    nb_generator *g = nb_generator_new(seed);
    nb_tensor *t = nb_randint((int64_t[]){B, T}, 2, NB_I64, 0, V, g);
    nb_generator_free(g);
    return t;
}

/* max |a - r| <= rel * max |r| */
static void assert_rel(const nb_tensor *a, const nb_tensor *r, double rel, const char *what) {
    ck_assert_msg(a && r, "%s: missing (%s)", what, nb_last_error());
    ck_assert_int_eq(nb_numel(a), nb_numel(r));
    double *x = tu_values(a), *y = tu_values(r), d = 0, s = 0;
    for (int64_t i = 0; i < nb_numel(a); i++) {
        if (!(fabs(x[i] - y[i]) <= d)) d = fabs(x[i] - y[i]);
        if (fabs(y[i]) > s) s = fabs(y[i]);
    }
    free(x);
    free(y);
    ck_assert_msg(d <= rel * s, "%s: max |diff| %g exceeds %g x max |ref| %g", what, d, rel, s);
}

/* ---- the module tree ------------------------------------------------------------------------- */
START_TEST(test_names_shapes) {
    nb_module *m = make(tiny(), 1);
    const nb_params *ps = nb_parameters(m);
    /* Hugging Face's state dict of this config, in its order */
    static const char *const per_layer[] = {
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
        "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
        "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"};
    static const int64_t shapes[][2] = {{32, 32}, {16, 32}, {16, 32}, {32, 32}, {48, 32},
                                        {48, 32}, {32, 48}, {32, 0},  {32, 0}};
    ck_assert_int_eq(ps->count, 1 + 2 * 9 + 2);
    ck_assert_str_eq(ps->names[0], "model.embed_tokens.weight");
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < 9; i++) {
            char want[128];
            snprintf(want, sizeof want, "model.layers.%d.%s", l, per_layer[i]);
            const int at = 1 + 9 * l + i;
            ck_assert_str_eq(ps->names[at], want);
            ck_assert_int_eq(nb_ndim(ps->tensors[at]), shapes[i][1] ? 2 : 1);
            ck_assert_int_eq(nb_size(ps->tensors[at], 0), shapes[i][0]);
            if (shapes[i][1]) ck_assert_int_eq(nb_size(ps->tensors[at], 1), shapes[i][1]);
        }
    ck_assert_str_eq(ps->names[19], "model.norm.weight");
    ck_assert_str_eq(ps->names[20], "lm_head.weight");
    ck_assert(nb_module_find(m, "lm_head.weight") != nb_module_find(m, "model.embed_tokens.weight"));
    /* the defaults: W3's size, grouped-query, the MLP width rounded to 64 */
    nb_module *d = make(NULL, 2);
    const nb_llama_config *c = nb_llama_get_config(d);
    ck_assert(c->n_embd == 256 && c->n_head == 4 && c->n_kv_head == 2 && c->n_inner == 704 &&
              c->n_layer == 4 && c->block_size == 128 && c->vocab_size == 256);
    ck_assert(c->rope_theta == 10000 && c->norm_eps == 1e-5);
    ck_assert(nb_llama_is_llama(d) && !nb_gpt_is_gpt(d) && !nb_llama_get_config(NULL));
    int64_t count = 0; /* docs/llama.md: 3,082,496 against the W3 GPT's 3,257,856 */
    for (int i = 0; i < nb_parameters(d)->count; i++) count += nb_numel(nb_parameters(d)->tensors[i]);
    ck_assert_int_eq(count, 3082496);
    nb_module_free(d);
    nb_module_free(m);
}
END_TEST

START_TEST(test_forward_backward) {
    nb_module *m = make(tiny(), 3);
    nb_scope_begin();
    nb_tensor *x = tokens(3, 20, 64, 4), *y = tokens(3, 20, 64, 5);
    nb_tensor *logits = nb_forward(m, x);
    ck_assert_msg(logits, "%s", nb_last_error());
    ck_assert(nb_ndim(logits) == 3 && nb_size(logits, 0) == 3 && nb_size(logits, 1) == 20 &&
              nb_size(logits, 2) == 64 && nb_tensor_dtype(logits) == NB_F32);
    nb_tensor *loss = nb_llama_loss(m, x, y);
    ck_assert_msg(loss && nb_ndim(loss) == 0, "%s", nb_last_error());
    ck_assert(nb_backward(loss) == NB_OK);
    const nb_params *ps = nb_parameters(m);
    for (int i = 0; i < ps->count; i++) {
        nb_tensor *g = nb_grad(ps->tensors[i]);
        ck_assert_msg(g, "no gradient for %s", ps->names[i]);
        ck_assert_int_eq(nb_numel(g), nb_numel(ps->tensors[i]));
        double n = nb_item_f64(nb_sum(nb_abs(g), NULL, 0, false));
        ck_assert_msg(n > 0 && isfinite(n), "%s: gradient |g| sum %g", ps->names[i], n);
    }
    /* about log(64) for a random model */
    ck_assert(fabs(nb_item_f64(loss) - log(64.0)) < 1.0);
    /* the train step: a few AdamW steps learn a fixed batch */
    nb_optim *opt = nb_adamw_new(nb_parameters(m), NULL);
    double first = NAN, last = NAN;
    for (int s = 0; s < 8; s++) {
        last = nb_llama_train_step(m, opt, &x, &y, 1, NULL, NULL);
        if (s == 0) first = last;
    }
    ck_assert_msg(last < first - 0.2, "loss %g -> %g", first, last);
    nb_optim_free(opt);
    nb_scope_end();
    nb_module_free(m);
}
END_TEST

/* The whole training step on the meta device: every op on the path is device-free. */
START_TEST(test_meta) {
    nb_device prev = nb_set_default_device(NB_META);
    nb_module *m = nb_llama_new(tiny(), NULL);
    nb_set_default_device(prev);
    ck_assert_msg(m, "%s", nb_last_error());
    nb_scope_begin();
    nb_tensor *x = nb_zeros_on(NB_META, (int64_t[]){2, 8}, 2, NB_I64);
    nb_tensor *loss = nb_llama_loss(m, x, x);
    ck_assert_msg(loss, "%s", nb_last_error());
    ck_assert(nb_backward(loss) == NB_OK);
    nb_tensor *g = nb_grad(nb_module_find(m, "model.layers.1.self_attn.k_proj.weight"));
    ck_assert(g && nb_tensor_device(g).type == NB_DEVICE_META);
    nb_scope_end();
    nb_module_free(m);
}
END_TEST

/* ---- files ----------------------------------------------------------------------------------- */
START_TEST(test_save_load) {
    nb_module *a = make(tiny(), 6), *b = make(tiny(), 7);
    char *dir = tu_make_dir(), *path = tu_path_in(dir, "llama.safetensors");
    ck_assert(nb_module_save(a, path) == NB_OK);
    ASSERT_OK(nb_llama_load(b, path));
    nb_llama_config c = nb_llama_config_defaults();
    c.n_head = 4;
    ASSERT_OK(nb_llama_config_from_file(path, &c));
    ck_assert(c.vocab_size == 64 && c.n_embd == 32 && c.n_layer == 2 && c.n_inner == 48 &&
              c.n_kv_head == 2);
    nb_scope_begin();
    nb_tensor *x = tokens(2, 9, 64, 8);
    nb_tensor *la = nb_forward(a, x), *lb = nb_forward(b, x);
    assert_rel(lb, la, 0, "logits after a round trip");
    nb_scope_end();
    /* a model of another shape: a clear error */
    nb_llama_config three = *tiny();
    three.n_layer = 3;
    nb_module *t = make(&three, 1);
    ASSERT_ST(nb_llama_load(t, path), NB_EINVAL, "has no tensor \"model.layers.2.");
    nb_module_free(t);
    free(path);
    tu_rm_dir(dir);
    nb_module_free(a);
    nb_module_free(b);
}
END_TEST

START_TEST(test_other_architecture) {
    nb_module *m = make(tiny(), 1);
    /* nanoGPT's names (Hugging Face's GPT-2 names) */
    ASSERT_ST(nb_llama_load(m, FIXTURES "gpt/tiny.safetensors"), NB_EFORMAT,
              "holds no Llama (no model.embed_tokens.weight; it holds a GPT");
    nb_llama_config c = nb_llama_config_defaults();
    ASSERT_ST(nb_llama_config_from_file(FIXTURES "gpt/tiny.safetensors", &c), NB_EFORMAT,
              "holds no Llama");
    ASSERT_ST(nb_llama_load(m, FIXTURES "llama/ops.safetensors"), NB_EFORMAT,
              "its first tensor is");
    ASSERT_ST(nb_llama_load(NULL, FIXTURES "llama/hf_tiny.safetensors"), NB_EINVAL, "not a Llama");
    nb_gpt_config gc = nb_gpt_config_defaults();
    gc.vocab_size = 64, gc.block_size = 16, gc.n_layer = 2, gc.n_head = 2, gc.n_embd = 16;
    nb_module *gpt = nb_gpt_new(&gc, NULL);
    ASSERT_ST(nb_gpt_load(gpt, FIXTURES "llama/hf_tiny.safetensors"), NB_EINVAL, "no tensor");
    nb_module_free(gpt);
    nb_module_free(m);
}
END_TEST

START_TEST(test_bad_config) {
    nb_llama_config c = *tiny();
    c.n_kv_head = 3;
    tu_assert_error(nb_llama_new(&c, NULL), NB_EINVAL, "n_kv_head (3) must divide n_head (4)");
    c = *tiny();
    c.n_head = 32; /* head size 1 */
    c.n_kv_head = 32;
    tu_assert_error(nb_llama_new(&c, NULL), NB_EINVAL, "head size n_embd / n_head = 1 is odd");
    c = *tiny();
    c.n_head = 5;
    tu_assert_error(nb_llama_new(&c, NULL), NB_EINVAL, "must divide n_embd");
    c = *tiny();
    c.rope_theta = -1;
    tu_assert_error(nb_llama_new(&c, NULL), NB_EINVAL, "rope_theta");
    c = *tiny();
    c.n_layer = -2;
    tu_assert_error(nb_llama_new(&c, NULL), NB_EINVAL, "must be positive");
    nb_module *m = make(tiny(), 1);
    nb_scope_begin();
    tu_assert_error(nb_forward(m, tokens(1, 33, 64, 1)), NB_ESHAPE, "outside 1..block_size (32)");
    tu_assert_error(nb_llama_loss(m, tokens(1, 4, 64, 1), tokens(1, 5, 64, 1)), NB_ESHAPE,
                    "targets");
    tu_assert_error(nb_llama_cache_new(m, 1, 33), NB_EINVAL, "max_len");
    int64_t out[4], bad[1] = {64};
    ASSERT_ST(nb_llama_generate(m, bad, 1, 4, NULL, true, out), NB_EINDEX, "outside the vocabulary");
    nb_scope_end();
    nb_module_free(m);
}
END_TEST

/* ---- the key/value cache and generation -------------------------------------------------------- */
START_TEST(test_cache_logits) {
    nb_llama_config c = *tiny();
    for (int kv = 1; kv <= 4; kv *= 2) {
        c.n_kv_head = kv;
        nb_module *m = make(&c, 10 + (uint64_t)kv);
        nb_module_train(m, false);
        bool prev = nb_set_grad_enabled(false);
        nb_scope_begin();
        nb_tensor *x = tokens(2, 20, 64, 11);
        nb_tensor *whole = nb_forward(m, x);
        nb_llama_cache *cache = nb_llama_cache_new(m, 2, 32);
        ck_assert_msg(cache, "%s", nb_last_error());
        /* the prompt (7 tokens), then 1, then 4 at once, then one by one */
        int64_t at = 0;
        const int64_t steps[] = {7, 1, 4, 1, 1, 1, 1, 1, 1, 1, 1};
        for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
            nb_tensor *part = nb_llama_forward_cached(m, nb_narrow(x, 1, at, steps[i]), cache);
            ck_assert_msg(part, "%s", nb_last_error());
            assert_rel(part, nb_narrow(whole, 1, at, steps[i]), 1e-5, "cached logits");
            at += steps[i];
            ck_assert_int_eq(nb_llama_cache_len(cache), at);
        }
        tu_assert_error(nb_llama_forward_cached(m, nb_narrow(x, 1, 0, 13), cache), NB_EINVAL,
                        "exceed the cache");
        nb_llama_cache_reset(cache);
        assert_rel(nb_llama_forward_cached(m, x, cache), whole, 0, "after a reset");
        nb_llama_cache_free(cache);
        nb_scope_end();
        nb_set_grad_enabled(prev);
        nb_module_free(m);
    }
}
END_TEST

START_TEST(test_generate) {
    nb_module *m = make(tiny(), 20);
    const int64_t prompt[5] = {3, 14, 15, 9, 26};
    int64_t a[40], b[40];
    /* greedy, and sampled with the same draws; past block_size (32) too */
    for (int mode = 0; mode < 3; mode++) {
        nb_generator *g1 = nb_generator_new(5), *g2 = nb_generator_new(5);
        nb_gpt_sample_opts o1 = nb_gpt_sample_defaults();
        o1.temperature = mode ? 0.9 : 0, o1.top_k = mode == 2 ? 5 : 0, o1.gen = g1;
        nb_gpt_sample_opts o2 = o1;
        o2.gen = g2;
        ASSERT_OK(nb_llama_generate(m, prompt, 5, 40, &o1, true, a));
        ASSERT_OK(nb_llama_generate(m, prompt, 5, 40, &o2, false, b));
        for (int i = 0; i < 40; i++)
            ck_assert_msg(a[i] == b[i], "mode %d token %d: with the cache %lld, without %lld", mode,
                          i, (long long)a[i], (long long)b[i]);
        nb_generator_free(g1), nb_generator_free(g2);
    }
    /* greedy is the argmax of the forward */
    ASSERT_OK(nb_llama_generate(m, prompt, 5, 1, NULL, true, a));
    nb_scope_begin();
    nb_tensor *l = nb_forward(m, nb_from_buffer(prompt, (int64_t[]){1, 5}, 2, NB_I64));
    ck_assert_int_eq(nb_item_i64(nb_argmax(nb_select(nb_select(l, 0, 0), 0, 4), 0, false)), a[0]);
    nb_scope_end();
    ck_assert(nb_module_is_training(m));
    nb_module_free(m);
}
END_TEST

/* ---- activation checkpointing ------------------------------------------------------------------ */
START_TEST(test_recompute) {
    double norm[3];
    nb_tensor *grads[3];
    for (int r = 0; r < 3; r++) {
        nb_llama_config c = *tiny();
        c.recompute = (nb_gpt_recompute)r;
        nb_module *m = make(&c, 30);
        nb_scope_begin();
        nb_tensor *x = tokens(2, 12, 64, 31);
        ck_assert(nb_backward(nb_llama_loss(m, x, tokens(2, 12, 64, 32))) == NB_OK);
        nb_tensor *gq = nb_grad(nb_module_find(m, "model.layers.0.self_attn.q_proj.weight"));
        norm[r] = nb_item_f64(nb_sum(gq, NULL, 0, false));
        grads[r] = nb_keep(nb_clone(nb_grad(nb_module_find(m, "model.embed_tokens.weight"))));
        nb_scope_end();
        nb_module_free(m);
    }
    for (int r = 1; r < 3; r++) {
        ck_assert_msg(norm[r] == norm[0], "recompute %d: %.17g vs %.17g", r, norm[r], norm[0]);
        assert_rel(grads[r], grads[0], 0, "embedding gradient");
    }
    for (int r = 0; r < 3; r++) nb_tensor_free(grads[r]);
}
END_TEST

/* ---- mixed precision ---------------------------------------------------------------------------- */
START_TEST(test_autocast) {
    nb_module *m = make(tiny(), 40);
    nb_scope_begin();
    nb_tensor *x = tokens(2, 16, 64, 41), *y = tokens(2, 16, 64, 42);
    const double l32 = nb_item_f64(nb_llama_loss(m, x, y));
    ASSERT_OK(nb_autocast_begin(NB_BF16));
    nb_tensor *loss = nb_llama_loss(m, x, y);
    ASSERT_OK(nb_autocast_end());
    ck_assert_msg(loss, "%s", nb_last_error());
    ck_assert_int_eq(nb_tensor_dtype(loss), NB_F32);
    ck_assert_msg(fabs(nb_item_f64(loss) - l32) < 0.02 * l32, "bf16 loss %g, f32 %g",
                  nb_item_f64(loss), l32);
    ck_assert(nb_backward(loss) == NB_OK);
    const nb_params *ps = nb_parameters(m);
    for (int i = 0; i < ps->count; i++) { /* f32 gradients of the f32 parameters */
        nb_tensor *g = nb_grad(ps->tensors[i]);
        ck_assert_msg(g && nb_tensor_dtype(g) == NB_F32, "%s", ps->names[i]);
        ck_assert(isfinite(nb_item_f64(nb_sum(g, NULL, 0, false))));
    }
    nb_scope_end();
    nb_module_free(m);
}
END_TEST

/* ---- against transformers ---------------------------------------------------------------------- */
START_TEST(test_hf_to_nabla) {
    nb_llama_config c = nb_llama_config_defaults();
    c.block_size = 32, c.n_head = 4, c.rope_theta = 500, c.norm_eps = 1e-5;
    ASSERT_OK(nb_llama_config_from_file(FIXTURES "llama/hf_tiny.safetensors", &c));
    ck_assert(c.vocab_size == 64 && c.n_embd == 32 && c.n_layer == 2 && c.n_inner == 48 &&
              c.n_kv_head == 2);
    nb_module *m = nb_llama_new(&c, NULL);
    ck_assert_msg(m, "%s", nb_last_error());
    ASSERT_OK(nb_llama_load(m, FIXTURES "llama/hf_tiny.safetensors"));
    nb_safetensors *io = nb_safetensors_open(FIXTURES "llama/hf_tiny_io.safetensors");
    ck_assert_msg(io, "%s", nb_last_error());
    nb_scope_begin();
    nb_tensor *idx = nb_to_device(nb_safetensors_get(io, "idx"), nb_default_device());
    nb_tensor *ref = nb_safetensors_get(io, "logits");
    nb_tensor *l = nb_forward(m, idx);
    assert_rel(l, ref, 2e-6, "logits of transformers' model");
    double *x = tu_values(l), *y = tu_values(ref), d = 0, mx = 0;
    for (int64_t i = 0; i < nb_numel(l); i++) d = fmax(d, fabs(x[i] - y[i])), mx = fmax(mx, fabs(y[i]));
    fprintf(stderr, "llama: transformers -> nabla: max |logits diff| %.3g (max |logit| %.3g)\n", d,
            mx);
    free(x), free(y);
    nb_scope_end();
    nb_safetensors_close(io);
    nb_module_free(m);
}
END_TEST

/* The model of the nabla -> transformers direction: nb_llama_new's from seed 1234, its weights
 * then drawn wider (N(0, 0.3), the norms N(1, 0.2)) so that every weight matters. */
static nb_module *export_model(void) {
    nb_module *m = make(tiny(), 1234);
    nb_generator *g = nb_generator_new(1235);
    const nb_params *ps = nb_parameters(m);
    for (int i = 0; i < ps->count; i++) {
        const bool norm = strstr(ps->names[i], "norm.") != NULL;
        ASSERT_OK(nb_init_normal_(ps->tensors[i], norm ? 1.0 : 0.0, norm ? 0.2 : 0.3, g));
    }
    nb_generator_free(g);
    return m;
}

START_TEST(test_hf_export) {
    nb_module *m = export_model();
    nb_scope_begin();
    nb_tensor *idx = tokens(2, 16, 64, 1235);
    nb_tensor *l = nb_forward(m, idx);
    const char *dir = getenv("NB_LLAMA_EXPORT");
    if (dir && *dir) { /* tools/make_llama_fixture.py */
        char p[1024];
        snprintf(p, sizeof p, "%s/nabla_tiny.safetensors", dir);
        ASSERT_OK(nb_module_save(m, p));
        snprintf(p, sizeof p, "%s/nabla_tiny_io.safetensors", dir);
        const char *names[2] = {"idx", "logits"};
        nb_tensor *ts[2] = {nb_to_device(idx, NB_CPU), nb_to_device(l, NB_CPU)};
        ASSERT_OK(nb_safetensors_save(p, names, ts, 2, NULL, NULL, 0));
        nb_scope_end();
        nb_module_free(m);
        return; /* the script makes the fixture read below */
    }
    /* what transformers computed from the file nabla saved (strict loading) */
    nb_safetensors *io = nb_safetensors_open(FIXTURES "llama/nabla_tiny_hf.safetensors");
    ck_assert_msg(io, "%s", nb_last_error());
    assert_rel(idx, nb_safetensors_get(io, "idx"), 0, "the fixture's tokens");
    nb_tensor *ref = nb_safetensors_get(io, "logits");
    assert_rel(l, ref, 2e-6, "transformers' logits of nabla's model");
    double *x = tu_values(l), *y = tu_values(ref), d = 0, mx = 0;
    for (int64_t i = 0; i < nb_numel(l); i++) d = fmax(d, fabs(x[i] - y[i])), mx = fmax(mx, fabs(y[i]));
    fprintf(stderr, "llama: nabla -> transformers: max |logits diff| %.3g (max |logit| %.3g)\n", d,
            mx);
    free(x), free(y);
    /* the file nabla writes has exactly the names and shapes of transformers' file */
    nb_safetensors *hf = nb_safetensors_open(FIXTURES "llama/hf_tiny.safetensors");
    const nb_params *ps = nb_parameters(m);
    ck_assert_int_eq(nb_safetensors_count(hf), ps->count);
    for (int i = 0; i < ps->count; i++) {
        nb_safetensors_info in;
        const int at = nb_safetensors_find(hf, ps->names[i]);
        ck_assert_msg(at >= 0, "transformers' file lacks %s", ps->names[i]);
        ASSERT_OK(nb_safetensors_info_at(hf, at, &in));
        ck_assert_int_eq(in.ndim, nb_ndim(ps->tensors[i]));
        for (int k = 0; k < in.ndim; k++) ck_assert_int_eq(in.shape[k], nb_size(ps->tensors[i], k));
    }
    nb_safetensors_close(hf);
    nb_safetensors_close(io);
    nb_scope_end();
    nb_module_free(m);
}
END_TEST

Suite *nb_suite_llama(void) {
    Suite *s = suite_create("llama");
    TCase *tc = tcase_create("model");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_names_shapes);
    tcase_add_test(tc, test_forward_backward);
    tcase_add_test(tc, test_meta);
    tcase_add_test(tc, test_save_load);
    tcase_add_test(tc, test_other_architecture);
    tcase_add_test(tc, test_bad_config);
    tcase_add_test(tc, test_cache_logits);
    tcase_add_test(tc, test_generate);
    tcase_add_test(tc, test_recompute);
    tcase_add_test(tc, test_autocast);
    suite_add_tcase(s, tc);
    TCase *hf = tcase_create("hf");
    tcase_add_test(hf, test_hf_to_nabla);
    tcase_add_test(hf, test_hf_export);
    suite_add_tcase(s, hf);
    return s;
}
