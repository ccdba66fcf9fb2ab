/* test_sgemm.c - the matmul suite's tests of nabla's packed sgemm (cpu/sgemm.c): against a
 * plain loop over shapes and strides, the same bits at any thread count, the cached
 * choice between it and the provider's sgemm, and its bf16 entry points (the same bits as
 * widening first; the route bf16 products take without AVX512-BF16); added to the suite's TCase by nb_tests_sgemm
 * (tests/test_matmul.c). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/cpu_impl.h"
#include "cpu/gemm.h"
#include "cpu/sgemm.h"
#include "tensor/backend.h"
#include "testutil.h"

/* ---- nabla's packed sgemm (cpu/sgemm.c) --------------------------------------------------------------
 * Against a double loop over odd shapes: 1x1x1, K = 1, primes, K beyond one K block (512) and
 * not a multiple of it, rows and columns beyond one tile and not multiples of the micro-kernel
 * (8 x 32 with AVX-512, 6 x 16 with AVX2), every transpose, padded leading dimensions,
 * beta 0 over NaN (C not read), beta 0.3 and alpha 0.7. Columns past N must stay untouched. */
static void check_packed(int64_t M, int64_t N, int64_t K, bool ta, bool tb, float alpha,
                         float beta, uint64_t seed) {
    int64_t ra = ta ? K : M, ca = ta ? M : K, rb = tb ? N : K, cb = tb ? K : N;
    int64_t lda = ca + 3, ldb = cb + 1, ldc = N + 2;
    double *va = malloc(sizeof(double) * (size_t)(ra * lda));
    double *vb = malloc(sizeof(double) * (size_t)(rb * ldb));
    double *vc = malloc(sizeof(double) * (size_t)(M * ldc));
    float *fa = malloc(sizeof(float) * (size_t)(ra * lda));
    float *fb = malloc(sizeof(float) * (size_t)(rb * ldb));
    float *fc = malloc(sizeof(float) * (size_t)(M * ldc));
    tu_fill_uniform(va, ra * lda, -1, 1, seed);
    tu_fill_uniform(vb, rb * ldb, -1, 1, seed + 1);
    tu_fill_uniform(vc, M * ldc, -1, 1, seed + 2);
    for (int64_t i = 0; i < ra * lda; i++) fa[i] = (float)va[i], va[i] = fa[i];
    for (int64_t i = 0; i < rb * ldb; i++) fb[i] = (float)vb[i], vb[i] = fb[i];
    for (int64_t i = 0; i < M * ldc; i++) {
        fc[i] = (float)vc[i], vc[i] = fc[i];
        if (beta == 0.0f && i % ldc < N) fc[i] = NAN; /* beta 0: C must not be read */
    }
    ck_assert_int_eq(nb__sgemm_packed(ta, tb, M, N, K, alpha, fa, lda, fb, ldb, beta, fc, ldc),
                     NB_OK);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < ldc; j++) {
            double ref = vc[i * ldc + j], mag = 0;
            if (j < N) {
                double acc = 0;
                for (int64_t k = 0; k < K; k++) {
                    double x = (ta ? va[k * lda + i] : va[i * lda + k]) *
                               (tb ? vb[j * ldb + k] : vb[k * ldb + j]);
                    acc += x, mag += fabs(x);
                }
                ref = alpha * acc + (beta == 0.0f ? 0.0 : beta * ref);
                mag = fabs(alpha) * mag + fabs(beta * vc[i * ldc + j]);
            }
            ck_assert_msg(fabs(fc[i * ldc + j] - ref) <= 1e-6 * (1 + mag),
                          "packed %lldx%lldx%lld ta=%d tb=%d alpha=%g beta=%g (%lld,%lld): %.9g "
                          "vs %.9g",
                          (long long)M, (long long)N, (long long)K, ta, tb, alpha, beta,
                          (long long)i, (long long)j, fc[i * ldc + j], ref);
        }
    free(va), free(vb), free(vc), free(fa), free(fb), free(fc);
}

