/* optim/optim.c - the optimizer object every algorithm shares: parameter lists and groups,
 * learning-rate access, zero_grad, and the step driver (checks, lazy state, one fused
 * kernel call per parameter). The algorithms themselves are in sgd.c, adam.c, rmsprop.c
 * and adagrad.c; state save/load in state.c.
 *
 * Devices: each parameter is updated on its own device (its gradient and state must be
 * there too); state is allocated next to the parameter. Parameters of one optimizer may
 * live on different devices, as in PyTorch. On the meta device a step checks and
 * allocates (meta) state but runs no kernel. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd_impl.h"
#include "nabla/autograd.h"
#include "optim/optim_impl.h"
#include "tensor/trace.h"

const char *const nb__hyper_names[NB__H_COUNT] = {
    "lr", "weight_decay", "momentum", "dampening", "beta1", "beta2", "eps", "alpha",
    "lr_decay", "initial_accumulator_value",
};

nb_status nb__check_nonneg(double v, const char *who, const char *what) {
    if (!(v >= 0)) return nb__error(NB_EINVAL, "%s: %s must be >= 0, got %g", who, what, v);
    return NB_OK;
}

/* ---- construction ---------------------------------------------------------------------------- */
static bool grow(void **items, int *cap, int need, size_t size) {
    if (need <= *cap) return true;
    int c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    void *p = realloc(*items, size * (size_t)c);
    if (!p) return false;
    *items = p;
    *cap = c;
    return true;
}

void nb__oparam_reset(nb__oparam *p) {
    for (int k = 0; k < NB__OPT_SLOTS; k++) {
        nb_tensor_free(p->slot[k]);
        p->slot[k] = NULL;
    }
    nb_tensor_free(p->master);
    p->master = NULL;
    p->has_state = false;
    p->step = 0;
}

/* NB_OK when t's device has the kind's update kernel (meta always does: nothing runs);
 * else "who: no cuda kernel (adam_step)". */
static nb_status kernel_ok(const nb__optim_kind *kind, const nb_tensor *t, const char *who) {
    nb_device dev = nb__device_of(t);
    if (nb__backend_has_kernel(dev, kind->kernel)) return NB_OK;
    const nb__backend *be = nb__backend_of(dev, who);
    return be ? nb__no_kernel(be, who, kind->kernel) : nb_last_status();
}

/* The snapshot nb_optim_state made (optim/state.c builds it; the optimizer owns it). */
void nb__optim_state_clear(nb_optim *opt) {
    for (int i = 0; i < opt->slist.count; i++) free(nb__unconst(opt->slist.names[i]));
    free((void *)opt->slist.names);
    free(opt->slist.tensors);
    memset(&opt->slist, 0, sizeof opt->slist);
    for (int i = 0; i < opt->nsown; i++) nb_tensor_free(opt->sown[i]);
    free(opt->sown);
    opt->sown = NULL;
    opt->nsown = 0;
}

void nb_optim_state_release(nb_optim *opt) {
    if (opt && nb__obj_ok(opt, NB__OBJ_OPTIM, "optim_state_release")) nb__optim_state_clear(opt);
}

