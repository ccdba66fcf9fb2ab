/* nabla/pipeline.h - pipeline parallelism: a model split into stages by layer over the ranks
 * of a communicator, micro-batches run through the stages by a schedule (GPipe, 1F1B,
 * interleaved 1F1B), and the GPT built and trained that way.
 *
 * Usage (the same binary under `mpirun -np 4`: 2 pipelines of 2 stages, data parallel):
 *     #include "nabla/pipeline.h"
 *     #include <math.h>
 *     #include <stdio.h>
 *     int main(void) {
 *         nb_comm *world = nb_comm_world();
 *         int pp_size = nb_comm_size(world) % 2 == 0 ? 2 : 1, r = nb_comm_rank(world);
 *         nb_comm *pp = nb_comm_split(world, r / pp_size, r);  // consecutive ranks: a pipeline
 *         nb_comm *dp = nb_comm_split(world, r % pp_size, r);  // same stage: data parallel
 *         nb_gpt_config cfg = {.vocab_size = 32, .block_size = 8, .n_layer = 4, .n_head = 2,
 *                              .n_embd = 16};
 *         nb_gpt_pipe_opts po = nb_gpt_pipe_defaults();      // 1F1B, 4 micro-batches
 *         nb_generator *init = nb_generator_new(0);          // same seed on every rank
 *         nb_gpt_pipe *pipe = nb_gpt_pipe_new(&cfg, init, pp, dp, &po);
 *         nb_optim *opt = pipe ? nb_adamw_new(nb_parameters(nb_gpt_pipe_module(pipe)), NULL) : NULL;
 *         nb_tensor *x = nb_randint((int64_t[]){8, 8}, 2, NB_I64, 0, 32, init);
 *         nb_tensor *y = nb_randint((int64_t[]){8, 8}, 2, NB_I64, 0, 32, init);
 *         nb_pipe_stats s;
 *         double loss = opt ? nb_gpt_pipe_train_step(pipe, opt, x, y, 1.0, NULL, &s) : NAN;
 *         if (r == 0) printf("loss %.4f bubble %.2f\n", loss, s.bubble);
 *         nb_tensor_free(x);
 *         nb_tensor_free(y);
 *         nb_optim_free(opt);
 *         nb_gpt_pipe_free(pipe);
 *         nb_generator_free(init);
 *         nb_comm_free(dp);
 *         nb_comm_free(pp);
 *         nb_comm_free(world);
 *         return isnan(loss);
 *     }
 *
 * Layout: the pipeline group pp has p ranks; with v virtual stages per rank (interleaved),
 * there are S = v * p stages and rank r runs stages r, r + p, ..., r + (v-1) p (its "chunks"
 * 0..v-1). Stage s sends its output activation to stage s + 1 and receives its input's
 * gradient back. Sends are asynchronous (nb_send_async) and waited for at the end of the
 * step, so a stage goes on computing while its activations travel.
 *
 * Tensor x pipeline parallel (3D with dp): with nb_gpt_pipe_opts.tp (a group of size > 1,
 * e.g. nb_topology_tp of a world of dp * pp * tp, whose pp and dp groups are then the ones
 * to pass) each stage is the tensor-parallel GPT's (nabla/gpt_tp.h): its blocks hold the
 * slices of rank tp_rank, stage 0 the vocab-parallel wte slice and wpe, the last stage ln_f,
 * the tied vocab-parallel head and the vocab-parallel cross entropy. The activation between
 * stages is (b, T, C), or with sequence_parallel this rank's (b, T/tp, C) shard; the
 * replicated parameters' partial gradients are then summed over tp. The tied wte gradient
 * is summed over the first and last stage ranks of the same tp rank, the global norm is
 * over pp x tp (slices on every tp rank, replicated tensors once) after the dp average.
 * Initial values and dropout masks are still those of one process.
 *
 * Schedules (m micro-batches): GPipe runs every forward, then every backward; 1F1B
 * (PipeDream-flush) runs p - r - 1 warm-up forwards, then alternates one forward and one
 * backward, so a stage holds at most p - r micro-batches of activations instead of m;
 * interleaved 1F1B is Megatron-LM's schedule over v chunks per rank (m must be a multiple of
 * p). Ideal bubble fractions (idle time over step time, equal stage costs):
 * (p - 1) / (m + p - 1) for GPipe and 1F1B, (p - 1) / (v m + p - 1) interleaved
 * (nb_pipe_bubble_theory). The measured one is 1 - (compute time, averaged over the
 * stages) / (the step's time until the last stage is done).
 *
 * Ownership: communicators, generators and optimizers are borrowed. nb_gpt_pipe_new returns
 * a pipeline the caller frees with nb_gpt_pipe_free (after any optimizer over its module). */
