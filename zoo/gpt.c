/* gpt.c - nanoGPT's GPT (pre-LN transformer, learned positions, tied head) as an nb_module
 * tree with nanoGPT's parameter names; the training step with gradient accumulation,
 * sampling, and loading weights from model files, checkpoints or PyTorch state dicts
 * (nabla/gpt.h). Part of the library, but written on its public API only, as a program
 * would write it (docs/architecture.md, "Layers and backends"). */
#include "nabla/nabla.h"
#include "zoo/gpt_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small modules with nanoGPT's names ------------------------------------------------------
 * Each module's `self` (except the top one's) borrows the model's config. The forwards are
 * written for whatever part of the model a rank holds: the attention takes its head count
 * from the width of the q/k/v projection it gets, the positions come from the position
 * embedding's forward, the loss views the logits by their own last dim. So a tensor-parallel
 * plan (nb_gpt_plan) and a pipeline split (nb_gpt_pipeline_new) make this one model parallel
 * without another copy of it (docs/gpt.md). */
typedef struct gpt_self {
    nb_gpt_config cfg;
} gpt_self;

static const nb_gpt_config *cfg_of(const nb_module *m) { return nb_module_self(m); }

static nb_tensor *dropout_forward(nb_module *m, nb_tensor *x) {
    const nb_gpt_config *c = cfg_of(m);
    if (!(c->dropout > 0) || !nb_module_is_training(m)) return x;
    return nb_dropout(x, c->dropout, true, c->dropout_gen);
}

static nb_tensor *linear_forward(nb_module *m, nb_tensor *x) {
    return nb_linear(x, nb_module_param(m, "weight"), nb_module_param_opt(m, "bias"));
}
static nb_tensor *layernorm_forward(nb_module *m, nb_tensor *x) {
    return nb_layer_norm(x, nb_module_param(m, "weight"), nb_module_param_opt(m, "bias"), 1e-5);
}
static nb_tensor *embedding_forward(nb_module *m, nb_tensor *x) {
    return nb_embedding(nb_module_param(m, "weight"), x);
}

/* The attention reads q, k and v in place from c_attn's (B, T, 3 C') output, C' = the width
 * this rank computes (C, or a tensor-parallel rank's heads), and returns the heads merged. */
static nb_tensor *attn_core(nb_tensor *const *qkv, int n, void *m) {
    (void)n;
    const nb_gpt_config *c = cfg_of(m);
    bool training = nb_module_is_training(m);
    const int64_t hd = c->n_embd / c->n_head, w = qkv[0] ? nb_size(qkv[0], -1) : 0;
    if (qkv[0] && w % (3 * hd)) {
        nb_set_error(NB_ESHAPE, "gpt: the attention got q, k, v of width %lld, not a whole number "
                     "of heads of size %lld (a tensor-parallel size must divide n_head)",
                     (long long)w, (long long)hd);
        return NULL;
    }
    return nb_causal_attention_qkv(qkv[0], w / (3 * hd), 0.0, training ? c->dropout : 0.0,
                                   training, c->dropout_gen);
}

/* With recompute ATTN, the attention core (qkv -> heads merged) is replayed in backward
 * (Megatron's selective recompute); with FULL the whole block is (make_block). */
static nb_tensor *attn_forward(nb_module *m, nb_tensor *x) {
    const nb_gpt_config *c = cfg_of(m);
    nb_tensor *qkv = nb_forward(nb_module_child(m, "c_attn"), x); /* (B, T, 3C) */
    nb_recompute_opts ro = nb_recompute_defaults();
    ro.gen = c->dropout_gen;
    nb_tensor *y = c->recompute == NB_GPT_RECOMPUTE_ATTN ? nb_recompute(attn_core, &qkv, 1, m, &ro)
                                                         : attn_core(&qkv, 1, m);
    return nb_forward(nb_module_child(m, "resid_dropout"),
                      nb_forward(nb_module_child(m, "c_proj"), y));
}

static nb_tensor *mlp_forward(nb_module *m, nb_tensor *x) {
    const nb_gpt_config *c = cfg_of(m);
    nb_tensor *h = nb_forward(nb_module_child(m, "c_fc"), x);
    h = c->gelu_tanh ? nb_gelu_tanh(h) : nb_gelu(h);
    return nb_forward(nb_module_child(m, "dropout"), nb_forward(nb_module_child(m, "c_proj"), h));
}

