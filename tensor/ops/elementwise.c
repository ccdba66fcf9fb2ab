/* tensor/ops/elementwise.c - definitions of the elementwise ops: argument checks, output
 * shape (NumPy broadcasting) and dtype (PyTorch-style promotion), conversion of the operands
 * to the compute dtype, and one call into the kernel table (the ew and ew_backward
 * kernels of the operands' device).
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
 * Outputs are new contiguous tensors of the broadcast shape.
 *
 * Autograd: each differentiable op records one node on its float result (never on integer
 * or bool results; comparisons never record), with the original inputs, after the kernel
 * ran; the internal operand conversions run with grad mode off. The *_scalar forms record
 * as the tensor op with no second input, the scalar in attrs.f[0] and attrs.flag set. The
 * backward rules (nb__bw_*) and their conventions are at the end of this file. */
#include <math.h>
#include <string.h>

#include "tensor/tape.h"
#include "tensor/backend.h"

/* The (op, compute dtype) pairs the elementwise ops accept; every backend implements
 * each of them (a test checks the CPU table against this list). */
bool nb__ew_supported(nb__op op, nb_dtype dt) {
    if ((unsigned)dt >= NB_DTYPE_COUNT) return false;
    bool fl = nb_dtype_is_float(dt), in = dt == NB_I32 || dt == NB_I64 || dt == NB_U8;
    switch (op) {
    case NB__OP_EXP: case NB__OP_LOG: case NB__OP_LOG1P: case NB__OP_SQRT:
    case NB__OP_RSQRT: case NB__OP_SIN: case NB__OP_COS: case NB__OP_TANH:
    case NB__OP_SIGMOID: case NB__OP_GELU: case NB__OP_GELU_TANH: case NB__OP_SILU:
    case NB__OP_DIV:
        return fl;
    case NB__OP_NEG: case NB__OP_RELU: case NB__OP_POW_SCALAR: case NB__OP_CLAMP:
    case NB__OP_SUB: case NB__OP_POW:
        return fl || in;
    case NB__OP_ABS: case NB__OP_ADD: case NB__OP_MUL: case NB__OP_MAXIMUM:
    case NB__OP_MINIMUM: case NB__OP_EQ: case NB__OP_NE: case NB__OP_LT: case NB__OP_LE:
    case NB__OP_GT: case NB__OP_GE: case NB__OP_WHERE:
        return true;
    default: return false;
    }
}

/* The elementwise backward kernels: the gradient of input `input` of op in float dtype dt
 * in one pass (the rules below that do not use forward ops). */
bool nb__ew_backward_supported(nb__op op, int input, nb_dtype dt) {
    if (!nb_dtype_is_float(dt) || input < 0 || input > 1) return false;
    switch (op) {
    case NB__OP_ABS: case NB__OP_EXP: case NB__OP_LOG: case NB__OP_LOG1P: case NB__OP_SQRT:
    case NB__OP_RSQRT: case NB__OP_SIN: case NB__OP_COS: case NB__OP_TANH:
    case NB__OP_SIGMOID: case NB__OP_RELU: case NB__OP_GELU: case NB__OP_GELU_TANH:
    case NB__OP_SILU: case NB__OP_POW_SCALAR: case NB__OP_CLAMP:
        return input == 0;
    case NB__OP_DIV: return input == 1;
    case NB__OP_POW: case NB__OP_MAXIMUM: case NB__OP_MINIMUM: return true;
    default: return false;
    }
}

static bool is_compare(nb__op op) {
    return op == NB__OP_EQ || op == NB__OP_NE || op == NB__OP_LT || op == NB__OP_LE ||
           op == NB__OP_GT || op == NB__OP_GE;
}

/* Run op's kernel (forward when input < 0, else the backward kernel of that input) in
 * compute dtype kdt over ins[i] converted to in_dt[i], into a new tensor of shape and
 * dtype odt on the inputs' device. The conversions are temporaries of an inner scope; only
 * the output leaves it. They run with grad mode off: the public op records one node for
 * itself on the output, with its original inputs (an internal TO_DTYPE node would be
 * redundant). */
