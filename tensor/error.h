/* tensor/error.h - private: the library's error setter and its one assertion macro, for
 * every layer down to the kernels (docs/architecture.md rule 2). C only (not nvcc). */
#ifndef NABLA_TENSOR_ERROR_H
#define NABLA_TENSOR_ERROR_H

#include <stddef.h>

#include "nabla/status.h"

/* Only for broken internal invariants, never for user mistakes. Prints file, line and
 * condition, then aborts. */
#define NB__ASSERT(cond)                                                                   \
    do {                                                                                   \
        if (!(cond)) nb__assert_fail(__FILE__, __LINE__, #cond);                           \
    } while (0)
_Noreturn void nb__assert_fail(const char *file, int line, const char *cond);

/* Sets the thread's last error (printf-style message) and returns the status, so
 * `return nb__error(NB_ESHAPE, "add: ...");` works in nb_status functions and
 * `nb__error(...); return NULL;` in tensor functions. */
nb_status nb__error(nb_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "<ctx>: <inner>" into out[cap] by the wrapping rules of nb_wrap_error (error.c,
 * docs/errors.md): no repeated parts, an empty inner becomes s's description, cut at a word
 * boundary. For messages kept outside the thread's error (a work's, a thread's). */
void nb__wrap_msg(char *out, size_t cap, const char *ctx, const char *inner, nb_status s);

#endif
