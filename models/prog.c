/* prog.c - helpers the bundled programs share (prog.h): timing, medians, ETA text, error
 * lines naming the rank, thread sharing and scalar means over ranks. */
#include "prog.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

double nbm_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double nbm_median(double *v, int64_t n) {
    if (n <= 0) return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void nbm_fmt_eta(double s, char *buf, size_t n) {
    if (!isfinite(s) || s < 0) s = 0;
    long t = (long)(s + 0.5);
    snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
}

void nbm_report(const char *prog, int rank, int size, const char *fmt, ...) {
    char msg[1024];
    int k = size > 1 ? snprintf(msg, sizeof msg, "%s (rank %d): ", prog, rank)
                     : snprintf(msg, sizeof msg, "%s: ", prog);
    va_list ap;
    va_start(ap, fmt);
    if (k > 0 && (size_t)k < sizeof msg) vsnprintf(msg + k, sizeof msg - (size_t)k, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", msg);
}

int nbm_local_ranks(int world_size) {
    const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MPICH_LOCALNRANKS",
                          "SLURM_NTASKS_PER_NODE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 0) return atoi(v);
    }
    return world_size;
}

void nbm_set_threads(nb_comm *world, int requested) {
    int size = world ? nb_comm_size(world) : 1;
    if (requested > 0 || size == 1) {
        nb_set_num_threads(requested);
        return;
    }
    nb_set_num_threads(0); /* the default (all cores) per rank would oversubscribe */
    int per = nb_get_num_threads() / nbm_local_ranks(size);
    nb_set_num_threads(per > 0 ? per : 1);
}

double nbm_mean_over_ranks(nb_comm *world, double v) {
    if (!world || nb_comm_size(world) == 1) return v;
    nb_scope_begin();
    nb_tensor *t = nb_from_buffer(&v, (int64_t[]){1}, 1, NB_F64);
    if (!t || nb_allreduce(world, t, NB_REDUCE_AVG) != NB_OK) v = NAN;
    else v = nb_item_f64(t);
    nb_scope_end();
    return v;
}