static nb_tensor *ew_exec(nb__op op, int input, nb_dtype kdt, nb_dtype odt,
                          const int64_t *shape, int ndim, nb_tensor *const *ins,
                          const nb_dtype *in_dt, int nin, const nb__ew_ctx *ctx) {
    NB__ASSERT(nin + 1 <= NB__ITER_MAX_ARGS);
    NB__ASSERT(input < 0 ? nb__ew_supported(op, kdt) : nb__ew_backward_supported(op, input, kdt));
    nb_device dev;
    if (!nb__check_devices(nb__op_names[op], ins, nin, &dev)) return NULL;
    /* f16/bf16 inputs of an f32 forward (bf16 + f32 under autocast, the residual adds of a
     * transformer) go to the kernel as they are where it widens them as it reads. */
    const bool half_in = input < 0 && kdt == NB_F32 && nb__ew_takes_half_in_f32(dev);
    bool prev_grad = nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_tensor *ops[NB__ITER_MAX_ARGS] = {0};
    nb_tensor *out = NULL;
    for (int i = 0; i < nin; i++) {
        nb_dtype want = in_dt[i];
        if (half_in && want == NB_F32 && (ins[i]->dtype == NB_BF16 || ins[i]->dtype == NB_F16))
            want = ins[i]->dtype;
        ops[i + 1] = ins[i]->dtype == want ? ins[i] : nb_to_dtype(ins[i], want);
        if (!ops[i + 1]) goto done;
    }
    out = nb__empty(shape, ndim, odt, dev);
    if (!out) goto done;
    ops[0] = out;
    if (nb__numel_of(shape, ndim) > 0) {
        nb__ew_args a = {.op = op, .input = input, .dtype = kdt};
        if (ctx) a.ctx = *ctx;
        nb__iter_init(&a.it, shape, ndim, ops, nin + 1);
        const char *name = nb__op_names[op];
        nb_status st = input < 0 ? nb__run_ew(dev, name, &a) : nb__run_ew_backward(dev, name, &a);
        if (st != NB_OK) {
            out = NULL;
            goto done;
        }
    }
    nb_keep(out);
done:
    nb_scope_end();
    nb_set_grad_enabled(prev_grad);
    return out;
}

/* Run op's forward kernel in compute dtype kdt (see ew_exec). */
static nb_tensor *ew_run(nb__op op, nb_dtype kdt, nb_dtype odt, const int64_t *shape, int ndim,
                         nb_tensor *const *ins, const nb_dtype *in_dt, int nin,
                         const nb__ew_ctx *ctx) {
    return ew_exec(op, -1, kdt, odt, shape, ndim, ins, in_dt, nin, ctx);
}

static nb_tensor *unary_run(nb__op op, nb_tensor *x, nb_dtype kdt, const nb__ew_ctx *ctx) {
    return ew_run(op, kdt, kdt, x->shape, x->ndim, &x, &kdt, 1, ctx);
}

/* ---- recording -------------------------------------------------------------------------------
 * Only float results record (an integer or bool result has no gradient); nb__record itself
 * returns NULL when grad mode is off or no input requires grad, so inference saves nothing. */
static bool wants(const nb__node *n, int i) { return n->edges[i].node || n->edges[i].leaf; }

/* Unary rules whose derivative is cheaper from the output than from the input. */
static bool bw_reads_output(nb__op op) {
    return op == NB__OP_EXP || op == NB__OP_SQRT || op == NB__OP_RSQRT || op == NB__OP_TANH ||
           op == NB__OP_SIGMOID || op == NB__OP_RELU;
}

/* Record a unary op on out and save what its rule reads (ctx: pow_scalar's exponent,
 * clamp's bounds, kept in attrs.f[0..1]). Returns out. */