/* Append params as group g (already checked hyperparameters). All or nothing. */
static nb_status add_params(nb_optim *opt, const nb_params *ps, int g, const char *who) {
    if (!ps) return nb__error(NB_ENULL, "%s: params is NULL", who);
    if (ps->count < 0 || (ps->count > 0 && !ps->tensors))
        return nb__error(NB_EINVAL, "%s: params has %d tensors but no tensor array", who,
                         ps->count);
    for (int i = 0; i < ps->count; i++) {
        nb_tensor *t = ps->tensors[i];
        char idx[24];
        snprintf(idx, sizeof idx, "%d", opt->nparams + i);
        const char *name = ps->names && ps->names[i] ? ps->names[i] : idx;
        if (!t) return nb__error(NB_ENULL, "%s: parameter %d ('%s') is NULL", who, i, name);
        if (!nb_dtype_is_float(t->dtype))
            return nb__error(NB_EDTYPE, "%s: parameter '%s' is %s; optimizers update float "
                             "parameters (f32, f64, or f16/bf16 with f32 master weights)",
                             who, name, nb_dtype_name(t->dtype));
        nb_status kst = kernel_ok(opt->kind, t, who);
        if (kst != NB_OK) return kst;
        if (!nb_is_contiguous(t))
            return nb__error(NB_EINVAL, "%s: parameter '%s' %s is not contiguous", who, name,
                             NB__SHAPE(t));
        for (int j = 0; j < opt->nparams; j++) {
            if (opt->params[j].t == t)
                return nb__error(NB_EINVAL, "%s: parameter '%s' is already in group %d; a "
                                 "parameter may belong to one group only", who, name,
                                 opt->params[j].group);
            if (strcmp(opt->params[j].name, name) == 0)
                return nb__error(NB_EINVAL, "%s: two parameters are named '%s'; state names "
                                 "must be unique", who, name);
        }
        for (int j = 0; j < i; j++) {
            const char *nj = ps->names && ps->names[j] ? ps->names[j] : NULL;
            if (ps->tensors[j] == t)
                return nb__error(NB_EINVAL, "%s: parameter '%s' is listed twice", who, name);
            if (nj && ps->names && ps->names[i] && strcmp(nj, name) == 0)
                return nb__error(NB_EINVAL, "%s: two parameters are named '%s'; state names "
                                 "must be unique", who, name);
        }
    }
    if (!grow((void **)&opt->params, &opt->cap_params, opt->nparams + ps->count,
              sizeof(nb__oparam)))
        return nb__error(NB_ENOMEM, "%s: out of memory", who);
    int base = opt->nparams;
    for (int i = 0; i < ps->count; i++) {
        char idx[24];
        snprintf(idx, sizeof idx, "%d", base + i);
        nb__oparam *p = &opt->params[base + i];
        memset(p, 0, sizeof *p);
        p->name = strdup(ps->names && ps->names[i] ? ps->names[i] : idx);
        if (!p->name) {
            for (int j = base; j < base + i; j++) {
                free(opt->params[j].name);
                nb_tensor_free(opt->params[j].t);
            }
            return nb__error(NB_ENOMEM, "%s: out of memory", who);
        }
        p->t = nb_tensor_retain(ps->tensors[i]);
        p->group = g;
    }
    opt->nparams += ps->count;
    opt->plist_ok = false;
    return NB_OK;
}

nb_optim *nb__optim_new(const nb__optim_kind *kind, const nb__hyper *h, const nb_params *params) {
    if (kind->check(h, kind->name) != NB_OK) return NULL;
    nb_optim *opt = nb__obj_alloc(sizeof *opt, NB__OBJ_OPTIM);
    if (!opt || !grow((void **)&opt->groups, &opt->cap_groups, 1, sizeof(nb__hyper))) {
        nb__obj_free(opt);
        nb__error(NB_ENOMEM, "%s: out of memory", kind->name);
        return NULL;
    }
    opt->kind = kind;
    opt->defaults = *h;
    opt->groups[0] = *h;
    opt->ngroups = 1;
    if (add_params(opt, params, 0, kind->name) != NB_OK) {
        nb_optim_free(opt);
        return NULL;
    }
    return opt;
}

void nb_optim_free(nb_optim *opt) {
    if (!opt || !nb__obj_ok(opt, NB__OBJ_OPTIM, "optim_free")) return;
    nb__optim_state_clear(opt);
    for (int i = 0; i < opt->nparams; i++) {
        nb__oparam_reset(&opt->params[i]);
        nb_tensor_free(opt->params[i].t);
        free(opt->params[i].name);
    }
    free(opt->params);
    free(opt->groups);
    free(opt->work);
    free(opt->plist.tensors);
    free(opt->plist.names);
    nb__obj_free(opt);
}

