/* tests/cuda_host/layout.c - the argument structs as gcc (C17) lays them out, for
 * tests/cuda_host/layout.cu to compare with nvcc's layout: the C core fills these structs
 * and the .cu kernels read them, so a difference would be a silent misread on the GPU. */
#include <stdalign.h>
#include <stddef.h>

#include "cuhost.h"
#include "tensor/kernels.h"

#define ROW(name, Args, what) {#name, sizeof(Args), alignof(Args)},
const cuhost_layout_row cuhost_layout_c[] = {
    NB__KERNELS(ROW)
    {"nb__iter", sizeof(nb__iter), alignof(nb__iter)},
    {"nb__iter.data", offsetof(nb__iter, data), 0},
    {"nb__iter.dtype", offsetof(nb__iter, dtype), 0},
    {"nb__view", sizeof(nb__view), alignof(nb__view)},
    {"nb__view.strides", offsetof(nb__view, strides), 0},
    {"nb__ew_args.it", offsetof(nb__ew_args, it), 0},
    {"nb__ew_args.ctx", offsetof(nb__ew_args, ctx), 0},
};
#undef ROW
const int cuhost_layout_c_n = (int)(sizeof cuhost_layout_c / sizeof cuhost_layout_c[0]);
