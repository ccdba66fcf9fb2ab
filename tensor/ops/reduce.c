/* tensor/ops/reduce.c - the reduction ops: sum, mean, var, std, logsumexp, amax, amin over
 * a set of dims, max/min (values and indices), argmax/argmin and softmax / log_softmax over
 * one dim. Argument checks, output shapes and dtypes live here; the arithmetic is in the
 * kernels of tensor/kernels/reduce.h (reduce, softmax, softmax_backward, extreme_backward),
 * reached through nb__run_<kernel> on the inputs' device (cpu/reduce.c on the CPU).
 *
 * Semantics follow PyTorch:
 *   - dims: a list (negative counts from the end) or NULL / 0 entries for all dims; a dim
 *     listed twice is an error. keepdim keeps reduced dims with size 1. A 0-dim tensor
 *     accepts dim 0 and -1 and reduces to itself.
 *   - sum of integers and bool gives I64; of floats, the input dtype (f32/f16/bf16 sums
 *     accumulate in f64 and round once).
 *   - mean, var, std, logsumexp, softmax and log_softmax need a float input (NB_EDTYPE
 *     otherwise; PyTorch's mean/var/std also refuse integers: convert with nb_to_dtype).
 *   - over zero elements: sum 0, mean/var/std NaN, logsumexp -inf; amax/amin, max/min and
 *     argmax/argmin have no identity and refuse an empty reduced dim (NB_ESHAPE).
 *   - NaN propagates through amax/amin and max/min; their index is that of the first NaN.
 *     Ties give the first index. var/std divide by max(0, n - correction).
 * Autograd: every float result records a node (the rules follow the op they belong to);
 * argmax/argmin and the indices of max/min are integers and record nothing. */

#include "tensor/tape.h"
#include "tensor/backend.h"
#include "tensor/autocast.h"

static bool need_float(const nb_tensor *x, const char *op) {
    if (!nb_dtype_is_float(x->dtype)) {
        nb__error(NB_EDTYPE,
                  "%s: input dtype %s is not a floating point type; convert it first "
                  "(nb_to_dtype)",
                  op, nb_dtype_name(x->dtype));
        return false;
    }
    return true;
}

/* Fill mask[x->ndim] from the dims list; false (EDIM / EINVAL) on a bad or repeated dim. */
static bool parse_dims(const nb_tensor *x, const int *dims, int ndims, const char *op,
                       bool *mask) {
    if (ndims < 0) {
        nb__error(NB_EINVAL, "%s: ndims is %d, expected >= 0", op, ndims);
        return false;
    }
    bool all = dims == NULL || ndims == 0;
    for (int d = 0; d < NB_MAX_DIMS; d++) mask[d] = all;
    if (all) return true;
    bool seen[NB_MAX_DIMS] = {false};
    for (int i = 0; i < ndims; i++) {
        int d = nb__wrap_dim(dims[i], x->ndim, op);
        if (d < 0) return false;
        if (seen[d]) {
            nb__error(NB_EDIM, "%s: dim %d appears more than once in the list of dims", op,
                      d);
            return false;
        }
        seen[d] = true;
        mask[d] = true;
    }
    return true;
}

/* The output shape: kept dims, plus size-1 entries for reduced ones under keepdim. */
static int out_shape(const nb_tensor *x, const bool *mask, bool keepdim, int64_t *shape) {
    int n = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (!mask[d]) shape[n++] = x->shape[d];
        else if (keepdim) shape[n++] = 1;
    }
    return n;
}

static int64_t reduced_count(const nb_tensor *x, const bool *mask) {
    int64_t r = 1;
    for (int d = 0; d < x->ndim; d++)
        if (mask[d]) r *= x->shape[d];
    return r;
}

/* amax/max/argmax have no identity: every reduced dim must be non-empty. */
static bool nonempty(const nb_tensor *x, const bool *mask, const char *op) {
    for (int d = 0; d < x->ndim; d++)
        if (mask[d] && x->shape[d] == 0) {
            nb__error(NB_ESHAPE,
                      "%s: cannot reduce over dim %d of size 0 of a tensor of shape %s "
                      "(the reduction has no identity)",
                      op, d, NB__SHAPE(x));
            return false;
        }
    return true;
}

