/* bench_ddp.c - data parallel step time: nb_ddp on N ranks against 1 process, for an MLP like
 * W1 (784-1024-1024-10, global batch 256, SGD momentum) and a GPT like W3 (4 layers, width
 * 256, context 128, global batch 16, Adam), on synthetic data.
 *
 * Run it under the launcher: `mpirun -np 2 build/bench/bench_ddp`. In one run it measures
 *   1. rank 0 alone (the other ranks sleep) on the whole global batch, with 1 thread and
 *      with N x (threads per rank) threads: the 1-process baselines on the same cores;
 *   2. every rank at once on its local batch (global / N) WITHOUT communication: the
 *      compute a rank does, slowed only by sharing the machine;
 *   3. every rank with nb_ddp on its local batch: the real step, and the part of the
 *      gradient allreduce it had to wait for (nb_ddp_exposed_comm_s).
 * Step times are medians over the timed steps (after warm-up). Scaling efficiency is
 * t(1 process, 1 thread) / (N t(ddp)), and also the ratio to 1 process using the same
 * total number of threads. Started without a launcher, it runs phase 1 and a size-1 DDP
 * (which must cost nothing).
 *
 * Usage: bench_ddp [--model mlp|gpt|all] [--steps N] [--warmup N] [--threads N]
 *                  [--bucket-mb X]
 * Output (rank 0): a table, and lines `RESULT ddp <model> <key>=<value> ...`. */
#include <math.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static double median(const double *v, int n) {
    if (n <= 0) return NAN;
    double *c = malloc(sizeof(double) * (size_t)n);
    memcpy(c, v, sizeof(double) * (size_t)n);
    qsort(c, (size_t)n, sizeof(double), cmp_double);
    double m = (n % 2) ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    free(c);
    return m;
}

#define CHECK(cond)                                                                     \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "bench_ddp: %s:%d: %s (%s)\n", __FILE__, __LINE__, #cond,   \
                    nb_last_error());                                                   \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

/* ---- workloads ---------------------------------------------------------------------------- */
typedef struct workload {
    const char *name;
    int64_t global_batch;
    const char *unit; /* what one sample is */
    int64_t per_sample; /* units per sample (tokens for the GPT) */
    nb_module *(*build)(void);
    nb_optim *(*optim)(nb_module *m);
    void (*data)(int64_t n, nb_tensor **x, nb_tensor **y); /* new caller-owned tensors */
    nb_tensor *(*loss)(nb_module *m, nb_tensor *x, nb_tensor *y);
} workload;

static nb_module *mlp_build(void) {
    nb_generator *g = nb_generator_new(0);
    nb_linear_opts o = nb_linear_defaults();
    o.gen = g;
    nb_module *m = nb_sequential_new(nb_linear_new(784, 1024, &o), nb_relu_new(),
                                 nb_linear_new(1024, 1024, &o), nb_relu_new(),
                                 nb_linear_new(1024, 10, &o), NULL);
    nb_generator_free(g);
    return m;
}
static nb_optim *mlp_optim(nb_module *m) {
    nb_sgd_opts o = nb_sgd_defaults();
    o.lr = 0.05, o.momentum = 0.9;
    return nb_sgd_new(nb_parameters(m), &o);
}
static void mlp_data(int64_t n, nb_tensor **x, nb_tensor **y) {
    nb_generator *g = nb_generator_new(1);
    *x = nb_rand((int64_t[]){n, 784}, 2, NB_F32, g);
    *y = nb_randint((int64_t[]){n}, 1, NB_I64, 0, 10, g);
    nb_generator_free(g);
}
static nb_tensor *mlp_loss(nb_module *m, nb_tensor *x, nb_tensor *y) {
    return nb_cross_entropy(nb_forward(m, x), y, NULL);
}

static nb_module *gpt_build(void) {
    nb_generator *g = nb_generator_new(0);
    nb_module *m = nb_gpt_new(NULL, g); /* the defaults are W3's */
    nb_generator_free(g);
    return m;
}
static nb_optim *gpt_optim(nb_module *m) {
    nb_adam_opts o = nb_adam_defaults();
    o.lr = 3e-4;
    return nb_adam_new(nb_parameters(m), &o);
}
static void gpt_data(int64_t n, nb_tensor **x, nb_tensor **y) {
    nb_generator *g = nb_generator_new(2);
    *x = nb_randint((int64_t[]){n, 128}, 2, NB_I64, 0, 256, g);
    *y = nb_randint((int64_t[]){n, 128}, 2, NB_I64, 0, 256, g);
    nb_generator_free(g);
}

static const workload workloads[] = {
    {"mlp", 256, "samples", 1, mlp_build, mlp_optim, mlp_data, mlp_loss},
    {"gpt", 16, "tokens", 128, gpt_build, gpt_optim, gpt_data, nb_gpt_loss},
};

/* ---- measurement -------------------------------------------------------------------------- */
typedef struct result {
    double step_s;     /* median step time */
    double exposed_s;  /* median exposed communication (DDP) */
} result;

