// cuda/k_lm.cu - CUDA kernels of the language-model family (tensor/kernels/lm.h): RMSNorm
// forward and backward, rotary position embeddings (and their inverse), the SwiGLU product
// and its backward. Registered in the backend's table by nb__cuda_reg_lm (cuda/kernels.h).
// UNVERIFIED ON A GPU: written and compiled where no GPU was available; the math
// (cuda/k_lm.cuh) is run on the host in the kernels' order by tests/cuda_host/lm.cu and
// compared with the CPU backend.
//
// dtypes: the compute dtypes the ops hand in, f32 and f64 (RMSNorm's rstd always f64).
// Deterministic: every sum has a fixed order, no atomics.
//
//   rms_norm           one block per row (ln_threads(D) threads): the block sum of x^2, y
//   rms_norm_backward  dx: one block per row (the row sum of g w x, then dx); dw: per
//                      (column, row chunk) partials, then per column in chunk order
//   rotary             the (T, D/2) cos/sin table in scratch, then one thread per pair
//   swiglu(_backward)  elementwise, grid-stride
#include "cuda/k_lm.cuh"
#include "cuda/kcommon.cuh"

namespace {

using namespace nbk;

constexpr unsigned kMaxGrid = 65535u * 8u;

inline unsigned capped(int64_t n) { return (unsigned)(n < 1 ? 1 : n > kMaxGrid ? kMaxGrid : n); }

// ---- RMSNorm --------------------------------------------------------------------------------
template <typename T>
__global__ void rms_fwd(const T *x, const T *w, T *y, double *rstd, int64_t N, int64_t D,
                        double eps) {
    __shared__ double red[32];
    for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
        const T *xr = x + i * D;
        const double r =
            nbl::rms_rstd(nb_block_sum(nbl::rms_part(xr, D, threadIdx.x, blockDim.x), red), D, eps);
        if (threadIdx.x == 0) rstd[i] = r;
        const T rt = (T)r;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) y[i * D + j] = nbl::rms_y(xr[j], rt, w, j);
    }
}

template <typename T>
__global__ void rms_bwd_dx(const T *g, const T *x, const T *w, const double *rstd, T *dx,
                           int64_t N, int64_t D) {
    __shared__ double red[32];
    for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
        const T *gr = g + i * D, *xr = x + i * D;
        const double s = nb_block_sum(nbl::rmsb_part(gr, w, xr, D, threadIdx.x, blockDim.x), red);
        const T c = nbl::rmsb_c<T>(rstd[i], s, D), rt = (T)rstd[i];
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
            dx[i * D + j] = nbl::rmsb_dx(gr[j], xr[j], w, j, rt, c);
    }
}

// grid (column blocks, chunks): part[ch * D + j]
template <typename T>
__global__ void rms_bwd_cols(const T *g, const T *x, const double *rstd, double *part, int64_t N,
                             int64_t D, int64_t nch) {
    const int64_t ch = blockIdx.y;
    const int64_t r0 = nbn::chunk_lo(N, ch, nch), r1 = nbn::chunk_lo(N, ch + 1, nch);
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < D;
         j += (int64_t)gridDim.x * blockDim.x)
        part[ch * D + j] = nbl::rmsp_col(g, x, rstd, D, j, r0, r1);
}

template <typename T>
__global__ void rms_bwd_combine(const double *part, T *dw, int64_t D, int64_t nch) {
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < D;
         j += (int64_t)gridDim.x * blockDim.x)
        dw[j] = (T)nbn::sum_chunks(part, nch, D, j);
}

// ---- rotary ---------------------------------------------------------------------------------
// cs[t * h2 + i], cs[T h2 + t * h2 + i]: cos and sin of position offset + t, pair i.
template <typename T>
__global__ void rot_table(T *cs, int64_t TT, int64_t D, int64_t offset, double base) {
    const int64_t h2 = D / 2, n = TT * h2;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < n;
         p += (int64_t)gridDim.x * blockDim.x)
        nbl::rot_cs<T>(offset + p / h2, p % h2, D, base, &cs[p], &cs[n + p]);
}