/* Run the reduce kernel a (kind, post, den, out, out_dtype, idx filled) over x and mask
 * on x's device; false on error (the caller frees the outputs it allocated). */
static bool run_reduce(nb_tensor *x, const bool *mask, nb__reduce_args *a, const char *op) {
    nb__view_init(&a->x, x);
    for (int d = 0; d < NB_MAX_DIMS; d++) a->reduced[d] = d < x->ndim && mask[d];
    return nb__run_reduce(nb__device_of(x), op, a) == NB_OK;
}

/* The reduction into a new tensor of dtype odt on x's device. */
static nb_tensor *run_pass(nb_tensor *x, const bool *mask, bool keepdim, nb_dtype odt,
                           nb__reduce_args a, const char *op) {
    int64_t shape[NB_MAX_DIMS];
    int n = out_shape(x, mask, keepdim, shape);
    nb_tensor *out = nb__empty(shape, n, odt, nb__device_of(x));
    if (!out) return NULL;
    a.out = nb__ptr(out), a.out_dtype = odt;
    if (!run_reduce(x, mask, &a, op)) {
        nb_tensor_free(nb__scope_take(out));
        return NULL;
    }
    return out;
}

/* Shared prologue of the set-of-dims reductions. */
static bool prologue(nb_tensor *x, const int *dims, int ndims, const char *op, bool *mask) {
    if (!nb__arg_ok(x, op, "x")) return false;
    return parse_dims(x, dims, ndims, op, mask);
}

/* ---- autograd ----------------------------------------------------------------------------
 * Every set-of-dims reduction records attrs.i[d] = 1 for a reduced dim d of the input and
 * attrs.f[0] = a factor (1 or 1/count for sum and mean, the divisor for var and std). */
static nb__node *record_mask(nb_tensor *out, nb__op op, nb_tensor *x, const bool *mask,
                             double f0) {
    nb__node *nd = nb__record(out, op, &x, 1);
    if (nd) {
        for (int d = 0; d < x->ndim; d++) nd->attrs.i[d] = mask[d];
        nd->attrs.f[0] = f0;
    }
    return nd;
}

/* Reductions whose gradient spreads g back over the reduced dims (sum, mean). */
static nb_tensor *record_spread(nb_tensor *out, nb__op op, nb_tensor *x, const bool *mask,
                                double factor) {
    record_mask(out, op, x, mask, factor);
    return out;
}

/* The reduced dims of a recorded reduction as a list (empty only for a 0-dim input, for
 * which "all dims" means the same thing). */
static int mask_dims(const nb__node *n, int *dims) {
    int k = 0;
    for (int d = 0; d < n->edges[0].ndim; d++)
        if (n->attrs.i[d]) dims[k++] = d;
    return k;
}

/* t, of the output's shape, viewed with the reduced dims kept as size 1 (keepdim form), so
 * it broadcasts against the input. */
static nb_tensor *keep_shape(nb__node *n, nb_tensor *t) {
    const nb__edge *e = &n->edges[0];
    int64_t kshape[NB_MAX_DIMS];
    for (int d = 0; d < e->ndim; d++) kshape[d] = n->attrs.i[d] ? 1 : e->shape[d];
    return nb_reshape(t, kshape, e->ndim);
}

/* Rules built from forward ops compute half types in f32 (the engine rounds the gradient
 * to the input's dtype once). */
static nb_tensor *up(nb_tensor *t) {
    return t && (t->dtype == NB_F16 || t->dtype == NB_BF16) ? nb_to_dtype(t, NB_F32) : t;
}

static nb_status done(nb_tensor **gin) { return gin[0] ? NB_OK : nb_last_status(); }

/* g (the output's shape, reduced dims kept or not) viewed with size-1 reduced dims and
 * expanded to the input's shape. */
static nb_tensor *spread(nb__node *n, nb_tensor *g) {
    const nb__edge *e = &n->edges[0];
    return nb_expand(keep_shape(n, g), e->shape, e->ndim);
}

nb_status nb__bw_SUM(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    gin[0] = spread(n, g);
    return gin[0] ? NB_OK : nb_last_status();
}

