/* test_3d.c - tensor x pipeline parallel GPT (nabla/pipeline.h with nb_gpt_pipe_opts.tp) in
 * one job: at -np 4 tp 2 x pp 2 (at -np 2 tp 2 x pp 1), each schedule, with and without
 * sequence parallelism and dropout, trains with the same losses, grad norms and final
 * weights (gathered over tp) as one process on the global batch, to 1e-5 relative; bad
 * layouts fail on every rank; a checkpoint saved at tp 2 x pp 2 resumes at tp 1 x pp 4 and
 * in one process with the same continued losses, and consolidates into the plain model file
 * whose greedy sample is the 1-process model's. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpi_test.h"
#include "nabla/tp.h"

#define STEPS 3
#define MICRO 4 /* micro-batches per data-parallel rank */
#define MB 2    /* sequences per micro-batch */
#define SEQ 8

static const nb_gpt_config cfg = {.vocab_size = 32, .block_size = SEQ, .n_layer = 4,
                                  .n_head = 2, .n_embd = 16};

static double rel_diff(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-12); }

/* max |a - b| / max |b| over the elements of two same-shape tensors. */
static double tensor_rel_diff(nb_tensor *a, nb_tensor *b) {
    int64_t n = nb_numel(b);
    if (nb_numel(a) != n) return INFINITY;
    double *x = malloc(sizeof *x * (size_t)n), *y = malloc(sizeof *y * (size_t)n);
    double d = INFINITY;
    if (x && y && nb_read(a, x, n, NB_F64) == NB_OK && nb_read(b, y, n, NB_F64) == NB_OK) {
        double num = 0, den = 0;
        for (int64_t i = 0; i < n; i++) {
            num = fmax(num, fabs(x[i] - y[i]));
            den = fmax(den, fabs(y[i]));
        }
        d = num / fmax(den, 1e-12);
    }
    free(x);
    free(y);
    return d;
}

/* The 3D layout the world allows: tp 2 x pp 2 on 4 ranks (and multiples), tp 2 x pp 1 on
 * 2; NULL on 1 rank (nothing to test). */
static nb_topology *layout(int tp, int pp) {
    if (mt_size % (tp * pp)) return NULL;
    nb_topology_opts to = nb_topology_defaults();
    to.tp = tp;
    to.pp = pp;
    nb_topology *t = nb_topology_new(mt_world, &to);
    MT_CHECK(t, "topology tp %d pp %d: %s", tp, pp, nb_last_error());
    return t;
}

