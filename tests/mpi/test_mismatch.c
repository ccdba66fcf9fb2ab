/* test_mismatch.c - ranks that disagree on a collective (issue 31, item 4): different element
 * counts, dtypes, reduce ops, roots and operations, small (nabla's schedules) and large (MPI's
 * collectives on the worker) and one of each; every rank that waits gets NB_ECOMM within
 * seconds with a message naming both sides ("allreduce of 10 f32 (sum) on rank 0 met
 * allreduce of 20 f32 (sum) on rank 1"), never a success with wrong data; a rank whose part
 * was done at once (a broadcast's root) fails its next collective on that communicator; and
 * under NB_COMM_DEBUG=detail every rank fails the mismatched collective itself. Each case runs
 * on a communicator of its own (a disagreement leaves it out of step). Needs 2+ ranks. */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mpi_test.h"
#include "parallel/parallel_impl.h"

static nb_comm *fresh(void) {
    nb_comm *c = nb_comm_split(mt_world, 0, mt_rank);
    MT_CHECK(c != NULL, "split: %s", nb_last_error());
    if (c) nb_comm_set_timeout(c, 60); /* detection must come long before */
    return c;
}

/* st is NB_ECOMM within 15 s, and the message names both sides: "<mine> ... met <theirs>",
 * or the other way round when this rank learned it from the rank that found it (the
 * communicator is then "out of step", with that rank's description). */
static void expect_met(nb_status st, double el, const char *mine, const char *theirs,
                       const char *what) {
    const char *m = nb_last_error();
    const char *met = strstr(m, " met ");
    bool ours = met && strstr(m, mine) && strstr(m, mine) < met && strstr(met, theirs);
    bool told = met && strstr(m, "out of step") && strstr(m, theirs) && strstr(m, theirs) < met &&
                strstr(met, mine);
    MT_CHECK(st == NB_ECOMM && (ours || told),
             "%s: %s \"%s\", expected NB_ECOMM with \"%s ... met %s\"", what, nb_status_name(st),
             m, mine, theirs);
    MT_CHECK(el < 15, "%s: found after %.1f s", what, el);
    nb_clear_error();
}

/* The communicator refuses its next collective, naming the disagreement. */
static void expect_out_of_step(nb_comm *c, const char *text, const char *what) {
    nb_scope_begin();
    nb_status st = nb_allreduce(c, nb_ones((int64_t[]){3}, 1, NB_F32), NB_REDUCE_SUM);
    MT_CHECK(st == NB_ECOMM && strstr(nb_last_error(), "out of step") &&
                 strstr(nb_last_error(), text),
             "%s: the next collective gave %s \"%s\"", what, nb_status_name(st), nb_last_error());
    nb_clear_error();
    nb_scope_end();
}

/* Rank 0 reduces n0 elements of dtype d0 with op0, every other rank n1 of d1 with op1. */
static void allreduce_case(int64_t n0, nb_dtype d0, nb_reduce_op op0, int64_t n1, nb_dtype d1,
                           nb_reduce_op op1, bool poll, const char *s0, const char *s1) {
    if (mt_size < 2) return;
    nb_comm *c = fresh();
    if (!c) return;
    nb_scope_begin();
    bool zero = mt_rank == 0;
    int64_t n = zero ? n0 : n1;
    nb_tensor *x = nb_full(&n, 1, zero ? d0 : d1, 1);
    double t0 = mt_now();
    nb_status st;
    if (poll) {
        nb_work *w = nb_allreduce_async(c, x, zero ? op0 : op1);
        int r;
        while ((r = nb_work_test(w)) == 0) usleep(1000);
        st = r < 0 ? (nb_status)r : NB_OK;
        nb_work_free(w);
    } else {
        st = nb_allreduce(c, x, zero ? op0 : op1);
    }
    char what[96];
    snprintf(what, sizeof what, "%s against %s", s0, s1);
    expect_met(st, mt_now() - t0, zero ? s0 : s1, zero ? s1 : s0, what);
    nb_scope_end();
    expect_out_of_step(c, " met ", what);
    nb_comm_free(c);
}

