/* comm_mpi.c - the MPI backend ("mpi"), compiled when meson found MPI (NB_HAVE_MPI):
 * initialization and finalization, communicators, and the collectives.
 *
 * How a collective runs. Small ones (up to NB__MPI_SMALL_BYTES) are nabla's own schedules
 * of point-to-point messages (comm_mpi_small.c), advanced by MPI_Test polling in wait/test:
 * no thread hand-off, whose wake-up latency (tens of microseconds on a busy machine) would
 * dwarf them, and none of the overhead of Open MPI's nonblocking collectives (libnbc, about
 * twice the blocking call's time on small messages). Large ones are MPI's blocking
 * collectives (MPI_Allreduce, ...) run by one worker thread per communicator: those use
 * MPI's tuned algorithms (libnbc reaches only 0.3-0.6 of their bandwidth on large messages
 * here), and the thread makes progress while the caller computes, which is what
 * overlapping gradient allreduce with backward needs. The caller waits on a condition
 * variable with a deadline, so every wait has a timeout although MPI's blocking calls have
 * none.
 *
 * Order. Collectives reach MPI in the order the caller started them: a small one is issued
 * by the caller only while the worker has nothing queued or running, otherwise it joins
 * the worker's queue and the worker issues it (posts its first messages, without waiting
 * for it) in turn. Which path a collective takes depends only on the arguments, never on
 * timing, so it is the same on every rank. Point-to-point operations are
 * MPI_Isend/MPI_Irecv by the caller, polled with MPI_Test (queueing them behind
 * collectives could deadlock an exchange).
 *
 * Who did not arrive, and abandoned requests: comm_mpi_ctl.c.
 *
 * Errors: every communicator uses MPI_ERRORS_RETURN, so MPI errors become NB_ECOMM with
 * MPI_Error_string's text. A dead peer usually produces no MPI error at all (shared-memory
 * transports just never deliver), hence the timeouts.
 *
 * Life cycle. MPI is initialized on first use with MPI_THREAD_MULTIPLE unless the program
 * did it; nabla then finalizes it at exit, except while an operation is still stuck in MPI
 * (a timed-out collective): MPI_Finalize would wait for the missing peer forever, so the
 * process exits without it and the launcher ends the job. If the program initialized MPI
 * with less than MPI_THREAD_MULTIPLE, nabla runs collectives inline on the calling thread
 * (serialized by a lock) with blocking MPI calls: correct, but without timeouts for
 * collectives and without overlap. */
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "parallel/comm_mpi.h"
#include "nb_config.h"
#include "tensor/trace.h"

#define PIECE (1LL << 30)                /* elements per MPI call (counts are int) */
#define HALF_PIECE (1LL << 22)           /* f16/bf16 elements staged in f32 at a time */

nb__mpi_state nb__mpi = {.mu = PTHREAD_MUTEX_INITIALIZER,
                         .inline_mu = PTHREAD_MUTEX_INITIALIZER};
#define g nb__mpi

void nb__mpi_sleep(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void err_str(int rc, char *buf, size_t n) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "error code %d", rc);
    snprintf(buf, n, "%s", s);
}

static nb_status mpi_error(int rc, const char *what) {
    char s[MPI_MAX_ERROR_STRING];
    err_str(rc, s, sizeof s);
    return nb__error(NB_ECOMM, "%s: MPI error: %s", what, s);
}

void nb__mpi_fail(nb_work *w, int rc) {
    char s[MPI_MAX_ERROR_STRING];
    err_str(rc, s, sizeof s);
    nb__work_fail(w, NB_ECOMM, "%s on rank %d of %d: MPI error: %s", nb__coll_name(w->a.kind),
                  w->comm->rank, w->comm->size, s);
}

/* ---- launcher detection, initialization, finalization ------------------------------------ */
bool nb__comm_mpi_initialized(void) {
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    return inited || fin; /* finalized: nb__comm_mpi_world says so */
}

static void stop_worker(nb__mpi_comm *m);

/* A reference to c unless its count already reached 0 (then it is being destroyed: the
 * destroying thread unregisters it and clears nb__mpi.world, but until then both still
 * point to it). */
static bool retain_live(nb_comm *c) {
    int r = atomic_load(&c->refs);
    while (r > 0)
        if (atomic_compare_exchange_weak(&c->refs, &r, r + 1)) return true;
    return false;
}

/* Runs first thing in MPI_Finalize, whoever calls it (an attribute of MPI_COMM_SELF is
 * deleted then): the control thread must not be inside MPI any more. */
static int on_finalize(MPI_Comm comm, int key, void *val, void *extra) {
    nb__mpi_ctl_stop();
    pthread_mutex_lock(&g.mu);
    g.finalized = true;
    pthread_mutex_unlock(&g.mu);
    return MPI_SUCCESS;
}

/* Something still inside MPI (a timed-out collective, an operation never waited for). */
static bool any_busy(void) {
    if (atomic_load(&g.stuck) > 0) return true;
    bool busy = false;
    pthread_mutex_lock(&g.mu);
    for (nb__mpi_comm *m = g.reg; m; m = m->next_reg) {
        pthread_mutex_lock(&m->mu);
        if (m->running || m->qhead || atomic_load(&m->inflight) > 0) busy = true;
        pthread_mutex_unlock(&m->mu);
    }
    pthread_mutex_unlock(&g.mu);
    return busy;
}

