/* test_random.c - the "random" suite: Philox 4x32-10 known-answer vectors, the documented
 * mapping of (seed, stream, offset) to tensor elements, determinism across thread counts,
 * stream position save/restore, statistics of every distribution, dtypes and errors; the
 * random kernels on the guard and meta devices (the same streams bit for bit, the same
 * generator advance), the in-place fills and the nn initializers on every device. */
#include <stdlib.h>
#include <string.h>

#include "nabla/random.h"
#include "testutil.h"

#define GUARD ((nb_device){NB_DEVICE_GUARD, 0})

/* Check's ck_assert records every passing check (a write per call), far too slow for loops
 * over millions of elements; these only call into Check on failure. */
#define REQUIRE(cond, ...)                                                                 \
    do {                                                                                   \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);                                            \
    } while (0)
#define REQ(cond) REQUIRE(cond, "%s:%d: check failed: %s", __FILE__, __LINE__, #cond)

/* ---- helpers ------------------------------------------------------------------------------ */
/* Block b of a generator state, built from the documented counter/key mapping. */
static void ref_block(uint64_t seed, uint64_t stream, uint64_t blk, uint32_t w[4]) {
    uint32_t c[4] = {(uint32_t)blk, (uint32_t)(blk >> 32), (uint32_t)stream,
                     (uint32_t)(stream >> 32)};
    uint32_t k[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    nb_philox4x32(c, k, w);
}

/* t itself on the CPU, else a copy there: the host reads the draws of every device (the
 * default one included) through this, never through device memory. */
static nb_tensor *host(nb_tensor *t) {
    nb_tensor *h = nb_to_device(t, NB_CPU);
    ck_assert_msg(h != NULL, "host copy: %s", nb_last_error());
    return h;
}

/* Element i of t, a CPU tensor (see host). */
static double elem(const nb_tensor *t, int64_t i) {
    return nb__load_f64(nb__ptr(t) + i * (int64_t)nb_dtype_size(nb_tensor_dtype(t)),
                        nb_tensor_dtype(t));
}

/* Mean and (population) variance of all elements of t, a CPU tensor, in double. */
static void moments(const nb_tensor *t, double *mean, double *var) {
    int64_t n = nb_numel(t);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) s += elem(t, i);
    double m = s / (double)n;
    for (int64_t i = 0; i < n; i++) {
        double d = elem(t, i) - m;
        s2 += d * d;
    }
    *mean = m;
    *var = s2 / (double)n;
}

static bool same_bytes(nb_tensor *a, nb_tensor *b) {
    if (!a || !b || nb_numel(a) != nb_numel(b) || nb_tensor_dtype(a) != nb_tensor_dtype(b))
        return false;
    return memcmp(nb_data(host(a)), nb_data(host(b)),
                  (size_t)nb_numel(a) * nb_dtype_size(nb_tensor_dtype(a))) == 0;
}

static const nb_dtype float_dts[] = {NB_F32, NB_F64, NB_F16, NB_BF16};
static const nb_dtype all_dts[] = {NB_F32, NB_F64, NB_F16, NB_BF16,
                                   NB_I32, NB_I64, NB_U8,  NB_BOOL};

/* ---- Philox known answers (Random123 kat_vectors, philox4x32_10) --------------------------- */
START_TEST(test_philox_kat) {
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        uint32_t out[4];
        nb_philox4x32(kat[i].ctr, kat[i].key, out);
        for (int k = 0; k < 4; k++)
            REQUIRE(out[k] == kat[i].out[k], "kat %zu word %d: %08x, expected %08x", i,
                          k, out[k], kat[i].out[k]);
    }
}
END_TEST

/* ---- generator objects ------------------------------------------------------------------ */
START_TEST(test_generator_state) {
    nb_scope_begin();
    nb_generator *g = nb_generator_new(0x123456789abcdefULL);
    ck_assert_ptr_nonnull(g);
    ck_assert_uint_eq(nb_generator_seed(g), 0x123456789abcdefULL);
    ck_assert_uint_eq(nb_generator_stream(g), 0);
    ck_assert_uint_eq(nb_generator_offset(g), 0);
    ck_assert_int_eq(nb_generator_set_offset(g, 77), NB_OK);
    ck_assert_uint_eq(nb_generator_offset(g), 77);
    /* A new stream starts at its beginning. */
    ck_assert_int_eq(nb_generator_set_stream(g, 5), NB_OK);
    ck_assert_uint_eq(nb_generator_stream(g), 5);
    ck_assert_uint_eq(nb_generator_offset(g), 0);
    /* 10 f32 values use 3 blocks; 10 f64 values use 5. */
    ck_assert_ptr_nonnull(nb_rand((int64_t[]){10}, 1, NB_F32, g));
    ck_assert_uint_eq(nb_generator_offset(g), 3);
    ck_assert_ptr_nonnull(nb_rand((int64_t[]){2, 5}, 2, NB_F64, g));
    ck_assert_uint_eq(nb_generator_offset(g), 8);
    ck_assert_ptr_nonnull(nb_randn((int64_t[]){0, 3}, 2, NB_F32, g)); /* empty: no blocks */
    ck_assert_uint_eq(nb_generator_offset(g), 8);
    ck_assert_ptr_nonnull(nb_randn(NULL, 0, NB_F32, g)); /* 0-dim: one element */
    ck_assert_uint_eq(nb_generator_offset(g), 9);
    nb_generator_free(g);
    nb_generator_free(NULL);

    /* The default generator: seed 0 until nb_manual_seed, NULL means it everywhere, and
     * freeing it is a no-op. */
    nb_generator *d = nb_default_generator();
    ck_assert_ptr_nonnull(d);
    ck_assert_ptr_eq(d, nb_default_generator());
    nb_manual_seed(42);
    ck_assert_uint_eq(nb_generator_seed(d), 42);
    ck_assert_uint_eq(nb_generator_seed(NULL), 42);
    ck_assert_uint_eq(nb_generator_offset(NULL), 0);
    ck_assert_ptr_nonnull(nb_rand((int64_t[]){4}, 1, NB_F32, NULL));
    ck_assert_uint_eq(nb_generator_offset(d), 1);
    ck_assert_int_eq(nb_generator_set_offset(NULL, 9), NB_OK);
    ck_assert_uint_eq(nb_generator_offset(d), 9);
    nb_generator_free(d);
    ck_assert_uint_eq(nb_generator_seed(nb_default_generator()), 42);
    nb_manual_seed(0);
    ck_assert_uint_eq(nb_generator_offset(d), 0);
    ck_assert_uint_eq(nb_generator_stream(d), 0);
    nb_scope_end();
}
END_TEST

/* The default generator is per thread and starts at seed 0 in a fresh thread. */
#include <pthread.h>
static void *thread_draw(void *arg) {
    nb_scope_begin();
    nb_tensor *t = nb_rand((int64_t[]){16}, 1, NB_F32, NULL);
    /* no Check calls off the test's thread: a failed read leaves bytes no draw matches */
    if (nb_read(t, arg, 16, NB_F32) != NB_OK) memset(arg, 0xff, 16 * sizeof(float));
    nb_scope_end();
    return NULL;
}

