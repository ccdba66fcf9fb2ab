/* gpt_pipe.c - the GPT split into pipeline stages (nabla/pipeline.h): this rank's blocks
 * under the full model's names, the stage function the schedule engine (parallel/pipeline.c)
 * runs, and the training step: tied-embedding gradients summed between the first and last
 * stage, data-parallel averaging, the global norm over every stage, the optimizer step. */
#include "nabla/nabla.h"
#include "nabla/pipeline.h"
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

struct nb_gpt_pipe {
    nb_gpt_config cfg;         /* resolved; the blocks borrow it */
    nb_gpt_pipe_opts o;
    nb_comm *pp, *dp, *embed;  /* embed: first and last rank (p > 1), else NULL */
    nb_zero *zero;             /* nb_gpt_pipe_set_zero's (borrowed), NULL: plain allreduces */
    nb_comm *tp;               /* the stage's tensor-parallel group (size > 1), else NULL */
    nb__gpt_tp *tps;           /* its settings (tp given), which the TP blocks borrow */
    int tp_size, tp_rank;
    int p, r, v, S;
    int64_t *bounds;           /* S + 1 */
    nb_module *root;           /* "transformer" -> wte, wpe, h.<i>, ln_f */
    nb_module **blocks;        /* [n_layer], NULL where not ours */
    nb_tensor *wte, *wpe;      /* borrowed from root, NULL where not ours */
    nb_module *ln_f;
    /* the current step's micro-batches */
    nb_tensor **mx, **my;
    /* dropout: the stream positions one process would be at (see set_dropout_offset) */
    nb_generator *drop;                /* NULL: no dropout this step */
    uint64_t drop_base, d_emb, d_blk;  /* step start; draws of the embedding dropout, a block */
    int64_t drop_b, drop_T;            /* the micro-batch shape d_emb and d_blk were counted for */
    int64_t micro0;                    /* this dp rank's first micro-batch in the global order */
    /* nb_gpt_pipe_save_async's save in flight: its index is written once every stage file
     * is durable (at the next save or at nb_gpt_pipe_save_wait) */
    struct {
        bool pending;
        char dir[4400], base[4096], id[20];
        int keep;
        int64_t step;
        uint64_t drop;
    } inflight;
};

static const nb_module_vtable stage_vt = {.type_name = "GPTPipeStage"};
static const nb_module_vtable dict_vt = {.type_name = "ModuleDict"};
static const nb_module_vtable emb_vt = {.type_name = "Embedding"};

nb_gpt_pipe_opts nb_gpt_pipe_defaults(void) {
    return (nb_gpt_pipe_opts){.schedule = NB_PIPE_1F1B, .n_micro = 4, .virtual_stages = 1};
}

nb_module *nb_gpt_pipe_module(const nb_gpt_pipe *p) { return p ? p->root : NULL; }

nb_status nb_gpt_pipe_set_zero(nb_gpt_pipe *p, nb_zero *z) {
    if (!p) return nb_set_error(NB_ENULL, "nb_gpt_pipe_set_zero: the pipeline is NULL");
    if (z && nb_zero_stage(z) == 3)
        return nb_set_error(NB_EINVAL, "nb_gpt_pipe_set_zero: ZeRO stage 3 is not supported with "
                            "pipeline parallelism (stages 0, 1 and 2 are)");
    p->zero = z;
    return NB_OK;
}

const int64_t *nb_gpt_pipe_boundaries(const nb_gpt_pipe *p, int *n_stages) {
    if (n_stages) *n_stages = p ? p->S : 0;
    return p ? p->bounds : NULL;
}

void nb_gpt_pipe_free(nb_gpt_pipe *p) {
    if (!p) return;
    nb_module_free(p->root);
    free(p->tps); /* after the blocks that borrow it */
    nb_comm_free(p->embed);
    free(p->blocks);
    free(p->bounds);
    free(p->mx);
    free(p->my);
    free(p);
}

/* Parameters of one block, and those outside the blocks on stage s of S (gpt.h's names). */
static int64_t block_params(const nb_gpt_config *c) {
    const int64_t C = c->n_embd;
    return 12 * C * C + (c->no_bias ? 2 * C : 13 * C);
}
static int64_t extra_params(const nb_gpt_config *c, int s, int S) {
    const int64_t C = c->n_embd, wte = c->vocab_size * C;
    int64_t e = 0;
    if (s == 0) e += wte + c->block_size * C;                       /* wte, wpe */
    if (s == S - 1) e += (s == 0 ? 0 : wte) + (c->no_bias ? C : 2 * C); /* the head's wte, ln_f */
    return e;
}

/* The layer counts (each >= 1) that minimize the largest stage's parameters: the least bound M
 * whose per-stage capacities floor((M - extra) / block) hold every layer (binary search), then
 * each layer to the stage with the fewest parameters that has room. S <= n_layer. */
static void balance(const nb_gpt_config *c, int S, int64_t *bounds) {
    const int64_t Pb = block_params(c), L = c->n_layer;
    int64_t lo = 0, hi = 0;
    for (int s = 0; s < S; s++) {
        int64_t e = extra_params(c, s, S) + Pb;
        if (e > lo) lo = e;
    }
    hi = lo + L * Pb; /* always enough */
    while (lo < hi) {
        int64_t M = lo + (hi - lo) / 2, room = 0;
        bool ok = true;
        for (int s = 0; s < S && ok; s++) {
            int64_t cap = (M - extra_params(c, s, S)) / Pb;
            ok = cap >= 1;
            room += cap;
        }
        if (ok && room >= L) hi = M;
        else lo = M + 1;
    }
    int64_t *n = bounds + 1; /* counts first, prefix sums after */
    for (int s = 0; s < S; s++) n[s] = 1;
    for (int64_t left = L - S; left > 0; left--) {
        int best = -1;
        int64_t best_cost = 0;
        for (int s = 0; s < S; s++) {
            int64_t cost = extra_params(c, s, S) + (n[s] + 1) * Pb;
            if (cost <= lo && (best < 0 || cost < best_cost)) best = s, best_cost = cost;
        }
        n[best]++; /* lo has room for every layer, so some stage does */
    }
    bounds[0] = 0;
    for (int s = 0; s < S; s++) bounds[s + 1] += bounds[s];
}