/* Train `warmup + steps` steps on n samples (with ddp over c when c is given). */
static nb_dtype reduce_dtype = NB_F32; /* --reduce-dtype */

static result measure(const workload *w, int64_t n, nb_comm *c, double bucket_mb, int warmup,
                      int steps, int *buckets) {
    nb_module *m = w->build();
    CHECK(m);
    nb_ddp *d = NULL;
    if (c) {
        nb_ddp_opts o = nb_ddp_defaults();
        if (bucket_mb > 0) o.bucket_mb = bucket_mb;
        o.reduce_dtype = reduce_dtype;
        d = nb_ddp_new(m, c, &o);
        CHECK(d);
        if (buckets) *buckets = nb_ddp_num_buckets(d);
    }
    nb_optim *o = w->optim(m);
    CHECK(o);
    nb_tensor *x, *y;
    w->data(n, &x, &y);
    CHECK(x && y);
    double *ts = malloc(sizeof(double) * (size_t)steps), *ex = malloc(sizeof(double) * (size_t)steps);
    for (int i = 0; i < warmup + steps; i++) {
        double t0 = now_s();
        nb_scope_begin();
        nb_tensor *l = w->loss(m, x, y);
        CHECK(l);
        CHECK(nb_zero_grad(o) == NB_OK);
        CHECK(nb_backward(l) == NB_OK);
        if (d) CHECK(nb_ddp_sync(d) == NB_OK);
        CHECK(nb_step(o) == NB_OK);
        nb_scope_end();
        if (i >= warmup) {
            ts[i - warmup] = now_s() - t0;
            ex[i - warmup] = d ? nb_ddp_exposed_comm_s(d) : 0;
        }
    }
    result r = {median(ts, steps), median(ex, steps)};
    free(ts);
    free(ex);
    nb_tensor_free(x);
    nb_tensor_free(y);
    nb_ddp_free(d);
    nb_optim_free(o);
    nb_module_free(m);
    return r;
}

/* Cores this process may run on (mpirun binds each rank to one core by default). */
static int usable_cores(void) {
    cpu_set_t set;
    return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
}

/* Ranks other than 0 wait here, sleeping (not spinning on a core rank 0 is measuring),
 * until rank 0 arrives. */
static void rank0_alone_end(nb_comm *world) {
    nb_tensor *flag = nb_zeros((int64_t[]){1}, 1, NB_I32);
    nb_work *wk = nb_broadcast_async(world, flag, 0);
    CHECK(wk);
    int done;
    while ((done = nb_work_test(wk)) == 0) nanosleep(&(struct timespec){0, 2000000}, NULL);
    CHECK(done == 1);
    nb_work_free(wk);
    nb_tensor_free(flag);
}

