/* cudnn_load.c - the cuDNN function table of cuda/cudnn_dl.h, filled once from the cuDNN
 * library found at run time (cuda/dl.c), with the checks that make a wrong copy a clear
 * refusal instead of a crash: every function present, cuDNN's major version the one the
 * plugin was compiled against, and its CUDA runtime's major version the plugin's. Also
 * linked into tests/cuda_host (the descriptor checks call cuDNN without a GPU). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define NB__CUDNN_DL_NO_NAMES
#include "cuda/cudnn_dl.h"
#include "cuda/dl.h"
#include "cuda/nb_cuda_libs.h" /* NB_CUDNN_BUILD_LIBDIR (cuda/meson.build) */

#define NB__STR2(x) #x
#define NB__STR(x) NB__STR2(x)

nb__cudnn_fns nb__cudnn_fn;
static nb__dl g_lib;
static bool g_ok;
static char g_why[1200];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void load(void) {
    const char *soname = "libcudnn.so." NB__STR(CUDNN_MAJOR);
    if (!nb__dl_open(&g_lib, soname, "cudnn", NB_CUDNN_BUILD_LIBDIR)) {
        snprintf(g_why, sizeof g_why, "%s", g_lib.why);
        return;
    }
    nb__cudnn_fns f;
    memset(&f, 0, sizeof f);
    void *sym;
#define NB__CUDNN_TAKE(name)                                                               \
    if (!(sym = nb__dl_sym(&g_lib, #name))) {                                              \
        snprintf(g_why, sizeof g_why, "%s has no %s: not the cuDNN %d the plugin was "     \
                 "built for", g_lib.path, #name, CUDNN_MAJOR);                             \
        return;                                                                            \
    }                                                                                      \
    memcpy(&f.name, &sym, sizeof sym);
    NB__CUDNN_FNS(NB__CUDNN_TAKE)
#undef NB__CUDNN_TAKE
    size_t v = f.cudnnGetVersion(), rt = f.cudnnGetCudartVersion();
    if (v / 10000 != CUDNN_MAJOR) {
        snprintf(g_why, sizeof g_why, "%s is cuDNN %zu.%zu, the plugin was built for cuDNN %d",
                 g_lib.path, v / 10000, v / 100 % 100, CUDNN_MAJOR);
        return;
    }
    if (rt / 1000 != CUDART_VERSION / 1000) {
        snprintf(g_why, sizeof g_why, "%s (cuDNN %zu.%zu) was built for CUDA %zu, the plugin "
                 "uses CUDA %d", g_lib.path, v / 10000, v / 100 % 100, rt / 1000,
                 CUDART_VERSION / 1000);
        return;
    }
    nb__cudnn_fn = f;
    g_ok = true;
}

bool nb__cudnn_load(void) {
    pthread_once(&g_once, load);
    return g_ok;
}

const char *nb__cudnn_why(void) { return nb__cudnn_load() ? "" : g_why; }
const char *nb__cudnn_path(void) { return nb__cudnn_load() ? g_lib.path : ""; }
