/* dnnl_dl.c - oneDNN, opened on the first GEMM or convolution that runs on it (cpu/dnnl_dl.h:
 * nb__dnnl): libnabla.so links no oneDNN, so a program that never runs a oneDNN kernel maps
 * neither libdnnl nor what it links (libOpenCL, libstdc++, libgcc_s) (docs/embedding.md).
 *
 * Where the functions come from, first hit wins (as cpu/blas_dl.c does for OpenBLAS):
 *   1. the process itself, when something it links already has dnnl_sgemm (a program linked
 *      to libnabla.a, which `pkg-config --static` links to oneDNN, or to oneDNN itself);
 *   2. NB_DNNL_PATH, the library meson found (its folder and the header's major version);
 *   3. libdnnl.so.<major> through the loader's usual search.
 * Failure is an error value ("matmul: oneDNN could not be loaded: ..."), kept for the
 * process; the library is never unloaded. */
#define NB__DNNL_DL_IMPL 1
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "nb_config.h"

#if NB_HAVE_DNNL
#include "cpu/dnnl_dl.h"
#include "nb_cuda_paths.h"
#include "tensor/error.h"

nb__dnnl_fns nb__dnnl_table;
static atomic_int g_state; /* 0: not tried, 1: loaded, -1: failed (g_reason) */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_reason[768];

/* Take every function from h (RTLD_DEFAULT or a handle); false (and the missing name in
 * *missing) when one is not there. */
static bool take(void *h, const char **missing) {
    nb__dnnl_fns t;
    void *p;
#define NB__DNNL_TAKE(name)                                                                \
    if (!(p = dlsym(h, #name))) {                                                          \
        *missing = #name;                                                                  \
        return false;                                                                      \
    }                                                                                      \
    memcpy(&t.p_##name, &p, sizeof p); /* POSIX's way to a function pointer */
    NB__DNNL_FUNCTIONS(NB__DNNL_TAKE)
#undef NB__DNNL_TAKE
    nb__dnnl_table = t;
    return true;
}

static bool load(void) {
    const char *missing = NULL;
    if (take(RTLD_DEFAULT, &missing)) return true;
    const char *paths[] = {NB_DNNL_PATH, NB_DNNL_SONAME};
    char why[2][320] = {"", ""};
    for (int i = 0; i < 2; i++) {
        void *h = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
        if (h && take(h, &missing)) return true;
        if (h) {
            snprintf(why[i], sizeof why[i], "%s has no %s", paths[i], missing);
        } else {
            const char *e = dlerror();
            snprintf(why[i], sizeof why[i], "%s", e ? e : "dlopen failed");
        }
    }
    snprintf(g_reason, sizeof g_reason, "oneDNN could not be loaded: %s; %s", why[0], why[1]);
    return false;
}

bool nb__dnnl_ok(void) {
    int s = atomic_load_explicit(&g_state, memory_order_acquire);
    if (s == 0) {
        pthread_mutex_lock(&g_lock);
        if ((s = atomic_load_explicit(&g_state, memory_order_relaxed)) == 0) {
            s = load() ? 1 : -1;
            atomic_store_explicit(&g_state, s, memory_order_release);
        }
        pthread_mutex_unlock(&g_lock);
    }
    return s == 1;
}

bool nb__dnnl(const char *op) {
    if (nb__dnnl_ok()) return true;
    nb__error(NB_EUNSUPPORTED, "%s: %s", op, g_reason);
    return false;
}
#endif
