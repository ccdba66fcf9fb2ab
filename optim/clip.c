/* optim/clip.c - gradient clipping by total norm (torch.nn.utils.clip_grad_norm_) and by
 * value (clip_grad_value_). The norm is accumulated in f64 over fixed chunks in parameter
 * order, so it does not depend on the thread count (docs/architecture.md rule 5).
 *
 * Each gradient is reduced and rescaled by the kernels of its own device (gradients may
 * live on different devices); the per-gradient partial norms come back to the host as
 * doubles through the kernels' result field. Meta gradients have no values: their part of
 * the norm is NaN, so the norm of a list with one is NaN, and nothing is rescaled.
 *
 * Parallel models: a parameter's placement (nabla/mesh.h, tensor/place.h) makes the norm the
 * whole model's. Each rank sums |g|^p over its parameters whose copy counts once
 * (nb_placement_counts: a part of a sharded tensor always, a replicated one on one rank of
 * each replicated dimension, a tied pipeline copy once), the placements' mesh adds the sums
 * of every rank, and every rank scales its own gradients by the same factor. A ZeRO
 * parameter's gradient is its reduced shard (the placement's shard_grad). */
#include <math.h>
#include <stdlib.h>

#include "nabla/autograd.h"
#include "optim/optim_impl.h"
#include "tensor/place.h"

/* The gradient of params->tensors[i] if it is one we can work on; NULL (no error) when the
 * parameter has no gradient; sets *st on a bad entry. */
static nb_tensor *grad_of(const nb_params *ps, int i, const char *who, nb_status *st) {
    nb_tensor *t = ps->tensors[i];
    if (!t) {
        *st = nb__error(NB_ENULL, "%s: parameter %d is NULL", who, i);
        return NULL;
    }
    nb_tensor *g = t->place && t->place->shard_grad ? t->place->shard_grad : t->grad;
    if (!g) return NULL;
    const char *name = ps->names && ps->names[i] ? ps->names[i] : "";
    if (!nb_dtype_is_float(g->dtype)) {
        *st = nb__error(NB_EDTYPE, "%s: the gradient of parameter %d %s is %s, not a float type",
                        who, i, name, nb_dtype_name(g->dtype));
        return NULL;
    }
    return g;
}

/* Run clip_scale (clamp false) or clip_clamp over g's elements in place, through a packed
 * copy when g is strided; a's s or lo/hi are set by the caller. */
static nb_status inplace(nb_tensor *g, nb__clip_inplace_args a, bool clamp, const char *who) {
    nb_tensor *c = nb_is_contiguous(g) ? g : nb_contiguous(g);
    if (!c) return nb_last_status();
    a.dtype = c->dtype;
    a.n = nb_numel(c);
    a.x = nb__ptr(c);
    nb_device dev = nb__device_of(c);
    nb__bump_version(c); /* an in-place write (the strided case's nb_copy_ bumps g's too) */
    nb_status st = clamp ? nb__run_clip_clamp(dev, who, &a) : nb__run_clip_scale(dev, who, &a);
    if (st == NB_OK && c != g) st = nb_copy_(g, c);
    return st;
}

/* nb_clip_grad_norm, with an optional step between the local accumulation and the root:
 * reduce(&total, max, ctx) combines the partial sum of |g|^p (or, max true, the maximum of
 * |g|) with those of other ranks (nb__clip_grad_norm_global, optim_impl.h). */