static void at_exit(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin || !g.init_by_us) return;
    /* MPI_Finalize would wait for a missing peer forever: exit without it, and the launcher
     * reports the unfinalized process and ends the job. */
    if (any_busy()) return;
    /* Communicators the program did not free: stop their (idle) workers and cancel their
     * control receives, so that nothing of nabla's is inside MPI when it finalizes. Each is
     * held while that happens: another thread may be dropping its last reference right
     * now (a worker or the control thread releasing a finished operation), and then it is
     * that thread's to destroy - wait until it has unregistered it. */
    double t0 = nb__now();
    for (;;) {
        pthread_mutex_lock(&g.mu);
        nb__mpi_comm *m = g.reg;
        nb_comm *c = m ? m->c : NULL; /* valid while registered */
        bool held = c && retain_live(c);
        pthread_mutex_unlock(&g.mu);
        if (!m) break;
        if (!held) {
            if (nb__now() - t0 > 2) return; /* should not happen: better no MPI_Finalize */
            sched_yield();
            continue;
        }
        stop_worker(m);
        nb__mpi_ctl_unregister(m);
        nb__comm_release(c); /* destroys it if the program let go meanwhile */
    }
    /* Workers that are destroying their own communicator still call MPI. */
    while (atomic_load(&g.teardown) > 0) {
        if (nb__now() - t0 > 2) return;
        sched_yield();
    }
    nb__mpi_ctl_stop();
    MPI_Finalize();
}

static nb_status ensure_init(void) {
    int inited = 0, fin = 0;
    MPI_Finalized(&fin);
    if (fin) return nb__error(NB_ESTATE, "comm_world: MPI was already finalized");
    MPI_Initialized(&inited);
    if (!inited) {
        int provided = 0;
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS) return mpi_error(rc, "comm_world: MPI_Init_thread");
        g.init_by_us = true;
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        atexit(at_exit);
    }
    static bool hooked = false;
    if (!hooked) {
        int key;
        if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, on_finalize, &key, NULL) ==
            MPI_SUCCESS) {
            MPI_Comm_set_attr(MPI_COMM_SELF, key, NULL);
            MPI_Comm_free_keyval(&key); /* MPI keeps it until the attribute goes */
        }
        hooked = true;
    }
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    g.threads = level >= MPI_THREAD_MULTIPLE;
    if (!g.threads)
        fprintf(stderr, "nabla: MPI was initialized without MPI_THREAD_MULTIPLE; collectives "
                "run on the calling thread, without timeouts or overlap\n");
    return NB_OK;
}

/* ---- types --------------------------------------------------------------------------------- */
static MPI_Datatype raw_type(nb_dtype dt) {
    switch (nb_dtype_size(dt)) {
    case 1: return MPI_UINT8_T;
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;
    default: return MPI_UINT64_T;
    }
}

/* The MPI type and op a reduction runs in: halves are staged in f32; bool is a byte where
 * sum and max are a logical or, min a logical and. */
