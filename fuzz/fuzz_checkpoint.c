/* fuzz_checkpoint.c - nb_checkpoint_load on arbitrary bytes into a fresh set of training
 * objects (model, AdamW, schedule, loader, generator: ckpt_objects.h); after a successful
 * load, one training step and the next batch run on the restored state. */
#include "ckpt_objects.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ckpt_objects o;
    if (!ckpt_objects_init(&o)) {
        fprintf(stderr, "fuzz: cannot build the training objects: %s\n", nb_last_error());
        abort();
    }
    char path[64];
    int fd = fuzz_file(data, size, path, sizeof path);
    nb_checkpoint c = ckpt_of(&o, -1);
    if (nb_checkpoint_load(path, &c) == NB_OK) {
        nb_batch b;
        if (nb_loader_next(o.loader, &b)) {
            nb_scope_begin();
            nb_tensor *loss = nb_cross_entropy(nb_forward(o.model, b.x), b.y, NULL);
            FUZZ_CHECK(nb_zero_grad(o.opt) == NB_OK && nb_backward(loss) == NB_OK);
            FUZZ_CHECK(nb_step(o.opt) == NB_OK && nb_sched_step(o.sched) == NB_OK);
            nb_scope_end();
        }
        FUZZ_CHECK(nb_loader_error(o.loader) == NB_OK);
    }
    close(fd);
    ckpt_objects_free(&o);
    nb_clear_error();
    return 0;
}
