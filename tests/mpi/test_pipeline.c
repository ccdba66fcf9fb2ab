/* test_pipeline.c - pipelines by split (nb_pipeline, nabla/pipeline.h) beyond the equality
 * with one process that test_parallel_gpt.c checks in every layout: what each schedule holds
 * (GPipe every micro-batch, 1F1B at most p - r), the split balanced by parameters, bad
 * splits refused on every rank, the evaluation (forward only, no dropout draws, the mode
 * restored), activation checkpointing (bit-identical) and bf16 / fp16 (within 2%, fp16's
 * overflowed steps skipped alike on every rank). The GPT's split (nb_gpt_pipeline_new) over the
 * whole world, and models of the test's own for the split's rules. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_test.h"

#define MICRO 4 /* micro-batches per step */
#define MB 2    /* sequences per micro-batch */
#define SEQ 8
#define STEPS 3

static const nb_gpt_config *base_cfg(void) {
    static nb_gpt_config c;
    c = nb_gpt_config_defaults();
    c.vocab_size = 32, c.block_size = SEQ, c.n_layer = 8, c.n_head = 2, c.n_embd = 16;
    return &c;
}

/* A GPT of c split over the whole world (a mesh "pp" = world), or NULL with a failure. */
static nb_pipeline *gpt_pipe(const nb_gpt_config *c, uint64_t seed, nb_pipe_schedule s, int v,
                             nb_pipe_balance bal, nb_mesh **mesh, nb_module **model) {
    *mesh = nb_mesh_new(mt_world, "pp", (int[]){-1});
    nb_generator *g = nb_generator_new(seed);
    *model = *mesh ? nb_gpt_new(c, g) : NULL;
    nb_generator_free(g);
    nb_pipeline_opts po = nb_pipeline_defaults();
    po.schedule = s;
    po.n_micro = MICRO;
    po.virtual_stages = v;
    po.balance = bal;
    nb_pipeline *p = *model ? nb_gpt_pipeline_new(*model, *mesh, &po) : NULL;
    MT_CHECK(p, "pipeline: %s", nb_last_error());
    return p;
}

/* Plain SGD over the pipeline's module (NULL with a failure). */
static nb_optim *pipe_sgd(nb_pipeline *p) {
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 0.1;
    nb_optim *opt = p ? nb_sgd_new(nb_parameters(nb_pipeline_module(p)), &so) : NULL;
    MT_CHECK(opt, "sgd: %s", nb_last_error());
    return opt;
}

static void gpt_pipe_free(nb_pipeline *p, nb_mesh *mesh, nb_module *model) {
    nb_pipeline_free(p);
    nb_module_free(model);
    nb_mesh_free(mesh);
}

/* ---- what the schedules hold --------------------------------------------------------------- */
static void check_schedule(nb_pipe_schedule s, int v) {
    nb_mesh *mesh;
    nb_module *model;
    nb_pipeline *p = gpt_pipe(base_cfg(), 11, s, v, NB_PIPE_BALANCE_LAYERS, &mesh, &model);
    nb_optim *opt = pipe_sgd(p);
    nb_generator *data = nb_generator_new(5);
    const int pr = nb_mesh_rank(mesh, "pp"), P = nb_mesh_size(mesh, "pp");
    for (int step = 0; opt && step < 2; step++) {
        nb_scope_begin();
        nb_tensor *X =
            nb_randint((int64_t[]){MICRO * MB, SEQ}, 2, NB_I64, 0, base_cfg()->vocab_size, data);
        nb_pipe_stats st;
        nb_zero_grad(opt);
        double loss = nb_pipeline_step(p, X, X, &st);
        MT_CHECK(!isnan(loss), "%s: %s", nb_pipe_schedule_name(s), nb_last_error());
        MT_CHECK(st.bubble >= 0 && st.bubble < 1, "bubble %g", st.bubble);
        MT_CHECK(fabs(st.bubble_theory - nb_pipe_bubble_theory(s, P, MICRO, v)) < 1e-12,
                 "bubble_theory %g", st.bubble_theory);
        /* GPipe holds every micro-batch's activations, 1F1B at most p - r on rank r */
        if (s == NB_PIPE_GPIPE)
            MT_CHECK(st.peak_live_micro == (int64_t)MICRO * v, "gpipe held %lld micro-batches",
                     (long long)st.peak_live_micro);
        if (s == NB_PIPE_1F1B)
            MT_CHECK(st.peak_live_micro == (P - pr < MICRO ? P - pr : MICRO),
                     "1f1b on stage %d of %d held %lld micro-batches", pr, P,
                     (long long)st.peak_live_micro);
        MT_CHECK(st.peak_live_micro >= 1 && st.peak_live_micro <= MICRO * v, "peak %lld",
                 (long long)st.peak_live_micro);
        nb_scope_end();
    }
    nb_generator_free(data);
    nb_optim_free(opt);
    gpt_pipe_free(p, mesh, model);
    MT_END();
}

