/* test_parallel_llama.c - the one Llama (nabla/llama.h) made parallel by its plan and its split
 * (nb_llama_parallelize, nb_llama_pipeline_new: zoo/llama_parallel.c, its only parallel code)
 * equals one process, in nabla_mpi_tests (1, 2 and 4 ranks, and alone). The model has grouped
 * key/value heads (8 query heads on 4), so tensor parallelism splits both.
 *
 * Every layout the world size allows (dp x pp x tp, with and without sequence parallelism, each
 * pipeline schedule, ZeRO over dp) trains K AdamW steps on the same global batches as one
 * process: the losses and the first step's gradient norm agree to 1e-5 relative, and every
 * parameter this rank holds ends as close to its part of the one-process parameter as the f32
 * drift of one process allows. That bound is measured, not guessed: the one-process run is
 * repeated with each batch split into 2 and into 4 accumulated micro-batches (the same
 * arithmetic in another order), the largest difference any parameter shows is the drift, and
 * a layout's parameters may differ at most 8 times as far, as float reassociation of the
 * gradient sums is all that differs between layouts.
 *
 * Fewer key/value heads than tensor-parallel ranks (4 query heads on 1 or 2 key/value heads,
 * at tp 2 and 4): each key/value head is held by the ranks of its query heads (a shard with
 * copies), its projections' gradients summed over those copies by the reducer; every layout
 * with tp > 1 equals one process, and does not once that sum is switched off. A checkpoint of
 * such a model moves between tp = the world and one process both ways (each copy reads the
 * piece its first copy wrote), and its consolidated file is the one process's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcp_layouts.h"
#include "mpi_test.h"
#include "parallel/mesh_impl.h"

static nb_llama_config config(void) {
    nb_llama_config lc = nb_llama_config_defaults();
    lc.vocab_size = 64, lc.block_size = MT_T, lc.n_layer = 4, lc.n_head = 8, lc.n_kv_head = 4;
    lc.n_embd = 64, lc.n_inner = 96;
    return lc;
}

static nb_module *make_llama(void) {
    nb_llama_config c = config();
    nb_generator *init = nb_generator_new(7);
    nb_module *m = nb_llama_new(&c, init);
    nb_generator_free(init);
    return m;
}

/* The harness (mpi_test_util.c) trains it in every layout against one process. */
static mt_model llama = {.make = make_llama,
                         .step = nb_llama_train_step,
                         .parallelize = nb_llama_parallelize,
                         .pipeline_new = nb_llama_pipeline_new};

START_TEST(test_llama_layouts) {
    mt_check_layouts(&llama);
    MT_END();
}
END_TEST

/* 4 query heads of size 8 on n_kv key/value heads (seed 7). */
static nb_module *make_gqa(int64_t n_kv) {
    nb_llama_config c = config();
    c.n_head = 4, c.n_kv_head = n_kv, c.n_embd = 32;
    nb_generator *init = nb_generator_new(7);
    nb_module *m = nb_llama_new(&c, init);
    nb_generator_free(init);
    return m;
}
static nb_module *make_kv1(void) { return make_gqa(1); }
static nb_module *make_kv2(void) { return make_gqa(2); }
static mt_model kv1 = {.make = make_kv1,
                       .step = nb_llama_train_step,
                       .parallelize = nb_llama_parallelize,
                       .pipeline_new = nb_llama_pipeline_new};
static mt_model kv2 = {.make = make_kv2,
                       .step = nb_llama_train_step,
                       .parallelize = nb_llama_parallelize,
                       .pipeline_new = nb_llama_pipeline_new};

/* Key/value heads held by several ranks: at tp 4 one head on 4 ranks (n_kv 1) or each of 2
 * heads on 2 (n_kv 2); at tp 2 one head on 2 ranks. The k/v projections' placements say so. */
START_TEST(test_llama_kv_replicated) {
    if (mt_size > 1) {
        nb_mesh *mesh = nb_mesh_new(mt_world, "tp", (int[]){mt_size});
        nb_module *m = make_kv1();
        MT_OK(nb_llama_parallelize(m, mesh, NULL));
        nb_placement pl;
        MT_OK(nb_tensor_placement(nb_module_find(m, "model.layers.0.self_attn.k_proj.weight"),
                                  &pl));
        MT_CHECK(pl.n == 1 && pl.places[0].kind == NB_PLACE_SHARD && pl.places[0].copies ==
                     mt_size && pl.places[0].offset == 0 && pl.places[0].length == 8,
                 "tp %d, one key/value head: k_proj placed as %s", mt_size,
                 nb_placement_describe(&pl, (char[160]){0}, 160));
        MT_CHECK(nb_placement_counts(&pl) == (mt_rank == 0), "k_proj counts on rank 0 only");
        MT_OK(nb_tensor_placement(nb_module_find(m, "model.layers.0.self_attn.q_proj.weight"),
                                  &pl));
        MT_CHECK(pl.places[0].copies <= 1 && pl.places[0].length == 32 / mt_size,
                 "q_proj: %s", nb_placement_describe(&pl, (char[160]){0}, 160));
        /* the copies' gradients are partial: without a reducer to sum them the step refuses */
        nb_optim *o = nb_adamw_new(nb_parameters(m), NULL);
        nb_scope_begin();
        nb_tensor *x = nb_zeros((int64_t[]){2, MT_T}, 2, NB_I64);
        double loss = nb_llama_train_step(m, o, &x, &x, 1, NULL, NULL);
        char want[64];
        snprintf(want, sizeof want, "(a piece %d ranks hold", mt_size);
        MT_CHECK(isnan(loss) && strstr(nb_last_error(), want) &&
                     strstr(nb_last_error(), "wrap the model with nb_ddp_new"),
                 "a step without a reducer: loss %g, %s", loss, nb_last_error());
        nb_clear_error();
        nb_scope_end();
        nb_optim_free(o);
        nb_module_free(m);
        nb_mesh_free(mesh);
    }
    mt_check_layouts_tp(&kv1, 2);
    mt_check_layouts_tp(&kv2, 2);
    MT_END();
}
END_TEST

