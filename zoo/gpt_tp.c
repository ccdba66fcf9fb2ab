/* gpt_tp.c - the tensor-parallel (and sequence-parallel) GPT of nabla/gpt_tp.h, built from
 * the collectives of nabla/tp.h. The module tree and parameter names are zoo/gpt.c's; each
 * parameter holds this rank's slice of the 1-rank tensor. Written on the public API only. */
#include "nabla/nabla.h"
#include "nabla/gpt_tp.h"
#include "zoo/gpt_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct nb__gpt_tp {
    nb_gpt_config cfg;
    nb_comm *c;  /* borrowed */
    bool sp;
    int tp, rank;
    /* nb_gpt_tp_save_async's save in flight: its index is written once every rank's file is
     * durable (at the next save or at nb_gpt_tp_save_wait) */
    struct {
        bool pending;
        char dir[4400], base[4096], id[20];
        int keep;
        int64_t step;
    } inflight;
} tp_self;

static const tp_self *self_of(const nb_module *m) { return nb_module_self(m); }

/* How a parameter is split, from its name. */
typedef enum split { REPLICATED, ROWS, COLS, QKV } split;
static bool ends(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}
static split split_of(const char *name) {
    if (ends(name, "attn.c_attn.weight") || ends(name, "attn.c_attn.bias")) return QKV;
    if (ends(name, "mlp.c_fc.weight") || ends(name, "mlp.c_fc.bias") ||
        strcmp(name, "transformer.wte.weight") == 0)
        return ROWS;
    if (ends(name, "c_proj.weight")) return COLS;
    return REPLICATED;
}
/* Replicated parameters used on sequence shards: their gradients are partial under
 * sequence parallelism. */
static bool sp_partial(const char *name) {
    return split_of(name) == REPLICATED; /* wpe, layer norms, row-parallel biases */
}

/* ---- forward ------------------------------------------------------------------------------- */
/* Dropout draws the 1-rank run's masks. Element i of a random tensor comes from Philox block
 * offset + i / 4 (nabla/random.h), so a part of the 1-rank tensor that starts at an element
 * divisible by 4 is drawn by moving the generator's offset there; afterwards the generator
 * is left where the 1-rank draw leaves it. Replicated (B, T, C) tensors draw as 1 rank
 * does; a sequence shard (B, T/tp, C) draws each row b from element (b T + r T/tp) C; the
 * attention's (B, n_head/tp, T, T) mask is drawn per sequence from element
 * (b n_head + r n_head/tp) T T. When an alignment does not hold (C or T not a multiple of
 * 4 or 2), the part draws from the current offset: a valid dropout, not the 1-rank one. */
static nb_generator *gen_of(const tp_self *s) {
    return s->cfg.dropout_gen ? s->cfg.dropout_gen : nb_default_generator();
}

static nb_tensor *dropout(const tp_self *s, nb_module *m, nb_tensor *x) {
    if (!(s->cfg.dropout > 0) || !nb_module_is_training(m) || !x) return x;
    nb_generator *g = gen_of(s);
    const int64_t B = nb_size(x, 0), Tl = nb_size(x, 1), C = nb_size(x, 2);
    if (!s->sp || s->tp == 1 || C % 4) return nb_dropout(x, s->cfg.dropout, true, g);
    const uint64_t o0 = nb_generator_offset(g);
    const int64_t T = Tl * s->tp;
    nb_tensor **rows = malloc(sizeof *rows * (size_t)B);
    if (!rows) {
        nb_set_error(NB_ENOMEM, "gpt_tp: out of memory");
        return NULL;
    }
    for (int64_t b = 0; b < B; b++) {
        nb_generator_set_offset(g, o0 + (uint64_t)((b * T + s->rank * Tl) * C / 4));
        rows[b] = nb_dropout(nb_narrow(x, 0, b, 1), s->cfg.dropout, true, g);
    }
    nb_generator_set_offset(g, o0 + (uint64_t)((B * T * C + 3) / 4));
    nb_tensor *y = nb_cat(rows, (int)B, 0);
    free(rows);
    return y;
}

/* The attention over this rank's heads, its dropout mask the 1-rank one's slice. */
static nb_tensor *attention(const tp_self *s, nb_tensor *qkv, bool training) {
    const double p = training ? s->cfg.dropout : 0.0;
    const int64_t Hl = s->cfg.n_head / s->tp, H = s->cfg.n_head;
    nb_generator *g = p > 0 ? gen_of(s) : s->cfg.dropout_gen;
    const int64_t B = qkv ? nb_size(qkv, 0) : 0, T = qkv ? nb_size(qkv, 1) : 0;
    if (!(p > 0) || s->tp == 1 || T % 2 || !qkv)
        return nb_causal_attention_qkv(qkv, Hl, 0.0, p, training, g);
    const uint64_t o0 = nb_generator_offset(g);
    nb_tensor **ys = malloc(sizeof *ys * (size_t)B);
    if (!ys) {
        nb_set_error(NB_ENOMEM, "gpt_tp: out of memory");
        return NULL;
    }
    for (int64_t b = 0; b < B; b++) {
        nb_generator_set_offset(g, o0 + (uint64_t)((b * H + s->rank * Hl) * T * T / 4));
        ys[b] = nb_causal_attention_qkv(nb_narrow(qkv, 0, b, 1), Hl, 0.0, p, true, g);
    }
    nb_generator_set_offset(g, o0 + (uint64_t)((B * H * T * T + 3) / 4));
    nb_tensor *y = nb_cat(ys, (int)B, 0);
    free(ys);
    return y;
}

static nb_tensor *layernorm_forward(nb_module *m, nb_tensor *x) {
    return nb_layer_norm(x, nb_module_param(m, "weight"), nb_module_param_opt(m, "bias"), 1e-5);
}

/* Into the parallel region (all-gather the sequence, or copy) and out of it (reduce-scatter
 * the sequence, or allreduce), then the replicated bias. */
static nb_tensor *enter(const tp_self *s, nb_tensor *x) {
    return s->sp ? nb_all_gather_along(x, s->c, 1) : nb_copy_to_region(x, s->c);
}
static nb_tensor *leave(const tp_self *s, nb_module *proj, nb_tensor *y) {
    y = nb_linear(y, nb_module_param(proj, "weight"), NULL);
    y = s->sp ? nb_reduce_scatter_along(y, s->c, 1) : nb_reduce_from_region(y, s->c);
    nb_tensor *b = nb_module_param_opt(proj, "bias");
    return b ? nb_add(y, b) : y;
}
static nb_tensor *column(nb_module *l, nb_tensor *x) {
    return nb_linear(x, nb_module_param(l, "weight"), nb_module_param_opt(l, "bias"));
}

/* The attention core of this rank's heads (no communication), replayed in backward under
 * NB_GPT_RECOMPUTE_ATTN as zoo/gpt.c's. */
static nb_tensor *attn_core(nb_tensor *const *qkv, int n, void *m) {
    (void)n;
    return attention(self_of(m), qkv[0], nb_module_is_training(m));
}

static nb_tensor *attn_forward(nb_module *m, nb_tensor *x) {
    const tp_self *s = self_of(m);
    nb_tensor *qkv = column(nb_module_child(m, "c_attn"), enter(s, x)); /* (B, T, 3C/tp) */
    nb_tensor *y = s->cfg.recompute == NB_GPT_RECOMPUTE_ATTN
                       ? nb_recompute(attn_core, &qkv, 1, m,
                                      &(nb_recompute_opts){.gen = s->cfg.dropout_gen})
                       : attn_core(&qkv, 1, m);
    return dropout(s, m, leave(s, nb_module_child(m, "c_proj"), y));
}

