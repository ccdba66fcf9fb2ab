/* test_pipeline.c - pipeline parallelism (nabla/pipeline.h): every layout the world size
 * allows (pp = 1, 2, 4; dp x pp = 2 x 2; each schedule) trains the GPT for a few steps with
 * the same losses and the same final weights as one process on the global batch
 * (nb_gpt_train_step over the same micro-batches), to 1e-5 relative; bad layouts fail on
 * every rank before any work; checkpoints resume across layouts, and an asynchronous save's
 * index appears only once every rank's file is durable, the previous one whole until then. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpi_test.h"

#define STEPS 3
#define MICRO 4 /* micro-batches per data-parallel rank */
#define MB 2    /* sequences per micro-batch */
#define SEQ 8

static const nb_gpt_config cfg = {.vocab_size = 32, .block_size = SEQ, .n_layer = 8,
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

/* Train with pp ranks per pipeline (consecutive world ranks) and world / pp data-parallel
 * replicas; compare with one process on the global batch. */
static void check_layout_ex(int pp_size, nb_pipe_schedule sched, int v, double dropout) {
    const int dp_size = mt_size / pp_size, r = mt_rank;
    nb_comm *pp = nb_comm_split(mt_world, r / pp_size, r);
    nb_comm *dp = nb_comm_split(mt_world, r % pp_size, r);
    MT_CHECK(pp && dp, "split: %s", nb_last_error());
    if (!pp || !dp) {
        nb_comm_free(pp);
        nb_comm_free(dp);
        MT_END();
        return;
    }
    const int d = nb_comm_rank(dp);
    nb_gpt_pipe_opts po = nb_gpt_pipe_defaults();
    po.schedule = sched;
    po.n_micro = MICRO;
    po.virtual_stages = v;
    nb_generator *g1 = nb_generator_new(11), *g2 = nb_generator_new(11), *data = nb_generator_new(5);
    /* dropout: each side its own stream of the same seed */
    nb_generator *d1 = nb_generator_new(3), *d2 = nb_generator_new(3);
    nb_gpt_config c1 = cfg, c2 = cfg;
    c1.dropout = c2.dropout = dropout;
    c1.dropout_gen = d1;
    c2.dropout_gen = d2;
    nb_gpt_pipe *pipe = nb_gpt_pipe_new(&c1, g1, pp, dp, &po);
    nb_module *ref = nb_gpt_new(&c2, g2);
    MT_CHECK(pipe && ref, "build: %s", nb_last_error());
    /* SGD with momentum: Adam divides by sqrt(v), so elements whose gradient is near zero
     * turn the last-bit differences of a different summation order (the dp average, the
     * tied embedding's sum) into differences of up to lr: a weight comparison would measure
     * Adam's conditioning, not the pipeline. The losses and norms are checked either way. */
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 0.05;
    so.momentum = 0.9;
    so.weight_decay = 0.01;
    nb_optim *opt = pipe ? nb_sgd_new(nb_parameters(nb_gpt_pipe_module(pipe)), &so) : NULL;
    nb_optim *ropt = ref ? nb_sgd_new(nb_parameters(ref), &so) : NULL;
    const int64_t G = (int64_t)dp_size * MICRO * MB; /* the global batch */
    /* every rank runs every step (a rank that stopped at its own failure would leave the
     * others waiting); the checks only record */
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
        nb_pipe_stats s;
        const int64_t B = MICRO * MB;
        double loss = nb_gpt_pipe_train_step(pipe, opt, nb_narrow(X, 0, d * B, B),
                                             nb_narrow(Y, 0, d * B, B), 0.5, &norm, &s);
        MT_CHECK(!isnan(loss) && !isnan(rloss), "step %d: %s", step, nb_last_error());
        MT_CHECK(rel_diff(loss, rloss) <= 1e-5, "pp %d %s v %d step %d: loss %.9g vs %.9g",
                 pp_size, nb_pipe_schedule_name(sched), v, step, loss, rloss);
        MT_CHECK(rel_diff(norm, rnorm) <= 1e-5, "pp %d %s step %d: grad norm %.9g vs %.9g",
                 pp_size, nb_pipe_schedule_name(sched), step, norm, rnorm);
        MT_CHECK(s.bubble >= 0 && s.bubble < 1 && s.peak_live_micro >= 1 &&
                     s.peak_live_micro <= MICRO * v,
                 "stats: bubble %g, peak %lld", s.bubble, (long long)s.peak_live_micro);
        /* The schedules' memory: GPipe holds every micro-batch's activations, 1F1B at most
         * p - r on rank r (its warm-up plus one). */
        const int pr = nb_comm_rank(pp);
        if (sched == NB_PIPE_GPIPE)
            MT_CHECK(s.peak_live_micro == (int64_t)MICRO * v, "gpipe held %lld micro-batches",
                     (long long)s.peak_live_micro);
        if (sched == NB_PIPE_1F1B)
            MT_CHECK(s.peak_live_micro == (pp_size - pr < MICRO ? pp_size - pr : MICRO),
                     "1f1b on stage %d of %d held %lld micro-batches", pr, pp_size,
                     (long long)s.peak_live_micro);
        MT_CHECK(fabs(s.bubble_theory - nb_pipe_bubble_theory(sched, pp_size, MICRO, v)) < 1e-12,
                 "bubble_theory %g", s.bubble_theory);
        nb_scope_end();
    }
    /* This rank's weights against the same names in the single-process model. */
    const nb_params *ps = pipe ? nb_parameters(nb_gpt_pipe_module(pipe)) : NULL;
    for (int i = 0; ps && ref && i < ps->count && !mt_failed(); i++) {
        nb_tensor *w = nb_module_find(ref, ps->names[i]);
        MT_CHECK(w, "the full model has no %s", ps->names[i]);
        double dd = w ? tensor_rel_diff(ps->tensors[i], w) : INFINITY;
        MT_CHECK(dd <= 1e-5, "pp %d %s v %d: %s differs by %g (relative)", pp_size,
                 nb_pipe_schedule_name(sched), v, ps->names[i], dd);
    }
    nb_optim_free(opt);
    nb_optim_free(ropt);
    nb_gpt_pipe_free(pipe);
    nb_module_free(ref);
    nb_generator_free(g1);
    nb_generator_free(g2);
    nb_generator_free(data);
    nb_generator_free(d1);
    nb_generator_free(d2);
    nb_comm_free(pp);
    nb_comm_free(dp);
    MT_END();
}