START_TEST(test_counts_differ) {
    allreduce_case(10, NB_F32, NB_REDUCE_SUM, 20, NB_F32, NB_REDUCE_SUM, false,
                   "allreduce of 10 f32 (sum)", "allreduce of 20 f32 (sum)");
    MT_END();
}
END_TEST

START_TEST(test_dtypes_differ) { /* the same bytes: the old schedules exchanged them */
    allreduce_case(10, NB_F32, NB_REDUCE_SUM, 10, NB_I32, NB_REDUCE_SUM, false,
                   "allreduce of 10 f32 (sum)", "allreduce of 10 i32 (sum)");
    MT_END();
}
END_TEST

START_TEST(test_ops_differ) { /* nb_work_test polling */
    allreduce_case(5000, NB_F32, NB_REDUCE_SUM, 5000, NB_F32, NB_REDUCE_MAX, true,
                   "allreduce of 5000 f32 (sum)", "allreduce of 5000 f32 (max)");
    MT_END();
}
END_TEST

START_TEST(test_large_counts_differ) { /* both on the worker, MPI's allreduce */
    allreduce_case(1 << 20, NB_F32, NB_REDUCE_SUM, (1 << 20) + 1, NB_F32, NB_REDUCE_SUM, false,
                   "allreduce of 1048576 f32 (sum)", "allreduce of 1048577 f32 (sum)");
    MT_END();
}
END_TEST

START_TEST(test_large_against_small) {
    allreduce_case(1 << 20, NB_F32, NB_REDUCE_SUM, 10, NB_F32, NB_REDUCE_SUM, false,
                   "allreduce of 1048576 f32 (sum)", "allreduce of 10 f32 (sum)");
    MT_END();
}
END_TEST

/* Rank 0 broadcasts, the others allreduce: the root's part is done at once (its sends go
 * out), so it may succeed; the others fail naming it, and its next collective on the
 * communicator fails. */
START_TEST(test_broadcast_against_allreduce) {
    if (mt_size < 2) {
        MT_END();
        return;
    }
    nb_comm *c = fresh();
    if (c) {
        nb_scope_begin();
        nb_tensor *x = nb_full((int64_t[]){10}, 1, NB_F32, mt_rank + 1);
        double t0 = mt_now();
        if (mt_rank == 0) {
            nb_status st = nb_broadcast(c, x, 0);
            MT_CHECK(st == NB_OK || st == NB_ECOMM, "the root: %s", nb_last_error());
            nb_clear_error();
        } else {
            nb_status st = nb_allreduce(c, x, NB_REDUCE_SUM);
            expect_met(st, mt_now() - t0, "allreduce of 10 f32 (sum)", "broadcast of 10 f32 from rank 0",
                       "allreduce against broadcast");
        }
        nb_scope_end();
        MT_OK(nb_barrier(mt_world)); /* the others have failed: the root knows by now */
        expect_out_of_step(c, "broadcast of 10 f32 from rank 0", "the broadcast's root");
        nb_comm_free(c);
    }
    MT_END();
}
END_TEST

/* Roots that differ, and a barrier against an allgather. */
START_TEST(test_roots_and_kinds_differ) {
    if (mt_size < 2) {
        MT_END();
        return;
    }
    nb_comm *c = fresh();
    if (c) {
        nb_scope_begin();
        nb_tensor *x = nb_full((int64_t[]){7}, 1, NB_F64, 1);
        int root = mt_rank == 0 ? 0 : 1;
        double t0 = mt_now();
        nb_status st = nb_reduce(c, x, NB_REDUCE_SUM, root);
        if (mt_rank == 0 || mt_rank == 1) /* rank 1 is the other root: it waits */
            expect_met(st, mt_now() - t0, mt_rank == 0 ? "to rank 0" : "to rank 1",
                       mt_rank == 0 ? "to rank 1" : "to rank 0", "reduce roots");
        nb_clear_error();
        nb_scope_end();
        nb_comm_free(c);
    }
    MT_OK(nb_barrier(mt_world));
    c = fresh();
    if (c) {
        nb_scope_begin();
        double t0 = mt_now();
        nb_status st;
        if (mt_rank == 0) {
            st = nb_barrier(c);
        } else {
            nb_tensor *out = nb_zeros((int64_t[]){2 * mt_size}, 1, NB_I32);
            st = nb_allgather(c, out, nb_ones((int64_t[]){2}, 1, NB_I32));
        }
        char gather[64];
        snprintf(gather, sizeof gather, "allgather of %d i32", 2 * mt_size);
        expect_met(st, mt_now() - t0, mt_rank == 0 ? "barrier" : gather,
                   mt_rank == 0 ? gather : "barrier on rank 0", "barrier against allgather");
        nb_scope_end();
        nb_comm_free(c);
    }
    MT_END();
}
END_TEST

