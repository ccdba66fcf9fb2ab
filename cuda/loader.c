/* loader.c - libnabla's side of the CUDA plugin (cuda/plugin.h): the nabla/cuda.h API, the
 * registry's nb__cuda_backend / nb__cuda_kernels and the private launchers, each forwarding
 * through the table libnabla-cuda.so hands over on first use. libnabla itself links no
 * CUDA library; a CPU-only program never loads the plugin, so it maps neither cudart nor
 * cuBLAS (tools/check-cuda-plugin checks both).
 *
 * Where the plugin is looked for, first hit wins (docs/cuda.md "The plugin"):
 *   1. $NB_CUDA_PLUGIN, a path to the file (when set and not empty, nothing else is tried);
 *   2. the folder of the object holding this code (dladdr): libnabla.so's folder, or the
 *      program's for a static link;
 *   3. the install libdir (meson's prefix/libdir).
 * A file that exists but does not load (a missing libcudart, a plugin of another build)
 * stops the search with dlerror's text or the ABI mismatch, so the reason is never hidden
 * behind "not found". The outcome, success or failure, is kept for the process: the plugin
 * is never unloaded (CUDA does not survive being unmapped). Nothing here aborts. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda/backend.h"
#include "cuda/plugin.h"
#include "nb_config.h"
#include "nb_cuda_paths.h"
#include "tensor/backend.h"
#include "tensor/error.h"

/* 0: not tried, 1: loaded, -1: failed (g_reason says why). Written under g_lock. */
static atomic_int g_state;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static const nb__cuda_plugin *g_plugin;
static char g_path[1024];
static char g_reason[1024];

static nb_status host_set_error(nb_status s, const char *msg) { return nb__error(s, "%s", msg); }
static void host_assert_fail(const char *file, int line, const char *cond) {
    nb__assert_fail(file, line, cond);
}

static const nb__cuda_host g_host = {
    .abi = NB__CUDA_PLUGIN_ABI,
    .size = sizeof(nb__cuda_host),
    .version = NB_VERSION_STRING,
    .kernels_size = sizeof(nb__kernels),
    .set_error = host_set_error,
    .last_error = nb_last_error,
    .last_status = nb_last_status,
    .assert_fail = host_assert_fail,
};

/* Append dir to the "looked in" list (left out when it does not fit: it is a message). */
static void add_looked(char *list, size_t len, const char *dir) {
    size_t n = strlen(list), sep = n ? 2 : 0, d = strlen(dir);
    if (n + sep + d + 1 > len) return;
    memcpy(list + n, ", ", sep);
    memcpy(list + n + sep, dir, d + 1);
}

/* dlopen path and take the table. False with g_reason set when the file does not load. */
static bool try_open(const char *path, const char *origin) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(g_reason, sizeof g_reason, "CUDA support is not installed: %s%s: %s", path,
                 origin, e ? e : "dlopen failed");
        return false;
    }
    nb__cuda_plugin_init_fn init = NULL;
    void *sym = dlsym(h, NB__CUDA_PLUGIN_ENTRY);
    /* POSIX's way to turn the object pointer dlsym returns into a function pointer. */
    memcpy(&init, &sym, sizeof init);
    if (!init) {
        snprintf(g_reason, sizeof g_reason, "%s%s is not a nabla CUDA plugin (no %s)", path,
                 origin, NB__CUDA_PLUGIN_ENTRY);
        dlclose(h);
        return false;
    }
    const nb__cuda_plugin *p = NULL;
    char msg[512] = "";
    nb_status st = init(&g_host, &p, msg, sizeof msg);
    if (st == NB_OK && p &&
        (p->abi != NB__CUDA_PLUGIN_ABI || p->size != sizeof *p ||
         p->kernels_size != sizeof(nb__kernels) || strcmp(p->version, NB_VERSION_STRING))) {
        snprintf(msg, sizeof msg, "the plugin (nabla %s, abi %u) does not match libnabla "
                 "(nabla %s, abi %d)", p->version, p->abi, NB_VERSION_STRING,
                 NB__CUDA_PLUGIN_ABI);
        st = NB_EUNSUPPORTED;
    }
    if (st != NB_OK || !p) {
        /* Not dlclose'd: its constructors ran, and it links the CUDA runtime. */
        snprintf(g_reason, sizeof g_reason, "%s%s cannot be used: %s", path, origin,
                 msg[0] ? msg : "its init failed");
        return false;
    }
    snprintf(g_path, sizeof g_path, "%s", path);
    g_plugin = p;
    return true;
}

