/* cuda_impl.h - private to the CUDA plugin (cuda/, not loader.c): the stream struct, CUDA
 * error mapping, the per-thread state shared by device.c, stream.c, alloc.c and blas.c,
 * and the extern "C" launchers of the .cu kernels.
 *
 * This header is the C/C++ boundary: it is included by the C17 sources (gcc) and by the
 * .cu files (nvcc, C++), so it uses only what both languages accept (no stdatomic.h, no
 * tensor_impl.h) and wraps every declaration in extern "C". Only CUDA builds compile it. */
#ifndef NABLA_CUDA_IMPL_H
#define NABLA_CUDA_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "cuda/plugin.h"
#include "nabla/cuda.h"
#include "nabla/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Devices beyond this index are not used (per-thread tables are sized by it). */
#define NB__CUDA_MAX_DEVICES 64

struct nb_cuda_stream {
    cudaStream_t handle;
    int device;
    uint64_t id;  /* unique for the process, never reused; 0 means "no stream" */
    bool owned;   /* false for the library's per-thread streams */
};

/* ---- device.c ------------------------------------------------------------------------------ */
/* Check that a GPU is usable and resolve device (-1: current) to an index in *out. Sets
 * NB_EDEVICE naming `what` ("cuda_alloc: no usable GPU: ...", "cuda_alloc: device 3 does
 * not exist (this machine has 1 GPU)") and returns it otherwise. */
nb_status nb__cuda_resolve(int device, int *out, const char *what);
/* Make device current for a while: *prev receives the previous device, to hand to
 * nb__cuda_leave. Both are cheap when device is already current. */
nb_status nb__cuda_enter(int device, int *prev, const char *what);
void nb__cuda_leave(int prev);
/* Turn a failed CUDA runtime call into an nb_status and message "what: <CUDA's text>"
 * (NB_ENOMEM for out-of-memory, NB_EINVAL for invalid values, NB_EDEVICE otherwise); clears
 * CUDA's non-sticky last error. cudaSuccess gives NB_OK. */
nb_status nb__cuda_status(cudaError_t e, const char *what);
/* The CUDA runtime as cuda/policy.c calls it. */
struct nb__cuda_rt;
extern const struct nb__cuda_rt nb__cuda_rt_real;

/* ---- stream.c ------------------------------------------------------------------------------ */
/* This thread's current stream for a resolved device index; creates the library stream on
 * first use. NULL and an error on failure. */
nb_cuda_stream *nb__cuda_stream_for(int device, const char *what);
/* s itself, or for NULL the current stream of the current device; NULL and an error when
 * no GPU is usable. */
nb_cuda_stream *nb__cuda_stream_or_current(nb_cuda_stream *s, const char *what);
/* Work enqueued on waiter from now on waits for the work enqueued on signaler so far (an
 * event); both resolved streams. */
nb_status nb__cuda_join(nb_cuda_stream *waiter, nb_cuda_stream *signaler, const char *what);

/* Per-thread handles other files keep per device; stream.c owns the thread-exit cleanup,
 * which destroys the cuBLAS handles before the streams they are bound to. */
typedef struct nb__cuda_thread {
    nb_cuda_stream *library[NB__CUDA_MAX_DEVICES]; /* created on first use */
    nb_cuda_stream *current[NB__CUDA_MAX_DEVICES]; /* NULL: the library stream */
    /* the COMM and COPY role streams (nb_cuda_stream_role), created on first use */
    nb_cuda_stream *role[2][NB__CUDA_MAX_DEVICES];
    void *blas[NB__CUDA_MAX_DEVICES];              /* cublasHandle_t, see blas.c */
    void *blaslt[NB__CUDA_MAX_DEVICES];            /* cuBLASLt state, see k_matmul.c */
    void *cudnn[NB__CUDA_MAX_DEVICES];             /* cudnnHandle_t, see cudnn.c */
} nb__cuda_thread;
/* This thread's state (allocated on first use); NULL only when out of host memory. */
nb__cuda_thread *nb__cuda_thread_state(void);