static nb_tensor *record_unary(nb_tensor *out, nb__op op, nb_tensor *x, const nb__ew_ctx *ctx) {
    if (!out || !nb_dtype_is_float(out->dtype)) return out;
    nb__node *nd = nb__record(out, op, &x, 1);
    if (!nd) return out;
    if (op != NB__OP_NEG) nb__save(nd, 0, bw_reads_output(op) ? out : x);
    if (ctx) nd->attrs.f[0] = ctx->p0, nd->attrs.f[1] = ctx->p1;
    return out;
}

/* ---- unary ---------------------------------------------------------------------------------- */

/* Float functions: integer and bool inputs are computed in f32. */
static nb_tensor *unary_float(nb__op op, const char *name, nb_tensor *x) {
    NB__CHECK_ARG(x, name, "x");
    return record_unary(unary_run(op, x, nb_dtype_is_float(x->dtype) ? x->dtype : NB_F32, NULL),
                        op, x, NULL);
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
    if (!nb__ew_supported(op, x->dtype)) {
        nb__error(NB_EDTYPE, "%s: %s tensors are not supported%s", name,
                  nb_dtype_name(x->dtype), why_not);
        return NULL;
    }
    return record_unary(unary_run(op, x, x->dtype, NULL), op, x, NULL);
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
    nb_tensor *out = unary_run(NB__OP_POW_SCALAR, x, kdt, &ctx);
    return record_unary(out, NB__OP_POW_SCALAR, x, &ctx);
}

nb_tensor *nb_clamp(nb_tensor *x, double lo, double hi) {
    NB__CHECK_ARG(x, "clamp", "x");
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
    return record_unary(unary_run(NB__OP_CLAMP, x, kdt, &ctx), NB__OP_CLAMP, x, &ctx);
}

/* ---- binary --------------------------------------------------------------------------------- */

/* Record a binary op (not comparisons) and save the operands its rule reads: slot 0 = a,
 * slot 1 = b, each only when the other input's gradient (or its own, for div/pow/max/min)
 * needs it. */
static void record_binary(nb_tensor *out, nb__op op, nb_tensor *a, nb_tensor *b) {
    if (!out || is_compare(op) || !nb_dtype_is_float(out->dtype)) return;
    nb__node *nd = nb__record(out, op, (nb_tensor *[]){a, b}, 2);
    if (!nd) return;
    bool ga = wants(nd, 0), gb = wants(nd, 1);
    switch (op) {
    case NB__OP_MUL: /* d/da = g b, d/db = g a */
        if (gb) nb__save(nd, 0, a);
        if (ga) nb__save(nd, 1, b);
        break;
    case NB__OP_DIV: /* d/da = g / b, d/db = -g a / b^2 */
        if (gb) nb__save(nd, 0, a);
        nb__save(nd, 1, b);
        break;
    case NB__OP_POW:
    case NB__OP_MAXIMUM:
    case NB__OP_MINIMUM:
        nb__save(nd, 0, a);
        nb__save(nd, 1, b);
        break;
    default: break; /* add, sub: nothing */
    }
}

