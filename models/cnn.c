/* cnn.c - the bundled Fashion-MNIST CNN (conv 1->32 3x3 pad 1, ReLU, maxpool 2; conv 32->64
 * 3x3 pad 1, ReLU, maxpool 2; linear 3136->128, ReLU; linear 128->10; Adam 1e-3), the recipe
 * of the PyTorch peer's workload W2.
 *     build/models/cnn --epochs 5 --log cnn.jsonl */
#include "common.h"

static nb_module *build(const nbm_args *a, nb_generator *g) {
    (void)a;
    nb_conv2d_opts c = nb_conv2d_defaults();
    c.padding[0] = c.padding[1] = 1;
    c.gen = g;
    nb_linear_opts l = nb_linear_defaults();
    l.gen = g;
    return nb_sequential_new(nb_conv2d_new(1, 32, 3, 3, &c), nb_relu_new(),
                             nb_maxpool2d_new(2, 2, NULL), nb_conv2d_new(32, 64, 3, 3, &c),
                             nb_relu_new(), nb_maxpool2d_new(2, 2, NULL), nb_flatten_new(0, 0),
                             nb_linear_new(3136, 128, &l), nb_relu_new(),
                             nb_linear_new(128, 10, &l), NULL);
}

static nb_optim *optimizer(nb_module *m, const nbm_args *a) {
    nb_adam_opts o = nb_adam_defaults();
    o.lr = a->lr;
    return nb_adam_new(nb_parameters(m), &o);
}

int main(int argc, char **argv) {
    nbm_args a = {.prog = "cnn", .epochs = 1, .batch = 128, .lr = 1e-3, .seed = 0};
    int rc = nbm_parse_args(argc, argv, &a);
    if (rc != NBM_RUN) return rc;
    return nbm_run_classifier(&(nbm_model){"cnn", build, optimizer, true}, &a);
}
