/* zero.c - ZeRO stages 1 and 2 (nb_zero, see nabla/parallel.h); stage 0 is an nb_ddp.
 *
 * Layout. The module's parameters are flattened (docs/architecture.md rule 10) and the flat
 * buffer is cut into buckets exactly as ddp.c does (contiguous ranges from the end, whole
 * parameters). Each bucket [begin, end) is split over the ranks by nb_comm_chunk (balanced
 * contiguous ranges, the last ones shorter): rank r's shard is its chunk of every bucket.
 * That is the layout nb_reduce_scatter and nb_allgather use, so a bucket's gradient is
 * reduce-scattered and its parameters all-gathered with one collective each, without
 * repacking (FSDP's per-unit sharding; the shard is not one range of the whole buffer but
 * one range per bucket, balanced to within one element per bucket).
 *
 * Optimizer. The user's optimizer is a template: a second optimizer of the same kind (same
 * flags and groups) is built over the "pieces" of the shard: the intersection of the shard
 * with each parameter, a 1-D view of the flat parameter buffer, named after the parameter
 * and placed in its group, so per-parameter group settings (no weight decay on biases)
 * stay exact although chunks cross parameter boundaries. Every element-wise optimizer
 * gives the same result on pieces as on whole parameters. Each piece's gradient is a view
 * of the averaged shard gradient. nb_step(user optimizer) is redirected here (step_hook):
 * copy the user's current group hyperparameters (schedules set those), step the pieces,
 * all-gather every bucket's parameters.
 *
 * Backward. Hooks count each bucket's completed parameters as ddp.c does; a complete bucket
 * (launched strictly in bucket order, the same order on every rank) starts an asynchronous
 * reduce-scatter with NB_REDUCE_AVG:
 *   stage 1: in = the bucket's view of the flat gradient buffer, out = this rank's chunk of
 *            it (comm.c stages the aliasing input);
 *   stage 2: there is no flat gradient buffer; the bucket's parameter gradients (allocated
 *            by backward) are copied into staging buffer k % 2 and dropped, and out is the
 *            bucket's part of the shard gradient buffer. Before reusing a staging buffer the
 *            reduce-scatter of bucket k - 2 is waited for, so at most two are in flight.
 * The end of backward (the engine's end-of-backward callback) launches what is left and
 * waits; nb_step refuses gradients that were never reduced (a guard on every parameter). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "autograd/autograd_impl.h"
#include "nabla/autograd.h"
#include "nabla/io.h"
#include "nabla/parallel.h"
#include "optim/optim_impl.h"
#include "parallel/zero_impl.h"
#include "tensor/backend.h"
#include "tensor/tensor_impl.h"

/* nn/module.c: forget the module's flat gradient buffer (stage 2 has none). */
nb_status nb__module_drop_flat_grads(nb_module *m);
/* nn/module.c: forget the module's flat parameter buffer (stage 3 has none). */
nb_status nb__module_drop_flat_params(nb_module *m);

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void hook_fail(nb_zero *z, nb_status s) {
    if (z->hook_err != NB_OK) return;
    z->hook_err = s ? s : NB_EINTERNAL;
    snprintf(z->hook_msg, sizeof z->hook_msg, "%s", nb_last_error());
}

static const char *param_name(const nb_zero *z, int i) {
    const nb_params *ps = nb_parameters(z->m);
    return ps && i < ps->count ? ps->names[i] : "?";
}

/* Bytes one rank sends in a bandwidth-optimal reduce-scatter or all-to-all of n elements of
 * es bytes over p ranks: (p-1)/p n es (as ddp.c counts). */
static int64_t coll_bytes(int64_t n, int p, int64_t es) {
    return (int64_t)((double)(p - 1) / p * (double)n * (double)es);
}

/* The second half of a compressed bucket, after its all-to-all: add the size copies of this
 * rank's chunk in f32 (in rank order), divide by the size and write the mean into the
 * chunk's gradient (f32, or the parameters' dtype), rounded once. */
static nb_status finish_compressed(nb_zero *z, zbucket *bk) {
    int64_t kk = nb_numel(bk->cout) / z->size, mine = bk->ce - bk->cb;
    if (mine <= 0) return NB_OK;
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_tensor *parts = nb_to_dtype(nb_view(bk->cout, (int64_t[]){z->size, kk}, 2), NB_F32);
    nb_tensor *mean = nb_mul_scalar(nb_sum(parts, (int[]){0}, 1, false), 1.0 / z->size);
    nb_tensor *head = mean ? nb_narrow(mean, 0, 0, mine) : NULL;
    nb_status s = head ? nb_copy_(bk->gout, head) : nb_last_status();
    nb_scope_end();
    nb_set_grad_enabled(prev);
    return s;
}

/* Wait for bucket k's collective (if any); the first failure is kept in *first/msg. A
 * compressed bucket's exchange is summed into its gradient chunk here. */
static void wait_bucket(nb_zero *z, int k, nb_status *first, char *msg, size_t n) {
    zbucket *bk = &z->b[k];
    if (!bk->work) return;
    nb_status s = nb_work_wait(bk->work);
    bk->work = NULL;
    if (bk->cpending) {
        bk->cpending = false;
        if (z->cslot_by[k % 2] == k) z->cslot_by[k % 2] = -1;
        if (s == NB_OK) s = finish_compressed(z, bk);
    }
    if (s != NB_OK && *first == NB_OK) {
        *first = s;
        snprintf(msg, n, "%s", nb_last_error());
    }
}

/* Stage 2: pack bucket k's gradients into a staging buffer and drop them. */
static nb_status stage_grads(nb_zero *z, int k, nb_tensor **in) {
    int slot = k % 2;
    zbucket *bk = &z->b[k];
    if (z->staged_by[slot] >= 0) { /* bucket k - 2 still reads it */
        nb_status first = NB_OK;
        char msg[512];
        wait_bucket(z, z->staged_by[slot], &first, msg, sizeof msg);
        z->staged_by[slot] = -1;
        if (first != NB_OK) return nb__error(first, "zero: gradient reduce-scatter failed: %s", msg);
    }
    nb_tensor *buf = nb_narrow(z->staging[slot], 0, 0, bk->end - bk->begin);
    if (!buf) return nb_last_status();
    nb_status s = nb_fill_(buf, 0); /* padding, and parameters without a gradient */
    for (int i = 0; i < z->np && s == NB_OK; i++) {
        zparam *p = &z->p[i];
        if (p->bucket != k || !p->expected) continue;
        nb_tensor *g = nb_grad(p->t);
        if (!g) continue;
        nb_tensor *dst = nb_narrow(buf, 0, p->off - bk->begin, p->n);
        dst = dst ? nb_view(dst, p->t->shape, p->t->ndim) : NULL;
        s = dst ? nb_copy_(dst, g) : nb_last_status();
        if (s == NB_OK) nb_clear_grad(p->t);
    }
    z->staged_by[slot] = k;
    *in = buf;
    return s;
}

