/* test_zero_layouts.c - ZeRO over the data-parallel group of tensor-parallel and pipeline
 * GPT runs (nb_gpt_tp_train_step_ex, nb_gpt_pipe_set_zero, ZeRO's skip-mask norm,
 * nb_zero_gather_optim_state / _scatter_optim_state), in nabla_mpi_tests (1, 2 and 4 ranks,
 * and alone). Each layout trains K steps with AdamW and clipping and must give the losses,
 * gradient norms and (gathered) weights of 1 process on the global batch to 1e-5 relative;
 * checkpoints saved under ZeRO resume under another layout with the same result. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpi_test.h"

/* Max relative difference of a and b (same shape), scaled by max |b|. */
static double rel_diff(nb_tensor *a, nb_tensor *b) {
    if (!a || !b || nb_numel(a) != nb_numel(b)) return INFINITY;
    nb_scope_begin();
    double d = nb_item_f64(nb_amax(nb_abs(nb_sub(nb_to_dtype(a, NB_F64), nb_to_dtype(b, NB_F64))),
                                   NULL, 0, false));
    double m = nb_item_f64(nb_amax(nb_abs(nb_to_dtype(b, NB_F64)), NULL, 0, false));
    nb_scope_end();
    return d / (m > 0 ? m : 1);
}
#define EXPECT_CLOSE(a, b, tol, what)                                                      \
    do {                                                                                   \
        double d_ = rel_diff((a), (b));                                                    \
        MT_CHECK(d_ <= (tol), "%s: relative difference %g > %g", (what), d_, (double)(tol)); \
    } while (0)
#define EXPECT_REL(got, want, what, ...)                                                     \
    MT_CHECK(fabs((got) - (want)) <= 1e-5 * fabs(want), what ": %.9g, 1 process %.9g (%s)", \
             __VA_ARGS__, (got), (want), nb_last_error())

enum { GV = 16, GT = 8, GB = 8, K = 3, NMICRO = 2 };
static const nb_gpt_config gcfg = {.vocab_size = GV, .block_size = GT, .n_layer = 4, .n_head = 4,
                                   .n_embd = 16};
static const double CLIP = 0.5;

/* Step k's global batch rows [b0, b0 + nb): x (nb, GT) and its next-token targets y. */
static void batch(int k, int64_t b0, int64_t nb, nb_tensor **x, nb_tensor **y) {
    int64_t xs[GB * GT], ys[GB * GT];
    for (int64_t b = 0; b < nb; b++)
        for (int64_t t = 0; t < GT; t++) {
            int64_t s = b0 + b;
            xs[b * GT + t] = (s * 7 + t * 3 + k * 5 + (s * t) % 3) % GV;
            ys[b * GT + t] = (s * 7 + (t + 1) * 3 + k * 5 + (s * (t + 1)) % 3) % GV;
        }
    *x = nb_from_buffer(xs, (int64_t[]){nb, GT}, 2, NB_I64);
    *y = nb_from_buffer(ys, (int64_t[]){nb, GT}, 2, NB_I64);
}

static nb_optim *adamw(nb_module *m) {
    nb_adamw_opts o = nb_adamw_defaults();
    o.lr = 1e-2;
    o.weight_decay = 0.1;
    /* c_attn's key bias has a zero gradient in exact arithmetic (softmax ignores a constant
     * added to a row's scores): its computed gradient is rounding noise, which Adam with
     * eps 1e-8 would turn into lr-sized steps that differ between layouts */
    o.eps = 1e-4;
    return nb_adamw_new(nb_parameters(m), &o);
}

/* 1 process: steps [0, k1) on the global batch (micro-batches of NMICRO), losses and norms. */
static nb_module *reference(int k1, double *loss, double *norm, nb_optim **opt_out) {
    nb_generator *g = nb_generator_new(11);
    nb_module *ref = nb_gpt_new(&gcfg, g);
    nb_generator_free(g);
    nb_optim *opt = adamw(ref);
    for (int k = 0; k < k1; k++) {
        nb_scope_begin();
        nb_tensor *x, *y, *xs[NMICRO], *ys[NMICRO];
        batch(k, 0, GB, &x, &y);
        for (int i = 0; i < NMICRO; i++) {
            xs[i] = nb_narrow(x, 0, i * (GB / NMICRO), GB / NMICRO);
            ys[i] = nb_narrow(y, 0, i * (GB / NMICRO), GB / NMICRO);
        }
        loss[k] = nb_gpt_train_step(ref, opt, NULL, xs, ys, NMICRO, CLIP, &norm[k]);
        nb_scope_end();
    }
    MT_CHECK(isfinite(loss[k1 - 1]), "reference: %s", nb_last_error());
    if (opt_out) *opt_out = opt;
    else nb_optim_free(opt);
    return ref;
}

