/* cuda_stub.c - the nabla/cuda.h API in builds without CUDA (-Dcuda=disabled, or no nvcc
 * found): no GPU is ever usable, so nb_cuda_device_count() is 0 and every other call fails
 * with NB_EUNSUPPORTED and a message saying how to get a CUDA build. Calls that have
 * nothing to do (freeing NULL, emptying an empty cache) succeed, as in a CUDA build. */
#include "nabla/cuda.h"
#include "cuda/backend.h"
#include "tensor/error.h"

#define NB__NO_CUDA(what)                                                                  \
    nb__error(NB_EUNSUPPORTED,                                                             \
              what ": nabla was built without CUDA (reconfigure with meson -Dcuda=enabled " \
                   "on a machine with the CUDA toolkit)")

int nb_cuda_device_count(void) { return 0; }
bool nb_cuda_is_available(void) { return false; }
nb_status nb_cuda_set_device(int device) { return NB__NO_CUDA("cuda_set_device"); }

int nb_cuda_current_device(void) {
    NB__NO_CUDA("cuda_current_device");
    return -1;
}

nb_status nb_cuda_device_name(int device, char *buf, size_t len) {
    if (buf && len > 0) buf[0] = '\0';
    return NB__NO_CUDA("cuda_device_name");
}

nb_status nb_cuda_synchronize(void) { return NB__NO_CUDA("cuda_synchronize"); }

nb_cuda_stream *nb_cuda_stream_new(int device) {
    NB__NO_CUDA("cuda_stream_new");
    return NULL;
}
void nb_cuda_stream_free(nb_cuda_stream *s) { (void)s; }
nb_status nb_cuda_stream_synchronize(nb_cuda_stream *s) {
    return NB__NO_CUDA("cuda_stream_synchronize");
}
nb_cuda_stream *nb_cuda_stream_default(int device) {
    NB__NO_CUDA("cuda_stream_default");
    return NULL;
}
nb_cuda_stream *nb_cuda_stream_current(int device) {
    NB__NO_CUDA("cuda_stream_current");
    return NULL;
}
nb_status nb_cuda_set_stream(nb_cuda_stream *s) { return NB__NO_CUDA("cuda_set_stream"); }
int nb_cuda_stream_device(const nb_cuda_stream *s) { return -1; }
void *nb_cuda_stream_handle(const nb_cuda_stream *s) { return NULL; }

void *nb_cuda_alloc(size_t nbytes, int device) {
    NB__NO_CUDA("cuda_alloc");
    return NULL;
}

nb_status nb_cuda_free(void *p) { return p ? NB__NO_CUDA("cuda_free") : NB_OK; }

nb_status nb_cuda_alloc_get_stats(int device, nb_cuda_alloc_stats *out) {
    if (out) *out = (nb_cuda_alloc_stats){0};
    return NB__NO_CUDA("cuda_alloc_get_stats");
}
nb_status nb_cuda_alloc_reset_peak(int device) { return NB__NO_CUDA("cuda_alloc_reset_peak"); }
nb_status nb_cuda_empty_cache(void) { return NB_OK; }

nb_status nb_cuda_memcpy_h2d(void *dst, const void *src, size_t nbytes) {
    return NB__NO_CUDA("cuda_memcpy_h2d");
}
nb_status nb_cuda_memcpy_d2h(void *dst, const void *src, size_t nbytes) {
    return NB__NO_CUDA("cuda_memcpy_d2h");
}
nb_status nb_cuda_memcpy_d2d(void *dst, const void *src, size_t nbytes) {
    return NB__NO_CUDA("cuda_memcpy_d2d");
}
nb_status nb_cuda_memcpy_h2d_async(void *dst, const void *src, size_t nbytes,
                                   nb_cuda_stream *s) {
    return NB__NO_CUDA("cuda_memcpy_h2d_async");
}
nb_status nb_cuda_memcpy_d2h_async(void *dst, const void *src, size_t nbytes,
                                   nb_cuda_stream *s) {
    return NB__NO_CUDA("cuda_memcpy_d2h_async");
}
nb_status nb_cuda_memcpy_d2d_async(void *dst, const void *src, size_t nbytes,
                                   nb_cuda_stream *s) {
    return NB__NO_CUDA("cuda_memcpy_d2d_async");
}

/* The registry's view (cuda/backend.h): no CUDA backend in this build. */
const nb__backend *nb__cuda_backend(nb_device dev, const char *op) {
    nb__error(NB_EUNSUPPORTED, "%s: cuda:%d: nabla was built without CUDA (reconfigure with "
              "meson -Dcuda=enabled on a machine with the CUDA toolkit)", op, dev.index);
    return NULL;
}

const nb__kernels *nb__cuda_kernels(void) { return NULL; }
