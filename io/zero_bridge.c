/* zero_bridge.c - transitional: the layout of a ZeRO run read from nb_zero itself, for as long
 * as nb_zero does not put placements on its shards (the parallel-model issue's reducer sets
 * {NB_PLACE_SHARD, "dp", NB_PLACE_FLAT, offset, length} on each piece and the shard fields of
 * tensor/place.h on the model's parameters; dcp_plan.c reads those first and comes here only
 * when they are missing). Remove this file once they are set. */
#include <stdio.h>
#include <string.h>

#include "io/dcp_impl.h"
#include "parallel/zero_impl.h"

static nb_zero *zero_of(nb_optim *user) {
    return user && user->sharded && user->step_ctx ? (nb_zero *)user->step_ctx : NULL;
}

/* The shard optimizer holds the state, unless it was gathered into the user's optimizer
 * (nb_zero_gather_optim_state, for the GPT's own tensor-parallel and pipeline checkpoints,
 * which one rank per replica writes): then the user's is an ordinary, whole optimizer. */
nb_optim *dcp_zero_inner(nb_optim *user) {
    nb_zero *z = zero_of(user);
    if (!z || z->inner != user->sharded) return NULL;
    for (int i = 0; i < user->nparams; i++)
        if (user->params[i].has_state) return NULL;
    return z->inner;
}

nb_status dcp_zero_world(nb_optim *user, dcp_world *w) {
    nb_zero *z = zero_of(user);
    if (!z) return nb__error(NB_EINTERNAL, "checkpoint: no nb_zero behind the optimizer");
    w->comm = z->c;
    w->rank = z->rank, w->size = z->size;
    w->zero = true;
    w->zuser = user;
    snprintf(w->layout, sizeof w->layout, "zero-%d dp=%d", z->stage, z->size);
    return NB_OK;
}

nb_status dcp_zero_flat(nb_optim *user, nb_tensor *t, bool values, bool *flat, int64_t *flo,
                        int64_t *fn, int *ndim, int64_t *shape, nb_tensor **src) {
    nb_zero *z = zero_of(user);
    *flat = false, *src = NULL;
    if (!z) return NB_OK;
    for (int j = 0; j < z->npieces; j++)
        if (z->pieces[j] == t) { /* a piece of the shard optimizer */
            const nb_tensor *param = z->p[z->piece_param[j]].t;
            *flat = true;
            *flo = z->piece_lo[j], *fn = nb_numel(t);
            *ndim = param->ndim;
            memcpy(shape, param->shape, sizeof param->shape);
            return NB_OK;
        }
    if (!values || z->stage != 3) return NB_OK;
    for (int i = 0; i < z->np; i++) {
        if (z->p[i].t != t) continue;
        const zparam *p = &z->p[i];
        const zbucket *bk = &z->b[p->bucket];
        int64_t lo = p->off > bk->cb ? p->off : bk->cb;
        int64_t hi = p->off + p->n < bk->ce ? p->off + p->n : bk->ce;
        *flat = true;
        *ndim = t->ndim;
        memcpy(shape, t->shape, sizeof t->shape);
        *flo = lo < hi ? lo - p->off : 0, *fn = lo < hi ? hi - lo : 0;
        if (lo < hi) {
            *src = nb__scope_take(nb_narrow(z->shard_p, 0, bk->soff + (lo - bk->cb), hi - lo));
            if (!*src) return nb_last_status();
        }
        return NB_OK;
    }
    return NB_OK;
}