START_TEST(test_default_per_thread) {
    nb_scope_begin();
    nb_manual_seed(0);
    nb_tensor *a = nb_rand((int64_t[]){16}, 1, NB_F32, NULL);
    nb_manual_seed(999); /* must not affect the other thread */
    float other[16];
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, thread_draw, other), 0);
    pthread_join(th, NULL);
    REQ(memcmp(other, nb_data(host(a)), sizeof other) == 0);
    ck_assert_uint_eq(nb_generator_seed(NULL), 999);
    nb_manual_seed(0);
    nb_scope_end();
}
END_TEST

/* ---- the documented element layout ---------------------------------------------------------- */
START_TEST(test_layout) {
    nb_scope_begin();
    const uint64_t seed = 0xfeedfacecafebeefULL, stream = 0x100000003ULL;
    const uint64_t off0 = 0xffffffffULL - 1; /* crosses the 32-bit word boundary */
    nb_generator *g = nb_generator_new(seed);
    nb_generator_set_stream(g, stream);
    const int64_t n = 2503; /* several chunks of work and a partial block */
    const uint64_t q4 = (n + 3) / 4, q2 = (n + 1) / 2;
    uint32_t w[4];

    /* rand f32: element i is word i % 4 of block i / 4, top 24 bits. */
    nb_generator_set_offset(g, off0);
    nb_tensor *u = host(nb_rand((int64_t[]){n}, 1, NB_F32, g));
    ck_assert_uint_eq(nb_generator_offset(g), off0 + q4);
    for (int64_t i = 0; i < n; i++) {
        ref_block(seed, stream, off0 + (uint64_t)i / 4, w);
        float r = (float)((double)(w[i % 4] >> 8) / 16777216.0);
        REQUIRE(((float *)nb_data(u))[i] == r, "rand f32 element %lld", (long long)i);
    }
    /* rand f16 / bf16: the same 24-bit uniform rounded to the half type, 1.0 clamped to the
     * largest value below 1. */
    for (int hb = 0; hb < 2; hb++) {
        nb_generator_set_offset(g, off0);
        nb_tensor *hu = host(nb_rand((int64_t[]){n}, 1, hb ? NB_BF16 : NB_F16, g));
        ck_assert_uint_eq(nb_generator_offset(g), off0 + q4);
        for (int64_t i = 0; i < n; i++) {
            ref_block(seed, stream, off0 + (uint64_t)i / 4, w);
            float r = (float)((double)(w[i % 4] >> 8) / 16777216.0);
            uint16_t h = hb ? nb_f32_to_bf16(r) : nb_f32_to_f16(r);
            if (h == (hb ? 0x3f80 : 0x3c00)) h = hb ? 0x3f7f : 0x3bff;
            REQUIRE(((uint16_t *)nb_data(hu))[i] == h, "rand %s element %lld",
                    hb ? "bf16" : "f16", (long long)i);
        }
    }
    /* uniform f32 [lo, hi): lo + (hi - lo) * u in double, rounded once. */
    nb_generator_set_offset(g, off0);
    nb_tensor *uu = host(nb_uniform((int64_t[]){n}, 1, NB_F32, -2.0, 3.0, g));
    for (int64_t i = 0; i < n; i++) {
        ref_block(seed, stream, off0 + (uint64_t)i / 4, w);
        float r = (float)(-2.0 + 5.0 * ((double)(w[i % 4] >> 8) / 16777216.0));
        REQ(((float *)nb_data(uu))[i] == r);
    }
    /* rand f64: element i is the 64-bit word i % 2 of block i / 2, top 53 bits. */
    nb_generator_set_offset(g, off0);
    nb_tensor *d = host(nb_rand((int64_t[]){n}, 1, NB_F64, g));
    ck_assert_uint_eq(nb_generator_offset(g), off0 + q2);
    for (int64_t i = 0; i < n; i++) {
        ref_block(seed, stream, off0 + (uint64_t)i / 2, w);
        int k = (int)(i % 2);
        uint64_t x = ((uint64_t)w[2 * k] << 32) | w[2 * k + 1];
        REQ(((double *)nb_data(d))[i] == (double)(x >> 11) / 9007199254740992.0);
    }
    /* randn f32: Box-Muller on the word pairs (0,1) and (2,3) of block i / 4. */
    nb_generator_set_offset(g, off0);
    nb_tensor *z = host(nb_normal((int64_t[]){n}, 1, NB_F32, 1.0, 2.0, g));
    ck_assert_uint_eq(nb_generator_offset(g), off0 + q4);
    for (int64_t i = 0; i < n; i++) {
        ref_block(seed, stream, off0 + (uint64_t)i / 4, w);
        int p = (int)(i % 4) / 2;
        double u1 = ((double)w[2 * p] + 1.0) / 4294967296.0;
        double u2 = (double)w[2 * p + 1] / 4294967296.0;
        double r = sqrt(-2.0 * log(u1)), th = 2.0 * M_PI * u2;
        double v = 1.0 + 2.0 * (i % 2 == 0 ? r * cos(th) : r * sin(th));
        REQUIRE(fabs(((float *)nb_data(z))[i] - v) <= 1e-6 * (1 + fabs(v)),
                      "randn f32 element %lld: %g vs %g", (long long)i,
                      (double)((float *)nb_data(z))[i], v);
    }
    /* randn f64: one Box-Muller pair per block from two 53-bit uniforms. */
    nb_generator_set_offset(g, off0);
    nb_tensor *zd = host(nb_randn((int64_t[]){n}, 1, NB_F64, g));
    ck_assert_uint_eq(nb_generator_offset(g), off0 + q2);
    for (int64_t i = 0; i < n; i++) {
        ref_block(seed, stream, off0 + (uint64_t)i / 2, w);
        uint64_t x0 = ((uint64_t)w[0] << 32) | w[1], x1 = ((uint64_t)w[2] << 32) | w[3];
        double u1 = ((double)(x0 >> 11) + 1.0) / 9007199254740992.0;
        double u2 = (double)(x1 >> 11) / 9007199254740992.0;
        double r = sqrt(-2.0 * log(u1)), th = 2.0 * M_PI * u2;
        double v = i % 2 == 0 ? r * cos(th) : r * sin(th);
        REQ(fabs(((double *)nb_data(zd))[i] - v) <= 1e-13 * (1 + fabs(v)));
    }
    /* randint, small range: multiply-shift of one 32-bit word. */
    nb_generator_set_offset(g, off0);
    nb_tensor *ri = host(nb_randint((int64_t[]){n}, 1, NB_I64, -7, 100, g));
    ck_assert_uint_eq(nb_generator_offset(g), off0 + q4);
    for (int64_t i = 0; i < n; i++) {
        ref_block(seed, stream, off0 + (uint64_t)i / 4, w);
        int64_t r = -7 + (int64_t)(((uint64_t)w[i % 4] * 107u) >> 32);
        REQ(((int64_t *)nb_data(ri))[i] == r);
    }
    /* randint, range above 2^32: 128-bit multiply-shift of a 64-bit word. */
    nb_generator_set_offset(g, off0);
    const int64_t big = INT64_C(1) << 40;
    nb_tensor *rb = host(nb_randint((int64_t[]){n}, 1, NB_I64, 5, 5 + big, g));
    ck_assert_uint_eq(nb_generator_offset(g), off0 + q2);
    for (int64_t i = 0; i < n; i++) {
        ref_block(seed, stream, off0 + (uint64_t)i / 2, w);
        int k = (int)(i % 2);
        uint64_t x = ((uint64_t)w[2 * k] << 32) | w[2 * k + 1];
        int64_t r = 5 + (int64_t)(((unsigned __int128)x * (uint64_t)big) >> 64);
        REQ(((int64_t *)nb_data(rb))[i] == r);
    }
    /* bernoulli: w * 2^-32 < p. */
    nb_generator_set_offset(g, off0);
    nb_tensor *be = host(nb_bernoulli((int64_t[]){n}, 1, NB_U8, 0.4, g));
    ck_assert_uint_eq(nb_generator_offset(g), off0 + q4);
    for (int64_t i = 0; i < n; i++) {
        ref_block(seed, stream, off0 + (uint64_t)i / 4, w);
        REQ(((uint8_t *)nb_data(be))[i] == ((double)w[i % 4] / 4294967296.0 < 0.4));
    }
    /* randperm: Fisher-Yates with one 64-bit word per swap, two swaps per block. */
    nb_generator_set_offset(g, off0);
    nb_tensor *pm = host(nb_randperm(n, g));
    ck_assert_uint_eq(nb_generator_offset(g), off0 + (uint64_t)(n - 1 + 1) / 2); /* n - 1 swaps */
    int64_t *ref = malloc(sizeof(int64_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) ref[i] = i;
    for (int64_t i = n - 1, k = 0; i >= 1; i--, k++) {
        ref_block(seed, stream, off0 + (uint64_t)k / 2, w);
        int q = (int)(k % 2);
        uint64_t x = ((uint64_t)w[2 * q] << 32) | w[2 * q + 1];
        int64_t j = (int64_t)(((unsigned __int128)x * (uint64_t)(i + 1)) >> 64);
        int64_t t = ref[i];
        ref[i] = ref[j];
        ref[j] = t;
    }
    for (int64_t i = 0; i < n; i++) REQ(((int64_t *)nb_data(pm))[i] == ref[i]);
    free(ref);
    nb_generator_free(g);
    nb_scope_end();
}
END_TEST

/* ---- determinism ------------------------------------------------------------------------- */
START_TEST(test_thread_count_invariance) {
    nb_scope_begin();
    int saved = nb_get_num_threads();
    const int64_t shape[2] = {1000, 1000}; /* 1M elements: several threads take part */
    nb_tensor *r[3][5];
    for (int t = 0; t < 3; t++) { /* 1, 2 and 3 threads (3: uneven chunk split) */
        nb_set_num_threads(t + 1);
        nb_generator *g = nb_generator_new(2024);
        r[t][0] = nb_randn(shape, 2, NB_F32, g);
        r[t][1] = nb_rand(shape, 2, NB_F32, g);
        r[t][2] = nb_randint(shape, 2, NB_I32, -1000, 1000, g);
        r[t][3] = nb_bernoulli(shape, 2, NB_BOOL, 0.25, g);
        r[t][4] = nb_randn((int64_t[]){300001}, 1, NB_BF16, g); /* odd size: partial block */
        ck_assert_uint_eq(nb_generator_offset(g), 4 * 250000 + 75001);
        nb_generator_free(g);
    }
    nb_set_num_threads(saved);
    for (int t = 1; t < 3; t++)
        for (int k = 0; k < 5; k++)
            REQUIRE(same_bytes(r[0][k], r[t][k]), "draw %d differs between 1 and %d threads",
                    k, t + 1);
    nb_scope_end();
}
END_TEST

START_TEST(test_seed_and_stream) {
    nb_scope_begin();
    const int64_t shape[3] = {3, 5, 7};
    for (size_t d = 0; d < sizeof float_dts / sizeof float_dts[0]; d++) {
        nb_dtype dt = float_dts[d];
        nb_generator *a = nb_generator_new(11), *b = nb_generator_new(11);
        nb_generator *c = nb_generator_new(12), *s = nb_generator_new(11);
        nb_generator_set_stream(s, 1);
        nb_tensor *ta = nb_randn(shape, 3, dt, a), *tb = nb_randn(shape, 3, dt, b);
        nb_tensor *tc = nb_randn(shape, 3, dt, c), *ts = nb_randn(shape, 3, dt, s);
        REQUIRE(same_bytes(ta, tb), "same seed, dtype %s", nb_dtype_name(dt));
        REQUIRE(!same_bytes(ta, tc), "different seed, dtype %s", nb_dtype_name(dt));
        REQUIRE(!same_bytes(ta, ts), "different stream, dtype %s", nb_dtype_name(dt));
        /* The second draw continues the stream: not a repeat of the first. */
        nb_tensor *ta2 = nb_randn(shape, 3, dt, a);
        REQ(!same_bytes(ta, ta2));
        nb_generator_free(a);
        nb_generator_free(b);
        nb_generator_free(c);
        nb_generator_free(s);
    }
    /* The default generator after nb_manual_seed(s) equals a fresh generator of seed s. */
    nb_manual_seed(31337);
    nb_tensor *x = nb_rand(shape, 3, NB_F32, NULL);
    nb_generator *g = nb_generator_new(31337);
    nb_tensor *y = nb_rand(shape, 3, NB_F32, g);
    REQ(same_bytes(x, y));
    nb_generator_free(g);
    nb_manual_seed(0);
    nb_scope_end();
}
END_TEST

START_TEST(test_offset_restore) {
    nb_scope_begin();
    nb_generator *g = nb_generator_new(7);
    const int64_t shape[2] = {33, 17};
    nb_tensor *a = nb_randn(shape, 2, NB_F32, g);
    uint64_t pos = nb_generator_offset(g);
    nb_tensor *b = nb_randn(shape, 2, NB_F32, g);
    nb_tensor *b_i = nb_randint(shape, 2, NB_I64, 0, 1000, g);
    nb_generator_set_offset(g, pos);
    nb_tensor *b2 = nb_randn(shape, 2, NB_F32, g);
    nb_tensor *b2_i = nb_randint(shape, 2, NB_I64, 0, 1000, g);
    REQ(!same_bytes(a, b));
    REQ(same_bytes(b, b2));
    REQ(same_bytes(b_i, b2_i));
    /* A restored position in a new generator object continues identically too. */
    nb_generator *h = nb_generator_new(7);
    nb_generator_set_offset(h, pos);
    REQ(same_bytes(b, nb_randn(shape, 2, NB_F32, h)));
    /* Splitting a draw at a block boundary gives the same values as one draw. */
    nb_generator_set_offset(g, 0);
    nb_tensor *whole = nb_rand((int64_t[]){16}, 1, NB_F32, g);
    nb_generator_set_offset(g, 0);
    nb_tensor *p1 = nb_rand((int64_t[]){8}, 1, NB_F32, g);
    nb_tensor *p2 = nb_rand((int64_t[]){8}, 1, NB_F32, g);
    const float *wv = nb_data(host(whole));
    REQ(memcmp(wv, nb_data(host(p1)), 8 * sizeof(float)) == 0);
    REQ(memcmp(wv + 8, nb_data(host(p2)), 8 * sizeof(float)) == 0);
    nb_generator_free(g);
    nb_generator_free(h);
    nb_scope_end();
}
END_TEST

/* ---- statistics (bounds of 5 standard errors) ---------------------------------------------- */
START_TEST(test_uniform_stats) {
    nb_scope_begin();
    nb_generator *g = nb_generator_new(100);
    for (size_t d = 0; d < sizeof float_dts / sizeof float_dts[0]; d++) {
        nb_dtype dt = float_dts[d];
        int64_t n = dt == NB_F32 ? 1000000 : 200000;
        const double lo = -1.5, hi = 2.5, w = hi - lo;
        nb_tensor *t = nb_uniform((int64_t[]){n}, 1, dt, lo, hi, g);
        ck_assert_ptr_nonnull(t);
        ck_assert_int_eq(nb_tensor_dtype(t), dt);
        t = host(t);
        double mean, var, mn = INFINITY, mx = -INFINITY;
        moments(t, &mean, &var);
        int64_t hist[10] = {0};
        for (int64_t i = 0; i < n; i++) {
            double v = elem(t, i);
            mn = fmin(mn, v);
            mx = fmax(mx, v);
            int bin = (int)((v - lo) / w * 10);
            hist[bin < 0 ? 0 : bin > 9 ? 9 : bin]++;
        }
        REQUIRE(mn >= lo && mx < hi, "%s: range [%g, %g]", nb_dtype_name(dt), mn, mx);
        /* Half dtypes quantize the values, so allow their rounding on top of the noise. */
        double q = dt == NB_BF16 ? w / 256 : dt == NB_F16 ? w / 2048 : 0;
        double se_mean = w * sqrt(1.0 / 12 / (double)n);
        double se_var = w * w * sqrt((1.0 / 80 - 1.0 / 144) / (double)n);
        REQUIRE(fabs(mean - (lo + hi) / 2) < 5 * se_mean + q, "%s: mean %g",
                      nb_dtype_name(dt), mean);
        REQUIRE(fabs(var - w * w / 12) < 5 * se_var + 2 * q * w, "%s: variance %g",
                      nb_dtype_name(dt), var);
        if (dt == NB_F32 || dt == NB_F64) {
            double pb = 0.1, se = sqrt((double)n * pb * (1 - pb));
            for (int b = 0; b < 10; b++)
                REQUIRE(fabs((double)hist[b] - (double)n * pb) < 5 * se,
                              "%s: bin %d has %lld", nb_dtype_name(dt), b, (long long)hist[b]);
        }
    }
    nb_generator_free(g);
    nb_scope_end();
}
END_TEST

/* Values that round up to hi in the dtype are moved to the largest value below hi. */
START_TEST(test_uniform_never_hi) {
    nb_scope_begin();
    nb_generator *g = nb_generator_new(5);
    /* About 1 in 4096 (f16) and 1 in 512 (bf16) of the 24-bit uniforms round to 1.0. */
    nb_tensor *h = host(nb_rand((int64_t[]){200000}, 1, NB_F16, g));
    nb_tensor *b = host(nb_rand((int64_t[]){200000}, 1, NB_BF16, g));
    uint16_t hmax = 0, bmax = 0;
    for (int64_t i = 0; i < 200000; i++) {
        uint16_t x = ((uint16_t *)nb_data(h))[i], y = ((uint16_t *)nb_data(b))[i];
        REQUIRE(x <= 0x3bff, "f16 rand element %lld is 0x%04x", (long long)i, x);
        REQUIRE(y <= 0x3f7f, "bf16 rand element %lld is 0x%04x", (long long)i, y);
        hmax = x > hmax ? x : hmax;
        bmax = y > bmax ? y : bmax;
    }
    ck_assert_uint_eq(hmax, 0x3bff); /* 1 - 2^-11: the clamp happened and is the right value */
    ck_assert_uint_eq(bmax, 0x3f7f); /* 1 - 2^-8 */
    /* A bound that is not representable: f32 0.1f > 0.1, so results stay below 0.1. */
    nb_tensor *f = host(nb_uniform((int64_t[]){100000}, 1, NB_F32, 0.1 - 1e-7, 0.1, g));
    for (int64_t i = 0; i < 100000; i++) {
        double v = ((float *)nb_data(f))[i];
        REQUIRE(v < 0.1, "element %lld is %.10g", (long long)i, v);
    }
    /* Negative hi in f16: largest value below -1 is -(1 + 2^-10). */
    nb_tensor *n16 = host(nb_uniform((int64_t[]){100000}, 1, NB_F16, -1.001, -1.0, g));
    for (int64_t i = 0; i < 100000; i++) {
        double v = nb_f16_to_f32(((uint16_t *)nb_data(n16))[i]);
        REQ(v < -1.0 && v >= -1.001 - 1e-3);
    }
    /* lo == hi gives lo everywhere (as torch.empty(...).uniform_(a, a)). */
    nb_tensor *c = host(nb_uniform((int64_t[]){9}, 1, NB_F64, 3.25, 3.25, g));
    for (int64_t i = 0; i < 9; i++) REQ(((double *)nb_data(c))[i] == 3.25);
    nb_generator_free(g);
    nb_scope_end();
}
END_TEST

START_TEST(test_normal_stats) {
    nb_scope_begin();
    nb_generator *g = nb_generator_new(200);
    for (size_t d = 0; d < sizeof float_dts / sizeof float_dts[0]; d++) {
        nb_dtype dt = float_dts[d];
        int64_t n = dt == NB_F32 ? 1000000 : 200000;
        const double mu = 3.0, sd = 2.0;
        nb_tensor *t = nb_normal((int64_t[]){n / 100, 100}, 2, dt, mu, sd, g);
        ck_assert_ptr_nonnull(t);
        t = host(t);
        double mean, var;
        moments(t, &mean, &var);
        /* bf16 rounds each value by up to 2^-8 relative; the bias stays well below it. */
        double q = dt == NB_BF16 ? 0.01 : dt == NB_F16 ? 0.002 : 0;
        REQUIRE(fabs(mean - mu) < 5 * sd / sqrt((double)n) + q, "%s: mean %g",
                      nb_dtype_name(dt), mean);
        REQUIRE(fabs(var - sd * sd) < 5 * sd * sd * sqrt(2.0 / (double)n) + 4 * q * sd,
                      "%s: variance %g", nb_dtype_name(dt), var);
        /* Shape of the distribution: P(|z| < 1) = 0.682689..., and the tails exist. */
        int64_t in1 = 0, out3 = 0;
        for (int64_t i = 0; i < n; i++) {
            double z = (elem(t, i) - mu) / sd;
            in1 += fabs(z) < 1;
            out3 += fabs(z) > 3;
        }
        double p1 = 0.6826894921370859, p3 = 0.0026997960632601866;
        if (dt == NB_F32 || dt == NB_F64) {
            REQUIRE(fabs((double)in1 - p1 * (double)n) < 5 * sqrt(n * p1 * (1 - p1)),
                          "%s: %lld within 1 sd", nb_dtype_name(dt), (long long)in1);
            REQUIRE(fabs((double)out3 - p3 * (double)n) < 5 * sqrt(n * p3 * (1 - p3)),
                          "%s: %lld beyond 3 sd", nb_dtype_name(dt), (long long)out3);
        }
    }
    /* randn is normal(0, 1) from the same stream position. */
    nb_generator_set_offset(g, 0);
    nb_tensor *a = nb_randn((int64_t[]){1001}, 1, NB_F32, g);
    nb_generator_set_offset(g, 0);
    nb_tensor *b = nb_normal((int64_t[]){1001}, 1, NB_F32, 0.0, 1.0, g);
    REQ(same_bytes(a, b));
    /* std 0 gives mean everywhere. */
    nb_tensor *c = host(nb_normal((int64_t[]){7}, 1, NB_F32, -4.5, 0.0, g));
    for (int i = 0; i < 7; i++) REQ(((float *)nb_data(c))[i] == -4.5f);
    nb_generator_free(g);
    nb_scope_end();
}
END_TEST

START_TEST(test_randint) {
    nb_scope_begin();
    nb_generator *g = nb_generator_new(300);
    static const struct {
        nb_dtype dt;
        int64_t lo, hi;
    } cases[] = {
        {NB_I64, -3, 5},      {NB_I32, -100, 100}, {NB_U8, 0, 256},  {NB_BOOL, 0, 2},
        {NB_F32, -10, 10},    {NB_F64, 1, 4},      {NB_F16, -2048, 2049},
        {NB_BF16, -256, 257}, {NB_I32, INT32_MIN, INT32_MAX}, {NB_I64, 7, 8},
    };
    const int64_t n = 100000;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        nb_dtype dt = cases[c].dt;
        int64_t lo = cases[c].lo, hi = cases[c].hi;
        nb_tensor *t = nb_randint((int64_t[]){n}, 1, dt, lo, hi, g);
        REQUIRE(t != NULL, "case %zu: %s", c, nb_last_error());
        ck_assert_int_eq(nb_tensor_dtype(t), dt);
        t = host(t);
        double range = (double)hi - (double)lo;
        bool small = range <= 1024;
        int64_t *count = calloc(small ? (size_t)range : 1, sizeof(int64_t));
        double sum = 0;
        for (int64_t i = 0; i < n; i++) {
            double v = elem(t, i);
            REQUIRE(v >= (double)lo && v < (double)hi && v == floor(v),
                          "case %zu element %lld is %g", c, (long long)i, v);
            sum += v;
            if (small) count[(int64_t)(v - (double)lo)]++;
        }
        if (small) {
            for (int64_t k = 0; k < (int64_t)range; k++)
                REQUIRE(count[k] > 0, "case %zu: value %lld never drawn", c,
                              (long long)(lo + k));
        }
        free(count);
        /* Mean of a discrete uniform on [lo, hi - 1]. */
        double mu = ((double)lo + (double)hi - 1) / 2, sd = sqrt((range * range - 1) / 12);
        REQUIRE(fabs(sum / (double)n - mu) <= 5 * sd / sqrt((double)n),
                      "case %zu: mean %g, expected %g", c, sum / (double)n, mu);
    }
    /* A range above 2^32 (64-bit words) and the full int64 range stay in bounds. */
    const int64_t big = INT64_C(3) << 40;
    nb_tensor *b = host(nb_randint((int64_t[]){n}, 1, NB_I64, -big, big, g));
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t v = ((int64_t *)nb_data(b))[i];
        REQ(v >= -big && v < big);
        sum += (double)v;
    }
    REQ(fabs(sum / (double)n) < 5 * (2.0 * (double)big / sqrt(12.0)) / sqrt((double)n));
    nb_tensor *full = nb_randint((int64_t[]){1000}, 1, NB_I64, INT64_MIN, INT64_MAX, g);
    ck_assert_ptr_nonnull(full);
    full = host(full);
    int64_t neg = 0;
    for (int64_t i = 0; i < 1000; i++) neg += ((int64_t *)nb_data(full))[i] < 0;
    REQ(neg > 400 && neg < 600);
    nb_generator_free(g);
    nb_scope_end();
}
END_TEST

