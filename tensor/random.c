/* tensor/random.c - counter-based random numbers (Philox 4x32-10): generators, and the op
 * side of the random tensor constructors of nabla/random.h (rand, uniform, randn, normal,
 * randint, bernoulli, randperm; on the CPU or, with the _on forms, any device) and of the
 * in-place fills nb_uniform_ / nb_normal_ (any device; nn/init.c initializes with them).
 *
 * The op side checks arguments, allocates the output on its device, hands the generator's
 * state (seed, stream, offset) to the device's `random` / `randperm` kernel
 * (tensor/kernels/random.h; the CPU's in cpu/random.c) and then advances the offset past
 * the blocks used. The offset advances the same on every device, the meta device included
 * (where no kernel runs), so a stream stays aligned whatever device drew from it.
 *
 * Philox 4x32-10 is the generator of Salmon, Moraes, Dror and Shaw, "Parallel random
 * numbers: as easy as 1, 2, 3" (SC11): a bijection of a 128-bit counter under a 64-bit
 * key, 10 rounds with multipliers 0xD2511F53 / 0xCD9E8D57 and Weyl key increments
 * 0x9E3779B9 / 0xBB67AE85. Because a block depends only on (counter, key), any element of
 * a random tensor can be computed independently of every other one, which is what makes
 * results independent of the thread count and of the device (docs/architecture.md rule 5).
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
#include "tensor/tape.h"
#include "tensor/backend.h"
#include "tensor/handle.h"
#include "tensor/tensor_impl.h"
#include "tensor/philox.h"

struct nb_generator {
    nb__obj h; /* a checked handle (tensor/handle.h) */
    uint64_t seed;
    uint64_t stream;
    uint64_t offset;
    /* true for generators from nb_generator_new; thread default generators are static
     * thread-local storage and must never be freed. */
    bool heap;
};

/* Zero-initialized = seed 0, stream 0, offset 0: the documented default, so no lazy
 * set-up is needed and nothing is allocated (nothing to leak). */
static _Thread_local nb_generator nb__tls_generator = {
    .h = {.magic = NB__OBJ_LIVE, .kind = NB__OBJ_GENERATOR, .size = sizeof(nb_generator)}};

/* ---- Philox 4x32-10: nb__philox_block (tensor/philox.h) ---------------------------------- */
void nb_philox4x32(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
    if (!counter || !key || !out) return;
    nb__philox_block(counter[0], counter[1], counter[2], counter[3], key[0], key[1], out);
}

/* ---- generators --------------------------------------------------------------------------- */
nb_generator *nb_generator_new(uint64_t seed) {
    nb_generator *g = nb__obj_alloc(sizeof *g, NB__OBJ_GENERATOR);
    if (!g) {
        nb__error(NB_ENOMEM, "generator_new: out of memory");
        return NULL;
    }
    g->seed = seed;
    g->heap = true;
    return g;
}

void nb_generator_free(nb_generator *g) {
    if (g && nb__obj_ok(g, NB__OBJ_GENERATOR, "generator_free") && g->heap) nb__obj_free(g);
}

/* g, or the thread's default generator for NULL; NULL (error set) for a freed handle. */
static nb_generator *nb__gen(nb_generator *g, const char *op) {
    if (!g) return &nb__tls_generator;
    return nb__obj_ok(g, NB__OBJ_GENERATOR, op) ? g : NULL;
}
static const nb_generator *nb__cgen(const nb_generator *g, const char *op) {
    return nb__gen(nb__unconst(g), op);
}

nb_status nb_generator_set_stream(nb_generator *g, uint64_t stream) {
    if (!(g = nb__gen(g, "generator_set_stream"))) return nb_last_status();
    g->stream = stream;
    g->offset = 0;
    return NB_OK;
}

uint64_t nb_generator_seed(const nb_generator *g) {
    return (g = nb__cgen(g, "generator_seed")) ? g->seed : 0;
}
uint64_t nb_generator_stream(const nb_generator *g) {
    return (g = nb__cgen(g, "generator_stream")) ? g->stream : 0;
}
uint64_t nb_generator_offset(const nb_generator *g) {
    return (g = nb__cgen(g, "generator_offset")) ? g->offset : 0;
}