nb_status nb__bw_MEAN(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    gin[0] = nb_mul_scalar(spread(n, g), n->attrs.f[0]);
    return gin[0] ? NB_OK : nb_last_status();
}

nb_tensor *nb_sum(nb_tensor *x, const int *dims, int ndims, bool keepdim) {
    x = nb__autocast(x, NB_AUTOCAST_F32); /* nabla/autocast.h */
    bool mask[NB_MAX_DIMS];
    if (!prologue(x, dims, ndims, "sum", mask)) return NULL;
    nb_dtype odt = nb_dtype_is_float(x->dtype) ? x->dtype : NB_I64;
    nb_tensor *r = run_pass(x, mask, keepdim, odt, (nb__reduce_args){.kind = NB__RK_SUM}, "sum");
    return record_spread(r, NB__OP_SUM, x, mask, 1.0);
}

nb_tensor *nb_mean(nb_tensor *x, const int *dims, int ndims, bool keepdim) {
    x = nb__autocast(x, NB_AUTOCAST_F32); /* nabla/autocast.h */
    bool mask[NB_MAX_DIMS];
    if (!prologue(x, dims, ndims, "mean", mask) || !need_float(x, "mean")) return NULL;
    double count = (double)reduced_count(x, mask);
    nb_tensor *r = run_pass(x, mask, keepdim, x->dtype,
                            (nb__reduce_args){.kind = NB__RK_SUM, .post = NB__RP_DIV,
                                              .den = count},
                            "mean");
    return record_spread(r, NB__OP_MEAN, x, mask, 1.0 / count);
}

static nb_tensor *var_std(nb_tensor *x, const int *dims, int ndims, int correction,
                          bool keepdim, bool take_sqrt, const char *op) {
    x = nb__autocast(x, NB_AUTOCAST_F32); /* nabla/autocast.h */
    bool mask[NB_MAX_DIMS];
    if (!prologue(x, dims, ndims, op, mask) || !need_float(x, op)) return NULL;
    double n = (double)reduced_count(x, mask), den = n - correction > 0 ? n - correction : 0;
    nb_tensor *r = run_pass(x, mask, keepdim, x->dtype,
                            (nb__reduce_args){.kind = NB__RK_VAR,
                                              .post = take_sqrt ? NB__RP_SQRT_DIV : NB__RP_DIV,
                                              .den = den},
                            op);
    nb__node *nd = record_mask(r, take_sqrt ? NB__OP_STD : NB__OP_VAR, x, mask, den);
    if (nd) {
        nb__save(nd, 0, x);
        if (take_sqrt) nb__save(nd, 1, r);
    }
    return r;
}

/* d var / dx = 2 (x - mean) / den, spread over the reduced dims. */
nb_status nb__bw_VAR(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    int dims[NB_MAX_DIMS], nd = mask_dims(n, dims);
    nb_tensor *x = up(n->saved[0]);
    nb_tensor *xc = nb_sub(x, nb_mean(x, dims, nd, true));
    gin[0] = nb_mul(xc, nb_mul_scalar(keep_shape(n, up(g)), 2.0 / n->attrs.f[0]));
    return done(gin);
}

/* d std / dx = (x - mean) / (den * std); zero where std is 0 (as PyTorch), not NaN. */
nb_status nb__bw_STD(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    int dims[NB_MAX_DIMS], nd = mask_dims(n, dims);
    nb_tensor *x = up(n->saved[0]), *sd = keep_shape(n, up(n->saved[1]));
    nb_tensor *xc = nb_sub(x, nb_mean(x, dims, nd, true));
    nb_tensor *fac = nb_div(keep_shape(n, up(g)), nb_mul_scalar(sd, n->attrs.f[0]));
    /* nb_where, not nb_masked_fill: the rule stays within the elementwise kernels. */
    nb_tensor *zero = fac ? nb_zeros_on(nb__device_of(fac), NULL, 0, fac->dtype) : NULL;
    fac = nb_where(nb_eq_scalar(sd, 0), zero, fac);
    gin[0] = nb_mul(xc, fac);
    return done(gin);
}

nb_tensor *nb_var(nb_tensor *x, const int *dims, int ndims, int correction, bool keepdim) {
    return var_std(x, dims, ndims, correction, keepdim, false, "var");
}

