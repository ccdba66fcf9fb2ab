/* main.c - runs the Check suites: all of them, or those NB_SUITE names (one name, or a
 * comma-separated list); CK_* variables as usual. NB_TEST_DEVICE picks the device the
 * tests' tensors are made on (default device, see below). Ends with Check's summary line,
 * and exits non-zero on any failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define SUITE(name) {#name, nb_suite_##name}

static bool listed(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return true;
        p = end ? end + 1 : NULL;
    }
    return false;
}

int main(void) {
    static const struct {
        const char *name;
        Suite *(*make)(void);
    } suites[] = {
        SUITE(core),     SUITE(memory),      SUITE(errors),   SUITE(dtype),
        SUITE(random),   SUITE(elementwise), SUITE(reduce),   SUITE(matmul),
        SUITE(index),    SUITE(cuda),        SUITE(cuda_host), SUITE(cuda_policy), SUITE(autograd), SUITE(grad_ops),
        SUITE(grad_reduce), SUITE(nn_conv),  SUITE(nn_layers), SUITE(loss),
        SUITE(optim),    SUITE(train),       SUITE(checkpoint), SUITE(data), SUITE(fault),
        SUITE(io),       SUITE(gpt),         SUITE(attention), SUITE(backend),
        SUITE(run),
        SUITE(trace),
        SUITE(recompute),
        SUITE(scaler),
        SUITE(autocast),
        SUITE(lm_ops),
        SUITE(llama),
        SUITE(options),
    };
    /* NB_TEST_DEVICE=guard runs the suites with guard tensors: every tensor the tests make
     * through the library (nb_zeros, nb_randn, nb_from_buffer, tu_tensor, ...) lives in
     * memory the host cannot touch outside a backend call, so an op, the engine or an
     * optimizer that dereferences device memory crashes. (Tests that read results through
     * nb_data are host-only and are not run this way.) */
#ifdef NB_TEST_CUDA_PLUGIN
    /* This build's CUDA plugin (the program links libnabla statically, so the loader would
     * look next to the program), unless the caller chose one. */
    setenv("NB_CUDA_PLUGIN", NB_TEST_CUDA_PLUGIN, 0);
#endif
    const char *dev = getenv("NB_TEST_DEVICE");
    if (dev && *dev) {
        nb_device d;
        if (nb_device_parse(dev, &d) != NB_OK) {
            fprintf(stderr, "NB_TEST_DEVICE: %s\n", nb_last_error());
            return EXIT_FAILURE;
        }
        nb_set_default_device(d);
    }
    const char *only = getenv("NB_SUITE");
    SRunner *sr = NULL;
    for (size_t i = 0; i < sizeof suites / sizeof suites[0]; i++) {
        if (only && *only && !listed(only, suites[i].name)) continue;
        Suite *s = suites[i].make();
        if (!sr) sr = srunner_create(s);
        else srunner_add_suite(sr, s);
    }
    if (!sr) {
        fprintf(stderr, "NB_SUITE=%s names no suite\n", only);
        return EXIT_FAILURE;
    }
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
