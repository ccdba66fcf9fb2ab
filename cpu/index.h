/* index.h - private: the CPU kernels of the indexing ops (cpu/index.c).
 *
 * The op definitions in tensor/ops/index.c have already checked shapes, dtypes and every
 * index value, and allocated the outputs; these kernels only move (and, for scatter_add,
 * add) elements. Index tensors passed here are contiguous I32 or I64. Outputs are fresh
 * contiguous tensors. Inputs (x, src, weight, mask) may have any strides. */
#ifndef NABLA_CPU_INDEX_H
#define NABLA_CPU_INDEX_H

#include <stdbool.h>
#include <stdint.h>

#include "tensor/tensor_impl.h"
#include "cpu/cpu_impl.h" /* transitional: the kernels move to kernel args */

/* Smallest and largest value of a contiguous I32/I64 index with numel > 0. */
void nb__cpu_index_minmax(const nb_tensor *idx, int64_t *mn, int64_t *mx);

/* out = x with positions along dim picked by idx (read as a flat list of numel(idx)
 * values): out is laid out as x's shape with shape[dim] replaced by numel(idx) (its own
 * shape may differ, e.g. embedding's (indices..., D)). */
void nb__cpu_index_select(nb_tensor *out, const nb_tensor *x, int dim, const nb_tensor *idx);

/* out[p] = x[p with p[dim] = idx[p]]; out and idx have the same shape. */
void nb__cpu_gather(nb_tensor *out, const nb_tensor *x, int dim, const nb_tensor *idx);

/* out[p with p[dim] = idx[p]] += src[p] for every p in idx's shape, in increasing p[dim]
 * order for each output element (so the result does not depend on the thread count).
 * out is contiguous, of dtype f32, f64, i32, i64, u8 or bool (logical or); src has the
 * same dtype and a shape at least idx's in every dim. */
void nb__cpu_scatter_add(nb_tensor *out, int dim, const nb_tensor *idx, const nb_tensor *src);

/* out = mask ? value : x elementwise; x has out's shape, mask (bool) broadcasts to it;
 * value points to one element of out's dtype. */
void nb__cpu_masked_fill(nb_tensor *out, nb_tensor *x, nb_tensor *mask, const void *value);

/* out (..., C) = 0 except out[i, idx[i]] = one (one element of out's dtype). */
void nb__cpu_one_hot(nb_tensor *out, const nb_tensor *idx, const void *one);

/* out = x on and below (lower) or on and above (!lower) diagonal k of the last two dims,
 * zero elsewhere. */
void nb__cpu_tri(nb_tensor *out, const nb_tensor *x, int64_t k, bool lower);

#endif
