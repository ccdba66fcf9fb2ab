/* comm.c - communicators and collectives, the backend-independent part: the nb_comm object,
 * argument checks, staging of non-contiguous tensors, the chunk rule, asynchronous work
 * handles and their timeouts. The backends (comm_self.c, comm_mpi.c) only move contiguous
 * buffers; see parallel_impl.h for the split. Which backend serves nb_comm_world is
 * parallel/comm_registry.c's business: this file names no backend.
 *
 * Non-contiguous tensors are copied: an input into a contiguous temporary, an output
 * computed into a temporary and copied back when the caller waits (or tests) and the
 * operation succeeded. CUDA tensors on a communicator of several ranks go to its NCCL
 * communicator (nb__comm_route, comm_registry.c), which moves device memory: they are used
 * in place, or staged on their GPU. The other backends move host memory, so tensors of
 * another device (CUDA without NCCL, the guard test device) are staged the same way through
 * host temporaries; meta tensors have no data and are refused (NB_EDEVICE). Contiguous
 * host tensors are used in place, without copies, so the steady state of a training loop
 * (DDP's flat gradient buckets) allocates nothing here except the work handles, which are
 * recycled per communicator.
 *
 * Timeouts: nb_work_wait gives up after the communicator's timeout (counted from the call;
 * after an operation timed out, those already in flight count from their start and share
 * its diagnosis where it covers their peers) and asks the backend which ranks did not
 * arrive; nb_work_test reports NB_ETIMEOUT once an
 * operation has been pending longer than the timeout since it started. A timed-out
 * operation cannot be cancelled (MPI has no way to cancel a collective): it stays in flight,
 * with the tensors it uses kept alive, until its peers arrive or the process ends. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nb_config.h"
#include "parallel/parallel_impl.h"
#include "tensor/backend.h"
#include "tensor/trace.h"

#define NB__WORK_CACHE 64 /* free works kept per communicator */
/* A collective still pending this long asks the peers whether they called the same one
 * (nb__comm_backend.check), then again at doubling intervals up to NB__CHECK_MAX. */
#define NB__CHECK_FIRST 0.25
#define NB__CHECK_MAX 4.0

static const char *const coll_names[NB__COLL_COUNT] = {
    "allreduce", "broadcast", "reduce", "allgather", "reduce_scatter",
    "all_to_all", "barrier", "send", "recv", "comm_split",
};
/* Span names (tensor/trace.h): starting an operation on the caller's thread, and waiting
 * for it; the operation itself is an async slice named by coll_names from its start to the
 * wait that saw it complete, and the backend's thread has a span while it runs one. */
static const char *const start_names[NB__COLL_COUNT] = {
    "allreduce start", "broadcast start", "reduce start", "allgather start",
    "reduce_scatter start", "all_to_all start", "barrier start", "send start", "recv start",
    "comm_split start",
};
static const char *const wait_names[NB__COLL_COUNT] = {
    "allreduce wait", "broadcast wait", "reduce wait", "allgather wait", "reduce_scatter wait",
    "all_to_all wait", "barrier wait", "send wait", "recv wait", "comm_split wait",
};
static int64_t work_bytes(const nb_work *w) {
    int64_t n = w->a.count > 0 ? w->a.count : w->a.in_count > w->a.out_count ? w->a.in_count
                                                                             : w->a.out_count;
    return n * (int64_t)nb_dtype_size(w->a.dtype);
}

const char *nb__coll_name(nb__coll k) {
    return (unsigned)k < NB__COLL_COUNT ? coll_names[k] : "?";
}

double nb__now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void nb_comm_chunk(int64_t n, int size, int r, int64_t *begin, int64_t *end) {
    int64_t b = 0, e = 0;
    if (n > 0 && size > 0 && r >= 0 && r < size) {
        int64_t chunk = (n + size - 1) / size;
        b = (int64_t)r * chunk < n ? (int64_t)r * chunk : n;
        e = b + chunk < n ? b + chunk : n;
    }
    if (begin) *begin = b;
    if (end) *end = e;
}

void nb__comm_scale(void *buf, int64_t n, nb_dtype dt, double factor) {
    switch (dt) {
    case NB_F32: {
        float *p = buf, f = (float)factor;
        for (int64_t i = 0; i < n; i++) p[i] *= f;
        break;
    }
    case NB_F64: {
        double *p = buf;
        for (int64_t i = 0; i < n; i++) p[i] *= factor;
        break;
    }
    case NB_F16: {
        uint16_t *p = buf;
        for (int64_t i = 0; i < n; i++) p[i] = nb_f32_to_f16(nb_f16_to_f32(p[i]) * (float)factor);
        break;
    }
    case NB_BF16: {
        uint16_t *p = buf;
        for (int64_t i = 0; i < n; i++)
            p[i] = nb_f32_to_bf16(nb_bf16_to_f32(p[i]) * (float)factor);
        break;
    }
    default: NB__ASSERT(!"nb__comm_scale: not a float dtype");
    }
}

