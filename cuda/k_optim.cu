// cuda/k_optim.cu - CUDA kernels of the optim family (tensor/kernels/optim.h): the fused
// optimizer updates (sgd_step, adam_step, rmsprop_step, adagrad_step), gradient clipping
// (clip_abs_pow_sum, clip_abs_max, clip_scale, clip_clamp) and amp_unscale.
// Registered in the backend's table by nb__cuda_reg_optim (cuda/kernels.h).
//
// UNVERIFIED ON A GPU: this file compiles (nvcc -Werror, no spills); the per-element math
// (cuda/k_optim.cuh) is checked bit for bit against the CPU kernels on the host by
// tests/cuda_host/optim.cu, which also emulates the reductions' order; nothing here has
// run on a device.
//
// Updates: one thread per element (grid-stride loops, 64-bit indices), the per-step
// constants rounded to the element type on the host exactly as the CPU rounds them, the
// element math in the CPU's operation order without FMA contraction: the same bits as the
// CPU for f32 and f64 (the only dtypes the optimizers hand in; half parameters are updated
// through their f32 master copies by the core).
//
// Reductions (deterministic, and the CPU's bits for p = 1 and 2): clip_abs_pow_sum uses the
// CPU's chunking (16384-element chunks, 8 lane accumulators each): one thread per (chunk,
// lane) adds its lane in order, then one block adds each chunk's lanes in lane order and
// thread 0 adds the chunk totals in chunk order. clip_abs_max: per-thread maxima, a
// fixed-shape block tree, then one block over the block maxima (NaN wins).
//
// NO HOST SYNCS. clip_abs_pow_sum / clip_abs_max write their value, and amp_unscale its
// found flag, to a double in DEVICE memory the caller owns (tensor/kernels/optim.h:
// optim/clip.c gives each gradient a slot of one buffer, optim/scaler.c one flag per
// device) and reads back once per call of nb_clip_grad_norm / unscale. Every kernel here
// only enqueues work on the kernel context's stream.
#include <math.h>

#include "cuda/k_optim.cuh"
#include "cuda/kcommon.cuh"

static_assert(sizeof(nb__adam_step_args) == 4 + 4 + 8 + 5 * 8 + 7 * 8 + 8, "adam args layout");
static_assert(sizeof(nb__clip_reduce_args) == 8 * 5, "clip_reduce args layout");
static_assert(sizeof(nb__amp_unscale_args) == 4 * 2 + 8 * 5, "amp_unscale args layout");

using namespace nbk;

namespace {

// A failed nb__cuda_kscratch: leave the kernel context and keep the allocator's error
// (status and message) as the result.
nb_status scratch_failed(nb__cuda_kctx *c) {
    nb_status st = nb_last_status();
    (void)nb__cuda_kend(c, cudaSuccess);
    return st != NB_OK ? st : NB_ENOMEM;
}

#define NBO_GRID_LOOP(i, n)                                                                 \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);               \
         i += (int64_t)gridDim.x * blockDim.x)

// ---- updates ------------------------------------------------------------------------------
template <typename T>
__global__ void sgd_kernel(nbo::sgd_c<T> c, T *p, const T *g, T *buf, int64_t n) {
    NBO_GRID_LOOP(i, n) nbo::sgd_elem(c, p, g, buf, i);
}
template <typename T>
__global__ void adam_kernel(nbo::adam_c<T> c, T *p, const T *g, T *m, T *v, T *vmax,
                            int64_t n) {
    NBO_GRID_LOOP(i, n) nbo::adam_elem(c, p, g, m, v, vmax, i);
}
template <typename T>
__global__ void rmsprop_kernel(nbo::rmsprop_c<T> c, T *p, const T *g, T *sq, T *buf, T *ga,
                               int64_t n) {
    NBO_GRID_LOOP(i, n) nbo::rmsprop_elem(c, p, g, sq, buf, ga, i);
}
template <typename T>
__global__ void adagrad_kernel(nbo::adagrad_c<T> c, T *p, const T *g, T *sum, int64_t n) {
    NBO_GRID_LOOP(i, n) nbo::adagrad_elem(c, p, g, sum, i);
}

