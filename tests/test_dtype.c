/* test_dtype.c - the "dtype" suite: dtype sizes, names and promotion; the IEEE half
 * conversions (f16, bf16) against hand-derived bit patterns, exhaustive round trips and
 * exhaustive rounding at every midpoint; the bulk converters against the scalar ones; and
 * nb_to_dtype between every pair of dtypes. */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* Check's ck_assert records every passing check (a write per call), far too slow for loops
 * over millions of elements; these only call into Check on failure. */
#define REQUIRE(cond, ...)                                                                 \
    do {                                                                                   \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);                                            \
    } while (0)
#define REQ(cond) REQUIRE(cond, "%s:%d: check failed: %s", __FILE__, __LINE__, #cond)

static const nb_dtype all_dts[] = {NB_F32, NB_F64, NB_F16, NB_BF16,
                                   NB_I32, NB_I64, NB_U8,  NB_BOOL};
#define N_DTS ((int)(sizeof all_dts / sizeof all_dts[0]))

static float f32_of(uint32_t bits) {
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint32_t bits_of(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}

static bool f16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
static bool bf16_is_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }

/* The value of an f16 bit pattern from its definition (independent of the library). */
static double f16_value(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

/* ---- dtype metadata --------------------------------------------------------------------- */
START_TEST(test_dtype_info) {
    static const size_t sizes[] = {4, 8, 2, 2, 4, 8, 1, 1};
    static const char *names[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8", "bool"};
    static const bool isf[] = {true, true, true, true, false, false, false, false};
    for (int i = 0; i < N_DTS; i++) {
        nb_dtype dt = all_dts[i];
        ck_assert_uint_eq(nb_dtype_size(dt), sizes[i]);
        ck_assert_str_eq(nb_dtype_name(dt), names[i]);
        REQ(nb_dtype_is_float(dt) == isf[i]);
    }
    ck_assert_uint_eq(nb_dtype_size(NB_DTYPE_COUNT), 0);
    ck_assert_uint_eq(nb_dtype_size((nb_dtype)-1), 0);
    ck_assert_str_eq(nb_dtype_name(NB_DTYPE_COUNT), "?");
    ck_assert_str_eq(nb_dtype_name((nb_dtype)-3), "?");
    REQ(!nb_dtype_is_float(NB_DTYPE_COUNT));
}
END_TEST

/* PyTorch's promotion: bool < u8 < i32 < i64 < floats; f16 + bf16 -> f32; int + float ->
 * that float; a wider float wins. */
START_TEST(test_dtype_promote) {
    enum { F32 = NB_F32, F64 = NB_F64, F16 = NB_F16, BF = NB_BF16, I32 = NB_I32, I64 = NB_I64,
           U8 = NB_U8, B = NB_BOOL };
    /* Rows and columns in the order of nb_dtype: f32 f64 f16 bf16 i32 i64 u8 bool. */
    static const int table[8][8] = {
        /* f32  */ {F32, F64, F32, F32, F32, F32, F32, F32},
        /* f64  */ {F64, F64, F64, F64, F64, F64, F64, F64},
        /* f16  */ {F32, F64, F16, F32, F16, F16, F16, F16},
        /* bf16 */ {F32, F64, F32, BF, BF, BF, BF, BF},
        /* i32  */ {F32, F64, F16, BF, I32, I64, I32, I32},
        /* i64  */ {F32, F64, F16, BF, I64, I64, I64, I64},
        /* u8   */ {F32, F64, F16, BF, I32, I64, U8, U8},
        /* bool */ {F32, F64, F16, BF, I32, I64, U8, B},
    };
    for (int a = 0; a < 8; a++)
        for (int b = 0; b < 8; b++)
            REQUIRE((int)nb_dtype_promote((nb_dtype)a, (nb_dtype)b) == table[a][b],
                          "promote(%s, %s) = %s, expected %s", nb_dtype_name((nb_dtype)a),
                          nb_dtype_name((nb_dtype)b),
                          nb_dtype_name(nb_dtype_promote((nb_dtype)a, (nb_dtype)b)),
                          nb_dtype_name((nb_dtype)table[a][b]));
}
END_TEST

/* ---- f16, hand-derived values ----------------------------------------------------------- */
START_TEST(test_f16_values) {
    static const struct {
        float f;
        uint16_t h;
    } to16[] = {
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {1.0f, 0x3c00},
        {-2.0f, 0xc000},
        {0.5f, 0x3800},
        {0.1f, 0x2e66},            /* 0.0999755859375 is nearer than 0.10003662109375 */
        {1.0f / 3.0f, 0x3555},     /* 0.333251953125 */
        {65504.0f, 0x7bff},        /* largest finite */
        {65519.0f, 0x7bff},        /* below the midpoint 65520: rounds down */
        {65520.0f, 0x7c00},        /* midpoint to "65536": ties to even = infinity */
        {-65520.0f, 0xfc00},
        {1e10f, 0x7c00},
        {FLT_MAX, 0x7c00},
        {INFINITY, 0x7c00},
        {-INFINITY, 0xfc00},
        {0x1p-14f, 0x0400},        /* smallest normal */
        {0x1p-24f, 0x0001},        /* smallest subnormal */
        {-0x1p-24f, 0x8001},
        {0x1p-25f, 0x0000},        /* half the smallest subnormal: tie to even (0) */
        {-0x1p-25f, 0x8000},       /* keeps the sign */
        {0x1.000002p-25f, 0x0001}, /* just above that tie */
        {0x3p-26f, 0x0001},        /* 0.75 units */
        {0x3p-25f, 0x0002},        /* 1.5 units: tie to even (2) */
        {0x5p-25f, 0x0002},        /* 2.5 units: tie to even (2) */
        {0x7p-25f, 0x0004},        /* 3.5 units: tie to even (4) */
        {1023 * 0x1p-24f, 0x03ff}, /* largest subnormal */
        {0x7ffp-25f, 0x0400},      /* 1023.5 units: tie rounds up to the smallest normal */
        {0x1p-30f, 0x0000},
        {FLT_MIN, 0x0000},
        {1.0f + 0x1p-11f, 0x3c00},              /* tie, even is 1.0 */
        {1.0f + 0x3p-11f, 0x3c02},              /* tie, even is 1 + 2^-9 */
        {1.0f + 0x1p-11f + 0x1p-20f, 0x3c01},   /* just above the tie */
        {1.0f + 0x1p-11f - 0x1p-23f, 0x3c00},   /* just below the tie */
        {2.0f - 0x1p-11f, 0x4000},              /* tie carries into the exponent */
        {2048.0f + 1.0f, 0x6800},               /* 2049: tie between 2048 and 2050 */
        {2048.0f + 3.0f, 0x6802},               /* 2051: tie, even is 2052 */
    };
    for (size_t i = 0; i < sizeof to16 / sizeof to16[0]; i++) {
        uint16_t h = nb_f32_to_f16(to16[i].f);
        REQUIRE(h == to16[i].h, "f32_to_f16(%a) = 0x%04x, expected 0x%04x",
                      (double)to16[i].f, h, to16[i].h);
    }
    static const struct {
        uint16_t h;
        float f;
    } to32[] = {
        {0x0000, 0.0f},         {0x3c00, 1.0f},         {0xc000, -2.0f},
        {0x0001, 0x1p-24f},     {0x03ff, 0x3ffp-24f},   {0x0400, 0x1p-14f},
        {0x7bff, 65504.0f},     {0x7c00, INFINITY},     {0xfc00, -INFINITY},
        {0x3555, 0.333251953125f}, {0x2e66, 0.0999755859375f}, {0x3bff, 0.99951171875f},
        {0x8001, -0x1p-24f},
    };
    for (size_t i = 0; i < sizeof to32 / sizeof to32[0]; i++) {
        float f = nb_f16_to_f32(to32[i].h);
        REQUIRE(bits_of(f) == bits_of(to32[i].f), "f16_to_f32(0x%04x) = %a, expected %a",
                      to32[i].h, (double)f, (double)to32[i].f);
    }
    /* -0 keeps its sign both ways. */
    REQ(signbit(nb_f16_to_f32(0x8000)) && nb_f16_to_f32(0x8000) == 0.0f);
    /* NaN stays NaN, quiet, with its sign; a signaling NaN must not become infinity. */
    static const uint32_t nans[] = {0x7fc00000, 0xffc00000, 0x7f800001, 0x7fa00000,
                                    0xff800001, 0x7fffffff};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t h = nb_f32_to_f16(f32_of(nans[i]));
        REQUIRE(f16_is_nan(h) && (h & 0x0200), "f32_to_f16(NaN 0x%08x) = 0x%04x", nans[i],
                      h);
        ck_assert_int_eq(h >> 15, nans[i] >> 31);
    }
    REQ(isnan(nb_f16_to_f32(0x7e00)));
    REQ(isnan(nb_f16_to_f32(0x7c01))); /* signaling f16 NaN */
    REQ(isnan(nb_f16_to_f32(0xfe00)) && signbit(nb_f16_to_f32(0xfe00)));
}
END_TEST

/* ---- bf16, hand-derived values ---------------------------------------------------------- */
START_TEST(test_bf16_values) {
    static const struct {
        uint32_t f;
        uint16_t h;
    } to16[] = {
        {0x00000000, 0x0000}, /* 0 */
        {0x80000000, 0x8000}, /* -0 */
        {0x3f800000, 0x3f80}, /* 1 */
        {0x3f808000, 0x3f80}, /* 1.00390625: tie, even is 1 */
        {0x3f818000, 0x3f82}, /* 1.01171875: tie, even is 1.015625 */
        {0x3f808001, 0x3f81}, /* just above the tie */
        {0x3f807fff, 0x3f80}, /* just below the tie */
        {0xbf818000, 0xbf82}, /* negative tie */
        {0x40490fdb, 0x4049}, /* pi -> 3.140625 */
        {0x3dcccccd, 0x3dcd}, /* 0.1 -> 0.10009765625 */
        {0x3f7fffff, 0x3f80}, /* rounds up across the exponent */
        {0x7f7f7fff, 0x7f7f}, /* rounds down to the largest finite */
        {0x7f7f8000, 0x7f80}, /* tie at the top: even is infinity */
        {0x7f7fffff, 0x7f80}, /* FLT_MAX overflows to infinity */
        {0xff7fffff, 0xff80},
        {0x7f800000, 0x7f80}, /* inf */
        {0xff800000, 0xff80}, /* -inf */
        {0x00010000, 0x0001}, /* subnormal */
        {0x00008000, 0x0000}, /* subnormal tie, even is 0 */
        {0x80008000, 0x8000}, /* keeps the sign */
        {0x00018000, 0x0002}, /* subnormal tie, even is 2 */
        {0x00008001, 0x0001},
        {0x007fffff, 0x0080}, /* largest subnormal rounds up to the smallest normal */
    };
    for (size_t i = 0; i < sizeof to16 / sizeof to16[0]; i++) {
        uint16_t h = nb_f32_to_bf16(f32_of(to16[i].f));
        REQUIRE(h == to16[i].h, "f32_to_bf16(0x%08x) = 0x%04x, expected 0x%04x",
                      to16[i].f, h, to16[i].h);
    }
    REQ(nb_f32_to_bf16(1.00390625f) == 0x3f80);
    REQ(nb_f32_to_bf16(1.01171875f) == 0x3f82);
    /* bf16 -> f32 is exact: the pattern in the upper half. */
    static const uint16_t ups[] = {0x0000, 0x8000, 0x3f80, 0x4049, 0x0001, 0x7f7f, 0xff80};
    for (size_t i = 0; i < sizeof ups / sizeof ups[0]; i++)
        ck_assert_uint_eq(bits_of(nb_bf16_to_f32(ups[i])), (uint32_t)ups[i] << 16);
    REQ(signbit(nb_bf16_to_f32(0x8000)));
    /* NaN stays NaN and quiet (truncating a signaling NaN would give infinity). */
    static const uint32_t nans[] = {0x7fc00000, 0xffc00000, 0x7f800001, 0x7f810000,
                                    0xff800001, 0x7fffffff};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t h = nb_f32_to_bf16(f32_of(nans[i]));
        REQUIRE(bf16_is_nan(h) && (h & 0x0040), "f32_to_bf16(NaN 0x%08x) = 0x%04x",
                      nans[i], h);
        ck_assert_int_eq(h >> 15, nans[i] >> 31);
    }
    REQ(isnan(nb_bf16_to_f32(0x7fc0)));
    REQ(isnan(nb_bf16_to_f32(0x7f81)));
}
END_TEST

