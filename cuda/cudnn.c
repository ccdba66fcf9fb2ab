/* cudnn.c - cuDNN in the plugin (meson feature `cudnn`): its version, and the convolutions
 * of cuda/conv_cudnn.h (f32; bf16 forward and input gradient) that the conv kernels
 * (cuda/k_conv.cu) try before their im2col + GEMM fallback. Built only when meson found
 * cuDNN's headers; cuda/cudnn_none.c answers otherwise. The library itself is opened at run
 * time (cuda/cudnn_dl.h), so a machine without it still loads the plugin, and convolves by
 * im2col + GEMM. UNVERIFIED ON A GPU: no GPU was available
 * where this was written (the descriptors, cuda/cudnn_desc.c, are checked on the host by
 * tests/cuda_host/conv.cu).
 *
 * Handles: one per thread and device (like cuda/blas.c's cuBLAS handles), kept in
 * nb__cuda_thread.cudnn, bound to the kernel's stream before each call and destroyed by a
 * thread-exit hook (before the streams they are bound to).
 * Algorithms: cuDNN's heuristics (cudnnGetConvolution*Algorithm_v7, no benchmarking, no
 * host sync), the first one that succeeds, is DETERMINISTIC, uses FP32 math for f32
 * (CUDNN_FMA_MATH; bf16 may use tensor cores, f32 sums) and needs at most
 * CUDNN_MAX_WORKSPACE bytes; chosen once per device, direction, dtype and shape (a small
 * process-wide cache). The workspace comes from the caching allocator (nb__cuda_kscratch)
 * and is freed right after the call is enqueued. */
#include <pthread.h>
#include <string.h>

#include <cudnn.h>

#include "cuda/conv_cudnn.h"
#include "cuda/cuda_impl.h"
#include "cuda/cudnn_desc.h"
#include "cuda/cudnn_dl.h"
#include "tensor/error.h"

#define CUDNN_MAX_WORKSPACE ((size_t)1 << 30)
#define ALGO_CACHE 256

/* 0 when the cuDNN library is missing at run time (cuda/cudnn_dl.h: nb__cudnn_why says why):
 * then the convolutions below answer NB_EUNSUPPORTED and the conv kernels fall back. */
long nb__cuda_cudnn_version(void) { return nb__cudnn_load() ? (long)cudnnGetVersion() : 0; }
const char *nb__cuda_cudnn_why(void) { return nb__cudnn_why(); }

/* ---- handles ------------------------------------------------------------------------------ */
static nb_status handle_for(nb__cuda_kctx *c, cudnnHandle_t *out, const char *what) {
    nb__cuda_thread *t = nb__cuda_thread_state();
    if (!t) return nb_last_status();
    if (!t->cudnn[c->device]) {
        cudnnHandle_t h = NULL;
        nb_status st = nb__cudnn_status(cudnnCreate(&h), what);
        if (st != NB_OK) return st;
        t->cudnn[c->device] = h;
    }
    *out = t->cudnn[c->device];
    return nb__cudnn_status(cudnnSetStream(*out, c->stream), what);
}

static void cudnn_thread_exit(nb__cuda_thread *t) {
    for (int d = 0; d < NB__CUDA_MAX_DEVICES; d++) {
        if (!t->cudnn[d]) continue;
        int prev = -1;
        if (nb__cuda_enter(d, &prev, "cuda: thread exit") == NB_OK) {
            (void)cudnnDestroy((cudnnHandle_t)t->cudnn[d]);
            (void)cudaGetLastError();
            nb__cuda_leave(prev);
        }
        t->cudnn[d] = NULL;
    }
}

__attribute__((constructor)) static void cudnn_register(void) {
    nb__cuda_on_thread_exit(cudnn_thread_exit);
}

/* ---- the algorithm cache ------------------------------------------------------------------- */
enum { DIR_FWD, DIR_BWD_DATA, DIR_BWD_FILTER };