static void red_type(nb_dtype dt, nb_reduce_op op, MPI_Datatype *t, MPI_Op *o) {
    switch (dt) {
    case NB_F64: *t = MPI_DOUBLE; break;
    case NB_I32: *t = MPI_INT32_T; break;
    case NB_I64: *t = MPI_INT64_T; break;
    case NB_U8:
    case NB_BOOL: *t = MPI_UINT8_T; break;
    default: *t = MPI_FLOAT; break; /* f32, f16, bf16 */
    }
    *o = op == NB_REDUCE_MAX ? MPI_MAX : op == NB_REDUCE_MIN ? MPI_MIN : MPI_SUM;
    if (dt == NB_BOOL && op != NB_REDUCE_MIN) *o = MPI_MAX;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- blocking collectives (the worker) --------------------------------------------------------- */
/* allreduce (root < 0) or reduce to root, in place on buf, in pieces that fit MPI's int
 * counts (halves through an f32 staging buffer, a piece at a time). */
static int do_reduce(nb__mpi_comm *m, nb_work *w, int root, bool *oom) {
    nb__args *a = &w->a;
    MPI_Datatype t;
    MPI_Op o;
    red_type(a->dtype, a->op, &t, &o);
    bool half = nb__mpi_is_half(a->dtype), avg = a->op == NB_REDUCE_AVG;
    bool mine = root < 0 || root == w->comm->rank; /* this rank gets the result */
    size_t es = nb_dtype_size(a->dtype);
    int64_t piece = half ? HALF_PIECE : PIECE;
    float *f = NULL;
    if (half && a->count > 0 && !(f = nb_host_alloc((size_t)min64(a->count, piece) * 4))) {
        *oom = true;
        return MPI_SUCCESS;
    }
    int rc = MPI_SUCCESS;
    int64_t off = 0;
    do {
        int64_t len = min64(a->count - off, piece);
        char *p = (char *)a->buf + off * (int64_t)es;
        void *b = p;
        if (half) {
            nb__mpi_to_f32(a->dtype, p, f, len);
            b = f;
        }
        if (root < 0) rc = MPI_Allreduce(MPI_IN_PLACE, b, (int)len, t, o, m->comm);
        else if (mine) rc = MPI_Reduce(MPI_IN_PLACE, b, (int)len, t, o, root, m->comm);
        else rc = MPI_Reduce(b, NULL, (int)len, t, o, root, m->comm);
        if (rc != MPI_SUCCESS) break;
        if (mine && avg) nb__comm_scale(b, len, half ? NB_F32 : a->dtype, 1.0 / w->comm->size);
        if (mine && half) nb__mpi_from_f32(a->dtype, f, p, len);
        off += len;
    } while (off < a->count);
    if (f) nb_host_free(f);
    return rc;
}

static int do_broadcast(nb__mpi_comm *m, nb_work *w) {
    nb__args *a = &w->a;
    size_t es = nb_dtype_size(a->dtype);
    int rc = MPI_SUCCESS;
    int64_t off = 0;
    do {
        int64_t len = min64(a->count - off, PIECE);
        rc = MPI_Bcast((char *)a->buf + off * (int64_t)es, (int)len, raw_type(a->dtype), a->peer,
                       m->comm);
        off += len;
    } while (rc == MPI_SUCCESS && off < a->count);
    return rc;
}

/* Per-rank counts and offsets of the chunk rule over n elements. */
static void chunk_counts(nb__mpi_comm *m, int64_t n) {
    for (int r = 0; r < m->c->size; r++) {
        int64_t b, e;
        nb_comm_chunk(n, m->c->size, r, &b, &e);
        m->counts[r] = (int)(e - b);
        m->displs[r] = (int)b;
    }
}

static int do_allgather(nb__mpi_comm *m, nb_work *w) {
    nb__args *a = &w->a;
    MPI_Datatype t = raw_type(a->dtype);
    if (!a->chunked)
        return MPI_Allgather(a->in, (int)a->in_count, t, a->out, (int)a->in_count, t, m->comm);
    chunk_counts(m, a->out_count);
    return MPI_Allgatherv(a->in, (int)a->in_count, t, a->out, m->counts, m->displs, t, m->comm);
}

/* Staging of a half-precision reduce_scatter: fa = in as f32, fb = the f32 result. */
static bool rs_stage(nb_work *w, float **fa, float **fb) {
    nb__args *a = &w->a;
    *fa = nb_host_alloc((size_t)(a->in_count > 0 ? a->in_count : 1) * 4);
    *fb = *fa ? nb_host_alloc((size_t)(a->out_count > 0 ? a->out_count : 1) * 4) : NULL;
    if (!*fb) {
        if (*fa) nb_host_free(*fa);
        *fa = NULL;
        return false;
    }
    nb__mpi_to_f32(a->dtype, a->in, *fa, a->in_count);
    return true;
}

/* After a reduce_scatter: the average's division, halves back from f32. */
static void rs_post(nb_work *w, float *fb) {
    nb__args *a = &w->a;
    void *out = fb ? (void *)fb : a->out;
    if (a->op == NB_REDUCE_AVG)
        nb__comm_scale(out, a->out_count, fb ? NB_F32 : a->dtype, 1.0 / w->comm->size);
    if (fb) nb__mpi_from_f32(a->dtype, fb, a->out, a->out_count);
}

static int do_reduce_scatter(nb__mpi_comm *m, nb_work *w, bool *oom) {
    nb__args *a = &w->a;
    MPI_Datatype t;
    MPI_Op o;
    red_type(a->dtype, a->op, &t, &o);
    float *fa = NULL, *fb = NULL;
    if (nb__mpi_is_half(a->dtype) && !rs_stage(w, &fa, &fb)) {
        *oom = true;
        return MPI_SUCCESS;
    }
    const void *in = fa ? (void *)fa : a->in;
    void *out = fb ? (void *)fb : a->out;
    int rc, size = w->comm->size;
    if (a->in_count % size == 0) {
        rc = MPI_Reduce_scatter_block(in, out, (int)(a->in_count / size), t, o, m->comm);
    } else {
        chunk_counts(m, a->in_count);
        rc = MPI_Reduce_scatter(in, out, m->counts, t, o, m->comm);
    }
    if (rc == MPI_SUCCESS) rs_post(w, fb);
    if (fa) nb_host_free(fa);
    if (fb) nb_host_free(fb);
    return rc;
}

static nb_comm *make_comm(MPI_Comm comm, MPI_Comm ctl, MPI_Comm sm, uint64_t uid);

/* A communicator's identity, the same on its ranks and different from the communicators
 * before it (whose MPI context ids MPI may reuse): the parent's, mixed with the split's
 * number there and the color. */
static uint64_t child_uid(uint64_t parent, int64_t seq, int color) {
    uint64_t h = parent ^ 0x9e3779b97f4a7c15ull;
    h = (h ^ (uint64_t)seq) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (uint64_t)(uint32_t)color) * 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

static void free_comms(MPI_Comm *c, int n) {
    for (int i = 0; i < n; i++)
        if (c[i] != MPI_COMM_NULL) MPI_Comm_free(&c[i]);
}

static int do_split(nb__mpi_comm *m, nb_work *w, bool *oom) {
    MPI_Comm nc[3] = {MPI_COMM_NULL, MPI_COMM_NULL, MPI_COMM_NULL}; /* data, control, small */
    int rc = MPI_Comm_split(m->comm, w->a.peer, w->a.tag, &nc[0]);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(nc[0], &nc[1]);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(nc[0], &nc[2]);
    if (rc != MPI_SUCCESS) {
        free_comms(nc, 3);
        return rc;
    }
    if (!(w->a.out = make_comm(nc[0], nc[1], nc[2], child_uid(m->uid, w->seq, w->a.peer)))) {
        free_comms(nc, 3);
        *oom = true;
    }
    return MPI_SUCCESS;
}

/* Without MPI_THREAD_MULTIPLE (collectives inline, blocking, without the control thread's
 * checks): the ranks' signatures gathered before each collective; false (w failed, naming
 * both sides) when they differ. */
static bool inline_agree(nb__mpi_comm *m, nb_work *w) {
    int size = w->comm->size;
    if (size < 2) return true;
    nb__sig me = nb__work_sig(w), *all = malloc(sizeof(nb__sig) * (size_t)size);
    if (!all) return true; /* no check, rather than no collective */
    int rc = MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, m->comm);
    bool ok = rc == MPI_SUCCESS;
    if (!ok) nb__mpi_fail(w, rc);
    for (int r = 0; ok && r < size; r++)
        if (!nb__sig_same(&me, &all[r]) || all[r].seq != me.seq) {
            char msg[NB__COMM_MSG];
            nb__sig_mismatch(&me, w->comm->rank, &all[r], r, msg, sizeof msg);
            nb__comm_put_out_of_step(w->comm, msg);
            nb__work_fail(w, NB_ECOMM, "%s", msg);
            ok = false;
        }
    free(all);
    return ok;
}

