/* nabla/llama.h - a Llama-style decoder (RMSNorm, rotary position embeddings, a SwiGLU MLP,
 * grouped-query attention, no biases, an untied output head), part of the library: build it
 * from a config, train it, load Hugging Face Llama weights and sample from it with a
 * key/value cache.
 *
 * Usage (a complete program; build with: cc prog.c $(pkg-config --cflags --libs nabla)):
 *     #include <nabla/llama.h>
 *     #include <stdio.h>
 *     int main(void) {
 *         nb_llama_config cfg = nb_llama_config_defaults();  // the values below
 *         cfg.block_size = 32, cfg.n_layer = 2, cfg.n_head = 4, cfg.n_kv_head = 2;
 *         cfg.n_embd = 64;
 *         nb_generator *init = nb_generator_new(0);
 *         nb_module *model = nb_llama_new(&cfg, init);         // N(0, 0.02), norms 1
 *         nb_generator_free(init);
 *         if (!model) {
 *             fprintf(stderr, "%s\n", nb_last_error());
 *             return 1;
 *         }
 *         nb_optim *opt = nb_adamw_new(nb_parameters(model), NULL);
 *         nb_tensor *x = nb_randint((int64_t[]){4, 32}, 2, NB_I64, 0, 256, NULL);
 *         nb_tensor *y = nb_randint((int64_t[]){4, 32}, 2, NB_I64, 0, 256, NULL);
 *         double loss = nb_llama_train_step(model, opt, &x, &y, 1, NULL, NULL);
 *         nb_generator *g = nb_generator_new(42);
 *         int64_t prompt[] = {'A', 'n', 'd'}, out[20];
 *         nb_gpt_sample_opts so = nb_gpt_sample_defaults();  // greedy
 *         so.temperature = 0.8, so.top_k = 40, so.gen = g;
 *         nb_status st = nb_llama_generate(model, prompt, 3, 20, &so, true, out);
 *         printf("loss %.3f, %s\n", loss, st == NB_OK ? "sampled" : nb_last_error());
 *         nb_tensor_free(x);
 *         nb_tensor_free(y);
 *         nb_generator_free(g);
 *         nb_optim_free(opt);
 *         nb_module_free(model);
 *         return st == NB_OK ? 0 : 1;
 *     }
 *
 * The module tree and parameter names are Hugging Face's LlamaForCausalLM (transformers), so
 * a file written by nb_module_save loads into it with strict loading, and its
 * model.safetensors loads here (nb_llama_load):
 *     model.embed_tokens.weight (V, C)
 *     model.layers.{i}.input_layernorm.weight                  (C)
 *     model.layers.{i}.self_attn.q_proj.weight (C, C)
 *     model.layers.{i}.self_attn.k_proj.weight (Ckv, C)        Ckv = n_kv_head * C / n_head
 *     model.layers.{i}.self_attn.v_proj.weight (Ckv, C)
 *     model.layers.{i}.self_attn.o_proj.weight (C, C)
 *     model.layers.{i}.post_attention_layernorm.weight         (C)
 *     model.layers.{i}.mlp.gate_proj.weight (F, C)             F = n_inner
 *     model.layers.{i}.mlp.up_proj.weight (F, C)
 *     model.layers.{i}.mlp.down_proj.weight (C, F)
 *     model.norm.weight (C)
 *     lm_head.weight (V, C)
 * A layer computes h = x + o_proj(attn(rope(q_proj(n)), rope(k_proj(n)), v_proj(n))) with
 * n = input_layernorm(x), then h + down_proj(silu(gate_proj(m)) * up_proj(m)) with m =
 * post_attention_layernorm(h): Llama's layer, rotary embeddings in the half-split layout
 * (rotate_half), query head h reading key/value head h / (n_head / n_kv_head).
 *
 * Parallel: nb_llama_parallelize (its tensor-parallel plan) and nb_llama_pipeline_new (its
 * pipeline split) make this one model tensor, sequence and pipeline parallel; data parallel
 * and ZeRO wrap it as any model (nabla/parallel.h). The forward, loss and train step below
 * are used as they are in every layout. docs/llama.md has the details.
 *
 * Ownership: nb_llama_new returns a module the caller frees with nb_module_free; the config
 * is copied. Tensors returned follow nabla's scope rules (new references). A cache from
 * nb_llama_cache_new is the caller's (nb_llama_cache_free) and borrows its model. */
