/* main.c - nabla_mpi_tests: the multi-rank Check suites (collectives, communicators,
 * failures), run as `mpirun -np N nabla_mpi_tests` or alone (then the program initializes
 * MPI itself, as a singleton, which also tests nabla on an MPI it did not initialize).
 * `nabla_mpi_tests --dead-peer` runs only the dead-peer case (rank 1 dies; run it with
 * `mpirun --enable-recovery`, see tools/run-tests). Only rank 0 prints; the exit status is
 * non-zero when any test failed on any rank. NB_SUITE=name runs one suite. */
#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_test.h"

nb_comm *mt_world;
int mt_rank, mt_size;
static nb_comm *referee; /* a separate communicator for the verdicts */

const nb_dtype mt_dtypes[NB_DTYPE_COUNT] = {NB_F32, NB_F64, NB_F16, NB_BF16,
                                           NB_I32, NB_I64, NB_U8,  NB_BOOL};
const int64_t mt_sizes[MT_NSIZES] = {0, 1, 7, 1001, 1 << 20};

/* ---- failures and agreement ------------------------------------------------------------------ */
#define MSG 240
static bool failed;
static char first_msg[MSG];

void mt_fail_at(const char *file, int line, const char *fmt, ...) {
    if (failed) return;
    failed = true;
    const char *base = strrchr(file, '/');
    int k = snprintf(first_msg, MSG, "%s:%d: ", base ? base + 1 : file, line);
    va_list ap;
    va_start(ap, fmt);
    if (k > 0 && k < MSG) vsnprintf(first_msg + k, MSG - (size_t)k, fmt, ap);
    va_end(ap);
    if (getenv("NB_TEST_VERBOSE")) fprintf(stderr, "[rank %d] %s\n", mt_rank, first_msg);
}

bool mt_failed(void) { return failed; }

void mt_agree_at(const char *file, int line) {
    char all[2048] = "";
    bool any = failed, broken = false;
    if (mt_size > 1) {
        nb_scope_begin();
        nb_tensor *flag = nb_full((int64_t[]){1}, 1, NB_I32, failed ? 1 : 0);
        if (nb_allreduce(referee, flag, NB_REDUCE_MAX) != NB_OK) {
            snprintf(all, sizeof all, "%s:%d: the ranks could not agree on the verdict: %s", file,
                     line, nb_last_error());
            broken = true;
        } else if ((any = nb_item_i64(flag) != 0)) {
            nb_tensor *mine = nb_zeros((int64_t[]){MSG}, 1, NB_U8);
            nb_tensor *msgs = nb_zeros((int64_t[]){(int64_t)MSG * mt_size}, 1, NB_U8);
            if (failed) memcpy(nb_data(mine), first_msg, strlen(first_msg));
            if (nb_allgather(referee, msgs, mine) != NB_OK) {
                snprintf(all, sizeof all, "failures (messages lost: %s)", nb_last_error());
            } else {
                const char *m = nb_data(msgs);
                for (int r = 0; r < mt_size; r++)
                    if (m[(size_t)r * MSG])
                        snprintf(all + strlen(all), sizeof all - strlen(all), "%srank %d: %.*s",
                                 all[0] ? "; " : "", r, MSG, m + (size_t)r * MSG);
            }
        }
        nb_scope_end();
    } else if (failed) {
        snprintf(all, sizeof all, "rank 0: %s", first_msg);
    }
    failed = false;
    first_msg[0] = 0;
    nb_clear_error();
    ck_assert_msg(!any && !broken, "%s", all);
}

/* ---- data ------------------------------------------------------------------------------------------ */
double mt_value(int r, int64_t i, nb_dtype dt, int salt) {
    int64_t k = (r * 7 + i * 3 + salt * 5) % 17;
    if (dt == NB_BOOL) return (r + i + salt) % 3 == 0;
    if (dt == NB_U8) return (double)k;
    return (double)(k - 8);
}

double mt_round(double x, nb_dtype dt) {
    switch (dt) {
    case NB_F32: return (float)x;
    case NB_F16: return nb_f16_to_f32(nb_f32_to_f16((float)x));
    case NB_BF16: return nb_bf16_to_f32(nb_f32_to_bf16((float)x));
    default: return x; /* references of integer dtypes are exact */
    }
}

nb_tensor *mt_make(int r, int64_t n, nb_dtype dt, int salt) {
    nb_tensor *t = nb_empty(&n, 1, dt);
    if (!t) return NULL;
    char *p = nb_data(t);
    size_t es = nb_dtype_size(dt);
    for (int64_t i = 0; i < n; i++) {
        double v = mt_value(r, i, dt, salt);
        switch (dt) {
        case NB_F32: ((float *)p)[i] = (float)v; break;
        case NB_F64: ((double *)p)[i] = v; break;
        case NB_F16: ((uint16_t *)p)[i] = nb_f32_to_f16((float)v); break;
        case NB_BF16: ((uint16_t *)p)[i] = nb_f32_to_bf16((float)v); break;
        case NB_I32: ((int32_t *)p)[i] = (int32_t)v; break;
        case NB_I64: ((int64_t *)p)[i] = (int64_t)v; break;
        default: p[(size_t)i * es] = (char)(uint8_t)v; break; /* u8, bool */
        }
    }
    return t;
}

