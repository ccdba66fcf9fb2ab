/* cpu/guard.c - the guard device, for tests: the proof without a GPU that only backends
 * touch device memory.
 *
 * Its memory is host memory kept PROT_NONE except while one of the guard backend's own
 * calls runs (a kernel, a copy to or from the host). The kernels are the CPU's, wrapped:
 * open the guard memory read-write, run the CPU kernel, close it again. Any other
 * dereference of a guard tensor's memory (an op definition, the autograd engine, an
 * optimizer reading data through a pointer) faults at once.
 *
 * All guard memory lives in one reserved range of address space (MAP_NORESERVE), handed
 * out in whole pages from per-size free lists and a bump pointer, so opening and closing
 * is one mprotect call over the used part of the range however many tensors live. Freed
 * blocks give their physical pages back (MADV_DONTNEED) and are reused for the same size.
 * Tests only. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu/backend.h"
#include "cpu/cpu_impl.h"

#define GUARD_RESERVE ((size_t)1 << 38) /* 256 GiB of address space, no memory */
#define GUARD_SMALL 1024                /* blocks up to this many pages: one list per size */

typedef struct gblock {
    struct gblock *next; /* free lists; kept outside the guarded memory */
    char *p;
    size_t pages;
} gblock;

static struct {
    pthread_mutex_t lock;
    char *base;
    size_t page, used;            /* bytes handed out by the bump pointer */
    gblock *free_small[GUARD_SMALL + 1];
    gblock *free_large;           /* exact-size reuse, first fit */
    gblock *spare;                /* recycled gblock records */
    /* live blocks by address, for free(): a small open-addressing table */
    gblock **live;
    size_t live_cap, live_n;
    int open;                     /* nesting depth of open sections */
    bool failed;                  /* the reservation failed: every allocation errors */
} g = {.lock = PTHREAD_MUTEX_INITIALIZER};

static pthread_once_t g_reserve_once = PTHREAD_ONCE_INIT;
static void reserve(void) {
    g.page = (size_t)sysconf(_SC_PAGESIZE);
    void *p = mmap(NULL, GUARD_RESERVE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) g.failed = true;
    else g.base = p;
}

static void protect(int prot) {
    if (g.used) NB__ASSERT(mprotect(g.base, g.used, prot) == 0);
}

/* Kernels may run on OpenMP threads but are called from one thread at a time per guard
 * section: the lock is held for the whole section. */
static void open_all(void) {
    pthread_mutex_lock(&g.lock);
    if (g.open++ == 0) protect(PROT_READ | PROT_WRITE);
}
static void close_all(void) {
    if (--g.open == 0) protect(PROT_NONE);
    pthread_mutex_unlock(&g.lock);
}

static size_t hash(const void *p) { return ((size_t)p / 4096) * 0x9E3779B97F4A7C15ull; }

static bool live_grow(void) {
    size_t cap = g.live_cap ? 2 * g.live_cap : 1024;
    gblock **t = calloc(cap, sizeof *t);
    if (!t) return false;
    for (size_t i = 0; i < g.live_cap; i++) {
        gblock *b = g.live[i];
        if (!b) continue;
        size_t j = hash(b->p) & (cap - 1);
        while (t[j]) j = (j + 1) & (cap - 1);
        t[j] = b;
    }
    free(g.live);
    g.live = t, g.live_cap = cap;
    return true;
}

static bool live_add(gblock *b) {
    if (2 * (g.live_n + 1) > g.live_cap && !live_grow()) return false;
    size_t j = hash(b->p) & (g.live_cap - 1);
    while (g.live[j]) j = (j + 1) & (g.live_cap - 1);
    g.live[j] = b;
    g.live_n++;
    return true;
}

/* Remove and return the live block at p (NULL if none), keeping probe chains intact. */
static gblock *live_take(const void *p) {
    if (!g.live_cap) return NULL;
    size_t m = g.live_cap - 1, j = hash(p) & m;
    while (g.live[j] && g.live[j]->p != p) j = (j + 1) & m;
    gblock *b = g.live[j];
    if (!b) return NULL;
    g.live[j] = NULL;
    g.live_n--;
    for (size_t k = (j + 1) & m; g.live[k]; k = (k + 1) & m) { /* reinsert the chain */
        gblock *r = g.live[k];
        g.live[k] = NULL;
        size_t i = hash(r->p) & m;
        while (g.live[i]) i = (i + 1) & m;
        g.live[i] = r;
    }
    return b;
}

