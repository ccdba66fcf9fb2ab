/* nabla/gpt_tp.h - the GPT of nabla/gpt.h split over a tensor-parallel group (Megatron-LM's
 * layout), optionally with sequence parallelism, and combined with data parallelism.
 *
 * Usage (under `mpirun -np 4`: dp 2 x tp 2):
 *     nb_comm *world = nb_comm_world();
 *     nb_topology *topo = nb_topology_new(world, &(nb_topology_opts){.pp = 1, .tp = 2});
 *     nb_gpt_config cfg = {.block_size = 16, .n_layer = 2, .n_head = 4, .n_embd = 32};
 *     nb_generator *init = nb_generator_new(0);             // the same seed everywhere
 *     nb_gpt_tp_opts o = {.sequence_parallel = true};
 *     nb_module *m = topo ? nb_gpt_tp_new(&cfg, init, nb_topology_tp(topo), &o) : NULL;
 *     nb_ddp *ddp = m ? nb_ddp_new(m, nb_topology_dp(topo), NULL) : NULL;  // over dp only
 *     nb_optim *opt = m ? nb_sgd_new(nb_parameters(m), &(nb_sgd_opts){.lr = 0.1}) : NULL;
 *     // per step, x[i] and y[i] are this dp rank's (B, T) micro-batches:
 *     //     double loss = nb_gpt_tp_train_step(m, opt, ddp, x, y, 1, 1.0, NULL);
 *     nb_module *full = m ? nb_gpt_new(&cfg, NULL) : NULL;  // the 1-rank model, to save
 *     if (full && nb_gpt_tp_gather(m, full) == NB_OK && nb_comm_rank(world) == 0)
 *         nb_module_save(full, "model.safetensors");        // nanoGPT's names
 *     nb_module_free(full);
 *     nb_optim_free(opt);
 *     nb_ddp_free(ddp);
 *     nb_module_free(m);
 *     nb_generator_free(init);
 *     nb_topology_free(topo);
 *     nb_comm_free(world);
 *
 * Layout (tp ranks, rank r): the token embedding is vocab parallel (rows [rV/tp, (r+1)V/tp)
 * of wte, looked up with nb_vocab_parallel_embedding) and the tied head gives each rank its
 * (B, T, V/tp) logits, which nb_gpt_tp_loss turns into the loss with
 * nb_vocab_parallel_cross_entropy (the (B, T, V) logits are never formed). In each block
 * c_attn is column parallel over heads (each rank holds q, k and v of n_head/tp heads),
 * attn.c_proj row parallel; mlp.c_fc column parallel, mlp.c_proj row parallel: one
 * allreduce forward and one backward per attention and per MLP. Layer norms, wpe and the
 * row-parallel biases are replicated. With sequence_parallel the activations between the
 * blocks' parallel regions are split along the sequence (T must divide by tp): layer norms,
 * residual adds and dropout run on (B, T/tp, C) shards, and the allreduces become an
 * all-gather before each column-parallel linear and a reduce-scatter after each row-parallel
 * one (the same volume; activations 1/tp). The gradients of the replicated parameters used
 * on shards (layer norms, row biases) are partial sums then, and nb_gpt_tp_train_step sums
 * them over the group (nb_gpt_tp_sync_grads).
 * Names: every parameter has the name of the 1-rank GPT's, holding its slice, so the 1-rank
 * initialization sliced (nb_gpt_tp_new draws the whole model from init on every rank) and
 * nb_gpt_tp_gather / nb_gpt_tp_from move weights between layouts. Dropout draws the 1-rank
 * run's masks (all ranks of the group share cfg.dropout_gen's state): replicated tensors
 * as 1 rank draws them, sequence shards and the attention's heads from the place of their
 * slice in the 1-rank draw (the generator's offset moved there; it needs n_embd a multiple
 * of 4 and an even sequence length, else the part draws from the current offset), and the
 * generator ends where the 1-rank draw leaves it; so with one data-parallel rank a dropout
 * run equals the 1-process run.
 *
 * Ownership: the modules returned are the caller's (nb_module_free); the communicator is
 * borrowed and must outlive the model. cfg is copied (cfg.dropout_gen borrowed). */
#ifndef NABLA_GPT_TP_H
#define NABLA_GPT_TP_H

#include <stdbool.h>

#include "nabla/checkpoint.h"
#include "nabla/gpt.h"
#include "nabla/tp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_gpt_tp_opts {
    bool sequence_parallel;  /* false */
} nb_gpt_tp_opts;

