/* nn/pool.c - 2-D pooling: the ops nb_maxpool2d, nb_avgpool2d,
 * nb_adaptive_avgpool2d (PyTorch semantics, no ceil mode), their backward rules, and the
 * MaxPool2d, AvgPool2d and AdaptiveAvgPool2d modules. Inputs are (N, C, H, W) or (C, H, W);
 * the pool kernels (tensor/kernels/conv.h) see them as planes of H x W. Half dtypes are
 * computed in f32. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/tape.h"
#include "nabla/nn.h"
#include "tensor/backend.h"
#include "nn/nn_impl.h"

/* The input's planes and spatial size; false (error set) on a user mistake. */
static bool pool_input(const nb_tensor *x, const char *op, nb__pool2d_geom *g) {
    if (x->ndim != 3 && x->ndim != 4) {
        nb__error(NB_ESHAPE, "%s: input must be 4-D (N, C, H, W) or 3-D (C, H, W), got %s", op,
                  NB__SHAPE(x));
        return false;
    }
    if (!nb_dtype_is_float(x->dtype)) {
        nb__error(NB_EDTYPE, "%s: dtype %s is not supported (f32, f64, f16 or bf16 only)", op,
                  nb_dtype_name(x->dtype));
        return false;
    }
    int nd = x->ndim;
    g->H = x->shape[nd - 2];
    g->W = x->shape[nd - 1];
    g->planes = x->shape[nd - 3] * (nd == 4 ? x->shape[0] : 1);
    if (g->H <= 0 || g->W <= 0) {
        nb__error(NB_ESHAPE, "%s: input %s has an empty spatial dimension", op, NB__SHAPE(x));
        return false;
    }
    return true;
}

/* Kernel / stride / padding of a windowed pool into g, and the output size. */
static bool pool_window(const nb_tensor *x, const char *op, const int64_t kernel[2],
                        const int64_t stride[2], const int64_t padding[2], nb__pool2d_geom *g) {
    if (!kernel) {
        nb__error(NB_ENULL, "%s: kernel is NULL", op);
        return false;
    }
    int64_t k[2] = {kernel[0], kernel[1]}, s[2], p[2];
    for (int i = 0; i < 2; i++) {
        s[i] = stride ? stride[i] : k[i];
        p[i] = padding ? padding[i] : 0;
    }
    if (k[0] <= 0 || k[1] <= 0 || s[0] <= 0 || s[1] <= 0) {
        nb__error(NB_EINVAL, "%s: kernel size and stride must be positive, got kernel "
                  "[%lld,%lld], stride [%lld,%lld]", op, (long long)k[0], (long long)k[1],
                  (long long)s[0], (long long)s[1]);
        return false;
    }
    if (p[0] < 0 || p[1] < 0 || 2 * p[0] > k[0] || 2 * p[1] > k[1]) {
        nb__error(NB_EINVAL, "%s: padding [%lld,%lld] must be non-negative and at most half "
                  "the kernel size [%lld,%lld]", op, (long long)p[0], (long long)p[1],
                  (long long)k[0], (long long)k[1]);
        return false;
    }
    if (g->H + 2 * p[0] < k[0] || g->W + 2 * p[1] < k[1]) {
        nb__error(NB_ESHAPE, "%s: kernel [%lld,%lld] is larger than the padded input "
                  "%lldx%lld (input %s, padding [%lld,%lld])", op, (long long)k[0],
                  (long long)k[1], (long long)(g->H + 2 * p[0]), (long long)(g->W + 2 * p[1]),
                  NB__SHAPE(x), (long long)p[0], (long long)p[1]);
        return false;
    }
    g->kh = k[0], g->kw = k[1], g->sh = s[0], g->sw = s[1], g->ph = p[0], g->pw = p[1];
    g->OH = (g->H + 2 * p[0] - k[0]) / s[0] + 1;
    g->OW = (g->W + 2 * p[1] - k[1]) / s[1] + 1;
    return true;
}

static nb_dtype compute_dtype(nb_dtype dt) { return dt == NB_F64 ? NB_F64 : NB_F32; }

/* x's shape with the last two dims replaced by (oh, ow). */
static void out_shape(const nb_tensor *x, int64_t oh, int64_t ow, int64_t *shape) {
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    shape[x->ndim - 2] = oh;
    shape[x->ndim - 1] = ow;
}

