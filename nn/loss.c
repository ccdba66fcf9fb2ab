/* nn/loss.c - the losses: cross entropy (fused log-softmax + NLL), NLL, mean squared
 * error, L1 and binary cross entropy with logits. Argument checks, output shapes and
 * dtypes, and the backward rules live here; the arithmetic is in the loss kernels
 * (tensor/kernels/loss.h; cpu/loss.c on the CPU).
 *
 * Semantics follow torch.nn.functional:
 *   - reduction: mean (the default, zero), sum, or none (one loss per position/element).
 *     A mean over nothing is NaN (an empty batch, or every target ignored), as in PyTorch.
 *   - cross_entropy / nll_loss: scores (N, C) or (N, C, d1, ...) (the class dim is dim 1),
 *     or (C) with a 0-dim target; class-index targets of dtype i32/i64 shaped like the
 *     scores without the class dim. With has_ignore_index, positions whose target equals
 *     ignore_index contribute nothing and the mean divides by the number of the others.
 *     Any other target outside [0, C) is an NB_EINDEX error, found before anything is
 *     computed. label_smoothing s in [0, 1] mixes the one-hot target with the uniform
 *     distribution: loss = (1 - s) * nll + s * mean over classes of -log_softmax
 *     (cross_entropy only).
 *   - mse_loss / l1_loss: pred and target of the same shape (PyTorch only warns when they
 *     differ and broadcasts, which is nearly always a bug; here it is an error). Composed
 *     of differentiable ops, so they need no rule of their own; abs'(0) = 0.
 *   - bce_with_logits: logits and target of the same shape, pos_weight (may be NULL)
 *     broadcast against them (typically shape (C) over the last dim):
 *     loss = (1 - y) x + (1 + (pw - 1) y) log(1 + exp(-x)), computed without overflow.
 *     Gradients flow to logits, target and pos_weight.
 * Outputs have the scores' dtype (bce: the promoted float dtype of its operands); f16 and
 * bf16 are computed in f32, and every sum is accumulated in f64.
 *
 * Everything that depends on the data runs in the kernels (tensor/kernels/loss.h): target
 * validation, the count of targets not ignored (kept in a small device tensor for the
 * backward of a mean), the reduction. So the ops work on any device, and on meta they only
 * infer shapes and record. */
#include <math.h>
#include <string.h>

#include "tensor/place.h"
#include "tensor/tape.h"
#include "nabla/nn.h"
#include "tensor/backend.h"
#include "tensor/autocast.h"

static bool float_ok(const nb_tensor *t, const char *op, const char *name) {
    if (nb_dtype_is_float(t->dtype)) return true;
    nb__error(NB_EDTYPE, "%s: %s must have a floating point dtype, got %s", op, name,
              nb_dtype_name(t->dtype));
    return false;
}

static bool reduction_ok(nb_reduction r, const char *op) {
    if (r == NB_REDUCTION_MEAN || r == NB_REDUCTION_SUM || r == NB_REDUCTION_NONE) return true;
    nb__error(NB_EINVAL, "%s: unknown reduction %d (use NB_REDUCTION_MEAN, _SUM or _NONE)", op,
              (int)r);
    return false;
}

/* The kernels' name for a (checked) reduction. */
static nb__loss_reduce loss_reduce(nb_reduction r) {
    return r == NB_REDUCTION_SUM ? NB__LOSS_SUM : r == NB_REDUCTION_NONE ? NB__LOSS_NONE
                                                                         : NB__LOSS_MEAN;
}

/* ---- class-index losses (cross entropy, NLL) --------------------------------------------- */
/* Fill the kernel operands from contiguous scores xc and targets tc. */
static void cls_operands(nb__cls_operands *a, const nb_tensor *xc, const nb_tensor *tc,
                         bool has_ig, int64_t ig, double smoothing) {
    memset(a, 0, sizeof *a);
    a->x = nb__ptr(xc);
    a->xdt = xc->dtype;
    if (xc->ndim == 1) {
        a->N = 1, a->C = xc->shape[0], a->D = 1;
    } else {
        a->N = xc->shape[0], a->C = xc->shape[1], a->D = 1;
        for (int d = 2; d < xc->ndim; d++) a->D *= xc->shape[d];
    }
    a->target = nb__ptr(tc);
    a->tdt = tc->dtype;
    a->has_ignore = has_ig;
    a->ignore_index = ig;
    a->smoothing = smoothing;
}

