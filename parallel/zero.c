/* zero.c - ZeRO stages 1 to 3 (nb_zero, see nabla/parallel.h); stage 0 is an nb_ddp.
 *
 * Gradients. The one gradient reducer (parallel/reducer.c) with a scatter policy: the
 * module's parameters are flattened (docs/architecture.md rule 10), the flat buffer is cut
 * into buckets (contiguous ranges from the end, whole parameters; at stage 3 one bucket per
 * module that registered parameters) and each bucket [begin, end) is split over the ranks by
 * nb_comm_chunk (balanced contiguous ranges, the last ones shorter): rank r's shard is its
 * chunk of every bucket. That is the layout nb_reduce_scatter and nb_allgather use, so a
 * bucket's gradient is reduce-scattered and its parameters all-gathered with one collective
 * each, without repacking (FSDP's per-unit sharding). Stage 1 reduce-scatters from the flat
 * gradient buffer into this rank's chunk of it; stages 2 and 3 keep no flat gradient buffer
 * (the reducer stages each bucket's gradients and reduces them into its shard gradient
 * buffer).
 *
 * Optimizer. The user's optimizer is a template: a second optimizer of the same kind (same
 * flags and groups) is built over the "pieces" of the shard: the intersection of the shard
 * with each parameter, a 1-D view of the flat parameter buffer (stage 3: of the shard's own
 * buffer), named after the parameter and placed in its group, so per-parameter group
 * settings (no weight decay on biases) stay exact although chunks cross parameter
 * boundaries. Every element-wise optimizer gives the same result on pieces as on whole
 * parameters. Each piece's gradient is a view of the reduced shard gradient. nb_step(user
 * optimizer) is redirected here (step_hook): copy the user's current group hyperparameters
 * (schedules set those), step the pieces, all-gather every bucket's parameters.
 *
 * Placements (nabla/mesh.h). Each parameter records its flat shard over "dp" (shard_grad:
 * its piece of the reduced gradient; stage 3 shard_value: its piece of the values), and each
 * piece is placed as the parameter plus a flat shard over "dp", so nb_clip_grad_norm over the
 * model's (or the optimizer's) parameters gives the global norm and clips the shard. A model
 * without a mesh gets a 1-D one over the communicator ("dp"); a model placed on a mesh must
 * be wrapped over that mesh's "dp" group.
 *
 * Stage 3's parameters (gathered before a module's forward and backward, released after) are
 * ZeRO's own; so are offload_optimizer's host copies. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd_impl.h"
#include "nabla/autograd.h"
#include "nabla/io.h"
#include "nabla/parallel.h"
#include "optim/optim_impl.h"
#include "parallel/mesh_impl.h"
#include "parallel/parallel_impl.h"
#include "parallel/pipeline_impl.h"
#include "parallel/zero_impl.h"
#include "tensor/backend.h"
#include "tensor/tensor_impl.h"

/* nn/module.c: forget the module's flat gradient buffer (stage 2 has none). */
nb_status nb__module_drop_flat_grads(nb_module *m);
/* nn/module.c: forget the module's flat parameter buffer (stage 3 has none). */
nb_status nb__module_drop_flat_params(nb_module *m);

static const char *param_name(const nb_zero *z, int i) {
    const nb_params *ps = nb_parameters(z->m);
    return ps && i < ps->count ? ps->names[i] : "?";
}

static nb_status units_backward_end(void *ctx, nb_status backward_status);

/* ---- offload_optimizer: the shard's host copies ------------------------------------------------
 * host_p and host_g hold the shard in its soff layout (bucket k's chunk at soff); the inner
 * optimizer's pieces and their gradients are views of them. The device side of bucket k is
 * pchunk (parameters) and the reducer's chunk gradient, both contiguous. The copies go through
 * the device backend's to_host / from_host (synchronous; pinned buffers and overlapping
 * the CPU update of one bucket with the next bucket's transfer wait for the CUDA backend). */
static nb_status xfer(nb_zero *z, nb_tensor *dev_t, nb_tensor *host, int64_t hoff, bool to_host) {
    size_t nbytes = (size_t)nb_numel(dev_t) * nb_dtype_size(dev_t->dtype);
    if (!nbytes) return NB_OK;
    const nb__backend *be = nb__backend_of(z->dev, "zero");
    if (!be) return nb_last_status();
    char *h = nb__ptr(host) + (size_t)hoff * nb_dtype_size(host->dtype);
    nb_status s = to_host ? be->to_host(z->dev, h, nb__ptr(dev_t), nbytes)
                          : be->from_host(z->dev, nb__ptr(dev_t), h, nbytes);
    if (s != NB_OK)
        return nb__error(s, "zero: offload_optimizer: copying %zu bytes %s the host failed",
                         nbytes, to_host ? "to" : "from");
    return NB_OK;
}

/* The averaged gradient shard, device -> host (once it is reduced: the reducer's
 * after_reduce). */
static nb_status offload_grads(void *ctx) {
    nb_zero *z = ctx;
    nb_status s = NB_OK;
    for (int k = 0; k < z->nbk && s == NB_OK; k++)
        s = xfer(z, nb__reducer_bucket_grad(z->r, k), z->host_g, z->b[k].soff, true);
    nb__bump_version(z->host_g);
    return s;
}

/* The parameter shard, device -> host (to_host) before the update, host -> device after. */
static nb_status offload_params(nb_zero *z, bool to_host) {
    nb_status s = NB_OK;
    for (int k = 0; k < z->nbk && s == NB_OK; k++)
        s = xfer(z, z->b[k].pchunk, z->host_p, z->b[k].soff, to_host);
    nb__bump_version(to_host ? z->host_p : z->b[0].pchunk);
    return s;
}

