/* norm.c - layer norm and batch norm: the functional ops (fused forward and backward
 * kernels behind the kernel table's layer_norm, layer_norm_backward, batch_norm_stats,
 * batch_norm_apply and batch_norm_backward, tensor/kernels/norm.h; one autograd node each)
 * and the LayerNorm / BatchNorm1d / BatchNorm2d modules with PyTorch's parameter and buffer
 * names.
 *
 * Both ops keep their per-row (layer norm) or per-channel (batch norm) mean and 1/std in
 * f64 tensors on the input's device that the backward reuses, so the backward never
 * recomputes statistics. Batch norm's running statistics are read and updated by the
 * batch_norm_stats kernel, on their device. f16/bf16 inputs are computed in f32 and rounded
 * once. */
#include <math.h>
#include <string.h>

#include "tensor/tape.h"
#include "nabla/nn.h"
#include "tensor/backend.h"
#include "tensor/autocast.h"

static nb_dtype compute_dtype(nb_dtype dt) { return dt == NB_F64 ? NB_F64 : NB_F32; }

/* t converted to dt and made contiguous (t itself when it already is); NULL stays NULL. */
static nb_tensor *dense(nb_tensor *t, nb_dtype dt) {
    if (!t) return NULL;
    nb_tensor *c = nb_to_dtype(t, dt);
    return c ? nb_contiguous(c) : NULL;
}

/* Device pointer of t (void *, for a kernel's args), NULL for NULL. */
static void *data(const nb_tensor *t) { return t ? (void *)nb__ptr(t) : NULL; }

static bool wants(const nb__node *n, int i) { return n->edges[i].node || n->edges[i].leaf; }

/* An affine parameter (weight or bias) of an op: NULL, or 1-D of `size` in dtype dt. */
static bool check_affine(const nb_tensor *p, const char *op, const char *name, int64_t size,
                         nb_dtype dt, const char *what) {
    if (!p) return true;
    if (p->dtype != dt) {
        nb__error(NB_EDTYPE, "%s: %s is %s but the input is %s", op, name,
                  nb_dtype_name(p->dtype), nb_dtype_name(dt));
        return false;
    }
    if (p->ndim != 1 || p->shape[0] != size) {
        nb__error(NB_ESHAPE, "%s: %s must have shape [%lld] (%s), got %s", op, name,
                  (long long)size, what, NB__SHAPE(p));
        return false;
    }
    return true;
}

static bool check_input(const nb_tensor *x, const char *op, int min_dims, const char *layout) {
    if (!nb_dtype_is_float(x->dtype)) {
        nb__error(NB_EDTYPE, "%s: input dtype %s is not supported (f32, f64, f16 or bf16)", op,
                  nb_dtype_name(x->dtype));
        return false;
    }
    if (x->ndim < min_dims) {
        nb__error(NB_ESHAPE, "%s: expected an input of at least %d dims %s, got shape %s", op,
                  min_dims, layout, NB__SHAPE(x));
        return false;
    }
    return true;
}

static bool check_eps(double eps, const char *op) {
    if (!(eps >= 0) || !isfinite(eps)) {
        nb__error(NB_EINVAL, "%s: eps must be finite and >= 0, got %g", op, eps);
        return false;
    }
    return true;
}

