/* mpi_test_util.c - the helpers the multi-rank test files share (declared in mpi_test.h):
 * relative differences, parameter comparisons, expected errors, a clock, temporary
 * directories with the same name on every rank, and the harness that trains one model
 * (the GPT, the Llama) in every parallel layout the world size allows against one process
 * (test_parallel_gpt.c, test_parallel_llama.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpi_test.h"

/* ---- numbers ---------------------------------------------------------------------------------- */
double mt_rel_diff(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-12); }

double mt_tensor_rel_diff(nb_tensor *a, nb_tensor *b) {
    if (!a || !b || nb_numel(a) != nb_numel(b)) return INFINITY;
    nb_scope_begin();
    double d = nb_item_f64(nb_amax(nb_abs(nb_sub(nb_to_dtype(a, NB_F64), nb_to_dtype(b, NB_F64))),
                                   NULL, 0, false));
    double m = nb_item_f64(nb_amax(nb_abs(nb_to_dtype(b, NB_F64)), NULL, 0, false));
    nb_scope_end();
    return d / (m > 0 ? m : 1);
}

double *mt_values(const nb_tensor *t) {
    int64_t n = nb_numel(t);
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (nb_read(t, v, n, NB_F64) != NB_OK) memset(v, 0, sizeof(double) * (size_t)n);
    return v;
}

void mt_expect_params_close(nb_module *a, nb_module *b, double rtol, double floor,
                            const char *what) {
    const nb_params *pa = nb_parameters(a), *pb = nb_parameters(b);
    if (!pa || !pb || pa->count != pb->count) {
        MT_CHECK(false, "%s: parameter lists differ", what);
        return;
    }
    for (int i = 0; i < pa->count; i++) {
        double *va = mt_values(pa->tensors[i]), *vb = mt_values(pb->tensors[i]);
        int64_t n = nb_numel(pa->tensors[i]);
        for (int64_t j = 0; j < n; j++)
            if (!(fabs(va[j] - vb[j]) <= rtol * (fabs(vb[j]) + floor))) {
                MT_CHECK(false, "%s: %s[%lld] = %.9g, reference %.9g", what, pa->names[i],
                         (long long)j, va[j], vb[j]);
                break;
            }
        free(va);
        free(vb);
    }
}

void mt_expect_same_params(nb_module *a, nb_module *b, double rtol, const char *what) {
    mt_expect_params_close(a, b, rtol, 1e-3, what);
}

void mt_expect_error_at(nb_status s, nb_status status, const char *needle, const char *file,
                        int line) {
    if (s != status || !strstr(nb_last_error(), needle))
        mt_fail_at(file, line, "got %s \"%s\", expected %s with \"%s\"", nb_status_name(s),
                   nb_last_error(), nb_status_name(status), needle);
    nb_clear_error();
}

bool mt_any_rank(bool mine) {
    nb_scope_begin();
    nb_tensor *t = nb_full((int64_t[]){1}, 1, NB_I32, mine ? 1 : 0);
    bool any = nb_allreduce(mt_world, t, NB_REDUCE_MAX) == NB_OK ? nb_item_i64(t) != 0 : true;
    nb_scope_end();
    return any;
}

double mt_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void mt_barrier(void) { MT_OK(nb_barrier(mt_world)); }

/* ---- files ------------------------------------------------------------------------------------ */
void mt_tmpdir(char out[64], const char *prefix) {
    char path[64] = ""; /* made here, then broadcast into out (rank 0's name everywhere) */
    if (mt_rank == 0) {
        snprintf(path, sizeof path, "/tmp/%s-XXXXXX", prefix);
        MT_CHECK(mkdtemp(path) != NULL, "mkdtemp failed");
    }
    nb_scope_begin();
    nb_tensor *t = nb_from_buffer(path, (int64_t[]){64}, 1, NB_U8);
    MT_OK(nb_broadcast(mt_world, t, 0));
    memcpy(out, nb_data(t), 64);
    out[63] = 0;
    nb_scope_end();
}

