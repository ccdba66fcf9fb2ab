/* checkpoint_writer.c - asynchronous ("flash") checkpoints (nabla/checkpoint.h): the caller's
 * thread copies the state into reused host snapshot tensors, a background thread writes them
 * with the synchronous path's writer (io_impl.h), so the bytes are the same. A writer is a
 * checked handle (tensor/handle.h): used after nb_checkpoint_writer_free it is an error value,
 * and a save refuses a checkpoint whose objects were freed. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/io_impl.h"
#include "nabla/autograd.h"
#include "nabla/checkpoint.h"
#include "tensor/handle.h"
#include "tensor/tensor_impl.h"
#include "tensor/trace.h"

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
    /* the snapshot: n entries, names and host tensors reused while they match */
    int n, cap;
    char **names;
    nb_tensor **snap;
    /* metadata: keys[i], vals[i] point into text */
    int m, mcap;
    const char **keys, **vals;
    char *text;
    size_t text_cap;
    char base[4096];
    char path[4400];
    bool rotate; /* after the write: base's series, newest opts.keep kept */
    nb__zero_pending zero; /* zero_ckpt.c's sharded save in flight */
    int64_t step;
    /* a failed write not yet reported */
    nb_status err;
    char err_msg[1024];
    nb_checkpoint_writer_stats stats;
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void *writer_main(void *arg) {
    nb_checkpoint_writer *w = arg;
    nb__slow_write_ms = w->slow_ms; /* this thread's writes only */
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->job && !w->quit) pthread_cond_wait(&w->cv, &w->mu);
        if (!w->job) break; /* quit, nothing left to write */
        w->job = false;
        pthread_mutex_unlock(&w->mu);
        int64_t t0 = now_ns();
        nb_status st = nb__checkpoint_write(w->path, (const char *const *)w->names, w->snap, w->n,
                                            w->keys, w->vals, w->m);
        if (st == NB_OK && w->rotate) nb__checkpoint_rotate(w->base, w->opts.keep, w->path);
        int64_t dt = now_ns() - t0;
        pthread_mutex_lock(&w->mu);
        if (st != NB_OK) {
            w->err = st;
            snprintf(w->err_msg, sizeof w->err_msg, "%s", nb_last_error());
            nb_clear_error();
            w->stats.failed++;
        } else {
            w->stats.written++;
        }
        w->stats.write_ns_last = dt;
        w->stats.write_ns_total += dt;
        w->busy = false;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