/* ---- exhaustive checks over all 65536 patterns ------------------------------------------ */
START_TEST(test_f16_exhaustive) {
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = nb_f16_to_f32(h);
        double ref = f16_value(h);
        if (isnan(ref)) {
            REQUIRE(isnan(f), "f16_to_f32(0x%04x) is not NaN", h);
            REQ(!!signbit(f) == !!(h & 0x8000));
            uint16_t back = nb_f32_to_f16(f);
            /* NaN: the payload survives, possibly quieted. */
            REQUIRE(f16_is_nan(back) && (back | 0x0200) == (h | 0x0200),
                          "NaN 0x%04x came back as 0x%04x", h, back);
            continue;
        }
        REQUIRE((double)f == ref && !!signbit(f) == !!(h & 0x8000),
                      "f16_to_f32(0x%04x) = %a, expected %a", h, (double)f, ref);
        REQUIRE(nb_f32_to_f16(f) == h, "round trip of 0x%04x gives 0x%04x", h,
                      nb_f32_to_f16(f));
    }
    /* Rounding at every midpoint between neighbouring finite f16 values (exact in f32):
     * the midpoint itself goes to the even neighbour, one f32 ulp either side goes to the
     * nearer one. The midpoint above 65504 behaves as if 65536 existed (-> infinity). */
    for (uint32_t lo = 0; lo < 0x7c00; lo++) {
        for (int s = 0; s < 2; s++) {
            uint16_t sgn = s ? 0x8000 : 0;
            uint16_t a = (uint16_t)(lo | sgn), b = (uint16_t)((lo + 1) | sgn);
            double va = fabs(f16_value((uint16_t)lo));
            double vb = lo + 1 == 0x7c00 ? 65536.0 : fabs(f16_value((uint16_t)(lo + 1)));
            float mid = (float)((va + vb) / 2);
            REQ((double)mid == (va + vb) / 2);
            if (s) mid = -mid;
            uint16_t even = (lo & 1) ? b : a;
            REQUIRE(nb_f32_to_f16(mid) == even, "midpoint %a -> 0x%04x, expected 0x%04x",
                          (double)mid, nb_f32_to_f16(mid), even);
            float below = nextafterf(mid, 0.0f), above = nextafterf(mid, s ? -INFINITY : INFINITY);
            REQUIRE(nb_f32_to_f16(below) == a, "%a -> 0x%04x, expected 0x%04x",
                          (double)below, nb_f32_to_f16(below), a);
            REQUIRE(nb_f32_to_f16(above) == b, "%a -> 0x%04x, expected 0x%04x",
                          (double)above, nb_f32_to_f16(above), b);
        }
    }
}
END_TEST

