/* autocast.c - the autocast scopes, the per-op policy and the cast cache (nabla/autocast.h,
 * tensor/autocast.h). Everything is per thread: the scope stack, the cache, and the casts
 * made outside any nb_scope (held here until the outermost nb_autocast_end, so an op called
 * without a scope does not leak the cast it made of its input). */
#include <stdlib.h>
#include <string.h>

#include "nabla/autograd.h"
#include "tensor/autocast.h"
#include "tensor/tape.h"
#include "tensor/tensor_impl.h"

#define MAX_DEPTH 16
#define CACHE_CAP 1024 /* beyond this many parameters, casts are simply not cached */

_Thread_local nb_dtype nb__ac_dtype = NB_F32;
static _Thread_local nb_dtype t_stack[MAX_DEPTH];
static _Thread_local int t_depth;
static _Thread_local int t_suspended;

typedef struct cache_entry {
    nb_tensor *src, *cast; /* both referenced by the cache */
    uint64_t version;      /* src's version when cast */
    nb_dtype dt;
    bool grad; /* made with grad mode on (the cast is on the tape) */
} cache_entry;
static _Thread_local cache_entry *t_cache;
static _Thread_local int t_ncache, t_capcache;
/* Casts made outside every nb_scope: released at the outermost end. */
static _Thread_local nb_tensor **t_held;
static _Thread_local int t_nheld, t_capheld;

/* ---- the policy ------------------------------------------------------------------------------ */
static const struct {
    const char *op;
    nb_autocast_policy p;
} k_policy[] = {
    {"matmul", NB_AUTOCAST_LOW},        {"linear", NB_AUTOCAST_LOW},
    {"causal_attention", NB_AUTOCAST_LOW}, {"causal_attention_qkv", NB_AUTOCAST_LOW},
    {"conv2d", NB_AUTOCAST_LOW},
    {"softmax", NB_AUTOCAST_F32},       {"log_softmax", NB_AUTOCAST_F32},
    {"layer_norm", NB_AUTOCAST_F32},    {"batch_norm", NB_AUTOCAST_F32},
    {"rms_norm", NB_AUTOCAST_F32},
    {"cross_entropy", NB_AUTOCAST_F32}, {"nll_loss", NB_AUTOCAST_F32},
    {"mse_loss", NB_AUTOCAST_F32},      {"l1_loss", NB_AUTOCAST_F32},
    {"bce_with_logits", NB_AUTOCAST_F32},
    {"sum", NB_AUTOCAST_F32},           {"mean", NB_AUTOCAST_F32},
    {"var", NB_AUTOCAST_F32},           {"std", NB_AUTOCAST_F32},
    {"logsumexp", NB_AUTOCAST_F32},
};

nb_autocast_policy nb_autocast_policy_of(const char *op) {
    if (!op) return NB_AUTOCAST_PROMOTE;
    for (size_t i = 0; i < sizeof k_policy / sizeof k_policy[0]; i++)
        if (!strcmp(k_policy[i].op, op)) return k_policy[i].p;
    return NB_AUTOCAST_PROMOTE;
}

/* ---- scopes ---------------------------------------------------------------------------------- */
static void refresh(void) {
    nb__ac_dtype = t_depth == 0 || t_suspended ? NB_F32 : t_stack[t_depth - 1];
}

nb_status nb_autocast_begin(nb_dtype dt) {
    if (dt != NB_BF16 && dt != NB_F16 && dt != NB_F32)
        return nb__error(NB_EDTYPE, "autocast_begin: dtype %s cannot be an autocast dtype "
                                    "(bf16, f16, or f32 to turn autocast off)",
                         (unsigned)dt < NB_DTYPE_COUNT ? nb_dtype_name(dt) : "(invalid)");
    if (t_depth == MAX_DEPTH)
        return nb__error(NB_ESTATE, "autocast_begin: %d autocast scopes are already open "
                                    "(unbalanced begin/end?)",
                         MAX_DEPTH);
    t_stack[t_depth++] = dt;
    refresh();
    return NB_OK;
}

nb_status nb_autocast_end(void) {
    if (t_depth == 0)
        return nb__error(NB_ESTATE, "autocast_end: no autocast scope is open (unbalanced "
                                    "begin/end)");
    t_depth--;
    refresh();
    if (t_depth == 0) {
        nb_autocast_clear_cache();
        for (int i = 0; i < t_nheld; i++) nb_tensor_free(t_held[i]);
        t_nheld = 0;
    }
    return NB_OK;
}

