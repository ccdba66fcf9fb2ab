/* gpt.h - a GPT-2 style language model (nanoGPT's architecture) built on nabla's public API,
 * reusable outside the bundled `gpt` program.
 *
 * Usage:
 *     gpt_config cfg = {.vocab_size = 256, .block_size = 128, .n_layer = 4, .n_head = 4,
 *                       .n_embd = 256};              // zeros elsewhere: bias on, exact GELU
 *     nb_generator *init = nb_generator_new(0);
 *     nb_module *model = gpt_new(&cfg, init);       // N(0, 0.02) init as nanoGPT
 *     nb_scope_begin();
 *     nb_tensor *logits = nb_forward(model, idx);   // idx (B, T) I64 -> (B, T, vocab) F32
 *     nb_tensor *loss = gpt_loss(model, idx, targets);
 *     nb_backward(loss);
 *     nb_scope_end();
 *     nb_module_free(model);
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
 * state_dict lists it as "lm_head.weight", the same tensor; gpt_load accepts and ignores it).
 *
 * Ownership: gpt_new returns a module the caller frees with nb_module_free. The config is
 * copied; cfg.dropout_gen is borrowed and must outlive the model. Tensors returned follow
 * nabla's scope rules (new references). */
#ifndef NABLA_MODELS_GPT_H
#define NABLA_MODELS_GPT_H

#include <stdbool.h>
#include <stdint.h>

#include <nabla/nabla.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Model hyperparameters; zero means the default (the W3 workload: a byte-level model with
 * 4 layers, 4 heads, width 256, context 128). */
typedef struct gpt_config {
    int64_t vocab_size;        /* 0 -> 256 (bytes) */
    int64_t block_size;        /* context length, 0 -> 128 */
    int64_t n_layer;           /* 0 -> 4 */
    int64_t n_head;            /* 0 -> 4; must divide n_embd */
    int64_t n_embd;            /* 0 -> 256 */
    double dropout;            /* on the embeddings, attention weights and residual branches
                                  (training mode only); 0 -> none */
    bool no_bias;              /* drop the biases of the linear layers and layer norms */
    bool gelu_tanh;            /* GPT-2's tanh approximation instead of the exact erf GELU */
    nb_generator *dropout_gen; /* borrowed; NULL: the thread's default generator */
} gpt_config;

/* Build the model and initialize it as nanoGPT does: every linear weight and both
 * embeddings from N(0, 0.02), the residual projections (attn.c_proj, mlp.c_proj) from
 * N(0, 0.02 / sqrt(2 n_layer)), biases zero, layer norms weight 1 bias 0. Draws from init
 * (NULL: the default generator). NULL + NB_EINVAL for a bad config. */
nb_module *gpt_new(const gpt_config *cfg, nb_generator *init);
/* The resolved config of a model made by gpt_new (defaults filled in); NULL for any other
 * module. Borrowed: owned by the module. */
const gpt_config *gpt_get_config(const nb_module *m);
/* Is m a model made by gpt_new? */
bool gpt_is_gpt(const nb_module *m);

/* nb_forward(model, idx) gives the logits: idx (B, T) I64 (or I32) with 1 <= T <= block_size
 * and tokens in [0, vocab) -> (B, T, vocab) F32. gpt_loss is the mean cross entropy of the
 * logits against targets (B, T), a 0-dim tensor. */
nb_tensor *gpt_loss(nb_module *m, nb_tensor *idx, nb_tensor *targets);

/* One optimizer step with gradient accumulation: the mean loss over n_micro micro-batches
 * (x[i], y[i], each (B, T)) is backpropagated one micro-batch at a time with each loss
 * scaled by 1 / n_micro, which gives the gradient of one batch holding them all; then the
 * global gradient norm is clipped to grad_clip (0: no clipping) and opt steps. The
 * gradients are dropped first (nb_zero_grad). Returns this process's mean loss, or NAN
 * (with nb_last_error set) on error. *grad_norm (may be NULL) gets the global gradient
 * norm before clipping.
 * Data parallel: with ddp (an nb_ddp wrapping m; NULL alone) only the last micro-batch's
 * backward communicates (the others accumulate locally), and the gradients are averaged
 * over the ranks before clipping, so every rank clips and steps the same gradient. */
double gpt_train_step(nb_module *m, nb_optim *opt, nb_ddp *ddp, nb_tensor *const *x,
                      nb_tensor *const *y, int n_micro, double grad_clip, double *grad_norm);

/* Sampling options; zero means: temperature 0 (greedy, argmax), no top-k. */
typedef struct gpt_sample_opts {
    double temperature;    /* 0: greedy; else logits / temperature before the softmax */
    int64_t top_k;         /* keep the k largest logits (0: all) */
    nb_generator *gen;     /* draws; NULL: the default generator */
} gpt_sample_opts;

/* Generate n_new tokens after the prompt (n_prompt >= 1 tokens in [0, vocab)), feeding the
 * last block_size tokens back each time, in eval mode without gradients (the module's
 * training mode is restored afterwards). Writes the n_new tokens to out. Temperature 0 is
 * deterministic. Returns NB_OK or an error. */
nb_status gpt_generate(nb_module *m, const int64_t *prompt, int64_t n_prompt, int64_t n_new,
                       const gpt_sample_opts *o, int64_t *out);

/* Load weights into a GPT from a safetensors file: either a model file (nb_module_save, or
 * a PyTorch nanoGPT state dict: an extra "lm_head.weight" is ignored) or an nb_checkpoint
 * (its "model." entries). Every model tensor must be present with its shape. */
nb_status gpt_load(nb_module *m, const char *path);
/* Read the architecture from such a file's shapes: vocab_size, block_size, n_embd, n_layer
 * and no_bias are set in *cfg (other fields are left as they are: n_head cannot be told
 * from the shapes). */
nb_status gpt_config_from_file(const char *path, gpt_config *cfg);

/* Matmul FLOPs of one training step (forward + backward = 3x forward, 2 per multiply-add,
 * full T x T attention, the tied head counted once) for B sequences of T tokens: the count
 * /work/shared/peers/torch_ref.py uses (42.68 GFLOP for W3 at B 16, T 128). */
double gpt_train_flops(const gpt_config *cfg, int64_t B, int64_t T);

#ifdef __cplusplus
}
#endif
#endif
