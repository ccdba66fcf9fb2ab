/* tensor/kernels/reduce.h - private: arguments of the reduce kernels (the reductions of
 * tensor/ops/reduce.c, softmax / log_softmax, and the backward kernels of softmax and of
 * max/min along a dim). C17 and nvcc; included through tensor/kernels.h. */
#ifndef NABLA_TENSOR_KERNELS_REDUCE_H
#define NABLA_TENSOR_KERNELS_REDUCE_H

/* What a reduction computes over the reduced elements x of each output element. */
typedef enum nb__rkind {
    NB__RK_SUM,    /* sum x                                       (post DIV: the mean) */
    NB__RK_VAR,    /* sum (x - mean(x))^2                (post DIV / SQRT_DIV: var, std) */
    NB__RK_LSE,    /* log(sum exp(x - m)) + m, m = max x (0 where the max is infinite) */
    NB__RK_MAX,    /* max x, NaN propagates; -inf (or the type's min) if empty          */
    NB__RK_MIN,    /* min x, NaN propagates                                             */
    NB__RK_ARGMAX, /* max x and the index of its first occurrence (NaN is the max)     */
    NB__RK_ARGMIN  /* min x and the index of its first occurrence (NaN is the min)     */
} nb__rkind;

/* What is done with the result a before it is stored (in f64, rounded once to the
 * output dtype). Integer outputs are stored exactly, without post-processing. */
typedef enum nb__rpost {
    NB__RP_NONE,     /* a             */
    NB__RP_DIV,      /* a / den       */
    NB__RP_SQRT_DIV  /* sqrt(a / den) */
} nb__rpost;

/* reduce: x reduced over the dims d with reduced[d] (x.ndim entries; a 0-dim x reduces to
 * itself). Integer and bool inputs accumulate in int64 (sums wrap, as PyTorch's do); the
 * op definition guarantees VAR and LSE only see float inputs and MAX/MIN/ARGMAX/ARGMIN no
 * empty reduced dim. Reductions over zero elements store the empty value of the kind (sum
 * 0, VAR 0 before the division, LSE -inf). Results never depend on the thread count. */
typedef struct nb__reduce_args {
    nb__view x;                /* the input, any strides (elements) */
    bool reduced[NB_MAX_DIMS]; /* dim d of x is reduced */
    nb__rkind kind;
    nb__rpost post;
    double den; /* the divisor of post DIV / SQRT_DIV */
    /* The values: contiguous, x's kept dims in order (keepdim or not, the layout is the
     * same), dtype out_dtype. NULL for ARGMAX/ARGMIN when only the indices are wanted. */
    char *out;
    nb_dtype out_dtype;
    /* ARGMAX/ARGMIN only: I64 indices along the reduced dims, laid out as out (or NULL). */
    int64_t *idx;
} nb__reduce_args;

/* softmax: y = softmax(x) (log: log_softmax) along the middle dim of x seen as
 * (outer, len, inner); x and y contiguous, of float dtype `dtype`. x may equal y (the op
 * copies a strided input into y and runs in place). */
typedef struct nb__softmax_args {
    const char *x;
    char *y;
    nb_dtype dtype;
    int64_t outer, len, inner;
    bool log;
} nb__softmax_args;

/* softmax_backward: the input gradient dx from the forward's OUTPUT y and the output
 * gradient g, along the middle dim of (outer, len, inner):
 *     softmax:      dx = y * (g - sum_dim(g * y))
 *     log_softmax:  dx = g - exp(y) * sum_dim(g)
 * y, g and dx contiguous, of float dtype `dtype`. */
typedef struct nb__softmax_backward_args {
    const char *y, *g;
    char *dx;
    nb_dtype dtype;
    int64_t outer, len, inner;
    bool log;
} nb__softmax_backward_args;

/* extreme_backward: the gradient of max/min along a dim, dx of shape (outer, len, inner),
 * zero except dx[o, idx[o, i], i] = g[o, i]. g (outer, inner) of dtype `dtype` and idx
 * (outer, inner) I64 are contiguous, dx contiguous of `dtype`. An index outside [0, len)
 * is an NB_EINDEX error (indices modified after the forward). */
typedef struct nb__extreme_backward_args {
    const char *g;
    const int64_t *idx;
    char *dx;
    nb_dtype dtype;
    int64_t outer, len, inner;
} nb__extreme_backward_args;

#define NB__K_REDUCE(X)                                                                    \
    X(reduce, nb__reduce_args, "sum/var/logsumexp/max/min/argmax/argmin over dims")        \
    X(softmax, nb__softmax_args, "softmax / log_softmax along a dim")                      \
    X(softmax_backward, nb__softmax_backward_args, "softmax / log_softmax backward")       \
    X(extreme_backward, nb__extreme_backward_args,                                         \
      "max/min along a dim backward: g at the returned index, zero elsewhere")

#endif
