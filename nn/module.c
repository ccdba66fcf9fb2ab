/* module.c - the module object: named parameters, buffers and children, recursive listing
 * with dotted names, train/eval mode, flat parameter memory (docs/architecture.md rule 10) and
 * moving a module between devices. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn_impl.h"
#include "tensor/tape.h"
#include "tensor/backend.h"
#include "tensor/handle.h"
#include "tensor/trace.h"
#include "nabla/nn.h"

typedef struct {
    int n, cap;
    char **names;
    void **items;
} named_list;

struct nb_module {
    nb__obj h; /* a checked handle (tensor/handle.h) */
    const nb_module_vtable *vt;
    void *self;
    bool training;
    named_list params, buffers, children;
    /* recursive listings, rebuilt when stale */
    nb_params plist, blist;
    bool plist_ok, blist_ok;
    nb_module *parent;
    nb_tensor *flat_params, *flat_grads;
    struct fhook *hooks;    /* forward hooks, in registration order */
    int nhooks, cap_hooks, next_hook;
    int running_hooks;      /* > 0 while this module's hooks run (removal then refused) */
    bool recompute;         /* nb_module_set_recompute */
    nb_generator *recompute_gen;
    /* nb__module_override_forward: what runs instead of vt->forward */
    nb__forward_fn override;
    void *override_ctx;
    void (*override_free)(void *);
    bool borrows;           /* a view (nb__module_view_new): members are not freed */
};

struct fhook {
    int handle;
    nb_forward_pre_hook_fn pre; /* exactly one of pre and post is set */
    nb_forward_hook_fn post;
    void *ctx;
};

static bool list_add(named_list *l, const char *name, void *item) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 8;
        char **names = realloc(l->names, sizeof(char *) * (size_t)cap);
        if (names) l->names = names;
        void **items = names ? realloc(l->items, sizeof(void *) * (size_t)cap) : NULL;
        if (!items) return false;
        l->items = items;
        l->cap = cap;
    }
    l->names[l->n] = strdup(name);
    if (!l->names[l->n]) return false;
    l->items[l->n++] = item;
    return true;
}

static int list_find(const named_list *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->names[i], name) == 0) return i;
    return -1;
}

static void invalidate(nb_module *m) {
    for (; m; m = m->parent) m->plist_ok = m->blist_ok = false;
}

static void params_clear(nb_params *p) {
    for (int i = 0; i < p->count; i++) free(nb__unconst(p->names[i]));
    free(p->names);
    free(p->tensors);
    memset(p, 0, sizeof *p);
}

nb_module *nb_module_new(const nb_module_vtable *vt, void *self) {
    if (!vt || !vt->type_name) {
        nb__error(NB_ENULL, "module_new: a vtable with a type_name is required");
        return NULL;
    }
    nb_module *m = nb__obj_alloc(sizeof *m, NB__OBJ_MODULE);
    if (!m) {
        nb__error(NB_ENOMEM, "module_new: out of memory");
        return NULL;
    }
    m->vt = vt;
    m->self = self;
    m->training = true;
    return m;
}

void nb_module_free(nb_module *m) {
    if (!m || !nb__obj_ok(m, NB__OBJ_MODULE, "module_free")) return;
    for (int i = 0; i < m->children.n && !m->borrows; i++) nb_module_free(m->children.items[i]);
    for (int i = 0; i < m->params.n; i++) nb_tensor_free(m->params.items[i]);
    for (int i = 0; i < m->buffers.n; i++) nb_tensor_free(m->buffers.items[i]);
    named_list *ls[3] = {&m->params, &m->buffers, &m->children};
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < ls[k]->n; i++) free(ls[k]->names[i]);
        free(ls[k]->names);
        free(ls[k]->items);
    }
    params_clear(&m->plist);
    params_clear(&m->blist);
    nb_tensor_free(m->flat_params);
    nb_tensor_free(m->flat_grads);
    free(m->hooks);
    if (m->override_free) m->override_free(m->override_ctx);
    if (m->vt->free_self) m->vt->free_self(m->self);
    nb__obj_free(m);
}

#define LIVE(m, op) ((m) && nb__obj_ok((m), NB__OBJ_MODULE, (op))) /* NULL: quietly false */
void *nb_module_self(const nb_module *m) { return LIVE(m, "module_self") ? m->self : NULL; }
const char *nb_module_type(const nb_module *m) {
    return LIVE(m, "module_type") ? m->vt->type_name : NULL;
}

static bool valid_name(const char *name, const char *op) {
    if (!name || !*name || strchr(name, '.')) {
        nb__error(NB_EINVAL, "%s: name \"%s\" must be non-empty and contain no '.'", op,
                  name ? name : "(null)");
        return false;
    }
    return true;
}

