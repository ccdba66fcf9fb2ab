/* cpu/softmax.c - the CPU kernel of the fused softmax / log_softmax (cpu/reduce.h; registered
 * with the reductions by nb__cpu_register_reduce in cpu/reduce.c). */
#include "cpu/backend.h"
#include "cpu/fastmath.h"
#include "cpu/reduce.h"
#include "cpu/reduce_blocks.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* ---- softmax ------------------------------------------------------------------------------
 * The input is seen as (O, L, D) with the softmax dim in the middle. D == 1: each row is
 * dense; f32 rows get a max pass, a pass writing exp(x - max) and summing it, and a scaling
 * pass over the output while it sits in cache (f64 and half rows: max, sum of exp, write).
 * D > 1: blocks of W columns get max, sum of exp, write, vectorized across the columns. A NaN
 * makes its whole row NaN and a row of -inf gives NaN, as in PyTorch. x may alias y: every
 * pass reads an element before the last pass writes it. */

/* Max of a dense f32 row, NaNs ignored: softmax needs no NaN flag, since a NaN makes the sum
 * of exps NaN and with it every output of its row, whatever the max is. This is the pass
 * that reads the row from memory, so it prefetches. */
typedef int32_t nb__v16i __attribute__((vector_size(64)));

static inline nb__v16f vmax(nb__v16f a, nb__v16f b) {
    nb__v16i c = b > a;
    return (nb__v16f)((c & (nb__v16i)b) | (~c & (nb__v16i)a));
}

static float f32_rowmax(const float *x, int64_t n) {
    nb__v16f m0 = (nb__v16f){0} - INFINITY, m1 = m0, m2 = m0, m3 = m0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        pf_block(x + i, 64 * sizeof(float));
        m0 = vmax(m0, vld(x + i)), m1 = vmax(m1, vld(x + i + 16));
        m2 = vmax(m2, vld(x + i + 32)), m3 = vmax(m3, vld(x + i + 48));
    }
    for (; i + 16 <= n; i += 16) m0 = vmax(m0, vld(x + i));
    float a[16];
    m0 = vmax(vmax(m0, m1), vmax(m2, m3));
    memcpy(a, &m0, sizeof a);
    float m = a[0];
    for (int k = 1; k < 16; k++) m = a[k] > m ? a[k] : m;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* The max; exp(x - max) written to y (log_softmax: only summed) and summed; then the scaling
 * pass over y, still in cache for rows that fit it. */
static void softmax_row_f32(const float *x, float *y, int64_t L, bool lg) {
    float m = f32_rowmax(x, L);
    double s = f32_expsum(x, L, m, lg ? NULL : y);
    if (!lg) {
        float inv = (float)(1.0 / s);
#pragma omp simd simdlen(16)
        for (int64_t i = 0; i < L; i++) y[i] *= inv;
    } else {
        float ls = (float)log(s);
#pragma omp simd simdlen(16)
        for (int64_t i = 0; i < L; i++) y[i] = (x[i] - m) - ls;
    }
}

static void softmax_row_f64(const double *x, double *y, int64_t L, bool lg) {
    double m = f64_max(x, L), s = f64_sumexp(x, L, m);
    if (!lg) {
        double inv = 1.0 / s;
        for (int64_t i = 0; i < L; i++) y[i] = exp(x[i] - m) * inv;
    } else {
        double ls = log(s);
        for (int64_t i = 0; i < L; i++) y[i] = (x[i] - m) - ls;
    }
}

static void store_f32_as(char *dst, nb_dtype dt, const float *src, int64_t n) {
    if (dt == NB_F32) memcpy(dst, src, (size_t)n * sizeof(float));
    else if (dt == NB_F16) nb__f32_to_f16_n(src, (uint16_t *)dst, n);
    else nb__f32_to_bf16_n(src, (uint16_t *)dst, n);
}

/* f16 / bf16 rows: blocks converted to f32 on the stack; exp is recomputed in the last pass
 * so the only rounding to the half type is the final one. */
static void softmax_row_half(const char *x, char *y, nb_dtype dt, int64_t L, bool lg) {
    float buf[RBLK];
    float m = -INFINITY;
    for (int64_t o = 0; o < L; o += RBLK) {
        int64_t n = L - o < RBLK ? L - o : RBLK;
        float b = f32_max(load_f32(x + o * 2, dt, 1, n, buf), n);
        m = (m != m || b != b) ? NAN : (b > m ? b : m);
    }
    double s = 0;
    for (int64_t o = 0; o < L; o += RBLK) {
        int64_t n = L - o < RBLK ? L - o : RBLK;
        s += f32_expsum(load_f32(x + o * 2, dt, 1, n, buf), n, m, NULL);
    }
    float inv = (float)(1.0 / s), ls = (float)log(s);
    for (int64_t o = 0; o < L; o += RBLK) {
        int64_t n = L - o < RBLK ? L - o : RBLK;
        load_f32(x + o * 2, dt, 1, n, buf);
        if (!lg) {
#pragma omp simd
            for (int64_t i = 0; i < n; i++) buf[i] = nb__fast_expf(buf[i] - m) * inv;
        } else {
#pragma omp simd
            for (int64_t i = 0; i < n; i++) buf[i] = (buf[i] - m) - ls;
        }
        store_f32_as(y + o * 2, dt, buf, n);
    }
}

