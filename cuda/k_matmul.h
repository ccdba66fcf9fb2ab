/* cuda/k_matmul.h - private to the CUDA plugin: how cuda/k_matmul.c turns one gemm kernel
 * call (nb__gemm_args, tensor/kernels/matmul.h: row-major, batched with any strides) into
 * cuBLASLt matmuls (column-major, one strided batch each), and the cuBLASLt descriptors of
 * such a matmul. C17 and nvcc's host side alike (static inline functions, no GPU needed:
 * cuBLASLt creates descriptors and layouts without a device), so tests/cuda_host/matmul.cu
 * checks the mapping against the CPU's gemm on the host. Unverified on a GPU.
 *
 * The mapping. cuBLASLt is column-major: a row-major (M, N) matrix C with row stride ldc is
 * the column-major (N, M) matrix C^T with leading dimension ldc, and C^T = op(B)^T op(A)^T.
 * So cuBLASLt's "A" is the args' b and its "B" the args' a, each keeping its transpose flag
 * (a row-major K x N b read as column-major is N x K: op(b)^T with no transpose), and the
 * column-major problem is m = N, n = M, k = K.
 *
 * The batch. cuBLASLt runs one strided batch per call (a count and one stride per operand,
 * stride 0 broadcasting an operand). The args' batch dims (row-major, any strides) are cut
 * into an inner group of dims that fold into one strided dim for a, b and c alike (stride
 * of dim d == stride of dim d + 1 times its size) and the outer dims, which the caller loops
 * over with one cuBLASLt call each (offset pointers). Dims of size 1 are dropped first. C
 * never folds with stride 0: the GEMMs that write the same C run one after the other, in
 * batch order, as on the CPU.
 *
 *     nb__lt_plan p;
 *     if (nb__lt_plan_of(&args, 0, &p) != NB_OK) return nb_last_status();
 *     nb__lt_descs d;
 *     if (nb__lt_descs_new(&p, &d) != NB_OK) return nb_last_status();
 *     ... cublasLtMatmul(h, d.op, &alpha, p-ordered pointers, d.a, ..., d.c, ..., d.c ...)
 *     nb__lt_descs_free(&d);
 *
 * The bias. cuBLASLt documents the bias vector's type as the output's (Dtype; the
 * exceptions are integer and fp8 kernels, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE in
 * cublasLt.h), so an f32 bias with a bf16 result is not a documented pairing. For a bf16
 * C the kernel hands cuBLASLt a bf16 copy of the f32 bias instead (bias_bf16: rounded to
 * nearest even, as the CPU rounds), and the epilogue adds it in f32 before the one rounding
 * of the result. That is the CPU's result exactly when the bias values are bf16 numbers,
 * which is what nb_linear passes (its bias is a bf16 tensor widened to f32, autocast
 * included); any other f32 bias is rounded to bf16 first.
 *
 * Fallbacks (flags of nb__lt_plan_of), for when cuBLASLt's heuristic finds no algorithm
 * for a plan (k_matmul.c tries them in turn): NB__LT_FILL_BIAS writes the bias into every
 * row of C first (copies; the bf16 copy for a bf16 C) and accumulates onto it with beta 1
 * instead of the bias epilogue; NB__LT_NO_FOLD runs every GEMM of the batch as its own
 * call.
 *
 * The descriptors belong to the nb__lt_descs that holds them (nb__lt_descs_free). */
#ifndef NABLA_CUDA_K_MATMUL_H
#define NABLA_CUDA_K_MATMUL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* cublasLt.h declares a function with () (cublasLtGetCudartVersion): not a prototype in C */
#ifndef __cplusplus
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#endif
#include <cublasLt.h>
#ifndef __cplusplus
#pragma GCC diagnostic pop
#endif

#include "cuda/kernels.h"
#include "tensor/backend_table.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One cuBLASLt call's problem (column-major) and the host loop around it. Element units
 * for every stride and leading dimension; the "lt_a" operand is the args' b, "lt_b" the
 * args' a. */