nb_dtype nb_autocast_dtype(void) { return nb__ac_dtype; }

nb_dtype nb__autocast_suspend(void) {
    nb_dtype prev = nb__ac_dtype;
    t_suspended++;
    refresh();
    return prev;
}

void nb__autocast_resume(nb_dtype prev) {
    (void)prev;
    if (t_suspended > 0) t_suspended--;
    refresh();
}

int nb__autocast_replay_begin(nb_dtype dt) {
    int token = t_suspended;
    t_suspended = 0;
    if (nb_autocast_begin(dt) != NB_OK) {
        t_suspended = token;
        refresh();
        return -1;
    }
    return token;
}

void nb__autocast_replay_end(int token) {
    if (token < 0) return;
    nb_autocast_end();
    t_suspended = token;
    refresh();
}

/* ---- the cache ------------------------------------------------------------------------------- */
int nb_autocast_cache_size(void) { return t_ncache; }

void nb_autocast_clear_cache(void) {
    for (int i = 0; i < t_ncache; i++) {
        nb_tensor_free(t_cache[i].cast);
        nb_tensor_free(t_cache[i].src);
    }
    t_ncache = 0;
}

static bool grow(void **p, int *cap, size_t elem) {
    int c = *cap ? *cap * 2 : 64;
    void *q = realloc(*p, elem * (size_t)c);
    if (!q) return false;
    *p = q, *cap = c;
    return true;
}

/* r (a reference the current scope owns, or the caller when there is none) handed to the
 * op: outside every scope the autocast layer keeps the reference until its outermost end. */
static nb_tensor *owned_by_scope(nb_tensor *r) {
    if (!r || nb_scope_depth() > 0) return r;
    if (t_nheld == t_capheld && !grow((void **)&t_held, &t_capheld, sizeof(nb_tensor *))) {
        nb_tensor_free(r);
        nb__error(NB_ENOMEM, "autocast: no memory to hold a cast");
        return NULL;
    }
    t_held[t_nheld++] = r;
    return r;
}

nb_tensor *nb__autocast_slow(nb_tensor *t, nb_autocast_policy p) {
    nb_dtype want;
    if (p == NB_AUTOCAST_LOW) {
        if (!nb_dtype_is_float(t->dtype) || t->dtype == NB_F64 || t->dtype == nb__ac_dtype)
            return t;
        want = nb__ac_dtype;
    } else if (p == NB_AUTOCAST_F32) {
        if (t->dtype != NB_F16 && t->dtype != NB_BF16) return t;
        want = NB_F32;
    } else {
        return t;
    }
    /* Parameters (leaves that require grad) are cast once per outermost scope. */
    bool cacheable = p == NB_AUTOCAST_LOW && t->requires_grad && !t->grad_fn;
    bool grad = nb_grad_enabled();
    uint64_t ver = nb__version_of(t);
    if (cacheable) {
        for (int i = 0; i < t_ncache; i++) {
            cache_entry *e = &t_cache[i];
            if (e->src == t && e->dt == want && e->grad == grad) {
                /* A backward since (one micro-batch of several) released the cast's node:
                 * a fresh cast, as after an in-place write. */
                const bool released = e->cast->grad_fn && e->cast->grad_fn->released;
                if (e->version == ver && !released)
                    return owned_by_scope(nb__scope_add(nb_tensor_retain(e->cast)));
                /* written in place or released since: a fresh cast replaces it */
                nb_tensor_free(e->cast);
                nb_tensor_free(e->src);
                *e = t_cache[--t_ncache];
                break;
            }
        }
    }
    nb_tensor *r = owned_by_scope(nb_to_dtype(t, want));
    if (!r || !cacheable) return r;
    if (t_ncache == CACHE_CAP ||
        (t_ncache == t_capcache && !grow((void **)&t_cache, &t_capcache, sizeof(cache_entry))))
        return r; /* not cached: still a correct cast */
    t_cache[t_ncache++] = (cache_entry){nb_tensor_retain(t), nb_tensor_retain(r), ver, want,
                                        grad};
    return r;
}
