/* tp_layers.c - the tensor-parallel linear layers of nabla/tp.h and the gradient norm over
 * a tensor-parallel model. Weights are slices of a 1-rank nb_linear's (drawn whole from the
 * same generator on every rank), so the model is the same whatever the layout. */
#include <math.h>
#include <stdlib.h>

#include "nabla/autograd.h"
#include "nabla/memory.h"
#include "nabla/tp.h"
#include "tensor/error.h"

typedef struct tp_linear {
    nb_comm *c;  /* borrowed */
    bool flag;   /* column: gather_output; row: input_is_parallel */
} tp_linear;

static nb_tensor *column_forward(nb_module *m, nb_tensor *x) {
    const tp_linear *s = nb_module_self(m);
    nb_tensor *y = nb_linear(nb_copy_to_region(x, s->c), nb_module_param(m, "weight"),
                             nb_module_param_opt(m, "bias"));
    return s->flag ? nb_gather_along(y, s->c, -1) : y;
}

static nb_tensor *row_forward(nb_module *m, nb_tensor *x) {
    const tp_linear *s = nb_module_self(m);
    if (!s->flag) x = nb_split_along(x, s->c, -1);
    nb_tensor *y = nb_reduce_from_region(nb_linear(x, nb_module_param(m, "weight"), NULL), s->c);
    nb_tensor *b = nb_module_param_opt(m, "bias");
    return b ? nb_add(y, b) : y;
}

static const nb_module_vtable column_vt = {.type_name = "ColumnParallelLinear",
                                           .forward = column_forward, .free_self = free};
static const nb_module_vtable row_vt = {.type_name = "RowParallelLinear", .forward = row_forward,
                                        .free_self = free};

static nb_module *make(const nb_module_vtable *vt, nb_tensor *w, nb_tensor *b, nb_comm *c,
                       bool flag, bool column) {
    const char *op = column ? "column_parallel_linear" : "row_parallel_linear";
    if (!w || !c) {
        nb__error(NB_ENULL, "%s: %s is NULL", op, w ? "the communicator" : "the weight");
        return NULL;
    }
    if (nb_ndim(w) != 2 || (b && (nb_ndim(b) != 1 || nb_size(b, 0) != nb_size(w, 0)))) {
        nb__error(NB_ESHAPE, "%s: expected a weight (out, in) and a bias (out)", op);
        return NULL;
    }
    const int tp = nb_comm_size(c), r = nb_comm_rank(c);
    const int64_t n = nb_size(w, column ? 0 : 1);
    if (n % tp) {
        nb__error(NB_EINVAL, "%s: %s_features %lld does not divide by the tensor-parallel size %d",
                  op, column ? "out" : "in", (long long)n, tp);
        return NULL;
    }
    tp_linear *s = malloc(sizeof *s);
    if (!s) {
        nb__error(NB_ENOMEM, "%s: out of memory", op);
        return NULL;
    }
    *s = (tp_linear){c, flag};
    nb_module *m = nb_module_new(vt, s);
    if (!m) {
        free(s);
        return NULL;
    }
    nb_tensor *ws = nb_tp_slice(w, column ? 0 : 1, r, tp);
    bool prev = nb_set_grad_enabled(false);
    nb_tensor *bs = !b ? NULL : column ? nb_tp_slice(b, 0, r, tp) : nb_clone(b);
    nb_set_grad_enabled(prev);
    bool ok = ws && (!b || bs) && nb_module_add_parameter(m, "weight", ws) &&
              (!bs || nb_module_add_parameter(m, "bias", bs));
    if (!ok) {
        nb_module_free(m);
        return NULL;
    }
    return m;
}

nb_module *nb_column_parallel_linear_from(nb_tensor *weight, nb_tensor *bias, nb_comm *c,
                                          bool gather_output) {
    return make(&column_vt, weight, bias, c, gather_output, true);
}

nb_module *nb_row_parallel_linear_from(nb_tensor *weight, nb_tensor *bias, nb_comm *c,
                                       bool input_is_parallel) {
    return make(&row_vt, weight, bias, c, input_is_parallel, false);
}

/* Draw the 1-rank layer, then slice it. */
static nb_module *from_full(int64_t in, int64_t out, nb_comm *c, bool flag, const nb_linear_opts *o,
                            nb_generator *gen, bool column) {
    nb_linear_opts lo = o ? *o : nb_linear_defaults();
    if (gen) lo.gen = gen;
    nb_module *full = nb_linear_new(in, out, &lo);
    if (!full) return NULL;
    nb_module *m = make(column ? &column_vt : &row_vt, nb_module_param(full, "weight"),
                        nb_module_param_opt(full, "bias"), c, flag, column);
    nb_module_free(full);
    return m;
}

nb_module *nb_column_parallel_linear_new(int64_t in, int64_t out, nb_comm *c, bool gather_output,
                                         const nb_linear_opts *o, nb_generator *gen) {
    return from_full(in, out, c, gather_output, o, gen, true);
}

nb_module *nb_row_parallel_linear_new(int64_t in, int64_t out, nb_comm *c, bool input_is_parallel,
                                      const nb_linear_opts *o, nb_generator *gen) {
    return from_full(in, out, c, input_is_parallel, o, gen, false);
}

double nb_tp_clip_grad_norm(nb_tensor *const *params, const bool *sharded, int n, nb_comm *c,
                            double max_norm) {
    if ((n > 0 && (!params || !sharded)) || !c) {
        nb__error(NB_ENULL, "tp_clip_grad_norm: params, sharded and the communicator are needed");
        return NB_ENULL;
    }
    if (!(max_norm > 0)) {
        nb__error(NB_EINVAL, "tp_clip_grad_norm: max_norm must be > 0, got %g", max_norm);
        return NB_EINVAL;
    }
    /* [0]: the shards' square sums (summed over c), [1]: the replicated ones (counted once) */
    double sq[2] = {0, 0};
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    for (int i = 0; i < n; i++) {
        nb_tensor *g = params[i] ? nb_grad(params[i]) : NULL;
        if (!g) continue;
        nb_tensor *g64 = nb_to_dtype(g, NB_F64);
        nb_tensor *s = nb_sum(nb_mul(g64, g64), NULL, 0, false);
        sq[sharded[i] ? 0 : 1] += s ? nb_item_f64(s) : NAN;
    }
    nb_tensor *t = nb_from_buffer(sq, (int64_t[]){1}, 1, NB_F64);
    nb_status st = t ? nb_allreduce(c, t, NB_REDUCE_SUM) : nb_last_status();
    double norm = NAN;
    if (st == NB_OK) norm = sqrt(nb_item_f64(t) + sq[1]);
    nb_scope_end();
    const double scale = max_norm / (norm + 1e-6); /* as nb_clip_grad_norm */
    if (st == NB_OK && scale < 1) {
        for (int i = 0; st == NB_OK && i < n; i++) {
            nb_tensor *g = params[i] ? nb_grad(params[i]) : NULL;
            if (!g) continue;
            nb_scope_begin();
            st = nb_copy_(g, nb_mul_scalar(g, scale));
            nb_scope_end();
        }
    }
    nb_set_grad_enabled(prev);
    return st == NB_OK ? norm : (double)st;
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