static void check_layout(int pp_size, nb_pipe_schedule sched, int v) {
    check_layout_ex(pp_size, sched, v, 0);
}

START_TEST(test_pipe_gpipe) { check_layout(mt_size, NB_PIPE_GPIPE, 1); }
END_TEST

START_TEST(test_pipe_1f1b) { check_layout(mt_size, NB_PIPE_1F1B, 1); }
END_TEST

START_TEST(test_pipe_interleaved) { check_layout(mt_size, NB_PIPE_INTERLEAVED, 2); }
END_TEST

/* dp x pp: 2 x 2 on 4 ranks, 2 x 1 (data parallel only) on 2. */
START_TEST(test_pipe_dp_x_pp) {
    if (mt_size < 2) return;
    check_layout(mt_size / 2, NB_PIPE_1F1B, 1);
    check_layout(mt_size / 2, NB_PIPE_GPIPE, 1);
    check_layout(mt_size / 2, NB_PIPE_INTERLEAVED, 2);
}
END_TEST

/* Dropout: the stages put their stream where one process would be, so the masks, and the
 * losses and weights, are the same as one process's whatever the layout. */
START_TEST(test_pipe_dropout) {
    check_layout_ex(mt_size, NB_PIPE_1F1B, 1, 0.1);
    check_layout_ex(mt_size, NB_PIPE_INTERLEAVED, 2, 0.1);
    if (mt_size >= 2) check_layout_ex(mt_size / 2, NB_PIPE_GPIPE, 1, 0.1); /* with dp 2 */
}
END_TEST

/* balance_params: with a vocabulary of 512 (wte is 2.5 blocks) on 4 stages, the first and
 * last stage get one block each and the middle ones three (even: 2 each, the largest stage
 * 14880 parameters instead of 11600); the step still equals one process's. */
