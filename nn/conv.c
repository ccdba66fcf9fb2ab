/* nn/conv.c - 2-D convolution: the op nb_conv2d (PyTorch F.conv2d semantics, NCHW), its
 * backward rule nb__bw_CONV2D, and the Conv2d module (nb_conv2d_new).
 *
 * The op checks arguments and shapes, brings the operands to contiguous f32 (f16 is
 * computed in f32 and rounded once; bf16 too unless the device's kernels take bf16) or f64
 * on their device, and runs the conv2d /
 * conv2d_backward kernels (tensor/kernels/conv.h), which plan the work and take their own
 * scratch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/tape.h"
#include "nabla/nn.h"
#include "nabla/random.h"
#include "tensor/backend.h"
#include "tensor/autocast.h"

static void pair_or(const int64_t *v, int64_t def, int64_t out[2]) {
    out[0] = v ? v[0] : def;
    out[1] = v ? v[1] : def;
}

/* Fill g from the operands and the options; false (error set) on a user mistake. */
static bool conv_geometry(const nb_tensor *x, const nb_tensor *w, const nb_tensor *b,
                          const int64_t s[2], const int64_t p[2], const int64_t d[2],
                          int64_t groups, nb__conv2d_geom *g) {
    if (x->ndim != 4) {
        nb__error(NB_ESHAPE, "conv2d: input must be 4-D (N, C, H, W), got %s", NB__SHAPE(x));
        return false;
    }
    if (w->ndim != 4) {
        nb__error(NB_ESHAPE, "conv2d: weight must be 4-D (out_channels, in_channels/groups, "
                  "kh, kw), got %s", NB__SHAPE(w));
        return false;
    }
    if (!nb_dtype_is_float(x->dtype)) {
        nb__error(NB_EDTYPE, "conv2d: dtype %s is not supported (f32, f64, f16 or bf16 only)",
                  nb_dtype_name(x->dtype));
        return false;
    }
    if (w->dtype != x->dtype || (b && b->dtype != x->dtype)) {
        nb__error(NB_EDTYPE, "conv2d: input is %s but %s is %s (convert with nb_to_dtype)",
                  nb_dtype_name(x->dtype), w->dtype != x->dtype ? "weight" : "bias",
                  nb_dtype_name(w->dtype != x->dtype ? w->dtype : b->dtype));
        return false;
    }
    if (s[0] <= 0 || s[1] <= 0 || d[0] <= 0 || d[1] <= 0 || p[0] < 0 || p[1] < 0) {
        nb__error(NB_EINVAL, "conv2d: stride and dilation must be positive and padding "
                  "non-negative, got stride [%lld,%lld], padding [%lld,%lld], dilation "
                  "[%lld,%lld]", (long long)s[0], (long long)s[1], (long long)p[0],
                  (long long)p[1], (long long)d[0], (long long)d[1]);
        return false;
    }
    int64_t C = x->shape[1], O = w->shape[0];
    if (groups <= 0) {
        nb__error(NB_EINVAL, "conv2d: groups must be positive, got %lld", (long long)groups);
        return false;
    }
    if (C % groups != 0 || O % groups != 0) {
        nb__error(NB_EINVAL, "conv2d: groups=%lld must divide both in_channels (%lld) and "
                  "out_channels (%lld)", (long long)groups, (long long)C, (long long)O);
        return false;
    }
    if (w->shape[1] * groups != C) {
        nb__error(NB_ESHAPE, "conv2d: weight %s expects %lld input channels (%lld per group, "
                  "groups=%lld), but input %s has %lld", NB__SHAPE(w),
                  (long long)(w->shape[1] * groups), (long long)w->shape[1], (long long)groups,
                  NB__SHAPE(x), (long long)C);
        return false;
    }
    if (b && (b->ndim != 1 || b->shape[0] != O)) {
        nb__error(NB_ESHAPE, "conv2d: bias must be 1-D with out_channels = %lld elements, got "
                  "%s", (long long)O, NB__SHAPE(b));
        return false;
    }
    int64_t KH = w->shape[2], KW = w->shape[3], H = x->shape[2], W = x->shape[3];
    if (KH <= 0 || KW <= 0) {
        nb__error(NB_ESHAPE, "conv2d: weight %s has an empty kernel", NB__SHAPE(w));
        return false;
    }
    int64_t ekh = d[0] * (KH - 1) + 1, ekw = d[1] * (KW - 1) + 1;
    if (H + 2 * p[0] < ekh || W + 2 * p[1] < ekw) {
        nb__error(NB_ESHAPE, "conv2d: kernel %lldx%lld (%lldx%lld with dilation) is larger "
                  "than the padded input %lldx%lld (input %s, padding [%lld,%lld])",
                  (long long)KH, (long long)KW, (long long)ekh, (long long)ekw,
                  (long long)(H + 2 * p[0]), (long long)(W + 2 * p[1]), NB__SHAPE(x),
                  (long long)p[0], (long long)p[1]);
        return false;
    }
    *g = (nb__conv2d_geom){.N = x->shape[0], .C = C, .H = H, .W = W, .O = O, .KH = KH,
                           .KW = KW, .sh = s[0], .sw = s[1], .ph = p[0], .pw = p[1],
                           .dh = d[0], .dw = d[1], .groups = groups};
    g->OH = (H + 2 * p[0] - ekh) / s[0] + 1;
    g->OW = (W + 2 * p[1] - ekw) / s[1] + 1;
    return true;
}

