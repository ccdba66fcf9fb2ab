/* checkpoint_writer.c - asynchronous ("flash") checkpoints (nabla/checkpoint.h): the caller's
 * thread plans the save as nb_checkpoint_save does (dcp_save.c) and copies this rank's
 * tensors into reused host snapshot tensors, helped by a background thread that then writes
 * this rank's file from them with the synchronous path's writer, so the bytes are the same. What needs the
 * other ranks (agreeing that every file is durable, the index, rotation of folders) happens
 * at the next call on the writer: _save, _wait.
 * A writer is a checked handle (tensor/handle.h): used after nb_checkpoint_writer_free it is an
 * error value, and a save refuses a checkpoint whose objects were freed. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "io/dcp_impl.h"
#include "io/io_impl.h"
#include "nabla/autograd.h"
#include "tensor/handle.h"
#include "tensor/tensor_impl.h"
#include "tensor/trace.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

struct nb_checkpoint_writer {
    nb__obj h; /* a checked handle (tensor/handle.h) */
    nb_checkpoint_writer_opts opts;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool job;  /* a snapshot is ready for the thread (set by _save, cleared by the thread) */
    bool busy; /* a snapshot is being or about to be written: the buffers are the thread's */
    bool quit;
    int slow_ms; /* NB_TEST_SLOW_WRITE_MS */
    /* the snapshot: names and host tensors reused while they match */
    int cap;
    char **names;
    nb_tensor **snap;
    /* the snapshot's host copies of the save being handed over, done in chunks by the
     * caller's thread and this writer's thread together (snapshot_copy) */
    struct copy_plan {
        const struct copy_job *jobs;
        int njobs;
        size_t total, chunk;
        int nchunks;
        atomic_int next, done;
    } cp;
    bool copying; /* cp holds work for the thread (set by _save, read by the thread) */
    /* the save in flight or not yet finished (pending: its finish is still to run) */
    dcp_job j;
    bool pending;
    nb_status wst; /* the thread's result for j, not yet reported */
    char wmsg[1024];
    nb_checkpoint_writer_stats stats;
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void copy_chunks(struct copy_plan *cp, bool wait_all);

static void *writer_main(void *arg) {
    nb_checkpoint_writer *w = arg;
    nb__slow_write_ms = w->slow_ms; /* this thread's writes only */
#ifdef SCHED_BATCH
    /* No wake-up preemption: woken by a save, this thread does not take the saving thread's
     * core (inside its stall) when every core is busy; it runs on an idle core at once. */
    struct sched_param sp = {0};
    pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
#endif
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->job && !w->quit) pthread_cond_wait(&w->cv, &w->mu);
        if (!w->job) break; /* quit, nothing left to write */
        w->job = false;
        bool copying = w->copying;
        w->copying = false;
        pthread_mutex_unlock(&w->mu);
        if (copying) copy_chunks(&w->cp, true); /* the snapshot first, with the caller */
        int64_t t0 = now_ns();
        nb_status st = dcp_job_write(&w->j);
        int64_t dt = now_ns() - t0;
        pthread_mutex_lock(&w->mu);
        w->wst = st;
        if (st != NB_OK) {
            snprintf(w->wmsg, sizeof w->wmsg, "%s", nb_last_error());
            nb_clear_error();
            w->stats.failed++;
        } else {
            w->stats.written += w->j.writes;
        }
        w->stats.write_ns_last = dt;
        w->stats.write_ns_total += dt;
        w->busy = false;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

nb_checkpoint_writer_opts nb_checkpoint_writer_defaults(void) {
    return (nb_checkpoint_writer_opts){._init = NB__OPTS_MARK(nb_checkpoint_writer_opts),
                                       .policy = NB_CKPT_WAIT};
}