static nb_tensor *block_forward(nb_module *m, nb_tensor *x) {
    x = nb_add(x, nb_forward(nb_module_child(m, "attn"),
                             nb_forward(nb_module_child(m, "ln_1"), x)));
    return nb_add(x, nb_forward(nb_module_child(m, "mlp"),
                                nb_forward(nb_module_child(m, "ln_2"), x)));
}

static nb_tensor *gpt_forward(nb_module *m, nb_tensor *idx);

static const nb_module_vtable linear_vt = {.type_name = "Linear", .forward = linear_forward};
static const nb_module_vtable layernorm_vt = {.type_name = "LayerNorm",
                                              .forward = layernorm_forward};
static const nb_module_vtable embedding_vt = {.type_name = "Embedding",
                                              .forward = embedding_forward};
static const nb_module_vtable dropout_vt = {.type_name = "Dropout", .forward = dropout_forward};
static const nb_module_vtable attn_vt = {.type_name = "CausalSelfAttention",
                                         .forward = attn_forward};
static const nb_module_vtable mlp_vt = {.type_name = "MLP", .forward = mlp_forward};
static const nb_module_vtable block_vt = {.type_name = "Block", .forward = block_forward};
static const nb_module_vtable dict_vt = {.type_name = "ModuleDict"}; /* no forward */
static const nb_module_vtable gpt_vt = {.type_name = "GPT", .forward = gpt_forward,
                                        .free_self = free};

/* A parameter drawn from N(0, std) (std 0: zeros; std < 0: ones). */
static bool add_param(nb_module *m, const char *name, const int64_t *shape, int ndim, double std,
                      nb_generator *gen) {
    nb_tensor *t = std > 0   ? nb_normal(shape, ndim, NB_F32, 0.0, std, gen)
                   : std < 0 ? nb_ones(shape, ndim, NB_F32)
                             : nb_zeros(shape, ndim, NB_F32);
    return nb_module_add_parameter(m, name, t) != NULL;
}

/* Adds child `name` to parent; NULL (and the child freed) on failure. */
static nb_module *child(nb_module *parent, const char *name, nb_module *c) {
    if (!c) return NULL;
    return nb_module_add_child(parent, name, c);
}

static nb_module *make_linear(nb_module *parent, const char *name, int64_t in, int64_t out,
                              double std, const nb_gpt_config *c, nb_generator *gen) {
    nb_module *l = child(parent, name, nb_module_new(&linear_vt, (void *)(uintptr_t)c));
    if (!l || !add_param(l, "weight", (int64_t[]){out, in}, 2, std, gen)) return NULL;
    if (!c->no_bias && !add_param(l, "bias", &out, 1, 0.0, gen)) return NULL;
    return l;
}

static nb_module *make_layernorm(nb_module *parent, const char *name, const nb_gpt_config *c) {
    nb_module *l = child(parent, name, nb_module_new(&layernorm_vt, (void *)(uintptr_t)c));
    if (!l || !add_param(l, "weight", &c->n_embd, 1, -1.0, NULL)) return NULL;
    if (!c->no_bias && !add_param(l, "bias", &c->n_embd, 1, 0.0, NULL)) return NULL;
    return l;
}

/* Fills Block b's children (ln_1, attn, ln_2, mlp), drawing from gen in nb_gpt_new's order. */
static nb_module *fill_block(nb_module *b, const nb_gpt_config *c, nb_generator *gen) {
    const int64_t C = c->n_embd;
    const double proj_std = 0.02 / sqrt(2.0 * (double)c->n_layer); /* GPT-2's scaled init */
    if (c->recompute == NB_GPT_RECOMPUTE_FULL) nb_module_set_recompute(b, true, c->dropout_gen);
    nb_module *attn, *mlp;
    if (!make_layernorm(b, "ln_1", c) ||
        !(attn = child(b, "attn", nb_module_new(&attn_vt, (void *)(uintptr_t)c))) ||
        !make_linear(attn, "c_attn", C, 3 * C, 0.02, c, gen) ||
        !make_linear(attn, "c_proj", C, C, proj_std, c, gen) ||
        !child(attn, "resid_dropout", nb_module_new(&dropout_vt, (void *)(uintptr_t)c)) ||
        !make_layernorm(b, "ln_2", c) ||
        !(mlp = child(b, "mlp", nb_module_new(&mlp_vt, (void *)(uintptr_t)c))) ||
        !make_linear(mlp, "c_fc", C, 4 * C, 0.02, c, gen) ||
        !make_linear(mlp, "c_proj", 4 * C, C, proj_std, c, gen) ||
        !child(mlp, "dropout", nb_module_new(&dropout_vt, (void *)(uintptr_t)c)))
        return NULL;
    return b;
}

