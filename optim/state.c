/* optim/state.c - optimizer state as named tensors (nb_optim_state) and its checked restore
 * (nb_optim_load_state): per-parameter state tensors "<slot>.<param>", update counts
 * "step.<param>" and group hyperparameters "param_groups.<g>.<name>". Together they are the
 * whole mutable state of an optimizer, so save -> load continues bit for bit.
 *
 * Devices: state tensors live on their parameter's device; step counts and hyperparameters
 * are CPU scalars. Loading accepts tensors on any device with data and copies state to the
 * parameter's device (as PyTorch's load_state_dict casts state to the parameter's device);
 * scalars are read through nb_read, so they may live anywhere but on meta. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/autograd.h"
#include "optim/optim_impl.h"

#define STEP_SLOT NB__OPT_SLOTS /* index used for "step" in the per-parameter tables */
#define GROUP_PREFIX "param_groups."

static int popcount(unsigned x) { return __builtin_popcount(x); }

/* Append one entry; scalar entries (owned = true) are kept in sown for freeing. */
static bool push(nb_optim *opt, char *name, nb_tensor *t, bool owned) {
    if (!name || !t) {
        free(name);
        if (owned) nb_tensor_free(t);
        return false;
    }
    int i = opt->slist.count++;
    opt->slist.names[i] = name;
    opt->slist.tensors[i] = t;
    if (owned) opt->sown[opt->nsown++] = t;
    return true;
}

static char *fmt(const char *a, const char *b) {
    char *s = NULL;
    return asprintf(&s, "%s.%s", a, b) < 0 ? NULL : s;
}

/* A new 0-dim tensor owned by the caller (outside any scope). */
static nb_tensor *owned_scalar(double v, nb_dtype dt) {
    nb_tensor *t = nb_full_on(NB_CPU, NULL, 0, dt, v);
    return t ? nb__scope_take(t) : NULL;
}

const nb_params *nb_optim_state(nb_optim *opt) {
    if (!opt) {
        nb__error(NB_ENULL, "optim_state: opt is NULL");
        return NULL;
    }
    if (!nb__obj_ok(opt, NB__OBJ_OPTIM, "optim_state")) return NULL;
    nb__optim_state_clear(opt);
    const nb__optim_kind *k = opt->kind;
    int cap = opt->ngroups * popcount(k->hypers), nscalar = cap;
    for (int i = 0; i < opt->nparams; i++) {
        if (!opt->params[i].has_state) continue;
        cap += k->nslots + (k->has_step ? 1 : 0) + (opt->params[i].master ? 1 : 0);
        nscalar += k->has_step ? 1 : 0;
    }
    size_t n = (size_t)(cap ? cap : 1);
    opt->slist.names = malloc(sizeof(char *) * n);
    opt->slist.tensors = malloc(sizeof(nb_tensor *) * n);
    opt->sown = malloc(sizeof(nb_tensor *) * (size_t)(nscalar ? nscalar : 1));
    bool ok = opt->slist.names && opt->slist.tensors && opt->sown;
    for (int i = 0; i < opt->nparams && ok; i++) {
        nb__oparam *p = &opt->params[i];
        if (!p->has_state) continue;
        const nb__hyper *h = &opt->groups[p->group];
        for (int s = 0; s < k->nslots && ok; s++)
            if (k->slot_used(h, s) && p->slot[s])
                ok = push(opt, fmt(k->slot_names[s], p->name), p->slot[s], false);
        if (k->has_step && ok)
            ok = push(opt, fmt("step", p->name), owned_scalar((double)p->step, NB_I64), true);
        if (p->master && ok) ok = push(opt, fmt("master", p->name), p->master, false);
    }
    for (int g = 0; g < opt->ngroups && ok; g++) {
        for (int h = 0; h < NB__H_COUNT && ok; h++) {
            if (!(k->hypers & (1u << h))) continue;
            char *name = NULL;
            if (asprintf(&name, GROUP_PREFIX "%d.%s", g, nb__hyper_names[h]) < 0) name = NULL;
            ok = push(opt, name, owned_scalar(opt->groups[g].v[h], NB_F64), true);
        }
    }
    if (!ok) {
        nb__optim_state_clear(opt);
        nb__error(NB_ENOMEM, "optim_state: out of memory");
        return NULL;
    }
    return &opt->slist;
}

