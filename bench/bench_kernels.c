/* bench_kernels.c - kernel benchmark: nabla's matmul against the raw GEMM providers, and
 * elementwise / reduction throughput against memcpy, measured in the same run (the machine
 * is noisy, so only ratios measured side by side mean much).
 *
 * GEMM: for each training-shaped M x K x N and each layout a training step uses
 *     NT = X @ W^T (Linear forward, W stored (out, in)), NN = dY @ W (input grad),
 *     TN = dY^T @ X (weight grad),
 * nb_matmul (the transposed operand given as an nb_transpose view) vs dnnl_sgemm and
 * cblas_sgemm on the same data, and dnnl_sgemm on one thread (dnnl-1t: what one tile of the
 * tiled GEMM runs at; NB_SGEMM=packed times nabla's own GEMM instead, docs/threads.md). The
 * four are timed round-robin (one call of each per round)
 * so drift on the host hits all alike. nb_matmul allocates its output every call, as a user
 * sees it; the caching allocator hands the same block back each time, so after warm-up that is
 * a free-list pop, and its memory is as warm as the raw calls' preallocated C. The nabla time
 * includes the scope that frees the output.
 *
 * Elementwise: GB/s (bytes read + written, 1 GB = 1e9 B) of ops on a 64 MiB f32 tensor, vs a
 * memcpy of the same size split across the threads (each copies one part, like gemm_peak);
 * with the Llama family's row and pair kernels (RMSNorm over rows of 1024, rotary embeddings
 * of (128, 128, 8, 128), the SwiGLU product), forward.
 *
 * W3 GEMMs (--only=w3, or with the others): the raw provider calls of one W3 training step's
 * linear layers, back to back, as a floor for the gpt program's GEMM time.
 *
 * Peak (--only=peak, or with the others): the arithmetic ceiling of one core, from 24
 * independent chains of 512-bit f32 FMAs (32 flops each) and, where the build targets
 * AVX512-BF16, of bf16 dot products (vdpbf16ps, 64 flops each), alternated. Their ratio is
 * the most a bf16 GEMM can gain over an f32 one on this CPU (docs/mixed-precision.md).
 *
 * Usage: bench_kernels [--threads N] [--quick] [--only=gemm|elem|w3|peak]
 * Output: a human table, and lines `RESULT <kind> <case> <value> <unit> ratio=<x>`. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>
#include <omp.h>

#include "nabla/nabla.h"

#if NB_BENCH_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

static int g_quick = 0;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    if (n == 0) return NAN;
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return (n % 2) ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { /* xorshift64*, uniform in [-1, 1) */
    g_rng ^= g_rng >> 12, g_rng ^= g_rng << 25, g_rng ^= g_rng >> 27;
    uint64_t r = g_rng * 2685821657736338717ull;
    return (float)((double)(r >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

static nb_tensor *rand_tensor(const int64_t *shape, int nd) {
    nb_tensor *t = nb_empty(shape, nd, NB_F32);
    if (!t) {
        fprintf(stderr, "bench: %s\n", nb_last_error());
        exit(1);
    }
    float *p = nb_data(t);
    for (int64_t i = 0, n = nb_numel(t); i < n; i++) p[i] = frand();
    return t;
}

static void *xalloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes) != 0 || !p) {
        fprintf(stderr, "bench: allocation of %zu bytes failed\n", bytes);
        exit(1);
    }
    memset(p, 0, bytes); /* fault the pages in before timing */
    return p;
}

/* ---- timing: round-robin over up to 3 contenders --------------------------------------------- */

typedef int (*run_fn)(void *ctx); /* one call; 0 on success */

#define MAX_RUNS 400
typedef struct {
    double t[MAX_RUNS];
    int n;
    int failed;
} samples;

/* Warm up every contender (>= 2 calls and >= warm seconds each), then time rounds of one call
 * each until every contender has >= 7 samples and the rounds took >= total seconds per
 * contender. The order rotates from round to round, so no contender always runs first. Sample
 * r of every contender comes from round r, which paired_ratio uses. */
