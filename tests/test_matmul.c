/* test_matmul.c - the "matmul" suite: nb_matmul against a double-precision triple loop, over
 * shapes (1x1x1, awkward sizes, K = 0, empty M/N), operand layouts (contiguous, nb_transpose
 * views, padded rows, padded columns, stride 2 in both dims), 1-D promotion, broadcast batch
 * dims, all float dtypes, and under every GEMM provider built in. Also checks that layouts the
 * GEMM can read directly are not copied (allocator block counts), the GEMM layer's alpha/beta
 * contract, the provider switch, and every user error. nb_matmul and nb_linear on the
 * guard device (same values as the CPU, forward and backward) and on meta (shapes only),
 * operands on two devices, and the gemm kernel's batch/bias contract. The packed-sgemm tests
 * are in test_sgemm.c. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/gemm.h"
#include "cpu/sgemm.h"
#include "tensor/backend.h"
#include "testutil.h"

static const nb_dtype k_dtypes[] = {NB_F32, NB_F64, NB_F16, NB_BF16};
#define N_DTYPES ((int)(sizeof k_dtypes / sizeof k_dtypes[0]))

/* Providers built into this library (OpenBLAS always; oneDNN when meson found it). */
static int providers(nb_gemm_provider *out) {
    int n = 0;
    if (nb_gemm_provider_available(NB_GEMM_OPENBLAS)) out[n++] = NB_GEMM_OPENBLAS;
    if (nb_gemm_provider_available(NB_GEMM_DNNL)) out[n++] = NB_GEMM_DNNL;
    return n;
}

/* ---- reference --------------------------------------------------------------------------- */

/* torch.matmul in double precision from the operands' stored values (so the only difference
 * to nb_matmul is the GEMM's float arithmetic and the final rounding). Fills the expected
 * output shape; returns a malloc'ed array the caller frees. */
static double *ref_matmul(const nb_tensor *a, const nb_tensor *b, int64_t *oshape, int *ondim) {
    double *va = tu_values(a), *vb = tu_values(b);
    int na = nb_ndim(a), nbd = nb_ndim(b);
    int64_t ash[NB_MAX_DIMS], bsh[NB_MAX_DIMS];
    int pa = na, pb = nbd;
    if (na == 1) ash[0] = 1, ash[1] = nb_shape(a)[0], pa = 2;
    else memcpy(ash, nb_shape(a), sizeof(int64_t) * (size_t)na);
    if (nbd == 1) bsh[0] = nb_shape(b)[0], bsh[1] = 1, pb = 2;
    else memcpy(bsh, nb_shape(b), sizeof(int64_t) * (size_t)nbd);
    int64_t M = ash[pa - 2], K = ash[pa - 1], N = bsh[pb - 1];
    ck_assert_int_eq(K, bsh[pb - 2]);
    int ba = pa - 2, bb = pb - 2, nbo = ba > bb ? ba : bb;
    int64_t obatch[NB_MAX_DIMS], nbatch = 1;
    for (int d = 0; d < nbo; d++) {
        int64_t sa = d - (nbo - ba) >= 0 ? ash[d - (nbo - ba)] : 1;
        int64_t sb = d - (nbo - bb) >= 0 ? bsh[d - (nbo - bb)] : 1;
        ck_assert(sa == sb || sa == 1 || sb == 1);
        obatch[d] = sa == 1 ? sb : sa;
        nbatch *= obatch[d];
    }
    int nd = 0;
    for (int d = 0; d < nbo; d++) oshape[nd++] = obatch[d];
    if (na >= 2) oshape[nd++] = M;
    if (nbd >= 2) oshape[nd++] = N;
    *ondim = nd;
    double *out = calloc((size_t)(nbatch * M * N + 1), sizeof(double));
    int64_t idx[NB_MAX_DIMS];
    for (int64_t bi = 0; bi < nbatch; bi++) {
        tu_unravel(bi, obatch, nbo, idx);
        int64_t offa = 0, offb = 0; /* batch index into a's / b's own batch dims */
        for (int d = 0; d < ba; d++) {
            int64_t i = idx[d + nbo - ba];
            offa = offa * ash[d] + (ash[d] == 1 ? 0 : i);
        }
        for (int d = 0; d < bb; d++) {
            int64_t i = idx[d + nbo - bb];
            offb = offb * bsh[d] + (bsh[d] == 1 ? 0 : i);
        }
        const double *A = va + offa * M * K, *B = vb + offb * K * N;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++) s += A[i * K + k] * B[k * N + j];
                out[(bi * M + i) * N + j] = s;
            }
    }
    free(va);
    free(vb);
    return out;
}

/* ---- operands in several layouts ----------------------------------------------------------- */

enum {
    L_CONTIG,   /* contiguous */
    L_TRANS,    /* nb_transpose of contiguous storage (column-major slices) */
    L_STRIDED,  /* stride 2 in both of the last two dims: must be copied */
    L_PADROW,   /* row-major with a leading dimension larger than the row (a narrow view) */
    L_PADCOL,   /* column-major with a padded leading dimension */
    L_COUNT
};
static const char *k_layout_names[L_COUNT] = {"contig", "trans", "strided", "padrow", "padcol"};

static nb_tensor *make_operand(const int64_t *shape, int nd, nb_dtype dt, int layout,
                               uint64_t seed) {
    int64_t sh[NB_MAX_DIMS];
    memcpy(sh, shape, sizeof(int64_t) * (size_t)nd);
    if (nd == 1) {
        if (layout == L_CONTIG || layout == L_PADROW) return tu_random(shape, 1, dt, -1, 1, seed);
        return tu_noncontig(tu_random(shape, 1, dt, -1, 1, seed));
    }
    switch (layout) {
    case L_TRANS: return tu_noncontig(tu_random(shape, nd, dt, -1, 1, seed));
    case L_STRIDED: {
        sh[nd - 1] *= 2, sh[nd - 2] *= 2;
        nb_tensor *big = tu_random(sh, nd, dt, -1, 1, seed);
        nb_tensor *v = nb_slice(big, nd - 2, 0, sh[nd - 2], 2);
        return nb_slice(v, nd - 1, 0, sh[nd - 1], 2);
    }
    case L_PADROW: {
        sh[nd - 1] += 3;
        return nb_narrow(tu_random(sh, nd, dt, -1, 1, seed), nd - 1, 1, shape[nd - 1]);
    }
    case L_PADCOL: {
        sh[nd - 1] = shape[nd - 2] + 3, sh[nd - 2] = shape[nd - 1];
        nb_tensor *st = nb_narrow(tu_random(sh, nd, dt, -1, 1, seed), nd - 1, 2, shape[nd - 2]);
        return nb_transpose(st, nd - 2, nd - 1);
    }
    default: return tu_random(shape, nd, dt, -1, 1, seed);
    }
}

