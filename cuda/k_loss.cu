// cuda/k_loss.cu - CUDA kernels of the loss family (tensor/kernels/loss.h): cross_entropy,
// nll_loss, bce_with_logits, forward and backward. Registered in the backend's table by
// nb__cuda_reg_loss (cuda/kernels.h). UNVERIFIED on a GPU: it compiles warning- and
// spill-free, and tests/cuda_host/loss.cu runs its math (cuda/k_loss.cuh) on the host in the
// kernels' order against the CPU kernels.
//
// cross_entropy, (N, C) scores with C > 64: a block of 256 per row, each thread an online max
// / sum of exps / sum over its classes, merged by nb_block_max / nb_block_sum (fixed order);
// (N, C, D > 1) or few classes: a thread per position, the CPU's two passes. The
// per-position losses (f64) go to scratch; one block of 1024 then sums them in a fixed order,
// counts the targets not ignored and writes out, count (and the NONE losses). nll_loss: a
// thread per position, then the same block. The backward kernels write dx (softmax - smoothed
// one-hot, scaled, from the saved lse; the mean's 1 / count read on the device): a block per
// row of more than 64 classes, else a thread per element. bce_with_logits: f64 math per
// element; the sum in two passes (at most 1024 block partials, then one block). No atomics,
// no host reads: the same bits every run. A target out of range gives a NaN loss there and
// is recorded in the device error flag (cuda/kerr.c): the next synchronization (reading the
// loss) fails with NB_EINDEX and the CPU's message ("cross_entropy: target 12 is out of range
// for 10 classes"), where the CPU fails the op itself; with NB_CUDA_SYNC_INDEX_CHECKS=1 the
// op waits and fails itself too.
#include <cstdlib>
#include <cstring>

#include "cuda/k_loss.cuh"

using namespace nbl;

namespace {

constexpr int kRowT = 256;

template <typename T>
__global__ void __launch_bounds__(kRowT)
    ce_row_kernel(const __grid_constant__ nb__cls_operands a, double *loss, acc_t<T> *lse,
                  void *none_out, nb__cuda_kerr *err) {
    using A = acc_t<T>;
    __shared__ A smax[32];
    __shared__ double ssum[32];
    const T *x = (const T *)a.x;
    for (int64_t n = blockIdx.x; n < a.N; n += gridDim.x) {
        int64_t t = ce_tgt(&a, n);
        if (!ce_valid(&a, t)) { // uniform over the block
            if (threadIdx.x == 0) {
                bool ig = ce_ignored(&a, t);
                cls_put(loss, none_out, a.xdt, n, ig ? 0.0 : (double)NAN);
                lse[n] = ig ? (A)0 : (A)NAN;
                if (!ig) nbk::nb_kerr_report(err, NB__CUDA_K_cross_entropy, 1, t, a.C);
            }
            continue;
        }
        const T *xr = x + n * a.C;
        sm_acc<A> acc = sm_row_thread<T>(xr, a.C, threadIdx.x, kRowT);
        A M = nbk::nb_block_max(acc.m, smax);
        double S = sm_total(nbk::nb_block_sum(sm_scaled(acc, M), ssum), M);
        double SX = nbk::nb_block_sum(acc.sx, ssum);
        if (threadIdx.x == 0) {
            ce_row_result<T>(&a, xr, t, M, S, SX, loss + n, lse + n);
            cls_put(loss, none_out, a.xdt, n, loss[n]);
        }
    }
}

template <typename T>
__global__ void ce_col_kernel(const __grid_constant__ nb__cls_operands a, double *loss,
                              acc_t<T> *lse, void *none_out, nb__cuda_kerr *err) {
    const int64_t P = a.N * a.D;
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < P;
         p += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = ce_tgt(&a, p), n = p / a.D, d = p - n * a.D;
        if (!ce_valid(&a, t)) {
            bool ig = ce_ignored(&a, t);
            cls_put(loss, none_out, a.xdt, p, ig ? 0.0 : (double)NAN);
            lse[p] = ig ? (acc_t<T>)0 : (acc_t<T>)NAN;
            if (!ig) nbk::nb_kerr_report(err, NB__CUDA_K_cross_entropy, 1, t, a.C);
            continue;
        }
        ce_col<T>(&a, (const T *)a.x + n * a.C * a.D + d, t, loss + p, lse + p);
        cls_put(loss, none_out, a.xdt, p, loss[p]);
    }
}