static void time_round_robin(run_fn *fns, void **ctxs, samples *out, int k) {
    double warm = g_quick ? 0.05 : 0.1, total = g_quick ? 0.3 : 1.0;
    for (int c = 0; c < k; c++) {
        out[c].n = 0, out[c].failed = 0;
        if (!fns[c]) continue;
        double t0 = now_s();
        for (int w = 0; w < 2 || now_s() - t0 < warm; w++)
            if (fns[c](ctxs[c]) != 0) {
                out[c].failed = 1;
                break;
            }
    }
    double start = now_s();
    for (int r = 0; r < MAX_RUNS && (r < 7 || now_s() - start < total * k); r++) {
        for (int j = 0; j < k; j++) {
            int c = (r + j) % k;
            if (!fns[c] || out[c].failed) continue;
            double a = now_s();
            int rc = fns[c](ctxs[c]);
            double dt = now_s() - a;
            if (rc != 0) out[c].failed = 1;
            else out[c].t[out[c].n++] = dt;
        }
    }
}

/* Median over rounds of time(den) / time(num): how fast num is relative to den, each round
 * compared with its own neighbour in time, which cancels most of the host's drift. */
static double paired_ratio(const samples *num, const samples *den) {
    if (num->failed || den->failed || num->n == 0 || num->n != den->n) return NAN;
    double r[MAX_RUNS];
    for (int i = 0; i < num->n; i++) r[i] = den->t[i] / num->t[i];
    return median(r, num->n);
}

static double median_of(const samples *s) {
    double t[MAX_RUNS];
    memcpy(t, s->t, sizeof(double) * (size_t)s->n);
    return median(t, s->n);
}

/* ---- GEMM ------------------------------------------------------------------------------------ */

typedef struct {
    const char *layout; /* "NT", "NN", "TN" */
    int ta, tb;
    int64_t M, N, K;
    nb_tensor *A, *B; /* stored operands: A (M,K) or (K,M) if ta; B (K,N) or (N,K) if tb */
    float *C;         /* preallocated output for the raw calls */
    nb_tensor *last;  /* nabla's last result, kept for the check */
} gemm_ctx;

static int run_nabla(void *p) {
    gemm_ctx *g = p;
    nb_scope_begin();
    nb_tensor *a = g->ta ? nb_transpose(g->A, 0, 1) : g->A;
    nb_tensor *b = g->tb ? nb_transpose(g->B, 0, 1) : g->B;
    nb_tensor *c = nb_matmul(a, b);
    nb_scope_end();
    return c ? 0 : -1;
}

static int run_cblas(void *p) {
    gemm_ctx *g = p;
    int lda = (int)(g->ta ? g->M : g->K), ldb = (int)(g->tb ? g->K : g->N);
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
                (int)g->M, (int)g->N, (int)g->K, 1.0f, nb_data(g->A), lda, nb_data(g->B), ldb,
                0.0f, g->C, (int)g->N);
    return 0;
}

#if NB_BENCH_DNNL
static int run_dnnl(void *p) {
    gemm_ctx *g = p;
    dnnl_dim_t lda = g->ta ? g->M : g->K, ldb = g->tb ? g->K : g->N;
    return dnnl_sgemm(g->ta ? 'T' : 'N', g->tb ? 'T' : 'N', g->M, g->N, g->K, 1.0f,
                      nb_data(g->A), lda, nb_data(g->B), ldb, 0.0f, g->C, g->N) == dnnl_success
               ? 0
               : -1;
}

/* dnnl_sgemm on one thread: the rate one tile's call of the tiled GEMM (cpu/gemm.c) starts
 * from, and the bar for nabla's packed GEMM at --threads 1. */
static int run_dnnl1(void *p) {
    int n = omp_get_max_threads();
    omp_set_num_threads(1);
    int rc = run_dnnl(p);
    omp_set_num_threads(n);
    return rc;
}
#endif

/* Max relative error of nabla's result at 32 random entries vs a double dot product; *same
 * says whether it is bitwise equal to the raw call `raw` (which writes g->C), i.e. whether
 * nb_matmul made the very same provider call. */