START_TEST(test_pipe_balance) {
    nb_gpt_config big = cfg;
    big.vocab_size = 512;
    nb_gpt_pipe_opts po = nb_gpt_pipe_defaults();
    po.balance_params = true;
    nb_generator *g1 = nb_generator_new(4), *g2 = nb_generator_new(4);
    nb_gpt_pipe *p = nb_gpt_pipe_new(&big, g1, mt_world, NULL, &po);
    nb_module *ref = nb_gpt_new(&big, g2);
    MT_CHECK(p && ref, "build: %s", nb_last_error());
    int S = 0;
    const int64_t *b = p ? nb_gpt_pipe_boundaries(p, &S) : NULL;
    const int64_t want[3][5] = {{0, 8}, {0, 4, 8}, {0, 1, 4, 7, 8}};
    const int w = mt_size == 4 ? 2 : mt_size - 1;
    for (int s = 0; b && s <= S; s++)
        MT_CHECK(b[s] == want[w][s], "%d stages: boundary %d is %lld, expected %lld", S, s,
                 (long long)b[s], (long long)want[w][s]);
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 0.1;
    nb_optim *opt = p ? nb_sgd_new(nb_parameters(nb_gpt_pipe_module(p)), &so) : NULL;
    nb_optim *ropt = ref ? nb_sgd_new(nb_parameters(ref), &so) : NULL;
    nb_scope_begin();
    nb_tensor *x = nb_randint((int64_t[]){MICRO * MB, SEQ}, 2, NB_I64, 0, 512, g1);
    nb_tensor *xs[MICRO];
    for (int i = 0; i < MICRO; i++) xs[i] = nb_narrow(x, 0, i * MB, MB);
    double l = opt ? nb_gpt_pipe_train_step(p, opt, x, x, 0, NULL, NULL) : NAN;
    double rl = ropt ? nb_gpt_train_step(ref, ropt, NULL, xs, xs, MICRO, 0, NULL) : NAN;
    MT_CHECK(rel_diff(l, rl) <= 1e-5, "balanced split: loss %.9g vs %.9g", l, rl);
    nb_scope_end();
    nb_optim_free(opt);
    nb_optim_free(ropt);
    nb_gpt_pipe_free(p);
    nb_module_free(ref);
    nb_generator_free(g1);
    nb_generator_free(g2);
    MT_END();
}
END_TEST

/* Bad layouts: the same clear error on every rank, before any communication. */
START_TEST(test_pipe_bad_layouts) {
    nb_gpt_config small = cfg;
    small.n_layer = mt_size; /* one layer a stage is fine, fewer is not */
    nb_gpt_pipe_opts po = nb_gpt_pipe_defaults();
    po.schedule = NB_PIPE_INTERLEAVED;
    po.virtual_stages = 2;
    nb_gpt_pipe *p = nb_gpt_pipe_new(&small, NULL, mt_world, NULL, &po);
    MT_CHECK(!p && nb_last_status() == NB_EINVAL && strstr(nb_last_error(), "layers"),
             "too few layers: %s", nb_last_error());
    nb_gpt_pipe_free(p);
    po = nb_gpt_pipe_defaults();
    po.virtual_stages = 2; /* 1f1b */
    p = nb_gpt_pipe_new(&cfg, NULL, mt_world, NULL, &po);
    MT_CHECK(!p && strstr(nb_last_error(), "interleaved"), "v without interleaved: %s",
             nb_last_error());
    nb_gpt_pipe_free(p);
    po = nb_gpt_pipe_defaults();
    int64_t bad[5] = {0, 3, 3, 5, 8}; /* an empty stage (or, on fewer ranks, not ending at 8) */
    po.boundaries = bad;
    p = nb_gpt_pipe_new(&cfg, NULL, mt_world, NULL, &po);
    MT_CHECK(!p && strstr(nb_last_error(), "boundaries"), "bad boundaries: %s", nb_last_error());
    nb_gpt_pipe_free(p);
    po = nb_gpt_pipe_defaults();
    po.n_micro = 3;
    p = nb_gpt_pipe_new(&cfg, NULL, mt_world, NULL, &po);
    MT_CHECK(p != NULL, "build: %s", nb_last_error());
    nb_optim *opt = p ? nb_adamw_new(nb_parameters(nb_gpt_pipe_module(p)), NULL) : NULL;
    nb_scope_begin();
    nb_tensor *x = nb_zeros((int64_t[]){8, SEQ}, 2, NB_I64);
    double loss = opt ? nb_gpt_pipe_train_step(p, opt, x, x, 0, NULL, NULL) : 0;
    MT_CHECK(isnan(loss) && nb_last_status() == NB_EINVAL && strstr(nb_last_error(), "divide"),
             "3 micro-batches of 8: %s", nb_last_error());
    nb_scope_end();
    nb_optim_free(opt);
    nb_gpt_pipe_free(p);
    MT_END();
}
END_TEST

/* ---- checkpoints across layouts ----------------------------------------------------------- */
typedef struct trainer {
    nb_comm *pp, *dp;
    nb_gpt_pipe *pipe;
    nb_optim *opt;
} trainer;

static bool trainer_new(trainer *t, nb_comm *base, int pp_size, nb_pipe_schedule sched) {
    const int r = nb_comm_rank(base);
    *t = (trainer){0};
    t->pp = nb_comm_split(base, r / pp_size, r);
    t->dp = nb_comm_split(base, r % pp_size, r);
    nb_gpt_pipe_opts po = nb_gpt_pipe_defaults();
    po.schedule = sched;
    po.n_micro = MICRO;
    nb_generator *g = nb_generator_new(11);
    t->pipe = t->pp && t->dp ? nb_gpt_pipe_new(&cfg, g, t->pp, t->dp, &po) : NULL;
    nb_generator_free(g);
    nb_adam_opts ao = nb_adam_defaults();
    ao.lr = 1e-2;
    t->opt = t->pipe ? nb_adamw_new(nb_parameters(nb_gpt_pipe_module(t->pipe)), &ao) : NULL;
    MT_CHECK(t->opt, "trainer with pp %d: %s", pp_size, nb_last_error());
    return t->opt != NULL;
}

