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

Suite *mt_suite_nccl(void) {
    Suite *s = suite_create("nccl");
    TCase *tc = tcase_create("nccl");
    tcase_add_test(tc, test_nccl_local_rank);
    tcase_add_test(tc, test_nccl_share_id);
    tcase_add_test(tc, test_nccl_no_gpu_error);
    tcase_add_test(tc, test_nccl_host_stays_mpi);
    suite_add_tcase(s, tc);
    return s;
}
