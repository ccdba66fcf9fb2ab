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

#endif