/* ---- tensor parallel ------------------------------------------------------------------------ */
/* Steps [k0, k1) of a TP layout under z (dp rank dr of dp): this rank's rows of the global
 * batch. Checks losses and norms when rloss is given. */
static void tp_steps(nb_module *m, nb_optim *opt, nb_zero *z, nb_topology *topo, int k0, int k1,
                     const double *rloss, const double *rnorm, const char *what) {
    const int dp = nb_topology_dp_size(topo), dr = nb_topology_dp_rank(topo);
    const int64_t rows = GB / dp;
    for (int k = k0; k < k1; k++) {
        nb_scope_begin();
        nb_tensor *x, *y, *xs[NMICRO], *ys[NMICRO];
        batch(k, dr * rows, rows, &x, &y);
        /* NMICRO micro-batches when they divide this rank's rows (gradient accumulation
         * under ZeRO), else one: equal sizes, so the mean loss is the same */
        const int nm = rows % NMICRO == 0 ? NMICRO : 1;
        for (int i = 0; i < nm; i++) {
            xs[i] = nb_narrow(x, 0, i * (rows / nm), rows / nm);
            ys[i] = nb_narrow(y, 0, i * (rows / nm), rows / nm);
        }
        nb_gpt_tp_step_opts so = nb_gpt_tp_step_defaults();
        so.zero = z;
        so.grad_clip = CLIP;
        double norm, loss = nb_gpt_tp_train_step_ex(m, opt, xs, ys, nm, &so, &norm);
        nb_tensor *l = nb_full((int64_t[]){1}, 1, NB_F64, loss);
        MT_OK(nb_allreduce(nb_topology_dp(topo), l, NB_REDUCE_AVG));
        loss = nb_item_f64(l);
        if (rloss) {
            EXPECT_REL(loss, rloss[k], "%s step %d: loss", what, k);
            EXPECT_REL(norm, rnorm[k], "%s step %d: grad norm", what, k);
        }
        nb_scope_end();
    }
}

static void expect_weights(nb_module *m, nb_module *ref, const char *what) {
    nb_module *full = nb_gpt_new(&gcfg, NULL);
    MT_OK(nb_gpt_tp_gather(m, full));
    const nb_params *ps = nb_parameters(ref);
    for (int i = 0; i < ps->count; i++) {
        char w[200];
        snprintf(w, sizeof w, "%s: %s", what, ps->names[i]);
        EXPECT_CLOSE(nb_module_find(full, ps->names[i]), ps->tensors[i], 1e-5, w);
    }
    nb_module_free(full);
}

/* Every dp x tp layout of the world, with and without sequence parallelism, ZeRO stages 1
 * and 2 over dp: the losses, norms and weights of 1 process. */
START_TEST(test_tp_zero_equivalence) {
    double rloss[K], rnorm[K];
    nb_module *ref = reference(K, rloss, rnorm, NULL);
    for (int tp = 1; tp <= mt_size; tp *= 2)
        for (int sp = 0; sp < 2; sp++)
            for (int stage = 1; stage <= 2; stage++) {
                if (mt_size % tp) continue;
                nb_topology *topo = nb_topology_new(mt_world, &(nb_topology_opts){.pp = 1, .tp = tp});
                nb_generator *g = nb_generator_new(11);
                nb_module *m = nb_gpt_tp_new(&gcfg, g, nb_topology_tp(topo),
                                             &(nb_gpt_tp_opts){.sequence_parallel = sp});
                nb_generator_free(g);
                nb_optim *opt = adamw(m);
                nb_zero_opts zo = nb_zero_defaults();
                zo.stage = stage;
                zo.bucket_mb = 0.004; /* several buckets */
                nb_zero *z = nb_zero_new(m, opt, nb_topology_dp(topo), &zo);
                MT_CHECK(z, "tp %d stage %d: %s", tp, stage, nb_last_error());
                char what[96];
                snprintf(what, sizeof what, "dp %d x tp %d, sp %d, ZeRO-%d", mt_size / tp, tp, sp,
                         stage);
                if (z) {
                    tp_steps(m, opt, z, topo, 0, K, rloss, rnorm, what);
                    expect_weights(m, ref, what);
                }
                nb_zero_free(z);
                nb_optim_free(opt);
                nb_module_free(m);
                nb_topology_free(topo);
            }
    nb_module_free(ref);
    MT_END();
}
END_TEST

