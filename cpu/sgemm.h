/* sgemm.h - private: nabla's own packed f32 GEMM (cpu/sgemm.c), one of the f32 paths of
 * cpu/gemm.c (which picks it; see docs/threads.md "GEMM providers").
 *
 * Same contract as nb__gemm_f32 (cpu/gemm.h): row-major, C = alpha * op(A) * op(B) + beta * C,
 * beta == 0 writes C without reading it; the caller has already handled M, N <= 0, K <= 0 and
 * alpha == 0. op(B) (and a transposed A) is packed once into panels that every worker shares,
 * and the sum over K always runs in the same blocks in the same order, so the bits depend on
 * M, N, K (and the values) only: never on the thread count or on how C is cut among the
 * threads.
 *
 *     if (nb__sgemm_packed_available())
 *         st = nb__sgemm_packed(false, true, M, N, K, 1.0f, x, K, w, K, 0.0f, y, N);
 *
 * Returns NB_OK, or NB_ENOMEM with nb_last_error() set (C untouched) when the packing buffer
 * cannot be allocated. The buffer belongs to the calling thread and is kept between calls
 * (freed after the call when over 64 MiB). */
#ifndef NABLA_CPU_SGEMM_H
#define NABLA_CPU_SGEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "nabla/status.h"

/* False when this build has no kernel for the CPU it was compiled for (it needs AVX-512F, or
 * AVX2 and FMA, in the build's -march): then cpu/gemm.c keeps the provider path. */
bool nb__sgemm_packed_available(void);
/* "AVX-512", "AVX2" (the micro-kernel this build has) or "none". */
const char *nb__sgemm_packed_isa(void);

/* cpu/sgemm_path.c: whether this machine's f32 GEMMs default to the packed GEMM (true) or
 * the tiles of provider calls, by the CPU's features or a calibration cached per CPU (see
 * the file). Called once per process by cpu/gemm.c. */
bool nb__sgemm_choose_packed(void);
/* The cached calibration alone (NB_SGEMM=measure): the answer cached for this CPU and
 * build, else nb__sgemm_calibrate's, then cached. */
bool nb__sgemm_measured_packed(void);
/* The calibration itself, uncached: one thread's best time of a few GEMMs on each path
 * (either pointer may be NULL); true when packed was faster by more than 3 %. */
bool nb__sgemm_calibrate(double *tiles_s, double *packed_s);

/* cpu/gemm.c: an f32 product with 2 M N K below this runs on the packed GEMM whatever the
 * path (unless NB_SGEMM=tiles), so that a tiny product never loads a provider. */
#define NB__SGEMM_TINY_FLOPS (1 << 15)

nb_status nb__sgemm_packed(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                           float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                           float beta, float *C, int64_t ldc);

/* bf16 A and B (the f32 GEMM of a CPU without AVX512-BF16, cpu/gemm.c): the operands are
 * widened to f32 while they are packed (a row of A in place: MR rows at a time, into the
 * thread's scratch), so no widened copy of them is made; the f32 products and sums are the
 * ones above, so C gets the same bits as nb__sgemm_packed of the widened operands. */
nb_status nb__sgemm_packed_bf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                                float alpha, const uint16_t *A, int64_t lda, const uint16_t *B,
                                int64_t ldb, float beta, float *C, int64_t ldc);
/* bf16 A, B and C: C = op(A) op(B) (+ bias, N floats, in every row), each tile summed in an
 * f32 scratch tile and rounded once (nb__f32_to_bf16_n): the same bits as filling an f32 C
 * with the bias rows, nb__sgemm_packed(alpha 1, beta bias ? 1 : 0) of the widened operands,
 * and rounding C. */
nb_status nb__sgemm_packed_bf16_out(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                                    const uint16_t *A, int64_t lda, const uint16_t *B,
                                    int64_t ldb, const float *bias, uint16_t *C, int64_t ldc);

#endif