nb_status bad_dtype(const char *op, nb_dtype dt) {
    return nb__error(NB_EUNSUPPORTED, "%s: the cuda kernel does not handle dtype %d yet "
                     "(f32 and f64 only)", op, (int)dt);
}

nb_status cuda_sgd_step(const nb__sgd_step_args *a) {
    if (a->dtype != NB_F32 && a->dtype != NB_F64) return bad_dtype("sgd_step", a->dtype);
    if (a->n <= 0) return NB_OK;
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, "sgd_step");
    if (st != NB_OK) return st;
    if (a->dtype == NB_F32)
        sgd_kernel<float><<<nb_blocks(a->n), kThreads, 0, c.stream>>>(
            nbo::sgd_consts<float>(a), (float *)a->param, (const float *)a->grad,
            (float *)a->buf, a->n);
    else
        sgd_kernel<double><<<nb_blocks(a->n), kThreads, 0, c.stream>>>(
            nbo::sgd_consts<double>(a), (double *)a->param, (const double *)a->grad,
            (double *)a->buf, a->n);
    return nb__cuda_kend(&c, cudaGetLastError());
}

nb_status cuda_adam_step(const nb__adam_step_args *a) {
    if (a->dtype != NB_F32 && a->dtype != NB_F64) return bad_dtype("adam_step", a->dtype);
    if (a->n <= 0) return NB_OK;
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, "adam_step");
    if (st != NB_OK) return st;
    if (a->dtype == NB_F32)
        adam_kernel<float><<<nb_blocks(a->n), kThreads, 0, c.stream>>>(
            nbo::adam_consts<float>(a), (float *)a->param, (const float *)a->grad,
            (float *)a->m, (float *)a->v, (float *)a->vmax, a->n);
    else
        adam_kernel<double><<<nb_blocks(a->n), kThreads, 0, c.stream>>>(
            nbo::adam_consts<double>(a), (double *)a->param, (const double *)a->grad,
            (double *)a->m, (double *)a->v, (double *)a->vmax, a->n);
    return nb__cuda_kend(&c, cudaGetLastError());
}

nb_status cuda_rmsprop_step(const nb__rmsprop_step_args *a) {
    if (a->dtype != NB_F32 && a->dtype != NB_F64) return bad_dtype("rmsprop_step", a->dtype);
    if (a->n <= 0) return NB_OK;
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, "rmsprop_step");
    if (st != NB_OK) return st;
    if (a->dtype == NB_F32)
        rmsprop_kernel<float><<<nb_blocks(a->n), kThreads, 0, c.stream>>>(
            nbo::rmsprop_consts<float>(a), (float *)a->param, (const float *)a->grad,
            (float *)a->sq, (float *)a->buf, (float *)a->gavg, a->n);
    else
        rmsprop_kernel<double><<<nb_blocks(a->n), kThreads, 0, c.stream>>>(
            nbo::rmsprop_consts<double>(a), (double *)a->param, (const double *)a->grad,
            (double *)a->sq, (double *)a->buf, (double *)a->gavg, a->n);
    return nb__cuda_kend(&c, cudaGetLastError());
}

nb_status cuda_adagrad_step(const nb__adagrad_step_args *a) {
    if (a->dtype != NB_F32 && a->dtype != NB_F64) return bad_dtype("adagrad_step", a->dtype);
    if (a->n <= 0) return NB_OK;
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, "adagrad_step");
    if (st != NB_OK) return st;
    if (a->dtype == NB_F32)
        adagrad_kernel<float><<<nb_blocks(a->n), kThreads, 0, c.stream>>>(
            nbo::adagrad_consts<float>(a), (float *)a->param, (const float *)a->grad,
            (float *)a->sum, a->n);
    else
        adagrad_kernel<double><<<nb_blocks(a->n), kThreads, 0, c.stream>>>(
            nbo::adagrad_consts<double>(a), (double *)a->param, (const double *)a->grad,
            (double *)a->sum, a->n);
    return nb__cuda_kend(&c, cudaGetLastError());
}

// ---- in place: clip_scale, clip_clamp -----------------------------------------------------
bool is_float(nb_dtype dt) {
    return dt == NB_F32 || dt == NB_F64 || dt == NB_F16 || dt == NB_BF16;
}

