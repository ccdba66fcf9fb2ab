/* test_elementwise.c - the elementwise ops (unary math, broadcasting binary ops and
 * comparisons, the scalar forms, where) against plain double-precision references, over
 * every dtype, 0-dim / empty / size-1 / non-contiguous / broadcast shapes, plus the special
 * values, integer wrap-around, the polynomial exp's accuracy and the user errors. */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/elementwise.h"
#include "testutil.h"

static const nb_dtype all_dtypes[] = {NB_F32, NB_F64, NB_F16, NB_BF16,
                                      NB_I32, NB_I64, NB_U8,  NB_BOOL};
#define NDT (int)(sizeof all_dtypes / sizeof all_dtypes[0])
#define COUNT(a) (int)(sizeof(a) / sizeof((a)[0]))

typedef struct {
    int ndim;
    int64_t shape[4];
} tshape;

/* Shapes for unary ops: 0-dim, empty, size-1 dims, plain, wide enough for several rows. */
static const tshape ushapes[] = {
    {0, {0}},    {1, {0}},       {3, {3, 0, 2}}, {1, {1}},        {1, {7}},
    {2, {1, 1}}, {3, {2, 1, 3}}, {2, {4, 5}},    {3, {3, 4, 5}},
};

static bool is_float_dt(nb_dtype dt) {
    return dt == NB_F32 || dt == NB_F64 || dt == NB_F16 || dt == NB_BF16;
}

/* The value a double result has once stored in dtype dt: integers wrap around, floats
 * round (so an f16 result past 65504 is inf in the reference too). */
static double as_dtype(double v, nb_dtype dt) {
    switch (dt) {
    case NB_U8: return (double)(uint8_t)(uint64_t)(int64_t)v;
    case NB_I32: return (double)(int32_t)(uint32_t)(uint64_t)(int64_t)v;
    case NB_BOOL: return v != 0;
    case NB_F32: return (float)v;
    case NB_F16: return nb_f16_to_f32(nb_f32_to_f16((float)v));
    case NB_BF16: return nb_bf16_to_f32(nb_f32_to_bf16((float)v));
    default: return v;
    }
}

/* Test data for dtype dt: floats uniform in [lo, hi); integers in [ilo, ihi) (u8 from 0). */
static nb_tensor *data_for(const tshape *s, nb_dtype dt, double lo, double hi, double ilo,
                           double ihi, uint64_t seed) {
    if (is_float_dt(dt)) return tu_random(s->shape, s->ndim, dt, lo, hi, seed);
    if (dt == NB_U8) return tu_random(s->shape, s->ndim, dt, 0, ihi - ilo, seed);
    if (dt == NB_BOOL) return tu_random(s->shape, s->ndim, dt, 0, 2, seed);
    return tu_random(s->shape, s->ndim, dt, ilo, ihi, seed);
}

/* Linear index into a row-major tensor of shape sh[nd] broadcast to the out index idx[ond]. */
static int64_t bcast_index(const int64_t *idx, int ond, const int64_t *sh, int nd) {
    int64_t lin = 0;
    for (int d = 0; d < nd; d++) {
        int64_t i = sh[d] == 1 ? 0 : idx[ond - nd + d];
        lin = lin * sh[d] + i;
    }
    return lin;
}

/* ---- unary ---------------------------------------------------------------------------------- */

static double r_neg(double x) { return -x; }
static double r_abs(double x) { return fabs(x); }
static double r_sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double r_relu(double x) { return x < 0 ? 0 : x; }
static double r_rsqrt(double x) { return 1 / sqrt(x); }
static double r_gelu(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }
static double r_gelu_tanh(double x) {
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
static double r_silu(double x) { return x / (1 + exp(-x)); }

enum { U_FLOAT, U_SAME };
typedef struct {
    const char *name;
    nb_tensor *(*fn)(nb_tensor *);
    double (*ref)(double);
    double lo, hi; /* float data range; integer data is [-10, 10) */
    int kind;      /* U_FLOAT: integer inputs give f32; U_SAME: keeps the dtype */
} unary_case;

static const unary_case ucases[] = {
    {"neg", nb_neg, r_neg, -4, 4, U_SAME},
    {"abs", nb_abs, r_abs, -4, 4, U_SAME},
    {"exp", nb_exp, exp, -6, 6, U_FLOAT},
    {"log", nb_log, log, 0.05, 8, U_FLOAT},
    {"log1p", nb_log1p, log1p, -0.9, 8, U_FLOAT},
    {"sqrt", nb_sqrt, sqrt, 0, 9, U_FLOAT},
    {"rsqrt", nb_rsqrt, r_rsqrt, 0.05, 9, U_FLOAT},
    {"sin", nb_sin, sin, -7, 7, U_FLOAT},
    {"cos", nb_cos, cos, -7, 7, U_FLOAT},
    {"tanh", nb_tanh, tanh, -4, 4, U_FLOAT},
    {"sigmoid", nb_sigmoid, r_sigmoid, -8, 8, U_FLOAT},
    {"relu", nb_relu, r_relu, -4, 4, U_SAME},
    {"gelu", nb_gelu, r_gelu, -5, 5, U_FLOAT},
    {"gelu_tanh", nb_gelu_tanh, r_gelu_tanh, -5, 5, U_FLOAT},
    {"silu", nb_silu, r_silu, -8, 8, U_FLOAT},
};

/* Run one unary op on x and compare with the reference, or check the expected error. */
static void check_unary(const unary_case *uc, nb_tensor *x) {
    nb_dtype dt = nb_tensor_dtype(x);
    nb_tensor *y = uc->fn(x);
    if (dt == NB_BOOL && uc->kind == U_SAME && uc->fn != nb_abs) {
        tu_assert_error(y, NB_EDTYPE, uc->name);
        return;
    }
    nb_dtype odt = uc->kind == U_FLOAT && !is_float_dt(dt) ? NB_F32 : dt;
    ck_assert_msg(y != NULL, "%s(%s): %s", uc->name, nb_dtype_name(dt), nb_last_error());
    ck_assert_msg(nb_tensor_dtype(y) == odt, "%s(%s) gave %s", uc->name, nb_dtype_name(dt),
                  nb_dtype_name(nb_tensor_dtype(y)));
    ck_assert(nb_is_contiguous(y));
    int64_t n = nb_numel(x);
    double *xv = tu_values(x), *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) ref[i] = as_dtype(uc->ref(xv[i]), odt);
    tu_assert_close(y, ref, nb_shape(x), nb_ndim(x), tu_tol(odt));
    free(xv);
    free(ref);
}

