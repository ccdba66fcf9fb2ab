/* conv.c - CPU kernels of 2-D convolution (see cpu/conv.h): im2col + GEMM forward, and a
 * backward that computes the weight gradient as GEMMs over column matrices and the input
 * gradient as a GEMM into a column matrix followed by col2im.
 *
 * Work is split over images: each thread owns one column buffer (im2col of one image at a
 * time) and runs single-threaded GEMMs, which for the small per-image products of a CNN is
 * far better than asking the provider to parallelize each of them. A 1x1 stride-1 unpadded
 * convolution needs no column matrix: an image is already a (C x H*W) matrix.
 *
 * The weight gradient is a sum over images. To keep it independent of the thread count the
 * images are split into a fixed number of contiguous chunks (nparts, chosen from N and the
 * weight size only); chunk 0 accumulates straight into gw, chunk p > 0 into a partial buffer
 * in the scratch block, and the partials are added to gw in order 1, 2, ... afterwards.
 * oneDNN's primitives, which run the f32 and bf16 forward and input gradient where it is
 * built in and faster, are in cpu/conv_dnnl.c. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/backend.h"
#include "cpu/conv.h"
#include "cpu/conv_dnnl.h"
#include "cpu/cpu_impl.h"
#include "cpu/gemm.h"
#include "cpu/pool.h"
#include "nabla/memory.h"
#include "nb_config.h"

#if NB_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#endif

/* Multiply-adds below which a call stays on one thread (a 64x64x64 product). */
#define CONV_GRAIN ((int64_t)1 << 18)
/* Upper bound on the weight-gradient chunks, and on the memory their partials may take. */
#define CONV_MAX_PARTS 16
#define CONV_PARTS_BYTES ((size_t)64 << 20)

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* ---- plan ------------------------------------------------------------------------------------
 * How a call will run: threads, work units of the weight gradient, and the layout of the
 * scratch block: nthreads column buffers of col_bytes each, then nparts - 1 partial weight
 * gradients (at parts_offset), then nparts partial bias gradients (at bias_offset, when
 * fused_bias). */
typedef struct conv_plan {
    int nthreads;
    int nparts;            /* backward: images are summed into this many partial dW's */
    bool pointwise;        /* 1x1, stride 1, no padding: no column matrix at all */
    bool direct;           /* f32 forward and weight gradient on cpu/conv_direct.c */
    bool fused_bias;       /* the bias gradient is summed during the weight gradient's pass */
    size_t col_bytes, parts_offset, bias_offset;
    size_t scratch_bytes;  /* allocate this many bytes (64-byte aligned) */
} conv_plan;

