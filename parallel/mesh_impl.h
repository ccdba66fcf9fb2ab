/* mesh_impl.h - private: the device mesh struct (parallel/mesh.c) and the placement helpers
 * the parallel layer shares (parallel/placement.c). Not installed. */
#ifndef NABLA_PARALLEL_MESH_IMPL_H
#define NABLA_PARALLEL_MESH_IMPL_H

#include <stdbool.h>
#include <stddef.h>

#include "nabla/mesh.h"
#include "tensor/place.h"

#define NB__MESH_DIMS 5 /* tp, cp, ep, dp, pp: Megatron's order, fastest first */
#define NB__MESH_REQ 96 /* bytes of the layout request the ranks compare */
enum { NB__DIM_TP = 0, NB__DIM_CP, NB__DIM_EP, NB__DIM_DP, NB__DIM_PP };

struct nb_mesh {
    nb_comm *world;  /* borrowed */
    int size[NB__MESH_DIMS], coord[NB__MESH_DIMS];
    /* group[set]: the ranks differing only along the dimensions in the bit set (sets of
     * dimensions of size > 1; group[0] is a size-1 communicator) */
    nb_comm *group[1 << NB__MESH_DIMS];
    bool owned[1 << NB__MESH_DIMS];
    nb_comm *self;
    char desc[64];
};

/* The index of the dimension named name[0..len) in Megatron's order, or -1. */
int nb__mesh_dim_index(const char *name, size_t len);
const char *nb__mesh_dim_name(int i);
int nb__mesh_coord(const nb_mesh *m, int d);
int nb__mesh_dim_size(const nb_mesh *m, int d);

/* Glob match of a dotted module path: '*' matches any run of characters within one name
 * (parallel/plan.c). */
bool nb__path_match(const char *pat, const char *s);
/* One style on one module (the public parallel layers, parallel/tp_layers.c): checked, then
 * applied as nb_parallelize applies it; gather_output (column-wise) all-gathers the output,
 * split_input (row-wise) always splits the input. */
struct nb_tp_rule;
struct nb_parallelize_opts;
nb_status nb__tp_apply_one(nb_module *m, const nb_mesh *mesh, const struct nb_tp_rule *r,
                           const struct nb_parallelize_opts *o, bool gather_output,
                           bool split_input);

/* Test switches (parallel/placement.c): the tests switch off one rule of the parallel layer
 * at a time to show it is needed (the equality with one process must then fail).
 * "tie-sum": the pipeline does not sum tied copies; "count-once": norms count every copy;
 * "partial-sum": the reducer does not sum partial gradients; "copies-sum": it does not sum
 * the gradients of pieces several ranks hold (shards with copies) over their copies. NULL
 * switches all back on. */
void nb__test_knockout(const char *what);
bool nb__knocked_out(const char *what);

/* ---- placements (parallel/placement.c) --------------------------------------------------- */
/* t's placement record, made (the whole-tensor description: mesh, t's shape, no entries) when
 * it has none; NULL + error on failure. The record is t's (do not release). */
nb__place *nb__placement_of(nb_tensor *t, const nb_mesh *mesh);
/* Set t's placement as nb_tensor_set_placement does, keeping the record's private fields
 * (shard_grad). */
nb_status nb__placement_set(nb_tensor *t, const nb_placement *p, const char *who);
/* ZeRO: record on t (its record on mesh, made if it has none) that this rank's part of it is
 * elements [offset, offset + length) of its local flattened values, a flat shard over mesh
 * dimension dim ("dp"): grad and value (retained; NULL: none) are that part of the reduced
 * gradient and of the values (tensor/place.h's shard_grad, shard_value), and counts treats
 * dim as sharded. dim NULL removes the flat shard (and releases the views). NB_EINVAL for a
 * range outside t, "pp", a dim t already has an entry for, or another mesh. */
nb_status nb__placement_set_flat_shard(nb_tensor *t, const nb_mesh *mesh, const char *dim,
                                       int64_t offset, int64_t length, nb_tensor *grad,
                                       nb_tensor *value);
/* The entry of p along mesh dimension d, or NULL. */
const nb_place *nb__placement_find(const nb_placement *p, int d);
/* The number of ranks holding the same piece along e's mesh dimension: e->copies for a
 * SHARD with copies > 1, else 1. */
int nb__place_copies(const nb_place *e);

#endif