static nb_tensor *binary(nb__op op, const char *name, nb_tensor *a, nb_tensor *b) {
    NB__CHECK_ARG(a, name, "a");
    NB__CHECK_ARG(b, name, "b");
    if (!nb__check_devices(name, (nb_tensor *[]){a, b}, 2, NULL)) return NULL;
    int64_t shape[NB_MAX_DIMS];
    int ndim;
    if (!nb__broadcast_shapes(a->shape, a->ndim, b->shape, b->ndim, shape, &ndim, name))
        return NULL;
    nb_dtype kdt = nb_dtype_promote(a->dtype, b->dtype);
    if (op == NB__OP_DIV && !nb_dtype_is_float(kdt)) kdt = NB_F32; /* true division */
    if (!nb__ew_supported(op, kdt)) {
        const char *hint = op == NB__OP_SUB && kdt == NB_BOOL
                               ? " (for a logical xor of masks use nb_ne)" : "";
        nb__error(NB_EDTYPE, "%s: %s operands are not supported%s", name, nb_dtype_name(kdt),
                  hint);
        return NULL;
    }
    nb_tensor *ins[2] = {a, b};
    nb_dtype in_dt[2] = {kdt, kdt};
    nb_tensor *out = ew_run(op, kdt, is_compare(op) ? NB_BOOL : kdt, shape, ndim, ins, in_dt,
                            2, NULL);
    record_binary(out, op, a, b);
    return out;
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
    if (!nb__ew_supported(op, kdt)) {
        nb__error(NB_EDTYPE, "%s: %s tensors are not supported", name, nb_dtype_name(kdt));
        return NULL;
    }
    nb__ew_ctx ctx = {.p0 = s, .b_scalar = true};
    nb_scope_begin();
    nb_tensor *out = NULL, *st = nb_full_on(nb__device_of(a), NULL, 0, kdt, s);
    if (st) {
        nb_tensor *ins[2] = {a, st};
        nb_dtype in_dt[2] = {kdt, kdt};
        out = nb_keep(ew_run(op, kdt, cmp ? NB_BOOL : kdt, a->shape, a->ndim, ins, in_dt, 2,
                             &ctx));
    }
    nb_scope_end();
    /* Recorded as the tensor op with no second input: attrs.flag marks the scalar form and
     * attrs.f[0] holds the scalar for the rule. */
    if (out && !cmp && nb_dtype_is_float(out->dtype)) {
        nb__node *nd = nb__record(out, op, (nb_tensor *[]){a, NULL}, 2);
        if (nd) {
            nd->attrs.flag = true;
            nd->attrs.f[0] = s;
            if (op == NB__OP_MAXIMUM || op == NB__OP_MINIMUM) nb__save(nd, 0, a);
        }
    }
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

/* ---- in place ------------------------------------------------------------------------------
 * dst += src: src broadcast to dst's shape and converted to dst's dtype, the ADD kernel
 * writing into dst (operands dst, dst, src). The autograd engine accumulates gradients
 * with it. Not recorded: refused on tensors in the graph while grad mode is on. */
nb_status nb_add_(nb_tensor *dst, nb_tensor *src) {
    if (!nb__arg_ok(dst, "add_", "dst") || !nb__arg_ok(src, "add_", "src"))
        return nb_last_status();
    nb_device dev;
    if (!nb__check_devices("add_", (nb_tensor *[]){dst, src}, 2, &dev)) return NB_EDEVICE;
    if (!nb__inplace_ok(dst, "add_")) return NB_EINVAL;
    int64_t sh[NB_MAX_DIMS];
    int nd;
    if (!nb__broadcast_shapes(dst->shape, dst->ndim, src->shape, src->ndim, sh, &nd, "add_"))
        return NB_ESHAPE;
    if (nd != dst->ndim || memcmp(sh, dst->shape, sizeof(int64_t) * (size_t)nd) != 0)
        return nb__error(NB_ESHAPE, "add_: %s does not broadcast to the destination's shape %s",
                         NB__SHAPE(src), NB__SHAPE(dst));
    if (!nb__ew_supported(NB__OP_ADD, dst->dtype))
        return nb__error(NB_EDTYPE, "add_: %s tensors are not supported",
                         nb_dtype_name(dst->dtype));
    if (nb_numel(dst) == 0) return NB_OK;
    nb__bump_version(dst);
    bool prev_grad = nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_tensor *s = nb_to_dtype(src, dst->dtype);
    nb_status st = s ? NB_OK : nb_last_status();
    if (s) {
        nb__ew_args a = {.op = NB__OP_ADD, .input = -1, .dtype = dst->dtype};
        nb__iter_init(&a.it, dst->shape, dst->ndim, (nb_tensor *[]){dst, dst, s}, 3);
        st = nb__run_ew(dev, "add_", &a);
    }
    nb_scope_end();
    nb_set_grad_enabled(prev_grad);
    return st;
}

/* ---- where ---------------------------------------------------------------------------------- */

nb_tensor *nb_where(nb_tensor *cond, nb_tensor *a, nb_tensor *b) {
    NB__CHECK_ARG(cond, "where", "cond");
    NB__CHECK_ARG(a, "where", "a");
    NB__CHECK_ARG(b, "where", "b");
    if (!nb__check_devices("where", (nb_tensor *[]){cond, a, b}, 3, NULL)) return NULL;
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
    nb_tensor *out = ew_run(NB__OP_WHERE, kdt, kdt, shape, ndim, ins, in_dt, 3, NULL);
    if (out && nb_dtype_is_float(kdt)) { /* cond gets no gradient: it is not an input edge */
        nb__node *nd = nb__record(out, NB__OP_WHERE, (nb_tensor *[]){NULL, a, b}, 3);
        if (nd) nb__save(nd, 0, cond);
    }
    return out;
}

/* ---- backward rules ---------------------------------------------------------------------------
 * The engine runs these with grad mode off, sums gradients over broadcast dims and converts
 * them to each input's dtype, so a rule returns the output's shape in the output's dtype
 * (the compute dtype). Conventions at non-differentiable points follow PyTorch:
 *   - abs'(0) = 0; relu'(0) = 0 (gradient passes where the output is > 0, or NaN);
 *   - clamp passes the gradient where lo <= x <= hi, boundaries included;
 *   - maximum/minimum (also the *_scalar forms): the larger (smaller) operand gets the
 *     gradient, a tie gives each operand half, and NaN (unordered) passes it to both;
 *   - pow(a, b): d/da = g b a^(b-1), set to 0 where b == 0 (so 0^0 has gradient 0, not
 *     NaN); d/db = g a^b log(a), set to 0 where a == 0 and b >= 0 (log(0) = -inf times
 *     0^b = 0 would give NaN), NaN for a < 0 (log of a negative number), -inf * g for a == 0
 *     and b < 0. pow_scalar's gradient is 0 for exponent 0;
 *   - sqrt'(0) = inf, log'(0) = inf, d/db of a / b at b == 0 is -inf/NaN: no masking, the
 *     true limits propagate as in PyTorch.
 * Unary rules and div/pow/max/min run one fused kernel from cpu/elementwise.c each, so
 * backward makes one tensor per gradient instead of a chain of temporaries. */

/* gin[input] = the fused backward kernel of (n->op, input) over (g, xs...). */
static nb_status bw_kernel(nb__node *n, int input, nb_tensor *g, nb_tensor *const *xs, int nx,
                           const nb__ew_ctx *ctx, nb_tensor **gin) {
    nb_dtype dt = n->out_dtype;
    nb_tensor *ins[3] = {g, nx > 0 ? xs[0] : NULL, nx > 1 ? xs[1] : NULL};
    nb_dtype in_dt[3] = {dt, dt, dt};
    for (int i = 0; i <= nx; i++)
        if (!ins[i]) return nb__error(NB_ESTATE, "backward: %s lost a saved tensor",
                                      nb__op_names[n->op]);
    gin[input] = ew_exec(n->op, input, dt, dt, n->out_shape, n->out_ndim, ins, in_dt, nx + 1,
                         ctx);
    return gin[input] ? NB_OK : nb_last_status();
}

static nb_status bw_unary(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    if (!wants(n, 0)) return NB_OK;
    nb__ew_ctx ctx = {.p0 = n->attrs.f[0], .p1 = n->attrs.f[1]};
    return bw_kernel(n, 0, g, n->saved, 1, &ctx, gin);
}

#define NB__DEF_BW_UNARY(OP)                                                                \
    nb_status nb__bw_##OP(nb__node *n, nb_tensor *g, nb_tensor **gin) {                    \
        return bw_unary(n, g, gin);                                                        \
    }