/* ---- communicator objects ------------------------------------------------------------------ */
double nb__comm_default_timeout(void) {
    const char *s = getenv("NB_COMM_TIMEOUT");
    if (s && *s) {
        char *end;
        double v = strtod(s, &end);
        if (end != s && v >= 0 && isfinite(v)) return v;
        fprintf(stderr, "nabla: NB_COMM_TIMEOUT=\"%s\" is not a number of seconds; using %g\n", s,
                NB_COMM_TIMEOUT_DEFAULT);
    }
    return NB_COMM_TIMEOUT_DEFAULT;
}

nb_comm *nb__comm_alloc(const nb__comm_backend *be, int rank, int size, void *impl) {
    nb_comm *c = nb__obj_alloc(sizeof *c, NB__OBJ_COMM);
    if (!c) {
        nb__error(NB_ENOMEM, "comm: out of memory");
        return NULL;
    }
    c->be = be;
    c->rank = rank;
    c->size = size;
    c->impl = impl;
    atomic_init(&c->refs, 1);
    atomic_init(&c->timeout, nb__comm_default_timeout());
    atomic_init(&c->issued, 0);
    atomic_init(&c->completed, 0);
    atomic_init(&c->stall_seq, 0);
    atomic_init(&c->p2p_stalled, false);
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->sig_mu, NULL);
    return c;
}

void nb__comm_retain(nb_comm *c) { atomic_fetch_add(&c->refs, 1); }

void nb__comm_release(nb_comm *c) {
    if (!c || atomic_fetch_sub(&c->refs, 1) != 1) return;
    nb__comm_dev_free(c);
    c->be->destroy(c);
    for (nb_work *w = c->free_works, *next; w; w = next) {
        next = w->next;
        free(w);
    }
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->sig_mu);
    nb__obj_free(c);
}

/* A live communicator, or quietly false for NULL (the error set for a freed one). */
#define LIVE(c, op) ((c) && nb__obj_ok((c), NB__OBJ_COMM, (op)))
void nb_comm_free(nb_comm *c) {
    if (LIVE(c, "comm_free")) nb__comm_release(c);
}
int nb_comm_rank(const nb_comm *c) { return LIVE(c, "comm_rank") ? c->rank : -1; }
int nb_comm_size(const nb_comm *c) { return LIVE(c, "comm_size") ? c->size : 0; }
const char *nb_comm_backend(const nb_comm *c) {
    return LIVE(c, "comm_backend") ? c->be->name : "none";
}

void nb_comm_set_timeout(nb_comm *c, double seconds) {
    if (!LIVE(c, "comm_set_timeout")) return;
    if (!(seconds >= 0) || !isfinite(seconds)) {
        nb__error(NB_EINVAL, "comm_set_timeout: %g is not a number of seconds >= 0", seconds);
        return;
    }
    atomic_store(&c->timeout, seconds);
}
double nb_comm_timeout(const nb_comm *c) {
    return LIVE(c, "comm_timeout") ? atomic_load(&c->timeout) : 0;
}

/* NB_COMM_DEBUG=detail: the ranks agree on the collective before it starts (comm_check.c). */
static bool agreed(nb_comm *c, nb__coll k, nb_dtype dt, nb_reduce_op op, int root, int64_t n,
                   const char *name) {
    if (!nb__comm_debug()) return true;
    nb__sig s = nb__sig_of(k, dt, op, root, n);
    return nb__comm_debug_check(c, &s, name) == NB_OK;
}

nb_comm *nb_comm_split(nb_comm *c, int color, int key) {
    if (!c) {
        nb__error(NB_ENULL, "comm_split: comm is NULL");
        return NULL;
    }
    if (!nb__obj_ok(c, NB__OBJ_COMM, "comm_split")) return NULL;
    if (color < 0) {
        nb__error(NB_EINVAL, "comm_split: color %d is negative; colors must be >= 0", color);
        return NULL;
    }
    if (!agreed(c, NB__COLL_SPLIT, NB_F32, NB_REDUCE_SUM, -1, 0, "comm_split")) return NULL;
    nb_comm *n = c->be->split(c, color, key);
    if (n) {
        atomic_store(&n->timeout, atomic_load(&c->timeout));
        nb__comm_dev_split(c, n, color, key);
    }
    return n;
}

/* ---- works ---------------------------------------------------------------------------------- */
nb_work *nb__work_new(nb_comm *c, nb__coll kind) {
    pthread_mutex_lock(&c->mu);
    nb_work *w = c->free_works;
    if (w) {
        c->free_works = w->next;
        if (!c->free_works) c->free_tail = NULL;
        c->free_count--;
    }
    pthread_mutex_unlock(&c->mu);
    if (!w && !(w = malloc(sizeof *w))) {
        nb__error(NB_ENOMEM, "%s: out of memory", nb__coll_name(kind));
        return NULL;
    }
    memset(w, 0, offsetof(nb_work, be));
    memset(w->be, 0, sizeof w->be);
    nb__obj_init(&w->h, NB__OBJ_WORK, sizeof *w);
    w->next = NULL;
    w->comm = c;
    w->a.kind = kind;
    atomic_init(&w->state, NB__WORK_PENDING);
    atomic_init(&w->refs, 1);
    nb__comm_retain(c);
    return w;
}

static void work_drop_holds(nb_work *w) {
    for (int i = 0; i < 3; i++) {
        nb_tensor_free(w->hold[i]);
        w->hold[i] = NULL;
    }
    nb_tensor_free(w->user_out);
    nb_tensor_free(w->stage);
    w->user_out = w->stage = NULL;
}

