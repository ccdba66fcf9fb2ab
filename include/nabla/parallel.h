/* nabla/parallel.h - communicators, collectives and data parallel training.
 *
 * Usage (the same binary runs alone or under `mpirun -np 4 ./prog`):
 *     nb_comm *world = nb_comm_world();              // size 1 without mpirun
 *     nb_module *model = build_model();
 *     nb_ddp *ddp = nb_ddp_new(model, world, NULL);  // broadcasts rank 0's weights
 *     nb_optim *opt = nb_adam_new(nb_parameters(model), NULL);
 *     for (...) {
 *         nb_scope_begin();
 *         nb_tensor *loss = nb_cross_entropy(nb_forward(model, x), y, NULL);
 *         nb_zero_grad(opt);
 *         nb_backward(loss);             // bucket allreduces start during backward and are
 *                                        // waited for at its end: gradients are averaged
 *         nb_step(opt);
 *         nb_scope_end();
 *     }
 *     nb_ddp_free(ddp);
 *     nb_comm_free(world);
 *
 * Communicators: nb_comm_world() wraps MPI_COMM_WORLD when nabla was built with MPI and the
 * program runs under mpirun/srun (MPI is initialized on first use, with
 * MPI_THREAD_MULTIPLE; a program started without a launcher is a size-1 world), and a
 * size-1 communicator otherwise. With the shared libnabla, the first nb_comm_world() that
 * wants MPI opens the MPI plugin, libnabla-mpi.so (next to libnabla.so; docs/embedding.md);
 * without it nb_comm_world() is NULL with NB_EUNSUPPORTED and the reason. nb_comm_split
 * makes subgroups; nb_mesh_new (nabla/mesh.h) makes the data, tensor and pipeline parallel
 * groups from the world.
 * Each communicator has a backend (a table of functions: "self", "mpi") so callers never
 * depend on which one runs. On a communicator of several ranks, collectives of CUDA tensors
 * run on the GPU through NCCL when the CUDA plugin has it (made on the first such collective,
 * one GPU per rank: the one of nb_comm_local_rank; NB_COMM_NCCL=0 moves them through host
 * memory instead): DDP, ZeRO and the tensor-parallel layers need no change.
 *
 * Collectives take tensors of any nabla dtype (f16/bf16 sums are computed in f32; NCCL's, of
 * CUDA tensors, in their own precision), work in
 * place where that is natural, and exist in a blocking form and an asynchronous form that
 * returns an nb_work handle to wait on or test. Sizes need not divide by the world size.
 * NB_REDUCE_AVG needs a float dtype (NB_EDTYPE otherwise); on bool, sum and max are a
 * logical or, min a logical and. Non-contiguous tensors are copied to contiguous temporaries
 * (outputs are copied back when the operation completes); contiguous ones are used in place
 * without copies. Collectives write tensor data directly: autograd does not record them.
 * Every rank must call the collectives of a communicator in the same order with the same
 * sizes, dtypes, reduce ops and roots; ranks that disagree get NB_ECOMM naming both sides
 * (within a fraction of a second when their data cannot meet; NB_COMM_DEBUG=detail compares
 * every collective across the ranks before it runs), and the communicator refuses its later
 * collectives. See docs/distributed.md, "Ranks that disagree".
 * Failures are values: an MPI error, or a peer that does not arrive within the timeout,
 * returns NB_ECOMM / NB_ETIMEOUT with a message naming the operation and the ranks that did
 * not arrive - a dead peer never hangs the job forever.
 *
 * Ownership: nb_comm_world() returns a new handle on each call (free it with nb_comm_free;
 * MPI is finalized at exit after the last one is freed). An nb_work belongs to the caller
 * until nb_work_wait/nb_work_free. Tensors passed to an asynchronous collective must stay
 * alive and unmodified until it completes. */
#ifndef NABLA_PARALLEL_H
#define NABLA_PARALLEL_H

#include <stdbool.h>
#include <stdint.h>

#include "nabla/checkpoint.h"
#include "nabla/nn.h"
#include "nabla/optim.h"
#include "nabla/status.h"
#include "nabla/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_comm nb_comm;
typedef struct nb_work nb_work;

