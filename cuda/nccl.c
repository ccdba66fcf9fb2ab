/* nccl.c - NCCL in the plugin (meson feature `nccl`; cuda/nccl_none.c otherwise): the
 * communicator handles and the operations that libnabla's NCCL communicator backend
 * (parallel/comm_nccl.c) drives through the plugin table (cuda/plugin.h, docs/cuda.md
 * "NCCL"). libnabla never sees an NCCL header, and the plugin does not link NCCL either: it
 * opens the library at run time (cuda/nccl_dl.h), so a machine without NCCL still loads the
 * plugin.
 *
 * UNVERIFIED ON A GPU: this file was compiled and linked on a machine without a GPU. What
 * ran there is ncclGetVersion and ncclGetUniqueId (they need no GPU) and the error paths
 * of a machine without one; the communicator, the collectives and the stream ordering have
 * not run.
 *
 * Communicators are non-blocking (ncclConfig_t.blocking = 0): init and split return at once
 * and are polled with ncclCommGetAsyncError, so a peer that never arrives costs the caller
 * its timeout, then an ncclCommAbort, never a hang. An operation is enqueued on the calling
 * thread's COMM stream of the communicator's GPU after the work already on its current
 * (compute) stream (an event), and an event recorded behind it tells when it ended; at the
 * end the thread's current stream waits for that event (nccl_op_finish), so what runs after
 * the collective on the compute stream sees its result without the host waiting. NCCL may
 * answer an enqueue with ncclInProgress (lazy connection setup): the end event is then
 * recorded once ncclCommGetAsyncError says the enqueue is over, and the next enqueue on the
 * communicator waits for that (NCCL's rule for non-blocking communicators). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda_impl.h"
#include "cuda/khelp.h"
#include "cuda/nccl_dl.h" /* <nccl.h>, and every NCCL call through the run-time table */
#include "cuda/policy.h"
#include "nabla/parallel.h" /* nb_reduce_op */
#include "tensor/error.h"

_Static_assert(NB__NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "NB__NCCL_ID_BYTES");

struct nb__nccl_comm {
    ncclComm_t comm;
    int device, nranks, rank;
    pthread_mutex_t mu;      /* every NCCL call on comm, and the fields below */
    bool ready;              /* init / split finished */
    bool aborted;
    nb__nccl_op *unrecorded; /* enqueued with ncclInProgress: its end event still to record */
    bool enqueuing;          /* an enqueue NCCL reported in progress is not over yet */
};

struct nb__nccl_op {
    nb__nccl_comm *c;
    cudaEvent_t done;
    cudaStream_t stream; /* the COMM stream it was enqueued on */
    bool recorded;       /* done is recorded behind the operation */
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void nap(double *s) {
    struct timespec ts = {0, (long)(*s * 1e9)};
    nanosleep(&ts, NULL);
    if (*s < 1e-3) *s *= 2;
}

/* An NCCL failure as an error value: "what: NCCL <text> (<last error>)". */
static nb_status nccl_error(ncclResult_t r, ncclComm_t comm, const char *what) {
    const char *last = comm ? ncclGetLastError(comm) : ncclGetLastError(NULL);
    nb_status st = r == ncclInvalidArgument || r == ncclInvalidUsage ? NB_EINVAL
                   : r == ncclSystemError || r == ncclRemoteError    ? NB_ECOMM
                   : r == ncclUnhandledCudaError                      ? NB_EDEVICE
                                                                      : NB_ECOMM;
    return nb__error(st, "%s: NCCL: %s%s%s%s", what, ncclGetErrorString(r),
                     last && *last ? " (" : "", last && *last ? last : "",
                     last && *last ? ")" : "");
}

/* 0 when the NCCL library is missing at run time (cuda/nccl_dl.h): then libnabla moves
 * CUDA tensors through host memory, as with a plugin built without NCCL, and
 * nb_cuda_libraries() says why. */
long nb__cuda_nccl_version(void) {
    int v = 0;
    return nb__nccl_load() && ncclGetVersion(&v) == ncclSuccess ? (long)v : 0;
}

const char *nb__cuda_nccl_why(void) { return nb__nccl_why(); }

/* The two entries that start NCCL work; everything else takes a communicator they made. */
static nb_status need_nccl(const char *what) {
    if (nb__nccl_load()) return NB_OK;
    return nb__error(NB_EUNSUPPORTED, "%s: the NCCL library could not be opened: %s", what,
                     nb__nccl_why());
}

nb_status nb__cuda_nccl_unique_id(void *id) {
    if (!id) return nb__error(NB_ENULL, "nccl_unique_id: id is NULL");
    if (need_nccl("nccl_unique_id") != NB_OK) return nb_last_status();
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) return nccl_error(r, NULL, "nccl_unique_id: ncclGetUniqueId");
    memcpy(id, &u, sizeof u);
    return NB_OK;
}