static bool exists(const char *path) { return access(path, F_OK) == 0; }

static void load(void) {
    const char *env = getenv(NB__CUDA_PLUGIN_ENV);
    if (env && *env) {
        (void)try_open(env, " (from " NB__CUDA_PLUGIN_ENV ")");
        return;
    }
    if (!NB_HAVE_CUDA) {
        snprintf(g_reason, sizeof g_reason,
                 "nabla was built without CUDA (reconfigure with meson -Dcuda=enabled on a "
                 "machine with the CUDA toolkit, or set " NB__CUDA_PLUGIN_ENV
                 " to a libnabla-cuda.so of the same nabla version)");
        return;
    }
    char looked[768] = "", path[1024];
    Dl_info info;
    static const char self = 0; /* an object of this file, for dladdr */
    char exe[1024];
    if (dladdr(&self, &info) && info.dli_fname && info.dli_fname[0]) {
        const char *fname = info.dli_fname;
        if (!strchr(fname, '/')) {
            /* A static link: glibc names the program as argv[0], maybe found through PATH. */
            ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
            if (n > 0) {
                exe[n] = '\0';
                fname = exe;
            }
        }
        const char *slash = strrchr(fname, '/');
        int dirlen = slash ? (int)(slash - fname) : 1;
        const char *dir = slash ? fname : ".";
        if (dirlen == 0) dirlen = 1; /* "/" */
        snprintf(path, sizeof path, "%.*s/%s", dirlen, dir, NB__CUDA_PLUGIN_NAME);
        if (exists(path)) {
            (void)try_open(path, "");
            return;
        }
        char d[1024];
        snprintf(d, sizeof d, "%.*s", dirlen, dir);
        add_looked(looked, sizeof looked, d);
    }
    snprintf(path, sizeof path, "%s/%s", NB_CUDA_PLUGIN_LIBDIR, NB__CUDA_PLUGIN_NAME);
    if (exists(path)) {
        (void)try_open(path, "");
        return;
    }
    add_looked(looked, sizeof looked, NB_CUDA_PLUGIN_LIBDIR);
    snprintf(g_reason, sizeof g_reason,
             "CUDA support is not installed: " NB__CUDA_PLUGIN_NAME " not found (looked in %s; "
             "set " NB__CUDA_PLUGIN_ENV ")",
             looked);
}

/* The table, or NULL without touching the thread's error. */
static const nb__cuda_plugin *quiet(void) {
    int s = atomic_load_explicit(&g_state, memory_order_acquire);
    if (s == 0) {
        pthread_mutex_lock(&g_lock);
        if ((s = atomic_load_explicit(&g_state, memory_order_relaxed)) == 0) {
            g_reason[0] = '\0';
            load();
            s = g_plugin ? 1 : -1;
            atomic_store_explicit(&g_state, s, memory_order_release);
        }
        pthread_mutex_unlock(&g_lock);
    }
    return s == 1 ? g_plugin : NULL;
}

const nb__cuda_plugin *nb__cuda_plugin_get(const char *what) {
    const nb__cuda_plugin *p = quiet();
    if (!p) nb__error(NB_EUNSUPPORTED, "%s: %s", what, g_reason);
    return p;
}

const char *nb__cuda_plugin_path(void) { return quiet() ? g_path : ""; }

