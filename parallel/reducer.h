/* reducer.h - private: the one gradient reducer (parallel/reducer.c) under nb_ddp and nb_zero,
 * and what the parallel layer asks of it (partial sums, deferred tied parameters, sync).
 * Not installed.
 *
 * A reducer wraps a module whose parameters are flattened: buckets over the flat buffer (from
 * its end: the last layers' gradients complete first), a gradient hook on every parameter
 * that counts its bucket's completed gradients, buckets launched strictly in bucket order
 * (the same collectives in the same order on every rank), an end-of-backward callback that
 * launches what is left, waits and checks the step, the exposed-communication time and the
 * bytes sent, 16-bit wire compression, sync enable/disable for accumulation, and a gradient
 * guard on every parameter that makes nb_step refuse gradients that were never reduced. The
 * policy says what a bucket's reduction is:
 *   NB__RED_ALLREDUCE  (nb_ddp)    averaged in place over the ranks.
 *   NB__RED_SCATTER    (ZeRO 1)    reduce-scattered (averaged) from the flat gradient buffer
 *                                  into this rank's chunk of it, in place.
 *   NB__RED_STAGED     (ZeRO 2/3)  no flat gradient buffer: the bucket's gradients are packed
 *                                  into one of two staging buffers and dropped, then
 *                                  reduce-scattered into the shard gradient buffer (the
 *                                  reducer's); at most two in flight.
 * With the scatter policies each bucket [begin, end) is split over the ranks by nb_comm_chunk
 * and this rank's shard is its chunk of every bucket, in bucket order (soff: where a bucket's
 * chunk starts in the shard).
 *
 * After the data-parallel reduction of a step completes, a parameter whose placement has an
 * NB_PLACE_PARTIAL entry (sequence parallelism) gets its gradient summed over that mesh
 * dimension's group (Megatron's finalize order), and one whose placement has a shard held by
 * several ranks (copies > 1: a replicated key/value head) over the ranks holding the same
 * piece (a split of that dimension's group, made once by nb__reducer_new): the whole
 * gradient under ALLREDUCE, this rank's piece of it under the scatter policies (the flat
 * layout is the same on the ranks of those groups, so the pieces match). On a size-1
 * communicator that is all a reducer does.
 *
 * Accumulation: a parameter whose gradient was accumulated by backward passes with sync
 * disabled counts as ready in the synced backward even when its hook does not fire there (a
 * pipeline's last micro-batch touches some chunks only); its bucket is launched at that
 * backward's end.
 *
 * Deferred parameters (a tied embedding's copies on a pipeline's first and last stage, whose
 * local gradients must be summed over the copies before the data-parallel reduction): a
 * parameter whose placement has a "pp" replicate entry of several copies is deferred, as is
 * one named to nb__reducer_defer. Deferred parameters sit in buckets of their own that hooks
 * never launch; after the synced backward (or sync) the caller sums what it must, then calls
 * nb__reducer_sync_deferred, which launches and waits for them. nb_step refuses until then.
 *
 * Ownership: the reducer borrows the module and the communicator; it owns its views, buffers
 * and hooks, and the guards it sets (freeing it puts back a parameter's partial guard). */
#ifndef NABLA_PARALLEL_REDUCER_H
#define NABLA_PARALLEL_REDUCER_H

#include <stdbool.h>
#include <stdint.h>

#include "nabla/parallel.h"

typedef struct nb__reducer nb__reducer;

typedef enum nb__red_policy {
    NB__RED_ALLREDUCE = 0,
    NB__RED_SCATTER,
    NB__RED_STAGED
} nb__red_policy;

typedef struct nb__reducer_cfg {
    nb__red_policy policy;
    double bucket_mb;          /* bucket size in MiB (0: one parameter per bucket) */
    bool find_unused;          /* a parameter without a gradient in a step is not an error */
    nb_dtype reduce_dtype;     /* NB_F32, or NB_F16 / NB_BF16: compressed (several ranks) */
    const char *who;           /* message prefix and API family: "ddp" or "zero" */
    /* With owners (one per parameter, nb_parameters order): one bucket per run of parameters
     * of one owner (ZeRO 3's units), bucket_mb unused. */
    nb_module *const *owners;
    /* Called first in each parameter's gradient hook (ZeRO 3 releases a unit whose gradients
     * are all complete), and once the step's gradients are reduced and summed (offload:
     * the shard's gradient to the host). ctx is theirs. */
    void (*on_grad)(void *ctx, int param);
    nb_status (*after_reduce)(void *ctx);
    void *ctx;
} nb__reducer_cfg;

/* A reducer over model's parameters (flattened here if they are not: nb_module_flatten_
 * parameters) and c. Under NB__RED_STAGED the module's flat gradient buffer must be gone
 * (ZeRO drops it first). Errors: parameters placed on a mesh whose "dp" group is not c, or on
 * two meshes; a parameter registered twice; one already wrapped (NB_ESTATE, "already
 * wrapped by another nb_ddp or nb_zero"); NB_ENOMEM. It communicates only to make the groups
 * of pieces held by several ranks (a split of their mesh dimension's group, collective over
 * it, when some parameter has copies); the caller checks that the ranks wrap the same model
 * (nb__reducer_check_same). */