static bool name_free(const nb_module *m, const char *name, const char *op) {
    if (list_find(&m->params, name) >= 0 || list_find(&m->buffers, name) >= 0 ||
        list_find(&m->children, name) >= 0) {
        nb__error(NB_EINVAL, "%s: %s already has a member named \"%s\"", op, m->vt->type_name,
                  name);
        return false;
    }
    return true;
}

/* Registered tensors must not belong to a scope: the module owns them. */
static nb_tensor *adopt(nb_tensor *t) { return nb__scope_take(t); }

nb_tensor *nb_module_add_parameter(nb_module *m, const char *name, nb_tensor *t) {
    if (m && !nb__obj_ok(m, NB__OBJ_MODULE, "module_add_parameter")) m = NULL;
    if (!m || !t) {
        if (t) nb_tensor_free(adopt(t));
        nb__arg_ok(NULL, "module_add_parameter", m ? "t" : "m");
        return NULL;
    }
    /* The reference is taken over in every case: on failure it is released here. */
    if (!valid_name(name, "module_add_parameter") || !name_free(m, name, "module_add_parameter") ||
        nb_set_requires_grad(t, true) != NB_OK) {
        nb_tensor_free(adopt(t));
        return NULL;
    }
    if (!list_add(&m->params, name, adopt(t))) {
        nb_tensor_free(t);
        nb__error(NB_ENOMEM, "module_add_parameter: out of memory");
        return NULL;
    }
    invalidate(m);
    return t;
}

nb_tensor *nb_module_add_buffer(nb_module *m, const char *name, nb_tensor *t) {
    if (m && !nb__obj_ok(m, NB__OBJ_MODULE, "module_add_buffer")) m = NULL;
    if (!m || !t) {
        if (t) nb_tensor_free(adopt(t));
        nb__arg_ok(NULL, "module_add_buffer", m ? "t" : "m");
        return NULL;
    }
    if (!valid_name(name, "module_add_buffer") || !name_free(m, name, "module_add_buffer")) {
        nb_tensor_free(adopt(t));
        return NULL;
    }
    if (!list_add(&m->buffers, name, adopt(t))) {
        nb_tensor_free(t);
        nb__error(NB_ENOMEM, "module_add_buffer: out of memory");
        return NULL;
    }
    invalidate(m);
    return t;
}

nb_module *nb_module_add_child(nb_module *m, const char *name, nb_module *child) {
    if ((m && !nb__obj_ok(m, NB__OBJ_MODULE, "module_add_child")) ||
        (child && !nb__obj_ok(child, NB__OBJ_MODULE, "module_add_child")))
        return NULL;
    if (!m || !child) {
        nb__error(NB_ENULL, "module_add_child: %s is NULL", m ? "child" : "m");
        nb_module_free(child);
        return NULL;
    }
    if (child->parent) {
        nb__error(NB_EINVAL, "module_add_child: the %s already belongs to another module",
                  child->vt->type_name);
        return NULL;
    }
    if (!valid_name(name, "module_add_child") || !name_free(m, name, "module_add_child") ||
        !list_add(&m->children, name, child)) {
        nb_module_free(child);
        return NULL;
    }
    child->parent = m;
    invalidate(m);
    return child;
}

/* The names of l, ", "-separated, into buf; a list too long for it ends in ", ...". */
static void names_of(const named_list *l, char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < l->n; i++) {
        const char *sep = i ? ", " : "";
        size_t need = strlen(sep) + strlen(l->names[i]);
        if (used + need + sizeof ", ..." > cap) {
            snprintf(buf + used, cap - used, "%s...", sep);
            return;
        }
        used += (size_t)snprintf(buf + used, cap - used, "%s%s", sep, l->names[i]);
    }
}

/* Look name up in m's list `which` ("parameter", "buffer", "child"); when it is missing and
 * `op` is set, fail naming it and the names that do exist. A NULL module keeps the first
 * error (nb_module_param(nb_module_child(m, "typo"), ...) reports the typo). */
static void *lookup(const nb_module *m, const named_list *l, const char *name, const char *op,
                    const char *which) {
    if (m && !nb__obj_ok(m, NB__OBJ_MODULE, op ? op : "module_lookup")) return NULL;
    if (!m || !name) {
        if (op && nb_last_status() == NB_OK)
            nb__error(NB_ENULL, "%s: %s is NULL", op, m ? "name" : "module");
        return NULL;
    }
    int i = list_find(l, name);
    if (i >= 0) return l->items[i];
    if (op) {
        char names[256];
        names_of(l, names, sizeof names);
        nb__error(NB_EINVAL, "%s: no %s '%s' in this %s (%s%s: %s)%s", op, which, name,
                  m->vt->type_name, which, strcmp(which, "child") ? "s" : "ren",
                  l->n ? names : "none",
                  strchr(name, '.') ? "; it looks up direct members: use nb_module_find for "
                                      "dotted names" : "");
    }
    return NULL;
}

