/* cpu/reduce_back.c - fused backward kernels of the reduction ops: softmax_backward and
 * extreme_backward (declared in cpu/reduce.h; registered by cpu/reduce.c).
 *
 * Softmax backward sees its tensors as (O, L, D) with the softmax dim in the middle, like
 * the forward kernel in cpu/reduce.c. D == 1: each row is dense and gets two passes (the row
 * sum, then the write) while it sits in cache. D > 1: blocks of up to COLW adjacent columns
 * get the same two passes, vectorized across the columns. Sums accumulate in f64 in an order
 * fixed by the shape, so results never depend on the thread count.
 *
 * extreme_backward writes every element of dx once: zeros, and g at the selected index. */
#include "cpu/fastmath.h"
#include "cpu/reduce.h"

#include <math.h>
#include <string.h>

#define RBLK 1024 /* elements per converted block of a half row (stack buffers) */
#define COLW 128  /* widest column block of the D > 1 path */

/* exp is nb__fast_expf (cpu/fastmath.h). */

/* n dense elements at p of dtype dt (f32, f16, bf16) as f32: p itself for f32, else buf. */
static const float *load_f32(const char *p, nb_dtype dt, int64_t n, float *buf) {
    if (dt == NB_F32) return (const float *)p;
    if (dt == NB_F16) nb__f16_to_f32_n((const uint16_t *)p, buf, n);
    else nb__bf16_to_f32_n((const uint16_t *)p, buf, n);
    return buf;
}

static void store_f32(char *p, nb_dtype dt, const float *src, int64_t n) {
    if (dt == NB_F32) memcpy(p, src, (size_t)n * sizeof(float));
    else if (dt == NB_F16) nb__f32_to_f16_n(src, (uint16_t *)p, n);
    else nb__f32_to_bf16_n(src, (uint16_t *)p, n);
}

/* ---- softmax backward ----------------------------------------------------------------------- */
/* One dense row of L elements of dtype dt (f32 / f16 / bf16), in blocks of RBLK. */
static void smb_row_f32(const char *y, const char *g, char *dx, nb_dtype dt, int64_t L,
                        bool lg) {
    int64_t es = (int64_t)nb_dtype_size(dt);
    float yb[RBLK], gb[RBLK], ob[RBLK];
    double s = 0;
    for (int64_t o = 0; o < L; o += RBLK) {
        int64_t n = L - o < RBLK ? L - o : RBLK;
        const float *gr = load_f32(g + o * es, dt, n, gb);
        double bs = 0;
        if (lg) {
#pragma omp simd reduction(+ : bs)
            for (int64_t i = 0; i < n; i++) bs += gr[i];
        } else {
            const float *yr = load_f32(y + o * es, dt, n, yb);
#pragma omp simd reduction(+ : bs)
            for (int64_t i = 0; i < n; i++) bs += (double)gr[i] * (double)yr[i];
        }
        s += bs;
    }
    float sf = (float)s;
    for (int64_t o = 0; o < L; o += RBLK) {
        int64_t n = L - o < RBLK ? L - o : RBLK;
        const float *gr = load_f32(g + o * es, dt, n, gb);
        const float *yr = load_f32(y + o * es, dt, n, yb);
        float *out = dt == NB_F32 ? (float *)(dx + o * es) : ob;
        if (lg) {
#pragma omp simd
            for (int64_t i = 0; i < n; i++) out[i] = gr[i] - nb__fast_expf(yr[i]) * sf;
        } else {
#pragma omp simd
            for (int64_t i = 0; i < n; i++) out[i] = yr[i] * (gr[i] - sf);
        }
        if (dt != NB_F32) store_f32(dx + o * es, dt, ob, n);
    }
}

static void smb_row_f64(const double *y, const double *g, double *dx, int64_t L, bool lg) {
    double s = 0;
    if (lg)
        for (int64_t i = 0; i < L; i++) s += g[i];
    else
        for (int64_t i = 0; i < L; i++) s += g[i] * y[i];
    if (lg)
        for (int64_t i = 0; i < L; i++) dx[i] = g[i] - exp(y[i]) * s;
    else
        for (int64_t i = 0; i < L; i++) dx[i] = y[i] * (g[i] - s);
}

/* Columns [0, w) of L rows of stride D elements (f32, f16, bf16). */
static void smb_cols_f32(const char *y, const char *g, char *dx, nb_dtype dt, int64_t L,
                         int64_t D, int64_t w, bool lg) {
    int64_t rs = D * (int64_t)nb_dtype_size(dt);
    float yb[COLW], gb[COLW], ob[COLW], sf[COLW];
    double s[COLW];
    for (int64_t j = 0; j < w; j++) s[j] = 0;
    for (int64_t l = 0; l < L; l++) {
        const float *gr = load_f32(g + l * rs, dt, w, gb);
        if (lg) {
#pragma omp simd
            for (int64_t j = 0; j < w; j++) s[j] += gr[j];
        } else {
            const float *yr = load_f32(y + l * rs, dt, w, yb);
#pragma omp simd
            for (int64_t j = 0; j < w; j++) s[j] += (double)gr[j] * (double)yr[j];
        }
    }
    for (int64_t j = 0; j < w; j++) sf[j] = (float)s[j];
    for (int64_t l = 0; l < L; l++) {
        const float *gr = load_f32(g + l * rs, dt, w, gb);
        const float *yr = load_f32(y + l * rs, dt, w, yb);
        float *out = dt == NB_F32 ? (float *)(dx + l * rs) : ob;
        if (lg) {
#pragma omp simd
            for (int64_t j = 0; j < w; j++) out[j] = gr[j] - nb__fast_expf(yr[j]) * sf[j];
        } else {
#pragma omp simd
            for (int64_t j = 0; j < w; j++) out[j] = yr[j] * (gr[j] - sf[j]);
        }
        if (dt != NB_F32) store_f32(dx + l * rs, dt, ob, w);
    }
}

