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

/* ---- checkpoints across layouts ------------------------------------------------------------ */
typedef struct trainer {
    nb_topology *topo;
    nb_generator *drop;
    nb_gpt_pipe *pipe;
    nb_optim *opt;
} trainer;

#define CK_DROPOUT 0.1

static nb_optim *sgd(const nb_params *ps) {
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 0.05;
    so.momentum = 0.9;
    so.weight_decay = 0.01;
    return nb_sgd_new(ps, &so);
}

/* A pipeline of tp x pp over base (dp the rest), with dropout; collective over base. */
static bool trainer_new(trainer *t, nb_comm *base, int tp, int pp, nb_pipe_schedule sched,
                        bool sp) {
    *t = (trainer){0};
    nb_topology_opts to = nb_topology_defaults();
    to.tp = tp;
    to.pp = pp;
    t->topo = nb_topology_new(base, &to);
    t->drop = nb_generator_new(3);
    nb_gpt_config c = cfg;
    c.dropout = CK_DROPOUT;
    c.dropout_gen = t->drop;
    nb_gpt_pipe_opts po = nb_gpt_pipe_defaults();
    po.schedule = sched;
    po.n_micro = MICRO;
    po.virtual_stages = sched == NB_PIPE_INTERLEAVED ? 2 : 1;
    po.tp = t->topo ? nb_topology_tp(t->topo) : NULL;
    po.sequence_parallel = sp;
    nb_generator *g = nb_generator_new(11);
    t->pipe = t->topo ? nb_gpt_pipe_new(&c, g, nb_topology_pp(t->topo), nb_topology_dp(t->topo), &po)
                      : NULL;
    nb_generator_free(g);
    t->opt = t->pipe ? sgd(nb_parameters(nb_gpt_pipe_module(t->pipe))) : NULL;
    MT_CHECK(t->opt, "trainer with tp %d pp %d: %s", tp, pp, nb_last_error());
    return t->opt != NULL;
}

static void trainer_free(trainer *t) {
    nb_optim_free(t->opt);
    nb_gpt_pipe_free(t->pipe);
    nb_generator_free(t->drop);
    nb_topology_free(t->topo);
}

#define GLOBAL (4 * MICRO * MB) /* the global batch, whatever the layout */

/* Step `step`'s global batch (the same whatever the layout). */
static void batch(int step, nb_tensor **X, nb_tensor **Y) {
    nb_generator *data = nb_generator_new(100 + (uint64_t)step);
    *X = nb_randint((int64_t[]){GLOBAL, SEQ}, 2, NB_I64, 0, cfg.vocab_size, data);
    *Y = nb_randint((int64_t[]){GLOBAL, SEQ}, 2, NB_I64, 0, cfg.vocab_size, data);
    nb_generator_free(data);
}

static void train_steps(trainer *t, int from, int to, double *losses) {
    nb_comm *dp = nb_topology_dp(t->topo);
    const int64_t B = GLOBAL / nb_comm_size(dp), d = nb_comm_rank(dp);
    for (int step = from; step < to; step++) { /* every rank, every step */
        nb_scope_begin();
        nb_tensor *X, *Y;
        batch(step, &X, &Y);
        losses[step] = nb_gpt_pipe_train_step(t->pipe, t->opt, nb_narrow(X, 0, d * B, B),
                                              nb_narrow(Y, 0, d * B, B), 1.0, NULL, NULL);
        MT_CHECK(!isnan(losses[step]), "step %d: %s", step, nb_last_error());
        nb_scope_end();
    }
}

/* A fresh directory made by rank 0, its name on every rank. */
static void shared_tmpdir(char dir[64]) {
    memset(dir, 0, 64);
    nb_scope_begin();
    nb_tensor *name = nb_zeros((int64_t[]){64}, 1, NB_U8);
    if (mt_rank == 0) {
        char tmpl[] = "/tmp/nb-3d-ckpt-XXXXXX";
        MT_CHECK(mkdtemp(tmpl) != NULL, "mkdtemp failed");
        memcpy(nb_data(name), tmpl, strlen(tmpl));
    }
    MT_OK(nb_broadcast(mt_world, name, 0));
    memcpy(dir, nb_data(name), 63);
    nb_scope_end();
}

