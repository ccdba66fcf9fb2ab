/* dcp_plan.c - what a checkpoint holds, read from the placements (nabla/mesh.h): the world
 * the state is spread over, and for every tensor of the training state its checkpoint name,
 * its whole shape, the parts this rank holds (rectangles of the whole tensor, one per block,
 * each optionally a flat range: ZeRO) and whether this rank writes them. Replicated data is
 * written once: by coordinate 0 of every mesh dimension it is replicated along, by copy 0 of
 * pipeline copies, by the first of the ranks holding a shard with copies (coordinate %
 * copies == 0; every copy reads it on load); the scalars of a parameter (an optimizer's step
 * count) by the holder of its element 0. Nothing here looks at a parameter's name to decide
 * its layout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/dcp_impl.h"
#include "nabla/autograd.h"
#include "nabla/optim.h"
#include "tensor/place.h"
#include "tensor/tensor_impl.h"

int64_t dcp_box_volume(const dcp_box *b) {
    if (b->fn >= 0) return b->fn;
    int64_t v = 1;
    for (int d = 0; d < b->ndim; d++) v *= b->len[d];
    return v;
}

void dcp_lay_free(dcp_lay *l) {
    free(l->parts);
    memset(l, 0, sizeof *l);
}

nb_status dcp_lay_whole(dcp_lay *l, const int64_t *shape, int ndim, bool write) {
    memset(l, 0, sizeof *l);
    l->ndim = ndim;
    for (int d = 0; d < ndim; d++) l->shape[d] = shape[d];
    l->parts = calloc(1, sizeof *l->parts);
    if (!l->parts) return nb__error(NB_ENOMEM, "checkpoint: out of memory");
    l->nparts = 1;
    dcp_part *p = &l->parts[0];
    p->box.ndim = ndim;
    p->box.fn = -1;
    for (int d = 0; d < ndim; d++) p->box.len[d] = p->sel.len[d] = shape[d];
    l->write = l->first = write;
    return NB_OK;
}

nb_tensor *dcp_select(nb_tensor *local, const dcp_sel *s) {
    if (s->flat) {
        int64_t n = nb_numel(local);
        nb_tensor *f = nb_reshape(local, &n, 1);
        return f ? nb_narrow(f, 0, s->fs, s->fn) : NULL;
    }
    nb_tensor *v = local;
    for (int d = 0; v && d < nb_ndim(local); d++)
        if (s->start[d] != 0 || s->len[d] != nb_shape(local)[d])
            v = nb_narrow(v, d, s->start[d], s->len[d]);
    return v;
}

/* ---- the world ------------------------------------------------------------------------------ */
static const char *const dim_names[] = {"tp", "cp", "ep", "dp", "pp"};
enum { NDIMS = 5 };

nb_status dcp_world_of(const nb_checkpoint *c, dcp_world *w, const char *op) {
    memset(w, 0, sizeof *w);
    w->size = 1;
    snprintf(w->layout, sizeof w->layout, "1 process");
    const nb_params *ps = c->model ? nb_parameters(c->model) : NULL;
    for (int i = 0; ps && i < ps->count; i++) {
        nb_placement p;
        if (nb_tensor_placement(ps->tensors[i], &p) != NB_OK) return nb_last_status();
        if (!p.mesh) continue;
        if (w->mesh && w->mesh != p.mesh)
            return nb__error(NB_EINVAL, "%s: the model's parameters are placed on two different "
                             "meshes (\"%s\" is not on the mesh of the others)", op, ps->names[i]);
        w->mesh = p.mesh;
    }
    nb_optim *inner = c->optim ? dcp_zero_inner(c->optim) : NULL;
    const nb_params *hp = c->optim ? nb_optim_params(inner ? inner : c->optim) : NULL;
    for (int i = 0; !w->mesh && hp && i < hp->count; i++) { /* pieces placed on a mesh */
        nb_placement p;
        if (nb_tensor_placement(hp->tensors[i], &p) == NB_OK && p.mesh) w->mesh = p.mesh;
    }
    nb_clear_error();
    if (w->mesh) {
        w->comm = nb_mesh_world(w->mesh);
        w->rank = nb_comm_rank(w->comm), w->size = nb_comm_size(w->comm);
        w->pp = nb_mesh_size(w->mesh, "pp") > 1;
        snprintf(w->layout, sizeof w->layout, "%s", nb_mesh_describe(w->mesh));
    } else if (c->comm) {
        w->comm = c->comm;
        w->rank = nb_comm_rank(c->comm), w->size = nb_comm_size(c->comm);
        snprintf(w->layout, sizeof w->layout, "dp=%d (replicated)", w->size);
    }
    if (c->comm && w->comm != c->comm && nb_comm_size(c->comm) != w->size)
        return nb__error(NB_EINVAL, "%s: the checkpoint's comm has %d ranks, but the model is "
                         "spread over %d (%s)", op, nb_comm_size(c->comm), w->size, w->layout);
    if (w->size == 1) w->comm = NULL; /* nothing to agree on */
    return NB_OK;
}

