/* placement.c - placements (nabla/mesh.h): setting and reading where a tensor lives on a
 * device mesh, the checks that keep a placement consistent with the tensor, and the rule that
 * decides which copy of a replicated tensor (or of a piece several ranks hold) counts in a sum
 * over the mesh (norms). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "parallel/mesh_impl.h"

static char knockout[32]; /* a test switch (mesh_impl.h); empty: every rule on */

void nb__test_knockout(const char *what) { snprintf(knockout, sizeof knockout, "%s", what ? what : ""); }
bool nb__knocked_out(const char *what) { return knockout[0] && !strcmp(knockout, what); }

const nb_place *nb__placement_find(const nb_placement *p, int d) {
    for (int i = 0; p && i < p->n; i++)
        if (nb__mesh_dim_index(p->places[i].mesh_dim, strlen(p->places[i].mesh_dim)) == d)
            return &p->places[i];
    return NULL;
}

int nb__place_copies(const nb_place *e) {
    return e && e->kind == NB_PLACE_SHARD && e->copies > 1 ? e->copies : 1;
}

/* nb_placement_counts, with mesh dimension flat (>= 0) treated as sharded: a ZeRO shard. */
static bool counts_with(const nb_placement *p, int flat) {
    if (!p || !p->mesh || nb__knocked_out("count-once")) return true;
    for (int d = 0; d < NB__MESH_DIMS; d++) {
        const nb_place *e = nb__placement_find(p, d);
        if (d == NB__DIM_PP) { /* a stage's own tensor counts; of tied copies, copy 0 */
            if (e && e->kind == NB_PLACE_REPLICATE && e->offset != 0) return false;
            continue;
        }
        if (e && e->kind == NB_PLACE_SHARD) { /* a distinct part; of copies, the first */
            if (nb__mesh_coord(p->mesh, d) % nb__place_copies(e) != 0) return false;
            continue;
        }
        if (d == flat) continue; /* a distinct part */
        if (nb__mesh_coord(p->mesh, d) != 0) return false; /* a copy: coordinate 0 counts */
    }
    return true;
}

bool nb_placement_counts(const nb_placement *p) { return counts_with(p, -1); }

/* The mesh dimension of a record's flat shard (ZeRO), or -1. */
static int flat_dim(const nb__place *pl) {
    return pl->shard_dim[0] ? nb__mesh_dim_index(pl->shard_dim, strnlen(pl->shard_dim,
                                                                        sizeof pl->shard_dim))
                            : -1;
}

/* The sum (or the maximum) of a double over the mesh's world: nb_clip_grad_norm's reduce. */
static nb_status reduce_world(double *total, bool max, void *ctx) {
    const nb_mesh *m = ctx;
    if (nb_comm_size(m->world) == 1) return NB_OK;
    nb_scope_begin();
    nb_tensor *t = nb_from_buffer(total, (int64_t[]){1}, 1, NB_F64);
    nb_status st = t ? nb_allreduce(m->world, t, max ? NB_REDUCE_MAX : NB_REDUCE_SUM)
                     : nb_last_status();
    if (st == NB_OK) *total = nb_item_f64(t);
    nb_scope_end();
    return st;
}

