/* error.c - the status table, the thread-local last error, and the assertion handler.
 * Errors are values (docs/architecture.md rule 2): nb__error records a message for
 * nb_last_error().
 *
 * Wrapping (docs/errors.md, "Wrapping an error"): a caller that adds context to the error of
 * a call it made writes "<context>: <the inner message>" through nb_wrap_error (or
 * nb__wrap_msg into a buffer of its own), which keeps that one sentence clean: the inner
 * message's words are never repeated (an inner message that already starts with the context,
 * or whose first parts the context already ends with or starts with, is joined without the
 * repetition), an empty inner message becomes its status's description, and a message too
 * long for the buffer is cut at a word boundary with "...". Every message goes through a
 * temporary buffer first, so formatting nb_last_error() into a new error (which aliases the
 * thread's message buffer) reads the old message intact; a message formatted that way
 * ("<context>: %s" with nb_last_error() last) gets the same joining rules. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "tensor/tensor_impl.h"

#define NB__ERRMSG_MAX 512

static _Thread_local char tls_msg[NB__ERRMSG_MAX];
static _Thread_local nb_status tls_status = NB_OK;

const char *nb_status_str(nb_status s) {
    switch (s) {
#define NB__STATUS_STR(name, value, text) \
    case NB_##name: return text;
        NB_STATUS_MAP(NB__STATUS_STR)
#undef NB__STATUS_STR
    }
    return "unknown status";
}

const char *nb_status_name(nb_status s) {
    switch (s) {
#define NB__STATUS_NAME(name, value, text) \
    case NB_##name: return "NB_" #name;
        NB_STATUS_MAP(NB__STATUS_NAME)
#undef NB__STATUS_NAME
    }
    return "NB_?";
}

const char *nb_last_error(void) { return tls_msg; }
nb_status nb_last_status(void) { return tls_status; }

void nb_clear_error(void) {
    tls_msg[0] = '\0';
    tls_status = NB_OK;
}

/* n bytes of src into out (size cap), cut at a word boundary with "..." when they do not fit
 * (a word longer than a third of the buffer is cut inside). */
static void put_cut(char *out, size_t cap, const char *src, size_t n) {
    if (cap == 0) return;
    if (n < cap) {
        memcpy(out, src, n);
        out[n] = '\0';
        return;
    }
    size_t keep = cap > 4 ? cap - 4 : 0; /* room for "..." and the terminator */
    size_t cut = keep;
    while (cut > 0 && src[cut] != ' ' && src[cut - 1] != ' ') cut--;
    if (cut < keep - keep / 3) cut = keep; /* no boundary nearby: cut the long word */
    while (cut > 0 && (src[cut - 1] == ' ' || src[cut - 1] == ':' || src[cut - 1] == ','))
        cut--;
    memcpy(out, src, cut);
    memcpy(out + cut, "...", cap > 4 ? 4 : 0);
    if (cap <= 4) out[0] = '\0';
}

/* The length of the first part of m ("op: ", up to its first ": "), 0 when m has none. */
static size_t first_part(const char *m) {
    const char *c = strstr(m, ": ");
    return c ? (size_t)(c - m) : 0;
}

static bool ends_with(const char *s, size_t ns, const char *t, size_t nt) {
    return nt <= ns && memcmp(s + ns - nt, t, nt) == 0 &&
           (nt == ns || s[ns - nt - 1] == ' ');
}

/* How much of `inner` the context already says: the longest run of inner's leading parts
 * (ending where inner has ": " or ends) that the context ends with; 0 if none. */
static size_t overlap(const char *ctx, size_t nc, const char *inner) {
    size_t best = 0;
    for (const char *p = inner; (p = strstr(p, ": ")) != NULL; p += 2)
        if (ends_with(ctx, nc, inner, (size_t)(p - inner))) best = (size_t)(p - inner);
    size_t all = strlen(inner);
    if (ends_with(ctx, nc, inner, all)) best = all;
    return best;
}

void nb__wrap_msg(char *out, size_t cap, const char *ctx, const char *inner, nb_status s) {
    char buf[4 * NB__ERRMSG_MAX];
    size_t nc = strlen(ctx);
    while (nc > 0 && (ctx[nc - 1] == ' ' || ctx[nc - 1] == ':')) nc--; /* "ctx: " -> "ctx" */
    if (!inner || !*inner) inner = nb_status_str(s); /* never an empty part */
    size_t ni = strlen(inner);
    int len;
    if (nc == 0 || (ni >= nc && memcmp(inner, ctx, nc) == 0 &&
                    (inner[nc] == '\0' || inner[nc] == ':'))) {
        len = snprintf(buf, sizeof buf, "%s", inner); /* inner already says the context */
    } else {
        /* The inner message's first part repeats the context's ("zero: ..." in "zero: ...")
         * or the context ends with the inner message's first parts ("... shard x is corrupt"
         * and "x is corrupt: ..."): joined once. */
        size_t fc = first_part(ctx), fi = first_part(inner);
        const char *rest = inner, *after_op = fi ? inner + fi + 2 : inner;
        if (fc && fc == fi && memcmp(ctx, inner, fc) == 0) rest = after_op;
        size_t ov = overlap(ctx, nc, rest);
        if (ov == 0 && rest != after_op && (ov = overlap(ctx, nc, after_op)) > 0)
            rest = after_op; /* the context's clause stands for the inner op's */
        if (ov && rest[ov] == '\0') len = snprintf(buf, sizeof buf, "%.*s", (int)nc, ctx);
        else if (ov) len = snprintf(buf, sizeof buf, "%.*s%s", (int)nc, ctx, rest + ov);
        else len = snprintf(buf, sizeof buf, "%.*s: %s", (int)nc, ctx, rest);
    }
    put_cut(out, cap, buf, len < 0 ? 0 : (size_t)len < sizeof buf ? (size_t)len : sizeof buf - 1);
}