/* Whether nb_matmul has to copy an operand in this layout (slices it cannot pass as is). */
static bool needs_copy(const int64_t *shape, int nd, int layout) {
    return nd >= 2 && layout == L_STRIDED && shape[nd - 1] > 1 && shape[nd - 2] > 1;
}

static int64_t allocs_now(void) {
    nb_alloc_stats st;
    nb_alloc_get_stats(&st);
    return st.allocs;
}

/* Run nb_matmul(a, b), compare with the reference; if expect_no_copy (f32/f64 only), check
 * that it took no more allocator blocks than its output does. */
static void check_mm(nb_tensor *a, nb_tensor *b, bool expect_no_copy, const char *what) {
    ck_assert_msg(a && b, "%s: operand: %s", what, nb_last_error());
    int64_t oshape[NB_MAX_DIMS];
    int ond;
    double *ref = ref_matmul(a, b, oshape, &ond);
    nb_dtype dt = nb_tensor_dtype(a);

    int64_t before_empty = allocs_now();
    ck_assert_ptr_nonnull(nb_empty(oshape, ond, dt)); /* freed with the caller's scope */
    int64_t out_blocks = allocs_now() - before_empty;

    int64_t before = allocs_now();
    nb_tensor *c = nb_matmul(a, b);
    int64_t used = allocs_now() - before;
    ck_assert_msg(c != NULL, "%s: %s", what, nb_last_error());
    ck_assert_msg(nb_tensor_dtype(c) == dt, "%s: dtype %s", what, nb_dtype_name(nb_tensor_dtype(c)));
    ck_assert_msg(nb_is_contiguous(c), "%s: result not contiguous", what);
    if (expect_no_copy && (dt == NB_F32 || dt == NB_F64))
        ck_assert_msg(used == out_blocks, "%s: matmul took %lld allocator blocks, its output %lld "
                      "(an operand was copied)", what, (long long)used, (long long)out_blocks);
    /* f32 GEMMs accumulate K products in float: allow for the longest K used here. */
    double tol = dt == NB_F32 ? 2e-5 : tu_tol(dt);
    tu_assert_close(c, ref, oshape, ond, tol);
    free(ref);
}

/* ---- 2-D: shapes x layouts x dtypes x providers --------------------------------------------- */

START_TEST(test_matmul_2d) {
    static const int64_t shapes[][3] = {/* M, K, N */
        {1, 1, 1}, {7, 13, 5}, {33, 65, 17}, {4, 0, 3}, {0, 5, 3}, {3, 5, 0}, {1, 9, 6},
        {6, 9, 1}, {16, 32, 8}};
    nb_gemm_provider prov[2], saved = nb_gemm_provider_current();
    int np = providers(prov);
    for (int p = 0; p < np; p++) {
        ck_assert_int_eq(nb_set_gemm_provider(prov[p]), NB_OK);
        ck_assert_int_eq(nb_gemm_provider_current(), prov[p]);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int di = 0; di < N_DTYPES; di++)
                for (int la = 0; la < L_COUNT; la++)
                    for (int lb = 0; lb < L_COUNT; lb++) {
                        nb_scope_begin();
                        int64_t M = shapes[s][0], K = shapes[s][1], N = shapes[s][2];
                        int64_t ash[2] = {M, K}, bsh[2] = {K, N};
                        nb_tensor *a = make_operand(ash, 2, k_dtypes[di], la, 11 + s);
                        nb_tensor *b = make_operand(bsh, 2, k_dtypes[di], lb, 97 + s);
                        char what[160];
                        snprintf(what, sizeof what, "%s %lldx%lldx%lld %s a=%s b=%s",
                                 nb_gemm_provider_name(prov[p]), (long long)M, (long long)K,
                                 (long long)N, nb_dtype_name(k_dtypes[di]), k_layout_names[la],
                                 k_layout_names[lb]);
                        check_mm(a, b, !needs_copy(ash, 2, la) && !needs_copy(bsh, 2, lb), what);
                        nb_scope_end();
                    }
    }
    nb_set_gemm_provider(saved);
}
END_TEST

/* The transposed operand of each training-step layout, as nb_transpose views, is not copied:
 * NT = X @ W^T (Linear forward), NN = dY @ W (input grad), TN = dY^T @ X (weight grad). */
START_TEST(test_matmul_transpose_no_copy) {
    nb_gemm_provider prov[2], saved = nb_gemm_provider_current();
    int np = providers(prov);
    for (int p = 0; p < np; p++) {
        nb_set_gemm_provider(prov[p]);
        nb_scope_begin();
        int64_t xs[2] = {24, 20}, ws[2] = {12, 20}, ys[2] = {24, 12};
        nb_tensor *x = tu_random(xs, 2, NB_F32, -1, 1, 1);
        nb_tensor *w = tu_random(ws, 2, NB_F32, -1, 1, 2);
        nb_tensor *dy = tu_random(ys, 2, NB_F32, -1, 1, 3);
        check_mm(x, nb_transpose(w, 0, 1), true, "NT x @ w^T");
        check_mm(dy, w, true, "NN dy @ w");
        check_mm(nb_transpose(dy, 0, 1), x, true, "TN dy^T @ x");
        check_mm(nb_transpose(dy, 0, 1), nb_transpose(nb_transpose(x, 0, 1), 0, 1), true,
                 "TN dy^T @ (x^T)^T");
        nb_tensor *v = tu_random((int64_t[]){8, 24}, 2, NB_F32, -1, 1, 4);
        check_mm(nb_transpose(x, 0, 1), nb_transpose(v, 1, 0), true, "TT x^T @ v^T");
        nb_scope_end();
    }
    nb_set_gemm_provider(saved);
}
END_TEST

/* ---- 1-D operands ------------------------------------------------------------------------------ */

