/* cpu/attention.h - private: the CPU kernels of causal scaled dot-product attention
 * (nb_causal_attention in nn/attention.c), forward and backward, f32 and f64.
 *
 * Layout: q, k, v, the output o, the output gradient do and the input gradients dq, dk, dv
 * are (B, H, T, D) given by a base pointer and element strides for B, H and T; the D stride
 * is always 1 (the op makes an operand contiguous when it is not), so every (b, h) slice is a
 * row-major (T, D) matrix with row stride ld = stride of T, which the GEMMs take as is (views
 * from splitting a fused qkv projection need no copy). lse is (B, H, T) contiguous: the
 * log-sum-exp of each row of scaled scores, saved by the forward for the backward.
 *
 * The work is parallel over the B * H slices (one thread owns a slice), and inside a slice
 * rows are processed in blocks of NB__ATTN_BLOCK, each block's scores computed only for the
 * columns at or left of its last row, so nothing depends on the thread count. Neither
 * direction keeps a (T, T) tensor: the backward recomputes the probabilities from q, k and lse.
 *
 * Dropout (p > 0): the weight P[b, h, t, s] is kept iff the Philox word for element
 * i = ((b H + h) T + t) T + s of a (B, H, T, T) tensor, drawn as nb_bernoulli draws it
 * (block offset + i / 4, word i % 4, counter stream, key seed), satisfies w 2^-32 < 1 - p;
 * i.e. the keep mask is exactly nb_bernoulli((B, H, T, T), 1 - p) from a generator at
 * (seed, stream, offset). Kept weights are scaled by 1 / (1 - p). The forward and backward
 * regenerate the same words, so no mask is stored. */
#ifndef NABLA_CPU_ATTENTION_H
#define NABLA_CPU_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

#include "tensor/tensor_impl.h"
#include "cpu/cpu_impl.h" /* transitional: the kernels move to kernel args */

/* Rows per block (the blocked causal GEMMs skip the strictly upper blocks). */
#define NB__ATTN_BLOCK 32

typedef struct nb__attn_geom {
    int64_t B, H, T, D;
    /* element strides (B, H, T) of each operand; D stride 1 */
    int64_t sq[3], sk[3], sv[3], so[3], sdo[3], sdq[3], sdk[3], sdv[3];
    double scale;
    /* dropout: active when p > 0 */
    double p;
    uint64_t seed, stream, offset;
} nb__attn_geom;

/* o = softmax_causal(q k^T scale) v (with dropout on the weights), lse as above. */
nb_status nb__cpu_attention_fwd_f32(const nb__attn_geom *g, const float *q, const float *k,
                                    const float *v, float *o, float *lse);
nb_status nb__cpu_attention_fwd_f64(const nb__attn_geom *g, const double *q, const double *k,
                                    const double *v, double *o, double *lse);
/* Gradients of the forward above for the output gradient do. dq, dk, dv may each be NULL
 * when not wanted. Returns NB_ENOMEM when scratch memory is not available. */
nb_status nb__cpu_attention_bwd_f32(const nb__attn_geom *g, const float *q, const float *k,
                                    const float *v, const float *lse, const float *dout,
                                    float *dq, float *dk, float *dv);
nb_status nb__cpu_attention_bwd_f64(const nb__attn_geom *g, const double *q, const double *k,
                                    const double *v, const double *lse, const double *dout,
                                    double *dq, double *dk, double *dv);

#endif