nb_tensor *nb_module_param(const nb_module *m, const char *name) {
    return lookup(m, m ? &m->params : NULL, name, "module_param", "parameter");
}
nb_tensor *nb_module_buffer(const nb_module *m, const char *name) {
    return lookup(m, m ? &m->buffers : NULL, name, "module_buffer", "buffer");
}
nb_module *nb_module_child(const nb_module *m, const char *name) {
    return lookup(m, m ? &m->children : NULL, name, "module_child", "child");
}
nb_tensor *nb_module_param_opt(const nb_module *m, const char *name) {
    return lookup(m, m ? &m->params : NULL, name, NULL, NULL);
}
nb_tensor *nb_module_buffer_opt(const nb_module *m, const char *name) {
    return lookup(m, m ? &m->buffers : NULL, name, NULL, NULL);
}
int nb_module_num_children(const nb_module *m) {
    return LIVE(m, "module_num_children") ? m->children.n : 0;
}
nb_module *nb_module_child_at(const nb_module *m, int i) {
    return LIVE(m, "module_child_at") && i >= 0 && i < m->children.n ? m->children.items[i] : NULL;
}

const char *nb_module_child_name(const nb_module *m, int i) {
    return LIVE(m, "module_child_name") && i >= 0 && i < m->children.n ? m->children.names[i]
                                                                        : NULL;
}

/* nb_module_find at m, the module reached through dotted's first `at` characters; on a
 * miss, the message names that module and what it does have. */
static nb_tensor *find_in(const nb_module *m, const char *dotted, size_t at) {
    const char *rest = dotted + at, *dot = strchr(rest, '.');
    char where[160], names[256];
    if (at) snprintf(where, sizeof where, "'%.*s' (a %s)", (int)(at - 1), dotted, m->vt->type_name);
    else snprintf(where, sizeof where, "the %s", m->vt->type_name);
    if (!dot) {
        nb_tensor *t = nb_module_param_opt(m, rest);
        if (!t) t = nb_module_buffer_opt(m, rest);
        if (t) return t;
        char bufs[128];
        names_of(&m->params, names, sizeof names);
        names_of(&m->buffers, bufs, sizeof bufs);
        nb__error(NB_EINVAL, "module_find: no parameter or buffer '%s' in %s (parameters: %s; "
                  "buffers: %s)", dotted, where, m->params.n ? names : "none",
                  m->buffers.n ? bufs : "none");
        return NULL;
    }
    size_t n = (size_t)(dot - rest);
    for (int i = 0; i < m->children.n; i++)
        if (strlen(m->children.names[i]) == n && strncmp(m->children.names[i], rest, n) == 0)
            return find_in(m->children.items[i], dotted, at + n + 1);
    names_of(&m->children, names, sizeof names);
    nb__error(NB_EINVAL, "module_find: no child '%.*s' in %s looking up '%s' (children: %s)",
              (int)n, rest, where, dotted, m->children.n ? names : "none");
    return NULL;
}

nb_tensor *nb_module_find(const nb_module *m, const char *dotted) {
    if (m && !nb__obj_ok(m, NB__OBJ_MODULE, "module_find")) return NULL;
    if (!m || !dotted) {
        if (nb_last_status() == NB_OK)
            nb__error(NB_ENULL, "module_find: %s is NULL", m ? "dotted_name" : "module");
        return NULL;
    }
    return find_in(m, dotted, 0);
}

/* Whether t is already in the listing (a tensor registered twice: tied weights). */
static bool listed(const nb_params *out, const nb_tensor *t) {
    for (int i = 0; i < out->count; i++)
        if (out->tensors[i] == t) return true;
    return false;
}

/* Depth first: own members first, then children in order (PyTorch's named_parameters). A
 * tensor registered under several names (a tied weight) is listed once, under the first. */