/* ---- stage 3: gathering and releasing units ---------------------------------------------------
 * A unit (bucket) is the parameters one module registered; they are views of the unit's
 * `full` tensor, whose storage has memory only while the unit is gathered. Gathering
 * all-gathers the ranks' chunks into it; the storage's version is restored afterwards (the
 * values are those the forward saved: only nb_step changes parameters, and it bumps it). */
static const char *unit_name(const nb_zero *z, int k) {
    for (int i = 0; i < z->np; i++)
        if (z->p[i].bucket == k) return param_name(z, i);
    return "?";
}

static void unit_release(nb_zero *z, int k) {
    zbucket *bk = &z->b[k];
    if (bk->gwork) nb_work_wait(bk->gwork); /* a prefetch nobody used: its outcome is moot */
    bk->gwork = NULL;
    nb__storage *st = bk->full->storage;
    if (st->data) {
        const nb__backend *be = nb__backend_of(st->device, "zero");
        if (be) be->free(st->device, st->data);
        st->data = NULL;
    }
    bk->gathered = false;
}

static void release_all(nb_zero *z) {
    for (int k = 0; k < z->nbk; k++) unit_release(z, k);
}

static void keep_version(zbucket *bk) {
    atomic_store_explicit(&bk->full->storage->version, bk->version, memory_order_relaxed);
}

/* Start gathering unit k (nothing if it is gathered or on its way). */
static nb_status gather_start(nb_zero *z, int k) {
    zbucket *bk = &z->b[k];
    if (bk->gathered || bk->gwork) return NB_OK;
    nb__storage *st = bk->full->storage;
    if (!st->data) {
        const nb__backend *be = nb__backend_of(st->device, "zero");
        st->data = be ? be->alloc(st->device, st->nbytes) : NULL;
        if (!st->data)
            return nb__error(NB_ENOMEM, "zero: out of memory gathering the parameters of the "
                             "unit of %s (%zu bytes)", unit_name(z, k), st->nbytes);
    }
    bk->version = nb__version_of(bk->full);
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_status s = NB_OK;
    if (z->size == 1) {
        s = nb_copy_(bk->full, bk->pchunk);
        keep_version(bk);
        bk->gathered = s == NB_OK;
    } else if (!(bk->gwork = nb_allgather_async(z->c, bk->full, bk->pchunk))) {
        s = nb_last_status();
    }
    nb_scope_end();
    nb_set_grad_enabled(prev);
    return s;
}

/* Gather unit k and wait for it. */
static nb_status gather(nb_zero *z, int k) {
    zbucket *bk = &z->b[k];
    nb_status s = gather_start(z, k);
    if (s == NB_OK && bk->gwork) {
        s = nb_work_wait(bk->gwork);
        bk->gwork = NULL;
        keep_version(bk);
        if (s == NB_OK) bk->gathered = true;
        else nb__error(s, "zero: gathering the parameters of the unit of %s failed: %s",
                       unit_name(z, k), nb_last_error());
    }
    if (s != NB_OK) unit_release(z, k);
    return s;
}

/* The units no module forward gathers (parameters the root's forward uses itself). */
static nb_status gather_unseen(nb_zero *z) {
    nb_status s = NB_OK;
    for (int k = z->nbk - 1; k >= 0 && s == NB_OK; k--)
        if (!z->b[k].seen) s = gather_start(z, k);
    for (int k = z->nbk - 1; k >= 0 && s == NB_OK; k--)
        if (!z->b[k].seen) s = gather(z, k);
    return s;
}

/* Backward: before the rules of a unit's module (or the root) run. The next unit in
 * backward order (the previous one in forward order, k + 1) is prefetched. */
static nb_status unit_pre_backward(void *ctx) {
    zbucket *bk = ctx;
    nb_zero *z = bk->z;
    nb_status s = nb__queue_backward_end(units_backward_end, z);
    z->in_backward = true;
    if (s == NB_OK) s = gather(z, bk->index);
    if (s == NB_OK && bk->index + 1 < z->nbk && z->b[bk->index + 1].seen)
        s = gather_start(z, bk->index + 1);
    return s;
}

static nb_status root_pre_backward(void *ctx) {
    nb_zero *z = ctx;
    nb_status s = nb__queue_backward_end(units_backward_end, z);
    z->in_backward = true;
    return s == NB_OK ? gather_unseen(z) : s;
}

/* Forward: gather the unit, prefetch the next one in forward order (k - 1), release after. */
static nb_status unit_pre(nb_module *m, nb_tensor *x, void *ctx) {
    zbucket *bk = ctx;
    nb_zero *z = bk->z;
    (void)m, (void)x;
    bk->seen = true;
    nb_status s = gather(z, bk->index);
    if (s == NB_OK && bk->index > 0 && z->b[bk->index - 1].seen) s = gather_start(z, bk->index - 1);
    return s;
}

static nb_status unit_post(nb_module *m, nb_tensor *x, nb_tensor *out, void *ctx) {
    zbucket *bk = ctx;
    (void)m, (void)x;
    if (!bk->z->in_backward) unit_release(bk->z, bk->index);
    return out->grad_fn ? nb__register_pre_backward_hook(out, unit_pre_backward, bk) : NB_OK;
}

static nb_status root_pre(nb_module *m, nb_tensor *x, void *ctx) {
    (void)m, (void)x;
    return gather_unseen(ctx);
}

static nb_status root_post(nb_module *m, nb_tensor *x, nb_tensor *out, void *ctx) {
    nb_zero *z = ctx;
    (void)m, (void)x;
    if (!z->in_backward) release_all(z);
    return out->grad_fn ? nb__register_pre_backward_hook(out, root_pre_backward, z) : NB_OK;
}

