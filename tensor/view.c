/* view.c - views: new shape/stride/offset headers over the same storage, no copies.
 * Every function returns a new reference (scope rules of nabla/tensor.h). Each records its
 * autograd node; the backward rules (nb__bw_*) are at the end of this file. */
#include <string.h>

#include "tensor/place.h"
#include "tensor/tape.h"

/* Views that keep row-major element order (view, reshape, squeeze, unsqueeze, flatten)
 * record VIEW: their gradient is the output gradient reshaped to the input's shape. */
static nb_tensor *rec(nb_tensor *out, nb__op op, nb_tensor *in) {
    nb__record(out, op, &in, 1);
    return out;
}

static bool infer_shape(const nb_tensor *t, const int64_t *shape, int ndim, int64_t *out,
                        const char *op) {
    if (ndim < 0 || ndim > NB_MAX_DIMS || (ndim > 0 && !shape)) {
        nb__error(NB_EINVAL, "%s: invalid target shape (%d dims)", op, ndim);
        return false;
    }
    int infer = -1;
    int64_t known = 1, numel = nb_numel(t);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == -1) {
            if (infer >= 0) {
                nb__error(NB_EINVAL, "%s: only one dimension can be -1 in %s", op,
                          nb__shape_str(shape, ndim, (char[NB__SHAPE_STR]){0}));
                return false;
            }
            infer = i;
        } else if (shape[i] < 0) {
            nb__error(NB_EINVAL, "%s: invalid size %lld in %s", op, (long long)shape[i],
                      nb__shape_str(shape, ndim, (char[NB__SHAPE_STR]){0}));
            return false;
        }
        out[i] = shape[i];
    }
    /* Checked before any product is formed (a -1 counts as 1): the inferred size is at most
     * numel, so the result's strides are representable too. */
    if (!nb__shape_bytes(shape, ndim, NB__MAX_ELEM, NULL)) {
        nb__error(NB_EINVAL, "%s: shape %s is too large: its sizes (0 counted as 1) multiply "
                  "past what 64-bit strides and byte sizes can hold", op,
                  nb__shape_str(shape, ndim, (char[NB__SHAPE_STR]){0}));
        return false;
    }
    for (int i = 0; i < ndim; i++)
        if (i != infer) known *= shape[i];
    if (infer >= 0) {
        if (known == 0 || numel % known) {
            nb__error(NB_ESHAPE, "%s: shape %s is invalid for a tensor of %lld elements %s", op,
                      nb__shape_str(shape, ndim, (char[NB__SHAPE_STR]){0}), (long long)numel,
                      NB__SHAPE(t));
            return false;
        }
        out[infer] = numel / known;
    } else if (known != numel) {
        nb__error(NB_ESHAPE, "%s: shape %s is invalid for a tensor of %lld elements %s", op,
                  nb__shape_str(shape, ndim, (char[NB__SHAPE_STR]){0}), (long long)numel,
                  NB__SHAPE(t));
        return false;
    }
    return true;
}

/* Strides for viewing t as shape[ndim] without a copy, if its layout allows: groups of old
 * dims that are contiguous with each other can be split or merged freely. */
static bool view_strides(const nb_tensor *t, const int64_t *shape, int ndim, int64_t *out) {
    if (nb_numel(t) == 0 || t->ndim == 0) {
        nb__contiguous_strides(shape, ndim, out);
        return true;
    }
    int vd = ndim - 1;
    int64_t base = t->strides[t->ndim - 1], tnumel = 1, vnumel = 1;
    for (int td = t->ndim - 1; td >= 0; td--) {
        tnumel *= t->shape[td];
        /* Strides of size-1 dims can be anything (a slice's step, a user's view): products
         * with them are checked, and one that overflows cannot be a stride (fuzz_shape). */
        int64_t span;
        bool chunk_end = td == 0 || (t->shape[td - 1] != 1 &&
                                     (__builtin_mul_overflow(tnumel, base, &span) ||
                                      t->strides[td - 1] != span));
        if (!chunk_end) continue;
        while (vd >= 0 && (vnumel < tnumel || shape[vd] == 1)) {
            if (__builtin_mul_overflow(vnumel, base, &out[vd])) return false;
            vnumel *= shape[vd];
            vd--;
        }
        if (vnumel != tnumel) return false;
        if (td > 0) {
            base = t->strides[td - 1];
            tnumel = vnumel = 1;
        }
    }
    return vd == -1;
}

