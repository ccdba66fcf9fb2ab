/* tensor/backend.h - private: what a backend implements, and the one way ops reach it.
 *
 * A backend owns the memory of its device and the kernels that compute on it:
 *   - alloc/free: storage for tensors (a caching allocator: docs/architecture.md rule 4);
 *   - to_host/from_host: byte copies between its memory and host memory;
 *   - the kernel table `k`: one typed function pointer per entry of NB__KERNELS
 *     (tensor/kernels.h), NULL where the backend has no kernel yet.
 * tensor/registry.c is the only file that names cpu/ and cuda/: nb__backend_of(dev) maps
 * a device to its backend.
 *
 * Op definitions never call a backend directly. They check their arguments, infer the
 * output's shape and dtype, allocate it on the inputs' device (nb__empty), fill an args
 * struct and call the entry point of the kernel:
 *
 *     nb__ew_args a = {.op = NB__OP_GELU, .dtype = NB_F32};
 *     nb__iter_init(&a.it, out->shape, out->ndim, (nb_tensor *[]){out, x}, 2);
 *     nb_status st = nb__run_ew(nb__device_of(out), "gelu", &a);
 *
 * nb__run_<kernel> looks the kernel up for the device and returns a clear error when it
 * is missing ("gelu: no cuda kernel (ew)"). On the meta device (no storage) every entry
 * point succeeds without running anything, so an op does its checks, shape inference and
 * autograd recording and nothing else. Operands of one op must share a device:
 * nb__check_devices says which differ ("add: operands on cpu and cuda:0"). */
#ifndef NABLA_TENSOR_BACKEND_H
#define NABLA_TENSOR_BACKEND_H

#include "tensor/kernels.h"
#include "tensor/trace.h"

#include "tensor/backend_table.h"

/* The backend of dev; NULL + NB_EDEVICE ("op: ...") when the device type is unknown or
 * this build has no such backend. Never NULL for NB_DEVICE_CPU. */
const nb__backend *nb__backend_of(nb_device dev, const char *op);

/* The error for a missing kernel: "op: no <backend> kernel (<kernel>)"; returns
 * NB_EUNSUPPORTED. */
nb_status nb__no_kernel(const nb__backend *be, const char *op, const char *kernel);

/* The work of a kernel call (tensor/trace_work.c), picked by its argument type: what the
 * profiler turns into GFLOP/s and GB/s. Kernels without an estimate report none. */
typedef struct nb__work {
    int64_t flops, bytes;
} nb__work;
nb__work nb__work_none(const void *a);
nb__work nb__work_gemm(const nb__gemm_args *a);
nb__work nb__work_ew(const nb__ew_args *a);
nb__work nb__work_copy(const nb__copy_args *a);
nb__work nb__work_fill(const nb__fill_args *a);
nb__work nb__work_reduce(const nb__reduce_args *a);
nb__work nb__work_softmax(const nb__softmax_args *a);
nb__work nb__work_softmax_backward(const nb__softmax_backward_args *a);
nb__work nb__work_layer_norm(const nb__layer_norm_args *a);
nb__work nb__work_layer_norm_backward(const nb__layer_norm_backward_args *a);
nb__work nb__work_attention(const nb__attention_args *a);
nb__work nb__work_attention_backward(const nb__attention_backward_args *a);
nb__work nb__work_conv2d(const nb__conv2d_args *a);
nb__work nb__work_conv2d_backward(const nb__conv2d_backward_args *a);
nb__work nb__work_sgd_step(const nb__sgd_step_args *a);
nb__work nb__work_adam_step(const nb__adam_step_args *a);
#define NB__WORK_OF(a)                                                                     \
    _Generic((a),                                                                          \
        const nb__gemm_args *: nb__work_gemm,                                              \
        const nb__ew_args *: nb__work_ew,                                                  \
        const nb__copy_args *: nb__work_copy,                                              \
        const nb__fill_args *: nb__work_fill,                                              \
        const nb__reduce_args *: nb__work_reduce,                                          \
        const nb__softmax_args *: nb__work_softmax,                                        \
        const nb__softmax_backward_args *: nb__work_softmax_backward,                      \
        const nb__layer_norm_args *: nb__work_layer_norm,                                  \
        const nb__layer_norm_backward_args *: nb__work_layer_norm_backward,                \
        const nb__attention_args *: nb__work_attention,                                    \
        const nb__attention_backward_args *: nb__work_attention_backward,                  \
        const nb__conv2d_args *: nb__work_conv2d,                                          \
        const nb__conv2d_backward_args *: nb__work_conv2d_backward,                        \
        const nb__sgd_step_args *: nb__work_sgd_step,                                      \
        const nb__adam_step_args *: nb__work_adam_step,                                    \
        default: nb__work_none)(a)

/* The checked entry points, one per kernel. Each kernel call is a span of the trace and
 * the profiler (tensor/trace.h): named by the op, its kernel as the detail; when neither
 * runs that costs one test of a global flag. */
static inline nb_status nb__run_traced(int tok, nb_status st, nb__work w) {
    NB__SPAN_END_WORK(tok, w.flops, w.bytes);
    return st;
}
#define NB__RUN_DEF(name, Args, what)                                                      \
    static inline nb_status nb__run_##name(nb_device dev, const char *op, const Args *a) { \
        const nb__backend *be = nb__backend_of(dev, op);                                   \
        if (!be) return nb_last_status();                                                  \
        if (!be->has_storage) return NB_OK;                                                \
        if (!be->k.name) return nb__no_kernel(be, op, #name);                              \
        if (NB__TRACE_ACTIVE()) {                                                          \
            int tok = nb__span_begin(op, #name, NB__CAT_OP);                               \
            return nb__run_traced(tok, be->k.name(a), NB__WORK_OF(a));                     \
        }                                                                                  \
        return be->k.name(a);                                                              \
    }
NB__KERNELS(NB__RUN_DEF)
#undef NB__RUN_DEF

/* Whether dev's gemm kernel takes bf16 operands (else the op widens them to f32). */
static inline bool nb__gemm_takes_bf16(nb_device dev) {
    const nb__backend *be = nb__backend_of(dev, "matmul");
    return be && be->gemm_bf16;
}

/* Whether dev's conv2d kernels take bf16 operands (else the op widens them to f32). */
static inline bool nb__conv_takes_bf16(nb_device dev) {
    const nb__backend *be = nb__backend_of(dev, "conv2d");
    return be && be->conv_bf16;
}

/* Whether dev's attention kernels take bf16 operands (else the op widens them to f32). */
static inline bool nb__attention_takes_bf16(nb_device dev) {
    const nb__backend *be = nb__backend_of(dev, "causal_attention");
    return be && be->attention_bf16;
}

/* Whether dev's ew kernel takes f16/bf16 inputs of an f32 op as they are (else the op
 * converts them to f32 first: a pass over memory more, and a temporary). */
static inline bool nb__ew_takes_half_in_f32(nb_device dev) {
    const nb__backend *be = nb__backend_of(dev, "elementwise");
    return be && be->ew_half_in_f32;
}

/* Whether dev's maxpool2d kernel fuses the ReLU before it (nb__pool2d_args.relu; else the op
 * composes nb_relu and the pool). */
static inline bool nb__pool_takes_relu(nb_device dev) {
    const nb__backend *be = nb__backend_of(dev, "maxpool2d");
    return be && be->pool_relu;
}

/* Whether dev's backend has a kernel `kernel` (by its NB__KERNELS name). */
bool nb__backend_has_kernel(nb_device dev, const char *kernel);

#endif
