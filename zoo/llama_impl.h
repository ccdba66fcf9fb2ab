/* llama_impl.h - what zoo/llama.c shares with zoo/llama_parallel.c (not public): the layers
 * of the Llama's forward as nb_pipe_layer functions, so the pipeline split runs the very code
 * nb_forward runs: the embedding (idx (B, T) -> (B, T, C), the tokens checked), the head
 * (model.norm, lm_head -> logits), and the loss of logits (by their own last dim) against
 * targets (B, T). */
#ifndef NABLA_ZOO_LLAMA_IMPL_H
#define NABLA_ZOO_LLAMA_IMPL_H

#include "nabla/llama.h"

nb_tensor *nb__llama_embed(nb_module *m, nb_tensor *idx, void *ctx);
nb_tensor *nb__llama_head(nb_module *m, nb_tensor *x, void *ctx);
nb_tensor *nb__llama_cross_entropy(nb_tensor *logits, nb_tensor *targets, void *ctx);

#endif