static double clip_norm(const nb_params *ps, double max_norm, double norm_type, const char *who,
                        nb_status (*reduce)(double *total, bool max, void *ctx), void *ctx) {
    if (!ps) return nb__error(NB_ENULL, "%s: params is NULL", who);
    if (ps->count > 0 && !ps->tensors)
        return nb__error(NB_ENULL, "%s: params has no tensor array", who);
    double p = norm_type;
    if (!(p > 0))
        return nb__error(NB_EINVAL, "%s: norm_type must be > 0 or INFINITY, got %g", who, p);
    if (!(max_norm >= 0))
        return nb__error(NB_EINVAL, "%s: max_norm must be >= 0, got %g", who, max_norm);
    nb_status st = NB_OK;
    for (int i = 0; i < ps->count && st == NB_OK; i++) grad_of(ps, i, who, &st);
    if (st != NB_OK) return st;
    /* Placements on a mesh: the sum over every rank of the mesh (one mesh for all). */
    for (int i = 0; i < ps->count && !reduce; i++) {
        const nb__place *pl = ps->tensors[i]->place;
        if (pl && pl->reduce) reduce = pl->reduce, ctx = pl->reduce_ctx;
    }
    for (int i = 0; i < ps->count && reduce; i++) {
        const nb__place *pl = ps->tensors[i]->place;
        if (pl && pl->reduce && pl->reduce_ctx != ctx)
            return nb__error(NB_EINVAL, "%s: the parameters are placed on two different device "
                             "meshes (%s among them); a norm is over one model", who,
                             ps->names && ps->names[i] ? ps->names[i] : "a parameter");
    }

    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    /* Each gradient's partial lands in a slot of a f64 buffer on its device (kernels write
     * device memory), and the slots are read back once per device run, then combined on
     * the host in parameter order: on a GPU one synchronization per call, not one per
     * parameter. */
    double total = 0;
    nb_tensor *parts = NULL;
    int nparts = 0;
    double *host = ps->count > 0 ? malloc(sizeof(double) * (size_t)ps->count) : NULL;
    if (ps->count > 0 && !host) st = nb__error(NB_ENOMEM, "%s: out of memory", who);
    for (int i = 0; i <= ps->count && st == NB_OK; i++) {
        nb_tensor *g = i < ps->count ? grad_of(ps, i, who, &st) : NULL;
        /* a copy another rank counts (replicated) adds nothing here; it is scaled below */
        if (g && ps->tensors[i]->place && !ps->tensors[i]->place->counts) continue;
        if (i < ps->count && !g) continue;
        bool flush = parts && (!g || !nb_device_equal(nb__device_of(g), nb__device_of(parts)));
        if (flush) { /* combine the slots filled so far, in order */
            /* meta tensors have no data: the partials stay NaN, as no kernel ran */
            bool data = nb_data_ptr(parts) != NULL;
            if (!data) nb_clear_error();
            if (data) st = nb_read(nb_narrow(parts, 0, 0, nparts), host, nparts, NB_F64);
            for (int k = 0; k < nparts && st == NB_OK; k++) {
                double part = data ? host[k] : NAN;
                if (isinf(p)) {
                    if (total == total && !(part <= total)) total = part; /* NaN sticks */
                } else {
                    total += part;
                }
            }
            parts = NULL;
            nparts = 0;
        }
        if (!g || st != NB_OK) continue;
        nb_tensor *c = nb_is_contiguous(g) ? g : nb_contiguous(g);
        if (!c || (!parts && !(parts = nb_empty_on(nb__device_of(c),
                                                   (int64_t[]){ps->count - i}, 1, NB_F64)))) {
            st = nb_last_status();
            break;
        }
        nb__clip_reduce_args a = {.dtype = c->dtype, .n = nb_numel(c), .x = nb__ptr(c), .p = p,
                                  .result = nb__ptr(parts) ? (double *)nb__ptr(parts) + nparts : NULL};
        nparts++;
        st = isinf(p) ? nb__run_clip_abs_max(nb__device_of(c), who, &a)
                      : nb__run_clip_abs_pow_sum(nb__device_of(c), who, &a);
    }
    free(host);
    if (st == NB_OK && reduce) st = reduce(&total, isinf(p), ctx);
    if (!isinf(p)) total = p == 2 ? sqrt(total) : p == 1 ? total : pow(total, 1.0 / p);
    double coef = max_norm / (total + 1e-6);
    if (st == NB_OK && coef < 1)
        for (int i = 0; i < ps->count && st == NB_OK; i++) {
            nb_tensor *g = grad_of(ps, i, who, &st);
            if (g) st = inplace(g, (nb__clip_inplace_args){.s = coef}, false, who);
        }
    nb_scope_end();
    nb_set_grad_enabled(prev);
    return st == NB_OK ? total : (double)st;
}

double nb_clip_grad_norm(const nb_params *ps, double max_norm, double norm_type) {
    return clip_norm(ps, max_norm, norm_type, "clip_grad_norm", NULL, NULL);
}

double nb__clip_grad_norm_global(const nb_params *ps, double max_norm, double norm_type,
                                 const char *who,
                                 nb_status (*reduce)(double *total, bool max, void *ctx),
                                 void *ctx) {
    return clip_norm(ps, max_norm, norm_type, who, reduce, ctx);
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
    for (int i = 0; i < ps->count && st == NB_OK; i++) {
        nb_tensor *g = grad_of(ps, i, who, &st);
        if (g) st = inplace(g, (nb__clip_inplace_args){.lo = -clip, .hi = clip}, true, who);
    }
    nb_scope_end();
    nb_set_grad_enabled(prev);
    return st;
}
