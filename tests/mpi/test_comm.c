/* test_comm.c - communicators and asynchronous work: world handles, nb_comm_split (even /
 * odd ranks), the chunk rule, the size-1 "self" backend, asynchronous collectives started
 * together and waited out of order (small ones run nabla's own point-to-point schedules,
 * large ones go to the worker thread), nb_work_test polling, and no allocation in the
 * steady state. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_test.h"

START_TEST(test_world_handles) {
    nb_comm *a = nb_comm_world(), *b = nb_comm_world();
    MT_CHECK(a && b, "nb_comm_world failed: %s", nb_last_error());
    if (a && b) {
        MT_CHECK(nb_comm_rank(a) == mt_rank && nb_comm_size(b) == mt_size, "rank/size differ");
        MT_CHECK(!strcmp(nb_comm_backend(a), "mpi"), "backend %s", nb_comm_backend(a));
        nb_scope_begin();
        nb_tensor *t = nb_full((int64_t[]){3}, 1, NB_F32, 1);
        MT_OK(nb_allreduce(b, t, NB_REDUCE_SUM));
        MT_CHECK(nb_item_f64(nb_select(t, 0, 2)) == mt_size, "sum of ones is not the size");
        nb_scope_end();
    }
    nb_comm_free(a);
    nb_comm_free(b);
    nb_comm_free(NULL);
    /* The timeout setting. */
    double old = nb_comm_timeout(mt_world);
    nb_comm_set_timeout(mt_world, 12.5);
    MT_CHECK(nb_comm_timeout(mt_world) == 12.5, "timeout %g", nb_comm_timeout(mt_world));
    nb_comm_set_timeout(mt_world, -1);
    MT_CHECK(nb_last_status() == NB_EINVAL && nb_comm_timeout(mt_world) == 12.5,
             "a negative timeout was accepted");
    nb_clear_error();
    nb_comm_set_timeout(mt_world, old);
    MT_END();
}
END_TEST

