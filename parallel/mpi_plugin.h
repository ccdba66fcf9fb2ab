/* mpi_plugin.h - private: the boundary between libnabla.so and its MPI backend plugin,
 * libnabla-mpi.so (docs/embedding.md "The MPI plugin").
 *
 * The shared libnabla links no MPI library: a program that never asks for a world
 * communicator under a launcher maps no Open MPI, hwloc or libevent. The backend
 * (comm_mpi.c, comm_mpi_ctl.c, comm_mpi_small.c) is built twice:
 *   - into libnabla.a, called directly: a static program links MPI itself (pkg-config
 *     --static names it), as the tests and the bundled programs do;
 *   - into libnabla-mpi.so, next to libnabla.so, which comm_mpi_load.c opens on the first
 *     nb_comm_world() that wants MPI (comm_registry.c).
 * The plugin links libnabla.so (so it shares its one copy of the library's state: errors,
 * handles, communicators) and MPI; it exports only NB__MPI_PLUGIN_ENTRY (hidden visibility
 * for the rest, so its nb__comm_mpi_* never bind to the loader's forwarding functions of the
 * same names). Both sides check the ABI number, the nabla version and the struct sizes they
 * share. */
#ifndef NABLA_MPI_PLUGIN_H
#define NABLA_MPI_PLUGIN_H

#include <stdbool.h>
#include <stddef.h>

#include "parallel/parallel_impl.h"

#define NB__MPI_PLUGIN_ABI 1
#define NB__MPI_PLUGIN_NAME "libnabla-mpi.so"
#define NB__MPI_PLUGIN_ENV "NB_MPI_PLUGIN"
#define NB__MPI_PLUGIN_ENTRY "nb__mpi_plugin_init"

/* What the plugin hands over: parallel_impl.h's three MPI entry points. */
typedef struct nb__mpi_plugin {
    unsigned abi;
    size_t size;           /* sizeof(nb__mpi_plugin) as the plugin was built */
    const char *version;   /* NB_VERSION_STRING */
    size_t comm_size, work_size; /* sizeof(nb_comm), sizeof(nb_work) */
    nb_comm *(*world)(void);
    bool (*initialized)(void);
    int (*local_rank)(int *local_size);
} nb__mpi_plugin;

typedef const nb__mpi_plugin *(*nb__mpi_plugin_init_fn)(void);

#endif