START_TEST(test_bernoulli) {
    nb_scope_begin();
    nb_generator *g = nb_generator_new(400);
    const int64_t n = 200000;
    for (size_t d = 0; d < sizeof all_dts / sizeof all_dts[0]; d++) {
        nb_dtype dt = all_dts[d];
        const double ps[] = {0.0, 0.3, 0.5, 1.0};
        for (size_t k = 0; k < 4; k++) {
            double p = ps[k];
            nb_tensor *t = nb_bernoulli((int64_t[]){n / 8, 8}, 2, dt, p, g);
            REQUIRE(t != NULL, "%s: %s", nb_dtype_name(dt), nb_last_error());
            ck_assert_int_eq(nb_tensor_dtype(t), dt);
            t = host(t);
            int64_t ones = 0;
            for (int64_t i = 0; i < n; i++) {
                double v = elem(t, i);
                REQ(v == 0.0 || v == 1.0);
                ones += v == 1.0;
            }
            if (p == 0.0 || p == 1.0) ck_assert_int_eq(ones, (int64_t)p * n);
            else
                REQUIRE(fabs((double)ones - p * n) < 5 * sqrt(n * p * (1 - p)),
                              "%s p=%g: %lld ones", nb_dtype_name(dt), p, (long long)ones);
        }
    }
    /* The bool encoding is exactly 0 / 1 bytes. */
    nb_tensor *bt = host(nb_bernoulli((int64_t[]){64}, 1, NB_BOOL, 0.5, g));
    for (int i = 0; i < 64; i++) REQ(((uint8_t *)nb_data(bt))[i] <= 1);
    nb_generator_free(g);
    nb_scope_end();
}
END_TEST