START_TEST(test_bf16_exhaustive) {
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = nb_bf16_to_f32(h);
        ck_assert_uint_eq(bits_of(f), i << 16);
        uint16_t back = nb_f32_to_bf16(f);
        if (bf16_is_nan(h))
            REQUIRE(bf16_is_nan(back) && (back | 0x0040) == (h | 0x0040),
                          "NaN 0x%04x came back as 0x%04x", h, back);
        else
            REQUIRE(back == h, "round trip of 0x%04x gives 0x%04x", h, back);
    }
    /* Every midpoint (the f32 pattern lo << 16 | 0x8000) and its neighbours. */
    for (uint32_t lo = 0; lo < 0x7f80; lo++) {
        for (uint32_t s = 0; s < 2; s++) {
            uint32_t mid = (s << 31) | (lo << 16) | 0x8000;
            uint16_t a = (uint16_t)((s << 15) | lo), b = (uint16_t)(a + 1);
            uint16_t even = (lo & 1) ? b : a;
            REQUIRE(nb_f32_to_bf16(f32_of(mid)) == even, "midpoint 0x%08x", mid);
            REQUIRE(nb_f32_to_bf16(f32_of(mid - 1)) == a, "0x%08x", mid - 1);
            REQUIRE(nb_f32_to_bf16(f32_of(mid + 1)) == b, "0x%08x", mid + 1);
        }
    }
}
END_TEST