START_TEST(test_chunk_rule) {
    /* ceil(n / size) per rank, the last ones shorter or empty; chunks tile [0, n). */
    struct { int64_t n; int size; int64_t want[5]; } cases[] = {
        {10, 4, {3, 3, 3, 1}}, {5, 4, {2, 2, 1, 0}}, {3, 4, {1, 1, 1, 0}}, {0, 3, {0, 0, 0}},
        {8, 4, {2, 2, 2, 2}}, {1001, 4, {251, 251, 251, 248}}, {7, 1, {7}}, {2, 5, {1, 1, 0, 0, 0}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t at = 0;
        for (int r = 0; r < cases[c].size; r++) {
            int64_t b, e;
            nb_comm_chunk(cases[c].n, cases[c].size, r, &b, &e);
            MT_CHECK(b == at && e - b == cases[c].want[r], "chunk(%lld, %d, %d) = [%lld, %lld)",
                     (long long)cases[c].n, cases[c].size, r, (long long)b, (long long)e);
            at = e;
        }
        MT_CHECK(at == cases[c].n, "chunks of %lld do not cover it", (long long)cases[c].n);
    }
    int64_t b = 7, e = 7;
    nb_comm_chunk(10, 4, 4, &b, &e); /* not a rank: empty */
    MT_CHECK(b == 0 && e == 0, "rank out of range gave [%lld, %lld)", (long long)b, (long long)e);
    MT_END();
}
END_TEST

START_TEST(test_split) {
    /* Even and odd world ranks; keys reverse the order inside each group. */
    nb_comm *half = nb_comm_split(mt_world, mt_rank % 2, -mt_rank);
    MT_CHECK(half != NULL, "comm_split: %s", nb_last_error());
    if (half) {
        int n = (mt_size + 1 - mt_rank % 2) / 2; /* ranks of my parity */
        MT_CHECK(nb_comm_size(half) == n, "group size %d, expected %d", nb_comm_size(half), n);
        int want = n - 1 - mt_rank / 2; /* reversed by the key */
        MT_CHECK(nb_comm_rank(half) == want, "group rank %d, expected %d", nb_comm_rank(half), want);
        MT_CHECK(nb_comm_timeout(half) == nb_comm_timeout(mt_world), "timeout not inherited");
        nb_scope_begin();
        /* Sum of the world ranks in my group, by allreduce and by all-gathering them. */
        nb_tensor *t = nb_full((int64_t[]){1}, 1, NB_I64, mt_rank);
        MT_OK(nb_allreduce(half, t, NB_REDUCE_SUM));
        int64_t want_sum = 0;
        for (int r = mt_rank % 2; r < mt_size; r += 2) want_sum += r;
        MT_CHECK(nb_item_i64(t) == want_sum, "group sum %lld, expected %lld",
                 (long long)nb_item_i64(t), (long long)want_sum);
        nb_tensor *all = nb_zeros((int64_t[]){n}, 1, NB_I32);
        MT_OK(nb_allgather(half, all, nb_full((int64_t[]){1}, 1, NB_I32, mt_rank)));
        for (int i = 0; i < n; i++) { /* group rank i is world rank: highest of my parity first */
            int64_t w = (int64_t)nb_get_f64(all, (int64_t[]){i});
            int64_t expect = mt_rank % 2 + 2 * (n - 1 - i);
            MT_CHECK(w == expect, "group rank %d is world rank %lld, expected %lld", i,
                     (long long)w, (long long)expect);
        }
        nb_scope_end();
        /* A split of the split, and the world still works while both exist. */
        nb_comm *solo = nb_comm_split(half, nb_comm_rank(half), 0);
        MT_CHECK(solo && nb_comm_size(solo) == 1, "split into singletons failed");
        nb_comm_free(solo);
        nb_comm_free(half);
    }
    MT_CHECK(nb_comm_split(mt_world, -1, 0) == NULL && nb_last_status() == NB_EINVAL,
             "a negative color was accepted");
    nb_clear_error();
    MT_OK(nb_barrier(mt_world));
    MT_END();
}
END_TEST

/* Communicators made one after another (MPI_Comm_split and MPI_Comm_dup on the worker) while
 * the control thread progresses MPI: tools/run-tsan runs this suite with the control thread
 * polling every few microseconds (NB_TEST_CTL_POLL_US), where Open MPI completes the
 * worker's communicator requests from the control thread (tools/tsan.supp). */
START_TEST(test_split_repeated) {
    for (int i = 0; i < 200 && !mt_failed(); i++) {
        nb_comm *c = nb_comm_split(mt_world, 0, mt_rank);
        MT_CHECK(c != NULL, "split %d: %s", i, nb_last_error());
        if (!c) break;
        nb_scope_begin();
        nb_tensor *x = nb_ones((int64_t[]){4}, 1, NB_I32);
        MT_OK(nb_allreduce(c, x, NB_REDUCE_SUM));
        MT_CHECK(nb_item_i64(nb_select(x, 0, 3)) == mt_size, "split %d: sum %lld", i,
                 (long long)nb_item_i64(nb_select(x, 0, 3)));
        nb_scope_end();
        nb_comm_free(c);
    }
    MT_END();
}
END_TEST

START_TEST(test_async_out_of_order) {
    /* Small (point-to-point schedules) and large (worker) operations, started together,
     * waited in reverse order. */
    enum { K = 8 };
    int64_t sizes[K] = {1, 1 << 20, 100, 3 << 18, 0, 4096, 1001, 1 << 19};
    nb_dtype dts[K] = {NB_F32, NB_F32, NB_BF16, NB_F16, NB_F64, NB_I32, NB_F64, NB_BF16};
    nb_scope_begin();
    nb_tensor *t[K];
    nb_work *w[K];
    for (int i = 0; i < K; i++) {
        t[i] = mt_make(mt_rank, sizes[i], dts[i], 20 + i);
        w[i] = nb_allreduce_async(mt_world, t[i], i % 2 ? NB_REDUCE_SUM : NB_REDUCE_MAX);
        MT_CHECK(w[i] != NULL, "allreduce_async %d: %s", i, nb_last_error());
    }
    /* Others in between: broadcast, allgather, reduce_scatter, reduce, barrier. */
    nb_tensor *bc = mt_make(mt_rank, 5000, NB_I64, 30);
    nb_work *wb = nb_broadcast_async(mt_world, bc, mt_size - 1);
    nb_tensor *gin = mt_make(mt_rank, 70000, NB_F32, 31);
    nb_tensor *gout = nb_zeros((int64_t[]){70000 * mt_size}, 1, NB_F32);
    nb_work *wg = nb_allgather_async(mt_world, gout, gin);
    int64_t b, e;
    nb_comm_chunk(999, mt_size, mt_rank, &b, &e);
    nb_tensor *rin = mt_make(mt_rank, 999, NB_BF16, 32);
    nb_tensor *rout = nb_zeros((int64_t[]){e - b}, 1, NB_BF16);
    nb_work *wr = nb_reduce_scatter_async(mt_world, rout, rin, NB_REDUCE_AVG);
    nb_tensor *red = mt_make(mt_rank, 300, NB_U8, 33);
    nb_work *wd = nb_reduce_async(mt_world, red, NB_REDUCE_SUM, 0);
    nb_tensor *a2in = mt_make(mt_rank, 6 * mt_size, NB_I32, 34);
    nb_tensor *a2out = nb_zeros((int64_t[]){6 * mt_size}, 1, NB_I32);
    nb_work *wa = nb_all_to_all_async(mt_world, a2out, a2in);
    nb_work *wbar = nb_barrier_async(mt_world);
    MT_OK(nb_work_wait(wbar));
    MT_OK(nb_work_wait(wa));
    MT_OK(nb_work_wait(wd));
    MT_OK(nb_work_wait(wr));
    MT_OK(nb_work_wait(wg));
    MT_OK(nb_work_wait(wb));
    for (int i = K - 1; i >= 0; i--) {
        /* Poll some of them with nb_work_test first. */
        if (i % 3 == 0 && w[i]) {
            int r;
            while ((r = nb_work_test(w[i])) == 0) {
            }
            MT_CHECK(r == 1, "work_test %d: %d (%s)", i, r, nb_last_error());
            nb_work_free(w[i]);
        } else {
            MT_OK(nb_work_wait(w[i]));
        }
        double *ref = malloc(sizeof(double) * (size_t)(sizes[i] + 1));
        for (int64_t j = 0; j < sizes[i]; j++)
            ref[j] = mt_reduce_ref(i % 2 ? NB_REDUCE_SUM : NB_REDUCE_MAX, j, dts[i], 20 + i, mt_size);
        mt_expect(t[i], ref, sizes[i], "async allreduce");
        free(ref);
    }
    double *ref = malloc(sizeof(double) * 70000 * (size_t)mt_size);
    for (int64_t j = 0; j < 5000; j++) ref[j] = mt_value(mt_size - 1, j, NB_I64, 30);
    mt_expect(bc, ref, 5000, "async broadcast");
    for (int64_t j = 0; j < 70000 * mt_size; j++) ref[j] = mt_value((int)(j / 70000), j % 70000, NB_F32, 31);
    mt_expect(gout, ref, 70000 * mt_size, "async allgather");
    for (int64_t j = b; j < e; j++) ref[j - b] = mt_reduce_ref(NB_REDUCE_AVG, j, NB_BF16, 32, mt_size);
    mt_expect(rout, ref, e - b, "async reduce_scatter (avg, bf16)");
    for (int64_t j = 0; j < 300; j++)
        ref[j] = mt_rank == 0 ? mt_reduce_ref(NB_REDUCE_SUM, j, NB_U8, 33, mt_size)
                              : mt_value(mt_rank, j, NB_U8, 33);
    mt_expect(red, ref, 300, "async reduce");
    for (int64_t j = 0; j < 6 * mt_size; j++) ref[j] = mt_value((int)(j / 6), mt_rank * 6 + j % 6, NB_I32, 34);
    mt_expect(a2out, ref, 6 * mt_size, "async all_to_all");
    free(ref);
    nb_scope_end();
    MT_END();
}
END_TEST

/* Asynchronous operations survive the scope that started them: the work keeps its tensors. */
START_TEST(test_async_outlives_scope) {
    nb_scope_begin();
    nb_tensor *t = mt_make(mt_rank, 1 << 18, NB_F32, 40);
    nb_tensor *keep = nb_keep(t); /* ours now; the work holds its own reference */
    nb_tensor *nc = nb_transpose(nb_view(mt_make(mt_rank, 600, NB_F64, 41), (int64_t[]){20, 30}, 2), 0, 1);
    nb_tensor *keep2 = nb_keep(nc);
    nb_work *w1 = nb_allreduce_async(mt_world, t, NB_REDUCE_SUM);
    nb_work *w2 = nb_allreduce_async(mt_world, nc, NB_REDUCE_MIN);
    nb_scope_end(); /* staging copies and references inside the works stay alive */
    MT_OK(nb_work_wait(w2));
    MT_OK(nb_work_wait(w1));
    nb_scope_begin();
    double *ref = malloc(sizeof(double) * (1 << 18));
    for (int64_t j = 0; j < 1 << 18; j++) ref[j] = mt_reduce_ref(NB_REDUCE_SUM, j, NB_F32, 40, mt_size);
    mt_expect(keep, ref, 1 << 18, "allreduce after its scope ended");
    for (int64_t j = 0; j < 600; j++) { /* logical order of the transposed (30, 20) view */
        int64_t c = j / 20, r = j % 20;
        ref[j] = mt_reduce_ref(NB_REDUCE_MIN, r * 30 + c, NB_F64, 41, mt_size);
    }
    mt_expect(keep2, ref, 600, "staged allreduce after its scope ended");
    free(ref);
    nb_scope_end();
    nb_tensor_free(keep);
    nb_tensor_free(keep2);
    MT_END();
}
END_TEST

/* DESIGN rule 4: after warm-up, collectives on contiguous tensors allocate nothing (work
 * handles are recycled, half staging comes from the caching allocator). */
START_TEST(test_steady_state_no_alloc) {
    nb_scope_begin();
    nb_tensor *small = mt_make(mt_rank, 1000, NB_F32, 50);
    nb_tensor *large = mt_make(mt_rank, 1 << 20, NB_BF16, 51);
    nb_tensor *out = nb_zeros((int64_t[]){1000 * mt_size}, 1, NB_F32);
    nb_alloc_stats before, after;
    for (int round = 0; round < 8; round++) {
        if (round == 3) nb_alloc_get_stats(&before);
        nb_work *a = nb_allreduce_async(mt_world, small, NB_REDUCE_MAX);
        nb_work *b = nb_allreduce_async(mt_world, large, NB_REDUCE_MAX);
        MT_OK(nb_allgather(mt_world, out, small));
        MT_OK(nb_work_wait(b));
        MT_OK(nb_work_wait(a));
    }
    nb_alloc_get_stats(&after);
    MT_CHECK(after.system_allocs == before.system_allocs,
             "%lld system allocations in 5 steady-state rounds",
             (long long)(after.system_allocs - before.system_allocs));
    nb_scope_end();
    MT_END();
}
END_TEST

/* The size-1 backend: every collective works, send to itself is buffered. */
START_TEST(test_self_backend) {
    nb_comm *s = nb_comm_self();
    MT_CHECK(s && nb_comm_size(s) == 1 && nb_comm_rank(s) == 0 &&
                 !strcmp(nb_comm_backend(s), "self"), "nb_comm_self");
    nb_scope_begin();
    for (int d = 0; d < NB_DTYPE_COUNT; d++) {
        nb_dtype dt = mt_dtypes[d];
        int64_t n = 1001;
        double *ref = malloc(sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++) ref[i] = mt_value(3, i, dt, d);
        nb_tensor *t = mt_make(3, n, dt, d);
        MT_OK(nb_allreduce(s, t, NB_REDUCE_SUM));
        MT_OK(nb_broadcast(s, t, 0));
        MT_OK(nb_reduce(s, t, NB_REDUCE_MAX, 0));
        mt_expect(t, ref, n, "self allreduce/broadcast/reduce");
        nb_tensor *o = nb_zeros(&n, 1, dt);
        MT_OK(nb_allgather(s, o, t));
        mt_expect(o, ref, n, "self allgather");
        nb_tensor *o2 = nb_zeros(&n, 1, dt);
        MT_OK(nb_reduce_scatter(s, o2, t, NB_REDUCE_SUM));
        mt_expect(o2, ref, n, "self reduce_scatter");
        nb_tensor *o3 = nb_zeros(&n, 1, dt);
        MT_OK(nb_all_to_all(s, o3, t));
        mt_expect(o3, ref, n, "self all_to_all");
        MT_OK(nb_send(s, t, 0, d));
        nb_tensor *r = nb_zeros(&n, 1, dt);
        MT_OK(nb_recv(s, r, 0, d));
        mt_expect(r, ref, n, "self send/recv");
        free(ref);
    }
    MT_OK(nb_barrier(s));
    /* A recv with no send times out, naming the missing message. */
    nb_comm_set_timeout(s, 0.05);
    nb_status st = nb_recv(s, nb_zeros((int64_t[]){4}, 1, NB_F32), 0, 77);
    MT_CHECK(st == NB_ETIMEOUT && strstr(nb_last_error(), "tag 77"), "self recv: %s (%s)",
             nb_status_name(st), nb_last_error());
    nb_clear_error();
    nb_comm_free(nb_comm_split(s, 3, 0));
    nb_scope_end();
    nb_comm_free(s);
    MT_END();
}
END_TEST

/* The graceful stop's agreement (nabla/stop.h): a signal that reached one rank stops every
 * rank after the same step, the caller's value is summed along, SIGTERM wins over SIGINT. */
START_TEST(test_stop_agree) {
    double v = 1;
    int sig = -1;
    MT_OK(nb_stop_sync(mt_world, &v, &sig));
    MT_CHECK(v == mt_size && sig == 0, "no request: sum %g (want %d), sig %d", v, mt_size, sig);
    if (mt_rank == mt_size - 1) nb_stop_request(SIGTERM); /* one rank only */
    v = 2;
    MT_OK(nb_stop_sync(mt_world, &v, &sig));
    MT_CHECK(v == 2.0 * mt_size && sig == SIGTERM, "one rank's SIGTERM: sum %g, sig %d", v, sig);
    if (mt_rank == 0) nb_stop_request(SIGINT); /* rank 0 SIGINT, the last SIGTERM (size > 1) */
    MT_OK(nb_stop_sync(mt_world, NULL, &sig));
    MT_CHECK(sig == (mt_size > 1 ? SIGTERM : SIGINT), "SIGINT + SIGTERM: sig %d", sig);
    nb_stop_request(0);
    MT_OK(nb_stop_sync(mt_world, NULL, &sig));
    MT_CHECK(sig == 0, "cleared: sig %d", sig);
    MT_END();
}
END_TEST

Suite *mt_suite_comm(void) {
    Suite *s = suite_create("comm");
    TCase *tc = tcase_create("comm");
    tcase_add_test(tc, test_world_handles);
    tcase_add_test(tc, test_chunk_rule);
    tcase_add_test(tc, test_split);
    tcase_add_test(tc, test_split_repeated);
    tcase_add_test(tc, test_async_out_of_order);
    tcase_add_test(tc, test_async_outlives_scope);
    tcase_add_test(tc, test_steady_state_no_alloc);
    tcase_add_test(tc, test_self_backend);
    tcase_add_test(tc, test_stop_agree);
    suite_add_tcase(s, tc);
    return s;
}
