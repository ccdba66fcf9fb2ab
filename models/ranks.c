/* ranks.c - thread sharing and scalar means over ranks for the bundled programs (ranks.h). */
#include "ranks.h"

#include <math.h>
#include <stdlib.h>

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