static nb_tensor *mlp_forward(nb_module *m, nb_tensor *x) {
    const tp_self *s = self_of(m);
    nb_tensor *h = column(nb_module_child(m, "c_fc"), enter(s, x));
    h = s->cfg.gelu_tanh ? nb_gelu_tanh(h) : nb_gelu(h);
    return dropout(s, m, leave(s, nb_module_child(m, "c_proj"), h));
}

static nb_tensor *block_forward(nb_module *m, nb_tensor *x) {
    x = nb_add(x, nb_forward(nb_module_child(m, "attn"), nb_forward(nb_module_child(m, "ln_1"), x)));
    return nb_add(x, nb_forward(nb_module_child(m, "mlp"), nb_forward(nb_module_child(m, "ln_2"), x)));
}

/* The embedding and its dropout: (B, T, C), or this rank's (B, T/tp, C) shard of the
 * sequence; m gives the training mode. */
static nb_tensor *embed(const tp_self *s, nb_module *m, nb_tensor *wte, nb_tensor *wpe,
                        nb_tensor *idx) {
    const int64_t T = nb_size(idx, 1);
    nb_tensor *x = nb_vocab_parallel_embedding(wte, idx, s->c, s->sp ? 1 : -1);
    const int64_t Tl = s->sp ? T / s->tp : T;
    x = nb_add(x, nb_narrow(wpe, 0, s->sp ? Tl * s->rank : 0, Tl));
    return dropout(s, m, x);
}

static nb_tensor *gpt_tp_forward(nb_module *m, nb_tensor *idx) {
    const tp_self *s = self_of(m);
    if (!idx) {
        if (nb_last_status() == NB_OK) nb_set_error(NB_ENULL, "gpt_tp: argument 'idx' is NULL");
        return NULL;
    }
    if (nb_ndim(idx) != 2 || (nb_tensor_dtype(idx) != NB_I64 && nb_tensor_dtype(idx) != NB_I32)) {
        nb_set_error(NB_EINVAL, "gpt_tp: expected token indices of shape (B, T) and dtype i64 or i32");
        return NULL;
    }
    const int64_t T = nb_size(idx, 1);
    if (T < 1 || T > s->cfg.block_size) {
        nb_set_error(NB_ESHAPE, "gpt_tp: sequence length %lld is outside 1..block_size (%lld)",
                     (long long)T, (long long)s->cfg.block_size);
        return NULL;
    }
    if (s->sp && T % s->tp) {
        nb_set_error(NB_ESHAPE, "gpt_tp: with sequence parallelism the sequence length (%lld) must "
                     "divide by the tensor-parallel size (%d)", (long long)T, s->tp);
        return NULL;
    }
    nb_module *tr = nb_module_child(m, "transformer");
    nb_module *h = nb_module_child(tr, "h");
    nb_tensor *wte = nb_module_param(nb_module_child(tr, "wte"), "weight");
    nb_tensor *wpe = nb_module_param(nb_module_child(tr, "wpe"), "weight");
    nb_tensor *x = embed(s, m, wte, wpe, idx);
    for (int i = 0; i < nb_module_num_children(h); i++) x = nb_forward(nb_module_child_at(h, i), x);
    x = nb_forward(nb_module_child(tr, "ln_f"), x);
    return nb_linear(enter(s, x), wte, NULL); /* tied head: this rank's (B, T, V/tp) logits */
}

static const nb_module_vtable ln_vt = {.type_name = "LayerNorm", .forward = layernorm_forward};
static const nb_module_vtable col_vt = {.type_name = "ColumnParallelLinear"};
static const nb_module_vtable row_vt = {.type_name = "RowParallelLinear"};
static const nb_module_vtable vemb_vt = {.type_name = "VocabParallelEmbedding"};
static const nb_module_vtable emb_vt = {.type_name = "Embedding"};
static const nb_module_vtable attn_vt = {.type_name = "ParallelAttention", .forward = attn_forward};
static const nb_module_vtable mlp_vt = {.type_name = "ParallelMLP", .forward = mlp_forward};
static const nb_module_vtable block_vt = {.type_name = "Block", .forward = block_forward};
static const nb_module_vtable dict_vt = {.type_name = "ModuleDict"};
static const nb_module_vtable gpt_tp_vt = {.type_name = "GPTTensorParallel",
                                           .forward = gpt_tp_forward, .free_self = free};

/* ---- slicing -------------------------------------------------------------------------------- */
/* This rank's slice of the 1-rank tensor w (a new tensor, no history). QKV: the rows of
 * q, k and v of this rank's heads, side by side. */
static nb_tensor *slice_of(nb_tensor *w, split k, int r, int tp) {
    bool prev = nb_set_grad_enabled(false);
    nb_tensor *out = NULL;
    switch (k) {
    case REPLICATED: out = nb_clone(w); break;
    case ROWS: out = nb_tp_slice(w, 0, r, tp); break;
    case COLS: out = nb_tp_slice(w, 1, r, tp); break;
    case QKV: {
        const int64_t C = nb_size(w, 0) / 3, n = C / tp;
        nb_tensor *parts[3];
        for (int p = 0; p < 3; p++) parts[p] = nb_narrow(w, 0, p * C + r * n, n);
        out = nb_cat(parts, 3, 0);
        break;
    }
    }
    nb_set_grad_enabled(prev);
    return out;
}

/* Add parameter `pname` of module l, the slice of full's tensor `prefix.pname` (skipped when
 * full has none: no_bias). */
static bool add_slice(nb_module *l, const char *prefix, const char *pname, nb_module *full,
                      const tp_self *s) {
    char name[256];
    snprintf(name, sizeof name, "%s.%s", prefix, pname);
    nb_tensor *w = nb_module_find(full, name);
    if (!w) {
        nb_clear_error();
        return true;
    }
    nb_scope_begin();
    nb_tensor *t = slice_of(w, split_of(name), s->rank, s->tp);
    bool ok = t && nb_module_add_parameter(l, pname, nb_keep(t)) != NULL;
    nb_scope_end();
    return ok;
}

static nb_module *add_mod(nb_module *parent, const char *name, const nb_module_vtable *vt,
                          const tp_self *s) {
    nb_module *c = nb_module_new(vt, (void *)(uintptr_t)s);
    return c ? nb_module_add_child(parent, name, c) : NULL;
}

/* A leaf module `name` under parent with the slices of full's "prefix.name.{weight,bias}"
 * (prefix "": full's "name.{weight,bias}"). */
static bool leaf(nb_module *parent, const char *prefix, const char *name, const nb_module_vtable *vt,
                 nb_module *full, const tp_self *s) {
    char p[256];
    snprintf(p, sizeof p, "%s%s%s", prefix, *prefix ? "." : "", name);
    nb_module *l = add_mod(parent, name, vt, s);
    return l && add_slice(l, p, "weight", full, s) && add_slice(l, p, "bias", full, s);
}

/* The TP Block holding the slices of full's block at prefix ("transformer.h.<i>", or "" when
 * full is a standalone block); NULL + error on failure. */
