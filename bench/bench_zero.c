/* bench_zero.c - one ZeRO configuration of a GPT on N ranks: per-rank model-state bytes,
 * peak memory during training and step time. bench/bench_zero.sh runs it for DDP and
 * stages 1-3, alternating, and prints the table with ratios to DDP.
 *
 * Run it under the launcher: `mpirun -np 2 build/bench/bench_zero --stage 3`. It builds the
 * GPT (default ~85M parameters: 12 layers, width 768, 12 heads, byte vocabulary, context
 * --seq), wraps it in nb_zero at --stage (0: nb_ddp), with AdamW, then forgets what the
 * construction used (the allocator's cache is emptied and the peak RSS reset through
 * /proc/self/clear_refs), trains --warmup + --steps steps on random tokens (--batch
 * sequences per rank) and reports, as the maximum over the ranks:
 *   state   nb_zero_memory's model-state bytes (params + grads + optimizer state) after
 *           the last step, and comm (its constant communication buffers);
 *   alloc   the allocator's peak live bytes during the steps (model state, activations,
 *           gathered units: what training really needs);
 *   rss     the process's peak resident set during the steps (VmHWM);
 *   maxrss  the peak over the whole process, construction included (getrusage);
 *   step    the median step time over the timed steps.
 * Usage: bench_zero [--stage S] [--steps N] [--warmup N] [--batch B] [--seq T]
 *                   [--layers L] [--width C] [--threads N]
 * Output (rank 0): one line `RESULT zero stage=S ranks=N params=P state=... comm=...
 * alloc=... rss=... maxrss=... step=...` (bytes, seconds). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <nabla/gpt.h>
#include "nabla/nabla.h"
#include "nabla/parallel.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define CHECK(cond)                                                                     \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "bench_zero: %s:%d: %s (%s)\n", __FILE__, __LINE__, #cond,  \
                    nb_last_error());                                                   \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

/* VmHWM (peak resident set) in bytes, -1 if unknown; reset sets it to the current RSS. */
static double vm_hwm(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %lf kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}
static void reset_hwm(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
}

static long arg(int argc, char **argv, const char *name, long def) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return strtol(argv[i + 1], NULL, 10);
    return def;
}

int main(int argc, char **argv) {
    int stage = (int)arg(argc, argv, "--stage", 0), steps = (int)arg(argc, argv, "--steps", 3);
    int warmup = (int)arg(argc, argv, "--warmup", 1), threads = (int)arg(argc, argv, "--threads", 1);
    int64_t batch = arg(argc, argv, "--batch", 1), seq = arg(argc, argv, "--seq", 64);
    int64_t layers = arg(argc, argv, "--layers", 12), width = arg(argc, argv, "--width", 768);
    CHECK(steps >= 1 && warmup >= 0 && stage >= 0 && stage <= 3);
    nb_comm *world = nb_comm_world();
    CHECK(world != NULL);
    nb_comm_set_timeout(world, 0);
    int rank = nb_comm_rank(world), size = nb_comm_size(world);
    nb_set_num_threads(threads);

    nb_generator *g = nb_generator_new(0);
    nb_gpt_config cfg = nb_gpt_config_defaults();
    cfg.vocab_size = 256, cfg.block_size = seq, cfg.n_layer = layers;
    cfg.n_head = width / 64, cfg.n_embd = width;
    nb_module *m = nb_gpt_new(&cfg, g);
    nb_generator_free(g);
    CHECK(m != NULL);
    int64_t P = nb_num_parameters(m);
    nb_adamw_opts ao = nb_adamw_defaults();
    ao.lr = 1e-4;
    nb_optim *o = nb_adamw_new(nb_parameters(m), &ao);
    CHECK(o != NULL);
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = stage, zo.bucket_mb = 25;
    nb_zero *z = nb_zero_new(m, o, world, &zo);
    CHECK(z != NULL);

    nb_generator *dg = nb_generator_new(1 + (uint64_t)rank);
    nb_tensor *x = nb_randint((int64_t[]){batch, seq}, 2, NB_I64, 0, 256, dg);
    nb_tensor *y = nb_randint((int64_t[]){batch, seq}, 2, NB_I64, 0, 256, dg);
    nb_generator_free(dg);
    CHECK(x && y);
    nb_alloc_empty_cache();
    reset_hwm();
    nb_alloc_reset_peak();
    double *t = calloc((size_t)steps, sizeof *t);
    for (int s = 0; s < warmup + steps; s++) {
        CHECK(nb_barrier(world) == NB_OK);
        double t0 = now_s();
        nb_scope_begin();
        CHECK(nb_zero_grad(o) == NB_OK);
        nb_tensor *loss = nb_gpt_loss(m, x, y);
        CHECK(loss != NULL);
        CHECK(nb_backward(loss) == NB_OK);
        CHECK(nb_step(o) == NB_OK);
        nb_scope_end();
        if (s >= warmup) t[s - warmup] = now_s() - t0;
    }
    qsort(t, (size_t)steps, sizeof *t, cmp_double);
    double step = steps % 2 ? t[steps / 2] : 0.5 * (t[steps / 2 - 1] + t[steps / 2]);
    nb_zero_memory_info mi;
    CHECK(nb_zero_memory(z, &mi) == NB_OK);
    nb_alloc_stats st;
    nb_alloc_get_stats(&st);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    /* the maximum over the ranks of each figure */
    double v[6] = {(double)(mi.total - mi.comm_buffers), (double)mi.comm_buffers,
                   (double)st.bytes_peak, vm_hwm(), (double)ru.ru_maxrss * 1024, step};
    nb_tensor *vt = nb_from_buffer(v, (int64_t[]){6}, 1, NB_F64);
    CHECK(vt && nb_allreduce(world, vt, NB_REDUCE_MAX) == NB_OK);
    memcpy(v, nb_data(vt), sizeof v);
    if (rank == 0)
        printf("RESULT zero stage=%d ranks=%d params=%lld state=%.0f comm=%.0f alloc=%.0f "
               "rss=%.0f maxrss=%.0f step=%.4f\n", stage, size, (long long)P, v[0], v[1], v[2],
               v[3], v[4], v[5]);
    nb_tensor_free(vt);
    free(t);
    nb_zero_free(z);
    nb_optim_free(o);
    nb_module_free(m);
    nb_tensor_free(x);
    nb_tensor_free(y);
    nb_comm_free(world);
    return 0;
}