void mt_rmtree(const char *dir) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* ---- one model in every parallel layout ------------------------------------------------------- */
static nb_optim *adamw(nb_module *m) {
    nb_adamw_opts ao = nb_adamw_defaults();
    ao.lr = 1e-2;
    return nb_adamw_new(nb_parameters(m), &ao);
}

/* The global batches: the same on every rank. */
static void batch(int step, nb_tensor **x, nb_tensor **y) {
    nb_generator *g = nb_generator_new(100 + (uint64_t)step);
    *x = nb_randint((int64_t[]){MT_B, MT_T}, 2, NB_I64, 0, 64, g);
    *y = nb_randint((int64_t[]){MT_B, MT_T}, 2, NB_I64, 0, 64, g);
    nb_generator_free(g);
}

static void train_reference(mt_model *M, nb_module **out, double *losses, double *norm0,
                            int micro) {
    nb_module *m = M->make();
    nb_optim *opt = adamw(m);
    for (int s = 0; s < MT_K; s++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        batch(s, &x, &y);
        nb_tensor *xs[4], *ys[4];
        for (int i = 0; i < micro; i++) {
            xs[i] = nb_narrow(x, 0, MT_B / micro * i, MT_B / micro);
            ys[i] = nb_narrow(y, 0, MT_B / micro * i, MT_B / micro);
        }
        double norm;
        double l = M->step(m, opt, xs, ys, micro, NULL, &norm);
        if (losses) losses[s] = l;
        if (s == 0 && norm0) *norm0 = norm;
        nb_scope_end();
    }
    nb_optim_free(opt);
    *out = m;
}

/* Largest |a - b| over t's elements and its part of the same-named tensor of full. */
static double part_diff(nb_tensor *t, nb_tensor *whole) {
    nb_placement pl;
    if (nb_tensor_placement(t, &pl) != NB_OK) return INFINITY;
    nb_scope_begin();
    nb_tensor *w = whole;
    for (int k = 0; k < pl.n; k++) {
        const nb_place *e = &pl.places[k];
        if (e->kind != NB_PLACE_SHARD || e->dim < 0) continue;
        if (e->blocks == 1) {
            w = nb_narrow(w, e->dim, e->offset, e->length);
        } else {
            nb_tensor *parts[8];
            const int64_t blk = pl.shape[e->dim] / e->blocks;
            for (int b = 0; b < e->blocks; b++)
                parts[b] = nb_narrow(w, e->dim, b * blk + e->offset, e->length);
            w = nb_cat(parts, e->blocks, e->dim);
        }
    }
    nb_tensor *d = nb_amax(nb_abs(nb_sub(nb_to_dtype(t, NB_F64), nb_to_dtype(w, NB_F64))), NULL,
                           0, false);
    double r = d ? nb_item_f64(d) : INFINITY;
    nb_scope_end();
    return r;
}

static void get_ref(mt_model *M) {
    if (M->ref.m) return;
    train_reference(M, &M->ref.m, M->ref.loss, &M->ref.norm0, 1);
    for (int micro = 2; micro <= 4; micro *= 2) {
        nb_module *m2;
        train_reference(M, &m2, NULL, NULL, micro);
        const nb_params *a = nb_parameters(M->ref.m), *b = nb_parameters(m2);
        for (int i = 0; i < a->count; i++) {
            double d = part_diff(b->tensors[i], a->tensors[i]);
            if (d > M->ref.drift) M->ref.drift = d;
        }
        nb_module_free(m2);
    }
}

void mt_describe_layout(const mt_layout *L, char *buf, size_t n) {
    snprintf(buf, n, "dp %d pp %d tp %d%s%s%s v %d zero %d", L->dp, L->pp, L->tp, L->sp ? " sp" : "",
             L->pp > 1 ? " " : "", L->pp > 1 ? nb_pipe_schedule_name(L->sched) : "", L->v,
             L->zero);
}

/* Whether some parameter's gradient is a partial sum the reducer completes: partial over a
 * mesh dimension (sequence parallelism), or a piece several ranks hold (copies). */
