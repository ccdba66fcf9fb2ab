/* op_table.h - every op of the tensor core, listed once (DESIGN.md rule 1).
 *
 * X(NAME, "user-facing name", arity). The enum nb__op, the name table and (from the
 * autograd issue on) the backward-rule table are all generated from this list, and a
 * static assertion in tensor/ops/op_table.c pins the count, so adding an op here without
 * updating the tables that depend on it fails to compile. Append new ops at the end. */
#ifndef NABLA_OP_TABLE_H
#define NABLA_OP_TABLE_H

#define NB__OPS(X)                                                                         \
    /* unary */                                                                            \
    X(NEG, "neg", 1) X(ABS, "abs", 1) X(EXP, "exp", 1) X(LOG, "log", 1)                    \
    X(LOG1P, "log1p", 1) X(SQRT, "sqrt", 1) X(RSQRT, "rsqrt", 1) X(SIN, "sin", 1)           \
    X(COS, "cos", 1) X(TANH, "tanh", 1) X(SIGMOID, "sigmoid", 1) X(RELU, "relu", 1)         \
    X(GELU, "gelu", 1) X(GELU_TANH, "gelu_tanh", 1) X(SILU, "silu", 1)                      \
    X(POW_SCALAR, "pow_scalar", 1) X(CLAMP, "clamp", 1)                                    \
    /* binary (broadcasting) */                                                            \
    X(ADD, "add", 2) X(SUB, "sub", 2) X(MUL, "mul", 2) X(DIV, "div", 2) X(POW, "pow", 2)     \
    X(MAXIMUM, "maximum", 2) X(MINIMUM, "minimum", 2)                                      \
    X(EQ, "eq", 2) X(NE, "ne", 2) X(LT, "lt", 2) X(LE, "le", 2) X(GT, "gt", 2)               \
    X(GE, "ge", 2) X(WHERE, "where", 3)                                                    \
    /* reductions */                                                                       \
    X(SUM, "sum", 1) X(MEAN, "mean", 1) X(VAR, "var", 1) X(STD, "std", 1)                   \
    X(LOGSUMEXP, "logsumexp", 1) X(AMAX, "amax", 1) X(AMIN, "amin", 1)                     \
    X(MAX_DIM, "max", 1) X(MIN_DIM, "min", 1) X(ARGMAX, "argmax", 1) X(ARGMIN, "argmin", 1) \
    X(SOFTMAX, "softmax", 1) X(LOG_SOFTMAX, "log_softmax", 1)                              \
    /* linear algebra */                                                                   \
    X(MATMUL, "matmul", 2)                                                                 \
    /* indexing */                                                                         \
    X(INDEX_SELECT, "index_select", 2) X(GATHER, "gather", 2)                              \
    X(SCATTER_ADD, "scatter_add", 3) X(EMBEDDING, "embedding", 2)                          \
    X(MASKED_FILL, "masked_fill", 2) X(ONE_HOT, "one_hot", 1) X(TRIL, "tril", 1)           \
    X(TRIU, "triu", 1)                                                                     \
    /* joining, copies, views */                                                           \
    X(CAT, "cat", -1) X(STACK, "stack", -1) X(COPY, "copy", 1) X(TO_DTYPE, "to_dtype", 1)   \
    X(VIEW, "view", 1) X(PERMUTE, "permute", 1) X(NARROW, "narrow", 1)                     \
    X(EXPAND, "expand", 1) X(SLICE, "slice", 1) X(SELECT, "select", 1)                    \
    /* nn: fused layers and losses (defined in nn/) */                                    \
    X(CONV2D, "conv2d", 3) X(MAXPOOL2D, "maxpool2d", 1) X(AVGPOOL2D, "avgpool2d", 1)         \
    X(ADAPTIVE_AVGPOOL2D, "adaptive_avgpool2d", 1) X(LAYER_NORM, "layer_norm", 3)          \
    X(BATCH_NORM, "batch_norm", 3) X(DROPOUT, "dropout", 1)                                \
    X(CROSS_ENTROPY, "cross_entropy", 2) X(NLL_LOSS, "nll_loss", 2)                        \
    X(BCE_WITH_LOGITS, "bce_with_logits", 3) X(LINEAR, "linear", 3)                        \
    X(ATTENTION, "causal_attention", 3) X(ATTENTION_QKV, "causal_attention_qkv", 1)

typedef enum nb__op {
#define NB__OP_ENUM(name, str, arity) NB__OP_##name,
    NB__OPS(NB__OP_ENUM)
#undef NB__OP_ENUM
    NB__OP_COUNT
} nb__op;

/* Number of ops the tables were written for; update together with NB__OPS. */
#define NB__OP_COUNT_EXPECTED 76

extern const char *const nb__op_names[NB__OP_COUNT];

#endif
