// cuda/k_core.cu - CUDA kernels of the core family (tensor/kernels/core.h): copy, fill, ew,
// ew_backward. Registered in the backend's table by nb__cuda_reg_core (cuda/kernels.h).
// UNVERIFIED ON A GPU: compiled (nvcc -Werror, no spills) and its per-element math checked on
// the host against the CPU backend (tests/cuda_host/core.cu); never run on a device.
//
// Every kernel is one call of a __host__ __device__ thread body of cuda/k_core_math.cuh (a
// grid-stride loop over 64-bit element indices calling the per-element function), and every
// launcher picks its path with an nbc_*_path function from there: tests/cuda_host/core.cu
// runs the same bodies over all threads of a small grid on the path the launcher would take.
// The paths:
//   nd    any iterator: one index decode (nbc_offsets4, 32-bit below 2^31 elements) gives
//         every operand's byte offset;
//   1d    ndim == 1 (contiguous operands, or a broadcast scalar at stride 0): offset i * stride;
//   vec   ew/ew_backward in f32 or bf16 with every operand contiguous and 16-byte aligned:
//         16-byte loads and stores, 4 (f32) or 8 (bf16) elements per thread and step; copy
//         between f32 and bf16/f16 likewise, 8 elements per thread and step.
// ew and ew_backward are templated over the storage type of the compute dtype; the op is a
// run-time switch (uniform across the grid). copy of one dtype between flat operands is a
// cudaMemcpyAsync, fill of zero over a flat operand a cudaMemsetAsync.
// Deterministic: every output element is written by one thread from its inputs only.
#include "cuda/cuda_impl.h"
#include "cuda/k_core_math.cuh"
#include "cuda/kcommon.cuh"

#include <stddef.h>

static_assert(sizeof(nb__ew_ctx) == 40, "nb__ew_ctx layout");
static_assert(offsetof(nb__ew_args, it) == 56, "nb__ew_args layout");
static_assert(offsetof(nb__fill_args, value) == sizeof(nb__iter), "nb__fill_args layout");

