/* attention.c - nb_causal_attention: causal scaled dot-product attention as one fused op
 * (the kernel table's attention and attention_backward, tensor/kernels/attention.h) with one
 * autograd node, NB__OP_ATTENTION; and
 * nb_causal_attention_qkv, the same on a packed (B, T, 3C) projection (NB__OP_ATTENTION_QKV),
 * whose node has the one input, so its backward writes the qkv gradient as one tensor instead
 * of three slices that a split's backward would pad and add.
 *
 * Grouped-query attention: k and v may have fewer heads than q (Hkv dividing H); query head h
 * reads key/value head h / (H / Hkv) inside the kernels (the geometry's Hkv), so k and v are
 * never repeated in memory, and their gradients sum over the query heads of each group.
 *
 * The node saves q, k, v and the per-row log-sum-exp of the scores (B * H * T values); the
 * backward recomputes the attention weights from them, so no (T, T) tensor outlives a call.
 * With dropout, the mask is a function of (generator seed, stream, an offset range reserved
 * in the forward, element index): the forward advances the generator past B * H * T * T / 4
 * Philox blocks and the node keeps the range's start, so the backward regenerates the same
 * mask without storing it (tensor/kernels/attention.h has the exact draw).
 *
 * Layouts: q, k, v may be any views whose last dim is contiguous (e.g. (B, T, H, D) slices of
 * a fused qkv projection permuted to (B, H, T, D)): the GEMMs read them in place. Others are
 * made contiguous once. The output and the gradients of views are (B, H, T, D) views of
 * (B, T, H, D) buffers, as PyTorch's CPU flash attention returns them: transposing back to
 * (B, T, H, D) and merging the heads is then free (the gradient of a contiguous input is
 * contiguous instead). f16/bf16 are computed in f32: bf16 operands go to the kernels as they
 * are where the backend takes them (nb__attention_takes_bf16; the CPU widens each slice in
 * its own scratch and rounds the outputs once), are converted to f32 around them elsewhere;
 * the row statistics are f32 either way. Outputs, statistics and gradients live on the
 * inputs' device; on the meta device the kernels do not run. */
#include <math.h>

#include "tensor/tape.h"
#include "nabla/nn.h"
#include "nabla/random.h"
#include "tensor/backend.h"
#include "tensor/autocast.h"

static const char *const OP = "causal_attention";

static bool wants(const nb__node *n, int i) { return n->edges[i].node || n->edges[i].leaf; }

/* t converted to dt, with the last dim contiguous and rows (dim 2) far enough apart for a
 * GEMM's leading dimension; t itself when it already is. */
static nb_tensor *usable(nb_tensor *t, nb_dtype dt) {
    nb_tensor *c = nb_to_dtype(t, dt);
    if (!c) return NULL;
    const int64_t *sh = c->shape, *st = c->strides;
    bool ok = (sh[3] <= 1 || st[3] == 1) && (sh[2] <= 1 || st[2] >= sh[3]) && st[0] >= 0 &&
              st[1] >= 0;
    return ok ? c : nb_contiguous(c);
}

/* Strides (B, H, T) of a usable tensor; the T stride is at least max(1, D) (a GEMM's
 * leading dimension) even where T <= 1 makes it irrelevant. */
static void strides3(const nb_tensor *t, int64_t out[3]) {
    int64_t D = t->shape[3], ld = t->shape[2] <= 1 ? D : t->strides[2];
    out[0] = t->strides[0];
    out[1] = t->strides[1];
    out[2] = ld > 1 ? ld : 1;
}

/* A (B, H, T, D) view of a fresh (B, T, H, D) buffer of dtype dt on dev. */
static nb_tensor *bthd(const int64_t *shape, nb_dtype dt, nb_device dev) {
    int64_t s[4] = {shape[0], shape[2], shape[1], shape[3]};
    nb_tensor *buf = nb__empty(s, 4, dt, dev);
    return buf ? nb_transpose(buf, 1, 2) : NULL;
}

static bool check_input(const nb_tensor *t, const char *name) {
    if (!nb_dtype_is_float(t->dtype)) {
        nb__error(NB_EDTYPE, "%s: %s has dtype %s; attention needs f32, f64, f16 or bf16", OP,
                  name, nb_dtype_name(t->dtype));
        return false;
    }
    if (t->ndim != 4) {
        nb__error(NB_ESHAPE, "%s: %s must be 4-D (batch, heads, time, head_dim), got shape %s",
                  OP, name, NB__SHAPE(t));
        return false;
    }
    return true;
}

