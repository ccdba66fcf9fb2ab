/* runtime.c - the thread pool size (shared by our kernels, oneDNN and OpenBLAS), the
 * library version, and which optional parts were built in. */
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#include "nb_config.h"
#include "nabla/runtime.h"
#include "tensor/error.h"
#include "cpu/blas_dl.h"
#include "cpu/cpu_impl.h"

const char *nb_version(void) { return NB_VERSION_STRING; }

int nb_version_number(void) {
    return NB_VERSION_MAJOR * 10000 + NB_VERSION_MINOR * 100 + NB_VERSION_PATCH;
}

void nb_set_num_threads(int n) {
#ifdef _OPENMP
    if (n <= 0) n = omp_get_num_procs();
    omp_set_num_threads(n);
#else
    if (n <= 0) n = 1;
#endif
    /* Debian's OpenMP build of OpenBLAS runs on the same libgomp pool; this keeps its own
     * idea of the count in step (a pthread build would otherwise start its own threads).
     * Not loaded yet: cpu/blas_dl.c hands it the count when it loads it. */
    const nb__blas_fns *b = nb__blas_loaded();
    if (b && b->set_num_threads) b->set_num_threads(n);
}

int nb_get_num_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

bool nb_has_cuda(void) { return NB_HAVE_CUDA; }
bool nb_has_mpi(void) { return NB_HAVE_MPI; }
bool nb_has_nccl(void) { return NB_HAVE_NCCL; }
