/* cpu/lm.c - CPU kernels of the language-model family (tensor/kernels/lm.h): RMSNorm forward
 * and backward, rotary position embeddings (and their inverse, the backward), the SwiGLU
 * product and its backward; and the family's entries of the kernel table. The f32 and f64
 * bodies come from cpu/lm_tmpl.h; this file holds the row sums they use, written out for
 * AVX-512 and AVX2 in f32, and the chunking of the weight gradient's row sums.
 *
 * Every loop runs on nabla's workers (nb__parallel_range). Elementwise loops are
 * `omp simd` loops the compiler vectorizes for the target (nb__fast_expf for SwiGLU's
 * exponential); the row sums are explicit: 16 double lanes, lane k summing the elements
 * j = k (mod 16) of the whole 16-element groups in order, the lanes then added in a fixed
 * tree and the tail last. The AVX-512, AVX2 and scalar paths compute exactly those sums
 * (every product summed is exact in double: a product of two floats), so the bits do not
 * depend on the instruction set or on the thread count. */
#include "cpu/backend.h"
#include "cpu/cpu_impl.h"
#include "cpu/fastmath.h"
#include "cpu/lm.h"
#include "cpu/norm.h"

#include <math.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "nabla/memory.h"

/* Row chunks of the weight gradient's sums: as layer norm's (cpu/norm.c), at least
 * LM_CHUNK_MIN elements each, at most NB__NORM_MAX_CHUNKS, decided by the shape alone. */
#define LM_CHUNK_MIN 16384

static int64_t lm_chunks(int64_t rows, int64_t rowlen) {
    if (rows <= 1) return 1;
    int64_t c = rows * (rowlen > 0 ? rowlen : 1) / LM_CHUNK_MIN;
    if (c > NB__NORM_MAX_CHUNKS) c = NB__NORM_MAX_CHUNKS;
    if (c > rows) c = rows;
    return c < 1 ? 1 : c;
}

static int lm_chunk_threads(int64_t work, int64_t nch) {
    int nt = nb__threads_for(work, NB__GRAIN);
    return nt > nch ? (int)nch : nt;
}

/* ---- the row sums ---------------------------------------------------------------------------- */
#define LANES 16
static inline double lane_sum(const double *a) {
    return (((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))) +
           (((a[8] + a[9]) + (a[10] + a[11])) + ((a[12] + a[13]) + (a[14] + a[15])));
}

#if defined(__AVX512F__)
/* 8 doubles of lanes [k, k + 8) */
#define VD __m512d
#define VD_ZERO() _mm512_setzero_pd()
#define VD_LOAD8(p) _mm512_cvtps_pd(_mm256_loadu_ps(p))
#define VD_MADD(a, b, c) _mm512_fmadd_pd((a), (b), (c))
#define VD_STORE(p, v) _mm512_storeu_pd((p), (v))
#define VD_N 8
#elif defined(__AVX2__)
#define VD __m256d
#define VD_ZERO() _mm256_setzero_pd()
#define VD_LOAD8(p) _mm256_cvtps_pd(_mm_loadu_ps(p))
#ifdef __FMA__
#define VD_MADD(a, b, c) _mm256_fmadd_pd((a), (b), (c))
#else
#define VD_MADD(a, b, c) _mm256_add_pd(_mm256_mul_pd((a), (b)), (c))
#endif
#define VD_STORE(p, v) _mm256_storeu_pd((p), (v))
#define VD_N 4
#endif

/* sum_j x_j^2 */
static inline double sumsq_f32(const float *x, int64_t n) {
    double a[LANES] = {0}, t = 0;
    int64_t j = 0;
#ifdef VD_N
    VD v[LANES / VD_N];
    for (int k = 0; k < LANES / VD_N; k++) v[k] = VD_ZERO();
    for (; j + LANES <= n; j += LANES)
        for (int k = 0; k < LANES / VD_N; k++) {
            const VD d = VD_LOAD8(x + j + k * VD_N);
            v[k] = VD_MADD(d, d, v[k]);
        }
    for (int k = 0; k < LANES / VD_N; k++) VD_STORE(a + k * VD_N, v[k]);
#endif
    for (; j + LANES <= n; j += LANES)
        for (int k = 0; k < LANES; k++) a[k] += (double)x[j + k] * (double)x[j + k];
    for (; j < n; j++) t += (double)x[j] * (double)x[j];
    return lane_sum(a) + t;
}