/* A directory every rank names alike (rank 0 makes it). */
static void shared_tmpdir(char dir[64]) {
    memset(dir, 0, 64);
    nb_scope_begin();
    nb_tensor *name = nb_zeros((int64_t[]){64}, 1, NB_U8);
    if (mt_rank == 0) {
        char tmpl[] = "/tmp/nb-zero-layouts-XXXXXX";
        MT_CHECK(mkdtemp(tmpl) != NULL, "mkdtemp failed");
        memcpy(nb_data(name), tmpl, strlen(tmpl));
    }
    MT_OK(nb_broadcast(mt_world, name, 0));
    memcpy(dir, nb_data(name), 63);
    nb_scope_end();
}

/* Rank 0, after a barrier: dir's files (and one level of directories), then dir. */
static void remove_tree(const char *dir, int depth) {
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[400];
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p) continue;
        if (unlink(p) != 0 && depth > 0) remove_tree(p, depth - 1);
    }
    if (d) closedir(d);
    rmdir(dir);
}

/* A TP model of tp ranks (dp the rest of the world; tp 0: one process alone), optionally
 * under ZeRO `stage` over dp (0: nb_ddp when dp > 1). */
typedef struct tpl {
    nb_comm *self;
    nb_topology *topo;
    nb_module *m;
    nb_optim *opt;
    nb_zero *z;
    nb_ddp *ddp;
} tpl;

static void tpl_new(tpl *t, int tp, int stage) {
    memset(t, 0, sizeof *t);
    t->self = nb_comm_self();
    t->topo = tp ? nb_topology_new(mt_world, &(nb_topology_opts){.pp = 1, .tp = tp})
                 : nb_topology_new(t->self, NULL);
    nb_generator *g = nb_generator_new(11);
    t->m = nb_gpt_tp_new(&gcfg, g, nb_topology_tp(t->topo), NULL);
    nb_generator_free(g);
    t->opt = adamw(t->m);
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = stage;
    zo.bucket_mb = 0.004;
    if (stage) t->z = nb_zero_new(t->m, t->opt, nb_topology_dp(t->topo), &zo);
    else if (nb_topology_dp_size(t->topo) > 1) t->ddp = nb_ddp_new(t->m, nb_topology_dp(t->topo), NULL);
    MT_CHECK(t->m && t->opt && (!stage || t->z), "tp %d stage %d: %s", tp, stage, nb_last_error());
}

static void tpl_steps(tpl *t, int k0, int k1) {
    const int dp = nb_topology_dp_size(t->topo), dr = nb_topology_dp_rank(t->topo);
    for (int k = k0; k < k1; k++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        batch(k, dr * (GB / dp), GB / dp, &x, &y);
        nb_gpt_tp_step_opts so = nb_gpt_tp_step_defaults();
        so.zero = t->z;
        so.ddp = t->ddp;
        so.grad_clip = CLIP;
        double loss = nb_gpt_tp_train_step_ex(t->m, t->opt, &x, &y, 1, &so, NULL);
        MT_CHECK(isfinite(loss), "step %d: %s", k, nb_last_error());
        nb_scope_end();
    }
}

static void tpl_free(tpl *t) {
    nb_zero_free(t->z);
    nb_ddp_free(t->ddp);
    nb_optim_free(t->opt);
    nb_module_free(t->m);
    nb_topology_free(t->topo);
    nb_comm_free(t->self);
}

/* A sharded TP checkpoint saved under ZeRO-1 (tp 2, dp the rest) after K - 1 steps, the
 * optimizer state gathered into the template: training on after the save gives the weights
 * of K steps of 1 process (the shards got their state back), and so does resuming it in one
 * process, under DDP and under ZeRO-2 of another dp size (tp = world). */
