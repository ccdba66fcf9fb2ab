/* test_nccl.c - the NCCL communicator backend (parallel/comm_nccl.c) as far as a machine
 * without a GPU can run it: the node-local rank (MPI_COMM_TYPE_SHARED), the ncclUniqueId
 * made by rank 0 and broadcast over MPI (ncclGetUniqueId needs no GPU), the agreed error
 * value on every rank when the NCCL communicator cannot be made (no GPU here; no NCCL or no
 * CUDA in other builds), the failure kept for later calls, and host tensors never touching
 * NCCL. The collectives on the GPU are not run here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/plugin.h"
#include "mpi_test.h"
#include "nb_config.h"
#include "parallel/parallel_impl.h"

/* Every rank of these tests runs on this machine: the node-local rank is the world rank. */
START_TEST(test_nccl_local_rank) {
    MT_CHECK(nb_comm_local_rank() == mt_rank, "local rank %d on world rank %d",
             nb_comm_local_rank(), mt_rank);
    MT_END();
}
END_TEST

START_TEST(test_nccl_share_id) {
    int have = nb__comm_nccl_available();
    nb_clear_error();
    unsigned char id[NB__NCCL_ID_BYTES], zero[NB__NCCL_ID_BYTES] = {0};
    memset(id, 0, sizeof id);
    nb_status st = nb__comm_nccl_share_id(mt_world, id);
    if (have == 1) {
        MT_CHECK(st == NB_OK, "share_id: %s", nb_last_error());
        MT_CHECK(memcmp(id, zero, sizeof id) != 0, "the id is all zeros");
        /* Every rank holds rank 0's id. */
        nb_scope_begin();
        nb_tensor *mine = nb_zeros_on(NB_CPU, (int64_t[]){NB__NCCL_ID_BYTES}, 1, NB_U8);
        nb_tensor *all =
            nb_zeros_on(NB_CPU, (int64_t[]){(int64_t)NB__NCCL_ID_BYTES * mt_size}, 1, NB_U8);
        memcpy(nb_data(mine), id, sizeof id);
        MT_OK(nb_allgather(mt_world, all, mine));
        const unsigned char *a = nb_data(all);
        for (int r = 1; r < mt_size; r++)
            MT_CHECK(memcmp(a, a + (size_t)r * NB__NCCL_ID_BYTES, NB__NCCL_ID_BYTES) == 0,
                     "rank %d holds another id than rank 0", r);
        nb_scope_end();
        /* A second bootstrap gets a new id. */
        unsigned char id2[NB__NCCL_ID_BYTES];
        MT_OK(nb__comm_nccl_share_id(mt_world, id2));
        MT_CHECK(memcmp(id, id2, sizeof id) != 0, "two bootstraps share one id");
    } else {
        /* No NCCL in the plugin, or no plugin: the same error value on every rank. */
        MT_CHECK(st == NB_EUNSUPPORTED, "share_id without NCCL: %s (%s)", nb_status_name(st),
                 nb_last_error());
        MT_CHECK(strstr(nb_last_error(), have == 0 ? "built without NCCL" : "CUDA") != NULL,
                 "message: %s", nb_last_error());
    }
    nb_clear_error();
    MT_END();
}
END_TEST

/* Without a GPU the NCCL communicator cannot be made: every rank gets an error value (never
 * a crash or a hang) naming the ranks that failed, and the failure is kept: the next CUDA
 * collective reports it again at once, without a new bootstrap. */