static bool check_scalars(const char *op, double scale, double dropout_p) {
    if (!(dropout_p >= 0 && dropout_p <= 1)) {
        nb__error(NB_EINVAL, "%s: dropout probability must be in [0, 1], got %g", op, dropout_p);
        return false;
    }
    if (!isfinite(scale)) {
        nb__error(NB_EINVAL, "%s: scale must be finite (0 means 1/sqrt(head_dim)), got %g", op,
                  scale);
        return false;
    }
    return true;
}

/* The geometry of a (B, H, T, D) problem with Hkv key/value heads; with dropout, reserves
 * the generator blocks of a (B, H, T, T) draw, as nb_bernoulli would use them, and records
 * where they start. */
static nb__attn_geom make_geom(const int64_t *shape, int64_t Hkv, double scale, bool drop,
                               double p, nb_generator *gen) {
    nb__attn_geom g = {.B = shape[0], .H = shape[1], .T = shape[2], .D = shape[3], .Hkv = Hkv,
                       .scale = scale, .p = drop ? p : 0};
    if (drop) {
        nb_generator *gg = gen ? gen : nb_default_generator();
        g.seed = nb_generator_seed(gg);
        g.stream = nb_generator_stream(gg);
        g.offset = nb_generator_offset(gg);
        uint64_t n = (uint64_t)g.B * (uint64_t)g.H * (uint64_t)g.T * (uint64_t)g.T;
        nb_generator_set_offset(gg, g.offset + (n + 3) / 4);
    }
    return g;
}

/* The dtype the kernels get the operands of an op in dtype dt with compute dtype cdt on
 * dev: bf16 itself where the backend takes it, else cdt. */
static nb_dtype io_dtype(nb_dtype dt, nb_dtype cdt, nb_device dev) {
    return dt == NB_BF16 && nb__attention_takes_bf16(dev) ? NB_BF16 : cdt;
}

/* Runs the forward kernel of op on usable q, k, v of dtype iodt on dev (in the current
 * scope), computing in cdt: returns the output (iodt) as a (B, H, T, D) view of a
 * (B, T, H, D) buffer and the row statistics (cdt). */
static nb_tensor *forward_core(const nb__attn_geom *g, nb_tensor *qc, nb_tensor *kc,
                               nb_tensor *vc, nb_dtype cdt, nb_dtype iodt, nb_device dev,
                               const char *op, nb_tensor **lse_out) {
    const int64_t shape[4] = {g->B, g->H, g->T, g->D}, lshape[3] = {g->B, g->H, g->T};
    nb_tensor *o = bthd(shape, iodt, dev), *lse = nb__empty(lshape, 3, cdt, dev);
    if (!qc || !kc || !vc || !o || !lse) return NULL;
    nb__attention_args a = {.g = *g, .dtype = cdt, .bf16 = iodt == NB_BF16, .q = nb__ptr(qc),
                            .k = nb__ptr(kc),
                            .v = nb__ptr(vc), .o = nb__ptr(o), .lse = nb__ptr(lse)};
    strides3(qc, a.g.sq);
    strides3(kc, a.g.sk);
    strides3(vc, a.g.sv);
    strides3(o, a.g.so);
    nb_status st = nb__run_attention(dev, op, &a);
    *lse_out = lse;
    return st == NB_OK ? o : NULL;
}

/* Saves what the backward of either op needs: the inputs, the row statistics, and the
 * scale and dropout stream (attrs.i[0..2]). */
static void save_attrs(nb__node *nd, const nb__attn_geom *g, bool drop) {
    nd->attrs.f[0] = g->scale;
    nd->attrs.f[1] = g->p;
    nd->attrs.i[0] = (int64_t)g->seed;
    nd->attrs.i[1] = (int64_t)g->stream;
    nd->attrs.i[2] = (int64_t)g->offset;
    nd->attrs.ni = 3;
    nd->attrs.flag = drop;
}