START_TEST(test_tp_zero_checkpoint) {
    double rloss[K], rnorm[K];
    nb_module *ref = reference(K, rloss, rnorm, NULL);
    char dir[64];
    shared_tmpdir(dir);
    const int save_tp = mt_size >= 2 ? 2 : 1;
    tpl t;
    tpl_new(&t, save_tp, 1);
    if (t.z) {
        tpl_steps(&t, 0, K - 1);
        MT_OK(nb_zero_gather_optim_state(t.z));
        nb_checkpoint ck = {.model = t.m, .optim = t.opt, .step = K - 1};
        MT_OK(nb_gpt_tp_save_sharded(&ck, nb_topology_dp(t.topo), dir, 0));
        MT_OK(nb_zero_scatter_optim_state(t.z));
        tpl_steps(&t, K - 1, K);
        expect_weights(t.m, ref, "ZeRO-1 after saving");
    }
    tpl_free(&t);
    const int tps[3] = {0, save_tp, mt_size}, stages[3] = {0, 0, 2};
    for (int l = 0; l < 3; l++) {
        tpl_new(&t, tps[l], stages[l]);
        if (t.opt) {
            nb_checkpoint lc = {.model = t.m, .optim = t.opt};
            MT_OK(nb_gpt_tp_checkpoint_load(dir, &lc));
            MT_CHECK(lc.step == K - 1, "resumed at step %lld", (long long)lc.step);
            if (t.z) MT_OK(nb_zero_scatter_optim_state(t.z));
            tpl_steps(&t, K - 1, K);
            char what[96];
            snprintf(what, sizeof what, "resumed under tp %d, %s", tps[l] ? tps[l] : 1,
                     stages[l] ? "ZeRO-2" : "DDP");
            expect_weights(t.m, ref, what);
        }
        tpl_free(&t);
    }
    MT_OK(nb_barrier(mt_world));
    if (mt_rank == 0) remove_tree(dir, 1);
    nb_module_free(ref);
    MT_END();
}
END_TEST

/* SGD, momentum 0.9 on the decay group and none on the other (a slot some parameters do
 * not have): 2 steps of the plain GPT under ZeRO over the world, then the gathered state in
 * the template equals 1 process's entry for entry, and scattering it back changes nothing
 * (a third step still follows 1 process). */
static nb_optim *sgd_groups(nb_module *m, nb_params *decay, nb_params *no_decay) {
    nb_params_split_decay(nb_parameters(m), decay, no_decay);
    nb_optim *o = nb_sgd_new(decay, &(nb_sgd_opts){.lr = 0.1, .momentum = 0.9});
    nb_group_opts go = nb_group_defaults();
    go.momentum = 0;
    if (o && nb_optim_add_group(o, no_decay, &go) < 0) {
        nb_optim_free(o);
        o = NULL;
    }
    return o;
}

static void gpt_steps(nb_module *m, nb_optim *opt, nb_zero *z, int k0, int k1) {
    const int n = z ? mt_size : 1, r = z ? mt_rank : 0;
    for (int k = k0; k < k1; k++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        batch(k, r * (GB / n), GB / n, &x, &y);
        double loss = nb_gpt_train_step_ex(m, opt, &x, &y, 1,
                                           &(nb_gpt_step_opts){.zero = z, .grad_clip = CLIP}, NULL);
        MT_CHECK(isfinite(loss), "step %d: %s", k, nb_last_error());
        nb_scope_end();
    }
}

