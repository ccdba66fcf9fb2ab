/* rotary.c - nb_rotary_embedding: rotary position embeddings in Llama's half-split layout
 * ("rotate_half": dimension i is paired with i + D/2) as one op (the kernel table's rotary,
 * tensor/kernels/lm.h) with one autograd node, NB__OP_ROTARY.
 *
 * The input is (..., T, H, D): the heads of a projection viewed per head before they are
 * transposed for attention, so q and k are rotated where the projection wrote them. Row t
 * has position offset + t (a key/value cache's length when generating). The backward rotates
 * the output gradient by the opposite angles (a rotation's transpose is its inverse), with the
 * same kernel: nothing is saved but the geometry. f16/bf16 are computed in f32 and rounded
 * once; the output has the input's dtype. */
#include <math.h>

#include "tensor/tape.h"
#include "nabla/nn.h"
#include "tensor/backend.h"

static const char *const OP = "rotary_embedding";

static nb_tensor *dense(nb_tensor *t, nb_dtype dt) { return nb_contiguous(nb_to_dtype(t, dt)); }

/* y = rotary(x) (or its inverse) for x of shape (..., T, H, D) on dev, in the current scope. */
static nb_tensor *run(nb_tensor *x, int64_t offset, double base, bool inverse, nb_device dev) {
    const nb_dtype dt = nb_tensor_dtype(x), cdt = dt == NB_F64 ? NB_F64 : NB_F32;
    const int nd = nb_ndim(x);
    nb_tensor *xc = dense(x, cdt);
    nb_tensor *y = xc ? nb__empty(nb_shape(x), nd, cdt, dev) : NULL;
    if (!y) return NULL;
    const int64_t *sh = nb_shape(x);
    nb__rotary_args a = {.dtype = cdt, .N = nb__numel_of(sh, nd - 3), .T = sh[nd - 3],
                         .H = sh[nd - 2], .D = sh[nd - 1], .offset = offset, .base = base,
                         .inverse = inverse, .x = nb__ptr(xc), .y = nb__ptr(y)};
    if (nb__run_rotary(dev, OP, &a) != NB_OK) return NULL;
    return cdt == dt ? y : nb_to_dtype(y, dt);
}

nb_tensor *nb_rotary_embedding(nb_tensor *x, int64_t offset, double base) {
    NB__CHECK_ARG(x, OP, "x");
    if (!nb_dtype_is_float(x->dtype)) {
        nb__error(NB_EDTYPE, "%s: input dtype %s is not supported (f32, f64, f16 or bf16)", OP,
                  nb_dtype_name(x->dtype));
        return NULL;
    }
    if (x->ndim < 3) {
        nb__error(NB_ESHAPE, "%s: expected an input (..., time, heads, head_dim) of at least 3 "
                  "dims, got shape %s", OP, NB__SHAPE(x));
        return NULL;
    }
    const int64_t D = x->shape[x->ndim - 1];
    if (D % 2) {
        nb__error(NB_ESHAPE, "%s: the head size %lld is odd: rotary embeddings pair dimension i "
                  "with i + head_dim/2, so the head size must be even (input shape %s)", OP,
                  (long long)D, NB__SHAPE(x));
        return NULL;
    }
    if (!(base > 0) || !isfinite(base)) {
        nb__error(NB_EINVAL, "%s: the base (rope theta) must be finite and > 0, got %g", OP, base);
        return NULL;
    }
    if (offset < 0) {
        nb__error(NB_EINVAL, "%s: the position offset must be >= 0, got %lld", OP,
                  (long long)offset);
        return NULL;
    }
    const nb_device dev = nb__device_of(x);
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_tensor *out = nb_keep(run(x, offset, base, false, dev));
    nb_scope_end();
    nb_set_grad_enabled(prev);
    nb__node *nd = out ? nb__record(out, NB__OP_ROTARY, (nb_tensor *[]){x}, 1) : NULL;
    if (nd) {
        nd->attrs.f[0] = base;
        nd->attrs.i[0] = offset;
        nd->attrs.ni = 1;
    }
    return out;
}

nb_status nb__bw_ROTARY(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *dx = run(g, n->attrs.i[0], n->attrs.f[0], true, nb__device_of(g));
    if (!dx) return nb_last_status();
    gin[0] = dx;
    return NB_OK;
}
