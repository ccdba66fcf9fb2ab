/* optim/adagrad.c - Adagrad as torch.optim.Adagrad: sum += g^2, p -= clr * g / (sqrt(sum)
 * + eps) with clr = lr / (1 + (step - 1) * lr_decay); the sum starts at
 * initial_accumulator_value. */
#include "optim/optim_impl.h"

static bool ada_slot_used(const nb__hyper *h, int slot) {
    (void)h;
    return slot == 0;
}

static double ada_slot_init(const nb__hyper *h, int slot) {
    (void)slot;
    return h->v[NB__H_INIT_ACC];
}

static nb_status ada_check(const nb__hyper *h, const char *who) {
    static const int keys[] = {NB__H_LR, NB__H_LR_DECAY, NB__H_WEIGHT_DECAY, NB__H_INIT_ACC,
                               NB__H_EPS};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        nb_status st = nb__check_nonneg(h->v[keys[i]], who, nb__hyper_names[keys[i]]);
        if (st != NB_OK) return st;
    }
    return NB_OK;
}

static nb_status ada_update(const nb__hyper *h, nb__oparam *p, const nb_tensor *grad,
                            unsigned fresh) {
    (void)fresh;
    nb__adagrad_step_args a = {
        .dtype = p->t->dtype, .n = nb_numel(p->t), .param = nb__ptr(p->t),
        .grad = nb__ptr(grad), .sum = nb__ptr(p->slot[0]),
        .clr = h->v[NB__H_LR] / (1 + (double)(p->step - 1) * h->v[NB__H_LR_DECAY]),
        .eps = h->v[NB__H_EPS], .weight_decay = h->v[NB__H_WEIGHT_DECAY],
        .maximize = h->maximize,
    };
    return nb__run_adagrad_step(nb__device_of(p->t), "adagrad", &a);
}

const nb__optim_kind nb__kind_adagrad = {
    .name = "adagrad",
    .elementwise = true,
    .hypers = 1u << NB__H_LR | 1u << NB__H_WEIGHT_DECAY | 1u << NB__H_LR_DECAY |
              1u << NB__H_INIT_ACC | 1u << NB__H_EPS,
    .has_step = true,
    .nslots = 1,
    .slot_names = {"sum"},
    .slot_used = ada_slot_used,
    .slot_init = ada_slot_init,
    .check = ada_check,
    .kernel = "adagrad_step",
    .update = ada_update,
};

nb_adagrad_opts nb_adagrad_defaults(void) {
    return (nb_adagrad_opts){._init = NB__OPTS_MARK(nb_adagrad_opts), .lr = 1e-2, .eps = 1e-10};
}

nb_optim *nb_adagrad_new(const nb_params *params, const nb_adagrad_opts *o) {
    nb_adagrad_opts d = nb_adagrad_defaults();
    if (!o) o = &d;
    if (NB__OPTS_CHECK(o, nb_adagrad_opts, "adagrad", "nb_adagrad_defaults()", "o.lr = 0.1") !=
        NB_OK)
        return NULL;
    nb__hyper h = {.maximize = o->maximize};
    h.v[NB__H_LR] = o->lr;
    h.v[NB__H_LR_DECAY] = o->lr_decay;
    h.v[NB__H_WEIGHT_DECAY] = o->weight_decay;
    h.v[NB__H_INIT_ACC] = o->initial_accumulator_value;
    h.v[NB__H_EPS] = o->eps;
    return nb__optim_new(&nb__kind_adagrad, &h, params);
}
