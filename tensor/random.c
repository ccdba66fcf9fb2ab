/* random.c - counter-based random numbers (Philox 4x32-10) and the random tensor
 * constructors of nabla/random.h (rand, uniform, randn, normal, randint, bernoulli,
 * randperm) on the CPU.
 *
 * Philox 4x32-10 is the generator of Salmon, Moraes, Dror and Shaw, "Parallel random
 * numbers: as easy as 1, 2, 3" (SC11): a bijection of a 128-bit counter under a 64-bit
 * key, 10 rounds with multipliers 0xD2511F53 / 0xCD9E8D57 and Weyl key increments
 * 0x9E3779B9 / 0xBB67AE85. Because a block depends only on (counter, key), any element of
 * a random tensor can be computed independently of every other one, which is what makes
 * results independent of the thread count and of the device (DESIGN.md rule 5).
 *
 * Mapping of a generator (seed, stream, offset) to Philox inputs, for block b:
 *     counter = { lo32(offset + b), hi32(offset + b), lo32(stream), hi32(stream) }
 *     key     = { lo32(seed), hi32(seed) }
 * (offset + b wraps modulo 2^64). Each block gives four 32-bit words w0..w3.
 *
 * Which words make element i of a tensor of n elements (all offsets relative to the
 * generator's offset when the call starts):
 *   - "one word per element" (4 elements per block): element i uses block i / 4, word i % 4.
 *       rand/uniform for f32, f16, bf16: u = (w >> 8) * 2^-24 in [0, 1) (24 bits, every
 *         value exactly representable in f32), value = lo + (hi - lo) * u computed in
 *         double and rounded to the dtype (halves via f32, round to nearest even).
 *       bernoulli (any dtype): 1 if w * 2^-32 < p, else 0.
 *       randint with hi - lo <= 2^32: lo + ((uint64)w * (hi - lo)) >> 32 (multiply-shift;
 *         the bias is below (hi - lo) / 2^32 relative, negligible for tensor sizes).
 *   - randn/normal for f32, f16, bf16 (4 elements per block): Box-Muller on the pairs
 *       (w0, w1) and (w2, w3): u1 = (w_even + 1) * 2^-32 in (0, 1], u2 = w_odd * 2^-32,
 *       r = sqrt(-2 ln u1), z_even = r cos(2 pi u2), z_odd = r sin(2 pi u2); element i
 *       is z number i % 4 of block i / 4 (0: cos of pair 0, 1: sin of pair 0, 2: cos of
 *       pair 1, 3: sin of pair 1); value = mean + std * z in double, rounded to the dtype.
 *   - "two words per element" (2 elements per block): element i uses block i / 2 and the
 *       64-bit word x = (w[2k] << 32) | w[2k+1] with k = i % 2.
 *       rand/uniform for f64: u = (x >> 11) * 2^-53 (53 bits).
 *       randint with hi - lo > 2^32: lo + (x * (hi - lo)) >> 64 (128-bit multiply-shift).
 *   - randn/normal for f64 (2 elements per block): Box-Muller on u1 = ((x0 >> 11) + 1) *
 *       2^-53 in (0, 1] from words (w0, w1) and u2 = (x1 >> 11) * 2^-53 from (w2, w3);
 *       element 2b is r cos(2 pi u2), element 2b + 1 is r sin(2 pi u2).
 * After a call the offset advances by the number of blocks used, ceil(n / per_block),
 * so the next call continues the stream without overlap.
 *
 * Uniform results never reach hi: a value that rounds up to hi (or above) in its dtype is
 * replaced by the largest value of the dtype below hi (as PyTorch does for halves).
 *
 * randperm(n) is a sequential Fisher-Yates shuffle: for i = n-1 down to 1, swap element i
 * with element j = (x * (i + 1)) >> 64, where x is the next 64-bit word of the stream
 * (words consumed in pairs in block order, two swaps per block); it uses
 * ceil((n - 1) / 2) blocks.
 *
 * nb_generator_set_stream selects a stream and rewinds it to offset 0; nb_manual_seed
 * resets the calling thread's default generator to (seed, stream 0, offset 0). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/random.h"
#include "tensor/tensor_impl.h"
#include "cpu/cpu_impl.h" /* transitional: moves to cpu/ with the kernels */