START_TEST(test_randperm) {
    nb_scope_begin();
    nb_generator *g = nb_generator_new(500);
    const int64_t n = 1000;
    nb_tensor *p = nb_randperm(n, g);
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(nb_tensor_dtype(p), NB_I64);
    ck_assert_int_eq(nb_ndim(p), 1);
    ck_assert_int_eq(nb_shape(p)[0], n);
    ck_assert_uint_eq(nb_generator_offset(g), (n - 1 + 1) / 2);
    p = host(p);
    bool seen[1000] = {false};
    int64_t fixed = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t v = ((int64_t *)nb_data(p))[i];
        REQ(v >= 0 && v < n && !seen[v]);
        seen[v] = true;
        fixed += v == i;
    }
    REQ(fixed < 10); /* a shuffle, not the identity (expected number: 1) */
    nb_tensor *e = nb_randperm(0, g);
    ck_assert_ptr_nonnull(e);
    ck_assert_int_eq(nb_numel(e), 0);
    nb_tensor *one = nb_randperm(1, g);
    ck_assert_int_eq(((int64_t *)nb_data(host(one)))[0], 0);
    /* Uniform over the 6 permutations of 3 elements. */
    int64_t counts[9] = {0};
    const int draws = 6000;
    for (int k = 0; k < draws; k++) {
        nb_scope_begin();
        const int64_t *q = nb_data(host(nb_randperm(3, g)));
        counts[q[0] * 3 + q[1]]++;
        nb_scope_end();
    }
    double se = sqrt(draws * (1.0 / 6) * (5.0 / 6));
    int kinds = 0;
    for (int k = 0; k < 9; k++) {
        if (!counts[k]) continue;
        kinds++;
        REQUIRE(fabs((double)counts[k] - draws / 6.0) < 5 * se, "perm %d drawn %lld", k,
                      (long long)counts[k]);
    }
    ck_assert_int_eq(kinds, 6);
    /* Deterministic for a seed; the default generator is used for NULL. */
    nb_generator *a = nb_generator_new(9);
    nb_manual_seed(9);
    REQ(same_bytes(nb_randperm(50, a), nb_randperm(50, NULL)));
    nb_manual_seed(0);
    nb_generator_free(a);
    nb_generator_free(g);
    nb_scope_end();
}
END_TEST