nb_checkpoint_writer *nb_checkpoint_writer_new(const nb_checkpoint_writer_opts *opts) {
    if (opts &&
        NB__OPTS_CHECK(opts, nb_checkpoint_writer_opts, "checkpoint_writer_new",
                       "nb_checkpoint_writer_defaults()", "o.policy = NB_CKPT_SKIP") != NB_OK)
        return NULL;
    nb_checkpoint_writer_opts o = opts ? *opts : nb_checkpoint_writer_defaults();
    if (o.policy != NB_CKPT_WAIT && o.policy != NB_CKPT_SKIP) {
        nb__error(NB_EINVAL, "checkpoint_writer_new: unknown policy %d (NB_CKPT_WAIT or "
                  "NB_CKPT_SKIP)", (int)o.policy);
        return NULL;
    }
    nb_checkpoint_writer *w = nb__obj_alloc(sizeof *w, NB__OBJ_CKPT_WRITER);
    if (!w) {
        nb__error(NB_ENOMEM, "checkpoint_writer_new: out of memory");
        return NULL;
    }
    w->opts = o;
    const char *slow = getenv("NB_TEST_SLOW_WRITE_MS"); /* test hook (checkpoint.h) */
    w->slow_ms = slow ? atoi(slow) : 0;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    int e = pthread_create(&w->thread, NULL, writer_main, w);
    if (e) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        nb__obj_free(w);
        nb__error(NB_ENOMEM, "checkpoint_writer_new: cannot start the writer thread: %s",
                  strerror(e));
        return NULL;
    }
    return w;
}

/* With w->mu held: wait for the write in flight. */
static void wait_idle(nb_checkpoint_writer *w) {
    while (w->busy) pthread_cond_wait(&w->cv, &w->mu);
}

/* The thread's result for the pending save, as this thread's error (NB_OK if none). */
static nb_status take_result(nb_checkpoint_writer *w) {
    nb_status st = w->wst;
    w->wst = NB_OK;
    return st == NB_OK ? NB_OK : nb__error(st, "%s", w->wmsg);
}

/* Finish the pending save (collective for a save over several ranks): wait for its write,
 * agree, write its index. NB_OK when none. */
static nb_status finish(nb_checkpoint_writer *w, const char *op) {
    pthread_mutex_lock(&w->mu);
    wait_idle(w);
    nb_status st = take_result(w);
    pthread_mutex_unlock(&w->mu);
    if (!w->pending) return st;
    w->pending = false;
    st = dcp_job_finish(&w->j, st, op);
    dcp_job_free(&w->j);
    return st;
}

static bool same_layout(const nb_tensor *a, const nb_tensor *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

/* A host copy the snapshot still owes (copy_chunks does them). */
typedef struct copy_job {
    char *dst;
    const char *src;
    size_t n;
} copy_job;

/* n bytes from src to dst with non-temporal stores on x86 (SSE2, every x86-64): a snapshot
 * is written once and read later by the writer's thread, so the stores need not bring the
 * destination's lines into the cache first (docs/checkpoints.md has the stall this and the
 * writer's scheduling gave). The fence makes the stores visible before the chunk is counted
 * done. */
static void stream_copy(char *dst, const char *src, size_t n) {
#if defined(__SSE2__)
    size_t head = (size_t)(-(uintptr_t)dst & 15);
    if (head > n) head = n;
    memcpy(dst, src, head);
    size_t i = head;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    memcpy(dst + i, src + i, n - i);
    _mm_sfence();
#else
    memcpy(dst, src, n);
#endif
}

/* Bytes [from, to) of the jobs laid end to end. */
static void copy_range(const copy_job *jobs, int njobs, size_t from, size_t to) {
    size_t at = 0;
    for (int i = 0; i < njobs && at < to; i++) {
        const copy_job *j = &jobs[i];
        size_t lo = from > at ? from - at : 0, hi = to - at < j->n ? to - at : j->n;
        if (lo < hi) stream_copy(j->dst + lo, j->src + lo, hi - lo);
        at += j->n;
    }
}

/* Take chunks of the plan until none is left; with wait_all, then wait until every chunk
 * taken by anyone is copied (at most one chunk's copy: a short wait that yields). */
static void copy_chunks(struct copy_plan *cp, bool wait_all) {
    for (;;) {
        int c = atomic_fetch_add(&cp->next, 1);
        if (c >= cp->nchunks) break;
        size_t from = (size_t)c * cp->chunk, to = from + cp->chunk;
        copy_range(cp->jobs, cp->njobs, from, to < cp->total ? to : cp->total);
        atomic_fetch_add(&cp->done, 1);
    }
    while (wait_all && atomic_load(&cp->done) < cp->nchunks) sched_yield();
}

static void *copy_thread(void *arg) {
    copy_chunks(arg, false);
    return NULL;
}

/* The plan of a snapshot's copies: chunks of at most 1 MiB, at least 32 of them, so that
 * the threads taking them finish within a chunk of each other. */
static void copy_plan_init(struct copy_plan *cp, const copy_job *jobs, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += jobs[i].n;
    size_t chunk = total / 32 > ((size_t)1 << 20) ? (size_t)1 << 20 : total / 32;
    chunk = chunk < 4096 ? 4096 : (chunk + 63) & ~(size_t)63;
    cp->jobs = jobs, cp->njobs = n, cp->total = total, cp->chunk = chunk;
    cp->nchunks = total ? (int)((total + chunk - 1) / chunk) : 0;
    atomic_store(&cp->next, 0);
    atomic_store(&cp->done, 0);
}

/* The caller's part of the snapshot's copies, once the writer's thread has the plan: chunks
 * taken in turn by this thread, the writer's thread (which goes on to write the file without
 * being woken again: a wake-up at the end would let it take this thread's core inside the
 * stall) and, with 3 or more cores and 8 MiB or more, up to 2 more threads (one core's memcpy
 * bandwidth is well below the machine's). Returns when every byte is copied. */
static void snapshot_copy(struct copy_plan *cp) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int extra = cp->total < ((size_t)8 << 20) || cores < 3 ? 0 : cores < 4 ? 1 : 2;
    pthread_t th[2];
    bool started[2] = {false, false};
    for (int t = 0; t < extra; t++) started[t] = pthread_create(&th[t], NULL, copy_thread, cp) == 0;
    copy_chunks(cp, false);
    for (int t = 0; t < extra; t++)
        if (started[t]) pthread_join(th[t], NULL);
    copy_chunks(cp, true);
}

