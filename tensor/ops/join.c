/* join.c - definitions of cat, stack, split and chunk.
 *
 * cat and stack allocate the output on their inputs' device (all must share one) and copy
 * each input into its slot (a narrowed or selected view of the output) with nb_copy_, which
 * dispatches to the device's copy kernel, handles any input strides and converts dtypes;
 * nothing here touches tensor data. Inputs of different dtypes are promoted
 * like PyTorch (torch.cat promotes since 1.5): the output dtype is nb_dtype_promote over all
 * inputs. As in PyTorch's legacy behaviour, cat skips 1-D empty tensors of shape [0] in
 * the shape checks (they contribute nothing), so cat([empty(0), x]) works for any x.
 *
 * split and chunk only create views (nb_narrow); nothing is copied.
 *
 * Autograd: cat and stack copy with grad mode off and record one node over all their
 * inputs; input i's gradient is the narrowed (cat) or selected (stack) part of g, converted
 * back to the input's dtype by the engine. split and chunk are views and record themselves
 * (through nb_narrow). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/tape.h"

/* Checks the list itself: non-NULL, n >= 1, every entry non-NULL, all on one device (*dev). */
static bool list_ok(nb_tensor *const *ts, int n, const char *op, nb_device *dev) {
    if (!ts) {
        if (nb_last_status() == NB_OK) nb__error(NB_ENULL, "%s: the tensor list is NULL", op);
        return false;
    }
    if (n < 1) {
        nb__error(NB_EINVAL, "%s: expected a non-empty list of tensors, got %d", op, n);
        return false;
    }
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "tensors[%d]", i);
        if (!nb__arg_ok(ts[i], op, name)) return false;
    }
    return nb__check_devices(op, ts, n, dev);
}

static nb_dtype promote_all(nb_tensor *const *ts, int n) {
    nb_dtype dt = ts[0]->dtype;
    for (int i = 1; i < n; i++) dt = nb_dtype_promote(dt, ts[i]->dtype);
    return dt;
}

/* PyTorch's legacy rule: a 1-D tensor with no elements is ignored by cat. */
static bool legacy_empty(const nb_tensor *t) { return t->ndim == 1 && t->shape[0] == 0; }

static nb_tensor *cat_impl(nb_tensor *const *ts, int n, int dim) {
    nb_device dev;
    if (!list_ok(ts, n, "cat", &dev)) return NULL;
    nb_dtype dt = promote_all(ts, n);
    int ref = -1;
    for (int i = 0; i < n && ref < 0; i++)
        if (!legacy_empty(ts[i])) ref = i;
    if (ref < 0) { /* only [0]-shaped inputs: the result is one too */
        if (nb__wrap_dim(dim, 1, "cat") < 0) return NULL;
        return nb__empty((int64_t[]){0}, 1, dt, dev);
    }
    const nb_tensor *r = ts[ref];
    int d = -1;
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        const nb_tensor *t = ts[i];
        if (legacy_empty(t)) continue;
        if (t->ndim == 0) {
            nb__error(NB_ESHAPE, "cat: tensor %d is 0-dim; zero-dimensional tensors cannot be "
                      "concatenated (unsqueeze them or use stack)", i);
            return NULL;
        }
        if (d < 0 && (d = nb__wrap_dim(dim, r->ndim, "cat")) < 0) return NULL;
        if (t->ndim != r->ndim) {
            nb__error(NB_ESHAPE, "cat: tensor %d has %d dims but tensor %d has %d (shapes %s "
                      "and %s)", i, t->ndim, ref, r->ndim, NB__SHAPE(t), NB__SHAPE(r));
            return NULL;
        }
        for (int j = 0; j < r->ndim; j++) {
            if (j != d && t->shape[j] != r->shape[j]) {
                nb__error(NB_ESHAPE, "cat: tensor %d has shape %s but tensor %d has shape %s; "
                          "sizes must match except in dim %d", i, NB__SHAPE(t), ref,
                          NB__SHAPE(r), d);
                return NULL;
            }
        }
        total += t->shape[d];
    }
    int64_t sh[NB_MAX_DIMS];
    memcpy(sh, r->shape, sizeof sh);
    sh[d] = total;
    nb_scope_begin();
    nb_tensor *out = nb__empty(sh, r->ndim, dt, dev);
    int64_t off = 0;
    for (int i = 0; i < n && out; i++) {
        nb_tensor *t = ts[i];
        if (legacy_empty(t) || t->shape[d] == 0) continue;
        nb_tensor *slot = nb_narrow(out, d, off, t->shape[d]);
        if (!slot || nb_copy_(slot, t) != NB_OK) out = NULL; /* freed by the scope */
        off += t->shape[d];
    }
    nb_keep(out);
    nb_scope_end();
    return out;
}