/* ---- layouts -------------------------------------------------------------------------------- */
static const nb_place *find_place(const nb_placement *p, const char *dim) {
    for (int k = 0; k < p->n; k++)
        if (strncmp(p->places[k].mesh_dim, dim, sizeof p->places[k].mesh_dim) == 0)
            return &p->places[k];
    return NULL;
}

/* Whether this rank writes a tensor so placed (flat_dim: the mesh dimension a flat shard
 * splits it over, NULL for none): coordinate 0 of every dimension it is replicated along. */
static bool writes(const dcp_world *w, const nb_placement *p, const char *flat_dim) {
    if (!w->mesh) return w->rank == 0;
    for (int d = 0; d < NDIMS; d++) {
        if (nb_mesh_size(w->mesh, dim_names[d]) <= 1) continue;
        const nb_place *e = find_place(p, dim_names[d]);
        if (d == NDIMS - 1) { /* pp: a stage's own tensor; of tied copies, copy 0 */
            if (e && e->kind == NB_PLACE_REPLICATE && e->offset != 0) return false;
            continue;
        }
        if (e && e->kind == NB_PLACE_SHARD) { /* a piece of its own; of copies, the first */
            if (e->copies > 1 && nb_mesh_rank(w->mesh, dim_names[d]) % e->copies != 0)
                return false;
            continue;
        }
        if (flat_dim && strcmp(flat_dim, dim_names[d]) == 0) continue;
        if (nb_mesh_rank(w->mesh, dim_names[d]) != 0) return false;
    }
    return true;
}

/* The per-dim intervals of the local tensor in whole coordinates: dim d holds nb[d] blocks,
 * block b at whole offset off[d][b], each len[d] long. */
typedef struct rects {
    int nb[NB_MAX_DIMS];
    int64_t len[NB_MAX_DIMS];
    int64_t off[NB_MAX_DIMS][64];
} rects;

static nb_status rects_of(const nb_placement *p, rects *r, const char *op) {
    for (int d = 0; d < p->ndim; d++) r->nb[d] = 1, r->len[d] = p->shape[d], r->off[d][0] = 0;
    for (int k = 0; k < p->n; k++) {
        const nb_place *e = &p->places[k];
        if (e->kind != NB_PLACE_SHARD || e->dim == NB_PLACE_FLAT) continue;
        if (e->blocks < 1 || e->blocks > 64)
            return nb__error(NB_EUNSUPPORTED, "%s: a shard in %d blocks (at most 64)", op,
                             e->blocks);
        int64_t bsize = p->shape[e->dim] / e->blocks;
        r->nb[e->dim] = e->blocks;
        r->len[e->dim] = e->length;
        for (int b = 0; b < e->blocks; b++) r->off[e->dim][b] = b * bsize + e->offset;
    }
    return NB_OK;
}

/* The parts of a local tensor made of the rectangles r, restricted (fn >= 0) to its local
 * row-major elements [flo, flo + fn). */
