/* plan.c - tensor (and sequence) parallelism by plan (nabla/tp.h, nb_parallelize): module path
 * patterns mapped to styles, applied to an ordinary model in place. A style slices the
 * module's parameters to this rank's part (setting their placements), and replaces the
 * module's forward by its parallel form (nn/nn_impl.h): the model's own code does not change.
 *
 * Styles (T ranks in the tensor-parallel group, rank r; "sp": sequence parallelism on, the
 * activations between the parallel regions split along the sequence, dim -2):
 *   column-wise  weight (out, in) and bias (out): rows [r out/T, (r+1) out/T) of each of
 *                `blocks` blocks. forward: the input enters the region (copy_to_region, or
 *                with sp an all-gather of the sequence), x W_r^T + b_r, the output stays this
 *                rank's columns, tagged as such (cross entropy on it runs vocab-parallel).
 *                With a unit and U = out/unit units (per block) fewer than T, T dividing by
 *                U: each unit is held by c = T/U consecutive ranks (rank r holds unit r/c:
 *                a key/value head replicated over the ranks of its query heads), the
 *                placement says so (copies c), and the weight's and bias's gradients, each
 *                copy's partial sum, are summed over the copies by the gradient reducer.
 *   row-wise     weight columns [r in/T, (r+1) in/T), the bias whole. forward: x_r W_r^T
 *                (x split here when it arrives whole), summed over the group (allreduce, or
 *                with sp a reduce-scatter of the sequence), then + b.
 *   vocab        an embedding table (V, C): rows [r V/T, ...). forward: each rank looks up
 *                its rows' tokens, the parts summed (with sp reduce-scattered).
 *   sequence     with sp: the module runs on the rank's sequence shard, its parameters are
 *                replicated with partial gradients (summed over tp by the gradient reducer);
 *                an embedding given positions looks up the rank's part of them. Without sp:
 *                nothing changes.
 *   replicate    nothing changes (a rule to say so).
 * Every check (rules that match nothing, conflicting rules, shapes that do not divide) runs
 * before anything changes, on every rank alike, and the ranks agree on the outcome, so a plan
 * error is seen on every rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/autograd.h"
#include "nabla/tp.h"
#include "nn/nn_impl.h"
#include "parallel/mesh_impl.h"
#include "parallel/reducer.h"

typedef struct mod_entry {
    nb_module *m;
    char *path;
    int rule; /* index of the rule that claimed it, -1 none */
} mod_entry;

typedef struct walk {
    mod_entry *e;
    int n, cap;
    bool oom;
} walk;

static void collect(walk *w, nb_module *m, const char *path) {
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        mod_entry *e = realloc(w->e, sizeof *e * (size_t)cap);
        if (!e) {
            w->oom = true;
            return;
        }
        w->e = e, w->cap = cap;
    }
    char *p = strdup(path);
    if (!p) {
        w->oom = true;
        return;
    }
    w->e[w->n++] = (mod_entry){m, p, -1};
    for (int i = 0; i < nb_module_num_children(m) && !w->oom; i++) {
        const char *cn = nb_module_child_name(m, i);
        size_t len = strlen(path) + strlen(cn) + 2;
        char *q = malloc(len);
        if (!q) {
            w->oom = true;
            return;
        }
        snprintf(q, len, "%s%s%s", path, *path ? "." : "", cn);
        collect(w, nb_module_child_at(m, i), q);
        free(q);
    }
}

static void walk_free(walk *w) {
    for (int i = 0; i < w->n; i++) free(w->e[i].path);
    free(w->e);
}

/* Glob match of a dotted path: '*' matches any run of characters within one name (not a
 * '.'); everything else literally. */
bool nb__path_match(const char *pat, const char *s) {
    if (!*pat) return !*s;
    if (*pat == '*') {
        for (const char *t = s;; t++) {
            if (nb__path_match(pat + 1, t)) return true;
            if (!*t || *t == '.') return false;
        }
    }
    return *pat == *s && nb__path_match(pat + 1, s + 1);
}

