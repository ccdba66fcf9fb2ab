/* zero_bridge.c - the one thing a checkpoint asks nb_zero itself: which optimizer holds a ZeRO
 * run's state (the shard optimizer behind the user's). Everything about the layout comes from
 * the placements ZeRO sets on the parameters and on the shard optimizer's pieces. */
#include <stdio.h>
#include <string.h>

#include "io/dcp_impl.h"
#include "parallel/zero_impl.h"

static nb_zero *zero_of(nb_optim *user) {
    return user && user->sharded && user->step_ctx ? (nb_zero *)user->step_ctx : NULL;
}

/* The shard optimizer, which holds the state of a ZeRO run's user optimizer; NULL for any
 * other optimizer. */
nb_optim *dcp_zero_inner(nb_optim *user) {
    nb_zero *z = zero_of(user);
    if (!z || z->inner != user->sharded) return NULL;
    for (int i = 0; i < user->nparams; i++)
        if (user->params[i].has_state) return NULL;
    return z->inner;
}