static nb_status check(const nb_tensor *t, const nb_placement *p, const char *who) {
    bool has_flat = false; /* a flat shard (ZeRO's) may follow other entries */
    for (int k = 0; k < p->n && k < NB_MAX_PLACES; k++)
        has_flat = has_flat || (p->places[k].kind == NB_PLACE_SHARD &&
                                p->places[k].dim == NB_PLACE_FLAT);
    if (p->ndim != t->ndim && !has_flat)
        return nb__error(NB_ESHAPE, "%s: the whole shape has %d dims but the tensor %d", who,
                         p->ndim, t->ndim);
    if (p->ndim < 0 || p->ndim > NB_MAX_DIMS || p->n < 0 || p->n > NB_MAX_PLACES)
        return nb__error(NB_EINVAL, "%s: %d dims and %d entries are out of range", who, p->ndim,
                         p->n);
    int64_t expect[NB_MAX_DIMS];
    for (int i = 0; i < p->ndim; i++) {
        if (p->shape[i] < 0) return nb__error(NB_ESHAPE, "%s: a negative whole size", who);
        expect[i] = p->shape[i];
    }
    int used_dims = 0, used_mesh = 0;
    bool flat = false;
    for (int k = 0; k < p->n; k++) {
        const nb_place *e = &p->places[k];
        int d = nb__mesh_dim_index(e->mesh_dim, strnlen(e->mesh_dim, sizeof e->mesh_dim));
        if (d < 0)
            return nb__error(NB_EINVAL, "%s: unknown mesh dimension \"%.8s\"", who, e->mesh_dim);
        if (used_mesh & (1 << d))
            return nb__error(NB_EINVAL, "%s: two entries for mesh dimension %s", who, e->mesh_dim);
        used_mesh |= 1 << d;
        if (e->kind == NB_PLACE_REPLICATE && d != NB__DIM_PP)
            return nb__error(NB_EINVAL, "%s: an explicit replicate entry is for pipeline copies "
                             "(\"pp\") only; %s is replicated when not named", who, e->mesh_dim);
        if (e->kind == NB_PLACE_REPLICATE && !(e->length >= 1 && e->offset >= 0 &&
                                               e->offset < e->length))
            return nb__error(NB_EINVAL, "%s: pipeline copy %lld of %lld", who,
                             (long long)e->offset, (long long)e->length);
        if (e->kind == NB_PLACE_PARTIAL && d == NB__DIM_PP)
            return nb__error(NB_EINVAL, "%s: partial over pp (use replicate for tied copies)", who);
        if (e->copies < 0 || (e->copies > 1 && (e->kind != NB_PLACE_SHARD ||
                                                e->dim == NB_PLACE_FLAT)))
            return nb__error(NB_EINVAL, "%s: %d copies over %s; copies (> 1) are for the shard "
                             "of a tensor dimension (0 or 1: none)", who, e->copies, e->mesh_dim);
        if (e->copies > 1 && nb__mesh_dim_size(p->mesh, d) % e->copies)
            return nb__error(NB_EINVAL, "%s: a piece held by %d copies over %s, whose %d ranks "
                             "do not split into groups of %d", who, e->copies, e->mesh_dim,
                             nb__mesh_dim_size(p->mesh, d), e->copies);
        if (e->kind != NB_PLACE_SHARD) continue;
        if (e->offset < 0 || e->length < 0 || e->blocks < 1)
            return nb__error(NB_EINVAL, "%s: shard over %s at %lld of length %lld in %d blocks",
                             who, e->mesh_dim, (long long)e->offset, (long long)e->length,
                             e->blocks);
        if (e->dim == NB_PLACE_FLAT) {
            if (flat) return nb__error(NB_EINVAL, "%s: two flat shards", who);
            flat = true;
            continue;
        }
        if (e->dim < 0 || e->dim >= p->ndim)
            return nb__error(NB_EINVAL, "%s: shard of dim %d of a %d-dim tensor", who, e->dim,
                             p->ndim);
        if (used_dims & (1 << e->dim))
            return nb__error(NB_EINVAL, "%s: dim %d is sharded twice", who, e->dim);
        used_dims |= 1 << e->dim;
        if (p->shape[e->dim] % e->blocks || e->offset + e->length > p->shape[e->dim] / e->blocks)
            return nb__error(NB_ESHAPE, "%s: [%lld, %lld) of each of %d blocks does not fit dim "
                             "%d of size %lld", who, (long long)e->offset,
                             (long long)(e->offset + e->length), e->blocks, e->dim,
                             (long long)p->shape[e->dim]);
        expect[e->dim] = e->length * e->blocks;
    }
    if (flat) { /* a range of the flattened (rectangle) part: t is that range, 1-D */
        int64_t part = 1;
        for (int i = 0; i < p->ndim; i++) part *= expect[i];
        for (int k = 0; k < p->n; k++) {
            const nb_place *e = &p->places[k];
            if (e->kind != NB_PLACE_SHARD || e->dim != NB_PLACE_FLAT) continue;
            if (t->ndim != 1 || t->shape[0] != e->length || e->offset + e->length > part)
                return nb__error(NB_ESHAPE, "%s: a flat shard [%lld, %lld) of %lld elements needs "
                                 "a 1-D tensor of its length, got %s", who, (long long)e->offset,
                                 (long long)(e->offset + e->length), (long long)part, NB__SHAPE(t));
        }
        return NB_OK;
    }
    for (int i = 0; i < p->ndim; i++)
        if (expect[i] != t->shape[i])
            return nb__error(NB_ESHAPE, "%s: this rank's part should be %s but the tensor is %s",
                             who, nb__shape_str(expect, p->ndim, (char[NB__SHAPE_STR]){0}),
                             NB__SHAPE(t));
    return NB_OK;
}

