/* tensor/kernels/index.h - private: arguments of the index kernels (index_select and
 * embedding, gather, scatter_add, the ordered index_add of their backward rules,
 * masked_fill, one_hot, tril/triu, and the min/max scan one_hot infers its classes with).
 * C17 and nvcc; included through tensor/kernels.h.
 *
 * Every operand is an nb__view (device pointer, dtype, geometry in elements); a 0-dim
 * operand counts as shape [1]. Index operands are contiguous I32 or I64. The values of an
 * index are data the op definition never reads: the kernels that take one check it first
 * and fail, before writing anything, with the op's message
 *     "<op>: index 12 is out of range for dim 1 of size 10"
 * naming the smallest value when it is negative, else the largest (NB_EINDEX). On the meta
 * device nothing runs, so nothing is checked. */
#ifndef NABLA_TENSOR_KERNELS_INDEX_H
#define NABLA_TENSOR_KERNELS_INDEX_H

/* index_select: out = x with positions along dim picked by index (a flat list of
 * numel(index) values). out is contiguous and laid out as x's shape with shape[dim]
 * replaced by numel(index); its own shape may differ (embedding: (indices..., D) from a
 * (V, D) weight and dim 0). x may have any strides. Index values must lie in
 * [0, x.shape[dim]); the error names op and dim. */
typedef struct nb__index_select_args {
    nb__view out;
    nb__view x;
    nb__view index;
    int dim;
    const char *op; /* "index_select" or "embedding", for the range error */
} nb__index_select_args;

/* gather: out[p] = x[p with p[dim] = index[p]]. out (contiguous) and index have one shape,
 * no larger than x's off dim; x may have any strides. Index values in [0, x.shape[dim]). */
typedef struct nb__gather_args {
    nb__view out;
    nb__view x;
    nb__view index;
    int dim;
    const char *op; /* "gather", for the range error */
} nb__gather_args;

/* scatter_add: out[p with p[dim] = index[p]] += src[p] for every p in index's shape, in
 * increasing p[dim] order for each output element (results do not depend on the thread
 * count). out (in place) is contiguous, of dtype f32, f64, i32, i64, u8 or bool (logical
 * or); src has out's dtype, index's ndim and a shape at least index's in every dim, any
 * strides. Index values in [0, out.shape[dim]). */
typedef struct nb__scatter_add_args {
    nb__view out;
    nb__view index;
    nb__view src;
    int dim;
    const char *op; /* "scatter_add", for the range error */
} nb__scatter_add_args;

/* index_add: out[.., index[m], ..] += src[.., m, ..] along dim, for m = 0, 1, ... in that
 * order (a repeated index accumulates in index order, whatever the thread count). out is
 * contiguous f32 or f64 (the accumulation type); src is contiguous, of any float dtype,
 * laid out as out's shape with shape[dim] replaced by numel(index). The backward rules of
 * index_select and embedding pass the index their forward already checked: the values are
 * trusted here. */
typedef struct nb__index_add_args {
    nb__view out;
    nb__view index;
    nb__view src;
    int dim;
} nb__index_add_args;

/* masked_fill: out = mask ? value : x elementwise over it = (out, x, mask); x has out's
 * shape and dtype, mask (bool) broadcasts to it. value holds one element of out's dtype in
 * its first nb_dtype_size bytes (the bits, so no dtype needs a case here). */
typedef struct nb__masked_fill_args {
    nb__iter it;
    uint64_t value;
} nb__masked_fill_args;

/* one_hot: out (indices..., C), contiguous, = 0 except out[i, index[i]] = one (one element
 * of out's dtype in its first bytes). Checks the values first: a negative one is
 * "one_hot: class index -1 is negative; class values must be non-negative", one >= C is
 * "one_hot: class index 12 is out of range for 5 classes" (NB_EINDEX). */
typedef struct nb__one_hot_args {
    nb__view out;
    nb__view index;
    uint64_t one;
} nb__one_hot_args;

/* index_minmax: the smallest and largest value of a contiguous I32/I64 index, written to
 * *out_min and *out_max (HOST memory the op passes; INT64_MAX and INT64_MIN when the
 * index is empty). one_hot infers its number of classes with it. */
typedef struct nb__index_minmax_args {
    nb__view index;
    int64_t *out_min;
    int64_t *out_max;
} nb__index_minmax_args;

/* tri: out (contiguous) = x on and below (lower) or on and above (!lower) diagonal k of the
 * last two dims, zero elsewhere. x has out's shape (ndim >= 2), any strides. */
typedef struct nb__tri_args {
    nb__view out;
    nb__view x;
    int64_t k;
    bool lower;
} nb__tri_args;

#define NB__K_INDEX(X)                                                                     \
    X(index_select, nb__index_select_args, "pick slices along a dim by an index (checked)") \
    X(gather, nb__gather_args, "pick elements along a dim by an index (checked)")          \
    X(scatter_add, nb__scatter_add_args, "add src at indexed positions, in place (checked)") \
    X(index_add, nb__index_add_args, "ordered add of slices at indexed positions")         \
    X(masked_fill, nb__masked_fill_args, "x where the mask is false, value where true")    \
    X(one_hot, nb__one_hot_args, "one-hot rows of class indices (checked)")                \
    X(index_minmax, nb__index_minmax_args, "smallest and largest value of an index")       \
    X(tri, nb__tri_args, "lower or upper triangle of the last two dims")

#endif
