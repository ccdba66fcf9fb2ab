/* cpu/norm.c - CPU kernels of the fused layers in nn/: layer norm and batch norm (forward,
 * statistics, backward), the bias rows of linear, and dropout's masked scaling, and the norm
 * family's entries of the kernel table (tensor/kernels/norm.h). See cpu/norm.h for the
 * contracts; the f32 and f64 bodies come from cpu/norm_tmpl.h. */
#include "cpu/backend.h"
#include "cpu/norm.h"

#include <math.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "nabla/memory.h"

/* Row chunks for the reductions over rows: at least CHUNK_MIN elements each, at most
 * NB__NORM_MAX_CHUNKS, decided by the shape alone (never by the thread count). */
#define CHUNK_MIN 16384

static int64_t norm_chunks(int64_t rows, int64_t rowlen) {
    if (rows <= 1) return 1;
    int64_t work = rows * (rowlen > 0 ? rowlen : 1);
    int64_t c = work / CHUNK_MIN;
    if (c > NB__NORM_MAX_CHUNKS) c = NB__NORM_MAX_CHUNKS;
    if (c > rows) c = rows;
    return c < 1 ? 1 : c;
}

/* Threads for a loop over nch chunks covering `work` elements. */
static int chunk_threads(int64_t work, int64_t nch) {
    int nt = nb__threads_for(work, NB__GRAIN);
    return nt > nch ? (int)nch : nt;
}

#define T float
#define S f32
#define NB__NORM_F32 1
#include "cpu/norm_tmpl.h"
#undef NB__NORM_F32
#undef T
#undef S

#define T double
#define S f64
#include "cpu/norm_tmpl.h"
#undef T
#undef S

/* ---- dropout ------------------------------------------------------------------------------- */
typedef struct dropout_job {
    const void *x;
    const uint8_t *mask;
    void *out;
    nb_dtype dt;
    double scale;
} dropout_job;

static void dropout_range(int64_t lo, int64_t hi, void *p) {
    const dropout_job *j = p;
    const uint8_t *mask = j->mask;
    switch (j->dt) {
    case NB_F32: {
        const float *xs = j->x;
        float *o = j->out, s = (float)j->scale;
        for (int64_t i = lo; i < hi; i++) o[i] = xs[i] * ((float)mask[i] * s);
        break;
    }
    case NB_F64: {
        const double *xs = j->x;
        double *o = j->out, s = j->scale;
        for (int64_t i = lo; i < hi; i++) o[i] = xs[i] * ((double)mask[i] * s);
        break;
    }
    case NB_F16: {
        const uint16_t *xs = j->x;
        uint16_t *o = j->out;
        float s = (float)j->scale;
        for (int64_t i = lo; i < hi; i++)
            o[i] = nb_f32_to_f16(nb_f16_to_f32(xs[i]) * ((float)mask[i] * s));
        break;
    }
    case NB_BF16: {
        const uint16_t *xs = j->x;
        uint16_t *o = j->out;
        float s = (float)j->scale;
        for (int64_t i = lo; i < hi; i++)
            o[i] = nb_f32_to_bf16(nb_bf16_to_f32(xs[i]) * ((float)mask[i] * s));
        break;
    }
    default:
        NB__ASSERT(!"dropout kernel: float dtypes only");
    }
}

void nb__cpu_dropout(const void *x, const uint8_t *mask, void *out, int64_t n, nb_dtype dt,
                     double scale) {
    dropout_job j = {x, mask, out, dt, scale};
    nb__parallel_range(n, nb__threads_for(n, NB__GRAIN), dropout_range, &j);
}

/* ---- the kernel table's entries ------------------------------------------------------------
 * The norm ops hand in their compute dtype, f32 or f64; dropout any float dtype. */
static nb_status cpu_layer_norm(const nb__layer_norm_args *a) {
    if (a->dtype == NB_F64)
        nb__cpu_layer_norm_fwd_f64(a->x, a->w, a->b, a->y, a->mean, a->rstd, a->N, a->D, a->eps);
    else
        nb__cpu_layer_norm_fwd_f32(a->x, a->w, a->b, a->y, a->mean, a->rstd, a->N, a->D, a->eps);
    return NB_OK;
}