nb_status nb_generator_set_offset(nb_generator *g, uint64_t offset) {
    if (!(g = nb__gen(g, "generator_set_offset"))) return nb_last_status();
    g->offset = offset;
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


/* ---- running the kernels -------------------------------------------------------------------- */
/* Fill out with the distribution set up in a, from g's stream, then advance g past the
 * blocks used (also on the meta device, where the kernel does not run). */
static nb_status nb__draw_into(nb_tensor *out, nb__random_args *a, nb_generator *g,
                               const char *op) {
    if (!(g = nb__gen(g, op))) return nb_last_status();
    nb__view_init(&a->out, out);
    a->seed = g->seed;
    a->stream = g->stream;
    a->offset = g->offset;
    int64_t n = nb_numel(out);
    nb_status st = nb__run_random(nb__device_of(out), op, a);
    if (st == NB_OK) g->offset += (uint64_t)((n + a->per_block - 1) / a->per_block);
    return st;
}

/* A new tensor on dev drawn as a says; NULL + error on failure. */
static nb_tensor *nb__draw(nb_device dev, const int64_t *shape, int ndim, nb_dtype dt,
                           nb__random_args *a, nb_generator *g, const char *op) {
    nb_tensor *out = nb__empty(shape, ndim, dt, dev);
    if (!out) return NULL;
    if (nb__draw_into(out, a, g, op) != NB_OK) {
        nb_tensor_free(nb__scope_take(out));
        return NULL;
    }
    return out;
}

/* Checks shared by the in-place fills: a float tensor that may be written. */
static bool nb__check_fill_target(nb_tensor *t, const char *op) {
    return nb__arg_ok(t, op, "t") && nb__check_float_dtype(t->dtype, op) &&
           nb__inplace_ok(t, op);
}

/* ---- uniform --------------------------------------------------------------------------- */
static uint16_t nb__half_nextdown(uint16_t h) {
    if (h == 0x0000) return 0x8001;           /* +0 -> smallest negative subnormal */
    if (h & 0x8000) return (uint16_t)(h + 1); /* negative: magnitude grows */
    return (uint16_t)(h - 1);
}

/* The largest value of dtype dt strictly below hi (hi finite), into a's below_hi field. */
static void nb__below_hi(nb__random_args *a, nb_dtype dt, double hi) {
    switch (dt) {
    case NB_F64: a->below_hi_d = nextafter(hi, -INFINITY); break;
    case NB_F32: {
        float x = (float)hi;
        while ((double)x >= hi) x = nextafterf(x, -INFINITY);
        a->below_hi_f = x;
        break;
    }
    case NB_F16:
    case NB_BF16: {
        bool f16 = dt == NB_F16;
        uint16_t h = f16 ? nb_f32_to_f16((float)hi) : nb_f32_to_bf16((float)hi);
        while ((double)(f16 ? nb_f16_to_f32(h) : nb_bf16_to_f32(h)) >= hi)
            h = nb__half_nextdown(h);
        a->below_hi_h = h;
        break;
    }
    default: break;
    }
}

/* Uniform [lo, hi) args for float dtype dt; false + error when the range is not valid. */
static bool nb__uniform_args(nb_dtype dt, double lo, double hi, const char *op,
                             nb__random_args *a) {
    double fmax = nb__float_max(dt);
    if (!(lo <= hi) || !(fabs(lo) <= fmax) || !(fabs(hi) <= fmax) || !isfinite(hi - lo)) {
        nb__error(NB_EINVAL, "%s: the range [%g, %g) is not a finite interval with "
                  "lo <= hi in dtype %s", op, lo, hi, nb_dtype_name(dt));
        return false;
    }
    *a = (nb__random_args){.dist = NB__RANDOM_UNIFORM, .a = lo, .b = hi,
                           .per_block = dt == NB_F64 ? 2 : 4};
    if (hi > lo) nb__below_hi(a, dt, hi);
    return true;
}

nb_tensor *nb_uniform_on(nb_device dev, const int64_t *shape, int ndim, nb_dtype dt, double lo,
                         double hi, nb_generator *g) {
    const char *op = "uniform";
    nb__random_args a;
    if (!nb__check_shape(shape, ndim, op) || !nb__check_float_dtype(dt, op) ||
        !nb__uniform_args(dt, lo, hi, op, &a))
        return NULL;
    return nb__draw(dev, shape, ndim, dt, &a, g, op);
}

nb_tensor *nb_uniform(const int64_t *shape, int ndim, nb_dtype dt, double lo, double hi,
                      nb_generator *g) {
    return nb_uniform_on(nb_default_device(), shape, ndim, dt, lo, hi, g);
}

nb_tensor *nb_rand_on(nb_device dev, const int64_t *shape, int ndim, nb_dtype dt,
                      nb_generator *g) {
    const char *op = "rand";
    if (!nb__check_shape(shape, ndim, op) || !nb__check_float_dtype(dt, op)) return NULL;
    return nb_uniform_on(dev, shape, ndim, dt, 0.0, 1.0, g);
}

nb_tensor *nb_rand(const int64_t *shape, int ndim, nb_dtype dt, nb_generator *g) {
    return nb_rand_on(nb_default_device(), shape, ndim, dt, g);
}

nb_status nb_uniform_(nb_tensor *t, double lo, double hi, nb_generator *g) {
    const char *op = "uniform_";
    nb__random_args a;
    if (!nb__check_fill_target(t, op) || !nb__uniform_args(t->dtype, lo, hi, op, &a))
        return nb_last_status();
    nb__bump_version(t);
    return nb__draw_into(t, &a, g, op);
}

/* ---- normal ------------------------------------------------------------------------------ */
static bool nb__normal_args(nb_dtype dt, double mean, double std, const char *op,
                            nb__random_args *a) {
    if (!isfinite(mean) || !isfinite(std) || std < 0) {
        nb__error(NB_EINVAL, "%s: mean must be finite and std finite and >= 0 "
                  "(got mean %g, std %g)", op, mean, std);
        return false;
    }
    *a = (nb__random_args){.dist = NB__RANDOM_NORMAL, .a = mean, .b = std,
                           .per_block = dt == NB_F64 ? 2 : 4};
    return true;
}

nb_tensor *nb_normal_on(nb_device dev, const int64_t *shape, int ndim, nb_dtype dt,
                        double mean, double std, nb_generator *g) {
    const char *op = "normal";
    nb__random_args a;
    if (!nb__check_shape(shape, ndim, op) || !nb__check_float_dtype(dt, op) ||
        !nb__normal_args(dt, mean, std, op, &a))
        return NULL;
    return nb__draw(dev, shape, ndim, dt, &a, g, op);
}

nb_tensor *nb_normal(const int64_t *shape, int ndim, nb_dtype dt, double mean, double std,
                     nb_generator *g) {
    return nb_normal_on(nb_default_device(), shape, ndim, dt, mean, std, g);
}

nb_tensor *nb_randn_on(nb_device dev, const int64_t *shape, int ndim, nb_dtype dt,
                       nb_generator *g) {
    const char *op = "randn";
    if (!nb__check_shape(shape, ndim, op) || !nb__check_float_dtype(dt, op)) return NULL;
    return nb_normal_on(dev, shape, ndim, dt, 0.0, 1.0, g);
}

nb_tensor *nb_randn(const int64_t *shape, int ndim, nb_dtype dt, nb_generator *g) {
    return nb_randn_on(nb_default_device(), shape, ndim, dt, g);
}

nb_status nb_normal_(nb_tensor *t, double mean, double std, nb_generator *g) {
    const char *op = "normal_";
    nb__random_args a;
    if (!nb__check_fill_target(t, op) || !nb__normal_args(t->dtype, mean, std, op, &a))
        return nb_last_status();
    nb__bump_version(t);
    return nb__draw_into(t, &a, g, op);
}

/* ---- randint ----------------------------------------------------------------------------- */
nb_tensor *nb_randint_on(nb_device dev, const int64_t *shape, int ndim, nb_dtype dt,
                         int64_t lo, int64_t hi, nb_generator *g) {
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
    uint64_t range = (uint64_t)hi - (uint64_t)lo;
    nb__random_args a = {.dist = NB__RANDOM_INT, .ilo = lo, .range = range,
                         .per_block = range <= (UINT64_C(1) << 32) ? 4 : 2};
    return nb__draw(dev, shape, ndim, dt, &a, g, op);
}

nb_tensor *nb_randint(const int64_t *shape, int ndim, nb_dtype dt, int64_t lo, int64_t hi,
                      nb_generator *g) {
    return nb_randint_on(nb_default_device(), shape, ndim, dt, lo, hi, g);
}

/* ---- bernoulli --------------------------------------------------------------------------- */
nb_tensor *nb_bernoulli_on(nb_device dev, const int64_t *shape, int ndim, nb_dtype dt,
                           double p, nb_generator *g) {
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
    nb__random_args a = {.dist = NB__RANDOM_BERNOULLI, .a = p, .per_block = 4};
    return nb__draw(dev, shape, ndim, dt, &a, g, op);
}

nb_tensor *nb_bernoulli(const int64_t *shape, int ndim, nb_dtype dt, double p,
                        nb_generator *g) {
    return nb_bernoulli_on(nb_default_device(), shape, ndim, dt, p, g);
}

/* ---- randperm ----------------------------------------------------------------------------
 * One sequential shuffle (its swaps depend on each other): the kernel runs it on one
 * thread of the device. The generator advances by ceil((n - 1) / 2) blocks. */
nb_tensor *nb_randperm_on(nb_device dev, int64_t n, nb_generator *g) {
    const char *op = "randperm";
    if (n < 0) {
        nb__error(NB_EINVAL, "randperm: n must be >= 0 (got %lld)", (long long)n);
        return NULL;
    }
    if (!(g = nb__gen(g, op))) return NULL;
    nb_tensor *out = nb__empty((int64_t[]){n}, 1, NB_I64, dev);
    if (!out) return NULL;
    nb__randperm_args a = {.out = (int64_t *)nb__ptr(out), .n = n, .seed = g->seed,
                           .stream = g->stream, .offset = g->offset};
    if (nb__run_randperm(dev, op, &a) != NB_OK) {
        nb_tensor_free(nb__scope_take(out));
        return NULL;
    }
    uint64_t swaps = n > 1 ? (uint64_t)(n - 1) : 0;
    g->offset += (swaps + 1) / 2;
    return out;
}

nb_tensor *nb_randperm(int64_t n, nb_generator *g) { return nb_randperm_on(nb_default_device(), n, g); }