static const char *style_name(nb_tp_style s) {
    switch (s) {
    case NB_TP_REPLICATE: return "replicate";
    case NB_TP_COLWISE: return "column-wise";
    case NB_TP_ROWWISE: return "row-wise";
    case NB_TP_VOCAB: return "vocab-parallel";
    case NB_TP_SEQUENCE: return "sequence-parallel";
    }
    return "?";
}

/* ---- the parallel forwards ------------------------------------------------------------------ */
typedef struct style_ctx {
    nb_comm *tp;       /* borrowed from the mesh */
    const nb_mesh *mesh;
    bool sp;
    int T, r;
    char tp_dim[8];
    bool gather_output; /* column-wise (the public layer's option): the output all-gathered */
    bool split_input;   /* row-wise (the public layer's option): the input always arrives whole */
    int copies;         /* column-wise: ranks holding each unit (1: the units are split) */
} style_ctx;

static nb_tensor *vocab_ce(nb_tensor *logits, nb_tensor *target, const nb_cross_entropy_opts *o,
                           const nb__place *pl);

/* The output of a column-parallel layer: its last dim is this rank's chunk over tp (a layer
 * whose units are held by several ranks: its unit, which is no rank-ordered chunk, so the
 * output is not tagged and a cross entropy on it is an ordinary one). */
static nb_tensor *tag(const style_ctx *s, nb_tensor *y) {
    if (!y || s->T == 1 || s->copies > 1) return y;
    nb__place *pl = nb__place_new();
    if (!pl) return NULL;
    pl->activation = true;
    pl->p.mesh = s->mesh;
    pl->p.n = 1;
    pl->p.places[0] = (nb_place){.kind = NB_PLACE_SHARD, .dim = -1, .blocks = 1};
    memcpy(pl->p.places[0].mesh_dim, s->tp_dim, sizeof s->tp_dim);
    pl->cross_entropy = vocab_ce;
    nb__tensor_set_place(y, pl);
    nb__place_release(pl);
    return y;
}

static nb_comm *group_of(const nb__place *pl) {
    return nb_mesh_group(pl->p.mesh, pl->p.places[0].mesh_dim);
}

static nb_tensor *vocab_ce(nb_tensor *logits, nb_tensor *target, const nb_cross_entropy_opts *o,
                           const nb__place *pl) {
    nb_cross_entropy_opts d = nb_cross_entropy_defaults();
    if (o && (o->reduction != d.reduction || o->has_ignore_index || o->label_smoothing != 0)) {
        nb_set_error(NB_EUNSUPPORTED, "cross_entropy: the logits are split over the vocabulary "
                     "(a column-parallel output) and the vocab-parallel form takes the mean "
                     "reduction only, without ignore_index or label smoothing");
        return NULL;
    }
    if (nb_ndim(logits) != 2) {
        nb_set_error(NB_ESHAPE, "cross_entropy: vocab-parallel logits must be (N, V/tp), got %s "
                     "(view them as 2-D)", NB__SHAPE(logits));
        return NULL;
    }
    return nb_vocab_parallel_cross_entropy(logits, target, group_of(pl));
}

static int seq_dim(const nb_tensor *x) { return nb_ndim(x) >= 2 ? nb_ndim(x) - 2 : 0; }

static nb_tensor *colwise_forward(nb_module *m, nb_tensor *x, void *ctx) {
    const style_ctx *s = ctx;
    if (!x) return NULL;
    x = s->sp && s->T > 1 ? nb_allgather_along(x, s->tp, seq_dim(x)) : nb_copy_to_region(x, s->tp);
    nb_tensor *y = nb_linear(x, nb_module_param(m, "weight"), nb_module_param_opt(m, "bias"));
    return s->gather_output ? nb_gather_along(y, s->tp, -1) : tag(s, y);
}