START_TEST(test_unary) {
    const unary_case *uc = &ucases[_i];
    nb_scope_begin();
    for (int k = 0; k < NDT; k++) {
        for (int s = 0; s < COUNT(ushapes); s++) {
            nb_tensor *x = data_for(&ushapes[s], all_dtypes[k], uc->lo, uc->hi, -10, 10,
                                    (uint64_t)(s * 31 + k));
            check_unary(uc, x);
            if (ushapes[s].ndim > 0) check_unary(uc, tu_noncontig(x));
        }
    }
    /* Long enough to run on several threads. */
    for (int k = 0; k < 3; k++) {
        tshape big = {2, {300, 257}};
        check_unary(uc, data_for(&big, all_dtypes[k], uc->lo, uc->hi, -10, 10, 99));
    }
    nb_scope_end();
}
END_TEST

/* pow_scalar over exponents and dtypes, integer exponents keeping integer dtypes. */
START_TEST(test_pow_scalar) {
    nb_scope_begin();
    const double exps[] = {2, 3, 0.5, 1, 0, -1, 1.7, -0.5};
    for (int k = 0; k < NDT; k++) {
        nb_dtype dt = all_dtypes[k];
        for (int e = 0; e < COUNT(exps); e++) {
            for (int s = 0; s < COUNT(ushapes); s++) {
                nb_tensor *x = data_for(&ushapes[s], dt, -3, 3, -4, 4, (uint64_t)(s + 7 * k));
                if (s % 2) x = ushapes[s].ndim ? tu_noncontig(x) : x;
                double p = exps[e];
                nb_tensor *y = nb_pow_scalar(x, p);
                bool whole = p == floor(p);
                if (!is_float_dt(dt) && whole && p < 0) {
                    tu_assert_error(y, NB_EINVAL, "negative");
                    continue;
                }
                nb_dtype odt = is_float_dt(dt) ? dt : !whole ? NB_F32 : dt == NB_BOOL ? NB_I64 : dt;
                ck_assert_msg(y && nb_tensor_dtype(y) == odt, "pow_scalar(%s, %g)",
                              nb_dtype_name(dt), p);
                int64_t n = nb_numel(x);
                double *xv = tu_values(x), *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
                for (int64_t i = 0; i < n; i++) ref[i] = as_dtype(pow(xv[i], p), odt);
                tu_assert_close(y, ref, nb_shape(x), nb_ndim(x), tu_tol(odt));
                free(xv);
                free(ref);
            }
        }
    }
    /* Integer powers wrap around like two's complement: 3^41 mod 2^64. */
    nb_tensor *t = nb_pow_scalar(nb_scalar(3, NB_I64), 41);
    uint64_t w = 1;
    for (int i = 0; i < 41; i++) w *= 3u;
    ck_assert(nb_item_i64(t) == (int64_t)w);
    tu_assert_error(nb_pow_scalar(nb_scalar(3, NB_I32), 1e30), NB_EINVAL, "too large");
    nb_scope_end();
}
END_TEST

START_TEST(test_clamp) {
    nb_scope_begin();
    const double bounds[][2] = {{-1, 2},      {-INFINITY, 0}, {0.5, INFINITY}, {-1e30, 1e30},
                                {3, 1},       {-2.5, 2.5},    {-INFINITY, INFINITY}};
    for (int k = 0; k < NDT; k++) {
        nb_dtype dt = all_dtypes[k];
        for (int b = 0; b < COUNT(bounds); b++) {
            for (int s = 0; s < COUNT(ushapes); s++) {
                nb_tensor *x = data_for(&ushapes[s], dt, -4, 4, -5, 5, (uint64_t)(s + b));
                if (s % 2) x = ushapes[s].ndim ? tu_noncontig(x) : x;
                double lo = bounds[b][0], hi = bounds[b][1];
                nb_tensor *y = nb_clamp(x, lo, hi);
                if (dt == NB_BOOL) {
                    tu_assert_error(y, NB_EDTYPE, "clamp");
                    continue;
                }
                bool whole = (isinf(lo) || lo == floor(lo)) && (isinf(hi) || hi == floor(hi));
                nb_dtype odt = is_float_dt(dt) || whole ? dt : NB_F32;
                ck_assert_msg(y && nb_tensor_dtype(y) == odt, "clamp(%s)", nb_dtype_name(dt));
                int64_t n = nb_numel(x);
                double *xv = tu_values(x), *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
                for (int64_t i = 0; i < n; i++) ref[i] = fmin(fmax(xv[i], lo), hi);
                tu_assert_close(y, ref, nb_shape(x), nb_ndim(x), tu_tol(odt));
                free(xv);
                free(ref);
            }
        }
    }
    /* NaN passes through; i64 bounds beyond the range saturate. */
    nb_tensor *c = nb_clamp(tu_tensor((double[]){NAN, -3, 3}, (int64_t[]){3}, 1, NB_F32), -1, 1);
    tu_assert_close(c, ((double[]){NAN, -1, 1}), ((int64_t[]){3}), 1, 0);
    nb_tensor *big = nb_full((int64_t[]){2}, 1, NB_I64, 0);
    ck_assert(nb_copy_(nb_select(big, 0, 0), nb_scalar(-9e18, NB_I64)) == NB_OK);
    nb_tensor *ci = nb_clamp(big, -1e19, 1e19);
    ck_assert(ci && nb_get_f64(ci, (int64_t[]){0}) == -9e18);
    tu_assert_error(nb_clamp(c, NAN, 1), NB_EINVAL, "NaN");
    nb_scope_end();
}
END_TEST

/* ---- binary --------------------------------------------------------------------------------- */

