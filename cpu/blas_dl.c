/* blas_dl.c - OpenBLAS, opened on the first GEMM that needs it (cpu/blas_dl.h: nb__blas):
 * libnabla links no BLAS, so a program that never runs an OpenBLAS GEMM maps neither
 * OpenBLAS nor what it links (libgfortran, libquadmath) (docs/embedding.md).
 *
 * Where the functions come from, first hit wins:
 *   1. the process itself, when something it links already has cblas_sgemm (a program that
 *      linked a BLAS, as libnabla.so's own NEEDED entry used to give it);
 *   2. NB_OPENBLAS_PATH, the library meson found (Debian: the OpenMP build, which runs on
 *      the libgomp pool nabla's thread count sets);
 *   3. libopenblas.so.0 through the loader's usual search.
 * Failure is an error value ("matmul: OpenBLAS could not be loaded: ..."), kept for the
 * process; the library is never unloaded. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu/blas_dl.h"
#include "nb_cuda_paths.h"
#include "tensor/error.h"

static nb__blas_fns g_fns;
static atomic_int g_state; /* 0: not tried, 1: loaded, -1: failed (g_reason) */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_reason[768];

static void *sym(void *h, const char *name) { return dlsym(h, name); }

/* Take the functions from h (RTLD_DEFAULT or a handle); false when cblas_sgemm is not there. */
static bool take(void *h) {
    void *s = sym(h, "cblas_sgemm"), *d = sym(h, "cblas_dgemm");
    if (!s || !d) return false;
    /* POSIX's way from dlsym's object pointer to a function pointer */
    memcpy(&g_fns.sgemm, &s, sizeof s);
    memcpy(&g_fns.dgemm, &d, sizeof d);
    void *t = sym(h, "openblas_set_num_threads"); /* absent in another BLAS */
    memcpy(&g_fns.set_num_threads, &t, sizeof t);
    return true;
}

static void load(void) {
    if (take(RTLD_DEFAULT)) return;
    const char *paths[] = {NB_OPENBLAS_PATH, "libopenblas.so.0"};
    char why[2][320] = {"", ""};
    for (int i = 0; i < 2; i++) {
        void *h = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
        if (h && take(h)) return;
        const char *e = h ? "no cblas_sgemm in it" : dlerror();
        snprintf(why[i], sizeof why[i], "%s", e ? e : "dlopen failed");
    }
    snprintf(g_reason, sizeof g_reason, "OpenBLAS could not be loaded: %s; %s", why[0], why[1]);
}

const nb__blas_fns *nb__blas(const char *op) {
    int s = atomic_load_explicit(&g_state, memory_order_acquire);
    if (s == 0) {
        pthread_mutex_lock(&g_lock);
        if ((s = atomic_load_explicit(&g_state, memory_order_relaxed)) == 0) {
            load();
            s = g_fns.sgemm ? 1 : -1;
#ifdef _OPENMP
            /* nb_set_num_threads's count, which it could not hand over before the load */
            if (s == 1 && g_fns.set_num_threads) g_fns.set_num_threads(omp_get_max_threads());
#endif
            atomic_store_explicit(&g_state, s, memory_order_release);
        }
        pthread_mutex_unlock(&g_lock);
    }
    if (s == 1) return &g_fns;
    nb__error(NB_EUNSUPPORTED, "%s: %s", op, g_reason);
    return NULL;
}

const nb__blas_fns *nb__blas_loaded(void) {
    return atomic_load_explicit(&g_state, memory_order_acquire) == 1 ? &g_fns : NULL;
}
