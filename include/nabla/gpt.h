/* nabla/gpt.h - a GPT-2 style language model (nanoGPT's architecture), part of the library:
 * build it from a config, train it, load nanoGPT-named weights and sample from it.
 *
 * Usage (a complete program; build with: cc prog.c $(pkg-config --cflags --libs nabla)):
 *     #include <nabla/gpt.h>
 *     #include <stdio.h>
 *     int main(int argc, char **argv) {
 *         nb_gpt_config cfg = nb_gpt_config_defaults();   // W3: 4 layers, 4 heads, 256
 *         nb_module *model = NULL;
 *         if (argc > 1) {                                 // trained weights: the shapes
 *             if (nb_gpt_config_from_file(argv[1], &cfg) == NB_OK)   // give the size
 *                 model = nb_gpt_new(&cfg, NULL);
 *             if (model && nb_gpt_load(model, argv[1]) != NB_OK) {
 *                 nb_module_free(model);
 *                 model = NULL;
 *             }
 *         } else {
 *             cfg.block_size = 16, cfg.n_layer = 1, cfg.n_head = 2, cfg.n_embd = 32;
 *             nb_generator *init = nb_generator_new(0);
 *             model = nb_gpt_new(&cfg, init);             // N(0, 0.02) init as nanoGPT
 *             nb_generator_free(init);
 *         }
 *         if (!model) {
 *             fprintf(stderr, "%s\n", nb_last_error());
 *             return 1;
 *         }
 *         nb_generator *g = nb_generator_new(42);
 *         int64_t prompt[] = {'A', 'n', 'd'}, out[20];
 *         nb_gpt_sample_opts so = nb_gpt_sample_defaults();  // greedy
 *         so.temperature = 0.8, so.top_k = 40, so.gen = g;
 *         nb_status st = nb_gpt_generate(model, prompt, 3, 20, &so, out);
 *         for (int i = 0; st == NB_OK && i < 20; i++) printf("%lld ", (long long)out[i]);
 *         printf("\n");
 *         nb_generator_free(g);
 *         nb_module_free(model);
 *         return st == NB_OK ? 0 : 1;
 *     }
 *
 * Training: nb_forward(model, idx) maps (B, T) token indices to (B, T, vocab) logits,
 * nb_gpt_loss gives the mean cross entropy, nb_gpt_train_step one optimizer step with
 * gradient accumulation (and data parallel under nb_ddp). docs/gpt.md has the details, and
 * models/gpt/ (the `gpt` program, through its arch.c) is a complete user of it.
 *
 * The module tree and parameter names are nanoGPT's (model.py), so a state dict moves
 * between the two with nb_module_save / nb_module_load and safetensors in PyTorch:
 *     transformer.wte.weight (V, C)   transformer.wpe.weight (block_size, C)
 *     transformer.h.{i}.ln_1.weight/.bias                     (C)
 *     transformer.h.{i}.attn.c_attn.weight (3C, C) / .bias    (3C)
 *     transformer.h.{i}.attn.c_proj.weight (C, C)  / .bias    (C)
 *     transformer.h.{i}.ln_2.weight/.bias                     (C)
 *     transformer.h.{i}.mlp.c_fc.weight (4C, C)    / .bias    (4C)
 *     transformer.h.{i}.mlp.c_proj.weight (C, 4C)  / .bias    (C)
 *     transformer.ln_f.weight/.bias                           (C)
 * (no .bias entries when cfg.no_bias). The language-model head is tied to the token
 * embedding: logits = ln_f(x) @ wte^T, so it has no parameter of its own (PyTorch's
 * state_dict lists it as "lm_head.weight", the same tensor; nb_gpt_load accepts and ignores it).
 *
 * Ownership: nb_gpt_new returns a module the caller frees with nb_module_free. The config is
 * copied; cfg.dropout_gen is borrowed and must outlive the model. Tensors returned follow
 * nabla's scope rules (new references). */
#ifndef NABLA_GPT_H
#define NABLA_GPT_H

#include <stdbool.h>
#include <stdint.h>

#include "nabla/status.h"
#include "nabla/tensor.h"
#include "nabla/random.h"
#include "nabla/nn.h"
#include "nabla/optim.h"
#include "nabla/parallel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the blocks recompute in backward instead of keeping (docs/gpt.md). */
typedef enum nb_gpt_recompute {
    NB_GPT_RECOMPUTE_NONE = 0,
    NB_GPT_RECOMPUTE_ATTN,
    NB_GPT_RECOMPUTE_FULL
} nb_gpt_recompute;

/* Model hyperparameters: nb_gpt_config_defaults() gives the values after each field (the W3
 * workload: a byte-level model with 4 layers, 4 heads, width 256, context 128); every field is
 * read as written (a size of 0 is an error), NULL means the defaults. */
