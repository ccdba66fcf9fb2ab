/* gpt_impl.h - what zoo/gpt.c shares with zoo/gpt_pipe.c and zoo/gpt_tp.c (not public): the config defaults
 * and the builders of one transformer Block and a LayerNorm, so a pipeline stage holds the
 * very modules (and draws the very initial values) nb_gpt_new would. */
#ifndef NABLA_ZOO_GPT_IMPL_H
#define NABLA_ZOO_GPT_IMPL_H

#include "nabla/gpt.h"

/* in with the defaults filled in, checked as nb_gpt_new checks it (false + error). */
bool nb__gpt_resolve(const nb_gpt_config *in, nb_gpt_config *out);
/* A standalone Block (ln_1, attn, ln_2, mlp) drawing its weights from gen as nb_gpt_new does
 * for each block; c is borrowed and must outlive the module. NULL + error on failure. */
nb_module *nb__gpt_block_new(const nb_gpt_config *c, nb_generator *gen);
/* Adds LayerNorm child `name` (weight 1, bias 0 unless c->no_bias) to parent. */
nb_module *nb__gpt_add_layernorm(nb_module *parent, const char *name, const nb_gpt_config *c);

/* Sharded checkpoints (zoo/shard_ckpt.c). nb__zoo_agree: every rank of c gets NB_OK only if
 * every rank had it; a rank that was fine gets NB_EIO "<what>: another rank failed (see its
 * message)" (c NULL or of size 1: st). nb__zoo_fresh_id: a random id for one save's files. */
nb_status nb__zoo_agree(nb_comm *c, nb_status st, const char *what);
uint64_t nb__zoo_fresh_id(void);

#endif
