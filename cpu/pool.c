/* cpu/pool.c - CPU kernels of 2-D max / average / adaptive average pooling (see cpu/pool.h),
 * forward and backward, registered into the conv family's entries.
 * One thread per plane at a time; windows are clipped to the input once per output row and
 * column, so the inner loops are plain loops over contiguous input rows. */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "cpu/cpu_impl.h"
#include "cpu/pool.h"

static int plane_threads(const nb__pool2d_geom *g) {
    int64_t per = g->H * g->W + g->OH * g->OW;
    int nt = nb__threads_for(g->planes * per, NB__GRAIN);
    if (nt > g->planes) nt = g->planes > 0 ? (int)g->planes : 1;
    return nt;
}

/* The planes of one call, for the range functions on nabla's workers (T is the macro's
 * element type, hence the void pointers). */
typedef struct pool_job {
    const nb__pool2d_geom *g;
    const void *x, *gy;
    void *y, *gx;
    int32_t *idx;
    const int32_t *cidx;
    bool cip, relu;
} pool_job;

#if defined(__AVX512F__)
#include <immintrin.h>
/* The 2x2/2 row of max2x2_row_f32 with AVX-512: 16 outputs per step and a masked last step,
 * so short rows (7 or 14 outputs in a CNN) need no scalar tail, whose data-dependent
 * branches measured twice as slow on random data. Same choices: NaN wins, ties keep the
 * first. */
static bool max2x2_row_avx512(const float *r0, const float *r1, float *yr, int32_t *ir,
                              int64_t OW, int32_t base, int32_t w, bool relu) {
    const __m512 zero = _mm512_setzero_ps();
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                           28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __m512i lane2 = _mm512_slli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                              11, 12, 13, 14, 15), 1);
    for (int64_t ow = 0; ow < OW; ow += 16) {
        int n = OW - ow < 16 ? (int)(OW - ow) : 16;
        __mmask16 mo = (__mmask16)((1u << n) - 1);
        __mmask16 mlo = (__mmask16)(n >= 8 ? 0xFFFF : (1u << (2 * n)) - 1);
        __mmask16 mhi = (__mmask16)(n <= 8 ? 0 : (1u << (2 * (n - 8))) - 1);
        const float *p0 = r0 + 2 * ow, *p1 = r1 + 2 * ow;
        __m512 l0 = _mm512_maskz_loadu_ps(mlo, p0), h0 = _mm512_maskz_loadu_ps(mhi, p0 + 16);
        __m512 l1 = _mm512_maskz_loadu_ps(mlo, p1), h1 = _mm512_maskz_loadu_ps(mhi, p1 + 16);
        __m512 a = _mm512_permutex2var_ps(l0, even, h0), b = _mm512_permutex2var_ps(l0, odd, h0);
        __m512 c = _mm512_permutex2var_ps(l1, even, h1), d = _mm512_permutex2var_ps(l1, odd, h1);
        if (relu) {
            /* max(0, v) returns v for NaN and -0, as v < 0 ? 0 : v does */
            a = _mm512_max_ps(zero, a), b = _mm512_max_ps(zero, b);
            c = _mm512_max_ps(zero, c), d = _mm512_max_ps(zero, d);
        }
        __m512 m = a;
        __m512i k = _mm512_setzero_si512();
        __mmask16 s = _mm512_cmp_ps_mask(b, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
        m = _mm512_mask_mov_ps(m, s, b), k = _mm512_mask_mov_epi32(k, s, _mm512_set1_epi32(1));
        s = _mm512_cmp_ps_mask(c, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(c, c, _CMP_UNORD_Q);
        m = _mm512_mask_mov_ps(m, s, c), k = _mm512_mask_mov_epi32(k, s, _mm512_set1_epi32(w));
        s = _mm512_cmp_ps_mask(d, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(d, d, _CMP_UNORD_Q);
        m = _mm512_mask_mov_ps(m, s, d);
        k = _mm512_mask_mov_epi32(k, s, _mm512_set1_epi32(w + 1));
        _mm512_mask_storeu_ps(yr + ow, mo, m);
        if (ir) {
            __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(base + 2 * (int32_t)ow),
                                           _mm512_add_epi32(lane2, k));
            if (relu)
                idx = _mm512_mask_mov_epi32(idx, _mm512_cmp_ps_mask(m, zero, _CMP_LE_OQ),
                                            _mm512_set1_epi32(-1));
            _mm512_mask_storeu_epi32(ir + ow, mo, idx);
        }
    }
    return true;
}
#define NB__MAX2X2_FAST_f32(r0, r1, yr, ir, OW, base, w, relu) \
    max2x2_row_avx512(r0, r1, yr, ir, OW, base, w, relu)
#elif defined(__AVX2__)
#include <immintrin.h>
/* The same with AVX2: 8 outputs per step. A short last step goes through small zero-padded
 * copies (AMD's masked AVX2 loads and stores are microcoded: far slower than the copies). */
static void max2x2_8_avx2(const float *p0, const float *p1, float *yr, int32_t *ir,
                          int32_t first, int32_t w, bool relu) {
    const __m256 zero = _mm256_setzero_ps();
    const __m256i lane2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    __m256 l0 = _mm256_loadu_ps(p0), h0 = _mm256_loadu_ps(p0 + 8);
    __m256 l1 = _mm256_loadu_ps(p1), h1 = _mm256_loadu_ps(p1 + 8);
    /* even / odd elements of 16, in order */
#define NB__DEINT(lo, hi, sel) \
    _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, sel)), 0xD8))
    __m256 a = NB__DEINT(l0, h0, 0x88), b = NB__DEINT(l0, h0, 0xDD);
    __m256 c = NB__DEINT(l1, h1, 0x88), d = NB__DEINT(l1, h1, 0xDD);
