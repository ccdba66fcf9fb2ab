// cuda/k_norm.cu - CUDA kernels of the norm family (tensor/kernels/norm.h): layer_norm and
// batch_norm, forward and backward, and dropout. Registered in the backend's table by
// nb__cuda_reg_norm (cuda/kernels.h). UNVERIFIED ON A GPU: written and compiled where no
// GPU was available; the math (cuda/k_norm.cuh) is run on the host in the kernels' order
// by tests/cuda_host/norm.cu and compared with the CPU backend.
//
// dtypes: the compute dtypes the norm ops hand in, f32 and f64 (statistics always f64);
// dropout every float dtype (f32, f64, f16, bf16). Deterministic: every sum has a fixed
// order (cuda/k_norm.cuh), no atomics.
//
//   layer_norm           one block per row (ln_threads(D) threads): two block sums (mean,
//                        then squared deviations), then y
//   layer_norm_backward  dx: one block per row (the two row sums, then dx); dw/db: per
//                        (column, row chunk) partials, then per column in chunk order
//   batch_norm_stats     per (channel, chunk) block partials, per-channel combine; twice
//                        (mean, then variance), the running statistics and rstd in the
//                        second combine; eval: from the running statistics
//   batch_norm_apply     elementwise
//   batch_norm_backward  per (channel, chunk) partials of sum g and sum g (x - mean), a
//                        per-channel combine (dw, db), then dx elementwise
#include "cuda/k_norm.cuh"
#include "cuda/kcommon.cuh"

namespace {

using namespace nbk;

constexpr unsigned kMaxGrid = 65535u * 8u; // blocks of a grid-stride launch

inline unsigned capped(int64_t n) { return (unsigned)(n < 1 ? 1 : n > kMaxGrid ? kMaxGrid : n); }

// ---- layer norm -----------------------------------------------------------------------------
template <typename T>
__global__ void ln_fwd(const T *x, const T *w, const T *b, T *y, double *mean, double *rstd,
                       int64_t N, int64_t D, double eps) {
    __shared__ double red[32];
    for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
        const T *xr = x + i * D;
        double m =
            nbn::ln_mean(nb_block_sum(nbn::ln_part_sum(xr, D, threadIdx.x, blockDim.x), red), D);
        double rs = nbn::ln_rstd(
            nb_block_sum(nbn::ln_part_dev2(xr, D, m, threadIdx.x, blockDim.x), red), D, eps);
        if (threadIdx.x == 0) {
            mean[i] = m;
            rstd[i] = rs;
        }
        T mt = (T)m, rt = (T)rs;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
            y[i * D + j] = nbn::ln_y(xr[j], mt, rt, w, b, j);
    }
}

template <typename T>
__global__ void ln_bwd_dx(const T *g, const T *x, const T *w, const double *mean,
                          const double *rstd, T *dx, int64_t N, int64_t D) {
    __shared__ double red[32];
    for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
        const T *gr = g + i * D, *xr = x + i * D;
        T m = (T)mean[i], r = (T)rstd[i];
        double s1, s2;
        nbn::lnb_part(gr, xr, w, m, r, D, threadIdx.x, blockDim.x, &s1, &s2);
        s1 = nb_block_sum(s1, red);
        s2 = nb_block_sum(s2, red);
        T c1 = (T)(s1 / (double)D), c2 = (T)(s2 / (double)D);
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
            dx[i * D + j] = nbn::lnb_dx(gr[j], xr[j], w, j, m, r, c1, c2);
    }
}

// grid (column blocks, chunks): part[ch * D + j] and part[(nch + ch) * D + j]
template <typename T>
__global__ void ln_bwd_cols(const T *g, const T *x, const double *mean, const double *rstd,
                            double *part, int64_t N, int64_t D, int64_t nch) {
    int64_t ch = blockIdx.y;
    int64_t r0 = nbn::chunk_lo(N, ch, nch), r1 = nbn::chunk_lo(N, ch + 1, nch);
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < D;
         j += (int64_t)gridDim.x * blockDim.x)
        nbn::lnp_col(g, x, mean, rstd, D, j, r0, r1, &part[ch * D + j], &part[(nch + ch) * D + j]);
}

template <typename T>
__global__ void ln_bwd_combine(const double *part, T *dw, T *db, int64_t D, int64_t nch) {
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < D;
         j += (int64_t)gridDim.x * blockDim.x) {
        if (dw) dw[j] = (T)nbn::sum_chunks(part, nch, D, j);
        if (db) db[j] = (T)nbn::sum_chunks(part + nch * D, nch, D, j);
    }
}