#ifndef NABLA_PIPELINE_H
#define NABLA_PIPELINE_H

#include <stdbool.h>
#include <stdint.h>

#include "nabla/checkpoint.h"
#include "nabla/gpt.h"
#include "nabla/mesh.h"
#include "nabla/nn.h"
#include "nabla/optim.h"
#include "nabla/parallel.h"
#include "nabla/status.h"
#include "nabla/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nb_pipe_schedule {
    NB_PIPE_GPIPE = 0,
    NB_PIPE_1F1B,
    NB_PIPE_INTERLEAVED
} nb_pipe_schedule;
/* "gpipe", "1f1b", "interleaved". */
const char *nb_pipe_schedule_name(nb_pipe_schedule s);
/* The schedule named so; NB_EINVAL (naming the choices) otherwise. */
nb_status nb_pipe_schedule_parse(const char *name, nb_pipe_schedule *out);
/* The ideal bubble fraction for p stages, m micro-batches and v virtual stages (see above). */
double nb_pipe_bubble_theory(nb_pipe_schedule s, int p, int m, int v);

/* One step's figures on this rank (the averages over the pipeline group where said). */
typedef struct nb_pipe_stats {
    double step_s;        /* wall time of the forward and backward passes, until every
                           * stage is done */
    double compute_s;     /* of which computing forward and backward (this rank) */
    double wait_s;        /* of which waiting for activations, gradients and sends */
    double bubble;        /* the idle share of the step: 1 - (mean compute_s over the
                           * pipeline group) / (the step until every rank is done) */
    double bubble_theory; /* nb_pipe_bubble_theory for this layout */
    double comm_s;        /* gradient communication after the passes (tied embedding, data
                           * parallel, norm): exposed, not overlapped */
    int64_t peak_live_micro; /* most micro-batches whose activations this rank held at once */
} nb_pipe_stats;

/* ---- the schedule engine (any model) ------------------------------------------------------ */
/* A stage function computes chunk `chunk` (0..v-1) of this rank for micro-batch `micro`:
 * input is the activation received from the previous stage (a leaf that requires grad), or
 * NULL on stage 0, which reads its own data for micro. It returns the output activation
 * (shape act_shape, dtype act_dtype), or on the last stage the micro-batch's mean loss (one
 * element), or NULL with the error set. Tensors follow the scope rules: the engine opens a
 * scope around each call and keeps what it needs. */
typedef nb_tensor *(*nb_pipe_stage_fn)(void *ctx, int chunk, int micro, nb_tensor *input);

/* Options (docs/conventions.md): start from nb_pipe_defaults(), whose values follow each
 * field, and set act_shape; every field is read as written (a virtual_stages or loss_scale
 * of 0 is refused, not taken for the default). */
