/* ddp.c - distributed data parallel (nb_ddp, see nabla/parallel.h): the gradient reducer of
 * parallel/reducer.c with its allreduce policy - each bucket of the flat gradient buffer is
 * averaged in place over the ranks as soon as backward completes it, and the end of backward
 * waits for the rest, so the gradients are averaged when nb_backward returns. This file adds
 * what is DDP's own: the options, the check that every rank wraps the same model, and the
 * broadcast of rank 0's parameters and buffers at wrap time. */
#include <stdlib.h>

#include "nabla/parallel.h"
#include "parallel/reducer.h"
#include "tensor/tensor_impl.h"

struct nb_ddp {
    nb_module *m;
    nb_comm *c;
    nb_ddp_opts o;
    nb__reducer *r;
};

nb_ddp_opts nb_ddp_defaults(void) {
    return (nb_ddp_opts){
        ._init = NB__OPTS_MARK(nb_ddp_opts), .bucket_mb = 25, .reduce_dtype = NB_F32};
}

void nb_ddp_free(nb_ddp *d) {
    if (!d) return;
    nb__reducer_free(d->r);
    free(d);
}

nb_ddp *nb_ddp_new(nb_module *model, nb_comm *c, const nb_ddp_opts *o) {
    if (!model) return nb__error(NB_ENULL, "ddp_new: model is NULL"), NULL;
    if (!c) return nb__error(NB_ENULL, "ddp_new: communicator is NULL"), NULL;
    if (o &&
        NB__OPTS_CHECK(o, nb_ddp_opts, "ddp_new", "nb_ddp_defaults()", "o.bucket_mb = 50") != NB_OK)
        return NULL;
    nb_ddp_opts opts = o ? *o : nb_ddp_defaults();
    if (!(opts.bucket_mb >= 0))
        return nb__error(NB_EINVAL, "ddp_new: bucket_mb must be >= 0, got %g", opts.bucket_mb),
               NULL;
    if (opts.reduce_dtype != NB_F32 && opts.reduce_dtype != NB_F16 &&
        opts.reduce_dtype != NB_BF16)
        return nb__error(NB_EINVAL, "ddp_new: reduce_dtype must be f32 (the gradients' own "
                         "dtype), f16 or bf16 (compressed), got %s",
                         nb_dtype_name(opts.reduce_dtype)), NULL;
    nb_ddp *d = calloc(1, sizeof *d);
    if (!d) return nb__error(NB_ENOMEM, "ddp_new: out of memory"), NULL;
    d->m = model, d->c = c, d->o = opts;
    nb__reducer_cfg cfg = {.policy = NB__RED_ALLREDUCE, .bucket_mb = opts.bucket_mb,
                           .find_unused = opts.find_unused, .reduce_dtype = opts.reduce_dtype,
                           .who = "ddp"};
    d->r = nb__reducer_new(model, c, &cfg);
    nb_status s = d->r ? nb__reducer_check_same(d->r, NULL, NULL, 0) : nb_last_status();
    if (s == NB_OK && nb_comm_size(c) > 1 && !opts.no_broadcast) {
        /* Every rank starts from rank 0's weights and buffers (e.g. running statistics). */
        s = nb_broadcast(c, nb_module_flat_params(model), 0);
        const nb_params *bs = s == NB_OK ? nb_buffers(model) : NULL;
        if (s == NB_OK && !bs) s = nb_last_status();
        for (int i = 0; s == NB_OK && i < bs->count; i++) s = nb_broadcast(c, bs->tensors[i], 0);
    }
    if (s != NB_OK) {
        nb_ddp_free(d);
        return NULL;
    }
    return d;
}

nb_status nb_ddp_sync(nb_ddp *d) {
    if (!d) return nb__error(NB_ENULL, "ddp_sync: ddp is NULL");
    return nb__reducer_sync(d->r);
}

void nb_ddp_set_sync_enabled(nb_ddp *d, bool enabled) {
    if (d) nb__reducer_set_sync(d->r, enabled);
}

double nb_ddp_exposed_comm_s(const nb_ddp *d) { return d ? nb__reducer_exposed_s(d->r) : 0.0; }

int nb_ddp_num_buckets(const nb_ddp *d) { return d ? nb__reducer_num_buckets(d->r) : 0; }

int64_t nb_ddp_comm_bytes(const nb_ddp *d) { return d ? nb__reducer_comm_bytes(d->r) : 0; }

/* For tests (declared there): buckets whose allreduce has started in the current step; once
 * the step is finished, in that step (until the next backward reaches the model). */
int nb__ddp_buckets_launched(const nb_ddp *d);
int nb__ddp_buckets_launched(const nb_ddp *d) { return d ? nb__reducer_launched(d->r) : 0; }