START_TEST(test_matmul_1d) {
    static const struct {
        int na, nb;
        int64_t a[4], b[4];
    } cases[] = {
        {1, 1, {5}, {5}},              /* dot -> 0-dim */
        {1, 1, {0}, {0}},              /* empty dot = 0 */
        {1, 1, {1}, {1}},
        {1, 2, {4}, {4, 3}},           /* -> (3) */
        {2, 1, {3, 4}, {4}},           /* -> (3) */
        {1, 3, {4}, {2, 4, 3}},        /* -> (2,3) */
        {3, 1, {2, 3, 4}, {4}},        /* -> (2,3), folds into one GEMM */
        {4, 1, {2, 1, 3, 4}, {4}},
        {1, 2, {0}, {0, 3}},           /* K = 0 -> zeros (3) */
        {2, 1, {0, 4}, {4}},           /* M = 0 -> (0) */
    };
    nb_gemm_provider prov[2], saved = nb_gemm_provider_current();
    int np = providers(prov);
    for (int p = 0; p < np; p++) {
        nb_set_gemm_provider(prov[p]);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (int di = 0; di < N_DTYPES; di++)
                for (int la = 0; la < 3; la++)
                    for (int lb = 0; lb < 3; lb++) {
                        nb_scope_begin();
                        nb_tensor *a = make_operand(cases[c].a, cases[c].na, k_dtypes[di], la, 5 + c);
                        nb_tensor *b = make_operand(cases[c].b, cases[c].nb, k_dtypes[di], lb, 9 + c);
                        char what[96];
                        snprintf(what, sizeof what, "1-D case %zu %s %s la=%d lb=%d", c,
                                 nb_gemm_provider_name(prov[p]), nb_dtype_name(k_dtypes[di]), la, lb);
                        check_mm(a, b,
                                 !needs_copy(cases[c].a, cases[c].na, la) &&
                                     !needs_copy(cases[c].b, cases[c].nb, lb),
                                 what);
                        nb_scope_end();
                    }
    }
    nb_set_gemm_provider(saved);
}
END_TEST

/* A dot product of 1-D tensors is 0-dim. */
START_TEST(test_matmul_dot_0dim) {
    nb_scope_begin();
    nb_tensor *a = tu_tensor((double[]){1, 2, 3}, (int64_t[]){3}, 1, NB_F32);
    nb_tensor *b = tu_tensor((double[]){4, -5, 6}, (int64_t[]){3}, 1, NB_F32);
    nb_tensor *c = nb_matmul(a, b);
    ck_assert_ptr_nonnull(c);
    ck_assert_int_eq(nb_ndim(c), 0);
    ck_assert_double_eq(nb_item_f64(c), 12.0);
    nb_scope_end();
}
END_TEST

/* ---- batched, broadcast ------------------------------------------------------------------------ */

START_TEST(test_matmul_batched) {
    static const struct {
        int na, nb;
        int64_t a[5], b[5];
    } cases[] = {
        {4, 3, {2, 1, 3, 4}, {5, 4, 6}},     /* -> (2,5,3,6) */
        {3, 2, {3, 4, 5}, {5, 2}},           /* (B,T,C) @ (C,D): one folded GEMM */
        {2, 3, {4, 5}, {3, 5, 2}},           /* matrix broadcast on the left */
        {4, 4, {2, 3, 4, 5}, {2, 3, 5, 6}},
        {4, 4, {2, 1, 4, 5}, {1, 3, 5, 6}},
        {3, 3, {1, 7, 3}, {4, 3, 2}},
        {3, 3, {3, 1, 4}, {3, 4, 1}},        /* batched outer... size-1 M/N */
        {3, 3, {0, 3, 4}, {1, 4, 2}},        /* empty batch */
        {3, 3, {2, 3, 0}, {2, 0, 4}},        /* K = 0 */
        {5, 4, {2, 1, 2, 3, 4}, {3, 1, 4, 5}},
        {3, 3, {64, 24, 24}, {64, 24, 24}},  /* many small GEMMs: parallel over batches */
    };
    nb_gemm_provider prov[2], saved = nb_gemm_provider_current();
    int np = providers(prov);
    for (int p = 0; p < np; p++) {
        nb_set_gemm_provider(prov[p]);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (int di = 0; di < N_DTYPES; di++)
                for (int la = 0; la < L_COUNT; la++)
                    for (int lb = 0; lb < L_COUNT; lb++) {
                        if ((la > L_STRIDED || lb > L_STRIDED) && di > 1) continue; /* keep it short */
                        nb_scope_begin();
                        nb_tensor *a = make_operand(cases[c].a, cases[c].na, k_dtypes[di], la, 3 + c);
                        nb_tensor *b = make_operand(cases[c].b, cases[c].nb, k_dtypes[di], lb, 7 + c);
                        char what[96];
                        snprintf(what, sizeof what, "batched case %zu %s %s a=%s b=%s", c,
                                 nb_gemm_provider_name(prov[p]), nb_dtype_name(k_dtypes[di]),
                                 k_layout_names[la], k_layout_names[lb]);
                        check_mm(a, b,
                                 !needs_copy(cases[c].a, cases[c].na, la) &&
                                     !needs_copy(cases[c].b, cases[c].nb, lb),
                                 what);
                        nb_scope_end();
                    }
    }
    nb_set_gemm_provider(saved);
}
END_TEST

/* Batch layouts that are not plain contiguous: expanded (stride 0) batch dims, a permuted
 * batch (no folding possible), an expanded inner dim (must be copied, once). */
START_TEST(test_matmul_batch_layouts) {
    nb_gemm_provider prov[2], saved = nb_gemm_provider_current();
    int np = providers(prov);
    for (int p = 0; p < np; p++) {
        nb_set_gemm_provider(prov[p]);
        for (int di = 0; di < N_DTYPES; di++) {
            nb_dtype dt = k_dtypes[di];
            nb_scope_begin();
            /* expand (1,3,4) -> (5,3,4) @ (5,4,2): batch stride 0, no copy */
            nb_tensor *a1 = nb_expand(tu_random((int64_t[]){1, 3, 4}, 3, dt, -1, 1, 1),
                                      (int64_t[]){5, 3, 4}, 3);
            check_mm(a1, tu_random((int64_t[]){5, 4, 2}, 3, dt, -1, 1, 2), true, "expanded batch");
            /* (T,B,C) storage seen as (B,T,C) @ (C,D): batch does not fold into rows */
            nb_tensor *tbc = tu_random((int64_t[]){6, 3, 5}, 3, dt, -1, 1, 3);
            check_mm(nb_transpose(tbc, 0, 1), tu_random((int64_t[]){5, 4}, 2, dt, -1, 1, 4), true,
                     "permuted batch");
            /* (B,T,C) @ W^T with W (D,C): folded GEMM with a transposed right operand */
            nb_tensor *w = tu_random((int64_t[]){4, 5}, 2, dt, -1, 1, 5);
            check_mm(tu_random((int64_t[]){3, 6, 5}, 3, dt, -1, 1, 6), nb_transpose(w, 0, 1), true,
                     "folded NT");
            /* rows expanded (stride 0, size > 1): must be copied, still right */
            nb_tensor *r = nb_expand(tu_random((int64_t[]){2, 1, 4}, 3, dt, -1, 1, 7),
                                     (int64_t[]){2, 3, 4}, 3);
            check_mm(r, tu_random((int64_t[]){4, 3}, 2, dt, -1, 1, 8), false, "expanded rows");
            /* expanded batch AND an uncopyable inner layout: the copy keeps the batch at 1 */
            nb_tensor *big = tu_random((int64_t[]){1, 6, 8}, 3, dt, -1, 1, 9);
            nb_tensor *sv = nb_slice(nb_slice(big, 1, 0, 6, 2), 2, 0, 8, 2); /* (1,3,4) */
            check_mm(nb_expand(sv, (int64_t[]){4, 3, 4}, 3),
                     tu_random((int64_t[]){4, 4, 2}, 3, dt, -1, 1, 10), false, "expanded+strided");
            nb_scope_end();
        }
    }
    nb_set_gemm_provider(saved);
}
END_TEST

