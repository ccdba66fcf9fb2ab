/* op_table.h - every op of the tensor core, listed once (docs/architecture.md rule 1).
 *
 * X(NAME, "user-facing name", arity, grad). The enum nb__op, the name table, the
 * backward-rule table (autograd/rules.c) and the op -> kernels table (op_table.c) are all
 * generated from this list, and a static assertion in tensor/ops/op_table.c pins the
 * count, so adding an op here without updating the tables that depend on it fails to
 * compile. grad is 1 for a differentiable op, whose rule nb__bw_NAME must then exist (a
 * missing rule fails to link), 0 for one that never records (comparisons, argmax, ...).
 * Append new ops at the end. */
#ifndef NABLA_OP_TABLE_H
#define NABLA_OP_TABLE_H

#define NB__OPS(X)                                                                         \
    /* unary */                                                                            \
    X(NEG, "neg", 1, 1) X(ABS, "abs", 1, 1) X(EXP, "exp", 1, 1) X(LOG, "log", 1, 1)                    \
    X(LOG1P, "log1p", 1, 1) X(SQRT, "sqrt", 1, 1) X(RSQRT, "rsqrt", 1, 1) X(SIN, "sin", 1, 1)           \
    X(COS, "cos", 1, 1) X(TANH, "tanh", 1, 1) X(SIGMOID, "sigmoid", 1, 1) X(RELU, "relu", 1, 1)         \
    X(GELU, "gelu", 1, 1) X(GELU_TANH, "gelu_tanh", 1, 1) X(SILU, "silu", 1, 1)                      \
    X(POW_SCALAR, "pow_scalar", 1, 1) X(CLAMP, "clamp", 1, 1)                                    \
    /* binary (broadcasting) */                                                            \
    X(ADD, "add", 2, 1) X(SUB, "sub", 2, 1) X(MUL, "mul", 2, 1) X(DIV, "div", 2, 1) X(POW, "pow", 2, 1)     \
    X(MAXIMUM, "maximum", 2, 1) X(MINIMUM, "minimum", 2, 1)                                      \
    X(EQ, "eq", 2, 0) X(NE, "ne", 2, 0) X(LT, "lt", 2, 0) X(LE, "le", 2, 0) X(GT, "gt", 2, 0)               \
    X(GE, "ge", 2, 0) X(WHERE, "where", 3, 1)                                                    \
    /* reductions */                                                                       \
    X(SUM, "sum", 1, 1) X(MEAN, "mean", 1, 1) X(VAR, "var", 1, 1) X(STD, "std", 1, 1)                   \
    X(LOGSUMEXP, "logsumexp", 1, 1) X(AMAX, "amax", 1, 1) X(AMIN, "amin", 1, 1)                     \
    X(MAX_DIM, "max", 1, 1) X(MIN_DIM, "min", 1, 1) X(ARGMAX, "argmax", 1, 0) X(ARGMIN, "argmin", 1, 0) \
    X(SOFTMAX, "softmax", 1, 1) X(LOG_SOFTMAX, "log_softmax", 1, 1)                              \
    /* linear algebra */                                                                   \
    X(MATMUL, "matmul", 2, 1)                                                                 \
    /* indexing */                                                                         \
    X(INDEX_SELECT, "index_select", 2, 1) X(GATHER, "gather", 2, 1)                              \
    X(SCATTER_ADD, "scatter_add", 3, 1) X(EMBEDDING, "embedding", 2, 1)                          \
    X(MASKED_FILL, "masked_fill", 2, 1) X(ONE_HOT, "one_hot", 1, 0) X(TRIL, "tril", 1, 1)           \
    X(TRIU, "triu", 1, 1)                                                                     \
    /* joining, copies, views */                                                           \
    X(CAT, "cat", -1, 1) X(STACK, "stack", -1, 1) X(COPY, "copy", 1, 1) X(TO_DTYPE, "to_dtype", 1, 1)   \
    X(VIEW, "view", 1, 1) X(PERMUTE, "permute", 1, 1) X(NARROW, "narrow", 1, 1)                     \
    X(EXPAND, "expand", 1, 1) X(SLICE, "slice", 1, 1) X(SELECT, "select", 1, 1)                    \
    /* nn: fused layers and losses (defined in nn/) */                                    \
    X(CONV2D, "conv2d", 3, 1) X(MAXPOOL2D, "maxpool2d", 1, 1) X(AVGPOOL2D, "avgpool2d", 1, 1)         \
    X(ADAPTIVE_AVGPOOL2D, "adaptive_avgpool2d", 1, 1) X(LAYER_NORM, "layer_norm", 3, 1)          \
    X(BATCH_NORM, "batch_norm", 3, 1) X(DROPOUT, "dropout", 1, 1)                                \
    X(CROSS_ENTROPY, "cross_entropy", 2, 1) X(NLL_LOSS, "nll_loss", 2, 1)                        \
    X(BCE_WITH_LOGITS, "bce_with_logits", 3, 1) X(LINEAR, "linear", 3, 1)                        \
    X(ATTENTION, "causal_attention", 3, 1) X(ATTENTION_QKV, "causal_attention_qkv", 1, 1)   \
    /* devices */                                                                          \
    X(TO_DEVICE, "to_device", 1, 1)                                                          \
    /* activation checkpointing: a user function replayed in backward (autograd/recompute.c) */ \
    X(RECOMPUTE, "recompute", -1, 1)                                                         \
    /* autograd-aware collectives over a communicator (defined in parallel/tp_ops.c) */      \
    X(COLLECTIVE, "collective", 1, 1)                                                        \
    /* nn: the Llama family's fused ops (nn/rms_norm.c, nn/rotary.c, nn/swiglu.c) */         \
    X(RMS_NORM, "rms_norm", 2, 1) X(ROTARY, "rotary_embedding", 1, 1) X(SWIGLU, "swiglu", 2, 1)

typedef enum nb__op {
#define NB__OP_ENUM(name, str, arity, grad) NB__OP_##name,
    NB__OPS(NB__OP_ENUM)
#undef NB__OP_ENUM
    NB__OP_COUNT
} nb__op;

/* Number of ops the tables were written for; update together with NB__OPS. */
#define NB__OP_COUNT_EXPECTED 82

#ifdef __cplusplus
extern "C" {
#endif
extern const char *const nb__op_names[NB__OP_COUNT];
/* The kernel names (tensor/kernels.h) op `name` ("gelu", "matmul") runs, NULL-terminated;
 * NULL for an unknown name. Views list none. */
const char *const *nb__op_kernels(const char *name);
#ifdef __cplusplus
}
#endif

#endif