template <typename T>
__global__ void nll_pos_kernel(const __grid_constant__ nb__cls_operands a, double *loss,
                               void *none_out, nb__cuda_kerr *err) {
    const int64_t P = a.N * a.D;
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < P;
         p += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = ce_tgt(&a, p);
        if (!ce_valid(&a, t) && !ce_ignored(&a, t))
            nbk::nb_kerr_report(err, NB__CUDA_K_nll_loss, 1, t, a.C);
        cls_put(loss, none_out, a.xdt, p, nll_pos<T>(&a, p));
    }
}

// One block: the sum of the P losses and the count, in a fixed order; the reduced out and the
// count written (reduction NONE: the position kernels wrote out).
__global__ void __launch_bounds__(kFinishThreads)
    cls_finish_kernel(const __grid_constant__ nb__cls_operands a, const double *loss,
                      nb__loss_reduce red, void *out, int64_t *count) {
    __shared__ double ssum[32];
    __shared__ long long scnt[32];
    const int64_t P = a.N * a.D;
    double s = 0;
    long long k = 0;
    for (int64_t p = threadIdx.x; p < P; p += kFinishThreads) {
        double v = loss[p];
        s += v;
        k += ce_ignored(&a, ce_tgt(&a, p)) ? 0 : 1;
    }
    double total = nbk::nb_block_sum(s, ssum);
    long long cnt = nbk::nb_block_sum(k, scnt);
    if (threadIdx.x == 0) {
        if (red != NB__LOSS_NONE)
            ls_store(out, a.xdt, 0, red == NB__LOSS_SUM ? total : total / (double)cnt);
        if (count) *count = (int64_t)cnt;
    }
}

bool cls_supported(const nb__cls_operands *in) {
    return rd_float_dtype(in->xdt) && (in->tdt == NB_I32 || in->tdt == NB_I64);
}
nb_status cls_unsupported(const char *op, const nb__cls_operands *in) {
    return nb__error(NB_EUNSUPPORTED,
                     "%s: the cuda kernel does not handle scores of dtype %d "
                     "with targets of dtype %d",
                     op, (int)in->xdt, (int)in->tdt);
}

// NB_CUDA_SYNC_INDEX_CHECKS=1 (read once), as for the index kernels (cuda/k_index.cu).
bool sync_checks() {
    static const bool on = [] {
        const char *e = getenv("NB_CUDA_SYNC_INDEX_CHECKS");
        return e && *e && strcmp(e, "0") != 0;
    }();
    return on;
}

nb_status cls_forward(const nb__cls_loss_args *a, bool ce) {
    const nb__cls_operands &in = a->in;
    const int64_t P = in.N * in.D;
    if (!cls_supported(&in)) return cls_unsupported(a->op, &in);
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, a->op);
    if (st != NB_OK) return st;
    double *loss = (double *)nb__cuda_kscratch(&c, (size_t)(P > 0 ? P : 1) * sizeof(double));
    if (!loss) return nb__cuda_kfail(&c);
    void *none_out = a->reduction == NB__LOSS_NONE ? a->out : nullptr;
    // a target out of range: recorded for the next synchronization (cuda/kerr.c)
    nb__cuda_kerr *err = nb__cuda_kerr_of(c.device);
    if (P > 0) {
        NB_DISPATCH_FLOAT(in.xdt, T, {
            acc_t<T> *lse = (acc_t<T> *)a->lse;
            if (!ce) {
                nll_pos_kernel<T>
                    <<<nbk::nb_blocks(P), nbk::kThreads, 0, c.stream>>>(in, loss, none_out, err);
            } else if (ce_use_rows(&in)) {
                unsigned g = (unsigned)(in.N < nbk::kMaxBlocks ? in.N : nbk::kMaxBlocks);
                ce_row_kernel<T><<<g, kRowT, 0, c.stream>>>(in, loss, lse, none_out, err);
            } else {
                ce_col_kernel<T>
                    <<<nbk::nb_blocks(P), nbk::kThreads, 0, c.stream>>>(in, loss, lse, none_out, err);
            }
        });
    }
    if (a->reduction != NB__LOSS_NONE || a->count)
        cls_finish_kernel<<<1, kFinishThreads, 0, c.stream>>>(in, loss, a->reduction, a->out,
                                                              a->count);
    cudaError_t e = cudaGetLastError();
    nb__cuda_kfree(loss);
    // NB_CUDA_SYNC_INDEX_CHECKS=1: wait here and fail the op itself, as the CPU does
    // (cuda/k_index.h: for debugging and the op tests on a GPU)
    bool sync = P > 0 && sync_checks();
    if (e == cudaSuccess && sync) e = cudaStreamSynchronize(c.stream);
    int device = c.device;
    st = nb__cuda_kend(&c, e);
    return st == NB_OK && sync ? nb__cuda_kerr_check(device, a->op) : st;
}

