/* llama.c - a Llama-style decoder (Hugging Face's LlamaForCausalLM: RMSNorm, rotary
 * embeddings, a SwiGLU MLP, grouped-query attention, no biases, an untied head) as an nb_module
 * tree with Hugging Face's parameter names; its loss, training step, generation with a
 * key/value cache, and loading weights (nabla/llama.h). Part of the library, written on its
 * public API only, as zoo/gpt.c is.
 *
 * The forwards are written for whatever part of the model a rank holds, as the GPT's: the
 * attention takes its query and key/value head counts from the widths of the q, k and v it
 * gets (all of them, or a tensor-parallel rank's heads), the positions of the rotary embedding
 * from the length of the sequence it sees (whole inside the tensor-parallel region, also under
 * sequence parallelism, so no position needs splitting), the loss views the logits by their
 * own last dim. So its plan and its split (zoo/llama_parallel.c) make this one model parallel. */
#include "nabla/nabla.h"
#include "nabla/llama.h"
#include "zoo/gpt_impl.h"
#include "zoo/llama_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct llama_self {
    nb_llama_config cfg;
} llama_self;

/* Every module's self is the model's config (borrowed; the root owns it). */
static const nb_llama_config *cfg_of(const nb_module *m) { return nb_module_self(m); }

static int64_t head_size(const nb_llama_config *c) { return c->n_embd / c->n_head; }

/* ---- the small modules ------------------------------------------------------------------------ */
static nb_tensor *linear_forward(nb_module *m, nb_tensor *x) {
    return nb_linear(x, nb_module_param(m, "weight"), NULL);
}
static nb_tensor *rmsnorm_forward(nb_module *m, nb_tensor *x) {
    return nb_rms_norm(x, nb_module_param(m, "weight"), cfg_of(m)->norm_eps);
}
static nb_tensor *embedding_forward(nb_module *m, nb_tensor *x) {
    return nb_embedding(nb_module_param(m, "weight"), x);
}

static nb_tensor *mlp_forward(nb_module *m, nb_tensor *x) {
    nb_tensor *g = nb_forward(nb_module_child(m, "gate_proj"), x);
    nb_tensor *u = nb_forward(nb_module_child(m, "up_proj"), x);
    return nb_forward(nb_module_child(m, "down_proj"), nb_swiglu(g, u));
}

/* ---- attention ---------------------------------------------------------------------------------
 * q (B, T, Hq hd), k and v (B, T, Hk hd) from the projections: the head counts are the widths
 * over the head size. */
typedef struct heads {
    int64_t B, T, hd, Hq, Hk;
} heads;

static bool heads_of(const nb_llama_config *c, nb_tensor *q, nb_tensor *k, heads *h) {
    if (!q || !k) return false;
    h->hd = head_size(c);
    h->B = nb_size(q, 0), h->T = nb_size(q, 1);
    const int64_t wq = nb_size(q, -1), wk = nb_size(k, -1);
    h->Hq = wq / h->hd, h->Hk = wk / h->hd;
    if (wq % h->hd || wk % h->hd || h->Hk == 0 || h->Hq % h->Hk) {
        nb_set_error(NB_ESHAPE, "llama: the attention got q of width %lld and k, v of width %lld: "
                     "not whole heads of size %lld with the key/value heads dividing the query "
                     "heads (a tensor-parallel size must divide n_head)",
                     (long long)wq, (long long)wk, (long long)h->hd);
        return false;
    }
    return true;
}

/* (B, T, H hd) -> (B, T, H, hd) */
static nb_tensor *split_heads(nb_tensor *t, const heads *h, int64_t H) {
    return nb_view(t, (int64_t[]){h->B, nb_size(t, 1), H, h->hd}, 4);
}

/* (B, H, T, hd) view of a (B, T, H, hd) buffer -> (B, T, H hd) */
static nb_tensor *merge_heads(nb_tensor *o, const heads *h) {
    return nb_reshape(nb_transpose(o, 1, 2), (int64_t[]){h->B, nb_size(o, 2), h->Hq * h->hd}, 3);
}

/* The attention core of a whole sequence: the rotary embedding of q and k (positions 0 ..
 * T - 1), causal grouped-query attention, the heads merged. in: q, k, v. */
static nb_tensor *attn_core(nb_tensor *const *in, int n, void *m) {
    (void)n;
    const nb_llama_config *c = cfg_of(m);
    heads h;
    if (!in[2] || !heads_of(c, in[0], in[1], &h)) return NULL;
    nb_tensor *q = nb_rotary_embedding(split_heads(in[0], &h, h.Hq), 0, c->rope_theta);
    nb_tensor *k = nb_rotary_embedding(split_heads(in[1], &h, h.Hk), 0, c->rope_theta);
    nb_tensor *v = split_heads(in[2], &h, h.Hk);
    nb_tensor *o = nb_causal_attention(nb_transpose(q, 1, 2), nb_transpose(k, 1, 2),
                                       nb_transpose(v, 1, 2), 0, 0, false, NULL);
    return merge_heads(o, &h);
}