START_TEST(test_sgemm_packed_vs_loop) {
    if (!nb__sgemm_packed_available()) return; /* built without AVX2 + FMA or AVX-512 */
    static const int64_t shapes[][3] = { /* M, N, K */
        {1, 1, 1}, {1, 1, 2000}, {33, 65, 1}, {7, 5, 13}, {17, 53, 31}, {97, 89, 101},
        {8, 48, 512}, {9, 49, 513}, {5, 7, 1500}, {200, 150, 1100}, {1, 300, 70}, {301, 1, 70}};
    int saved = nb_get_num_threads();
    nb_set_num_threads(2);
    uint64_t seed = 11;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++) {
            seed += 3;
            check_packed(shapes[s][0], shapes[s][1], shapes[s][2], t & 1, t & 2, 1.0f, 0.0f, seed);
        }
    check_packed(37, 101, 700, false, true, 0.7f, 0.3f, 99);
    check_packed(37, 101, 700, true, false, -1.5f, 0.0f, 98);
    check_packed(64, 96, 600, true, true, 1.0f, 1.0f, 97);
    nb_set_num_threads(saved);
}
END_TEST

/* The same bits at 1, 2 and 3 threads (which cut C into different tiles), under nb_matmul
 * with the packed path switched on; and the path is the one in use. */
START_TEST(test_sgemm_packed_thread_count_independent) {
    if (!nb__sgemm_packed_available() || !nb_gemm_provider_available(NB_GEMM_DNNL)) return;
    static const int64_t shapes[][3] = {{64, 64, 8192}, {300, 500, 700}, {1, 1000, 4096},
                                        {517, 263, 1031}};
    nb_gemm_provider saved = nb_gemm_provider_current();
    int saved_threads = nb_get_num_threads();
    ck_assert_int_eq(nb_set_gemm_provider(NB_GEMM_DNNL), NB_OK);
    bool was = nb__sgemm_set_packed(true);
    ck_assert_str_eq(nb__sgemm_path(), "nabla packed");
    nb_generator *g = nb_generator_new(8);
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int64_t M = shapes[k][0], N = shapes[k][1], K = shapes[k][2];
        nb_scope_begin();
        nb_tensor *a = nb_randn_on(NB_CPU, (int64_t[]){K, M}, 2, NB_F32, g);
        nb_tensor *b = nb_randn_on(NB_CPU, (int64_t[]){N, K}, 2, NB_F32, g);
        float *ref = NULL;
        for (int t = 1; t <= 3; t++) {
            nb_set_num_threads(t);
            /* A^T B^T: both operands packed from their transposed layouts */
            nb_tensor *c = nb_matmul(nb_transpose(a, 0, 1), nb_transpose(b, 0, 1));
            ck_assert_ptr_nonnull(c);
            const float *d = nb_data(c);
            if (!ref) {
                ref = malloc(sizeof(float) * (size_t)(M * N));
                memcpy(ref, d, sizeof(float) * (size_t)(M * N));
            } else {
                ck_assert_msg(memcmp(ref, d, sizeof(float) * (size_t)(M * N)) == 0,
                              "packed: %lldx%lldx%lld differs between 1 and %d threads",
                              (long long)M, (long long)N, (long long)K, t);
            }
        }
        free(ref);
        nb_scope_end();
    }
    nb_generator_free(g);
    nb__sgemm_set_packed(false);
    ck_assert_str_eq(nb__sgemm_path(), "dnnl");
    nb__sgemm_set_packed(was);
    nb_set_num_threads(saved_threads);
    nb_set_gemm_provider(saved);
}
END_TEST

/* ---- bf16 operands on the packed GEMM (a CPU without AVX512-BF16) ---------------------------
 * nb__sgemm_packed_bf16 must give the very bits of nb__sgemm_packed on the widened operands,
 * and nb__sgemm_packed_bf16_out those of the widened GEMM into an f32 C (starting as the
 * bias rows), rounded once: odd shapes (edges of the micro-kernel and of the tiles), K over
 * one K block, every transpose, padded leading dimensions; the columns past N untouched; at
 * 1, 2 and 3 threads, all against the reference taken at 1 thread. */
