/* cpu/attention.h - private to cpu/: the CPU kernels of causal scaled dot-product attention,
 * forward and backward, f32 and f64, behind the kernel table's attention and
 * attention_backward entries (cpu/attention.c registers them). The layout, the geometry
 * nb__attn_geom and the dropout draw are described in tensor/kernels/attention.h.
 *
 * The work is parallel over the B * H slices (one thread owns a slice), and inside a slice
 * rows are processed in blocks of NB__ATTN_BLOCK, each block's scores computed only for the
 * columns at or left of its last row, so nothing depends on the thread count. Neither
 * direction keeps a (T, T) tensor: the backward recomputes the probabilities from q, k and
 * lse. */
#ifndef NABLA_CPU_ATTENTION_H
#define NABLA_CPU_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

#include "cpu/cpu_impl.h"

/* Rows per block (the blocked causal GEMMs skip the strictly upper blocks). */
#define NB__ATTN_BLOCK 32

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

/* Tests only: whether bf16 operands use the AVX512-BF16 products (true, the default, where
 * the build has them) or are widened to f32 per slice (false); returns the previous
 * setting. Builds without AVX512-BF16 always widen. Process wide. */
bool nb__cpu_attention_native_bf16(bool on);

#endif