/* ---- load ----------------------------------------------------------------------------------- */
typedef struct loadctx {
    nb_optim *opt;
    char who[48];
    int *pidx;          /* [nparams][NB__OPT_SLOTS + 1]: entry index or -1 */
    int *gidx;          /* [ngroups][NB__H_COUNT] */
    nb__hyper *h;       /* new group hyperparameters */
    nb_tensor **fresh;  /* [nparams][NB__OPT_SLOTS]: newly allocated slots */
    nb_tensor **src;    /* [nparams][NB__OPT_SLOTS]: loaded state on the parameter's device */
    int64_t *steps;     /* [nparams]: loaded step counts */
    int *midx;          /* [nparams]: the "master.<param>" entry or -1 */
    nb_tensor **msrc;   /* [nparams]: loaded master copies on the parameter's device */
    nb_tensor **mfresh; /* [nparams]: newly allocated master copies */
} loadctx;

static int find_param(const nb_optim *opt, const char *name, int hint) {
    if (hint >= 0 && hint < opt->nparams && strcmp(opt->params[hint].name, name) == 0)
        return hint;
    for (int i = 0; i < opt->nparams; i++)
        if (strcmp(opt->params[i].name, name) == 0) return i;
    return -1;
}

static nb_status unexpected(loadctx *c, const char *name, const char *why) {
    return nb__error(NB_EINVAL, "%s: unexpected entry '%s' (%s)", c->who, name, why);
}

/* Why reading or moving entry `name` failed, with the load's context. */
static nb_status entry_error(loadctx *c, const char *name, nb_status st) {
    return nb_wrap_error(st, "%s: '%s'", c->who, name);
}

static nb_status scalar_value(loadctx *c, const char *name, const nb_tensor *t, double *out) {
    if (nb_numel(t) != 1 || t->dtype == NB_BOOL)
        return nb__error(NB_ESHAPE, "%s: '%s' must be a single number, got a %s tensor of shape "
                         "%s", c->who, name, nb_dtype_name(t->dtype), NB__SHAPE(t));
    nb_status st = nb_read(t, out, 1, NB_F64); /* from any device with data */
    return st == NB_OK ? NB_OK : entry_error(c, name, st);
}

/* Sort every entry into the tables (names only: unknown, duplicate and unexpected names). */
static nb_status parse(loadctx *c, const char *const *names, nb_tensor *const *ts, int n) {
    nb_optim *opt = c->opt;
    const nb__optim_kind *k = opt->kind;
    int hint = 0;
    for (int e = 0; e < n; e++) {
        const char *name = names[e];
        if (!name || !ts[e])
            return nb__error(NB_ENULL, "%s: entry %d has a NULL %s", c->who, e,
                             name ? "tensor" : "name");
        int *slotp;
        if (strncmp(name, GROUP_PREFIX, strlen(GROUP_PREFIX)) == 0) {
            const char *s = name + strlen(GROUP_PREFIX);
            char *end;
            long g = strtol(s, &end, 10);
            if (end == s || *end != '.' || g < 0)
                return unexpected(c, name, "expected param_groups.<index>.<hyperparameter>");
            if (g >= opt->ngroups)
                return unexpected(c, name, "the optimizer has fewer groups");
            int h = 0;
            while (h < NB__H_COUNT &&
                   (!(k->hypers & (1u << h)) || strcmp(end + 1, nb__hyper_names[h]) != 0))
                h++;
            if (h == NB__H_COUNT)
                return unexpected(c, name, "not a hyperparameter of this optimizer");
            slotp = &c->gidx[g * NB__H_COUNT + h];
            double v;
            nb_status st = scalar_value(c, name, ts[e], &v);
            if (st != NB_OK) return st;
            c->h[g].v[h] = v;
        } else {
            const char *dot = strchr(name, '.');
            if (!dot) return unexpected(c, name, "expected <state>.<parameter name>");
            size_t plen = (size_t)(dot - name);
            int s = -1;
            if (k->has_step && plen == 4 && strncmp(name, "step", 4) == 0) s = STEP_SLOT;
            if (plen == 6 && strncmp(name, "master", 6) == 0) {
                int i = find_param(opt, dot + 1, hint);
                if (i < 0) return unexpected(c, name, "no parameter has that name");
                if (!nb__opt_is_half(opt->params[i].t->dtype))
                    return unexpected(c, name, "the parameter is not f16/bf16, so it has no "
                                      "master copy");
                hint = i;
                if (c->midx[i] >= 0)
                    return nb__error(NB_EINVAL, "%s: '%s' appears twice (entries %d and %d)",
                                     c->who, name, c->midx[i], e);
                c->midx[i] = e;
                continue;
            }
            for (int j = 0; j < k->nslots && s < 0; j++)
                if (strlen(k->slot_names[j]) == plen && strncmp(name, k->slot_names[j], plen) == 0)
                    s = j;
            if (s < 0) {
                char why[160];
                int w = snprintf(why, sizeof why, "%s state is", k->name);
                for (int j = 0; j < k->nslots; j++)
                    w += snprintf(why + w, sizeof why - (size_t)w, " %s", k->slot_names[j]);
                if (k->has_step) snprintf(why + w, sizeof why - (size_t)w, " step");
                return unexpected(c, name, why);
            }
            int i = find_param(opt, dot + 1, hint);
            if (i < 0) return unexpected(c, name, "no parameter has that name");
            hint = i;
            slotp = &c->pidx[i * (NB__OPT_SLOTS + 1) + s];
        }
        if (*slotp >= 0)
            return nb__error(NB_EINVAL, "%s: '%s' appears twice (entries %d and %d)", c->who, name,
                             *slotp, e);
        *slotp = e;
    }
    return NB_OK;
}

