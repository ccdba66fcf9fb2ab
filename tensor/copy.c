/* copy.c - copies and dtype conversion (clone, to_dtype, copy_, fill_, read, item). */
#include <math.h>
#include <string.h>

#include "tensor/tape.h"
#include "tensor/backend.h"

/* In-place writes would silently corrupt gradients that depend on the old values; like
 * PyTorch, they are refused on tensors in the graph while grad mode is on (optimizers
 * update parameters with grad mode off). */
bool nb__inplace_ok(const nb_tensor *t, const char *op) {
    if (!nb_grad_enabled() || !t->requires_grad) return true;
    nb__error(NB_EINVAL, "%s: in-place write into a tensor that requires grad; do it with "
              "grad mode off (nb_set_grad_enabled(false)), as optimizers do", op);
    return false;
}

/* dst <- src (broadcast, converted) by the copy kernel of their device; shapes and
 * devices already checked. */
static nb_status copy_into(nb_tensor *dst, const nb_tensor *src, const char *op) {
    if (nb_numel(dst) == 0) return NB_OK;
    nb__copy_args a;
    nb_tensor *ts[2] = {dst, nb__mut(src)};
    nb__iter_init(&a.it, dst->shape, dst->ndim, ts, 2);
    return nb__run_copy(nb__device_of(dst), op, &a);
}

/* r (a fresh result) or NULL when the copy into it failed. */
static nb_tensor *copy_result(nb_tensor *r, const nb_tensor *src, const char *op) {
    if (r && copy_into(r, src, op) != NB_OK) {
        nb_tensor_free(nb__scope_take(r));
        return NULL;
    }
    return r;
}

nb_tensor *nb_clone(nb_tensor *t) {
    NB__CHECK_ARG(t, "clone", "t");
    nb_tensor *r = nb__empty(t->shape, t->ndim, t->dtype, t->storage->device);
    r = copy_result(r, t, "clone");
    nb__record(r, NB__OP_COPY, &t, 1);
    return r;
}

nb_tensor *nb_to_dtype(nb_tensor *t, nb_dtype dt) {
    NB__CHECK_ARG(t, "to_dtype", "t");
    if ((unsigned)dt >= NB_DTYPE_COUNT) {
        nb__error(NB_EDTYPE, "to_dtype: %d is not a valid dtype", (int)dt);
        return NULL;
    }
    if (dt == t->dtype) return nb__scope_add(nb_tensor_retain(t));
    nb_tensor *r = nb__empty(t->shape, t->ndim, dt, t->storage->device);
    r = copy_result(r, t, "to_dtype");
    if (nb_dtype_is_float(dt)) nb__record(r, NB__OP_TO_DTYPE, &t, 1);
    return r;
}

nb_status nb_copy_(nb_tensor *dst, const nb_tensor *src) {
    if (!nb__arg_ok(dst, "copy_", "dst") || !nb__arg_ok(src, "copy_", "src"))
        return nb_last_status();
    if (!nb__check_devices("copy_", (nb_tensor *[]){dst, nb__mut(src)}, 2, NULL))
        return NB_EDEVICE;
    if (!nb__inplace_ok(dst, "copy_")) return NB_EINVAL;
    int64_t sh[NB_MAX_DIMS];
    int nd;
    if (!nb__broadcast_shapes(dst->shape, dst->ndim, src->shape, src->ndim, sh, &nd, "copy_"))
        return NB_ESHAPE;
    if (nd != dst->ndim || memcmp(sh, dst->shape, sizeof(int64_t) * (size_t)nd) != 0)
        return nb__error(NB_ESHAPE, "copy_: source of shape %s does not broadcast to the "
                         "destination's shape %s", NB__SHAPE(src), NB__SHAPE(dst));
    nb__bump_version(dst);
    /* Overlapping non-identical views would read values already overwritten: go through a
     * temporary then. */
    if (dst->storage == src->storage &&
        !(dst->offset == src->offset && dst->ndim == src->ndim &&
          memcmp(dst->strides, src->strides, sizeof(int64_t) * (size_t)dst->ndim) == 0)) {
        nb_scope_begin();
        nb_tensor *tmp = nb_clone(nb__mut(src));
        nb_status st = tmp ? copy_into(dst, tmp, "copy_") : nb_last_status();
        nb_scope_end();
        return st;
    }
    return copy_into(dst, src, "copy_");
}

nb_status nb_fill_(nb_tensor *t, double value) {
    if (!nb__arg_ok(t, "fill_", "t")) return nb_last_status();
    if (!nb__inplace_ok(t, "fill_")) return NB_EINVAL;
    if (nb_numel(t) == 0) return NB_OK;
    nb__bump_version(t);
    nb__fill_args a = {.value = value};
    nb__iter_init(&a.it, t->shape, t->ndim, &t, 1);
    return nb__run_fill(nb__device_of(t), "fill_", &a);
}

nb_status nb_read(const nb_tensor *t, void *buf, int64_t n, nb_dtype dt) {
    if (!nb__arg_ok(t, "read", "t")) return nb_last_status();
    if (!buf && n > 0) return nb__error(NB_ENULL, "read: buffer is NULL");
    if ((unsigned)dt >= NB_DTYPE_COUNT)
        return nb__error(NB_EDTYPE, "read: %d is not a valid dtype", (int)dt);
    int64_t numel = nb_numel(t);
    if (n < numel)
        return nb__error(NB_EINVAL, "read: buffer holds %lld elements but the tensor %s has %lld",
                         (long long)n, NB__SHAPE(t), (long long)numel);
    nb_tensor *dst = nb_wrap_buffer(buf, t->shape, t->ndim, dt, NULL, NULL);
    if (!dst) return nb_last_status();
    nb__scope_take(dst); /* freed right here, not by the caller's scope */
    nb_status st;
    if (nb__host_accessible(t)) {
        st = copy_into(dst, t, "read");
    } else { /* through a host copy */
        nb_scope_begin();
        nb_tensor *h = nb_to_device(nb__mut(t), NB_CPU);
        st = h ? copy_into(dst, h, "read") : nb_last_status();
        nb_scope_end();
    }
    nb_tensor_free(dst);
    return st;
}