/* Compressed: round bucket k's gradient (in) to the wire dtype into its exchange slot, zero
 * padded to size * ceil(len / size), and start the all-to-all that gives each rank every
 * rank's copy of its chunk; wait_bucket sums them once they arrived. */
static nb_status start_compressed(nb_zero *z, int k, nb_tensor *in) {
    zbucket *bk = &z->b[k];
    int slot = k % 2;
    if (z->cslot_by[slot] >= 0) { /* bucket k - 2's exchange still uses the slot */
        nb_status first = NB_OK;
        char msg[512];
        wait_bucket(z, z->cslot_by[slot], &first, msg, sizeof msg);
        z->cslot_by[slot] = -1;
        if (first != NB_OK) return nb__error(first, "zero: gradient reduction failed: %s", msg);
    }
    int64_t n = bk->end - bk->begin, all = nb_numel(bk->cin);
    nb_tensor *head = nb_narrow(bk->cin, 0, 0, n);
    nb_status s = head ? nb_copy_(head, in) : nb_last_status();
    if (s == NB_OK && all > n) {
        nb_tensor *tail = nb_narrow(bk->cin, 0, n, all - n);
        s = tail ? nb_fill_(tail, 0) : nb_last_status();
    }
    if (z->stage >= 2) z->staged_by[slot] = -1; /* the staging buffer is free again */
    if (s != NB_OK) return s;
    bk->work = nb_all_to_all_async(z->c, bk->cout, bk->cin);
    if (!bk->work) return nb_last_status();
    bk->cpending = true;
    z->cslot_by[slot] = k;
    z->wire_bytes += coll_bytes(all, z->size, (int64_t)nb_dtype_size(z->o.reduce_dtype));
    return NB_OK;
}

static void launch(nb_zero *z, int k) {
    zbucket *bk = &z->b[k];
    bk->launched = true;
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_tensor *in = bk->gin;
    nb_status s = NB_OK;
    if (z->stage >= 2) s = stage_grads(z, k, &in);
    if (s == NB_OK && z->compress) {
        s = start_compressed(z, k, in);
    } else if (s == NB_OK && (z->stage >= 2 || z->size > 1)) {
        bk->work = nb_reduce_scatter_async(z->c, bk->gout, in, NB_REDUCE_AVG);
        if (!bk->work) s = nb_last_status();
        /* halves are summed in f32 and travel as f32 (parallel/comm_mpi.c) */
        nb_dtype dt = in->dtype;
        int64_t es = dt == NB_F16 || dt == NB_BF16 ? 4 : (int64_t)nb_dtype_size(dt);
        z->wire_bytes += coll_bytes(bk->end - bk->begin, z->size, es);
    }
    nb_scope_end();
    nb_set_grad_enabled(prev);
    if (s != NB_OK) hook_fail(z, s);
}

static void launch_ready(nb_zero *z) {
    while (z->next_launch < z->nbk && z->b[z->next_launch].ready == z->b[z->next_launch].expected)
        launch(z, z->next_launch++);
}

/* Stage 1: keep p's gradient in the flat buffer (as ddp.c's reattach). */
static nb_status reattach(zparam *p) {
    nb_zero *z = p->z;
    if (z->stage != 1) return NB_OK;
    nb_tensor *g = nb_grad(p->t);
    if (g && g->storage == z->flat_g->storage &&
        g->offset == z->flat_g->offset + p->off && nb_is_contiguous(g))
        return NB_OK;
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_tensor *v = nb_narrow(z->flat_g, 0, p->off, p->n);
    v = v ? nb_view(v, p->t->shape, p->t->ndim) : NULL;
    nb_status s = !v ? nb_last_status() : g ? nb_copy_(v, g) : nb_fill_(v, 0);
    if (s == NB_OK) s = nb_set_grad(p->t, v);
    nb_scope_end();
    nb_set_grad_enabled(prev);
    return s;
}

static nb_status backward_end(void *ctx, nb_status backward_status);

/* ---- offload_optimizer: the shard's host copies ------------------------------------------------
 * host_p and host_g hold the shard in its soff layout (bucket k's chunk at soff); the inner
 * optimizer's pieces and their gradients are views of them. The device side of bucket k is
 * pchunk (parameters) and gout (averaged gradient), both contiguous. The copies go through
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

/* The averaged gradient shard, device -> host (once it is reduced). */
static nb_status offload_grads(nb_zero *z) {
    nb_status s = NB_OK;
    for (int k = 0; k < z->nbk && s == NB_OK; k++) s = xfer(z, z->b[k].gout, z->host_g, z->b[k].soff, true);
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
    nb_status s = nb__queue_backward_end(backward_end, z);
    z->in_backward = true;
    if (s == NB_OK) s = gather(z, bk->index);
    if (s == NB_OK && bk->index + 1 < z->nbk && z->b[bk->index + 1].seen)
        s = gather_start(z, bk->index + 1);
    return s;
}

