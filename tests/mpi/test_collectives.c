/* test_collectives.c - every collective x every dtype x sizes 0, 1, 7, 1001 and 1M (the
 * large one for fewer dtypes where the output grows with the number of ranks), each
 * compared with a reference computed from what every rank contributes (mt_value), plus
 * non-contiguous and aliased (in-place) tensors. Then the MPI backend's own schedules for
 * small collectives (comm_mpi_small.c) at the sizes where they change algorithm, on the
 * world and on a 3-rank communicator (not a power of two): results that are bit for bit
 * the same on every rank, NaN propagation, collectives waited in different orders on
 * different ranks, and progress while the caller does not poll. Blocking forms except
 * there; the other asynchronous cases are in test_comm.c. */
#include <math.h>
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

/* ---- the small-collective schedules ---------------------------------------------------------- */
/* Sizes around the schedule changes: fewer elements than ranks, recursive doubling in pieces
 * (up to 8 KiB), Rabenseifner with pieced and whole messages, the worker above 2 MiB. */
static const int64_t sched_sizes[] = {1, 3, 1000, 2048, 2049, 3000, 70000, 300000, 600000};
#define N_SCHED (int)(sizeof sched_sizes / sizeof sched_sizes[0])

/* Fractional values, so that sums round differently in different orders (the ranks must
 * still agree bit for bit). */
static double frac_value(int r, int64_t i, nb_dtype dt) {
    return mt_round((double)((r * 7919 + i * 104729) % 1000) / 37.0 - 13.0, dt);
}

/* An FNV-1a hash of t's bytes. */
static int64_t hash_of(const nb_tensor *t) {
    const unsigned char *p = nb_data(t);
    uint64_t h = 1469598103934665603ull;
    size_t n = (size_t)nb_numel(t) * nb_dtype_size(nb_tensor_dtype(t));
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return (int64_t)(h >> 1);
}

/* Every rank of c holds the same bytes in t. */
static void expect_identical(nb_comm *c, const nb_tensor *t, const char *what) {
    nb_scope_begin();
    int64_t h = hash_of(t);
    nb_tensor *hh = nb_zeros((int64_t[]){2}, 1, NB_I64);
    int64_t *p = nb_data(hh);
    p[0] = h;
    p[1] = -h;
    MT_OK(nb_allreduce(c, hh, NB_REDUCE_MAX));
    MT_CHECK(p[0] == h && -p[1] == h, "%s (%s, %lld elements): the ranks' results differ", what,
             nb_dtype_name(nb_tensor_dtype(t)), (long long)nb_numel(t));
    nb_scope_end();
}

/* t == ref within the rounding of dt, measured on mag (the sum of the magnitudes that went
 * into each element: sums of fractional values may cancel). */
static void expect_close(const nb_tensor *t, const double *ref, const double *mag, int64_t n,
                         int size, const char *what) {
    nb_dtype dt = nb_tensor_dtype(t);
    double eps = dt == NB_F64 ? 1e-15 : dt == NB_F32 ? 2e-7 : 8e-3;
    double *got = alloc_ref(n);
    MT_CHECK(nb_read(t, got, n, NB_F64) == NB_OK, "%s: cannot read the result", what);
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(got[i] - ref[i]) <= eps * size * (mag[i] + 1))) {
            MT_CHECK(false, "%s (%s, %lld elements): [%lld] = %.9g, expected %.9g", what,
                     nb_dtype_name(dt), (long long)n, (long long)i, got[i], ref[i]);
            break;
        }
    free(got);
}