START_TEST(test_zero_gather_optim_state) {
    if (GB % mt_size) {
        MT_END();
        return;
    }
    nb_generator *g = nb_generator_new(11);
    nb_module *ref = nb_gpt_new(&gcfg, g);
    nb_generator_free(g);
    nb_params rd = {0}, rn = {0};
    nb_optim *ropt = sgd_groups(ref, &rd, &rn);
    gpt_steps(ref, ropt, NULL, 0, 2);
    for (int stage = 1; stage <= 2; stage++) {
        g = nb_generator_new(11);
        nb_module *m = nb_gpt_new(&gcfg, g);
        nb_generator_free(g);
        nb_params d = {0}, nd = {0};
        nb_optim *opt = sgd_groups(m, &d, &nd);
        nb_zero_opts zo = nb_zero_defaults();
        zo.stage = stage;
        zo.bucket_mb = 0.004;
        nb_zero *z = opt ? nb_zero_new(m, opt, mt_world, &zo) : NULL;
        MT_CHECK(z, "stage %d: %s", stage, nb_last_error());
        if (z) {
            gpt_steps(m, opt, z, 0, 2);
            MT_OK(nb_zero_gather_optim_state(z));
            const nb_params *want = nb_optim_state(ropt), *got = nb_optim_state(opt);
            MT_CHECK(want && got && want->count == got->count, "stage %d: %d entries, 1 process %d",
                     stage, got ? got->count : -1, want ? want->count : -1);
            for (int i = 0; want && got && i < want->count && i < got->count; i++) {
                char what[200];
                snprintf(what, sizeof what, "stage %d: %s (got %s)", stage, want->names[i],
                         got->names[i]);
                MT_CHECK(!strcmp(want->names[i], got->names[i]), "%s: another name", what);
                EXPECT_CLOSE(got->tensors[i], want->tensors[i], 1e-5, what);
            }
            nb_optim_state_release(opt);
            nb_optim_state_release(ropt);
            MT_OK(nb_zero_scatter_optim_state(z));
            const nb_params *left = nb_optim_state(opt); /* the template's copy is gone */
            int slots = 0;
            for (int i = 0; left && i < left->count; i++)
                slots += strncmp(left->names[i], "param_groups.", 13) != 0;
            MT_CHECK(left && slots == 0, "stage %d: the template keeps %d state entries", stage, slots);
            nb_optim_state_release(opt);
        }
        nb_zero_free(z);
        nb_optim_free(opt);
        nb_params_deinit(&d);
        nb_params_deinit(&nd);
        nb_module_free(m);
    }
    nb_optim_free(ropt);
    nb_params_deinit(&rd);
    nb_params_deinit(&rn);
    nb_module_free(ref);
    MT_END();
}
END_TEST

/* ---- pipeline ------------------------------------------------------------------------------- */
typedef struct ppl {
    nb_comm *pp, *dp;
    nb_gpt_pipe *pipe;
    nb_optim *opt;
    nb_zero *z;
    int ndp, dr;
} ppl;

/* pp stages over consecutive ranks of base, dp over the rest; ZeRO `stage` over dp (0:
 * plain allreduces). */
static void ppl_new(ppl *t, nb_comm *base, int pp, int stage) {
    memset(t, 0, sizeof *t);
    const int r = nb_comm_rank(base);
    t->pp = nb_comm_split(base, r / pp, r);
    t->dp = nb_comm_split(base, r % pp, r);
    t->ndp = nb_comm_size(base) / pp;
    t->dr = r / pp;
    nb_gpt_pipe_opts po = nb_gpt_pipe_defaults();
    po.n_micro = (GB / t->ndp) % NMICRO == 0 ? NMICRO : 1;
    nb_generator *g = nb_generator_new(11);
    t->pipe = t->pp && t->dp ? nb_gpt_pipe_new(&gcfg, g, t->pp, t->dp, &po) : NULL;
    nb_generator_free(g);
    t->opt = t->pipe ? adamw(nb_gpt_pipe_module(t->pipe)) : NULL;
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = stage;
    zo.bucket_mb = 0.004;
    if (t->opt && stage) t->z = nb_zero_new(nb_gpt_pipe_module(t->pipe), t->opt, t->dp, &zo);
    if (t->z) MT_OK(nb_gpt_pipe_set_zero(t->pipe, t->z));
    MT_CHECK(t->opt && (!stage || t->z), "pp %d stage %d: %s", pp, stage, nb_last_error());
}

static void ppl_steps(ppl *t, int k0, int k1, const double *rloss, const double *rnorm,
                      const char *what) {
    const int64_t rows = GB / t->ndp;
    for (int k = k0; k < k1; k++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        batch(k, t->dr * rows, rows, &x, &y);
        double norm, loss = nb_gpt_pipe_train_step(t->pipe, t->opt, x, y, CLIP, &norm, NULL);
        MT_CHECK(isfinite(loss), "%s step %d: %s", what, k, nb_last_error());
        if (rloss) {
            EXPECT_REL(loss, rloss[k], "%s step %d: loss", what, k);
            EXPECT_REL(norm, rnorm[k], "%s step %d: grad norm", what, k);
        }
        nb_scope_end();
    }
}

