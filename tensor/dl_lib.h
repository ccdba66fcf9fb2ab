/* dl_lib.h - private: a library libnabla opens on first use instead of linking it (zlib for
 * data/idx.c, jansson for io/ and run/; docs/embedding.md), so a program that never calls
 * into it does not map it. One nb__dl_lib per library, a static of the file that uses it:
 *
 *     static struct { __typeof__(gzopen) *open; __typeof__(gzread) *read; } zl;
 *     static const char *const names[] = {"gzopen64", "gzread"};  // zl's fields, in order
 *     static nb__dl_lib zlib = NB__DL_LIB("zlib", names, &zl, NB_ZLIB_PATH, "libz.so.1");
 *     if (!nb__dl_lib_load(&zlib, "idx")) return nb_last_status();
 *     gzFile f = zl.open(path, "rb");
 *
 * Where the functions come from, first hit wins: the process itself (a program that linked
 * the library, as libnabla.a's users do through `pkg-config --static`), the path meson found,
 * the soname through the loader's search. The outcome is kept for the process; the library
 * is never unloaded. Thread safe. */
#ifndef NABLA_TENSOR_DL_LIB_H
#define NABLA_TENSOR_DL_LIB_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

typedef struct nb__dl_lib {
    const char *what;               /* "zlib": the name in the message */
    const char *const *names;       /* the functions, n of them */
    void *table;                    /* n function pointers, names' order: filled by the load */
    int n;
    const char *path, *soname;      /* where meson found it; the loader's name for it */
    atomic_int state;               /* 0: not tried, 1: loaded, -1: failed (reason) */
    pthread_mutex_t lock;
    char reason[768];
} nb__dl_lib;

#define NB__DL_LIB(what, names, table, path, soname)                                        \
    {(what), (names), (table), (int)(sizeof(names) / sizeof((names)[0])), (path), (soname), \
     0, PTHREAD_MUTEX_INITIALIZER, ""}

/* true when loaded (loading it on the first call); else false with the error set
 * ("<op>: <what> could not be loaded: ...", NB_EUNSUPPORTED). */
bool nb__dl_lib_load(nb__dl_lib *l, const char *op);
/* The same without setting an error (for questions such as "is bf16 native here?"). */
bool nb__dl_lib_ok(nb__dl_lib *l);

#endif