typedef enum nb_reduce_op { NB_REDUCE_SUM = 0, NB_REDUCE_AVG, NB_REDUCE_MAX, NB_REDUCE_MIN } nb_reduce_op;

/* ---- communicators ------------------------------------------------------------------------ */
nb_comm *nb_comm_world(void);
/* A size-1 communicator (no MPI), for tests and single-process runs. */
nb_comm *nb_comm_self(void);
void nb_comm_free(nb_comm *c);
int nb_comm_rank(const nb_comm *c);
int nb_comm_size(const nb_comm *c);
const char *nb_comm_backend(const nb_comm *c);  /* "self", "mpi" */
/* This process's rank among the world's processes on its machine (MPI_COMM_TYPE_SHARED, known
 * once nb_comm_world made an MPI world; 0 otherwise): the GPU NCCL uses for this rank, so
 * put the model there with nb_cuda_set_device(nb_comm_local_rank()) (GPU 0 when the process
 * sees one GPU only). */
int nb_comm_local_rank(void);
/* Ranks with the same color form a new communicator, ordered by key (MPI_Comm_split).
 * Collective over c. */
nb_comm *nb_comm_split(nb_comm *c, int color, int key);
/* The deadline of every wait on a communicator, in seconds, unless the NB_COMM_TIMEOUT
 * environment variable, nb_comm_set_timeout or a program's --comm-timeout says otherwise:
 * one value for the library and the bundled programs (docs/distributed.md, "When a peer
 * dies"). */
#define NB_COMM_TIMEOUT_DEFAULT 300.0
/* Timeout of blocking waits on this communicator, in seconds (default: NB_COMM_TIMEOUT
 * environment variable, else NB_COMM_TIMEOUT_DEFAULT). 0 waits forever. */
void nb_comm_set_timeout(nb_comm *c, double seconds);
double nb_comm_timeout(const nb_comm *c);

/* ---- collectives (blocking) ----------------------------------------------------------------- */
nb_status nb_allreduce(nb_comm *c, nb_tensor *t, nb_reduce_op op);            /* in place */
nb_status nb_broadcast(nb_comm *c, nb_tensor *t, int root);                   /* in place */
/* Reduce to root: t on root holds the result; other ranks' t is unchanged. */
nb_status nb_reduce(nb_comm *c, nb_tensor *t, nb_reduce_op op, int root);
/* out (size * numel(in) elements, rank-major) gets every rank's in. Also the inverse of
 * nb_reduce_scatter: when in is this rank's chunk of out (nb_comm_chunk over numel(out)),
 * out gets every rank's chunk at its place. */
nb_status nb_allgather(nb_comm *c, nb_tensor *out, const nb_tensor *in);
/* Reduce in (n elements) and scatter: rank r gets elements [r*n/size-ish chunk] into out.
 * Chunks: ceil(n / size) elements each, the last ones shorter (possibly empty);
 * nb_comm_chunk gives the range. */
nb_status nb_reduce_scatter(nb_comm *c, nb_tensor *out, const nb_tensor *in, nb_reduce_op op);
/* in and out have size * k elements: block j of in goes to rank j, block i of out came
 * from rank i. */
nb_status nb_all_to_all(nb_comm *c, nb_tensor *out, const nb_tensor *in);
nb_status nb_barrier(nb_comm *c);
/* Point to point (pipeline parallel): tag >= 0. */
nb_status nb_send(nb_comm *c, const nb_tensor *t, int dst, int tag);
nb_status nb_recv(nb_comm *c, nb_tensor *t, int src, int tag);
/* The [begin, end) element range of rank r's chunk when n elements are split over size. */
void nb_comm_chunk(int64_t n, int size, int r, int64_t *begin, int64_t *end);

