/* cpu/guard.c - the guard device, for tests: the proof without a GPU that only backends
 * touch device memory.
 *
 * Its memory is host memory from mmap, kept PROT_NONE except while one of the guard
 * backend's own calls runs (a kernel, a copy to or from the host). The kernels are the
 * CPU's, wrapped: open every live block read-write, run the CPU kernel, close them again.
 * Any other dereference of a guard tensor's memory (an op definition, the autograd
 * engine, an optimizer reading data through a pointer) faults at once. Slow by design
 * (two mprotect calls per live block per kernel); tests only. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu/backend.h"
#include "cpu/cpu_impl.h"

typedef struct block {
    void *p;
    size_t len; /* mapped bytes (a multiple of the page size, at least one page) */
} block;

static struct {
    pthread_mutex_t lock;
    block *blocks;
    size_t n, cap;
    int open; /* nesting depth of open sections */
} g = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void protect_all(int prot) {
    for (size_t i = 0; i < g.n; i++) NB__ASSERT(mprotect(g.blocks[i].p, g.blocks[i].len, prot) == 0);
}

/* Kernels may run on OpenMP threads but are called from one thread at a time per guard
 * section: the lock is held for the whole section. */
static void open_all(void) {
    pthread_mutex_lock(&g.lock);
    if (g.open++ == 0) protect_all(PROT_READ | PROT_WRITE);
}
static void close_all(void) {
    if (--g.open == 0) protect_all(PROT_NONE);
    pthread_mutex_unlock(&g.lock);
}

static void *guard_alloc(nb_device dev, size_t nbytes) {
    (void)dev;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t len = (nbytes + page - 1) / page * page;
    if (len == 0) len = page;
    void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        nb__error(NB_ENOMEM, "guard: out of memory allocating %zu bytes", nbytes);
        return NULL;
    }
    pthread_mutex_lock(&g.lock);
    if (g.n == g.cap) {
        size_t cap = g.cap ? 2 * g.cap : 256;
        block *nbk = realloc(g.blocks, cap * sizeof *nbk);
        if (!nbk) {
            pthread_mutex_unlock(&g.lock);
            munmap(p, len);
            nb__error(NB_ENOMEM, "guard: out of memory");
            return NULL;
        }
        g.blocks = nbk, g.cap = cap;
    }
    g.blocks[g.n++] = (block){p, len};
    if (g.open) NB__ASSERT(mprotect(p, len, PROT_READ | PROT_WRITE) == 0);
    pthread_mutex_unlock(&g.lock);
    return p;
}

static void guard_free(nb_device dev, void *p) {
    (void)dev;
    if (!p) return;
    pthread_mutex_lock(&g.lock);
    for (size_t i = 0; i < g.n; i++) {
        if (g.blocks[i].p != p) continue;
        munmap(p, g.blocks[i].len);
        g.blocks[i] = g.blocks[--g.n];
        pthread_mutex_unlock(&g.lock);
        return;
    }
    pthread_mutex_unlock(&g.lock);
    NB__ASSERT(!"guard: free of a pointer the guard device did not allocate");
}

static nb_status guard_to_host(nb_device dev, void *dst, const void *src, size_t nbytes) {
    (void)dev;
    open_all();
    if (nbytes) memcpy(dst, src, nbytes);
    close_all();
    return NB_OK;
}

static nb__backend g_guard = {
    .name = "guard",
    .has_storage = true,
    .host_accessible = false,
    .alloc = guard_alloc,
    .free = guard_free,
    .to_host = guard_to_host,
    .from_host = guard_to_host,
};

/* One wrapper per kernel: the CPU kernel inside an open section. */
#define NB__GUARD_WRAP(name, Args, what)                                                   \
    static nb_status guard_##name(const Args *a) {                                         \
        open_all();                                                                        \
        nb_status st = nb__cpu_backend()->k.name(a);                                       \
        close_all();                                                                       \
        return st;                                                                         \
    }
NB__KERNELS(NB__GUARD_WRAP)
#undef NB__GUARD_WRAP

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void guard_init(void) {
    const nb__kernels *cpu = &nb__cpu_backend()->k;
#define NB__GUARD_SET(name, Args, what) g_guard.k.name = cpu->name ? guard_##name : NULL;
    NB__KERNELS(NB__GUARD_SET)
#undef NB__GUARD_SET
}

const nb__backend *nb__guard_backend(void) {
    pthread_once(&g_once, guard_init);
    return &g_guard;
}