/* One collective with blocking MPI calls; marks w done or failed. */
static void run_op(nb__mpi_comm *m, nb_work *w) {
    nb__args *a = &w->a;
    bool oom = false;
    int rc = MPI_SUCCESS;
    if (!g.threads && !inline_agree(m, w)) return;
    if (a->in_count > INT_MAX || a->out_count > INT_MAX) {
        nb__work_fail(w, NB_EUNSUPPORTED, "%s: more than %d elements per call are not supported",
                      nb__coll_name(a->kind), INT_MAX);
        return;
    }
    int tok = NB__SPAN_BEGIN(nb__coll_name(a->kind), NULL, NB__CAT_COMM);
    switch (a->kind) {
    case NB__COLL_ALLREDUCE: rc = do_reduce(m, w, -1, &oom); break;
    case NB__COLL_REDUCE: rc = do_reduce(m, w, a->peer, &oom); break;
    case NB__COLL_BROADCAST: rc = do_broadcast(m, w); break;
    case NB__COLL_ALLGATHER: rc = do_allgather(m, w); break;
    case NB__COLL_REDUCE_SCATTER: rc = do_reduce_scatter(m, w, &oom); break;
    case NB__COLL_ALL_TO_ALL: {
        int k = (int)(a->in_count / w->comm->size);
        rc = MPI_Alltoall(a->in, k, raw_type(a->dtype), a->out, k, raw_type(a->dtype), m->comm);
        break;
    }
    case NB__COLL_BARRIER: rc = MPI_Barrier(m->comm); break;
    case NB__COLL_SPLIT: rc = do_split(m, w, &oom); break;
    default: NB__ASSERT(!"run_op: not a collective");
    }
    NB__SPAN_END_ARG(tok, "seq", w->seq);
    if (rc != MPI_SUCCESS) nb__mpi_fail(w, rc);
    else if (oom) nb__work_fail_wrap(w, NB_ENOMEM, "%s on rank %d", nb__coll_name(a->kind),
                                     w->comm->rank);
    else nb__work_done(w);
}

static void destroy_impl(nb__mpi_comm *m);

/* The communicator whose worker this thread is (NULL on other threads). */
static _Thread_local nb__mpi_comm *worker_of;

/* Before a large collective runs in MPI, the ranks agree on it: an empty schedule (a
 * dissemination barrier) whose messages carry the hash of w's signature in their tag
 * (comm_mpi_small.c), so it completes only among ranks calling the same collective. Ranks
 * that disagree stall here, where MPI would run mismatched calls into an error, a hang or
 * wrong results; the caller's check then finds the difference and withdraws w
 * (mpi_cancel). Returns true to run w; false when w has ended (withdrawn, or an error). */
static bool agree_first(nb__mpi_comm *m, nb_work *w) {
    nb__mpi_ws *s = nb__mpi_ws_of(w);
    nb_work *b = w->comm->size > 1 && !w->internal ? nb__work_new(w->comm, NB__COLL_BARRIER)
                                                   : NULL;
    bool issued = false;
    if (b) {
        nb__sig sig = nb__work_sig(w);
        b->internal = true;
        b->seq = w->seq;
        nb__mpi_ws_of(b)->sig_hash = nb__sig_hash(&sig) | 1;
        issued = nb__mpi_small_issue(m, b);
        for (double t0 = nb__now(); issued && atomic_load(&b->state) == NB__WORK_PENDING;) {
            if (atomic_load(&s->withdraw)) {
                nb__mpi_small_cancel(m, b, "withdrawn");
                break;
            }
            nb__mpi_small_release(nb__mpi_small_progress(m, false));
            if (nb__now() - t0 > 0.01) nb__mpi_sleep(50e-6);
            else sched_yield();
        }
    }
    pthread_mutex_lock(&m->mu);
    bool run = !atomic_load(&s->withdraw);
    if (!run) { /* mpi_cancel wrote the message */
        w->status = NB_ECOMM;
        atomic_store(&w->state, NB__WORK_FAILED);
    } else if (b && (!issued || atomic_load(&b->state) == NB__WORK_FAILED)) {
        nb__work_fail(w, b->status, "%s", b->msg);
        run = false;
    } else {
        s->in_op = true;
        pthread_cond_broadcast(&m->cv_done); /* a waiting mpi_cancel: too late now */
    }
    pthread_mutex_unlock(&m->mu);
    if (b) nb__work_release(b);
    return run;
}

