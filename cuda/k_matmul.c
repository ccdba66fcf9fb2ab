/* cuda/k_matmul.c - the CUDA gemm kernel (tensor/kernels/matmul.h) through cuBLASLt.
 * Registered by nb__cuda_reg_matmul (cuda/kernels.h). UNVERIFIED ON A GPU: written and
 * compiled where no GPU was available; the row-major to column-major mapping and the
 * descriptors are checked on the host (tests/cuda_host/matmul.cu), nothing here has run.
 *
 * Math: f32 with CUBLAS_COMPUTE_32F (true f32 products, no TF32) unless the environment
 * variable NB_CUDA_TF32=1 is set (read once per process), then CUBLAS_COMPUTE_32F_FAST_TF32
 * (f32 operands rounded to TF32 on the tensor cores: faster, about 3 decimal digits);
 * f64 with CUBLAS_COMPUTE_64F; bf16 a and b with f32 accumulation into an f32 C, or a bf16
 * C rounded once (c_bf16). A bias is cuBLASLt's bias epilogue with the bias in the output's
 * type, as cuBLASLt documents it (f32 for an f32 C, f64 for f64, and for a bf16 C a bf16
 * copy of the f32 bias made here, exact for nb_linear's biases); cuda/k_matmul.h has the
 * mapping, the batch split and the bias rule. When cuBLASLt has
 * no algorithm for a problem (say an epilogue or a broadcast batch it does not take), the
 * bias is written by row copies and accumulated with beta 1, then the batch runs one GEMM
 * per call; the cache remembers the problems without an algorithm, so the fallback costs
 * nothing after the first call. K == 0 (or alpha 0) never reaches cuBLASLt: C is zeroed
 * (beta 0), left (beta 1) or set to the bias rows, by memsets and copies.
 *
 * State per thread and device (like cuda/blas.c's cuBLAS handles): a cuBLASLt handle and an
 * LRU cache of the descriptors and the heuristic's algorithm per problem (shape, strides,
 * dtypes, transposes, pointer alignments), so the steady state of a training loop creates
 * nothing. The workspace (up to NB__LT_WORKSPACE bytes, only what the chosen algorithm
 * asks for, often none) comes from the caching allocator per call: it is stream-ordered,
 * so a thread that switches streams never shares a workspace between two streams' queued
 * matmuls, and it is freed right after the calls are enqueued. A thread-exit hook destroys
 * the handle and the cached descriptors. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_impl.h"
#include "cuda/k_matmul.h"
#include "cuda/kernels.h"

#define NB__LT_WORKSPACE ((size_t)32 << 20)
#define NB__LT_CACHE 32 /* problems remembered per thread and device */

/* What decides the descriptors and the algorithm: compared with memcmp, so always built
 * from a zeroed struct. */
typedef struct lt_key {
    nb__lt_plan plan; /* outer loop and all: zeroed past what the call uses */
    unsigned align_a, align_b, align_c, align_bias;
} lt_key;

typedef struct lt_entry {
    lt_key key;
    nb__lt_descs d;
    cublasLtMatmulAlgo_t algo;
    size_t workspace;
    bool none;     /* cuBLASLt has no algorithm for it (no descriptors kept) */
    uint64_t used; /* the clock at the last use; 0: empty slot */
} lt_entry;

typedef struct lt_state {
    cublasLtHandle_t handle;
    uint64_t clock;
    lt_entry cache[NB__LT_CACHE];
} lt_state;

/* NB_CUDA_TF32=1: f32 GEMMs on the TF32 tensor cores. 0 unknown, 1 off, 2 on. */
static atomic_int g_tf32;

static bool use_tf32(void) {
    int v = atomic_load_explicit(&g_tf32, memory_order_relaxed);
    if (!v) {
        const char *e = getenv("NB_CUDA_TF32");
        v = e && !strcmp(e, "1") ? 2 : 1;
        atomic_store_explicit(&g_tf32, v, memory_order_relaxed);
    }
    return v == 2;
}

