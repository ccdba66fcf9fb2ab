/* gemm.c - the CPU GEMM provider layer: one row-major sgemm/dgemm call (cpu/gemm.h) that goes
 * to oneDNN's dnnl_sgemm or OpenBLAS's cblas_sgemm, the public provider switch of
 * nabla/runtime.h (nb_set_gemm_provider and friends), and the CPU's `gemm` kernel
 * (tensor/kernels/matmul.h: the GEMMs of nb_matmul and the linear op, with the policy of
 * running small batched GEMMs in parallel over the batch).
 *
 * Why two providers: on an AVX-512 machine OpenBLAS is pinned to its AVX2 kernels by the
 * environment, while oneDNN picks AVX-512 itself and is 1.7-2.2x faster (docs/architecture.md,
 * "Performance"). OpenBLAS is always built in (and is the only f64 GEMM), oneDNN when meson
 * found it. Every provider GEMM is cut into tiles that do not depend on the thread count, one
 * single-threaded provider call each, run on nabla's workers (see "tiles" below). An f32
 * GEMM may instead take nabla's packed GEMM (cpu/sgemm.c), the default where the provider's
 * kernels are not AVX-512 and on some AVX-512 CPUs (cpu/sgemm_path.c decides, see "the f32
 * path" below). */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/memory.h"

#include "cpu/backend.h"
#include "cpu/blas_dl.h"
#include "cpu/cpu_impl.h"
#include "cpu/gemm.h"
#include "cpu/sgemm.h"
#include "nb_config.h"
#include "tensor/trace.h"

#if NB_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

#include "cpu/dnnl_dl.h" /* oneDNN, opened on first use */
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

/* (fn: nb__blas's, loaded before any tile runs: gemm_f64, nb__sgemm_tiles) */
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
                nb__blas_loaded()->fn(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,       \
                   tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)K, alpha, a,       \
                   (int)lda, b, (int)ldb, beta, C + i0 * ldc + j0, (int)ldc);              \
            }                                                                              \
        }                                                                                  \
    }
NB__BLAS_SLABS(float, sgemm)
NB__BLAS_SLABS(double, dgemm)

/* ---- tiles ------------------------------------------------------------------------------------
 * A threaded provider call changes its sums with the thread count: oneDNN splits the inner
 * (K) dimension over threads when M and N are small, and OpenBLAS does too for some shapes,
 * so the results of training changed with the thread count. Here C is cut into tiles by a
 * rule that looks only at M, N and K, and each tile is one single-threaded provider call
 * over the whole of K, run by nb__run_tasks: the same bits at any thread count, and a thread
 * the scheduler runs late does fewer tiles instead of holding up the others. */
#define TILE_MACS ((int64_t)1 << 24) /* 16M multiply-adds: some 0.2-0.5 ms of one core */
#define MAX_TILES 16
#define TILE_ALIGN 16 /* tile edges at multiples of 16 elements (64 bytes of f32) */
/* bf16 tiles run about 3x faster than f32 ones: fewer, larger tiles (env for measuring) */
#define BF16_TILE_DIV 4

typedef enum { TILE_DNNL_F32, TILE_BLAS_F32, TILE_BLAS_F64, TILE_DNNL_BF16 } tile_kind;

static int dnnl_bf16_tile(bool ta, bool tb, int64_t m, int64_t n, int64_t K, float alpha,
                          const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb,
                          float beta, void *C, int64_t ldc, bool c_bf16, const float *bias);

typedef struct tile_job {
    tile_kind kind;
    bool ta, tb;
    int64_t M, N, K;
    double alpha, beta;
    const void *A, *B;
    void *C;
    int64_t lda, ldb, ldc;
    int64_t mb, nb, ncols; /* tile height, width, tiles per row of tiles */
    bool c_bf16;           /* TILE_DNNL_BF16: C is bf16 */
    const float *bias;     /* TILE_DNNL_BF16: NULL or N floats added to every row */
    atomic_int status;     /* the first failing dnnl_status_t, 0 (dnnl_success) if none */
} tile_job;