static double r_add(double a, double b) { return a + b; }
static double r_sub(double a, double b) { return a - b; }
static double r_mul(double a, double b) { return a * b; }
static double r_div(double a, double b) { return a / b; }
static double r_max(double a, double b) { return isnan(a) || a > b ? a : b; }
static double r_min(double a, double b) { return isnan(a) || a < b ? a : b; }
static double r_eq(double a, double b) { return a == b; }
static double r_ne(double a, double b) { return a != b; }
static double r_lt(double a, double b) { return a < b; }
static double r_le(double a, double b) { return a <= b; }
static double r_gt(double a, double b) { return a > b; }
static double r_ge(double a, double b) { return a >= b; }
/* Integer pow with a negative exponent: 1, +-1 for base -1, else 0 (see the op file). */
static double r_ipow(double a, double b) {
    if (b >= 0) return pow(a, b);
    return a == 1 ? 1 : a == -1 ? (fmod(b, 2) != 0 ? -1 : 1) : 0;
}

enum { B_ARITH, B_DIV, B_POW, B_CMP };
typedef struct {
    const char *name;
    nb_tensor *(*fn)(nb_tensor *, nb_tensor *);
    double (*ref)(double, double);
    int kind;
} binary_case;

static const binary_case bcases[] = {
    {"add", nb_add, r_add, B_ARITH},     {"sub", nb_sub, r_sub, B_ARITH},
    {"mul", nb_mul, r_mul, B_ARITH},     {"div", nb_div, r_div, B_DIV},
    {"pow", nb_pow, pow, B_POW},         {"maximum", nb_maximum, r_max, B_ARITH},
    {"minimum", nb_minimum, r_min, B_ARITH}, {"eq", nb_eq, r_eq, B_CMP},
    {"ne", nb_ne, r_ne, B_CMP},          {"lt", nb_lt, r_lt, B_CMP},
    {"le", nb_le, r_le, B_CMP},          {"gt", nb_gt, r_gt, B_CMP},
    {"ge", nb_ge, r_ge, B_CMP},
};

/* Operand dtypes and the dtype they compute in. */
static const struct {
    nb_dtype a, b, promoted;
} bdtypes[] = {
    {NB_F32, NB_F32, NB_F32},   {NB_F64, NB_F64, NB_F64},   {NB_F16, NB_F16, NB_F16},
    {NB_BF16, NB_BF16, NB_BF16}, {NB_I32, NB_I32, NB_I32},  {NB_I64, NB_I64, NB_I64},
    {NB_U8, NB_U8, NB_U8},      {NB_BOOL, NB_BOOL, NB_BOOL}, {NB_I32, NB_F32, NB_F32},
    {NB_U8, NB_I64, NB_I64},    {NB_F16, NB_BF16, NB_F32},  {NB_BOOL, NB_I32, NB_I32},
    {NB_F64, NB_F32, NB_F64},   {NB_U8, NB_F16, NB_F16},    {NB_I64, NB_BF16, NB_BF16},
    {NB_BOOL, NB_F32, NB_F32},  {NB_F32, NB_BF16, NB_F32},  {NB_F16, NB_F32, NB_F32},
};

static const struct {
    tshape a, b;
} bshapes[] = {
    {{0, {0}}, {0, {0}}},             {{1, {5}}, {1, {5}}},
    {{2, {3, 1}}, {2, {1, 4}}},       {{3, {2, 3, 4}}, {1, {4}}},
    {{0, {0}}, {2, {2, 3}}},          {{2, {2, 3}}, {0, {0}}},
    {{1, {0}}, {1, {1}}},             {{2, {3, 0}}, {2, {3, 1}}},
    {{2, {4, 5}}, {2, {4, 5}}},       {{3, {2, 1, 3}}, {3, {2, 4, 1}}},
    {{2, {1, 1}}, {1, {1}}},          {{2, {6, 1}}, {3, {2, 1, 7}}},
};

static void check_binary(const binary_case *bc, nb_tensor *a, nb_tensor *b, nb_dtype kdt) {
    nb_tensor *y = bc->fn(a, b);
    if (kdt == NB_BOOL && (bc->ref == r_sub || bc->kind == B_POW)) {
        tu_assert_error(y, NB_EDTYPE, bc->name);
        return;
    }
    nb_dtype odt = bc->kind == B_CMP ? NB_BOOL
                   : bc->kind == B_DIV && !is_float_dt(kdt) ? NB_F32 : kdt;
    ck_assert_msg(y != NULL, "%s(%s, %s): %s", bc->name, nb_dtype_name(nb_tensor_dtype(a)),
                  nb_dtype_name(nb_tensor_dtype(b)), nb_last_error());
    ck_assert_msg(nb_tensor_dtype(y) == odt, "%s(%s, %s) gave %s", bc->name,
                  nb_dtype_name(nb_tensor_dtype(a)), nb_dtype_name(nb_tensor_dtype(b)),
                  nb_dtype_name(nb_tensor_dtype(y)));
    ck_assert(nb_is_contiguous(y));
    int na = nb_ndim(a), nbd = nb_ndim(b), nd = na > nbd ? na : nbd;
    int64_t shape[NB_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        int ia = d - (nd - na), ib = d - (nd - nbd);
        int64_t da = ia >= 0 ? nb_shape(a)[ia] : 1, db = ib >= 0 ? nb_shape(b)[ib] : 1;
        shape[d] = da == 1 ? db : da;
    }
    int64_t n = tu_numel(shape, nd);
    double *av = tu_values(a), *bv = tu_values(b);
    double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
    double (*f)(double, double) = bc->kind == B_POW && !is_float_dt(kdt) ? r_ipow : bc->ref;
    for (int64_t i = 0; i < n; i++) {
        int64_t idx[NB_MAX_DIMS];
        tu_unravel(i, shape, nd, idx);
        ref[i] = as_dtype(f(av[bcast_index(idx, nd, nb_shape(a), na)],
                           bv[bcast_index(idx, nd, nb_shape(b), nbd)]),
                         odt);
    }
    tu_assert_close(y, ref, shape, nd, tu_tol(odt));
    free(av);
    free(bv);
    free(ref);
}