/* Checks that need no communication, so every rank reports the same error. */
static bool check_layout(const nb_gpt_config *c, const nb_gpt_pipe_opts *o, int p, int S,
                         int64_t *bounds) {
    if (o->n_micro < 1 || o->virtual_stages < 1) {
        nb_set_error(NB_EINVAL, "nb_gpt_pipe_new: n_micro (%d) and virtual_stages (%d) must be >= 1",
                     o->n_micro, o->virtual_stages);
        return false;
    }
    if (o->virtual_stages > 1 && o->schedule != NB_PIPE_INTERLEAVED) {
        nb_set_error(NB_EINVAL, "nb_gpt_pipe_new: %d virtual stages need the interleaved schedule, "
                     "not %s", o->virtual_stages, nb_pipe_schedule_name(o->schedule));
        return false;
    }
    if (o->schedule == NB_PIPE_INTERLEAVED && o->n_micro % p) {
        nb_set_error(NB_EINVAL, "nb_gpt_pipe_new: the interleaved schedule needs the micro-batches "
                     "(%d) to be a multiple of the pipeline stages (%d)", o->n_micro, p);
        return false;
    }
    if (c->n_layer < S) {
        nb_set_error(NB_EINVAL, "nb_gpt_pipe_new: %lld layers cannot fill %d stages (%d ranks x %d "
                     "virtual stages): each stage needs at least one layer",
                     (long long)c->n_layer, S, p, o->virtual_stages);
        return false;
    }
    if (o->boundaries) {
        for (int s = 0; s <= S; s++) bounds[s] = o->boundaries[s];
        bool ok = bounds[0] == 0 && bounds[S] == c->n_layer;
        for (int s = 0; ok && s < S; s++) ok = bounds[s + 1] > bounds[s];
        if (!ok) {
            nb_set_error(NB_EINVAL, "nb_gpt_pipe_new: the boundaries must be %d increasing layer "
                         "indices from 0 to n_layer (%lld)", S + 1, (long long)c->n_layer);
            return false;
        }
    } else if (o->balance_params && S > 1) {
        balance(c, S, bounds);
    } else {
        int64_t base = c->n_layer / S, extra = c->n_layer % S;
        bounds[0] = 0;
        for (int s = 0; s < S; s++) bounds[s + 1] = bounds[s] + base + (s < extra ? 1 : 0);
    }
    return true;
}

/* A parameter: a new N(0, std) tensor drawn from init, added to m when keep, else dropped
 * (the draws are made either way, so later tensors get nb_gpt_new's values). */
static bool draw_param(nb_module *m, bool keep, const char *name, const int64_t *shape,
                       double std, nb_generator *init, const nb__gpt_tp *tps, const char *full) {
    nb_scope_begin();
    nb_tensor *t = nb_normal(shape, 2, NB_F32, 0.0, std, init);
    if (t && keep && tps && nb__gpt_tp_sharded(full)) t = nb__gpt_tp_slice(tps, full, t);
    bool ok = t != NULL;
    if (ok && keep) ok = nb_module_add_parameter(m, name, t) != NULL; /* adopts it from the scope */
    nb_scope_end();
    return ok;
}

nb_gpt_pipe *nb_gpt_pipe_new(const nb_gpt_config *cfg, nb_generator *init, nb_comm *pp,
                             nb_comm *dp, const nb_gpt_pipe_opts *opts) {
    if (!pp) {
        nb_set_error(NB_ENULL, "nb_gpt_pipe_new: the pipeline communicator is NULL");
        return NULL;
    }
    nb_gpt_pipe *p = calloc(1, sizeof *p);
    if (!p) {
        nb_set_error(NB_ENOMEM, "nb_gpt_pipe_new: out of memory");
        return NULL;
    }
    p->o = opts ? *opts : nb_gpt_pipe_defaults();
    p->pp = pp;
    p->dp = dp;
    p->p = nb_comm_size(pp);
    p->r = nb_comm_rank(pp);
    p->v = p->o.virtual_stages < 1 ? 1 : p->o.virtual_stages;
    p->S = p->p * p->v;
    p->bounds = malloc(sizeof *p->bounds * (size_t)(p->S + 1));
    if (!p->bounds || !nb__gpt_resolve(cfg, &p->cfg) ||
        !check_layout(&p->cfg, &p->o, p->p, p->S, p->bounds)) {
        if (!p->bounds) nb_set_error(NB_ENOMEM, "nb_gpt_pipe_new: out of memory");
        nb_gpt_pipe_free(p);
        return NULL;
    }
    p->o.boundaries = NULL; /* copied into bounds */
    p->tp_size = p->o.tp ? nb_comm_size(p->o.tp) : 1;
    p->tp_rank = p->o.tp ? nb_comm_rank(p->o.tp) : 0;
    if (p->tp_size > 1) { /* n_head and vocab_size checked here, before any communication */
        p->tp = p->o.tp;
        if (!(p->tps = nb__gpt_tp_new(&p->cfg, p->tp, p->o.sequence_parallel))) {
            nb_gpt_pipe_free(p);
            return NULL;
        }
    }
    p->o.sequence_parallel = p->o.sequence_parallel && p->tps;
    const nb_gpt_config *c = &p->cfg;
    const bool first = p->r == 0, last = p->r == p->p - 1;
    p->blocks = calloc((size_t)c->n_layer, sizeof *p->blocks);
    p->root = nb_module_new(&stage_vt, NULL);
    nb_module *tr = p->root ? nb_module_add_child(p->root, "transformer",
                                                  nb_module_new(&dict_vt, NULL))
                            : NULL;
    nb_module *wte = NULL, *wpe = NULL, *h = NULL;
    bool ok = p->blocks && tr;
    if (ok && (first || last)) ok = (wte = nb_module_add_child(tr, "wte", nb_module_new(&emb_vt, NULL)));
    if (ok && first) ok = (wpe = nb_module_add_child(tr, "wpe", nb_module_new(&emb_vt, NULL)));
    ok = ok && (h = nb_module_add_child(tr, "h", nb_module_new(&dict_vt, NULL)));
    ok = ok && draw_param(wte, wte != NULL, "weight", (int64_t[]){c->vocab_size, c->n_embd}, 0.02,
                          init, p->tps, "transformer.wte.weight");
    ok = ok && draw_param(wpe, wpe != NULL, "weight", (int64_t[]){c->block_size, c->n_embd}, 0.02,
                          init, p->tps, "transformer.wpe.weight");
    for (int s = 0; ok && s < p->S; s++) {
        const bool mine = s % p->p == p->r;
        for (int64_t i = p->bounds[s]; ok && i < p->bounds[s + 1]; i++) {
            nb_module *b = nb__gpt_block_new(c, init);
            if (!b) {
                ok = false;
            } else if (mine) {
                char name[32];
                snprintf(name, sizeof name, "%lld", (long long)i);
                if (p->tps) { /* this rank's slices of the block */
                    nb_module *full = b;
                    b = nb__gpt_tp_block(p->tps, full);
                    nb_module_free(full);
                }
                ok = b && (p->blocks[i] = nb_module_add_child(h, name, b)) != NULL;
            } else {
                nb_module_free(b);
            }
        }
    }
    if (ok && last) ok = (p->ln_f = nb__gpt_add_layernorm(tr, "ln_f", c)) != NULL;
    if (ok && p->p > 1) {
        /* The tied embedding's group: the first and the last rank. Collective over pp. */
        p->embed = nb_comm_split(pp, first || last ? 0 : 1, p->r);
        ok = p->embed != NULL;
    }
    p->mx = calloc((size_t)p->o.n_micro, sizeof *p->mx);
    p->my = calloc((size_t)p->o.n_micro, sizeof *p->my);
    if (ok && (!p->mx || !p->my)) ok = !nb_set_error(NB_ENOMEM, "nb_gpt_pipe_new: out of memory");
    if (!ok) {
        nb_gpt_pipe_free(p);
        return NULL;
    }
    p->wte = wte ? nb_module_param(wte, "weight") : NULL;
    p->wpe = wpe ? nb_module_param(wpe, "weight") : NULL;
    return p;
}

