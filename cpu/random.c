/* cpu/random.c - the CPU kernels of the random family: Philox 4x32-10 streams into tensors
 * (`random`: uniform, normal, randint, bernoulli) and the Fisher-Yates shuffle (`randperm`).
 *
 * Which words of which block make element i, and how words become values, is specified in
 * tensor/random.c (the op side, which also advances the generator); this file implements
 * exactly that. The work is split into chunks of RNG_CHUNK elements (a multiple of 4, so a
 * chunk starts on a block boundary for every layout); each chunk computes its values into
 * a local buffer from the blocks it covers, then converts them into the output. Chunks
 * are independent, so any thread may take any chunk and results never depend on the
 * thread count. */
#include <math.h>
#include <string.h>

#include "cpu/backend.h"
#include "cpu/cpu_impl.h"
#include "tensor/philox.h"

/* ---- Philox 4x32-10: nb__philox_block (tensor/philox.h) ---------------------------------- */
/* The words of block b (relative to offset) of the stream (seed, stream, offset). */
static inline void state_block(uint64_t seed, uint64_t stream, uint64_t offset, uint64_t b,
                               uint32_t w[4]) {
    uint64_t c = offset + b;
    nb__philox_block((uint32_t)c, (uint32_t)(c >> 32), (uint32_t)stream,
                     (uint32_t)(stream >> 32), (uint32_t)seed, (uint32_t)(seed >> 32), w);
}

static inline uint64_t word64(const uint32_t *w, int k) {
    return ((uint64_t)w[2 * k] << 32) | w[2 * k + 1];
}

/* ---- random ---------------------------------------------------------------------------------- */
#define RNG_CHUNK 1024
#define RNG_GRAIN 16384

#define TWO_PI 6.283185307179586476925286766559
#define INV_2_24 (1.0 / 16777216.0)
#define INV_2_32 (1.0 / 4294967296.0)
#define INV_2_53 (1.0 / 9007199254740992.0)

/* Values of elements [first, first + n) (first a multiple of 4) as doubles (float
 * distributions) or integers (NB__RANDOM_INT). */
static void rng_values(const nb__random_args *j, int64_t first, int64_t n, double *dv,
                       int64_t *iv) {
    int per = j->per_block;
    uint64_t b0 = (uint64_t)(first / per);
    int64_t nblocks = (n + per - 1) / per;
    for (int64_t bi = 0; bi < nblocks; bi++) {
        uint32_t w[4];
        state_block(j->seed, j->stream, j->offset, b0 + (uint64_t)bi, w);
        double v[4];
        int64_t q[4];
        switch (j->dist) {
        case NB__RANDOM_UNIFORM:
            if (per == 4) {
                for (int k = 0; k < 4; k++)
                    v[k] = j->a + (j->b - j->a) * ((double)(w[k] >> 8) * INV_2_24);
            } else {
                for (int k = 0; k < 2; k++)
                    v[k] = j->a + (j->b - j->a) * ((double)(word64(w, k) >> 11) * INV_2_53);
            }
            break;
        case NB__RANDOM_NORMAL:
            if (per == 4) {
                for (int p = 0; p < 2; p++) {
                    double u1 = ((double)w[2 * p] + 1.0) * INV_2_32;
                    double u2 = (double)w[2 * p + 1] * INV_2_32;
                    double r = sqrt(-2.0 * log(u1));
                    v[2 * p] = j->a + j->b * (r * cos(TWO_PI * u2));
                    v[2 * p + 1] = j->a + j->b * (r * sin(TWO_PI * u2));
                }
            } else {
                double u1 = ((double)(word64(w, 0) >> 11) + 1.0) * INV_2_53;
                double u2 = (double)(word64(w, 1) >> 11) * INV_2_53;
                double r = sqrt(-2.0 * log(u1));
                v[0] = j->a + j->b * (r * cos(TWO_PI * u2));
                v[1] = j->a + j->b * (r * sin(TWO_PI * u2));
            }
            break;
        case NB__RANDOM_INT:
            if (per == 4) {
                for (int k = 0; k < 4; k++)
                    q[k] = (int64_t)((uint64_t)j->ilo + (((uint64_t)w[k] * j->range) >> 32));
            } else {
                for (int k = 0; k < 2; k++) {
                    unsigned __int128 m = (unsigned __int128)word64(w, k) * j->range;
                    q[k] = (int64_t)((uint64_t)j->ilo + (uint64_t)(m >> 64));
                }
            }
            break;
        case NB__RANDOM_BERNOULLI:
            for (int k = 0; k < 4; k++) v[k] = ((double)w[k] * INV_2_32 < j->a) ? 1.0 : 0.0;
            break;
        }
        int64_t base = bi * per;
        for (int k = 0; k < per && base + k < n; k++) {
            if (j->dist == NB__RANDOM_INT) iv[base + k] = q[k];
            else dv[base + k] = v[k];
        }
    }
}

/* Convert n values into dst (contiguous, the output's dtype). `clamp`: uniform results
 * that reach hi are replaced by the largest value below it. */
