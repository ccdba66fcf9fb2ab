/* cpu/optim_kernels.c - the CPU kernels of the optim family (tensor/kernels/optim.h): the
 * fused optimizer updates (sgd_step, adam_step, rmsprop_step, adagrad_step) and the
 * reductions and in-place ops behind gradient clipping (clip_abs_pow_sum, clip_abs_max,
 * clip_scale, clip_clamp).
 *
 * An update reads parameter, gradient and state once and writes parameter and state once:
 * one pass instead of the five to eight tensor ops PyTorch's single-tensor path runs. The
 * formulas keep PyTorch's operation order (e.g. Adam's denominator is sqrt(v) / bc2_sqrt
 * + eps, and addcdiv multiplies by the scalar before dividing) and round every scalar to the
 * element type first, so f32 results match PyTorch's to an ulp or two. Loops are plain and
 * branch-free inside (flags are hoisted into separate loop versions by the compiler), over
 * restrict pointers, so they vectorize; large arrays are cut into blocks spread over nabla's
 * workers (cpu/workers.c). Every element is computed independently, so the thread count never
 * changes a result. f32 and f64 here; the optimizer rejects other dtypes before calling. */
#include <math.h>

#include "cpu/backend.h"
#include "cpu/cpu_impl.h"
#include "nabla/memory.h"

/* Flags that guard stores (amsgrad, centered, momentum) are hoisted into separate loop
 * versions through always-inlined bodies, so each loop is straight-line code. Note: the
 * loops with a square root vectorize only when the build passes -fno-math-errno (GCC 12
 * ignores `#pragma GCC optimize("no-math-errno")` for sqrt); otherwise they run scalar. */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

#define BLOCK 8192 /* elements per parallel work item */

/* The work on elements [s, s + l) of one block; args is the kernel's argument struct. */
typedef void (*block_fn)(const void *args, int64_t s, int64_t l);

typedef struct blocks_job {
    const void *args;
    block_fn body;
    int64_t n;
} blocks_job;

/* Blocks [lo, hi): one body call per block, as before, so each element sees the same call
 * (and the same vector/scalar split) whichever piece holds its block. */
static void blocks_range(int64_t lo, int64_t hi, void *ctx) {
    const blocks_job *j = ctx;
    for (int64_t b = lo; b < hi; b++) {
        int64_t s = b * BLOCK, l = j->n - s < BLOCK ? j->n - s : BLOCK;
        j->body(j->args, s, l);
    }
}

/* Run body(args, start, len) over [0, n) in blocks, on nabla's workers when n is large.
 * Pieces are whole blocks, so threads never write the same cache line. */
static void for_blocks(int64_t n, const void *args, block_fn body) {
    int nt = nb__threads_for(n, NB__GRAIN);
    blocks_job j = {args, body, n};
    nb__parallel_range((n + BLOCK - 1) / BLOCK, nt, blocks_range, &j);
}

/* ---- SGD ------------------------------------------------------------------------------------ */
/* d = maximize ? -g : g;  d += wd * p;  buf = first ? d : buf * mom + (1 - damp) * d;
 * d = nesterov ? d + mom * buf : buf;  p += -lr * d */
#define DEF_SGD(T, SUF)                                                                     \
    static void sgd_##SUF(T *restrict p, const T *restrict g, T *restrict buf, int64_t n,   \
                          const nb__sgd_step_args *a) {                                     \
        const T wd = (T)a->weight_decay, mom = (T)a->momentum;                              \
        const T omd = (T)(1.0 - a->dampening), nlr = (T)(-a->lr);                           \
        const bool use_wd = a->weight_decay != 0, neg = a->maximize;                        \
        if (!buf) {                                                                         \
            for (int64_t i = 0; i < n; i++) {                                               \
                T d = neg ? -g[i] : g[i];                                                   \
                if (use_wd) d = d + wd * p[i];                                              \
                p[i] = p[i] + nlr * d;                                                      \
            }                                                                               \
            return;                                                                         \
        }                                                                                   \
        const bool init = a->init_buf, nest = a->nesterov;                                  \
        for (int64_t i = 0; i < n; i++) {                                                   \
            T d = neg ? -g[i] : g[i];                                                       \
            if (use_wd) d = d + wd * p[i];                                                  \
            T bb = init ? d : buf[i] * mom + omd * d;                                       \
            buf[i] = bb;                                                                    \
            d = nest ? d + mom * bb : bb;                                                   \
            p[i] = p[i] + nlr * d;                                                          \
        }                                                                                   \
    }