/* Attention of T new positions against a key/value cache holding `len` earlier ones (the
 * generation path: no gradients). q, k, v as above; keys after their rotary embedding and
 * values are appended to the cache's tensors of this layer. */
static nb_tensor *attn_cached(const nb_llama_config *c, nb_tensor *q, nb_tensor *k, nb_tensor *v,
                              nb_llama_cache *cache, int layer);

static nb_tensor *attn_run(nb_module *m, nb_tensor *x, nb_llama_cache *cache, int layer) {
    const nb_llama_config *c = cfg_of(m);
    nb_tensor *qkv[3] = {nb_forward(nb_module_child(m, "q_proj"), x),
                         nb_forward(nb_module_child(m, "k_proj"), x),
                         nb_forward(nb_module_child(m, "v_proj"), x)};
    nb_tensor *y;
    if (cache) y = attn_cached(c, qkv[0], qkv[1], qkv[2], cache, layer);
    else if (c->recompute == NB_GPT_RECOMPUTE_ATTN) y = nb_recompute(attn_core, qkv, 3, m, NULL);
    else y = attn_core(qkv, 3, m);
    return nb_forward(nb_module_child(m, "o_proj"), y);
}

static nb_tensor *attn_forward(nb_module *m, nb_tensor *x) { return attn_run(m, x, NULL, 0); }

/* A decoder layer: h = x + attn(input_layernorm(x)); h + mlp(post_attention_layernorm(h)). */
static nb_tensor *layer_run(nb_module *m, nb_tensor *x, nb_llama_cache *cache, int layer) {
    nb_tensor *a = attn_run(nb_module_child(m, "self_attn"),
                            nb_forward(nb_module_child(m, "input_layernorm"), x), cache, layer);
    nb_tensor *h = nb_add(x, a);
    return nb_add(h, nb_forward(nb_module_child(m, "mlp"),
                                nb_forward(nb_module_child(m, "post_attention_layernorm"), h)));
}

static nb_tensor *layer_forward(nb_module *m, nb_tensor *x) { return layer_run(m, x, NULL, 0); }

static nb_tensor *llama_forward(nb_module *m, nb_tensor *idx);

static const nb_module_vtable linear_vt = {.type_name = "Linear", .forward = linear_forward};
static const nb_module_vtable rmsnorm_vt = {.type_name = "LlamaRMSNorm",
                                            .forward = rmsnorm_forward};
static const nb_module_vtable embedding_vt = {.type_name = "Embedding",
                                              .forward = embedding_forward};
static const nb_module_vtable attn_vt = {.type_name = "LlamaAttention", .forward = attn_forward};
static const nb_module_vtable mlp_vt = {.type_name = "LlamaMLP", .forward = mlp_forward};
static const nb_module_vtable layer_vt = {.type_name = "LlamaDecoderLayer",
                                          .forward = layer_forward};
static const nb_module_vtable model_vt = {.type_name = "LlamaModel"}; /* no forward: a dict */
static const nb_module_vtable llama_vt = {.type_name = "LlamaForCausalLM",
                                          .forward = llama_forward, .free_self = free};

/* ---- building ------------------------------------------------------------------------------ */
static nb_module *child(nb_module *parent, const char *name, const nb_module_vtable *vt,
                        const nb_llama_config *c) {
    nb_module *m = nb_module_new(vt, (void *)(uintptr_t)c);
    return m ? nb_module_add_child(parent, name, m) : NULL;
}

/* A parameter from N(0, 0.02), or ones (std < 0). */
static bool add_param(nb_module *m, const char *name, int64_t d0, int64_t d1, double std,
                      nb_generator *gen) {
    const int64_t shape[2] = {d0, d1};
    nb_tensor *t = std > 0 ? nb_normal(shape, 2, NB_F32, 0.0, std, gen) : nb_ones(shape, 1, NB_F32);
    return nb_module_add_parameter(m, name, t) != NULL;
}

static bool linear(nb_module *parent, const char *name, int64_t in, int64_t out,
                   const nb_llama_config *c, nb_generator *gen) {
    nb_module *l = child(parent, name, &linear_vt, c);
    return l && add_param(l, "weight", out, in, 0.02, gen);
}

static bool rmsnorm(nb_module *parent, const char *name, const nb_llama_config *c) {
    nb_module *l = child(parent, name, &rmsnorm_vt, c);
    return l && add_param(l, "weight", c->n_embd, 0, -1.0, NULL);
}

