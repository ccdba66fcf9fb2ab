/* cuda/backend.c - the CUDA backend: device memory from the caching allocator (alloc.c),
 * copies through the library stream (copy.c), and the kernel table, filled once by the
 * kernel families (cuda/kernels.h). An op without a kernel answers "op: no cuda kernel
 * (name)". Also the kernel context every kernel entry point uses (nb__cuda_kbegin/kend).
 * Unverified on a GPU: no GPU was available where this was written. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda/backend.h"
#include "cuda/cuda_impl.h"
#include "cuda/kernels.h"
#include "nabla/cuda.h"

nb_status nb__error(nb_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void *cuda_alloc(nb_device dev, size_t nbytes) {
    return nb_cuda_alloc(nbytes ? nbytes : 1, dev.index);
}
static void cuda_free(nb_device dev, void *p) {
    (void)dev;
    (void)nb_cuda_free(p);
}
/* A copy to the host waits for the device: the natural point to report a bad index a
 * kernel found (cuda/kerr.c). */
static nb_status cuda_to_host(nb_device dev, void *dst, const void *src, size_t nbytes) {
    nb_status st = nbytes ? nb_cuda_memcpy_d2h(dst, src, nbytes) : NB_OK;
    return st == NB_OK ? nb__cuda_kerr_check(dev.index, "copy to the host") : st;
}
static nb_status cuda_from_host(nb_device dev, void *dst, const void *src, size_t nbytes) {
    (void)dev;
    return nbytes ? nb_cuda_memcpy_h2d(dst, src, nbytes) : NB_OK;
}

static nb_status cuda_record_use(nb_device dev, void *p) {
    nb_cuda_stream *s = nb_cuda_stream_current(dev.index);
    return s ? nb_cuda_record_stream(p, s) : nb_last_status();
}

/* Pinned host memory (portable: usable with every GPU), for the loader's host batches. */
static void *cuda_host_alloc(nb_device dev, size_t nbytes) {
    int prev = -1;
    if (nb__cuda_enter(dev.index, &prev, "cuda_host_alloc") != NB_OK) return NULL;
    void *p = NULL;
    cudaError_t e = cudaHostAlloc(&p, nbytes ? nbytes : 1, cudaHostAllocPortable);
    nb__cuda_leave(prev);
    if (e != cudaSuccess) {
        nb__cuda_status(e, "cuda_host_alloc");
        return NULL;
    }
    return p;
}
static void cuda_host_free(nb_device dev, void *p) {
    (void)dev;
    if (p && cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
}

static nb__backend g_cuda = {
    .name = "cuda",
    .has_storage = true,
    .host_accessible = false,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .to_host = cuda_to_host,
    .from_host = cuda_from_host,
    .record_use = cuda_record_use,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void register_kernels(void) {
    nb__cuda_reg_core(&g_cuda);
    nb__cuda_reg_reduce(&g_cuda);
    nb__cuda_reg_index(&g_cuda);
    nb__cuda_reg_matmul(&g_cuda);
    nb__cuda_reg_norm(&g_cuda);
    nb__cuda_reg_attention(&g_cuda);
    nb__cuda_reg_conv(&g_cuda);
    nb__cuda_reg_loss(&g_cuda);
    nb__cuda_reg_optim(&g_cuda);
    nb__cuda_reg_random(&g_cuda);
}

static _Thread_local int t_kernel_device;
void nb__cuda_set_kernel_device(int device) { t_kernel_device = device; }
int nb__cuda_kernel_device(void) { return t_kernel_device; }

const nb__backend *nb__cuda_backend(nb_device dev, const char *op) {
    int n = nb_cuda_device_count();
    if (n == 0) {
        (void)nb_cuda_set_device(0); /* sets the runtime's reason as the last error */
        /* "<context>: <the reason>": wrapped by libnabla's rules (docs/errors.md) */
        nb__error(NB_EDEVICE, "%s: cuda:%d is not available: %s", op, dev.index, nb_last_error());
        return NULL;
    }
    if (dev.index < 0 || dev.index >= n) {
        nb__error(NB_EDEVICE, "%s: cuda:%d does not exist (%d GPU%s)", op, dev.index, n,
                  n == 1 ? "" : "s");
        return NULL;
    }
    pthread_once(&g_once, register_kernels);
    t_kernel_device = dev.index;
    return &g_cuda;
}

const nb__kernels *nb__cuda_kernels(void) {
    pthread_once(&g_once, register_kernels);
    return &g_cuda.k;
}

/* ---- the kernel context ------------------------------------------------------------------- */
nb_status nb__cuda_kbegin(nb__cuda_kctx *c, const char *what) {
    c->what = what;
    c->device = t_kernel_device;
    c->prev = -1;
    c->stream = NULL;
    nb_status st = nb__cuda_enter(c->device, &c->prev, what);
    if (st != NB_OK) return st;
    nb_cuda_stream *s = nb__cuda_stream_for(c->device, what);
    if (!s) {
        nb__cuda_leave(c->prev);
        return nb_last_status();
    }
    c->stream = s->handle;
    return NB_OK;
}

nb_status nb__cuda_kend(nb__cuda_kctx *c, cudaError_t e) {
    nb_status st = e == cudaSuccess ? NB_OK : nb__cuda_status(e, c->what);
    nb__cuda_leave(c->prev);
    return st;
}

void *nb__cuda_kscratch(nb__cuda_kctx *c, size_t nbytes) {
    return nb_cuda_alloc(nbytes ? nbytes : 1, c->device);
}
void nb__cuda_kfree(void *p) {
    if (p) (void)nb_cuda_free(p);
}
nb_status nb__cuda_kfail(nb__cuda_kctx *c) {
    nb_status st = nb_last_status();
    nb__cuda_leave(c->prev);
    return st != NB_OK ? st : NB_ENOMEM;
}

static nb__cuda_devinfo g_info[NB__CUDA_MAX_DEVICES];
static bool g_info_read[NB__CUDA_MAX_DEVICES];
static pthread_mutex_t g_info_lock = PTHREAD_MUTEX_INITIALIZER;

const nb__cuda_devinfo *nb__cuda_devinfo_of(int device) {
    if (device < 0 || device >= NB__CUDA_MAX_DEVICES) device = 0;
    pthread_mutex_lock(&g_info_lock);
    if (!g_info_read[device]) {
        struct cudaDeviceProp p;
        memset(&p, 0, sizeof p);
        if (cudaGetDeviceProperties(&p, device) == cudaSuccess)
            g_info[device] = (nb__cuda_devinfo){p.multiProcessorCount, p.maxThreadsPerBlock,
                                                p.sharedMemPerBlockOptin, p.major, p.minor};
        else {
            (void)cudaGetLastError();
            g_info[device] = (nb__cuda_devinfo){1, 1024, 48 * 1024, 0, 0};
        }
        g_info_read[device] = true;
    }
    pthread_mutex_unlock(&g_info_lock);
    return &g_info[device];
}
