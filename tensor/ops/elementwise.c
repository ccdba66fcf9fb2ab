/* tensor/ops/elementwise.c - definitions of the elementwise ops: argument checks, output
 * shape (NumPy broadcasting) and dtype (PyTorch-style promotion), conversion of the operands
 * to the compute dtype, and dispatch to the CPU kernels in cpu/elementwise.c.
 *
 * Dtype rules (PyTorch is the model):
 *   - float functions (exp, log, sqrt, sigmoid, gelu, ...) of integer or bool tensors are
 *     computed and returned in f32;
 *   - neg, abs, relu, clamp keep integer dtypes; neg of bool is an error, relu and clamp of
 *     bool too; abs of bool or u8 is the identity;
 *   - binary ops compute in nb_dtype_promote(a, b); div is true division, so integer
 *     operands give f32; comparisons give NB_BOOL; on bool, add is logical or, mul logical
 *     and, sub and pow are errors;
 *   - a *_scalar's scalar behaves like a Python scalar: it takes the tensor's dtype when it
 *     can (any float tensor; an integral value that fits an integer tensor), otherwise the
 *     op computes in f32 (comparisons in f64, so 3 < 3.5 is exact). bool tensors with an
 *     integral scalar compute in i64 (True + 1 = 2). An integral scalar that does not fit
 *     an integer tensor (u8 + 300) is an error, as in PyTorch;
 *   - integer arithmetic wraps around on overflow; integer pow with a negative exponent
 *     in a tensor gives the integer part of the true value (1, -1 or 0; 0 ^ -n is 0), while
 *     pow_scalar of an integer tensor with a negative integral exponent is an error, as in
 *     PyTorch ("convert to a float dtype first"). No op performs an integer division, so
 *     there is no division by zero to define: 1 / 0 on i32 tensors is inf in f32.
 * Outputs are new contiguous tensors of the broadcast shape. */
#include <math.h>

#include "cpu/elementwise.h"
#include "tensor_impl.h"

static bool on_cpu(const nb_tensor *t, const char *op) {
    if (t->storage->device.type == NB_DEVICE_CPU) return true;
    nb__error(NB_EDEVICE, "%s: CUDA tensors are not supported by this op yet", op);
    return false;
}

static bool is_compare(nb__op op) {
    return op == NB__OP_EQ || op == NB__OP_NE || op == NB__OP_LT || op == NB__OP_LE ||
           op == NB__OP_GT || op == NB__OP_GE;
}

/* Run op's kernel in compute dtype kdt over ins[i] converted to in_dt[i], into a new
 * tensor of shape and dtype odt. The conversions are temporaries of an inner scope; only
 * the output leaves it. */
static nb_tensor *ew_run(nb__op op, nb_dtype kdt, nb_dtype odt, const int64_t *shape, int ndim,
                         nb_tensor *const *ins, const nb_dtype *in_dt, int nin,
                         const nb__ew_ctx *ctx) {
    nb__iter_fn fn = nb__cpu_ew_kernel(op, kdt);
    NB__ASSERT(fn != NULL && nin + 1 <= NB__ITER_MAX_ARGS); /* callers check dtypes first */
    nb_scope_begin();
    nb_tensor *ops[NB__ITER_MAX_ARGS] = {0};
    nb_tensor *out = NULL;
    for (int i = 0; i < nin; i++) {
        ops[i + 1] = ins[i]->dtype == in_dt[i] ? ins[i] : nb_to_dtype(ins[i], in_dt[i]);
        if (!ops[i + 1]) goto done;
    }
    out = nb__empty(shape, ndim, odt, NB_CPU);
    if (!out) goto done;
    ops[0] = out;
    if (nb__numel_of(shape, ndim) > 0) {
        nb__iter it;
        nb__iter_init(&it, shape, ndim, ops, nin + 1);
        nb__ew_ctx c = ctx ? *ctx : (nb__ew_ctx){0};
        nb__iter_for_each(&it, fn, &c, nb__cpu_ew_grain(op));
    }
    nb_keep(out);
done:
    nb_scope_end();
    return out;
}

static nb_tensor *unary_run(nb__op op, nb_tensor *x, nb_dtype kdt, const nb__ew_ctx *ctx) {
    return ew_run(op, kdt, kdt, x->shape, x->ndim, &x, &kdt, 1, ctx);
}