double mt_reduce_ref(nb_reduce_op op, int64_t i, nb_dtype dt, int salt, int nranks) {
    double acc = mt_value(0, i, dt, salt);
    for (int r = 1; r < nranks; r++) {
        double v = mt_value(r, i, dt, salt);
        if (op == NB_REDUCE_MAX) acc = v > acc ? v : acc;
        else if (op == NB_REDUCE_MIN) acc = v < acc ? v : acc;
        else acc += v;
    }
    if (dt == NB_BOOL && op != NB_REDUCE_MIN) acc = acc != 0; /* logical or */
    if (dt == NB_U8 && op == NB_REDUCE_SUM) acc = (double)((int64_t)acc & 255);
    if (op == NB_REDUCE_AVG) acc /= nranks;
    return acc;
}

static double tol_of(nb_dtype dt) {
    switch (dt) {
    case NB_F32: return 1e-6;
    case NB_F64: return 1e-12;
    case NB_F16: return 1e-3;
    case NB_BF16: return 8e-3;
    default: return 0;
    }
}

bool mt_expect(const nb_tensor *t, const double *ref, int64_t n, const char *what) {
    if (!t) {
        mt_fail_at(__FILE__, __LINE__, "%s: no tensor (%s)", what, nb_last_error());
        return false;
    }
    if (nb_numel(t) != n) {
        mt_fail_at(__FILE__, __LINE__, "%s: %lld elements, expected %lld", what,
                   (long long)nb_numel(t), (long long)n);
        return false;
    }
    nb_dtype dt = nb_tensor_dtype(t);
    double *got = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (!got || nb_read(t, got, n, NB_F64) != NB_OK) {
        free(got);
        mt_fail_at(__FILE__, __LINE__, "%s: cannot read the result", what);
        return false;
    }
    double tol = tol_of(dt);
    bool ok = true;
    for (int64_t i = 0; i < n && ok; i++) {
        double r = mt_round(ref[i], dt);
        if (!(fabs(got[i] - r) <= tol * (1 + fabs(r)))) {
            mt_fail_at(__FILE__, __LINE__, "%s (%s, %lld elements): [%lld] = %.9g, expected %.9g",
                       what, nb_dtype_name(dt), (long long)n, (long long)i, got[i], r);
            ok = false;
        }
    }
    free(got);
    return ok;
}

/* ---- main ------------------------------------------------------------------------------------------ */
int main(int argc, char **argv) {
    bool dead = argc > 1 && strcmp(argv[1], "--dead-peer") == 0;
#ifdef NB_TEST_CUDA_PLUGIN
    /* This build's CUDA plugin (the NCCL suite loads it), unless the caller chose one. */
    setenv("NB_CUDA_PLUGIN", NB_TEST_CUDA_PLUGIN, 0);
#endif
    /* Under a launcher nabla initializes MPI itself (and finalizes it at exit); alone, this
     * program does, and nabla must work on top of it. */
    bool launched = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
    if (!launched) {
        int provided;
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    }
    mt_world = nb_comm_world();
    if (!mt_world || strcmp(nb_comm_backend(mt_world), "mpi") != 0) {
        fprintf(stderr, "nabla_mpi_tests: no MPI world communicator (%s)\n",
                mt_world ? nb_comm_backend(mt_world) : nb_last_error());
        return 1;
    }
    nb_comm_set_timeout(mt_world, 60);
    mt_rank = nb_comm_rank(mt_world);
    mt_size = nb_comm_size(mt_world);
    referee = nb_comm_split(mt_world, 0, mt_rank);
    if (!referee) {
        fprintf(stderr, "nabla_mpi_tests: comm_split failed: %s\n", nb_last_error());
        return 1;
    }
    nb_comm_set_timeout(referee, 60);

    SRunner *sr;
    if (dead) {
        sr = srunner_create(mt_suite_dead_peer());
    } else {
        sr = srunner_create(mt_suite_collectives());
        srunner_add_suite(sr, mt_suite_comm());
        srunner_add_suite(sr, mt_suite_ddp());
        srunner_add_suite(sr, mt_suite_zero());
        srunner_add_suite(sr, mt_suite_reducer());
        srunner_add_suite(sr, mt_suite_dcp());
        srunner_add_suite(sr, mt_suite_dcp_bad());
        srunner_add_suite(sr, mt_suite_mesh());
        srunner_add_suite(sr, mt_suite_parallel_gpt());
        srunner_add_suite(sr, mt_suite_tp());
        srunner_add_suite(sr, mt_suite_pipeline());
        srunner_add_suite(sr, mt_suite_nccl());
        srunner_add_suite(sr, mt_suite_mismatch());
        srunner_add_suite(sr, mt_suite_failures()); /* last: it ends with a timeout */
    }
    const char *only = getenv("NB_SUITE");
    if (only) setenv("CK_RUN_SUITE", only, 1);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, mt_rank == 0 ? CK_NORMAL : CK_SILENT);
    int nfailed = srunner_ntests_failed(sr);
    srunner_free(sr);
    fflush(stdout);
    nb_comm_free(referee);
    nb_comm_free(mt_world);
    if (!launched) MPI_Finalize();
    return nfailed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