__global__ void scale_kernel(void *x, nb_dtype dt, int64_t n, double s) {
    NBO_GRID_LOOP(i, n) nbo::scale_elem(x, dt, i, s);
}
__global__ void clamp_kernel(void *x, nb_dtype dt, int64_t n, double lo, double hi) {
    NBO_GRID_LOOP(i, n) nbo::clamp_elem(x, dt, i, lo, hi);
}

nb_status cuda_clip_inplace(const nb__clip_inplace_args *a, bool clamp) {
    const char *op = clamp ? "clip_clamp" : "clip_scale";
    if (!is_float(a->dtype))
        return nb__error(NB_EUNSUPPORTED, "%s: the cuda kernel does not handle dtype %d",
                         op, (int)a->dtype);
    if (a->n <= 0) return NB_OK;
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, op);
    if (st != NB_OK) return st;
    if (clamp)
        clamp_kernel<<<nb_blocks(a->n), kThreads, 0, c.stream>>>(a->x, a->dtype, a->n, a->lo,
                                                                 a->hi);
    else
        scale_kernel<<<nb_blocks(a->n), kThreads, 0, c.stream>>>(a->x, a->dtype, a->n, a->s);
    return nb__cuda_kend(&c, cudaGetLastError());
}
nb_status cuda_clip_scale(const nb__clip_inplace_args *a) { return cuda_clip_inplace(a, false); }
nb_status cuda_clip_clamp(const nb__clip_inplace_args *a) { return cuda_clip_inplace(a, true); }

// ---- clip_abs_pow_sum ---------------------------------------------------------------------
// lanes[t] for t = chunk * kLanes + lane: lane `lane` of chunk `chunk` (nbo::lane_pow_sum).
// Neighbouring threads take neighbouring lanes, so a warp reads 4 chunks' 8 consecutive
// elements at each step.
__global__ void pow_lanes_kernel(const void *x, nb_dtype dt, int64_t n, double p,
                                 double *lanes, int64_t nlanes) {
    NBO_GRID_LOOP(t, nlanes) {
        int64_t chunk = t / nbo::kLanes, s = chunk * nbo::kChunk;
        int64_t l = n - s < nbo::kChunk ? n - s : nbo::kChunk;
        lanes[t] = nbo::lane_pow_sum(x, dt, s, l, (int)(t % nbo::kLanes), p);
    }
}
// One block: chunk totals in parallel (into lanes[c * kLanes], a chunk's own first lane,
// read by no other thread), then thread 0 adds them in chunk order from 0.
__global__ void pow_finish_kernel(double *lanes, int64_t nch, double *result) {
    for (int64_t c = threadIdx.x; c < nch; c += blockDim.x) {
        double *l = lanes + c * nbo::kLanes;
        l[0] = nbo::chunk_total(l);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int64_t c = 0; c < nch; c++) t = nbo::add(t, lanes[c * nbo::kLanes]);
        *result = t;
    }
}