static void *worker_main(void *arg) {
    nb__mpi_comm *m = arg;
    worker_of = m;
    nb__trace_thread_name("comm");
    pthread_mutex_lock(&m->mu);
    for (;;) {
        while (!m->qhead && !m->stop) pthread_cond_wait(&m->cv_work, &m->mu);
        if (!m->qhead) break; /* stopped, nothing left */
        nb_work *w = m->qhead;
        m->qhead = w->next;
        if (!m->qhead) m->qtail = NULL;
        m->running = w;
        pthread_mutex_unlock(&m->mu);

        /* A small collective is only issued here (its first messages posted, in queue order;
         * the caller polls it); a large one runs to completion. */
        bool small = nb__mpi_small_ok(w), issued = false;
        if (small) {
            issued = nb__mpi_small_issue(m, w);
        } else {
            if (agree_first(m, w)) run_op(m, w);
            atomic_fetch_add(&w->comm->completed, 1);
        }

        pthread_mutex_lock(&m->mu);
        m->running = NULL;
        if (issued) atomic_store(&nb__mpi_ws_of(w)->has_req, true);
        bool abandoned = nb__mpi_ws_of(w)->abandoned;
        pthread_cond_broadcast(&m->cv_done);
        pthread_mutex_unlock(&m->mu);
        /* An issued small collective is on the in-flight list now, which holds its own
         * reference and keeps advancing it even if it was abandoned. */
        if (abandoned) {
            atomic_fetch_sub(&g.stuck, 1);
            if (w->a.kind == NB__COLL_SPLIT && w->a.out) nb_comm_free(w->a.out);
        }
        nb__work_release(w); /* may free the communicator: then self_destroy is set */
        pthread_mutex_lock(&m->mu);
        if (m->self_destroy) break;
    }
    bool self_destroy = m->self_destroy;
    pthread_mutex_unlock(&m->mu);
    if (self_destroy) { /* mpi_destroy on this thread (counted g.teardown) */
        pthread_detach(pthread_self());
        destroy_impl(m);
        atomic_fetch_sub(&g.teardown, 1);
    }
    return NULL;
}

static nb_status enqueue(nb__mpi_comm *m, nb_work *w) { /* with m->mu held */
    if (!m->worker_started) {
        if (pthread_create(&m->worker, NULL, worker_main, m) != 0)
            return nb__error(NB_EINTERNAL, "%s: could not start the communication thread",
                             nb__coll_name(w->a.kind));
        m->worker_started = true;
    }
    atomic_fetch_add(&w->refs, 1); /* the worker's */
    nb__mpi_ws_of(w)->queued = true;
    w->next = NULL;
    if (m->qtail) m->qtail->next = w;
    else m->qhead = w;
    m->qtail = w;
    pthread_cond_signal(&m->cv_work);
    return NB_OK;
}

static void stop_worker(nb__mpi_comm *m) {
    pthread_mutex_lock(&m->mu);
    bool started = m->worker_started;
    m->stop = true;
    m->worker_started = false;
    pthread_cond_signal(&m->cv_work);
    pthread_mutex_unlock(&m->mu);
    if (started && !pthread_equal(m->worker, pthread_self())) pthread_join(m->worker, NULL);
}

void nb__mpi_req_ended(nb_work *w, int rc, const MPI_Status *st) {
    if (atomic_load(&w->state) != NB__WORK_PENDING) return; /* already ended */
    if (rc != MPI_SUCCESS) {
        nb__mpi_fail(w, rc);
    } else if (w->a.kind == NB__COLL_RECV) {
        int got = 0;
        MPI_Get_count(st, raw_type(w->a.dtype), &got);
        if (got != w->a.count)
            nb__work_fail(w, NB_ECOMM, "recv from rank %d (tag %d) on rank %d: expected %lld "
                          "elements of %s, the message has %d", w->a.peer, w->a.tag,
                          w->comm->rank, (long long)w->a.count, nb_dtype_name(w->a.dtype), got);
        else nb__work_done(w);
    } else {
        nb__work_done(w);
    }
}

/* ---- starting, testing, waiting ---------------------------------------------------------------- */
/* See "Order" at the top. */
static nb_status mpi_start_coll(nb_comm *c, nb_work *w) {
    nb__mpi_comm *m = nb__mpi_of(c);
    if (g.finalized) return nb__error(NB_ESTATE, "%s: MPI was finalized", nb__coll_name(w->a.kind));
    if (!g.threads) { /* inline, blocking, serialized */
        pthread_mutex_lock(&g.inline_mu);
        run_op(m, w);
        pthread_mutex_unlock(&g.inline_mu);
        atomic_fetch_add(&c->completed, 1);
        return NB_OK;
    }
    pthread_mutex_lock(&m->mu);
    nb_status st = NB_OK;
    if (nb__mpi_small_ok(w) && !m->running && !m->qhead) {
        if (nb__mpi_small_issue(m, w)) atomic_store(&nb__mpi_ws_of(w)->has_req, true);
    } else {
        st = enqueue(m, w);
    }
    pthread_mutex_unlock(&m->mu);
    return st;
}

