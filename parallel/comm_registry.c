/* comm_registry.c - the one place that names the communicator backends (comm_self.c,
 * comm_mpi*.c or their plugin through comm_mpi_load.c, comm_nccl.c): which one serves the
 * world communicator, and which one moves a collective's tensors (nb__comm_route). Like
 * tensor/registry.c for the kernel backends, it keeps the dependency graph acyclic: the
 * backends use comm.c's communicator and work objects, and comm.c never calls a backend by
 * name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/trace.h"
#include "nb_config.h"
#include "parallel/parallel_impl.h"

nb_comm *nb_comm_self(void) {
    return nb__comm_alloc(&nb__comm_self_backend, 0, 1, NULL);
}

#if NB_HAVE_MPI
/* Whether nb_comm_world should use MPI: NB_COMM_MPI=1 (0: never), MPI already initialized
 * (by the program), or a launcher's environment. Only then is the MPI plugin loaded (a shared
 * libnabla: parallel/mpi_plugin.h). */
static bool mpi_wanted(void) {
    const char *force = getenv("NB_COMM_MPI");
    if (force && *force) return strcmp(force, "0") != 0;
    /* Open MPI's mpirun, PMIx (srun --mpi=pmix, prterun), PMI-1/2 (srun --mpi=pmi2, MPICH's
     * hydra). A plain srun without an MPI plugin starts independent singletons anyway. */
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                                 "PMI_FD", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return true;
    return nb__comm_mpi_initialized();
}
#endif

/* The world's rank names this process in traces and profiles (pid, file names). */
static nb_comm *world(void) {
#if NB_HAVE_MPI
    if (mpi_wanted()) return nb__comm_mpi_world();
#endif
    nb_comm *c = nb_comm_self();
    if (c) c->is_world = true;
    return c;
}

int nb_comm_local_rank(void) {
#if NB_HAVE_MPI
    return nb__comm_mpi_local_rank(NULL);
#else
    return 0;
#endif
}

nb_comm *nb_comm_world(void) {
    nb_comm *c = world();
    if (c) nb_trace_set_rank(c->rank, c->size);
    return c;
}

/* NB_COMM_NCCL: "0" never use NCCL, "1" always (an error when it cannot), otherwise (unset,
 * "auto") whenever the CUDA plugin has NCCL. */
static int nccl_mode(void) {
    const char *s = getenv("NB_COMM_NCCL");
    if (s && strcmp(s, "0") == 0) return 0;
    if (s && strcmp(s, "1") == 0) return 1;
    return 2;
}

/* CUDA tensors go to NCCL, so DDP, ZeRO and the tensor-parallel layers, which only call the
 * collectives, use it without knowing: the device of the tensors picks the backend. Every
 * rank must therefore pass tensors of the same kind to one collective (all CUDA, or all
 * host), as it passes tensors of the same shape. Not routed: send/recv (NCCL matches no
 * tags, and a send blocks its stream until the peer receives, where MPI's does not),
 * barriers (no tensor), and collectives whose two tensors are on different devices. */
nb_comm *nb__comm_route(nb_comm *c, nb__coll kind, const nb_tensor *t, const nb_tensor *u,
                        const char *op) {
    if (c->size < 2 || c->be->device_buffers || nb__coll_is_p2p(kind) ||
        kind == NB__COLL_BARRIER)
        return c;
    nb_device d = nb__device_of(t);
    if (d.type != NB_DEVICE_CUDA || (u && !nb_device_equal(nb__device_of(u), d))) return c;
    int mode = nccl_mode();
    if (mode == 0) return c;
    int have = nb__comm_nccl_available();
    if (have <= 0) {
        if (mode == 2) {
            nb_clear_error();
            return c; /* through host memory, as without NCCL */
        }
        char why[NB__COMM_MSG];
        snprintf(why, sizeof why, "%s", have < 0 ? nb_last_error() : "it was built with "
                 "-Dnccl=disabled or without NCCL installed");
        nb__error(NB_EUNSUPPORTED, "%s: NB_COMM_NCCL=1 but the CUDA plugin has no NCCL (%s); "
                  "unset NB_COMM_NCCL to move CUDA tensors through host memory", op, why);
        return NULL;
    }
    return nb__comm_nccl_of(c, d.index, op);
}
