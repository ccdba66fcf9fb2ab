/* optim/scaler.c - the dynamic loss scaler (nb_grad_scaler, nabla/optim.h), with PyTorch's
 * GradScaler semantics: the loss is multiplied by the scale before backward, the gradients
 * are multiplied by 1 / scale and checked for inf/NaN in one pass (the amp_unscale kernel)
 * before the step, a step with an inf/NaN gradient is skipped and halves the scale, and
 * growth_interval clean steps in a row double it.
 *
 * Half gradients are unscaled into f32 buffers kept here between steps (no allocation in
 * the steady state, docs/architecture.md rule 4) and installed as the parameters' gradients
 * until the step is over, when the original gradient tensors are put back: a gradient that
 * is a view into a flat buffer (nb_module_flatten_parameters, nb_ddp) keeps its place, and
 * the optimizer's master weights receive the f32 values, so a gradient that only the scale
 * kept above f16's smallest subnormal (6e-8) is not flushed to zero again. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/autograd.h"
#include "optim/optim_impl.h"

nb_grad_scaler_opts nb_grad_scaler_defaults(void) {
    return (nb_grad_scaler_opts){._init = NB__OPTS_MARK(nb_grad_scaler_opts),
                                 .init_scale = 65536.0,
                                 .growth_factor = 2.0,
                                 .backoff_factor = 0.5,
                                 .growth_interval = 2000,
                                 .min_scale = 1.0,
                                 .enabled = true};
}

nb_grad_scaler *nb_grad_scaler_new(const nb_grad_scaler_opts *o) {
    nb_grad_scaler_opts d = nb_grad_scaler_defaults();
    if (!o) o = &d;
    const char *who = "grad_scaler";
    if (NB__OPTS_CHECK(o, nb_grad_scaler_opts, who, "nb_grad_scaler_defaults()",
                       "o.init_scale = 1024") != NB_OK)
        return NULL;
    if (!(o->init_scale > 0) || isinf(o->init_scale)) {
        nb__error(NB_EINVAL, "%s: init_scale must be finite and > 0, got %g", who, o->init_scale);
        return NULL;
    }
    if (!(o->growth_factor > 1) || isinf(o->growth_factor)) {
        nb__error(NB_EINVAL, "%s: growth_factor must be finite and > 1, got %g", who,
                  o->growth_factor);
        return NULL;
    }
    if (!(o->backoff_factor > 0 && o->backoff_factor < 1)) {
        nb__error(NB_EINVAL, "%s: backoff_factor must be in (0, 1), got %g", who,
                  o->backoff_factor);
        return NULL;
    }
    if (o->growth_interval < 1) {
        nb__error(NB_EINVAL, "%s: growth_interval must be >= 1, got %lld", who,
                  (long long)o->growth_interval);
        return NULL;
    }
    if (!(o->min_scale >= 0) || isinf(o->min_scale)) {
        nb__error(NB_EINVAL, "%s: min_scale must be finite and >= 0, got %g", who, o->min_scale);
        return NULL;
    }
    nb_grad_scaler *s = nb__obj_alloc(sizeof *s, NB__OBJ_SCALER);
    if (!s) {
        nb__error(NB_ENOMEM, "%s: out of memory", who);
        return NULL;
    }
    s->o = *o;
    s->scale = o->init_scale;
    return s;
}

static void state_clear(nb_grad_scaler *s) {
    for (int i = 0; i < 4; i++) {
        nb_tensor_free(s->sown[i]);
        s->sown[i] = NULL;
    }
    free(s->slist.tensors);
    free((void *)s->slist.names);
    memset(&s->slist, 0, sizeof s->slist);
}

/* Put back the gradients unscale replaced (the f32 buffers stay for the next step). */
static void restore(nb_grad_scaler *s) {
    for (int i = 0; i < s->nbuf; i++) {
        if (!s->orig[i]) continue;
        if (s->gopt && i < s->gopt->nparams) nb_set_grad(s->gopt->params[i].t, s->orig[i]);
        nb_tensor_free(s->orig[i]);
        s->orig[i] = NULL;
    }
}

void nb_grad_scaler_free(nb_grad_scaler *s) {
    if (!s || !nb__obj_ok(s, NB__OBJ_SCALER, "grad_scaler_free")) return;
    restore(s);
    for (int i = 0; i < s->nbuf; i++) nb_tensor_free(s->buf[i]);
    free(s->buf);
    free(s->orig);
    state_clear(s);
    nb__obj_free(s);
}

nb_tensor *nb_grad_scaler_scale(nb_grad_scaler *s, nb_tensor *loss) {
    if (!s) {
        nb__error(NB_ENULL, "grad_scaler_scale: scaler is NULL");
        return NULL;
    }
    if (!nb__obj_ok(s, NB__OBJ_SCALER, "grad_scaler_scale")) return NULL;
    if (!loss) return NULL; /* keep the first error */
    if (!s->o.enabled) return nb__scope_add(nb_tensor_retain(loss)); /* a new reference */
    return nb_mul_scalar(loss, s->scale);
}