nb_tensor *nb_causal_attention(nb_tensor *q, nb_tensor *k, nb_tensor *v, double scale,
                               double dropout_p, bool training, nb_generator *gen) {
    NB__CHECK_ARG(q, OP, "q");
    NB__CHECK_ARG(k, OP, "k");
    NB__CHECK_ARG(v, OP, "v");
    q = nb__autocast(q, NB_AUTOCAST_LOW); /* nabla/autocast.h */
    k = nb__autocast(k, NB_AUTOCAST_LOW);
    v = nb__autocast(v, NB_AUTOCAST_LOW);
    if (!q || !k || !v) return NULL;
    nb_device dev;
    if (!nb__check_devices(OP, (nb_tensor *[]){q, k, v}, 3, &dev)) return NULL;
    if (!check_input(q, "q") || !check_input(k, "k") || !check_input(v, "v")) return NULL;
    if (k->dtype != q->dtype || v->dtype != q->dtype) {
        nb__error(NB_EDTYPE, "%s: q, k and v must have the same dtype, got %s, %s and %s", OP,
                  nb_dtype_name(q->dtype), nb_dtype_name(k->dtype), nb_dtype_name(v->dtype));
        return NULL;
    }
    /* grouped-query attention: k and v may have fewer heads, Hkv dividing H */
    for (int d = 0; d < 4; d++)
        if (v->shape[d] != k->shape[d] || (d != 1 && k->shape[d] != q->shape[d])) {
            nb__error(NB_ESHAPE, "%s: q (B, H, T, D), k and v (B, Hkv, T, D) must have the same "
                      "shape but for the key/value heads Hkv, got q %s, k %s and v %s", OP,
                      NB__SHAPE(q), NB__SHAPE(k), NB__SHAPE(v));
            return NULL;
        }
    const int64_t Hkv = k->shape[1];
    if (Hkv == 0 ? q->shape[1] != 0 : q->shape[1] % Hkv != 0) {
        nb__error(NB_ESHAPE, "%s: k and v have %lld heads, which does not divide the %lld heads "
                  "of q (grouped-query attention: each key/value head serves H / Hkv query "
                  "heads), got q %s, k %s", OP, (long long)Hkv, (long long)q->shape[1],
                  NB__SHAPE(q), NB__SHAPE(k));
        return NULL;
    }
    if (!check_scalars(OP, scale, dropout_p)) return NULL;
    const int64_t D = q->shape[3];
    if (scale == 0) scale = D > 0 ? 1.0 / sqrt((double)D) : 1.0;
    const nb_dtype dt = q->dtype, cdt = dt == NB_F64 ? NB_F64 : NB_F32;
    const nb_dtype iodt = io_dtype(dt, cdt, dev);
    const bool drop = training && dropout_p > 0;
    nb__attn_geom g = make_geom(q->shape, Hkv, scale, drop, dropout_p, gen);

    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_tensor *lse = NULL;
    nb_tensor *o = forward_core(&g, usable(q, iodt), usable(k, iodt), usable(v, iodt), cdt, iodt,
                                dev, OP, &lse);
    nb_tensor *out = o ? (iodt == dt ? o : nb_to_dtype(o, dt)) : NULL;
    nb_keep(out);
    nb_keep(lse);
    nb_scope_end();
    nb_set_grad_enabled(prev);
    nb__node *nd = out ? nb__record(out, NB__OP_ATTENTION, (nb_tensor *[]){q, k, v}, 3) : NULL;
    if (nd) {
        nb__save(nd, 0, q);
        nb__save(nd, 1, k);
        nb__save(nd, 2, v);
        nb__save(nd, 3, lse);
        save_attrs(nd, &g, drop);
    }
    if (lse) nb_tensor_free(nb__scope_take(lse));
    return out;
}

/* Head `which` (0 q, 1 k, 2 v) of a contiguous packed (B, T, n * C) tensor as a (B, H, T, D)
 * view; n = 1 for the merged (B, T, C) layout of the output. */
static nb_tensor *head_view(nb_tensor *t, int which, int64_t C, int64_t H) {
    const int64_t B = t->shape[0], T = t->shape[1];
    nb_tensor *part = t->shape[2] == C ? t : nb_narrow(t, 2, which * C, C);
    return nb_transpose(nb_view(part, (int64_t[]){B, T, H, C / H}, 4), 1, 2);
}