// ---- batch norm -----------------------------------------------------------------------------
// grid (channels, chunks): part[ch * C + c] (and part2) of channel c's values in chunk ch.
template <typename T>
__global__ void bn_partials(int kind, const T *x, const T *g, int64_t C, int64_t S, int64_t M,
                            const double *mean, int64_t nch, double *part, double *part2) {
    __shared__ double red[32];
    int64_t ch = blockIdx.y;
    int64_t m0 = nbn::chunk_lo(M, ch, nch), m1 = nbn::chunk_lo(M, ch + 1, nch);
    for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
        double p1, p2;
        nbn::bn_part(kind, x, g, C, S, c, mean ? mean[c] : 0.0, m0, m1, threadIdx.x, blockDim.x,
                     &p1, &p2);
        p1 = nb_block_sum(p1, red);
        if (kind == 2) p2 = nb_block_sum(p2, red);
        if (threadIdx.x == 0) {
            part[ch * C + c] = p1;
            if (kind == 2) part2[ch * C + c] = p2;
        }
    }
}

// step 0: mean[c] = sum / M. step 1: var = sum / M, the running statistics, rstd.
__global__ void bn_stats_combine(int step, const double *part, int64_t nch, int64_t C, int64_t M,
                                 double *mean, double *rstd, nb__view rm, nb__view rv,
                                 double momentum, double eps) {
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < C;
         c += (int64_t)gridDim.x * blockDim.x) {
        double s = nbn::sum_chunks(part, nch, C, c);
        double v = M ? s / (double)M : 0.0;
        if (step == 0) {
            mean[c] = v;
            continue;
        }
        if (rm.data) {
            nbn::bn_blend(nbn::view_at(rm, c), rm.dtype, mean[c], momentum, 1.0);
            nbn::bn_blend(nbn::view_at(rv, c), rv.dtype, v, momentum, (double)M / (double)(M - 1));
        }
        rstd[c] = 1.0 / sqrt(nbn::add(v, eps));
    }
}

__global__ void bn_stats_eval(int64_t C, double *mean, double *rstd, nb__view rm, nb__view rv,
                              double eps) {
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < C;
         c += (int64_t)gridDim.x * blockDim.x) {
        mean[c] = nbn::ld_any(nbn::view_at(rm, c), rm.dtype);
        double v = nbn::ld_any(nbn::view_at(rv, c), rv.dtype);
        rstd[c] = 1.0 / sqrt(nbn::add(v, eps));
    }
}

template <typename T>
__global__ void bn_apply(const T *x, T *y, int64_t n, int64_t C, int64_t S, const double *mean,
                         const double *rstd, const T *w, const T *b) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = nbn::bn_y(x[i], i / S % C, mean, rstd, w, b);
}

// sums[c] = sum g, sums[C + c] = sum g (x - mean); dw, db from them.
template <typename T>
__global__ void bn_bwd_combine(const double *part, int64_t nch, int64_t C, const double *rstd,
                               double *sums, T *dw, T *db) {
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < C;
         c += (int64_t)gridDim.x * blockDim.x) {
        double sg = nbn::sum_chunks(part, nch, C, c);
        double sgd = nbn::sum_chunks(part + nch * C, nch, C, c);
        sums[c] = sg;
        sums[C + c] = sgd;
        if (dw) dw[c] = (T)nbn::mul(sgd, rstd[c]);
        if (db) db[c] = (T)sg;
    }
}

template <typename T>
__global__ void bn_bwd_dx(const T *g, const T *x, T *dx, int64_t n, int64_t C, int64_t S,
                          const double *mean, const double *rstd, const T *w, bool batch_stats,
                          const double *sums, int64_t M) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dx[i] = nbn::bn_dx(g[i], x[i], i / S % C, mean, rstd, w, batch_stats, sums,
                           sums ? sums + C : nullptr, M);
}

// ---- dropout --------------------------------------------------------------------------------
__global__ void dropout_k(const void *x, const uint8_t *mask, void *out, int64_t n, nb_dtype dt,
                          double scale) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        nbn::dropout_el(x, mask, out, i, dt, scale);
}

nb_status need_float(nb_dtype dt, const char *op) {
    if (dt == NB_F32 || dt == NB_F64) return NB_OK;
    return nb__error(NB_EUNSUPPORTED,
                     "%s: the cuda kernel does not handle dtype %d yet "
                     "(f32 and f64 compute types)",
                     op, (int)dt);
}