static nb_status p2p_start(nb_comm *c, nb_work *w) {
    nb__mpi_comm *m = nb__mpi_of(c);
    const char *op = nb__coll_name(w->a.kind);
    if (g.finalized) return nb__error(NB_ESTATE, "%s: MPI was finalized", op);
    if (w->a.tag > m->tag_ub)
        return nb__error(NB_EINVAL, "%s: tag %d is larger than MPI's limit %d", op, w->a.tag,
                         m->tag_ub);
    if (w->a.count > INT_MAX)
        return nb__error(NB_EUNSUPPORTED, "%s: more than %d elements per message are not "
                         "supported", op, INT_MAX);
    if (!g.threads) pthread_mutex_lock(&g.inline_mu);
    int rc = w->a.kind == NB__COLL_SEND
                 ? MPI_Isend(w->a.buf, (int)w->a.count, raw_type(w->a.dtype), w->a.peer,
                             w->a.tag, m->comm, &nb__mpi_ws_of(w)->req)
                 : MPI_Irecv(w->a.buf, (int)w->a.count, raw_type(w->a.dtype), w->a.peer,
                             w->a.tag, m->comm, &nb__mpi_ws_of(w)->req);
    if (!g.threads) pthread_mutex_unlock(&g.inline_mu);
    if (rc != MPI_SUCCESS) return mpi_error(rc, op);
    atomic_store(&nb__mpi_ws_of(w)->has_req, true);
    return NB_OK;
}

/* Test an issued work: a send/recv's request, or a small collective's schedule. */
static int req_test(nb_work *w) {
    if (nb__mpi_ws_of(w)->sched) return nb__mpi_small_poll(w);
    int flag = 0;
    MPI_Status s;
    if (!g.threads) pthread_mutex_lock(&g.inline_mu);
    int rc = MPI_Test(&nb__mpi_ws_of(w)->req, &flag, &s);
    if (!g.threads) pthread_mutex_unlock(&g.inline_mu);
    if (rc != MPI_SUCCESS || flag) nb__mpi_req_ended(w, rc, &s);
    return atomic_load(&w->state);
}

static int mpi_test(nb_work *w) {
    int st = atomic_load(&w->state);
    if (st == NB__WORK_PENDING && atomic_load(&nb__mpi_ws_of(w)->has_req)) st = req_test(w);
    return st;
}

static int mpi_wait(nb_work *w, double deadline) {
    nb__mpi_ws *s = nb__mpi_ws_of(w);
    int st = atomic_load(&w->state);
    if (st != NB__WORK_PENDING) return st;
    if (!atomic_load(&s->has_req)) {
        /* On the worker: until it ends (large) or is issued (small). */
        nb__mpi_comm *m = nb__mpi_of(w->comm);
        struct timespec ts = {(time_t)deadline, 0};
        ts.tv_nsec = (long)((deadline - (double)ts.tv_sec) * 1e9);
        pthread_mutex_lock(&m->mu);
        while (atomic_load(&w->state) == NB__WORK_PENDING && !atomic_load(&s->has_req)) {
            if (deadline <= 0) pthread_cond_wait(&m->cv_done, &m->mu);
            else if (pthread_cond_timedwait(&m->cv_done, &m->mu, &ts) != 0 &&
                     nb__now() >= deadline)
                break;
        }
        pthread_mutex_unlock(&m->mu);
        st = atomic_load(&w->state);
        if (st != NB__WORK_PENDING || !atomic_load(&s->has_req)) return st;
    }
    /* Poll like MPI's own blocking calls: a message protocol takes several steps, each
     * one waiting for a test on this side, so the loop between tests stays short (the
     * clock is read every 16 tests). After 50 us yield the core between rounds of tests,
     * after 10 ms sleep a little. */
    double t0 = nb__now();
    for (;;) {
        for (int i = 0; i < 16; i++) {
            st = req_test(w);
            if (st != NB__WORK_PENDING) return st;
        }
        double now = nb__now();
        if (deadline > 0 && now >= deadline) return 0;
        if (now - t0 > 0.01) nb__mpi_sleep(50e-6);
        else if (now - t0 > 50e-6) sched_yield();
    }
}

/* See nb__comm_backend.cancel: a queued collective leaves the queue, a large one the worker
 * has not started in MPI yet is withdrawn, a small one in flight is withdrawn by its
 * schedule's owner (comm_mpi_small.c); a large one already in MPI cannot be. */
static bool mpi_cancel(nb_work *w, const char *msg) {
    nb__mpi_ws *s = nb__mpi_ws_of(w);
    nb__mpi_comm *m = nb__mpi_of(w->comm);
    pthread_mutex_lock(&m->mu);
    if (atomic_load(&w->state) != NB__WORK_PENDING) {
        pthread_mutex_unlock(&m->mu);
        return true; /* it ended meanwhile */
    }
    if (s->queued && !atomic_load(&s->has_req) && m->running != w) {
        nb_work *prev = NULL, **p = &m->qhead;
        while (*p && *p != w) prev = *p, p = &(*p)->next;
        bool found = *p == w;
        if (found) {
            *p = w->next;
            if (m->qtail == w) m->qtail = prev;
            nb__work_fail(w, NB_ECOMM, "%s", msg);
            atomic_fetch_add(&w->comm->completed, 1);
        }
        pthread_mutex_unlock(&m->mu);
        if (found) nb__work_release(w); /* the worker's */
        return found;
    }
    if (m->running == w && !nb__mpi_small_ok(w)) {
        if (s->in_op) {
            pthread_mutex_unlock(&m->mu);
            return false;
        }
        snprintf(w->msg, sizeof w->msg, "%s", msg);
        atomic_store(&s->withdraw, true);
        while (atomic_load(&w->state) == NB__WORK_PENDING && !s->in_op)
            pthread_cond_wait(&m->cv_done, &m->mu);
        bool ended = atomic_load(&w->state) != NB__WORK_PENDING;
        pthread_mutex_unlock(&m->mu);
        return ended;
    }
    bool issued_small = atomic_load(&s->has_req) && s->sched;
    pthread_mutex_unlock(&m->mu);
    if (!issued_small) return false;
    nb__mpi_small_cancel(m, w, msg);
    return true;
}

