/* reducer.c - the one gradient reducer (parallel/reducer.h) under nb_ddp (allreduce per
 * bucket) and nb_zero (reduce-scatter into the shard, from the flat gradient buffer or from
 * two staging buffers).
 *
 * How it works: the module's parameters are flattened (docs/architecture.md rule 10). The
 * flat buffer is cut into buckets: contiguous ranges starting from its END, because the last
 * layers' gradients complete first in backward (a parameter is never split; the ranges tile
 * the buffer). A gradient hook on every parameter counts the completed parameters of its
 * bucket; a complete bucket is launched asynchronously (its policy's collective, on views, so
 * no copies but the staging and the compressed wire) while backward goes on with the earlier
 * layers. Buckets are launched strictly in bucket order (a complete bucket waits for the ones
 * before it): collectives must be issued in the same order on every rank, and the order in
 * which hooks fire could differ between ranks when some parameters go unused. The first hook
 * of a backward queues an end-of-backward callback (autograd_impl.h): when the outermost
 * nb_backward is over it launches what is left, waits for every bucket, sums the partial
 * gradients and checks the step, so the gradients are reduced when nb_backward returns. The
 * time it waits is the communication that was not hidden behind backward ("exposed").
 *
 * Compressed (reduce_dtype f16/bf16, several ranks): a bucket is rounded to the wire dtype and
 * an all-to-all gives each rank every rank's copy of its chunk, which it adds in f32 (rank
 * order) and divides by the size: the scatter policies write that into the gradient chunk
 * (rounded once); the allreduce policy rounds it to the wire dtype and all-gathers the
 * chunks into the bucket. The allreduce policy keeps one exchange buffer per bucket (nothing
 * waits); the scatter ones two, reused by bucket parity (bucket k waits for k - 2).
 *
 * Gradients that may not be stepped on are refused by nb_step through a gradient guard on
 * every parameter (nb_zero checks the same in its step): after a backward with sync disabled
 * whose gradients were never reduced, a synchronisation that failed, or deferred buckets not
 * synchronised yet.
 *
 * On a size-1 communicator nothing is communicated but the partial sums: the hooks only do
 * their bookkeeping (so a missing gradient is reported the same way as on N ranks) and the
 * gradients are exactly the ones backward computed.
 *
 * Trace and profiler (tensor/trace.h): "<who> bucket launch" (inside backward's hooks) and
 * "<who> bucket wait" carry the bucket number; "<who> exposed comm" is the part of the step
 * that waited for communication after backward (who: ddp or zero).
 *
 * The construction (placements, the bucket layout, the hooks attached) is in
 * parallel/reducer_setup.c; the state both files share in parallel/reducer_impl.h. */
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

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* "averaged" (nb_ddp) or "reduced" (nb_zero), and the collective's name, for messages */
static const char *verb(const nb__reducer *r) { return is_ddp(r) ? "averaged" : "reduced"; }
static const char *coll(const nb__reducer *r) {
    return is_ddp(r) ? "gradient allreduce" : "gradient reduce-scatter";
}

static const char *param_name(const nb__reducer *r, int i) {
    const nb_params *ps = nb_parameters(r->m);
    return ps && i >= 0 && i < ps->count ? ps->names[i] : "?";
}

/* Remember the first error raised inside a hook (hooks cannot return one). */
static void hook_fail(nb__reducer *r, nb_status s) {
    if (r->hook_err != NB_OK) return;
    r->hook_err = s ? s : NB_EINTERNAL;
    snprintf(r->hook_msg, sizeof r->hook_msg, "%s", nb_last_error());
}

/* Bytes one rank sends in a bandwidth-optimal collective over p ranks of n elements of es
 * bytes: an allreduce (ring or Rabenseifner, what MPI runs on large buffers) 2 (p-1)/p n es,
 * a reduce-scatter, an all-to-all or an all-gather (p-1)/p n es each. */
static int64_t coll_bytes(int64_t n, int p, int64_t es, int phases) {
    return (int64_t)((double)phases * (double)(p - 1) / p * (double)n * (double)es);
}

/* halves are summed in f32 and travel as f32 (parallel/comm_mpi.c) */
static int64_t wire_size(nb_dtype dt) {
    return dt == NB_F16 || dt == NB_BF16 ? 4 : (int64_t)nb_dtype_size(dt);
}