/* The geometry a pool's backward sees: input shape from the edge, output from the node. */
static nb__pool2d_geom bw_geom(const nb__node *n) {
    const nb__edge *e = &n->edges[0];
    nb__pool2d_geom g = {0};
    g.H = e->shape[e->ndim - 2], g.W = e->shape[e->ndim - 1];
    g.planes = nb__numel_of(e->shape, e->ndim - 2);
    g.OH = n->out_shape[n->out_ndim - 2], g.OW = n->out_shape[n->out_ndim - 1];
    const int64_t *a = n->attrs.i;
    g.kh = a[0], g.kw = a[1], g.sh = a[2], g.sw = a[3], g.ph = a[4], g.pw = a[5];
    return g;
}

static void set_window_attrs(nb__node *nd, const nb__pool2d_geom *g) {
    int64_t a[6] = {g->kh, g->kw, g->sh, g->sw, g->ph, g->pw};
    memcpy(nd->attrs.i, a, sizeof a);
    nd->attrs.ni = 6;
}

typedef enum pool_kind { POOL_MAX, POOL_AVG, POOL_ADAPTIVE } pool_kind;
static const char *const pool_names[] = {"maxpool2d", "avgpool2d", "adaptive_avgpool2d"};

/* Forward of every pool: convert, run the kernel, convert back, record. */
static nb_tensor *pool_forward(nb_tensor *x, pool_kind kind, const nb__pool2d_geom *g,
                               bool cip, bool relu) {
    nb_dtype dt = x->dtype, cdt = compute_dtype(dt);
    int64_t oshape[4];
    out_shape(x, g->OH, g->OW, oshape);
    bool want_idx = kind == POOL_MAX && nb__needs_grad(&x, 1);
    nb_device dev = nb__device_of(x);
    nb_scope_begin();
    bool prev = nb_set_grad_enabled(false);
    nb_tensor *xc = nb_contiguous(nb_to_dtype(x, cdt));
    nb_tensor *out = xc ? nb__empty(oshape, x->ndim, cdt, dev) : NULL;
    nb_tensor *idx = out && want_idx ? nb__empty(oshape, x->ndim, NB_I32, dev) : NULL;
    if (out && (!want_idx || idx)) {
        nb__pool2d_args a = {.g = *g, .dtype = cdt, .count_include_pad = cip, .relu = relu,
                             .x = nb__ptr(xc),
                             .y = nb__ptr(out), .idx = idx ? (int32_t *)nb__ptr(idx) : NULL};
        nb_status st = kind == POOL_MAX   ? nb__run_maxpool2d(dev, pool_names[kind], &a)
                       : kind == POOL_AVG ? nb__run_avgpool2d(dev, pool_names[kind], &a)
                                          : nb__run_adaptive_avgpool2d(dev, pool_names[kind], &a);
        if (st != NB_OK) out = NULL;
        else if (cdt != dt) out = nb_to_dtype(out, dt);
    } else {
        out = NULL;
    }
    nb_set_grad_enabled(prev);
    static const nb__op ops[] = {NB__OP_MAXPOOL2D, NB__OP_AVGPOOL2D,
                                 NB__OP_ADAPTIVE_AVGPOOL2D};
    nb__node *nd = nb__record(out, ops[kind], &x, 1);
    if (nd) {
        set_window_attrs(nd, g);
        nd->attrs.flag = cip;
        if (kind == POOL_MAX) nb__save(nd, 0, idx);
    }
    nb_keep(out);
    nb_scope_end();
    return out;
}

nb_tensor *nb_maxpool2d(nb_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                        const int64_t padding[2]) {
    NB__CHECK_ARG(x, "maxpool2d", "x");
    nb__pool2d_geom g;
    if (!pool_input(x, "maxpool2d", &g) || !pool_window(x, "maxpool2d", kernel, stride,
                                                        padding, &g))
        return NULL;
    if (g.H * g.W > INT32_MAX) {
        nb__error(NB_EUNSUPPORTED, "maxpool2d: planes of more than 2^31 elements (input %s) are "
                  "not supported", NB__SHAPE(x));
        return NULL;
    }
    return pool_forward(x, POOL_MAX, &g, false, false);
}

nb_tensor *nb_relu_maxpool2d(nb_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                             const int64_t padding[2]) {
    NB__CHECK_ARG(x, "relu_maxpool2d", "x");
    nb__pool2d_geom g;
    if (!pool_input(x, "relu_maxpool2d", &g) ||
        !pool_window(x, "relu_maxpool2d", kernel, stride, padding, &g))
        return NULL;
    /* The fused kernel where the backend has one (the CPU's); elsewhere the two ops, which
     * are its definition. */
    if (!nb__pool_takes_relu(nb__device_of(x)) || g.H * g.W > INT32_MAX) {
        nb_scope_begin();
        nb_tensor *y = nb_keep(nb_maxpool2d(nb_relu(x), kernel, stride, padding));
        nb_scope_end();
        return y;
    }
    return pool_forward(x, POOL_MAX, &g, false, true);
}

