/* nabla/random.h - counter-based random numbers (Philox 4x32-10) and random tensors.
 *
 * Usage:
 *     nb_generator *g = nb_generator_new(1234);
 *     nb_tensor *w = nb_randn((int64_t[]){784, 1024}, 2, NB_F32, g);
 *     uint64_t pos = nb_generator_offset(g);      // save with a checkpoint ...
 *     nb_generator_set_offset(g, pos);            // ... and continue the same stream later
 *     nb_generator_free(g);
 *
 * A generator is (seed, stream, offset). Element i of a random tensor is drawn from word
 * i % 4 of the Philox block at counter (offset + i / 4, stream) and key seed (f64 values and
 * randint ranges above 2^32 use two words: block offset + i / 2); then offset advances past
 * the blocks used. nb_generator_set_stream rewinds the offset to 0. So values depend only on (seed, stream, offset, shape), never on the
 * thread count or device (docs/architecture.md rule 5). Passing NULL for a generator uses the
 * calling thread's default generator (seed 0 until nb_manual_seed).
 *
 * Ownership: nb_generator_new returns a generator the caller frees with nb_generator_free.
 * A generator must not be used by two threads at once. */
#ifndef NABLA_RANDOM_H
#define NABLA_RANDOM_H

#include <stdint.h>

#include "nabla/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

nb_generator *nb_generator_new(uint64_t seed);
void nb_generator_free(nb_generator *g);
/* Independent stream of the same seed (e.g. one per data-loader worker or rank). */
nb_status nb_generator_set_stream(nb_generator *g, uint64_t stream);
uint64_t nb_generator_seed(const nb_generator *g);
uint64_t nb_generator_stream(const nb_generator *g);
/* Position in the stream, in 128-bit Philox blocks. */
uint64_t nb_generator_offset(const nb_generator *g);
nb_status nb_generator_set_offset(nb_generator *g, uint64_t offset);
/* The calling thread's default generator (owned by the library). */
nb_generator *nb_default_generator(void);
/* Reseed the calling thread's default generator (stream 0, offset 0). */
void nb_manual_seed(uint64_t seed);

/* One Philox 4x32-10 block: 4 random 32-bit words for a 128-bit counter and 64-bit key. */
void nb_philox4x32(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);

/* Uniform [lo, hi) (float dtypes). */
nb_tensor *nb_rand(const int64_t *shape, int ndim, nb_dtype dt, nb_generator *g);
nb_tensor *nb_uniform(const int64_t *shape, int ndim, nb_dtype dt, double lo, double hi,
                      nb_generator *g);
/* Normal(mean 0, std 1) and Normal(mean, std) (float dtypes), Box-Muller. */
nb_tensor *nb_randn(const int64_t *shape, int ndim, nb_dtype dt, nb_generator *g);
nb_tensor *nb_normal(const int64_t *shape, int ndim, nb_dtype dt, double mean, double std,
                     nb_generator *g);
/* Integers uniform in [lo, hi) (integer or float dtypes). */
nb_tensor *nb_randint(const int64_t *shape, int ndim, nb_dtype dt, int64_t lo, int64_t hi,
                      nb_generator *g);
/* 1 with probability p, else 0 (any dtype; NB_BOOL gives true/false). */
nb_tensor *nb_bernoulli(const int64_t *shape, int ndim, nb_dtype dt, double p,
                        nb_generator *g);
/* A random permutation of 0..n-1 (I64), e.g. for shuffling. */
nb_tensor *nb_randperm(int64_t n, nb_generator *g);
/* The creators above use the default device (nb_set_default_device; NB_CPU unless set).
 * The same on a chosen device: identical values on every device; the generator advances
 * the same everywhere, meta included. */
nb_tensor *nb_rand_on(nb_device dev, const int64_t *shape, int ndim, nb_dtype dt,
                      nb_generator *g);
nb_tensor *nb_uniform_on(nb_device dev, const int64_t *shape, int ndim, nb_dtype dt, double lo,
                         double hi, nb_generator *g);
nb_tensor *nb_randn_on(nb_device dev, const int64_t *shape, int ndim, nb_dtype dt,
                       nb_generator *g);
nb_tensor *nb_normal_on(nb_device dev, const int64_t *shape, int ndim, nb_dtype dt,
                        double mean, double std, nb_generator *g);
nb_tensor *nb_randint_on(nb_device dev, const int64_t *shape, int ndim, nb_dtype dt,
                         int64_t lo, int64_t hi, nb_generator *g);
nb_tensor *nb_bernoulli_on(nb_device dev, const int64_t *shape, int ndim, nb_dtype dt,
                           double p, nb_generator *g);
nb_tensor *nb_randperm_on(nb_device dev, int64_t n, nb_generator *g);
/* In place on t's device (float t, any strides): the values nb_uniform / nb_normal draw
 * for t's shape, in row-major order. Needs grad mode off for a tensor that requires grad. */
nb_status nb_uniform_(nb_tensor *t, double lo, double hi, nb_generator *g);
nb_status nb_normal_(nb_tensor *t, double mean, double std, nb_generator *g);

#ifdef __cplusplus
}
#endif
#endif
