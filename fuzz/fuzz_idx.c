/* fuzz_idx.c - nb_idx_read on arbitrary bytes (plain or gzip: the reader decides by
 * content), then nb_idx_dataset_new over the input split in two files (images, labels) at a
 * point the first byte chooses, and one batch from it when that succeeds. */
#include "fuzz.h"
#include "nabla/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_file(data, size, path, sizeof path);
    nb_tensor *t = nb_idx_read(path);
    if (t) {
        nb_tensor *s = nb_sum(t, NULL, 0, false); /* every element was written */
        FUZZ_CHECK(s != NULL);
        nb_tensor_free(s);
        nb_tensor_free(t);
    }
    close(fd);

    /* images | labels, cut at (first byte * 4) */
    if (size > 1) {
        size_t cut = (size_t)data[0] * 4;
        if (cut > size - 1) cut = size - 1;
        char ipath[64], lpath[64];
        int ifd = fuzz_file(data + 1, cut, ipath, sizeof ipath);
        int lfd = fuzz_file(data + 1 + cut, size - 1 - cut, lpath, sizeof lpath);
        nb_dataset *ds = nb_idx_dataset_new(ipath, lpath, NULL);
        if (ds) {
            int64_t n = nb_dataset_len(ds);
            FUZZ_CHECK(n >= 0);
            nb_loader_opts lo = nb_loader_defaults();
            lo.batch_size = 2;
            nb_loader *l = nb_loader_new(ds, &lo);
            FUZZ_CHECK(l != NULL);
            nb_batch b;
            if (n > 0) FUZZ_CHECK(nb_loader_next(l, &b));
            nb_loader_free(l);
            nb_dataset_free(ds);
        }
        close(ifd);
        close(lfd);
    }
    nb_clear_error();
    return 0;
}
