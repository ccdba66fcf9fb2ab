/* loader.c - the batch loader: per-epoch shuffle keyed by (seed, epoch), a shard per rank
 * as PyTorch's DistributedSampler, batches gathered into preallocated buffers, optional
 * prefetching on a background thread, and a resumable position.
 *
 * Order of an epoch. perm = nb_randperm(N) of a generator (seed, stream = epoch, offset 0)
 * (identity without shuffle). The rank's list is sample q -> perm[(rank + q * world) % N]
 * for q in [0, per_rank): with drop_last the epoch is truncated to floor(N / world) * world
 * positions, without it padded to ceil(N / world) * world by wrapping around to the start
 * of perm (DistributedSampler's padding), so every rank gets the same count. Batch b is
 * q in [b * batch_size, ...). Nothing here depends on timing or on prefetching.
 *
 * Buffers ("slots"). Each slot holds a full batch x / y, views of its first `tail` rows for
 * the last, shorter batch, and the batch's indices; all are made once in nb_loader_new, so
 * a batch costs no allocation. Synchronously (prefetch 0) one slot is filled in
 * nb_loader_next. With prefetch P there are P + 1 slots in a ring: the caller holds one
 * (the batch it is using) while the producer thread fills up to P ahead. An end of epoch
 * and an error travel through the ring as slots too, so the caller sees them in order.
 *
 * The producer thread opens a scope around each batch, so tensors that a dataset or a
 * transform creates are freed there and never reach the caller's scope; its errors are
 * copied into the slot and re-raised on the caller's thread (the last error is per
 * thread). */
#include <pthread.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "data/data_impl.h"
#include "tensor/backend.h"
#include "tensor/handle.h"
#include "tensor/trace.h"

#define NB__LOADER_MAX_PREFETCH 64
#define NB__LOADER_MSG 512

typedef enum { SLOT_BATCH, SLOT_END, SLOT_ERROR } slot_kind;

typedef struct {
    nb_tensor *x, *y;   /* (batch_size, ...) */
    nb_tensor *xt, *yt; /* views of the first `tail` rows, NULL when tail == 0 */
    nb_tensor *dx, *dy; /* the batch on opts.device (owned; made per batch), or NULL */
    int64_t *indices;   /* batch_size entries */
    int64_t n, epoch, index;
    slot_kind kind;
    nb_status err;
    char msg[NB__LOADER_MSG];
} nb__slot;

struct nb_loader {
    nb__obj h; /* a checked handle (tensor/handle.h) */
    nb_dataset *ds;
    nb_loader_opts o;
    int64_t len, per_rank, num_batches, tail;
    int nslots;
    nb__slot *slots;

    /* Producer side: touched only by the thread that fills slots (the prefetch thread,
     * or the caller when synchronous). */
    int64_t *perm;
    int64_t perm_epoch; /* epoch perm holds, -1 for none */
    int64_t pe, pb;     /* next position to produce */

    /* Caller side. */
    int64_t ce, cb;     /* next position to return */
    nb_status err;
    char errmsg[NB__LOADER_MSG];

    /* Ring, guarded by mu (prefetch only). */
    pthread_mutex_t mu;
    pthread_cond_t cv_ready, cv_free;
    pthread_t thread;
    bool running, stop, halted;
    int head;   /* next slot to consume */
    int nready; /* slots produced and not yet consumed */
    int held;   /* slot the caller is using, -1 for none */
};

