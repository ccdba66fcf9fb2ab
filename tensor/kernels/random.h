/* tensor/kernels/random.h - private: arguments of the random kernels. C17 and nvcc; included
 * through tensor/kernels.h.
 *
 * A random kernel computes Philox 4x32-10 blocks from (seed, stream, offset) and turns
 * their words into values exactly as tensor/random.c documents (which words make element i,
 * and how). The generator state lives on the host: the op copies (seed, stream, offset)
 * into the args and advances the generator itself, so a kernel never writes it back and
 * the meta device (where nothing runs) advances the stream exactly as a real device. */
#ifndef NABLA_TENSOR_KERNELS_RANDOM_H
#define NABLA_TENSOR_KERNELS_RANDOM_H

/* The distribution a `random` kernel draws. */
typedef enum nb__random_dist {
    NB__RANDOM_UNIFORM,   /* a + (b - a) * u, u in [0, 1); results >= b become below_hi */
    NB__RANDOM_NORMAL,    /* a + b * z, z standard normal by Box-Muller (a mean, b std) */
    NB__RANDOM_INT,       /* ilo + multiply-shift of a word by range: uniform in [ilo, ilo+range) */
    NB__RANDOM_BERNOULLI, /* 1 if u < a (a the probability), else 0 */
} nb__random_dist;

/* random: fills every element of `out` (any dtype the op accepted for dist, any strides):
 * element i in row-major order of out's shape takes value i of the stream.
 *   seed, stream, offset: the generator's state when the call starts (Philox key = seed;
 *     counter of block b = (offset + b, stream));
 *   per_block: elements per Philox block, 4 (one 32-bit word each) or 2 (one 64-bit word
 *     each: f64 uniform/normal, randint ranges above 2^32);
 *   a, b: uniform lo, hi / normal mean, std / bernoulli p (a only);
 *   ilo, range: randint's lo and hi - lo (range >= 1);
 *   below_hi_{d,f,h}: uniform with b > a: the largest value of out's dtype below b (f64,
 *     f32, and the f16/bf16 bits), which replaces a value that rounded up to b. */
typedef struct nb__random_args {
    nb__view out;
    nb__random_dist dist;
    uint64_t seed, stream, offset;
    int per_block;
    double a, b;
    int64_t ilo;
    uint64_t range;
    double below_hi_d;
    float below_hi_f;
    uint16_t below_hi_h;
} nb__random_args;

/* randperm: out[0..n) (i64, contiguous) set to a permutation of 0..n-1 by the sequential
 * Fisher-Yates shuffle of tensor/random.c, from the stream at (seed, stream, offset); it
 * uses ceil((n - 1) / 2) blocks. */
typedef struct nb__randperm_args {
    int64_t *out;
    int64_t n;
    uint64_t seed, stream, offset;
} nb__randperm_args;

#define NB__K_RANDOM(X)                                                                    \
    X(random, nb__random_args, "Philox random values of one distribution into a tensor")   \
    X(randperm, nb__randperm_args, "random permutation of 0..n-1 (Fisher-Yates)")

#endif
