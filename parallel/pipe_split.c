/* pipe_split.c - pipeline parallelism by split (nabla/pipeline.h, nb_pipeline): an ordinary
 * model's ordered layers cut into stages over the mesh's pp dimension, run by the schedule
 * engine (parallel/pipeline.c).
 *
 * Every rank builds the whole model (the same seed everywhere, so every layout starts from
 * the same weights), then keeps the modules of its stages: they go into views (nn/nn_impl.h)
 * that list them under their whole-model names, one per chunk (virtual stage) and one for the
 * rank; the parameters of the modules it does not run lose their memory (their shapes stay, on
 * the meta device). A tensor that modules of stages on several ranks share (a tied embedding
 * and output head, declared once by registering the same tensor in both) stays on each of
 * those ranks, placed as pipeline copies; after the step's passes its gradients are summed
 * over them, before the data-parallel reduction. Every parameter gets its placement on the
 * mesh (a stage's own parameters live on that stage only), so norms and checkpoints need no
 * other record of the split. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nabla/autocast.h"
#include "nabla/autograd.h"
#include "nabla/pipeline.h"
#include "nn/nn_impl.h"
#include "parallel/mesh_impl.h"
#include "parallel/pipeline_impl.h"
#include "parallel/reducer.h"

typedef struct layer {
    nb_module **mods;  /* the modules it runs (borrowed from the model) */
    char **paths;
    int n;
    nb_pipe_layer_fn forward;
    void *ctx;
    bool light;
    int64_t params;    /* elements of its distinct parameters */
} layer;

typedef struct tie {
    nb_tensor *t;      /* the shared parameter (borrowed) */
    nb_comm *group;    /* the ranks holding a copy (owned), NULL on the others */
} tie;

struct nb_pipeline {
    nb_module *model;  /* borrowed */
    const nb_mesh *mesh;
    nb_comm *pp;       /* borrowed from the mesh */
    nb_pipeline_opts o;
    int p, r, v, S;
    layer *layers;
    int L;
    int *bounds;       /* S + 1 layer indices */
    nb_module *module; /* this rank's modules (a view, owned) */
    nb_module **chunks;/* [v] views (owned) */
    tie *ties;
    int n_ties;
    /* the step in progress */
    nb_tensor **mx, **my;
    bool training;
    struct nb_pipeline *next_live; /* the live pipelines (nb__is_pipeline_module) */
};

/* ---- the live pipelines (nb__is_pipeline_module) ------------------------------------------- */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static nb_pipeline *live;

static void live_add(nb_pipeline *p) {
    pthread_mutex_lock(&live_mu);
    p->next_live = live;
    live = p;
    pthread_mutex_unlock(&live_mu);
}

static void live_remove(nb_pipeline *p) {
    pthread_mutex_lock(&live_mu);
    for (nb_pipeline **q = &live; *q; q = &(*q)->next_live)
        if (*q == p) {
            *q = p->next_live;
            break;
        }
    pthread_mutex_unlock(&live_mu);
}

bool nb__is_pipeline_module(const nb_module *m) {
    bool found = false;
    pthread_mutex_lock(&live_mu);
    for (const nb_pipeline *p = live; p && !found; p = p->next_live) {
        found = p->module == m;
        for (int c = 0; !found && p->chunks && c < p->v; c++) found = p->chunks[c] == m;
    }
    pthread_mutex_unlock(&live_mu);
    return found;
}

/* ---- building the layer list ------------------------------------------------------------- */
typedef struct found {
    nb_module **m;
    char **path;
    int n, cap;
    bool oom;
} found;

static void add_found(found *f, nb_module *m, const char *path) {
    if (f->n == f->cap) {
        int cap = f->cap ? 2 * f->cap : 32;
        nb_module **a = realloc(f->m, sizeof *a * (size_t)cap);
        if (a) f->m = a;
        char **b = a ? realloc(f->path, sizeof *b * (size_t)cap) : NULL;
        if (!b) {
            f->oom = true;
            return;
        }
        f->path = b;
        f->cap = cap;
    }
    f->m[f->n] = m;
    if (!(f->path[f->n] = strdup(path))) f->oom = true;
    else f->n++;
}

