/* pipeline.c - the pipeline schedule engine (nabla/pipeline.h): the order of forward and
 * backward passes of each rank for GPipe, 1F1B and interleaved 1F1B, run over a stage
 * function with asynchronous sends of activations and gradients between the stages. Generic:
 * parallel/pipe_split.c (nb_pipeline) runs any model's stages on it, the GPT's among them. */
#include "nabla/nabla.h"
#include "nabla/pipeline.h"
#include "parallel/pipeline_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *nb_pipe_schedule_name(nb_pipe_schedule s) {
    switch (s) {
    case NB_PIPE_GPIPE: return "gpipe";
    case NB_PIPE_1F1B: return "1f1b";
    case NB_PIPE_INTERLEAVED: return "interleaved";
    }
    return "?";
}

nb_status nb_pipe_schedule_parse(const char *name, nb_pipe_schedule *out) {
    if (!name || !out) return nb_set_error(NB_ENULL, "nb_pipe_schedule_parse: NULL argument");
    for (int s = NB_PIPE_GPIPE; s <= NB_PIPE_INTERLEAVED; s++)
        if (strcmp(name, nb_pipe_schedule_name((nb_pipe_schedule)s)) == 0) {
            *out = (nb_pipe_schedule)s;
            return NB_OK;
        }
    return nb_set_error(NB_EINVAL, "pipeline schedule \"%s\" is not one of gpipe, 1f1b, "
                        "interleaved", name);
}

double nb_pipe_bubble_theory(nb_pipe_schedule s, int p, int m, int v) {
    if (p < 1 || m < 1 || v < 1) return NAN;
    if (s != NB_PIPE_INTERLEAVED) v = 1;
    /* Megatron-LM (Narayanan et al. 2021): bubble time / ideal time is (p-1)/(v m); as a
     * fraction of the step, (p-1) / (v m + p - 1). */
    return (double)(p - 1) / ((double)v * m + p - 1);
}

/* ---- the order of operations ------------------------------------------------------------- */
typedef struct op {
    bool fwd;
    int chunk, micro;
} op;

/* Megatron's interleaved order: the k-th forward (or backward) of a rank. */
static op interleaved_op(int k, bool fwd, int p, int v) {
    int group = k % (p * v), chunk = group / p;
    op o = {.fwd = fwd, .chunk = fwd ? chunk : v - 1 - chunk, .micro = (k / (p * v)) * p + k % p};
    return o;
}

/* ops[2 m v]: rank r's sequence. */
static void build_schedule(nb_pipe_schedule s, int p, int r, int m, int v, bool fwd_only,
                           op *ops) {
    int n = 0;
    if (fwd_only) { /* m v forwards, chunk by chunk: every input is computed before it is needed */
        for (int c = 0; c < v; c++)
            for (int i = 0; i < m; i++) ops[n++] = (op){true, c, i};
        return;
    }
    if (s == NB_PIPE_GPIPE) {
        for (int c = 0; c < v; c++)
            for (int i = 0; i < m; i++) ops[n++] = (op){true, c, i};
        for (int c = v - 1; c >= 0; c--)
            for (int i = 0; i < m; i++) ops[n++] = (op){false, c, i};
        return;
    }
    if (s == NB_PIPE_1F1B || v == 1) {
        /* v == 1 here (nb_pipe_run and nb_pipeline_new refuse 1F1B with v > 1; interleaved
         * with v == 1 is 1F1B). */
        int warm = p - r - 1 < m ? p - r - 1 : m;
        for (int i = 0; i < warm; i++) ops[n++] = (op){true, 0, i};
        for (int i = 0; i < m - warm; i++) {
            ops[n++] = (op){true, 0, warm + i};
            ops[n++] = (op){false, 0, i};
        }
        for (int i = m - warm; i < m; i++) ops[n++] = (op){false, 0, i};
        return;
    }
    const int total = m * v;
    int warm = (p - r - 1) * 2 + (v - 1) * p;
    if (warm > total) warm = total;
    for (int k = 0; k < warm; k++) ops[n++] = interleaved_op(k, true, p, v);
    for (int k = 0; k < total - warm; k++) {
        ops[n++] = interleaved_op(warm + k, true, p, v);
        ops[n++] = interleaved_op(k, false, p, v);
    }
    for (int k = total - warm; k < total; k++) ops[n++] = interleaved_op(k, false, p, v);
}

/* ---- the run ------------------------------------------------------------------------------ */
typedef struct pending {
    nb_work *w;
    nb_tensor *keep; /* owned; freed once the send is done */
} pending;