/* With the new hyperparameters known: completeness, shapes and dtypes. */
static nb_status validate(loadctx *c, const char *const *names, nb_tensor *const *ts) {
    nb_optim *opt = c->opt;
    const nb__optim_kind *k = opt->kind;
    for (int g = 0; g < opt->ngroups; g++) {
        for (int h = 0; h < NB__H_COUNT; h++)
            if ((k->hypers & (1u << h)) && c->gidx[g * NB__H_COUNT + h] < 0)
                return nb__error(NB_EINVAL, "%s: missing '" GROUP_PREFIX "%d.%s'", c->who, g,
                                 nb__hyper_names[h]);
        nb_status st = k->check(&c->h[g], c->who);
        if (st != NB_OK) return st;
    }
    for (int i = 0; i < opt->nparams; i++) {
        nb__oparam *p = &opt->params[i];
        const int *idx = &c->pidx[i * (NB__OPT_SLOTS + 1)];
        bool any = c->midx[i] >= 0;
        for (int s = 0; s <= NB__OPT_SLOTS; s++) any |= idx[s] >= 0;
        if (!any) continue;
        const nb__hyper *h = &c->h[p->group];
        const nb_dtype wdt = nb__opt_work_dtype(p->t->dtype);
        if (c->midx[i] >= 0) {
            const nb_tensor *t = ts[c->midx[i]];
            if (t->ndim != p->t->ndim ||
                memcmp(t->shape, p->t->shape, sizeof(int64_t) * (size_t)t->ndim) != 0)
                return nb__error(NB_ESHAPE, "%s: '%s' has shape %s but the parameter has shape %s",
                                 c->who, names[c->midx[i]], NB__SHAPE(t), NB__SHAPE(p->t));
            if (t->dtype != NB_F32)
                return nb__error(NB_EDTYPE, "%s: '%s' is %s; master weights are f32", c->who,
                                 names[c->midx[i]], nb_dtype_name(t->dtype));
        }
        for (int s = 0; s < k->nslots; s++) {
            bool used = k->slot_used(h, s);
            if (!used && idx[s] >= 0)
                return unexpected(c, names[idx[s]], "not used with these hyperparameters");
            if (used && idx[s] < 0)
                return nb__error(NB_EINVAL, "%s: missing '%s.%s' (the state of '%s' is "
                                 "incomplete)", c->who, k->slot_names[s], p->name, p->name);
            if (!used) continue;
            const nb_tensor *t = ts[idx[s]];
            if (t->ndim != p->t->ndim ||
                memcmp(t->shape, p->t->shape, sizeof(int64_t) * (size_t)t->ndim) != 0)
                return nb__error(NB_ESHAPE, "%s: '%s' has shape %s but the parameter has shape %s",
                                 c->who, names[idx[s]], NB__SHAPE(t), NB__SHAPE(p->t));
            if (t->dtype != wdt && wdt == p->t->dtype)
                return nb__error(NB_EDTYPE, "%s: '%s' is %s but the parameter is %s", c->who,
                                 names[idx[s]], nb_dtype_name(t->dtype),
                                 nb_dtype_name(p->t->dtype));
            if (t->dtype != wdt)
                return nb__error(NB_EDTYPE, "%s: '%s' is %s but the state of a %s parameter is "
                                 "f32", c->who, names[idx[s]], nb_dtype_name(t->dtype),
                                 nb_dtype_name(p->t->dtype));
        }
        if (k->has_step) {
            if (idx[STEP_SLOT] < 0)
                return nb__error(NB_EINVAL, "%s: missing 'step.%s' (the state of '%s' is "
                                 "incomplete)", c->who, p->name, p->name);
            double v;
            nb_status st = scalar_value(c, names[idx[STEP_SLOT]], ts[idx[STEP_SLOT]], &v);
            if (st != NB_OK) return st;
            if (!(v >= 0) || v != floor(v) || v > 9007199254740992.0)
                return nb__error(NB_EINVAL, "%s: '%s' must be a whole number >= 0, got %g",
                                 c->who, names[idx[STEP_SLOT]], v);
            c->steps[i] = (int64_t)v;
        }
    }
    /* Allocate what is missing now, and bring the loaded state to the parameters' devices,
     * so applying cannot fail half way. */
    for (int i = 0; i < opt->nparams; i++) {
        nb__oparam *p = &opt->params[i];
        const int *idx = &c->pidx[i * (NB__OPT_SLOTS + 1)];
        nb_device dev = nb__device_of(p->t);
        for (int s = 0; s < k->nslots; s++) {
            if (idx[s] < 0) continue;
            nb_tensor *src = nb_to_device(ts[idx[s]], dev); /* a new reference when there */
            if (!src) return entry_error(c, names[idx[s]], nb_last_status());
            c->src[i * NB__OPT_SLOTS + s] = nb__scope_take(src);
            /* State made on another device (before the parameter moved) is replaced. */
            if (p->slot[s] && nb_device_equal(nb__device_of(p->slot[s]), dev)) continue;
            nb_tensor *t = nb__empty(p->t->shape, p->t->ndim, nb__opt_work_dtype(p->t->dtype),
                                     dev);
            if (!t) return nb_last_status();
            c->fresh[i * NB__OPT_SLOTS + s] = nb__scope_take(t);
        }
        /* A half parameter with state gets its master copy: the saved one, else (a file
         * without it) the parameter's values. */
        bool any = c->midx[i] >= 0;
        for (int s = 0; s <= NB__OPT_SLOTS; s++) any |= idx[s] >= 0;
        if (!any || !nb__opt_is_half(p->t->dtype)) continue;
        if (c->midx[i] >= 0) {
            nb_tensor *src = nb_to_device(ts[c->midx[i]], dev);
            if (!src) return entry_error(c, names[c->midx[i]], nb_last_status());
            c->msrc[i] = nb__scope_take(src);
        }
        if (p->master && nb_device_equal(nb__device_of(p->master), dev)) continue;
        nb_tensor *t = nb__empty(p->t->shape, p->t->ndim, NB_F32, dev);
        if (!t) return nb_last_status();
        c->mfresh[i] = nb__scope_take(t);
    }
    return NB_OK;
}