/* ---- launching and waiting ---------------------------------------------------------------------- */
/* Wait for bucket k's collective (if any); the first failure is kept in *first/msg. A
 * compressed bucket's exchange is summed into its gradient here. */
static nb_status finish_compressed(nb__reducer *r, rbucket *bk);

static void wait_bucket(nb__reducer *r, int k, nb_status *first, char *msg, size_t n) {
    rbucket *bk = &r->b[k];
    if (!bk->work) return;
    int tok = NB__SPAN_BEGIN(is_ddp(r) ? "ddp bucket wait" : "zero bucket wait", NULL, NB__CAT_DDP);
    nb_status s = nb_work_wait(bk->work);
    bk->work = NULL;
    if (bk->cpending) {
        bk->cpending = false;
        if (!is_ddp(r) && r->cslot_by[k % 2] == k) r->cslot_by[k % 2] = -1;
        if (s == NB_OK && *first == NB_OK) s = finish_compressed(r, bk);
    }
    NB__SPAN_END_ARG(tok, "bucket", k);
    if (s != NB_OK && *first == NB_OK) {
        *first = s;
        snprintf(msg, n, "%s", nb_last_error());
    }
}

/* The second half of a compressed bucket, after its all-to-all: add the size copies of this
 * rank's chunk in f32 (in rank order) and divide by the size. Scatter policies: the mean,
 * rounded once, is the chunk's gradient. Allreduce: rounded to the wire dtype, the chunks are
 * all-gathered and the bucket written back in the gradients' dtype. */
static nb_status finish_compressed(nb__reducer *r, rbucket *bk) {
    int64_t kk = nb_numel(bk->cout) / r->size, n = bk->end - bk->begin, mine = bk->ce - bk->cb;
    if (!is_ddp(r) && mine <= 0) return NB_OK;
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_tensor *parts = nb_to_dtype(nb_view(bk->cout, (int64_t[]){r->size, kk}, 2), NB_F32);
    nb_tensor *mean = nb_mul_scalar(nb_sum(parts, (int[]){0}, 1, false), 1.0 / r->size);
    nb_status s;
    if (is_ddp(r)) {
        s = mean ? nb_copy_(bk->cmine, mean) : nb_last_status();
        if (s == NB_OK) s = nb_allgather(r->c, bk->cin, bk->cmine);
        r->wire_bytes += coll_bytes(nb_numel(bk->cin), r->size,
                                    (int64_t)nb_dtype_size(bk->cin->dtype), 1);
        nb_tensor *head = s == NB_OK ? nb_narrow(bk->cin, 0, 0, n) : NULL;
        if (s == NB_OK) s = head ? nb_copy_(bk->gin, head) : nb_last_status();
    } else {
        nb_tensor *head = mean ? nb_narrow(mean, 0, 0, mine) : NULL;
        s = head ? nb_copy_(bk->gout, head) : nb_last_status();
    }
    nb_scope_end();
    nb_set_grad_enabled(prev);
    return s;
}

/* Staged: pack bucket k's gradients into a staging buffer and drop them. */
static nb_status stage_grads(nb__reducer *r, int k, nb_tensor **in) {
    int slot = k % 2;
    rbucket *bk = &r->b[k];
    if (r->staged_by[slot] >= 0) { /* another bucket's reduce-scatter still reads it */
        nb_status first = NB_OK;
        char msg[512];
        wait_bucket(r, r->staged_by[slot], &first, msg, sizeof msg);
        r->staged_by[slot] = -1;
        if (first != NB_OK) return nb__error(first, "%s: %s failed: %s", r->who, coll(r), msg);
    }
    nb_tensor *buf = nb_narrow(r->staging[slot], 0, 0, bk->end - bk->begin);
    if (!buf) return nb_last_status();
    nb_status s = nb_fill_(buf, 0); /* padding, and parameters without a gradient */
    for (int i = 0; i < r->np && s == NB_OK; i++) {
        rparam *p = &r->p[i];
        if (p->bucket != k || !p->expected) continue;
        nb_tensor *g = nb_grad(p->t);
        if (!g) continue;
        nb_tensor *dst = nb_narrow(buf, 0, p->off - bk->begin, p->n);
        dst = dst ? nb_view(dst, p->t->shape, p->t->ndim) : NULL;
        s = dst ? nb_copy_(dst, g) : nb_last_status();
        if (s == NB_OK) nb_clear_grad(p->t);
    }
    r->staged_by[slot] = k;
    *in = buf;
    return s;
}