/* ---- the stage function --------------------------------------------------------------------- */
static nb_tensor *stage_dropout(const nb_gpt_pipe *p, nb_tensor *x) {
    if (!(p->cfg.dropout > 0) || !nb_module_is_training(p->root)) return x;
    return nb_dropout(x, p->cfg.dropout, true, p->cfg.dropout_gen);
}

/* Dropout gives one process's masks whatever the layout: one process draws, for global
 * micro-batch j (dp rank d's micro-batch i is j = d m + i), the embedding's mask and then each
 * block's in order, from the offset base + j (d_emb + n_layer d_blk) on; the backward draws
 * nothing. So before stage s computes micro-batch i its generator is put where one process
 * would be at stage s's first layer. */
static void set_dropout_offset(nb_gpt_pipe *p, int s, int micro) {
    const uint64_t per = p->d_emb + (uint64_t)p->cfg.n_layer * p->d_blk;
    uint64_t at = p->drop_base + (uint64_t)(p->micro0 + micro) * per;
    if (s > 0) at += p->d_emb + (uint64_t)p->bounds[s] * p->d_blk;
    nb_generator_set_offset(p->drop, at);
}

/* Count the draws of the embedding's dropout and of one block for micro-batches (b, T), by
 * running them on zeros and rewinding the stream. */
static nb_status count_dropout_draws(nb_gpt_pipe *p, int64_t b, int64_t T) {
    if (p->drop_b == b && p->drop_T == T) return NB_OK;
    const uint64_t base = nb_generator_offset(p->drop);
    nb_module *blk = NULL;
    for (int64_t i = 0; i < p->cfg.n_layer && !blk; i++) blk = p->blocks[i];
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_tensor *z = nb_zeros((int64_t[]){b, T, p->cfg.n_embd}, 3, NB_F32);
    nb_status st = z && nb_dropout(z, p->cfg.dropout, true, p->drop) ? NB_OK : nb_last_status();
    p->d_emb = nb_generator_offset(p->drop) - base;
    nb_generator_set_offset(p->drop, base);
    /* a TP block (collective over tp) draws what the 1-rank block draws; with sequence
     * parallelism it takes this rank's (b, T/tp, C) shard */
    if (st == NB_OK && p->o.sequence_parallel)
        z = nb_zeros((int64_t[]){b, T / p->tp_size, p->cfg.n_embd}, 3, NB_F32);
    if (st == NB_OK && !(z && nb_forward(blk, z))) st = nb_last_status();
    p->d_blk = nb_generator_offset(p->drop) - base;
    nb_generator_set_offset(p->drop, base);
    nb_scope_end();
    nb_set_grad_enabled(prev);
    if (st == NB_OK) p->drop_b = b, p->drop_T = T;
    return st;
}

static nb_tensor *stage_fn(void *ctx, int chunk, int micro, nb_tensor *input) {
    nb_gpt_pipe *p = ctx;
    const int s = chunk * p->p + p->r;
    /* Under autocast each micro-batch casts the weights itself: with the cast cache, the
     * graphs of the micro-batches in flight (1F1B, GPipe) would share one cast node, which the
     * first of their backward passes frees. */
    if (nb_autocast_active() && nb_grad_enabled()) nb_autocast_clear_cache();
    if (p->drop) set_dropout_offset(p, s, micro);
    nb_tensor *x = input;
    if (s == 0 && p->tps) {
        x = nb__gpt_tp_embed(p->tps, p->root, p->wte, p->wpe, p->mx[micro]);
    } else if (s == 0) {
        nb_tensor *idx = p->mx[micro];
        x = nb_add(nb_embedding(p->wte, idx), nb_narrow(p->wpe, 0, 0, nb_size(idx, 1)));
        x = stage_dropout(p, x);
    }
    for (int64_t i = p->bounds[s]; x && i < p->bounds[s + 1]; i++) x = nb_forward(p->blocks[i], x);
    /* The activation travels in f32 (the residual stream is f32 under autocast too: bf16
     * matmul outputs are added to it), so the receiving stage's buffer always matches. */
    if (s < p->S - 1) return x && nb_tensor_dtype(x) != NB_F32 ? nb_to_dtype(x, NB_F32) : x;
    x = nb_forward(p->ln_f, x);
    if (p->tps) return x ? nb__gpt_tp_head_loss(p->tps, x, p->wte, p->my[micro]) : NULL;
    nb_tensor *logits = nb_linear(x, p->wte, NULL); /* the tied head */
    return nb_cross_entropy(nb_view(logits, (int64_t[]){-1, p->cfg.vocab_size}, 2),
                            nb_reshape(p->my[micro], (int64_t[]){-1}, 1), NULL);
}

nb_status nb_gpt_pipe_gather(nb_gpt_pipe *p, nb_module *full) {
    if (!p || !nb_gpt_get_config(full))
        return nb_set_error(NB_EINVAL, "nb_gpt_pipe_gather: needs a pipeline and a GPT made by "
                            "nb_gpt_new");
    const nb_params *ps = nb_parameters(p->root);
    nb_status st = NB_OK;
    bool prev = nb_set_grad_enabled(false);
    for (int i = 0; st == NB_OK && i < ps->count; i++) {
        nb_tensor *dst = nb_module_find(full, ps->names[i]);
        nb_scope_begin(); /* every rank of tp gathers, whatever dst */
        nb_tensor *w = p->tps ? nb__gpt_tp_whole(p->tps, ps->names[i], ps->tensors[i])
                              : ps->tensors[i];
        if (!w) st = nb_last_status();
        else if (!dst || nb_numel(dst) != nb_numel(w))
            st = nb_set_error(NB_EINVAL, "nb_gpt_pipe_gather: the GPT has no parameter %s of "
                              "%lld elements (another config?)", ps->names[i], (long long)nb_numel(w));
        else
            st = nb_copy_(dst, w);
        nb_scope_end();
    }
    nb_set_grad_enabled(prev);
    return st;
}

