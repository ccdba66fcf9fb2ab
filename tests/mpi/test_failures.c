/* test_failures.c - errors are values: argument errors of every collective, message size
 * mismatches, timeouts that name the ranks that did not arrive (a collective that one rank
 * enters late: small ones, which nabla runs as its own schedules of messages, in one round
 * and in several, and large ones on the worker thread; by wait and by test), the
 * realignment after the late rank arrives (the timed-out schedules are still advanced in
 * the background), and (suite "dead_peer", run alone with --dead-peer) a rank that dies:
 * the others fail within the timeout with a clear message. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mpi_test.h"

/* st is `want` and the message contains needle. */
static void expect_error(nb_status st, nb_status want, const char *needle, const char *what) {
    MT_CHECK(st == want && strstr(nb_last_error(), needle), "%s: %s \"%s\", expected %s with \"%s\"",
             what, nb_status_name(st), nb_last_error(), nb_status_name(want), needle);
    nb_clear_error();
}

START_TEST(test_argument_errors) {
    nb_scope_begin();
    nb_tensor *f = nb_zeros((int64_t[]){10}, 1, NB_F32);
    nb_tensor *i = nb_zeros((int64_t[]){10}, 1, NB_I32);
    nb_tensor *big = nb_zeros((int64_t[]){10 * mt_size + 1}, 1, NB_F32);
    expect_error(nb_allreduce(NULL, f, NB_REDUCE_SUM), NB_ENULL, "comm is NULL", "NULL comm");
    expect_error(nb_allreduce(mt_world, NULL, NB_REDUCE_SUM), NB_ENULL, "allreduce", "NULL t");
    expect_error(nb_allreduce(mt_world, f, (nb_reduce_op)9), NB_EINVAL, "reduce op", "bad op");
    expect_error(nb_allreduce(mt_world, i, NB_REDUCE_AVG), NB_EDTYPE, "floating-point", "avg i32");
    expect_error(nb_broadcast(mt_world, f, mt_size), NB_EINVAL, "root", "root == size");
    expect_error(nb_reduce(mt_world, f, NB_REDUCE_SUM, -1), NB_EINVAL, "root", "root -1");
    expect_error(nb_allgather(mt_world, big, i), NB_EDTYPE, "same dtype", "allgather dtypes");
    /* (3 elements are no rank's chunk of 10 x size + 1: the check must fail on every rank) */
    expect_error(nb_allgather(mt_world, big, nb_zeros((int64_t[]){3}, 1, NB_F32)), NB_ESHAPE,
                 "allgather", "allgather sizes");
    expect_error(nb_reduce_scatter(mt_world, big, f, NB_REDUCE_SUM), NB_ESHAPE, "chunk",
                 "reduce_scatter sizes");
    expect_error(nb_reduce_scatter(mt_world, f, big, NB_REDUCE_AVG + 7), NB_EINVAL, "reduce op",
                 "reduce_scatter op");
    expect_error(nb_all_to_all(mt_world, big, f), NB_ESHAPE, "all_to_all", "all_to_all sizes");
    if (mt_size > 1)
        expect_error(nb_all_to_all(mt_world, big, big), NB_ESHAPE, "divisible", "all_to_all blocks");
    expect_error(nb_send(mt_world, f, mt_size, 0), NB_EINVAL, "destination", "send dst");
    expect_error(nb_send(mt_world, f, 0, -2), NB_EINVAL, "tag", "send tag");
    expect_error(nb_recv(mt_world, f, -1, 0), NB_EINVAL, "source", "recv src");
    expect_error(nb_barrier(NULL), NB_ENULL, "comm is NULL", "barrier NULL");
    expect_error(nb_work_wait(NULL), NB_ENULL, "work", "wait NULL");
    MT_CHECK(nb_allreduce_async(mt_world, NULL, NB_REDUCE_SUM) == NULL, "async with NULL t");
    nb_clear_error();
    nb_work_free(NULL);
    /* Message sizes that differ between sender and receiver (sent to itself). */
    nb_work *s = nb_send_async(mt_world, f, mt_rank, 3);
    expect_error(nb_recv(mt_world, nb_zeros((int64_t[]){12}, 1, NB_F32), mt_rank, 3), NB_ECOMM,
                 "expected 12", "recv of a shorter message");
    MT_OK(nb_work_wait(s));
    s = nb_send_async(mt_world, big, mt_rank, 4);
    expect_error(nb_recv(mt_world, f, mt_rank, 4), NB_ECOMM, "MPI error", "recv of a longer message");
    nb_work_free(s); /* completed or not, the handle goes */
    nb_scope_end();
    MT_OK(nb_barrier(mt_world));
    MT_END();
}
END_TEST

