/* zero_impl.h - private: the nb_zero object (parallel/zero.c), shared with its sharded
 * checkpoints (io/zero_ckpt.c). Not installed. */
#ifndef NABLA_ZERO_IMPL_H
#define NABLA_ZERO_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "nabla/parallel.h"
#include "optim/optim_impl.h"

typedef struct zparam {
    struct nb_zero *z;
    int index;          /* in nb_parameters order */
    int bucket;
    nb_tensor *t;       /* the parameter (borrowed from the module) */
    int64_t off, n;     /* its element range in the flat buffer (relative to its start) */
    nb_module *owner;   /* the module that registered it (stage 3's unit) */
    int handle;         /* grad hook handle, -1 if none */
    bool expected;      /* requires grad */
    bool guarded;
    bool ready;
} zparam;

typedef struct zbucket {
    int64_t begin, end; /* element range of the flat buffer */
    int64_t cb, ce;     /* this rank's chunk of it (absolute range) */
    int64_t soff;       /* stage 2: where the chunk starts in the shard gradient buffer */
    nb_tensor *pview;   /* the bucket's parameters (view of the flat parameter buffer) */
    nb_tensor *pchunk;  /* this rank's chunk of them */
    nb_tensor *gin;     /* stage 1: the bucket's view of the flat gradient buffer */
    nb_tensor *gout;    /* the averaged chunk: stage 1 a view of gin, stage 2 of the shard */
    int expected, ready;
    bool launched;
    nb_work *work;      /* in-flight reduce-scatter (or all-gather; compressed: all-to-all) */
    /* compressed (reduce_dtype): views of the exchange slot k % 2, size * ceil(len / size)
     * elements each in the wire dtype, and whether an all-to-all into cout awaits its sum */
    nb_tensor *cin, *cout;
    bool cpending;
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
    int size, rank, stage;
    nb_zero_opts o;
    nb_tensor *flat_p;  /* borrowed from the module */
    nb_tensor *flat_g;  /* stage 1: borrowed from the module; stage 2: NULL */
    nb_tensor *shard_g; /* stage 2: the shard's gradient (owned) */
    nb_tensor *shard_p; /* stage 3: the shard's parameters (owned); flat_p is NULL */
    int root_pre, root_post; /* stage 3: the root module's forward hooks, -1 none */
    nb_dtype dtype;
    nb_device dev;
    bool s3_ready;      /* stage 3: the parameters live in the units' storage */
    bool in_backward;   /* stage 3: a backward gathered units (forwards run inside it, as
                         * activation checkpointing's recomputation, release nothing) */
    bool offload;       /* offload_optimizer on a non-CPU model: the pieces live in host_p */
    nb_tensor *host_p;  /* offload: host copy of the shard's parameters (owned), soff layout */
    nb_tensor *host_g;  /* offload: host copy of the shard's averaged gradient (owned) */
    nb_tensor *staging[2]; /* stage 2 (owned) */
    int staged_by[2];   /* bucket whose reduce-scatter reads staging[i], -1 none */
    int64_t max_bucket;
    int np, nbk;
    zparam *p;
    zbucket *b;
    nb_tensor **pieces; /* the inner optimizer's parameters (owned references) */
    int *piece_param;   /* per piece: its parameter (index in nb_parameters order) */
    int64_t *piece_lo;  /* per piece: where it starts inside that parameter */
    int npieces;
    int next_launch;
    bool sync_enabled, active, twice, local, failed;
    nb_status hook_err;
    char hook_msg[512], fail_msg[512];
    nb_status last_st;
    char last_msg[512];
    double exposed_s;
    /* Compressed gradient reduction (o.reduce_dtype f16/bf16, size > 1): two exchange slots
     * (owned, wire dtype), the bucket whose all-to-all uses each (-1 none), and the gradient
     * bytes this rank sent in this / the last step. */
    bool compress;
    nb_tensor *cin[2], *cout[2];
    int cslot_by[2];
    int64_t wire_bytes, last_wire_bytes;
};

/* After the shard optimizer's state was loaded (io/zero_ckpt.c): the user's optimizer takes
 * its group hyperparameters (ctx: the nb_zero). */
void nb__zero_copy_groups(void *ctx);

#endif
