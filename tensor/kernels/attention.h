/* tensor/kernels/attention.h - private: arguments of the fused causal attention kernels
 * (nb_causal_attention and nb_causal_attention_qkv, nn/attention.c). C17 and nvcc;
 * included through tensor/kernels.h.
 *
 * Layout: q, k, v, the output o, the output gradient dout and the input gradients dq, dk,
 * dv are (B, H, T, D), each given by a device pointer and element strides for B, H and T;
 * except that with grouped-query attention (Hkv < H) k, v, dk and dv are (B, Hkv, T, D):
 * query head h reads key/value head h / (H / Hkv) (Hkv divides H), and dk, dv of a key/value
 * head sum the contributions of its H / Hkv query heads (in head order);
 * the D stride is always 1 (the op makes an operand so when it is not), so every (b, h)
 * slice is a row-major (T, D) matrix with row stride = the T stride (views from splitting a
 * fused qkv projection need no copy). lse is (B, H, T) contiguous: the log-sum-exp of each
 * row of scaled scores, written by the forward for the backward. All in the compute dtype
 * `dtype`, NB_F32 (for f32, f16, bf16) or NB_F64; except with `bf16` set (only on a backend
 * whose attention_bf16 flag says it takes them, tensor/backend.h): then q, k, v, o, dout,
 * dq, dk and dv are bf16 while dtype and lse stay NB_F32 (the math is f32 either way).
 *
 * Dropout (p > 0): the weight P[b, h, t, s] is kept iff the Philox word for element
 * i = ((b H + h) T + t) T + s of a (B, H, T, T) tensor, drawn as nb_bernoulli draws it
 * (block offset + i / 4, word i % 4, counter stream, key seed), satisfies w 2^-32 < 1 - p;
 * i.e. the keep mask is exactly nb_bernoulli((B, H, T, T), 1 - p) from a generator at
 * (seed, stream, offset). Kept weights are scaled by 1 / (1 - p). The forward and backward
 * regenerate the same words, so no mask is stored; the op reserves the generator range. */
#ifndef NABLA_TENSOR_KERNELS_ATTENTION_H
#define NABLA_TENSOR_KERNELS_ATTENTION_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb__attn_geom {
    int64_t B, H, T, D;
    int64_t Hkv; /* key/value heads, dividing H (grouped-query attention); 0 means H */
    /* element strides (B, H, T) of each operand; D stride 1 */
    int64_t sq[3], sk[3], sv[3], so[3], sdo[3], sdq[3], sdk[3], sdv[3];
    double scale; /* of the scores q k^T */
    /* dropout: active when p > 0; the Philox key (seed), counter stream and block offset */
    double p;
    uint64_t seed, stream, offset;
} nb__attn_geom;

/* attention: o = softmax_causal(q k^T scale) v (with dropout on the weights), lse as above. */
typedef struct nb__attention_args {
    nb__attn_geom g;
    nb_dtype dtype;
    bool bf16; /* bf16 operands (above) */
    const void *q, *k, *v;
    void *o, *lse;
} nb__attention_args;

/* attention_backward: the gradients of the forward above for the output gradient dout,
 * from q, k, v and the forward's lse (the weights are recomputed). dq, dk, dv may each be
 * NULL when not wanted. */
typedef struct nb__attention_backward_args {
    nb__attn_geom g;
    nb_dtype dtype;
    bool bf16; /* bf16 operands and gradients (above) */
    const void *q, *k, *v, *lse, *dout;
    void *dq, *dk, *dv;
} nb__attention_backward_args;

#ifdef __cplusplus
}
#endif

#define NB__K_ATTENTION(X)                                                                 \
    X(attention, nb__attention_args, "fused causal attention forward, row log-sum-exp")   \
    X(attention_backward, nb__attention_backward_args, "fused causal attention dq, dk, dv")

#endif