typedef struct nb_pipe_opts {
    nb_pipe_schedule schedule; /* NB_PIPE_1F1B */
    int n_micro;               /* micro-batches per step (>= 1): 1 */
    int virtual_stages;        /* chunks per rank (> 1 only with NB_PIPE_INTERLEAVED): 1 */
    const int64_t *act_shape;  /* the activation passed between stages, the same for all:
                                * NULL (needed with more than one stage) */
    int act_ndim;              /* 0 */
    nb_dtype act_dtype;        /* NB_F32 */
    bool forward_only;         /* false; true: evaluation, the forward passes only (chunk by
                                * chunk, every micro-batch; the schedule is not used),
                                * gradients off, each activation dropped once sent */
    double loss_scale;         /* 1; fp16 loss scaling: the backward starts from loss_scale /
                                * n_micro (> 0, finite); the returned loss is not scaled */
} nb_pipe_opts;
nb_pipe_opts nb_pipe_defaults(void);

/* Run one step's forward and backward passes (forward_only: the forwards) over pp: gradients accumulate into whatever the
 * stage functions' graphs reach (each micro-batch's loss counts 1 / n_micro, so the result
 * is the gradient of the mean loss). Returns the mean loss over the micro-batches, the same
 * on every rank of pp (sent from the last stage), or NAN with the error set. stats may be
 * NULL. Collective over pp. */
double nb_pipe_run(nb_comm *pp, const nb_pipe_opts *o, nb_pipe_stage_fn fn, void *ctx,
                   nb_pipe_stats *stats);

/* ---- a model split into stages ----------------------------------------------------------- */
/* A pipeline made from an ordinary model (parallel/pipe_split.c):
 *     nb_mesh *mesh = nb_mesh_new(world, "dp pp", (int[]){-1, 2});
 *     nb_module *model = build_model(seed);          // whole, the same seed on every rank
 *     nb_pipeline_opts po = nb_pipeline_defaults();  // 1F1B, 4 micro-batches
 *     po.loss = my_loss;                             // on the last stage: (output, target) -> loss
 *     nb_pipeline *pipe = nb_pipeline_new(model, mesh, NULL, 0, &po);  // its children, in order
 *     nb_optim *opt = nb_adamw_new(nb_parameters(nb_pipeline_module(pipe)), NULL);
 *     nb_ddp *ddp = nb_ddp_new(nb_pipeline_module(pipe), nb_mesh_group(mesh, "dp"), NULL);
 *     for (...) {
 *         nb_zero_grad(opt);
 *         double loss = nb_pipeline_step(pipe, x, y, NULL);  // this dp rank's batch
 *         nb_clip_grad_norm(nb_optim_params(opt), 1.0, 2);     // the whole model's norm
 *         nb_step(opt);
 *     }
 *     nb_ddp_free(ddp); nb_optim_free(opt); nb_pipeline_free(pipe); nb_module_free(model);
 * Layers: the model's ordered children (layers NULL), or a list: each nb_pipe_layer names the
 * modules it runs (module paths, space-separated; one pattern with '*' and no forward makes a
 * layer of each module it matches, in order: "transformer.h.*") and how (forward: a function of
 * the model and the activation; NULL: nb_forward of its one module). The first layer gets the
 * micro-batch's input rows, the last layer's output goes to opts.loss with the target rows.
 * Stages: S = pp size x virtual_stages, each a contiguous run of layers: opts.boundaries (S + 1
 * layer indices), or balanced: NB_PIPE_BALANCE_LAYERS splits the layers evenly by count, light
 * layers (an embedding, a head: nb_pipe_layer.light) riding with their neighbour;
 * NB_PIPE_BALANCE_PARAMS minimizes the largest stage's parameter count. Rank r runs stages r,
 * r + p, ... (virtual stages: Megatron's interleaved schedule).
 * Every rank builds the whole model and keeps its stages' modules: nb_pipeline_module is a view
 * listing them under the whole model's names (give it to the optimizer, nb_ddp / nb_zero over
 * dp, checkpoints); the other modules' parameters lose their memory (meta tensors). A tensor
 * modules of stages on several ranks share (a tied embedding and head: the same tensor
 * registered in both) is declared once, by that sharing: each of those ranks keeps a copy
 * (placement: NB_PLACE_REPLICATE over pp), and after the passes its gradients are summed over
 * the copies, before the data-parallel reduction. With nb_ddp or nb_zero (stage 0-2) wrapping
 * the pipeline's module, the gradients are reduced over dp during each rank's last backward of
 * the step (overlapped), not after it. Errors, the same on every rank before anything changes
 * (collective over the mesh's world): fewer layers than stages, bad boundaries, a layer naming
 * no module, a module in two layers, a parameter in no layer, options not from the defaults.
 * Ownership: model and mesh are borrowed and must outlive the pipeline (free it first); the
 * model keeps its modules. */
