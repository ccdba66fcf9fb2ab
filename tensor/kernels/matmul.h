/* tensor/kernels/matmul.h - private: arguments of the matmul kernels. C17 and nvcc; included
 * through tensor/kernels.h. */
#ifndef NABLA_TENSOR_KERNELS_MATMUL_H
#define NABLA_TENSOR_KERNELS_MATMUL_H

#define NB__K_MATMUL(X)

#endif