template <typename T>
__global__ void ce_bwd_kernel(const __grid_constant__ nb__cls_operands a, nb__loss_reduce red,
                              const acc_t<T> *lse, const int64_t *count, const double *g, T *dx) {
    const int64_t n = a.N * a.C * a.D, gs = red == NB__LOSS_NONE ? 1 : 0;
    const double factor = cls_factor(red, count);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        ce_bwd_elem<T>(&a, lse, g, gs, factor, dx, i);
}

// (N, C) scores: a block per row, threads over the classes (no 64-bit divisions per element).
template <typename T>
__global__ void ce_bwd_row_kernel(const __grid_constant__ nb__cls_operands a, nb__loss_reduce red,
                                  const acc_t<T> *lse, const int64_t *count, const double *g,
                                  T *dx) {
    const int64_t gs = red == NB__LOSS_NONE ? 1 : 0;
    const double factor = cls_factor(red, count);
    for (int64_t n = blockIdx.x; n < a.N; n += gridDim.x)
        for (int64_t c = threadIdx.x; c < a.C; c += blockDim.x)
            ce_bwd_at<T>(&a, lse, g, gs, factor, dx, n, c, 0);
}

template <typename T>
__global__ void nll_bwd_kernel(const __grid_constant__ nb__cls_operands a, nb__loss_reduce red,
                               const int64_t *count, const double *g, T *dx) {
    const int64_t n = a.N * a.C * a.D, gs = red == NB__LOSS_NONE ? 1 : 0;
    const double factor = cls_factor(red, count);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        nll_bwd_elem<T>(&a, g, gs, factor, dx, i);
}

nb_status cls_backward(const nb__cls_loss_backward_args *a, bool ce) {
    const nb__cls_operands &in = a->in;
    const int64_t n = in.N * in.C * in.D;
    const char *op = ce ? "cross_entropy_backward" : "nll_loss_backward";
    if (!cls_supported(&in)) return cls_unsupported(op, &in);
    if (n == 0) return NB_OK;
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, op);
    if (st != NB_OK) return st;
    NB_DISPATCH_FLOAT(in.xdt, T, {
        if (ce && ce_use_rows(&in))
            ce_bwd_row_kernel<T><<<(unsigned)(in.N < nbk::kMaxBlocks ? in.N : nbk::kMaxBlocks),
                                   kRowT, 0, c.stream>>>(in, a->reduction, (const acc_t<T> *)a->lse,
                                                         a->count, a->g, (T *)a->dx);
        else if (ce)
            ce_bwd_kernel<T><<<nbk::nb_blocks(n), nbk::kThreads, 0, c.stream>>>(
                in, a->reduction, (const acc_t<T> *)a->lse, a->count, a->g, (T *)a->dx);
        else
            nll_bwd_kernel<T><<<nbk::nb_blocks(n), nbk::kThreads, 0, c.stream>>>(
                in, a->reduction, a->count, a->g, (T *)a->dx);
    });
    return nb__cuda_kend(&c, cudaGetLastError());
}

nb_status cuda_cross_entropy(const nb__cls_loss_args *a) { return cls_forward(a, true); }
nb_status cuda_nll_loss(const nb__cls_loss_args *a) { return cls_forward(a, false); }
nb_status cuda_cross_entropy_backward(const nb__cls_loss_backward_args *a) {
    return cls_backward(a, true);
}
nb_status cuda_nll_loss_backward(const nb__cls_loss_backward_args *a) {
    return cls_backward(a, false);
}