/* The copies' gradients need their sum: without it a replicated layout drifts from one
 * process. */
START_TEST(test_llama_kv_sum_needed) {
    const mt_layout layouts[] = {{1, 1, 4, false, NB_PIPE_1F1B, 1, 1, 0},
                                 {2, 1, 2, true, NB_PIPE_1F1B, 1, 1, 1},
                                 {1, 1, 2, false, NB_PIPE_1F1B, 1, 1, 0}};
    for (int i = 0; i < 3; i++) {
        const mt_layout *L = &layouts[i];
        if (L->dp * L->pp * L->tp != mt_size) continue;
        char why[512], name[128];
        nb__test_knockout("copies-sum");
        mt_run_layout(&kv1, L, why, sizeof why);
        nb__test_knockout(NULL);
        mt_describe_layout(L, name, sizeof name);
        MT_CHECK(mt_any_rank(why[0] != 0), "%s: with the copies' sum switched off it still equals "
                 "one process", name);
    }
    MT_END();
}
END_TEST

/* ---- checkpoints across tp = the world and one process ---------------------------------- */
static nb_optim *adamw(nb_module *m) {
    nb_adamw_opts ao = nb_adamw_defaults();
    ao.lr = 1e-2;
    return nb_adamw_new(nb_parameters(m), &ao);
}

/* One training step on batch `step` (the same on every rank: tp splits no batch). */
static double train(nb_module *m, nb_optim *o, nb_ddp *ddp, int step) {
    nb_scope_begin();
    nb_generator *g = nb_generator_new(300 + (uint64_t)step);
    nb_tensor *x = nb_randint((int64_t[]){4, MT_T}, 2, NB_I64, 0, 64, g);
    nb_tensor *y = nb_randint((int64_t[]){4, MT_T}, 2, NB_I64, 0, 64, g);
    nb_generator_free(g);
    nb_gpt_step_opts so = nb_gpt_step_defaults();
    so.ddp = ddp;
    double loss = nb_llama_train_step(m, o, &x, &y, 1, &so, NULL);
    nb_scope_end();
    return loss;
}

/* Every parameter of the tensor-parallel model t is exactly its part of the whole model w's
 * (the copies of a replicated key/value head included). */
static void expect_parts(nb_module *t, nb_module *w, const char *what) {
    const nb_params *ps = nb_parameters(t);
    for (int i = 0; ps && i < ps->count; i++) {
        nb_placement pl;
        MT_OK(nb_tensor_placement(ps->tensors[i], &pl));
        nb_scope_begin();
        nb_tensor *part = nb_module_find(w, ps->names[i]);
        for (int k = 0; part && k < pl.n; k++)
            if (pl.places[k].kind == NB_PLACE_SHARD)
                part = nb_narrow(part, pl.places[k].dim, pl.places[k].offset, pl.places[k].length);
        nb_tensor *d = part ? nb_amax(nb_abs(nb_sub(part, ps->tensors[i])), NULL, 0, false) : NULL;
        MT_CHECK(d && nb_item_f64(d) == 0, "%s: %s is not its part of the whole (%s)", what,
                 ps->names[i], nb_placement_describe(&pl, (char[160]){0}, 160));
        nb_scope_end();
    }
}

