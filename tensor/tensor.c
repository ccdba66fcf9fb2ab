/* tensor.c - tensor objects: reference counting, metadata, and creation. */
#include <math.h>
#include <string.h>

#include <pthread.h>

#include "tensor/asan.h"
#include "tensor/backend.h"
#include "tensor/tensor_impl.h"

int64_t nb__numel_of(const int64_t *shape, int ndim) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

void nb__contiguous_strides(const int64_t *shape, int ndim, int64_t *strides) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i] > 1 ? shape[i] : 1;
    }
}

static bool check_shape(const int64_t *shape, int ndim, const char *op) {
    if (ndim < 0 || ndim > NB_MAX_DIMS) {
        nb__error(NB_EINVAL, "%s: %d dims requested; tensors have 0 to %d dims", op, ndim,
                  NB_MAX_DIMS);
        return false;
    }
    if (ndim > 0 && !shape) {
        nb__error(NB_ENULL, "%s: shape is NULL but ndim is %d", op, ndim);
        return false;
    }
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            nb__error(NB_EINVAL, "%s: negative size %lld in shape %s", op,
                      (long long)shape[i], nb__shape_str(shape, ndim, (char[NB__SHAPE_STR]){0}));
            return false;
        }
    }
    /* Checked with 0-sized dims counted as 1: an empty tensor's strides still come from
     * its other sizes (nb__shape_bytes). */
    if (!nb__shape_bytes(shape, ndim, NB__MAX_ELEM, NULL)) {
        nb__error(NB_EINVAL, "%s: shape %s is too large: its sizes (0 counted as 1) multiply "
                  "past what 64-bit strides and byte sizes can hold", op,
                  nb__shape_str(shape, ndim, (char[NB__SHAPE_STR]){0}));
        return false;
    }
    return true;
}

static bool check_dtype(nb_dtype dt, const char *op) {
    if ((unsigned)dt >= NB_DTYPE_COUNT) {
        nb__error(NB_EDTYPE, "%s: %d is not a valid dtype", op, (int)dt);
        return false;
    }
    return true;
}

/* ---- header quarantine -------------------------------------------------------------------
 * A released header is not handed back at once: it joins a FIFO of released headers, and a
 * new tensor takes the oldest one only while at least `reserve` others wait behind it. So a
 * handle stays recognisably dead (its magic) for the next `reserve` releases at least, and
 * nb__arg_ok reports "used after the scope ended" instead of reading a new tensor that took
 * the memory over. The FIFO is filled with `reserve` fresh headers at the first tensor, so
 * the steady state still allocates nothing: a loop that creates and releases k tensors per
 * step cycles through reserve + k headers. NB_HANDLE_QUARANTINE=N (read once) sets reserve
 * (default 1024, about 256 KiB of headers); a large N is a debug mode that catches handles
 * used long after their release. Under ASan a waiting header is poisoned past its magic, so
 * code that skips the check is still reported. */
#define NB__QUARANTINE_DEFAULT 1024
#define NB__QUARANTINE_MAX (1 << 24)

static struct {
    pthread_mutex_t lock;
    nb_tensor **ring; /* FIFO of released headers: cap slots from head */
    int64_t head, n, cap, reserve;
    bool ready, failed;
} g_q = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Headers are the system allocator's blocks, not the caching allocator's: they recycle
 * through the quarantine, and keeping them out of nb_alloc_stats keeps those figures about
 * tensor memory. */
static nb_tensor *header_alloc(void) {
    return aligned_alloc(64, (sizeof(nb_tensor) + 63) / 64 * 64);
}

static void q_poison(nb_tensor *t) {
    NB__POISON((char *)t + sizeof(uint64_t), sizeof *t - sizeof(uint64_t));
    (void)t;
}

/* Called with g_q.lock held, once. On failure the quarantine is off (headers go straight
 * back to the allocator, as before it existed): detection is a service, not a requirement. */