static void tile_task(int64_t t, void *p) {
    tile_job *j = p;
    int64_t m0 = t / j->ncols * j->mb, n0 = t % j->ncols * j->nb;
    int64_t m = j->M - m0 < j->mb ? j->M - m0 : j->mb;
    int64_t n = j->N - n0 < j->nb ? j->N - n0 : j->nb;
    /* rows m0.. of op(A), columns n0.. of op(B) */
    int64_t oa = j->ta ? m0 : m0 * j->lda, ob = j->tb ? n0 * j->ldb : n0;
    int64_t oc = m0 * j->ldc + n0;
    switch (j->kind) {
    case TILE_DNNL_F32: {
#if NB_HAVE_DNNL
        dnnl_status_t st = dnnl_sgemm(j->ta ? 'T' : 'N', j->tb ? 'T' : 'N', m, n, j->K,
                                      (float)j->alpha, (const float *)j->A + oa, j->lda,
                                      (const float *)j->B + ob, j->ldb, (float)j->beta,
                                      (float *)j->C + oc, j->ldc);
        if (st != dnnl_success) {
            int ok = dnnl_success;
            atomic_compare_exchange_strong(&j->status, &ok, (int)st);
        }
#endif
        break;
    }
    case TILE_BLAS_F32:
        blas_float(j->ta, j->tb, m, n, j->K, (float)j->alpha, (const float *)j->A + oa, j->lda,
                   (const float *)j->B + ob, j->ldb, (float)j->beta, (float *)j->C + oc, j->ldc);
        break;
    case TILE_DNNL_BF16: {
        void *c = j->c_bf16 ? (void *)((uint16_t *)j->C + oc) : (void *)((float *)j->C + oc);
        int st = dnnl_bf16_tile(j->ta, j->tb, m, n, j->K, (float)j->alpha,
                                (const uint16_t *)j->A + oa, j->lda, (const uint16_t *)j->B + ob,
                                j->ldb, (float)j->beta, c, j->ldc, j->c_bf16,
                                j->bias ? j->bias + n0 : NULL);
        if (st != 0) {
            int ok = 0;
            atomic_compare_exchange_strong(&j->status, &ok, st);
        }
        break;
    }
    case TILE_BLAS_F64:
        blas_double(j->ta, j->tb, m, n, j->K, j->alpha, (const double *)j->A + oa, j->lda,
                    (const double *)j->B + ob, j->ldb, j->beta, (double *)j->C + oc, j->ldc);
        break;
    }
}

/* Tiles: about one per TILE_MACS of work (at most MAX_TILES), halving whichever of the
 * tile's rows and columns is longer, never below TILE_ALIGN. */
static void tile_grid(int64_t M, int64_t N, int64_t K, int64_t *mb, int64_t *nb) {
    double want = (double)M * (double)N * (double)K / (double)TILE_MACS;
    int64_t mt = 1, nt = 1;
    while ((double)(mt * nt * 2) <= want && mt * nt * 2 <= MAX_TILES) {
        bool m_ok = M / (mt * 2) >= TILE_ALIGN, n_ok = N / (nt * 2) >= TILE_ALIGN;
        if (m_ok && (!n_ok || M / mt >= N / nt)) mt *= 2;
        else if (n_ok) nt *= 2;
        else break;
    }
    int64_t h = (M + mt - 1) / mt, w = (N + nt - 1) / nt;
    *mb = mt == 1 ? M : (h + TILE_ALIGN - 1) / TILE_ALIGN * TILE_ALIGN;
    *nb = nt == 1 ? N : (w + TILE_ALIGN - 1) / TILE_ALIGN * TILE_ALIGN;
}

/* Runs the GEMM as tiles; returns the first failing dnnl_status_t (only oneDNN fails here),
 * 0 if none. */
static int tiled_ex(tile_kind kind, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                    double alpha, const void *A, int64_t lda, const void *B, int64_t ldb,
                    double beta, void *C, int64_t ldc, bool c_bf16, const float *bias) {
    tile_job j = {.kind = kind, .ta = transA, .tb = transB, .M = M, .N = N, .K = K,
                  .alpha = alpha, .beta = beta, .A = A, .B = B, .C = C, .lda = lda,
                  .ldb = ldb, .ldc = ldc, .c_bf16 = c_bf16, .bias = bias, .status = 0};
    tile_grid(M, N, K, &j.mb, &j.nb);
    if (kind == TILE_DNNL_BF16) {
        /* oneDNN's fast bf16 kernels (brgemm) want dense rows: bf16 tiles span all of N and
         * cut M only, as many tiles as the grid had (rows aligned to TILE_ALIGN). */
        int64_t ntiles = ((M + j.mb - 1) / j.mb) * ((N + j.nb - 1) / j.nb) / BF16_TILE_DIV;
        if (ntiles < 1) ntiles = 1;
        int64_t h = (M + ntiles - 1) / ntiles;
        j.mb = (h + TILE_ALIGN - 1) / TILE_ALIGN * TILE_ALIGN;
        j.nb = N;
    }
    j.ncols = (N + j.nb - 1) / j.nb;
    int64_t tiles = (M + j.mb - 1) / j.mb * j.ncols;
    nb__run_tasks(tiles, nb_get_num_threads(), tile_task, &j);
    return atomic_load(&j.status);
}

static int tiled(tile_kind kind, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                 double alpha, const void *A, int64_t lda, const void *B, int64_t ldb,
                 double beta, void *C, int64_t ldc) {
    return tiled_ex(kind, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, false,
                    NULL);
}

/* ---- the f32 path ---------------------------------------------------------------------------
 * Either the tiles of single-threaded provider calls above or nabla's own packed GEMM
 * (cpu/sgemm.c: op(B) packed once for all threads, an AVX-512 or AVX2 micro-kernel). Both
 * give the same bits at any thread count, but not the same bits as each other, so the choice
 * is made once per process and never changes while it runs: NB_SGEMM=packed or
 * NB_SGEMM=tiles, or else what cpu/sgemm_path.c decides for this machine (by the CPU's
 * features, and where they do not tell, a calibration cached per CPU; NB_SGEMM=measure
 * takes the calibration on any CPU). Products the tiles
 * leave whole (under 2 tiles of work, such as attention's per-head products) always stay one
 * provider call: they gain nothing from shared packed operands. */
static atomic_int g_sgemm_packed = -1; /* -1: not decided yet */
static pthread_once_t g_sgemm_once = PTHREAD_ONCE_INIT;