static const char *item_check(const nb_tensor *t, const char *op) {
    if (!nb__arg_ok(t, op, "t")) return NULL;
    if (nb_numel(t) != 1) {
        nb__error(NB_ESHAPE, "%s: the tensor has %lld elements %s; only one-element tensors "
                  "have an item", op, (long long)nb_numel(t), NB__SHAPE(t));
        return NULL;
    }
    return "";
}

double nb_item_f64(const nb_tensor *t) {
    double v;
    if (!item_check(t, "item") || nb_read(t, &v, 1, NB_F64) != NB_OK) return NAN;
    return v;
}

int64_t nb_item_i64(const nb_tensor *t) {
    int64_t v;
    if (!item_check(t, "item") || nb_read(t, &v, 1, NB_I64) != NB_OK) return 0;
    return v;
}

double nb_get_f64(const nb_tensor *t, const int64_t *index) {
    if (!nb__arg_ok(t, "get", "t")) return NAN;
    if (t->ndim && !index) {
        nb__error(NB_ENULL, "get: index is NULL");
        return NAN;
    }
    int64_t off = 0;
    for (int d = 0; d < t->ndim; d++) {
        if (index[d] < 0 || index[d] >= t->shape[d]) {
            nb__error(NB_EINDEX, "get: index %lld is out of range for dim %d of size %lld",
                      (long long)index[d], d, (long long)t->shape[d]);
            return NAN;
        }
        off += index[d] * t->strides[d];
    }
    if (nb__host_accessible(t))
        return nb__load_f64(nb__ptr(t) + off * (int64_t)nb_dtype_size(t->dtype), t->dtype);
    /* One element of device memory: a 0-dim view of it, read through the host. */
    nb_scope_begin();
    nb_tensor *e = nb__view_of(t, NULL, NULL, 0, t->offset + off);
    double v = e ? nb_item_f64(e) : NAN;
    nb_scope_end();
    return v;
}

/* ---- devices ----------------------------------------------------------------------------------
 * Between devices a contiguous copy of t moves as bytes: to_host of t's backend, from_host
 * of dev's (through a host buffer when neither is the host). */
nb_tensor *nb_to_device(nb_tensor *t, nb_device dev) {
    NB__CHECK_ARG(t, "to_device", "t");
    nb_device src = nb__device_of(t);
    if (nb_device_equal(src, dev)) return nb__scope_add(nb_tensor_retain(t));
    const nb__backend *sb = nb__backend_of(src, "to_device"), *db = nb__backend_of(dev, "to_device");
    if (!sb || !db) return NULL;
    if (!sb->has_storage && db->has_storage) {
        nb__error(NB_EDEVICE, "to_device: a meta tensor has no data to copy to %s",
                  NB__DEVSTR(dev));
        return NULL;
    }
    nb_tensor *out = NULL;
    nb_scope_begin();
    nb_tensor *c = db->has_storage ? nb_contiguous(t) : t;
    nb_tensor *r = c ? nb__empty(t->shape, t->ndim, t->dtype, dev) : NULL;
    size_t nbytes = (size_t)nb_numel(t) * nb_dtype_size(t->dtype);
    nb_status st = r ? NB_OK : nb_last_status();
    if (st == NB_OK && db->has_storage && nbytes) {
        if (sb->host_accessible) {
            st = db->from_host(dev, nb__ptr(r), nb__ptr(c), nbytes);
        } else if (db->host_accessible) {
            st = sb->to_host(src, nb__ptr(r), nb__ptr(c), nbytes);
        } else {
            void *tmp = nb_host_alloc(nbytes);
            st = tmp ? sb->to_host(src, tmp, nb__ptr(c), nbytes) : NB_ENOMEM;
            if (st == NB_OK) st = db->from_host(dev, nb__ptr(r), tmp, nbytes);
            nb_host_free(tmp);
        }
    }
    if (st == NB_OK) out = nb_keep(r);
    nb_scope_end();
    if (!out) return NULL;
    if (nb_dtype_is_float(t->dtype)) {
        nb__node *nd = nb__record(out, NB__OP_TO_DEVICE, &t, 1);
        if (nd) nd->attrs.i[0] = src.type, nd->attrs.i[1] = src.index;
    }
    return out;
}

/* The gradient goes back to the input's device. */
nb_status nb__bw_TO_DEVICE(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    nb_device src = {(nb_device_type)n->attrs.i[0], (int)n->attrs.i[1]};
    gin[0] = nb_to_device(g, src);
    return gin[0] ? NB_OK : nb_last_status();
}

/* Gradients: both pass the output gradient through; the engine converts it to the input's
 * dtype for TO_DTYPE. */
nb_status nb__bw_COPY(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    (void)n;
    gin[0] = nb__scope_add(nb_tensor_retain(g));
    return NB_OK;
}

nb_status nb__bw_TO_DTYPE(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    return nb__bw_COPY(n, g, gin);
}
