/* alloc.c - the caching device allocator (docs/architecture.md rule 4).
 *
 * Requests are rounded up to size classes (512 bytes, then four classes per power of two:
 * at most 25% slack, the same scheme as the host allocator in tensor/alloc.c). A freed
 * block goes to its device's free list for its class and is handed out again for the next
 * request of that class, so a training loop stops calling cudaMalloc after its first steps.
 *
 * Stream safety: a block remembers the stream that was current when it was allocated.
 * Freeing only marks it reusable; kernels already queued on that stream may still touch
 * it. Reusing it for an allocation on the same stream is safe (new work is ordered after
 * the old), so that is the first choice; a block of another stream is taken only when that
 * stream is idle (cudaStreamQuery), or after its stream was synchronized and destroyed
 * (its id is then retagged 0, "free for all"). Block metadata lives on the host (device
 * memory cannot hold our headers); live blocks are found by pointer in a hash table.
 * One mutex guards everything; cudaMalloc runs outside it.
 *
 * record_stream (nb_cuda_record_stream): a block also used on other streams gets, when it
 * is freed, an event recorded on each of them and waits on the device's pending list
 * until all have completed; only then does it join the free list (cuda/policy.c decides,
 * tests/test_cuda_policy.c checks that with a fake runtime). Polls leave no "not ready"
 * behind as the thread's last error (a later kernel launch would report it as its own). */
#include <pthread.h>
#include <stdlib.h>

#include <stdio.h>

#include "cuda/cuda_impl.h"
#include "cuda/policy.h"
#include "tensor/error.h"

#define NB__CUDA_MIN_BLOCK 512
#define NB__CUDA_NCLASS 220
/* Larger requests cannot be rounded without overflow, and no GPU holds them anyway. */
#define NB__CUDA_MAX_REQUEST ((size_t)1 << 60)

typedef struct nb__cuda_block {
    void *ptr;
    size_t size; /* the class size, as passed to cudaMalloc */
    int device;
    int cls;
    uint64_t stream; /* id of the stream it belongs to; 0: free for every stream */
    bool sync_on_free;      /* used on more streams than `uses` holds: wait for the device */
    nb__block_uses *uses;   /* other streams it is used on (record_stream); NULL: none yet */
    struct nb__cuda_block *next; /* free-list, pending-list or hash-chain link */
} nb__cuda_block;

typedef struct nb__live_stream {
    uint64_t id;
    cudaStream_t handle;
    int device;
} nb__live_stream;

static struct {
    pthread_mutex_t lock;
    nb__cuda_block **live; /* hash table of handed-out blocks, chained */
    size_t nbuckets, nlive;
    nb__cuda_block **free_list[NB__CUDA_MAX_DEVICES]; /* [NB__CUDA_NCLASS] each, lazily */
    nb__cuda_block *pending[NB__CUDA_MAX_DEVICES];    /* freed, events not yet completed */
    nb_cuda_alloc_stats st[NB__CUDA_MAX_DEVICES];
    nb__live_stream *streams;
    size_t nstreams, cap_streams;
} g = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int size_class(size_t n, size_t *class_size) {
    if (n <= NB__CUDA_MIN_BLOCK) {
        *class_size = NB__CUDA_MIN_BLOCK;
        return 0;
    }
    int k = 63 - __builtin_clzll((unsigned long long)(n - 1)); /* 2^k < n <= 2^(k+1) */
    size_t base = (size_t)1 << k, step = base / 4;
    size_t j = (n - base + step - 1) / step; /* 1..4 */
    *class_size = base + j * step;
    return 1 + (k - 9) * 4 + (int)(j - 1);
}

/* ---- live-block hash table (lock held) ----------------------------------------------------- */
static size_t bucket_of(const void *p, size_t nbuckets) {
    /* cudaMalloc pointers are 256-byte aligned: drop the zero bits, then mix. */
    uint64_t h = ((uint64_t)(uintptr_t)p >> 8) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & (nbuckets - 1);
}