/* Modules of the tree under m matching pat (depth first, tree order). */
static void find(found *f, nb_module *m, const char *path, const char *pat) {
    if (*path && nb__path_match(pat, path)) add_found(f, m, path);
    for (int i = 0; i < nb_module_num_children(m) && !f->oom; i++) {
        const char *cn = nb_module_child_name(m, i);
        size_t len = strlen(path) + strlen(cn) + 2;
        char *q = malloc(len);
        if (!q) {
            f->oom = true;
            return;
        }
        snprintf(q, len, "%s%s%s", path, *path ? "." : "", cn);
        find(f, nb_module_child_at(m, i), q, pat);
        free(q);
    }
}

static void found_free(found *f) {
    for (int i = 0; i < f->n; i++) free(f->path[i]);
    free(f->m);
    free(f->path);
}

static void layer_free(layer *l) {
    for (int i = 0; i < l->n; i++) free(l->paths[i]);
    free(l->paths);
    free(l->mods);
}

static bool layer_add(layer *l, nb_module *m, const char *path) {
    nb_module **a = realloc(l->mods, sizeof *a * (size_t)(l->n + 1));
    if (a) l->mods = a;
    char **b = a ? realloc(l->paths, sizeof *b * (size_t)(l->n + 1)) : NULL;
    if (b) l->paths = b;
    char *c = b ? strdup(path) : NULL;
    if (!c) return false;
    l->mods[l->n] = m;
    l->paths[l->n++] = c;
    return true;
}

static bool push_layer(nb_pipeline *p, layer *l) {
    layer *a = realloc(p->layers, sizeof *a * (size_t)(p->L + 1));
    if (!a) return false;
    p->layers = a;
    p->layers[p->L++] = *l;
    return true;
}

/* The distinct parameters of a layer's modules: their element count. */
static int64_t count_params(layer *l) {
    nb_tensor **seen = NULL;
    int ns = 0;
    int64_t n = 0;
    for (int i = 0; i < l->n; i++) {
        const nb_params *ps = nb_parameters(l->mods[i]);
        for (int j = 0; ps && j < ps->count; j++) {
            bool dup = false;
            for (int k = 0; k < ns && !dup; k++) dup = seen[k] == ps->tensors[j];
            if (dup) continue;
            nb_tensor **s = realloc(seen, sizeof *s * (size_t)(ns + 1));
            if (!s) break;
            seen = s;
            seen[ns++] = ps->tensors[j];
            n += nb_numel(ps->tensors[j]);
        }
    }
    free(seen);
    return n;
}

static nb_status build_layers(nb_pipeline *p, const nb_pipe_layer *spec, int n) {
    static const char op[] = "pipeline";
    if (!spec) { /* the model's children in order */
        for (int i = 0; i < nb_module_num_children(p->model); i++) {
            layer l = {0};
            if (!layer_add(&l, nb_module_child_at(p->model, i), nb_module_child_name(p->model, i)) ||
                !push_layer(p, &l)) {
                layer_free(&l);
                return nb_set_error(NB_ENOMEM, "%s: out of memory", op);
            }
        }
        if (!p->L)
            return nb_set_error(NB_EINVAL, "%s: the %s has no children to split into stages; give "
                                "its layers", op, nb_module_type(p->model));
        return NB_OK;
    }
    for (int k = 0; k < n; k++) {
        const char *s = spec[k].modules;
        if (!s || !*s) return nb_set_error(NB_EINVAL, "%s: layer %d names no modules", op, k);
        /* one pattern with '*' and no forward of its own: a layer per module it matches */
        const bool expand = !spec[k].forward && strchr(s, '*') && !strchr(s, ' ');
        layer l = {.forward = spec[k].forward, .ctx = spec[k].ctx, .light = spec[k].light};
        nb_status st = NB_OK;
        for (const char *q = s; *q && st == NB_OK;) {
            while (*q == ' ') q++;
            size_t len = strcspn(q, " ");
            if (!len) break;
            char pat[256];
            snprintf(pat, sizeof pat, "%.*s", (int)len, q);
            q += len;
            found f = {0};
            find(&f, p->model, "", pat);
            if (f.oom) st = nb_set_error(NB_ENOMEM, "%s: out of memory", op);
            else if (!f.n)
                st = nb_set_error(NB_EINVAL, "%s: layer %d's \"%s\" names no module of the %s", op,
                                  k, pat, nb_module_type(p->model));
            for (int i = 0; i < f.n && st == NB_OK; i++) {
                if (expand) {
                    layer one = {.light = spec[k].light};
                    if (!layer_add(&one, f.m[i], f.path[i]) || !push_layer(p, &one)) {
                        layer_free(&one);
                        st = nb_set_error(NB_ENOMEM, "%s: out of memory", op);
                    }
                } else if (!layer_add(&l, f.m[i], f.path[i])) {
                    st = nb_set_error(NB_ENOMEM, "%s: out of memory", op);
                }
            }
            found_free(&f);
        }
        if (st == NB_OK && !expand && !l.forward && l.n != 1)
            st = nb_set_error(NB_EINVAL, "%s: layer %d (\"%s\") runs %d modules: give its forward "
                              "function", op, k, s, l.n);
        if (st == NB_OK && !expand && !push_layer(p, &l))
            st = nb_set_error(NB_ENOMEM, "%s: out of memory", op);
        if (st != NB_OK || expand) layer_free(&l);
        if (st != NB_OK) return st;
    }
    /* a module in two layers would run twice */
    for (int a = 0; a < p->L; a++)
        for (int i = 0; i < p->layers[a].n; i++)
            for (int b = a; b < p->L; b++)
                for (int j = b == a ? i + 1 : 0; j < p->layers[b].n; j++)
                    if (p->layers[a].mods[i] == p->layers[b].mods[j])
                        return nb_set_error(NB_EINVAL, "%s: '%s' is in layers %d and %d", op,
                                            p->layers[a].paths[i], a, b);
    return NB_OK;
}