/* The reducer's hook on every gradient (stage 3): a unit whose gradients are all complete
 * has run its rules; release it. */
static void unit_grad_done(void *ctx, int i) {
    nb_zero *z = ctx;
    if (z->stage != 3) return;
    nb__queue_backward_end(units_backward_end, z); /* failing, the reducer reports it */
    zbucket *bk = &z->b[z->p[i].bucket];
    if (++bk->done == bk->expected) unit_release(z, bk->index);
}

/* Stage 3, when a backward that gathered units ends: release them all. */
static nb_status units_backward_end(void *ctx, nb_status backward_status) {
    nb_zero *z = ctx;
    (void)backward_status;
    release_all(z);
    z->in_backward = false;
    for (int k = 0; k < z->nbk; k++) z->b[k].done = 0;
    return NB_OK;
}

/* Wait for the parameter all-gathers; returns the first failure. */
static nb_status wait_gathers(nb_zero *z) {
    nb_status first = NB_OK;
    char msg[512] = "";
    for (int k = 0; k < z->nbk; k++) {
        if (!z->b[k].work) continue;
        nb_status s = nb_work_wait(z->b[k].work);
        z->b[k].work = NULL;
        if (s != NB_OK && first == NB_OK) {
            first = s;
            snprintf(msg, sizeof msg, "%s", nb_last_error());
        }
    }
    if (first != NB_OK) nb__error(first, "zero: parameter all-gather failed: %s", msg);
    return first;
}

/* nb_step(user optimizer): step the shard, then all-gather the parameters. */
static nb_status zero_step(void *ctx) {
    nb_zero *z = ctx;
    nb_status s = nb__reducer_check(z->r, "step", 0);
    if (s != NB_OK) return s;
    for (int g = 0; g < z->user->ngroups; g++) z->inner->groups[g] = z->user->groups[g];
    if (z->stage == 3) release_all(z); /* a gathered copy would be stale */
    if (z->offload && (s = offload_params(z, true)) != NB_OK) return s;
    if ((s = nb_step(z->inner)) != NB_OK) return s;
    if (z->offload && (s = offload_params(z, false)) != NB_OK) return s;
    for (int i = 0; i < z->np; i++) nb__bump_version(z->p[i].t);
    if (z->size == 1 || z->stage == 3) return NB_OK; /* stage 3 gathers at the next forward */
    nb_status first = NB_OK;
    for (int k = 0; k < z->nbk; k++) {
        z->b[k].work = nb_allgather_async(z->c, z->b[k].pview, z->b[k].pchunk);
        if (!z->b[k].work && first == NB_OK) first = nb_last_status();
        if (first != NB_OK) break;
    }
    nb_status w = wait_gathers(z);
    return first != NB_OK ? first : w;
}

/* ---- the layout: the reducer's buckets, the parameter side, the pieces, the placements ------- */
static nb_tensor *take(nb_tensor *t, nb_status *s) {
    if (!t && *s == NB_OK) *s = nb_last_status();
    return t ? nb__scope_take(t) : NULL;
}

/* The flat shard recorded on each parameter goes (with ZeRO's own mesh, the whole record). */
static void unplace(nb_zero *z) {
    for (int i = 0; i < z->np; i++) {
        zparam *p = &z->p[i];
        if (!p->placed) continue;
        if (z->own_mesh) nb__tensor_set_place(p->t, NULL);
        else nb__placement_set_flat_shard(p->t, z->mesh, NULL, 0, 0, NULL, NULL);
        p->placed = false;
    }
}

/* Everything that depends on the buckets (a relayout rebuilds it). */
static void layout_free(nb_zero *z) {
    unplace(z);
    nb_optim_free(z->inner);
    z->inner = NULL;
    for (int i = 0; i < z->npieces; i++) nb_tensor_free(z->pieces[i]);
    free(z->pieces);
    free(z->piece_param);
    free(z->piece_lo);
    z->pieces = NULL, z->piece_param = NULL, z->piece_lo = NULL, z->npieces = 0;
    for (int k = 0; z->b && k < z->nbk; k++) {
        if (z->b[k].work) nb_work_wait(z->b[k].work);
        if (z->b[k].gwork) nb_work_wait(z->b[k].gwork);
        if (z->b[k].pre_handle >= 0) nb_module_remove_forward_hook(z->b[k].owner, z->b[k].pre_handle);
        if (z->b[k].post_handle >= 0)
            nb_module_remove_forward_hook(z->b[k].owner, z->b[k].post_handle);
        nb_tensor_free(z->b[k].full);
        nb_tensor_free(z->b[k].pview);
        nb_tensor_free(z->b[k].pchunk);
    }
    free(z->b);
    z->b = NULL;
    z->nbk = 0;
    nb_tensor_free(z->shard_p);
    nb_tensor_free(z->host_p);
    nb_tensor_free(z->host_g);
    z->shard_p = z->host_p = z->host_g = NULL;
}

/* The reducer's buckets, and per bucket its parameters' views (stage 3: the unit's buffer
 * and the shard's chunk, filled from the flat buffer, the unit released). */
