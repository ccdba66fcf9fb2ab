/* gemm.c - the CPU GEMM provider layer: one row-major sgemm/dgemm call (cpu/gemm.h) that goes
 * to oneDNN's dnnl_sgemm or OpenBLAS's cblas_sgemm, and the public provider switch of
 * nabla/runtime.h (nb_set_gemm_provider and friends).
 *
 * Why two providers: on the reference machine OpenBLAS is pinned to its AVX2 kernels by the
 * environment, while oneDNN picks AVX-512 itself and is 1.7-2.2x faster (DESIGN.md,
 * "Performance"). OpenBLAS is always built in (and is the only f64 GEMM), oneDNN when meson
 * found it. Both run on the one OpenMP pool (Debian's OpenMP build of OpenBLAS). */
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "cpu/backend.h"
#include "cpu/gemm.h"
#include "nb_config.h"
#include "tensor/tensor_impl.h"
#include "cpu/cpu_impl.h" /* transitional: the kernels move to kernel args */

#if NB_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

/* ---- provider selection ---------------------------------------------------------------------
 * 0 (NB_GEMM_AUTO) means "not resolved yet": the first use reads NB_GEMM. After that the value
 * is always a concrete provider. Atomic because ops on several threads read it. */
static atomic_int g_provider = NB_GEMM_AUTO;

static nb_gemm_provider default_provider(void) {
    return NB_HAVE_DNNL ? NB_GEMM_DNNL : NB_GEMM_OPENBLAS;
}

static nb_gemm_provider initial_provider(void) {
    const char *env = getenv("NB_GEMM");
    if (env) {
        if (!strcmp(env, "openblas")) return NB_GEMM_OPENBLAS;
        /* "dnnl" when oneDNN is not built in falls back to the default (OpenBLAS): an
         * environment variable must not make every matmul fail. */
        if (!strcmp(env, "dnnl") && NB_HAVE_DNNL) return NB_GEMM_DNNL;
    }
    return default_provider();
}

nb_gemm_provider nb_gemm_provider_current(void) {
    int p = atomic_load_explicit(&g_provider, memory_order_relaxed);
    if (p != NB_GEMM_AUTO) return (nb_gemm_provider)p;
    int expected = NB_GEMM_AUTO;
    int init = (int)initial_provider();
    /* If another thread resolved (or set) it meanwhile, keep theirs. */
    if (!atomic_compare_exchange_strong(&g_provider, &expected, init)) return expected;
    return (nb_gemm_provider)init;
}

bool nb_gemm_provider_available(nb_gemm_provider p) {
    switch (p) {
    case NB_GEMM_AUTO: return true;
    case NB_GEMM_OPENBLAS: return true;
    case NB_GEMM_DNNL: return NB_HAVE_DNNL;
    }
    return false;
}

const char *nb_gemm_provider_name(nb_gemm_provider p) {
    switch (p) {
    case NB_GEMM_AUTO: return "auto";
    case NB_GEMM_OPENBLAS: return "openblas";
    case NB_GEMM_DNNL: return "dnnl";
    }
    return "unknown";
}

nb_status nb_set_gemm_provider(nb_gemm_provider p) {
    if (p != NB_GEMM_AUTO && p != NB_GEMM_OPENBLAS && p != NB_GEMM_DNNL)
        return nb__error(NB_EINVAL, "set_gemm_provider: unknown provider %d", (int)p);
    if (!nb_gemm_provider_available(p))
        return nb__error(NB_EUNSUPPORTED,
                         "set_gemm_provider: %s was not built into this library "
                         "(meson did not find it)",
                         nb_gemm_provider_name(p));
    if (p == NB_GEMM_AUTO) p = default_provider();
    atomic_store(&g_provider, (int)p);
    return NB_OK;
}

/* ---- degenerate cases ------------------------------------------------------------------------
 * K == 0 (or alpha == 0): C = beta * C, where beta == 0 writes zeros without reading C, as the
 * BLAS convention says. Done here so neither provider sees a zero-sized operand (both want
 * leading dimensions >= 1, which callers of a K == 0 product cannot always give). */