nb_tensor *nb_std(nb_tensor *x, const int *dims, int ndims, int correction, bool keepdim) {
    return var_std(x, dims, ndims, correction, keepdim, true, "std");
}

nb_tensor *nb_logsumexp(nb_tensor *x, const int *dims, int ndims, bool keepdim) {
    x = nb__autocast(x, NB_AUTOCAST_F32); /* nabla/autocast.h */
    bool mask[NB_MAX_DIMS];
    if (!prologue(x, dims, ndims, "logsumexp", mask) || !need_float(x, "logsumexp"))
        return NULL;
    nb_tensor *r = run_pass(x, mask, keepdim, x->dtype, (nb__reduce_args){.kind = NB__RK_LSE},
                            "logsumexp");
    nb__node *nd = record_mask(r, NB__OP_LOGSUMEXP, x, mask, 1.0);
    if (nd) {
        nb__save(nd, 0, x);
        nb__save(nd, 1, r);
    }
    return r;
}

/* d lse / dx = exp(x - lse): the softmax over the reduced dims. */
nb_status nb__bw_LOGSUMEXP(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *x = up(n->saved[0]), *lse = keep_shape(n, up(n->saved[1]));
    gin[0] = nb_mul(nb_exp(nb_sub(x, lse)), keep_shape(n, up(g)));
    return done(gin);
}

static nb_tensor *extreme(nb_tensor *x, const int *dims, int ndims, bool keepdim,
                          nb__rkind kind, const char *op) {
    bool mask[NB_MAX_DIMS];
    if (!prologue(x, dims, ndims, op, mask) || !nonempty(x, mask, op)) return NULL;
    nb_tensor *r = run_pass(x, mask, keepdim, x->dtype, (nb__reduce_args){.kind = kind}, op);
    nb__node *nd = record_mask(r, kind == NB__RK_MAX ? NB__OP_AMAX : NB__OP_AMIN, x, mask, 1.0);
    if (nd) {
        nb__save(nd, 0, x);
        nb__save(nd, 1, r);
    }
    return r;
}

/* amax / amin: g is split evenly among the elements equal to the extreme (PyTorch's rule),
 * so ties share it and the gradient sums to g. */
static nb_status bw_extreme(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    int dims[NB_MAX_DIMS], nd = mask_dims(n, dims);
    nb_tensor *x = up(n->saved[0]);
    nb_tensor *hit = nb_to_dtype(nb_eq(x, keep_shape(n, up(n->saved[1]))), x->dtype);
    nb_tensor *count = nb_sum(hit, dims, nd, true);
    gin[0] = nb_mul(hit, nb_div(keep_shape(n, up(g)), count));
    return done(gin);
}

nb_status nb__bw_AMAX(nb__node *n, nb_tensor *g, nb_tensor **gin) { return bw_extreme(n, g, gin); }
nb_status nb__bw_AMIN(nb__node *n, nb_tensor *g, nb_tensor **gin) { return bw_extreme(n, g, gin); }

nb_tensor *nb_amax(nb_tensor *x, const int *dims, int ndims, bool keepdim) {
    return extreme(x, dims, ndims, keepdim, NB__RK_MAX, "amax");
}

nb_tensor *nb_amin(nb_tensor *x, const int *dims, int ndims, bool keepdim) {
    return extreme(x, dims, ndims, keepdim, NB__RK_MIN, "amin");
}

/* max/min/argmax/argmin over one dim. values and/or indices are new tensors in the
 * caller's scope; *values is NULL-ed for argmax. Returns false on error. */