static void trainer_free(trainer *t) {
    nb_optim_free(t->opt);
    nb_gpt_pipe_free(t->pipe);
    nb_comm_free(t->pp);
    nb_comm_free(t->dp);
}

/* Steps [from, to) of the data stream (the same global batches whatever the layout). */
static void train_steps(trainer *t, int from, int to, double *losses) {
    const int dp_size = nb_comm_size(t->dp), d = nb_comm_rank(t->dp);
    const int64_t B = (int64_t)MICRO * MB * 4 / dp_size; /* global batch 4 * MICRO * MB */
    for (int step = from; step < to; step++) { /* every rank, every step */
        nb_scope_begin();
        nb_generator *data = nb_generator_new(100 + (uint64_t)step);
        nb_tensor *X = nb_randint((int64_t[]){B * dp_size, SEQ}, 2, NB_I64, 0, cfg.vocab_size, data);
        nb_tensor *Y = nb_randint((int64_t[]){B * dp_size, SEQ}, 2, NB_I64, 0, cfg.vocab_size, data);
        nb_generator_free(data);
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
        char tmpl[] = "/tmp/nb-pipe-ckpt-XXXXXX";
        MT_CHECK(mkdtemp(tmpl) != NULL, "mkdtemp failed");
        memcpy(nb_data(name), tmpl, strlen(tmpl));
    }
    MT_OK(nb_broadcast(mt_world, name, 0));
    memcpy(dir, nb_data(name), 63);
    nb_scope_end();
}

/* Rank 0: the directory's files, then itself. */
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

/* Saved with pp = 2 (dp = world / 2), resumed with pp = world and in one process (pp = 1 on
 * nb_comm_self): the continued losses are those of the straight run; the consolidated model
 * file loads into nb_gpt_new's model with the trained weights. */
START_TEST(test_pipe_checkpoint_layouts) {
    enum { K = 2 };
    double straight[2 * K] = {0}, resumed[2 * K] = {0};
    char dir[64];
    shared_tmpdir(dir);
    const int save_pp = mt_size >= 2 ? 2 : 1;
    trainer t;
    if (trainer_new(&t, mt_world, save_pp, NB_PIPE_1F1B)) {
        train_steps(&t, 0, K, straight);
        MT_OK(nb_gpt_pipe_save(t.pipe, t.opt, dir, K));
        train_steps(&t, K, 2 * K, straight);
    }
    trainer_free(&t);
    nb_comm *self = nb_comm_self();
    nb_comm *layouts[2] = {mt_world, self};
    const int pps[2] = {mt_size, 1};
    for (int k = 0; k < 2; k++) { /* collective: every rank, whatever it recorded */
        if (trainer_new(&t, layouts[k], pps[k], k ? NB_PIPE_GPIPE : NB_PIPE_INTERLEAVED)) {
            int64_t step = -1;
            MT_OK(nb_gpt_pipe_load(t.pipe, t.opt, dir, &step));
            MT_CHECK(step == K, "resumed at step %lld", (long long)step);
            train_steps(&t, K, 2 * K, resumed);
            for (int s = K; s < 2 * K; s++)
                MT_CHECK(rel_diff(resumed[s], straight[s]) <= 1e-5,
                         "resumed with pp %d: step %d loss %.9g, straight %.9g", pps[k], s,
                         resumed[s], straight[s]);
        }
        trainer_free(&t);
    }
    /* The consolidated file is the plain model nb_gpt_load reads. */
    char file[128];
    snprintf(file, sizeof file, "%s/model-%d.safetensors", dir, mt_rank);
    MT_OK(nb_gpt_pipe_consolidate(dir, file));
    nb_module *full = nb_gpt_new(&cfg, NULL);
    MT_OK(nb_gpt_load(full, file));
    if (trainer_new(&t, self, 1, NB_PIPE_1F1B)) {
        MT_OK(nb_gpt_pipe_load(t.pipe, t.opt, dir, NULL));
        const nb_params *ps = nb_parameters(nb_gpt_pipe_module(t.pipe));
        for (int i = 0; i < ps->count; i++) {
            nb_tensor *w = nb_module_find(full, ps->names[i]);
            MT_CHECK(w && tensor_rel_diff(ps->tensors[i], w) == 0, "%s differs after consolidation",
                     ps->names[i]);
        }
    }
    trainer_free(&t);
    nb_module_free(full);
    nb_comm_free(self);
    remove(file);
    MT_OK(nb_barrier(mt_world));
    remove_dir(dir);
    MT_END();
}
END_TEST