static bool is_pointwise(const nb__conv2d_geom *g) {
    return g->KH == 1 && g->KW == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

/* Elements a copy may run past the end of a row in the stride-1 im2col (64 bytes of bf16,
 * the narrowest type it copies). */
#define CONV_SLACK 32

/* The stride-1 im2col first copies the image into a zero-padded (C, H+2ph, W+2pw) buffer,
 * after which every column-matrix row is a plain copy of OW elements. */
static size_t padded_elems(const nb__conv2d_geom *g) {
    return g->sw == 1 ? (size_t)(g->C * (g->H + 2 * g->ph) * (g->W + 2 * g->pw)) + CONV_SLACK : 0;
}

static size_t colmat_bytes(const nb__conv2d_geom *g, size_t es) {
    return align64(((size_t)(g->C * g->KH * g->KW) * (size_t)(g->OH * g->OW) + CONV_SLACK) * es);
}

/* One thread's buffer: the column matrix, then the padded image. */
static size_t col_bytes(const nb__conv2d_geom *g, size_t es) {
    return colmat_bytes(g, es) + align64(padded_elems(g) * es);
}

/* Plan the forward (backward false) or backward (need_* say which gradients are wanted)
 * for element size es (4 or 8). */
static conv_plan plan_make(const nb__conv2d_geom *g, size_t es, bool backward, bool need_gx,
                           bool need_gw, bool need_gb) {
    conv_plan p = {.nthreads = 1, .pointwise = is_pointwise(g)};
    int64_t L = g->OH * g->OW, Kg = g->C / g->groups * g->KH * g->KW;
    /* Multiply-adds of one image's products (forward; each backward product costs the same). */
    int64_t macs = g->O * L * (Kg > 0 ? Kg : 1);
    int64_t units = g->N;
    int nprod = 1;
    size_t wbytes = align64((size_t)(g->O * Kg) * es);
    if (backward) {
        nprod = (int)need_gx + (int)need_gw;
        if (need_gw) {
            int64_t parts = g->N < CONV_MAX_PARTS ? g->N : CONV_MAX_PARTS;
            while (parts > 1 && (size_t)(parts - 1) * wbytes > CONV_PARTS_BYTES) parts--;
            p.nparts = (int)(parts > 0 ? parts : 1);
            units = p.nparts;
        }
    }
    int nt = nb__threads_for(g->N * macs * (nprod > 0 ? nprod : 1), CONV_GRAIN);
    if (nt > units) nt = units > 0 ? (int)units : 1;
    p.nthreads = nt;
    p.direct = es == sizeof(float) && nb__conv_direct_ok(g);
    bool need_col = !p.pointwise && (p.direct ? backward && need_gx
                                              : !backward || need_gx || need_gw);
    p.col_bytes = need_col ? col_bytes(g, es) : 0;
    if (p.direct && (!backward || need_gw)) {
        size_t db = align64(nb__conv_direct_scratch(g));
        if (db > p.col_bytes) p.col_bytes = db;
    }
    p.parts_offset = (size_t)nt * p.col_bytes;
    p.bias_offset = p.parts_offset;
    if (backward && need_gw) {
        p.bias_offset += (size_t)(p.nparts - 1) * wbytes;
        /* The bias gradient rides along with the weight gradient's pass over gy, with one
         * partial sum (O doubles) per chunk. */
        p.fused_bias = need_gb;
    }
    p.scratch_bytes = p.bias_offset + (p.fused_bias ? (size_t)p.nparts * align64(
                                                          (size_t)g->O * sizeof(double))
                                                    : 0);
    return p;
}

/* ---- typed helpers: im2col, col2im, bias ----------------------------------------------------- */

/* Output positions o in [lo, hi) read input index o*s + off inside [0, n); clipped to out. */
static void valid_range(int64_t off, int64_t s, int64_t n, int64_t out, int64_t *lo,
                        int64_t *hi) {
    int64_t a = off < 0 ? (-off + s - 1) / s : 0;
    int64_t b = n - off > 0 ? (n - off + s - 1) / s : 0;
    if (a > out) a = out;
    if (b > out) b = out;
    if (b < a) b = a;
    *lo = a, *hi = b;
}

/* The column matrix (any element type: copies only). */
#define NB__CONV_COLUMNS(T, S)                                                              \
    /* Stride 1: pad the image into xp, then copy rows of OW elements in 64-byte chunks. \
     * A chunk may run up to CONV_SLACK elements past a row's end: into the next row,     \
     * which is written afterwards, or into the slack after the matrix and the image. */  \
    static void im2col_padded_##S(const nb__conv2d_geom *g, const T *x, T *col, T *xp) {   \
        enum { CH = 64 / sizeof(T) };                                                      \
        int64_t L = g->OH * g->OW, Hp = g->H + 2 * g->ph, Wp = g->W + 2 * g->pw;           \
        for (int64_t c = 0; c < g->C; c++) {                                               \
            T *pc = xp + c * Hp * Wp;                                                      \
            memset(pc, 0, sizeof(T) * (size_t)(g->ph * Wp));                               \
            memset(pc + (g->ph + g->H) * Wp, 0, sizeof(T) * (size_t)(g->ph * Wp));         \
            for (int64_t h = 0; h < g->H; h++) {                                           \
                T *r = pc + (g->ph + h) * Wp;                                              \
                for (int64_t j = 0; j < g->pw; j++) r[j] = 0, r[g->pw + g->W + j] = 0;     \
                memcpy(r + g->pw, x + (c * g->H + h) * g->W, sizeof(T) * (size_t)g->W);    \
            }                                                                              \
        }                                                                                  \
        memset(xp + g->C * Hp * Wp, 0, sizeof(T) * CONV_SLACK);                            \
        for (int64_t c = 0; c < g->C; c++)                                                 \
            for (int64_t ki = 0; ki < g->KH; ki++)                                         \
                for (int64_t kj = 0; kj < g->KW; kj++) {                                   \
                    T *row = col + ((c * g->KH + ki) * g->KW + kj) * L;                    \
                    const T *src = xp + c * Hp * Wp + ki * g->dh * Wp + kj * g->dw;        \
                    for (int64_t oh = 0; oh < g->OH; oh++) {                               \
                        const T *s1 = src + oh * g->sh * Wp;                               \
                        T *d1 = row + oh * g->OW;                                          \
                        for (int64_t j = 0; j < g->OW; j += CH)                            \
                            memcpy(d1 + j, s1 + j, 64);                                    \
                    }                                                                      \
                }                                                                          \
    }                                                                                      \
                                                                                           \
    /* col ((C*KH*KW) x (OH*OW)) from one image x (C, H, W); zeros where the window       \
     * reaches into the padding. xp: the padded-image buffer (stride 1 only). */           \
    static void im2col_##S(const nb__conv2d_geom *g, const T *x, T *col, T *xp) {          \
        if (g->sw == 1) {                                                                  \
            im2col_padded_##S(g, x, col, xp);                                              \
            return;                                                                        \
        }                                                                                  \
        int64_t L = g->OH * g->OW;                                                         \
        for (int64_t c = 0; c < g->C; c++) {                                               \
            const T *xc = x + c * g->H * g->W;                                             \
            for (int64_t ki = 0; ki < g->KH; ki++) {                                       \
                int64_t hoff = ki * g->dh - g->ph, hlo, hhi;                               \
                valid_range(hoff, g->sh, g->H, g->OH, &hlo, &hhi);                         \
                for (int64_t kj = 0; kj < g->KW; kj++) {                                   \
                    T *row = col + ((c * g->KH + ki) * g->KW + kj) * L;                    \
                    int64_t woff = kj * g->dw - g->pw, wlo, whi;                           \
                    valid_range(woff, g->sw, g->W, g->OW, &wlo, &whi);                     \
                    memset(row, 0, sizeof(T) * (size_t)(hlo * g->OW));                     \
                    memset(row + hhi * g->OW, 0, sizeof(T) * (size_t)((g->OH - hhi) * g->OW)); \
                    for (int64_t oh = hlo; oh < hhi; oh++) {                               \
                        T *dst = row + oh * g->OW;                                         \
                        const T *src = xc + (oh * g->sh + hoff) * g->W;                    \
                        for (int64_t ow = 0; ow < wlo; ow++) dst[ow] = 0;                  \
                        if (g->sw == 1) {                                                  \
                            /* Rows are short (a CNN's 14 or 28 pixels): a loop the        \
                             * compiler vectorizes beats a memcpy call. */                 \
                            const T *s1 = src + woff;                                      \
                            for (int64_t ow = wlo; ow < whi; ow++) dst[ow] = s1[ow];       \
                        } else {                                                           \
                            for (int64_t ow = wlo; ow < whi; ow++)                         \
                                dst[ow] = src[ow * g->sw + woff];                          \
                        }                                                                  \
                        for (int64_t ow = whi; ow < g->OW; ow++) dst[ow] = 0;              \
                    }                                                                      \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
    }

/* The arithmetic helpers (f32 and f64 only; bf16 columns are only copied). */
#define NB__CONV_TYPED(T, S)                                                                \
    /* Stride 1: accumulate into the zeroed padded buffer xp without any clipping, then   \
     * copy its interior out. */                                                           \
    static void col2im_padded_##S(const nb__conv2d_geom *g, const T *col, T *x, T *xp) {   \
        int64_t L = g->OH * g->OW, Hp = g->H + 2 * g->ph, Wp = g->W + 2 * g->pw;           \
        int64_t OW = g->OW;                                                                \
        memset(xp, 0, sizeof(T) * (size_t)(g->C * Hp * Wp));                               \
        for (int64_t c = 0; c < g->C; c++)                                                 \
            for (int64_t ki = 0; ki < g->KH; ki++)                                         \
                for (int64_t kj = 0; kj < g->KW; kj++) {                                   \
                    const T *row = col + ((c * g->KH + ki) * g->KW + kj) * L;              \
                    T *dst = xp + c * Hp * Wp + ki * g->dh * Wp + kj * g->dw;              \
                    for (int64_t oh = 0; oh < g->OH; oh++) {                               \
                        T *d1 = dst + oh * g->sh * Wp;                                     \
                        const T *s1 = row + oh * OW;                                       \
                        for (int64_t ow = 0; ow < OW; ow++) d1[ow] += s1[ow];              \
                    }                                                                      \
                }                                                                          \
        for (int64_t c = 0; c < g->C; c++)                                                 \
            for (int64_t h = 0; h < g->H; h++)                                             \
                memcpy(x + (c * g->H + h) * g->W, xp + (c * Hp + g->ph + h) * Wp + g->pw,  \
                       sizeof(T) * (size_t)g->W);                                          \
    }                                                                                      \
                                                                                           \
    /* x (C, H, W) = the sum of col's entries over the windows that read each pixel. */    \
    static void col2im_##S(const nb__conv2d_geom *g, const T *col, T *x, T *xp) {          \
        if (g->sw == 1) {                                                                  \
            col2im_padded_##S(g, col, x, xp);                                              \
            return;                                                                        \
        }                                                                                  \
        int64_t L = g->OH * g->OW;                                                         \
        memset(x, 0, sizeof(T) * (size_t)(g->C * g->H * g->W));                            \
        for (int64_t c = 0; c < g->C; c++) {                                               \
            T *xc = x + c * g->H * g->W;                                                   \
            for (int64_t ki = 0; ki < g->KH; ki++) {                                       \
                int64_t hoff = ki * g->dh - g->ph, hlo, hhi;                               \
                valid_range(hoff, g->sh, g->H, g->OH, &hlo, &hhi);                         \
                for (int64_t kj = 0; kj < g->KW; kj++) {                                   \
                    const T *row = col + ((c * g->KH + ki) * g->KW + kj) * L;              \
                    int64_t woff = kj * g->dw - g->pw, wlo, whi;                           \
                    valid_range(woff, g->sw, g->W, g->OW, &wlo, &whi);                     \
                    for (int64_t oh = hlo; oh < hhi; oh++) {                               \
                        const T *src = row + oh * g->OW;                                   \
                        T *dst = xc + (oh * g->sh + hoff) * g->W + woff;                   \
                        if (g->sw == 1) {                                                  \
                            for (int64_t ow = wlo; ow < whi; ow++) dst[ow] += src[ow];     \
                        } else {                                                           \
                            for (int64_t ow = wlo; ow < whi; ow++)                         \
                                dst[ow * g->sw] += src[ow];                                \
                        }                                                                  \
                    }                                                                      \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
    }                                                                                      \
                                                                                           \
    static void add_bias_##S(int64_t O, int64_t L, const T *b, T *y) {                     \
        for (int64_t o = 0; o < O; o++) {                                                  \
            T v = b[o], *r = y + o * L;                                                    \
            for (int64_t l = 0; l < L; l++) r[l] += v;                                     \
        }                                                                                  \
    }                                                                                      \
                                                                                           \
    /* sum(r[0..L)) in 16 lanes (one vector of f32), added up in double in a fixed order. */ \
    static double row_sum_##S(const T *r, int64_t L) {                                     \
        T acc[16] = {0};                                                                   \
        double s = 0;                                                                      \
        int64_t l = 0;                                                                     \
        for (; l + 16 <= L; l += 16)                                                       \
            for (int j = 0; j < 16; j++) acc[j] += r[l + j];                               \
        for (; l < L; l++) s += (double)r[l];                                              \
        for (int j = 0; j < 16; j++) s += (double)acc[j];                                  \
        return s;                                                                          \
    }                                                                                      \
                                                                                           \
    /* gb[o] = sum over images and positions of gy (N, O, L), in double, in a fixed order. */ \
    typedef struct bias_job_##S {                                                          \
        const nb__conv2d_geom *g;                                                          \
        const T *gy;                                                                       \
        T *gb;                                                                             \
    } bias_job_##S;                                                                        \
                                                                                           \
    static void bias_range_##S(int64_t lo, int64_t hi, void *p) {                          \
        const bias_job_##S *j = p;                                                         \
        int64_t N = j->g->N, O = j->g->O, L = j->g->OH * j->g->OW;                         \
        for (int64_t o = lo; o < hi; o++) {                                                \
            double s = 0;                                                                  \
            for (int64_t n = 0; n < N; n++) s += row_sum_##S(j->gy + (n * O + o) * L, L);  \
            j->gb[o] = (T)s;                                                               \
        }                                                                                  \
    }                                                                                      \
                                                                                           \
    static void bias_grad_##S(const nb__conv2d_geom *g, const T *gy, T *gb) {              \
        int64_t O = g->O, L = g->OH * g->OW;                                               \
        int nt = nb__threads_for(g->N * O * L, NB__GRAIN);                                 \
        if (nt > O) nt = O > 0 ? (int)O : 1;                                               \
        bias_job_##S j = {g, gy, gb};                                                      \
        nb__parallel_range(O, nt, bias_range_##S, &j);                                     \
    }                                                                                      \
                                                                                           \
    /* gw += parts[0] + parts[1] + ... (each part `stride` elements apart), in that order. */ \
    typedef struct parts_job_##S {                                                         \
        T *gw;                                                                             \
        const T *parts;                                                                    \
        int nparts;                                                                        \
        int64_t stride;                                                                    \
    } parts_job_##S;                                                                       \
                                                                                           \
    static void parts_range_##S(int64_t lo, int64_t hi, void *p) {                         \
        const parts_job_##S *j = p;                                                        \
        for (int64_t i = lo; i < hi; i++) {                                                \
            T s = j->gw[i];                                                                \
            for (int q = 0; q < j->nparts; q++) s += j->parts[q * j->stride + i];          \
            j->gw[i] = s;                                                                  \
        }                                                                                  \
    }                                                                                      \
                                                                                           \
    static void sum_parts_##S(T *gw, const T *parts, int nparts, int64_t n, int64_t stride) { \
        int nt = nb__threads_for(n * nparts, NB__GRAIN);                                   \
        parts_job_##S j = {gw, parts, nparts, stride};                                     \
        nb__parallel_range(n, nt, parts_range_##S, &j);                                    \
    }

