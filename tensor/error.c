/* error.c - the status table, the thread-local last error, and the assertion handler.
 * Errors are values (docs/architecture.md rule 2): nb__error records a message for
 * nb_last_error(). */
#include <stdarg.h>
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

static nb_status set_error_v(nb_status s, const char *fmt, va_list ap) {
    vsnprintf(tls_msg, sizeof tls_msg, fmt, ap);
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
