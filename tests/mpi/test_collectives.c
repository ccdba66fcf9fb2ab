/* test_collectives.c - every collective x every dtype x sizes 0, 1, 7, 1001 and 1M (the
 * large one for fewer dtypes where the output grows with the number of ranks), each
 * compared with a reference computed from what every rank contributes (mt_value), plus
 * non-contiguous and aliased (in-place) tensors. Blocking forms; the asynchronous ones are
 * in test_comm.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mpi_test.h"

static const nb_reduce_op ops[] = {NB_REDUCE_SUM, NB_REDUCE_AVG, NB_REDUCE_MAX, NB_REDUCE_MIN};
static const char *op_names[] = {"sum", "avg", "max", "min"};

/* A 1-D tensor of n elements: element i = mt_value(r, first + i, dt, salt). */
static nb_tensor *make_at(int r, int64_t first, int64_t n, nb_dtype dt, int salt) {
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) v[i] = mt_value(r, first + i, dt, salt);
    nb_tensor *f = nb_from_buffer(v, &n, 1, NB_F64);
    free(v);
    return nb_to_dtype(f, dt);
}

static double *alloc_ref(int64_t n) { return malloc(sizeof(double) * (size_t)(n > 0 ? n : 1)); }

/* An AVG of an integer tensor is refused the same way on every rank (before any message). */
static bool avg_refused(nb_status st, nb_dtype dt, const char *what) {
    if (nb_dtype_is_float(dt)) return false;
    MT_CHECK(st == NB_EDTYPE && strstr(nb_last_error(), "NB_REDUCE_AVG"),
             "%s avg of %s: %s (%s)", what, nb_dtype_name(dt), nb_status_name(st), nb_last_error());
    nb_clear_error();
    return true;
}

START_TEST(test_allreduce) {
    for (int d = 0; d < NB_DTYPE_COUNT; d++)
        for (int s = 0; s < MT_NSIZES; s++)
            for (int o = 0; o < 4; o++) {
                nb_dtype dt = mt_dtypes[d];
                int64_t n = mt_sizes[s];
                nb_scope_begin();
                nb_tensor *t = mt_make(mt_rank, n, dt, o + s);
                nb_status st = nb_allreduce(mt_world, t, ops[o]);
                char what[64];
                snprintf(what, sizeof what, "allreduce %s", op_names[o]);
                if (!(ops[o] == NB_REDUCE_AVG && avg_refused(st, dt, what))) {
                    MT_CHECK(st == NB_OK, "%s %s n=%lld: %s", what, nb_dtype_name(dt),
                             (long long)n, nb_last_error());
                    double *ref = alloc_ref(n);
                    for (int64_t i = 0; i < n; i++)
                        ref[i] = mt_reduce_ref(ops[o], i, dt, o + s, mt_size);
                    mt_expect(t, ref, n, what);
                    free(ref);
                }
                nb_scope_end();
            }
    MT_END();
}
END_TEST

START_TEST(test_broadcast) {
    int roots[2] = {0, mt_size - 1};
    for (int d = 0; d < NB_DTYPE_COUNT; d++)
        for (int s = 0; s < MT_NSIZES; s++)
            for (int k = 0; k < 2; k++) {
                nb_dtype dt = mt_dtypes[d];
                int64_t n = mt_sizes[s];
                nb_scope_begin();
                nb_tensor *t = mt_make(mt_rank, n, dt, s + k);
                MT_OK(nb_broadcast(mt_world, t, roots[k]));
                double *ref = alloc_ref(n);
                for (int64_t i = 0; i < n; i++) ref[i] = mt_value(roots[k], i, dt, s + k);
                mt_expect(t, ref, n, roots[k] ? "broadcast from the last rank" : "broadcast");
                free(ref);
                nb_scope_end();
            }
    MT_END();
}
END_TEST

START_TEST(test_reduce) {
    int root = mt_size - 1;
    for (int d = 0; d < NB_DTYPE_COUNT; d++)
        for (int s = 0; s < MT_NSIZES; s++)
            for (int o = 0; o < 4; o++) {
                nb_dtype dt = mt_dtypes[d];
                int64_t n = mt_sizes[s];
                nb_scope_begin();
                nb_tensor *t = mt_make(mt_rank, n, dt, o);
                nb_status st = nb_reduce(mt_world, t, ops[o], root);
                if (!(ops[o] == NB_REDUCE_AVG && avg_refused(st, dt, "reduce"))) {
                    MT_CHECK(st == NB_OK, "reduce %s: %s", op_names[o], nb_last_error());
                    double *ref = alloc_ref(n);
                    for (int64_t i = 0; i < n; i++)
                        ref[i] = mt_rank == root ? mt_reduce_ref(ops[o], i, dt, o, mt_size)
                                                 : mt_value(mt_rank, i, dt, o); /* unchanged */
                    mt_expect(t, ref, n, mt_rank == root ? "reduce (root)" : "reduce (non-root)");
                    free(ref);
                }
                nb_scope_end();
            }
    MT_END();
}
END_TEST