/* ---- bulk converters agree with the scalar ones ---------------------------------------- */
static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

START_TEST(test_bulk_matches_scalar) {
    const int64_t n = 100000;
    float *src = malloc(sizeof(float) * (size_t)n);
    uint16_t *h = malloc(sizeof(uint16_t) * (size_t)n), *b = malloc(sizeof(uint16_t) * (size_t)n);
    static const uint32_t specials[] = {
        0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001,
        0x7f7fffff, 0x00000001, 0x33000000, 0x33000001, 0x477ff000, 0x477fefff, 0x38800000,
        0x3f808000, 0x3f818000, 0x7f7f8000, 0x387fc000, 0x3f801000, 0x3f803000};
    int ns = (int)(sizeof specials / sizeof specials[0]);
    uint64_t st = 0x9e3779b97f4a7c15ULL;
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = rng_next(&st);
        if (i < ns) src[i] = f32_of(specials[i]);
        else if (i % 2) src[i] = f32_of((uint32_t)r); /* any pattern */
        else /* mostly inside the f16 range, including subnormals */
            src[i] = (r & 1 ? -1.0f : 1.0f) *
                     ldexpf(1.0f + (float)((r >> 8) & 0xffffff) / 16777216.0f,
                            (int)((r >> 40) % 44) - 28);
    }
    nb__f32_to_f16_n(src, h, n);
    nb__f32_to_bf16_n(src, b, n);
    for (int64_t i = 0; i < n; i++) {
        REQUIRE(h[i] == nb_f32_to_f16(src[i]), "f16 of 0x%08x: bulk 0x%04x, scalar 0x%04x",
                      bits_of(src[i]), h[i], nb_f32_to_f16(src[i]));
        REQUIRE(b[i] == nb_f32_to_bf16(src[i]),
                      "bf16 of 0x%08x: bulk 0x%04x, scalar 0x%04x", bits_of(src[i]), b[i],
                      nb_f32_to_bf16(src[i]));
    }
    /* The other direction over every pattern (NaNs compared as NaN: a vector unit may
     * quiet a signaling NaN). */
    uint16_t *all = malloc(sizeof(uint16_t) * 65536);
    float *out = malloc(sizeof(float) * 65536);
    for (uint32_t i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    nb__f16_to_f32_n(all, out, 65536);
    for (uint32_t i = 0; i < 65536; i++) {
        float s = nb_f16_to_f32(all[i]);
        REQUIRE(isnan(s) ? isnan(out[i]) : bits_of(s) == bits_of(out[i]), "f16 0x%04x", i);
    }
    nb__bf16_to_f32_n(all, out, 65536);
    for (uint32_t i = 0; i < 65536; i++) {
        float s = nb_bf16_to_f32(all[i]);
        REQUIRE(isnan(s) ? isnan(out[i]) : bits_of(s) == bits_of(out[i]), "bf16 0x%04x",
                      i);
    }
    /* Odd lengths and offsets (vector loops with tails). */
    for (int len = 0; len < 40; len++) {
        uint16_t t16[40];
        nb__f32_to_f16_n(src + 3 + len, t16, len);
        for (int i = 0; i < len; i++) REQ(t16[i] == nb_f32_to_f16(src[3 + len + i]));
    }
    free(all);
    free(out);
    free(src);
    free(h);
    free(b);
}
END_TEST

