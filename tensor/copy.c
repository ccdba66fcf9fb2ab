/* copy.c - copies and dtype conversion (clone, to_dtype, copy_, fill_, read, item). */
#include <math.h>
#include <string.h>

#include "autograd/autograd_impl.h"

/* In-place writes would silently corrupt gradients that depend on the old values; like
 * PyTorch, they are refused on tensors in the graph while grad mode is on (optimizers
 * update parameters with grad mode off). */
bool nb__inplace_ok(const nb_tensor *t, const char *op) {
    if (!nb_grad_enabled() || !t->requires_grad) return true;
    nb__error(NB_EINVAL, "%s: in-place write into a tensor that requires grad; do it with "
              "grad mode off (nb_set_grad_enabled(false)), as optimizers do", op);
    return false;
}

static bool on_cpu(const nb_tensor *t, const char *op) {
    if (t->storage->device.type == NB_DEVICE_CPU) return true;
    nb__error(NB_EDEVICE, "%s: CUDA tensors are not supported by this op yet", op);
    return false;
}

/* dst <- src (broadcast, converted); both CPU; shapes already checked. */
static void copy_into(nb_tensor *dst, const nb_tensor *src) {
    nb__iter it;
    nb_tensor *ts[2] = {dst, (nb_tensor *)src};
    nb__iter_init(&it, dst->shape, dst->ndim, ts, 2);
    nb__cpu_copy(&it);
}

nb_tensor *nb_clone(nb_tensor *t) {
    NB__CHECK_ARG(t, "clone", "t");
    if (!on_cpu(t, "clone")) return NULL;
    nb_tensor *r = nb__empty(t->shape, t->ndim, t->dtype, t->storage->device);
    if (r) copy_into(r, t);
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
    if (!on_cpu(t, "to_dtype")) return NULL;
    nb_tensor *r = nb__empty(t->shape, t->ndim, dt, t->storage->device);
    if (r) copy_into(r, t);
    if (nb_dtype_is_float(dt)) nb__record(r, NB__OP_TO_DTYPE, &t, 1);
    return r;
}

nb_status nb_copy_(nb_tensor *dst, const nb_tensor *src) {
    if (!nb__arg_ok(dst, "copy_", "dst") || !nb__arg_ok(src, "copy_", "src"))
        return nb_last_status();
    if (!on_cpu(dst, "copy_") || !on_cpu(src, "copy_")) return NB_EDEVICE;
    if (!nb__inplace_ok(dst, "copy_")) return NB_EINVAL;
    int64_t sh[NB_MAX_DIMS];
    int nd;
    if (!nb__broadcast_shapes(dst->shape, dst->ndim, src->shape, src->ndim, sh, &nd, "copy_"))
        return NB_ESHAPE;
    if (nd != dst->ndim || memcmp(sh, dst->shape, sizeof(int64_t) * (size_t)nd) != 0)
        return nb__error(NB_ESHAPE, "copy_: source of shape %s does not broadcast to the "
                         "destination's shape %s", NB__SHAPE(src), NB__SHAPE(dst));
    /* Overlapping non-identical views would read values already overwritten: go through a
     * temporary then. */
    if (dst->storage == src->storage &&
        !(dst->offset == src->offset && dst->ndim == src->ndim &&
          memcmp(dst->strides, src->strides, sizeof(int64_t) * (size_t)dst->ndim) == 0)) {
        nb_scope_begin();
        nb_tensor *tmp = nb_clone((nb_tensor *)src);
        if (tmp) copy_into(dst, tmp);
        nb_scope_end();
        return tmp ? NB_OK : nb_last_status();
    }
    copy_into(dst, src);
    return NB_OK;
}

nb_status nb_fill_(nb_tensor *t, double value) {
    if (!nb__arg_ok(t, "fill_", "t")) return nb_last_status();
    if (!on_cpu(t, "fill_")) return NB_EDEVICE;
    if (!nb__inplace_ok(t, "fill_")) return NB_EINVAL;
    nb__cpu_fill(t, value);
    return NB_OK;
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
    if (!on_cpu(t, "read")) return NB_EDEVICE;
    nb_tensor *dst = nb_wrap_buffer(buf, t->shape, t->ndim, dt, NULL, NULL);
    if (!dst) return nb_last_status();
    nb__scope_take(dst); /* freed right here, not by the caller's scope */
    copy_into(dst, t);
    nb_tensor_free(dst);
    return NB_OK;
}

static const char *item_check(const nb_tensor *t, const char *op) {
    if (!nb__arg_ok(t, op, "t")) return NULL;
    if (nb_numel(t) != 1) {
        nb__error(NB_ESHAPE, "%s: the tensor has %lld elements %s; only one-element tensors "
                  "have an item", op, (long long)nb_numel(t), NB__SHAPE(t));
        return NULL;
    }
    if (t->storage->device.type != NB_DEVICE_CPU) {
        nb__error(NB_EDEVICE, "%s: CUDA tensors are not supported by this op yet", op);
        return NULL;
    }
    return nb__ptr(t);
}

double nb_item_f64(const nb_tensor *t) {
    const char *p = item_check(t, "item");
    return p ? nb__load_f64(p, t->dtype) : NAN;
}

int64_t nb_item_i64(const nb_tensor *t) {
    const char *p = item_check(t, "item");
    if (!p) return 0;
    if (t->dtype == NB_I64) return *(const int64_t *)p;
    int64_t v;
    nb__store_f64(&v, NB_I64, nb__load_f64(p, t->dtype));
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
    if (t->storage->device.type != NB_DEVICE_CPU) {
        nb__error(NB_EDEVICE, "get: CUDA tensors are not supported by this op yet");
        return NAN;
    }
    return nb__load_f64((const char *)t->storage->data +
                            (t->offset + off) * (int64_t)nb_dtype_size(t->dtype),
                        t->dtype);
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
