/* tensor/kernels/norm.h - private: arguments of the norm kernels. C17 and nvcc; included
 * through tensor/kernels.h. */
#ifndef NABLA_TENSOR_KERNELS_NORM_H
#define NABLA_TENSOR_KERNELS_NORM_H

#define NB__K_NORM(X)

#endif
