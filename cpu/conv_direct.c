/* conv_direct.c - the direct f32 kernels of cpu/conv.c for convolutions with few taps per
 * output (C * KH * KW <= NB__CONV_DIRECT_TAPS, stride 1, dilation 1, one group), such as a
 * CNN's first layer on a 1-channel image: im2col would turn them into GEMMs with an inner
 * dimension of 9, which run far below the FMA rate, after copying the image 9 times.
 *
 * Both kernels work on one image, copied into a zero-padded buffer (C rows of Hp x Wq, Wq
 * wide enough for a vector load at every output block), and vectorize over an output row:
 *   forward:          y[o, oh, ow..ow+V) = sum over taps t of w[o, t] * xp[t's window row]
 *                     (taps in (c, ki, kj) order, FMAs into one accumulator), then + b[o];
 *   weight gradient:  gw[o, t] (+)= sum over positions of gy[o, pos] * xp[t's window at pos],
 *                     one vector accumulator per tap, its lanes added at the end of the image.
 * The last block of a row is masked (AVX-512 masks, AVX2 maskload), so lanes past the row
 * neither store nor multiply real data. AVX-512 (16 lanes), AVX2 + FMA (8 lanes), else
 * scalar; the bits depend on the build's instruction set, never on the thread count (each
 * image is one thread's, and cpu/conv.c sums images in a fixed order). */
#include <string.h>