static void sgemm_decide(void) {
    const char *env = getenv("NB_SGEMM");
    int v;
    if (env && !strcmp(env, "packed")) v = nb__sgemm_packed_available();
    else if (env && !strcmp(env, "tiles")) v = 0;
    else if (env && !strcmp(env, "measure")) v = nb__sgemm_measured_packed();
    else v = nb__sgemm_choose_packed();
    int expected = -1; /* nb__sgemm_set_packed may have decided meanwhile */
    atomic_compare_exchange_strong(&g_sgemm_packed, &expected, v);
}

static bool sgemm_packed(void) {
    int v = atomic_load_explicit(&g_sgemm_packed, memory_order_acquire);
    if (v >= 0) return v;
    pthread_once(&g_sgemm_once, sgemm_decide);
    return atomic_load(&g_sgemm_packed);
}

bool nb__sgemm_set_packed(bool on) {
    bool was = sgemm_packed();
    atomic_store(&g_sgemm_packed, on && nb__sgemm_packed_available());
    return was;
}

/* Tiny products (2 M N K below NB__SGEMM_TINY_FLOPS, e.g. 16 x 16 x 32) always run on the
 * packed GEMM where the build has its kernel, whatever the path and the provider, unless
 * NB_SGEMM=tiles: a provider's first call costs far more than the product (oneDNN's first
 * dnnl_sgemm generates its kernels, ~30 ms of CPU and 10 MiB with the library, which maps
 * with the three libraries it links; OpenBLAS maps with two), and a program whose only
 * products are tiny maps neither (docs/embedding.md). The packed GEMM is also the faster
 * one there (bench/bench_tiny_gemm). The rule depends on the shape alone, so every product
 * still gets the same bits at any thread count (docs/threads.md). */
static atomic_int g_tiny_ok = -1; /* -1: not decided yet */

static bool sgemm_tiny(int64_t M, int64_t N, int64_t K) {
    if (2.0 * (double)M * (double)N * (double)K >= (double)NB__SGEMM_TINY_FLOPS) return false;
    int v = atomic_load_explicit(&g_tiny_ok, memory_order_relaxed);
    if (v < 0) {
        const char *env = getenv("NB_SGEMM");
        v = nb__sgemm_packed_available() && !(env && !strcmp(env, "tiles"));
        atomic_store_explicit(&g_tiny_ok, v, memory_order_relaxed);
    }
    return v;
}

/* The f32 path in use (the detail of the "sgemm" trace span: sgemm_detail). */
const char *nb__sgemm_path(void) {
    if (sgemm_packed()) return "nabla packed";
    return nb_gemm_provider_name(nb_gemm_provider_current());
}

