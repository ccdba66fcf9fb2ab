/* prog.h - small helpers the bundled programs (mlp, cnn: models/common.c; gpt) share:
 * timing, medians, ETA text, error lines that name the rank, how many threads each rank
 * gets, and scalar means over ranks. Public API only.
 *
 *     nb_comm *world = nb_comm_world();
 *     nbm_set_threads(world, requested);          // 0: the cores shared out among local ranks
 *     double loss = nbm_mean_over_ranks(world, local_loss);
 *     nbm_report("gpt", rank, size, "step %d: %s", step, nb_last_error());
 *
 * The communicator is borrowed. */
#ifndef NBM_PROG_H
#define NBM_PROG_H

#include <stddef.h>
#include <stdint.h>

#include <nabla/nabla.h>

/* Seconds on the monotonic clock. */
double nbm_now_s(void);
/* Median of v[n] (sorts v); NAN for n == 0. */
double nbm_median(double *v, int64_t n);
/* "h:mm:ss" of s seconds (negative or non-finite: 0). */
void nbm_fmt_eta(double s, char *buf, size_t n);
/* Print "prog: message" to stderr, or "prog (rank r): message" when size > 1, in one write,
 * so the lines of ranks failing together do not interleave. */
void nbm_report(const char *prog, int rank, int size, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Ranks sharing this machine, from the launcher's environment (Open MPI, MPICH, Slurm);
 * world_size when none says. */
int nbm_local_ranks(int world_size);
/* Set the thread count: `requested` when > 0; otherwise all cores alone, or the cores
 * divided among the ranks on this machine (at least 1), so ranks do not oversubscribe. */
void nbm_set_threads(nb_comm *world, int requested);
/* The mean of v over the ranks (v itself on one rank); NAN if the allreduce failed. */
double nbm_mean_over_ranks(nb_comm *world, double v);

#endif
