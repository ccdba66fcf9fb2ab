/* gpt_impl.h - what zoo/gpt.c shares with zoo/gpt_pipe.c and zoo/gpt_tp.c (not public): the config defaults
 * and the builders of one transformer Block and a LayerNorm, so a pipeline stage holds the
 * very modules (and draws the very initial values) nb_gpt_new would. */
#ifndef NABLA_ZOO_GPT_IMPL_H
#define NABLA_ZOO_GPT_IMPL_H

#include "nabla/gpt.h"
#include "nabla/parallel.h"

/* in with the defaults filled in, checked as nb_gpt_new checks it (false + error). */
bool nb__gpt_resolve(const nb_gpt_config *in, nb_gpt_config *out);
/* A standalone Block (ln_1, attn, ln_2, mlp) drawing its weights from gen as nb_gpt_new does
 * for each block; c is borrowed and must outlive the module. NULL + error on failure. */
nb_module *nb__gpt_block_new(const nb_gpt_config *c, nb_generator *gen);
/* Adds LayerNorm child `name` (weight 1, bias 0 unless c->no_bias) to parent. */
nb_module *nb__gpt_add_layernorm(nb_module *parent, const char *name, const nb_gpt_config *c);

/* The layers of the GPT's forward (zoo/gpt.c), as nb_pipe_layer functions: the embedding
 * (tokens + positions, dropout; idx -> (B, T, C)) and the head (ln_f, the tied projection ->
 * logits); the loss of logits (by their own last dim) against targets (B, T). */
nb_tensor *nb__gpt_embed(nb_module *m, nb_tensor *idx, void *ctx);
nb_tensor *nb__gpt_head(nb_module *m, nb_tensor *x, void *ctx);
nb_tensor *nb__gpt_cross_entropy(nb_tensor *logits, nb_tensor *targets, void *ctx);

/* What the language models share (zoo/gpt.c): the training step of nabla/gpt.h
 * (nb_gpt_train_step_ex) with the model's loss of (idx, targets), and the choice of the next
 * token from logits l[0..V) (modified in place; scratch holds V doubles; u uniform in [0, 1)
 * when sampling) under the sampling options. */
typedef nb_tensor *(*nb__lm_loss_fn)(nb_module *m, nb_tensor *idx, nb_tensor *targets);
double nb__lm_train_step(nb_module *m, nb_optim *opt, const nb_gpt_step_opts *o,
                         nb_tensor *const *x, nb_tensor *const *y, int n_micro,
                         double *grad_norm, nb__lm_loss_fn loss_of);
int64_t nb__lm_pick(double *l, int64_t V, const nb_gpt_sample_opts *o, double *scratch, double u);

/* Sharded checkpoints (zoo/shard_ckpt.c). nb__zoo_agree: every rank of c gets NB_OK only if
 * every rank had it; a rank that was fine gets NB_EIO "<what>: another rank failed (see its
 * message)" (c NULL or of size 1: st). nb__zoo_fresh_id: a random id for one save's files. */
nb_status nb__zoo_agree(nb_comm *c, nb_status st, const char *what);
uint64_t nb__zoo_fresh_id(void);
/* Remove dir's files named <prefix>... that are not <prefix><id>-... (the files of earlier
 * saves, once the index of save id is written). */
void nb__zoo_remove_old_files(const char *dir, const char *prefix, const char *id);

/* Tensor-parallel pieces (zoo/gpt_tp.c) for the pipeline's TP stages (zoo/gpt_pipe.c).
 * nb__gpt_tp: one stage's settings (cfg copied, tp borrowed), freed with free(); the modules
 * built with it borrow it. NULL + NB_EINVAL when tp's size does not divide n_head and
 * vocab_size. */
typedef struct nb__gpt_tp nb__gpt_tp;
nb__gpt_tp *nb__gpt_tp_new(const nb_gpt_config *cfg, nb_comm *tp, bool sequence_parallel);
/* The TP Block holding this rank's slices of a 1-rank block (nb__gpt_block_new's; copied). */
nb_module *nb__gpt_tp_block(const nb__gpt_tp *s, nb_module *block);
/* Whether the parameter named so (the 1-rank GPT's name, or a name relative to a block) is
 * split over tp (else replicated: its gradient is partial under sequence parallelism). */
bool nb__gpt_tp_sharded(const char *name);
/* This rank's slice of the 1-rank tensor of parameter name (a copy in the current scope). */
nb_tensor *nb__gpt_tp_slice(const nb__gpt_tp *s, const char *name, nb_tensor *whole);
/* The 1-rank tensor of parameter name from this rank's slice (all-gathered: collective over
 * s's group; a replicated tensor is cloned), in the current scope. */
nb_tensor *nb__gpt_tp_whole(const nb__gpt_tp *s, const char *name, nb_tensor *slice);
/* The 1-rank tensor of parameter name from the slices of n ranks, in rank order. */
nb_tensor *nb__gpt_tp_assemble(const char *name, nb_tensor *const *parts, int n);
/* The parameter an optimizer state entry "<slot>.<param>" (tensor t) belongs to; NULL for the
 * group scalars and 0-dim counters (never split). */
const char *nb__gpt_tp_state_param(const char *entry, const nb_tensor *t);
/* The embedding (vocab-parallel wte slice + wpe) and its dropout (training per m): (B, T, C),
 * or this rank's (B, T/tp, C) shard with sequence parallelism. */
nb_tensor *nb__gpt_tp_embed(const nb__gpt_tp *s, nb_module *m, nb_tensor *wte, nb_tensor *wpe,
                            nb_tensor *idx);
/* x after ln_f ((B, T, C) or its shard) -> the tied vocab-parallel head and cross entropy:
 * the mean loss over B T, the same on every tp rank. */
nb_tensor *nb__gpt_tp_head_loss(const nb__gpt_tp *s, nb_tensor *x, nb_tensor *wte,
                                nb_tensor *targets);

#endif