static void rng_store_f(const nb__random_args *j, bool clamp, const double *dv, char *dst,
                        int64_t n) {
    nb_dtype dt = j->out.dtype;
    double hi = j->b;
    switch (dt) {
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
        float f[RNG_CHUNK];
        uint16_t *o = (uint16_t *)dst;
        for (int64_t i = 0; i < n; i++) f[i] = (float)dv[i];
        if (dt == NB_F16) nb__f32_to_f16_n(f, o, n);
        else nb__f32_to_bf16_n(f, o, n);
        if (clamp) {
            for (int64_t i = 0; i < n; i++) {
                float back = dt == NB_F16 ? nb_f16_to_f32(o[i]) : nb_bf16_to_f32(o[i]);
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

static void rng_store(const nb__random_args *j, const double *dv, const int64_t *iv, char *dst,
                      int64_t n) {
    if (j->dist != NB__RANDOM_INT) {
        rng_store_f(j, j->dist == NB__RANDOM_UNIFORM && j->b > j->a, dv, dst, n);
        return;
    }
    switch (j->out.dtype) {
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
        /* Float dtypes: the op checked the range is exactly representable. */
        double tmp[RNG_CHUNK];
        for (int64_t i = 0; i < n; i++) tmp[i] = (double)iv[i];
        rng_store_f(j, false, tmp, dst, n);
        return;
    }
    }
}

/* Whether v is laid out row-major without gaps (size-1 dims ignored). */
static bool view_contiguous(const nb__view *v) {
    int64_t expect = 1;
    for (int d = v->ndim - 1; d >= 0; d--) {
        if (v->shape[d] == 1) continue;
        if (v->strides[d] != expect) return false;
        expect *= v->shape[d];
    }
    return true;
}

/* Copy n contiguous elements of size es from src to the strided view v, starting at
 * row-major element `first`. */
static void scatter(const nb__view *v, size_t es, const char *src, int64_t first, int64_t n) {
    int64_t idx[NB_MAX_DIMS], off = 0, rem = first;
    for (int d = v->ndim - 1; d >= 0; d--) {
        idx[d] = rem % v->shape[d];
        rem /= v->shape[d];
        off += idx[d] * v->strides[d];
    }
    for (int64_t i = 0; i < n; i++) {
        memcpy(v->data + off * (int64_t)es, src + (size_t)i * es, es);
        for (int d = v->ndim - 1; d >= 0; d--) { /* next element in row-major order */
            off += v->strides[d];
            if (++idx[d] < v->shape[d]) break;
            off -= idx[d] * v->strides[d];
            idx[d] = 0;
        }
    }
}

typedef struct {
    const nb__random_args *a;
    int64_t n;
    size_t esz;
    bool contig;
} rng_job;

/* Chunks [lo, hi) of the output. */
static void rng_chunks(int64_t lo, int64_t hi, void *ctx) {
    const rng_job *j = ctx;
    const nb__view *v = &j->a->out;
    for (int64_t c = lo; c < hi; c++) {
        double dv[RNG_CHUNK];
        int64_t iv[RNG_CHUNK];
        int64_t first = c * RNG_CHUNK;
        int64_t m = j->n - first < RNG_CHUNK ? j->n - first : RNG_CHUNK;
        rng_values(j->a, first, m, dv, iv);
        if (j->contig) {
            rng_store(j->a, dv, iv, v->data + (size_t)first * j->esz, m);
        } else { /* a strided target (an in-place fill of a view): convert, then place */
            int64_t tmp[RNG_CHUNK]; /* 8 bytes per element: room for every dtype */
            rng_store(j->a, dv, iv, (char *)tmp, m);
            scatter(v, j->esz, (const char *)tmp, first, m);
        }
    }
}

static nb_status cpu_random(const nb__random_args *a) {
    const nb__view *v = &a->out;
    int64_t n = 1;
    for (int d = 0; d < v->ndim; d++) n *= v->shape[d];
    if (n == 0) return NB_OK;
    rng_job j = {a, n, nb_dtype_size(v->dtype), view_contiguous(v)};
    int64_t nchunks = (n + RNG_CHUNK - 1) / RNG_CHUNK;
    int nthreads = nb__threads_for(n, RNG_GRAIN);
    nb__parallel_range(nchunks, nthreads, rng_chunks, &j);
    return NB_OK;
}

/* ---- randperm ------------------------------------------------------------------------------ */
static nb_status cpu_randperm(const nb__randperm_args *a) {
    int64_t *p = a->out, n = a->n;
    for (int64_t i = 0; i < n; i++) p[i] = i;
    uint32_t w[4];
    uint64_t k = 0; /* swaps done: block k / 2, 64-bit word k % 2 */
    for (int64_t i = n - 1; i >= 1; i--, k++) {
        if (k % 2 == 0) state_block(a->seed, a->stream, a->offset, k / 2, w);
        uint64_t x = word64(w, (int)(k % 2));
        int64_t jj = (int64_t)(((unsigned __int128)x * (uint64_t)(i + 1)) >> 64);
        int64_t t = p[i];
        p[i] = p[jj];
        p[jj] = t;
    }
    return NB_OK;
}

void nb__cpu_register_random(nb__kernels *k) {
    k->random = cpu_random;
    k->randperm = cpu_randperm;
}