typedef struct run {
    nb_comm *pp;
    const nb_pipe_opts *o;
    int p, r, m, v, S;
    nb_tensor **in, **out;    /* [chunk * m + micro], owned references */
    nb_tensor **mail;         /* [2][S][m]: transfers between stages of this rank (p == 1) */
    pending *sends;
    int n_sends, cap_sends;
    double wait_s, compute_s;
    int64_t live, peak_live;
    /* the next operation's receive, posted before this one computes (overlap) */
    const op *ops;
    int n_ops, posted_at; /* posted_at: that operation's index, -1 none */
    nb_tensor *posted;
    nb_work *posted_w;
    /* activations whose shape travels with them (o->act_shape NULL): the posted receive is
     * the header, the data receive is posted once it arrived */
    bool dynamic;
    int64_t header[2 + NB_MAX_DIMS];
    const nb__pipe_hooks *hooks;
    int last_backward; /* index of this rank's last backward operation, -1 none */
} run;

/* kinds of message: 0 activation, 1 gradient, 2 an activation's header (dynamic shapes) */
static int tag_of(const run *R, int kind, int s, int micro) {
    return (kind * R->S + s) * R->m + micro;
}

/* A new tensor this code owns (whatever scope the caller is in). */
static nb_tensor *owned(nb_tensor *t) {
    if (t) nb_tensor_retain(t);
    return t;
}

static nb_status send_to(run *R, nb_tensor *t, int dst_stage, int kind, int micro) {
    int dst = dst_stage % R->p, tag = tag_of(R, kind, dst_stage, micro);
    if (dst == R->r) { /* the next stage is ours (p == 1): hand over a copy */
        nb_scope_begin();
        nb_tensor *c = owned(nb_clone(nb_detach(t)));
        nb_scope_end();
        if (!c) return nb_last_status();
        R->mail[tag] = c;
        return NB_OK;
    }
    if (R->n_sends == R->cap_sends) {
        int cap = R->cap_sends ? 2 * R->cap_sends : 16;
        pending *s = realloc(R->sends, sizeof *s * (size_t)cap);
        if (!s) return nb_set_error(NB_ENOMEM, "pipeline: out of memory");
        R->sends = s;
        R->cap_sends = cap;
    }
    if (R->dynamic && kind == 0) { /* the shape and dtype first: the receiver allocates */
        int64_t h[2 + NB_MAX_DIMS] = {nb_ndim(t), nb_tensor_dtype(t)};
        for (int i = 0; i < nb_ndim(t); i++) h[2 + i] = nb_size(t, i);
        nb_scope_begin();
        nb_tensor *ht = owned(nb_from_buffer(h, (int64_t[]){2 + NB_MAX_DIMS}, 1, NB_I64));
        nb_scope_end();
        nb_work *hw = ht ? nb_send_async(R->pp, ht, dst, tag_of(R, 2, dst_stage, micro)) : NULL;
        if (!hw) {
            nb_tensor_free(ht);
            return nb_last_status();
        }
        R->sends[R->n_sends++] = (pending){hw, ht};
        if (R->n_sends == R->cap_sends) {
            pending *ns = realloc(R->sends, sizeof *ns * (size_t)(2 * R->cap_sends));
            if (!ns) return nb_set_error(NB_ENOMEM, "pipeline: out of memory");
            R->sends = ns;
            R->cap_sends *= 2;
        }
    }
    nb_work *w = nb_send_async(R->pp, t, dst, tag);
    if (!w) return nb_last_status();
    R->sends[R->n_sends++] = (pending){w, nb_tensor_retain(t)};
    return NB_OK;
}

/* What operation o receives: from which stage, for which stage, activation (kind 0) or
 * gradient (kind 1). False when it receives nothing. */
static bool recv_of(const run *R, op o, int *src_stage, int *s, int *kind) {
    *s = o.chunk * R->p + R->r;
    *kind = o.fwd ? 0 : 1;
    *src_stage = o.fwd ? *s - 1 : *s + 1;
    return *src_stage >= 0 && *src_stage < R->S;
}

/* Post operation i's receive from another rank (if it has one) so that it arrives while
 * this rank computes the operation before it. */