const char *nb_optim_name(const nb_optim *opt) {
    return opt && nb__obj_ok(opt, NB__OBJ_OPTIM, "optim_name") ? opt->kind->name : "?";
}

/* ---- groups ---------------------------------------------------------------------------------- */
int nb_optim_add_group(nb_optim *opt, const nb_params *params, const nb_group_opts *o) {
    if (!opt) return nb__error(NB_ENULL, "optim_add_group: opt is NULL");
    if (!nb__obj_ok(opt, NB__OBJ_OPTIM, "optim_add_group")) return nb_last_status();
    nb_group_opts z = nb_group_defaults();
    if (!o) o = &z;
    if (NB__OPTS_CHECK(o, nb_group_opts, "optim_add_group", "nb_group_defaults()",
                       "o.weight_decay = 0") != NB_OK)
        return nb_last_status();
    const double given[NB__H_COUNT] = {
        [NB__H_LR] = o->lr,           [NB__H_WEIGHT_DECAY] = o->weight_decay,
        [NB__H_MOMENTUM] = o->momentum, [NB__H_DAMPENING] = o->dampening,
        [NB__H_BETA1] = o->betas[0],  [NB__H_BETA2] = o->betas[1],
        [NB__H_EPS] = o->eps,         [NB__H_ALPHA] = o->alpha,
        [NB__H_LR_DECAY] = o->lr_decay, [NB__H_INIT_ACC] = o->initial_accumulator_value,
    };
    static const char *const field[NB__H_COUNT] = {
        "lr", "weight_decay", "momentum", "dampening", "betas[0]", "betas[1]", "eps", "alpha",
        "lr_decay", "initial_accumulator_value",
    };
    nb__hyper h = opt->defaults;
    for (int k = 0; k < NB__H_COUNT; k++) {
        if (isnan(given[k])) continue; /* NAN: the optimizer's value */
        if (!(opt->kind->hypers & (1u << k))) {
            if (given[k] == 0) continue; /* none of it, as the optimizer */
            return nb__error(NB_EINVAL, "optim_add_group: %s has no %s (leave it NAN or 0), "
                             "got %g", opt->kind->name, field[k], given[k]);
        }
        h.v[k] = given[k];
    }
    char who[64];
    snprintf(who, sizeof who, "optim_add_group (%s)", opt->kind->name);
    nb_status st = opt->kind->check(&h, who);
    if (st != NB_OK) return st;
    if (!grow((void **)&opt->groups, &opt->cap_groups, opt->ngroups + 1, sizeof(nb__hyper)))
        return nb__error(NB_ENOMEM, "optim_add_group: out of memory");
    st = add_params(opt, params, opt->ngroups, "optim_add_group");
    if (st != NB_OK) return st;
    opt->groups[opt->ngroups] = h;
    nb__optim_state_clear(opt);
    return opt->ngroups++;
}

nb_group_opts nb_group_defaults(void) {
    return (nb_group_opts){._init = NB__OPTS_MARK(nb_group_opts),
                           .lr = NAN,
                           .weight_decay = NAN,
                           .momentum = NAN,
                           .dampening = NAN,
                           .betas = {NAN, NAN},
                           .eps = NAN,
                           .alpha = NAN,
                           .lr_decay = NAN,
                           .initial_accumulator_value = NAN};
}

int nb_optim_num_groups(const nb_optim *opt) {
    return opt && nb__obj_ok(opt, NB__OBJ_OPTIM, "optim_num_groups") ? opt->ngroups : 0;
}

static bool group_ok(const nb_optim *opt, int g, const char *who) {
    if (!opt) {
        nb__error(NB_ENULL, "%s: opt is NULL", who);
        return false;
    }
    if (!nb__obj_ok(opt, NB__OBJ_OPTIM, who)) return false;
    if (g < 0 || g >= opt->ngroups) {
        nb__error(NB_EINDEX, "%s: group %d out of range (the optimizer has %d)", who, g,
                  opt->ngroups);
        return false;
    }
    return true;
}