START_TEST(test_binary) {
    const binary_case *bc = &bcases[_i];
    nb_scope_begin();
    for (int k = 0; k < COUNT(bdtypes); k++) {
        for (int s = 0; s < COUNT(bshapes); s++) {
            /* pow: small integer exponents so integer results stay exact. */
            bool pw = bc->kind == B_POW;
            nb_tensor *a =
                data_for(&bshapes[s].a, bdtypes[k].a, -3, 3, -4, 4, (uint64_t)(s + 3 * k));
            nb_tensor *b = data_for(&bshapes[s].b, bdtypes[k].b, -3, 3, pw ? -3 : -4, 4,
                                    (uint64_t)(s + 3 * k + 1000));
            check_binary(bc, a, b, bdtypes[k].promoted);
            nb_tensor *an = bshapes[s].a.ndim ? tu_noncontig(a) : a;
            nb_tensor *bn = bshapes[s].b.ndim ? tu_noncontig(b) : b;
            check_binary(bc, an, bn, bdtypes[k].promoted);
            check_binary(bc, a, a, bdtypes[k].a); /* the same tensor twice */
        }
    }
    /* Long enough to run on several threads: contiguous, row broadcast, scalar broadcast. */
    for (int k = 0; k < 3; k += 2) { /* f32, f16 */
        nb_dtype dt = all_dtypes[k];
        tshape big = {2, {300, 257}}, row = {1, {257}}, one = {0, {0}};
        nb_tensor *a = data_for(&big, dt, 0.5, 3, -4, 4, 1);
        if (k == 0) check_binary(bc, a, data_for(&big, dt, 0.5, 3, -4, 4, 2), dt);
        else check_binary(bc, a, data_for(&row, dt, 0.5, 3, -4, 4, 3), dt);
        check_binary(bc, data_for(&one, dt, 0.5, 3, -4, 4, 4), a, dt);
    }
    /* f32 with a bf16 or f16 operand, which the CPU kernel widens block by block as it
     * reads: whole, row-broadcast, scalar-broadcast and strided, over several threads */
    tshape big = {2, {300, 257}}, row = {1, {257}}, one = {0, {0}};
    nb_tensor *a = data_for(&big, NB_F32, 0.5, 3, -4, 4, 5);
    for (int h = 0; h < 2; h++) {
        nb_dtype hd = h ? NB_F16 : NB_BF16;
        nb_tensor *b = data_for(&big, hd, 0.5, 3, -4, 4, 6);
        check_binary(bc, a, b, NB_F32);
        check_binary(bc, b, a, NB_F32);
        check_binary(bc, a, data_for(&row, hd, 0.5, 3, -4, 4, 7), NB_F32);
        check_binary(bc, data_for(&one, hd, 0.5, 3, -4, 4, 8), a, NB_F32);
        check_binary(bc, tu_noncontig(a), tu_noncontig(b), NB_F32);
    }
    nb_scope_end();
}
END_TEST

/* NaN handling of maximum/minimum and of comparisons; the float edge cases. */
START_TEST(test_binary_special) {
    nb_scope_begin();
    int64_t sh[1] = {4};
    for (int k = 0; k < 4; k++) {
        nb_dtype dt = all_dtypes[k];
        nb_tensor *a = tu_tensor((double[]){NAN, 1, -INFINITY, 2}, sh, 1, dt);
        nb_tensor *b = tu_tensor((double[]){1, NAN, 0, INFINITY}, sh, 1, dt);
        tu_assert_close(nb_maximum(a, b), ((double[]){NAN, NAN, 0, INFINITY}), sh, 1, 0);
        tu_assert_close(nb_minimum(a, b), ((double[]){NAN, NAN, -INFINITY, 2}), sh, 1, 0);
        tu_assert_close(nb_eq(a, a), ((double[]){0, 1, 1, 1}), sh, 1, 0);
        tu_assert_close(nb_ne(a, a), ((double[]){1, 0, 0, 0}), sh, 1, 0);
        tu_assert_close(nb_lt(a, b), ((double[]){0, 0, 1, 1}), sh, 1, 0);
        tu_assert_close(nb_div(a, nb_zeros_like(a)),
                        ((double[]){NAN, INFINITY, -INFINITY, INFINITY}), sh, 1, 0);
    }
    /* Integer true division by zero: inf / nan in f32, never a crash. */
    nb_tensor *i = tu_tensor((double[]){1, 0, -3, 4}, sh, 1, NB_I32);
    nb_tensor *z = tu_tensor((double[]){0, 0, 0, 2}, sh, 1, NB_I32);
    tu_assert_close(nb_div(i, z), ((double[]){INFINITY, NAN, -INFINITY, 2}), sh, 1, 0);
    ck_assert(nb_tensor_dtype(nb_div(i, z)) == NB_F32);
    nb_scope_end();
}
END_TEST

/* Integer overflow wraps around (two's complement) and is not UB (the suite runs under
 * UBSan in CI). */
START_TEST(test_int_wrap) {
    nb_scope_begin();
    int64_t sh[1] = {3};
    nb_tensor *a = tu_tensor((double[]){2147483647, -2147483648.0, 65536}, sh, 1, NB_I32);
    nb_tensor *one = nb_scalar(1, NB_I32);
    tu_assert_close(nb_add(a, one), ((double[]){-2147483648.0, -2147483647, 65537}), sh, 1, 0);
    tu_assert_close(nb_sub(a, one), ((double[]){2147483646, 2147483647, 65535}), sh, 1, 0);
    tu_assert_close(nb_mul(a, a), ((double[]){1, 0, 0}), sh, 1, 0);
    tu_assert_close(nb_neg(a), ((double[]){-2147483647, -2147483648.0, -65536}), sh, 1, 0);
    tu_assert_close(nb_abs(a), ((double[]){2147483647, -2147483648.0, 65536}), sh, 1, 0);
    nb_tensor *l = nb_full((int64_t[]){1}, 1, NB_I64, 0);
    ck_assert(nb_fill_(l, -9223372036854775807.0 - 1) == NB_OK);
    ck_assert(nb_item_i64(nb_neg(l)) == INT64_MIN);
    ck_assert(nb_item_i64(nb_sub(l, nb_scalar(1, NB_I64))) == INT64_MAX);
    ck_assert(nb_item_i64(nb_mul(l, l)) == 0);
    nb_tensor *u = tu_tensor((double[]){0, 1, 255}, sh, 1, NB_U8);
    tu_assert_close(nb_neg(u), ((double[]){0, 255, 1}), sh, 1, 0);
    tu_assert_close(nb_add(u, u), ((double[]){0, 2, 254}), sh, 1, 0);
    tu_assert_close(nb_mul(u, u), ((double[]){0, 1, 1}), sh, 1, 0);
    tu_assert_close(nb_sub(nb_zeros_like(u), u), ((double[]){0, 255, 1}), sh, 1, 0);
    /* Integer tensor pow: negative exponents give the integer part of the true value. */
    nb_tensor *base = tu_tensor((double[]){1, -1, -1, 2, 0, -2}, (int64_t[]){6}, 1, NB_I64);
    nb_tensor *ex = tu_tensor((double[]){-3, -3, -2, -1, -1, 5}, (int64_t[]){6}, 1, NB_I64);
    tu_assert_close(nb_pow(base, ex), ((double[]){1, -1, 1, 0, 0, -32}), ((int64_t[]){6}), 1, 0);
    uint64_t w = 1;
    for (int i = 0; i < 40; i++) w *= 3u;
    ck_assert(nb_item_i64(nb_pow(nb_scalar(3, NB_I64), nb_scalar(40, NB_I64))) == (int64_t)w);
    nb_scope_end();
}
END_TEST