static nb_module *make_block(nb_module *list, const nb_gpt_config *c, nb_generator *gen) {
    nb_module *b = nb_module_new(&block_vt, (void *)(uintptr_t)c);
    if (!b || nb_module_list_append(list, b) != NB_OK) return NULL; /* the list took b over */
    return fill_block(b, c, gen);
}

nb_gpt_config nb_gpt_config_defaults(void) {
    return (nb_gpt_config){._init = NB__OPTS_MARK(nb_gpt_config),
                           .vocab_size = 256,
                           .block_size = 128,
                           .n_layer = 4,
                           .n_head = 4,
                           .n_embd = 256};
}

nb_gpt_sample_opts nb_gpt_sample_defaults(void) {
    return (nb_gpt_sample_opts){._init = NB__OPTS_MARK(nb_gpt_sample_opts)};
}

static bool resolve(const nb_gpt_config *in, nb_gpt_config *c) {
    if (in && NB__OPTS_CHECK(in, nb_gpt_config, "nb_gpt_new", "nb_gpt_config_defaults()",
                             "o.n_layer = 2") != NB_OK)
        return false;
    *c = in ? *in : nb_gpt_config_defaults();
    if (c->vocab_size < 1 || c->block_size < 1 || c->n_layer < 1 || c->n_head < 1 ||
        c->n_embd < 1) {
        nb_set_error(NB_EINVAL, "nb_gpt_new: vocab_size, block_size, n_layer, n_head and n_embd must "
                  "be positive, got %lld, %lld, %lld, %lld, %lld", (long long)c->vocab_size,
                  (long long)c->block_size, (long long)c->n_layer, (long long)c->n_head,
                  (long long)c->n_embd);
        return false;
    }
    if (c->n_embd % c->n_head) {
        nb_set_error(NB_EINVAL, "nb_gpt_new: n_head (%lld) must divide n_embd (%lld)",
                  (long long)c->n_head, (long long)c->n_embd);
        return false;
    }
    if (!(c->dropout >= 0 && c->dropout < 1)) {
        nb_set_error(NB_EINVAL, "nb_gpt_new: dropout must be in [0, 1), got %g", c->dropout);
        return false;
    }
    if ((int)c->recompute < NB_GPT_RECOMPUTE_NONE || (int)c->recompute > NB_GPT_RECOMPUTE_FULL) {
        nb_set_error(NB_EINVAL, "nb_gpt_new: recompute must be NB_GPT_RECOMPUTE_NONE, _ATTN or "
                     "_FULL, got %d", (int)c->recompute);
        return false;
    }
    return true;
}

nb_module *nb_gpt_new(const nb_gpt_config *cfg, nb_generator *init) {
    gpt_self *s = malloc(sizeof *s);
    if (!s) {
        nb_set_error(NB_ENOMEM, "nb_gpt_new: out of memory");
        return NULL;
    }
    if (!resolve(cfg, &s->cfg)) {
        free(s);
        return NULL;
    }
    nb_module *m = nb_module_new(&gpt_vt, s);
    if (!m) {
        free(s);
        return NULL;
    }
    const nb_gpt_config *c = &s->cfg;
    nb_module *tr = child(m, "transformer", nb_module_new(&dict_vt, NULL)), *e, *h, *head;
    bool ok = tr && (e = child(tr, "wte", nb_module_new(&embedding_vt, (void *)(uintptr_t)c))) &&
              add_param(e, "weight", (int64_t[]){c->vocab_size, c->n_embd}, 2, 0.02, init) &&
              (e = child(tr, "wpe", nb_module_new(&embedding_vt, (void *)(uintptr_t)c))) &&
              add_param(e, "weight", (int64_t[]){c->block_size, c->n_embd}, 2, 0.02, init) &&
              child(tr, "drop", nb_module_new(&dropout_vt, (void *)(uintptr_t)c)) &&
              (h = child(tr, "h", nb_module_list_new(NULL, 0)));
    for (int64_t i = 0; ok && i < c->n_layer; i++) ok = make_block(h, c, init) != NULL;
    /* the output head is tied to the token embedding (nanoGPT's lm_head): the same tensor,
     * registered under both names and listed once, as transformer.wte.weight */
    ok = ok && make_layernorm(tr, "ln_f", c) &&
         (head = child(m, "lm_head", nb_module_new(&linear_vt, (void *)(uintptr_t)c))) &&
         nb_module_add_parameter(head, "weight", nb_tensor_retain(nb_module_find(m, "transformer.wte.weight")));
    if (!ok) {
        nb_module_free(m);
        return NULL;
    }
    return m;
}