static void ppl_expect_weights(ppl *t, nb_module *ref, const char *what) {
    const nb_params *ps = nb_parameters(nb_gpt_pipe_module(t->pipe));
    for (int i = 0; i < ps->count; i++) {
        char w[200];
        snprintf(w, sizeof w, "%s: %s", what, ps->names[i]);
        EXPECT_CLOSE(ps->tensors[i], nb_module_find(ref, ps->names[i]), 1e-5, w);
    }
}

static void ppl_free(ppl *t) {
    nb_zero_free(t->z);
    nb_optim_free(t->opt);
    nb_gpt_pipe_free(t->pipe);
    nb_comm_free(t->dp);
    nb_comm_free(t->pp);
}

/* Every dp x pp layout of the world with ZeRO stages 1 and 2 over each stage's dp group:
 * the losses, norms and weights of 1 process (the tied wte summed over the first and last
 * stage before the reduce-scatter, counted once in the norm). */
START_TEST(test_pipe_zero_equivalence) {
    double rloss[K], rnorm[K];
    nb_module *ref = reference(K, rloss, rnorm, NULL);
    for (int pp = 1; pp <= mt_size; pp *= 2)
        for (int stage = 1; stage <= 2; stage++) {
            ppl t;
            ppl_new(&t, mt_world, pp, stage);
            char what[96];
            snprintf(what, sizeof what, "dp %d x pp %d, ZeRO-%d", mt_size / pp, pp, stage);
            if (t.z) {
                ppl_steps(&t, 0, K, rloss, rnorm, what);
                ppl_expect_weights(&t, ref, what);
            }
            ppl_free(&t);
        }
    nb_module_free(ref);
    MT_END();
}
END_TEST

/* Tensor-parallel pipeline stages under ZeRO-1 over dp: (dp, tp, pp) = (1, 2, 2) and
 * (2, 2, 1) on 4 ranks, (1, 2, 1) on 2. The norm sums the shards over dp, then over the
 * pipeline and then over tp, replicated tensors counted on tp
 * rank 0 only: the losses, norms and weights (gathered over tp) of 1 process. */
START_TEST(test_pipe_tp_zero_equivalence) {
    double rloss[K], rnorm[K];
    nb_module *ref = reference(K, rloss, rnorm, NULL);
    for (int pp = 1; 2 * pp <= mt_size; pp *= 2) {
        if (mt_size % (2 * pp)) continue;
        nb_topology *topo = nb_topology_new(mt_world, &(nb_topology_opts){.pp = pp, .tp = 2});
        MT_CHECK(topo, "topology pp %d tp 2: %s", pp, nb_last_error());
        ppl t = {.ndp = topo ? nb_topology_dp_size(topo) : 1,
                 .dr = topo ? nb_topology_dp_rank(topo) : 0};
        nb_gpt_pipe_opts po = nb_gpt_pipe_defaults();
        po.n_micro = (GB / t.ndp) % NMICRO == 0 ? NMICRO : 1;
        po.tp = topo ? nb_topology_tp(topo) : NULL;
        nb_generator *g = nb_generator_new(11);
        t.pipe = topo ? nb_gpt_pipe_new(&gcfg, g, nb_topology_pp(topo), nb_topology_dp(topo), &po)
                      : NULL;
        nb_generator_free(g);
        t.opt = t.pipe ? adamw(nb_gpt_pipe_module(t.pipe)) : NULL;
        nb_zero_opts zo = nb_zero_defaults();
        zo.stage = 1;
        zo.bucket_mb = 0.004;
        if (t.opt) t.z = nb_zero_new(nb_gpt_pipe_module(t.pipe), t.opt, nb_topology_dp(topo), &zo);
        if (t.z) MT_OK(nb_gpt_pipe_set_zero(t.pipe, t.z));
        MT_CHECK(t.z, "pp %d tp 2: %s", pp, nb_last_error());
        char what[96];
        snprintf(what, sizeof what, "dp %d x tp 2 x pp %d, ZeRO-1", t.ndp, pp);
        if (t.z) {
            ppl_steps(&t, 0, K, rloss, rnorm, what);
            nb_module *full = nb_gpt_new(&gcfg, NULL);
            MT_OK(nb_gpt_pipe_gather(t.pipe, full));
            const nb_params *ps = nb_parameters(nb_gpt_pipe_module(t.pipe));
            for (int i = 0; full && i < ps->count; i++) {
                char w[200];
                snprintf(w, sizeof w, "%s: %s", what, ps->names[i]);
                EXPECT_CLOSE(nb_module_find(full, ps->names[i]), nb_module_find(ref, ps->names[i]),
                             1e-5, w);
            }
            nb_module_free(full);
        }
        nb_zero_free(t.z);
        nb_optim_free(t.opt);
        nb_gpt_pipe_free(t.pipe);
        nb_topology_free(topo);
    }
    nb_module_free(ref);
    MT_END();
}
END_TEST