/* ---- the GEMM layer itself: alpha, beta, leading dimensions, K = 0 ----------------------------- */

START_TEST(test_gemm_layer) {
    static const int64_t shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {33, 65, 17}, {5, 0, 4}};
    nb_gemm_provider prov[2], saved = nb_gemm_provider_current();
    int np = providers(prov);
    for (int p = 0; p < np; p++) {
        nb_set_gemm_provider(prov[p]);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int t = 0; t < 4; t++) {
                bool ta = t & 1, tb = t & 2;
                int64_t M = shapes[s][0], K = shapes[s][1], N = shapes[s][2];
                /* stored A: M x K (or K x M), B: K x N (or N x K), with padded rows */
                int64_t ra = ta ? K : M, ca = ta ? M : K, rb = tb ? N : K, cb = tb ? K : N;
                int64_t lda = ca + 2, ldb = cb + 1, ldc = N + 3;
                double *va = malloc(sizeof(double) * (size_t)(ra * lda + 1));
                double *vb = malloc(sizeof(double) * (size_t)(rb * ldb + 1));
                double *vc = malloc(sizeof(double) * (size_t)(M * ldc + 1));
                tu_fill_uniform(va, ra * lda, -1, 1, 1 + s);
                tu_fill_uniform(vb, rb * ldb, -1, 1, 2 + s);
                tu_fill_uniform(vc, M * ldc, -1, 1, 3 + s);
                float *fa = malloc(sizeof(float) * (size_t)(ra * lda + 1));
                float *fb = malloc(sizeof(float) * (size_t)(rb * ldb + 1));
                float *fc = malloc(sizeof(float) * (size_t)(M * ldc + 1));
                double *dc = malloc(sizeof(double) * (size_t)(M * ldc + 1));
                for (int64_t i = 0; i < ra * lda; i++) fa[i] = (float)va[i], va[i] = fa[i];
                for (int64_t i = 0; i < rb * ldb; i++) fb[i] = (float)vb[i], vb[i] = fb[i];
                for (int64_t i = 0; i < M * ldc; i++) fc[i] = (float)vc[i], vc[i] = fc[i], dc[i] = vc[i];
                ck_assert_int_eq(nb__gemm_f32(ta, tb, M, N, K, 0.7f, fa, lda, fb, ldb, 0.3f, fc, ldc), NB_OK);
                ck_assert_int_eq(nb__gemm_f64(ta, tb, M, N, K, 0.7, va, lda, vb, ldb, 0.3, dc, ldc), NB_OK);
                for (int64_t i = 0; i < M; i++)
                    for (int64_t j = 0; j < ldc; j++) {
                        double ref = vc[i * ldc + j];
                        if (j < N) {
                            double acc = 0;
                            for (int64_t k = 0; k < K; k++)
                                acc += (ta ? va[k * lda + i] : va[i * lda + k]) *
                                       (tb ? vb[j * ldb + k] : vb[k * ldb + j]);
                            ref = 0.7 * acc + 0.3 * ref;
                        }
                        /* columns past N (the padding) must be left alone */
                        ck_assert_msg(fabs(fc[i * ldc + j] - ref) <= 1e-5 * (1 + fabs(ref)),
                                      "%s f32 %lldx%lldx%lld t=%d (%lld,%lld): %g vs %g",
                                      nb_gemm_provider_name(prov[p]), (long long)M, (long long)K,
                                      (long long)N, t, (long long)i, (long long)j, fc[i * ldc + j], ref);
                        ck_assert_msg(fabs(dc[i * ldc + j] - ref) <= 1e-12 * (1 + fabs(ref)),
                                      "f64 t=%d (%lld,%lld)", t, (long long)i, (long long)j);
                    }
                free(va), free(vb), free(vc), free(fa), free(fb), free(fc), free(dc);
            }
        /* beta = 0 must not read C: NaN there does not propagate */
        float c[4] = {NAN, NAN, NAN, NAN}, a1[2] = {1, 2}, b1[2] = {3, 4};
        ck_assert_int_eq(nb__gemm_f32(false, false, 2, 2, 1, 1.0f, a1, 1, b1, 2, 0.0f, c, 2), NB_OK);
        ck_assert(c[0] == 3 && c[1] == 4 && c[2] == 6 && c[3] == 8);
        float z[2] = {NAN, NAN};
        ck_assert_int_eq(nb__gemm_f32(false, false, 1, 2, 0, 1.0f, a1, 1, b1, 2, 0.0f, z, 2), NB_OK);
        ck_assert(z[0] == 0 && z[1] == 0);
    }
    nb_set_gemm_provider(saved);
}
END_TEST

/* ---- providers ----------------------------------------------------------------------------------- */

START_TEST(test_gemm_provider_switch) {
    nb_gemm_provider saved = nb_gemm_provider_current();
    ck_assert(saved == NB_GEMM_OPENBLAS || saved == NB_GEMM_DNNL);
    ck_assert(nb_gemm_provider_available(NB_GEMM_OPENBLAS));
    ck_assert(nb_gemm_provider_available(NB_GEMM_AUTO));
    ck_assert_str_eq(nb_gemm_provider_name(NB_GEMM_OPENBLAS), "openblas");
    ck_assert_str_eq(nb_gemm_provider_name(NB_GEMM_DNNL), "dnnl");
    ck_assert_str_eq(nb_gemm_provider_name(NB_GEMM_AUTO), "auto");
    ck_assert_int_eq(nb_set_gemm_provider(NB_GEMM_OPENBLAS), NB_OK);
    ck_assert_int_eq(nb_gemm_provider_current(), NB_GEMM_OPENBLAS);
    ck_assert_int_eq(nb_set_gemm_provider(NB_GEMM_AUTO), NB_OK);
    ck_assert_int_eq(nb_gemm_provider_current(), nb_gemm_provider_available(NB_GEMM_DNNL)
                                                      ? NB_GEMM_DNNL
                                                      : NB_GEMM_OPENBLAS);
    if (!nb_gemm_provider_available(NB_GEMM_DNNL)) {
        ck_assert_int_eq(nb_set_gemm_provider(NB_GEMM_DNNL), NB_EUNSUPPORTED);
        ck_assert_ptr_nonnull(strstr(nb_last_error(), "dnnl"));
        ck_assert_int_eq(nb_gemm_provider_current(), NB_GEMM_OPENBLAS);
    }
    ck_assert_int_eq(nb_set_gemm_provider((nb_gemm_provider)42), NB_EINVAL);
    nb_clear_error();
    nb_set_gemm_provider(saved);
}
END_TEST

