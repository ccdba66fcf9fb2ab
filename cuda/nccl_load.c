/* nccl_load.c - the NCCL function table of cuda/nccl_dl.h, filled once from the NCCL library
 * found at run time (cuda/dl.c): every function present and NCCL's major version the one
 * the plugin was compiled against, else a refusal with the reason. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define NB__NCCL_DL_NO_NAMES
#include "cuda/dl.h"
#include "cuda/nb_cuda_libs.h" /* NB_NCCL_BUILD_LIBDIR (cuda/meson.build) */
#include "cuda/nccl_dl.h"

#define NB__STR2(x) #x
#define NB__STR(x) NB__STR2(x)

nb__nccl_fns nb__nccl_fn;
static nb__dl g_lib;
static bool g_ok;
static char g_why[1200];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void load(void) {
    if (!nb__dl_open(&g_lib, "libnccl.so." NB__STR(NCCL_MAJOR), "nccl", NB_NCCL_BUILD_LIBDIR)) {
        snprintf(g_why, sizeof g_why, "%s", g_lib.why);
        return;
    }
    nb__nccl_fns f;
    memset(&f, 0, sizeof f);
    void *sym;
#define NB__NCCL_TAKE(name)                                                                \
    if (!(sym = nb__dl_sym(&g_lib, #name))) {                                              \
        snprintf(g_why, sizeof g_why, "%s has no %s: not the NCCL %d the plugin was "      \
                 "built for", g_lib.path, #name, NCCL_MAJOR);                              \
        return;                                                                            \
    }                                                                                      \
    memcpy(&f.name, &sym, sizeof sym);
    NB__NCCL_FNS(NB__NCCL_TAKE)
#undef NB__NCCL_TAKE
    int v = 0;
    if (f.ncclGetVersion(&v) != ncclSuccess || v / 10000 != NCCL_MAJOR) {
        snprintf(g_why, sizeof g_why, "%s reports NCCL version %d, the plugin was built for "
                 "NCCL %d", g_lib.path, v, NCCL_MAJOR);
        return;
    }
    nb__nccl_fn = f;
    g_ok = true;
}

bool nb__nccl_load(void) {
    pthread_once(&g_once, load);
    return g_ok;
}

const char *nb__nccl_why(void) { return nb__nccl_load() ? "" : g_why; }
const char *nb__nccl_path(void) { return nb__nccl_load() ? g_lib.path : ""; }