/* The large size only for a few dtypes: the output is size x 1M elements. */
static bool big_ok(int s, nb_dtype dt) { return s < MT_NSIZES - 1 || dt == NB_F32 || dt == NB_BF16; }

START_TEST(test_allgather) {
    for (int d = 0; d < NB_DTYPE_COUNT; d++)
        for (int s = 0; s < MT_NSIZES; s++) {
            nb_dtype dt = mt_dtypes[d];
            if (!big_ok(s, dt)) continue;
            int64_t k = mt_sizes[s], n = k * mt_size;
            nb_scope_begin();
            /* Equal blocks: out = [rank 0's in, rank 1's in, ...]. */
            nb_tensor *in = mt_make(mt_rank, k, dt, 1);
            nb_tensor *out = nb_zeros(&n, 1, dt);
            MT_OK(nb_allgather(mt_world, out, in));
            double *ref = alloc_ref(n);
            for (int64_t j = 0; j < n; j++) ref[j] = mt_value((int)(j / (k ? k : 1)), j % (k ? k : 1), dt, 1);
            mt_expect(out, ref, n, "allgather");
            /* Uneven chunks (nb_comm_chunk) of a total of k elements: the inverse of
             * reduce_scatter. Element j comes from the rank whose chunk holds j. */
            int64_t b, e;
            nb_comm_chunk(k, mt_size, mt_rank, &b, &e);
            nb_tensor *part = make_at(mt_rank, b, e - b, dt, 2);
            nb_tensor *whole = nb_zeros(&k, 1, dt);
            MT_OK(nb_allgather(mt_world, whole, part));
            for (int64_t j = 0; j < k; j++) {
                int owner = 0;
                for (int r = 0; r < mt_size; r++) {
                    int64_t rb, re;
                    nb_comm_chunk(k, mt_size, r, &rb, &re);
                    if (j >= rb && j < re) owner = r;
                }
                ref[j] = mt_value(owner, j, dt, 2);
            }
            mt_expect(whole, ref, k, "allgather (chunks)");
            free(ref);
            nb_scope_end();
        }
    MT_END();
}
END_TEST

START_TEST(test_reduce_scatter) {
    for (int d = 0; d < NB_DTYPE_COUNT; d++)
        for (int s = 0; s < MT_NSIZES; s++)
            for (int o = 0; o < 4; o++) {
                nb_dtype dt = mt_dtypes[d];
                int64_t n = mt_sizes[s], b, e;
                nb_comm_chunk(n, mt_size, mt_rank, &b, &e);
                nb_scope_begin();
                nb_tensor *in = mt_make(mt_rank, n, dt, o + 3);
                int64_t m = e - b;
                nb_tensor *out = nb_zeros(&m, 1, dt);
                nb_status st = nb_reduce_scatter(mt_world, out, in, ops[o]);
                if (!(ops[o] == NB_REDUCE_AVG && avg_refused(st, dt, "reduce_scatter"))) {
                    MT_CHECK(st == NB_OK, "reduce_scatter %s n=%lld: %s", op_names[o],
                             (long long)n, nb_last_error());
                    double *ref = alloc_ref(m);
                    for (int64_t i = 0; i < m; i++)
                        ref[i] = mt_reduce_ref(ops[o], b + i, dt, o + 3, mt_size);
                    mt_expect(out, ref, m, "reduce_scatter");
                    free(ref);
                }
                nb_scope_end();
            }
    MT_END();
}
END_TEST

START_TEST(test_all_to_all) {
    for (int d = 0; d < NB_DTYPE_COUNT; d++)
        for (int s = 0; s < MT_NSIZES; s++) {
            nb_dtype dt = mt_dtypes[d];
            if (!big_ok(s, dt)) continue;
            int64_t k = mt_sizes[s] / (s == MT_NSIZES - 1 ? mt_size : 1), n = k * mt_size;
            nb_scope_begin();
            nb_tensor *in = mt_make(mt_rank, n, dt, 4);
            nb_tensor *out = nb_zeros(&n, 1, dt);
            MT_OK(nb_all_to_all(mt_world, out, in));
            /* Block i of out is block `rank` of rank i's in. */
            double *ref = alloc_ref(n);
            for (int64_t j = 0; j < n; j++) {
                int from = (int)(j / k);
                ref[j] = mt_value(from, mt_rank * k + j % k, dt, 4);
            }
            mt_expect(out, ref, n, "all_to_all");
            free(ref);
            nb_scope_end();
        }
    MT_END();
}
END_TEST

