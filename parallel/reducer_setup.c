/* reducer_setup.c - the gradient reducer's construction and layout (parallel/reducer.h; its
 * steps are in parallel/reducer.c): the parameters' placements read, the flat gradient buffer
 * cut into buckets (and, under the scatter policies, this rank's chunks and the staging and
 * exchange buffers), the hooks attached, and the list of live reducers nb__reducer_of looks
 * in. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "autograd/autograd_impl.h"
#include "nabla/autograd.h"
#include "parallel/mesh_impl.h"
#include "parallel/reducer.h"
#include "parallel/reducer_impl.h"
#include "tensor/tensor_impl.h"
#include "tensor/trace.h"

/* ---- the live reducers (nb__reducer_of) --------------------------------------------------------- */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static nb__reducer *live;

static void live_add(nb__reducer *r) {
    pthread_mutex_lock(&live_mu);
    r->next_live = live;
    live = r;
    pthread_mutex_unlock(&live_mu);
}

static void live_remove(nb__reducer *r) {
    pthread_mutex_lock(&live_mu);
    for (nb__reducer **q = &live; *q; q = &(*q)->next_live)
        if (*q == r) {
            *q = r->next_live;
            break;
        }
    pthread_mutex_unlock(&live_mu);
}

nb__reducer *nb__reducer_of(const nb_module *m) {
    pthread_mutex_lock(&live_mu);
    nb__reducer *r = live;
    while (r && r->m != m) r = r->next_live;
    pthread_mutex_unlock(&live_mu);
    return r;
}

/* ---- the layout -------------------------------------------------------------------------------- */
static nb_tensor *take(nb_tensor *t, nb_status *s) {
    if (!t && *s == NB_OK) *s = nb_last_status();
    return t ? nb__scope_take(t) : NULL;
}

void nb__reducer_layout_free(nb__reducer *r) {
    for (int k = 0; k < r->nbk; k++) { /* the views must outlive in-flight collectives */
        rbucket *bk = &r->b[k];
        if (bk->work) nb_work_wait(bk->work);
        nb_tensor_free(bk->gin);
        nb_tensor_free(bk->gout);
        nb_tensor_free(bk->cin);
        nb_tensor_free(bk->cout);
        nb_tensor_free(bk->cmine);
    }
    free(r->b);
    r->b = NULL;
    r->nbk = r->ndeferred = 0;
    r->max_bucket = r->nshard = 0;
    for (int i = 0; i < 2; i++) {
        nb_tensor_free(r->staging[i]);
        nb_tensor_free(r->cslot_in[i]);
        nb_tensor_free(r->cslot_out[i]);
        r->staging[i] = r->cslot_in[i] = r->cslot_out[i] = NULL;
        r->staged_by[i] = r->cslot_by[i] = -1;
    }
    nb_tensor_free(r->shard_g);
    r->shard_g = NULL;
}

/* Cut the flat buffer into buckets from its end: walk the parameters in reverse
 * registration order and close a bucket once it holds >= cap elements (with owners: where
 * the owner changes); a deferred parameter is a bucket of its own. A parameter is never
 * split; bucket ranges tile [0, total) exactly. Then each bucket's chunk and views. */
