/* fuzz_shape.c - shape arithmetic with fuzzed sizes: nb_empty (meta, and CPU when small),
 * then nb_view, nb_reshape, nb_expand, nb_narrow, nb_slice, nb_flatten and a transpose
 * followed by a reshape (a copy). Every creation either fails with an error or gives a
 * tensor whose numel is the product of its sizes and whose bytes fit in 64 bits; every
 * view keeps the numel of its base (expand/narrow/slice: the numel of the shape asked).
 *
 * Input: ndim byte, dtype byte, sizes; a second ndim byte and sizes for the view ops; then
 * int64 arguments for narrow/slice. A size byte below 0x80 is that size (0..127); otherwise
 * the next 8 bytes are a raw int64 (negative and huge sizes). */
#include <string.h>

#include "fuzz.h"
#include "nabla/tensor.h"

typedef struct {
    const uint8_t *p;
    size_t n;
} input;

static uint8_t take_u8(input *in) {
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}

static int64_t take_i64(input *in) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | take_u8(in);
    return (int64_t)v;
}

static int64_t take_size(input *in) {
    uint8_t b = take_u8(in);
    return b < 0x80 ? b : take_i64(in);
}

/* ndim in -1..NB_MAX_DIMS+1 (invalid ones included), then the sizes */
static int take_shape(input *in, int64_t *shape) {
    int ndim = take_u8(in) % (NB_MAX_DIMS + 3) - 1;
    for (int i = 0; i < ndim && i < NB_MAX_DIMS + 1; i++) shape[i] = take_size(in);
    return ndim;
}

/* numel, or -1 if a size is negative or the product (zeros counted as 1) times the element
 * size overflows int64 */
static int64_t checked_numel(const int64_t *shape, int ndim, size_t elsize) {
    int64_t n = 1, bytes = (int64_t)elsize;
    bool zero = false;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        if (shape[i] == 0) zero = true;
        else if (__builtin_mul_overflow(n, shape[i], &n)) return -1;
    }
    if (__builtin_mul_overflow(n, bytes, &bytes)) return -1;
    return zero ? 0 : n;
}

static void check_numel(const nb_tensor *t) {
    if (!t) return;
    int nd = nb_ndim(t);
    FUZZ_CHECK(nd >= 0 && nd <= NB_MAX_DIMS);
    int64_t n = checked_numel(nb_shape(t), nd, nb_dtype_size(nb_tensor_dtype(t)));
    FUZZ_CHECK(n >= 0 && n == nb_numel(t));
}

static void view_ops(nb_tensor *t, const int64_t *shape2, int nd2, input *in) {
    nb_tensor *v = nb_view(t, shape2, nd2);
    check_numel(v);
    if (v) FUZZ_CHECK(nb_numel(v) == nb_numel(t));
    nb_tensor *r = nb_reshape(t, shape2, nd2);
    check_numel(r);
    if (r) FUZZ_CHECK(nb_numel(r) == nb_numel(t));
    nb_tensor *e = nb_expand(t, shape2, nd2);
    check_numel(e);
    int dim = (int8_t)take_u8(in) % (NB_MAX_DIMS + 2);
    int64_t a = take_size(in), b = take_size(in), step = take_size(in);
    nb_tensor *na = nb_narrow(t, dim, a, b);
    check_numel(na);
    if (na) { /* a negative start counts from the end */
        int64_t n = nb_size(t, dim), start = a < 0 ? a + n : a, end;
        FUZZ_CHECK(nb_size(na, dim) == b && b >= 0 && start >= 0 &&
                   !__builtin_add_overflow(start, b, &end) && end <= n);
    }
    nb_tensor *sl = nb_slice(t, dim, a, b, step);
    check_numel(sl);
    if (sl) FUZZ_CHECK(nb_size(sl, dim) <= nb_size(t, dim));
    nb_tensor *fl = nb_flatten(t, dim, -1);
    check_numel(fl);
    if (fl) FUZZ_CHECK(nb_numel(fl) == nb_numel(t));
    nb_tensor *tr = nb_ndim(t) >= 2 ? nb_transpose(t, 0, nb_ndim(t) - 1) : NULL;
    nb_tensor *tr_r = tr ? nb_reshape(tr, shape2, nd2) : NULL; /* a copy unless trivial */
    check_numel(tr_r);
    if (tr_r) FUZZ_CHECK(nb_numel(tr_r) == nb_numel(t));
    nb_tensor *made[] = {v, r, e, na, sl, fl, tr, tr_r};
    for (size_t i = 0; i < sizeof made / sizeof *made; i++) nb_tensor_free(made[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    input in = {data, size};
    int64_t shape[NB_MAX_DIMS + 1] = {0}, shape2[NB_MAX_DIMS + 1] = {0};
    int ndim = take_shape(&in, shape);
    nb_dtype dt = (nb_dtype)(take_u8(&in) % (NB_DTYPE_COUNT + 1));
    int nd2 = take_shape(&in, shape2);
    input rest = in;

    nb_tensor *m = nb_empty_on(NB_META, shape, ndim, dt);
    bool valid = ndim >= 0 && ndim <= NB_MAX_DIMS && dt < NB_DTYPE_COUNT &&
                 checked_numel(shape, ndim, 16) >= 0; /* the widest element nabla has */
    if (m) {
        check_numel(m);
        view_ops(m, shape2, nd2, &in);
        nb_tensor_free(m);
    } else {
        /* refusing a shape whose bytes fit is a bug too (16: any element size) */
        FUZZ_CHECK(!valid);
    }
    /* real storage when small */
    int64_t n = checked_numel(shape, ndim, 16);
    if (valid && n >= 0 && n <= 4096) {
        nb_tensor *t = nb_zeros(shape, ndim, dt);
        FUZZ_CHECK(t != NULL);
        check_numel(t);
        view_ops(t, shape2, nd2, &rest);
        nb_tensor_free(t);
    }
    nb_clear_error();
    return 0;
}