NB__DEF_BW_UNARY(ABS)
NB__DEF_BW_UNARY(EXP)
NB__DEF_BW_UNARY(LOG)
NB__DEF_BW_UNARY(LOG1P)
NB__DEF_BW_UNARY(SQRT)
NB__DEF_BW_UNARY(RSQRT)
NB__DEF_BW_UNARY(SIN)
NB__DEF_BW_UNARY(COS)
NB__DEF_BW_UNARY(TANH)
NB__DEF_BW_UNARY(SIGMOID)
NB__DEF_BW_UNARY(RELU)
NB__DEF_BW_UNARY(GELU)
NB__DEF_BW_UNARY(GELU_TANH)
NB__DEF_BW_UNARY(SILU)
NB__DEF_BW_UNARY(POW_SCALAR)
NB__DEF_BW_UNARY(CLAMP)

nb_status nb__bw_NEG(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    if (wants(n, 0) && !(gin[0] = nb_neg(g))) return nb_last_status();
    return NB_OK;
}

nb_status nb__bw_ADD(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    for (int i = 0; i < 2; i++) /* a scalar form has no input 1 */
        if (wants(n, i)) gin[i] = nb__scope_add(nb_tensor_retain(g));
    return NB_OK;
}

nb_status nb__bw_SUB(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    if (wants(n, 0)) gin[0] = nb__scope_add(nb_tensor_retain(g));
    if (wants(n, 1) && !(gin[1] = nb_neg(g))) return nb_last_status();
    return NB_OK;
}

