/* rms_norm.c - RMSNorm: the functional op nb_rms_norm (fused forward and backward kernels
 * behind the kernel table's rms_norm and rms_norm_backward, tensor/kernels/lm.h; one autograd
 * node, NB__OP_RMS_NORM) and the RMSNorm module with Hugging Face's parameter name (weight).
 *
 * y = (x * rstd) * w over the last dim, rstd = 1 / sqrt(mean(x^2) + eps), as Llama's
 * LlamaRMSNorm computes it. The op keeps the per-row rstd in an f64 tensor on the input's
 * device that the backward reuses, so the backward never recomputes it. f16/bf16 inputs are
 * computed in f32 and rounded once; under autocast the op runs in f32 (as layer norm). */
#include <math.h>
#include <stdlib.h>

#include "tensor/tape.h"
#include "nabla/nn.h"
#include "tensor/backend.h"
#include "tensor/autocast.h"

static const char *const OP = "rms_norm";

static nb_dtype compute_dtype(nb_dtype dt) { return dt == NB_F64 ? NB_F64 : NB_F32; }

/* t converted to dt and made contiguous (t itself when it already is); NULL stays NULL. */
static nb_tensor *dense(nb_tensor *t, nb_dtype dt) {
    if (!t) return NULL;
    nb_tensor *c = nb_to_dtype(t, dt);
    return c ? nb_contiguous(c) : NULL;
}

static void *data(const nb_tensor *t) { return t ? (void *)nb__ptr(t) : NULL; }

static bool wants(const nb__node *n, int i) { return n->edges[i].node || n->edges[i].leaf; }

nb_tensor *nb_rms_norm(nb_tensor *x, nb_tensor *w, double eps) {
    NB__CHECK_ARG(x, OP, "x");
    x = nb__autocast(x, NB_AUTOCAST_F32); /* nabla/autocast.h */
    if (w && !(w = nb__autocast(w, NB_AUTOCAST_F32))) return NULL;
    if (!x) return NULL;
    if (!nb_dtype_is_float(x->dtype)) {
        nb__error(NB_EDTYPE, "%s: input dtype %s is not supported (f32, f64, f16 or bf16)", OP,
                  nb_dtype_name(x->dtype));
        return NULL;
    }
    if (x->ndim < 1) {
        nb__error(NB_ESHAPE, "%s: expected an input of at least 1 dim (..., features), got "
                  "shape %s", OP, NB__SHAPE(x));
        return NULL;
    }
    const int64_t D = x->shape[x->ndim - 1], N = nb__numel_of(x->shape, x->ndim - 1);
    if (w && w->dtype != x->dtype) {
        nb__error(NB_EDTYPE, "%s: weight is %s but the input is %s", OP, nb_dtype_name(w->dtype),
                  nb_dtype_name(x->dtype));
        return NULL;
    }
    if (w && (w->ndim != 1 || w->shape[0] != D)) {
        nb__error(NB_ESHAPE, "%s: weight must have shape [%lld] (the input's last dim), got %s",
                  OP, (long long)D, NB__SHAPE(w));
        return NULL;
    }
    if (!(eps >= 0) || !isfinite(eps)) {
        nb__error(NB_EINVAL, "%s: eps must be finite and >= 0, got %g", OP, eps);
        return NULL;
    }
    nb_device dev;
    if (!nb__check_devices(OP, (nb_tensor *[]){x, w}, 2, &dev)) return NULL;
    const nb_dtype dt = x->dtype, cdt = compute_dtype(dt);

    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_tensor *xc = dense(x, cdt), *wc = dense(w, cdt);
    nb_tensor *out = nb__empty(x->shape, x->ndim, cdt, dev);
    nb_tensor *rstd = nb__empty(&N, 1, NB_F64, dev);
    bool ok = xc && (wc || !w) && out && rstd;
    if (ok) {
        nb__rms_norm_args a = {.dtype = cdt, .N = N, .D = D, .eps = eps, .x = data(xc),
                               .w = data(wc), .y = data(out), .rstd = data(rstd)};
        ok = nb__run_rms_norm(dev, OP, &a) == NB_OK;
        if (ok && cdt != dt) ok = (out = nb_to_dtype(out, dt)) != NULL;
    }
    if (!ok) out = NULL;
    nb_keep(out);
    nb_keep(rstd);
    nb_scope_end();
    nb_set_grad_enabled(prev);
    nb__node *nd = out ? nb__record(out, NB__OP_RMS_NORM, (nb_tensor *[]){x, w}, 2) : NULL;
    if (nd) {
        nb__save(nd, 0, x);
        nb__save(nd, 1, w);
        nb__save(nd, 2, rstd);
    }
    if (rstd) nb_tensor_free(nb__scope_take(rstd)); /* the node holds its own reference */
    return out;
}