static nb_module *tp_block(nb_module *full, const char *p, const tp_self *s) {
    char pa[80], pm[80];
    snprintf(pa, sizeof pa, "%s%sattn", p, *p ? "." : "");
    snprintf(pm, sizeof pm, "%s%smlp", p, *p ? "." : "");
    nb_module *b = nb_module_new(&block_vt, (void *)(uintptr_t)s), *attn, *mlp;
    bool ok = b && leaf(b, p, "ln_1", &ln_vt, full, s) &&
              (attn = add_mod(b, "attn", &attn_vt, s)) && leaf(attn, pa, "c_attn", &col_vt, full, s) &&
              leaf(attn, pa, "c_proj", &row_vt, full, s) && leaf(b, p, "ln_2", &ln_vt, full, s) &&
              (mlp = add_mod(b, "mlp", &mlp_vt, s)) && leaf(mlp, pm, "c_fc", &col_vt, full, s) &&
              leaf(mlp, pm, "c_proj", &row_vt, full, s);
    if (!ok) {
        nb_module_free(b);
        return NULL;
    }
    /* NB_GPT_RECOMPUTE_FULL: the whole block replayed in backward, its collectives too
     * (every rank of the group replays the same blocks in the same order) */
    if (s->cfg.recompute == NB_GPT_RECOMPUTE_FULL &&
        nb_module_set_recompute(b, true, s->cfg.dropout_gen) != NB_OK) {
        nb_module_free(b);
        return NULL;
    }
    return b;
}

nb_module *nb_gpt_tp_from(nb_module *full, nb_comm *c, const nb_gpt_tp_opts *o) {
    const nb_gpt_config *cfg = nb_gpt_get_config(full);
    if (!cfg || !c) {
        nb_set_error(NB_EINVAL, "nb_gpt_tp_from: needs a GPT made by nb_gpt_new and a communicator");
        return NULL;
    }
    const int tp = nb_comm_size(c);
    if (cfg->n_head % tp || cfg->vocab_size % tp) {
        nb_set_error(NB_EINVAL, "nb_gpt_tp: the tensor-parallel size %d must divide n_head (%lld) "
                     "and vocab_size (%lld)", tp, (long long)cfg->n_head, (long long)cfg->vocab_size);
        return NULL;
    }
    tp_self *s = malloc(sizeof *s);
    if (!s) {
        nb_set_error(NB_ENOMEM, "nb_gpt_tp: out of memory");
        return NULL;
    }
    *s = (tp_self){.cfg = *cfg, .c = c, .sp = o && o->sequence_parallel, .tp = tp,
                   .rank = nb_comm_rank(c)};
    nb_module *m = nb_module_new(&gpt_tp_vt, s);
    if (!m) {
        free(s);
        return NULL;
    }
    nb_module *tr = add_mod(m, "transformer", &dict_vt, s), *h = NULL;
    bool ok = tr && leaf(tr, "transformer", "wte", &vemb_vt, full, s) &&
              leaf(tr, "transformer", "wpe", &emb_vt, full, s) &&
              (h = nb_module_add_child(tr, "h", nb_module_list_new(NULL, 0)));
    for (int64_t i = 0; ok && i < cfg->n_layer; i++) {
        char p[64];
        snprintf(p, sizeof p, "transformer.h.%lld", (long long)i);
        nb_module *b = tp_block(full, p, s);
        ok = b && nb_module_list_append(h, b) == NB_OK;
    }
    if (!ok || !leaf(tr, "transformer", "ln_f", &ln_vt, full, s)) {
        nb_module_free(m);
        return NULL;
    }
    return m;
}

nb_module *nb_gpt_tp_new(const nb_gpt_config *cfg, nb_generator *init, nb_comm *c,
                         const nb_gpt_tp_opts *o) {
    if (!c) {
        nb_set_error(NB_ENULL, "nb_gpt_tp_new: the communicator is NULL");
        return NULL;
    }
    if (cfg) { /* check the split before drawing anything (defaults: 4 heads, 256 tokens) */
        const int tp = nb_comm_size(c);
        int64_t nh = cfg->n_head ? cfg->n_head : 4, v = cfg->vocab_size ? cfg->vocab_size : 256;
        if (nh % tp || v % tp) {
            nb_set_error(NB_EINVAL, "nb_gpt_tp: the tensor-parallel size %d must divide n_head "
                         "(%lld) and vocab_size (%lld)", tp, (long long)nh, (long long)v);
            return NULL;
        }
    }
    nb_module *full = nb_gpt_new(cfg, init);
    nb_module *m = full ? nb_gpt_tp_from(full, c, o) : NULL;
    nb_module_free(full);
    return m;
}

bool nb_gpt_tp_is_gpt_tp(const nb_module *m) {
    const char *t = m ? nb_module_type(m) : NULL;
    return t && strcmp(t, "GPTTensorParallel") == 0 && nb_module_self(m) != NULL;
}

const nb_gpt_config *nb_gpt_tp_get_config(const nb_module *m) {
    return nb_gpt_tp_is_gpt_tp(m) ? &self_of(m)->cfg : NULL;
}

bool nb_gpt_tp_param_is_sharded(nb_module *m, int i) {
    const nb_params *ps = nb_parameters(m);
    return ps && i >= 0 && i < ps->count && split_of(ps->names[i]) != REPLICATED;
}

nb_status nb_gpt_tp_gather(nb_module *m, nb_module *full) {
    if (!nb_gpt_tp_is_gpt_tp(m) || !nb_gpt_get_config(full))
        return nb_set_error(NB_EINVAL, "nb_gpt_tp_gather: needs a TP GPT and a GPT made by nb_gpt_new");
    const tp_self *s = self_of(m);
    const nb_params *ps = nb_parameters(m);
    nb_status st = NB_OK;
    bool prev = nb_set_grad_enabled(false);
    for (int i = 0; st == NB_OK && i < ps->count; i++) {
        nb_tensor *dst = nb_module_find(full, ps->names[i]);
        if (!dst) {
            st = nb_set_error(NB_EINVAL, "nb_gpt_tp_gather: the GPT has no parameter %s (another "
                              "config?)", ps->names[i]);
            break;
        }
        nb_scope_begin();
        split k = split_of(ps->names[i]);
        nb_tensor *p = ps->tensors[i];
        if (k == REPLICATED) {
            st = nb_copy_(dst, p);
        } else if (k != QKV) {
            nb_tensor *g = nb_gather_along(p, s->c, k == ROWS ? 0 : 1);
            st = g ? nb_copy_(dst, g) : nb_last_status();
        } else { /* the rank-major [q_r; k_r; v_r] blocks back into q, k, v */
            nb_tensor *g = nb_gather_along(p, s->c, 0);
            const int64_t C = nb_size(dst, 0) / 3, n = C / s->tp;
            for (int r = 0; g && st == NB_OK && r < s->tp; r++)
                for (int q = 0; st == NB_OK && q < 3; q++)
                    st = nb_copy_(nb_narrow(dst, 0, q * C + r * n, n),
                                  nb_narrow(g, 0, (int64_t)r * 3 * n + q * n, n));
            if (!g) st = nb_last_status();
        }
        nb_scope_end();
    }
    nb_set_grad_enabled(prev);
    return st;
}

/* ---- loss and training step ----------------------------------------------------------------- */
nb_tensor *nb_gpt_tp_loss(nb_module *m, nb_tensor *idx, nb_tensor *targets) {
    if (!nb_gpt_tp_is_gpt_tp(m)) {
        nb_set_error(NB_EINVAL, "nb_gpt_tp_loss: the module is not a TP GPT made by nb_gpt_tp_new");
        return NULL;
    }
    nb_tensor *logits = nb_forward(m, idx);
    if (!logits || !targets) return NULL;
    if (nb_ndim(targets) != 2 || nb_numel(targets) != nb_numel(idx)) {
        nb_set_error(NB_ESHAPE, "nb_gpt_tp_loss: targets must have the shape of the input (B, T)");
        return NULL;
    }
    const tp_self *s = self_of(m);
    return nb_vocab_parallel_cross_entropy(nb_view(logits, (int64_t[]){-1, s->cfg.vocab_size / s->tp}, 2),
                                           nb_reshape(targets, (int64_t[]){-1}, 1), s->c);
}