/* Argument checks shared by cross_entropy and nll_loss. */
static bool cls_check(nb_tensor *x, nb_tensor *t, const nb_cross_entropy_opts *o,
                      const char *op, bool ce, nb_device *dev) {
    if (!nb__check_devices(op, (nb_tensor *[]){x, t}, 2, dev)) return false;
    if (!nb_dtype_is_float(x->dtype)) {
        nb__error(NB_EDTYPE, "%s: input must have a floating point dtype, got %s", op,
                  nb_dtype_name(x->dtype));
        return false;
    }
    if (t->dtype != NB_I32 && t->dtype != NB_I64) {
        nb__error(NB_EDTYPE, "%s: target must hold class indices of dtype i32 or i64, got %s",
                  op, nb_dtype_name(t->dtype));
        return false;
    }
    if (x->ndim == 0) {
        nb__error(NB_ESHAPE, "%s: input must have a class dim: (N, C), (N, C, d1, ...) or "
                  "(C), got a 0-dim tensor", op);
        return false;
    }
    /* Expected target shape: the input's shape without the class dim (dim 1; dim 0 of a
     * 1-D input). */
    int64_t want[NB_MAX_DIMS];
    int wn = 0;
    for (int d = 0; d < x->ndim; d++)
        if (d != (x->ndim == 1 ? 0 : 1)) want[wn++] = x->shape[d];
    if (t->ndim != wn || memcmp(t->shape, want, sizeof(int64_t) * (size_t)wn) != 0) {
        nb__error(NB_ESHAPE, "%s: target shape %s does not match input shape %s (expected "
                  "target shape %s)", op, NB__SHAPE(t), NB__SHAPE(x),
                  nb__shape_str(want, wn, (char[NB__SHAPE_STR]){0}));
        return false;
    }
    if (!reduction_ok(o->reduction, op)) return false;
    double s = o->label_smoothing;
    if (!ce && s != 0) {
        nb__error(NB_EINVAL, "%s: label_smoothing is not supported (use cross_entropy)", op);
        return false;
    }
    if (!(s >= 0 && s <= 1)) {
        nb__error(NB_EINVAL, "%s: label_smoothing must be in [0, 1], got %g", op, s);
        return false;
    }
    return true;
}

nb_cross_entropy_opts nb_cross_entropy_defaults(void) {
    return (nb_cross_entropy_opts){._init = NB__OPTS_MARK(nb_cross_entropy_opts),
                                   .reduction = NB_REDUCTION_MEAN,
                                   .ignore_index = -100};
}

static nb_tensor *class_loss(nb_tensor *x, nb_tensor *t, const nb_cross_entropy_opts *opts,
                             bool ce) {
    const char *op = ce ? "cross_entropy" : "nll_loss";
    NB__CHECK_ARG(x, op, "input");
    NB__CHECK_ARG(t, op, "target");
    if (!(x = nb__autocast(x, NB_AUTOCAST_F32))) return NULL; /* nabla/autocast.h */
    if (opts && NB__OPTS_CHECK(opts, nb_cross_entropy_opts, op, "nb_cross_entropy_defaults()",
                               "o.reduction = NB_REDUCTION_SUM") != NB_OK)
        return NULL;
    nb_cross_entropy_opts o = opts ? *opts : nb_cross_entropy_defaults();
    nb_device dev;
    if (!cls_check(x, t, &o, op, ce, &dev)) return NULL;

    nb_scope_begin();
    nb_tensor *out = NULL;
    bool prev = nb_set_grad_enabled(false); /* internal copies must not record */
    nb_tensor *xc = nb_contiguous(x), *tc = nb_contiguous(t);
    nb_set_grad_enabled(prev);
    if (!xc || !tc) goto done;
    nb__cls_loss_args a = {.op = op, .reduction = loss_reduce(o.reduction)};
    cls_operands(&a.in, xc, tc, o.has_ignore_index, o.ignore_index, o.label_smoothing);
    int64_t P = a.in.N * a.in.D;
    /* The loss (per position, or one value), the log-sum-exps the cross entropy's backward
     * reads, and (when a backward may run) the count of targets not ignored that a mean's
     * backward divides by. */
    int64_t none[1] = {0}; /* the shape of a 0-dim result */
    nb_tensor *res = a.reduction == NB__LOSS_NONE ? nb__empty(tc->shape, tc->ndim, x->dtype, dev)
                                                  : nb__empty(none, 0, x->dtype, dev);
    nb_tensor *lse = ce ? nb__empty((int64_t[1]){P}, 1, x->dtype == NB_F64 ? NB_F64 : NB_F32,
                                    dev)
                        : NULL;
    bool want_count = a.reduction == NB__LOSS_MEAN && nb__needs_grad((nb_tensor *[]){x, t}, 2);
    nb_tensor *count = want_count ? nb__empty(none, 0, NB_I64, dev) : NULL;
    if (!res || (ce && !lse) || (want_count && !count)) goto done;
    a.out = nb__ptr(res);
    a.lse = lse ? nb__ptr(lse) : NULL;
    a.count = count ? (int64_t *)nb__ptr(count) : NULL;
    if ((ce ? nb__run_cross_entropy(dev, op, &a) : nb__run_nll_loss(dev, op, &a)) != NB_OK)
        goto done;
    out = res;
    nb__node *nd = nb__record(out, ce ? NB__OP_CROSS_ENTROPY : NB__OP_NLL_LOSS,
                              (nb_tensor *[]){x, t}, 2);
    if (nd) {
        nb__save(nd, 0, xc);
        nb__save(nd, 1, tc);
        nb__save(nd, 2, lse);
        nb__save(nd, 3, count);
        nd->attrs.f[0] = o.label_smoothing;
        nd->attrs.i[0] = o.reduction;
        nd->attrs.i[1] = o.ignore_index;
        nd->attrs.ni = 2;
        nd->attrs.flag = o.has_ignore_index;
    }
done:
    nb_keep(out);
    nb_scope_end();
    return out;
}