START_TEST(test_barrier) {
    /* Rank 0 arrives 0.2 s late: nobody may leave the barrier before it arrives. */
    MT_OK(nb_barrier(mt_world));
    double t0 = 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    t0 = ts.tv_sec + 1e-9 * ts.tv_nsec;
    if (mt_rank == 0) usleep(200000);
    MT_OK(nb_barrier(mt_world));
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double waited = ts.tv_sec + 1e-9 * ts.tv_nsec - t0;
    MT_CHECK(waited > 0.15, "left the barrier after %.3f s, before rank 0 arrived", waited);
    MT_END();
}
END_TEST

/* Point to point: a ring (each rank sends to the next, receives from the previous), with
 * the asynchronous forms so that no order of blocking calls matters. */
START_TEST(test_send_recv_ring) {
    int next = (mt_rank + 1) % mt_size, prev = (mt_rank + mt_size - 1) % mt_size;
    for (int d = 0; d < NB_DTYPE_COUNT; d++)
        for (int s = 0; s < MT_NSIZES; s++) {
            nb_dtype dt = mt_dtypes[d];
            int64_t n = mt_sizes[s];
            nb_scope_begin();
            nb_tensor *mine = mt_make(mt_rank, n, dt, 5);
            nb_tensor *got = nb_zeros(&n, 1, dt);
            nb_work *r = nb_recv_async(mt_world, got, prev, 100 + d);
            nb_work *w = nb_send_async(mt_world, mine, next, 100 + d);
            MT_OK(nb_work_wait(w));
            MT_OK(nb_work_wait(r));
            double *ref = alloc_ref(n);
            for (int64_t i = 0; i < n; i++) ref[i] = mt_value(prev, i, dt, 5);
            mt_expect(got, ref, n, "recv in a ring");
            free(ref);
            nb_scope_end();
        }
    /* Blocking forms between pairs (0 -> 1, 2 -> 3, ...): an odd last rank sits out. */
    nb_scope_begin();
    int64_t n = 1001;
    if (mt_rank % 2 == 0 && mt_rank + 1 < mt_size) {
        MT_OK(nb_send(mt_world, mt_make(mt_rank, n, NB_F64, 6), mt_rank + 1, 7));
    } else if (mt_rank % 2 == 1) {
        nb_tensor *t = nb_zeros(&n, 1, NB_F64);
        MT_OK(nb_recv(mt_world, t, mt_rank - 1, 7));
        double *ref = alloc_ref(n);
        for (int64_t i = 0; i < n; i++) ref[i] = mt_value(mt_rank - 1, i, NB_F64, 6);
        mt_expect(t, ref, n, "blocking recv");
        free(ref);
    }
    nb_scope_end();
    MT_END();
}
END_TEST

/* Non-contiguous tensors are staged: the results land in the caller's view (and only
 * there), whatever its strides. */