typedef struct nb_gpt_config {
    uint32_t _init;            /* private: set by nb_gpt_config_defaults() only */
    int64_t vocab_size;        /* 256 (bytes) */
    int64_t block_size;        /* context length, 128 */
    int64_t n_layer;           /* 4 */
    int64_t n_head;            /* 4; must divide n_embd */
    int64_t n_embd;            /* 256 */
    double dropout;            /* 0 (none); on the embeddings, attention weights and residual
                                  branches (training mode only) */
    bool no_bias;              /* drop the biases of the linear layers and layer norms */
    bool gelu_tanh;            /* GPT-2's tanh approximation instead of the exact erf GELU */
    nb_generator *dropout_gen; /* borrowed; NULL: the thread's default generator */
    nb_gpt_recompute recompute; /* activation checkpointing (nb_recompute): NONE (0), ATTN
                                   (each block's attention core, as Megatron's selective
                                   recompute), FULL (each block keeps only its input) */
} nb_gpt_config;
nb_gpt_config nb_gpt_config_defaults(void);

/* Build the model and initialize it as nanoGPT does: every linear weight and both
 * embeddings from N(0, 0.02), the residual projections (attn.c_proj, mlp.c_proj) from
 * N(0, 0.02 / sqrt(2 n_layer)), biases zero, layer norms weight 1 bias 0. Draws from init
 * (NULL: the default generator). NULL + NB_EINVAL for a bad config. */
nb_module *nb_gpt_new(const nb_gpt_config *cfg, nb_generator *init);
/* The resolved config of a model made by nb_gpt_new (defaults filled in); NULL for any other
 * module. Borrowed: owned by the module. */
const nb_gpt_config *nb_gpt_get_config(const nb_module *m);
/* Is m a model made by nb_gpt_new? */
bool nb_gpt_is_gpt(const nb_module *m);

/* nb_forward(model, idx) gives the logits: idx (B, T) I64 (or I32) with 1 <= T <= block_size
 * and tokens in [0, vocab) -> (B, T, vocab) F32. nb_gpt_loss is the mean cross entropy of the
 * logits against targets (B, T), a 0-dim tensor. */
nb_tensor *nb_gpt_loss(nb_module *m, nb_tensor *idx, nb_tensor *targets);

/* One optimizer step with gradient accumulation: the mean loss over n_micro micro-batches
 * (x[i], y[i], each (B, T)) is backpropagated one micro-batch at a time with each loss
 * scaled by 1 / n_micro, which gives the gradient of one batch holding them all; then the
 * global gradient norm is clipped to grad_clip (0: no clipping) and opt steps. The
 * gradients are dropped first (nb_zero_grad). Returns this process's mean loss, or NAN
 * (with nb_last_error set) on error. *grad_norm (may be NULL) gets the global gradient
 * norm before clipping. A non-finite norm (a gradient overflowed; computed when grad_clip
 * > 0 or grad_norm is given) is not applied: the gradients are dropped, opt does not step,
 * and the weights and optimizer state stay as they were (the loss, likely NaN, is returned
 * without an error: the caller stops or skips the step).
 * Data parallel: with ddp (an nb_ddp wrapping m; NULL alone) only the last micro-batch's
 * backward communicates (the others accumulate locally), and the gradients are averaged
 * over the ranks before clipping, so every rank clips and steps the same gradient. */
double nb_gpt_train_step(nb_module *m, nb_optim *opt, nb_ddp *ddp, nb_tensor *const *x,
                      nb_tensor *const *y, int n_micro, double grad_clip, double *grad_norm);
/* The same under ZeRO (zero wraps m and opt, see nb_zero_new): no_sync until the last
 * micro-batch, then the global norm over the shards (nb_clip_grad_norm: the parameters' placements). */
double nb_gpt_train_step_zero(nb_module *m, nb_optim *opt, nb_zero *zero, nb_tensor *const *x,
                              nb_tensor *const *y, int n_micro, double grad_clip,
                              double *grad_norm);

/* The same step with every option in one struct (nb_gpt_step_defaults(): none), and a loss
 * scaler for fp16 (nabla/optim.h): each micro-batch's loss is scaled by it, the gradients
 * unscaled (one fused inf/NaN check) before the norm and the clipping, and the step goes through
 * nb_grad_scaler_step_update: a step whose gradient overflowed is skipped and the scale
 * halved (not an error; the returned *grad_norm is then inf or NaN). ddp and zero are
 * exclusive. The scaler is borrowed; under several ranks give it the communicator
 * (nb_grad_scaler_set_comm) so every rank skips the same steps. */
