/* recompute.c - activation checkpointing: nb_recompute (nabla/autograd.h) and the backward
 * rule of its node, NB__OP_RECOMPUTE.
 *
 * Forward: the function runs with grad mode off inside a scope of its own, so none of its
 * intermediate tensors outlives the call, while the tape's leaf collector (tensor/tape.h)
 * notes every leaf requiring grad the function read (its parameters). The node's edges are
 * the inputs followed by those leaves; it keeps detached views of the inputs (versioned, as
 * nb__save does) and the states of the generators the function may draw from.
 *
 * Backward (the rule): the generators are set back to the states the forward started from,
 * the function runs again with grad mode on over fresh leaves that share the inputs' storage,
 * and nb__grad_of walks the replayed graph from its output with the incoming gradient,
 * capturing the gradients of those fresh leaves and of the parameters. The rule hands them
 * back as the gradients of its edges, so the outer walk accumulates them into the inputs'
 * producers and into the parameters' .grad like any other rule's, and a parameter's hooks run
 * once, when its last contribution in the whole backward arrives. The generators are then put
 * back where the backward found them, so a replay draws nothing from the stream. */
#include <stdio.h>
#include <string.h>

#include "autograd/autograd_impl.h"
#include "nabla/random.h"
#include "tensor/autocast.h"

typedef struct {
    nb_generator *g;
    uint64_t seed, stream, offset;
} gen_state;

struct nb__recompute {
    nb_recompute_fn fn;
    void *ctx;
    int ninputs;           /* edges [0, ninputs) are the inputs, the rest the leaves */
    nb_tensor **inputs;    /* detached views (NULL where the input was NULL) */
    uint64_t *versions;    /* their storages' versions when saved */
    gen_state gens[2];     /* the thread default generator, and opts.gen when another */
    int ngens;
    nb_dtype autocast;     /* the autocast dtype the forward ran under (NB_F32: off) */
};

static void recompute_free(void *ext) {
    struct nb__recompute *rc = ext;
    if (!rc) return;
    for (int i = 0; i < rc->ninputs; i++) nb_tensor_free(rc->inputs[i]);
    nb_host_free(rc->inputs);
    nb_host_free(rc->versions);
    nb_host_free(rc);
}

nb_status nb__recompute_check(const nb__node *n) {
    const struct nb__recompute *rc = n->ext;
    if (!rc) return NB_OK; /* released: pass 1 reports that */
    for (int i = 0; i < rc->ninputs; i++) {
        const nb_tensor *s = rc->inputs[i];
        if (!s || nb__version_of(s) == rc->versions[i]) continue;
        return nb__error(NB_EINVAL, "backward: input %d of a recompute was modified in place "
                         "after the forward (version %llu, expected %llu); clone it before "
                         "writing to it", i, (unsigned long long)nb__version_of(s),
                         (unsigned long long)rc->versions[i]);
    }
    return NB_OK;
}

nb_recompute_opts nb_recompute_defaults(void) {
    return (nb_recompute_opts){._init = NB__OPTS_MARK(nb_recompute_opts)};
}

static gen_state state_of(nb_generator *g) {
    return (gen_state){g, nb_generator_seed(g), nb_generator_stream(g), nb_generator_offset(g)};
}

static void set_state(const gen_state *s) {
    if (s->g == nb_default_generator() && nb_generator_seed(s->g) != s->seed)
        nb_manual_seed(s->seed); /* the seed of another generator never changes */
    nb_generator_set_stream(s->g, s->stream);
    nb_generator_set_offset(s->g, s->offset);
}

/* The function's output as a tensor of its own: a fresh header when the function returned
 * one of its inputs or a leaf (the node must not land on a tensor the caller holds). */
static nb_tensor *own_output(nb_tensor *y) {
    if (!y->requires_grad && !y->grad_fn) return y;
    nb_tensor *v = nb__view_of(y, y->shape, y->strides, y->ndim, y->offset);
    return v;
}

