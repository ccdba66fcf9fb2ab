/* fuzz_text.c - the byte-level text path of the language models on arbitrary bytes:
 * nb_read_bytes (plain or gzip, decided by content), the train/validation split, the
 * next-token window dataset through a shuffling loader, and nb_text_sample. The first
 * byte of the input picks the block size (1..16). */
#include "fuzz.h"
#include "nabla/data.h"
#include "nabla/random.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_file(data, size, path, sizeof path);
    nb_tensor *tok = nb_read_bytes(path);
    close(fd);
    if (!tok) {
        nb_clear_error();
        return 0;
    }
    int64_t n = nb_numel(tok);
    int64_t block = size ? 1 + data[0] % 16 : 1;

    nb_dataset *ds = nb_text_dataset_new(tok, block);
    FUZZ_CHECK(!ds == !(n > block)); /* refused exactly when too short */
    if (ds) {
        FUZZ_CHECK(nb_dataset_len(ds) == n - block);
        nb_loader_opts lo = nb_loader_defaults();
        lo.batch_size = 3;
        lo.shuffle = true;
        lo.seed = size;
        nb_loader *l = nb_loader_new(ds, &lo);
        FUZZ_CHECK(l != NULL);
        nb_batch b;
        for (int i = 0; i < 8 && nb_loader_next(l, &b); i++)
            FUZZ_CHECK(nb_size(b.x, 1) == block && nb_size(b.y, 1) == block);
        FUZZ_CHECK(nb_loader_error(l) == NB_OK);
        nb_loader_free(l);
        nb_dataset_free(ds);
    }

    nb_tensor *train = NULL, *val = NULL;
    if (nb_text_split(tok, 0.9, &train, &val) == NB_OK) {
        nb_generator *g = nb_generator_new(size);
        nb_tensor *x = nb_empty((int64_t[]){2, block}, 2, NB_I64);
        nb_tensor *y = nb_empty((int64_t[]){2, block}, 2, NB_I64);
        nb_status st = nb_text_sample(train, g, x, y);
        FUZZ_CHECK(st == NB_OK || nb_numel(train) <= block);
        nb_tensor_free(x);
        nb_tensor_free(y);
        nb_generator_free(g);
        nb_tensor_free(train);
        nb_tensor_free(val);
    }
    nb_tensor_free(tok);
    nb_clear_error();
    return 0;
}
