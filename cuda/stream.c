/* stream.c - CUDA streams: caller-owned ones, the library's per-thread streams, and the
 * per-thread state (current stream per device, cuBLAS handles) with its thread-exit
 * cleanup, and the lifecycle hooks other files register (the allocator's stream
 * observer, cuBLAS's thread-exit hook) so this file calls none of them by name.
 *
 * Library streams are non-blocking (cudaStreamNonBlocking) so they never serialize with
 * CUDA's legacy default stream that other code in the process may use. One per thread and
 * device keeps threads from ordering each other's work by accident. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "cuda/cuda_impl.h"
#include "cuda/k_index.h"
#include "cuda/kernels.h"
#include "tensor/error.h"

static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;
static pthread_key_t g_key;
static bool g_key_ok;
static _Thread_local nb__cuda_thread *t_state;
/* Stream ids are never reused, so the allocator can tell a dead stream from a new one. */
static atomic_uint_least64_t g_next_id = 1;

/* ---- lifecycle hooks (registered at load time, read-only afterwards) ---------------------- */
#define NB__CUDA_MAX_HOOKS 8
static struct {
    nb__cuda_stream_added_fn added[NB__CUDA_MAX_HOOKS];
    nb__cuda_stream_retired_fn retired[NB__CUDA_MAX_HOOKS];
    int nobservers;
    nb__cuda_thread_exit_fn exit[NB__CUDA_MAX_HOOKS];
    int nexit;
} g_hooks;

void nb__cuda_stream_observe(nb__cuda_stream_added_fn added, nb__cuda_stream_retired_fn retired) {
    NB__ASSERT(g_hooks.nobservers < NB__CUDA_MAX_HOOKS);
    g_hooks.added[g_hooks.nobservers] = added;
    g_hooks.retired[g_hooks.nobservers++] = retired;
}

void nb__cuda_on_thread_exit(nb__cuda_thread_exit_fn fn) {
    NB__ASSERT(g_hooks.nexit < NB__CUDA_MAX_HOOKS);
    g_hooks.exit[g_hooks.nexit++] = fn;
}

static void notify_retired(const nb_cuda_stream *s, int n) {
    for (int i = 0; i < n; i++) g_hooks.retired[i](s);
}

/* Every observer accepts s, or none keeps it. */
static bool notify_added(const nb_cuda_stream *s) {
    for (int i = 0; i < g_hooks.nobservers; i++) {
        if (!g_hooks.added[i](s)) {
            notify_retired(s, i);
            return false;
        }
    }
    return true;
}

static void stream_destroy(nb_cuda_stream *s) {
    int prev = -1;
    if (nb__cuda_enter(s->device, &prev, "cuda_stream_free") == NB_OK) {
        (void)cudaStreamSynchronize(s->handle);
        notify_retired(s, g_hooks.nobservers);
        (void)cudaStreamDestroy(s->handle);
        (void)cudaGetLastError();
        nb__cuda_leave(prev);
    } else {
        notify_retired(s, g_hooks.nobservers);
    }
    free(s);
}

/* Thread exit: the hooks first (cuBLAS handles are bound to the streams), then the streams. */
static void thread_exit(void *p) {
    nb__cuda_thread *t = p;
    for (int i = 0; i < g_hooks.nexit; i++) g_hooks.exit[i](t);
    for (int d = 0; d < NB__CUDA_MAX_DEVICES; d++) {
        if (t->library[d]) stream_destroy(t->library[d]);
        for (int r = 0; r < 2; r++)
            if (t->role[r][d]) stream_destroy(t->role[r][d]);
    }
    free(t);
    t_state = NULL;
}

static void make_key(void) { g_key_ok = pthread_key_create(&g_key, thread_exit) == 0; }

nb__cuda_thread *nb__cuda_thread_state(void) {
    if (t_state) return t_state;
    pthread_once(&g_key_once, make_key);
    nb__cuda_thread *t = calloc(1, sizeof *t);
    if (!t) {
        nb__error(NB_ENOMEM, "cuda: out of host memory for the per-thread CUDA state");
        return NULL;
    }
    if (g_key_ok) pthread_setspecific(g_key, t);
    t_state = t;
    return t;
}

static nb_cuda_stream *stream_create(int device, bool owned, const char *what) {
    int prev = -1;
    if (nb__cuda_enter(device, &prev, what) != NB_OK) return NULL;
    cudaStream_t h = NULL;
    cudaError_t e = cudaStreamCreateWithFlags(&h, cudaStreamNonBlocking);
    nb__cuda_leave(prev);
    if (nb__cuda_status(e, what) != NB_OK) return NULL;
    nb_cuda_stream *s = malloc(sizeof *s);
    if (s) {
        s->handle = h;
        s->device = device;
        s->id = atomic_fetch_add(&g_next_id, 1);
        s->owned = owned;
        if (notify_added(s)) return s;
        free(s);
    }
    (void)cudaStreamDestroy(h);
    nb__error(NB_ENOMEM, "%s: out of host memory", what);
    return NULL;
}