/* The dtype the kernels compute in: f64, bf16 where the device's conv kernels take it (f32
 * sums, each result rounded once), else f32 (f16/bf16 results rounded once by the op). */
static nb_dtype compute_dtype(nb_dtype dt, nb_device dev) {
    if (dt == NB_F64) return NB_F64;
    return dt == NB_BF16 && nb__conv_takes_bf16(dev) ? NB_BF16 : NB_F32;
}

/* Contiguous copy (or the tensor itself) in the compute dtype; grad mode must be off. */
static nb_tensor *prepared(nb_tensor *t, nb_dtype cdt) {
    return t ? nb_contiguous(nb_to_dtype(t, cdt)) : NULL;
}

nb_tensor *nb_conv2d(nb_tensor *x, nb_tensor *w, nb_tensor *b, const int64_t stride[2],
                     const int64_t padding[2], const int64_t dilation[2], int64_t groups) {
    NB__CHECK_ARG(x, "conv2d", "x");
    NB__CHECK_ARG(w, "conv2d", "weight");
    x = nb__autocast(x, NB_AUTOCAST_LOW); /* nabla/autocast.h */
    if (w && !(w = nb__autocast(w, NB_AUTOCAST_LOW))) return NULL;
    if (b && !(b = nb__autocast(b, NB_AUTOCAST_LOW))) return NULL;
    if (!x) return NULL;
    nb_device dev;
    if (!nb__check_devices("conv2d", (nb_tensor *[]){x, w, b}, 3, &dev)) return NULL;
    int64_t s[2], p[2], d[2];
    pair_or(stride, 1, s);
    pair_or(padding, 0, p);
    pair_or(dilation, 1, d);
    nb__conv2d_geom g;
    if (!conv_geometry(x, w, b, s, p, d, groups, &g)) return NULL;

    nb_dtype dt = x->dtype, cdt = compute_dtype(dt, dev);
    nb_scope_begin();
    bool prev = nb_set_grad_enabled(false);
    nb_tensor *xc = prepared(x, cdt), *wc = prepared(w, cdt);
    nb_tensor *bc = prepared(b, cdt == NB_BF16 ? NB_F32 : cdt); /* a bf16 conv's bias is f32 */
    int64_t oshape[4] = {g.N, g.O, g.OH, g.OW};
    nb_tensor *out = xc && wc && (bc || !b) ? nb__empty(oshape, 4, cdt, dev) : NULL;
    if (out) {
        nb__conv2d_args a = {.g = g, .dtype = cdt, .x = nb__ptr(xc), .w = nb__ptr(wc),
                             .b = bc ? nb__ptr(bc) : NULL, .y = nb__ptr(out)};
        if (nb__run_conv2d(dev, "conv2d", &a) != NB_OK) out = NULL;
        else if (cdt != dt) out = nb_to_dtype(out, dt);
    }
    nb_set_grad_enabled(prev);
    nb__node *nd = nb__record(out, NB__OP_CONV2D, (nb_tensor *[]){x, w, b}, 3);
    if (nd) {
        /* dW needs x, dX needs w: save only what the backward will use. */
        if (nd->edges[1].node || nd->edges[1].leaf) nb__save(nd, 0, x);
        if (nd->edges[0].node || nd->edges[0].leaf) nb__save(nd, 1, w);
        int64_t a[7] = {s[0], s[1], p[0], p[1], d[0], d[1], groups};
        memcpy(nd->attrs.i, a, sizeof a);
        nd->attrs.ni = 7;
    }
    nb_keep(out);
    nb_scope_end();
    return out;
}