START_TEST(test_nccl_no_gpu_error) {
    if (nb_cuda_device_count() > 0) {
        nb_clear_error();
        MT_END();
        return;
    }
    nb_clear_error();
    int have = nb__comm_nccl_available();
    nb_clear_error();
    nb_comm *sub = nb_comm_split(mt_world, 0, mt_rank); /* keeps mt_world's state clean */
    MT_CHECK(sub != NULL, "split: %s", nb_last_error());
    if (!sub) {
        MT_END();
        return;
    }
    for (int round = 0; round < 2; round++) {
        double t0 = nb__now();
        nb_comm *n = nb__comm_nccl_of(sub, 0, "allreduce");
        double dt = nb__now() - t0;
        const char *msg = nb_last_error();
        MT_CHECK(n == NULL, "an NCCL communicator without a GPU");
        if (have == 1) {
            MT_CHECK(nb_last_status() == NB_EDEVICE, "round %d: %s: %s", round,
                     nb_status_name(nb_last_status()), msg);
            MT_CHECK(strstr(msg, "allreduce: rank ") && strstr(msg, "could not set up NCCL") &&
                         strstr(msg, "0 (NB_EDEVICE)") && strstr(msg, "NB_COMM_NCCL=0"),
                     "round %d: message: %s", round, msg);
            /* rank 0's own reason is the missing GPU, the others' their local rank */
            MT_CHECK(strstr(msg, mt_rank == 0 ? "no usable GPU" : "local rank"),
                     "round %d: rank %d's message: %s", round, mt_rank, msg);
        } else {
            MT_CHECK(nb_last_status() == NB_EUNSUPPORTED, "round %d: %s: %s", round,
                     nb_status_name(nb_last_status()), msg);
        }
        if (round == 0 && mt_rank == 0) fprintf(stderr, "nccl suite: without a GPU: %s\n", msg);
        if (round == 1) MT_CHECK(dt < 0.5, "the kept failure took %.3g s", dt);
        nb_clear_error();
    }
    nb_comm_free(sub);
    MT_END();
}
END_TEST

/* Host tensors stay on MPI whatever NB_COMM_NCCL says: no NCCL communicator is made. */
START_TEST(test_nccl_host_stays_mpi) {
    setenv("NB_COMM_NCCL", "1", 1);
    nb_scope_begin();
    nb_tensor *t = nb_full((int64_t[]){5}, 1, NB_F32, 1);
    MT_OK(nb_allreduce(mt_world, t, NB_REDUCE_SUM));
    MT_CHECK(nb_item_f64(nb_select(t, 0, 4)) == mt_size, "sum of ones is not the size");
    nb_tensor *g = nb_zeros((int64_t[]){2 * mt_size}, 1, NB_F32);
    MT_OK(nb_allgather(mt_world, g, nb_full((int64_t[]){2}, 1, NB_F32, mt_rank)));
    nb_scope_end();
    MT_CHECK(mt_world->dev == NULL, "a host collective made an NCCL communicator");
    unsetenv("NB_COMM_NCCL");
    MT_END();
}
END_TEST

/* Which communicator moves a tensor (nb__comm_route). A host tensor dressed as a CUDA one
 * (its storage's device field is set to cuda:0 for the call, then restored): without a GPU
 * no real CUDA tensor can be made, and the route looks only at the device. */
static nb_comm *route_as_cuda(nb_comm *c, nb__coll kind, nb_tensor *t, nb_tensor *u) {
    nb_device saved = t->storage->device;
    t->storage->device = NB_CUDA(0);
    nb_comm *r = nb__comm_route(c, kind, t, u, nb__coll_name(kind));
    t->storage->device = saved;
    return r;
}

