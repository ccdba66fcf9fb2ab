/* nabla/tp.h - the 3D topology (data x pipeline x tensor parallel), autograd-aware
 * collectives and the tensor-parallel layers (Megatron-LM's design).
 *
 * Usage (the same binary under `mpirun -np 4`: 2 data-parallel replicas of a 2-way
 * tensor-parallel model):
 *     nb_comm *world = nb_comm_world();
 *     nb_topology_opts to = nb_topology_defaults();     // dp 0 (inferred), pp 1, tp 1
 *     to.tp = 2;
 *     nb_topology *topo = nb_topology_new(world, &to);  // NULL + message if 4 % 2 != 0
 *     nb_comm *tp = nb_topology_tp(topo);               // borrowed: owned by topo
 *     nb_generator *g = nb_generator_new(0);            // same seed on every rank
 *     nb_module *fc = nb_column_parallel_linear_new(64, 256, tp, false, NULL, g);
 *     nb_module *proj = nb_row_parallel_linear_new(256, 64, tp, true, NULL, g);
 *     nb_scope_begin();
 *     nb_tensor *x = nb_randn((int64_t[]){8, 64}, 2, NB_F32, NULL);
 *     nb_tensor *y = nb_forward(proj, nb_gelu(nb_forward(fc, x)));  // one allreduce
 *     nb_backward(nb_sum(y, NULL, 0, false));                       // one allreduce
 *     nb_scope_end();
 *     nb_module_free(fc);
 *     nb_module_free(proj);
 *     nb_generator_free(g);
 *     nb_topology_free(topo);
 *     nb_comm_free(world);
 *
 * Topology: world = dp x pp x tp with the tensor-parallel ranks adjacent (Megatron's order):
 * global rank = (pp_rank * dp + dp_rank) * tp + tp_rank. The groups (tp: the tp ranks of one
 * model replica's stage; dp: the ranks holding the same slice of the same stage; pp: one
 * replica's stages; embedding: the first and last stage of a pipeline, which share the tied
 * embedding) are built once by nb_topology_new (collective over the world). Sizes are
 * checked before any communication, so a bad layout gives the same error on every rank.
 *
 * Autograd-aware collectives (tensor ops: they record on the tape, their backward is the
 * dual collective; Megatron's mappings). With c the tensor-parallel group:
 *   nb_copy_to_region(x, c)        forward identity,            backward allreduce (sum)
 *   nb_reduce_from_region(x, c)    forward allreduce (sum),     backward identity
 *   nb_gather_along(x, c, dim)     forward all-gather along dim, backward keep own chunk
 *   nb_split_along(x, c, dim)      forward keep own chunk,      backward all-gather
 *   nb_reduce_scatter_along(x, c, dim)  forward reduce-scatter along dim, backward all-gather
 *   nb_all_gather_along(x, c, dim)      forward all-gather along dim, backward reduce-scatter
 * (the last two are sequence parallelism's pair, dim the sequence dim). Chunks are rank
 * ordered and equal: the size along dim must divide by the group size (NB_ESHAPE). Every
 * rank of c must call the same ops in the same order, forward and backward. The output is
 * a new tensor in the current scope (nb_copy_to_region's shares x's storage). The node
 * borrows c: the communicator must outlive the graph. With a size-1 group each is the
 * identity (plus a copy).
 *
 * Tensor-parallel layers: their weights are slices of the 1-rank layer's weights, drawn the
 * same way (every rank draws the whole 1-rank tensor from the generator and keeps its
 * slice), so the same seed gives the same model whatever the layout. A column-parallel
 * linear (in -> out) holds rows [r*out/tp, (r+1)*out/tp) of the weight and bias; a
 * row-parallel linear holds columns [r*in/tp, (r+1)*in/tp) of the weight and the whole bias
 * (added once, after the reduction). Parameter names are "weight" and "bias", as nb_linear's.
 *
 * Ownership: nb_topology_new's result is the caller's (nb_topology_free); the communicators
 * it hands out belong to it; world is borrowed and must outlive it. Layer constructors
 * borrow the communicator (it must outlive the module) and return a module the caller
 * frees with nb_module_free. */
#ifndef NABLA_TP_H
#define NABLA_TP_H

#include <stdbool.h>
#include <stdint.h>

#include "nabla/mesh.h"
#include "nabla/nn.h"
#include "nabla/parallel.h"
#include "nabla/random.h"
#include "nabla/status.h"
#include "nabla/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- topology ------------------------------------------------------------------------------ */
typedef struct nb_topology_opts {
    int dp;   /* 0: world size / (pp * tp); else must equal it */
    int pp;   /* 1 */
    int tp;   /* 1 */
} nb_topology_opts;
nb_topology_opts nb_topology_defaults(void);