static void live_grow(void) {
    size_t nb = g.nbuckets ? g.nbuckets * 2 : 1024;
    nb__cuda_block **t = calloc(nb, sizeof *t);
    if (!t) return; /* longer chains, still correct */
    for (size_t i = 0; i < g.nbuckets; i++) {
        for (nb__cuda_block *b = g.live[i], *next; b; b = next) {
            next = b->next;
            size_t h = bucket_of(b->ptr, nb);
            b->next = t[h];
            t[h] = b;
        }
    }
    free(g.live);
    g.live = t;
    g.nbuckets = nb;
}

static bool live_insert(nb__cuda_block *b) {
    if (g.nlive + 1 > g.nbuckets * 2) live_grow();
    if (!g.nbuckets) return false;
    size_t h = bucket_of(b->ptr, g.nbuckets);
    b->next = g.live[h];
    g.live[h] = b;
    g.nlive++;
    return true;
}

static nb__cuda_block *live_find(const void *p) {
    if (!g.nbuckets) return NULL;
    for (nb__cuda_block *b = g.live[bucket_of(p, g.nbuckets)]; b; b = b->next)
        if (b->ptr == p) return b;
    return NULL;
}

static nb__cuda_block *live_remove(const void *p) {
    if (!g.nbuckets) return NULL;
    for (nb__cuda_block **pp = &g.live[bucket_of(p, g.nbuckets)]; *pp; pp = &(*pp)->next) {
        nb__cuda_block *b = *pp;
        if (b->ptr == p) {
            *pp = b->next;
            g.nlive--;
            return b;
        }
    }
    return NULL;
}

/* ---- streams (lock held) ------------------------------------------------------------------- */
static const nb__live_stream *find_stream(uint64_t id) {
    for (size_t i = 0; i < g.nstreams; i++)
        if (g.streams[i].id == id) return &g.streams[i];
    return NULL;
}

static bool stream_added(const nb_cuda_stream *s) {
    pthread_mutex_lock(&g.lock);
    if (g.nstreams == g.cap_streams) {
        size_t cap = g.cap_streams ? g.cap_streams * 2 : 16;
        nb__live_stream *n = realloc(g.streams, cap * sizeof *n);
        if (n) {
            g.streams = n;
            g.cap_streams = cap;
        }
    }
    /* An unknown stream's blocks would count as free for all, so without room to record it
     * the stream must not be used: the caller fails its creation. */
    bool ok = g.nstreams < g.cap_streams;
    if (ok) g.streams[g.nstreams++] = (nb__live_stream){s->id, s->handle, s->device};
    pthread_mutex_unlock(&g.lock);
    return ok;
}

static void stream_retired(const nb_cuda_stream *s) {
    pthread_mutex_lock(&g.lock);
    for (size_t i = 0; i < g.nstreams; i++) {
        if (g.streams[i].id == s->id) {
            g.streams[i] = g.streams[--g.nstreams];
            break;
        }
    }
    /* Its uses of live blocks (record_stream) are over. */
    for (size_t i = 0; i < g.nbuckets; i++)
        for (nb__cuda_block *b = g.live[i]; b; b = b->next)
            if (b->uses) nb__uses_drop_stream(b->uses, s->id);
    /* The stream was synchronized: its cached blocks are idle for good. */
    nb__cuda_block **lists = g.free_list[s->device];
    for (int c = 0; lists && c < NB__CUDA_NCLASS; c++)
        for (nb__cuda_block *b = lists[c]; b; b = b->next)
            if (b->stream == s->id) b->stream = 0;
    for (nb__cuda_block *b = g.pending[s->device]; b; b = b->next)
        if (b->stream == s->id) b->stream = 0;
    pthread_mutex_unlock(&g.lock);
}

/* Add b to its device's free list (the list exists). */
static void push_free(nb__cuda_block *b) {
    nb__cuda_block **lists = g.free_list[b->device];
    b->next = lists[b->cls];
    lists[b->cls] = b;
}

/* Move the pending blocks of device whose events have all completed to the free list. */
static void settle_pending(int device) {
    for (nb__cuda_block **pp = &g.pending[device]; *pp;) {
        nb__cuda_block *b = *pp;
        if (nb__uses_settled(&nb__cuda_rt_real, b->uses)) {
            *pp = b->next;
            push_free(b);
        } else {
            pp = &b->next;
        }
    }
}