NB__CONV_COLUMNS(float, f32)
NB__CONV_COLUMNS(double, f64)
NB__CONV_COLUMNS(uint16_t, bf16)
NB__CONV_TYPED(float, f32)
NB__CONV_TYPED(double, f64)

/* ---- shared driver --------------------------------------------------------------------------- */
typedef struct conv_ctx {
    const nb__conv2d_geom *g;
    const conv_plan *p;
    bool f64;
    size_t es;
    int64_t L, Og, Kg, Cg;
    const char *x, *w, *b, *gy;
    char *y, *gx, *gw;
    char *scratch;        /* laid out as the plan says */
    size_t colb, wstride; /* bytes per column buffer, per dW partial */
} conv_ctx;

static nb_status gemm_any(bool f64, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                          const void *A, int64_t lda, const void *B, int64_t ldb, bool acc,
                          void *C, int64_t ldc) {
    if (f64)
        return nb__gemm_f64(ta, tb, M, N, K, 1.0, A, lda, B, ldb, acc ? 1.0 : 0.0, C, ldc);
    return nb__gemm_f32(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, acc ? 1.0f : 0.0f, C, ldc);
}

static void im2col_any(const conv_ctx *c, const char *x, char *col) {
    char *xp = col + colmat_bytes(c->g, c->es);
    if (c->f64) im2col_f64(c->g, (const double *)x, (double *)col, (double *)xp);
    else im2col_f32(c->g, (const float *)x, (float *)col, (float *)xp);
}

