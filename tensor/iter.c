/* iter.c - broadcasting and the elementwise iterator geometry every elementwise kernel
 * receives.
 *
 * nb__iter_init lays the operands out over one shape with byte strides (0 for broadcast
 * dims) and merges adjacent dims that every operand walks contiguously, so the common cases
 * (all contiguous, a row vector broadcast over a matrix) become one or two long loops.
 * Walking it is the backend's business (cpu/iter.c). */
#include <string.h>

#include "tensor/tensor_impl.h"

/* cuda/kernels_basic.cu asserts the same size under nvcc: kernels see one layout. */
_Static_assert(sizeof(nb__iter) == 4 * 2 + 8 + 8 * NB_MAX_DIMS + 8 * NB__ITER_MAX_ARGS * NB_MAX_DIMS +
                                       8 * NB__ITER_MAX_ARGS + 4 * NB__ITER_MAX_ARGS,
               "nb__iter layout");

bool nb__broadcast_shapes(const int64_t *a, int na, const int64_t *b, int nb, int64_t *out,
                          int *out_ndim, const char *op) {
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++) {
        int ia = i - (n - na), ib = i - (n - nb);
        int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
        if (da == db || db == 1) out[i] = da;
        else if (da == 1) out[i] = db;
        else {
            nb__error(NB_ESHAPE, "%s: shapes %s and %s cannot be broadcast together (dim %d: "
                      "%lld vs %lld)", op, nb__shape_str(a, na, (char[NB__SHAPE_STR]){0}),
                      nb__shape_str(b, nb, (char[NB__SHAPE_STR]){0}), i, (long long)da,
                      (long long)db);
            return false;
        }
    }
    *out_ndim = n;
    return true;
}

void nb__broadcast_strides(const nb_tensor *t, const int64_t *shape, int ndim, int64_t *strides) {
    int lead = ndim - t->ndim;
    NB__ASSERT(lead >= 0);
    for (int i = 0; i < ndim; i++) {
        if (i < lead) strides[i] = 0;
        else {
            int64_t have = t->shape[i - lead];
            NB__ASSERT(have == shape[i] || have == 1);
            strides[i] = (have == 1 && shape[i] != 1) ? 0 : t->strides[i - lead];
        }
    }
}

void nb__iter_init(nb__iter *it, const int64_t *shape, int ndim, nb_tensor *const *ts, int n) {
    NB__ASSERT(n >= 1 && n <= NB__ITER_MAX_ARGS && ndim <= NB_MAX_DIMS);
    memset(it, 0, sizeof *it);
    it->nargs = n;
    it->numel = nb__numel_of(shape, ndim);
    int64_t st[NB__ITER_MAX_ARGS][NB_MAX_DIMS];
    for (int a = 0; a < n; a++) {
        nb__broadcast_strides(ts[a], shape, ndim, st[a]);
        size_t es = nb_dtype_size(ts[a]->dtype);
        for (int d = 0; d < ndim; d++) st[a][d] *= (int64_t)es;
        it->data[a] = nb__ptr(ts[a]);
        it->dtype[a] = ts[a]->dtype;
    }
    /* Drop size-1 dims, then merge dim d into the next inner one when, for every operand,
     * stride[d] == stride[d+1] * shape[d+1]. */
    int k = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1) continue;
        if (k > 0) {
            bool merge = true;
            for (int a = 0; a < n && merge; a++)
                merge = it->strides[a][k - 1] == st[a][d] * shape[d];
            if (merge) {
                it->shape[k - 1] *= shape[d];
                for (int a = 0; a < n; a++) it->strides[a][k - 1] = st[a][d];
                continue;
            }
        }
        it->shape[k] = shape[d];
        for (int a = 0; a < n; a++) it->strides[a][k] = st[a][d];
        k++;
    }
    if (k == 0) { /* a single element */
        it->shape[0] = 1;
        for (int a = 0; a < n; a++) it->strides[a][0] = (int64_t)nb_dtype_size(it->dtype[a]);
        k = 1;
    }
    it->ndim = k;
}

void nb__view_init(nb__view *v, const nb_tensor *t) {
    memset(v, 0, sizeof *v);
    v->data = nb__ptr(t);
    v->dtype = t->dtype;
    v->ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++) v->shape[d] = t->shape[d], v->strides[d] = t->strides[d];
}

bool nb__dims_collapse(const int64_t *sizes, const int64_t *strides, int n, int64_t *stride) {
    bool first = true;
    int64_t span = 0;
    *stride = 0;
    for (int d = n - 1; d >= 0; d--) {
        if (sizes[d] == 1) continue;
        if (first) {
            *stride = strides[d];
            first = false;
        } else if (strides[d] != span) {
            return false;
        }
        span = strides[d] * sizes[d];
    }
    return true;
}
