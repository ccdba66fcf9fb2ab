/* tp_layers.c - the public tensor-parallel linear layers of nabla/tp.h (a plan's column- and
 * row-wise styles on one nb_linear: its weights are slices of the whole layer, drawn from the
 * same generator on every rank, so the model is the same whatever the layout), and the
 * vocab-parallel embedding and cross entropy. */
#include <math.h>
#include <stdlib.h>

#include "nabla/autograd.h"
#include "nabla/memory.h"
#include "nabla/tp.h"
#include "parallel/mesh_impl.h"
#include "tensor/error.h"

nb_tp_linear_opts nb_tp_linear_defaults(void) {
    return (nb_tp_linear_opts){._init = NB__OPTS_MARK(nb_tp_linear_opts),
                               .gather_output = false,
                               .input_is_parallel = true,
                               .sequence_parallel = false,
                               .tp_dim = "tp",
                               .linear = nb_linear_defaults()};
}

/* The whole layer drawn, then the style of a plan on it (parallel/plan.c). */
static nb_module *make(int64_t in, int64_t out, const nb_mesh *mesh, const nb_tp_linear_opts *o,
                       nb_tp_style style) {
    nb_tp_linear_opts d = nb_tp_linear_defaults();
    if (!o) o = &d;
    const char *who = style == NB_TP_COLWISE ? "column_parallel_linear" : "row_parallel_linear";
    if (NB__OPTS_CHECK(o, nb_tp_linear_opts, who, "nb_tp_linear_defaults()",
                       "o.gather_output = true") != NB_OK ||
        NB__OPTS_CHECK(&o->linear, nb_linear_opts, who, "nb_linear_defaults()",
                       "o.no_bias = true") != NB_OK)
        return NULL;
    if (!mesh) {
        nb__error(NB_ENULL, "%s_parallel_linear: the mesh is NULL",
                  style == NB_TP_COLWISE ? "column" : "row");
        return NULL;
    }
    nb_module *m = nb_linear_new(in, out, &o->linear);
    nb_parallelize_opts po = nb_parallelize_defaults();
    po.sequence_parallel = o->sequence_parallel;
    po.tp_dim = o->tp_dim ? o->tp_dim : "tp";
    const nb_tp_rule r = {.path = "", .style = style};
    if (m && nb__tp_apply_one(m, mesh, &r, &po, style == NB_TP_COLWISE && o->gather_output,
                              style == NB_TP_ROWWISE && !o->input_is_parallel) != NB_OK) {
        nb_module_free(m);
        return NULL;
    }
    return m;
}

nb_module *nb_column_parallel_linear_new(int64_t in, int64_t out, const nb_mesh *mesh,
                                         const nb_tp_linear_opts *o) {
    return make(in, out, mesh, o, NB_TP_COLWISE);
}

nb_module *nb_row_parallel_linear_new(int64_t in, int64_t out, const nb_mesh *mesh,
                                      const nb_tp_linear_opts *o) {
    return make(in, out, mesh, o, NB_TP_ROWWISE);
}

/* ---- vocab parallel ---------------------------------------------------------------------------- */
/* Integer tensor idx as host int64 values (caller frees); NULL on error. */
static int64_t *read_tokens(nb_tensor *idx, int64_t *n, const char *op) {
    *n = nb_numel(idx);
    int64_t *v = malloc(sizeof(int64_t) * (size_t)(*n > 0 ? *n : 1));
    if (!v) {
        nb__error(NB_ENOMEM, "%s: out of memory", op);
        return NULL;
    }
    if (nb_read(idx, v, *n, NB_I64) != NB_OK) {
        free(v);
        return NULL;
    }
    return v;
}

/* Local indices (token - lo, or 0 outside [lo, lo + n)) and a 0/1 mask of tokens in range. */
static bool localize(int64_t *tok, int64_t count, int64_t lo, int64_t nl, int64_t V, float *mask,
                     const char *op) {
    for (int64_t i = 0; i < count; i++) {
        if (tok[i] < 0 || tok[i] >= V) {
            nb__error(NB_EINDEX, "%s: token %lld at %lld is outside the vocabulary 0..%lld", op,
                      (long long)tok[i], (long long)i, (long long)V - 1);
            return false;
        }
        bool in = tok[i] >= lo && tok[i] < lo + nl;
        mask[i] = in ? 1.0f : 0.0f;
        tok[i] = in ? tok[i] - lo : 0;
    }
    return true;
}