/* Columns [0, w) of L rows of stride D elements starting at x / y (f32, f16, bf16). */
static void softmax_cols_f32(const char *x, char *y, nb_dtype dt, int64_t L, int64_t D,
                             int64_t w, bool lg) {
    int64_t rs = D * (int64_t)nb_dtype_size(dt);
    float m[COLW], a[COLW], buf[COLW], ob[COLW];
    double s[COLW];
    for (int64_t j = 0; j < w; j++) m[j] = -INFINITY, s[j] = 0;
    for (int64_t l = 0; l < L; l++) {
        const float *r = load_f32(x + l * rs, dt, 1, w, buf);
#pragma omp simd
        for (int64_t j = 0; j < w; j++) m[j] = (r[j] > m[j] || r[j] != r[j]) ? r[j] : m[j];
    }
    for (int64_t l = 0; l < L; l++) {
        const float *r = load_f32(x + l * rs, dt, 1, w, buf);
#pragma omp simd
        for (int64_t j = 0; j < w; j++) s[j] += nb__fast_expf(r[j] - m[j]);
    }
    for (int64_t j = 0; j < w; j++) a[j] = lg ? (float)log(s[j]) : (float)(1.0 / s[j]);
    for (int64_t l = 0; l < L; l++) {
        const float *r = load_f32(x + l * rs, dt, 1, w, buf);
        if (!lg) {
#pragma omp simd
            for (int64_t j = 0; j < w; j++) ob[j] = nb__fast_expf(r[j] - m[j]) * a[j];
        } else {
#pragma omp simd
            for (int64_t j = 0; j < w; j++) ob[j] = (r[j] - m[j]) - a[j];
        }
        store_f32_as(y + l * rs, dt, ob, w);
    }
}

static void softmax_cols_f64(const double *x, double *y, int64_t L, int64_t D, int64_t w,
                             bool lg) {
    double m[COLW], s[COLW];
    for (int64_t j = 0; j < w; j++) m[j] = -INFINITY, s[j] = 0;
    for (int64_t l = 0; l < L; l++)
        for (int64_t j = 0; j < w; j++) {
            double v = x[l * D + j];
            m[j] = (v > m[j] || v != v) ? v : m[j];
        }
    for (int64_t l = 0; l < L; l++)
        for (int64_t j = 0; j < w; j++) s[j] += exp(x[l * D + j] - m[j]);
    for (int64_t j = 0; j < w; j++) s[j] = lg ? log(s[j]) : 1.0 / s[j];
    for (int64_t l = 0; l < L; l++)
        for (int64_t j = 0; j < w; j++) {
            double v = x[l * D + j] - m[j];
            y[l * D + j] = lg ? v - s[j] : exp(v) * s[j];
        }
}

typedef struct softmax_job {
    const char *xp;
    char *yp;
    nb_dtype dt;
    int64_t es, L, D, W, nb;
    bool lg;
} softmax_job;

/* D == 1: dense rows o in [lo, hi). */
static void softmax_rows(int64_t lo, int64_t hi, void *p) {
    const softmax_job *j = p;
    const int64_t L = j->L, es = j->es;
    for (int64_t o = lo; o < hi; o++) {
        const char *xr = j->xp + o * L * es;
        char *yr = j->yp + o * L * es;
        if (j->dt == NB_F32) softmax_row_f32((const float *)xr, (float *)yr, L, j->lg);
        else if (j->dt == NB_F64) softmax_row_f64((const double *)xr, (double *)yr, L, j->lg);
        else softmax_row_half(xr, yr, j->dt, L, j->lg);
    }
}

/* D > 1: blocks t in [lo, hi) of W columns of one outer index. */
static void softmax_blocks(int64_t lo, int64_t hi, void *p) {
    const softmax_job *j = p;
    const int64_t L = j->L, D = j->D, W = j->W, es = j->es;
    for (int64_t t = lo; t < hi; t++) {
        int64_t o = t / j->nb, j0 = (t % j->nb) * W, w = D - j0 < W ? D - j0 : W;
        int64_t off = (o * L * D + j0) * es;
        if (j->dt == NB_F64)
            softmax_cols_f64((const double *)(j->xp + off), (double *)(j->yp + off), L, D, w,
                             j->lg);
        else softmax_cols_f32(j->xp + off, j->yp + off, j->dt, L, D, w, j->lg);
    }
}

nb_status nb__cpu_softmax(const nb__softmax_args *a) {
    int64_t O = a->outer, L = a->len, D = a->inner;
    if (O * L * D == 0) return NB_OK;
    bool lg = a->log;
    nb_dtype dt = a->dtype;
    int64_t es = (int64_t)nb_dtype_size(dt);
    const char *xp = a->x;
    char *yp = a->y;
    int nt = nb__threads_for(O * L * D, NB__GRAIN);
    softmax_job j = {.xp = xp, .yp = yp, .dt = dt, .es = es, .L = L, .D = D, .lg = lg};
    if (D == 1) {
        nb__parallel_range(O, nt, softmax_rows, &j);
        return NB_OK;
    }
    int64_t W = COLW;
    while (W > 16 && O * ((D + W - 1) / W) < 2 * nt) W /= 2;
    j.W = W, j.nb = (D + W - 1) / W;
    nb__parallel_range(O * j.nb, nt, softmax_blocks, &j);
    return NB_OK;
}