bool nb_gpt_is_gpt(const nb_module *m) {
    const char *t = nb_module_type(m);
    return t && m && strcmp(t, "GPT") == 0 && nb_module_self(m) != NULL;
}

const nb_gpt_config *nb_gpt_get_config(const nb_module *m) {
    return nb_gpt_is_gpt(m) ? &((const gpt_self *)nb_module_self(m))->cfg : NULL;
}

/* ---- forward and loss -------------------------------------------------------------------- */
/* The layers of the forward, which the pipeline split also runs one by one (nb_gpt_layers):
 * the embedding (token and position embeddings, dropout), the blocks, the head (ln_f and the
 * tied output projection). */
nb_tensor *nb__gpt_embed(nb_module *m, nb_tensor *idx, void *ctx) {
    (void)ctx;
    const nb_gpt_config *c = nb_gpt_get_config(m);
    if (!idx) { /* keep the first error, as the library's ops do */
        if (nb_last_status() == NB_OK) nb_set_error(NB_ENULL, "gpt: argument 'idx' is NULL");
        return NULL;
    }
    if (nb_ndim(idx) != 2 || (nb_tensor_dtype(idx) != NB_I64 && nb_tensor_dtype(idx) != NB_I32)) {
        nb_set_error(NB_EINVAL, "gpt: expected token indices of shape (B, T) and dtype i64 or "
                  "i32, got a %d-D %s tensor", nb_ndim(idx), nb_dtype_name(nb_tensor_dtype(idx)));
        return NULL;
    }
    const int64_t T = nb_size(idx, 1);
    if (T < 1 || T > c->block_size) {
        nb_set_error(NB_ESHAPE, "gpt: sequence length %lld is outside 1..block_size (%lld)",
                  (long long)T, (long long)c->block_size);
        return NULL;
    }
    nb_module *tr = nb_module_child(m, "transformer"), *wpe = nb_module_child(tr, "wpe");
    nb_tensor *pos = nb_to_device(nb_arange(0, (double)T, 1, NB_I64),
                                  nb_tensor_device(nb_module_param(wpe, "weight")));
    /* (B, T, C) + (T, C), broadcast over the batch */
    nb_tensor *x = nb_add(nb_forward(nb_module_child(tr, "wte"), idx), nb_forward(wpe, pos));
    return nb_forward(nb_module_child(tr, "drop"), x);
}

nb_tensor *nb__gpt_head(nb_module *m, nb_tensor *x, void *ctx) {
    (void)ctx;
    x = nb_forward(nb_module_child(nb_module_child(m, "transformer"), "ln_f"), x);
    return nb_forward(nb_module_child(m, "lm_head"), x); /* x @ wte^T -> (B, T, V) */
}

static nb_tensor *gpt_forward(nb_module *m, nb_tensor *idx) {
    nb_tensor *x = nb__gpt_embed(m, idx, NULL);
    nb_module *h = nb_module_child(nb_module_child(m, "transformer"), "h");
    for (int i = 0; i < nb_module_num_children(h) && x; i++) x = nb_forward(nb_module_child_at(h, i), x);
    return nb__gpt_head(m, x, NULL);
}

nb_tensor *nb__gpt_cross_entropy(nb_tensor *logits, nb_tensor *targets, void *ctx) {
    (void)ctx;
    if (!logits || !targets) return NULL;
    if (nb_ndim(targets) != 2 || nb_numel(targets) * nb_size(logits, -1) != nb_numel(logits)) {
        nb_set_error(NB_ESHAPE, "nb_gpt_loss: targets must have the shape of the input (B, T)");
        return NULL;
    }
    /* by the logits' own last dim: V, or a tensor-parallel rank's part of the vocabulary (the
     * cross entropy then runs vocab-parallel) */
    return nb_cross_entropy(nb_view(logits, (int64_t[]){-1, nb_size(logits, -1)}, 2),
                            nb_reshape(targets, (int64_t[]){-1}, 1), NULL);
}

