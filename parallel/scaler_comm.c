/* scaler_comm.c - the loss scaler's global inf/NaN flag (nb_grad_scaler_set_comm,
 * nabla/parallel.h): one allreduce (max) of a one-element f64 tensor per unscale. The
 * scaler itself is in optim/scaler.c, below this layer; it calls back here. */
#include "nabla/parallel.h"
#include "optim/optim_impl.h"

static nb_status reduce_flag(double *flag, void *ctx) {
    nb_comm *c = ctx;
    nb_scope_begin();
    nb_tensor *t = nb_full_on(NB_CPU, (int64_t[]){1}, 1, NB_F64, *flag);
    nb_status st = t ? nb_allreduce(c, t, NB_REDUCE_MAX) : nb_last_status();
    if (st == NB_OK) st = nb_read(t, flag, 1, NB_F64);
    nb_scope_end();
    return st;
}

nb_status nb_grad_scaler_set_comm(nb_grad_scaler *s, nb_comm *c) {
    if (!s) return nb__error(NB_ENULL, "grad_scaler_set_comm: scaler is NULL");
    s->reduce_flag = c ? reduce_flag : NULL;
    s->reduce_ctx = c;
    return NB_OK;
}
