/* cpu/reduce_back.h - private: the ordered index_add behind the gradients of index_select
 * and embedding (tensor/ops/index.c), implemented in cpu/reduce_back.c next to the backward
 * kernels of the reductions (those are declared in cpu/reduce.h, as kernel-table entries).
 * tensor/tensor_impl.h is included only for nb__cpu_index_add, which still takes nb_tensor
 * until the index family moves behind the kernel table. */
#ifndef NABLA_CPU_REDUCE_BACK_H
#define NABLA_CPU_REDUCE_BACK_H

#include <stdbool.h>
#include <stdint.h>

#include "tensor/tensor_impl.h"
#include "cpu/cpu_impl.h" /* transitional: the kernels move to kernel args */

/* out[.., idx[m], ..] += src[.., m, ..] along dim, for m = 0, 1, ... in that order (so a
 * repeated index accumulates in index order, whatever the thread count). out is contiguous
 * f32 or f64 (the accumulation type); src is contiguous, of any float dtype, laid out as
 * out's shape with shape[dim] replaced by numel(idx); idx is contiguous I32/I64 with values
 * already checked to lie in [0, out.shape[dim]). A 0-dim out counts as shape [1]. */
void nb__cpu_index_add(nb_tensor *out, int dim, const nb_tensor *idx, const nb_tensor *src);

#endif