static nb_status parts_of(const nb_placement *p, const rects *r, int64_t flo, int64_t fn,
                          dcp_lay *l, const char *op) {
    int nd = p->ndim, total = 1, multi = -1;
    for (int d = 0; d < nd; d++) {
        total *= r->nb[d];
        if (r->nb[d] > 1) {
            if (multi >= 0 && fn >= 0)
                return nb__error(NB_EUNSUPPORTED, "%s: a flat shard of a tensor split in blocks "
                                 "along two dimensions", op);
            multi = d;
        }
    }
    /* A flat range of the local tensor is a flat range of each block's rectangle only when
     * the blocks follow each other in the local row-major order. */
    for (int d = 0; fn >= 0 && multi >= 0 && d < multi; d++)
        if (r->len[d] * r->nb[d] != 1)
            return nb__error(NB_EUNSUPPORTED, "%s: a flat shard of a tensor split in blocks along "
                             "dim %d (blocks must be along the first dimension of more than one "
                             "element)", op, multi);
    l->ndim = nd;
    for (int d = 0; d < nd; d++) l->shape[d] = p->shape[d];
    l->parts = calloc((size_t)total, sizeof *l->parts);
    if (!l->parts) return nb__error(NB_ENOMEM, "%s: out of memory", op);
    int64_t base = 0, vol = 1;
    for (int d = 0; d < nd; d++) vol *= r->len[d];
    for (int k = 0; k < total; k++) {
        dcp_part q = {.box = {.ndim = nd, .fn = -1}};
        int rest = k;
        for (int d = nd - 1; d >= 0; d--) { /* block index per dim, row-major */
            int b = rest % r->nb[d];
            rest /= r->nb[d];
            q.box.off[d] = r->off[d][b];
            q.box.len[d] = q.sel.len[d] = r->len[d];
            q.sel.start[d] = (int64_t)b * r->len[d];
        }
        if (fn >= 0) { /* this block's elements [base, base + vol) of the local order */
            int64_t lo = flo > base ? flo : base, hi = flo + fn < base + vol ? flo + fn : base + vol;
            base += vol;
            if (lo >= hi) continue;
            q.box.flo = lo - (base - vol), q.box.fn = hi - lo;
            q.sel = (dcp_sel){.flat = true, .fs = lo - flo, .fn = hi - lo};
        }
        l->parts[l->nparts++] = q;
    }
    return NB_OK;
}

nb_status dcp_lay_of(const dcp_world *w, nb_tensor *t, bool values, dcp_lay *l,
                     nb_tensor **local, const char *op) {
    memset(l, 0, sizeof *l);
    *local = NULL;
    nb_placement p;
    nb_status st = nb_tensor_placement(t, &p);
    if (st != NB_OK) return st;
    if (!p.mesh) { /* whole here: the shape is t's */
        p.ndim = nb_ndim(t);
        for (int d = 0; d < p.ndim; d++) p.shape[d] = nb_shape(t)[d];
    }
    int64_t flo = 0, fn = -1;
    const char *flat_dim = NULL;
    nb_tensor *src = t;
    for (int k = 0; k < p.n; k++)
        if (p.places[k].kind == NB_PLACE_SHARD && p.places[k].dim == NB_PLACE_FLAT) {
            flo = p.places[k].offset, fn = p.places[k].length;
            flat_dim = p.places[k].mesh_dim;
        }
    const nb__place *pl = t->place && !t->place->activation ? t->place : NULL;
    if (fn < 0 && values && pl && pl->shard_value) { /* ZeRO-3: the values are the shard */
        flo = pl->shard_offset, fn = pl->shard_length;
        flat_dim = pl->shard_dim;
        src = pl->shard_value;
    }
    nb_tensor *owned = NULL;
    rects r;
    st = rects_of(&p, &r, op);
    if (st == NB_OK) st = parts_of(&p, &r, flo, fn, l, op);
    if (st != NB_OK) {
        dcp_lay_free(l);
        nb_tensor_free(owned);
        return st;
    }
    l->write = writes(w, &p, flat_dim);
    bool first = l->write && (fn < 0 || flo == 0);
    for (int k = 0; k < p.n; k++)
        if (p.places[k].kind == NB_PLACE_SHARD && p.places[k].offset != 0) first = false;
    l->first = first;
    *local = owned ? owned : nb_tensor_retain(src);
    return NB_OK;
}