/* ---- splitting ----------------------------------------------------------------------------- */
/* Layers split evenly by count over the stages, light layers (embeddings, heads) riding with
 * their neighbour: the first stages take one more when the count does not divide. */
static void split_even(nb_pipeline *p) {
    int heavy = 0;
    for (int i = 0; i < p->L; i++) heavy += !p->layers[i].light;
    if (heavy < p->S) heavy = 0; /* checked by the caller; all count then */
    const int H = heavy ? heavy : p->L, base = H / p->S, extra = H % p->S;
    int s = 0, in_stage = 0, quota = base + (0 < extra);
    p->bounds[0] = 0;
    for (int i = 0; i < p->L; i++) {
        const bool counts = !heavy || !p->layers[i].light;
        if (counts && in_stage == quota) { /* this layer opens the next stage */
            p->bounds[++s] = i;
            in_stage = 0;
            quota = base + (s < extra);
        }
        if (counts) in_stage++;
    }
    p->bounds[p->S] = p->L;
}

/* Contiguous stages minimizing the largest stage's parameter count (each >= 1 layer): the
 * least bound that a greedy cut fits into S stages, then the stages with several layers cut
 * further until there are S. */
static void split_params(nb_pipeline *p) {
    int64_t lo = 0, hi = 0;
    for (int i = 0; i < p->L; i++) {
        if (p->layers[i].params > lo) lo = p->layers[i].params;
        hi += p->layers[i].params;
    }
    while (lo < hi) {
        int64_t M = lo + (hi - lo) / 2, sum = 0;
        int groups = 1;
        for (int i = 0; i < p->L; i++) {
            if (sum + p->layers[i].params > M) groups++, sum = 0;
            sum += p->layers[i].params;
        }
        if (groups <= p->S) hi = M;
        else lo = M + 1;
    }
    int n = 0;
    int64_t sum = 0;
    p->bounds[0] = 0;
    for (int i = 0; i < p->L; i++) {
        if (i > 0 && sum + p->layers[i].params > lo) p->bounds[++n] = i, sum = 0;
        sum += p->layers[i].params;
    }
    p->bounds[++n] = p->L;
    while (n < p->S) { /* cut the stage with the most layers (the first such) */
        int best = 0;
        for (int s = 1; s < n; s++)
            if (p->bounds[s + 1] - p->bounds[s] > p->bounds[best + 1] - p->bounds[best]) best = s;
        memmove(&p->bounds[best + 2], &p->bounds[best + 1], sizeof *p->bounds * (size_t)(n - best));
        p->bounds[best + 1] = p->bounds[best] + (p->bounds[best + 2] - p->bounds[best]) / 2;
        n++;
    }
}