/* Compressed: round bucket k's gradient (in) to the wire dtype into its exchange buffer, zero
 * padded to size * ceil(len / size), and start the all-to-all that gives each rank every
 * rank's copy of its chunk; wait_bucket sums them once they arrived. */
static nb_status start_compressed(nb__reducer *r, int k, nb_tensor *in) {
    rbucket *bk = &r->b[k];
    int slot = k % 2;
    if (!is_ddp(r) && r->cslot_by[slot] >= 0) { /* bucket k - 2's exchange still uses it */
        nb_status first = NB_OK;
        char msg[512];
        wait_bucket(r, r->cslot_by[slot], &first, msg, sizeof msg);
        r->cslot_by[slot] = -1;
        if (first != NB_OK) return nb__error(first, "%s: gradient reduction failed: %s", r->who, msg);
    }
    int64_t n = bk->end - bk->begin, all = nb_numel(bk->cin);
    nb_tensor *head = nb_narrow(bk->cin, 0, 0, n);
    nb_status s = head ? nb_copy_(head, in) : nb_last_status();
    if (s == NB_OK && all > n && !is_ddp(r)) { /* a shared slot: clear another bucket's tail */
        nb_tensor *tail = nb_narrow(bk->cin, 0, n, all - n);
        s = tail ? nb_fill_(tail, 0) : nb_last_status();
    }
    if (r->cfg.policy == NB__RED_STAGED) r->staged_by[slot] = -1; /* staging is free again */
    if (s != NB_OK) return s;
    bk->work = nb_all_to_all_async(r->c, bk->cout, bk->cin);
    if (!bk->work) return nb_last_status();
    bk->cpending = true;
    if (!is_ddp(r)) r->cslot_by[slot] = k;
    r->wire_bytes += coll_bytes(all, r->size, (int64_t)nb_dtype_size(r->cfg.reduce_dtype), 1);
    return NB_OK;
}

/* Start bucket k's reduction. */
static void launch(nb__reducer *r, int k) {
    rbucket *bk = &r->b[k];
    r->nlaunched++;
    /* one rank: the plain computation (the chunk is the bucket), except that staging moves
     * the gradients into the shard */
    if (r->size == 1 && r->cfg.policy != NB__RED_STAGED) return;
    int tok = NB__SPAN_BEGIN(is_ddp(r) ? "ddp bucket launch" : "zero bucket launch", NULL,
                             NB__CAT_DDP);
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_tensor *in = bk->gin;
    nb_status s = NB_OK;
    if (r->cfg.policy == NB__RED_STAGED) s = stage_grads(r, k, &in);
    if (s == NB_OK && r->compress) {
        s = start_compressed(r, k, in);
    } else if (s == NB_OK && is_ddp(r)) {
        bk->work = nb_allreduce_async(r->c, bk->gin, NB_REDUCE_AVG);
        if (!bk->work) s = nb_last_status();
        r->wire_bytes += coll_bytes(bk->end - bk->begin, r->size, wire_size(r->dtype), 2);
    } else if (s == NB_OK) {
        bk->work = nb_reduce_scatter_async(r->c, bk->gout, in, NB_REDUCE_AVG);
        if (!bk->work) s = nb_last_status();
        r->wire_bytes += coll_bytes(bk->end - bk->begin, r->size, wire_size(r->dtype), 1);
    }
    nb_scope_end();
    nb_set_grad_enabled(prev);
    NB__SPAN_END_ARG(tok, "bucket", k);
    if (s != NB_OK) hook_fail(r, s);
}

/* Launch, in bucket order, every bucket that is complete and whose predecessors are out
 * (deferred buckets are passed over: nb__reducer_sync_deferred launches them). */
static void launch_ready(nb__reducer *r) {
    while (r->next_launch < r->nbk) {
        rbucket *bk = &r->b[r->next_launch];
        if (!bk->deferred && bk->ready != bk->expected) break;
        if (!bk->deferred) launch(r, r->next_launch);
        r->next_launch++;
    }
}