START_TEST(test_pipe_schedules_hold) {
    check_schedule(NB_PIPE_GPIPE, 1);
    check_schedule(NB_PIPE_1F1B, 1);
    check_schedule(NB_PIPE_INTERLEAVED, 2);
}
END_TEST

/* ---- the split ------------------------------------------------------------------------------ */
/* By parameters: with a vocabulary of 512 (wte is 2.5 blocks) on 4 stages, the first and the
 * last stage (the embedding, the head: both hold wte) take one block each and the middle ones
 * three: the largest stage has 11600 parameters instead of 14880 split evenly. The layers are
 * the embedding, the 8 blocks and the head. */
START_TEST(test_pipe_balance) {
    nb_gpt_config big = *base_cfg();
    big.vocab_size = 512;
    nb_mesh *mesh;
    nb_module *model;
    nb_pipeline *p = gpt_pipe(&big, 4, NB_PIPE_1F1B, 1, NB_PIPE_BALANCE_PARAMS, &mesh, &model);
    int S = 0;
    const int *b = p ? nb_pipeline_boundaries(p, &S) : NULL;
    const int want[3][5] = {{0, 10}, {0, 5, 10}, {0, 2, 5, 8, 10}};
    const int w = mt_size == 4 ? 2 : mt_size - 1;
    MT_CHECK(p && nb_pipeline_num_layers(p) == 10, "layers %d", p ? nb_pipeline_num_layers(p) : -1);
    for (int s = 0; b && s <= S && mt_size <= 4; s++)
        MT_CHECK(b[s] == want[w][s], "%d stages: boundary %d is %d, expected %d", S, s, b[s],
                 want[w][s]);
    gpt_pipe_free(p, mesh, model);
    MT_END();
}
END_TEST

/* A model of the test's own whose forward is a chain of its children. */
static nb_module *chain(int n) {
    nb_generator *g = nb_generator_new(2);
    nb_linear_opts lo = nb_linear_defaults();
    lo.gen = g;
    nb_module *mods[8];
    for (int i = 0; i < n; i++) mods[i] = nb_linear_new(6, 6, &lo);
    nb_generator_free(g);
    return nb_sequential_new_n(mods, n);
}

static nb_tensor *sum_loss(nb_tensor *out, nb_tensor *y, void *ctx) {
    (void)y, (void)ctx;
    return nb_mean(nb_mul(out, out), NULL, 0, false);
}

/* Bad splits: the same clear error on every rank, before anything changes. */
START_TEST(test_pipe_bad_splits) {
    nb_mesh *mesh = nb_mesh_new(mt_world, "pp", (int[]){-1});
    nb_pipeline_opts po = nb_pipeline_defaults();
    po.loss = sum_loss;
    /* fewer layers than stages (interleaved: 2 a rank) */
    nb_module *m = chain(mt_size);
    po.schedule = NB_PIPE_INTERLEAVED;
    po.virtual_stages = 2;
    po.n_micro = 2 * mt_size;
    nb_pipeline *p = nb_pipeline_new(m, mesh, NULL, 0, &po);
    MT_CHECK(!p && nb_last_status() == NB_EINVAL && strstr(nb_last_error(), "cannot fill"),
             "too few layers: %s", nb_last_error());
    nb_module_free(m);
    /* virtual stages without the interleaved schedule */
    po = nb_pipeline_defaults();
    po.loss = sum_loss;
    po.virtual_stages = 2;
    m = chain(8);
    MT_CHECK(!nb_pipeline_new(m, mesh, NULL, 0, &po) && strstr(nb_last_error(), "interleaved"),
             "v without interleaved: %s", nb_last_error());
    /* boundaries that are not increasing from 0 to the layer count */
    po = nb_pipeline_defaults();
    po.loss = sum_loss;
    const int bad[5] = {0, 3, 3, 5, 8};
    po.boundaries = bad;
    MT_CHECK(!nb_pipeline_new(m, mesh, NULL, 0, &po) && strstr(nb_last_error(), "boundaries"),
             "bad boundaries: %s", nb_last_error());
    /* a layer naming no module; a module in two layers */
    po = nb_pipeline_defaults();
    po.loss = sum_loss;
    MT_CHECK(!nb_pipeline_new(m, mesh, (nb_pipe_layer[]){{"0"}, {"9"}}, 2, &po) &&
                 strstr(nb_last_error(), "\"9\" names no module"),
             "unknown module: %s", nb_last_error());
    MT_CHECK(!nb_pipeline_new(m, mesh, (nb_pipe_layer[]){{"*"}, {"3"}}, 2, &po) &&
                 strstr(nb_last_error(), "'3' is in layers"),
             "a module in two layers: %s", nb_last_error());
    /* a parameter in no layer */
    MT_CHECK(!nb_pipeline_new(m, mesh, (nb_pipe_layer[]){{"0"}, {"1"}, {"2"}, {"3"}}, 4, &po) &&
                 strstr(nb_last_error(), "is in no layer"),
             "a parameter in no layer: %s", nb_last_error());
    /* the model is untouched by the refusals: a good split still trains */
    po.n_micro = 3;
    p = nb_pipeline_new(m, mesh, NULL, 0, &po);
    MT_CHECK(p != NULL, "build: %s", nb_last_error());
    /* ZeRO stage 3 over the pipeline's module is refused (stages 0-2 work: test_parallel_gpt) */
    nb_optim *opt = pipe_sgd(p);
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = 3;
    nb_zero *z = opt ? nb_zero_new(nb_pipeline_module(p), opt, nb_mesh_group(mesh, "dp"), &zo)
                     : NULL;
    MT_CHECK(opt && !z && nb_last_status() == NB_EUNSUPPORTED && strstr(nb_last_error(), "stage 3"),
             "ZeRO-3 over a pipeline: %s", z ? "accepted" : nb_last_error());
    nb_zero_free(z);
    nb_optim_free(opt);
    nb_scope_begin();
    nb_tensor *x = nb_zeros((int64_t[]){8, 6}, 2, NB_F32);
    double loss = p ? nb_pipeline_step(p, x, x, NULL) : 0;
    MT_CHECK(isnan(loss) && nb_last_status() == NB_EINVAL && strstr(nb_last_error(), "equal micro"),
             "3 micro-batches of 8: %s", nb_last_error());
    nb_scope_end();
    nb_pipeline_free(p);
    nb_module_free(m);
    nb_mesh_free(mesh);
    MT_END();
}
END_TEST