/* Entry i of the snapshot: a host tensor of src's shape and dtype holding a copy of src's
 * values (the buffer of the last save under that name when it fits). A host copy is left in
 * *cj for snapshot_copy (cj->n 0: done here). */
static nb_status snapshot_entry(nb_checkpoint_writer *w, int i, const char *name, nb_tensor *src,
                                nb_tensor **out, copy_job *cj) {
    cj->n = 0;
    if (i >= w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        while (cap <= i) cap *= 2;
        char **names = realloc(w->names, sizeof(char *) * (size_t)cap);
        if (names) w->names = names;
        nb_tensor **snap = names ? realloc(w->snap, sizeof(nb_tensor *) * (size_t)cap) : NULL;
        if (!snap) return nb__error(NB_ENOMEM, "checkpoint_writer_save: out of memory");
        w->snap = snap;
        for (int k = w->cap; k < cap; k++) w->names[k] = NULL, w->snap[k] = NULL;
        w->cap = cap;
    }
    if (!w->names[i] || strcmp(w->names[i], name) != 0) {
        char *copy = strdup(name);
        if (!copy) return nb__error(NB_ENOMEM, "checkpoint_writer_save: out of memory");
        free(w->names[i]);
        w->names[i] = copy;
    }
    if (w->snap[i] && !same_layout(w->snap[i], src)) {
        nb_tensor_free(w->snap[i]);
        w->snap[i] = NULL;
    }
    if (!w->snap[i]) { /* a host tensor (pinned memory, for GPU state, once there is any) */
        nb_tensor *t = nb_empty_on(NB_CPU, src->shape, src->ndim, src->dtype);
        if (!t) return nb_last_status();
        w->snap[i] = nb__scope_take(t);
    }
    *out = w->snap[i];
    size_t nbytes = (size_t)nb_numel(src) * nb_dtype_size(src->dtype);
    if (nbytes == 0) return NB_OK;
    if (nb__host_accessible(src) && nb_is_contiguous(src)) {
        *cj = (copy_job){(char *)nb__ptr(w->snap[i]), (const char *)nb__ptr(src), nbytes};
        return NB_OK;
    }
    nb_scope_begin();
    bool grad = nb_set_grad_enabled(false);
    nb_tensor *h = nb__host_accessible(src) ? src : nb_to_device(src, NB_CPU);
    nb_status st = h ? nb_copy_(w->snap[i], h) : nb_last_status();
    nb_set_grad_enabled(grad);
    nb_scope_end();
    return st;
}

