/* ddp.c - distributed data parallel (nb_ddp, see nabla/parallel.h).
 *
 * How it works: the module's parameters are flattened (DESIGN.md rule 10), so all
 * gradients are views into one flat buffer. That buffer is cut into buckets: contiguous
 * ranges starting from its END, because the last layers' gradients complete first in
 * backward. A gradient hook on every parameter counts the completed parameters of its
 * bucket; when a bucket is complete its allreduce (NB_REDUCE_AVG, on a narrow view of the
 * flat buffer, so no copies) is started asynchronously while backward goes on with the
 * earlier layers. nb_ddp_sync waits for the buckets, and the time it waits is the
 * communication that was not hidden behind backward ("exposed").
 *
 * Buckets are launched strictly in bucket order (a complete bucket waits for the ones
 * before it): collectives must be issued in the same order on every rank, and the order
 * in which hooks fire could differ between ranks when some parameters go unused.
 *
 * On a size-1 communicator nothing is communicated: the hooks only do their bookkeeping
 * (so a missing gradient is reported the same way as on N ranks) and the gradients are
 * exactly the ones backward computed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nabla/autograd.h"
#include "nabla/parallel.h"
#include "tensor/tensor_impl.h"

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
    nb_work *work;      /* in-flight allreduce, NULL when none (or size 1) */
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
    bool sync_enabled;
    bool active;        /* some hook did its work since the last sync */
    bool twice;         /* a parameter completed twice before a sync */
    nb_status hook_err; /* first failure inside a hook (reported by sync) */
    char hook_msg[512];
    double exposed_s;
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

/* Start bucket k's allreduce (in place, averaged over the ranks). */
static void launch(nb_ddp *d, int k) {
    ddp_bucket *bk = &d->b[k];
    bk->launched = true;
    if (d->size == 1) return; /* the plain computation: nothing to reduce */
    bk->work = nb_allreduce_async(d->c, bk->view, NB_REDUCE_AVG);
    if (!bk->work) hook_fail(d, nb_last_status());
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

static void grad_hook(nb_tensor *leaf, void *ctx) {
    ddp_param *p = ctx;
    nb_ddp *d = p->d;
    (void)leaf;
    if (!d->sync_enabled || !p->expected) return; /* accumulation micro-step: local only */
    d->active = true;
    if (p->ready) { /* a second backward before nb_ddp_sync */
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
        nb_status s = nb_work_wait(d->b[k].work);
        d->b[k].work = NULL;
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
    d->next_launch = 0;
    d->active = d->twice = false;
    d->hook_err = NB_OK;
    d->hook_msg[0] = '\0';
}

void nb_ddp_free(nb_ddp *d) {
    if (!d) return;
    for (int k = 0; k < d->nbk; k++) { /* the views must outlive in-flight collectives */
        if (d->b[k].work) nb_work_wait(d->b[k].work);
        nb_tensor_free(d->b[k].view);
    }
    for (int i = 0; i < d->np; i++) {
        if (d->p[i].handle >= 0) nb_remove_grad_hook(d->p[i].t, d->p[i].handle);
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

nb_ddp_opts nb_ddp_defaults(void) { return (nb_ddp_opts){.bucket_mb = 25}; }

nb_ddp *nb_ddp_new(nb_module *model, nb_comm *c, const nb_ddp_opts *o) {
    if (!model) return nb__error(NB_ENULL, "ddp_new: model is NULL"), NULL;
    if (!c) return nb__error(NB_ENULL, "ddp_new: communicator is NULL"), NULL;
    nb_ddp_opts opts = o ? *o : nb_ddp_defaults();
    if (!(opts.bucket_mb >= 0))
        return nb__error(NB_EINVAL, "ddp_new: bucket_mb must be >= 0, got %g", opts.bucket_mb),
               NULL;
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
    if (s != NB_OK) {
        nb_ddp_free(d);
        return NULL;
    }
    return d;
}

nb_status nb_ddp_sync(nb_ddp *d) {
    if (!d) return nb__error(NB_ENULL, "ddp_sync: ddp is NULL");
    double t0 = now_s();
    d->exposed_s = 0;
    /* Nothing happened since the last sync while accumulating locally: nothing to do. */
    if (!d->sync_enabled && !d->active && d->next_launch == 0) return NB_OK;

    /* Parameters that got no gradient: an error unless find_unused, but the buckets are
     * launched (reducing whatever their slots hold: zeros after nb_zero_grad) either way,
     * so every rank issues the same collectives and none is left waiting. */
    int missing = 0, first_missing = -1;
    for (int i = 0; i < d->np; i++) {
        ddp_param *p = &d->p[i];
        if (!p->expected || p->ready) continue;
        if (missing++ == 0) first_missing = i;
        nb_status s = reattach(p);
        if (s != NB_OK) hook_fail(d, s);
        p->ready = true;
        d->b[p->bucket].ready++;
    }
    launch_ready(d);
    nb_status s = wait_all(d);
    d->exposed_s = now_s() - t0;

    if (s == NB_OK && d->hook_err != NB_OK)
        s = nb__error(d->hook_err, "ddp: starting a gradient allreduce failed: %s", d->hook_msg);
    if (s == NB_OK && d->twice)
        s = nb__error(NB_ESTATE, "ddp: backward ran twice without nb_ddp_sync in between; call "
                      "nb_ddp_sync after each backward, or disable sync "
                      "(nb_ddp_set_sync_enabled) for gradient accumulation micro-steps");
    if (s == NB_OK && missing && !d->o.find_unused) {
        const nb_params *ps = nb_parameters(d->m);
        const char *name = ps && first_missing < ps->count ? ps->names[first_missing] : "?";
        char more[64] = "";
        if (missing > 1) snprintf(more, sizeof more, " (nor did %d other parameters)", missing - 1);
        s = nb__error(NB_EINVAL, "ddp: parameter %s got no gradient in this step%s; pass "
                      ".find_unused = true if that is intended", name, more);
    }
    reset_step(d);
    return s;
}

void nb_ddp_set_sync_enabled(nb_ddp *d, bool enabled) {
    if (d) d->sync_enabled = enabled;
}

double nb_ddp_exposed_comm_s(const nb_ddp *d) { return d ? d->exposed_s : 0.0; }

int nb_ddp_num_buckets(const nb_ddp *d) { return d ? d->nbk : 0; }

/* For tests (declared there): buckets whose allreduce has started in the current step. */
int nb__ddp_buckets_launched(const nb_ddp *d);
int nb__ddp_buckets_launched(const nb_ddp *d) { return d ? d->next_launch : 0; }