/* A recv nobody sends times out, naming the peer; the receive is cancelled. */
START_TEST(test_p2p_timeout) {
    double old = nb_comm_timeout(mt_world);
    nb_comm_set_timeout(mt_world, 0.3);
    nb_scope_begin();
    nb_tensor *t = nb_zeros((int64_t[]){100}, 1, NB_F32);
    double t0 = mt_now();
    nb_status st = nb_recv(mt_world, t, mt_rank, 999);
    double el = mt_now() - t0;
    MT_CHECK(st == NB_ETIMEOUT && strstr(nb_last_error(), "recv from rank") &&
                 strstr(nb_last_error(), "tag 999") && strstr(nb_last_error(), "itself"),
             "recv from itself: %s (%s)", nb_status_name(st), nb_last_error());
    MT_CHECK(el >= 0.29 && el < 5, "timed out after %.3f s", el);
    nb_clear_error();
    if (mt_size > 1) {
        /* Rank 0 waits for a message rank 1 never sends; rank 1 is alive (in a barrier). */
        if (mt_rank == 0) {
            st = nb_recv(mt_world, t, 1, 555);
            MT_CHECK(st == NB_ETIMEOUT && strstr(nb_last_error(), "rank 1 is alive"),
                     "recv from a live peer: %s (%s)", nb_status_name(st), nb_last_error());
            nb_clear_error();
        }
    }
    nb_scope_end();
    nb_comm_set_timeout(mt_world, 60);
    MT_OK(nb_barrier(mt_world));
    nb_comm_set_timeout(mt_world, old);
    MT_END();
}
END_TEST

/* One rank comes late to a collective: the others time out with a message naming it;
 * then it arrives, the operation completes everywhere, and the communicator works again.
 * With a small tensor (one round of recursive doubling, nb_work_wait), a mid-size one
 * (several rounds: the other ranks' abandoned rounds must go on) and a large one (worker
 * path, nb_work_test polling). */
static void late_rank_case(int64_t n, bool poll) {
    if (mt_size < 2) return;
    int late = mt_size - 1;
    nb_comm *c = nb_comm_split(mt_world, 0, mt_rank);
    MT_CHECK(c != NULL, "split: %s", nb_last_error());
    if (!c) return;
    nb_comm_set_timeout(c, 1.0);
    nb_scope_begin();
    nb_tensor *x = nb_full(&n, 1, NB_F32, mt_rank + 1);
    if (mt_rank != late) {
        double t0 = mt_now();
        nb_status st;
        if (poll) {
            nb_work *w = nb_allreduce_async(c, x, NB_REDUCE_SUM);
            int r;
            while ((r = nb_work_test(w)) == 0) usleep(1000);
            st = r < 0 ? (nb_status)r : NB_OK;
            nb_work_free(w);
        } else {
            st = nb_allreduce(c, x, NB_REDUCE_SUM);
        }
        double el = mt_now() - t0;
        char want[128];
        snprintf(want, sizeof want, "rank %d is alive but did not join collective #1 (it is "
                 "waiting in barrier #", late); /* the late rank waits in the world's barrier */
        MT_CHECK(st == NB_ETIMEOUT && strstr(nb_last_error(), want) &&
                     strstr(nb_last_error(), "on another communicator") &&
                     strstr(nb_last_error(), "allreduce (collective #1"),
                 "late rank (n=%lld): %s \"%s\"", (long long)n, nb_status_name(st), nb_last_error());
        MT_CHECK(el >= 0.99 && el < 6, "timed out after %.3f s", el);
        nb_clear_error();
    }
    MT_OK(nb_barrier(mt_world));
    if (mt_rank == late) {
        /* Its allreduce meets the others' timed-out one: the sum of every rank. */
        MT_OK(nb_allreduce(c, x, NB_REDUCE_SUM));
        double want = mt_size * (mt_size + 1) / 2.0;
        MT_CHECK(nb_get_f64(x, (int64_t[]){n - 1}) == want, "the late rank got %g, expected %g",
                 nb_get_f64(x, (int64_t[]){n - 1}), want);
    }
    /* Realigned: the next collective works everywhere. */
    nb_comm_set_timeout(c, 30);
    nb_tensor *y = nb_full((int64_t[]){5}, 1, NB_I32, 2);
    MT_OK(nb_allreduce(c, y, NB_REDUCE_SUM));
    MT_CHECK(nb_item_i64(nb_select(y, 0, 4)) == 2 * mt_size, "after the realignment: %lld",
             (long long)nb_item_i64(nb_select(y, 0, 4)));
    nb_scope_end();
    nb_comm_free(c);
}