static void q_init(void) {
    g_q.ready = true;
    int64_t reserve = NB__QUARANTINE_DEFAULT;
    const char *env = getenv("NB_HANDLE_QUARANTINE");
    if (env && *env) {
        char *end;
        long long v = strtoll(env, &end, 10);
        if (*end == 0 && v >= 0) reserve = v < NB__QUARANTINE_MAX ? v : NB__QUARANTINE_MAX;
    }
    g_q.reserve = reserve;
    g_q.cap = 2 * reserve + 64;
    g_q.ring = calloc((size_t)g_q.cap, sizeof *g_q.ring);
    if (!g_q.ring) {
        g_q.failed = true;
        return;
    }
    for (int64_t i = 0; i < reserve; i++) {
        nb_tensor *t = header_alloc();
        if (!t) break;
        memset(t, 0, sizeof *t);
        t->magic = NB__TENSOR_FREED;
        q_poison(t);
        g_q.ring[g_q.n++] = t;
    }
}

static nb_tensor *q_take(void) {
    nb_tensor *t = NULL;
    pthread_mutex_lock(&g_q.lock);
    if (!g_q.ready) q_init();
    if (g_q.n > g_q.reserve) {
        t = g_q.ring[g_q.head];
        g_q.head = (g_q.head + 1) % g_q.cap;
        g_q.n--;
    }
    pthread_mutex_unlock(&g_q.lock);
    if (t) NB__UNPOISON(t, sizeof *t);
    return t;
}

/* t's refcount reached zero: mark it dead and queue it (or free the oldest when full). */
static void q_release(nb_tensor *t, uint32_t how) {
    memset(t, 0, sizeof *t);
    t->magic = how;
    nb_tensor *out = NULL;
    pthread_mutex_lock(&g_q.lock);
    if (!g_q.ready) q_init();
    if (g_q.failed || g_q.cap == 0) {
        out = t;
    }
    else {
        if (g_q.n == g_q.cap) { /* full: the oldest leaves for good */
            out = g_q.ring[g_q.head];
            g_q.head = (g_q.head + 1) % g_q.cap;
            g_q.n--;
        }
        g_q.ring[(g_q.head + g_q.n) % g_q.cap] = t;
        g_q.n++;
        q_poison(t);
    }
    pthread_mutex_unlock(&g_q.lock);
    if (out) {
        NB__UNPOISON(out, sizeof *out);
        free(out);
    }
}

/* nb_scope_end sets this while it releases its list, so that a header dying there says so. */
static _Thread_local bool tls_scope_release;
void nb__scope_releasing(bool on) { tls_scope_release = on; }

static nb_tensor *header_new(void) {
    nb_tensor *t = q_take();
    if (!t) t = header_alloc();
    if (!t) {
        nb__error(NB_ENOMEM, "out of memory allocating a tensor header");
        return NULL;
    }
    memset(t, 0, sizeof *t);
    t->magic = NB__TENSOR_LIVE;
    atomic_init(&t->refcount, 1);
    return t;
}

void nb__storage_release(nb__storage *s) {
    if (atomic_fetch_sub(&s->refcount, 1) != 1) return;
    if (s->owned) {
        const nb__backend *be = nb__backend_of(s->device, "free");
        NB__ASSERT(be != NULL); /* the storage was allocated by this backend */
        be->free(s->device, s->data);
    }
    else if (s->release) s->release(s->data, s->release_ctx);
    nb_host_free(s);
}

nb_tensor *nb_tensor_retain(nb_tensor *t) {
    if (!t) return NULL;
    if (!nb__live(t)) {
        nb__dead_handle(t, "tensor_retain", "t");
        return NULL;
    }
    atomic_fetch_add(&t->refcount, 1);
    return t;
}

void nb_tensor_free(nb_tensor *t) {
    if (!t) return;
    if (!nb__live(t)) { /* freed twice, or a scope already released it */
        nb__dead_handle(t, "tensor_free", "t");
        return;
    }
    if (atomic_fetch_sub(&t->refcount, 1) != 1) return;
    uint32_t how = tls_scope_release ? NB__TENSOR_SCOPE_ENDED : NB__TENSOR_FREED;
    if (t->grad) nb_tensor_free(t->grad);
    if (t->grad_fn) nb__node_release(t->grad_fn);
    if (t->ag) nb__ag_meta_free(t->ag);
    if (t->place) nb__place_release(t->place);
    nb__storage_release(t->storage);
    q_release(t, how);
}

