/* tensor/kernels/reduce.h - private: arguments of the reduce kernels. C17 and nvcc; included
 * through tensor/kernels.h. */
#ifndef NABLA_TENSOR_KERNELS_REDUCE_H
#define NABLA_TENSOR_KERNELS_REDUCE_H

#define NB__K_REDUCE(X)

#endif
