/* tensor/print.c - PyTorch-style printing: "tensor([[1.0000, 2.0000], ...], dtype=f32)".
 * Tensors over 1000 elements show the first and last 3 entries of each long dim.
 *
 * Values are read on the host: a tensor of another device (CUDA, guard) is copied to the
 * host first and its device is named at the end ("..., dtype=f32, device=cuda:0)"); a meta
 * tensor has no values and prints as "tensor(..., size=[2,3], dtype=f32, device=meta)". */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/autograd.h"
#include "tensor/backend.h"
#include "tensor/tensor_impl.h"

typedef struct {
    char *buf;
    size_t cap, len; /* len counts what the full text needs, even past cap */
} sbuf;

static void put(sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = s->len < s->cap ? s->cap - s->len : 0;
    int n = vsnprintf(room ? s->buf + s->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0) s->len += (size_t)n;
}

static void put_elem(sbuf *s, const nb_tensor *t, const char *p, bool ints_as_float) {
    double v = nb__load_f64(p, t->dtype);
    switch (t->dtype) {
    case NB_BOOL: put(s, "%s", v != 0 ? "True" : "False"); break;
    case NB_I64: put(s, "%lld", (long long)*(const int64_t *)p); break;
    case NB_I32: case NB_U8: put(s, "%lld", (long long)v); break;
    default:
        if (isnan(v)) put(s, "nan");
        else if (isinf(v)) put(s, v > 0 ? "inf" : "-inf");
        else if (ints_as_float) put(s, "%.0f.", v);
        else if (v != 0 && (fabs(v) >= 1e8 || fabs(v) < 1e-4)) put(s, "%.4e", v);
        else put(s, "%.4f", v);
    }
}

static void put_dim(sbuf *s, const nb_tensor *t, const char *p, int d, bool summarize,
                    bool ints_as_float, int indent) {
    if (d == t->ndim) {
        put_elem(s, t, p, ints_as_float);
        return;
    }
    int64_t n = t->shape[d], es = (int64_t)nb_dtype_size(t->dtype);
    put(s, "[");
    for (int64_t i = 0; i < n; i++) {
        if (summarize && n > 6 && i == 3) {
            put(s, "...");
            i = n - 3;
            put(s, d == t->ndim - 1 ? ", " : ",\n%*s", indent + d + 1, "");
        }
        put_dim(s, t, p + i * t->strides[d] * es, d + 1, summarize, ints_as_float, indent);
        if (i + 1 < n) {
            if (d == t->ndim - 1) put(s, ", ");
            else {
                put(s, ",");
                for (int k = d + 1; k < t->ndim; k++) put(s, "\n");
                put(s, "%*s", indent + d + 1, "");
            }
        }
    }
    put(s, "]");
}

/* Format t, in host memory; dev names the device the values came from (NULL: the CPU). */
static int format_host(const nb_tensor *t, char *buf, size_t n, const char *dev) {
    sbuf s = {buf, buf ? n : 0, 0};
    if (buf && n) buf[0] = '\0';
    int64_t numel = nb_numel(t);
    /* Floats that are all integral print as "1.", like PyTorch. */
    bool ints_as_float = nb_dtype_is_float(t->dtype) && numel > 0 && numel <= 1000;
    if (ints_as_float) {
        for (int64_t i = 0; i < numel && ints_as_float; i++) {
            int64_t idx[NB_MAX_DIMS], off = 0;
            int64_t rem = i;
            for (int d = t->ndim - 1; d >= 0; d--) {
                idx[d] = rem % t->shape[d];
                rem /= t->shape[d];
                off += idx[d] * t->strides[d];
            }
            double v = nb__load_f64(nb__ptr(t) + off * (int64_t)nb_dtype_size(t->dtype), t->dtype);
            ints_as_float = isfinite(v) && v == floor(v) && fabs(v) < 1e8;
        }
    }
    put(&s, "tensor(");
    if (numel == 0) {
        put(&s, "[], size=%s", NB__SHAPE(t));
    } else {
        put_dim(&s, t, nb__ptr(t), 0, numel > 1000, ints_as_float, 7);
    }
    put(&s, ", dtype=%s", nb_dtype_name(t->dtype));
    if (dev) put(&s, ", device=%s", dev);
    put(&s, ")");
    if (buf && n) buf[s.len < n ? s.len : n - 1] = '\0';
    return s.len > (size_t)INT32_MAX ? INT32_MAX : (int)s.len;
}

int nb_format(const nb_tensor *t, char *buf, size_t n) {
    if (!nb__arg_ok(t, "format", "t")) return nb_last_status();
    if (nb__host_accessible(t)) return format_host(t, buf, n, NULL);
    nb_device d = nb__device_of(t);
    const nb__backend *be = nb__backend_of(d, "format");
    if (!be) return nb_last_status();
    char dev[NB__DEVICE_STR];
    nb__device_str(d, dev);
    if (!be->has_storage) { /* meta: shape and dtype, no values */
        int len = snprintf(buf, buf ? n : 0, "tensor(..., size=%s, dtype=%s, device=%s)",
                           NB__SHAPE(t), nb_dtype_name(t->dtype), dev);
        return len < 0 ? nb__error(NB_EINTERNAL, "format: snprintf failed") : len;
    }
    /* Another device: format a host copy (a plain copy, not a step of a graph). */
    nb_scope_begin();
    bool prev = nb_set_grad_enabled(false);
    nb_tensor *h = nb_to_device(nb__mut(t), NB_CPU);
    nb_set_grad_enabled(prev);
    int len = h ? format_host(h, buf, n, dev) : (int)nb_last_status();
    nb_scope_end();
    return len;
}

nb_status nb_print(const nb_tensor *t, FILE *f) {
    int need = nb_format(t, NULL, 0);
    if (need < 0) return (nb_status)need;
    char *buf = malloc((size_t)need + 1);
    if (!buf) return nb__error(NB_ENOMEM, "print: out of memory");
    nb_format(t, buf, (size_t)need + 1);
    fprintf(f ? f : stdout, "%s\n", buf);
    free(buf);
    return NB_OK;
}