/* ---- unary ---------------------------------------------------------------------------------- */

/* Float functions: integer and bool inputs are computed in f32. */
static nb_tensor *unary_float(nb__op op, const char *name, nb_tensor *x) {
    NB__CHECK_ARG(x, name, "x");
    if (!on_cpu(x, name)) return NULL;
    return unary_run(op, x, nb_dtype_is_float(x->dtype) ? x->dtype : NB_F32, NULL);
}

#define NB__DEF_UNARY_FLOAT(fname, OP)                                                      \
    nb_tensor *nb_##fname(nb_tensor *x) { return unary_float(NB__OP_##OP, #fname, x); }
NB__DEF_UNARY_FLOAT(exp, EXP)
NB__DEF_UNARY_FLOAT(log, LOG)
NB__DEF_UNARY_FLOAT(log1p, LOG1P)
NB__DEF_UNARY_FLOAT(sqrt, SQRT)
NB__DEF_UNARY_FLOAT(rsqrt, RSQRT)
NB__DEF_UNARY_FLOAT(sin, SIN)
NB__DEF_UNARY_FLOAT(cos, COS)
NB__DEF_UNARY_FLOAT(tanh, TANH)
NB__DEF_UNARY_FLOAT(sigmoid, SIGMOID)
NB__DEF_UNARY_FLOAT(gelu, GELU)
NB__DEF_UNARY_FLOAT(gelu_tanh, GELU_TANH)
NB__DEF_UNARY_FLOAT(silu, SILU)

/* Ops that keep the input dtype where a kernel exists (neg, abs, relu). */
static nb_tensor *unary_same(nb__op op, const char *name, nb_tensor *x, const char *why_not) {
    NB__CHECK_ARG(x, name, "x");
    if (!on_cpu(x, name)) return NULL;
    if (!nb__cpu_ew_kernel(op, x->dtype)) {
        nb__error(NB_EDTYPE, "%s: %s tensors are not supported%s", name,
                  nb_dtype_name(x->dtype), why_not);
        return NULL;
    }
    return unary_run(op, x, x->dtype, NULL);
}

nb_tensor *nb_neg(nb_tensor *x) {
    return unary_same(NB__OP_NEG, "neg", x, " (to invert a bool mask use nb_eq(mask, false))");
}
nb_tensor *nb_abs(nb_tensor *x) { return unary_same(NB__OP_ABS, "abs", x, ""); }
nb_tensor *nb_relu(nb_tensor *x) { return unary_same(NB__OP_RELU, "relu", x, ""); }

/* True when v is a whole number (no fraction, not inf/NaN). */
static bool is_integral(double v) { return isfinite(v) && v == floor(v); }

/* Range of an integer dtype, as doubles (the i64 maximum rounds up to 2^63: callers
 * compare with < max for i64, see fits()). */
static void int_range(nb_dtype dt, double *lo, double *hi) {
    switch (dt) {
    case NB_I32: *lo = -2147483648.0, *hi = 2147483647.0; break;
    case NB_I64: *lo = -9223372036854775808.0, *hi = 9223372036854775808.0; break;
    case NB_U8: *lo = 0, *hi = 255; break;
    default: *lo = 0, *hi = 1; break; /* bool */
    }
}

/* Whether the integral value v is representable in integer dtype dt. */
static bool fits(double v, nb_dtype dt) {
    double lo, hi;
    int_range(dt, &lo, &hi);
    return v >= lo && (dt == NB_I64 ? v < hi : v <= hi);
}

/* Saturating conversion of a clamp bound (integral or +-inf) to dt's range. */
static int64_t int_bound(double v, nb_dtype dt) {
    double lo, hi;
    int_range(dt, &lo, &hi);
    if (v <= lo) return dt == NB_I64 ? INT64_MIN : (int64_t)lo;
    if (dt == NB_I64 ? v >= hi : v > hi) return dt == NB_I64 ? INT64_MAX : (int64_t)hi;
    return (int64_t)v;
}

