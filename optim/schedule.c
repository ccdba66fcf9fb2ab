/* optim/schedule.c - learning-rate schedules: a pure function lr(opts, base_lr, t) in closed
 * form, and a small stateful object that applies it to every group of an optimizer after
 * each step. The closed forms equal PyTorch's chained (multiplicative) schedulers up to
 * rounding; one-cycle follows OneCycleLR's phase arithmetic exactly. The whole state is the
 * step count and the groups' base lrs, so a schedule checkpoints as two tensors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim_impl.h"

struct nb_sched {
    nb__obj h;             /* a checked handle (tensor/handle.h) */
    nb_optim *opt;         /* borrowed: a step refuses it once freed */
    nb_sched_opts o;       /* resolved; o.milestones points at our copy */
    int64_t *milestones;
    double *base_lrs;
    int ngroups;
    int64_t last_step;
    nb_params slist;       /* nb_sched_state */
    const char *snames[2];
    nb_tensor *stensors[2];
};

static const char *kind_name(nb_sched_kind k) {
    static const char *const names[] = {"constant", "step", "multistep", "exponential",
                                        "cosine", "linear", "onecycle"};
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

/* Check the options for their kind (every field as written) and copy them to o. */
static nb_status resolve(const nb_sched_opts *in, nb_sched_opts *o) {
    *o = (nb_sched_opts){0};
    if (!in) return nb__error(NB_ENULL, "sched: opts is NULL");
    nb_status st = NB__OPTS_CHECK(in, nb_sched_opts, "sched", "nb_sched_defaults(NB_SCHED_COSINE)",
                                  "o.total_steps = 5000");
    if (st != NB_OK) return st;
    *o = *in;
    const char *who = kind_name(o->kind);
    switch (o->kind) {
    case NB_SCHED_CONSTANT: break;
    case NB_SCHED_STEP:
        if (o->step_size <= 0)
            return nb__error(NB_EINVAL, "step schedule: step_size must be > 0, got %lld",
                             (long long)o->step_size);
        /* fallthrough */
    case NB_SCHED_MULTISTEP:
        if (o->kind == NB_SCHED_MULTISTEP &&
            (o->num_milestones < 0 || (o->num_milestones > 0 && !o->milestones)))
            return nb__error(NB_EINVAL, "multistep schedule: %d milestones but the array is NULL",
                             o->num_milestones);
        for (int i = 0; o->kind == NB_SCHED_MULTISTEP && i < o->num_milestones; i++)
            if (o->milestones[i] < 0 || (i > 0 && o->milestones[i] < o->milestones[i - 1]))
                return nb__error(NB_EINVAL, "multistep schedule: milestones must be >= 0 and "
                                 "non-decreasing (milestone %d is %lld)", i,
                                 (long long)o->milestones[i]);
        break;
    case NB_SCHED_EXPONENTIAL:
        if (o->gamma == 0)
            return nb__error(NB_EINVAL, "exponential schedule: gamma is required (> 0)");
        break;
    case NB_SCHED_COSINE:
    case NB_SCHED_LINEAR:
        if (o->total_steps <= 0)
            return nb__error(NB_EINVAL, "%s schedule: total_steps must be > 0, got %lld", who,
                             (long long)o->total_steps);
        if (o->warmup_steps < 0 || o->warmup_steps > o->total_steps)
            return nb__error(NB_EINVAL, "%s schedule: warmup_steps must be in [0, total_steps "
                             "= %lld], got %lld", who, (long long)o->total_steps,
                             (long long)o->warmup_steps);
        if (!(o->min_lr >= 0))
            return nb__error(NB_EINVAL, "%s schedule: min_lr must be >= 0, got %g", who,
                             o->min_lr);
        break;
    case NB_SCHED_ONECYCLE:
        if (o->total_steps <= 0)
            return nb__error(NB_EINVAL, "onecycle schedule: total_steps must be > 0, got %lld",
                             (long long)o->total_steps);
        if (!(o->pct_start >= 0 && o->pct_start <= 1))
            return nb__error(NB_EINVAL, "onecycle schedule: pct_start must be in [0, 1], got %g",
                             o->pct_start);
        if (!(o->div_factor > 0) || !(o->final_div_factor > 0))
            return nb__error(NB_EINVAL, "onecycle schedule: div_factor and final_div_factor "
                             "must be > 0");
        if (!(o->max_lr >= 0) && !isnan(o->max_lr))
            return nb__error(NB_EINVAL, "onecycle schedule: max_lr must be >= 0 (or NAN: each "
                             "group's lr), got %g", o->max_lr);
        if (o->cycle_momentum && (!(o->base_momentum >= 0) || !(o->max_momentum >= 0)))
            return nb__error(NB_EINVAL, "onecycle schedule: base_momentum and max_momentum must "
                             "be >= 0, got %g and %g", o->base_momentum, o->max_momentum);
        break;
    default:
        return nb__error(NB_EINVAL, "sched: unknown schedule kind %d", (int)o->kind);
    }
    if (o->gamma < 0 || isnan(o->gamma))
        return nb__error(NB_EINVAL, "%s schedule: gamma must be >= 0, got %g", who, o->gamma);
    return NB_OK;
}

nb_sched_opts nb_sched_defaults(nb_sched_kind kind) {
    return (nb_sched_opts){
        ._init = NB__OPTS_MARK(nb_sched_opts),
        .kind = kind,
        .gamma = kind == NB_SCHED_STEP || kind == NB_SCHED_MULTISTEP ? 0.1 : 0,
        .max_lr = NAN,
        .pct_start = 0.3,
        .div_factor = 25,
        .final_div_factor = 1e4,
        .base_momentum = 0.85,
        .max_momentum = 0.95,
    };
}

/* OneCycleLR's cosine annealing from start to end as pct goes 0 -> 1. */
static double anneal_cos(double start, double end, double pct) {
    double c = cos(M_PI * pct) + 1;
    return end + (start - end) / 2.0 * c;
}

/* OneCycleLR's two phases: [0, pct_start * total - 1] up, then down to total - 1. Returns the
 * phase (0 or 1) and its progress. */
static int onecycle_phase(const nb_sched_opts *o, int64_t t, double *pct) {
    double end1 = o->pct_start * (double)o->total_steps - 1, end2 = (double)o->total_steps - 1;
    if ((double)t <= end1) {
        *pct = end1 > 0 ? (double)t / end1 : 1.0;
        return 0;
    }
    *pct = end2 > end1 ? ((double)t - end1) / (end2 - end1) : 1.0;
    return 1;
}

/* lr for resolved options. */
static double lr_at(const nb_sched_opts *o, double base, int64_t t) {
    switch (o->kind) {
    case NB_SCHED_STEP: return base * pow(o->gamma, (double)(t / o->step_size));
    case NB_SCHED_MULTISTEP: {
        int k = 0;
        while (k < o->num_milestones && o->milestones[k] <= t) k++;
        return base * pow(o->gamma, k);
    }
    case NB_SCHED_EXPONENTIAL: return base * pow(o->gamma, (double)t);
    case NB_SCHED_COSINE:
    case NB_SCHED_LINEAR: {
        int64_t w = o->warmup_steps, T = o->total_steps;
        if (t < w) return base * (double)(t + 1) / (double)w;
        if (t >= T) return o->min_lr;
        double frac = (double)(t - w) / (double)(T - w);
        if (o->kind == NB_SCHED_LINEAR) return o->min_lr + (base - o->min_lr) * (1 - frac);
        return o->min_lr + (base - o->min_lr) * (1 + cos(M_PI * frac)) / 2;
    }
    case NB_SCHED_ONECYCLE: {
        double max_lr = isnan(o->max_lr) ? base : o->max_lr;
        double initial = max_lr / o->div_factor, min_lr = initial / o->final_div_factor, pct;
        return onecycle_phase(o, t, &pct) == 0 ? anneal_cos(initial, max_lr, pct)
                                               : anneal_cos(max_lr, min_lr, pct);
    }
    default: return base;
    }
}

static nb_status check_t(const nb_sched_opts *o, int64_t t) {
    if (t < 0) return nb__error(NB_EINVAL, "%s schedule: step %lld is negative", kind_name(o->kind),
                                (long long)t);
    if (o->kind == NB_SCHED_ONECYCLE && t > o->total_steps)
        return nb__error(NB_EINVAL, "onecycle schedule: stepped %lld times but total_steps is %lld",
                         (long long)t, (long long)o->total_steps);
    return NB_OK;
}

double nb_sched_lr_at(const nb_sched_opts *in, double base_lr, int64_t t) {
    nb_sched_opts o;
    if (resolve(in, &o) != NB_OK || check_t(&o, t) != NB_OK) return NAN;
    return lr_at(&o, base_lr, t);
}

double nb_sched_momentum_at(const nb_sched_opts *in, int64_t t) {
    nb_sched_opts o;
    if (resolve(in, &o) != NB_OK || check_t(&o, t) != NB_OK) return NAN;
    if (o.kind != NB_SCHED_ONECYCLE || !o.cycle_momentum) return NAN;
    double pct;
    return onecycle_phase(&o, t, &pct) == 0 ? anneal_cos(o.max_momentum, o.base_momentum, pct)
                                            : anneal_cos(o.base_momentum, o.max_momentum, pct);
}

/* ---- the stateful schedule ------------------------------------------------------------------- */
/* Set every group's lr (and momentum) for step t; all or nothing. */
static nb_status apply(nb_sched *s, int64_t t) {
    nb_status st = check_t(&s->o, t);
    if (st != NB_OK) return st;
    if (nb_optim_num_groups(s->opt) != s->ngroups)
        return nb__error(NB_ESTATE, "sched_step: the optimizer has %d groups but the schedule was "
                         "made for %d; make the schedule after adding the groups",
                         nb_optim_num_groups(s->opt), s->ngroups);
    for (int g = 0; g < s->ngroups; g++) {
        double lr = lr_at(&s->o, s->base_lrs[g], t);
        if (!(lr >= 0) || isinf(lr))
            return nb__error(NB_EINVAL, "%s schedule: lr %g at step %lld for group %d",
                             kind_name(s->o.kind), lr, (long long)t, g);
    }
    for (int g = 0; g < s->ngroups; g++)
        nb_optim_set_lr(s->opt, g, lr_at(&s->o, s->base_lrs[g], t));
    if (s->o.kind == NB_SCHED_ONECYCLE && s->o.cycle_momentum) {
        double m = nb_sched_momentum_at(&s->o, t);
        for (int g = 0; g < s->ngroups; g++) nb__optim_set_momentum(s->opt, g, m);
    }
    s->last_step = t;
    return NB_OK;
}

static void state_clear(nb_sched *s) {
    for (int i = 0; i < 2; i++) {
        nb_tensor_free(s->stensors[i]);
        s->stensors[i] = NULL;
    }
}

void nb__sched_state_clear(nb_sched *s) { state_clear(s); }
void nb_sched_state_release(nb_sched *s) {
    if (s && nb__obj_ok(s, NB__OBJ_SCHED, "sched_state_release")) state_clear(s);
}

void nb_sched_free(nb_sched *s) {
    if (!s || !nb__obj_ok(s, NB__OBJ_SCHED, "sched_free")) return;
    state_clear(s);
    free(s->milestones);
    free(s->base_lrs);
    nb__obj_free(s);
}

/* s and the optimizer it drives are alive. */
static bool live(const nb_sched *s, const char *op) {
    return nb__obj_ok(s, NB__OBJ_SCHED, op) && nb__obj_ok(s->opt, NB__OBJ_OPTIM, op);
}

nb_sched *nb_sched_new(nb_optim *opt, const nb_sched_opts *in) {
    if (!opt) {
        nb__error(NB_ENULL, "sched_new: opt is NULL");
        return NULL;
    }
    if (!nb__obj_ok(opt, NB__OBJ_OPTIM, "sched_new")) return NULL;
    nb_sched_opts o;
    if (resolve(in, &o) != NB_OK) return NULL;
    if (o.kind == NB_SCHED_ONECYCLE && o.cycle_momentum && !nb__optim_has_momentum(opt)) {
        nb__error(NB_EINVAL, "onecycle schedule: cycle_momentum needs an optimizer with momentum "
                  "or betas, and %s has neither", nb_optim_name(opt));
        return NULL;
    }
    nb_sched *s = nb__obj_alloc(sizeof *s, NB__OBJ_SCHED);
    int ng = nb_optim_num_groups(opt);
    if (s) {
        s->base_lrs = malloc(sizeof(double) * (size_t)(ng ? ng : 1));
        size_t nm = (size_t)(o.num_milestones > 0 ? o.num_milestones : 1);
        s->milestones = malloc(sizeof(int64_t) * nm);
    }
    if (!s || !s->base_lrs || !s->milestones) {
        nb_sched_free(s);
        nb__error(NB_ENOMEM, "sched_new: out of memory");
        return NULL;
    }
    if (o.kind == NB_SCHED_MULTISTEP && o.num_milestones > 0)
        memcpy(s->milestones, o.milestones, sizeof(int64_t) * (size_t)o.num_milestones);
    o.milestones = s->milestones;
    s->o = o;
    s->opt = opt;
    s->ngroups = ng;
    for (int g = 0; g < ng; g++)
        s->base_lrs[g] = o.kind == NB_SCHED_ONECYCLE && o.max_lr > 0 ? o.max_lr
                                                                    : nb_optim_get_lr(opt, g);
    if (apply(s, 0) != NB_OK) {
        nb_sched_free(s);
        return NULL;
    }
    return s;
}

nb_status nb_sched_step(nb_sched *s) {
    if (!s) return nb__error(NB_ENULL, "sched_step: sched is NULL");
    if (!live(s, "sched_step")) return nb_last_status();
    return apply(s, s->last_step + 1);
}

nb_status nb_sched_set_step(nb_sched *s, int64_t t) {
    if (!s) return nb__error(NB_ENULL, "sched_set_step: sched is NULL");
    if (!live(s, "sched_set_step")) return nb_last_status();
    return apply(s, t);
}

int64_t nb_sched_last_step(const nb_sched *s) {
    return s && nb__obj_ok(s, NB__OBJ_SCHED, "sched_last_step") ? s->last_step : -1;
}

const nb_params *nb_sched_state(nb_sched *s) {
    if (!s) {
        nb__error(NB_ENULL, "sched_state: sched is NULL");
        return NULL;
    }
    if (!nb__obj_ok(s, NB__OBJ_SCHED, "sched_state")) return NULL;
    state_clear(s);
    int64_t n = s->ngroups;
    nb_tensor *a = nb_full_on(NB_CPU, NULL, 0, NB_I64, (double)s->last_step);
    nb_tensor *b = nb_from_buffer(s->base_lrs, &n, 1, NB_F64);
    s->stensors[0] = a ? nb__scope_take(a) : NULL;
    s->stensors[1] = b ? nb__scope_take(b) : NULL;
    if (!a || !b) {
        state_clear(s);
        return NULL;
    }
    s->snames[0] = "last_step";
    s->snames[1] = "base_lrs";
    s->slist = (nb_params){.count = 2, .tensors = s->stensors, .names = s->snames};
    return &s->slist;
}

nb_status nb_sched_load_state(nb_sched *s, const char *const *names, nb_tensor *const *ts,
                              int n) {
    const char *who = "sched_load_state";
    if (!s) return nb__error(NB_ENULL, "%s: sched is NULL", who);
    if (!live(s, who)) return nb_last_status();
    if (n < 0 || (n > 0 && (!names || !ts)))
        return nb__error(NB_ENULL, "%s: %d entries but %s is NULL", who, n,
                         !names ? "names" : "tensors");
    const nb_tensor *step = NULL, *base = NULL;
    for (int i = 0; i < n; i++) {
        if (!names[i] || !ts[i])
            return nb__error(NB_ENULL, "%s: entry %d has a NULL %s", who, i,
                             names[i] ? "tensor" : "name");
        const nb_tensor **slot = strcmp(names[i], "last_step") == 0  ? &step
                                 : strcmp(names[i], "base_lrs") == 0 ? &base
                                                                     : NULL;
        if (!slot)
            return nb__error(NB_EINVAL, "%s: unexpected entry '%s' (schedule state is last_step "
                             "and base_lrs)", who, names[i]);
        if (*slot) return nb__error(NB_EINVAL, "%s: '%s' appears twice", who, names[i]);
        *slot = ts[i];
    }
    if (!step || !base)
        return nb__error(NB_EINVAL, "%s: missing '%s'", who, !step ? "last_step" : "base_lrs");
    if (nb_numel(step) != 1)
        return nb__error(NB_ESHAPE, "%s: 'last_step' must be a single number, got shape %s", who,
                         NB__SHAPE(step));
    double t;
    nb_status st = nb_read(step, &t, 1, NB_F64); /* from any device with data */
    if (st != NB_OK) return st;
    if (!(t >= 0) || t != floor(t))
        return nb__error(NB_EINVAL, "%s: 'last_step' must be a whole number >= 0, got %g", who, t);
    if (base->ndim != 1 || base->shape[0] != s->ngroups)
        return nb__error(NB_ESHAPE, "%s: 'base_lrs' has shape %s but the schedule has %d groups",
                         who, NB__SHAPE(base), s->ngroups);
    if (!nb_dtype_is_float(base->dtype))
        return nb__error(NB_EDTYPE, "%s: 'base_lrs' is %s, not a float type", who,
                         nb_dtype_name(base->dtype));
    double *old = malloc(sizeof(double) * (size_t)(s->ngroups ? s->ngroups : 1));
    if (!old) return nb__error(NB_ENOMEM, "%s: out of memory", who);
    memcpy(old, s->base_lrs, sizeof(double) * (size_t)s->ngroups);
    st = nb_read(base, s->base_lrs, s->ngroups, NB_F64);
    if (st == NB_OK) st = apply(s, (int64_t)t);
    if (st != NB_OK) memcpy(s->base_lrs, old, sizeof(double) * (size_t)s->ngroups);
    free(old);
    return st;
}