struct nb_generator {
    uint64_t seed;
    uint64_t stream;
    uint64_t offset;
    /* true for generators from nb_generator_new; thread default generators are static
     * thread-local storage and must never be freed. */
    bool heap;
};

/* Zero-initialized = seed 0, stream 0, offset 0: the documented default, so no lazy
 * set-up is needed and nothing is allocated (nothing to leak). */
static _Thread_local nb_generator nb__tls_generator;

/* ---- Philox 4x32-10 ----------------------------------------------------------------------- */
#define NB__PHILOX_M0 0xD2511F53u
#define NB__PHILOX_M1 0xCD9E8D57u
#define NB__PHILOX_W0 0x9E3779B9u
#define NB__PHILOX_W1 0xBB67AE85u

static inline void nb__philox_block(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                    uint32_t k0, uint32_t k1, uint32_t out[4]) {
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += NB__PHILOX_W0;
            k1 += NB__PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)NB__PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)NB__PHILOX_M1 * c2;
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

void nb_philox4x32(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
    if (!counter || !key || !out) return;
    nb__philox_block(counter[0], counter[1], counter[2], counter[3], key[0], key[1], out);
}

/* The words of block b (relative to offset) of a generator state. */
typedef struct nb__philox_state {
    uint64_t seed, stream, offset;
} nb__philox_state;

static inline void nb__state_block(const nb__philox_state *s, uint64_t b, uint32_t w[4]) {
    uint64_t c = s->offset + b;
    nb__philox_block((uint32_t)c, (uint32_t)(c >> 32), (uint32_t)s->stream,
                     (uint32_t)(s->stream >> 32), (uint32_t)s->seed,
                     (uint32_t)(s->seed >> 32), w);
}

/* ---- generators --------------------------------------------------------------------------- */
nb_generator *nb_generator_new(uint64_t seed) {
    nb_generator *g = calloc(1, sizeof *g);
    if (!g) {
        nb__error(NB_ENOMEM, "generator_new: out of memory");
        return NULL;
    }
    g->seed = seed;
    g->heap = true;
    return g;
}

void nb_generator_free(nb_generator *g) {
    if (g && g->heap) free(g);
}

static nb_generator *nb__gen(nb_generator *g) { return g ? g : &nb__tls_generator; }
static const nb_generator *nb__cgen(const nb_generator *g) {
    return g ? g : &nb__tls_generator;
}

nb_status nb_generator_set_stream(nb_generator *g, uint64_t stream) {
    g = nb__gen(g);
    g->stream = stream;
    g->offset = 0;
    return NB_OK;
}

uint64_t nb_generator_seed(const nb_generator *g) { return nb__cgen(g)->seed; }
uint64_t nb_generator_stream(const nb_generator *g) { return nb__cgen(g)->stream; }
uint64_t nb_generator_offset(const nb_generator *g) { return nb__cgen(g)->offset; }

nb_status nb_generator_set_offset(nb_generator *g, uint64_t offset) {
    nb__gen(g)->offset = offset;
    return NB_OK;
}

nb_generator *nb_default_generator(void) { return &nb__tls_generator; }

void nb_manual_seed(uint64_t seed) {
    nb__tls_generator.seed = seed;
    nb__tls_generator.stream = 0;
    nb__tls_generator.offset = 0;
}

/* ---- argument checks ---------------------------------------------------------------------- */
static bool nb__valid_dtype(nb_dtype dt) { return (int)dt >= 0 && dt < NB_DTYPE_COUNT; }

