/* index.c - definitions of the indexing ops: index_select, gather, scatter_add, embedding,
 * masked_fill, one_hot, tril and triu (argument checks, output shape and dtype, one kernel
 * of the operands' device each: tensor/kernels/index.h).
 *
 * Index values are data, which an op definition never reads: the kernels check every value
 * against its dim BEFORE writing any output, so a bad index is an NB_EINDEX error
 * ("gather: index 12 is out of range for dim 1 of size 10") and never an out-of-bounds
 * access; the output allocated for the call is released again. On the meta device nothing
 * is checked (there are no values). As in PyTorch, these ops take no negative indices.
 * Index operands are I32 or I64; data operands may be of any dtype. Semantics follow
 * PyTorch (torch.index_select, torch.gather, Tensor.scatter_add, F.embedding, masked_fill,
 * F.one_hot, torch.tril/triu).
 *
 * Autograd: each differentiable op runs its body with grad mode off (scatter_add's clone and
 * conversions must not record) and records one node with the original inputs. The rules
 * are at the end of this file; one_hot has an integer input and records nothing. */
#include <string.h>

#include "tensor/tape.h"
#include "tensor/backend.h"

static bool index_dtype_ok(const nb_tensor *idx, const char *op, const char *name) {
    if (idx->dtype == NB_I32 || idx->dtype == NB_I64) return true;
    nb__error(NB_EDTYPE, "%s: %s must have dtype i32 or i64, got %s", op, name,
              nb_dtype_name(idx->dtype));
    return false;
}

/* out, or NULL (out released) when its kernel failed: a fresh result never outlives an
 * error. */
static nb_tensor *result(nb_tensor *out, nb_status st) {
    if (out && st != NB_OK) {
        nb_tensor_free(nb__scope_take(out));
        return NULL;
    }
    return out;
}

/* ---- index_select / embedding ------------------------------------------------------------ */
/* out (shape sh[nd], on dev) = x's slices along d picked by index (checked by the kernel). */
static nb_tensor *select_rows(nb_tensor *x, int d, nb_tensor *index, const int64_t *sh, int nd,
                              nb_device dev, const char *op) {
    nb_scope_begin();
    nb_tensor *out = NULL, *ic = nb_contiguous(index);
    if (ic) out = nb__empty(sh, nd, x->dtype, dev);
    if (out) {
        nb__index_select_args a = {.dim = d, .op = op};
        nb__view_init(&a.out, out);
        nb__view_init(&a.x, x);
        nb__view_init(&a.index, ic);
        if (nb__run_index_select(dev, op, &a) != NB_OK) out = NULL; /* freed by the scope */
    }
    nb_keep(out);
    nb_scope_end();
    return out;
}

static nb_tensor *index_select_impl(nb_tensor *x, int dim, nb_tensor *index) {
    NB__CHECK_ARG(x, "index_select", "x");
    NB__CHECK_ARG(index, "index_select", "index");
    nb_device dev;
    if (!nb__check_devices("index_select", (nb_tensor *[]){x, index}, 2, &dev)) return NULL;
    int d = nb__wrap_dim(dim, x->ndim, "index_select");
    if (d < 0 || !index_dtype_ok(index, "index_select", "index")) return NULL;
    if (index->ndim > 1) {
        nb__error(NB_ESHAPE, "index_select: index must be 1-D, got shape %s", NB__SHAPE(index));
        return NULL;
    }
    int64_t m = nb_numel(index);
    if (x->ndim == 0 && m != 1) {
        nb__error(NB_ESHAPE, "index_select: the index of a 0-dim input must have one element, "
                  "got %lld", (long long)m);
        return NULL;
    }
    int64_t sh[NB_MAX_DIMS];
    memcpy(sh, x->shape, sizeof sh);
    if (x->ndim) sh[d] = m;
    return select_rows(x, d, index, sh, x->ndim, dev, "index_select");
}

static nb_tensor *embedding_impl(nb_tensor *weight, nb_tensor *indices) {
    NB__CHECK_ARG(weight, "embedding", "weight");
    NB__CHECK_ARG(indices, "embedding", "indices");
    nb_device dev;
    if (!nb__check_devices("embedding", (nb_tensor *[]){weight, indices}, 2, &dev)) return NULL;
    if (weight->ndim != 2) {
        nb__error(NB_ESHAPE, "embedding: weight must be 2-D (num_embeddings, dim), got shape %s",
                  NB__SHAPE(weight));
        return NULL;
    }
    if (!index_dtype_ok(indices, "embedding", "indices")) return NULL;
    if (indices->ndim >= NB_MAX_DIMS) {
        nb__error(NB_ESHAPE, "embedding: indices of shape %s leave no room for the embedding "
                  "dim (at most %d dims)", NB__SHAPE(indices), NB_MAX_DIMS);
        return NULL;
    }
    /* (indices..., D) is laid out exactly as index_select(weight, 0, flat indices) */
    int64_t sh[NB_MAX_DIMS];
    memcpy(sh, indices->shape, sizeof(int64_t) * (size_t)indices->ndim);
    sh[indices->ndim] = weight->shape[1];
    return select_rows(weight, 0, indices, sh, indices->ndim + 1, dev, "embedding");
}

