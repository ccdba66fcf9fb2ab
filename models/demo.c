/* demo.c - the smallest program on the tensor API (built, not installed): fits a linear model
 * y = X w to synthetic data by gradient descent with hand-written gradients, using only
 * the public tensor API (random data, matmul, broadcasting, reductions, scopes).
 * Prints the loss as it falls and a final JSON line. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <nabla/nabla.h>

#define CHECK(x)                                                                  \
    do {                                                                          \
        if (!(x)) {                                                               \
            fprintf(stderr, "demo: %s\n", nb_last_error());                       \
            return 1;                                                             \
        }                                                                         \
    } while (0)

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 200;
    nb_set_num_threads(0);
    nb_generator *g = nb_generator_new(42);
    const int64_t n = 4096, d = 256;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);

    /* Data: X (n, d), true weights (d, 1), y = X w* + noise. Kept outside the step scope. */
    nb_tensor *X = nb_randn((int64_t[]){n, d}, 2, NB_F32, g);
    nb_tensor *w_true = nb_randn((int64_t[]){d, 1}, 2, NB_F32, g);
    nb_scope_begin();
    nb_tensor *y = nb_keep(nb_add(nb_matmul(X, w_true),
                                  nb_mul_scalar(nb_randn((int64_t[]){n, 1}, 2, NB_F32, g), 0.01)));
    nb_scope_end();
    nb_tensor *w = nb_zeros((int64_t[]){d, 1}, 2, NB_F32);
    CHECK(X && w_true && y && w);

    double loss = 0, first = -1;
    for (int step = 0; step < steps; step++) {
        nb_scope_begin();
        nb_tensor *err = nb_sub(nb_matmul(X, w), y);                      /* (n, 1) */
        nb_tensor *l = nb_mean(nb_mul(err, err), NULL, 0, false);          /* MSE */
        nb_tensor *grad = nb_mul_scalar(nb_matmul(nb_transpose(X, 0, 1), err), 2.0 / n);
        CHECK(l && grad);
        CHECK(nb_copy_(w, nb_sub(w, nb_mul_scalar(grad, 0.1))) == NB_OK);
        loss = nb_item_f64(l);
        if (first < 0) first = loss;
        if (step % 20 == 0 || step == steps - 1) printf("step %4d  mse %.6f\n", step, loss);
        nb_scope_end();
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double wall = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    nb_alloc_stats st;
    nb_alloc_get_stats(&st);
    printf("{\"model\": \"linear-demo\", \"initial_loss\": %.6f, \"final_loss\": %.6f, "
           "\"steps\": %d, \"wall_s\": %.3f, \"system_allocs\": %lld, \"gemm\": \"%s\"}\n",
           first, loss, steps, wall, (long long)st.system_allocs,
           nb_gemm_provider_name(nb_gemm_provider_current()));
    nb_tensor_free(X), nb_tensor_free(w_true), nb_tensor_free(y), nb_tensor_free(w);
    nb_generator_free(g);
    return loss < first * 1e-3 ? 0 : 1;
}
