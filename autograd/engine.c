/* engine.c - the autograd engine: leaves' gradients and hooks, and nb_backward (see
 * nabla/autograd.h for the contract). The tape it walks (nodes, recording, grad mode) is
 * part of the core: tensor/tape.c. The engine computes with ops only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd_impl.h"
#include "tensor/autocast.h"
#include "tensor/trace.h"

/* Span names of the backward rules (tensor/trace.h): "linear backward", ... */
static const char *const bw_span_names[NB__OP_COUNT] = {
#define NB__BW_NAME(name, str, arity, grad) str " backward",
    NB__OPS(NB__BW_NAME)
#undef NB__BW_NAME
};

/* Per-leaf metadata: hooks, and engine bookkeeping for "gradient complete". */
typedef struct nb__hook {
    nb_grad_hook_fn fn;
    void *ctx;
    int handle;
} nb__hook;

struct nb__ag_meta {
    nb__hook *hooks;
    int nhooks, cap, next_handle;
    uint64_t epoch;
    int pending;
    bool got;
    nb__grad_guard_fn guard;
    void *guard_ctx;
};

static atomic_ullong g_epoch;

/* ---- leaves ---------------------------------------------------------------------------------- */
nb_status nb_set_requires_grad(nb_tensor *t, bool requires_grad) {
    if (!nb__arg_ok(t, "set_requires_grad", "t")) return nb_last_status();
    if (t->grad_fn)
        return nb__error(NB_EINVAL, "set_requires_grad: only leaf tensors can be marked; this "
                         "tensor was produced by %s (use nb_detach for a new leaf)",
                         nb__op_names[t->grad_fn->op]);
    if (requires_grad && !nb_dtype_is_float(t->dtype))
        return nb__error(NB_EDTYPE, "set_requires_grad: only float tensors can require "
                         "gradients, not %s", nb_dtype_name(t->dtype));
    t->requires_grad = requires_grad;
    return NB_OK;
}

/* The getters answer false/NULL for NULL; a released handle also sets NB_EFREED. */
static bool live_or_null(const nb_tensor *t, const char *op) {
    return t && (nb__live(t) || nb__dead_handle(t, op, "t"));
}
bool nb_requires_grad(const nb_tensor *t) {
    return live_or_null(t, "requires_grad") && t->requires_grad;
}
bool nb_is_leaf(const nb_tensor *t) { return live_or_null(t, "is_leaf") && !t->grad_fn; }
nb_tensor *nb_grad(const nb_tensor *t) { return live_or_null(t, "grad") ? t->grad : NULL; }

void nb_clear_grad(nb_tensor *t) {
    if (live_or_null(t, "clear_grad") && t->grad) {
        nb_tensor_free(t->grad);
        t->grad = NULL;
    }
}

nb_status nb_set_grad(nb_tensor *t, nb_tensor *g) {
    if (!nb__arg_ok(t, "set_grad", "t")) return nb_last_status();
    if (g && !nb__live(g)) return nb__dead_handle(g, "set_grad", "g"), NB_EFREED;
    if (g && (g->ndim != t->ndim ||
              memcmp(g->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim) != 0))
        return nb__error(NB_ESHAPE, "set_grad: gradient of shape %s for a tensor of shape %s",
                         NB__SHAPE(g), NB__SHAPE(t));
    nb_tensor_retain(g);
    nb_clear_grad(t);
    t->grad = g;
    return NB_OK;
}

static struct nb__ag_meta *meta_of(nb_tensor *t) {
    if (!t->ag) {
        t->ag = nb_host_alloc(sizeof(struct nb__ag_meta));
        if (t->ag) memset(t->ag, 0, sizeof *t->ag);
    }
    return t->ag;
}

void nb__ag_meta_free(struct nb__ag_meta *m) {
    if (!m) return;
    nb_host_free(m->hooks);
    nb_host_free(m);
}