nb_status nb_gpt_tp_sync_grads(nb_module *m) {
    if (!nb_gpt_tp_is_gpt_tp(m)) return nb_set_error(NB_EINVAL, "nb_gpt_tp_sync_grads: not a TP GPT");
    const tp_self *s = self_of(m);
    if (!s->sp || s->tp == 1) return NB_OK;
    const nb_params *ps = nb_parameters(m);
    nb_status st = NB_OK;
    for (int i = 0; st == NB_OK && i < ps->count; i++) {
        nb_tensor *g = nb_grad(ps->tensors[i]);
        if (g && sp_partial(ps->names[i])) st = nb_allreduce(s->c, g, NB_REDUCE_SUM);
    }
    return st;
}

nb_gpt_tp_step_opts nb_gpt_tp_step_defaults(void) { return (nb_gpt_tp_step_opts){0}; }

/* Sequence parallelism's partial gradients summed over the tp group: those of the shard's
 * pieces under ZeRO (stages 1 and 2: the pieces are the reduced gradient; the same pieces on
 * every tp rank, whose models have the same shapes), else the parameters'. */
static nb_status sync_sp(nb_module *m, nb_zero *z) {
    const tp_self *s = self_of(m);
    if (!z || nb_zero_stage(z) == 0 || !s->sp || s->tp == 1) return nb_gpt_tp_sync_grads(m);
    const nb_params *ps = nb_optim_params(nb_zero_optim(z));
    nb_status st = ps ? NB_OK : nb_last_status();
    for (int i = 0; st == NB_OK && i < ps->count; i++) {
        nb_tensor *g = nb_grad(ps->tensors[i]);
        if (g && sp_partial(ps->names[i])) st = nb_allreduce(s->c, g, NB_REDUCE_SUM);
    }
    return st;
}

double nb_gpt_tp_train_step_ex(nb_module *m, nb_optim *opt, nb_tensor *const *x,
                               nb_tensor *const *y, int n_micro, const nb_gpt_tp_step_opts *o,
                               double *grad_norm) {
    if (grad_norm) *grad_norm = NAN;
    if (!nb_gpt_tp_is_gpt_tp(m) || !opt || !x || !y || n_micro < 1) {
        nb_set_error(NB_EINVAL, "nb_gpt_tp_train_step: needs a TP GPT, an optimizer and n_micro >= 1 "
                     "micro-batches");
        return NAN;
    }
    const nb_gpt_tp_step_opts op = o ? *o : nb_gpt_tp_step_defaults();
    nb_ddp *ddp = op.ddp;
    nb_grad_scaler *scaler = op.scaler;
    const double grad_clip = op.grad_clip;
    nb_zero *z = op.zero;
    if (ddp && z) {
        nb_set_error(NB_EINVAL, "nb_gpt_tp_train_step: give an nb_ddp or an nb_zero, not both");
        return NAN;
    }
    if (z && nb_zero_stage(z) == 3) {
        nb_set_error(NB_EINVAL, "nb_gpt_tp_train_step: ZeRO stage 3 is not supported with tensor "
                     "parallelism (stages 0, 1 and 2 are)");
        return NAN;
    }
    if (z && scaler) {
        nb_set_error(NB_EINVAL, "nb_gpt_tp_train_step: a loss scaler with ZeRO over tensor-parallel "
                     "ranks is not supported yet (use bf16, or nb_ddp)");
        return NAN;
    }
    nb_status st = nb_zero_grad(opt);
    double loss_sum = 0;
    for (int i = 0; st == NB_OK && i < n_micro; i++) {
        if (ddp) nb_ddp_set_sync_enabled(ddp, i == n_micro - 1);
        if (z) nb_zero_set_sync_enabled(z, i == n_micro - 1);
        nb_scope_begin();
        nb_tensor *loss = nb_gpt_tp_loss(m, x[i], y[i]);
        nb_tensor *scaled = n_micro > 1 ? nb_mul_scalar(loss, 1.0 / n_micro) : loss;
        /* fp16: the loss scaler's factor on top, so small gradients survive in f16 */
        if (scaler && scaled) scaled = nb_grad_scaler_scale(scaler, scaled);
        st = scaled ? nb_backward(scaled) : nb_last_status();
        if (st == NB_OK) loss_sum += nb_item_f64(loss);
        nb_scope_end();
    }
    if (ddp) {
        nb_ddp_set_sync_enabled(ddp, true);
        if (st == NB_OK) st = nb_ddp_sync(ddp);
    }
    if (z) {
        nb_zero_set_sync_enabled(z, true);
        if (st == NB_OK) st = nb_zero_sync(z);
    }
    if (st == NB_OK) st = sync_sp(m, z);
    /* unscaled before the norm; the inf/NaN flag is global over the scaler's communicator
     * (give it tp x dp: each rank checks only its slices) */
    if (st == NB_OK && scaler) st = nb_grad_scaler_unscale(scaler, opt);
    if (st != NB_OK) return NAN;
    if (grad_clip > 0 || grad_norm) {
        const tp_self *s = self_of(m);
        const nb_params *ps = nb_parameters(m);
        bool *sh = malloc(sizeof(bool) * (size_t)(ps->count > 0 ? ps->count : 1));
        if (!sh) {
            nb_set_error(NB_ENOMEM, "nb_gpt_tp_train_step: out of memory");
            return NAN;
        }
        double norm;
        if (z) { /* replicated parameters counted by tp rank 0 only */
            for (int i = 0; i < ps->count; i++) sh[i] = split_of(ps->names[i]) == REPLICATED && s->rank != 0;
            /* parallel/zero_impl.h: ZeRO's norm with skip flags, until the parameters
             * carry placements (then nb_clip_grad_norm) */
            double nb__zero_clip_grad_norm_ex(nb_zero *, double, double, nb_comm *, nb_comm *,
                                              const bool *);
            norm = nb__zero_clip_grad_norm_ex(z, grad_clip > 0 ? grad_clip : INFINITY, 2, s->c,
                                              NULL, sh);
        } else {
            for (int i = 0; i < ps->count; i++) sh[i] = split_of(ps->names[i]) != REPLICATED;
            norm = nb_tp_clip_grad_norm(ps->tensors, sh, ps->count, s->c,
                                        grad_clip > 0 ? grad_clip : INFINITY);
        }
        free(sh);
        if (norm < 0) return NAN;
        if (grad_norm) *grad_norm = norm;
        /* With a loss scaler, an overflow is its business: it skips the step, backs off */
        if (scaler) return nb_grad_scaler_step_update(scaler, opt) == NB_OK ? loss_sum / n_micro : NAN;
        /* A gradient overflowed (inf or NaN; the norm is the same on every rank): not
         * applied, as nb_gpt_train_step; the caller sees the norm and decides. */
        if (!isfinite(norm)) return nb_zero_grad(opt) == NB_OK ? loss_sum / n_micro : NAN;
    }
    if ((scaler ? nb_grad_scaler_step_update(scaler, opt) : nb_step(opt)) != NB_OK) return NAN;
    return loss_sum / n_micro;
}

double nb_gpt_tp_train_step(nb_module *m, nb_optim *opt, nb_ddp *ddp, nb_tensor *const *x,
                            nb_tensor *const *y, int n_micro, double grad_clip, double *grad_norm) {
    return nb_gpt_tp_train_step_ex(m, opt, x, y, n_micro,
                                   &(nb_gpt_tp_step_opts){.ddp = ddp, .grad_clip = grad_clip},
                                   grad_norm);
}

