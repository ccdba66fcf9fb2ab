/* mpi_test.h - shared helpers of the multi-rank test program nabla_mpi_tests (run under
 * `mpirun -np N`, N = 1, 2, 4, or alone): the world communicator, deterministic per-rank
 * data with double-precision references, and failure agreement across ranks.
 *
 * Check runs without fork here (MPI processes must not fork), so a failing ck_assert would
 * leave this rank out of step with the others. Tests therefore record failures with
 * MT_CHECK (no jump) and end with MT_END(), a collective that combines every rank's verdict:
 * each rank then fails or passes the test alike, and rank 0's message names the failing
 * ranks and their first failure. Only rank 0 prints Check's output. */
#ifndef NABLA_MPI_TEST_H
#define NABLA_MPI_TEST_H

#include <check.h>
#include <stdbool.h>
#include <stdint.h>

#include "nabla/nabla.h"

extern nb_comm *mt_world; /* nb_comm_world(), timeout 60 s */
extern int mt_rank, mt_size;

Suite *mt_suite_collectives(void);
Suite *mt_suite_comm(void);
Suite *mt_suite_ddp(void);
Suite *mt_suite_zero(void);
Suite *mt_suite_reducer(void);
Suite *mt_suite_dcp(void);
Suite *mt_suite_dcp_bad(void);
Suite *mt_suite_mesh(void);
Suite *mt_suite_parallel_gpt(void);
Suite *mt_suite_tp(void);
Suite *mt_suite_pipeline(void);
Suite *mt_suite_nccl(void);
Suite *mt_suite_failures(void);
Suite *mt_suite_mismatch(void);
Suite *mt_suite_dead_peer(void);

/* Record a failure on this rank (the first message is kept). */
void mt_fail_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define MT_CHECK(cond, ...)                                                                \
    do {                                                                                   \
        if (!(cond)) mt_fail_at(__FILE__, __LINE__, __VA_ARGS__);                          \
    } while (0)
/* A status that must be NB_OK. */
#define MT_OK(expr)                                                                        \
    do {                                                                                   \
        nb_status st_ = (expr);                                                            \
        MT_CHECK(st_ == NB_OK, "%s -> %s: %s", #expr, nb_status_name(st_), nb_last_error()); \
    } while (0)
/* Collective over the world: every rank fails the test if any rank recorded a failure. */
void mt_agree_at(const char *file, int line);
#define MT_END() mt_agree_at(__FILE__, __LINE__)
/* Local failures recorded so far in this test (for early exits that stay collective). */
bool mt_failed(void);

/* Rank r's deterministic element i of data set `salt`: small integers, so sums over a few
 * ranks are exact in every dtype (u8: 0..16, bool: 0/1, others: -8..8). */
double mt_value(int r, int64_t i, nb_dtype dt, int salt);
/* A contiguous 1-D tensor of n elements of mt_value(r, ., dt, salt). */
nb_tensor *mt_make(int r, int64_t n, nb_dtype dt, int salt);
/* x rounded to dt as the library stores it. */
double mt_round(double x, nb_dtype dt);
/* Compare t's elements (logical order) with ref[n] (each rounded to t's dtype) within the
 * dtype's tolerance; records a failure naming `what` and the first bad index. */
bool mt_expect(const nb_tensor *t, const double *ref, int64_t n, const char *what);
/* The reference of a reduction over ranks of element i of data set salt. */
double mt_reduce_ref(nb_reduce_op op, int64_t i, nb_dtype dt, int salt, int nranks);

extern const nb_dtype mt_dtypes[NB_DTYPE_COUNT];
extern const int64_t mt_sizes[5];  /* 0, 1, 7, 1001, 1 << 20 */
#define MT_NSIZES 5

#endif