nb_tensor *nb_pow_scalar(nb_tensor *x, double exponent) {
    NB__CHECK_ARG(x, "pow_scalar", "x");
    if (!on_cpu(x, "pow_scalar")) return NULL;
    nb__ew_ctx ctx = {.p0 = exponent};
    nb_dtype kdt = x->dtype;
    if (!nb_dtype_is_float(kdt)) {
        if (!is_integral(exponent)) {
            kdt = NB_F32; /* int ** 0.5 is a float, as in PyTorch */
        } else if (exponent < 0) {
            nb__error(NB_EINVAL, "pow_scalar: integer tensors cannot be raised to a negative "
                      "integer power (%g); convert to a float dtype first", exponent);
            return NULL;
        } else if (exponent >= 9223372036854775808.0) {
            nb__error(NB_EINVAL, "pow_scalar: exponent %g is too large for an integer tensor",
                      exponent);
            return NULL;
        } else {
            if (kdt == NB_BOOL) kdt = NB_I64; /* True ** 2 == 1, as PyTorch's int64 */
            ctx.i0 = (int64_t)exponent;
        }
    }
    return unary_run(NB__OP_POW_SCALAR, x, kdt, &ctx);
}

nb_tensor *nb_clamp(nb_tensor *x, double lo, double hi) {
    NB__CHECK_ARG(x, "clamp", "x");
    if (!on_cpu(x, "clamp")) return NULL;
    if (isnan(lo) || isnan(hi)) {
        nb__error(NB_EINVAL, "clamp: bounds must not be NaN (got lo=%g, hi=%g)", lo, hi);
        return NULL;
    }
    nb_dtype kdt = x->dtype;
    if (kdt == NB_BOOL) {
        nb__error(NB_EDTYPE, "clamp: bool tensors are not supported");
        return NULL;
    }
    nb__ew_ctx ctx = {.p0 = lo, .p1 = hi};
    if (!nb_dtype_is_float(kdt)) {
        bool whole = (isinf(lo) || is_integral(lo)) && (isinf(hi) || is_integral(hi));
        if (whole) {
            ctx.i0 = int_bound(lo, kdt);
            ctx.i1 = int_bound(hi, kdt);
        } else {
            kdt = NB_F32; /* a fractional bound makes the result float, as in PyTorch */
        }
    }
    return unary_run(NB__OP_CLAMP, x, kdt, &ctx);
}

/* ---- binary --------------------------------------------------------------------------------- */

static nb_tensor *binary(nb__op op, const char *name, nb_tensor *a, nb_tensor *b) {
    NB__CHECK_ARG(a, name, "a");
    NB__CHECK_ARG(b, name, "b");
    if (!on_cpu(a, name) || !on_cpu(b, name)) return NULL;
    int64_t shape[NB_MAX_DIMS];
    int ndim;
    if (!nb__broadcast_shapes(a->shape, a->ndim, b->shape, b->ndim, shape, &ndim, name))
        return NULL;
    nb_dtype kdt = nb_dtype_promote(a->dtype, b->dtype);
    if (op == NB__OP_DIV && !nb_dtype_is_float(kdt)) kdt = NB_F32; /* true division */
    if (!nb__cpu_ew_kernel(op, kdt)) {
        const char *hint = op == NB__OP_SUB && kdt == NB_BOOL
                               ? " (for a logical xor of masks use nb_ne)" : "";
        nb__error(NB_EDTYPE, "%s: %s operands are not supported%s", name, nb_dtype_name(kdt),
                  hint);
        return NULL;
    }
    nb_tensor *ins[2] = {a, b};
    nb_dtype in_dt[2] = {kdt, kdt};
    return ew_run(op, kdt, is_compare(op) ? NB_BOOL : kdt, shape, ndim, ins, in_dt, 2, NULL);
}

#define NB__DEF_BINARY(fname, OP)                                                           \
    nb_tensor *nb_##fname(nb_tensor *a, nb_tensor *b) {                                    \
        return binary(NB__OP_##OP, #fname, a, b);                                          \
    }
NB__DEF_BINARY(add, ADD)
NB__DEF_BINARY(sub, SUB)
NB__DEF_BINARY(mul, MUL)
NB__DEF_BINARY(div, DIV)
NB__DEF_BINARY(pow, POW)
NB__DEF_BINARY(maximum, MAXIMUM)
NB__DEF_BINARY(minimum, MINIMUM)
NB__DEF_BINARY(eq, EQ)
NB__DEF_BINARY(ne, NE)
NB__DEF_BINARY(lt, LT)
NB__DEF_BINARY(le, LE)
NB__DEF_BINARY(gt, GT)
NB__DEF_BINARY(ge, GE)

