/* nabla/runtime.h - threads, the CPU GEMM provider, and library version.
 *
 * Usage:
 *     nb_set_num_threads(2);                       // our kernels, oneDNN and OpenBLAS alike
 *     nb_set_gemm_provider(NB_GEMM_OPENBLAS);      // or NB_GEMM_DNNL / NB_GEMM_AUTO
 *     printf("nabla %s, gemm %s\n", nb_version(), nb_gemm_provider_name(nb_gemm_provider_current()));
 *
 * Threads: GEMM tiles and elementwise ops run on nabla's own workers, the other kernels,
 * oneDNN and OpenBLAS on OpenMP's; the two take turns, never run at once, and idle threads
 * of both sleep after a short while (nabla sets OMP_WAIT_POLICY=PASSIVE unless you set it),
 * so another busy process does not make N threads slower than 1. Results are the same, bit
 * for bit, at any thread count (docs/threads.md). nb_set_num_threads(n) sets the thread
 * count (n <= 0: the number of cores). Small tensors stay on one thread (a grain size).
 * Set it once at start-up, not concurrently with running ops.
 *
 * GEMM provider: at build time meson finds oneDNN (feature `dnnl`) and OpenBLAS (required).
 * NB_GEMM_AUTO picks oneDNN when it was built in; the environment variable NB_GEMM
 * (= "dnnl" | "openblas") sets the initial choice. The provider is process wide. libnabla.so
 * opens either library on the first GEMM that runs on it, and f32 products with 2*M*N*K
 * under 2^15 run on nabla's own packed GEMM whatever the provider (docs/embedding.md). */
#ifndef NABLA_RUNTIME_H
#define NABLA_RUNTIME_H

#include <stdbool.h>

#include "nabla/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NB_VERSION_MAJOR 0
#define NB_VERSION_MINOR 1
#define NB_VERSION_PATCH 0

/* "0.1.0"; the version of the library actually linked (headers may differ). */
const char *nb_version(void);
/* NB_VERSION_MAJOR * 10000 + MINOR * 100 + PATCH of the linked library. */
int nb_version_number(void);

void nb_set_num_threads(int n);
int nb_get_num_threads(void);

typedef enum nb_gemm_provider {
    NB_GEMM_AUTO = 0,
    NB_GEMM_OPENBLAS = 1,
    NB_GEMM_DNNL = 2,
} nb_gemm_provider;

/* NB_EUNSUPPORTED if that provider was not built in. */
nb_status nb_set_gemm_provider(nb_gemm_provider p);
/* The provider in use (never NB_GEMM_AUTO). */
nb_gemm_provider nb_gemm_provider_current(void);
const char *nb_gemm_provider_name(nb_gemm_provider p);
bool nb_gemm_provider_available(nb_gemm_provider p);
/* Whether bf16 matmuls run natively: the dnnl provider on a CPU with AVX512-BF16 (oneDNN's
 * bf16 matmul, f32 accumulation). When false (the openblas provider, which has no bf16
 * GEMM, or an older CPU) the products run in f32: nabla's packed sgemm reading the bf16
 * operands (widening them as it packs them) where the f32 path is the packed one, else
 * sgemm of widened copies; the same result either way, at the f32 rate. nb_gemm_bf16_path() says which, in words (static string). */
bool nb_gemm_bf16_native(void);
const char *nb_gemm_bf16_path(void);
/* Whether bf16 convolutions (nb_conv2d, autocast) run natively: oneDNN's bf16 convolution
 * primitives and the bf16 GEMM on a CPU with AVX512-BF16, f32 accumulation. When false (no
 * oneDNN, an older CPU, NB_CONV=im2col) the operands are widened to f32 and the f32 kernels
 * run: the same result, no speed gained. Small convolutions (see docs/mixed-precision.md) are
 * widened either way. nb_conv_bf16_path() says which, in words (static string). */
bool nb_conv_bf16_native(void);
const char *nb_conv_bf16_path(void);

/* Which optional parts were compiled in. nb_has_cuda: this build made the CUDA plugin
 * (libnabla-cuda.so, loaded on first CUDA use); whether it loads here and finds a GPU is
 * nb_cuda_device_count() > 0 (nabla/cuda.h). */
bool nb_has_cuda(void);
bool nb_has_mpi(void);
bool nb_has_nccl(void);

#ifdef __cplusplus
}
#endif
#endif