/* The same bits at 1, 2 and 3 threads, with every provider and on both f32 paths (the tiles
 * of provider calls, and the packed GEMM where this build has it, whichever is this
 * machine's default), for the shapes where a threaded GEMM is tempted to split the inner
 * dimension (small M and N, long K: a weight gradient) and for a square one that gets
 * tiled. */
START_TEST(test_gemm_thread_count_independent) {
    static const int64_t shapes[][3] = {{64, 64, 8192}, {256, 768, 2048}, {300, 500, 700},
                                        {1, 1000, 4096}};
    nb_gemm_provider saved = nb_gemm_provider_current(), ps[2];
    int saved_threads = nb_get_num_threads(), np = providers(ps);
    bool was_packed = nb__sgemm_set_packed(false);
    nb__sgemm_set_packed(was_packed);
    nb_generator *g = nb_generator_new(7);
    for (int pp = 0; pp < 2 * np; pp++) {
        int p = pp / 2;
        bool packed = pp % 2;
        if (packed && !nb__sgemm_packed_available()) continue;
        nb__sgemm_set_packed(packed);
        ck_assert_int_eq(nb_set_gemm_provider(ps[p]), NB_OK);
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
            int64_t M = shapes[k][0], N = shapes[k][1], K = shapes[k][2];
            nb_scope_begin();
            /* on the CPU whatever NB_TEST_DEVICE says: the bits are read through nb_data */
            nb_tensor *a = nb_randn_on(NB_CPU, (int64_t[]){K, M}, 2, NB_F32, g);
            nb_tensor *b = nb_randn_on(NB_CPU, (int64_t[]){K, N}, 2, NB_F32, g);
            float *ref = NULL;
            for (int t = 1; t <= 3; t++) {
                nb_set_num_threads(t);
                nb_tensor *c = nb_matmul(nb_transpose(a, 0, 1), b); /* A^T B, as dW = X^T dY */
                ck_assert_ptr_nonnull(c);
                const float *d = nb_data(c);
                if (!ref) {
                    ref = malloc(sizeof(float) * (size_t)(M * N));
                    memcpy(ref, d, sizeof(float) * (size_t)(M * N));
                } else if (memcmp(ref, d, sizeof(float) * (size_t)(M * N)) != 0) {
                    ck_abort_msg("%s (%s): %lldx%lldx%lld differs between 1 and %d threads",
                                 nb_gemm_provider_name(ps[p]), packed ? "packed" : "tiles",
                                 (long long)M, (long long)N, (long long)K, t);
                }
            }
            free(ref);
            nb_scope_end();
        }
    }
    nb_generator_free(g);
    nb__sgemm_set_packed(was_packed);
    nb_set_num_threads(saved_threads);
    nb_set_gemm_provider(saved);
}
END_TEST

/* ---- errors ---------------------------------------------------------------------------------------- */

START_TEST(test_matmul_errors) {
    nb_scope_begin();
    nb_tensor *x = nb_zeros((int64_t[]){32, 784}, 2, NB_F32);
    nb_tensor *w = nb_zeros((int64_t[]){512, 10}, 2, NB_F32);
    ck_assert_ptr_null(nb_matmul(x, w));
    ck_assert_int_eq(nb_last_status(), NB_ESHAPE);
    ck_assert_str_eq(nb_last_error(), "matmul: inner dimensions differ: [32,784] @ [512,10]");
    nb_clear_error();

    /* 1-D operands name their own shape */
    tu_assert_error(nb_matmul(nb_zeros((int64_t[]){3}, 1, NB_F32), nb_zeros((int64_t[]){4}, 1, NB_F32)),
                    NB_ESHAPE, "inner dimensions differ: [3] @ [4]");
    tu_assert_error(nb_matmul(nb_zeros((int64_t[]){3}, 1, NB_F32), w), NB_ESHAPE, "[3] @ [512,10]");
    /* batch dims that do not broadcast: both shapes named */
    tu_assert_error(nb_matmul(nb_zeros((int64_t[]){2, 3, 4}, 3, NB_F32),
                              nb_zeros((int64_t[]){5, 4, 6}, 3, NB_F32)),
                    NB_ESHAPE, "[2,3,4] @ [5,4,6]");
    /* 0-dim operands */
    tu_assert_error(nb_matmul(nb_scalar(2, NB_F32), w), NB_ESHAPE, "at least 1 dimension");
    tu_assert_error(nb_matmul(w, nb_scalar(2, NB_F32)), NB_ESHAPE, "at least 1 dimension");
    /* dtypes: mixed, and integer */
    tu_assert_error(nb_matmul(nb_zeros((int64_t[]){2, 3}, 2, NB_F32), nb_zeros((int64_t[]){3, 2}, 2, NB_F64)),
                    NB_EDTYPE, "f32 @ f64");
    tu_assert_error(nb_matmul(nb_zeros((int64_t[]){2, 3}, 2, NB_I32), nb_zeros((int64_t[]){3, 2}, 2, NB_I32)),
                    NB_EDTYPE, "i32");
    tu_assert_error(nb_matmul(nb_zeros((int64_t[]){2, 3}, 2, NB_BOOL), nb_zeros((int64_t[]){3, 2}, 2, NB_BOOL)),
                    NB_EDTYPE, "bool");
    /* NULL inputs: ENULL, and a pending error is kept (nested calls report the first) */
    tu_assert_error(nb_matmul(NULL, w), NB_ENULL, NULL);
    tu_assert_error(nb_matmul(x, NULL), NB_ENULL, NULL);
    ck_assert_ptr_null(nb_matmul(nb_matmul(x, w), w));
    ck_assert_int_eq(nb_last_status(), NB_ESHAPE);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "[32,784] @ [512,10]"));
    nb_clear_error();
    nb_scope_end();
}
END_TEST

/* Results do not leak: a scope around many matmuls (with copies and half conversions) gives
 * every block back. */
