/* tensor/kernels/conv.h - private: arguments of the conv kernels (2-D convolution and the
 * 2-D pools, forward and backward). C17 and nvcc; included through tensor/kernels.h.
 *
 * The op definitions (nn/conv.c, nn/pool.c) check the arguments, compute output sizes, make
 * every operand contiguous in the compute dtype (f32 or f64; bf16 on a backend whose conv
 * kernels take it; other f16/bf16 are computed in f32 and rounded once by the op) and allocate the outputs. A kernel gets device pointers to
 * those contiguous arrays plus the geometry; it allocates (and frees) only its own scratch. */
#ifndef NABLA_TENSOR_KERNELS_CONV_H
#define NABLA_TENSOR_KERNELS_CONV_H

/* ---- convolution ----------------------------------------------------------------------------
 * Layouts (contiguous, row-major):
 *     x (N, C, H, W)     w (O, C/groups, KH, KW)     b (O)     y (N, O, OH, OW)
 * PyTorch F.conv2d semantics: symmetric zero padding, no output padding. */
typedef struct nb__conv2d_geom {
    int64_t N, C, H, W;  /* input */
    int64_t O, KH, KW;   /* weight: O x (C/groups) x KH x KW */
    int64_t OH, OW;      /* output spatial size (>= 1 each) */
    int64_t sh, sw, ph, pw, dh, dw; /* stride, padding, dilation (>= 1, >= 0, >= 1) */
    int64_t groups;      /* divides C and O */
} nb__conv2d_geom;

/* conv2d: y = conv(x, w) + b. dtype is the compute dtype of every operand, NB_F32 or
 * NB_F64; or NB_BF16 on a backend with conv_bf16 (tensor/backend.h): x, w and y are bf16, b
 * is f32, sums are f32 and y is rounded once. b may be NULL (no bias). */
typedef struct nb__conv2d_args {
    nb__conv2d_geom g;
    nb_dtype dtype;
    const void *x, *w, *b;
    void *y;
} nb__conv2d_args;

/* conv2d_backward: from gy (N, O, OH, OW), the gradients gx (N, C, H, W), gw (O, C/groups,
 * KH, KW) and gb (O), each NULL when not wanted (every one that is not NULL is fully
 * written, also for N = 0). x is read only for gw (else may be NULL), w only for gx.
 * NB_BF16 (backends with conv_bf16): x, w, gy and gx are bf16, gw and gb f32 (f32 sums). */
typedef struct nb__conv2d_backward_args {
    nb__conv2d_geom g;
    nb_dtype dtype;
    const void *x, *w, *gy;
    void *gx, *gw, *gb;
} nb__conv2d_backward_args;

/* ---- pooling --------------------------------------------------------------------------------
 * Inputs are `planes` contiguous (H, W) planes (planes = N*C, or C for a 3-D input), outputs
 * `planes` contiguous (OH, OW) planes. No ceil mode; windows are clipped to the input. */
typedef struct nb__pool2d_geom {
    int64_t planes, H, W, OH, OW;
    int64_t kh, kw, sh, sw, ph, pw; /* window geometry (not used by adaptive pooling) */
} nb__pool2d_geom;

/* Forward of maxpool2d, avgpool2d, adaptive_avgpool2d: y (planes, OH, OW) from x (planes,
 * H, W), both of dtype `dtype` (NB_F32 or NB_F64).
 *   maxpool2d: idx (planes, OH, OW) of NB_I32 (may be NULL: not recorded) receives the
 *     position h*W + w of each maximum inside its plane (H*W < 2^31). NaN wins (it
 *     propagates), ties keep the first; padding never wins.
 *   avgpool2d: count_include_pad as PyTorch (the divisor counts padded positions, but not
 *     beyond the padded input).
 *   adaptive_avgpool2d: output cell i covers [floor(i*H/OH), ceil((i+1)*H/OH)). */
typedef struct nb__pool2d_args {
    nb__pool2d_geom g;
    nb_dtype dtype;
    bool count_include_pad; /* avgpool2d only */
    /* maxpool2d only, on a backend with pool_relu (tensor/backend.h; nn/pool.c composes
     * ReLU and the pool elsewhere):
     * pool relu(x) = (x < 0 ? 0 : x) instead of x, with the same choices, and write idx -1
     * where the window's maximum is <= 0 (its gradient is 0: ReLU's at a value <= 0). */
    bool relu;
    const void *x;
    void *y;
    int32_t *idx; /* maxpool2d only */
} nb__pool2d_args;

/* Backward of the pools: gx (planes, H, W), fully written, from gy (planes, OH, OW), both of
 * dtype `dtype`. maxpool2d_backward scatter-adds gy at idx (as written by the forward),
 * skipping idx -1. */
typedef struct nb__pool2d_backward_args {
    nb__pool2d_geom g;
    nb_dtype dtype;
    bool count_include_pad; /* avgpool2d_backward only */
    const void *gy;
    const int32_t *idx; /* maxpool2d_backward only */
    void *gx;
} nb__pool2d_backward_args;

#define NB__K_CONV(X)                                                                      \
    X(conv2d, nb__conv2d_args, "2-D convolution forward (+ bias)")                         \
    X(conv2d_backward, nb__conv2d_backward_args, "2-D convolution input/weight/bias grads") \
    X(maxpool2d, nb__pool2d_args, "2-D max pooling forward, argmax indices")               \
    X(maxpool2d_backward, nb__pool2d_backward_args, "2-D max pooling backward")            \
    X(avgpool2d, nb__pool2d_args, "2-D average pooling forward")                           \
    X(avgpool2d_backward, nb__pool2d_backward_args, "2-D average pooling backward")        \
    X(adaptive_avgpool2d, nb__pool2d_args, "2-D adaptive average pooling forward")         \
    X(adaptive_avgpool2d_backward, nb__pool2d_backward_args,                               \
      "2-D adaptive average pooling backward")

#endif
