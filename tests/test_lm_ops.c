/* test_lm_ops.c - the "lm_ops" suite: the Llama family's ops (nabla/nn.h): nb_rms_norm,
 * nb_rotary_embedding, nb_silu with nb_swiglu, and grouped-query attention in
 * nb_causal_attention (k and v with fewer heads than q).
 *
 * Each op is compared with PyTorch's results on the committed fixture
 * tests/fixtures/llama/ops.safetensors (tools/make_llama_op_fixtures.py: Hugging Face's Llama
 * computations), forward and backward in f32 and forward in bf16; its gradient is checked
 * against central differences in f64 (nb_gradcheck); grouped-query attention equals attention
 * on k and v repeated per group (forward and gradients, the repeated gradients summed), for
 * every float dtype and the bf16 kernels both ways; the ops run on the meta device (shapes)
 * and on the guard device (bit for bit the CPU's results), give the same bits at 1 and 2
 * threads, and refuse bad input with a clear error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/attention.h"
#include "testutil.h"

#define FIXTURE NB_SOURCE_DIR "/tests/fixtures/llama/ops.safetensors"
#define GUARD ((nb_device){NB_DEVICE_GUARD, 0})

static void make_grad(nb_tensor *t) { ck_assert(nb_set_requires_grad(t, true) == NB_OK); }

static void backward_with(nb_tensor *y, nb_tensor *g) {
    ck_assert_msg(y && g, "%s", nb_last_error());
    nb_backward_opts o = nb_backward_defaults();
    o.grad_output = g;
    ck_assert_msg(nb_backward_ex(y, &o) == NB_OK, "backward: %s", nb_last_error());
}

/* a matches r within rel * max|r| elementwise. */
static void assert_rel(const nb_tensor *a, const nb_tensor *r, double rel, const char *what) {
    ck_assert_msg(a && r, "%s: missing (%s)", what, nb_last_error());
    ck_assert_int_eq(nb_numel(a), nb_numel(r));
    ck_assert_int_eq(nb_ndim(a), nb_ndim(r));
    for (int d = 0; d < nb_ndim(a); d++) ck_assert_int_eq(nb_size(a, d), nb_size(r, d));
    double *x = tu_values(a), *y = tu_values(r), diff = 0, scale = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < nb_numel(a); i++) {
        double d = fabs(x[i] - y[i]);
        if (!(d <= diff)) diff = d, at = i;
        if (fabs(y[i]) > scale) scale = fabs(y[i]);
    }
    ck_assert_msg(diff <= rel * scale, "%s: max |diff| %g at %lld (%.9g vs %.9g) exceeds %g x "
                  "max |ref| %g", what, diff, (long long)at, x[at], y[at], rel, scale);
    free(x);
    free(y);
}

/* a and b hold the same values, bit for bit (read as f64). */
static void assert_same(nb_tensor *a, nb_tensor *b, const char *what) {
    ck_assert_msg(a && b, "%s: missing (%s)", what, nb_last_error());
    const int64_t n = nb_numel(a);
    ck_assert_int_eq(n, nb_numel(b));
    double *x = tu_values(a), *y = tu_values(b);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(x[i] == y[i] || (isnan(x[i]) && isnan(y[i])), "%s[%lld]: %.17g vs %.17g",
                      what, (long long)i, x[i], y[i]);
    free(x);
    free(y);
}

static nb_safetensors *g_fx;

/* Fixture entry `name` on the default device (a copy, in the scope). */
static nb_tensor *fx(const char *name) {
    if (!g_fx) g_fx = nb_safetensors_open(FIXTURE);
    ck_assert_msg(g_fx, "%s", nb_last_error());
    nb_tensor *t = nb_safetensors_get(g_fx, name);
    ck_assert_msg(t, "fixture entry %s: %s", name, nb_last_error());
    return nb_to_device(nb_clone(t), nb_default_device());
}

static nb_tensor *leaf(const char *name) {
    nb_tensor *t = fx(name);
    make_grad(t);
    return t;
}