/* ---- evaluation ------------------------------------------------------------------------------ */
/* Forward only, dropout off: the mean loss the same on every rank and equal to the one-process
 * model's nb_gpt_loss on the batch; the dropout stream does not move, the module stays in
 * training mode; under bf16 autocast within 2% of f32. */
static void check_eval(nb_pipe_schedule s, int v) {
    nb_gpt_config c1 = *base_cfg(), c2 = *base_cfg();
    nb_generator *d1 = nb_generator_new(3), *data = nb_generator_new(7);
    c1.dropout = c2.dropout = 0.1;
    c1.dropout_gen = d1;
    nb_mesh *mesh;
    nb_module *model;
    nb_pipeline *p = gpt_pipe(&c1, 11, s, v, NB_PIPE_BALANCE_LAYERS, &mesh, &model);
    nb_generator *g2 = nb_generator_new(11);
    nb_module *ref = nb_gpt_new(&c2, g2);
    nb_generator_free(g2);
    nb_scope_begin();
    const int64_t B = MICRO * MB;
    nb_tensor *X = nb_randint((int64_t[]){B, SEQ}, 2, NB_I64, 0, base_cfg()->vocab_size, data);
    nb_tensor *Y = nb_randint((int64_t[]){B, SEQ}, 2, NB_I64, 0, base_cfg()->vocab_size, data);
    nb_module_train(ref, false);
    bool prev = nb_set_grad_enabled(false);
    nb_tensor *l = nb_gpt_loss(ref, X, Y);
    const double want = l ? nb_item_f64(l) : NAN;
    nb_set_grad_enabled(prev);
    double got = NAN, got16 = NAN;
    if (p) {
        const uint64_t at = nb_generator_offset(d1);
        nb_pipe_stats st;
        MT_OK(nb_pipeline_eval(p, X, Y, &got, &st));
        MT_CHECK(mt_rel_diff(got, want) <= 1e-5, "%s v %d: eval loss %.9g, 1 process %.9g",
                 nb_pipe_schedule_name(s), v, got, want);
        MT_CHECK(st.peak_live_micro == 1, "eval held %lld micro-batches at once",
                 (long long)st.peak_live_micro);
        MT_CHECK(nb_generator_offset(d1) == at, "the evaluation moved the dropout stream");
        MT_CHECK(nb_module_is_training(model), "the model is left in evaluation mode");
        MT_OK(nb_autocast_begin(NB_BF16));
        MT_OK(nb_pipeline_eval(p, X, Y, &got16, NULL));
        MT_OK(nb_autocast_end());
        MT_CHECK(mt_rel_diff(got16, got) <= 0.02 && got16 != got, "bf16 eval %.6g vs f32 %.6g",
                 got16, got);
        double bad = 0;
        MT_CHECK(nb_pipeline_eval(p, nb_narrow(X, 0, 0, B - 1), nb_narrow(Y, 0, 0, B - 1), &bad,
                                  NULL) == NB_EINVAL && isnan(bad),
                 "a batch of %lld rows in %d micro-batches was accepted", (long long)(B - 1),
                 MICRO);
    }
    nb_scope_end();
    nb_module_free(ref);
    gpt_pipe_free(p, mesh, model);
    nb_generator_free(d1);
    nb_generator_free(data);
    MT_END();
}

