/* optim/sgd.c - stochastic gradient descent with momentum, dampening, Nesterov momentum and
 * L2 weight decay, as torch.optim.SGD: the momentum buffer starts as the first step's
 * gradient (no dampening on that step), then buf = momentum * buf + (1 - dampening) * d. */
#include <math.h>

#include "optim/optim_impl.h"

static bool sgd_slot_used(const nb__hyper *h, int slot) {
    (void)slot;
    return h->v[NB__H_MOMENTUM] != 0;
}

static double sgd_slot_init(const nb__hyper *h, int slot) {
    (void)h, (void)slot;
    return NAN; /* the kernel copies the first gradient into the buffer */
}

static nb_status sgd_check(const nb__hyper *h, const char *who) {
    nb_status st;
    if ((st = nb__check_nonneg(h->v[NB__H_LR], who, "lr")) != NB_OK) return st;
    if ((st = nb__check_nonneg(h->v[NB__H_MOMENTUM], who, "momentum")) != NB_OK) return st;
    if ((st = nb__check_nonneg(h->v[NB__H_WEIGHT_DECAY], who, "weight_decay")) != NB_OK)
        return st;
    if (h->nesterov && (h->v[NB__H_MOMENTUM] <= 0 || h->v[NB__H_DAMPENING] != 0))
        return nb__error(NB_EINVAL, "%s: nesterov momentum requires a momentum > 0 and zero "
                         "dampening (momentum %g, dampening %g)", who, h->v[NB__H_MOMENTUM],
                         h->v[NB__H_DAMPENING]);
    return NB_OK;
}

static nb_status sgd_update(const nb__hyper *h, nb__oparam *p, const nb_tensor *grad,
                            unsigned fresh) {
    nb__sgd_step_args a = {
        .dtype = p->t->dtype, .n = nb_numel(p->t), .param = nb__ptr(p->t),
        .grad = nb__ptr(grad),
        .lr = h->v[NB__H_LR], .momentum = h->v[NB__H_MOMENTUM],
        .dampening = h->v[NB__H_DAMPENING], .weight_decay = h->v[NB__H_WEIGHT_DECAY],
        .nesterov = h->nesterov, .maximize = h->maximize, .init_buf = fresh & 1u,
    };
    a.buf = a.momentum != 0 ? nb__ptr(p->slot[0]) : NULL;
    return nb__run_sgd_step(nb__device_of(p->t), "sgd", &a);
}

const nb__optim_kind nb__kind_sgd = {
    .name = "sgd",
    .elementwise = true,
    .hypers = 1u << NB__H_LR | 1u << NB__H_WEIGHT_DECAY | 1u << NB__H_MOMENTUM |
              1u << NB__H_DAMPENING,
    .has_step = false,
    .nslots = 1,
    .slot_names = {"momentum_buffer"},
    .slot_used = sgd_slot_used,
    .slot_init = sgd_slot_init,
    .check = sgd_check,
    .kernel = "sgd_step",
    .update = sgd_update,
};

nb_optim *nb_sgd_new(const nb_params *params, const nb_sgd_opts *o) {
    if (o && NB__OPTS_CHECK(o, nb_sgd_opts, "sgd", "nb_sgd_defaults()", "o.lr = 0.05") != NB_OK)
        return NULL;
    if (!o || !(o->lr > 0)) {
        nb__error(NB_EINVAL, "sgd: lr must be > 0%s (SGD has no default learning rate)",
                  o ? "" : ", and opts were NULL");
        return NULL;
    }
    nb__hyper h = {.nesterov = o->nesterov, .maximize = o->maximize};
    h.v[NB__H_LR] = o->lr;
    h.v[NB__H_MOMENTUM] = o->momentum;
    h.v[NB__H_DAMPENING] = o->dampening;
    h.v[NB__H_WEIGHT_DECAY] = o->weight_decay;
    return nb__optim_new(&nb__kind_sgd, &h, params);
}

nb_sgd_opts nb_sgd_defaults(void) { return (nb_sgd_opts){._init = NB__OPTS_MARK(nb_sgd_opts)}; }
