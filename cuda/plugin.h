/* cuda/plugin.h - private: the boundary between libnabla and the CUDA plugin
 * (libnabla-cuda.so, docs/cuda.md "The plugin").
 *
 * libnabla has no link-time dependency on CUDA. Its side (cuda/loader.c) implements the
 * nabla/cuda.h API, the registry's nb__cuda_backend / nb__cuda_kernels (cuda/backend.h)
 * and the private launchers below by forwarding through one table, nb__cuda_plugin, which
 * it gets from the plugin on first CUDA use:
 *
 *     dlopen("libnabla-cuda.so") -> nb__cuda_plugin_init(&host, &plugin)
 *
 * The plugin (everything else in cuda/, linked to cudart and cuBLAS) exports only that one
 * symbol. It calls back into libnabla only through the host table (the error setter and
 * reader), so it works the same whether libnabla is a shared library or linked statically
 * into the program, and it never binds to a second copy of libnabla's state.
 *
 * Plain C with no CUDA header, so libnabla and the tests include it without the toolkit.
 * The ABI is checked at load time: the version number, the nabla version string and the
 * sizes of both tables and of the kernel table must all match, so a plugin from another
 * build is refused with a message instead of crashing. */
#ifndef NABLA_CUDA_PLUGIN_H
#define NABLA_CUDA_PLUGIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nabla/cuda.h"
#include "nabla/status.h"
#include "nabla/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bump on any change of the two tables below or of what they point to. */
#define NB__CUDA_PLUGIN_ABI 2
/* The file the loader looks for, and the variable that overrides the search. */
#define NB__CUDA_PLUGIN_NAME "libnabla-cuda.so"
#define NB__CUDA_PLUGIN_ENV "NB_CUDA_PLUGIN"
/* The symbol the plugin exports. */
#define NB__CUDA_PLUGIN_ENTRY "nb__cuda_plugin_init"

struct nb__backend;
struct nb__kernels;

/* ---- NCCL (cuda/nccl.c; cuda/nccl_none.c in a plugin built without NCCL) ----------------------
 * What libnabla's NCCL communicator backend (parallel/comm_nccl.c) calls. Opaque handles owned
 * by the plugin; plain C types only, so libnabla needs no NCCL header. */
#define NB__NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */
typedef struct nb__nccl_comm nb__nccl_comm; /* an ncclComm_t bound to one GPU */
typedef struct nb__nccl_op nb__nccl_op;     /* one operation in flight */
typedef enum nb__nccl_kind {
    NB__NCCL_ALLREDUCE = 0,
    NB__NCCL_BROADCAST,
    NB__NCCL_REDUCE,
    NB__NCCL_ALLGATHER,
    NB__NCCL_REDUCE_SCATTER,
    NB__NCCL_ALL_TO_ALL,
    NB__NCCL_SEND,
    NB__NCCL_RECV,
} nb__nccl_kind;
/* One operation on contiguous device buffers of the communicator's GPU, as nb__args
 * (parallel/parallel_impl.h) describes it: allreduce, broadcast, reduce, send and recv work
 * in place on buf/count; allgather, reduce_scatter and all_to_all read in (in_count elements)
 * and write out (out_count); chunked: the uneven forms of nb_comm_chunk. op is an
 * nb_reduce_op, peer the root / destination / source. */
typedef struct nb__nccl_call {
    nb__nccl_kind kind;
    nb_dtype dtype;
    int op;
    int peer;
    void *buf;
    int64_t count;
    const void *in;
    int64_t in_count;
    void *out;
    int64_t out_count;
    bool chunked;
} nb__nccl_call;

/* What libnabla gives the plugin. */
typedef struct nb__cuda_host {
    uint32_t abi;           /* NB__CUDA_PLUGIN_ABI */
    uint32_t size;          /* sizeof(nb__cuda_host) */
    const char *version;    /* NB_VERSION_STRING of libnabla */
    uint32_t kernels_size;  /* sizeof(nb__kernels) as libnabla sees it */
    /* Set the calling thread's last error (message already formatted). */
    nb_status (*set_error)(nb_status s, const char *msg);
    const char *(*last_error)(void);
    nb_status (*last_status)(void);
    /* A broken internal invariant (prints and aborts; never for user mistakes). */
    void (*assert_fail)(const char *file, int line, const char *cond);
} nb__cuda_host;