/* Fills decoder layer b (its children in Hugging Face's order), drawing from gen. */
static bool fill_layer(nb_module *b, const nb_llama_config *c, nb_generator *gen) {
    const int64_t C = c->n_embd, Ckv = c->n_kv_head * head_size(c), F = c->n_inner;
    if (c->recompute == NB_GPT_RECOMPUTE_FULL && nb_module_set_recompute(b, true, NULL) != NB_OK)
        return false;
    nb_module *attn, *mlp;
    return (attn = child(b, "self_attn", &attn_vt, c)) && linear(attn, "q_proj", C, C, c, gen) &&
           linear(attn, "k_proj", C, Ckv, c, gen) && linear(attn, "v_proj", C, Ckv, c, gen) &&
           linear(attn, "o_proj", C, C, c, gen) && (mlp = child(b, "mlp", &mlp_vt, c)) &&
           linear(mlp, "gate_proj", C, F, c, gen) && linear(mlp, "up_proj", C, F, c, gen) &&
           linear(mlp, "down_proj", F, C, c, gen) && rmsnorm(b, "input_layernorm", c) &&
           rmsnorm(b, "post_attention_layernorm", c);
}

nb_llama_config nb_llama_config_defaults(void) {
    return (nb_llama_config){._init = NB__OPTS_MARK(nb_llama_config),
                             .vocab_size = 256,
                             .block_size = 128,
                             .n_layer = 4,
                             .n_head = 4,
                             .n_embd = 256,
                             .rope_theta = 10000.0,
                             .norm_eps = 1e-5};
}

static bool resolve(const nb_llama_config *in, nb_llama_config *c) {
    if (in && NB__OPTS_CHECK(in, nb_llama_config, "nb_llama_new", "nb_llama_config_defaults()",
                             "o.n_layer = 2") != NB_OK)
        return false;
    *c = in ? *in : nb_llama_config_defaults();
    /* the two derived sizes: 0 (their default) follows n_head and n_embd as set */
    if (!c->n_kv_head) c->n_kv_head = c->n_head % 2 == 0 ? c->n_head / 2 : c->n_head;
    if (!c->n_inner) c->n_inner = (8 * c->n_embd / 3 + 63) / 64 * 64;
    if (c->vocab_size < 1 || c->block_size < 1 || c->n_layer < 1 || c->n_head < 1 ||
        c->n_kv_head < 1 || c->n_embd < 1 || c->n_inner < 1) {
        nb_set_error(NB_EINVAL, "nb_llama_new: vocab_size, block_size, n_layer, n_head, n_kv_head, "
                     "n_embd and n_inner must be positive, got %lld, %lld, %lld, %lld, %lld, %lld, "
                     "%lld", (long long)c->vocab_size, (long long)c->block_size,
                     (long long)c->n_layer, (long long)c->n_head, (long long)c->n_kv_head,
                     (long long)c->n_embd, (long long)c->n_inner);
        return false;
    }
    if (c->n_embd % c->n_head) {
        nb_set_error(NB_EINVAL, "nb_llama_new: n_head (%lld) must divide n_embd (%lld)",
                     (long long)c->n_head, (long long)c->n_embd);
        return false;
    }
    if (c->n_head % c->n_kv_head) {
        nb_set_error(NB_EINVAL, "nb_llama_new: n_kv_head (%lld) must divide n_head (%lld): each "
                     "key/value head serves n_head / n_kv_head query heads",
                     (long long)c->n_kv_head, (long long)c->n_head);
        return false;
    }
    if (head_size(c) % 2) {
        nb_set_error(NB_EINVAL, "nb_llama_new: the head size n_embd / n_head = %lld is odd; rotary "
                     "embeddings rotate pairs of dimensions (i, i + head_size / 2), so it must be "
                     "even", (long long)head_size(c));
        return false;
    }
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta) || !(c->norm_eps >= 0) ||
        !isfinite(c->norm_eps)) {
        nb_set_error(NB_EINVAL, "nb_llama_new: rope_theta must be > 0 and norm_eps >= 0 (both "
                     "finite), got %g and %g", c->rope_theta, c->norm_eps);
        return false;
    }
    if ((int)c->recompute < NB_GPT_RECOMPUTE_NONE || (int)c->recompute > NB_GPT_RECOMPUTE_FULL) {
        nb_set_error(NB_EINVAL, "nb_llama_new: recompute must be NB_GPT_RECOMPUTE_NONE, _ATTN or "
                     "_FULL, got %d", (int)c->recompute);
        return false;
    }
    return true;
}