DEF_SGD(float, f32)
DEF_SGD(double, f64)

static void sgd_block(const void *args, int64_t s, int64_t l) {
    const nb__sgd_step_args *a = args;
    void *param = a->param, *buf = a->buf;
    const void *grad = a->grad;
    if (a->dtype == NB_F32)
        sgd_f32((float *)param + s, (const float *)grad + s, buf ? (float *)buf + s : NULL, l,
                a);
    else
        sgd_f64((double *)param + s, (const double *)grad + s, buf ? (double *)buf + s : NULL,
                l, a);
}

static nb_status cpu_sgd_step(const nb__sgd_step_args *a) {
    for_blocks(a->n, a, sgd_block);
    return NB_OK;
}

/* ---- Adam / AdamW ---------------------------------------------------------------------------- */
/* g = maximize ? -g : g;  Adam: g += wd * p;  AdamW: p *= 1 - lr * wd;
 * m = m * b1 + (1 - b1) * g;  v = v * b2 + (1 - b2) * g * g;  vmax = max(vmax, v);
 * p += -step_size * m / (sqrt(v or vmax) / bc2_sqrt + eps) */
#define DEF_ADAM(T, SUF, SQRT)                                                              \
    ALWAYS_INLINE void adam_##SUF##_(T *restrict p, const T *restrict g, T *restrict m,     \
                                     T *restrict v, T *restrict vmax, int64_t n,            \
                                     const nb__adam_step_args *a, const bool ams) {         \
        const T b1 = (T)a->beta1, omb1 = (T)(1.0 - a->beta1);                               \
        const T b2 = (T)a->beta2, omb2 = (T)(1.0 - a->beta2);                               \
        const T wd = (T)a->weight_decay, decay = (T)(1.0 - a->lr * a->weight_decay);        \
        const T bc2 = (T)a->bc2_sqrt, eps = (T)a->eps, nss = (T)(-a->step_size);            \
        const bool l2 = !a->decoupled && a->weight_decay != 0, dec = a->decoupled;          \
        const bool neg = a->maximize;                                                       \
        for (int64_t i = 0; i < n; i++) {                                                   \
            T gi = neg ? -g[i] : g[i];                                                      \
            T pi = p[i];                                                                    \
            if (l2) gi = gi + wd * pi;                                                      \
            if (dec) pi = pi * decay;                                                       \
            T mi = m[i] * b1 + omb1 * gi;                                                   \
            T vi = v[i] * b2 + omb2 * gi * gi;                                              \
            m[i] = mi;                                                                      \
            v[i] = vi;                                                                      \
            if (ams) {                                                                      \
                T mx = vmax[i];                                                             \
                mx = (mx >= vi || mx != mx) ? mx : vi;                                      \
                vmax[i] = mx;                                                               \
                vi = mx;                                                                    \
            }                                                                               \
            T denom = SQRT(vi) / bc2 + eps;                                                 \
            p[i] = pi + nss * mi / denom;                                                   \
        }                                                                                   \
    }                                                                                       \
    static void adam_##SUF(T *p, const T *g, T *m, T *v, T *vmax, int64_t n,                \
                           const nb__adam_step_args *a) {                                   \
        if (vmax) adam_##SUF##_(p, g, m, v, vmax, n, a, true);                              \
        else adam_##SUF##_(p, g, m, v, NULL, n, a, false);                                  \
    }
DEF_ADAM(float, f32, sqrtf)
DEF_ADAM(double, f64, sqrt)

