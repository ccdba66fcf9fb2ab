/* dcp_layouts.h - the table of parallel layouts the checkpoint tests (test_dcp.c,
 * test_dcp_bad.c) save from and load into: the same small model (8 -> 16 -> 16 -> 4, AdamW
 * with a decay and a no-decay group, a cosine schedule) in every layout that exists on this
 * branch. Each layout is built on every rank; a rank that takes no part in it (one process,
 * half the ranks) has active false and nothing else. */
#ifndef NABLA_TEST_DCP_LAYOUTS_H
#define NABLA_TEST_DCP_LAYOUTS_H

#include <stdbool.h>

#include "mpi_test.h"

typedef enum {
    L_ONE,    /* rank 0 alone, no placements: a plain file */
    L_DDP,    /* every rank, nb_ddp, the checkpoint's comm the world: rank 0's plain file */
    L_Z1,     /* nb_zero stage 1 over the world */
    L_Z2,     /* stage 2 */
    L_Z3,     /* stage 3 (parameters sharded too) */
    L_Z3H,    /* stage 3 over the first half of the ranks */
    L_TP,     /* nb_parallelize over a "dp tp" mesh (tp 2 where the world is even) */
    L_TPB,    /* the same with a fused layer split in 2 blocks (state only: not trained) */
    L_FLAT,   /* placements set by hand as the reducer will: the optimizer over flat pieces
               * {shard "dp" flat} of replicated parameters (state only) */
    L_TPFLAT, /* flat pieces over dp of L_TPB's tensor-parallel (blocked) parameters */
    L_COUNT
} dcp_kind_t;

extern const char *const dcp_layout_names[L_COUNT];
/* Whether the layout trains (the others hold state only: tests load and save them). */
bool dcp_layout_trains(dcp_kind_t k);

typedef struct dcp_layout {
    dcp_kind_t k;
    bool active;
    nb_comm *comm;   /* the ranks taking part (owned when split), NULL for one process */
    nb_mesh *mesh;
    nb_module *m;
    nb_optim *o;     /* the user's optimizer (the checkpoint's) */
    nb_sched *s;
    nb_zero *z;
    nb_ddp *d;
    nb_optim *inner; /* the optimizer holding the state (ZeRO's shard optimizer, the hand
                      * layouts' piece optimizer, or o) */
    int rank, size;  /* in comm */
} dcp_layout;

/* Build layout k (collective over the world) from seed's weights. */
void dcp_layout_build(dcp_layout *l, dcp_kind_t k, uint64_t seed);
void dcp_layout_free(dcp_layout *l);
/* The checkpoint of l (program "test"). */
nb_checkpoint dcp_layout_ck(dcp_layout *l, int64_t step);
/* One training step on global batch `step` (each rank its part); no-op when inactive. */
void dcp_layout_train(dcp_layout *l, int step);
/* This rank's state as bytes (parameters' values, the state optimizer's parameters and state,
 * the schedule's), malloc'ed, *n bytes: compared before and after a failed load. */
unsigned char *dcp_layout_bytes(dcp_layout *l, size_t *n);

/* Whether two plain checkpoint files hold the same tensors byte for byte (rank 0 reads). */
bool dcp_same_tensors(const char *a, const char *b, char *why, size_t n);
/* Every parameter of a within rtol of b's (both plain modules): |a - b| <= rtol (|b| + lr),
 * lr = 1e-2. The floor is the learning rate: an AdamW step moves a weight by about lr
 * whatever its gradient, so rounding differences of the reduction order (ZeRO, tensor
 * parallel) in the normalised update are of order rtol * lr per step even for weights near 0
 * (a bias whose gradients are tiny). */
void dcp_expect_close(nb_module *a, nb_module *b, double rtol, const char *what);

#endif