nb_module *nb_llama_new(const nb_llama_config *cfg, nb_generator *init) {
    llama_self *s = malloc(sizeof *s);
    if (!s) {
        nb_set_error(NB_ENOMEM, "nb_llama_new: out of memory");
        return NULL;
    }
    if (!resolve(cfg, &s->cfg)) {
        free(s);
        return NULL;
    }
    nb_module *m = nb_module_new(&llama_vt, s);
    if (!m) {
        free(s);
        return NULL;
    }
    const nb_llama_config *c = &s->cfg;
    nb_module *model = child(m, "model", &model_vt, c), *e, *layers;
    bool ok = model && (e = child(model, "embed_tokens", &embedding_vt, c)) &&
              add_param(e, "weight", c->vocab_size, c->n_embd, 0.02, init) &&
              (layers = nb_module_add_child(model, "layers", nb_module_list_new(NULL, 0)));
    for (int64_t i = 0; ok && i < c->n_layer; i++) {
        nb_module *b = nb_module_new(&layer_vt, (void *)(uintptr_t)c);
        ok = b && nb_module_list_append(layers, b) == NB_OK && fill_layer(b, c, init);
    }
    ok = ok && rmsnorm(model, "norm", c) && linear(m, "lm_head", c->n_embd, c->vocab_size, c, init);
    if (!ok) {
        nb_module_free(m);
        return NULL;
    }
    return m;
}

bool nb_llama_is_llama(const nb_module *m) {
    const char *t = m ? nb_module_type(m) : NULL;
    return t && strcmp(t, "LlamaForCausalLM") == 0 && nb_module_self(m) != NULL;
}

const nb_llama_config *nb_llama_get_config(const nb_module *m) {
    return nb_llama_is_llama(m) ? &((const llama_self *)nb_module_self(m))->cfg : NULL;
}

/* ---- forward and loss (the pipeline's layers too: zoo/llama_impl.h) ------------------------ */
static nb_status check_idx(const nb_llama_config *c, nb_tensor *idx, const char *who) {
    if (!idx) { /* keep the first error, as the library's ops do */
        return nb_last_status() != NB_OK ? nb_last_status()
                                         : nb_set_error(NB_ENULL, "%s: argument 'idx' is NULL", who);
    }
    if (nb_ndim(idx) != 2 || (nb_tensor_dtype(idx) != NB_I64 && nb_tensor_dtype(idx) != NB_I32))
        return nb_set_error(NB_EINVAL, "%s: expected token indices of shape (B, T) and dtype i64 "
                            "or i32, got a %d-D %s tensor", who, nb_ndim(idx),
                            nb_dtype_name(nb_tensor_dtype(idx)));
    const int64_t T = nb_size(idx, 1);
    if (T < 1 || T > c->block_size)
        return nb_set_error(NB_ESHAPE, "%s: sequence length %lld is outside 1..block_size (%lld)",
                            who, (long long)T, (long long)c->block_size);
    return NB_OK;
}

nb_tensor *nb__llama_embed(nb_module *m, nb_tensor *idx, void *ctx) {
    (void)ctx;
    if (check_idx(nb_llama_get_config(m), idx, "llama") != NB_OK) return NULL;
    return nb_forward(nb_module_child(nb_module_child(m, "model"), "embed_tokens"), idx);
}

nb_tensor *nb__llama_head(nb_module *m, nb_tensor *x, void *ctx) {
    (void)ctx;
    x = nb_forward(nb_module_child(nb_module_child(m, "model"), "norm"), x);
    return nb_forward(nb_module_child(m, "lm_head"), x);
}

static nb_tensor *llama_forward(nb_module *m, nb_tensor *idx) {
    nb_tensor *x = nb__llama_embed(m, idx, NULL);
    nb_module *layers = nb_module_child(nb_module_child(m, "model"), "layers");
    for (int i = 0; i < nb_module_num_children(layers) && x; i++)
        x = nb_forward(nb_module_child_at(layers, i), x);
    return nb__llama_head(m, x, NULL);
}

nb_tensor *nb__llama_cross_entropy(nb_tensor *logits, nb_tensor *targets, void *ctx) {
    (void)ctx;
    if (!logits || !targets) return NULL;
    if (nb_ndim(targets) != 2 || nb_numel(targets) * nb_size(logits, -1) != nb_numel(logits)) {
        nb_set_error(NB_ESHAPE, "nb_llama_loss: targets must have the shape of the input (B, T)");
        return NULL;
    }
    /* by the logits' own last dim: V, or a tensor-parallel rank's part of the vocabulary (the
     * cross entropy then runs vocab-parallel) */
    return nb_cross_entropy(nb_view(logits, (int64_t[]){-1, nb_size(logits, -1)}, 2),
                            nb_reshape(targets, (int64_t[]){-1}, 1), NULL);
}