nb_tensor *nb__empty(const int64_t *shape, int ndim, nb_dtype dt, nb_device dev) {
    if (!check_shape(shape, ndim, "empty") || !check_dtype(dt, "empty")) return NULL;
    const nb__backend *be = nb__backend_of(dev, "empty");
    if (!be) return NULL;
    size_t nbytes = (size_t)nb__numel_of(shape, ndim) * nb_dtype_size(dt);
    nb__storage *s = nb_host_alloc(sizeof(nb__storage));
    void *data = s && be->has_storage ? be->alloc(dev, nbytes) : NULL;
    nb_tensor *t = data || (s && !be->has_storage) ? header_new() : NULL;
    if (!t) {
        if (data) be->free(dev, data);
        nb_host_free(s);
        return NULL;
    }
    memset(s, 0, sizeof *s);
    atomic_init(&s->refcount, 1);
    s->data = data;
    s->nbytes = nbytes;
    s->device = dev;
    s->owned = true;
    t->storage = s;
    t->ndim = ndim;
    t->dtype = dt;
    if (ndim) memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
    nb__contiguous_strides(shape, ndim, t->strides);
    return nb__scope_add(t);
}

nb_tensor *nb__view_of(const nb_tensor *base, const int64_t *shape, const int64_t *strides,
                       int ndim, int64_t offset) {
    nb_tensor *t = header_new();
    if (!t) return NULL;
    atomic_fetch_add(&base->storage->refcount, 1);
    t->storage = base->storage;
    t->offset = offset;
    t->ndim = ndim;
    t->dtype = base->dtype;
    if (ndim) {
        memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
        memcpy(t->strides, strides, sizeof(int64_t) * (size_t)ndim);
    }
    return nb__scope_add(t);
}

void nb__tensor_assume(nb_tensor *t, const nb_tensor *src) {
    atomic_fetch_add(&src->storage->refcount, 1);
    nb__storage *old = t->storage;
    t->storage = src->storage;
    t->offset = src->offset;
    t->ndim = src->ndim;
    t->dtype = src->dtype;
    memcpy(t->shape, src->shape, sizeof t->shape);
    memcpy(t->strides, src->strides, sizeof t->strides);
    nb__storage_release(old);
    if (t->grad) {
        nb_tensor_free(t->grad);
        t->grad = NULL;
    }
}

/* ---- metadata ---------------------------------------------------------------------------- */
/* The getters answer "no tensor" (-1, NULL, NB_DTYPE_COUNT) for NULL, and for a released
 * handle also set the NB_EFREED error. */
static inline bool meta_ok(const nb_tensor *t, const char *what) {
    return t && (nb__live(t) || nb__dead_handle(t, what, "t"));
}
int nb_ndim(const nb_tensor *t) { return meta_ok(t, "ndim") ? t->ndim : -1; }
const int64_t *nb_shape(const nb_tensor *t) { return meta_ok(t, "shape") ? t->shape : NULL; }
const int64_t *nb_strides(const nb_tensor *t) {
    return meta_ok(t, "strides") ? t->strides : NULL;
}
int64_t nb_numel(const nb_tensor *t) {
    return meta_ok(t, "numel") ? nb__numel_of(t->shape, t->ndim) : -1;
}
int64_t nb_offset(const nb_tensor *t) { return meta_ok(t, "offset") ? t->offset : -1; }
nb_dtype nb_tensor_dtype(const nb_tensor *t) {
    return meta_ok(t, "tensor_dtype") ? t->dtype : NB_DTYPE_COUNT;
}
nb_device nb_tensor_device(const nb_tensor *t) {
    return meta_ok(t, "tensor_device") ? t->storage->device : NB_CPU;
}
void *nb_data(const nb_tensor *t) {
    if (!nb__arg_ok(t, "data", "t") || !nb__require_host(t, "data")) return NULL;
    return nb__ptr(t);
}

void *nb_data_ptr(const nb_tensor *t) {
    if (!nb__arg_ok(t, "data_ptr", "t")) return NULL;
    const nb__backend *be = nb__backend_of(nb__device_of(t), "data_ptr");
    if (!be) return NULL;
    if (!be->has_storage) {
        nb__error(NB_EDEVICE, "data_ptr: a %s tensor has no data", be->name);
        return NULL;
    }
    return nb__ptr(t);
}