static void mpi_abandon(nb_work *w) {
    nb__mpi_ws *s = nb__mpi_ws_of(w);
    nb__mpi_comm *m = nb__mpi_of(w->comm);
    pthread_mutex_lock(&m->mu);
    bool issued = atomic_load(&s->has_req);
    if (!issued && s->queued && atomic_load(&w->state) == NB__WORK_PENDING) {
        /* Still with the worker: it finishes (or issues and hands over) the operation. */
        s->abandoned = true;
        atomic_fetch_add(&g.stuck, 1);
    }
    pthread_mutex_unlock(&m->mu);
    if (!issued || atomic_load(&w->state) != NB__WORK_PENDING) return;
    /* An issued small collective stays on the in-flight list, which the control thread
     * keeps advancing: it ends (and lets its tensors go) if the missing rank arrives. */
    if (s->sched) return;
    /* A receive can be cancelled. A send stays with MPI: the control thread polls it and
     * lets the work (and its tensor) go when MPI is done. */
    if (w->a.kind == NB__COLL_RECV) {
        MPI_Cancel(&s->req);
        int flag = 0;
        MPI_Status st;
        for (double until = nb__now() + 0.05; !flag && nb__now() < until;)
            if (MPI_Test(&s->req, &flag, &st) != MPI_SUCCESS) break;
        if (flag) return;
    }
    nb__mpi_zombie_add(w, false);
}

/* ---- communicators ------------------------------------------------------------------------------- */
static void destroy_impl(nb__mpi_comm *m) {
    nb__mpi_ctl_unregister(m);
    int fin = 0;
    MPI_Finalized(&fin);
    /* Ranks that disagreed left messages nobody will receive: the MPI communicators stay (a
     * new one could get their context ids, and those messages with them). */
    if (!fin && !m->keep_mpi) {
        if (m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
        if (m->ctl != MPI_COMM_NULL) MPI_Comm_free(&m->ctl);
        if (m->sm != MPI_COMM_NULL) MPI_Comm_free(&m->sm);
    }
    pthread_mutex_destroy(&m->mu);
    pthread_mutex_destroy(&m->sm_mu);
    pthread_cond_destroy(&m->cv_work);
    pthread_cond_destroy(&m->cv_done);
    free(m->world_ranks);
    free(m->counts);
    free(m);
}

static void mpi_destroy(nb_comm *c) {
    nb__mpi_comm *m = nb__mpi_of(c);
    pthread_mutex_lock(&g.mu);
    if (g.world == c) g.world = NULL;
    pthread_mutex_unlock(&g.mu);
    nb__mpi_ctl_unregister(m); /* before c goes: the control thread reads c's counters */
    m->keep_mpi = nb__comm_out_of_step(c, NULL, 0);
    m->c = NULL;
    /* On the worker itself, when an abandoned collective finished last: the worker tears
     * down once it returns (counted, so that the exit handler waits before MPI_Finalize).
     * Otherwise nothing is in flight (works hold references): stop the idle worker and
     * free. (Which thread this is must not be read from worker_started: the exit handler
     * clears that when it stops the worker - but only while it holds a reference, so
     * never while the worker destroys the communicator.) */
    if (worker_of == m) {
        atomic_fetch_add(&g.teardown, 1);
        pthread_mutex_lock(&m->mu);
        m->self_destroy = true;
        pthread_mutex_unlock(&m->mu);
        return;
    }
    stop_worker(m);
    destroy_impl(m);
}

/* Takes over comm, ctl and sm, except when it fails (NULL): then they stay the caller's. */
static nb_comm *make_comm(MPI_Comm comm, MPI_Comm ctl, MPI_Comm sm, uint64_t uid) {
    int rank = 0, size = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    nb__mpi_comm *m = calloc(1, sizeof *m);
    if (m) {
        m->world_ranks = malloc(sizeof(int) * (size_t)size);
        m->counts = malloc(sizeof(int) * 2 * (size_t)size);
    }
    if (!m || !m->world_ranks || !m->counts) {
        if (m) free(m->world_ranks), free(m->counts);
        free(m);
        nb__error(NB_ENOMEM, "comm: out of memory");
        return NULL;
    }
    m->displs = m->counts + size;
    m->uid = uid;
    m->comm = comm;
    m->ctl = ctl;
    m->sm = sm;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(ctl, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(sm, MPI_ERRORS_RETURN);
    MPI_Group g0, gw;
    MPI_Comm_group(comm, &g0);
    MPI_Comm_group(MPI_COMM_WORLD, &gw);
    for (int r = 0; r < size; r++) m->counts[r] = r;
    MPI_Group_translate_ranks(g0, size, m->counts, gw, m->world_ranks);
    MPI_Group_free(&g0);
    MPI_Group_free(&gw);
    void *ub = NULL;
    int flag = 0;
    /* MPI_TAG_UB is an attribute of MPI_COMM_WORLD (other communicators need not carry it) */
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    m->tag_ub = flag && ub ? *(int *)ub : 32767;
    int bits = 0; /* tags 0 .. 2^bits - 1 are valid */
    while (bits < 31 && (1ll << (bits + 1)) - 1 <= (long long)m->tag_ub) bits++;
    m->seq_bits = bits >= 24 ? 16 : bits;
    m->hash_bits = bits - m->seq_bits;
    pthread_mutex_init(&m->mu, NULL);
    pthread_mutex_init(&m->sm_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->cv_done, &ca);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&m->cv_work, NULL);
    atomic_init(&m->inflight, 0);
    nb_comm *c = nb__comm_alloc(&nb__comm_mpi_backend, rank, size, m);
    if (!c) {
        m->comm = m->ctl = m->sm = MPI_COMM_NULL; /* the caller frees them */
        destroy_impl(m);
        return NULL;
    }
    m->c = c;
    nb__mpi_ctl_register(m);
    return c;
}

/* MPI_Comm_idup polled against a deadline, so a rank that never calls nb_comm_world
 * cannot hang the others. */
static nb_status dup_comm(MPI_Comm src, MPI_Comm *out, double timeout) {
    MPI_Request req;
    int rc = MPI_Comm_idup(src, out, &req);
    if (rc != MPI_SUCCESS) return mpi_error(rc, "comm_world: MPI_Comm_idup");
    double t0 = nb__now();
    for (int flag = 0;;) {
        rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_error(rc, "comm_world: MPI_Comm_idup");
        if (flag) return NB_OK;
        if (timeout > 0 && nb__now() - t0 > timeout)
            return nb__error(NB_ETIMEOUT, "comm_world: not every rank called nb_comm_world "
                             "within %.3g s (rank(s) unknown)", timeout);
        if (nb__now() - t0 > 0.01) nb__mpi_sleep(50e-6);
    }
}

static nb_comm *world_locked(void) {
    pthread_mutex_lock(&g.mu);
    nb_comm *c = g.world;
    /* Not one whose last handle is being freed right now (its count reached 0; returning
     * it would hand out a communicator that is about to be freed): then a new one. */
    if (c && retain_live(c)) {
        pthread_mutex_unlock(&g.mu);
        return c;
    }
    pthread_mutex_unlock(&g.mu);
    if (ensure_init() != NB_OK) return NULL;
    pthread_mutex_lock(&g.mu);
    g.finalized = false;
    pthread_mutex_unlock(&g.mu);
    MPI_Comm nc[3] = {MPI_COMM_NULL, MPI_COMM_NULL, MPI_COMM_NULL}; /* data, control, small */
    double to = nb__comm_default_timeout();
    for (int i = 0; i < 3; i++)
        if (dup_comm(MPI_COMM_WORLD, &nc[i], to) != NB_OK) {
            free_comms(nc, i); /* not the one that failed: it may still be in the making */
            return NULL;
        }
    /* The node-local rank (the NCCL backend's GPU): every rank is here, the dups are done. */
    MPI_Comm node = MPI_COMM_NULL;
    if (MPI_Comm_split_type(nc[0], MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) ==
        MPI_SUCCESS) {
        int lr = 0, ls = 1;
        MPI_Comm_rank(node, &lr);
        MPI_Comm_size(node, &ls);
        MPI_Comm_free(&node);
        atomic_store(&g.local_rank, lr);
        atomic_store(&g.local_size, ls);
    }
    static uint64_t worlds; /* under world_mu: the same count on every rank */
    if (!(c = make_comm(nc[0], nc[1], nc[2], child_uid(0, (int64_t)++worlds, -1)))) {
        free_comms(nc, 3);
        return NULL;
    }
    c->is_world = true;
    pthread_mutex_lock(&g.mu);
    g.world = c;
    pthread_mutex_unlock(&g.mu);
    return c;
}

int nb__comm_mpi_local_rank(int *local_size) {
    int ls = atomic_load(&g.local_size);
    if (local_size) *local_size = ls > 0 ? ls : 1;
    return atomic_load(&g.local_rank);
}

nb_comm *nb__comm_mpi_world(void) {
    /* One creator at a time: the first call is collective over MPI_COMM_WORLD. */
    static pthread_mutex_t world_mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&world_mu);
    nb_comm *c = world_locked();
    pthread_mutex_unlock(&world_mu);
    return c;
}