/* a <op> s with the Python-scalar dtype rule described at the top of this file. The scalar
 * becomes a 0-dim operand in the compute dtype; f16/bf16 kernels read it from the context
 * in f32 instead, so it is not rounded to half precision first. */
static nb_tensor *binary_scalar(nb__op op, const char *name, nb_tensor *a, double s) {
    NB__CHECK_ARG(a, name, "a");
    if (!on_cpu(a, name)) return NULL;
    bool cmp = is_compare(op);
    nb_dtype dt = a->dtype, kdt = dt;
    if (!nb_dtype_is_float(dt)) {
        if (!is_integral(s)) {
            kdt = cmp ? NB_F64 : NB_F32;
        } else {
            if (dt == NB_BOOL) kdt = cmp && fits(s, NB_BOOL) ? NB_BOOL : NB_I64;
            if (!fits(s, kdt)) {
                if (!cmp) {
                    nb__error(NB_EINVAL, "%s: the scalar %.17g does not fit in the tensor's "
                              "dtype %s", name, s, nb_dtype_name(kdt));
                    return NULL;
                }
                kdt = NB_F64; /* compare exactly against an out-of-range value */
            }
        }
    }
    if (op == NB__OP_DIV && !nb_dtype_is_float(kdt)) kdt = NB_F32;
    if (!nb__cpu_ew_kernel(op, kdt)) {
        nb__error(NB_EDTYPE, "%s: %s tensors are not supported", name, nb_dtype_name(kdt));
        return NULL;
    }
    nb__ew_ctx ctx = {.p0 = s, .b_scalar = true};
    nb_scope_begin();
    nb_tensor *out = NULL, *st = nb_scalar(s, kdt);
    if (st) {
        nb_tensor *ins[2] = {a, st};
        nb_dtype in_dt[2] = {kdt, kdt};
        out = nb_keep(ew_run(op, kdt, cmp ? NB_BOOL : kdt, a->shape, a->ndim, ins, in_dt, 2,
                             &ctx));
    }
    nb_scope_end();
    return out;
}

#define NB__DEF_BINARY_SCALAR(fname, OP)                                                    \
    nb_tensor *nb_##fname##_scalar(nb_tensor *a, double s) {                               \
        return binary_scalar(NB__OP_##OP, #fname "_scalar", a, s);                         \
    }
NB__DEF_BINARY_SCALAR(add, ADD)
NB__DEF_BINARY_SCALAR(sub, SUB)
NB__DEF_BINARY_SCALAR(mul, MUL)
NB__DEF_BINARY_SCALAR(div, DIV)
NB__DEF_BINARY_SCALAR(maximum, MAXIMUM)
NB__DEF_BINARY_SCALAR(minimum, MINIMUM)
NB__DEF_BINARY_SCALAR(eq, EQ)
NB__DEF_BINARY_SCALAR(lt, LT)
NB__DEF_BINARY_SCALAR(gt, GT)

/* ---- where ---------------------------------------------------------------------------------- */

nb_tensor *nb_where(nb_tensor *cond, nb_tensor *a, nb_tensor *b) {
    NB__CHECK_ARG(cond, "where", "cond");
    NB__CHECK_ARG(a, "where", "a");
    NB__CHECK_ARG(b, "where", "b");
    if (!on_cpu(cond, "where") || !on_cpu(a, "where") || !on_cpu(b, "where")) return NULL;
    if (cond->dtype != NB_BOOL) {
        nb__error(NB_EDTYPE, "where: cond must be a bool tensor, got %s",
                  nb_dtype_name(cond->dtype));
        return NULL;
    }
    int64_t ab[NB_MAX_DIMS], shape[NB_MAX_DIMS];
    int nab, ndim;
    if (!nb__broadcast_shapes(a->shape, a->ndim, b->shape, b->ndim, ab, &nab, "where") ||
        !nb__broadcast_shapes(cond->shape, cond->ndim, ab, nab, shape, &ndim, "where"))
        return NULL;
    nb_dtype kdt = nb_dtype_promote(a->dtype, b->dtype);
    nb_tensor *ins[3] = {cond, a, b};
    nb_dtype in_dt[3] = {NB_BOOL, kdt, kdt};
    return ew_run(NB__OP_WHERE, kdt, kdt, shape, ndim, ins, in_dt, 3, NULL);
}