nb_status nb__placement_set(nb_tensor *t, const nb_placement *p, const char *who) {
    if (!t) return nb__error(NB_ENULL, "%s: the tensor is NULL", who);
    if (!nb__live(t)) {
        nb__dead_handle(t, who, "t");
        return NB_EFREED;
    }
    if (!p || !p->mesh) {
        if (t->place && !t->place->activation) nb__tensor_set_place(t, NULL);
        return NB_OK;
    }
    nb_status st = check(t, p, who);
    if (st != NB_OK) return st;
    nb__place *pl = t->place && !t->place->activation ? t->place : NULL;
    if (!pl) {
        if (!(pl = nb__place_new())) return nb_last_status();
        nb__tensor_set_place(t, pl);
        nb__place_release(pl); /* t holds it */
    }
    pl->p = *p;
    for (int k = 0; k < pl->p.n; k++) /* names: NUL-terminated whatever the caller wrote */
        pl->p.places[k].mesh_dim[sizeof pl->p.places[k].mesh_dim - 1] = '\0';
    pl->counts = counts_with(&pl->p, flat_dim(pl));
    pl->reduce = reduce_world;
    pl->reduce_ctx = (void *)(uintptr_t)p->mesh;
    return NB_OK;
}

nb__place *nb__placement_of(nb_tensor *t, const nb_mesh *mesh) {
    if (t->place && !t->place->activation) return t->place;
    nb_placement p = {.mesh = mesh, .ndim = t->ndim};
    for (int i = 0; i < t->ndim; i++) p.shape[i] = t->shape[i];
    return nb__placement_set(t, &p, "placement") == NB_OK ? t->place : NULL;
}

nb_status nb__placement_set_flat_shard(nb_tensor *t, const nb_mesh *mesh, const char *dim,
                                       int64_t offset, int64_t length, nb_tensor *grad,
                                       nb_tensor *value) {
    static const char who[] = "placement";
    if (!t || !mesh) return nb__error(NB_ENULL, "%s: %s is NULL", who, !t ? "the tensor" : "mesh");
    if (!dim && (!t->place || t->place->activation)) return NB_OK; /* nothing to clear */
    int d = dim ? nb__mesh_dim_index(dim, strlen(dim)) : -1;
    if (dim && (d < 0 || d == NB__DIM_PP))
        return nb__error(NB_EINVAL, "%s: a flat shard over \"%s\" (dp, tp, cp or ep)", who, dim);
    if (dim && (offset < 0 || length < 0 || offset + length > nb_numel(t)))
        return nb__error(NB_EINVAL, "%s: a flat shard [%lld, %lld) of a tensor of %lld elements",
                         who, (long long)offset, (long long)(offset + length),
                         (long long)nb_numel(t));
    nb__place *pl = nb__placement_of(t, mesh);
    if (!pl) return nb_last_status();
    if (pl->p.mesh != mesh)
        return nb__error(NB_EINVAL, "%s: the tensor is placed on another mesh", who);
    if (dim && nb__placement_find(&pl->p, d))
        return nb__error(NB_EINVAL, "%s: the tensor already has an entry over %s; a flat shard "
                         "splits a dimension it is replicated along", who, dim);
    nb_tensor *og = pl->shard_grad, *ov = pl->shard_value;
    pl->shard_grad = dim && grad ? nb_tensor_retain(grad) : NULL;
    pl->shard_value = dim && value ? nb_tensor_retain(value) : NULL;
    nb_tensor_free(og);
    nb_tensor_free(ov);
    pl->shard_offset = dim ? offset : 0;
    pl->shard_length = dim ? length : 0;
    memset(pl->shard_dim, 0, sizeof pl->shard_dim);
    if (dim) memcpy(pl->shard_dim, dim, strlen(dim) < sizeof pl->shard_dim - 1 ? strlen(dim)
                                                                               : sizeof pl->shard_dim - 1);
    pl->counts = counts_with(&pl->p, d);
    return NB_OK;
}

