/* copy.c - host<->device and device<->device copies, on a stream.
 *
 * Each device-side pointer is located with cudaPointerGetAttributes, which also works for
 * pointers inside a block (tensor offsets): that gives the GPU whose stream runs the copy
 * and catches host and device pointers passed the wrong way round, which CUDA would
 * otherwise report as a bare "invalid argument" or, worse, copy from the wrong side.
 *
 * A copy between two GPUs runs on a stream of the destination's GPU. It first waits for
 * the source GPU's current stream (an event), so it reads what that stream wrote, and
 * that stream then waits for the copy, so the source block is not freed and reused on
 * its stream while the copy still reads it (cuda/policy.c: nb__copy_joins_source). */
#include "cuda/cuda_impl.h"
#include "cuda/k_index.h"
#include "cuda/policy.h"
#include "tensor/error.h"

typedef enum { NB__H2D, NB__D2H, NB__D2D } nb__copy_kind;

/* The GPU of device memory p in *device; NB_EINVAL if p is on the other side. */
static nb_status locate(const void *p, bool want_device, int *device, const char *what,
                        const char *name) {
    struct cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        a.type = cudaMemoryTypeUnregistered; /* CUDA does not know it: plain host memory */
        a.device = -1;
    }
    bool on_device = a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
    if (want_device && !on_device)
        return nb__error(NB_EINVAL, "%s: %s (%p) is host memory, not device memory", what,
                         name, p);
    if (!want_device && a.type == cudaMemoryTypeDevice)
        return nb__error(NB_EINVAL,
                         "%s: %s (%p) is device memory, not host memory (use "
                         "nb_cuda_memcpy_d2d between device blocks)",
                         what, name, p);
    *device = a.device;
    return NB_OK;
}

static nb_status copy(void *dst, const void *src, size_t nbytes, nb_cuda_stream *s,
                      nb__copy_kind kind, bool wait, const char *what) {
    int d = 0;
    nb_status st = nb__cuda_resolve(-1, &d, what);
    if (st != NB_OK) return st;
    if (nbytes == 0) return NB_OK;
    if (!dst) return nb__error(NB_ENULL, "%s: argument 'dst' is NULL", what);
    if (!src) return nb__error(NB_ENULL, "%s: argument 'src' is NULL", what);
    int ddev = -1, sdev = -1;
    if ((st = locate(dst, kind != NB__D2H, &ddev, what, "dst")) != NB_OK) return st;
    if ((st = locate(src, kind != NB__H2D, &sdev, what, "src")) != NB_OK) return st;
    int dev = kind == NB__D2H ? sdev : ddev;
    if (dev < 0 || dev >= nb_cuda_device_count())
        return nb__error(NB_EDEVICE,
                         "%s: the device memory is on GPU %d, which nabla does not use", what,
                         dev);
    if (!s) {
        if (!(s = nb__cuda_stream_for(dev, what))) return nb_last_status();
    } else if (s->device != dev) {
        return nb__error(NB_EDEVICE,
                         "%s: the stream belongs to GPU %d but the device memory is on GPU %d",
                         what, s->device, dev);
    }
    nb_cuda_stream *src_stream = NULL;
    if (kind == NB__D2D && nb__copy_joins_source(sdev, ddev)) {
        if (sdev < 0 || sdev >= nb_cuda_device_count())
            return nb__error(NB_EDEVICE,
                             "%s: the source memory is on GPU %d, which nabla does not use",
                             what, sdev);
        if (!(src_stream = nb__cuda_stream_for(sdev, what))) return nb_last_status();
        if ((st = nb__cuda_join(s, src_stream, what)) != NB_OK) return st;
    }
    int prev = -1;
    if ((st = nb__cuda_enter(dev, &prev, what)) != NB_OK) return st;
    cudaError_t e;
    if (src_stream)
        e = cudaMemcpyPeerAsync(dst, ddev, src, sdev, nbytes, s->handle);
    else
        e = cudaMemcpyAsync(dst, src, nbytes,
                            kind == NB__H2D   ? cudaMemcpyHostToDevice
                            : kind == NB__D2H ? cudaMemcpyDeviceToHost
                                              : cudaMemcpyDeviceToDevice,
                            s->handle);
    if (e == cudaSuccess && wait) e = cudaStreamSynchronize(s->handle);
    nb__cuda_leave(prev);
    /* a waited device-to-host copy is a natural sync: report the bad index values the
     * index kernels of this device recorded (cuda/k_index.h) */
    if (e == cudaSuccess && wait && kind == NB__D2H && (st = nb__cuda_index_error(dev)) != NB_OK)
        return st;
    if (e == cudaSuccess && src_stream && !wait) return nb__cuda_join(src_stream, s, what);
    return nb__cuda_status(e, what);
}

nb_status nb_cuda_memcpy_h2d(void *dst, const void *src, size_t nbytes) {
    return copy(dst, src, nbytes, NULL, NB__H2D, true, "cuda_memcpy_h2d");
}
nb_status nb_cuda_memcpy_d2h(void *dst, const void *src, size_t nbytes) {
    return copy(dst, src, nbytes, NULL, NB__D2H, true, "cuda_memcpy_d2h");
}
nb_status nb_cuda_memcpy_d2d(void *dst, const void *src, size_t nbytes) {
    return copy(dst, src, nbytes, NULL, NB__D2D, true, "cuda_memcpy_d2d");
}
nb_status nb_cuda_memcpy_h2d_async(void *dst, const void *src, size_t nbytes,
                                   nb_cuda_stream *s) {
    return copy(dst, src, nbytes, s, NB__H2D, false, "cuda_memcpy_h2d_async");
}
nb_status nb_cuda_memcpy_d2h_async(void *dst, const void *src, size_t nbytes,
                                   nb_cuda_stream *s) {
    return copy(dst, src, nbytes, s, NB__D2H, false, "cuda_memcpy_d2h_async");
}
nb_status nb_cuda_memcpy_d2d_async(void *dst, const void *src, size_t nbytes,
                                   nb_cuda_stream *s) {
    return copy(dst, src, nbytes, s, NB__D2D, false, "cuda_memcpy_d2d_async");
}
