/* tensor/kernels/loss.h - private: arguments of the loss kernels. C17 and nvcc; included
 * through tensor/kernels.h. */
#ifndef NABLA_TENSOR_KERNELS_LOSS_H
#define NABLA_TENSOR_KERNELS_LOSS_H

#define NB__K_LOSS(X)

#endif