typedef nb_tensor *(*nb_pipe_layer_fn)(nb_module *model, nb_tensor *x, void *ctx);
typedef struct nb_pipe_layer {
    const char *modules;      /* the modules it runs: paths, space-separated, '*' patterns */
    nb_pipe_layer_fn forward; /* NULL: nb_forward of its one module */
    void *ctx;                /* given to forward */
    bool light;               /* an embedding or a head: not counted when splitting evenly */
} nb_pipe_layer;

/* The loss of the last stage's output for a micro-batch's targets: one element. */
typedef nb_tensor *(*nb_pipe_loss_fn)(nb_tensor *output, nb_tensor *target, void *ctx);

typedef enum nb_pipe_balance { NB_PIPE_BALANCE_LAYERS = 0, NB_PIPE_BALANCE_PARAMS } nb_pipe_balance;

/* Options: start from nb_pipeline_defaults(), whose values follow each field. */
typedef struct nb_pipeline_opts {
    nb_pipe_schedule schedule; /* NB_PIPE_1F1B */
    int n_micro;               /* micro-batches per step: 4 (must divide the batch) */
    int virtual_stages;        /* stages per rank: 1 (> 1 with NB_PIPE_INTERLEAVED) */
    const int *boundaries;     /* NULL: by balance; else S + 1 increasing layer indices */
    nb_pipe_balance balance;   /* NB_PIPE_BALANCE_LAYERS */
    nb_pipe_loss_fn loss;      /* NULL (needed by step and eval) */
    void *loss_ctx;            /* NULL */
    nb_grad_scaler *scaler;    /* NULL; fp16: backward starts from the loss scaled by it (borrowed) */
    const char *pp_dim;        /* "pp": the mesh dimension of the stages */
} nb_pipeline_opts;
nb_pipeline_opts nb_pipeline_defaults(void);

typedef struct nb_pipeline nb_pipeline;

nb_pipeline *nb_pipeline_new(nb_module *model, const nb_mesh *mesh, const nb_pipe_layer *layers,
                             int n_layers, const nb_pipeline_opts *o);
void nb_pipeline_free(nb_pipeline *p);
/* This rank's modules, named as in the whole model (owned by p). */
nb_module *nb_pipeline_module(const nb_pipeline *p);
/* S + 1 stage boundaries (layer indices; owned by p) and S; the number of layers. */
const int *nb_pipeline_boundaries(const nb_pipeline *p, int *n_stages);
int nb_pipeline_num_layers(const nb_pipeline *p);
/* One step's forward and backward passes over x and y, this data-parallel rank's batch (rows
 * split into n_micro micro-batches): gradients accumulate into the parameters (each
 * micro-batch's loss counting 1 / n_micro, so they are those of the mean loss), tied copies are
 * summed, and a wrapping nb_ddp / nb_zero has reduced them when it returns. Returns the mean
 * loss over the micro-batches and the data-parallel ranks (the same on every rank), or NAN with
 * the error set. stats may be NULL. Collective over the mesh's world. Zeroing the gradients,
 * clipping and stepping are the caller's, as in a one-process loop. */
double nb_pipeline_step(nb_pipeline *p, nb_tensor *x, nb_tensor *y, nb_pipe_stats *stats);
/* The mean loss on x and y without gradients, dropout off (evaluation mode during the call):
 * forward passes only, each activation dropped once sent. Nothing is averaged over dp. */