/* The message goes through a temporary: an argument may be nb_last_error() itself. */
static nb_status set_error_v(nb_status s, const char *fmt, va_list ap) {
    char buf[4 * NB__ERRMSG_MAX];
    int len = vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = len < 0 ? 0 : (size_t)len < sizeof buf ? (size_t)len : sizeof buf - 1;
    /* "<context>: <the previous message>": wrapping by hand, joined by the rules above */
    size_t np = strlen(tls_msg);
    if (np > 0 && n > np + 2 && memcmp(buf + n - np, tls_msg, np) == 0 &&
        memcmp(buf + n - np - 2, ": ", 2) == 0) {
        char prev[NB__ERRMSG_MAX];
        memcpy(prev, tls_msg, np + 1);
        buf[n - np - 2] = '\0';
        nb__wrap_msg(tls_msg, sizeof tls_msg, buf, prev, s);
    } else if (n >= 2 && buf[n - 2] == ':' && buf[n - 1] == ' ') { /* an empty last part */
        nb__wrap_msg(tls_msg, sizeof tls_msg, buf, "", s);
    } else {
        put_cut(tls_msg, sizeof tls_msg, buf, n);
    }
    tls_status = s;
    return s;
}

nb_status nb_wrap_error(nb_status s, const char *fmt, ...) {
    char ctx[4 * NB__ERRMSG_MAX], prev[NB__ERRMSG_MAX];
    snprintf(prev, sizeof prev, "%s", tls_msg);
    if (s == NB_OK) s = tls_status != NB_OK ? tls_status : NB_EINTERNAL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    nb__wrap_msg(tls_msg, sizeof tls_msg, ctx, prev, s);
    tls_status = s;
    return s;
}

nb_status nb__error(nb_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_error_v(s, fmt, ap);
    va_end(ap);
    return s;
}

nb_status nb_set_error(nb_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_error_v(s, fmt, ap);
    va_end(ap);
    return s;
}

_Noreturn void nb__assert_fail(const char *file, int line, const char *cond) {
    fprintf(stderr, "nabla: internal invariant broken at %s:%d: %s\n", file, line, cond);
    fflush(stderr);
    abort();
}

const char *nb__shape_str(const int64_t *shape, int ndim, char *buf) {
    size_t n = 0;
    buf[n++] = '[';
    for (int i = 0; i < ndim && n < NB__SHAPE_STR - 24; i++)
        n += (size_t)snprintf(buf + n, NB__SHAPE_STR - n, i ? ",%lld" : "%lld",
                              (long long)shape[i]);
    buf[n++] = ']';
    buf[n] = '\0';
    return buf;
}

bool nb__dead_handle(const nb_tensor *t, const char *op, const char *argname) {
    const char *arg = argname ? argname : "t";
    if (t->magic == NB__TENSOR_SCOPE_ENDED)
        nb__error(NB_EFREED, "%s: argument '%s': tensor used after the scope that owned it "
                  "ended; nb_keep it to return it from a scope", op, arg);
    else if (t->magic == NB__TENSOR_FREED)
        nb__error(NB_EFREED, "%s: argument '%s': tensor used after nb_tensor_free released "
                  "it (a freed handle)", op, arg);
    else
        nb__error(NB_EFREED, "%s: argument '%s' is not a live tensor (released long ago, "
                  "or not a tensor)", op, arg);
    return false;
}

bool nb__arg_ok(const nb_tensor *t, const char *op, const char *argname) {
    if (t) return nb__live(t) || nb__dead_handle(t, op, argname);
    /* Keep the first error: a NULL produced by a failed inner op already set one. */
    if (tls_status == NB_OK) nb__error(NB_ENULL, "%s: argument '%s' is NULL", op, argname);
    return false;
}

int nb__wrap_dim(int dim, int ndim, const char *op) {
    int n = ndim > 0 ? ndim : 1;
    if (dim < -n || dim >= n) {
        nb__error(NB_EDIM, "%s: dim %d is out of range for a tensor with %d dims", op, dim,
                  ndim);
        return -1;
    }
    return dim < 0 ? dim + n : dim;
}