static double check_nabla(gemm_ctx *g, run_fn raw, bool *same) {
    nb_tensor *a = g->ta ? nb_transpose(g->A, 0, 1) : g->A;
    nb_tensor *b = g->tb ? nb_transpose(g->B, 0, 1) : g->B;
    nb_tensor *c = nb_matmul(a, b);
    if (g->ta) nb_tensor_free(a);
    if (g->tb) nb_tensor_free(b);
    if (!c) return INFINITY;
    const float *A = nb_data(g->A), *B = nb_data(g->B), *C = nb_data(c);
    *same = raw && raw(g) == 0 &&
            memcmp(C, g->C, sizeof(float) * (size_t)(g->M * g->N)) == 0;
    double worst = 0;
    for (int s = 0; s < 32; s++) {
        int64_t i = (int64_t)((frand() + 1) * 0.5 * (double)g->M) % g->M;
        int64_t j = (int64_t)((frand() + 1) * 0.5 * (double)g->N) % g->N;
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < g->K; k++) {
            double x = g->ta ? A[k * g->M + i] : A[i * g->K + k];
            double y = g->tb ? B[j * g->K + k] : B[k * g->N + j];
            ref += x * y, mag += fabs(x * y);
        }
        double err = fabs(C[i * g->N + j] - ref) / (mag > 0 ? mag : 1);
        if (err > worst) worst = err;
    }
    nb_tensor_free(c);
    return worst;
}

static void bench_gemm(void) {
    static const struct { int64_t M, K, N; } shapes[] = {
        {256, 784, 1024}, {256, 1024, 1024}, {4096, 384, 1536}, {2048, 256, 768},
        {1024, 1024, 1024}, {2048, 2048, 2048},
    };
    static const struct { const char *name; int ta, tb; } layouts[] = {
        {"NT", 0, 1}, {"NN", 0, 0}, {"TN", 1, 0},
    };
    nb_gemm_provider prov = nb_gemm_provider_current();
    printf("\n== GEMM: nb_matmul vs raw sgemm (GFLOP/s, median; ratio = nabla / raw %s) ==\n",
           nb_gemm_provider_name(prov));
    printf("%-22s %-3s %9s %9s %9s %9s %8s  %s\n", "case (MxKxN)", "lay", "nabla", "dnnl",
           "openblas", "dnnl-1t", "ratio", "check");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; l++) {
            gemm_ctx g = {.layout = layouts[l].name, .ta = layouts[l].ta, .tb = layouts[l].tb,
                          .M = shapes[s].M, .N = shapes[s].N, .K = shapes[s].K};
            int64_t ash[2] = {g.ta ? g.K : g.M, g.ta ? g.M : g.K};
            int64_t bsh[2] = {g.tb ? g.N : g.K, g.tb ? g.K : g.N};
            g.A = rand_tensor(ash, 2);
            g.B = rand_tensor(bsh, 2);
            g.C = xalloc(sizeof(float) * (size_t)(g.M * g.N));
            run_fn fns[4] = {run_nabla, NULL, run_cblas, NULL};
#if NB_BENCH_DNNL
            fns[1] = run_dnnl;
            fns[3] = run_dnnl1;
#endif
            void *ctxs[4] = {&g, &g, &g, &g};
            samples res[4];
            time_round_robin(fns, ctxs, res, 4);
            double flop = 2.0 * (double)g.M * (double)g.N * (double)g.K, gf[4], ratio[4];
            for (int c = 0; c < 4; c++)
                gf[c] = (fns[c] && !res[c].failed) ? flop / median_of(&res[c]) * 1e-9 : NAN;
            int inuse = prov == NB_GEMM_DNNL ? 1 : 2;
            for (int c = 0; c < 4; c++) ratio[c] = fns[c] ? paired_ratio(&res[c], &res[inuse]) : NAN;
            bool same = false;
            double err = check_nabla(&g, fns[inuse], &same);
            const char *ok = err < 1e-4 ? "ok" : "FAIL";
            char name[64];
            snprintf(name, sizeof name, "M%lld_K%lld_N%lld", (long long)g.M, (long long)g.K,
                     (long long)g.N);
            printf("%-22s %-3s %9.1f %9.1f %9.1f %9.1f %8.3f  %s (maxrel %.1e, %s raw bits, runs "
                   "%d)\n",
                   name, g.layout, gf[0], gf[1], gf[2], gf[3], ratio[0], ok, err,
                   same ? "same" : "NOT the", res[0].n);
            if (res[0].failed) printf("  nb_matmul failed: %s\n", nb_last_error());
            printf("RESULT matmul %s_%s %.2f GFLOP/s ratio=%.3f\n", name, g.layout, gf[0], ratio[0]);
            if (fns[1])
                printf("RESULT dnnl_sgemm %s_%s %.2f GFLOP/s ratio=%.3f\n", name, g.layout, gf[1],
                       ratio[1]);
            printf("RESULT cblas_sgemm %s_%s %.2f GFLOP/s ratio=%.3f\n", name, g.layout, gf[2],
                   ratio[2]);
            if (fns[3])
                printf("RESULT dnnl_sgemm_1t %s_%s %.2f GFLOP/s ratio=%.3f\n", name, g.layout,
                       gf[3], ratio[3]);
            fflush(stdout);
            nb_tensor_free(g.A);
            nb_tensor_free(g.B);
            free(g.C);
        }
    }
}