nb_tensor *nb_llama_loss(nb_module *m, nb_tensor *idx, nb_tensor *targets) {
    if (!nb_llama_is_llama(m)) {
        nb_set_error(NB_EINVAL, "nb_llama_loss: the module is not a Llama made by nb_llama_new");
        return NULL;
    }
    if (targets && idx && nb_numel(targets) != nb_numel(idx)) {
        nb_set_error(NB_ESHAPE, "nb_llama_loss: targets must have the shape of the input (B, T)");
        return NULL;
    }
    return nb__llama_cross_entropy(nb_forward(m, idx), targets, NULL);
}

double nb_llama_train_step(nb_module *m, nb_optim *opt, nb_tensor *const *x,
                           nb_tensor *const *y, int n_micro, const nb_gpt_step_opts *o,
                           double *grad_norm) {
    const nb_gpt_step_opts none = nb_gpt_step_defaults();
    if (!o) o = &none;
    if (NB__OPTS_CHECK(o, nb_gpt_step_opts, "nb_llama_train_step", "nb_gpt_step_defaults()",
                       "o.grad_clip = 1") != NB_OK) {
        if (grad_norm) *grad_norm = NAN;
        return NAN;
    }
    if (o->ddp && o->zero) {
        if (grad_norm) *grad_norm = NAN;
        nb_set_error(NB_EINVAL, "nb_llama_train_step: ddp and zero both given; a model is wrapped "
                     "by one of them");
        return NAN;
    }
    return nb__lm_train_step(m, opt, o, x, y, n_micro, grad_norm, nb_llama_loss);
}

double nb_llama_train_flops(const nb_llama_config *cfg, int64_t B, int64_t T) {
    nb_llama_config c;
    if (!resolve(cfg, &c)) return NAN;
    const double N = (double)B * (double)T, C = (double)c.n_embd, V = (double)c.vocab_size;
    const double Ckv = (double)(c.n_kv_head * head_size(&c)), F = (double)c.n_inner;
    const double layer = 2 * N * C * (2 * C + 2 * Ckv) + 3 * 2 * N * C * F +
                         2 * (2 * (double)B * (double)T * (double)T * C);
    return 3 * ((double)c.n_layer * layer + 2 * N * C * V);
}

/* ---- the key/value cache -------------------------------------------------------------------- */
struct nb_llama_cache {
    nb_module *m;
    int64_t B, max_len, len;
    int n_layer;
    nb_tensor **k, **v; /* per layer (B, max_len, Hk, hd), kept out of every scope */
};

nb_llama_cache *nb_llama_cache_new(nb_module *m, int64_t batch, int64_t max_len) {
    const nb_llama_config *c = nb_llama_get_config(m);
    if (!c) {
        nb_set_error(NB_EINVAL, "nb_llama_cache_new: the module is not a Llama made by nb_llama_new");
        return NULL;
    }
    if (batch < 1 || max_len < 1 || max_len > c->block_size) {
        nb_set_error(NB_EINVAL, "nb_llama_cache_new: batch must be >= 1 and max_len in 1..%lld "
                     "(block_size), got %lld and %lld", (long long)c->block_size,
                     (long long)batch, (long long)max_len);
        return NULL;
    }
    nb_llama_cache *k = calloc(1, sizeof *k);
    nb_module *layers = nb_module_child(nb_module_child(m, "model"), "layers");
    const int n = nb_module_num_children(layers);
    if (k) {
        k->k = calloc((size_t)n, sizeof *k->k);
        k->v = calloc((size_t)n, sizeof *k->v);
    }
    if (!k || !k->k || !k->v) {
        nb_llama_cache_free(k);
        nb_set_error(NB_ENOMEM, "nb_llama_cache_new: out of memory");
        return NULL;
    }
    *k = (nb_llama_cache){.m = m, .B = batch, .max_len = max_len, .n_layer = n, .k = k->k,
                          .v = k->v};
    const int64_t hd = head_size(c);
    for (int i = 0; i < n; i++) {
        /* this rank's key/value heads: the projection's rows over the head size */
        nb_tensor *w = nb_module_find(nb_module_child_at(layers, i), "self_attn.k_proj.weight");
        const int64_t shape[4] = {batch, max_len, w ? nb_size(w, 0) / hd : 0, hd};
        const nb_device dev = w ? nb_tensor_device(w) : NB_CPU;
        /* references of the cache's own, out of every scope */
        nb_scope_begin();
        k->k[i] = nb_tensor_retain(nb_zeros_on(dev, shape, 4, NB_F32));
        k->v[i] = nb_tensor_retain(nb_zeros_on(dev, shape, 4, NB_F32));
        nb_scope_end();
        if (!k->k[i] || !k->v[i]) {
            nb_llama_cache_free(k);
            return NULL;
        }
    }
    return k;
}