// One thread per pair (n, t, h, i) of the (N, T, H, D) input; x and y may alias.
template <typename T>
__global__ void rot_apply(const T *x, T *y, const T *cs, int64_t N, int64_t TT, int64_t H,
                          int64_t D, bool inverse) {
    const int64_t h2 = D / 2, n = N * TT * H * h2;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < n;
         p += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = p % h2, row = p / h2, t = row / H % TT, at = row * D + i;
        const T a = x[at], b = x[at + h2];
        T y1, y2;
        nbl::rot_pair(a, b, cs[t * h2 + i], cs[TT * h2 + t * h2 + i], inverse, &y1, &y2);
        y[at] = y1;
        y[at + h2] = y2;
    }
}

// ---- SwiGLU ---------------------------------------------------------------------------------
template <typename T> __global__ void glu_fwd(const T *a, const T *b, T *y, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = nbl::glu_y(a[i], b[i]);
}

template <typename T>
__global__ void glu_bwd(const T *g, const T *a, const T *b, T *da, T *db, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const T e = nbl::glu_e(a[i]);
        if (da) da[i] = nbl::glu_da(g[i], a[i], b[i], e);
        if (db) db[i] = nbl::glu_db(g[i], a[i], e);
    }
}

nb_status need_float(nb_dtype dt, const char *op) {
    if (dt == NB_F32 || dt == NB_F64) return NB_OK;
    return nb__error(NB_EUNSUPPORTED,
                     "%s: the cuda kernel takes the compute dtypes f32 and f64, got %d", op,
                     (int)dt);
}

// ---- entry points ---------------------------------------------------------------------------
nb_status cuda_rms_norm(const nb__rms_norm_args *a) {
    nb_status st = need_float(a->dtype, "rms_norm");
    if (st != NB_OK || a->N <= 0) return st;
    nb__cuda_kctx c;
    if ((st = nb__cuda_kbegin(&c, "rms_norm")) != NB_OK) return st;
    const int bs = nbn::ln_threads(a->D);
    if (a->dtype == NB_F64)
        rms_fwd<double><<<capped(a->N), bs, 0, c.stream>>>((const double *)a->x,
                                                            (const double *)a->w, (double *)a->y,
                                                            a->rstd, a->N, a->D, a->eps);
    else
        rms_fwd<float><<<capped(a->N), bs, 0, c.stream>>>((const float *)a->x, (const float *)a->w,
                                                           (float *)a->y, a->rstd, a->N, a->D,
                                                           a->eps);
    return nb__cuda_kend(&c, cudaGetLastError());
}

template <typename T>
cudaError_t rms_backward(const nb__rms_norm_backward_args *a, nb__cuda_kctx *c, double *part,
                         int64_t nch) {
    const T *g = (const T *)a->g, *x = (const T *)a->x, *w = (const T *)a->w;
    if (a->dx && a->N > 0)
        rms_bwd_dx<T><<<capped(a->N), nbn::ln_threads(a->D), 0, c->stream>>>(
            g, x, w, a->rstd, (T *)a->dx, a->N, a->D);
    if (part) {
        const unsigned cols = capped((a->D + nbn::kColThreads - 1) / nbn::kColThreads);
        rms_bwd_cols<T><<<dim3(cols, (unsigned)nch), nbn::kColThreads, 0, c->stream>>>(
            g, x, a->rstd, part, a->N, a->D, nch);
        rms_bwd_combine<T><<<cols, nbn::kColThreads, 0, c->stream>>>(part, (T *)a->dw, a->D, nch);
    }
    return cudaGetLastError();
}

nb_status cuda_rms_norm_backward(const nb__rms_norm_backward_args *a) {
    nb_status st = need_float(a->dtype, "rms_norm");
    if (st != NB_OK || a->D <= 0) return st;
    if (a->N <= 0 && !a->dw) return NB_OK;
    nb__cuda_kctx c;
    if ((st = nb__cuda_kbegin(&c, "rms_norm_backward")) != NB_OK) return st;
    const int64_t nch = nbn::ln_chunks(a->N, a->D);
    double *part = NULL;
    if (a->dw && !(part = (double *)nb__cuda_kscratch(&c, sizeof(double) * (size_t)(nch * a->D)))) {
        st = nb_last_status();
        nb__cuda_kend(&c, cudaSuccess);
        return st;
    }
    cudaError_t e = a->dtype == NB_F64 ? rms_backward<double>(a, &c, part, nch)
                                       : rms_backward<float>(a, &c, part, nch);
    if (part) nb__cuda_kfree(part); // stream-ordered: after the kernels above
    return nb__cuda_kend(&c, e);
}