/* ---- shuffle -------------------------------------------------------------------------- */
void nb__data_randperm(int64_t *p, int64_t n, uint64_t seed, uint64_t stream) {
    /* nb_randperm's algorithm (tensor/random.c): Fisher-Yates from the top, swap i with
     * j = (x * (i + 1)) >> 64 where x is the next 64-bit word of the stream, two words per
     * Philox block. Kept identical so the documented equality holds (tested). */
    for (int64_t i = 0; i < n; i++) p[i] = i;
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t w[4];
    uint64_t k = 0;
    for (int64_t i = n - 1; i >= 1; i--, k++) {
        if (k % 2 == 0) {
            uint64_t c = k / 2;
            uint32_t ctr[4] = {(uint32_t)c, (uint32_t)(c >> 32), (uint32_t)stream,
                               (uint32_t)(stream >> 32)};
            nb_philox4x32(ctr, key, w);
        }
        int h = (int)(k % 2);
        uint64_t x = (uint64_t)w[2 * h] << 32 | w[2 * h + 1];
        int64_t j = (int64_t)(((unsigned __int128)x * (uint64_t)(i + 1)) >> 64);
        int64_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}

/* ---- producing a slot ------------------------------------------------------------------ */
static void slot_error(nb__slot *s, nb_status st, const char *what, const char *name) {
    s->kind = SLOT_ERROR;
    s->err = st < 0 ? st : NB_EINTERNAL;
    if (nb_last_status() != NB_OK)
        snprintf(s->msg, sizeof s->msg, "%s", nb_last_error());
    else /* a user callback that failed without a nabla error behind it */
        snprintf(s->msg, sizeof s->msg, "loader: %s of the %s dataset failed (%s: %s)", what,
                 name, nb_status_name(s->err), nb_status_str(s->err));
}

/* Fill slot s with position (l->pe, l->pb) and advance it. Runs on the producer side. */
static void produce(nb_loader *l, nb__slot *s) {
    if (l->pb >= l->num_batches) {
        s->kind = SLOT_END;
        s->epoch = l->pe;
        l->pe++;
        l->pb = 0;
        return;
    }
    int64_t e = l->pe, b = l->pb;
    if (l->perm_epoch != e) {
        if (l->o.shuffle) nb__data_randperm(l->perm, l->len, l->o.seed, (uint64_t)e);
        else
            for (int64_t i = 0; i < l->len; i++) l->perm[i] = i;
        l->perm_epoch = e;
    }
    int64_t bs = l->o.batch_size, world = l->o.world_size;
    int64_t n = (b == l->num_batches - 1 && l->tail > 0) ? l->tail : bs;
    for (int64_t j = 0; j < n; j++) {
        int64_t q = b * bs + j;
        s->indices[j] = l->perm[(l->o.rank + q * world) % l->len];
    }
    s->kind = SLOT_BATCH;
    s->n = n;
    s->epoch = e;
    s->index = b;
    nb_tensor *x = n == bs ? s->x : s->xt;
    nb_tensor *y = n == bs ? s->y : s->yt;
    int tok = NB__SPAN_BEGIN("loader produce", NULL, NB__CAT_DATA);
    nb_clear_error();
    nb_scope_begin();
    nb_status st = l->ds->vt->get_batch(l->ds, s->indices, n, x, y);
    if (st != NB_OK) {
        slot_error(s, st, "get_batch", l->ds->vt->name);
    } else if (l->o.transform) {
        nb_batch bt = {.x = x, .y = y, .indices = s->indices, .n = n, .epoch = e, .index = b,
                       .seed = l->o.seed};
        st = l->o.transform(&bt, l->o.transform_ctx);
        if (st != NB_OK) slot_error(s, st, "the transform", l->ds->vt->name);
    }
    /* opts.device: a copy there, made here (on the prefetch thread: overlapped with the
     * caller's compute); the previous batch's copies of this slot go first (their memory
     * waits for the caller's work on them: nb_record_stream in deliver) */
    nb_tensor_free(s->dx), nb_tensor_free(s->dy);
    s->dx = s->dy = NULL;
    if (s->kind == SLOT_BATCH && !nb_device_equal(l->o.device, NB_CPU)) {
        nb_tensor *dx = nb_to_device(x, l->o.device);
        nb_tensor *dy = dx && y ? nb_to_device(y, l->o.device) : NULL;
        if (!dx || (y && !dy)) slot_error(s, nb_last_status(), "the copy to the device", l->ds->vt->name);
        else s->dx = nb__scope_take(dx), s->dy = dy ? nb__scope_take(dy) : NULL;
    }
    nb_scope_end();
    NB__SPAN_END_ARG(tok, "batch", b);
    l->pb++;
}

/* ---- prefetch thread -------------------------------------------------------------------- */
static void *producer_main(void *arg) {
    nb_loader *l = arg;
    nb__trace_thread_name("loader");
    /* The producer works serially. A second OpenMP team here would put more threads than
     * cores into libgomp, which then throttles every team's spin-waits and makes each
     * parallel region of the training step pay a futex wake-up (measured: 2x slower). */
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->stop && (l->halted || l->nready + (l->held >= 0) >= l->nslots))
            pthread_cond_wait(&l->cv_free, &l->mu);
        if (l->stop) break;
        /* The next free slot follows the ready ones; it is never the held one, which sits
         * just before head, because nready + 1 < nslots while one is held. */
        nb__slot *s = &l->slots[(l->head + l->nready) % l->nslots];
        pthread_mutex_unlock(&l->mu);
        produce(l, s);
        pthread_mutex_lock(&l->mu);
        l->nready++;
        if (s->kind == SLOT_ERROR) l->halted = true; /* nothing after an error */
        pthread_cond_signal(&l->cv_ready);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

static void stop_thread(nb_loader *l) {
    if (!l->running) return;
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_broadcast(&l->cv_free);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    l->running = false;
    l->stop = false;
}

/* Forget everything prefetched and restart production at the caller's position. */
static void reset_to(nb_loader *l, int64_t epoch, int64_t batch) {
    stop_thread(l);
    l->head = l->nready = 0;
    l->held = -1;
    l->halted = false;
    l->err = NB_OK;
    l->errmsg[0] = '\0';
    l->ce = l->pe = epoch;
    l->cb = l->pb = batch;
}

/* ---- creation ----------------------------------------------------------------------------- */
/* A host batch buffer: in the device's page-locked host memory when its backend has some
 * (CUDA: pinned, so the copy to the GPU is a DMA), else an ordinary CPU tensor. */
typedef struct {
    const nb__backend *be;
    nb_device dev;
} pinned_owner;
static void pinned_release(void *data, void *ctx) {
    pinned_owner *o = ctx;
    o->be->host_free(o->dev, data);
    free(o);
}
static nb_tensor *host_buffer(nb_loader *l, const int64_t *shape, int ndim, nb_dtype dt) {
    const nb__backend *be = nb_device_equal(l->o.device, NB_CPU)
                                ? NULL : nb__backend_of(l->o.device, "loader_new");
    if (!be || !be->host_alloc) return nb_empty_on(NB_CPU, shape, ndim, dt);
    size_t n = nb_dtype_size(dt);
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    pinned_owner *o = malloc(sizeof *o);
    void *p = o ? be->host_alloc(l->o.device, n) : NULL;
    if (!p) {
        free(o);
        if (!o) nb__error(NB_ENOMEM, "loader_new: out of memory");
        return NULL;
    }
    *o = (pinned_owner){be, l->o.device};
    nb_tensor *t = nb_wrap_buffer(p, shape, ndim, dt, pinned_release, o);
    if (!t) pinned_release(p, o);
    return t;
}

static nb_status make_slot(nb_loader *l, nb__slot *s) {
    const nb_dataset *ds = l->ds;
    int64_t shape[NB_MAX_DIMS];
    shape[0] = l->o.batch_size;
    s->indices = malloc(sizeof(int64_t) * (size_t)l->o.batch_size);
    if (!s->indices) return nb__error(NB_ENOMEM, "loader_new: out of memory");
    memcpy(shape + 1, ds->x.shape, sizeof(int64_t) * (size_t)ds->x.ndim);
    s->x = nb__scope_take(host_buffer(l, shape, ds->x.ndim + 1, ds->x.dtype));
    if (!s->x) return nb_last_status();
    if (l->tail) {
        s->xt = nb__scope_take(nb_narrow(s->x, 0, 0, l->tail));
        if (!s->xt) return nb_last_status();
    }
    if (ds->has_y) {
        memcpy(shape + 1, ds->y.shape, sizeof(int64_t) * (size_t)ds->y.ndim);
        s->y = nb__scope_take(host_buffer(l, shape, ds->y.ndim + 1, ds->y.dtype));
        if (!s->y) return nb_last_status();
        if (l->tail) {
            s->yt = nb__scope_take(nb_narrow(s->y, 0, 0, l->tail));
            if (!s->yt) return nb_last_status();
        }
    }
    return NB_OK;
}

static bool spec_ok(const nb_sample_spec *s, const char *what, const char *name) {
    if (s->ndim < 0 || s->ndim >= NB_MAX_DIMS) {
        nb__error(NB_EDIM, "loader_new: the %s dataset's %s samples have %d dims (0 to %d "
                  "allowed, the batch adds one)", name, what, s->ndim, NB_MAX_DIMS - 1);
        return false;
    }
    for (int d = 0; d < s->ndim; d++)
        if (s->shape[d] < 0) {
            nb__error(NB_ESHAPE, "loader_new: the %s dataset's %s sample shape %s is invalid",
                      name, what, nb__shape_str(s->shape, s->ndim, (char[NB__SHAPE_STR]){0}));
            return false;
        }
    if (nb_dtype_size(s->dtype) == 0) {
        nb__error(NB_EDTYPE, "loader_new: the %s dataset's %s dtype %d is invalid", name,
                  what, (int)s->dtype);
        return false;
    }
    return true;
}

nb_loader_opts nb_loader_defaults(void) {
    return (nb_loader_opts){
        ._init = NB__OPTS_MARK(nb_loader_opts), .batch_size = 1, .world_size = 1};
}

nb_loader *nb_loader_new(nb_dataset *ds, const nb_loader_opts *opts) {
    const char *op = "loader_new";
    if (!ds || !ds->vt || !ds->vt->length || !ds->vt->get_batch) {
        nb__error(NB_ENULL, "%s: %s", op, ds ? "the dataset has no vtable (length and "
                  "get_batch are required)" : "argument 'dataset' is NULL");
        return NULL;
    }
    if (opts && NB__OPTS_CHECK(opts, nb_loader_opts, op, "nb_loader_defaults()",
                               "o.batch_size = 64") != NB_OK)
        return NULL;
    nb_loader_opts o = opts ? *opts : nb_loader_defaults();
    if (o.batch_size <= 0) {
        nb__error(NB_EINVAL, "%s: batch_size must be > 0 (got %lld)", op,
                  (long long)o.batch_size);
        return NULL;
    }
    if (o.world_size <= 0 || o.rank < 0 || o.rank >= o.world_size) {
        nb__error(NB_EINVAL, "%s: world_size %d must be >= 1 and rank %d in [0, world_size) "
                  "(nb_loader_defaults() gives 1 and 0)", op, o.world_size, o.rank);
        return NULL;
    }
    if (o.prefetch < 0 || o.prefetch > NB__LOADER_MAX_PREFETCH) {
        nb__error(NB_EINVAL, "%s: prefetch must be in [0, %d] (got %d)", op,
                  NB__LOADER_MAX_PREFETCH, o.prefetch);
        return NULL;
    }
    if (!nb__backend_of(o.device, op)) return NULL; /* "loader_new: unknown device ..." */
    if (!spec_ok(&ds->x, "x", ds->vt->name) || (ds->has_y && !spec_ok(&ds->y, "y",
                                                                      ds->vt->name)))
        return NULL;
    int64_t len = ds->vt->length(ds);
    if (len < 0) {
        if (nb_last_status() == NB_OK)
            nb__error(NB_EINVAL, "%s: the %s dataset reports a negative length", op,
                      ds->vt->name);
        return NULL;
    }

    nb_loader *l = nb__obj_alloc(sizeof *l, NB__OBJ_LOADER);
    if (!l) {
        nb__error(NB_ENOMEM, "%s: out of memory", op);
        return NULL;
    }
    l->ds = ds;
    l->o = o;
    l->len = len;
    int64_t world = o.world_size;
    l->per_rank = o.drop_last ? len / world : (len + world - 1) / world;
    l->num_batches = o.drop_last ? l->per_rank / o.batch_size
                                 : (l->per_rank + o.batch_size - 1) / o.batch_size;
    l->tail = o.drop_last ? 0 : l->per_rank % o.batch_size;
    l->nslots = o.prefetch + 1;
    l->perm_epoch = -1;
    l->held = -1;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv_ready, NULL);
    pthread_cond_init(&l->cv_free, NULL);
    l->slots = calloc((size_t)l->nslots, sizeof *l->slots);
    l->perm = malloc(sizeof(int64_t) * (size_t)(len > 0 ? len : 1));
    if (!l->slots || !l->perm) {
        nb__error(NB_ENOMEM, "%s: out of memory", op);
        nb_loader_free(l);
        return NULL;
    }
    for (int i = 0; i < l->nslots; i++)
        if (make_slot(l, &l->slots[i]) != NB_OK) {
            nb_loader_free(l);
            return NULL;
        }
    return l;
}

