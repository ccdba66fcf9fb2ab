/* bench_gemm.c - nabla's f32 GEMM paths side by side on the GEMMs of a training step:
 * `dnnl` (shape-only tiles of single-threaded dnnl_sgemm calls), `openblas` (the same tiles
 * of cblas_sgemm calls) and `packed` (nabla's own packed GEMM, cpu/sgemm.c), each through
 * nb__gemm_f32 as the models call it, timed round-robin (one run of each per round) so that
 * drift on a shared machine hits them alike. Prints, per workload, the median time of the
 * step's GEMMs run back to back and their rate, and what the default path is on this machine.
 *
 *   bench_gemm [--threads N] [--cpu] [--rounds N] [--only=w1|w3|w3b|attn]
 *
 * --cpu times with the process's CPU clock instead of the wall clock: at --threads 1 that
 * is the work itself, unaffected by other processes taking turns on the core (it still sees
 * their effect on the caches), so 1-thread comparisons on a busy machine use it.
 * Which instruction sets run: the build's -march (a portable x86-64-v3 build has the AVX2
 * kernel) and ONEDNN_MAX_CPU_ISA / OPENBLAS_CORETYPE for the libraries (bench/README.md).
 * Output: a table, and lines `RESULT gemm <workload> <path> <ms> ms <GFLOP/s> GFLOP/s`. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nabla/nabla.h"

#include "cpu/gemm.h"
#include "cpu/sgemm.h"

typedef struct {
    int64_t M, K, N;
    bool ta, tb;
} shape;

typedef struct {
    const char *name;
    shape g[64];
    int n;
} workload;

static void add_linear(workload *w, int64_t rows, int64_t in, int64_t out, bool igrad) {
    w->g[w->n++] = (shape){rows, in, out, false, true}; /* y = x W^T */
    if (igrad) w->g[w->n++] = (shape){rows, out, in, false, false}; /* dx = dy W */
    w->g[w->n++] = (shape){out, rows, in, true, false}; /* dW = dy^T x */
}

static double flops(const workload *w) {
    double f = 0;
    for (int i = 0; i < w->n; i++) f += 2.0 * (double)w->g[i].M * (double)w->g[i].K * (double)w->g[i].N;
    return f;
}

enum { P_DNNL, P_BLAS, P_PACKED, NPATHS };
static const char *path_names[NPATHS] = {"dnnl", "openblas", "packed"};

static bool path_set(int p) {
    if (p == P_PACKED) {
        if (!nb__sgemm_packed_available()) return false;
        nb__sgemm_set_packed(true);
        return true;
    }
    nb_gemm_provider prov = p == P_DNNL ? NB_GEMM_DNNL : NB_GEMM_OPENBLAS;
    if (!nb_gemm_provider_available(prov)) return false;
    nb__sgemm_set_packed(false);
    return nb_set_gemm_provider(prov) == NB_OK;
}

