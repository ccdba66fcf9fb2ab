/* ckpt_objects.h - the training objects a checkpoint is loaded into, shared by the
 * checkpoint fuzz target and make_corpus (which saves the valid seed checkpoints from the
 * same objects, so those seeds load and the fuzzer starts from deep inside the loader). */
#ifndef NABLA_FUZZ_CKPT_OBJECTS_H
#define NABLA_FUZZ_CKPT_OBJECTS_H

#include "nabla/checkpoint.h"
#include "nabla/optim.h"

typedef struct {
    nb_generator *init, *drop;
    nb_module *model;
    nb_optim *opt;
    nb_sched *sched;
    nb_tensor *x, *y;
    nb_dataset *ds;
    nb_loader *loader;
} ckpt_objects;

/* NULL-safe teardown, also of a partly built set. */
static inline void ckpt_objects_free(ckpt_objects *o) {
    nb_loader_free(o->loader);
    nb_dataset_free(o->ds);
    nb_tensor_free(o->x);
    nb_tensor_free(o->y);
    nb_sched_free(o->sched);
    nb_optim_free(o->opt);
    nb_module_free(o->model);
    nb_generator_free(o->init);
    nb_generator_free(o->drop);
}

/* A small model (linear, dropout, layer norm, linear), AdamW, a cosine schedule, a shuffling
 * loader over 10 samples and a dropout generator. Returns false (after freeing) on failure. */
static inline bool ckpt_objects_init(ckpt_objects *o) {
    *o = (ckpt_objects){0};
    o->init = nb_generator_new(11);
    o->drop = nb_generator_new(12);
    nb_linear_opts lo = nb_linear_defaults();
    lo.gen = o->init;
    o->model = nb_sequential_new(nb_linear_new(4, 6, &lo), nb_dropout_new(0.2, o->drop),
                                 nb_layer_norm_new(6, NULL), nb_linear_new(6, 3, &lo), NULL);
    nb_adamw_opts ao = nb_adamw_defaults();
    ao.lr = 0.01;
    if (o->model) o->opt = nb_adamw_new(nb_parameters(o->model), &ao);
    nb_sched_opts so = nb_sched_defaults(NB_SCHED_COSINE);
    so.warmup_steps = 2;
    so.total_steps = 20;
    if (o->opt) o->sched = nb_sched_new(o->opt, &so);
    o->x = nb_randn((int64_t[]){10, 4}, 2, NB_F32, o->init);
    o->y = nb_randint((int64_t[]){10}, 1, NB_I64, 0, 3, o->init);
    o->ds = nb_tensor_dataset_new(o->x, o->y);
    nb_loader_opts lo2 = nb_loader_defaults();
    lo2.batch_size = 4;
    lo2.shuffle = true;
    lo2.seed = 5;
    if (o->ds) o->loader = nb_loader_new(o->ds, &lo2);
    if (!(o->sched && o->loader)) {
        ckpt_objects_free(o);
        return false;
    }
    return true;
}

static inline nb_checkpoint ckpt_of(ckpt_objects *o, int64_t step) {
    return (nb_checkpoint){.model = o->model, .optim = o->opt, .sched = o->sched,
                           .loader = o->loader, .gens = &o->drop, .ngens = 1, .step = step};
}

#endif
