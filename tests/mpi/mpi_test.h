/* mpi_test.h - shared helpers of the multi-rank test program nabla_mpi_tests (run under
 * `mpirun -np N`, N = 1, 2, 4, or alone): the world communicator, deterministic per-rank
 * data with double-precision references, and failure agreement across ranks.
 *
 * Check runs without fork here (MPI processes must not fork), so a failing ck_assert would
 * leave this rank out of step with the others. Tests therefore record failures with
 * MT_CHECK (no jump) and end with MT_END(), a collective that combines every rank's verdict:
 * each rank then fails or passes the test alike, and rank 0's message names the failing
 * ranks and their first failure. Only rank 0 prints Check's output.
 *
 * main.c defines the world, the failure agreement and the data helpers; mpi_test_util.c the
 * helpers the test files share (numbers, parameter comparisons, expected errors, temporary
 * directories, the one-model-every-layout harness). */
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
Suite *mt_suite_parallel_llama(void);
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

/* ---- helpers the test files share (mpi_test_util.c) ------------------------------------------ */
/* |a - b| / |b| (|b| at least 1e-12). */
double mt_rel_diff(double a, double b);
/* Max |a - b| over the elements of a and b (same size), over max |b| (1 when b is all zero);
 * INFINITY when either is NULL or the sizes differ. */
double mt_tensor_rel_diff(nb_tensor *a, nb_tensor *b);
/* The elements of t as doubles (malloc'ed, the caller frees; zeros when t cannot be read). */
double *mt_values(const nb_tensor *t);
/* Every parameter of a equals b's within rtol: |x - r| <= rtol * (|r| + floor); the first bad
 * element of each parameter is recorded as a failure naming `what`. mt_expect_same_params:
 * floor 1e-3. */
void mt_expect_params_close(nb_module *a, nb_module *b, double rtol, double floor,
                            const char *what);
void mt_expect_same_params(nb_module *a, nb_module *b, double rtol, const char *what);
/* A status that must be `status` with `needle` in the message (the error is cleared). */
void mt_expect_error_at(nb_status s, nb_status status, const char *needle, const char *file,
                        int line);
#define MT_EXPECT_ERROR(s, status, needle) mt_expect_error_at((s), (status), (needle), __FILE__, __LINE__)
/* Seconds on a monotonic clock. */
double mt_now(void);
/* A barrier over the world that must succeed. */
void mt_barrier(void);
/* Whether mine is true on any rank (collective over the world; true if the ranks cannot
 * agree). */
bool mt_any_rank(bool mine);
/* A fresh directory /tmp/PREFIX-XXXXXX, the same name on every rank (rank 0 makes it, a
 * collective); mt_rmtree removes it with everything in it. */
void mt_tmpdir(char out[64], const char *prefix);
void mt_rmtree(const char *dir);

/* ---- one model in every parallel layout (test_parallel_gpt.c, test_parallel_llama.c) ------- */
/* Every layout the world size allows trains MT_K AdamW steps (lr 1e-2) on the same global
 * batches (MT_B sequences of MT_T tokens of a 64-token vocabulary) as one process; see
 * test_parallel_gpt.c's opening comment for what is compared and how the bound is measured. */
enum { MT_K = 3, MT_B = 8, MT_T = 16 };
typedef struct mt_layout {
    int dp, pp, tp;
    bool sp;
    nb_pipe_schedule sched;
    int v, micro, zero;
} mt_layout;
/* The model under test: how to make, split and train it, and its one-process reference (made
 * on first use). */
typedef struct mt_model {
    nb_module *(*make)(void); /* a fresh model with the weights of seed 7 */
    double (*step)(nb_module *m, nb_optim *opt, nb_tensor *const *x, nb_tensor *const *y,
                   int n_micro, const nb_gpt_step_opts *o, double *grad_norm);
    nb_status (*parallelize)(nb_module *m, const nb_mesh *mesh, const nb_parallelize_opts *o);
    nb_pipeline *(*pipeline_new)(nb_module *m, const nb_mesh *mesh, const nb_pipeline_opts *o);
    struct {
        nb_module *m; /* after MT_K steps */
        double loss[MT_K], norm0;
        double drift; /* the largest difference of a parameter between m and the same run
                       * with 2 or 4 accumulated micro-batches per step */
    } ref;
} mt_model;
void mt_describe_layout(const mt_layout *L, char *buf, size_t n);
/* Train layout L and compare with one process; the first difference goes into why (empty:
 * everything matched). A setup step that fails (mesh, plan, pipeline, optimizer, wrapper) is
 * also recorded as a failure of the test, so a test that expects a difference cannot pass on
 * it. Every rank runs every step whatever it finds, so the collectives stay paired. */
void mt_run_layout(mt_model *M, const mt_layout *L, char *why, size_t n);
/* mt_run_layout for every layout of the table whose dp x pp x tp is the world size; a
 * difference is a failure. */
void mt_check_layouts(mt_model *M);
/* The same for the layouts whose tp is at least min_tp. */
void mt_check_layouts_tp(mt_model *M, int min_tp);

#endif
