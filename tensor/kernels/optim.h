/* tensor/kernels/optim.h - private: arguments of the optim kernels. C17 and nvcc; included
 * through tensor/kernels.h. */
#ifndef NABLA_TENSOR_KERNELS_OPTIM_H
#define NABLA_TENSOR_KERNELS_OPTIM_H

#define NB__K_OPTIM(X)

#endif
