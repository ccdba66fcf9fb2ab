/* cpu/norm.c - CPU kernels of the fused layers in nn/: layer norm and batch norm (forward,
 * statistics, backward), the bias rows of linear, and dropout's masked scaling. See
 * cpu/norm.h for the contracts; the f32 and f64 bodies come from cpu/norm_tmpl.h. */
#include "cpu/backend.h"
#include "cpu/norm.h"

#include <math.h>
#include <string.h>

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
#include "cpu/norm_tmpl.h"
#undef T
#undef S

#define T double
#define S f64
#include "cpu/norm_tmpl.h"
#undef T
#undef S

/* ---- dropout ------------------------------------------------------------------------------- */
void nb__cpu_dropout(const void *x, const uint8_t *mask, void *out, int64_t n, nb_dtype dt,
                     double scale) {
    int nt = nb__threads_for(n, NB__GRAIN);
    switch (dt) {
    case NB_F32: {
        const float *xs = x;
        float *o = out, s = (float)scale;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
        for (int64_t i = 0; i < n; i++) o[i] = xs[i] * ((float)mask[i] * s);
        break;
    }
    case NB_F64: {
        const double *xs = x;
        double *o = out;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
        for (int64_t i = 0; i < n; i++) o[i] = xs[i] * ((double)mask[i] * scale);
        break;
    }
    case NB_F16: {
        const uint16_t *xs = x;
        uint16_t *o = out;
        float s = (float)scale;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
        for (int64_t i = 0; i < n; i++)
            o[i] = nb_f32_to_f16(nb_f16_to_f32(xs[i]) * ((float)mask[i] * s));
        break;
    }
    case NB_BF16: {
        const uint16_t *xs = x;
        uint16_t *o = out;
        float s = (float)scale;
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
        for (int64_t i = 0; i < n; i++)
            o[i] = nb_f32_to_bf16(nb_bf16_to_f32(xs[i]) * ((float)mask[i] * s));
        break;
    }
    default:
        NB__ASSERT(!"dropout kernel: float dtypes only");
    }
}

/* Filled in as the family moves behind the kernel table. */
void nb__cpu_register_norm(nb__kernels *k) { (void)k; }
