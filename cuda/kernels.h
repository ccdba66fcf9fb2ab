/* cuda/kernels.h - private to the CUDA plugin: what every kernel file of cuda/ shares on the
 * C/C++ boundary (C17 and nvcc alike, every declaration extern "C").
 *
 * The kernel table. cuda/backend.c owns the backend (nb__backend) and fills its kernel
 * table once, by calling one registration function per kernel family; each family file
 * (cuda/k_<family>.cu, named after tensor/kernels/<family>.h) sets the entries it
 * implements and the backend's flags (gemm_bf16, ...) that go with them:
 *
 *     extern "C" void nb__cuda_reg_norm(nb__backend *be) {
 *         be->k.layer_norm = cuda_layer_norm;
 *         be->k.layer_norm_backward = cuda_layer_norm_backward;
 *     }
 *
 * The kernel's device and stream. A kernel receives only its argument struct (pointers and
 * geometry, tensor/kernels.h), not the device. The core looks the backend up for the
 * operands' device right before every kernel call (nb__run_<name> -> nb__backend_of ->
 * nb__cuda_backend), and nb__cuda_backend notes that device for the calling thread; a
 * kernel entry point brackets its launches with nb__cuda_kbegin / nb__cuda_kend, which make
 * that device current and hand out the thread's current stream on it:
 *
 *     static nb_status cuda_layer_norm(const nb__layer_norm_args *a) {
 *         nb__cuda_kctx c;
 *         nb_status st = nb__cuda_kbegin(&c, "layer_norm");
 *         if (st != NB_OK) return st;
 *         layer_norm_f32<<<grid, block, 0, c.stream>>>(...);
 *         return nb__cuda_kend(&c, cudaGetLastError());
 *     }
 *
 * Kernels do arithmetic only (docs/architecture.md rule 1): the op definitions have
 * checked shapes, dtypes and devices before the call. No kernel synchronizes the device or
 * its stream; none reads device memory back to the host (index checks are the core's, on
 * the host, before upload). */
#ifndef NABLA_CUDA_KERNELS_H
#define NABLA_CUDA_KERNELS_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "nabla/status.h"
#include "tensor/backend_table.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Set the thread's last error (tensor/error.h, which nvcc cannot read: it uses _Noreturn). */
nb_status nb__error(nb_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* One registration function per kernel family (tensor/kernels/<family>.h). */
void nb__cuda_reg_core(nb__backend *be);      /* k_core.cu: copy, fill, ew, ew_backward */
void nb__cuda_reg_reduce(nb__backend *be);    /* k_reduce.cu */
void nb__cuda_reg_index(nb__backend *be);     /* k_index.cu */
void nb__cuda_reg_matmul(nb__backend *be);    /* k_matmul.c (cuBLASLt) */
void nb__cuda_reg_norm(nb__backend *be);      /* k_norm.cu */
void nb__cuda_reg_attention(nb__backend *be); /* k_attention.cu */
void nb__cuda_reg_conv(nb__backend *be);      /* k_conv.cu (cuDNN or im2col + GEMM), pooling */
void nb__cuda_reg_loss(nb__backend *be);      /* k_loss.cu */
void nb__cuda_reg_optim(nb__backend *be);     /* k_optim.cu (also clipping, amp_unscale) */
void nb__cuda_reg_random(nb__backend *be);    /* k_random.cu */
void nb__cuda_reg_lm(nb__backend *be);        /* k_lm.cu: RMSNorm, rotary, SwiGLU */

/* The device the next kernel of this thread runs on: set by nb__cuda_backend (the core's
 * backend lookup for the operands' device, made right before each kernel call). */
void nb__cuda_set_kernel_device(int device);
int nb__cuda_kernel_device(void);

/* A kernel call's context: the device made current (prev restored by nb__cuda_kend) and
 * the stream to launch on (the thread's current stream for that device). */
typedef struct nb__cuda_kctx {
    cudaStream_t stream;
    int device;
    int prev;         /* device current before; -1 when unchanged */
    const char *what; /* the kernel's name, for messages */
} nb__cuda_kctx;

/* Enter the kernel device and pick its stream; an error status (and *c unusable) on
 * failure. */
nb_status nb__cuda_kbegin(nb__cuda_kctx *c, const char *what);
/* Leave: restore the previous device and turn e (cudaGetLastError() after the launches, or
 * the first failure) into a status. Call exactly once after a successful kbegin. */
nb_status nb__cuda_kend(nb__cuda_kctx *c, cudaError_t e);
/* Scratch device memory for one kernel call, on c's device (the caching allocator; NULL and
 * an error when out of memory). Free it with nb__cuda_kfree after the launches that use it
 * are enqueued: the allocator reuses the block on the same stream only after them. */
void *nb__cuda_kscratch(nb__cuda_kctx *c, size_t nbytes);
void nb__cuda_kfree(void *p);
/* After a failed nb__cuda_kscratch: leave the context (as nb__cuda_kend) and return the
 * allocator's error, whose message (sizes, cache state) stays the last error. */
nb_status nb__cuda_kfail(nb__cuda_kctx *c);

/* The device error flag (cuda/kerr.c): a kernel that finds a bad index skips it and
 * records the first one here (device code: nb_kerr_report in cuda/kcommon.cuh); the next
 * synchronization the program makes anyway (a copy to the host, nb_cuda_synchronize) fails
 * with NB_EINDEX and this record's message. kernel: the index in NB__KERNELS order
 * (NB__CUDA_K_<name>). In mapped pinned host memory, one per device. */
typedef struct nb__cuda_kerr {
    unsigned int set; /* 0: no error; set by the first reporter (atomicCAS) */
    int kernel;
    int dim;
    long long value, bound;
} nb__cuda_kerr;
enum {
#define NB__CUDA_K_ENUM(name, Args, what) NB__CUDA_K_##name,
    NB__KERNELS(NB__CUDA_K_ENUM)
#undef NB__CUDA_K_ENUM
    NB__CUDA_K_COUNT
};
/* The record of device (created on first use); NULL and an error when it cannot be. */
nb__cuda_kerr *nb__cuda_kerr_of(int device);
/* After a synchronization of device: NB_OK, or NB_EINDEX ("what: a CUDA kernel found a bad
 * index: ...") once per recorded error, which is then cleared. */
nb_status nb__cuda_kerr_check(int device, const char *what);

/* Limits the launch helpers respect (cudaDeviceProp of c's device, read once per device). */
typedef struct nb__cuda_devinfo {
    int sm_count;
    int max_threads_per_block;
    size_t smem_per_block_optin; /* bytes of dynamic shared memory a block may opt in to */
    int cc_major, cc_minor;
} nb__cuda_devinfo;
const nb__cuda_devinfo *nb__cuda_devinfo_of(int device);

#ifdef __cplusplus
}
#endif
#endif
