/* cpu/pool.h - private to cpu/: the CPU kernels of 2-D max, average and adaptive average
 * pooling (cpu/pool.c), forward and backward, f32 and f64, registered as the pool entries
 * of the conv family (tensor/kernels/conv.h) by nb__cpu_register_conv (cpu/conv.c).
 *
 * Every tensor is seen as `planes` contiguous (H, W) planes (planes = N*C); work is split
 * over planes with OpenMP, and each plane is done by one thread in a fixed order, so
 * results (including the backward's sums over overlapping windows) do not depend on the
 * thread count. */
#ifndef NABLA_CPU_POOL_H
#define NABLA_CPU_POOL_H

#include "tensor/backend.h"

/* Fill k's maxpool2d, avgpool2d, adaptive_avgpool2d entries (and their _backward). */
void nb__cpu_register_pool(nb__kernels *k);

#endif