/* The largest power of two dividing the bits given (pointers and byte strides or'ed), at
 * most 16: cuBLASLt's kernels ask for 4, 8 or 16 bytes, so larger alignments would only
 * split the cache. */
static unsigned align_of(uintptr_t x) {
    unsigned a = 16;
    while (a > 1 && (x & (a - 1))) a >>= 1;
    return a;
}

static void state_destroy(lt_state *s) {
    for (int i = 0; i < NB__LT_CACHE; i++)
        if (s->cache[i].used && !s->cache[i].none) nb__lt_descs_free(&s->cache[i].d);
    if (s->handle) (void)cublasLtDestroy(s->handle);
    free(s);
}

/* This thread's state for the current device `device`. */
static nb_status state_for(int device, lt_state **out) {
    nb__cuda_thread *t = nb__cuda_thread_state();
    if (!t) return nb_last_status();
    if (!t->blaslt[device]) {
        lt_state *s = calloc(1, sizeof *s);
        if (!s) return nb__error(NB_ENOMEM, "matmul: out of host memory for cuBLASLt's state");
        nb_status st = nb__lt_status(cublasLtCreate(&s->handle), "handle");
        if (st != NB_OK) {
            free(s);
            return st;
        }
        t->blaslt[device] = s;
    }
    *out = t->blaslt[device];
    return NB_OK;
}

/* The cached entry of key, or a new one (the least recently used slot recycled). */
static nb_status entry_for(lt_state *s, const lt_key *key, const void *bias, lt_entry **out) {
    lt_entry *victim = &s->cache[0];
    s->clock++;
    for (int i = 0; i < NB__LT_CACHE; i++) {
        lt_entry *e = &s->cache[i];
        if (e->used && !memcmp(&e->key, key, sizeof *key)) {
            e->used = s->clock;
            *out = e;
            return NB_OK;
        }
        if (e->used < victim->used) victim = e;
    }
    if (victim->used && !victim->none) nb__lt_descs_free(&victim->d);
    victim->used = 0;
    victim->none = false;
    lt_entry *e = victim;
    nb_status st = nb__lt_descs_new(&key->plan, &e->d);
    if (st != NB_OK) return st;
    /* the heuristic reads the bias pointer's alignment */
    cublasStatus_t cs = CUBLAS_STATUS_SUCCESS;
    if (key->plan.bias)
        cs = cublasLtMatmulDescSetAttribute(e->d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                            sizeof bias);
    cublasLtMatmulPreference_t pref = NULL;
    if (cs == CUBLAS_STATUS_SUCCESS) cs = cublasLtMatmulPreferenceCreate(&pref);
    size_t ws = NB__LT_WORKSPACE;
    uint32_t al[4] = {key->align_a, key->align_b, key->align_c, key->align_c};
    const cublasLtMatmulPreferenceAttributes_t an[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    if (cs == CUBLAS_STATUS_SUCCESS)
        cs = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws, sizeof ws);
    for (int i = 0; i < 4 && cs == CUBLAS_STATUS_SUCCESS; i++)
        cs = cublasLtMatmulPreferenceSetAttribute(pref, an[i], &al[i], sizeof al[i]);
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    int found = 0;
    if (cs == CUBLAS_STATUS_SUCCESS)
        cs = cublasLtMatmulAlgoGetHeuristic(s->handle, e->d.op, e->d.a, e->d.b, e->d.c, e->d.c,
                                            pref, 1, &res, &found);
    if (pref) (void)cublasLtMatmulPreferenceDestroy(pref);
    if ((cs == CUBLAS_STATUS_SUCCESS && found < 1) || cs == CUBLAS_STATUS_NOT_SUPPORTED) {
        /* remembered, so that the fallbacks are tried at once next time */
        nb__lt_descs_free(&e->d);
        e->key = *key;
        e->none = true;
        e->used = s->clock;
        *out = e;
        return NB_OK;
    }
    if (cs != CUBLAS_STATUS_SUCCESS) {
        nb__lt_descs_free(&e->d);
        return nb__lt_status(cs, "heuristic");
    }
    e->key = *key;
    e->algo = res.algo;
    e->workspace = res.workspaceSize;
    e->used = s->clock;
    *out = e;
    return NB_OK;
}