nb__reducer *nb__reducer_new(nb_module *model, nb_comm *c, const nb__reducer_cfg *cfg);
void nb__reducer_free(nb__reducer *r);
/* Collective: every rank wraps the same number of parameters and elements and the same
 * extra[0..n) (ZeRO: stage, reduce dtype); else NB_EINVAL with what on this rank and the
 * range across ranks, naming what[0..n). */
nb_status nb__reducer_check_same(nb__reducer *r, const int64_t *extra, const char *const *what,
                                 int n);

/* ---- the layout (for ZeRO, which shards the parameters the same way) -------------------- */
int nb__reducer_num_buckets(const nb__reducer *r);
/* Bucket k's element range of the flat buffer and this rank's chunk [cb, ce) of it (its
 * whole range under NB__RED_ALLREDUCE), and where the chunk starts in the shard (all five
 * pointers written). */
void nb__reducer_bucket(const nb__reducer *r, int k, int64_t *begin, int64_t *end, int64_t *cb,
                        int64_t *ce, int64_t *soff);
int nb__reducer_param_bucket(const nb__reducer *r, int i);
/* The reduced gradient of this rank's chunk of bucket k (a view: of the flat gradient buffer,
 * or of the shard gradient buffer under NB__RED_STAGED). */
nb_tensor *nb__reducer_bucket_grad(const nb__reducer *r, int k);
/* The scatter policies: this rank's elements of the shard (the sum of its chunks), its
 * gradient buffer (NB__RED_STAGED; NULL otherwise: the chunks are views of the flat buffer),
 * and the staging buffers' bytes (NB__RED_STAGED). */
int64_t nb__reducer_shard_numel(const nb__reducer *r);
nb_tensor *nb__reducer_shard_grad(const nb__reducer *r);
int64_t nb__reducer_staging_bytes(const nb__reducer *r);
/* This rank's part of parameter i's reduced gradient, a new 1-D view (the caller's; empty
 * when its shard holds none of it), and where it starts within the parameter's flattened
 * elements (*lo). The allreduce policy: the whole gradient. */
nb_tensor *nb__reducer_piece_grad(const nb__reducer *r, int i, int64_t *lo);

/* ---- the step --------------------------------------------------------------------------------- */
/* nb_ddp_sync / nb_zero_sync: finish a synced backward whose end was not processed, or reduce
 * gradients accumulated with sync disabled once sync is enabled again; else the outcome of
 * the last synchronisation. */
nb_status nb__reducer_sync(nb__reducer *r);
void nb__reducer_set_sync(nb__reducer *r, bool enabled);
bool nb__reducer_sync_enabled(const nb__reducer *r);
/* What nb_step must refuse, as an error starting with who (NB_OK: the gradients are reduced):
 * a failed synchronisation, a synced backward not finished, gradients accumulated with sync
 * disabled and never reduced, deferred buckets not synchronised. */
nb_status nb__reducer_check(const nb__reducer *r, const char *who, int param);
double nb__reducer_exposed_s(const nb__reducer *r);
int64_t nb__reducer_comm_bytes(const nb__reducer *r);
/* Buckets launched in the current step (its hooks ran and it is not finished), else in the
 * last finished one (tests). */
int nb__reducer_launched(const nb__reducer *r);

/* ---- what the parallel layer needs ---------------------------------------------------------- */
/* The reducer wrapping module m (nb_ddp_new / nb_zero_new's), or NULL. */
nb__reducer *nb__reducer_of(const nb_module *m);
/* Defer params[0..n) (parameters of r's model), before r's first backward: the buckets are
 * rebuilt so each sits alone in one, and the wrapper's relayout (nb__reducer_set_relayout:
 * ZeRO rebuilds its shard on the new buckets) runs. NB_ESTATE once a backward reached the
 * model; NB_EUNSUPPORTED at ZeRO stage 3 (its buckets are its modules' units); NB_EINVAL for
 * a tensor that is not a parameter of r's model (nothing changes then). */
nb_status nb__reducer_defer(nb__reducer *r, nb_tensor *const *params, int n);
void nb__reducer_set_relayout(nb__reducer *r, nb_status (*relayout)(void *ctx));
bool nb__reducer_param_deferred(const nb__reducer *r, int i);
/* Launch the deferred buckets (in bucket order) and wait for them, then the step's partial
 * sums and after_reduce: the step's reduction is complete. Call it after the synced
 * backward (or sync), on every rank of r's communicator, once the deferred parameters'
 * local gradients are final. NB_OK at once when nothing is deferred or pending. */
nb_status nb__reducer_sync_deferred(nb__reducer *r);

/* ---- partial gradients without a reducer ------------------------------------------------------
 * nb_parallelize marks each parameter it places NB_PLACE_PARTIAL, or as a shard held by
 * several ranks (copies > 1), with this guard (on
 * nb__partial_guard_ctx): nb_step then refuses its gradient, a partial sum nobody summed, and
 * says how to wrap the model. A reducer wrapping the parameter replaces it by its own guard
 * (which sums the parts) and puts it back when freed. */
nb_status nb__partial_guard(const nb_tensor *leaf, void *ctx, const char *who);
extern char nb__partial_guard_ctx;
/* Set the guard on t (nb__set_grad_guard(t, nb__partial_guard, &nb__partial_guard_ctx)). */
nb_status nb__partial_guard_set(nb_tensor *t);

#endif
