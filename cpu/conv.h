/* cpu/conv.h - private: the CPU kernels behind nb_conv2d_fn (nn/conv.c): 2-D convolution
 * forward and backward as im2col + GEMM (cpu/gemm.h) in f32 and f64, and, for f32 where
 * oneDNN is built in, oneDNN's convolution primitives for the forward and the input
 * gradient (see nb__conv_impl below).
 *
 * Kernels do arithmetic only. The op definition checks the arguments, computes the output
 * size, makes every operand contiguous in the compute dtype, and allocates the outputs and
 * ONE scratch block of nb__conv2d_plan(...).scratch_bytes, which the kernels split into
 * per-thread column buffers (and, in the backward, partial weight and bias gradients). The
 * oneDNN path takes its reordered operands and scratchpad from the caching host allocator.
 *
 * Layouts (all contiguous, row-major):
 *     x  (N, C, H, W)        w  (O, C/groups, KH, KW)     b (O)
 *     y  (N, O, OH, OW)      the column matrix of one image: (C*KH*KW) x (OH*OW), rows in
 *                            (c, ki, kj) order, so group g's rows are one contiguous block
 *                            and w's group g is a (O/groups) x (C/groups*KH*KW) matrix.
 *
 * Determinism: images are split into work units whose number does not depend on the thread
 * count; each unit's GEMMs run on one thread, and the weight gradient is summed over units
 * in a fixed order. So results are bit-identical for any thread count (as long as the GEMM
 * provider is deterministic for a given shape on one thread, which both are). oneDNN's
 * forward and input-gradient kernels compute each output on one thread (checked by the
 * tests); its weight gradient is not used because it splits sums over threads. */
#ifndef NABLA_CPU_CONV_H
#define NABLA_CPU_CONV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nabla/status.h"

typedef struct nb__conv2d_geom {
    int64_t N, C, H, W;       /* input */
    int64_t O, KH, KW;        /* weight: O x (C/groups) x KH x KW */
    int64_t OH, OW;           /* output spatial size (>= 1 each) */
    int64_t sh, sw, ph, pw, dh, dw;
    int64_t groups;
} nb__conv2d_geom;

/* How a call will run: threads, work units of the weight gradient, and the layout of the
 * scratch block: nthreads column buffers of col_bytes each, then nparts - 1 partial weight
 * gradients (at parts_offset), then nparts partial bias gradients (at bias_offset, when
 * fused_bias). */
typedef struct nb__conv2d_plan {
    int nthreads;
    int nparts;            /* backward: images are summed into this many partial dW's */
    bool pointwise;        /* 1x1, stride 1, no padding: no column matrix at all */
    bool fused_bias;       /* the bias gradient is summed during the weight gradient's pass */
    size_t col_bytes, parts_offset, bias_offset;
    size_t scratch_bytes;  /* allocate this many bytes (64-byte aligned) and pass them */
} nb__conv2d_plan;

/* Plan the forward (backward false) or backward (need_* say which gradients are wanted)
 * for element size es (4 or 8). */
nb__conv2d_plan nb__conv2d_plan_make(const nb__conv2d_geom *g, size_t es, bool backward,
                                     bool need_gx, bool need_gw, bool need_gb);

/* Which implementation runs f32 convolutions. NB__CONV_DNNL: oneDNN's primitives for the
 * forward and the input gradient wherever oneDNN has a kernel; NB__CONV_IM2COL: im2col +
 * GEMM for everything; NB__CONV_AUTO (the default): oneDNN where it measured faster (see
 * dn_wanted in conv.c), when it was built in. The weight and bias gradients, and all of f64,
 * always use im2col + GEMM. The environment variable NB_CONV (= im2col | dnnl) sets the
 * initial choice. Process wide; for tests and benchmarks. */
typedef enum nb__conv_impl { NB__CONV_AUTO = 0, NB__CONV_IM2COL, NB__CONV_DNNL } nb__conv_impl;
void nb__conv2d_set_impl(nb__conv_impl impl);
nb__conv_impl nb__conv2d_impl(void);

/* y = conv(x, w) + b (b may be NULL). f64 selects double operands, else float. */
nb_status nb__conv2d_fwd(const nb__conv2d_geom *g, const nb__conv2d_plan *p, bool f64,
                         const void *x, const void *w, const void *b, void *y, void *scratch);

/* Gradients from gy (N, O, OH, OW): gx (N, C, H, W), gw (O, C/groups, KH, KW), gb (O); each
 * may be NULL when not wanted (the plan must have been made with the same need_* flags). */
nb_status nb__conv2d_bwd(const nb__conv2d_geom *g, const nb__conv2d_plan *p, bool f64,
                         const void *x, const void *w, const void *gy, void *gx, void *gw,
                         void *gb, void *scratch);

#endif