nb_status nb_pipeline_eval(nb_pipeline *p, nb_tensor *x, nb_tensor *y, double *loss,
                           nb_pipe_stats *stats);

/* ---- the GPT as a pipeline ------------------------------------------------------------------- */
typedef struct nb_gpt_pipe_opts {
    nb_pipe_schedule schedule; /* NB_PIPE_1F1B */
    int n_micro;               /* micro-batches per step: 4; must divide the batch */
    int virtual_stages;        /* 1; > 1 needs NB_PIPE_INTERLEAVED */
    const int64_t *boundaries; /* NULL: split by `balance`; else S + 1 increasing layer
                                * indices from 0 to n_layer */
    bool balance_params;       /* false: layers split evenly over the S stages (the first
                                * stages take one more when S does not divide n_layer);
                                * true: the split that makes the largest stage's parameter
                                * count smallest, counting wte and wpe on the first stage and
                                * wte and ln_f on the last (a large vocabulary leaves them
                                * fewer blocks) */
    nb_comm *tp;               /* NULL (or size 1): none; else each stage is tensor parallel
                                * over tp (borrowed; nabla/gpt_tp.h's layout) */
    bool sequence_parallel;    /* false; with tp: activations split along the sequence */
} nb_gpt_pipe_opts;
nb_gpt_pipe_opts nb_gpt_pipe_defaults(void);

typedef struct nb_gpt_pipe nb_gpt_pipe;

/* This rank's part of the GPT of cfg: stage 0 holds transformer.wte and .wpe, the last stage
 * transformer.ln_f and wte again (the tied head; the two copies get the same gradient, summed
 * over the first and last ranks, so they stay equal), and each stage its blocks
 * transformer.h.<i> under the full model's names, so state dicts merge into nb_gpt_new's.
 * Initial values are those of nb_gpt_new(cfg, init) whatever the layout (init must be in the
 * same state on every rank; the draws of other stages' tensors are made and dropped). dp
 * (may be NULL) is the data-parallel group of this stage: gradients are averaged over it.
 * Dropout (cfg.dropout > 0, in training mode) draws one process's masks whatever the
 * layout: cfg.dropout_gen (NULL: the thread's default generator; the same seed on every
 * rank) is set, before each stage computes a micro-batch, to the position one process
 * running the global batch's micro-batches in order would be at, and after the step to
 * where that process would end.
 * Errors (on every rank alike, before any communication): fewer layers than stages, a tp
 * size that does not divide n_head or vocab_size,
 * bad boundaries, v > 1 without the interleaved schedule, n_micro < 1, and interleaved with
 * n_micro not a multiple of p. Collective over pp. */
nb_gpt_pipe *nb_gpt_pipe_new(const nb_gpt_config *cfg, nb_generator *init, nb_comm *pp,
                             nb_comm *dp, const nb_gpt_pipe_opts *o);
void nb_gpt_pipe_free(nb_gpt_pipe *p);
/* The module holding this rank's parameters (owned by p): give it to the optimizer, save its
 * state dict. */
nb_module *nb_gpt_pipe_module(const nb_gpt_pipe *p);
/* ZeRO over the data-parallel group: z (borrowed; NULL: back to plain allreduces) wraps
 * nb_gpt_pipe_module(p) and its optimizer over this stage's dp group, stage 0, 1 or 2
 * (stage 3: NB_EINVAL). nb_gpt_pipe_train_step then keeps z's sync off during the
 * micro-batches, sums the tied embedding's gradients, reduce-scatters over dp once (nb_zero_sync),
 * takes the norm over the dp shards and the stages with wte counted once
 * (ZeRO's private norm with per-parameter skip flags), clips, and steps the shard (nb_step all-gathers). Checkpoints:
 * nb_zero_gather_optim_state before nb_gpt_pipe_save and nb_zero_scatter_optim_state after (and
 * after nb_gpt_pipe_load) write and read the files of a DDP run (nabla/parallel.h). Free z
 * before p. */