static bool nb__check_shape(const int64_t *shape, int ndim, const char *op) {
    if (ndim < 0 || ndim > NB_MAX_DIMS) {
        nb__error(NB_EINVAL, "%s: ndim %d is out of range [0, %d]", op, ndim, NB_MAX_DIMS);
        return false;
    }
    if (ndim > 0 && !shape) {
        nb__error(NB_ENULL, "%s: shape is NULL but ndim is %d", op, ndim);
        return false;
    }
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) {
            char buf[NB__SHAPE_STR];
            nb__error(NB_EINVAL, "%s: negative dimension %lld in shape %s", op,
                      (long long)shape[d], nb__shape_str(shape, ndim, buf));
            return false;
        }
    }
    return true;
}

static bool nb__check_float_dtype(nb_dtype dt, const char *op) {
    if (!nb__valid_dtype(dt)) {
        nb__error(NB_EDTYPE, "%s: invalid dtype %d", op, (int)dt);
        return false;
    }
    if (!nb_dtype_is_float(dt)) {
        nb__error(NB_EDTYPE, "%s: dtype %s is not supported (float dtypes only: f32, f64, "
                  "f16, bf16)", op, nb_dtype_name(dt));
        return false;
    }
    return true;
}

/* Largest finite magnitude of a float dtype. */
static double nb__float_max(nb_dtype dt) {
    switch (dt) {
    case NB_F64: return DBL_MAX;
    case NB_F16: return 65504.0;
    case NB_BF16: return 3.3895313892515355e38;
    default: return FLT_MAX;
    }
}

/* ---- kernels -------------------------------------------------------------------------------
 * The work is split into chunks of NB__RNG_CHUNK elements (a multiple of 4, so a chunk
 * starts on a block boundary for every layout); each chunk computes its values into a
 * local buffer from the blocks it covers, then converts them into the output. Chunks are
 * independent, so any thread may take any chunk. */
#define NB__RNG_CHUNK 1024
#define NB__RNG_GRAIN 16384

typedef enum nb__rng_kind {
    NB__RNG_UNIFORM,
    NB__RNG_NORMAL,
    NB__RNG_RANDINT,
    NB__RNG_BERNOULLI,
} nb__rng_kind;

typedef struct nb__rng_job {
    nb__rng_kind kind;
    nb_dtype dtype;
    nb__philox_state st;
    int per_block; /* elements per Philox block: 4 or 2 */
    double a, b;   /* uniform: lo, hi; normal: mean, std; bernoulli: p */
    int64_t ilo;   /* randint: lo */
    uint64_t range; /* randint: hi - lo */
    /* uniform: the largest value of the dtype below hi (only used when hi > lo). */
    double below_hi_d;
    float below_hi_f;
    uint16_t below_hi_h;
} nb__rng_job;

#define NB__TWO_PI 6.283185307179586476925286766559
#define NB__INV_2_24 (1.0 / 16777216.0)
#define NB__INV_2_32 (1.0 / 4294967296.0)
#define NB__INV_2_53 (1.0 / 9007199254740992.0)

static inline uint64_t nb__word64(const uint32_t *w, int k) {
    return ((uint64_t)w[2 * k] << 32) | w[2 * k + 1];
}

/* Values of elements [first, first + n) (first a multiple of 4) as doubles (float kinds)
 * or integers (randint). */