static nb_tensor *rowwise_forward(nb_module *m, nb_tensor *x, void *ctx) {
    const style_ctx *s = ctx;
    nb_tensor *w = nb_module_param(m, "weight");
    if (!x || !w) return NULL;
    /* the input is this rank's part (a column-parallel output); a whole input is split here */
    if (s->T > 1 && (s->split_input || nb_size(x, -1) == nb_size(w, 1) * s->T))
        x = nb_split_along(x, s->tp, -1);
    nb_tensor *y = nb_linear(x, w, NULL);
    y = s->sp && s->T > 1 ? nb_reduce_scatter_along(y, s->tp, seq_dim(y))
                          : nb_reduce_from_region(y, s->tp);
    nb_tensor *b = nb_module_param_opt(m, "bias");
    return b ? nb_add(y, b) : y;
}

static nb_tensor *vocab_forward(nb_module *m, nb_tensor *idx, void *ctx) {
    const style_ctx *s = ctx;
    if (!idx) return NULL;
    return nb_vocab_parallel_embedding(nb_module_param(m, "weight"), idx, s->tp,
                                       s->sp && s->T > 1 ? nb_ndim(idx) - 1 : -1);
}

/* A sequence-parallel module given token positions (an integer tensor) looks up the rank's
 * part of them; on activations (already shards) it runs as it is. */
typedef struct seq_ctx {
    style_ctx s;
    const nb_module_vtable *vt;
} seq_ctx;

static nb_tensor *sequence_forward(nb_module *m, nb_tensor *x, void *ctx) {
    const seq_ctx *q = ctx;
    if (!x) return NULL;
    nb_dtype dt = nb_tensor_dtype(x);
    if ((dt == NB_I64 || dt == NB_I32) && q->s.T > 1) {
        const int64_t n = nb_size(x, -1);
        if (n % q->s.T) {
            nb_set_error(NB_ESHAPE, "sequence parallel: %lld positions do not divide by the "
                         "tensor-parallel size %d", (long long)n, q->s.T);
            return NULL;
        }
        x = nb_narrow(x, nb_ndim(x) - 1, n / q->s.T * q->s.r, n / q->s.T);
    }
    return q->vt->forward(m, x);
}

/* ---- slicing --------------------------------------------------------------------------------- */
/* This rank's part of w along dim: [off, off + n) of each of `blocks` equal blocks, as a new
 * tensor. */
static nb_tensor *part_of(nb_tensor *w, int dim, int blocks, int64_t off, int64_t n) {
    const int64_t B = nb_size(w, dim) / blocks;
    nb_tensor *parts[64];
    for (int k = 0; k < blocks; k++) parts[k] = nb_narrow(w, dim, k * B + off, n);
    return nb_contiguous(blocks == 1 ? parts[0] : nb_cat(parts, blocks, dim));
}

/* Replace parameter t by its part along dim and record the placement; a tensor another rule
 * already split the same way (a tied weight) is left as it is. With s->copies > 1 (column-wise
 * units held by several ranks) rank r holds the (r / copies)-th of T / copies parts. */