int nb_register_grad_hook(nb_tensor *leaf, nb_grad_hook_fn fn, void *ctx) {
    if (!nb__arg_ok(leaf, "register_grad_hook", "leaf")) return nb_last_status();
    if (!fn) return nb__error(NB_ENULL, "register_grad_hook: fn is NULL");
    if (leaf->grad_fn || !leaf->requires_grad)
        return nb__error(NB_EINVAL, "register_grad_hook: hooks go on leaf tensors that "
                         "require grad");
    struct nb__ag_meta *m = meta_of(leaf);
    if (!m) return NB_ENOMEM;
    if (m->nhooks == m->cap) {
        int cap = m->cap ? 2 * m->cap : 4;
        nb__hook *h = nb_host_alloc(sizeof(nb__hook) * (size_t)cap);
        if (!h) return NB_ENOMEM;
        if (m->nhooks) memcpy(h, m->hooks, sizeof(nb__hook) * (size_t)m->nhooks);
        nb_host_free(m->hooks);
        m->hooks = h;
        m->cap = cap;
    }
    m->hooks[m->nhooks] = (nb__hook){fn, ctx, m->next_handle};
    m->nhooks++;
    return m->next_handle++;
}

nb_status nb_remove_grad_hook(nb_tensor *leaf, int handle) {
    if (!nb__arg_ok(leaf, "remove_grad_hook", "leaf")) return nb_last_status();
    struct nb__ag_meta *m = leaf->ag;
    for (int i = 0; m && i < m->nhooks; i++) {
        if (m->hooks[i].handle == handle) {
            memmove(m->hooks + i, m->hooks + i + 1, sizeof(nb__hook) * (size_t)(m->nhooks - i - 1));
            m->nhooks--;
            return NB_OK;
        }
    }
    return nb__error(NB_EINVAL, "remove_grad_hook: no hook with handle %d on this tensor", handle);
}

nb_status nb__set_grad_guard(nb_tensor *leaf, nb__grad_guard_fn fn, void *ctx) {
    if (!nb__arg_ok(leaf, "set_grad_guard", "leaf")) return nb_last_status();
    struct nb__ag_meta *m = fn ? meta_of(leaf) : leaf->ag;
    if (!fn) {
        if (m && m->guard_ctx == ctx) m->guard = NULL, m->guard_ctx = NULL;
        return NB_OK;
    }
    if (!m) return nb__error(NB_ENOMEM, "set_grad_guard: out of memory");
    if (m->guard && (m->guard != fn || m->guard_ctx != ctx))
        return nb__error(NB_ESTATE, "set_grad_guard: this tensor's gradient is already guarded "
                         "(wrapped by another nb_ddp?)");
    m->guard = fn, m->guard_ctx = ctx;
    return NB_OK;
}

nb_status nb__check_grad(const nb_tensor *leaf, const char *who) {
    const struct nb__ag_meta *m = leaf ? leaf->ag : NULL;
    return m && m->guard ? m->guard(leaf, m->guard_ctx, who) : NB_OK;
}

/* ---- pre-backward hooks ---------------------------------------------------------------------- */
nb_status nb__register_pre_backward_hook(nb_tensor *t, nb__pre_backward_fn fn, void *ctx) {
    if (!nb__arg_ok(t, "register_pre_backward_hook", "t")) return nb_last_status();
    if (!fn) return nb__error(NB_ENULL, "register_pre_backward_hook: fn is NULL");
    if (!t->grad_fn)
        return nb__error(NB_EINVAL, "register_pre_backward_hook: the tensor was not produced by "
                         "an op recorded for backward");
    nb__node_hook *h = nb_host_alloc(sizeof *h);
    if (!h) return nb__error(NB_ENOMEM, "register_pre_backward_hook: out of memory");
    *h = (nb__node_hook){.fn = fn, .ctx = ctx};
    nb__node_hook **tail = &t->grad_fn->pre_hooks;
    while (*tail) tail = &(*tail)->next;
    *tail = h;
    return NB_OK;
}

/* ---- end-of-backward callbacks --------------------------------------------------------------- */
typedef struct {
    nb__backward_end_fn fn;
    void *ctx;
} end_cb;

static _Thread_local int tl_depth;      /* nb_backward calls running on this thread */
static _Thread_local end_cb *tl_cbs;    /* queued for the end of the outermost one */
static _Thread_local int tl_ncb, tl_capcb;

