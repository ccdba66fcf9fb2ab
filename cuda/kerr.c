/* kerr.c - the device error flag: how a CUDA kernel reports a bad value (an index out of
 * range, a class target past the logits) without a host synchronization in the op.
 *
 * The CPU kernels check every index before writing and return NB_EINDEX at once. A CUDA
 * kernel cannot return anything: the op that launched it has returned long before it runs,
 * and reading a result back would stall the GPU after every embedding and every loss. So a
 * kernel that finds a bad value skips the write and records the first such value in a
 * small per-device record in mapped, pinned host memory (nb__cuda_kerr_of). The record is
 * read at the next synchronization that happens anyway: a copy to the host (nb_item,
 * nb_to_device(t, NB_CPU), nb_read), nb_cuda_synchronize, nb_cuda_stream_synchronize.
 * That call then fails with NB_EINDEX and the kernel's message, and the record is cleared.
 * PyTorch reports these through device-side asserts, which kill the CUDA context; here the
 * process goes on. Unverified on a GPU. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda/cuda_impl.h"
#include "cuda/kernels.h"
#include "tensor/error.h"

static nb__cuda_kerr *g_kerr[NB__CUDA_MAX_DEVICES];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const g_names[] = {
#define NB__KERR_NAME(name, Args, what) #name,
    NB__KERNELS(NB__KERR_NAME)
#undef NB__KERR_NAME
};

nb__cuda_kerr *nb__cuda_kerr_of(int device) {
    if (device < 0 || device >= NB__CUDA_MAX_DEVICES) return NULL;
    pthread_mutex_lock(&g_lock);
    if (!g_kerr[device]) {
        void *p = NULL;
        int prev = -1;
        if (nb__cuda_enter(device, &prev, "cuda kernel error flag") == NB_OK) {
            if (cudaHostAlloc(&p, sizeof(nb__cuda_kerr), cudaHostAllocMapped) == cudaSuccess) {
                memset(p, 0, sizeof(nb__cuda_kerr));
                g_kerr[device] = p;
            } else {
                (void)cudaGetLastError();
                nb__error(NB_ENOMEM, "cuda kernel error flag: cudaHostAlloc failed");
            }
            nb__cuda_leave(prev);
        }
    }
    nb__cuda_kerr *r = g_kerr[device];
    pthread_mutex_unlock(&g_lock);
    return r; /* with UVA the host address is valid on the device */
}

nb_status nb__cuda_kerr_check(int device, const char *what) {
    if (device < 0 || device >= NB__CUDA_MAX_DEVICES) return NB_OK;
    pthread_mutex_lock(&g_lock);
    volatile nb__cuda_kerr *e = g_kerr[device];
    nb__cuda_kerr seen = {0};
    if (e && e->set) {
        seen = (nb__cuda_kerr){e->set, e->kernel, e->dim, e->value, e->bound};
        e->kernel = 0, e->dim = 0, e->value = 0, e->bound = 0;
        __atomic_store_n(&e->set, 0u, __ATOMIC_SEQ_CST);
    }
    pthread_mutex_unlock(&g_lock);
    if (!seen.set) return NB_OK;
    int nk = (int)(sizeof g_names / sizeof g_names[0]);
    const char *k = seen.kernel >= 0 && seen.kernel < nk ? g_names[seen.kernel] : "?";
    /* A class target: the CPU's message for it (cpu/loss.c), so a test or a user sees the
     * same words on both devices. */
    if (seen.kernel == NB__CUDA_K_cross_entropy || seen.kernel == NB__CUDA_K_nll_loss)
        return nb__error(NB_EINDEX,
                         "%s: a CUDA kernel found a bad value: %s: target %lld is out of range "
                         "for %lld classes (the kernel skipped it; reported at this "
                         "synchronization, the first one after it ran)",
                         what, k, (long long)seen.value, (long long)seen.bound);
    return nb__error(NB_EINDEX,
                     "%s: a CUDA kernel found a bad index: %s: index %lld is out of range for "
                     "dim %d of size %lld (the kernel skipped it; reported at this "
                     "synchronization, the first one after it ran)",
                     what, k, (long long)seen.value, seen.dim, (long long)seen.bound);
}