static bool arg_extreme(nb_tensor *x, int dim, bool keepdim, nb__rkind kind, const char *op,
                        nb_tensor **values, nb_tensor **indices) {
    if (!nb__arg_ok(x, op, "x")) return false;
    int d = nb__wrap_dim(dim, x->ndim, op);
    if (d < 0) return false;
    bool mask[NB_MAX_DIMS] = {false};
    mask[d] = x->ndim > 0;
    if (!nonempty(x, mask, op)) return false;
    int64_t shape[NB_MAX_DIMS];
    int n = out_shape(x, mask, keepdim, shape);
    nb__reduce_args a = {.kind = kind, .out_dtype = x->dtype};
    nb_device dev = nb__device_of(x);
    if (values) {
        *values = nb__empty(shape, n, x->dtype, dev);
        if (!*values) return false;
        a.out = nb__ptr(*values);
    }
    if (indices) {
        *indices = nb__empty(shape, n, NB_I64, dev);
        if (!*indices) return false;
        a.idx = (int64_t *)nb__ptr(*indices);
    }
    if (run_reduce(x, mask, &a, op)) return true;
    if (values) nb_tensor_free(nb__scope_take(*values)), *values = NULL;
    if (indices) nb_tensor_free(nb__scope_take(*indices)), *indices = NULL;
    return false;
}

/* max / min over one dim. The values are differentiable: when they record, the indices
 * are computed even if the caller does not want them, and saved for the backward. */
static nb_tensor *values_extreme(nb_tensor *x, int dim, bool keepdim, nb_tensor **indices,
                                 bool is_max) {
    const char *op = is_max ? "max" : "min";
    if (indices) *indices = NULL;
    bool rec = x && nb__needs_grad(&x, 1);
    nb_tensor *v = NULL, *i = NULL;
    nb_scope_begin();
    if (!arg_extreme(x, dim, keepdim, is_max ? NB__RK_ARGMAX : NB__RK_ARGMIN, op, &v,
                     (indices || rec) ? &i : NULL)) {
        nb_scope_end();
        return NULL;
    }
    nb__node *nd = nb__record(v, is_max ? NB__OP_MAX_DIM : NB__OP_MIN_DIM, &x, 1);
    if (nd) {
        nb__save(nd, 0, i);
        nd->attrs.i[0] = x->ndim ? nb__wrap_dim(dim, x->ndim, op) : 0;
        nd->attrs.flag = keepdim;
    }
    if (indices) *indices = nb_keep(i);
    nb_keep(v);
    nb_scope_end();
    return v;
}

nb_tensor *nb_max_dim(nb_tensor *x, int dim, bool keepdim, nb_tensor **indices) {
    return values_extreme(x, dim, keepdim, indices, true);
}

nb_tensor *nb_min_dim(nb_tensor *x, int dim, bool keepdim, nb_tensor **indices) {
    return values_extreme(x, dim, keepdim, indices, false);
}

/* The shape seen as (outer, len, inner) around dim d (a 0-dim tensor is one element). */
static void split3(const int64_t *shape, int ndim, int d, int64_t *outer, int64_t *len,
                   int64_t *inner) {
    *outer = *len = *inner = 1;
    for (int k = 0; k < ndim; k++) {
        if (k < d) *outer *= shape[k];
        else if (k == d) *len = shape[k];
        else *inner *= shape[k];
    }
}

/* max / min values: g goes to the position of the index that was returned (the first
 * extreme) along the dim; other positions get zero. One kernel writes the whole gradient. */
static nb_status bw_values_extreme(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    const nb__edge *e = &n->edges[0];
    if (e->ndim == 0) { /* a 0-dim input reduces to itself */
        gin[0] = nb__scope_add(nb_tensor_retain(g));
        return NB_OK;
    }
    int d = (int)n->attrs.i[0];
    nb_tensor *idx = n->saved[0];
    const char *op = n->op == NB__OP_MAX_DIM ? "max" : "min";
    nb_device dev;
    if (!nb__check_devices(op, (nb_tensor *[]){idx, g}, 2, &dev)) return nb_last_status();
    nb_tensor *gc = nb_contiguous(g); /* of the output's shape: no copy when contiguous */
    nb_tensor *dx = gc ? nb__empty(e->shape, e->ndim, g->dtype, dev) : NULL;
    if (!dx) return nb_last_status();
    NB__ASSERT(nb_is_contiguous(idx)); /* allocated by the forward */
    nb__extreme_backward_args a = {.g = nb__ptr(gc), .idx = (const int64_t *)nb__ptr(idx),
                                   .dx = nb__ptr(dx), .dtype = g->dtype};
    split3(e->shape, e->ndim, d, &a.outer, &a.len, &a.inner);
    nb_status st = nb__run_extreme_backward(dev, op, &a);
    if (st != NB_OK) return st;
    gin[0] = dx;
    return NB_OK;
}