nb_tensor *nb_avgpool2d(nb_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                        const int64_t padding[2], bool count_include_pad) {
    NB__CHECK_ARG(x, "avgpool2d", "x");
    nb__pool2d_geom g;
    if (!pool_input(x, "avgpool2d", &g) || !pool_window(x, "avgpool2d", kernel, stride,
                                                        padding, &g))
        return NULL;
    return pool_forward(x, POOL_AVG, &g, count_include_pad, false);
}

nb_tensor *nb_adaptive_avgpool2d(nb_tensor *x, int64_t out_h, int64_t out_w) {
    NB__CHECK_ARG(x, "adaptive_avgpool2d", "x");
    nb__pool2d_geom g;
    if (!pool_input(x, "adaptive_avgpool2d", &g)) return NULL;
    if (out_h <= 0 || out_w <= 0) {
        nb__error(NB_EINVAL, "adaptive_avgpool2d: output size must be positive, got %lldx%lld",
                  (long long)out_h, (long long)out_w);
        return NULL;
    }
    g.OH = out_h, g.OW = out_w;
    g.kh = g.kw = g.sh = g.sw = 1, g.ph = g.pw = 0;
    return pool_forward(x, POOL_ADAPTIVE, &g, false, false);
}

/* Backward of every pool: gx in the compute dtype (the engine converts it). */
static nb_status pool_backward(nb__node *n, nb_tensor *gout, nb_tensor **gin, pool_kind kind) {
    const nb__edge *e = &n->edges[0];
    nb_dtype cdt = compute_dtype(e->dtype);
    nb__pool2d_geom g = bw_geom(n);
    if (kind == POOL_MAX && !n->saved[0])
        return nb__error(NB_ESTATE, "maxpool2d backward: the saved indices are missing");
    nb_device dev;
    if (!nb__check_devices(pool_names[kind], (nb_tensor *[]){gout, n->saved[0]}, 2, &dev))
        return nb_last_status();
    nb_status st = NB_OK;
    nb_scope_begin();
    nb_tensor *gy = nb_contiguous(nb_to_dtype(gout, cdt));
    nb_tensor *gx = gy ? nb__empty(e->shape, e->ndim, cdt, dev) : NULL;
    if (!gx) {
        st = nb_last_status();
    } else {
        nb__pool2d_backward_args a = {.g = g, .dtype = cdt, .count_include_pad = n->attrs.flag,
                                      .gy = nb__ptr(gy), .gx = nb__ptr(gx)};
        if (kind == POOL_MAX) {
            a.idx = (const int32_t *)nb__ptr(n->saved[0]);
            st = nb__run_maxpool2d_backward(dev, pool_names[kind], &a);
        } else if (kind == POOL_AVG) {
            st = nb__run_avgpool2d_backward(dev, pool_names[kind], &a);
        } else {
            st = nb__run_adaptive_avgpool2d_backward(dev, pool_names[kind], &a);
        }
    }
    if (st == NB_OK) gin[0] = nb_keep(gx);
    nb_scope_end();
    return st;
}

nb_status nb__bw_MAXPOOL2D(nb__node *n, nb_tensor *gout, nb_tensor **gin) {
    return pool_backward(n, gout, gin, POOL_MAX);
}
nb_status nb__bw_AVGPOOL2D(nb__node *n, nb_tensor *gout, nb_tensor **gin) {
    return pool_backward(n, gout, gin, POOL_AVG);
}
nb_status nb__bw_ADAPTIVE_AVGPOOL2D(nb__node *n, nb_tensor *gout, nb_tensor **gin) {
    return pool_backward(n, gout, gin, POOL_ADAPTIVE);
}

/* ---- modules ----------------------------------------------------------------------------- */
typedef struct pool_self {
    int64_t kernel[2], stride[2], padding[2];
    bool count_include_pad, relu;
} pool_self;

