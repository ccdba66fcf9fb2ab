/* dropout.c - nb_dropout and the Dropout module.
 *
 * The keep mask is drawn with nb_bernoulli (u8, probability 1 - p) from the given generator,
 * so it depends only on the generator's (seed, stream, offset) and the shape, never on the
 * thread count (docs/architecture.md rule 5); the generator advances exactly as nb_bernoulli
 * advances it, whatever x's device: the mask is drawn on the host and moved to x's device (on the
 * CPU that move is free; on the meta device nothing is drawn). The output is
 * x * mask / (1 - p) in one pass (the kernel table's dropout); the node saves the u8 mask (a
 * quarter of an f32 input's size) and the backward applies the same scaling to the
 * gradient. Eval mode or p = 0 returns x itself (a new reference), as PyTorch does; p = 1
 * gives zeros (and zero gradients). */
#include <math.h>

#include "tensor/tape.h"
#include "nabla/nn.h"
#include "nabla/random.h"
#include "tensor/backend.h"

/* out = x * mask * scale, x converted to a dense tensor of its own dtype first; mask is on
 * x's device. */
static nb_tensor *masked_scale(nb_tensor *x, nb_tensor *mask, double scale) {
    nb_device dev;
    if (!nb__check_devices("dropout", (nb_tensor *[]){x, mask}, 2, &dev)) return NULL;
    nb_tensor *xc = nb_contiguous(x);
    nb_tensor *out = xc ? nb__empty(x->shape, x->ndim, x->dtype, dev) : NULL;
    if (!out) return NULL;
    nb__dropout_args a = {.dtype = x->dtype, .n = nb_numel(x), .x = nb__ptr(xc),
                          .mask = (const uint8_t *)nb__ptr(mask), .out = nb__ptr(out),
                          .scale = scale};
    return nb__run_dropout(dev, "dropout", &a) == NB_OK ? out : NULL;
}

/* The u8 keep mask of x's shape on x's device. */
static nb_tensor *keep_mask(nb_tensor *x, double p, nb_generator *gen) {
    /* On meta nothing is drawn, but the generator advances as a real draw would. */
    return nb_bernoulli_on(nb__device_of(x), x->shape, x->ndim, NB_U8, 1.0 - p, gen);
}

nb_tensor *nb_dropout(nb_tensor *x, double p, bool training, nb_generator *gen) {
    NB__CHECK_ARG(x, "dropout", "x");
    if (!(p >= 0 && p <= 1)) {
        nb__error(NB_EINVAL, "dropout: probability p must be in [0, 1], got %g", p);
        return NULL;
    }
    if (!nb_dtype_is_float(x->dtype)) {
        nb__error(NB_EDTYPE, "dropout: input dtype %s is not supported (f32, f64, f16 or bf16)",
                  nb_dtype_name(x->dtype));
        return NULL;
    }
    if (!training || p == 0) return nb__scope_add(nb_tensor_retain(x));
    double scale = p < 1 ? 1.0 / (1.0 - p) : 0.0;

    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_tensor *mask = keep_mask(x, p, gen);
    nb_tensor *out = mask ? masked_scale(x, mask, scale) : NULL;
    nb_keep(out);
    nb_keep(mask);
    nb_scope_end();
    nb_set_grad_enabled(prev);
    nb__node *nd = out ? nb__record(out, NB__OP_DROPOUT, &x, 1) : NULL;
    if (nd) {
        nb__save(nd, 0, mask);
        nd->attrs.f[0] = scale;
    }
    nb_tensor_free(nb__scope_take(mask));
    return out;
}

nb_status nb__bw_DROPOUT(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *gf = nb_dtype_is_float(g->dtype) ? g : nb_to_dtype(g, NB_F32);
    gin[0] = gf ? masked_scale(gf, n->saved[0], n->attrs.f[0]) : NULL;
    return gin[0] ? NB_OK : nb_last_status();
}

/* ---- module ---------------------------------------------------------------------------------- */
typedef struct dropout_self {
    double p;
    nb_generator *gen; /* borrowed; NULL: the default generator */
} dropout_self;

static nb_tensor *dropout_forward(nb_module *m, nb_tensor *x) {
    const dropout_self *s = nb_module_self(m);
    return nb_dropout(x, s->p, nb_module_is_training(m), s->gen);
}

static const nb_module_vtable dropout_vt = {.type_name = "Dropout", .forward = dropout_forward,
                                            .free_self = free};

nb_module *nb_dropout_new(double p, nb_generator *gen) {
    if (!(p >= 0 && p <= 1)) {
        nb__error(NB_EINVAL, "dropout: probability p must be in [0, 1], got %g", p);
        return NULL;
    }
    dropout_self *s = malloc(sizeof *s);
    if (!s) {
        nb__error(NB_ENOMEM, "dropout: out of memory");
        return NULL;
    }
    *s = (dropout_self){p, gen};
    nb_module *m = nb_module_new(&dropout_vt, s);
    if (!m) free(s);
    return m;
}