void nb_llama_cache_free(nb_llama_cache *c) {
    if (!c) return;
    for (int i = 0; c->k && i < c->n_layer; i++) nb_tensor_free(c->k[i]);
    for (int i = 0; c->v && i < c->n_layer; i++) nb_tensor_free(c->v[i]);
    free(c->k);
    free(c->v);
    free(c);
}

int64_t nb_llama_cache_len(const nb_llama_cache *c) { return c ? c->len : 0; }
void nb_llama_cache_reset(nb_llama_cache *c) {
    if (c) c->len = 0;
}

static nb_tensor *attn_cached(const nb_llama_config *c, nb_tensor *q, nb_tensor *k, nb_tensor *v,
                              nb_llama_cache *cache, int layer) {
    heads h;
    if (!v || !heads_of(c, q, k, &h)) return NULL;
    const int64_t len = cache->len, L = len + h.T, rep = h.Hq / h.Hk;
    nb_tensor *kc = cache->k[layer], *vc = cache->v[layer];
    if (nb_size(kc, 2) != h.Hk || h.B != cache->B) {
        nb_set_error(NB_ESHAPE, "llama: the cache holds %lld sequences of %lld key/value heads, "
                     "the layer gave %lld and %lld", (long long)cache->B,
                     (long long)nb_size(kc, 2), (long long)h.B, (long long)h.Hk);
        return NULL;
    }
    nb_tensor *qr = nb_rotary_embedding(split_heads(q, &h, h.Hq), len, c->rope_theta);
    nb_tensor *kr = nb_rotary_embedding(split_heads(k, &h, h.Hk), len, c->rope_theta);
    if (!kr || nb_copy_(nb_narrow(kc, 1, len, h.T), kr) != NB_OK ||
        nb_copy_(nb_narrow(vc, 1, len, h.T), split_heads(v, &h, h.Hk)) != NB_OK)
        return NULL;
    nb_tensor *K = nb_transpose(nb_narrow(kc, 1, 0, L), 1, 2); /* (B, Hk, L, hd) */
    nb_tensor *V = nb_transpose(nb_narrow(vc, 1, 0, L), 1, 2);
    if (len == 0) /* the prompt: the causal kernel, as the forward */
        return merge_heads(nb_causal_attention(nb_transpose(qr, 1, 2), K, V, 0, 0, false, NULL),
                           &h);
    /* T queries against L keys: the query heads of a key/value head as the rows of one
     * product, row t of each seeing the keys up to position len + t */
    nb_tensor *qg = nb_reshape(nb_transpose(qr, 1, 2), (int64_t[]){h.B, h.Hk, rep * h.T, h.hd}, 4);
    nb_tensor *s = nb_mul_scalar(nb_matmul(qg, nb_transpose(K, 2, 3)), 1.0 / sqrt((double)h.hd));
    if (h.T > 1) {
        bool *mk = malloc(sizeof(bool) * (size_t)(h.T * L));
        if (!mk) {
            nb_set_error(NB_ENOMEM, "llama: out of memory");
            return NULL;
        }
        for (int64_t t = 0; t < h.T; t++)
            for (int64_t j = 0; j < L; j++) mk[t * L + j] = j > len + t;
        nb_tensor *mask = nb_to_device(nb_from_buffer(mk, (int64_t[]){h.T, L}, 2, NB_BOOL),
                                       nb_tensor_device(kc));
        free(mk);
        s = nb_view(nb_masked_fill(nb_view(s, (int64_t[]){h.B, h.Hk, rep, h.T, L}, 5), mask,
                                   -INFINITY),
                    (int64_t[]){h.B, h.Hk, rep * h.T, L}, 4);
    }
    nb_tensor *o = nb_matmul(nb_softmax(s, -1), V); /* (B, Hk, rep T, hd) */
    o = nb_view(o, (int64_t[]){h.B, h.Hq, h.T, h.hd}, 4);
    return nb_reshape(nb_transpose(o, 1, 2), (int64_t[]){h.B, h.T, h.Hq * h.hd}, 3);
}

nb_tensor *nb_llama_forward_cached(nb_module *m, nb_tensor *idx, nb_llama_cache *c) {
    const nb_llama_config *cfg = nb_llama_get_config(m);
    if (!cfg || !c || c->m != m) {
        nb_set_error(NB_EINVAL, "nb_llama_forward_cached: needs a Llama and a cache made for it");
        return NULL;
    }
    if (check_idx(cfg, idx, "nb_llama_forward_cached") != NB_OK) return NULL;
    const int64_t T = nb_size(idx, 1);
    if (c->len + T > c->max_len) {
        nb_set_error(NB_EINVAL, "nb_llama_forward_cached: %lld cached and %lld new positions exceed "
                     "the cache's %lld", (long long)c->len, (long long)T, (long long)c->max_len);
        return NULL;
    }
    nb_tensor *x = nb__llama_embed(m, idx, NULL);
    nb_module *layers = nb_module_child(nb_module_child(m, "model"), "layers");
    for (int i = 0; i < c->n_layer && x; i++) x = layer_run(nb_module_child_at(layers, i), x, c, i);
    nb_tensor *logits = nb__llama_head(m, x, NULL);
    if (logits) c->len += T;
    return logits;
}