/* Every row of the (M, N) matrix at c (row stride ldc, es-byte elements) becomes the N
 * elements at bias: row 0 copied from bias, then the filled rows doubled. */
static cudaError_t fill_rows(char *c, int64_t ldc, const void *bias, int64_t M, int64_t N,
                             size_t es, cudaStream_t stream) {
    size_t w = (size_t)N * es, pitch = (size_t)ldc * es;
    cudaError_t e = cudaMemcpyAsync(c, bias, w, cudaMemcpyDeviceToDevice, stream);
    for (int64_t r = 1; r < M && e == cudaSuccess; r *= 2) {
        int64_t h = M - r < r ? M - r : r;
        e = cudaMemcpy2DAsync(c + (size_t)r * pitch, pitch, c, pitch, w, (size_t)h,
                              cudaMemcpyDeviceToDevice, stream);
    }
    return e;
}

/* K == 0 or alpha == 0: C = beta * C (or the bias rows), never reading a or b. What
 * cannot be done with copies and memsets is refused before anything is enqueued. */
static nb_status degenerate_check(const nb__gemm_args *g) {
    if (g->beta != 0.0 && g->beta != 1.0)
        return nb__error(NB_EUNSUPPORTED,
                         "matmul: the cuda kernel does not handle K == 0 "
                         "(or alpha 0) with beta %g yet (only 0 or 1)",
                         g->beta);
    return NB_OK;
}

/* beta 0 without a bias: every C_i zeroed; with a bias (in C's dtype: the bf16 copy for a
 * bf16 C): its rows written into every C_i. */
static cudaError_t set_c(const nb__gemm_args *g, const void *bias, cudaStream_t stream) {
    size_t es = g->dtype == NB_F64 ? 8 : g->dtype == NB_BF16 && g->c_bf16 ? 2 : 4;
    int64_t nbatch = 1;
    for (int d = 0; d < g->batch_ndim; d++) nbatch *= g->batch_shape[d];
    cudaError_t e = cudaSuccess;
    for (int64_t i = 0; i < nbatch && e == cudaSuccess; i++) {
        int64_t r = i, oc = 0;
        for (int d = g->batch_ndim - 1; d >= 0; d--) {
            oc += r % g->batch_shape[d] * g->batch_stride_c[d];
            r /= g->batch_shape[d];
        }
        char *ci = (char *)g->c + oc * (int64_t)es;
        if (bias)
            e = fill_rows(ci, g->ldc, bias, g->M, g->N, es, stream);
        else /* beta 0: zeros (all-zero bits in f32, f64 and bf16) */
            e = cudaMemset2DAsync(ci, (size_t)g->ldc * es, 0, (size_t)g->N * es, (size_t)g->M,
                                  stream);
    }
    return e;
}

static cudaError_t gemm_degenerate(const nb__gemm_args *g, const void *bias,
                                   cudaStream_t stream) {
    if (g->beta == 1.0 && !bias) return cudaSuccess;
    return set_c(g, bias, stream);
}

/* The bias as cuBLASLt and the row copies take it: g's own, or for a bf16 C a bf16 copy in
 * scratch memory (*scratch, freed by the caller after the calls are enqueued). */
static nb_status bias_for(nb__cuda_kctx *c, const nb__gemm_args *g, const void **bias,
                          void **scratch) {
    *bias = g->bias && g->beta == 1.0 ? g->bias : NULL;
    *scratch = NULL;
    if (!*bias || !g->c_bf16) return NB_OK;
    uint16_t *b16 = nb__cuda_kscratch(c, (size_t)g->N * sizeof(uint16_t));
    if (!b16) return nb_last_status();
    cudaError_t e = nb__cuda_launch_bf16_from_f32(b16, g->bias, g->N, c->stream);
    if (e != cudaSuccess) {
        nb__cuda_kfree(b16);
        return nb__cuda_status(e, "matmul: bf16 bias");
    }
    *bias = b16;
    *scratch = b16;
    return NB_OK;
}