static bool has_partial_grads(nb_module *m) {
    const nb_params *ps = nb_parameters(m);
    for (int i = 0; ps && i < ps->count; i++) {
        nb_placement pl;
        if (nb_tensor_placement(ps->tensors[i], &pl) != NB_OK) continue;
        for (int k = 0; k < pl.n; k++)
            if (pl.places[k].kind == NB_PLACE_PARTIAL ||
                (pl.places[k].kind == NB_PLACE_SHARD && pl.places[k].copies > 1))
                return true;
    }
    return false;
}

void mt_run_layout(mt_model *M, const mt_layout *L, char *why, size_t n) {
    get_ref(M);
    char what[128];
    mt_describe_layout(L, what, sizeof what);
    why[0] = '\0';
#define DIFF(...)                                                                          \
    do {                                                                                   \
        if (!why[0]) snprintf(why, n, __VA_ARGS__);                                        \
    } while (0)
/* A setup step that failed: a difference, and a failure of the test itself (the knock-out
 * tests expect a difference, which a layout that never trained must not give them). */
#define SETUP_FAILED(...)                                                                  \
    do {                                                                                   \
        DIFF(__VA_ARGS__);                                                                 \
        mt_fail_at(__FILE__, __LINE__, __VA_ARGS__);                                       \
    } while (0)
    nb_mesh *mesh = nb_mesh_new(mt_world, "dp pp tp", (int[]){L->dp, L->pp, L->tp});
    if (!mesh) {
        SETUP_FAILED("%s: mesh: %s", what, nb_last_error());
        return;
    }
    nb_module *m = M->make();
    nb_parallelize_opts po = nb_parallelize_defaults();
    po.sequence_parallel = L->sp;
    if (M->parallelize(m, mesh, &po) != NB_OK) SETUP_FAILED("%s: plan: %s", what, nb_last_error());
    nb_pipeline *pipe = NULL;
    nb_module *mod = m;
    if (L->pp > 1) {
        nb_pipeline_opts pio = nb_pipeline_defaults();
        pio.schedule = L->sched;
        pio.n_micro = L->micro;
        pio.virtual_stages = L->v;
        if (!(pipe = M->pipeline_new(m, mesh, &pio)))
            SETUP_FAILED("%s: pipeline: %s", what, nb_last_error());
        mod = pipe ? nb_pipeline_module(pipe) : NULL;
    }
    nb_optim *opt = mod ? adamw(mod) : NULL;
    if (mod && !opt) SETUP_FAILED("%s: optimizer: %s", what, nb_last_error());
    nb_ddp *ddp = NULL;
    nb_zero *z = NULL;
    nb_comm *dp = nb_mesh_group(mesh, "dp");
    /* the reducer (sp, key/value heads held by several ranks: its partial sums) */
    if (opt && (L->dp > 1 || L->zero || L->sp || has_partial_grads(mod))) {
        if (L->zero) {
            nb_zero_opts zo = nb_zero_defaults();
            zo.stage = L->zero;
            if (!(z = nb_zero_new(mod, opt, dp, &zo)))
                SETUP_FAILED("%s: zero: %s", what, nb_last_error());
        } else if (!(ddp = nb_ddp_new(mod, dp, NULL))) {
            SETUP_FAILED("%s: ddp: %s", what, nb_last_error());
        }
    }
    const int dr = nb_mesh_rank(mesh, "dp"), rows = MT_B / L->dp;
    for (int s = 0; opt && s < MT_K; s++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        batch(s, &x, &y);
        x = nb_narrow(x, 0, dr * rows, rows);
        y = nb_narrow(y, 0, dr * rows, rows);
        /* one step function for every layout */
        double norm = NAN;
        nb_gpt_step_opts so = nb_gpt_step_defaults();
        so.ddp = ddp;
        so.zero = z;
        so.pipeline = pipe;
        double loss = nb_mean_over_ranks(dp, M->step(m, opt, &x, &y, 1, &so, &norm));
        if (!(fabs(loss - M->ref.loss[s]) <= 1e-5 * fabs(M->ref.loss[s])))
            DIFF("%s: step %d loss %.9g, one process %.9g (%s)", what, s, loss, M->ref.loss[s],
                 nb_last_error());
        if (s == 0 && !(fabs(norm - M->ref.norm0) <= 1e-5 * M->ref.norm0))
            DIFF("%s: first gradient norm %.9g, one process %.9g", what, norm, M->ref.norm0);
        nb_scope_end();
    }
    if (z) nb_zero_free(z);
    /* every parameter this rank holds: its part of the one-process parameter */
    const nb_params *ps = mod ? nb_parameters(mod) : NULL;
    for (int i = 0; ps && i < ps->count; i++) {
        const double d = part_diff(ps->tensors[i], nb_module_find(M->ref.m, ps->names[i]));
        if (!(d <= 8 * M->ref.drift))
            DIFF("%s: %s differs by %g from one process (one process's own drift %g)", what,
                 ps->names[i], d, M->ref.drift);
    }
#undef SETUP_FAILED
#undef DIFF
    nb_clear_error();
    nb_ddp_free(ddp);
    nb_optim_free(opt);
    nb_pipeline_free(pipe);
    nb_module_free(m);
    nb_mesh_free(mesh);
}