nb_status nb_record_stream(nb_tensor *t) {
    if (!nb__arg_ok(t, "record_stream", "t")) return nb_last_status();
    const nb__backend *be = nb__backend_of(nb__device_of(t), "record_stream");
    if (!be) return nb_last_status();
    return be->record_use && be->has_storage ? be->record_use(nb__device_of(t), nb__ptr(t))
                                             : NB_OK;
}

int64_t nb_size(const nb_tensor *t, int dim) {
    if (!nb__arg_ok(t, "size", "t")) return -1;
    int d = nb__wrap_dim(dim, t->ndim, "size");
    if (d < 0) return -1;
    return t->ndim ? t->shape[d] : 1;
}

bool nb_is_contiguous(const nb_tensor *t) {
    if (!meta_ok(t, "is_contiguous")) return false;
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] == 1) continue; /* any stride is fine for size-1 dims */
        if (t->shape[i] == 0) return true;
        if (t->strides[i] != expect) return false;
        expect *= t->shape[i];
    }
    return true;
}

bool nb_shares_storage(const nb_tensor *a, const nb_tensor *b) {
    return meta_ok(a, "shares_storage") && meta_ok(b, "shares_storage") &&
           a->storage == b->storage;
}

/* ---- creation ---------------------------------------------------------------------------- */
nb_tensor *nb_empty_on(nb_device dev, const int64_t *shape, int ndim, nb_dtype dt) {
    return nb__empty(shape, ndim, dt, dev);
}

nb_tensor *nb_full_on(nb_device dev, const int64_t *shape, int ndim, nb_dtype dt,
                      double value) {
    nb_tensor *t = nb__empty(shape, ndim, dt, dev);
    if (t && nb_numel(t) > 0) {
        nb__fill_args a = {.value = value};
        nb__iter_init(&a.it, t->shape, t->ndim, &t, 1);
        if (nb__run_fill(dev, "full", &a) != NB_OK) {
            nb_tensor_free(nb__scope_take(t));
            return NULL;
        }
    }
    return t;
}

nb_tensor *nb_zeros_on(nb_device dev, const int64_t *shape, int ndim, nb_dtype dt) {
    return nb_full_on(dev, shape, ndim, dt, 0.0);
}
nb_tensor *nb_ones_on(nb_device dev, const int64_t *shape, int ndim, nb_dtype dt) {
    return nb_full_on(dev, shape, ndim, dt, 1.0);
}

/* The thread's default device for creation without a device (as torch.set_default_device). */
static _Thread_local nb_device g_default_device; /* zero: the CPU */

nb_device nb_default_device(void) { return g_default_device; }

nb_device nb_set_default_device(nb_device dev) {
    nb_device prev = g_default_device;
    g_default_device = dev;
    return prev;
}

nb_tensor *nb_empty(const int64_t *shape, int ndim, nb_dtype dt) {
    return nb__empty(shape, ndim, dt, g_default_device);
}
nb_tensor *nb_full(const int64_t *shape, int ndim, nb_dtype dt, double value) {
    return nb_full_on(g_default_device, shape, ndim, dt, value);
}
nb_tensor *nb_zeros(const int64_t *shape, int ndim, nb_dtype dt) {
    return nb_full_on(g_default_device, shape, ndim, dt, 0.0);
}
nb_tensor *nb_ones(const int64_t *shape, int ndim, nb_dtype dt) {
    return nb_full_on(g_default_device, shape, ndim, dt, 1.0);
}

nb_tensor *nb_empty_like(const nb_tensor *t) {
    return nb__arg_ok(t, "empty_like", "t") ? nb__empty(t->shape, t->ndim, t->dtype,
                                                        t->storage->device)
                                            : NULL;
}
nb_tensor *nb_zeros_like(const nb_tensor *t) {
    return nb__arg_ok(t, "zeros_like", "t")
               ? nb_full_on(t->storage->device, t->shape, t->ndim, t->dtype, 0.0) : NULL;
}
nb_tensor *nb_ones_like(const nb_tensor *t) {
    return nb__arg_ok(t, "ones_like", "t")
               ? nb_full_on(t->storage->device, t->shape, t->ndim, t->dtype, 1.0) : NULL;
}
nb_tensor *nb_full_like(const nb_tensor *t, double value) {
    return nb__arg_ok(t, "full_like", "t")
               ? nb_full_on(t->storage->device, t->shape, t->ndim, t->dtype, value) : NULL;
}

