/* nabla/cuda.h - NVIDIA GPUs: devices, streams, the caching device allocator, copies.
 *
 * Usage:
 *     if (nb_cuda_is_available()) {                        // false without a GPU or CUDA build
 *         nb_cuda_set_device(0);
 *         float host[1024] = {0};
 *         float *dev = nb_cuda_alloc(sizeof host, 0);      // from the caching allocator
 *         nb_cuda_memcpy_h2d(dev, host, sizeof host);      // waits for the copy
 *         ...                                              // kernels run on the library stream
 *         nb_cuda_memcpy_d2h(host, dev, sizeof host);
 *         nb_cuda_free(dev);                               // back to the cache, not cudaFree
 *     } else {
 *         puts(nb_last_error());   // e.g. "cuda: no usable GPU: CUDA driver version is ..."
 *     }
 *
 * Availability: every function here exists in every build. A build without CUDA (meson
 * -Dcuda=disabled, or no nvcc found) answers nb_cuda_device_count() == 0 and fails every
 * other call with NB_EUNSUPPORTED ("nabla was built without CUDA"). A CUDA build on a
 * machine without a usable GPU (no driver, no device, CUDA_VISIBLE_DEVICES="") also
 * answers 0 and fails with NB_EDEVICE, naming the CUDA runtime's reason ("no usable GPU:
 * CUDA driver version is insufficient for CUDA runtime version"). Nothing here aborts;
 * failed calls return a negative nb_status, NULL or -1 and set nb_last_error().
 *
 * Devices: the current device is per thread (as in the CUDA runtime); functions that take
 * a device index accept -1 for "the current device".
 *
 * Streams: every thread has, per device, a library stream created on first use (a
 * non-blocking CUDA stream, so it does not serialize with CUDA's legacy default stream)
 * and destroyed when the thread exits. Library work from a thread (kernels, async copies)
 * is enqueued on that thread's current stream for the device: the library stream, or the
 * stream set with nb_cuda_set_stream. The library owns the default streams (never free
 * them); the caller owns streams from nb_cuda_stream_new.
 *
 * Allocator (docs/architecture.md rule 4): device blocks are rounded up to size classes (at least
 * 512 bytes, then 4 classes per power of two, so at most 25% slack) and returned blocks
 * are cached for reuse, so a training loop stops calling cudaMalloc after its first
 * steps; nb_cuda_alloc_get_stats shows it. A block is tied to the stream that was current
 * when it was allocated: once freed it is reused at once by allocations on that stream
 * (stream order makes that safe), and by other streams only when its stream is idle or
 * destroyed. A block used on another stream too is marked with nb_cuda_record_stream: its
 * free then records an event on that stream and the block waits for it before reuse. Out of
 * memory is NB_ENOMEM with the sizes and the cache's state in the message. The allocator is
 * thread safe; cached blocks stay with the process until nb_cuda_empty_cache().
 *
 * The plugin: all of this lives in libnabla-cuda.so, which libnabla loads on the first CUDA
 * call (docs/cuda.md): $NB_CUDA_PLUGIN, else next to libnabla, else the install libdir.
 * Without it, calls fail with NB_EUNSUPPORTED ("CUDA support is not installed: ...") and
 * nb_cuda_device_count() is 0; libnabla itself links no CUDA library. */
#ifndef NABLA_CUDA_H
#define NABLA_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nabla/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- devices ---------------------------------------------------------------------------- */
/* Number of usable GPUs; 0 when there is none or nabla was built without CUDA. Never an
 * error (nb_last_error is not touched); the answer is computed once per process. */
int nb_cuda_device_count(void);
/* nb_cuda_device_count() > 0. */
bool nb_cuda_is_available(void);
/* Make device the current GPU of this thread. NB_EDEVICE for an index out of range. */
nb_status nb_cuda_set_device(int device);
/* The current GPU of this thread, or -1 (and an error) when no GPU is usable. */
int nb_cuda_current_device(void);
/* The GPU's name ("NVIDIA H200") into buf (truncated to len - 1 characters, always
 * terminated when len > 0; "" on failure). device -1: the current one. */
nb_status nb_cuda_device_name(int device, char *buf, size_t len);
/* Wait until all work on the current GPU (every stream) has finished. */
nb_status nb_cuda_synchronize(void);
/* What the CUDA plugin links, in words ("CUDA runtime 13.0, cuBLAS 13.0.0, cuDNN 9.13.0"):
 * static storage. Loads the plugin; NULL and an error when it cannot be loaded. */
const char *nb_cuda_libraries(void);

/* ---- streams ------------------------------------------------------------------------------ */
typedef struct nb_cuda_stream nb_cuda_stream;

/* A new stream on device (-1: current), owned by the caller (nb_cuda_stream_free).
 * NULL and an error when no GPU is usable or the device does not exist. */
nb_cuda_stream *nb_cuda_stream_new(int device);
/* Wait for s's work, then destroy it. NULL and the library's own streams are ignored. If
 * s is the current stream of this thread, the library stream becomes current again;
 * another thread must not be using s. */
void nb_cuda_stream_free(nb_cuda_stream *s);
/* Wait until all work enqueued on s has finished (NULL: the current stream of the current
 * device). */
nb_status nb_cuda_stream_synchronize(nb_cuda_stream *s);
/* This thread's library stream on device (-1: current), created on first use; owned by
 * the library. NULL and an error when no GPU is usable. */
nb_cuda_stream *nb_cuda_stream_default(int device);
/* The stream this thread's library work on device (-1: current) is enqueued on. */
nb_cuda_stream *nb_cuda_stream_current(int device);
/* Make s the current stream of this thread for s's device (NULL: back to the library
 * stream of the current device). s must outlive its use as the current stream. */