/* The cache entry for plan (with the alignments of this call's pointers). */
static nb_status lookup(lt_state *s, const nb__gemm_args *g, const nb__lt_plan *p,
                        const void *bias, lt_entry **out) {
    /* the key: the plan less what only the calls use (scalars, the host loop) */
    lt_key key;
    memset(&key, 0, sizeof key);
    memcpy(&key.plan, p, sizeof *p);
    key.plan.alpha = key.plan.beta = 0.0;
    key.plan.outer_ndim = 0;
    key.plan.ncalls = 0;
    memset(key.plan.outer_shape, 0, sizeof key.plan.outer_shape);
    memset(key.plan.outer_stride_a, 0, sizeof key.plan.outer_stride_a);
    memset(key.plan.outer_stride_b, 0, sizeof key.plan.outer_stride_b);
    memset(key.plan.outer_stride_c, 0, sizeof key.plan.outer_stride_c);
    /* alignments of every pointer any call of the loop uses */
    uintptr_t xa = (uintptr_t)g->b | (uintptr_t)(p->stride_a * (int64_t)p->ab_size);
    uintptr_t xb = (uintptr_t)g->a | (uintptr_t)(p->stride_b * (int64_t)p->ab_size);
    uintptr_t xc = (uintptr_t)g->c | (uintptr_t)(p->stride_c * (int64_t)p->c_size);
    for (int d = 0; d < p->outer_ndim; d++) {
        xa |= (uintptr_t)(p->outer_stride_b[d] * (int64_t)p->ab_size);
        xb |= (uintptr_t)(p->outer_stride_a[d] * (int64_t)p->ab_size);
        xc |= (uintptr_t)(p->outer_stride_c[d] * (int64_t)p->c_size);
    }
    key.align_a = align_of(xa);
    key.align_b = align_of(xb);
    key.align_c = align_of(xc);
    key.align_bias = p->bias ? align_of((uintptr_t)bias) : 0;
    return entry_for(s, &key, bias, out);
}

