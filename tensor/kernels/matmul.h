/* tensor/kernels/matmul.h - private: arguments of the matmul kernels (nb_matmul, the linear
 * op and their backward rules). C17 and nvcc; included through tensor/kernels.h.
 *
 * One descriptor for every GEMM an op issues, batched or not. The op definition decides
 * the geometry (which operand is read transposed, leading dimensions, whether batch dims
 * fold into rows); the backend decides how to run it (provider, threading over the batch). */
#ifndef NABLA_TENSOR_KERNELS_MATMUL_H
#define NABLA_TENSOR_KERNELS_MATMUL_H

#ifdef __cplusplus
extern "C" {
#endif

/* gemm: for every index i of the batch (batch_shape, row-major order),
 *     C_i = alpha * op(A_i) @ op(B_i) + beta * C_i
 * with all matrices row-major in element units:
 *   op(A_i) is M x K: A_i stored M x K with row stride lda >= max(1, K) (trans_a false), or
 *           K x M with lda >= max(1, M) (trans_a true, i.e. a column-major M x K);
 *   op(B_i) is K x N: likewise, stored K x N or N x K (trans_b), row stride ldb;
 *   C_i     is M x N with row stride ldc >= max(1, N).
 * A_i = a + sum_d idx_d * batch_stride_a[d] (elements), likewise B_i and C_i; a stride of 0
 * reads the same matrix along that dim (broadcast). batch_ndim 0 is a single GEMM.
 * bias: NULL, or N contiguous elements; then every row of every C_i is first set to bias
 * and the GEMM accumulates onto it with beta (the linear op passes beta = 1: C = A @ B^T +
 * bias, the bias costing one write pass and no extra read of C).
 * beta == 0 (without bias) writes C without reading it (garbage or NaN there does not
 * propagate). Degenerate sizes are valid: M or N == 0 does nothing; K == 0 gives
 * beta * C (zeros for beta 0, or the bias) and never reads a or b (they may be NULL).
 * dtype: NB_F32 or NB_F64, of a, b, c and bias; or NB_BF16, of a and b, with c and bias
 * f32 (products and sums in f32), where the backend's gemm_bf16 flag says it takes it
 * (tensor/backend.h). f16 is converted to f32 by the op.
 * c_bf16 (with dtype NB_BF16 only): c is bf16 as well, each element rounded once from its
 * f32 sum; then alpha is 1 and beta 0, or 1 with a bias (f32 still).
 * Errors: a provider failure (out of memory, a dimension beyond a 32-bit BLAS) comes back
 * as a status with the message set, naming "matmul". */
typedef struct nb__gemm_args {
    nb_dtype dtype;
    bool trans_a, trans_b;
    int64_t M, N, K;
    double alpha, beta;
    const void *a;
    int64_t lda;
    const void *b;
    int64_t ldb;
    void *c;
    int64_t ldc;
    const void *bias;
    bool c_bf16;
    int batch_ndim; /* 0..NB_MAX_DIMS */
    int64_t batch_shape[NB_MAX_DIMS];
    int64_t batch_stride_a[NB_MAX_DIMS], batch_stride_b[NB_MAX_DIMS];
    int64_t batch_stride_c[NB_MAX_DIMS];
} nb__gemm_args;

#ifdef __cplusplus
}
#endif

#define NB__K_MATMUL(X)                                                                    \
    X(gemm, nb__gemm_args, "batched row-major GEMM with broadcast batches and optional bias")

#endif