bool nb__cuda_plugin_forget_failure(void) {
    pthread_mutex_lock(&g_lock);
    bool ok = atomic_load(&g_state) != 1;
    if (ok) atomic_store(&g_state, 0);
    pthread_mutex_unlock(&g_lock);
    return ok;
}

/* Forwarding: P(what) is the table or returns the error value given. */
#define P(what, fail)                                                                      \
    const nb__cuda_plugin *p = nb__cuda_plugin_get(what);                                  \
    if (!p) return fail

/* ---- devices ----------------------------------------------------------------------------- */
int nb_cuda_device_count(void) {
    const nb__cuda_plugin *p = quiet(); /* never an error */
    return p ? p->device_count() : 0;
}
bool nb_cuda_is_available(void) { return nb_cuda_device_count() > 0; }
nb_status nb_cuda_set_device(int device) {
    P("cuda_set_device", nb_last_status());
    return p->set_device(device);
}
int nb_cuda_current_device(void) {
    P("cuda_current_device", -1);
    return p->current_device();
}
nb_status nb_cuda_device_name(int device, char *buf, size_t len) {
    if (buf && len > 0) buf[0] = '\0';
    P("cuda_device_name", nb_last_status());
    return p->device_name(device, buf, len);
}
const char *nb_cuda_libraries(void) {
    P("cuda_libraries", NULL);
    return p->libraries;
}
nb_status nb_cuda_synchronize(void) {
    P("cuda_synchronize", nb_last_status());
    return p->synchronize();
}

/* ---- streams (a non-NULL stream came from the plugin, so it is loaded) -------------------- */
nb_cuda_stream *nb_cuda_stream_new(int device) {
    P("cuda_stream_new", NULL);
    return p->stream_new(device);
}
void nb_cuda_stream_free(nb_cuda_stream *s) {
    if (s && quiet()) g_plugin->stream_free(s);
}
nb_status nb_cuda_stream_synchronize(nb_cuda_stream *s) {
    P("cuda_stream_synchronize", nb_last_status());
    return p->stream_synchronize(s);
}
nb_cuda_stream *nb_cuda_stream_default(int device) {
    P("cuda_stream_default", NULL);
    return p->stream_default(device);
}
nb_cuda_stream *nb_cuda_stream_current(int device) {
    P("cuda_stream_current", NULL);
    return p->stream_current(device);
}
nb_status nb_cuda_set_stream(nb_cuda_stream *s) {
    P("cuda_set_stream", nb_last_status());
    return p->set_stream(s);
}
int nb_cuda_stream_device(const nb_cuda_stream *s) {
    return s && quiet() ? g_plugin->stream_device(s) : -1;
}
void *nb_cuda_stream_handle(const nb_cuda_stream *s) {
    return s && quiet() ? g_plugin->stream_handle(s) : NULL;
}
nb_status nb_cuda_stream_wait(nb_cuda_stream *waiter, nb_cuda_stream *signaler) {
    P("cuda_stream_wait", nb_last_status());
    return p->stream_wait(waiter, signaler);
}
nb_cuda_stream *nb_cuda_stream_role(int device, nb_cuda_role role) {
    P("cuda_stream_role", NULL);
    return p->stream_role(device, role);
}

