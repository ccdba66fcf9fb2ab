/* test_errors.c - errors are values: the status table, thread-local messages, NULL
 * propagation through nested calls, and every class of user error without abort or leak. */
#include <pthread.h>
#include <string.h>

#include "testutil.h"

START_TEST(test_status_table) {
    ck_assert_str_eq(nb_status_str(NB_OK), "ok");
    ck_assert_str_eq(nb_status_str(NB_ESHAPE), "shape mismatch");
    ck_assert_str_eq(nb_status_name(NB_EDTYPE), "NB_EDTYPE");
    ck_assert_str_eq(nb_status_str((nb_status)-999), "unknown status");
    ck_assert_int_lt(NB_EINTERNAL, 0);
    nb_clear_error();
    ck_assert_int_eq(nb_last_status(), NB_OK);
    ck_assert_str_eq(nb_last_error(), "");
}
END_TEST

START_TEST(test_null_propagation) {
    nb_scope_begin();
    nb_clear_error();
    nb_tensor *a = nb_ones((int64_t[]){32, 784}, 2, NB_F32);
    nb_tensor *b = nb_ones((int64_t[]){512, 10}, 2, NB_F32);
    /* The innermost failure is reported, not a NULL complaint from the outer calls. */
    nb_tensor *r = nb_sum(nb_relu(nb_add(nb_matmul(a, b), a)), NULL, 0, false);
    ck_assert(r == NULL);
    ck_assert_int_eq(nb_last_status(), NB_ESHAPE);
    ck_assert_str_eq(nb_last_error(), "matmul: inner dimensions differ: [32,784] @ [512,10]");
    nb_clear_error();
    /* A NULL passed directly says which argument. */
    tu_assert_error(nb_add(a, NULL), NB_ENULL, "add");
    tu_assert_error(nb_view(NULL, (int64_t[]){1}, 1), NB_ENULL, "view");
    ck_assert(nb_copy_(NULL, a) == NB_ENULL);
    nb_clear_error();
    ck_assert_int_eq(nb_ndim(NULL), -1);
    nb_scope_end();
}
END_TEST

START_TEST(test_error_classes) {
    nb_alloc_stats before, after;
    nb_scope_begin();
    nb_tensor *x = nb_ones((int64_t[]){2, 3}, 2, NB_F32);
    nb_tensor *i = nb_arange(0, 3, 1, NB_I64);
    nb_alloc_get_stats(&before);
    /* shape mismatch */
    tu_assert_error(nb_add(x, nb_ones((int64_t[]){4}, 1, NB_F32)), NB_ESHAPE, "[2,3] and [4]");
    /* dtype */
    tu_assert_error(nb_matmul(x, nb_ones((int64_t[]){3, 2}, 2, NB_I32)), NB_EDTYPE, "matmul");
    tu_assert_error(nb_zeros((int64_t[]){2}, 1, (nb_dtype)42), NB_EDTYPE, "dtype");
    /* bad dim */
    tu_assert_error(nb_sum(x, (int[]){2}, 1, false), NB_EDIM, "dim 2");
    tu_assert_error(nb_softmax(x, -3), NB_EDIM, "softmax");
    /* index out of range */
    tu_assert_error(nb_index_select(x, 1, nb_full((int64_t[]){1}, 1, NB_I64, 3)), NB_EINDEX,
                    "out of range");
    tu_assert_error(nb_select(x, 0, -3), NB_EINDEX, "out of range");
    /* invalid arguments */
    tu_assert_error(nb_zeros((int64_t[]){-1}, 1, NB_F32), NB_EINVAL, "negative size");
    tu_assert_error(nb_zeros((int64_t[]){1}, 9, NB_F32), NB_EINVAL, "dims");
    tu_assert_error(nb_embedding(x, nb_to_dtype(i, NB_F32)), NB_EDTYPE, "embedding");
    nb_scope_end();
    nb_alloc_get_stats(&after);
    ck_assert_int_le(after.bytes_live, before.bytes_live); /* failed ops leaked nothing */
}
END_TEST

/* Write a safetensors file with one F32 tensor "x" of the given JSON shape and no data. */
static void write_st_shape(const char *path, const char *shape) {
    char json[256];
    int n = snprintf(json, sizeof json,
                     "{\"x\":{\"dtype\":\"F32\",\"shape\":%s,\"data_offsets\":[0,0]}}", shape);
    unsigned char buf[8 + sizeof json];
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, json, (size_t)n);
    tu_write_file(path, buf, 8 + (size_t)n);
}

/* Shapes whose sizes (0-sized dims counted as 1) multiply past int64 have strides or byte
 * sizes that cannot be represented, even when a 0 dim makes them empty: every way to build
 * one fails with a clear error instead of a tensor with wrapped strides (issue 18, item 4). */