static void *guard_alloc(nb_device dev, size_t nbytes) {
    (void)dev;
    pthread_once(&g_reserve_once, reserve);
    if (g.failed) {
        nb__error(NB_ENOMEM, "guard: could not reserve address space for the guard device");
        return NULL;
    }
    pthread_mutex_lock(&g.lock);
    size_t pages = (nbytes + g.page - 1) / g.page;
    if (pages == 0) pages = 1;
    gblock *b = NULL;
    if (pages <= GUARD_SMALL) {
        if ((b = g.free_small[pages])) g.free_small[pages] = b->next;
    } else {
        for (gblock **pp = &g.free_large; *pp; pp = &(*pp)->next)
            if ((*pp)->pages == pages) {
                b = *pp;
                *pp = b->next;
                break;
            }
    }
    if (!b) {
        size_t len = pages * g.page;
        if (len > GUARD_RESERVE - g.used) {
            pthread_mutex_unlock(&g.lock);
            nb__error(NB_ENOMEM, "guard: out of address space allocating %zu bytes", nbytes);
            return NULL;
        }
        if ((b = g.spare)) g.spare = b->next;
        else b = malloc(sizeof *b);
        if (!b) {
            pthread_mutex_unlock(&g.lock);
            nb__error(NB_ENOMEM, "guard: out of memory");
            return NULL;
        }
        b->p = g.base + g.used;
        b->pages = pages;
        g.used += len;
        /* inside an open section the new pages must be usable at once */
        if (g.open) NB__ASSERT(mprotect(b->p, len, PROT_READ | PROT_WRITE) == 0);
    }
    b->next = NULL;
    if (!live_add(b)) {
        b->next = g.spare, g.spare = b;
        pthread_mutex_unlock(&g.lock);
        nb__error(NB_ENOMEM, "guard: out of memory");
        return NULL;
    }
    pthread_mutex_unlock(&g.lock);
    return b->p;
}

static void guard_free(nb_device dev, void *p) {
    (void)dev;
    if (!p) return;
    pthread_mutex_lock(&g.lock);
    gblock *b = live_take(p);
    NB__ASSERT(b != NULL); /* a pointer the guard device did not allocate, or freed twice */
    madvise(b->p, b->pages * g.page, MADV_DONTNEED); /* the pages go back; contents zero */
    if (b->pages <= GUARD_SMALL) {
        b->next = g.free_small[b->pages];
        g.free_small[b->pages] = b;
    } else {
        b->next = g.free_large;
        g.free_large = b;
    }
    pthread_mutex_unlock(&g.lock);
}

static nb_status guard_copy_bytes(nb_device dev, void *dst, const void *src, size_t nbytes) {
    (void)dev;
    open_all();
    if (nbytes) memcpy(dst, src, nbytes);
    close_all();
    return NB_OK;
}

/* Copies to the host (on a GPU each is a synchronization): counted for the tests. */
static unsigned long g_host_reads;
unsigned long nb__guard_host_reads(void) { return __atomic_load_n(&g_host_reads, __ATOMIC_RELAXED); }
static nb_status guard_to_host(nb_device dev, void *dst, const void *src, size_t nbytes) {
    __atomic_fetch_add(&g_host_reads, 1, __ATOMIC_RELAXED);
    return guard_copy_bytes(dev, dst, src, nbytes);
}

/* "Pinned" host memory for the tests of the loader's device path: plain host memory. */
static void *guard_host_alloc(nb_device dev, size_t nbytes) {
    (void)dev;
    void *p = NULL;
    if (posix_memalign(&p, 64, nbytes ? nbytes : 1) != 0) {
        nb__error(NB_ENOMEM, "guard host_alloc: out of memory");
        return NULL;
    }
    return p;
}
static void guard_host_free(nb_device dev, void *p) {
    (void)dev;
    free(p);
}

static nb__backend g_guard = {
    .name = "guard",
    .has_storage = true,
    .host_accessible = false,
    .gemm_bf16 = true,
    .conv_bf16 = true,
    .attention_bf16 = true,
    .ew_half_in_f32 = true,
    .pool_relu = true,
    .alloc = guard_alloc,
    .free = guard_free,
    .to_host = guard_to_host,
    .host_alloc = guard_host_alloc,
    .host_free = guard_host_free,
    .from_host = guard_copy_bytes,
};

/* Calls per kernel, in NB__KERNELS order (nb__guard_kernel_calls). */
enum {
#define NB__GUARD_IDX(name, Args, what) NB__GUARD_K_##name,
    NB__KERNELS(NB__GUARD_IDX)
#undef NB__GUARD_IDX
    NB__GUARD_NK
};
static unsigned long g_calls[NB__GUARD_NK];

void nb__guard_kernel_calls(unsigned long *out, int n) {
    for (int i = 0; i < n && i < NB__GUARD_NK; i++)
        out[i] = __atomic_load_n(&g_calls[i], __ATOMIC_RELAXED);
}

/* One wrapper per kernel: the CPU kernel inside an open section. */
#define NB__GUARD_WRAP(name, Args, what)                                                   \
    static nb_status guard_##name(const Args *a) {                                         \
        __atomic_fetch_add(&g_calls[NB__GUARD_K_##name], 1, __ATOMIC_RELAXED);              \
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
