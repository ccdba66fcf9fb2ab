/* cuda/dl.h - private to the CUDA plugin (C17): how the plugin opens the optional CUDA
 * libraries, cuDNN and NCCL, at run time instead of linking them, so that a machine without
 * one still loads the plugin and only what needs that library is disabled, with the reason
 * (docs/cuda.md "Which CUDA libraries the plugin uses").
 *
 *     static nb__dl lib;                      // zeroed: not tried yet
 *     if (nb__dl_open(&lib, "libcudnn.so.9", "cudnn", NB_CUDNN_BUILD_LIBDIR)) ...
 *     else fprintf(stderr, "%s\n", lib.why);  // "libcudnn.so.9 not found (looked in ...)"
 *     void *f = nb__dl_sym(&lib, "cudnnCreate");
 *
 * Search order (the first file that loads wins):
 *   1. the soname through the dynamic loader: LD_LIBRARY_PATH, the plugin's RUNPATH (the
 *      folders where the build found the CUDA libraries), ld.so.cache, /lib and /usr/lib;
 *   2. build_libdir, the folder where the build found the library (for a plugin whose
 *      RUNPATH was changed);
 *   3. the CUDA toolkit: $CUDA_HOME/lib64, $CUDA_PATH/lib64, /usr/local/cuda/lib64;
 *   4. NVIDIA's Python wheels, nvidia/<wheel>/lib: first next to the wheel that holds the
 *      CUDA runtime this process loaded (nvidia/cu13/lib), then the site-packages of every
 *      python3 on PATH, $VIRTUAL_ENV, /opt/<any>/.venv, /usr/local, /usr and ~/.local.
 * A file that exists but does not load (a broken copy, a missing dependency) is reported
 * with dlerror's text, after the search goes on past it. The handle is never closed.
 * Not thread-safe by itself: callers open under their own once-only guard. */
#ifndef NABLA_CUDA_DL_H
#define NABLA_CUDA_DL_H

#include <stdbool.h>

typedef struct nb__dl {
    void *handle;    /* NULL until loaded */
    bool tried;      /* nb__dl_open ran */
    char path[512];  /* the file loaded (or the soname when the loader found it) */
    char why[1024];  /* when not loaded: why, naming the places looked in */
} nb__dl;

/* Open soname (e.g. "libcudnn.so.9") by the search order above; wheel is the folder name of
 * NVIDIA's wheel under nvidia/ ("cudnn", "nccl"); build_libdir may be "" (unknown). True
 * when loaded; false with lib->why set. A second call returns the first call's answer. */
bool nb__dl_open(nb__dl *lib, const char *soname, const char *wheel, const char *build_libdir);
/* The symbol name of a loaded library, or NULL. */
void *nb__dl_sym(const nb__dl *lib, const char *name);

#endif
