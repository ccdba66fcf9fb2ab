/* test_grad_ops.c - backward rules of the elementwise ops (tensor/ops/elementwise.c):
 * gradcheck of every differentiable op over plain, broadcast, non-contiguous and 0-dim
 * inputs and the *_scalar forms; exact gradients at the non-differentiable points (the
 * conventions the rules document); f32/f16/bf16 gradients against f64 ones; what records
 * and what does not (grad mode off, integer and comparison results, internal conversions);
 * and that a training-style loop stops allocating after warm-up. */
#include <string.h>

#include "autograd/autograd_impl.h"
#include "testutil.h"

/* ---- helpers --------------------------------------------------------------------------------- */

static nb_tensor *leaf(const double *v, const int64_t *shape, int ndim, nb_dtype dt) {
    nb_tensor *t = tu_tensor(v, shape, ndim, dt);
    ck_assert(nb_set_requires_grad(t, true) == NB_OK);
    return t;
}

/* Values in [lo, hi), kept at least 0.1 from the kinks, rounded to multiples of 1/32 so
 * that f16 and bf16 hold them exactly (every dtype then differentiates at the same x). */
static void make_vals(double *v, int64_t n, double lo, double hi, const double *kinks,
                      int nk, uint64_t seed) {
    tu_fill_uniform(v, n, lo, hi, seed);
    for (int64_t i = 0; i < n; i++) {
        for (int k = 0; k < nk; k++)
            if (fabs(v[i] - kinks[k]) < 0.1) v[i] = kinks[k] + (v[i] < kinks[k] ? -0.15 : 0.15);
        v[i] = round(v[i] * 32) / 32;
    }
}

#define CHECK_GRAD(f, ins, n, ctx, ...)                                                     \
    do {                                                                                    \
        nb_status st_ = nb_gradcheck((f), (ins), (n), (ctx), NULL);                         \
        if (st_ != NB_OK) {                                                                 \
            char what_[160];                                                                \
            snprintf(what_, sizeof what_, __VA_ARGS__);                                     \
            ck_abort_msg("%s: %s", what_, nb_last_error());                                 \
        }                                                                                   \
    } while (0)

/* Backward of y with grad_output g; returns nothing, gradients land in the leaves. */
static void backward_with(nb_tensor *y, nb_tensor *g) {
    ck_assert_msg(y != NULL, "%s", nb_last_error());
    nb_backward_opts bo = nb_backward_defaults();
    bo.grad_output = g;
    nb_status st = nb_backward_ex(y, &bo);
    ck_assert_msg(st == NB_OK, "%s", nb_last_error());
}

/* ---- unary ops ------------------------------------------------------------------------------- */

static nb_tensor *clamp_fn(nb_tensor *x) { return nb_clamp(x, -0.6, 0.7); }
static nb_tensor *clamp_lo(nb_tensor *x) { return nb_clamp(x, -0.5, INFINITY); }
static nb_tensor *pow0(nb_tensor *x) { return nb_pow_scalar(x, 0); }
static nb_tensor *pow1(nb_tensor *x) { return nb_pow_scalar(x, 1); }
static nb_tensor *pow2(nb_tensor *x) { return nb_pow_scalar(x, 2); }
static nb_tensor *pow3(nb_tensor *x) { return nb_pow_scalar(x, 3); }
static nb_tensor *pow_half(nb_tensor *x) { return nb_pow_scalar(x, 0.5); }
static nb_tensor *pow_m15(nb_tensor *x) { return nb_pow_scalar(x, -1.5); }

typedef struct {
    const char *name;
    nb_tensor *(*fn)(nb_tensor *);
    double lo, hi;     /* input range */
    double kinks[2];   /* non-differentiable points the inputs keep away from */
    int nk;
} unary_case;