typedef struct nb_topology nb_topology;

/* Split world into the groups above. Errors (NB_EINVAL, the same on every rank, before any
 * communication): a size below 1, a world size that is not dp * pp * tp. Collective. */
nb_topology *nb_topology_new(nb_comm *world, const nb_topology_opts *o);
void nb_topology_free(nb_topology *t);
int nb_topology_dp_size(const nb_topology *t);
int nb_topology_pp_size(const nb_topology *t);
int nb_topology_tp_size(const nb_topology *t);
int nb_topology_dp_rank(const nb_topology *t);
int nb_topology_pp_rank(const nb_topology *t);
int nb_topology_tp_rank(const nb_topology *t);
/* The groups (borrowed: owned by t). The embedding group holds the first and last stage of
 * this rank's pipeline (one rank when pp is 1); ranks of a middle stage get NULL. */
nb_comm *nb_topology_world(const nb_topology *t);
nb_comm *nb_topology_dp(const nb_topology *t);
nb_comm *nb_topology_pp(const nb_topology *t);
nb_comm *nb_topology_tp(const nb_topology *t);
nb_comm *nb_topology_embedding(const nb_topology *t);
/* "dp=2 pp=1 tp=2" */
const char *nb_topology_describe(const nb_topology *t);

/* ---- autograd-aware collectives ------------------------------------------------------------ */
nb_tensor *nb_copy_to_region(nb_tensor *x, nb_comm *c);
nb_tensor *nb_reduce_from_region(nb_tensor *x, nb_comm *c);
nb_tensor *nb_gather_along(nb_tensor *x, nb_comm *c, int dim);
nb_tensor *nb_split_along(nb_tensor *x, nb_comm *c, int dim);
nb_tensor *nb_reduce_scatter_along(nb_tensor *x, nb_comm *c, int dim);
nb_tensor *nb_all_gather_along(nb_tensor *x, nb_comm *c, int dim);

/* What the collectives above communicated on the calling thread (forward and backward)
 * since the last reset: calls, bytes each rank sends with ring algorithms (2 (p-1)/p of the
 * whole tensor for an allreduce over p ranks, (p-1)/p for an all-gather or reduce-scatter;
 * 0 on one rank) and the seconds spent in them. They are blocking, so all of that time is
 * exposed. */
typedef struct nb_tp_comm_stats {
    int64_t calls;
    int64_t bytes;
    double seconds;
} nb_tp_comm_stats;
void nb_tp_comm_stats_get(nb_tp_comm_stats *out);
void nb_tp_comm_stats_reset(void);

/* Rank r's equal chunk of t along dim as a new contiguous tensor (no autograd), for slicing
 * 1-rank weights; NB_ESHAPE when the size along dim does not divide by size. */
nb_tensor *nb_tp_slice(nb_tensor *t, int dim, int rank, int size);

/* ---- tensor (and sequence) parallel by plan ------------------------------------------------ */
/* How a module is split over the tensor-parallel dimension (plan.c's comment has the details;
 * docs/distributed.md, "Make your own model parallel"):
 *   NB_TP_COLWISE   a linear layer (weight (out, in), bias (out)): out split; the output is
 *                   this rank's columns (cross entropy on it runs vocab-parallel)
 *   NB_TP_ROWWISE   a linear layer: in split; the partial outputs summed over tp, then + bias
 *   NB_TP_VOCAB     an embedding (weight (V, C)): the vocabulary split; the parts summed
 *   NB_TP_SEQUENCE  a module between the parallel regions (norm, dropout, position embedding):
 *                   with sequence parallelism it runs on the rank's sequence shard and its
 *                   parameters' gradients are partial sums (summed over tp by the reducer)
 *   NB_TP_REPLICATE nothing changes */
typedef enum nb_tp_style {
    NB_TP_REPLICATE = 0,
    NB_TP_COLWISE,
    NB_TP_ROWWISE,
    NB_TP_VOCAB,
    NB_TP_SEQUENCE
} nb_tp_style;

/* One rule of a plan. path: a module path from the model's root, dotted names as in
 * nb_parameters ("transformer.h.0.mlp.c_fc"), where '*' matches any run of characters within
 * one name ("transformer.h.*.ln_*"). blocks (COLWISE): a fused projection holding `blocks`
 * equal blocks (q, k and v: 3) is split per block, so each rank holds its heads of each; 0 or
 * 1: one block. unit (COLWISE, ROWWISE): each rank's part must be a whole number of units (a
 * head's size, so no head is cut); 0: 1. */
typedef struct nb_tp_rule {
    const char *path;
    nb_tp_style style;
    int blocks;
    int64_t unit;
} nb_tp_rule;
/* {"h.*.attn.c_attn", NB_TP_COLWISE_FUSED(3)} */
#define NB_TP_COLWISE_FUSED(n) NB_TP_COLWISE, (n)

