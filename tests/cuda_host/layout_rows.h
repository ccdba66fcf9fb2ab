/* tests/cuda_host/layout_rows.h - the rows of the struct-layout comparison, one list that
 * gcc (layout.c) and nvcc (layout.cu) both expand: every kernel argument struct of the
 * kernel list (size and alignment) and key offsets of the shared geometry structs. */
#define CUHOST_LAYOUT_ROW(name, Args, what) {#name, sizeof(Args), alignof(Args)},
#define CUHOST_LAYOUT_ROWS                                                                 \
    NB__KERNELS(CUHOST_LAYOUT_ROW)                                                         \
    {"nb__iter", sizeof(nb__iter), alignof(nb__iter)},                                     \
    {"nb__iter.data", offsetof(nb__iter, data), 0},                                        \
    {"nb__iter.dtype", offsetof(nb__iter, dtype), 0},                                      \
    {"nb__view", sizeof(nb__view), alignof(nb__view)},                                     \
    {"nb__view.strides", offsetof(nb__view, strides), 0},                                  \
    {"nb__ew_args.it", offsetof(nb__ew_args, it), 0},                                      \
    {"nb__ew_args.ctx", offsetof(nb__ew_args, ctx), 0},