static nb_tensor *stack_impl(nb_tensor *const *ts, int n, int dim) {
    nb_device dev;
    if (!list_ok(ts, n, "stack", &dev)) return NULL;
    const nb_tensor *r = ts[0];
    if (r->ndim >= NB_MAX_DIMS) {
        nb__error(NB_ESHAPE, "stack: inputs of shape %s leave no room for the new dim (at most "
                  "%d dims)", NB__SHAPE(r), NB_MAX_DIMS);
        return NULL;
    }
    int d = nb__wrap_dim(dim, r->ndim + 1, "stack");
    if (d < 0) return NULL;
    for (int i = 1; i < n; i++) {
        const nb_tensor *t = ts[i];
        if (t->ndim != r->ndim ||
            memcmp(t->shape, r->shape, sizeof(int64_t) * (size_t)r->ndim) != 0) {
            nb__error(NB_ESHAPE, "stack: tensor %d has shape %s but tensor 0 has shape %s; all "
                      "tensors must have the same shape", i, NB__SHAPE(t), NB__SHAPE(r));
            return NULL;
        }
    }
    int64_t sh[NB_MAX_DIMS];
    for (int i = 0, k = 0; i <= r->ndim; i++) sh[i] = i == d ? n : r->shape[k++];
    nb_scope_begin();
    nb_tensor *out = nb__empty(sh, r->ndim + 1, promote_all(ts, n), dev);
    if (out && nb_numel(out) > 0) {
        for (int i = 0; i < n; i++) {
            nb_tensor *slot = nb_select(out, d, i);
            if (!slot || nb_copy_(slot, ts[i]) != NB_OK) {
                out = NULL; /* freed by the scope */
                break;
            }
        }
    }
    nb_keep(out);
    nb_scope_end();
    return out;
}

/* ---- autograd ------------------------------------------------------------------------------ */
nb_tensor *nb_cat(nb_tensor *const *ts, int n, int dim) {
    bool prev = nb_set_grad_enabled(false);
    nb_tensor *out = cat_impl(ts, n, dim);
    nb_set_grad_enabled(prev);
    nb__node *nd = nb__record(out, NB__OP_CAT, ts, n);
    if (nd) {
        /* The dim as cat resolved it: against the first input that is not a legacy empty
         * one (any dim is fine when all are: nothing is narrowed then). */
        int ref = 0;
        while (ref < n - 1 && legacy_empty(ts[ref])) ref++;
        int d = nb__wrap_dim(dim, ts[ref]->ndim, "cat");
        nd->attrs.i[0] = d < 0 ? 0 : d;
    }
    return out;
}

nb_tensor *nb_stack(nb_tensor *const *ts, int n, int dim) {
    bool prev = nb_set_grad_enabled(false);
    nb_tensor *out = stack_impl(ts, n, dim);
    nb_set_grad_enabled(prev);
    nb__node *nd = nb__record(out, NB__OP_STACK, ts, n);
    if (nd) nd->attrs.i[0] = nb__wrap_dim(dim, ts[0]->ndim + 1, "stack");
    return out;
}

static bool needs(const nb__node *n, int i) { return n->edges[i].node || n->edges[i].leaf; }

/* Input i's gradient: its slice [off, off + len) of g along the cat dim. */
nb_status nb__bw_CAT(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    int d = (int)n->attrs.i[0];
    int64_t off = 0;
    for (int i = 0; i < n->ninputs; i++) {
        const nb__edge *e = &n->edges[i];
        if (e->ndim == 1 && e->shape[0] == 0) { /* skipped by cat: an empty gradient */
            if (needs(n, i) && !(gin[i] = nb_zeros_on(nb__device_of(g), e->shape, 1, g->dtype)))
                return nb_last_status();
            continue;
        }
        int64_t len = e->shape[d];
        if (needs(n, i) && !(gin[i] = nb_narrow(g, d, off, len))) return nb_last_status();
        off += len;
    }
    return NB_OK;
}