/* ---- generation ------------------------------------------------------------------------------ */
nb_status nb_llama_generate(nb_module *m, const int64_t *prompt, int64_t n_prompt, int64_t n_new,
                            const nb_gpt_sample_opts *o, bool use_cache, int64_t *out) {
    const nb_llama_config *c = nb_llama_get_config(m);
    if (o && NB__OPTS_CHECK(o, nb_gpt_sample_opts, "nb_llama_generate", "nb_gpt_sample_defaults()",
                            "o.temperature = 0.8") != NB_OK)
        return nb_last_status();
    nb_gpt_sample_opts opt = o ? *o : nb_gpt_sample_defaults();
    if (!c) return nb_set_error(NB_EINVAL, "nb_llama_generate: the module is not a Llama");
    if (!prompt || n_prompt < 1 || n_new < 0 || (n_new > 0 && !out))
        return nb_set_error(NB_EINVAL, "nb_llama_generate: needs a prompt of at least one token and "
                            "an output buffer");
    if (!(opt.temperature >= 0) || opt.top_k < 0)
        return nb_set_error(NB_EINVAL, "nb_llama_generate: temperature and top_k must be >= 0, got "
                            "%g and %lld", opt.temperature, (long long)opt.top_k);
    const int64_t V = c->vocab_size, len = n_prompt + n_new;
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return nb_set_error(NB_EINDEX, "nb_llama_generate: prompt token %lld at position %lld "
                                "is outside the vocabulary 0..%lld", (long long)prompt[i],
                                (long long)i, (long long)V - 1);
    int64_t *ctx = malloc(sizeof(int64_t) * (size_t)len);
    double *l = malloc(sizeof(double) * 2 * (size_t)V);
    nb_llama_cache *cache = use_cache ? nb_llama_cache_new(m, 1, c->block_size) : NULL;
    if (!ctx || !l || (use_cache && !cache)) {
        free(ctx);
        free(l);
        nb_llama_cache_free(cache);
        return use_cache && !cache ? nb_last_status()
                                   : nb_set_error(NB_ENOMEM, "nb_llama_generate: out of memory");
    }
    memcpy(ctx, prompt, sizeof(int64_t) * (size_t)n_prompt);
    bool was_training = nb_module_is_training(m);
    nb_module_train(m, false);
    bool prev = nb_set_grad_enabled(false);
    nb_status st = NB_OK;
    for (int64_t n = n_prompt; st == NB_OK && n < len; n++) {
        nb_scope_begin();
        nb_tensor *logits;
        int64_t T;
        if (cache && n <= c->block_size) { /* the positions the cache lacks: the prompt, then one */
            const int64_t from = nb_llama_cache_len(cache);
            T = n - from;
            nb_tensor *idx = nb_from_buffer(ctx + from, (int64_t[]){1, T}, 2, NB_I64);
            logits = nb_llama_forward_cached(m, idx, cache);
        } else { /* the whole window */
            const int64_t start = n > c->block_size ? n - c->block_size : 0;
            T = n - start;
            logits = nb_forward(m, nb_from_buffer(ctx + start, (int64_t[]){1, T}, 2, NB_I64));
        }
        nb_tensor *last = nb_select(nb_select(logits, 0, 0), 0, T - 1); /* (V) */
        st = nb__lm_next(last, V, &opt, l, &ctx[n]);
        nb_scope_end();
    }
    nb_set_grad_enabled(prev);
    nb_module_train(m, was_training);
    if (st == NB_OK && n_new > 0) memcpy(out, ctx + n_prompt, sizeof(int64_t) * (size_t)n_new);
    nb_llama_cache_free(cache);
    free(ctx);
    free(l);
    return st;
}

/* ---- files ------------------------------------------------------------------------------- */
/* The prefix under which a file holds the model: "model." in a checkpoint, "" otherwise. */
static const char *model_prefix(nb_safetensors *f) {
    return nb_safetensors_find(f, "model.model.embed_tokens.weight") >= 0 ? "model." : "";
}

static int find_in(nb_safetensors *f, const char *prefix, const char *name) {
    char full[512];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    return nb_safetensors_find(f, full);
}

/* Names a Hugging Face Llama file may hold besides the parameters: older versions saved the
 * rotary embedding's inverse frequencies as buffers. */
static bool ignorable(const char *name) {
    const char *tail = "rotary_emb.inv_freq";
    size_t n = strlen(name), t = strlen(tail);
    return n >= t && strcmp(name + n - t, tail) == 0;
}

