/* nabla/mesh.h - the device mesh (named dimensions over the world's ranks, every group looked
 * up by name) and placements (where each parameter lives on the mesh).
 *
 * Usage (the same binary under `mpirun -np 8`: 2 data-parallel replicas of a model split into
 * 2 pipeline stages, each 2-way tensor parallel):
 *     #include <nabla/nabla.h>
 *     #include <stdio.h>
 *     int main(void) {
 *         nb_comm *world = nb_comm_world();
 *         nb_mesh *mesh = nb_mesh_new(world, "dp pp tp", (int[]){-1, 2, 2}); // -1: the rest
 *         if (!mesh) {                       // e.g. 6 ranks: every rank gets the same error
 *             fprintf(stderr, "%s\n", nb_last_error());
 *             return 2;
 *         }
 *         nb_comm *tp = nb_mesh_group(mesh, "tp");            // borrowed: owned by mesh
 *         printf("%s: tp rank %d of %d\n", nb_mesh_describe(mesh), nb_comm_rank(tp),
 *                nb_comm_size(tp));
 *         nb_mesh_free(mesh);
 *         nb_comm_free(world);
 *         return 0;
 *     }
 *
 * The mesh. Dimension names are "dp" (data parallel), "pp" (pipeline stages), "tp" (tensor
 * parallel), and "cp", "ep" (context and expert parallel: reserved for later layers; a mesh may
 * carry them). A name the mesh was not given has size 1. Ranks are laid out in Megatron-LM's
 * order whatever the order the names are listed in: tp varies fastest, then cp, ep, dp, and pp
 * slowest, so a tensor-parallel group is consecutive ranks (one machine) and a pipeline's
 * stages are far apart:
 *     world rank = ((((pp_rank * dp + dp_rank) * ep + ep_rank) * cp + cp_rank) * tp + tp_rank
 * Every group the parallel layers need is made once, by nb_mesh_new: for each set of
 * dimensions, the ranks that differ only in those ("tp": one stage of one replica; "dp": the
 * ranks holding the same part of the model; "pp": one replica's stages; "dp tp": a stage's
 * ranks of every replica). nb_mesh_new is collective over world and first checks that every
 * rank asked for the same layout: a rank that thinks dp=2 while the others think otherwise is
 * refused on every rank ("mesh: the ranks disagree on the layout: rank 0 asked for \"dp=2
 * tp=2\", rank 3 for \"dp=4\""), so a job never runs with groups that do not match.
 *
 * Placements (docs/distributed.md, "Placements"). A parameter of a parallel model is this
 * rank's part of a whole (global) tensor. Its placement says which part: the mesh, the whole
 * tensor's shape, and for each mesh dimension it is not replicated along, one nb_place:
 *   NB_PLACE_SHARD    the tensor is split along `dim` over the mesh dimension: this rank holds
 *                     [offset, offset + length) of it (with blocks > 1: of each of `blocks`
 *                     equal blocks of the dim, side by side, as a fused q/k/v projection is
 *                     split per head); dim NB_PLACE_FLAT: a range of the row-major flattened
 *                     tensor (ZeRO's shards). Lengths may differ between ranks (uneven shards).
 *                     With copies > 1 the piece is held by `copies` consecutive ranks of the
 *                     mesh dimension (ranks c*k .. c*k + copies - 1 hold the same piece: a
 *                     key/value head replicated over the tensor-parallel ranks of its query
 *                     heads); backward leaves each copy a partial sum of the piece's gradient,
 *                     which the gradient reducer sums over the copies; norms count copy 0
 *                     (coordinate % copies == 0), checkpoints write it once (copy 0) and every
 *                     copy reads it. 0 (a zero-initialised entry) means 1: no copies.
 *   NB_PLACE_PARTIAL  the values are replicated along the mesh dimension, but backward leaves
 *                     each rank a partial sum of the gradient (a layer norm on a sequence
 *                     shard); the gradient reducer sums it over the dimension.
 *   NB_PLACE_REPLICATE on "pp" only: copies of the parameter live on several pipeline stages
 *                     (a tied embedding); offset is this copy's index, length the number of
 *                     copies; their gradients are summed, norms count copy 0.
 * Along every mesh dimension a placement does not name the parameter is replicated (the same
 * values on each rank of the dimension), except "pp": a parameter lives on its stage only.
 * Gradients and optimizer state follow their parameter's placement. Whatever creates a part
 * sets its placement (nb_parallelize, the pipeline split, ZeRO); everything that must know
 * how a tensor is laid out reads it: nb_clip_grad_norm, gradient synchronisation,
 * checkpoints, gathering a whole model. A tensor without a placement is whole and local.
 *
 * Ownership: nb_mesh_new's result is the caller's (nb_mesh_free, after every object made
 * over it); world is borrowed and must outlive it; the communicators nb_mesh_group returns
 * belong to the mesh. A placement read with nb_tensor_placement is a copy; its mesh pointer is
 * borrowed. */