static void nb__rng_values(const nb__rng_job *j, int64_t first, int64_t n, double *dv,
                           int64_t *iv) {
    int per = j->per_block;
    uint64_t b0 = (uint64_t)(first / per);
    int64_t nblocks = (n + per - 1) / per;
    for (int64_t bi = 0; bi < nblocks; bi++) {
        uint32_t w[4];
        nb__state_block(&j->st, b0 + (uint64_t)bi, w);
        double v[4];
        int64_t q[4];
        switch (j->kind) {
        case NB__RNG_UNIFORM:
            if (per == 4) {
                for (int k = 0; k < 4; k++)
                    v[k] = j->a + (j->b - j->a) * ((double)(w[k] >> 8) * NB__INV_2_24);
            } else {
                for (int k = 0; k < 2; k++)
                    v[k] = j->a + (j->b - j->a) *
                                      ((double)(nb__word64(w, k) >> 11) * NB__INV_2_53);
            }
            break;
        case NB__RNG_NORMAL:
            if (per == 4) {
                for (int p = 0; p < 2; p++) {
                    double u1 = ((double)w[2 * p] + 1.0) * NB__INV_2_32;
                    double u2 = (double)w[2 * p + 1] * NB__INV_2_32;
                    double r = sqrt(-2.0 * log(u1));
                    v[2 * p] = j->a + j->b * (r * cos(NB__TWO_PI * u2));
                    v[2 * p + 1] = j->a + j->b * (r * sin(NB__TWO_PI * u2));
                }
            } else {
                double u1 = ((double)(nb__word64(w, 0) >> 11) + 1.0) * NB__INV_2_53;
                double u2 = (double)(nb__word64(w, 1) >> 11) * NB__INV_2_53;
                double r = sqrt(-2.0 * log(u1));
                v[0] = j->a + j->b * (r * cos(NB__TWO_PI * u2));
                v[1] = j->a + j->b * (r * sin(NB__TWO_PI * u2));
            }
            break;
        case NB__RNG_RANDINT:
            if (per == 4) {
                for (int k = 0; k < 4; k++)
                    q[k] = (int64_t)((uint64_t)j->ilo + (((uint64_t)w[k] * j->range) >> 32));
            } else {
                for (int k = 0; k < 2; k++) {
                    unsigned __int128 m = (unsigned __int128)nb__word64(w, k) * j->range;
                    q[k] = (int64_t)((uint64_t)j->ilo + (uint64_t)(m >> 64));
                }
            }
            break;
        case NB__RNG_BERNOULLI:
            for (int k = 0; k < 4; k++) v[k] = ((double)w[k] * NB__INV_2_32 < j->a) ? 1.0 : 0.0;
            break;
        }
        int64_t base = bi * per;
        for (int k = 0; k < per && base + k < n; k++) {
            if (j->kind == NB__RNG_RANDINT) iv[base + k] = q[k];
            else dv[base + k] = v[k];
        }
    }
}