/* ---- the entries of a save ------------------------------------------------------------------ */
nb_status dcp_plan_add(dcp_plan *p, const char *prefix, const char *name, dcp_kind kind,
                       nb_tensor *local, dcp_lay *lay) {
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 64;
        dcp_entry *e = realloc(p->e, sizeof *e * (size_t)cap);
        if (!e) {
            dcp_lay_free(lay);
            nb_tensor_free(local);
            return nb__error(NB_ENOMEM, "checkpoint: out of memory");
        }
        p->e = e, p->cap = cap;
    }
    size_t n = strlen(prefix) + strlen(name) + 1;
    char *full = malloc(n);
    if (!full) {
        dcp_lay_free(lay);
        nb_tensor_free(local);
        return nb__error(NB_ENOMEM, "checkpoint: out of memory");
    }
    snprintf(full, n, "%s%s", prefix, name);
    p->e[p->n++] = (dcp_entry){.name = full, .kind = kind, .local = local, .lay = *lay};
    memset(lay, 0, sizeof *lay);
    return NB_OK;
}

void dcp_plan_free(dcp_plan *p, const nb_checkpoint *c) {
    for (int i = 0; i < p->n; i++) {
        free(p->e[i].name);
        nb_tensor_free(p->e[i].local);
        dcp_lay_free(&p->e[i].lay);
    }
    free(p->e);
    if (p->holder) nb_optim_state_release(p->holder);
    if (p->groups && p->groups != p->holder) nb_optim_state_release(p->groups);
    if (c && c->sched) nb_sched_state_release(c->sched);
    memset(p, 0, sizeof *p);
}

/* A tensor every rank holds whole and world rank 0 writes (schedule, step, ...). */
static nb_status add_global(dcp_plan *p, const char *prefix, const char *name, nb_tensor *t) {
    dcp_lay l;
    nb_status st = dcp_lay_whole(&l, nb_shape(t), nb_ndim(t), p->w.rank == 0);
    return st == NB_OK ? dcp_plan_add(p, prefix, name, DCP_OTHER, nb_tensor_retain(t), &l) : st;
}

static nb_status add_u64(dcp_plan *p, const char *name, uint64_t v) {
    int64_t x;
    memcpy(&x, &v, sizeof x);
    nb_tensor *t = nb__scope_take(nb_from_buffer(&x, NULL, 0, NB_I64));
    nb_status st = t ? add_global(p, "", name, t) : nb_last_status();
    nb_tensor_free(t);
    return st;
}

static nb_status add_list(dcp_plan *p, const char *prefix, const nb_params *l) {
    if (!l) return nb_last_status() != NB_OK ? nb_last_status()
                                             : nb__error(NB_ENULL, "checkpoint: no state list");
    nb_status st = NB_OK;
    for (int i = 0; st == NB_OK && i < l->count; i++) st = add_global(p, prefix, l->names[i], l->tensors[i]);
    return st;
}

/* The module's parameters and buffers as "model." entries. */
static nb_status add_model(dcp_plan *p, nb_module *m, const char *op) {
    const nb_params *lists[2] = {nb_parameters(m), nb_buffers(m)};
    nb_status st = NB_OK;
    for (int k = 0; k < 2 && st == NB_OK; k++)
        for (int i = 0; lists[k] && st == NB_OK && i < lists[k]->count; i++) {
            dcp_lay l;
            nb_tensor *local;
            st = dcp_lay_of(&p->w, lists[k]->tensors[i], true, &l, &local, op);
            if (st == NB_OK) st = dcp_plan_add(p, "model.", lists[k]->names[i], DCP_MODEL, local, &l);
        }
    return st;
}

/* Index of name in l, or -1. */
static int param_index(const nb_params *l, const char *name) {
    for (int i = 0; l && i < l->count; i++)
        if (strcmp(l->names[i], name) == 0) return i;
    return -1;
}

