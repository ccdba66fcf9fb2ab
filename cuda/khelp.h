/* cuda/khelp.h - private: the index and number helpers both sides of the CUDA backend need,
 * written once as __host__ __device__ functions in the subset of C that is also C++, so
 * that:
 *   - the .cu kernels call them on the GPU;
 *   - tests/test_cuda_host.c (gcc, C17) and tests/cuda_host/ (nvcc's host compiler) check
 *     them on a machine without a GPU, against the CPU backend's own functions.
 * No CUDA header is needed to include it. Every function is pure and branch-light.
 *
 *   nb__kh_offset(it, arg, i)   byte offset of element i (row-major over it->shape) of
 *                               operand arg of an nb__iter: decodes i into indices once
 *                               and sums the operand's strides
 *   nb__kh_offsets2(...)        the same for two operands at once
 *   nb__kh_bf16_from_f32 / nb__kh_f32_from_bf16 / nb__kh_f16_from_f32 / nb__kh_f32_from_f16
 *                               the CPU's exact rounding (nearest even, quiet NaN)
 *   nb__kh_dtype_size(dt)       bytes per element (tensor/dtype.c's nb_dtype_size; 0 if invalid)
 *   nb__kh_blocks(n, per_block, max_blocks)
 *                               grid size for n items, capped (grid-stride loops cover the rest) */
#ifndef NABLA_CUDA_KHELP_H
#define NABLA_CUDA_KHELP_H

#include <stdint.h>
#include <string.h>

#include "tensor/kernels.h"

#if defined(__CUDACC__)
#define NB_HD static inline __host__ __device__
#else
#define NB_HD static inline
#endif

/* ---- iterator offsets --------------------------------------------------------------------- */
NB_HD int64_t nb__kh_offset(const nb__iter *it, int arg, int64_t i) {
    int64_t off = 0;
    for (int d = it->ndim - 1; d >= 0; d--) {
        int64_t n = it->shape[d];
        int64_t q = n > 1 ? i / n : i;
        off += (i - q * n) * it->strides[arg][d];
        i = q;
    }
    return off;
}

NB_HD void nb__kh_offsets2(const nb__iter *it, int a0, int a1, int64_t i, int64_t *o0,
                           int64_t *o1) {
    int64_t r0 = 0, r1 = 0;
    for (int d = it->ndim - 1; d >= 0; d--) {
        int64_t n = it->shape[d];
        int64_t q = n > 1 ? i / n : i;
        int64_t idx = i - q * n;
        r0 += idx * it->strides[a0][d];
        r1 += idx * it->strides[a1][d];
        i = q;
    }
    *o0 = r0;
    *o1 = r1;
}

/* ---- bit casts ---------------------------------------------------------------------------- */
NB_HD uint32_t nb__kh_f32_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    return x;
}
NB_HD float nb__kh_bits_f32(uint32_t x) {
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* ---- bf16 and f16: the CPU's rounding (tensor/dtype.c), bit for bit ----------------------- */
NB_HD uint16_t nb__kh_bf16_from_f32(float f) {
    uint32_t x = nb__kh_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u); /* round to nearest even; overflow goes to inf */
    return (uint16_t)(x >> 16);
}
NB_HD float nb__kh_f32_from_bf16(uint16_t h) { return nb__kh_bits_f32((uint32_t)h << 16); }

NB_HD uint16_t nb__kh_f16_from_f32(float f) {
    uint32_t x = nb__kh_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {
        if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
        return (uint16_t)(sign | 0x7c00u);
    }
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) {
        if (ax < 0x33000000u) return (uint16_t)sign;
        uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = (ax >> 13) - (112u << 10), rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}
NB_HD float nb__kh_f32_from_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0) {
        x = nb__kh_f32_bits((float)m * 5.9604644775390625e-8f) | sign; /* m * 2^-24 */
    } else if (e == 31) {
        x = sign | 0x7f800000u | (m << 13);
    } else {
        x = sign | ((e + 112u) << 23) | (m << 13);
    }
    return nb__kh_bits_f32(x);
}

/* ---- element sizes ------------------------------------------------------------------------ */
NB_HD int nb__kh_dtype_size(nb_dtype dt) {
    switch (dt) {
    case NB_F64: case NB_I64: return 8;
    case NB_F32: case NB_I32: return 4;
    case NB_F16: case NB_BF16: return 2;
    case NB_U8: case NB_BOOL: return 1;
    default: return 0;
    }
}

/* ---- launch geometry ---------------------------------------------------------------------- */
/* Blocks for n items at per_block items a block, at least 1 and at most max_blocks. */
NB_HD unsigned nb__kh_blocks(int64_t n, int64_t per_block, int64_t max_blocks) {
    int64_t b = n > 0 ? (n + per_block - 1) / per_block : 1;
    if (b < 1) b = 1;
    return (unsigned)(b < max_blocks ? b : max_blocks);
}

#endif