/* The sources of a snapshot, once copied: the references taken on them and the state views
 * the optimizer and schedule made for the save. */
static void release_sources(const nb_checkpoint *c, nb_tensor **srcs, int n, copy_job *cj) {
    for (int i = 0; srcs && i < n; i++) nb_tensor_free(srcs[i]);
    free(srcs);
    free(cj);
    nb_optim_state_release(c->optim);
    nb_sched_state_release(c->sched);
}

static nb_status writer_save(nb_checkpoint_writer *w, const char *base, const nb_checkpoint *c) {
    const char *op = "checkpoint_writer_save";
    dcp_world wd;
    nb_status st = dcp_world_of(c, &wd, op);
    if (st != NB_OK) return st;
    if (wd.comm && w->opts.policy == NB_CKPT_SKIP)
        return nb__error(NB_EINVAL, "%s: the writer's policy is NB_CKPT_SKIP, but this "
                         "checkpoint is saved by %d ranks together (every rank must write every "
                         "save): use NB_CKPT_WAIT", op, wd.size);
    if (!wd.comm && w->opts.policy == NB_CKPT_SKIP) {
        pthread_mutex_lock(&w->mu);
        bool busy = w->busy;
        nb_status e = busy ? take_result(w) : NB_OK; /* an earlier failure is still news */
        if (busy && e == NB_OK) w->stats.skipped++;
        pthread_mutex_unlock(&w->mu);
        if (busy) return e;
    }
    pthread_mutex_lock(&w->mu);
    wait_idle(w);
    nb_status prev_local = take_result(w); /* the write just waited for */
    pthread_mutex_unlock(&w->mu);
    /* No write in flight: the buffers are ours until the job is handed over. The previous
     * save is agreed on in this save's one collective; rank 0 writes its index on the
     * thread, before this save's file. */
    int tok = NB__SPAN_BEGIN("checkpoint snapshot", NULL, NB__CAT_IO);
    dcp_job j;
    st = dcp_job_begin(base, c, &j, w->pending ? &w->j : NULL, prev_local, op);
    if (w->pending) {
        dcp_job_free(&w->j);
        w->pending = false;
    } else if (st == NB_OK && prev_local != NB_OK) {
        st = prev_local; /* (a save that was not pending cannot have failed: defensive) */
    }
    if (st != NB_OK) {
        NB__SPAN_END(tok);
        dcp_job_free(&j);
        return st;
    }
    copy_job *cj = calloc((size_t)j.n + 1, sizeof *cj);
    nb_tensor **srcs = calloc((size_t)j.n + 1, sizeof *srcs); /* alive until copied */
    if (!cj || !srcs) st = nb__error(NB_ENOMEM, "%s: out of memory", op);
    for (int i = 0; st == NB_OK && i < j.n; i++) {
        nb_tensor *snap = NULL;
        st = snapshot_entry(w, i, j.names[i], j.tensors[i], &snap, &cj[i]);
        if (st == NB_OK) {
            srcs[i] = j.tensors[i];
            j.tensors[i] = nb_tensor_retain(snap);
        }
    }
    if (st != NB_OK && !j.w.comm) { /* one process: the error now, nothing saved */
        release_sources(c, srcs, j.n, cj);
        NB__SPAN_END(tok);
        dcp_job_free(&j);
        return st;
    }
    if (st != NB_OK) { /* several ranks: the job goes on, failed, so the next call on every
                        * rank reports it (and the save gets no index) */
        j.err = st;
        snprintf(j.errmsg, sizeof j.errmsg, "%s", nb_last_error());
        j.writes = false;
        nb_clear_error();
    }
    for (int i = j.n; i < w->cap && w->snap[i]; i++) { /* entries the state no longer has */
        nb_tensor_free(w->snap[i]);
        free(w->names[i]);
        w->snap[i] = NULL, w->names[i] = NULL;
    }
    /* The job goes to the thread before the copies: it copies along, then writes. */
    bool copy = st == NB_OK && j.n > 0;
    if (copy) copy_plan_init(&w->cp, cj, j.n);
    pthread_mutex_lock(&w->mu);
    w->j = j;
    w->pending = true;
    w->busy = w->job = true;
    w->copying = copy;
    w->stats.saves++;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (copy) snapshot_copy(&w->cp);
    release_sources(c, srcs, j.n, cj);
    NB__SPAN_END(tok);
    return NB_OK;
}