START_TEST(test_pipe_eval) {
    check_eval(NB_PIPE_1F1B, 1);
    check_eval(NB_PIPE_INTERLEAVED, 2);
}
END_TEST

/* ---- activation checkpointing and mixed precision -------------------------------------------- */
/* cfg.recompute FULL or ATTN: bit-identical losses and weights; bf16 autocast within 2% of
 * f32; fp16 with a loss scaler over the world (first scale 2^19: the first steps overflow and
 * are skipped on every rank alike). One step function for every layout: nb_gpt_train_step_ex
 * with the pipeline. */
static double pipe_train(nb_gpt_recompute rc, nb_dtype prec, double *w_sum, int64_t *skipped,
                         double *scale) {
    nb_gpt_config c = *base_cfg();
    c.recompute = rc;
    nb_grad_scaler_opts sco = nb_grad_scaler_defaults();
    sco.init_scale = 524288.0;
    nb_grad_scaler *sc = prec == NB_F16 ? nb_grad_scaler_new(&sco) : NULL;
    if (sc) MT_OK(nb_grad_scaler_set_comm(sc, mt_world));
    nb_mesh *mesh = nb_mesh_new(mt_world, "pp", (int[]){-1});
    nb_generator *g = nb_generator_new(11), *data = nb_generator_new(5);
    nb_module *model = nb_gpt_new(&c, g);
    nb_pipeline_opts po = nb_pipeline_defaults();
    po.n_micro = MICRO;
    po.scaler = sc;
    nb_pipeline *p = nb_gpt_pipeline_new(model, mesh, &po);
    nb_optim *opt = p ? nb_adamw_new(nb_parameters(nb_pipeline_module(p)), NULL) : NULL;
    MT_CHECK(opt, "build: %s", nb_last_error());
    double loss = NAN;
    for (int step = 0; step < 2 * STEPS && opt; step++) {
        nb_scope_begin();
        nb_tensor *X =
            nb_randint((int64_t[]){MICRO * MB, SEQ}, 2, NB_I64, 0, base_cfg()->vocab_size, data);
        nb_tensor *Y =
            nb_randint((int64_t[]){MICRO * MB, SEQ}, 2, NB_I64, 0, base_cfg()->vocab_size, data);
        nb_gpt_step_opts so = nb_gpt_step_defaults();
        so.grad_clip = 1.0, so.scaler = sc, so.pipeline = p;
        if (prec != NB_F32) MT_OK(nb_autocast_begin(prec));
        loss = nb_gpt_train_step_ex(model, opt, &X, &Y, 1, &so, NULL);
        if (prec != NB_F32) MT_OK(nb_autocast_end());
        MT_CHECK(!isnan(loss), "step %d: %s", step, nb_last_error());
        nb_scope_end();
    }
    *w_sum = 0;
    const nb_params *ps = p ? nb_parameters(nb_pipeline_module(p)) : NULL;
    for (int i = 0; ps && i < ps->count; i++) {
        nb_scope_begin();
        *w_sum += nb_item_f64(nb_sum(nb_mul(ps->tensors[i], ps->tensors[i]), NULL, 0, false));
        nb_scope_end();
    }
    *skipped = sc ? nb_grad_scaler_num_skipped(sc) : 0;
    *scale = sc ? nb_grad_scaler_get_scale(sc) : 0;
    nb_optim_free(opt);
    nb_pipeline_free(p);
    nb_module_free(model);
    nb_mesh_free(mesh);
    nb_grad_scaler_free(sc);
    nb_generator_free(g);
    nb_generator_free(data);
    return loss;
}

START_TEST(test_pipe_recompute_precision) {
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
    MT_CHECK(mt_rel_diff(l3, l0) <= 0.02 && l3 != l0, "bf16 loss %.6g vs f32 %.6g", l3, l0);
    MT_CHECK(mt_rel_diff(l4, l0) <= 0.02, "fp16 loss %.6g vs f32 %.6g", l4, l0);
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
    tcase_add_test(tc, test_pipe_schedules_hold);
    tcase_add_test(tc, test_pipe_balance);
    tcase_add_test(tc, test_pipe_bad_splits);
    tcase_add_test(tc, test_pipe_eval);
    tcase_add_test(tc, test_pipe_recompute_precision);
    suite_add_tcase(s, tc);
    return s;
}