template <typename T> cudaError_t rotary_run(const nb__rotary_args *a, T *cs, cudaStream_t s) {
    const int64_t h2 = a->D / 2, n = a->N * a->T * a->H * h2;
    rot_table<T><<<nb_blocks(a->T * h2), kThreads, 0, s>>>(cs, a->T, a->D, a->offset, a->base);
    rot_apply<T><<<nb_blocks(n), kThreads, 0, s>>>((const T *)a->x, (T *)a->y, cs, a->N, a->T,
                                                  a->H, a->D, a->inverse);
    return cudaGetLastError();
}

nb_status cuda_rotary(const nb__rotary_args *a) {
    nb_status st = need_float(a->dtype, "rotary");
    const int64_t h2 = a->D / 2;
    if (st != NB_OK || a->N * a->T * a->H * h2 <= 0) return st;
    nb__cuda_kctx c;
    if ((st = nb__cuda_kbegin(&c, "rotary")) != NB_OK) return st;
    const size_t es = a->dtype == NB_F64 ? sizeof(double) : sizeof(float);
    void *cs = nb__cuda_kscratch(&c, es * 2 * (size_t)(a->T * h2));
    if (!cs) {
        st = nb_last_status();
        nb__cuda_kend(&c, cudaSuccess);
        return st;
    }
    cudaError_t e = a->dtype == NB_F64 ? rotary_run<double>(a, (double *)cs, c.stream)
                                       : rotary_run<float>(a, (float *)cs, c.stream);
    nb__cuda_kfree(cs);
    return nb__cuda_kend(&c, e);
}

nb_status cuda_swiglu(const nb__swiglu_args *a) {
    nb_status st = need_float(a->dtype, "swiglu");
    if (st != NB_OK || a->n <= 0) return st;
    nb__cuda_kctx c;
    if ((st = nb__cuda_kbegin(&c, "swiglu")) != NB_OK) return st;
    if (a->dtype == NB_F64)
        glu_fwd<double><<<nb_blocks(a->n), kThreads, 0, c.stream>>>(
            (const double *)a->a, (const double *)a->b, (double *)a->y, a->n);
    else
        glu_fwd<float><<<nb_blocks(a->n), kThreads, 0, c.stream>>>(
            (const float *)a->a, (const float *)a->b, (float *)a->y, a->n);
    return nb__cuda_kend(&c, cudaGetLastError());
}

nb_status cuda_swiglu_backward(const nb__swiglu_backward_args *a) {
    nb_status st = need_float(a->dtype, "swiglu");
    if (st != NB_OK || a->n <= 0 || (!a->da && !a->db)) return st;
    nb__cuda_kctx c;
    if ((st = nb__cuda_kbegin(&c, "swiglu_backward")) != NB_OK) return st;
    if (a->dtype == NB_F64)
        glu_bwd<double><<<nb_blocks(a->n), kThreads, 0, c.stream>>>(
            (const double *)a->g, (const double *)a->a, (const double *)a->b, (double *)a->da,
            (double *)a->db, a->n);
    else
        glu_bwd<float><<<nb_blocks(a->n), kThreads, 0, c.stream>>>(
            (const float *)a->g, (const float *)a->a, (const float *)a->b, (float *)a->da,
            (float *)a->db, a->n);
    return nb__cuda_kend(&c, cudaGetLastError());
}

} // namespace

extern "C" void nb__cuda_reg_lm(nb__backend *be) {
    be->k.rms_norm = cuda_rms_norm;
    be->k.rms_norm_backward = cuda_rms_norm_backward;
    be->k.rotary = cuda_rotary;
    be->k.swiglu = cuda_swiglu;
    be->k.swiglu_backward = cuda_swiglu_backward;
}