/* A checkpoint in the layout before per-save file names (stage-<r>-of-<P>.safetensors, an
 * index without "stage.<r>" keys) still loads and continues the straight run. */
START_TEST(test_pipe_checkpoint_old_names) {
    enum { K = 2 };
    double straight[2 * K] = {0}, resumed[2 * K] = {0};
    char dir[64];
    shared_tmpdir(dir);
    const int save_pp = mt_size >= 2 ? 2 : 1;
    trainer t;
    if (trainer_new(&t, mt_world, save_pp, NB_PIPE_1F1B)) {
        train_steps(&t, 0, K, straight);
        MT_OK(nb_gpt_pipe_save(t.pipe, t.opt, dir, K));
        train_steps(&t, K, 2 * K, straight);
    }
    trainer_free(&t);
    MT_OK(nb_barrier(mt_world));
    if (mt_rank == 0) { /* rewrite it as the old code wrote it */
        DIR *d = opendir(dir);
        int renamed = 0;
        for (struct dirent *e; d && (e = readdir(d));) {
            int r, P;
            if (sscanf(e->d_name, "stage-%*16[0-9a-f]-%d-of-%d.safetensors", &r, &P) != 2) continue;
            char from[384], to[384];
            snprintf(from, sizeof from, "%s/%s", dir, e->d_name);
            snprintf(to, sizeof to, "%s/stage-%d-of-%d.safetensors", dir, r, P);
            renamed += rename(from, to) == 0;
        }
        if (d) closedir(d);
        MT_CHECK(renamed == save_pp, "%d stage files renamed, not %d", renamed, save_pp);
        char ip[128], stages[16], steps[16];
        snprintf(ip, sizeof ip, "%s/index.safetensors", dir);
        snprintf(stages, sizeof stages, "%d", save_pp);
        snprintf(steps, sizeof steps, "%d", K);
        const char *keys[] = {"format", "pipe_stages", "step"}, *vals[] = {"nabla-pipe", stages, steps};
        MT_OK(nb_safetensors_save(ip, NULL, NULL, 0, keys, vals, 3));
    }
    MT_OK(nb_barrier(mt_world));
    if (trainer_new(&t, mt_world, mt_size, NB_PIPE_GPIPE)) {
        int64_t step = -1;
        MT_OK(nb_gpt_pipe_load(t.pipe, t.opt, dir, &step));
        MT_CHECK(step == K, "resumed at step %lld", (long long)step);
        train_steps(&t, K, 2 * K, resumed);
        for (int s = K; s < 2 * K; s++)
            MT_CHECK(rel_diff(resumed[s], straight[s]) <= 1e-5,
                     "old names: step %d loss %.9g, straight %.9g", s, resumed[s], straight[s]);
    }
    trainer_free(&t);
    MT_OK(nb_barrier(mt_world));
    remove_dir(dir);
    MT_END();
}
END_TEST

/* The number of dir's stage files (stage-*). */
static int stage_files(const char *dir) {
    int n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) n += strncmp(e->d_name, "stage-", 6) == 0;
    if (d) closedir(d);
    return n;
}

static bool has_index(const char *dir) {
    char path[128];
    snprintf(path, sizeof path, "%s/index.safetensors", dir);
    return access(path, F_OK) == 0;
}

/* nb_gpt_pipe_save_async: the index is written only after every rank's stage file is
 * durable (at the next save or at _save_wait), never at the save itself; a second save into
 * the same directory leaves the first checkpoint whole (its index, its files: it loads and
 * continues the straight run) until the new index replaces it, then the older files go. */