static const unary_case UNARY[] = {
    {"neg", nb_neg, -2, 2, {0}, 0},
    {"abs", nb_abs, -2, 2, {0}, 1},
    {"exp", nb_exp, -2, 2, {0}, 0},
    {"log", nb_log, 0.3, 2, {0}, 0},
    {"log1p", nb_log1p, -0.6, 2, {0}, 0},
    {"sqrt", nb_sqrt, 0.3, 2, {0}, 0},
    {"rsqrt", nb_rsqrt, 0.3, 2, {0}, 0},
    {"sin", nb_sin, -3, 3, {0}, 0},
    {"cos", nb_cos, -3, 3, {0}, 0},
    {"tanh", nb_tanh, -2, 2, {0}, 0},
    {"sigmoid", nb_sigmoid, -3, 3, {0}, 0},
    {"relu", nb_relu, -2, 2, {0}, 1},
    {"gelu", nb_gelu, -3, 3, {0}, 0},
    {"gelu_tanh", nb_gelu_tanh, -3, 3, {0}, 0},
    {"silu", nb_silu, -3, 3, {0}, 0},
    {"pow_scalar 0", pow0, -2, 2, {0}, 0},
    {"pow_scalar 1", pow1, -2, 2, {0}, 0},
    {"pow_scalar 2", pow2, -2, 2, {0}, 0},
    {"pow_scalar 3", pow3, -2, 2, {0}, 0},
    {"pow_scalar 0.5", pow_half, 0.3, 2, {0}, 0},
    {"pow_scalar -1.5", pow_m15, 0.3, 2, {0}, 0},
    {"clamp", clamp_fn, -1.5, 1.5, {-0.6, 0.7}, 2},
    {"clamp lo only", clamp_lo, -1.5, 1.5, {-0.5}, 1},
};
#define N_UNARY (int)(sizeof UNARY / sizeof UNARY[0])

static nb_tensor *f_unary(nb_tensor *const *in, int n, void *ctx) {
    (void)n;
    return ((const unary_case *)ctx)->fn(in[0]);
}
static nb_tensor *f_unary_t(nb_tensor *const *in, int n, void *ctx) {
    (void)n;
    return ((const unary_case *)ctx)->fn(nb_transpose(in[0], 0, 1));
}

START_TEST(test_unary_gradcheck) {
    const unary_case *c = &UNARY[_i];
    nb_scope_begin();
    double v[6];
    /* plain [2,3], transposed view of [3,2], 0-dim */
    make_vals(v, 6, c->lo, c->hi, c->kinks, c->nk, 11 + (uint64_t)_i);
    nb_tensor *x = leaf(v, (int64_t[]){2, 3}, 2, NB_F32);
    CHECK_GRAD(f_unary, &x, 1, nb__unconst(c), "%s [2,3]", c->name);
    nb_tensor *xt = leaf(v, (int64_t[]){3, 2}, 2, NB_F64);
    CHECK_GRAD(f_unary_t, &xt, 1, nb__unconst(c), "%s transposed", c->name);
    nb_tensor *x0 = leaf(v + 1, (int64_t[]){1}, 0, NB_F64);
    CHECK_GRAD(f_unary, &x0, 1, nb__unconst(c), "%s 0-dim", c->name);
    nb_scope_end();
}
END_TEST

/* The f64 gradient of c at vals (grad_output gv) into out[6], optionally with dtype dt. */
static nb_tensor *unary_grad(const unary_case *c, const double *vals, const double *gv,
                             nb_dtype dt, bool noncontig_g) {
    const int64_t shape[2] = {2, 3};
    nb_tensor *x = leaf(vals, shape, 2, dt);
    nb_tensor *g = tu_tensor(gv, shape, 2, dt);
    backward_with(c->fn(x), noncontig_g ? tu_noncontig(g) : g);
    nb_tensor *gx = nb_grad(x);
    ck_assert_msg(gx && nb_tensor_dtype(gx) == dt, "%s: gradient of dtype %s for %s input",
                  c->name, gx ? nb_dtype_name(nb_tensor_dtype(gx)) : "none", nb_dtype_name(dt));
    return gx;
}

/* f32 gradients match f64 within f32 rounding; f16/bf16 inputs get gradients of their own
 * dtype, close to the f64 ones. Non-contiguous grad_output exercises the strided kernels. */
START_TEST(test_unary_dtypes) {
    const unary_case *c = &UNARY[_i];
    nb_scope_begin();
    double v[6], gv[6];
    make_vals(v, 6, c->lo, c->hi, c->kinks, c->nk, 101 + (uint64_t)_i);
    make_vals(gv, 6, -2, 2, NULL, 0, 202 + (uint64_t)_i);
    double *ref = tu_values(unary_grad(c, v, gv, NB_F64, false));
    const int64_t shape[2] = {2, 3};
    tu_assert_close(unary_grad(c, v, gv, NB_F32, true), ref, shape, 2, 2e-5);
    tu_assert_close(unary_grad(c, v, gv, NB_F16, false), ref, shape, 2, 1e-2);
    tu_assert_close(unary_grad(c, v, gv, NB_BF16, true), ref, shape, 2, 6e-2);
    free(ref);
    nb_scope_end();
}
END_TEST

