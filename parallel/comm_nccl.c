/* comm_nccl.c - the NCCL backend ("nccl"): collectives of CUDA tensors on the GPU, through
 * the CUDA plugin's NCCL entries (cuda/plugin.h; the plugin links NCCL, libnabla does not).
 * An NCCL communicator is never handed to the program: it is the device side of an MPI
 * communicator (nb_comm.dev), made on the first collective of a CUDA tensor on that
 * communicator, and nb__comm_route (comm_registry.c) sends CUDA tensors to it. So DDP, ZeRO
 * and the tensor-parallel layers use NCCL for CUDA tensors without a change, and keep MPI
 * for host tensors (docs/distributed.md "CUDA tensors (NCCL)", docs/cuda.md).
 *
 * UNVERIFIED ON A GPU: written and tested on a machine without a GPU. What ran there: the
 * bootstrap up to the GPU (the local rank, ncclGetUniqueId on rank 0, its broadcast over
 * MPI, the agreement on failures) and the error values without a GPU or without NCCL; the
 * collectives themselves have not run.
 *
 * The bootstrap (collective over the MPI communicator, every step bounded by its timeout):
 *   1. the GPU is the one of this process's node-local rank (MPI_COMM_TYPE_SHARED; GPU 0
 *      when the process sees a single GPU, e.g. CUDA_VISIBLE_DEVICES set per rank); a
 *      tensor on another GPU is refused (NB_EDEVICE);
 *   2. rank 0 makes the ncclUniqueId and broadcasts it over MPI with its status;
 *   3. each rank starts a non-blocking ncclCommInitRankConfig; the ranks agree (allreduce)
 *      that every one started, poll ncclCommGetAsyncError until it is ready or the timeout
 *      passes (then ncclCommAbort), and agree again, so either every rank has a ready NCCL
 *      communicator or every one reports the failure, naming the ranks that failed.
 * A failure is kept: later CUDA collectives on that communicator report it again (set
 * NB_COMM_NCCL=0 to move CUDA tensors through host memory instead). nb_comm_split splits
 * the NCCL communicator too (ncclCommSplit), so subgroups need no new bootstrap.
 *
 * Operations: the plugin enqueues each one on the COMM stream of the GPU, after the work on
 * the calling thread's compute stream; nb_work_test/wait poll its end event and
 * ncclCommGetAsyncError, and at the end the compute stream waits for it (no host wait on
 * the GPU). The tensors' blocks are marked as used on the COMM stream
 * (nb_cuda_record_stream). A timeout aborts the NCCL communicator (ncclCommAbort): the
 * operation fails instead of hanging (each rank's own timeout aborts its side, and NCCL
 * may fail the peers' operations sooner when their connection to it drops), and later
 * CUDA collectives
 * on the communicator fail with NB_ECOMM (make a new communicator). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/plugin.h"
#include "nabla/cuda.h"
#include "nb_config.h"
#include "parallel/parallel_impl.h"

typedef struct nccl_impl {
    const nb__cuda_plugin *p;
    nb__nccl_comm *h;
    int device;
    atomic_bool aborted;
    char why[160]; /* what aborted it (written once, before aborted is set) */
} nccl_impl;

/* nb_comm.dev: the NCCL side of an MPI communicator. */
struct nb__comm_dev {
    nb_comm *nccl;  /* ready, or NULL */
    nb_status st;   /* making it failed: kept for later CUDA collectives */
    char msg[NB__COMM_MSG];
};

/* Guards every nb_comm.dev (bootstraps are rare and collective anyway). */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

typedef struct nccl_ws {
    nb__nccl_op *op;
    bool timed_out; /* the common layer asked who is missing: it timed out */
} nccl_ws;
_Static_assert(sizeof(nccl_ws) <= sizeof(((nb_work *)0)->be), "nccl_ws does not fit");
static nccl_ws *ws_of(nb_work *w) { return (nccl_ws *)w->be; }