static char *col_buffer(const conv_ctx *c, int slot) {
    return c->scratch + (size_t)slot * c->colb;
}

static nb_status fwd_image(const conv_ctx *c, int64_t n, int slot) {
    const nb__conv2d_geom *g = c->g;
    const char *xn = c->x + (size_t)(n * g->C * g->H * g->W) * c->es;
    char *yn = c->y + (size_t)(n * g->O * c->L) * c->es;
    if (c->p->direct) {
        nb__conv_direct_forward(g, (const float *)xn, (const float *)c->w, (const float *)c->b,
                                (float *)yn, (float *)col_buffer(c, slot));
        return NB_OK;
    }
    const char *B = xn;
    if (!c->p->pointwise) {
        char *col = col_buffer(c, slot);
        im2col_any(c, xn, col);
        B = col;
    }
    for (int64_t gi = 0; gi < g->groups; gi++) {
        nb_status st = gemm_any(c->f64, false, false, c->Og, c->L, c->Kg,
                                c->w + (size_t)(gi * c->Og * c->Kg) * c->es, c->Kg,
                                B + (size_t)(gi * c->Kg * c->L) * c->es, c->L, false,
                                yn + (size_t)(gi * c->Og * c->L) * c->es, c->L);
        if (st != NB_OK) return st;
    }
    if (c->b) {
        if (c->f64) add_bias_f64(g->O, c->L, (const double *)c->b, (double *)yn);
        else add_bias_f32(g->O, c->L, (const float *)c->b, (float *)yn);
    }
    return NB_OK;
}