namespace {

using nbk::kThreads;
using nbk::nb_blocks;

__device__ __forceinline__ int64_t tid0() { return (int64_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t tstep() { return (int64_t)gridDim.x * blockDim.x; }

// ---- ew / ew_backward -------------------------------------------------------------------------
template <typename S, bool BW, typename I>
__global__ void ew_nd(const __grid_constant__ nb__ew_args a) {
    nbc_ew_nd_thread<S, BW, I>(&a, tid0(), tstep());
}
template <typename S, bool BW> __global__ void ew_1d(const __grid_constant__ nb__ew_args a) {
    nbc_ew_1d_thread<S, BW>(&a, tid0(), tstep());
}
template <typename S, int NIN, bool BW> __global__ void ew_vec(const __grid_constant__ nb__ew_args a) {
    nbc_ew_vec_thread<S, NIN, BW>(&a, tid0(), tstep());
}

template <typename S, bool BW> void launch_ew(const nb__ew_args *a, cudaStream_t st) {
    const int64_t n = a->it.numel;
    switch (nbc_ew_path<S, BW>(a)) {
    case NBC_PATH_VEC1: case NBC_PATH_VEC2: case NBC_PATH_VEC3:
        if constexpr (nbc_has_vec<S>) {
            unsigned g = nb_blocks(n / nbc_vec<S>::V);
            nbc_path p = nbc_ew_path<S, BW>(a);
            if constexpr (BW) { // (g, x) or (g, a, b)
                if (p == NBC_PATH_VEC2) ew_vec<S, 2, true><<<g, kThreads, 0, st>>>(*a);
                else ew_vec<S, 3, true><<<g, kThreads, 0, st>>>(*a);
            } else { // (x) or (a, b)
                if (p == NBC_PATH_VEC1) ew_vec<S, 1, false><<<g, kThreads, 0, st>>>(*a);
                else ew_vec<S, 2, false><<<g, kThreads, 0, st>>>(*a);
            }
        }
        break;
    case NBC_PATH_1D: ew_1d<S, BW><<<nb_blocks(n), kThreads, 0, st>>>(*a); break;
    case NBC_PATH_ND32: ew_nd<S, BW, uint32_t><<<nb_blocks(n), kThreads, 0, st>>>(*a); break;
    default: ew_nd<S, BW, int64_t><<<nb_blocks(n), kThreads, 0, st>>>(*a); break;
    }
}

template <bool BW> nb_status run_ew(const nb__ew_args *a, const char *what) {
    bool ok = BW ? nbc_bw_supported(a->op, a->input, a->dtype) : nbc_ew_supported(a->op, a->dtype);
    if (!ok)
        return nb__error(NB_EUNSUPPORTED,
                         "%s: the cuda kernel does not handle op %d (input %d) in dtype %d",
                         what, (int)a->op, a->input, (int)a->dtype);
    if (a->it.numel <= 0) return NB_OK;
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, what);
    if (st != NB_OK) return st;
    switch (a->dtype) {
    case NB_F32: launch_ew<float, BW>(a, c.stream); break;
    case NB_F64: launch_ew<double, BW>(a, c.stream); break;
    case NB_F16: launch_ew<nbc_f16, BW>(a, c.stream); break;
    case NB_BF16: launch_ew<nbc_bf16, BW>(a, c.stream); break;
    default:
        if constexpr (!BW) {
            switch (a->dtype) {
            case NB_I32: launch_ew<int32_t, false>(a, c.stream); break;
            case NB_I64: launch_ew<int64_t, false>(a, c.stream); break;
            case NB_U8: launch_ew<uint8_t, false>(a, c.stream); break;
            default: launch_ew<nbc_bool, false>(a, c.stream); break;
            }
        }
        break;
    }
    return nb__cuda_kend(&c, cudaGetLastError());
}

nb_status cuda_ew(const nb__ew_args *a) { return run_ew<false>(a, "ew"); }
nb_status cuda_ew_backward(const nb__ew_args *a) { return run_ew<true>(a, "ew_backward"); }

// ---- copy -------------------------------------------------------------------------------------
template <typename I> __global__ void copy_nd(const __grid_constant__ nb__copy_args a) {
    nbc_copy_nd_thread<I>(&a.it, tid0(), tstep());
}
__global__ void copy_1d(const __grid_constant__ nb__copy_args a) {
    nbc_copy_1d_thread(&a.it, tid0(), tstep());
}
template <int ESI, int ESO> __global__ void copy_vec(const __grid_constant__ nb__copy_args a) {
    nbc_copy_vec_thread<ESI, ESO>(&a.it, tid0(), tstep());
}

nb_status cuda_copy(const nb__copy_args *a) {
    const nb__iter *it = &a->it;
    const int64_t n = it->numel;
    if (n <= 0) return NB_OK;
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, "copy");
    if (st != NB_OK) return st;
    cudaError_t e = cudaSuccess;
    switch (nbc_copy_path(it)) {
    case NBC_PATH_MEMCPY:
        e = cudaMemcpyAsync(it->data[0], it->data[1], (size_t)(n * nb__kh_dtype_size(it->dtype[0])),
                            cudaMemcpyDeviceToDevice, c.stream);
        break;
    case NBC_PATH_VEC1: copy_vec<4, 2><<<nb_blocks(n / 8), kThreads, 0, c.stream>>>(*a); break;
    case NBC_PATH_VEC2: copy_vec<2, 4><<<nb_blocks(n / 8), kThreads, 0, c.stream>>>(*a); break;
    case NBC_PATH_1D: copy_1d<<<nb_blocks(n), kThreads, 0, c.stream>>>(*a); break;
    case NBC_PATH_ND32: copy_nd<uint32_t><<<nb_blocks(n), kThreads, 0, c.stream>>>(*a); break;
    default: copy_nd<int64_t><<<nb_blocks(n), kThreads, 0, c.stream>>>(*a); break;
    }
    return nb__cuda_kend(&c, e != cudaSuccess ? e : cudaGetLastError());
}

// ---- fill -------------------------------------------------------------------------------------
template <typename W, typename I> __global__ void fill_nd(const __grid_constant__ nb__iter it, W v) {
    nbc_fill_nd_thread<W, I>(&it, v, tid0(), tstep());
}
template <typename W> __global__ void fill_1d(const __grid_constant__ nb__iter it, W v) {
    nbc_fill_1d_thread<W>(&it, v, tid0(), tstep());
}

template <typename W> void launch_fill(const nb__iter *it, nbc_path p, uint64_t bits, cudaStream_t st) {
    W v = (W)bits;
    unsigned g = nb_blocks(it->numel);
    if (p == NBC_PATH_1D) fill_1d<W><<<g, kThreads, 0, st>>>(*it, v);
    else if (p == NBC_PATH_ND32) fill_nd<W, uint32_t><<<g, kThreads, 0, st>>>(*it, v);
    else fill_nd<W, int64_t><<<g, kThreads, 0, st>>>(*it, v);
}

nb_status cuda_fill(const nb__fill_args *a) {
    const nb__iter *it = &a->it;
    if (it->numel <= 0) return NB_OK;
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, "fill");
    if (st != NB_OK) return st;
    uint64_t bits;
    nbc_fill_bytes(it->dtype[0], a->value, &bits);
    int es = nb__kh_dtype_size(it->dtype[0]);
    nbc_path p = nbc_fill_path(it, bits);
    if (p == NBC_PATH_MEMSET) // every dtype: zero is all bits 0 (-0.0 is not)
        return nb__cuda_kend(&c, cudaMemsetAsync(it->data[0], 0, (size_t)(it->numel * es), c.stream));
    switch (es) {
    case 1: launch_fill<uint8_t>(it, p, bits, c.stream); break;
    case 2: launch_fill<uint16_t>(it, p, bits, c.stream); break;
    case 4: launch_fill<uint32_t>(it, p, bits, c.stream); break;
    default: launch_fill<uint64_t>(it, p, bits, c.stream); break;
    }
    return nb__cuda_kend(&c, cudaGetLastError());
}

}  // namespace

extern "C" void nb__cuda_reg_core(nb__backend *be) {
    be->k.copy = cuda_copy;
    be->k.fill = cuda_fill;
    be->k.ew = cuda_ew;
    be->k.ew_backward = cuda_ew_backward;
}
