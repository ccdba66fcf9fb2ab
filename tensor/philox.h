/* tensor/philox.h - private: the Philox 4x32-10 block function (Salmon et al., SC'11), the
 * one definition the core (nb_philox4x32, tensor/random.c) and the random kernels (cpu/ and
 * cuda/) share, so every device draws the same bits. Plain C, also valid C++/CUDA. */
#ifndef NABLA_TENSOR_PHILOX_H
#define NABLA_TENSOR_PHILOX_H

#include <stdint.h>

#if defined(__CUDACC__)
#define NB__PHILOX_FN static inline __host__ __device__
#else
#define NB__PHILOX_FN static inline
#endif

/* The 10 rounds on counter (c0..c3) with key (k0, k1), the key bumped between rounds. */
NB__PHILOX_FN void nb__philox_block(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                    uint32_t k0, uint32_t k1, uint32_t out[4]) {
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u; /* golden ratio */
            k1 += 0xBB67AE85u; /* sqrt(3) - 1 */
        }
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

#endif
