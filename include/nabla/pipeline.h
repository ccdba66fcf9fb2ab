/* nabla/pipeline.h - pipeline parallelism: an ordinary model's ordered layers split into
 * stages over the mesh's pp dimension (nb_pipeline), run by a schedule (GPipe, 1F1B,
 * interleaved 1F1B) over micro-batches; and the schedule engine itself, for stage functions of
 * your own (nb_pipe_run).
 *
 * Usage (the same binary under `mpirun -np 4`: 2 data-parallel replicas of a 2-stage model):
 *     #include <nabla/nabla.h>
 *     #include <math.h>
 *     #include <stdio.h>
 *     static nb_tensor *mse(nb_tensor *out, nb_tensor *y, void *ctx) {
 *         (void)ctx;
 *         return nb_mse_loss(out, y, NB_REDUCTION_MEAN);
 *     }
 *     int main(void) {
 *         nb_comm *world = nb_comm_world();
 *         nb_mesh *mesh = nb_mesh_new(world, "dp pp", (int[]){-1, 2});
 *         nb_linear_opts lo = nb_linear_defaults();
 *         lo.gen = nb_generator_new(0);                  // the same seed on every rank
 *         nb_module *model = nb_sequential_new(nb_linear_new(8, 16, &lo), nb_relu_new(),
 *                                              nb_linear_new(16, 4, &lo), NULL);
 *         nb_pipeline_opts po = nb_pipeline_defaults();  // 1F1B, 4 micro-batches
 *         po.loss = mse;
 *         nb_pipeline *pipe = mesh ? nb_pipeline_new(model, mesh, NULL, 0, &po) : NULL;
 *         nb_optim *opt = pipe ? nb_sgd_new(nb_parameters(nb_pipeline_module(pipe)), NULL) : NULL;
 *         nb_ddp *ddp = opt ? nb_ddp_new(nb_pipeline_module(pipe), nb_mesh_group(mesh, "dp"), NULL)
 *                           : NULL;
 *         nb_tensor *x = nb_randn((int64_t[]){8, 8}, 2, NB_F32, lo.gen);  // this dp rank's rows
 *         nb_tensor *y = nb_randn((int64_t[]){8, 4}, 2, NB_F32, lo.gen);
 *         double loss = NAN;
 *         if (ddp) {
 *             nb_zero_grad(opt);
 *             loss = nb_pipeline_step(pipe, x, y, NULL);
 *             nb_step(opt);
 *         }
 *         if (nb_comm_rank(world) == 0) printf("loss %.4f\n", loss);
 *         nb_tensor_free(x);
 *         nb_tensor_free(y);
 *         nb_ddp_free(ddp);
 *         nb_optim_free(opt);
 *         nb_pipeline_free(pipe);
 *         nb_module_free(model);
 *         nb_generator_free(lo.gen);
 *         nb_mesh_free(mesh);
 *         nb_comm_free(world);
 *         return isnan(loss);
 *     }
 *
 * Layout: the pipeline group has p ranks; with v virtual stages per rank (interleaved), there
 * are S = v * p stages and rank r runs stages r, r + p, ..., r + (v-1) p (its "chunks"
 * 0..v-1). Stage s sends its output activation to stage s + 1 and receives its input's
 * gradient back. Sends are asynchronous (nb_send_async) and waited for at the end of the
 * step, so a stage goes on computing while its activations travel.
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
 * Ownership: nb_pipeline_new borrows the model and the mesh (they must outlive the pipeline)
 * and returns a pipeline the caller frees with nb_pipeline_free (after any optimizer or
 * wrapper over its module). */
#ifndef NABLA_PIPELINE_H
#define NABLA_PIPELINE_H

#include <stdbool.h>
#include <stdint.h>

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
    uint32_t _init;            /* private: set by nb_pipe_defaults() only */
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
 * the step (overlapped), not after it (nb_zero_new refuses stage 3 there). Errors, the same on every rank before anything changes
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
    uint32_t _init;            /* private: set by nb_pipeline_defaults() only */
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

#ifdef __cplusplus
}
#endif
#endif