/* Wait for every launched bucket; returns the first failure. */
static nb_status wait_all(nb__reducer *r) {
    nb_status first = NB_OK;
    char msg[512] = "";
    for (int k = 0; k < r->nbk; k++) wait_bucket(r, k, &first, msg, sizeof msg);
    r->staged_by[0] = r->staged_by[1] = -1;
    r->cslot_by[0] = r->cslot_by[1] = -1;
    if (first != NB_OK) nb__error(first, "%s: %s failed: %s", r->who, coll(r), msg);
    return first;
}

/* Make sure p's gradient lives in the flat buffer (allreduce, scatter). It does unless the
 * user replaced or cleared it (nb_clear_grad, nb_set_grad): then copy it back in (or zero
 * the slot) and point the parameter at its view again, so the bucket reduces what backward
 * computed. */
nb_status nb__reducer_reattach(rparam *p) {
    if (!p->gview) return NB_OK;
    nb_tensor *g = nb_grad(p->t);
    if (g == p->gview) return NB_OK;
    if (g && g->storage == p->gview->storage && g->offset == p->gview->offset &&
        nb_is_contiguous(g))
        return NB_OK;
    bool prev = nb_set_grad_enabled(false);
    nb_status s = g ? nb_copy_(p->gview, g) : nb_fill_(p->gview, 0);
    nb_set_grad_enabled(prev);
    return s == NB_OK ? nb_set_grad(p->t, p->gview) : s;
}

/* ---- finishing a step ------------------------------------------------------------------------ */
/* This rank's part of parameter i's reduced gradient: a 1-D view (the caller's), and where
 * it starts in the parameter (*lo). Allreduce: the whole gradient. */
static nb_tensor *piece_grad(const nb__reducer *r, int i, int64_t *lo) {
    const rparam *p = &r->p[i];
    const rbucket *bk = &r->b[p->bucket];
    int64_t a = p->off > bk->cb ? p->off : bk->cb;
    int64_t e = p->off + p->n < bk->ce ? p->off + p->n : bk->ce;
    if (e < a) e = a;
    if (lo) *lo = a - p->off;
    if (r->cfg.policy == NB__RED_STAGED) {
        int64_t at = bk->soff + (a - bk->cb);
        if (at > r->nshard) at = r->nshard;
        return nb_narrow(r->shard_g, 0, at, e - a);
    }
    return nb_narrow(r->flat_g, 0, a, e - a);
}

nb_tensor *nb__reducer_piece_grad(const nb__reducer *r, int i, int64_t *lo) {
    if (!r || i < 0 || i >= r->np) {
        nb__error(NB_EINVAL, "reducer: no parameter %d", i);
        return NULL;
    }
    nb_tensor *v = piece_grad(r, i, lo);
    return v ? nb__scope_take(v) : NULL;
}

/* Partial gradients (sequence parallelism; the copies of a piece several ranks hold): summed
 * over each group they are partial over (a mesh dimension, or a piece's copies), this rank's
 * part of each packed into one buffer per group, the groups in the order setup met them. */