/* ---- the step -------------------------------------------------------------------------------- */
/* Sum of squares of the gradients this rank counts (wte once: on the first rank). */
static nb_status local_sq(const nb_gpt_pipe *p, const nb_params *ps, double *out) {
    double total = 0;
    nb_status st = NB_OK;
    for (int i = 0; st == NB_OK && i < ps->count; i++) {
        nb_tensor *g = nb_grad(ps->tensors[i]);
        if (!g || (ps->tensors[i] == p->wte && p->r != 0)) continue;
        /* over tp: the slices on every rank, the replicated tensors once (on tp rank 0) */
        if (p->tp_rank != 0 && !nb__gpt_tp_sharded(ps->names[i])) continue;
        int64_t n = nb_numel(g);
        double *buf = malloc(sizeof *buf * (size_t)(n ? n : 1));
        if (!buf) return nb_set_error(NB_ENOMEM, "nb_gpt_pipe_train_step: out of memory");
        st = nb_read(g, buf, n, NB_F64);
        for (int64_t k = 0; st == NB_OK && k < n; k++) total += buf[k] * buf[k];
        free(buf);
    }
    *out = total;
    return st;
}

/* Every gradient (or only `only`'s) reduced over c, one after the other. */
static nb_status allreduce_grads(nb_comm *c, const nb_params *ps, nb_tensor *only,
                                 nb_reduce_op op) {
    nb_status st = NB_OK;
    for (int i = 0; st == NB_OK && i < ps->count; i++) {
        nb_tensor *g = nb_grad(ps->tensors[i]);
        if (!g || (only && ps->tensors[i] != only)) continue;
        st = nb_allreduce(c, g, op);
    }
    return st;
}

/* *loss averaged over the data-parallel pipelines (every rank the same). Collective over dp. */
static nb_status mean_over_dp(const nb_gpt_pipe *p, double *loss) {
    if (!p->dp || nb_comm_size(p->dp) == 1) return NB_OK;
    nb_scope_begin();
    nb_tensor *t = nb_scalar(*loss, NB_F64);
    nb_status st = t ? nb_allreduce(p->dp, t, NB_REDUCE_AVG) : nb_last_status();
    if (st == NB_OK) *loss = nb_item_f64(t);
    nb_scope_end();
    return st;
}

/* Under ZeRO, after the tied embedding's sum: the gradients accumulated over the
 * micro-batches are reduce-scattered over dp, the norm is taken over the dp shards and the
 * stages (wte counted on the first rank), clipped, and the shard stepped. */
static double zero_tail(nb_gpt_pipe *p, nb_optim *opt, double loss, double grad_clip,
                        double *grad_norm, nb_pipe_stats *stats, double t0) {
    nb_zero_set_sync_enabled(p->zero, true);
    nb_status st = nb_zero_sync(p->zero);
    const nb_params *ps = nb_parameters(p->root);
    bool *skip = calloc((size_t)ps->count + 1, sizeof *skip);
    if (!skip) st = nb_set_error(NB_ENOMEM, "nb_gpt_pipe_train_step: out of memory");
    /* counted once: the tied wte on the first stage, a replicated tensor of a TP stage on
     * tp rank 0 (slices on every tp rank) */
    for (int i = 0; skip && i < ps->count; i++)
        skip[i] = (ps->tensors[i] == p->wte && p->r != 0) ||
                  (p->tp && p->tp_rank != 0 && !nb__gpt_tp_sharded(ps->names[i]));
    /* parallel/zero_impl.h: ZeRO's norm with skip flags, until the parameters carry
     * placements (then nb_clip_grad_norm) */
    double nb__zero_clip_grad_norm_ex(nb_zero *, double, double, nb_comm *, nb_comm *,
                                      const bool *);
    double norm = st == NB_OK ? nb__zero_clip_grad_norm_ex(p->zero, grad_clip > 0 ? grad_clip
                                                                                : INFINITY, 2,
                                                           p->pp, p->tp, skip)
                              : NAN;
    free(skip);
    if (st == NB_OK && norm < 0) st = nb_last_status();
    if (st == NB_OK) st = mean_over_dp(p, &loss);
    if (st != NB_OK) return NAN;
    if (grad_norm) *grad_norm = norm;
    if (stats) stats->comm_s = nb_time_s() - t0;
    /* a non-finite gradient (the norm is the same on every rank) is not applied */
    if (!isfinite(norm)) return loss;
    if (nb_step(opt) != NB_OK) return NAN;
    return loss;
}


/* x and y: (B, T) with n_micro dividing B and T within the context. */
static nb_status check_batch(const nb_gpt_pipe *p, nb_tensor *x, nb_tensor *y, const char *who) {
    const int m = p->o.n_micro;
    if (nb_ndim(x) != 2 || nb_ndim(y) != 2 || nb_size(x, 0) != nb_size(y, 0) ||
        nb_size(x, 1) != nb_size(y, 1))
        return nb_set_error(NB_ESHAPE, "%s: x and y must both be (B, T)", who);
    const int64_t B = nb_size(x, 0), T = nb_size(x, 1);
    if (B % m)
        return nb_set_error(NB_EINVAL, "%s: %d micro-batches do not divide the batch of %lld "
                            "sequences", who, m, (long long)B);
    if (T < 1 || T > p->cfg.block_size)
        return nb_set_error(NB_ESHAPE, "%s: sequence length %lld is outside 1..block_size "
                            "(%lld)", who, (long long)T, (long long)p->cfg.block_size);
    if (p->o.sequence_parallel && T % p->tp_size)
        return nb_set_error(NB_ESHAPE, "%s: with sequence parallelism the sequence length (%lld) "
                            "must divide by the tensor-parallel size (%d)", who, (long long)T,
                            p->tp_size);
    return NB_OK;
}

nb_status nb_gpt_pipe_eval(nb_gpt_pipe *p, nb_tensor *x, nb_tensor *y, double *loss,
                           nb_pipe_stats *stats) {
    if (loss) *loss = NAN;
    if (stats) *stats = (nb_pipe_stats){.bubble = NAN, .bubble_theory = NAN};
    if (!p || !x || !y || !loss)
        return nb_set_error(NB_ENULL, "nb_gpt_pipe_eval: needs a pipeline, a batch and a place "
                            "for the loss");
    nb_status st = check_batch(p, x, y, "nb_gpt_pipe_eval");
    if (st != NB_OK) return st;
    const int m = p->o.n_micro;
    const int64_t b = nb_size(x, 0) / m, T = nb_size(x, 1);
    const bool training = nb_module_is_training(p->root);
    nb_module_train(p->root, false); /* dropout off: no draws, the stream stays where it is */
    p->drop = NULL;
    nb_scope_begin();
    for (int i = 0; i < m; i++) {
        p->mx[i] = nb_narrow(x, 0, i * b, b);
        p->my[i] = nb_narrow(y, 0, i * b, b);
    }
    const int64_t act[3] = {b, p->o.sequence_parallel ? T / p->tp_size : T, p->cfg.n_embd};
    nb_pipe_opts po = nb_pipe_defaults();
    po.schedule = p->o.schedule, po.n_micro = m, po.virtual_stages = p->v;
    po.act_shape = act, po.act_ndim = 3, po.forward_only = true;
    nb_clear_error();
    double l = nb_pipe_run(p->pp, &po, stage_fn, p, stats);
    st = isnan(l) ? nb_last_status() : NB_OK;
    nb_scope_end();
    nb_module_train(p->root, training);
    if (st != NB_OK) return st;
    *loss = l;
    return NB_OK;
}