static void remove_dir(const char *dir) {
    if (mt_rank != 0) return;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[384];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        remove(path);
    }
    if (d) closedir(d);
    rmdir(dir);
}

/* The pipeline checkpoint d consolidated: a file nb_gpt_load reads, holding ref's weights (to
 * 1e-5) and giving its greedy sample. */
static void check_consolidated(const char *d, nb_module *ref) {
    char file[128];
    snprintf(file, sizeof file, "%s/model-%d.safetensors", d, mt_rank);
    MT_OK(nb_gpt_pipe_consolidate(d, file));
    nb_module *full = nb_gpt_new(&cfg, NULL);
    MT_OK(nb_gpt_load(full, file));
    const nb_params *ps = nb_parameters(ref);
    for (int i = 0; full && i < ps->count; i++) {
        nb_tensor *x = nb_module_find(full, ps->names[i]);
        double dd = x ? tensor_rel_diff(x, ps->tensors[i]) : INFINITY;
        MT_CHECK(dd <= 1e-5, "%s consolidated: %s differs by %g", d, ps->names[i], dd);
    }
    int64_t prompt[3] = {1, 2, 3}, a[12] = {0}, b[12] = {0};
    nb_gpt_sample_opts so = {0}; /* greedy */
    MT_OK(nb_gpt_generate(full, prompt, 3, 12, &so, a));
    MT_OK(nb_gpt_generate(ref, prompt, 3, 12, &so, b));
    MT_CHECK(memcmp(a, b, sizeof a) == 0, "%s: the consolidated model samples otherwise", d);
    nb_module_free(full);
    remove(file);
}

/* Saved at tp 2 x pp 2 (on 4 ranks; tp 2 on 2; 1 process on 1), with sequence parallelism
 * and dropout, once synchronously and once asynchronously; resumed at tp 1 x pp = world, in
 * one process, and (from the asynchronous save) in the saving layout with the interleaved
 * schedule, with the continued losses of the straight run; the tp 1 x pp = world run's save
 * resumed in the saving layout; each consolidated file is the 1-process model of its step
 * (weights to 1e-5, the same greedy sample). */