/* An activation tag (tensor/place.h: the last dim is this rank's chunk of a split tensor)
 * stays on views that keep the last dim, as a flattening of (B, T, V/tp) logits to
 * (B T, V/tp) does. */
static nb_tensor *keep_tag(nb_tensor *t, nb_tensor *v) {
    if (v && t->place && t->place->activation && v->ndim >= 1 && t->ndim >= 1 &&
        v->shape[v->ndim - 1] == t->shape[t->ndim - 1])
        nb__tensor_set_place(v, t->place);
    return v;
}

nb_tensor *nb_view(nb_tensor *t, const int64_t *shape, int ndim) {
    NB__CHECK_ARG(t, "view", "t");
    int64_t sh[NB_MAX_DIMS], st[NB_MAX_DIMS];
    if (!infer_shape(t, shape, ndim, sh, "view")) return NULL;
    if (!view_strides(t, sh, ndim, st)) {
        nb__error(NB_ESHAPE,
                  "view: a tensor of shape %s with strides %s cannot be viewed as %s without "
                  "a copy; use nb_reshape",
                  NB__SHAPE(t), nb__shape_str(t->strides, t->ndim, (char[NB__SHAPE_STR]){0}),
                  nb__shape_str(sh, ndim, (char[NB__SHAPE_STR]){0}));
        return NULL;
    }
    return keep_tag(t, rec(nb__view_of(t, sh, st, ndim, t->offset), NB__OP_VIEW, t));
}

nb_tensor *nb_reshape(nb_tensor *t, const int64_t *shape, int ndim) {
    NB__CHECK_ARG(t, "reshape", "t");
    int64_t sh[NB_MAX_DIMS], st[NB_MAX_DIMS];
    if (!infer_shape(t, shape, ndim, sh, "reshape")) return NULL;
    if (view_strides(t, sh, ndim, st))
        return keep_tag(t, rec(nb__view_of(t, sh, st, ndim, t->offset), NB__OP_VIEW, t));
    nb_scope_begin();
    nb_tensor *c = nb_clone(t);
    nb_tensor *r = c ? nb_keep(nb_view(c, sh, ndim)) : NULL;
    nb_scope_end();
    return keep_tag(t, r);
}

nb_tensor *nb_permute(nb_tensor *t, const int *dims, int ndim) {
    NB__CHECK_ARG(t, "permute", "t");
    if (ndim != t->ndim || (ndim && !dims)) {
        nb__error(NB_EINVAL, "permute: %d dims given for a tensor with %d dims", ndim, t->ndim);
        return NULL;
    }
    int64_t sh[NB_MAX_DIMS], st[NB_MAX_DIMS];
    bool seen[NB_MAX_DIMS] = {0};
    for (int i = 0; i < ndim; i++) {
        int d = nb__wrap_dim(dims[i], ndim, "permute");
        if (d < 0) return NULL;
        if (seen[d]) {
            nb__error(NB_EINVAL, "permute: dim %d appears twice", d);
            return NULL;
        }
        seen[d] = true;
        sh[i] = t->shape[d];
        st[i] = t->strides[d];
    }
    nb_tensor *r = nb__view_of(t, sh, st, ndim, t->offset);
    nb__node *nd = nb__record(r, NB__OP_PERMUTE, &t, 1);
    if (nd) {
        for (int i = 0; i < ndim; i++) nd->attrs.i[i] = nb__wrap_dim(dims[i], ndim, "permute");
        nd->attrs.ni = ndim;
    }
    return r;
}

nb_tensor *nb_transpose(nb_tensor *t, int dim0, int dim1) {
    NB__CHECK_ARG(t, "transpose", "t");
    if (t->ndim == 0) return rec(nb__view_of(t, NULL, NULL, 0, t->offset), NB__OP_VIEW, t);
    int a = nb__wrap_dim(dim0, t->ndim, "transpose"), b = nb__wrap_dim(dim1, t->ndim, "transpose");
    if (a < 0 || b < 0) return NULL;
    int64_t sh[NB_MAX_DIMS], st[NB_MAX_DIMS];
    memcpy(sh, t->shape, sizeof sh);
    memcpy(st, t->strides, sizeof st);
    sh[a] = t->shape[b], sh[b] = t->shape[a];
    st[a] = t->strides[b], st[b] = t->strides[a];
    nb_tensor *r = nb__view_of(t, sh, st, t->ndim, t->offset);
    nb__node *nd = nb__record(r, NB__OP_PERMUTE, &t, 1);
    if (nd) { /* a transpose is a permutation: its own inverse */
        for (int i = 0; i < t->ndim; i++) nd->attrs.i[i] = i;
        nd->attrs.i[a] = b, nd->attrs.i[b] = a;
        nd->attrs.ni = t->ndim;
    }
    return r;
}

