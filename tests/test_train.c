/* test_train.c - small end-to-end training runs inside the suite: an MLP must learn XOR and
 * two interleaved spirals to 100% training accuracy, and a training step must make no
 * system allocation after warm-up. These exercise layers, losses, autograd and optimizers
 * together. */
#include <math.h>

#include "nabla/optim.h"
#include "testutil.h"

/* Fraction of rows whose argmax matches y. */
static double accuracy(nb_tensor *logits, nb_tensor *y) {
    nb_scope_begin();
    double acc = nb_item_f64(nb_mean(nb_to_dtype(nb_eq(nb_argmax(logits, 1, false), y), NB_F32),
                                     NULL, 0, false));
    nb_scope_end();
    return acc;
}

/* Full-batch training; returns the final training accuracy. */
static double train(nb_module *model, nb_optim *opt, nb_tensor *x, nb_tensor *y, int steps) {
    for (int step = 0; step < steps; step++) {
        nb_scope_begin();
        nb_tensor *loss = nb_cross_entropy(nb_forward(model, x), y, NULL);
        ck_assert_msg(loss != NULL, "%s", nb_last_error());
        ck_assert(nb_zero_grad(opt) == NB_OK);
        ck_assert(nb_backward(loss) == NB_OK);
        ck_assert(nb_step(opt) == NB_OK);
        nb_scope_end();
    }
    nb_scope_begin();
    double acc;
    NB_NO_GRAD_BEGIN
    acc = accuracy(nb_forward(model, x), y);
    NB_NO_GRAD_END
    nb_scope_end();
    return acc;
}

START_TEST(test_xor) {
    nb_scope_begin();
    nb_generator *g = nb_generator_new(1);
    nb_tensor *x = tu_tensor((double[]){0, 0, 0, 1, 1, 0, 1, 1}, (int64_t[]){4, 2}, 2, NB_F32);
    nb_tensor *y = tu_tensor((double[]){0, 1, 1, 0}, (int64_t[]){4}, 1, NB_I64);
    nb_linear_opts lin = nb_linear_defaults();
    lin.gen = g;
    nb_linear_opts lin2 = nb_linear_defaults();
    lin2.gen = g;
    nb_module *model = nb_sequential_new(nb_linear_new(2, 8, &lin), nb_tanh_new(),
                                         nb_linear_new(8, 2, &lin2), NULL);
    nb_adam_opts ao = nb_adam_defaults();
    ao.lr = 0.05;
    nb_optim *opt = nb_adam_new(nb_parameters(model), &ao);
    ck_assert(model && opt);
    double acc = train(model, opt, x, y, 300);
    ck_assert_msg(acc == 1.0, "XOR training accuracy %.3f", acc);
    nb_optim_free(opt);
    nb_module_free(model);
    nb_generator_free(g);
    nb_scope_end();
}
END_TEST

START_TEST(test_two_spirals) {
    /* Two spirals of 97 points each (the classic benchmark's radius and angle schedule). */
    enum { P = 97 };
    double xs[2 * P * 2], ys[2 * P];
    for (int i = 0; i < P; i++) {
        double angle = i * M_PI / 16.0, radius = 6.5 * (104 - i) / 104.0;
        double px = radius * sin(angle) / 6.5, py = radius * cos(angle) / 6.5;
        xs[4 * i] = px, xs[4 * i + 1] = py, ys[2 * i] = 0;
        xs[4 * i + 2] = -px, xs[4 * i + 3] = -py, ys[2 * i + 1] = 1;
    }
    nb_scope_begin();
    nb_generator *g = nb_generator_new(2);
    nb_tensor *x = tu_tensor(xs, (int64_t[]){2 * P, 2}, 2, NB_F32);
    nb_tensor *y = tu_tensor(ys, (int64_t[]){2 * P}, 1, NB_I64);
    nb_linear_opts lo = nb_linear_defaults();
    lo.gen = g;
    nb_module *model = nb_sequential_new(nb_linear_new(2, 64, &lo), nb_tanh_new(),
                                     nb_linear_new(64, 64, &lo), nb_tanh_new(),
                                     nb_linear_new(64, 2, &lo), NULL);
    nb_adam_opts ao = nb_adam_defaults();
    ao.lr = 0.01;
    nb_optim *opt = nb_adam_new(nb_parameters(model), &ao);
    ck_assert(model && opt);
    double acc = train(model, opt, x, y, 2000);
    ck_assert_msg(acc == 1.0, "two-spirals training accuracy %.3f", acc);
    nb_optim_free(opt);
    nb_module_free(model);
    nb_generator_free(g);
    nb_scope_end();
}
END_TEST

START_TEST(test_step_no_alloc) {
    nb_scope_begin();
    nb_generator *g = nb_generator_new(3);
    nb_tensor *x = nb_randn((int64_t[]){32, 20}, 2, NB_F32, g);
    nb_tensor *y = nb_randint((int64_t[]){32}, 1, NB_I64, 0, 5, g);
    nb_module *model = nb_sequential_new(nb_linear_new(20, 16, NULL), nb_relu_new(),
                                     nb_layer_norm_new(16, NULL), nb_dropout_new(0.1, g),
                                     nb_linear_new(16, 5, NULL), NULL);
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 0.1, so.momentum = 0.9;
    nb_optim *opt = nb_sgd_new(nb_parameters(model), &so);
    ck_assert(model && opt);
    nb_alloc_stats a, b;
    for (int step = 0; step < 40; step++) {
        if (step == 5) nb_alloc_get_stats(&a);
        nb_scope_begin();
        nb_tensor *loss = nb_cross_entropy(nb_forward(model, x), y, NULL);
        ck_assert(nb_zero_grad(opt) == NB_OK && nb_backward(loss) == NB_OK);
        ck_assert(nb_step(opt) == NB_OK);
        nb_scope_end();
    }
    nb_alloc_get_stats(&b);
    ck_assert_msg(b.system_allocs == a.system_allocs, "%lld system allocations in 35 steps",
                  (long long)(b.system_allocs - a.system_allocs));
    ck_assert_int_eq(b.bytes_live, a.bytes_live);
    nb_optim_free(opt);
    nb_module_free(model);
    nb_generator_free(g);
    nb_scope_end();
}
END_TEST

Suite *nb_suite_train(void) {
    Suite *s = suite_create("train");
    TCase *tc = tcase_create("train");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_xor);
    tcase_add_test(tc, test_two_spirals);
    tcase_add_test(tc, test_step_no_alloc);
    suite_add_tcase(s, tc);
    return s;
}