/* tp 2 x pp_size (0: 2 on 4 ranks, else 1) x dp (the rest of the world). */
static void check_3d_ex(int pp_size, nb_pipe_schedule sched, int v, bool sp, double dropout) {
    if (pp_size == 0) pp_size = mt_size >= 4 ? 2 : 1;
    nb_topology *topo = mt_size >= 2 * pp_size ? layout(2, pp_size) : NULL;
    if (!topo) {
        MT_END();
        return;
    }
    nb_comm *dp = nb_topology_dp(topo);
    const int dp_size = nb_comm_size(dp), d = nb_comm_rank(dp);
    nb_gpt_pipe_opts po = nb_gpt_pipe_defaults();
    po.schedule = sched;
    po.n_micro = MICRO;
    po.virtual_stages = v;
    po.tp = nb_topology_tp(topo);
    po.sequence_parallel = sp;
    nb_generator *g1 = nb_generator_new(11), *g2 = nb_generator_new(11), *data = nb_generator_new(5);
    nb_generator *d1 = nb_generator_new(3), *d2 = nb_generator_new(3);
    nb_gpt_config c1 = cfg, c2 = cfg;
    c1.dropout = c2.dropout = dropout;
    c1.dropout_gen = d1;
    c2.dropout_gen = d2;
    nb_gpt_pipe *pipe = nb_gpt_pipe_new(&c1, g1, nb_topology_pp(topo), dp, &po);
    nb_module *ref = nb_gpt_new(&c2, g2);
    MT_CHECK(pipe && ref, "build: %s", nb_last_error());
    /* SGD with momentum, as test_pipeline.c (Adam would amplify last-bit differences) */
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 0.05;
    so.momentum = 0.9;
    so.weight_decay = 0.01;
    nb_optim *opt = pipe ? nb_sgd_new(nb_parameters(nb_gpt_pipe_module(pipe)), &so) : NULL;
    nb_optim *ropt = ref ? nb_sgd_new(nb_parameters(ref), &so) : NULL;
    const int64_t G = (int64_t)dp_size * MICRO * MB;
    const char *what = nb_topology_describe(topo);
    for (int step = 0; step < STEPS && opt && ropt; step++) {
        nb_scope_begin();
        nb_tensor *X = nb_randint((int64_t[]){G, SEQ}, 2, NB_I64, 0, cfg.vocab_size, data);
        nb_tensor *Y = nb_randint((int64_t[]){G, SEQ}, 2, NB_I64, 0, cfg.vocab_size, data);
        nb_tensor *xs[64], *ys[64];
        for (int i = 0; i < G / MB; i++) {
            xs[i] = nb_narrow(X, 0, i * MB, MB);
            ys[i] = nb_narrow(Y, 0, i * MB, MB);
        }
        double rnorm = 0, norm = 0;
        double rloss = nb_gpt_train_step(ref, ropt, NULL, xs, ys, (int)(G / MB), 0.5, &rnorm);
        const int64_t B = MICRO * MB;
        nb_pipe_stats s;
        double loss = nb_gpt_pipe_train_step(pipe, opt, nb_narrow(X, 0, d * B, B),
                                             nb_narrow(Y, 0, d * B, B), 0.5, &norm, &s);
        MT_CHECK(!isnan(loss) && !isnan(rloss), "step %d: %s", step, nb_last_error());
        MT_CHECK(rel_diff(loss, rloss) <= 1e-5, "%s %s v %d sp %d dropout %g step %d: loss %.9g "
                 "vs %.9g", what, nb_pipe_schedule_name(sched), v, sp, dropout, step, loss, rloss);
        MT_CHECK(rel_diff(norm, rnorm) <= 1e-5, "%s %s sp %d step %d: grad norm %.9g vs %.9g",
                 what, nb_pipe_schedule_name(sched), sp, step, norm, rnorm);
        nb_scope_end();
    }
    /* The stage's weights, gathered over tp, against the 1-process model's. */
    nb_module *full = nb_gpt_new(&cfg, NULL);
    MT_OK(pipe && full ? nb_gpt_pipe_gather(pipe, full) : NB_EINVAL);
    const nb_params *ps = pipe ? nb_parameters(nb_gpt_pipe_module(pipe)) : NULL;
    for (int i = 0; ps && full && ref && i < ps->count; i++) {
        nb_tensor *w = nb_module_find(full, ps->names[i]), *rw = nb_module_find(ref, ps->names[i]);
        double dd = w && rw ? tensor_rel_diff(w, rw) : INFINITY;
        MT_CHECK(dd <= 1e-5, "%s %s v %d sp %d dropout %g: %s differs by %g (relative)", what,
                 nb_pipe_schedule_name(sched), v, sp, dropout, ps->names[i], dd);
    }
    nb_module_free(full);
    nb_optim_free(opt);
    nb_optim_free(ropt);
    nb_gpt_pipe_free(pipe);
    nb_module_free(ref);
    nb_generator_free(g1);
    nb_generator_free(g2);
    nb_generator_free(data);
    nb_generator_free(d1);
    nb_generator_free(d2);
    nb_topology_free(topo);
    MT_END();
}

static void check_3d(nb_pipe_schedule sched, int v, bool sp, double dropout) {
    check_3d_ex(0, sched, v, sp, dropout);
}

START_TEST(test_3d_gpipe) { check_3d(NB_PIPE_GPIPE, 1, false, 0); }
END_TEST

START_TEST(test_3d_1f1b) { check_3d(NB_PIPE_1F1B, 1, false, 0); }
END_TEST

START_TEST(test_3d_interleaved) { check_3d(NB_PIPE_INTERLEAVED, 2, false, 0); }
END_TEST