nb_tensor *nb_gpt_loss(nb_module *m, nb_tensor *idx, nb_tensor *targets) {
    if (!nb_gpt_is_gpt(m)) {
        nb_set_error(NB_EINVAL, "nb_gpt_loss: the module is not a GPT made by nb_gpt_new");
        return NULL;
    }
    if (targets && idx && nb_numel(targets) != nb_numel(idx)) {
        nb_set_error(NB_ESHAPE, "nb_gpt_loss: targets must have the shape of the input (B, T)");
        return NULL;
    }
    return nb__gpt_cross_entropy(nb_forward(m, idx), targets, NULL);
}

/* A pipeline's step: the micro-batches as one batch through its stages (it splits them again),
 * their mean loss (over the data-parallel ranks too) in *loss_mean. */
static nb_status pipeline_pass(const nb_gpt_step_opts *o, nb_tensor *const *x,
                               nb_tensor *const *y, int n_micro, double *loss_mean) {
    nb_scope_begin();
    nb_tensor *xa = n_micro > 1 ? nb_cat(x, n_micro, 0) : x[0];
    nb_tensor *ya = n_micro > 1 ? nb_cat(y, n_micro, 0) : y[0];
    *loss_mean = xa && ya ? nb_pipeline_step(o->pipeline, xa, ya, o->pipe_stats) : NAN;
    nb_scope_end();
    return isnan(*loss_mean) && nb_last_status() != NB_OK ? nb_last_status() : NB_OK;
}

/* The language models' training step (zoo/gpt_impl.h): the GPT's, and the Llama's with its
 * own loss. */
double nb__lm_train_step(nb_module *m, nb_optim *opt, const nb_gpt_step_opts *o,
                         nb_tensor *const *x, nb_tensor *const *y, int n_micro,
                         double *grad_norm, nb__lm_loss_fn loss_of) {
    nb_ddp *ddp = o->ddp;
    nb_zero *zero = o->zero;
    nb_grad_scaler *scaler = o->scaler;
    const double grad_clip = o->grad_clip;
    if (grad_norm) *grad_norm = NAN;
    if (!m || !opt || !x || !y || n_micro < 1) {
        nb_set_error(NB_EINVAL, "nb_gpt_train_step: needs a model, an optimizer and n_micro >= 1 "
                  "micro-batches");
        return NAN;
    }
    nb_status st = nb_zero_grad(opt);
    double loss_sum = 0;
    if (o->pipeline) { /* the stages run the micro-batches; ddp / zero wrap its module */
        double mean = NAN;
        if (st == NB_OK) st = pipeline_pass(o, x, y, n_micro, &mean);
        loss_sum = mean * n_micro;
        ddp = NULL, zero = NULL; /* the pipeline synchronised them */
        goto reduced;
    }
    /* The micro-batches' losses are summed where they live (in f64, in order: the same
     * value as summing them on the host) and read once per step: on a GPU a read is a
     * synchronization, and one per micro-batch would stall the device that often. */
    nb_scope_begin();
    nb_tensor *loss_acc = NULL;
    for (int i = 0; st == NB_OK && i < n_micro; i++) {
        if (ddp) nb_ddp_set_sync_enabled(ddp, i == n_micro - 1); /* no_sync until the last */
        if (zero) nb_zero_set_sync_enabled(zero, i == n_micro - 1);
        nb_scope_begin();
        nb_tensor *loss = loss_of(m, x[i], y[i]);
        /* Scaling the loss (not the gradients) by 1/n makes the accumulated gradient that
         * of the mean over all micro-batches, the loss of one n-times-larger batch. */
        nb_tensor *scaled = n_micro > 1 ? nb_mul_scalar(loss, 1.0 / n_micro) : loss;
        /* fp16: the loss scaler's factor on top, so small gradients survive in f16 */
        if (scaler && scaled) scaled = nb_grad_scaler_scale(scaler, scaled);
        st = scaled ? nb_backward(scaled) : nb_last_status();
        if (st == NB_OK) {
            nb_tensor *l64 = nb_to_dtype(nb_detach(loss), NB_F64);
            loss_acc = l64 && loss_acc ? nb_add(loss_acc, l64) : l64;
            if (!loss_acc) st = nb_last_status();
            else loss_acc = nb_keep(loss_acc);
        }
        nb_scope_end();
    }
    /* (on a GPU this read also reports a bad index a kernel of the step found) */
    if (st == NB_OK) st = nb_read(loss_acc, &loss_sum, 1, NB_F64);
    nb_scope_end();
    if (ddp) {
        nb_ddp_set_sync_enabled(ddp, true);
        if (st == NB_OK) st = nb_ddp_sync(ddp); /* averaged over the ranks from here */
    }
    if (zero) {
        nb_zero_set_sync_enabled(zero, true);
        if (st == NB_OK) st = nb_zero_sync(zero); /* each rank holds its averaged shard */
    }
reduced:
    if (st == NB_OK && scaler) st = nb_grad_scaler_unscale(scaler, opt); /* before the norm */
    if (st != NB_OK) return NAN;
    if (grad_clip > 0 || grad_norm) {
        double max = grad_clip > 0 ? grad_clip : INFINITY;
        /* under ZeRO the parameters' placements make it the norm over every shard */
        double norm = nb_clip_grad_norm(nb_optim_params(opt), max, 2);
        if (norm < 0) return NAN;
        if (grad_norm) *grad_norm = norm;
        /* With a loss scaler, an overflow is its business: it skips the step, backs off */
        if (scaler) return nb_grad_scaler_step_update(scaler, opt) == NB_OK ? loss_sum / n_micro : NAN;
        /* A gradient overflowed (inf or NaN): not applied - it would make every weight NaN.
         * The caller sees the norm and decides (stop, or go on as a loss scaler would). */
        if (!isfinite(norm)) return nb_zero_grad(opt) == NB_OK ? loss_sum / n_micro : NAN;
    }
    if ((scaler ? nb_grad_scaler_step_update(scaler, opt) : nb_step(opt)) != NB_OK) return NAN;
    return loss_sum / n_micro;
}