/* ---- asynchronous forms -------------------------------------------------------------------- */
nb_work *nb_allreduce_async(nb_comm *c, nb_tensor *t, nb_reduce_op op);
nb_work *nb_broadcast_async(nb_comm *c, nb_tensor *t, int root);
nb_work *nb_allgather_async(nb_comm *c, nb_tensor *out, const nb_tensor *in);
nb_work *nb_reduce_scatter_async(nb_comm *c, nb_tensor *out, const nb_tensor *in, nb_reduce_op op);
nb_work *nb_reduce_async(nb_comm *c, nb_tensor *t, nb_reduce_op op, int root);
nb_work *nb_all_to_all_async(nb_comm *c, nb_tensor *out, const nb_tensor *in);
nb_work *nb_barrier_async(nb_comm *c);
nb_work *nb_send_async(nb_comm *c, const nb_tensor *t, int dst, int tag);
nb_work *nb_recv_async(nb_comm *c, nb_tensor *t, int src, int tag);
/* Wait (up to the communicator's timeout, counted from this call - or from the operation's
 * start if another operation of the communicator timed out after it started and the
 * communicator has not moved since) and free the handle. On
 * NB_ETIMEOUT the message names the ranks that did not arrive; the operation cannot be
 * cancelled and stays in flight (its tensors kept alive, possibly still written) until the
 * late ranks arrive or the process ends. */
nb_status nb_work_wait(nb_work *w);
/* 1 done, 0 not yet, negative status on failure, NB_ETIMEOUT once the operation has been
 * pending longer than the timeout since it started (the handle stays valid until waited
 * or freed). */
int nb_work_test(nb_work *w);
/* Free without waiting: only valid after nb_work_test returned 1 or an error. */
void nb_work_free(nb_work *w);

/* ---- data parallel --------------------------------------------------------------------------- */
/* Options: nb_ddp_defaults() gives the values after each field; NULL means those. Every
 * field is read as written (docs/conventions.md). */
typedef struct nb_ddp_opts {
    uint32_t _init;            /* private: set by nb_ddp_defaults() only */
    double bucket_mb;          /* bucket size in MiB: 25 (0: one parameter per bucket) */
    bool find_unused;          /* false; allow parameters that get no gradient in a step (they
                                * are reduced as zeros); otherwise that is an error */
    bool no_broadcast;         /* false; skip broadcasting rank 0's parameters and buffers at
                                * wrap */
    nb_dtype reduce_dtype;     /* NB_F32: gradients travel in their own dtype (f16/bf16 ones as
                                * f32, summed in f32). NB_F16 / NB_BF16: compressed (Horovod's
                                * fp16 compression, DDP's bf16_compress_hook): each bucket is
                                * rounded to it, the ranks' copies are added in f32 (an
                                * all-to-all, then an all-gather of the rounded means), half
                                * the bytes of an f32 allreduce; no effect on one rank.
                                * docs/distributed.md, "Compressed communication" */
} nb_ddp_opts;
nb_ddp_opts nb_ddp_defaults(void);

typedef struct nb_ddp nb_ddp;

/* Wrap a module for data parallel training over c (borrowed, like the module): flattens its
 * parameters (nb_module_flatten_parameters), broadcasts parameters and buffers from rank 0,
 * builds buckets over the flat gradient buffer in reverse registration order and registers
 * gradient hooks that start a bucket's asynchronous allreduce as soon as its last gradient
 * is complete. When a backward that reached the model ends, nb_backward itself launches
 * what is left, waits for every bucket and checks the step: its errors (a failed or
 * timed-out collective, or, without find_unused, a parameter that got no gradient) are
 * nb_backward's. nb_step refuses (NB_ESTATE, changing nothing) gradients that were never
 * averaged: after backward passes with sync disabled only, or a failed synchronisation.
 * A module can be wrapped by one nb_ddp at a time (NB_ESTATE). */
nb_ddp *nb_ddp_new(nb_module *model, nb_comm *c, const nb_ddp_opts *o);
void nb_ddp_free(nb_ddp *d);
/* Make sure the gradients are averaged. After a backward with sync enabled there is nothing
 * left to do: it returns at once, changing nothing, with the outcome of that backward's
 * synchronisation (its error again, if it failed). Gradients accumulated while sync was
 * disabled are averaged now if sync is enabled again (nothing happens while disabled).
 * Calling it between nb_backward and nb_step is optional and harmless. */
nb_status nb_ddp_sync(nb_ddp *d);
/* Gradient accumulation: while disabled, backward only accumulates locally (no
 * communication); enable again before the last micro-step's backward, whose end averages
 * the accumulated gradients. */
void nb_ddp_set_sync_enabled(nb_ddp *d, bool enabled);
/* Seconds of the last step's communication that were not hidden behind backward (the time
 * the end of backward spent waiting for the buckets), and the number of buckets. */