static void allreduce_schedules(nb_comm *c) {
    static const nb_dtype dts[] = {NB_F32, NB_F64, NB_BF16};
    int rank = nb_comm_rank(c), size = nb_comm_size(c);
    for (int si = 0; si < N_SCHED; si++)
        for (int d = 0; d < 3; d++)
            for (int o = 0; o < 4; o++) {
                int64_t n = sched_sizes[si];
                nb_dtype dt = dts[d];
                if (n > 70000 && dt != NB_F32) continue;
                nb_scope_begin();
                double *v = alloc_ref(n), *ref = alloc_ref(n), *mag = alloc_ref(n);
                for (int64_t i = 0; i < n; i++) {
                    v[i] = frac_value(rank, i, dt);
                    double acc = frac_value(0, i, dt);
                    mag[i] = fabs(acc);
                    for (int r = 1; r < size; r++) {
                        double x = frac_value(r, i, dt);
                        acc = ops[o] == NB_REDUCE_MAX ? fmax(acc, x)
                              : ops[o] == NB_REDUCE_MIN ? fmin(acc, x) : acc + x;
                        mag[i] += fabs(x);
                    }
                    ref[i] = ops[o] == NB_REDUCE_AVG ? acc / size : acc;
                }
                nb_tensor *t = nb_to_dtype(nb_from_buffer(v, &n, 1, NB_F64), dt);
                char what[96];
                snprintf(what, sizeof what, "allreduce %s on %d ranks", op_names[o], size);
                MT_OK(nb_allreduce(c, t, ops[o]));
                expect_close(t, ref, mag, n, size, what);
                expect_identical(c, t, what);
                free(v);
                free(ref);
                free(mag);
                nb_scope_end();
            }
}

/* The other collectives at the sizes where their messages go in pieces or whole. */
static void other_schedules(nb_comm *c) {
    int rank = nb_comm_rank(c), size = nb_comm_size(c), root = size - 1;
    static const int64_t ns[] = {3000, 70000};
    for (int k = 0; k < 2; k++)
        for (int d = 0; d < 2; d++) {
            int64_t n = ns[k], b, e;
            nb_dtype dt = d ? NB_F64 : NB_F32;
            nb_scope_begin();
            double *ref = alloc_ref(n * size);
            nb_tensor *t = mt_make(rank, n, dt, 60);
            MT_OK(nb_broadcast(c, t, root));
            for (int64_t i = 0; i < n; i++) ref[i] = mt_value(root, i, dt, 60);
            mt_expect(t, ref, n, "broadcast (schedules)");
            t = mt_make(rank, n, dt, 61);
            MT_OK(nb_reduce(c, t, NB_REDUCE_SUM, 1 % size));
            for (int64_t i = 0; i < n; i++)
                ref[i] = rank == 1 % size ? mt_reduce_ref(NB_REDUCE_SUM, i, dt, 61, size)
                                          : mt_value(rank, i, dt, 61);
            mt_expect(t, ref, n, "reduce (schedules)");
            nb_comm_chunk(n, size, rank, &b, &e);
            nb_tensor *out = nb_zeros((int64_t[]){e - b}, 1, dt);
            MT_OK(nb_reduce_scatter(c, out, mt_make(rank, n, dt, 62), NB_REDUCE_MAX));
            for (int64_t i = b; i < e; i++)
                ref[i - b] = mt_reduce_ref(NB_REDUCE_MAX, i, dt, 62, size);
            mt_expect(out, ref, e - b, "reduce_scatter (schedules)");
            nb_tensor *all = nb_zeros((int64_t[]){n * size}, 1, dt);
            MT_OK(nb_allgather(c, all, mt_make(rank, n, dt, 63)));
            for (int64_t j = 0; j < n * size; j++) ref[j] = mt_value((int)(j / n), j % n, dt, 63);
            mt_expect(all, ref, n * size, "allgather (schedules)");
            free(ref);
            nb_scope_end();
        }
}

/* The world, then a 3-rank communicator (ranks 0-2; the others form the rest). */
START_TEST(test_schedules) {
    allreduce_schedules(mt_world);
    other_schedules(mt_world);
    if (mt_size >= 3) {
        nb_comm *c = nb_comm_split(mt_world, mt_rank < 3 ? 0 : 1, mt_rank);
        MT_CHECK(c != NULL, "split: %s", nb_last_error());
        if (c) {
            allreduce_schedules(c);
            other_schedules(c);
        }
        nb_comm_free(c);
    }
    MT_END();
}
END_TEST