/* The optimizer's state: the holder's (the shard optimizer under ZeRO) per parameter with
 * that parameter's layout, the group hyperparameters of the user's optimizer. */
static nb_status add_optim(dcp_plan *p, nb_optim *user, const char *op) {
    nb_optim *inner = dcp_zero_inner(user);
    p->holder = inner ? inner : user;
    p->groups = user;
    const nb_params *ps = nb_optim_params(p->holder);
    const nb_params *sl = ps ? nb_optim_state(p->holder) : NULL;
    if (!ps || !sl) return nb_last_status();
    nb_status st = NB_OK;
    for (int i = 0; st == NB_OK && i < sl->count; i++) {
        const char *name = sl->names[i], *dot = strchr(name, '.');
        if (strncmp(name, "param_groups.", 13) == 0) {
            if (p->holder == user) st = add_global(p, "optim.", name, sl->tensors[i]);
            continue;
        }
        int j = dot ? param_index(ps, dot + 1) : -1;
        if (j < 0) {
            st = nb__error(NB_EINVAL, "%s: the optimizer's state \"%s\" names no parameter of the "
                           "optimizer", op, name);
            break;
        }
        dcp_lay l;
        nb_tensor *local;
        st = dcp_lay_of(&p->w, ps->tensors[j], false, &l, &local, op);
        if (st != NB_OK) break;
        nb_tensor_free(local);
        nb_tensor *t = sl->tensors[i];
        if (nb_ndim(t) == 0) { /* the step count: written once, by the holder of element 0 */
            bool first = l.first;
            dcp_lay_free(&l);
            st = dcp_lay_whole(&l, NULL, 0, first);
        }
        if (st == NB_OK) st = dcp_plan_add(p, "optim.", name, DCP_OPTIM, nb_tensor_retain(t), &l);
    }
    if (st == NB_OK && p->holder != user) { /* groups as the user's optimizer has them */
        const nb_params *gl = nb_optim_state(user);
        for (int i = 0; st == NB_OK && gl && i < gl->count; i++)
            if (strncmp(gl->names[i], "param_groups.", 13) == 0)
                st = add_global(p, "optim.", gl->names[i], gl->tensors[i]);
        if (!gl) st = nb_last_status();
    }
    return st;
}

nb_status dcp_plan_save(const nb_checkpoint *c, dcp_plan *p, const char *op) {
    memset(p, 0, sizeof *p);
    nb_status st = dcp_world_of(c, &p->w, op);
    if (st != NB_OK) return st;
    bool grad = nb_set_grad_enabled(false); /* views of parameters, not steps of a graph */
    if (c->model) st = add_model(p, c->model, op);
    if (st == NB_OK && c->optim) st = add_optim(p, c->optim, op);
    if (st == NB_OK && c->sched) st = add_list(p, "sched.", nb_sched_state(c->sched));
    if (st == NB_OK && c->scaler) st = add_list(p, "scaler.", nb_grad_scaler_state(c->scaler));
    if (st == NB_OK && c->loader) {
        nb_loader_state pos;
        st = nb_loader_get_state(c->loader, &pos);
        if (st == NB_OK) st = add_u64(p, "loader.epoch", (uint64_t)pos.epoch);
        if (st == NB_OK) st = add_u64(p, "loader.batch", (uint64_t)pos.batch);
    }
    for (int i = 0; st == NB_OK && i < c->ngens; i++) {
        char name[64];
        nb_generator *g = c->gens[i];
        snprintf(name, sizeof name, "rng.%d.seed", i);
        st = add_u64(p, name, nb_generator_seed(g));
        snprintf(name, sizeof name, "rng.%d.stream", i);
        if (st == NB_OK) st = add_u64(p, name, nb_generator_stream(g));
        snprintf(name, sizeof name, "rng.%d.offset", i);
        if (st == NB_OK) st = add_u64(p, name, nb_generator_offset(g));
    }
    if (st == NB_OK) st = add_u64(p, "step", (uint64_t)c->step);
    nb_set_grad_enabled(grad);
    return st;
}