/* What the plugin gives libnabla: one entry per nabla/cuda.h function (same contract as
 * documented there), the registry's two, and the private launchers. */
typedef struct nb__cuda_plugin {
    uint32_t abi;
    uint32_t size;          /* sizeof(nb__cuda_plugin) */
    const char *version;    /* NB_VERSION_STRING the plugin was built with */
    uint32_t kernels_size;  /* sizeof(nb__kernels) as the plugin sees it */
    const char *libraries;  /* what it links, in words: "CUDA runtime 13.0, cuBLAS 13.0.0, ..." */
    /* devices */
    int (*device_count)(void);
    nb_status (*set_device)(int device);
    int (*current_device)(void);
    nb_status (*device_name)(int device, char *buf, size_t len);
    nb_status (*synchronize)(void);
    /* streams */
    nb_cuda_stream *(*stream_new)(int device);
    void (*stream_free)(nb_cuda_stream *s);
    nb_status (*stream_synchronize)(nb_cuda_stream *s);
    nb_cuda_stream *(*stream_default)(int device);
    nb_cuda_stream *(*stream_current)(int device);
    nb_status (*set_stream)(nb_cuda_stream *s);
    int (*stream_device)(const nb_cuda_stream *s);
    void *(*stream_handle)(const nb_cuda_stream *s);
    nb_status (*stream_wait)(nb_cuda_stream *waiter, nb_cuda_stream *signaler);
    nb_cuda_stream *(*stream_role)(int device, nb_cuda_role role);
    /* allocator */
    void *(*alloc)(size_t nbytes, int device);
    nb_status (*free)(void *p);
    nb_status (*record_stream)(void *p, nb_cuda_stream *s);
    nb_status (*alloc_get_stats)(int device, nb_cuda_alloc_stats *out);
    nb_status (*alloc_reset_peak)(int device);
    nb_status (*empty_cache)(void);
    /* copies */
    nb_status (*memcpy_h2d)(void *dst, const void *src, size_t nbytes);
    nb_status (*memcpy_d2h)(void *dst, const void *src, size_t nbytes);
    nb_status (*memcpy_d2d)(void *dst, const void *src, size_t nbytes);
    nb_status (*memcpy_h2d_async)(void *dst, const void *src, size_t nbytes, nb_cuda_stream *s);
    nb_status (*memcpy_d2h_async)(void *dst, const void *src, size_t nbytes, nb_cuda_stream *s);
    nb_status (*memcpy_d2d_async)(void *dst, const void *src, size_t nbytes, nb_cuda_stream *s);
    /* the registry (cuda/backend.h) */
    const struct nb__backend *(*backend)(nb_device dev, const char *op);
    const struct nb__kernels *(*kernels)(void);
    /* private launchers (below) */
    nb_status (*fill_f32)(float *dst, float value, int64_t n, nb_cuda_stream *s);
    nb_status (*add_f32)(float *out, const float *a, const float *b, int64_t n,
                         nb_cuda_stream *s);
    nb_status (*gemm_f32)(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                          float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                          float beta, float *c, int64_t ldc, nb_cuda_stream *s);
    /* cuDNN's version (cudnnGetVersion(), e.g. 91300 for 9.13.0) when the plugin was built
     * with it (meson feature cudnn), else 0. Needs no GPU. */
    long (*cudnn_version)(void);
    /* NCCL (docs/cuda.md "NCCL"). nccl_version: ncclGetVersion's code (22809 for 2.28.9)
     * when the plugin links NCCL, else 0; the other entries then fail with NB_EUNSUPPORTED.
     * Polls return 1 (done / ready), 0 (pending), or a negative nb_status with the error
     * set; none of them blocks on the GPU or on peers. */
    long (*nccl_version)(void);
    /* ncclGetUniqueId into id (NB__NCCL_ID_BYTES; needs no GPU). */
    nb_status (*nccl_unique_id)(void *id);
    /* Start a non-blocking ncclCommInitRankConfig on device (poll it with nccl_comm_poll);
     * NULL + error when it could not start. */
    nb__nccl_comm *(*nccl_comm_new)(int device, int nranks, int rank, const void *id);
    /* Start a non-blocking ncclCommSplit of a ready communicator (collective over it). */
    nb__nccl_comm *(*nccl_comm_split)(nb__nccl_comm *c, int color, int key);
    /* Init/split progress, and afterwards the communicator's health (ncclCommGetAsyncError). */
    int (*nccl_comm_poll)(nb__nccl_comm *c);
    /* ncclCommAbort (this rank's operations on it end instead of hanging); the
     * handle stays valid (every later call fails) until nccl_comm_free. */
    void (*nccl_comm_abort)(nb__nccl_comm *c);
    /* Finalize and destroy (abort when it does not finish within `seconds`), then free. */
    void (*nccl_comm_free)(nb__nccl_comm *c, double seconds);
    /* Enqueue one operation on the calling thread's COMM stream of the communicator's GPU,
     * after the work already on its current (compute) stream; NULL + error when it could
     * not be enqueued. Waits at most `seconds` (<= 0: no limit) for an earlier enqueue that
     * NCCL reported in progress (it then aborts the communicator: NB_ETIMEOUT). */
    nb__nccl_op *(*nccl_start)(nb__nccl_comm *c, const nb__nccl_call *call, double seconds);
    /* The operation's progress (its event, and the communicator's async error). */
    int (*nccl_op_poll)(nb__nccl_op *op);
    /* After a poll said 1: the calling thread's current stream of the GPU waits for the
     * operation's end (no host wait); frees op. */
    nb_status (*nccl_op_finish)(nb__nccl_op *op);
    /* Free op without waiting (failed, or its communicator aborted). */
    void (*nccl_op_free)(nb__nccl_op *op);
} nb__cuda_plugin;