#ifndef NABLA_LLAMA_H
#define NABLA_LLAMA_H

#include <stdbool.h>
#include <stdint.h>

#include "nabla/gpt.h"
#include "nabla/nn.h"
#include "nabla/optim.h"
#include "nabla/random.h"
#include "nabla/status.h"
#include "nabla/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Model hyperparameters: nb_llama_config_defaults() gives the values after each field (a
 * byte-level model of about the W3 GPT's size: 4 layers, 4 heads on 2 key/value heads, width
 * 256, context 128); NULL means those. Every field is read as written (a size of 0 is an error,
 * norm_eps 0 is no eps), except the two sizes derived from others, whose default 0 means
 * "derived from n_head / n_embd as set", as listed. */
typedef struct nb_llama_config {
    uint32_t _init;             /* private: set by nb_llama_config_defaults() only */
    int64_t vocab_size;         /* 256 (bytes) */
    int64_t block_size;         /* context length (max_position_embeddings), 128 */
    int64_t n_layer;            /* 4 */
    int64_t n_head;             /* 4; must divide n_embd, with an even head size */
    int64_t n_kv_head;          /* 0: n_head / 2 when n_head is even, else n_head; must divide
                             n_head (grouped-query attention) */
    int64_t n_embd;             /* 256 */
    int64_t n_inner;            /* the MLP's width (intermediate_size); 0: 8 n_embd / 3 rounded up
                             to a multiple of 64 (704 for 256) */
    double rope_theta;          /* the rotary base; 10000 */
    double norm_eps;            /* RMSNorm's eps (rms_norm_eps); 1e-5 */
    nb_gpt_recompute recompute; /* activation checkpointing, as the GPT's: NONE, ATTN (each
                                   layer's rotary + attention core), FULL (each layer keeps
                                   only its input) */
} nb_llama_config;
nb_llama_config nb_llama_config_defaults(void);

/* Build the model and initialize it as Hugging Face's LlamaForCausalLM does: every linear
 * weight and the embedding from N(0, 0.02), the norms' weights 1. Draws from init (NULL: the
 * default generator). NULL + NB_EINVAL for a bad config (n_kv_head not dividing n_head, an
 * odd head size, ...). */
nb_module *nb_llama_new(const nb_llama_config *cfg, nb_generator *init);
/* The resolved config of a model made by nb_llama_new; NULL for any other module. Borrowed. */
const nb_llama_config *nb_llama_get_config(const nb_module *m);
bool nb_llama_is_llama(const nb_module *m);

/* nb_forward(model, idx): idx (B, T) I64 or I32, 1 <= T <= block_size, tokens in
 * [0, vocab) -> logits (B, T, vocab) F32. nb_llama_loss: the mean cross entropy of the logits
 * against targets (B, T), a 0-dim tensor. */
nb_tensor *nb_llama_loss(nb_module *m, nb_tensor *idx, nb_tensor *targets);

/* One optimizer step over n_micro micro-batches, exactly as nb_gpt_train_step_ex (nabla/gpt.h:
 * gradient accumulation, clipping, data parallel, ZeRO, a loss scaler, a pipeline made by
 * nb_llama_pipeline_new); o NULL: no options. Returns the mean loss or NAN with the error set. */
double nb_llama_train_step(nb_module *m, nb_optim *opt, nb_tensor *const *x,
                           nb_tensor *const *y, int n_micro, const nb_gpt_step_opts *o,
                           double *grad_norm);

/* ---- generation ------------------------------------------------------------------------------
 * A key/value cache: for each layer the keys (after the rotary embedding) and values of the
 * positions seen so far, (batch, max_len, kv heads, head size) each, on the model's device.
 * nb_llama_forward_cached runs idx (batch, T) as the continuation of the cached positions
 * (its rows at positions len .. len + T - 1: the rotary offset), appends their keys and values
 * and returns the logits (batch, T, vocab): equal to the last T rows of nb_forward on the whole
 * sequence (to f32 rounding). Eval mode and no gradients are the caller's choice; the cache
 * holds no graph. NB_EINVAL when len + T exceeds max_len (at most block_size). */