/* ---- dtypes and shapes -------------------------------------------------------------------- */
START_TEST(test_dtypes_and_shapes) {
    nb_scope_begin();
    nb_generator *g = nb_generator_new(600);
    for (size_t d = 0; d < sizeof all_dts / sizeof all_dts[0]; d++) {
        nb_dtype dt = all_dts[d];
        bool fl = nb_dtype_is_float(dt);
        static const char *names[4] = {"rand", "randn", "uniform", "normal"};
        for (int k = 0; k < 4; k++) {
            const int64_t sh[2] = {2, 3};
            nb_tensor *r = k == 0   ? nb_rand(sh, 2, dt, g)
                           : k == 1 ? nb_randn(sh, 2, dt, g)
                           : k == 2 ? nb_uniform(sh, 2, dt, 0, 1, g)
                                    : nb_normal(sh, 2, dt, 0, 1, g);
            if (fl) {
                REQUIRE(r != NULL, "%s %s: %s", names[k], nb_dtype_name(dt), nb_last_error());
                ck_assert_int_eq(nb_tensor_dtype(r), dt);
                ck_assert_int_eq(nb_numel(r), 6);
                REQ(nb_is_contiguous(r));
                ck_assert(nb_device_equal(nb_tensor_device(r), nb_default_device()));
            } else {
                tu_assert_error(r, NB_EDTYPE, names[k]);
            }
        }
        uint64_t before = nb_generator_offset(g);
        ck_assert_ptr_nonnull(nb_randint((int64_t[]){4}, 1, dt, 0, 2, g));
        ck_assert_ptr_nonnull(nb_bernoulli((int64_t[]){4}, 1, dt, 0.5, g));
        ck_assert_uint_eq(nb_generator_offset(g), before + 2);
    }
    /* Shapes: 0-dim scalars, empty tensors, size-1 dims, the maximum rank. */
    nb_tensor *s = nb_randn(NULL, 0, NB_F32, g);
    ck_assert_int_eq(nb_ndim(s), 0);
    ck_assert_int_eq(nb_numel(s), 1);
    nb_tensor *e = nb_rand((int64_t[]){4, 0, 2}, 3, NB_F16, g);
    ck_assert_int_eq(nb_ndim(e), 3);
    ck_assert_int_eq(nb_numel(e), 0);
    int64_t eight[NB_MAX_DIMS] = {1, 2, 1, 3, 1, 2, 1, 2};
    nb_tensor *m = nb_randint(eight, NB_MAX_DIMS, NB_I32, 0, 10, g);
    ck_assert_int_eq(nb_ndim(m), NB_MAX_DIMS);
    ck_assert_int_eq(nb_numel(m), 24);
    nb_generator_free(g);
    nb_scope_end();
}
END_TEST