static void nap(double *s) {
    struct timespec ts = {0, (long)(*s * 1e9)};
    nanosleep(&ts, NULL);
    if (*s < 1e-3) *s *= 2;
}

int nb__comm_nccl_available(void) {
    const nb__cuda_plugin *p = nb__cuda_plugin_get("nccl");
    if (!p) return -1;
    return p->nccl_version() > 0 ? 1 : 0;
}

/* ---- the backend ----------------------------------------------------------------------------- */
static nb__nccl_kind kind_of(nb__coll k) {
    switch (k) {
    case NB__COLL_ALLREDUCE: return NB__NCCL_ALLREDUCE;
    case NB__COLL_BROADCAST: return NB__NCCL_BROADCAST;
    case NB__COLL_REDUCE: return NB__NCCL_REDUCE;
    case NB__COLL_ALLGATHER: return NB__NCCL_ALLGATHER;
    case NB__COLL_REDUCE_SCATTER: return NB__NCCL_REDUCE_SCATTER;
    case NB__COLL_ALL_TO_ALL: return NB__NCCL_ALL_TO_ALL;
    case NB__COLL_SEND: return NB__NCCL_SEND;
    default: return NB__NCCL_RECV;
    }
}

/* Mark the blocks of w's tensors as used on the COMM stream, so that the caching allocator
 * does not hand them out again before the operation is over (even after an abort). */
static void record_streams(nb_work *w, int device) {
    nb_cuda_stream *s = nb_cuda_stream_role(device, NB_CUDA_ROLE_COMM);
    nb_tensor *ts[4] = {w->hold[0], w->hold[1], w->hold[2], w->stage};
    for (int i = 0; s && i < 4; i++) {
        const nb__storage *st = ts[i] ? ts[i]->storage : NULL;
        if (st && st->owned && !st->release && st->data && st->nbytes)
            (void)nb_cuda_record_stream(st->data, s);
    }
    nb_clear_error(); /* a block not from the allocator: nothing to mark */
}

static void mark_aborted(nccl_impl *m, const char *why) {
    if (atomic_load(&m->aborted)) return;
    snprintf(m->why, sizeof m->why, "%s", why);
    m->p->nccl_comm_abort(m->h);
    atomic_store(&m->aborted, true);
}

static nb_status nccl_start(nb_comm *c, nb_work *w) {
    nccl_impl *m = c->impl;
    const char *name = nb__coll_name(w->a.kind);
    if (atomic_load(&m->aborted))
        return nb__error(NB_ECOMM, "%s: the NCCL communicator of these ranks (cuda:%d) was "
                         "aborted after %s; make a new communicator", name, m->device, m->why);
    nb__nccl_call call = {
        .kind = kind_of(w->a.kind), .dtype = w->a.dtype, .op = (int)w->a.op,
        .peer = w->a.peer, .buf = w->a.buf, .count = w->a.count, .in = w->a.in,
        .in_count = w->a.in_count, .out = w->a.out, .out_count = w->a.out_count,
        .chunked = w->a.chunked,
    };
    nb__nccl_op *op = m->p->nccl_start(m->h, &call, atomic_load(&c->timeout));
    if (!op) {
        nb_status st = nb_last_status();
        char msg[NB__COMM_MSG];
        snprintf(msg, sizeof msg, "%s", nb_last_error());
        if (st == NB_ETIMEOUT) mark_aborted(m, "a timeout while enqueuing an operation");
        return nb__error(st, "%s on rank %d of %d (NCCL, cuda:%d): %s", name, c->rank, c->size,
                         m->device, msg);
    }
    ws_of(w)->op = op;
    record_streams(w, m->device);
    return NB_OK;
}

