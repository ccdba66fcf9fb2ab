/* device.c - which GPUs are usable, the current device, and CUDA error mapping.
 *
 * "No usable GPU" is decided once per process from cudaGetDeviceCount's return code: with
 * no driver it answers cudaErrorInsufficientDriver, with no device cudaErrorNoDevice, and
 * every public cuda function then fails with that reason instead of touching the GPU. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda/cuda_impl.h"
#include "cuda/k_index.h"
#include "cuda/kernels.h"
#include "cuda/policy.h"
#include "tensor/error.h"

static pthread_once_t g_count_once = PTHREAD_ONCE_INIT;
static int g_count;
static char g_reason[256];

static void count_devices(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(g_reason, sizeof g_reason, "%s", cudaGetErrorString(e));
        (void)cudaGetLastError(); /* not sticky: leave no trace for later calls */
        n = 0;
    } else if (n <= 0) {
        snprintf(g_reason, sizeof g_reason, "no CUDA-capable device is detected");
        n = 0;
    }
    /* Per-thread tables are sized by NB__CUDA_MAX_DEVICES; GPUs past it are not used. */
    g_count = n < NB__CUDA_MAX_DEVICES ? n : NB__CUDA_MAX_DEVICES;
}

int nb_cuda_device_count(void) {
    pthread_once(&g_count_once, count_devices);
    return g_count;
}

bool nb_cuda_is_available(void) { return nb_cuda_device_count() > 0; }

nb_status nb__cuda_status(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return NB_OK;
    (void)cudaGetLastError();
    nb_status s = e == cudaErrorMemoryAllocation ? NB_ENOMEM
                  : e == cudaErrorInvalidValue   ? NB_EINVAL
                                                 : NB_EDEVICE;
    return nb__error(s, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

nb_status nb__cuda_resolve(int device, int *out, const char *what) {
    int n = nb_cuda_device_count();
    if (n == 0) return nb__error(NB_EDEVICE, "%s: no usable GPU: %s", what, g_reason);
    if (device == -1) {
        int d = 0;
        nb_status s = nb__cuda_status(cudaGetDevice(&d), what);
        if (s != NB_OK) return s;
        if (d < 0 || d >= n)
            return nb__error(NB_EDEVICE, "%s: the current GPU %d is past the %d GPUs nabla uses",
                             what, d, n);
        *out = d;
        return NB_OK;
    }
    if (device < 0 || device >= n)
        return nb__error(NB_EDEVICE, "%s: device %d does not exist (this machine has %d GPU%s)",
                         what, device, n, n == 1 ? "" : "s");
    *out = device;
    return NB_OK;
}

nb_status nb__cuda_enter(int device, int *prev, const char *what) {
    *prev = -1;
    int d = 0, cur = 0;
    nb_status s = nb__cuda_resolve(device, &d, what);
    if (s != NB_OK) return s;
    if ((s = nb__cuda_status(cudaGetDevice(&cur), what)) != NB_OK) return s;
    if (cur == d) return NB_OK;
    if ((s = nb__cuda_status(cudaSetDevice(d), what)) != NB_OK) return s;
    *prev = cur;
    return NB_OK;
}

void nb__cuda_leave(int prev) {
    if (prev >= 0) (void)cudaSetDevice(prev);
}

nb_status nb_cuda_set_device(int device) {
    int d = 0;
    nb_status s = nb__cuda_resolve(device, &d, "cuda_set_device");
    if (s != NB_OK) return s;
    return nb__cuda_status(cudaSetDevice(d), "cuda_set_device");
}

int nb_cuda_current_device(void) {
    int d = 0;
    return nb__cuda_resolve(-1, &d, "cuda_current_device") == NB_OK ? d : -1;
}

nb_status nb_cuda_device_name(int device, char *buf, size_t len) {
    if (buf && len > 0) buf[0] = '\0';
    if (!buf && len > 0) return nb__error(NB_ENULL, "cuda_device_name: argument 'buf' is NULL");
    int d = 0;
    nb_status s = nb__cuda_resolve(device, &d, "cuda_device_name");
    if (s != NB_OK) return s;
    struct cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    if ((s = nb__cuda_status(cudaGetDeviceProperties(&prop, d), "cuda_device_name")) != NB_OK)
        return s;
    if (len > 0) snprintf(buf, len, "%s", prop.name);
    return NB_OK;
}

nb_status nb_cuda_synchronize(void) {
    int d = 0;
    nb_status s = nb__cuda_resolve(-1, &d, "cuda_synchronize");
    if (s != NB_OK) return s;
    if ((s = nb__cuda_status(cudaDeviceSynchronize(), "cuda_synchronize")) != NB_OK) return s;
    if ((s = nb__cuda_index_error(d)) != NB_OK) return s; /* the index kernels' record */
    return nb__cuda_kerr_check(d, "cuda_synchronize");   /* the other kernels' (kerr.c) */
}

/* ---- the runtime cuda/policy.c decides with ------------------------------------------------ */
static int rt_stream_query(void *stream) { return (int)cudaStreamQuery((cudaStream_t)stream); }
static int rt_event_query(void *event) { return (int)cudaEventQuery((cudaEvent_t)event); }
static int rt_get_last_error(void) { return (int)cudaGetLastError(); }
static int rt_event_record_new(void **event, void *stream) {
    cudaEvent_t ev = NULL;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) return (int)e;
    if ((e = cudaEventRecord(ev, (cudaStream_t)stream)) != cudaSuccess) {
        (void)cudaEventDestroy(ev);
        return (int)e;
    }
    *event = ev;
    return (int)cudaSuccess;
}
static void rt_event_destroy(void *event) { (void)cudaEventDestroy((cudaEvent_t)event); }

const nb__cuda_rt nb__cuda_rt_real = {
    .success = (int)cudaSuccess,
    .not_ready = (int)cudaErrorNotReady,
    .stream_query = rt_stream_query,
    .event_query = rt_event_query,
    .get_last_error = rt_get_last_error,
    .event_record_new = rt_event_record_new,
    .event_destroy = rt_event_destroy,
};