nb_status nb__reducer_layout_build(nb__reducer *r) {
    r->b = calloc((size_t)(r->np > 0 ? r->np : 1), sizeof *r->b); /* <= one per parameter */
    if (!r->b) return nb__error(NB_ENOMEM, "%s: out of memory", r->who);
    int k = -1;
    int64_t end = r->total; /* lower boundary of what is assigned so far */
    for (int i = r->np - 1; i >= 0; i--) {
        rparam *p = &r->p[i];
        bool cut = k < 0;
        if (!cut && r->cfg.owners) cut = r->cfg.owners[i] != r->cfg.owners[i + 1];
        else if (!cut) cut = r->b[k].end - end >= r->cap;
        if (!cut) cut = p->deferred || r->p[i + 1].deferred;
        if (cut) { /* close bucket k, open k + 1 */
            if (k >= 0) r->b[k].begin = end;
            k++;
            r->b[k].end = end;
        }
        end = p->off;
        p->bucket = k;
        if (p->expected) r->b[k].expected++;
        if (p->deferred) r->b[k].deferred = true;
    }
    if (k < 0) return nb__error(NB_EINVAL, "%s: the model has no parameters", r->who);
    r->b[k].begin = 0; /* the last bucket also covers any leading padding */
    r->nbk = k + 1;
    const bool scatter = r->cfg.policy != NB__RED_ALLREDUCE;
    int64_t soff = 0;
    for (k = 0; k < r->nbk; k++) {
        rbucket *bk = &r->b[k];
        int64_t len = bk->end - bk->begin, b = 0, e = len;
        if (len > r->max_bucket) r->max_bucket = len;
        if (scatter) nb_comm_chunk(len, r->size, r->rank, &b, &e);
        bk->cb = bk->begin + b, bk->ce = bk->begin + e;
        bk->soff = soff;
        soff += e - b;
        if (bk->deferred) r->ndeferred++;
    }
    r->nshard = scatter ? soff : 0;
    nb_status s = NB_OK;
    if (r->cfg.policy == NB__RED_STAGED) {
        r->shard_g = take(nb_zeros_on(r->dev, &r->nshard, 1, r->dtype), &s);
        for (int i = 0; i < 2 && s == NB_OK; i++)
            r->staging[i] = take(nb_zeros_on(r->dev, &r->max_bucket, 1, r->dtype), &s);
    }
    if (r->compress && scatter) { /* two exchange slots of the largest padded bucket */
        int64_t slot = r->size * ((r->max_bucket + r->size - 1) / r->size);
        for (int i = 0; i < 2 && s == NB_OK; i++) {
            r->cslot_in[i] = take(nb_zeros_on(r->dev, &slot, 1, r->cfg.reduce_dtype), &s);
            if (s == NB_OK) r->cslot_out[i] = take(nb_zeros_on(r->dev, &slot, 1, r->cfg.reduce_dtype), &s);
        }
    }
    for (k = 0; k < r->nbk && s == NB_OK; k++) {
        rbucket *bk = &r->b[k];
        int64_t len = bk->end - bk->begin, kk = (len + r->size - 1) / r->size, all = kk * r->size;
        if (r->flat_g) bk->gin = take(nb_narrow(r->flat_g, 0, bk->begin, len), &s);
        if (s == NB_OK)
            bk->gout = r->cfg.policy == NB__RED_ALLREDUCE ? take(nb_narrow(bk->gin, 0, 0, len), &s)
                       : r->cfg.policy == NB__RED_SCATTER
                           ? take(nb_narrow(r->flat_g, 0, bk->cb, bk->ce - bk->cb), &s)
                           : take(nb_narrow(r->shard_g, 0, bk->soff, bk->ce - bk->cb), &s);
        if (s != NB_OK || !r->compress) continue;
        if (scatter) {
            bk->cin = take(nb_narrow(r->cslot_in[k % 2], 0, 0, all), &s);
            if (s == NB_OK) bk->cout = take(nb_narrow(r->cslot_out[k % 2], 0, 0, all), &s);
        } else { /* one exchange buffer per bucket, zero padded, and its reduced chunk */
            bk->cin = take(nb_zeros_on(r->dev, &all, 1, r->cfg.reduce_dtype), &s);
            if (s == NB_OK) bk->cout = take(nb_zeros_on(r->dev, &all, 1, r->cfg.reduce_dtype), &s);
            if (s == NB_OK) bk->cmine = take(nb_zeros_on(r->dev, &kk, 1, r->cfg.reduce_dtype), &s);
        }
    }
    return s;
}

/* ---- construction ------------------------------------------------------------------------------- */
void nb__reducer_free(nb__reducer *r) {
    if (!r) return;
    live_remove(r);
    nb__reducer_layout_free(r);
    for (int i = 0; r->p && i < r->np; i++) {
        rparam *p = &r->p[i];
        if (p->handle >= 0) nb_remove_grad_hook(p->t, p->handle);
        if (p->guarded) {
            nb__set_grad_guard(p->t, NULL, p);
            if (p->partial_place) nb__partial_guard_set(p->t); /* unwrapped: partial again */
        }
        nb_tensor_free(p->gview);
    }
    for (int j = 0; j < r->nsums; j++)
        if (r->sums[j].owned) nb_comm_free(r->sums[j].c);
    free(r->p);
    free(r);
}

/* The index of the sum group over mesh dimension d (copies 0: all of it; else the ranks
 * holding the same piece as this one, copies of them), made when first met: a split of d's
 * group (collective over it: every rank of the group wraps the same model, so meets the same
 * groups in the same order). Groups of one rank are -1: nothing to sum. -2 on failure. */
static int sum_group(nb__reducer *r, int d, int copies, const char *op) {
    for (int j = 0; j < r->nsums; j++)
        if (r->sums[j].dim == d && r->sums[j].copies == copies) return j;
    nb_comm *g = nb_mesh_group(r->mesh, nb__mesh_dim_name(d));
    if (!g) return -2;
    if (nb_comm_size(g) == 1 || copies == 1) return -1;
    if (r->nsums == NB__RED_SUMS) {
        nb__error(NB_EUNSUPPORTED, "%s: the parameters' gradients are partial sums over more "
                  "than %d groups of ranks", op, NB__RED_SUMS);
        return -2;
    }
    bool owned = copies > 1;
    if (owned) { /* ranks c*k .. c*k + c - 1 of the dimension: color k */
        const int at = nb_comm_rank(g);
        if (!(g = nb_comm_split(g, at / copies, at % copies))) return -2;
    }
    r->sums[r->nsums].dim = d, r->sums[r->nsums].copies = copies;
    r->sums[r->nsums].c = g, r->sums[r->nsums].owned = owned;
    return r->nsums++;
}

