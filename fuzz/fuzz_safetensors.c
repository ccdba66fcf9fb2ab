/* fuzz_safetensors.c - nb_safetensors_open on arbitrary bytes, then everything a handle
 * answers: names, lookups, header info, metadata, each tensor both as a view of the mapped
 * file and as a copy with their data read, and the recorded checksums (verify). */
#include <string.h>

#include "fuzz.h"
#include "nabla/io.h"

static void read_all(nb_tensor *t) {
    /* the sum touches every element, mapped or copied */
    nb_tensor *s = nb_sum(t, NULL, 0, false);
    nb_tensor_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_file(data, size, path, sizeof path);
    nb_safetensors *f = nb_safetensors_open(path);
    nb_tensor *keep = NULL;
    if (f) {
        int n = nb_safetensors_count(f);
        FUZZ_CHECK(n >= 0);
        for (int i = 0; i <= n; i++) { /* one past the end: NULL / an error */
            const char *name = nb_safetensors_name(f, i);
            nb_safetensors_info info;
            nb_status st = nb_safetensors_info_at(f, i, &info);
            if (i == n) {
                FUZZ_CHECK(!name && st != NB_OK);
                break;
            }
            FUZZ_CHECK(name && st == NB_OK && strcmp(info.name, name) == 0);
            FUZZ_CHECK(nb_safetensors_find(f, name) == i);
            FUZZ_CHECK(info.data_begin <= info.data_end);
            nb_tensor *t = nb_safetensors_get(f, name);
            nb_tensor *c = nb_safetensors_get_copy(f, name);
            FUZZ_CHECK(!t == !c);
            if (t) {
                FUZZ_CHECK(info.supported && nb_numel(t) == nb_numel(c));
                read_all(t);
                read_all(c);
            }
            nb_tensor_free(c);
            if (t && !keep) keep = t; /* used after the handle is closed */
            else nb_tensor_free(t);
        }
        for (int i = 0; i <= nb_safetensors_metadata_count(f); i++) {
            const char *k = nb_safetensors_metadata_key(f, i);
            if (k) FUZZ_CHECK(nb_safetensors_metadata(f, k) != NULL);
        }
        FUZZ_CHECK(nb_safetensors_get(f, "no such tensor \x01") == NULL);
        int checked = -1; /* the recorded checksums (nabla's files have them) */
        if (nb_safetensors_verify(f, &checked) == NB_OK) FUZZ_CHECK(checked >= 0 && checked <= n);
        nb_safetensors_close(f);
    }
    if (keep) read_all(keep); /* the mapping outlives the handle */
    nb_tensor_free(keep);
    nb_clear_error();
    close(fd);
    return 0;
}