static nb_status cpu_layer_norm_backward(const nb__layer_norm_backward_args *a) {
    if (a->dtype == NB_F64)
        return nb__cpu_layer_norm_bwd_f64(a->g, a->x, a->w, a->mean, a->rstd, a->dx, a->dw,
                                          a->db, a->N, a->D);
    return nb__cpu_layer_norm_bwd_f32(a->g, a->x, a->w, a->mean, a->rstd, a->dx, a->dw, a->db,
                                      a->N, a->D);
}

/* Element c of a 1-D view of any float dtype. */
static char *elem(const nb__view *v, int64_t c) {
    return v->data + c * v->strides[0] * (int64_t)nb_dtype_size(v->dtype);
}

/* r = (1 - momentum) * r + momentum * v * factor, elementwise over C entries. */
static void blend(const nb__view *r, const double *v, int64_t C, double momentum,
                  double factor) {
    for (int64_t c = 0; c < C; c++) {
        char *q = elem(r, c);
        nb__store_f64(q, r->dtype, (1.0 - momentum) * nb__load_f64(q, r->dtype) +
                                       momentum * v[c] * factor);
    }
}

static nb_status cpu_batch_norm_stats(const nb__batch_norm_stats_args *a) {
    const int64_t C = a->C, M = a->N * a->S;
    double *pm = a->mean, *pr = a->rstd;
    if (a->training) {
        /* batch statistics; pr holds the biased variance until it becomes 1/std */
        nb_status st = a->dtype == NB_F64
                           ? nb__cpu_batch_norm_stats_f64(a->x, a->N, C, a->S, pm, pr)
                           : nb__cpu_batch_norm_stats_f32(a->x, a->N, C, a->S, pm, pr);
        if (st != NB_OK) return st;
        if (a->running_mean.data) {
            /* PyTorch: the running variance takes the unbiased estimate. */
            blend(&a->running_mean, pm, C, a->momentum, 1.0);
            blend(&a->running_var, pr, C, a->momentum, (double)M / (double)(M - 1));
        }
    } else {
        for (int64_t c = 0; c < C; c++) {
            pm[c] = nb__load_f64(elem(&a->running_mean, c), a->running_mean.dtype);
            pr[c] = nb__load_f64(elem(&a->running_var, c), a->running_var.dtype);
        }
    }
    for (int64_t c = 0; c < C; c++) pr[c] = 1.0 / sqrt(pr[c] + a->eps);
    return NB_OK;
}

static nb_status cpu_batch_norm_apply(const nb__batch_norm_apply_args *a) {
    if (a->dtype == NB_F64)
        nb__cpu_batch_norm_apply_f64(a->x, a->y, a->N, a->C, a->S, a->mean, a->rstd, a->w, a->b);
    else
        nb__cpu_batch_norm_apply_f32(a->x, a->y, a->N, a->C, a->S, a->mean, a->rstd, a->w, a->b);
    return NB_OK;
}

static nb_status cpu_batch_norm_backward(const nb__batch_norm_backward_args *a) {
    if (a->dtype == NB_F64)
        return nb__cpu_batch_norm_bwd_f64(a->g, a->x, a->N, a->C, a->S, a->mean, a->rstd, a->w,
                                          a->batch_stats, a->dx, a->dw, a->db);
    return nb__cpu_batch_norm_bwd_f32(a->g, a->x, a->N, a->C, a->S, a->mean, a->rstd, a->w,
                                      a->batch_stats, a->dx, a->dw, a->db);
}

static nb_status cpu_dropout(const nb__dropout_args *a) {
    nb__cpu_dropout(a->x, a->mask, a->out, a->n, a->dtype, a->scale);
    return NB_OK;
}

void nb__cpu_register_norm(nb__kernels *k) {
    k->layer_norm = cpu_layer_norm;
    k->layer_norm_backward = cpu_layer_norm_backward;
    k->batch_norm_stats = cpu_batch_norm_stats;
    k->batch_norm_apply = cpu_batch_norm_apply;
    k->batch_norm_backward = cpu_batch_norm_backward;
    k->dropout = cpu_dropout;
}