nb_status nb_optim_group_opts(const nb_optim *opt, int g, nb_group_opts *out) {
    if (!group_ok(opt, g, "optim_group_opts")) return nb_last_status();
    if (!out) return nb__error(NB_ENULL, "optim_group_opts: out is NULL");
    double v[NB__H_COUNT];
    for (int k = 0; k < NB__H_COUNT; k++)
        v[k] = opt->kind->hypers & (1u << k) ? opt->groups[g].v[k] : NAN;
    *out = (nb_group_opts){
        ._init = NB__OPTS_MARK(nb_group_opts),
        .lr = v[NB__H_LR],
        .weight_decay = v[NB__H_WEIGHT_DECAY],
        .momentum = v[NB__H_MOMENTUM],
        .dampening = v[NB__H_DAMPENING],
        .betas = {v[NB__H_BETA1], v[NB__H_BETA2]},
        .eps = v[NB__H_EPS],
        .alpha = v[NB__H_ALPHA],
        .lr_decay = v[NB__H_LR_DECAY],
        .initial_accumulator_value = v[NB__H_INIT_ACC],
    };
    return NB_OK;
}

double nb_optim_get_lr(const nb_optim *opt, int g) {
    return group_ok(opt, g, "optim_get_lr") ? opt->groups[g].v[NB__H_LR] : NAN;
}

nb_status nb_optim_set_lr(nb_optim *opt, int g, double lr) {
    if (!opt) return nb__error(NB_ENULL, "optim_set_lr: opt is NULL");
    if (!nb__obj_ok(opt, NB__OBJ_OPTIM, "optim_set_lr")) return nb_last_status();
    if (g != -1 && !group_ok(opt, g, "optim_set_lr")) return nb_last_status();
    if (!(lr >= 0) || isinf(lr))
        return nb__error(NB_EINVAL, "optim_set_lr: lr must be a finite value >= 0, got %g", lr);
    for (int i = 0; i < opt->ngroups; i++)
        if (g == -1 || i == g) opt->groups[i].v[NB__H_LR] = lr;
    return NB_OK;
}

bool nb__optim_has_momentum(const nb_optim *opt) {
    return opt->kind->hypers & ((1u << NB__H_MOMENTUM) | (1u << NB__H_BETA1));
}

nb_status nb__optim_set_momentum(nb_optim *opt, int g, double m) {
    if (!group_ok(opt, g, "optim_set_momentum")) return nb_last_status();
    if (opt->kind->hypers & (1u << NB__H_MOMENTUM)) opt->groups[g].v[NB__H_MOMENTUM] = m;
    else if (opt->kind->hypers & (1u << NB__H_BETA1)) opt->groups[g].v[NB__H_BETA1] = m;
    else return nb__error(NB_EUNSUPPORTED, "%s has neither momentum nor betas", opt->kind->name);
    return NB_OK;
}

const nb_params *nb_optim_params(const nb_optim *opt) {
    if (!opt) {
        nb__error(NB_ENULL, "optim_params: opt is NULL");
        return NULL;
    }
    if (!nb__obj_ok(opt, NB__OBJ_OPTIM, "optim_params")) return NULL;
    nb_optim *o = nb__unconst(opt); /* the list is a cache */
    if (!o->plist_ok) {
        size_t n = (size_t)(o->nparams ? o->nparams : 1);
        nb_tensor **ts = realloc(o->plist.tensors, sizeof(nb_tensor *) * n);
        if (ts) o->plist.tensors = ts;
        const char **ns = ts ? realloc((void *)o->plist.names, sizeof(char *) * n) : NULL;
        if (!ns) {
            nb__error(NB_ENOMEM, "optim_params: out of memory");
            return NULL;
        }
        o->plist.names = ns;
        for (int i = 0; i < o->nparams; i++) {
            o->plist.tensors[i] = o->params[i].t;
            o->plist.names[i] = o->params[i].name;
        }
        o->plist.count = o->nparams;
        o->plist_ok = true;
    }
    return &o->plist;
}