START_TEST(test_matmul_no_leak) {
    nb_alloc_stats before, after;
    nb_alloc_get_stats(&before);
    nb_scope_begin();
    for (int di = 0; di < N_DTYPES; di++) {
        nb_tensor *a = make_operand((int64_t[]){3, 5, 6}, 3, k_dtypes[di], L_STRIDED, 1);
        nb_tensor *b = make_operand((int64_t[]){6, 4}, 2, k_dtypes[di], L_TRANS, 2);
        ck_assert_ptr_nonnull(nb_matmul(a, b));
    }
    nb_scope_end();
    nb_alloc_get_stats(&after);
    ck_assert_int_eq(after.bytes_live, before.bytes_live);
}
END_TEST

/* ---- devices: meta, guard, mixed -------------------------------------------------------------
 * The same op runs on the CPU, on the guard device (memory the host cannot touch outside a
 * kernel: proves nb_matmul and nb_linear never dereference device data) and on meta
 * (shapes only). Operands are leaves built on each device from the same random values, in
 * the layouts the ops special-case (a transposed view, a padded row, a stride-2 view that
 * must be copied). */
#define GUARD ((nb_device){NB_DEVICE_GUARD, 0})

/* An operand of `shape` on dev in layout L_CONTIG, L_TRANS, L_STRIDED or L_PADROW, as a leaf
 * (a detached view of device storage), requiring grad if asked. Same values on every
 * device for the same seed. */
static nb_tensor *operand_on(nb_device dev, const int64_t *shape, int nd, nb_dtype dt,
                             int layout, uint64_t seed, bool grad) {
    int64_t sh[NB_MAX_DIMS];
    memcpy(sh, shape, sizeof(int64_t) * (size_t)nd);
    int last = nd - 1;
    if (layout == L_TRANS && nd >= 2) sh[last] = shape[last - 1], sh[last - 1] = shape[last];
    if (layout == L_STRIDED) {
        sh[last] *= 2;
        if (nd >= 2) sh[last - 1] *= 2;
    }
    if (layout == L_PADROW) sh[last] += 3;
    /* made on the default device, then moved (a no-op when it is dev already) */
    nb_tensor *v = nb_to_device(tu_random(sh, nd, dt, -1, 1, seed), dev);
    switch (layout) {
    case L_TRANS: v = nd >= 2 ? nb_transpose(v, last - 1, last) : v; break;
    case L_STRIDED:
        v = nb_slice(v, last, 0, sh[last], 2);
        if (nd >= 2) v = nb_slice(v, last - 1, 0, sh[last - 1], 2);
        break;
    case L_PADROW: v = nb_narrow(v, last, 1, shape[last]); break;
    default: break;
    }
    v = nb_detach(v);
    ck_assert_ptr_nonnull(v);
    if (grad) ck_assert_int_eq(nb_set_requires_grad(v, true), NB_OK);
    return v;
}

/* Whether nb_sum runs on dev (the engine sums gradients of broadcast dims with it, and the
 * linear bias gradient is one; the reduce family moves behind the kernel table separately). */
static bool sum_works(nb_device dev) {
    nb_scope_begin();
    nb_tensor *t = nb_zeros_on(dev, (int64_t[]){2, 2}, 2, NB_F32);
    bool ok = t && nb_sum(t, (int[]){0}, 1, true) != NULL;
    nb_clear_error();
    nb_scope_end();
    return ok;
}

typedef nb_tensor *(*dev_op)(nb_tensor *const *in);
static nb_tensor *op_matmul(nb_tensor *const *in) { return nb_matmul(in[0], in[1]); }
static nb_tensor *op_linear(nb_tensor *const *in) { return nb_linear(in[0], in[1], in[2]); }

typedef struct dev_case {
    int n;                     /* operands */
    int nd[3];                 /* -1: NULL operand (linear without bias) */
    int64_t shape[3][5];
    int layout[3];
    bool grad[3];
    bool sums;                 /* backward needs nb_sum (broadcast batch dims, bias) */
} dev_case;

static void assert_same_tensor(nb_tensor *got, nb_tensor *ref, nb_dtype dt, const char *what,
                               const char *which) {
    ck_assert_msg(got != NULL, "%s: %s missing on guard", what, which);
    ck_assert_msg(nb_device_equal(nb_tensor_device(got), GUARD), "%s: %s not on guard", what,
                  which);
    nb_tensor *h = nb_to_device(got, NB_CPU);
    ck_assert_msg(h != NULL, "%s: %s: %s", what, which, nb_last_error());
    ck_assert_int_eq(nb_tensor_dtype(h), nb_tensor_dtype(ref));
    double *r = tu_values(ref);
    tu_assert_close(h, r, nb_shape(ref), nb_ndim(ref), tu_tol(dt));
    free(r);
}

static void assert_same_meta(nb_tensor *got, nb_tensor *ref, const char *what,
                             const char *which) {
    ck_assert_msg(got != NULL, "%s: %s missing on meta: %s", what, which, nb_last_error());
    ck_assert_msg(nb_tensor_device(got).type == NB_DEVICE_META, "%s: %s not meta", what, which);
    ck_assert_int_eq(nb_tensor_dtype(got), nb_tensor_dtype(ref));
    ck_assert_int_eq(nb_ndim(got), nb_ndim(ref));
    for (int d = 0; d < nb_ndim(ref); d++) ck_assert_int_eq(nb_shape(got)[d], nb_shape(ref)[d]);
    ck_assert_ptr_null(nb_data(got)); /* no storage to read */
    nb_clear_error();
}

/* f on the CPU, on guard and on meta with the same operands; forward and (where an operand
 * requires grad) backward with the same random grad_output. Guard must give the CPU's
 * values, meta its shapes and dtypes. */
