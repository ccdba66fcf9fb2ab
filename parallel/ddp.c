/* ddp.c - distributed data parallel (nb_ddp, see nabla/parallel.h).
 *
 * How it works: the module's parameters are flattened (docs/architecture.md rule 10), so all
 * gradients are views into one flat buffer. That buffer is cut into buckets: contiguous
 * ranges starting from its END, because the last layers' gradients complete first in
 * backward. A gradient hook on every parameter counts the completed parameters of its
 * bucket; when a bucket is complete its allreduce (NB_REDUCE_AVG, on a narrow view of the
 * flat buffer, so no copies) is started asynchronously while backward goes on with the
 * earlier layers. The first hook of a backward also queues an end-of-backward callback
 * with the engine (autograd_impl.h): when the outermost nb_backward is over, it launches
 * what is left, waits for every bucket and checks the step, so the gradients are averaged
 * when nb_backward returns - nobody has to remember a sync call. The time it waits is the
 * communication that was not hidden behind backward ("exposed"). nb_ddp_sync is a wait
 * that finds nothing left to do after such a backward.
 *
 * Gradients that may not be stepped on are refused by nb_step through a gradient guard on
 * every parameter: after a backward with sync disabled whose gradients were never reduced
 * (a forgotten nb_ddp_set_sync_enabled(d, true)), or after a synchronisation that failed.
 *
 * Buckets are launched strictly in bucket order (a complete bucket waits for the ones
 * before it): collectives must be issued in the same order on every rank, and the order
 * in which hooks fire could differ between ranks when some parameters go unused.
 *
 * On a size-1 communicator nothing is communicated: the hooks only do their bookkeeping
 * (so a missing gradient is reported the same way as on N ranks) and the gradients are
 * exactly the ones backward computed.
 *
 * Trace and profiler (tensor/trace.h): "ddp bucket launch" (inside backward's hooks) and
 * "ddp bucket wait" carry the bucket number; "ddp exposed comm" is the part of the step
 * that waited for communication after backward (nb_ddp_exposed_comm_s). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "autograd/autograd_impl.h"
#include "nabla/autograd.h"
#include "nabla/parallel.h"
#include "tensor/tensor_impl.h"
#include "tensor/trace.h"

typedef struct ddp_param {
    struct nb_ddp *d;
    int index;          /* in nb_parameters order */
    int bucket;
    nb_tensor *t;       /* the parameter (borrowed from the module) */
    nb_tensor *gview;   /* its view of the flat gradient buffer (owned) */
    int handle;         /* grad hook handle, -1 if none */
    bool expected;      /* requires grad: a gradient is expected every synced step */
    bool ready;         /* its gradient completed in this step */
} ddp_param;

typedef struct ddp_bucket {
    int64_t begin, end; /* element range of the flat gradient buffer */
    nb_tensor *view;    /* narrow view of that range (owned) */
    int expected, ready;
    bool launched;
    nb_work *work;      /* in-flight allreduce (compressed: all-to-all), NULL when none */
    /* Compressed communication (reduce_dtype f16/bf16, size > 1; owned): the bucket in the
     * wire dtype, padded to size * k elements (cin), what the other ranks sent of this
     * rank's chunk (cout), and this rank's reduced chunk of k (cmine). */
    nb_tensor *cin, *cout, *cmine;
} ddp_bucket;