/* ---- scalar forms --------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    nb_tensor *(*fn)(nb_tensor *, double);
    double (*ref)(double, double);
    int kind;
} scalar_case;

static const scalar_case scases[] = {
    {"add_scalar", nb_add_scalar, r_add, B_ARITH},
    {"sub_scalar", nb_sub_scalar, r_sub, B_ARITH},
    {"mul_scalar", nb_mul_scalar, r_mul, B_ARITH},
    {"div_scalar", nb_div_scalar, r_div, B_DIV},
    {"maximum_scalar", nb_maximum_scalar, r_max, B_ARITH},
    {"minimum_scalar", nb_minimum_scalar, r_min, B_ARITH},
    {"eq_scalar", nb_eq_scalar, r_eq, B_CMP},
    {"lt_scalar", nb_lt_scalar, r_lt, B_CMP},
    {"gt_scalar", nb_gt_scalar, r_gt, B_CMP},
};

START_TEST(test_scalar_ops) {
    const scalar_case *sc = &scases[_i];
    bool cmp = sc->kind == B_CMP;
    nb_scope_begin();
    const double scalars[] = {2, -1.5, 0.25, 1, 0, 300, 1e10};
    for (int k = 0; k < NDT; k++) {
        nb_dtype dt = all_dtypes[k];
        for (int v = 0; v < COUNT(scalars); v++) {
            double s = scalars[v];
            /* Expected compute dtype: the rule in tensor/ops/elementwise.c's header. */
            nb_dtype kdt = dt;
            bool err = false;
            if (!is_float_dt(dt)) {
                bool whole = s == floor(s);
                double lo = dt == NB_I32 ? -2147483648.0 : dt == NB_I64 ? -9.3e18 : 0;
                double hi = dt == NB_I32 ? 2147483647.0 : dt == NB_I64 ? 9.2e18
                            : dt == NB_U8 ? 255 : 1;
                if (!whole) kdt = cmp ? NB_F64 : NB_F32;
                else if (dt == NB_BOOL) kdt = cmp && (s == 0 || s == 1) ? NB_BOOL : NB_I64;
                else if (s < lo || s > hi) {
                    if (cmp) kdt = NB_F64;
                    else err = true;
                }
            }
            if (sc->kind == B_DIV && !is_float_dt(kdt)) kdt = NB_F32;
            nb_dtype odt = cmp ? NB_BOOL : kdt;
            for (int sh = 0; sh < COUNT(ushapes); sh++) {
                nb_tensor *x = data_for(&ushapes[sh], dt, -4, 4, -5, 5, (uint64_t)(sh + 5 * k));
                if (sh % 2 && ushapes[sh].ndim) x = tu_noncontig(x);
                nb_tensor *y = sc->fn(x, s);
                if (err) {
                    tu_assert_error(y, NB_EINVAL, "does not fit");
                    continue;
                }
                ck_assert_msg(y && nb_tensor_dtype(y) == odt, "%s(%s, %g): %s", sc->name,
                              nb_dtype_name(dt), s, y ? nb_dtype_name(nb_tensor_dtype(y))
                                                      : nb_last_error());
                int64_t n = nb_numel(x);
                double *xv = tu_values(x), *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
                /* f32 (and half, computed in f32) tensors see the scalar rounded to f32. */
                double sv = dt == NB_F32 || dt == NB_F16 || dt == NB_BF16 ? (float)s : s;
                for (int64_t i = 0; i < n; i++) ref[i] = as_dtype(sc->ref(xv[i], sv), odt);
                tu_assert_close(y, ref, nb_shape(x), nb_ndim(x), tu_tol(odt));
                free(xv);
                free(ref);
            }
        }
    }
    nb_scope_end();
}
END_TEST

/* Half tensors compute with the scalar in f32, not rounded to half precision first. */
START_TEST(test_half_scalar_precision) {
    nb_scope_begin();
    int64_t n = 2048;
    double *v = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = (double)(i + 1) / 16;
    const nb_dtype hdt[2] = {NB_F16, NB_BF16};
    for (int h = 0; h < 2; h++) {
        nb_tensor *x = tu_tensor(v, &n, 1, hdt[h]);
        nb_tensor *y = nb_mul_scalar(x, 0.3);
        double *xv = tu_values(x), *yv = tu_values(y);
        int differ = 0;
        for (int64_t i = 0; i < n; i++) {
            float prod = (float)xv[i] * 0.3f;
            float want = (float)as_dtype(prod, hdt[h]);
            ck_assert_msg(yv[i] == want, "%s: %g * 0.3 = %g, expected %g", nb_dtype_name(hdt[h]),
                          xv[i], yv[i], (double)want);
            /* what a scalar rounded to half precision first would give */
            float w2 = (float)as_dtype((float)xv[i] * (float)as_dtype(0.3f, hdt[h]), hdt[h]);
            differ += w2 != want;
        }
        ck_assert_msg(differ > 0, "the test cannot tell a half-rounded scalar apart");
        free(xv);
        free(yv);
    }
    free(v);
    /* A half value near 0.1 is not equal to the f32 scalar 0.1. */
    nb_tensor *t = nb_full((int64_t[]){1}, 1, NB_F16, 0.1);
    ck_assert(nb_item_f64(nb_eq_scalar(t, 0.1)) == 0);
    ck_assert(nb_item_f64(nb_eq_scalar(t, nb_item_f64(t))) == 1);
    nb_scope_end();
}
END_TEST

/* ---- where ---------------------------------------------------------------------------------- */