#undef NB__DEINT
    if (relu) {
        /* max(0, v) returns v for NaN and -0, as v < 0 ? 0 : v does */
        a = _mm256_max_ps(zero, a), b = _mm256_max_ps(zero, b);
        c = _mm256_max_ps(zero, c), d = _mm256_max_ps(zero, d);
    }
    __m256 m = a;
    __m256i k = _mm256_setzero_si256();
    __m256 s = _mm256_or_ps(_mm256_cmp_ps(b, m, _CMP_GT_OQ), _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
    m = _mm256_blendv_ps(m, b, s);
    k = _mm256_blendv_epi8(k, _mm256_set1_epi32(1), _mm256_castps_si256(s));
    s = _mm256_or_ps(_mm256_cmp_ps(c, m, _CMP_GT_OQ), _mm256_cmp_ps(c, c, _CMP_UNORD_Q));
    m = _mm256_blendv_ps(m, c, s);
    k = _mm256_blendv_epi8(k, _mm256_set1_epi32(w), _mm256_castps_si256(s));
    s = _mm256_or_ps(_mm256_cmp_ps(d, m, _CMP_GT_OQ), _mm256_cmp_ps(d, d, _CMP_UNORD_Q));
    m = _mm256_blendv_ps(m, d, s);
    k = _mm256_blendv_epi8(k, _mm256_set1_epi32(w + 1), _mm256_castps_si256(s));
    _mm256_storeu_ps(yr, m);
    if (ir) {
        __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(first), _mm256_add_epi32(lane2, k));
        if (relu)
            idx = _mm256_blendv_epi8(idx, _mm256_set1_epi32(-1),
                                     _mm256_castps_si256(_mm256_cmp_ps(m, zero, _CMP_LE_OQ)));
        _mm256_storeu_si256((__m256i *)(void *)ir, idx);
    }
}

static bool max2x2_row_avx2(const float *r0, const float *r1, float *yr, int32_t *ir,
                            int64_t OW, int32_t base, int32_t w, bool relu) {
    int64_t ow = 0;
    for (; ow + 8 <= OW; ow += 8)
        max2x2_8_avx2(r0 + 2 * ow, r1 + 2 * ow, yr + ow, ir ? ir + ow : NULL,
                      base + 2 * (int32_t)ow, w, relu);
    if (ow < OW) {
        size_t n = (size_t)(OW - ow);
        float t0[16] = {0}, t1[16] = {0}, ty[8];
        int32_t ti[8];
        memcpy(t0, r0 + 2 * ow, 2 * n * sizeof(float));
        memcpy(t1, r1 + 2 * ow, 2 * n * sizeof(float));
        max2x2_8_avx2(t0, t1, ty, ir ? ti : NULL, base + 2 * (int32_t)ow, w, relu);
        memcpy(yr + ow, ty, n * sizeof(float));
        if (ir) memcpy(ir + ow, ti, n * sizeof(int32_t));
    }
    return true;
}
#define NB__MAX2X2_FAST_f32(r0, r1, yr, ir, OW, base, w, relu) \
    max2x2_row_avx2(r0, r1, yr, ir, OW, base, w, relu)
