/* bench_threads.c - threads under CPU contention: MLP training steps at 1 thread and at N
 * threads (default 2), on a quiet machine and with another process (a busy loop, forked
 * here) holding a core, alternating the runs and taking medians. Prints the N-thread
 * speed over the 1-thread speed in both situations: > 1 means the extra threads help, < 1
 * that they cost. Two workloads: small steps (batch 32, 784-256-256-10) and the bundled
 * MLP's steps (batch 256, 784-1024-1024-10).
 *
 *     build/bench/bench_threads [--threads N] [--reps R]
 *     build/bench/bench_threads --check   # tools/check-threads: exits 1 if, with a core
 *                                         # busy, 2 threads are much slower than 1
 *
 * The busy loop is one process, not pinned: the kernel puts it wherever it likes, as it
 * would another user's job. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nabla/nabla.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define FAIL(...)                                                                          \
    do {                                                                                   \
        fprintf(stderr, "bench_threads: " __VA_ARGS__);                                    \
        fprintf(stderr, ": %s\n", nb_last_error());                                        \
        exit(1);                                                                           \
    } while (0)

typedef struct workload {
    const char *name;
    int64_t batch, hidden, steps;
} workload;

typedef struct model {
    nb_module *m;
    nb_optim *opt;
    nb_tensor *x, *y;
} model;

static model model_new(const workload *w) {
    nb_generator *g = nb_generator_new(1);
    nb_linear_opts o = nb_linear_defaults();
    o.gen = g;
    model r;
    r.m = nb_sequential_new(nb_linear_new(784, w->hidden, &o), nb_relu_new(),
                            nb_linear_new(w->hidden, w->hidden, &o), nb_relu_new(),
                            nb_linear_new(w->hidden, 10, &o), NULL);
    if (!r.m) FAIL("model");
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 0.01, so.momentum = 0.9;
    r.opt = nb_sgd_new(nb_parameters(r.m), &so);
    r.x = nb_randn((int64_t[]){w->batch, 784}, 2, NB_F32, g);
    r.y = nb_randint((int64_t[]){w->batch}, 1, NB_I64, 0, 10, g);
    if (!r.opt || !r.x || !r.y) FAIL("data");
    nb_generator_free(g);
    return r;
}

/* Seconds for w->steps training steps on `threads` threads. */
static double run_steps(model *r, const workload *w, int threads) {
    nb_set_num_threads(threads);
    double t0 = now_s();
    for (int64_t s = 0; s < w->steps; s++) {
        nb_scope_begin();
        nb_tensor *loss = nb_cross_entropy(nb_forward(r->m, r->x), r->y, NULL);
        nb_status st = loss ? nb_zero_grad(r->opt) : nb_last_status();
        if (st == NB_OK) st = nb_backward(loss);
        if (st == NB_OK) st = nb_step(r->opt);
        nb_scope_end();
        if (st != NB_OK) FAIL("step");
    }
    return now_s() - t0;
}

static pid_t burner_start(void) {
    pid_t p = fork();
    if (p == 0) {
        volatile unsigned long x = 0;
        for (;;) x++;
    }
    if (p < 0) {
        perror("bench_threads: fork");
        exit(1);
    }
    usleep(50000); /* let the scheduler place it */
    return p;
}

static void burner_stop(pid_t p) {
    kill(p, SIGKILL);
    waitpid(p, NULL, 0);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#define MAX_REPS 15

/* Median seconds of 1-thread and N-thread runs, alternated, reps of each. */
static void measure(const workload *w, int threads, int reps, bool busy, double *t1,
                    double *tn) {
    model r = model_new(w);
    pid_t b = busy ? burner_start() : 0;
    run_steps(&r, w, 1); /* warm up: allocator caches, oneDNN kernels, thread pools */
    run_steps(&r, w, threads);
    double a[MAX_REPS], c[MAX_REPS];
    for (int i = 0; i < reps; i++) {
        a[i] = run_steps(&r, w, 1);
        c[i] = run_steps(&r, w, threads);
    }
    if (busy) burner_stop(b);
    *t1 = median(a, reps);
    *tn = median(c, reps);
    nb_optim_free(r.opt);
    nb_module_free(r.m);
}

int main(int argc, char **argv) {
    int threads = 2, reps = 5;
    bool check = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--check")) check = true;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_threads [--threads N] [--reps R] [--check]\n");
            return 2;
        }
    }
    if (threads < 2 || reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "bench_threads: --threads must be >= 2 and --reps 1..%d\n", MAX_REPS);
        return 2;
    }
    nb_scope_begin();
    workload small = {"small steps (batch 32, 784-256-256-10)", 32, 256, 100};
    workload big = {"mlp steps (batch 256, 784-1024-1024-10)", 256, 1024, 10};

    if (check) {
        /* Today's bound: with a core busy, N threads may not take more than 1.5x the time
         * of 1 thread (before nabla bounded the spinning they took 5-250x). */
        const double limit = 1.5;
        double t1, tn;
        workload w = small;
        w.steps = 200;
        measure(&w, threads, 3, true, &t1, &tn);
        bool ok = tn <= limit * t1;
        if (!ok) { /* the box is shared: a second try before calling it a failure */
            printf("check: first try %.2fx the time, trying again\n", tn / t1);
            measure(&w, threads, 3, true, &t1, &tn);
            ok = tn <= limit * t1;
        }
        printf("check: %s with a core busy: 1 thread %.3f s, %d threads %.3f s "
               "(%.2fx the time, limit %.1fx): %s\n",
               small.name, t1, threads, tn, tn / t1, limit, ok ? "ok" : "FAILED");
        printf("%d%%: Checks: 1, Failures: %d, Errors: 0\n", ok ? 100 : 0, ok ? 0 : 1);
        nb_scope_end();
        return ok ? 0 : 1;
    }

    printf("bench_threads: %d threads vs 1, medians of %d alternated runs, gemm %s\n",
           threads, reps, nb_gemm_provider_name(nb_gemm_provider_current()));
    printf("%-42s %-10s %12s %12s %10s\n", "workload", "machine", "1 thread/s", "N threads/s",
           "speedup");
    const workload *ws[] = {&small, &big};
    for (int k = 0; k < 2; k++) {
        for (int busy = 0; busy < 2; busy++) {
            double t1, tn;
            measure(ws[k], threads, reps, busy, &t1, &tn);
            printf("%-42s %-10s %12.4f %12.4f %9.2fx\n", ws[k]->name, busy ? "core busy" : "quiet",
                   t1, tn, t1 / tn);
            fflush(stdout);
        }
    }
    nb_scope_end();
    return 0;
}
