/* optim/adam.c - Adam (L2 weight decay added to the gradient) and AdamW (decoupled weight
 * decay, p *= 1 - lr * weight_decay), with optional AMSGrad, as torch.optim.Adam/AdamW:
 * bias corrections 1 - beta^t computed in double per step, eps added outside the square
 * root: p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps). */
#include <math.h>

#include "optim/optim_impl.h"

static bool adam_slot_used(const nb__hyper *h, int slot) { return slot < 2 || h->amsgrad; }

static double adam_slot_init(const nb__hyper *h, int slot) {
    (void)h, (void)slot;
    return 0;
}

static nb_status adam_check(const nb__hyper *h, const char *who) {
    nb_status st;
    if ((st = nb__check_nonneg(h->v[NB__H_LR], who, "lr")) != NB_OK) return st;
    if ((st = nb__check_nonneg(h->v[NB__H_EPS], who, "eps")) != NB_OK) return st;
    for (int i = 0; i < 2; i++) {
        double b = h->v[NB__H_BETA1 + i];
        if (!(b >= 0 && b < 1))
            return nb__error(NB_EINVAL, "%s: betas[%d] must be in [0, 1), got %g", who, i, b);
    }
    return nb__check_nonneg(h->v[NB__H_WEIGHT_DECAY], who, "weight_decay");
}

static nb_status adam_update(const nb__hyper *h, nb__oparam *p, const nb_tensor *grad,
                             unsigned fresh) {
    (void)fresh;
    double b1 = h->v[NB__H_BETA1], b2 = h->v[NB__H_BETA2], t = (double)p->step;
    double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
    nb__adam_step_args a = {
        .dtype = p->t->dtype, .n = nb_numel(p->t), .param = nb__ptr(p->t),
        .grad = nb__ptr(grad), .m = nb__ptr(p->slot[0]), .v = nb__ptr(p->slot[1]),
        .vmax = h->amsgrad ? nb__ptr(p->slot[2]) : NULL,
        .lr = h->v[NB__H_LR], .beta1 = b1, .beta2 = b2, .eps = h->v[NB__H_EPS],
        .weight_decay = h->v[NB__H_WEIGHT_DECAY], .step_size = h->v[NB__H_LR] / bc1,
        .bc2_sqrt = sqrt(bc2), .decoupled = h->decoupled, .maximize = h->maximize,
    };
    return nb__run_adam_step(nb__device_of(p->t), h->decoupled ? "adamw" : "adam", &a);
}

#define ADAM_HYPERS                                                                         \
    (1u << NB__H_LR | 1u << NB__H_WEIGHT_DECAY | 1u << NB__H_BETA1 | 1u << NB__H_BETA2 |    \
     1u << NB__H_EPS)

const nb__optim_kind nb__kind_adam = {
    .name = "adam",
    .elementwise = true,
    .hypers = ADAM_HYPERS,
    .has_step = true,
    .nslots = 3,
    .slot_names = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
    .slot_used = adam_slot_used,
    .slot_init = adam_slot_init,
    .check = adam_check,
    .kernel = "adam_step",
    .update = adam_update,
};

const nb__optim_kind nb__kind_adamw = {
    .name = "adamw",
    .elementwise = true,
    .hypers = ADAM_HYPERS,
    .has_step = true,
    .nslots = 3,
    .slot_names = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
    .slot_used = adam_slot_used,
    .slot_init = adam_slot_init,
    .check = adam_check,
    .kernel = "adam_step",
    .update = adam_update,
};

nb_adam_opts nb_adam_defaults(void) {
    return (nb_adam_opts){._init = NB__OPTS_MARK(nb_adam_opts),
                          .lr = 1e-3,
                          .betas = {0.9, 0.999},
                          .eps = 1e-8,
                          .weight_decay = 0};
}

nb_adamw_opts nb_adamw_defaults(void) {
    nb_adamw_opts o = nb_adam_defaults();
    o.weight_decay = 1e-2;
    return o;
}

static nb_optim *make(const nb__optim_kind *kind, const nb_params *params,
                      const nb_adam_opts *o, nb_adam_opts defaults) {
    if (!o) o = &defaults;
    const bool w = kind == &nb__kind_adamw;
    if (nb__opts_check(o->_init, NB__OPTS_MARK(nb_adam_opts), kind->name,
                       w ? "nb_adamw_opts" : "nb_adam_opts",
                       w ? "nb_adamw_defaults()" : "nb_adam_defaults()", "o.lr = 1e-3") != NB_OK)
        return NULL;
    nb__hyper h = {.amsgrad = o->amsgrad, .maximize = o->maximize,
                   .decoupled = kind == &nb__kind_adamw};
    h.v[NB__H_LR] = o->lr;
    h.v[NB__H_BETA1] = o->betas[0];
    h.v[NB__H_BETA2] = o->betas[1];
    h.v[NB__H_EPS] = o->eps;
    h.v[NB__H_WEIGHT_DECAY] = o->weight_decay;
    return nb__optim_new(kind, &h, params);
}

nb_optim *nb_adam_new(const nb_params *params, const nb_adam_opts *o) {
    return make(&nb__kind_adam, params, o, nb_adam_defaults());
}

nb_optim *nb_adamw_new(const nb_params *params, const nb_adamw_opts *o) {
    return make(&nb__kind_adamw, params, o, nb_adamw_defaults());
}
