/* test_parallel_gpt.c - the one GPT made parallel by its plan and its split (nb_gpt_parallelize,
 * nb_gpt_pipeline_new) equals one process, in nabla_mpi_tests (1, 2 and 4 ranks, and alone).
 *
 * Every layout the world size allows (dp x pp x tp, with and without sequence parallelism, each
 * pipeline schedule, ZeRO over dp) trains K AdamW steps on the same global batches as one
 * process: the losses and the first step's gradient norm agree to 1e-5 relative, and every
 * parameter this rank holds ends as close to its part of the one-process parameter as the f32
 * drift of one process allows. That bound is measured, not guessed: the one-process run is
 * repeated with each batch split into 2 and into 4 accumulated micro-batches (the same
 * arithmetic in another order), the largest difference any parameter shows is the drift, and
 * a layout's parameters may differ at most 8 times as far, as float reassociation of the
 * gradient sums is all that differs between layouts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_test.h"
#include "parallel/mesh_impl.h"

enum { K = 3, B = 8, T = 16 };

static nb_gpt_config config(void) {
    nb_gpt_config cfg = nb_gpt_config_defaults();
    cfg.vocab_size = 64, cfg.block_size = T, cfg.n_layer = 4, cfg.n_head = 4, cfg.n_embd = 32;
    return cfg;
}

static nb_optim *adamw(nb_module *m) {
    nb_adamw_opts ao = nb_adamw_defaults();
    ao.lr = 1e-2;
    return nb_adamw_new(nb_parameters(m), &ao);
}

/* The global batches: the same on every rank. */
static void batch(int step, nb_tensor **x, nb_tensor **y) {
    nb_generator *g = nb_generator_new(100 + (uint64_t)step);
    *x = nb_randint((int64_t[]){B, T}, 2, NB_I64, 0, 64, g);
    *y = nb_randint((int64_t[]){B, T}, 2, NB_I64, 0, 64, g);
    nb_generator_free(g);
}

typedef struct reference {
    nb_module *m;        /* after K steps */
    double loss[K], norm0;
    double drift;        /* the largest difference of a parameter between m and the same run
                          * with 2 or 4 accumulated micro-batches per step */
} reference;

static reference ref;

static void train_reference(nb_module **out, double *losses, double *norm0, int micro) {
    nb_gpt_config c = config();
    nb_generator *init = nb_generator_new(7);
    nb_module *m = nb_gpt_new(&c, init);
    nb_generator_free(init);
    nb_optim *opt = adamw(m);
    for (int s = 0; s < K; s++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        batch(s, &x, &y);
        nb_tensor *xs[4], *ys[4];
        for (int i = 0; i < micro; i++) {
            xs[i] = nb_narrow(x, 0, B / micro * i, B / micro);
            ys[i] = nb_narrow(y, 0, B / micro * i, B / micro);
        }
        double norm;
        double l = nb_gpt_train_step(m, opt, NULL, xs, ys, micro, 0, &norm);
        if (losses) losses[s] = l;
        if (s == 0 && norm0) *norm0 = norm;
        nb_scope_end();
    }
    nb_optim_free(opt);
    *out = m;
}

static double part_diff(nb_tensor *t, nb_tensor *whole);