static nb_status root_pre_backward(void *ctx) {
    nb_zero *z = ctx;
    nb_status s = nb__queue_backward_end(backward_end, z);
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

static void grad_hook(nb_tensor *leaf, void *ctx) {
    zparam *p = ctx;
    nb_zero *z = p->z;
    (void)leaf;
    if (!p->expected) return;
    if (z->stage == 3) { /* the unit's rules have all run: release it */
        nb_status q = nb__queue_backward_end(backward_end, z);
        if (q != NB_OK) hook_fail(z, q);
        zbucket *bk = &z->b[p->bucket];
        if (++bk->done == bk->expected) unit_release(z, p->bucket);
    }
    if (!z->sync_enabled) {
        z->local = true;
        z->last_st = NB_OK;
        return;
    }
    if (!z->active) {
        z->active = true;
        z->last_st = NB_OK;
        z->last_msg[0] = '\0';
    }
    nb_status q = nb__queue_backward_end(backward_end, z);
    if (q != NB_OK) hook_fail(z, q);
    if (p->ready) {
        z->twice = true;
        return;
    }
    nb_status s = reattach(p);
    if (s != NB_OK) hook_fail(z, s);
    p->ready = true;
    z->b[p->bucket].ready++;
    launch_ready(z);
}

static nb_status wait_all(nb_zero *z, const char *what) {
    nb_status first = NB_OK;
    char msg[512] = "";
    for (int k = 0; k < z->nbk; k++) wait_bucket(z, k, &first, msg, sizeof msg);
    z->staged_by[0] = z->staged_by[1] = -1;
    z->cslot_by[0] = z->cslot_by[1] = -1;
    if (first != NB_OK) nb__error(first, "zero: %s failed: %s", what, msg);
    return first;
}

static void reset_step(nb_zero *z) {
    for (int i = 0; i < z->np; i++) z->p[i].ready = false;
    for (int k = 0; k < z->nbk; k++) z->b[k].ready = 0, z->b[k].launched = false;
    z->next_launch = 0;
    z->last_wire_bytes = z->wire_bytes;
    z->wire_bytes = 0;
    z->active = z->twice = false;
    z->hook_err = NB_OK;
    z->hook_msg[0] = '\0';
}

static nb_status finish_step(nb_zero *z, bool all) {
    double t0 = now_s();
    int missing = 0, first_missing = -1;
    for (int i = 0; i < z->np; i++) {
        zparam *p = &z->p[i];
        if (!p->expected || p->ready) continue;
        if (!all && missing++ == 0) first_missing = i;
        nb_status s = reattach(p);
        if (s != NB_OK) hook_fail(z, s);
        p->ready = true;
        z->b[p->bucket].ready++;
    }
    launch_ready(z);
    nb_status s = wait_all(z, "gradient reduce-scatter");
    z->exposed_s = now_s() - t0;
    if (s == NB_OK && z->hook_err != NB_OK)
        s = nb__error(z->hook_err, "zero: starting a gradient reduce-scatter failed: %s",
                      z->hook_msg);
    if (s == NB_OK && z->offload) s = offload_grads(z);
    z->failed = s != NB_OK;
    if (z->failed) snprintf(z->fail_msg, sizeof z->fail_msg, "%s", nb_last_error());
    else z->local = false;
    if (s == NB_OK && z->twice)
        s = nb__error(NB_ESTATE, "zero: a parameter's gradient was completed twice in one step "
                      "(a backward run from inside a backward?)");
    if (s == NB_OK && missing && !z->o.find_unused) {
        char more[64] = "";
        if (missing > 1) snprintf(more, sizeof more, " (nor did %d other parameters)", missing - 1);
        s = nb__error(NB_EINVAL, "zero: parameter %s got no gradient in this step%s; pass "
                      ".find_unused = true if that is intended", param_name(z, first_missing),
                      more);
    }
    z->last_st = s;
    snprintf(z->last_msg, sizeof z->last_msg, "%s", s == NB_OK ? "" : nb_last_error());
    reset_step(z);
    return s;
}

static nb_status backward_end(void *ctx, nb_status backward_status) {
    nb_zero *z = ctx;
    if (z->stage == 3) {
        release_all(z);
        z->in_backward = false;
        for (int k = 0; k < z->nbk; k++) z->b[k].done = 0;
    }
    if (!z->active) return NB_OK;
    z->active = false;
    if (backward_status == NB_OK) return finish_step(z, false);
    char why[400];
    snprintf(why, sizeof why, "%s", nb_last_error());
    double t0 = now_s();
    wait_all(z, "gradient reduce-scatter");
    z->exposed_s = now_s() - t0;
    z->failed = true;
    snprintf(z->fail_msg, sizeof z->fail_msg, "backward failed before they were (%s)", why);
    z->last_st = backward_status;
    snprintf(z->last_msg, sizeof z->last_msg, "zero: the gradients were not synchronised: "
             "backward failed (%s)", why);
    reset_step(z);
    return backward_status;
}

/* What nb_step must refuse (the same three cases as ddp.c). */
static nb_status check_reduced(nb_zero *z, const char *who, const char *name) {
    if (z->failed)
        return nb__error(NB_ESTATE, "%s: the gradient of '%s' (an nb_zero model) was not "
                         "reduced over the ranks, so the ranks would drift apart: %s", who,
                         name, z->fail_msg);
    if (z->active)
        return nb__error(NB_ESTATE, "%s: the gradient of '%s' (an nb_zero model) is not "
                         "synchronised yet; call nb_zero_sync before the step", who, name);
    if (z->local)
        return nb__error(NB_ESTATE, "%s: the gradient of '%s' (an nb_zero model) comes from a "
                         "backward with sync disabled and was never reduced over the ranks; "
                         "enable sync (nb_zero_set_sync_enabled) before the last micro-step's "
                         "backward, or enable it and call nb_zero_sync before the step", who,
                         name);
    return NB_OK;
}

static nb_status grad_guard(const nb_tensor *leaf, void *ctx, const char *who) {
    const zparam *p = ctx;
    (void)leaf;
    return check_reduced(p->z, who, param_name(p->z, p->index));
}

/* nb_step(user optimizer): step the shard, then all-gather the parameters. */
static nb_status zero_step(void *ctx) {
    nb_zero *z = ctx;
    nb_status s = check_reduced(z, "step", z->np ? param_name(z, 0) : "?");
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
    nb_status w = wait_all(z, "parameter all-gather");
    return first != NB_OK ? first : w;
}

/* ---- construction ---------------------------------------------------------------------------- */
nb_zero_opts nb_zero_defaults(void) {
    return (nb_zero_opts){.stage = 2, .bucket_mb = 25, .reduce_dtype = NB_F32};
}

void nb_zero_free(nb_zero *z) {
    if (!z) return;
    if (z->ddp) nb_ddp_free(z->ddp);
    if (z->s3_ready) nb_zero_gather_params(z); /* leave the model whole */
    if (z->root_pre >= 0) nb_module_remove_forward_hook(z->m, z->root_pre);
    if (z->root_post >= 0) nb_module_remove_forward_hook(z->m, z->root_post);
    for (int k = 0; k < z->nbk; k++) {
        if (z->b[k].work) nb_work_wait(z->b[k].work);
        if (z->b[k].gwork) nb_work_wait(z->b[k].gwork);
        if (z->b[k].pre_handle >= 0) nb_module_remove_forward_hook(z->b[k].owner, z->b[k].pre_handle);
        if (z->b[k].post_handle >= 0)
            nb_module_remove_forward_hook(z->b[k].owner, z->b[k].post_handle);
        nb_tensor_free(z->b[k].full);
        nb_tensor_free(z->b[k].pview);
        nb_tensor_free(z->b[k].pchunk);
        nb_tensor_free(z->b[k].gin);
        nb_tensor_free(z->b[k].gout);
        nb_tensor_free(z->b[k].cin);
        nb_tensor_free(z->b[k].cout);
    }
    for (int i = 0; i < 2; i++) nb_tensor_free(z->cin[i]), nb_tensor_free(z->cout[i]);
    for (int i = 0; i < z->np; i++) {
        if (z->p[i].handle >= 0) nb_remove_grad_hook(z->p[i].t, z->p[i].handle);
        if (z->p[i].guarded) nb__set_grad_guard(z->p[i].t, NULL, &z->p[i]);
    }
    if (z->user && z->user->step_ctx == z)
        z->user->step_hook = NULL, z->user->step_ctx = NULL, z->user->sharded = NULL;
    nb_optim_free(z->inner);
    for (int i = 0; i < z->npieces; i++) nb_tensor_free(z->pieces[i]);
    free(z->pieces);
    free(z->piece_param);
    free(z->piece_lo);
    nb_tensor_free(z->shard_g);
    nb_tensor_free(z->shard_p);
    nb_tensor_free(z->host_p);
    nb_tensor_free(z->host_g);
    nb_tensor_free(z->staging[0]);
    nb_tensor_free(z->staging[1]);
    free(z->b);
    free(z->p);
    free(z);
}

static nb_status build_buckets(nb_zero *z, int64_t cap) {
    z->b = calloc((size_t)z->np, sizeof *z->b);
    if (!z->b) return nb__error(NB_ENOMEM, "zero_new: out of memory");
    int k = -1;
    int64_t end = nb_numel(z->flat_p);
    for (int i = z->np - 1; i >= 0; i--) {
        zparam *p = &z->p[i];
        bool cut = z->stage == 3 ? k >= 0 && p->owner != z->p[i + 1].owner /* one unit per module */
                                 : k >= 0 && z->b[k].end - end >= cap;
        if (k < 0 || cut) {
            if (k >= 0) z->b[k].begin = end;
            k++;
            z->b[k].end = end;
        }
        end = p->off;
        p->bucket = k;
        z->b[k].owner = p->owner;
        if (p->expected) z->b[k].expected++;
    }
    z->b[k].begin = 0;
    z->nbk = k + 1;
    int64_t soff = 0;
    for (k = 0; k < z->nbk; k++) {
        zbucket *bk = &z->b[k];
        bk->z = z, bk->index = k, bk->pre_handle = bk->post_handle = -1;
        int64_t len = bk->end - bk->begin, b, e;
        if (len > z->max_bucket) z->max_bucket = len;
        nb_comm_chunk(len, z->size, z->rank, &b, &e);
        bk->cb = bk->begin + b, bk->ce = bk->begin + e;
        bk->soff = soff;
        soff += e - b;
    }
    return NB_OK;
}

static nb_tensor *take(nb_tensor *t, nb_status *s) {
    if (!t && *s == NB_OK) *s = nb_last_status();
    return t ? nb__scope_take(t) : NULL;
}

/* Views of every bucket, the shard gradient buffer and staging (stage 2). */
static nb_status build_views(nb_zero *z) {
    nb_status s = NB_OK;
    nb_dtype dt = z->dtype;
    nb_device dev = z->dev;
    int64_t nshard = z->nbk ? z->b[z->nbk - 1].soff + (z->b[z->nbk - 1].ce - z->b[z->nbk - 1].cb) : 0;
    if (z->stage == 3) z->shard_p = take(nb_zeros_on(dev, &nshard, 1, dt), &s);
    if (z->stage >= 2) {
        z->shard_g = take(nb_zeros_on(dev, &nshard, 1, dt), &s);
        for (int i = 0; i < 2 && s == NB_OK; i++)
            z->staging[i] = take(nb_zeros_on(dev, &z->max_bucket, 1, dt), &s);
    }
    if (z->offload && s == NB_OK) { /* filled from the device at each step */
        z->host_p = take(nb_zeros(&nshard, 1, dt), &s);
        if (s == NB_OK) z->host_g = take(nb_zeros(&nshard, 1, dt), &s);
    }
    if (z->compress && s == NB_OK) { /* two exchange slots of the largest padded bucket */
        int64_t slot = z->size * ((z->max_bucket + z->size - 1) / z->size);
        for (int i = 0; i < 2 && s == NB_OK; i++) {
            z->cin[i] = take(nb_zeros_on(dev, &slot, 1, z->o.reduce_dtype), &s);
            if (s == NB_OK) z->cout[i] = take(nb_zeros_on(dev, &slot, 1, z->o.reduce_dtype), &s);
        }
    }
    for (int k = 0; k < z->nbk && s == NB_OK; k++) {
        zbucket *bk = &z->b[k];
        if (z->compress) {
            int64_t len = bk->end - bk->begin, all = z->size * ((len + z->size - 1) / z->size);
            bk->cin = take(nb_narrow(z->cin[k % 2], 0, 0, all), &s);
            if (s == NB_OK) bk->cout = take(nb_narrow(z->cout[k % 2], 0, 0, all), &s);
        }
        if (s == NB_OK && z->stage == 3) { /* the unit's whole buffer, and the shard's chunk */
            int64_t len = bk->end - bk->begin;
            bk->full = take(nb_empty_on(dev, &len, 1, dt), &s);
            int64_t n = bk->ce - bk->cb;
            if (s == NB_OK) bk->pchunk = take(nb_narrow(z->shard_p, 0, bk->soff, n), &s);
            nb_tensor *src = s == NB_OK ? take(nb_narrow(z->flat_p, 0, bk->cb, n), &s) : NULL;
            if (s == NB_OK) s = nb_copy_(bk->pchunk, src);
            nb_tensor_free(src);
            if (s == NB_OK) unit_release(z, k); /* one unit at a time on top of the flat buffer */
        } else if (s == NB_OK) {
            bk->pview = take(nb_narrow(z->flat_p, 0, bk->begin, bk->end - bk->begin), &s);
            if (s == NB_OK) bk->pchunk = take(nb_narrow(z->flat_p, 0, bk->cb, bk->ce - bk->cb), &s);
        }
        if (s == NB_OK && z->stage == 1) {
            bk->gin = take(nb_narrow(z->flat_g, 0, bk->begin, bk->end - bk->begin), &s);
            if (s == NB_OK) bk->gout = take(nb_narrow(z->flat_g, 0, bk->cb, bk->ce - bk->cb), &s);
        } else if (s == NB_OK) {
            bk->gout = take(nb_narrow(z->shard_g, 0, bk->soff, bk->ce - bk->cb), &s);
        }
    }
    return s;
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
        int64_t lo = p->off > bk->cb ? p->off : bk->cb;
        int64_t hi = p->off + p->n < bk->ce ? p->off + p->n : bk->ce;
        if (lo >= hi) continue;
        nb_tensor *piece = z->offload ? take(nb_narrow(z->host_p, 0, bk->soff + (lo - bk->cb), hi - lo), &s)
                           : z->stage == 3
                               ? take(nb_narrow(z->shard_p, 0, bk->soff + (lo - bk->cb), hi - lo), &s)
                               : take(nb_narrow(z->flat_p, 0, lo, hi - lo), &s);
        if (s != NB_OK) break;
        z->piece_param[z->npieces] = i;
        z->piece_lo[z->npieces] = lo - p->off;
        z->pieces[z->npieces++] = piece;
        nb_tensor *gsrc = z->offload ? z->host_g : z->stage == 1 ? z->flat_g : z->shard_g;
        int64_t goff = z->stage == 1 && !z->offload ? lo : bk->soff + (lo - bk->cb);
        nb_tensor *gv = take(nb_narrow(gsrc, 0, goff, hi - lo), &s);
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

/* The module that registered the parameter of this dotted name ("a.b.weight": a's child b). */
static nb_module *owner_of(nb_module *root, const char *name) {
    nb_module *m = root;
    for (const char *dot; m && (dot = strchr(name, '.'));) {
        size_t len = (size_t)(dot - name);
        nb_module *next = NULL;
        for (int i = 0; i < nb_module_num_children(m) && !next; i++) {
            const char *cn = nb_module_child_name(m, i);
            if (cn && strlen(cn) == len && strncmp(cn, name, len) == 0) next = nb_module_child_at(m, i);
        }
        m = next;
        name = dot + 1;
    }
    return m;
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

nb_zero *nb_zero_new(nb_module *model, nb_optim *opt, nb_comm *c, const nb_zero_opts *o) {
    if (!model) return nb__error(NB_ENULL, "zero_new: model is NULL"), NULL;
    if (!opt) return nb__error(NB_ENULL, "zero_new: optimizer is NULL"), NULL;
    if (!c) return nb__error(NB_ENULL, "zero_new: communicator is NULL"), NULL;
    nb_zero_opts opts = o ? *o : nb_zero_defaults();
    if (opts.stage < 0 || opts.stage > 3)
        return nb__error(NB_EINVAL, "zero_new: stage must be 0, 1, 2 or 3, got %d",
                         opts.stage), NULL;
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
    z->size = nb_comm_size(c), z->rank = nb_comm_rank(c), z->sync_enabled = true;
    z->staged_by[0] = z->staged_by[1] = -1;
    z->cslot_by[0] = z->cslot_by[1] = -1;
    z->root_pre = z->root_post = -1;
    if (opts.stage == 0) { /* plain data parallel: the optimizer is used as it is */
        z->ddp = nb_ddp_new(model, c, &(nb_ddp_opts){.bucket_mb = opts.bucket_mb,
                                                    .find_unused = opts.find_unused,
                                                    .no_broadcast = opts.no_broadcast,
                                                    .reduce_dtype = opts.reduce_dtype});
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
    z->flat_g = nb_module_flat_grads(model);
    z->dtype = z->flat_p->dtype;
    z->dev = nb__device_of(z->flat_p);
    z->offload = opts.offload_optimizer && !nb_device_equal(z->dev, NB_CPU);
    /* as nb_ddp: f32 (or f64) gradients that would travel wider than the wire dtype, or
     * f16/bf16 ones that would otherwise travel as f32 */
    z->compress = z->size > 1 && opts.reduce_dtype != NB_F32 && nb_dtype_is_float(z->dtype);
    z->p = calloc((size_t)ps->count, sizeof *z->p);
    if (!z->p) s = nb__error(NB_ENOMEM, "zero_new: out of memory");
    else z->np = ps->count;
    for (int i = 0; i < z->np; i++) {
        nb_tensor *t = ps->tensors[i];
        for (int j = 0; j < i && s == NB_OK; j++)
            if (ps->tensors[j] == t)
                s = nb__error(NB_EINVAL, "zero_new: %s and %s are the same tensor; register a "
                              "shared parameter once", ps->names[j], ps->names[i]);
        z->p[i] = (zparam){.z = z, .index = i, .t = t, .handle = -1,
                           .off = t->offset - z->flat_p->offset, .n = nb_numel(t),
                           .expected = nb_requires_grad(t), .owner = owner_of(model, ps->names[i])};
        if (!z->p[i].owner && s == NB_OK)
            s = nb__error(NB_EINTERNAL, "zero_new: no module owns %s", ps->names[i]);
        /* a tied weight is used by several modules' forwards: stage 3 keeps it gathered for
         * the whole forward and backward of the model (a unit of the root) */
        if (opts.stage == 3 && s == NB_OK && registrations(model, t) > 1) z->p[i].owner = model;
    }
    if (s == NB_OK) s = check_optim(z);
    int64_t cap = (int64_t)(opts.bucket_mb * 1048576.0 / (double)nb_dtype_size(z->flat_p->dtype));
    if (cap < 1) cap = 1;
    if (s == NB_OK) s = build_buckets(z, cap);
    /* Same model everywhere, then rank 0's weights and buffers (as nb_ddp_new). */
    if (s == NB_OK && z->size > 1) {
        int64_t v[4] = {z->np, nb_numel(z->flat_p), z->stage, (int64_t)opts.reduce_dtype};
        nb_tensor *lo = nb__scope_take(nb_from_buffer(v, (int64_t[]){4}, 1, NB_I64));
        nb_tensor *hi = nb__scope_take(nb_from_buffer(v, (int64_t[]){4}, 1, NB_I64));
        s = lo && hi ? NB_OK : nb_last_status();
        if (s == NB_OK) s = nb_allreduce(c, lo, NB_REDUCE_MIN);
        if (s == NB_OK) s = nb_allreduce(c, hi, NB_REDUCE_MAX);
        if (s == NB_OK) {
            const int64_t *l = nb_data(lo), *h = nb_data(hi);
            if (memcmp(l, h, sizeof v) != 0)
                s = nb__error(NB_EINVAL, "zero_new: the ranks wrap different models or stages "
                              "(this rank: %lld parameters, %lld elements, stage %lld, "
                              "reduce_dtype %s; across ranks: %lld..%lld parameters, "
                              "%lld..%lld elements, stage %lld..%lld, reduce_dtype %s..%s)",
                              (long long)v[0], (long long)v[1], (long long)v[2],
                              nb_dtype_name((nb_dtype)v[3]), (long long)l[0], (long long)h[0],
                              (long long)l[1], (long long)h[1], (long long)l[2],
                              (long long)h[2], nb_dtype_name((nb_dtype)l[3]),
                              nb_dtype_name((nb_dtype)h[3]));
        }
        nb_tensor_free(lo);
        nb_tensor_free(hi);
    }
    if (s == NB_OK && z->size > 1 && !opts.no_broadcast) {
        s = nb_broadcast(c, z->flat_p, 0);
        const nb_params *bs = s == NB_OK ? nb_buffers(model) : NULL;
        if (s == NB_OK && !bs) s = nb_last_status();
        for (int i = 0; s == NB_OK && i < bs->count; i++) s = nb_broadcast(c, bs->tensors[i], 0);
    }
    if (s == NB_OK && z->stage >= 2) { /* no full gradient buffer: drop the flat views */
        for (int i = 0; i < z->np; i++) nb_clear_grad(z->p[i].t);
        s = nb__module_drop_flat_grads(model);
        z->flat_g = NULL;
    }
    if (s == NB_OK) s = build_views(z);
    if (s == NB_OK) s = build_inner(z);
    for (int i = 0; i < z->np && s == NB_OK; i++) {
        zparam *p = &z->p[i];
        if (!p->expected) continue;
        if ((s = reattach(p)) != NB_OK) break;
        int h = nb_register_grad_hook(p->t, grad_hook, p);
        if (h < 0) {
            s = (nb_status)h;
            break;
        }
        p->handle = h;
        s = nb__set_grad_guard(p->t, grad_guard, p);
        if (s == NB_ESTATE)
            nb__error(s, "zero_new: parameter %s is already wrapped by an nb_ddp or nb_zero; "
                      "free that one first", ps->names[i]);
        p->guarded = s == NB_OK;
    }
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
    if (z->ddp) return nb_ddp_sync(z->ddp);
    if (z->active) {
        z->active = false;
        return finish_step(z, false);
    }
    if (z->local && z->sync_enabled) {
        reset_step(z);
        return finish_step(z, true);
    }
    if (z->last_st != NB_OK) return nb__error(z->last_st, "%s", z->last_msg);
    return NB_OK;
}

void nb_zero_set_sync_enabled(nb_zero *z, bool enabled) {
    if (!z) return;
    if (z->ddp) nb_ddp_set_sync_enabled(z->ddp, enabled);
    z->sync_enabled = enabled;
}

double nb_zero_exposed_comm_s(const nb_zero *z) {
    return !z ? 0.0 : z->ddp ? nb_ddp_exposed_comm_s(z->ddp) : z->exposed_s;
}

int64_t nb_zero_comm_bytes(const nb_zero *z) {
    if (!z) return 0;
    return z->ddp ? nb_ddp_comm_bytes(z->ddp) : z->last_wire_bytes;
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

static nb_status reduce_norm(double *total, bool max, void *ctx) {
    nb_zero *z = ctx;
    if (z->size == 1) return NB_OK;
    nb_tensor *t = nb_from_buffer(total, (int64_t[]){1}, 1, NB_F64);
    nb_status s = t ? nb_allreduce(z->c, t, max ? NB_REDUCE_MAX : NB_REDUCE_SUM) : nb_last_status();
    if (s == NB_OK) *total = *(const double *)nb_data(t);
    nb_tensor_free(nb__scope_take(t));
    return s;
}

double nb_zero_clip_grad_norm(nb_zero *z, double max_norm, double norm_type) {
    if (!z) return nb__error(NB_ENULL, "zero_clip_grad_norm: zero is NULL");
    if (z->ddp) return nb_clip_grad_norm(nb_optim_params(z->user), max_norm, norm_type);
    nb_status s = check_reduced(z, "zero_clip_grad_norm", z->np ? param_name(z, 0) : "?");
    if (s != NB_OK) return s;
    return nb__clip_grad_norm_global(nb_optim_params(z->inner), max_norm, norm_type,
                                     "zero_clip_grad_norm", reduce_norm, z);
}

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
        out->grads = bytes_of(z->shard_g);
        for (int i = 0; i < z->np; i++) out->grads += bytes_of(nb_grad(z->p[i].t)); /* local */
        out->comm_buffers = bytes_of(z->staging[0]) + bytes_of(z->staging[1]);
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

void nb__zero_copy_groups(void *ctx) {
    nb_zero *z = ctx;
    if (z && z->user && z->inner && z->user->ngroups == z->inner->ngroups)
        memcpy(z->user->groups, z->inner->groups, sizeof(nb__hyper) * (size_t)z->inner->ngroups);
}

/* ---- a model that is itself split over a second group (tensor parallel, pipeline) ------------
 * The norm: each rank sums |g|^p over the pieces of its shard whose parameter it counts
 * (o->skip false), the sum goes over z's ranks and then over model_comm (and model_comm2), and every piece is
 * scaled by the one coefficient. Two passes of nb__clip_grad_norm_global: the counted pieces
 * with no clipping (its reduce step does the two allreduces and keeps the global sum), then
 * every piece, its reduce step replaced by that sum. */
nb_zero_clip_opts nb_zero_clip_defaults(void) { return (nb_zero_clip_opts){0}; }

typedef struct clip2 {
    nb_comm *c[3];
    double total;
} clip2;

static nb_status reduce_two(double *total, bool max, void *ctx) {
    clip2 *q = ctx;
    nb_status s = NB_OK;
    for (int i = 0; i < 3 && s == NB_OK; i++) {
        if (!q->c[i] || nb_comm_size(q->c[i]) == 1) continue;
        nb_tensor *t = nb_from_buffer(total, (int64_t[]){1}, 1, NB_F64);
        s = t ? nb_allreduce(q->c[i], t, max ? NB_REDUCE_MAX : NB_REDUCE_SUM) : nb_last_status();
        if (s == NB_OK) *total = *(const double *)nb_data(t);
        nb_tensor_free(t ? nb__scope_take(t) : NULL);
    }
    q->total = *total;
    return s;
}

static nb_status reduce_fixed(double *total, bool max, void *ctx) {
    (void)max;
    *total = ((const clip2 *)ctx)->total;
    return NB_OK;
}

double nb_zero_clip_grad_norm_ex(nb_zero *z, double max_norm, double norm_type,
                                 const nb_zero_clip_opts *o) {
    static const char who[] = "zero_clip_grad_norm_ex";
    if (!z) return nb__error(NB_ENULL, "%s: zero is NULL", who);
    nb_zero_clip_opts d = nb_zero_clip_defaults();
    if (!o) o = &d;
    const nb_params *mp = nb_parameters(z->m);
    if (!mp) return nb_last_status();
    if (!z->ddp) {
        nb_status s = check_reduced(z, who, z->np ? param_name(z, 0) : "?");
        if (s != NB_OK) return s;
    }
    /* stage 0: the model's whole (averaged) gradients; else the shard's pieces */
    const nb_params *all = z->ddp ? mp : nb_optim_params(z->inner);
    if (!all) return nb_last_status();
    nb_tensor **ts = malloc(sizeof *ts * (size_t)(all->count + 1));
    const char **ns = malloc(sizeof *ns * (size_t)(all->count + 1));
    if (!ts || !ns) {
        free(ts);
        free((void *)ns);
        return nb__error(NB_ENOMEM, "%s: out of memory", who);
    }
    nb_params counted = {.tensors = ts, .names = ns};
    for (int q = 0; q < all->count; q++) {
        int i = q;
        if (!z->ddp) { /* the piece's parameter */
            int j = 0;
            while (j < z->npieces && z->pieces[j] != all->tensors[q]) j++;
            i = j < z->npieces ? z->piece_param[j] : -1;
        }
        if (o->skip && i >= 0 && i < mp->count && o->skip[i]) continue;
        ts[counted.count] = all->tensors[q];
        ns[counted.count++] = all->names[q];
    }
    clip2 q = {.c = {z->ddp ? NULL : z->c, o->model_comm, o->model_comm2}};
    double norm = nb__clip_grad_norm_global(&counted, INFINITY, norm_type, who, reduce_two, &q);
    if (!(norm < 0)) norm = nb__clip_grad_norm_global(all, max_norm, norm_type, who, reduce_fixed, &q);
    free(ts);
    free((void *)ns);
    return norm;
}

/* ---- the whole optimizer state through the template ------------------------------------------
 * Gather: per state slot (and the master copies), one flat buffer of the model's size gets
 * this rank's pieces at their places (zeros elsewhere) and is summed over the ranks (the
 * shards tile the buffer); the step counts go by a max. The whole tensors are loaded into
 * the template with nb_optim_load_state. Scatter: the template's state is cut into this
 * rank's pieces (io/zero_ckpt.c's rule), loaded into the shard optimizer, and dropped. */
static int inner_index(const nb_zero *z, int j) {
    for (int q = 0; q < z->inner->nparams; q++)
        if (z->inner->params[q].t == z->pieces[j]) return q;
    return -1;
}

static char *state_name(const char *slot, const char *param) {
    size_t n = strlen(slot) + strlen(param) + 2;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s.%s", slot, param);
    return s;
}

nb_status nb_zero_gather_optim_state(nb_zero *z) {
    static const char who[] = "zero_gather_optim_state";
    if (!z) return nb__error(NB_ENULL, "%s: zero is NULL", who);
    if (z->ddp) return NB_OK; /* stage 0: the template holds the state itself */
    if (z->stage == 3 || z->offload)
        return nb__error(NB_EINVAL, "%s: stages 1 and 2 without offload_optimizer only (stage "
                         "%d%s): use nb_zero_checkpoint_save", who, z->stage,
                         z->offload ? ", offload" : "");
    const nb_params *mp = nb_parameters(z->m);
    const nb__optim_kind *k = z->inner->kind;
    const int nslot = k->nslots + 1; /* the last: master copies */
    const int64_t N = nb_numel(z->flat_p);
    const nb_dtype wdt = nb__opt_work_dtype(z->dtype);
    nb_state_list l = {0};
    /* per parameter (on some rank): has state, its step count, and which slots it has
     * (flags[(2 + sl) np + i]; a slot can be unused in some groups) */
    const int64_t nf = (int64_t)(2 + nslot) * z->np;
    double *flags = calloc((size_t)nf + 1, sizeof *flags);
    nb_status s = flags ? NB_OK : nb__error(NB_ENOMEM, "%s: out of memory", who);
    for (int j = 0; j < z->npieces && s == NB_OK; j++) {
        int q = inner_index(z, j);
        const nb__oparam *op = q >= 0 ? &z->inner->params[q] : NULL;
        if (!op || !op->has_state) continue;
        const int i = z->piece_param[j];
        flags[i] = 1;
        if ((double)op->step > flags[z->np + i]) flags[z->np + i] = (double)op->step;
        for (int sl = 0; sl < nslot; sl++)
            if (sl < k->nslots ? op->slot[sl] != NULL : op->master != NULL)
                flags[(2 + sl) * z->np + i] = 1;
    }
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_tensor *ft = s == NB_OK ? nb_from_buffer(flags, (int64_t[]){nf}, 1, NB_F64) : NULL;
    if (s == NB_OK && !ft) s = nb_last_status();
    if (s == NB_OK && z->size > 1) s = nb_allreduce(z->c, ft, NB_REDUCE_MAX);
    if (s == NB_OK) memcpy(flags, nb_data(ft), sizeof *flags * (size_t)nf);
    for (int sl = 0; sl < nslot && s == NB_OK; sl++) {
        const double *has = flags + (size_t)(2 + sl) * (size_t)z->np;
        bool any = false; /* some rank holds this slot (the same answer on every rank) */
        for (int i = 0; i < z->np; i++) any = any || has[i] > 0;
        if (!any) continue;
        nb_tensor *flat = nb_zeros_on(z->dev, (int64_t[]){N}, 1, wdt);
        if (!flat) s = nb_last_status();
        for (int j = 0; j < z->npieces && s == NB_OK; j++) {
            int q = inner_index(z, j);
            nb_tensor *src = q < 0 || !z->inner->params[q].has_state ? NULL
                             : sl < k->nslots ? z->inner->params[q].slot[sl]
                                              : z->inner->params[q].master;
            if (!src) continue;
            nb_tensor *dst = nb_narrow(flat, 0, z->p[z->piece_param[j]].off + z->piece_lo[j],
                                       nb_numel(src));
            nb_tensor *v = nb_view(src, (int64_t[]){nb_numel(src)}, 1);
            s = dst && v ? nb_copy_(dst, v) : nb_last_status();
        }
        if (s == NB_OK && z->size > 1) s = nb_allreduce(z->c, flat, NB_REDUCE_SUM);
        for (int i = 0; i < z->np && s == NB_OK; i++) {
            if (!(flags[i] > 0) || !(has[i] > 0)) continue;
            nb_tensor *w = nb_narrow(flat, 0, z->p[i].off, z->p[i].n);
            w = w ? nb_view(w, z->p[i].t->shape, z->p[i].t->ndim) : NULL;
            char *name = state_name(sl < k->nslots ? k->slot_names[sl] : "master", mp->names[i]);
            s = !w ? nb_last_status() : !name ? nb__error(NB_ENOMEM, "%s: out of memory", who)
                                               : nb_state_list_add(&l, NULL, name, w);
            free(name);
        }
    }
    for (int i = 0; i < z->np && s == NB_OK && k->has_step; i++) {
        if (!(flags[i] > 0)) continue;
        nb_tensor *t = nb_scalar(flags[z->np + i], NB_I64);
        char *name = state_name("step", mp->names[i]);
        s = !t ? nb_last_status() : !name ? nb__error(NB_ENOMEM, "%s: out of memory", who)
                                           : nb_state_list_add(&l, NULL, name, t);
        free(name);
    }
    /* the groups' hyperparameters: the template's own (nb_optim_state names them) */
    const nb_params *us = s == NB_OK ? nb_optim_state(z->user) : NULL;
    if (s == NB_OK && !us) s = nb_last_status();
    for (int e = 0; us && s == NB_OK && e < us->count; e++)
        if (strncmp(us->names[e], "param_groups.", 13) == 0)
            s = nb_state_list_add(&l, NULL, us->names[e], us->tensors[e]);
    if (s == NB_OK)
        s = nb_optim_load_state(z->user, (const char *const *)l.names, l.tensors, l.count);
    if (us) nb_optim_state_release(z->user);
    nb_scope_end();
    nb_set_grad_enabled(prev);
    nb_state_list_deinit(&l);
    free(flags);
    return s;
}

nb_status nb_zero_scatter_optim_state(nb_zero *z) {
    static const char who[] = "zero_scatter_optim_state";
    if (!z) return nb__error(NB_ENULL, "%s: zero is NULL", who);
    if (z->ddp) return NB_OK;
    if (z->stage == 3 || z->offload)
        return nb__error(NB_EINVAL, "%s: stages 1 and 2 without offload_optimizer only (stage "
                         "%d%s)", who, z->stage, z->offload ? ", offload" : "");
    const nb_params *mp = nb_parameters(z->m);
    const nb_params *us = nb_optim_state(z->user);
    if (!us || !mp) return nb_last_status();
    nb_state_list mine = {0};
    nb_status s = NB_OK;
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    for (int e = 0; s == NB_OK && e < us->count; e++) {
        const char *name = us->names[e];
        nb_tensor *t = us->tensors[e];
        if (strncmp(name, "param_groups.", 13) == 0) {
            s = nb_state_list_add(&mine, NULL, name, t);
            continue;
        }
        const char *dot = strchr(name, '.');
        for (int j = 0; dot && s == NB_OK && j < z->npieces; j++) {
            if (strcmp(mp->names[z->piece_param[j]], dot + 1) != 0) continue;
            if (t->ndim == 0) {
                s = nb_state_list_add(&mine, NULL, name, t);
                break;
            }
            nb_tensor *c = nb_contiguous(t);
            nb_tensor *flat = c ? nb_view(c, (int64_t[]){nb_numel(t)}, 1) : NULL;
            nb_tensor *piece = flat ? nb_narrow(flat, 0, z->piece_lo[j], nb_numel(z->pieces[j])) : NULL;
            s = piece ? nb_state_list_add(&mine, NULL, name, piece) : nb_last_status();
            break;
        }
    }
    if (s == NB_OK)
        s = nb_optim_load_state(z->inner, (const char *const *)mine.names, mine.tensors, mine.count);
    nb_optim_state_release(z->user);
    nb_scope_end();
    nb_set_grad_enabled(prev);
    nb_state_list_deinit(&mine);
    if (s == NB_OK) {
        nb__zero_copy_groups(z);
        for (int i = 0; i < z->user->nparams; i++) nb__oparam_reset(&z->user->params[i]);
    }
    return s;
}