typedef struct nb_llama_cache nb_llama_cache;
nb_llama_cache *nb_llama_cache_new(nb_module *m, int64_t batch, int64_t max_len);
void nb_llama_cache_free(nb_llama_cache *c);
int64_t nb_llama_cache_len(const nb_llama_cache *c);
void nb_llama_cache_reset(nb_llama_cache *c); /* back to no positions */
nb_tensor *nb_llama_forward_cached(nb_module *m, nb_tensor *idx, nb_llama_cache *c);

/* Generate n_new tokens after the prompt (n_prompt >= 1 tokens in [0, vocab)) into out, in
 * eval mode without gradients (the training mode is restored afterwards), sampling as
 * nb_gpt_generate does (o: temperature 0 greedy, top-k, the generator; NULL: greedy). With
 * use_cache the prompt runs once and each new token alone against the cache; without, the
 * whole context runs for every token. Both give the same tokens (the same draws, logits equal
 * to f32 rounding). Past block_size tokens the context is the last block_size tokens, and
 * each step recomputes that window (positions restart at 0, as without the cache). */
nb_status nb_llama_generate(nb_module *m, const int64_t *prompt, int64_t n_prompt, int64_t n_new,
                            const nb_gpt_sample_opts *o, bool use_cache, int64_t *out);

/* ---- files ---------------------------------------------------------------------------------
 * Load weights from a safetensors file: a model file (nb_module_save, or Hugging Face's
 * model.safetensors of a LlamaForCausalLM) or an nb_checkpoint (its "model." entries). Every
 * parameter must be present with its shape; a name the model does not have is an error (the
 * old "rotary_emb.inv_freq" buffers excepted), so a file of another architecture (a GPT's
 * transformer.h.0..., a Llama with another layer count) is refused with its first odd name. */
nb_status nb_llama_load(nb_module *m, const char *path);
/* What the shapes of such a file tell: vocab_size, n_embd, n_layer, n_inner, and n_kv_head
 * when cfg->n_head is set (from the key/value projection's width). Other fields (n_head,
 * block_size, rope_theta, norm_eps: Hugging Face keeps them in config.json) are left as they
 * are. NB_EFORMAT for a file that holds no Llama (naming what it holds instead). */
nb_status nb_llama_config_from_file(const char *path, nb_llama_config *cfg);

/* Matmul FLOPs of one training step for B sequences of T tokens (forward + backward = 3x the
 * forward, 2 per multiply-add, full T x T attention), as nb_gpt_train_flops counts them. */
double nb_llama_train_flops(const nb_llama_config *cfg, int64_t B, int64_t T);

/* ---- the Llama made parallel (zoo/llama_parallel.c) ----------------------------------------- */
typedef struct nb_mesh nb_mesh;
typedef struct nb_parallelize_opts nb_parallelize_opts;
typedef struct nb_pipeline nb_pipeline;
typedef struct nb_pipeline_opts nb_pipeline_opts;
/* Make llama (nb_llama_new, the same seed on every rank) tensor parallel over mesh's tp
 * dimension (nabla/tp.h, nb_parallelize): q_proj, k_proj, v_proj, gate_proj and up_proj
 * column-wise (whole heads), o_proj and down_proj row-wise, the vocabulary split in
 * model.embed_tokens and lm_head (whose logits go to the vocab-parallel cross entropy of
 * nb_llama_loss), and with o->sequence_parallel the RMSNorms on sequence shards. The tp size
 * must divide n_head, n_inner and vocab_size (and with sequence parallelism the sequence
 * length), and either divide n_kv_head (the key/value heads split) or be a multiple of it
 * (each key/value head held by the tp / n_kv_head ranks of its query heads, whose partial
 * gradients the reducer sums: wrap the model with nb_ddp or nb_zero, even on one data-parallel
 * rank; docs/llama.md); NB_EINVAL naming what does not fit. Collective over the mesh. */
nb_status nb_llama_parallelize(nb_module *llama, const nb_mesh *mesh,
                               const nb_parallelize_opts *o);
/* The Llama split into pipeline stages over mesh's pp dimension (nabla/pipeline.h,
 * nb_pipeline_new): its layers are the embedding, each decoder layer, and the head (model.norm,
 * lm_head); the loss is the cross entropy against the targets (o's loss is replaced). Apply
 * nb_llama_parallelize first for tensor-parallel stages. */
nb_pipeline *nb_llama_pipeline_new(nb_module *llama, const nb_mesh *mesh,
                                   const nb_pipeline_opts *o);

#ifdef __cplusplus
}
#endif
#endif