static nb_tensor *maxpool_forward(nb_module *m, nb_tensor *x) {
    const pool_self *s = nb_module_self(m);
    if (s->relu) return nb_relu_maxpool2d(x, s->kernel, s->stride, s->padding);
    return nb_maxpool2d(x, s->kernel, s->stride, s->padding);
}
static nb_tensor *avgpool_forward(nb_module *m, nb_tensor *x) {
    const pool_self *s = nb_module_self(m);
    return nb_avgpool2d(x, s->kernel, s->stride, s->padding, s->count_include_pad);
}
static nb_tensor *adaptive_forward(nb_module *m, nb_tensor *x) {
    const pool_self *s = nb_module_self(m);
    return nb_adaptive_avgpool2d(x, s->kernel[0], s->kernel[1]);
}

static const nb_module_vtable maxpool_vt = {
    .type_name = "MaxPool2d", .forward = maxpool_forward, .free_self = free};
static const nb_module_vtable avgpool_vt = {
    .type_name = "AvgPool2d", .forward = avgpool_forward, .free_self = free};
static const nb_module_vtable adaptive_vt = {
    .type_name = "AdaptiveAvgPool2d", .forward = adaptive_forward, .free_self = free};

nb_pool2d_opts nb_pool2d_defaults(int64_t kh, int64_t kw) {
    return (nb_pool2d_opts){._init = NB__OPTS_MARK(nb_pool2d_opts), .stride = {kh, kw}};
}

static nb_module *pool_module(const nb_module_vtable *vt, const char *op, int64_t kh, int64_t kw,
                              const nb_pool2d_opts *o, bool window) {
    if (o && NB__OPTS_CHECK(o, nb_pool2d_opts, op, "nb_pool2d_defaults(kh, kw)",
                            "o.padding[0] = 1") != NB_OK)
        return NULL;
    nb_pool2d_opts opt = o ? *o : nb_pool2d_defaults(kh, kw);
    pool_self cfg = {.kernel = {kh, kw}, .count_include_pad = !opt.exclude_pad,
                     .relu = opt.relu};
    if (opt.relu && vt != &maxpool_vt) {
        nb__error(NB_EINVAL, "%s: the relu option applies to max pooling only", op);
        return NULL;
    }
    for (int i = 0; i < 2; i++) {
        cfg.stride[i] = opt.stride[i];
        cfg.padding[i] = opt.padding[i];
    }
    if (kh <= 0 || kw <= 0) {
        nb__error(NB_EINVAL, "%s: %s must be positive, got %lldx%lld", op,
                  window ? "kernel size" : "output size", (long long)kh, (long long)kw);
        return NULL;
    }
    if (window && (cfg.stride[0] <= 0 || cfg.stride[1] <= 0 || cfg.padding[0] < 0 ||
                   cfg.padding[1] < 0 || 2 * cfg.padding[0] > kh || 2 * cfg.padding[1] > kw)) {
        nb__error(NB_EINVAL, "%s: stride [%lld,%lld] must be positive (nb_pool2d_defaults(kh, "
                  "kw) gives the kernel size) and padding [%lld,%lld] between 0 and half the "
                  "kernel size [%lld,%lld]", op, (long long)cfg.stride[0],
                  (long long)cfg.stride[1], (long long)cfg.padding[0],
                  (long long)cfg.padding[1], (long long)kh, (long long)kw);
        return NULL;
    }
    pool_self *self = malloc(sizeof *self);
    if (!self) {
        nb__error(NB_ENOMEM, "%s: out of memory", op);
        return NULL;
    }
    *self = cfg;
    nb_module *m = nb_module_new(vt, self);
    if (!m) free(self);
    return m;
}

bool nb__maxpool_module(const nb_module *m) { return nb__module_vtable(m) == &maxpool_vt; }

nb_tensor *nb__maxpool_module_relu_forward(const nb_module *m, nb_tensor *x) {
    const pool_self *s = nb_module_self((nb_module *)(uintptr_t)m);
    return nb_relu_maxpool2d(x, s->kernel, s->stride, s->padding);
}

nb_module *nb_maxpool2d_new(int64_t kh, int64_t kw, const nb_pool2d_opts *o) {
    return pool_module(&maxpool_vt, "maxpool2d", kh, kw, o, true);
}
nb_module *nb_avgpool2d_new(int64_t kh, int64_t kw, const nb_pool2d_opts *o) {
    return pool_module(&avgpool_vt, "avgpool2d", kh, kw, o, true);
}
nb_module *nb_adaptive_avgpool2d_new(int64_t out_h, int64_t out_w) {
    return pool_module(&adaptive_vt, "adaptive_avgpool2d", out_h, out_w, NULL, false);
}
