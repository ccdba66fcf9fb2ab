/* dataset.c - the dataset interface (checked calls through the vtable) and the in-memory
 * datasets: nb_tensor_dataset_new, and the IDX image/label datasets (Fashion-MNIST, MNIST),
 * which keep the u8 pixels and convert each batch to f32 / 255 as it is gathered.
 *
 * Datasets live in host memory and fill host batch tensors (the loader moves batches to a
 * device); nb_tensor_dataset_new copies tensors of another device to the host once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/data_impl.h"
#include "nabla/autograd.h"

/* ---- interface -------------------------------------------------------------------------- */
int64_t nb_dataset_len(nb_dataset *ds) {
    if (!ds || !ds->vt) {
        nb__error(NB_ENULL, "dataset_len: argument 'dataset' is NULL");
        return -1;
    }
    return ds->vt->length(ds);
}

void nb_dataset_free(nb_dataset *ds) {
    if (ds && ds->vt && ds->vt->free) ds->vt->free(ds);
}

int64_t nb__spec_numel(const nb_sample_spec *s) { return nb__numel_of(s->shape, s->ndim); }

nb_status nb__check_batch_tensor(const nb_tensor *t, int64_t n, const nb_sample_spec *spec,
                                 const char *op, const char *what) {
    if (!t) return nb__error(NB_ENULL, "%s: %s batch tensor is NULL", op, what);
    int64_t want[NB_MAX_DIMS];
    want[0] = n;
    for (int d = 0; d < spec->ndim; d++) want[d + 1] = spec->shape[d];
    bool same = t->ndim == spec->ndim + 1;
    for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == want[d];
    if (!same)
        return nb__error(NB_ESHAPE, "%s: %s batch tensor has shape %s, expected %s", op, what,
                         NB__SHAPE(t),
                         nb__shape_str(want, spec->ndim + 1, (char[NB__SHAPE_STR]){0}));
    if (t->dtype != spec->dtype)
        return nb__error(NB_EDTYPE, "%s: %s batch tensor has dtype %s, expected %s", op, what,
                         nb_dtype_name(t->dtype), nb_dtype_name(spec->dtype));
    if (!nb__host_accessible(t)) /* datasets write batches on the host */
        return nb__error(NB_EDEVICE, "%s: %s batch tensor must be a CPU tensor (host memory), "
                         "got a %s tensor", op, what, NB__DEVSTR(nb__device_of(t)));
    if (!nb_is_contiguous(t))
        return nb__error(NB_EINVAL, "%s: %s batch tensor must be contiguous", op, what);
    return NB_OK;
}

nb_status nb_dataset_get_batch(nb_dataset *ds, const int64_t *indices, int64_t n,
                               nb_tensor *x, nb_tensor *y) {
    const char *op = "dataset_get_batch";
    if (!ds || !ds->vt) return nb__error(NB_ENULL, "%s: argument 'dataset' is NULL", op);
    if (n < 0) return nb__error(NB_EINVAL, "%s: n must be >= 0 (got %lld)", op, (long long)n);
    if (n > 0 && !indices) return nb__error(NB_ENULL, "%s: argument 'indices' is NULL", op);
    int64_t len = ds->vt->length(ds);
    for (int64_t i = 0; i < n; i++)
        if (indices[i] < 0 || indices[i] >= len)
            return nb__error(NB_EINDEX, "%s: index %lld (entry %lld) is out of range for a "
                             "%s dataset of %lld samples", op, (long long)indices[i],
                             (long long)i, ds->vt->name, (long long)len);
    nb_status st = nb__check_batch_tensor(x, n, &ds->x, op, "x");
    if (st) return st;
    if (ds->has_y) {
        st = nb__check_batch_tensor(y, n, &ds->y, op, "y");
        if (st) return st;
    } else if (y) {
        return nb__error(NB_EINVAL, "%s: the %s dataset has no labels; pass y = NULL", op,
                         ds->vt->name);
    }
    return ds->vt->get_batch(ds, indices, n, x, y);
}

/* ---- in-memory dataset ------------------------------------------------------------------ */
typedef struct nb__mem_ds {
    nb_dataset base;
    nb_tensor *x, *y;   /* contiguous, owned references */
    int64_t n;
    int64_t x_row, y_row; /* elements per sample */
    double x_div;
} nb__mem_ds;

static int64_t mem_length(nb_dataset *ds) { return ((nb__mem_ds *)ds)->n; }

/* Copy `count` elements from src (dtype sd) to dst (dtype dd), dividing by div when div != 0.
 * Same dtype without division is a memcpy; the common conversions have plain loops; the
 * rest goes through double. */