/* sum_j (g_j w_j) x_j, the product g w rounded to f32 first (g alone when w is NULL) */
static inline double sumgwx_f32(const float *g, const float *w, const float *x, int64_t n) {
    double a[LANES] = {0}, t = 0;
    int64_t j = 0;
#ifdef VD_N
    VD v[LANES / VD_N];
    for (int k = 0; k < LANES / VD_N; k++) v[k] = VD_ZERO();
    for (; j + LANES <= n; j += LANES)
        for (int k = 0; k < LANES / VD_N; k++) {
            const int64_t o = j + k * VD_N;
            VD gw;
            if (w) {
#if VD_N == 8
                gw = _mm512_cvtps_pd(_mm256_mul_ps(_mm256_loadu_ps(g + o), _mm256_loadu_ps(w + o)));
#else
                gw = _mm256_cvtps_pd(_mm_mul_ps(_mm_loadu_ps(g + o), _mm_loadu_ps(w + o)));
#endif
            } else {
                gw = VD_LOAD8(g + o);
            }
            v[k] = VD_MADD(gw, VD_LOAD8(x + o), v[k]);
        }
    for (int k = 0; k < LANES / VD_N; k++) VD_STORE(a + k * VD_N, v[k]);
#endif
    for (; j + LANES <= n; j += LANES)
        for (int k = 0; k < LANES; k++) {
            const float gw = w ? g[j + k] * w[j + k] : g[j + k];
            a[k] += (double)gw * (double)x[j + k];
        }
    for (; j < n; j++) {
        const float gw = w ? g[j] * w[j] : g[j];
        t += (double)gw * (double)x[j];
    }
    return lane_sum(a) + t;
}

static inline double sumsq_f64(const double *x, int64_t n) {
    double a[LANES] = {0}, t = 0;
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int k = 0; k < LANES; k++) a[k] += x[j + k] * x[j + k];
    for (; j < n; j++) t += x[j] * x[j];
    return lane_sum(a) + t;
}

static inline double sumgwx_f64(const double *g, const double *w, const double *x, int64_t n) {
    double a[LANES] = {0}, t = 0;
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int k = 0; k < LANES; k++) a[k] += (w ? g[j + k] * w[j + k] : g[j + k]) * x[j + k];
    for (; j < n; j++) t += (w ? g[j] * w[j] : g[j]) * x[j];
    return lane_sum(a) + t;
}

/* The inverse frequency of pair i: f32 as Hugging Face computes it (the exponent an f32
 * quotient, an f32 power, an f32 reciprocal), f64 in double. */
static inline float rot_inv_freq_f32(int64_t i, int64_t D, double base) {
    const float e = (float)(2 * i) / (float)D;
    return 1.0f / powf((float)base, e);
}
static inline double rot_inv_freq_f64(int64_t i, int64_t D, double base) {
    return 1.0 / pow(base, (double)(2 * i) / (double)D);
}

#define T float
#define S f32
#define EXP nb__fast_expf
#include "cpu/lm_tmpl.h"
#undef T
#undef S
#undef EXP

#define T double
#define S f64
#define EXP exp
#include "cpu/lm_tmpl.h"
#undef T
#undef S
#undef EXP

/* ---- the kernel table's entries: the ops hand in f32 or f64 ------------------------------- */
static nb_status cpu_rms_norm(const nb__rms_norm_args *a) {
    if (a->dtype == NB_F64)
        nb__cpu_rms_norm_fwd_f64(a->x, a->w, a->y, a->rstd, a->N, a->D, a->eps);
    else
        nb__cpu_rms_norm_fwd_f32(a->x, a->w, a->y, a->rstd, a->N, a->D, a->eps);
    return NB_OK;
}

static nb_status cpu_rms_norm_backward(const nb__rms_norm_backward_args *a) {
    if (a->dtype == NB_F64)
        return nb__cpu_rms_norm_bwd_f64(a->g, a->x, a->w, a->rstd, a->dx, a->dw, a->N, a->D);
    return nb__cpu_rms_norm_bwd_f32(a->g, a->x, a->w, a->rstd, a->dx, a->dw, a->N, a->D);
}

static nb_status cpu_rotary(const nb__rotary_args *a) {
    if (a->dtype == NB_F64)
        return nb__cpu_rotary_f64(a->x, a->y, a->N, a->T, a->H, a->D, a->offset, a->base,
                                  a->inverse);
    return nb__cpu_rotary_f32(a->x, a->y, a->N, a->T, a->H, a->D, a->offset, a->base,
                              a->inverse);
}

static nb_status cpu_swiglu(const nb__swiglu_args *a) {
    if (a->dtype == NB_F64) nb__cpu_swiglu_f64(a->a, a->b, a->y, a->n);
    else nb__cpu_swiglu_f32(a->a, a->b, a->y, a->n);
    return NB_OK;
}

static nb_status cpu_swiglu_backward(const nb__swiglu_backward_args *a) {
    if (a->dtype == NB_F64) nb__cpu_swiglu_bwd_f64(a->g, a->a, a->b, a->da, a->db, a->n);
    else nb__cpu_swiglu_bwd_f32(a->g, a->a, a->b, a->da, a->db, a->n);
    return NB_OK;
}

void nb__cpu_register_lm(nb__kernels *k) {
    k->rms_norm = cpu_rms_norm;
    k->rms_norm_backward = cpu_rms_norm_backward;
    k->rotary = cpu_rotary;
    k->swiglu = cpu_swiglu;
    k->swiglu_backward = cpu_swiglu_backward;
}
