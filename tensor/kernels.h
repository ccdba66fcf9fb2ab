/* tensor/kernels.h - private: what a kernel receives. Read by C17 (op definitions, cpu/) and
 * by nvcc (the .cu files of cuda/), so it holds plain structs only: no _Noreturn, no stdatomic.h, no
 * function definitions, no nb_tensor (kernels see pointers and geometry, never tensors).
 *
 * Every kernel has the signature `nb_status kernel(const ARGS *a)`. The list of kernels,
 * NB__KERNELS(X), is assembled from one list per op family (tensor/kernels/<family>.h),
 * each entry X(name, ARGS, "what it computes"). tensor/backend.h turns the list into the
 * kernel table (one typed function pointer per entry) and into one checked entry point
 * per kernel, nb__run_<name>(dev, op, &args). Adding a kernel: one line in its family's
 * list (and its args struct there), one function per backend. */
#ifndef NABLA_TENSOR_KERNELS_H
#define NABLA_TENSOR_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nabla/status.h"
#include "nabla/tensor.h"
#include "tensor/op_table.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- elementwise iterator geometry ------------------------------------------------------
 * Several operands of one shape (operand 0 is usually the output) with per-operand byte
 * strides, dims coalesced where every operand is contiguous across them (nb__iter_init in
 * tensor/iter.c builds it). data[] are device pointers of the operands' device. */
#define NB__ITER_MAX_ARGS 4

typedef struct nb__iter {
    int nargs;
    int ndim; /* >= 1 after setup */
    int64_t numel;
    int64_t shape[NB_MAX_DIMS];
    int64_t strides[NB__ITER_MAX_ARGS][NB_MAX_DIMS]; /* bytes */
    char *data[NB__ITER_MAX_ARGS];
    nb_dtype dtype[NB__ITER_MAX_ARGS];
} nb__iter;

/* A strided view of one operand, for kernels that are not elementwise: device pointer,
 * dtype and geometry in elements. */
typedef struct nb__view {
    char *data;
    nb_dtype dtype;
    int ndim;
    int64_t shape[NB_MAX_DIMS];
    int64_t strides[NB_MAX_DIMS];
} nb__view;

#ifdef __cplusplus
}
#endif

/* The families, each adding its args structs and its NB__K_<FAMILY>(X) list. */
#include "tensor/kernels/core.h"
#include "tensor/kernels/reduce.h"
#include "tensor/kernels/index.h"
#include "tensor/kernels/matmul.h"
#include "tensor/kernels/norm.h"
#include "tensor/kernels/attention.h"
#include "tensor/kernels/conv.h"
#include "tensor/kernels/loss.h"
#include "tensor/kernels/optim.h"
#include "tensor/kernels/random.h"
#include "tensor/kernels/lm.h"

#define NB__KERNELS(X)                                                                     \
    NB__K_CORE(X)                                                                          \
    NB__K_REDUCE(X)                                                                        \
    NB__K_INDEX(X)                                                                         \
    NB__K_MATMUL(X)                                                                        \
    NB__K_NORM(X)                                                                          \
    NB__K_ATTENTION(X)                                                                     \
    NB__K_CONV(X)                                                                          \
    NB__K_LOSS(X)                                                                          \
    NB__K_OPTIM(X)                                                                         \
    NB__K_RANDOM(X)                                                                        \
    NB__K_LM(X)

#endif