START_TEST(test_noncontiguous) {
    nb_scope_begin();
    const int64_t R = 37, C = 29, n = R * C;
    /* allreduce of a transposed view writes through to the base storage. */
    nb_tensor *base = mt_make(mt_rank, n, NB_F32, 7);
    nb_tensor *tv = nb_transpose(nb_view(base, (int64_t[]){R, C}, 2), 0, 1);
    MT_CHECK(!nb_is_contiguous(tv), "the view should not be contiguous");
    MT_OK(nb_allreduce(mt_world, tv, NB_REDUCE_SUM));
    double *ref = alloc_ref(4 * n);
    for (int64_t i = 0; i < n; i++) ref[i] = mt_reduce_ref(NB_REDUCE_SUM, i, NB_F32, 7, mt_size);
    mt_expect(base, ref, n, "allreduce of a transposed view (base)");
    /* broadcast into every other element. */
    nb_tensor *b2 = nb_zeros((int64_t[]){2 * n}, 1, NB_BF16);
    nb_tensor *even = nb_slice(b2, 0, 0, 2 * n, 2);
    if (mt_rank == 0) nb_copy_(even, mt_make(0, n, NB_BF16, 8));
    MT_OK(nb_broadcast(mt_world, even, 0));
    for (int64_t i = 0; i < 2 * n; i++) ref[i] = i % 2 ? 0 : mt_value(0, i / 2, NB_BF16, 8);
    mt_expect(b2, ref, 2 * n, "broadcast into a strided view");
    /* allgather into a strided view, from a strided input. */
    int64_t k = 5, m = k * mt_size;
    nb_tensor *ob = nb_full((int64_t[]){2 * m}, 1, NB_I64, -1);
    nb_tensor *ov = nb_slice(ob, 0, 1, 2 * m, 2);
    nb_tensor *ib = mt_make(mt_rank, 3 * k, NB_I64, 9);
    MT_OK(nb_allgather(mt_world, ov, nb_slice(ib, 0, 0, 3 * k, 3)));
    for (int64_t j = 0; j < 2 * m; j++)
        ref[j] = j % 2 == 0 ? -1 : mt_value((int)((j / 2) / k), 3 * ((j / 2) % k), NB_I64, 9);
    mt_expect(ob, ref, 2 * m, "allgather with strided in and out");
    /* reduce_scatter of a strided input. */
    int64_t b, e;
    nb_comm_chunk(n, mt_size, mt_rank, &b, &e);
    nb_tensor *rin = nb_transpose(nb_view(mt_make(mt_rank, n, NB_F64, 10), (int64_t[]){R, C}, 2), 0, 1);
    nb_tensor *rout = nb_zeros((int64_t[]){e - b}, 1, NB_F64);
    MT_OK(nb_reduce_scatter(mt_world, rout, rin, NB_REDUCE_MAX));
    for (int64_t i = b; i < e; i++) { /* logical element i of the transposed view */
        int64_t c = i / R, r = i % R;
        ref[i - b] = mt_reduce_ref(NB_REDUCE_MAX, r * C + c, NB_F64, 10, mt_size);
    }
    mt_expect(rout, ref, e - b, "reduce_scatter of a transposed view");
    free(ref);
    nb_scope_end();
    MT_END();
}
END_TEST

/* Aliasing: allgather with in already at its place in out (MPI_IN_PLACE), reduce_scatter
 * into a view of its own input (ZeRO's layout; the input is copied first). */
START_TEST(test_in_place) {
    nb_scope_begin();
    int64_t k = 1001, n = k * mt_size;
    nb_tensor *out = nb_zeros(&n, 1, NB_F32);
    nb_copy_(nb_narrow(out, 0, mt_rank * k, k), mt_make(mt_rank, k, NB_F32, 11));
    MT_OK(nb_allgather(mt_world, out, nb_narrow(out, 0, mt_rank * k, k)));
    double *ref = alloc_ref(n + 1003);
    for (int64_t j = 0; j < n; j++) ref[j] = mt_value((int)(j / k), j % k, NB_F32, 11);
    mt_expect(out, ref, n, "allgather in place");
    int64_t total = 1003, b, e;
    nb_comm_chunk(total, mt_size, mt_rank, &b, &e);
    nb_tensor *buf = mt_make(mt_rank, total, NB_F32, 12);
    MT_OK(nb_reduce_scatter(mt_world, nb_narrow(buf, 0, b, e - b), buf, NB_REDUCE_SUM));
    for (int64_t i = 0; i < total; i++)
        ref[i] = i >= b && i < e ? mt_reduce_ref(NB_REDUCE_SUM, i, NB_F32, 12, mt_size)
                                 : mt_value(mt_rank, i, NB_F32, 12);
    mt_expect(buf, ref, total, "reduce_scatter into its own input's chunk");
    nb_comm_chunk(total, mt_size, mt_rank, &b, &e);
    nb_tensor *whole = mt_make(mt_rank, total, NB_U8, 13);
    MT_OK(nb_allgather(mt_world, whole, nb_narrow(whole, 0, b, e - b)));
    for (int64_t j = 0; j < total; j++) {
        int owner = 0;
        for (int r = 0; r < mt_size; r++) {
            int64_t rb, re;
            nb_comm_chunk(total, mt_size, r, &rb, &re);
            if (j >= rb && j < re) owner = r;
        }
        ref[j] = mt_value(owner, j, NB_U8, 13);
    }
    mt_expect(whole, ref, total, "allgather of chunks in place");
    free(ref);
    nb_scope_end();
    MT_END();
}
END_TEST

Suite *mt_suite_collectives(void) {
    Suite *s = suite_create("collectives");
    TCase *tc = tcase_create("collectives");
    tcase_add_test(tc, test_allreduce);
    tcase_add_test(tc, test_broadcast);
    tcase_add_test(tc, test_reduce);
    tcase_add_test(tc, test_allgather);
    tcase_add_test(tc, test_reduce_scatter);
    tcase_add_test(tc, test_all_to_all);
    tcase_add_test(tc, test_barrier);
    tcase_add_test(tc, test_send_recv_ring);
    tcase_add_test(tc, test_noncontiguous);
    tcase_add_test(tc, test_in_place);
    suite_add_tcase(s, tc);
    return s;
}