void nb_loader_free(nb_loader *l) {
    if (!l || !nb__obj_ok(l, NB__OBJ_LOADER, "loader_free")) return;
    stop_thread(l);
    if (l->slots)
        for (int i = 0; i < l->nslots; i++) {
            nb__slot *s = &l->slots[i];
            nb_tensor_free(s->dx);
            nb_tensor_free(s->dy);
            nb_tensor_free(s->xt); /* views before their bases */
            nb_tensor_free(s->yt);
            nb_tensor_free(s->x);
            nb_tensor_free(s->y);
            free(s->indices);
        }
    free(l->slots);
    free(l->perm);
    pthread_cond_destroy(&l->cv_free);
    pthread_cond_destroy(&l->cv_ready);
    pthread_mutex_destroy(&l->mu);
    nb__obj_free(l);
}

/* ---- consuming ------------------------------------------------------------------------------ */
static bool fail(nb_loader *l) {
    nb__error(l->err, "%s", l->errmsg);
    return false;
}

/* Deliver slot s (taken from the ring or filled synchronously) to the caller. */
static bool deliver(nb_loader *l, nb__slot *s, nb_batch *b) {
    switch (s->kind) {
    case SLOT_END:
        l->ce = s->epoch + 1;
        l->cb = 0;
        return false;
    case SLOT_ERROR:
        l->err = s->err;
        snprintf(l->errmsg, sizeof l->errmsg, "%s", s->msg);
        return fail(l);
    default: break;
    }
    bool full = s->n == l->o.batch_size;
    if (s->dx) { /* on opts.device: used by this thread's stream from now on */
        nb_status st = nb_record_stream(s->dx);
        if (st == NB_OK && s->dy) st = nb_record_stream(s->dy);
        if (st != NB_OK) {
            l->err = st;
            snprintf(l->errmsg, sizeof l->errmsg, "%s", nb_last_error());
            return fail(l);
        }
        *b = (nb_batch){.x = s->dx, .y = s->dy, .indices = s->indices, .n = s->n,
                        .epoch = s->epoch, .index = s->index, .seed = l->o.seed};
        l->ce = s->epoch;
        l->cb = s->index + 1;
        return true;
    }
    *b = (nb_batch){.x = full ? s->x : s->xt, .y = full ? s->y : s->yt,
                    .indices = s->indices, .n = s->n, .epoch = s->epoch, .index = s->index,
                    .seed = l->o.seed};
    l->ce = s->epoch;
    l->cb = s->index + 1;
    return true;
}