/* NB_EFORMAT naming what f holds when it holds no Llama; NB_OK when it does. */
static nb_status expect_llama(nb_safetensors *f, const char *prefix, const char *path,
                              const char *who) {
    if (find_in(f, prefix, "model.embed_tokens.weight") >= 0) return NB_OK;
    const char *first = nb_safetensors_count(f) > 0 ? nb_safetensors_name(f, 0) : NULL;
    const bool gpt = nb_safetensors_find(f, "transformer.wte.weight") >= 0 ||
                     nb_safetensors_find(f, "model.transformer.wte.weight") >= 0;
    return nb_set_error(NB_EFORMAT, "%s: %s holds no Llama (no model.embed_tokens.weight%s%s%s)",
                        who, path, gpt ? "; it holds a GPT: transformer.wte.weight" : "",
                        !gpt && first ? "; its first tensor is " : "", !gpt && first ? first : "");
}

nb_status nb_llama_load(nb_module *m, const char *path) {
    if (!nb_llama_is_llama(m)) return nb_set_error(NB_EINVAL, "nb_llama_load: the module is not a Llama");
    nb_safetensors *f = nb_safetensors_open(path);
    if (!f) return nb_last_status();
    const char *prefix = model_prefix(f);
    const size_t np = strlen(prefix);
    nb_status st = expect_llama(f, prefix, path, "nb_llama_load");
    const nb_params *ps = nb_parameters(m);
    for (int i = 0; st == NB_OK && i < ps->count; i++)
        if (find_in(f, prefix, ps->names[i]) < 0)
            st = nb_set_error(NB_EINVAL, "nb_llama_load: %s has no tensor \"%s%s\" (is it a model "
                              "of this shape?)", path, prefix, ps->names[i]);
    /* everything else under the prefix must be a known extra, as a strict load demands */
    for (int i = 0; st == NB_OK && i < nb_safetensors_count(f); i++) {
        const char *name = nb_safetensors_name(f, i);
        if (strncmp(name, prefix, np) != 0 || ignorable(name + np)) continue;
        if (!nb_module_find(m, name + np))
            st = nb_set_error(NB_EINVAL, "nb_llama_load: %s has a tensor \"%s\" this model does "
                              "not have (another architecture, or another n_layer?)", path, name);
    }
    if (st == NB_OK) st = nb_module_load_from(m, f, prefix, false);
    nb_safetensors_close(f);
    return st;
}

/* dims of tensor `name` (under prefix) into shape[2]; false when absent or not 2-D (1-D
 * tensors: shape[1] = 0). */
static bool dims_of(nb_safetensors *f, const char *prefix, const char *name, int ndim,
                    int64_t shape[2]) {
    nb_safetensors_info in;
    const int i = find_in(f, prefix, name);
    if (i < 0 || nb_safetensors_info_at(f, i, &in) != NB_OK || in.ndim != ndim) return false;
    shape[0] = in.shape[0], shape[1] = ndim > 1 ? in.shape[1] : 0;
    return true;
}

nb_status nb_llama_config_from_file(const char *path, nb_llama_config *cfg) {
    if (!cfg) return nb_set_error(NB_ENULL, "nb_llama_config_from_file: cfg is NULL");
    nb_safetensors *f = nb_safetensors_open(path);
    if (!f) return nb_last_status();
    const char *prefix = model_prefix(f);
    nb_status st = expect_llama(f, prefix, path, "nb_llama_config_from_file");
    int64_t e[2] = {0}, g[2] = {0}, k[2] = {0};
    if (st == NB_OK && (!dims_of(f, prefix, "model.embed_tokens.weight", 2, e) ||
                        !dims_of(f, prefix, "model.layers.0.mlp.gate_proj.weight", 2, g) ||
                        !dims_of(f, prefix, "model.layers.0.self_attn.k_proj.weight", 2, k)))
        st = nb_set_error(NB_EFORMAT, "nb_llama_config_from_file: %s lacks a 2-D "
                          "model.embed_tokens.weight, or layer 0's gate_proj or k_proj", path);
    if (st == NB_OK) {
        cfg->vocab_size = e[0], cfg->n_embd = e[1], cfg->n_inner = g[0];
        int64_t n = 0;
        char name[128];
        for (;; n++) {
            snprintf(name, sizeof name, "model.layers.%lld.input_layernorm.weight", (long long)n);
            if (find_in(f, prefix, name) < 0) break;
        }
        cfg->n_layer = n;
        if (cfg->n_head > 0 && e[1] % cfg->n_head == 0) cfg->n_kv_head = k[0] / (e[1] / cfg->n_head);
    }
    nb_safetensors_close(f);
    return st;
}