nb_tensor *nb_cross_entropy(nb_tensor *logits, nb_tensor *target,
                            const nb_cross_entropy_opts *o) {
    /* logits split over the vocabulary (a column-parallel layer's output, tensor/place.h):
     * the parallel form, which never forms the whole rows */
    if (logits && nb__live(logits) && logits->place && logits->place->activation &&
        logits->place->cross_entropy)
        return logits->place->cross_entropy(logits, target, o, logits->place);
    return class_loss(logits, target, o, true);
}

nb_tensor *nb_nll_loss(nb_tensor *log_probs, nb_tensor *target,
                       const nb_cross_entropy_opts *o) {
    return class_loss(log_probs, target, o, false);
}

static nb_status cls_backward(nb__node *n, nb_tensor *gout, nb_tensor **gin, bool ce) {
    gin[1] = NULL; /* class indices have no gradient */
    if (!n->edges[0].node && !n->edges[0].leaf) return NB_OK;
    const char *op = ce ? "cross_entropy" : "nll_loss";
    nb_tensor *xc = n->saved[0], *tc = n->saved[1], *lse = n->saved[2], *count = n->saved[3];
    nb__loss_reduce r = loss_reduce((nb_reduction)n->attrs.i[0]);
    if (!xc || !tc || (ce && !lse) || (r == NB__LOSS_MEAN && !count))
        return nb__error(NB_ESTATE, "%s backward: a tensor saved for backward is missing", op);
    nb_device dev;
    if (!nb__check_devices(op, (nb_tensor *[]){gout, xc}, 2, &dev)) return nb_last_status();
    nb__cls_loss_backward_args a = {.reduction = r};
    cls_operands(&a.in, xc, tc, n->attrs.flag, n->attrs.i[1], n->attrs.f[0]);
    /* The upstream gradient as contiguous f64: one per position (NONE) or the one value. */
    nb_tensor *g = nb_contiguous(nb_to_dtype(gout, NB_F64));
    nb_tensor *dx = g ? nb__empty(xc->shape, xc->ndim, xc->dtype, dev) : NULL;
    if (!dx) return nb_last_status();
    a.lse = lse ? nb__ptr(lse) : NULL;
    a.count = count ? (const int64_t *)nb__ptr(count) : NULL;
    a.g = (const double *)nb__ptr(g);
    a.dx = nb__ptr(dx);
    nb_status st = ce ? nb__run_cross_entropy_backward(dev, op, &a)
                      : nb__run_nll_loss_backward(dev, op, &a);
    if (st != NB_OK) return st;
    gin[0] = dx;
    return NB_OK;
}

nb_status nb__bw_CROSS_ENTROPY(nb__node *n, nb_tensor *gout, nb_tensor **gin) {
    return cls_backward(n, gout, gin, true);
}

nb_status nb__bw_NLL_LOSS(nb__node *n, nb_tensor *gout, nb_tensor **gin) {
    return cls_backward(n, gout, gin, false);
}

