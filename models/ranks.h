/* ranks.h - small helpers the bundled programs share for running under mpirun: how many
 * threads each rank gets, and scalar means over the ranks. Public API only.
 *
 *     nb_comm *world = nb_comm_world();
 *     nbm_set_threads(world, requested);          // 0: the cores shared out among local ranks
 *     double loss = nbm_mean_over_ranks(world, local_loss);
 *
 * The communicator is borrowed. */
#ifndef NBM_RANKS_H
#define NBM_RANKS_H

#include <nabla/nabla.h>

/* Ranks sharing this machine, from the launcher's environment (Open MPI, MPICH, Slurm);
 * world_size when none says. */
int nbm_local_ranks(int world_size);
/* Set the thread count: `requested` when > 0; otherwise all cores alone, or the cores
 * divided among the ranks on this machine (at least 1), so ranks do not oversubscribe. */
void nbm_set_threads(nb_comm *world, int requested);
/* The mean of v over the ranks (v itself on one rank); NAN if the allreduce failed. */
double nbm_mean_over_ranks(nb_comm *world, double v);

#endif