static uint16_t *bf16_random(int64_t n, uint64_t seed, float *widened) {
    double *v = malloc(sizeof(double) * (size_t)n);
    uint16_t *h = malloc(sizeof(uint16_t) * (size_t)n);
    tu_fill_uniform(v, n, -2, 2, seed);
    for (int64_t i = 0; i < n; i++) {
        h[i] = nb_f32_to_bf16((float)v[i]);
        widened[i] = nb_bf16_to_f32(h[i]);
    }
    free(v);
    return h;
}

static void check_packed_bf16(int64_t M, int64_t N, int64_t K, bool ta, bool tb, float alpha,
                              float beta, bool bias, uint64_t seed) {
    int64_t ra = ta ? K : M, ca = ta ? M : K, rb = tb ? N : K, cb = tb ? K : N;
    int64_t lda = ca + 3, ldb = cb + 5, ldc = N + 2, na = ra * lda, nbb = rb * ldb;
    float *fa = malloc(sizeof(float) * (size_t)na), *fb = malloc(sizeof(float) * (size_t)nbb);
    uint16_t *ha = bf16_random(na, seed, fa), *hb = bf16_random(nbb, seed + 1, fb);
    float *c0 = malloc(sizeof(float) * (size_t)(M * ldc)), *ref = malloc(sizeof(float) * (size_t)(M * ldc));
    float *c = malloc(sizeof(float) * (size_t)(M * ldc)), *bv = malloc(sizeof(float) * (size_t)N);
    uint16_t *href = malloc(sizeof(uint16_t) * (size_t)(M * ldc));
    uint16_t *hc = malloc(sizeof(uint16_t) * (size_t)(M * ldc));
    for (int64_t i = 0; i < M * ldc; i++) c0[i] = (float)((i * 37) % 101) * 0.01f - 0.5f;
    for (int64_t i = 0; i < N; i++) bv[i] = (float)(i % 13) * 0.25f - 1.5f;
    int saved = nb_get_num_threads();
    /* the references: the f32 packed GEMM of the widened operands, at 1 thread */
    nb_set_num_threads(1);
    memcpy(ref, c0, sizeof(float) * (size_t)(M * ldc));
    ck_assert_int_eq(nb__sgemm_packed(ta, tb, M, N, K, alpha, fa, lda, fb, ldb, beta, ref, ldc),
                     NB_OK);
    float *tmp = malloc(sizeof(float) * (size_t)(M * N));
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) tmp[i * N + j] = bias ? bv[j] : NAN;
    ck_assert_int_eq(nb__sgemm_packed(ta, tb, M, N, K, 1.0f, fa, lda, fb, ldb,
                                      bias ? 1.0f : 0.0f, tmp, N),
                     NB_OK);
    for (int64_t i = 0; i < M * ldc; i++) href[i] = (uint16_t)(0xA5A5u + i);
    for (int64_t i = 0; i < M; i++) nb__f32_to_bf16_n(tmp + i * N, href + i * ldc, N);
    for (int t = 1; t <= 3; t++) {
        nb_set_num_threads(t);
        memcpy(c, c0, sizeof(float) * (size_t)(M * ldc));
        if (beta == 0.0f)
            for (int64_t i = 0; i < M * ldc; i++)
                if (i % ldc < N) c[i] = NAN; /* beta 0: C must not be read */
        ck_assert_int_eq(nb__sgemm_packed_bf16(ta, tb, M, N, K, alpha, ha, lda, hb, ldb, beta, c,
                                               ldc),
                         NB_OK);
        for (int64_t i = 0; i < M * ldc; i++)
            ck_assert_msg(memcmp(&c[i], &ref[i], sizeof(float)) == 0,
                          "packed bf16 %lldx%lldx%lld ta=%d tb=%d, %d threads, [%lld]: %.9g vs "
                          "%.9g (widened f32)",
                          (long long)M, (long long)N, (long long)K, ta, tb, t, (long long)i, c[i],
                          ref[i]);
        for (int64_t i = 0; i < M * ldc; i++) hc[i] = (uint16_t)(0xA5A5u + i);
        ck_assert_int_eq(nb__sgemm_packed_bf16_out(ta, tb, M, N, K, ha, lda, hb, ldb,
                                                   bias ? bv : NULL, hc, ldc),
                         NB_OK);
        for (int64_t i = 0; i < M * ldc; i++)
            ck_assert_msg(hc[i] == href[i],
                          "packed bf16 out %lldx%lldx%lld ta=%d tb=%d bias=%d, %d threads, "
                          "[%lld]: %04x vs %04x (widened f32, rounded)",
                          (long long)M, (long long)N, (long long)K, ta, tb, bias, t, (long long)i,
                          hc[i], href[i]);
    }
    nb_set_num_threads(saved);
    free(fa), free(fb), free(ha), free(hb), free(c0), free(ref), free(c), free(bv), free(href);
    free(hc), free(tmp);
}

