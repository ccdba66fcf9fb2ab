/* bench_tiny_gemm.c - where a tiny f32 product is cheaper: nabla's packed GEMM (cpu/sgemm.c)
 * or one call of the current provider (NB_GEMM=dnnl|openblas), its kernel already warm. It
 * measures the crossover behind NB__SGEMM_TINY_FLOPS (cpu/sgemm.h: products under it always
 * run packed, docs/threads.md). One thread, the process's CPU clock, the two alternated, the
 * best of 6 rounds after a warm-up round.
 *
 *   NB_GEMM=dnnl bench_tiny_gemm;  NB_GEMM=openblas bench_tiny_gemm
 *
 * Output: one line per shape (y = x W^T: M x K times N x K transposed), the microseconds of
 * each and their ratio. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "nabla/nabla.h"

#include "cpu/gemm.h"
#include "cpu/sgemm.h"

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(void) {
    if (!nb__sgemm_packed_available()) {
        puts("bench_tiny_gemm: this build has no packed GEMM kernel");
        return 0;
    }
    nb_set_num_threads(1);
    static const int sh[][3] = {{2, 2, 3},    {8, 8, 8},    {16, 16, 16}, {16, 16, 32},
                                {16, 16, 64}, {32, 32, 16}, {32, 32, 32}, {32, 32, 64},
                                {64, 64, 64}};
    float *a = calloc(1 << 16, sizeof(float)), *b = calloc(1 << 16, sizeof(float)),
          *c = calloc(1 << 16, sizeof(float));
    if (!a || !b || !c) return 1;
    for (int i = 0; i < 1 << 16; i++) a[i] = (float)(i % 7), b[i] = (float)(i % 5);
    printf("provider %s, packed kernel %s, 1 thread\n",
           nb_gemm_provider_name(nb_gemm_provider_current()), nb__sgemm_packed_isa());
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
        int M = sh[s][0], N = sh[s][1], K = sh[s][2];
        double best[2] = {1e9, 1e9};
        int reps = 200000 / (M * N * K / 8 + 1) + 50;
        for (int r = 0; r < 7; r++)
            for (int p = 0; p < 2; p++) {
                double t0 = cpu_seconds();
                for (int i = 0; i < reps; i++) {
                    nb_status st = p ? nb__sgemm_packed(false, true, M, N, K, 1.0f, a, K, b, K,
                                                        0.0f, c, N)
                                     : nb__sgemm_tiles(false, true, M, N, K, 1.0f, a, K, b, K,
                                                       0.0f, c, N);
                    if (st != NB_OK) {
                        fprintf(stderr, "bench_tiny_gemm: %s\n", nb_last_error());
                        return 1;
                    }
                }
                double t = (cpu_seconds() - t0) / reps;
                if (r > 0 && t < best[p]) best[p] = t;
            }
        printf("%3dx%3dx%3d  2MNK %7d  provider %7.3f us  packed %7.3f us  packed/provider %.2f\n",
               M, N, K, 2 * M * N * K, best[0] * 1e6, best[1] * 1e6, best[1] / best[0]);
    }
    free(a), free(b), free(c);
    return 0;
}
