/* comm_registry.c - the one place that names the communicator backends (comm_self.c,
 * comm_mpi*.c): which one serves the world communicator. Like tensor/registry.c for the
 * kernel backends, it keeps the dependency graph acyclic: the backends use comm.c's
 * communicator and work objects, and comm.c never calls a backend by name. */
#include "nabla/trace.h"
#include "nb_config.h"
#include "parallel/parallel_impl.h"

nb_comm *nb_comm_self(void) {
    return nb__comm_alloc(&nb__comm_self_backend, 0, 1, NULL);
}

/* The world's rank names this process in traces and profiles (pid, file names). */
static nb_comm *world(void) {
#if NB_HAVE_MPI
    if (nb__comm_mpi_wanted()) return nb__comm_mpi_world();
#endif
    nb_comm *c = nb_comm_self();
    if (c) c->is_world = true;
    return c;
}

nb_comm *nb_comm_world(void) {
    nb_comm *c = world();
    if (c) nb_trace_set_rank(c->rank, c->size);
    return c;
}