START_TEST(test_nccl_route) {
    int have = nb__comm_nccl_available();
    nb_clear_error();
    nb_comm *sub = nb_comm_split(mt_world, 0, mt_rank); /* its NCCL state is its own */
    MT_CHECK(sub != NULL, "split: %s", nb_last_error());
    if (!sub) {
        MT_END();
        return;
    }
    nb_scope_begin();
    nb_tensor *t = nb_zeros_on(NB_CPU, (int64_t[]){4}, 1, NB_F32);
    nb_tensor *host = nb_zeros_on(NB_CPU, (int64_t[]){4}, 1, NB_F32);
    /* Host tensors, and every kind NCCL does not take, stay on the communicator itself. */
    MT_CHECK(nb__comm_route(sub, NB__COLL_ALLREDUCE, t, NULL, "allreduce") == sub, "host");
    MT_CHECK(route_as_cuda(sub, NB__COLL_SEND, t, NULL) == sub, "send was routed");
    MT_CHECK(route_as_cuda(sub, NB__COLL_RECV, t, NULL) == sub, "recv was routed");
    MT_CHECK(route_as_cuda(sub, NB__COLL_BARRIER, t, NULL) == sub, "barrier was routed");
    MT_CHECK(route_as_cuda(sub, NB__COLL_ALLGATHER, t, host) == sub, "mixed devices routed");
    setenv("NB_COMM_NCCL", "0", 1);
    MT_CHECK(route_as_cuda(sub, NB__COLL_ALLREDUCE, t, NULL) == sub, "NB_COMM_NCCL=0 routed");
    unsetenv("NB_COMM_NCCL");
    MT_CHECK(sub->dev == NULL, "no NCCL communicator should have been made yet");
    if (mt_size == 1) {
        /* one rank: nothing to communicate, the communicator itself */
        MT_CHECK(route_as_cuda(sub, NB__COLL_ALLREDUCE, t, NULL) == sub, "size 1 routed");
    } else if (have == 1 && nb_cuda_device_count() == 0) {
        /* A CUDA allreduce goes to NCCL: here its bootstrap fails (no GPU), on every rank,
         * and the failure is kept. */
        for (int round = 0; round < 2; round++) {
            nb_comm *r = route_as_cuda(sub, NB__COLL_ALLREDUCE, t, NULL);
            MT_CHECK(r == NULL && nb_last_status() == NB_EDEVICE &&
                         strstr(nb_last_error(), "could not set up NCCL"),
                     "round %d: routed to %p: %s", round, (void *)r, nb_last_error());
            nb_clear_error();
        }
        MT_CHECK(sub->dev != NULL, "the failed NCCL bootstrap was not kept");
    } else if (have != 1) {
        /* No NCCL in the plugin: through host memory, unless NB_COMM_NCCL=1 insists. */
        MT_CHECK(route_as_cuda(sub, NB__COLL_ALLREDUCE, t, NULL) == sub, "no NCCL: %s",
                 nb_last_error());
        setenv("NB_COMM_NCCL", "1", 1);
        nb_comm *r = route_as_cuda(sub, NB__COLL_ALLREDUCE, t, NULL);
        MT_CHECK(r == NULL && nb_last_status() == NB_EUNSUPPORTED &&
                     strstr(nb_last_error(), "NB_COMM_NCCL=1 but the CUDA plugin has no NCCL"),
                 "NB_COMM_NCCL=1 without NCCL: %p: %s", (void *)r, nb_last_error());
        unsetenv("NB_COMM_NCCL");
        nb_clear_error();
    }
    nb_scope_end();
    nb_comm_free(sub);
    MT_END();
}
END_TEST

/* On a machine with a GPU per rank (skipped here: no GPU): the collectives of CUDA tensors
 * through NCCL, against the host results. With several ranks through the public API (the
 * route picks NCCL); with one rank on a one-rank NCCL communicator made directly. Only the
 * copies between host and GPU are needed besides NCCL (no CUDA kernel). UNVERIFIED: it has
 * not run yet. */
static void gpu_check(nb_tensor *cuda, const nb_tensor *want, const char *what) {
    nb_tensor *back = cuda ? nb_to_device(cuda, NB_CPU) : NULL;
    int64_t n = nb_numel(want);
    double *ref = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (ref && nb_read(want, ref, n, NB_F64) == NB_OK) mt_expect(back, ref, n, what);
    else MT_CHECK(false, "%s: cannot read the reference", what);
    free(ref);
}