typedef struct algo_entry {
    bool used;
    int device, dir;
    nb_dtype dt;
    nb__conv2d_geom g;
    int algo;    /* -1: cuDNN has none that qualifies (the fallback runs) */
    size_t ws;   /* workspace bytes */
} algo_entry;

static algo_entry g_cache[ALGO_CACHE];
static int g_next; /* round-robin replacement once full */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static bool geom_eq(const nb__conv2d_geom *a, const nb__conv2d_geom *b) {
    return memcmp(a, b, sizeof *a) == 0;
}

static bool cache_get(int device, int dir, nb_dtype dt, const nb__conv2d_geom *g, int *algo,
                      size_t *ws) {
    bool hit = false;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < ALGO_CACHE && !hit; i++) {
        const algo_entry *e = &g_cache[i];
        if (e->used && e->device == device && e->dir == dir && e->dt == dt && geom_eq(&e->g, g))
            *algo = e->algo, *ws = e->ws, hit = true;
    }
    pthread_mutex_unlock(&g_lock);
    return hit;
}

static void cache_put(int device, int dir, nb_dtype dt, const nb__conv2d_geom *g, int algo,
                      size_t ws) {
    pthread_mutex_lock(&g_lock);
    algo_entry *e = &g_cache[g_next];
    g_next = (g_next + 1) % ALGO_CACHE;
    *e = (algo_entry){.used = true, .device = device, .dir = dir, .dt = dt, .g = *g,
                      .algo = algo, .ws = ws};
    pthread_mutex_unlock(&g_lock);
}

/* Whether an algorithm listed for math type m may run: f32 in plain FP32 only (entries listed
 * for tensor-op math are skipped; the descriptor keeps CUDNN_FMA_MATH, which the call runs
 * with); bf16 on tensor cores too, but never with down-conversions. */
static bool math_ok(nb_dtype dt, cudnnMathType_t m) {
    if (m == CUDNN_FMA_MATH || m == CUDNN_DEFAULT_MATH) return true;
    return dt == NB_BF16 && m == CUDNN_TENSOR_OP_MATH;
}

/* Pick from cuDNN's heuristics (perf arrays of each direction share these fields): the
 * first deterministic one whose math type math_ok allows. */
#define PICK(perf, n, SIZE_CALL)                                                           \
    for (int i = 0; i < (n) && *algo < 0; i++) {                                           \
        if (perf[i].status != CUDNN_STATUS_SUCCESS ||                                      \
            perf[i].determinism != CUDNN_DETERMINISTIC ||                                  \
            !math_ok(dt, perf[i].mathType))                                                \
            continue;                                                                      \
        size_t bytes = 0;                                                                  \
        if (SIZE_CALL != CUDNN_STATUS_SUCCESS || bytes > CUDNN_MAX_WORKSPACE) continue;    \
        *algo = (int)perf[i].algo, *ws = bytes;                                            \
    }

static nb_status choose(cudnnHandle_t h, const nb__cudnn_conv_desc *d, int dir, nb_dtype dt,
                        int *algo, size_t *ws, const char *what) {
    *algo = -1, *ws = 0;
    int n = 0;
    nb_status st = NB_OK;
    if (dir == DIR_FWD) {
        cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        st = nb__cudnn_status(cudnnGetConvolutionForwardAlgorithm_v7(
                                  h, d->x, d->w, d->conv, d->y,
                                  CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf),
                              what);
        if (st == NB_OK)
            PICK(perf, n, cudnnGetConvolutionForwardWorkspaceSize(h, d->x, d->w, d->conv, d->y,
                                                                   perf[i].algo, &bytes))
    } else if (dir == DIR_BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        st = nb__cudnn_status(cudnnGetConvolutionBackwardDataAlgorithm_v7(
                                  h, d->w, d->y, d->conv, d->x,
                                  CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf),
                              what);
        if (st == NB_OK)
            PICK(perf, n, cudnnGetConvolutionBackwardDataWorkspaceSize(
                              h, d->w, d->y, d->conv, d->x, perf[i].algo, &bytes))
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        st = nb__cudnn_status(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                                  h, d->x, d->y, d->conv, d->w,
                                  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf),
                              what);
        if (st == NB_OK)
            PICK(perf, n, cudnnGetConvolutionBackwardFilterWorkspaceSize(
                              h, d->x, d->y, d->conv, d->w, perf[i].algo, &bytes))
    }
    return st;
}

