/* test_errors.c - errors are values: the status table, thread-local messages, NULL
 * propagation through nested calls, and every class of user error without abort or leak. */
#include <math.h>
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
    /* index out of range (on CUDA reported by the read of the result: docs/cuda.md) */
    tu_assert_index_error(nb_index_select(x, 1, nb_full((int64_t[]){1}, 1, NB_I64, 3)),
                          NB_EINDEX, "index_select: index 3 is out of range");
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


/* ---- released handles (a missing nb_keep, a double free, backward on a released loss) ---- */

/* A custom forward that forgets nb_keep: its result dies with its own scope. */
static nb_tensor *swish_without_keep(nb_tensor *x) {
    nb_scope_begin();
    nb_tensor *r = nb_mul(x, nb_sigmoid(x));
    nb_scope_end();
    return r;
}

#define SCOPE_MSG "tensor used after the scope that owned it ended; nb_keep it to return it"

START_TEST(test_missing_keep_is_an_error) {
    nb_scope_begin();
    nb_clear_error();
    nb_tensor *x = nb_full((int64_t[]){4, 8}, 2, NB_F32, 0.5);
    nb_tensor *y = swish_without_keep(x);
    ck_assert_ptr_nonnull(y); /* the handle itself is returned: the mistake is using it */
    /* New tensors reuse the released storage; the stale handle must not read it. */
    nb_tensor *other = nb_full((int64_t[]){4, 8}, 2, NB_F32, 984.0);
    ck_assert_ptr_nonnull(other);
    tu_assert_error(nb_sum(y, NULL, 0, false), NB_EFREED, "sum: argument 'x': " SCOPE_MSG);
    tu_assert_error(nb_add(other, y), NB_EFREED, SCOPE_MSG);
    tu_assert_error(nb_matmul(y, other), NB_EFREED, SCOPE_MSG);
    /* nb_keep on the stale handle cannot revive it */
    tu_assert_error(nb_keep(y), NB_EFREED, SCOPE_MSG);
    /* with nb_keep the same forward works */
    nb_scope_begin();
    nb_tensor *kept = nb_keep(nb_mul(x, nb_sigmoid(x)));
    nb_scope_end();
    double v = nb_item_f64(nb_sum(kept, NULL, 0, false));
    ck_assert_double_eq_tol(v, 32 * 0.5 / (1 + exp(-0.5)), 1e-4);
    nb_scope_end();
}
END_TEST

/* Every kind of public entry point refuses a released handle with NB_EFREED. */
START_TEST(test_released_handle_everywhere) {
    nb_scope_begin();
    nb_tensor *live = nb_ones((int64_t[]){2, 3}, 2, NB_F32);
    nb_scope_begin();
    nb_tensor *d = nb_ones((int64_t[]){2, 3}, 2, NB_F32);
    nb_scope_end();
    nb_clear_error();
#define EXPECT_FREED(call)                                                                   \
    do {                                                                                     \
        nb_clear_error();                                                                    \
        call;                                                                                \
        ck_assert_msg(nb_last_status() == NB_EFREED, "%s: status %s (%s)", #call,           \
                      nb_status_name(nb_last_status()), nb_last_error());                    \
    } while (0)
    /* tensors out */
    tu_assert_error(nb_add(live, d), NB_EFREED, "add");
    tu_assert_error(nb_relu(d), NB_EFREED, "relu");
    tu_assert_error(nb_sum(d, NULL, 0, false), NB_EFREED, "sum");
    tu_assert_error(nb_softmax(d, 1), NB_EFREED, "softmax");
    tu_assert_error(nb_view(d, (int64_t[]){6}, 1), NB_EFREED, "view");
    tu_assert_error(nb_reshape(d, (int64_t[]){6}, 1), NB_EFREED, "reshape");
    tu_assert_error(nb_transpose(d, 0, 1), NB_EFREED, "transpose");
    tu_assert_error(nb_clone(d), NB_EFREED, "clone");
    tu_assert_error(nb_detach(d), NB_EFREED, "detach");
    tu_assert_error(nb_to_device(d, NB_CPU), NB_EFREED, "to_device");
    tu_assert_error(nb_to_dtype(d, NB_F64), NB_EFREED, "");
    tu_assert_error(nb_cat((nb_tensor *[]){live, d}, 2, 0), NB_EFREED, "cat");
    tu_assert_error(nb_tensor_retain(d), NB_EFREED, "tensor_retain");
    tu_assert_error(nb_keep(d), NB_EFREED, "keep");
    /* statuses out */
    ASSERT_ST(nb_fill_(d, 1), NB_EFREED, "fill_");
    ASSERT_ST(nb_copy_(live, d), NB_EFREED, "copy_");
    ASSERT_ST(nb_copy_(d, live), NB_EFREED, "copy_");
    ASSERT_ST(nb_backward(d), NB_EFREED, "backward");
    ASSERT_ST(nb_set_requires_grad(d, true), NB_EFREED, "set_requires_grad");
    float buf[6];
    ASSERT_ST(nb_read(d, buf, 6, NB_F32), NB_EFREED, "read");
    /* metadata: "no tensor" answers, and the error */
    EXPECT_FREED(ck_assert_int_eq(nb_ndim(d), -1));
    EXPECT_FREED(ck_assert_ptr_null(nb_shape(d)));
    EXPECT_FREED(ck_assert_int_eq(nb_numel(d), -1));
    EXPECT_FREED(ck_assert_int_eq(nb_tensor_dtype(d), NB_DTYPE_COUNT));
    EXPECT_FREED(ck_assert_ptr_null(nb_data(d)));
    EXPECT_FREED(ck_assert(isnan(nb_item_f64(d))));
    EXPECT_FREED(ck_assert(!nb_is_contiguous(d)));
    EXPECT_FREED(ck_assert(!nb_requires_grad(d)));
    EXPECT_FREED(ck_assert_ptr_null(nb_grad(d)));
    EXPECT_FREED(nb_tensor_free(d));
#undef EXPECT_FREED
    /* the live tensor is untouched by all this */
    ck_assert_double_eq(nb_item_f64(nb_sum(live, NULL, 0, false)), 6);
    nb_scope_end();
}
END_TEST