static int nccl_test(nb_work *w) {
    int state = atomic_load(&w->state);
    nccl_ws *s = ws_of(w);
    if (state != NB__WORK_PENDING || !s->op) return state;
    nccl_impl *m = w->comm->impl;
    int r = m->p->nccl_op_poll(s->op);
    if (r == 0) return 0;
    if (r == 1) {
        nb_status st = m->p->nccl_op_finish(s->op); /* the compute stream waits for it */
        s->op = NULL;
        if (st == NB_OK) nb__work_done(w);
        else nb__work_fail_wrap(w, st, "%s on rank %d (NCCL, cuda:%d)", nb__coll_name(w->a.kind),
                                w->comm->rank, m->device);
    } else {
        /* An asynchronous NCCL error leaves the communicator unusable: abort it, so that
         * the peers are not left waiting for this rank beyond their own timeouts. */
        nb__work_fail_wrap(w, (nb_status)r, "%s on rank %d of %d (NCCL, cuda:%d)",
                           nb__coll_name(w->a.kind), w->comm->rank, w->comm->size, m->device);
        m->p->nccl_op_free(s->op);
        s->op = NULL;
        mark_aborted(m, "an NCCL error");
    }
    atomic_fetch_add(&w->comm->completed, 1);
    return atomic_load(&w->state);
}

static int nccl_wait(nb_work *w, double deadline) {
    double s = 5e-6;
    for (;;) {
        int st = nccl_test(w);
        if (st != NB__WORK_PENDING) return st;
        if (deadline > 0 && nb__now() >= deadline) return 0;
        nap(&s);
    }
}

static void nccl_diagnose(nb_work *w, char *buf, size_t n) {
    nccl_impl *m = w->comm->impl;
    ws_of(w)->timed_out = true; /* comm.c asks only after a timeout */
    snprintf(buf, n, "NCCL cannot tell which rank is missing; the NCCL communicator (cuda:%d) "
             "is aborted, so later CUDA collectives on this communicator fail (make a new "
             "one)", m->device);
}

/* Given up after a timeout: abort the communicator (the operation ends; the GPU's NCCL
 * kernels stop). Freed unwaited (nb_work_free) before any timeout: the GPU finishes it on its own,
 * and its blocks stay reserved through nb_cuda_record_stream. */
static void nccl_abandon(nb_work *w) {
    nccl_impl *m = w->comm->impl;
    nccl_ws *s = ws_of(w);
    if (s->timed_out) mark_aborted(m, "a timeout");
    if (s->op) m->p->nccl_op_free(s->op);
    s->op = NULL;
}

static nb_comm *nccl_split(nb_comm *c, int color, int key) {
    (void)color, (void)key;
    nb__error(NB_EINTERNAL, "comm_split: the NCCL communicator is not the program's (%s)",
              c->be->name);
    return NULL;
}

static void nccl_destroy(nb_comm *c) {
    nccl_impl *m = c->impl;
    if (!m) return;
    m->p->nccl_comm_free(m->h, 10.0);
    free(m);
}

const nb__comm_backend nb__comm_nccl_backend = {
    .name = "nccl",
    .device_buffers = true,
    .start =
        {
            [NB__COLL_ALLREDUCE] = nccl_start,
            [NB__COLL_BROADCAST] = nccl_start,
            [NB__COLL_REDUCE] = nccl_start,
            [NB__COLL_ALLGATHER] = nccl_start,
            [NB__COLL_REDUCE_SCATTER] = nccl_start,
            [NB__COLL_ALL_TO_ALL] = nccl_start,
            [NB__COLL_SEND] = nccl_start,
            [NB__COLL_RECV] = nccl_start,
        },
    .test = nccl_test,
    .wait = nccl_wait,
    .diagnose = nccl_diagnose,
    .abandon = nccl_abandon,
    .split = nccl_split,
    .destroy = nccl_destroy,
};

/* ---- the bootstrap ---------------------------------------------------------------------------- */
/* Poll a starting communicator until ready (NB_OK), failed, or `timeout` seconds passed
 * (NB_ETIMEOUT); aborted unless ready. */
