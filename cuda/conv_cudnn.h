/* cuda/conv_cudnn.h - private to the CUDA plugin: the cuDNN convolutions the conv kernels
 * (cuda/k_conv.cu) try first, on the C/C++ boundary (C17 and nvcc, extern "C").
 * Implemented by cuda/cudnn.c when the plugin is built with cuDNN (meson feature `cudnn`),
 * by cuda/cudnn_none.c otherwise (every call answers NB_EUNSUPPORTED without setting an
 * error, and the caller runs its im2col + GEMM fallback). Unverified on a GPU.
 *
 * Operands are contiguous device arrays (f32, or bf16 where said) laid out as
 * tensor/kernels/conv.h says; the calls enqueue on c->stream (a kernel context from
 * nb__cuda_kbegin) and take their workspace from nb__cuda_kscratch. Math: f32 in plain FP32
 * (CUDNN_FMA_MATH, no TF32), like cuda/blas.c; bf16 on tensor cores with f32 sums. The
 * backward calls use deterministic algorithms only; the forward ones are
 * deterministic too. NB_EUNSUPPORTED (no error set) when cuDNN offers no algorithm that
 * qualifies for the shape; another status (with the error set) when cuDNN fails.
 *
 * The descriptor part needs neither a GPU nor a cuDNN handle (cuda/cudnn_desc.c, also
 * linked into tests/cuda_host to check the output size against the CPU's rule). */
#ifndef NABLA_CUDA_CONV_CUDNN_H
#define NABLA_CUDA_CONV_CUDNN_H

#include <stdint.h>

#include "cuda/kernels.h"
#include "tensor/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = conv(x, w) (no bias). dt: NB_F32 (x, w, y f32) or NB_BF16 (x, w, y bf16, f32 sums,
 * y rounded once). */
nb_status nb__cudnn_conv2d_fwd(nb__cuda_kctx *c, const nb__conv2d_geom *g, nb_dtype dt,
                               const void *x, const void *w, void *y);
/* gx = the input gradient from w and gy; dt as for the forward. */
nb_status nb__cudnn_conv2d_bwd_data(nb__cuda_kctx *c, const nb__conv2d_geom *g, nb_dtype dt,
                                    const void *w, const void *gy, void *gx);
/* gw = the weight gradient from x and gy (overwritten); dt NB_F32 only (the f32 weight
 * gradient of bf16 operands is computed from widened copies). */
nb_status nb__cudnn_conv2d_bwd_filter(nb__cuda_kctx *c, const nb__conv2d_geom *g, nb_dtype dt,
                                      const void *x, const void *gy, void *gw);

#ifdef __cplusplus
}
#endif
#endif
