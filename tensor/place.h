/* place.h - private: the placement record a tensor may carry (nabla/mesh.h). On a parameter
 * it says which part of a whole tensor this rank holds and on which mesh; on an activation
 * (a tag) that its last dimension is this rank's chunk of a tensor split over a mesh
 * dimension (a column-parallel layer's output), so the one op that must see the whole of it,
 * cross entropy, can run its parallel form. The tensor layer only owns the memory (a record is
 * reference counted and shared by the views that keep a tag); parallel/placement.c fills and
 * reads it. Not installed. */
#ifndef NABLA_TENSOR_PLACE_H
#define NABLA_TENSOR_PLACE_H

#include <stdatomic.h>
#include <stdbool.h>

#include "nabla/mesh.h"
#include "nabla/nn.h"
#include "tensor/tensor_impl.h"

typedef struct nb__place nb__place;
struct nb__place {
    atomic_int refs;
    nb_placement p;
    /* Whether this rank's copy counts once in a sum over the mesh (nb_placement_counts). */
    bool counts;
    /* Norms over the whole mesh (nb_clip_grad_norm): replaces a rank's partial sum of |g|^p (or
     * its largest |g| when max) by that of every rank of the mesh. Set with the mesh. */
    nb_status (*reduce)(double *total, bool max, void *ctx);
    void *reduce_ctx;
    /* ZeRO (a flat shard of the parameter over a data-parallel mesh dimension, shard_dim):
     * this rank's part is elements [shard_offset, shard_offset + shard_length) of the
     * parameter's local (row-major flattened) values. shard_grad: that part of the reduced
     * gradient (a 1-D view of the shard's gradient buffer; retained), which stands for the
     * gradient in norms and clipping while the parameter itself holds none or an unreduced
     * one; shard_value (stage 3): that part of the values (a 1-D view of the shard; retained),
     * the parameter's only persistent memory. NULL / 0 otherwise. With a flat shard, counts
     * treats shard_dim as sharded. */
    nb_tensor *shard_grad, *shard_value;
    int64_t shard_offset, shard_length;
    char shard_dim[8];
    /* An activation tag (not a parameter's placement): the tensor's last dimension is this
     * rank's chunk, in rank order, of one split evenly over p.places[0]'s mesh dimension.
     * Views that keep the last dimension keep the tag. */
    bool activation;
    /* With a tag: cross entropy over the whole split dimension (nn/loss.c calls it for tagged
     * logits instead of the plain op). */
    nb_tensor *(*cross_entropy)(nb_tensor *logits, nb_tensor *target,
                                const nb_cross_entropy_opts *o, const nb__place *pl);
};

/* A new record (refs 1, zeroed), or NULL + NB_ENOMEM. */
nb__place *nb__place_new(void);
nb__place *nb__place_retain(nb__place *pl);
/* Drop one reference (the last frees the record and releases shard_grad). NULL is a no-op. */
void nb__place_release(nb__place *pl);
/* Make pl (retained here; NULL: none) t's record, releasing the one it had. */
void nb__tensor_set_place(nb_tensor *t, nb__place *pl);

#endif