nb_gpt_step_opts nb_gpt_step_defaults(void) {
    return (nb_gpt_step_opts){._init = NB__OPTS_MARK(nb_gpt_step_opts)};
}

double nb_gpt_train_step_ex(nb_module *m, nb_optim *opt, nb_tensor *const *x,
                            nb_tensor *const *y, int n_micro, const nb_gpt_step_opts *o,
                            double *grad_norm) {
    nb_gpt_step_opts d = nb_gpt_step_defaults();
    if (!o) o = &d;
    if (NB__OPTS_CHECK(o, nb_gpt_step_opts, "nb_gpt_train_step_ex", "nb_gpt_step_defaults()",
                       "o.grad_clip = 1") != NB_OK) {
        if (grad_norm) *grad_norm = NAN;
        return NAN;
    }
    if (o->ddp && o->zero) {
        if (grad_norm) *grad_norm = NAN;
        nb_set_error(NB_EINVAL, "nb_gpt_train_step_ex: ddp and zero both given; a model is "
                     "wrapped by one of them");
        return NAN;
    }
    return nb__lm_train_step(m, opt, o, x, y, n_micro, grad_norm, nb_gpt_loss);
}

double nb_gpt_train_step(nb_module *m, nb_optim *opt, nb_ddp *ddp, nb_tensor *const *x,
                      nb_tensor *const *y, int n_micro, double grad_clip, double *grad_norm) {
    nb_gpt_step_opts o = nb_gpt_step_defaults();
    o.ddp = ddp, o.grad_clip = grad_clip;
    return nb__lm_train_step(m, opt, &o, x, y, n_micro, grad_norm, nb_gpt_loss);
}

double nb_gpt_train_step_zero(nb_module *m, nb_optim *opt, nb_zero *zero, nb_tensor *const *x,
                              nb_tensor *const *y, int n_micro, double grad_clip,
                              double *grad_norm) {
    nb_gpt_step_opts o = nb_gpt_step_defaults();
    o.zero = zero, o.grad_clip = grad_clip;
    return nb__lm_train_step(m, opt, &o, x, y, n_micro, grad_norm, nb_gpt_loss);
}