nb_status nb__bw_MAX_DIM(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    return bw_values_extreme(n, g, gin);
}
nb_status nb__bw_MIN_DIM(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    return bw_values_extreme(n, g, gin);
}

nb_tensor *nb_argmax(nb_tensor *x, int dim, bool keepdim) {
    nb_tensor *i = NULL;
    return arg_extreme(x, dim, keepdim, NB__RK_ARGMAX, "argmax", NULL, &i) ? i : NULL;
}

nb_tensor *nb_argmin(nb_tensor *x, int dim, bool keepdim) {
    nb_tensor *i = NULL;
    return arg_extreme(x, dim, keepdim, NB__RK_ARGMIN, "argmin", NULL, &i) ? i : NULL;
}

/* A contiguous input is read directly; a strided one is first copied into the output,
 * which the kernel then transforms in place (no temporary the size of the input). */
static nb_tensor *softmax_impl(nb_tensor *x, int dim, bool lg, const char *op) {
    x = nb__autocast(x, NB_AUTOCAST_F32); /* nabla/autocast.h */
    if (!nb__arg_ok(x, op, "x") || !need_float(x, op)) return NULL;
    int d = nb__wrap_dim(dim, x->ndim, op);
    if (d < 0) return NULL;
    nb_device dev = nb__device_of(x);
    nb_tensor *out = nb__empty(x->shape, x->ndim, x->dtype, dev);
    if (!out) return NULL;
    const nb_tensor *src = x;
    nb_status st = NB_OK;
    if (!nb_is_contiguous(x)) {
        st = nb_copy_(out, x);
        src = out;
    }
    nb__softmax_args a = {.x = nb__ptr(src), .y = nb__ptr(out), .dtype = x->dtype, .log = lg};
    split3(x->shape, x->ndim, d, &a.outer, &a.len, &a.inner);
    if (st == NB_OK) st = nb__run_softmax(dev, op, &a);
    if (st != NB_OK) {
        nb_tensor_free(nb__scope_take(out));
        return NULL;
    }
    nb__node *nd = nb__record(out, lg ? NB__OP_LOG_SOFTMAX : NB__OP_SOFTMAX, &x, 1);
    if (nd) {
        nb__save(nd, 0, out); /* the backward needs only the output */
        nd->attrs.i[0] = d;
    }
    return out;
}

/* Fused: softmax dx = y (g - sum(g y)), log_softmax dx = g - exp(y) sum(g), from the saved
 * output y (contiguous: the op allocated it). */
static nb_status bw_softmax(nb__node *n, nb_tensor *g, nb_tensor **gin, bool lg) {
    nb_tensor *y = n->saved[0];
    NB__ASSERT(nb_is_contiguous(y));
    const char *op = lg ? "log_softmax" : "softmax";
    nb_device dev;
    if (!nb__check_devices(op, (nb_tensor *[]){y, g}, 2, &dev)) return nb_last_status();
    nb_tensor *gc = nb_contiguous(nb_to_dtype(g, y->dtype));
    nb_tensor *dx = gc ? nb__empty(y->shape, y->ndim, y->dtype, dev) : NULL;
    if (!dx) return nb_last_status();
    nb__softmax_backward_args a = {.y = nb__ptr(y), .g = nb__ptr(gc), .dx = nb__ptr(dx),
                                   .dtype = y->dtype, .log = lg};
    split3(y->shape, y->ndim, (int)n->attrs.i[0], &a.outer, &a.len, &a.inner);
    nb_status st = nb__run_softmax_backward(dev, op, &a);
    if (st != NB_OK) return st;
    gin[0] = dx;
    return NB_OK;
}

nb_status nb__bw_SOFTMAX(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    return bw_softmax(n, g, gin, false);
}
nb_status nb__bw_LOG_SOFTMAX(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    return bw_softmax(n, g, gin, true);
}

nb_tensor *nb_softmax(nb_tensor *x, int dim) { return softmax_impl(x, dim, false, "softmax"); }

nb_tensor *nb_log_softmax(nb_tensor *x, int dim) {
    return softmax_impl(x, dim, true, "log_softmax");
}