/* The objects a checkpoint borrows are alive (a save reads them all; NULL ones are not
 * saved). */
static nb_status ckpt_objects_ok(const nb_checkpoint *c, const char *op) {
    bool ok = (!c->model || nb__obj_ok(c->model, NB__OBJ_MODULE, op)) &&
              (!c->optim || nb__obj_ok(c->optim, NB__OBJ_OPTIM, op)) &&
              (!c->sched || nb__obj_ok(c->sched, NB__OBJ_SCHED, op)) &&
              (!c->loader || nb__obj_ok(c->loader, NB__OBJ_LOADER, op)) &&
              (!c->scaler || nb__obj_ok(c->scaler, NB__OBJ_SCALER, op));
    for (int i = 0; ok && i < c->ngens; i++)
        ok = nb__obj_ok(c->gens[i], NB__OBJ_GENERATOR, op);
    return ok ? NB_OK : nb_last_status();
}

nb_status nb_checkpoint_writer_save(nb_checkpoint_writer *w, const char *base,
                                    const nb_checkpoint *c) {
    if (!w || !base || !c || !c->model)
        return nb__error(NB_ENULL, "checkpoint_writer_save: %s is NULL",
                         !w ? "the writer" : !base ? "path" : !c ? "the checkpoint" : "the model");
    if (!nb__obj_ok(w, NB__OBJ_CKPT_WRITER, "checkpoint_writer_save") ||
        ckpt_objects_ok(c, "checkpoint_writer_save") != NB_OK)
        return nb_last_status();
    if (c->keep < 0)
        return nb__error(NB_EINVAL, "checkpoint_writer_save: keep must be 0 (path itself) or at "
                         "least 1, got %d", c->keep);
    int64_t t0 = now_ns();
    nb_status st = writer_save(w, base, c);
    int64_t dt = now_ns() - t0;
    pthread_mutex_lock(&w->mu);
    w->stats.stall_ns_last = dt;
    w->stats.stall_ns_total += dt;
    pthread_mutex_unlock(&w->mu);
    return st;
}

nb_status nb_checkpoint_writer_wait(nb_checkpoint_writer *w) {
    if (!w) return nb__error(NB_ENULL, "checkpoint_writer_wait: the writer is NULL");
    if (!nb__obj_ok(w, NB__OBJ_CKPT_WRITER, "checkpoint_writer_wait")) return nb_last_status();
    return finish(w, "checkpoint_writer_wait");
}

void nb_checkpoint_writer_get_stats(nb_checkpoint_writer *w, nb_checkpoint_writer_stats *out) {
    if (!out) return;
    if (!w || !nb__obj_ok(w, NB__OBJ_CKPT_WRITER, "checkpoint_writer_get_stats")) {
        memset(out, 0, sizeof *out);
        return;
    }
    pthread_mutex_lock(&w->mu);
    *out = w->stats;
    pthread_mutex_unlock(&w->mu);
}

nb_status nb_checkpoint_writer_free(nb_checkpoint_writer *w) {
    if (!w) return NB_OK;
    if (!nb__obj_ok(w, NB__OBJ_CKPT_WRITER, "checkpoint_writer_free")) return nb_last_status();
    pthread_mutex_lock(&w->mu);
    wait_idle(w);
    w->quit = true;
    pthread_cond_broadcast(&w->cv);
    nb_status st = take_result(w);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    /* a save of several ranks not finished with _wait gets no index: the previous one stays;
     * a plain file is complete once written */
    dcp_job_free(&w->j);
    for (int i = 0; i < w->cap; i++) {
        nb_tensor_free(w->snap[i]);
        free(w->names[i]);
    }
    free(w->snap);
    free(w->names);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    nb__obj_free(w);
    return st;
}