/* ---- allocator ---------------------------------------------------------------------------- */
void *nb_cuda_alloc(size_t nbytes, int device) {
    P("cuda_alloc", NULL);
    return p->alloc(nbytes, device);
}
nb_status nb_cuda_free(void *ptr) {
    if (!ptr) return NB_OK;
    P("cuda_free", nb_last_status());
    return p->free(ptr);
}
nb_status nb_cuda_record_stream(void *ptr, nb_cuda_stream *s) {
    P("cuda_record_stream", nb_last_status());
    return p->record_stream(ptr, s);
}
nb_status nb_cuda_alloc_get_stats(int device, nb_cuda_alloc_stats *out) {
    if (out) *out = (nb_cuda_alloc_stats){0};
    P("cuda_alloc_get_stats", nb_last_status());
    return p->alloc_get_stats(device, out);
}
nb_status nb_cuda_alloc_reset_peak(int device) {
    P("cuda_alloc_reset_peak", nb_last_status());
    return p->alloc_reset_peak(device);
}
nb_status nb_cuda_empty_cache(void) {
    /* Nothing can be cached before the plugin is loaded: do not load it for this. */
    return atomic_load(&g_state) == 1 ? g_plugin->empty_cache() : NB_OK;
}

/* ---- copies ------------------------------------------------------------------------------- */
nb_status nb_cuda_memcpy_h2d(void *dst, const void *src, size_t nbytes) {
    P("cuda_memcpy_h2d", nb_last_status());
    return p->memcpy_h2d(dst, src, nbytes);
}
nb_status nb_cuda_memcpy_d2h(void *dst, const void *src, size_t nbytes) {
    P("cuda_memcpy_d2h", nb_last_status());
    return p->memcpy_d2h(dst, src, nbytes);
}
nb_status nb_cuda_memcpy_d2d(void *dst, const void *src, size_t nbytes) {
    P("cuda_memcpy_d2d", nb_last_status());
    return p->memcpy_d2d(dst, src, nbytes);
}
nb_status nb_cuda_memcpy_h2d_async(void *dst, const void *src, size_t nbytes,
                                   nb_cuda_stream *s) {
    P("cuda_memcpy_h2d_async", nb_last_status());
    return p->memcpy_h2d_async(dst, src, nbytes, s);
}
nb_status nb_cuda_memcpy_d2h_async(void *dst, const void *src, size_t nbytes,
                                   nb_cuda_stream *s) {
    P("cuda_memcpy_d2h_async", nb_last_status());
    return p->memcpy_d2h_async(dst, src, nbytes, s);
}
nb_status nb_cuda_memcpy_d2d_async(void *dst, const void *src, size_t nbytes,
                                   nb_cuda_stream *s) {
    P("cuda_memcpy_d2d_async", nb_last_status());
    return p->memcpy_d2d_async(dst, src, nbytes, s);
}

/* ---- the registry (cuda/backend.h) -------------------------------------------------------- */
const nb__backend *nb__cuda_backend(nb_device dev, const char *op) {
    const nb__cuda_plugin *p = quiet();
    if (!p) {
        nb__error(NB_EUNSUPPORTED, "%s: cuda:%d: %s", op, dev.index, g_reason);
        return NULL;
    }
    return p->backend(dev, op);
}

const nb__kernels *nb__cuda_kernels(void) {
    const nb__cuda_plugin *p = quiet();
    return p ? p->kernels() : NULL;
}

/* ---- private launchers (cuda/plugin.h) ---------------------------------------------------- */
nb_status nb__cuda_fill_f32(float *dst, float value, int64_t n, nb_cuda_stream *s) {
    P("cuda fill_f32", nb_last_status());
    return p->fill_f32(dst, value, n, s);
}
nb_status nb__cuda_add_f32(float *out, const float *a, const float *b, int64_t n,
                           nb_cuda_stream *s) {
    P("cuda add_f32", nb_last_status());
    return p->add_f32(out, a, b, n, s);
}
nb_status nb__cuda_gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                            float alpha, const float *a, int64_t lda, const float *b,
                            int64_t ldb, float beta, float *c, int64_t ldc,
                            nb_cuda_stream *s) {
    P("cuda gemm_f32", nb_last_status());
    return p->gemm_f32(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, s);
}
long nb__cuda_cudnn_version(void) {
    P("cuda_cudnn_version", -1);
    return p->cudnn_version();
}
long nb__cuda_nccl_version(void) {
    P("cuda_nccl_version", -1);
    return p->nccl_version();
}