double nb_ddp_exposed_comm_s(const nb_ddp *d);
int nb_ddp_num_buckets(const nb_ddp *d);
/* Gradient bytes this rank sent in the last synchronised step, counted for bandwidth-optimal
 * collectives (an allreduce of n elements of e bytes over p ranks sends 2 (p-1)/p n e; an
 * all-to-all or all-gather (p-1)/p n e): halved by reduce_dtype NB_BF16 on f32 gradients.
 * 0 on one rank. */
int64_t nb_ddp_comm_bytes(const nb_ddp *d);
/* Make the loss scaler's inf/NaN check global (nabla/optim.h, "loss scaling"): each
 * unscale then allreduces its flag (max) over c, one 8-byte collective per step, so every
 * rank skips the same steps and keeps the same scale. c is borrowed (NULL: local again);
 * every rank of c must call nb_grad_scaler_step (or unscale) in the same steps. Under nb_ddp
 * the averaged gradients are the same on every rank, so the flags agree anyway; the
 * collective makes that explicit and costs microseconds. */
nb_status nb_grad_scaler_set_comm(nb_grad_scaler *s, nb_comm *c);

/* ---- ZeRO: sharded optimizer state, gradients and parameters ------------------------------------------- */
/* nb_zero trains data parallel like nb_ddp, but each rank keeps only its shard of the model
 * state (ZeRO, as DeepSpeed and PyTorch FSDP's SHARD_GRAD_OP):
 *     nb_optim *opt = nb_adamw_new(&decay, &ao);      // groups as usual, then:
 *     nb_zero_opts zo = nb_zero_defaults();           // stage 2
 *     nb_zero *z = nb_zero_new(model, opt, world, &zo);
 *     for (...) {
 *         nb_zero_grad(opt);
 *         nb_backward(loss);                // per-bucket reduce-scatters run during backward
 *         nb_clip_grad_norm(nb_optim_params(opt), 1.0, 2); // optional: the global norm
 *         nb_step(opt);                     // steps this rank's shard, then all-gathers
 *     }
 *     nb_zero_free(z);                      // before the optimizer and the model
 * Layout: the flat parameter buffer (nb_module_flatten_parameters) is cut into buckets as
 * nb_ddp does; each bucket is split into nb_comm_chunk's balanced contiguous ranges, and a
 * rank's shard is its chunk of every bucket. Backward reduce-scatters (averages) each bucket
 * as soon as it is complete, so a rank ends with the averaged gradient of its shard only.
 * Stage 1: optimizer state for the shard only (the full gradient buffer stays, as in DDP).
 * Stage 2: also gradients: a bucket's gradients are copied into one of two staging buffers
 * (the size of the largest bucket) when it is launched and then dropped, so only the
 * shard's gradient stays resident. Stage 3: also parameters (FSDP's FULL_SHARD): one
 * bucket ("unit") per module that registered parameters, each in a buffer of its own that
 * has memory only while gathered; each rank keeps its chunk of every unit. Forward hooks
 * all-gather a unit before its module's forward (prefetching the next unit) and release it
 * after; a pre-backward hook on the module's output gathers it again before its backward
 * rules, and it is released once its gradients are complete (reduced as in stage 2).
 * Parameters no module forward uses through nb_forward (a GPT's embeddings, read by its own
 * forward) are gathered by the root's forward and backward for their whole length; which
 * are which is learnt in the first forward. nb_step updates the shard only. The module
 * loses its flat parameter buffer. Stage 0 is plain nb_ddp (every rank holds everything).
 * The optimizer (any element-wise one: SGD, Adam/AdamW, RMSprop, Adagrad, with its groups
 * and schedules) is used as a template: nb_zero_new builds an optimizer of the same kind
 * over the pieces of the shard (one per parameter it overlaps, in that parameter's group,
 * named after it), and from then on nb_step(opt) updates the shard with opt's current
 * hyperparameters (so nb_optim_set_lr and schedules act as before) and all-gathers the
 * parameters. opt itself keeps no state; nb_zero_optim gives the shard's optimizer (its
 * nb_optim_state is this rank's part). Gradient accumulation: nb_zero_set_sync_enabled as
 * nb_ddp's (with sync disabled the gradients accumulate locally, at full size, as FSDP's
 * no_sync). Placements (nabla/mesh.h): each parameter records its flat shard over the mesh
 * dimension "dp" (its piece of the reduced gradient stands for its gradient), and each piece
 * of the shard optimizer is placed as its parameter plus that shard, so nb_clip_grad_norm
 * over opt's (or the shard optimizer's) parameters is the global norm over every shard, the
 * same on every rank, and clips the shards. A model without a mesh gets a 1-D mesh over c
 * ("dp", owned by the nb_zero: the placements go with it); a model placed on a mesh
 * (nb_parallelize) must be wrapped over nb_mesh_group(mesh, "dp") (NB_EINVAL otherwise).
 * Checkpoints: nb_checkpoint_save / _load (nabla/checkpoint.h).
 * Ownership: model, opt and c are borrowed and must outlive the nb_zero. At stage 3,
 * nb_zero_free gathers the parameters (so the model is whole again, though no longer
 * flat): call it on every rank, after the last backward. After a collective of c timed out
 * or failed (and none completed since), it does not communicate: the model stays sharded
 * and the process can exit without waiting on the missing peer again. */
