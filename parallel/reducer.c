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
 * that waited for communication after backward (who: ddp or zero). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "autograd/autograd_impl.h"
#include "nabla/autograd.h"
#include "parallel/mesh_impl.h"
#include "parallel/reducer.h"
#include "tensor/tensor_impl.h"
#include "tensor/trace.h"

typedef struct rparam {
    struct nb__reducer *r;
    int index;          /* in nb_parameters order */
    int bucket;
    nb_tensor *t;       /* the parameter (borrowed from the module) */
    int64_t off, n;     /* its element range in the flat buffer (relative to its start) */
    nb_tensor *gview;   /* allreduce / scatter: its view of the flat gradient buffer (owned) */
    int handle;         /* grad hook handle, -1 if none */
    unsigned partial;   /* mesh dimensions (bits) over which its gradient is a partial sum */
    bool expected;      /* requires grad: a gradient is expected every synced step */
    bool guarded;       /* our guard is set */
    bool ready;         /* its gradient completed in this step */
    bool accumulated;   /* a backward with sync disabled gave it a gradient since the last sync */
    bool deferred;
} rparam;

typedef struct rbucket {
    int64_t begin, end; /* element range of the flat buffer */
    int64_t cb, ce;     /* this rank's chunk (scatter policies; else the whole range) */
    int64_t soff;       /* where the chunk starts in the shard */
    nb_tensor *gin;     /* allreduce / scatter: the bucket's view of the flat gradient buffer */
    nb_tensor *gout;    /* the reduced chunk (allreduce: gin; scatter: of gin; staged: of the
                         * shard gradient buffer) */
    /* compressed: the bucket in the wire dtype padded to size * k elements (cin), what the
     * other ranks sent of this rank's chunk (cout), and (allreduce) the reduced chunk in the
     * wire dtype (cmine); views of the two exchange slots under the scatter policies */
    nb_tensor *cin, *cout, *cmine;
    int expected, ready;
    bool deferred;
    bool cpending;      /* an all-to-all into cout awaits its sum */
    nb_work *work;      /* in-flight collective, NULL when none */
} rbucket;

