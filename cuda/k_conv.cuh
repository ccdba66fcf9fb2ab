// cuda/k_conv.cuh - private: the per-element math of the conv family's CUDA kernels
// (cuda/k_conv.cu), written once as __host__ __device__ functions so that the kernels call
// them on the GPU and tests/cuda_host/conv.cu calls the SAME functions on the host and
// compares them with the CPU backend (cpu/conv.c, cpu/pool.c). nvcc only (templates).
// Unverified on a GPU: no GPU was available where this was written.
//
// Every function computes ONE output element, in the CPU kernel's summation order where the
// CPU's order is fixed per element, so that the GPU's results are the CPU's bits:
//   maxpool_at          max and argmax of one window (NaN wins, ties keep the first,
//                       the CPU's general loop and its 2x2 fast path choose alike)
//   maxpool_grad_at     one input element's gradient: the sum of gy over the windows whose
//                       argmax is this element, in increasing output order (the order the
//                       CPU's scatter adds them in) - a gather, no atomics
//   avgpool_at / avgpool_grad_at, adaptive_at / adaptive_grad_at
//                       the same for the average pools (gather in increasing output order)
//   im2col_at           one entry of the column matrix ((C*KH*KW) x (OH*OW)) of an image
//   col2im_at           one input-gradient element from the column-gradient matrix: the sum
//                       over the kernel taps (ki, kj) in increasing order (cpu col2im's order)
//   conv_direct_at / conv_gx_direct_at / conv_gw_direct_at
//                       direct f64 convolution forward, input and weight gradient elements
#ifndef NABLA_CUDA_K_CONV_CUH
#define NABLA_CUDA_K_CONV_CUH

#include <math.h>
#include <stdint.h>

#include "tensor/kernels.h"

#if defined(__CUDACC__)
#define NB_CONV_HD __host__ __device__ inline
#else
#define NB_CONV_HD inline
#endif

