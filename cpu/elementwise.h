/* cpu/elementwise.h - private to cpu/ (and tests): the CPU elementwise kernels behind the
 * ew and ew_backward entries of the kernel table.
 *
 * A kernel is an nb__iter_fn run by nb__iter_for_each over the operands
 * (out, in...) of one op, all already in the kernel's compute dtype except the output of
 * comparisons (NB_BOOL). Kernels do arithmetic only: the op definition decides shapes,
 * dtypes and conversions (docs/architecture.md rule 1). */
#ifndef NABLA_CPU_ELEMENTWISE_H
#define NABLA_CPU_ELEMENTWISE_H

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "cpu/fastmath.h"
#include "cpu/cpu_impl.h"

/* ---- vectorizable f32 exp ----------------------------------------------------------------
 * exp(x) = 2^k * exp(r), k = round(x / ln2), r = x - k ln2 in [-ln2/2, ln2/2] (Cody-Waite
 * split of ln2 so k*ln2_hi is exact), exp(r) by its degree-7 Taylor polynomial (truncation
 * error 5e-9 relative), and 2^k applied as two exact power-of-two factors so that results
 * down to the smallest subnormal are rounded once. Max error measured on every 7th f32 in
 * [-104, 89]: 0.93 ulp with FMA, 1.2 ulp without. The test suite checks it against libm.
 * Inline here so fused kernels elsewhere in cpu/ (attention, ...) vectorize their loops. */

static inline float nb__f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t nb__f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}


/* The kernels take an nb__ew_ctx (tensor/kernels/core.h) as their ctx. */

/* The kernel for op (an elementwise NB__OP_*) in compute dtype dt, or NULL when the pair
 * is not supported. Unary kernels: operands (out, x), out of dtype dt. Binary kernels:
 * (out, a, b), out of dtype dt, or NB_BOOL for comparisons. NB__OP_WHERE: (out, cond, a,
 * b) with cond NB_BOOL. */
nb__iter_fn nb__cpu_ew_kernel(nb__op op, nb_dtype dt);
/* Elements per thread below which op stays on one thread (smaller for costly math). */
int64_t nb__cpu_ew_grain(nb__op op);

/* The backward kernel computing the gradient of input `input` of op in float dtype dt
 * (f32, f64, f16, bf16) in one pass, or NULL when the rule uses forward ops instead.
 * Unary ops: operands (gin, g, x) where x is the saved tensor: the output for exp, sqrt,
 * rsqrt, tanh, sigmoid, relu; the input for the others. pow_scalar and clamp read their
 * parameters from the context as the forward kernels do. Binary ops (div's b, pow,
 * maximum, minimum): operands (gin, g, a, b), b_scalar as for the forward kernels. */
nb__iter_fn nb__cpu_ew_bw_kernel(nb__op op, int input, nb_dtype dt);

/* Vectorizable f32 exp (about 1 ulp; NaN, +-inf, overflow and subnormal results handled
 * as expf). Exposed for the tests and for fused kernels elsewhere in cpu/. */
float nb__cpu_expf(float x);
/* Vectorizable f32 tanh, gelu (erf form: x Phi(x)) and its derivative Phi(x) + x phi(x),
 * as the f32 kernels compute them (a few ulp; see elementwise.c). For the tests and fused
 * kernels. */
float nb__cpu_tanhf(float x);
float nb__cpu_geluf(float x);
float nb__cpu_gelu_gradf(float x);

#endif