START_TEST(test_nccl_gpu_collectives) {
    int ndev = nb_cuda_device_count();
    nb_clear_error();
    /* one GPU per rank: as many as ranks, or one visible to each process */
    if (nb__comm_nccl_available() != 1 || ndev < 1 || (mt_size > 1 && ndev < mt_size)) {
        nb_clear_error();
        if (mt_rank == 0) fprintf(stderr, "nccl suite: no GPU per rank, GPU collectives skipped\n");
        MT_END();
        return;
    }
    int dev = ndev == 1 ? 0 : nb_comm_local_rank();
    nb_comm *c = mt_size > 1 ? mt_world : nb__comm_nccl_of(mt_world, dev, "test");
    MT_CHECK(c != NULL, "NCCL communicator: %s", nb_last_error());
    if (!c) {
        MT_END();
        return;
    }
    nb_device d = NB_CUDA(dev);
    const nb_dtype dts[] = {NB_F32, NB_BF16, NB_F64, NB_I32};
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        nb_dtype dt = dts[k];
        nb_scope_begin();
        for (int64_t n = 1; n <= 1001; n += 1000) {
            /* allreduce sum, max (and avg for floats) against the host path */
            nb_reduce_op ops[] = {NB_REDUCE_SUM, NB_REDUCE_MAX, NB_REDUCE_AVG};
            for (int o = 0; o < (nb_dtype_is_float(dt) ? 3 : 2); o++) {
                nb_tensor *h = mt_make(mt_rank, n, dt, o), *g = nb_to_device(h, d);
                MT_OK(nb_allreduce(c, g, ops[o]));
                MT_OK(nb_allreduce(mt_world, h, ops[o]));
                gpu_check(g, h, "allreduce");
            }
            /* broadcast from the last rank */
            nb_tensor *h = mt_make(mt_rank, n, dt, 5), *g = nb_to_device(h, d);
            MT_OK(nb_broadcast(c, g, mt_size - 1));
            MT_OK(nb_broadcast(mt_world, h, mt_size - 1));
            gpu_check(g, h, "broadcast");
            /* allgather, equal blocks and nb_comm_chunk's blocks */
            int64_t b, e;
            nb_comm_chunk(n, mt_size, mt_rank, &b, &e);
            nb_tensor *in = mt_make(mt_rank, e - b, dt, 6);
            nb_tensor *ho = nb_zeros_on(NB_CPU, (int64_t[]){n}, 1, dt);
            nb_tensor *go = nb_empty_on(d, (int64_t[]){n}, 1, dt);
            MT_OK(nb_allgather(c, go, nb_to_device(in, d)));
            MT_OK(nb_allgather(mt_world, ho, in));
            gpu_check(go, ho, "allgather (chunks)");
            /* reduce_scatter of n elements (uneven unless n divides) */
            nb_tensor *rin = mt_make(mt_rank, n, dt, 7);
            nb_tensor *rho = nb_zeros_on(NB_CPU, (int64_t[]){e - b}, 1, dt);
            nb_tensor *rgo = nb_empty_on(d, (int64_t[]){e - b}, 1, dt);
            MT_OK(nb_reduce_scatter(c, rgo, nb_to_device(rin, d), NB_REDUCE_SUM));
            MT_OK(nb_reduce_scatter(mt_world, rho, rin, NB_REDUCE_SUM));
            gpu_check(rgo, rho, "reduce_scatter");
        }
        nb_scope_end();
    }
    if (mt_size > 1) /* the route made the world's NCCL communicator: it is there now */
        MT_CHECK(nb__comm_nccl_of(mt_world, dev, "test") != NULL, "NCCL was not used: %s",
                 nb_last_error());
    MT_END();
}
END_TEST

Suite *mt_suite_nccl(void) {
    Suite *s = suite_create("nccl");
    TCase *tc = tcase_create("nccl");
    tcase_add_test(tc, test_nccl_local_rank);
    tcase_add_test(tc, test_nccl_share_id);
    tcase_add_test(tc, test_nccl_no_gpu_error);
    tcase_add_test(tc, test_nccl_host_stays_mpi);
    tcase_add_test(tc, test_nccl_route);
    tcase_add_test(tc, test_nccl_gpu_collectives);
    suite_add_tcase(s, tc);
    return s;
}
