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
    suite_add_tcase(s, tc);
    return s;
}