nb_tensor *nb_recompute(nb_recompute_fn fn, nb_tensor *const *inputs, int n, void *ctx,
                        const nb_recompute_opts *opts) {
    if (!fn) {
        nb__error(NB_ENULL, "recompute: fn is NULL");
        return NULL;
    }
    if (n < 0 || (n > 0 && !inputs)) {
        nb__error(NB_EINVAL, "recompute: needs n >= 0 inputs (got %d%s)", n,
                  n > 0 ? " and inputs NULL" : "");
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (inputs[i] && !nb__arg_ok(inputs[i], "recompute", "inputs")) return NULL;
    if (opts && NB__OPTS_CHECK(opts, nb_recompute_opts, "recompute", "nb_recompute_defaults()",
                               "o.gen = gen") != NB_OK)
        return NULL;
    if (!nb_grad_enabled()) return fn(inputs, n, ctx); /* nothing to record */
    nb_recompute_opts o = opts ? *opts : nb_recompute_defaults();

    gen_state gens[2] = {state_of(nb_default_generator())};
    int ngens = 1;
    if (o.gen && o.gen != nb_default_generator()) gens[ngens++] = state_of(o.gen);

    nb__leaf_set leaves = {.skip = inputs, .nskip = n};
    bool prev = nb_set_grad_enabled(false);
    nb__leaf_set *prev_set = nb__collect_begin(&leaves);
    nb_scope_begin();
    nb_tensor *y = nb_keep(fn(inputs, n, ctx));
    nb_scope_end();
    nb__collect_end(prev_set);
    nb_set_grad_enabled(prev);
    if (!y) {
        if (nb_last_status() == NB_OK)
            nb__error(NB_EINVAL, "recompute: the function returned NULL without an error");
        nb_host_free(leaves.items);
        return NULL;
    }
    if (leaves.failed || leaves.nonleaf) {
        nb_host_free(leaves.items);
        if (leaves.failed) nb__error(NB_ENOMEM, "recompute: out of memory");
        else /* the replay's graph would reach into the caller's */
            nb__error(NB_EINVAL, "recompute: the function read a tensor of shape %s that "
                      "requires grad and was computed outside it by %s; pass it as one of "
                      "the inputs", NB__SHAPE(leaves.nonleaf),
                      nb__op_names[leaves.nonleaf->grad_fn->op]);
        return NULL;
    }

    /* The edges: the inputs, then the leaves the function read. */
    int ne = n + leaves.n;
    nb_tensor **edges = nb_host_alloc(sizeof(nb_tensor *) * (size_t)(ne ? ne : 1));
    struct nb__recompute *rc = nb_host_alloc(sizeof *rc);
    nb_tensor **saved = nb_host_alloc(sizeof(nb_tensor *) * (size_t)(n ? n : 1));
    uint64_t *versions = nb_host_alloc(sizeof(uint64_t) * (size_t)(n ? n : 1));
    bool alloc_ok = edges && rc && saved && versions, record = false;
    if (alloc_ok) {
        if (n) memcpy(edges, inputs, sizeof(nb_tensor *) * (size_t)n);
        if (leaves.n) memcpy(edges + n, leaves.items, sizeof(nb_tensor *) * (size_t)leaves.n);
        record = nb__needs_grad(edges, ne);
    }
    nb_host_free(leaves.items);
    nb_tensor *out = record ? own_output(y) : y;
    if (!alloc_ok || !record || !out) { /* out of memory, or nothing requires grad */
        nb_host_free(edges), nb_host_free(rc), nb_host_free(saved), nb_host_free(versions);
        if (!alloc_ok || !out) {
            nb__error(NB_ENOMEM, "recompute: out of memory");
            return NULL;
        }
        return y; /* a plain result */
    }
    memset(rc, 0, sizeof *rc);
    rc->fn = fn, rc->ctx = ctx, rc->ninputs = n, rc->inputs = saved, rc->versions = versions;
    memcpy(rc->gens, gens, sizeof gens);
    rc->ngens = ngens;
    rc->autocast = nb_autocast_dtype();
    bool ok = true;
    for (int i = 0; i < n; i++) {
        saved[i] = NULL;
        nb_tensor *t = inputs[i];
        if (!t) continue;
        nb_tensor *v = nb__view_of(t, t->shape, t->strides, t->ndim, t->offset);
        if (!v) ok = false;
        saved[i] = v ? nb__scope_take(v) : NULL; /* owned by the node: no grad_fn, no cycle */
        versions[i] = nb__version_of(t);
    }
    nb__node *nd = ok ? nb__record(out, NB__OP_RECOMPUTE, edges, ne) : NULL;
    nb_host_free(edges);
    if (!nd) {
        recompute_free(rc);
        return NULL;
    }
    nd->ext = rc;
    nd->ext_free = recompute_free;
    return out;
}

nb_status nb__bw_RECOMPUTE(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    struct nb__recompute *rc = n->ext;
    const int ni = rc->ninputs, ne = n->ninputs;
    nb_tensor **wrt = nb_host_alloc(sizeof(nb_tensor *) * (size_t)ne);
    nb_tensor **grads = nb_host_alloc(sizeof(nb_tensor *) * (size_t)ne);
    int *slot = nb_host_alloc(sizeof(int) * (size_t)ne); /* wrt index -> edge */
    if (!wrt || !grads || !slot) {
        nb_host_free(wrt), nb_host_free(grads), nb_host_free(slot);
        return nb__error(NB_ENOMEM, "recompute backward: out of memory");
    }
    nb_status st = NB_OK;
    nb_scope_begin();
    /* Fresh leaves over the saved inputs: the replay's graph ends at them. */
    nb_tensor **in = nb_host_alloc(sizeof(nb_tensor *) * (size_t)(ni ? ni : 1));
    int nw = 0;
    if (!in) st = nb__error(NB_ENOMEM, "recompute backward: out of memory");
    for (int i = 0; st == NB_OK && i < ni; i++) {
        nb_tensor *s = rc->inputs[i];
        in[i] = s ? nb__view_of(s, s->shape, s->strides, s->ndim, s->offset) : NULL;
        if (s && !in[i]) st = nb_last_status();
        else if (in[i] && (n->edges[i].node || n->edges[i].leaf)) {
            in[i]->requires_grad = true;
            wrt[nw] = in[i], slot[nw++] = i;
        }
    }
    for (int i = ni; i < ne; i++) wrt[nw] = n->edges[i].leaf, slot[nw++] = i;

    nb_tensor *y = NULL;
    if (st == NB_OK) {
        gen_state now[2];
        for (int i = 0; i < rc->ngens; i++) now[i] = state_of(rc->gens[i].g), set_state(&rc->gens[i]);
        bool prev = nb_set_grad_enabled(true);
        /* the replay computes in the dtypes the forward did (the engine runs rules with
         * autocast off), so its values, and the gradients, are the forward's */
        int ac = nb__autocast_replay_begin(rc->autocast);
        y = ac < 0 ? NULL : rc->fn(in, ni, rc->ctx);
        nb__autocast_replay_end(ac);
        nb_set_grad_enabled(prev);
        for (int i = 0; i < rc->ngens; i++) set_state(&now[i]);
        if (!y && nb_last_status() != NB_OK) {
            char msg[400];
            snprintf(msg, sizeof msg, "%s", nb_last_error());
            st = nb__error(nb_last_status(), "recompute backward: the function failed when "
                           "replayed: %s", msg);
        } else if (!y) {
            st = nb__error(NB_EINVAL, "recompute backward: the function returned NULL when "
                           "replayed");
        }
    }
    if (st == NB_OK && (y->ndim != n->out_ndim || y->dtype != n->out_dtype ||
                        memcmp(y->shape, n->out_shape, sizeof(int64_t) * (size_t)y->ndim) != 0))
        st = nb__error(NB_ESTATE, "recompute backward: the replay returned a %s tensor of shape "
                       "%s where the forward returned %s (the function must do the same work "
                       "both times)", nb_dtype_name(y->dtype), NB__SHAPE(y),
                       nb_dtype_name(n->out_dtype));
    if (st == NB_OK && y->requires_grad) {
        st = nb__grad_of(y, g, wrt, nw, grads);
        for (int j = 0; j < nw; j++) {
            if (st == NB_OK) gin[slot[j]] = grads[j]; /* handed to the outer scope below */
            else nb_tensor_free(grads[j]);
        }
    }
    nb_host_free(in);
    nb_scope_end(); /* frees the replayed graph */
    for (int j = 0; st == NB_OK && j < nw; j++)
        if (gin[slot[j]]) nb__scope_add(gin[slot[j]]);
    nb_host_free(wrt), nb_host_free(grads), nb_host_free(slot);
    return st;
}
