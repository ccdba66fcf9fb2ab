// tests/cuda_host/core.cu - host checks of the core family's __host__ __device__ math
// (cuda/k_core.cu), compiled by nvcc and compared with the CPU backend. No GPU needed.
#include "cuhost.h"
#include "tensor/backend_table.h"

void cuhost_core(cuhost *t) {
    // the reference table is reachable and complete for this family
    const nb__kernels *cpu = cuhost_cpu();
    CUHOST_CHECK(t, cpu && cpu->ew && cpu->copy && cpu->fill, "CPU core kernels missing");
}