static nb_status check_and_split(nb_pipeline *p) {
    static const char op[] = "pipeline";
    const nb_pipeline_opts *o = &p->o;
    if (o->n_micro < 1 || o->virtual_stages < 1)
        return nb_set_error(NB_EINVAL, "%s: n_micro (%d) and virtual_stages (%d) must be >= 1 "
                            "(start from nb_pipeline_defaults())", op, o->n_micro,
                            o->virtual_stages);
    if (o->virtual_stages > 1 && o->schedule != NB_PIPE_INTERLEAVED)
        return nb_set_error(NB_EINVAL, "%s: %d virtual stages need the interleaved schedule, not "
                            "%s", op, o->virtual_stages, nb_pipe_schedule_name(o->schedule));
    if (o->schedule == NB_PIPE_INTERLEAVED && o->n_micro % p->p)
        return nb_set_error(NB_EINVAL, "%s: the interleaved schedule needs the micro-batches (%d) "
                            "to be a multiple of the pipeline stages (%d)", op, o->n_micro, p->p);
    int heavy = 0;
    for (int i = 0; i < p->L; i++) heavy += !p->layers[i].light;
    if (p->L < p->S || (o->balance == NB_PIPE_BALANCE_LAYERS && !o->boundaries && heavy &&
                        heavy < p->S && heavy != p->L))
        return nb_set_error(NB_EINVAL, "%s: %d layers (%d without the light ones) cannot fill %d "
                            "stages (%d ranks x %d virtual stages): each stage needs at least "
                            "one layer", op, p->L, heavy, p->S, p->p, p->v);
    if (o->boundaries) {
        bool ok = o->boundaries[0] == 0 && o->boundaries[p->S] == p->L;
        for (int s = 0; ok && s < p->S; s++) ok = o->boundaries[s + 1] > o->boundaries[s];
        if (!ok)
            return nb_set_error(NB_EINVAL, "%s: the boundaries must be %d increasing layer indices "
                                "from 0 to the layer count (%d)", op, p->S + 1, p->L);
        for (int s = 0; s <= p->S; s++) p->bounds[s] = o->boundaries[s];
        return NB_OK;
    }
    if (o->balance == NB_PIPE_BALANCE_PARAMS) split_params(p);
    else if (o->balance == NB_PIPE_BALANCE_LAYERS) split_even(p);
    else return nb_set_error(NB_EINVAL, "%s: unknown balance %d", op, (int)o->balance);
    return NB_OK;
}

/* ---- keeping this rank's part --------------------------------------------------------------- */
static int stage_of_layer(const nb_pipeline *p, int i) {
    int s = 0;
    while (p->bounds[s + 1] <= i) s++;
    return s;
}

/* Whether tensor t belongs to a module of a layer of a stage on rank r. */
static bool held_by_rank(const nb_pipeline *p, const nb_tensor *t, int r) {
    for (int i = 0; i < p->L; i++) {
        if (stage_of_layer(p, i) % p->p != r) continue;
        for (int k = 0; k < p->layers[i].n; k++) {
            const nb_params *ps = nb_parameters(p->layers[i].mods[k]);
            for (int j = 0; ps && j < ps->count; j++)
                if (ps->tensors[j] == t) return true;
            const nb_params *bs = nb_buffers(p->layers[i].mods[k]);
            for (int j = 0; bs && j < bs->count; j++)
                if (bs->tensors[j] == t) return true;
        }
    }
    return false;
}

/* How many modules of the tree under m registered t as their own parameter (more than one: a
 * tied weight). */
static int registrations(nb_module *m, const nb_tensor *t) {
    int n = 0;
    const nb_params *ps = nb_parameters(m);
    for (int i = 0; ps && i < ps->count; i++)
        if (ps->tensors[i] == t && !strchr(ps->names[i], '.')) n++;
    for (int i = 0; i < nb_module_num_children(m); i++)
        n += registrations(nb_module_child_at(m, i), t);
    return n;
}

/* Whether tensor t belongs to a module of the layers [a, b). */
static bool held_by_layers(const nb_pipeline *p, const nb_tensor *t, int a, int b) {
    for (int i = a; i < b; i++)
        for (int k = 0; k < p->layers[i].n; k++) {
            const nb_params *ps = nb_parameters(p->layers[i].mods[k]);
            for (int j = 0; ps && j < ps->count; j++)
                if (ps->tensors[j] == t) return true;
        }
    return false;
}

/* A view lists a weight that several modules registered (a tied embedding and head) under
 * the whole model's name for it (its first), whichever of those modules the view holds:
 * added as the view's own parameter before its modules, it is listed first. */