static double train_step(nb_gpt_pipe *p, nb_optim *opt, nb_tensor *x, nb_tensor *y,
                         double grad_clip, nb_grad_scaler *scaler, double *grad_norm,
                         nb_pipe_stats *stats) {
    if (grad_norm) *grad_norm = NAN;
    if (stats) *stats = (nb_pipe_stats){.bubble = NAN, .bubble_theory = NAN};
    if (!p || !opt || !x || !y) {
        nb_set_error(NB_ENULL, "nb_gpt_pipe_train_step: needs a pipeline, an optimizer and a batch");
        return NAN;
    }
    const int m = p->o.n_micro;
    if (check_batch(p, x, y, "nb_gpt_pipe_train_step") != NB_OK) return NAN;
    if (p->zero && scaler) {
        nb_set_error(NB_EINVAL, "nb_gpt_pipe_train_step: a loss scaler with ZeRO over the pipeline's "
                     "data-parallel group is not supported yet (use bf16, or no ZeRO)");
        return NAN;
    }
    const int64_t B = nb_size(x, 0), T = nb_size(x, 1);
    nb_status st = nb_zero_grad(opt);
    if (st != NB_OK) return NAN;
    const int64_t b = B / m;
    const int n_dp = p->dp ? nb_comm_size(p->dp) : 1;
    p->drop = NULL;
    if (p->cfg.dropout > 0 && nb_module_is_training(p->root)) {
        p->drop = p->cfg.dropout_gen ? p->cfg.dropout_gen : nb_default_generator();
        if (count_dropout_draws(p, b, T) != NB_OK) return NAN;
        p->drop_base = nb_generator_offset(p->drop);
        p->micro0 = (int64_t)(p->dp ? nb_comm_rank(p->dp) : 0) * m;
    }
    nb_scope_begin();
    for (int i = 0; i < m; i++) {
        p->mx[i] = nb_narrow(x, 0, i * b, b);
        p->my[i] = nb_narrow(y, 0, i * b, b);
    }
    const int64_t act[3] = {b, p->o.sequence_parallel ? T / p->tp_size : T, p->cfg.n_embd};
    nb_pipe_opts po = nb_pipe_defaults();
    po.schedule = p->o.schedule, po.n_micro = m, po.virtual_stages = p->v;
    po.act_shape = act, po.act_ndim = 3;
    if (scaler) po.loss_scale = nb_grad_scaler_get_scale(scaler);
    if (p->zero) nb_zero_set_sync_enabled(p->zero, false); /* reduced once, after the tied sum */
    double loss = nb_pipe_run(p->pp, &po, stage_fn, p, stats);
    nb_scope_end();
    if (p->drop) /* where one process would be after the global batch's n_dp m micro-batches */
        nb_generator_set_offset(p->drop, p->drop_base + (uint64_t)(n_dp * m) *
                                             (p->d_emb + (uint64_t)p->cfg.n_layer * p->d_blk));
    if (isnan(loss) && nb_last_status() != NB_OK) return NAN;

    const double t0 = nb_time_s();
    const nb_params *ps = nb_parameters(p->root);
    /* Sequence parallel: the replicated parameters' gradients are partial sums over tp. */
    for (int i = 0; p->o.sequence_parallel && st == NB_OK && i < ps->count; i++) {
        nb_tensor *g = nb_grad(ps->tensors[i]);
        if (g && !nb__gpt_tp_sharded(ps->names[i])) st = nb_allreduce(p->tp, g, NB_REDUCE_SUM);
    }
    /* The tied embedding: both copies get the sum of the input and the head gradients (the
     * embedding group joins the first and last stage ranks of the same tp rank). */
    if (p->embed && (p->r == 0 || p->r == p->p - 1))
        st = allreduce_grads(p->embed, ps, p->wte, NB_REDUCE_SUM);
    if (p->zero) return st == NB_OK ? zero_tail(p, opt, loss, grad_clip, grad_norm, stats, t0) : NAN;
    if (st == NB_OK && p->dp && nb_comm_size(p->dp) > 1)
        st = allreduce_grads(p->dp, ps, NULL, NB_REDUCE_AVG);
    /* fp16: unscaled before the norm; the overflow flag over the scaler's communicator */
    if (st == NB_OK && scaler) st = nb_grad_scaler_unscale(scaler, opt);
    double v2[2] = {0, loss};
    if (st == NB_OK) st = local_sq(p, ps, &v2[0]);
    if (st == NB_OK) {
        nb_scope_begin();
        nb_tensor *t = nb_from_buffer(v2, (int64_t[]){2}, 1, NB_F64);
        st = t ? nb_allreduce(p->pp, t, NB_REDUCE_SUM) : nb_last_status(); /* sq over stages */
        if (st == NB_OK && p->tp) st = nb_allreduce(p->tp, t, NB_REDUCE_SUM); /* and over tp */
        if (st == NB_OK) st = nb_read(t, v2, 2, NB_F64);
        nb_scope_end();
        v2[1] = loss; /* the pipeline's loss is already the same on its ranks */
    }
    if (st == NB_OK) st = mean_over_dp(p, &loss);
    if (st != NB_OK) return NAN;
    const double norm = sqrt(v2[0]);
    if (grad_norm) *grad_norm = norm;
    if (stats) stats->comm_s = nb_time_s() - t0;
    /* A gradient overflowed (inf or NaN; the norm is global, so every rank sees it): not
     * applied, as nb_gpt_train_step; the caller sees the norm and decides. With a loss
     * scaler that is its business: it skips the step and backs off. */
    if (!isfinite(norm))
        return (scaler ? nb_grad_scaler_step_update(scaler, opt) : nb_zero_grad(opt)) == NB_OK
                   ? loss
                   : NAN;
    const double coef = grad_clip > 0 ? grad_clip / (norm + 1e-6) : 1; /* as nb_clip_grad_norm */
    if (coef < 1) {
        bool prev = nb_set_grad_enabled(false);
        nb_scope_begin();
        for (int i = 0; st == NB_OK && i < ps->count; i++) {
            nb_tensor *g = nb_grad(ps->tensors[i]);
            if (g) st = nb_copy_(g, nb_mul_scalar(g, coef));
        }
        nb_scope_end();
        nb_set_grad_enabled(prev);
    }
    if (stats) stats->comm_s = nb_time_s() - t0;
    if (st != NB_OK || (scaler ? nb_grad_scaler_step_update(scaler, opt) : nb_step(opt)) != NB_OK)
        return NAN;
    return loss;
}

double nb_gpt_pipe_train_step(nb_gpt_pipe *p, nb_optim *opt, nb_tensor *x, nb_tensor *y,
                              double grad_clip, double *grad_norm, nb_pipe_stats *stats) {
    return train_step(p, opt, x, y, grad_clip, NULL, grad_norm, stats);
}