typedef struct nb_zero_opts {
    uint32_t _init;            /* private: set by nb_zero_defaults() only */
    int stage;                 /* 0, 1, 2 or 3: 2 */
    double bucket_mb;          /* bucket size in MiB, as nb_ddp's: 25 */
    bool find_unused;          /* false; as nb_ddp's */
    bool no_broadcast;         /* false; as nb_ddp's */
    bool offload_optimizer;    /* false. ZeRO-Offload, stages 1-3 (stage 0: NB_EINVAL): when
                                * the parameters are on a device other than the CPU, this
                                * rank's optimizer (state and, for f16/bf16 parameters, the f32
                                * master) lives on the host over a host copy of its shard.
                                * Each step copies the averaged gradient shard device -> host
                                * when it is reduced (so clipping and the loss scaler see it),
                                * and nb_step copies the parameter shard device -> host, runs
                                * the unchanged CPU optimizer there, copies the updated shard
                                * host -> device, then all-gathers as usual. The copies are
                                * synchronous (no overlap of the update with transfers yet);
                                * the host buffers are ordinary host memory (pinned memory
                                * waits for the CUDA backend). Tested only on the guard test
                                * device, unverified on a GPU. On a CPU model it is accepted
                                * and does nothing (the state is on the host already). */
    nb_dtype reduce_dtype;     /* NB_F32, as nb_ddp_opts.reduce_dtype (stage 0 passes it to
                                * its nb_ddp). NB_F16 / NB_BF16 at stages 1-3: each bucket's
                                * gradient is rounded to it, an all-to-all gives each rank every
                                * rank's copy of its chunk, which it adds in f32 (rank order),
                                * divides by the size and writes into its gradient shard (f32,
                                * or the parameters' dtype), rounded once: half the bytes of an
                                * f32 reduce-scatter; no effect on one rank. The ranks must
                                * agree (checked). docs/distributed.md, "Compressed
                                * communication" */
} nb_zero_opts;
nb_zero_opts nb_zero_defaults(void);

typedef struct nb_zero nb_zero;

/* Wrap model (whose parameters opt updates) over c. Errors: a stage outside 0-3, stage 3 over
 * a pipeline's module (NB_EUNSUPPORTED: stages 0-2 work there), an optimizer with state
 * already (wrap before the first step) or over tensors that are not the model's parameters, a
 * model already wrapped (NB_ESTATE), and those of nb_ddp_new. Collective over c. */
nb_zero *nb_zero_new(nb_module *model, nb_optim *opt, nb_comm *c, const nb_zero_opts *o);
void nb_zero_free(nb_zero *z);
int nb_zero_stage(const nb_zero *z);
/* As nb_ddp_sync / nb_ddp_set_sync_enabled / nb_ddp_exposed_comm_s / nb_ddp_num_buckets. */
nb_status nb_zero_sync(nb_zero *z);
void nb_zero_set_sync_enabled(nb_zero *z, bool enabled);
double nb_zero_exposed_comm_s(const nb_zero *z);
int nb_zero_num_buckets(const nb_zero *z);
/* As nb_ddp_comm_bytes: the gradient bytes this rank sent in the last synchronised step's
 * reduce-scatters (an all-to-all when compressed: (p-1)/p n e each), halved by reduce_dtype
 * NB_BF16 on f32 gradients; 0 on one rank. Stage 0: its nb_ddp's. */