/* t in dtype dt and contiguous (itself when it already is). */
static nb_tensor *dense(nb_tensor *t, nb_dtype dt) { return nb_contiguous(nb_to_dtype(t, dt)); }

nb_tensor *nb_causal_attention_qkv(nb_tensor *qkv, int64_t n_head, double scale,
                                   double dropout_p, bool training, nb_generator *gen) {
    static const char *const OPQ = "causal_attention_qkv";
    NB__CHECK_ARG(qkv, OPQ, "qkv");
    if (!(qkv = nb__autocast(qkv, NB_AUTOCAST_LOW))) return NULL; /* nabla/autocast.h */
    const nb_device dev = nb__device_of(qkv);
    if (!nb_dtype_is_float(qkv->dtype))
        return nb__error(NB_EDTYPE, "%s: qkv has dtype %s; attention needs f32, f64, f16 or "
                         "bf16", OPQ, nb_dtype_name(qkv->dtype)), NULL;
    if (qkv->ndim != 3)
        return nb__error(NB_ESHAPE, "%s: qkv must be 3-D (batch, time, 3 * n_embd), got shape "
                         "%s", OPQ, NB__SHAPE(qkv)), NULL;
    if (n_head < 1)
        return nb__error(NB_EINVAL, "%s: n_head must be >= 1, got %lld", OPQ,
                         (long long)n_head), NULL;
    const int64_t B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3;
    if (qkv->shape[2] % (3 * n_head) != 0 || C == 0)
        return nb__error(NB_ESHAPE, "%s: the last dim of qkv %s must be 3 * n_head * head_dim "
                         "with head_dim >= 1 (n_head %lld)", OPQ, NB__SHAPE(qkv),
                         (long long)n_head), NULL;
    if (!check_scalars(OPQ, scale, dropout_p)) return NULL;
    const int64_t H = n_head, D = C / H;
    if (scale == 0) scale = 1.0 / sqrt((double)D);
    const nb_dtype dt = qkv->dtype, cdt = dt == NB_F64 ? NB_F64 : NB_F32;
    const nb_dtype iodt = io_dtype(dt, cdt, dev);
    const bool drop = training && dropout_p > 0;
    nb__attn_geom g = make_geom((int64_t[]){B, H, T, D}, H, scale, drop, dropout_p, gen);

    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_tensor *lse = NULL, *qc = dense(qkv, iodt), *out = NULL;
    nb_tensor *o = qc ? forward_core(&g, head_view(qc, 0, C, H), head_view(qc, 1, C, H),
                                     head_view(qc, 2, C, H), cdt, iodt, dev, OPQ, &lse)
                      : NULL;
    /* o's buffer is (B, T, H, D): merging the heads is a view */
    if (o) out = nb_reshape(nb_transpose(o, 1, 2), (int64_t[]){B, T, C}, 3);
    if (out && iodt != dt) out = nb_to_dtype(out, dt);
    nb_keep(out);
    nb_keep(lse);
    nb_scope_end();
    nb_set_grad_enabled(prev);
    nb__node *nd = out ? nb__record(out, NB__OP_ATTENTION_QKV, (nb_tensor *[]){qkv}, 1) : NULL;
    if (nd) {
        nb__save(nd, 0, qkv);
        nb__save(nd, 1, lse);
        save_attrs(nd, &g, drop);
        nd->attrs.i[3] = H;
        nd->attrs.ni = 4;
    }
    if (lse) nb_tensor_free(nb__scope_take(lse));
    return out;
}

/* The geometry a node saved, for its (B, H, T, D) shape and Hkv key/value heads. */
static nb__attn_geom saved_geom(const nb__node *n, const int64_t *shape, int64_t Hkv) {
    return (nb__attn_geom){.B = shape[0], .H = shape[1], .T = shape[2], .D = shape[3],
                           .Hkv = Hkv,
                           .scale = n->attrs.f[0], .p = n->attrs.f[1],
                           .seed = (uint64_t)n->attrs.i[0], .stream = (uint64_t)n->attrs.i[1],
                           .offset = (uint64_t)n->attrs.i[2]};
}

/* Runs the backward kernel of op: usable q, k, v, output gradient gc and gradients d[0..2]
 * (each may be NULL: not wanted), all of one dtype (bf16, or lse's), with row statistics
 * lse (on lse's device). */
