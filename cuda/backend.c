/* cuda/backend.c - the CUDA backend: device memory from the caching allocator (alloc.c),
 * copies through the library stream (copy.c), and the kernel table. Kernels are added
 * here as cuda/ gains them; an op without one answers "op: no cuda kernel (name)".
 * Unverified on a GPU: no GPU was available where this was written. */
#include <stdio.h>

#include "cuda/backend.h"
#include "cuda/cuda_impl.h"
#include "nabla/cuda.h"

nb_status nb__error(nb_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void *cuda_alloc(nb_device dev, size_t nbytes) {
    return nb_cuda_alloc(nbytes ? nbytes : 1, dev.index);
}
static void cuda_free(nb_device dev, void *p) {
    (void)dev;
    (void)nb_cuda_free(p);
}
static nb_status cuda_to_host(nb_device dev, void *dst, const void *src, size_t nbytes) {
    (void)dev;
    return nbytes ? nb_cuda_memcpy_d2h(dst, src, nbytes) : NB_OK;
}
static nb_status cuda_from_host(nb_device dev, void *dst, const void *src, size_t nbytes) {
    (void)dev;
    return nbytes ? nb_cuda_memcpy_h2d(dst, src, nbytes) : NB_OK;
}

/* fill: f32 over one contiguous run (other geometries wait for the CUDA issue). */
static nb_status cuda_fill(const nb__fill_args *a) {
    const nb__iter *it = &a->it;
    if (it->dtype[0] != NB_F32 || it->ndim != 1 || it->strides[0][0] != 4)
        return nb__error(NB_EUNSUPPORTED, "fill: the cuda kernel handles contiguous f32 only");
    return nb__cuda_fill_f32((float *)it->data[0], (float)a->value, it->numel, NULL);
}

static const nb__backend g_cuda = {
    .name = "cuda",
    .has_storage = true,
    .host_accessible = false,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .to_host = cuda_to_host,
    .from_host = cuda_from_host,
    .k = {.fill = cuda_fill},
};

const nb__backend *nb__cuda_backend(nb_device dev, const char *op) {
    int n = nb_cuda_device_count();
    if (n == 0) {
        (void)nb_cuda_set_device(0); /* sets the runtime's reason as the last error */
        char why[256];
        snprintf(why, sizeof why, "%s", nb_last_error());
        nb__error(NB_EDEVICE, "%s: no usable GPU for cuda:%d (%s)", op, dev.index, why);
        return NULL;
    }
    if (dev.index < 0 || dev.index >= n) {
        nb__error(NB_EDEVICE, "%s: cuda:%d does not exist (%d GPU%s)", op, dev.index, n,
                  n == 1 ? "" : "s");
        return NULL;
    }
    return &g_cuda;
}

const nb__kernels *nb__cuda_kernels(void) { return &g_cuda.k; }
