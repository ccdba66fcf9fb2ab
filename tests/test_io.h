/* test_io.h - what the io suite's files (tests/test_io.c, tests/test_io_state.c) share: a
 * tensor's raw bytes, two tensors compared byte for byte, random values that suit a dtype. */
#ifndef NABLA_TEST_IO_H
#define NABLA_TEST_IO_H

#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* The raw bytes of t in row-major order (same dtype); caller frees. */
static inline unsigned char *raw_bytes(const nb_tensor *t, size_t *n) {
    *n = (size_t)nb_numel(t) * nb_dtype_size(nb_tensor_dtype(t));
    unsigned char *b = malloc(*n + 1);
    ck_assert(nb_read(t, b, nb_numel(t), nb_tensor_dtype(t)) == NB_OK);
    return b;
}

/* a and b: same dtype, same shape, the same bytes. */
static inline void assert_identical(const nb_tensor *a, const nb_tensor *b, const char *what) {
    ck_assert_msg(a && b, "%s: missing tensor (%s)", what, nb_last_error());
    ck_assert_msg(nb_tensor_dtype(a) == nb_tensor_dtype(b), "%s: dtype %s vs %s", what,
                  nb_dtype_name(nb_tensor_dtype(a)), nb_dtype_name(nb_tensor_dtype(b)));
    ck_assert_int_eq(nb_ndim(a), nb_ndim(b));
    for (int d = 0; d < nb_ndim(a); d++) ck_assert_int_eq(nb_shape(a)[d], nb_shape(b)[d]);
    size_t na, nb;
    unsigned char *ba = raw_bytes(a, &na), *bb = raw_bytes(b, &nb);
    ck_assert(na == nb);
    ck_assert_msg(memcmp(ba, bb, na) == 0, "%s: values differ", what);
    free(ba);
    free(bb);
}

/* Random values that suit dt (booleans both ways, u8 over its range). */
static inline nb_tensor *rand_of(const int64_t *shape, int ndim, nb_dtype dt, uint64_t seed) {
    double lo = -100, hi = 100;
    if (dt == NB_U8) lo = 0, hi = 255;
    if (dt == NB_BOOL) lo = 0, hi = 2;
    return tu_random(shape, ndim, dt, lo, hi, seed);
}

#endif