/* ---- gather / scatter_add --------------------------------------------------------------------- */
/* Shared checks of gather and scatter_add: same ndim, index no larger than x off dim. */
static bool index_fits(const nb_tensor *x, const nb_tensor *index, int d, const char *op) {
    if (index->ndim != x->ndim) {
        nb__error(NB_ESHAPE, "%s: index has %d dims but the input has %d (shapes %s and %s)", op,
                  index->ndim, x->ndim, NB__SHAPE(index), NB__SHAPE(x));
        return false;
    }
    for (int i = 0; i < x->ndim; i++) {
        if (i != d && index->shape[i] > x->shape[i]) {
            nb__error(NB_ESHAPE, "%s: index of shape %s is larger than the input of shape %s "
                      "at dim %d", op, NB__SHAPE(index), NB__SHAPE(x), i);
            return false;
        }
    }
    return true;
}

static nb_tensor *gather_impl(nb_tensor *x, int dim, nb_tensor *index) {
    NB__CHECK_ARG(x, "gather", "x");
    NB__CHECK_ARG(index, "gather", "index");
    nb_device dev;
    if (!nb__check_devices("gather", (nb_tensor *[]){x, index}, 2, &dev)) return NULL;
    int d = nb__wrap_dim(dim, x->ndim, "gather");
    if (d < 0 || !index_dtype_ok(index, "gather", "index") || !index_fits(x, index, d, "gather"))
        return NULL;
    nb_scope_begin();
    nb_tensor *out = NULL, *ic = nb_contiguous(index);
    if (ic) out = nb__empty(index->shape, index->ndim, x->dtype, dev);
    if (out) {
        nb__gather_args a = {.dim = d, .op = "gather"};
        nb__view_init(&a.out, out);
        nb__view_init(&a.x, x);
        nb__view_init(&a.index, ic);
        if (nb__run_gather(dev, "gather", &a) != NB_OK) out = NULL; /* freed by the scope */
    }
    nb_keep(out);
    nb_scope_end();
    return out;
}

/* out += src at index along d, in place by the kernel (which checks the index). */
static bool scatter_into(nb_tensor *out, int d, nb_tensor *ic, nb_tensor *src, nb_device dev) {
    nb__scatter_add_args a = {.dim = d, .op = "scatter_add"};
    nb__view_init(&a.out, out);
    nb__view_init(&a.index, ic);
    nb__view_init(&a.src, src);
    return nb__run_scatter_add(dev, "scatter_add", &a) == NB_OK;
}

static nb_tensor *scatter_add_impl(nb_tensor *x, int dim, nb_tensor *index, nb_tensor *src) {
    NB__CHECK_ARG(x, "scatter_add", "x");
    NB__CHECK_ARG(index, "scatter_add", "index");
    NB__CHECK_ARG(src, "scatter_add", "src");
    nb_device dev;
    if (!nb__check_devices("scatter_add", (nb_tensor *[]){x, index, src}, 3, &dev)) return NULL;
    int d = nb__wrap_dim(dim, x->ndim, "scatter_add");
    if (d < 0 || !index_dtype_ok(index, "scatter_add", "index") ||
        !index_fits(x, index, d, "scatter_add"))
        return NULL;
    if (src->dtype != x->dtype) {
        nb__error(NB_EDTYPE, "scatter_add: src has dtype %s but the input has dtype %s",
                  nb_dtype_name(src->dtype), nb_dtype_name(x->dtype));
        return NULL;
    }
    if (src->ndim != index->ndim) {
        nb__error(NB_ESHAPE, "scatter_add: index has %d dims but src has %d (shapes %s and %s)",
                  index->ndim, src->ndim, NB__SHAPE(index), NB__SHAPE(src));
        return NULL;
    }
    for (int i = 0; i < src->ndim; i++) {
        if (index->shape[i] > src->shape[i]) {
            nb__error(NB_ESHAPE, "scatter_add: index of shape %s is larger than src of shape %s "
                      "at dim %d", NB__SHAPE(index), NB__SHAPE(src), i);
            return NULL;
        }
    }
    nb_scope_begin();
    nb_tensor *out = NULL, *ic = nb_contiguous(index);
    if (ic && (x->dtype == NB_F16 || x->dtype == NB_BF16)) {
        /* Accumulate in f32 and round once at the end, so many additions into one
         * element do not lose precision at every step. */
        nb_tensor *acc = nb_to_dtype(x, NB_F32), *s32 = nb_to_dtype(src, NB_F32);
        if (acc && s32 && scatter_into(acc, d, ic, s32, dev)) out = nb_to_dtype(acc, x->dtype);
    } else if (ic) {
        out = nb_clone(x);
        if (out && !scatter_into(out, d, ic, src, dev)) out = NULL; /* freed by the scope */
    }
    nb_keep(out);
    nb_scope_end();
    return out;
}

