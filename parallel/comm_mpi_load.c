/* comm_mpi_load.c - the shared libnabla's side of the MPI plugin (parallel/mpi_plugin.h):
 * parallel_impl.h's MPI entry points, forwarding to libnabla-mpi.so, which is opened on
 * the first nb_comm_world() that wants MPI (comm_registry.c). Only in libnabla.so: so a
 * program that never asks for MPI maps no MPI, hwloc or libevent (tests/embed checks it).
 *
 * Where the plugin is looked for, first hit wins (docs/embedding.md "The MPI plugin"):
 *   1. $NB_MPI_PLUGIN, a path to the file (when set and not empty, nothing else is tried);
 *   2. the folder of libnabla.so (dladdr), where the build and `meson install` put it;
 *   3. the install libdir (meson's prefix/libdir).
 * A file that exists but does not load (a missing libmpi, a plugin of another build) stops
 * the search with dlerror's text or the mismatch. The outcome is kept for the process; the
 * plugin is never unloaded (MPI cannot be initialized twice). Nothing here aborts: without
 * the plugin nb_comm_world() is NULL with NB_EUNSUPPORTED and the reason. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nb_config.h"
#include "nb_cuda_paths.h"
#include "parallel/mpi_plugin.h"
#include "tensor/error.h"

/* 0: not tried, 1: loaded, -1: failed (g_reason says why). Written under g_lock. */
static atomic_int g_state;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static const nb__mpi_plugin *g_plugin;
static char g_reason[1024];

static void take_sym(void *h, const char *name, void *fn, size_t size) {
    void *sym = dlsym(h, name); /* h may be RTLD_DEFAULT, which is NULL in glibc */
    memcpy(fn, &sym, size); /* POSIX's way from dlsym's object pointer to a function pointer */
}

/* dlopen path and take the table; g_reason says why not. RTLD_GLOBAL: Open MPI's own
 * components, which it opens later, expect libmpi's symbols to be global. */
static void try_open(const char *path, const char *origin) {
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(g_reason, sizeof g_reason, "MPI support is not installed: %s%s: %s", path,
                 origin, e ? e : "dlopen failed");
        return;
    }
    nb__mpi_plugin_init_fn init = NULL;
    take_sym(h, NB__MPI_PLUGIN_ENTRY, &init, sizeof init);
    const nb__mpi_plugin *p = init ? init() : NULL;
    if (!p) {
        snprintf(g_reason, sizeof g_reason, "%s%s is not a nabla MPI plugin (no %s)", path,
                 origin, NB__MPI_PLUGIN_ENTRY);
        return; /* not dlclose'd: it linked MPI, whose constructors ran */
    }
    if (p->abi != NB__MPI_PLUGIN_ABI || p->size != sizeof *p ||
        strcmp(p->version, NB_VERSION_STRING) || p->comm_size != sizeof(nb_comm) || p->work_size != sizeof(nb_work)) {
        snprintf(g_reason, sizeof g_reason, "%s%s cannot be used: the plugin (nabla %s, abi %u) "
                 "does not match libnabla (nabla %s, abi %d)", path, origin, p->version, p->abi,
                 NB_VERSION_STRING, NB__MPI_PLUGIN_ABI);
        return;
    }
    g_plugin = p;
}

static void load(void) {
    const char *env = getenv(NB__MPI_PLUGIN_ENV);
    if (env && *env) {
        try_open(env, " (from " NB__MPI_PLUGIN_ENV ")");
        return;
    }
    char looked[768] = "", path[1024];
    Dl_info info;
    static const char self = 0; /* an object of this file, for dladdr */
    if (dladdr(&self, &info) && info.dli_fname && strchr(info.dli_fname, '/')) {
        const char *fname = info.dli_fname, *slash = strrchr(fname, '/');
        int dirlen = slash == fname ? 1 : (int)(slash - fname); /* "/" */
        snprintf(path, sizeof path, "%.*s/%s", dirlen, fname, NB__MPI_PLUGIN_NAME);
        if (access(path, F_OK) == 0) {
            try_open(path, "");
            return;
        }
        snprintf(looked, sizeof looked, "%.*s, ", dirlen, fname);
    }
    snprintf(path, sizeof path, "%s/%s", NB_MPI_PLUGIN_LIBDIR, NB__MPI_PLUGIN_NAME);
    if (access(path, F_OK) == 0) {
        try_open(path, "");
        return;
    }
    snprintf(g_reason, sizeof g_reason, "MPI support is not installed: " NB__MPI_PLUGIN_NAME
             " not found (looked in %s%s; set " NB__MPI_PLUGIN_ENV ")", looked,
             NB_MPI_PLUGIN_LIBDIR);
}

/* The table (loading the plugin on the first call), or NULL with g_reason set. */
static const nb__mpi_plugin *plugin(void) {
    int s = atomic_load_explicit(&g_state, memory_order_acquire);
    if (s == 0) {
        pthread_mutex_lock(&g_lock);
        if ((s = atomic_load_explicit(&g_state, memory_order_relaxed)) == 0) {
            load();
            s = g_plugin ? 1 : -1;
            atomic_store_explicit(&g_state, s, memory_order_release);
        }
        pthread_mutex_unlock(&g_lock);
    }
    return s == 1 ? g_plugin : NULL;
}

nb_comm *nb__comm_mpi_world(void) {
    const nb__mpi_plugin *p = plugin();
    if (!p) {
        nb__error(NB_EUNSUPPORTED, "comm_world: %s", g_reason);
        return NULL;
    }
    return p->world();
}

/* Without the plugin loaded, only an MPI the program linked itself can be initialized: ask
 * it (its symbols are global), and load nothing. */
bool nb__comm_mpi_initialized(void) {
    if (atomic_load_explicit(&g_state, memory_order_acquire) == 1)
        return g_plugin->initialized();
    int (*query)(int *) = NULL;
    int inited = 0, fin = 0;
    take_sym(RTLD_DEFAULT, "MPI_Initialized", &query, sizeof query);
    if (query) query(&inited);
    take_sym(RTLD_DEFAULT, "MPI_Finalized", &query, sizeof query);
    if (query) query(&fin);
    return inited || fin;
}

/* 0 and 1 until the world communicator was made, which loads the plugin. */
int nb__comm_mpi_local_rank(int *local_size) {
    if (atomic_load_explicit(&g_state, memory_order_acquire) == 1)
        return g_plugin->local_rank(local_size);
    if (local_size) *local_size = 1;
    return 0;
}