/* ---- binary ops ------------------------------------------------------------------------------ */

enum { DOM_ANY, DOM_DIV, DOM_POW, DOM_GRID };

typedef struct {
    const char *name;
    nb_tensor *(*fn)(nb_tensor *, nb_tensor *);
    int dom;
} binary_case;

static const binary_case BINARY[] = {
    {"add", nb_add, DOM_ANY},         {"sub", nb_sub, DOM_ANY},
    {"mul", nb_mul, DOM_ANY},         {"div", nb_div, DOM_DIV},
    {"pow", nb_pow, DOM_POW},         {"maximum", nb_maximum, DOM_GRID},
    {"minimum", nb_minimum, DOM_GRID},
};
#define N_BINARY (int)(sizeof BINARY / sizeof BINARY[0])

/* Operand values for a domain: which = 0 for a, 1 for b. div keeps |b| >= 0.5; pow keeps
 * a > 0; the grid puts a and b on disjoint lattices (a - b is never below 1/16), so
 * maximum/minimum never see a tie. All values are exact in f16 and bf16. */
static void dom_vals(int dom, int which, double *v, int64_t n, uint64_t seed) {
    tu_fill_uniform(v, n, -2, 2, seed);
    for (int64_t i = 0; i < n; i++) {
        double u = v[i];
        if (dom == DOM_DIV && which == 1) u = (u < 0 ? -1 : 1) * (0.5 + fabs(u) * 0.75);
        if (dom == DOM_POW && which == 0) u = 0.5 + (u + 2) * 0.375;
        if (dom == DOM_GRID) u = round(u * 8) / 8 + (which == 0 ? 1.0 / 16 : 0);
        v[i] = round(u * 32) / 32;
    }
}

typedef struct {
    int64_t as[2], bs[2];
    int an, bn;
    bool transpose; /* f transposes both (then 2-d) inputs before the op */
} shape_case;

static const shape_case SHAPES[] = {
    {{2, 3}, {2, 3}, 2, 2, false}, /* same shape */
    {{3, 1}, {1, 4}, 2, 2, false}, /* both broadcast */
    {{2, 3}, {3}, 2, 1, false},    /* trailing broadcast */
    {{1}, {2, 3}, 0, 2, false},    /* 0-dim a */
    {{3, 2}, {3, 2}, 2, 2, true},  /* non-contiguous */
    {{3, 2}, {3, 1}, 2, 2, true},  /* non-contiguous and broadcast */
};
#define N_SHAPES (int)(sizeof SHAPES / sizeof SHAPES[0])

typedef struct {
    const binary_case *c;
    bool transpose;
} binary_ctx;

static nb_tensor *f_binary(nb_tensor *const *in, int n, void *ctx) {
    (void)n;
    const binary_ctx *b = ctx;
    if (!b->transpose) return b->c->fn(in[0], in[1]);
    return b->c->fn(nb_transpose(in[0], 0, 1), nb_transpose(in[1], 0, 1));
}

START_TEST(test_binary_gradcheck) {
    const binary_case *c = &BINARY[_i];
    nb_scope_begin();
    for (int k = 0; k < N_SHAPES; k++) {
        const shape_case *sc = &SHAPES[k];
        double av[12], bv[12];
        dom_vals(c->dom, 0, av, tu_numel(sc->as, sc->an), 31 + (uint64_t)(k * 7 + _i));
        dom_vals(c->dom, 1, bv, tu_numel(sc->bs, sc->bn), 57 + (uint64_t)(k * 7 + _i));
        nb_tensor *ab[2] = {leaf(av, sc->as, sc->an, NB_F64), leaf(bv, sc->bs, sc->bn, NB_F64)};
        binary_ctx ctx = {c, sc->transpose};
        CHECK_GRAD(f_binary, ab, 2, &ctx, "%s shapes #%d", c->name, k);
        /* one input requiring grad: the rule skips the other */
        ck_assert(nb_set_requires_grad(ab[0], false) == NB_OK);
        CHECK_GRAD(f_binary, ab, 2, &ctx, "%s shapes #%d, b only", c->name, k);
    }
    nb_scope_end();
}
END_TEST