nb_status nb__queue_backward_end(nb__backward_end_fn fn, void *ctx) {
    if (!fn) return nb__error(NB_ENULL, "queue_backward_end: fn is NULL");
    if (tl_depth == 0)
        return nb__error(NB_ESTATE, "queue_backward_end: no backward is running on this thread");
    for (int i = 0; i < tl_ncb; i++)
        if (tl_cbs[i].fn == fn && tl_cbs[i].ctx == ctx) return NB_OK;
    if (tl_ncb == tl_capcb) {
        int cap = tl_capcb ? 2 * tl_capcb : 4;
        end_cb *c = nb_host_alloc(sizeof(end_cb) * (size_t)cap);
        if (!c) return nb__error(NB_ENOMEM, "queue_backward_end: out of memory");
        if (tl_ncb) memcpy(c, tl_cbs, sizeof(end_cb) * (size_t)tl_ncb);
        nb_host_free(tl_cbs);
        tl_cbs = c, tl_capcb = cap;
    }
    tl_cbs[tl_ncb++] = (end_cb){fn, ctx};
    return NB_OK;
}

/* Run (and clear) the queued callbacks; st is the backward's status. The first failure
 * wins, with its message. */
static nb_status run_end_callbacks(nb_status st) {
    end_cb *cbs = tl_cbs;
    int n = tl_ncb;
    tl_cbs = NULL, tl_ncb = tl_capcb = 0;
    char msg[512] = "";
    if (st != NB_OK) snprintf(msg, sizeof msg, "%s", nb_last_error());
    for (int i = 0; i < n; i++) {
        nb_status s = cbs[i].fn(cbs[i].ctx, st);
        if (s != NB_OK && st == NB_OK) {
            st = s;
            snprintf(msg, sizeof msg, "%s", nb_last_error());
        }
    }
    nb_host_free(cbs);
    if (st != NB_OK) nb__error(st, "%s", msg); /* the first failure, whatever ran after it */
    return st;
}

/* ---- gradient arithmetic used by the engine -------------------------------------------------- */
nb_status nb__add_inplace(nb_tensor *dst, const nb_tensor *src) {
    return nb_add_(dst, nb__mut(src));
}

nb_tensor *nb__sum_to_shape(nb_tensor *g, const int64_t *shape, int ndim) {
    if (!g) return NULL;
    if (g->ndim == ndim && memcmp(g->shape, shape, sizeof(int64_t) * (size_t)ndim) == 0)
        return nb__scope_add(nb_tensor_retain(g));
    int dims[NB_MAX_DIMS], nd = 0, lead = g->ndim - ndim;
    NB__ASSERT(lead >= 0);
    for (int i = 0; i < g->ndim; i++)
        if (i < lead || (shape[i - lead] == 1 && g->shape[i] != 1)) dims[nd++] = i;
    nb_scope_begin();
    nb_tensor *s = nd ? nb_sum(g, dims, nd, true) : g;
    nb_tensor *r = nb_keep(nb_reshape(s, shape, ndim));
    nb_scope_end();
    return r;
}

/* ---- the engine ----------------------------------------------------------------------------- */
typedef struct {
    nb__node **items;
    int64_t n, cap;
} node_vec;

static bool vec_push(node_vec *v, nb__node *n) {
    if (v->n == v->cap) {
        int64_t cap = v->cap ? 2 * v->cap : 64;
        nb__node **items = nb_host_alloc(sizeof(nb__node *) * (size_t)cap);
        if (!items) return false;
        if (v->n) memcpy(items, v->items, sizeof(nb__node *) * (size_t)v->n);
        nb_host_free(v->items);
        v->items = items;
        v->cap = cap;
    }
    v->items[v->n++] = n;
    return true;
}

/* Max-heap on seq: the latest-created ready node runs first. */
static bool heap_push(node_vec *h, nb__node *n) {
    if (!vec_push(h, n)) return false;
    for (int64_t i = h->n - 1; i > 0;) {
        int64_t p = (i - 1) / 2;
        if (h->items[p]->seq >= h->items[i]->seq) break;
        nb__node *t = h->items[p];
        h->items[p] = h->items[i], h->items[i] = t, i = p;
    }
    return true;
}

static nb__node *heap_pop(node_vec *h) {
    nb__node *top = h->items[0];
    h->items[0] = h->items[--h->n];
    for (int64_t i = 0;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && h->items[l]->seq > h->items[m]->seq) m = l;
        if (r < h->n && h->items[r]->seq > h->items[m]->seq) m = r;
        if (m == i) break;
        nb__node *t = h->items[m];
        h->items[m] = h->items[i], h->items[i] = t, i = m;
    }
    return top;
}