/* A pipeline checkpoint saved under ZeRO-1 (pp 2, dp the rest) after K - 1 steps: training on
 * gives the weights of K steps of 1 process, and so does resuming it in one process, under
 * pp = world without ZeRO and under ZeRO-2 with pp 1 (dp = world). */
START_TEST(test_pipe_zero_checkpoint) {
    double rloss[K], rnorm[K];
    nb_module *ref = reference(K, rloss, rnorm, NULL);
    char dir[64];
    shared_tmpdir(dir);
    const int save_pp = mt_size >= 2 ? 2 : 1;
    ppl t;
    ppl_new(&t, mt_world, save_pp, 1);
    if (t.z) {
        ppl_steps(&t, 0, K - 1, NULL, NULL, "before saving");
        MT_OK(nb_zero_gather_optim_state(t.z));
        MT_OK(nb_gpt_pipe_save(t.pipe, t.opt, dir, K - 1));
        MT_OK(nb_zero_scatter_optim_state(t.z));
        ppl_steps(&t, K - 1, K, NULL, NULL, "after saving");
        ppl_expect_weights(&t, ref, "ZeRO-1 after saving");
    }
    ppl_free(&t);
    nb_comm *self = nb_comm_self();
    nb_comm *bases[3] = {self, mt_world, mt_world};
    const int pps[3] = {1, mt_size, 1}, stages[3] = {0, 0, 2};
    for (int l = 0; l < 3; l++) {
        ppl_new(&t, bases[l], pps[l], stages[l]);
        if (t.opt) {
            int64_t step = -1;
            MT_OK(nb_gpt_pipe_load(t.pipe, t.opt, dir, &step));
            MT_CHECK(step == K - 1, "resumed at step %lld", (long long)step);
            if (t.z) MT_OK(nb_zero_scatter_optim_state(t.z));
            ppl_steps(&t, K - 1, K, NULL, NULL, "resumed");
            char what[96];
            snprintf(what, sizeof what, "resumed under pp %d, %s", pps[l],
                     stages[l] ? "ZeRO-2" : "no ZeRO");
            ppl_expect_weights(&t, ref, what);
        }
        ppl_free(&t);
    }
    nb_comm_free(self);
    MT_OK(nb_barrier(mt_world));
    if (mt_rank == 0) remove_tree(dir, 1);
    nb_module_free(ref);
    MT_END();
}
END_TEST

/* Misuse gives errors, the same on every rank, changing nothing: an nb_ddp and an nb_zero
 * together, ZeRO stage 3 with TP or a pipeline, gathering stage 3's state. */