/* a [2,3] op b [3] in f64, f32, f16, bf16: gradients of each input's dtype, close to f64. */
START_TEST(test_binary_dtypes) {
    const binary_case *c = &BINARY[_i];
    nb_scope_begin();
    double av[6], bv[3], gv[6];
    dom_vals(c->dom, 0, av, 6, 71 + (uint64_t)_i);
    dom_vals(c->dom, 1, bv, 3, 83 + (uint64_t)_i);
    make_vals(gv, 6, -2, 2, NULL, 0, 97 + (uint64_t)_i);
    const nb_dtype dts[4] = {NB_F64, NB_F32, NB_F16, NB_BF16};
    const double tols[4] = {0, 2e-5, 1e-2, 6e-2};
    double *ra = NULL, *rb = NULL;
    for (int d = 0; d < 4; d++) {
        nb_tensor *a = leaf(av, (int64_t[]){2, 3}, 2, dts[d]);
        nb_tensor *b = leaf(bv, (int64_t[]){3}, 1, dts[d]);
        nb_tensor *g = tu_tensor(gv, (int64_t[]){2, 3}, 2, dts[d]);
        backward_with(c->fn(a, b), d == 1 ? tu_noncontig(g) : g);
        ck_assert(nb_tensor_dtype(nb_grad(a)) == dts[d] && nb_tensor_dtype(nb_grad(b)) == dts[d]);
        if (d == 0) {
            ra = tu_values(nb_grad(a)), rb = tu_values(nb_grad(b));
            continue;
        }
        tu_assert_close(nb_grad(a), ra, ((int64_t[]){2, 3}), 2, tols[d]);
        tu_assert_close(nb_grad(b), rb, ((int64_t[]){3}), 1, tols[d]);
    }
    free(ra), free(rb);
    nb_scope_end();
}
END_TEST

/* ---- scalar forms ---------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    nb_tensor *(*fn)(nb_tensor *, double);
    double s;
    bool grid; /* inputs on the 1/8 lattice + 1/16: no tie with s */
} scalar_case;

static const scalar_case SCALAR[] = {
    {"add_scalar", nb_add_scalar, 0.7, false},  {"sub_scalar", nb_sub_scalar, 0.7, false},
    {"mul_scalar", nb_mul_scalar, -1.3, false}, {"div_scalar", nb_div_scalar, 0.8, false},
    {"maximum_scalar", nb_maximum_scalar, 0.25, true},
    {"minimum_scalar", nb_minimum_scalar, -0.5, true},
};
#define N_SCALAR (int)(sizeof SCALAR / sizeof SCALAR[0])

static nb_tensor *f_scalar(nb_tensor *const *in, int n, void *ctx) {
    (void)n;
    const scalar_case *c = ctx;
    return c->fn(in[0], c->s);
}
static nb_tensor *f_scalar_t(nb_tensor *const *in, int n, void *ctx) {
    (void)n;
    const scalar_case *c = ctx;
    return c->fn(nb_transpose(in[0], 0, 1), c->s);
}