// ---- entry points ---------------------------------------------------------------------------
nb_status cuda_layer_norm(const nb__layer_norm_args *a) {
    nb_status st = need_float(a->dtype, "layer_norm");
    if (st != NB_OK || a->N <= 0) return st;
    nb__cuda_kctx c;
    if ((st = nb__cuda_kbegin(&c, "layer_norm")) != NB_OK) return st;
    int bs = nbn::ln_threads(a->D);
    if (a->dtype == NB_F64)
        ln_fwd<double><<<capped(a->N), bs, 0, c.stream>>>(
            (const double *)a->x, (const double *)a->w, (const double *)a->b, (double *)a->y,
            a->mean, a->rstd, a->N, a->D, a->eps);
    else
        ln_fwd<float><<<capped(a->N), bs, 0, c.stream>>>((const float *)a->x, (const float *)a->w,
                                                         (const float *)a->b, (float *)a->y,
                                                         a->mean, a->rstd, a->N, a->D, a->eps);
    return nb__cuda_kend(&c, cudaGetLastError());
}

template <typename T>
cudaError_t ln_backward(const nb__layer_norm_backward_args *a, nb__cuda_kctx *c, double *part,
                        int64_t nch) {
    const T *g = (const T *)a->g, *x = (const T *)a->x, *w = (const T *)a->w;
    if (a->dx)
        ln_bwd_dx<T><<<capped(a->N), nbn::ln_threads(a->D), 0, c->stream>>>(
            g, x, w, a->mean, a->rstd, (T *)a->dx, a->N, a->D);
    if (part) {
        dim3 grid(capped((a->D + nbn::kColThreads - 1) / nbn::kColThreads), (unsigned)nch);
        ln_bwd_cols<T><<<grid, nbn::kColThreads, 0, c->stream>>>(g, x, a->mean, a->rstd, part, a->N,
                                                                 a->D, nch);
        ln_bwd_combine<T>
            <<<capped((a->D + nbn::kColThreads - 1) / nbn::kColThreads), nbn::kColThreads, 0,
               c->stream>>>(part, (T *)a->dw, (T *)a->db, a->D, nch);
    }
    return cudaGetLastError();
}

nb_status cuda_layer_norm_backward(const nb__layer_norm_backward_args *a) {
    nb_status st = need_float(a->dtype, "layer_norm");
    if (st != NB_OK || a->D <= 0) return st;
    bool params = (a->dw || a->db);
    if (a->N <= 0 && !params) return NB_OK;
    nb__cuda_kctx c;
    if ((st = nb__cuda_kbegin(&c, "layer_norm_backward")) != NB_OK) return st;
    int64_t nch = nbn::ln_chunks(a->N, a->D);
    double *part = NULL;
    if (params &&
        !(part = (double *)nb__cuda_kscratch(&c, sizeof(double) * 2 * (size_t)(nch * a->D)))) {
        st = nb_last_status();
        nb__cuda_kend(&c, cudaSuccess);
        return st;
    }
    cudaError_t e = a->dtype == NB_F64 ? ln_backward<double>(a, &c, part, nch)
                                       : ln_backward<float>(a, &c, part, nch);
    nb__cuda_kfree(part);
    return nb__cuda_kend(&c, e);
}

template <typename T>
void bn_sums(int kind, const T *x, const T *g, int64_t N, int64_t C, int64_t S, const double *mean,
             int64_t nch, double *part, cudaStream_t s) {
    dim3 grid(capped(C), (unsigned)nch);
    bn_partials<T>
        <<<grid, nbn::kBnThreads, 0, s>>>(kind, x, g, C, S, N * S, mean, nch, part, part + nch * C);
}

nb_status cuda_batch_norm_stats(const nb__batch_norm_stats_args *a) {
    nb_status st = need_float(a->dtype, "batch_norm");
    if (st != NB_OK || a->C <= 0) return st;
    nb__cuda_kctx c;
    if ((st = nb__cuda_kbegin(&c, "batch_norm_stats")) != NB_OK) return st;
    unsigned cg = capped((a->C + nbn::kColThreads - 1) / nbn::kColThreads);
    if (!a->training) {
        bn_stats_eval<<<cg, nbn::kColThreads, 0, c.stream>>>(
            a->C, a->mean, a->rstd, a->running_mean, a->running_var, a->eps);
        return nb__cuda_kend(&c, cudaGetLastError());
    }
    int64_t M = a->N * a->S, nch = nbn::bn_chunks(M);
    double *part = (double *)nb__cuda_kscratch(&c, sizeof(double) * (size_t)(nch * a->C));
    if (!part) {
        st = nb_last_status();
        nb__cuda_kend(&c, cudaSuccess);
        return st;
    }
    for (int step = 0; step < 2; step++) {
        if (a->dtype == NB_F64)
            bn_sums<double>(step, (const double *)a->x, nullptr, a->N, a->C, a->S,
                            step ? a->mean : nullptr, nch, part, c.stream);
        else
            bn_sums<float>(step, (const float *)a->x, nullptr, a->N, a->C, a->S,
                           step ? a->mean : nullptr, nch, part, c.stream);
        bn_stats_combine<<<cg, nbn::kColThreads, 0, c.stream>>>(
            step, part, nch, a->C, M, a->mean, a->rstd, a->running_mean, a->running_var,
            a->momentum, a->eps);
    }
    nb__cuda_kfree(part);
    return nb__cuda_kend(&c, cudaGetLastError());
}

