/* tensor/backend_table.h - private: the kernel table and the backend struct (see
 * tensor/backend.h for what a backend is and how ops reach it). Split out of backend.h so
 * that nvcc can read it: the CUDA kernel files (cuda/k_*.cu) fill the CUDA backend's table
 * (cuda/kernels.h), while backend.h's entry points use C17-only constructs (_Generic). */
#ifndef NABLA_TENSOR_BACKEND_TABLE_H
#define NABLA_TENSOR_BACKEND_TABLE_H

#include "tensor/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The kernel table: one typed pointer per kernel, so a registration with the wrong
 * prototype fails to compile. */
typedef struct nb__kernels {
#define NB__KERNEL_FIELD(name, Args, what) nb_status (*name)(const Args *a);
    NB__KERNELS(NB__KERNEL_FIELD)
#undef NB__KERNEL_FIELD
} nb__kernels;

/* Names and offsets of the table's entries, in NB__KERNELS order (tests walk the table). */
typedef struct nb__kernel_info {
    const char *name;
    const char *what;
    size_t offset; /* of the function pointer in nb__kernels */
} nb__kernel_info;
extern const nb__kernel_info nb__kernel_infos[];
extern const int nb__kernel_count;
/* The entry at info->offset of k, as an untyped pointer (NULL when missing). */
const void *nb__kernel_at(const nb__kernels *k, const nb__kernel_info *info);

typedef struct nb__backend {
    const char *name;      /* "cpu", "cuda", "meta", "guard": used in messages */
    bool has_storage;      /* false for meta: tensors have no memory, kernels do not run */
    bool host_accessible;  /* the host may dereference its memory (nb_data, printing) */
    bool gemm_bf16;        /* its gemm kernel takes bf16 a and b with an f32 c (matmul.h) */
    bool conv_bf16;        /* its conv2d kernels take NB_BF16 (kernels/conv.h) */
    bool attention_bf16;   /* its attention kernels take bf16 operands (kernels/attention.h) */
    bool ew_half_in_f32;   /* its ew kernel takes f16/bf16 inputs of an f32 op as they are,
                            * widened as it reads them (kernels/core.h) */
    bool pool_relu;        /* its maxpool2d kernel takes nb__pool2d_args.relu (kernels/conv.h) */
    /* nbytes of device memory (NULL + error when out of memory or no device). nbytes 0
     * still returns a unique non-NULL pointer. */
    void *(*alloc)(nb_device dev, size_t nbytes);
    void (*free)(nb_device dev, void *p);
    /* Byte copies between host memory and the device's memory; they complete before
     * returning. */
    nb_status (*to_host)(nb_device dev, void *host_dst, const void *src, size_t nbytes);
    nb_status (*from_host)(nb_device dev, void *dst, const void *host_src, size_t nbytes);
    /* Mark the block at p as used by the calling thread's current stream of dev, so that
     * freeing it from another thread waits for that work (nb_record_stream); NULL for
     * backends without streams (the CPU, guard, meta: nothing to do). */
    nb_status (*record_use)(nb_device dev, void *p);
    /* Page-locked host memory that transfers to and from dev are fast from (CUDA's pinned
     * memory: cudaHostAlloc), for buffers a loader fills on the host; NULL for backends
     * without such memory. host_alloc gives NULL and an error on failure. */
    void *(*host_alloc)(nb_device dev, size_t nbytes);
    void (*host_free)(nb_device dev, void *p);
    nb__kernels k;
} nb__backend;

#ifdef __cplusplus
}
#endif
#endif