#define NB__SCALE_C(T)                                                                     \
    static void scale_c_##T(int64_t M, int64_t N, T beta, T *C, int64_t ldc) {             \
        for (int64_t i = 0; i < M; i++) {                                                  \
            T *row = C + i * ldc;                                                          \
            if (beta == 0)                                                                 \
                memset(row, 0, sizeof(T) * (size_t)N);                                     \
            else if (beta != 1)                                                            \
                for (int64_t j = 0; j < N; j++) row[j] *= beta;                            \
        }                                                                                  \
    }
NB__SCALE_C(float)
NB__SCALE_C(double)

/* OpenBLAS (LP64 build) takes int sizes. M and N beyond INT_MAX are split into slabs (a
 * product that large is still one correct GEMM per slab); K or a leading dimension beyond
 * INT_MAX cannot be expressed at all. */
static bool blas_fits(int64_t K, int64_t lda, int64_t ldb, int64_t ldc) {
    return K <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX;
}

#define NB__BLAS_SLABS(T, fn)                                                              \
    static void blas_##T(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha,       \
                         const T *A, int64_t lda, const T *B, int64_t ldb, T beta, T *C,   \
                         int64_t ldc) {                                                    \
        const int64_t slab = INT_MAX;                                                      \
        for (int64_t i0 = 0; i0 < M; i0 += slab) {                                         \
            int64_t m = M - i0 < slab ? M - i0 : slab;                                     \
            const T *a = ta ? A + i0 : A + i0 * lda; /* rows of op(A) */                   \
            for (int64_t j0 = 0; j0 < N; j0 += slab) {                                     \
                int64_t n = N - j0 < slab ? N - j0 : slab;                                 \
                const T *b = tb ? B + j0 * ldb : B + j0; /* columns of op(B) */            \
                fn(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,                          \
                   tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)K, alpha, a,       \
                   (int)lda, b, (int)ldb, beta, C + i0 * ldc + j0, (int)ldc);              \
            }                                                                              \
        }                                                                                  \
    }
NB__BLAS_SLABS(float, cblas_sgemm)
NB__BLAS_SLABS(double, cblas_dgemm)

nb_status nb__gemm_f32(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                       const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                       float *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return NB_OK;
    if (K <= 0 || alpha == 0.0f) {
        scale_c_float(M, N, beta, C, ldc);
        return NB_OK;
    }
#if NB_HAVE_DNNL
    if (nb_gemm_provider_current() == NB_GEMM_DNNL) {
        dnnl_status_t st = dnnl_sgemm(transA ? 'T' : 'N', transB ? 'T' : 'N', M, N, K, alpha,
                                      A, lda, B, ldb, beta, C, ldc);
        if (st == dnnl_success) return NB_OK;
        if (st == dnnl_out_of_memory)
            return nb__error(NB_ENOMEM, "matmul: oneDNN ran out of memory in sgemm "
                                        "(%lld x %lld x %lld)",
                             (long long)M, (long long)K, (long long)N);
        return nb__error(NB_EINTERNAL, "matmul: oneDNN sgemm failed with status %d "
                                       "(%lld x %lld x %lld)",
                         (int)st, (long long)M, (long long)K, (long long)N);
    }
#endif
    if (!blas_fits(K, lda, ldb, ldc))
        return nb__error(NB_EUNSUPPORTED,
                         "matmul: inner dimension %lld (or a row stride) exceeds OpenBLAS's "
                         "32-bit limit; use the dnnl provider",
                         (long long)K);
    blas_float(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return NB_OK;
}

nb_status nb__gemm_f64(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                       double alpha, const double *A, int64_t lda, const double *B,
                       int64_t ldb, double beta, double *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return NB_OK;
    if (K <= 0 || alpha == 0.0) {
        scale_c_double(M, N, beta, C, ldc);
        return NB_OK;
    }
    if (!blas_fits(K, lda, ldb, ldc))
        return nb__error(NB_EUNSUPPORTED,
                         "matmul: inner dimension %lld (or a row stride) exceeds OpenBLAS's "
                         "32-bit limit for f64",
                         (long long)K);
    blas_double(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return NB_OK;
}

/* Filled in as the family moves behind the kernel table. */
void nb__cpu_register_matmul(nb__kernels *k) { (void)k; }