static nb_status shard_param(const style_ctx *s, nb_tensor *t, const char *name, int dim,
                             int blocks) {
    nb_placement now;
    nb_tensor_placement(t, &now);
    const int c = s->copies > 1 ? s->copies : 1;
    const int64_t n = now.shape[dim] / blocks / (s->T / c);
    nb_place e = {.kind = NB_PLACE_SHARD, .dim = dim, .blocks = blocks, .offset = n * (s->r / c),
                  .length = n, .copies = c > 1 ? c : 0};
    memcpy(e.mesh_dim, s->tp_dim, sizeof e.mesh_dim);
    const nb_place *had = now.mesh ? nb__placement_find(&now, NB__DIM_TP) : NULL;
    if (had) {
        if (had->kind == e.kind && had->dim == e.dim && had->blocks == e.blocks &&
            had->offset == e.offset && had->length == e.length &&
            nb__place_copies(had) == nb__place_copies(&e))
            return NB_OK; /* shared with a module split the same way */
        return nb_set_error(NB_EINVAL, "parallelize: %s is shared with a module that another rule "
                            "already split differently", name);
    }
    if (now.n >= NB_MAX_PLACES)
        return nb_set_error(NB_EINVAL, "parallelize: %s has too many placement entries", name);
    nb_status st = NB_OK;
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_tensor *p = part_of(t, dim, blocks, e.offset, n);
    if (!p) st = nb_last_status();
    nb_placement np = now;
    np.mesh = s->mesh;
    np.places[np.n++] = e;
    if (st == NB_OK) {
        nb__tensor_assume(t, p);
        st = nb__placement_set(t, &np, "parallelize");
    }
    nb_scope_end();
    nb_set_grad_enabled(prev);
    /* the copies' gradients are partial sums: until a reducer wraps the model (and sums them
     * over the copies), nb_step refuses them */
    return st == NB_OK && c > 1 ? nb__partial_guard_set(t) : st;
}

static nb_status partial_param(const style_ctx *s, nb_tensor *t, const char *name) {
    nb_placement now;
    nb_tensor_placement(t, &now);
    if (now.mesh && nb__placement_find(&now, NB__DIM_TP)) return NB_OK; /* split or marked */
    if (now.n >= NB_MAX_PLACES)
        return nb_set_error(NB_EINVAL, "parallelize: %s has too many placement entries", name);
    now.mesh = s->mesh;
    nb_place e = {.kind = NB_PLACE_PARTIAL};
    memcpy(e.mesh_dim, s->tp_dim, sizeof e.mesh_dim);
    now.places[now.n++] = e;
    nb_status st = nb__placement_set(t, &now, "parallelize");
    /* until a reducer wraps the model (and sums them), nb_step refuses such gradients */
    return st == NB_OK ? nb__partial_guard_set(t) : st;
}

/* ---- checks ---------------------------------------------------------------------------------- */
/* A linear-like module: "weight" (out, in), an optional "bias" (out), nothing else. */
static bool linear_like(nb_module *m, const char *path, const char *style) {
    nb_tensor *w = nb_module_param_opt(m, "weight"), *b = nb_module_param_opt(m, "bias");
    int own = 0;
    const nb_params *ps = nb_parameters(m);
    for (int i = 0; ps && i < ps->count; i++) own++;
    if (!w || nb_ndim(w) != 2 || (b && (nb_ndim(b) != 1 || nb_size(b, 0) != nb_size(w, 0))) ||
        own != 1 + (b != NULL)) {
        nb_set_error(NB_EINVAL, "parallelize: '%s' (a %s) cannot be %s: the style needs a linear "
                     "layer, whose only parameters are weight (out, in) and an optional bias (out)",
                     path, nb_module_type(m), style);
        return false;
    }
    return true;
}

static bool divides(int64_t n, int64_t by, const char *path, const char *what, int T) {
    if (by > 0 && n % by == 0) return true;
    if (by == T || by <= 0 || n % (by / T))
        nb_set_error(NB_EINVAL, "parallelize: '%s': %s %lld does not split into %d equal parts",
                     path, what, (long long)n, T);
    else
        nb_set_error(NB_EINVAL, "parallelize: '%s': %s %lld is %lld units of %lld (the rule's "
                     "unit), which do not split into %d equal parts", path, what, (long long)n,
                     (long long)(n / (by / T)), (long long)(by / T), T);
    return false;
}

/* The ranks holding each of a column-wise rule's units on T ranks: 1 when its units (per
 * block) split into T equal parts, T / U when a rule with a unit has U units and T divides by
 * U (each unit replicated over T / U consecutive ranks), 0 otherwise. */