/* ---- files across layouts ---------------------------------------------------------------------
 * The file is consolidated: the 1-rank model under "model." (nanoGPT's names, so nb_gpt_load
 * and nb_gpt_config_from_file read it) and the 1-rank optimizer state under "optim.", so any
 * layout (or 1 process) loads it by slicing. */

/* The parameter an optimizer state entry "<slot>.<param>" belongs to; NULL for the
 * per-group scalars and the "step." counters (0-dim: never split). */
static const char *state_param(const char *name, const nb_tensor *t) {
    const char *dot = strchr(name, '.');
    if (!dot || nb_ndim(t) == 0 || strncmp(name, "param_groups.", 13) == 0) return NULL;
    return dot + 1;
}

static nb_tensor *unshuffle_qkv(nb_tensor *g, int tp);

/* The whole tensor of this rank's slice p of parameter `name` (collective over s->c). */
static nb_tensor *whole(const tp_self *s, const char *name, nb_tensor *p) {
    split k = split_of(name);
    if (k == REPLICATED) return nb_clone(p);
    nb_tensor *g = nb_gather_along(p, s->c, k == COLS ? 1 : 0);
    return k == QKV && g ? unshuffle_qkv(g, s->tp) : g;
}

/* The 1-rank c_attn tensor from the tp slices of it side by side along dim 0. */
static nb_tensor *unshuffle_qkv(nb_tensor *g, int tp) {
    const int64_t C = nb_size(g, 0) / 3, n = C / tp; /* [q_r; k_r; v_r] blocks -> q, k, v */
    nb_tensor **parts = malloc(sizeof *parts * 3 * (size_t)tp);
    if (!parts) {
        nb_set_error(NB_ENOMEM, "gpt_tp: out of memory");
        return NULL;
    }
    for (int q = 0; q < 3; q++)
        for (int r = 0; r < tp; r++) parts[q * tp + r] = nb_narrow(g, 0, (int64_t)r * 3 * n + q * n, n);
    nb_tensor *out = nb_cat(parts, 3 * tp, 0);
    free(parts);
    return out;
}

/* The whole model into *model and the whole optimizer state into *state (either may be
 * NULL), names without prefix. Collective over the tp group. */
static nb_status gather_all(nb_module *m, nb_optim *opt, nb_state_list *model, nb_state_list *state) {
    const tp_self *s = self_of(m);
    nb_status st = NB_OK;
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    const nb_params *ps = nb_parameters(m);
    for (int i = 0; model && st == NB_OK && i < ps->count; i++) {
        nb_tensor *w = whole(s, ps->names[i], ps->tensors[i]);
        st = w ? nb_state_list_add(model, NULL, ps->names[i], w) : nb_last_status();
    }
    const nb_params *os = opt && state && st == NB_OK ? nb_optim_state(opt) : NULL;
    for (int i = 0; os && st == NB_OK && i < os->count; i++) {
        const char *pn = state_param(os->names[i], os->tensors[i]);
        nb_tensor *w = pn ? whole(s, pn, os->tensors[i]) : nb_clone(os->tensors[i]);
        st = w ? nb_state_list_add(state, NULL, os->names[i], w) : nb_last_status();
    }
    if (os) nb_optim_state_release(opt);
    nb_scope_end();
    nb_set_grad_enabled(prev);
    return st;
}

nb_status nb_gpt_tp_save(nb_module *m, nb_optim *opt, const char *path, bool write) {
    if (!nb_gpt_tp_is_gpt_tp(m) || (write && !path))
        return nb_set_error(NB_EINVAL, "nb_gpt_tp_save: needs a TP GPT (and a path where it writes)");
    nb_state_list model = {0}, state = {0}, l = {0};
    nb_status st = gather_all(m, opt, &model, &state);
    for (int i = 0; st == NB_OK && i < model.count; i++)
        st = nb_state_list_add(&l, "model.", model.names[i], model.tensors[i]);
    for (int i = 0; st == NB_OK && i < state.count; i++)
        st = nb_state_list_add(&l, "optim.", state.names[i], state.tensors[i]);
    if (st == NB_OK && write) {
        const char *k[] = {"format"}, *v[] = {"nabla gpt (consolidated from tensor parallel)"};
        st = nb_safetensors_save(path, l.names, l.tensors, l.count, k, v, 1);
    }
    nb_state_list_deinit(&l);
    nb_state_list_deinit(&model);
    nb_state_list_deinit(&state);
    return st;
}

nb_status nb_gpt_tp_consolidate(nb_module *m, nb_optim *opt, nb_module *full, nb_optim *full_opt) {
    if (!nb_gpt_tp_is_gpt_tp(m) || (full && !nb_gpt_get_config(full)))
        return nb_set_error(NB_EINVAL, "nb_gpt_tp_consolidate: needs a TP GPT (and a GPT made by "
                            "nb_gpt_new)");
    nb_state_list model = {0}, state = {0};
    nb_status st = gather_all(m, opt, &model, opt ? &state : NULL);
    bool prev = nb_set_grad_enabled(false);
    for (int i = 0; full && st == NB_OK && i < model.count; i++) {
        nb_tensor *dst = nb_module_find(full, model.names[i]);
        st = dst ? nb_copy_(dst, model.tensors[i]) : nb_last_status();
    }
    nb_set_grad_enabled(prev);
    if (st == NB_OK && full_opt && opt)
        st = nb_optim_load_state(full_opt, state.names, state.tensors, state.count);
    nb_state_list_deinit(&model);
    nb_state_list_deinit(&state);
    return st;
}

/* The tensor called name in l, or NULL. */
static nb_tensor *list_get(const nb_state_list *l, const char *name) {
    for (int i = 0; i < l->count; i++)
        if (strcmp(l->names[i], name) == 0) return l->tensors[i];
    return NULL;
}

/* Load the whole (1-rank) model in model (names without prefix) and, when optim is given,
 * the whole optimizer state, sliced for this rank (m a TP GPT, or a 1-rank GPT: no slicing);
 * the model is checked before anything changes. rest given: the rest of the checkpoint
 * from the nb_checkpoint file path into it (the optimizer state from optim) before the
 * weights change. path names the source in messages. */
static nb_status load_whole(nb_module *m, nb_optim *opt, const char *path,
                            const nb_state_list *model, const nb_state_list *optim,
                            nb_checkpoint *rest) {
    const tp_self *s = nb_gpt_tp_is_gpt_tp(m) ? self_of(m) : NULL; /* NULL: a 1-rank GPT */
    const tp_self one = {.tp = 1, .rank = 0};
    if (!s) s = &one;
    const nb_params *ps = nb_parameters(m);
    nb_status st = NB_OK;
    nb_state_list mine = {0}, state = {0};
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    for (int i = 0; st == NB_OK && i < ps->count; i++) {
        nb_tensor *w = list_get(model, ps->names[i]);
        nb_tensor *sl = w ? slice_of(nb_to_dtype(w, nb_tensor_dtype(ps->tensors[i])),
                                     split_of(ps->names[i]), s->rank, s->tp) : NULL;
        if (!w)
            st = nb_set_error(NB_EINVAL, "nb_gpt_tp_load: %s has no tensor \"%s\" (a model of "
                              "another shape?)", path, ps->names[i]);
        else if (!sl || nb_ndim(sl) != nb_ndim(ps->tensors[i]) ||
                 nb_numel(sl) != nb_numel(ps->tensors[i]))
            st = nb_set_error(NB_ESHAPE, "nb_gpt_tp_load: %s: \"%s\" does not fit this model's "
                              "shape", path, ps->names[i]);
        else
            st = nb_state_list_add(&mine, NULL, ps->names[i], sl);
    }
    if (st == NB_OK && opt && optim) {
        for (int i = 0; st == NB_OK && i < optim->count; i++) {
            const char *pn = state_param(optim->names[i], optim->tensors[i]);
            nb_tensor *t = pn && split_of(pn) != REPLICATED
                               ? slice_of(optim->tensors[i], split_of(pn), s->rank, s->tp)
                               : optim->tensors[i];
            st = t ? nb_state_list_add(&state, NULL, optim->names[i], t) : nb_last_status();
        }
        if (st == NB_OK && !rest)
            st = nb_optim_load_state(opt, state.names, state.tensors, state.count);
    }
    if (st == NB_OK && rest) { /* the rest of the checkpoint, the optimizer state from state */
        nb_checkpoint_load_opts o = {.skip_model = true, .optim = opt,
                                     .optim_names = (const char *const *)state.names,
                                     .optim_tensors = (nb_tensor *const *)state.tensors,
                                     .optim_n = state.count};
        st = nb_checkpoint_load_ex(path, rest, &o);
    }
    for (int i = 0; st == NB_OK && i < mine.count; i++)
        st = nb_copy_(ps->tensors[i], mine.tensors[i]);
    nb_scope_end();
    nb_set_grad_enabled(prev);
    nb_state_list_deinit(&mine);
    nb_state_list_deinit(&state);
    return st;
}

