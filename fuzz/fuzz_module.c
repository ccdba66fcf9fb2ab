/* fuzz_module.c - nb_module_load (io/state.c) on arbitrary bytes into a small model, strict
 * and not: names, shapes and dtypes matched against the model's parameters and buffers (a
 * failed load changes nothing), then a forward pass on whatever was loaded. */
#include "fuzz.h"
#include "module_model.h"
#include "nabla/io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_file(data, size, path, sizeof path);
    nb_module *m = fuzz_module_model(6);
    if (!m) {
        fprintf(stderr, "fuzz: cannot build the model: %s\n", nb_last_error());
        abort();
    }
    for (int strict = 0; strict < 2; strict++)
        if (nb_module_load(m, path, strict) == NB_OK) {
            nb_scope_begin();
            nb_tensor *y = nb_forward(m, nb_ones((int64_t[]){2, 4}, 2, NB_F32));
            FUZZ_CHECK(y != NULL && nb_numel(y) == 6);
            nb_scope_end();
        }
    nb_module_free(m);
    close(fd);
    nb_clear_error();
    return 0;
}