/* ---- decay split ----------------------------------------------------------------------------- */
void nb_params_deinit(nb_params *p) {
    if (!p) return;
    free(p->tensors);
    free((void *)p->names);
    memset(p, 0, sizeof *p);
}

nb_status nb_params_split_decay(const nb_params *ps, nb_params *decay, nb_params *no_decay) {
    if (!ps || !decay || !no_decay)
        return nb__error(NB_ENULL, "params_split_decay: %s is NULL",
                         !ps ? "params" : !decay ? "decay" : "no_decay");
    memset(decay, 0, sizeof *decay);
    memset(no_decay, 0, sizeof *no_decay);
    size_t n = (size_t)(ps->count > 0 ? ps->count : 1);
    nb_params *out[2] = {decay, no_decay};
    for (int k = 0; k < 2; k++) {
        out[k]->tensors = malloc(sizeof(nb_tensor *) * n);
        out[k]->names = malloc(sizeof(char *) * n);
        if (!out[k]->tensors || !out[k]->names) {
            nb_params_deinit(decay);
            nb_params_deinit(no_decay);
            return nb__error(NB_ENOMEM, "params_split_decay: out of memory");
        }
    }
    for (int i = 0; i < ps->count; i++) {
        nb_tensor *t = ps->tensors[i];
        if (!t) {
            nb_params_deinit(decay);
            nb_params_deinit(no_decay);
            return nb__error(NB_ENULL, "params_split_decay: parameter %d is NULL", i);
        }
        nb_params *o = t->ndim >= 2 ? decay : no_decay;
        o->tensors[o->count] = t;
        o->names[o->count] = ps->names ? ps->names[i] : NULL;
        o->count++;
    }
    /* Keep index-style names stable when the input has none: names NULL in both lists. */
    if (!ps->names) {
        free((void *)decay->names);
        free((void *)no_decay->names);
        decay->names = no_decay->names = NULL;
    }
    return NB_OK;
}

/* ---- zero_grad and step ---------------------------------------------------------------------- */
static nb_status zero_grad(nb_optim *opt);
nb_status nb_zero_grad(nb_optim *opt) {
    if (!opt) return nb__error(NB_ENULL, "zero_grad: opt is NULL");
    if (!nb__obj_ok(opt, NB__OBJ_OPTIM, "zero_grad")) return nb_last_status();
    int tok = NB__SPAN_BEGIN("zero_grad", NULL, NB__CAT_OPTIM);
    nb_status st = zero_grad(opt);
    NB__SPAN_END(tok);
    return st;
}

static nb_status zero_grad(nb_optim *opt) {
    for (int i = 0; i < opt->nparams; i++) {
        nb_tensor *t = opt->params[i].t, *g = t->grad;
        if (!g) continue;
        /* A gradient whose storage others also reference is a view into a flat buffer (or
         * something the caller holds on to): keep it, zeroed, so the layout survives. */
        if (atomic_load(&g->storage->refcount) > 1) {
            nb_status st = nb_fill_(g, 0);
            if (st != NB_OK) return st;
        } else {
            nb_clear_grad(t);
        }
    }
    return NB_OK;
}

#define FRESH_MASTER (1u << 31) /* prepare's flag: the master copy was allocated now */

/* Check one parameter before any update; allocate its missing state (unfilled: the fill
 * happens in the update pass, so a failure here leaves nothing half-initialized). A half
 * parameter's state and master copy are f32; its gradient may be of its own dtype or f32
 * (reduced in f32, nb_ddp_opts.reduce_dtype). */
