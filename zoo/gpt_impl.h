/* gpt_impl.h - what zoo/gpt.c shares with zoo/gpt_parallel.c (not public): the layers of the
 * GPT's forward, which its pipeline split runs one by one. */
#ifndef NABLA_ZOO_GPT_IMPL_H
#define NABLA_ZOO_GPT_IMPL_H

#include "nabla/gpt.h"

/* As nb_pipe_layer functions: the embedding (tokens + positions, dropout; idx -> (B, T, C))
 * and the head (ln_f, the tied projection -> logits); the loss of logits (by their own last
 * dim) against targets (B, T). */
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
/* The next token of a generation from the last position's logits (V values; NULL: the error
 * set) into *tok: greedy, or with temperature and top-k from one uniform drawn from o->gen.
 * l: 2 V doubles of scratch. Shared by nb_gpt_generate and nb_llama_generate. */
nb_status nb__lm_next(nb_tensor *last, int64_t V, const nb_gpt_sample_opts *o, double *l,
                      int64_t *tok);

#endif
