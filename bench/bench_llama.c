/* bench_llama.c - the training step of the Llama (nabla/llama.h) at its default config (the
 * W3 size: 4 layers, 4 heads on 2 key/value heads, width 256, MLP 704, context 128), batch 16
 * of 128 tokens, AdamW: the median step time, for bench/bench_llama.sh to put next to the
 * PyTorch peer (bench/llama_peer.py, the same architecture) measured in the same run.
 *
 * Usage: bench_llama [--steps N] [--warmup N] [--threads N] [--bf16]
 * Output: a human line, then one JSON line {"median_step_ms", "tokens_per_s", "loss", ...}. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nabla/nabla.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int steps = 30, warmup = 5, threads = 0;
    bool bf16 = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--bf16")) bf16 = true;
        else {
            fprintf(stderr, "usage: %s [--steps N] [--warmup N] [--threads N] [--bf16]\n", argv[0]);
            return 2;
        }
    }
    if (steps < 1 || warmup < 0) return 2;
    if (threads > 0) nb_set_num_threads(threads);
    const int64_t B = 16, T = 128;
    nb_llama_config cfg = nb_llama_config_defaults();
    nb_generator *init = nb_generator_new(0), *data = nb_generator_new(1);
    nb_module *m = nb_llama_new(&cfg, init);
    nb_adamw_opts ao = nb_adamw_defaults();
    ao.lr = 3e-4;
    nb_optim *opt = m ? nb_adamw_new(nb_parameters(m), &ao) : NULL;
    if (!opt) {
        fprintf(stderr, "bench_llama: %s\n", nb_last_error());
        return 1;
    }
    double *ms = malloc(sizeof(double) * (size_t)steps), loss = NAN;
    for (int s = 0; s < warmup + steps; s++) {
        nb_scope_begin();
        nb_tensor *x = nb_randint((int64_t[]){B, T}, 2, NB_I64, 0, 256, data);
        nb_tensor *y = nb_randint((int64_t[]){B, T}, 2, NB_I64, 0, 256, data);
        const double t0 = now_s();
        if (bf16) nb_autocast_begin(NB_BF16);
        loss = nb_llama_train_step(m, opt, &x, &y, 1, NULL, NULL);
        if (bf16) nb_autocast_end();
        const double t1 = now_s();
        nb_scope_end();
        if (isnan(loss)) {
            fprintf(stderr, "bench_llama: %s\n", nb_last_error());
            return 1;
        }
        if (s >= warmup) ms[s - warmup] = (t1 - t0) * 1e3;
    }
    qsort(ms, (size_t)steps, sizeof *ms, cmp_double);
    const double med = ms[steps / 2];
    const double gflop = nb_llama_train_flops(&cfg, B, T) * 1e-9;
    printf("llama default config, batch %lld x %lld, %s, threads %d: median step %.2f ms "
           "(%.0f GFLOP/s), loss %.4f\n", (long long)B, (long long)T, bf16 ? "bf16" : "f32",
           nb_get_num_threads(), med, gflop / med * 1e3, loss);
    printf("{\"median_step_ms\": %.4f, \"tokens_per_s\": %.1f, \"loss\": %.6f, \"gflop\": %.4f}\n",
           med, (double)(B * T) / med * 1e3, loss, gflop);
    free(ms);
    nb_optim_free(opt);
    nb_module_free(m);
    nb_generator_free(init);
    nb_generator_free(data);
    return 0;
}