/* The f32 buffer for parameter i's unscaled gradient (kept between steps). */
static nb_tensor *buffer(nb_grad_scaler *s, int i, const nb_tensor *t) {
    nb_tensor *b = s->buf[i];
    nb_device dev = nb__device_of(t);
    if (b && (b->ndim != t->ndim || nb_numel(b) != nb_numel(t) ||
              memcmp(b->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim) != 0 ||
              !nb_device_equal(nb__device_of(b), dev))) {
        nb_tensor_free(b);
        s->buf[i] = b = NULL;
    }
    if (!b) {
        b = nb__empty(t->shape, t->ndim, NB_F32, dev);
        if (b) s->buf[i] = b = nb__scope_take(b);
    }
    return b;
}

static nb_status unscale(nb_grad_scaler *s, nb_optim *user, const char *who) {
    if (s->opt && s->opt != user && (s->unscaled || s->stepped))
        return nb__error(NB_ESTATE, "%s: this step already used another optimizer; a scaler "
                         "serves one optimizer per step (call nb_grad_scaler_update)", who);
    /* Under nb_zero each rank holds the gradients of its shard only, in the shard
     * optimizer's parameters: unscale those, and agree on the flag across the ranks. */
    nb_optim *opt = user;
    if (user->step_hook) {
        if (!user->sharded)
            return nb__error(NB_EUNSUPPORTED, "%s: the optimizer's step is redirected and its "
                             "gradients are not reachable", who);
        if (!s->reduce_flag)
            return nb__error(NB_ESTATE, "%s: the optimizer is sharded by nb_zero, so each rank "
                             "sees part of the gradients: make the inf/NaN check global with "
                             "nb_grad_scaler_set_comm first", who);
        opt = user->sharded;
    }
    if (opt->nparams > s->nbuf) {
        nb_tensor **b = realloc(s->buf, sizeof *b * (size_t)opt->nparams);
        if (b) s->buf = b;
        nb_tensor **o = b ? realloc(s->orig, sizeof *o * (size_t)opt->nparams) : NULL;
        if (!o) return nb__error(NB_ENOMEM, "%s: out of memory", who);
        s->orig = o;
        for (int i = s->nbuf; i < opt->nparams; i++) s->buf[i] = s->orig[i] = NULL;
        s->nbuf = opt->nparams;
    }
    s->opt = user;
    s->gopt = opt;
    /* Check first: nothing is unscaled unless every gradient can be. */
    for (int i = 0; i < opt->nparams; i++) {
        nb_tensor *g = opt->params[i].t->grad;
        if (!g) continue;
        if (!nb_dtype_is_float(g->dtype))
            return nb__error(NB_EDTYPE, "%s: the gradient of '%s' is %s", who,
                             opt->params[i].name, nb_dtype_name(g->dtype));
        if (!nb__backend_has_kernel(nb__device_of(g), "amp_unscale")) {
            const nb__backend *be = nb__backend_of(nb__device_of(g), who);
            return be ? nb__no_kernel(be, who, "amp_unscale") : nb_last_status();
        }
    }
    const double inv = 1.0 / s->scale;
    double found = 0;
    nb_status st = NB_OK;
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    /* The kernels raise a flag in device memory (one per device run of parameters), read
     * back once: on a GPU one synchronization per unscale, not one per parameter. */
    nb_tensor *flag = NULL;
    for (int i = 0; i <= opt->nparams && st == NB_OK; i++) {
        nb_tensor *t = i < opt->nparams ? opt->params[i].t : NULL, *g = t ? t->grad : NULL;
        if (flag && (!g || !nb_device_equal(nb__device_of(g), nb__device_of(flag)))) {
            double f = 0;
            if (nb_data_ptr(flag)) st = nb_read(flag, &f, 1, NB_F64);
            else nb_clear_error(); /* meta: no data, no kernel ran */
            if (f != 0) found = 1;
            flag = NULL;
        }
        if (!g || st != NB_OK) continue;
        if (!flag && !(flag = nb_zeros_on(nb__device_of(g), (int64_t[]){1}, 1, NB_F64))) {
            st = nb_last_status();
            break;
        }
        nb_tensor *c = nb_is_contiguous(g) ? g : nb_contiguous(g);
        if (!c) {
            st = nb_last_status();
            break;
        }
        bool half = c->dtype == NB_F16 || c->dtype == NB_BF16;
        nb_tensor *out = half ? buffer(s, i, c) : c;
        if (!out) {
            st = nb_last_status();
            break;
        }
        nb__amp_unscale_args a = {.dtype = c->dtype, .out_dtype = out->dtype, .n = nb_numel(c),
                                  .x = nb__ptr(c), .out = nb__ptr(out), .inv_scale = inv,
                                  .found_inf = (double *)nb__ptr(flag)};
        nb__bump_version(out);
        st = nb__run_amp_unscale(nb__device_of(c), who, &a);
        if (st != NB_OK) break;
        if (half) {
            /* The f32 buffer becomes the gradient until the step is over. */
            s->orig[i] = nb_tensor_retain(g);
            st = nb_set_grad(t, out);
        } else if (c != g) {
            st = nb_copy_(g, c);
        }
    }
    nb_scope_end();
    nb_set_grad_enabled(prev);
    if (st == NB_OK && s->reduce_flag) st = s->reduce_flag(&found, s->reduce_ctx);
    if (st != NB_OK) {
        restore(s);
        return st;
    }
    s->found_inf = found != 0;
    s->unscaled = true;
    return NB_OK;
}