/* The layouts of the world size (dp x pp x tp = mt_size). */
static const mt_layout layouts[] = {
    {1, 1, 1, false, NB_PIPE_1F1B, 1, 1, 0},
    {2, 1, 1, false, NB_PIPE_1F1B, 1, 1, 0},
    {1, 1, 2, false, NB_PIPE_1F1B, 1, 1, 0},
    {1, 2, 1, false, NB_PIPE_GPIPE, 1, 4, 0},
    {1, 2, 1, false, NB_PIPE_1F1B, 1, 4, 0},
    {1, 2, 1, false, NB_PIPE_INTERLEAVED, 2, 4, 0},
    {4, 1, 1, false, NB_PIPE_1F1B, 1, 1, 0},
    {1, 1, 4, false, NB_PIPE_1F1B, 1, 1, 0},
    {2, 1, 2, false, NB_PIPE_1F1B, 1, 1, 0},
    {1, 2, 2, false, NB_PIPE_1F1B, 1, 4, 0},
    {2, 2, 1, false, NB_PIPE_1F1B, 1, 2, 0},
    {1, 4, 1, false, NB_PIPE_1F1B, 1, 4, 0},
    {1, 4, 1, false, NB_PIPE_INTERLEAVED, 1, 4, 0},
    /* sequence parallel */
    {1, 1, 2, true, NB_PIPE_1F1B, 1, 1, 0},
    {2, 1, 2, true, NB_PIPE_1F1B, 1, 1, 0},
    {1, 1, 4, true, NB_PIPE_1F1B, 1, 1, 0},
    {1, 2, 2, true, NB_PIPE_INTERLEAVED, 2, 4, 0},
    /* ZeRO over dp, of plain, tensor- and pipeline-parallel runs */
    {2, 1, 1, false, NB_PIPE_1F1B, 1, 1, 1},
    {2, 1, 1, false, NB_PIPE_1F1B, 1, 1, 2},
    {2, 1, 1, false, NB_PIPE_1F1B, 1, 1, 3},
    {4, 1, 1, false, NB_PIPE_1F1B, 1, 1, 3},
    {2, 1, 2, true, NB_PIPE_1F1B, 1, 1, 1},
    {2, 1, 2, false, NB_PIPE_1F1B, 1, 1, 2},
    {2, 1, 2, false, NB_PIPE_1F1B, 1, 1, 3},
    {2, 2, 1, false, NB_PIPE_1F1B, 1, 2, 1},
    {2, 2, 1, false, NB_PIPE_INTERLEAVED, 2, 2, 2},
    {1, 1, 2, false, NB_PIPE_1F1B, 1, 1, 3},
};

void mt_check_layouts(mt_model *M) { mt_check_layouts_tp(M, 1); }

void mt_check_layouts_tp(mt_model *M, int min_tp) {
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        const mt_layout *L = &layouts[i];
        if (L->dp * L->pp * L->tp != mt_size || L->tp < min_tp) continue;
        char why[512];
        mt_run_layout(M, L, why, sizeof why);
        MT_CHECK(!why[0], "%s", why);
    }
}