namespace nbconv {

NB_CONV_HD int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
NB_CONV_HD int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

// The first output index o >= 0 with o*s - p + k > i (its window [o*s-p, o*s-p+k) reaches i)
// and one past the last with o*s - p <= i; clipped to [0, out). Empty when lo >= hi.
NB_CONV_HD void windows_of(int64_t i, int64_t k, int64_t s, int64_t p, int64_t out,
                           int64_t *lo, int64_t *hi) {
    int64_t a = i + p - k + 1; // o*s >= a
    int64_t l = a <= 0 ? 0 : (a + s - 1) / s;
    int64_t h = (i + p) / s + 1; // o*s <= i + p (i + p >= 0)
    *lo = l;
    *hi = imin(h, out);
}

// Adaptive windows [floor(i*in/out), ceil((i+1)*in/out)), and the outputs whose window
// holds input index i: [floor(i*out/in), ceil((i+1)*out/in)) clipped to [0, out).
NB_CONV_HD int64_t ad_start(int64_t i, int64_t in, int64_t out) { return i * in / out; }
NB_CONV_HD int64_t ad_end(int64_t i, int64_t in, int64_t out) {
    return ((i + 1) * in + out - 1) / out;
}
NB_CONV_HD void ad_windows_of(int64_t i, int64_t in, int64_t out, int64_t *lo, int64_t *hi) {
    *lo = imin(i * out / in, out);
    *hi = imin(((i + 1) * out + in - 1) / in, out);
}

// ---- max pooling ------------------------------------------------------------------------------
// xp: the plane (H, W). *mi receives h*W + w of the maximum (the window's first position
// when every element is -inf, like the CPU).
template <typename T>
NB_CONV_HD T maxpool_at(const nb__pool2d_geom *g, const T *xp, int64_t oh, int64_t ow,
                        int32_t *mi) {
    int64_t hs = oh * g->sh - g->ph, he = imin(hs + g->kh, g->H);
    int64_t ws = ow * g->sw - g->pw, we = imin(ws + g->kw, g->W);
    hs = imax(hs, 0), ws = imax(ws, 0);
    T m = -(T)INFINITY;
    int64_t idx = hs * g->W + ws;
    for (int64_t h = hs; h < he; h++)
        for (int64_t w = ws; w < we; w++) {
            T v = xp[h * g->W + w];
            if (v > m || v != v) m = v, idx = h * g->W + w;
        }
    *mi = (int32_t)idx;
    return m;
}

// gyp, ip: the plane's (OH, OW) gradient and argmax. The windows holding (h, w) are the only
// ones whose argmax can be (h, w) (the forward picks inside its window).
template <typename T>
NB_CONV_HD T maxpool_grad_at(const nb__pool2d_geom *g, const T *gyp, const int32_t *ip,
                             int64_t h, int64_t w) {
    int64_t ohl, ohh, owl, owh;
    windows_of(h, g->kh, g->sh, g->ph, g->OH, &ohl, &ohh);
    windows_of(w, g->kw, g->sw, g->pw, g->OW, &owl, &owh);
    int32_t self = (int32_t)(h * g->W + w);
    T s = 0;
    for (int64_t oh = ohl; oh < ohh; oh++)
        for (int64_t ow = owl; ow < owh; ow++)
            if (ip[oh * g->OW + ow] == self) s += gyp[oh * g->OW + ow];
    return s;
}

// ---- average pooling --------------------------------------------------------------------------
// The clipped window of output (oh, ow) and its divisor (count_include_pad: the padded
// window, but not beyond the padded input).
NB_CONV_HD int64_t avg_window(const nb__pool2d_geom *g, bool cip, int64_t oh, int64_t ow,
                              int64_t *hs, int64_t *he, int64_t *ws, int64_t *we) {
    int64_t h0 = oh * g->sh - g->ph, h1 = imin(h0 + g->kh, g->H + g->ph);
    int64_t w0 = ow * g->sw - g->pw, w1 = imin(w0 + g->kw, g->W + g->pw);
    int64_t padded = (h1 - h0) * (w1 - w0);
    *hs = imax(h0, 0), *he = imin(h1, g->H), *ws = imax(w0, 0), *we = imin(w1, g->W);
    return cip ? padded : (*he - *hs) * (*we - *ws);
}

template <typename T>
NB_CONV_HD T avgpool_at(const nb__pool2d_geom *g, bool cip, const T *xp, int64_t oh,
                        int64_t ow) {
    int64_t hs, he, ws, we;
    int64_t div = avg_window(g, cip, oh, ow, &hs, &he, &ws, &we);
    T s = 0;
    for (int64_t h = hs; h < he; h++)
        for (int64_t w = ws; w < we; w++) s += xp[h * g->W + w];
    return s / (T)div;
}

template <typename T>
NB_CONV_HD T avgpool_grad_at(const nb__pool2d_geom *g, bool cip, const T *gyp, int64_t h,
                             int64_t w) {
    int64_t ohl, ohh, owl, owh;
    windows_of(h, g->kh, g->sh, g->ph, g->OH, &ohl, &ohh);
    windows_of(w, g->kw, g->sw, g->pw, g->OW, &owl, &owh);
    T s = 0;
    for (int64_t oh = ohl; oh < ohh; oh++)
        for (int64_t ow = owl; ow < owh; ow++) {
            int64_t hs, he, ws, we;
            int64_t div = avg_window(g, cip, oh, ow, &hs, &he, &ws, &we);
            s += gyp[oh * g->OW + ow] / (T)div;
        }
    return s;
}

template <typename T>
NB_CONV_HD T adaptive_at(const nb__pool2d_geom *g, const T *xp, int64_t oh, int64_t ow) {
    int64_t hs = ad_start(oh, g->H, g->OH), he = ad_end(oh, g->H, g->OH);
    int64_t ws = ad_start(ow, g->W, g->OW), we = ad_end(ow, g->W, g->OW);
    T s = 0;
    for (int64_t h = hs; h < he; h++)
        for (int64_t w = ws; w < we; w++) s += xp[h * g->W + w];
    return s / (T)((he - hs) * (we - ws));
}

template <typename T>
NB_CONV_HD T adaptive_grad_at(const nb__pool2d_geom *g, const T *gyp, int64_t h, int64_t w) {
    int64_t ohl, ohh, owl, owh;
    ad_windows_of(h, g->H, g->OH, &ohl, &ohh);
    ad_windows_of(w, g->W, g->OW, &owl, &owh);
    T s = 0;
    for (int64_t oh = ohl; oh < ohh; oh++) {
        int64_t rows = ad_end(oh, g->H, g->OH) - ad_start(oh, g->H, g->OH);
        for (int64_t ow = owl; ow < owh; ow++) {
            int64_t cols = ad_end(ow, g->W, g->OW) - ad_start(ow, g->W, g->OW);
            s += gyp[oh * g->OW + ow] / (T)(rows * cols);
        }
    }
    return s;
}

// ---- convolution: im2col / col2im -----------------------------------------------------------
// Entry (r, l) of one image's column matrix, r = (c*KH + ki)*KW + kj, l = oh*OW + ow:
// x[c, oh*sh - ph + ki*dh, ow*sw - pw + kj*dw], 0 in the padding. xn: the image (C, H, W).
template <typename T>
NB_CONV_HD T im2col_at(const nb__conv2d_geom *g, const T *xn, int64_t r, int64_t l) {
    int64_t kj = r % g->KW, t = r / g->KW;
    int64_t ki = t % g->KH, c = t / g->KH;
    int64_t oh = l / g->OW, ow = l - oh * g->OW;
    int64_t h = oh * g->sh - g->ph + ki * g->dh, w = ow * g->sw - g->pw + kj * g->dw;
    if (h < 0 || h >= g->H || w < 0 || w >= g->W) return (T)0;
    return xn[(c * g->H + h) * g->W + w];
}

// Element (c, h, w) of one image's input gradient from its column-gradient matrix dcol
// ((C*KH*KW) x (OH*OW)): the sum over the taps (ki, kj) whose window position lands on
// (h, w), in increasing (ki, kj) order, starting from 0 (as cpu col2im accumulates).
template <typename T>
NB_CONV_HD T col2im_at(const nb__conv2d_geom *g, const T *dcol, int64_t c, int64_t h,
                       int64_t w) {
    int64_t L = g->OH * g->OW;
    T s = 0;
    for (int64_t ki = 0; ki < g->KH; ki++) {
        int64_t th = h + g->ph - ki * g->dh; // = oh * sh
        if (th < 0 || th % g->sh != 0) continue;
        int64_t oh = th / g->sh;
        if (oh >= g->OH) continue;
        for (int64_t kj = 0; kj < g->KW; kj++) {
            int64_t tw = w + g->pw - kj * g->dw;
            if (tw < 0 || tw % g->sw != 0) continue;
            int64_t ow = tw / g->sw;
            if (ow >= g->OW) continue;
            s += dcol[((c * g->KH + ki) * g->KW + kj) * L + oh * g->OW + ow];
        }
    }
    return s;
}

// ---- convolution: direct (f64) ----------------------------------------------------------------
// y[n, o, oh, ow] without the bias: the sum over (c in o's group, ki, kj) in that order.
template <typename T>
NB_CONV_HD T conv_direct_at(const nb__conv2d_geom *g, const T *x, const T *w, int64_t n,
                            int64_t o, int64_t oh, int64_t ow) {
    int64_t Cg = g->C / g->groups, Og = g->O / g->groups, c0 = (o / Og) * Cg;
    T s = 0;
    for (int64_t c = 0; c < Cg; c++) {
        const T *xc = x + ((n * g->C) + c0 + c) * g->H * g->W;
        const T *wc = w + (o * Cg + c) * g->KH * g->KW;
        for (int64_t ki = 0; ki < g->KH; ki++) {
            int64_t h = oh * g->sh - g->ph + ki * g->dh;
            if (h < 0 || h >= g->H) continue;
            for (int64_t kj = 0; kj < g->KW; kj++) {
                int64_t wi = ow * g->sw - g->pw + kj * g->dw;
                if (wi < 0 || wi >= g->W) continue;
                s += xc[h * g->W + wi] * wc[ki * g->KW + kj];
            }
        }
    }
    return s;
}

// gx[n, c, h, w]: the sum over (o in c's group, ki, kj) of w[o, c', ki, kj] * gy[n, o, oh, ow]
// where the tap (ki, kj) of output (oh, ow) reads (h, w).
template <typename T>
NB_CONV_HD T conv_gx_direct_at(const nb__conv2d_geom *g, const T *w, const T *gy, int64_t n,
                               int64_t c, int64_t h, int64_t wi) {
    int64_t Cg = g->C / g->groups, Og = g->O / g->groups, gi = c / Cg, cl = c - gi * Cg;
    T s = 0;
    for (int64_t o = gi * Og; o < (gi + 1) * Og; o++) {
        const T *wo = w + (o * Cg + cl) * g->KH * g->KW;
        const T *gyo = gy + (n * g->O + o) * g->OH * g->OW;
        for (int64_t ki = 0; ki < g->KH; ki++) {
            int64_t th = h + g->ph - ki * g->dh;
            if (th < 0 || th % g->sh != 0 || th / g->sh >= g->OH) continue;
            int64_t oh = th / g->sh;
            for (int64_t kj = 0; kj < g->KW; kj++) {
                int64_t tw = wi + g->pw - kj * g->dw;
                if (tw < 0 || tw % g->sw != 0 || tw / g->sw >= g->OW) continue;
                s += wo[ki * g->KW + kj] * gyo[oh * g->OW + tw / g->sw];
            }
        }
    }
    return s;
}

// gw[o, c, ki, kj] (c within the group): the sum over images and output positions, in
// (n, oh, ow) order.
template <typename T>
NB_CONV_HD T conv_gw_direct_at(const nb__conv2d_geom *g, const T *x, const T *gy, int64_t o,
                               int64_t c, int64_t ki, int64_t kj) {
    int64_t Cg = g->C / g->groups, Og = g->O / g->groups, cx = (o / Og) * Cg + c;
    T s = 0;
    for (int64_t n = 0; n < g->N; n++) {
        const T *xc = x + (n * g->C + cx) * g->H * g->W;
        const T *gyo = gy + (n * g->O + o) * g->OH * g->OW;
        for (int64_t oh = 0; oh < g->OH; oh++) {
            int64_t h = oh * g->sh - g->ph + ki * g->dh;
            if (h < 0 || h >= g->H) continue;
            for (int64_t ow = 0; ow < g->OW; ow++) {
                int64_t wi = ow * g->sw - g->pw + kj * g->dw;
                if (wi < 0 || wi >= g->W) continue;
                s += xc[h * g->W + wi] * gyo[oh * g->OW + ow];
            }
        }
    }
    return s;
}

// Bias gradient of channel o, the per-thread part: thread t of nthreads sums the elements
// i = t, t + nthreads, ... of the (N x L) values gy[n, o, :] in double, in that order; the
// block then adds the nthreads partials in nb_block_sum's fixed tree.
template <typename T>
NB_CONV_HD double bias_grad_part(const nb__conv2d_geom *g, const T *gy, int64_t o, int64_t t,
                                 int64_t nthreads) {
    int64_t L = g->OH * g->OW, total = g->N * L;
    double s = 0;
    for (int64_t i = t; i < total; i += nthreads) {
        int64_t n = i / L, l = i - n * L;
        s += (double)gy[(n * g->O + o) * L + l];
    }
    return s;
}

} // namespace nbconv

#endif