START_TEST(test_sgemm_packed_bf16_bits) {
    if (!nb__sgemm_packed_available()) return;
    static const int64_t shapes[][3] = { /* M, N, K */
        {1, 1, 1}, {7, 5, 13}, {6, 16, 8}, {17, 53, 31}, {97, 89, 101}, {9, 49, 513},
        {200, 150, 1100}, {301, 33, 70}, {2, 300, 40}, {64, 256, 2048}};
    uint64_t seed = 501;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++, seed += 2)
            check_packed_bf16(shapes[s][0], shapes[s][1], shapes[s][2], t & 1, t & 2, 1.0f, 0.0f,
                              (s + (size_t)t) % 2 == 0, seed);
    check_packed_bf16(37, 101, 700, false, true, 0.7f, 0.3f, true, 91);
    check_packed_bf16(37, 101, 700, true, false, -1.5f, 1.0f, false, 92);
}
END_TEST

/* Without the native bf16 GEMM, bf16 products take the packed GEMM's bf16 entry points where
 * the f32 path is the packed one: no "sgemm" span (the widened f32 GEMM) under the
 * profiler, only "bf16gemm" ones, for a bf16 C (nb_matmul under autocast's dtypes) and an
 * f32 C (nb__gemm_bf16), and the bits of the widened packed GEMM. Forced with the openblas
 * provider (never native); and on an AVX2 build whose oneDNN has no AVX512-BF16 (an AVX2
 * CPU, or ONEDNN_MAX_CPU_ISA=AVX2) by the default choice of path. */
static void check_bf16_route(void) {
    const int64_t M = 150, K = 300, N = 200;
    nb_scope_begin();
    nb_tensor *a = tu_random((int64_t[]){M, K}, 2, NB_BF16, -1, 1, 41);
    nb_tensor *b = tu_random((int64_t[]){K, N}, 2, NB_BF16, -1, 1, 42);
    float *c = malloc(sizeof(float) * (size_t)(M * N)), *ref = malloc(sizeof(float) * (size_t)(M * N));
    float *fa = malloc(sizeof(float) * (size_t)(M * K)), *fb = malloc(sizeof(float) * (size_t)(K * N));
    nb__bf16_to_f32_n(nb_data(a), fa, M * K);
    nb__bf16_to_f32_n(nb_data(b), fb, K * N);
    ck_assert_int_eq(nb_profile_start(), NB_OK);
    nb_tensor *y = nb_matmul(a, b);
    ck_assert_int_eq(nb__gemm_bf16(false, false, M, N, K, 1.0f, nb_data(a), K, nb_data(b), N,
                                   0.0f, c, N),
                     NB_OK);
    nb_profile_stop();
    ck_assert_ptr_nonnull(y);
    ck_assert_int_eq(nb_tensor_dtype(y), NB_BF16);
    nb_profile_row r;
    ck_assert_msg(!nb_profile_row_get("sgemm", NULL, &r) || r.calls == 0,
                  "bf16 products ran %lld widened f32 GEMMs (%s)",
                  (long long)(nb_profile_row_get("sgemm", NULL, &r) ? r.calls : 0),
                  nb_gemm_bf16_path());
    ck_assert(nb_profile_row_get("bf16gemm", NULL, &r) && r.calls == 2);
    ck_assert(strstr(nb_gemm_bf16_path(), "nabla packed") == nb_gemm_bf16_path());
    ck_assert_int_eq(nb__sgemm_packed(false, false, M, N, K, 1.0f, fa, K, fb, N, 0.0f, ref, N),
                     NB_OK);
    ck_assert(memcmp(c, ref, sizeof(float) * (size_t)(M * N)) == 0);
    const uint16_t *hy = nb_data(y);
    for (int64_t i = 0; i < M * N; i++) ck_assert_int_eq(hy[i], nb_f32_to_bf16(ref[i]));
    free(c), free(ref), free(fa), free(fb);
    nb_scope_end();
}