static void apply(loadctx *c, nb_tensor *const *ts) {
    nb_optim *opt = c->opt;
    const nb__optim_kind *k = opt->kind;
    for (int i = 0; i < opt->nparams; i++) {
        nb__oparam *p = &opt->params[i];
        const int *idx = &c->pidx[i * (NB__OPT_SLOTS + 1)];
        bool any = c->midx[i] >= 0;
        for (int s = 0; s <= NB__OPT_SLOTS; s++) any |= idx[s] >= 0;
        if (!any) {
            nb__oparam_reset(p);
            continue;
        }
        if (nb__opt_is_half(p->t->dtype)) {
            if (c->mfresh[i]) {
                nb_tensor_free(p->master);
                p->master = c->mfresh[i];
                c->mfresh[i] = NULL;
            }
            nb_copy_(p->master, c->msrc[i] ? c->msrc[i] : p->t);
        }
        for (int s = 0; s < k->nslots; s++) {
            if (idx[s] < 0) {
                nb_tensor_free(p->slot[s]);
                p->slot[s] = NULL;
                continue;
            }
            nb_tensor **fresh = &c->fresh[i * NB__OPT_SLOTS + s];
            if (*fresh) {
                nb_tensor_free(p->slot[s]);
                p->slot[s] = *fresh;
                *fresh = NULL;
            }
            nb_copy_(p->slot[s], c->src[i * NB__OPT_SLOTS + s]);
        }
        p->step = k->has_step ? c->steps[i] : 0;
        p->has_state = true;
    }
    memcpy(opt->groups, c->h, sizeof(nb__hyper) * (size_t)opt->ngroups);
}