nb_status nb_gpt_pipe_set_zero(nb_gpt_pipe *p, nb_zero *z);
/* The stages' first layers: S + 1 indices (owned by p), and S. */
const int64_t *nb_gpt_pipe_boundaries(const nb_gpt_pipe *p, int *n_stages);

/* Write this rank's stage's whole parameters (its tensor-parallel slices all-gathered) into
 * full, a GPT of the same config made by nb_gpt_new, under the same names; the other stages'
 * tensors of full are left as they are. Collective over the stage's tp group. */
nb_status nb_gpt_pipe_gather(nb_gpt_pipe *p, nb_module *full);

/* One optimizer step: x and y (B, T) are this data-parallel rank's batch (the same on every
 * rank of pp), split into n_micro micro-batches of B / n_micro rows (NB_EINVAL when that does
 * not divide). Zeroes the gradients, runs the schedule, sums the tied embedding's gradients,
 * averages over dp, clips the global norm (over every stage, wte counted once; 0: no
 * clipping), and steps opt. Returns the mean loss over the dp ranks (every rank the same),
 * or NAN with the error set. *grad_norm (may be NULL) gets the norm before clipping. A
 * non-finite norm (a gradient overflowed; every rank sees the same) is not applied: the
 * gradients are zeroed, opt is not stepped, and the loss is returned (as nb_gpt_train_step;
 * the caller decides: stop, or skip the step). Runs under the caller's autocast scope, if any
 * (each stage computes in it; the activation between stages stays f32). */
double nb_gpt_pipe_train_step(nb_gpt_pipe *p, nb_optim *opt, nb_tensor *x, nb_tensor *y,
                              double grad_clip, double *grad_norm, nb_pipe_stats *stats);

/* The mean loss of the model on x and y (B, T) (the same on every rank of pp), without
 * gradients and with dropout off (the module is in evaluation mode during the call, then back
 * in its mode): x and y split into n_micro micro-batches of B / n_micro rows (NB_EINVAL when
 * that does not divide), run forward through the stages (nb_pipe_opts.forward_only), the
 * micro-batches' mean losses averaged: nb_gpt_loss of the 1-process model on the same batch,
 * up to float reassociation. Nothing is communicated over dp (its ranks may evaluate
 * different batches; average them yourself). Runs under the caller's autocast scope, if any.
 * Returns NB_OK with *loss set, or the error (*loss NAN). stats may be NULL. Collective over
 * pp. */
nb_status nb_gpt_pipe_eval(nb_gpt_pipe *p, nb_tensor *x, nb_tensor *y, double *loss,
                           nb_pipe_stats *stats);

/* nb_gpt_pipe_train_step with its options in one struct, and a loss scaler for fp16
 * (nabla/optim.h): the backward starts from the loss scaled by it (nb_pipe_opts.loss_scale),
 * the gradients are unscaled after the tied-embedding sum and the dp average (before the
 * norm), and the step goes through nb_grad_scaler_step_update: an overflowed step is skipped
 * and the scale halved (*grad_norm then inf or NaN; not an error). Each rank checks only its
 * stage's gradients: give the scaler the communicator of every rank of the model, pp x dp
 * (nb_grad_scaler_set_comm), so every rank skips the same steps. */
typedef struct nb_gpt_pipe_step_opts {
    double grad_clip;        /* 0: no clipping */
    nb_grad_scaler *scaler;  /* NULL: no loss scaling */
} nb_gpt_pipe_step_opts;
double nb_gpt_pipe_train_step_ex(nb_gpt_pipe *p, nb_optim *opt, nb_tensor *x, nb_tensor *y,
                                 const nb_gpt_pipe_step_opts *o, double *grad_norm,
                                 nb_pipe_stats *stats);

