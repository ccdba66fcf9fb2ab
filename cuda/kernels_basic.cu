// kernels_basic.cu - the first CUDA kernels (fill and add over f32), so that nvcc, the
// device link and the C/C++ boundary are exercised by every CUDA build, and the f32 -> bf16
// rounding of a GEMM's bias (cuda/k_matmul.c). Kernels do arithmetic only
// (docs/architecture.md rule 1); launch.c checks arguments and picks the stream.
//
// Compiled as C++ by nvcc: it includes cuda_impl.h and the kernel interface
// (tensor/kernels.h: the argument structs every backend receives, C17 and C++ alike), never
// the C17 headers of the core. The launchers are extern "C" (declared in cuda_impl.h).
#include <cuda_runtime.h>

#include "cuda/cuda_impl.h"
#include "cuda/khelp.h"
#include "tensor/kernels.h"

// The argument structs have the same layout here as in the C17 translation units.
static_assert(sizeof(nb__iter) == 4 * 2 + 8 + 8 * NB_MAX_DIMS + 8 * NB__ITER_MAX_ARGS * NB_MAX_DIMS +
                                      8 * NB__ITER_MAX_ARGS + 4 * NB__ITER_MAX_ARGS,
              "nb__iter layout");

namespace {

constexpr int kThreads = 256;
// Grid-stride loops: a bounded grid covers any n, and indices are 64-bit so tensors past
// 2^31 elements work.
constexpr int64_t kMaxBlocks = 65535;

unsigned blocks_for(int64_t n) {
    int64_t b = (n + kThreads - 1) / kThreads;
    return (unsigned)(b < kMaxBlocks ? b : kMaxBlocks);
}

__global__ void fill_f32(float *__restrict__ dst, float value, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = value;
}

// No __restrict__: out may alias a or b (in-place add).
__global__ void add_f32(float *out, const float *a, const float *b, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = a[i] + b[i];
}

// The CPU's rounding (cuda/khelp.h), so a bias that holds bf16 values stays exact.
__global__ void bf16_from_f32(uint16_t *__restrict__ dst, const float *__restrict__ src,
                              int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = nb__kh_bf16_from_f32(src[i]);
}

}  // namespace

extern "C" cudaError_t nb__cuda_launch_fill_f32(float *dst, float value, int64_t n,
                                                cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    fill_f32<<<blocks_for(n), kThreads, 0, stream>>>(dst, value, n);
    return cudaGetLastError();
}

extern "C" cudaError_t nb__cuda_launch_add_f32(float *out, const float *a, const float *b,
                                               int64_t n, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    add_f32<<<blocks_for(n), kThreads, 0, stream>>>(out, a, b, n);
    return cudaGetLastError();
}

extern "C" cudaError_t nb__cuda_launch_bf16_from_f32(uint16_t *dst, const float *src, int64_t n,
                                                     cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    bf16_from_f32<<<blocks_for(n), kThreads, 0, stream>>>(dst, src, n);
    return cudaGetLastError();
}