/* ---- sampling ------------------------------------------------------------------------------ */
static int cmp_desc(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/* Choose the next token from logits l[0..V) (modified in place) with the uniform u. */
static int64_t pick(double *l, int64_t V, const nb_gpt_sample_opts *o, double *scratch,
                    double u) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (l[i] > l[best]) best = i;
    if (!(o->temperature > 0)) return best; /* greedy: the first maximum */
    if (o->top_k > 0 && o->top_k < V) {      /* as nanoGPT: drop logits below the k-th largest */
        memcpy(scratch, l, sizeof(double) * (size_t)V);
        qsort(scratch, (size_t)V, sizeof(double), cmp_desc);
        double kth = scratch[o->top_k - 1];
        for (int64_t i = 0; i < V; i++)
            if (l[i] < kth) l[i] = -INFINITY;
    }
    double mx = l[best], sum = 0;
    for (int64_t i = 0; i < V; i++) sum += (l[i] = exp((l[i] - mx) / o->temperature));
    double target = u * sum, acc = 0;
    for (int64_t i = 0; i < V; i++) {
        acc += l[i];
        if (l[i] > 0 && acc > target) return i;
    }
    return best; /* only when rounding put u * sum at the very total */
}

nb_status nb__lm_next(nb_tensor *last, int64_t V, const nb_gpt_sample_opts *o, double *l,
                      int64_t *tok) {
    double u = 0;
    if (last && o->temperature > 0) { /* one draw per token, only when sampling */
        nb_tensor *r = nb_rand((int64_t[]){1}, 1, NB_F64, o->gen);
        u = r ? nb_item_f64(r) : NAN;
    }
    nb_status st = !last || isnan(u) ? nb_last_status() : nb_read(last, l, V, NB_F64);
    if (st == NB_OK) *tok = pick(l, V, o, l + V, u);
    return st;
}

nb_status nb_gpt_generate(nb_module *m, const int64_t *prompt, int64_t n_prompt, int64_t n_new,
                       const nb_gpt_sample_opts *o, int64_t *out) {
    const nb_gpt_config *c = nb_gpt_get_config(m);
    if (o && NB__OPTS_CHECK(o, nb_gpt_sample_opts, "nb_gpt_generate", "nb_gpt_sample_defaults()",
                            "o.temperature = 0.8") != NB_OK)
        return nb_last_status();
    nb_gpt_sample_opts opt = o ? *o : nb_gpt_sample_defaults();
    if (!c) return nb_set_error(NB_EINVAL, "nb_gpt_generate: the module is not a GPT made by nb_gpt_new");
    if (!prompt || n_prompt < 1 || n_new < 0 || (n_new > 0 && !out))
        return nb_set_error(NB_EINVAL, "nb_gpt_generate: needs a prompt of at least one token and an "
                         "output buffer");
    if (!(opt.temperature >= 0) || opt.top_k < 0)
        return nb_set_error(NB_EINVAL, "nb_gpt_generate: temperature and top_k must be >= 0, got %g "
                         "and %lld", opt.temperature, (long long)opt.top_k);
    const int64_t V = c->vocab_size, len = n_prompt + n_new;
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return nb_set_error(NB_EINDEX, "nb_gpt_generate: prompt token %lld at position %lld is "
                             "outside the vocabulary 0..%lld", (long long)prompt[i],
                             (long long)i, (long long)V - 1);
    int64_t *ctx = malloc(sizeof(int64_t) * (size_t)len);
    double *l = malloc(sizeof(double) * 2 * (size_t)V);
    if (!ctx || !l) {
        free(ctx);
        free(l);
        return nb_set_error(NB_ENOMEM, "nb_gpt_generate: out of memory");
    }
    memcpy(ctx, prompt, sizeof(int64_t) * (size_t)n_prompt);
    bool was_training = nb_module_is_training(m);
    nb_module_train(m, false);
    bool prev = nb_set_grad_enabled(false);
    nb_status st = NB_OK;
    for (int64_t n = n_prompt; st == NB_OK && n < len; n++) {
        nb_scope_begin();
        const int64_t start = n > c->block_size ? n - c->block_size : 0, T = n - start;
        nb_tensor *idx = nb_from_buffer(ctx + start, (int64_t[]){1, T}, 2, NB_I64);
        nb_tensor *last = nb_select(nb_select(nb_forward(m, idx), 0, 0), 0, T - 1); /* (V) */
        st = nb__lm_next(last, V, &opt, l, &ctx[n]);
        nb_scope_end();
    }
    nb_set_grad_enabled(prev);
    nb_module_train(m, was_training);
    if (st == NB_OK && n_new > 0) memcpy(out, ctx + n_prompt, sizeof(int64_t) * (size_t)n_new);
    free(ctx);
    free(l);
    return st;
}

/* ---- files ------------------------------------------------------------------------------- */
/* The prefix under which a file holds the model: "model." in a checkpoint, "" otherwise. */
static const char *model_prefix(nb_safetensors *f) {
    return nb_safetensors_find(f, "model.transformer.wte.weight") >= 0 ? "model." : "";
}