static int colwise_copies(nb_module *m, const nb_tp_rule *r, int T) {
    const int blocks = r->blocks > 1 ? r->blocks : 1;
    const int64_t unit = r->unit > 0 ? r->unit : 1;
    const int64_t out = nb_size(nb_module_param(m, "weight"), 0);
    if (out % blocks || (out / blocks) % unit) return 0;
    const int64_t units = out / blocks / unit;
    if (units % T == 0) return 1;
    return r->unit > 0 && units > 0 && T % units == 0 ? (int)(T / units) : 0;
}

static bool check_rule(nb_module *m, const char *path, const nb_tp_rule *r, int T) {
    const int blocks = r->blocks > 1 ? r->blocks : 1;
    const int64_t unit = r->unit > 0 ? r->unit : 1;
    switch (r->style) {
    case NB_TP_COLWISE: {
        if (!linear_like(m, path, style_name(r->style))) return false;
        const int64_t out = nb_size(nb_module_param(m, "weight"), 0);
        if (out % blocks) {
            nb_set_error(NB_EINVAL, "parallelize: '%s': out_features %lld is not %d equal blocks",
                         path, (long long)out, blocks);
            return false;
        }
        if (colwise_copies(m, r, T) > 0) return true;
        const char *what = blocks > 1 ? "each block's out_features" : "out_features";
        const int64_t ob = out / blocks;
        if (r->unit > 0 && ob % unit == 0 && ob > 0) {
            nb_set_error(NB_EINVAL, "parallelize: '%s': %s %lld is %lld units of %lld (the rule's "
                         "unit), which neither split into %d equal parts nor divide %d (then "
                         "each unit would be held by %d / units ranks)", path, what,
                         (long long)ob, (long long)(ob / unit), (long long)unit, T, T, T);
            return false;
        }
        return divides(ob, (int64_t)T * unit, path, what, T);
    }
    case NB_TP_ROWWISE:
        return linear_like(m, path, style_name(r->style)) &&
               divides(nb_size(nb_module_param(m, "weight"), 1), (int64_t)T * unit, path,
                       "in_features", T);
    case NB_TP_VOCAB: {
        nb_tensor *w = nb_module_param_opt(m, "weight");
        const nb_params *ps = nb_parameters(m);
        if (!w || nb_ndim(w) != 2 || !ps || ps->count != 1) {
            nb_set_error(NB_EINVAL, "parallelize: '%s' (a %s) cannot be vocab-parallel: the style "
                         "needs an embedding, whose only parameter is weight (V, C)", path,
                         nb_module_type(m));
            return false;
        }
        return divides(nb_size(w, 0), T, path, "the vocabulary", T);
    }
    case NB_TP_SEQUENCE:
    case NB_TP_REPLICATE:
        return true;
    }
    nb_set_error(NB_EINVAL, "parallelize: '%s': unknown style %d", path, (int)r->style);
    return false;
}

/* Apply rule r's style to module m (at path, for messages): slice its parameters, set their
 * placements, replace its forward. The checks have passed. */
