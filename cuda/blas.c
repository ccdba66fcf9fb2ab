/* blas.c - cuBLAS: one handle per thread and GPU, created on first use, and a row-major
 * single-precision GEMM on a nabla stream.
 *
 * A handle per thread, because a cuBLAS handle whose stream is changed by two threads at
 * once is a race (cuBLAS documents handles as not shareable that way); the handle is bound
 * to the caller's stream before each call. Handles are destroyed at thread exit by
 * stream.c. Math mode stays CUBLAS_DEFAULT_MATH (true FP32, no TF32) so results are
 * comparable with the CPU; the mixed-precision paths will choose tensor-core modes. */
#include <limits.h>

#include <cublas_v2.h>

#include "cuda/cuda_impl.h"
#include "tensor/error.h"

static nb_status blas_status(cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return NB_OK;
    nb_status s = st == CUBLAS_STATUS_ALLOC_FAILED    ? NB_ENOMEM
                  : st == CUBLAS_STATUS_INVALID_VALUE ? NB_EINVAL
                  : st == CUBLAS_STATUS_NOT_SUPPORTED ? NB_EUNSUPPORTED
                                                      : NB_EDEVICE;
    return nb__error(s, "%s: cuBLAS: %s (%s)", what, cublasGetStatusString(st),
                     cublasGetStatusName(st));
}

/* This thread's handle for s's device (which the caller made current), bound to s. */
static nb_status handle_for(nb_cuda_stream *s, cublasHandle_t *out, const char *what) {
    nb__cuda_thread *t = nb__cuda_thread_state();
    if (!t) return nb_last_status();
    if (!t->blas[s->device]) {
        cublasHandle_t h = NULL;
        nb_status st = blas_status(cublasCreate(&h), what);
        if (st != NB_OK) return st;
        t->blas[s->device] = h;
    }
    *out = t->blas[s->device];
    return blas_status(cublasSetStream(*out, s->handle), what);
}

static void blas_destroy(void *handle, int device) {
    int prev = -1;
    if (nb__cuda_enter(device, &prev, "cuda: thread exit") != NB_OK) return;
    (void)cublasDestroy((cublasHandle_t)handle);
    (void)cudaGetLastError();
    nb__cuda_leave(prev);
}

nb_status nb__cuda_gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                            float alpha, const float *a, int64_t lda, const float *b,
                            int64_t ldb, float beta, float *c, int64_t ldc,
                            nb_cuda_stream *s) {
    const char *what = "cuda gemm_f32";
    if (!(s = nb__cuda_stream_or_current(s, what))) return nb_last_status();
    if (m < 0 || n < 0 || k < 0)
        return nb__error(NB_EINVAL, "%s: negative size m=%lld n=%lld k=%lld", what,
                         (long long)m, (long long)n, (long long)k);
    int64_t big = m > n ? m : n;
    big = big > k ? big : k;
    big = big > lda ? big : lda;
    big = big > ldb ? big : ldb;
    big = big > ldc ? big : ldc;
    if (big > INT_MAX)
        return nb__error(NB_EUNSUPPORTED, "%s: sizes past 2^31-1 are not supported yet", what);
    if (m == 0 || n == 0) return NB_OK;
    if (!c || (k > 0 && (!a || !b)))
        return nb__error(NB_ENULL, "%s: argument '%s' is NULL", what, !c ? "c" : !a ? "a" : "b");
    int prev = -1;
    nb_status st = nb__cuda_enter(s->device, &prev, what);
    if (st != NB_OK) return st;
    cublasHandle_t h = NULL;
    if ((st = handle_for(s, &h, what)) == NB_OK) {
        /* cuBLAS is column-major: a row-major (m, n) C is a column-major (n, m) C^T, and
         * C^T = op(B)^T op(A)^T, so swap the operands and keep each transpose flag. */
        st = blas_status(cublasSgemm(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m,
                                     (int)k, &alpha, b, (int)ldb, a, (int)lda, &beta, c,
                                     (int)ldc),
                         what);
    }
    nb__cuda_leave(prev);
    return st;
}

/* Thread exit: this thread's handles go before its library streams (stream.c runs the hook). */
static void blas_thread_exit(nb__cuda_thread *t) {
    for (int d = 0; d < NB__CUDA_MAX_DEVICES; d++) {
        if (t->blas[d]) blas_destroy(t->blas[d], d);
        t->blas[d] = NULL;
    }
}

__attribute__((constructor)) static void blas_register(void) {
    nb__cuda_on_thread_exit(blas_thread_exit);
}