/* ---- against PyTorch ------------------------------------------------------------------------- */
START_TEST(test_rms_norm_fixture) {
    nb_scope_begin();
    nb_tensor *x = leaf("rms.x"), *w = leaf("rms.w");
    nb_tensor *y = nb_rms_norm(x, w, 1e-6);
    assert_rel(y, fx("rms.y"), 1e-6, "rms_norm y");
    backward_with(y, fx("rms.g"));
    assert_rel(nb_grad(x), fx("rms.dx"), 1e-5, "rms_norm dx");
    assert_rel(nb_grad(w), fx("rms.dw"), 1e-5, "rms_norm dw");
    /* bf16: computed in f32, rounded once (PyTorch rounds twice: within a bf16 step) */
    nb_tensor *yb = nb_rms_norm(fx("rms.x_bf16"), fx("rms.w_bf16"), 1e-6);
    ck_assert_int_eq(nb_tensor_dtype(yb), NB_BF16);
    assert_rel(yb, fx("rms.y_bf16"), 1.0 / 128, "rms_norm bf16");
    /* the module: Hugging Face's name, ones */
    nb_module *m = nb_rms_norm_new(24, 1e-6);
    ck_assert_ptr_nonnull(nb_module_find(m, "weight"));
    assert_rel(nb_forward(m, fx("rms.x")), nb_rms_norm(fx("rms.x"), NULL, 1e-6), 0, "module");
    nb_module_free(m);
    nb_scope_end();
}
END_TEST

START_TEST(test_rotary_fixture) {
    nb_scope_begin();
    nb_tensor *x = leaf("rope.x");
    nb_tensor *y = nb_rotary_embedding(x, 5, 500.0);
    assert_rel(y, fx("rope.y"), 1e-6, "rotary y");
    backward_with(y, fx("rope.g"));
    assert_rel(nb_grad(x), fx("rope.dx"), 1e-6, "rotary dx");
    nb_tensor *yb = nb_rotary_embedding(fx("rope.x_bf16"), 5, 500.0);
    ck_assert_int_eq(nb_tensor_dtype(yb), NB_BF16);
    assert_rel(yb, fx("rope.y_bf16"), 1.0 / 64, "rotary bf16");
    nb_scope_end();
}
END_TEST

START_TEST(test_swiglu_fixture) {
    nb_scope_begin();
    assert_rel(nb_silu(fx("glu.a")), fx("silu.y"), 1e-6, "silu");
    nb_tensor *a = leaf("glu.a"), *b = leaf("glu.b");
    nb_tensor *y = nb_swiglu(a, b);
    assert_rel(y, fx("glu.y"), 1e-6, "swiglu y");
    backward_with(y, fx("glu.g"));
    assert_rel(nb_grad(a), fx("glu.da"), 1e-5, "swiglu da");
    assert_rel(nb_grad(b), fx("glu.db"), 1e-6, "swiglu db");
    nb_tensor *yb = nb_swiglu(fx("glu.a_bf16"), fx("glu.b_bf16"));
    ck_assert_int_eq(nb_tensor_dtype(yb), NB_BF16);
    assert_rel(yb, fx("glu.y_bf16"), 1.0 / 128, "swiglu bf16");
    /* fused equals the two ops it replaces */
    assert_rel(nb_swiglu(fx("glu.a"), fx("glu.b")), nb_mul(nb_silu(fx("glu.a")), fx("glu.b")),
               1e-7, "swiglu = silu(a) * b");
    nb_scope_end();
}
END_TEST

START_TEST(test_gqa_fixture) {
    nb_scope_begin();
    nb_tensor *q = leaf("gqa.q"), *k = leaf("gqa.k"), *v = leaf("gqa.v");
    nb_tensor *o = nb_causal_attention(q, k, v, 0, 0, false, NULL);
    assert_rel(o, fx("gqa.o"), 1e-5, "gqa o");
    backward_with(o, fx("gqa.g"));
    assert_rel(nb_grad(q), fx("gqa.dq"), 1e-5, "gqa dq");
    assert_rel(nb_grad(k), fx("gqa.dk"), 1e-5, "gqa dk");
    assert_rel(nb_grad(v), fx("gqa.dv"), 1e-5, "gqa dv");
    for (int native = 0; native < 2; native++) {
        bool was = nb__cpu_attention_native_bf16(native);
        nb_tensor *ob = nb_causal_attention(fx("gqa.q_bf16"), fx("gqa.k_bf16"), fx("gqa.v_bf16"),
                                            0, 0, false, NULL);
        ck_assert_int_eq(nb_tensor_dtype(ob), NB_BF16);
        assert_rel(ob, fx("gqa.o_bf16"), 1.0 / 64, "gqa bf16");
        nb__cpu_attention_native_bf16(was);
    }
    nb_scope_end();
}
END_TEST