/* Images [n0, n1): accumulate their weight gradient into gwp and their bias gradient into
 * gbp (each when non-NULL; the first image overwrites them), and write their input
 * gradients (when c->gx). */
static nb_status bwd_images(const conv_ctx *c, int64_t n0, int64_t n1, char *gwp,
                            double *gbp, int slot) {
    const nb__conv2d_geom *g = c->g;
    size_t es = c->es;
    nb_status st;
    for (int64_t n = n0; n < n1; n++) {
        const char *gyn = c->gy + (size_t)(n * g->O * c->L) * es;
        if (gwp && c->p->direct) {
            nb__conv_direct_wgrad(g, (const float *)(c->x + (size_t)(n * g->C * g->H * g->W) * es),
                                  (const float *)gyn, (float *)gwp, n > n0,
                                  (float *)col_buffer(c, slot));
        } else if (gwp) {
            const char *xn = c->x + (size_t)(n * g->C * g->H * g->W) * es;
            const char *B = xn;
            if (!c->p->pointwise) {
                char *col = col_buffer(c, slot);
                im2col_any(c, xn, col);
                B = col;
            }
            /* gw_g (Og x Kg) += gy_g (Og x L) @ col_g^T (L x Kg) */
            for (int64_t gi = 0; gi < g->groups; gi++)
                if ((st = gemm_any(c->f64, false, true, c->Og, c->Kg, c->L,
                                   gyn + (size_t)(gi * c->Og * c->L) * es, c->L,
                                   B + (size_t)(gi * c->Kg * c->L) * es, c->L, n > n0,
                                   gwp + (size_t)(gi * c->Og * c->Kg) * es, c->Kg)) != NB_OK)
                    return st;
        }
        if (gbp) {
            /* gy_n was just read by the GEMM above: it is still in cache. */
            for (int64_t o = 0; o < g->O; o++) {
                const char *r = gyn + (size_t)(o * c->L) * es;
                double v = c->f64 ? row_sum_f64((const double *)r, c->L)
                                  : row_sum_f32((const float *)r, c->L);
                gbp[o] = n > n0 ? gbp[o] + v : v;
            }
        }
        if (c->gx) {
            char *gxn = c->gx + (size_t)(n * g->C * g->H * g->W) * es;
            /* dcol_g (Kg x L) = w_g^T (Kg x Og) @ gy_g (Og x L); pointwise: dcol is gx. */
            char *D = c->p->pointwise ? gxn : col_buffer(c, slot);
            for (int64_t gi = 0; gi < g->groups; gi++)
                if ((st = gemm_any(c->f64, true, false, c->Kg, c->L, c->Og,
                                   c->w + (size_t)(gi * c->Og * c->Kg) * es, c->Kg,
                                   gyn + (size_t)(gi * c->Og * c->L) * es, c->L, false,
                                   D + (size_t)(gi * c->Kg * c->L) * es, c->L)) != NB_OK)
                    return st;
            if (!c->p->pointwise) {
                char *xp = D + colmat_bytes(g, es);
                if (c->f64) col2im_f64(g, (const double *)D, (double *)gxn, (double *)xp);
                else col2im_f32(g, (const float *)D, (float *)gxn, (float *)xp);
            }
        }
    }
    return NB_OK;
}

/* One backward work unit: a chunk of images with its own dW partial, or (no dW wanted)
 * one image. */
static nb_status bwd_unit(const conv_ctx *c, int64_t u, int slot) {
    int64_t N = c->g->N;
    if (!c->gw) return bwd_images(c, u, u + 1, NULL, NULL, slot);
    int P = c->p->nparts;
    int64_t n0 = u * N / P, n1 = (u + 1) * N / P;
    char *gwp = u == 0 ? c->gw : c->scratch + c->p->parts_offset + (size_t)(u - 1) * c->wstride;
    double *gbp = NULL;
    if (c->p->fused_bias)
        gbp = (double *)(c->scratch + c->p->bias_offset +
                         (size_t)u * align64((size_t)c->g->O * sizeof(double)));
    return bwd_images(c, n0, n1, gwp, gbp, slot);
}

typedef nb_status (*unit_fn)(const conv_ctx *, int64_t, int);

/* run_units' job (the first failure: nb__task_status). */
typedef struct units_job {
    const conv_ctx *c;
    unit_fn fn;
    nb__task_status ts;
} units_job;

static void unit_task(int64_t u, void *p) {
    units_job *j = p;
    if (nb__task_failed(&j->ts)) return;
    /* The task's slot is its thread's column buffer: the plan has one per thread. */
    nb_status s = j->fn(j->c, u, nb__task_slot());
    if (s != NB_OK) nb__task_fail(&j->ts, s);
}

/* Run fn(c, u, slot) for u in [0, units) on the plan's threads (slot: the thread's column
 * buffer); the first failure's status and message are carried back to the calling thread. */
static nb_status run_units(const conv_ctx *c, int64_t units, unit_fn fn) {
    int nt = c->p->nthreads;
    if (nt <= 1) {
        /* Not as a task: a lone GEMM may then use the provider's threads (inside a task it
         * runs single-threaded). */
        for (int64_t u = 0; u < units; u++) {
            nb_status st = fn(c, u, 0);
            if (st != NB_OK) return st;
        }
        return NB_OK;
    }
    /* Units are claimed one at a time, as schedule(dynamic, 1) did: chunks of images vary in
     * cost, and which thread runs a unit never changes what it computes. */
    units_job j = {.c = c, .fn = fn};
    nb__run_tasks(units, nt, unit_task, &j);
    return nb__task_result(&j.ts);
}