/* ---- layer norm ------------------------------------------------------------------------------ */
nb_tensor *nb_layer_norm(nb_tensor *x, nb_tensor *w, nb_tensor *b, double eps) {
    const char *op = "layer_norm";
    NB__CHECK_ARG(x, op, "x");
    x = nb__autocast(x, NB_AUTOCAST_F32); /* nabla/autocast.h */
    if (w && !(w = nb__autocast(w, NB_AUTOCAST_F32))) return NULL;
    if (b && !(b = nb__autocast(b, NB_AUTOCAST_F32))) return NULL;
    if (!x) return NULL;
    if (!check_input(x, op, 1, "(..., features)")) return NULL;
    int64_t D = x->shape[x->ndim - 1], N = nb__numel_of(x->shape, x->ndim - 1);
    if (!check_affine(w, op, "weight", D, x->dtype, "the input's last dim") ||
        !check_affine(b, op, "bias", D, x->dtype, "the input's last dim") || !check_eps(eps, op))
        return NULL;
    nb_device dev;
    if (!nb__check_devices(op, (nb_tensor *[]){x, w, b}, 3, &dev)) return NULL;
    nb_dtype dt = x->dtype, cdt = compute_dtype(dt);

    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_tensor *xc = dense(x, cdt), *wc = dense(w, cdt), *bc = dense(b, cdt);
    nb_tensor *out = nb__empty(x->shape, x->ndim, cdt, dev);
    nb_tensor *mean = nb__empty(&N, 1, NB_F64, dev), *rstd = nb__empty(&N, 1, NB_F64, dev);
    bool ok = xc && (wc || !w) && (bc || !b) && out && mean && rstd;
    if (ok) {
        nb__layer_norm_args a = {.dtype = cdt, .N = N, .D = D, .eps = eps, .x = data(xc),
                                 .w = data(wc), .b = data(bc), .y = data(out),
                                 .mean = data(mean), .rstd = data(rstd)};
        ok = nb__run_layer_norm(dev, op, &a) == NB_OK;
        if (ok && cdt != dt) ok = (out = nb_to_dtype(out, dt)) != NULL;
    }
    if (!ok) out = NULL;
    nb_keep(out);
    nb_keep(mean);
    nb_keep(rstd);
    nb_scope_end();
    nb_set_grad_enabled(prev);
    nb__node *nd = out ? nb__record(out, NB__OP_LAYER_NORM, (nb_tensor *[]){x, w, b}, 3) : NULL;
    if (nd) {
        nb__save(nd, 0, x);
        nb__save(nd, 1, w);
        nb__save(nd, 2, mean);
        nb__save(nd, 3, rstd);
    }
    /* The node holds its own views of the statistics. */
    nb_tensor_free(nb__scope_take(mean));
    nb_tensor_free(nb__scope_take(rstd));
    return out;
}

nb_status nb__bw_LAYER_NORM(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *x = n->saved[0], *w = n->saved[1];
    nb_device dev;
    if (!nb__check_devices("layer_norm", (nb_tensor *[]){x, g}, 2, &dev)) return NB_EDEVICE;
    nb_dtype cdt = compute_dtype(x->dtype);
    int64_t D = x->shape[x->ndim - 1], N = nb__numel_of(x->shape, x->ndim - 1);
    nb_tensor *gc = dense(g, cdt), *xc = dense(x, cdt), *wc = dense(w, cdt);
    if (!gc || !xc || (w && !wc)) return nb_last_status();
    nb_tensor *dx = wants(n, 0) ? nb__empty(x->shape, x->ndim, cdt, dev) : NULL;
    nb_tensor *dw = wants(n, 1) ? nb__empty(&D, 1, cdt, dev) : NULL;
    nb_tensor *db = wants(n, 2) ? nb__empty(&D, 1, cdt, dev) : NULL;
    if ((wants(n, 0) && !dx) || (wants(n, 1) && !dw) || (wants(n, 2) && !db))
        return nb_last_status();
    nb__layer_norm_backward_args a = {.dtype = cdt, .N = N, .D = D, .g = data(gc),
                                      .x = data(xc), .w = data(wc), .mean = data(n->saved[2]),
                                      .rstd = data(n->saved[3]), .dx = data(dx), .dw = data(dw),
                                      .db = data(db)};
    nb_status st = nb__run_layer_norm_backward(dev, "layer_norm", &a);
    if (st != NB_OK) return st;
    gin[0] = dx, gin[1] = dw, gin[2] = db;
    return NB_OK;
}

/* ---- batch norm ------------------------------------------------------------------------------ */
static bool check_running(const nb_tensor *r, const char *name, int64_t C) {
    if (!nb_dtype_is_float(r->dtype)) {
        nb__error(NB_EDTYPE, "batch_norm: %s must be a float tensor, not %s", name,
                  nb_dtype_name(r->dtype));
        return false;
    }
    if (r->ndim != 1 || r->shape[0] != C) {
        nb__error(NB_ESHAPE, "batch_norm: %s must have shape [%lld] (the channels), got %s", name,
                  (long long)C, NB__SHAPE(r));
        return false;
    }
    return true;
}

