/* fuzz_dcp_index.c - the index reader of checkpoint folders (index.json, io/dcp_index.c) on
 * arbitrary bytes: the input is written as index.json into a folder of its own (made once per
 * process) and read through the public calls that parse and validate it before anything
 * else: nb_checkpoint_latest (which then verifies every piece: the folder has no rank files,
 * so a valid index still fails there) and nb_checkpoint_consolidate (an index of no tensors
 * consolidates to an empty checkpoint). Nothing may crash, leak or hang, whatever the JSON,
 * the shapes, offsets and flat ranges, the piece counts or their overlaps. */
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"
#include "nabla/nabla.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char dir[64], index[96], out[96];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/nabla-fuzz-dcp-XXXXXX");
        if (!mkdtemp(dir)) {
            perror("fuzz: mkdtemp");
            abort();
        }
        snprintf(index, sizeof index, "%s/index.json", dir);
        snprintf(out, sizeof out, "%s/out.safetensors", dir);
    }
    FILE *f = fopen(index, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
        perror("fuzz: writing index.json");
        abort();
    }
    char path[256];
    int64_t step = 0;
    if (nb_checkpoint_latest(dir, path, sizeof path, &step) == NB_OK)
        FUZZ_CHECK(step == -1 || strcmp(path, dir) == 0);
    nb_clear_error();
    if (nb_checkpoint_consolidate(dir, out, false) == NB_OK) {
        nb_safetensors *s = nb_safetensors_open(out);
        FUZZ_CHECK(s != NULL);
        nb_safetensors_close(s);
        remove(out);
    }
    nb_clear_error();
    return 0;
}