int main(int argc, char **argv) {
    const char *which = "all";
    int steps = 0, warmup = 0, threads = 0;
    double bucket_mb = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--model") && v) which = v, i++;
        else if (!strcmp(argv[i], "--steps") && v) steps = atoi(v), i++;
        else if (!strcmp(argv[i], "--warmup") && v) warmup = atoi(v), i++;
        else if (!strcmp(argv[i], "--threads") && v) threads = atoi(v), i++;
        else if (!strcmp(argv[i], "--bucket-mb") && v) bucket_mb = atof(v), i++;
        else if (!strcmp(argv[i], "--reduce-dtype") && v &&
                 (!strcmp(v, "f32") || !strcmp(v, "f16") || !strcmp(v, "bf16")))
            reduce_dtype = !strcmp(v, "f32") ? NB_F32 : !strcmp(v, "f16") ? NB_F16 : NB_BF16, i++;
        else {
            fprintf(stderr, "usage: %s [--model mlp|gpt|all] [--steps N] [--warmup N] "
                    "[--threads N] [--bucket-mb X] [--reduce-dtype f32|f16|bf16]   (run under "
                    "mpirun -np N)\n", argv[0]);
            return 2;
        }
    }
    nb_comm *world = nb_comm_world();
    CHECK(world);
    int rank = nb_comm_rank(world), size = nb_comm_size(world);
    nb_comm_set_timeout(world, 0); /* rank 0's baselines may take minutes */
    if (threads <= 0) { /* share the cores of the machine between the ranks */
        nb_set_num_threads(0);
        threads = nb_get_num_threads() / size > 0 ? nb_get_num_threads() / size : 1;
    }
    if (rank == 0)
        printf("bench_ddp: %d rank%s x %d thread%s, gemm %s, backend %s\n", size,
               size > 1 ? "s" : "", threads, threads > 1 ? "s" : "",
               nb_gemm_provider_name(nb_gemm_provider_current()), nb_comm_backend(world));

    for (size_t k = 0; k < sizeof workloads / sizeof workloads[0]; k++) {
        const workload *w = &workloads[k];
        if (strcmp(which, "all") && strcmp(which, w->name)) continue;
        if (w->global_batch % size) {
            if (rank == 0) printf("%s: global batch %lld does not divide by %d ranks; skipped\n",
                                  w->name, (long long)w->global_batch, size);
            continue;
        }
        int st = steps > 0 ? steps : (k == 0 ? 20 : 5);
        int wu = warmup > 0 ? warmup : (k == 0 ? 3 : 1);
        int64_t local = w->global_batch / size;
        result one_1t = {NAN, 0}, one_nt = {NAN, 0}, self = {NAN, 0};
        /* 1. rank 0 alone on the global batch */
        if (rank == 0) {
            nb_set_num_threads(1);
            one_1t = measure(w, w->global_batch, NULL, 0, wu, st, NULL);
            /* Only meaningful if rank 0 may use that many cores: under mpirun's default
             * binding it may not (then run bench_ddp alone with --threads for it). */
            nb_set_num_threads(threads * size);
            if (threads * size == 1) one_nt = one_1t;
            else if (usable_cores() >= threads * size)
                one_nt = measure(w, w->global_batch, NULL, 0, wu, st, NULL);
            if (size == 1) {
                nb_comm *s1 = nb_comm_self();
                self = measure(w, w->global_batch, s1, bucket_mb, wu, st, NULL);
                nb_comm_free(s1);
            }
        }
        if (size > 1) rank0_alone_end(world);
        nb_set_num_threads(threads);
        if (size == 1) {
            printf("%s: 1 process, global batch %lld: %.1f ms/step with 1 thread, %.1f ms with "
                   "%d; nb_ddp on a size-1 communicator %.1f ms (%+.1f%%)\n",
                   w->name, (long long)w->global_batch, 1e3 * one_1t.step_s, 1e3 * one_nt.step_s,
                   threads, 1e3 * self.step_s, 100 * (self.step_s / one_nt.step_s - 1));
            printf("RESULT ddp %s ranks=1 threads=%d step_ms_1t=%.2f step_ms=%.2f "
                   "ddp_self_step_ms=%.2f\n", w->name, threads, 1e3 * one_1t.step_s,
                   1e3 * one_nt.step_s, 1e3 * self.step_s);
            continue;
        }
        /* 2. every rank on its local batch, no communication */
        CHECK(nb_barrier(world) == NB_OK);
        result local_only = measure(w, local, NULL, 0, wu, st, NULL);
        /* 3. DDP */
        CHECK(nb_barrier(world) == NB_OK);
        int buckets = 0;
        result ddp = measure(w, local, world, bucket_mb, wu, st, &buckets);
        /* the slowest rank sets the pace: report the max over ranks */
        double v[3] = {local_only.step_s, ddp.step_s, ddp.exposed_s};
        nb_tensor *t = nb_from_buffer(v, (int64_t[]){3}, 1, NB_F64);
        CHECK(t && nb_allreduce(world, t, NB_REDUCE_MAX) == NB_OK);
        CHECK(nb_read(t, v, 3, NB_F64) == NB_OK);
        nb_tensor_free(t);
        if (rank == 0) {
            double units = (double)w->global_batch * (double)w->per_sample;
            double eff = one_1t.step_s / (size * v[1]);
            printf("%s: global batch %lld (%lld per rank), %d gradient bucket%s\n", w->name,
                   (long long)w->global_batch, (long long)local, buckets, buckets > 1 ? "s" : "");
            printf("  %-36s %9.1f ms/step %10.0f %s/s\n", "1 process, 1 thread", 1e3 * one_1t.step_s,
                   units / one_1t.step_s, w->unit);
            if (isnan(one_nt.step_s))
                printf("  1 process, %d threads: not measured (rank 0 is bound to %d core%s; run "
                       "mpirun --bind-to none, or bench_ddp alone)\n", threads * size,
                       usable_cores(), usable_cores() > 1 ? "s" : "");
            else
                printf("  %-36s %9.1f ms/step %10.0f %s/s\n", "1 process, all ranks' threads",
                       1e3 * one_nt.step_s, units / one_nt.step_s, w->unit);
            printf("  %-36s %9.1f ms/step\n", "each rank its local batch, no comm", 1e3 * v[0]);
            printf("  %-36s %9.1f ms/step %10.0f %s/s  (exposed comm %.1f ms)\n", "ddp",
                   1e3 * v[1], units / v[1], w->unit, 1e3 * v[2]);
            printf("  scaling efficiency vs 1 process 1 thread: %.0f%% (speedup %.2fx on %d "
                   "ranks)", 100 * eff, one_1t.step_s / v[1], size);
            if (!isnan(one_nt.step_s))
                printf("; vs 1 process with %d threads: %.2fx", threads * size,
                       one_nt.step_s / v[1]);
            printf("\n");
            printf("RESULT ddp %s ranks=%d threads=%d step_ms_1p1t=%.2f step_ms_1pNt=%.2f "
                   "local_ms=%.2f ddp_ms=%.2f exposed_comm_ms=%.2f efficiency=%.3f buckets=%d\n",
                   w->name, size, threads, 1e3 * one_1t.step_s, 1e3 * one_nt.step_s, 1e3 * v[0],
                   1e3 * v[1], 1e3 * v[2], eff, buckets);
        }
    }
    nb_comm_free(world);
    return 0;
}
