/* tensor/ops/reduce.c - the reduction ops: sum, mean, var, std, logsumexp, amax, amin over
 * a set of dims, max/min (values and indices), argmax/argmin and softmax / log_softmax over
 * one dim. Argument checks, output shapes and dtypes live here; the arithmetic is in
 * cpu/reduce.c.
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
 *     Ties give the first index. var/std divide by max(0, n - correction). */

#include "cpu/reduce.h"
#include "tensor_impl.h"

static bool on_cpu(const nb_tensor *x, const char *op) {
    if (x->storage->device.type != NB_DEVICE_CPU) {
        nb__error(NB_EDEVICE, "%s: CUDA tensors are not supported by this op yet", op);
        return false;
    }
    return true;
}

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

/* The reduction into a new tensor of dtype odt. */
static nb_tensor *run_pass(nb_tensor *x, const bool *mask, bool keepdim, nb_dtype odt,
                           nb__rspec spec) {
    int64_t shape[NB_MAX_DIMS];
    int n = out_shape(x, mask, keepdim, shape);
    nb_tensor *out = nb__empty(shape, n, odt, x->storage->device);
    if (!out) return NULL;
    spec.out = out;
    nb__cpu_reduce(x, mask, &spec);
    return out;
}

/* Shared prologue of the set-of-dims reductions. */
static bool prologue(nb_tensor *x, const int *dims, int ndims, const char *op, bool *mask) {
    if (!nb__arg_ok(x, op, "x")) return false;
    if (!on_cpu(x, op)) return false;
    return parse_dims(x, dims, ndims, op, mask);
}

nb_tensor *nb_sum(nb_tensor *x, const int *dims, int ndims, bool keepdim) {
    bool mask[NB_MAX_DIMS];
    if (!prologue(x, dims, ndims, "sum", mask)) return NULL;
    nb_dtype odt = nb_dtype_is_float(x->dtype) ? x->dtype : NB_I64;
    return run_pass(x, mask, keepdim, odt, (nb__rspec){.kind = NB__RK_SUM});
}

nb_tensor *nb_mean(nb_tensor *x, const int *dims, int ndims, bool keepdim) {
    bool mask[NB_MAX_DIMS];
    if (!prologue(x, dims, ndims, "mean", mask) || !need_float(x, "mean")) return NULL;
    return run_pass(x, mask, keepdim, x->dtype,
                    (nb__rspec){.kind = NB__RK_SUM, .post = NB__RP_DIV,
                                .den = (double)reduced_count(x, mask)});
}

static nb_tensor *var_std(nb_tensor *x, const int *dims, int ndims, int correction,
                          bool keepdim, bool take_sqrt, const char *op) {
    bool mask[NB_MAX_DIMS];
    if (!prologue(x, dims, ndims, op, mask) || !need_float(x, op)) return NULL;
    double n = (double)reduced_count(x, mask), den = n - correction > 0 ? n - correction : 0;
    return run_pass(x, mask, keepdim, x->dtype,
                    (nb__rspec){.kind = NB__RK_VAR,
                                .post = take_sqrt ? NB__RP_SQRT_DIV : NB__RP_DIV, .den = den});
}

nb_tensor *nb_var(nb_tensor *x, const int *dims, int ndims, int correction, bool keepdim) {
    return var_std(x, dims, ndims, correction, keepdim, false, "var");
}

nb_tensor *nb_std(nb_tensor *x, const int *dims, int ndims, int correction, bool keepdim) {
    return var_std(x, dims, ndims, correction, keepdim, true, "std");
}

nb_tensor *nb_logsumexp(nb_tensor *x, const int *dims, int ndims, bool keepdim) {
    bool mask[NB_MAX_DIMS];
    if (!prologue(x, dims, ndims, "logsumexp", mask) || !need_float(x, "logsumexp"))
        return NULL;
    return run_pass(x, mask, keepdim, x->dtype, (nb__rspec){.kind = NB__RK_LSE});
}

static nb_tensor *extreme(nb_tensor *x, const int *dims, int ndims, bool keepdim,
                          nb__rkind kind, const char *op) {
    bool mask[NB_MAX_DIMS];
    if (!prologue(x, dims, ndims, op, mask) || !nonempty(x, mask, op)) return NULL;
    return run_pass(x, mask, keepdim, x->dtype, (nb__rspec){.kind = kind});
}

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
    if (!nb__arg_ok(x, op, "x") || !on_cpu(x, op)) return false;
    int d = nb__wrap_dim(dim, x->ndim, op);
    if (d < 0) return false;
    bool mask[NB_MAX_DIMS] = {false};
    mask[d] = x->ndim > 0;
    if (!nonempty(x, mask, op)) return false;
    int64_t shape[NB_MAX_DIMS];
    int n = out_shape(x, mask, keepdim, shape);
    nb__rspec spec = {.kind = kind};
    if (values) {
        spec.out = *values = nb__empty(shape, n, x->dtype, x->storage->device);
        if (!spec.out) return false;
    }
    if (indices) {
        spec.idx = *indices = nb__empty(shape, n, NB_I64, x->storage->device);
        if (!spec.idx) return false;
    }
    nb__cpu_reduce(x, mask, &spec);
    return true;
}

nb_tensor *nb_max_dim(nb_tensor *x, int dim, bool keepdim, nb_tensor **indices) {
    nb_tensor *v = NULL;
    if (indices) *indices = NULL;
    if (!arg_extreme(x, dim, keepdim, NB__RK_ARGMAX, "max", &v, indices)) {
        if (indices) *indices = NULL;
        return NULL;
    }
    return v;
}

nb_tensor *nb_min_dim(nb_tensor *x, int dim, bool keepdim, nb_tensor **indices) {
    nb_tensor *v = NULL;
    if (indices) *indices = NULL;
    if (!arg_extreme(x, dim, keepdim, NB__RK_ARGMIN, "min", &v, indices)) {
        if (indices) *indices = NULL;
        return NULL;
    }
    return v;
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
    if (!nb__arg_ok(x, op, "x") || !on_cpu(x, op) || !need_float(x, op)) return NULL;
    int d = nb__wrap_dim(dim, x->ndim, op);
    if (d < 0) return NULL;
    nb_tensor *out = nb__empty(x->shape, x->ndim, x->dtype, x->storage->device);
    if (!out) return NULL;
    const nb_tensor *src = x;
    if (!nb_is_contiguous(x)) {
        if (nb_copy_(out, x) != NB_OK) return NULL;
        src = out;
    }
    nb__cpu_softmax(src, out, d, lg);
    return out;
}

nb_tensor *nb_softmax(nb_tensor *x, int dim) { return softmax_impl(x, dim, false, "softmax"); }

nb_tensor *nb_log_softmax(nb_tensor *x, int dim) {
    return softmax_impl(x, dim, true, "log_softmax");
}