// ---- binary cross entropy with logits -----------------------------------------------------------
__global__ void __launch_bounds__(nbk::kThreads)
    bce_fwd_kernel(const __grid_constant__ nb__bce_operands a, char *out, double *part) {
    __shared__ double ssum[32];
    double s = 0;
    for (int64_t i = blockIdx.x * (int64_t)nbk::kThreads + threadIdx.x; i < a.n;
         i += (int64_t)gridDim.x * nbk::kThreads) {
        double v = bce_loss(&a, i);
        if (out) bce_st(out, a.ct, i, v);
        s += v;
    }
    double b = nbk::nb_block_sum(s, ssum);
    if (part && threadIdx.x == 0) part[blockIdx.x] = b;
}

__global__ void __launch_bounds__(kBcePartials)
    bce_sum_kernel(const double *part, int64_t nparts, int64_t n, nb__loss_reduce red, void *out,
                   nb_dtype out_dt) {
    __shared__ double ssum[32];
    double v = threadIdx.x < nparts ? part[threadIdx.x] : 0.0;
    double total = nbk::nb_block_sum(v, ssum);
    if (threadIdx.x == 0) ls_store(out, out_dt, 0, red == NB__LOSS_SUM ? total : total / (double)n);
}

nb_status cuda_bce_with_logits(const nb__bce_args *a) {
    const nb__bce_operands &in = a->in;
    if ((in.ct != NB_F32 && in.ct != NB_F64) || !rd_float_dtype(a->out_dt))
        return nb__error(NB_EUNSUPPORTED,
                         "bce_with_logits: the cuda kernel does not handle "
                         "compute dtype %d",
                         (int)in.ct);
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, "bce_with_logits");
    if (st != NB_OK) return st;
    const int64_t nb = bce_blocks(in.n);
    if (a->reduction == NB__LOSS_NONE) {
        if (in.n > 0)
            bce_fwd_kernel<<<(unsigned)nb, nbk::kThreads, 0, c.stream>>>(in, (char *)a->out,
                                                                         nullptr);
        return nb__cuda_kend(&c, cudaGetLastError());
    }
    double *part = (double *)nb__cuda_kscratch(&c, (size_t)nb * sizeof(double));
    if (!part) return nb__cuda_kfail(&c);
    bce_fwd_kernel<<<(unsigned)nb, nbk::kThreads, 0, c.stream>>>(in, nullptr, part);
    bce_sum_kernel<<<1, kBcePartials, 0, c.stream>>>(part, nb, in.n, a->reduction, a->out,
                                                     a->out_dt);
    cudaError_t e = cudaGetLastError();
    nb__cuda_kfree(part);
    return nb__cuda_kend(&c, e);
}

__global__ void bce_bwd_kernel(const __grid_constant__ nb__bce_backward_args b) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < b.in.n;
         i += (int64_t)gridDim.x * blockDim.x)
        bce_grads(&b, i);
}

nb_status cuda_bce_with_logits_backward(const nb__bce_backward_args *a) {
    if (a->in.ct != NB_F32 && a->in.ct != NB_F64)
        return nb__error(NB_EUNSUPPORTED,
                         "bce_with_logits_backward: the cuda kernel does not "
                         "handle compute dtype %d",
                         (int)a->in.ct);
    if (a->in.n == 0) return NB_OK;
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, "bce_with_logits_backward");
    if (st != NB_OK) return st;
    bce_bwd_kernel<<<nbk::nb_blocks(a->in.n), nbk::kThreads, 0, c.stream>>>(*a);
    return nb__cuda_kend(&c, cudaGetLastError());
}

} // namespace

extern "C" void nb__cuda_reg_loss(nb__backend *be) {
    be->k.cross_entropy = cuda_cross_entropy;
    be->k.cross_entropy_backward = cuda_cross_entropy_backward;
    be->k.nll_loss = cuda_nll_loss;
    be->k.nll_loss_backward = cuda_nll_loss_backward;
    be->k.bce_with_logits = cuda_bce_with_logits;
    be->k.bce_with_logits_backward = cuda_bce_with_logits_backward;
}
