/* topology.c - the 3D topology of nabla/tp.h: world = dp x pp x tp, tensor-parallel ranks
 * adjacent (global rank = (pp_rank * dp + dp_rank) * tp + tp_rank), and its groups, built
 * once with nb_comm_split. */
#include <stdio.h>
#include <stdlib.h>

#include "nabla/tp.h"
#include "tensor/error.h"

struct nb_topology {
    nb_comm *world; /* borrowed */
    nb_comm *dp, *pp, *tp, *emb;
    int dp_size, pp_size, tp_size;
    int dp_rank, pp_rank, tp_rank;
    char desc[64];
};

nb_topology_opts nb_topology_defaults(void) { return (nb_topology_opts){.dp = 0, .pp = 1, .tp = 1}; }

nb_topology *nb_topology_new(nb_comm *world, const nb_topology_opts *o) {
    nb_topology_opts d = o ? *o : nb_topology_defaults();
    if (!world) {
        nb__error(NB_ENULL, "topology: world communicator is NULL");
        return NULL;
    }
    const int W = nb_comm_size(world), r = nb_comm_rank(world);
    if (d.tp < 1 || d.pp < 1 || d.dp < 0) {
        nb__error(NB_EINVAL, "topology: tp (%d) and pp (%d) must be >= 1 and dp (%d) >= 0 "
                  "(0: inferred)", d.tp, d.pp, d.dp);
        return NULL;
    }
    if (d.dp == 0 && W % (d.tp * d.pp) != 0) {
        nb__error(NB_EINVAL, "topology: the world size %d is not dp x pp x tp: it does not divide "
                  "by pp x tp = %d x %d", W, d.pp, d.tp);
        return NULL;
    }
    if (d.dp > 0 && d.dp * d.pp * d.tp != W) {
        nb__error(NB_EINVAL, "topology: the world size %d is not dp x pp x tp = %d x %d x %d", W,
                  d.dp, d.pp, d.tp);
        return NULL;
    }
    if (d.dp == 0) d.dp = W / (d.tp * d.pp);
    nb_topology *t = calloc(1, sizeof *t);
    if (!t) {
        nb__error(NB_ENOMEM, "topology: out of memory");
        return NULL;
    }
    t->world = world;
    t->dp_size = d.dp;
    t->pp_size = d.pp;
    t->tp_size = d.tp;
    t->tp_rank = r % d.tp;
    t->dp_rank = (r / d.tp) % d.dp;
    t->pp_rank = r / (d.tp * d.dp);
    /* tp: same (pp, dp); dp: same (pp, tp); pp: same (dp, tp). Keys keep the group order. */
    t->tp = nb_comm_split(world, t->pp_rank * d.dp + t->dp_rank, t->tp_rank);
    t->dp = t->tp ? nb_comm_split(world, t->pp_rank * d.tp + t->tp_rank, t->dp_rank) : NULL;
    t->pp = t->dp ? nb_comm_split(world, t->dp_rank * d.tp + t->tp_rank, t->pp_rank) : NULL;
    const bool end_stage = t->pp_rank == 0 || t->pp_rank == d.pp - 1;
    t->emb = t->pp ? nb_comm_split(world, end_stage ? t->dp_rank * d.tp + t->tp_rank : d.dp * d.tp + r,
                                   t->pp_rank)
                   : NULL;
    if (!t->emb) {
        nb_topology_free(t);
        return NULL;
    }
    if (!end_stage) {
        nb_comm_free(t->emb);
        t->emb = NULL;
    }
    snprintf(t->desc, sizeof t->desc, "dp=%d pp=%d tp=%d", d.dp, d.pp, d.tp);
    return t;
}

void nb_topology_free(nb_topology *t) {
    if (!t) return;
    nb_comm_free(t->emb);
    nb_comm_free(t->pp);
    nb_comm_free(t->dp);
    nb_comm_free(t->tp);
    free(t);
}

int nb_topology_dp_size(const nb_topology *t) { return t ? t->dp_size : 0; }
int nb_topology_pp_size(const nb_topology *t) { return t ? t->pp_size : 0; }
int nb_topology_tp_size(const nb_topology *t) { return t ? t->tp_size : 0; }
int nb_topology_dp_rank(const nb_topology *t) { return t ? t->dp_rank : -1; }
int nb_topology_pp_rank(const nb_topology *t) { return t ? t->pp_rank : -1; }
int nb_topology_tp_rank(const nb_topology *t) { return t ? t->tp_rank : -1; }
nb_comm *nb_topology_world(const nb_topology *t) { return t ? t->world : NULL; }
nb_comm *nb_topology_dp(const nb_topology *t) { return t ? t->dp : NULL; }
nb_comm *nb_topology_pp(const nb_topology *t) { return t ? t->pp : NULL; }
nb_comm *nb_topology_tp(const nb_topology *t) { return t ? t->tp : NULL; }
nb_comm *nb_topology_embedding(const nb_topology *t) { return t ? t->emb : NULL; }
const char *nb_topology_describe(const nb_topology *t) { return t ? t->desc : "(null)"; }
