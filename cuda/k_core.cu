// cuda/k_core.cu - CUDA kernels of the core family (tensor/kernels/core.h): copy, fill, ew,
// ew_backward. Registered in the backend's table by nb__cuda_reg_core (cuda/kernels.h).
// UNVERIFIED ON A GPU: compiled (nvcc -Werror, no spills) and its per-element math checked on
// the host against the CPU backend (tests/cuda_host/core.cu); never run on a device.
//
// Every kernel is a grid-stride loop over 64-bit element indices calling one __host__
// __device__ function of cuda/k_core_math.cuh per element (the same function the host check
// runs), in three geometries:
//   nd    any iterator: one index decode (nbc_offsets4) gives every operand's byte offset;
//   1d    ndim == 1 (contiguous operands, or a broadcast scalar at stride 0): offset i * stride;
//   vec   ew/ew_backward in f32 or bf16 with every operand contiguous and 16-byte aligned:
//         16-byte loads and stores, 4 (f32) or 8 (bf16) elements per thread and step.
// ew and ew_backward are templated over the storage type of the compute dtype; the op is a
// run-time switch (uniform across the grid). copy of one dtype between flat operands is a
// cudaMemcpyAsync, fill of zero over a flat operand a cudaMemsetAsync.
// Deterministic: every output element is written by one thread from its inputs only.
#include "cuda/cuda_impl.h"
#include "cuda/k_core_math.cuh"
#include "cuda/kcommon.cuh"

#include <stddef.h>
#include <type_traits>

static_assert(sizeof(nb__ew_ctx) == 40, "nb__ew_ctx layout");
static_assert(offsetof(nb__ew_args, it) == 56, "nb__ew_args layout");
static_assert(offsetof(nb__fill_args, value) == sizeof(nb__iter), "nb__fill_args layout");