/* Sequence parallel: (b, T/tp, C) activations between the stages, partial gradients of the
 * replicated parameters summed over tp. */
START_TEST(test_3d_sequence_parallel) {
    check_3d(NB_PIPE_1F1B, 1, true, 0);
    check_3d(NB_PIPE_GPIPE, 1, true, 0);
    check_3d(NB_PIPE_INTERLEAVED, 2, true, 0);
}
END_TEST

/* Dropout: one process's masks whatever the layout, with and without sequence parallelism. */
START_TEST(test_3d_dropout) {
    check_3d(NB_PIPE_1F1B, 1, false, 0.1);
    check_3d(NB_PIPE_1F1B, 1, true, 0.1);
    check_3d(NB_PIPE_INTERLEAVED, 2, true, 0.1);
}
END_TEST

/* Data parallel too: dp 2 x tp 2 x pp 1 on 4 ranks (dp 1 on 2). */
START_TEST(test_3d_dp) {
    check_3d_ex(1, NB_PIPE_1F1B, 1, true, 0.1);
    check_3d_ex(1, NB_PIPE_GPIPE, 1, false, 0);
}
END_TEST

/* Bad layouts: the same clear error on every rank, before any communication. */
START_TEST(test_3d_bad_layouts) {
    nb_topology *topo = mt_size >= 2 ? layout(2, mt_size >= 4 ? 2 : 1) : NULL;
    if (!topo) {
        MT_END();
        return;
    }
    nb_gpt_pipe_opts po = nb_gpt_pipe_defaults();
    po.tp = nb_topology_tp(topo);
    nb_gpt_config odd = cfg;
    odd.n_head = 1; /* n_embd 16, one head: not split over 2 ranks */
    nb_gpt_pipe *p = nb_gpt_pipe_new(&odd, NULL, nb_topology_pp(topo), nb_topology_dp(topo), &po);
    MT_CHECK(!p && nb_last_status() == NB_EINVAL && strstr(nb_last_error(), "n_head"),
             "1 head over tp 2: %s", nb_last_error());
    nb_gpt_pipe_free(p);
    odd = cfg;
    odd.vocab_size = 33;
    p = nb_gpt_pipe_new(&odd, NULL, nb_topology_pp(topo), nb_topology_dp(topo), &po);
    MT_CHECK(!p && nb_last_status() == NB_EINVAL && strstr(nb_last_error(), "vocab_size"),
             "vocab 33 over tp 2: %s", nb_last_error());
    nb_gpt_pipe_free(p);
    /* sequence parallel with a sequence length that does not divide by tp */
    po.sequence_parallel = true;
    p = nb_gpt_pipe_new(&cfg, NULL, nb_topology_pp(topo), nb_topology_dp(topo), &po);
    MT_CHECK(p != NULL, "build: %s", nb_last_error());
    nb_optim *opt = p ? nb_adamw_new(nb_parameters(nb_gpt_pipe_module(p)), NULL) : NULL;
    nb_scope_begin();
    nb_tensor *x = nb_zeros((int64_t[]){MICRO, SEQ - 1}, 2, NB_I64);
    double loss = opt ? nb_gpt_pipe_train_step(p, opt, x, x, 0, NULL, NULL) : 0;
    MT_CHECK(isnan(loss) && nb_last_status() == NB_ESHAPE && strstr(nb_last_error(), "divide"),
             "sequence 7 over tp 2: %s", nb_last_error());
    nb_scope_end();
    nb_optim_free(opt);
    nb_gpt_pipe_free(p);
    nb_topology_free(topo);
    MT_END();
}
END_TEST

Suite *mt_suite_3d(void) {
    Suite *s = suite_create("3d");
    TCase *tc = tcase_create("tp_x_pp");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_3d_gpipe);
    tcase_add_test(tc, test_3d_1f1b);
    tcase_add_test(tc, test_3d_interleaved);
    tcase_add_test(tc, test_3d_sequence_parallel);
    tcase_add_test(tc, test_3d_dropout);
    tcase_add_test(tc, test_3d_dp);
    tcase_add_test(tc, test_3d_bad_layouts);
    suite_add_tcase(s, tc);
    return s;
}