struct nb__reducer {
    nb__reducer_cfg cfg;
    char who[8];
    nb_module *m;
    nb_comm *c;
    int size, rank;
    const nb_mesh *mesh;      /* the parameters' mesh (partial sums), or NULL */
    nb_tensor *flat_g;        /* allreduce / scatter: borrowed from the module */
    nb_dtype dtype;
    nb_device dev;
    int64_t total, cap;       /* elements of the flat buffer; bucket capacity */
    int np, nbk;
    rparam *p;
    rbucket *b;
    int64_t max_bucket, nshard;
    nb_tensor *shard_g;       /* staged (owned) */
    nb_tensor *staging[2];    /* staged (owned) */
    int staged_by[2];         /* bucket whose reduce-scatter reads staging[i], -1 none */
    bool compress;
    nb_tensor *cslot_in[2], *cslot_out[2]; /* scatter policies, compressed (owned) */
    int cslot_by[2];
    int next_launch;          /* buckets before it are launched (or deferred) in this step */
    int nlaunched;            /* buckets launched in this step */
    int last_launched;        /* buckets launched by the last finished step (for tests) */
    int ndeferred;            /* deferred buckets */
    unsigned partial_dims;    /* mesh dimensions some parameter is partial over */
    bool sync_enabled;
    bool active;              /* a synced backward's hooks ran; its end has not been processed */
    bool twice;               /* a parameter completed twice before the end of the step */
    bool stepped;             /* a backward reached the model (the layout is fixed) */
    nb_status hook_err;       /* first failure inside a hook (reported at the end of the step) */
    char hook_msg[512];
    /* What nb_step must refuse: local gradients (a backward with sync disabled) that no
     * synchronisation has reduced yet, a synchronisation that failed (fail_msg), deferred
     * buckets not synchronised yet. */
    bool local, failed, deferred_pending;
    char fail_msg[512];
    nb_status last_st;        /* outcome of the last synchronisation, as nb_*_sync reports it */
    char last_msg[512];
    double exposed_s;
    int64_t wire_bytes, last_wire_bytes; /* gradient bytes this rank sent, this / last step */
    nb_status (*relayout)(void *ctx);
    struct nb__reducer *next_live;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static bool is_ddp(const nb__reducer *r) { return r->cfg.policy == NB__RED_ALLREDUCE; }
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
static nb_status reattach(rparam *p) {
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

/* Partial gradients (sequence parallelism): summed over each mesh dimension they are
 * partial over, this rank's part of each packed into one buffer per dimension. */
static nb_status partial_sums(nb__reducer *r) {
    nb_status s = NB_OK;
    if (nb__knocked_out("partial-sum")) return NB_OK; /* a test switch (mesh_impl.h) */
    for (int d = 0; d < NB__MESH_DIMS && s == NB_OK; d++) {
        if (!(r->partial_dims & (1u << d))) continue;
        nb_comm *g = nb_mesh_group(r->mesh, nb__mesh_dim_name(d));
        if (!g) return nb_last_status();
        if (nb_comm_size(g) == 1) continue;
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
        if (s != NB_OK)
            s = nb__error(s, "%s: summing the partial gradients over %s failed: %s", r->who,
                          nb__mesh_dim_name(d), nb_last_error());
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
        nb_status s = reattach(p);
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

static void grad_hook(nb_tensor *leaf, void *ctx) {
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
    nb_status s = reattach(p);
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
static nb_status grad_guard(const nb_tensor *leaf, void *ctx, const char *who) {
    const rparam *p = ctx;
    (void)leaf;
    return nb__reducer_check(p->r, who, p->index);
}

char nb__partial_guard_ctx;

nb_status nb__partial_guard(const nb_tensor *leaf, void *ctx, const char *who) {
    (void)ctx;
    const char *dim = "tp";
    const nb__place *pl = leaf && leaf->place && !leaf->place->activation ? leaf->place : NULL;
    for (int k = 0; pl && k < pl->p.n; k++)
        if (pl->p.places[k].kind == NB_PLACE_PARTIAL) dim = pl->p.places[k].mesh_dim;
    return nb__error(NB_ESTATE, "%s: the gradient of a parameter of shape %s is a partial sum "
                     "over %.8s (sequence parallelism) that nothing summed: wrap the model with "
                     "nb_ddp_new(model, nb_mesh_group(mesh, \"dp\"), NULL) (or nb_zero_new), "
                     "which sums these after the data-parallel reduction (on one data-parallel "
                     "rank it only sums these)", who, leaf ? NB__SHAPE(leaf) : "?", dim);
}

nb_status nb__partial_guard_set(nb_tensor *t) {
    return nb__set_grad_guard(t, nb__partial_guard, &nb__partial_guard_ctx);
}

/* ---- the layout -------------------------------------------------------------------------------- */
static nb_tensor *take(nb_tensor *t, nb_status *s) {
    if (!t && *s == NB_OK) *s = nb_last_status();
    return t ? nb__scope_take(t) : NULL;
}

static void layout_free(nb__reducer *r) {
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
static nb_status layout_build(nb__reducer *r) {
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
    layout_free(r);
    for (int i = 0; r->p && i < r->np; i++) {
        rparam *p = &r->p[i];
        if (p->handle >= 0) nb_remove_grad_hook(p->t, p->handle);
        if (p->guarded) {
            nb__set_grad_guard(p->t, NULL, p);
            if (p->partial) nb__partial_guard_set(p->t); /* unwrapped: partial again */
        }
        nb_tensor_free(p->gview);
    }
    free(r->p);
    free(r);
}

/* The mesh the parameters are placed on (NULL: none), checked: one mesh, whose "dp" group is
 * c; each parameter's partial dimensions and whether it is a tied pipeline copy. */
static nb_status read_placements(nb__reducer *r, const nb_params *ps, const char *op) {
    for (int i = 0; i < r->np; i++) {
        const nb__place *pl = ps->tensors[i]->place;
        if (!pl || pl->activation || !pl->p.mesh) continue;
        if (r->mesh && pl->p.mesh != r->mesh)
            return nb__error(NB_EINVAL, "%s: the parameters are placed on two different device "
                             "meshes (%s among them); one model lives on one mesh", op,
                             ps->names[i]);
        r->mesh = pl->p.mesh;
        for (int k = 0; k < pl->p.n; k++) {
            const nb_place *e = &pl->p.places[k];
            int d = nb__mesh_dim_index(e->mesh_dim, strnlen(e->mesh_dim, sizeof e->mesh_dim));
            if (e->kind == NB_PLACE_PARTIAL && d >= 0) r->p[i].partial |= 1u << d;
            if (e->kind == NB_PLACE_REPLICATE && d == NB__DIM_PP && e->length > 1)
                r->p[i].deferred = true;
        }
        r->partial_dims |= r->p[i].partial;
    }
    if (!r->mesh) return NB_OK;
    nb_comm *dp = nb_mesh_group(r->mesh, "dp");
    if (dp != r->c && !(nb_comm_size(dp) == 1 && r->size == 1))
        return nb__error(NB_EINVAL, "%s: the parameters are placed on the mesh \"%s\", whose "
                         "data-parallel group has %d ranks, but the communicator given is not "
                         "that group (%d ranks); pass nb_mesh_group(mesh, \"dp\")", op,
                         nb_mesh_describe(r->mesh), nb_comm_size(dp), r->size);
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
    if (s == NB_OK) s = layout_build(r);
    for (int i = 0; i < r->np && s == NB_OK; i++) {
        rparam *p = &r->p[i];
        if (!p->expected) continue;
        if ((s = reattach(p)) != NB_OK) break;
        int h = nb_register_grad_hook(p->t, grad_hook, p);
        if (h < 0) {
            s = (nb_status)h;
            break;
        }
        p->handle = h;
        if (p->partial) nb__set_grad_guard(p->t, NULL, &nb__partial_guard_ctx); /* ours sums */
        s = nb__set_grad_guard(p->t, grad_guard, p);
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
    layout_free(r);
    nb_status s = layout_build(r);
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
                nb_status a = reattach(&r->p[i]);
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