START_TEST(test_errors) {
    nb_scope_begin();
    nb_generator *g = nb_generator_new(1);
    const int64_t bad[2] = {3, -1};
    tu_assert_error(nb_rand(bad, 2, NB_F32, g), NB_EINVAL, "negative");
    tu_assert_error(nb_randn(bad, 2, NB_F32, g), NB_EINVAL, "randn");
    tu_assert_error(nb_uniform(bad, 2, NB_F32, 0, 1, g), NB_EINVAL, "[3,-1]");
    tu_assert_error(nb_normal(bad, 2, NB_F32, 0, 1, g), NB_EINVAL, "normal");
    tu_assert_error(nb_randint(bad, 2, NB_I64, 0, 5, g), NB_EINVAL, "randint");
    tu_assert_error(nb_bernoulli(bad, 2, NB_F32, 0.5, g), NB_EINVAL, "bernoulli");
    tu_assert_error(nb_rand((int64_t[]){1}, -1, NB_F32, g), NB_EINVAL, "ndim");
    tu_assert_error(nb_rand((int64_t[9]){1}, 9, NB_F32, g), NB_EINVAL, "ndim");
    tu_assert_error(nb_rand(NULL, 2, NB_F32, g), NB_ENULL, "shape");
    /* Invalid and unsupported dtypes. */
    tu_assert_error(nb_randn((int64_t[]){2}, 1, NB_I64, g), NB_EDTYPE, "i64");
    tu_assert_error(nb_rand((int64_t[]){2}, 1, NB_BOOL, g), NB_EDTYPE, "float dtypes");
    tu_assert_error(nb_rand((int64_t[]){2}, 1, (nb_dtype)99, g), NB_EDTYPE, "dtype");
    tu_assert_error(nb_randint((int64_t[]){2}, 1, (nb_dtype)-1, 0, 2, g), NB_EDTYPE, "dtype");
    tu_assert_error(nb_bernoulli((int64_t[]){2}, 1, NB_DTYPE_COUNT, 0.5, g), NB_EDTYPE,
                    "dtype");
    /* Ranges. */
    tu_assert_error(nb_randint((int64_t[]){2}, 1, NB_I64, 5, 5, g), NB_EINVAL, "hi");
    tu_assert_error(nb_randint((int64_t[]){2}, 1, NB_I64, 5, -5, g), NB_EINVAL, "[5, -5)");
    tu_assert_error(nb_randint((int64_t[]){2}, 1, NB_U8, -1, 10, g), NB_EINVAL, "u8");
    tu_assert_error(nb_randint((int64_t[]){2}, 1, NB_U8, 0, 257, g), NB_EINVAL, "u8");
    tu_assert_error(nb_randint((int64_t[]){2}, 1, NB_BOOL, 0, 3, g), NB_EINVAL, "bool");
    tu_assert_error(nb_randint((int64_t[]){2}, 1, NB_I32, 0, (INT64_C(1) << 31) + 1, g),
                    NB_EINVAL, "i32");
    tu_assert_error(nb_randint((int64_t[]){2}, 1, NB_BF16, 0, 1000, g), NB_EINVAL, "bf16");
    tu_assert_error(nb_randint((int64_t[]){2}, 1, NB_F16, 0, 5000, g), NB_EINVAL, "f16");
    tu_assert_error(nb_uniform((int64_t[]){2}, 1, NB_F32, 1, 0, g), NB_EINVAL, "uniform");
    tu_assert_error(nb_uniform((int64_t[]){2}, 1, NB_F32, NAN, 1, g), NB_EINVAL, "uniform");
    tu_assert_error(nb_uniform((int64_t[]){2}, 1, NB_F64, 0, INFINITY, g), NB_EINVAL, "finite");
    tu_assert_error(nb_uniform((int64_t[]){2}, 1, NB_F16, 0, 1e6, g), NB_EINVAL, "f16");
    tu_assert_error(nb_normal((int64_t[]){2}, 1, NB_F32, 0, -1, g), NB_EINVAL, "std");
    tu_assert_error(nb_normal((int64_t[]){2}, 1, NB_F32, NAN, 1, g), NB_EINVAL, "mean");
    tu_assert_error(nb_bernoulli((int64_t[]){2}, 1, NB_F32, -0.1, g), NB_EINVAL, "[0, 1]");
    tu_assert_error(nb_bernoulli((int64_t[]){2}, 1, NB_F32, 1.5, g), NB_EINVAL, "probability");
    tu_assert_error(nb_bernoulli((int64_t[]){2}, 1, NB_F32, NAN, g), NB_EINVAL, "probability");
    tu_assert_error(nb_randperm(-1, g), NB_EINVAL, "randperm");
    /* A failed call does not move the stream. */
    ck_assert_uint_eq(nb_generator_offset(g), 0);
    /* NULL generator means the default one, not an error. */
    nb_manual_seed(0);
    ck_assert_ptr_nonnull(nb_randn((int64_t[]){3}, 1, NB_F32, NULL));
    ck_assert_uint_eq(nb_generator_offset(NULL), 1);
    nb_manual_seed(0);
    nb_generator_free(g);
    nb_scope_end();
}
END_TEST