static conv_ctx make_ctx(const nb__conv2d_geom *g, const conv_plan *p, bool f64, void *scratch) {
    conv_ctx c = {.g = g, .p = p, .f64 = f64, .es = f64 ? sizeof(double) : sizeof(float)};
    c.L = g->OH * g->OW;
    c.Cg = g->C / g->groups;
    c.Og = g->O / g->groups;
    c.Kg = c.Cg * g->KH * g->KW;
    c.scratch = scratch;
    c.colb = p->col_bytes;
    c.wstride = align64((size_t)(g->O * c.Kg) * c.es);
    return c;
}

/* ---- the kernels ---------------------------------------------------------------------------- */
/* One scratch block of the plan's size from the caching host allocator (NULL + error). */
static void *scratch_alloc(size_t bytes) { return nb_host_alloc(bytes > 64 ? bytes : 64); }

static nb_status cpu_conv2d(const nb__conv2d_args *a) {
    const nb__conv2d_geom *g = &a->g;
    bool f64 = a->dtype == NB_F64;
#if NB_HAVE_DNNL
    if (!f64 && nb__conv_dnnl_wanted(g)) {
        if (!nb__dnnl("conv2d")) return nb_last_status();
        nb_status st = nb__conv_dnnl_forward(g, dnnl_f32, a->x, a->w, a->b, a->y);
        if (st != NB_EUNSUPPORTED) return st;
    }
#endif
    conv_plan p = plan_make(g, f64 ? sizeof(double) : sizeof(float), false, false, false, false);
    void *scratch = scratch_alloc(p.scratch_bytes);
    if (!scratch) return NB_ENOMEM;
    conv_ctx c = make_ctx(g, &p, f64, scratch);
    c.x = a->x, c.w = a->w, c.b = a->b, c.y = a->y;
    nb_status st = run_units(&c, g->N, fwd_image);
    nb_host_free(scratch);
    return st;
}

static nb_status conv_bwd(const nb__conv2d_geom *g, const conv_plan *p, bool f64,
                          const void *x, const void *w, const void *gy, void *gx, void *gw,
                          void *gb, void *scratch) {
    conv_ctx c = make_ctx(g, p, f64, scratch);
    c.x = x, c.w = w, c.gy = gy, c.gx = gx, c.gw = gw;
    int64_t wn = g->O * c.Kg;
    if (g->N == 0) {
        if (gw) memset(gw, 0, (size_t)wn * c.es);
        if (gb) memset(gb, 0, (size_t)g->O * c.es);
        return NB_OK;
    }
#if NB_HAVE_DNNL
    if (gx && !f64 && nb__conv_dnnl_wanted(g)) {
        if (!nb__dnnl("conv2d backward")) return nb_last_status();
        nb_status st = nb__conv_dnnl_backward_data(g, dnnl_f32, w, gy, gx);
        if (st == NB_OK) c.gx = NULL; /* done */
        else if (st != NB_EUNSUPPORTED) return st;
    }
#endif
    if (gw || c.gx) {
        nb_status st = run_units(&c, gw ? p->nparts : g->N, bwd_unit);
        if (st != NB_OK) return st;
    }
    if (gw && p->nparts > 1) {
        char *parts = c.scratch + p->parts_offset;
        int64_t stride = (int64_t)(c.wstride / c.es);
        if (f64) sum_parts_f64(gw, (const double *)parts, p->nparts - 1, wn, stride);
        else sum_parts_f32(gw, (const float *)parts, p->nparts - 1, wn, stride);
    }
    if (gb && p->fused_bias) {
        size_t bstride = align64((size_t)g->O * sizeof(double)) / sizeof(double);
        const double *parts = (const double *)(c.scratch + p->bias_offset);
        for (int64_t o = 0; o < g->O; o++) {
            double s = 0;
            for (int u = 0; u < p->nparts; u++) s += parts[(size_t)u * bstride + (size_t)o];
            if (f64) ((double *)gb)[o] = s;
            else ((float *)gb)[o] = (float)s;
        }
    } else if (gb) {
        if (f64) bias_grad_f64(g, gy, gb);
        else bias_grad_f32(g, gy, gb);
    }
    return NB_OK;
}

static nb_status cpu_conv2d_backward(const nb__conv2d_backward_args *a) {
    const nb__conv2d_geom *g = &a->g;
    bool f64 = a->dtype == NB_F64;
    conv_plan p = plan_make(g, f64 ? sizeof(double) : sizeof(float), true, a->gx != NULL,
                            a->gw != NULL, a->gb != NULL);
    void *scratch = scratch_alloc(p.scratch_bytes);
    if (!scratch) return NB_ENOMEM;
    nb_status st = conv_bwd(g, &p, f64, a->x, a->w, a->gy, a->gx, a->gw, a->gb, scratch);
    nb_host_free(scratch);
    return st;
}

/* ---- bf16 ------------------------------------------------------------------------------------
 * bf16 x, w and gy; f32 bias, weight and bias gradients; bf16 y and gx (tensor/kernels/conv.h).
 * Every product and sum is in f32 and each bf16 result is rounded once. Where oneDNN runs
 * bf16 natively (nb_conv_bf16_native: AVX512-BF16) and would run the f32 convolution too
 * (nb__conv_dnnl_wanted), the forward and the input gradient are oneDNN's bf16 convolution
 * primitives
 * (one output element per thread, as in f32, so the bits do not depend on the thread count),
 * and the weight gradient is im2col in bf16 + the bf16 GEMM (oneDNN's bf16 matmul on shape-only
 * tiles, cpu/gemm.c) over the same fixed image chunks as f32, summed in the same fixed order;
 * the bias gradient is summed in double. Otherwise (no oneDNN, no AVX512-BF16, NB_CONV=im2col,
 * or a small convolution) the operands are widened to f32 and the f32 kernels above run: the
 * same products, at the f32 rate. */