START_TEST(test_late_rank_small) {
    late_rank_case(1000, false);
    MT_END();
}
END_TEST

START_TEST(test_late_rank_mid) {
    late_rank_case(70000, false);
    MT_END();
}
END_TEST

START_TEST(test_late_rank_large) {
    late_rank_case(1 << 20, true);
    MT_END();
}
END_TEST

Suite *mt_suite_failures(void) {
    Suite *s = suite_create("failures");
    TCase *tc = tcase_create("failures");
    tcase_add_test(tc, test_argument_errors);
    tcase_add_test(tc, test_p2p_timeout);
    tcase_add_test(tc, test_late_rank_small);
    tcase_add_test(tc, test_late_rank_mid);
    tcase_add_test(tc, test_late_rank_large);
    suite_add_tcase(s, tc);
    return s;
}

/* ---- a dead peer ---------------------------------------------------------------------------------
 * Rank 1 dies (SIGKILL, as a crash or an OOM kill would) after a first allreduce; every other
 * rank's next collectives fail within the timeout (3 s) with NB_ETIMEOUT naming rank 1 as
 * not answering. Needs 2+ ranks and `mpirun --enable-recovery` (otherwise mpirun ends the
 * whole job as soon as a rank dies, which is also not a hang). Plain ck_asserts here: there
 * is no agreement with a dead rank. */