/* One convolution call of direction dir: a = the first input, b = the second, out = the
 * result (fwd: x, w -> y; bwd data: w, gy -> gx; bwd filter: x, gy -> gw). */
static nb_status run(nb__cuda_kctx *c, const nb__conv2d_geom *g, int dir, nb_dtype dt,
                     const void *a, const void *b, void *out, const char *what) {
    if (dt != NB_F32 && !(dt == NB_BF16 && dir != DIR_BWD_FILTER)) return NB_EUNSUPPORTED;
    if (!nb__cudnn_load()) return NB_EUNSUPPORTED; /* no cuDNN library: the fallback */
    int algo = -1;
    size_t ws = 0;
    bool cached = cache_get(c->device, dir, dt, g, &algo, &ws);
    if (cached && algo < 0) return NB_EUNSUPPORTED;
    nb__cudnn_conv_desc d;
    nb_status st = nb__cudnn_desc_make(&d, g, dt);
    if (st != NB_OK) return st;
    cudnnHandle_t h = NULL;
    st = handle_for(c, &h, what);
    if (st == NB_OK && !cached) {
        st = choose(h, &d, dir, dt, &algo, &ws, what);
        if (st == NB_OK) cache_put(c->device, dir, dt, g, algo, ws);
    }
    if (st == NB_OK && algo < 0) st = NB_EUNSUPPORTED;
    void *work = NULL;
    if (st == NB_OK && ws > 0 && !(work = nb__cuda_kscratch(c, ws))) st = nb_last_status();
    if (st == NB_OK) {
        const float one = 1.0f, zero = 0.0f; /* f32 scalars: the compute type is f32 */
        cudnnStatus_t s;
        if (dir == DIR_FWD)
            s = cudnnConvolutionForward(h, &one, d.x, a, d.w, b, d.conv,
                                        (cudnnConvolutionFwdAlgo_t)algo, work, ws, &zero, d.y,
                                        out);
        else if (dir == DIR_BWD_DATA)
            s = cudnnConvolutionBackwardData(h, &one, d.w, a, d.y, b, d.conv,
                                             (cudnnConvolutionBwdDataAlgo_t)algo, work, ws,
                                             &zero, d.x, out);
        else
            s = cudnnConvolutionBackwardFilter(h, &one, d.x, a, d.y, b, d.conv,
                                               (cudnnConvolutionBwdFilterAlgo_t)algo, work, ws,
                                               &zero, d.w, out);
        st = nb__cudnn_status(s, what);
    }
    nb__cuda_kfree(work);
    nb__cudnn_desc_free(&d);
    return st;
}

nb_status nb__cudnn_conv2d_fwd(nb__cuda_kctx *c, const nb__conv2d_geom *g, nb_dtype dt,
                               const void *x, const void *w, void *y) {
    return run(c, g, DIR_FWD, dt, x, w, y, "conv2d: cuDNN forward");
}

nb_status nb__cudnn_conv2d_bwd_data(nb__cuda_kctx *c, const nb__conv2d_geom *g, nb_dtype dt,
                                    const void *w, const void *gy, void *gx) {
    return run(c, g, DIR_BWD_DATA, dt, w, gy, gx, "conv2d_backward: cuDNN backward data");
}

nb_status nb__cudnn_conv2d_bwd_filter(nb__cuda_kctx *c, const nb__conv2d_geom *g, nb_dtype dt,
                                      const void *x, const void *gy, void *gw) {
    return run(c, g, DIR_BWD_FILTER, dt, x, gy, gw, "conv2d_backward: cuDNN backward filter");
}
