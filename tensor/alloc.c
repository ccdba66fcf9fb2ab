/* alloc.c - the caching host allocator (docs/architecture.md rule 4).
 *
 * Blocks are 64-byte aligned and rounded up to size classes: multiples of 64 bytes up to
 * 512, then four classes per power of two (at most 25% waste). A freed block goes to its
 * class's free list and is handed out again for the next request of that class, so a loop
 * that allocates the same sizes every step stops calling the system allocator after the
 * first step. Each block carries a 64-byte header (class, magic, free-list link) in front
 * of the data. Under AddressSanitizer, cached blocks and the slack past the requested size
 * are poisoned, so use-after-free and overflows are still caught. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/asan.h"
#include "tensor/tensor_impl.h"
#include "tensor/trace.h"

#define NB__ALIGN 64
#define NB__NCLASS 168
#define NB__MAGIC 0x6e61626cu /* "nabl" */

typedef struct nb__block {
    uint32_t cls;
    uint32_t magic;
    struct nb__block *next;
    char pad[NB__ALIGN - 16];
} nb__block;
_Static_assert(sizeof(nb__block) == NB__ALIGN, "block header must keep data aligned");

static struct {
    pthread_mutex_t lock;
    nb__block *free_list[NB__NCLASS];
    nb_alloc_stats st;
} g_alloc = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int size_class(size_t n, size_t *class_size) {
    if (n <= 512) {
        int idx = n == 0 ? 0 : (int)((n + 63) / 64) - 1;
        *class_size = (size_t)(idx + 1) * 64;
        return idx;
    }
    int k = 63 - __builtin_clzll((unsigned long long)(n - 1)); /* 2^k < n <= 2^(k+1) */
    size_t base = (size_t)1 << k, step = base / 4;
    size_t j = (n - base + step - 1) / step; /* 1..4 */
    *class_size = base + j * step;
    int idx = 8 + (k - 9) * 4 + (int)(j - 1);
    return idx < NB__NCLASS ? idx : -1;
}

static size_t class_bytes(int idx) {
    if (idx < 8) return (size_t)(idx + 1) * 64;
    int k = 9 + (idx - 8) / 4, j = (idx - 8) % 4 + 1;
    size_t base = (size_t)1 << k;
    return base + (size_t)j * (base / 4);
}

static void *system_alloc(size_t total) {
    return aligned_alloc(NB__ALIGN, (total + NB__ALIGN - 1) / NB__ALIGN * NB__ALIGN);
}

void *nb_host_alloc(size_t nbytes) {
    size_t csize;
    int idx = size_class(nbytes, &csize);
    if (idx < 0) {
        nb__error(NB_ENOMEM, "allocation of %zu bytes is larger than the allocator supports",
                  nbytes);
        return NULL;
    }
    pthread_mutex_lock(&g_alloc.lock);
    nb__block *b = g_alloc.free_list[idx];
    if (b) {
        g_alloc.free_list[idx] = b->next;
        g_alloc.st.bytes_cached -= (int64_t)csize;
    }
    pthread_mutex_unlock(&g_alloc.lock);
    if (!b) {
        b = system_alloc(sizeof(nb__block) + csize);
        if (!b) { /* give the cache back and try once more */
            nb_alloc_empty_cache();
            b = system_alloc(sizeof(nb__block) + csize);
        }
        if (!b) {
            nb__error(NB_ENOMEM, "out of memory allocating %zu bytes", nbytes);
            return NULL;
        }
        b->cls = (uint32_t)idx;
        b->magic = NB__MAGIC;
        pthread_mutex_lock(&g_alloc.lock);
        g_alloc.st.system_allocs++;
        pthread_mutex_unlock(&g_alloc.lock);
    }
    b->next = NULL;
    pthread_mutex_lock(&g_alloc.lock);
    g_alloc.st.allocs++;
    g_alloc.st.bytes_live += (int64_t)csize;
    if (g_alloc.st.bytes_live > g_alloc.st.bytes_peak)
        g_alloc.st.bytes_peak = g_alloc.st.bytes_live;
    int64_t live = g_alloc.st.bytes_live, cached = g_alloc.st.bytes_cached;
    pthread_mutex_unlock(&g_alloc.lock);
    if (NB__TRACE_ACTIVE()) nb__trace_memory(live, cached);
    char *data = (char *)(b + 1);
    NB__UNPOISON(data, nbytes);
    NB__POISON(data + nbytes, csize - nbytes);
    return data;
}

void nb_host_free(void *p) {
    if (!p) return;
    nb__block *b = (nb__block *)p - 1;
    NB__ASSERT(b->magic == NB__MAGIC && b->cls < NB__NCLASS);
    size_t csize = class_bytes((int)b->cls);
    NB__POISON(p, csize);
    pthread_mutex_lock(&g_alloc.lock);
    b->next = g_alloc.free_list[b->cls];
    g_alloc.free_list[b->cls] = b;
    g_alloc.st.bytes_live -= (int64_t)csize;
    g_alloc.st.bytes_cached += (int64_t)csize;
    int64_t live = g_alloc.st.bytes_live, cached = g_alloc.st.bytes_cached;
    pthread_mutex_unlock(&g_alloc.lock);
    if (NB__TRACE_ACTIVE()) nb__trace_memory(live, cached);
}

void nb_alloc_empty_cache(void) {
    nb__block *lists[NB__NCLASS];
    pthread_mutex_lock(&g_alloc.lock);
    memcpy(lists, g_alloc.free_list, sizeof lists);
    memset(g_alloc.free_list, 0, sizeof g_alloc.free_list);
    g_alloc.st.bytes_cached = 0;
    pthread_mutex_unlock(&g_alloc.lock);
    int64_t freed = 0;
    for (int i = 0; i < NB__NCLASS; i++) {
        for (nb__block *b = lists[i], *next; b; b = next) {
            next = b->next;
            NB__UNPOISON(b + 1, class_bytes(i));
            free(b);
            freed++;
        }
    }
    pthread_mutex_lock(&g_alloc.lock);
    g_alloc.st.system_frees += freed;
    pthread_mutex_unlock(&g_alloc.lock);
}

void nb_alloc_get_stats(nb_alloc_stats *out) {
    if (!out) return;
    pthread_mutex_lock(&g_alloc.lock);
    *out = g_alloc.st;
    pthread_mutex_unlock(&g_alloc.lock);
}

void nb_alloc_reset_peak(void) {
    pthread_mutex_lock(&g_alloc.lock);
    g_alloc.st.bytes_peak = g_alloc.st.bytes_live;
    pthread_mutex_unlock(&g_alloc.lock);
}