/* ---- nb_to_dtype between every pair ------------------------------------------------------- */
/* Values exactly representable in every float dtype, so a conversion's only rounding is
 * the float -> integer truncation. */
static const double table_vals[] = {0, 1, -1, 2.5, -2.5, 0.75, -0.75, 100, 127, -128, 3, 0.5,
                                    -0.5, 255};
#define N_VALS ((int)(sizeof table_vals / sizeof table_vals[0]))

/* The documented conversion of a double v into dt, as a double: floats keep the value
 * (exact here), integers truncate toward zero, u8 wraps modulo 256, bool is v != 0. */
static double ref_convert(double v, nb_dtype dt) {
    switch (dt) {
    case NB_I32:
    case NB_I64: return trunc(v);
    case NB_U8: {
        double t = fmod(trunc(v), 256.0);
        return t < 0 ? t + 256 : t;
    }
    case NB_BOOL: return v != 0;
    default: return v;
    }
}

/* Store v (already representable) into a typed buffer, independently of the library's
 * conversion paths except the scalar half conversions tested above. */
static void store_typed(void *buf, int64_t i, nb_dtype dt, double v) {
    switch (dt) {
    case NB_F32: ((float *)buf)[i] = (float)v; break;
    case NB_F64: ((double *)buf)[i] = v; break;
    case NB_F16: ((uint16_t *)buf)[i] = nb_f32_to_f16((float)v); break;
    case NB_BF16: ((uint16_t *)buf)[i] = nb_f32_to_bf16((float)v); break;
    case NB_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case NB_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case NB_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    default: ((bool *)buf)[i] = v != 0; break;
    }
}