static nb_status build_views(nb_zero *z) {
    nb_status s = NB_OK;
    z->nbk = nb__reducer_num_buckets(z->r);
    z->b = calloc((size_t)(z->nbk > 0 ? z->nbk : 1), sizeof *z->b);
    if (!z->b) return nb__error(NB_ENOMEM, "zero_new: out of memory");
    for (int k = 0; k < z->nbk; k++) {
        zbucket *bk = &z->b[k];
        nb__reducer_bucket(z->r, k, &bk->begin, &bk->end, &bk->cb, &bk->ce, &bk->soff);
        bk->z = z, bk->index = k, bk->pre_handle = bk->post_handle = -1;
    }
    for (int i = 0; i < z->np; i++) {
        zparam *p = &z->p[i];
        p->bucket = nb__reducer_param_bucket(z->r, i);
        z->b[p->bucket].owner = p->owner;
        if (p->expected) z->b[p->bucket].expected++;
    }
    nb_dtype dt = z->dtype;
    nb_device dev = z->dev;
    int64_t nshard = nb__reducer_shard_numel(z->r);
    if (z->stage == 3) z->shard_p = take(nb_zeros_on(dev, &nshard, 1, dt), &s);
    if (z->offload && s == NB_OK) { /* filled from the device at each step */
        z->host_p = take(nb_zeros(&nshard, 1, dt), &s);
        if (s == NB_OK) z->host_g = take(nb_zeros(&nshard, 1, dt), &s);
    }
    for (int k = 0; k < z->nbk && s == NB_OK; k++) {
        zbucket *bk = &z->b[k];
        if (z->stage == 3) { /* the unit's whole buffer, and the shard's chunk */
            int64_t len = bk->end - bk->begin;
            bk->full = take(nb_empty_on(dev, &len, 1, dt), &s);
            int64_t n = bk->ce - bk->cb;
            if (s == NB_OK) bk->pchunk = take(nb_narrow(z->shard_p, 0, bk->soff, n), &s);
            nb_tensor *src = s == NB_OK ? take(nb_narrow(z->flat_p, 0, bk->cb, n), &s) : NULL;
            if (s == NB_OK) s = nb_copy_(bk->pchunk, src);
            nb_tensor_free(src);
            if (s == NB_OK) unit_release(z, k); /* one unit at a time on top of the flat buffer */
        } else {
            bk->pview = take(nb_narrow(z->flat_p, 0, bk->begin, bk->end - bk->begin), &s);
            if (s == NB_OK) bk->pchunk = take(nb_narrow(z->flat_p, 0, bk->cb, bk->ce - bk->cb), &s);
        }
    }
    return s;
}

/* Parameter i's part of this rank's shard: [lo, hi) of its flattened elements (empty: lo ==
 * hi), in bucket bk. */
static void piece_range(const nb_zero *z, int i, int64_t *lo, int64_t *hi) {
    const zparam *p = &z->p[i];
    const zbucket *bk = &z->b[p->bucket];
    int64_t a = p->off > bk->cb ? p->off : bk->cb;
    int64_t e = p->off + p->n < bk->ce ? p->off + p->n : bk->ce;
    if (e <= a) a = e = p->off; /* none here */
    *lo = a - p->off, *hi = e - p->off;
}

/* The inner optimizer over the pieces of this rank's shard, one group per user group. */
static nb_status build_inner(nb_zero *z) {
    nb_optim *u = z->user;
    const nb_params *ps = nb_parameters(z->m);
    int ng = u->ngroups;
    z->pieces = calloc((size_t)z->np + 1, sizeof *z->pieces);
    z->piece_param = calloc((size_t)z->np + 1, sizeof *z->piece_param);
    z->piece_lo = calloc((size_t)z->np + 1, sizeof *z->piece_lo);
    nb_params *lists = calloc((size_t)ng, sizeof *lists);
    nb_tensor **ts = calloc((size_t)z->np * (size_t)ng + 1, sizeof *ts);
    const char **ns = calloc((size_t)z->np * (size_t)ng + 1, sizeof *ns);
    nb_status s = z->pieces && z->piece_param && z->piece_lo && lists && ts && ns
                      ? NB_OK
                      : nb__error(NB_ENOMEM, "zero_new: out of memory");
    for (int g = 0; g < ng && s == NB_OK; g++) {
        lists[g].tensors = ts + (size_t)g * (size_t)z->np;
        lists[g].names = ns + (size_t)g * (size_t)z->np;
    }
    for (int j = 0; j < u->nparams && s == NB_OK; j++) {
        int i = 0;
        while (i < z->np && z->p[i].t != u->params[j].t) i++;
        zparam *p = &z->p[i];
        if (!p->expected) continue; /* frozen: never gets a gradient */
        zbucket *bk = &z->b[p->bucket];
        int64_t lo, hi;
        piece_range(z, i, &lo, &hi);
        if (lo >= hi) continue;
        int64_t at = bk->soff + (p->off + lo - bk->cb); /* in the shard */
        nb_tensor *piece = z->offload       ? take(nb_narrow(z->host_p, 0, at, hi - lo), &s)
                           : z->stage == 3 ? take(nb_narrow(z->shard_p, 0, at, hi - lo), &s)
                                           : take(nb_narrow(z->flat_p, 0, p->off + lo, hi - lo), &s);
        if (s != NB_OK) break;
        z->piece_param[z->npieces] = i;
        z->piece_lo[z->npieces] = lo;
        z->pieces[z->npieces++] = piece;
        nb_tensor *gv = z->offload ? take(nb_narrow(z->host_g, 0, at, hi - lo), &s)
                                   : nb__reducer_piece_grad(z->r, i, NULL);
        if (!gv && s == NB_OK) s = nb_last_status();
        if (s == NB_OK) s = nb_set_grad(piece, gv);
        nb_tensor_free(gv);
        nb_params *l = &lists[u->params[j].group];
        l->tensors[l->count] = piece;
        l->names[l->count++] = ps->names[i];
    }
    if (s == NB_OK) {
        z->inner = nb__optim_new(u->kind, &u->groups[0], &lists[0]);
        if (!z->inner) s = nb_last_status();
    }
    for (int g = 1; g < ng && s == NB_OK; g++) {
        nb_group_opts go;
        s = nb_optim_group_opts(u, g, &go);
        int r = s == NB_OK ? nb_optim_add_group(z->inner, &lists[g], &go) : s;
        if (r < 0) s = (nb_status)r;
    }
    if (s == NB_OK) {
        z->inner->defaults = u->defaults;
        for (int g = 0; g < ng; g++) z->inner->groups[g] = u->groups[g];
    }
    free(lists);
    free(ts);
    free((void *)ns);
    return s;
}