static nb__nccl_comm *comm_alloc(int device, int nranks, int rank) {
    nb__nccl_comm *c = calloc(1, sizeof *c);
    if (!c) {
        nb__error(NB_ENOMEM, "nccl: out of memory");
        return NULL;
    }
    c->device = device;
    c->nranks = nranks;
    c->rank = rank;
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

static void comm_dealloc(nb__nccl_comm *c) {
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static nb_status finish_enqueue(nb__nccl_comm *c, double seconds, const char *what);

static ncclConfig_t nonblocking(void) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    return cfg;
}

nb__nccl_comm *nb__cuda_nccl_comm_new(int device, int nranks, int rank, const void *id) {
    const char *what = "nccl_comm_new";
    int dev = -1, prev = -1;
    if (!id) {
        nb__error(NB_ENULL, "%s: id is NULL", what);
        return NULL;
    }
    if (nranks < 1 || rank < 0 || rank >= nranks) {
        nb__error(NB_EINVAL, "%s: rank %d of %d ranks", what, rank, nranks);
        return NULL;
    }
    if (need_nccl(what) != NB_OK || nb__cuda_resolve(device, &dev, what) != NB_OK) return NULL;
    nb__nccl_comm *c = comm_alloc(dev, nranks, rank);
    if (!c) return NULL;
    if (nb__cuda_enter(dev, &prev, what) != NB_OK) {
        comm_dealloc(c);
        return NULL;
    }
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclConfig_t cfg = nonblocking();
    ncclResult_t r = ncclCommInitRankConfig(&c->comm, nranks, u, rank, &cfg);
    nb__cuda_leave(prev);
    if (r != ncclSuccess && r != ncclInProgress) {
        nccl_error(r, c->comm, "nccl_comm_new: ncclCommInitRankConfig");
        if (c->comm) (void)ncclCommAbort(c->comm);
        comm_dealloc(c);
        return NULL;
    }
    return c;
}

nb__nccl_comm *nb__cuda_nccl_comm_split(nb__nccl_comm *p, int color, int key) {
    const char *what = "nccl_comm_split";
    if (!p) {
        nb__error(NB_ENULL, "%s: communicator is NULL", what);
        return NULL;
    }
    pthread_mutex_lock(&p->mu);
    if (p->aborted || !p->ready) {
        pthread_mutex_unlock(&p->mu);
        nb__error(NB_ESTATE, "%s: the communicator is %s", what,
                  p->aborted ? "aborted" : "not initialized yet");
        return NULL;
    }
    nb__nccl_comm *c = comm_alloc(p->device, 0, 0);
    int prev = -1;
    if (!c || nb__cuda_enter(p->device, &prev, what) != NB_OK) {
        pthread_mutex_unlock(&p->mu);
        if (c) comm_dealloc(c);
        return NULL;
    }
    /* NCCL's rule: no call on a communicator while an enqueue is in progress. */
    if (finish_enqueue(p, 60.0, what) != NB_OK) {
        nb__cuda_leave(prev);
        pthread_mutex_unlock(&p->mu);
        comm_dealloc(c);
        return NULL;
    }
    ncclConfig_t cfg = nonblocking();
    ncclResult_t r = ncclCommSplit(p->comm, color, key, &c->comm, &cfg);
    nb__cuda_leave(prev);
    pthread_mutex_unlock(&p->mu);
    if (r != ncclSuccess && r != ncclInProgress) {
        nccl_error(r, p->comm, "nccl_comm_split: ncclCommSplit");
        if (c->comm) (void)ncclCommAbort(c->comm);
        comm_dealloc(c);
        return NULL;
    }
    return c;
}

/* ncclCommGetAsyncError under c->mu: 1 success, 0 in progress, < 0 error (set). */
static int async_state(nb__nccl_comm *c, const char *what) {
    if (c->aborted)
        return nb__error(NB_ECOMM, "%s: the NCCL communicator was aborted", what);
    ncclResult_t ae = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(c->comm, &ae);
    if (r != ncclSuccess) return nccl_error(r, c->comm, what);
    if (ae == ncclInProgress) return 0;
    if (ae != ncclSuccess) return nccl_error(ae, c->comm, what);
    return 1;
}

int nb__cuda_nccl_comm_poll(nb__nccl_comm *c) {
    if (!c) return nb__error(NB_ENULL, "nccl_comm_poll: communicator is NULL");
    pthread_mutex_lock(&c->mu);
    int s = async_state(c, "nccl communicator");
    if (s == 1 && !c->ready) {
        c->ready = true;
        if (c->nranks == 0) { /* a split: learn where this rank landed */
            (void)ncclCommCount(c->comm, &c->nranks);
            (void)ncclCommUserRank(c->comm, &c->rank);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return s;
}

void nb__cuda_nccl_comm_abort(nb__nccl_comm *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    if (!c->aborted) {
        int prev = -1;
        bool entered = nb__cuda_enter(c->device, &prev, "nccl_comm_abort") == NB_OK;
        (void)ncclCommAbort(c->comm);
        if (entered) nb__cuda_leave(prev);
        c->aborted = true;
        c->unrecorded = NULL;
    }
    pthread_mutex_unlock(&c->mu);
}

void nb__cuda_nccl_comm_free(nb__nccl_comm *c, double seconds) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    bool ok = !c->aborted && c->ready;
    int prev = -1;
    bool entered = nb__cuda_enter(c->device, &prev, "nccl_comm_free") == NB_OK;
    ncclResult_t fr = ok ? ncclCommFinalize(c->comm) : ncclInternalError;
    if (fr == ncclSuccess || fr == ncclInProgress) {
        /* Non-blocking: the flush of what was issued is polled, at most `seconds`. */
        double t0 = now(), s = 20e-6;
        int st;
        while ((st = async_state(c, "nccl_comm_free")) == 0 && now() - t0 < seconds) nap(&s);
        ncclResult_t dr = st == 1 ? ncclCommDestroy(c->comm) : ncclInternalError;
        ok = dr == ncclSuccess || dr == ncclInProgress;
    } else {
        ok = false;
    }
    if (!ok && !c->aborted) (void)ncclCommAbort(c->comm);
    if (entered) nb__cuda_leave(prev);
    pthread_mutex_unlock(&c->mu);
    comm_dealloc(c);
}

/* ---- operations ------------------------------------------------------------------------- */
static bool nccl_type(nb_dtype dt, ncclDataType_t *t) {
    switch (dt) {
    case NB_F32: *t = ncclFloat32; return true;
    case NB_F64: *t = ncclFloat64; return true;
    case NB_F16: *t = ncclFloat16; return true;
    case NB_BF16: *t = ncclBfloat16; return true;
    case NB_I32: *t = ncclInt32; return true;
    case NB_I64: *t = ncclInt64; return true;
    case NB_U8:
    case NB_BOOL: *t = ncclUint8; return true;
    default: return false;
    }
}

/* As the MPI backend: bool is a byte where sum and max are a logical or, min a logical
 * and (its values are 0 and 1). */
static ncclRedOp_t nccl_op(nb_reduce_op op, nb_dtype dt) {
    if (dt == NB_BOOL) return op == NB_REDUCE_MIN ? ncclMin : ncclMax;
    switch (op) {
    case NB_REDUCE_AVG: return ncclAvg;
    case NB_REDUCE_MAX: return ncclMax;
    case NB_REDUCE_MIN: return ncclMin;
    default: return ncclSum;
    }
}

/* nb_comm_chunk's rule (parallel/comm.c), repeated: the plugin does not link libnabla. */
static void chunk(int64_t n, int size, int r, int64_t *b, int64_t *e) {
    int64_t ch = (n + size - 1) / size;
    *b = (int64_t)r * ch < n ? (int64_t)r * ch : n;
    *e = *b + ch < n ? *b + ch : n;
}

/* The NCCL calls of one operation on stream st. */
static ncclResult_t enqueue(nb__nccl_comm *c, const nb__nccl_call *a, ncclDataType_t t,
                            cudaStream_t st) {
    ncclComm_t comm = c->comm;
    ncclRedOp_t op = nccl_op((nb_reduce_op)a->op, a->dtype);
    size_t es = (size_t)nb__kh_dtype_size(a->dtype);
    const char *in = a->in;
    char *out = a->out;
    ncclResult_t r = ncclSuccess, r2;
    switch (a->kind) {
    case NB__NCCL_ALLREDUCE:
        return ncclAllReduce(a->buf, a->buf, (size_t)a->count, t, op, comm, st);
    case NB__NCCL_BROADCAST:
        return ncclBroadcast(a->buf, a->buf, (size_t)a->count, t, a->peer, comm, st);
    case NB__NCCL_REDUCE:
        return ncclReduce(a->buf, a->buf, (size_t)a->count, t, op, a->peer, comm, st);
    case NB__NCCL_SEND: return ncclSend(a->buf, (size_t)a->count, t, a->peer, comm, st);
    case NB__NCCL_RECV: return ncclRecv(a->buf, (size_t)a->count, t, a->peer, comm, st);
    case NB__NCCL_ALLGATHER:
        if (!a->chunked) return ncclAllGather(in, out, (size_t)a->in_count, t, comm, st);
        /* Uneven blocks: one broadcast per rank from its block, grouped. */
        if ((r = ncclGroupStart()) != ncclSuccess) return r;
        for (int q = 0; q < c->nranks && r == ncclSuccess; q++) {
            int64_t b, e;
            chunk(a->out_count, c->nranks, q, &b, &e);
            if (e > b)
                r = ncclBroadcast(q == c->rank ? (const void *)in : out + b * es, out + b * es,
                                  (size_t)(e - b), t, q, comm, st);
        }
        r2 = ncclGroupEnd();
        return r != ncclSuccess ? r : r2;
    case NB__NCCL_REDUCE_SCATTER:
        if (a->in_count % c->nranks == 0)
            return ncclReduceScatter(in, out, (size_t)a->out_count, t, op, comm, st);
        /* Uneven blocks: one reduce per rank to it, grouped (recvbuff is used on the root
         * only). */
        if ((r = ncclGroupStart()) != ncclSuccess) return r;
        for (int q = 0; q < c->nranks && r == ncclSuccess; q++) {
            int64_t b, e;
            chunk(a->in_count, c->nranks, q, &b, &e);
            if (e > b) r = ncclReduce(in + b * es, out, (size_t)(e - b), t, op, q, comm, st);
        }
        r2 = ncclGroupEnd();
        return r != ncclSuccess ? r : r2;
    case NB__NCCL_ALL_TO_ALL: {
        int64_t k = a->in_count / c->nranks;
        if ((r = ncclGroupStart()) != ncclSuccess) return r;
        for (int q = 0; q < c->nranks && r == ncclSuccess; q++) {
            r = ncclSend(in + q * k * (int64_t)es, (size_t)k, t, q, comm, st);
            if (r == ncclSuccess) r = ncclRecv(out + q * k * (int64_t)es, (size_t)k, t, q, comm, st);
        }
        r2 = ncclGroupEnd();
        return r != ncclSuccess ? r : r2;
    }
    }
    return ncclInvalidArgument;
}

/* Record op's end event on its stream (c->mu held, device current). */
static nb_status record(nb__nccl_op *op, const char *what) {
    cudaError_t e = cudaEventRecord(op->done, op->stream);
    if (e != cudaSuccess) return nb__cuda_status(e, what);
    op->recorded = true;
    return NB_OK;
}

/* c->mu held: wait (at most `seconds`) for an enqueue that NCCL said is in progress, then
 * record the end event of the operation it belongs to. */
static nb_status finish_enqueue(nb__nccl_comm *c, double seconds, const char *what) {
    double t0 = now(), s = 10e-6;
    while (c->enqueuing) {
        int st = async_state(c, what);
        if (st < 0) return nb_last_status();
        if (st == 1) {
            c->enqueuing = false;
            nb__nccl_op *u = c->unrecorded;
            c->unrecorded = NULL;
            if (u) return record(u, what);
            break;
        }
        if (seconds > 0 && now() - t0 > seconds) {
            (void)ncclCommAbort(c->comm);
            c->aborted = true;
            c->unrecorded = NULL;
            return nb__error(NB_ETIMEOUT, "%s: an earlier NCCL operation was still being "
                             "enqueued after %.3g s; the NCCL communicator was aborted", what,
                             seconds);
        }
        pthread_mutex_unlock(&c->mu);
        nap(&s);
        pthread_mutex_lock(&c->mu);
    }
    return NB_OK;
}

nb__nccl_op *nb__cuda_nccl_start(nb__nccl_comm *c, const nb__nccl_call *a, double seconds) {
    const char *what = "nccl";
    ncclDataType_t t;
    if (!c || !a) {
        nb__error(NB_ENULL, "nccl_start: NULL argument");
        return NULL;
    }
    if (!nccl_type(a->dtype, &t)) {
        nb__error(NB_EDTYPE, "nccl_start: NCCL has no type for dtype %d", (int)a->dtype);
        return NULL;
    }
    nb__nccl_op *op = calloc(1, sizeof *op);
    if (!op) {
        nb__error(NB_ENOMEM, "nccl_start: out of memory");
        return NULL;
    }
    op->c = c;
    int prev = -1;
    pthread_mutex_lock(&c->mu);
    nb_status st = c->aborted  ? nb__error(NB_ECOMM, "%s: the NCCL communicator was aborted", what)
                   : !c->ready ? nb__error(NB_ESTATE, "%s: the NCCL communicator is not "
                                           "initialized yet", what)
                               : nb__cuda_enter(c->device, &prev, what);
    bool entered = st == NB_OK;
    if (st == NB_OK) st = finish_enqueue(c, seconds, what);
    nb_cuda_stream *compute = NULL, *comm = NULL;
    if (st == NB_OK && (!(compute = nb__cuda_stream_for(c->device, what)) ||
                        !(comm = nb_cuda_stream_role(c->device, NB_CUDA_ROLE_COMM))))
        st = nb_last_status();
    /* The collective starts after what the compute stream has enqueued so far. */
    if (st == NB_OK) st = nb__cuda_join(comm, compute, what);
    if (st == NB_OK)
        st = nb__cuda_status(cudaEventCreateWithFlags(&op->done, cudaEventDisableTiming), what);
    if (st == NB_OK) {
        op->stream = comm->handle;
        ncclResult_t r = enqueue(c, a, t, comm->handle);
        if (r == ncclInProgress) {
            c->enqueuing = true;
            c->unrecorded = op;
        } else if (r != ncclSuccess) {
            st = nccl_error(r, c->comm, what);
        } else {
            st = record(op, what);
        }
    }
    if (entered) nb__cuda_leave(prev);
    pthread_mutex_unlock(&c->mu);
    if (st != NB_OK) {
        if (op->done) (void)cudaEventDestroy(op->done);
        free(op);
        return NULL;
    }
    return op;
}

int nb__cuda_nccl_op_poll(nb__nccl_op *op) {
    if (!op) return nb__error(NB_ENULL, "nccl_op_poll: op is NULL");
    nb__nccl_comm *c = op->c;
    pthread_mutex_lock(&c->mu);
    int s = async_state(c, "nccl");
    if (s == 1 && c->enqueuing) { /* the enqueue NCCL said was in progress is over */
        c->enqueuing = false;
        nb__nccl_op *u = c->unrecorded;
        c->unrecorded = NULL;
        int prev = -1;
        nb_status st = nb__cuda_enter(c->device, &prev, "nccl");
        if (st == NB_OK) {
            if (u) st = record(u, "nccl");
            nb__cuda_leave(prev);
        }
        if (st != NB_OK) s = st;
    }
    if (s == 1 && !op->recorded) s = 0; /* still being enqueued */
    if (s == 1) {
        switch (nb__cuda_poll_event(&nb__cuda_rt_real, op->done)) {
        case NB__POLL_DONE: break;
        case NB__POLL_BUSY: s = 0; break;
        default: s = nb__error(NB_EDEVICE, "nccl: the GPU failed while the operation ran");
        }
    }
    pthread_mutex_unlock(&c->mu);
    return s;
}

void nb__cuda_nccl_op_free(nb__nccl_op *op) {
    if (!op) return;
    nb__nccl_comm *c = op->c;
    pthread_mutex_lock(&c->mu);
    if (c->unrecorded == op) c->unrecorded = NULL;
    pthread_mutex_unlock(&c->mu);
    if (op->done) (void)cudaEventDestroy(op->done);
    free(op);
}

nb_status nb__cuda_nccl_op_finish(nb__nccl_op *op) {
    if (!op) return nb__error(NB_ENULL, "nccl_op_finish: op is NULL");
    const char *what = "nccl";
    int prev = -1;
    nb_status st = nb__cuda_enter(op->c->device, &prev, what);
    if (st == NB_OK) {
        nb_cuda_stream *cur = nb__cuda_stream_for(op->c->device, what);
        st = cur ? nb__cuda_status(cudaStreamWaitEvent(cur->handle, op->done, 0), what)
                 : nb_last_status();
        nb__cuda_leave(prev);
    }
    nb__cuda_nccl_op_free(op);
    return st;
}