nb_status nb_grad_scaler_unscale(nb_grad_scaler *s, nb_optim *opt) {
    const char *who = "grad_scaler_unscale";
    if (!s || !opt) return nb__error(NB_ENULL, "%s: %s is NULL", who, !s ? "scaler" : "opt");
    if (!nb__obj_ok(s, NB__OBJ_SCALER, who) || !nb__obj_ok(opt, NB__OBJ_OPTIM, who))
        return nb_last_status();
    if (!s->o.enabled) return NB_OK;
    if (s->unscaled)
        return nb__error(NB_ESTATE, "%s: already called since the last nb_grad_scaler_update "
                         "(once per step)", who);
    return unscale(s, opt, who);
}

nb_status nb_grad_scaler_step(nb_grad_scaler *s, nb_optim *opt) {
    const char *who = "grad_scaler_step";
    if (!s || !opt) return nb__error(NB_ENULL, "%s: %s is NULL", who, !s ? "scaler" : "opt");
    if (!nb__obj_ok(s, NB__OBJ_SCALER, who) || !nb__obj_ok(opt, NB__OBJ_OPTIM, who))
        return nb_last_status();
    if (!s->o.enabled) {
        s->last_skipped = false;
        return nb_step(opt);
    }
    if (s->stepped)
        return nb__error(NB_ESTATE, "%s: already called since the last nb_grad_scaler_update "
                         "(call update once per step)", who);
    if (s->unscaled && s->opt != opt)
        return nb__error(NB_ESTATE, "%s: the gradients unscaled in this step are another "
                         "optimizer's", who);
    nb_status st = s->unscaled ? NB_OK : unscale(s, opt, who);
    if (st != NB_OK) return st;
    s->last_skipped = s->found_inf;
    if (!s->found_inf) st = nb_step(opt);
    restore(s);
    if (st == NB_OK) s->stepped = true;
    return st;
}

nb_status nb_grad_scaler_update(nb_grad_scaler *s) {
    if (!s) return nb__error(NB_ENULL, "grad_scaler_update: scaler is NULL");
    if (!nb__obj_ok(s, NB__OBJ_SCALER, "grad_scaler_update")) return nb_last_status();
    if (!s->o.enabled) {
        s->steps++;
        return NB_OK;
    }
    if (!s->unscaled)
        return nb__error(NB_ESTATE, "grad_scaler_update: no nb_grad_scaler_step (or unscale) "
                         "since the last update, so there is no inf/NaN check to update from");
    restore(s); /* unscale without step: the gradients are the caller's again */
    s->steps++;
    bool skipped = s->unscaled && s->found_inf;
    s->unscaled = s->stepped = s->found_inf = false;
    s->opt = s->gopt = NULL;
    if (skipped) {
        s->skipped++;
        s->scale *= s->o.backoff_factor;
        s->tracker = 0;
        if (s->scale < s->o.min_scale)
            return nb__error(NB_ESTATE, "grad_scaler_update: the loss scale fell to %g (below "
                             "min_scale %g) at step %lld: the gradients are inf or NaN whatever "
                             "the scale (%lld of %lld steps skipped); the loss or the model "
                             "diverged", s->scale, s->o.min_scale, (long long)s->steps,
                             (long long)s->skipped, (long long)s->steps);
    } else if (++s->tracker >= s->o.growth_interval) {
        s->scale *= s->o.growth_factor;
        s->tracker = 0;
    }
    return NB_OK;
}

nb_status nb_grad_scaler_step_update(nb_grad_scaler *s, nb_optim *opt) {
    nb_status st = nb_grad_scaler_step(s, opt);
    return st == NB_OK ? nb_grad_scaler_update(s) : st;
}