bool nb_conv_bf16_native(void) {
#if NB_HAVE_DNNL
    if (nb__conv2d_impl() == NB__CONV_IM2COL) return false;
    if (!nb__dnnl_ok()) return false; /* the f32 path then says why */
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    if (((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core_bf16) !=
        (unsigned)dnnl_cpu_isa_avx512_core_bf16)
        return false;
    return nb__conv_dnnl_engine_ok();
#else
    return false;
#endif
}

const char *nb_conv_bf16_path(void) {
    if (nb_conv_bf16_native()) return "dnnl convolution bf16 (AVX512-BF16)";
#if NB_HAVE_DNNL
    if (nb__conv2d_impl() == NB__CONV_IM2COL)
        return "f32 convolution after conversion (NB_CONV=im2col)";
    return "f32 convolution after conversion (this CPU or oneDNN build has no AVX512-BF16)";
#else
    return "f32 convolution after conversion (built without oneDNN)";
#endif
}

static inline float bf16f(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } v = {.u = (uint32_t)h << 16};
    return v.f;
}

/* A fresh f32 copy of n bf16 values (NULL + error when out of memory). */
static float *widened(const void *src, int64_t n) {
    float *p = nb_host_alloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (p && n > 0) nb__bf16_to_f32_n(src, p, n);
    return p;
}

/* Whether this convolution runs on the bf16 kernels (else it is widened to f32). */
static bool bf16_fast(const nb__conv2d_geom *g) {
#if NB_HAVE_DNNL
    return nb_conv_bf16_native() && nb__conv_dnnl_wanted(g);
#else
    (void)g;
    return false;
#endif
}

static int64_t numel_x(const nb__conv2d_geom *g) { return g->N * g->C * g->H * g->W; }
static int64_t numel_w(const nb__conv2d_geom *g) { return g->O * (g->C / g->groups) * g->KH * g->KW; }
static int64_t numel_y(const nb__conv2d_geom *g) { return g->N * g->O * g->OH * g->OW; }

static nb_status conv2d_bf16(const nb__conv2d_args *a) {
    const nb__conv2d_geom *g = &a->g;
#if NB_HAVE_DNNL
    if (bf16_fast(g)) {
        nb_status st = nb__conv_dnnl_forward(g, dnnl_bf16, a->x, a->w, a->b, a->y);
        if (st != NB_EUNSUPPORTED) return st;
    }
#endif
    int64_t ny = numel_y(g);
    float *x32 = widened(a->x, numel_x(g));
    float *w32 = x32 ? widened(a->w, numel_w(g)) : NULL;
    float *y32 = w32 ? nb_host_alloc(sizeof(float) * (size_t)(ny > 0 ? ny : 1)) : NULL;
    nb_status st = y32 ? NB_OK : nb_last_status();
    if (y32) {
        nb__conv2d_args f = *a;
        f.dtype = NB_F32, f.x = x32, f.w = w32, f.y = y32;
        if ((st = cpu_conv2d(&f)) == NB_OK) nb__f32_to_bf16_n(y32, a->y, ny);
    }
    nb_host_free(y32);
    nb_host_free(w32);
    nb_host_free(x32);
    return st;
}

/* One chunk of images of the bf16 weight gradient: into gw (chunk 0) or its partial. */
static nb_status bf_wunit(const conv_ctx *c, int64_t u, int slot) {
    const nb__conv2d_geom *g = c->g;
    int P = c->p->nparts;
    int64_t n0 = u * g->N / P, n1 = (u + 1) * g->N / P;
    float *gwp = (float *)(u == 0 ? c->gw
                                  : c->scratch + c->p->parts_offset + (size_t)(u - 1) * c->wstride);
    for (int64_t n = n0; n < n1; n++) {
        const uint16_t *gyn = (const uint16_t *)c->gy + n * g->O * c->L;
        const uint16_t *B = (const uint16_t *)c->x + n * g->C * g->H * g->W;
        if (!c->p->pointwise) {
            uint16_t *col = (uint16_t *)col_buffer(c, slot);
            im2col_bf16(g, B, col, (uint16_t *)((char *)col + colmat_bytes(g, sizeof(uint16_t))));
            B = col;
        }
        /* gw_g (Og x Kg) += gy_g (Og x L) @ col_g^T (L x Kg), summed in f32 */
        for (int64_t gi = 0; gi < g->groups; gi++) {
            nb_status st = nb__gemm_bf16(false, true, c->Og, c->Kg, c->L, 1.0f,
                                         gyn + gi * c->Og * c->L, c->L, B + gi * c->Kg * c->L,
                                         c->L, n > n0 ? 1.0f : 0.0f, gwp + gi * c->Og * c->Kg,
                                         c->Kg);
            if (st != NB_OK) return st;
        }
    }
    return NB_OK;
}

