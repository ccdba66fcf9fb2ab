/* scope.c - per-thread scopes that own the tensors ops return (docs/architecture.md rule 3).
 *
 * Each open scope is a list of references. nb__scope_add appends a fresh reference to the
 * innermost list; nb_scope_end releases every reference in it. The lists keep their
 * capacity between scopes, so a training loop's begin/end pair allocates nothing after
 * the first step. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/tensor_impl.h"

typedef struct {
    nb_tensor **items;
    int64_t n, cap;
} nb__scope;

static _Thread_local struct {
    nb__scope *scopes;
    int depth, cap;
} tls_scopes;

/* The lists outlive each scope (no allocation per step) and are freed when the thread
 * exits, through a pthread key destructor. */
static pthread_key_t g_scope_key;
static pthread_once_t g_scope_once = PTHREAD_ONCE_INIT;

static void scopes_release(void *unused) {
    (void)unused;
    for (int i = 0; i < tls_scopes.cap; i++) free(tls_scopes.scopes[i].items);
    free(tls_scopes.scopes);
    memset(&tls_scopes, 0, sizeof tls_scopes);
}

static void scope_key_create(void) { pthread_key_create(&g_scope_key, scopes_release); }

void nb_scope_begin(void) {
    if (tls_scopes.depth == tls_scopes.cap) {
        if (tls_scopes.cap == 0) {
            pthread_once(&g_scope_once, scope_key_create);
            pthread_setspecific(g_scope_key, &tls_scopes);
        }
        int cap = tls_scopes.cap ? tls_scopes.cap * 2 : 8;
        nb__scope *s = realloc(tls_scopes.scopes, sizeof(nb__scope) * (size_t)cap);
        NB__ASSERT(s != NULL); /* a few bytes; failing here means the process is done */
        memset(s + tls_scopes.cap, 0, sizeof(nb__scope) * (size_t)(cap - tls_scopes.cap));
        tls_scopes.scopes = s;
        tls_scopes.cap = cap;
    }
    tls_scopes.scopes[tls_scopes.depth++].n = 0;
}

nb_status nb_scope_end(void) {
    if (tls_scopes.depth == 0)
        return nb__error(NB_ESTATE, "nb_scope_end: no scope is open (unbalanced begin/end)");
    nb__scope *s = &tls_scopes.scopes[--tls_scopes.depth];
    /* Release in reverse creation order: views before their bases (not required by the
     * refcounts, but it keeps frees LIFO, which the caching allocator likes). */
    nb__scope_releasing(true);
    for (int64_t i = s->n - 1; i >= 0; i--) nb_tensor_free(s->items[i]);
    nb__scope_releasing(false);
    s->n = 0;
    return NB_OK;
}

int nb_scope_depth(void) { return tls_scopes.depth; }

static void push(nb__scope *s, nb_tensor *t) {
    if (s->n == s->cap) {
        int64_t cap = s->cap ? s->cap * 2 : 64;
        nb_tensor **items = realloc(s->items, sizeof(nb_tensor *) * (size_t)cap);
        NB__ASSERT(items != NULL);
        s->items = items;
        s->cap = cap;
    }
    s->items[s->n++] = t;
}

nb_tensor *nb__scope_add(nb_tensor *t) {
    if (t && tls_scopes.depth > 0) push(&tls_scopes.scopes[tls_scopes.depth - 1], t);
    return t;
}

nb_tensor *nb_keep(nb_tensor *t) {
    if (!t) return NULL;
    if (!nb__live(t)) {
        nb__dead_handle(t, "keep", "t");
        return NULL;
    }
    if (tls_scopes.depth == 0) return t; /* already the caller's */
    nb__scope *s = &tls_scopes.scopes[tls_scopes.depth - 1];
    for (int64_t i = s->n - 1; i >= 0; i--) {
        if (s->items[i] == t) {
            memmove(s->items + i, s->items + i + 1, sizeof(nb_tensor *) * (size_t)(s->n - i - 1));
            s->n--;
            if (tls_scopes.depth > 1) push(&tls_scopes.scopes[tls_scopes.depth - 2], t);
            return t;
        }
    }
    /* Not in this scope (a parameter, or kept before): hand out one more reference. */
    nb_tensor_retain(t);
    if (tls_scopes.depth > 1) push(&tls_scopes.scopes[tls_scopes.depth - 2], t);
    return t;
}

nb_tensor *nb__scope_take(nb_tensor *t) {
    if (!t || tls_scopes.depth == 0) return t;
    nb__scope *s = &tls_scopes.scopes[tls_scopes.depth - 1];
    for (int64_t i = s->n - 1; i >= 0; i--) {
        if (s->items[i] == t) {
            memmove(s->items + i, s->items + i + 1, sizeof(nb_tensor *) * (size_t)(s->n - i - 1));
            s->n--;
            break;
        }
    }
    return t;
}