/* ---- gradchecks in f64 ----------------------------------------------------------------------- */
typedef struct gc_ctx {
    int op;          /* 0 rms_norm, 1 rms_norm without weight, 2 rotary, 3 swiglu, 4 attention */
    int64_t offset;
} gc_ctx;

static nb_tensor *f_op(nb_tensor *const *in, int n, void *ctx_) {
    const gc_ctx *c = ctx_;
    (void)n;
    switch (c->op) {
    case 0: return nb_rms_norm(in[0], in[1], 1e-3);
    case 1: return nb_rms_norm(in[0], NULL, 0.5);
    case 2: return nb_rotary_embedding(in[0], c->offset, 10000.0);
    case 3: return nb_swiglu(in[0], in[1]);
    default: return nb_causal_attention(in[0], in[1], in[2], 0, 0, false, NULL);
    }
}

static void gradcheck(int op, nb_tensor *const *in, int n, int64_t offset) {
    gc_ctx c = {op, offset};
    for (int i = 0; i < n; i++) make_grad(in[i]);
    ck_assert_msg(nb_gradcheck(f_op, in, n, &c, NULL) == NB_OK, "op %d: %s", op, nb_last_error());
}

START_TEST(test_gradcheck) {
    nb_scope_begin();
    const int64_t xs[3] = {2, 3, 20}, ws[1] = {20};
    gradcheck(0, (nb_tensor *[]){tu_random(xs, 3, NB_F64, -2, 2, 1), tu_random(ws, 1, NB_F64,
                                                                                0.5, 1.5, 2)},
              2, 0);
    gradcheck(1, (nb_tensor *[]){tu_random(xs, 3, NB_F64, -2, 2, 3)}, 1, 0);
    /* rotary at offset 0 and 7, one head and several */
    gradcheck(2, (nb_tensor *[]){tu_random((int64_t[]){2, 4, 3, 6}, 4, NB_F64, -1, 1, 4)}, 1, 0);
    gradcheck(2, (nb_tensor *[]){tu_random((int64_t[]){5, 1, 8}, 3, NB_F64, -1, 1, 5)}, 1, 7);
    gradcheck(3, (nb_tensor *[]){tu_random(xs, 3, NB_F64, -4, 4, 6), tu_random(xs, 3, NB_F64,
                                                                                -1, 1, 7)},
              2, 0);
    /* grouped-query attention: 4 query heads on 2 and on 1 key/value heads */
    for (int64_t hkv = 1; hkv <= 2; hkv++)
        gradcheck(4, (nb_tensor *[]){tu_random((int64_t[]){2, 4, 5, 3}, 4, NB_F64, -1, 1, 8),
                                     tu_random((int64_t[]){2, hkv, 5, 3}, 4, NB_F64, -1, 1, 9),
                                     tu_random((int64_t[]){2, hkv, 5, 3}, 4, NB_F64, -1, 1, 10)},
                  3, 0);
    nb_scope_end();
}
END_TEST

/* ---- grouped-query attention equals attention on repeated k and v ------------------------------ */
/* k (B, Hkv, T, D) with each head repeated rep times: (B, Hkv rep, T, D) (a new tensor). */
static nb_tensor *repeat_heads(nb_tensor *k, int64_t rep) {
    const int64_t B = nb_size(k, 0), H = nb_size(k, 1), T = nb_size(k, 2), D = nb_size(k, 3);
    nb_tensor *e = nb_expand(nb_view(k, (int64_t[]){B, H, 1, T, D}, 5),
                             (int64_t[]){B, H, rep, T, D}, 5);
    return nb_reshape(nb_contiguous(e), (int64_t[]){B, H * rep, T, D}, 4);
}

