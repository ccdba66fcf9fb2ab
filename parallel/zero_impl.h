/* zero_impl.h - private: the nb_zero object (parallel/zero.c), shared with the checkpoints'
 * bridge (io/zero_bridge.c: which optimizer holds a ZeRO run's state). Not installed. */
#ifndef NABLA_ZERO_IMPL_H
#define NABLA_ZERO_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "nabla/mesh.h"
#include "nabla/parallel.h"
#include "optim/optim_impl.h"
#include "parallel/reducer.h"

typedef struct zparam {
    struct nb_zero *z;
    int index;          /* in nb_parameters order */
    int bucket;
    nb_tensor *t;       /* the parameter (borrowed from the module) */
    int64_t off, n;     /* its element range in the flat buffer (relative to its start) */
    nb_module *owner;   /* the module that registered it (stage 3's unit) */
    bool expected;      /* requires grad */
    bool placed;        /* its flat shard is recorded in its placement */
} zparam;

/* A bucket of the reducer's layout (parallel/reducer.h): the same element ranges, and the
 * parameter side of it, which is ZeRO's own. */
typedef struct zbucket {
    int64_t begin, end; /* element range of the flat buffer */
    int64_t cb, ce;     /* this rank's chunk of it (absolute range) */
    int64_t soff;       /* where the chunk starts in the shard */
    nb_tensor *pview;   /* the bucket's parameters (view of the flat parameter buffer) */
    nb_tensor *pchunk;  /* this rank's chunk of them */
    nb_work *work;      /* in-flight all-gather of the parameters after a step */
    /* stage 3: a bucket is one module's parameters (a unit), gathered when needed */
    struct nb_zero *z;
    int index;
    nb_tensor *full;    /* the unit's whole parameters: its storage has memory only while
                         * gathered (the parameters are views of it) */
    nb_work *gwork;     /* in-flight all-gather into full */
    bool gathered;
    bool seen;          /* its owner's forward ran through nb_forward (else the root's
                         * forward gathers it) */
    uint64_t version;   /* full's storage version, kept across a gather */
    int expected;       /* parameters with a gradient */
    int done;           /* gradients completed in this backward */
    nb_module *owner;
    int pre_handle, post_handle;
} zbucket;

struct nb_zero {
    nb_module *m;
    nb_optim *user;     /* the template optimizer (borrowed), its nb_step redirected here */
    nb_optim *inner;    /* steps the pieces (owned) */
    nb_comm *c;
    nb_ddp *ddp;        /* stage 0 */
    nb__reducer *r;     /* stages 1-3: the gradient reducer (scatter policies) */
    int size, rank, stage;
    nb_zero_opts o;
    nb_tensor *flat_p;  /* borrowed from the module; stage 3: NULL once set up */
    nb_tensor *flat_g;  /* stage 1: borrowed from the module; else NULL */
    nb_tensor *shard_p; /* stage 3: the shard's parameters (owned) */
    int root_pre, root_post; /* stage 3: the root module's forward hooks, -1 none */
    nb_dtype dtype;
    nb_device dev;
    bool s3_ready;      /* stage 3: the parameters live in the units' storage */
    bool in_backward;   /* stage 3: a backward gathered units (forwards run inside it, as
                         * activation checkpointing's recomputation, release nothing) */
    bool offload;       /* offload_optimizer on a non-CPU model: the pieces live in host_p */
    nb_tensor *host_p;  /* offload: host copy of the shard's parameters (owned), soff layout */
    nb_tensor *host_g;  /* offload: host copy of the shard's averaged gradient (owned) */
    int np, nbk;
    zparam *p;
    zbucket *b;
    nb_module **owners; /* per parameter (the reducer's units at stage 3) */
    nb_tensor **pieces; /* the inner optimizer's parameters (owned references) */
    int *piece_param;   /* per piece: its parameter (index in nb_parameters order) */
    int64_t *piece_lo;  /* per piece: where it starts inside that parameter */
    int npieces;
    /* Placements: the parameters' mesh, or one ZeRO made over c (own_mesh, owned) when they
     * had none; each parameter records its flat shard over "dp", each piece its placement. */
    const nb_mesh *mesh;
    nb_mesh *own_mesh;
};


#endif