static bool exclusive(const nb_tensor *t) {
    return atomic_load(&t->refcount) == 1 && atomic_load(&t->storage->refcount) == 1;
}

/* Accumulate g (in the current inner scope) into *slot, which the engine or a leaf owns.
 * A leaf's slot takes g over only when nothing else can see it and copies it otherwise:
 * the leaf's gradient is the user's to change in place (clipping, averaging), and a later
 * contribution adds into it in place (into its flat buffer, when it has one). A node's
 * pending gradient (shared = true) is only read, by the node's rule, so it may share g with
 * other slots (an add passes its gradient to both inputs); a later contribution then adds
 * out of place while the slot is shared, which saves the copy. */
static nb_status accumulate(nb_tensor **slot, nb_tensor *g, bool shared) {
    if (!*slot) {
        if (nb_is_contiguous(g) && (shared || exclusive(g))) {
            *slot = nb__scope_take(g);
            return NB_OK;
        }
        nb_tensor *c = nb_clone(g);
        if (!c) return nb_last_status();
        *slot = nb__scope_take(c);
        return NB_OK;
    }
    if (shared && !exclusive(*slot)) {
        nb_tensor *sum = nb_add(*slot, g);
        if (!sum) return nb_last_status();
        nb_tensor_free(*slot);
        *slot = nb__scope_take(sum);
        return NB_OK;
    }
    return nb__add_inplace(*slot, g);
}

static void run_hooks(nb_tensor *leaf) {
    struct nb__ag_meta *m = leaf->ag;
    for (int i = 0; i < m->nhooks; i++) m->hooks[i].fn(leaf, m->hooks[i].ctx);
}

/* A leaf's gradient for this backward is final: its pending count reached zero. */
static nb_status leaf_contribution(nb_tensor *leaf, nb_tensor *g, uint64_t epoch) {
    struct nb__ag_meta *m = leaf->ag;
    NB__ASSERT(m && m->epoch == epoch && m->pending > 0);
    if (g) {
        nb_status st = accumulate(&leaf->grad, g, false);
        if (st != NB_OK) return st;
        m->got = true;
    }
    if (--m->pending == 0 && m->got) run_hooks(leaf);
    return NB_OK;
}

/* Fix a rule's gradient for input edge e: sum broadcast dims, convert dtype. Returns g itself
 * (no new reference) when it already fits, so that accumulate() can take a fresh gradient
 * over instead of copying it. */
static nb_tensor *fit_to_edge(nb_tensor *g, const nb__edge *e) {
    bool same_shape = g->ndim == e->ndim &&
                      memcmp(g->shape, e->shape, sizeof(int64_t) * (size_t)e->ndim) == 0;
    nb_tensor *s = same_shape ? g : nb__sum_to_shape(g, e->shape, e->ndim);
    return s && s->dtype != e->dtype ? nb_to_dtype(s, e->dtype) : s;
}

/* NB_EINVAL when a tensor n saved was written in place after it was saved (its storage's
 * version moved, nb__storage.version): the rule would compute the gradient from the new
 * values and return a silently wrong result. */
static nb_status check_saved(const nb__node *n) {
    if (n->op == NB__OP_RECOMPUTE) return nb__recompute_check(n);
    for (int i = 0; i < NB__NODE_MAX_SAVED; i++) {
        const nb_tensor *s = n->saved[i];
        if (!s || nb__version_of(s) == n->saved_version[i]) continue;
        return nb__error(NB_EINVAL, "backward: a tensor saved by %s was modified in place after "
                         "it was saved (version %llu, expected %llu); clone it before writing "
                         "to it", nb__op_names[n->op], (unsigned long long)nb__version_of(s),
                         (unsigned long long)n->saved_version[i]);
    }
    return NB_OK;
}

/* Where a capturing walk (nb__grad_of) puts the gradients of the leaves it was asked for,
 * instead of their .grad: the walk neither touches the leaves nor runs their hooks. */
typedef struct {
    nb_tensor *const *wrt;
    nb_tensor **grads;
    int n;
} capture;

static int capture_index(const capture *cap, const nb_tensor *leaf) {
    for (int i = 0; i < cap->n; i++)
        if (cap->wrt[i] == leaf) return i;
    return -1;
}