nb_tensor *nb_slice(nb_tensor *t, int dim, int64_t start, int64_t end, int64_t step) {
    NB__CHECK_ARG(t, "slice", "t");
    if (t->ndim == 0) {
        nb__error(NB_EDIM, "slice: cannot slice a 0-dim tensor");
        return NULL;
    }
    int d = nb__wrap_dim(dim, t->ndim, "slice");
    if (d < 0) return NULL;
    if (step < 1) {
        nb__error(NB_EINVAL, "slice: step must be >= 1, got %lld", (long long)step);
        return NULL;
    }
    int64_t n = t->shape[d];
    if (start < 0) start += n;
    if (end < 0) end += n;
    start = start < 0 ? 0 : start > n ? n : start;
    end = end < start ? start : end > n ? n : end;
    int64_t sh[NB_MAX_DIMS], st[NB_MAX_DIMS];
    memcpy(sh, t->shape, sizeof sh);
    memcpy(st, t->strides, sizeof st);
    /* ceil((end - start) / step) without forming end - start + step (a step near
     * INT64_MAX would wrap). A step past the dim's size takes one element, whose stride
     * is never used: keep the old one rather than a product that may wrap. */
    sh[d] = end == start ? 0 : (end - start - 1) / step + 1;
    st[d] = step < n ? t->strides[d] * step : t->strides[d];
    nb_tensor *r = nb__view_of(t, sh, st, t->ndim, t->offset + start * t->strides[d]);
    nb__node *nd = nb__record(r, NB__OP_SLICE, &t, 1);
    if (nd) nd->attrs.i[0] = d, nd->attrs.i[1] = start, nd->attrs.i[2] = end, nd->attrs.i[3] = step;
    return r;
}

nb_tensor *nb_narrow(nb_tensor *t, int dim, int64_t start, int64_t length) {
    NB__CHECK_ARG(t, "narrow", "t");
    if (t->ndim == 0) {
        nb__error(NB_EDIM, "narrow: cannot narrow a 0-dim tensor");
        return NULL;
    }
    int d = nb__wrap_dim(dim, t->ndim, "narrow");
    if (d < 0) return NULL;
    int64_t n = t->shape[d];
    if (start < 0) start += n;
    int64_t end;
    bool wraps = __builtin_add_overflow(start, length, &end); /* a huge length */
    if (wraps) {
        nb__error(NB_EINDEX, "narrow: length %lld from %lld is outside dim %d of size %lld",
                  (long long)length, (long long)start, d, (long long)n);
        return NULL;
    }
    if (start < 0 || length < 0 || end > n) {
        nb__error(NB_EINDEX, "narrow: range [%lld, %lld) is outside dim %d of size %lld",
                  (long long)start, (long long)end, d, (long long)n);
        return NULL;
    }
    int64_t sh[NB_MAX_DIMS];
    memcpy(sh, t->shape, sizeof sh);
    sh[d] = length;
    nb_tensor *r = nb__view_of(t, sh, t->strides, t->ndim, t->offset + start * t->strides[d]);
    nb__node *nd = nb__record(r, NB__OP_NARROW, &t, 1);
    if (nd) nd->attrs.i[0] = d, nd->attrs.i[1] = start, nd->attrs.i[2] = length;
    return r;
}

nb_tensor *nb_select(nb_tensor *t, int dim, int64_t index) {
    NB__CHECK_ARG(t, "select", "t");
    if (t->ndim == 0) {
        nb__error(NB_EDIM, "select: cannot index a 0-dim tensor");
        return NULL;
    }
    int d = nb__wrap_dim(dim, t->ndim, "select");
    if (d < 0) return NULL;
    int64_t n = t->shape[d];
    if (index < -n || index >= n) {
        nb__error(NB_EINDEX, "select: index %lld is out of range for dim %d of size %lld",
                  (long long)index, d, (long long)n);
        return NULL;
    }
    if (index < 0) index += n;
    int64_t sh[NB_MAX_DIMS], st[NB_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < t->ndim; i++)
        if (i != d) sh[k] = t->shape[i], st[k++] = t->strides[i];
    nb_tensor *r = nb__view_of(t, sh, st, k, t->offset + index * t->strides[d]);
    nb__node *nd = nb__record(r, NB__OP_SELECT, &t, 1);
    if (nd) nd->attrs.i[0] = d, nd->attrs.i[1] = index;
    return r;
}