START_TEST(test_dead_peer) {
    ck_assert_msg(mt_size >= 2, "the dead-peer case needs at least 2 ranks");
    nb_scope_begin();
    nb_tensor *small = nb_full((int64_t[]){1000}, 1, NB_F32, 1);
    nb_tensor *mid = nb_full((int64_t[]){70000}, 1, NB_F32, 1);
    nb_tensor *large = nb_full((int64_t[]){1 << 20}, 1, NB_F32, 1);
    ck_assert_msg(nb_allreduce(mt_world, small, NB_REDUCE_SUM) == NB_OK, "%s", nb_last_error());
    /* a data parallel model, wrapped while every rank is alive */
    nb_module *model = nb_linear_new(8, 4, NULL);
    nb_ddp *ddp = model ? nb_ddp_new(model, mt_world, NULL) : NULL;
    ck_assert_msg(ddp != NULL, "ddp_new: %s", nb_last_error());
    if (mt_rank == 1) {
        fflush(NULL);
        raise(SIGKILL);
    }
    nb_comm_set_timeout(mt_world, 3);
    nb_tensor *ts[3] = {small, mid, large};
    const char *names[3] = {"small", "mid-size", "large"};
    for (int k = 0; k < 3; k++) {
        double t0 = mt_now();
        nb_status st = nb_allreduce(mt_world, ts[k], NB_REDUCE_SUM);
        double el = mt_now() - t0;
        ck_assert_msg(st == NB_ETIMEOUT || st == NB_ECOMM, "%s allreduce after rank 1 died: %s",
                      names[k], nb_status_name(st));
        ck_assert_msg(strstr(nb_last_error(), "rank 1 did not answer") ||
                          strstr(nb_last_error(), "ranks 1,"),
                      "the message does not name rank 1: %s", nb_last_error());
        ck_assert_msg(el < 3 + 2 + 1, "took %.2f s (timeout 3 s)", el);
        if (mt_rank == 0 && k == 0) printf("dead peer: %s\n", nb_last_error());
        nb_clear_error();
    }
    /* Several collectives in flight (a backward's buckets), waited for one after another:
     * the first wait finds rank 1 gone; the others, started before, fail within what is left
     * of one timeout since their start - not one whole timeout each. */
    enum { NFLIGHT = 4 };
    nb_work *flight[NFLIGHT];
    double t0 = mt_now();
    for (int k = 0; k < NFLIGHT; k++) {
        flight[k] = nb_allreduce_async(mt_world, ts[k % 3], NB_REDUCE_SUM);
        ck_assert_msg(flight[k] != NULL, "allreduce_async %d: %s", k, nb_last_error());
    }
    for (int k = 0; k < NFLIGHT; k++) {
        nb_status st = nb_work_wait(flight[k]);
        ck_assert_msg(st == NB_ETIMEOUT || st == NB_ECOMM, "collective %d of %d in flight after "
                      "rank 1 died: %s", k + 1, NFLIGHT, nb_status_name(st));
        ck_assert_msg(strstr(nb_last_error(), "rank 1 did not answer") ||
                          strstr(nb_last_error(), "ranks 1,"),
                      "collective %d of %d in flight: the message does not name rank 1: %s", k + 1,
                      NFLIGHT, nb_last_error());
        if (mt_rank == 0 && k == 1) printf("dead peer, in flight: %s\n", nb_last_error());
        nb_clear_error();
    }
    double el = mt_now() - t0;
    ck_assert_msg(el < 3 + 2 + 1, "%d collectives in flight took %.2f s to fail (timeout 3 s)",
                  NFLIGHT, el);
    /* The same for receives in flight from the dead rank (a pipeline's micro-batches). */
    nb_tensor *rbuf[NFLIGHT];
    t0 = mt_now();
    for (int k = 0; k < NFLIGHT; k++) {
        rbuf[k] = nb_zeros((int64_t[]){64}, 1, NB_F32);
        flight[k] = nb_recv_async(mt_world, rbuf[k], 1, 40 + k);
        ck_assert_msg(flight[k] != NULL, "recv_async %d: %s", k, nb_last_error());
    }
    for (int k = 0; k < NFLIGHT; k++) {
        nb_status st = nb_work_wait(flight[k]);
        ck_assert_msg(st == NB_ETIMEOUT, "recv %d of %d in flight after rank 1 died: %s (%s)",
                      k + 1, NFLIGHT, nb_status_name(st), nb_last_error());
        ck_assert_msg(strstr(nb_last_error(), "rank 1 did not answer"),
                      "recv %d of %d in flight: the message does not name rank 1: %s", k + 1,
                      NFLIGHT, nb_last_error());
        if (mt_rank == 0 && k == 1) printf("dead peer, recv in flight: %s\n", nb_last_error());
        nb_clear_error();
    }
    el = mt_now() - t0;
    ck_assert_msg(el < 3 + 2 + 1, "%d receives in flight took %.2f s to fail (timeout 3 s)",
                  NFLIGHT, el);
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 0.1;
    /* A DDP step: the synchronisation at the end of backward fails within the timeout,
     * naming rank 1, and the optimizer refuses the gradients that were never averaged. */
    nb_optim *opt = nb_sgd_new(nb_parameters(model), &so);
    ck_assert_msg(opt != NULL, "%s", nb_last_error());
    nb_tensor *x = nb_full((int64_t[]){2, 8}, 2, NB_F32, 1);
    t0 = mt_now();
    nb_status st = nb_backward(nb_sum(nb_forward(model, x), NULL, 0, false));
    el = mt_now() - t0;
    ck_assert_msg(st == NB_ETIMEOUT || st == NB_ECOMM, "backward after rank 1 died: %s (%s)",
                  nb_status_name(st), nb_last_error());
    ck_assert_msg(strstr(nb_last_error(), "ddp: gradient allreduce failed") &&
                      (strstr(nb_last_error(), "rank 1 did not answer") ||
                       strstr(nb_last_error(), "ranks 1,")),
                  "backward's message: %s", nb_last_error());
    ck_assert_msg(el < 3 + 2 + 1, "backward took %.2f s (timeout 3 s)", el);
    if (mt_rank == 0) printf("dead peer, ddp: %s\n", nb_last_error());
    st = nb_step(opt);
    ck_assert_msg(st == NB_ESTATE && strstr(nb_last_error(), "was not averaged over the ranks"),
                  "step after a failed synchronisation: %s (%s)", nb_status_name(st),
                  nb_last_error());
    nb_clear_error();
    nb_optim_free(opt);
    nb_ddp_free(ddp);
    nb_module_free(model);
    nb_scope_end();
}
END_TEST

Suite *mt_suite_dead_peer(void) {
    Suite *s = suite_create("dead_peer");
    TCase *tc = tcase_create("dead_peer");
    tcase_add_test(tc, test_dead_peer);
    suite_add_tcase(s, tc);
    return s;
}