void nb__work_release(nb_work *w) {
    if (atomic_fetch_sub(&w->refs, 1) != 1) return;
    nb_comm *c = w->comm;
    work_drop_holds(w);
    w->h.magic = NB__OBJ_FREED; /* nb_work_wait etc. on this handle: an error */
    pthread_mutex_lock(&c->mu);
    if (c->free_count < NB__WORK_CACHE) { /* to the end: reused last */
        w->next = NULL;
        if (c->free_tail) c->free_tail->next = w;
        else c->free_works = w;
        c->free_tail = w;
        c->free_count++;
        w = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    free(w);
    nb__comm_release(c);
}

void nb__work_done(nb_work *w) { atomic_store(&w->state, NB__WORK_DONE); }

void nb__work_fail(nb_work *w, nb_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->msg, sizeof w->msg, fmt, ap);
    va_end(ap);
    w->status = s;
    atomic_store(&w->state, NB__WORK_FAILED);
}

void nb__work_fail_wrap(nb_work *w, nb_status s, const char *fmt, ...) {
    char ctx[NB__COMM_MSG], inner[NB__COMM_MSG];
    snprintf(inner, sizeof inner, "%s", nb_last_error()); /* before anything else sets it */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    nb__wrap_msg(w->msg, sizeof w->msg, ctx, inner, s);
    w->status = s;
    atomic_store(&w->state, NB__WORK_FAILED);
}

/* A failed start: nothing is in flight; return the handle. */
static nb_work *work_abort(nb_work *w) {
    w->finished = true;
    nb__work_release(w);
    return NULL;
}

/* ---- staging ---------------------------------------------------------------------------------
 * Each returns false with the error set. `hold` keeps tensors alive while in flight. */
static void hold(nb_work *w, nb_tensor *t) {
    for (int i = 0; i < 3; i++)
        if (!w->hold[i]) {
            w->hold[i] = t;
            return;
        }
    NB__ASSERT(!"hold: more than three tensors");
}

/* Whether the backend of w's communicator moves t's memory as it is: host memory, or for a
 * backend of device buffers (nccl) any tensor, since nb__comm_route sends it only tensors
 * of its GPU. */
static bool native(const nb_work *w, const nb_tensor *t) {
    return w->comm->be->device_buffers || nb__host_accessible(t);
}

/* A tensor read and written in place (allreduce, broadcast, reduce, recv). */
static void *stage_inout(nb_work *w, nb_tensor *t, bool copy_in) {
    bool host = native(w, t);
    if (host && nb_is_contiguous(t)) {
        hold(w, nb_tensor_retain(t));
        return nb__ptr(t);
    }
    nb_device sd = w->comm->be->device_buffers ? nb__device_of(t) : NB_CPU;
    nb_tensor *s = !copy_in ? nb__empty(t->shape, t->ndim, t->dtype, sd)
                   : host   ? nb_clone(t)
                            : nb_to_device(t, NB_CPU); /* a contiguous host copy */
    if (!s) return NULL;
    w->stage = nb__scope_take(s);
    w->user_out = nb_tensor_retain(t);
    return nb__ptr(s);
}

/* A tensor only read. A copy also when it overlaps `other` (an output MPI must not alias). */
static const void *stage_in(nb_work *w, const nb_tensor *t, const nb_tensor *other) {
    nb_tensor *tt = nb__mut(t);
    bool host = native(w, t);
    if (host && nb_is_contiguous(t) && !(other && nb_shares_storage(t, other))) {
        hold(w, nb_tensor_retain(tt));
        return nb__ptr(t);
    }
    nb_tensor *s = host ? nb_clone(tt) : nb_to_device(tt, NB_CPU); /* fresh: never aliases */
    if (!s) return NULL;
    hold(w, nb__scope_take(s));
    return nb__ptr(s);
}

static bool check_tensor(const nb_tensor *t, const char *op, const char *name) {
    if (!nb__arg_ok(t, op, name)) return false;
    const nb__backend *be = nb__backend_of(nb__device_of(t), op);
    if (!be) return false;
    if (!be->has_storage) {
        nb__error(NB_EDEVICE, "%s: %s is a %s tensor, which holds no data to communicate", op,
                  name, be->name);
        return false;
    }
    return true;
}

/* A staged output back into the caller's tensor, on the caller's device. */
static nb_status copy_back(nb_tensor *dst, nb_tensor *staged) {
    if (nb_device_equal(nb__device_of(dst), nb__device_of(staged)))
        return nb_copy_(dst, staged);
    nb_scope_begin();
    nb_tensor *d = nb_to_device(staged, nb__device_of(dst));
    nb_status st = d ? nb_copy_(dst, d) : nb_last_status();
    nb_scope_end();
    return st;
}

static bool check_comm(const nb_comm *c, const char *op) {
    if (c) return nb__obj_ok(c, NB__OBJ_COMM, op);
    nb__error(NB_ENULL, "%s: comm is NULL", op);
    return false;
}