nb_status nb__bw_STACK(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    int d = (int)n->attrs.i[0];
    for (int i = 0; i < n->ninputs; i++)
        if (needs(n, i) && !(gin[i] = nb_select(g, d, i))) return nb_last_status();
    return NB_OK;
}

/* ---- split / chunk ------------------------------------------------------------------------- */
static int failed_status(void) {
    nb_status s = nb_last_status();
    return s != NB_OK ? (int)s : (int)NB_EINTERNAL;
}

/* Writes count views of t along d into out: piece i starts at i * size and has size
 * min(size, n - start). On any failure nothing stays referenced and out is untouched. */
static int make_pieces(nb_tensor *t, int d, int64_t size, int64_t count, nb_tensor **out,
                       int max_out, const char *op) {
    if (!out || count > max_out) {
        return nb__error(NB_EINVAL, "%s: %lld pieces do not fit in out[] of %d entries", op,
                         (long long)count, out ? max_out : 0);
    }
    int64_t n = t->shape[d];
    nb_tensor *views[64], **v = count <= 64 ? views : malloc(sizeof(nb_tensor *) * (size_t)count);
    if (!v) return nb__error(NB_ENOMEM, "%s: out of memory", op);
    /* An inner scope owns the views until all exist, so a failure releases them all. */
    nb_scope_begin();
    int64_t made = 0;
    for (; made < count; made++) {
        int64_t start = made * size, len = n - start < size ? n - start : size;
        if (len < 0) len = 0, start = n;
        if (!(v[made] = nb_narrow(t, d, start, len))) break;
    }
    int rc = made == count ? (int)count : failed_status();
    if (made == count) {
        /* Hand them to the caller's scope, last first (nb_keep finds the latest fastest). */
        for (int64_t i = count - 1; i >= 0; i--) out[i] = nb_keep(v[i]);
    }
    nb_scope_end();
    if (v != views) free(v);
    return rc;
}

static int split_dim(nb_tensor *t, int dim, const char *op) {
    if (!nb__arg_ok(t, op, "t")) return failed_status();
    if (t->ndim == 0)
        return nb__error(NB_EDIM, "%s: expected a tensor with at least 1 dim, got a 0-dim "
                         "tensor", op);
    int d = nb__wrap_dim(dim, t->ndim, op);
    return d < 0 ? (int)NB_EDIM : d;
}

int nb_split(nb_tensor *t, int64_t split_size, int dim, nb_tensor **out, int max_out) {
    int d = split_dim(t, dim, "split");
    if (d < 0) return d;
    int64_t n = t->shape[d];
    if (split_size < 0 || (split_size == 0 && n != 0))
        return nb__error(NB_EINVAL, "split: split_size must be positive (or 0 for an empty "
                         "dim), got %lld for dim %d of size %lld", (long long)split_size, d,
                         (long long)n);
    /* As torch.split: ceil(n / split_size) pieces, and one empty piece for an empty dim. */
    int64_t count = split_size ? (n + split_size - 1) / split_size : 1;
    if (count < 1) count = 1;
    return make_pieces(t, d, split_size, count, out, max_out, "split");
}

int nb_chunk(nb_tensor *t, int chunks, int dim, nb_tensor **out, int max_out) {
    int d = split_dim(t, dim, "chunk");
    if (d < 0) return d;
    if (chunks < 1)
        return nb__error(NB_EINVAL, "chunk: chunks must be positive, got %d", chunks);
    int64_t n = t->shape[d];
    /* torch.chunk: pieces of ceil(n / chunks), so fewer than `chunks` may come back; an
     * empty dim gives `chunks` empty pieces. */
    if (n == 0) return make_pieces(t, d, 0, chunks, out, max_out, "chunk");
    int64_t size = (n + chunks - 1) / chunks;
    return make_pieces(t, d, size, (n + size - 1) / size, out, max_out, "chunk");
}