static bool collect(const nb_module *m, bool buffers, const char *prefix, nb_params *out,
                    int *cap) {
    const named_list *l = buffers ? &m->buffers : &m->params;
    for (int i = 0; i < l->n; i++) {
        if (listed(out, l->items[i])) continue;
        if (out->count == *cap) {
            *cap = *cap ? 2 * *cap : 16;
            nb_tensor **t = realloc(out->tensors, sizeof(nb_tensor *) * (size_t)*cap);
            if (t) out->tensors = t;
            const char **nm = t ? realloc(out->names, sizeof(char *) * (size_t)*cap) : NULL;
            if (!nm) return false;
            out->names = nm;
        }
        size_t len = strlen(prefix) + strlen(l->names[i]) + 1;
        char *name = malloc(len);
        if (!name) return false;
        snprintf(name, len, "%s%s", prefix, l->names[i]);
        out->names[out->count] = name;
        out->tensors[out->count++] = l->items[i];
    }
    for (int i = 0; i < m->children.n; i++) {
        size_t len = strlen(prefix) + strlen(m->children.names[i]) + 2;
        char *p = malloc(len);
        if (!p) return false;
        snprintf(p, len, "%s%s.", prefix, m->children.names[i]);
        bool ok = collect(m->children.items[i], buffers, p, out, cap);
        free(p);
        if (!ok) return false;
    }
    return true;
}

static const nb_params *listing(nb_module *m, bool buffers) {
    if (!m) {
        nb__error(NB_ENULL, "parameters: module is NULL");
        return NULL;
    }
    if (!nb__obj_ok(m, NB__OBJ_MODULE, buffers ? "buffers" : "parameters")) return NULL;
    nb_params *p = buffers ? &m->blist : &m->plist;
    bool *ok = buffers ? &m->blist_ok : &m->plist_ok;
    if (*ok) return p;
    params_clear(p);
    int cap = 0;
    if (!collect(m, buffers, "", p, &cap)) {
        params_clear(p);
        nb__error(NB_ENOMEM, "parameters: out of memory");
        return NULL;
    }
    *ok = true;
    return p;
}

const nb_params *nb_parameters(nb_module *m) { return listing(m, false); }
const nb_params *nb_buffers(nb_module *m) { return listing(m, true); }

int64_t nb_num_parameters(nb_module *m) {
    const nb_params *p = nb_parameters(m);
    int64_t n = 0;
    for (int i = 0; p && i < p->count; i++) n += nb_numel(p->tensors[i]);
    return n;
}

nb_status nb_module_set_recompute(nb_module *m, bool on, nb_generator *gen) {
    if (!m) return nb__error(NB_ENULL, "module_set_recompute: module is NULL");
    if (!nb__obj_ok(m, NB__OBJ_MODULE, "module_set_recompute")) return nb_last_status();
    m->recompute = on;
    m->recompute_gen = on ? gen : NULL;
    return NB_OK;
}

bool nb_module_recompute(const nb_module *m) { return LIVE(m, "module_recompute") && m->recompute; }

static nb_tensor *run_forward(nb_module *m, nb_tensor *x) {
    return m->override ? m->override(m, x, m->override_ctx) : m->vt->forward(m, x);
}

static nb_tensor *own_forward(nb_tensor *const *in, int n, void *ctx) {
    (void)n;
    return run_forward(ctx, in[0]);
}

/* The module's forward as a span of the trace and the profiler (its type name). */
static nb_tensor *traced_forward(nb_module *m, nb_tensor *x) {
    int tok = NB__SPAN_BEGIN(m->vt->type_name, NULL, NB__CAT_MODULE);
    nb_recompute_opts ro = nb_recompute_defaults();
    ro.gen = m->recompute_gen;
    nb_tensor *y = m->recompute ? nb_recompute(own_forward, &x, 1, m, &ro) : run_forward(m, x);
    NB__SPAN_END(tok);
    return y;
}

nb_tensor *nb_forward(nb_module *m, nb_tensor *x) {
    if (!m) {
        nb__error(NB_ENULL, "forward: module is NULL");
        return NULL;
    }
    if (!nb__obj_ok(m, NB__OBJ_MODULE, "forward")) return NULL;
    if (!m->vt->forward && !m->override) {
        nb__error(NB_EUNSUPPORTED, "forward: a %s has no forward of its own", m->vt->type_name);
        return NULL;
    }
    /* A NULL input propagates the failure that made it (or is NB_ENULL): neither the
     * forward nor a hook runs (ZeRO-3's would start a parameter gather for every later
     * unit of a forward that already failed - one communicator timeout each when a peer
     * is gone). */
    if (!x) {
        if (nb_last_status() == NB_OK)
            nb__error(NB_ENULL, "forward: the input of a %s is NULL", m->vt->type_name);
        return NULL;
    }
    if (!m->nhooks) return traced_forward(m, x);
    /* Hooks registered by a hook run from the next call on: iterate over a snapshot count. */
    int n = m->nhooks;
    nb_status st = NB_OK;
    m->running_hooks++;
    for (int i = 0; i < n && st == NB_OK; i++)
        if (m->hooks[i].pre && (st = m->hooks[i].pre(m, x, m->hooks[i].ctx)) != NB_OK &&
            nb_last_status() == NB_OK)
            nb__error(st, "forward: a pre-forward hook of a %s failed", m->vt->type_name);
    nb_tensor *out = st == NB_OK ? traced_forward(m, x) : NULL;
    for (int i = 0; i < n && out; i++)
        if (m->hooks[i].post && (st = m->hooks[i].post(m, x, out, m->hooks[i].ctx)) != NB_OK) {
            if (nb_last_status() == NB_OK)
                nb__error(st, "forward: a forward hook of a %s failed", m->vt->type_name);
            nb_tensor_free(nb__scope_take(out));
            out = NULL;
        }
    m->running_hooks--;
    return out;
}

