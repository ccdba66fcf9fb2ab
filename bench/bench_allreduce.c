/* bench_allreduce.c - allreduce bandwidth: nabla's nb_allreduce next to a raw MPI_Allreduce
 * on the same buffer, in the same run (the machine is noisy, so only side-by-side ratios
 * mean much). Run under a launcher: `mpirun -np 2 ./build/bench/bench_allreduce`.
 *
 * For each size (4 KiB to 256 MiB of f32, by powers of 4) both calls are timed round-robin,
 * one of each per round, every call started after an MPI_Barrier; a call's time is the
 * slowest rank's (an MPI_Allreduce of the times, outside the timed region). Before each
 * timed call the rank rewrites its buffer (with the zeros it holds), so that both calls
 * start from a buffer this rank has just written, as a gradient is after backward. Without
 * that, a call pays for where the previous call left the buffer's cache lines: Open MPI's
 * single-copy transfers (above 4 KiB) read the buffer from the peer's core, and whichever
 * call ran after MPI_Allreduce was up to 20 % slower at 16 KiB for that alone.
 * Reported: the median over rounds of
 *     algbw = bytes / time,   busbw = algbw * 2 (n - 1) / n   (as nccl-tests define them:
 *     the bandwidth each rank's link needs for a ring allreduce, comparable across n),
 * and ratio = median of t(MPI) / t(nabla) per round (goal >= 0.95: nabla's blocking form is
 * MPI_Allreduce on a communication thread plus a hand-off and a deadline).
 * The buffers hold zeros, so repeated in-place sums stay finite.
 *
 * Usage: bench_allreduce [--min-kib N] [--max-mib N] [--rounds N] [--dtype f32|bf16]
 * Output: a table on rank 0, and lines `RESULT allreduce <bytes> <busbw> GB/s ratio=<x>`. */
#include <mpi.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/nabla.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The slowest rank's time for this round. */
static double slowest(double t) {
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return t;
}

int main(int argc, char **argv) {
    double min_kib = 4, max_mib = 256;
    int rounds_arg = 0;
    nb_dtype dt = NB_F32;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--max-mib") && i + 1 < argc) max_mib = atof(argv[++i]);
        else if (!strcmp(argv[i], "--min-kib") && i + 1 < argc) min_kib = atof(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds_arg = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            i++;
            dt = !strcmp(argv[i], "bf16") ? NB_BF16 : NB_F32;
        } else {
            fprintf(stderr, "usage: %s [--min-kib N] [--max-mib N] [--rounds N] [--dtype f32|bf16]\n",
                    argv[0]);
            return 2;
        }
    }
    nb_comm *world = nb_comm_world(); /* initializes MPI (with MPI_THREAD_MULTIPLE) */
    if (!world || strcmp(nb_comm_backend(world), "mpi") != 0) {
        fprintf(stderr, "bench_allreduce: needs MPI and a launcher (mpirun -np 2 %s): %s\n",
                argv[0], world ? "not started by mpirun" : nb_last_error());
        nb_comm_free(world);
        return 2;
    }
    int rank = nb_comm_rank(world), n = nb_comm_size(world);
    /* bf16 is compared with MPI's f32 allreduce of the same element count: MPI has no bf16,
     * nabla sums it in f32 (so the ratio shows the cost of the conversions). */
    MPI_Datatype mt = MPI_FLOAT;
    size_t es = nb_dtype_size(dt);
    if (rank == 0) {
        printf("allreduce (sum, %s) on %d ranks: nabla nb_allreduce vs MPI_Allreduce, median of "
               "rounds\n", nb_dtype_name(dt), n);
        printf("%10s %8s %12s %12s %12s %12s %8s\n", "bytes", "rounds", "nabla us", "nabla busbw",
               "mpi us", "mpi busbw", "ratio");
    }
    int fails = 0;
    for (double bytes = min_kib * 1024; bytes <= max_mib * 1048576.0 + 0.5; bytes *= 4) {
        int64_t count = (int64_t)(bytes / (double)es);
        int rounds = rounds_arg > 0 ? rounds_arg : bytes <= 1048576 ? 50 : bytes <= 16777216 ? 15 : 5;
        nb_tensor *t = nb_zeros(&count, 1, dt);
        float *raw = calloc((size_t)count, sizeof(float)); /* MPI's buffer for bf16 runs */
        void *mbuf = dt == NB_F32 ? nb_data(t) : raw;
        double *tn = malloc(sizeof(double) * (size_t)rounds * 3), *tm = tn + rounds,
               *ratio = tm + rounds;
        /* Warm-up: first-touch, connections, the communication thread, MPI's fast paths
         * (Open MPI sets up its shared-memory fast boxes after a few messages). */
        for (int k = 0; k < 5; k++) {
            nb_allreduce(world, t, NB_REDUCE_SUM);
            MPI_Allreduce(MPI_IN_PLACE, mbuf, (int)count, mt, MPI_SUM, MPI_COMM_WORLD);
        }
        size_t nbytes = (size_t)count * es;
        for (int r = 0; r < rounds; r++) {
            memset(nb_data(t), 0, nbytes);
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            if (nb_allreduce(world, t, NB_REDUCE_SUM) != NB_OK) {
                if (!fails++) fprintf(stderr, "rank %d: %s\n", rank, nb_last_error());
            }
            tn[r] = slowest(MPI_Wtime() - t0);
            memset(mbuf, 0, (size_t)count * sizeof(float));
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, mbuf, (int)count, mt, MPI_SUM, MPI_COMM_WORLD);
            tm[r] = slowest(MPI_Wtime() - t0);
            ratio[r] = tm[r] / tn[r];
        }
        double mn = median(tn, rounds), mm = median(tm, rounds), q = median(ratio, rounds);
        double bus = 2.0 * (n - 1) / n;
        if (rank == 0) {
            printf("%10.0f %8d %12.1f %10.2f GB %12.1f %10.2f GB %8.3f\n", bytes, rounds, mn * 1e6,
                   bytes / mn * bus / 1e9, mm * 1e6, bytes / mm * bus / 1e9, q);
            printf("RESULT allreduce %.0f %.3f GB/s ratio=%.3f\n", bytes, bytes / mn * bus / 1e9, q);
            fflush(stdout);
        }
        free(tn);
        free(raw);
        nb_tensor_free(t);
    }
    nb_comm_free(world);
    return fails ? 1 : 0;
}