static void check_devices(dev_op f, const dev_case *c, nb_dtype dt, const char *what) {
    const nb_device devs[3] = {NB_CPU, GUARD, NB_META};
    const bool sums[3] = {true, sum_works(GUARD), sum_works(NB_META)};
    nb_tensor *in[3][3] = {{0}}, *out[3];
    for (int d = 0; d < 3; d++) {
        bool any_grad = false;
        for (int i = 0; i < c->n; i++) {
            if (c->nd[i] < 0) continue;
            bool g = c->grad[i] && (!c->sums || sums[d]);
            in[d][i] = operand_on(devs[d], c->shape[i], c->nd[i], dt, c->layout[i], 31 + i, g);
            any_grad |= g;
        }
        out[d] = f(in[d]);
        ck_assert_msg(out[d] != NULL, "%s on device %d: %s", what, d, nb_last_error());
        if (!any_grad) continue;
        nb_tensor *go = tu_random(nb_shape(out[0]), nb_ndim(out[0]), dt, -1, 1, 77);
        go = nb_to_device(go, devs[d]);
        nb_backward_opts o = nb_backward_defaults();
        o.grad_output = go;
        ck_assert_msg(nb_backward_ex(out[d], &o) == NB_OK, "%s backward on device %d: %s", what,
                      d, nb_last_error());
    }
    assert_same_tensor(out[1], out[0], dt, what, "output");
    assert_same_meta(out[2], out[0], what, "output");
    for (int i = 0; i < c->n; i++) {
        if (c->nd[i] < 0 || !c->grad[i]) continue;
        char which[32];
        snprintf(which, sizeof which, "grad %d", i);
        nb_tensor *ref = nb_grad(in[0][i]);
        ck_assert_msg(ref != NULL, "%s: no CPU %s", what, which);
        if (!c->sums || sums[1]) assert_same_tensor(nb_grad(in[1][i]), ref, dt, what, which);
        if (!c->sums || sums[2]) assert_same_meta(nb_grad(in[2][i]), ref, what, which);
    }
}

START_TEST(test_matmul_devices) {
    static const dev_case cases[] = {
        {2, {2, 2}, {{7, 5}, {5, 3}}, {L_CONTIG, L_CONTIG}, {true, true}, false},
        {2, {2, 2}, {{7, 5}, {5, 3}}, {L_TRANS, L_TRANS}, {true, true}, false},
        {2, {2, 2}, {{7, 5}, {5, 3}}, {L_STRIDED, L_PADROW}, {true, true}, false},
        {2, {1, 1}, {{6}, {6}}, {L_CONTIG, L_STRIDED}, {true, true}, false},      /* dot */
        {2, {1, 2}, {{4}, {4, 3}}, {L_CONTIG, L_TRANS}, {true, true}, false},
        {2, {3, 1}, {{2, 3, 4}, {4}}, {L_CONTIG, L_CONTIG}, {true, true}, false},
        {2, {3, 2}, {{3, 4, 5}, {5, 2}}, {L_CONTIG, L_TRANS}, {true, true}, false}, /* folded */
        {2, {3, 3}, {{2, 3, 4}, {2, 4, 5}}, {L_PADROW, L_STRIDED}, {true, true}, false},
        {2, {3, 3}, {{16, 8, 8}, {16, 8, 8}}, {L_CONTIG, L_TRANS}, {true, true}, false},
        {2, {2, 2}, {{4, 0}, {0, 3}}, {L_CONTIG, L_CONTIG}, {true, true}, false},   /* K = 0 */
        {2, {2, 2}, {{0, 4}, {4, 3}}, {L_CONTIG, L_CONTIG}, {true, true}, false},   /* M = 0 */
        {2, {4, 3}, {{2, 1, 3, 4}, {5, 4, 6}}, {L_CONTIG, L_TRANS}, {true, true}, true},
        {2, {2, 3}, {{4, 5}, {3, 5, 2}}, {L_CONTIG, L_CONTIG}, {true, true}, true},
    };
    static const nb_dtype dts[] = {NB_F32, NB_F64, NB_F16, NB_BF16};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++) {
            nb_scope_begin();
            char what[64];
            snprintf(what, sizeof what, "matmul case %zu %s", k, nb_dtype_name(dts[di]));
            check_devices(op_matmul, &cases[k], dts[di], what);
            nb_scope_end();
        }
}
END_TEST

START_TEST(test_linear_devices) {
    static const dev_case cases[] = {
        /* x (..., in), w (out, in), bias (out) or none */
        {3, {3, 2, -1}, {{2, 3, 5}, {4, 5}}, {L_CONTIG, L_CONTIG}, {true, true}, false},
        {3, {2, 2, -1}, {{6, 5}, {4, 5}}, {L_TRANS, L_TRANS}, {true, true}, false},
        {3, {2, 2, 1}, {{6, 5}, {4, 5}, {4}}, {L_PADROW, L_CONTIG, L_CONTIG}, {true, true, false},
         false},
        {3, {3, 2, 1}, {{2, 3, 5}, {4, 5}, {4}}, {L_STRIDED, L_STRIDED, L_STRIDED},
         {true, true, false}, false},
        {3, {1, 2, 1}, {{5}, {4, 5}, {4}}, {L_CONTIG, L_CONTIG, L_CONTIG}, {true, false, false},
         false},
        {3, {2, 2, 1}, {{3, 0}, {4, 0}, {4}}, {L_CONTIG, L_CONTIG, L_CONTIG},
         {true, true, false}, false},                                             /* in = 0 */
        {3, {2, 2, 1}, {{0, 5}, {4, 5}, {4}}, {L_CONTIG, L_CONTIG, L_CONTIG},
         {true, true, false}, false},                                             /* no rows */
        {3, {3, 2, 1}, {{2, 3, 5}, {4, 5}, {4}}, {L_CONTIG, L_TRANS, L_CONTIG},
         {true, true, true}, true},                                               /* db */
    };
    static const nb_dtype dts[] = {NB_F32, NB_F64, NB_F16, NB_BF16};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++) {
            nb_scope_begin();
            char what[64];
            snprintf(what, sizeof what, "linear case %zu %s", k, nb_dtype_name(dts[di]));
            check_devices(op_linear, &cases[k], dts[di], what);
            nb_scope_end();
        }
}
END_TEST

/* Meta at model scale: a GPT-2 sized tied head would need 1.6 GB per output; on meta it is
 * shapes only, forward and backward. */
START_TEST(test_matmul_meta_large) {
    nb_scope_begin();
    nb_tensor *x = nb_empty_on(NB_META, (int64_t[]){8, 1024, 768}, 3, NB_F32);
    nb_tensor *w = nb_empty_on(NB_META, (int64_t[]){50257, 768}, 2, NB_F32);
    ck_assert_int_eq(nb_set_requires_grad(x, true), NB_OK);
    ck_assert_int_eq(nb_set_requires_grad(w, true), NB_OK);
    nb_tensor *y = nb_linear(x, w, NULL);
    ck_assert_msg(y != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_shape(y)[2], 50257);
    nb_tensor *z = nb_matmul(x, nb_transpose(w, 0, 1));
    ck_assert_msg(z != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_shape(z)[2], 50257);
    nb_backward_opts o = nb_backward_defaults();
    o.grad_output = nb_empty_on(NB_META, nb_shape(y), 3, NB_F32);
    ck_assert_int_eq(nb_backward_ex(y, &o), NB_OK);
    ck_assert_int_eq(nb_shape(nb_grad(w))[0], 50257);
    ck_assert_int_eq(nb_tensor_device(nb_grad(x)).type, NB_DEVICE_META);
    nb_scope_end();
}
END_TEST

