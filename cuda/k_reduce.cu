// cuda/k_reduce.cu - CUDA kernels of the reduce family (tensor/kernels/reduce.h): reduce,
// softmax, softmax_backward, extreme_backward. Registered in the backend's table by
// nb__cuda_reg_reduce (cuda/kernels.h). UNVERIFIED on a GPU: it compiles warning- and
// spill-free, and tests/cuda_host/reduce.cu runs its math (cuda/k_reduce.cuh) on the host in
// the kernels' order against the CPU kernels.
//
// reduce: the CPU's plan (sorted, merged dims). Innermost dim kept or short reduced rows:
// the column kernel, a thread per output (adjacent threads, adjacent outputs) running
// through its chunk of the reduced range in order. Otherwise the row kernel, a block of 256
// per output, thread t taking r = t, t + 256, ... and a fixed shared-memory tree. When the
// reduced range is split into chunks (few outputs, long reductions), each (output, chunk)
// writes its partial state to scratch and a third kernel merges them in chunk order. The
// chunk counts depend on the shape only: the same bits on every run, no atomics.
//
// softmax / softmax_backward, inner == 1 and rows longer than 32: a block per row with an
// online max and sum of exps per thread, merged by nb_block_max / nb_block_sum (fixed
// order), then the write pass; otherwise a thread per column (or short row), the CPU's
// three passes. extreme_backward: one thread per dx element, g where the saved index
// points, else 0 (an index out of range leaves its column zero: the CPU's NB_EINDEX check
// would need a host read).
#include "cuda/k_reduce.cuh"

using namespace nbr;

namespace {

constexpr int kSmThreads = 256;

// ---- reduce ------------------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    rd_row_kernel(const __grid_constant__ rplan p, const __grid_constant__ rout o, const T *x,
                  rst *part) {
    __shared__ rst sh[kRowThreads];
    const int t = threadIdx.x;
    const bool integer = rd_is_int<T>::v;
    for (int64_t ch = blockIdx.y; ch < p.nch; ch += gridDim.y) {
        for (int64_t oi = blockIdx.x; oi < p.nout; oi += gridDim.x) {
            int64_t in, out;
            rd_ooff(&p, oi, &in, &out);
            sh[t] = rd_row_thread<T>(&p, o.kind, x + in, ch, t, kRowThreads);
            __syncthreads();
            for (int w = kRowThreads / 2; w > 0; w >>= 1) {
                if (t < w) sh[t] = rd_combine(o.kind, integer, sh[t], sh[t + w]);
                __syncthreads();
            }
            if (t == 0) {
                if (p.nch == 1)
                    rd_store(&o, out, sh[0]);
                else
                    part[oi * p.nch + ch] = sh[0];
            }
            __syncthreads();
        }
    }
}

template <typename T>
__global__ void rd_col_kernel(const __grid_constant__ rplan p, const __grid_constant__ rout o,
                              const T *x, rst *part) {
    const int64_t n = p.nout * p.nch;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t oi = i % p.nout, ch = i / p.nout, in, out;
        rd_ooff(&p, oi, &in, &out);
        rst s = rd_col_thread<T>(&p, o.kind, x + in, ch);
        if (p.nch == 1)
            rd_store(&o, out, s);
        else
            part[oi * p.nch + ch] = s;
    }
}

// The chunk partials of each output merged in chunk order.
__global__ void rd_merge_kernel(const __grid_constant__ rplan p, const __grid_constant__ rout o,
                                const rst *part) {
    for (int64_t oi = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; oi < p.nout;
         oi += (int64_t)gridDim.x * blockDim.x) {
        int64_t in, out;
        rd_ooff(&p, oi, &in, &out);
        rst s = part[oi * p.nch];
        for (int64_t ch = 1; ch < p.nch; ch++)
            s = rd_combine(o.kind, o.integer != 0, s, part[oi * p.nch + ch]);
        rd_store(&o, out, s);
    }
}

template <typename T>
void rd_launch(const rplan &p, const rout &o, const char *x, rst *part, cudaStream_t s) {
    const T *xt = (const T *)x;
    if (p.col) {
        rd_col_kernel<T><<<nbk::nb_blocks(p.nout * p.nch), nbk::kThreads, 0, s>>>(p, o, xt, part);
    } else {
        unsigned gx = (unsigned)(p.nout < nbk::kMaxBlocks ? p.nout : nbk::kMaxBlocks);
        dim3 grid(gx, (unsigned)p.nch);
        rd_row_kernel<T><<<grid, kRowThreads, 0, s>>>(p, o, xt, part);
    }
    if (p.nch > 1) rd_merge_kernel<<<nbk::nb_blocks(p.nout), nbk::kThreads, 0, s>>>(p, o, part);
}

