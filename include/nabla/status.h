/* nabla/status.h - status codes and the thread-local last error.
 *
 * Usage:
 *     nb_tensor *y = nb_matmul(a, b);          // NULL on a user mistake
 *     if (!y) fprintf(stderr, "%s\n", nb_last_error());
 *     // "matmul: inner dimensions differ: [32,784] @ [512,10]"
 *
 * Errors are values: no nabla call aborts the process on a user mistake. Functions that
 * return a tensor return NULL; functions that return nb_status return a negative code.
 * The message is kept per thread until the next error on that thread (or nb_clear_error).
 * Ops given a NULL input return NULL and keep the first error, so nested calls such as
 * nb_sum(nb_mul(a, nb_exp(b)), ...) report the innermost failure.
 *
 * Ownership: the strings returned here are owned by the library (static or thread-local);
 * never free them. */
#ifndef NABLA_STATUS_H
#define NABLA_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* One table: name, value, description. Append only (values are ABI). */
#define NB_STATUS_MAP(X)                                                        \
    X(OK, 0, "ok")                                                              \
    X(EINVAL, -1, "invalid argument")                                           \
    X(ESHAPE, -2, "shape mismatch")                                             \
    X(EDTYPE, -3, "unsupported or mismatched dtype")                            \
    X(EDIM, -4, "dimension out of range")                                       \
    X(EINDEX, -5, "index out of range")                                         \
    X(ENULL, -6, "NULL argument")                                               \
    X(ENOMEM, -7, "out of memory")                                              \
    X(EDEVICE, -8, "device mismatch or device unavailable")                     \
    X(EIO, -9, "input/output error")                                            \
    X(EFORMAT, -10, "malformed file or data")                                   \
    X(EUNSUPPORTED, -11, "not supported")                                       \
    X(ESTATE, -12, "object is in the wrong state for this call")                \
    X(ECOMM, -13, "communication failure")                                      \
    X(ETIMEOUT, -14, "timed out")                                               \
    X(EINTERNAL, -15, "internal error")                                         \
    X(EFREED, -16, "handle used after it was released")

typedef enum nb_status {
#define NB__STATUS_ENUM(name, value, text) NB_##name = value,
    NB_STATUS_MAP(NB__STATUS_ENUM)
#undef NB__STATUS_ENUM
} nb_status;

/* Short description of a status code ("shape mismatch"); "unknown status" otherwise. */
const char *nb_status_str(nb_status s);
/* Symbolic name of a status code ("NB_ESHAPE"). */
const char *nb_status_name(nb_status s);

/* The last error message on this thread, "" if none since the last nb_clear_error. */
const char *nb_last_error(void);
/* The status of the last error on this thread, NB_OK if none. */
nb_status nb_last_status(void);
/* Forget the last error on this thread. */
void nb_clear_error(void);
/* Record an error of your own (custom modules, datasets, transforms) so that callers see
 * it through nb_last_error() like nabla's: printf-style message; returns s. */
nb_status nb_set_error(nb_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Add context to the last error on this thread, after a call of yours failed: the message
 * becomes "<context>: <the previous message>" (printf-style context, without a trailing
 * ": "), written as one sentence: parts the context already says are not repeated, an empty
 * previous message becomes s's description, and a message too long is cut at a word
 * boundary with "...". s NB_OK keeps the previous status. Returns the status.
 *     if (nb_module_load(m, path, true) != NB_OK)
 *         return nb_wrap_error(NB_OK, "resume from %s", path);
 *     // "resume from run.ckpt: module_load: run.ckpt has no tensor \"fc.bias\"" */
nb_status nb_wrap_error(nb_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
#endif
