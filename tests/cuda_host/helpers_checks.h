/* tests/cuda_host/helpers_checks.h - the checks of cuda/khelp.h, in the subset of C that is
 * also C++: tests/cuda_host/helpers.cu runs them on nvcc's host build of the header,
 * tests/test_cuda_host.c on gcc's. The references are libnabla's CPU conversions and a
 * naive offset loop. */
#include <stdint.h>
#include <string.h>

#include "cuda/khelp.h"
#include "cuhost.h"
#include "nabla/tensor.h"

static inline uint32_t lcg(uint32_t *s) { return *s = *s * 1664525u + 1013904223u; }

static void helpers_checks(cuhost *t) {
    // every f16 and bf16 value widens like the CPU, and every one of a sweep of f32
    // values (all exponents, random mantissas, the rounding ties) narrows like it
    long bad_w16 = 0, bad_wb = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float a = nb__kh_f32_from_f16((uint16_t)h), b = nb_f16_to_f32((uint16_t)h);
        if (memcmp(&a, &b, 4) != 0) bad_w16++;
        a = nb__kh_f32_from_bf16((uint16_t)h), b = nb_bf16_to_f32((uint16_t)h);
        if (memcmp(&a, &b, 4) != 0) bad_wb++;
    }
    CUHOST_CHECK(t, bad_w16 == 0, "%ld f16 values widen differently", bad_w16);
    CUHOST_CHECK(t, bad_wb == 0, "%ld bf16 values widen differently", bad_wb);
    long bad_n16 = 0, bad_nb = 0;
    uint32_t s = 12345;
    static const uint32_t ties[8] = {0, 1, 0x1000, 0x2000, 0x7fff, 0x8000, 0x18000, 0x7fffff};
    for (uint32_t e = 0; e < 256; e++)
        for (int k = 0; k < 2048; k++) {
            uint32_t m = k < 8 ? ties[k]
                               : (lcg(&s) & 0x7fffffu);
            uint32_t x = (lcg(&s) & 0x80000000u) | (e << 23) | m;
            float f;
            memcpy(&f, &x, 4);
            if (nb__kh_f16_from_f32(f) != nb_f32_to_f16(f)) bad_n16++;
            if (nb__kh_bf16_from_f32(f) != nb_f32_to_bf16(f)) bad_nb++;
        }
    CUHOST_CHECK(t, bad_n16 == 0, "%ld f32 values narrow to f16 differently", bad_n16);
    CUHOST_CHECK(t, bad_nb == 0, "%ld f32 values narrow to bf16 differently", bad_nb);

    // offsets: a (3, 1, 4, 5) iterator with a broadcast operand and a transposed one
    nb__iter it;
    memset(&it, 0, sizeof it);
    it.nargs = 2;
    it.ndim = 4;
    int64_t shape[4] = {3, 1, 4, 5};
    int64_t st0[4] = {80, 80, 20, 4}, st1[4] = {0, 0, 4, 16}; // operand 1: (5, 4)^T, broadcast
    memcpy(it.shape, shape, sizeof shape);
    memcpy(it.strides[0], st0, sizeof st0);
    memcpy(it.strides[1], st1, sizeof st1);
    it.numel = 60;
    long bad_off = 0;
    for (int64_t i = 0; i < 60; i++) {
        int64_t i0 = i / 20, i2 = i / 5 % 4, i3 = i % 5;
        int64_t want0 = i0 * 80 + i2 * 20 + i3 * 4, want1 = i2 * 4 + i3 * 16;
        int64_t o0, o1;
        nb__kh_offsets2(&it, 0, 1, i, &o0, &o1);
        if (nb__kh_offset(&it, 0, i) != want0 || nb__kh_offset(&it, 1, i) != want1 ||
            o0 != want0 || o1 != want1)
            bad_off++;
    }
    CUHOST_CHECK(t, bad_off == 0, "%ld offsets differ from the naive loop", bad_off);

    // element sizes: tensor/dtype.c's, for every dtype and an invalid one
    long bad_size = 0;
    for (int d = 0; d <= NB_DTYPE_COUNT; d++)
        if ((size_t)nb__kh_dtype_size((nb_dtype)d) != nb_dtype_size((nb_dtype)d)) bad_size++;
    CUHOST_CHECK(t, bad_size == 0, "%ld dtypes differ in element size", bad_size);

    // grid sizing
    CUHOST_CHECK(t, nb__kh_blocks(0, 256, 100) == 1, "0 items");
    CUHOST_CHECK(t, nb__kh_blocks(257, 256, 100) == 2, "257 items");
    CUHOST_CHECK(t, nb__kh_blocks((int64_t)1 << 40, 256, 100) == 100, "capped");
}