START_TEST(test_zero_layouts_errors) {
    nb_topology *topo = nb_topology_new(mt_world, &(nb_topology_opts){.pp = 1, .tp = mt_size});
    nb_generator *g = nb_generator_new(11);
    nb_module *m = nb_gpt_tp_new(&gcfg, g, nb_topology_tp(topo), NULL);
    nb_generator_free(g);
    nb_optim *opt = adamw(m);
    nb_comm *self = nb_comm_self();
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = 1;
    nb_zero *z = nb_zero_new(m, opt, self, &zo);
    nb_module *other = nb_gpt_new(&gcfg, NULL);
    nb_ddp *ddp = nb_ddp_new(other, self, NULL); /* any: the pair is refused first */
    nb_scope_begin();
    nb_tensor *x, *y;
    batch(0, 0, 2, &x, &y);
    nb_gpt_tp_step_opts so = {.ddp = ddp, .zero = z, .grad_clip = CLIP};
    double l = nb_gpt_tp_train_step_ex(m, opt, &x, &y, 1, &so, NULL);
    MT_CHECK(isnan(l) && nb_last_status() == NB_EINVAL && strstr(nb_last_error(), "not both"),
             "ddp and zero: %g %s", l, nb_last_error());
    nb_clear_error();
    /* a loss scaler with ZeRO (TP step and pipeline step): refused, not half applied */
    nb_grad_scaler *gs = nb_grad_scaler_new(NULL);
    so = (nb_gpt_tp_step_opts){.zero = z, .scaler = gs, .grad_clip = CLIP};
    l = nb_gpt_tp_train_step_ex(m, opt, &x, &y, 1, &so, NULL);
    MT_CHECK(isnan(l) && nb_last_status() == NB_EINVAL && strstr(nb_last_error(), "loss scaler"),
             "TP, zero and a scaler: %g %s", l, nb_last_error());
    nb_clear_error();
    {
        nb_gpt_pipe *pipe = nb_gpt_pipe_new(&gcfg, NULL, self, NULL, NULL);
        nb_optim *po = pipe ? adamw(nb_gpt_pipe_module(pipe)) : NULL;
        nb_zero *pz = po ? nb_zero_new(nb_gpt_pipe_module(pipe), po, self, &zo) : NULL;
        MT_CHECK(pz && nb_gpt_pipe_set_zero(pipe, pz) == NB_OK, "pipeline zero: %s", nb_last_error());
        nb_gpt_pipe_step_opts ps = {.scaler = gs, .grad_clip = CLIP};
        nb_tensor *px, *py;
        batch(0, 0, 4, &px, &py);
        l = pz ? nb_gpt_pipe_train_step_ex(pipe, po, px, py, &ps, NULL, NULL) : NAN;
        MT_CHECK(isnan(l) && nb_last_status() == NB_EINVAL && strstr(nb_last_error(), "loss scaler"),
                 "pipeline, zero and a scaler: %g %s", l, nb_last_error());
        nb_clear_error();
        nb_zero_free(pz);
        nb_optim_free(po);
        nb_gpt_pipe_free(pipe);
    }
    nb_grad_scaler_free(gs);
    nb_scope_end();
    nb_zero_free(z);
    /* stage 3 */
    zo.stage = 3;
    nb_module *plain = nb_gpt_new(&gcfg, NULL);
    nb_optim *popt = adamw(plain);
    nb_zero *z3 = nb_zero_new(plain, popt, self, &zo);
    MT_CHECK(z3, "stage 3: %s", nb_last_error());
    if (z3) {
        MT_CHECK(nb_zero_gather_optim_state(z3) == NB_EINVAL && strstr(nb_last_error(), "stage 3"),
                 "gather at stage 3: %s", nb_last_error());
        MT_CHECK(nb_zero_scatter_optim_state(z3) == NB_EINVAL, "scatter at stage 3: %s",
                 nb_last_error());
        nb_scope_begin();
        so = (nb_gpt_tp_step_opts){.zero = z3, .grad_clip = CLIP};
        l = nb_gpt_tp_train_step_ex(m, opt, &x, &y, 1, &so, NULL);
        MT_CHECK(isnan(l) && nb_last_status() == NB_EINVAL && strstr(nb_last_error(), "stage 3"),
                 "TP with stage 3: %g %s", l, nb_last_error());
        nb_scope_end();
        nb_gpt_pipe *pipe = nb_gpt_pipe_new(&gcfg, NULL, self, NULL, NULL);
        MT_CHECK(pipe && nb_gpt_pipe_set_zero(pipe, z3) == NB_EINVAL &&
                     strstr(nb_last_error(), "stage 3"), "pipeline with stage 3: %s", nb_last_error());
        nb_gpt_pipe_free(pipe);
        nb_clear_error();
    }
    nb_zero_free(z3);
    nb_optim_free(popt);
    nb_module_free(plain);
    nb_ddp_free(ddp);
    nb_module_free(other);
    nb_optim_free(opt);
    nb_module_free(m);
    nb_comm_free(self);
    nb_topology_free(topo);
    MT_END();
}
END_TEST

Suite *mt_suite_zero_layouts(void) {
    Suite *s = suite_create("zero_layouts");
    TCase *tc = tcase_create("zero_layouts");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_tp_zero_equivalence);
    tcase_add_test(tc, test_tp_zero_checkpoint);
    tcase_add_test(tc, test_zero_gather_optim_state);
    tcase_add_test(tc, test_pipe_zero_equivalence);
    tcase_add_test(tc, test_pipe_tp_zero_equivalence);
    tcase_add_test(tc, test_pipe_zero_checkpoint);
    tcase_add_test(tc, test_zero_layouts_errors);
    suite_add_tcase(s, tc);
    return s;
}