START_TEST(test_llama_kv_checkpoint) {
    if (mt_size > 1) {
        char tmp[64], dir[128], plain[128], cons[128], why[256];
        mt_tmpdir(tmp, "nb-kvrep");
        snprintf(dir, sizeof dir, "%s/tp.ckpt", tmp);
        snprintf(plain, sizeof plain, "%s/one.ckpt", tmp);
        snprintf(cons, sizeof cons, "%s/cons.ckpt", tmp);
        nb_mesh *mesh = nb_mesh_new(mt_world, "dp tp", (int[]){1, mt_size});
        /* tp = the world, one key/value head on every rank: 2 steps, saved, a third */
        nb_module *t = make_kv1();
        MT_OK(nb_llama_parallelize(t, mesh, NULL));
        nb_optim *to = adamw(t);
        nb_ddp *ddp = nb_ddp_new(t, nb_mesh_group(mesh, "dp"), NULL);
        MT_CHECK(ddp != NULL, "ddp: %s", nb_last_error());
        for (int s = 0; s < 2; s++) train(t, to, ddp, s);
        nb_checkpoint tc = {.model = t, .optim = to, .step = 2};
        MT_OK(nb_checkpoint_save(dir, &tc));
        /* into one process (each rank alone): the same model, the same next step */
        nb_module *w = make_kv1();
        nb_optim *wo = adamw(w);
        nb_checkpoint wc = {.model = w, .optim = wo};
        MT_OK(nb_checkpoint_load(dir, &wc));
        MT_CHECK(wc.step == 2, "step %lld", (long long)wc.step);
        expect_parts(t, w, "tp -> one process");
        /* consolidated, the folder is what one process saves of the same state */
        if (mt_rank == 0) {
            MT_OK(nb_checkpoint_save(plain, &wc));
            MT_OK(nb_checkpoint_consolidate(dir, cons, false));
            MT_CHECK(dcp_same_tensors(plain, cons, why, sizeof why), "consolidated: %s", why);
        }
        double lt = train(t, to, ddp, 2), lw = train(w, wo, NULL, 2);
        MT_CHECK(fabs(lt - lw) <= 1e-5 * fabs(lw), "step 3 after the load: tp %.9g, one process "
                 "%.9g", lt, lw);
        /* the reverse: one process's file (rank 0's) into a fresh tp model */
        nb_checkpoint w3 = {.model = w, .optim = wo, .step = 3};
        if (mt_rank == 0) MT_OK(nb_checkpoint_save(plain, &w3));
        mt_barrier();
        nb_module *t2 = make_kv1();
        MT_OK(nb_llama_parallelize(t2, mesh, NULL));
        nb_optim *t2o = adamw(t2);
        nb_ddp *ddp2 = nb_ddp_new(t2, nb_mesh_group(mesh, "dp"), NULL);
        MT_CHECK(ddp2 != NULL, "ddp: %s", nb_last_error());
        nb_checkpoint t2c = {.model = t2, .optim = t2o};
        MT_OK(nb_checkpoint_load(plain, &t2c));
        expect_parts(t2, w, "one process -> tp");
        lt = train(t2, t2o, ddp2, 3), lw = train(w, wo, NULL, 3);
        MT_CHECK(fabs(lt - lw) <= 1e-5 * fabs(lw), "step 4 after the load: tp %.9g, one process "
                 "%.9g", lt, lw);
        nb_ddp_free(ddp2);
        nb_optim_free(t2o);
        nb_module_free(t2);
        nb_optim_free(wo);
        nb_module_free(w);
        nb_ddp_free(ddp);
        nb_optim_free(to);
        nb_module_free(t);
        nb_mesh_free(mesh);
        mt_barrier();
        if (mt_rank == 0) mt_rmtree(tmp);
    }
    MT_END();
}
END_TEST

/* A tensor-parallel size that divides n_head but neither divides n_kv_head nor is a multiple
 * of it: the same clear error on every rank, the model unchanged. */
START_TEST(test_llama_plan_errors) {
    if (mt_size > 1) {
        nb_mesh *mesh = nb_mesh_new(mt_world, "tp", (int[]){mt_size});
        nb_llama_config c = config();
        c.n_head = 12, c.n_kv_head = 3, c.n_embd = 96; /* 12 query heads on 3 key/value heads */
        nb_module *m = nb_llama_new(&c, NULL);
        const nb_status st = nb_llama_parallelize(m, mesh, NULL);
        MT_CHECK(st == NB_EINVAL && strstr(nb_last_error(), "must divide n_head (12), and divide "
                                                            "n_kv_head (3) or be a multiple"),
                 "tp %d, 3 key/value heads: %s", mt_size, nb_last_error());
        nb_placement pl;
        MT_CHECK(nb_tensor_placement(nb_module_find(m, "model.layers.0.self_attn.q_proj.weight"),
                                     &pl) == NB_OK && pl.mesh == NULL,
                 "the refused plan changed the model");
        nb_clear_error();
        nb_module_free(m);
        nb_mesh_free(mesh);
    }
    MT_END();
}
END_TEST

Suite *mt_suite_parallel_llama(void) {
    Suite *s = suite_create("parallel_llama");
    TCase *tc = tcase_create("layouts");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_llama_layouts);
    tcase_add_test(tc, test_llama_plan_errors);
    tcase_add_test(tc, test_llama_kv_replicated);
    tcase_add_test(tc, test_llama_kv_sum_needed);
    tcase_add_test(tc, test_llama_kv_checkpoint);
    suite_add_tcase(s, tc);
    return s;
}