START_TEST(test_scalar_forms) {
    const scalar_case *c = &SCALAR[_i];
    nb_scope_begin();
    double v[6], gv[6];
    dom_vals(c->grid ? DOM_GRID : DOM_ANY, 0, v, 6, 5 + (uint64_t)_i);
    nb_tensor *x = leaf(v, (int64_t[]){2, 3}, 2, NB_F64);
    CHECK_GRAD(f_scalar, &x, 1, nb__unconst(c), "%s", c->name);
    nb_tensor *xt = leaf(v, (int64_t[]){3, 2}, 2, NB_F64);
    CHECK_GRAD(f_scalar_t, &xt, 1, nb__unconst(c), "%s transposed", c->name);
    /* recorded as the tensor op with one input and the scalar in attrs */
    nb_tensor *y = c->fn(x, c->s);
    ck_assert(y->grad_fn && y->grad_fn->ninputs == 2 && y->grad_fn->attrs.flag);
    ck_assert(!y->grad_fn->edges[1].node && !y->grad_fn->edges[1].leaf);
    ck_assert(y->grad_fn->edges[0].leaf == x);
    /* dtypes: f32 and half gradients of their own dtype, close to f64 */
    make_vals(gv, 6, -2, 2, NULL, 0, 9 + (uint64_t)_i);
    const nb_dtype dts[4] = {NB_F64, NB_F32, NB_F16, NB_BF16};
    const double tols[4] = {0, 2e-5, 1e-2, 6e-2};
    double *ref = NULL;
    for (int d = 0; d < 4; d++) {
        nb_tensor *xd = leaf(v, (int64_t[]){2, 3}, 2, dts[d]);
        backward_with(c->fn(xd, c->s), tu_tensor(gv, (int64_t[]){2, 3}, 2, dts[d]));
        ck_assert(nb_tensor_dtype(nb_grad(xd)) == dts[d]);
        if (d == 0) ref = tu_values(nb_grad(xd));
        else tu_assert_close(nb_grad(xd), ref, ((int64_t[]){2, 3}), 2, tols[d]);
    }
    free(ref);
    nb_scope_end();
}
END_TEST

/* ---- where ----------------------------------------------------------------------------------- */

static nb_tensor *f_where(nb_tensor *const *in, int n, void *ctx) {
    (void)n, (void)ctx;
    return nb_where(in[0], in[1], in[2]);
}
static nb_tensor *f_where_t(nb_tensor *const *in, int n, void *ctx) {
    (void)n, (void)ctx;
    return nb_where(in[0], nb_transpose(in[1], 0, 1), in[2]);
}

START_TEST(test_where) {
    nb_scope_begin();
    double av[12], bv[12];
    tu_fill_uniform(av, 12, -2, 2, 3);
    tu_fill_uniform(bv, 12, -2, 2, 4);
    nb_tensor *cond = tu_tensor((double[]){1, 0, 1, 0, 0, 1}, (int64_t[]){2, 3}, 2, NB_BOOL);
    nb_tensor *a = leaf(av, (int64_t[]){2, 3}, 2, NB_F64);
    nb_tensor *b = leaf(bv, (int64_t[]){3}, 1, NB_F64);
    CHECK_GRAD(f_where, ((nb_tensor *[]){cond, a, b}), 3, NULL, "where [2,3] [3]");
    nb_tensor *c2 = tu_tensor((double[]){1, 0}, (int64_t[]){2, 1}, 2, NB_BOOL);
    nb_tensor *at = leaf(av, (int64_t[]){3, 2}, 2, NB_F64);
    nb_tensor *b0 = leaf(bv, (int64_t[]){1}, 0, NB_F64);
    CHECK_GRAD(f_where_t, ((nb_tensor *[]){c2, at, b0}), 3, NULL, "where transposed, 0-dim b");
    /* exact: g to a where cond, to b (summed over the broadcast dim) elsewhere */
    nb_tensor *a32 = leaf(av, (int64_t[]){2, 3}, 2, NB_F32);
    nb_tensor *b32 = leaf(bv, (int64_t[]){3}, 1, NB_F32);
    nb_tensor *g = tu_tensor((double[]){1, 2, 3, 4, 5, 6}, (int64_t[]){2, 3}, 2, NB_F32);
    nb_tensor *y = nb_where(cond, a32, b32);
    ck_assert(y->grad_fn && y->grad_fn->op == NB__OP_WHERE && !y->grad_fn->edges[0].leaf &&
              !y->grad_fn->edges[0].node);
    backward_with(y, g);
    tu_assert_close(nb_grad(a32), ((double[]){1, 0, 3, 0, 0, 6}), ((int64_t[]){2, 3}), 2, 0);
    tu_assert_close(nb_grad(b32), ((double[]){4, 2 + 5, 0}), ((int64_t[]){3}), 1, 0);
    /* a float a with an integer b: only a gets a gradient, as a float */
    nb_tensor *bi = tu_tensor((double[]){1, 2, 3}, (int64_t[]){3}, 1, NB_I32);
    nb_tensor *a2 = leaf(av, (int64_t[]){2, 3}, 2, NB_F32);
    backward_with(nb_where(cond, a2, bi), g);
    tu_assert_close(nb_grad(a2), ((double[]){1, 0, 3, 0, 0, 6}), ((int64_t[]){2, 3}), 2, 0);
    nb_scope_end();
}
END_TEST