START_TEST(test_where) {
    nb_scope_begin();
    const struct {
        tshape c, a, b;
    } wshapes[] = {
        {{2, {3, 1}}, {2, {1, 4}}, {0, {0}}},
        {{0, {0}}, {2, {2, 3}}, {2, {2, 3}}},
        {{1, {0}}, {1, {0}}, {1, {1}}},
        {{2, {4, 5}}, {2, {4, 5}}, {2, {4, 5}}},
        {{3, {2, 3, 4}}, {1, {4}}, {2, {3, 1}}},
        {{2, {1, 1}}, {0, {0}}, {1, {1}}},
    };
    const struct {
        nb_dtype a, b, out;
    } wdt[] = {
        {NB_F32, NB_F32, NB_F32}, {NB_I32, NB_F32, NB_F32}, {NB_F16, NB_F16, NB_F16},
        {NB_BF16, NB_F64, NB_F64}, {NB_I64, NB_I64, NB_I64}, {NB_U8, NB_BOOL, NB_U8},
        {NB_BOOL, NB_BOOL, NB_BOOL}, {NB_BF16, NB_BF16, NB_BF16},
    };
    for (int k = 0; k < COUNT(wdt); k++) {
        for (int s = 0; s < COUNT(wshapes); s++) {
            for (int nc = 0; nc < 2; nc++) {
                nb_tensor *c = data_for(&wshapes[s].c, NB_BOOL, 0, 1, 0, 1, (uint64_t)s);
                nb_tensor *a = data_for(&wshapes[s].a, wdt[k].a, -4, 4, -5, 5, (uint64_t)(s + 1));
                nb_tensor *b = data_for(&wshapes[s].b, wdt[k].b, -4, 4, -5, 5, (uint64_t)(s + 2));
                if (nc) {
                    if (wshapes[s].c.ndim) c = tu_noncontig(c);
                    if (wshapes[s].a.ndim) a = tu_noncontig(a);
                    if (wshapes[s].b.ndim) b = tu_noncontig(b);
                }
                nb_tensor *y = nb_where(c, a, b);
                ck_assert_msg(y && nb_tensor_dtype(y) == wdt[k].out, "where: %s", nb_last_error());
                int nd = nb_ndim(y);
                int64_t n = nb_numel(y);
                double *cv = tu_values(c), *av = tu_values(a), *bv = tu_values(b);
                double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
                for (int64_t i = 0; i < n; i++) {
                    int64_t idx[NB_MAX_DIMS];
                    tu_unravel(i, nb_shape(y), nd, idx);
                    ref[i] = cv[bcast_index(idx, nd, nb_shape(c), nb_ndim(c))]
                                 ? av[bcast_index(idx, nd, nb_shape(a), nb_ndim(a))]
                                 : bv[bcast_index(idx, nd, nb_shape(b), nb_ndim(b))];
                }
                /* Check the broadcast shape against the largest operand's. */
                int64_t want[NB_MAX_DIMS];
                int wn = 0;
                const tshape *ts[3] = {&wshapes[s].c, &wshapes[s].a, &wshapes[s].b};
                for (int t = 0; t < 3; t++) wn = ts[t]->ndim > wn ? ts[t]->ndim : wn;
                for (int d = 0; d < wn; d++) {
                    want[d] = 1;
                    for (int t = 0; t < 3; t++) {
                        int id = d - (wn - ts[t]->ndim);
                        if (id >= 0 && ts[t]->shape[id] != 1) want[d] = ts[t]->shape[id];
                    }
                }
                tu_assert_close(y, ref, want, wn, 0);
                free(cv);
                free(av);
                free(bv);
                free(ref);
            }
        }
    }
    nb_scope_end();
}
END_TEST

/* ---- special values and the polynomial exp ----------------------------------------------- */

/* The f32 exp is a vectorized polynomial: check it stays within 2 ulp of the correctly
 * rounded result over the whole range, including subnormal results, and the specials. */
START_TEST(test_exp_accuracy) {
    double worst = 0;
    float at = 0;
    for (int64_t i = 0; i <= 400000; i++) {
        float x = (float)(-104.0 + (89.0 + 104.0) * (double)i / 400000.0);
        float got = nb__cpu_expf(x);
        double ref = exp((double)x);
        float rf = (float)ref;
        double ulp = rf == 0 ? 0x1p-149
                             : fmax(0x1p-149, (double)nextafterf(rf, INFINITY) - (double)rf);
        double e = isinf(rf) ? (isinf(got) ? 0 : 1e9) : fabs((double)got - ref) / ulp;
        if (e > worst) worst = e, at = x;
    }
    ck_assert_msg(worst <= 1.5, "exp: %.2f ulp at %.9g", worst, (double)at);
    ck_assert(isnan(nb__cpu_expf(NAN)));
    ck_assert(nb__cpu_expf(INFINITY) == INFINITY);
    ck_assert(nb__cpu_expf(-INFINITY) == 0);
    ck_assert(nb__cpu_expf(0) == 1);
    ck_assert(nb__cpu_expf(89) == INFINITY && nb__cpu_expf(88.7f) < INFINITY);
    ck_assert(nb__cpu_expf(-103.5f) > 0 && nb__cpu_expf(-104.5f) == 0);
    /* and through the op, on every path (contiguous, strided, half blocks) */
    nb_scope_begin();
    int64_t sh[1] = {7};
    double v[7] = {NAN, INFINITY, -INFINITY, 88.5, -100, 0, 1};
    double r[7];
    for (int k = 0; k < 4; k++) {
        nb_tensor *x = tu_tensor(v, sh, 1, all_dtypes[k]);
        double *xv = tu_values(x);
        for (int i = 0; i < 7; i++) r[i] = as_dtype(exp(xv[i]), all_dtypes[k]);
        tu_assert_close(nb_exp(x), r, sh, 1, tu_tol(all_dtypes[k]));
        tu_assert_close(nb_exp(tu_noncontig(x)), r, sh, 1, tu_tol(all_dtypes[k]));
        free(xv);
    }
    nb_scope_end();
}
END_TEST