static int add_hook(nb_module *m, nb_forward_pre_hook_fn pre, nb_forward_hook_fn post, void *ctx,
                    const char *op) {
    if (!m) return nb__error(NB_ENULL, "%s: module is NULL", op);
    if (!nb__obj_ok(m, NB__OBJ_MODULE, op)) return nb_last_status();
    if (!pre && !post) return nb__error(NB_ENULL, "%s: the hook function is NULL", op);
    if (m->nhooks == m->cap_hooks) {
        int cap = m->cap_hooks ? 2 * m->cap_hooks : 4;
        struct fhook *h = realloc(m->hooks, sizeof *h * (size_t)cap);
        if (!h) return nb__error(NB_ENOMEM, "%s: out of memory", op);
        m->hooks = h, m->cap_hooks = cap;
    }
    int handle = m->next_hook++;
    m->hooks[m->nhooks++] = (struct fhook){.handle = handle, .pre = pre, .post = post, .ctx = ctx};
    return handle;
}

int nb_module_register_forward_pre_hook(nb_module *m, nb_forward_pre_hook_fn fn, void *ctx) {
    return add_hook(m, fn, NULL, ctx, "module_register_forward_pre_hook");
}

int nb_module_register_forward_hook(nb_module *m, nb_forward_hook_fn fn, void *ctx) {
    return add_hook(m, NULL, fn, ctx, "module_register_forward_hook");
}

nb_status nb_module_remove_forward_hook(nb_module *m, int handle) {
    static const char op[] = "module_remove_forward_hook";
    if (!m) return nb__error(NB_ENULL, "%s: module is NULL", op);
    if (!nb__obj_ok(m, NB__OBJ_MODULE, op)) return nb_last_status();
    if (m->running_hooks)
        return nb__error(NB_ESTATE, "%s: the %s's hooks are running (remove a hook after its "
                         "forward returns)", op, m->vt->type_name);
    for (int i = 0; i < m->nhooks; i++)
        if (m->hooks[i].handle == handle) {
            memmove(&m->hooks[i], &m->hooks[i + 1], sizeof *m->hooks * (size_t)(m->nhooks - i - 1));
            m->nhooks--;
            return NB_OK;
        }
    return nb__error(NB_EINVAL, "%s: the %s has no forward hook with handle %d", op,
                     m->vt->type_name, handle);
}

void nb_module_train(nb_module *m, bool training) {
    if (!LIVE(m, "module_train")) return;
    m->training = training;
    for (int i = 0; i < m->children.n; i++) nb_module_train(m->children.items[i], training);
}

bool nb_module_is_training(const nb_module *m) { return LIVE(m, "module_is_training") && m->training; }

void nb_module_zero_grad(nb_module *m) {
    if (m && !nb__obj_ok(m, NB__OBJ_MODULE, "module_zero_grad")) return;
    const nb_params *p = nb_parameters(m);
    if (m && m->flat_grads) { /* keep the flat views: zero them instead */
        nb_fill_(m->flat_grads, 0);
        return;
    }
    for (int i = 0; p && i < p->count; i++) nb_clear_grad(p->tensors[i]);
}

/* Point t's header at [offset, offset + numel) of storage s, contiguous. Every reference
 * to the parameter sees the move, which is what keeps optimizers built earlier valid. */
static void rebase(nb_tensor *t, nb__storage *s, int64_t offset) {
    atomic_fetch_add(&s->refcount, 1);
    nb__storage *old = t->storage;
    t->storage = s;
    t->offset = offset;
    nb__contiguous_strides(t->shape, t->ndim, t->strides);
    nb__storage_release(old);
}

