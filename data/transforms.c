/* transforms.c - in-place transforms of image batches (N, C, H, W) or (N, H, W): per-channel
 * normalization, random horizontal flip, random crop after zero padding, and the
 * nb_image_aug pipeline that chains them as a loader transform.
 *
 * The random choices of sample k come from one Philox block keyed by the loader's seed at
 * counter (dataset index of the sample, epoch, salt) (data_impl.h): they depend on what the
 * sample is and when, not on batch size, shard, prefetching or thread count, so a resumed
 * run augments exactly as the uninterrupted one. */
#include <string.h>

#include "data/data_impl.h"

/* Checks shared by the transforms: a contiguous host tensor with >= min_ndim dims (the
 * loader's batches are; move them to a device after transforming). */
static nb_status check_images(const nb_tensor *x, int min_ndim, const char *op) {
    if (!x) return nb__error(NB_ENULL, "%s: argument 'x' is NULL", op);
    if (!nb__require_host(x, op)) return NB_EDEVICE; /* transforms run on the host */
    if (x->ndim < min_ndim)
        return nb__error(NB_EDIM, "%s: expected a batch of images (N, C, H, W) or (N, H, W), "
                         "got shape %s", op, NB__SHAPE(x));
    if (!nb_is_contiguous(x))
        return nb__error(NB_EINVAL, "%s: the batch tensor must be contiguous (got strides of a "
                         "view); transform a contiguous copy", op);
    return NB_OK;
}

/* ---- normalize -------------------------------------------------------------------------- */
nb_status nb_normalize_(nb_tensor *x, const double *mean, const double *std, int n) {
    const char *op = "normalize";
    nb_status st = check_images(x, 2, op);
    if (st) return st;
    if (!mean || !std)
        return nb__error(NB_ENULL, "%s: argument '%s' is NULL", op, mean ? "std" : "mean");
    if (!nb_dtype_is_float(x->dtype))
        return nb__error(NB_EDTYPE, "%s: expected a float tensor, got %s (convert the batch "
                         "with nb_to_dtype first)", op, nb_dtype_name(x->dtype));
    int64_t C = x->shape[1];
    if (n != 1 && n != C)
        return nb__error(NB_ESHAPE, "%s: %d mean/std values for %lld channels of %s (give 1 "
                         "or one per channel)", op, n, (long long)C, NB__SHAPE(x));
    for (int c = 0; c < n; c++)
        if (!(std[c] != 0))
            return nb__error(NB_EINVAL, "%s: std[%d] is %g; it must be nonzero", op, c, std[c]);
    nb__bump_version(x); /* an in-place write (autograd's saved-tensor check) */
    int64_t N = x->shape[0];
    int64_t inner = C > 0 && N > 0 ? nb_numel(x) / (N * C) : 0;
    char *base = nb__ptr(x);
    size_t es = nb_dtype_size(x->dtype);
    for (int64_t i = 0; i < N; i++)
        for (int64_t c = 0; c < C; c++) {
            double m = mean[n == 1 ? 0 : c], s = std[n == 1 ? 0 : c];
            char *p = base + (size_t)((i * C + c) * inner) * es;
            if (x->dtype == NB_F32) {
                /* As PyTorch: x.sub_(mean).div_(std) in the tensor's precision. */
                float *f = (float *)p, fm = (float)m, fs = (float)s;
                for (int64_t k = 0; k < inner; k++) f[k] = (f[k] - fm) / fs;
            } else if (x->dtype == NB_F64) {
                double *d = (double *)p;
                for (int64_t k = 0; k < inner; k++) d[k] = (d[k] - m) / s;
            } else { /* halves: computed in f32, stored rounded to nearest even */
                float fm = (float)m, fs = (float)s;
                for (int64_t k = 0; k < inner; k++) {
                    char *e = p + (size_t)k * es;
                    nb__store_f64(e, x->dtype, (float)(((float)nb__load_f64(e, x->dtype) - fm) / fs));
                }
            }
        }
    return NB_OK;
}

/* ---- flip and crop -------------------------------------------------------------------------- */
/* Shape bookkeeping: samples N, planes per sample P (channels), H rows of W elements. */
typedef struct {
    int64_t N, P, H, W;
    size_t es;
} img_geom;

static nb_status batch_geom(nb_batch *b, const char *op, img_geom *g) {
    if (!b) return nb__error(NB_ENULL, "%s: argument 'batch' is NULL", op);
    nb_status st = check_images(b->x, 3, op);
    if (st) return st;
    const nb_tensor *x = b->x;
    g->N = x->shape[0];
    g->H = x->shape[x->ndim - 2];
    g->W = x->shape[x->ndim - 1];
    g->P = 1;
    for (int d = 1; d < x->ndim - 2; d++) g->P *= x->shape[d];
    g->es = nb_dtype_size(x->dtype);
    if (g->N > 0 && (!b->indices || b->n != g->N))
        return nb__error(NB_EINVAL, "%s: the batch has %lld samples but %lld indices (the "
                         "random choices are keyed by the samples' dataset indices)", op,
                         (long long)g->N, (long long)b->n);
    return NB_OK;
}