nb_status nb__sgemm_tiles(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                          float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                          float beta, float *C, int64_t ldc) {
#if NB_HAVE_DNNL
    if (nb_gemm_provider_current() == NB_GEMM_DNNL) {
        if (!nb__dnnl("matmul")) return nb_last_status();
        dnnl_status_t st = (dnnl_status_t)tiled(TILE_DNNL_F32, transA, transB, M, N, K, alpha,
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
    if (!nb__blas("matmul")) return nb_last_status();
    tiled(TILE_BLAS_F32, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return NB_OK;
}

static nb_status gemm_f32(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                         const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                         float *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return NB_OK;
    if (K <= 0 || alpha == 0.0f) {
        scale_c_float(M, N, beta, C, ldc);
        return NB_OK;
    }
    if (sgemm_tiny(M, N, K))
        return nb__sgemm_packed(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (sgemm_packed()) {
        int64_t mb, nb;
        tile_grid(M, N, K, &mb, &nb);
        if (mb < M || nb < N)
            return nb__sgemm_packed(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C,
                                    ldc);
    }
    return nb__sgemm_tiles(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static nb_status gemm_f64(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
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
    if (!nb__blas("matmul")) return nb_last_status();
    tiled(TILE_BLAS_F64, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return NB_OK;
}

/* ---- bf16 -------------------------------------------------------------------------------------
 * C (f32) = alpha * op(A) @ op(B) + beta * C with A and B in bf16, every product and sum in
 * f32. Native (nb_gemm_bf16_native): oneDNN's matmul primitive with bf16 source and weights
 * and an f32 destination, whose AVX512-BF16 kernels (vdpbf16ps) run several times the f32
 * rate; it runs on the same shape-only tiles as sgemm, each tile one single-threaded
 * primitive, so the bits do not depend on the thread count. Otherwise (the OpenBLAS
 * provider, which has no bf16 GEMM, or a CPU without AVX512-BF16) the products are f32:
 * where the f32 path is nabla's packed GEMM (bf16_packed below) it reads the bf16 operands
 * and widens them as it packs (a bf16 C rounded per tile), with no widened copies; else
 * the operands are widened to f32 and go through the provider's tiles. The same products,
 * at the f32 rate.
 *
 * oneDNN's C API has no bf16 gemm function, hence the primitive. Creating one costs far more
 * than running a tile, so they are cached here by tile geometry (a model has a handful of
 * shapes); each is created on a task thread, where OpenMP allows one thread, so it is a
 * single-threaded primitive. Scratchpads are the caller's (user mode), from the caching host
 * allocator, so one primitive may run on several threads at once. */
#if NB_HAVE_DNNL
typedef struct bf_key {
    int64_t m, n, K, lda, ldb, ldc;
    float alpha, beta;
    int ta, tb, c_bf16, bias;
} bf_key;

typedef struct bf_entry {
    bf_key key;
    bool used;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t src, wei, dst, bias, scratch;
    size_t scratch_bytes;
} bf_entry;

#define BF_CACHE 256 /* open addressing; when full, primitives are made per call */
static bf_entry g_bf_cache[BF_CACHE];
static pthread_mutex_t g_bf_lock = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t g_bf_engine;
static bool g_bf_engine_ok;
static pthread_once_t g_bf_once = PTHREAD_ONCE_INIT;
static void bf_engine_init(void) {
    g_bf_engine_ok = dnnl_engine_create(&g_bf_engine, dnnl_cpu, 0) == dnnl_success;
}

static uint64_t bf_hash(const bf_key *k) {
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Create the primitive of one tile geometry into e (not yet in the cache). */
static dnnl_status_t bf_create(const bf_key *k, bf_entry *e) {
    dnnl_dims_t ad = {k->m, k->K}, bd = {k->K, k->n}, cd = {k->m, k->n};
    dnnl_dims_t as = {k->ta ? 1 : k->lda, k->ta ? k->lda : 1};
    dnnl_dims_t bs = {k->tb ? 1 : k->ldb, k->tb ? k->ldb : 1};
    dnnl_dims_t cs = {k->ldc, 1};
    dnnl_status_t st;
    memset(e, 0, sizeof *e);
    e->key = *k;
    if ((st = dnnl_memory_desc_init_by_strides(&e->src, 2, ad, dnnl_bf16, as)) ||
        (st = dnnl_memory_desc_init_by_strides(&e->wei, 2, bd, dnnl_bf16, bs)) ||
        (st = dnnl_memory_desc_init_by_strides(&e->dst, 2, cd, k->c_bf16 ? dnnl_bf16 : dnnl_f32,
                                               cs)))
        return st;
    if (k->bias && (st = dnnl_memory_desc_init_by_strides(&e->bias, 2, (dnnl_dims_t){1, k->n},
                                                          dnnl_f32, (dnnl_dims_t){k->n, 1})))
        return st;
    dnnl_matmul_desc_t md;
    if ((st = dnnl_matmul_desc_init(&md, &e->src, &e->wei, k->bias ? &e->bias : NULL, &e->dst)))
        return st;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    if ((st = dnnl_primitive_attr_create(&attr))) return st;
    st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (!st && k->alpha != 1.0f) st = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &k->alpha);
    if (!st && k->beta != 0.0f) {
        st = dnnl_post_ops_create(&po);
        if (!st) st = dnnl_post_ops_append_sum(po, k->beta);
        if (!st) st = dnnl_primitive_attr_set_post_ops(attr, po);
        if (po) dnnl_post_ops_destroy(po);
    }
    if (!st) st = dnnl_primitive_desc_create(&pd, &md, attr, g_bf_engine, NULL);
    dnnl_primitive_attr_destroy(attr);
    if (st) return st;
    const dnnl_memory_desc_t *sm = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    if (sm) e->scratch = *sm, e->scratch_bytes = dnnl_memory_desc_get_size(sm);
    st = dnnl_primitive_create(&e->prim, pd);
    dnnl_primitive_desc_destroy(pd);
    return st;
}

/* The cached primitive of k (created on first use): a copy of its entry in *out. *owned
 * says the primitive is not in the cache (full) and the caller destroys it. */
static dnnl_status_t bf_lookup(const bf_key *k, bf_entry *out, bool *owned) {
    uint64_t h = bf_hash(k);
    *owned = false;
    pthread_mutex_lock(&g_bf_lock);
    for (int i = 0; i < BF_CACHE; i++) {
        bf_entry *e = &g_bf_cache[(h + (uint64_t)i) % BF_CACHE];
        if (!e->used) break;
        if (!memcmp(&e->key, k, sizeof *k)) {
            *out = *e;
            pthread_mutex_unlock(&g_bf_lock);
            return dnnl_success;
        }
    }
    pthread_mutex_unlock(&g_bf_lock);
    dnnl_status_t st = bf_create(k, out); /* outside the lock: it may take milliseconds */
    if (st) return st;
    pthread_mutex_lock(&g_bf_lock);
    *owned = true;
    for (int i = 0; i < BF_CACHE; i++) {
        bf_entry *e = &g_bf_cache[(h + (uint64_t)i) % BF_CACHE];
        if (e->used && !memcmp(&e->key, k, sizeof *k)) break; /* another thread won */
        if (!e->used) {
            *e = *out;
            e->used = true;
            *owned = false;
            break;
        }
    }
    pthread_mutex_unlock(&g_bf_lock);
    return dnnl_success;
}

static int dnnl_bf16_tile(bool ta, bool tb, int64_t m, int64_t n, int64_t K, float alpha,
                          const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb,
                          float beta, void *C, int64_t ldc, bool c_bf16, const float *bias) {
    bf_key k;
    memset(&k, 0, sizeof k); /* padding takes part in the hash and the comparison */
    k.m = m, k.n = n, k.K = K, k.lda = lda, k.ldb = ldb, k.ldc = ldc;
    k.alpha = alpha, k.beta = beta, k.ta = ta, k.tb = tb, k.c_bf16 = c_bf16, k.bias = bias != NULL;
    bf_entry e;
    bool owned;
    dnnl_status_t st = bf_lookup(&k, &e, &owned);
    if (st) return (int)st;
    dnnl_stream_t s = NULL;
    dnnl_memory_t mem[5] = {NULL, NULL, NULL, NULL, NULL};
    void *scratch = NULL;
    st = dnnl_stream_create(&s, g_bf_engine, dnnl_stream_default_flags);
    if (!st) st = dnnl_memory_create(&mem[0], &e.src, g_bf_engine, (void *)(uintptr_t)A);
    if (!st) st = dnnl_memory_create(&mem[1], &e.wei, g_bf_engine, (void *)(uintptr_t)B);
    if (!st) st = dnnl_memory_create(&mem[2], &e.dst, g_bf_engine, C);
    dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, mem[0]}, {DNNL_ARG_WEIGHTS, mem[1]},
                               {DNNL_ARG_DST, mem[2]}};
    int nargs = 3;
    if (!st && bias) {
        st = dnnl_memory_create(&mem[3], &e.bias, g_bf_engine, (void *)(uintptr_t)bias);
        args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, mem[3]};
    }
    if (!st && e.scratch_bytes > 0) {
        if (!(scratch = nb_host_alloc(e.scratch_bytes))) st = dnnl_out_of_memory;
        if (!st) st = dnnl_memory_create(&mem[4], &e.scratch, g_bf_engine, scratch);
        args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, mem[4]};
    }
    if (!st) {
        st = dnnl_primitive_execute(e.prim, s, nargs, args);
        if (!st) st = dnnl_stream_wait(s);
    }
    for (int i = 0; i < 5; i++)
        if (mem[i]) dnnl_memory_destroy(mem[i]);
    if (s) dnnl_stream_destroy(s);
    nb_host_free(scratch);
    if (owned) dnnl_primitive_destroy(e.prim);
    return (int)st;
}
#else
static int dnnl_bf16_tile(bool ta, bool tb, int64_t m, int64_t n, int64_t K, float alpha,
                          const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb,
                          float beta, void *C, int64_t ldc, bool c_bf16, const float *bias) {
    (void)c_bf16, (void)bias, (void)ta, (void)tb, (void)m, (void)n, (void)K, (void)alpha, (void)A, (void)lda, (void)B;
    (void)ldb, (void)beta, (void)C, (void)ldc;
    return -1; /* never called: nb_gemm_bf16_native() is false without oneDNN */
}
#endif

/* Without the native GEMM: bf16 products go to the packed GEMM's bf16 entry points
 * wherever an f32 product of the shape would run on the packed GEMM (the packed path, or a
 * tiny product), except that a product the packed path would give to one provider call
 * (a single tile) stays on the packed GEMM too, since the provider would need widened
 * copies. The rule depends on the shape alone (the bits at any thread count). */
static bool bf16_packed(int64_t M, int64_t N, int64_t K) {
    return nb__sgemm_packed_available() && (sgemm_packed() || sgemm_tiny(M, N, K));
}

bool nb_gemm_bf16_native(void) {
#if NB_HAVE_DNNL
    if (nb_gemm_provider_current() != NB_GEMM_DNNL) return false;
    if (!nb__dnnl_ok()) return false; /* the f32 path then says why */
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    if (((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core_bf16) !=
        (unsigned)dnnl_cpu_isa_avx512_core_bf16)
        return false;
    pthread_once(&g_bf_once, bf_engine_init);
    return g_bf_engine_ok;
#else
    return false;
#endif
}

const char *nb_gemm_bf16_path(void) {
    if (nb_gemm_bf16_native()) return "dnnl matmul bf16 (AVX512-BF16)";
    if (nb__sgemm_packed_available() && sgemm_packed()) {
        if (nb_gemm_provider_current() != NB_GEMM_DNNL)
            return "nabla packed f32 sgemm reading bf16 (the openblas provider has no bf16 "
                   "GEMM)";
        return "nabla packed f32 sgemm reading bf16 (this CPU or oneDNN build has no "
               "AVX512-BF16)";
    }
    if (nb_gemm_provider_current() != NB_GEMM_DNNL)
        return "f32 sgemm after conversion (the openblas provider has no bf16 GEMM)";
    return "f32 sgemm after conversion (this CPU or oneDNN build has no AVX512-BF16)";
}

/* Elements a (rows x cols) operand spans in memory with row stride ld. */
static int64_t span_of(int64_t rows, int64_t cols, int64_t ld) {
    return rows <= 0 || cols <= 0 ? 0 : (rows - 1) * ld + cols;
}

/* The conversions of the fallback on nabla's workers (each element on its own: the same
 * bits at any thread count): before, they ran on the calling thread alone, while the GEMM
 * between them had every thread. */
typedef struct cvt_job {
    const uint16_t *h;
    float *f;
    const float *src;
    uint16_t *dst;
    int64_t ldc, N;
} cvt_job;

static void widen_range(int64_t lo, int64_t hi, void *p) {
    const cvt_job *j = p;
    nb__bf16_to_f32_n(j->h + lo, j->f + lo, hi - lo);
}

static void widen_bf16(const uint16_t *h, float *f, int64_t n) {
    cvt_job j = {.h = h, .f = f};
    nb__parallel_range(n, nb__threads_for(n, NB__GRAIN), widen_range, &j);
}

static void round_range(int64_t lo, int64_t hi, void *p) {
    const cvt_job *j = p;
    for (int64_t i = lo; i < hi; i++) nb__f32_to_bf16_n(j->src + i * j->N, j->dst + i * j->ldc, j->N);
}

static void fill_rows_float(float *c, int64_t ldc, const float *b, int64_t M, int64_t N);

/* C (M x N bf16, row stride ldc) = tmp (M x N f32, dense) rounded. */
static void round_rows_bf16(const float *tmp, uint16_t *C, int64_t ldc, int64_t M, int64_t N) {
    cvt_job j = {.src = tmp, .dst = C, .ldc = ldc, .N = N};
    nb__parallel_range(M, nb__threads_for(M * N, NB__GRAIN), round_range, &j);
}

static nb_status gemm_bf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                           float alpha, const uint16_t *A, int64_t lda, const uint16_t *B,
                           int64_t ldb, float beta, float *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return NB_OK;
    if (K <= 0 || alpha == 0.0f) {
        scale_c_float(M, N, beta, C, ldc);
        return NB_OK;
    }
    if (nb_gemm_bf16_native()) {
        int st = tiled(TILE_DNNL_BF16, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C,
                       ldc);
        if (st == 0) return NB_OK;
#if NB_HAVE_DNNL
        if (st == dnnl_out_of_memory)
            return nb__error(NB_ENOMEM, "matmul: oneDNN ran out of memory in a bf16 matmul "
                                        "(%lld x %lld x %lld)",
                             (long long)M, (long long)K, (long long)N);
#endif
        return nb__error(NB_EINTERNAL, "matmul: oneDNN's bf16 matmul failed with status %d "
                                       "(%lld x %lld x %lld)",
                         st, (long long)M, (long long)K, (long long)N);
    }
    /* The fallback, where the f32 path is nabla's packed GEMM: it reads the bf16 operands
     * and widens them as it packs them (no widened copies). */
    if (bf16_packed(M, N, K))
        return nb__sgemm_packed_bf16(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C,
                                     ldc);
    /* Else both operands widened to f32 (their whole stored extent), then sgemm. */
    int64_t na = transA ? span_of(K, M, lda) : span_of(M, K, lda);
    int64_t nbb = transB ? span_of(N, K, ldb) : span_of(K, N, ldb);
    float *a32 = nb_host_alloc(sizeof(float) * (size_t)(na > 0 ? na : 1));
    float *b32 = a32 ? nb_host_alloc(sizeof(float) * (size_t)(nbb > 0 ? nbb : 1)) : NULL;
    if (!b32) {
        nb_host_free(a32);
        return nb__error(NB_ENOMEM, "matmul: no memory to widen a bf16 matmul's operands "
                                    "(%lld x %lld x %lld)",
                         (long long)M, (long long)K, (long long)N);
    }
    widen_bf16(A, a32, na);
    widen_bf16(B, b32, nbb);
    nb_status st = nb__gemm_f32(transA, transB, M, N, K, alpha, a32, lda, b32, ldb, beta, C, ldc);
    nb_host_free(b32);
    nb_host_free(a32);
    return st;
}

/* bf16 C = op(A) @ op(B) (+ bias in every row), rounded once from the f32 sums. */
static nb_status gemm_bf16_out(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                               const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb,
                               const float *bias, uint16_t *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return NB_OK;
    if (K > 0 && nb_gemm_bf16_native()) {
        int st = tiled_ex(TILE_DNNL_BF16, transA, transB, M, N, K, 1.0, A, lda, B, ldb, 0.0, C,
                          ldc, true, bias);
        if (st == 0) return NB_OK;
#if NB_HAVE_DNNL
        if (st == dnnl_out_of_memory)
            return nb__error(NB_ENOMEM, "matmul: oneDNN ran out of memory in a bf16 matmul "
                                        "(%lld x %lld x %lld)",
                             (long long)M, (long long)K, (long long)N);
#endif
        return nb__error(NB_EINTERNAL, "matmul: oneDNN's bf16 matmul failed with status %d "
                         "(%lld x %lld x %lld)",
                         st, (long long)M, (long long)K, (long long)N);
    }
    if (K > 0 && bf16_packed(M, N, K)) { /* f32 sums per tile, rounded as each tile ends */
        if (!NB__TRACE_ACTIVE())
            return nb__sgemm_packed_bf16_out(transA, transB, M, N, K, A, lda, B, ldb, bias, C,
                                             ldc);
        int tok = nb__span_begin("bf16gemm", "nabla packed", NB__CAT_GEMM);
        nb_status st =
            nb__sgemm_packed_bf16_out(transA, transB, M, N, K, A, lda, B, ldb, bias, C, ldc);
        NB__SPAN_END_WORK(tok, 2 * M * N * K, 2 * (M * K + K * N + M * N));
        return st;
    }
    /* f32 products into a scratch matrix, then rounded into C row by row. */
    float *tmp = nb_host_alloc(sizeof(float) * (size_t)(M * N));
    if (!tmp)
        return nb__error(NB_ENOMEM, "matmul: no memory for a bf16 matmul's f32 result "
                                    "(%lld x %lld)",
                         (long long)M, (long long)N);
    if (bias) fill_rows_float(tmp, N, bias, M, N);
    nb_status st = gemm_bf16(transA, transB, M, N, K, 1.0f, A, lda, B, ldb, bias ? 1.0f : 0.0f,
                             tmp, N);
    if (st == NB_OK) round_rows_bf16(tmp, C, ldc, M, N);
    nb_host_free(tmp);
    return st;
}

nb_status nb__gemm_bf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                        const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb,
                        float beta, float *C, int64_t ldc) {
    if (!NB__TRACE_ACTIVE())
        return gemm_bf16(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    int tok = nb__span_begin("bf16gemm",
                             nb_gemm_bf16_native()        ? "dnnl"
                             : bf16_packed(M, N, K)       ? "nabla packed"
                                                          : "f32 fallback",
                             NB__CAT_GEMM);
    nb_status st = gemm_bf16(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    NB__SPAN_END_WORK(tok, M > 0 && N > 0 ? 2 * M * N * K : 0,
                      2 * (M * K + K * N) + 4 * M * N);
    return st;
}

/* Each GEMM (all its tiles) is a span of the trace and the profiler ("sgemm", "dgemm"; the
 * provider as its detail), with 2 M N K flops and the three matrices as its bytes. */
static const char *sgemm_detail(int64_t M, int64_t N, int64_t K) {
    return M > 0 && N > 0 && K > 0 && sgemm_tiny(M, N, K) ? "nabla packed" : nb__sgemm_path();
}

#define NB__GEMM_TRACED(T, tname, impl)                                                    \
    nb_status nb__gemm_##tname(bool transA, bool transB, int64_t M, int64_t N, int64_t K,  \
                               T alpha, const T *A, int64_t lda, const T *B, int64_t ldb,   \
                               T beta, T *C, int64_t ldc) {                                \
        if (!NB__TRACE_ACTIVE())                                                           \
            return impl(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);     \
        int tok = nb__span_begin(sizeof(T) == 4 ? "sgemm" : "dgemm",                       \
                                 sizeof(T) == 4                                            \
                                     ? sgemm_detail(M, N, K)                               \
                                     : nb_gemm_provider_name(nb_gemm_provider_current()),  \
                                 NB__CAT_GEMM);                                            \
        nb_status st = impl(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc); \
        NB__SPAN_END_WORK(tok, M > 0 && N > 0 ? 2 * M * N * K : 0,                         \
                          (int64_t)sizeof(T) * (M * K + K * N + M * N));                   \
        return st;                                                                         \
    }
NB__GEMM_TRACED(float, f32, gemm_f32)
NB__GEMM_TRACED(double, f64, gemm_f64)

/* ---- the gemm kernel ------------------------------------------------------------------------
 * Per-GEMM work (multiply-adds) at or below which batches run in parallel rather than each
 * GEMM using all threads: 128x128x128. A GEMM this small parallelizes poorly inside the
 * provider (e.g. attention scores, (B*H) x T x T x head_dim). Up to MM_MID_MACS (256^3)
 * batches still go in parallel when they split evenly over the threads: measured with
 * oneDNN on 2 threads, 16 x (128x256x256) ran ~10 % faster that way, but an uneven split
 * (3 batches on 2 threads) would idle a thread for a whole GEMM. */
#define MM_SMALL_MACS ((int64_t)1 << 21)
#define MM_MID_MACS ((int64_t)1 << 24)
/* Total multiply-adds below which a batched matmul stays on one thread. */
#define MM_PAR_GRAIN ((int64_t)1 << 18)

/* Every row of the (M, N) matrix c (row stride ldc) becomes b (N elements), so that a GEMM
 * with beta = 1 adds the product onto the bias. */
typedef struct fill_job {
    void *c;
    const void *b;
    int64_t ldc, N;
} fill_job;

#define NB__FILL_ROWS(T)                                                                   \
    static void fill_range_##T(int64_t lo, int64_t hi, void *p) {                         \
        const fill_job *j = p;                                                             \
        T *c = j->c;                                                                       \
        for (int64_t i = lo; i < hi; i++)                                                  \
            memcpy(c + i * j->ldc, j->b, sizeof(T) * (size_t)j->N);                        \
    }                                                                                      \
    static void fill_rows_##T(T *c, int64_t ldc, const T *b, int64_t M, int64_t N) {       \
        fill_job j = {c, b, ldc, N};                                                       \
        nb__parallel_range(M, nb__threads_for(M * N, NB__GRAIN), fill_range_##T, &j);     \
    }
NB__FILL_ROWS(float)
NB__FILL_ROWS(double)

/* One GEMM of the batch: A, B and C offset by oa, ob, oc elements. */
static nb_status gemm_one(const nb__gemm_args *g, int64_t oa, int64_t ob, int64_t oc) {
    if (g->M <= 0 || g->N <= 0) return NB_OK;
    if (g->dtype == NB_F64) {
        const double *A = g->a ? (const double *)g->a + oa : NULL;
        const double *B = g->b ? (const double *)g->b + ob : NULL;
        double *C = (double *)g->c + oc;
        if (g->bias) fill_rows_double(C, g->ldc, g->bias, g->M, g->N);
        return nb__gemm_f64(g->trans_a, g->trans_b, g->M, g->N, g->K, g->alpha, A, g->lda, B,
                            g->ldb, g->beta, C, g->ldc);
    }
    if (g->dtype == NB_BF16 && g->c_bf16) { /* bf16 operands and C, f32 bias */
        if (g->alpha != 1.0 || g->beta != (g->bias ? 1.0 : 0.0))
            return nb__error(NB_EINTERNAL, "matmul: a bf16 C takes alpha 1 and no beta");
        const uint16_t *A = g->a ? (const uint16_t *)g->a + oa : NULL;
        const uint16_t *B = g->b ? (const uint16_t *)g->b + ob : NULL;
        return gemm_bf16_out(g->trans_a, g->trans_b, g->M, g->N, g->K, A, g->lda, B, g->ldb,
                             g->bias, (uint16_t *)g->c + oc, g->ldc);
    }
    if (g->dtype == NB_BF16) { /* bf16 operands, f32 C and bias */
        const uint16_t *A = g->a ? (const uint16_t *)g->a + oa : NULL;
        const uint16_t *B = g->b ? (const uint16_t *)g->b + ob : NULL;
        float *C = (float *)g->c + oc;
        if (g->bias) fill_rows_float(C, g->ldc, g->bias, g->M, g->N);
        return nb__gemm_bf16(g->trans_a, g->trans_b, g->M, g->N, g->K, (float)g->alpha, A,
                             g->lda, B, g->ldb, (float)g->beta, C, g->ldc);
    }
    const float *A = g->a ? (const float *)g->a + oa : NULL;
    const float *B = g->b ? (const float *)g->b + ob : NULL;
    float *C = (float *)g->c + oc;
    if (g->bias) fill_rows_float(C, g->ldc, g->bias, g->M, g->N);
    return nb__gemm_f32(g->trans_a, g->trans_b, g->M, g->N, g->K, (float)g->alpha, A, g->lda,
                        B, g->ldb, (float)g->beta, C, g->ldc);
}

/* Batch i (row-major over batch_shape): its operands' offsets from the batch strides. */
static nb_status gemm_batch(const nb__gemm_args *g, int64_t i) {
    int64_t r = i, oa = 0, ob = 0, oc = 0;
    for (int d = g->batch_ndim - 1; d >= 0; d--) {
        int64_t idx = r % g->batch_shape[d];
        r /= g->batch_shape[d];
        oa += idx * g->batch_stride_a[d];
        ob += idx * g->batch_stride_b[d];
        oc += idx * g->batch_stride_c[d];
    }
    return gemm_one(g, oa, ob, oc);
}

/* The batched GEMMs on nabla's workers, one task per batch; after a failure (the first is
 * kept: nb__task_status) the remaining tasks do nothing. */
typedef struct batch_job {
    const nb__gemm_args *g;
    nb__task_status ts;
} batch_job;

static void batch_task(int64_t i, void *ctx) {
    batch_job *j = ctx;
    if (nb__task_failed(&j->ts)) return;
    nb_status s = gemm_batch(j->g, i);
    if (s != NB_OK) nb__task_fail(&j->ts, s);
}

static nb_status cpu_gemm(const nb__gemm_args *g) {
    if (g->dtype != NB_F32 && g->dtype != NB_F64 && g->dtype != NB_BF16)
        return nb__error(NB_EDTYPE, "matmul: the CPU GEMM takes f32, f64 or bf16, got %s",
                         nb_dtype_name(g->dtype));
    int64_t nbatch = 1;
    for (int d = 0; d < g->batch_ndim; d++) nbatch *= g->batch_shape[d];
    if (nbatch <= 0) return NB_OK;
    if (nbatch == 1) return gemm_one(g, 0, 0, 0);

    /* One GEMM per batch: several threads over the batch when each GEMM is small. */
    double macs = (double)g->M * (double)g->N * (double)g->K; /* double: no overflow */
    int nt = 1;
    if (macs <= (double)MM_MID_MACS) {
        nt = nb__threads_for((int64_t)macs * nbatch, MM_PAR_GRAIN);
        if (nt > nbatch) nt = (int)nbatch;
        if (macs > (double)MM_SMALL_MACS && nbatch % nt != 0) nt = 1;
    }
    nb_status st;
    if (nt <= 1) {
        /* Not through nb__run_tasks here: its tasks run the provider on one thread, and each
         * GEMM of the batch is to use all threads. */
        for (int64_t i = 0; i < nbatch; i++)
            if ((st = gemm_batch(g, i)) != NB_OK) return st;
        return NB_OK;
    }
    batch_job j = {.g = g};
    nb__run_tasks(nbatch, nt, batch_task, &j);
    return nb__task_result(&j.ts);
}

void nb__cpu_register_matmul(nb__kernels *k) { k->gemm = cpu_gemm; }