static nb_status name_tied(const nb_pipeline *p, nb_module *view, const int *stages, int n) {
    const nb_params *ps = nb_parameters(p->model);
    nb_status st = NB_OK;
    for (int j = 0; ps && j < ps->count && st == NB_OK; j++) {
        if (registrations(p->model, ps->tensors[j]) < 2) continue;
        bool here = false;
        for (int k = 0; k < n && !here; k++)
            here = held_by_layers(p, ps->tensors[j], p->bounds[stages[k]], p->bounds[stages[k] + 1]);
        if (here) st = nb__module_view_add_param(view, ps->names[j], ps->tensors[j]);
    }
    return st;
}

/* Drop t's memory (its shape stays, on the meta device). */
static nb_status drop(nb_tensor *t) {
    nb_scope_begin();
    nb_tensor *m = nb_empty_on(NB_META, nb_shape(t), nb_ndim(t),
                               nb_tensor_dtype(t));
    if (m) nb__tensor_assume(t, m);
    nb_scope_end();
    return m ? NB_OK : nb_last_status();
}

static nb_status keep_local(nb_pipeline *p) {
    static const char op[] = "pipeline";
    nb_status st = NB_OK;
    /* every parameter and buffer of the model must be in some layer */
    const nb_params *all[2] = {nb_parameters(p->model), nb_buffers(p->model)};
    for (int w = 0; w < 2 && st == NB_OK; w++)
        for (int j = 0; all[w] && j < all[w]->count && st == NB_OK; j++) {
            bool some = false;
            for (int r = 0; r < p->p && !some; r++) some = held_by_rank(p, all[w]->tensors[j], r);
            if (!some)
                st = nb_set_error(NB_EINVAL, "%s: %s is in no layer's modules (every parameter and "
                                  "buffer must belong to a layer)", op, all[w]->names[j]);
        }
    if (st != NB_OK) return st;
    /* ties across ranks: one group each, made in the model's parameter order on every rank */
    const nb_params *ps = all[0];
    for (int j = 0; j < ps->count && st == NB_OK; j++) {
        int holders = 0, index = -1;
        for (int r = 0; r < p->p; r++)
            if (held_by_rank(p, ps->tensors[j], r)) {
                if (r == p->r) index = holders;
                holders++;
            }
        if (holders < 2) continue;
        nb_comm *g = nb_comm_split(p->pp, index >= 0 ? 0 : 1 + p->r, p->r);
        if (!g) return nb_last_status();
        if (index < 0) {
            nb_comm_free(g);
            continue;
        }
        tie *t = realloc(p->ties, sizeof *t * (size_t)(p->n_ties + 1));
        if (!t) {
            nb_comm_free(g);
            return nb_set_error(NB_ENOMEM, "%s: out of memory", op);
        }
        p->ties = t;
        p->ties[p->n_ties++] = (tie){ps->tensors[j], g};
        nb__place *pl = nb__placement_of(ps->tensors[j], p->mesh);
        if (!pl) return nb_last_status();
        nb_placement np = pl->p;
        if (np.n >= NB_MAX_PLACES)
            return nb_set_error(NB_EINVAL, "%s: %s has too many placement entries", op, ps->names[j]);
        nb_place e = {.kind = NB_PLACE_REPLICATE, .offset = index, .length = holders};
        snprintf(e.mesh_dim, sizeof e.mesh_dim, "%s", p->o.pp_dim);
        np.places[np.n++] = e;
        st = nb__placement_set(ps->tensors[j], &np, op);
    }
    /* the other ranks' tensors lose their memory; ours get a placement on the mesh */
    for (int w = 0; w < 2 && st == NB_OK; w++)
        for (int j = 0; all[w] && j < all[w]->count && st == NB_OK; j++) {
            nb_tensor *t = all[w]->tensors[j];
            if (!held_by_rank(p, t, p->r)) st = drop(t);
            else if (w == 0 && !nb__placement_of(t, p->mesh)) st = nb_last_status();
        }
    if (st != NB_OK) return st;
    /* the views: one per chunk and one for the rank, the modules under their own names */
    p->chunks = calloc((size_t)p->v, sizeof *p->chunks);
    int *mine = malloc(sizeof *mine * (size_t)p->v);
    if (!p->chunks || !mine || !(p->module = nb__module_view_new())) {
        free(mine);
        return nb_set_error(NB_ENOMEM, "%s: out of memory", op);
    }
    for (int c = 0; c < p->v; c++) mine[c] = c * p->p + p->r;
    st = name_tied(p, p->module, mine, p->v);
    free(mine);
    for (int c = 0; c < p->v && st == NB_OK; c++) {
        const int s = c * p->p + p->r;
        if (!(p->chunks[c] = nb__module_view_new())) return nb_last_status();
        if ((st = name_tied(p, p->chunks[c], &s, 1)) != NB_OK) return st;
        for (int i = p->bounds[s]; i < p->bounds[s + 1] && st == NB_OK; i++)
            for (int k = 0; k < p->layers[i].n && st == NB_OK; k++) {
                st = nb__module_view_add_child(p->chunks[c], p->layers[i].paths[k],
                                               p->layers[i].mods[k]);
                if (st == NB_OK)
                    st = nb__module_view_add_child(p->module, p->layers[i].paths[k],
                                                   p->layers[i].mods[k]);
            }
    }
    return st;
}

