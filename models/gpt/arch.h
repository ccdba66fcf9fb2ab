/* arch.h - the language models the gpt program trains and samples (--arch gpt|llama): one
 * interface over nabla/gpt.h and nabla/llama.h, so that train.c's one loop, its layouts,
 * checkpoints and logs run either model. Everything here is a thin dispatch; the models, their
 * plans and splits are the library's.
 *
 *     nbm_arch a = {.kind = NBM_LLAMA, .llama = nb_llama_config_defaults()};
 *     a.llama.n_layer = 4;                            // ...
 *     nb_module *m = nbm_arch_new(&a, init);          // a's config is resolved in place
 *     nbm_arch_parallelize(&a, m, mesh, &po);         // its tensor-parallel plan
 *     nb_pipeline *p = nbm_arch_pipeline_new(&a, m, mesh, &pio);
 *     double loss = nbm_arch_train_step(&a, m, opt, xs, ys, n, &so, &gn);
 *
 * The model returned is the caller's (nb_module_free); nothing else is allocated. */
#ifndef NBM_ARCH_H
#define NBM_ARCH_H

#include <stdbool.h>
#include <stdint.h>

#include <nabla/nabla.h>

typedef enum { NBM_GPT, NBM_LLAMA } nbm_arch_kind;

typedef struct nbm_arch {
    nbm_arch_kind kind;
    nb_gpt_config gpt;     /* NBM_GPT */
    nb_llama_config llama; /* NBM_LLAMA */
} nbm_arch;

/* "gpt" or "llama" into *k; false with the reason on stderr (prefixed with prog) otherwise. */
bool nbm_arch_parse(const char *prog, const char *v, nbm_arch_kind *k);
const char *nbm_arch_name(nbm_arch_kind k);

/* Build the model of a's config (resolved into a: the defaults filled in); NULL + error. */
nb_module *nbm_arch_new(nbm_arch *a, nb_generator *init);
/* The model's tensor-parallel plan and pipeline split (nb_gpt_parallelize, nb_llama_...). */
nb_status nbm_arch_parallelize(const nbm_arch *a, nb_module *m, const nb_mesh *mesh,
                               const nb_parallelize_opts *o);
nb_pipeline *nbm_arch_pipeline_new(const nbm_arch *a, nb_module *m, const nb_mesh *mesh,
                                   const nb_pipeline_opts *o);
/* The mean cross entropy of m (either model) on (x, y), and one optimizer step. */
nb_tensor *nbm_arch_loss(const nbm_arch *a, nb_module *m, nb_tensor *x, nb_tensor *y);
double nbm_arch_train_step(const nbm_arch *a, nb_module *m, nb_optim *opt, nb_tensor *const *x,
                           nb_tensor *const *y, int n_micro, const nb_gpt_step_opts *o,
                           double *grad_norm);
/* Matmul FLOPs of a training step on B sequences of T tokens; the exact parameter count of
 * the config (before building it), for the memory check; the shape for the header. */
double nbm_arch_flops(const nbm_arch *a, int64_t B, int64_t T);
double nbm_arch_params(const nbm_arch *a);
void nbm_arch_shape(const nbm_arch *a, int64_t *n_layer, int64_t *n_head, int64_t *n_kv_head,
                    int64_t *n_embd);

/* Sampling: the model of a file (a checkpoint or a model .safetensors). a->kind is the
 * architecture asked for, or, with *detect, the one the file holds; a's config has n_head
 * (and for the Llama block_size) set by the caller, the rest is read from the file. NULL with
 * the error set when the file holds no such model. */
nb_module *nbm_arch_load(nbm_arch *a, bool detect, const char *path);
nb_status nbm_arch_generate(const nbm_arch *a, nb_module *m, const int64_t *prompt,
                            int64_t n_prompt, int64_t n_new, const nb_gpt_sample_opts *o,
                            int64_t *out);

#endif