nb_tensor *nb_scalar(double value, nb_dtype dt) { return nb_full(NULL, 0, dt, value); }

static nb_tensor *arange_host(double start, double end, double step, nb_dtype dt) {
    if (step == 0 || !isfinite(start) || !isfinite(end) || !isfinite(step) ||
        (end - start) / step < 0) {
        nb__error(NB_EINVAL, "arange: cannot step from %g to %g by %g", start, end, step);
        return NULL;
    }
    int64_t n = (int64_t)ceil((end - start) / step);
    nb_tensor *t = nb__empty(&n, 1, dt, NB_CPU);
    if (!t) return NULL;
    size_t es = nb_dtype_size(dt);
    for (int64_t i = 0; i < n; i++) nb__store_f64((char *)nb__ptr(t) + i * es, dt, start + i * step);
    return t;
}

static nb_tensor *linspace_host(double start, double end, int64_t steps, nb_dtype dt) {
    if (steps < 0) {
        nb__error(NB_EINVAL, "linspace: steps must be >= 0, got %lld", (long long)steps);
        return NULL;
    }
    nb_tensor *t = nb__empty(&steps, 1, dt, NB_CPU);
    if (!t) return NULL;
    size_t es = nb_dtype_size(dt);
    double h = steps > 1 ? (end - start) / (double)(steps - 1) : 0;
    /* Fill the second half from the end, as PyTorch does, so the last value is exact. */
    for (int64_t i = 0; i < steps; i++) {
        double v = (steps == 1 || i < steps / 2) ? start + h * (double)i
                                                  : end - h * (double)(steps - 1 - i);
        nb__store_f64((char *)nb__ptr(t) + i * es, dt, v);
    }
    return t;
}

static nb_tensor *from_buffer_host(const void *data, const int64_t *shape, int ndim, nb_dtype dt) {
    if (!data && check_shape(shape, ndim, "from_buffer") && nb__numel_of(shape, ndim) > 0) {
        nb__error(NB_ENULL, "from_buffer: data is NULL");
        return NULL;
    }
    nb_tensor *t = nb__empty(shape, ndim, dt, NB_CPU);
    if (t && t->storage->nbytes) memcpy(t->storage->data, data, t->storage->nbytes);
    return t;
}

/* Built in host memory, then moved to the default device (a no-op for the CPU). */
static nb_tensor *on_default(nb_tensor *t) {
    nb_device dev = g_default_device;
    if (!t || nb_device_equal(dev, NB_CPU)) return t;
    nb_tensor *r = nb_to_device(t, dev);
    nb_tensor_free(nb__scope_take(t));
    return r;
}

nb_tensor *nb_arange(double start, double end, double step, nb_dtype dt) {
    return on_default(arange_host(start, end, step, dt));
}
nb_tensor *nb_linspace(double start, double end, int64_t steps, nb_dtype dt) {
    return on_default(linspace_host(start, end, steps, dt));
}
nb_tensor *nb_from_buffer(const void *data, const int64_t *shape, int ndim, nb_dtype dt) {
    return on_default(from_buffer_host(data, shape, ndim, dt));
}

nb_tensor *nb_wrap_buffer(void *data, const int64_t *shape, int ndim, nb_dtype dt,
                          void (*release)(void *data, void *ctx), void *ctx) {
    if (!check_shape(shape, ndim, "wrap_buffer") || !check_dtype(dt, "wrap_buffer"))
        return NULL;
    if (!data && nb__numel_of(shape, ndim) > 0) {
        nb__error(NB_ENULL, "wrap_buffer: data is NULL");
        return NULL;
    }
    nb__storage *s = nb_host_alloc(sizeof(nb__storage));
    nb_tensor *t = s ? header_new() : NULL;
    if (!t) {
        nb_host_free(s);
        return NULL;
    }
    memset(s, 0, sizeof *s);
    atomic_init(&s->refcount, 1);
    s->data = data;
    s->nbytes = (size_t)nb__numel_of(shape, ndim) * nb_dtype_size(dt);
    s->device = NB_CPU;
    s->release = release;
    s->release_ctx = ctx;
    t->storage = s;
    t->ndim = ndim;
    t->dtype = dt;
    if (ndim) memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
    nb__contiguous_strides(shape, ndim, t->strides);
    return nb__scope_add(t);
}
