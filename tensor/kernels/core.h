/* tensor/kernels/core.h - private: arguments of the core kernels (copy, fill, elementwise
 * forward and backward). C17 and nvcc; included through tensor/kernels.h. */
#ifndef NABLA_TENSOR_KERNELS_CORE_H
#define NABLA_TENSOR_KERNELS_CORE_H

/* copy: it has 2 operands, out (0) and in (1), any dtypes, one shape (in broadcast). */
typedef struct nb__copy_args {
    nb__iter it;
} nb__copy_args;

/* fill: every element of the iterator's one operand set to value converted to its dtype. */
typedef struct nb__fill_args {
    nb__iter it;
    double value;
} nb__fill_args;

/* Parameters of an elementwise kernel.
 *   pow_scalar: p0 = exponent (float dtypes), i0 = exponent >= 0 (integer dtypes);
 *   clamp: p0 = lo, p1 = hi (float dtypes), i0 = lo, i1 = hi inside the integer dtype's
 *   range (integer dtypes).
 *   b_scalar: binary kernels of f16/bf16 read operand b as the f32 value (float)p0
 *   instead of from memory, so a Python-style scalar is not rounded to half precision
 *   first (as PyTorch computes x_half * 0.1 in f32). Other dtypes ignore it. */
typedef struct nb__ew_ctx {
    double p0, p1;
    int64_t i0, i1;
    bool b_scalar;
} nb__ew_ctx;

/* ew: op (an elementwise NB__OP_*) in compute dtype `dtype` over it. Unary: operands
 * (out, x), out of dtype `dtype`. Binary: (out, a, b), out of `dtype`, or NB_BOOL for
 * comparisons. NB__OP_WHERE: (out, cond, a, b) with cond NB_BOOL. The op definition
 * guarantees the (op, dtype) pair is one nb__ew_supported accepts; every backend
 * implements all of those. A backend whose ew_half_in_f32 is set (tensor/backend_table.h)
 * also gets f16 and bf16 input operands (it.dtype[i], i >= 1) in an NB_F32 ew: it widens
 * them as it reads them, to the same values the f32 conversion would give.
 * ew_backward: the gradient of input `input` of op in float dtype `dtype` in one pass.
 * Unary ops: (gin, g, x) with x the saved tensor (the output for exp, sqrt, rsqrt, tanh,
 * sigmoid, relu; the input for the others). Binary (div's b, pow, maximum, minimum):
 * (gin, g, a, b). */
typedef struct nb__ew_args {
    nb__op op;
    int input; /* ew_backward only */
    nb_dtype dtype;
    nb__ew_ctx ctx;
    nb__iter it;
} nb__ew_args;

#define NB__K_CORE(X)                                                                      \
    X(copy, nb__copy_args, "strided copy with dtype conversion")                           \
    X(fill, nb__fill_args, "set every element to a value")                                 \
    X(ew, nb__ew_args, "elementwise forward")                                              \
    X(ew_backward, nb__ew_args, "elementwise backward, one input's gradient")

#endif