START_TEST(test_double_free) {
    nb_clear_error();
    nb_tensor *t = nb_ones((int64_t[]){3}, 1, NB_F32);
    nb_tensor_free(t);
    ck_assert_int_eq(nb_last_status(), NB_OK);
    nb_tensor_free(t); /* silent today, and the header may already belong to another tensor */
    ck_assert_int_eq(nb_last_status(), NB_EFREED);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "tensor_free: argument 't': tensor used "
                                                  "after nb_tensor_free released it"));
    /* freeing what a scope already released */
    nb_scope_begin();
    nb_tensor *s = nb_ones((int64_t[]){3}, 1, NB_F32);
    nb_scope_end();
    nb_clear_error();
    nb_tensor_free(s);
    ck_assert_int_eq(nb_last_status(), NB_EFREED);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), SCOPE_MSG));
    /* a retained tensor still needs both frees: the first is not an error */
    nb_tensor *r = nb_ones((int64_t[]){3}, 1, NB_F32);
    nb_tensor_retain(r);
    nb_clear_error();
    nb_tensor_free(r);
    nb_tensor_free(r);
    ck_assert_int_eq(nb_last_status(), NB_OK);
}
END_TEST

START_TEST(test_backward_on_released_loss) {
    nb_tensor *w = nb_ones((int64_t[]){4}, 1, NB_F32);
    ASSERT_OK(nb_set_requires_grad(w, true));
    nb_scope_begin();
    nb_tensor *loss = nb_sum(nb_mul(w, w), NULL, 0, false);
    ck_assert_ptr_nonnull(loss);
    nb_scope_end();
    /* segfaulted before: the engine walked a released header */
    ASSERT_ST(nb_backward(loss), NB_EFREED, "backward: argument 'output': " SCOPE_MSG);
    ck_assert_ptr_null(nb_grad(w));
    /* a released grad_output is refused too */
    nb_scope_begin();
    nb_tensor *y = nb_mul(w, w);
    nb_scope_begin();
    nb_tensor *g = nb_ones((int64_t[]){4}, 1, NB_F32);
    nb_scope_end();
    nb_backward_opts bo = nb_backward_defaults();
    bo.grad_output = g;
    ASSERT_ST(nb_backward_ex(y, &bo), NB_EFREED, ".grad_output");
    nb_scope_end();
    nb_tensor_free(w);
}
END_TEST

/* A handle stays recognisably released while at least 1024 other headers were released
 * after it (the quarantine's default depth; NB_HANDLE_QUARANTINE sets it). */
START_TEST(test_quarantine_depth) {
    nb_scope_begin();
    nb_scope_begin();
    nb_tensor *d = nb_ones((int64_t[]){2}, 1, NB_F32);
    nb_scope_end();
    for (int i = 0; i < 1000; i++) {
        nb_scope_begin();
        ck_assert_ptr_nonnull(nb_add(nb_ones((int64_t[]){2}, 1, NB_F32), nb_scalar(1, NB_F32)));
        nb_scope_end(); /* three headers per round: 3000 released after d */
        if (i % 250 == 0) {
            nb_clear_error();
            ck_assert_int_eq(nb_numel(d), -1);
            ck_assert_int_eq(nb_last_status(), NB_EFREED);
        }
    }
    /* and while new tensors are alive: with fewer than 1024 headers released after e, none of
     * them may take e's header (a free list that handed it out again would make e a handle
     * to one of them, of 5 elements) */
    nb_scope_begin();
    nb_tensor *e = nb_ones((int64_t[]){2}, 1, NB_F32);
    nb_scope_end();
    nb_scope_begin();
    for (int i = 0; i < 500; i++) ck_assert_ptr_nonnull(nb_ones((int64_t[]){2}, 1, NB_F32));
    nb_scope_end(); /* 500 released after e */
    nb_scope_begin();
    for (int i = 0; i < 300; i++) {
        ck_assert_ptr_nonnull(nb_ones((int64_t[]){5}, 1, NB_F32)); /* live until the end */
        nb_clear_error();
        ck_assert_int_eq(nb_numel(e), -1);
        ck_assert_int_eq(nb_last_status(), NB_EFREED);
    }
    nb_scope_end();
    nb_scope_end();
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
    tcase_add_test(tc, test_missing_keep_is_an_error);
    tcase_add_test(tc, test_released_handle_everywhere);
    tcase_add_test(tc, test_double_free);
    tcase_add_test(tc, test_backward_on_released_loss);
    tcase_add_test(tc, test_quarantine_depth);
    suite_add_tcase(s, nb_tcase_messages());
    suite_add_tcase(s, nb_tcase_handles());
    suite_add_tcase(s, tc);
    return s;
}