/* ---- the public object ---------------------------------------------------------------------- */
nb_pipeline_opts nb_pipeline_defaults(void) {
    return (nb_pipeline_opts){._init = NB__OPTS_MARK(nb_pipeline_opts),
                              .schedule = NB_PIPE_1F1B,
                              .n_micro = 4,
                              .virtual_stages = 1,
                              .balance = NB_PIPE_BALANCE_LAYERS,
                              .pp_dim = "pp"};
}

void nb_pipeline_free(nb_pipeline *p) {
    if (!p) return;
    live_remove(p);
    for (int c = 0; p->chunks && c < p->v; c++) nb_module_free(p->chunks[c]);
    free(p->chunks);
    nb_module_free(p->module);
    for (int i = 0; i < p->n_ties; i++) nb_comm_free(p->ties[i].group);
    free(p->ties);
    for (int i = 0; i < p->L; i++) layer_free(&p->layers[i]);
    free(p->layers);
    free(p->bounds);
    free(p->mx);
    free(p->my);
    free(p);
}

/* Every rank's status combined: an error anywhere is an error everywhere. */
static nb_status agree(nb_comm *c, nb_status st, const char *what) {
    if (nb_comm_size(c) == 1) return st;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", st == NB_OK ? "" : nb_last_error());
    double bad = st == NB_OK ? 0 : 1;
    nb_scope_begin();
    nb_tensor *t = nb_from_buffer(&bad, (int64_t[]){1}, 1, NB_F64);
    nb_status cs = t ? nb_allreduce(c, t, NB_REDUCE_MAX) : nb_last_status();
    double any = cs == NB_OK ? nb_item_f64(t) : 1;
    nb_scope_end();
    if (cs != NB_OK) return cs;
    if (st != NB_OK) return nb_set_error(st, "%s", msg);
    if (any > 0)
        return nb_set_error(NB_EINVAL, "%s: another rank failed (see its message)", what);
    return NB_OK;
}

nb_pipeline *nb_pipeline_new(nb_module *model, const nb_mesh *mesh, const nb_pipe_layer *layers,
                             int n_layers, const nb_pipeline_opts *o) {
    if (!model || !mesh) {
        nb_set_error(NB_ENULL, "pipeline: %s is NULL", model ? "the mesh" : "the model");
        return NULL;
    }
    nb_pipeline *p = calloc(1, sizeof *p);
    if (!p) {
        nb_set_error(NB_ENOMEM, "pipeline: out of memory");
        return NULL;
    }
    p->model = model;
    p->mesh = mesh;
    if (o && NB__OPTS_CHECK(o, nb_pipeline_opts, "pipeline", "nb_pipeline_defaults()",
                            "o.n_micro = 8") != NB_OK) {
        free(p);
        return NULL;
    }
    p->o = o ? *o : nb_pipeline_defaults();
    if (!p->o.pp_dim) p->o.pp_dim = "pp";
    p->o.boundaries = NULL; /* copied into bounds */
    p->pp = nb_mesh_group(mesh, p->o.pp_dim);
    nb_status st = p->pp ? NB_OK : nb_last_status();
    if (st == NB_OK) {
        p->p = nb_comm_size(p->pp);
        p->r = nb_comm_rank(p->pp);
        p->v = p->o.virtual_stages > 0 ? p->o.virtual_stages : 1;
        p->S = p->p * p->v;
        p->bounds = malloc(sizeof *p->bounds * (size_t)(p->S + 1));
        if (!p->bounds) st = nb_set_error(NB_ENOMEM, "pipeline: out of memory");
    }
    if (st == NB_OK) st = build_layers(p, layers, n_layers);
    for (int i = 0; st == NB_OK && i < p->L; i++) p->layers[i].params = count_params(&p->layers[i]);
    if (st == NB_OK) {
        nb_pipeline_opts oo = p->o;
        oo.boundaries = o ? o->boundaries : NULL;
        p->o = oo;
        st = check_and_split(p);
        p->o.boundaries = NULL;
    }
    if (st == NB_OK && nb_module_flat_params(model))
        st = nb_set_error(NB_ESTATE, "pipeline: the model's parameters are flattened (wrapped by "
                          "nb_ddp or nb_zero?); split it first, then wrap the pipeline's module");
    /* the checks above are the same on every rank; a rank that differs still must not hang */
    if (p->pp) st = agree(nb_mesh_world(mesh), st, "pipeline");
    if (st == NB_OK) st = keep_local(p);
    if (st == NB_OK) {
        p->mx = calloc((size_t)p->o.n_micro, sizeof *p->mx);
        p->my = calloc((size_t)p->o.n_micro, sizeof *p->my);
        if (!p->mx || !p->my) st = nb_set_error(NB_ENOMEM, "pipeline: out of memory");
    }
    if (st != NB_OK) {
        nb_pipeline_free(p);
        return NULL;
    }
    live_add(p);
    return p;
}