#define LIVE(s, op) ((s) && nb__obj_ok((s), NB__OBJ_SCALER, (op))) /* NULL: quietly false */
double nb_grad_scaler_get_scale(const nb_grad_scaler *s) {
    return LIVE(s, "grad_scaler_get_scale") ? (s->o.enabled ? s->scale : 1.0) : NAN;
}
bool nb_grad_scaler_skipped(const nb_grad_scaler *s) {
    return LIVE(s, "grad_scaler_skipped") && s->last_skipped;
}
int64_t nb_grad_scaler_num_steps(const nb_grad_scaler *s) {
    return LIVE(s, "grad_scaler_num_steps") ? s->steps : 0;
}
int64_t nb_grad_scaler_num_skipped(const nb_grad_scaler *s) {
    return LIVE(s, "grad_scaler_num_skipped") ? s->skipped : 0;
}

/* ---- state ----------------------------------------------------------------------------------- */
static const char *const state_names[4] = {"scale", "growth_tracker", "steps", "skipped"};

const nb_params *nb_grad_scaler_state(nb_grad_scaler *s) {
    if (!s) {
        nb__error(NB_ENULL, "grad_scaler_state: scaler is NULL");
        return NULL;
    }
    if (!nb__obj_ok(s, NB__OBJ_SCALER, "grad_scaler_state")) {
        return NULL;
    }
    state_clear(s);
    const double v[4] = {s->scale, (double)s->tracker, (double)s->steps, (double)s->skipped};
    s->slist.tensors = malloc(sizeof(nb_tensor *) * 4);
    s->slist.names = malloc(sizeof(char *) * 4);
    bool ok = s->slist.tensors && s->slist.names;
    for (int i = 0; i < 4 && ok; i++) {
        nb_tensor *t = nb_full_on(NB_CPU, NULL, 0, i == 0 ? NB_F64 : NB_I64, v[i]);
        ok = t != NULL;
        if (ok) s->sown[i] = nb__scope_take(t);
        if (ok) s->slist.tensors[i] = s->sown[i], s->slist.names[i] = state_names[i];
    }
    if (!ok) {
        state_clear(s);
        nb__error(NB_ENOMEM, "grad_scaler_state: out of memory");
        return NULL;
    }
    s->slist.count = 4;
    return &s->slist;
}

nb_status nb_grad_scaler_load_state(nb_grad_scaler *s, const char *const *names,
                                    nb_tensor *const *ts, int n) {
    const char *who = "grad_scaler_load_state";
    if (!s) return nb__error(NB_ENULL, "%s: scaler is NULL", who);
    if (!nb__obj_ok(s, NB__OBJ_SCALER, who)) return nb_last_status();
    if (n < 0 || (n > 0 && (!names || !ts)))
        return nb__error(NB_ENULL, "%s: %d entries but %s is NULL", who, n,
                         !names ? "names" : "tensors");
    double v[4];
    int seen[4] = {-1, -1, -1, -1};
    for (int e = 0; e < n; e++) {
        if (!names[e] || !ts[e])
            return nb__error(NB_ENULL, "%s: entry %d has a NULL %s", who, e,
                             names[e] ? "tensor" : "name");
        int k = 0;
        while (k < 4 && strcmp(names[e], state_names[k]) != 0) k++;
        if (k == 4)
            return nb__error(NB_EINVAL, "%s: unexpected entry '%s' (the state is scale, "
                             "growth_tracker, steps, skipped)", who, names[e]);
        if (seen[k] >= 0)
            return nb__error(NB_EINVAL, "%s: '%s' appears twice", who, names[e]);
        if (nb_numel(ts[e]) != 1 || ts[e]->dtype == NB_BOOL)
            return nb__error(NB_ESHAPE, "%s: '%s' must be a single number, got a %s tensor of "
                             "shape %s", who, names[e], nb_dtype_name(ts[e]->dtype),
                             NB__SHAPE(ts[e]));
        nb_status st = nb_read(ts[e], &v[k], 1, NB_F64);
        if (st != NB_OK) return st;
        seen[k] = e;
    }
    for (int k = 0; k < 4; k++)
        if (seen[k] < 0) return nb__error(NB_EINVAL, "%s: missing '%s'", who, state_names[k]);
    if (!(v[0] > 0) || isinf(v[0]))
        return nb__error(NB_EINVAL, "%s: 'scale' must be finite and > 0, got %g", who, v[0]);
    for (int k = 1; k < 4; k++)
        if (!(v[k] >= 0) || v[k] != floor(v[k]))
            return nb__error(NB_EINVAL, "%s: '%s' must be a whole number >= 0, got %g", who,
                             state_names[k], v[k]);
    restore(s);
    s->scale = v[0];
    s->tracker = (int64_t)v[1];
    s->steps = (int64_t)v[2];
    s->skipped = (int64_t)v[3];
    s->unscaled = s->stepped = s->found_inf = s->last_skipped = false;
    s->opt = s->gopt = NULL;
    return NB_OK;
}