nb_tensor *nb_batch_norm(nb_tensor *x, nb_tensor *running_mean, nb_tensor *running_var,
                         nb_tensor *w, nb_tensor *b, bool training, double momentum,
                         double eps) {
    const char *op = "batch_norm";
    NB__CHECK_ARG(x, op, "x");
    x = nb__autocast(x, NB_AUTOCAST_F32); /* nabla/autocast.h */
    if (w && !(w = nb__autocast(w, NB_AUTOCAST_F32))) return NULL;
    if (b && !(b = nb__autocast(b, NB_AUTOCAST_F32))) return NULL;
    if (!x) return NULL;
    if (!check_input(x, op, 2, "(N, C, ...)")) return NULL;
    int64_t N = x->shape[0], C = x->shape[1], S = nb__numel_of(x->shape + 2, x->ndim - 2);
    if (!check_affine(w, op, "weight", C, x->dtype, "the input's channels") ||
        !check_affine(b, op, "bias", C, x->dtype, "the input's channels") || !check_eps(eps, op))
        return NULL;
    if (!running_mean != !running_var) {
        nb__error(NB_EINVAL, "batch_norm: give both running_mean and running_var, or neither");
        return NULL;
    }
    if (running_mean &&
        (!check_running(running_mean, "running_mean", C) ||
         !check_running(running_var, "running_var", C)))
        return NULL;
    if (!training && !running_mean) {
        nb__error(NB_EINVAL, "batch_norm: eval mode (training false) normalizes with the "
                  "running statistics, so running_mean and running_var are required");
        return NULL;
    }
    if (training && !(momentum >= 0 && momentum <= 1)) {
        nb__error(NB_EINVAL, "batch_norm: momentum must be in [0, 1], got %g", momentum);
        return NULL;
    }
    int64_t M = N * S;
    if (training && M <= 1) {
        nb__error(NB_EINVAL, "batch_norm: expected more than 1 value per channel when "
                  "training, got input of shape %s", NB__SHAPE(x));
        return NULL;
    }
    nb_device dev;
    if (!nb__check_devices(op, (nb_tensor *[]){x, w, b, running_mean, running_var}, 5, &dev))
        return NULL;
    nb_dtype dt = x->dtype, cdt = compute_dtype(dt);

    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_tensor *xc = dense(x, cdt), *wc = dense(w, cdt), *bc = dense(b, cdt);
    nb_tensor *out = nb__empty(x->shape, x->ndim, cdt, dev);
    nb_tensor *mean = nb__empty(&C, 1, NB_F64, dev), *rstd = nb__empty(&C, 1, NB_F64, dev);
    bool ok = xc && (wc || !w) && (bc || !b) && out && mean && rstd;
    if (ok) {
        /* the statistics (and the running statistics' update), then the normalization */
        nb__batch_norm_stats_args sa = {.dtype = cdt, .N = N, .C = C, .S = S, .x = data(xc),
                                        .training = training, .momentum = momentum, .eps = eps,
                                        .mean = data(mean), .rstd = data(rstd)};
        if (running_mean) {
            nb__view_init(&sa.running_mean, running_mean);
            nb__view_init(&sa.running_var, running_var);
            if (training) { /* the kernel updates them in place */
                nb__bump_version(running_mean);
                nb__bump_version(running_var);
            }
        }
        ok = nb__run_batch_norm_stats(dev, op, &sa) == NB_OK;
    }
    if (ok) {
        nb__batch_norm_apply_args aa = {.dtype = cdt, .N = N, .C = C, .S = S, .x = data(xc),
                                        .w = data(wc), .b = data(bc), .y = data(out),
                                        .mean = data(mean), .rstd = data(rstd)};
        ok = nb__run_batch_norm_apply(dev, op, &aa) == NB_OK;
        if (ok && cdt != dt) ok = (out = nb_to_dtype(out, dt)) != NULL;
    }
    if (!ok) out = NULL;
    nb_keep(out);
    nb_keep(mean);
    nb_keep(rstd);
    nb_scope_end();
    nb_set_grad_enabled(prev);
    nb__node *nd = out ? nb__record(out, NB__OP_BATCH_NORM, (nb_tensor *[]){x, w, b}, 3) : NULL;
    if (nd) {
        nb__save(nd, 0, x);
        nb__save(nd, 1, w);
        nb__save(nd, 2, mean);
        nb__save(nd, 3, rstd);
        nd->attrs.flag = training;
    }
    nb_tensor_free(nb__scope_take(mean));
    nb_tensor_free(nb__scope_take(rstd));
    return out;
}