/* ---- masked_fill ------------------------------------------------------------------------------ */
static nb_tensor *masked_fill_impl(nb_tensor *x, nb_tensor *mask, double value) {
    NB__CHECK_ARG(x, "masked_fill", "x");
    NB__CHECK_ARG(mask, "masked_fill", "mask");
    nb_device dev;
    if (!nb__check_devices("masked_fill", (nb_tensor *[]){x, mask}, 2, &dev)) return NULL;
    if (mask->dtype != NB_BOOL) {
        nb__error(NB_EDTYPE, "masked_fill: mask must have dtype bool, got %s",
                  nb_dtype_name(mask->dtype));
        return NULL;
    }
    /* The output has x's shape, so the mask must broadcast to it (not the other way). */
    bool ok = mask->ndim <= x->ndim;
    for (int i = 1; ok && i <= mask->ndim; i++) {
        int64_t m = mask->shape[mask->ndim - i];
        ok = m == 1 || m == x->shape[x->ndim - i];
    }
    if (!ok) {
        nb__error(NB_ESHAPE, "masked_fill: mask of shape %s cannot be broadcast to the input "
                  "shape %s", NB__SHAPE(mask), NB__SHAPE(x));
        return NULL;
    }
    nb_tensor *out = nb__empty(x->shape, x->ndim, x->dtype, dev);
    if (!out) return NULL;
    nb__masked_fill_args a = {.value = 0};
    nb__store_f64(&a.value, x->dtype, value); /* the fill value as one element of x's dtype */
    nb__iter_init(&a.it, out->shape, out->ndim, (nb_tensor *[]){out, x, mask}, 3);
    return result(out, nb__run_masked_fill(dev, "masked_fill", &a));
}

/* ---- one_hot ---------------------------------------------------------------------------------- */
nb_tensor *nb_one_hot(nb_tensor *indices, int64_t num_classes, nb_dtype dt) {
    NB__CHECK_ARG(indices, "one_hot", "indices");
    nb_device dev;
    if (!nb__check_devices("one_hot", &indices, 1, &dev)) return NULL;
    if (!index_dtype_ok(indices, "one_hot", "indices")) return NULL;
    if ((unsigned)dt >= NB_DTYPE_COUNT) {
        nb__error(NB_EDTYPE, "one_hot: %d is not a valid dtype", (int)dt);
        return NULL;
    }
    if (num_classes < -1) {
        nb__error(NB_EINVAL, "one_hot: num_classes must be -1 (infer) or >= 0, got %lld",
                  (long long)num_classes);
        return NULL;
    }
    if (indices->ndim >= NB_MAX_DIMS) {
        nb__error(NB_ESHAPE, "one_hot: indices of shape %s leave no room for the class dim "
                  "(at most %d dims)", NB__SHAPE(indices), NB_MAX_DIMS);
        return NULL;
    }
    if (num_classes == -1 && nb_numel(indices) == 0) {
        nb__error(NB_EINVAL, "one_hot: cannot infer num_classes from an empty tensor; pass it "
                  "explicitly");
        return NULL;
    }
    if (num_classes == -1) {
        /* The output's shape depends on the values: a device without data cannot say. */
        const nb__backend *be = nb__backend_of(dev, "one_hot");
        if (!be) return NULL;
        if (!be->has_storage) {
            nb__error(NB_EINVAL, "one_hot: num_classes must be given for %s tensors",
                      NB__DEVSTR(dev));
            return NULL;
        }
    }
    nb_scope_begin();
    nb_tensor *out = NULL, *ic = nb_contiguous(indices);
    int64_t C = num_classes;
    if (ic && num_classes == -1) {
        int64_t mn = 0, mx = -1;
        nb__index_minmax_args mm = {.out_min = &mn, .out_max = &mx};
        nb__view_init(&mm.index, ic);
        if (nb__run_index_minmax(dev, "one_hot", &mm) != NB_OK) {
            ic = NULL;
        } else if (mn < 0) {
            nb__error(NB_EINDEX, "one_hot: class index %lld is negative; class values must be "
                      "non-negative", (long long)mn);
            ic = NULL;
        }
        C = mx + 1;
    }
    if (ic) {
        int64_t sh[NB_MAX_DIMS];
        memcpy(sh, indices->shape, sizeof(int64_t) * (size_t)indices->ndim);
        sh[indices->ndim] = C;
        out = nb__empty(sh, indices->ndim + 1, dt, dev);
    }
    if (out) {
        nb__one_hot_args a = {.one = 0};
        nb__store_f64(&a.one, dt, 1.0);
        nb__view_init(&a.out, out);
        nb__view_init(&a.index, ic);
        if (nb__run_one_hot(dev, "one_hot", &a) != NB_OK) out = NULL; /* freed by the scope */
    }
    nb_keep(out);
    nb_scope_end();
    return out;
}