static bool g_cpu = false;
static double now_s(void) {
    struct timespec ts;
    clock_gettime(g_cpu ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static float *A, *B, *C;

static double run(const workload *w) {
    double t0 = now_s();
    for (int i = 0; i < w->n; i++) {
        const shape *g = &w->g[i];
        int64_t lda = g->ta ? g->M : g->K, ldb = g->tb ? g->K : g->N;
        if (nb__gemm_f32(g->ta, g->tb, g->M, g->N, g->K, 1.0f, A, lda, B, ldb, 0.0f, C, g->N) !=
            NB_OK) {
            fprintf(stderr, "bench_gemm: %s\n", nb_last_error());
            exit(1);
        }
    }
    return now_s() - t0;
}

int main(int argc, char **argv) {
    int threads = 2, rounds = 9;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cpu")) g_cpu = true;
        else if (!strncmp(argv[i], "--only=", 7)) only = argv[i] + 7;
        else {
            fprintf(stderr, "usage: bench_gemm [--threads N] [--cpu] [--rounds N] "
                            "[--only=w1|w3|w3b|attn]\n");
            return 2;
        }
    }
    if (rounds < 1 || rounds > 200) rounds = 9;
    nb_set_num_threads(threads);
    static workload ws[4];
    int nw = 0;
    /* W1: MLP 784-1024-1024-10, batch 256 (no input gradient for the first layer) */
    workload *w = &ws[nw++];
    w->name = "w1";
    add_linear(w, 256, 784, 1024, false);
    add_linear(w, 256, 1024, 1024, true);
    add_linear(w, 256, 1024, 10, true);
    /* W3: 4 blocks of width 256 on 16 x 128 tokens, and the tied head */
    w = &ws[nw++];
    w->name = "w3";
    for (int l = 0; l < 4; l++) {
        add_linear(w, 2048, 256, 768, true);
        add_linear(w, 2048, 256, 256, true);
        add_linear(w, 2048, 256, 1024, true);
        add_linear(w, 2048, 1024, 256, true);
    }
    add_linear(w, 2048, 256, 256, true);
    /* W3b: the same on 4 x 64 tokens */
    w = &ws[nw++];
    w->name = "w3b";
    for (int l = 0; l < 4; l++) {
        add_linear(w, 256, 256, 768, true);
        add_linear(w, 256, 256, 256, true);
        add_linear(w, 256, 256, 1024, true);
        add_linear(w, 256, 1024, 256, true);
    }
    add_linear(w, 256, 256, 256, true);
    /* attention's per-head products (T 128, head size 64): scores, context and their
     * gradients, one head */
    w = &ws[nw++];
    w->name = "attn";
    w->g[w->n++] = (shape){128, 64, 128, false, true};
    w->g[w->n++] = (shape){128, 128, 64, false, false};
    w->g[w->n++] = (shape){128, 64, 128, false, true};
    w->g[w->n++] = (shape){128, 128, 64, true, false};
    w->g[w->n++] = (shape){128, 128, 64, false, false};
    w->g[w->n++] = (shape){128, 128, 64, true, false};

    size_t big = (size_t)2048 * 1024;
    A = malloc(sizeof(float) * big), B = malloc(sizeof(float) * big);
    C = malloc(sizeof(float) * big);
    if (!A || !B || !C) return 1;
    uint64_t s = 1;
    for (size_t i = 0; i < big; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        A[i] = (float)((s >> 40) & 0xffff) / 65536.0f - 0.5f;
        B[i] = A[(i * 7919) % big];
    }
    /* the default: what a fresh process picks here (before the paths are switched) */
    printf("bench_gemm: %d threads, %s clock, %d rounds; packed kernel %s; default f32 path "
           "here: %s\n",
           threads, g_cpu ? "process CPU" : "wall", rounds, nb__sgemm_packed_isa(),
           nb__sgemm_path());
    bool have[NPATHS];
    for (int p = 0; p < NPATHS; p++) have[p] = path_set(p);
    for (int k = 0; k < nw; k++) {
        w = &ws[k];
        if (only && strcmp(only, w->name)) continue;
        double *t[NPATHS];
        for (int p = 0; p < NPATHS; p++) t[p] = calloc((size_t)rounds, sizeof(double));
        int reps = !strcmp(w->name, "attn") ? 64 : 1; /* a batch of heads, one at a time */
        for (int p = 0; p < NPATHS; p++) /* warm-up */
            if (have[p] && path_set(p)) run(w);
        for (int r = 0; r < rounds; r++)
            for (int p = 0; p < NPATHS; p++) {
                if (!have[p]) continue;
                path_set(p);
                double sum = 0;
                for (int q = 0; q < reps; q++) sum += run(w);
                t[p][r] = sum;
            }
        double f = flops(w) * reps;
        printf("%-5s %7.3f GFLOP per run", w->name, f * 1e-9);
        for (int p = 0; p < NPATHS; p++) {
            if (!have[p]) {
                printf("  %s: n/a", path_names[p]);
                continue;
            }
            qsort(t[p], (size_t)rounds, sizeof(double), cmp_double);
            double med = t[p][rounds / 2];
            printf("  %s: %.2f ms %.1f GFLOP/s", path_names[p], med * 1e3, f / med * 1e-9);
        }
        printf("\n");
        for (int p = 0; p < NPATHS; p++) {
            if (!have[p]) continue;
            double med = t[p][rounds / 2];
            printf("RESULT gemm %s %s %.3f ms %.2f GFLOP/s\n", w->name, path_names[p], med * 1e3,
                   f / med * 1e-9);
            free(t[p]);
        }
        fflush(stdout);
    }
    free(A), free(B), free(C);
    return 0;
}
