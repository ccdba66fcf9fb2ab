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

static nb_module *make_gpt(void) {
    nb_gpt_config c = nb_gpt_config_defaults();
    c.vocab_size = 64, c.block_size = MT_T, c.n_layer = 4, c.n_head = 4, c.n_embd = 32;
    nb_generator *init = nb_generator_new(7);
    nb_module *m = nb_gpt_new(&c, init);
    nb_generator_free(init);
    return m;
}

/* The harness (mpi_test_util.c) trains it in every layout against one process. */
static mt_model gpt = {.make = make_gpt,
                       .step = nb_gpt_train_step_ex,
                       .parallelize = nb_gpt_parallelize,
                       .pipeline_new = nb_gpt_pipeline_new};

START_TEST(test_gpt_layouts) {
    mt_check_layouts(&gpt);
    MT_END();
}
END_TEST

/* Each rule of the parallel layer is needed: with it switched off, a layout that depends on it
 * no longer equals one process. */
static void knock_out(const char *what, const mt_layout *L) {
    if (L->dp * L->pp * L->tp != mt_size) return;
    char why[512], name[128];
    nb__test_knockout(what);
    mt_run_layout(&gpt, L, why, sizeof why);
    nb__test_knockout(NULL);
    mt_describe_layout(L, name, sizeof name);
    MT_CHECK(mt_any_rank(why[0] != 0), "%s: with \"%s\" switched off it still equals one process",
             name, what);
}

START_TEST(test_gpt_rules_needed) {
    /* the tied embedding's gradient is the sum of the first and the last stage's */
    knock_out("tie-sum", &(mt_layout){1, 2, 1, false, NB_PIPE_1F1B, 1, 4, 0});
    /* a replicated parameter counted on every tp rank inflates the norm */
    knock_out("count-once", &(mt_layout){1, 1, 2, false, NB_PIPE_1F1B, 1, 1, 0});
    knock_out("count-once", &(mt_layout){1, 1, 4, false, NB_PIPE_1F1B, 1, 1, 0});
    /* the sequence-parallel partial gradients (layer norms, row-wise biases) need their sum */
    knock_out("partial-sum", &(mt_layout){1, 1, 2, true, NB_PIPE_1F1B, 1, 1, 0});
    knock_out("partial-sum", &(mt_layout){2, 1, 2, true, NB_PIPE_1F1B, 1, 1, 0});
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
