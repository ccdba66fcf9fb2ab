/* tensor/kernels/index.h - private: arguments of the index kernels. C17 and nvcc; included
 * through tensor/kernels.h. */
#ifndef NABLA_TENSOR_KERNELS_INDEX_H
#define NABLA_TENSOR_KERNELS_INDEX_H

#define NB__K_INDEX(X)

#endif