nb_status nb_cuda_set_stream(nb_cuda_stream *s);
/* The GPU a stream belongs to (-1 for NULL). */
int nb_cuda_stream_device(const nb_cuda_stream *s);
/* The underlying cudaStream_t (as void *) for launching your own kernels in stream order
 * with nabla's; NULL for NULL. Owned by s. */
void *nb_cuda_stream_handle(const nb_cuda_stream *s);
/* Work enqueued on waiter from now on starts only after the work enqueued on signaler so
 * far has finished (an event recorded on signaler; the host does not wait). The streams
 * may belong to different GPUs. NULL: the current stream of the current device. */
nb_status nb_cuda_stream_wait(nb_cuda_stream *waiter, nb_cuda_stream *signaler);

/* The library's streams per thread and device, by role: COMPUTE is the library stream
 * (nb_cuda_stream_default), COMM the stream collectives run on, COPY the stream for
 * host<->device transfers that overlap compute. Work on different roles runs concurrently:
 * order it with nb_cuda_stream_wait, and mark blocks used on a stream other than their
 * own with nb_cuda_record_stream. */
typedef enum nb_cuda_role {
    NB_CUDA_ROLE_COMPUTE = 0,
    NB_CUDA_ROLE_COMM = 1,
    NB_CUDA_ROLE_COPY = 2,
} nb_cuda_role;
/* This thread's stream of role on device (-1: current), created on first use, owned by the
 * library (destroyed at thread exit). NULL and NB_EINVAL for an unknown role; NULL and an
 * error when no GPU is usable. */
nb_cuda_stream *nb_cuda_stream_role(int device, nb_cuda_role role);

/* ---- caching device allocator ------------------------------------------------------------- */
typedef struct nb_cuda_alloc_stats {
    int64_t bytes_live;      /* bytes in blocks handed out and not yet returned */
    int64_t bytes_peak;      /* maximum of bytes_live since start or the last reset */
    int64_t bytes_cached;    /* bytes in returned blocks kept for reuse */
    int64_t system_allocs;   /* cudaMalloc calls that succeeded so far */
    int64_t system_frees;    /* cudaFree calls so far */
    int64_t allocs;          /* blocks handed out (cache hits + cudaMalloc) */
} nb_cuda_alloc_stats;

/* A device block of at least nbytes (256-byte aligned) on device (-1: current), tied to
 * this thread's current stream of that device. The caller owns it: return it with
 * nb_cuda_free. NULL and an error (NB_ENOMEM when the GPU is full even after the cache
 * was emptied) on failure. nbytes == 0 gives a valid minimum-size block. */
void *nb_cuda_alloc(size_t nbytes, int device);
/* Return a block from nb_cuda_alloc to the cache. NULL is a no-op; NB_EINVAL for a pointer
 * that is not a live block from nb_cuda_alloc (for example a double free). */
nb_status nb_cuda_free(void *p);
/* Note that block p (as nb_cuda_alloc returned it, not yet freed) is also used on stream s
 * (NULL: the current stream of the current device), a stream other than its own: when p
 * is freed, an event is recorded on s and the block is reused only after that event (and
 * so the work on s up to the free) has completed. The rule of PyTorch's record_stream.
 * NB_EINVAL for a pointer that is not a live block, or a stream of another GPU. */
nb_status nb_cuda_record_stream(void *p, nb_cuda_stream *s);
/* Allocator statistics of device (-1: current). */
nb_status nb_cuda_alloc_get_stats(int device, nb_cuda_alloc_stats *out);
/* Reset bytes_peak to bytes_live on device (-1: current). */
nb_status nb_cuda_alloc_reset_peak(int device);
/* Wait for the GPUs, then cudaFree every cached block. NB_OK when nothing is cached
 * (also without a GPU or a CUDA build). */
nb_status nb_cuda_empty_cache(void);

/* ---- copies ------------------------------------------------------------------------------- */
/* Copy nbytes between host memory and device memory (d2d: between device blocks, also of
 * different GPUs). The device side may point anywhere inside a block (tensor offsets).
 * The plain forms enqueue the copy on the current stream of the device memory's GPU and
 * wait for that stream (so earlier library work on it is finished and visible). The
 * _async forms enqueue on s (NULL: the current stream of the device memory's GPU) and
 * return at once: the host buffer must stay valid and unchanged (h2d) or unread (d2h)
 * until s is synchronized. s must belong to the GPU of the device memory (d2d: of dst).
 * A d2d copy between two GPUs first waits for the source GPU's current stream, and that
 * stream then waits for the copy (events, no host wait), so the copy reads what the
 * source stream wrote and the source block is not reused on its stream while read.
 * NB_EINVAL when a pointer is on the wrong side (a device pointer passed as host memory or
 * the reverse). With a usable GPU, nbytes == 0 is a no-op (NULL pointers are then accepted). */
nb_status nb_cuda_memcpy_h2d(void *dst, const void *src, size_t nbytes);
nb_status nb_cuda_memcpy_d2h(void *dst, const void *src, size_t nbytes);
nb_status nb_cuda_memcpy_d2d(void *dst, const void *src, size_t nbytes);
nb_status nb_cuda_memcpy_h2d_async(void *dst, const void *src, size_t nbytes,
                                   nb_cuda_stream *s);
nb_status nb_cuda_memcpy_d2h_async(void *dst, const void *src, size_t nbytes,
                                   nb_cuda_stream *s);
nb_status nb_cuda_memcpy_d2d_async(void *dst, const void *src, size_t nbytes,
                                   nb_cuda_stream *s);

#ifdef __cplusplus
}
#endif
#endif
