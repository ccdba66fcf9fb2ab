/* classify.c - embedding example: a small C application that uses the installed nabla
 * library to load a trained Fashion-MNIST MLP from a .safetensors file (a checkpoint from
 * `mlp --save`, or plain weights) and classify the images of an IDX file.
 *
 * Build it outside the tree (after `meson install -C build`):
 *     cc classify.c -o classify $(pkg-config --cflags --libs nabla)
 *     ./classify mlp.ckpt /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz \
 *                /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz */
#include <nabla/nabla.h>
#include <stdio.h>
#include <stdlib.h>

/* The architecture of models/mlp.c: the file's tensor names must match it. */
static nb_module *mlp(void) {
    return nb_sequential_new(nb_flatten_new(0, 0), nb_linear_new(784, 1024, NULL), nb_relu_new(),
                             nb_linear_new(1024, 1024, NULL), nb_relu_new(),
                             nb_linear_new(1024, 10, NULL), NULL);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr,
                "usage: %s MODEL.safetensors IMAGES.idx[.gz] [LABELS.idx[.gz]] [--show N]\n",
                argv[0]);
        return 2;
    }
    int show = argc > 5 ? atoi(argv[5]) : 10;
    int rc = 1;
    nb_module *model = mlp();
    nb_safetensors *f = model ? nb_safetensors_open(argv[1]) : NULL;
    nb_tensor *images = NULL, *labels = NULL;
    if (!f) goto fail;
    /* Checkpoints keep the model under "model."; plain weight files have no prefix. */
    const char *prefix = nb_safetensors_find(f, "model.1.weight") >= 0 ? "model." : NULL;
    if (nb_module_load_from(model, f, prefix, true) != NB_OK) goto fail;
    nb_module_train(model, false);
    nb_set_grad_enabled(false); /* inference only */

    images = nb_keep(nb_idx_read(argv[2]));                 /* (N, 28, 28) u8 */
    labels = argc > 3 && argv[3][0] != '-' ? nb_keep(nb_idx_read(argv[3])) : NULL;
    if (!images || (argc > 3 && argv[3][0] != '-' && !labels)) goto fail;
    int64_t n = nb_shape(images)[0], correct = 0;
    for (int64_t start = 0; start < n; start += 1000) {
        int64_t m = n - start < 1000 ? n - start : 1000;
        nb_scope_begin();
        nb_tensor *x = nb_div_scalar(nb_to_dtype(nb_narrow(images, 0, start, m), NB_F32), 255.0);
        nb_tensor *pred = nb_argmax(nb_forward(model, x), 1, false);  /* (m) i64 */
        if (!pred) {
            nb_scope_end();
            goto fail;
        }
        for (int64_t i = 0; i < m; i++) {
            int64_t p = (int64_t)nb_get_f64(pred, (int64_t[]){i});
            int64_t y = labels ? (int64_t)nb_get_f64(labels, (int64_t[]){start + i}) : -1;
            correct += p == y;
            if (start + i >= show) continue;
            printf("image %lld: %s", (long long)(start + i), nb_fashion_mnist_class(p));
            if (labels && p == y) printf(" (correct)");
            else if (labels) printf(" (label: %s)", nb_fashion_mnist_class(y));
            printf("\n");
        }
        nb_scope_end();
    }
    if (labels)
        printf("accuracy: %.4f on %lld images\n", (double)correct / (double)n, (long long)n);
    rc = 0;
fail:
    if (rc) fprintf(stderr, "classify: %s\n", nb_last_error());
    nb_tensor_free(images);
    nb_tensor_free(labels);
    nb_safetensors_close(f);
    nb_module_free(model);
    return rc;
}