START_TEST(test_unary_special) {
    nb_scope_begin();
    int64_t sh[1] = {6};
    double v[6] = {NAN, INFINITY, -INFINITY, -100, 100, -0.0};
    for (int k = 0; k < 2; k++) {
        nb_dtype dt = all_dtypes[k]; /* f32, f64 */
        nb_tensor *x = tu_tensor(v, sh, 1, dt);
        tu_assert_close(nb_sigmoid(x), ((double[]){NAN, 1, 0, 3.720075976020836e-44, 1, 0.5}),
                        sh, 1, 1e-6);
        tu_assert_close(nb_relu(x), ((double[]){NAN, INFINITY, 0, 0, 100, 0}), sh, 1, 0);
        tu_assert_close(nb_silu(x), ((double[]){NAN, INFINITY, NAN, -3.72e-42, 100, 0}), sh, 1,
                        1e-6);
        tu_assert_close(nb_gelu(x), ((double[]){NAN, INFINITY, NAN, 0, 100, 0}), sh, 1, 1e-6);
        tu_assert_close(nb_gelu_tanh(x), ((double[]){NAN, INFINITY, NAN, 0, 100, 0}), sh, 1,
                        1e-6);
        tu_assert_close(nb_tanh(x), ((double[]){NAN, 1, -1, -1, 1, 0}), sh, 1, 0);
        tu_assert_close(nb_abs(x), ((double[]){NAN, INFINITY, INFINITY, 100, 100, 0}), sh, 1, 0);
    }
    /* A broadcast view (stride 0) as the input of a unary op, f32 and through half blocks. */
    for (int k = 0; k < 4; k++) {
        nb_tensor *e = nb_expand(nb_scalar(0.5, all_dtypes[k]), (int64_t[]){3, 4}, 2);
        double r[12];
        for (int i = 0; i < 12; i++) r[i] = exp(0.5);
        tu_assert_close(nb_exp(e), r, ((int64_t[]){3, 4}), 2, tu_tol(all_dtypes[k]));
    }
    /* gelu stays accurate in the far negative tail (relative, not just absolute). */
    nb_tensor *g = nb_gelu(nb_scalar(-6, NB_F32));
    double gr = r_gelu(-6);
    ck_assert_msg(fabs(nb_item_f64(g) - gr) <= 1e-5 * fabs(gr), "gelu(-6) = %g, expected %g",
                  nb_item_f64(g), gr);
    nb_scope_end();
}
END_TEST

/* bf16 gelu and its backward read tables (cpu/elementwise.c): over every one of the 65536
 * inputs they give the bits of the f32 kernels rounded once to bf16, on contiguous and
 * strided runs, and are within bf16 rounding (2^-8 relative, f32 error included) of the
 * double-precision erf GELU and its derivative Phi(x) + x phi(x). */
static bool bf16_same(uint16_t a, uint16_t b) {
    return a == b || (isnan(nb_bf16_to_f32(a)) && isnan(nb_bf16_to_f32(b)));
}

START_TEST(test_gelu_bf16_all_values) {
    const int64_t n = 65536;
    uint16_t *x = malloc(sizeof(uint16_t) * 2 * (size_t)n), *g = malloc(sizeof(uint16_t) * (size_t)n);
    uint16_t *y = malloc(sizeof(uint16_t) * 2 * (size_t)n), *d = malloc(sizeof(uint16_t) * (size_t)n);
    uint64_t st = 12345;
    for (int64_t i = 0; i < n; i++) {
        x[i] = (uint16_t)i;
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        g[i] = nb_f32_to_bf16((float)((double)(st >> 11) * 0x1p-53 * 4.0 - 2.0));
    }
    nb__ew_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    nb__iter_fn fw = nb__cpu_ew_kernel(NB__OP_GELU, NB_BF16);
    nb__iter_fn bw = nb__cpu_ew_bw_kernel(NB__OP_GELU, 0, NB_BF16);
    ck_assert(fw && bw);
    fw((char *[]){(char *)y, (char *)x}, (const int64_t[]){2, 2}, n, &ctx);
    bw((char *[]){(char *)d, (char *)g, (char *)x}, (const int64_t[]){2, 2, 2}, n, &ctx);
    for (int64_t i = 0; i < n; i++) {
        float xf = nb_bf16_to_f32(x[i]), gf = nb_bf16_to_f32(g[i]);
        uint16_t ey = nb_f32_to_bf16(nb__cpu_geluf(xf));
        uint16_t ed = nb_f32_to_bf16(gf * nb__cpu_gelu_gradf(xf));
        ck_assert_msg(bf16_same(y[i], ey), "gelu bf16 0x%04x: 0x%04x, f32 path 0x%04x",
                      (unsigned)i, y[i], ey);
        ck_assert_msg(bf16_same(d[i], ed), "gelu' bf16 0x%04x (g 0x%04x): 0x%04x, f32 path 0x%04x",
                      (unsigned)i, g[i], d[i], ed);
        if (!isfinite(xf) || fabsf(xf) > 1e30f) continue;
        double xd = xf, ry = 0.5 * xd * erfc(-xd / sqrt(2.0)); /* no cancellation in the tail */
        double rd = gf * (0.5 * erfc(-xd / sqrt(2.0)) + xd * exp(-0.5 * xd * xd) / sqrt(2 * M_PI));
        double gy = nb_bf16_to_f32(y[i]), gd = nb_bf16_to_f32(d[i]);
        ck_assert_msg(fabs(gy - ry) <= 0x1p-8 * fabs(ry) + 1e-38, "gelu(%.9g) = %.9g, expected %.9g",
                      xd, gy, ry);
        ck_assert_msg(fabs(gd - rd) <= 0x1p-8 * fabs(rd) + 1e-38,
                      "gelu'(%.9g) * %g = %.9g, expected %.9g", xd, (double)gf, gd, rd);
    }
    /* strided runs (every other element of a buffer) give the same bits */
    for (int64_t i = n - 1; i >= 0; i--) x[2 * i] = x[i], x[2 * i + 1] = 0x7fc0;
    memset(y, 0, sizeof(uint16_t) * 2 * (size_t)n);
    fw((char *[]){(char *)y, (char *)x}, (const int64_t[]){4, 4}, n, &ctx);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(bf16_same(y[2 * i], nb_f32_to_bf16(nb__cpu_geluf(nb_bf16_to_f32((uint16_t)i)))),
                      "strided gelu bf16 0x%04x", (unsigned)i);
    /* and through the op on the default device */
    nb_scope_begin();
    double *v = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = nb_bf16_to_f32((uint16_t)i);
    nb_tensor *t = nb_gelu(tu_tensor(v, &n, 1, NB_BF16));
    ck_assert(t && nb_tensor_dtype(t) == NB_BF16);
    ck_assert(nb_read(t, y, n, NB_BF16) == NB_OK);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(bf16_same(y[i], nb_f32_to_bf16(nb__cpu_geluf((float)v[i]))),
                      "nb_gelu bf16 of %g", v[i]);
    nb_scope_end();
    free(v);
    free(x);
    free(g);
    free(y);
    free(d);
}
END_TEST

