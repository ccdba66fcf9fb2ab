/* comm_mpi_plugin.c - the entry point of libnabla-mpi.so (parallel/mpi_plugin.h): hands the
 * MPI backend's three entry points to libnabla.so's loader (comm_mpi_load.c). Only in the
 * plugin; libnabla.a calls the backend directly. */
#include "nb_config.h"
#include "parallel/mpi_plugin.h"

__attribute__((visibility("default"))) const nb__mpi_plugin *nb__mpi_plugin_init(void);

static const nb__mpi_plugin g_plugin = {
    .abi = NB__MPI_PLUGIN_ABI,
    .size = sizeof(nb__mpi_plugin),
    .version = NB_VERSION_STRING,
    .comm_size = sizeof(nb_comm),
    .work_size = sizeof(nb_work),
    .world = nb__comm_mpi_world,
    .initialized = nb__comm_mpi_initialized,
    .local_rank = nb__comm_mpi_local_rank,
};

const nb__mpi_plugin *nb__mpi_plugin_init(void) { return &g_plugin; }