/* ---- checkpoints across layouts ------------------------------------------------------------ */
/* A pipeline checkpoint is a directory: stage-<r>-of-<P>.safetensors for each pipeline rank
 * ("model.<name>" and "optim.<entry>" under the full model's names: nb_optim_state's entries
 * for the stage's parameters) and index.safetensors (metadata: the stage count, the step and
 * the position of cfg.dropout_gen, restored on load when the pipeline has one),
 * written last, so the checkpoint exists only once its index does. Data-parallel rank 0 of
 * each stage writes; the others only agree. nb_gpt_pipe_load reads such a directory into a
 * pipeline of any layout (any p, v, boundaries, dp; p = 1 is one process): each rank takes
 * its parameters' values and optimizer state by name from whichever file holds them (the
 * parameter groups from stage 0's file), so opt must be of the kind and groups that saved.
 * *step (may be NULL) gets the saved step. Both are collective over pp and dp: every rank
 * gets an error if one fails, and nothing is loaded on a rank whose checks failed (with
 * tp, collective over it too).
 * With tensor-parallel stages (tp size T > 1) each stage is T files,
 * stage-<id>-<r>-of-<P>-tp-<t>-of-<T>.safetensors, holding tp rank t's slices under the full
 * names (written by every tp rank of data-parallel rank 0), and the index says "pipe_tp" = T
 * and names them "stage.<r>.<t>"; the loader assembles each split tensor (and its optimizer
 * state) from the T slices and takes its own slice, so any (dp, tp, pp) layout, or one
 * process, loads any other's checkpoint.
 * nb_gpt_pipe_consolidate writes the model of such a directory as one plain file under the
 * nanoGPT names (each tensor once, slices assembled), which nb_gpt_load and PyTorch read.
 * Local. */
nb_status nb_gpt_pipe_save(nb_gpt_pipe *p, nb_optim *opt, const char *dir, int64_t step);
/* Series, flash saves. A save writes each stage's file under a name fresh per save
 * (stage-<id>-<r>-of-<P>.safetensors, an nb_checkpoint file) and the index names them, so
 * saving again into the same directory leaves the previous checkpoint whole until the new
 * index replaces it (then the older stage files go); loading also reads checkpoints whose
 * files are stage-<r>-of-<P>.safetensors.
 * _save_keep: the pipeline checkpoint of step at its place in base's series
 * (nb_checkpoint_path: DIR/checkpoint-<step>.ckpt, run.ckpt -> run-<step>.ckpt, each a
 * directory), then the series' members beyond the newest keep (>= 1) removed.
 * nb_checkpoint_latest finds the newest complete one (a directory counts once its index
 * exists), as it finds ZeRO's.
 * _save_async: the same save (keep 0: dir = base itself), but each stage file written by w
 * (nabla/checkpoint.h: snapshot now, the write on w's thread while training goes on). The
 * index is written by rank 0 only once every rank's file is durable: the ranks agree on that
 * at the next _save_async or at _save_wait (collective), so a kill at any moment leaves the
 * new checkpoint complete or the previous one. A file that failed on any rank: no index for
 * that save, the error on every rank at that call. Call _save_wait before freeing w (the
 * last save has no index without it). w: NB_CKPT_WAIT, one pipeline at a time (its other
 * uses wait for its write). All three collective over pp and dp. */
nb_status nb_gpt_pipe_save_keep(nb_gpt_pipe *p, nb_optim *opt, const char *base, int keep,
                                int64_t step);
nb_status nb_gpt_pipe_save_async(nb_gpt_pipe *p, nb_optim *opt, nb_checkpoint_writer *w,
                                 const char *base, int keep, int64_t step);
nb_status nb_gpt_pipe_save_wait(nb_gpt_pipe *p, nb_checkpoint_writer *w);
nb_status nb_gpt_pipe_load(nb_gpt_pipe *p, nb_optim *opt, const char *dir, int64_t *step);
nb_status nb_gpt_pipe_consolidate(const char *dir, const char *out);

#ifdef __cplusplus
}
#endif
#endif