static void nb__rng_store(const nb__rng_job *j, const double *dv, const int64_t *iv,
                          char *dst, int64_t n) {
    bool clamp = j->kind == NB__RNG_UNIFORM && j->b > j->a;
    double hi = j->b;
    if (j->kind == NB__RNG_RANDINT) {
        switch (j->dtype) {
        case NB_I64: memcpy(dst, iv, (size_t)n * sizeof(int64_t)); return;
        case NB_I32:
            for (int64_t i = 0; i < n; i++) ((int32_t *)dst)[i] = (int32_t)iv[i];
            return;
        case NB_U8:
            for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = (uint8_t)iv[i];
            return;
        case NB_BOOL:
            for (int64_t i = 0; i < n; i++) ((bool *)dst)[i] = iv[i] != 0;
            return;
        default: {
            /* Float dtypes: the range was checked to be exactly representable. */
            double tmp[NB__RNG_CHUNK];
            for (int64_t i = 0; i < n; i++) tmp[i] = (double)iv[i];
            nb__rng_job fj = *j;
            fj.kind = NB__RNG_BERNOULLI; /* plain store, no clamping */
            nb__rng_store(&fj, tmp, NULL, dst, n);
            return;
        }
        }
    }
    switch (j->dtype) {
    case NB_F64: {
        double *o = (double *)dst;
        for (int64_t i = 0; i < n; i++) {
            double x = dv[i];
            o[i] = (clamp && x >= hi) ? j->below_hi_d : x;
        }
        return;
    }
    case NB_F32: {
        float *o = (float *)dst;
        for (int64_t i = 0; i < n; i++) {
            float x = (float)dv[i];
            o[i] = (clamp && (double)x >= hi) ? j->below_hi_f : x;
        }
        return;
    }
    case NB_F16:
    case NB_BF16: {
        float f[NB__RNG_CHUNK];
        uint16_t *o = (uint16_t *)dst;
        for (int64_t i = 0; i < n; i++) f[i] = (float)dv[i];
        if (j->dtype == NB_F16) nb__f32_to_f16_n(f, o, n);
        else nb__f32_to_bf16_n(f, o, n);
        if (clamp) {
            for (int64_t i = 0; i < n; i++) {
                float back = j->dtype == NB_F16 ? nb_f16_to_f32(o[i]) : nb_bf16_to_f32(o[i]);
                if ((double)back >= hi) o[i] = j->below_hi_h;
            }
        }
        return;
    }
    case NB_I32:
        for (int64_t i = 0; i < n; i++) ((int32_t *)dst)[i] = (int32_t)dv[i];
        return;
    case NB_I64:
        for (int64_t i = 0; i < n; i++) ((int64_t *)dst)[i] = (int64_t)dv[i];
        return;
    case NB_U8:
        for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = (uint8_t)dv[i];
        return;
    case NB_BOOL:
        for (int64_t i = 0; i < n; i++) ((bool *)dst)[i] = dv[i] != 0.0;
        return;
    default: NB__ASSERT(!"unreachable dtype");
    }
}

/* Fill out (contiguous, n elements) and advance g past the blocks used. */
static void nb__rng_run(nb__rng_job *j, nb_generator *g, nb_tensor *out) {
    int64_t n = nb_numel(out);
    j->st = (nb__philox_state){g->seed, g->stream, g->offset};
    char *dst = nb__ptr(out);
    size_t esz = nb_dtype_size(j->dtype);
    int64_t nchunks = (n + NB__RNG_CHUNK - 1) / NB__RNG_CHUNK;
    int nthreads = nb__threads_for(n, NB__RNG_GRAIN);
    (void)nthreads;
#pragma omp parallel for schedule(static) if (nthreads > 1) num_threads(nthreads)
    for (int64_t c = 0; c < nchunks; c++) {
        double dv[NB__RNG_CHUNK];
        int64_t iv[NB__RNG_CHUNK];
        int64_t first = c * NB__RNG_CHUNK;
        int64_t m = n - first < NB__RNG_CHUNK ? n - first : NB__RNG_CHUNK;
        nb__rng_values(j, first, m, dv, iv);
        nb__rng_store(j, dv, iv, dst + (size_t)first * esz, m);
    }
    g->offset += (uint64_t)((n + j->per_block - 1) / j->per_block);
}

/* ---- uniform --------------------------------------------------------------------------- */
static uint16_t nb__half_nextdown(uint16_t h) {
    if (h == 0x0000) return 0x8001;           /* +0 -> smallest negative subnormal */
    if (h & 0x8000) return (uint16_t)(h + 1); /* negative: magnitude grows */
    return (uint16_t)(h - 1);
}

/* The largest values of the dtype strictly below hi (hi finite). */
static void nb__below_hi(nb__rng_job *j) {
    double hi = j->b;
    switch (j->dtype) {
    case NB_F64: j->below_hi_d = nextafter(hi, -INFINITY); break;
    case NB_F32: {
        float x = (float)hi;
        while ((double)x >= hi) x = nextafterf(x, -INFINITY);
        j->below_hi_f = x;
        break;
    }
    case NB_F16:
    case NB_BF16: {
        bool f16 = j->dtype == NB_F16;
        uint16_t h = f16 ? nb_f32_to_f16((float)hi) : nb_f32_to_bf16((float)hi);
        while ((double)(f16 ? nb_f16_to_f32(h) : nb_bf16_to_f32(h)) >= hi)
            h = nb__half_nextdown(h);
        j->below_hi_h = h;
        break;
    }
    default: break;
    }
}