int64_t nb_zero_comm_bytes(const nb_zero *z);
/* The optimizer that updates this rank's shard (owned by z), e.g. for its state. */
nb_optim *nb_zero_optim(const nb_zero *z);
/* Stage 3: make every parameter whole on every rank (e.g. to read, save or change the model
 * outside a forward), until nb_zero_release_params, which keeps this rank's part of what
 * was written into them and frees the whole copies again. nb_step releases them too
 * (without keeping writes). No-ops below stage 3. Collective (gather); release is local. */
nb_status nb_zero_gather_params(nb_zero *z);
nb_status nb_zero_release_params(nb_zero *z);

/* Bytes of model state resident on this rank. Formulas per rank (P parameters, N ranks,
 * f32, Adam: 8 bytes of state per element): stage 0: 4P + 4P + 8P = 16P; stage 1:
 * 4P + 4P + 8P/N; stage 2: 4P + 4P/N + 8P/N; stage 3: 4P/N + 4P/N + 8P/N (params: the
 * shard plus the units gathered at the time, none between steps), plus comm_buffers (stages
 * 2 and 3: two staging buffers of the largest bucket). bf16/f16 parameters with Adam (f32
 * m, v and master: 12 bytes per shard element): 16P, 4P + 12P/N, 2P + 14P/N, 16P/N.
 * Optimizer state counts once the first step made it. With offload_optimizer the state
 * moves to host_bytes, with host_buffers (the shard's host parameters and gradients: 2P/N
 * + 2P/N for bf16). */
typedef struct nb_zero_memory_info {
    int64_t params;            /* the flat parameter buffer */
    int64_t grads;             /* resident gradients (stage 2: the shard, plus any local
                                * gradients not yet reduced) */
    int64_t optim_state;       /* optimizer state tensors held on this rank (with the f32
                                * master weights of f16/bf16 parameters) */
    int64_t comm_buffers;      /* persistent communication buffers */
    int64_t host_buffers;      /* offload_optimizer: the host copies of the shard's parameters
                                * and gradients (0 without offload) */
    int64_t total;             /* the sum */
    int64_t device_bytes;      /* of total, what is where the parameters are (the device; the
                                * host for a CPU model) */
    int64_t host_bytes;        /* of total, what offload_optimizer keeps on the host instead
                                * (optim_state + host_buffers; 0 without offload) */
} nb_zero_memory_info;
nb_status nb_zero_memory(const nb_zero *z, nb_zero_memory_info *out);
/* The same figures planned without building anything: numel parameters (elements of the
 * flat buffer), elem_size bytes each, state_slots state tensors per element (Adam 2, SGD
 * with momentum 1, ...), on world ranks at stage, with buckets of bucket_mb MiB (the largest
 * bucket taken as bucket_mb, or numel if smaller; at stage 3 pass the largest unit's size).
 * elem_size 2 (f16/bf16) counts the optimizer's f32 state and f32 master weights: 4 *
 * state_slots + 4 bytes per shard element (Adam: 12). With such parameters and Adam the
 * model state per rank is 16P (stage 0), 4P + 12P/N (1), 2P + 14P/N (2), 16P/N (3). The plan
 * knows nothing of offload_optimizer (host_buffers and host_bytes are 0, device_bytes is
 * total). */
nb_status nb_zero_memory_plan(int64_t numel, int elem_size, int state_slots, int world,
                              int stage, double bucket_mb, nb_zero_memory_info *out);

/* ---- checkpoints ------------------------------------------------------------------------ */
/* A ZeRO run saves and loads with nb_checkpoint_save / nb_checkpoint_load (nabla/checkpoint.h)
 * like any other layout: every rank calls them with the model and the optimizer given to
 * nb_zero_new; each rank writes its shard of the state into one folder, and any layout (any
 * world size, any stage, one process without ZeRO) loads it. */

#ifdef __cplusplus
}
#endif
#endif