/* Ranks that agree are not disturbed by the checks: a slow rank (1.5 s late, several checks)
 * still gets the right result. */
START_TEST(test_slow_rank_is_no_mismatch) {
    nb_comm *c = fresh();
    if (c) {
        nb_scope_begin();
        if (mt_rank == mt_size - 1) usleep(1500000);
        nb_tensor *x = nb_full((int64_t[]){100}, 1, NB_F32, 1);
        MT_OK(nb_allreduce(c, x, NB_REDUCE_SUM));
        MT_CHECK(nb_get_f64(x, (int64_t[]){99}) == mt_size, "sum %g",
                 nb_get_f64(x, (int64_t[]){99}));
        nb_tensor *big = nb_full((int64_t[]){1 << 20}, 1, NB_F32, 1);
        if (mt_rank == 0) usleep(1000000);
        MT_OK(nb_allreduce(c, big, NB_REDUCE_SUM));
        MT_CHECK(nb_get_f64(big, (int64_t[]){12345}) == mt_size, "large sum %g",
                 nb_get_f64(big, (int64_t[]){12345}));
        nb_scope_end();
        nb_comm_free(c);
    }
    MT_END();
}
END_TEST

/* NB_COMM_DEBUG=detail: every rank, the broadcast's root too, fails the collective itself. */
START_TEST(test_debug_detail) {
    if (mt_size < 2) {
        MT_END();
        return;
    }
    nb__comm_debug_force(1);
    nb_comm *c = fresh();
    if (c) {
        nb_scope_begin();
        nb_tensor *x = nb_full((int64_t[]){10}, 1, NB_F32, 1);
        MT_OK(nb_allreduce(c, x, NB_REDUCE_SUM)); /* agreeing ranks pass */
        double t0 = mt_now();
        nb_status st = mt_rank == 0 ? nb_broadcast(c, x, 0) : nb_allreduce(c, x, NB_REDUCE_SUM);
        expect_met(st, mt_now() - t0,
                   mt_rank == 0 ? "broadcast of 10 f32 from rank 0" : "allreduce of 10 f32 (sum)",
                   mt_rank == 0 ? "allreduce of 10 f32 (sum)" : "broadcast of 10 f32 from rank 0",
                   "NB_COMM_DEBUG=detail");
        nb_scope_end();
        nb_comm_free(c);
    }
    nb__comm_debug_force(0);
    MT_END();
}
END_TEST

Suite *mt_suite_mismatch(void) {
    Suite *s = suite_create("mismatch");
    TCase *tc = tcase_create("mismatch");
    tcase_add_test(tc, test_counts_differ);
    tcase_add_test(tc, test_dtypes_differ);
    tcase_add_test(tc, test_ops_differ);
    tcase_add_test(tc, test_large_counts_differ);
    tcase_add_test(tc, test_large_against_small);
    tcase_add_test(tc, test_broadcast_against_allreduce);
    tcase_add_test(tc, test_roots_and_kinds_differ);
    tcase_add_test(tc, test_slow_rank_is_no_mismatch);
    tcase_add_test(tc, test_debug_detail);
    suite_add_tcase(s, tc);
    return s;
}