static nb_status partial_sums(nb__reducer *r) {
    nb_status s = NB_OK;
    if (nb__knocked_out("partial-sum")) return NB_OK; /* a test switch (mesh_impl.h) */
    for (int d = 0; d < r->nsums && s == NB_OK; d++) {
        nb_comm *g = r->sums[d].c;
        if (r->sums[d].copies > 1 && nb__knocked_out("copies-sum")) continue;
        bool prev = nb_set_grad_enabled(false);
        nb_scope_begin();
        int64_t total = 0;
        for (int i = 0; i < r->np; i++) {
            if (!r->p[i].expected || !(r->p[i].partial & (1u << d))) continue;
            nb_tensor *v = piece_grad(r, i, NULL);
            if (!v) s = nb_last_status();
            else total += nb_numel(v);
        }
        nb_tensor *buf = s == NB_OK && total ? nb_empty_on(r->dev, &total, 1, r->dtype) : NULL;
        if (s == NB_OK && total && !buf) s = nb_last_status();
        int64_t at = 0;
        for (int pass = 0; pass < 2 && buf && s == NB_OK; pass++) { /* pack, sum, unpack */
            if (pass == 1) {
                s = nb_allreduce(g, buf, NB_REDUCE_SUM);
                r->wire_bytes += coll_bytes(total, nb_comm_size(g), wire_size(r->dtype), 2);
                at = 0;
            }
            for (int i = 0; i < r->np && s == NB_OK; i++) {
                if (!r->p[i].expected || !(r->p[i].partial & (1u << d))) continue;
                nb_tensor *v = piece_grad(r, i, NULL);
                int64_t n = v ? nb_numel(v) : 0;
                nb_tensor *w = v ? nb_narrow(buf, 0, at, n) : NULL;
                s = !w ? nb_last_status() : pass == 0 ? nb_copy_(w, v) : nb_copy_(v, w);
                at += n;
            }
        }
        if (s != NB_OK && r->sums[d].copies > 1)
            s = nb__error(s, "%s: summing the partial gradients of pieces held by %d ranks of "
                          "%s failed: %s", r->who, r->sums[d].copies,
                          nb__mesh_dim_name(r->sums[d].dim), nb_last_error());
        else if (s != NB_OK)
            s = nb__error(s, "%s: summing the partial gradients over %s failed: %s", r->who,
                          nb__mesh_dim_name(r->sums[d].dim), nb_last_error());
        nb_scope_end();
        nb_set_grad_enabled(prev);
    }
    return s;
}

/* The step's data-parallel reduction is done: partial sums, then the caller's after_reduce. */
static nb_status complete(nb__reducer *r) {
    nb_status s = partial_sums(r);
    if (s == NB_OK && r->cfg.after_reduce) s = r->cfg.after_reduce(r->cfg.ctx);
    return s;
}

static void roll_bytes(nb__reducer *r) {
    r->last_wire_bytes = r->wire_bytes;
    r->wire_bytes = 0;
}

static void reset_step(nb__reducer *r) {
    for (int i = 0; i < r->np; i++) r->p[i].ready = r->p[i].accumulated = false;
    for (int k = 0; k < r->nbk; k++) r->b[k].ready = 0;
    r->last_launched = r->nlaunched;
    r->next_launch = r->nlaunched = 0;
    r->active = r->twice = false;
    r->hook_err = NB_OK;
    r->hook_msg[0] = '\0';
}

/* Finish the step: launch what is left (in bucket order), wait for every bucket, sum the
 * partial gradients and check it. `all`: every parameter counts as ready (reducing gradients
 * accumulated with sync disabled, which no hook counted); otherwise one that got no gradient
 * (and none while sync was disabled since the last sync) is an error unless find_unused -
 * its bucket is launched either way (reducing whatever its slot holds: zeros after
 * nb_zero_grad), so every rank issues the same collectives and none is left waiting. With
 * deferred buckets the reduction completes in nb__reducer_sync_deferred. */
static nb_status finish_step(nb__reducer *r, bool all) {
    double t0 = now_s();
    int tok = NB__SPAN_BEGIN(is_ddp(r) ? "ddp exposed comm" : "zero exposed comm", NULL,
                             NB__CAT_DDP);
    int missing = 0, first_missing = -1;
    for (int i = 0; i < r->np; i++) {
        rparam *p = &r->p[i];
        if (!p->expected || p->ready) continue;
        if (!all && !p->accumulated && missing++ == 0) first_missing = i;
        nb_status s = nb__reducer_reattach(p);
        if (s != NB_OK) hook_fail(r, s);
        p->ready = true;
        r->b[p->bucket].ready++;
    }
    launch_ready(r);
    nb_status s = wait_all(r);
    if (s == NB_OK && r->hook_err != NB_OK)
        s = nb__error(r->hook_err, "%s: starting a %s failed: %s", r->who, coll(r), r->hook_msg);
    bool pending = s == NB_OK && r->ndeferred > 0;
    if (s == NB_OK && !pending) s = complete(r);
    r->exposed_s = now_s() - t0;
    NB__SPAN_END_ARG(tok, "buckets", r->nlaunched);
    /* Reduced everywhere, or not: what nb_step must know. */
    r->failed = s != NB_OK;
    if (r->failed) snprintf(r->fail_msg, sizeof r->fail_msg, "%s", nb_last_error());
    else r->local = false;
    r->deferred_pending = pending;
    if (s == NB_OK && r->twice)
        s = nb__error(NB_ESTATE, "%s: a parameter's gradient was completed twice in one step "
                      "(a backward run from inside a backward?)", r->who);
    if (s == NB_OK && missing && !r->cfg.find_unused) {
        char more[64] = "";
        if (missing > 1) snprintf(more, sizeof more, " (nor did %d other parameters)", missing - 1);
        s = nb__error(NB_EINVAL, "%s: parameter %s got no gradient in this step%s; pass "
                      ".find_unused = true if that is intended", r->who,
                      param_name(r, first_missing), more);
    }
    r->last_st = s;
    snprintf(r->last_msg, sizeof r->last_msg, "%s", s == NB_OK ? "" : nb_last_error());
    reset_step(r);
    if (!pending) roll_bytes(r);
    return s;
}