nb_tensor *nb_uniform(const int64_t *shape, int ndim, nb_dtype dt, double lo, double hi,
                      nb_generator *g) {
    const char *op = "uniform";
    if (!nb__check_shape(shape, ndim, op) || !nb__check_float_dtype(dt, op)) return NULL;
    double fmax = nb__float_max(dt);
    if (!(lo <= hi) || !(fabs(lo) <= fmax) || !(fabs(hi) <= fmax) || !isfinite(hi - lo)) {
        nb__error(NB_EINVAL, "uniform: the range [%g, %g) is not a finite interval with "
                  "lo <= hi in dtype %s", lo, hi, nb_dtype_name(dt));
        return NULL;
    }
    nb_tensor *out = nb__empty(shape, ndim, dt, NB_CPU);
    if (!out) return NULL;
    nb__rng_job j = {.kind = NB__RNG_UNIFORM, .dtype = dt, .a = lo, .b = hi,
                     .per_block = dt == NB_F64 ? 2 : 4};
    if (hi > lo) nb__below_hi(&j);
    nb__rng_run(&j, nb__gen(g), out);
    return out;
}

nb_tensor *nb_rand(const int64_t *shape, int ndim, nb_dtype dt, nb_generator *g) {
    const char *op = "rand";
    if (!nb__check_shape(shape, ndim, op) || !nb__check_float_dtype(dt, op)) return NULL;
    return nb_uniform(shape, ndim, dt, 0.0, 1.0, g);
}

/* ---- normal ------------------------------------------------------------------------------ */
nb_tensor *nb_normal(const int64_t *shape, int ndim, nb_dtype dt, double mean, double std,
                     nb_generator *g) {
    const char *op = "normal";
    if (!nb__check_shape(shape, ndim, op) || !nb__check_float_dtype(dt, op)) return NULL;
    if (!isfinite(mean) || !isfinite(std) || std < 0) {
        nb__error(NB_EINVAL, "normal: mean must be finite and std finite and >= 0 "
                  "(got mean %g, std %g)", mean, std);
        return NULL;
    }
    nb_tensor *out = nb__empty(shape, ndim, dt, NB_CPU);
    if (!out) return NULL;
    nb__rng_job j = {.kind = NB__RNG_NORMAL, .dtype = dt, .a = mean, .b = std,
                     .per_block = dt == NB_F64 ? 2 : 4};
    nb__rng_run(&j, nb__gen(g), out);
    return out;
}

nb_tensor *nb_randn(const int64_t *shape, int ndim, nb_dtype dt, nb_generator *g) {
    const char *op = "randn";
    if (!nb__check_shape(shape, ndim, op) || !nb__check_float_dtype(dt, op)) return NULL;
    return nb_normal(shape, ndim, dt, 0.0, 1.0, g);
}