/* ---- devices ----------------------------------------------------------------------------------
 * One draw of every kind, made on a device from a fresh generator (seed 77, stream 3,
 * offset 5): kind k of draw_on. */
enum { NKINDS = 12 };
static nb_tensor *draw_on(nb_device dev, int kind, nb_generator *g) {
    const int64_t sh[3] = {3, 5, 7}; /* 105 elements: chunks end mid-block */
    const int64_t big[1] = {5000};  /* several chunks: the threaded path */
    switch (kind) {
    case 0: return nb_rand_on(dev, sh, 3, NB_F32, g);
    case 1: return nb_uniform_on(dev, sh, 3, NB_F64, -2.0, 3.0, g);
    case 2: return nb_uniform_on(dev, sh, 3, NB_BF16, 0.0, 1.0, g);
    case 3: return nb_randn_on(dev, big, 1, NB_F32, g);
    case 4: return nb_normal_on(dev, sh, 3, NB_F64, 1.0, 2.0, g);
    case 5: return nb_normal_on(dev, sh, 3, NB_F16, 0.0, 1.0, g);
    case 6: return nb_randint_on(dev, sh, 3, NB_I64, -4, 9, g);
    case 7: return nb_randint_on(dev, sh, 2, NB_I64, 0, INT64_C(1) << 40, g);
    case 8: return nb_randint_on(dev, sh, 3, NB_F32, 0, 100, g);
    case 9: return nb_bernoulli_on(dev, sh, 3, NB_U8, 0.3, g);
    case 10: return nb_bernoulli_on(dev, big, 1, NB_BOOL, 0.5, g);
    default: return nb_randperm_on(dev, 101, g);
    }
}

static nb_generator *fresh_gen(void) {
    nb_generator *g = nb_generator_new(77);
    nb_generator_set_stream(g, 3);
    nb_generator_set_offset(g, 5);
    return g;
}

START_TEST(test_devices_same_stream) {
    nb_scope_begin();
    for (int k = 0; k < NKINDS; k++) {
        nb_generator *gc = fresh_gen(), *gg = fresh_gen(), *gm = fresh_gen();
        nb_tensor *c = draw_on(NB_CPU, k, gc);
        nb_tensor *d = draw_on(GUARD, k, gg);
        nb_tensor *m = draw_on(NB_META, k, gm);
        REQUIRE(c && d && m, "kind %d: %s", k, nb_last_error());
        /* The guard draw copied back equals the CPU draw bit for bit. */
        ck_assert(nb_device_equal(nb_tensor_device(d), GUARD));
        nb_tensor *back = nb_to_device(d, NB_CPU);
        REQUIRE(same_bytes(c, back), "kind %d: guard values differ from the CPU's", k);
        /* Meta: shape and dtype, no data. */
        ck_assert(nb_device_equal(nb_tensor_device(m), NB_META));
        ck_assert_int_eq(nb_tensor_dtype(m), nb_tensor_dtype(c));
        ck_assert_int_eq(nb_ndim(m), nb_ndim(c));
        for (int i = 0; i < nb_ndim(c); i++) ck_assert_int_eq(nb_shape(m)[i], nb_shape(c)[i]);
        ck_assert_ptr_null(nb_data(m));
        ck_assert_int_eq(nb_last_status(), NB_EDEVICE);
        /* Every device advances the stream the same. */
        ck_assert_uint_gt(nb_generator_offset(gc), 5);
        ck_assert_uint_eq(nb_generator_offset(gg), nb_generator_offset(gc));
        ck_assert_uint_eq(nb_generator_offset(gm), nb_generator_offset(gc));
        nb_generator_free(gc);
        nb_generator_free(gg);
        nb_generator_free(gm);
    }
    /* The plain forms are the _on forms on the default device (NB_CPU unless set). */
    nb_generator *a = nb_generator_new(9), *b = nb_generator_new(9);
    nb_device def = nb_default_device();
    nb_tensor *pa = nb_randn((int64_t[]){33}, 1, NB_F32, a);
    nb_tensor *pb = nb_randn_on(def, (int64_t[]){33}, 1, NB_F32, b);
    ck_assert(nb_device_equal(nb_tensor_device(pa), def));
    ck_assert(same_bytes(pa, pb));
    ck_assert(same_bytes(nb_randperm(20, a), nb_randperm_on(def, 20, b)));
    /* Argument errors are the same on every device, and an unknown device fails cleanly
     * without moving the stream. */
    tu_assert_error(nb_rand_on(GUARD, (int64_t[]){2}, 1, NB_I32, a), NB_EDTYPE, "float");
    tu_assert_error(nb_uniform_on(NB_META, (int64_t[]){2}, 1, NB_F32, 1, 0, a), NB_EINVAL,
                    "uniform");
    uint64_t off = nb_generator_offset(a);
    tu_assert_error(nb_randn_on((nb_device){(nb_device_type)42, 0}, (int64_t[]){2}, 1, NB_F32, a),
                    NB_EDEVICE, "42");
    ck_assert_uint_eq(nb_generator_offset(a), off);
    nb_generator_free(a);
    nb_generator_free(b);
    nb_scope_end();
}
END_TEST

/* nb_uniform_ / nb_normal_: the stream of nb_uniform / nb_normal, written in place into a
 * tensor of any device, also through a strided view (element i in row-major order of the
 * view takes value i). */