static nb_status apply(const style_ctx *s, nb_module *m, const char *path, const nb_tp_rule *r) {
    const int blocks = r->blocks > 1 ? r->blocks : 1;
    char name[512];
    nb__forward_fn fn = NULL;
    nb_status st = NB_OK;
    style_ctx sc = *s; /* column-wise: the ranks holding each unit */
    sc.copies = r->style == NB_TP_COLWISE ? colwise_copies(m, r, s->T) : 1;
    s = &sc;
    switch (r->style) {
    case NB_TP_COLWISE:
    case NB_TP_ROWWISE:
    case NB_TP_VOCAB: {
        const bool row = r->style == NB_TP_ROWWISE;
        snprintf(name, sizeof name, "%s%sweight", path, *path ? "." : "");
        st = shard_param(s, nb_module_param(m, "weight"), name, row ? 1 : 0, blocks);
        nb_tensor *b = nb_module_param_opt(m, "bias");
        snprintf(name, sizeof name, "%s%sbias", path, *path ? "." : "");
        if (st == NB_OK && b)
            st = row ? (s->sp && s->T > 1 ? partial_param(s, b, name) : NB_OK)
                     : shard_param(s, b, name, 0, blocks);
        fn = r->style == NB_TP_COLWISE ? colwise_forward : row ? rowwise_forward : vocab_forward;
        break;
    }
    case NB_TP_SEQUENCE: {
        if (!s->sp || s->T == 1) break;
        const nb_params *ps = nb_parameters(m);
        for (int j = 0; st == NB_OK && ps && j < ps->count; j++) {
            snprintf(name, sizeof name, "%s%s%s", path, *path ? "." : "", ps->names[j]);
            st = partial_param(s, ps->tensors[j], name);
        }
        if (st == NB_OK && nb_module_param_opt(m, "weight") && ps->count == 1) {
            /* an embedding: remember its own forward, which the override calls */
            seq_ctx *q = malloc(sizeof *q);
            if (!q) return nb_set_error(NB_ENOMEM, "parallelize: out of memory");
            *q = (seq_ctx){*s, nb__module_vtable(m)};
            if (q->vt && q->vt->forward) return nb__module_override_forward(m, sequence_forward, q, free);
            free(q);
        }
        break;
    }
    case NB_TP_REPLICATE: break;
    }
    if (st != NB_OK || !fn) return st;
    style_ctx *c = malloc(sizeof *c);
    if (!c) return nb_set_error(NB_ENOMEM, "parallelize: out of memory");
    *c = *s;
    return nb__module_override_forward(m, fn, c, free);
}

/* The public parallel layers (parallel/tp_layers.c): rule r's style on the one module m. */
nb_status nb__tp_apply_one(nb_module *m, const nb_mesh *mesh, const nb_tp_rule *r,
                           const nb_parallelize_opts *o, bool gather_output, bool split_input) {
    const char *dim = o && o->tp_dim ? o->tp_dim : "tp";
    nb_comm *tp = nb_mesh_group(mesh, dim);
    if (!tp) return nb_last_status();
    style_ctx s = {.tp = tp, .mesh = mesh, .sp = o && o->sequence_parallel, .T = nb_comm_size(tp),
                   .r = nb_comm_rank(tp), .gather_output = gather_output, .split_input = split_input};
    snprintf(s.tp_dim, sizeof s.tp_dim, "%s", dim);
    if (!check_rule(m, nb_module_type(m), r, s.T)) return nb_last_status();
    nb_status st = apply(&s, m, "", r);
    const nb_params *ps = st == NB_OK ? nb_parameters(m) : NULL;
    for (int j = 0; ps && j < ps->count && st == NB_OK; j++)
        if (!nb__placement_of(ps->tensors[j], mesh)) st = nb_last_status();
    return st;
}

nb_parallelize_opts nb_parallelize_defaults(void) {
    return (nb_parallelize_opts){
        ._init = NB__OPTS_MARK(nb_parallelize_opts), .sequence_parallel = false, .tp_dim = "tp"};
}

/* Every rank's status combined (the worst), so a plan error is an error everywhere. */
static nb_status agree(const nb_mesh *mesh, nb_status st) {
    nb_comm *w = nb_mesh_world(mesh);
    if (nb_comm_size(w) == 1) return st;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", st == NB_OK ? "" : nb_last_error());
    double bad = st == NB_OK ? 0 : 1;
    nb_scope_begin();
    nb_tensor *t = nb_from_buffer(&bad, (int64_t[]){1}, 1, NB_F64);
    nb_status cs = t ? nb_allreduce(w, t, NB_REDUCE_MAX) : nb_last_status();
    double any = cs == NB_OK ? nb_item_f64(t) : 1;
    nb_scope_end();
    if (cs != NB_OK) return cs;
    if (st != NB_OK) return nb_set_error(st, "%s", msg);
    if (any > 0)
        return nb_set_error(NB_EINVAL, "parallelize: another rank refused the plan (see its "
                            "message); every rank must apply the same plan to the same model");
    return NB_OK;
}