/* ---- conventions at non-differentiable points ------------------------------------------------ */

/* The gradient of fn at vals with grad_output ones, checked exactly against ref. */
static void expect_unary(nb_tensor *(*fn)(nb_tensor *), const double *vals,
                         const double *ref, int64_t n, nb_dtype dt) {
    nb_tensor *x = leaf(vals, &n, 1, dt);
    backward_with(fn(x), nb_ones(&n, 1, dt));
    tu_assert_close(nb_grad(x), ref, &n, 1, 0);
}

static void expect_binary(nb_tensor *(*fn)(nb_tensor *, nb_tensor *), const double *av,
                          const double *bv, const double *ra, const double *rb, int64_t n,
                          nb_dtype dt) {
    nb_tensor *a = leaf(av, &n, 1, dt), *b = leaf(bv, &n, 1, dt);
    backward_with(fn(a, b), nb_ones(&n, 1, dt));
    tu_assert_close(nb_grad(a), ra, &n, 1, 0);
    tu_assert_close(nb_grad(b), rb, &n, 1, 0);
}

static nb_tensor *clamp_pm(nb_tensor *x) { return nb_clamp(x, -0.5, 0.5); }
static nb_tensor *max_s2(nb_tensor *x) { return nb_maximum_scalar(x, 2); }
static nb_tensor *min_s2(nb_tensor *x) { return nb_minimum_scalar(x, 2); }

START_TEST(test_conventions) {
    nb_scope_begin();
    const nb_dtype dts[3] = {NB_F64, NB_F32, NB_BF16};
    for (int d = 0; d < 3; d++) {
        nb_dtype dt = dts[d];
        /* abs'(0) = 0, relu'(0) = 0 */
        expect_unary(nb_abs, (double[]){-1, 0, 2}, (double[]){-1, 0, 1}, 3, dt);
        expect_unary(nb_relu, (double[]){-1, 0, 2}, (double[]){0, 0, 1}, 3, dt);
        /* clamp passes at both boundaries */
        expect_unary(clamp_pm, (double[]){-1, -0.5, 0, 0.5, 1}, (double[]){0, 1, 1, 1, 0}, 5,
                     dt);
        /* ties split in half; the larger (smaller) gets the gradient */
        expect_binary(nb_maximum, (double[]){1, 2, 3}, (double[]){3, 2, 1},
                      (double[]){0, 0.5, 1}, (double[]){1, 0.5, 0}, 3, dt);
        expect_binary(nb_minimum, (double[]){1, 2, 3}, (double[]){3, 2, 1},
                      (double[]){1, 0.5, 0}, (double[]){0, 0.5, 1}, 3, dt);
        expect_unary(max_s2, (double[]){1, 2, 3}, (double[]){0, 0.5, 1}, 3, dt);
        expect_unary(min_s2, (double[]){1, 2, 3}, (double[]){1, 0.5, 0}, 3, dt);
        /* pow: d/da masked where b == 0, d/db masked where a == 0 and b >= 0 */
        expect_binary(nb_pow, (double[]){0, 0, 0, -1, 2, 0}, (double[]){0, 2, -1, 2, 3, 0.5},
                      (double[]){0, 0, -INFINITY, -2, 12, INFINITY},
                      (double[]){0, 0, -INFINITY, NAN, 8 * log(2.0), 0}, 6, NB_F64);
        /* pow_scalar with exponent 0 has gradient 0 (even at 0); sqrt'(0) = inf */
        expect_unary(pow0, (double[]){0, 1, -2}, (double[]){0, 0, 0}, 3, dt);
        expect_unary(nb_sqrt, (double[]){0, 4}, (double[]){INFINITY, 0.25}, 2, dt);
        expect_unary(pow_half, (double[]){0, 4}, (double[]){INFINITY, 0.25}, 2, dt);
    }
    /* NaN is unordered: maximum passes the gradient to both operands (as PyTorch) */
    expect_binary(nb_maximum, (double[]){NAN, 1}, (double[]){1, NAN}, (double[]){1, 1},
                  (double[]){1, 1}, 2, NB_F32);
    /* empty inputs: an empty gradient */
    nb_tensor *e = nb_zeros((int64_t[]){0, 3}, 2, NB_F32);
    ck_assert(nb_set_requires_grad(e, true) == NB_OK);
    backward_with(nb_gelu(e), nb_zeros((int64_t[]){0, 3}, 2, NB_F32));
    ck_assert(nb_grad(e) && nb_numel(nb_grad(e)) == 0 && nb_ndim(nb_grad(e)) == 2);
    nb_scope_end();
}
END_TEST