/* ---- randint ----------------------------------------------------------------------------- */
nb_tensor *nb_randint(const int64_t *shape, int ndim, nb_dtype dt, int64_t lo, int64_t hi,
                      nb_generator *g) {
    const char *op = "randint";
    if (!nb__check_shape(shape, ndim, op)) return NULL;
    if (!nb__valid_dtype(dt)) {
        nb__error(NB_EDTYPE, "randint: invalid dtype %d", (int)dt);
        return NULL;
    }
    if (hi <= lo) {
        nb__error(NB_EINVAL, "randint: empty range [%lld, %lld) (hi must be > lo)",
                  (long long)lo, (long long)hi);
        return NULL;
    }
    /* Every value of [lo, hi) must be exactly representable in the dtype (for float
     * dtypes: integers up to 2^mantissa bits), so no value can round to hi or beyond. */
    int64_t dmin, dmax;
    switch (dt) {
    case NB_I32: dmin = INT32_MIN; dmax = INT32_MAX; break;
    case NB_I64: dmin = INT64_MIN; dmax = INT64_MAX; break;
    case NB_U8: dmin = 0; dmax = 255; break;
    case NB_BOOL: dmin = 0; dmax = 1; break;
    case NB_F32: dmin = -(INT64_C(1) << 24); dmax = INT64_C(1) << 24; break;
    case NB_F64: dmin = -(INT64_C(1) << 53); dmax = INT64_C(1) << 53; break;
    case NB_F16: dmin = -(INT64_C(1) << 11); dmax = INT64_C(1) << 11; break;
    default: /* NB_BF16 */ dmin = -(INT64_C(1) << 8); dmax = INT64_C(1) << 8; break;
    }
    if (lo < dmin || hi - 1 > dmax) {
        nb__error(NB_EINVAL, "randint: range [%lld, %lld) does not fit dtype %s (values "
                  "must lie in [%lld, %lld])", (long long)lo, (long long)hi,
                  nb_dtype_name(dt), (long long)dmin, (long long)dmax);
        return NULL;
    }
    nb_tensor *out = nb__empty(shape, ndim, dt, NB_CPU);
    if (!out) return NULL;
    uint64_t range = (uint64_t)hi - (uint64_t)lo;
    nb__rng_job j = {.kind = NB__RNG_RANDINT, .dtype = dt, .ilo = lo, .range = range,
                     .per_block = range <= (UINT64_C(1) << 32) ? 4 : 2};
    nb__rng_run(&j, nb__gen(g), out);
    return out;
}

/* ---- bernoulli --------------------------------------------------------------------------- */
nb_tensor *nb_bernoulli(const int64_t *shape, int ndim, nb_dtype dt, double p,
                        nb_generator *g) {
    const char *op = "bernoulli";
    if (!nb__check_shape(shape, ndim, op)) return NULL;
    if (!nb__valid_dtype(dt)) {
        nb__error(NB_EDTYPE, "bernoulli: invalid dtype %d", (int)dt);
        return NULL;
    }
    if (!(p >= 0.0 && p <= 1.0)) {
        nb__error(NB_EINVAL, "bernoulli: probability %g is outside [0, 1]", p);
        return NULL;
    }
    nb_tensor *out = nb__empty(shape, ndim, dt, NB_CPU);
    if (!out) return NULL;
    nb__rng_job j = {.kind = NB__RNG_BERNOULLI, .dtype = dt, .a = p, .per_block = 4};
    nb__rng_run(&j, nb__gen(g), out);
    return out;
}

/* ---- randperm ---------------------------------------------------------------------------- */
nb_tensor *nb_randperm(int64_t n, nb_generator *g) {
    if (n < 0) {
        nb__error(NB_EINVAL, "randperm: n must be >= 0 (got %lld)", (long long)n);
        return NULL;
    }
    nb_tensor *out = nb__empty((int64_t[]){n}, 1, NB_I64, NB_CPU);
    if (!out) return NULL;
    g = nb__gen(g);
    nb__philox_state st = {g->seed, g->stream, g->offset};
    int64_t *p = (int64_t *)nb__ptr(out);
    for (int64_t i = 0; i < n; i++) p[i] = i;
    uint32_t w[4];
    uint64_t k = 0; /* swaps done: block k / 2, 64-bit word k % 2 */
    for (int64_t i = n - 1; i >= 1; i--, k++) {
        if (k % 2 == 0) nb__state_block(&st, k / 2, w);
        uint64_t x = nb__word64(w, (int)(k % 2));
        int64_t jj = (int64_t)(((unsigned __int128)x * (uint64_t)(i + 1)) >> 64);
        int64_t t = p[i];
        p[i] = p[jj];
        p[jj] = t;
    }
    g->offset += (k + 1) / 2;
    return out;
}