nb_status nb__bw_RMS_NORM(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *x = n->saved[0], *w = n->saved[1];
    nb_device dev;
    if (!nb__check_devices(OP, (nb_tensor *[]){x, g}, 2, &dev)) return NB_EDEVICE;
    const nb_dtype cdt = compute_dtype(x->dtype);
    const int64_t D = x->shape[x->ndim - 1], N = nb__numel_of(x->shape, x->ndim - 1);
    nb_tensor *gc = dense(g, cdt), *xc = dense(x, cdt), *wc = dense(w, cdt);
    if (!gc || !xc || (w && !wc)) return nb_last_status();
    nb_tensor *dx = wants(n, 0) ? nb__empty(x->shape, x->ndim, cdt, dev) : NULL;
    nb_tensor *dw = wants(n, 1) ? nb__empty(&D, 1, cdt, dev) : NULL;
    if ((wants(n, 0) && !dx) || (wants(n, 1) && !dw)) return nb_last_status();
    nb__rms_norm_backward_args a = {.dtype = cdt, .N = N, .D = D, .g = data(gc), .x = data(xc),
                                    .w = data(wc), .rstd = data(n->saved[2]), .dx = data(dx),
                                    .dw = data(dw)};
    nb_status st = nb__run_rms_norm_backward(dev, OP, &a);
    if (st != NB_OK) return st;
    gin[0] = dx, gin[1] = dw;
    return NB_OK;
}

/* ---- the module ------------------------------------------------------------------------------ */
typedef struct rms_self {
    int64_t features;
    double eps;
} rms_self;

static nb_tensor *rmsnorm_forward(nb_module *m, nb_tensor *x) {
    const rms_self *s = nb_module_self(m);
    NB__CHECK_ARG(x, "rmsnorm", "x");
    if (x->ndim < 1 || x->shape[x->ndim - 1] != s->features) {
        nb__error(NB_ESHAPE, "rmsnorm: expected an input whose last dim is %lld, got shape %s",
                  (long long)s->features, NB__SHAPE(x));
        return NULL;
    }
    return nb_rms_norm(x, nb_module_param_opt(m, "weight"), s->eps);
}

static const nb_module_vtable rmsnorm_vt = {.type_name = "RMSNorm", .forward = rmsnorm_forward,
                                            .free_self = free};

nb_module *nb_rms_norm_new(int64_t features, double eps) {
    if (features < 0 || !(eps >= 0) || !isfinite(eps)) {
        nb__error(NB_EINVAL, "rmsnorm: features must be >= 0 and eps finite and >= 0, got %lld "
                  "and %g", (long long)features, eps);
        return NULL;
    }
    rms_self *s = malloc(sizeof *s);
    if (!s) {
        nb__error(NB_ENOMEM, "rmsnorm: out of memory");
        return NULL;
    }
    *s = (rms_self){features, eps};
    nb_module *m = nb_module_new(&rmsnorm_vt, s);
    if (!m) {
        free(s);
        return NULL;
    }
    if (!nb_module_add_parameter(m, "weight", nb_ones(&features, 1, NB_F32))) {
        nb_module_free(m);
        return NULL;
    }
    return m;
}
