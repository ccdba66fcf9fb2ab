/* tensor/kernels/conv.h - private: arguments of the conv kernels. C17 and nvcc; included
 * through tensor/kernels.h. */
#ifndef NABLA_TENSOR_KERNELS_CONV_H
#define NABLA_TENSOR_KERNELS_CONV_H

#define NB__K_CONV(X)

#endif
