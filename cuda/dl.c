/* dl.c - the CUDA plugin's run-time search for its optional libraries, cuDNN and NCCL
 * (cuda/dl.h has the search order). The plugin links only the CUDA runtime and cuBLAS; a
 * missing cuDNN or NCCL must not stop it from loading, so those two are opened here on
 * first use, wherever the machine has them: next to the toolkit, in the system's folders,
 * or in NVIDIA's Python wheels (site-packages/nvidia/<name>/lib), which is where a machine
 * set up for PyTorch keeps them. */
#include <dlfcn.h>
#include <glob.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cuda/dl.h"

/* The places looked in, for the message (a short list; what does not fit is dropped). */
typedef struct looked {
    char text[640];
} looked;

static void note(looked *l, const char *where) {
    size_t n = strlen(l->text), w = strlen(where);
    for (const char *p = strstr(l->text, where); p; p = strstr(p + 1, where))
        if ((p == l->text || p[-1] == ' ') && (p[w] == ',' || p[w] == '\0')) return; /* listed */
    if (n + w + 3 >= sizeof l->text) return;
    if (n) memcpy(l->text + n, ", ", 2), n += 2;
    memcpy(l->text + n, where, w + 1);
}

/* Try dir/soname. True when loaded. A file that exists but fails keeps dlerror's text. */
static bool try_dir(nb__dl *lib, const char *dir, const char *soname, looked *l,
                    char *err, size_t errlen) {
    if (!dir || !*dir) return false;
    char path[sizeof lib->path];
    int n = snprintf(path, sizeof path, "%s/%s", dir, soname);
    if (n < 0 || (size_t)n >= sizeof path) return false;
    if (access(path, F_OK) != 0) {
        note(l, dir);
        return false;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        if (!err[0]) snprintf(err, errlen, "%s", e ? e : "dlopen failed");
        note(l, dir);
        return false;
    }
    lib->handle = h;
    snprintf(lib->path, sizeof lib->path, "%s", path);
    return true;
}

/* Every folder a glob pattern names. */
static bool try_glob(nb__dl *lib, const char *pattern, const char *soname, looked *l,
                     char *err, size_t errlen) {
    glob_t g;
    if (glob(pattern, GLOB_ONLYDIR, NULL, &g) != 0) return false;
    bool ok = false;
    for (size_t i = 0; i < g.gl_pathc && !ok; i++)
        ok = try_dir(lib, g.gl_pathv[i], soname, l, err, errlen);
    globfree(&g);
    return ok;
}

/* nvidia/<wheel>/lib next to the wheel of the CUDA runtime this process loaded: with
 * NVIDIA's CUDA 13 wheels that runtime is .../site-packages/nvidia/cu13/lib/libcudart.so.13
 * and cuDNN .../site-packages/nvidia/cudnn/lib. */
static bool try_next_to_cudart(nb__dl *lib, const char *wheel, const char *soname, looked *l,
                               char *err, size_t errlen) {
    Dl_info info;
    void *sym = NULL;
    cudaError_t (*fn)(int *) = cudaRuntimeGetVersion;
    memcpy(&sym, &fn, sizeof sym);
    if (!dladdr(sym, &info) || !info.dli_fname) return false;
    const char *at = strstr(info.dli_fname, "/nvidia/");
    if (!at) return false;
    char dir[sizeof lib->path];
    int n = snprintf(dir, sizeof dir, "%.*s/nvidia/%s/lib", (int)(at - info.dli_fname),
                     info.dli_fname, wheel);
    return n > 0 && (size_t)n < sizeof dir && try_dir(lib, dir, soname, l, err, errlen);
}