static void convert_row(void *dst, nb_dtype dd, const void *src, nb_dtype sd, int64_t count,
                        double div) {
    if (dd == sd && div == 0) {
        memcpy(dst, src, (size_t)count * nb_dtype_size(sd));
        return;
    }
    if (sd == NB_U8 && dd == NB_F32) {
        /* value / 255 in f32, as torchvision's ToTensor; a plain loop the compiler
         * vectorizes (a lookup table is slower: gathers do not vectorize). */
        const uint8_t *s = src;
        float *d = dst, fdiv = div != 0 ? (float)div : 1.0f;
        for (int64_t i = 0; i < count; i++) d[i] = (float)s[i] / fdiv;
        return;
    }
    if (dd == NB_I64 && div == 0 && (sd == NB_U8 || sd == NB_I32)) {
        int64_t *d = dst;
        if (sd == NB_U8)
            for (int64_t i = 0; i < count; i++) d[i] = ((const uint8_t *)src)[i];
        else
            for (int64_t i = 0; i < count; i++) d[i] = ((const int32_t *)src)[i];
        return;
    }
    size_t ss = nb_dtype_size(sd), ds = nb_dtype_size(dd);
    for (int64_t i = 0; i < count; i++) {
        double v = nb__load_f64((const char *)src + (size_t)i * ss, sd);
        if (div != 0) v /= div;
        nb__store_f64((char *)dst + (size_t)i * ds, dd, v);
    }
}

static nb_status mem_get_batch(nb_dataset *ds, const int64_t *indices, int64_t n,
                               nb_tensor *x, nb_tensor *y) {
    nb__mem_ds *m = (nb__mem_ds *)ds;
    const char *xs = nb__ptr(m->x);
    char *xd = nb__ptr(x);
    size_t xss = nb_dtype_size(m->x->dtype) * (size_t)m->x_row;
    size_t xds = nb_dtype_size(x->dtype) * (size_t)m->x_row;
    for (int64_t k = 0; k < n; k++)
        convert_row(xd + (size_t)k * xds, x->dtype, xs + (size_t)indices[k] * xss,
                    m->x->dtype, m->x_row, m->x_div);
    if (m->y && y) {
        const char *ys = nb__ptr(m->y);
        char *yd = nb__ptr(y);
        size_t yss = nb_dtype_size(m->y->dtype) * (size_t)m->y_row;
        size_t yds = nb_dtype_size(y->dtype) * (size_t)m->y_row;
        for (int64_t k = 0; k < n; k++)
            convert_row(yd + (size_t)k * yds, y->dtype, ys + (size_t)indices[k] * yss,
                        m->y->dtype, m->y_row, 0);
    }
    return NB_OK;
}

static void mem_free(nb_dataset *ds) {
    nb__mem_ds *m = (nb__mem_ds *)ds;
    nb_tensor_free(m->x);
    nb_tensor_free(m->y);
    free(m);
}

/* The same code serves several kinds; the vtable's name is what error messages show. */
static const nb_dataset_vtable mem_vt_tensor = {"tensor", mem_length, mem_get_batch, mem_free};
static const nb_dataset_vtable mem_vt_idx = {"idx", mem_length, mem_get_batch, mem_free};

/* A private contiguous reference to t (t itself, retained, when already contiguous). */
static nb_tensor *own_contiguous(nb_tensor *t) { return nb__scope_take(nb_contiguous(t)); }

nb_dataset *nb__mem_dataset(const char *name, nb_tensor *x, nb_tensor *y,
                            const nb_sample_spec *xs, const nb_sample_spec *ys, double x_div) {
    nb__mem_ds *m = calloc(1, sizeof *m);
    if (!m) {
        nb__error(NB_ENOMEM, "%s dataset: out of memory", name);
        return NULL;
    }
    m->base.vt = strcmp(name, "idx") == 0 ? &mem_vt_idx : &mem_vt_tensor;
    m->base.x = *xs;
    m->n = x->shape[0];
    m->x_row = nb__spec_numel(xs);
    m->x_div = x_div;
    if (y) {
        m->base.y = *ys;
        m->base.has_y = true;
        m->y_row = nb__spec_numel(ys);
    }
    m->x = own_contiguous(x);
    m->y = y ? own_contiguous(y) : NULL;
    if (!m->x || (y && !m->y)) {
        mem_free(&m->base);
        return NULL;
    }
    return &m->base;
}

/* t, or a host copy of t (in the current scope) when t lives on another device; NULL +
 * NB_EDEVICE naming op and the argument when it cannot be copied (a meta tensor). */
static nb_tensor *host_copy(nb_tensor *t, const char *op, const char *what) {
    if (nb__host_accessible(t)) return t;
    nb_tensor *h = nb_to_device(t, NB_CPU);
    if (!h) nb_wrap_error(nb_last_status(), "%s: %s cannot be copied to the host", op, what);
    return h;
}