static bool loader_next(nb_loader *l, nb_batch *b);
/* A span per call ("loader next"), with the time spent waiting for the prefetch thread as a
 * span of its own inside ("loader wait"): data loading that was not hidden. */
bool nb_loader_next(nb_loader *l, nb_batch *b) {
    if (l && !nb__obj_ok(l, NB__OBJ_LOADER, "loader_next")) return false;
    int tok = NB__SPAN_BEGIN("loader next", NULL, NB__CAT_DATA);
    bool ok = loader_next(l, b);
    NB__SPAN_END(tok);
    return ok;
}

static bool loader_next(nb_loader *l, nb_batch *b) {
    if (!l || !b) {
        nb__error(NB_ENULL, "loader_next: argument '%s' is NULL", l ? "batch" : "loader");
        return false;
    }
    if (l->err != NB_OK) return fail(l);
    if (l->o.prefetch == 0) {
        l->pe = l->ce;
        l->pb = l->cb;
        produce(l, &l->slots[0]);
        return deliver(l, &l->slots[0], b);
    }
    if (!l->running) {
        l->pe = l->ce;
        l->pb = l->cb;
        if (pthread_create(&l->thread, NULL, producer_main, l) != 0) {
            l->err = NB_ESTATE;
            snprintf(l->errmsg, sizeof l->errmsg,
                     "loader_next: cannot start the prefetch thread (use .prefetch = 0)");
            return fail(l);
        }
        l->running = true;
    }
    pthread_mutex_lock(&l->mu);
    if (l->held >= 0) { /* the caller is done with the previous batch */
        l->held = -1;
        pthread_cond_signal(&l->cv_free);
    }
    if (l->nready == 0) {
        int tok = NB__SPAN_BEGIN("loader wait", NULL, NB__CAT_DATA);
        while (l->nready == 0) pthread_cond_wait(&l->cv_ready, &l->mu);
        NB__SPAN_END(tok);
    }
    int si = l->head;
    l->head = (l->head + 1) % l->nslots;
    l->nready--;
    nb__slot *s = &l->slots[si];
    nb__slot marker;
    if (s->kind == SLOT_BATCH) {
        l->held = si;
    } else {
        /* An end or error marker frees its slot at once: copy it first, since the producer
         * may refill the slot as soon as the lock is released. */
        marker = *s;
        s = &marker;
        pthread_cond_signal(&l->cv_free);
    }
    pthread_mutex_unlock(&l->mu);
    return deliver(l, s, b);
}