/* NaN: sums carry it, and the small schedules' max and min propagate it, whichever rank
 * has it. */
START_TEST(test_nan) {
    nb_scope_begin();
    for (int o = 0; o < 4; o++) {
        nb_tensor *t = nb_full((int64_t[]){100}, 1, NB_F32, mt_rank);
        if (mt_rank == mt_size - 1) ((float *)nb_data(t))[5] = NAN; /* from either side */
        if (mt_rank == 0) ((float *)nb_data(t))[9] = NAN;
        MT_OK(nb_allreduce(mt_world, t, ops[o]));
        for (int64_t i = 5; i < 10; i += 4)
            MT_CHECK(isnan(nb_get_f64(t, &i)), "allreduce %s: element %lld = %g, not NaN",
                     op_names[o], (long long)i, nb_get_f64(t, &i));
        MT_CHECK(!isnan(nb_get_f64(t, (int64_t[]){6})), "allreduce %s: element 6 is NaN",
                 op_names[o]);
        expect_identical(mt_world, t, "allreduce with a NaN");
    }
    nb_scope_end();
    MT_END();
}
END_TEST

/* Ranks that wait for the same collectives in different orders: waiting on one advances all
 * of them (each needs the other ranks to take part in every round). */
START_TEST(test_wait_orders) {
    enum { K = 6 };
    nb_scope_begin();
    int64_t sizes[K] = {70000, 16, 20000, 3000, 1, 300000};
    nb_tensor *t[K];
    nb_work *w[K];
    for (int i = 0; i < K; i++) {
        t[i] = mt_make(mt_rank, sizes[i], NB_F32, 70 + i);
        w[i] = nb_allreduce_async(mt_world, t[i], NB_REDUCE_SUM);
    }
    for (int j = 0; j < K; j++) { /* odd ranks in reverse, even ranks in a shuffled order */
        int i = mt_rank % 2 ? K - 1 - j : (j * 5 + mt_rank) % K;
        MT_OK(nb_work_wait(w[i]));
    }
    for (int i = 0; i < K; i++) {
        double *ref = alloc_ref(sizes[i]);
        for (int64_t j = 0; j < sizes[i]; j++)
            ref[j] = mt_reduce_ref(NB_REDUCE_SUM, j, NB_F32, 70 + i, mt_size);
        mt_expect(t[i], ref, sizes[i], "allreduce waited out of order");
        free(ref);
    }
    nb_scope_end();
    MT_END();
}
END_TEST

/* A small collective advances without the caller: started, then nobody polls for a while;
 * the first test finds it done (the control thread moved it along). */
START_TEST(test_background_progress) {
    nb_scope_begin();
    int64_t n = 70000;
    nb_tensor *t = mt_make(mt_rank, n, NB_F32, 80);
    nb_work *w = nb_allreduce_async(mt_world, t, NB_REDUCE_SUM);
    usleep(300000);
    int r = nb_work_test(w);
    MT_CHECK(r == 1, "not done 0.3 s after it started (nb_work_test: %d)", r);
    MT_OK(nb_work_wait(w));
    double *ref = alloc_ref(n);
    for (int64_t j = 0; j < n; j++) ref[j] = mt_reduce_ref(NB_REDUCE_SUM, j, NB_F32, 80, mt_size);
    mt_expect(t, ref, n, "allreduce advanced in the background");
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
    tcase_add_test(tc, test_schedules);
    tcase_add_test(tc, test_nan);
    tcase_add_test(tc, test_wait_orders);
    tcase_add_test(tc, test_background_progress);
    suite_add_tcase(s, tc);
    return s;
}