static nb_status backward_graph(nb__node *root, nb_tensor *gout, bool retain, uint64_t epoch,
                                const capture *cap) {
    node_vec stack = {0}, heap = {0};
    nb_status st = NB_OK;
    /* Pass 1: find the nodes and count, per node and per leaf, the edges into it. */
    root->epoch = epoch;
    root->deps = 0;
    if (!vec_push(&stack, root)) return NB_ENOMEM;
    while (stack.n && st == NB_OK) {
        nb__node *n = stack.items[--stack.n];
        if (n->released) {
            st = nb__error(NB_ESTATE, "backward: the graph through %s was already freed by an "
                           "earlier backward; pass .retain_graph = true to run backward twice",
                           nb__op_names[n->op]);
            break;
        }
        /* Checked here, before any rule runs, so that a stale graph changes no gradient;
         * and again before each rule, as a hook may write in place meanwhile. */
        if ((st = check_saved(n)) != NB_OK) break;
        for (int i = 0; i < n->ninputs; i++) {
            nb__edge *e = &n->edges[i];
            if (e->node) {
                if (e->node->epoch != epoch) {
                    e->node->epoch = epoch;
                    e->node->deps = 0;
                    nb_tensor_free(e->node->grad);
                    e->node->grad = NULL;
                    if (!vec_push(&stack, e->node)) st = NB_ENOMEM;
                }
                e->node->deps++;
            } else if (e->leaf && cap) {
                if (capture_index(cap, e->leaf) < 0) {
                    st = nb__error(NB_ESTATE, "recompute: the replay of the function read a "
                                   "tensor that requires grad which its first run did not "
                                   "(the function must do the same work both times)");
                    break;
                }
            } else if (e->leaf) {
                struct nb__ag_meta *m = meta_of(e->leaf);
                if (!m) { st = NB_ENOMEM; break; }
                if (m->epoch != epoch) m->epoch = epoch, m->pending = 0, m->got = false;
                m->pending++;
            }
        }
    }
    nb_host_free(stack.items);
    if (st != NB_OK) return st;

    /* Pass 2: run rules latest node first; a node runs when all its consumers have. */
    nb_tensor_free(root->grad);
    root->grad = nb_tensor_retain(gout);
    if (!heap_push(&heap, root)) return NB_ENOMEM;
    bool prev = nb_set_grad_enabled(false);
    nb_tensor *gin_small[8];
    while (heap.n) {
        nb__node *n = heap_pop(&heap);
        nb_tensor *g = n->grad;
        n->grad = NULL;
        nb_tensor **gin = n->ninputs <= 8 ? gin_small
                                          : nb_host_alloc(sizeof(nb_tensor *) * (size_t)n->ninputs);
        if (!gin) { st = NB_ENOMEM; nb_tensor_free(g); break; }
        memset(gin, 0, sizeof(nb_tensor *) * (size_t)n->ninputs);
        int tok = NB__SPAN_BEGIN(bw_span_names[n->op], NULL, NB__CAT_BACKWARD);
        nb_scope_begin();
        if (g && st == NB_OK) {
            nb__backward_fn rule = nb__backward_rules[n->op];
            if (!rule) st = nb__error(NB_EUNSUPPORTED, "backward: %s has no backward rule",
                                      nb__op_names[n->op]);
            for (nb__node_hook *h = n->pre_hooks; h && st == NB_OK; h = h->next) st = h->fn(h->ctx);
            if (st == NB_OK && (st = check_saved(n)) == NB_OK) st = rule(n, g, gin);
        }
        for (int i = 0; i < n->ninputs; i++) {
            nb__edge *e = &n->edges[i];
            if (!e->node && !e->leaf) continue;
            nb_tensor *gi = (st == NB_OK && gin[i]) ? fit_to_edge(gin[i], e) : NULL;
            if (st == NB_OK && gin[i] && !gi) st = nb_last_status();
            if (e->node) {
                if (gi && st == NB_OK) st = accumulate(&e->node->grad, gi, true);
                if (--e->node->deps == 0 && !heap_push(&heap, e->node)) st = NB_ENOMEM;
            } else if (cap) {
                if (gi && st == NB_OK)
                    st = accumulate(&cap->grads[capture_index(cap, e->leaf)], gi, true);
            } else if (st == NB_OK) {
                st = leaf_contribution(e->leaf, gi, epoch);
            }
        }
        nb_scope_end();
        NB__SPAN_END(tok);
        if (gin != gin_small) nb_host_free(gin);
        nb_tensor_free(g);
        if (!retain) {
            nb__node_release_saved(n);
            n->released = true;
        }
    }
    nb_set_grad_enabled(prev);
    nb_host_free(heap.items);
    return st;
}