/* The plugin's one export: check host (abi, sizes, version), then set *out. NB_OK, or an
 * error status with the reason in msg (len bytes, always terminated). */
typedef nb_status (*nb__cuda_plugin_init_fn)(const nb__cuda_host *host,
                                             const nb__cuda_plugin **out, char *msg,
                                             size_t len);

/* Defined by the plugin (cuda/plugin.c) and exported under NB__CUDA_PLUGIN_ENTRY. */
nb_status nb__cuda_plugin_init(const nb__cuda_host *host, const nb__cuda_plugin **out,
                               char *msg, size_t len);

/* ---- libnabla's side (cuda/loader.c) ----------------------------------------------------- */
/* The plugin's table, loading it on first use; NULL and an NB_EUNSUPPORTED error naming
 * `what` and the reason when it cannot be loaded ("what: CUDA support is not installed:
 * libnabla-cuda.so not found (looked in ...; set NB_CUDA_PLUGIN)"). */
const nb__cuda_plugin *nb__cuda_plugin_get(const char *what);
/* The path it was loaded from ("" when not loaded). */
const char *nb__cuda_plugin_path(void);
/* Tests only: forget a failed load attempt, so the next use reads NB_CUDA_PLUGIN again.
 * False (and nothing changes) when the plugin is loaded: it is never unloaded. */
bool nb__cuda_plugin_forget_failure(void);

/* Private launchers, implemented in the plugin (launch.c, blas.c) and forwarded by the
 * loader; tests call them. */
/* dst[i] = value for i < n, on stream s (NULL: current stream of the current device). */
nb_status nb__cuda_fill_f32(float *dst, float value, int64_t n, nb_cuda_stream *s);
/* out[i] = a[i] + b[i] for i < n (out may alias a or b). */
nb_status nb__cuda_add_f32(float *out, const float *a, const float *b, int64_t n,
                           nb_cuda_stream *s);
/* Row-major single-precision GEMM on the GPU through cuBLAS, on stream s (NULL: the current
 * stream of the current device): C = alpha * op(A) @ op(B) + beta * C with op(A) (m, k),
 * op(B) (k, n), C (m, n) and ld* the row strides in elements. Plain FP32 math (no TF32),
 * so results match a CPU reference to float rounding. The handle is created on first use. */
nb_status nb__cuda_gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                            float alpha, const float *a, int64_t lda, const float *b,
                            int64_t ldb, float beta, float *c, int64_t ldc,
                            nb_cuda_stream *s);
/* cuDNN's version number through the plugin; 0 when the plugin has no cuDNN, -1 (and an
 * error) when the plugin cannot be loaded. */
long nb__cuda_cudnn_version(void);
/* NCCL's version code through the plugin; 0 when the plugin has no NCCL, -1 (and an error)
 * when the plugin cannot be loaded. */
long nb__cuda_nccl_version(void);

#ifdef __cplusplus
}
#endif
#endif