START_TEST(test_pipe_checkpoint_async) {
    enum { K = 2 };
    double straight[3 * K] = {0}, resumed[3 * K] = {0};
    char dir[64];
    shared_tmpdir(dir);
    const int save_pp = mt_size >= 2 ? 2 : 1;
    trainer t, t2;
    nb_checkpoint_writer *w = nb_checkpoint_writer_new(NULL);
    MT_CHECK(w, "writer: %s", nb_last_error());
    if (trainer_new(&t, mt_world, save_pp, NB_PIPE_1F1B) && w) {
        train_steps(&t, 0, K, straight);
        MT_OK(nb_gpt_pipe_save_async(t.pipe, t.opt, w, dir, 0, K));
        MT_OK(nb_barrier(mt_world));
        MT_CHECK(!has_index(dir), "the index exists before the ranks agreed on their files");
        train_steps(&t, K, 2 * K, straight); /* the write goes on meanwhile */
        MT_OK(nb_gpt_pipe_save_wait(t.pipe, w));
        MT_OK(nb_barrier(mt_world));
        MT_CHECK(has_index(dir), "no index after nb_gpt_pipe_save_wait");
        train_steps(&t, 2 * K, 3 * K, straight);
        /* the second save, in flight: the first checkpoint is the one there */
        MT_OK(nb_gpt_pipe_save_async(t.pipe, t.opt, w, dir, 0, 3 * K));
        MT_OK(nb_barrier(mt_world));
        if (trainer_new(&t2, mt_world, mt_size, NB_PIPE_GPIPE)) {
            int64_t step = -1;
            MT_OK(nb_gpt_pipe_load(t2.pipe, t2.opt, dir, &step));
            MT_CHECK(step == K, "during the second save the checkpoint is at step %lld, not %d",
                     (long long)step, K);
            train_steps(&t2, K, 2 * K, resumed);
            for (int s = K; s < 2 * K; s++)
                MT_CHECK(rel_diff(resumed[s], straight[s]) <= 1e-5,
                         "resumed: step %d loss %.9g, straight %.9g", s, resumed[s], straight[s]);
        }
        trainer_free(&t2);
        MT_OK(nb_gpt_pipe_save_wait(t.pipe, w));
        MT_OK(nb_gpt_pipe_save_wait(t.pipe, w)); /* nothing in flight: nothing to do */
        MT_OK(nb_barrier(mt_world));
        MT_CHECK(stage_files(dir) == save_pp, "%d stage files after the second save, not %d",
                 stage_files(dir), save_pp);
        int64_t step = -1;
        MT_OK(nb_gpt_pipe_load(t.pipe, t.opt, dir, &step));
        MT_CHECK(step == 3 * K, "after the second save the checkpoint is at step %lld",
                 (long long)step);
    }
    trainer_free(&t);
    MT_OK(nb_checkpoint_writer_free(w));
    MT_OK(nb_barrier(mt_world));
    remove_dir(dir);
    MT_END();
}
END_TEST

/* The pipeline's evaluation (nb_gpt_pipe_eval): forward only, dropout off, the mean loss the
 * same on every rank of the pipeline and equal to the 1-process model's nb_gpt_loss on the
 * same batch (eval mode, no gradients); the dropout stream does not move and the module
 * stays in training mode. Under bf16 autocast it is within 2% of f32. */