nb_tensor *nb_expand(nb_tensor *t, const int64_t *shape, int ndim) {
    NB__CHECK_ARG(t, "expand", "t");
    if (ndim < t->ndim || ndim > NB_MAX_DIMS || (ndim && !shape)) {
        nb__error(NB_ESHAPE, "expand: cannot expand %s to %d dims", NB__SHAPE(t), ndim);
        return NULL;
    }
    int64_t sh[NB_MAX_DIMS], st[NB_MAX_DIMS];
    int lead = ndim - t->ndim;
    for (int i = 0; i < ndim; i++) {
        int64_t want = shape[i];
        if (i < lead) {
            if (want < 0) {
                nb__error(NB_ESHAPE, "expand: -1 is not allowed for a new leading dim (%s)",
                          nb__shape_str(shape, ndim, (char[NB__SHAPE_STR]){0}));
                return NULL;
            }
            sh[i] = want, st[i] = 0;
            continue;
        }
        int64_t have = t->shape[i - lead];
        if (want == -1 || want == have) {
            sh[i] = have, st[i] = t->strides[i - lead];
        } else if (have == 1 && want >= 0) {
            sh[i] = want, st[i] = 0;
        } else {
            nb__error(NB_ESHAPE, "expand: cannot expand %s to %s (dim %d has size %lld, not 1)",
                      NB__SHAPE(t), nb__shape_str(shape, ndim, (char[NB__SHAPE_STR]){0}), i,
                      (long long)have);
            return NULL;
        }
    }
    /* Broadcast strides are 0, but numel and any copy of the result must still fit. */
    if (!nb__shape_bytes(sh, ndim, NB__MAX_ELEM, NULL)) {
        nb__error(NB_ESHAPE, "expand: shape %s is too large: its sizes (0 counted as 1) "
                  "multiply past what 64-bit strides and byte sizes can hold",
                  nb__shape_str(sh, ndim, (char[NB__SHAPE_STR]){0}));
        return NULL;
    }
    return rec(nb__view_of(t, sh, st, ndim, t->offset), NB__OP_EXPAND, t);
}

nb_tensor *nb_squeeze(nb_tensor *t, int dim) {
    NB__CHECK_ARG(t, "squeeze", "t");
    if (t->ndim == 0) return rec(nb__view_of(t, NULL, NULL, 0, t->offset), NB__OP_VIEW, t);
    int d = nb__wrap_dim(dim, t->ndim, "squeeze");
    if (d < 0) return NULL;
    if (t->shape[d] != 1) {
        nb__error(NB_ESHAPE, "squeeze: dim %d of %s has size %lld, not 1", d, NB__SHAPE(t),
                  (long long)t->shape[d]);
        return NULL;
    }
    int64_t sh[NB_MAX_DIMS], st[NB_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < t->ndim; i++)
        if (i != d) sh[k] = t->shape[i], st[k++] = t->strides[i];
    return rec(nb__view_of(t, sh, st, k, t->offset), NB__OP_VIEW, t);
}

nb_tensor *nb_squeeze_all(nb_tensor *t) {
    NB__CHECK_ARG(t, "squeeze_all", "t");
    int64_t sh[NB_MAX_DIMS], st[NB_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] != 1) sh[k] = t->shape[i], st[k++] = t->strides[i];
    return rec(nb__view_of(t, sh, st, k, t->offset), NB__OP_VIEW, t);
}

