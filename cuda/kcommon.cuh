// cuda/kcommon.cuh - private: device-side building blocks shared by the kernel files of
// cuda/ (nvcc only; the index and rounding math both sides need is in cuda/khelp.h).
//
//   nb_ld<T>(p) / nb_st<T>(p, v)   load and store an element of storage type T as float or
//                                  double (T = float, double, nb_bf16_t, nb_f16_t), with the
//                                  CPU's rounding for the half types
//                                  (with the dtype known only at run time:
//                                  nbc_load_f64 / nbc_store_f64 in cuda/k_core_math.cuh)
//   NB_DISPATCH_FLOAT(dt, T, ...)  run the statement with T bound to the storage type of
//                                  a float dtype (f32, f64, f16, bf16)
//   nb_block_sum(v, scratch)       sum over a block in a fixed tree order (the same bits
//                                  on every run for the same block size)
//   kThreads, kMaxBlocks, nb_blocks(n)
//                                  the default launch geometry: grid-stride loops over
//                                  64-bit indices
#ifndef NABLA_CUDA_KCOMMON_CUH
#define NABLA_CUDA_KCOMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/kernels.h"
#include "cuda/khelp.h"
#include "tensor/kernels.h"

namespace nbk {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535 * 8;

inline unsigned nb_blocks(int64_t n, int threads = kThreads) {
    return nb__kh_blocks(n, threads, kMaxBlocks);
}

// Storage types of the half dtypes: distinct types, so templates tell them apart.
struct nb_bf16_t { uint16_t bits; };
struct nb_f16_t { uint16_t bits; };

template <typename T> struct nb_acc { using type = float; };  // math type of a storage type
template <> struct nb_acc<double> { using type = double; };

template <typename T> __device__ __forceinline__ typename nb_acc<T>::type nb_ld(const T *p);
template <> __device__ __forceinline__ float nb_ld<float>(const float *p) { return *p; }
template <> __device__ __forceinline__ double nb_ld<double>(const double *p) { return *p; }
template <> __device__ __forceinline__ float nb_ld<nb_bf16_t>(const nb_bf16_t *p) {
    return __uint_as_float((uint32_t)p->bits << 16);
}
template <> __device__ __forceinline__ float nb_ld<nb_f16_t>(const nb_f16_t *p) {
    return nb__kh_f32_from_f16(p->bits);
}

template <typename T> __device__ __forceinline__ void nb_st(T *p, typename nb_acc<T>::type v);
template <> __device__ __forceinline__ void nb_st<float>(float *p, float v) { *p = v; }
template <> __device__ __forceinline__ void nb_st<double>(double *p, double v) { *p = v; }
template <> __device__ __forceinline__ void nb_st<nb_bf16_t>(nb_bf16_t *p, float v) {
    p->bits = nb__kh_bf16_from_f32(v);
}
template <> __device__ __forceinline__ void nb_st<nb_f16_t>(nb_f16_t *p, float v) {
    p->bits = nb__kh_f16_from_f32(v);
}

#define NB_DISPATCH_FLOAT(dt, T, ...)                                                      \
    switch (dt) {                                                                          \
    case NB_F32: { using T = float; __VA_ARGS__; } break;                                  \
    case NB_F64: { using T = double; __VA_ARGS__; } break;                                 \
    case NB_F16: { using T = ::nbk::nb_f16_t; __VA_ARGS__; } break;                        \
    case NB_BF16: { using T = ::nbk::nb_bf16_t; __VA_ARGS__; } break;                      \
    default: break;                                                                        \
    }

// Sum of v over the block, returned to every thread. scratch: 32 elements of shared
// memory. The order is fixed (butterfly within each warp, then warp 0 over the warp sums),
// so the result depends on the block size only, never on timing.
template <typename A> __device__ __forceinline__ A nb_warp_sum(A v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <typename A> __device__ __forceinline__ A nb_block_sum(A v, A *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    v = nb_warp_sum(v);
    __syncthreads(); // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : A(0);
    if (warp == 0) v = nb_warp_sum(v);
    if (threadIdx.x == 0) scratch[0] = v;
    __syncthreads();
    return scratch[0];
}
template <typename A> __device__ __forceinline__ A nb_warp_max(A v) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
template <typename A> __device__ __forceinline__ A nb_block_max(A v, A *scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    v = nb_warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : scratch[0];
    if (warp == 0) v = nb_warp_max(v);
    if (threadIdx.x == 0) scratch[0] = v;
    __syncthreads();
    return scratch[0];
}

// A bad index found by a kernel (cuda/kerr.c): the first report per device wins; the
// kernel then skips the element. e from nb__cuda_kerr_of(c.device), passed as an argument.
__device__ __forceinline__ void nb_kerr_report(nb__cuda_kerr *e, int kernel, int dim,
                                               long long value, long long bound) {
    if (!e || atomicCAS(&e->set, 0u, 2u) != 0u) return;
    e->kernel = kernel;
    e->dim = dim;
    e->value = value;
    e->bound = bound;
    __threadfence_system();
    atomicExch(&e->set, 1u);
}

}  // namespace nbk

#endif