/* A cached block of (device, class) usable on stream sid, unlinked; NULL if none. */
static nb__cuda_block *take_cached(int device, int cls, uint64_t sid) {
    nb__cuda_block **lists = g.free_list[device];
    if (!lists) return NULL;
    nb__cuda_block **pp;
    for (pp = &lists[cls]; *pp; pp = &(*pp)->next) {
        if ((*pp)->stream == sid || (*pp)->stream == 0) goto take;
    }
    /* Second choice: a block whose stream has finished all its work. */
    uint64_t busy = 0;
    for (pp = &lists[cls]; *pp; pp = &(*pp)->next) {
        uint64_t id = (*pp)->stream;
        if (id == busy) continue;
        const nb__live_stream *ls = find_stream(id);
        if (!ls || nb__cuda_poll_stream(&nb__cuda_rt_real, ls->handle) == NB__POLL_DONE)
            goto take;
        busy = id;
    }
    return NULL;
take:;
    nb__cuda_block *b = *pp;
    *pp = b->next;
    return b;
}

static void count_live(nb_cuda_alloc_stats *st, int64_t size) {
    st->bytes_live += size;
    if (st->bytes_live > st->bytes_peak) st->bytes_peak = st->bytes_live;
    st->allocs++;
}

static void block_free(nb__cuda_block *b) {
    free(b->uses);
    free(b);
}

/* cudaFree every cached block of device (all devices for -1), pending ones included, after
 * the GPU finished the work that may still use them. Takes and releases the lock itself.
 * Returns the bytes given back on device (on all devices for -1). */
static int64_t release_cached(int device) {
    nb__cuda_block *list = NULL;
    bool has[NB__CUDA_MAX_DEVICES] = {false};
    int64_t released = 0;
    pthread_mutex_lock(&g.lock);
    for (int d = 0; d < NB__CUDA_MAX_DEVICES; d++) {
        if ((device >= 0 && d != device) || !g.free_list[d]) continue;
        for (int c = -1; c < NB__CUDA_NCLASS; c++) {
            nb__cuda_block **head = c < 0 ? &g.pending[d] : &g.free_list[d][c];
            while (*head) {
                nb__cuda_block *b = *head;
                *head = b->next;
                g.st[d].bytes_cached -= (int64_t)b->size;
                g.st[d].system_frees++;
                released += (int64_t)b->size;
                b->next = list;
                list = b;
                has[d] = true;
            }
        }
    }
    pthread_mutex_unlock(&g.lock);
    for (int d = 0; d < NB__CUDA_MAX_DEVICES; d++) {
        if (!has[d]) continue;
        int prev = -1;
        bool entered = nb__cuda_enter(d, &prev, "cuda_empty_cache") == NB_OK;
        if (entered) (void)cudaDeviceSynchronize();
        for (nb__cuda_block *b = list; b; b = b->next) {
            if (b->device != d) continue;
            if (b->uses) nb__uses_clear(&nb__cuda_rt_real, b->uses); /* all completed now */
            (void)cudaFree(b->ptr);
        }
        (void)cudaGetLastError();
        if (entered) nb__cuda_leave(prev);
    }
    while (list) {
        nb__cuda_block *next = list->next;
        block_free(list);
        list = next;
    }
    return released;
}