/* ---- tril / triu ------------------------------------------------------------------------------ */
static nb_tensor *tri(nb_tensor *x, int64_t k, bool lower, const char *op) {
    NB__CHECK_ARG(x, op, "x");
    nb_device dev = nb__device_of(x);
    if (x->ndim < 2) {
        nb__error(NB_ESHAPE, "%s: input must have at least 2 dims, got shape %s", op,
                  NB__SHAPE(x));
        return NULL;
    }
    nb_tensor *out = nb__empty(x->shape, x->ndim, x->dtype, dev);
    if (!out) return NULL;
    nb__tri_args a = {.k = k, .lower = lower};
    nb__view_init(&a.out, out);
    nb__view_init(&a.x, x);
    return result(out, nb__run_tri(dev, op, &a));
}


/* ---- autograd ------------------------------------------------------------------------------ */
/* The forward bodies run with grad mode off; the public functions record one node. */
static bool needs(const nb__node *n, int i) { return n->edges[i].node || n->edges[i].leaf; }
static nb_status done(nb_tensor **gin, int i) { return gin[i] ? NB_OK : nb_last_status(); }

nb_tensor *nb_index_select(nb_tensor *x, int dim, nb_tensor *index) {
    bool prev = nb_set_grad_enabled(false);
    nb_tensor *out = index_select_impl(x, dim, index);
    nb_set_grad_enabled(prev);
    nb__node *nd = nb__record(out, NB__OP_INDEX_SELECT, (nb_tensor *[]){x, index}, 2);
    if (nd) {
        nb__save(nd, 0, index);
        nd->attrs.i[0] = x->ndim ? nb__wrap_dim(dim, x->ndim, "index_select") : 0;
    }
    return out;
}

nb_tensor *nb_embedding(nb_tensor *weight, nb_tensor *indices) {
    bool prev = nb_set_grad_enabled(false);
    nb_tensor *out = embedding_impl(weight, indices);
    nb_set_grad_enabled(prev);
    nb__node *nd = nb__record(out, NB__OP_EMBEDDING, (nb_tensor *[]){weight, indices}, 2);
    if (nd) nb__save(nd, 0, indices);
    return out;
}

nb_tensor *nb_gather(nb_tensor *x, int dim, nb_tensor *index) {
    bool prev = nb_set_grad_enabled(false);
    nb_tensor *out = gather_impl(x, dim, index);
    nb_set_grad_enabled(prev);
    nb__node *nd = nb__record(out, NB__OP_GATHER, (nb_tensor *[]){x, index}, 2);
    if (nd) {
        nb__save(nd, 0, index);
        nd->attrs.i[0] = nb__wrap_dim(dim, x->ndim, "gather");
    }
    return out;
}

nb_tensor *nb_scatter_add(nb_tensor *x, int dim, nb_tensor *index, nb_tensor *src) {
    bool prev = nb_set_grad_enabled(false);
    nb_tensor *out = scatter_add_impl(x, dim, index, src);
    nb_set_grad_enabled(prev);
    nb__node *nd = nb__record(out, NB__OP_SCATTER_ADD, (nb_tensor *[]){x, index, src}, 3);
    if (nd) {
        if (src->requires_grad) nb__save(nd, 0, index);
        nd->attrs.i[0] = nb__wrap_dim(dim, x->ndim, "scatter_add");
    }
    return out;
}