nb_status nb_backward(nb_tensor *output) { return nb_backward_ex(output, NULL); }

nb_backward_opts nb_backward_defaults(void) {
    return (nb_backward_opts){._init = NB__OPTS_MARK(nb_backward_opts)};
}

static nb_status backward_run(nb_tensor *out, const nb_backward_opts *opts) {
    if (!nb__arg_ok(out, "backward", "output")) return nb_last_status();
    if (opts && NB__OPTS_CHECK(opts, nb_backward_opts, "backward", "nb_backward_defaults()",
                               "o.grad_output = g") != NB_OK)
        return nb_last_status();
    nb_backward_opts o = opts ? *opts : nb_backward_defaults();
    if (o.grad_output && !nb__live(o.grad_output))
        return nb__dead_handle(o.grad_output, "backward", ".grad_output"), NB_EFREED;
    if (!out->requires_grad)
        return nb__error(NB_EINVAL, "backward: the output does not require grad (no input of "
                         "the ops that produced it requires grad, or grad mode was off)");
    nb_scope_begin();
    nb_tensor *g = o.grad_output;
    nb_status st = NB_OK;
    if (!g) {
        if (nb_numel(out) != 1)
            st = nb__error(NB_EINVAL, "backward: the output %s has %lld elements; pass "
                           ".grad_output for outputs that are not a single element",
                           NB__SHAPE(out), (long long)nb_numel(out));
        else g = nb_ones_on(nb__device_of(out), out->shape, out->ndim, out->dtype);
    } else if (g->ndim != out->ndim ||
               memcmp(g->shape, out->shape, sizeof(int64_t) * (size_t)out->ndim) != 0) {
        st = nb__error(NB_ESHAPE, "backward: grad_output of shape %s for an output of shape %s",
                       NB__SHAPE(g), NB__SHAPE(out));
    }
    if (st == NB_OK && !g) st = nb_last_status();
    if (st == NB_OK) {
        uint64_t epoch = atomic_fetch_add(&g_epoch, 1) + 1;
        if (!out->grad_fn) { /* the output is itself a leaf */
            struct nb__ag_meta *m = meta_of(out);
            if (!m) st = NB_ENOMEM;
            else {
                m->epoch = epoch, m->pending = 1, m->got = false;
                st = leaf_contribution(out, g, epoch);
            }
        } else {
            st = backward_graph(out->grad_fn, g, o.retain_graph, epoch, NULL);
        }
    }
    nb_scope_end();
    return st;
}

/* Hooks run inside the walk may queue end-of-backward callbacks (data parallel's bucket
 * waits); they run when the outermost backward on this thread is over, so a backward
 * called from inside a backward's rule or hook does not end its caller's step. */
nb_status nb_backward_ex(nb_tensor *out, const nb_backward_opts *opts) {
    int tok = NB__SPAN_BEGIN("backward", NULL, NB__CAT_BACKWARD);
    tl_depth++;
    /* The rules compute in the dtypes the forward saved: autocast off (nabla/autocast.h). */
    nb_dtype ac = nb__autocast_suspend();
    nb_status st = backward_run(out, opts);
    if (--tl_depth == 0 && tl_ncb) st = run_end_callbacks(st);
    nb__autocast_resume(ac);
    NB__SPAN_END(tok);
    return st;
}

nb_status nb__grad_of(nb_tensor *out, nb_tensor *gout, nb_tensor *const *wrt, int n,
                      nb_tensor **grads) {
    for (int i = 0; i < n; i++) grads[i] = NULL;
    if (!out->grad_fn) { /* out is itself a leaf */
        int i = 0;
        while (i < n && wrt[i] != out) i++;
        if (i < n) grads[i] = nb_tensor_retain(gout);
        return NB_OK;
    }
    capture cap = {wrt, grads, n};
    uint64_t epoch = atomic_fetch_add(&g_epoch, 1) + 1;
    nb_status st = backward_graph(out->grad_fn, gout, false, epoch, &cap);
    if (st != NB_OK)
        for (int i = 0; i < n; i++) nb_tensor_free(grads[i]), grads[i] = NULL;
    return st;
}