/* Queued by the first hook of a synced backward; runs when the outermost backward ends. */
static nb_status backward_end(void *ctx, nb_status backward_status) {
    nb__reducer *r = ctx;
    if (!r->active) return NB_OK; /* finished already (a sync from inside backward) */
    r->active = false;
    if (backward_status == NB_OK) return finish_step(r, false);
    /* Backward failed part-way: wait for the buckets it started (their views must not be
     * written meanwhile; every rank that started them completes them) but start no more -
     * a rank that did not fail would otherwise step on gradients reduced with this one's
     * partial ones; it times out naming this rank instead. nb_step refuses the gradients. */
    char why[400];
    snprintf(why, sizeof why, "%s", nb_last_error());
    double t0 = now_s();
    wait_all(r);
    r->exposed_s = now_s() - t0;
    r->failed = true;
    r->deferred_pending = false;
    snprintf(r->fail_msg, sizeof r->fail_msg, "backward failed before they were (%s)", why);
    r->last_st = backward_status;
    snprintf(r->last_msg, sizeof r->last_msg, "%s: the gradients were not synchronised: "
             "backward failed (%s)", r->who, why);
    reset_step(r);
    roll_bytes(r);
    return backward_status;
}

void nb__reducer_grad_hook(nb_tensor *leaf, void *ctx) {
    rparam *p = ctx;
    nb__reducer *r = p->r;
    (void)leaf;
    if (r->cfg.on_grad) r->cfg.on_grad(r->cfg.ctx, p->index);
    if (!p->expected) return;
    r->stepped = true;
    if (!r->sync_enabled) { /* accumulation micro-step: local only */
        r->local = true;
        p->accumulated = true;
        r->last_launched = 0;
        r->last_st = NB_OK;
        return;
    }
    if (!r->active) { /* the first hook of this backward: a new step */
        r->active = true;
        r->last_launched = 0;
        r->last_st = NB_OK;
        r->last_msg[0] = '\0';
    }
    /* Finish the step when backward ends (queued once per backward; cheap to repeat). */
    nb_status q = nb__queue_backward_end(backward_end, r);
    if (q != NB_OK) hook_fail(r, q);
    if (p->ready) { /* completed twice in one step: a backward run inside a backward */
        r->twice = true;
        return;
    }
    nb_status s = nb__reducer_reattach(p);
    if (s != NB_OK) hook_fail(r, s);
    p->ready = true;
    r->b[p->bucket].ready++;
    launch_ready(r);
}