/* The result does not depend on the thread count. */
START_TEST(test_thread_invariance) {
    nb_scope_begin();
    int64_t sh[1] = {200003};
    nb_tensor *x = tu_random(sh, 1, NB_F32, -5, 5, 3);
    int saved = nb_get_num_threads();
    nb_set_num_threads(1);
    nb_tensor *a = nb_gelu(x), *a2 = nb_add(x, x);
    nb_set_num_threads(2);
    nb_tensor *b = nb_gelu(x), *b2 = nb_add(x, x);
    nb_set_num_threads(saved);
    /* Compared bit for bit through host copies (nb_read works on any device). */
    size_t n = (size_t)sh[0];
    float *v[4];
    nb_tensor *r[4] = {a, b, a2, b2};
    for (int i = 0; i < 4; i++) {
        v[i] = malloc(sizeof(float) * n);
        ck_assert(nb_read(r[i], v[i], sh[0], NB_F32) == NB_OK);
    }
    ck_assert(memcmp(v[0], v[1], sizeof(float) * n) == 0);
    ck_assert(memcmp(v[2], v[3], sizeof(float) * n) == 0);
    for (int i = 0; i < 4; i++) free(v[i]);
    nb_scope_end();
}
END_TEST

/* ---- errors -------------------------------------------------------------------------------- */

START_TEST(test_errors) {
    nb_scope_begin();
    nb_tensor *a = nb_zeros((int64_t[]){2, 3}, 2, NB_F32);
    nb_tensor *b = nb_zeros((int64_t[]){4}, 1, NB_F32);
    /* Broadcast mismatch names the op and both shapes. */
    tu_assert_error(nb_add(a, b), NB_ESHAPE, "add");
    ck_assert(nb_mul(a, b) == NULL);
    ck_assert(strstr(nb_last_error(), "[2,3]") && strstr(nb_last_error(), "[4]"));
    nb_clear_error();
    tu_assert_error(nb_lt(b, a), NB_ESHAPE, "lt");
    tu_assert_error(nb_where(nb_zeros((int64_t[]){4}, 1, NB_BOOL), a, a), NB_ESHAPE, "where");
    /* dtype errors */
    nb_tensor *m = nb_zeros((int64_t[]){3}, 1, NB_BOOL);
    tu_assert_error(nb_neg(m), NB_EDTYPE, "neg: bool");
    tu_assert_error(nb_relu(m), NB_EDTYPE, "relu");
    tu_assert_error(nb_sub(m, m), NB_EDTYPE, "sub");
    tu_assert_error(nb_pow(m, m), NB_EDTYPE, "pow");
    tu_assert_error(nb_where(b, b, b), NB_EDTYPE, "where: cond must be a bool tensor, got f32");
    tu_assert_error(nb_pow_scalar(nb_zeros((int64_t[]){2}, 1, NB_I32), -2), NB_EINVAL,
                    "pow_scalar");
    tu_assert_error(nb_add_scalar(nb_zeros((int64_t[]){2}, 1, NB_U8), 300), NB_EINVAL,
                    "add_scalar");
    tu_assert_error(nb_clamp(a, 0, NAN), NB_EINVAL, "clamp");
    /* NULL inputs: ENULL naming the op and argument... */
    tu_assert_error(nb_exp(NULL), NB_ENULL, "exp");
    tu_assert_error(nb_add(a, NULL), NB_ENULL, "add: argument 'b'");
    tu_assert_error(nb_where(NULL, a, a), NB_ENULL, "where");
    tu_assert_error(nb_add_scalar(NULL, 1), NB_ENULL, "add_scalar");
    tu_assert_error(nb_clamp(NULL, 0, 1), NB_ENULL, "clamp");
    tu_assert_error(nb_pow_scalar(NULL, 2), NB_ENULL, "pow_scalar");
    /* ...and nested calls keep the first (innermost) error. */
    tu_assert_error(nb_exp(nb_mul_scalar(nb_add(a, b), 2)), NB_ESHAPE, "add");
    tu_assert_error(nb_where(m, nb_neg(m), m), NB_EDTYPE, "neg");
    nb_scope_end();
}
END_TEST

Suite *nb_suite_elementwise(void) {
    Suite *s = suite_create("elementwise");
    /* One test case per op, each table-driven over dtypes and shapes. */
    for (int i = 0; i < COUNT(ucases); i++) {
        TCase *tc = tcase_create(ucases[i].name);
        tcase_add_loop_test(tc, test_unary, i, i + 1);
        suite_add_tcase(s, tc);
    }
    for (int i = 0; i < COUNT(bcases); i++) {
        TCase *tc = tcase_create(bcases[i].name);
        tcase_add_loop_test(tc, test_binary, i, i + 1);
        suite_add_tcase(s, tc);
    }
    for (int i = 0; i < COUNT(scases); i++) {
        TCase *tc = tcase_create(scases[i].name);
        tcase_add_loop_test(tc, test_scalar_ops, i, i + 1);
        suite_add_tcase(s, tc);
    }
    struct {
        const char *name;
        const TTest *test;
    } singles[] = {
        {"pow_scalar", test_pow_scalar},
        {"clamp", test_clamp},
        {"where", test_where},
        {"binary_special", test_binary_special},
        {"int_wrap", test_int_wrap},
        {"half_scalar_precision", test_half_scalar_precision},
        {"exp_accuracy", test_exp_accuracy},
        {"gelu_bf16_all_values", test_gelu_bf16_all_values},
        {"unary_special", test_unary_special},
        {"thread_invariance", test_thread_invariance},
        {"errors", test_errors},
    };
    for (int i = 0; i < COUNT(singles); i++) {
        TCase *tc = tcase_create(singles[i].name);
        tcase_add_test(tc, singles[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}