#else
#define NB__MAX2X2_FAST_f32(r0, r1, yr, ir, OW, base, w, relu) false
#endif
#define NB__MAX2X2_FAST_f64(r0, r1, yr, ir, OW, base, w, relu) false

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

/* Adaptive windows: [floor(i*in/out), ceil((i+1)*in/out)). */
static inline int64_t ad_start(int64_t i, int64_t in, int64_t out) { return i * in / out; }
static inline int64_t ad_end(int64_t i, int64_t in, int64_t out) {
    return ((i + 1) * in + out - 1) / out;
}

#define NB__POOL_TYPED(T, S)                                                                \
    /* relu(v) as the elementwise kernel computes it (NaN and -0 pass). */                 \
    static inline T relu_##S(T v) { return v < 0 ? 0 : v; }                                \
                                                                                           \
    /* One output row of a 2x2/2 max pool from input rows r0, r1 (indices: base + offset  \
     * in the plane). Branch-free (v != v is isnan) with the same choices as the general   \
     * loop: NaN wins, ties keep the first. relu: of relu(x), index -1 where max <= 0. */  \
    static void max2x2_row_##S(const T *restrict r0, const T *restrict r1, T *restrict yr,  \
                               int32_t *restrict ir, int64_t OW, int32_t base, int32_t w,  \
                               bool relu) {                                                \
        if (NB__MAX2X2_FAST_##S(r0, r1, yr, ir, OW, base, w, relu)) return;                \
        if (!ir && !relu) {                                                                \
            for (int64_t ow = 0; ow < OW; ow++) {                                          \
                T a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];  \
                T m = a;                                                                   \
                m = ((b > m) | (b != b)) ? b : m;                                          \
                m = ((c > m) | (c != c)) ? c : m;                                          \
                m = ((d > m) | (d != d)) ? d : m;                                          \
                yr[ow] = m;                                                                \
            }                                                                              \
            return;                                                                        \
        }                                                                                  \
        for (int64_t ow = 0; ow < OW; ow++) { /* relu: the values as nb_relu gives them */  \
            T a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];      \
            if (relu) a = relu_##S(a), b = relu_##S(b), c = relu_##S(c), d = relu_##S(d);  \
            T m = a;                                                                       \
            int32_t k = 0;                                                                 \
            bool sel = (b > m) | (b != b);                                                 \
            m = sel ? b : m, k = sel ? 1 : k;                                              \
            sel = (c > m) | (c != c);                                                      \
            m = sel ? c : m, k = sel ? w : k;                                              \
            sel = (d > m) | (d != d);                                                      \
            m = sel ? d : m, k = sel ? w + 1 : k;                                          \
            yr[ow] = m;                                                                    \
            if (ir) ir[ow] = relu && m <= 0 ? -1 : base + 2 * (int32_t)ow + k;             \
        }                                                                                  \
    }                                                                                      \
                                                                                           \
    static void maxpool_fwd_planes_##S(int64_t lo, int64_t hi, void *job) {                \
        const pool_job *jb = job;                                                          \
        const nb__pool2d_geom *g = jb->g;                                                  \
        const T *x = jb->x;                                                                \
        T *y = jb->y;                                                                      \
        int32_t *idx = jb->idx;                                                            \
        int64_t H = g->H, W = g->W, OH = g->OH, OW = g->OW;                                \
        for (int64_t p = lo; p < hi; p++) {                                                \
            const T *xp = x + p * H * W;                                                   \
            T *yp = y + p * OH * OW;                                                       \
            int32_t *ip = idx ? idx + p * OH * OW : NULL;                                  \
            if (g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 && g->ph == 0 &&      \
                g->pw == 0) {                                                              \
                /* The common 2x2/2 case: every window is whole. */                        \
                for (int64_t oh = 0; oh < OH; oh++)                                        \
                    max2x2_row_##S(xp + 2 * oh * W, xp + (2 * oh + 1) * W, yp + oh * OW,   \
                                   ip ? ip + oh * OW : NULL, OW, (int32_t)(2 * oh * W),    \
                                   (int32_t)W, jb->relu);                                  \
                continue;                                                                  \
            }                                                                              \
            for (int64_t oh = 0; oh < OH; oh++) {                                          \
                int64_t hs = oh * g->sh - g->ph, he = imin(hs + g->kh, H);                 \
                hs = imax(hs, 0);                                                          \
                for (int64_t ow = 0; ow < OW; ow++) {                                      \
                    int64_t ws = ow * g->sw - g->pw, we = imin(ws + g->kw, W);             \
                    ws = imax(ws, 0);                                                      \
                    T m = -(T)INFINITY;                                                    \
                    int64_t mi = hs * W + ws;                                              \
                    for (int64_t h = hs; h < he; h++) {                                    \
                        const T *r = xp + h * W;                                           \
                        for (int64_t w = ws; w < we; w++) {                                \
                            T v = jb->relu ? relu_##S(r[w]) : r[w];                        \
                            if (v > m || isnan(v)) m = v, mi = h * W + w;                  \
                        }                                                                  \
                    }                                                                      \
                    yp[oh * OW + ow] = m;                                                  \
                    if (ip) ip[oh * OW + ow] = jb->relu && m <= 0 ? -1 : (int32_t)mi;      \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
    }                                                                                      \
                                                                                           \
    static void maxpool_fwd_##S(const nb__pool2d_geom *g, const T *x, T *y, int32_t *idx,  \
                                bool relu) {                                               \
        pool_job jb = {.g = g, .x = x, .y = y, .idx = idx, .relu = relu};                  \
        nb__parallel_range(g->planes, plane_threads(g), maxpool_fwd_planes_##S, &jb);      \
    }                                                                                      \
                                                                                           \
    static void maxpool_bwd_planes_##S(int64_t lo, int64_t hi, void *job) {                \
        const pool_job *jb = job;                                                          \
        const nb__pool2d_geom *g = jb->g;                                                  \
        const T *gy = jb->gy;                                                              \
        const int32_t *idx = jb->cidx;                                                     \
        T *gx = jb->gx;                                                                    \
        int64_t HW = g->H * g->W, L = g->OH * g->OW;                                       \
        for (int64_t p = lo; p < hi; p++) {                                                \
            T *gp = gx + p * HW;                                                           \
            const T *gyp = gy + p * L;                                                     \
            const int32_t *ip = idx + p * L;                                               \
            memset(gp, 0, sizeof(T) * (size_t)HW);                                         \
            for (int64_t j = 0; j < L; j++)                                                \
                if (ip[j] >= 0) gp[ip[j]] += gyp[j];                                       \
        }                                                                                  \
    }                                                                                      \
                                                                                           \
    static void maxpool_bwd_##S(const nb__pool2d_geom *g, const T *gy, const int32_t *idx, \
                                T *gx) {                                                   \
        pool_job jb = {.g = g, .gy = gy, .cidx = idx, .gx = gx};                           \
        nb__parallel_range(g->planes, plane_threads(g), maxpool_bwd_planes_##S, &jb);      \
    }                                                                                      \
                                                                                           \
    /* The window of output (oh, ow): clipped bounds and the divisor. */                   \
    static void avg_fwd_planes_##S(int64_t lo, int64_t hi, void *job) {                    \
        const pool_job *jb = job;                                                          \
        const nb__pool2d_geom *g = jb->g;                                                  \
        const bool cip = jb->cip;                                                          \
        const T *x = jb->x;                                                                \
        T *y = jb->y;                                                                      \
        int64_t H = g->H, W = g->W, OH = g->OH, OW = g->OW;                                \
        for (int64_t p = lo; p < hi; p++) {                                                \
            const T *xp = x + p * H * W;                                                   \
            T *yp = y + p * OH * OW;                                                       \
            for (int64_t oh = 0; oh < OH; oh++) {                                          \
                int64_t hs = oh * g->sh - g->ph, he = imin(hs + g->kh, H + g->ph);         \
                int64_t ph_ = he - hs;                                                     \
                hs = imax(hs, 0), he = imin(he, H);                                        \
                for (int64_t ow = 0; ow < OW; ow++) {                                      \
                    int64_t ws = ow * g->sw - g->pw, we = imin(ws + g->kw, W + g->pw);     \
                    int64_t pw_ = we - ws;                                                 \
                    ws = imax(ws, 0), we = imin(we, W);                                    \
                    T s = 0;                                                               \
                    for (int64_t h = hs; h < he; h++)                                      \
                        for (int64_t w = ws; w < we; w++) s += xp[h * W + w];              \
                    int64_t div = cip ? ph_ * pw_ : (he - hs) * (we - ws);                 \
                    yp[oh * OW + ow] = s / (T)div;                                         \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
    }                                                                                      \
                                                                                           \
    static void avg_fwd_##S(const nb__pool2d_geom *g, bool cip, const T *x, T *y) {        \
        pool_job jb = {.g = g, .cip = cip, .x = x, .y = y};                                \
        nb__parallel_range(g->planes, plane_threads(g), avg_fwd_planes_##S, &jb);          \
    }                                                                                      \
                                                                                           \
    static void avg_bwd_planes_##S(int64_t lo, int64_t hi, void *job) {                    \
        const pool_job *jb = job;                                                          \
        const nb__pool2d_geom *g = jb->g;                                                  \
        const bool cip = jb->cip;                                                          \
        const T *gy = jb->gy;                                                              \
        T *gx = jb->gx;                                                                    \
        int64_t H = g->H, W = g->W, OH = g->OH, OW = g->OW;                                \
        for (int64_t p = lo; p < hi; p++) {                                                \
            T *gp = gx + p * H * W;                                                        \
            const T *gyp = gy + p * OH * OW;                                               \
            memset(gp, 0, sizeof(T) * (size_t)(H * W));                                    \
            for (int64_t oh = 0; oh < OH; oh++) {                                          \
                int64_t hs = oh * g->sh - g->ph, he = imin(hs + g->kh, H + g->ph);         \
                int64_t ph_ = he - hs;                                                     \
                hs = imax(hs, 0), he = imin(he, H);                                        \
                for (int64_t ow = 0; ow < OW; ow++) {                                      \
                    int64_t ws = ow * g->sw - g->pw, we = imin(ws + g->kw, W + g->pw);     \
                    int64_t pw_ = we - ws;                                                 \
                    ws = imax(ws, 0), we = imin(we, W);                                    \
                    int64_t div = cip ? ph_ * pw_ : (he - hs) * (we - ws);                 \
                    T v = gyp[oh * OW + ow] / (T)div;                                      \
                    for (int64_t h = hs; h < he; h++)                                      \
                        for (int64_t w = ws; w < we; w++) gp[h * W + w] += v;              \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
    }                                                                                      \
                                                                                           \
    static void avg_bwd_##S(const nb__pool2d_geom *g, bool cip, const T *gy, T *gx) {      \
        pool_job jb = {.g = g, .cip = cip, .gy = gy, .gx = gx};                            \
        nb__parallel_range(g->planes, plane_threads(g), avg_bwd_planes_##S, &jb);          \
    }                                                                                      \
                                                                                           \
    static void adaptive_fwd_planes_##S(int64_t lo, int64_t hi, void *job) {               \
        const pool_job *jb = job;                                                          \
        const nb__pool2d_geom *g = jb->g;                                                  \
        const T *x = jb->x;                                                                \
        T *y = jb->y;                                                                      \
        int64_t H = g->H, W = g->W, OH = g->OH, OW = g->OW;                                \
        for (int64_t p = lo; p < hi; p++) {                                                \
            const T *xp = x + p * H * W;                                                   \
            T *yp = y + p * OH * OW;                                                       \
            for (int64_t oh = 0; oh < OH; oh++) {                                          \
                int64_t hs = ad_start(oh, H, OH), he = ad_end(oh, H, OH);                  \
                for (int64_t ow = 0; ow < OW; ow++) {                                      \
                    int64_t ws = ad_start(ow, W, OW), we = ad_end(ow, W, OW);              \
                    T s = 0;                                                               \
                    for (int64_t h = hs; h < he; h++)                                      \
                        for (int64_t w = ws; w < we; w++) s += xp[h * W + w];              \
                    yp[oh * OW + ow] = s / (T)((he - hs) * (we - ws));                     \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
    }                                                                                      \
                                                                                           \
    static void adaptive_fwd_##S(const nb__pool2d_geom *g, const T *x, T *y) {             \
        pool_job jb = {.g = g, .x = x, .y = y};                                            \
        nb__parallel_range(g->planes, plane_threads(g), adaptive_fwd_planes_##S, &jb);     \
    }                                                                                      \
                                                                                           \
    static void adaptive_bwd_planes_##S(int64_t lo, int64_t hi, void *job) {               \
        const pool_job *jb = job;                                                          \
        const nb__pool2d_geom *g = jb->g;                                                  \
        const T *gy = jb->gy;                                                              \
        T *gx = jb->gx;                                                                    \
        int64_t H = g->H, W = g->W, OH = g->OH, OW = g->OW;                                \
        for (int64_t p = lo; p < hi; p++) {                                                \
            T *gp = gx + p * H * W;                                                        \
            const T *gyp = gy + p * OH * OW;                                               \
            memset(gp, 0, sizeof(T) * (size_t)(H * W));                                    \
            for (int64_t oh = 0; oh < OH; oh++) {                                          \
                int64_t hs = ad_start(oh, H, OH), he = ad_end(oh, H, OH);                  \
                for (int64_t ow = 0; ow < OW; ow++) {                                      \
                    int64_t ws = ad_start(ow, W, OW), we = ad_end(ow, W, OW);              \
                    T v = gyp[oh * OW + ow] / (T)((he - hs) * (we - ws));                  \
                    for (int64_t h = hs; h < he; h++)                                      \
                        for (int64_t w = ws; w < we; w++) gp[h * W + w] += v;              \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
    }                                                                                      \
                                                                                           \
    static void adaptive_bwd_##S(const nb__pool2d_geom *g, const T *gy, T *gx) {           \
        pool_job jb = {.g = g, .gy = gy, .gx = gx};                                        \
        nb__parallel_range(g->planes, plane_threads(g), adaptive_bwd_planes_##S, &jb);     \
    }

NB__POOL_TYPED(float, f32)
NB__POOL_TYPED(double, f64)

/* ---- the kernels: dispatch on the compute dtype ---------------------------------------------- */
static nb_status cpu_maxpool2d(const nb__pool2d_args *a) {
    if (a->dtype == NB_F64) maxpool_fwd_f64(&a->g, a->x, a->y, a->idx, a->relu);
    else maxpool_fwd_f32(&a->g, a->x, a->y, a->idx, a->relu);
    return NB_OK;
}

static nb_status cpu_maxpool2d_backward(const nb__pool2d_backward_args *a) {
    if (a->dtype == NB_F64) maxpool_bwd_f64(&a->g, a->gy, a->idx, a->gx);
    else maxpool_bwd_f32(&a->g, a->gy, a->idx, a->gx);
    return NB_OK;
}

static nb_status cpu_avgpool2d(const nb__pool2d_args *a) {
    if (a->dtype == NB_F64) avg_fwd_f64(&a->g, a->count_include_pad, a->x, a->y);
    else avg_fwd_f32(&a->g, a->count_include_pad, a->x, a->y);
    return NB_OK;
}

static nb_status cpu_avgpool2d_backward(const nb__pool2d_backward_args *a) {
    if (a->dtype == NB_F64) avg_bwd_f64(&a->g, a->count_include_pad, a->gy, a->gx);
    else avg_bwd_f32(&a->g, a->count_include_pad, a->gy, a->gx);
    return NB_OK;
}

static nb_status cpu_adaptive_avgpool2d(const nb__pool2d_args *a) {
    if (a->dtype == NB_F64) adaptive_fwd_f64(&a->g, a->x, a->y);
    else adaptive_fwd_f32(&a->g, a->x, a->y);
    return NB_OK;
}

static nb_status cpu_adaptive_avgpool2d_backward(const nb__pool2d_backward_args *a) {
    if (a->dtype == NB_F64) adaptive_bwd_f64(&a->g, a->gy, a->gx);
    else adaptive_bwd_f32(&a->g, a->gy, a->gx);
    return NB_OK;
}

void nb__cpu_register_pool(nb__kernels *k) {
    k->maxpool2d = cpu_maxpool2d;
    k->maxpool2d_backward = cpu_maxpool2d_backward;
    k->avgpool2d = cpu_avgpool2d;
    k->avgpool2d_backward = cpu_avgpool2d_backward;
    k->adaptive_avgpool2d = cpu_adaptive_avgpool2d;
    k->adaptive_avgpool2d_backward = cpu_adaptive_avgpool2d_backward;
}
