/* dtype.c - element types: sizes, names, promotion, IEEE half conversions, and the slow
 * general scalar load/store used by strided fallbacks and printing. */
#include <math.h>
#include <string.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

#include "tensor/tensor_impl.h"

size_t nb_dtype_size(nb_dtype dt) {
    switch (dt) {
    case NB_F64: case NB_I64: return 8;
    case NB_F32: case NB_I32: return 4;
    case NB_F16: case NB_BF16: return 2;
    case NB_U8: case NB_BOOL: return 1;
    default: return 0;
    }
}

const char *nb_dtype_name(nb_dtype dt) {
    static const char *const names[NB_DTYPE_COUNT] = {"f32", "f64", "f16", "bf16",
                                                      "i32", "i64", "u8",  "bool"};
    return (unsigned)dt < NB_DTYPE_COUNT ? names[dt] : "?";
}

bool nb_dtype_is_float(nb_dtype dt) {
    return dt == NB_F32 || dt == NB_F64 || dt == NB_F16 || dt == NB_BF16;
}

/* Rank in the promotion lattice: bool < u8 < i32 < i64 < {f16, bf16} < f32 < f64. */
static int promo_rank(nb_dtype dt) {
    switch (dt) {
    case NB_BOOL: return 0;
    case NB_U8: return 1;
    case NB_I32: return 2;
    case NB_I64: return 3;
    case NB_F16: case NB_BF16: return 4;
    case NB_F32: return 5;
    case NB_F64: return 6;
    default: return -1;
    }
}

nb_dtype nb_dtype_promote(nb_dtype a, nb_dtype b) {
    if (a == b) return a;
    if ((a == NB_F16 && b == NB_BF16) || (a == NB_BF16 && b == NB_F16)) return NB_F32;
    return promo_rank(a) >= promo_rank(b) ? a : b;
}

uint16_t nb_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) { /* inf or NaN; NaN stays a quiet NaN */
        if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
        return (uint16_t)(sign | 0x7c00u);
    }
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520: rounds to inf */
    if (ax < 0x38800000u) {                                   /* below 2^-14: subnormal */
        if (ax < 0x33000000u) return (uint16_t)sign;          /* below 2^-25: zero */
        uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24: result in units of 2^-24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = (ax >> 13) - (112u << 10), rem = ax & 0x1fffu; /* rebias 127 -> 15 */
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;   /* carry may bump the exponent */
    return (uint16_t)(sign | r);
}

float nb_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    float f;
    if (e == 0) {
        f = (float)m * 0x1p-24f;
        memcpy(&x, &f, 4);
        x |= sign;
    } else if (e == 31) {
        x = sign | 0x7f800000u | (m << 13);
    } else {
        x = sign | ((e + 112u) << 23) | (m << 13);
    }
    memcpy(&f, &x, 4);
    return f;
}

uint16_t nb_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u); /* round to nearest even; overflow goes to inf */
    return (uint16_t)(x >> 16);
}

float nb_bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* Bulk conversions: F16C does f16 <-> f32 eight at a time (with round to nearest even)
 * where the CPU has it; bf16 is integer arithmetic the compiler vectorizes. */
static inline float bf16_to_f32_inl(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static inline uint16_t f32_to_bf16_inl(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t nan = (x >> 16) | 0x40u;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

void nb__f16_to_f32_n(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
#ifdef __F16C__
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
    for (; i < n; i++) dst[i] = nb_f16_to_f32(src[i]);
}
void nb__f32_to_f16_n(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
#ifdef __F16C__
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) dst[i] = nb_f32_to_f16(src[i]);
}
void nb__bf16_to_f32_n(const uint16_t *restrict src, float *restrict dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32_inl(src[i]);
}
void nb__f32_to_bf16_n(const float *restrict src, uint16_t *restrict dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = f32_to_bf16_inl(src[i]);
}

double nb__load_f64(const void *p, nb_dtype dt) {
    switch (dt) {
    case NB_F32: return *(const float *)p;
    case NB_F64: return *(const double *)p;
    case NB_F16: return nb_f16_to_f32(*(const uint16_t *)p);
    case NB_BF16: return nb_bf16_to_f32(*(const uint16_t *)p);
    case NB_I32: return *(const int32_t *)p;
    case NB_I64: return (double)*(const int64_t *)p;
    case NB_U8: return *(const uint8_t *)p;
    case NB_BOOL: return *(const uint8_t *)p ? 1.0 : 0.0;
    default: NB__ASSERT(!"invalid dtype");
    }
}

/* Float to integer: truncate toward zero (C and PyTorch); NaN gives 0 and values outside
 * int64 saturate, so no conversion is undefined behaviour. Narrower types wrap. */
static int64_t to_i64(double v) {
    if (isnan(v)) return 0;
    if (v >= 9223372036854775807.0) return INT64_MAX;
    if (v <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v;
}

void nb__store_f64(void *p, nb_dtype dt, double v) {
    switch (dt) {
    case NB_F32: *(float *)p = (float)v; break;
    case NB_F64: *(double *)p = v; break;
    case NB_F16: *(uint16_t *)p = nb_f32_to_f16((float)v); break;
    case NB_BF16: *(uint16_t *)p = nb_f32_to_bf16((float)v); break;
    case NB_I32: *(int32_t *)p = (int32_t)(uint32_t)(uint64_t)to_i64(v); break;
    case NB_I64: *(int64_t *)p = to_i64(v); break;
    case NB_U8: *(uint8_t *)p = (uint8_t)(uint64_t)to_i64(v); break;
    case NB_BOOL: *(uint8_t *)p = v != 0.0; break;
    default: NB__ASSERT(!"invalid dtype");
    }
}
