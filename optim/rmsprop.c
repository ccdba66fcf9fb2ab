/* optim/rmsprop.c - RMSprop as torch.optim.RMSprop: square_avg = alpha * square_avg +
 * (1 - alpha) * g^2; centered subtracts the squared running mean of g; eps is added after
 * the square root; momentum accumulates g / avg in a buffer that starts at zero. */
#include "optim/optim_impl.h"

enum { SQ, BUF, GAVG };

static bool rms_slot_used(const nb__hyper *h, int slot) {
    return slot == SQ || (slot == BUF && h->v[NB__H_MOMENTUM] > 0) ||
           (slot == GAVG && h->centered);
}

static double rms_slot_init(const nb__hyper *h, int slot) {
    (void)h, (void)slot;
    return 0;
}

static nb_status rms_check(const nb__hyper *h, const char *who) {
    static const int keys[] = {NB__H_LR, NB__H_EPS, NB__H_MOMENTUM, NB__H_WEIGHT_DECAY,
                               NB__H_ALPHA};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        nb_status st = nb__check_nonneg(h->v[keys[i]], who, nb__hyper_names[keys[i]]);
        if (st != NB_OK) return st;
    }
    return NB_OK;
}

static nb_status rms_update(const nb__hyper *h, nb__oparam *p, const nb_tensor *grad,
                            unsigned fresh) {
    (void)fresh;
    nb__rmsprop_step_args a = {
        .dtype = p->t->dtype, .n = nb_numel(p->t), .param = nb__ptr(p->t),
        .grad = nb__ptr(grad), .sq = nb__ptr(p->slot[SQ]),
        .lr = h->v[NB__H_LR], .alpha = h->v[NB__H_ALPHA], .eps = h->v[NB__H_EPS],
        .weight_decay = h->v[NB__H_WEIGHT_DECAY], .momentum = h->v[NB__H_MOMENTUM],
        .maximize = h->maximize,
    };
    a.buf = a.momentum > 0 ? nb__ptr(p->slot[BUF]) : NULL;
    a.gavg = h->centered ? nb__ptr(p->slot[GAVG]) : NULL;
    return nb__run_rmsprop_step(nb__device_of(p->t), "rmsprop", &a);
}

const nb__optim_kind nb__kind_rmsprop = {
    .name = "rmsprop",
    .elementwise = true,
    .hypers = 1u << NB__H_LR | 1u << NB__H_WEIGHT_DECAY | 1u << NB__H_MOMENTUM |
              1u << NB__H_ALPHA | 1u << NB__H_EPS,
    .has_step = true,
    .nslots = 3,
    .slot_names = {"square_avg", "momentum_buffer", "grad_avg"},
    .slot_used = rms_slot_used,
    .slot_init = rms_slot_init,
    .check = rms_check,
    .kernel = "rmsprop_step",
    .update = rms_update,
};

nb_rmsprop_opts nb_rmsprop_defaults(void) {
    return (nb_rmsprop_opts){
        ._init = NB__OPTS_MARK(nb_rmsprop_opts), .lr = 1e-2, .alpha = 0.99, .eps = 1e-8};
}

nb_optim *nb_rmsprop_new(const nb_params *params, const nb_rmsprop_opts *o) {
    nb_rmsprop_opts d = nb_rmsprop_defaults();
    if (!o) o = &d;
    if (NB__OPTS_CHECK(o, nb_rmsprop_opts, "rmsprop", "nb_rmsprop_defaults()", "o.lr = 1e-3") !=
        NB_OK)
        return NULL;
    nb__hyper h = {.centered = o->centered, .maximize = o->maximize};
    h.v[NB__H_LR] = o->lr;
    h.v[NB__H_ALPHA] = o->alpha;
    h.v[NB__H_EPS] = o->eps;
    h.v[NB__H_WEIGHT_DECAY] = o->weight_decay;
    h.v[NB__H_MOMENTUM] = o->momentum;
    return nb__optim_new(&nb__kind_rmsprop, &h, params);
}