typedef struct nb__lt_plan {
    cudaDataType_t ab_type, c_type, scale_type, bias_type;
    cublasComputeType_t compute;
    cublasOperation_t op_a, op_b;
    uint64_t m, n, k;
    uint64_t a_rows, a_cols, b_rows, b_cols; /* the stored lt_a, lt_b (before op) */
    int64_t lda, ldb, ldc;                   /* of lt_a (args' ldb), lt_b (args' lda), C */
    int32_t batch;                           /* the strided batch of one call (>= 1) */
    int64_t stride_a, stride_b, stride_c;    /* lt_a (args' b), lt_b (args' a), C */
    int outer_ndim;                          /* host loop over the outer batch dims */
    int64_t outer_shape[NB_MAX_DIMS];
    int64_t outer_stride_a[NB_MAX_DIMS], outer_stride_b[NB_MAX_DIMS];
    int64_t outer_stride_c[NB_MAX_DIMS]; /* args' a, b, c (not swapped) */
    int64_t ncalls;                      /* product of outer_shape; 0: nothing to do */
    size_t ab_size, c_size;              /* element bytes */
    bool bias;                           /* the bias epilogue (beta 0 then) */
    bool fill_bias;     /* the caller writes the bias rows into C first (beta 1 then) */
    bool bias_bf16;     /* bias or fill_bias from a bf16 copy of the f32 bias (a bf16 C) */
    double alpha, beta; /* as cuBLASLt gets them */
} nb__lt_plan;

#define NB__LT_TF32 1u      /* f32 products on the TF32 tensor cores (COMPUTE_32F_FAST_TF32) */
#define NB__LT_FILL_BIAS 2u /* the bias by row copies into C and beta 1, not the epilogue */
#define NB__LT_NO_FOLD 4u   /* one call per GEMM of the batch */

/* The column-major problem of a gemm call with M, N > 0, K > 0 and alpha != 0 (the caller
 * handles the degenerate cases) and its batch split; flags: NB__LT_*. NB_EUNSUPPORTED /
 * NB_EDTYPE / NB_EINTERNAL with the message set for what cuBLASLt cannot express here. */
