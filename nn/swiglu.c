/* swiglu.c - nb_swiglu: the SwiGLU product silu(a) * b of a gated MLP (Llama's
 * act_fn(gate_proj(x)) * up_proj(x)) as one op (the kernel table's swiglu and
 * swiglu_backward, tensor/kernels/lm.h) with one autograd node, NB__OP_SWIGLU.
 *
 * Fused because it pays: silu then a product is two passes writing an intermediate the
 * backward keeps (silu(a)); the fused op reads a and b once, writes y once, saves only its
 * inputs, and its backward reads g, a and b once to write both gradients. a and b have the
 * same shape and dtype (no broadcasting: they are two projections of one input); f16/bf16 are
 * computed in f32 and rounded once. */
#include "tensor/tape.h"
#include "nabla/nn.h"
#include "tensor/backend.h"

static const char *const OP = "swiglu";

static nb_tensor *dense(nb_tensor *t, nb_dtype dt) { return nb_contiguous(nb_to_dtype(t, dt)); }
static bool wants(const nb__node *n, int i) { return n->edges[i].node || n->edges[i].leaf; }

nb_tensor *nb_swiglu(nb_tensor *a, nb_tensor *b) {
    NB__CHECK_ARG(a, OP, "a");
    NB__CHECK_ARG(b, OP, "b");
    nb_device dev;
    if (!nb__check_devices(OP, (nb_tensor *[]){a, b}, 2, &dev)) return NULL;
    if (!nb_dtype_is_float(a->dtype) || b->dtype != a->dtype) {
        nb__error(NB_EDTYPE, "%s: a and b must have one float dtype (f32, f64, f16 or bf16), "
                  "got %s and %s", OP, nb_dtype_name(a->dtype), nb_dtype_name(b->dtype));
        return NULL;
    }
    bool same = a->ndim == b->ndim;
    for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
    if (!same) {
        nb__error(NB_ESHAPE, "%s: a (the gate) and b must have the same shape, got %s and %s",
                  OP, NB__SHAPE(a), NB__SHAPE(b));
        return NULL;
    }
    const nb_dtype dt = a->dtype, cdt = dt == NB_F64 ? NB_F64 : NB_F32;
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_tensor *ac = dense(a, cdt), *bc = dense(b, cdt);
    nb_tensor *out = ac && bc ? nb__empty(a->shape, a->ndim, cdt, dev) : NULL;
    if (out) {
        nb__swiglu_args k = {.dtype = cdt, .n = nb_numel(a), .a = nb__ptr(ac), .b = nb__ptr(bc),
                             .y = nb__ptr(out)};
        if (nb__run_swiglu(dev, OP, &k) != NB_OK) out = NULL;
        else if (cdt != dt) out = nb_to_dtype(out, dt);
    }
    nb_keep(out);
    nb_scope_end();
    nb_set_grad_enabled(prev);
    nb__node *nd = out ? nb__record(out, NB__OP_SWIGLU, (nb_tensor *[]){a, b}, 2) : NULL;
    if (nd) {
        nb__save(nd, 0, a);
        nb__save(nd, 1, b);
    }
    return out;
}

nb_status nb__bw_SWIGLU(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *a = n->saved[0], *b = n->saved[1];
    nb_device dev;
    if (!nb__check_devices(OP, (nb_tensor *[]){a, g}, 2, &dev)) return NB_EDEVICE;
    const nb_dtype cdt = a->dtype == NB_F64 ? NB_F64 : NB_F32;
    nb_tensor *gc = dense(g, cdt), *ac = dense(a, cdt), *bc = dense(b, cdt);
    if (!gc || !ac || !bc) return nb_last_status();
    nb_tensor *da = wants(n, 0) ? nb__empty(a->shape, a->ndim, cdt, dev) : NULL;
    nb_tensor *db = wants(n, 1) ? nb__empty(a->shape, a->ndim, cdt, dev) : NULL;
    if ((wants(n, 0) && !da) || (wants(n, 1) && !db)) return nb_last_status();
    nb__swiglu_backward_args k = {.dtype = cdt, .n = nb_numel(a), .g = nb__ptr(gc),
                                  .a = nb__ptr(ac), .b = nb__ptr(bc),
                                  .da = da ? nb__ptr(da) : NULL, .db = db ? nb__ptr(db) : NULL};
    nb_status st = nb__run_swiglu_backward(dev, OP, &k);
    if (st != NB_OK) return st;
    gin[0] = da, gin[1] = db;
    return NB_OK;
}
