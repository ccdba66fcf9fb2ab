/* nabla/memory.h - scopes (who frees intermediates) and the caching host allocator.
 *
 * Usage:
 *     for (int step = 0; step < n; step++) {
 *         nb_scope_begin();
 *         nb_tensor *loss = ...;             // every op result belongs to this scope
 *         total += nb_item_f64(loss);
 *         nb_scope_end();                    // releases them all
 *     }
 *     nb_alloc_stats st;
 *     nb_alloc_get_stats(&st);               // st.system_allocs stops growing after warm-up
 *
 * Scopes nest and are per thread. nb_scope_end() releases the references the scope holds;
 * a tensor also referenced elsewhere (a parameter, a kept tensor, a view's base) lives on.
 * nb_keep(t) moves t's reference from the innermost scope to the enclosing one, or to the
 * caller when there is none (then the caller calls nb_tensor_free). nb_keep of a tensor that
 * is not in the innermost scope adds a reference instead, so it is always safe to call.
 * A handle used after its tensor was released (a forgotten nb_keep, a second
 * nb_tensor_free) gives NB_EFREED, "tensor used after the scope that owned it ended; nb_keep
 * it to return it from a scope", while fewer than NB_HANDLE_QUARANTINE (default 1024) other
 * tensors were released since (docs/memory.md, "Released handles").
 *
 * The allocator hands out 64-byte aligned blocks rounded up to size classes and keeps freed
 * blocks for reuse, so a training loop stops calling the system allocator after its first
 * steps (docs/architecture.md rule 4). It is thread safe. Cached blocks stay with the process until
 * nb_alloc_empty_cache(). Under AddressSanitizer cached blocks are poisoned. */
#ifndef NABLA_MEMORY_H
#define NABLA_MEMORY_H

#include <stddef.h>
#include <stdint.h>

#include "nabla/status.h"
#include "nabla/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

void nb_scope_begin(void);
/* Ends the innermost scope; NB_ESTATE if no scope is open. */
nb_status nb_scope_end(void);
/* Number of open scopes on this thread. */
int nb_scope_depth(void);
/* Move t out of the innermost scope (see above); returns t (NULL stays NULL). */
nb_tensor *nb_keep(nb_tensor *t);

typedef struct nb_alloc_stats {
    int64_t bytes_live;      /* bytes in blocks handed out and not yet returned */
    int64_t bytes_peak;      /* maximum of bytes_live since start or the last reset */
    int64_t bytes_cached;    /* bytes in returned blocks kept for reuse */
    int64_t system_allocs;   /* calls to the system allocator so far */
    int64_t system_frees;    /* blocks given back to the system so far */
    int64_t allocs;          /* blocks handed out (cache hits + system allocations) */
} nb_alloc_stats;

/* Host allocator statistics (process wide). */
void nb_alloc_get_stats(nb_alloc_stats *out);
/* Reset bytes_peak to bytes_live. */
void nb_alloc_reset_peak(void);
/* Give every cached block back to the system. */
void nb_alloc_empty_cache(void);

/* Raw access for embedders and extension kernels: a block of at least nbytes, 64-byte
 * aligned, from the caching allocator; NULL (and an error) when out of memory. Return it
 * with nb_host_free. */
void *nb_host_alloc(size_t nbytes);
void nb_host_free(void *p);

#ifdef __cplusplus
}
#endif
#endif