void *nb_cuda_alloc(size_t nbytes, int device) {
    int d = 0;
    if (nb__cuda_resolve(device, &d, "cuda_alloc") != NB_OK) return NULL;
    if (nbytes > NB__CUDA_MAX_REQUEST) {
        nb__error(NB_ENOMEM, "cuda_alloc: %zu bytes is more than any GPU holds", nbytes);
        return NULL;
    }
    size_t csize = 0;
    int cls = size_class(nbytes, &csize);
    nb_cuda_stream *s = nb__cuda_stream_for(d, "cuda_alloc");
    if (!s) return NULL;

    pthread_mutex_lock(&g.lock);
    if (g.pending[d]) settle_pending(d);
    nb__cuda_block *b = take_cached(d, cls, s->id);
    if (b) {
        b->stream = s->id;
        b->sync_on_free = false;
        if (b->uses) *b->uses = (nb__block_uses){0}; /* settled: no stream, no event left */
        if (live_insert(b)) {
            g.st[d].bytes_cached -= (int64_t)b->size;
            count_live(&g.st[d], (int64_t)b->size);
            pthread_mutex_unlock(&g.lock);
            return b->ptr;
        }
        /* No room to track it: put it back and fail like an out-of-memory. */
        b->next = g.free_list[d][cls];
        g.free_list[d][cls] = b;
        pthread_mutex_unlock(&g.lock);
        nb__error(NB_ENOMEM, "cuda_alloc: out of host memory for the block table");
        return NULL;
    }
    pthread_mutex_unlock(&g.lock);

    b = malloc(sizeof *b);
    if (!b) {
        nb__error(NB_ENOMEM, "cuda_alloc: out of host memory for block metadata");
        return NULL;
    }
    int prev = -1;
    if (nb__cuda_enter(d, &prev, "cuda_alloc") != NB_OK) {
        free(b);
        return NULL;
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, csize);
    nb__oom_info oom = {.device = d, .requested = nbytes, .class_size = csize};
    if (e == cudaErrorMemoryAllocation) {
        /* Cached blocks of other classes may be what is missing: give them back, retry. */
        (void)cudaGetLastError();
        oom.cached_released = release_cached(d);
        e = cudaMalloc(&p, csize);
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            if (cudaMemGetInfo(&oom.gpu_free, &oom.gpu_total) != cudaSuccess)
                oom.gpu_free = oom.gpu_total = 0;
        }
    }
    nb__cuda_leave(prev);
    if (e != cudaSuccess) {
        free(b);
        (void)cudaGetLastError();
        if (e == cudaErrorMemoryAllocation) {
            pthread_mutex_lock(&g.lock);
            oom.stats = g.st[d];
            pthread_mutex_unlock(&g.lock);
            char msg[400];
            nb__cuda_oom_message(msg, sizeof msg, &oom);
            nb__error(NB_ENOMEM, "%s", msg);
            return NULL;
        }
        nb__cuda_status(e, "cuda_alloc");
        return NULL;
    }
    *b = (nb__cuda_block){.ptr = p, .size = csize, .device = d, .cls = cls, .stream = s->id};
    pthread_mutex_lock(&g.lock);
    if (!live_insert(b)) {
        pthread_mutex_unlock(&g.lock);
        (void)cudaFree(p);
        free(b);
        nb__error(NB_ENOMEM, "cuda_alloc: out of host memory for the block table");
        return NULL;
    }
    g.st[d].system_allocs++;
    count_live(&g.st[d], (int64_t)csize);
    pthread_mutex_unlock(&g.lock);
    return p;
}

