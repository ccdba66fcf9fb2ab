/* test_memory.c - the caching host allocator (alignment, reuse, stats) and scopes
 * (ownership of op results, nb_keep, nesting, threads). */
#include <pthread.h>
#include <string.h>

#include "testutil.h"

START_TEST(test_alloc_reuse) {
    nb_alloc_stats a, b;
    void *p = nb_host_alloc(1000);
    ck_assert(p && ((uintptr_t)p & 63) == 0);
    memset(p, 1, 1000);
    nb_host_free(p);
    nb_alloc_get_stats(&a);
    for (int i = 0; i < 100; i++) {
        void *q = nb_host_alloc(1000 - (size_t)(i % 7)); /* same size class */
        ck_assert(q && ((uintptr_t)q & 63) == 0);
        nb_host_free(q);
    }
    nb_alloc_get_stats(&b);
    ck_assert_int_eq(b.system_allocs, a.system_allocs);
    ck_assert_int_eq(b.allocs, a.allocs + 100);
    ck_assert_int_eq(b.bytes_live, a.bytes_live);
    /* live/peak accounting */
    nb_alloc_reset_peak();
    void *big = nb_host_alloc(1 << 20);
    nb_alloc_get_stats(&a);
    ck_assert_int_ge(a.bytes_live - b.bytes_live, 1 << 20);
    ck_assert_int_ge(a.bytes_peak, a.bytes_live);
    nb_host_free(big);
    nb_alloc_get_stats(&b);
    ck_assert_int_ge(b.bytes_cached, 1 << 20);
    nb_alloc_empty_cache();
    nb_alloc_get_stats(&a);
    ck_assert_int_eq(a.bytes_cached, 0);
    ck_assert_int_gt(a.system_frees, b.system_frees);
    /* sizes across many classes keep alignment and do not overlap */
    void *ps[40];
    for (int i = 0; i < 40; i++) {
        size_t n = (size_t)1 << (i % 20);
        ps[i] = nb_host_alloc(n + (size_t)i);
        ck_assert(((uintptr_t)ps[i] & 63) == 0);
        memset(ps[i], i, n + (size_t)i);
    }
    for (int i = 0; i < 40; i++) {
        ck_assert(((unsigned char *)ps[i])[0] == (unsigned char)i);
        nb_host_free(ps[i]);
    }
}
END_TEST

/* One "training-like" step of ops of every family. */
static double step_ops(nb_tensor *x, nb_tensor *w) {
    nb_scope_begin();
    nb_tensor *h = nb_relu(nb_add(nb_matmul(x, w), nb_mul_scalar(x, 0.5)));
    nb_tensor *p = nb_softmax(h, -1);
    nb_tensor *s = nb_sum(nb_mul(p, nb_exp(nb_neg(h))), NULL, 0, false);
    nb_tensor *t = nb_contiguous(nb_transpose(h, 0, 1));
    nb_tensor *c = nb_cat((nb_tensor *[]){t, t}, 2, 0);
    double v = nb_item_f64(s) + nb_item_f64(nb_mean(c, NULL, 0, false));
    nb_scope_end();
    return v;
}

START_TEST(test_no_alloc_steady_state) {
    nb_scope_begin();
    nb_tensor *x = tu_random((int64_t[]){64, 32}, 2, NB_F32, -1, 1, 1);
    nb_tensor *w = tu_random((int64_t[]){32, 32}, 2, NB_F32, -1, 1, 2);
    double first = 0;
    for (int i = 0; i < 3; i++) first = step_ops(x, w); /* warm-up */
    nb_alloc_stats a, b;
    nb_alloc_get_stats(&a);
    for (int i = 0; i < 50; i++) ck_assert(step_ops(x, w) == first); /* and deterministic */
    nb_alloc_get_stats(&b);
    ck_assert_msg(b.system_allocs == a.system_allocs, "%lld new system allocations",
                  (long long)(b.system_allocs - a.system_allocs));
    ck_assert_int_eq(b.bytes_live, a.bytes_live); /* nothing leaked per step */
    ck_assert_int_gt(b.allocs, a.allocs);
    nb_scope_end();
}
END_TEST

