/* gemm.h - private: the CPU GEMM provider layer (oneDNN or OpenBLAS behind one call), for
 * the CPU kernels (the `gemm` kernel of nb_matmul and linear in cpu/gemm.c, conv, attention).
 *
 * All matrices are row-major. op(A) is M x K, op(B) is K x N, C is M x N:
 *     C = alpha * op(A) * op(B) + beta * C
 * With transA false, A is stored M x K with row stride lda >= max(1, K); with transA true it
 * is stored K x M with lda >= max(1, M) (likewise B: K x N / N x K). ldc >= max(1, N).
 * beta == 0 means C is written without being read (NaN/garbage in C does not propagate).
 * Degenerate sizes are handled here: M == 0 or N == 0 does nothing, K == 0 scales C by beta.
 *
 * The provider (NB_GEMM_DNNL or NB_GEMM_OPENBLAS) is process wide (nabla/runtime.h); f64 always
 * goes to OpenBLAS (oneDNN has no dgemm). The product is cut into tiles by its shape alone,
 * each one single-threaded provider call over all of K, spread over nabla's workers
 * (nb__run_tasks), so its bits do not depend on the thread count. The calls are thread safe
 * and may be made from inside an OpenMP parallel region or a task (then the tiles run on the
 * calling thread, in order).
 * They return NB_OK, or a negative status with nb_last_error() set when the provider fails
 * (out of memory inside oneDNN, a dimension beyond OpenBLAS's 32-bit integers). */
#ifndef NABLA_CPU_GEMM_H
#define NABLA_CPU_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "nabla/runtime.h"
#include "nabla/status.h"

nb_status nb__gemm_f32(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                       const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                       float *C, int64_t ldc);
nb_status nb__gemm_f64(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                       double alpha, const double *A, int64_t lda, const double *B,
                       int64_t ldb, double beta, double *C, int64_t ldc);
/* bf16 A and B, f32 C: products and sums in f32. oneDNN's bf16 matmul primitive where
 * nb_gemm_bf16_native() (nabla/runtime.h), else the f32 path: nabla's packed GEMM reading
 * the bf16 operands (nb__sgemm_packed_bf16, cpu/sgemm.h) where the f32 path is the packed
 * one or the product is tiny, else both operands widened to f32 for the provider's tiles.
 * Either way the bits depend on the shape only, not on the thread count. */
nb_status nb__gemm_bf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                        const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb,
                        float beta, float *C, int64_t ldc);
/* The f32 path: tiles of provider calls or nabla's packed GEMM (cpu/sgemm.c), chosen once
 * per process (NB_SGEMM=packed or tiles, else cpu/sgemm_path.c; docs/threads.md). For tests
 * and benchmarks: switches (on is ignored where the packed kernel is not built) and returns
 * the previous choice. Not while GEMMs run on other threads. */
bool nb__sgemm_set_packed(bool on);
/* "nabla packed", "dnnl" or "openblas": what an f32 GEMM runs on now (decides it if not yet
 * decided). */
const char *nb__sgemm_path(void);
/* The f32 GEMM as tiles of single-threaded calls of the current provider, whatever the path
 * (same contract as nb__gemm_f32, degenerate sizes already handled by the caller). */
nb_status nb__sgemm_tiles(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                          float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                          float beta, float *C, int64_t ldc);

#endif