static void check_eval(int pp_size, nb_pipe_schedule sched, int v) {
    const int r = mt_rank;
    nb_comm *pp = nb_comm_split(mt_world, r / pp_size, r);
    nb_comm *dp = nb_comm_split(mt_world, r % pp_size, r);
    nb_gpt_pipe_opts po = nb_gpt_pipe_defaults();
    po.schedule = sched;
    po.n_micro = MICRO;
    po.virtual_stages = v;
    nb_generator *g1 = nb_generator_new(11), *g2 = nb_generator_new(11), *data = nb_generator_new(7);
    nb_generator *d1 = nb_generator_new(3);
    nb_gpt_config c1 = cfg, c2 = cfg;
    c1.dropout = c2.dropout = 0.1;
    c1.dropout_gen = d1;
    nb_gpt_pipe *pipe = pp && dp ? nb_gpt_pipe_new(&c1, g1, pp, dp, &po) : NULL;
    nb_module *ref = nb_gpt_new(&c2, g2);
    MT_CHECK(pipe && ref, "build: %s", nb_last_error());
    nb_scope_begin();
    const int64_t B = MICRO * MB;
    nb_tensor *X = nb_randint((int64_t[]){B, SEQ}, 2, NB_I64, 0, cfg.vocab_size, data);
    nb_tensor *Y = nb_randint((int64_t[]){B, SEQ}, 2, NB_I64, 0, cfg.vocab_size, data);
    double want = NAN, got = NAN, got16 = NAN;
    if (ref) {
        nb_module_train(ref, false);
        bool prev = nb_set_grad_enabled(false);
        nb_tensor *l = nb_gpt_loss(ref, X, Y);
        want = l ? nb_item_f64(l) : NAN;
        nb_set_grad_enabled(prev);
    }
    if (pipe) {
        const uint64_t at = nb_generator_offset(d1);
        nb_pipe_stats s;
        MT_OK(nb_gpt_pipe_eval(pipe, X, Y, &got, &s));
        MT_CHECK(rel_diff(got, want) <= 1e-5, "pp %d %s v %d: eval loss %.9g, 1 process %.9g",
                 pp_size, nb_pipe_schedule_name(sched), v, got, want);
        MT_CHECK(s.peak_live_micro == 1, "eval held %lld micro-batches at once",
                 (long long)s.peak_live_micro);
        MT_CHECK(nb_generator_offset(d1) == at, "the evaluation moved the dropout stream");
        MT_CHECK(nb_module_is_training(nb_gpt_pipe_module(pipe)),
                 "the module is left in evaluation mode");
        /* bf16: the caller's autocast scope reaches every stage */
        MT_OK(nb_autocast_begin(NB_BF16));
        MT_OK(nb_gpt_pipe_eval(pipe, X, Y, &got16, NULL));
        MT_OK(nb_autocast_end());
        MT_CHECK(rel_diff(got16, got) <= 0.02 && got16 != got, "bf16 eval %.6g vs f32 %.6g",
                 got16, got);
        /* the same value on every rank of the pipeline */
        nb_tensor *t = nb_from_buffer((double[]){got, -got}, (int64_t[]){2}, 1, NB_F64);
        MT_OK(nb_allreduce(pp, t, NB_REDUCE_MAX));
        double mx[2] = {0, 0};
        MT_OK(nb_read(t, mx, 2, NB_F64));
        MT_CHECK(mx[0] == got && -mx[1] == got, "pipeline ranks disagree: %.9g..%.9g", -mx[1],
                 mx[0]);
        /* a batch the micro-batches do not divide: an error, no communication */
        double bad = 0;
        MT_CHECK(nb_gpt_pipe_eval(pipe, nb_narrow(X, 0, 0, B - 1), nb_narrow(Y, 0, 0, B - 1),
                                  &bad, NULL) == NB_EINVAL && isnan(bad),
                 "a batch of %lld rows in %d micro-batches was accepted", (long long)(B - 1),
                 MICRO);
    }
    nb_scope_end();
    nb_gpt_pipe_free(pipe);
    nb_module_free(ref);
    nb_generator_free(g1);
    nb_generator_free(g2);
    nb_generator_free(data);
    nb_generator_free(d1);
    nb_comm_free(pp);
    nb_comm_free(dp);
    MT_END();
}

START_TEST(test_pipe_eval) {
    check_eval(mt_size, NB_PIPE_1F1B, 1);
    check_eval(mt_size, NB_PIPE_INTERLEAVED, 2);
    if (mt_size >= 2) check_eval(mt_size / 2, NB_PIPE_GPIPE, 1);
}
END_TEST

/* Mixed precision and activation checkpointing in the pipeline's training step: the blocks
 * of cfg.recompute FULL or ATTN (nb_module_set_recompute, nb_recompute) give bit-identical
 * losses and weights, with dropout; under bf16 autocast the losses stay within 2% of f32's,
 * and under fp16 too, with a loss scaler over the world (first scale 2^19: the first steps
 * overflow and are skipped, on every rank alike). */
static double pipe_train(nb_gpt_recompute rc, nb_dtype prec, double *w_sum, int64_t *skipped,
                         double *scale) {
    const int r = mt_rank;
    nb_comm *pp = nb_comm_split(mt_world, 0, r);
    nb_gpt_pipe_opts po = nb_gpt_pipe_defaults();
    po.n_micro = MICRO;
    nb_generator *g = nb_generator_new(11), *data = nb_generator_new(5), *d = nb_generator_new(3);
    nb_gpt_config c = cfg;
    c.dropout = 0.1;
    c.dropout_gen = d;
    c.recompute = rc;
    nb_gpt_pipe *pipe = pp ? nb_gpt_pipe_new(&c, g, pp, NULL, &po) : NULL;
    nb_optim *opt = pipe ? nb_adamw_new(nb_parameters(nb_gpt_pipe_module(pipe)), NULL) : NULL;
    MT_CHECK(opt, "build: %s", nb_last_error());
    nb_grad_scaler_opts so = nb_grad_scaler_defaults();
    so.init_scale = 524288.0;
    nb_grad_scaler *sc = prec == NB_F16 ? nb_grad_scaler_new(&so) : NULL;
    if (sc) MT_OK(nb_grad_scaler_set_comm(sc, mt_world));
    double loss = NAN;
    for (int step = 0; step < 2 * STEPS && opt; step++) {
        nb_scope_begin();
        const int64_t B = MICRO * MB;
        nb_tensor *X = nb_randint((int64_t[]){B, SEQ}, 2, NB_I64, 0, cfg.vocab_size, data);
        nb_tensor *Y = nb_randint((int64_t[]){B, SEQ}, 2, NB_I64, 0, cfg.vocab_size, data);
        if (prec != NB_F32) MT_OK(nb_autocast_begin(prec));
        loss = nb_gpt_pipe_train_step_ex(pipe, opt, X, Y,
                                         &(nb_gpt_pipe_step_opts){.grad_clip = 1.0, .scaler = sc},
                                         NULL, NULL);
        if (prec != NB_F32) MT_OK(nb_autocast_end());
        MT_CHECK(!isnan(loss), "step %d: %s", step, nb_last_error());
        nb_scope_end();
    }
    *w_sum = 0;
    const nb_params *ps = pipe ? nb_parameters(nb_gpt_pipe_module(pipe)) : NULL;
    for (int i = 0; ps && i < ps->count; i++) {
        nb_scope_begin();
        *w_sum += nb_item_f64(nb_sum(nb_mul(ps->tensors[i], ps->tensors[i]), NULL, 0, false));
        nb_scope_end();
    }
    *skipped = sc ? nb_grad_scaler_num_skipped(sc) : 0;
    *scale = sc ? nb_grad_scaler_get_scale(sc) : 0;
    nb_grad_scaler_free(sc);
    nb_optim_free(opt);
    nb_gpt_pipe_free(pipe);
    nb_generator_free(g);
    nb_generator_free(data);
    nb_generator_free(d);
    nb_comm_free(pp);
    return loss;
}