typedef struct nb_pipeline nb_pipeline;
typedef struct nb_pipe_stats nb_pipe_stats;
typedef struct nb_gpt_step_opts {
    uint32_t _init;          /* private: set by nb_gpt_step_defaults() only */
    nb_ddp *ddp;             /* NULL; as nb_gpt_train_step's ddp */
    nb_zero *zero;           /* NULL; as nb_gpt_train_step_zero's zero */
    nb_grad_scaler *scaler;  /* NULL: no loss scaling */
    double grad_clip;        /* 0: no clipping */
    nb_pipeline *pipeline;   /* NULL; m split by nb_gpt_pipeline_new: the micro-batches run
                              * through its stages (its nb_pipeline_opts.scaler must be this
                              * scaler), ddp / zero wrap its module and are synchronised by it;
                              * the loss is the mean over the data-parallel ranks */
    nb_pipe_stats *pipe_stats; /* NULL; with pipeline: the step's figures */
} nb_gpt_step_opts;
nb_gpt_step_opts nb_gpt_step_defaults(void); /* every field zero/NULL (the mark set) */
double nb_gpt_train_step_ex(nb_module *m, nb_optim *opt, nb_tensor *const *x,
                            nb_tensor *const *y, int n_micro, const nb_gpt_step_opts *o,
                            double *grad_norm);

/* Sampling options: nb_gpt_sample_defaults() gives temperature 0 (greedy, argmax), no top-k,
 * the default generator; NULL means those. */
typedef struct nb_gpt_sample_opts {
    uint32_t _init;        /* private: set by nb_gpt_sample_defaults() only */
    double temperature;    /* 0: greedy; else logits / temperature before the softmax */
    int64_t top_k;         /* keep the k largest logits (0: all) */
    nb_generator *gen;     /* draws; NULL: the default generator */
} nb_gpt_sample_opts;
nb_gpt_sample_opts nb_gpt_sample_defaults(void);

/* Generate n_new tokens after the prompt (n_prompt >= 1 tokens in [0, vocab)), feeding the
 * last block_size tokens back each time, in eval mode without gradients (the module's
 * training mode is restored afterwards). Writes the n_new tokens to out. Temperature 0 is
 * deterministic. Returns NB_OK or an error. */
nb_status nb_gpt_generate(nb_module *m, const int64_t *prompt, int64_t n_prompt, int64_t n_new,
                       const nb_gpt_sample_opts *o, int64_t *out);

/* Load weights into a GPT from a safetensors file: either a model file (nb_module_save, or
 * a PyTorch nanoGPT state dict: an extra "lm_head.weight" is ignored) or an nb_checkpoint
 * (its "model." entries). Every model tensor must be present with its shape. */
nb_status nb_gpt_load(nb_module *m, const char *path);
/* Read the architecture from such a file's shapes: vocab_size, block_size, n_embd, n_layer
 * and no_bias are set in *cfg (other fields are left as they are: n_head cannot be told
 * from the shapes). */
nb_status nb_gpt_config_from_file(const char *path, nb_gpt_config *cfg);

/* Matmul FLOPs of one training step (forward + backward = 3x forward, 2 per multiply-add,
 * full T x T attention, the tied head counted once) for B sequences of T tokens: the count
 * the PyTorch peer benchmark uses (42.68 GFLOP for W3 at B 16, T 128). */
double nb_gpt_train_flops(const nb_gpt_config *cfg, int64_t B, int64_t T);

/* ---- the GPT made parallel (zoo/gpt_parallel.c) ------------------------------------------- */
typedef struct nb_mesh nb_mesh;
typedef struct nb_parallelize_opts nb_parallelize_opts;
typedef struct nb_pipeline_opts nb_pipeline_opts;
/* Make gpt (nb_gpt_new, the same seed on every rank) tensor parallel over mesh's tp dimension
 * with the GPT's plan (nabla/tp.h, nb_parallelize): c_attn column-wise per head, c_fc
 * column-wise, both c_proj row-wise, the vocabulary split in transformer.wte and the tied
 * lm_head (whose logits go to the vocab-parallel cross entropy of nb_gpt_loss), and with
 * o->sequence_parallel the layer norms, dropouts and positions on sequence shards. The tp size
 * must divide n_head and vocab_size (and with sequence parallelism the sequence length).
 * Collective over the mesh. The model's forward, loss and train step are used as they are. */
nb_status nb_gpt_parallelize(nb_module *gpt, const nb_mesh *mesh, const nb_parallelize_opts *o);
/* The GPT split into pipeline stages over mesh's pp dimension (nabla/pipeline.h,
 * nb_pipeline_new): its layers are the embedding (wte, wpe, drop), each block, and the head
 * (ln_f, lm_head, whose weight is the embedding's: kept on the first and the last stage, its
 * gradients summed); the loss is the cross entropy against the targets. o's loss is replaced.
 * Apply nb_gpt_parallelize first for tensor-parallel stages. */
nb_pipeline *nb_gpt_pipeline_new(nb_module *gpt, const nb_mesh *mesh, const nb_pipeline_opts *o);

#ifdef __cplusplus
}
#endif
#endif