static nb_status poll_ready(const nb__cuda_plugin *p, nb__nccl_comm *h, double timeout) {
    double t0 = nb__now(), s = 10e-6;
    for (;;) {
        int r = p->nccl_comm_poll(h);
        if (r == 1) return NB_OK;
        if (r < 0) {
            p->nccl_comm_abort(h);
            return (nb_status)r;
        }
        if (timeout > 0 && nb__now() - t0 > timeout) {
            p->nccl_comm_abort(h);
            return nb__error(NB_ETIMEOUT, "NCCL's communicator was not ready after %.3g s (a "
                             "rank did not take part); aborted", timeout);
        }
        nap(&s);
    }
}

/* Every rank learns every rank's status (0 or a negative nb_status) over c. NB_OK when all
 * are 0; otherwise the first failing status, with "rank(s) 1 (NB_EDEVICE), ..." in list.
 * A failure of the exchange itself is returned with its error set. */
static nb_status agree(nb_comm *c, nb_status mine, char *list, size_t n, bool *exchange_failed) {
    *exchange_failed = false;
    list[0] = '\0';
    nb_tensor *t = nb_zeros_on(NB_CPU, (int64_t[]){c->size}, 1, NB_I32);
    if (!t) {
        *exchange_failed = true;
        return nb_last_status();
    }
    ((int32_t *)nb_data(t))[c->rank] = (int32_t)mine;
    nb_status st = nb_allreduce(c, t, NB_REDUCE_SUM);
    if (st != NB_OK) {
        *exchange_failed = true;
        nb_tensor_free(t);
        return st;
    }
    const int32_t *v = nb_data(t);
    nb_status first = NB_OK;
    for (int r = 0; r < c->size; r++) {
        if (v[r] == 0) continue;
        if (first == NB_OK) first = (nb_status)v[r];
        size_t k = strlen(list);
        if (k + 40 < n)
            snprintf(list + k, n - k, "%s%d (%s)", k ? ", " : "", r,
                     nb_status_name((nb_status)v[r]));
    }
    nb_tensor_free(t);
    return first;
}

nb_status nb__comm_nccl_share_id(nb_comm *c, unsigned char *id) {
    const nb__cuda_plugin *p = nb__cuda_plugin_get("nccl");
    if (!p) return nb_last_status(); /* the same on every rank: nobody broadcasts */
    if (p->nccl_version() <= 0) /* likewise */
        return nb__error(NB_EUNSUPPORTED, "nccl: the CUDA plugin (%s) was built without NCCL "
                         "(reconfigure with -Dnccl=enabled where NCCL is installed)",
                         nb__cuda_plugin_path());
    /* int32 status, then the id (rank 0's status travels with it, so that a failure there
     * is every rank's failure, not a hang). */
    nb_tensor *t = nb_zeros_on(NB_CPU, (int64_t[]){4 + NB__NCCL_ID_BYTES}, 1, NB_U8);
    if (!t) return nb_last_status();
    unsigned char *b = nb_data(t);
    char why[NB__COMM_MSG] = "";
    if (c->rank == 0) {
        int32_t s0 = (int32_t)p->nccl_unique_id(b + 4);
        if (s0 != NB_OK) snprintf(why, sizeof why, ": %s", nb_last_error());
        memcpy(b, &s0, 4);
    }
    nb_status st = nb_broadcast(c, t, 0);
    if (st != NB_OK) {
        snprintf(why, sizeof why, "%s", nb_last_error());
        nb_tensor_free(t);
        return nb__error(st, "the broadcast of the NCCL id failed: %s", why);
    }
    int32_t s0;
    memcpy(&s0, b, 4);
    memcpy(id, b + 4, NB__NCCL_ID_BYTES);
    nb_tensor_free(t);
    if (s0 != NB_OK)
        return nb__error((nb_status)s0, "rank 0 could not make the NCCL id (%s)%s",
                         nb_status_name((nb_status)s0), why);
    return NB_OK;
}