static bool check_op(nb_reduce_op op, nb_dtype dt, const char *opname) {
    if ((unsigned)op > NB_REDUCE_MIN) {
        nb__error(NB_EINVAL, "%s: %d is not a reduce op (NB_REDUCE_SUM, AVG, MAX or MIN)", opname,
                  (int)op);
        return false;
    }
    if (op == NB_REDUCE_AVG && !nb_dtype_is_float(dt)) {
        nb__error(NB_EDTYPE, "%s: NB_REDUCE_AVG needs a floating-point tensor, got %s; reduce with "
                  "NB_REDUCE_SUM and divide", opname, nb_dtype_name(dt));
        return false;
    }
    return true;
}

static bool check_rank(const nb_comm *c, int r, const char *op, const char *what) {
    if (r >= 0 && r < c->size) return true;
    nb__error(NB_EINVAL, "%s: %s %d is not a rank of this %d-rank communicator", op, what, r,
              c->size);
    return false;
}

static bool check_same_dtype(const nb_tensor *out, const nb_tensor *in, const char *op) {
    if (out->dtype == in->dtype) return true;
    nb__error(NB_EDTYPE, "%s: out is %s but in is %s; they must have the same dtype", op,
              nb_dtype_name(out->dtype), nb_dtype_name(in->dtype));
    return false;
}

/* Number the operation (a collective: recording its signature for the peers' checks, or
 * refusing it when the ranks are out of step), start it on the backend. */
nb_work *nb__work_launch(nb_comm *c, nb_work *w) {
    if (!nb__coll_is_p2p(w->a.kind)) {
        if (nb__comm_refuse_out_of_step(c, nb__coll_name(w->a.kind)) != NB_OK)
            return work_abort(w);
        w->seq = atomic_fetch_add(&c->issued, 1) + 1;
        nb__sig sig = nb__work_sig(w);
        nb__comm_sig_record(c, &sig);
    }
    w->t_start = nb__now();
    w->next_check = w->t_start + NB__CHECK_FIRST;
    int tok = NB__SPAN_BEGIN(start_names[w->a.kind], NULL, NB__CAT_COMM);
    nb_status st = c->be->start[w->a.kind](c, w);
    NB__SPAN_END_ARG(tok, "bytes", work_bytes(w));
    if (st != NB_OK) return work_abort(w);
    return w;
}

/* ---- asynchronous forms ------------------------------------------------------------------------ */
nb_work *nb_allreduce_async(nb_comm *c, nb_tensor *t, nb_reduce_op op) {
    if (!check_comm(c, "allreduce") || !check_tensor(t, "allreduce", "t") ||
        !check_op(op, t->dtype, "allreduce"))
        return NULL;
    if (!agreed(c, NB__COLL_ALLREDUCE, t->dtype, op, -1, nb_numel(t), "allreduce") ||
        !(c = nb__comm_route(c, NB__COLL_ALLREDUCE, t, NULL, "allreduce")))
        return NULL;
    nb_work *w = nb__work_new(c, NB__COLL_ALLREDUCE);
    if (!w) return NULL;
    w->a.dtype = t->dtype;
    w->a.op = op;
    w->a.count = nb_numel(t);
    if (!(w->a.buf = stage_inout(w, t, true))) return work_abort(w);
    return nb__work_launch(c, w);
}

nb_work *nb_broadcast_async(nb_comm *c, nb_tensor *t, int root) {
    if (!check_comm(c, "broadcast") || !check_tensor(t, "broadcast", "t") ||
        !check_rank(c, root, "broadcast", "root"))
        return NULL;
    if (!agreed(c, NB__COLL_BROADCAST, t->dtype, NB_REDUCE_SUM, root, nb_numel(t), "broadcast") ||
        !(c = nb__comm_route(c, NB__COLL_BROADCAST, t, NULL, "broadcast")))
        return NULL;
    nb_work *w = nb__work_new(c, NB__COLL_BROADCAST);
    if (!w) return NULL;
    w->a.dtype = t->dtype;
    w->a.peer = root;
    w->a.count = nb_numel(t);
    if (!(w->a.buf = stage_inout(w, t, c->rank == root))) return work_abort(w);
    return nb__work_launch(c, w);
}

nb_work *nb_reduce_async(nb_comm *c, nb_tensor *t, nb_reduce_op op, int root) {
    if (!check_comm(c, "reduce") || !check_tensor(t, "reduce", "t") ||
        !check_op(op, t->dtype, "reduce") || !check_rank(c, root, "reduce", "root"))
        return NULL;
    if (!agreed(c, NB__COLL_REDUCE, t->dtype, op, root, nb_numel(t), "reduce") ||
        !(c = nb__comm_route(c, NB__COLL_REDUCE, t, NULL, "reduce")))
        return NULL;
    nb_work *w = nb__work_new(c, NB__COLL_REDUCE);
    if (!w) return NULL;
    w->a.dtype = t->dtype;
    w->a.op = op;
    w->a.peer = root;
    w->a.count = nb_numel(t);
    if (!(w->a.buf = stage_inout(w, t, true))) return work_abort(w);
    /* Only the root's tensor changes; elsewhere a staged copy need not be copied back. */
    if (c->rank != root && w->user_out) {
        nb_tensor_free(w->user_out);
        w->user_out = NULL;
    }
    return nb__work_launch(c, w);
}