static bool wants(const nb__node *n, int i) {
    return i < n->ninputs && (n->edges[i].node || n->edges[i].leaf);
}

nb_status nb__bw_CONV2D(nb__node *n, nb_tensor *gout, nb_tensor **gin) {
    bool need_x = wants(n, 0), need_w = wants(n, 1), need_b = wants(n, 2);
    const nb__edge *ex = &n->edges[0], *ew = &n->edges[1];
    const int64_t *at = n->attrs.i;
    nb__conv2d_geom g = {.N = ex->shape[0], .C = ex->shape[1], .H = ex->shape[2],
                         .W = ex->shape[3], .O = ew->shape[0], .KH = ew->shape[2],
                         .KW = ew->shape[3], .OH = n->out_shape[2], .OW = n->out_shape[3],
                         .sh = at[0], .sw = at[1], .ph = at[2], .pw = at[3], .dh = at[4],
                         .dw = at[5], .groups = at[6]};
    nb_device dev;
    if (!nb__check_devices("conv2d backward", (nb_tensor *[]){gout, n->saved[0], n->saved[1]},
                           3, &dev))
        return nb_last_status();
    /* bf16 kernels write gx in bf16 and gw, gb in f32 (the engine rounds them to the edges'
     * dtype); f32 and f64 ones write all three in their dtype. */
    nb_dtype cdt = compute_dtype(ex->dtype, dev), wdt = cdt == NB_BF16 ? NB_F32 : cdt;
    nb_status st = NB_OK;
    nb_scope_begin();
    nb_tensor *gy = prepared(gout, cdt);
    nb_tensor *xc = need_w ? prepared(n->saved[0], cdt) : NULL;
    nb_tensor *wc = need_x ? prepared(n->saved[1], cdt) : NULL;
    nb_tensor *gx = need_x ? nb__empty(ex->shape, 4, cdt, dev) : NULL;
    nb_tensor *gw = need_w ? nb__empty(ew->shape, 4, wdt, dev) : NULL;
    nb_tensor *gb = need_b ? nb__empty(&g.O, 1, wdt, dev) : NULL;
    if (!gy || (need_w && (!xc || !gw)) || (need_x && (!wc || !gx)) || (need_b && !gb)) {
        st = nb_last_status() != NB_OK ? nb_last_status()
                                       : nb__error(NB_ESTATE, "conv2d backward: a tensor "
                                                   "saved for backward is missing");
        goto out;
    }
    nb__conv2d_backward_args a = {.g = g, .dtype = cdt, .x = xc ? nb__ptr(xc) : NULL,
                                  .w = wc ? nb__ptr(wc) : NULL, .gy = nb__ptr(gy),
                                  .gx = gx ? nb__ptr(gx) : NULL, .gw = gw ? nb__ptr(gw) : NULL,
                                  .gb = gb ? nb__ptr(gb) : NULL};
    st = nb__run_conv2d_backward(dev, "conv2d", &a);
    if (st == NB_OK) {
        gin[0] = nb_keep(gx);
        gin[1] = nb_keep(gw);
        gin[2] = nb_keep(gb);
    }
out:
    nb_scope_end();
    return st;
}

/* ---- the Conv2d module ----------------------------------------------------------------------- */
typedef struct conv2d_self {
    int64_t stride[2], padding[2], dilation[2], groups;
} conv2d_self;