nb_tensor *nb_masked_fill(nb_tensor *x, nb_tensor *mask, double value) {
    bool prev = nb_set_grad_enabled(false);
    nb_tensor *out = masked_fill_impl(x, mask, value);
    nb_set_grad_enabled(prev);
    nb__node *nd = nb__record(out, NB__OP_MASKED_FILL, (nb_tensor *[]){x, mask}, 2);
    if (nd) nb__save(nd, 0, mask);
    return out;
}

nb_tensor *nb_tril(nb_tensor *x, int64_t k) {
    nb_tensor *out = tri(x, k, true, "tril");
    nb__node *nd = nb__record(out, NB__OP_TRIL, &x, 1);
    if (nd) nd->attrs.i[0] = k;
    return out;
}

nb_tensor *nb_triu(nb_tensor *x, int64_t k) {
    nb_tensor *out = tri(x, k, false, "triu");
    nb__node *nd = nb__record(out, NB__OP_TRIU, &x, 1);
    if (nd) nd->attrs.i[0] = k;
    return out;
}

/* dx = zeros(x) with g's slices added at the selected positions, in index order (the
 * fused ordered index_add: deterministic, repeated indices accumulate). Accumulates in f32
 * (f64 for f64 gradients) on g's device; the engine rounds to x's dtype. The index is the
 * one the forward pass checked. */
static nb_tensor *index_add_zeros(const nb__edge *e, int d, nb_tensor *index, nb_tensor *g,
                                  const char *op) {
    nb_device dev;
    if (!nb__check_devices(op, (nb_tensor *[]){g, index}, 2, &dev)) return NULL;
    nb_tensor *ic = nb_contiguous(index), *gc = nb_contiguous(g);
    nb_dtype acc = g->dtype == NB_F64 ? NB_F64 : NB_F32;
    nb_tensor *dx = ic && gc ? nb_zeros_on(dev, e->shape, e->ndim, acc) : NULL;
    if (!dx) return NULL;
    nb__index_add_args a = {.dim = d};
    nb__view_init(&a.out, dx);
    nb__view_init(&a.index, ic);
    nb__view_init(&a.src, gc);
    return result(dx, nb__run_index_add(dev, op, &a));
}

nb_status nb__bw_INDEX_SELECT(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    gin[0] = index_add_zeros(&n->edges[0], (int)n->attrs.i[0], n->saved[0], g,
                             "index_select backward");
    return done(gin, 0);
}

/* dW (V, D) = zeros + g's rows (indices..., D) accumulated at their indices. */
nb_status nb__bw_EMBEDDING(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    gin[0] = index_add_zeros(&n->edges[0], 0, n->saved[0], g, "embedding backward");
    return done(gin, 0);
}

nb_status nb__bw_GATHER(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    const nb__edge *e = &n->edges[0];
    nb_tensor *z = nb_zeros_on(nb__device_of(g), e->shape, e->ndim, g->dtype);
    gin[0] = nb_scatter_add(z, (int)n->attrs.i[0], n->saved[0], g);
    return done(gin, 0);
}

/* x: g itself. src: g gathered at the index positions; src may be larger than the index
 * (only its leading part is used), and the rest gets zero. */
nb_status nb__bw_SCATTER_ADD(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    if (needs(n, 0)) gin[0] = nb__scope_add(nb_tensor_retain(g));
    if (!needs(n, 2)) return NB_OK;
    nb_tensor *idx = n->saved[0];
    nb_tensor *gs = nb_gather(g, (int)n->attrs.i[0], idx);
    const nb__edge *es = &n->edges[2];
    bool same = gs && gs->ndim == es->ndim &&
                memcmp(gs->shape, es->shape, sizeof(int64_t) * (size_t)es->ndim) == 0;
    if (gs && !same) {
        nb_tensor *z = nb_zeros_on(nb__device_of(gs), es->shape, es->ndim, gs->dtype);
        nb_tensor *part = z;
        for (int d = 0; d < es->ndim && part; d++) part = nb_narrow(part, d, 0, idx->shape[d]);
        if (!part || nb_copy_(part, gs) != NB_OK) return nb_last_status();
        gs = z;
    }
    gin[2] = gs;
    return done(gin, 2);
}

nb_status nb__bw_MASKED_FILL(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    gin[0] = nb_masked_fill(g, n->saved[0], 0.0);
    return done(gin, 0);
}

nb_status nb__bw_TRIL(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    gin[0] = nb_tril(g, n->attrs.i[0]);
    return done(gin, 0);
}

nb_status nb__bw_TRIU(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    gin[0] = nb_triu(g, n->attrs.i[0]);
    return done(gin, 0);
}