nb_work *nb_allgather_async(nb_comm *c, nb_tensor *out, const nb_tensor *in) {
    if (!check_comm(c, "allgather") || !check_tensor(out, "allgather", "out") ||
        !check_tensor(in, "allgather", "in") || !check_same_dtype(out, in, "allgather"))
        return NULL;
    int64_t n_in = nb_numel(in), n_out = nb_numel(out), b, e;
    nb_comm_chunk(n_out, c->size, c->rank, &b, &e);
    bool equal = n_out == n_in * c->size;
    if (!equal && n_in != e - b) {
        nb__error(NB_ESHAPE, "allgather: out %s has %lld elements; it must have %d x %lld (the "
                  "communicator's size times in's %s), or in must be this rank's chunk of out "
                  "(%lld elements, see nb_comm_chunk)", NB__SHAPE(out), (long long)n_out, c->size,
                  (long long)n_in, NB__SHAPE(in), (long long)(e - b));
        return NULL;
    }
    if (!agreed(c, NB__COLL_ALLGATHER, in->dtype, NB_REDUCE_SUM, -1, n_out, "allgather") ||
        !(c = nb__comm_route(c, NB__COLL_ALLGATHER, out, in, "allgather")))
        return NULL;
    nb_work *w = nb__work_new(c, NB__COLL_ALLGATHER);
    if (!w) return NULL;
    w->a.dtype = in->dtype;
    w->a.chunked = !equal;
    w->a.in_count = n_in;
    w->a.out_count = n_out;
    if (!(w->a.out = stage_inout(w, out, false))) return work_abort(w);
    /* in aliasing out (e.g. a view of its own block, ZeRO's layout) is copied first: MPI
     * forbids aliased buffers, and MPI_IN_PLACE would have to be used on every rank alike. */
    if (!(w->a.in = stage_in(w, in, out))) return work_abort(w);
    return nb__work_launch(c, w);
}

nb_work *nb_reduce_scatter_async(nb_comm *c, nb_tensor *out, const nb_tensor *in,
                                 nb_reduce_op op) {
    if (!check_comm(c, "reduce_scatter") || !check_tensor(out, "reduce_scatter", "out") ||
        !check_tensor(in, "reduce_scatter", "in") ||
        !check_same_dtype(out, in, "reduce_scatter") || !check_op(op, in->dtype, "reduce_scatter"))
        return NULL;
    int64_t n = nb_numel(in), b, e;
    nb_comm_chunk(n, c->size, c->rank, &b, &e);
    if (nb_numel(out) != e - b) {
        nb__error(NB_ESHAPE, "reduce_scatter: out %s has %lld elements but rank %d's chunk of in's "
                  "%lld elements over %d ranks has %lld (see nb_comm_chunk)", NB__SHAPE(out),
                  (long long)nb_numel(out), c->rank, (long long)n, c->size, (long long)(e - b));
        return NULL;
    }
    if (!agreed(c, NB__COLL_REDUCE_SCATTER, in->dtype, op, -1, n, "reduce_scatter") ||
        !(c = nb__comm_route(c, NB__COLL_REDUCE_SCATTER, out, in, "reduce_scatter")))
        return NULL;
    nb_work *w = nb__work_new(c, NB__COLL_REDUCE_SCATTER);
    if (!w) return NULL;
    w->a.dtype = in->dtype;
    w->a.op = op;
    w->a.chunked = true;
    w->a.in_count = n;
    w->a.out_count = e - b;
    if (!(w->a.out = stage_inout(w, out, false)) || !(w->a.in = stage_in(w, in, out)))
        return work_abort(w);
    return nb__work_launch(c, w);
}

nb_work *nb_all_to_all_async(nb_comm *c, nb_tensor *out, const nb_tensor *in) {
    if (!check_comm(c, "all_to_all") || !check_tensor(out, "all_to_all", "out") ||
        !check_tensor(in, "all_to_all", "in") || !check_same_dtype(out, in, "all_to_all"))
        return NULL;
    int64_t n = nb_numel(in);
    if (nb_numel(out) != n || n % c->size != 0) {
        nb__error(NB_ESHAPE, "all_to_all: in %s and out %s must have the same number of elements, "
                  "divisible by the communicator's size %d", NB__SHAPE(in), NB__SHAPE(out),
                  c->size);
        return NULL;
    }
    if (!agreed(c, NB__COLL_ALL_TO_ALL, in->dtype, NB_REDUCE_SUM, -1, n, "all_to_all") ||
        !(c = nb__comm_route(c, NB__COLL_ALL_TO_ALL, out, in, "all_to_all")))
        return NULL;
    nb_work *w = nb__work_new(c, NB__COLL_ALL_TO_ALL);
    if (!w) return NULL;
    w->a.dtype = in->dtype;
    w->a.in_count = w->a.out_count = n;
    if (!(w->a.out = stage_inout(w, out, false)) || !(w->a.in = stage_in(w, in, out)))
        return work_abort(w);
    return nb__work_launch(c, w);
}

nb_work *nb_barrier_async(nb_comm *c) {
    if (!check_comm(c, "barrier") ||
        !agreed(c, NB__COLL_BARRIER, NB_F32, NB_REDUCE_SUM, -1, 0, "barrier"))
        return NULL;
    nb_work *w = nb__work_new(c, NB__COLL_BARRIER);
    return w ? nb__work_launch(c, w) : NULL;
}

