// tests/cuda_host/optim.cu - host checks of the optim family's __host__ __device__ math
// (cuda/k_optim.cu), compiled by nvcc and compared with the CPU backend. No GPU needed.
#include "cuhost.h"

void cuhost_optim(cuhost *t) { (void)t; }