/* Each parameter's flat shard over "dp" (its reduced gradient piece stands for its gradient
 * in norms; stage 3: its values' piece), and each piece's placement: the parameter's own
 * entries plus the flat shard. */
static nb_status place(nb_zero *z) {
    nb_status s = NB_OK;
    for (int i = 0; i < z->np && s == NB_OK; i++) {
        zparam *p = &z->p[i];
        zbucket *bk = &z->b[p->bucket];
        int64_t lo, hi;
        piece_range(z, i, &lo, &hi);
        int64_t at = bk->soff + (p->off + lo - bk->cb);
        nb_tensor *g = NULL, *v = NULL; /* ours */
        if (p->expected)
            g = z->offload ? take(nb_narrow(z->host_g, 0, hi > lo ? at : 0, hi - lo), &s)
                           : nb__reducer_piece_grad(z->r, i, NULL);
        if (p->expected && !g && s == NB_OK) s = nb_last_status();
        if (s == NB_OK && z->stage == 3)
            v = take(nb_narrow(z->shard_p, 0, hi > lo ? at : 0, hi - lo), &s);
        if (s == NB_OK) s = nb__placement_set_flat_shard(p->t, z->mesh, "dp", lo, hi - lo, g, v);
        p->placed = s == NB_OK;
        nb_tensor_free(g);
        nb_tensor_free(v);
    }
    for (int j = 0; j < z->npieces && s == NB_OK; j++) {
        const zparam *p = &z->p[z->piece_param[j]];
        nb_placement pp;
        s = nb_tensor_placement(p->t, &pp);
        if (s == NB_OK && pp.n >= NB_MAX_PLACES)
            s = nb__error(NB_EINVAL, "zero_new: %s has %d placement entries, no room for its "
                          "flat shard", param_name(z, z->piece_param[j]), pp.n);
        if (s != NB_OK) break;
        pp.places[pp.n++] = (nb_place){.kind = NB_PLACE_SHARD, .mesh_dim = "dp",
                                       .dim = NB_PLACE_FLAT, .blocks = 1,
                                       .offset = z->piece_lo[j], .length = nb_numel(z->pieces[j])};
        s = nb__placement_set(z->pieces[j], &pp, "zero_new");
    }
    return s;
}

static nb_status layout_build(nb_zero *z) {
    nb_status s = build_views(z);
    if (s == NB_OK) s = build_inner(z);
    if (s == NB_OK) s = place(z);
    return s;
}

/* The reducer rebuilt its buckets (deferred parameters): so does the shard, before the first
 * step (the shard optimizer has no state yet). */
static nb_status relayout(void *ctx) {
    nb_zero *z = ctx;
    for (int q = 0; z->inner && q < z->inner->nparams; q++)
        if (z->inner->params[q].has_state)
            return nb__error(NB_ESTATE, "zero: the shard cannot change once the optimizer has "
                             "state");
    layout_free(z);
    nb_status s = layout_build(z);
    if (z->user->step_ctx == z) z->user->sharded = z->inner;
    return s;
}

/* ---- construction ---------------------------------------------------------------------------- */
nb_zero_opts nb_zero_defaults(void) {
    return (nb_zero_opts){
        ._init = NB__OPTS_MARK(nb_zero_opts), .stage = 2, .bucket_mb = 25, .reduce_dtype = NB_F32};
}

void nb_zero_free(nb_zero *z) {
    if (!z) return;
    if (z->ddp) nb_ddp_free(z->ddp);
    /* leave the model whole, unless the communication failed: a teardown after a timeout
     * must not wait on the missing peer again (the model then stays sharded) */
    if (z->s3_ready && !nb__comm_stalled(z->c)) nb_zero_gather_params(z);
    if (z->root_pre >= 0) nb_module_remove_forward_hook(z->m, z->root_pre);
    if (z->root_post >= 0) nb_module_remove_forward_hook(z->m, z->root_post);
    layout_free(z);
    nb__reducer_free(z->r);
    if (z->user && z->user->step_ctx == z)
        z->user->step_hook = NULL, z->user->step_ctx = NULL, z->user->sharded = NULL;
    nb_mesh_free(z->own_mesh);
    free(z->owners);
    free(z->p);
    free(z);
}

/* The module that registered the parameter of this dotted name ("a.b.weight": a's child b). */
static nb_module *owner_of(nb_module *m, const char *name) {
    if (nb_module_param_opt(m, name)) return m; /* its own (a view's names may hold dots) */
    for (int i = 0; i < nb_module_num_children(m); i++) {
        const char *cn = nb_module_child_name(m, i);
        size_t len = cn ? strlen(cn) : 0;
        if (len && strncmp(cn, name, len) == 0 && name[len] == '.') {
            nb_module *o = owner_of(nb_module_child_at(m, i), name + len + 1);
            if (o) return o;
        }
    }
    return NULL;
}

/* How many modules of the tree under m registered t as their own parameter (more than one: a
 * tied weight, as a GPT's embedding and output head). */
static int registrations(nb_module *m, const nb_tensor *t) {
    int n = 0;
    const nb_params *ps = nb_parameters(m);
    for (int i = 0; ps && i < ps->count; i++)
        if (ps->tensors[i] == t && !strchr(ps->names[i], '.')) n++;
    for (int i = 0; i < nb_module_num_children(m); i++)
        n += registrations(nb_module_child_at(m, i), t);
    return n;
}

/* Stage 3: forward hooks on the root and on each unit's module, then the parameters move
 * into the units' buffers, the module's flat buffer goes, and every unit is released. */