/* Long f16/bf16 rows run the half kernels over several blocks of 256 (strided, too). */
START_TEST(test_half_blocks) {
    nb_scope_begin();
    enum { N = 600 };
    double av[N], bv[N], gv[N];
    dom_vals(DOM_POW, 0, av, N, 1);
    dom_vals(DOM_POW, 1, bv, N, 2);
    make_vals(gv, N, -1, 1, NULL, 0, 3);
    double ra[N], rb[N], rs[N];
    for (int i = 0; i < N; i++) {
        ra[i] = gv[i] * bv[i] * pow(av[i], bv[i] - 1);
        rb[i] = gv[i] * pow(av[i], bv[i]) * log(av[i]);
        double s = 1 / (1 + exp(-av[i]));
        rs[i] = gv[i] * s * (1 + av[i] * (1 - s));
    }
    const int64_t n = N;
    for (int h = 0; h < 2; h++) {
        nb_dtype dt = h ? NB_BF16 : NB_F16;
        double tol = h ? 3e-2 : 4e-3;
        nb_tensor *a = leaf(av, &n, 1, dt), *b = leaf(bv, &n, 1, dt);
        backward_with(nb_pow(a, b), tu_noncontig(tu_tensor(gv, &n, 1, dt)));
        tu_assert_close(nb_grad(a), ra, &n, 1, tol);
        tu_assert_close(nb_grad(b), rb, &n, 1, tol);
        nb_tensor *x = leaf(av, &n, 1, dt);
        backward_with(nb_silu(x), tu_tensor(gv, &n, 1, dt));
        tu_assert_close(nb_grad(x), rs, &n, 1, tol);
    }
    nb_scope_end();
}
END_TEST

/* ---- what records ---------------------------------------------------------------------------- */

START_TEST(test_recording) {
    nb_scope_begin();
    double v[6] = {0.5, -1, 2, 1.5, -0.25, 3};
    nb_tensor *x = leaf(v, (int64_t[]){2, 3}, 2, NB_F32);
    nb_tensor *y64 = leaf(v, (int64_t[]){3}, 1, NB_F64);
    /* grad mode off: nothing records */
    bool prev = nb_set_grad_enabled(false);
    for (int i = 0; i < N_UNARY; i++) {
        nb_tensor *r = UNARY[i].fn(x);
        ck_assert_msg(r && !nb_requires_grad(r) && nb_is_leaf(r), "%s", UNARY[i].name);
    }
    for (int i = 0; i < N_BINARY; i++) {
        nb_tensor *r = BINARY[i].fn(x, y64);
        ck_assert_msg(r && !nb_requires_grad(r) && nb_is_leaf(r), "%s", BINARY[i].name);
    }
    for (int i = 0; i < N_SCALAR; i++) {
        nb_tensor *r = SCALAR[i].fn(x, 2);
        ck_assert_msg(r && !nb_requires_grad(r) && nb_is_leaf(r), "%s", SCALAR[i].name);
    }
    nb_set_grad_enabled(prev);
    /* comparisons are not differentiable: bool results never record */
    nb_tensor *cmps[] = {nb_eq(x, y64), nb_ne(x, y64), nb_lt(x, y64), nb_le(x, y64),
                         nb_gt(x, y64), nb_ge(x, y64), nb_eq_scalar(x, 1), nb_lt_scalar(x, 1),
                         nb_gt_scalar(x, 1)};
    for (size_t i = 0; i < sizeof cmps / sizeof cmps[0]; i++)
        ck_assert(cmps[i] && !nb_requires_grad(cmps[i]) && nb_is_leaf(cmps[i]));
    /* integer ops never record (and integer inputs cannot require grad) */
    nb_tensor *xi = tu_tensor((double[]){1, -2, 3}, (int64_t[]){3}, 1, NB_I32);
    nb_tensor *ints[] = {nb_neg(xi), nb_abs(xi), nb_relu(xi), nb_clamp(xi, 0, 2),
                         nb_pow_scalar(xi, 2), nb_add(xi, xi), nb_mul_scalar(xi, 3),
                         nb_exp(xi), nb_div(xi, xi)};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        ck_assert(ints[i] && !nb_requires_grad(ints[i]) && nb_is_leaf(ints[i]));
    /* one node per op on the original inputs: the internal f32 -> f64 conversion of x
     * does not record a TO_DTYPE node of its own */
    nb_tensor *m = nb_mul(x, y64);
    ck_assert(m->grad_fn && m->grad_fn->op == NB__OP_MUL);
    ck_assert(m->grad_fn->edges[0].leaf == x && m->grad_fn->edges[1].leaf == y64);
    ck_assert(nb_tensor_dtype(m) == NB_F64);
    nb_tensor *pw = nb_pow(x, xi); /* f32 ^ i32: computes in f32 */
    ck_assert(pw->grad_fn && pw->grad_fn->op == NB__OP_POW && pw->grad_fn->edges[0].leaf == x);
    ck_assert(!pw->grad_fn->edges[1].leaf && !pw->grad_fn->edges[1].node);
    /* mixed dtypes: each input's gradient has its own dtype and shape */
    backward_with(m, nb_ones((int64_t[]){2, 3}, 2, NB_F64));
    ck_assert(nb_tensor_dtype(nb_grad(x)) == NB_F32 && nb_tensor_dtype(nb_grad(y64)) == NB_F64);
    tu_assert_close(nb_grad(x), ((double[]){0.5, -1, 2, 0.5, -1, 2}), ((int64_t[]){2, 3}), 2, 0);
    tu_assert_close(nb_grad(y64), ((double[]){2, -1.25, 5}), ((int64_t[]){3}), 1, 0);
    nb_scope_end();
}
END_TEST