nb_status cuda_batch_norm_apply(const nb__batch_norm_apply_args *a) {
    nb_status st = need_float(a->dtype, "batch_norm");
    int64_t n = a->N * a->C * a->S;
    if (st != NB_OK || n <= 0) return st;
    nb__cuda_kctx c;
    if ((st = nb__cuda_kbegin(&c, "batch_norm_apply")) != NB_OK) return st;
    if (a->dtype == NB_F64)
        bn_apply<double><<<nb_blocks(n), kThreads, 0, c.stream>>>(
            (const double *)a->x, (double *)a->y, n, a->C, a->S, a->mean, a->rstd,
            (const double *)a->w, (const double *)a->b);
    else
        bn_apply<float><<<nb_blocks(n), kThreads, 0, c.stream>>>(
            (const float *)a->x, (float *)a->y, n, a->C, a->S, a->mean, a->rstd,
            (const float *)a->w, (const float *)a->b);
    return nb__cuda_kend(&c, cudaGetLastError());
}

template <typename T>
void bn_backward(const nb__batch_norm_backward_args *a, bool need_sums, int64_t nch, double *part,
                 double *sums, cudaStream_t s) {
    const T *g = (const T *)a->g, *x = (const T *)a->x, *w = (const T *)a->w;
    if (need_sums) {
        bn_sums<T>(2, x, g, a->N, a->C, a->S, a->mean, nch, part, s);
        bn_bwd_combine<T>
            <<<capped((a->C + nbn::kColThreads - 1) / nbn::kColThreads), nbn::kColThreads, 0, s>>>(
                part, nch, a->C, a->rstd, sums, (T *)a->dw, (T *)a->db);
    }
    int64_t n = a->N * a->C * a->S;
    if (a->dx && n > 0)
        bn_bwd_dx<T><<<nb_blocks(n), kThreads, 0, s>>>(g, x, (T *)a->dx, n, a->C, a->S, a->mean,
                                                       a->rstd, w, a->batch_stats, sums,
                                                       a->N * a->S);
}

nb_status cuda_batch_norm_backward(const nb__batch_norm_backward_args *a) {
    nb_status st = need_float(a->dtype, "batch_norm");
    if (st != NB_OK || a->C <= 0) return st;
    bool need_sums = a->dw || a->db || (a->dx && a->batch_stats);
    nb__cuda_kctx c;
    if ((st = nb__cuda_kbegin(&c, "batch_norm_backward")) != NB_OK) return st;
    int64_t nch = nbn::bn_chunks(a->N * a->S);
    double *part = NULL;
    if (need_sums && !(part = (double *)nb__cuda_kscratch(
                           &c, sizeof(double) * (size_t)((2 * nch + 2) * a->C)))) {
        st = nb_last_status();
        nb__cuda_kend(&c, cudaSuccess);
        return st;
    }
    double *sums = part ? part + 2 * nch * a->C : nullptr;
    if (a->dtype == NB_F64)
        bn_backward<double>(a, need_sums, nch, part, sums, c.stream);
    else
        bn_backward<float>(a, need_sums, nch, part, sums, c.stream);
    nb__cuda_kfree(part);
    return nb__cuda_kend(&c, cudaGetLastError());
}

nb_status cuda_dropout(const nb__dropout_args *a) {
    if (a->n <= 0) return NB_OK;
    if (a->dtype != NB_F32 && a->dtype != NB_F64 && a->dtype != NB_F16 && a->dtype != NB_BF16)
        return nb__error(NB_EUNSUPPORTED, "dropout: the cuda kernel takes float dtypes, got %d",
                         (int)a->dtype);
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, "dropout");
    if (st != NB_OK) return st;
    dropout_k<<<nb_blocks(a->n), kThreads, 0, c.stream>>>(a->x, a->mask, a->out, a->n, a->dtype,
                                                          a->scale);
    return nb__cuda_kend(&c, cudaGetLastError());
}

} // namespace

extern "C" void nb__cuda_reg_norm(nb__backend *be) {
    be->k.layer_norm = cuda_layer_norm;
    be->k.layer_norm_backward = cuda_layer_norm_backward;
    be->k.batch_norm_stats = cuda_batch_norm_stats;
    be->k.batch_norm_apply = cuda_batch_norm_apply;
    be->k.batch_norm_backward = cuda_batch_norm_backward;
    be->k.dropout = cuda_dropout;
}