static const reference *get_ref(void) {
    if (!ref.m) {
        train_reference(&ref.m, ref.loss, &ref.norm0, 1);
        for (int micro = 2; micro <= 4; micro *= 2) {
            nb_module *m2;
            train_reference(&m2, NULL, NULL, micro);
            const nb_params *a = nb_parameters(ref.m), *b = nb_parameters(m2);
            for (int i = 0; i < a->count; i++) {
                double d = part_diff(b->tensors[i], a->tensors[i]);
                if (d > ref.drift) ref.drift = d;
            }
            nb_module_free(m2);
        }
    }
    return &ref;
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

typedef struct layout {
    int dp, pp, tp;
    bool sp;
    nb_pipe_schedule sched;
    int v, micro, zero;
} layout;

static void describe(const layout *L, char *buf, size_t n) {
    snprintf(buf, n, "dp %d pp %d tp %d%s%s%s v %d zero %d", L->dp, L->pp, L->tp, L->sp ? " sp" : "",
             L->pp > 1 ? " " : "", L->pp > 1 ? nb_pipe_schedule_name(L->sched) : "", L->v,
             L->zero);
}

/* Train layout L and compare with one process; the first difference goes into why (empty:
 * everything matched). Every rank runs every step whatever it finds, so the collectives stay
 * paired. */
static void run_layout(const layout *L, char *why, size_t n) {
    const reference *R = get_ref();
    char what[128];
    describe(L, what, sizeof what);
    why[0] = '\0';
#define DIFF(...)                                                                          \
    do {                                                                                   \
        if (!why[0]) snprintf(why, n, __VA_ARGS__);                                        \
    } while (0)
    nb_mesh *mesh = nb_mesh_new(mt_world, "dp pp tp", (int[]){L->dp, L->pp, L->tp});
    if (!mesh) {
        DIFF("%s: mesh: %s", what, nb_last_error());
        return;
    }
    nb_gpt_config c = config();
    nb_generator *init = nb_generator_new(7);
    nb_module *m = nb_gpt_new(&c, init);
    nb_generator_free(init);
    nb_parallelize_opts po = nb_parallelize_defaults();
    po.sequence_parallel = L->sp;
    if (nb_gpt_parallelize(m, mesh, &po) != NB_OK) DIFF("%s: plan: %s", what, nb_last_error());
    nb_pipeline *pipe = NULL;
    nb_module *mod = m;
    if (L->pp > 1) {
        nb_pipeline_opts pio = nb_pipeline_defaults();
        pio.schedule = L->sched;
        pio.n_micro = L->micro;
        pio.virtual_stages = L->v;
        if (!(pipe = nb_gpt_pipeline_new(m, mesh, &pio))) DIFF("%s: pipeline: %s", what, nb_last_error());
        mod = pipe ? nb_pipeline_module(pipe) : NULL;
    }
    nb_optim *opt = mod ? adamw(mod) : NULL;
    nb_ddp *ddp = NULL;
    nb_zero *z = NULL;
    nb_comm *dp = nb_mesh_group(mesh, "dp");
    if (opt && (L->dp > 1 || L->zero || L->sp)) { /* the reducer (sp: its partial sums) */
        if (L->zero) {
            nb_zero_opts zo = nb_zero_defaults();
            zo.stage = L->zero;
            if (!(z = nb_zero_new(mod, opt, dp, &zo))) DIFF("%s: zero: %s", what, nb_last_error());
        } else if (!(ddp = nb_ddp_new(mod, dp, NULL))) {
            DIFF("%s: ddp: %s", what, nb_last_error());
        }
    }
    const int dr = nb_mesh_rank(mesh, "dp"), rows = B / L->dp;
    for (int s = 0; opt && s < K; s++) {
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
        double loss = nb_mean_over_ranks(dp, nb_gpt_train_step_ex(m, opt, &x, &y, 1, &so, &norm));
        if (!(fabs(loss - R->loss[s]) <= 1e-5 * fabs(R->loss[s])))
            DIFF("%s: step %d loss %.9g, one process %.9g (%s)", what, s, loss, R->loss[s],
                 nb_last_error());
        if (s == 0 && !(fabs(norm - R->norm0) <= 1e-5 * R->norm0))
            DIFF("%s: first gradient norm %.9g, one process %.9g", what, norm, R->norm0);
        nb_scope_end();
    }
    if (z) nb_zero_free(z);
    /* every parameter this rank holds: its part of the one-process parameter */
    const nb_params *ps = mod ? nb_parameters(mod) : NULL;
    for (int i = 0; ps && i < ps->count; i++) {
        const double d = part_diff(ps->tensors[i], nb_module_find(R->m, ps->names[i]));
        if (!(d <= 8 * R->drift))
            DIFF("%s: %s differs by %g from one process (one process's own drift %g)", what,
                 ps->names[i], d, R->drift);
    }
#undef DIFF
    nb_clear_error();
    nb_ddp_free(ddp);
    nb_optim_free(opt);
    nb_pipeline_free(pipe);
    nb_module_free(m);
    nb_mesh_free(mesh);
}

/* Whether any rank found a difference (collective over the world). */
static bool any_rank(bool mine) {
    nb_scope_begin();
    nb_tensor *t = nb_full((int64_t[]){1}, 1, NB_I32, mine ? 1 : 0);
    bool any = nb_allreduce(mt_world, t, NB_REDUCE_MAX) == NB_OK ? nb_item_i64(t) != 0 : true;
    nb_scope_end();
    return any;
}

/* The layouts of the world size (dp x pp x tp = mt_size). */
static const layout layouts[] = {
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
    {2, 2, 1, false, NB_PIPE_1F1B, 1, 2, 1},
    {2, 2, 1, false, NB_PIPE_INTERLEAVED, 2, 2, 2},
    {1, 1, 2, false, NB_PIPE_1F1B, 1, 1, 3},
};

START_TEST(test_gpt_layouts) {
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        const layout *L = &layouts[i];
        if (L->dp * L->pp * L->tp != mt_size) continue;
        char why[512];
        run_layout(L, why, sizeof why);
        MT_CHECK(!why[0], "%s", why);
    }
    MT_END();
}
END_TEST

/* Each rule of the parallel layer is needed: with it switched off, a layout that depends on it
 * no longer equals one process. */
static void knock_out(const char *what, const layout *L) {
    if (L->dp * L->pp * L->tp != mt_size) return;
    char why[512], name[128];
    nb__test_knockout(what);
    run_layout(L, why, sizeof why);
    nb__test_knockout(NULL);
    describe(L, name, sizeof name);
    MT_CHECK(any_rank(why[0] != 0), "%s: with \"%s\" switched off it still equals one process",
             name, what);
}

START_TEST(test_gpt_rules_needed) {
    /* the tied embedding's gradient is the sum of the first and the last stage's */
    knock_out("tie-sum", &(layout){1, 2, 1, false, NB_PIPE_1F1B, 1, 4, 0});
    /* a replicated parameter counted on every tp rank inflates the norm */
    knock_out("count-once", &(layout){1, 1, 2, false, NB_PIPE_1F1B, 1, 1, 0});
    knock_out("count-once", &(layout){1, 1, 4, false, NB_PIPE_1F1B, 1, 1, 0});
    /* the sequence-parallel partial gradients (layer norms, row-wise biases) need their sum */
    knock_out("partial-sum", &(layout){1, 1, 2, true, NB_PIPE_1F1B, 1, 1, 0});
    knock_out("partial-sum", &(layout){2, 1, 2, true, NB_PIPE_1F1B, 1, 1, 0});
    MT_END();
}
END_TEST

Suite *mt_suite_parallel_gpt(void) {
    Suite *s = suite_create("parallel_gpt");
    TCase *tc = tcase_create("layouts");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_gpt_layouts);
    tcase_add_test(tc, test_gpt_rules_needed);
    suite_add_tcase(s, tc);
    return s;
}
