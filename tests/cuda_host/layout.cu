// tests/cuda_host/layout.cu - sizeof, alignof and key offsets of every kernel argument
// struct (tensor/kernels/*.h) as nvcc lays them out, against gcc's (layout.c), entry by
// entry, generated from the kernel list so a new kernel is covered automatically.
#include <stddef.h>
#include <string.h>

#include "cuhost.h"
#include "tensor/kernels.h"

#define ROW(name, Args, what) {#name, sizeof(Args), alignof(Args)},
static const cuhost_layout_row cu[] = {
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

void cuhost_layout(cuhost *t) {
    int n = (int)(sizeof cu / sizeof cu[0]);
    CUHOST_CHECK(t, n == cuhost_layout_c_n, "%d entries in nvcc's list, %d in gcc's", n,
                 cuhost_layout_c_n);
    for (int i = 0; i < n && i < cuhost_layout_c_n; i++) {
        const cuhost_layout_row *a = &cu[i], *b = &cuhost_layout_c[i];
        CUHOST_CHECK(t, strcmp(a->name, b->name) == 0 && a->size == b->size &&
                            a->align == b->align,
                     "%s: nvcc %zu bytes (align %zu), gcc %s %zu bytes (align %zu)", a->name,
                     a->size, a->align, b->name, b->size, b->align);
    }
}