static nb_status post_recv(run *R, int i) {
    int src_stage, s, kind;
    if (i >= R->n_ops || R->posted_at >= 0 || !recv_of(R, R->ops[i], &src_stage, &s, &kind) ||
        src_stage % R->p == R->r)
        return NB_OK;
    nb_scope_begin();
    nb_tensor *t;
    if (!R->dynamic) { /* the shape every activation has */
        t = owned(nb_empty(R->o->act_shape, R->o->act_ndim, R->o->act_dtype));
    } else if (kind == 1) { /* a gradient has the shape of this stage's output */
        nb_tensor *out = R->out[R->ops[i].chunk * R->m + R->ops[i].micro];
        t = out ? owned(nb_empty_on(nb_tensor_device(out), nb_shape(out), nb_ndim(out),
                                    nb_tensor_dtype(out)))
                : NULL;
        if (!out) nb_set_error(NB_ESTATE, "pipeline: a gradient for an output never computed");
    } else { /* an activation: its header first */
        t = owned(nb_from_buffer(R->header, (int64_t[]){2 + NB_MAX_DIMS}, 1, NB_I64));
        kind = 2;
    }
    nb_scope_end();
    nb_work *w = t ? nb_recv_async(R->pp, t, src_stage % R->p, tag_of(R, kind, s, R->ops[i].micro))
                   : NULL;
    if (!w) {
        nb_tensor_free(t);
        return nb_last_status();
    }
    R->posted_at = i;
    R->posted = t;
    R->posted_w = w;
    return NB_OK;
}

/* Operation i's input: the activation or gradient from the neighbouring stage. */
static nb_tensor *recv_for(run *R, int i) {
    int src_stage, s, kind;
    recv_of(R, R->ops[i], &src_stage, &s, &kind);
    const int micro = R->ops[i].micro, tag = tag_of(R, kind, s, micro);
    if (src_stage % R->p == R->r) {
        nb_tensor *t = R->mail[tag];
        R->mail[tag] = NULL;
        if (!t) nb_set_error(NB_ESTATE, "pipeline: stage %d expected micro-batch %d from itself", s,
                             micro);
        return t;
    }
    if (R->posted_at != i && post_recv(R, i) != NB_OK) return NULL;
    double t0 = nb_time_s();
    nb_status st = nb_work_wait(R->posted_w);
    R->wait_s += nb_time_s() - t0;
    nb_tensor *t = R->posted;
    R->posted_at = -1;
    R->posted = NULL;
    R->posted_w = NULL;
    if (st != NB_OK) {
        nb_tensor_free(t);
        return NULL;
    }
    if (R->dynamic && kind == 0) { /* t is the header: now the activation itself */
        int64_t h[2 + NB_MAX_DIMS];
        st = nb_read(t, h, 2 + NB_MAX_DIMS, NB_I64);
        nb_tensor_free(t);
        t = NULL;
        if (st != NB_OK) return NULL;
        if (h[0] < 0 || h[0] > NB_MAX_DIMS || h[1] < 0 || h[1] >= NB_DTYPE_COUNT) {
            nb_set_error(NB_ECOMM, "pipeline: stage %d sent a malformed activation header", s - 1);
            return NULL;
        }
        nb_scope_begin();
        t = owned(nb_empty(h + 2, (int)h[0], (nb_dtype)h[1]));
        nb_scope_end();
        nb_work *w = t ? nb_recv_async(R->pp, t, src_stage % R->p, tag) : NULL;
        st = w ? nb_work_wait(w) : nb_last_status();
        R->wait_s += nb_time_s() - t0;
        if (st != NB_OK) {
            nb_tensor_free(t);
            return NULL;
        }
    }
    return t;
}

static nb_status do_forward(run *R, nb_pipe_stage_fn fn, void *ctx, int i, double *loss_sum) {
    const op o = R->ops[i];
    const int s = o.chunk * R->p + R->r, k = o.chunk * R->m + o.micro;
    nb_tensor *in = NULL;
    if (s > 0) {
        if (!(in = recv_for(R, i))) return nb_last_status();
        nb_status st = R->o->forward_only ? NB_OK : nb_set_requires_grad(in, true);
        if (st != NB_OK) {
            nb_tensor_free(in);
            return st;
        }
    }
    nb_status pst = post_recv(R, i + 1);
    if (pst != NB_OK) {
        nb_tensor_free(in);
        return pst;
    }
    double t0 = nb_time_s();
    nb_scope_begin();
    nb_tensor *out = owned(fn(ctx, o.chunk, o.micro, in));
    nb_scope_end();
    R->compute_s += nb_time_s() - t0;
    R->in[k] = in;
    R->out[k] = out;
    if (!out) {
        if (nb_last_status() == NB_OK)
            nb_set_error(NB_EINVAL, "pipeline: the stage function gave no output (stage %d, "
                         "micro-batch %d)", s, o.micro);
        return nb_last_status();
    }
    if (++R->live > R->peak_live) R->peak_live = R->live;
    nb_status st = NB_OK;
    if (s == R->S - 1) {
        if (nb_numel(out) != 1)
            return nb_set_error(NB_ESHAPE, "pipeline: the last stage must return the loss (one "
                                "element), got %lld elements", (long long)nb_numel(out));
        *loss_sum += nb_item_f64(out);
    } else {
        st = send_to(R, out, s + 1, 0, o.micro);
    }
    if (R->o->forward_only) { /* nothing to go back through: drop it now (a send keeps its own) */
        nb_tensor_free(R->in[k]);
        nb_tensor_free(R->out[k]);
        R->in[k] = R->out[k] = NULL;
        R->live--;
    }
    return st;
}

