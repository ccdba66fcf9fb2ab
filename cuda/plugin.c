/* plugin.c - the plugin's side of cuda/plugin.h: the one exported entry point, which hands
 * libnabla the table of this plugin's functions, and the few libnabla functions the rest
 * of cuda/ calls (nb__error, nb_last_error, nb_last_status, nb__assert_fail), implemented
 * here through the host table libnabla passed in. The plugin is compiled with hidden
 * visibility, so these definitions (and every nb_cuda_* here) bind inside the plugin and
 * never shadow or resolve to libnabla's. Only CUDA builds compile it. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_api.h>

#include "cuda/backend.h"
#include "cuda/cuda_impl.h"
#include "nb_config.h"
#include "tensor/backend.h"
#include "tensor/error.h"

static const nb__cuda_host *g_host;

/* ---- libnabla's error functions, through the host table ----------------------------------- */
nb_status nb__error(nb_status s, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return g_host ? g_host->set_error(s, msg) : s;
}

const char *nb_last_error(void) { return g_host ? g_host->last_error() : ""; }
nb_status nb_last_status(void) { return g_host ? g_host->last_status() : NB_OK; }

_Noreturn void nb__assert_fail(const char *file, int line, const char *cond) {
    if (g_host) g_host->assert_fail(file, line, cond);
    fprintf(stderr, "nabla-cuda: internal invariant broken at %s:%d: %s\n", file, line, cond);
    abort();
}

/* ---- the table ---------------------------------------------------------------------------- */
static char g_libraries[1400];

static const nb__cuda_plugin g_plugin = {
    .abi = NB__CUDA_PLUGIN_ABI,
    .size = sizeof(nb__cuda_plugin),
    .version = NB_VERSION_STRING,
    .kernels_size = sizeof(nb__kernels),
    .libraries = g_libraries,
    .device_count = nb_cuda_device_count,
    .set_device = nb_cuda_set_device,
    .current_device = nb_cuda_current_device,
    .device_name = nb_cuda_device_name,
    .synchronize = nb_cuda_synchronize,
    .stream_new = nb_cuda_stream_new,
    .stream_free = nb_cuda_stream_free,
    .stream_synchronize = nb_cuda_stream_synchronize,
    .stream_default = nb_cuda_stream_default,
    .stream_current = nb_cuda_stream_current,
    .set_stream = nb_cuda_set_stream,
    .stream_device = nb_cuda_stream_device,
    .stream_handle = nb_cuda_stream_handle,
    .stream_wait = nb_cuda_stream_wait,
    .stream_role = nb_cuda_stream_role,
    .alloc = nb_cuda_alloc,
    .free = nb_cuda_free,
    .record_stream = nb_cuda_record_stream,
    .alloc_get_stats = nb_cuda_alloc_get_stats,
    .alloc_reset_peak = nb_cuda_alloc_reset_peak,
    .empty_cache = nb_cuda_empty_cache,
    .memcpy_h2d = nb_cuda_memcpy_h2d,
    .memcpy_d2h = nb_cuda_memcpy_d2h,
    .memcpy_d2d = nb_cuda_memcpy_d2d,
    .memcpy_h2d_async = nb_cuda_memcpy_h2d_async,
    .memcpy_d2h_async = nb_cuda_memcpy_d2h_async,
    .memcpy_d2d_async = nb_cuda_memcpy_d2d_async,
    .backend = nb__cuda_backend,
    .kernels = nb__cuda_kernels,
    .fill_f32 = nb__cuda_fill_f32,
    .add_f32 = nb__cuda_add_f32,
    .gemm_f32 = nb__cuda_gemm_f32,
    .cudnn_version = nb__cuda_cudnn_version,
    .nccl_version = nb__cuda_nccl_version,
    .nccl_unique_id = nb__cuda_nccl_unique_id,
    .nccl_comm_new = nb__cuda_nccl_comm_new,
    .nccl_comm_split = nb__cuda_nccl_comm_split,
    .nccl_comm_poll = nb__cuda_nccl_comm_poll,
    .nccl_comm_abort = nb__cuda_nccl_comm_abort,
    .nccl_comm_free = nb__cuda_nccl_comm_free,
    .nccl_start = nb__cuda_nccl_start,
    .nccl_op_poll = nb__cuda_nccl_op_poll,
    .nccl_op_finish = nb__cuda_nccl_op_finish,
    .nccl_op_free = nb__cuda_nccl_op_free,
};

__attribute__((visibility("default"))) nb_status
nb__cuda_plugin_init(const nb__cuda_host *host, const nb__cuda_plugin **out, char *msg,
                     size_t len) {
    if (msg && len) msg[0] = '\0';
    if (!host || !out) return NB_ENULL;
    *out = NULL;
    if (host->abi != NB__CUDA_PLUGIN_ABI || host->size != sizeof *host ||
        host->kernels_size != sizeof(nb__kernels) || !host->version ||
        strcmp(host->version, NB_VERSION_STRING) != 0) {
        if (msg && len)
            snprintf(msg, len, "libnabla (nabla %s, abi %u) does not match the plugin "
                     "(nabla %s, abi %d): install both from one build",
                     host->version ? host->version : "?", host->abi, NB_VERSION_STRING,
                     NB__CUDA_PLUGIN_ABI);
        return NB_EUNSUPPORTED;
    }
    g_host = host;
    /* cuDNN and NCCL are opened here, at run time (cuda/dl.h): a missing one disables only
     * what needs it, and this string says why. */
    long cudnn = nb__cuda_cudnn_version();
    char dnn[600] = "";
    if (cudnn > 0)
        snprintf(dnn, sizeof dnn, "cuDNN %ld.%ld.%ld", cudnn / 10000, cudnn / 100 % 100,
                 cudnn % 100);
    else
        snprintf(dnn, sizeof dnn, "no cuDNN (%.500s: convolutions by im2col + cuBLAS)",
                 nb__cuda_cudnn_why());
    long nccl = nb__cuda_nccl_version();
    char ccl[600] = "";
    if (nccl > 0) /* 2.28.9 is 22809 (NCCL_VERSION: major * 10000 + minor * 100 + patch) */
        snprintf(ccl, sizeof ccl, "NCCL %ld.%ld.%ld", nccl / 10000, nccl / 100 % 100,
                 nccl % 100);
    else
        snprintf(ccl, sizeof ccl, "no NCCL (%.500s: collectives of CUDA tensors through host "
                 "memory)", nb__cuda_nccl_why());
    snprintf(g_libraries, sizeof g_libraries, "CUDA runtime %d.%d, cuBLAS %d.%d.%d, %s, %s",
             CUDART_VERSION / 1000, CUDART_VERSION / 10 % 100, CUBLAS_VER_MAJOR,
             CUBLAS_VER_MINOR, CUBLAS_VER_PATCH, dnn, ccl);
    *out = &g_plugin;
    return NB_OK;
}