static nb_status prepare(nb_optim *opt, nb__oparam *p, unsigned *fresh) {
    const char *who = opt->kind->name;
    nb_tensor *t = p->t, *g = t->grad;
    const nb_dtype wdt = nb__opt_work_dtype(t->dtype);
    *fresh = 0;
    if (!nb_dtype_is_float(t->dtype))
        return nb__error(NB_EDTYPE, "%s: parameter '%s' is %s; optimizers update float "
                         "parameters", who, p->name, nb_dtype_name(t->dtype));
    if (g->dtype != t->dtype && !(nb__opt_is_half(t->dtype) && g->dtype == NB_F32))
        return nb__error(NB_EDTYPE, "%s: the gradient of '%s' is %s but the parameter is %s%s",
                         who, p->name, nb_dtype_name(g->dtype), nb_dtype_name(t->dtype),
                         nb__opt_is_half(t->dtype) ? " (a half parameter's gradient may be of "
                         "its dtype or f32)" : "");
    if (nb_numel(g) != nb_numel(t))
        return nb__error(NB_ESHAPE, "%s: the gradient of '%s' has shape %s but the parameter %s",
                         who, p->name, NB__SHAPE(g), NB__SHAPE(t));
    nb_device dev = nb__device_of(t);
    if (!nb_device_equal(dev, nb__device_of(g))) { /* the message names the parameter */
        char op[160];
        snprintf(op, sizeof op, "%s: parameter '%s' and its gradient", who, p->name);
        nb__check_devices(op, (nb_tensor *[]){t, g}, 2, &dev);
        return nb_last_status();
    }
    nb_status st = kernel_ok(opt->kind, t, who);
    if (st != NB_OK) return st;
    if (!nb_is_contiguous(t))
        return nb__error(NB_EINVAL, "%s: parameter '%s' %s is not contiguous", who, p->name,
                         NB__SHAPE(t));
    const nb__hyper *h = &opt->groups[p->group];
    for (int k = 0; k < opt->kind->nslots; k++) {
        if (!opt->kind->slot_used(h, k)) continue;
        /* State made before the parameter moved (nb_module_to after a step) is stale, as
         * in PyTorch: say so rather than mixing devices in one update. */
        if (p->slot[k] && !nb_device_equal(nb__device_of(p->slot[k]), dev))
            return nb__error(NB_EDEVICE, "%s: the state of '%s' is on %s but the parameter is "
                             "on %s; create the optimizer after moving the model (or load "
                             "its state again)", who, p->name,
                             NB__DEVSTR(nb__device_of(p->slot[k])), NB__DEVSTR(dev));
        if (!p->slot[k]) {
            nb_tensor *s = nb__empty(t->shape, t->ndim, wdt, dev);
            if (!s) return nb_last_status();
            p->slot[k] = nb__scope_take(s);
            *fresh |= 1u << k;
        } else if (!p->has_state) {
            *fresh |= 1u << k; /* allocated by an earlier step that failed */
        }
    }
    if (nb__opt_is_half(t->dtype)) {
        if (p->master && !nb_device_equal(nb__device_of(p->master), dev))
            return nb__error(NB_EDEVICE, "%s: the f32 master copy of '%s' is on %s but the "
                             "parameter is on %s; create the optimizer after moving the model "
                             "(or load its state again)", who, p->name,
                             NB__DEVSTR(nb__device_of(p->master)), NB__DEVSTR(dev));
        if (!p->master) {
            nb_tensor *m = nb__empty(t->shape, t->ndim, NB_F32, dev);
            if (!m) return nb_last_status();
            p->master = nb__scope_take(m);
            *fresh |= FRESH_MASTER;
        } else if (!p->has_state) {
            *fresh |= FRESH_MASTER;
        }
    }
    return NB_OK;
}

struct nb__step_work {
    unsigned fresh;  /* slots allocated for this update */
    nb_tensor *g;    /* the gradient to read (a packed copy when the gradient is strided) */
};