static nb_status setup_stage3(nb_zero *z) {
    int h = nb_module_register_forward_pre_hook(z->m, root_pre, z);
    if (h < 0) return (nb_status)h;
    z->root_pre = h;
    if ((h = nb_module_register_forward_hook(z->m, root_post, z)) < 0) return (nb_status)h;
    z->root_post = h;
    for (int k = 0; k < z->nbk; k++) {
        zbucket *bk = &z->b[k];
        if ((h = nb_module_register_forward_pre_hook(bk->owner, unit_pre, bk)) < 0) return (nb_status)h;
        bk->pre_handle = h;
        if ((h = nb_module_register_forward_hook(bk->owner, unit_post, bk)) < 0) return (nb_status)h;
        bk->post_handle = h;
    }
    for (int i = 0; i < z->np; i++) {
        zparam *p = &z->p[i];
        zbucket *bk = &z->b[p->bucket];
        nb__storage *old = p->t->storage;
        atomic_fetch_add(&bk->full->storage->refcount, 1);
        p->t->storage = bk->full->storage;
        p->t->offset = bk->full->offset + (p->off - bk->begin);
        nb__storage_release(old);
    }
    nb_status s = nb__module_drop_flat_params(z->m);
    z->flat_p = NULL;
    release_all(z);
    z->s3_ready = true;
    return s;
}

/* The user's optimizer must update exactly parameters of the model, and have no state. */
static nb_status check_optim(nb_zero *z) {
    nb_optim *u = z->user;
    const nb_params *ps = nb_parameters(z->m);
    for (int j = 0; j < u->nparams; j++) {
        int i = 0;
        while (i < z->np && z->p[i].t != u->params[j].t) i++;
        if (i == z->np)
            return nb__error(NB_EINVAL, "zero_new: the optimizer's parameter '%s' is not a "
                             "parameter of the model; ZeRO shards the model's flat parameter "
                             "buffer, so the optimizer must update the model's parameters only",
                             u->params[j].name);
        if (u->params[j].has_state)
            return nb__error(NB_ESTATE, "zero_new: the optimizer already has state for '%s'; "
                             "wrap the model with nb_zero_new before the first step (or load "
                             "the state into nb_zero_optim afterwards)", ps->names[i]);
    }
    if (u->step_hook)
        return nb__error(NB_ESTATE, "zero_new: the optimizer is already used by another "
                         "nb_zero; free that one first");
    if (!u->kind->elementwise)
        return nb__error(NB_EUNSUPPORTED, "zero_new: optimizer %s cannot be sharded (its update "
                         "is not element-wise)", u->kind->name);
    return NB_OK;
}

/* The mesh the placements record the shards on: the parameters' (the reducer checked that c
 * is its "dp" group), or a 1-D one over c. */
static nb_status pick_mesh(nb_zero *z, const nb_params *ps) {
    for (int i = 0; i < ps->count && !z->mesh; i++) {
        const nb__place *pl = ps->tensors[i]->place;
        if (pl && !pl->activation && pl->p.mesh) z->mesh = pl->p.mesh;
    }
    if (z->mesh) return NB_OK;
    z->own_mesh = nb_mesh_new(z->c, "dp", (int[]){-1}); /* collective over c */
    z->mesh = z->own_mesh;
    return z->mesh ? NB_OK : nb_last_status();
}