/* ---- mean squared error and L1 --------------------------------------------------------------- */
static nb_tensor *pointwise_loss(nb_tensor *pred, nb_tensor *target, nb_reduction r,
                                 bool l1) {
    const char *op = l1 ? "l1_loss" : "mse_loss";
    NB__CHECK_ARG(pred, op, "pred");
    NB__CHECK_ARG(target, op, "target");
    pred = nb__autocast(pred, NB_AUTOCAST_F32); /* nabla/autocast.h */
    target = nb__autocast(target, NB_AUTOCAST_F32);
    if (!pred || !target) return NULL;
    if (!nb__check_devices(op, (nb_tensor *[]){pred, target}, 2, NULL) ||
        !float_ok(pred, op, "pred") ||
        !float_ok(target, op, "target") || !reduction_ok(r, op))
        return NULL;
    if (pred->ndim != target->ndim ||
        memcmp(pred->shape, target->shape, sizeof(int64_t) * (size_t)pred->ndim) != 0) {
        nb__error(NB_ESHAPE, "%s: pred shape %s and target shape %s differ (the loss does not "
                  "broadcast: reshape or expand explicitly)", op, NB__SHAPE(pred),
                  NB__SHAPE(target));
        return NULL;
    }
    /* Composed of differentiable ops (each records its own node). */
    nb_scope_begin();
    nb_tensor *d = nb_sub(pred, target);
    nb_tensor *e = l1 ? nb_abs(d) : nb_mul(d, d);
    nb_tensor *out = r == NB_REDUCTION_NONE ? e
                     : r == NB_REDUCTION_SUM ? nb_sum(e, NULL, 0, false)
                                             : nb_mean(e, NULL, 0, false);
    nb_keep(out);
    nb_scope_end();
    return out;
}

nb_tensor *nb_mse_loss(nb_tensor *pred, nb_tensor *target, nb_reduction r) {
    return pointwise_loss(pred, target, r, false);
}

nb_tensor *nb_l1_loss(nb_tensor *pred, nb_tensor *target, nb_reduction r) {
    return pointwise_loss(pred, target, r, true);
}

/* ---- binary cross entropy with logits ---------------------------------------------------- */
/* pw as the kernel reads it (pw[i % period]) for an output of shape x: a contiguous copy
 * of pw when it varies only along the last dim (or not at all), else pw expanded to x's
 * shape. Returns NULL (error set) on failure. */
static nb_tensor *pw_operand(nb_tensor *pw, const nb_tensor *x, nb_dtype ct, int64_t *period) {
    int nd = x->ndim;
    int64_t last = nd ? x->shape[nd - 1] : 1, pn = nb_numel(pw);
    bool last_only = pn == 1;
    if (!last_only && pn == last) {
        last_only = true; /* every dim of pw but its last is 1 */
        for (int d = 0; d < pw->ndim - 1; d++)
            if (pw->shape[d] != 1) last_only = false;
    }
    nb_tensor *p = nb_to_dtype(pw, ct);
    if (!last_only) p = nb_expand(p, x->shape, nd);
    *period = last_only ? (pn ? pn : 1) : (nb_numel(x) ? nb_numel(x) : 1);
    return nb_contiguous(p);
}