START_TEST(test_gqa_equals_repeated) {
    static const nb_dtype dts[] = {NB_F32, NB_F64, NB_F16, NB_BF16};
    /* T 37 crosses the kernels' row blocks; (H, Hkv) (6, 2), (6, 1), (6, 3), (4, 4) */
    static const int64_t heads[][2] = {{6, 2}, {6, 1}, {6, 3}, {4, 4}};
    for (int di = 0; di < 4; di++)
        for (int hi = 0; hi < 4; hi++)
            for (int native = 0; native < 2; native++) {
                if (native && dts[di] != NB_BF16) continue;
                bool was = nb__cpu_attention_native_bf16(native);
                nb_scope_begin();
                const nb_dtype dt = dts[di];
                const int64_t H = heads[hi][0], Hkv = heads[hi][1], rep = H / Hkv;
                const int64_t qs[4] = {2, H, 37, 8}, ks[4] = {2, Hkv, 37, 8};
                nb_tensor *q = tu_random(qs, 4, dt, -1, 1, 11), *k = tu_random(ks, 4, dt, -1, 1, 12);
                nb_tensor *v = tu_random(ks, 4, dt, -1, 1, 13), *g = tu_random(qs, 4, dt, -1, 1, 14);
                nb_tensor *q2 = nb_clone(q), *kr = nb_clone(k), *vr = nb_clone(v);
                make_grad(q), make_grad(k), make_grad(v);
                make_grad(q2), make_grad(kr), make_grad(vr);
                nb_tensor *o = nb_causal_attention(q, k, v, 0, 0, false, NULL);
                nb_tensor *o2 = nb_causal_attention(q2, repeat_heads(kr, rep),
                                                    repeat_heads(vr, rep), 0, 0, false, NULL);
                ck_assert_msg(o && o2, "%s", nb_last_error());
                assert_same(o, o2, "gqa output");
                backward_with(o, g);
                backward_with(o2, g);
                assert_same(nb_grad(q), nb_grad(q2), "gqa dq");
                /* the repeated heads' gradients are summed in another order: rounding only */
                const double tol = dt == NB_F64 ? 1e-14 : dt == NB_F32 ? 1e-6 : 1.0 / 64;
                assert_rel(nb_grad(k), nb_grad(kr), tol, "gqa dk");
                assert_rel(nb_grad(v), nb_grad(vr), tol, "gqa dv");
                nb_scope_end();
                nb__cpu_attention_native_bf16(was);
            }
}
END_TEST

/* ---- rotary with an offset is the tail of a longer sequence ----------------------------------- */
START_TEST(test_rotary_offset) {
    nb_scope_begin();
    nb_tensor *x = tu_random((int64_t[]){2, 11, 3, 16}, 4, NB_F32, -1, 1, 20);
    nb_tensor *whole = nb_rotary_embedding(x, 0, 10000.0);
    nb_tensor *tail = nb_rotary_embedding(nb_narrow(x, 1, 7, 4), 7, 10000.0);
    assert_same(nb_narrow(whole, 1, 7, 4), tail, "positions 7..10");
    /* position 0 is the identity; the inverse undoes it */
    assert_same(nb_narrow(whole, 1, 0, 1), nb_narrow(x, 1, 0, 1), "position 0");
    nb_tensor *xl = nb_clone(x);
    make_grad(xl);
    nb_tensor *y = nb_rotary_embedding(xl, 3, 10000.0);
    backward_with(y, y); /* the gradient of |y|^2 / 2 is the rotation back of y: x */
    assert_rel(nb_grad(xl), x, 1e-6, "inverse rotation");
    nb_scope_end();
}
END_TEST

/* ---- meta, guard, threads ---------------------------------------------------------------------- */
typedef struct run_out {
    nb_tensor *y[4], *g[8];
} run_out;

/* Every op once on dev (inputs made on the CPU and moved), forward and backward. */
static run_out run_all(nb_device dev, nb_dtype dt) {
    run_out r;
    memset(&r, 0, sizeof r);
    /* big enough for two threads in every kernel */
    const int64_t xs[3] = {4, 64, 300}, hs[4] = {2, 64, 4, 130}, qs[4] = {2, 4, 64, 16};
    const int64_t ks[4] = {2, 2, 64, 16};
    nb_tensor *in[8] = {tu_random_cpu(xs, 3, dt, -2, 2, 30),
                        tu_random_cpu((int64_t[]){300}, 1, dt, 0.5, 1.5, 31),
                        tu_random_cpu(hs, 4, dt, -1, 1, 32), tu_random_cpu(xs, 3, dt, -3, 3, 33),
                        tu_random_cpu(xs, 3, dt, -1, 1, 34), tu_random_cpu(qs, 4, dt, -1, 1, 35),
                        tu_random_cpu(ks, 4, dt, -1, 1, 36), tu_random_cpu(ks, 4, dt, -1, 1, 37)};
    for (int i = 0; i < 8; i++) {
        in[i] = nb_to_device(in[i], dev);
        make_grad(in[i]);
    }
    r.y[0] = nb_rms_norm(in[0], in[1], 1e-5);
    r.y[1] = nb_rotary_embedding(in[2], 3, 10000.0);
    r.y[2] = nb_swiglu(in[3], in[4]);
    r.y[3] = nb_causal_attention(in[5], in[6], in[7], 0, 0, false, NULL);
    for (int i = 0; i < 4; i++) {
        nb_tensor *go = nb_to_device(tu_random_cpu(nb_shape(r.y[i]), nb_ndim(r.y[i]), dt, -1, 1,
                                                   40 + (uint64_t)i), dev);
        backward_with(r.y[i], go);
    }
    for (int i = 0; i < 8; i++) r.g[i] = nb_grad(in[i]);
    return r;
}