static int find_in(nb_safetensors *f, const char *prefix, const char *name) {
    char full[512];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    return nb_safetensors_find(f, full);
}

/* Names a nanoGPT state dict has besides the parameters: the tied head and the old
 * attention-mask buffers ("transformer.h.<i>.attn.bias" of shape (1, 1, T, T)). */
static bool ignorable(const char *name) {
    size_t n = strlen(name);
    return strcmp(name, "lm_head.weight") == 0 ||
           (n > 10 && strcmp(name + n - 10, ".attn.bias") == 0);
}

nb_status nb_gpt_load(nb_module *m, const char *path) {
    if (!nb_gpt_is_gpt(m)) return nb_set_error(NB_EINVAL, "nb_gpt_load: the module is not a GPT");
    nb_safetensors *f = nb_safetensors_open(path);
    if (!f) return nb_last_status();
    const char *prefix = model_prefix(f);
    const size_t np = strlen(prefix);
    const nb_params *ps = nb_parameters(m);
    nb_status st = NB_OK;
    for (int i = 0; st == NB_OK && i < ps->count; i++)
        if (find_in(f, prefix, ps->names[i]) < 0)
            st = nb_set_error(NB_EINVAL, "nb_gpt_load: %s has no tensor \"%s%s\" (is it a model of "
                           "this shape?)", path, prefix, ps->names[i]);
    /* Everything else under the prefix must be a known extra, as a strict load would demand. */
    for (int i = 0; st == NB_OK && i < nb_safetensors_count(f); i++) {
        const char *name = nb_safetensors_name(f, i);
        if (strncmp(name, prefix, np) != 0 || ignorable(name + np)) continue;
        if (!nb_module_find(m, name + np))
            st = nb_set_error(NB_EINVAL, "nb_gpt_load: %s has a tensor \"%s\" this model does not have "
                           "(different n_layer or bias setting?)", path, name);
    }
    if (st == NB_OK) st = nb_module_load_from(m, f, prefix, false);
    nb_safetensors_close(f);
    return st;
}

nb_status nb_gpt_config_from_file(const char *path, nb_gpt_config *cfg) {
    if (!cfg) return nb_set_error(NB_ENULL, "nb_gpt_config_from_file: cfg is NULL");
    nb_safetensors *f = nb_safetensors_open(path);
    if (!f) return nb_last_status();
    const char *prefix = model_prefix(f);
    nb_safetensors_info wte, wpe;
    int iw = find_in(f, prefix, "transformer.wte.weight");
    int ip = find_in(f, prefix, "transformer.wpe.weight");
    nb_status st = NB_OK;
    if (iw < 0 || ip < 0 || nb_safetensors_info_at(f, iw, &wte) != NB_OK ||
        nb_safetensors_info_at(f, ip, &wpe) != NB_OK || wte.ndim != 2 || wpe.ndim != 2) {
        st = nb_set_error(NB_EFORMAT, "nb_gpt_config_from_file: %s does not hold a GPT (no 2-D "
                       "transformer.wte.weight and transformer.wpe.weight)", path);
    } else {
        cfg->vocab_size = wte.shape[0];
        cfg->n_embd = wte.shape[1];
        cfg->block_size = wpe.shape[0];
        int64_t n = 0;
        char name[128];
        for (;; n++) {
            snprintf(name, sizeof name, "transformer.h.%lld.ln_1.weight", (long long)n);
            if (find_in(f, prefix, name) < 0) break;
        }
        cfg->n_layer = n;
        cfg->no_bias = find_in(f, prefix, "transformer.ln_f.bias") < 0;
        if (n == 0)
            st = nb_set_error(NB_EFORMAT, "nb_gpt_config_from_file: %s has no transformer blocks", path);
    }
    nb_safetensors_close(f);
    return st;
}

double nb_gpt_train_flops(const nb_gpt_config *cfg, int64_t B, int64_t T) {
    nb_gpt_config c;
    if (!resolve(cfg, &c)) return NAN;
    const double N = (double)B * (double)T, C = (double)c.n_embd, V = (double)c.vocab_size;
    const double layer = 2 * N * C * 3 * C + 2 * N * C * C + 2 * (2 * N * C * 4 * C) +
                         2 * (2 * (double)B * (double)T * (double)T * C);
    return 3 * ((double)c.n_layer * layer + 2 * N * C * V);
}