START_TEST(test_shape_overflow) {
    nb_scope_begin();
    const int64_t big = INT64_C(1) << 40;
    tu_assert_error(nb_empty((int64_t[]){0, big, big}, 3, NB_F32), NB_EINVAL, "too large");
    tu_assert_error(nb_zeros((int64_t[]){big, big, 0}, 3, NB_F32), NB_EINVAL, "too large");
    tu_assert_error(nb_empty((int64_t[]){0, INT64_MAX}, 2, NB_U8), NB_EINVAL, "too large");
    tu_assert_error(nb_empty((int64_t[]){0, 3, INT64_C(1) << 62}, 3, NB_F32), NB_EINVAL,
                    "too large");
    tu_assert_error(nb_wrap_buffer(NULL, (int64_t[]){0, big, big}, 3, NB_F32, NULL, NULL),
                    NB_EINVAL, "too large");
    tu_assert_error(nb_from_buffer(NULL, (int64_t[]){big, 0, big}, 3, NB_F32), NB_EINVAL,
                    "too large");
    /* An empty tensor whose strides fit is fine, and its strides are right. */
    nb_tensor *e = nb_empty((int64_t[]){0, INT64_C(1) << 20, INT64_C(1) << 20}, 3, NB_F32);
    ck_assert_msg(e != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_numel(e), 0);
    ck_assert_int_eq(nb_strides(e)[0], INT64_C(1) << 40);
    ck_assert_int_eq(nb_strides(e)[1], INT64_C(1) << 20);

    /* Views that build shapes: view, reshape (with and without -1), expand. */
    nb_tensor *z = nb_empty((int64_t[]){0}, 1, NB_F32);
    tu_assert_error(nb_view(z, (int64_t[]){0, big, big}, 3), NB_EINVAL, "too large");
    tu_assert_error(nb_reshape(z, (int64_t[]){big, big, 0}, 3), NB_EINVAL, "too large");
    tu_assert_error(nb_reshape(z, (int64_t[]){0, big, big, -1}, 4), NB_EINVAL, "too large");
    nb_tensor *one = nb_ones((int64_t[]){1}, 1, NB_F32);
    tu_assert_error(nb_expand(one, (int64_t[]){big, big, 1}, 3), NB_ESHAPE, "too large");
    tu_assert_error(nb_expand(one, (int64_t[]){0, big, big}, 3), NB_ESHAPE, "too large");
    nb_tensor *ex = nb_expand(one, (int64_t[]){INT64_C(1) << 20, INT64_C(1) << 20}, 2);
    ck_assert_msg(ex != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_numel(ex), INT64_C(1) << 40);
    nb_tensor *ev = nb_view(z, (int64_t[]){0, INT64_C(1) << 20, 3}, 3);
    ck_assert_msg(ev != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_strides(ev)[0], INT64_C(3) << 20);

    /* Slice and narrow arithmetic with extreme steps and lengths. */
    nb_tensor *r = nb_arange(0, 10, 1, NB_F32);
    nb_tensor *s1 = nb_slice(r, 0, 0, 10, INT64_MAX);
    ck_assert_msg(s1 != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_shape(s1)[0], 1);
    nb_tensor *s2 = nb_slice(r, 0, 3, 10, INT64_MAX - 1);
    ck_assert_msg(s2 != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_shape(s2)[0], 1);
    ck_assert_int_eq(nb_offset(s2), 3);
    tu_assert_error(nb_narrow(r, 0, 5, INT64_MAX), NB_EINDEX, "outside dim 0");

    /* A crafted safetensors header: the file opens or not, but no tensor with such a shape
     * comes out of it. */
    char *dir = tu_make_dir(), *path = tu_path_in(dir, "big.safetensors");
    const char *shapes[] = {"[0,1099511627776,1099511627776]", "[1099511627776,1099511627776,0]",
                            "[0,9223372036854775807]"};
    for (int i = 0; i < 3; i++) {
        write_st_shape(path, shapes[i]);
        nb_clear_error();
        nb_safetensors *f = nb_safetensors_open(path);
        nb_tensor *t = f ? nb_safetensors_get(f, "x") : NULL;
        ck_assert_msg(t == NULL, "shape %s: got a tensor with strides [%lld,...]", shapes[i],
                      t ? (long long)nb_strides(t)[0] : 0LL);
        ck_assert_msg(strstr(nb_last_error(), "too large") != NULL, "shape %s: '%s'", shapes[i],
                      nb_last_error());
        nb_safetensors_close(f);
    }
    /* An empty tensor whose strides fit reads back empty. */
    write_st_shape(path, "[0,1048576,1048576]");
    nb_safetensors *f = nb_safetensors_open(path);
    ck_assert_msg(f != NULL, "%s", nb_last_error());
    nb_tensor *t = nb_safetensors_get(f, "x");
    ck_assert_msg(t != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_numel(t), 0);
    ck_assert_int_eq(nb_strides(t)[0], INT64_C(1) << 40);
    nb_safetensors_close(f);
    free(path);
    tu_rm_dir(dir);
    nb_scope_end();
}
END_TEST

static void *other_thread(void *arg) {
    (void)arg;
    /* A fresh thread starts with no error and its errors do not leak to others. */
    if (nb_last_status() != NB_OK) return (void *)1;
    nb_tensor *r = nb_zeros((int64_t[]){-5}, 1, NB_F32);
    return (r == NULL && nb_last_status() == NB_EINVAL) ? NULL : (void *)1;
}

START_TEST(test_thread_local) {
    nb_clear_error();
    nb__error(NB_EIO, "main thread error");
    pthread_t th;
    void *r;
    pthread_create(&th, NULL, other_thread, NULL);
    pthread_join(th, &r);
    ck_assert(r == NULL);
    ck_assert_int_eq(nb_last_status(), NB_EIO);
    ck_assert_str_eq(nb_last_error(), "main thread error");
    nb_clear_error();
}
END_TEST

Suite *nb_suite_errors(void) {
    Suite *s = suite_create("errors");
    TCase *tc = tcase_create("errors");
    tcase_add_test(tc, test_status_table);
    tcase_add_test(tc, test_null_propagation);
    tcase_add_test(tc, test_error_classes);
    tcase_add_test(tc, test_thread_local);
    tcase_add_test(tc, test_shape_overflow);
    suite_add_tcase(s, tc);
    return s;
}