/* Reverse each of rows rows of W elements of es bytes. */
static void reverse_rows(char *p, int64_t rows, int64_t W, size_t es) {
    for (int64_t r = 0; r < rows; r++) {
        char *row = p + (size_t)(r * W) * es;
        for (int64_t a = 0, z = W - 1; a < z; a++, z--) {
            char *pa = row + (size_t)a * es, *pz = row + (size_t)z * es;
            switch (es) {
            case 1: { char t = *pa; *pa = *pz; *pz = t; break; }
            case 2: { uint16_t t, u; memcpy(&t, pa, 2); memcpy(&u, pz, 2); memcpy(pa, &u, 2); memcpy(pz, &t, 2); break; }
            case 4: { uint32_t t, u; memcpy(&t, pa, 4); memcpy(&u, pz, 4); memcpy(pa, &u, 4); memcpy(pz, &t, 4); break; }
            default: { uint64_t t, u; memcpy(&t, pa, 8); memcpy(&u, pz, 8); memcpy(pa, &u, 8); memcpy(pz, &t, 8); break; }
            }
        }
    }
}

nb_status nb_random_hflip(nb_batch *b, double p) {
    const char *op = "random_hflip";
    img_geom g;
    nb_status st = batch_geom(b, op, &g);
    if (st) return st;
    if (!(p >= 0.0 && p <= 1.0))
        return nb__error(NB_EINVAL, "%s: probability %g is outside [0, 1]", op, p);
    size_t sample = (size_t)(g.P * g.H * g.W) * g.es;
    char *base = nb__ptr(b->x);
    for (int64_t k = 0; k < g.N; k++) {
        uint32_t w[4];
        nb__sample_words(b->seed, b->epoch, b->indices[k], NB__SALT_FLIP, w);
        if ((double)w[0] * (1.0 / 4294967296.0) < p)
            reverse_rows(base + (size_t)k * sample, g.P * g.H, g.W, g.es);
    }
    return NB_OK;
}

/* Shift one plane in place so that out[i][j] = in[i + sy][j + sx], zero outside. Rows are
 * visited in the order that reads every source row before it is overwritten. */
static void shift_plane(char *p, int64_t H, int64_t W, size_t es, int64_t sy, int64_t sx) {
    size_t row = (size_t)W * es;
    int64_t keep = W - (sx >= 0 ? sx : -sx); /* elements that stay inside the row */
    for (int64_t t = 0; t < H; t++) {
        int64_t i = sy > 0 ? t : H - 1 - t;
        char *dst = p + (size_t)i * row;
        int64_t si = i + sy;
        if (si < 0 || si >= H || keep <= 0) {
            memset(dst, 0, row);
            continue;
        }
        const char *src = p + (size_t)si * row;
        if (sx >= 0) {
            memmove(dst, src + (size_t)sx * es, (size_t)keep * es);
            memset(dst + (size_t)keep * es, 0, (size_t)sx * es);
        } else {
            memmove(dst + (size_t)(-sx) * es, src, (size_t)keep * es);
            memset(dst, 0, (size_t)(-sx) * es);
        }
    }
}

nb_status nb_random_crop(nb_batch *b, int padding) {
    const char *op = "random_crop";
    img_geom g;
    nb_status st = batch_geom(b, op, &g);
    if (st) return st;
    if (padding < 0)
        return nb__error(NB_EINVAL, "%s: padding must be >= 0 (got %d)", op, padding);
    if (padding == 0) return NB_OK;
    uint64_t span = 2 * (uint64_t)padding + 1; /* offsets 0..2p per direction */
    size_t plane = (size_t)(g.H * g.W) * g.es;
    char *base = nb__ptr(b->x);
    for (int64_t k = 0; k < g.N; k++) {
        uint32_t w[4];
        nb__sample_words(b->seed, b->epoch, b->indices[k], NB__SALT_CROP, w);
        /* Top-left corner (dy, dx) of the crop in the padded image; the crop's pixel (i, j)
         * is the original's (i + dy - p, j + dx - p). */
        int64_t dy = (int64_t)(((uint64_t)w[0] * span) >> 32);
        int64_t dx = (int64_t)(((uint64_t)w[1] * span) >> 32);
        int64_t sy = dy - padding, sx = dx - padding;
        if (sy == 0 && sx == 0) continue;
        for (int64_t c = 0; c < g.P; c++)
            shift_plane(base + (size_t)(k * g.P + c) * plane, g.H, g.W, g.es, sy, sx);
    }
    return NB_OK;
}

nb_status nb_image_aug_transform(nb_batch *b, void *ctx) {
    const nb_image_aug *a = ctx;
    if (!a) return nb__error(NB_ENULL, "image_aug_transform: ctx (an nb_image_aug) is NULL");
    if (a->channels < 0 || a->channels > NB_AUG_MAX_CHANNELS)
        return nb__error(NB_EINVAL, "image_aug_transform: channels must be in [0, %d] (got "
                         "%d)", NB_AUG_MAX_CHANNELS, a->channels);
    nb_status st = NB_OK;
    if (a->crop_padding) st = nb_random_crop(b, a->crop_padding);
    if (!st && a->hflip_p != 0) st = nb_random_hflip(b, a->hflip_p);
    if (!st && a->channels) st = nb_normalize_(b->x, a->mean, a->std, a->channels);
    return st;
}