/* Draw the 1-rank GPT from init (as nb_gpt_new) and keep this rank's slices. NULL with
 * NB_EINVAL, the same on every rank, when tp does not divide n_head or vocab_size, and for
 * nb_gpt_new's errors. */
nb_module *nb_gpt_tp_new(const nb_gpt_config *cfg, nb_generator *init, nb_comm *tp,
                         const nb_gpt_tp_opts *o);
/* The TP model holding the slices of full (a model made by nb_gpt_new or loaded). */
nb_module *nb_gpt_tp_from(nb_module *full, nb_comm *tp, const nb_gpt_tp_opts *o);
/* Write the whole weights into full (a 1-rank GPT of the same config): all-gathers the
 * slices. Collective over the tp group. */
nb_status nb_gpt_tp_gather(nb_module *m, nb_module *full);
bool nb_gpt_tp_is_gpt_tp(const nb_module *m);
const nb_gpt_config *nb_gpt_tp_get_config(const nb_module *m);
/* Whether the i-th parameter (nb_parameters order) is a slice (else replicated). */
bool nb_gpt_tp_param_is_sharded(nb_module *m, int i);

/* Files across layouts. nb_gpt_tp_save gathers the whole model (and, with opt, the
 * optimizer's whole state: each state tensor gathered as its parameter) on every rank of
 * the tp group (collective) and, where write is true (one rank, e.g. world rank 0), writes
 * them to path as one safetensors file: the model under "model." with nanoGPT's names, the
 * state under "optim." as nb_optim_state names it. nb_gpt_load and nb_gpt_config_from_file
 * read the model part as they read a checkpoint, so the file is also the consolidated
 * model. nb_gpt_tp_load reads such a file, or a plain model file (nb_module_save, nanoGPT's
 * state dict: weights only), under any layout: every rank slices what it holds, the
 * optimizer state too (opt may be NULL). Everything is checked before anything changes
 * (NB_EINVAL for a missing tensor, NB_ESHAPE for another model size, and
 * nb_optim_load_state's errors). Local (no communication). The state must have the layout
 * of opt's parameters: the same optimizer kind, groups and order. */
nb_status nb_gpt_tp_save(nb_module *m, nb_optim *opt, const char *path, bool write);
nb_status nb_gpt_tp_load(nb_module *m, nb_optim *opt, const char *path);
/* The same gathering into objects: the whole weights into full (a 1-rank GPT of the same
 * config) and the whole state into full_opt (an optimizer over full's parameters of opt's
 * kind and groups; nb_optim_load_state's rules), e.g. to write an nb_checkpoint of the
 * 1-rank model. Either may be NULL (a rank that only takes part). Collective over tp. */
nb_status nb_gpt_tp_consolidate(nb_module *m, nb_optim *opt, nb_module *full, nb_optim *full_opt);

/* Sharded checkpoints (no full copy anywhere) of c (c->model a TP GPT; c->optim, schedule,
 * generators, settings, run id and step as in nabla/checkpoint.h): a directory where each
 * tp rank of the first data-parallel replica (dp rank 0; dp is the data-parallel group,
 * NULL: none) writes tp-<id>-<r>-of-<T>.safetensors, an nb_checkpoint file of its slices of
 * the parameters and optimizer state under the 1-rank model's names (each split
 * parameter's place in the 1-rank tensor in metadata "config.tp_slice.<name>": "<dim>
 * <start> <length>", or "qkv <rank> <T>" for c_attn), and tp rank 0 writes
 * index.safetensors (format "nabla-tp", tp, step, "shard.<r>" = the file names) last, only
 * once every rank's file is durable: the checkpoint exists only when its index does.
 * base: the directory itself (keep 0) or, keep >= 1, a series (nb_checkpoint_path) whose
 * members beyond the newest keep are removed after the index is written. Collective over
 * the tp group and dp; the same status on every rank.
 * _async hands each rank's file to its writer (one per rank, NB_CKPT_WAIT) and returns once
 * the state is copied; the index of that save is written at the next _async or at _wait
 * (call _wait before freeing the writer; without it the last save has no index and is
 * ignored). A file that failed on any rank: no index for that save, the error on every
 * rank at that call.
 * Loading under any layout (any tp, dp, or one process): each tensor is assembled from its
 * slices, then sliced for this rank. nb_gpt_tp_load(m, opt, dir) loads weights and state;
 * nb_gpt_tp_checkpoint_load(dir, c) the whole checkpoint into c (c->model a TP GPT or a
 * 1-rank GPT of nb_gpt_new; the rest, checked as nb_checkpoint_load checks it, from rank
 * 0's file). Local. nb_gpt_tp_is_checkpoint: whether dir has such an index.
 * nb_gpt_tp_consolidate_dir writes the whole model with nanoGPT's names (no prefix;
 * nb_gpt_load reads it) to out, the index's step in *step (may be NULL); local.
 * nb_checkpoint_latest and rotation count these directories (nabla/checkpoint.h). */