nb_tensor *nb_unsqueeze(nb_tensor *t, int dim) {
    NB__CHECK_ARG(t, "unsqueeze", "t");
    if (t->ndim == NB_MAX_DIMS) {
        nb__error(NB_EDIM, "unsqueeze: tensor already has the maximum of %d dims", NB_MAX_DIMS);
        return NULL;
    }
    int d = nb__wrap_dim(dim, t->ndim + 1, "unsqueeze");
    if (d < 0) return NULL;
    int64_t sh[NB_MAX_DIMS], st[NB_MAX_DIMS];
    for (int i = 0, k = 0; i <= t->ndim; i++) {
        if (i == d) {
            sh[i] = 1;
            st[i] = d < t->ndim ? t->shape[d] * t->strides[d] : 1;
        } else {
            sh[i] = t->shape[k], st[i] = t->strides[k], k++;
        }
    }
    return rec(nb__view_of(t, sh, st, t->ndim + 1, t->offset), NB__OP_VIEW, t);
}

nb_tensor *nb_flatten(nb_tensor *t, int start_dim, int end_dim) {
    NB__CHECK_ARG(t, "flatten", "t");
    if (t->ndim == 0) return nb_reshape(t, (int64_t[]){1}, 1);
    int s = nb__wrap_dim(start_dim, t->ndim, "flatten"), e = nb__wrap_dim(end_dim, t->ndim, "flatten");
    if (s < 0 || e < 0) return NULL;
    if (s > e) {
        nb__error(NB_EINVAL, "flatten: start_dim %d comes after end_dim %d", s, e);
        return NULL;
    }
    int64_t sh[NB_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < s; i++) sh[k++] = t->shape[i];
    int64_t m = 1;
    for (int i = s; i <= e; i++) m *= t->shape[i];
    sh[k++] = m;
    for (int i = e + 1; i < t->ndim; i++) sh[k++] = t->shape[i];
    return nb_reshape(t, sh, k);
}

nb_tensor *nb_contiguous(nb_tensor *t) {
    NB__CHECK_ARG(t, "contiguous", "t");
    if (nb_is_contiguous(t)) return nb__scope_add(nb_tensor_retain(t));
    return nb_clone(t);
}

nb_tensor *nb_detach(nb_tensor *t) {
    NB__CHECK_ARG(t, "detach", "t");
    return nb__view_of(t, t->shape, t->strides, t->ndim, t->offset);
}

/* ---- backward rules ------------------------------------------------------------------------ */
static const nb__edge *edge0(nb__node *n) { return &n->edges[0]; }

nb_status nb__bw_VIEW(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    gin[0] = nb_reshape(g, edge0(n)->shape, edge0(n)->ndim);
    return gin[0] ? NB_OK : nb_last_status();
}

nb_status nb__bw_EXPAND(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    (void)n;
    gin[0] = nb__scope_add(nb_tensor_retain(g)); /* the engine sums it to the input's shape */
    return NB_OK;
}

nb_status nb__bw_PERMUTE(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    int inv[NB_MAX_DIMS];
    for (int i = 0; i < n->attrs.ni; i++) inv[n->attrs.i[i]] = i;
    gin[0] = nb_permute(g, inv, n->attrs.ni);
    return gin[0] ? NB_OK : nb_last_status();
}

/* Gradient of a view that picks part of the input: zeros (on g's device) with g written
 * into the part. */
static nb_status scatter_into_zeros(nb__node *n, nb_tensor *g, nb_tensor **gin,
                                    nb_tensor *(*part)(nb_tensor *z, const nb__attrs *a)) {
    nb_tensor *z = nb_zeros_on(nb__device_of(g), edge0(n)->shape, edge0(n)->ndim, g->dtype);
    nb_tensor *v = z ? part(z, &n->attrs) : NULL;
    if (!v || nb_copy_(v, g) != NB_OK) return nb_last_status();
    gin[0] = z;
    return NB_OK;
}

static nb_tensor *narrow_part(nb_tensor *z, const nb__attrs *a) {
    return nb_narrow(z, (int)a->i[0], a->i[1], a->i[2]);
}
static nb_tensor *slice_part(nb_tensor *z, const nb__attrs *a) {
    return nb_slice(z, (int)a->i[0], a->i[1], a->i[2], a->i[3]);
}
static nb_tensor *select_part(nb_tensor *z, const nb__attrs *a) {
    return nb_select(z, (int)a->i[0], a->i[1]);
}

nb_status nb__bw_NARROW(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    return scatter_into_zeros(n, g, gin, narrow_part);
}
nb_status nb__bw_SLICE(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    return scatter_into_zeros(n, g, gin, slice_part);
}
nb_status nb__bw_SELECT(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    return scatter_into_zeros(n, g, gin, select_part);
}