static nb_status do_backward(run *R, int i) {
    const op o = R->ops[i];
    const int s = o.chunk * R->p + R->r, k = o.chunk * R->m + o.micro;
    nb_tensor *grad;
    if (s == R->S - 1) {
        nb_scope_begin();
        grad = owned(nb_full_like(R->out[k], R->o->loss_scale / R->m));
        nb_scope_end();
    } else {
        grad = recv_for(R, i);
    }
    if (!grad) return nb_last_status();
    if (R->hooks && R->hooks->before_backward) {
        nb_status hs = R->hooks->before_backward(R->hooks->ctx, o.chunk, o.micro,
                                                 i == R->last_backward);
        if (hs != NB_OK) {
            nb_tensor_free(grad);
            return hs;
        }
    }
    nb_status pst = post_recv(R, i + 1);
    if (pst != NB_OK) {
        nb_tensor_free(grad);
        return pst;
    }
    double t0 = nb_time_s();
    nb_backward_opts bo = nb_backward_defaults();
    bo.grad_output = grad;
    nb_status st = nb_backward_ex(R->out[k], &bo);
    R->compute_s += nb_time_s() - t0;
    nb_tensor_free(grad);
    nb_tensor_free(R->out[k]); /* the graph goes with it */
    R->out[k] = NULL;
    R->live--;
    if (st == NB_OK && s > 0) {
        nb_tensor *g = nb_grad(R->in[k]);
        st = g ? send_to(R, g, s - 1, 1, o.micro)
               : nb_set_error(NB_ESTATE, "pipeline: stage %d's input got no gradient", s);
    }
    nb_tensor_free(R->in[k]); /* a pending send keeps the gradient alive */
    R->in[k] = NULL;
    return st;
}

nb_pipe_opts nb_pipe_defaults(void) {
    return (nb_pipe_opts){._init = NB__OPTS_MARK(nb_pipe_opts),
                          .schedule = NB_PIPE_1F1B,
                          .n_micro = 1,
                          .virtual_stages = 1,
                          .act_dtype = NB_F32,
                          .loss_scale = 1.0};
}

double nb_pipe_run(nb_comm *pp, const nb_pipe_opts *o, nb_pipe_stage_fn fn, void *ctx,
                   nb_pipe_stats *stats) {
    return nb__pipe_run(pp, o, fn, ctx, stats, NULL);
}