static inline nb_status nb__lt_plan_of(const nb__gemm_args *g, unsigned flags, nb__lt_plan *p) {
    bool tf32 = (flags & NB__LT_TF32) != 0;
    memset(p, 0, sizeof *p);
    switch (g->dtype) {
    case NB_F32:
        p->ab_type = p->c_type = p->bias_type = p->scale_type = CUDA_R_32F;
        p->compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        p->ab_size = p->c_size = 4;
        break;
    case NB_F64:
        p->ab_type = p->c_type = p->bias_type = p->scale_type = CUDA_R_64F;
        p->compute = CUBLAS_COMPUTE_64F;
        p->ab_size = p->c_size = 8;
        break;
    case NB_BF16:
        p->ab_type = CUDA_R_16BF;
        p->c_type = g->c_bf16 ? CUDA_R_16BF : CUDA_R_32F;
        p->scale_type = CUDA_R_32F;
        p->bias_type = p->c_type; /* the documented bias type: the output's */
        p->compute = CUBLAS_COMPUTE_32F;
        p->ab_size = 2;
        p->c_size = g->c_bf16 ? 2 : 4;
        break;
    default:
        return nb__error(NB_EDTYPE, "matmul: the cuda GEMM takes f32, f64 or bf16, got dtype %d",
                         (int)g->dtype);
    }
    if (g->c_bf16 && g->dtype == NB_BF16 && (g->alpha != 1.0 || g->beta != (g->bias ? 1.0 : 0.0)))
        return nb__error(NB_EINTERNAL, "matmul: a bf16 C takes alpha 1 and no beta");
    /* bias: the CPU sets every row of C to it and accumulates with beta, so with beta 1 the
     * result is alpha * A B + bias (cuBLASLt's bias epilogue with beta 0), with beta 0 the
     * bias is overwritten (ignored here). Other betas would need beta * bias. */
    p->alpha = g->alpha;
    p->beta = g->beta;
    if (g->bias && g->beta == 1.0 && (flags & NB__LT_FILL_BIAS)) {
        p->fill_bias = true;
        p->bias_bf16 = g->c_bf16;
    } else if (g->bias && g->beta == 1.0) {
        p->bias = true;
        p->bias_bf16 = g->c_bf16;
        p->beta = 0.0;
    } else if (g->bias && g->beta != 0.0) {
        return nb__error(NB_EUNSUPPORTED,
                         "matmul: the cuda kernel does not handle a bias "
                         "with beta %g yet (only 0 or 1)",
                         g->beta);
    }
    p->m = (uint64_t)g->N;
    p->n = (uint64_t)g->M;
    p->k = (uint64_t)g->K;
    /* lt_a = args' b: stored K x N row-major = N x K column-major (op N), or stored N x K
     * row-major (trans_b) = K x N column-major (op T). */
    p->op_a = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    p->a_rows = g->trans_b ? (uint64_t)g->K : (uint64_t)g->N;
    p->a_cols = g->trans_b ? (uint64_t)g->N : (uint64_t)g->K;
    p->lda = g->ldb;
    /* lt_b = args' a: stored M x K row-major = K x M column-major (op N), or K x M
     * row-major (trans_a) = M x K column-major (op T). */
    p->op_b = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    p->b_rows = g->trans_a ? (uint64_t)g->M : (uint64_t)g->K;
    p->b_cols = g->trans_a ? (uint64_t)g->K : (uint64_t)g->M;
    p->ldb = g->lda;
    p->ldc = g->ldc;

    /* the batch: drop dims of size 1, note an empty batch */
    int nd = 0;
    int64_t sh[NB_MAX_DIMS], sa[NB_MAX_DIMS], sb[NB_MAX_DIMS], sc[NB_MAX_DIMS];
    p->ncalls = 1;
    p->batch = 1;
    for (int d = 0; d < g->batch_ndim; d++) {
        if (g->batch_shape[d] <= 0) {
            p->ncalls = 0;
            return NB_OK;
        }
        if (g->batch_shape[d] == 1) continue;
        sh[nd] = g->batch_shape[d];
        sa[nd] = g->batch_stride_a[d];
        sb[nd] = g->batch_stride_b[d];
        sc[nd] = g->batch_stride_c[d];
        nd++;
    }
    /* the inner group: from the last dim outwards while the strides fold */
    int inner = nd; /* first dim of the inner group */
    int64_t count = 1, ia = 0, ib = 0, ic = 0;
    if (nd > 0 && sc[nd - 1] != 0 && sh[nd - 1] <= INT32_MAX && !(flags & NB__LT_NO_FOLD)) {
        inner = nd - 1;
        count = sh[nd - 1];
        ia = sa[nd - 1], ib = sb[nd - 1], ic = sc[nd - 1];
        while (inner > 0) {
            int d = inner - 1;
            if (sa[d] != ia * count || sb[d] != ib * count || sc[d] != ic * count) break;
            if (count > INT32_MAX / sh[d]) break;
            count *= sh[d];
            inner = d;
        }
    }
    p->batch = (int32_t)count;
    p->stride_a = ib; /* lt_a is the args' b */
    p->stride_b = ia;
    p->stride_c = ic;
    p->outer_ndim = inner;
    for (int d = 0; d < inner; d++) {
        p->outer_shape[d] = sh[d];
        p->outer_stride_a[d] = sa[d];
        p->outer_stride_b[d] = sb[d];
        p->outer_stride_c[d] = sc[d];
        p->ncalls *= sh[d];
    }
    return NB_OK;
}