// ---- clip_abs_max -------------------------------------------------------------------------
// A block's NaN-sticky max over a fixed tree (shared memory, blockDim = kThreads).
__device__ double block_max_nan(double m, double *sh) {
    sh[threadIdx.x] = m;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] = nbo::max_nan(sh[threadIdx.x],
                                                                 sh[threadIdx.x + w]);
        __syncthreads();
    }
    return sh[0];
}
__global__ void max_partial_kernel(const void *x, nb_dtype dt, int64_t n, double *part) {
    __shared__ double sh[kThreads];
    double m = 0;
    NBO_GRID_LOOP(i, n) m = nbo::max_nan(m, fabs(nbo::load_d(x, dt, i)));
    m = block_max_nan(m, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = m;
}
__global__ void max_finish_kernel(const double *part, int64_t nparts, double *result) {
    __shared__ double sh[kThreads];
    double m = 0;
    for (int64_t i = threadIdx.x; i < nparts; i += blockDim.x) m = nbo::max_nan(m, part[i]);
    m = block_max_nan(m, sh);
    if (threadIdx.x == 0) *result = m;
}

nb_status cuda_clip_reduce(const nb__clip_reduce_args *a, bool max) {
    const char *op = max ? "clip_abs_max" : "clip_abs_pow_sum";
    if (!is_float(a->dtype))
        return nb__error(NB_EUNSUPPORTED, "%s: the cuda kernel does not handle dtype %d",
                         op, (int)a->dtype);
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, op);
    if (st != NB_OK) return st;
    const int64_t n = a->n;
    if (n <= 0) /* the value of an empty gradient is 0, in the caller's device slot */
        return nb__cuda_kend(&c, cudaMemsetAsync(a->result, 0, sizeof(double), c.stream));
    if (max) {
        unsigned nb = nb_blocks(n);
        double *part = (double *)nb__cuda_kscratch(&c, sizeof(double) * (size_t)nb);
        if (!part) return scratch_failed(&c);
        max_partial_kernel<<<nb, kThreads, 0, c.stream>>>(a->x, a->dtype, n, part);
        max_finish_kernel<<<1, kThreads, 0, c.stream>>>(part, nb, a->result);
        nb__cuda_kfree(part);
    } else {
        int64_t nch = (n + nbo::kChunk - 1) / nbo::kChunk, nlanes = nch * nbo::kLanes;
        double *lanes = (double *)nb__cuda_kscratch(&c, sizeof(double) * (size_t)nlanes);
        if (!lanes) return scratch_failed(&c);
        pow_lanes_kernel<<<nb_blocks(nlanes), kThreads, 0, c.stream>>>(a->x, a->dtype, n, a->p,
                                                                        lanes, nlanes);
        pow_finish_kernel<<<1, kThreads, 0, c.stream>>>(lanes, nch, a->result);
        nb__cuda_kfree(lanes);
    }
    return nb__cuda_kend(&c, cudaGetLastError());
}
nb_status cuda_clip_abs_pow_sum(const nb__clip_reduce_args *a) {
    return cuda_clip_reduce(a, false);
}
nb_status cuda_clip_abs_max(const nb__clip_reduce_args *a) { return cuda_clip_reduce(a, true); }

// ---- amp_unscale --------------------------------------------------------------------------
// *found_inf = 1 when some element is inf or NaN, else untouched (the protocol: one flag
// collects the calls of one unscale): every writer stores the same value, so the result
// does not depend on which thread writes (no float atomics, no read-modify-write). The
// flag is the caller's double in device memory.
__global__ void unscale_kernel(const void *x, void *out, nb_dtype dt, nb_dtype ot, int64_t n,
                               float inv, double *found_inf) {
    bool bad = false;
    NBO_GRID_LOOP(i, n) bad |= nbo::unscale_elem(x, out, dt, ot, i, inv);
    if (bad) *found_inf = 1.0;
}

nb_status cuda_amp_unscale(const nb__amp_unscale_args *a) {
    if (!is_float(a->dtype) || (a->out_dtype != a->dtype && a->out_dtype != NB_F32))
        return nb__error(NB_EUNSUPPORTED, "amp_unscale: the cuda kernel does not handle dtype "
                         "%d into %d", (int)a->dtype, (int)a->out_dtype);
    if (a->n <= 0) return NB_OK;
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, "amp_unscale");
    if (st != NB_OK) return st;
    unscale_kernel<<<nb_blocks(a->n), kThreads, 0, c.stream>>>(
        a->x, a->out, a->dtype, a->out_dtype, a->n, (float)a->inv_scale, a->found_inf);
    return nb__cuda_kend(&c, cudaGetLastError());
}

}  // namespace

extern "C" void nb__cuda_reg_optim(nb__backend *be) {
    be->k.sgd_step = cuda_sgd_step;
    be->k.adam_step = cuda_adam_step;
    be->k.rmsprop_step = cuda_rmsprop_step;
    be->k.adagrad_step = cuda_adagrad_step;
    be->k.clip_abs_pow_sum = cuda_clip_abs_pow_sum;
    be->k.clip_abs_max = cuda_clip_abs_max;
    be->k.clip_scale = cuda_clip_scale;
    be->k.clip_clamp = cuda_clip_clamp;
    be->k.amp_unscale = cuda_amp_unscale;
}