nb_module *nb_pipeline_module(const nb_pipeline *p) { return p ? p->module : NULL; }

const int *nb_pipeline_boundaries(const nb_pipeline *p, int *n_stages) {
    if (n_stages) *n_stages = p ? p->S : 0;
    return p ? p->bounds : NULL;
}

int nb_pipeline_num_layers(const nb_pipeline *p) { return p ? p->L : 0; }

/* ---- running ------------------------------------------------------------------------------- */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static nb_tensor *stage_fn(void *ctx, int chunk, int micro, nb_tensor *input) {
    nb_pipeline *p = ctx;
    const int s = chunk * p->p + p->r;
    /* Under autocast each micro-batch casts the weights itself: with the cast cache, the
     * graphs of the micro-batches in flight (1F1B, GPipe) would share one cast node, which the
     * first of their backward passes frees. */
    if (nb_autocast_active() && nb_grad_enabled()) nb_autocast_clear_cache();
    nb_tensor *x = s == 0 ? p->mx[micro] : input;
    for (int i = p->bounds[s]; i < p->bounds[s + 1] && x; i++) {
        layer *l = &p->layers[i];
        x = l->forward ? l->forward(p->model, x, l->ctx) : nb_forward(l->mods[0], x);
    }
    if (s != p->S - 1 || !x) return x;
    return p->o.loss(x, p->my[micro], p->o.loss_ctx);
}

/* The reducer wrapping the pipeline's module (nb_ddp / nb_zero over dp) synchronises during
 * this rank's last backward of the step only, overlapping it; the others accumulate. */
static nb_status before_backward(void *ctx, int chunk, int micro, bool last) {
    (void)chunk, (void)micro;
    nb_pipeline *p = ctx;
    nb__reducer *r = nb__reducer_of(p->module);
    if (r) nb__reducer_set_sync(r, last);
    return NB_OK;
}

/* Micro-batch views of x and y (rows split in n_micro equal parts). */
static nb_status slice(nb_pipeline *p, nb_tensor *x, nb_tensor *y, const char *who) {
    const int m = p->o.n_micro;
    if (!x || !y) return nb_set_error(NB_ENULL, "%s: x and y are needed", who);
    const int64_t B = nb_size(x, 0);
    if (B < m || B % m || nb_size(y, 0) != B)
        return nb_set_error(NB_EINVAL, "%s: a batch of %lld rows (targets %lld) does not split into "
                            "%d equal micro-batches", who, (long long)B, (long long)nb_size(y, 0), m);
    for (int i = 0; i < m; i++) {
        p->mx[i] = nb_narrow(x, 0, B / m * i, B / m);
        p->my[i] = nb_narrow(y, 0, B / m * i, B / m);
        if (!p->mx[i] || !p->my[i]) return nb_last_status();
    }
    return NB_OK;
}

/* The mean of v over the data-parallel ranks (the same value on every rank). */
static double mean_over_dp(const nb_pipeline *p, double v) {
    nb_comm *dp = nb_mesh_group(p->mesh, "dp");
    if (!dp || nb_comm_size(dp) == 1 || isnan(v)) return v;
    nb_scope_begin();
    nb_tensor *t = nb_from_buffer(&v, (int64_t[]){1}, 1, NB_F64);
    double r = t && nb_allreduce(dp, t, NB_REDUCE_AVG) == NB_OK ? nb_item_f64(t) : NAN;
    nb_scope_end();
    return r;
}