static nb_status load_dir(nb_module *m, nb_optim *opt, const char *dir);

nb_status nb_gpt_tp_load(nb_module *m, nb_optim *opt, const char *path) {
    if (!nb_gpt_tp_is_gpt_tp(m)) return nb_set_error(NB_EINVAL, "nb_gpt_tp_load: not a TP GPT");
    if (!path) return nb_set_error(NB_ENULL, "nb_gpt_tp_load: NULL path");
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) return load_dir(m, opt, path);
    nb_safetensors *f = nb_safetensors_open(path);
    if (!f) return nb_last_status();
    const bool ckpt = nb_safetensors_find(f, "model.transformer.wte.weight") >= 0;
    nb_state_list model = {0}, optim = {0};
    nb_status st = nb_state_list_add_file(&model, f, ckpt ? "model." : "");
    if (st == NB_OK && ckpt && opt) st = nb_state_list_add_file(&optim, f, "optim.");
    if (st == NB_OK) st = load_whole(m, opt, path, &model, ckpt ? &optim : NULL, NULL);
    nb_state_list_deinit(&model);
    nb_state_list_deinit(&optim);
    nb_safetensors_close(f);
    return st;
}

/* ---- sharded checkpoints ----------------------------------------------------------------------
 * A directory: tp-<id>-<r>-of-<T>.safetensors per tp rank (written by data-parallel rank 0 as
 * an nb_checkpoint file: "model.<name>" holds the rank's slice of each parameter under the
 * 1-rank model's names, "optim.<entry>" its optimizer state; metadata "config.tp_slice.<name>"
 * = "<dim> <start> <length>" of a split parameter in the 1-rank tensor, c_attn's as "qkv
 * <rank> <T>": q, k and v rows of the rank's heads) and index.safetensors (metadata: format
 * "nabla-tp", tp, step, "shard.<r>" = file name), written last, by world rank 0, once every
 * rank's file is durable; then the files of earlier saves go. */

static nb_status tp_agree_all(const tp_self *s, nb_comm *dp, nb_status st) {
    st = nb__zoo_agree(s->c, st, "tensor-parallel checkpoint");
    return nb__zoo_agree(dp, st, "tensor-parallel checkpoint");
}

static bool tp_writer(nb_comm *dp) { return !dp || nb_comm_rank(dp) == 0; }

static void shard_name(char *buf, size_t n, const char *id, int r, int T) {
    snprintf(buf, n, "tp-%s-%d-of-%d.safetensors", id, r, T);
}

/* The save's directory and id (tp rank 0's); the directory created; this rank's file written
 * now or (w given) handed to w. Local but for the id's broadcast: the caller agrees. */
static nb_status tp_save_begin(const nb_checkpoint *c, nb_comm *dp, nb_checkpoint_writer *w,
                               const char *base, int keep, char dir[4400], char id[20]) {
    const char *who = "nb_gpt_tp_save_sharded";
    nb_module *m = c->model;
    const tp_self *s = self_of(m);
    const int64_t step = c->step;
    nb_status st = nb_checkpoint_target(base, step, keep, dir, 4400);
    uint64_t idv = s->rank == 0 ? nb__zoo_fresh_id() : 0;
    if (s->tp > 1) {
        nb_scope_begin();
        nb_tensor *t = nb_from_buffer(&idv, (int64_t[]){1}, 1, NB_I64);
        nb_status bs = t ? nb_broadcast(s->c, t, 0) : nb_last_status();
        if (bs == NB_OK) memcpy(&idv, nb_data(t), sizeof idv);
        nb_scope_end();
        if (st == NB_OK) st = bs;
    }
    snprintf(id, 20, "%016" PRIx64, idv);
    /* every file names tp rank 0's run id (each process draws its own) */
    char run[40] = {0};
    snprintf(run, sizeof run, "%s", nb_checkpoint_run_id(c));
    if (s->tp > 1) {
        nb_scope_begin();
        nb_tensor *t = nb_from_buffer(run, (int64_t[]){5}, 1, NB_I64);
        nb_status bs = t ? nb_broadcast(s->c, t, 0) : nb_last_status();
        if (bs == NB_OK) memcpy(run, nb_data(t), sizeof run);
        nb_scope_end();
        run[32] = 0;
        if (st == NB_OK) st = bs;
    }
    if (st != NB_OK || !tp_writer(dp)) return st;
    if (mkdir(dir, 0777) != 0) {
        struct stat sb;
        if (errno != EEXIST)
            return nb_set_error(NB_EIO, "%s: cannot create %s: %s", who, dir, strerror(errno));
        if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
            return nb_set_error(NB_EIO, "%s: %s exists and is not a directory (a sharded "
                                "checkpoint is a directory); refusing to replace it", who, dir);
    }
    /* the slices' places in the 1-rank tensors */
    const nb_params *ps = nb_parameters(m);
    const int nc = c->nconfig > 0 ? c->nconfig : 0;
    int n = 0;
    const char **keys = calloc((size_t)(ps->count + nc) + 2, sizeof *keys);
    const char **vals = calloc((size_t)(ps->count + nc) + 2, sizeof *vals);
    char *buf = calloc((size_t)ps->count + 2, 640);
    for (int i = 0; keys && vals && i < nc; i++) /* the run's settings first */
        keys[n] = c->config_names ? c->config_names[i] : NULL,
        vals[n++] = c->config_values ? c->config_values[i] : NULL;
    int nb = 0;
    if (!keys || !vals || !buf) st = nb_set_error(NB_ENOMEM, "%s: out of memory", who);
    for (int i = 0; st == NB_OK && i < ps->count; i++) {
        split k = split_of(ps->names[i]);
        if (k == REPLICATED) continue;
        char *key = buf + (size_t)nb++ * 640, *val = key + 512;
        snprintf(key, 512, "tp_slice.%s", ps->names[i]);
        int dim = k == COLS ? 1 : 0;
        int64_t len = nb_size(ps->tensors[i], dim);
        if (k == QKV) snprintf(val, 128, "qkv %d %d", s->rank, s->tp);
        else snprintf(val, 128, "%d %lld %lld", dim, (long long)(len * s->rank), (long long)len);
        keys[n] = key, vals[n++] = val;
    }
    char name[96], path[4600];
    shard_name(name, sizeof name, id, s->rank, s->tp);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    nb_checkpoint ck = *c;
    ck.config_names = keys, ck.config_values = vals, ck.nconfig = n;
    memcpy(ck.run_id, run, sizeof ck.run_id - 1); /* run holds 32 hex digits and a NUL */
    ck.run_id[sizeof ck.run_id - 1] = 0;
    if (st == NB_OK) st = w ? nb_checkpoint_writer_save(w, path, &ck) : nb_checkpoint_save(path, &ck);
    free(keys);
    free(vals);
    free(buf);
    return st;
}

