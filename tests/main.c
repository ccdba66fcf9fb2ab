/* main.c - runs every Check suite (NB_SUITE=name runs one; CK_* variables as usual).
 * Ends with Check's summary line, and exits non-zero on any failure. */
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

int main(void) {
    Suite *(*suites[])(void) = {
        nb_suite_core,   nb_suite_memory,      nb_suite_errors, nb_suite_dtype,
        nb_suite_random, nb_suite_elementwise, nb_suite_reduce, nb_suite_matmul,
        nb_suite_index,  nb_suite_cuda,        nb_suite_autograd, nb_suite_grad_ops, nb_suite_grad_reduce,
        nb_suite_nn_conv, nb_suite_nn_layers,  nb_suite_loss,   nb_suite_optim,
        nb_suite_train, nb_suite_checkpoint, nb_suite_data, nb_suite_io, nb_suite_gpt,
        nb_suite_attention, nb_suite_backend,
    };
    const char *only = getenv("NB_SUITE");
    SRunner *sr = NULL;
    for (size_t i = 0; i < sizeof suites / sizeof suites[0]; i++) {
        Suite *s = suites[i]();
        if (!sr) sr = srunner_create(s);
        else srunner_add_suite(sr, s);
    }
    if (only) setenv("CK_RUN_SUITE", only, 1);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