/* ---- guards ------------------------------------------------------------------------------------ */
nb_status nb__reducer_check(const nb__reducer *r, const char *who, int param) {
    if (!r->local && !r->failed && !r->active && !r->deferred_pending) return NB_OK;
    const char *name = param_name(r, param < 0 ? 0 : param);
    const char *api = is_ddp(r) ? "ddp" : "zero";
    if (r->failed)
        return nb__error(NB_ESTATE, "%s: the gradient of '%s' (an nb_%s model) was not %s over "
                         "the ranks, so the ranks would drift apart: %s", who, name, api,
                         verb(r), r->fail_msg);
    if (r->active) /* the end of backward was not processed (queueing it failed) */
        return nb__error(NB_ESTATE, "%s: the gradient of '%s' (an nb_%s model) is not "
                         "synchronised yet; call nb_%s_sync before the step", who, name, api, api);
    if (r->local)
        return nb__error(NB_ESTATE, "%s: the gradient of '%s' (an nb_%s model) comes from a "
                         "backward with sync disabled and was never %s over the ranks; enable "
                         "sync (nb_%s_set_sync_enabled) before the last micro-step's backward, "
                         "or enable it and call nb_%s_sync before the step", who, name, api,
                         verb(r), api, api);
    return nb__error(NB_ESTATE, "%s: the gradients of the nb_%s model are not synchronised yet: "
                     "the reduction of its deferred (tied) parameters waits until their copies "
                     "are summed (nb__reducer_sync_deferred, which the pipeline calls)", who, api);
}

/* nb_step asks before using a parameter's gradient. */
nb_status nb__reducer_grad_guard(const nb_tensor *leaf, void *ctx, const char *who) {
    const rparam *p = ctx;
    (void)leaf;
    return nb__reducer_check(p->r, who, p->index);
}

char nb__partial_guard_ctx;

nb_status nb__partial_guard(const nb_tensor *leaf, void *ctx, const char *who) {
    (void)ctx;
    const char *dim = "tp";
    char why[96] = "sequence parallelism";
    const nb__place *pl = leaf && leaf->place && !leaf->place->activation ? leaf->place : NULL;
    for (int k = 0; pl && k < pl->p.n; k++) {
        const nb_place *e = &pl->p.places[k];
        if (e->kind == NB_PLACE_PARTIAL) dim = e->mesh_dim;
        if (nb__place_copies(e) > 1) {
            dim = e->mesh_dim;
            snprintf(why, sizeof why, "a piece %d ranks hold, each with its own part of the "
                     "gradient", e->copies);
        }
    }
    return nb__error(NB_ESTATE, "%s: the gradient of a parameter of shape %s is a partial sum "
                     "over %.8s (%s) that nothing summed: wrap the model with "
                     "nb_ddp_new(model, nb_mesh_group(mesh, \"dp\"), NULL) (or nb_zero_new), "
                     "which sums these after the data-parallel reduction (on one data-parallel "
                     "rank it only sums these)", who, leaf ? NB__SHAPE(leaf) : "?", dim, why);
}

nb_status nb__partial_guard_set(nb_tensor *t) {
    return nb__set_grad_guard(t, nb__partial_guard, &nb__partial_guard_ctx);
}

/* ---- the rest --------------------------------------------------------------------------------- */
int nb__reducer_num_buckets(const nb__reducer *r) { return r ? r->nbk : 0; }

void nb__reducer_bucket(const nb__reducer *r, int k, int64_t *begin, int64_t *end, int64_t *cb,
                        int64_t *ce, int64_t *soff) {
    const rbucket *bk = &r->b[k];
    *begin = bk->begin, *end = bk->end, *cb = bk->cb, *ce = bk->ce, *soff = bk->soff;
}

int nb__reducer_param_bucket(const nb__reducer *r, int i) { return r->p[i].bucket; }
nb_tensor *nb__reducer_bucket_grad(const nb__reducer *r, int k) { return r->b[k].gout; }
int64_t nb__reducer_shard_numel(const nb__reducer *r) { return r->nshard; }
nb_tensor *nb__reducer_shard_grad(const nb__reducer *r) { return r->shard_g; }
int64_t nb__reducer_staging_bytes(const nb__reducer *r) {
    int64_t n = 0;
    for (int i = 0; i < 2; i++)
        if (r->staging[i]) n += nb_numel(r->staging[i]) * (int64_t)nb_dtype_size(r->dtype);
    return n;
}

nb_status nb__reducer_sync(nb__reducer *r) {
    /* A synced backward whose end was not processed (it could not queue it). */
    if (r->active) {
        r->active = false;
        return finish_step(r, false);
    }
    /* Gradients accumulated with sync disabled, now enabled: reduce them now. */
    if (r->local && r->sync_enabled) {
        reset_step(r);
        return finish_step(r, true);
    }
    /* Nothing left to do: backward synchronised (or sync is disabled). Report how the last
     * synchronisation went, so a caller that checks only this call still sees its error. */
    if (r->last_st != NB_OK) return nb__error(r->last_st, "%s", r->last_msg);
    return NB_OK;
}