nb_status nb__bw_BATCH_NORM(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *x = n->saved[0], *w = n->saved[1];
    nb_device dev;
    if (!nb__check_devices("batch_norm", (nb_tensor *[]){x, g}, 2, &dev)) return NB_EDEVICE;
    nb_dtype cdt = compute_dtype(x->dtype);
    int64_t N = x->shape[0], C = x->shape[1], S = nb__numel_of(x->shape + 2, x->ndim - 2);
    nb_tensor *gc = dense(g, cdt), *xc = dense(x, cdt), *wc = dense(w, cdt);
    if (!gc || !xc || (w && !wc)) return nb_last_status();
    nb_tensor *dx = wants(n, 0) ? nb__empty(x->shape, x->ndim, cdt, dev) : NULL;
    nb_tensor *dw = wants(n, 1) ? nb__empty(&C, 1, cdt, dev) : NULL;
    nb_tensor *db = wants(n, 2) ? nb__empty(&C, 1, cdt, dev) : NULL;
    if ((wants(n, 0) && !dx) || (wants(n, 1) && !dw) || (wants(n, 2) && !db))
        return nb_last_status();
    nb__batch_norm_backward_args a = {.dtype = cdt, .N = N, .C = C, .S = S, .g = data(gc),
                                      .x = data(xc), .w = data(wc), .mean = data(n->saved[2]),
                                      .rstd = data(n->saved[3]), .batch_stats = n->attrs.flag,
                                      .dx = data(dx), .dw = data(dw), .db = data(db)};
    nb_status st = nb__run_batch_norm_backward(dev, "batch_norm", &a);
    if (st != NB_OK) return st;
    gin[0] = dx, gin[1] = dw, gin[2] = db;
    return NB_OK;
}

/* ---- modules --------------------------------------------------------------------------------- */
typedef struct norm_self {
    int64_t features;
    double eps, momentum;
    bool affine, track;
    int spatial_dims; /* batch norm: 1 (1d) or 2 (2d) */
} norm_self;

static nb_module *fail_module(nb_module *m) {
    nb_module_free(m);
    return NULL;
}

nb_norm_opts nb_norm_defaults(void) {
    return (nb_norm_opts){._init = NB__OPTS_MARK(nb_norm_opts), .eps = 1e-5, .momentum = 0.1};
}

static nb_module *norm_module(const nb_module_vtable *vt, int64_t features,
                              const nb_norm_opts *o, int spatial_dims, const char *op) {
    if (o && NB__OPTS_CHECK(o, nb_norm_opts, op, "nb_norm_defaults()", "o.eps = 1e-6") != NB_OK)
        return NULL;
    nb_norm_opts opt = o ? *o : nb_norm_defaults();
    if (features < 0) {
        nb__error(NB_EINVAL, "%s: the number of features must be >= 0, got %lld", op,
                  (long long)features);
        return NULL;
    }
    if (!(opt.eps >= 0) || !(opt.momentum >= 0 && opt.momentum <= 1)) {
        nb__error(NB_EINVAL, "%s: eps must be >= 0 and momentum in [0, 1], got %g and %g", op,
                  opt.eps, opt.momentum);
        return NULL;
    }
    norm_self *s = malloc(sizeof *s);
    if (!s) {
        nb__error(NB_ENOMEM, "%s: out of memory", op);
        return NULL;
    }
    *s = (norm_self){features, opt.eps, opt.momentum, !opt.no_affine, !opt.no_running_stats,
                     spatial_dims};
    nb_module *m = nb_module_new(vt, s);
    if (!m) {
        free(s);
        return NULL;
    }
    int64_t shape[1] = {features};
    if (s->affine && (!nb_module_add_parameter(m, "weight", nb_ones(shape, 1, NB_F32)) ||
                      !nb_module_add_parameter(m, "bias", nb_zeros(shape, 1, NB_F32))))
        return fail_module(m);
    if (spatial_dims > 0 && s->track &&
        (!nb_module_add_buffer(m, "running_mean", nb_zeros(shape, 1, NB_F32)) ||
         !nb_module_add_buffer(m, "running_var", nb_ones(shape, 1, NB_F32)) ||
         !nb_module_add_buffer(m, "num_batches_tracked", nb_zeros(NULL, 0, NB_I64))))
        return fail_module(m);
    return m;
}

