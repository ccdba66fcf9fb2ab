/* optim/clip.c - gradient clipping by total norm (torch.nn.utils.clip_grad_norm_) and by
 * value (clip_grad_value_). The norm is accumulated in f64 over fixed chunks in parameter
 * order, so it does not depend on the thread count (DESIGN.md rule 5). */
#include <math.h>

#include "nabla/autograd.h"
#include "optim/optim_impl.h"
#include "cpu/optim_kernels.h"

/* The gradient of params->tensors[i] if it is one we can work on; NULL (no error) when the
 * parameter has no gradient; sets *st on a bad entry. */
static nb_tensor *grad_of(const nb_params *ps, int i, const char *who, nb_status *st) {
    nb_tensor *t = ps->tensors[i];
    if (!t) {
        *st = nb__error(NB_ENULL, "%s: parameter %d is NULL", who, i);
        return NULL;
    }
    nb_tensor *g = t->grad;
    if (!g) return NULL;
    const char *name = ps->names && ps->names[i] ? ps->names[i] : "";
    if (!nb_dtype_is_float(g->dtype)) {
        *st = nb__error(NB_EDTYPE, "%s: the gradient of parameter %d %s is %s, not a float type",
                        who, i, name, nb_dtype_name(g->dtype));
        return NULL;
    }
    if (g->storage->device.type != NB_DEVICE_CPU) {
        *st = nb__error(NB_EDEVICE, "%s: CUDA tensors are not supported by this op yet", who);
        return NULL;
    }
    return g;
}

/* Apply fn to g's elements in place, through a packed copy when g is strided. */
static void inplace(nb_tensor *g, void (*fn)(nb_tensor *c, void *ctx), void *ctx) {
    if (nb_is_contiguous(g)) {
        fn(g, ctx);
        return;
    }
    nb_tensor *c = nb_contiguous(g);
    if (!c) return;
    fn(c, ctx);
    nb_copy_(g, c);
}

static void scale_fn(nb_tensor *c, void *ctx) {
    nb__cpu_scale_inplace(c->dtype, nb__ptr(c), nb_numel(c), *(double *)ctx);
}

static void clamp_fn(nb_tensor *c, void *ctx) {
    double v = *(double *)ctx;
    nb__cpu_clamp_inplace(c->dtype, nb__ptr(c), nb_numel(c), -v, v);
}

double nb_clip_grad_norm(const nb_params *ps, double max_norm, double norm_type) {
    const char *who = "clip_grad_norm";
    if (!ps) return nb__error(NB_ENULL, "%s: params is NULL", who);
    if (ps->count > 0 && !ps->tensors)
        return nb__error(NB_ENULL, "%s: params has no tensor array", who);
    double p = norm_type == 0 ? 2.0 : norm_type;
    if (!(p > 0))
        return nb__error(NB_EINVAL, "%s: norm_type must be > 0 or INFINITY, got %g", who, p);
    if (!(max_norm >= 0))
        return nb__error(NB_EINVAL, "%s: max_norm must be >= 0, got %g", who, max_norm);
    nb_status st = NB_OK;
    for (int i = 0; i < ps->count && st == NB_OK; i++) grad_of(ps, i, who, &st);
    if (st != NB_OK) return st;

    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    double total = 0;
    for (int i = 0; i < ps->count; i++) {
        nb_tensor *g = grad_of(ps, i, who, &st);
        if (!g) continue;
        nb_tensor *c = nb_is_contiguous(g) ? g : nb_contiguous(g);
        if (!c) {
            st = nb_last_status();
            break;
        }
        if (isinf(p)) {
            double m = nb__cpu_abs_max(c->dtype, nb__ptr(c), nb_numel(c));
            if (!(m <= total)) total = m; /* NaN sticks */
        } else {
            total += nb__cpu_abs_pow_sum(c->dtype, nb__ptr(c), nb_numel(c), p);
        }
    }
    if (!isinf(p)) total = p == 2 ? sqrt(total) : p == 1 ? total : pow(total, 1.0 / p);
    double coef = max_norm / (total + 1e-6);
    if (st == NB_OK && coef < 1)
        for (int i = 0; i < ps->count; i++) {
            nb_tensor *g = grad_of(ps, i, who, &st);
            if (g) inplace(g, scale_fn, &coef);
        }
    nb_scope_end();
    nb_set_grad_enabled(prev);
    return st == NB_OK ? total : (double)st;
}

nb_status nb_clip_grad_value(const nb_params *ps, double clip) {
    const char *who = "clip_grad_value";
    if (!ps) return nb__error(NB_ENULL, "%s: params is NULL", who);
    if (ps->count > 0 && !ps->tensors)
        return nb__error(NB_ENULL, "%s: params has no tensor array", who);
    if (!(clip >= 0))
        return nb__error(NB_EINVAL, "%s: clip must be >= 0, got %g", who, clip);
    nb_status st = NB_OK;
    for (int i = 0; i < ps->count && st == NB_OK; i++) grad_of(ps, i, who, &st);
    if (st != NB_OK) return st;
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    for (int i = 0; i < ps->count; i++) {
        nb_tensor *g = grad_of(ps, i, who, &st);
        if (g) inplace(g, clamp_fn, &clip);
    }
    nb_scope_end();
    nb_set_grad_enabled(prev);
    return st;
}
