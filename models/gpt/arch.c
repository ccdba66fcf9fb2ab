/* arch.c - the gpt program's two language models (--arch gpt|llama; arch.h): dispatch to
 * nabla/gpt.h or nabla/llama.h. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "arch.h"

bool nbm_arch_parse(const char *prog, const char *v, nbm_arch_kind *k) {
    if (!strcmp(v, "gpt")) *k = NBM_GPT;
    else if (!strcmp(v, "llama")) *k = NBM_LLAMA;
    else {
        fprintf(stderr, "%s: --arch must be gpt or llama, got \"%s\"\n", prog, v);
        return false;
    }
    return true;
}

const char *nbm_arch_name(nbm_arch_kind k) { return k == NBM_LLAMA ? "llama" : "gpt"; }

nb_module *nbm_arch_new(nbm_arch *a, nb_generator *init) {
    if (a->kind == NBM_LLAMA) {
        nb_module *m = nb_llama_new(&a->llama, init);
        if (m) a->llama = *nb_llama_get_config(m);
        return m;
    }
    nb_module *m = nb_gpt_new(&a->gpt, init);
    if (m) a->gpt = *nb_gpt_get_config(m);
    return m;
}

nb_status nbm_arch_parallelize(const nbm_arch *a, nb_module *m, const nb_mesh *mesh,
                               const nb_parallelize_opts *o) {
    return a->kind == NBM_LLAMA ? nb_llama_parallelize(m, mesh, o)
                                : nb_gpt_parallelize(m, mesh, o);
}

nb_pipeline *nbm_arch_pipeline_new(const nbm_arch *a, nb_module *m, const nb_mesh *mesh,
                                   const nb_pipeline_opts *o) {
    return a->kind == NBM_LLAMA ? nb_llama_pipeline_new(m, mesh, o)
                                : nb_gpt_pipeline_new(m, mesh, o);
}

nb_tensor *nbm_arch_loss(const nbm_arch *a, nb_module *m, nb_tensor *x, nb_tensor *y) {
    return a->kind == NBM_LLAMA ? nb_llama_loss(m, x, y) : nb_gpt_loss(m, x, y);
}

double nbm_arch_train_step(const nbm_arch *a, nb_module *m, nb_optim *opt, nb_tensor *const *x,
                           nb_tensor *const *y, int n_micro, const nb_gpt_step_opts *o,
                           double *grad_norm) {
    return a->kind == NBM_LLAMA ? nb_llama_train_step(m, opt, x, y, n_micro, o, grad_norm)
                                : nb_gpt_train_step_ex(m, opt, x, y, n_micro, o, grad_norm);
}

double nbm_arch_flops(const nbm_arch *a, int64_t B, int64_t T) {
    return a->kind == NBM_LLAMA ? nb_llama_train_flops(&a->llama, B, T)
                                : nb_gpt_train_flops(&a->gpt, B, T);
}

/* The model's own count: one layer and two built on the meta device (shapes only, nothing
 * allocated), the rest the second layer's count again, so a config of 100000 layers is
 * counted at once; NAN with the error set for a config the model refuses. */
static double params_of(const nbm_arch *a, int64_t n_layer) {
    nbm_arch copy = *a;
    copy.gpt.n_layer = copy.llama.n_layer = n_layer;
    nb_generator *g = nb_generator_new(0);
    nb_device prev = nb_set_default_device(NB_META);
    nb_module *m = g ? nbm_arch_new(&copy, g) : NULL;
    nb_set_default_device(prev);
    double n = m ? (double)nb_num_parameters(m) : NAN;
    nb_module_free(m);
    nb_generator_free(g);
    return n;
}

double nbm_arch_params(const nbm_arch *a) {
    const int64_t L = a->kind == NBM_LLAMA ? a->llama.n_layer : a->gpt.n_layer;
    if (L < 1) return params_of(a, L); /* the model's own error (or its default) */
    const double one = params_of(a, 1), two = isnan(one) ? NAN : params_of(a, 2);
    return one + (double)(L - 1) * (two - one);
}

void nbm_arch_shape(const nbm_arch *a, int64_t *n_layer, int64_t *n_head, int64_t *n_kv_head,
                    int64_t *n_embd) {
    const bool l = a->kind == NBM_LLAMA;
    *n_layer = l ? a->llama.n_layer : a->gpt.n_layer;
    *n_head = l ? a->llama.n_head : a->gpt.n_head;
    *n_kv_head = l ? a->llama.n_kv_head : a->gpt.n_head;
    *n_embd = l ? a->llama.n_embd : a->gpt.n_embd;
}

nb_module *nbm_arch_load(nbm_arch *a, bool detect, const char *path) {
    if (detect) { /* a file that holds a Llama is one; anything else is read as a GPT */
        nb_llama_config probe = a->llama;
        a->kind = nb_llama_config_from_file(path, &probe) == NB_OK ? NBM_LLAMA : NBM_GPT;
        nb_clear_error();
    }
    nb_module *m = NULL;
    nb_status st = a->kind == NBM_LLAMA ? nb_llama_config_from_file(path, &a->llama)
                                        : nb_gpt_config_from_file(path, &a->gpt);
    if (st == NB_OK) m = nbm_arch_new(a, NULL);
    if (m && (a->kind == NBM_LLAMA ? nb_llama_load(m, path) : nb_gpt_load(m, path)) != NB_OK) {
        nb_module_free(m);
        m = NULL;
    }
    return m;
}

nb_status nbm_arch_generate(const nbm_arch *a, nb_module *m, const int64_t *prompt,
                            int64_t n_prompt, int64_t n_new, const nb_gpt_sample_opts *o,
                            int64_t *out) {
    return a->kind == NBM_LLAMA ? nb_llama_generate(m, prompt, n_prompt, n_new, o, true, out)
                                : nb_gpt_generate(m, prompt, n_prompt, n_new, o, out);
}