nb_status nb_tensor_set_placement(nb_tensor *t, const nb_placement *p) {
    return nb__placement_set(t, p, "tensor_set_placement");
}

nb_status nb_tensor_placement(const nb_tensor *t, nb_placement *out) {
    if (!t || !out) return nb__error(NB_ENULL, "tensor_placement: %s is NULL", t ? "out" : "t");
    if (!nb__live(t)) {
        nb__dead_handle(t, "tensor_placement", "t");
        return NB_EFREED;
    }
    if (t->place && !t->place->activation) {
        *out = t->place->p;
        return NB_OK;
    }
    memset(out, 0, sizeof *out);
    out->ndim = t->ndim;
    for (int i = 0; i < t->ndim; i++) out->shape[i] = t->shape[i];
    return NB_OK;
}

const char *nb_placement_describe(const nb_placement *p, char *buf, size_t n) {
    if (!buf || !n) return buf;
    buf[0] = '\0';
    if (!p || !p->mesh) {
        snprintf(buf, n, "whole");
        return buf;
    }
    size_t at = 0;
    for (int k = 0; k < p->n && at < n; k++) {
        const nb_place *e = &p->places[k];
        const char *sep = k ? " " : "";
        switch (e->kind) {
        case NB_PLACE_SHARD:
            if (e->dim == NB_PLACE_FLAT)
                at += (size_t)snprintf(buf + at, n - at, "%sshard(flat over %.8s: %lld at %lld)",
                                       sep, e->mesh_dim, (long long)e->length, (long long)e->offset);
            else if (e->copies > 1)
                at += (size_t)snprintf(buf + at, n - at, "%sshard(dim %d over %.8s: %lld of %lld at "
                                       "%lld%s, held by %d ranks)", sep, e->dim, e->mesh_dim,
                                       (long long)e->length,
                                       (long long)(p->shape[e->dim] / e->blocks),
                                       (long long)e->offset, e->blocks > 1 ? ", per block" : "",
                                       e->copies);
            else
                at += (size_t)snprintf(buf + at, n - at, "%sshard(dim %d over %.8s: %lld of %lld at "
                                       "%lld%s)", sep, e->dim, e->mesh_dim, (long long)e->length,
                                       (long long)(p->shape[e->dim] / e->blocks),
                                       (long long)e->offset, e->blocks > 1 ? ", per block" : "");
            break;
        case NB_PLACE_PARTIAL:
            at += (size_t)snprintf(buf + at, n - at, "%spartial(%.8s)", sep, e->mesh_dim);
            break;
        case NB_PLACE_REPLICATE:
            at += (size_t)snprintf(buf + at, n - at, "%scopy %lld of %lld (%.8s)", sep,
                                   (long long)e->offset, (long long)e->length, e->mesh_dim);
            break;
        }
    }
    if (!p->n) snprintf(buf, n, "replicated");
    return buf;
}
