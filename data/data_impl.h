/* data_impl.h - private helpers shared by the data/ sources: Philox words for the loader's
 * shuffle and the per-sample augmentation, the general in-memory dataset that the IDX and
 * tensor datasets are made of, and batch-tensor checks. Not installed. */
#ifndef NABLA_DATA_IMPL_H
#define NABLA_DATA_IMPL_H

#include <stdint.h>

#include "nabla/data.h"
#include "nabla/random.h"
#include "tensor/tensor_impl.h"

/* Salts that separate the random words of the augmentations (counter word 3); the shuffle
 * uses the generator layout of nb_randperm (stream = epoch) instead, see loader.c. */
#define NB__SALT_FLIP 0x464c4950u /* "FLIP" */
#define NB__SALT_CROP 0x43524f50u /* "CROP" */

/* Four random words for sample `id` of `epoch` under `seed`: one Philox block at counter
 * (lo32(id), hi32(id), lo32(epoch), salt) and key (lo32(seed), hi32(seed)). */
static inline void nb__sample_words(uint64_t seed, int64_t epoch, int64_t id, uint32_t salt,
                                    uint32_t w[4]) {
    uint32_t c[4] = {(uint32_t)(uint64_t)id, (uint32_t)((uint64_t)id >> 32),
                     (uint32_t)(uint64_t)epoch, salt};
    uint32_t k[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    nb_philox4x32(c, k, w);
}

/* The epoch's permutation of 0..n-1 into p[n]: identical to nb_randperm(n, g) for a
 * generator g = (seed, stream = epoch, offset 0), without allocating. */
void nb__data_randperm(int64_t *p, int64_t n, uint64_t seed, uint64_t stream);

/* An in-memory dataset over contiguous stored tensors x (N rows) and y (N rows or NULL).
 * The batch dtypes and per-sample shapes are given by xs / ys (row sizes must match the
 * stored rows); when the batch dtype differs from the stored one each element is
 * converted, and x values are divided by x_div when x_div != 0 (u8 pixels / 255).
 * x and y are retained. */
nb_dataset *nb__mem_dataset(const char *name, nb_tensor *x, nb_tensor *y,
                            const nb_sample_spec *xs, const nb_sample_spec *ys, double x_div);

/* Check that t is a contiguous CPU tensor of shape (n, spec...) and spec's dtype; the
 * error message names op and what. */
nb_status nb__check_batch_tensor(const nb_tensor *t, int64_t n, const nb_sample_spec *spec,
                                 const char *op, const char *what);

/* Elements per sample of a spec. */
int64_t nb__spec_numel(const nb_sample_spec *s);

#endif