#ifndef NABLA_MESH_H
#define NABLA_MESH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nabla/parallel.h"
#include "nabla/status.h"
#include "nabla/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_mesh nb_mesh;

/* ---- the mesh ------------------------------------------------------------------------------ */
/* A mesh over world: dims names the dimensions (space-separated, each once), sizes[i] the size
 * of the i-th (>= 1, or -1 for one of them: the world size over the others'). Errors, the same
 * on every rank (collective over world): ranks that asked for different layouts (checked
 * first), an unknown or repeated name, a size below 1 other than one -1, sizes whose product is
 * not the world size. */
nb_mesh *nb_mesh_new(nb_comm *world, const char *dims, const int *sizes);
void nb_mesh_free(nb_mesh *m);
/* The size and this rank's coordinate along dims (one name, or several space-separated names:
 * their product and this rank's index in that group). A known name the mesh lacks has size 1,
 * coordinate 0. An unknown name: -1 with NB_EINVAL naming it. */
int nb_mesh_size(const nb_mesh *m, const char *dims);
int nb_mesh_rank(const nb_mesh *m, const char *dims);
/* The group of ranks that differ only along dims (borrowed; a size-1 communicator for
 * dimensions of size 1), or NULL with NB_EINVAL for an unknown name. Ranks in the group are
 * ordered by their coordinates along dims (Megatron's order within them). */
nb_comm *nb_mesh_group(const nb_mesh *m, const char *dims);
nb_comm *nb_mesh_world(const nb_mesh *m);
/* "dp=2 pp=2 tp=2" (the dimensions of size > 1 in rank order, slowest first; "dp=1" alone). */
const char *nb_mesh_describe(const nb_mesh *m);

/* ---- placements ---------------------------------------------------------------------------- */
typedef enum nb_place_kind {
    NB_PLACE_REPLICATE = 0,
    NB_PLACE_SHARD,
    NB_PLACE_PARTIAL
} nb_place_kind;

#define NB_PLACE_FLAT (-1)  /* nb_place.dim of a shard of the row-major flattened tensor */
#define NB_MAX_PLACES 4     /* nb_place entries in one placement */

typedef struct nb_place {
    nb_place_kind kind;
    char mesh_dim[8];  /* "dp", "pp", "tp", "cp" or "ep" */
    int dim;           /* SHARD: the tensor dimension split, or NB_PLACE_FLAT */
    int blocks;        /* SHARD: >= 1; > 1: the dim holds `blocks` equal blocks, each split */
    int64_t offset;    /* SHARD: first index held (in each block); REPLICATE on pp: copy index */
    int64_t length;    /* SHARD: number held (in each block); REPLICATE on pp: copies */
    int copies;        /* SHARD of a dim: ranks holding the same piece (consecutive along the
                        * mesh dimension, whose size it divides); 0 or 1: this rank alone */
} nb_place;

typedef struct nb_placement {
    const nb_mesh *mesh;            /* NULL: a plain, whole tensor */
    int ndim;
    int64_t shape[NB_MAX_DIMS];     /* the whole tensor's shape */
    int n;                          /* entries in places */
    nb_place places[NB_MAX_PLACES];
} nb_placement;

/* t's placement into *out (a tensor without one: mesh NULL, n 0, shape t's own). NB_ENULL for
 * NULL arguments. */
nb_status nb_tensor_placement(const nb_tensor *t, nb_placement *out);
/* Set t's placement (copied; p NULL or p->mesh NULL removes it). Checked against t: t's shape
 * must be the whole shape with each SHARD dim of length * blocks (a FLAT shard: t 1-D of
 * length elements, offset + length within the whole tensor's elements), at most one SHARD per
 * tensor dim and one entry per mesh dim, REPLICATE only on "pp", copies >= 0, and copies > 1
 * only on the SHARD of a tensor dim (not FLAT) with the mesh dimension's size dividing by
 * copies. NB_EINVAL / NB_ESHAPE with a message naming what is wrong; t unchanged then. */
nb_status nb_tensor_set_placement(nb_tensor *t, const nb_placement *p);
/* "shard(dim 0 over tp: 128 of 256 at 256) partial(tp)" into buf[n] (NUL-terminated); a
 * piece with copies "shard(dim 0 over tp: 8 of 16 at 8, held by 2 ranks)"; "whole" for a
 * placement without a mesh. Returns buf. */
const char *nb_placement_describe(const nb_placement *p, char *buf, size_t n);
/* Whether this rank's copy of a tensor so placed counts once in a sum over the whole mesh (a
 * norm): false along a replicated or partial dimension where this rank's coordinate is not 0,
 * along a shard with copies where this rank is not the piece's first copy (coordinate %
 * copies != 0), and for pipeline copies other than copy 0. true for a placement without a
 * mesh. */
bool nb_placement_counts(const nb_placement *p);

#ifdef __cplusplus
}
#endif
#endif