double nb_gpt_pipe_train_step_ex(nb_gpt_pipe *p, nb_optim *opt, nb_tensor *x, nb_tensor *y,
                                 const nb_gpt_pipe_step_opts *o, double *grad_norm,
                                 nb_pipe_stats *stats) {
    return train_step(p, opt, x, y, o ? o->grad_clip : 0, o ? o->scaler : NULL, grad_norm, stats);
}

/* ---- checkpoints ------------------------------------------------------------------------------ */
/* A directory: stage-<id>-<r>-of-<P>.safetensors per pipeline rank (written by data-parallel
 * rank 0 as an nb_checkpoint file: "model.<name>" for the stage's parameters, "optim.<entry>"
 * for its optimizer state, all under the full model's names; <id> is fresh per save) and
 * index.safetensors (metadata: stages, step, dropout offset, "stage.<r>" = file name),
 * written last, by rank 0, once every stage file is durable; then the files of earlier saves
 * go. Checkpoints written before the id (stage-<r>-of-<P>.safetensors, no "stage.<r>") load
 * too. */

static nb_status agree_all(const nb_gpt_pipe *p, nb_status st) {
    st = nb__zoo_agree(p->pp, st, "pipeline checkpoint");
    st = nb__zoo_agree(p->tp, st, "pipeline checkpoint");
    return nb__zoo_agree(p->dp, st, "pipeline checkpoint");
}

/* Stage r of P's file, tp rank t of T's slices when T > 1. */
static void stage_name(char *buf, size_t n, const char *id, int r, int P, int t, int T) {
    if (T > 1) snprintf(buf, n, "stage-%s-%d-of-%d-tp-%d-of-%d.safetensors", id, r, P, t, T);
    else if (id && *id) snprintf(buf, n, "stage-%s-%d-of-%d.safetensors", id, r, P);
    else snprintf(buf, n, "stage-%d-of-%d.safetensors", r, P);
}

static bool is_writer(const nb_gpt_pipe *p) { return !p->dp || nb_comm_rank(p->dp) == 0; }

/* The save's directory (base itself, or its step's member of base's series when keep > 0,
 * the series' directory created) and id (pipeline rank 0's, the same on every rank of pp);
 * the directory created; then this rank's stage file written now, or (w given) handed to w.
 * Local: the caller agrees. */
static nb_status save_begin(nb_gpt_pipe *p, nb_optim *opt, nb_checkpoint_writer *w,
                            const char *base, int keep, int64_t step, char dir[4400],
                            char id[20]) {
    const char *who = "nb_gpt_pipe_save";
    nb_status st = nb_checkpoint_target(base, step, keep, dir, 4400);
    uint64_t idv = p->r == 0 ? nb__zoo_fresh_id() : 0;
    for (int k = 0; k < 2; k++) { /* pp rank 0's id, then tp rank 0's: every rank, whatever
                                    * its status */
        nb_comm *c = k == 0 ? p->pp : p->tp;
        if (!c || nb_comm_size(c) < 2) continue;
        nb_scope_begin();
        nb_tensor *t = nb_from_buffer(&idv, (int64_t[]){1}, 1, NB_I64);
        nb_status bs = t ? nb_broadcast(c, t, 0) : nb_last_status();
        if (bs == NB_OK) memcpy(&idv, nb_data(t), sizeof idv);
        nb_scope_end();
        if (st == NB_OK) st = bs;
    }
    snprintf(id, 20, "%016" PRIx64, idv);
    if (st != NB_OK || !is_writer(p)) return st;
    if (mkdir(dir, 0777) != 0) {
        struct stat sb;
        if (errno != EEXIST)
            return nb_set_error(NB_EIO, "%s: cannot create %s: %s", who, dir, strerror(errno));
        if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
            return nb_set_error(NB_EIO, "%s: %s exists and is not a directory (a pipeline "
                                "checkpoint is a directory); refusing to replace it", who, dir);
    }
    char name[96], path[4600];
    stage_name(name, sizeof name, id, p->r, p->p, p->tp_rank, p->tp_size);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    nb_checkpoint ck = {.model = p->root, .optim = opt, .step = step};
    return w ? nb_checkpoint_writer_save(w, path, &ck) : nb_checkpoint_save(path, &ck);
}

/* Rank 0 (the writer of stage 0), every stage file durable: the index, then the older stage
 * files and (keep > 0) the series' members beyond the newest keep. */
static nb_status write_index(const nb_gpt_pipe *p, const char *dir, const char *base, int keep,
                             const char *id, int64_t step, uint64_t drop) {
    if (p->r != 0 || p->tp_rank != 0 || !is_writer(p)) return NB_OK;
    char path[4600], stages[32], steps[32], dropv[32], tps[32];
    const int T = p->tp_size;
    snprintf(tps, sizeof tps, "%d", T);
    snprintf(path, sizeof path, "%s/index.safetensors", dir);
    snprintf(stages, sizeof stages, "%d", p->p);
    snprintf(steps, sizeof steps, "%lld", (long long)step);
    snprintf(dropv, sizeof dropv, "%llu", (unsigned long long)drop);
    int n = 0, cap = 7 + p->p * T;
    const char **keys = calloc((size_t)cap, sizeof *keys), **vals = calloc((size_t)cap, sizeof *vals);
    char *names = calloc((size_t)(p->p * T), 160);
    nb_status st = NB_OK;
    if (!keys || !vals || !names) st = nb_set_error(NB_ENOMEM, "nb_gpt_pipe_save: out of memory");
    if (st == NB_OK) {
        keys[n] = "format", vals[n++] = "nabla-pipe";
        keys[n] = "nabla_pipe_checkpoint_index", vals[n++] = "1";
        keys[n] = "pipe_stages", vals[n++] = stages;
        keys[n] = "step", vals[n++] = steps;
        if (p->cfg.dropout_gen) keys[n] = "dropout_offset", vals[n++] = dropv;
        if (T > 1) keys[n] = "pipe_tp", vals[n++] = tps;
        for (int r = 0; r < p->p; r++)
            for (int t = 0; t < T; t++) {
                char *k = names + (size_t)(r * T + t) * 160;
                if (T > 1) snprintf(k, 32, "stage.%d.%d", r, t);
                else snprintf(k, 32, "stage.%d", r);
                stage_name(k + 32, 128, id, r, p->p, t, T);
                keys[n] = k, vals[n++] = k + 32;
            }
        st = nb_safetensors_save(path, NULL, NULL, 0, keys, vals, n);
    }
    free(keys);
    free(vals);
    free(names);
    if (st != NB_OK) return st;
    nb__zoo_remove_old_files(dir, "stage-", id);
    nb_checkpoint_rotate(base, keep, dir);
    return NB_OK;
}

static uint64_t drop_offset(const nb_gpt_pipe *p) {
    /* the dropout stream's position (the same on every rank between steps) */
    return p->cfg.dropout_gen ? nb_generator_offset(p->cfg.dropout_gen) : 0;
}