double nb__pipe_run(nb_comm *pp, const nb_pipe_opts *o, nb_pipe_stage_fn fn, void *ctx,
                    nb_pipe_stats *stats, const nb__pipe_hooks *hooks) {
    if (stats) *stats = (nb_pipe_stats){.bubble = NAN, .bubble_theory = NAN};
    if (!pp || !o || !fn) {
        nb_set_error(NB_ENULL, "nb_pipe_run: needs a communicator, options and a stage function");
        return NAN;
    }
    if (NB__OPTS_CHECK(o, nb_pipe_opts, "nb_pipe_run", "nb_pipe_defaults()", "o.n_micro = 8") !=
        NB_OK)
        return NAN;
    /* Read as written: a 0 here is a mistake (an options struct not started from
     * nb_pipe_defaults()), not a request for the default. */
    if (o->virtual_stages < 1 || !(o->loss_scale > 0) || isinf(o->loss_scale)) {
        nb_set_error(NB_EINVAL, "nb_pipe_run: virtual_stages must be >= 1 and loss_scale "
                     "positive and finite, got %d and %g (start from nb_pipe_defaults(): 1 "
                     "and 1)", o->virtual_stages, o->loss_scale);
        return NAN;
    }
    run R = {.pp = pp, .o = o, .p = nb_comm_size(pp), .r = nb_comm_rank(pp), .m = o->n_micro,
             .v = o->virtual_stages, .posted_at = -1, .hooks = hooks, .last_backward = -1};
    R.S = R.p * R.v;
    R.dynamic = !o->act_shape;
    if (R.m < 1 || (o->schedule == NB_PIPE_1F1B && R.v > 1) ||
        (o->schedule == NB_PIPE_INTERLEAVED && R.v > 1 && R.m % R.p) ||
        (o->act_shape && o->act_ndim < 1)) {
        nb_set_error(NB_EINVAL, "nb_pipe_run: bad options: %d micro-batches, %d virtual stages, "
                     "schedule %s over %d ranks (1f1b needs 1 virtual stage, interleaved a "
                     "multiple of the ranks as micro-batches)",
                     R.m, R.v, nb_pipe_schedule_name(o->schedule), R.p);
        return NAN;
    }
    if (3L * R.S * R.m > 32767L) {
        nb_set_error(NB_EINVAL, "nb_pipe_run: %d stages x %d micro-batches exceed the message "
                     "tags MPI guarantees", R.S, R.m);
        return NAN;
    }
    const int n_ops = (o->forward_only ? 1 : 2) * R.m * R.v;
    op *ops = malloc(sizeof *ops * (size_t)n_ops);
    R.in = calloc((size_t)R.m * R.v, sizeof *R.in);
    R.out = calloc((size_t)R.m * R.v, sizeof *R.out);
    R.mail = calloc((size_t)2 * R.S * R.m, sizeof *R.mail);
    double loss_sum = 0, t_start = nb_time_s();
    nb_status st = ops && R.in && R.out && R.mail
                       ? NB_OK
                       : nb_set_error(NB_ENOMEM, "nb_pipe_run: out of memory");
    if (st == NB_OK) build_schedule(o->schedule, R.p, R.r, R.m, R.v, o->forward_only, ops);
    for (int i = 0; st == NB_OK && i < n_ops; i++)
        if (!ops[i].fwd) R.last_backward = i;
    R.ops = ops;
    R.n_ops = n_ops;
    const bool grad_was = o->forward_only ? nb_set_grad_enabled(false) : false;
    for (int i = 0; st == NB_OK && i < n_ops; i++)
        st = ops[i].fwd ? do_forward(&R, fn, ctx, i, &loss_sum) : do_backward(&R, i);
    if (o->forward_only) nb_set_grad_enabled(grad_was);
    double t0 = nb_time_s();
    if (R.posted_w) { /* only after an error: let the posted receive finish or time out */
        nb_work_wait(R.posted_w);
        nb_tensor_free(R.posted);
    }
    for (int i = 0; i < R.n_sends; i++) {
        nb_status ws = nb_work_wait(R.sends[i].w);
        if (st == NB_OK) st = ws;
        nb_tensor_free(R.sends[i].keep);
    }
    R.wait_s += nb_time_s() - t0;
    for (int i = 0; R.in && R.out && i < R.m * R.v; i++) {
        nb_tensor_free(R.in[i]);
        nb_tensor_free(R.out[i]);
    }
    for (int i = 0; R.mail && i < 2 * R.S * R.m; i++) nb_tensor_free(R.mail[i]);
    free(R.sends);
    free(ops);
    free(R.in);
    free(R.out);
    free(R.mail);
    if (st != NB_OK) return NAN;

    /* The loss from the last stage and the mean compute time, in one allreduce, which also
     * ends the step together on every rank: the bubble is the idle share of that common step
     * (a rank that finishes early is idle until the last one does). */
    double loss = NAN;
    nb_scope_begin();
    double v2[2] = {R.r == (R.S - 1) % R.p ? loss_sum / R.m : 0, R.compute_s / R.p};
    nb_tensor *t = nb_from_buffer(v2, (int64_t[]){2}, 1, NB_F64);
    st = t ? nb_allreduce(pp, t, NB_REDUCE_SUM) : nb_last_status();
    if (st == NB_OK) st = nb_read(t, v2, 2, NB_F64);
    /* The step's time is the longest rank's: a rank that started late (busy before the step)
     * would otherwise see the others' compute in less time than it took. */
    double common_s = nb_time_s() - t_start;
    nb_tensor *c = st == NB_OK ? nb_from_buffer(&common_s, (int64_t[]){1}, 1, NB_F64) : NULL;
    if (st == NB_OK) st = c ? nb_allreduce(pp, c, NB_REDUCE_MAX) : nb_last_status();
    if (st == NB_OK) st = nb_read(c, &common_s, 1, NB_F64);
    nb_scope_end();
    if (st != NB_OK) return NAN;
    const double bubble = common_s > 0 ? 1.0 - v2[1] / common_s : 0;
    loss = v2[0];
    if (stats) {
        stats->step_s = common_s;
        stats->compute_s = R.compute_s;
        stats->wait_s = R.wait_s;
        stats->bubble = bubble;
        stats->bubble_theory = nb_pipe_bubble_theory(o->schedule, R.p, R.m, R.v);
        stats->peak_live_micro = R.peak_live;
    }
    return loss;
}
