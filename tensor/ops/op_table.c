/* op_table.c - tables generated from the one op list in op_table.h. */
#include <string.h>

#include "tensor/op_table.h"

_Static_assert(NB__OP_COUNT == NB__OP_COUNT_EXPECTED,
               "op_table.h changed: update NB__OP_COUNT_EXPECTED and every per-op table");

const char *const nb__op_names[NB__OP_COUNT] = {
#define NB__OP_NAME(name, str, arity, grad) str,
    NB__OPS(NB__OP_NAME)
#undef NB__OP_NAME
};

/* Which kernels each op runs, forward and backward (nb_device_supports). Views (view,
 * permute, narrow, expand, slice, select), to_device (the backends' own copies) and
 * recompute (the ops of the user's function) run none.
 * tests/test_backend.c checks every name here is a kernel of tensor/kernels.h and that
 * every other op lists one. */
static const char *const op_kernels[NB__OP_COUNT][4] = {
    [NB__OP_NEG] = {"ew", "ew_backward", NULL},
    [NB__OP_ABS] = {"ew", "ew_backward", NULL},
    [NB__OP_EXP] = {"ew", "ew_backward", NULL},
    [NB__OP_LOG] = {"ew", "ew_backward", NULL},
    [NB__OP_LOG1P] = {"ew", "ew_backward", NULL},
    [NB__OP_SQRT] = {"ew", "ew_backward", NULL},
    [NB__OP_RSQRT] = {"ew", "ew_backward", NULL},
    [NB__OP_SIN] = {"ew", "ew_backward", NULL},
    [NB__OP_COS] = {"ew", "ew_backward", NULL},
    [NB__OP_TANH] = {"ew", "ew_backward", NULL},
    [NB__OP_SIGMOID] = {"ew", "ew_backward", NULL},
    [NB__OP_RELU] = {"ew", "ew_backward", NULL},
    [NB__OP_GELU] = {"ew", "ew_backward", NULL},
    [NB__OP_GELU_TANH] = {"ew", "ew_backward", NULL},
    [NB__OP_SILU] = {"ew", "ew_backward", NULL},
    [NB__OP_POW_SCALAR] = {"ew", "ew_backward", NULL},
    [NB__OP_CLAMP] = {"ew", "ew_backward", NULL},
    [NB__OP_ADD] = {"ew", "ew_backward", NULL},
    [NB__OP_SUB] = {"ew", "ew_backward", NULL},
    [NB__OP_MUL] = {"ew", "ew_backward", NULL},
    [NB__OP_DIV] = {"ew", "ew_backward", NULL},
    [NB__OP_POW] = {"ew", "ew_backward", NULL},
    [NB__OP_MAXIMUM] = {"ew", "ew_backward", NULL},
    [NB__OP_MINIMUM] = {"ew", "ew_backward", NULL},
    [NB__OP_EQ] = {"ew", NULL},
    [NB__OP_NE] = {"ew", NULL},
    [NB__OP_LT] = {"ew", NULL},
    [NB__OP_LE] = {"ew", NULL},
    [NB__OP_GT] = {"ew", NULL},
    [NB__OP_GE] = {"ew", NULL},
    [NB__OP_WHERE] = {"ew", NULL},
    [NB__OP_SUM] = {"reduce", "ew", NULL},
    [NB__OP_MEAN] = {"reduce", "ew", NULL},
    [NB__OP_VAR] = {"reduce", "ew", NULL},
    [NB__OP_STD] = {"reduce", "ew", NULL},
    [NB__OP_LOGSUMEXP] = {"reduce", "ew", NULL},
    [NB__OP_AMAX] = {"reduce", "ew", NULL},
    [NB__OP_AMIN] = {"reduce", "ew", NULL},
    [NB__OP_MAX_DIM] = {"reduce", "extreme_backward", NULL},
    [NB__OP_MIN_DIM] = {"reduce", "extreme_backward", NULL},
    [NB__OP_ARGMAX] = {"reduce", NULL},
    [NB__OP_ARGMIN] = {"reduce", NULL},
    [NB__OP_SOFTMAX] = {"softmax", "softmax_backward", NULL},
    [NB__OP_LOG_SOFTMAX] = {"softmax", "softmax_backward", NULL},
    [NB__OP_MATMUL] = {"gemm", "copy", NULL},
    [NB__OP_LINEAR] = {"gemm", "copy", NULL},
    [NB__OP_INDEX_SELECT] = {"index_select", "index_add", NULL},
    [NB__OP_EMBEDDING] = {"index_select", "index_add", NULL},
    [NB__OP_GATHER] = {"gather", "scatter_add", NULL},
    [NB__OP_SCATTER_ADD] = {"scatter_add", "gather", NULL},
    [NB__OP_MASKED_FILL] = {"masked_fill", NULL},
    [NB__OP_ONE_HOT] = {"one_hot", "index_minmax", NULL},
    [NB__OP_TRIL] = {"tri", NULL},
    [NB__OP_TRIU] = {"tri", NULL},
    [NB__OP_CAT] = {"copy", NULL},
    [NB__OP_STACK] = {"copy", NULL},
    [NB__OP_COPY] = {"copy", NULL},
    [NB__OP_TO_DTYPE] = {"copy", NULL},
    [NB__OP_CONV2D] = {"conv2d", "conv2d_backward", NULL},
    [NB__OP_MAXPOOL2D] = {"maxpool2d", "maxpool2d_backward", NULL},
    [NB__OP_AVGPOOL2D] = {"avgpool2d", "avgpool2d_backward", NULL},
    [NB__OP_ADAPTIVE_AVGPOOL2D] = {"adaptive_avgpool2d", "adaptive_avgpool2d_backward", NULL},
    [NB__OP_LAYER_NORM] = {"layer_norm", "layer_norm_backward", NULL},
    [NB__OP_BATCH_NORM] = {"batch_norm_stats", "batch_norm_apply", "batch_norm_backward", NULL},
    [NB__OP_DROPOUT] = {"dropout", "random", NULL},
    [NB__OP_CROSS_ENTROPY] = {"cross_entropy", "cross_entropy_backward", NULL},
    [NB__OP_NLL_LOSS] = {"nll_loss", "nll_loss_backward", NULL},
    [NB__OP_BCE_WITH_LOGITS] = {"bce_with_logits", "bce_with_logits_backward", NULL},
    [NB__OP_ATTENTION] = {"attention", "attention_backward", NULL},
    [NB__OP_ATTENTION_QKV] = {"attention", "attention_backward", NULL},
    /* the layout changes around the communication (parallel/tp_ops.c) */
    [NB__OP_COLLECTIVE] = {"copy", NULL},
    [NB__OP_RMS_NORM] = {"rms_norm", "rms_norm_backward", NULL},
    [NB__OP_ROTARY] = {"rotary", NULL},
    [NB__OP_SWIGLU] = {"swiglu", "swiglu_backward", NULL},
};

const char *const *nb__op_kernels(const char *name) {
    if (!name) return NULL;
    for (int i = 0; i < NB__OP_COUNT; i++)
        if (strcmp(nb__op_names[i], name) == 0) return op_kernels[i];
    return NULL;
}
