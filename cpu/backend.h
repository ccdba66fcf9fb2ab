/* cpu/backend.h - private: the CPU backend as the registry sees it, and the registration
 * function of each kernel family (each in its family's file in cpu/). Only
 * tensor/registry.c and cpu/ include this. */
#ifndef NABLA_CPU_BACKEND_H
#define NABLA_CPU_BACKEND_H

#include "tensor/backend.h"

/* The CPU backend (its kernel table filled on first use). Never NULL. */
const nb__backend *nb__cpu_backend(void);
/* The guard backend for tests: host memory kept PROT_NONE except while one of its
 * backend calls runs, computing with the CPU kernels (cpu/guard.c). */
const nb__backend *nb__guard_backend(void);
/* Tests: how often each guard kernel ran since the start, in NB__KERNELS order (the order of
 * nb__kernel_infos), into out[0..n). tests/test_backend.c finds the kernels the bundled
 * models use this way. */
void nb__guard_kernel_calls(unsigned long *out, int n);
/* Tests: copies from guard memory to the host since the start (each would be a device
 * synchronization on a GPU). */
unsigned long nb__guard_host_reads(void);

/* Each family fills its entries of the table. */
void nb__cpu_register_core(nb__kernels *k);      /* cpu/elementwise.c */
void nb__cpu_register_convert(nb__kernels *k);   /* cpu/convert.c (called by _core) */
void nb__cpu_register_reduce(nb__kernels *k);    /* cpu/reduce.c */
void nb__cpu_register_index(nb__kernels *k);     /* cpu/index.c */
void nb__cpu_register_matmul(nb__kernels *k);    /* cpu/gemm.c */
void nb__cpu_register_norm(nb__kernels *k);      /* cpu/norm.c */
void nb__cpu_register_attention(nb__kernels *k); /* cpu/attention.c */
void nb__cpu_register_conv(nb__kernels *k);      /* cpu/conv.c, cpu/pool.c */
void nb__cpu_register_loss(nb__kernels *k);      /* cpu/loss.c */
void nb__cpu_register_optim(nb__kernels *k);     /* cpu/optim_kernels.c */
void nb__cpu_register_random(nb__kernels *k);    /* cpu/random.c */
void nb__cpu_register_lm(nb__kernels *k);        /* cpu/lm.c */

#endif
