/* zero-consolidate - write a checkpoint of any layout (the folder `--zero S --save DIR`, or any
 * parallel run, writes; or a plain checkpoint file) as one plain file:
 *     zero-consolidate DIR OUT              a plain checkpoint (--resume reads it anywhere)
 *     zero-consolidate --model-only DIR OUT the model alone under its own names (for gpt:
 *                                           nanoGPT's, which `gpt --load` and PyTorch read)
 * Every piece it reads is verified. Built on the public API only (nb_checkpoint_consolidate). */
#include <stdio.h>
#include <string.h>

#include <nabla/nabla.h>

static void usage(FILE *f) {
    fprintf(f, "usage: zero-consolidate [--model-only] DIR OUT\n"
               "  DIR  a checkpoint folder of any layout (written with --zero S --save DIR, or\n"
               "       by any parallel run), or a checkpoint file\n"
               "  OUT  the plain checkpoint (or with --model-only the model's weights)\n");
}

int main(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout); /* asked for: stdout, success */
        return 0;
    }
    bool model_only = argc > 1 && strcmp(argv[1], "--model-only") == 0;
    int first = model_only ? 2 : 1;
    if (argc - first != 2 || argv[first][0] == '-') {
        usage(stderr); /* a usage error: stderr, exit 2 */
        return 2;
    }
    if (nb_checkpoint_consolidate(argv[first], argv[first + 1], model_only) != NB_OK) {
        fprintf(stderr, "zero-consolidate: %s\n", nb_last_error());
        return 1;
    }
    printf("wrote %s\n", argv[first + 1]);
    return 0;
}