static bool check_tag(int tag, const char *op) {
    if (tag >= 0) return true;
    nb__error(NB_EINVAL, "%s: tag %d is negative; tags must be >= 0", op, tag);
    return false;
}

nb_work *nb_send_async(nb_comm *c, const nb_tensor *t, int dst, int tag) {
    if (!check_comm(c, "send") || !check_tensor(t, "send", "t") ||
        !check_rank(c, dst, "send", "destination") || !check_tag(tag, "send"))
        return NULL;
    nb_work *w = nb__work_new(c, NB__COLL_SEND);
    if (!w) return NULL;
    w->a.dtype = t->dtype;
    w->a.peer = dst;
    w->a.tag = tag;
    w->a.count = nb_numel(t);
    if (!(w->a.buf = nb__unconst(stage_in(w, t, NULL)))) return work_abort(w);
    return nb__work_launch(c, w);
}

nb_work *nb_recv_async(nb_comm *c, nb_tensor *t, int src, int tag) {
    if (!check_comm(c, "recv") || !check_tensor(t, "recv", "t") ||
        !check_rank(c, src, "recv", "source") || !check_tag(tag, "recv"))
        return NULL;
    nb_work *w = nb__work_new(c, NB__COLL_RECV);
    if (!w) return NULL;
    w->a.dtype = t->dtype;
    w->a.peer = src;
    w->a.tag = tag;
    w->a.count = nb_numel(t);
    if (!(w->a.buf = stage_inout(w, t, false))) return work_abort(w);
    return nb__work_launch(c, w);
}

/* ---- waiting ------------------------------------------------------------------------------------ */
/* The caller's side of a finished work: copy a staged output back, drop the tensors. */
static nb_status work_finish(nb_work *w) {
    nb_status st = NB_OK;
    if (w->finished) return atomic_load(&w->state) == NB__WORK_FAILED ? w->status : NB_OK;
    w->finished = true;
    if (NB__TRACE_ACTIVE())
        nb__trace_async(coll_names[w->a.kind], NB__CAT_COMM, w->seq ? w->seq : (int64_t)(intptr_t)w,
                        (int64_t)(w->t_start * 1e9), nb__trace_now_ns(), "bytes", work_bytes(w));
    const bool failed = atomic_load(&w->state) == NB__WORK_FAILED;
    if (failed) {
        st = nb__error(w->status, "%s", w->msg);
    } else if (w->user_out) {
        st = copy_back(w->user_out, w->stage);
    }
    if (!nb__coll_is_p2p(w->a.kind)) {
        /* A collective that had completed before an earlier one timed out, and is only
         * waited for now, says nothing about the communicator moving again. */
        long long ss = atomic_load(&w->comm->stall_seq);
        if (failed) {
            atomic_store(&w->comm->stalled, true);
        } else if (ss == 0 || w->seq > ss) {
            atomic_store(&w->comm->stall_seq, 0);
            atomic_store(&w->comm->stalled, false);
        }
    } else if (!failed && atomic_load(&w->comm->p2p_stalled)) {
        nb_comm *c = w->comm; /* a send or recv started after the timeout got through */
        pthread_mutex_lock(&c->mu);
        if (w->t_start > c->p2p_stall_at) atomic_store(&c->p2p_stalled, false);
        pthread_mutex_unlock(&c->mu);
    }
    work_drop_holds(w);
    return st;
}

bool nb__comm_stalled(nb_comm *c) { return c && atomic_load(&c->stalled); }

static void describe(const nb_work *w, char *buf, size_t n) {
    if (w->a.kind == NB__COLL_SEND)
        snprintf(buf, n, "send to rank %d (tag %d)", w->a.peer, w->a.tag);
    else if (w->a.kind == NB__COLL_RECV)
        snprintf(buf, n, "recv from rank %d (tag %d)", w->a.peer, w->a.tag);
    else
        snprintf(buf, n, "%s (collective #%lld on this communicator)", nb__coll_name(w->a.kind),
                 (long long)w->seq);
}

/* Set the NB_ETIMEOUT error for w (after asking the backend who is missing). Returns true
 * if w completed meanwhile after all. `earlier`: the collective that timed out before w
 * on its communicator (nb__work_wait_keep), whose peers' answers stand for w's; `same_peer`:
 * a send or recv to w's peer timed out before, its answer stands for w's. */