START_TEST(test_meta_guard_threads) {
    static const nb_dtype dts[] = {NB_F32, NB_F64, NB_BF16};
    for (int di = 0; di < 3; di++) {
        nb_scope_begin();
        const nb_dtype dt = dts[di];
        run_out c = run_all(NB_CPU, dt), gd = run_all(GUARD, dt), m = run_all(NB_META, dt);
        for (int i = 0; i < 4; i++) {
            tu_expect_on(m.y[i], NB_META, nb_shape(c.y[i]), nb_ndim(c.y[i]), dt, "meta output");
            tu_expect_on(gd.y[i], GUARD, nb_shape(c.y[i]), nb_ndim(c.y[i]), dt, "guard output");
            assert_same(c.y[i], nb_to_device(gd.y[i], NB_CPU), "guard output");
        }
        for (int i = 0; i < 8; i++) {
            ck_assert_msg(c.g[i] && gd.g[i] && m.g[i], "gradient %d missing", i);
            tu_expect_on(m.g[i], NB_META, nb_shape(c.g[i]), nb_ndim(c.g[i]),
                         nb_tensor_dtype(c.g[i]), "meta grad");
            assert_same(c.g[i], nb_to_device(gd.g[i], NB_CPU), "guard grad");
        }
        /* the same bits on one thread and on two */
        const int nt = nb_get_num_threads();
        nb_set_num_threads(nt == 1 ? 2 : 1);
        run_out t = run_all(NB_CPU, dt);
        nb_set_num_threads(nt);
        for (int i = 0; i < 4; i++) assert_same(c.y[i], t.y[i], "threads: output");
        for (int i = 0; i < 8; i++) assert_same(c.g[i], t.g[i], "threads: grad");
        nb_scope_end();
    }
    const char *ks[] = {"rms_norm", "rms_norm_backward", "rotary", "swiglu", "swiglu_backward"};
    for (int i = 0; i < 5; i++)
        ck_assert_msg(nb_device_supports(NB_CPU, ks[i]) && nb_device_supports(GUARD, ks[i]),
                      "%s", ks[i]);
}
END_TEST

/* ---- large rows: the vector paths and their tails against f64 -------------------------------- */
START_TEST(test_long_rows) {
    nb_scope_begin();
    /* D = 4099: 256 whole 16-lane groups and a tail of 3 */
    const int64_t xs[2] = {5, 4099};
    nb_tensor *x = tu_random(xs, 2, NB_F32, -3, 3, 50), *w = tu_random(xs + 1, 1, NB_F32, 0, 2, 51);
    nb_tensor *g = tu_random(xs, 2, NB_F32, -1, 1, 52);
    nb_tensor *x64 = nb_to_dtype(x, NB_F64), *w64 = nb_to_dtype(w, NB_F64);
    make_grad(x), make_grad(w), make_grad(x64), make_grad(w64);
    nb_tensor *y = nb_rms_norm(x, w, 1e-5), *y64 = nb_rms_norm(x64, w64, 1e-5);
    assert_rel(y, y64, 1e-6, "rms_norm long rows");
    backward_with(y, g);
    backward_with(y64, nb_to_dtype(g, NB_F64));
    assert_rel(nb_grad(x), nb_grad(x64), 1e-5, "rms_norm dx long rows");
    assert_rel(nb_grad(w), nb_grad(w64), 1e-5, "rms_norm dw long rows");
    nb_tensor *r = nb_rotary_embedding(nb_view(x, (int64_t[]){5, 1, 1, 4099}, 4), 0, 1e4);
    ck_assert_ptr_null(r); /* odd head size */
    nb_clear_error();
    /* f32 angles are rounded to f32 as Hugging Face rounds them: at positions past 1000 that
     * is 1000 x 2^-24 = 6e-5 radians (at positions 3 to 52, 3e-6); f64 angles are exact */
    nb_tensor *h = tu_random((int64_t[]){3, 50, 2, 130}, 4, NB_F32, -1, 1, 53);
    assert_rel(nb_rotary_embedding(h, 1000, 1e6),
               nb_rotary_embedding(nb_to_dtype(h, NB_F64), 1000, 1e6), 2e-4, "rotary at 1000+");
    assert_rel(nb_rotary_embedding(h, 3, 1e6),
               nb_rotary_embedding(nb_to_dtype(h, NB_F64), 3, 1e6), 1e-5, "rotary at 3+");
    nb_scope_end();
}
END_TEST