nb_status nb_optim_load_state(nb_optim *opt, const char *const *names, nb_tensor *const *ts,
                              int n) {
    if (!opt) return nb__error(NB_ENULL, "optim_load_state: opt is NULL");
    if (!nb__obj_ok(opt, NB__OBJ_OPTIM, "optim_load_state")) return nb_last_status();
    if (n < 0 || (n > 0 && (!names || !ts)))
        return nb__error(NB_ENULL, "optim_load_state: %d entries but %s is NULL", n,
                         !names ? "names" : "tensors");
    loadctx c = {.opt = opt};
    snprintf(c.who, sizeof c.who, "optim_load_state (%s)", opt->kind->name);
    size_t np = (size_t)opt->nparams + 1, ng = (size_t)opt->ngroups;
    c.pidx = malloc(sizeof(int) * np * (NB__OPT_SLOTS + 1));
    c.gidx = malloc(sizeof(int) * ng * NB__H_COUNT);
    c.h = malloc(sizeof(nb__hyper) * ng);
    c.fresh = calloc(np * NB__OPT_SLOTS, sizeof(nb_tensor *));
    c.src = calloc(np * NB__OPT_SLOTS, sizeof(nb_tensor *));
    c.steps = calloc(np, sizeof(int64_t));
    c.midx = malloc(sizeof(int) * np);
    c.msrc = calloc(np, sizeof(nb_tensor *));
    c.mfresh = calloc(np, sizeof(nb_tensor *));
    nb_status st = NB_OK;
    if (!c.pidx || !c.gidx || !c.h || !c.fresh || !c.src || !c.steps || !c.midx || !c.msrc ||
        !c.mfresh) {
        st = nb__error(NB_ENOMEM, "optim_load_state: out of memory");
    } else {
        memset(c.pidx, -1, sizeof(int) * np * (NB__OPT_SLOTS + 1));
        memset(c.gidx, -1, sizeof(int) * ng * NB__H_COUNT);
        memset(c.midx, -1, sizeof(int) * np);
        memcpy(c.h, opt->groups, sizeof(nb__hyper) * ng);
        bool prev = nb_set_grad_enabled(false);
        st = parse(&c, names, ts, n);
        if (st == NB_OK) st = validate(&c, names, ts);
        if (st == NB_OK) apply(&c, ts);
        nb_set_grad_enabled(prev);
        /* The loaded tensors may have been our own list's: drop the list only now. */
        if (st == NB_OK) nb__optim_state_clear(opt);
    }
    for (size_t i = 0; i < np * NB__OPT_SLOTS; i++) {
        if (c.fresh) nb_tensor_free(c.fresh[i]);
        if (c.src) nb_tensor_free(c.src[i]);
    }
    free(c.pidx);
    free(c.gidx);
    free(c.h);
    free(c.fresh);
    free(c.src);
    for (size_t i = 0; i < np; i++) {
        if (c.msrc) nb_tensor_free(c.msrc[i]);
        if (c.mfresh) nb_tensor_free(c.mfresh[i]);
    }
    free(c.steps);
    free(c.midx);
    free(c.msrc);
    free(c.mfresh);
    return st;
}