nb_status nb_cuda_free(void *p) {
    if (!p) return NB_OK;
    pthread_mutex_lock(&g.lock);
    nb__cuda_block *b = live_remove(p);
    if (!b) {
        pthread_mutex_unlock(&g.lock);
        return nb__error(NB_EINVAL,
                         "cuda_free: %p is not a live block from nb_cuda_alloc (freed twice, "
                         "or memory from elsewhere)",
                         p);
    }
    int d = b->device;
    g.st[d].bytes_live -= (int64_t)b->size;
    pthread_mutex_unlock(&g.lock);

    /* Out of the table, the block is this thread's alone: record the events of its other
     * streams (record_stream), or wait for the device when that is not possible. */
    bool wait = b->sync_on_free, pending = false;
    b->sync_on_free = false;
    int prev = -1;
    if (!wait && b->uses && b->uses->n > 0) {
        if (nb__cuda_enter(d, &prev, "cuda_free") == NB_OK) {
            pending = nb__uses_record(&nb__cuda_rt_real, b->uses);
            nb__cuda_leave(prev);
        }
        wait = !pending;
    }
    if (wait && nb__cuda_enter(d, &prev, "cuda_free") == NB_OK) {
        (void)cudaDeviceSynchronize();
        (void)cudaGetLastError();
        nb__cuda_leave(prev);
        if (b->uses) b->uses->n = 0;
    }

    pthread_mutex_lock(&g.lock);
    if (!g.free_list[d]) g.free_list[d] = calloc(NB__CUDA_NCLASS, sizeof(nb__cuda_block *));
    if (!g.free_list[d]) {
        /* Cannot cache without a list: give the block straight back to CUDA. */
        g.st[d].system_frees++;
        pthread_mutex_unlock(&g.lock);
        if (nb__cuda_enter(d, &prev, "cuda_free") == NB_OK) {
            (void)cudaDeviceSynchronize();
            if (b->uses) nb__uses_clear(&nb__cuda_rt_real, b->uses);
            (void)cudaFree(b->ptr);
            (void)cudaGetLastError();
            nb__cuda_leave(prev);
        }
        block_free(b);
        return NB_OK;
    }
    /* A block of a stream that is gone (destroyed after synchronizing) is free for all. */
    if (b->stream && !find_stream(b->stream)) b->stream = 0;
    if (pending) {
        b->next = g.pending[d];
        g.pending[d] = b;
    } else {
        push_free(b);
    }
    g.st[d].bytes_cached += (int64_t)b->size;
    pthread_mutex_unlock(&g.lock);
    return NB_OK;
}

nb_status nb_cuda_record_stream(void *p, nb_cuda_stream *s) {
    const char *what = "cuda_record_stream";
    if (!p) return nb__error(NB_ENULL, "%s: argument 'p' is NULL", what);
    if (!(s = nb__cuda_stream_or_current(s, what))) return nb_last_status();
    pthread_mutex_lock(&g.lock);
    nb__cuda_block *b = live_find(p);
    if (!b) {
        pthread_mutex_unlock(&g.lock);
        return nb__error(NB_EINVAL,
                         "%s: %p is not a live block from nb_cuda_alloc (pass the pointer "
                         "nb_cuda_alloc returned, before nb_cuda_free)",
                         what, p);
    }
    if (b->device != s->device) {
        int bd = b->device;
        pthread_mutex_unlock(&g.lock);
        return nb__error(NB_EINVAL, "%s: the block is on GPU %d but the stream on GPU %d",
                         what, bd, s->device);
    }
    if (!b->uses) b->uses = calloc(1, sizeof *b->uses);
    /* No room to note the stream: the free waits for the whole device instead. */
    if (!b->uses || !nb__uses_add(b->uses, b->stream, s->id, s->handle)) b->sync_on_free = true;
    pthread_mutex_unlock(&g.lock);
    return NB_OK;
}

nb_status nb_cuda_alloc_get_stats(int device, nb_cuda_alloc_stats *out) {
    if (!out) return nb__error(NB_ENULL, "cuda_alloc_get_stats: argument 'out' is NULL");
    *out = (nb_cuda_alloc_stats){0};
    int d = 0;
    nb_status s = nb__cuda_resolve(device, &d, "cuda_alloc_get_stats");
    if (s != NB_OK) return s;
    pthread_mutex_lock(&g.lock);
    *out = g.st[d];
    pthread_mutex_unlock(&g.lock);
    return NB_OK;
}

nb_status nb_cuda_alloc_reset_peak(int device) {
    int d = 0;
    nb_status s = nb__cuda_resolve(device, &d, "cuda_alloc_reset_peak");
    if (s != NB_OK) return s;
    pthread_mutex_lock(&g.lock);
    g.st[d].bytes_peak = g.st[d].bytes_live;
    pthread_mutex_unlock(&g.lock);
    return NB_OK;
}

nb_status nb_cuda_empty_cache(void) {
    release_cached(-1);
    return NB_OK;
}

/* Registered at load time, before any stream can exist (stream.c calls no allocator
 * function by name). */
__attribute__((constructor)) static void alloc_register(void) {
    nb__cuda_stream_observe(stream_added, stream_retired);
}