START_TEST(test_pipe_recompute_bf16) {
    double w0, w1, w2, w3, w4, sc;
    int64_t sk;
    const double l0 = pipe_train(NB_GPT_RECOMPUTE_NONE, NB_F32, &w0, &sk, &sc);
    const double l1 = pipe_train(NB_GPT_RECOMPUTE_FULL, NB_F32, &w1, &sk, &sc);
    const double l2 = pipe_train(NB_GPT_RECOMPUTE_ATTN, NB_F32, &w2, &sk, &sc);
    const double l3 = pipe_train(NB_GPT_RECOMPUTE_NONE, NB_BF16, &w3, &sk, &sc);
    const double l4 = pipe_train(NB_GPT_RECOMPUTE_FULL, NB_F16, &w4, &sk, &sc);
    MT_CHECK(l1 == l0 && w1 == w0, "recompute full: loss %.17g vs %.17g, weights %.17g vs %.17g",
             l1, l0, w1, w0);
    MT_CHECK(l2 == l0 && w2 == w0, "recompute attn: loss %.17g vs %.17g, weights %.17g vs %.17g",
             l2, l0, w2, w0);
    MT_CHECK(rel_diff(l3, l0) <= 0.02 && l3 != l0, "bf16 loss %.6g vs f32 %.6g", l3, l0);
    MT_CHECK(rel_diff(l4, l0) <= 0.02, "fp16 loss %.6g vs f32 %.6g", l4, l0);
    MT_CHECK(sk >= 1 && sk < 2 * STEPS && sc < 524288.0, "fp16: %lld steps skipped, scale %g "
             "(2^19 at first)", (long long)sk, sc);
    nb_scope_begin(); /* every rank skipped the same steps and holds the same scale */
    nb_tensor *t = nb_from_buffer((double[]){(double)sk, sc, -(double)sk, -sc}, (int64_t[]){4},
                                  1, NB_F64);
    MT_OK(nb_allreduce(mt_world, t, NB_REDUCE_MAX));
    double v[4] = {0};
    MT_OK(nb_read(t, v, 4, NB_F64));
    MT_CHECK(v[0] == -v[2] && v[1] == -v[3], "the ranks disagree: skipped %g..%g, scale %g..%g",
             -v[2], v[0], -v[3], v[1]);
    nb_scope_end();
    MT_END();
}
END_TEST

Suite *mt_suite_pipeline(void) {
    Suite *s = suite_create("pipeline");
    TCase *tc = tcase_create("pipeline");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_pipe_gpipe);
    tcase_add_test(tc, test_pipe_1f1b);
    tcase_add_test(tc, test_pipe_interleaved);
    tcase_add_test(tc, test_pipe_dp_x_pp);
    tcase_add_test(tc, test_pipe_dropout);
    tcase_add_test(tc, test_pipe_balance);
    tcase_add_test(tc, test_pipe_bad_layouts);
    tcase_add_test(tc, test_pipe_checkpoint_layouts);
    tcase_add_test(tc, test_pipe_checkpoint_async);
    tcase_add_test(tc, test_pipe_checkpoint_old_names);
    tcase_add_test(tc, test_pipe_eval);
    tcase_add_test(tc, test_pipe_recompute_bf16);
    suite_add_tcase(s, tc);
    return s;
}