nb_status nb_parallelize(nb_module *model, const nb_mesh *mesh, const nb_tp_rule *plan,
                         const nb_parallelize_opts *o) {
    if (o && NB__OPTS_CHECK(o, nb_parallelize_opts, "parallelize", "nb_parallelize_defaults()",
                            "o.sequence_parallel = true") != NB_OK)
        return nb_last_status();
    nb_parallelize_opts opts = o ? *o : nb_parallelize_defaults();
    if (!model || !mesh || !plan)
        return nb_set_error(NB_ENULL, "parallelize: %s is NULL", !model ? "the model"
                            : !mesh ? "the mesh" : "the plan");
    const char *dim = opts.tp_dim ? opts.tp_dim : "tp";
    nb_comm *tp = nb_mesh_group(mesh, dim);
    if (!tp) return nb_last_status();
    style_ctx s = {.tp = tp, .mesh = mesh, .sp = opts.sequence_parallel,
                   .T = nb_comm_size(tp), .r = nb_comm_rank(tp)};
    snprintf(s.tp_dim, sizeof s.tp_dim, "%s", dim);
    walk w = {0};
    collect(&w, model, "");
    nb_status st = w.oom ? nb_set_error(NB_ENOMEM, "parallelize: out of memory") : NB_OK;
    /* 1. match: every rule names a module; no module gets two styles */
    for (int k = 0; st == NB_OK && plan[k].path; k++) {
        int hits = 0;
        for (int i = 1; i < w.n; i++) { /* entry 0 is the root, whose path is "" */
            if (!nb__path_match(plan[k].path, w.e[i].path)) continue;
            hits++;
            int had = w.e[i].rule;
            if (had >= 0 && (plan[had].style != plan[k].style ||
                             plan[had].blocks != plan[k].blocks)) {
                st = nb_set_error(NB_EINVAL, "parallelize: '%s' is matched by \"%s\" (%s) and by "
                                  "\"%s\" (%s); a module takes one style", w.e[i].path,
                                  plan[had].path, style_name(plan[had].style), plan[k].path,
                                  style_name(plan[k].style));
                break;
            }
            w.e[i].rule = k;
        }
        if (st == NB_OK && !hits) {
            char some[256] = "";
            size_t at = 0;
            for (int i = 1; i < w.n && i < 8 && at < sizeof some; i++)
                at += (size_t)snprintf(some + at, sizeof some - at, "%s%s", i > 1 ? ", " : "",
                                       w.e[i].path);
            st = nb_set_error(NB_EINVAL, "parallelize: the plan's rule \"%s\" names no module of "
                              "the %s (its modules: %s%s)", plan[k].path, nb_module_type(model),
                              some, w.n > 8 ? ", ..." : "");
        }
    }
    /* 2. each module fits its style */
    for (int i = 1; st == NB_OK && i < w.n; i++)
        if (w.e[i].rule >= 0 && !check_rule(w.e[i].m, w.e[i].path, &plan[w.e[i].rule], s.T))
            st = nb_last_status();
    if (st == NB_OK && nb_module_flat_params(model))
        st = nb_set_error(NB_ESTATE, "parallelize: the model's parameters are flattened (wrapped "
                          "by nb_ddp or nb_zero?); apply the plan first, then wrap");
    st = agree(mesh, st);
    /* 3. apply: no communication, nothing that can fail on one rank only but memory */
    for (int i = 1; st == NB_OK && i < w.n; i++)
        if (w.e[i].rule >= 0) st = apply(&s, w.e[i].m, w.e[i].path, &plan[w.e[i].rule]);
    /* every other parameter: replicated on this mesh (so norms count it once) */
    const nb_params *ps = st == NB_OK ? nb_parameters(model) : NULL;
    for (int j = 0; ps && j < ps->count && st == NB_OK; j++)
        if (!nb__placement_of(ps->tensors[j], mesh)) st = nb_last_status();
    walk_free(&w);
    return st;
}