/* Lifecycle hooks, so stream.c names no other file (the allocator and cuBLAS register
 * themselves at load time, before any stream exists):
 *   - stream observers learn of every stream created (added: false means out of host
 *     memory, and the stream is not created) and retired (after it was synchronized);
 *   - thread-exit hooks run when a thread with CUDA state ends, before its library streams
 *     are destroyed (cuBLAS handles are bound to them). */
typedef bool (*nb__cuda_stream_added_fn)(const nb_cuda_stream *s);
typedef void (*nb__cuda_stream_retired_fn)(const nb_cuda_stream *s);
typedef void (*nb__cuda_thread_exit_fn)(nb__cuda_thread *t);
void nb__cuda_stream_observe(nb__cuda_stream_added_fn added, nb__cuda_stream_retired_fn retired);
void nb__cuda_on_thread_exit(nb__cuda_thread_exit_fn fn);

/* ---- alloc.c ------------------------------------------------------------------------------- */
/* The allocator observes streams (nb__cuda_stream_observe): a cached block tied to a live
 * stream is reused by other streams only when that stream is idle; retiring a stream
 * (after synchronizing it) makes its cached blocks free for every stream. */

/* ---- blas.c -------------------------------------------------------------------------------- */
/* cuBLAS handles live in nb__cuda_thread.blas, destroyed by a thread-exit hook. */
/* nb__cuda_gemm_f32 (declared in cuda/plugin.h) is implemented here. */

/* ---- launch.c: checked entry points for the kernels of kernels_basic.cu ---------------------- */
/* nb__cuda_fill_f32 and nb__cuda_add_f32 are declared in cuda/plugin.h. */

/* ---- kernels_basic.cu: raw launchers (no checks; the stream's device must be current) --- */
cudaError_t nb__cuda_launch_fill_f32(float *dst, float value, int64_t n, cudaStream_t stream);
cudaError_t nb__cuda_launch_add_f32(float *out, const float *a, const float *b, int64_t n,
                                    cudaStream_t stream);
/* dst[i] = src[i] rounded to bf16 (nearest even, the CPU's rounding: nb__kh_bf16_from_f32),
 * i < n: the bf16 copy of an f32 bias for a bf16 GEMM result (k_matmul.c). */
cudaError_t nb__cuda_launch_bf16_from_f32(uint16_t *dst, const float *src, int64_t n,
                                          cudaStream_t stream);

/* ---- the optional libraries (cuda/dl.h): why one is not used ------------------------------ */
/* "" when the plugin uses cuDNN (NCCL); else why not: built without it, or the library not
 * found or refused at run time ("libcudnn.so.9 not found (looked in ...)"). Loads the
 * library on first call. cudnn.c / cudnn_none.c and nccl.c / nccl_none.c. */
const char *nb__cuda_cudnn_why(void);
const char *nb__cuda_nccl_why(void);

/* ---- nccl.c / nccl_none.c ------------------------------------------------------------------ */
/* The NCCL entries of the plugin table (cuda/plugin.h has their contract): nccl.c when meson
 * found NCCL, else nccl_none.c (each fails with NB_EUNSUPPORTED there). nb__cuda_nccl_version
 * is declared in cuda/plugin.h. */
nb_status nb__cuda_nccl_unique_id(void *id);
nb__nccl_comm *nb__cuda_nccl_comm_new(int device, int nranks, int rank, const void *id);
nb__nccl_comm *nb__cuda_nccl_comm_split(nb__nccl_comm *c, int color, int key);
int nb__cuda_nccl_comm_poll(nb__nccl_comm *c);
void nb__cuda_nccl_comm_abort(nb__nccl_comm *c);
void nb__cuda_nccl_comm_free(nb__nccl_comm *c, double seconds);
nb__nccl_op *nb__cuda_nccl_start(nb__nccl_comm *c, const nb__nccl_call *call, double seconds);
int nb__cuda_nccl_op_poll(nb__nccl_op *op);
nb_status nb__cuda_nccl_op_finish(nb__nccl_op *op);
void nb__cuda_nccl_op_free(nb__nccl_op *op);

#ifdef __cplusplus
}
#endif
#endif
