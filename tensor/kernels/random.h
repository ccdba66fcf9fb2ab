/* tensor/kernels/random.h - private: arguments of the random kernels. C17 and nvcc; included
 * through tensor/kernels.h. */
#ifndef NABLA_TENSOR_KERNELS_RANDOM_H
#define NABLA_TENSOR_KERNELS_RANDOM_H

#define NB__K_RANDOM(X)

#endif