namespace {

using nbk::kThreads;
using nbk::nb_blocks;

__device__ __forceinline__ int64_t tid0() { return (int64_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t tstep() { return (int64_t)gridDim.x * blockDim.x; }

// ---- ew / ew_backward -------------------------------------------------------------------------
template <typename S, bool BW>
__device__ __forceinline__ void ew_elem(const nb__ew_args *a, int64_t o0, int64_t o1, int64_t o2,
                                        int64_t o3) {
    if constexpr (BW) nbc_bw_at<S>(a, o0, o1, o2, o3);
    else nbc_ew_at<S>(a, o0, o1, o2, o3);
}

template <typename S, bool BW, typename I>
__global__ void ew_nd(const __grid_constant__ nb__ew_args a) {
    for (int64_t i = tid0(); i < a.it.numel; i += tstep()) {
        int64_t o0, o1, o2, o3;
        nbc_offsets4<I>(&a.it, (I)i, &o0, &o1, &o2, &o3);
        ew_elem<S, BW>(&a, o0, o1, o2, o3);
    }
}

template <typename S, bool BW> __global__ void ew_1d(const __grid_constant__ nb__ew_args a) {
    const int64_t s0 = a.it.strides[0][0], s1 = a.it.strides[1][0];
    const int64_t s2 = a.it.nargs > 2 ? a.it.strides[2][0] : 0;
    const int64_t s3 = a.it.nargs > 3 ? a.it.strides[3][0] : 0;
    for (int64_t i = tid0(); i < a.it.numel; i += tstep())
        ew_elem<S, BW>(&a, i * s0, i * s1, i * s2, i * s3);
}

// NIN inputs, all contiguous S, 16-byte aligned; the last numel % V elements one by one.
template <typename S, int NIN, bool BW> __global__ void ew_vec(const __grid_constant__ nb__ew_args a) {
    constexpr int V = nbc_vec<S>::V;
    const int64_t nch = a.it.numel / V;
    for (int64_t j = tid0(); j < nch; j += tstep()) nbc_vec_chunk<S, NIN, BW>(&a, j);
    const int64_t i = nch * V + tid0();
    if (i < a.it.numel) {
        const int64_t o = i * (int64_t)sizeof(S);
        ew_elem<S, BW>(&a, o, o, o, o);
    }
}

bool aligned16(const nb__iter *it) {
    for (int k = 0; k < it->nargs; k++)
        if ((uintptr_t)it->data[k] % 16 != 0) return false;
    return true;
}

// The nd kernels decode indices in 32 bits below 2^31 elements.
bool small(const nb__iter *it) { return it->numel < ((int64_t)1 << 31); }

bool contiguous_all(const nb__iter *it, int64_t es) {
    if (it->ndim != 1) return false;
    for (int k = 0; k < it->nargs; k++)
        if (it->strides[k][0] != es) return false;
    return true;
}

template <typename S, bool BW> void launch_ew(const nb__ew_args *a, cudaStream_t st) {
    const nb__iter *it = &a->it;
    if constexpr (std::is_same<S, float>::value || std::is_same<S, nbc_bf16>::value) {
        nbc_kind kind = nbc_op_kind(a->op);
        bool scalar_b = nbc_is_half<S> && a->ctx.b_scalar; // b is not in memory
        if (!scalar_b && (BW || kind == NBC_UNARY || kind == NBC_BINARY) &&
            contiguous_all(it, (int64_t)sizeof(S)) && aligned16(it)) {
            unsigned g = nb_blocks(it->numel / nbc_vec<S>::V);
            int nin = it->nargs - 1; // forward: 1 or 2 inputs; backward: 2 or 3
            if constexpr (BW) {
                if (nin == 2) ew_vec<S, 2, true><<<g, kThreads, 0, st>>>(*a);
                else ew_vec<S, 3, true><<<g, kThreads, 0, st>>>(*a);
            } else {
                if (nin == 1) ew_vec<S, 1, false><<<g, kThreads, 0, st>>>(*a);
                else ew_vec<S, 2, false><<<g, kThreads, 0, st>>>(*a);
            }
            return;
        }
    }
    unsigned g = nb_blocks(it->numel);
    if (it->ndim == 1) ew_1d<S, BW><<<g, kThreads, 0, st>>>(*a);
    else if (small(it)) ew_nd<S, BW, uint32_t><<<g, kThreads, 0, st>>>(*a);
    else ew_nd<S, BW, int64_t><<<g, kThreads, 0, st>>>(*a);
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
    for (int64_t i = tid0(); i < a.it.numel; i += tstep()) {
        int64_t o0, o1, o2, o3;
        nbc_offsets4<I>(&a.it, (I)i, &o0, &o1, &o2, &o3);
        nbc_copy_at(&a.it, o0, o1);
    }
}

__global__ void copy_1d(const __grid_constant__ nb__copy_args a) {
    const int64_t s0 = a.it.strides[0][0], s1 = a.it.strides[1][0];
    for (int64_t i = tid0(); i < a.it.numel; i += tstep()) nbc_copy_at(&a.it, i * s0, i * s1);
}

// Contiguous, aligned conversions between f32, bf16 and f16: 8 elements a thread and step.
template <int ESI, int ESO> __global__ void copy_vec(const __grid_constant__ nb__copy_args a) {
    const int64_t nch = a.it.numel / 8;
    for (int64_t j = tid0(); j < nch; j += tstep()) nbc_copy_chunk8<ESI, ESO>(&a.it, j);
    const int64_t i = nch * 8 + tid0();
    if (i < a.it.numel) nbc_copy_at(&a.it, i * ESO, i * ESI);
}

bool is_halfish(nb_dtype dt) { return dt == NB_F32 || dt == NB_BF16 || dt == NB_F16; }

nb_status cuda_copy(const nb__copy_args *a) {
    const nb__iter *it = &a->it;
    if (it->numel <= 0) return NB_OK;
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, "copy");
    if (st != NB_OK) return st;
    cudaError_t e;
    int64_t es = nbc_dtype_size(it->dtype[0]);
    if (it->dtype[0] == it->dtype[1] && contiguous_all(it, es)) {
        e = cudaMemcpyAsync(it->data[0], it->data[1], (size_t)(it->numel * es),
                            cudaMemcpyDeviceToDevice, c.stream);
        return nb__cuda_kend(&c, e != cudaSuccess ? e : cudaGetLastError());
    }
    nb_dtype od = it->dtype[0], id = it->dtype[1];
    if (od != id && is_halfish(od) && is_halfish(id) && (od == NB_F32 || id == NB_F32) &&
        it->ndim == 1 && it->strides[0][0] == nbc_dtype_size(od) &&
        it->strides[1][0] == nbc_dtype_size(id) && aligned16(it)) {
        unsigned g = nb_blocks(it->numel / 8);
        if (id == NB_F32) copy_vec<4, 2><<<g, kThreads, 0, c.stream>>>(*a);
        else copy_vec<2, 4><<<g, kThreads, 0, c.stream>>>(*a);
        return nb__cuda_kend(&c, cudaGetLastError());
    }
    unsigned g = nb_blocks(it->numel);
    if (it->ndim == 1) copy_1d<<<g, kThreads, 0, c.stream>>>(*a);
    else if (small(it)) copy_nd<uint32_t><<<g, kThreads, 0, c.stream>>>(*a);
    else copy_nd<int64_t><<<g, kThreads, 0, c.stream>>>(*a);
    return nb__cuda_kend(&c, cudaGetLastError());
}

// ---- fill -------------------------------------------------------------------------------------
template <typename W, typename I> __global__ void fill_nd(const __grid_constant__ nb__iter it, W v) {
    for (int64_t i = tid0(); i < it.numel; i += tstep()) {
        int64_t o0, o1, o2, o3;
        nbc_offsets4<I>(&it, (I)i, &o0, &o1, &o2, &o3);
        *(W *)(it.data[0] + o0) = v;
    }
}

template <typename W> __global__ void fill_1d(char *p, int64_t stride, int64_t n, W v) {
    for (int64_t i = tid0(); i < n; i += tstep()) *(W *)(p + i * stride) = v;
}

template <typename W> void launch_fill(const nb__iter *it, uint64_t bits, cudaStream_t st) {
    W v = (W)bits;
    unsigned g = nb_blocks(it->numel);
    if (it->ndim == 1) fill_1d<W><<<g, kThreads, 0, st>>>(it->data[0], it->strides[0][0], it->numel, v);
    else if (small(it)) fill_nd<W, uint32_t><<<g, kThreads, 0, st>>>(*it, v);
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
    int es = nbc_dtype_size(it->dtype[0]);
    if (bits == 0 && contiguous_all(it, es)) // every dtype: zero is all bits 0 (not -0.0)
        return nb__cuda_kend(&c, cudaMemsetAsync(it->data[0], 0, (size_t)(it->numel * es), c.stream));
    switch (es) {
    case 1: launch_fill<uint8_t>(it, bits, c.stream); break;
    case 2: launch_fill<uint16_t>(it, bits, c.stream); break;
    case 4: launch_fill<uint32_t>(it, bits, c.stream); break;
    default: launch_fill<uint64_t>(it, bits, c.stream); break;
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