#include "cpu/conv.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define V 16
typedef __m512 vf;
static inline vf vzero(void) { return _mm512_setzero_ps(); }
static inline vf vset1(float s) { return _mm512_set1_ps(s); }
static inline vf vload(const float *p) { return _mm512_loadu_ps(p); }
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline __mmask16 vmask(int n) { return (__mmask16)((1u << n) - 1); }
static inline vf vload_n(const float *p, int n) { return _mm512_maskz_loadu_ps(vmask(n), p); }
static inline void vstore_n(float *p, vf v, int n) {
    if (n == V) _mm512_storeu_ps(p, v);
    else _mm512_mask_storeu_ps(p, vmask(n), v);
}
static inline float vsum(vf v) {
    /* a fixed order: halves, then quarters, ... */
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define V 8
typedef __m256 vf;
static inline vf vzero(void) { return _mm256_setzero_ps(); }
static inline vf vset1(float s) { return _mm256_set1_ps(s); }
static inline vf vload(const float *p) { return _mm256_loadu_ps(p); }
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline __m256i vmask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vf vload_n(const float *p, int n) { return _mm256_maskload_ps(p, vmask(n)); }
static inline void vstore_n(float *p, vf v, int n) {
    /* not a masked store: AMD microcodes those, a copy is far cheaper */
    if (n == V) {
        _mm256_storeu_ps(p, v);
    } else {
        float t[V];
        _mm256_storeu_ps(t, v);
        memcpy(p, t, sizeof(float) * (size_t)n);
    }
}
static inline float vsum(vf v) {
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
#else
#define V 1
typedef float vf;
static inline vf vzero(void) { return 0.0f; }
static inline vf vset1(float s) { return s; }
static inline vf vload(const float *p) { return *p; }
static inline vf vfma(vf a, vf b, vf c) { return a * b + c; }
static inline vf vadd(vf a, vf b) { return a + b; }
static inline vf vload_n(const float *p, int n) { return n > 0 ? *p : 0.0f; }
static inline void vstore_n(float *p, vf v, int n) {
    if (n > 0) *p = v;
}
static inline float vsum(vf v) { return v; }
#endif

typedef struct dgeom {
    int64_t Hp, Wq, K;                  /* padded rows, padded row width, taps */
    int64_t off[NB__CONV_DIRECT_TAPS];  /* tap t's offset in the padded image */
} dgeom;

static dgeom dgeom_of(const nb__conv2d_geom *g) {
    dgeom d = {.Hp = g->H + 2 * g->ph, .K = g->C * g->KH * g->KW};
    d.Wq = (g->OW + 2 * V - 1) / (2 * V) * (2 * V) + g->KW - 1;
    int64_t t = 0;
    for (int64_t c = 0; c < g->C; c++)
        for (int64_t ki = 0; ki < g->KH; ki++)
            for (int64_t kj = 0; kj < g->KW; kj++) d.off[t++] = (c * d.Hp + ki) * d.Wq + kj;
    return d;
}

bool nb__conv_direct_ok(const nb__conv2d_geom *g) {
    return g->groups == 1 && g->sh == 1 && g->sw == 1 && g->dh == 1 && g->dw == 1 &&
           g->C * g->KH * g->KW <= NB__CONV_DIRECT_TAPS && g->OW >= 1 && g->OH >= 1;
}

size_t nb__conv_direct_scratch(const nb__conv2d_geom *g) {
    dgeom d = dgeom_of(g);
    return sizeof(float) * (size_t)(g->C * d.Hp * d.Wq + V);
}

/* xp (C, Hp, Wq): x's image with ph rows and pw columns of zeros before it, zeros after. */
static void pad_image(const nb__conv2d_geom *g, const dgeom *d, const float *x, float *xp) {
    memset(xp, 0, nb__conv_direct_scratch(g));
    for (int64_t c = 0; c < g->C; c++)
        for (int64_t h = 0; h < g->H; h++)
            memcpy(xp + (c * d->Hp + g->ph + h) * d->Wq + g->pw, x + (c * g->H + h) * g->W,
                   sizeof(float) * (size_t)g->W);
}

/* One output channel's plane, two vector blocks of a row at a time (each tap's weight is
 * broadcast once for both); K taps (a constant where inlined with one). */
static inline __attribute__((always_inline)) void fwd_plane(const nb__conv2d_geom *g,
                                                            const dgeom *d, int64_t K,
                                                            const float *xp, const float *wo,
                                                            const float *bo, float *yo) {
    for (int64_t oh = 0; oh < g->OH; oh++) {
        const float *xr = xp + oh * d->Wq;
        float *yr = yo + oh * g->OW;
        for (int64_t ow = 0; ow < g->OW; ow += 2 * V) {
            vf a0 = vzero(), a1 = vzero();
            for (int64_t t = 0; t < K; t++) {
                vf wt = vset1(wo[t]);
                a0 = vfma(wt, vload(xr + ow + d->off[t]), a0);
                a1 = vfma(wt, vload(xr + ow + V + d->off[t]), a1);
            }
            if (bo) a0 = vadd(a0, vset1(*bo)), a1 = vadd(a1, vset1(*bo));
            int64_t left = g->OW - ow;
            vstore_n(yr + ow, a0, left < V ? (int)left : V);
            if (left > V) vstore_n(yr + ow + V, a1, left - V < V ? (int)(left - V) : V);
        }
    }
}

void nb__conv_direct_forward(const nb__conv2d_geom *g, const float *x, const float *w,
                             const float *b, float *y, float *xp) {
    dgeom d = dgeom_of(g);
    pad_image(g, &d, x, xp);
    int64_t L = g->OH * g->OW;
    for (int64_t o = 0; o < g->O; o++) {
        const float *bo = b ? b + o : NULL;
        if (d.K == 9) fwd_plane(g, &d, 9, xp, w + o * 9, bo, y + o * L);
        else fwd_plane(g, &d, d.K, xp, w + o * d.K, bo, y + o * L);
    }
}

static inline __attribute__((always_inline)) void wgrad_plane(const nb__conv2d_geom *g,
                                                              const dgeom *d, int64_t K,
                                                              const float *xp, const float *go,
                                                              float *gwo, bool acc) {
    vf a[NB__CONV_DIRECT_TAPS];
    for (int64_t t = 0; t < K; t++) a[t] = vzero();
    for (int64_t oh = 0; oh < g->OH; oh++) {
        const float *xr = xp + oh * d->Wq;
        const float *gr = go + oh * g->OW;
        int64_t ow = 0;
        for (; ow + V <= g->OW; ow += V) {
            vf gv = vload(gr + ow);
            for (int64_t t = 0; t < K; t++) a[t] = vfma(gv, vload(xr + ow + d->off[t]), a[t]);
        }
        if (ow < g->OW) {
            /* masked: lanes past the row are zeros in both operands */
            int n = (int)(g->OW - ow);
            vf gv = vload_n(gr + ow, n);
            for (int64_t t = 0; t < K; t++)
                a[t] = vfma(gv, vload_n(xr + ow + d->off[t], n), a[t]);
        }
    }
    for (int64_t t = 0; t < K; t++) {
        float s = vsum(a[t]);
        gwo[t] = acc ? gwo[t] + s : s;
    }
}

void nb__conv_direct_wgrad(const nb__conv2d_geom *g, const float *x, const float *gy,
                           float *gw, bool acc, float *xp) {
    dgeom d = dgeom_of(g);
    pad_image(g, &d, x, xp);
    int64_t L = g->OH * g->OW;
    for (int64_t o = 0; o < g->O; o++) {
        if (d.K == 9) wgrad_plane(g, &d, 9, xp, gy + o * L, gw + o * 9, acc);
        else wgrad_plane(g, &d, d.K, xp, gy + o * L, gw + o * d.K, acc);
    }
}