START_TEST(test_3d_checkpoint_layouts) {
    enum { K = 2 };
    double straight[2 * K + 1] = {0}, resumed[2 * K + 1] = {0};
    char dir[64], adir[64];
    shared_tmpdir(dir);
    shared_tmpdir(adir);
    const int tp = mt_size >= 2 ? 2 : 1, pp = mt_size >= 4 ? 2 : 1;
    trainer t;
    nb_checkpoint_writer *w = nb_checkpoint_writer_new(NULL);
    MT_CHECK(w, "writer: %s", nb_last_error());
    if (trainer_new(&t, mt_world, tp, pp, NB_PIPE_1F1B, tp > 1) && w) {
        train_steps(&t, 0, K, straight);
        MT_OK(nb_gpt_pipe_save(t.pipe, t.opt, dir, K));
        MT_OK(nb_gpt_pipe_save_async(t.pipe, t.opt, w, adir, 0, K));
        train_steps(&t, K, 2 * K, straight); /* the write goes on meanwhile */
        MT_OK(nb_gpt_pipe_save_wait(t.pipe, w));
        train_steps(&t, 2 * K, 2 * K + 1, straight);
    }
    trainer_free(&t);
    MT_OK(nb_checkpoint_writer_free(w));
    nb_comm *self = nb_comm_self();
    nb_comm *bases[3] = {mt_world, self, mt_world};
    const char *dirs[3] = {dir, adir, adir};
    /* dp stays 1 (dropout masks are per micro-batch, whose size dp would change) */
    const int pps[3] = {mt_size, 1, pp}, tps[3] = {1, 1, tp};
    const nb_pipe_schedule scheds[3] = {NB_PIPE_GPIPE, NB_PIPE_1F1B, NB_PIPE_INTERLEAVED};
    for (int k = 0; k < 3; k++) { /* collective: every rank, whatever it recorded */
        if (pps[k] * 2 > cfg.n_layer && scheds[k] == NB_PIPE_INTERLEAVED) continue;
        if (trainer_new(&t, bases[k], tps[k], pps[k], scheds[k], false)) {
            int64_t step = -1;
            MT_OK(nb_gpt_pipe_load(t.pipe, t.opt, dirs[k], &step));
            MT_CHECK(step == K, "resumed at step %lld", (long long)step);
            train_steps(&t, K, 2 * K, resumed);
            for (int s = K; s < 2 * K; s++)
                MT_CHECK(rel_diff(resumed[s], straight[s]) <= 1e-5,
                         "resumed from %s with tp %d pp %d: step %d loss %.9g, straight %.9g",
                         dirs[k] == dir ? "the save" : "the async save", tps[k], pps[k], s,
                         resumed[s], straight[s]);
            /* tp 1 x pp = world saves over the tp 2 x pp 2 checkpoint (its files go) */
            if (k == 0) MT_OK(nb_gpt_pipe_save(t.pipe, t.opt, dir, 2 * K));
        }
        trainer_free(&t);
    }
    /* ... which the saving layout resumes (its slices cut from whole tensors) */
    if (trainer_new(&t, mt_world, tp, pp, NB_PIPE_1F1B, tp > 1)) {
        int64_t step = -1;
        MT_OK(nb_gpt_pipe_load(t.pipe, t.opt, dir, &step));
        MT_CHECK(step == 2 * K, "resumed at step %lld", (long long)step);
        train_steps(&t, 2 * K, 2 * K + 1, resumed);
        MT_CHECK(rel_diff(resumed[2 * K], straight[2 * K]) <= 1e-5,
                 "saved at tp 1 x pp %d, resumed at tp %d x pp %d: loss %.9g, straight %.9g",
                 mt_size, tp, pp, resumed[2 * K], straight[2 * K]);
    }
    trainer_free(&t);
    if (mt_rank == 0) { /* only the new save's files are left */
        int n = 0;
        DIR *d = opendir(dir);
        for (struct dirent *e; d && (e = readdir(d));) n += strncmp(e->d_name, "stage-", 6) == 0;
        if (d) closedir(d);
        MT_CHECK(n == mt_size, "%d stage files after the tp 1 x pp %d save", n, mt_size);
    }
    /* The consolidated files (of the tp 2 x pp 2 save at step K, of the tp 1 x pp = world
     * save at 2K): the plain model nb_gpt_load reads, the 1-process model of that step. */
    nb_generator *g = nb_generator_new(11), *drop = nb_generator_new(3);
    nb_gpt_config c = cfg;
    c.dropout = CK_DROPOUT;
    c.dropout_gen = drop;
    nb_module *ref = nb_gpt_new(&c, g);
    nb_optim *ropt = ref ? sgd(nb_parameters(ref)) : NULL;
    for (int step = 0; step < 2 * K && ropt; step++) {
        nb_scope_begin();
        /* the saving run's micro-batches (dp 1): dropout draws per micro-batch */
        enum { b = GLOBAL / MICRO };
        nb_tensor *X, *Y, *xs[MICRO], *ys[MICRO];
        batch(step, &X, &Y);
        for (int i = 0; i < MICRO; i++) {
            xs[i] = nb_narrow(X, 0, i * b, b);
            ys[i] = nb_narrow(Y, 0, i * b, b);
        }
        double l = nb_gpt_train_step(ref, ropt, NULL, xs, ys, MICRO, 1.0, NULL);
        MT_CHECK(rel_diff(l, straight[step]) <= 1e-5, "1 process step %d: loss %.9g, %.9g",
                 step, l, straight[step]);
        nb_scope_end();
        if (step + 1 == K) check_consolidated(adir, ref);
        if (step + 1 == 2 * K) check_consolidated(dir, ref);
    }
    nb_optim_free(ropt);
    nb_module_free(ref);
    nb_generator_free(g);
    nb_generator_free(drop);
    nb_comm_free(self);
    MT_OK(nb_barrier(mt_world));
    remove_dir(dir);
    remove_dir(adir);
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
    tcase_add_test(tc, test_3d_checkpoint_layouts);
    suite_add_tcase(s, tc);
    return s;
}