nb_zero *nb_zero_new(nb_module *model, nb_optim *opt, nb_comm *c, const nb_zero_opts *o) {
    if (!model) return nb__error(NB_ENULL, "zero_new: model is NULL"), NULL;
    if (!opt) return nb__error(NB_ENULL, "zero_new: optimizer is NULL"), NULL;
    if (!c) return nb__error(NB_ENULL, "zero_new: communicator is NULL"), NULL;
    if (o &&
        NB__OPTS_CHECK(o, nb_zero_opts, "zero_new", "nb_zero_defaults()", "o.stage = 1") != NB_OK)
        return NULL;
    nb_zero_opts opts = o ? *o : nb_zero_defaults();
    if (opts.stage < 0 || opts.stage > 3)
        return nb__error(NB_EINVAL, "zero_new: stage must be 0, 1, 2 or 3, got %d",
                         opts.stage), NULL;
    if (opts.stage == 3 && nb__is_pipeline_module(model))
        return nb__error(NB_EUNSUPPORTED, "zero_new: stage 3 over a pipeline's module is not "
                         "supported (it gathers each module's parameters for its forward, which "
                         "a pipeline stage already holds); wrap it with stage 1 or 2"), NULL;
    if (opts.offload_optimizer && opts.stage == 0)
        return nb__error(NB_EINVAL, "zero_new: offload_optimizer needs stage 1, 2 or 3 (stage 0 "
                         "is plain data parallel, whose optimizer is the caller's)"), NULL;
    if (!(opts.bucket_mb >= 0))
        return nb__error(NB_EINVAL, "zero_new: bucket_mb must be >= 0, got %g", opts.bucket_mb),
               NULL;
    if (opts.reduce_dtype != NB_F32 && opts.reduce_dtype != NB_F16 &&
        opts.reduce_dtype != NB_BF16)
        return nb__error(NB_EINVAL, "zero_new: reduce_dtype must be f32 (the gradients' own "
                         "dtype), f16 or bf16, got %s",
                         (unsigned)opts.reduce_dtype < NB_DTYPE_COUNT
                             ? nb_dtype_name(opts.reduce_dtype) : "(invalid)"), NULL;
    nb_zero *z = calloc(1, sizeof *z);
    if (!z) return nb__error(NB_ENOMEM, "zero_new: out of memory"), NULL;
    z->m = model, z->c = c, z->o = opts, z->stage = opts.stage, z->user = opt;
    z->size = nb_comm_size(c), z->rank = nb_comm_rank(c);
    z->root_pre = z->root_post = -1;
    if (opts.stage == 0) { /* plain data parallel: the optimizer is used as it is */
        nb_ddp_opts dopts = nb_ddp_defaults();
        dopts.bucket_mb = opts.bucket_mb, dopts.find_unused = opts.find_unused;
        dopts.no_broadcast = opts.no_broadcast, dopts.reduce_dtype = opts.reduce_dtype;
        z->ddp = nb_ddp_new(model, c, &dopts);
        if (!z->ddp) {
            free(z);
            return NULL;
        }
        z->flat_p = nb_module_flat_params(model);
        z->flat_g = nb_module_flat_grads(model);
        return z;
    }
    const nb_params *ps = NULL;
    nb_status s = nb_module_flatten_parameters(model, 0);
    if (s == NB_OK && !(ps = nb_parameters(model))) s = nb_last_status();
    if (s != NB_OK) {
        free(z);
        return NULL;
    }
    z->flat_p = nb_module_flat_params(model);
    z->flat_g = z->stage == 1 ? nb_module_flat_grads(model) : NULL;
    z->dtype = z->flat_p->dtype;
    z->dev = nb__device_of(z->flat_p);
    z->offload = opts.offload_optimizer && !nb_device_equal(z->dev, NB_CPU);
    z->p = calloc((size_t)ps->count + 1, sizeof *z->p);
    z->owners = calloc((size_t)ps->count + 1, sizeof *z->owners);
    if (!z->p || !z->owners) s = nb__error(NB_ENOMEM, "zero_new: out of memory");
    else z->np = ps->count;
    for (int i = 0; i < z->np && s == NB_OK; i++) {
        nb_tensor *t = ps->tensors[i];
        z->p[i] = (zparam){.z = z, .index = i, .t = t, .off = t->offset - z->flat_p->offset,
                           .n = nb_numel(t), .expected = nb_requires_grad(t),
                           .owner = owner_of(model, ps->names[i])};
        z->owners[i] = z->p[i].owner;
        if (!z->p[i].owner)
            s = nb__error(NB_EINTERNAL, "zero_new: no module owns %s", ps->names[i]);
        /* a tied weight is used by several modules' forwards: stage 3 keeps it gathered for
         * the whole forward and backward of the model (a unit of the root) */
        if (opts.stage == 3 && s == NB_OK && registrations(model, t) > 1) z->p[i].owner = model;
    }
    if (s == NB_OK) s = check_optim(z);
    nb__reducer_cfg cfg = {.policy = z->stage == 1 ? NB__RED_SCATTER : NB__RED_STAGED,
                           .bucket_mb = opts.bucket_mb, .find_unused = opts.find_unused,
                           .reduce_dtype = opts.reduce_dtype, .who = "zero",
                           .owners = z->stage == 3 ? z->owners : NULL, .on_grad = unit_grad_done,
                           .after_reduce = z->offload ? offload_grads : NULL, .ctx = z};
    if (s == NB_OK && !(z->r = nb__reducer_new(model, c, &cfg))) s = nb_last_status();
    if (s == NB_OK) nb__reducer_set_relayout(z->r, relayout);
    /* Same model everywhere, then rank 0's weights and buffers (as nb_ddp_new). */
    if (s == NB_OK)
        s = nb__reducer_check_same(z->r, (int64_t[]){z->stage, (int64_t)opts.reduce_dtype},
                                   (const char *const[]){"stage", "reduce dtype"}, 2);
    if (s == NB_OK && z->size > 1 && !opts.no_broadcast) {
        s = nb_broadcast(c, z->flat_p, 0);
        const nb_params *bs = s == NB_OK ? nb_buffers(model) : NULL;
        if (s == NB_OK && !bs) s = nb_last_status();
        for (int i = 0; s == NB_OK && i < bs->count; i++) s = nb_broadcast(c, bs->tensors[i], 0);
    }
    if (s == NB_OK && z->stage >= 2) { /* no full gradient buffer: drop the flat views */
        for (int i = 0; i < z->np; i++) nb_clear_grad(z->p[i].t);
        s = nb__module_drop_flat_grads(model);
    }
    if (s == NB_OK) s = pick_mesh(z, ps);
    if (s == NB_OK) s = layout_build(z);
    if (s == NB_OK && z->stage == 3) s = setup_stage3(z);
    if (s != NB_OK) {
        nb_zero_free(z);
        return NULL;
    }
    opt->step_hook = zero_step;
    opt->step_ctx = z;
    opt->sharded = z->inner; /* the loss scaler unscales the shard's gradients */
    return z;
}

/* ---- the rest of the API ----------------------------------------------------------------------- */
int nb_zero_stage(const nb_zero *z) { return z ? z->stage : -1; }

nb_status nb_zero_sync(nb_zero *z) {
    if (!z) return nb__error(NB_ENULL, "zero_sync: zero is NULL");
    return z->ddp ? nb_ddp_sync(z->ddp) : nb__reducer_sync(z->r);
}

void nb_zero_set_sync_enabled(nb_zero *z, bool enabled) {
    if (!z) return;
    if (z->ddp) nb_ddp_set_sync_enabled(z->ddp, enabled);
    else nb__reducer_set_sync(z->r, enabled);
}

double nb_zero_exposed_comm_s(const nb_zero *z) {
    return !z ? 0.0 : z->ddp ? nb_ddp_exposed_comm_s(z->ddp) : nb__reducer_exposed_s(z->r);
}

int64_t nb_zero_comm_bytes(const nb_zero *z) {
    return !z ? 0 : z->ddp ? nb_ddp_comm_bytes(z->ddp) : nb__reducer_comm_bytes(z->r);
}