static nb_tensor *conv2d_forward(nb_module *m, nb_tensor *x) {
    const conv2d_self *s = nb_module_self(m);
    return nb_conv2d(x, nb_module_param(m, "weight"), nb_module_param_opt(m, "bias"), s->stride,
                     s->padding, s->dilation, s->groups);
}

static const nb_module_vtable conv2d_vt = {
    .type_name = "Conv2d", .forward = conv2d_forward, .free_self = free};

nb_conv2d_opts nb_conv2d_defaults(void) {
    return (nb_conv2d_opts){
        ._init = NB__OPTS_MARK(nb_conv2d_opts), .stride = {1, 1}, .dilation = {1, 1}, .groups = 1};
}

nb_module *nb_conv2d_new(int64_t in_channels, int64_t out_channels, int64_t kh, int64_t kw,
                         const nb_conv2d_opts *o) {
    if (o && NB__OPTS_CHECK(o, nb_conv2d_opts, "conv2d", "nb_conv2d_defaults()",
                            "o.padding[0] = 1") != NB_OK)
        return NULL;
    nb_conv2d_opts opt = o ? *o : nb_conv2d_defaults();
    conv2d_self cfg;
    for (int i = 0; i < 2; i++) {
        cfg.stride[i] = opt.stride[i];
        cfg.padding[i] = opt.padding[i];
        cfg.dilation[i] = opt.dilation[i];
    }
    cfg.groups = opt.groups;
    if (in_channels <= 0 || out_channels <= 0 || kh <= 0 || kw <= 0) {
        nb__error(NB_EINVAL, "conv2d: in_channels, out_channels and the kernel size must be "
                  "positive, got %lld, %lld, %lldx%lld", (long long)in_channels,
                  (long long)out_channels, (long long)kh, (long long)kw);
        return NULL;
    }
    if (cfg.stride[0] <= 0 || cfg.stride[1] <= 0 || cfg.dilation[0] <= 0 ||
        cfg.dilation[1] <= 0 || cfg.padding[0] < 0 || cfg.padding[1] < 0) {
        nb__error(NB_EINVAL, "conv2d: stride and dilation must be positive and padding "
                  "non-negative, got stride [%lld,%lld], padding [%lld,%lld], dilation "
                  "[%lld,%lld] (nb_conv2d_defaults() gives 1, 0, 1)", (long long)cfg.stride[0],
                  (long long)cfg.stride[1], (long long)cfg.padding[0], (long long)cfg.padding[1],
                  (long long)cfg.dilation[0], (long long)cfg.dilation[1]);
        return NULL;
    }
    if (cfg.groups <= 0 || in_channels % cfg.groups || out_channels % cfg.groups) {
        nb__error(NB_EINVAL, "conv2d: groups=%lld must divide both in_channels (%lld) and "
                  "out_channels (%lld)", (long long)cfg.groups, (long long)in_channels,
                  (long long)out_channels);
        return NULL;
    }
    conv2d_self *self = malloc(sizeof *self);
    if (!self) {
        nb__error(NB_ENOMEM, "conv2d: out of memory");
        return NULL;
    }
    *self = cfg;
    nb_module *m = nb_module_new(&conv2d_vt, self);
    if (!m) {
        free(self);
        return NULL;
    }
    /* PyTorch's default: kaiming_uniform(a = sqrt(5)) for the weight, which is
     * U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same bound for the bias. */
    int64_t cg = in_channels / cfg.groups;
    double bound = 1.0 / sqrt((double)(cg * kh * kw));
    int64_t wshape[4] = {out_channels, cg, kh, kw};
    nb_scope_begin();
    bool ok = nb_module_add_parameter(m, "weight",
                                      nb_uniform(wshape, 4, NB_F32, -bound, bound, opt.gen)) &&
              (opt.no_bias ||
               nb_module_add_parameter(m, "bias", nb_uniform(&out_channels, 1, NB_F32, -bound,
                                                             bound, opt.gen)));
    nb_scope_end();
    if (!ok) {
        nb_module_free(m);
        return NULL;
    }
    return m;
}
