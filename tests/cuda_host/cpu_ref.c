/* tests/cuda_host/cpu_ref.c - the CPU backend's kernel table for the nvcc-compiled host checks
 * (gcc compiles this file: cpu/backend.h is C17 only). The checks fill an nb__*_args struct
 * with host buffers and run the CPU kernel on it as the reference:
 *     cuhost_cpu()->layer_norm(&args)
 * CPU kernels may use OpenMP threads; they return NB_OK or an error status. */
#include "cpu/backend.h"
#include "cuhost.h"

const nb__kernels *cuhost_cpu(void) { return &nb__cpu_backend()->k; }
