/* tensor/kernels/attention.h - private: arguments of the attention kernels. C17 and nvcc; included
 * through tensor/kernels.h. */
#ifndef NABLA_TENSOR_KERNELS_ATTENTION_H
#define NABLA_TENSOR_KERNELS_ATTENTION_H

#define NB__K_ATTENTION(X)

#endif