/* The device this rank's NCCL communicator uses; NB_OK, or NB_EDEVICE with msg. */
static nb_status pick_device(int device, char *msg, size_t n) {
    int ls = 1, lr = 0;
#if NB_HAVE_MPI
    lr = nb__comm_mpi_local_rank(&ls);
#endif
    int ndev = nb_cuda_device_count();
    int want = ndev == 1 ? 0 : lr;
    if (ndev > 1 && lr >= ndev) {
        snprintf(msg, n, "this rank is local rank %d of %d on its node but the node has %d "
                 "GPUs: NCCL needs one GPU per rank", lr, ls, ndev);
        return NB_EDEVICE;
    }
    if (device != want) {
        snprintf(msg, n, "the tensor is on cuda:%d but this rank's GPU is cuda:%d (local rank "
                 "%d of %d on its node, %d GPU(s) visible; NCCL uses the GPU of the local "
                 "rank: nb_cuda_set_device(nb_comm_local_rank()))", device, want, lr, ls, ndev);
        return NB_EDEVICE;
    }
    return NB_OK;
}

/* Make c's NCCL communicator on device (collective over c). NULL with st/msg on failure. */
static nb_comm *bootstrap(nb_comm *c, int device, nb_status *st, char *msg, size_t n) {
    const nb__cuda_plugin *p = nb__cuda_plugin_get("nccl");
    double timeout = atomic_load(&c->timeout);
    char mine[NB__COMM_MSG] = "", list[160];
    bool xfail = false;
    msg[0] = '\0';
    if (!p) {
        *st = nb_last_status();
        snprintf(msg, n, "%s", nb_last_error());
        return NULL;
    }
    /* 1-2: the id, from rank 0. */
    unsigned char id[NB__NCCL_ID_BYTES];
    if ((*st = nb__comm_nccl_share_id(c, id)) != NB_OK) {
        snprintf(msg, n, "%s", nb_last_error());
        return NULL;
    }
    /* 3: start, agree, poll, agree. */
    nb__nccl_comm *h = NULL;
    nb_status local = pick_device(device, mine, sizeof mine);
    if (local == NB_OK && !(h = p->nccl_comm_new(device, c->size, c->rank, id))) {
        local = nb_last_status();
        snprintf(mine, sizeof mine, "%s", nb_last_error());
    }
    nb_status all = agree(c, local, list, sizeof list, &xfail);
    if (all == NB_OK && h) {
        local = poll_ready(p, h, timeout);
        if (local != NB_OK) snprintf(mine, sizeof mine, "%s", nb_last_error());
        all = agree(c, local, list, sizeof list, &xfail);
    }
    if (all != NB_OK) {
        *st = all;
        if (xfail) snprintf(msg, n, "the ranks could not agree over MPI: %s", nb_last_error());
        else snprintf(msg, n, "rank(s) %s could not set up NCCL%s%.280s", list,
                      mine[0] ? "; here: " : "", mine);
        if (h) {
            p->nccl_comm_abort(h);
            p->nccl_comm_free(h, 0);
        }
        return NULL;
    }
    nccl_impl *m = calloc(1, sizeof *m);
    nb_comm *nc = m ? nb__comm_alloc(&nb__comm_nccl_backend, c->rank, c->size, m) : NULL;
    if (!nc) {
        *st = NB_ENOMEM;
        snprintf(msg, n, "out of memory");
        free(m);
        p->nccl_comm_free(h, 10.0);
        return NULL;
    }
    m->p = p;
    m->h = h;
    m->device = device;
    atomic_init(&m->aborted, false);
    atomic_store(&nc->timeout, timeout);
    return nc;
}