static nb_status wgrad_bf16(const nb__conv2d_geom *g, const void *x, const void *gy, float *gw) {
    conv_plan p = plan_make(g, sizeof(uint16_t), true, false, true, false);
    int64_t wn = numel_w(g);
    size_t wstride = align64((size_t)wn * sizeof(float)); /* the partials are f32 */
    p.bias_offset = p.parts_offset + (size_t)(p.nparts - 1) * wstride;
    p.scratch_bytes = p.bias_offset;
    void *scratch = scratch_alloc(p.scratch_bytes);
    if (!scratch) return NB_ENOMEM;
    conv_ctx c = make_ctx(g, &p, false, scratch);
    c.es = sizeof(uint16_t), c.wstride = wstride;
    c.x = x, c.gy = gy, c.gw = (char *)gw;
    nb_status st = run_units(&c, p.nparts, bf_wunit);
    if (st == NB_OK && p.nparts > 1)
        sum_parts_f32(gw, (const float *)(c.scratch + p.parts_offset), p.nparts - 1, wn,
                      (int64_t)(wstride / sizeof(float)));
    nb_host_free(scratch);
    return st;
}

/* gb[o] = the sum of bf16 gy over images and positions: 16 f32 lanes per row, rows added
 * in double, in a fixed order. */
typedef struct bias_job_bf16 {
    const nb__conv2d_geom *g;
    const uint16_t *gy;
    float *gb;
} bias_job_bf16;

static void bias_range_bf16(int64_t lo, int64_t hi, void *p) {
    const bias_job_bf16 *job = p;
    const nb__conv2d_geom *g = job->g;
    int64_t O = g->O, L = g->OH * g->OW;
    const uint16_t *gy = job->gy;
    float *gb = job->gb;
    for (int64_t o = lo; o < hi; o++) {
        double s = 0;
        for (int64_t n = 0; n < g->N; n++) {
            const uint16_t *r = gy + (n * O + o) * L;
            float acc[16] = {0};
            int64_t l = 0;
            for (; l + 16 <= L; l += 16)
                for (int j = 0; j < 16; j++) acc[j] += bf16f(r[l + j]);
            for (; l < L; l++) s += (double)bf16f(r[l]);
            for (int j = 0; j < 16; j++) s += (double)acc[j];
        }
        gb[o] = (float)s;
    }
}

static void bias_grad_bf16(const nb__conv2d_geom *g, const uint16_t *gy, float *gb) {
    int64_t O = g->O, L = g->OH * g->OW;
    int nt = nb__threads_for(g->N * O * L, NB__GRAIN);
    if (nt > O) nt = O > 0 ? (int)O : 1;
    bias_job_bf16 j = {g, gy, gb};
    nb__parallel_range(O, nt, bias_range_bf16, &j);
}

static nb_status conv2d_backward_bf16(const nb__conv2d_backward_args *a) {
    const nb__conv2d_geom *g = &a->g;
    void *gx = a->gx;
    float *gw = a->gw, *gb = a->gb;
    if (g->N == 0) {
        if (gw) memset(gw, 0, sizeof(float) * (size_t)numel_w(g));
        if (gb) memset(gb, 0, sizeof(float) * (size_t)g->O);
        return NB_OK;
    }
    nb_status st;
    bool fast = bf16_fast(g);
#if NB_HAVE_DNNL
    if (gx && fast) {
        st = nb__conv_dnnl_backward_data(g, dnnl_bf16, a->w, a->gy, gx);
        if (st == NB_OK) gx = NULL; /* done */
        else if (st != NB_EUNSUPPORTED) return st;
    }
#endif
    if (gw && fast) {
        if ((st = wgrad_bf16(g, a->x, a->gy, gw)) != NB_OK) return st;
        gw = NULL;
    }
    if (gb && fast) {
        bias_grad_bf16(g, a->gy, gb);
        gb = NULL;
    }
    if (!gx && !gw && !gb) return NB_OK;
    /* What is left runs in f32 on widened operands. */
    int64_t nx = numel_x(g);
    float *gy32 = widened(a->gy, numel_y(g));
    float *x32 = gy32 && gw ? widened(a->x, nx) : NULL;
    float *w32 = gy32 && gx ? widened(a->w, numel_w(g)) : NULL;
    float *gx32 = gy32 && gx ? nb_host_alloc(sizeof(float) * (size_t)nx) : NULL;
    if (!gy32 || (gw && !x32) || (gx && (!w32 || !gx32))) {
        st = nb_last_status() != NB_OK ? nb_last_status() : NB_ENOMEM;
    } else {
        nb__conv2d_backward_args f = {.g = *g, .dtype = NB_F32, .x = x32, .w = w32,
                                      .gy = gy32, .gx = gx32, .gw = gw, .gb = gb};
        if ((st = cpu_conv2d_backward(&f)) == NB_OK && gx) nb__f32_to_bf16_n(gx32, gx, nx);
    }
    nb_host_free(gx32);
    nb_host_free(w32);
    nb_host_free(x32);
    nb_host_free(gy32);
    return st;
}

static nb_status cpu_conv2d_any(const nb__conv2d_args *a) {
    return a->dtype == NB_BF16 ? conv2d_bf16(a) : cpu_conv2d(a);
}

static nb_status cpu_conv2d_backward_any(const nb__conv2d_backward_args *a) {
    return a->dtype == NB_BF16 ? conv2d_backward_bf16(a) : cpu_conv2d_backward(a);
}

void nb__cpu_register_conv(nb__kernels *k) {
    k->conv2d = cpu_conv2d_any;
    k->conv2d_backward = cpu_conv2d_backward_any;
    nb__cpu_register_pool(k);
}