static nb_status step(nb_optim *opt);
/* One span per step, named by the optimizer ("adamw"; tensor/trace.h). */
nb_status nb_step(nb_optim *opt) {
    if (!opt) return nb__error(NB_ENULL, "step: opt is NULL");
    if (!nb__obj_ok(opt, NB__OBJ_OPTIM, "step")) return nb_last_status();
    if (opt->step_hook) return opt->step_hook(opt->step_ctx); /* sharded (nb_zero) */
    int tok = NB__SPAN_BEGIN(opt->kind->name, NULL, NB__CAT_OPTIM);
    nb_status st = step(opt);
    NB__SPAN_END(tok);
    return st;
}

static nb_status step(nb_optim *opt) {
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_status st = NB_OK;
    /* Scratch kept in the optimizer: no allocation in the steady state (docs/architecture.md
     * rule 4). */
    if (!grow((void **)&opt->work, &opt->work_cap, opt->nparams, sizeof(struct nb__step_work)))
        st = nb__error(NB_ENOMEM, "step: out of memory");
    struct nb__step_work *w = opt->work;
    /* Pass 1: check everything and allocate missing state, changing no parameter. */
    for (int i = 0; i < opt->nparams && st == NB_OK; i++) {
        nb__oparam *p = &opt->params[i];
        w[i].g = p->t->grad;
        if (!w[i].g) continue;
        /* A gradient that may not be used yet: a data parallel model's, never averaged. */
        if ((st = nb__check_grad(p->t, "step")) != NB_OK) break;
        st = prepare(opt, p, &w[i].fresh);
        /* A non-contiguous gradient (a user-installed view) is read from a packed copy. */
        if (st == NB_OK && !nb_is_contiguous(w[i].g) && !(w[i].g = nb_contiguous(w[i].g)))
            st = nb_last_status();
        /* A half parameter's update runs in f32 on its master: an f32 copy of a half
         * gradient (scope memory from the caching allocator). */
        if (st == NB_OK && w[i].g->dtype != nb__opt_work_dtype(w[i].g->dtype) &&
            !(w[i].g = nb_to_dtype(w[i].g, NB_F32)))
            st = nb_last_status();
    }
    /* Pass 2: initialize fresh state and run one fused update per parameter. */
    for (int i = 0; i < opt->nparams && st == NB_OK; i++) {
        nb__oparam *p = &opt->params[i];
        if (!w[i].g) continue;
        const nb__hyper *h = &opt->groups[p->group];
        for (int k = 0; k < opt->kind->nslots; k++) {
            if (!(w[i].fresh & (1u << k))) continue;
            double v = opt->kind->slot_init(h, k);
            if (isnan(v)) continue;
            st = nb_fill_(p->slot[k], v);
            if (st != NB_OK) break;
        }
        if (st != NB_OK) break;
        if (opt->kind->has_step) p->step++;
        p->has_state = true;
        /* The update writes the parameter (and its state) in place: a graph that saved it
         * (a forward run before this step) must not backpropagate through the new values. */
        nb__bump_version(p->t);
        for (int k = 0; k < opt->kind->nslots; k++)
            if (p->slot[k]) nb__bump_version(p->slot[k]);
        if (!p->master) {
            st = opt->kind->update(h, p, w[i].g, w[i].fresh & ~FRESH_MASTER);
            continue;
        }
        /* Master weights: the update runs on the f32 copy, the parameter gets it rounded
         * to its dtype (round to nearest even). */
        if ((w[i].fresh & FRESH_MASTER) && (st = nb_copy_(p->master, p->t)) != NB_OK) break;
        nb__bump_version(p->master);
        nb_tensor *t = p->t;
        p->t = p->master;
        st = opt->kind->update(h, p, w[i].g, w[i].fresh & ~FRESH_MASTER);
        p->t = t;
        if (st == NB_OK) st = nb_copy_(t, p->master);
    }
    nb_scope_end();
    nb_set_grad_enabled(prev);
    return st;
}