static double load_typed(const void *buf, int64_t i, nb_dtype dt) {
    switch (dt) {
    case NB_F32: return ((const float *)buf)[i];
    case NB_F64: return ((const double *)buf)[i];
    case NB_F16: return f16_value(((const uint16_t *)buf)[i]);
    case NB_BF16: return nb_bf16_to_f32(((const uint16_t *)buf)[i]);
    case NB_I32: return ((const int32_t *)buf)[i];
    case NB_I64: return (double)((const int64_t *)buf)[i];
    case NB_U8: return ((const uint8_t *)buf)[i];
    default: {
        uint8_t byte = ((const uint8_t *)buf)[i];
        REQUIRE(byte <= 1, "bool byte %u", byte);
        return byte;
    }
    }
}

/* The bytes of t (contiguous) readable on the host: t's own on the CPU, a host copy of a
 * tensor on another device (nb_to_device gives t itself when it is on the CPU already). */
static void *host_bytes(nb_tensor *t) {
    nb_tensor *h = nb_to_device(t, NB_CPU);
    ck_assert_msg(h != NULL, "%s", nb_last_error());
    return nb_data(h);
}

START_TEST(test_to_dtype_pairs) {
    nb_scope_begin();
    for (int si = 0; si < N_DTS; si++) {
        nb_dtype src = all_dts[si];
        double sv[N_VALS];
        _Alignas(8) char buf[N_VALS * 8];
        for (int i = 0; i < N_VALS; i++) {
            sv[i] = ref_convert(table_vals[i], src);
            store_typed(buf, i, src, sv[i]);
        }
        /* As a (2, 7) tensor and, transposed, as a non-contiguous (7, 2) view. */
        nb_tensor *t = nb_from_buffer(buf, (int64_t[]){2, N_VALS / 2}, 2, src);
        ck_assert_ptr_nonnull(t);
        nb_tensor *tt = nb_transpose(t, 0, 1);
        for (int di = 0; di < N_DTS; di++) {
            nb_dtype dst = all_dts[di];
            nb_tensor *r = nb_to_dtype(t, dst), *rt = nb_to_dtype(tt, dst);
            REQUIRE(r && rt, "%s -> %s: %s", nb_dtype_name(src), nb_dtype_name(dst),
                          nb_last_error());
            ck_assert_int_eq(nb_tensor_dtype(r), dst);
            ck_assert_int_eq(nb_ndim(r), 2);
            ck_assert_int_eq(nb_shape(rt)[0], N_VALS / 2);
            for (int i = 0; i < N_VALS; i++) {
                double want = ref_convert(sv[i], dst);
                double got = load_typed(host_bytes(r), i, dst);
                REQUIRE(got == want, "%s -> %s of %g: %g, expected %g",
                              nb_dtype_name(src), nb_dtype_name(dst), sv[i], got, want);
            }
            /* Transposed: logical element (j, i) is source element (i, j). */
            nb_tensor *rc = nb_contiguous(rt);
            for (int j = 0; j < N_VALS / 2; j++)
                for (int i = 0; i < 2; i++) {
                    double want = ref_convert(sv[i * (N_VALS / 2) + j], dst);
                    double got = load_typed(host_bytes(rc), j * 2 + i, dst);
                    REQUIRE(got == want, "transposed %s -> %s", nb_dtype_name(src),
                                  nb_dtype_name(dst));
                }
        }
    }
    nb_scope_end();
}
END_TEST

