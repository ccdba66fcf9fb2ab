/* dl_lib.c - opening a library on first use (tensor/dl_lib.h): the process first, then the
 * path meson found, then the soname; the reason of each failure in the error message. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "tensor/dl_lib.h"
#include "tensor/error.h"

/* Every function from h (RTLD_DEFAULT or a handle); false with the first missing name. A
 * failure may leave some pointers set: nothing reads them until a load succeeded. */
static bool take(nb__dl_lib *l, void *h, const char **missing) {
    for (int i = 0; i < l->n; i++) {
        void *p = dlsym(h, l->names[i]);
        if (!p) {
            *missing = l->names[i];
            return false;
        }
        /* POSIX's way from dlsym's object pointer to a function pointer */
        memcpy((char *)l->table + (size_t)i * sizeof p, &p, sizeof p);
    }
    return true;
}

static bool load(nb__dl_lib *l) {
    const char *missing = NULL;
    if (take(l, RTLD_DEFAULT, &missing)) return true;
    const char *paths[] = {l->path, l->soname};
    char why[2][320] = {"", ""};
    for (int i = 0; i < 2; i++) {
        void *h = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
        if (h && take(l, h, &missing)) return true;
        if (h) {
            snprintf(why[i], sizeof why[i], "%s has no %s", paths[i], missing);
        } else {
            const char *e = dlerror();
            snprintf(why[i], sizeof why[i], "%s", e ? e : "dlopen failed");
        }
    }
    snprintf(l->reason, sizeof l->reason, "%s could not be loaded: %s; %s", l->what, why[0],
             why[1]);
    return false;
}

bool nb__dl_lib_ok(nb__dl_lib *l) {
    int s = atomic_load_explicit(&l->state, memory_order_acquire);
    if (s == 0) {
        pthread_mutex_lock(&l->lock);
        if ((s = atomic_load_explicit(&l->state, memory_order_relaxed)) == 0) {
            s = load(l) ? 1 : -1;
            atomic_store_explicit(&l->state, s, memory_order_release);
        }
        pthread_mutex_unlock(&l->lock);
    }
    return s == 1;
}

bool nb__dl_lib_load(nb__dl_lib *l, const char *op) {
    if (nb__dl_lib_ok(l)) return true;
    nb__error(NB_EUNSUPPORTED, "%s: %s", op, l->reason);
    return false;
}