nb_status cuda_reduce(const nb__reduce_args *a) {
    rplan p;
    rd_plan(&a->x, a->reduced, &p);
    nb_dtype dt = a->x.dtype;
    if ((unsigned)dt >= (unsigned)NB_DTYPE_COUNT ||
        (a->out && (unsigned)a->out_dtype >= (unsigned)NB_DTYPE_COUNT))
        return nb__error(NB_EUNSUPPORTED, "reduce: the cuda kernel does not handle dtype %d",
                         (int)dt);
    if (p.nout == 0) return NB_OK;
    rout o = rd_out_of(a);
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, "reduce");
    if (st != NB_OK) return st;
    rst *part = NULL;
    if (p.nch > 1) {
        part = (rst *)nb__cuda_kscratch(&c, (size_t)(p.nout * p.nch) * sizeof(rst));
        if (!part) return nb__cuda_kfail(&c);
    }
    switch (dt) {
    case NB_F32: rd_launch<float>(p, o, a->x.data, part, c.stream); break;
    case NB_F64: rd_launch<double>(p, o, a->x.data, part, c.stream); break;
    case NB_F16: rd_launch<nb_f16_t>(p, o, a->x.data, part, c.stream); break;
    case NB_BF16: rd_launch<nb_bf16_t>(p, o, a->x.data, part, c.stream); break;
    case NB_I32: rd_launch<int32_t>(p, o, a->x.data, part, c.stream); break;
    case NB_I64: rd_launch<int64_t>(p, o, a->x.data, part, c.stream); break;
    case NB_U8: rd_launch<uint8_t>(p, o, a->x.data, part, c.stream); break;
    default: rd_launch<rbool>(p, o, a->x.data, part, c.stream); break;
    }
    cudaError_t e = cudaGetLastError();
    nb__cuda_kfree(part);
    return nb__cuda_kend(&c, e);
}

// ---- softmax ------------------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(kSmThreads)
    sm_row_kernel(const T *x, T *y, int64_t O, int64_t L, bool lg) {
    using A = acc_t<T>;
    __shared__ A smax[32];
    __shared__ double ssum[32];
    for (int64_t row = blockIdx.x; row < O; row += gridDim.x) {
        const T *xr = x + row * L;
        T *yr = y + row * L;
        sm_acc<A> acc = sm_row_thread<T>(xr, L, threadIdx.x, kSmThreads);
        A M = nbk::nb_block_max(acc.m, smax);
        double S = sm_total(nbk::nb_block_sum(sm_scaled(acc, M), ssum), M);
        A f = sm_factor<A>(S, lg);
        // Every thread has read its elements into the sums before any writes (x may be y):
        // nb_block_sum ends with a barrier.
        for (int64_t i = threadIdx.x; i < L; i += kSmThreads)
            sm_st(yr + i, sm_out(sm_ld(xr + i), M, f, lg));
    }
}

template <typename T>
__global__ void sm_col_kernel(const T *x, T *y, int64_t O, int64_t L, int64_t D, bool lg) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < O * D;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = i / D, j = i - o * D;
        sm_col<T>(x + o * L * D + j, y + o * L * D + j, L, D, lg);
    }
}

template <typename T>
__global__ void __launch_bounds__(kSmThreads)
    smb_row_kernel(const T *y, const T *g, T *dx, int64_t O, int64_t L, bool lg) {
    __shared__ double ssum[32];
    for (int64_t row = blockIdx.x; row < O; row += gridDim.x) {
        const T *yr = y + row * L, *gr = g + row * L;
        T *dr = dx + row * L;
        double s =
            nbk::nb_block_sum(smb_row_thread<T>(yr, gr, L, threadIdx.x, kSmThreads, lg), ssum);
        acc_t<T> sf = (acc_t<T>)s;
        for (int64_t i = threadIdx.x; i < L; i += kSmThreads)
            sm_st(dr + i, smb_out(sm_ld(yr + i), sm_ld(gr + i), sf, lg));
    }
}

template <typename T>
__global__ void smb_col_kernel(const T *y, const T *g, T *dx, int64_t O, int64_t L, int64_t D,
                               bool lg) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < O * D;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = i / D, j = i - o * D, off = o * L * D + j;
        smb_col<T>(y + off, g + off, dx + off, L, D, lg);
    }
}