nb_status nb_loader_error(const nb_loader *l) {
    return !l ? NB_ENULL : nb__obj_ok(l, NB__OBJ_LOADER, "loader_error") ? l->err : NB_EFREED;
}

int64_t nb_loader_num_batches(const nb_loader *l) {
    return l && nb__obj_ok(l, NB__OBJ_LOADER, "loader_num_batches") ? l->num_batches : -1;
}

int64_t nb_loader_num_samples(const nb_loader *l) {
    if (!l || !nb__obj_ok(l, NB__OBJ_LOADER, "loader_num_samples")) return -1;
    return l->o.drop_last ? l->num_batches * l->o.batch_size : l->per_rank;
}

nb_status nb_loader_get_state(const nb_loader *l, nb_loader_state *out) {
    if (!l || !out)
        return nb__error(NB_ENULL, "loader_get_state: argument '%s' is NULL",
                         l ? "out" : "loader");
    if (!nb__obj_ok(l, NB__OBJ_LOADER, "loader_get_state")) return nb_last_status();
    *out = (nb_loader_state){.epoch = l->ce, .batch = l->cb};
    return NB_OK;
}

nb_status nb_loader_set_state(nb_loader *l, const nb_loader_state *st) {
    if (!l || !st)
        return nb__error(NB_ENULL, "loader_set_state: argument '%s' is NULL",
                         l ? "state" : "loader");
    if (!nb__obj_ok(l, NB__OBJ_LOADER, "loader_set_state")) return nb_last_status();
    if (st->epoch < 0 || st->batch < 0 || st->batch > l->num_batches)
        return nb__error(NB_EINVAL, "loader_set_state: position (epoch %lld, batch %lld) is "
                         "outside [0, inf) x [0, %lld] for this loader",
                         (long long)st->epoch, (long long)st->batch,
                         (long long)l->num_batches);
    reset_to(l, st->epoch, st->batch);
    return NB_OK;
}