static nb_status cuda_gemm(const nb__gemm_args *g) {
    if (g->M <= 0 || g->N <= 0) return NB_OK;
    for (int d = 0; d < g->batch_ndim; d++)
        if (g->batch_shape[d] <= 0) return NB_OK;
    bool degenerate = g->K <= 0 || g->alpha == 0.0;
    unsigned flags = g->dtype == NB_F32 && use_tf32() ? NB__LT_TF32 : 0;
    nb__lt_plan plan;
    nb_status st = degenerate ? degenerate_check(g) : nb__lt_plan_of(g, flags, &plan);
    if (st != NB_OK) return st;
    nb__cuda_kctx c;
    if ((st = nb__cuda_kbegin(&c, "matmul")) != NB_OK) return st;
    if (!degenerate && plan.ncalls == 0) return nb__cuda_kend(&c, cudaSuccess);
    const void *bias = NULL;
    void *bias_scratch = NULL;
    if ((st = bias_for(&c, g, &bias, &bias_scratch)) != NB_OK) {
        nb__cuda_kend(&c, cudaSuccess);
        return st;
    }
    if (degenerate) {
        cudaError_t ce = gemm_degenerate(g, bias, c.stream);
        nb__cuda_kfree(bias_scratch);
        return nb__cuda_kend(&c, ce);
    }

    lt_state *s = NULL;
    lt_entry *e = NULL;
    if ((st = state_for(c.device, &s)) == NB_OK) st = lookup(s, g, &plan, bias, &e);
    /* no algorithm: the bias by copies, then every GEMM of the batch on its own, then both */
    static const unsigned fallbacks[3] = {NB__LT_FILL_BIAS, NB__LT_NO_FOLD,
                                          NB__LT_FILL_BIAS | NB__LT_NO_FOLD};
    for (int f = 0; f < 3 && st == NB_OK && e->none; f++) {
        if ((fallbacks[f] & NB__LT_FILL_BIAS) && !plan.bias) continue;
        if ((fallbacks[f] & NB__LT_NO_FOLD) && plan.batch <= 1) continue;
        nb__lt_plan alt;
        if (nb__lt_plan_of(g, flags | fallbacks[f], &alt) != NB_OK) continue;
        lt_entry *ae = NULL;
        if ((st = lookup(s, g, &alt, bias, &ae)) == NB_OK && !ae->none) {
            plan = alt;
            e = ae;
        }
    }
    if (st == NB_OK && e->none)
        st = nb__error(NB_EUNSUPPORTED,
                       "matmul: cuBLASLt has no algorithm for this GEMM (%lld x %lld x %lld, "
                       "lda %lld, ldb %lld, ldc %lld, dtype %d)",
                       (long long)g->M, (long long)g->K, (long long)g->N, (long long)g->lda,
                       (long long)g->ldb, (long long)g->ldc, (int)g->dtype);
    if (st != NB_OK) {
        nb__cuda_kfree(bias_scratch);
        nb__cuda_kend(&c, cudaSuccess);
        return st;
    }
    const nb__lt_plan *p = &plan;
    if (p->fill_bias) {
        cudaError_t ce = set_c(g, bias, c.stream);
        if (ce != cudaSuccess) {
            nb__cuda_kfree(bias_scratch);
            return nb__cuda_kend(&c, ce);
        }
    }
    cublasStatus_t cs = CUBLAS_STATUS_SUCCESS;
    if (p->bias)
        cs = cublasLtMatmulDescSetAttribute(e->d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                            sizeof bias);
    void *ws = NULL;
    if (cs == CUBLAS_STATUS_SUCCESS && e->workspace) {
        ws = nb__cuda_kscratch(&c, e->workspace);
        if (!ws) {
            st = nb_last_status();
            nb__cuda_kfree(bias_scratch);
            nb__cuda_kend(&c, cudaSuccess);
            return st;
        }
    }
    float alpha32 = (float)p->alpha, beta32 = (float)p->beta;
    const void *alpha = p->scale_type == CUDA_R_64F ? (const void *)&p->alpha : &alpha32;
    const void *beta = p->scale_type == CUDA_R_64F ? (const void *)&p->beta : &beta32;
    for (int64_t i = 0; i < p->ncalls && cs == CUBLAS_STATUS_SUCCESS; i++) {
        int64_t oa, ob, oc;
        nb__lt_call_offsets(p, i, &oa, &ob, &oc);
        const char *A = (const char *)g->a + oa * (int64_t)p->ab_size;
        const char *B = (const char *)g->b + ob * (int64_t)p->ab_size;
        char *C = (char *)g->c + oc * (int64_t)p->c_size;
        /* cuBLASLt's A is the args' b, its B the args' a (k_matmul.h) */
        cs = cublasLtMatmul(s->handle, e->d.op, alpha, B, e->d.a, A, e->d.b, beta, C, e->d.c, C,
                            e->d.c, &e->algo, ws, e->workspace, c.stream);
    }
    nb__cuda_kfree(ws);
    nb__cuda_kfree(bias_scratch);
    if (cs != CUBLAS_STATUS_SUCCESS) {
        st = nb__lt_status(cs, "matmul");
        nb__cuda_kend(&c, cudaSuccess);
        return st;
    }
    return nb__cuda_kend(&c, cudaGetLastError());
}

/* Thread exit: the handles and descriptors of this thread (stream.c runs the hook). */
static void lt_thread_exit(nb__cuda_thread *t) {
    for (int d = 0; d < NB__CUDA_MAX_DEVICES; d++) {
        if (!t->blaslt[d]) continue;
        int prev = -1;
        if (nb__cuda_enter(d, &prev, "cuda: thread exit") == NB_OK) {
            state_destroy(t->blaslt[d]);
            (void)cudaGetLastError();
            nb__cuda_leave(prev);
        }
        t->blaslt[d] = NULL;
    }
}

__attribute__((constructor)) static void lt_register(void) {
    nb__cuda_on_thread_exit(lt_thread_exit);
}

void nb__cuda_reg_matmul(nb__backend *be) {
    be->k.gemm = cuda_gemm;
    be->gemm_bf16 = true;
}