nb_status nb_module_flatten_parameters(nb_module *m, int64_t align) {
    const nb_params *p = nb_parameters(m);
    if (!p) return nb_last_status();
    if (m->flat_params) return NB_OK;
    if (p->count == 0) return nb__error(NB_EINVAL, "flatten_parameters: the module has no parameters");
    if (align <= 0) align = 16;
    nb_dtype dt = p->tensors[0]->dtype;
    nb_device dev; /* the flat buffers live where the parameters do */
    if (!nb__check_devices("flatten_parameters", p->tensors, p->count, &dev))
        return nb_last_status();
    int64_t total = 0;
    for (int i = 0; i < p->count; i++) {
        if (p->tensors[i]->dtype != dt)
            return nb__error(NB_EDTYPE, "flatten_parameters: %s is %s but %s is %s; one flat "
                             "buffer holds one dtype", p->names[i],
                             nb_dtype_name(p->tensors[i]->dtype), p->names[0], nb_dtype_name(dt));
        total = (total + align - 1) / align * align + nb_numel(p->tensors[i]);
    }
    nb_tensor *fp = nb_zeros_on(dev, &total, 1, dt);
    nb_tensor *fg = fp ? nb_zeros_on(dev, &total, 1, dt) : NULL;
    if (!fg) {
        nb_tensor_free(nb__scope_take(fp));
        return nb_last_status();
    }
    fp = nb__scope_take(fp), fg = nb__scope_take(fg);
    bool prev = nb_set_grad_enabled(false);
    int64_t off = 0;
    for (int i = 0; i < p->count; i++) {
        nb_tensor *t = p->tensors[i];
        off = (off + align - 1) / align * align;
        nb_tensor *dst = nb__view_of(fp, t->shape, t->strides, t->ndim, off);
        nb__contiguous_strides(t->shape, t->ndim, dst->strides);
        nb_copy_(dst, t);
        nb_tensor_free(nb__scope_take(dst));
        rebase(t, fp->storage, off);
        nb_tensor *g = nb__view_of(fg, t->shape, t->strides, t->ndim, off);
        if (t->grad) nb_copy_(g, t->grad);
        nb_set_grad(t, g);
        nb_tensor_free(nb__scope_take(g));
        off += nb_numel(t);
    }
    nb_set_grad_enabled(prev);
    m->flat_params = fp;
    m->flat_grads = fg;
    return NB_OK;
}

/* For ZeRO stage 2 (parallel/zero.c, which declares it): forget the flat gradient buffer,
 * whose parameters' views the caller has dropped, so it is freed; the parameters get
 * gradients of their own again. */
nb_status nb__module_drop_flat_grads(nb_module *m);
nb_status nb__module_drop_flat_grads(nb_module *m) {
    if (!m) return nb__error(NB_ENULL, "module_drop_flat_grads: module is NULL");
    nb_tensor_free(m->flat_grads);
    m->flat_grads = NULL;
    return NB_OK;
}

/* For ZeRO stage 3 (parallel/zero.c, which declares it): forget the flat parameter buffer,
 * whose parameters the caller has moved to storage of its own, so it is freed. */
nb_status nb__module_drop_flat_params(nb_module *m);
nb_status nb__module_drop_flat_params(nb_module *m) {
    if (!m) return nb__error(NB_ENULL, "module_drop_flat_params: module is NULL");
    nb_tensor_free(m->flat_params);
    m->flat_params = NULL;
    return NB_OK;
}

nb_tensor *nb_module_flat_params(const nb_module *m) {
    return LIVE(m, "module_flat_params") ? m->flat_params : NULL;
}
nb_tensor *nb_module_flat_grads(const nb_module *m) {
    return LIVE(m, "module_flat_grads") ? m->flat_grads : NULL;
}

/* ---- devices ----------------------------------------------------------------------------------
 * nb_module_to moves storages, not tensors: every storage that a tensor of the module uses
 * (parameters, their gradients, buffers, flat buffers) is copied once, as bytes, to the
 * new device, and each of those tensor headers is pointed at the copy with its offset and
 * strides unchanged. So headers keep their identity (whoever holds a parameter sees the
 * move, names and requires_grad stay), and tensors sharing memory still share it: the
 * views of a flat buffer, tied weights. */
typedef struct {
    nb_tensor **ts;
    int n, cap;
} tensor_list;

static bool tl_add(tensor_list *l, nb_tensor *t) {
    if (!t) return true;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 32;
        nb_tensor **ts = realloc(l->ts, sizeof(nb_tensor *) * (size_t)cap);
        if (!ts) return false;
        l->ts = ts, l->cap = cap;
    }
    l->ts[l->n++] = t;
    return true;
}

/* Every tensor header of m and its children whose storage moves with the module. */
static bool gather(const nb_module *m, tensor_list *l) {
    bool ok = tl_add(l, m->flat_params) && tl_add(l, m->flat_grads);
    for (int i = 0; ok && i < m->params.n; i++) {
        nb_tensor *t = m->params.items[i];
        ok = tl_add(l, t) && tl_add(l, t->grad);
    }
    for (int i = 0; ok && i < m->buffers.n; i++) ok = tl_add(l, m->buffers.items[i]);
    for (int i = 0; ok && i < m->children.n; i++) ok = gather(m->children.items[i], l);
    return ok;
}