/* ---- bad input -------------------------------------------------------------------------------- */
START_TEST(test_errors) {
    nb_scope_begin();
    nb_tensor *x = tu_random((int64_t[]){2, 3, 8}, 3, NB_F32, -1, 1, 60);
    tu_assert_error(nb_rms_norm(NULL, NULL, 1e-5), NB_ENULL, NULL);
    tu_assert_error(nb_rms_norm(x, tu_random((int64_t[]){7}, 1, NB_F32, 0, 1, 61), 1e-5),
                    NB_ESHAPE, "weight must have shape [8]");
    tu_assert_error(nb_rms_norm(x, NULL, -1), NB_EINVAL, "eps");
    tu_assert_error(nb_rms_norm(tu_random((int64_t[]){3}, 1, NB_I64, 0, 4, 62), NULL, 1e-5),
                    NB_EDTYPE, "i64");
    tu_assert_error(nb_rms_norm_new(-1, 1e-5), NB_EINVAL, "features");
    /* a head size rotary cannot split */
    tu_assert_error(nb_rotary_embedding(tu_random((int64_t[]){1, 4, 2, 7}, 4, NB_F32, -1, 1, 63),
                                        0, 1e4),
                    NB_ESHAPE, "head size 7 is odd");
    tu_assert_error(nb_rotary_embedding(nb_view(x, (int64_t[]){6, 8}, 2), 0, 1e4), NB_ESHAPE,
                    "at least 3 dims");
    nb_tensor *h = tu_random((int64_t[]){1, 4, 2, 8}, 4, NB_F32, -1, 1, 64);
    tu_assert_error(nb_rotary_embedding(h, 0, 0), NB_EINVAL, "base");
    tu_assert_error(nb_rotary_embedding(h, -1, 1e4), NB_EINVAL, "offset");
    tu_assert_error(nb_swiglu(x, tu_random((int64_t[]){2, 3, 4}, 3, NB_F32, -1, 1, 65)),
                    NB_ESHAPE, "same shape");
    tu_assert_error(nb_swiglu(x, nb_to_dtype(x, NB_F64)), NB_EDTYPE, "one float dtype");
    /* key/value heads that do not divide the query heads */
    nb_tensor *q = tu_random((int64_t[]){1, 4, 5, 8}, 4, NB_F32, -1, 1, 66);
    nb_tensor *k3 = tu_random((int64_t[]){1, 3, 5, 8}, 4, NB_F32, -1, 1, 67);
    tu_assert_error(nb_causal_attention(q, k3, k3, 0, 0, false, NULL), NB_ESHAPE,
                    "3 heads, which does not divide the 4 heads");
    nb_tensor *k2 = tu_random((int64_t[]){1, 2, 5, 8}, 4, NB_F32, -1, 1, 68);
    tu_assert_error(nb_causal_attention(q, k2, k3, 0, 0, false, NULL), NB_ESHAPE, "same shape");
    nb_scope_end();
}
END_TEST

static void close_fixture(void) {
    nb_safetensors_close(g_fx);
    g_fx = NULL;
}

Suite *nb_suite_lm_ops(void) {
    Suite *s = suite_create("lm_ops");
    TCase *tc = tcase_create("ops");
    tcase_add_unchecked_fixture(tc, NULL, close_fixture);
    tcase_add_test(tc, test_rms_norm_fixture);
    tcase_add_test(tc, test_rotary_fixture);
    tcase_add_test(tc, test_swiglu_fixture);
    tcase_add_test(tc, test_gqa_fixture);
    tcase_add_test(tc, test_gradcheck);
    tcase_add_test(tc, test_gqa_equals_repeated);
    tcase_add_test(tc, test_rotary_offset);
    tcase_add_test(tc, test_meta_guard_threads);
    tcase_add_test(tc, test_long_rows);
    tcase_add_test(tc, test_errors);
    suite_add_tcase(s, tc);
    return s;
}