/* Truncation toward zero, bool semantics and specials through tensors. */
START_TEST(test_to_dtype_specials) {
    nb_scope_begin();
    const double fv[] = {2.9, -2.9, 0.999, -0.999, 1e-30, -0.0, 1e6, INFINITY, -INFINITY, NAN};
    const int n = (int)(sizeof fv / sizeof fv[0]);
    nb_tensor *t = nb_from_buffer(fv, (int64_t[]){n}, 1, NB_F64);
    /* Float -> integer: toward zero (finite, in-range values only). */
    const int64_t want_int[] = {2, -2, 0, 0, 0, 0, 1000000};
    nb_tensor *i32 = nb_to_dtype(nb_narrow(t, 0, 0, 7), NB_I32);
    nb_tensor *i64 = nb_to_dtype(nb_narrow(t, 0, 0, 7), NB_I64);
    for (int i = 0; i < 7; i++) {
        ck_assert_int_eq(((int32_t *)host_bytes(i32))[i], want_int[i]);
        ck_assert_int_eq(((int64_t *)host_bytes(i64))[i], want_int[i]);
    }
    /* Bool is value != 0: tiny values, infinities and NaN are true, -0 is false. */
    nb_tensor *bo = nb_to_dtype(t, NB_BOOL);
    const uint8_t want_b[] = {1, 1, 1, 1, 1, 0, 1, 1, 1, 1};
    for (int i = 0; i < n; i++) ck_assert_uint_eq(((uint8_t *)host_bytes(bo))[i], want_b[i]);
    /* Float -> float: overflow to infinity, underflow to (signed) zero, NaN stays NaN. */
    nb_tensor *h = nb_to_dtype(t, NB_F16);
    const uint16_t *hp = host_bytes(h);
    ck_assert_uint_eq(hp[4], 0x0000);  /* 1e-30 */
    ck_assert_uint_eq(hp[5], 0x8000);  /* -0 */
    ck_assert_uint_eq(hp[6], 0x7c00);  /* 1e6 */
    ck_assert_uint_eq(hp[7], 0x7c00);
    ck_assert_uint_eq(hp[8], 0xfc00);
    REQ(f16_is_nan(hp[9]));
    ck_assert_uint_eq(hp[0], nb_f32_to_f16(2.9f));
    nb_tensor *bf = nb_to_dtype(t, NB_BF16);
    const uint16_t *bp = host_bytes(bf);
    ck_assert_uint_eq(bp[6], nb_f32_to_bf16(1e6f));
    ck_assert_uint_eq(bp[5], 0x8000);
    REQ(bf16_is_nan(bp[9]));
    nb_tensor *f = nb_to_dtype(nb_from_buffer((double[]){1e300, -1e300, 1e-300}, (int64_t[]){3},
                                              1, NB_F64),
                               NB_F32);
    REQ(isinf(((float *)host_bytes(f))[0]) && ((float *)host_bytes(f))[0] > 0);
    REQ(isinf(((float *)host_bytes(f))[1]) && ((float *)host_bytes(f))[1] < 0);
    REQ(((float *)host_bytes(f))[2] == 0.0f);
    /* f32 -> f16 -> f32 through tensors equals the scalar conversions (the hot path). */
    nb_tensor *x = nb_from_buffer((float[]){0.1f, 65519.0f, 65520.0f, 0x3p-26f, 1.0f + 0x1p-11f},
                                  (int64_t[]){5}, 1, NB_F32);
    nb_tensor *x16 = nb_to_dtype(x, NB_F16);
    const uint16_t want16[] = {0x2e66, 0x7bff, 0x7c00, 0x0001, 0x3c00};
    for (int i = 0; i < 5; i++) ck_assert_uint_eq(((uint16_t *)host_bytes(x16))[i], want16[i]);
    nb_tensor *xb = nb_to_dtype(nb_from_buffer((float[]){1.00390625f, 1.01171875f},
                                               (int64_t[]){2}, 1, NB_F32),
                                NB_BF16);
    ck_assert_uint_eq(((uint16_t *)host_bytes(xb))[0], 0x3f80);
    ck_assert_uint_eq(((uint16_t *)host_bytes(xb))[1], 0x3f82);
    /* Integers: wide to narrow wraps like C (two's complement), int -> bool is != 0. */
    nb_tensor *big = nb_from_buffer((int64_t[]){INT64_C(4294967297), -1, 256, 0, 300},
                                    (int64_t[]){5}, 1, NB_I64);
    nb_tensor *b32 = nb_to_dtype(big, NB_I32), *b8 = nb_to_dtype(big, NB_U8);
    nb_tensor *bb = nb_to_dtype(big, NB_BOOL);
    const int32_t w32[] = {1, -1, 256, 0, 300};
    const uint8_t w8[] = {1, 255, 0, 0, 44}, wb[] = {1, 1, 1, 0, 1};
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(((int32_t *)host_bytes(b32))[i], w32[i]);
        ck_assert_uint_eq(((uint8_t *)host_bytes(b8))[i], w8[i]);
        ck_assert_uint_eq(((uint8_t *)host_bytes(bb))[i], wb[i]);
    }
    /* Large integers survive i64 -> f64 -> i64 when exactly representable. */
    int64_t p53 = INT64_C(1) << 53;
    nb_tensor *l = nb_from_buffer((int64_t[]){p53, -p53, 123456789012345}, (int64_t[]){3}, 1,
                                  NB_I64);
    nb_tensor *l2 = nb_to_dtype(nb_to_dtype(l, NB_F64), NB_I64);
    REQ(memcmp(host_bytes(l), host_bytes(l2), 3 * sizeof(int64_t)) == 0);
    /* Same dtype gives the same values; empty and 0-dim tensors convert too. */
    nb_tensor *same = nb_to_dtype(t, NB_F64);
    REQ(nb_shares_storage(same, t) || memcmp(host_bytes(same), host_bytes(t), sizeof fv) == 0);
    nb_tensor *e = nb_to_dtype(nb_zeros((int64_t[]){0, 3}, 2, NB_F32), NB_BF16);
    ck_assert_int_eq(nb_numel(e), 0);
    ck_assert_int_eq(nb_tensor_dtype(e), NB_BF16);
    nb_tensor *s = nb_to_dtype(nb_scalar(-7.75, NB_F32), NB_I32);
    ck_assert_int_eq(nb_ndim(s), 0);
    ck_assert_int_eq(nb_item_i64(s), -7);
    /* Errors: invalid dtype, NULL input. */
    tu_assert_error(nb_to_dtype(t, NB_DTYPE_COUNT), NB_EDTYPE, "to_dtype");
    tu_assert_error(nb_to_dtype(t, (nb_dtype)-1), NB_EDTYPE, "to_dtype");
    tu_assert_error(nb_to_dtype(NULL, NB_F32), NB_ENULL, NULL);
    nb_scope_end();
}
END_TEST

Suite *nb_suite_dtype(void) {
    Suite *s = suite_create("dtype");
    struct {
        const char *name;
        const TTest *test;
    } cases[] = {
        {"dtype_info", test_dtype_info},
        {"dtype_promote", test_dtype_promote},
        {"f16_values", test_f16_values},
        {"bf16_values", test_bf16_values},
        {"f16_exhaustive", test_f16_exhaustive},
        {"bf16_exhaustive", test_bf16_exhaustive},
        {"bulk_matches_scalar", test_bulk_matches_scalar},
        {"to_dtype_pairs", test_to_dtype_pairs},
        {"to_dtype_specials", test_to_dtype_specials},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}