static nb_cuda_stream *library_stream(int device, const char *what) {
    nb__cuda_thread *t = nb__cuda_thread_state();
    if (!t) return NULL;
    if (!t->library[device]) t->library[device] = stream_create(device, false, what);
    return t->library[device];
}

nb_cuda_stream *nb_cuda_stream_role(int device, nb_cuda_role role) {
    const char *what = "cuda_stream_role";
    if ((int)role < NB_CUDA_ROLE_COMPUTE || (int)role > NB_CUDA_ROLE_COPY) {
        nb__error(NB_EINVAL, "%s: unknown role %d (NB_CUDA_ROLE_COMPUTE, _COMM or _COPY)",
                  what, (int)role);
        return NULL;
    }
    int d = 0;
    if (nb__cuda_resolve(device, &d, what) != NB_OK) return NULL;
    if (role == NB_CUDA_ROLE_COMPUTE) return library_stream(d, what);
    nb__cuda_thread *t = nb__cuda_thread_state();
    if (!t) return NULL;
    nb_cuda_stream **slot = &t->role[role - 1][d];
    if (!*slot) *slot = stream_create(d, false, what);
    return *slot;
}

nb_status nb_cuda_stream_wait(nb_cuda_stream *waiter, nb_cuda_stream *signaler) {
    const char *what = "cuda_stream_wait";
    if (!(waiter = nb__cuda_stream_or_current(waiter, what))) return nb_last_status();
    if (!(signaler = nb__cuda_stream_or_current(signaler, what))) return nb_last_status();
    if (waiter == signaler) return NB_OK;
    return nb__cuda_join(waiter, signaler, what);
}

nb_status nb__cuda_join(nb_cuda_stream *waiter, nb_cuda_stream *signaler, const char *what) {
    int prev = -1;
    nb_status st = nb__cuda_enter(signaler->device, &prev, what);
    if (st != NB_OK) return st;
    /* The event belongs to the signaler's device; a stream of any device may wait on it.
     * Destroying it at once is allowed: CUDA frees it once the wait is resolved. */
    cudaEvent_t ev = NULL;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(ev, signaler->handle);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(waiter->handle, ev, 0);
    if (ev) (void)cudaEventDestroy(ev);
    nb__cuda_leave(prev);
    return nb__cuda_status(e, what);
}

nb_cuda_stream *nb__cuda_stream_for(int device, const char *what) {
    nb__cuda_thread *t = nb__cuda_thread_state();
    if (!t) return NULL;
    return t->current[device] ? t->current[device] : library_stream(device, what);
}

nb_cuda_stream *nb__cuda_stream_or_current(nb_cuda_stream *s, const char *what) {
    int d = 0;
    if (s) return nb__cuda_resolve(s->device, &d, what) == NB_OK ? s : NULL;
    if (nb__cuda_resolve(-1, &d, what) != NB_OK) return NULL;
    return nb__cuda_stream_for(d, what);
}

nb_cuda_stream *nb_cuda_stream_new(int device) {
    int d = 0;
    if (nb__cuda_resolve(device, &d, "cuda_stream_new") != NB_OK) return NULL;
    return stream_create(d, true, "cuda_stream_new");
}

void nb_cuda_stream_free(nb_cuda_stream *s) {
    if (!s || !s->owned) return;
    if (t_state && t_state->current[s->device] == s) t_state->current[s->device] = NULL;
    stream_destroy(s);
}

nb_status nb_cuda_stream_synchronize(nb_cuda_stream *s) {
    s = nb__cuda_stream_or_current(s, "cuda_stream_synchronize");
    if (!s) return nb_last_status();
    nb_status st = nb__cuda_status(cudaStreamSynchronize(s->handle), "cuda_stream_synchronize");
    if (st == NB_OK) st = nb__cuda_index_error(s->device); /* cuda/k_index.h */
    return st == NB_OK ? nb__cuda_kerr_check(s->device, "cuda_stream_synchronize") : st;
}

nb_cuda_stream *nb_cuda_stream_default(int device) {
    int d = 0;
    if (nb__cuda_resolve(device, &d, "cuda_stream_default") != NB_OK) return NULL;
    return library_stream(d, "cuda_stream_default");
}

nb_cuda_stream *nb_cuda_stream_current(int device) {
    int d = 0;
    if (nb__cuda_resolve(device, &d, "cuda_stream_current") != NB_OK) return NULL;
    return nb__cuda_stream_for(d, "cuda_stream_current");
}

nb_status nb_cuda_set_stream(nb_cuda_stream *s) {
    int d = 0;
    nb_status st = nb__cuda_resolve(s ? s->device : -1, &d, "cuda_set_stream");
    if (st != NB_OK) return st;
    nb__cuda_thread *t = nb__cuda_thread_state();
    if (!t) return nb_last_status();
    /* This thread's own library stream is stored as NULL, meaning "the default". */
    t->current[d] = (s && s != t->library[d]) ? s : NULL;
    return NB_OK;
}

int nb_cuda_stream_device(const nb_cuda_stream *s) { return s ? s->device : -1; }

void *nb_cuda_stream_handle(const nb_cuda_stream *s) { return s ? (void *)s->handle : NULL; }