nb_tensor *nb_vocab_parallel_embedding(nb_tensor *weight, nb_tensor *idx, nb_comm *c, int seq_dim) {
    const char *op = "vocab_parallel_embedding";
    if (!weight || !idx || !c) {
        if (nb_last_status() == NB_OK) nb__error(NB_ENULL, "%s: an argument is NULL", op);
        return NULL;
    }
    if (nb_ndim(weight) != 2 || nb_ndim(idx) >= NB_MAX_DIMS) {
        nb__error(NB_ESHAPE, "%s: expected a (V/tp, C) weight", op);
        return NULL;
    }
    const int64_t nl = nb_size(weight, 0), lo = nl * nb_comm_rank(c), V = nl * nb_comm_size(c);
    int64_t n;
    int64_t *tok = read_tokens(idx, &n, op);
    float *mask = tok ? malloc(sizeof(float) * (size_t)(n > 0 ? n : 1)) : NULL;
    nb_tensor *out = NULL;
    nb_scope_begin(); /* the intermediates go here; the result to the caller's scope */
    if (mask && localize(tok, n, lo, nl, V, mask, op)) {
        int64_t shape[NB_MAX_DIMS];
        const int nd = nb_ndim(idx);
        for (int i = 0; i < nd; i++) shape[i] = nb_size(idx, i);
        shape[nd] = 1;
        const nb_device dev = nb_tensor_device(weight);
        nb_tensor *li = nb_to_device(nb_from_buffer(tok, shape, nd, NB_I64), dev);
        nb_tensor *m = nb_to_device(nb_from_buffer(mask, shape, nd + 1, NB_F32), dev);
        nb_tensor *part = nb_mul(nb_embedding(weight, li), nb_to_dtype(m, nb_tensor_dtype(weight)));
        out = seq_dim < 0 ? nb_reduce_from_region(part, c) : nb_reduce_scatter_along(part, c, seq_dim);
    } else if (tok && !mask) {
        nb__error(NB_ENOMEM, "%s: out of memory", op);
    }
    nb_keep(out);
    nb_scope_end();
    free(tok);
    free(mask);
    return out;
}

nb_tensor *nb_vocab_parallel_cross_entropy(nb_tensor *logits, nb_tensor *targets, nb_comm *c) {
    const char *op = "vocab_parallel_cross_entropy";
    if (!logits || !targets || !c) {
        if (nb_last_status() == NB_OK) nb__error(NB_ENULL, "%s: an argument is NULL", op);
        return NULL;
    }
    if (nb_ndim(logits) != 2 || nb_ndim(targets) != 1 || nb_size(targets, 0) != nb_size(logits, 0)) {
        nb__error(NB_ESHAPE, "%s: expected logits (N, V/tp) and targets (N)", op);
        return NULL;
    }
    const int64_t N = nb_size(logits, 0), nl = nb_size(logits, 1);
    const int64_t lo = nl * nb_comm_rank(c), V = nl * nb_comm_size(c);
    int64_t n;
    int64_t *tok = read_tokens(targets, &n, op);
    float *mask = tok ? malloc(sizeof(float) * (size_t)(n > 0 ? n : 1)) : NULL;
    nb_tensor *loss = NULL;
    nb_scope_begin();
    if (mask && localize(tok, n, lo, nl, V, mask, op)) {
        /* the row maxima over every rank: a constant shift (no gradient needed: the loss does
         * not depend on it) */
        bool prev = nb_set_grad_enabled(false);
        nb_tensor *mx = nb_contiguous(nb_amax(nb_detach(logits), (int[]){1}, 1, true));
        nb_status st = mx ? nb_allreduce(c, mx, NB_REDUCE_MAX) : nb_last_status();
        nb_set_grad_enabled(prev);
        if (st == NB_OK) {
            nb_tensor *z = nb_sub(logits, mx);                                        /* (N, Vl) */
            nb_tensor *se = nb_reduce_from_region(nb_sum(nb_exp(z), (int[]){1}, 1, false), c);
            const nb_device dev = nb_tensor_device(logits);
            nb_tensor *li = nb_to_device(nb_from_buffer(tok, (int64_t[]){N, 1}, 2, NB_I64), dev);
            nb_tensor *m = nb_to_device(nb_from_buffer(mask, (int64_t[]){N}, 1, NB_F32), dev);
            nb_tensor *zt = nb_mul(nb_squeeze(nb_gather(z, 1, li), 1), nb_to_dtype(m, nb_tensor_dtype(logits)));
            zt = nb_reduce_from_region(zt, c);                                        /* (N) */
            loss = nb_mean(nb_sub(nb_log(se), zt), NULL, 0, false);
        }
    } else if (tok && !mask) {
        nb__error(NB_ENOMEM, "%s: out of memory", op);
    }
    nb_keep(loss);
    nb_scope_end();
    free(tok);
    free(mask);
    return loss;
}