static nb_status save_keep(nb_gpt_pipe *p, nb_optim *opt, const char *base, int keep,
                           int64_t step) {
    if (!p || !base) return nb_set_error(NB_ENULL, "nb_gpt_pipe_save: NULL pipeline or directory");
    if (keep < 0) return nb_set_error(NB_EINVAL, "nb_gpt_pipe_save: keep %d is negative", keep);
    char dir[4400], id[20];
    nb_status st = agree_all(p, save_begin(p, opt, NULL, base, keep, step, dir, id));
    if (st == NB_OK) st = write_index(p, dir, base, keep, id, step, drop_offset(p));
    return agree_all(p, st);
}

nb_status nb_gpt_pipe_save(nb_gpt_pipe *p, nb_optim *opt, const char *dir, int64_t step) {
    return save_keep(p, opt, dir, 0, step);
}

nb_status nb_gpt_pipe_save_keep(nb_gpt_pipe *p, nb_optim *opt, const char *base, int keep,
                                int64_t step) {
    if (keep < 1) return nb_set_error(NB_EINVAL, "nb_gpt_pipe_save_keep: keep must be at least "
                                      "1, got %d", keep);
    return save_keep(p, opt, base, keep, step);
}

nb_status nb_gpt_pipe_save_wait(nb_gpt_pipe *p, nb_checkpoint_writer *w) {
    if (!p || !w) return nb_set_error(NB_ENULL, "nb_gpt_pipe_save_wait: NULL %s",
                                      !p ? "pipeline" : "writer");
    if (!p->inflight.pending) return NB_OK; /* the same on every rank: the same calls */
    p->inflight.pending = false;
    nb_status st = agree_all(p, is_writer(p) ? nb_checkpoint_writer_wait(w) : NB_OK);
    if (st != NB_OK) return st; /* no index: that save does not exist */
    st = write_index(p, p->inflight.dir, p->inflight.base, p->inflight.keep, p->inflight.id,
                     p->inflight.step, p->inflight.drop);
    return agree_all(p, st);
}

nb_status nb_gpt_pipe_save_async(nb_gpt_pipe *p, nb_optim *opt, nb_checkpoint_writer *w,
                                 const char *base, int keep, int64_t step) {
    if (!p || !w || !base)
        return nb_set_error(NB_ENULL, "nb_gpt_pipe_save_async: NULL %s",
                            !p ? "pipeline" : !w ? "writer" : "directory");
    if (keep < 0) return nb_set_error(NB_EINVAL, "nb_gpt_pipe_save_async: keep %d is negative",
                                      keep);
    if (strlen(base) >= sizeof p->inflight.base)
        return nb_set_error(NB_EINVAL, "nb_gpt_pipe_save_async: the directory name is too long");
    nb_status st = nb_gpt_pipe_save_wait(p, w);
    if (st != NB_OK) return st;
    char dir[4400], id[20];
    st = agree_all(p, save_begin(p, opt, w, base, keep, step, dir, id));
    if (st != NB_OK) {
        if (is_writer(p)) { /* this rank's file, if it started: no index names it */
            char msg[512];
            snprintf(msg, sizeof msg, "%s", nb_last_error());
            nb_checkpoint_writer_wait(w);
            st = nb_set_error(st, "%s", msg);
        }
        return st;
    }
    p->inflight.pending = true;
    p->inflight.keep = keep;
    p->inflight.step = step;
    p->inflight.drop = drop_offset(p);
    snprintf(p->inflight.dir, sizeof p->inflight.dir, "%s", dir);
    snprintf(p->inflight.base, sizeof p->inflight.base, "%s", base);
    snprintf(p->inflight.id, sizeof p->inflight.id, "%s", id);
    return NB_OK;
}

/* The stage files of dir (P x T of them, from the index: f[r T + t] holds stage r's slices of
 * tp rank t); *step from it. */
static nb_safetensors **open_stages(const char *dir, int *P, int *T, int64_t *step,
                                    const char *who, const char **drop_offset_out, char *drop_buf) {
    char path[4096];
    snprintf(path, sizeof path, "%s/index.safetensors", dir);
    nb_safetensors *ix = nb_safetensors_open(path);
    if (!ix) {
        nb_set_error(NB_EIO, "%s: %s is not a finished pipeline checkpoint (no readable "
                     "index.safetensors): %s", who, dir, nb_last_error());
        return NULL;
    }
    const char *s = nb_safetensors_metadata(ix, "pipe_stages"), *k = nb_safetensors_metadata(ix, "step");
    const char *ts = nb_safetensors_metadata(ix, "pipe_tp");
    *P = s ? atoi(s) : 0;
    *T = ts ? atoi(ts) : 1;
    if (*T < 1 || *T > 65536) *T = 0;
    if (step) *step = k ? atoll(k) : 0;
    if (drop_offset_out) { /* copied: the index closes here */
        const char *d = nb_safetensors_metadata(ix, "dropout_offset");
        if (d) snprintf(drop_buf, 32, "%s", d);
        *drop_offset_out = d ? drop_buf : NULL;
    }
    const int nf = *P > 0 && *P < 1000000 && *T > 0 && *T <= 1000000 / *P ? *P * *T : 0;
    char **names = nf ? calloc((size_t)nf, sizeof *names) : NULL;
    for (int i = 0; names && i < nf; i++) {
        char key[32];
        if (*T > 1) snprintf(key, sizeof key, "stage.%d.%d", i / *T, i % *T);
        else snprintf(key, sizeof key, "stage.%d", i);
        const char *v = nb_safetensors_metadata(ix, key);
        if (v && !strchr(v, '/')) names[i] = strdup(v);
    }
    nb_safetensors_close(ix);
    if (nf < 1) {
        nb_set_error(NB_EFORMAT, "%s: %s/index.safetensors names no stage count", who, dir);
        return NULL;
    }
    nb_safetensors **f = calloc((size_t)nf, sizeof *f);
    if (!f) nb_set_error(NB_ENOMEM, "%s: out of memory", who);
    for (int i = 0; f && i < nf; i++) {
        char name[160];
        if (names && names[i]) snprintf(name, sizeof name, "%s", names[i]);
        else if (*T == 1) stage_name(name, sizeof name, NULL, i, *P, 0, 1);
        else snprintf(name, sizeof name, "(stage.%d.%d not named)", i / *T, i % *T);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (!(f[i] = nb_safetensors_open(path))) {
            nb_set_error(NB_EIO, "%s: stage file %s is missing or unreadable", who, path);
            for (int q = 0; q < i; q++) nb_safetensors_close(f[q]);
            free(f);
            f = NULL;
        }
    }
    for (int i = 0; names && i < nf; i++) free(names[i]);
    free(names);
    return f;
}

static void close_stages(nb_safetensors **f, int n) {
    for (int i = 0; f && i < n; i++) nb_safetensors_close(f[i]);
    free(f);
}

/* The first stage holding name (in its tp rank 0 file), or -1. */
static int which(nb_safetensors **f, int P, int T, const char *name) {
    for (int r = 0; r < P; r++)
        if (nb_safetensors_find(f[r * T], name) >= 0) return r;
    return -1;
}