nb_checkpoint_writer *nb_checkpoint_writer_new(const nb_checkpoint_writer_opts *opts) {
    nb_checkpoint_writer_opts o = opts ? *opts : (nb_checkpoint_writer_opts){0};
    if (o.keep < 0) {
        nb__error(NB_EINVAL, "checkpoint_writer_new: keep must be 0 (one file) or at least 1, "
                  "got %d", o.keep);
        return NULL;
    }
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

/* With w->mu held: the failed write's error, now reported (NB_OK if none). */
static nb_status take_error(nb_checkpoint_writer *w) {
    if (w->err == NB_OK) return NB_OK;
    nb_status st = w->err;
    w->err = NB_OK;
    return nb__error(st, "%s", w->err_msg);
}

static bool same_layout(const nb_tensor *a, const nb_tensor *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

/* Entry i of the snapshot: name and a host tensor of src's shape and dtype holding a copy of
 * src's values (the buffers of the last save when they fit). */
static nb_status snapshot_entry(nb_checkpoint_writer *w, int i, const char *name, nb_tensor *src) {
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
        nb_device prev = nb_default_device();
        nb_set_default_device(NB_CPU);
        nb_tensor *t = nb_empty(src->shape, src->ndim, src->dtype);
        nb_set_default_device(prev);
        if (!t) return nb_last_status();
        w->snap[i] = nb__scope_take(t);
    }
    size_t nbytes = (size_t)nb_numel(src) * nb_dtype_size(src->dtype);
    if (nbytes == 0) return NB_OK;
    if (nb__host_accessible(src) && nb_is_contiguous(src)) {
        memcpy(nb__ptr(w->snap[i]), nb__ptr(src), nbytes);
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

/* The metadata pairs copied into the writer's text (the caller's strings may change while
 * the file is written). */
static nb_status snapshot_meta(nb_checkpoint_writer *w, const char *const *keys,
                               const char *const *vals, int m) {
    size_t need = 1;
    for (int i = 0; i < m; i++) need += strlen(keys[i]) + strlen(vals[i]) + 2;
    if (m > w->mcap) {
        const char **k = realloc(w->keys, sizeof(char *) * (size_t)m);
        if (k) w->keys = k;
        const char **v = k ? realloc(w->vals, sizeof(char *) * (size_t)m) : NULL;
        if (!v) return nb__error(NB_ENOMEM, "checkpoint_writer_save: out of memory");
        w->vals = v;
        w->mcap = m;
    }
    if (need > w->text_cap) {
        char *t = realloc(w->text, need);
        if (!t) return nb__error(NB_ENOMEM, "checkpoint_writer_save: out of memory");
        w->text = t;
        w->text_cap = need;
    }
    char *p = w->text;
    for (int i = 0; i < m; i++) {
        size_t lk = strlen(keys[i]) + 1, lv = strlen(vals[i]) + 1;
        w->keys[i] = memcpy(p, keys[i], lk), p += lk;
        w->vals[i] = memcpy(p, vals[i], lv), p += lv;
    }
    w->m = m;
    return NB_OK;
}

/* exact: base is the file to write (no series), with nx more metadata pairs. */
static nb_status writer_save(nb_checkpoint_writer *w, const char *base, const nb_checkpoint *c,
                             bool exact, const char *const *xkeys, const char *const *xvals,
                             int nx) {
    const char *op = "checkpoint_writer_save";
    pthread_mutex_lock(&w->mu);
    if (w->busy && w->opts.policy == NB_CKPT_SKIP) { /* an earlier failure is still news */
        nb_status st = take_error(w);
        if (st == NB_OK) w->stats.skipped++;
        pthread_mutex_unlock(&w->mu);
        return st;
    }
    wait_idle(w);
    nb_status st = take_error(w); /* also the write just waited for */
    pthread_mutex_unlock(&w->mu);
    if (st != NB_OK) return st;
    /* No write in flight: the buffers are ours until the job is handed over. */
    st = nb__checkpoint_target(base, c->step, exact ? 0 : w->opts.keep, w->path, sizeof w->path,
                               op);
    w->rotate = !exact && w->opts.keep > 0;
    if (st == NB_OK && w->rotate) {
        if (strlen(base) >= sizeof w->base)
            st = nb__error(NB_EINVAL, "%s: path too long: %s", op, base);
        else
            snprintf(w->base, sizeof w->base, "%s", base);
    }
    if (st != NB_OK) return st;
    int tok = NB__SPAN_BEGIN("checkpoint snapshot", NULL, NB__CAT_IO);
    nb__ckpt_parts p;
    st = nb__checkpoint_collect(c, xkeys, xvals, nx, &p);
    for (int i = 0; st == NB_OK && i < p.list.count; i++)
        st = snapshot_entry(w, i, p.list.names[i], p.list.tensors[i]);
    if (st == NB_OK) st = snapshot_meta(w, p.keys, p.vals, p.m);
    if (st == NB_OK) {
        for (int i = p.list.count; i < w->n; i++) { /* entries the state no longer has */
            nb_tensor_free(w->snap[i]);
            free(w->names[i]);
            w->snap[i] = NULL, w->names[i] = NULL;
        }
        w->n = p.list.count;
        w->step = c->step;
    }
    nb__checkpoint_parts_free(&p, c);
    NB__SPAN_END(tok);
    if (st != NB_OK) return st;
    pthread_mutex_lock(&w->mu);
    w->busy = w->job = true;
    w->stats.saves++;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
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
    int64_t t0 = now_ns();
    nb_status st = writer_save(w, base, c, false, NULL, NULL, 0);
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
    pthread_mutex_lock(&w->mu);
    wait_idle(w);
    nb_status st = take_error(w);
    pthread_mutex_unlock(&w->mu);
    return st;
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
    nb_status st = take_error(w);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    for (int i = 0; i < w->cap; i++) {
        nb_tensor_free(w->snap[i]);
        free(w->names[i]);
    }
    free(w->snap);
    free(w->names);
    free(w->keys);
    free(w->vals);
    free(w->text);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    nb__obj_free(w);
    return st;
}

nb_status nb__checkpoint_writer_save_file(nb_checkpoint_writer *w, const char *path,
                                         const nb_checkpoint *c, const char *const *xkeys,
                                         const char *const *xvals, int nx) {
    if (!nb__obj_ok(w, NB__OBJ_CKPT_WRITER, "checkpoint_writer_save") ||
        ckpt_objects_ok(c, "checkpoint_writer_save") != NB_OK)
        return nb_last_status();
    int64_t t0 = now_ns();
    nb_status st = writer_save(w, path, c, true, xkeys, xvals, nx);
    int64_t dt = now_ns() - t0;
    pthread_mutex_lock(&w->mu);
    w->stats.stall_ns_last = dt;
    w->stats.stall_ns_total += dt;
    pthread_mutex_unlock(&w->mu);
    return st;
}

nb__zero_pending *nb__checkpoint_writer_zero(nb_checkpoint_writer *w) { return &w->zero; }

bool nb__checkpoint_writer_skips(const nb_checkpoint_writer *w) {
    return w->opts.policy == NB_CKPT_SKIP;
}