unsigned row_grid(int64_t rows) {
    return (unsigned)(rows < nbk::kMaxBlocks ? (rows > 0 ? rows : 1) : nbk::kMaxBlocks);
}

nb_status cuda_softmax(const nb__softmax_args *a) {
    int64_t O = a->outer, L = a->len, D = a->inner;
    if (!rd_float_dtype(a->dtype))
        return nb__error(NB_EUNSUPPORTED, "softmax: the cuda kernel does not handle dtype %d",
                         (int)a->dtype);
    if (O * L * D == 0) return NB_OK;
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, "softmax");
    if (st != NB_OK) return st;
    NB_DISPATCH_FLOAT(a->dtype, T, {
        const T *x = (const T *)a->x;
        T *y = (T *)a->y;
        if (sm_use_rows(L, D))
            sm_row_kernel<T><<<row_grid(O), kSmThreads, 0, c.stream>>>(x, y, O, L, a->log);
        else
            sm_col_kernel<T>
                <<<nbk::nb_blocks(O * D), nbk::kThreads, 0, c.stream>>>(x, y, O, L, D, a->log);
    });
    return nb__cuda_kend(&c, cudaGetLastError());
}

nb_status cuda_softmax_backward(const nb__softmax_backward_args *a) {
    int64_t O = a->outer, L = a->len, D = a->inner;
    if (!rd_float_dtype(a->dtype))
        return nb__error(NB_EUNSUPPORTED,
                         "softmax_backward: the cuda kernel does not handle dtype %d",
                         (int)a->dtype);
    if (O * L * D == 0) return NB_OK;
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, "softmax_backward");
    if (st != NB_OK) return st;
    NB_DISPATCH_FLOAT(a->dtype, T, {
        const T *y = (const T *)a->y, *g = (const T *)a->g;
        T *dx = (T *)a->dx;
        if (sm_use_rows(L, D))
            smb_row_kernel<T><<<row_grid(O), kSmThreads, 0, c.stream>>>(y, g, dx, O, L, a->log);
        else
            smb_col_kernel<T>
                <<<nbk::nb_blocks(O * D), nbk::kThreads, 0, c.stream>>>(y, g, dx, O, L, D, a->log);
    });
    return nb__cuda_kend(&c, cudaGetLastError());
}

// ---- extreme_backward ---------------------------------------------------------------------------
template <typename U>
__global__ void eb_kernel(const U *g, const int64_t *idx, U *dx, int64_t O, int64_t L, int64_t D) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < O * L * D;
         i += (int64_t)gridDim.x * blockDim.x)
        dx[i] = eb_value(g, idx, i, L, D);
}

nb_status cuda_extreme_backward(const nb__extreme_backward_args *a) {
    int64_t O = a->outer, L = a->len, D = a->inner, n = O * L * D;
    if (!rd_float_dtype(a->dtype))
        return nb__error(NB_EUNSUPPORTED,
                         "extreme_backward: the cuda kernel does not handle "
                         "dtype %d",
                         (int)a->dtype);
    if (n == 0) return NB_OK;
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, "extreme_backward");
    if (st != NB_OK) return st;
    unsigned nb = nbk::nb_blocks(n);
    switch (nb__kh_dtype_size(a->dtype)) {
    case 8:
        eb_kernel<<<nb, nbk::kThreads, 0, c.stream>>>((const uint64_t *)a->g, a->idx,
                                                      (uint64_t *)a->dx, O, L, D);
        break;
    case 4:
        eb_kernel<<<nb, nbk::kThreads, 0, c.stream>>>((const uint32_t *)a->g, a->idx,
                                                      (uint32_t *)a->dx, O, L, D);
        break;
    case 2:
        eb_kernel<<<nb, nbk::kThreads, 0, c.stream>>>((const uint16_t *)a->g, a->idx,
                                                      (uint16_t *)a->dx, O, L, D);
        break;
    default:
        eb_kernel<<<nb, nbk::kThreads, 0, c.stream>>>((const uint8_t *)a->g, a->idx,
                                                      (uint8_t *)a->dx, O, L, D);
        break;
    }
    return nb__cuda_kend(&c, cudaGetLastError());
}

} // namespace

extern "C" void nb__cuda_reg_reduce(nb__backend *be) {
    be->k.reduce = cuda_reduce;
    be->k.softmax = cuda_softmax;
    be->k.softmax_backward = cuda_softmax_backward;
    be->k.extreme_backward = cuda_extreme_backward;
}