nb_tensor *nb_bce_with_logits(nb_tensor *logits, nb_tensor *target, nb_tensor *pos_weight,
                              nb_reduction r) {
    const char *op = "bce_with_logits";
    NB__CHECK_ARG(logits, op, "logits");
    NB__CHECK_ARG(target, op, "target");
    logits = nb__autocast(logits, NB_AUTOCAST_F32); /* nabla/autocast.h */
    target = nb__autocast(target, NB_AUTOCAST_F32);
    if (pos_weight && !(pos_weight = nb__autocast(pos_weight, NB_AUTOCAST_F32))) return NULL;
    if (!logits || !target) return NULL;
    nb_device dev;
    if (!nb__check_devices(op, (nb_tensor *[]){logits, target, pos_weight}, 3, &dev))
        return NULL;
    if (!float_ok(logits, op, "logits") || !float_ok(target, op, "target") ||
        (pos_weight && !float_ok(pos_weight, op, "pos_weight")) || !reduction_ok(r, op))
        return NULL;
    const nb_tensor *x = logits;
    if (target->ndim != x->ndim ||
        memcmp(target->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim) != 0) {
        nb__error(NB_ESHAPE, "%s: target shape %s must equal logits shape %s", op,
                  NB__SHAPE(target), NB__SHAPE(logits));
        return NULL;
    }
    if (pos_weight) {
        int64_t bs[NB_MAX_DIMS];
        int bn;
        if (!nb__broadcast_shapes(x->shape, x->ndim, pos_weight->shape, pos_weight->ndim, bs,
                                  &bn, op))
            return NULL;
        if (bn != x->ndim || memcmp(bs, x->shape, sizeof(int64_t) * (size_t)bn) != 0) {
            nb__error(NB_ESHAPE, "%s: pos_weight of shape %s does not broadcast to the logits "
                      "shape %s", op, NB__SHAPE(pos_weight), NB__SHAPE(logits));
            return NULL;
        }
    }
    nb_dtype odt = nb_dtype_promote(logits->dtype, target->dtype);
    if (pos_weight) odt = nb_dtype_promote(odt, pos_weight->dtype);
    nb_dtype ct = odt == NB_F64 ? NB_F64 : NB_F32;

    nb_scope_begin();
    nb_tensor *out = NULL;
    bool prev = nb_set_grad_enabled(false); /* internal conversions must not record */
    nb_tensor *xc = nb_contiguous(nb_to_dtype(logits, ct));
    nb_tensor *yc = nb_contiguous(nb_to_dtype(target, ct));
    int64_t period = 1;
    nb_tensor *pwc = pos_weight ? pw_operand(pos_weight, logits, ct, &period) : NULL;
    nb_set_grad_enabled(prev);
    if (!xc || !yc || (pos_weight && !pwc)) goto done;
    nb__bce_args a = {.in = {nb__ptr(xc), nb__ptr(yc), pwc ? nb__ptr(pwc) : NULL, ct,
                             nb_numel(logits), period},
                      .reduction = loss_reduce(r)};
    /* reduction none: per-element losses in the compute dtype, converted after; else the
     * kernel writes the reduced value in the output dtype. */
    nb_tensor *res = r == NB_REDUCTION_NONE ? nb__empty(x->shape, x->ndim, ct, dev)
                                            : nb__empty((int64_t[1]){0}, 0, odt, dev);
    if (!res) goto done;
    a.out = nb__ptr(res);
    a.out_dt = r == NB_REDUCTION_NONE ? ct : odt;
    if (nb__run_bce_with_logits(dev, op, &a) != NB_OK) goto done;
    if (nb_tensor_dtype(res) == odt) {
        out = res;
    } else {
        prev = nb_set_grad_enabled(false);
        out = nb_to_dtype(res, odt);
        nb_set_grad_enabled(prev);
    }
    nb__node *nd = nb__record(out, NB__OP_BCE_WITH_LOGITS,
                              (nb_tensor *[]){logits, target, pos_weight}, 3);
    if (nd) {
        nb__save(nd, 0, xc);
        nb__save(nd, 1, yc);
        nb__save(nd, 2, pwc);
        nd->attrs.i[0] = r;
        nd->attrs.i[1] = period;
        nd->attrs.ni = 2;
    }
done:
    nb_keep(out);
    nb_scope_end();
    return out;
}

nb_status nb__bw_BCE_WITH_LOGITS(nb__node *n, nb_tensor *gout, nb_tensor **gin) {
    const char *op = "bce_with_logits";
    nb_tensor *xc = n->saved[0], *yc = n->saved[1], *pwc = n->saved[2];
    if (!xc || !yc)
        return nb__error(NB_ESTATE, "%s backward: a tensor saved for backward is missing", op);
    nb_device dev;
    if (!nb__check_devices(op, (nb_tensor *[]){gout, xc}, 2, &dev)) return nb_last_status();
    nb_dtype ct = xc->dtype;
    nb_reduction r = (nb_reduction)n->attrs.i[0];
    int64_t count = nb_numel(xc);
    nb__bce_backward_args a = {
        .in = {nb__ptr(xc), nb__ptr(yc), pwc ? nb__ptr(pwc) : NULL, ct, count, n->attrs.i[1]},
        .gstride = r == NB_REDUCTION_NONE ? 1 : 0,
        .factor = r == NB_REDUCTION_MEAN ? 1.0 / (double)(count ? count : 1) : 1.0};
    nb_tensor *g = nb_contiguous(nb_to_dtype(gout, ct));
    if (!g) return nb_last_status();
    a.g = nb__ptr(g);
    /* Each gradient has the logits' shape; the engine sums dpw to pos_weight's shape. */
    nb_tensor *d[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) {
        if (!n->edges[i].node && !n->edges[i].leaf) continue;
        d[i] = nb__empty(xc->shape, xc->ndim, ct, dev);
        if (!d[i]) return nb_last_status();
    }
    a.dx = d[0] ? nb__ptr(d[0]) : NULL;
    a.dy = d[1] ? nb__ptr(d[1]) : NULL;
    a.dpw = d[2] ? nb__ptr(d[2]) : NULL;
    nb_status st = nb__run_bce_with_logits_backward(dev, op, &a);
    if (st != NB_OK) return st;
    for (int i = 0; i < 3; i++) gin[i] = d[i];
    return NB_OK;
}
