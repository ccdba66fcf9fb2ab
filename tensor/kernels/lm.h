/* tensor/kernels/lm.h - private: arguments of the language-model kernels of the Llama family
 * of decoders (RMSNorm, rotary position embeddings, the SwiGLU product; their ops are in
 * nn/rms_norm.c, nn/rotary.c, nn/swiglu.c). C17 and nvcc; included through tensor/kernels.h.
 *
 * The op definitions hand in dense row-major buffers in the compute dtype `dtype`: NB_F32
 * (for f32, f16 and bf16 tensors) or NB_F64. RMSNorm's row statistic rstd is an f64 device
 * buffer written by the forward and reused by the backward, as layer norm's. Every pointer
 * is device memory of the operands' device; optional operands (w) and unwanted gradients
 * (dx, dw, da, db) are NULL. */
#ifndef NABLA_TENSOR_KERNELS_LM_H
#define NABLA_TENSOR_KERNELS_LM_H

#ifdef __cplusplus
extern "C" {
#endif

/* rms_norm over the last dim of x (N, D):
 *   rstd[i] = 1 / sqrt(mean_j x[i, j]^2 + eps)              (N, written; the sum in f64)
 *   y = (x * rstd) * w                                      (N, D; w: D or NULL)
 * in the compute type, rstd rounded to it once, the products in that order (Hugging Face's
 * LlamaRMSNorm: weight * (x * rsqrt(variance + eps))). */
typedef struct nb__rms_norm_args {
    nb_dtype dtype;
    int64_t N, D;
    double eps;
    const void *x, *w;
    void *y;
    double *rstd;
} nb__rms_norm_args;

/* rms_norm_backward for the output gradient g (N, D), with gw = g * w (g when w is NULL) and
 * r = rstd[i]:
 *   dx = r * (gw - x * c),  c = r^2 * mean_j(gw * x)        (N, D)
 *   dw = sum_i g * (x * r)                                  (D; rows summed in f64, in
 *                                                            chunks fixed by the shape) */
typedef struct nb__rms_norm_backward_args {
    nb_dtype dtype;
    int64_t N, D;
    const void *g, *x, *w;
    const double *rstd;
    void *dx, *dw;
} nb__rms_norm_backward_args;

/* rotary (Llama's half-split layout, "rotate_half"): x and y are (N, T, H, D), D even; row
 * t of every (n, h) is rotated by the angles of position p = offset + t:
 *   theta_i = p * inv_freq_i,  inv_freq_i = 1 / base^(2 i / D),  i < D / 2
 *   y[i]       = x[i] cos theta_i - x[i + D/2] sin theta_i
 *   y[i + D/2] = x[i + D/2] cos theta_i + x[i] sin theta_i
 * f32: inv_freq, the angle and cos / sin rounded to f32 as Hugging Face computes them
 * (inv_freq from an f32 power, the angle an f32 product); f64: all in double. inverse:
 * rotate by -theta instead (sin negated): the backward, since a rotation's transpose is its
 * inverse. x and y may alias. */
typedef struct nb__rotary_args {
    nb_dtype dtype;
    int64_t N, T, H, D;
    int64_t offset;
    double base;
    bool inverse;
    const void *x;
    void *y;
} nb__rotary_args;

/* swiglu: y = silu(a) * b = a / (1 + exp(-a)) * b over n dense elements. */
typedef struct nb__swiglu_args {
    nb_dtype dtype;
    int64_t n;
    const void *a, *b;
    void *y;
} nb__swiglu_args;

/* swiglu_backward for the output gradient g: with s = sigmoid(a),
 *   da = g * b * s * (1 + a (1 - s)),  db = g * a * s   (n elements each) */
typedef struct nb__swiglu_backward_args {
    nb_dtype dtype;
    int64_t n;
    const void *g, *a, *b;
    void *da, *db;
} nb__swiglu_backward_args;

#ifdef __cplusplus
}
#endif

#define NB__K_LM(X)                                                                        \
    X(rms_norm, nb__rms_norm_args, "RMSNorm forward with the rows' 1/rms")                 \
    X(rms_norm_backward, nb__rms_norm_backward_args, "RMSNorm dx, dw")                     \
    X(rotary, nb__rotary_args, "rotary position embedding (half-split), or its inverse")   \
    X(swiglu, nb__swiglu_args, "SwiGLU product silu(a) * b")                               \
    X(swiglu_backward, nb__swiglu_backward_args, "SwiGLU product da, db")

#endif
