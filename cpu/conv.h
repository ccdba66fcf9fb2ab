/* cpu/conv.h - private to cpu/ (and the conv tests): the CPU kernels of 2-D convolution
 * (cpu/conv.c), registered as conv2d / conv2d_backward (tensor/kernels/conv.h), and the
 * process-wide choice of their f32 implementation.
 *
 * Forward and backward run as im2col + GEMM (cpu/gemm.h) in f32 and f64, and, for f32 where
 * oneDNN is built in, oneDNN's convolution primitives for the forward and the input
 * gradient (see nb__conv_impl below). bf16 (bf16 x, w, gy; f32 sums) runs oneDNN's bf16
 * primitives for the forward and the input gradient and im2col + the bf16 GEMM for the
 * weight gradient where nb_conv_bf16_native() (nabla/runtime.h), else widens to f32 (the
 * "bf16" section of conv.c). A kernel plans its work (threads, weight-gradient
 * chunks) and takes ONE scratch block for it from the caching host allocator, which it
 * splits into per-thread column buffers (and, in the backward, partial weight and bias
 * gradients), so a training step does no system allocation once the cache is warm. The
 * oneDNN path takes its reordered operands and scratchpad from the same allocator.
 *
 * The column matrix of one image: (C*KH*KW) x (OH*OW), rows in (c, ki, kj) order, so group
 * g's rows are one contiguous block and w's group g is a (O/groups) x (C/groups*KH*KW)
 * matrix.
 *
 * Determinism: images are split into work units whose number does not depend on the thread
 * count; each unit's GEMMs run on one thread, and the weight gradient is summed over units
 * in a fixed order. So results are bit-identical for any thread count (as long as the GEMM
 * provider is deterministic for a given shape on one thread, which both are). oneDNN's
 * forward and input-gradient kernels compute each output on one thread (checked by the
 * tests); its weight gradient is not used because it splits sums over threads. */
#ifndef NABLA_CPU_CONV_H
#define NABLA_CPU_CONV_H

#include "tensor/kernels.h"

/* Which implementation runs f32 convolutions. NB__CONV_DNNL: oneDNN's primitives for the
 * forward and the input gradient wherever oneDNN has a kernel; NB__CONV_IM2COL: im2col +
 * GEMM for everything; NB__CONV_AUTO (the default): oneDNN where it measured faster (see
 * nb__conv_dnnl_wanted in conv_dnnl.c), when it was built in. The weight and bias gradients,
 * and all of f64, always use im2col + GEMM. The environment variable NB_CONV (= im2col |
 * dnnl) sets the initial choice. Process wide; for tests and benchmarks (both in
 * cpu/conv_dnnl.c). */
typedef enum nb__conv_impl { NB__CONV_AUTO = 0, NB__CONV_IM2COL, NB__CONV_DNNL } nb__conv_impl;
void nb__conv2d_set_impl(nb__conv_impl impl);
nb__conv_impl nb__conv2d_impl(void);

/* The direct f32 kernels (cpu/conv_direct.c) for convolutions with at most
 * NB__CONV_DIRECT_TAPS taps per output (C * KH * KW), stride 1, dilation 1 and one group
 * (nb__conv_direct_ok), where im2col's GEMMs would have a tiny inner dimension: the forward
 * and the weight gradient of one image, after copying it into xp, a buffer of
 * nb__conv_direct_scratch(g) bytes. cpu/conv.c runs them in place of im2col + GEMM for
 * those two (not the input gradient), whichever f32 implementation is chosen. */
#define NB__CONV_DIRECT_TAPS 16
bool nb__conv_direct_ok(const nb__conv2d_geom *g);
size_t nb__conv_direct_scratch(const nb__conv2d_geom *g);
/* y (O, OH, OW) = conv(x (C, H, W), w) + b (b may be NULL). */
void nb__conv_direct_forward(const nb__conv2d_geom *g, const float *x, const float *w,
                             const float *b, float *y, float *xp);
/* gw (O, C*KH*KW) = (acc: gw +) the weight gradient of one image from gy (O, OH, OW). */
void nb__conv_direct_wgrad(const nb__conv2d_geom *g, const float *x, const float *gy,
                           float *gw, bool acc, float *xp);

#endif