/* The mesh the parameters are placed on (NULL: none), checked: one mesh, whose "dp" group is
 * c; each parameter's partial sum groups (a partial dimension, the copies of a shard) and
 * whether it is a tied pipeline copy. */
static nb_status read_placements(nb__reducer *r, const nb_params *ps, const char *op) {
    for (int i = 0; i < r->np; i++) {
        const nb__place *pl = ps->tensors[i]->place;
        if (!pl || pl->activation || !pl->p.mesh) continue;
        if (r->mesh && pl->p.mesh != r->mesh)
            return nb__error(NB_EINVAL, "%s: the parameters are placed on two different device "
                             "meshes (%s among them); one model lives on one mesh", op,
                             ps->names[i]);
        r->mesh = pl->p.mesh;
    }
    if (!r->mesh) return NB_OK;
    nb_comm *dp = nb_mesh_group(r->mesh, "dp");
    if (dp != r->c && !(nb_comm_size(dp) == 1 && r->size == 1))
        return nb__error(NB_EINVAL, "%s: the parameters are placed on the mesh \"%s\", whose "
                         "data-parallel group has %d ranks, but the communicator given is not "
                         "that group (%d ranks); pass nb_mesh_group(mesh, \"dp\")", op,
                         nb_mesh_describe(r->mesh), nb_comm_size(dp), r->size);
    for (int i = 0; i < r->np; i++) {
        const nb__place *pl = ps->tensors[i]->place;
        if (!pl || pl->activation || !pl->p.mesh) continue;
        for (int k = 0; k < pl->p.n; k++) {
            const nb_place *e = &pl->p.places[k];
            int d = nb__mesh_dim_index(e->mesh_dim, strnlen(e->mesh_dim, sizeof e->mesh_dim));
            int j = -1;
            if (d >= 0 && e->kind == NB_PLACE_PARTIAL) j = sum_group(r, d, 0, op);
            else if (d >= 0 && nb__place_copies(e) > 1) j = sum_group(r, d, e->copies, op);
            if (j == -2) return nb_last_status();
            if (j >= 0) r->p[i].partial |= 1u << j;
            if (e->kind == NB_PLACE_PARTIAL || nb__place_copies(e) > 1)
                r->p[i].partial_place = true;
            if (e->kind == NB_PLACE_REPLICATE && d == NB__DIM_PP && e->length > 1)
                r->p[i].deferred = true;
        }
    }
    return NB_OK;
}