static nb_tensor *layernorm_forward(nb_module *m, nb_tensor *x) {
    const norm_self *s = nb_module_self(m);
    NB__CHECK_ARG(x, "layernorm", "x");
    if (x->ndim < 1 || x->shape[x->ndim - 1] != s->features) {
        nb__error(NB_ESHAPE, "layernorm: expected an input whose last dim is %lld, got shape %s",
                  (long long)s->features, NB__SHAPE(x));
        return NULL;
    }
    return nb_layer_norm(x, nb_module_param_opt(m, "weight"), nb_module_param_opt(m, "bias"),
                         s->eps);
}

/* num_batches_tracked += 1, on the buffer's device (an op: the host never reads it). */
static nb_status count_batch(nb_tensor *nbt) {
    nb_scope_begin();
    nb_tensor *one = nb_ones_on(nb__device_of(nbt), NULL, 0, nbt->dtype);
    nb_status st = one ? nb_add_(nbt, one) : nb_last_status();
    nb_scope_end();
    return st;
}

static nb_tensor *batchnorm_forward(nb_module *m, nb_tensor *x) {
    const norm_self *s = nb_module_self(m);
    const char *name = s->spatial_dims == 1 ? "batchnorm1d" : "batchnorm2d";
    NB__CHECK_ARG(x, name, "x");
    if (s->spatial_dims == 1 ? (x->ndim != 2 && x->ndim != 3) : x->ndim != 4) {
        nb__error(NB_ESHAPE, "%s: expected a %s input, got shape %s", name,
                  s->spatial_dims == 1 ? "2-D (N, C) or 3-D (N, C, L)" : "4-D (N, C, H, W)",
                  NB__SHAPE(x));
        return NULL;
    }
    if (x->shape[1] != s->features) {
        nb__error(NB_ESHAPE, "%s: expected %lld channels in dim 1, got shape %s", name,
                  (long long)s->features, NB__SHAPE(x));
        return NULL;
    }
    bool training = nb_module_is_training(m);
    /* As PyTorch: without running statistics the batch statistics are used in eval too. */
    nb_tensor *y = nb_batch_norm(x, nb_module_buffer_opt(m, "running_mean"),
                                 nb_module_buffer_opt(m, "running_var"),
                                 nb_module_param_opt(m, "weight"), nb_module_param_opt(m, "bias"),
                                 training || !s->track, s->momentum, s->eps);
    nb_tensor *nbt = nb_module_buffer_opt(m, "num_batches_tracked");
    if (y && training && nbt && count_batch(nbt) != NB_OK) return NULL;
    return y;
}

static const nb_module_vtable layernorm_vt = {.type_name = "LayerNorm",
                                              .forward = layernorm_forward, .free_self = free};
static const nb_module_vtable batchnorm1d_vt = {.type_name = "BatchNorm1d",
                                                .forward = batchnorm_forward, .free_self = free};
static const nb_module_vtable batchnorm2d_vt = {.type_name = "BatchNorm2d",
                                                .forward = batchnorm_forward, .free_self = free};

nb_module *nb_layer_norm_new(int64_t features, const nb_norm_opts *o) {
    return norm_module(&layernorm_vt, features, o, 0, "layernorm");
}
nb_module *nb_batch_norm1d_new(int64_t features, const nb_norm_opts *o) {
    return norm_module(&batchnorm1d_vt, features, o, 1, "batchnorm1d");
}
nb_module *nb_batch_norm2d_new(int64_t channels, const nb_norm_opts *o) {
    return norm_module(&batchnorm2d_vt, channels, o, 2, "batchnorm2d");
}