nb_status nb__bw_MUL(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    if (n->attrs.flag) {
        if (wants(n, 0) && !(gin[0] = nb_mul_scalar(g, n->attrs.f[0]))) return nb_last_status();
        return NB_OK;
    }
    if (wants(n, 0) && !(gin[0] = nb_mul(g, n->saved[1]))) return nb_last_status();
    if (wants(n, 1) && !(gin[1] = nb_mul(g, n->saved[0]))) return nb_last_status();
    return NB_OK;
}

nb_status nb__bw_DIV(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    if (n->attrs.flag) {
        if (wants(n, 0) && !(gin[0] = nb_div_scalar(g, n->attrs.f[0]))) return nb_last_status();
        return NB_OK;
    }
    if (wants(n, 0) && !(gin[0] = nb_div(g, n->saved[1]))) return nb_last_status();
    if (wants(n, 1)) return bw_kernel(n, 1, g, n->saved, 2, NULL, gin);
    return NB_OK;
}

/* pow, maximum, minimum: one fused kernel per input over (g, a, b). The scalar forms of
 * maximum/minimum pass the scalar as a 0-dim b and, for f16/bf16, as the f32 value the
 * forward compared against (b_scalar). */
static nb_status bw_binary_fused(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    nb__ew_ctx ctx = {0};
    nb_tensor *ab[2] = {n->saved[0], n->saved[1]};
    if (n->attrs.flag) {
        ctx = (nb__ew_ctx){.p0 = n->attrs.f[0], .b_scalar = true};
        ab[1] = nb_full_on(nb__device_of(g), NULL, 0, n->out_dtype, n->attrs.f[0]);
        if (!ab[1]) return nb_last_status();
    }
    for (int i = 0; i < 2; i++) {
        if (!wants(n, i)) continue;
        nb_status st = bw_kernel(n, i, g, ab, 2, &ctx, gin);
        if (st != NB_OK) return st;
    }
    return NB_OK;
}

nb_status nb__bw_POW(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    return bw_binary_fused(n, g, gin);
}
nb_status nb__bw_MAXIMUM(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    return bw_binary_fused(n, g, gin);
}
nb_status nb__bw_MINIMUM(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    return bw_binary_fused(n, g, gin);
}

/* where: g goes to a where cond holds and to b elsewhere. */
nb_status nb__bw_WHERE(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *zero = nb_zeros_on(nb__device_of(g), NULL, 0, g->dtype);
    if (!zero) return nb_last_status();
    if (wants(n, 1) && !(gin[1] = nb_where(n->saved[0], g, zero))) return nb_last_status();
    if (wants(n, 2) && !(gin[2] = nb_where(n->saved[0], zero, g))) return nb_last_status();
    return NB_OK;
}