nb_status nb_gpt_tp_save_sharded(const nb_checkpoint *c, nb_comm *dp, const char *base, int keep);
nb_status nb_gpt_tp_save_async(const nb_checkpoint *c, nb_comm *dp, nb_checkpoint_writer *w,
                               const char *base, int keep);
nb_status nb_gpt_tp_save_wait(nb_module *m, nb_comm *dp, nb_checkpoint_writer *w);
nb_status nb_gpt_tp_checkpoint_load(const char *dir, nb_checkpoint *c);
bool nb_gpt_tp_is_checkpoint(const char *dir);
nb_status nb_gpt_tp_consolidate_dir(const char *dir, const char *out, int64_t *step);

/* The mean cross entropy over (B, T) (the same 0-dim value on every tp rank). */
nb_tensor *nb_gpt_tp_loss(nb_module *m, nb_tensor *idx, nb_tensor *targets);
/* Sum the sequence-parallel partial gradients over the tp group (nothing without
 * sequence parallelism). Collective. */
nb_status nb_gpt_tp_sync_grads(nb_module *m);
/* nb_gpt_train_step for the TP model: ddp (NULL, or an nb_ddp over the dp group wrapping
 * m) averages over the data-parallel ranks; the gradient norm is taken over the whole model
 * (nb_tp_clip_grad_norm over the tp group). A non-finite norm (computed when grad_clip > 0
 * or grad_norm is given; the same on every rank) is not applied, as nb_gpt_train_step: the
 * gradients are zeroed, opt not stepped, the loss returned. Mixed precision: call it inside
 * an autocast scope (nabla/autocast.h). */
double nb_gpt_tp_train_step(nb_module *m, nb_optim *opt, nb_ddp *ddp, nb_tensor *const *x,
                            nb_tensor *const *y, int n_micro, double grad_clip,
                            double *grad_norm);
/* The same step with its options in one struct, and a loss scaler for fp16 (nabla/optim.h):
 * each micro-batch's loss scaled, the gradients unscaled (after the dp and sequence-parallel
 * sums, before the norm), the step through nb_grad_scaler_step_update, so an overflowed step
 * is skipped and the scale halved (*grad_norm then inf or NaN). Each rank checks only its own
 * slices: give the scaler the communicator of every rank of the model, tp x dp
 * (nb_grad_scaler_set_comm), so the inf check is global and every rank skips the same steps.
 * Activation checkpointing: cfg.recompute of the model (FULL replays each block with its
 * collectives in backward; ATTN the attention core of this rank's heads). */
/* ZeRO over the dp group: o->zero (an nb_zero over the dp group wrapping m, stage 0, 1 or 2;
 * stage 3: NB_EINVAL) takes the place of the nb_ddp (o->ddp; not both). Gradient
 * accumulation disables its sync but for the last micro-batch; sequence-parallel partial
 * gradients are summed over tp on this rank's shard; the norm is ZeRO's private skip-mask norm
 * over the dp shards and the tp group, each replicated parameter counted by tp rank 0 only,
 * and clipping happens before nb_step (which steps the shard and all-gathers). Equal to the
 * DDP step up to rounding. Checkpoints: nb_zero_gather_optim_state before
 * nb_gpt_tp_save_sharded and nb_zero_scatter_optim_state after (and after
 * nb_gpt_tp_checkpoint_load) write and read the files of a DDP run (nabla/parallel.h). */
typedef struct nb_gpt_tp_step_opts {
    nb_ddp *ddp;             /* NULL; as nb_gpt_tp_train_step's */
    nb_zero *zero;           /* NULL; ZeRO stage 0-2 over dp instead of ddp */
    nb_grad_scaler *scaler;  /* NULL: no loss scaling */
    double grad_clip;        /* 0: no clipping */
} nb_gpt_tp_step_opts;
nb_gpt_tp_step_opts nb_gpt_tp_step_defaults(void); /* all zero/NULL */
double nb_gpt_tp_train_step_ex(nb_module *m, nb_optim *opt, nb_tensor *const *x,
                               nb_tensor *const *y, int n_micro, const nb_gpt_tp_step_opts *o,
                               double *grad_norm);

#ifdef __cplusplus
}
#endif
#endif