/* ---- the GEMMs of one W3 training step ------------------------------------------------------------
 * The raw provider calls a W3 step (4 layers, width 256, 16 x 128 tokens) makes in its linear
 * layers, forward (NT) and backward (NN input grad, TN weight grad), timed back to back as one
 * sequence: a floor for the step's GEMM time and the raw GEMM rate on its shapes, to set next to
 * the gpt program's achieved GFLOP/s. (The attention's small per-head GEMMs and the elementwise
 * work are not in it.) */
typedef struct {
    int64_t M, K, N;
    int ta, tb;
} w3_gemm;

typedef struct {
    w3_gemm g[64];
    int n;
    float *A, *B, *C;
    nb_gemm_provider prov;
} w3_ctx;

static void w3_add_linear(w3_ctx *w, int64_t rows, int64_t in, int64_t out) {
    w->g[w->n++] = (w3_gemm){rows, in, out, 0, 1}; /* y = x W^T */
    w->g[w->n++] = (w3_gemm){rows, out, in, 0, 0}; /* dx = dy W */
    w->g[w->n++] = (w3_gemm){out, rows, in, 1, 0}; /* dW = dy^T x */
}

static int run_w3(void *p) {
    w3_ctx *w = p;
    for (int i = 0; i < w->n; i++) {
        const w3_gemm *g = &w->g[i];
        int64_t lda = g->ta ? g->M : g->K, ldb = g->tb ? g->K : g->N;
#if NB_BENCH_DNNL
        if (w->prov == NB_GEMM_DNNL) {
            if (dnnl_sgemm(g->ta ? 'T' : 'N', g->tb ? 'T' : 'N', g->M, g->N, g->K, 1.0f, w->A,
                           lda, w->B, ldb, 0.0f, w->C, g->N) != dnnl_success)
                return -1;
            continue;
        }
#endif
        cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans,
                    g->tb ? CblasTrans : CblasNoTrans, (int)g->M, (int)g->N, (int)g->K, 1.0f,
                    w->A, (int)lda, w->B, (int)ldb, 0.0f, w->C, (int)g->N);
    }
    return 0;
}

static void bench_w3(void) {
    enum { L = 4, C = 256, V = 256, ROWS = 16 * 128 };
    static w3_ctx w;
    w.n = 0;
    w.prov = nb_gemm_provider_current();
    for (int l = 0; l < L; l++) {
        w3_add_linear(&w, ROWS, C, 3 * C); /* attn.c_attn */
        w3_add_linear(&w, ROWS, C, C);     /* attn.c_proj */
        w3_add_linear(&w, ROWS, C, 4 * C); /* mlp.c_fc */
        w3_add_linear(&w, ROWS, 4 * C, C); /* mlp.c_proj */
    }
    w3_add_linear(&w, ROWS, C, V); /* the head (its weight gradient goes to the tied wte) */
    double flop = 0;
    for (int i = 0; i < w.n; i++) flop += 2.0 * (double)w.g[i].M * (double)w.g[i].K * (double)w.g[i].N;
    size_t big = (size_t)ROWS * 4 * C;
    w.A = xalloc(sizeof(float) * big);
    w.B = xalloc(sizeof(float) * big);
    w.C = xalloc(sizeof(float) * big);
    for (size_t i = 0; i < big; i++) w.A[i] = frand(), w.B[i] = frand();
    run_fn fns[1] = {run_w3};
    void *ctxs[1] = {&w};
    samples res[1];
    time_round_robin(fns, ctxs, res, 1);
    double t = median_of(&res[0]);
    printf("\n== the linear-layer GEMMs of one W3 step (%d raw %s calls, %.2f GFLOP) ==\n", w.n,
           nb_gemm_provider_name(w.prov), flop * 1e-9);
    printf("median %.2f ms: %.1f GFLOP/s (runs %d)\n", t * 1e3, flop / t * 1e-9, res[0].n);
    printf("RESULT w3_gemms %.3f ms %.2f GFLOP/s\n", t * 1e3, flop / t * 1e-9);
    fflush(stdout);
    free(w.A);
    free(w.B);
    free(w.C);
}

