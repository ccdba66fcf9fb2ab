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
 * gradient sums is all that differs between layouts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_test.h"

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

/* A tensor-parallel size that does not divide the key/value heads: the same clear error on
 * every rank, the model unchanged. */
START_TEST(test_llama_plan_errors) {
    if (mt_size > 1) {
        nb_mesh *mesh = nb_mesh_new(mt_world, "tp", (int[]){mt_size});
        nb_llama_config c = config();
        c.n_kv_head = 1; /* 8 query heads on one key/value head */
        nb_module *m = nb_llama_new(&c, NULL);
        const nb_status st = nb_llama_parallelize(m, mesh, NULL);
        MT_CHECK(st == NB_EINVAL && strstr(nb_last_error(), "must divide n_head (8) and "
                                                            "n_kv_head (1)"),
                 "tp %d, one key/value head: %s", mt_size, nb_last_error());
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
    suite_add_tcase(s, tc);
    return s;
}
