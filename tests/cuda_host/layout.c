/* tests/cuda_host/layout.c - the argument structs as gcc (C17) lays them out, for
 * tests/cuda_host/layout.cu to compare with nvcc's layout: the C core fills these structs
 * and the .cu kernels read them, so a difference would be a silent misread on the GPU. */
#include <stdalign.h>
#include <stddef.h>

#include "cuhost.h"
#include "layout_rows.h"
#include "tensor/kernels.h"

const cuhost_layout_row cuhost_layout_c[] = {
    CUHOST_LAYOUT_ROWS
};
const int cuhost_layout_c_n = (int)(sizeof cuhost_layout_c / sizeof cuhost_layout_c[0]);