/* ---- elementwise and reductions ---------------------------------------------------------------- */

typedef struct {
    const char *name;
    double bytes; /* read + written per call */
    nb_tensor *a, *b;
    int which;
} elem_ctx;

enum { E_ADD, E_MUL_SCALAR, E_EXP, E_RELU, E_SUM, E_SUM_LAST, E_SOFTMAX, E_RMS_NORM, E_ROTARY,
       E_SWIGLU };

static int run_elem(void *p) {
    elem_ctx *e = p;
    nb_scope_begin();
    nb_tensor *r = NULL;
    switch (e->which) {
    case E_ADD: r = nb_add(e->a, e->b); break;
    case E_MUL_SCALAR: r = nb_mul_scalar(e->a, 1.5); break;
    case E_EXP: r = nb_exp(e->a); break;
    case E_RELU: r = nb_relu(e->a); break;
    case E_SUM: r = nb_sum(e->a, NULL, 0, false); break;
    case E_SUM_LAST: r = nb_sum(e->a, (int[]){-1}, 1, false); break;
    case E_SOFTMAX: r = nb_softmax(e->a, -1); break;
    case E_RMS_NORM: /* rows of the last dim, the weight: the second tensor's first row */
        r = nb_rms_norm(e->a, nb_select(e->b, 0, 0), 1e-5);
        break;
    case E_ROTARY: /* (B 128, T 128, H 8, D 128) */
        r = nb_rotary_embedding(nb_view(e->a, (int64_t[]){128, 128, 8, 128}, 4), 0, 1e4);
        break;
    case E_SWIGLU: r = nb_swiglu(e->a, e->b); break;
    }
    nb_scope_end();
    return r ? 0 : -1;
}

typedef struct {
    char *src, *dst;
    size_t bytes;
    int threads;
} copy_ctx;

static int run_memcpy(void *p) {
    copy_ctx *c = p;
#pragma omp parallel num_threads(c->threads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        size_t chunk = c->bytes / (size_t)nt / 64 * 64, off = chunk * (size_t)t;
        size_t len = t == nt - 1 ? c->bytes - off : chunk;
        memcpy(c->dst + off, c->src + off, len);
    }
    return 0;
}