START_TEST(test_scope_ownership) {
    nb_alloc_stats a, b;
    nb_alloc_get_stats(&a);
    ck_assert_int_eq(nb_scope_depth(), 0);
    nb_scope_begin();
    nb_tensor *outer = nb_zeros((int64_t[]){10}, 1, NB_F32);
    nb_tensor *kept;
    nb_scope_begin();
    ck_assert_int_eq(nb_scope_depth(), 2);
    nb_tensor *tmp = nb_ones((int64_t[]){100}, 1, NB_F32);
    kept = nb_keep(nb_narrow(tmp, 0, 5, 10)); /* a view keeps its storage alive */
    nb_tensor *k2 = nb_keep(outer);           /* not in this scope: extra ref to the outer */
    ck_assert(k2 == outer);
    nb_scope_end();
    ck_assert_int_eq(nb_scope_depth(), 1);
    tu_assert_close(kept, ((double[]){1, 1, 1, 1, 1, 1, 1, 1, 1, 1}), ((int64_t[]){10}), 1, 0);
    nb_scope_end();
    nb_alloc_get_stats(&b);
    ck_assert_int_eq(b.bytes_live, a.bytes_live); /* the kept/outer refs went to the outer scope */
    /* outermost nb_keep hands the reference to the caller */
    nb_scope_begin();
    nb_tensor *mine = nb_keep(nb_full((int64_t[]){3}, 1, NB_I64, 4));
    nb_scope_end();
    nb_tensor *el = nb_select(mine, 0, 2); /* outside scopes: the caller owns it too */
    ck_assert_int_eq(nb_item_i64(el), 4);
    nb_alloc_get_stats(&a);
    ck_assert_int_gt(a.bytes_live, b.bytes_live);
    nb_tensor_free(mine);
    nb_tensor_free(el);
    nb_alloc_get_stats(&a);
    ck_assert_int_eq(a.bytes_live, b.bytes_live);
    ck_assert(nb_scope_end() == NB_ESTATE);
    ck_assert(strstr(nb_last_error(), "no scope") != NULL);
    nb_clear_error();
}
END_TEST

START_TEST(test_caller_owned_outside_scope) {
    nb_alloc_stats a, b;
    nb_alloc_get_stats(&a);
    nb_tensor *t = nb_zeros((int64_t[]){256}, 1, NB_F64);
    nb_tensor *v = nb_view(t, (int64_t[]){16, 16}, 2);
    nb_tensor_free(t); /* the view holds the storage */
    ck_assert(nb_fill_(v, 2) == NB_OK);
    nb_tensor *r = nb_tensor_retain(v);
    nb_tensor_free(v);
    ck_assert(nb_get_f64(r, (int64_t[]){15, 15}) == 2);
    nb_tensor_free(r);
    nb_tensor_free(NULL);
    nb_alloc_get_stats(&b);
    ck_assert_int_eq(b.bytes_live, a.bytes_live);
}
END_TEST

static void *thread_scopes(void *arg) {
    (void)arg;
    for (int i = 0; i < 200; i++) {
        nb_scope_begin();
        nb_tensor *t = nb_full((int64_t[]){64}, 1, NB_F32, i);
        if (nb_item_f64(nb_select(t, 0, 63)) != i) return (void *)1;
        nb_scope_end();
    }
    return nb_scope_depth() == 0 ? NULL : (void *)1;
}

START_TEST(test_scopes_per_thread) {
    nb_scope_begin(); /* this thread's scope is not visible to the others */
    pthread_t th[4];
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, thread_scopes, NULL);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(th[i], &r);
        ck_assert(r == NULL);
    }
    ck_assert_int_eq(nb_scope_depth(), 1);
    nb_scope_end();
}
END_TEST

Suite *nb_suite_memory(void) {
    Suite *s = suite_create("memory");
    TCase *tc = tcase_create("memory");
    tcase_add_test(tc, test_alloc_reuse);
    tcase_add_test(tc, test_no_alloc_steady_state);
    tcase_add_test(tc, test_scope_ownership);
    tcase_add_test(tc, test_caller_owned_outside_scope);
    tcase_add_test(tc, test_scopes_per_thread);
    suite_add_tcase(s, tc);
    return s;
}
