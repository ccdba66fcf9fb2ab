/* parallel/reducer_impl.h - private to parallel/reducer.c and parallel/reducer_setup.c: the
 * gradient reducer's state (its parameters, buckets and buffers), and the functions one file
 * calls in the other. */
#ifndef NABLA_PARALLEL_REDUCER_IMPL_H
#define NABLA_PARALLEL_REDUCER_IMPL_H

#include "parallel/reducer.h"
#include "tensor/tensor_impl.h"

#define NB__RED_SUMS 8 /* sum groups of partial gradients a reducer keeps */

typedef struct rparam {
    struct nb__reducer *r;
    int index;          /* in nb_parameters order */
    int bucket;
    nb_tensor *t;       /* the parameter (borrowed from the module) */
    int64_t off, n;     /* its element range in the flat buffer (relative to its start) */
    nb_tensor *gview;   /* allreduce / scatter: its view of the flat gradient buffer (owned) */
    int handle;         /* grad hook handle, -1 if none */
    unsigned partial;   /* the sum groups (bits: r->sums) its gradient is a partial sum over */
    bool partial_place; /* its placement says partial, or copies (the plan's guard: ours now) */
    bool expected;      /* requires grad: a gradient is expected every synced step */
    bool guarded;       /* our guard is set */
    bool ready;         /* its gradient completed in this step */
    bool accumulated;   /* a backward with sync disabled gave it a gradient since the last sync */
    bool deferred;
} rparam;

typedef struct rbucket {
    int64_t begin, end; /* element range of the flat buffer */
    int64_t cb, ce;     /* this rank's chunk (scatter policies; else the whole range) */
    int64_t soff;       /* where the chunk starts in the shard */
    nb_tensor *gin;     /* allreduce / scatter: the bucket's view of the flat gradient buffer */
    nb_tensor *gout;    /* the reduced chunk (allreduce: gin; scatter: of gin; staged: of the
                         * shard gradient buffer) */
    /* compressed: the bucket in the wire dtype padded to size * k elements (cin), what the
     * other ranks sent of this rank's chunk (cout), and (allreduce) the reduced chunk in the
     * wire dtype (cmine); views of the two exchange slots under the scatter policies */
    nb_tensor *cin, *cout, *cmine;
    int expected, ready;
    bool deferred;
    bool cpending;      /* an all-to-all into cout awaits its sum */
    nb_work *work;      /* in-flight collective, NULL when none */
} rbucket;

struct nb__reducer {
    nb__reducer_cfg cfg;
    char who[8];
    nb_module *m;
    nb_comm *c;
    int size, rank;
    const nb_mesh *mesh;      /* the parameters' mesh (partial sums), or NULL */
    nb_tensor *flat_g;        /* allreduce / scatter: borrowed from the module */
    nb_dtype dtype;
    nb_device dev;
    int64_t total, cap;       /* elements of the flat buffer; bucket capacity */
    int np, nbk;
    rparam *p;
    rbucket *b;
    int64_t max_bucket, nshard;
    nb_tensor *shard_g;       /* staged (owned) */
    nb_tensor *staging[2];    /* staged (owned) */
    int staged_by[2];         /* bucket whose reduce-scatter reads staging[i], -1 none */
    bool compress;
    nb_tensor *cslot_in[2], *cslot_out[2]; /* scatter policies, compressed (owned) */
    int cslot_by[2];
    int next_launch;          /* buckets before it are launched (or deferred) in this step */
    int nlaunched;            /* buckets launched in this step */
    int last_launched;        /* buckets launched by the last finished step (for tests) */
    int ndeferred;            /* deferred buckets */
    /* The groups partial gradients are summed over, in the order they were met (the same on
     * every rank): a whole mesh dimension (NB_PLACE_PARTIAL: its group, borrowed from the
     * mesh), or the ranks of one dimension holding the same piece (a shard with copies: a
     * split of that dimension's group, owned). */
    struct {
        int dim, copies;      /* copies 0: the whole dimension */
        nb_comm *c;
        bool owned;
    } sums[NB__RED_SUMS];
    int nsums;
    bool sync_enabled;
    bool active;              /* a synced backward's hooks ran; its end has not been processed */
    bool twice;               /* a parameter completed twice before the end of the step */
    bool stepped;             /* a backward reached the model (the layout is fixed) */
    nb_status hook_err;       /* first failure inside a hook (reported at the end of the step) */
    char hook_msg[512];
    /* What nb_step must refuse: local gradients (a backward with sync disabled) that no
     * synchronisation has reduced yet, a synchronisation that failed (fail_msg), deferred
     * buckets not synchronised yet. */
    bool local, failed, deferred_pending;
    char fail_msg[512];
    nb_status last_st;        /* outcome of the last synchronisation, as nb_*_sync reports it */
    char last_msg[512];
    double exposed_s;
    int64_t wire_bytes, last_wire_bytes; /* gradient bytes this rank sent, this / last step */
    nb_status (*relayout)(void *ctx);
    struct nb__reducer *next_live;
};

static inline bool is_ddp(const nb__reducer *r) { return r->cfg.policy == NB__RED_ALLREDUCE; }

/* reducer_setup.c: build (or rebuild) the layout of r's buckets and buffers; free it. */
nb_status nb__reducer_layout_build(nb__reducer *r);
void nb__reducer_layout_free(nb__reducer *r);
/* reducer.c: re-point parameter p's gradient at its view of the flat buffer; the gradient
 * hook and the gradient guard nb__reducer_new attaches to every parameter (ctx: its
 * rparam). */
nb_status nb__reducer_reattach(rparam *p);
void nb__reducer_grad_hook(nb_tensor *leaf, void *ctx);
nb_status nb__reducer_grad_guard(const nb_tensor *leaf, void *ctx, const char *who);

#endif