static void adam_block(const void *args, int64_t s, int64_t l) {
    const nb__adam_step_args *a = args;
    void *param = a->param, *m = a->m, *v = a->v, *vmax = a->vmax;
    const void *grad = a->grad;
    if (a->dtype == NB_F32)
        adam_f32((float *)param + s, (const float *)grad + s, (float *)m + s, (float *)v + s,
                 vmax ? (float *)vmax + s : NULL, l, a);
    else
        adam_f64((double *)param + s, (const double *)grad + s, (double *)m + s,
                 (double *)v + s, vmax ? (double *)vmax + s : NULL, l, a);
}

static nb_status cpu_adam_step(const nb__adam_step_args *a) {
    for_blocks(a->n, a, adam_block);
    return NB_OK;
}

/* ---- RMSprop --------------------------------------------------------------------------------- */
/* g = maximize ? -g : g;  g += wd * p;  sq = sq * alpha + (1 - alpha) * g * g;
 * centered: ga = ga * alpha + (1 - alpha) * g, avg = sqrt(sq - ga * ga) + eps;
 * else avg = sqrt(sq) + eps;  momentum: buf = buf * mom + g / avg, p += -lr * buf;
 * else p += -lr * g / avg */
#define DEF_RMSPROP(T, SUF, SQRT)                                                           \
    ALWAYS_INLINE void rmsprop_##SUF##_(T *restrict p, const T *restrict g, T *restrict sq, \
                                        T *restrict buf, T *restrict ga, int64_t n,         \
                                        const nb__rmsprop_step_args *a, const bool centered, \
                                        const bool use_buf) {                               \
        const T al = (T)a->alpha, omal = (T)(1.0 - a->alpha), wd = (T)a->weight_decay;      \
        const T eps = (T)a->eps, mom = (T)a->momentum, nlr = (T)(-a->lr);                   \
        const bool use_wd = a->weight_decay != 0, neg = a->maximize;                        \
        for (int64_t i = 0; i < n; i++) {                                                   \
            T gi = neg ? -g[i] : g[i];                                                      \
            if (use_wd) gi = gi + wd * p[i];                                                \
            T s = sq[i] * al + omal * gi * gi;                                              \
            sq[i] = s;                                                                      \
            T avg;                                                                          \
            if (centered) {                                                                 \
                T gai = ga[i] * al + omal * gi;                                             \
                ga[i] = gai;                                                                \
                avg = SQRT(s + (T)(-1) * gai * gai);                                        \
            } else {                                                                        \
                avg = SQRT(s);                                                              \
            }                                                                               \
            avg = avg + eps;                                                                \
            if (use_buf) {                                                                  \
                T b = buf[i] * mom + (T)1 * gi / avg;                                       \
                buf[i] = b;                                                                 \
                p[i] = p[i] + nlr * b;                                                      \
            } else {                                                                        \
                p[i] = p[i] + nlr * gi / avg;                                               \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
    static void rmsprop_##SUF(T *p, const T *g, T *sq, T *buf, T *ga, int64_t n,            \
                              const nb__rmsprop_step_args *a) {                             \
        if (ga && buf) rmsprop_##SUF##_(p, g, sq, buf, ga, n, a, true, true);               \
        else if (ga) rmsprop_##SUF##_(p, g, sq, NULL, ga, n, a, true, false);               \
        else if (buf) rmsprop_##SUF##_(p, g, sq, buf, NULL, n, a, false, true);             \
        else rmsprop_##SUF##_(p, g, sq, NULL, NULL, n, a, false, false);                    \
    }
DEF_RMSPROP(float, f32, sqrtf)
DEF_RMSPROP(double, f64, sqrt)

static void rmsprop_block(const void *args, int64_t s, int64_t l) {
    const nb__rmsprop_step_args *a = args;
    void *param = a->param, *sq = a->sq, *buf = a->buf, *gavg = a->gavg;
    const void *grad = a->grad;
    if (a->dtype == NB_F32)
        rmsprop_f32((float *)param + s, (const float *)grad + s, (float *)sq + s,
                    buf ? (float *)buf + s : NULL, gavg ? (float *)gavg + s : NULL, l, a);
    else
        rmsprop_f64((double *)param + s, (const double *)grad + s, (double *)sq + s,
                    buf ? (double *)buf + s : NULL, gavg ? (double *)gavg + s : NULL, l, a);
}

static nb_status cpu_rmsprop_step(const nb__rmsprop_step_args *a) {
    for_blocks(a->n, a, rmsprop_block);
    return NB_OK;
}

/* ---- Adagrad --------------------------------------------------------------------------------- */
/* g = maximize ? -g : g;  g += wd * p;  sum += g * g;  p += -clr * g / (sqrt(sum) + eps) */
#define DEF_ADAGRAD(T, SUF, SQRT)                                                           \
    static void adagrad_##SUF(T *restrict p, const T *restrict g, T *restrict sum,          \
                              int64_t n, const nb__adagrad_step_args *a) {                  \
        const T wd = (T)a->weight_decay, eps = (T)a->eps, nclr = (T)(-a->clr);              \
        const bool use_wd = a->weight_decay != 0, neg = a->maximize;                        \
        for (int64_t i = 0; i < n; i++) {                                                   \
            T gi = neg ? -g[i] : g[i];                                                      \
            if (use_wd) gi = gi + wd * p[i];                                                \
            T s = sum[i] + (T)1 * gi * gi;                                                  \
            sum[i] = s;                                                                     \
            T std = SQRT(s) + eps;                                                          \
            p[i] = p[i] + nclr * gi / std;                                                  \
        }                                                                                   \
    }
DEF_ADAGRAD(float, f32, sqrtf)
DEF_ADAGRAD(double, f64, sqrt)

static void adagrad_block(const void *args, int64_t s, int64_t l) {
    const nb__adagrad_step_args *a = args;
    void *param = a->param, *sum = a->sum;
    const void *grad = a->grad;
    if (a->dtype == NB_F32)
        adagrad_f32((float *)param + s, (const float *)grad + s, (float *)sum + s, l, a);
    else
        adagrad_f64((double *)param + s, (const double *)grad + s, (double *)sum + s, l, a);
}

static nb_status cpu_adagrad_step(const nb__adagrad_step_args *a) {
    for_blocks(a->n, a, adagrad_block);
    return NB_OK;
}

/* ---- clipping -------------------------------------------------------------------------------- */
#define CHUNK 16384 /* elements per partial sum: fixed, so the summation order is too */
#define LANES 8     /* independent accumulators per chunk (vectorizable, fixed order) */

static inline double load_elem(nb_dtype dt, const void *x, int64_t i) {
    switch (dt) {
    case NB_F32: return ((const float *)x)[i];
    case NB_F64: return ((const double *)x)[i];
    case NB_F16: return nb_f16_to_f32(((const uint16_t *)x)[i]);
    default: return nb_bf16_to_f32(((const uint16_t *)x)[i]);
    }
}

/* Sum of |x|^p over [s, s + l) with LANES accumulators combined in lane order. */
static double chunk_pow_sum(nb_dtype dt, const void *x, int64_t s, int64_t l, double p) {
    double acc[LANES] = {0};
    int64_t i = 0;
    if (dt == NB_F32 && p == 2) {
        const float *xf = (const float *)x + s;
        for (; i + LANES <= l; i += LANES)
            for (int k = 0; k < LANES; k++) acc[k] += (double)xf[i + k] * (double)xf[i + k];
    } else if (dt == NB_F64 && p == 2) {
        const double *xd = (const double *)x + s;
        for (; i + LANES <= l; i += LANES)
            for (int k = 0; k < LANES; k++) acc[k] += xd[i + k] * xd[i + k];
    }
    for (; i < l; i++) {
        double v = fabs(load_elem(dt, x, s + i));
        acc[i % LANES] += p == 2 ? v * v : p == 1 ? v : pow(v, p);
    }
    double t = 0;
    for (int k = 0; k < LANES; k++) t += acc[k];
    return t;
}

static double chunk_abs_max(nb_dtype dt, const void *x, int64_t s, int64_t l) {
    double m = 0;
    for (int64_t i = 0; i < l; i++) {
        double v = fabs(load_elem(dt, x, s + i));
        if (!(v <= m)) m = v; /* NaN wins and stays */
        if (m != m) return m;
    }
    return m;
}

/* Per-chunk results part[c] (the chunks are fixed by n, so the combining order is too). */
typedef struct chunks_job {
    nb_dtype dt;
    bool max; /* chunk_abs_max, else chunk_pow_sum */
    const void *x;
    int64_t n;
    double p;
    double *part;
} chunks_job;

static void chunks_range(int64_t lo, int64_t hi, void *ctx) {
    const chunks_job *j = ctx;
    for (int64_t c = lo; c < hi; c++) {
        int64_t s = c * CHUNK, l = j->n - s < CHUNK ? j->n - s : CHUNK;
        j->part[c] = j->max ? chunk_abs_max(j->dt, j->x, s, l)
                            : chunk_pow_sum(j->dt, j->x, s, l, j->p);
    }
}

static double abs_pow_sum(nb_dtype dt, const void *x, int64_t n, double p) {
    int64_t nch = (n + CHUNK - 1) / CHUNK;
    double small[64], *part = nch <= 64 ? small : nb_host_alloc(sizeof(double) * (size_t)nch);
    if (!part) return NAN;
    int nt = nb__threads_for(n, NB__GRAIN);
    chunks_job j = {dt, false, x, n, p, part};
    nb__parallel_range(nch, nt, chunks_range, &j);
    double t = 0;
    for (int64_t c = 0; c < nch; c++) t += part[c];
    if (part != small) nb_host_free(part);
    return t;
}

static double abs_max(nb_dtype dt, const void *x, int64_t n) {
    int64_t nch = (n + CHUNK - 1) / CHUNK;
    double small[64], *part = nch <= 64 ? small : nb_host_alloc(sizeof(double) * (size_t)nch);
    if (!part) return NAN;
    int nt = nb__threads_for(n, NB__GRAIN);
    chunks_job j = {dt, true, x, n, 0, part};
    nb__parallel_range(nch, nt, chunks_range, &j);
    double m = 0;
    for (int64_t c = 0; c < nch && m == m; c++) /* NaN wins and stays */
        if (!(part[c] <= m)) m = part[c];
    if (part != small) nb_host_free(part);
    return m;
}

/* x[i] *= a->s over one block. */
static void scale_block(const void *args, int64_t s, int64_t l) {
    const nb__clip_inplace_args *a = args;
    const nb_dtype dt = a->dtype;
    if (dt == NB_F32) {
        float *xf = (float *)a->x + s, sf = (float)a->s;
#pragma omp simd
        for (int64_t i = 0; i < l; i++) xf[i] *= sf;
    } else if (dt == NB_F64) {
        double *xd = (double *)a->x + s, sd = a->s;
#pragma omp simd
        for (int64_t i = 0; i < l; i++) xd[i] *= sd;
    } else {
        /* Half types: PyTorch multiplies in f32 by the f32 coefficient, then rounds. */
        uint16_t *xh = (uint16_t *)a->x + s;
        float sf = (float)a->s;
        bool f16 = dt == NB_F16;
        for (int64_t i = 0; i < l; i++) {
            float v = (f16 ? nb_f16_to_f32(xh[i]) : nb_bf16_to_f32(xh[i])) * sf;
            xh[i] = f16 ? nb_f32_to_f16(v) : nb_f32_to_bf16(v);
        }
    }
}

/* x[i] = min(max(x[i], a->lo), a->hi) over one block. */
static void clamp_block(const void *args, int64_t s, int64_t l) {
    const nb__clip_inplace_args *a = args;
    const nb_dtype dt = a->dtype;
    if (dt == NB_F32) {
        float *xf = (float *)a->x + s, lf = (float)a->lo, hf = (float)a->hi;
#pragma omp simd
        for (int64_t i = 0; i < l; i++) {
            float v = xf[i];
            v = v < lf ? lf : v;
            xf[i] = v > hf ? hf : v;
        }
    } else if (dt == NB_F64) {
        double *xd = (double *)a->x + s, lo = a->lo, hi = a->hi;
#pragma omp simd
        for (int64_t i = 0; i < l; i++) {
            double v = xd[i];
            v = v < lo ? lo : v;
            xd[i] = v > hi ? hi : v;
        }
    } else {
        uint16_t *xh = (uint16_t *)a->x + s;
        bool f16 = dt == NB_F16;
        float lf = (float)a->lo, hf = (float)a->hi;
        for (int64_t i = 0; i < l; i++) {
            float v = f16 ? nb_f16_to_f32(xh[i]) : nb_bf16_to_f32(xh[i]);
            v = v < lf ? lf : v;
            v = v > hf ? hf : v;
            xh[i] = f16 ? nb_f32_to_f16(v) : nb_f32_to_bf16(v);
        }
    }
}

/* ---- loss scaling: unscale and inf/NaN check in one pass -------------------------------------- */
/* Each block reports whether it saw a non-finite value; the flags are OR-ed after the
 * loop, so the result never depends on the thread count. */
typedef struct amp_job {
    const nb__amp_unscale_args *a;
    unsigned char *bad; /* one flag per block */
} amp_job;

static void amp_block(const void *args, int64_t s, int64_t l) {
    const amp_job *j = args;
    const nb__amp_unscale_args *a = j->a;
    const nb_dtype dt = a->dtype, ot = a->out_dtype;
    const float inv = (float)a->inv_scale;
    const int64_t e = s + l;
    bool nf = false;
    if (dt == NB_F64) {
        const double *x = a->x;
        double *o = a->out, invd = (double)inv;
        for (int64_t i = s; i < e; i++) {
            nf |= !isfinite(x[i]);
            o[i] = x[i] * invd;
        }
    } else if (dt == NB_F32) {
        const float *x = a->x;
        float *o = a->out;
        for (int64_t i = s; i < e; i++) {
            nf |= !isfinite(x[i]);
            o[i] = x[i] * inv;
        }
    } else {
        const uint16_t *x = a->x;
        const bool f16 = dt == NB_F16;
        for (int64_t i = s; i < e; i++) {
            float v = f16 ? nb_f16_to_f32(x[i]) : nb_bf16_to_f32(x[i]);
            nf |= !isfinite(v);
            v *= inv;
            if (ot == NB_F32) ((float *)a->out)[i] = v;
            else ((uint16_t *)a->out)[i] = f16 ? nb_f32_to_f16(v) : nb_f32_to_bf16(v);
        }
    }
    j->bad[s / BLOCK] = nf;
}

static nb_status cpu_amp_unscale(const nb__amp_unscale_args *a) {
    const int64_t n = a->n, nblk = (n + BLOCK - 1) / BLOCK;
    unsigned char small[64], *bad = nblk <= 64 ? small : nb_host_alloc((size_t)nblk);
    if (!bad) return nb__error(NB_ENOMEM, "amp_unscale: out of memory");
    amp_job j = {a, bad};
    for_blocks(n, &j, amp_block);
    bool any = false;
    for (int64_t b = 0; b < nblk; b++) any |= bad[b];
    if (bad != small) nb_host_free(bad);
    if (any) *a->found_inf = 1;
    return NB_OK;
}

/* ---- the kernel table's entries ------------------------------------------------------------ */
static nb_status cpu_clip_abs_pow_sum(const nb__clip_reduce_args *a) {
    *a->result = abs_pow_sum(a->dtype, a->x, a->n, a->p);
    return NB_OK;
}

static nb_status cpu_clip_abs_max(const nb__clip_reduce_args *a) {
    *a->result = abs_max(a->dtype, a->x, a->n);
    return NB_OK;
}

static nb_status cpu_clip_scale(const nb__clip_inplace_args *a) {
    for_blocks(a->n, a, scale_block);
    return NB_OK;
}

static nb_status cpu_clip_clamp(const nb__clip_inplace_args *a) {
    for_blocks(a->n, a, clamp_block);
    return NB_OK;
}

void nb__cpu_register_optim(nb__kernels *k) {
    k->sgd_step = cpu_sgd_step;
    k->adam_step = cpu_adam_step;
    k->rmsprop_step = cpu_rmsprop_step;
    k->adagrad_step = cpu_adagrad_step;
    k->clip_abs_pow_sum = cpu_clip_abs_pow_sum;
    k->clip_abs_max = cpu_clip_abs_max;
    k->clip_scale = cpu_clip_scale;
    k->clip_clamp = cpu_clip_clamp;
    k->amp_unscale = cpu_amp_unscale;
}