/* site-packages/nvidia/<wheel>/lib under the Python installations this machine may have. */
static bool try_wheels(nb__dl *lib, const char *wheel, const char *soname, looked *l,
                       char *err, size_t errlen) {
    char pat[1024];
    /* every python3 on PATH: <bin>/../lib/python3.N/site-packages */
    const char *path = getenv("PATH");
    for (const char *p = path; p && *p;) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char py[600];
        if (len > 0 && len < 500) {
            snprintf(py, sizeof py, "%.*s/python3", (int)len, p);
            if (access(py, X_OK) == 0) {
                snprintf(pat, sizeof pat, "%.*s/../lib/python3*/site-packages/nvidia/%s/lib",
                         (int)len, p, wheel);
                if (try_glob(lib, pat, soname, l, err, errlen)) return true;
            }
        }
        p = end ? end + 1 : NULL;
    }
    const char *venv = getenv("VIRTUAL_ENV"), *home = getenv("HOME");
    if (venv && *venv) {
        snprintf(pat, sizeof pat, "%s/lib/python3*/site-packages/nvidia/%s/lib", venv, wheel);
        if (try_glob(lib, pat, soname, l, err, errlen)) return true;
    }
    static const char *const roots[] = {
        "/opt/*/.venv/lib/python3*/site-packages", "/opt/*/lib/python3*/site-packages",
        "/usr/local/lib/python3*/dist-packages",   "/usr/local/lib/python3*/site-packages",
        "/usr/lib/python3/dist-packages",
    };
    for (size_t i = 0; i < sizeof roots / sizeof roots[0]; i++) {
        snprintf(pat, sizeof pat, "%s/nvidia/%s/lib", roots[i], wheel);
        if (try_glob(lib, pat, soname, l, err, errlen)) return true;
    }
    if (home && *home) {
        snprintf(pat, sizeof pat, "%s/.local/lib/python3*/site-packages/nvidia/%s/lib", home,
                 wheel);
        if (try_glob(lib, pat, soname, l, err, errlen)) return true;
    }
    note(l, "NVIDIA's Python wheels (site-packages/nvidia/");
    size_t n = strlen(l->text);
    snprintf(l->text + n, sizeof l->text - n, "%s/lib)", wheel);
    return false;
}

bool nb__dl_open(nb__dl *lib, const char *soname, const char *wheel, const char *build_libdir) {
    if (lib->tried) return lib->handle != NULL;
    lib->tried = true;
    lib->why[0] = '\0';
    looked l = {{0}};
    char err[512] = "";
    /* 1. the loader's own search (the plugin's RUNPATH included: dlopen called from here
     *    searches the calling object's RUNPATH) */
    void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (h) {
        lib->handle = h;
        snprintf(lib->path, sizeof lib->path, "%s", soname);
        /* the file it came from, for the messages */
        struct link_map *lm = NULL;
        if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0])
            snprintf(lib->path, sizeof lib->path, "%s", lm->l_name);
        return true;
    }
    const char *e = dlerror();
    /* "cannot open shared object file" is the normal miss; anything else is a reason */
    if (e && !strstr(e, "cannot open shared object file")) snprintf(err, sizeof err, "%s", e);
    note(&l, "the loader's path");
    /* 2. where the build found it; 3. the toolkit */
    bool ok = try_dir(lib, build_libdir, soname, &l, err, sizeof err);
    static const char *const envs[] = {"CUDA_HOME", "CUDA_PATH"};
    char dir[600];
    for (size_t i = 0; i < 2 && !ok; i++) {
        const char *v = getenv(envs[i]);
        if (v && *v && strlen(v) < 500) {
            snprintf(dir, sizeof dir, "%s/lib64", v);
            ok = try_dir(lib, dir, soname, &l, err, sizeof err);
        }
    }
    if (!ok) ok = try_dir(lib, "/usr/local/cuda/lib64", soname, &l, err, sizeof err);
    /* 4. NVIDIA's wheels */
    if (!ok) ok = try_next_to_cudart(lib, wheel, soname, &l, err, sizeof err);
    if (!ok) ok = try_wheels(lib, wheel, soname, &l, err, sizeof err);
    if (ok) return true;
    if (err[0])
        snprintf(lib->why, sizeof lib->why, "%s did not load: %s (also looked in %s)", soname,
                 err, l.text);
    else
        snprintf(lib->why, sizeof lib->why, "%s not found (looked in %s)", soname, l.text);
    return false;
}

void *nb__dl_sym(const nb__dl *lib, const char *name) {
    return lib->handle ? dlsym(lib->handle, name) : NULL;
}
