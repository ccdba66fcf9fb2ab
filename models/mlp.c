/* mlp.c - the bundled Fashion-MNIST MLP (784-1024-1024-10, ReLU; SGD momentum 0.9), the
 * recipe of the PyTorch peer's workload W1. `make train` runs it.
 *     build/models/mlp --epochs 10 --log mlp.jsonl --save mlp.ckpt */
#include "common.h"

static nb_module *build(const nbm_args *a, nb_generator *g) {
    (void)a;
    nb_linear_opts o = nb_linear_defaults();
    o.gen = g;
    return nb_sequential_new(nb_flatten_new(0, 0), nb_linear_new(784, 1024, &o), nb_relu_new(),
                         nb_linear_new(1024, 1024, &o), nb_relu_new(), nb_linear_new(1024, 10, &o),
                             NULL);
}

static nb_optim *optimizer(nb_module *m, const nbm_args *a) {
    nb_sgd_opts o = nb_sgd_defaults();
    o.lr = a->lr, o.momentum = 0.9;
    return nb_sgd_new(nb_parameters(m), &o);
}

int main(int argc, char **argv) {
    nbm_args a = {.prog = "mlp", .epochs = 1, .batch = 256, .lr = 0.05, .seed = 0};
    int rc = nbm_parse_args(argc, argv, &a);
    if (rc != NBM_RUN) return rc;
    return nbm_run_classifier(&(nbm_model){"mlp", build, optimizer}, &a);
}