/* tp rank 0 of dp rank 0, every file durable: the index, then older files and rotation. */
static nb_status tp_write_index(const tp_self *s, nb_comm *dp, const char *dir, const char *base,
                                int keep, const char *id, int64_t step) {
    if (s->rank != 0 || !tp_writer(dp)) return NB_OK;
    char path[4600], tps[32], steps[32];
    snprintf(path, sizeof path, "%s/index.safetensors", dir);
    snprintf(tps, sizeof tps, "%d", s->tp);
    snprintf(steps, sizeof steps, "%lld", (long long)step);
    int n = 0, cap = 4 + s->tp;
    const char **keys = calloc((size_t)cap, sizeof *keys), **vals = calloc((size_t)cap, sizeof *vals);
    char *names = calloc((size_t)s->tp, 160);
    nb_status st = NB_OK;
    if (!keys || !vals || !names) st = nb_set_error(NB_ENOMEM, "nb_gpt_tp_save_sharded: out of memory");
    if (st == NB_OK) {
        keys[n] = "format", vals[n++] = "nabla-tp";
        keys[n] = "tp", vals[n++] = tps;
        keys[n] = "step", vals[n++] = steps;
        for (int r = 0; r < s->tp; r++) {
            char *k = names + (size_t)r * 160;
            snprintf(k, 32, "shard.%d", r);
            shard_name(k + 32, 128, id, r, s->tp);
            keys[n] = k, vals[n++] = k + 32;
        }
        st = nb_safetensors_save(path, NULL, NULL, 0, keys, vals, n);
    }
    free(keys);
    free(vals);
    free(names);
    if (st != NB_OK) return st;
    nb__zoo_remove_old_files(dir, "tp-", id);
    nb_checkpoint_rotate(base, keep, dir);
    return NB_OK;
}

nb_status nb_gpt_tp_save_sharded(const nb_checkpoint *c, nb_comm *dp, const char *base, int keep) {
    if (!c || !nb_gpt_tp_is_gpt_tp(c->model) || !base)
        return nb_set_error(NB_EINVAL, "nb_gpt_tp_save_sharded: needs a checkpoint of a TP GPT and "
                            "a directory");
    if (keep < 0)
        return nb_set_error(NB_EINVAL, "nb_gpt_tp_save_sharded: keep %d is negative", keep);
    const tp_self *s = self_of(c->model);
    char dir[4400], id[20];
    nb_status st = tp_agree_all(s, dp, tp_save_begin(c, dp, NULL, base, keep, dir, id));
    if (st == NB_OK) st = tp_write_index(s, dp, dir, base, keep, id, c->step);
    return tp_agree_all(s, dp, st);
}

nb_status nb_gpt_tp_save_wait(nb_module *m, nb_comm *dp, nb_checkpoint_writer *w) {
    if (!nb_gpt_tp_is_gpt_tp(m) || !w)
        return nb_set_error(NB_EINVAL, "nb_gpt_tp_save_wait: needs a TP GPT and a writer");
    tp_self *s = nb_module_self(m);
    if (!s->inflight.pending) return NB_OK; /* the same on every rank: the same calls */
    s->inflight.pending = false;
    nb_status st = tp_agree_all(s, dp, tp_writer(dp) ? nb_checkpoint_writer_wait(w) : NB_OK);
    if (st != NB_OK) return st; /* no index: that save does not exist */
    st = tp_write_index(s, dp, s->inflight.dir, s->inflight.base, s->inflight.keep,
                        s->inflight.id, s->inflight.step);
    return tp_agree_all(s, dp, st);
}

nb_status nb_gpt_tp_save_async(const nb_checkpoint *c, nb_comm *dp, nb_checkpoint_writer *w,
                               const char *base, int keep) {
    if (!c || !nb_gpt_tp_is_gpt_tp(c->model) || !w || !base)
        return nb_set_error(NB_EINVAL, "nb_gpt_tp_save_async: needs a checkpoint of a TP GPT, a "
                            "writer and a directory");
    nb_module *m = c->model;
    tp_self *s = nb_module_self(m);
    if (keep < 0)
        return nb_set_error(NB_EINVAL, "nb_gpt_tp_save_async: keep %d is negative", keep);
    if (strlen(base) >= sizeof s->inflight.base)
        return nb_set_error(NB_EINVAL, "nb_gpt_tp_save_async: the directory name is too long");
    nb_status st = nb_gpt_tp_save_wait(m, dp, w);
    if (st != NB_OK) return st;
    char dir[4400], id[20];
    st = tp_agree_all(s, dp, tp_save_begin(c, dp, w, base, keep, dir, id));
    if (st != NB_OK) {
        if (tp_writer(dp)) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", nb_last_error());
            nb_checkpoint_writer_wait(w);
            st = nb_set_error(st, "%s", msg);
        }
        return st;
    }
    s->inflight.pending = true;
    s->inflight.keep = keep;
    s->inflight.step = c->step;
    snprintf(s->inflight.dir, sizeof s->inflight.dir, "%s", dir);
    snprintf(s->inflight.base, sizeof s->inflight.base, "%s", base);
    snprintf(s->inflight.id, sizeof s->inflight.id, "%s", id);
    return NB_OK;
}

/* The whole model (names without prefix) and, optim given, optimizer state of the sharded
 * checkpoint dir, assembled from its slices; *step from the index (may be NULL). */
static nb_status assemble_dir(const char *dir, const char *who, nb_state_list *model,
                              nb_state_list *optim, int64_t *step, char first[4600]) {
    char path[4600];
    snprintf(path, sizeof path, "%s/index.safetensors", dir);
    nb_safetensors *ix = nb_safetensors_open(path);
    if (!ix)
        return nb_set_error(NB_EIO, "%s: %s is not a finished tensor-parallel checkpoint (no "
                            "readable index.safetensors): %s", who, dir, nb_last_error());
    const char *fmt = nb_safetensors_metadata(ix, "format"), *ts = nb_safetensors_metadata(ix, "tp"),
               *ks = nb_safetensors_metadata(ix, "step");
    const int T = ts ? atoi(ts) : 0;
    if (step) *step = ks ? atoll(ks) : 0;
    nb_status st = NB_OK;
    if (!fmt || strcmp(fmt, "nabla-tp") != 0 || T < 1 || T > 65536)
        st = nb_set_error(NB_EFORMAT, "%s: %s/index.safetensors is not a tensor-parallel "
                          "checkpoint index", who, dir);
    nb_safetensors **f = st == NB_OK ? calloc((size_t)T, sizeof *f) : NULL;
    if (st == NB_OK && !f) st = nb_set_error(NB_ENOMEM, "%s: out of memory", who);
    for (int r = 0; st == NB_OK && r < T; r++) {
        char key[32];
        snprintf(key, sizeof key, "shard.%d", r);
        const char *v = nb_safetensors_metadata(ix, key);
        if (!v || strchr(v, '/')) {
            st = nb_set_error(NB_EFORMAT, "%s: %s/index.safetensors names no shard %d", who, dir, r);
            break;
        }
        snprintf(path, sizeof path, "%s/%s", dir, v);
        if (r == 0 && first) snprintf(first, 4600, "%s", path);
        if (!(f[r] = nb_safetensors_open(path)))
            st = nb_set_error(NB_EIO, "%s: shard %s is missing or unreadable", who, path);
        else if (nb_safetensors_verify(f[r], NULL) != NB_OK) /* torn or bit-flipped */
            st = nb_set_error(NB_EFORMAT, "%s: shard %s is corrupt: %s", who, path, nb_last_error());
    }
    nb_safetensors_close(ix);
    nb_tensor **parts = st == NB_OK ? calloc((size_t)T, sizeof *parts) : NULL;
    if (st == NB_OK && !parts) st = nb_set_error(NB_ENOMEM, "%s: out of memory", who);
    bool prev = nb_set_grad_enabled(false);
    for (int i = 0; st == NB_OK && i < nb_safetensors_count(f[0]); i++) {
        const char *n = nb_safetensors_name(f[0], i);
        bool is_model = strncmp(n, "model.", 6) == 0, is_optim = strncmp(n, "optim.", 6) == 0;
        if (!is_model && !(is_optim && optim)) continue;
        nb_scope_begin();
        nb_tensor *t0 = nb_safetensors_get(f[0], n);
        const char *pn = !t0 ? NULL : is_model ? n + 6 : state_param(n + 6, t0);
        split k = pn ? split_of(pn) : REPLICATED;
        nb_tensor *w = t0;
        if (t0 && k != REPLICATED) {
            parts[0] = t0;
            for (int r = 1; r < T && w; r++)
                if (!(parts[r] = nb_safetensors_get(f[r], n))) w = NULL;
            w = w ? nb_cat(parts, T, k == COLS ? 1 : 0) : NULL;
            if (w && k == QKV) w = unshuffle_qkv(w, T);
        }
        if (!w) st = nb_last_status();
        else st = nb_state_list_add(is_model ? model : optim, NULL, n + 6, w);
        nb_scope_end();
    }
    nb_set_grad_enabled(prev);
    free(parts);
    for (int r = 0; f && r < T; r++) nb_safetensors_close(f[r]);
    free(f);
    return st;
}