static nb_comm *mpi_split(nb_comm *c, int color, int key) {
    /* On the worker (like a large collective), so it is ordered with the collectives already
     * issued on c, and waited for with c's timeout. */
    nb_work *w = nb__work_new(c, NB__COLL_SPLIT);
    if (!w) return NULL;
    w->a.peer = color;
    w->a.tag = key;
    if (!(w = nb__work_launch(c, w))) return NULL;
    bool gave_up;
    nb_status st = nb__work_wait_keep(w, &gave_up);
    if (gave_up) return NULL;
    nb_comm *n = st == NB_OK ? w->a.out : NULL;
    nb__work_release(w);
    return n;
}

const nb__comm_backend nb__comm_mpi_backend = {
    .name = "mpi",
    .start =
        {
            [NB__COLL_ALLREDUCE] = mpi_start_coll,
            [NB__COLL_BROADCAST] = mpi_start_coll,
            [NB__COLL_REDUCE] = mpi_start_coll,
            [NB__COLL_ALLGATHER] = mpi_start_coll,
            [NB__COLL_REDUCE_SCATTER] = mpi_start_coll,
            [NB__COLL_ALL_TO_ALL] = mpi_start_coll,
            [NB__COLL_BARRIER] = mpi_start_coll,
            [NB__COLL_SEND] = p2p_start,
            [NB__COLL_RECV] = p2p_start,
            [NB__COLL_SPLIT] = mpi_start_coll,
        },
    .test = mpi_test,
    .wait = mpi_wait,
    .diagnose = nb__mpi_diagnose,
    .check = nb__mpi_check,
    .cancel = mpi_cancel,
    .abandon = mpi_abandon,
    .split = mpi_split,
    .destroy = mpi_destroy,
};
