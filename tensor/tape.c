/* tape.c - the autograd tape, part of the core: grad mode, recording a node on an op's
 * result, saving tensors for the backward rule, and releasing nodes. Ops record through
 * this; the engine (autograd/engine.c) walks what was recorded. */
#include <stdatomic.h>
#include <string.h>

#include "tensor/tape.h"

static _Thread_local bool tls_grad_disabled; /* zero-initialized: grad mode on */
static _Thread_local nb__leaf_set *tls_collect; /* see nb__collect_begin */
static atomic_ullong g_seq;

bool nb_grad_enabled(void) { return !tls_grad_disabled; }

bool nb_set_grad_enabled(bool enabled) {
    bool prev = !tls_grad_disabled;
    tls_grad_disabled = !enabled;
    return prev;
}

/* ---- recording ------------------------------------------------------------------------------ */
static void collect(nb__leaf_set *set, nb_tensor *const *inputs, int n) {
    for (int i = 0; i < n; i++) {
        nb_tensor *t = inputs[i];
        if (!t || !t->requires_grad) continue;
        if (t->grad_fn) {
            bool skip = false;
            for (int j = 0; j < set->nskip && !skip; j++) skip = set->skip[j] == t;
            if (!skip && !set->nonleaf) set->nonleaf = t;
            continue;
        }
        bool seen = false;
        for (int j = 0; j < set->n && !seen; j++) seen = set->items[j] == t;
        if (seen) continue;
        if (set->n == set->cap) {
            int cap = set->cap ? 2 * set->cap : 16;
            nb_tensor **items = nb_host_alloc(sizeof(nb_tensor *) * (size_t)cap);
            if (!items) {
                set->failed = true;
                return;
            }
            if (set->n) memcpy(items, set->items, sizeof(nb_tensor *) * (size_t)set->n);
            nb_host_free(set->items);
            set->items = items, set->cap = cap;
        }
        set->items[set->n++] = t;
    }
}

nb__leaf_set *nb__collect_begin(nb__leaf_set *set) {
    nb__leaf_set *prev = tls_collect;
    tls_collect = set;
    return prev;
}

void nb__collect_end(nb__leaf_set *prev) { tls_collect = prev; }

bool nb__needs_grad(nb_tensor *const *inputs, int n) {
    if (tls_grad_disabled) {
        if (tls_collect) collect(tls_collect, inputs, n);
        return false;
    }
    for (int i = 0; i < n; i++)
        if (inputs[i] && inputs[i]->requires_grad) return true;
    return false;
}

nb__node *nb__record(nb_tensor *out, nb__op op, nb_tensor *const *inputs, int n) {
    if (!out || !nb__needs_grad(inputs, n)) return NULL;
    NB__ASSERT(out->grad_fn == NULL);
    nb__node *nd = nb_host_alloc(sizeof(nb__node));
    nb__edge *edges = nd ? nb_host_alloc(sizeof(nb__edge) * (size_t)(n ? n : 1)) : NULL;
    NB__ASSERT(edges != NULL); /* a few hundred bytes: failing here means the process is done */
    memset(nd, 0, sizeof *nd);
    memset(edges, 0, sizeof(nb__edge) * (size_t)n);
    atomic_init(&nd->refcount, 1);
    nd->op = op;
    nd->seq = atomic_fetch_add(&g_seq, 1) + 1;
    nd->ninputs = n;
    nd->edges = edges;
    for (int i = 0; i < n; i++) {
        nb_tensor *in = inputs[i];
        if (!in) continue;
        edges[i].ndim = in->ndim;
        edges[i].dtype = in->dtype;
        memcpy(edges[i].shape, in->shape, sizeof(int64_t) * (size_t)in->ndim);
        if (in->grad_fn) {
            edges[i].node = in->grad_fn;
            atomic_fetch_add(&in->grad_fn->refcount, 1);
        } else if (in->requires_grad) {
            edges[i].leaf = nb_tensor_retain(in);
        }
    }
    nd->out_ndim = out->ndim;
    nd->out_dtype = out->dtype;
    memcpy(nd->out_shape, out->shape, sizeof(int64_t) * (size_t)out->ndim);
    out->grad_fn = nd;
    out->requires_grad = true;
    return nd;
}

void nb__save(nb__node *n, int slot, nb_tensor *t) {
    NB__ASSERT(slot >= 0 && slot < NB__NODE_MAX_SAVED && !n->saved[slot]);
    if (!t) return;
    nb_tensor *v = nb__view_of(t, t->shape, t->strides, t->ndim, t->offset);
    NB__ASSERT(v != NULL);
    n->saved[slot] = nb__scope_take(v); /* owned by the node, no grad_fn: no cycle */
    n->saved_version[slot] = nb__version_of(t);
}

void nb__node_release_saved(nb__node *n) {
    for (int i = 0; i < NB__NODE_MAX_SAVED; i++) {
        nb_tensor_free(n->saved[i]);
        n->saved[i] = NULL;
    }
    if (n->ext) n->ext_free(n->ext);
    n->ext = NULL;
}

void nb__node_release(nb__node *n) {
    /* Iterative over the chain of sole owners, so long graphs do not recurse deeply. */
    while (n && atomic_fetch_sub(&n->refcount, 1) == 1) {
        nb__node_release_saved(n);
        for (struct nb__node_hook *h = n->pre_hooks, *nx; h; h = nx) {
            nx = h->next;
            nb_host_free(h);
        }
        nb_tensor_free(n->grad);
        nb__node *next = NULL;
        for (int i = 0; i < n->ninputs; i++) {
            nb_tensor_free(n->edges[i].leaf);
            if (n->edges[i].node) {
                if (!next) next = n->edges[i].node;
                else nb__node_release(n->edges[i].node);
            }
        }
        nb_host_free(n->edges);
        nb_host_free(n);
        n = next;
    }
}