static void smb_cols_f64(const double *y, const double *g, double *dx, int64_t L, int64_t D,
                         int64_t w, bool lg) {
    double s[COLW];
    for (int64_t j = 0; j < w; j++) s[j] = 0;
    for (int64_t l = 0; l < L; l++)
        for (int64_t j = 0; j < w; j++) s[j] += lg ? g[l * D + j] : g[l * D + j] * y[l * D + j];
    for (int64_t l = 0; l < L; l++)
        for (int64_t j = 0; j < w; j++) {
            int64_t k = l * D + j;
            dx[k] = lg ? g[k] - exp(y[k]) * s[j] : y[k] * (g[k] - s[j]);
        }
}

/* What the row and column tasks read: the (O, L, D) shape, the dtype, the block width W and
 * the number of blocks per row nb (D > 1). */
typedef struct smb_job {
    int64_t L, D, W, nb, es;
    nb_dtype dt;
    bool lg;
    const char *y, *g;
    char *dx;
} smb_job;

/* Rows [lo, hi) (D == 1). */
static void smb_rows(int64_t lo, int64_t hi, void *p) {
    const smb_job *j = p;
    for (int64_t o = lo; o < hi; o++) {
        int64_t off = o * j->L * j->es;
        if (j->dt == NB_F64)
            smb_row_f64((const double *)(j->y + off), (const double *)(j->g + off),
                        (double *)(j->dx + off), j->L, j->lg);
        else smb_row_f32(j->y + off, j->g + off, j->dx + off, j->dt, j->L, j->lg);
    }
}

/* Column blocks [lo, hi) of the O * nb blocks (D > 1). */
static void smb_blocks(int64_t lo, int64_t hi, void *p) {
    const smb_job *j = p;
    int64_t L = j->L, D = j->D, W = j->W;
    for (int64_t t = lo; t < hi; t++) {
        int64_t o = t / j->nb, j0 = (t % j->nb) * W, w = D - j0 < W ? D - j0 : W;
        int64_t off = (o * L * D + j0) * j->es;
        if (j->dt == NB_F64)
            smb_cols_f64((const double *)(j->y + off), (const double *)(j->g + off),
                         (double *)(j->dx + off), L, D, w, j->lg);
        else smb_cols_f32(j->y + off, j->g + off, j->dx + off, j->dt, L, D, w, j->lg);
    }
}

nb_status nb__cpu_softmax_backward(const nb__softmax_backward_args *a) {
    int64_t O = a->outer, L = a->len, D = a->inner;
    if (O * L * D == 0) return NB_OK;
    smb_job j = {.L = L, .D = D, .es = (int64_t)nb_dtype_size(a->dtype), .dt = a->dtype,
                 .lg = a->log, .y = a->y, .g = a->g, .dx = a->dx};
    int nt = nb__threads_for(O * L * D, NB__GRAIN);
    if (D == 1) {
        nb__parallel_range(O, nt, smb_rows, &j);
        return NB_OK;
    }
    /* Narrower blocks when there are too few to keep the threads busy (each column's sums
     * run over l in order whatever the width, so the width may depend on the thread count). */
    int64_t W = COLW;
    while (W > 16 && O * ((D + W - 1) / W) < 2 * nt) W /= 2;
    j.W = W;
    j.nb = (D + W - 1) / W;
    nb__parallel_range(O * j.nb, nt, smb_blocks, &j);
    return NB_OK;
}

/* ---- max / min along a dim, backward -------------------------------------------------------- */
/* Outer rows [lo, hi) of dx (O, L, D): zeros, and g at each selected index. */
static void exb_rows(int64_t lo, int64_t hi, void *p) {
    const nb__extreme_backward_args *a = p;
    int64_t L = a->len, D = a->inner;
    size_t es = nb_dtype_size(a->dtype);
    for (int64_t o = lo; o < hi; o++) {
        char *dx = a->dx + (size_t)(o * L * D) * es;
        const char *g = a->g + (size_t)(o * D) * es;
        const int64_t *idx = a->idx + o * D;
        memset(dx, 0, (size_t)(L * D) * es);
        for (int64_t i = 0; i < D; i++)
            memcpy(dx + (size_t)(idx[i] * D + i) * es, g + (size_t)i * es, es);
    }
}

nb_status nb__cpu_extreme_backward(const nb__extreme_backward_args *a) {
    int64_t O = a->outer, L = a->len, D = a->inner;
    if (O * L * D == 0) return NB_OK;
    /* The indices come from the forward, but the caller may have written to them since. */
    for (int64_t k = 0; k < O * D; k++)
        if (a->idx[k] < 0 || a->idx[k] >= L)
            return nb__error(NB_EINDEX, "max/min backward: index %lld is out of range for a "
                             "dim of size %lld", (long long)a->idx[k], (long long)L);
    int nt = nb__threads_for(O * L * D, NB__GRAIN);
    nb__extreme_backward_args j = *a; /* the range function's context (not const) */
    nb__parallel_range(O, nt, exb_rows, &j);
    return NB_OK;
}