nb_comm *nb__comm_nccl_of(nb_comm *c, int device, const char *op) {
    pthread_mutex_lock(&g_mu);
    if (!c->dev && !(c->dev = calloc(1, sizeof *c->dev))) {
        pthread_mutex_unlock(&g_mu);
        nb__error(NB_ENOMEM, "%s: out of memory", op);
        return NULL;
    }
    struct nb__comm_dev *d = c->dev;
    if (!d->nccl && d->st == NB_OK) {
        nb_status st = NB_OK;
        d->nccl = bootstrap(c, device, &st, d->msg, sizeof d->msg);
        if (!d->nccl) d->st = st != NB_OK ? st : NB_ECOMM;
    }
    nb_comm *n = d->nccl;
    nb_status st = d->st;
    char msg[NB__COMM_MSG];
    snprintf(msg, sizeof msg, "%s", d->msg);
    pthread_mutex_unlock(&g_mu);
    if (!n) {
        nb__error(st, "%s: rank %d of %d: the NCCL communicator for CUDA tensors could not be "
                  "made: %s (NB_COMM_NCCL=0 moves CUDA tensors through host memory instead)",
                  op, c->rank, c->size, msg);
        return NULL;
    }
    nccl_impl *m = n->impl;
    if (m->device != device) {
        nb__error(NB_EDEVICE, "%s: the tensor is on cuda:%d but this rank's NCCL communicator "
                  "uses cuda:%d (one GPU per rank)", op, device, m->device);
        return NULL;
    }
    return n;
}

/* ncclCommSplit orders the new ranks as MPI_Comm_split does (by key, ties by the rank in the
 * parent, whose NCCL and MPI ranks are equal), so the child's NCCL ranks are its MPI ranks. */
void nb__comm_dev_split(nb_comm *parent, nb_comm *child, int color, int key) {
    pthread_mutex_lock(&g_mu);
    nb_comm *pn = parent->dev ? parent->dev->nccl : NULL;
    pthread_mutex_unlock(&g_mu);
    if (!pn) return; /* made on the child's first CUDA collective, if any */
    nccl_impl *pm = pn->impl;
    struct nb__comm_dev *d = calloc(1, sizeof *d);
    if (!d) return; /* the child bootstraps on first use instead */
    if (atomic_load(&pm->aborted)) {
        d->st = NB_ECOMM;
        snprintf(d->msg, sizeof d->msg, "the parent's NCCL communicator was aborted after %s",
                 pm->why);
    } else {
        nb__nccl_comm *h = pm->p->nccl_comm_split(pm->h, color, key);
        nb_status s = h ? poll_ready(pm->p, h, atomic_load(&child->timeout)) : nb_last_status();
        nccl_impl *m = s == NB_OK ? calloc(1, sizeof *m) : NULL;
        nb_comm *nc = m ? nb__comm_alloc(&nb__comm_nccl_backend, child->rank, child->size, m)
                        : NULL;
        if (nc) {
            m->p = pm->p;
            m->h = h;
            m->device = pm->device;
            atomic_init(&m->aborted, false);
            atomic_store(&nc->timeout, atomic_load(&child->timeout));
            d->nccl = nc;
        } else {
            d->st = s != NB_OK ? s : NB_ENOMEM;
            nb__wrap_msg(d->msg, sizeof d->msg, "ncclCommSplit",
                         s != NB_OK ? nb_last_error() : "out of memory", d->st);
            free(m);
            if (h) pm->p->nccl_comm_free(h, s == NB_OK ? 10.0 : 0);
            nb_clear_error(); /* the split itself succeeded: reported on first CUDA use */
        }
    }
    pthread_mutex_lock(&g_mu);
    child->dev = d;
    pthread_mutex_unlock(&g_mu);
}

void nb__comm_dev_free(nb_comm *c) {
    struct nb__comm_dev *d = c->dev;
    if (!d) return;
    c->dev = NULL;
    nb__comm_release(d->nccl);
    free(d);
}