static nb_status load_dir(nb_module *m, nb_optim *opt, const char *dir) {
    nb_state_list model = {0}, optim = {0};
    nb_status st = assemble_dir(dir, "nb_gpt_tp_load", &model, opt ? &optim : NULL, NULL, NULL);
    if (st == NB_OK) st = load_whole(m, opt, dir, &model, opt ? &optim : NULL, NULL);
    nb_state_list_deinit(&model);
    nb_state_list_deinit(&optim);
    return st;
}

nb_status nb_gpt_tp_consolidate_dir(const char *dir, const char *out, int64_t *step) {
    if (!dir || !out) return nb_set_error(NB_ENULL, "nb_gpt_tp_consolidate_dir: NULL argument");
    nb_state_list model = {0};
    nb_status st = assemble_dir(dir, "nb_gpt_tp_consolidate_dir", &model, NULL, step, NULL);
    const char *keys[] = {"format"}, *vals[] = {"pt"};
    if (st == NB_OK)
        st = nb_safetensors_save(out, model.names, model.tensors, model.count, keys, vals, 1);
    nb_state_list_deinit(&model);
    return st;
}

bool nb_gpt_tp_is_checkpoint(const char *dir) {
    char path[4600];
    if (!dir || snprintf(path, sizeof path, "%s/index.safetensors", dir) >= (int)sizeof path ||
        access(path, F_OK) != 0)
        return false;
    nb_safetensors *f = nb_safetensors_open(path);
    if (!f) {
        nb_clear_error();
        return false;
    }
    const char *fmt = nb_safetensors_metadata(f, "format");
    bool ok = fmt && strcmp(fmt, "nabla-tp") == 0;
    nb_safetensors_close(f);
    return ok;
}

nb_status nb_gpt_tp_checkpoint_load(const char *dir, nb_checkpoint *c) {
    if (!dir || !c || !(nb_gpt_tp_is_gpt_tp(c->model) || nb_gpt_get_config(c->model)))
        return nb_set_error(NB_EINVAL, "nb_gpt_tp_checkpoint_load: needs a directory and a "
                            "checkpoint of a GPT (TP or 1-rank)");
    nb_state_list model = {0}, optim = {0};
    char first[4600];
    nb_status st = assemble_dir(dir, "nb_gpt_tp_checkpoint_load", &model, &optim, NULL, first);
    if (st == NB_OK) st = load_whole(c->model, c->optim, first, &model, &optim, c);
    nb_state_list_deinit(&model);
    nb_state_list_deinit(&optim);
    return st;
}

/* ---- what the pipeline's tensor-parallel stages use (zoo/gpt_impl.h) ------------------------ */
nb__gpt_tp *nb__gpt_tp_new(const nb_gpt_config *cfg, nb_comm *tp, bool sp) {
    if (!cfg || !tp) {
        nb_set_error(NB_ENULL, "gpt_tp: NULL config or communicator");
        return NULL;
    }
    const int n = nb_comm_size(tp);
    if (cfg->n_head % n || cfg->vocab_size % n) {
        nb_set_error(NB_EINVAL, "nb_gpt_tp: the tensor-parallel size %d must divide n_head (%lld) "
                     "and vocab_size (%lld)", n, (long long)cfg->n_head, (long long)cfg->vocab_size);
        return NULL;
    }
    tp_self *s = malloc(sizeof *s);
    if (!s) {
        nb_set_error(NB_ENOMEM, "gpt_tp: out of memory");
        return NULL;
    }
    *s = (tp_self){.cfg = *cfg, .c = tp, .sp = sp && n > 1, .tp = n, .rank = nb_comm_rank(tp)};
    return s;
}

nb_module *nb__gpt_tp_block(const nb__gpt_tp *s, nb_module *block) {
    return tp_block(block, "", s);
}

bool nb__gpt_tp_sharded(const char *name) { return split_of(name) != REPLICATED; }

nb_tensor *nb__gpt_tp_slice(const nb__gpt_tp *s, const char *name, nb_tensor *whole) {
    return slice_of(whole, split_of(name), s->rank, s->tp);
}

nb_tensor *nb__gpt_tp_whole(const nb__gpt_tp *s, const char *name, nb_tensor *slice) {
    bool prev = nb_set_grad_enabled(false);
    nb_tensor *w = whole(s, name, slice);
    nb_set_grad_enabled(prev);
    return w;
}

nb_tensor *nb__gpt_tp_assemble(const char *name, nb_tensor *const *parts, int n) {
    split k = split_of(name);
    if (k == REPLICATED || n == 1) return nb_clone(parts[0]);
    bool prev = nb_set_grad_enabled(false);
    nb_tensor *w = nb_cat(parts, n, k == COLS ? 1 : 0);
    if (w && k == QKV) w = unshuffle_qkv(w, n);
    nb_set_grad_enabled(prev);
    return w;
}

const char *nb__gpt_tp_state_param(const char *entry, const nb_tensor *t) {
    return state_param(entry, t);
}

nb_tensor *nb__gpt_tp_embed(const nb__gpt_tp *s, nb_module *m, nb_tensor *wte, nb_tensor *wpe,
                            nb_tensor *idx) {
    return embed(s, m, wte, wpe, idx);
}

nb_tensor *nb__gpt_tp_head_loss(const nb__gpt_tp *s, nb_tensor *x, nb_tensor *wte,
                                nb_tensor *targets) {
    nb_tensor *logits = nb_linear(enter(s, x), wte, NULL); /* this rank's (B, T, V/tp) */
    return nb_vocab_parallel_cross_entropy(nb_view(logits, (int64_t[]){-1, s->cfg.vocab_size / s->tp}, 2),
                                           nb_reshape(targets, (int64_t[]){-1}, 1), s->c);
}