/* Operands on two devices: NB_EDEVICE naming the op, nothing run. */
START_TEST(test_matmul_mixed_devices) {
    nb_scope_begin();
    /* the default device against meta and against another device with storage */
    nb_device other = nb_default_device().type == NB_DEVICE_GUARD ? NB_CPU : GUARD;
    nb_tensor *c2 = nb_zeros((int64_t[]){3, 4}, 2, NB_F32);
    nb_tensor *m2 = nb_empty_on(NB_META, (int64_t[]){4, 3}, 2, NB_F32);
    nb_tensor *g2 = nb_zeros_on(other, (int64_t[]){4, 3}, 2, NB_F32);
    tu_assert_error(nb_matmul(c2, m2), NB_EDEVICE, "matmul");
    tu_assert_error(nb_matmul(m2, c2), NB_EDEVICE, "matmul");
    tu_assert_error(nb_matmul(c2, g2), NB_EDEVICE, "matmul");
    nb_tensor *wc = nb_zeros((int64_t[]){3, 4}, 2, NB_F32);
    nb_tensor *wm = nb_empty_on(NB_META, (int64_t[]){3, 4}, 2, NB_F32);
    nb_tensor *bm = nb_empty_on(NB_META, (int64_t[]){3}, 1, NB_F32);
    nb_tensor *bc = nb_zeros((int64_t[]){3}, 1, NB_F32);
    tu_assert_error(nb_linear(c2, wm, NULL), NB_EDEVICE, "linear");
    tu_assert_error(nb_linear(c2, wc, bm), NB_EDEVICE, "linear");
    tu_assert_error(nb_linear(nb_empty_on(NB_META, (int64_t[]){2, 4}, 2, NB_F32), wm, bc),
                    NB_EDEVICE, "linear");
    nb_scope_end();
}
END_TEST

/* The gemm kernel's own contract through its checked entry point: broadcast batch strides
 * (A shared), a padded C, alpha and beta, and the bias rows (every batch's C starts as the
 * bias, then accumulates with beta). */
START_TEST(test_gemm_kernel_batched_bias) {
    enum { NB_ = 3, M = 4, N = 5, K = 6, LDC = N + 2 };
    for (int f64 = 0; f64 < 2; f64++)
        for (int bias_on = 0; bias_on < 2; bias_on++) {
            double A[M * K], B[NB_ * K * N], C0[NB_ * M * LDC], bias[N];
            tu_fill_uniform(A, M * K, -1, 1, 1);
            tu_fill_uniform(B, NB_ * K * N, -1, 1, 2);
            tu_fill_uniform(C0, NB_ * M * LDC, -1, 1, 3);
            tu_fill_uniform(bias, N, -1, 1, 4);
            float Af[M * K], Bf[NB_ * K * N], Cf[NB_ * M * LDC], biasf[N];
            double Cd[NB_ * M * LDC];
            for (int i = 0; i < M * K; i++) Af[i] = (float)A[i], A[i] = Af[i];
            for (int i = 0; i < NB_ * K * N; i++) Bf[i] = (float)B[i], B[i] = Bf[i];
            for (int i = 0; i < NB_ * M * LDC; i++)
                Cf[i] = (float)C0[i], C0[i] = Cf[i], Cd[i] = C0[i];
            for (int i = 0; i < N; i++) biasf[i] = (float)bias[i], bias[i] = biasf[i];
            nb__gemm_args g = {.dtype = f64 ? NB_F64 : NB_F32, .M = M, .N = N, .K = K,
                               .alpha = 0.5, .beta = 0.25, .a = f64 ? (void *)A : (void *)Af,
                               .lda = K, .b = f64 ? (void *)B : (void *)Bf, .ldb = N,
                               .c = f64 ? (void *)Cd : (void *)Cf, .ldc = LDC,
                               .bias = bias_on ? (f64 ? (void *)bias : (void *)biasf) : NULL,
                               .batch_ndim = 1, .batch_shape = {NB_},
                               .batch_stride_a = {0}, .batch_stride_b = {K * N},
                               .batch_stride_c = {M * LDC}};
            ck_assert_int_eq(nb__run_gemm(NB_CPU, "test", &g), NB_OK);
            for (int bi = 0; bi < NB_; bi++)
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < LDC; j++) {
                        double c0 = C0[(bi * M + i) * LDC + j], ref = c0;
                        if (j < N) {
                            double acc = 0;
                            for (int k = 0; k < K; k++)
                                acc += A[i * K + k] * B[(bi * K + k) * N + j];
                            ref = 0.5 * acc + 0.25 * (bias_on ? bias[j] : c0);
                        }
                        double got = f64 ? Cd[(bi * M + i) * LDC + j] : Cf[(bi * M + i) * LDC + j];
                        ck_assert_msg(fabs(got - ref) <= 1e-5 * (1 + fabs(ref)),
                                      "f64=%d bias=%d batch %d (%d,%d): %g vs %g", f64, bias_on,
                                      bi, i, j, got, ref);
                    }
        }
    /* meta: nothing runs, even with no memory behind the pointers */
    nb__gemm_args m = {.dtype = NB_F32, .M = 2, .N = 2, .K = 2, .lda = 2, .ldb = 2, .ldc = 2};
    ck_assert_int_eq(nb__run_gemm(NB_META, "test", &m), NB_OK);
}
END_TEST

Suite *nb_suite_matmul(void) {
    Suite *s = suite_create("matmul");
    TCase *tc = tcase_create("matmul");
    tcase_add_test(tc, test_matmul_2d);
    tcase_add_test(tc, test_matmul_transpose_no_copy);
    tcase_add_test(tc, test_matmul_1d);
    tcase_add_test(tc, test_matmul_dot_0dim);
    tcase_add_test(tc, test_matmul_batched);
    tcase_add_test(tc, test_matmul_batch_layouts);
    tcase_add_test(tc, test_gemm_layer);
    tcase_add_test(tc, test_gemm_provider_switch);
    tcase_add_test(tc, test_gemm_thread_count_independent);
    nb_tests_sgemm(tc); /* test_sgemm.c */
    tcase_add_test(tc, test_matmul_errors);
    tcase_add_test(tc, test_matmul_no_leak);
    tcase_add_test(tc, test_matmul_devices);
    tcase_add_test(tc, test_linear_devices);
    tcase_add_test(tc, test_matmul_meta_large);
    tcase_add_test(tc, test_matmul_mixed_devices);
    tcase_add_test(tc, test_gemm_kernel_batched_bias);
    suite_add_tcase(s, tc);
    return s;
}