struct nb_ddp {
    nb_module *m;
    nb_comm *c;
    int size;
    nb_ddp_opts o;
    nb_tensor *flat_g;  /* borrowed from the module */
    int np, nbk;
    ddp_param *p;
    ddp_bucket *b;
    int next_launch;    /* buckets [0, next_launch) are launched in this step */
    int last_launched;  /* buckets launched by the last finished step (for tests) */
    bool sync_enabled;
    bool active;        /* a synced backward's hooks ran; its end has not been processed */
    bool twice;         /* a parameter completed twice before the end of the step */
    nb_status hook_err; /* first failure inside a hook (reported at the end of the step) */
    char hook_msg[512];
    /* What nb_step must refuse: local gradients (a backward with sync disabled) that no
     * synchronisation has averaged yet, or a synchronisation that failed (fail_msg). */
    bool local, failed;
    char fail_msg[512];
    nb_status last_st;  /* outcome of the last synchronisation, as nb_ddp_sync reports it */
    char last_msg[512];
    double exposed_s;
    bool compress;      /* reduce in o.reduce_dtype (f16/bf16) with f32 accumulation */
    int64_t wire_bytes, last_wire_bytes; /* gradient bytes this rank sent, this / last step */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Remember the first error raised inside a hook (hooks cannot return one). */
static void hook_fail(nb_ddp *d, nb_status s) {
    if (d->hook_err != NB_OK) return;
    d->hook_err = s ? s : NB_EINTERNAL;
    snprintf(d->hook_msg, sizeof d->hook_msg, "%s", nb_last_error());
}

/* Bytes one rank sends in a bandwidth-optimal collective over p ranks of n elements of es
 * bytes: an allreduce (ring or Rabenseifner, what MPI runs on large buffers) 2 (p-1)/p n es,
 * an all-to-all or an all-gather (p-1)/p n es each. */
static int64_t coll_bytes(int64_t n, int p, int64_t es, int phases) {
    return (int64_t)((double)phases * (double)(p - 1) / p * (double)n * (double)es);
}

/* Start bucket k's allreduce (in place, averaged over the ranks). Compressed: round the
 * bucket to the wire dtype and start the all-to-all that gives each rank every rank's copy
 * of its chunk; finish_compressed does the rest once it arrived. */
static void launch(nb_ddp *d, int k) {
    ddp_bucket *bk = &d->b[k];
    bk->launched = true;
    if (d->size == 1) return; /* the plain computation: nothing to reduce */
    int tok = NB__SPAN_BEGIN("ddp bucket launch", NULL, NB__CAT_DDP);
    int64_t n = nb_numel(bk->view);
    if (d->compress) {
        bool prev = nb_set_grad_enabled(false);
        nb_scope_begin();
        nb_tensor *head = nb_narrow(bk->cin, 0, 0, n);
        nb_status s = head ? nb_copy_(head, bk->view) : nb_last_status();
        nb_scope_end();
        nb_set_grad_enabled(prev);
        bk->work = s == NB_OK ? nb_all_to_all_async(d->c, bk->cout, bk->cin) : NULL;
        d->wire_bytes += coll_bytes(nb_numel(bk->cin), d->size,
                                    (int64_t)nb_dtype_size(bk->cin->dtype), 1);
    } else {
        bk->work = nb_allreduce_async(d->c, bk->view, NB_REDUCE_AVG);
        /* halves are summed in f32 and travel as f32 (parallel/comm_mpi.c) */
        nb_dtype dt = bk->view->dtype;
        int64_t es = dt == NB_F16 || dt == NB_BF16 ? 4 : (int64_t)nb_dtype_size(dt);
        d->wire_bytes += coll_bytes(n, d->size, es, 2);
    }
    NB__SPAN_END_ARG(tok, "bucket", k);
    if (!bk->work) hook_fail(d, nb_last_status());
}

/* The second half of a compressed bucket, after its all-to-all: add the size copies of this
 * rank's chunk in f32 (in rank order), divide by the size, round to the wire dtype,
 * all-gather the chunks and write the bucket back in the gradients' dtype. */
static nb_status finish_compressed(nb_ddp *d, ddp_bucket *bk) {
    int64_t kk = nb_numel(bk->cmine), n = nb_numel(bk->view);
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_tensor *parts = nb_to_dtype(nb_view(bk->cout, (int64_t[]){d->size, kk}, 2), NB_F32);
    nb_tensor *mean = nb_mul_scalar(nb_sum(parts, (int[]){0}, 1, false), 1.0 / d->size);
    nb_status s = mean ? nb_copy_(bk->cmine, mean) : nb_last_status();
    if (s == NB_OK) s = nb_allgather(d->c, bk->cin, bk->cmine);
    d->wire_bytes += coll_bytes(nb_numel(bk->cin), d->size,
                                (int64_t)nb_dtype_size(bk->cin->dtype), 1);
    nb_tensor *head = s == NB_OK ? nb_narrow(bk->cin, 0, 0, n) : NULL;
    if (s == NB_OK) s = head ? nb_copy_(bk->view, head) : nb_last_status();
    nb_scope_end();
    nb_set_grad_enabled(prev);
    return s;
}

/* Launch, in bucket order, every bucket that is complete and whose predecessors are out. */
static void launch_ready(nb_ddp *d) {
    while (d->next_launch < d->nbk && d->b[d->next_launch].ready == d->b[d->next_launch].expected)
        launch(d, d->next_launch++);
}

/* Make sure p's gradient lives in the flat buffer. It does unless the user replaced or
 * cleared it (nb_clear_grad, nb_set_grad): then copy it back in (or zero the slot) and
 * point the parameter at its view again, so the bucket reduces what backward computed. */
static nb_status reattach(ddp_param *p) {
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

static nb_status backward_end(void *ctx, nb_status backward_status);

static void grad_hook(nb_tensor *leaf, void *ctx) {
    ddp_param *p = ctx;
    nb_ddp *d = p->d;
    (void)leaf;
    if (!p->expected) return;
    if (!d->sync_enabled) { /* accumulation micro-step: local only */
        d->local = true;
        d->last_launched = 0;
        d->last_st = NB_OK;
        return;
    }
    if (!d->active) { /* the first hook of this backward: a new step */
        d->active = true;
        d->last_launched = 0;
        d->last_st = NB_OK;
        d->last_msg[0] = '\0';
    }
    /* Finish the step when backward ends (queued once per backward; cheap to repeat). */
    nb_status q = nb__queue_backward_end(backward_end, d);
    if (q != NB_OK) hook_fail(d, q);
    if (p->ready) { /* completed twice in one step: a backward run inside a backward */
        d->twice = true;
        return;
    }
    nb_status s = reattach(p);
    if (s != NB_OK) hook_fail(d, s);
    p->ready = true;
    d->b[p->bucket].ready++;
    launch_ready(d);
}

/* Wait for every launched bucket; returns the first failure. */
static nb_status wait_all(nb_ddp *d) {
    nb_status first = NB_OK;
    char msg[512] = "";
    for (int k = 0; k < d->nbk; k++) {
        if (!d->b[k].work) continue;
        int tok = NB__SPAN_BEGIN("ddp bucket wait", NULL, NB__CAT_DDP);
        nb_status s = nb_work_wait(d->b[k].work);
        d->b[k].work = NULL;
        if (s == NB_OK && d->compress && first == NB_OK) s = finish_compressed(d, &d->b[k]);
        NB__SPAN_END_ARG(tok, "bucket", k);
        if (s != NB_OK && first == NB_OK) {
            first = s;
            snprintf(msg, sizeof msg, "%s", nb_last_error());
        }
    }
    if (first != NB_OK) nb__error(first, "ddp: gradient allreduce failed: %s", msg);
    return first;
}

static void reset_step(nb_ddp *d) {
    for (int i = 0; i < d->np; i++) d->p[i].ready = false;
    for (int k = 0; k < d->nbk; k++) d->b[k].ready = 0, d->b[k].launched = false;
    d->last_launched = d->next_launch;
    d->next_launch = 0;
    d->last_wire_bytes = d->wire_bytes;
    d->wire_bytes = 0;
    d->active = d->twice = false;
    d->hook_err = NB_OK;
    d->hook_msg[0] = '\0';
}

void nb_ddp_free(nb_ddp *d) {
    if (!d) return;
    for (int k = 0; k < d->nbk; k++) { /* the views must outlive in-flight collectives */
        if (d->b[k].work) nb_work_wait(d->b[k].work);
        nb_tensor_free(d->b[k].view);
        nb_tensor_free(d->b[k].cin);
        nb_tensor_free(d->b[k].cout);
        nb_tensor_free(d->b[k].cmine);
    }
    for (int i = 0; i < d->np; i++) {
        if (d->p[i].handle >= 0) nb_remove_grad_hook(d->p[i].t, d->p[i].handle);
        if (d->p[i].expected) nb__set_grad_guard(d->p[i].t, NULL, &d->p[i]); /* if ours */
        nb_tensor_free(d->p[i].gview);
    }
    free(d->b);
    free(d->p);
    free(d);
}

/* Ranks must wrap the same model: compare (parameter count, flat size) across ranks. */
static nb_status check_same_model(nb_ddp *d) {
    int64_t v[2] = {d->np, nb_numel(d->flat_g)};
    nb_tensor *lo = nb__scope_take(nb_from_buffer(v, (int64_t[]){2}, 1, NB_I64));
    nb_tensor *hi = nb__scope_take(nb_from_buffer(v, (int64_t[]){2}, 1, NB_I64));
    nb_status s = lo && hi ? NB_OK : nb_last_status();
    if (s == NB_OK) s = nb_allreduce(d->c, lo, NB_REDUCE_MIN);
    if (s == NB_OK) s = nb_allreduce(d->c, hi, NB_REDUCE_MAX);
    if (s == NB_OK) {
        const int64_t *l = nb_data(lo), *h = nb_data(hi);
        if (l[0] != h[0] || l[1] != h[1])
            s = nb__error(NB_EINVAL, "ddp: the ranks wrap different models (this rank: %lld "
                          "parameters, %lld elements; across ranks: %lld..%lld parameters, "
                          "%lld..%lld elements)", (long long)v[0], (long long)v[1],
                          (long long)l[0], (long long)h[0], (long long)l[1], (long long)h[1]);
    }
    nb_tensor_free(lo);
    nb_tensor_free(hi);
    return s;
}

/* Cut the flat gradient buffer into buckets of about cap elements, from its end: walk the
 * parameters in reverse registration order and close a bucket once it holds >= cap
 * elements. A parameter is never split; bucket ranges tile [0, numel(flat)) exactly. */
static nb_status build_buckets(nb_ddp *d, int64_t cap) {
    int64_t total = nb_numel(d->flat_g);
    d->b = calloc((size_t)d->np, sizeof *d->b); /* at most one bucket per parameter */
    if (!d->b) return nb__error(NB_ENOMEM, "ddp: out of memory");
    int k = -1;
    int64_t end = total; /* lower boundary of what is assigned so far */
    for (int i = d->np - 1; i >= 0; i--) {
        ddp_param *p = &d->p[i];
        if (k < 0 || d->b[k].end - end >= cap) { /* close bucket k, open k + 1 */
            if (k >= 0) d->b[k].begin = end;
            k++;
            d->b[k].end = end;
        }
        end = p->gview->offset - d->flat_g->offset;
        p->bucket = k;
        if (p->expected) d->b[k].expected++;
    }
    d->b[k].begin = 0; /* the last bucket also covers any leading padding */
    d->nbk = k + 1;
    for (k = 0; k < d->nbk; k++) {
        nb_tensor *v = nb_narrow(d->flat_g, 0, d->b[k].begin, d->b[k].end - d->b[k].begin);
        if (!v) return nb_last_status();
        d->b[k].view = nb__scope_take(v);
    }
    return NB_OK;
}

static const char *param_name(const nb_ddp *d, int i) {
    const nb_params *ps = nb_parameters(d->m);
    return ps && i < ps->count ? ps->names[i] : "?";
}

/* nb_step asks before using a parameter's gradient. */
static nb_status grad_guard(const nb_tensor *leaf, void *ctx, const char *who) {
    const ddp_param *p = ctx;
    nb_ddp *d = p->d;
    (void)leaf;
    if (!d->local && !d->failed && !d->active) return NB_OK;
    const char *name = param_name(d, p->index);
    if (d->failed)
        return nb__error(NB_ESTATE, "%s: the gradient of '%s' (an nb_ddp model) was not "
                         "averaged over the ranks, so the ranks would drift apart: %s", who,
                         name, d->fail_msg);
    if (d->active) /* the end of backward was not processed (queueing it failed) */
        return nb__error(NB_ESTATE, "%s: the gradient of '%s' (an nb_ddp model) is not "
                         "synchronised yet; call nb_ddp_sync before the step", who, name);
    return nb__error(NB_ESTATE, "%s: the gradient of '%s' (an nb_ddp model) comes from a "
                     "backward with sync disabled and was never averaged over the ranks; "
                     "enable sync (nb_ddp_set_sync_enabled) before the last micro-step's "
                     "backward, or enable it and call nb_ddp_sync before the step", who, name);
}

nb_ddp_opts nb_ddp_defaults(void) { return (nb_ddp_opts){.bucket_mb = 25, .reduce_dtype = NB_F32}; }

/* The staging of compressed buckets: cin and cout of size * k elements (k = the chunk,
 * ceil(n / size)), zero padded, and cmine of k, in the wire dtype. */
static nb_status build_compressed(nb_ddp *d) {
    nb_device dev = nb__device_of(d->flat_g);
    for (int k = 0; k < d->nbk; k++) {
        ddp_bucket *bk = &d->b[k];
        int64_t n = nb_numel(bk->view), kk = (n + d->size - 1) / d->size, all = kk * d->size;
        nb_tensor *t[3] = {nb_zeros_on(dev, &all, 1, d->o.reduce_dtype),
                           nb_zeros_on(dev, &all, 1, d->o.reduce_dtype),
                           nb_zeros_on(dev, &kk, 1, d->o.reduce_dtype)};
        if (!t[0] || !t[1] || !t[2]) return nb_last_status();
        bk->cin = nb__scope_take(t[0]);
        bk->cout = nb__scope_take(t[1]);
        bk->cmine = nb__scope_take(t[2]);
    }
    return NB_OK;
}

nb_ddp *nb_ddp_new(nb_module *model, nb_comm *c, const nb_ddp_opts *o) {
    if (!model) return nb__error(NB_ENULL, "ddp_new: model is NULL"), NULL;
    if (!c) return nb__error(NB_ENULL, "ddp_new: communicator is NULL"), NULL;
    nb_ddp_opts opts = o ? *o : nb_ddp_defaults();
    if (!(opts.bucket_mb >= 0))
        return nb__error(NB_EINVAL, "ddp_new: bucket_mb must be >= 0, got %g", opts.bucket_mb),
               NULL;
    if (opts.reduce_dtype != NB_F32 && opts.reduce_dtype != NB_F16 &&
        opts.reduce_dtype != NB_BF16)
        return nb__error(NB_EINVAL, "ddp_new: reduce_dtype must be f32 (the gradients' own "
                         "dtype), f16 or bf16 (compressed), got %s",
                         nb_dtype_name(opts.reduce_dtype)), NULL;
    if (nb_module_flatten_parameters(model, 0) != NB_OK) return NULL;
    const nb_params *ps = nb_parameters(model);
    if (!ps) return NULL;
    for (int i = 0; i < ps->count; i++)
        for (int j = 0; j < i; j++)
            if (ps->tensors[i] == ps->tensors[j])
                return nb__error(NB_EINVAL, "ddp_new: %s and %s are the same tensor; register "
                                 "a shared parameter once", ps->names[j], ps->names[i]), NULL;

    nb_ddp *d = calloc(1, sizeof *d);
    if (!d) return nb__error(NB_ENOMEM, "ddp_new: out of memory"), NULL;
    d->m = model, d->c = c, d->o = opts, d->size = nb_comm_size(c), d->sync_enabled = true;
    d->flat_g = nb_module_flat_grads(model);
    nb_tensor *flat_p = nb_module_flat_params(model);
    d->p = calloc((size_t)ps->count, sizeof *d->p);
    if (!d->p) {
        free(d);
        return nb__error(NB_ENOMEM, "ddp_new: out of memory"), NULL;
    }
    d->np = ps->count;
    nb_status s = NB_OK;
    for (int i = 0; i < d->np && s == NB_OK; i++) {
        ddp_param *p = &d->p[i];
        nb_tensor *t = ps->tensors[i];
        *p = (ddp_param){.d = d, .index = i, .t = t, .handle = -1,
                         .expected = nb_requires_grad(t)};
        int64_t strides[NB_MAX_DIMS];
        nb__contiguous_strides(t->shape, t->ndim, strides);
        int64_t off = t->offset - flat_p->offset + d->flat_g->offset;
        nb_tensor *v = nb__view_of(d->flat_g, t->shape, strides, t->ndim, off);
        if (!v) s = nb_last_status();
        else p->gview = nb__scope_take(v);
    }
    int64_t cap = (int64_t)(opts.bucket_mb * 1048576.0 / (double)nb_dtype_size(d->flat_g->dtype));
    if (cap < 1) cap = 1;
    if (s == NB_OK) s = build_buckets(d, cap);
    /* Compression only where there is something to compress: several ranks, and a gradient
     * dtype wider than the wire's (f32 or f64 gradients), or f16/bf16 gradients that would
     * otherwise travel as f32 (reduce_dtype their own dtype). */
    d->compress = d->size > 1 && opts.reduce_dtype != NB_F32 && nb_dtype_is_float(d->flat_g->dtype);
    if (s == NB_OK && d->compress) s = build_compressed(d);
    if (s == NB_OK && d->size > 1) s = check_same_model(d);
    if (s == NB_OK && d->size > 1 && !opts.no_broadcast) {
        /* Every rank starts from rank 0's weights and buffers (e.g. running statistics). */
        s = nb_broadcast(c, flat_p, 0);
        const nb_params *bs = s == NB_OK ? nb_buffers(model) : NULL;
        if (s == NB_OK && !bs) s = nb_last_status();
        for (int i = 0; s == NB_OK && i < bs->count; i++) s = nb_broadcast(c, bs->tensors[i], 0);
    }
    for (int i = 0; i < d->np && s == NB_OK; i++) {
        ddp_param *p = &d->p[i];
        if (!p->expected) continue;
        if ((s = reattach(p)) != NB_OK) break;
        int h = nb_register_grad_hook(p->t, grad_hook, p);
        if (h < 0) s = (nb_status)h;
        else p->handle = h;
    }
    for (int i = 0; i < d->np && s == NB_OK; i++) {
        if (!d->p[i].expected) continue;
        s = nb__set_grad_guard(d->p[i].t, grad_guard, &d->p[i]);
        if (s == NB_ESTATE)
            nb__error(s, "ddp_new: parameter %s is already wrapped by another nb_ddp; free "
                      "that one first", ps->names[i]);
    }
    if (s != NB_OK) {
        nb_ddp_free(d);
        return NULL;
    }
    return d;
}

/* Finish the step: launch what is left (in bucket order), wait for every bucket and check
 * it. `all`: every parameter counts as ready (averaging gradients accumulated with sync
 * disabled, which no hook counted); otherwise one that got no gradient is an error unless
 * find_unused - its bucket is launched either way (reducing whatever its slot holds: zeros
 * after nb_zero_grad), so every rank issues the same collectives and none is left waiting. */
static nb_status finish_step(nb_ddp *d, bool all) {
    double t0 = now_s();
    int tok = NB__SPAN_BEGIN("ddp exposed comm", NULL, NB__CAT_DDP);
    int missing = 0, first_missing = -1;
    for (int i = 0; i < d->np; i++) {
        ddp_param *p = &d->p[i];
        if (!p->expected || p->ready) continue;
        if (!all && missing++ == 0) first_missing = i;
        nb_status s = reattach(p);
        if (s != NB_OK) hook_fail(d, s);
        p->ready = true;
        d->b[p->bucket].ready++;
    }
    launch_ready(d);
    nb_status s = wait_all(d);
    d->exposed_s = now_s() - t0;
    NB__SPAN_END_ARG(tok, "buckets", d->next_launch);

    if (s == NB_OK && d->hook_err != NB_OK)
        s = nb__error(d->hook_err, "ddp: starting a gradient allreduce failed: %s", d->hook_msg);
    /* Averaged everywhere, or not: what nb_step must know. */
    d->failed = s != NB_OK;
    if (d->failed) snprintf(d->fail_msg, sizeof d->fail_msg, "%s", nb_last_error());
    else d->local = false;
    if (s == NB_OK && d->twice)
        s = nb__error(NB_ESTATE, "ddp: a parameter's gradient was completed twice in one step "
                      "(a backward run from inside a backward?)");
    if (s == NB_OK && missing && !d->o.find_unused) {
        char more[64] = "";
        if (missing > 1) snprintf(more, sizeof more, " (nor did %d other parameters)", missing - 1);
        s = nb__error(NB_EINVAL, "ddp: parameter %s got no gradient in this step%s; pass "
                      ".find_unused = true if that is intended", param_name(d, first_missing),
                      more);
    }
    d->last_st = s;
    snprintf(d->last_msg, sizeof d->last_msg, "%s", s == NB_OK ? "" : nb_last_error());
    reset_step(d);
    return s;
}

/* Queued by the first hook of a synced backward; runs when the outermost backward ends. */
static nb_status backward_end(void *ctx, nb_status backward_status) {
    nb_ddp *d = ctx;
    if (!d->active) return NB_OK; /* finished already (nb_ddp_sync from inside backward) */
    d->active = false;
    if (backward_status == NB_OK) return finish_step(d, false);
    /* Backward failed part-way: wait for the buckets it started (their views must not be
     * written meanwhile; every rank that started them completes them) but start no more -
     * a rank that did not fail would otherwise step on gradients averaged with this one's
     * partial ones; it times out naming this rank instead. nb_step refuses the gradients. */
    char why[400];
    snprintf(why, sizeof why, "%s", nb_last_error());
    double t0 = now_s();
    wait_all(d);
    d->exposed_s = now_s() - t0;
    d->failed = true;
    snprintf(d->fail_msg, sizeof d->fail_msg, "backward failed before they were (%s)", why);
    d->last_st = backward_status;
    snprintf(d->last_msg, sizeof d->last_msg, "ddp: the gradients were not synchronised: "
             "backward failed (%s)", why);
    reset_step(d);
    return backward_status;
}

nb_status nb_ddp_sync(nb_ddp *d) {
    if (!d) return nb__error(NB_ENULL, "ddp_sync: ddp is NULL");
    /* A synced backward whose end was not processed (it could not queue it). */
    if (d->active) {
        d->active = false;
        return finish_step(d, false);
    }
    /* Gradients accumulated with sync disabled, now enabled: average them now. */
    if (d->local && d->sync_enabled) {
        reset_step(d);
        return finish_step(d, true);
    }
    /* Nothing left to do: backward synchronised (or sync is disabled). Report how the last
     * synchronisation went, so a caller that checks only this call still sees its error. */
    if (d->last_st != NB_OK) return nb__error(d->last_st, "%s", d->last_msg);
    return NB_OK;
}

void nb_ddp_set_sync_enabled(nb_ddp *d, bool enabled) {
    if (d) d->sync_enabled = enabled;
}

double nb_ddp_exposed_comm_s(const nb_ddp *d) { return d ? d->exposed_s : 0.0; }

int nb_ddp_num_buckets(const nb_ddp *d) { return d ? d->nbk : 0; }

int64_t nb_ddp_comm_bytes(const nb_ddp *d) { return d ? d->last_wire_bytes : 0; }

/* For tests (declared there): buckets whose allreduce has started in the current step; once
 * the step is finished, in that step (until the next backward reaches the model). */
int nb__ddp_buckets_launched(const nb_ddp *d);
int nb__ddp_buckets_launched(const nb_ddp *d) {
    return !d ? 0 : d->active ? d->next_launch : d->last_launched;
}