/* A forward + backward loop over many of the rules stops calling the system allocator. */
START_TEST(test_no_alloc_growth) {
    nb_scope_begin();
    double v[24], w[6];
    tu_fill_uniform(v, 24, 0.2, 2, 1);
    tu_fill_uniform(w, 6, -1, 1, 2);
    nb_tensor *x = leaf(v, (int64_t[]){4, 6}, 2, NB_F32);
    nb_tensor *b = leaf(w, (int64_t[]){6}, 1, NB_F32);
    nb_alloc_stats s0, s1;
    for (int step = 0; step < 25; step++) {
        if (step == 5) nb_alloc_get_stats(&s0);
        nb_scope_begin();
        nb_tensor *h = nb_gelu(nb_add(x, b));
        h = nb_mul(nb_sigmoid(h), nb_tanh(nb_div(x, nb_exp(b))));
        h = nb_maximum(nb_silu(h), nb_mul_scalar(nb_sqrt(x), 0.1));
        h = nb_add(nb_pow(x, b), nb_clamp(nb_log(h), -3, 3));
        nb_tensor *loss = nb_sum(nb_where(nb_gt_scalar(x, 1), h, nb_relu(nb_neg(h))), NULL, 0,
                                 false);
        ck_assert_msg(loss && nb_backward(loss) == NB_OK, "%s", nb_last_error());
        nb_scope_end();
    }
    nb_alloc_get_stats(&s1);
    ck_assert_int_eq(s1.system_allocs, s0.system_allocs);
    ck_assert_int_eq(s1.bytes_live, s0.bytes_live);
    nb_scope_end();
}
END_TEST

Suite *nb_suite_grad_ops(void) {
    Suite *s = suite_create("grad_ops");
    TCase *tc = tcase_create("elementwise");
    tcase_add_loop_test(tc, test_unary_gradcheck, 0, N_UNARY);
    tcase_add_loop_test(tc, test_unary_dtypes, 0, N_UNARY);
    tcase_add_loop_test(tc, test_binary_gradcheck, 0, N_BINARY);
    tcase_add_loop_test(tc, test_binary_dtypes, 0, N_BINARY);
    tcase_add_loop_test(tc, test_scalar_forms, 0, N_SCALAR);
    tcase_add_test(tc, test_where);
    tcase_add_test(tc, test_conventions);
    tcase_add_test(tc, test_half_blocks);
    tcase_add_test(tc, test_recording);
    tcase_add_test(tc, test_no_alloc_growth);
    suite_add_tcase(s, tc);
    return s;
}
