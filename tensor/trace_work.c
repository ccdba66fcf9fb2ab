/* trace_work.c - the work of a kernel call, from its arguments: floating-point operations
 * and bytes moved, for the profiler's GFLOP/s and GB/s columns and the trace's arguments
 * (tensor/backend.h picks the function by the argument type; only called while tracing or
 * profiling). The counts are the conventional ones: 2 M N K for a GEMM, the causal half of
 * attention's two products, every operand read or written once for memory-bound kernels. */
#include "tensor/backend.h"

static int64_t es(nb_dtype dt) { return (int64_t)nb_dtype_size(dt); }

static int64_t batch_of(const int64_t *shape, int ndim) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

nb__work nb__work_none(const void *a) {
    (void)a;
    return (nb__work){0, 0};
}

nb__work nb__work_gemm(const nb__gemm_args *a) {
    int64_t b = batch_of(a->batch_shape, a->batch_ndim);
    return (nb__work){2 * a->M * a->N * a->K * b,
                      (a->M * a->K + a->K * a->N + a->M * a->N) * b * es(a->dtype)};
}

static int64_t iter_bytes(const nb__iter *it) {
    int64_t s = 0;
    for (int i = 0; i < it->nargs; i++) s += it->numel * es(it->dtype[i]);
    return s;
}

nb__work nb__work_ew(const nb__ew_args *a) { return (nb__work){a->it.numel, iter_bytes(&a->it)}; }
nb__work nb__work_copy(const nb__copy_args *a) { return (nb__work){0, iter_bytes(&a->it)}; }
nb__work nb__work_fill(const nb__fill_args *a) { return (nb__work){0, iter_bytes(&a->it)}; }

nb__work nb__work_reduce(const nb__reduce_args *a) {
    return (nb__work){0, batch_of(a->x.shape, a->x.ndim) * es(a->x.dtype)};
}
nb__work nb__work_softmax(const nb__softmax_args *a) {
    return (nb__work){0, 2 * a->outer * a->len * a->inner * es(a->dtype)};
}
nb__work nb__work_softmax_backward(const nb__softmax_backward_args *a) {
    return (nb__work){0, 3 * a->outer * a->len * a->inner * es(a->dtype)};
}
nb__work nb__work_layer_norm(const nb__layer_norm_args *a) {
    return (nb__work){0, 2 * a->N * a->D * es(a->dtype)};
}
nb__work nb__work_layer_norm_backward(const nb__layer_norm_backward_args *a) {
    return (nb__work){0, 3 * a->N * a->D * es(a->dtype)};
}

/* Causal attention: q k^T and p v over the lower triangle, 2 T^2 D flops each halved. */
static int64_t attn_flops(const nb__attn_geom *g) { return 2 * g->B * g->H * g->T * g->T * g->D; }
static int64_t attn_bytes(const nb__attn_geom *g, nb_dtype dt, int tensors) {
    return tensors * g->B * g->H * g->T * g->D * es(dt);
}
nb__work nb__work_attention(const nb__attention_args *a) {
    return (nb__work){attn_flops(&a->g), attn_bytes(&a->g, a->bf16 ? NB_BF16 : a->dtype, 4)};
}
/* The backward recomputes the scores and forms dv, dp, dq and dk: five products. */
nb__work nb__work_attention_backward(const nb__attention_backward_args *a) {
    return (nb__work){attn_flops(&a->g) * 5 / 2,
                      attn_bytes(&a->g, a->bf16 ? NB_BF16 : a->dtype, 8)};
}

static int64_t conv_flops(const nb__conv2d_geom *g) {
    return 2 * g->N * g->O * g->OH * g->OW * (g->C / (g->groups ? g->groups : 1)) * g->KH * g->KW;
}
nb__work nb__work_conv2d(const nb__conv2d_args *a) {
    const nb__conv2d_geom *g = &a->g;
    return (nb__work){conv_flops(g), (g->N * g->C * g->H * g->W + g->N * g->O * g->OH * g->OW) *
                                         es(a->dtype)};
}
nb__work nb__work_conv2d_backward(const nb__conv2d_backward_args *a) {
    const nb__conv2d_geom *g = &a->g;
    return (nb__work){conv_flops(g) * ((a->gx != NULL) + (a->gw != NULL)),
                      (2 * g->N * g->C * g->H * g->W + g->N * g->O * g->OH * g->OW) *
                          es(a->dtype)};
}

/* Optimizer updates read and write their state once: p, g, and the buffers. */
nb__work nb__work_sgd_step(const nb__sgd_step_args *a) {
    return (nb__work){0, (a->buf ? 5 : 3) * a->n * es(a->dtype)};
}
nb__work nb__work_adam_step(const nb__adam_step_args *a) {
    return (nb__work){0, (a->vmax ? 9 : 7) * a->n * es(a->dtype)};
}