START_TEST(test_bf16_gemm_packed_route) {
    if (!nb__sgemm_packed_available()) return;
    /* the CPU's GEMM route, read on the host: CPU tensors whatever device the suite runs on */
    nb_device dev = nb_set_default_device(NB_CPU);
    nb_gemm_provider saved = nb_gemm_provider_current();
    if (!nb_gemm_bf16_native() && !strcmp(nb__sgemm_packed_isa(), "AVX2")) {
        ck_assert_str_eq(nb__sgemm_path(), "nabla packed"); /* an AVX2 build's default */
        check_bf16_route();
    }
    if (nb_gemm_provider_available(NB_GEMM_OPENBLAS)) {
        ck_assert_int_eq(nb_set_gemm_provider(NB_GEMM_OPENBLAS), NB_OK);
        bool was = nb__sgemm_set_packed(true);
        ck_assert(!nb_gemm_bf16_native());
        check_bf16_route();
        nb__sgemm_set_packed(was);
        nb_set_gemm_provider(saved);
    }
    nb_set_default_device(dev);
}
END_TEST

/* The calibration behind the default f32 path where the CPU's features do not decide
 * (cpu/sgemm_path.c): it times both paths, and its answer is cached per CPU in
 * $NB_CACHE_DIR/sgemm-path, one line, read back by later calls instead of measuring again
 * (a line changed by hand to the other answer is what they then return). */
START_TEST(test_sgemm_path_cache) {
    if (!nb__sgemm_packed_available()) return;
    double ts = -1, tp = -1;
    bool fast = nb__sgemm_calibrate(&ts, &tp);
    ck_assert(ts > 0 && tp > 0);
    ck_assert(fast == (tp * 1.03 < ts));
    char dir[] = "/tmp/nb_sgemm_cache_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char sub[128], file[160];
    snprintf(sub, sizeof sub, "%s/a/b", dir); /* made by the cache */
    snprintf(file, sizeof file, "%s/sgemm-path", sub);
    const char *old = getenv("NB_CACHE_DIR");
    char *saved = old ? strdup(old) : NULL;
    setenv("NB_CACHE_DIR", sub, 1);
    bool first = nb__sgemm_measured_packed();
    FILE *f = fopen(file, "r");
    ck_assert_ptr_nonnull(f);
    char line[512], key[512], val[32];
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
    ck_assert_ptr_null(fgets(line + 256, 256, f)); /* one line */
    fclose(f);
    ck_assert_int_eq(sscanf(line, "%511s %31s", key, val), 2);
    ck_assert_str_eq(val, first ? "packed" : "tiles");
    ck_assert(nb__sgemm_measured_packed() == first); /* from the cache: nothing written */
    f = fopen(file, "r");
    ck_assert_ptr_nonnull(f);
    int lines = 0;
    while (fgets(line, sizeof line, f)) lines++;
    fclose(f);
    ck_assert_int_eq(lines, 1);
    f = fopen(file, "a");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "%s %s\n", key, first ? "tiles" : "packed");
    fclose(f);
    ck_assert(nb__sgemm_measured_packed() == !first); /* the last line for the key wins */
    if (saved) setenv("NB_CACHE_DIR", saved, 1);
    else unsetenv("NB_CACHE_DIR");
    free(saved);
    remove(file);
    rmdir(sub);
    snprintf(sub, sizeof sub, "%s/a", dir);
    rmdir(sub);
    rmdir(dir);
}
END_TEST

void nb_tests_sgemm(TCase *tc) {
    tcase_add_test(tc, test_sgemm_packed_vs_loop);
    tcase_add_test(tc, test_sgemm_packed_thread_count_independent);
    tcase_add_test(tc, test_sgemm_path_cache);
    tcase_add_test(tc, test_sgemm_packed_bf16_bits);
    tcase_add_test(tc, test_bf16_gemm_packed_route);
}
