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

#include <stdint.h>

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

/* ---- options structs (docs/conventions.md, "Options") ------------------------------------
 * Private to the library: every public options struct's first member, `uint32_t _init`, is
 * set by its nb_X_defaults() (and nothing else) to NB__OPTS_MARK(its type), a magic number in
 * the high 16 bits and the struct's size in the low 16. A copy of a defaulted struct keeps the
 * mark; a compound literal, a zero-filled struct or one compiled against headers of another
 * layout does not have it, and the functions that read the struct refuse it (NB_EINVAL, the
 * message showing `nb_X_opts o = nb_X_defaults(); o.field = ...;`). NULL options, where a
 * function allows them, still mean the defaults. */
#define NB__OPTS_MAGIC 0x6E620000u /* "nb" */
#define NB__OPTS_MARK(T) (NB__OPTS_MAGIC | (uint32_t)(sizeof(T) & 0xFFFFu))

/* NB_OK when init is mark; else NB_EINVAL with a message showing the idiom, e.g.
 * "adam_new: the options did not start from nb_adam_defaults() (a compound literal or a zeroed
 * struct leaves every other field 0): write `nb_adam_opts o = nb_adam_defaults(); o.lr = 1e-3;`
 * and pass &o". who is the caller's message prefix; type the struct's name; defaults the call
 * that makes them (with its arguments); example an assignment of one of its fields. */
static inline nb_status nb__opts_check(uint32_t init, uint32_t mark, const char *who,
                                       const char *type, const char *defaults,
                                       const char *example) {
    if (init == mark) return NB_OK;
    if ((init & 0xFFFF0000u) == NB__OPTS_MAGIC)
        return nb_set_error(NB_EINVAL,
                            "%s: the %s was made with nabla headers of another version (%u "
                            "bytes; this library's is %u): rebuild the program against the "
                            "installed headers",
                            who, type, (unsigned)(init & 0xFFFFu), (unsigned)(mark & 0xFFFFu));
    return nb_set_error(NB_EINVAL,
                        "%s: the options did not start from %s (a compound literal or a zeroed "
                        "struct leaves every other field 0): write `%s o = %s; %s;` and pass &o",
                        who, defaults, type, defaults, example);
}

/* NB__OPTS_CHECK(o, nb_adam_opts, "adam_new", "nb_adam_defaults()", "o.lr = 1e-3"): o is a
 * non-NULL pointer to the options. */
#define NB__OPTS_CHECK(o, T, who, defaults, example)                                               \
    nb__opts_check((o)->_init, NB__OPTS_MARK(T), who, #T, defaults, example)

#ifdef __cplusplus
}
#endif
#endif
