/* nabla/tp.h - tensor (and sequence) parallelism: plans that make an ordinary model's modules
 * parallel (nb_parallelize), the public parallel layers, the autograd-aware collectives they
 * are made of (Megatron-LM's mappings), and the vocab-parallel embedding and cross entropy.
 *
 * Usage (the same binary under `mpirun -np 4`: 2 data-parallel replicas of a 2-way
 * tensor-parallel model):
 *     nb_comm *world = nb_comm_world();
 *     nb_mesh *mesh = nb_mesh_new(world, "dp tp", (int[]){-1, 2});    // nabla/mesh.h
 *     nb_module *model = build_model(seed);       // whole, the same seed on every rank
 *     static const nb_tp_rule plan[] = {
 *         {"blocks.*.fc1", NB_TP_COLWISE}, {"blocks.*.fc2", NB_TP_ROWWISE},
 *         {"blocks.*.ln", NB_TP_SEQUENCE}, {"head", NB_TP_COLWISE}, {0}};
 *     nb_parallelize_opts po = nb_parallelize_defaults();
 *     po.sequence_parallel = true;
 *     if (nb_parallelize(model, mesh, plan, &po) != NB_OK) puts(nb_last_error());
 *     nb_ddp *ddp = nb_ddp_new(model, nb_mesh_group(mesh, "dp"), NULL);  // also sums the
 *                                                  // sequence-parallel partial gradients
 *     ... train as one process would; nb_clip_grad_norm gives the whole model's norm ...
 *     nb_ddp_free(ddp);
 *     nb_module_free(model);
 *     nb_mesh_free(mesh);
 *     nb_comm_free(world);
 *
 * Autograd-aware collectives (tensor ops: they record on the tape, their backward is the
 * dual collective; Megatron's mappings). With c the tensor-parallel group:
 *   nb_copy_to_region(x, c)        forward identity,            backward allreduce (sum)
 *   nb_reduce_from_region(x, c)    forward allreduce (sum),     backward identity
 *   nb_gather_along(x, c, dim)     forward all-gather along dim, backward keep own chunk
 *   nb_split_along(x, c, dim)      forward keep own chunk,      backward all-gather
 *   nb_reduce_scatter_along(x, c, dim)  forward reduce-scatter along dim, backward all-gather
 *   nb_allgather_along(x, c, dim)       forward all-gather along dim, backward reduce-scatter
 * (the last two are sequence parallelism's pair, dim the sequence dim). Chunks are rank
 * ordered and equal: the size along dim must divide by the group size (NB_ESHAPE). Every
 * rank of c must call the same ops in the same order, forward and backward. The output is
 * a new tensor in the current scope (nb_copy_to_region's shares x's storage). The node
 * borrows c: the communicator must outlive the graph. With a size-1 group each is the
 * identity (plus a copy).
 *
 * Ownership: nb_parallelize changes the model in place (its modules and parameters stay the
 * model's); the mesh is borrowed and must outlive the model's graphs. The layer constructors
 * return a module the caller frees with nb_module_free. */
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

/* ---- autograd-aware collectives ------------------------------------------------------------ */
nb_tensor *nb_copy_to_region(nb_tensor *x, nb_comm *c);
nb_tensor *nb_reduce_from_region(nb_tensor *x, nb_comm *c);
nb_tensor *nb_gather_along(nb_tensor *x, nb_comm *c, int dim);
nb_tensor *nb_split_along(nb_tensor *x, nb_comm *c, int dim);
nb_tensor *nb_reduce_scatter_along(nb_tensor *x, nb_comm *c, int dim);
nb_tensor *nb_allgather_along(nb_tensor *x, nb_comm *c, int dim);

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
 * head's size, so no head is cut); 0: 1. COLWISE with a unit on U units (per block) fewer than
 * the T ranks, T a multiple of U: each unit is held by T / U consecutive ranks (rank r holds
 * unit r / (T / U): key/value heads replicated over the ranks of their query heads), the
 * placement's shard has copies T / U, and the gradients are partial sums over the copies that
 * the gradient reducer (nb_ddp / nb_zero) completes; when neither divides, NB_EINVAL. */
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
    uint32_t _init;          /* private: set by nb_parallelize_defaults() only */
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
 * tp size (or into whole units, or, column-wise with a unit, into units the tp size is a
 * multiple of), a flattened model. Ownership: the model keeps its modules
 * and parameters; the mesh is borrowed and must outlive the model. */
nb_status nb_parallelize(nb_module *model, const nb_mesh *mesh, const nb_tp_rule *plan,
                         const nb_parallelize_opts *o);

/* ---- tensor-parallel layers ---------------------------------------------------------------- */
/* A linear layer made column- or row-parallel over mesh's tp dimension, as a plan's
 * NB_TP_COLWISE / NB_TP_ROWWISE style makes one (nb_parallelize): the whole 1-rank layer is
 * drawn (nb_linear_new with o->linear, so the same seed gives the same model in any layout)
 * and this rank keeps its part. Column-parallel (in -> out): rows [r out/tp, (r+1) out/tp) of
 * the weight and bias; forward: the input enters the region (copy_to_region, or with
 * sequence_parallel an all-gather of the sequence, dim -2), then its output columns (or with
 * gather_output the whole output). Row-parallel: columns [r in/tp, ...) of the weight, the
 * whole bias; forward: this rank's part of the input (input_is_parallel; else the whole input,
 * split here) times its columns, summed over tp (allreduce, or with sequence_parallel a
 * reduce-scatter of the sequence), plus the bias. Parameter names are "weight" and "bias", as
 * nb_linear's, and the parameters carry their placements. Under sequence parallelism the
 * row-parallel bias's gradient is a partial sum: wrap the model with nb_ddp / nb_zero over
 * the mesh's dp group (which sums it). NB_EINVAL when tp does not divide out (column) or in
 * (row). */
typedef struct nb_tp_linear_opts {
    uint32_t _init;          /* private: set by nb_tp_linear_defaults() only */
    bool gather_output;      /* column-parallel: false (the output is this rank's columns) */
    bool input_is_parallel;  /* row-parallel: true (the input is a column-parallel output) */
    bool sequence_parallel;  /* false; true: the activations outside are sequence shards */
    const char *tp_dim;      /* "tp" */
    nb_linear_opts linear;   /* nb_linear_defaults(): bias, dtype, initialization */
} nb_tp_linear_opts;
nb_tp_linear_opts nb_tp_linear_defaults(void);
nb_module *nb_column_parallel_linear_new(int64_t in, int64_t out, const nb_mesh *mesh,
                                         const nb_tp_linear_opts *o);
nb_module *nb_row_parallel_linear_new(int64_t in, int64_t out, const nb_mesh *mesh,
                                      const nb_tp_linear_opts *o);

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

#ifdef __cplusplus
}
#endif
#endif