static void bench_elem(int threads) {
    const int64_t rows = 16384, cols = 1024, n = rows * cols; /* 16M f32 = 64 MiB */
    const double fb = 4.0 * (double)n;
    printf("\n== elementwise / reductions: f32 [%lld,%lld] (64 MiB), GB/s read+write, median; "
           "ratio = op / memcpy ==\n",
           (long long)rows, (long long)cols);
    printf("%-18s %10s %8s  %s\n", "op", "GB/s", "ratio", "bytes counted");

    copy_ctx cc = {xalloc((size_t)fb), xalloc((size_t)fb), (size_t)fb, threads};
    run_fn mf[1] = {run_memcpy};
    void *mc[1] = {&cc};
    samples ms;
    time_round_robin(mf, mc, &ms, 1);
    double mem_gbs = 2.0 * fb / median_of(&ms) * 1e-9;
    printf("%-18s %10.2f %8.3f  %s\n", "memcpy", mem_gbs, 1.0, "2 x 64 MiB");
    printf("RESULT memcpy 64MiB %.2f GB/s ratio=1.000\n", mem_gbs);
    fflush(stdout);

    nb_tensor *a = rand_tensor((int64_t[]){rows, cols}, 2);
    nb_tensor *b = rand_tensor((int64_t[]){rows, cols}, 2);
    elem_ctx ops[] = {
        {"add", 3 * fb, a, b, E_ADD},           {"mul_scalar", 2 * fb, a, b, E_MUL_SCALAR},
        {"exp", 2 * fb, a, b, E_EXP},           {"relu", 2 * fb, a, b, E_RELU},
        {"sum_all", fb, a, b, E_SUM},           {"sum_lastdim", fb + fb / cols, a, b, E_SUM_LAST},
        {"softmax_lastdim", 2 * fb, a, b, E_SOFTMAX},
        {"rms_norm_lastdim", 2 * fb, a, b, E_RMS_NORM}, {"rotary", 2 * fb, a, b, E_ROTARY},
        {"swiglu", 3 * fb, a, b, E_SWIGLU},
    };
    const char *counted[] = {"2 in + 1 out", "1 in + 1 out", "1 in + 1 out", "1 in + 1 out",
                             "1 in", "1 in + rows out", "1 in + 1 out", "1 in + 1 out",
                             "1 in + 1 out", "2 in + 1 out"};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        nb_clear_error();
        /* Each op is timed round-robin with memcpy and compared round by round. */
        run_fn f[2] = {run_elem, run_memcpy};
        void *c[2] = {&ops[i], &cc};
        samples s[2];
        time_round_robin(f, c, s, 2);
        if (s[0].failed || s[0].n == 0) {
            printf("%-18s %10s %8s  error: %s\n", ops[i].name, "-", "-", nb_last_error());
            printf("RESULT elem %s nan GB/s ratio=nan\n", ops[i].name);
        } else {
            double gbs = ops[i].bytes / median_of(&s[0]) * 1e-9;
            /* ratio of bandwidths = (bytes_op / t_op) / (bytes_copy / t_copy) */
            double ratio = paired_ratio(&s[0], &s[1]) * ops[i].bytes / (2.0 * fb);
            printf("%-18s %10.2f %8.3f  %s\n", ops[i].name, gbs, ratio, counted[i]);
            printf("RESULT elem %s %.2f GB/s ratio=%.3f\n", ops[i].name, gbs, ratio);
        }
        fflush(stdout);
    }
    free(cc.src);
    free(cc.dst);
    nb_tensor_free(a);
    nb_tensor_free(b);
}

/* ---- the arithmetic ceiling of one core ------------------------------------------------------- */
#if defined(__AVX512F__)
#include <immintrin.h>
#define PEAK_CHAINS 24
#define PEAK_ITERS 4000000L
#define PEAK_REP(X)                                                                        \
    X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)  \
        X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23)

/* GFLOP/s of PEAK_CHAINS independent FMA chains; the sum keeps them live. */
static double peak_fma(float *sink) {
    __m512 c[PEAK_CHAINS];
    for (int i = 0; i < PEAK_CHAINS; i++) c[i] = _mm512_setzero_ps();
    const __m512 a = _mm512_set1_ps(1.0001f), b = _mm512_set1_ps(0.9999f);
    double t0 = now_s();
    for (long it = 0; it < PEAK_ITERS; it++) {
#define PEAK_FMA(k) c[k] = _mm512_fmadd_ps(a, b, c[k]);
        PEAK_REP(PEAK_FMA)
#undef PEAK_FMA
    }
    double t = now_s() - t0;
    for (int i = 0; i < PEAK_CHAINS; i++) *sink += _mm512_reduce_add_ps(c[i]);
    return (double)PEAK_ITERS * PEAK_CHAINS * 32 / t * 1e-9;
}

#if defined(__AVX512BF16__)
static double peak_bf16(float *sink) {
    __m512 c[PEAK_CHAINS];
    for (int i = 0; i < PEAK_CHAINS; i++) c[i] = _mm512_setzero_ps();
    const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80); /* pairs of 1.0 */
    const __m512bh b = (__m512bh)_mm512_set1_epi32(0x3c003c00); /* pairs of 2^-7 */
    double t0 = now_s();
    for (long it = 0; it < PEAK_ITERS; it++) {
#define PEAK_DP(k) c[k] = _mm512_dpbf16_ps(c[k], a, b);
        PEAK_REP(PEAK_DP)
#undef PEAK_DP
    }
    double t = now_s() - t0;
    for (int i = 0; i < PEAK_CHAINS; i++) *sink += _mm512_reduce_add_ps(c[i]);
    return (double)PEAK_ITERS * PEAK_CHAINS * 64 / t * 1e-9;
}
#endif