nb__reducer *nb__reducer_new(nb_module *model, nb_comm *c, const nb__reducer_cfg *cfg) {
    const char *who = cfg->who ? cfg->who : "ddp";
    char op[16];
    snprintf(op, sizeof op, "%s_new", who);
    if (nb_module_flatten_parameters(model, 0) != NB_OK) return NULL;
    const nb_params *ps = nb_parameters(model);
    if (!ps) return NULL;
    for (int i = 0; i < ps->count; i++)
        for (int j = 0; j < i; j++)
            if (ps->tensors[i] == ps->tensors[j])
                return nb__error(NB_EINVAL, "%s: %s and %s are the same tensor; register a "
                                 "shared parameter once", op, ps->names[j], ps->names[i]), NULL;
    nb__reducer *r = calloc(1, sizeof *r);
    if (!r) return nb__error(NB_ENOMEM, "%s: out of memory", op), NULL;
    r->cfg = *cfg;
    snprintf(r->who, sizeof r->who, "%s", who);
    r->m = model, r->c = c, r->size = nb_comm_size(c), r->rank = nb_comm_rank(c);
    r->sync_enabled = true;
    r->staged_by[0] = r->staged_by[1] = r->cslot_by[0] = r->cslot_by[1] = -1;
    nb_tensor *flat_p = nb_module_flat_params(model);
    r->flat_g = cfg->policy == NB__RED_STAGED ? NULL : nb_module_flat_grads(model);
    r->dtype = flat_p->dtype;
    r->dev = nb__device_of(flat_p);
    r->total = nb_numel(flat_p);
    r->cap = (int64_t)(cfg->bucket_mb * 1048576.0 / (double)nb_dtype_size(r->dtype));
    if (r->cap < 1) r->cap = 1;
    /* Compression only where there is something to compress: several ranks, and a gradient
     * dtype wider than the wire's (f32 or f64 gradients), or f16/bf16 gradients that would
     * otherwise travel as f32 (reduce_dtype their own dtype). */
    r->compress = r->size > 1 && cfg->reduce_dtype != NB_F32 && nb_dtype_is_float(r->dtype);
    nb_status s = NB_OK;
    if (cfg->policy != NB__RED_STAGED && !r->flat_g)
        s = nb__error(NB_EINTERNAL, "%s: the model has no flat gradient buffer", op);
    r->p = calloc((size_t)(ps->count > 0 ? ps->count : 1), sizeof *r->p);
    if (!r->p && s == NB_OK) s = nb__error(NB_ENOMEM, "%s: out of memory", op);
    if (r->p) r->np = ps->count;
    for (int i = 0; i < r->np && s == NB_OK; i++) {
        nb_tensor *t = ps->tensors[i];
        rparam *p = &r->p[i];
        *p = (rparam){.r = r, .index = i, .t = t, .handle = -1, .off = t->offset - flat_p->offset,
                      .n = nb_numel(t), .expected = nb_requires_grad(t)};
        if (!r->flat_g) continue;
        int64_t strides[NB_MAX_DIMS];
        nb__contiguous_strides(t->shape, t->ndim, strides);
        p->gview = take(nb__view_of(r->flat_g, t->shape, strides, t->ndim,
                                    r->flat_g->offset + p->off), &s);
    }
    if (s == NB_OK) s = read_placements(r, ps, op);
    if (s == NB_OK) s = nb__reducer_layout_build(r);
    for (int i = 0; i < r->np && s == NB_OK; i++) {
        rparam *p = &r->p[i];
        if (!p->expected) continue;
        if ((s = nb__reducer_reattach(p)) != NB_OK) break;
        int h = nb_register_grad_hook(p->t, nb__reducer_grad_hook, p);
        if (h < 0) {
            s = (nb_status)h;
            break;
        }
        p->handle = h;
        if (p->partial_place) /* ours sums */
            nb__set_grad_guard(p->t, NULL, &nb__partial_guard_ctx);
        s = nb__set_grad_guard(p->t, nb__reducer_grad_guard, p);
        if (s == NB_ESTATE)
            nb__error(s, "%s: parameter %s is already wrapped by another nb_%s or nb_%s; free "
                      "that one first", op, ps->names[i], who, is_ddp(r) ? "zero" : "ddp");
        p->guarded = s == NB_OK;
    }
    if (s != NB_OK) {
        nb__reducer_free(r);
        return NULL;
    }
    live_add(r);
    return r;
}

nb_status nb__reducer_check_same(nb__reducer *r, const int64_t *extra, const char *const *what,
                                 int n) {
    if (r->size == 1) return NB_OK;
    enum { MAXV = 8 };
    int64_t v[MAXV] = {r->np, r->total};
    for (int i = 0; i < n && i + 2 < MAXV; i++) v[2 + i] = extra[i];
    const int nv = 2 + (n < MAXV - 2 ? n : MAXV - 2);
    nb_tensor *lo = nb__scope_take(nb_from_buffer(v, (int64_t[]){nv}, 1, NB_I64));
    nb_tensor *hi = nb__scope_take(nb_from_buffer(v, (int64_t[]){nv}, 1, NB_I64));
    nb_status s = lo && hi ? NB_OK : nb_last_status();
    if (s == NB_OK) s = nb_allreduce(r->c, lo, NB_REDUCE_MIN);
    if (s == NB_OK) s = nb_allreduce(r->c, hi, NB_REDUCE_MAX);
    if (s == NB_OK) {
        const int64_t *l = nb_data(lo), *h = nb_data(hi);
        if (memcmp(l, h, sizeof(int64_t) * (size_t)nv) != 0) {
            char mine[256], range[256];
            int a = snprintf(mine, sizeof mine, "%lld parameters, %lld elements", (long long)v[0],
                             (long long)v[1]);
            int b = snprintf(range, sizeof range, "%lld..%lld parameters, %lld..%lld elements",
                             (long long)l[0], (long long)h[0], (long long)l[1], (long long)h[1]);
            for (int i = 2; i < nv; i++) {
                if (a > 0 && (size_t)a < sizeof mine)
                    a += snprintf(mine + a, sizeof mine - (size_t)a, ", %s %lld", what[i - 2],
                                  (long long)v[i]);
                if (b > 0 && (size_t)b < sizeof range)
                    b += snprintf(range + b, sizeof range - (size_t)b, ", %s %lld..%lld",
                                  what[i - 2], (long long)l[i], (long long)h[i]);
            }
            s = nb__error(NB_EINVAL, "%s: the ranks wrap different models%s (this rank: %s; "
                          "across ranks: %s)", r->who, n ? " or settings" : "", mine, range);
        }
    }
    nb_tensor_free(lo);
    nb_tensor_free(hi);
    return s;
}