static bool timeout_error(nb_work *w, double waited, long long earlier, bool same_peer) {
    nb_comm *c = w->comm;
    char diag[NB__COMM_MSG], what[128];
    diag[0] = 0;
    if (earlier > 0 || same_peer) {
        char why[NB__COMM_MSG];
        pthread_mutex_lock(&c->mu);
        snprintf(why, sizeof why, "%s", earlier > 0 ? c->stall_why : c->p2p_stall_why);
        pthread_mutex_unlock(&c->mu);
        if (earlier > 0)
            snprintf(diag, sizeof diag, "not waited for again after collective #%lld timed out "
                     "on this communicator: %.400s", earlier, why);
        else
            snprintf(diag, sizeof diag, "not waited for again after an earlier send or recv "
                     "with rank %d timed out on this communicator: %.400s", w->a.peer, why);
    } else {
        c->be->diagnose(w, diag, sizeof diag);
    }
    if (c->be->test(w) != 0) return true;
    describe(w, what, sizeof what);
    nb__error(NB_ETIMEOUT, "%s timed out after %.3g s on rank %d of %d: %s", what, waited,
              c->rank, c->size, diag[0] ? diag : "rank(s) unknown");
    if (earlier == 0 && !same_peer) { /* the peers' answers, for the next */
        bool p2p = nb__coll_is_p2p(w->a.kind);
        pthread_mutex_lock(&c->mu);
        snprintf(p2p ? c->p2p_stall_why : c->stall_why, NB__COMM_MSG, "%s",
                 diag[0] ? diag : "rank(s) unknown");
        if (p2p) c->p2p_stall_at = nb__now(), c->p2p_stall_peer = w->a.peer;
        else c->stall_at = nb__now();
        pthread_mutex_unlock(&c->mu);
        if (p2p) atomic_store(&c->p2p_stalled, true);
        else atomic_store(&c->stall_seq, w->seq);
    }
    return false;
}

/* The caller gives w up (the backend may keep it in flight). */
static void work_abandon(nb_work *w) {
    w->abandoned = true;
    w->finished = true; /* holds stay with the work until the backend lets it go */
    w->comm->be->abandon(w);
    nb__work_release(w);
}

/* Whether the ranks disagree on w (a collective): its communicator is out of step, or the
 * backend's check found a peer whose collective of the same number differs (the
 * communicator is then out of step). The reason in msg. */
static bool disagree(nb_work *w, char *msg, size_t n) {
    if (nb__coll_is_p2p(w->a.kind)) return false;
    char why[NB__COMM_MSG];
    if (nb__comm_out_of_step(w->comm, why, sizeof why)) {
        char ctx[128];
        snprintf(ctx, sizeof ctx, "%s (collective #%lld on this communicator): the ranks are "
                 "out of step", nb__coll_name(w->a.kind), (long long)w->seq);
        nb__wrap_msg(msg, n, ctx, why, NB_ECOMM);
        return true;
    }
    if (w->internal || !w->comm->be->check || w->comm->be->check(w, msg, n) != 1) return false;
    nb__comm_put_out_of_step(w->comm, msg);
    return true;
}

/* End w, on which the ranks disagree: withdrawn by the backend (w failed with msg, still the
 * caller's), or given up. */
static nb_status work_disagreed(nb_work *w, const char *msg, bool *gave_up) {
    if (w->comm->be->cancel && w->comm->be->cancel(w, msg)) return work_finish(w);
    nb__error(NB_ECOMM, "%s", msg);
    work_abandon(w);
    *gave_up = true;
    return NB_ECOMM;
}

nb_status nb__work_wait_keep(nb_work *w, bool *gave_up) {
    nb_comm *c = w->comm;
    *gave_up = false;
    double t0 = nb__now(), to = atomic_load(&c->timeout), deadline = to > 0 ? t0 + to : 0;
    /* The timeout counts from the call (the caller may compute long between start and wait)
     * - unless an operation of this communicator timed out since w started (a collective,
     * with none issued after it completed since; a send or recv, with none started after it
     * completed since): then w waits only what is left of a timeout since its start (nothing
     * if it is older), and the earlier diagnosis stands for w's when it covers w's peers (a
     * collective's for a collective, a send or recv's for one with the same peer). A rank
     * that finds a dead peer in one of several operations in flight (a backward's buckets, a
     * pipeline's sends and receives) then fails them all within about one timeout, not one
     * timeout each. */
    const bool p2p = nb__coll_is_p2p(w->a.kind);
    long long earlier = 0;
    bool same_peer = false, since = false;
    if (to > 0) {
        long long ss = atomic_load(&c->stalled) ? atomic_load(&c->stall_seq) : 0;
        bool ps = atomic_load(&c->p2p_stalled);
        if (ss > 0 || ps) {
            pthread_mutex_lock(&c->mu);
            if (ss > 0 && w->t_start < c->stall_at) {
                since = true;
                if (!p2p) earlier = ss;
            }
            if (ps && w->t_start < c->p2p_stall_at) {
                since = true;
                same_peer = p2p && w->a.peer == c->p2p_stall_peer && earlier == 0;
            }
            pthread_mutex_unlock(&c->mu);
        }
        if (since && w->t_start + to < deadline) deadline = w->t_start + to;
    }
    int r = atomic_load(&w->state);
    if (r == NB__WORK_PENDING) {
        int slot = nb__wait_begin(w); /* for the peers' "where are you?" */
        int tok = NB__SPAN_BEGIN(wait_names[w->a.kind], NULL, NB__CAT_COMM);
        /* A collective is waited for in slices: after each, whether the ranks disagree. */
        bool checks = !nb__coll_is_p2p(w->a.kind);
        double gap = NB__CHECK_FIRST, next = w->t_start + gap;
        char msg[NB__COMM_MSG];
        bool disagreed = false;
        for (;;) {
            double until = checks && (deadline <= 0 || next < deadline) ? next : deadline;
            r = c->be->wait(w, until);
            if (r != 0 || !checks || (deadline > 0 && nb__now() >= deadline)) break;
            if ((disagreed = disagree(w, msg, sizeof msg))) break;
            gap = 2 * gap < NB__CHECK_MAX ? 2 * gap : NB__CHECK_MAX;
            next = nb__now() + gap;
        }
        NB__SPAN_END_ARG(tok, "seq", w->seq);
        nb__wait_end(slot);
        if (disagreed) return work_disagreed(w, msg, gave_up);
    }
    if (r == 0 && !timeout_error(w, nb__now() - (since ? w->t_start : t0), earlier, same_peer)) {
        if (!nb__coll_is_p2p(w->a.kind)) atomic_store(&c->stalled, true);
        work_abandon(w);
        *gave_up = true;
        return NB_ETIMEOUT;
    }
    return work_finish(w);
}