static void bench_peak(void) {
    enum { RUNS = 7 };
    double f[RUNS], h[RUNS], r[RUNS];
    float sink = 0;
    int nh = 0;
    for (int i = 0; i < RUNS; i++) {
        f[i] = peak_fma(&sink);
#if defined(__AVX512BF16__)
        h[nh] = peak_bf16(&sink);
        r[nh] = h[nh] / f[i];
        nh++;
#endif
    }
    printf("\n== one core's arithmetic ceiling (median of %d alternated runs) ==\n", RUNS);
    double mf = median(f, RUNS);
    printf("f32 FMA (512-bit)      %8.1f GFLOP/s\n", mf);
    printf("RESULT peak f32_fma %.1f GFLOP/s\n", mf);
    if (nh) {
        double mh = median(h, nh), mr = median(r, nh);
        printf("bf16 vdpbf16ps         %8.1f GFLOP/s  (%.2fx the f32 FMA rate)\n", mh, mr);
        printf("RESULT peak bf16_dp %.1f GFLOP/s ratio=%.3f\n", mh, mr);
    } else {
        printf("bf16 vdpbf16ps         not in this build (no AVX512-BF16 target)\n");
    }
    if (sink == 12345.0f) printf("(sink)\n"); /* keeps the chains from being optimized out */
    fflush(stdout);
}
#else
static void bench_peak(void) {
    printf("\n== one core's arithmetic ceiling: not measured (the build has no AVX-512) ==\n");
}
#endif

static void usage(const char *argv0) {
    fprintf(stderr, "usage: %s [--threads N] [--quick] [--only=gemm|elem|w3|peak]\n", argv0);
    exit(2);
}

int main(int argc, char **argv) {
    int threads = 2, do_gemm = 1, do_elem = 1, do_w3 = 1, do_peak = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) g_quick = 1;
        else if (!strcmp(argv[i], "--only=gemm")) do_elem = do_w3 = do_peak = 0;
        else if (!strcmp(argv[i], "--only=elem")) do_gemm = do_w3 = do_peak = 0;
        else if (!strcmp(argv[i], "--only=w3")) do_gemm = do_elem = do_peak = 0;
        else if (!strcmp(argv[i], "--only=peak")) do_gemm = do_elem = do_w3 = 0;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strncmp(argv[i], "--threads=", 10)) threads = atoi(argv[i] + 10);
        else usage(argv[0]);
    }
    if (threads <= 0) usage(argv[0]);
    nb_set_num_threads(threads);

    const char *env[] = {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS",
                         "OMP_WAIT_POLICY", "NB_GEMM", "NB_SGEMM"};
    printf("nabla %s, threads %d (pool %d), gemm provider %s\n", nb_version(), threads,
           nb_get_num_threads(), nb_gemm_provider_name(nb_gemm_provider_current()));
    printf("OpenBLAS core %s", openblas_get_corename());
#if NB_BENCH_DNNL
    const dnnl_version_t *v = dnnl_version();
    printf(", oneDNN %d.%d.%d", v->major, v->minor, v->patch);
#else
    printf(", oneDNN not built in");
#endif
    printf("\nenv:");
    for (size_t i = 0; i < sizeof env / sizeof env[0]; i++)
        printf(" %s=%s", env[i], getenv(env[i]) ? getenv(env[i]) : "(unset)");
    printf("\n%s\n", g_quick ? "mode: --quick (>= 7 runs, >= 0.3 s per contender)"
                             : "mode: full (>= 7 runs, >= 1 s per contender)");
    printf("RESULT info provider %s\n", nb_gemm_provider_name(nb_gemm_provider_current()));
    printf("RESULT info threads %d\n", threads);
    fflush(stdout);

    if (do_gemm) bench_gemm();
    if (do_w3) bench_w3();
    if (do_elem) bench_elem(threads);
    if (do_peak) bench_peak();
    return 0;
}