/* A copy of t's whole storage on dev (a reference the caller releases), or NULL. */
static nb__storage *storage_to(nb_tensor *t, nb_device dev) {
    nb__storage *s = t->storage, *r = NULL;
    nb_scope_begin();
    /* All bytes of the storage as one u8 row: the copy keeps every offset valid. */
    nb_tensor *bytes = nb__view_of(t, (int64_t[]){(int64_t)s->nbytes}, (int64_t[]){1}, 1, 0);
    if (bytes) {
        bytes->dtype = NB_U8;
        nb_tensor *moved = nb_to_device(bytes, dev);
        if (moved) {
            r = moved->storage;
            atomic_fetch_add(&r->refcount, 1);
        }
    }
    nb_scope_end();
    return r;
}

nb_status nb_module_to(nb_module *m, nb_device dev) {
    if (!m) return nb__error(NB_ENULL, "module_to: module is NULL");
    if (!nb__obj_ok(m, NB__OBJ_MODULE, "module_to")) return nb_last_status();
    if (!nb__backend_of(dev, "module_to")) return nb_last_status();
    tensor_list l = {0};
    if (!gather(m, &l)) {
        free(l.ts);
        return nb__error(NB_ENOMEM, "module_to: out of memory");
    }
    /* Copy first, then repoint: a failure leaves the module as it was. */
    nb__storage **from = malloc(sizeof(nb__storage *) * (size_t)(l.n ? l.n : 1));
    nb__storage **to = malloc(sizeof(nb__storage *) * (size_t)(l.n ? l.n : 1));
    int nmoved = 0;
    nb_status st = from && to ? NB_OK : nb__error(NB_ENOMEM, "module_to: out of memory");
    bool prev = nb_set_grad_enabled(false);
    for (int i = 0; i < l.n && st == NB_OK; i++) {
        nb__storage *s = l.ts[i]->storage;
        if (nb_device_equal(s->device, dev)) continue;
        int k = 0;
        while (k < nmoved && from[k] != s) k++;
        if (k < nmoved) continue;
        if (!(to[nmoved] = storage_to(l.ts[i], dev))) {
            st = nb_wrap_error(nb_last_status(), "module_to");
            break;
        }
        from[nmoved++] = s;
    }
    nb_set_grad_enabled(prev);
    for (int i = 0; i < l.n && st == NB_OK; i++) {
        nb_tensor *t = l.ts[i];
        for (int k = 0; k < nmoved; k++) {
            if (t->storage != from[k]) continue;
            atomic_fetch_add(&to[k]->refcount, 1);
            t->storage = to[k];
            nb__storage_release(from[k]);
            break;
        }
    }
    for (int k = 0; k < nmoved; k++) nb__storage_release(to[k]);
    free(from);
    free(to);
    free(l.ts);
    return st;
}

/* ---- containers ------------------------------------------------------------------------------ */
/* A module whose forward is its own, with nothing around it (hooks, recompute, an
 * override): one that nb_sequential may fuse with its neighbour. */
static bool plain_module(const nb_module *m) {
    return !m->nhooks && !m->recompute && !m->override;
}

/* Whether children i and i + 1 are a plain ReLU followed by a plain MaxPool2d, which
 * sequential_forward runs as one nb_relu_maxpool2d (nabla/nn.h: the same values and
 * gradients, bit for bit), traced as the pool. */
static bool relu_pool_pair(const nb_module *m, int i) {
    if (i + 1 >= m->children.n) return false;
    const nb_module *r = m->children.items[i], *p = m->children.items[i + 1];
    return nb__relu_module(r) && nb__maxpool_module(p) && plain_module(r) && plain_module(p);
}

static nb_tensor *sequential_forward(nb_module *m, nb_tensor *x) {
    nb_scope_begin();
    for (int i = 0; i < m->children.n && x; i++) {
        if (relu_pool_pair(m, i)) {
            int tok = NB__SPAN_BEGIN("MaxPool2d", "relu fused", NB__CAT_MODULE);
            x = nb__maxpool_module_relu_forward(m->children.items[++i], x);
            NB__SPAN_END(tok);
            continue;
        }
        x = nb_forward(m->children.items[i], x);
    }
    nb_tensor *r = nb_keep(x);
    nb_scope_end();
    return r;
}

static const nb_module_vtable sequential_vt = {.type_name = "Sequential",
                                               .forward = sequential_forward};
static const nb_module_vtable module_list_vt = {.type_name = "ModuleList"};