int nb_zero_num_buckets(const nb_zero *z) {
    return !z ? 0 : z->ddp ? nb_ddp_num_buckets(z->ddp) : z->nbk;
}

nb_status nb_zero_gather_params(nb_zero *z) {
    if (!z) return nb__error(NB_ENULL, "zero_gather_params: zero is NULL");
    if (z->stage != 3 || !z->s3_ready) return NB_OK;
    nb_status s = NB_OK;
    for (int k = z->nbk - 1; k >= 0 && s == NB_OK; k--) s = gather_start(z, k);
    for (int k = z->nbk - 1; k >= 0 && s == NB_OK; k--) s = gather(z, k);
    if (s != NB_OK) release_all(z);
    return s;
}

nb_status nb_zero_release_params(nb_zero *z) {
    if (!z) return nb__error(NB_ENULL, "zero_release_params: zero is NULL");
    if (z->stage != 3 || !z->s3_ready) return NB_OK;
    nb_status s = NB_OK;
    bool prev = nb_set_grad_enabled(false);
    for (int k = 0; k < z->nbk; k++) {
        zbucket *bk = &z->b[k];
        if (bk->gwork) unit_release(z, k);
        if (!bk->gathered) continue;
        nb_scope_begin(); /* keep what was written into the whole parameters: the shard's part */
        nb_tensor *src = nb_narrow(bk->full, 0, bk->cb - bk->begin, bk->ce - bk->cb);
        nb_status c = src ? nb_copy_(bk->pchunk, src) : nb_last_status();
        nb_scope_end();
        if (c != NB_OK && s == NB_OK) s = c;
        unit_release(z, k);
    }
    nb_set_grad_enabled(prev);
    return s;
}

nb_optim *nb_zero_optim(const nb_zero *z) { return !z ? NULL : z->inner ? z->inner : z->user; }

static int64_t state_bytes(const nb_optim *o) {
    int64_t n = 0;
    for (int i = 0; o && i < o->nparams; i++)
        for (int k = 0; k < NB__OPT_SLOTS; k++)
            if (o->params[i].slot[k]) n += nb_numel(o->params[i].slot[k]) *
                                           (int64_t)nb_dtype_size(o->params[i].slot[k]->dtype);
    for (int i = 0; o && i < o->nparams; i++) /* f32 master weights of half parameters */
        if (o->params[i].master) n += nb_numel(o->params[i].master) * 4;
    return n;
}

static int64_t bytes_of(const nb_tensor *t) {
    return t ? nb_numel(t) * (int64_t)nb_dtype_size(t->dtype) : 0;
}

nb_status nb_zero_memory(const nb_zero *z, nb_zero_memory_info *out) {
    if (!z || !out) return nb__error(NB_ENULL, "zero_memory: %s is NULL", !z ? "zero" : "out");
    memset(out, 0, sizeof *out);
    out->params = bytes_of(z->flat_p);
    if (z->stage == 3) { /* the shard, and the units gathered now */
        out->params = bytes_of(z->shard_p);
        for (int k = 0; k < z->nbk; k++)
            if (z->b[k].full->storage->data) out->params += bytes_of(z->b[k].full);
    }
    if (z->stage < 2) {
        out->grads = bytes_of(z->flat_g);
    } else {
        out->grads = bytes_of(nb__reducer_shard_grad(z->r));
        for (int i = 0; i < z->np; i++) out->grads += bytes_of(nb_grad(z->p[i].t)); /* local */
        out->comm_buffers = nb__reducer_staging_bytes(z->r);
    }
    out->optim_state = state_bytes(z->inner ? z->inner : z->user);
    out->host_buffers = bytes_of(z->host_p) + bytes_of(z->host_g);
    out->total = out->params + out->grads + out->optim_state + out->comm_buffers +
                 out->host_buffers;
    out->host_bytes = z->offload ? out->optim_state + out->host_buffers : 0;
    out->device_bytes = out->total - out->host_bytes;
    return NB_OK;
}
nb_status nb_zero_memory_plan(int64_t numel, int elem_size, int state_slots, int world,
                              int stage, double bucket_mb, nb_zero_memory_info *out) {
    if (!out) return nb__error(NB_ENULL, "zero_memory_plan: out is NULL");
    if (numel < 0 || elem_size <= 0 || state_slots < 0 || world < 1 || !(bucket_mb >= 0))
        return nb__error(NB_EINVAL, "zero_memory_plan: bad sizes (numel %lld, elem_size %d, "
                         "state_slots %d, world %d, bucket_mb %g)", (long long)numel, elem_size,
                         state_slots, world, bucket_mb);
    if (stage < 0 || stage > 3)
        return nb__error(NB_EINVAL, "zero_memory_plan: stage must be 0, 1, 2 or 3, got %d", stage);
    int64_t shard = stage == 0 ? numel : (numel + world - 1) / world;
    int64_t bucket = (int64_t)(bucket_mb * 1048576.0 / elem_size);
    if (bucket > numel || bucket < 1) bucket = numel;
    memset(out, 0, sizeof *out);
    out->params = (stage < 3 ? numel : shard) * elem_size;
    out->grads = (stage < 2 ? numel : shard) * elem_size;
    /* f16/bf16 parameters: f32 state and an f32 master copy (optim.c) */
    int64_t state_elem = elem_size >= 4 ? (int64_t)elem_size * state_slots : 4 * (int64_t)state_slots + 4;
    out->optim_state = shard * state_elem;
    out->comm_buffers = stage >= 2 ? 2 * bucket * elem_size : 0;
    out->total = out->params + out->grads + out->optim_state + out->comm_buffers;
    out->device_bytes = out->total;
    return NB_OK;
}