START_TEST(test_inplace_fills) {
    nb_scope_begin();
    const int64_t sh[2] = {37, 29};
    for (int dist = 0; dist < 2; dist++) {
        for (size_t di = 0; di < 4; di++) {
            nb_dtype dt = float_dts[di];
            nb_generator *gr = nb_generator_new(5), *gc = nb_generator_new(5),
                         *gg = nb_generator_new(5), *gm = nb_generator_new(5);
            nb_tensor *ref = dist ? nb_normal(sh, 2, dt, 0.5, 2.0, gr)
                                  : nb_uniform(sh, 2, dt, -1.0, 1.0, gr);
            nb_tensor *c = nb_zeros(sh, 2, dt), *d = nb_zeros_on(GUARD, sh, 2, dt),
                      *m = nb_empty_on(NB_META, sh, 2, dt);
            nb_status s1 = dist ? nb_normal_(c, 0.5, 2.0, gc) : nb_uniform_(c, -1.0, 1.0, gc);
            nb_status s2 = dist ? nb_normal_(d, 0.5, 2.0, gg) : nb_uniform_(d, -1.0, 1.0, gg);
            nb_status s3 = dist ? nb_normal_(m, 0.5, 2.0, gm) : nb_uniform_(m, -1.0, 1.0, gm);
            REQUIRE(s1 == NB_OK && s2 == NB_OK && s3 == NB_OK, "%s", nb_last_error());
            REQUIRE(same_bytes(ref, c), "dist %d %s: in place differs", dist, nb_dtype_name(dt));
            REQUIRE(same_bytes(ref, nb_to_device(d, NB_CPU)), "dist %d %s: guard differs", dist,
                    nb_dtype_name(dt));
            ck_assert_uint_eq(nb_generator_offset(gc), nb_generator_offset(gr));
            ck_assert_uint_eq(nb_generator_offset(gg), nb_generator_offset(gr));
            ck_assert_uint_eq(nb_generator_offset(gm), nb_generator_offset(gr));
            /* A transposed view (29, 37) of a CPU and of a guard tensor: element (i, j) of
             * the view is value i * 37 + j of the stream. */
            nb_generator *gv = nb_generator_new(8), *gw = nb_generator_new(8),
                         *gx = nb_generator_new(8);
            nb_tensor *flat = dist ? nb_normal((int64_t[]){29, 37}, 2, dt, 0.5, 2.0, gv)
                                   : nb_uniform((int64_t[]){29, 37}, 2, dt, -1.0, 1.0, gv);
            nb_tensor *base_c = nb_zeros(sh, 2, dt), *base_g = nb_zeros_on(GUARD, sh, 2, dt);
            nb_tensor *vc = nb_transpose(base_c, 0, 1), *vg = nb_transpose(base_g, 0, 1);
            ck_assert(!nb_is_contiguous(vc));
            s1 = dist ? nb_normal_(vc, 0.5, 2.0, gw) : nb_uniform_(vc, -1.0, 1.0, gw);
            s2 = dist ? nb_normal_(vg, 0.5, 2.0, gx) : nb_uniform_(vg, -1.0, 1.0, gx);
            ck_assert_int_eq(s1, NB_OK);
            ck_assert_int_eq(s2, NB_OK);
            REQUIRE(same_bytes(flat, nb_contiguous(vc)), "dist %d %s: strided fill differs",
                    dist, nb_dtype_name(dt));
            REQUIRE(same_bytes(flat, nb_to_device(nb_contiguous(vg), NB_CPU)),
                    "dist %d %s: strided guard fill differs", dist, nb_dtype_name(dt));
            for (nb_generator **q = (nb_generator *[]){gr, gc, gg, gm, gv, gw, gx, NULL}; *q; q++)
                nb_generator_free(*q);
        }
    }
    /* Errors: integer targets, bad ranges, a leaf that requires grad with grad mode on; a
     * failed fill leaves the stream where it was. */
    nb_generator *g = nb_generator_new(1);
    nb_tensor *i = nb_zeros((int64_t[]){4}, 1, NB_I32);
    ck_assert_int_eq(nb_uniform_(i, 0, 1, g), NB_EDTYPE);
    ck_assert_int_eq(nb_normal_(nb_zeros_on(NB_META, (int64_t[]){4}, 1, NB_I64), 0, 1, g),
                     NB_EDTYPE);
    nb_tensor *f = nb_zeros((int64_t[]){4}, 1, NB_F32);
    ck_assert_int_eq(nb_uniform_(f, 1, 0, g), NB_EINVAL);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "uniform_"));
    ck_assert_int_eq(nb_normal_(f, 0, -1, g), NB_EINVAL);
    ck_assert_int_ne(nb_uniform_(NULL, 0, 1, g), NB_OK);
    nb_set_requires_grad(f, true);
    ck_assert_int_eq(nb_uniform_(f, 0, 1, g), NB_EINVAL);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "requires grad"));
    ck_assert_uint_eq(nb_generator_offset(g), 0);
    nb_generator_free(g);
    nb_scope_end();
}
END_TEST

/* The nn initializers draw in place on the tensor's device: the guard device gives the CPU's
 * values (its memory is never read or written by the host), meta computes nothing, and the
 * generator advances the same everywhere. */
START_TEST(test_init_on_devices) {
    nb_scope_begin();
    const int64_t sh[2] = {16, 24};
    nb_device devs[3] = {NB_CPU, GUARD, NB_META};
    nb_tensor *out[3][4];
    uint64_t offs[3];
    for (int d = 0; d < 3; d++) {
        nb_generator *g = nb_generator_new(31);
        for (int k = 0; k < 4; k++) {
            nb_tensor *w = nb_empty_on(devs[d], sh, 2, NB_F32);
            nb_set_requires_grad(w, true); /* parameters: the initializers turn grad off */
            nb_status st;
            switch (k) {
            case 0:
                st = nb_init_kaiming_uniform_(w, sqrt(5.0), false, NB_NONLIN_LEAKY_RELU, g);
                break;
            case 1: st = nb_init_xavier_normal_(w, 1.0, g); break;
            case 2: st = nb_init_uniform_(w, -0.1, 0.1, g); break;
            default: st = nb_init_normal_(w, 0.0, 0.02, g); break;
            }
            REQUIRE(st == NB_OK, "device %d init %d: %s", d, k, nb_last_error());
            ck_assert(nb_device_equal(nb_tensor_device(w), devs[d]));
            out[d][k] = w;
        }
        offs[d] = nb_generator_offset(g);
        nb_generator_free(g);
    }
    ck_assert_uint_gt(offs[0], 0);
    ck_assert_uint_eq(offs[1], offs[0]);
    ck_assert_uint_eq(offs[2], offs[0]);
    for (int k = 0; k < 4; k++)
        REQUIRE(same_bytes(out[0][k], nb_to_device(out[1][k], NB_CPU)),
                "init %d: guard values differ from the CPU's", k);
    /* A fan needs 2 dims on every device; constants work everywhere too. */
    ck_assert_int_eq(nb_init_xavier_uniform_(nb_empty_on(NB_META, (int64_t[]){3}, 1, NB_F32),
                                             1.0, NULL), NB_ESHAPE);
    nb_tensor *z = nb_ones_on(GUARD, sh, 2, NB_F32);
    ck_assert_int_eq(nb_init_zeros_(z), NB_OK);
    float zv[16 * 24];
    ck_assert_int_eq(nb_read(z, zv, 16 * 24, NB_F32), NB_OK);
    for (int i = 0; i < 16 * 24; i++) ck_assert_float_eq(zv[i], 0.0f);
    ck_assert_int_eq(nb_init_ones_(nb_empty_on(NB_META, sh, 2, NB_F32)), NB_OK);
    nb_scope_end();
}
END_TEST

Suite *nb_suite_random(void) {
    Suite *s = suite_create("random");
    struct {
        const char *name;
        const TTest *test;
    } cases[] = {
        {"philox_kat", test_philox_kat},
        {"generator_state", test_generator_state},
        {"default_per_thread", test_default_per_thread},
        {"layout", test_layout},
        {"thread_count_invariance", test_thread_count_invariance},
        {"seed_and_stream", test_seed_and_stream},
        {"offset_restore", test_offset_restore},
        {"uniform_stats", test_uniform_stats},
        {"uniform_never_hi", test_uniform_never_hi},
        {"normal_stats", test_normal_stats},
        {"randint", test_randint},
        {"bernoulli", test_bernoulli},
        {"randperm", test_randperm},
        {"dtypes_and_shapes", test_dtypes_and_shapes},
        {"errors", test_errors},
        {"devices_same_stream", test_devices_same_stream},
        {"inplace_fills", test_inplace_fills},
        {"init_on_devices", test_init_on_devices},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}