/* The tied parameters' gradients summed over their copies (full local gradients, before the
 * data-parallel reduction), then that reduction of them. */
static nb_status sum_ties(nb_pipeline *p) {
    nb_status st = NB_OK;
    for (int i = 0; i < p->n_ties && st == NB_OK; i++) {
        nb_tensor *t = p->ties[i].t, *g = nb_grad(t);
        if (!g) { /* a copy that took no part in this step contributes zeros */
            nb_scope_begin();
            st = nb_set_grad(t, nb_zeros_like(t));
            nb_scope_end();
            g = nb_grad(t);
        }
        if (st == NB_OK && !nb__knocked_out("tie-sum"))
            st = nb_allreduce(p->ties[i].group, g, NB_REDUCE_SUM);
    }
    /* the tied copies' reduction, held back until now (deferred by their placement) */
    nb__reducer *r = nb__reducer_of(p->module);
    if (st == NB_OK && r) st = nb__reducer_sync_deferred(r);
    return st;
}

static nb_pipe_opts engine_opts(const nb_pipeline *p, bool forward_only) {
    nb_pipe_opts eo = nb_pipe_defaults();
    eo.schedule = p->o.schedule;
    eo.n_micro = p->o.n_micro;
    eo.virtual_stages = p->v;
    eo.forward_only = forward_only;
    if (p->o.scaler && !forward_only) eo.loss_scale = nb_grad_scaler_get_scale(p->o.scaler);
    return eo;
}

double nb_pipeline_step(nb_pipeline *p, nb_tensor *x, nb_tensor *y, nb_pipe_stats *stats) {
    static const char who[] = "pipeline_step";
    if (stats) *stats = (nb_pipe_stats){.bubble = NAN, .bubble_theory = NAN};
    if (!p) {
        nb_set_error(NB_ENULL, "%s: the pipeline is NULL", who);
        return NAN;
    }
    if (!p->o.loss) {
        nb_set_error(NB_EINVAL, "%s: the pipeline has no loss function (nb_pipeline_opts.loss)",
                     who);
        return NAN;
    }
    nb_scope_begin();
    nb_status st = slice(p, x, y, who);
    nb_pipe_opts eo = engine_opts(p, false);
    const nb__pipe_hooks hooks = {before_backward, p};
    double loss = st == NB_OK ? nb__pipe_run(p->pp, &eo, stage_fn, p, stats, &hooks) : NAN;
    if (isnan(loss) && st == NB_OK && nb_last_status() != NB_OK) st = nb_last_status();
    /* whatever happened, the reducer is back to synchronising */
    nb__reducer *red = nb__reducer_of(p->module);
    if (red) nb__reducer_set_sync(red, true);
    double t0 = now_s();
    if (st == NB_OK) st = sum_ties(p);
    if (stats) stats->comm_s = now_s() - t0;
    nb_scope_end();
    if (st != NB_OK) return NAN;
    return mean_over_dp(p, loss);
}

nb_status nb_pipeline_eval(nb_pipeline *p, nb_tensor *x, nb_tensor *y, double *loss,
                           nb_pipe_stats *stats) {
    static const char who[] = "pipeline_eval";
    if (loss) *loss = NAN;
    if (stats) *stats = (nb_pipe_stats){.bubble = NAN, .bubble_theory = NAN};
    if (!p) return nb_set_error(NB_ENULL, "%s: the pipeline is NULL", who);
    if (!p->o.loss)
        return nb_set_error(NB_EINVAL, "%s: the pipeline has no loss function (nb_pipeline_opts."
                            "loss)", who);
    const bool was = nb_module_is_training(p->model);
    nb_module_train(p->model, false);
    nb_scope_begin();
    nb_status st = slice(p, x, y, who);
    nb_pipe_opts eo = engine_opts(p, true);
    double l = st == NB_OK ? nb__pipe_run(p->pp, &eo, stage_fn, p, stats, NULL) : NAN;
    if (isnan(l) && st == NB_OK && nb_last_status() != NB_OK) st = nb_last_status();
    nb_scope_end();
    nb_module_train(p->model, was);
    if (st == NB_OK && loss) *loss = l;
    return st;
}