/* The 1-rank tensor `key` ("model.<name>" or "optim.<entry>") of stage r, in the current
 * scope: tp rank 0's, or assembled from the T files' slices when its parameter is split. */
static nb_tensor *stage_get(nb_safetensors **f, int T, int r, const char *key) {
    nb_tensor *t0 = nb_safetensors_get(f[r * T], key);
    if (!t0 || T == 1) return t0;
    const char *param = strncmp(key, "model.", 6) == 0 ? key + 6
                                                        : nb__gpt_tp_state_param(key + 6, t0);
    if (!param || !nb__gpt_tp_sharded(param)) return t0;
    nb_tensor **parts = malloc(sizeof *parts * (size_t)T);
    if (!parts) {
        nb_set_error(NB_ENOMEM, "pipeline checkpoint: out of memory");
        return NULL;
    }
    parts[0] = t0;
    bool ok = true;
    for (int t = 1; t < T && ok; t++) ok = (parts[t] = nb_safetensors_get(f[r * T + t], key)) != NULL;
    nb_tensor *w = ok ? nb__gpt_tp_assemble(param, parts, T) : NULL;
    free(parts);
    return w;
}

static bool has_param(const nb_params *ps, const char *name) {
    for (int i = 0; i < ps->count; i++)
        if (strcmp(ps->names[i], name) == 0) return true;
    return false;
}

static nb_status load_local(nb_gpt_pipe *p, nb_optim *opt, const char *dir, int64_t *step) {
    const char *who = "nb_gpt_pipe_load";
    int P, T;
    const char *drop = NULL;
    char drop_buf[32];
    nb_safetensors **f = open_stages(dir, &P, &T, step, who, &drop, drop_buf);
    if (!f) return nb_last_status();
    const nb_params *ps = nb_parameters(p->root);
    nb_status st = NB_OK;
    char full[1024];
    nb_scope_begin();
    nb_tensor **src = calloc((size_t)ps->count, sizeof *src);
    if (!src) st = nb_set_error(NB_ENOMEM, "%s: out of memory", who);
    for (int i = 0; st == NB_OK && i < ps->count; i++) { /* check every name first */
        snprintf(full, sizeof full, "model.%s", ps->names[i]);
        int r = which(f, P, T, full);
        if (r < 0) {
            st = nb_set_error(NB_EINVAL, "%s: no stage of %s holds %s (a checkpoint of another "
                              "model?)", who, dir, ps->names[i]);
        } else if (!(src[i] = stage_get(f, T, r, full))) {
            st = nb_last_status();
        } else if (p->tps && nb__gpt_tp_sharded(ps->names[i]) && nb_numel(src[i]) % p->tp_size) {
            st = nb_set_error(NB_ESHAPE, "%s: %s has %lld elements in %s: not split over %d "
                              "ranks", who, ps->names[i], (long long)nb_numel(src[i]), dir,
                              p->tp_size);
        } else if (p->tps && nb__gpt_tp_sharded(ps->names[i]) &&
                   !(src[i] = nb__gpt_tp_slice(p->tps, ps->names[i], src[i]))) {
            st = nb_last_status();
        } else if (nb_numel(src[i]) != nb_numel(ps->tensors[i])) {
            st = nb_set_error(NB_ESHAPE, "%s: %s has %lld elements in %s, the model %lld", who,
                              ps->names[i], (long long)nb_numel(src[i]), dir,
                              (long long)nb_numel(ps->tensors[i]));
        }
    }
    nb_state_list l = {0};
    for (int r = 0; st == NB_OK && opt && r < P; r++) /* this rank's optimizer entries */
        for (int i = 0; st == NB_OK && i < nb_safetensors_count(f[r * T]); i++) {
            const char *n = nb_safetensors_name(f[r * T], i);
            if (strncmp(n, "optim.", 6) != 0) continue;
            const char *e = n + 6, *dot = strchr(e, '.');
            bool mine = strncmp(e, "param_groups.", 13) == 0 ? r == 0
                                                               : dot && has_param(ps, dot + 1);
            if (!mine) continue;
            bool dup = false; /* the tied wte's state is in the first and the last file */
            for (int k = 0; k < l.count && !dup; k++) dup = strcmp(l.names[k], e) == 0;
            if (dup) continue;
            nb_tensor *w = stage_get(f, T, r, n); /* whole, then this rank's slice */
            const char *pn = w ? nb__gpt_tp_state_param(e, w) : NULL;
            if (w && pn && p->tps && nb__gpt_tp_sharded(pn)) w = nb__gpt_tp_slice(p->tps, pn, w);
            st = nb_state_list_add(&l, NULL, e, w);
        }
    if (st == NB_OK && opt) st = nb_optim_load_state(opt, l.names, l.tensors, l.count);
    if (st == NB_OK) {
        bool prev = nb_set_grad_enabled(false);
        for (int i = 0; st == NB_OK && i < ps->count; i++) st = nb_copy_(ps->tensors[i], src[i]);
        nb_set_grad_enabled(prev);
    }
    if (st == NB_OK && drop && p->cfg.dropout_gen)
        st = nb_generator_set_offset(p->cfg.dropout_gen, strtoull(drop, NULL, 10));
    nb_state_list_deinit(&l);
    free(src);
    nb_scope_end();
    close_stages(f, P * T);
    return st;
}

nb_status nb_gpt_pipe_load(nb_gpt_pipe *p, nb_optim *opt, const char *dir, int64_t *step) {
    if (!p || !dir) return nb_set_error(NB_ENULL, "nb_gpt_pipe_load: NULL pipeline or directory");
    nb_status st = load_local(p, opt, dir, step);
    return agree_all(p, st);
}

nb_status nb_gpt_pipe_consolidate(const char *dir, const char *out) {
    if (!dir || !out) return nb_set_error(NB_ENULL, "nb_gpt_pipe_consolidate: NULL argument");
    int P, T;
    nb_safetensors **f = open_stages(dir, &P, &T, NULL, "nb_gpt_pipe_consolidate", NULL, NULL);
    if (!f) return nb_last_status();
    nb_state_list l = {0};
    nb_status st = NB_OK;
    nb_scope_begin();
    for (int r = 0; st == NB_OK && r < P; r++)
        for (int i = 0; st == NB_OK && i < nb_safetensors_count(f[r * T]); i++) {
            const char *n = nb_safetensors_name(f[r * T], i);
            if (strncmp(n, "model.", 6) != 0 || which(f, P, T, n) != r) continue; /* wte once */
            st = nb_state_list_add(&l, NULL, n + 6, stage_get(f, T, r, n));
        }
    const char *keys[] = {"format"}, *vals[] = {"pt"};
    if (st == NB_OK) st = nb_safetensors_save(out, l.names, l.tensors, l.count, keys, vals, 1);
    nb_scope_end();
    nb_state_list_deinit(&l);
    close_stages(f, P * T);
    return st;
}