/* Element offsets of the args' a, b, c for host call i (0 <= i < ncalls), row-major over
 * the outer dims. */
static inline void nb__lt_call_offsets(const nb__lt_plan *p, int64_t i, int64_t *oa, int64_t *ob,
                                       int64_t *oc) {
    *oa = *ob = *oc = 0;
    for (int d = p->outer_ndim - 1; d >= 0; d--) {
        int64_t idx = i % p->outer_shape[d];
        i /= p->outer_shape[d];
        *oa += idx * p->outer_stride_a[d];
        *ob += idx * p->outer_stride_b[d];
        *oc += idx * p->outer_stride_c[d];
    }
}

/* cuBLASLt's descriptors of a plan: the operation and the layouts of lt_a, lt_b and C (D
 * is C: the same memory and layout). */
typedef struct nb__lt_descs {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
} nb__lt_descs;

static inline nb_status nb__lt_status(cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return NB_OK;
    nb_status s = st == CUBLAS_STATUS_ALLOC_FAILED    ? NB_ENOMEM
                  : st == CUBLAS_STATUS_INVALID_VALUE ? NB_EINVAL
                  : st == CUBLAS_STATUS_NOT_SUPPORTED ? NB_EUNSUPPORTED
                                                      : NB_EDEVICE;
    return nb__error(s, "matmul: cuBLASLt %s: %s (%s)", what, cublasGetStatusString(st),
                     cublasGetStatusName(st));
}

static inline void nb__lt_descs_free(nb__lt_descs *d) {
    if (d->op) (void)cublasLtMatmulDescDestroy(d->op);
    if (d->a) (void)cublasLtMatrixLayoutDestroy(d->a);
    if (d->b) (void)cublasLtMatrixLayoutDestroy(d->b);
    if (d->c) (void)cublasLtMatrixLayoutDestroy(d->c);
    memset(d, 0, sizeof *d);
}

static inline cublasStatus_t nb__lt_layout(cublasLtMatrixLayout_t *out, cudaDataType_t t,
                                           uint64_t rows, uint64_t cols, int64_t ld, int32_t batch,
                                           int64_t stride) {
    cublasStatus_t st = cublasLtMatrixLayoutCreate(out, t, rows, cols, ld);
    if (st != CUBLAS_STATUS_SUCCESS || batch <= 1) return st;
    st = cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                          sizeof batch);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    return cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                            &stride, sizeof stride);
}

/* Create the descriptors of p into *d (all or nothing). The bias pointer is set per call
 * (CUBLASLT_MATMUL_DESC_BIAS_POINTER), not here. */
static inline nb_status nb__lt_descs_new(const nb__lt_plan *p, nb__lt_descs *d) {
    memset(d, 0, sizeof *d);
    cublasStatus_t st = cublasLtMatmulDescCreate(&d->op, p->compute, p->scale_type);
    const char *what = "matmul descriptor";
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSA, &p->op_a,
                                            sizeof p->op_a);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSB, &p->op_b,
                                            sizeof p->op_b);
    if (st == CUBLAS_STATUS_SUCCESS && p->bias) {
        cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
        st = cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                &p->bias_type, sizeof p->bias_type);
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
        what = "matrix layout";
        st = nb__lt_layout(&d->a, p->ab_type, p->a_rows, p->a_cols, p->lda, p->batch, p->stride_a);
    }
    if (st == CUBLAS_STATUS_SUCCESS)
        st = nb__lt_layout(&d->b, p->ab_type, p->b_rows, p->b_cols, p->ldb, p->batch, p->stride_b);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = nb__lt_layout(&d->c, p->c_type, p->m, p->n, p->ldc, p->batch, p->stride_c);
    if (st != CUBLAS_STATUS_SUCCESS) {
        nb__lt_descs_free(d);
        return nb__lt_status(st, what);
    }
    return NB_OK;
}

#ifdef __cplusplus
}
#endif
#endif