nb_module *nb_sequential_new_n(nb_module *const *mods, int n) {
    nb_module *s = nb_module_new(&sequential_vt, NULL);
    for (int i = 0; i < n; i++) {
        if (!s || !mods[i]) {
            if (s && !mods[i]) nb__error(NB_ENULL, "sequential: module %d is NULL", i);
            for (int j = i; j < n; j++) nb_module_free(mods[j]);
            nb_module_free(s);
            return NULL;
        }
        char name[16];
        snprintf(name, sizeof name, "%d", i);
        if (!nb_module_add_child(s, name, mods[i])) {
            for (int j = i + 1; j < n; j++) nb_module_free(mods[j]);
            nb_module_free(s);
            return NULL;
        }
    }
    return s;
}

nb_module *nb_sequential_new(nb_module *first, ...) {
    enum { MAX = 256 };
    nb_module *mods[MAX];
    int n = 0;
    bool too_many = false;
    va_list ap;
    va_start(ap, first);
    for (nb_module *m = first; m; m = va_arg(ap, nb_module *)) {
        if (n < MAX) mods[n++] = m;
        else too_many = true, nb_module_free(m);
    }
    va_end(ap);
    if (too_many) {
        for (int i = 0; i < n; i++) nb_module_free(mods[i]);
        nb__error(NB_EINVAL, "sequential: more than %d modules; use nb_sequential_new_n", MAX);
        return NULL;
    }
    return nb_sequential_new_n(mods, n);
}

nb_module *nb_module_list_new(nb_module *const *mods, int n) {
    nb_module *l = nb_sequential_new_n(mods, n);
    if (l) l->vt = &module_list_vt;
    return l;
}

nb_status nb_module_list_append(nb_module *list, nb_module *m) {
    if ((list && !nb__obj_ok(list, NB__OBJ_MODULE, "module_list_append")) ||
        (m && !nb__obj_ok(m, NB__OBJ_MODULE, "module_list_append")))
        return nb_last_status();
    if (!list) {
        nb_module_free(m);
        return nb__error(NB_ENULL, "module_list_append: list is NULL");
    }
    char name[16];
    snprintf(name, sizeof name, "%d", list->children.n);
    return nb_module_add_child(list, name, m) ? NB_OK : nb_last_status();
}

/* ---- for the parallel layer (nn/nn_impl.h) ----------------------------------------------- */
nb_status nb__module_override_forward(nb_module *m, nb__forward_fn fn, void *ctx,
                                      void (*ctx_free)(void *)) {
    if (!m) {
        if (ctx_free) ctx_free(ctx);
        return nb__error(NB_ENULL, "module_override_forward: module is NULL");
    }
    if (m->override_free) m->override_free(m->override_ctx);
    m->override = fn;
    m->override_ctx = fn ? ctx : NULL;
    m->override_free = fn ? ctx_free : NULL;
    if (!fn && ctx_free) ctx_free(ctx);
    return NB_OK;
}

void *nb__module_override_ctx(const nb_module *m) { return m && m->override ? m->override_ctx : NULL; }
nb_module *nb__module_parent(const nb_module *m) { return m ? m->parent : NULL; }
const nb_module_vtable *nb__module_vtable(const nb_module *m) { return m ? m->vt : NULL; }

static const nb_module_vtable view_vt_default = {.type_name = "ModuleView"};

nb_module *nb__module_view_new(void) {
    nb_module *v = nb_module_new(&view_vt_default, NULL);
    if (v) v->borrows = true;
    return v;
}

nb_status nb__module_view_add_child(nb_module *v, const char *name, nb_module *child) {
    if (!v || !child || !name) return nb__error(NB_ENULL, "module_view_add_child: NULL argument");
    if (!v->borrows) return nb__error(NB_EINVAL, "module_view_add_child: not a view");
    if (!name_free(v, name, "module_view_add_child")) return nb_last_status();
    if (!list_add(&v->children, name, child))
        return nb__error(NB_ENOMEM, "module_view_add_child: out of memory");
    invalidate(v);
    return NB_OK;
}

nb_status nb__module_view_add_param(nb_module *v, const char *name, nb_tensor *t) {
    if (!v || !t || !name) return nb__error(NB_ENULL, "module_view_add_param: NULL argument");
    if (!v->borrows) return nb__error(NB_EINVAL, "module_view_add_param: not a view");
    if (!name_free(v, name, "module_view_add_param")) return nb_last_status();
    if (!list_add(&v->params, name, nb_tensor_retain(t))) {
        nb_tensor_free(t);
        return nb__error(NB_ENOMEM, "module_view_add_param: out of memory");
    }
    invalidate(v);
    return NB_OK;
}