void nb__reducer_set_sync(nb__reducer *r, bool enabled) {
    if (r) r->sync_enabled = enabled;
}
bool nb__reducer_sync_enabled(const nb__reducer *r) { return r && r->sync_enabled; }
double nb__reducer_exposed_s(const nb__reducer *r) { return r ? r->exposed_s : 0.0; }
int64_t nb__reducer_comm_bytes(const nb__reducer *r) { return r ? r->last_wire_bytes : 0; }
int nb__reducer_launched(const nb__reducer *r) {
    return !r ? 0 : r->active ? r->nlaunched : r->last_launched;
}
bool nb__reducer_param_deferred(const nb__reducer *r, int i) {
    return r && i >= 0 && i < r->np && r->p[i].deferred;
}

void nb__reducer_set_relayout(nb__reducer *r, nb_status (*relayout)(void *ctx)) {
    if (r) r->relayout = relayout;
}

nb_status nb__reducer_defer(nb__reducer *r, nb_tensor *const *params, int n) {
    if (!r) return nb__error(NB_ENULL, "reducer_defer: the reducer is NULL");
    if (n > 0 && !params) return nb__error(NB_ENULL, "reducer_defer: params is NULL");
    if (r->stepped || r->active || r->local)
        return nb__error(NB_ESTATE, "%s: deferring parameters changes the buckets; do it before "
                         "the first backward", r->who);
    if (r->cfg.owners)
        return nb__error(NB_EUNSUPPORTED, "%s: ZeRO stage 3 buckets are its modules' units; "
                         "its parameters cannot be deferred", r->who);
    for (int j = 0; j < n; j++) { /* all known before any changes */
        int i = 0;
        while (i < r->np && r->p[i].t != params[j]) i++;
        if (i == r->np)
            return nb__error(NB_EINVAL, "%s: tensor %d to defer is not a parameter of the "
                             "wrapped model", r->who, j);
    }
    bool changed = false;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < r->np; i++)
            if (r->p[i].t == params[j] && !r->p[i].deferred) r->p[i].deferred = changed = true;
    if (!changed) return NB_OK;
    nb__reducer_layout_free(r);
    nb_status s = nb__reducer_layout_build(r);
    if (s == NB_OK && r->relayout) s = r->relayout(r->cfg.ctx);
    return s;
}

nb_status nb__reducer_sync_deferred(nb__reducer *r) {
    if (!r) return nb__error(NB_ENULL, "reducer_sync_deferred: the reducer is NULL");
    if (!r->deferred_pending) return NB_OK;
    double t0 = now_s();
    int tok = NB__SPAN_BEGIN(is_ddp(r) ? "ddp exposed comm" : "zero exposed comm", NULL,
                             NB__CAT_DDP);
    r->hook_err = NB_OK;
    for (int k = 0; k < r->nbk; k++) {
        if (!r->b[k].deferred) continue;
        for (int i = 0; i < r->np; i++) /* the caller may have replaced the gradient */
            if (r->p[i].bucket == k && r->p[i].expected) {
                nb_status a = nb__reducer_reattach(&r->p[i]);
                if (a != NB_OK) hook_fail(r, a);
            }
        if (r->hook_err == NB_OK) launch(r, k);
    }
    r->nlaunched = 0; /* the count is the hooks' (tests) */
    nb_status s = wait_all(r);
    if (s == NB_OK && r->hook_err != NB_OK)
        s = nb__error(r->hook_err, "%s: starting a %s failed: %s", r->who, coll(r), r->hook_msg);
    if (s == NB_OK) s = complete(r);
    r->hook_err = NB_OK;
    r->exposed_s += now_s() - t0;
    NB__SPAN_END_ARG(tok, "buckets", r->ndeferred);
    r->deferred_pending = false;
    r->failed = s != NB_OK;
    if (r->failed) snprintf(r->fail_msg, sizeof r->fail_msg, "%s", nb_last_error());
    r->last_st = s;
    snprintf(r->last_msg, sizeof r->last_msg, "%s", s == NB_OK ? "" : nb_last_error());
    roll_bytes(r);
    return s;
}