nb_status nb_work_wait(nb_work *w) {
    if (!w) {
        if (nb_last_status() != NB_OK) return nb_last_status();
        return nb__error(NB_ENULL, "work_wait: work is NULL");
    }
    if (!nb__obj_ok(w, NB__OBJ_WORK, "work_wait")) return nb_last_status();
    bool gave_up;
    nb_status st = nb__work_wait_keep(w, &gave_up);
    if (!gave_up) nb__work_release(w);
    return st;
}

int nb_work_test(nb_work *w) {
    if (!w) {
        if (nb_last_status() != NB_OK) return nb_last_status();
        return nb__error(NB_ENULL, "work_test: work is NULL");
    }
    if (!nb__obj_ok(w, NB__OBJ_WORK, "work_test")) return nb_last_status();
    if (w->test_failed) return w->test_failed;
    int r = atomic_load(&w->state);
    if (r == NB__WORK_PENDING) r = w->comm->be->test(w);
    if (r == 0) {
        double now = nb__now(), to = atomic_load(&w->comm->timeout), waited = now - w->t_start;
        if (to > 0 && waited > to && !timeout_error(w, waited, 0, false)) {
            w->test_failed = NB_ETIMEOUT;
            return NB_ETIMEOUT;
        }
        char msg[NB__COMM_MSG];
        if (now >= w->next_check && !nb__coll_is_p2p(w->a.kind)) {
            if (disagree(w, msg, sizeof msg)) {
                if (w->comm->be->cancel && w->comm->be->cancel(w, msg)) {
                    nb_status st = work_finish(w);
                    return st == NB_OK ? 1 : st;
                }
                w->test_failed = nb__error(NB_ECOMM, "%s", msg); /* nb_work_free gives it up */
                return NB_ECOMM;
            }
            double gap = now - w->t_start; /* doubling intervals, as nb_work_wait's */
            w->next_check = now + (gap < NB__CHECK_MAX ? gap : NB__CHECK_MAX);
        }
        if (atomic_load(&w->state) == NB__WORK_PENDING) return 0;
    }
    nb_status st = work_finish(w);
    return st == NB_OK ? 1 : st;
}

void nb_work_free(nb_work *w) {
    if (!w || !nb__obj_ok(w, NB__OBJ_WORK, "work_free")) return;
    if (atomic_load(&w->state) == NB__WORK_PENDING && w->comm->be->test(w) == 0) {
        work_abandon(w);
        return;
    }
    if (!w->finished) {
        /* Completed but never observed: results of a staged output are still copied back
         * (the caller asked for them by starting the operation); a failure stays quiet. */
        w->finished = true;
        if (atomic_load(&w->state) == NB__WORK_DONE && w->user_out)
            copy_back(w->user_out, w->stage);
        work_drop_holds(w);
    }
    nb__work_release(w);
}

/* ---- blocking forms ------------------------------------------------------------------------------ */
static nb_status run(nb_work *w) {
    if (!w) return nb_last_status() != NB_OK ? nb_last_status() : NB_EINTERNAL;
    return nb_work_wait(w);
}

nb_status nb_allreduce(nb_comm *c, nb_tensor *t, nb_reduce_op op) {
    return run(nb_allreduce_async(c, t, op));
}
nb_status nb_broadcast(nb_comm *c, nb_tensor *t, int root) {
    return run(nb_broadcast_async(c, t, root));
}
nb_status nb_reduce(nb_comm *c, nb_tensor *t, nb_reduce_op op, int root) {
    return run(nb_reduce_async(c, t, op, root));
}
nb_status nb_allgather(nb_comm *c, nb_tensor *out, const nb_tensor *in) {
    return run(nb_allgather_async(c, out, in));
}
nb_status nb_reduce_scatter(nb_comm *c, nb_tensor *out, const nb_tensor *in, nb_reduce_op op) {
    return run(nb_reduce_scatter_async(c, out, in, op));
}
nb_status nb_all_to_all(nb_comm *c, nb_tensor *out, const nb_tensor *in) {
    return run(nb_all_to_all_async(c, out, in));
}
nb_status nb_barrier(nb_comm *c) { return run(nb_barrier_async(c)); }
nb_status nb_send(nb_comm *c, const nb_tensor *t, int dst, int tag) {
    return run(nb_send_async(c, t, dst, tag));
}
nb_status nb_recv(nb_comm *c, nb_tensor *t, int src, int tag) {
    return run(nb_recv_async(c, t, src, tag));
}