nb_dataset *nb_tensor_dataset_new(nb_tensor *x, nb_tensor *y) {
    const char *op = "tensor_dataset";
    NB__CHECK_ARG(x, op, "x");
    if (x->ndim < 1) {
        nb__error(NB_EDIM, "%s: x must have a leading sample dim (got a 0-dim tensor)", op);
        return NULL;
    }
    if (y && (y->ndim < 1 || y->shape[0] != x->shape[0])) {
        nb__error(NB_ESHAPE, "%s: x %s and y %s must have the same number of samples "
                  "(leading dim)", op, NB__SHAPE(x), NB__SHAPE(y));
        return NULL;
    }
    nb_sample_spec xs = {.dtype = x->dtype, .ndim = x->ndim - 1}, ys = {0};
    memcpy(xs.shape, x->shape + 1, sizeof(int64_t) * (size_t)xs.ndim);
    if (y) {
        ys.dtype = y->dtype;
        ys.ndim = y->ndim - 1;
        memcpy(ys.shape, y->shape + 1, sizeof(int64_t) * (size_t)ys.ndim);
    }
    /* The dataset keeps its samples in host memory: tensors of another device are copied
     * to the host once, here (a meta tensor has no samples to copy: NB_EDEVICE). */
    nb_dataset *ds = NULL;
    nb_scope_begin();
    bool prev = nb_set_grad_enabled(false);
    nb_tensor *hx = host_copy(x, op, "x"), *hy = y && hx ? host_copy(y, op, "y") : NULL;
    nb_set_grad_enabled(prev);
    if (hx && (!y || hy)) ds = nb__mem_dataset("tensor", hx, hy, &xs, y ? &ys : NULL, 0);
    nb_scope_end();
    return ds;
}

/* ---- IDX image/label datasets ------------------------------------------------------------ */
nb_mnist_opts nb_mnist_defaults(void) {
    return (nb_mnist_opts){._init = NB__OPTS_MARK(nb_mnist_opts), .limit = INT64_MAX};
}

nb_dataset *nb_idx_dataset_new(const char *images_path, const char *labels_path,
                               const nb_mnist_opts *opts) {
    const char *op = "idx_dataset";
    if (!images_path || !labels_path) {
        nb__error(NB_ENULL, "%s: argument '%s' is NULL", op,
                  images_path ? "labels_path" : "images_path");
        return NULL;
    }
    if (opts &&
        NB__OPTS_CHECK(opts, nb_mnist_opts, op, "nb_mnist_defaults()", "o.limit = 1000") != NB_OK)
        return NULL;
    nb_mnist_opts o = opts ? *opts : nb_mnist_defaults();
    if (o.limit < 0) {
        nb__error(NB_EINVAL, "%s: limit must be >= 0 (got %lld)", op, (long long)o.limit);
        return NULL;
    }
    nb_dataset *ds = NULL;
    nb_scope_begin();
    nb_tensor *img = nb_idx_read(images_path);
    nb_tensor *lab = img ? nb_idx_read(labels_path) : NULL;
    if (!lab) goto done;
    if (img->dtype != NB_U8 || img->ndim != 3) {
        nb__error(NB_EFORMAT, "%s: %s: expected u8 images of shape (N, rows, cols), got %s "
                  "%s", op, images_path, nb_dtype_name(img->dtype), NB__SHAPE(img));
        goto done;
    }
    if ((lab->dtype != NB_U8 && lab->dtype != NB_I32) || lab->ndim != 1) {
        nb__error(NB_EFORMAT, "%s: %s: expected integer labels of shape (N), got %s %s", op,
                  labels_path, nb_dtype_name(lab->dtype), NB__SHAPE(lab));
        goto done;
    }
    if (img->shape[0] != lab->shape[0]) {
        nb__error(NB_EFORMAT, "%s: %s has %lld images but %s has %lld labels", op,
                  images_path, (long long)img->shape[0], labels_path,
                  (long long)lab->shape[0]);
        goto done;
    }
    if (o.limit < img->shape[0]) {
        img = nb_narrow(img, 0, 0, o.limit);
        lab = nb_narrow(lab, 0, 0, o.limit);
    }
    nb_sample_spec xs = {.dtype = o.raw_u8 ? NB_U8 : NB_F32, .ndim = 3,
                         .shape = {1, img->shape[1], img->shape[2]}};
    nb_sample_spec ys = {.dtype = NB_I64, .ndim = 0};
    ds = nb__mem_dataset("idx", img, lab, &xs, &ys, o.raw_u8 ? 0 : 255.0);
done:
    nb_scope_end();
    return ds;
}

/* dir/name.gz when it exists, else dir/name (unpacked copies work too). */
static void data_file(char *buf, size_t n, const char *dir, const char *name) {
    struct stat sb;
    snprintf(buf, n, "%s/%s.gz", dir, name);
    if (stat(buf, &sb) == 0) return;
    char plain[4096];
    snprintf(plain, sizeof plain, "%s/%s", dir, name);
    if (stat(plain, &sb) == 0) snprintf(buf, n, "%s", plain);
}

nb_dataset *nb_fashion_mnist_new(const char *dir, bool train, const nb_mnist_opts *opts) {
    if (!dir) dir = NB_FASHION_MNIST_DIR;
    const char *split = train ? "train" : "t10k";
    char img[4096], lab[4096], name[64];
    snprintf(name, sizeof name, "%s-images-idx3-ubyte", split);
    data_file(img, sizeof img, dir, name);
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", split);
    data_file(lab, sizeof lab, dir, name);
    return nb_idx_dataset_new(img, lab, opts);
}

const char *nb_fashion_mnist_class(int64_t label) {
    static const char *names[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
    return label >= 0 && label < 10 ? names[label] : "?";
}