static nb_status backward_core(const nb__attn_geom *g, nb_tensor *qc, nb_tensor *kc,
                               nb_tensor *vc, nb_tensor *lse, nb_tensor *gc,
                               nb_tensor *const d[3], const char *op) {
    if (!qc || !kc || !vc || !gc) return nb_last_status();
    nb_device dev;
    if (!nb__check_devices(op, (nb_tensor *[]){lse, gc}, 2, &dev)) return NB_EDEVICE;
    nb__attention_backward_args a = {.g = *g, .dtype = lse->dtype,
                                     .bf16 = qc->dtype == NB_BF16, .q = nb__ptr(qc),
                                     .k = nb__ptr(kc), .v = nb__ptr(vc), .lse = nb__ptr(lse),
                                     .dout = nb__ptr(gc)};
    strides3(qc, a.g.sq);
    strides3(kc, a.g.sk);
    strides3(vc, a.g.sv);
    strides3(gc, a.g.sdo);
    int64_t *sd[3] = {a.g.sdq, a.g.sdk, a.g.sdv};
    void **pd[3] = {&a.dq, &a.dk, &a.dv};
    for (int i = 0; i < 3; i++)
        if (d[i]) {
            strides3(d[i], sd[i]);
            *pd[i] = nb__ptr(d[i]);
        }
    return nb__run_attention_backward(dev, op, &a);
}

nb_status nb__bw_ATTENTION(nb__node *n, nb_tensor *gout, nb_tensor **gin) {
    nb_tensor *q = n->saved[0], *k = n->saved[1], *v = n->saved[2], *lse = n->saved[3];
    const nb_device dev = nb__device_of(lse);
    const nb_dtype cdt = io_dtype(q->dtype, lse->dtype, dev); /* of the operands */
    nb__attn_geom g = saved_geom(n, q->shape, k->shape[1]);
    nb_tensor *d[3] = {NULL, NULL, NULL};
    /* a contiguous input gets a contiguous gradient (a leaf can then take it over as is);
     * views get the (B, T, H, D) layout their transpose back to a fused qkv makes dense */
    for (int i = 0; i < 3; i++) {
        const int64_t *shape = n->saved[i]->shape; /* k, v: (B, Hkv, T, D) */
        if (wants(n, i) &&
            !(d[i] = nb_is_contiguous(n->saved[i]) ? nb__empty(shape, 4, cdt, dev)
                                                   : bthd(shape, cdt, dev)))
            return nb_last_status();
    }
    nb_status st = backward_core(&g, usable(q, cdt), usable(k, cdt), usable(v, cdt), lse,
                                 usable(gout, cdt), d, OP);
    if (st != NB_OK) return st;
    for (int i = 0; i < 3; i++) gin[i] = d[i];
    return NB_OK;
}

nb_status nb__bw_ATTENTION_QKV(nb__node *n, nb_tensor *gout, nb_tensor **gin) {
    nb_tensor *qkv = n->saved[0], *lse = n->saved[1];
    const nb_dtype cdt = io_dtype(qkv->dtype, lse->dtype, nb__device_of(lse)); /* operands */
    const int64_t B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3, H = n->attrs.i[3];
    nb__attn_geom g = saved_geom(n, (int64_t[]){B, H, T, C / H}, H);
    nb_tensor *qc = dense(qkv, cdt), *gc = dense(gout, cdt);
    /* every element is written */
    nb_tensor *dqkv = nb__empty(qkv->shape, 3, cdt, nb__device_of(lse));
    if (!qc || !gc || !dqkv) return nb_last_status();
    nb_tensor *d[3] = {head_view(dqkv, 0, C, H), head_view(dqkv, 1, C, H),
                       head_view(dqkv, 2, C, H)};
    if (!d[0] || !d[1] || !d[2]) return nb_last_status();
    nb_status st = backward_core(&g, head_view(qc, 0, C, H), head_view(qc, 1, C, H),
                                 head_view(qc, 2, C, H), lse, head_view(gc, 0, C, H), d,
                                 "causal_attention_qkv");
    if (st != NB_OK) return st;
    gin[0] = dqkv;
    return NB_OK;
}