/* Options: nb_parallelize_defaults() gives the values after each field. */
typedef struct nb_parallelize_opts {
    bool sequence_parallel;  /* false; true: activations between the parallel regions split along
                              * the sequence (dim -2, which must divide by the tp size) */
    const char *tp_dim;      /* "tp": the mesh dimension to split over */
} nb_parallelize_opts;
nb_parallelize_opts nb_parallelize_defaults(void);

/* Apply plan (rules ending with one whose path is NULL) to model over mesh's tp dimension, in
 * place: each matched module's parameters become this rank's parts, with their placements
 * (nabla/mesh.h), and its forward the style's. The model must be whole on every rank (built
 * with the same seed: the parts are slices of the 1-rank model, so every layout starts from
 * the same weights) and not yet wrapped (nb_ddp, nb_zero) or flattened. A parameter two
 * modules share (a tied embedding and output head) is split once, and both rules must split it
 * the same way. Errors, on every rank alike and before anything changes (collective over the
 * mesh): a rule that names no module, a module two rules give different styles, a module that
 * is not what its style needs (a linear layer, an embedding), sizes that do not divide by the
 * tp size (or into whole units), a flattened model. Ownership: the model keeps its modules
 * and parameters; the mesh is borrowed and must outlive the model. */
nb_status nb_parallelize(nb_module *model, const nb_mesh *mesh, const nb_tp_rule *plan,
                         const nb_parallelize_opts *o);

/* ---- tensor-parallel layers ---------------------------------------------------------------- */
/* A column-parallel linear: forward copy_to_region(x), then x @ w_r^T + b_r; with
 * gather_output the (.., out) result is all-gathered, else each rank keeps its (.., out/tp)
 * part. o (NULL: nb_linear_defaults()) and gen are as nb_linear_new's, whose init it
 * slices. NB_EINVAL when tp does not divide out. */
nb_module *nb_column_parallel_linear_new(int64_t in, int64_t out, nb_comm *c, bool gather_output,
                                         const nb_linear_opts *o, nb_generator *gen);
/* A row-parallel linear: its input is this rank's (.., in/tp) part (input_is_parallel) or
 * the whole input, split here; forward x_r @ w_r^T, reduce_from_region, + b. */
nb_module *nb_row_parallel_linear_new(int64_t in, int64_t out, nb_comm *c, bool input_is_parallel,
                                      const nb_linear_opts *o, nb_generator *gen);
/* The same layers made from a 1-rank layer's weight (out, in) and bias (out, or NULL), which
 * are sliced (copied; the arguments stay the caller's). */
nb_module *nb_column_parallel_linear_from(nb_tensor *weight, nb_tensor *bias, nb_comm *c,
                                          bool gather_output);
nb_module *nb_row_parallel_linear_from(nb_tensor *weight, nb_tensor *bias, nb_comm *c,
                                       bool input_is_parallel);

/* Vocab-parallel embedding: weight is this rank's rows [r*V/tp, (r+1)*V/tp) of the (V, C)
 * table; idx (any shape, integer, tokens in [0, V)) -> (idx..., C). Each rank looks up the
 * tokens of its range (zeros for the others) and the parts are summed over c: with seq_dim
 * < 0 by reduce_from_region (every rank gets the whole result), else by
 * reduce_scatter_along(seq_dim) (sequence parallel: each rank gets its chunk along the
 * sequence). NB_EINDEX for a token outside [0, V). */
nb_tensor *nb_vocab_parallel_embedding(nb_tensor *weight, nb_tensor *idx, nb_comm *c, int seq_dim);
/* Vocab-parallel cross entropy: logits (N, V/tp) are this rank's columns [r*V/tp, ..) of the
 * (N, V) logits, targets (N) integer in [0, V); the mean over N of the cross entropy of the
 * whole rows, the same 0-dim value on every rank, computed from the rank's part and three
 * reductions of N numbers (max, sum of exponentials, target logit): the (N, V) logits are
 * never formed. The gradient flows to each rank's part. */
nb_tensor *nb_vocab_parallel_cross_entropy(nb_tensor *logits, nb_tensor *targets, nb_comm *c);

/* Global gradient norm (norm_type 2) of parameters over a tensor-parallel model, clipping
 * them to max_norm (INFINITY: no clipping): sharded[i] says whether params[i] is a slice
 * (its square sum is summed over c) or replicated (counted once). Returns the norm or a
 * negative status. Collective over c. */
double nb_tp_clip_grad_norm(nb_tensor *const *params, const bool *sharded, int n, nb_comm *c,
                            double max_norm);

#ifdef __cplusplus
}
#endif
#endif
