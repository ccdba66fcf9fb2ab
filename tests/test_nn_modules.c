/* test_nn_modules.c - the nn_layers suite's tests of initialization (distributions, PyTorch's
 * fan and gain formulas), the modules (parameter names and shapes, nb_sequential, flat
 * parameters, train/eval), module lookups, the layers' user errors and forward hooks; added
 * to the suite, one TCase per test as test_nn_layers.c does, by nb_tests_nn_modules. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_nn_layers.h"
#include "testutil.h"

/* ---- init ------------------------------------------------------------------------------------ */
static void moments(nb_tensor *t, double *mean, double *std, double *amax) {
    double *v = tu_values(t);
    int64_t n = nb_numel(t);
    double s = 0, s2 = 0, m = 0;
    for (int64_t i = 0; i < n; i++) s += v[i], m = fmax(m, fabs(v[i]));
    *mean = s / (double)n;
    for (int64_t i = 0; i < n; i++) s2 += (v[i] - *mean) * (v[i] - *mean);
    *std = sqrt(s2 / (double)n);
    *amax = m;
    free(v);
}

START_TEST(test_init) {
    nb_scope_begin();
    nb_generator *gen = nb_generator_new(11);
    nb_tensor *t = nb_empty((int64_t[]){200, 100}, 2, NB_F32); /* fan_in 100, fan_out 200 */
    make_grad(t);                                              /* init works on parameters */
    double mean, std, amax;
    struct {
        int kind;
        double bound_or_std;
    } cases[] = {
        {0, sqrt(6.0 / 300)},          /* xavier_uniform, gain 1 */
        {1, 2 * sqrt(2.0 / 300)},      /* xavier_normal, gain 2 */
        {2, sqrt(2.0) * sqrt(3.0 / 100)}, /* kaiming_uniform relu, fan_in */
        {3, sqrt(2.0) / sqrt(200)},    /* kaiming_normal relu, fan_out */
        {4, sqrt(2.0 / (1 + 0.04)) * sqrt(3.0 / 100)}, /* kaiming_uniform leaky 0.2 */
    };
    for (int i = 0; i < 5; i++) {
        nb_status st = NB_OK;
        switch (cases[i].kind) {
        case 0: st = nb_init_xavier_uniform_(t, 1.0, gen); break;
        case 1: st = nb_init_xavier_normal_(t, 2.0, gen); break;
        case 2: st = nb_init_kaiming_uniform_(t, 0, false, NB_NONLIN_RELU, gen); break;
        case 3: st = nb_init_kaiming_normal_(t, 0, true, NB_NONLIN_RELU, gen); break;
        case 4: st = nb_init_kaiming_uniform_(t, 0.2, false, NB_NONLIN_LEAKY_RELU, gen); break;
        }
        ck_assert_msg(st == NB_OK, "%s", nb_last_error());
        moments(t, &mean, &std, &amax);
        double bs = cases[i].bound_or_std;
        bool uniform = cases[i].kind != 1 && cases[i].kind != 3;
        double want_std = uniform ? bs / sqrt(3.0) : bs;
        ck_assert_msg(fabs(mean) < 0.03 * want_std * 10, "case %d mean %g", i, mean);
        ck_assert_msg(fabs(std / want_std - 1) < 0.03, "case %d std %g want %g", i, std, want_std);
        if (uniform) ck_assert_msg(amax <= bs * (1 + 1e-6) && amax > 0.99 * bs, "case %d", i);
    }
    ck_assert(nb_init_normal_(t, 2.0, 0.5, gen) == NB_OK);
    moments(t, &mean, &std, &amax);
    ck_assert(fabs(mean - 2) < 0.02 && fabs(std - 0.5) < 0.015);
    ck_assert(nb_init_uniform_(t, -3, -1, gen) == NB_OK);
    moments(t, &mean, &std, &amax);
    ck_assert(fabs(mean + 2) < 0.02 && amax <= 3);
    /* conv weight: fan_in = 4 * 3 * 3, fan_out = 8 * 3 * 3 */
    nb_tensor *cw = nb_empty((int64_t[]){8, 4, 3, 3}, 4, NB_F64);
    ck_assert(nb_init_kaiming_uniform_(cw, 0, true, NB_NONLIN_LINEAR, gen) == NB_OK);
    moments(cw, &mean, &std, &amax);
    ck_assert(amax <= sqrt(3.0 / 72) && amax > 0.9 * sqrt(3.0 / 72));
    ck_assert(nb_init_ones_(t) == NB_OK);
    moments(t, &mean, &std, &amax);
    ck_assert(mean == 1 && std == 0);
    ck_assert(nb_init_constant_(t, 0.25) == NB_OK && nb_get_f64(t, (int64_t[]){5, 7}) == 0.25);
    ck_assert(nb_init_zeros_(t) == NB_OK && nb_get_f64(t, (int64_t[]){199, 99}) == 0);
    /* same generator state -> same values */
    nb_tensor *a = nb_empty((int64_t[]){4, 4}, 2, NB_F32),
              *b = nb_empty((int64_t[]){4, 4}, 2, NB_F32);
    nb_generator_set_offset(gen, 3);
    nb_init_xavier_uniform_(a, 1, gen);
    nb_generator_set_offset(gen, 3);
    nb_init_xavier_uniform_(b, 1, gen);
    double *av = tu_values(a);
    CLOSE(b, av, 0);
    free(av);
    /* gains (torch.nn.init.calculate_gain) */
    ck_assert(nb_init_calculate_gain(NB_NONLIN_LINEAR, 0) == 1);
    ck_assert(nb_init_calculate_gain(NB_NONLIN_SIGMOID, 0) == 1);
    ck_assert(fabs(nb_init_calculate_gain(NB_NONLIN_TANH, 0) - 5.0 / 3) < 1e-15);
    ck_assert(fabs(nb_init_calculate_gain(NB_NONLIN_RELU, 0) - sqrt(2.0)) < 1e-15);
    ck_assert(fabs(nb_init_calculate_gain(NB_NONLIN_LEAKY_RELU, 0.01) - sqrt(2 / 1.0001)) < 1e-15);
    /* errors */
    ck_assert(nb_init_xavier_uniform_(nb_empty((int64_t[]){5}, 1, NB_F32), 1, gen) == NB_ESHAPE);
    ck_assert(strstr(nb_last_error(), "at least 2 dims") != NULL);
    ck_assert(nb_init_uniform_(nb_zeros((int64_t[]){2}, 1, NB_I32), 0, 1, gen) == NB_EDTYPE);
    ck_assert(nb_init_normal_(t, 0, -1, gen) == NB_EINVAL);
    nb_clear_error();
    ck_assert(nb_init_uniform_(NULL, 0, 1, gen) == NB_ENULL);
    nb_clear_error();
    nb_generator_free(gen);
    nb_scope_end();
}
END_TEST

/* ---- modules --------------------------------------------------------------------------------- */
static void expect_params(nb_module *m, const char *const *names, const int64_t shapes[][4],
                          const int *ndims, int n) {
    const nb_params *p = nb_parameters(m);
    ck_assert_int_eq(p->count, n);
    for (int i = 0; i < n; i++) {
        ck_assert_str_eq(p->names[i], names[i]);
        ck_assert_int_eq(nb_ndim(p->tensors[i]), ndims[i]);
        for (int d = 0; d < ndims[i]; d++)
            ck_assert_int_eq(nb_shape(p->tensors[i])[d], shapes[i][d]);
        ck_assert(nb_requires_grad(p->tensors[i]));
    }
}

START_TEST(test_modules) {
    nb_scope_begin();
    nb_generator *gen = nb_generator_new(5);
    nb_linear_opts lin3 = nb_linear_defaults();
    lin3.gen = gen;
    /* Linear: names, shapes, PyTorch's init bounds, forward = nb_linear */
    nb_module *lin = nb_linear_new(16, 3, &lin3);
    ck_assert_str_eq(nb_module_type(lin), "Linear");
    expect_params(lin, (const char *[]){"weight", "bias"}, (const int64_t[][4]){{3, 16}, {3}},
                  (int[]){2, 1}, 2);
    ck_assert_int_eq(nb_num_parameters(lin), 51);
    double mean, std, amax;
    moments(nb_module_param(lin, "weight"), &mean, &std, &amax);
    ck_assert(amax <= 0.25 && amax > 0.15);
    moments(nb_module_param(lin, "bias"), &mean, &std, &amax);
    ck_assert(amax <= 0.25);
    nb_tensor *x = tu_random((int64_t[]){2, 16}, 2, NB_F32, -1, 1, 1);
    double *want = tu_values(nb_linear(x, nb_module_param(lin, "weight"),
                                       nb_module_param(lin, "bias")));
    CLOSE(nb_forward(lin, x), want, 0);
    free(want);
    nb_module_free(lin);
    nb_linear_opts lin4 = nb_linear_defaults();
    lin4.no_bias = true, lin4.dtype = NB_F64;
    nb_module *lin2 = nb_linear_new(4, 2, &lin4);
    ck_assert_int_eq(nb_parameters(lin2)->count, 1);
    ck_assert_int_eq(nb_tensor_dtype(nb_module_param(lin2, "weight")), NB_F64);
    ck_assert_ptr_null(nb_module_param(lin2, "bias"));
    nb_module_free(lin2);

    /* Embedding */
    nb_module *emb = nb_embedding_new(10, 4, gen);
    expect_params(emb, (const char *[]){"weight"}, (const int64_t[][4]){{10, 4}}, (int[]){2}, 1);
    nb_tensor *idx = tu_tensor((double[]){1, 9, 0, 1}, (int64_t[]){2, 2}, 2, NB_I64);
    nb_tensor *e = nb_forward(emb, idx);
    ck_assert_msg(e && nb_ndim(e) == 3 && nb_shape(e)[2] == 4, "%s", nb_last_error());
    ck_assert(nb_get_f64(e, (int64_t[]){1, 1, 2}) ==
              nb_get_f64(nb_module_param(emb, "weight"), (int64_t[]){1, 2}));
    nb_module_free(emb);

    /* LayerNorm */
    nb_module *ln = nb_layer_norm_new(5, NULL);
    ck_assert_str_eq(nb_module_type(ln), "LayerNorm");
    expect_params(ln, (const char *[]){"weight", "bias"}, (const int64_t[][4]){{5}, {5}},
                  (int[]){1, 1}, 2);
    ck_assert(nb_get_f64(nb_module_param(ln, "weight"), (int64_t[]){2}) == 1);
    ck_assert(nb_get_f64(nb_module_param(ln, "bias"), (int64_t[]){2}) == 0);
    nb_tensor *xl = tu_random((int64_t[]){3, 5}, 2, NB_F32, -1, 1, 2);
    want = tu_values(nb_layer_norm(xl, NULL, NULL, 1e-5));
    CLOSE(nb_forward(ln, xl), want, 1e-6);
    free(want);
    tu_assert_error(nb_forward(ln, tu_random((int64_t[]){3, 4}, 2, NB_F32, -1, 1, 2)), NB_ESHAPE,
                    "last dim is 5");
    nb_module_free(ln);
    nb_norm_opts no = nb_norm_defaults();
    no.no_affine = true;
    nb_module *ln2 = nb_layer_norm_new(5, &no);
    ck_assert_int_eq(nb_parameters(ln2)->count, 0);
    nb_module_free(ln2);

    /* BatchNorm2d: PyTorch's names; running stats and num_batches_tracked; train/eval */
    nb_module *bn = nb_batch_norm2d_new(3, NULL);
    ck_assert_str_eq(nb_module_type(bn), "BatchNorm2d");
    expect_params(bn, (const char *[]){"weight", "bias"}, (const int64_t[][4]){{3}, {3}},
                  (int[]){1, 1}, 2);
    const nb_params *bufs = nb_buffers(bn);
    ck_assert_int_eq(bufs->count, 3);
    ck_assert_str_eq(bufs->names[0], "running_mean");
    ck_assert_str_eq(bufs->names[1], "running_var");
    ck_assert_str_eq(bufs->names[2], "num_batches_tracked");
    nb_tensor *nbt = bufs->tensors[2];
    ck_assert(nb_tensor_dtype(nbt) == NB_I64 && nb_ndim(nbt) == 0 && nb_item_i64(nbt) == 0);
    nb_tensor *xb = tu_random((int64_t[]){4, 3, 2, 2}, 4, NB_F32, 1, 3, 3);
    ck_assert(nb_forward(bn, xb) != NULL);
    ck_assert_int_eq(nb_item_i64(nbt), 1);
    ck_assert(nb_get_f64(nb_module_buffer(bn, "running_mean"), (int64_t[]){0}) > 0.1);
    nb_module_train(bn, false);
    ck_assert(!nb_module_is_training(bn));
    want = tu_values(nb_batch_norm(xb, nb_module_buffer(bn, "running_mean"),
                                   nb_module_buffer(bn, "running_var"), NULL, NULL, false, 0.1,
                                   1e-5));
    CLOSE(nb_forward(bn, xb), want, 1e-6);
    free(want);
    ck_assert_int_eq(nb_item_i64(nbt), 1); /* eval does not count */
    tu_assert_error(nb_forward(bn, tu_random((int64_t[]){4, 3}, 2, NB_F32, 0, 1, 1)), NB_ESHAPE,
                    "4-D");
    tu_assert_error(nb_forward(bn, tu_random((int64_t[]){2, 4, 2, 2}, 4, NB_F32, 0, 1, 1)),
                    NB_ESHAPE, "3 channels");
    nb_module_free(bn);
    nb_norm_opts nmo = nb_norm_defaults();
    nmo.eps = 1e-5, nmo.momentum = 0.1, nmo.no_running_stats = true, nmo.no_affine = true;
    /* without running stats: batch statistics in eval too */
    nb_module *bn1 = nb_batch_norm1d_new(3, &nmo);
    ck_assert_int_eq(nb_buffers(bn1)->count, 0);
    ck_assert_int_eq(nb_parameters(bn1)->count, 0);
    nb_module_train(bn1, false);
    nb_tensor *x1 = tu_random((int64_t[]){5, 3, 2}, 3, NB_F32, 0, 1, 4);
    want = tu_values(nb_batch_norm(x1, NULL, NULL, NULL, NULL, true, 0.1, 1e-5));
    CLOSE(nb_forward(bn1, x1), want, 1e-6);
    free(want);
    nb_module_free(bn1);
    /* options are read as written (issue 17 item 4): batch norm momentum 0 keeps the running
     * stats, layer norm eps 0 is 0; the constructor gives 1e-5 and 0.1 */
    nb_norm_opts nd = nb_norm_defaults();
    ck_assert(nd.eps == 1e-5 && nd.momentum == 0.1 && !nd.no_affine && !nd.no_running_stats);
    nb_norm_opts nmo2 = nb_norm_defaults();
    nmo2.eps = 1e-5, nmo2.momentum = 0;
    nb_module *bn0 = nb_batch_norm1d_new(3, &nmo2);
    ck_assert_ptr_nonnull(nb_forward(bn0, x1));
    ck_assert_double_eq(nb_get_f64(nb_module_buffer(bn0, "running_mean"), (int64_t[]){0}), 0);
    ck_assert_double_eq(nb_get_f64(nb_module_buffer(bn0, "running_var"), (int64_t[]){1}), 1);
    nb_module_free(bn0);
    nb_norm_opts nmo3 = nb_norm_defaults();
    nmo3.eps = 0, nmo3.momentum = 0;
    nb_module *ln0 = nb_layer_norm_new(2, &nmo3);
    nb_tensor *y0 = nb_forward(ln0, tu_tensor((double[]){3, 1}, (int64_t[]){1, 2}, 2, NB_F32));
    ck_assert_double_eq(nb_get_f64(y0, (int64_t[]){0, 0}), 1); /* (3 - 2) / sqrt(1 + eps) */
    nb_module_free(ln0);

    /* Flatten and activations */
    nb_module *fl = nb_flatten_new(0, 0);
    nb_tensor *f = nb_forward(fl, tu_random((int64_t[]){2, 3, 4}, 3, NB_F32, 0, 1, 5));
    ck_assert(nb_ndim(f) == 2 && nb_shape(f)[0] == 2 && nb_shape(f)[1] == 12);
    nb_module_free(fl);
    fl = nb_flatten_new(0, 1);
    f = nb_forward(fl, tu_random((int64_t[]){2, 3, 4}, 3, NB_F32, 0, 1, 5));
    ck_assert(nb_ndim(f) == 2 && nb_shape(f)[0] == 6 && nb_shape(f)[1] == 4);
    nb_module_free(fl);
    nb_tensor *xa = tu_random((int64_t[]){3, 4}, 2, NB_F32, -2, 2, 6);
    nb_module *acts[6] = {nb_relu_new(), nb_gelu_new(false), nb_gelu_new(true),
                          nb_silu_new(), nb_tanh_new(), nb_sigmoid_new()};
    nb_tensor *refs[6] = {nb_relu(xa), nb_gelu(xa), nb_gelu_tanh(xa), nb_silu(xa), nb_tanh(xa),
                          nb_sigmoid(xa)};
    const char *types[6] = {"ReLU", "GELU", "GELU", "SiLU", "Tanh", "Sigmoid"};
    for (int i = 0; i < 6; i++) {
        ck_assert_str_eq(nb_module_type(acts[i]), types[i]);
        double *rv = tu_values(refs[i]);
        CLOSE(nb_forward(acts[i], xa), rv, 0);
        free(rv);
        nb_module_free(acts[i]);
    }

    /* Dropout module: keeps the generator; eval is the identity */
    nb_module *dm = nb_dropout_new(0.5, gen);
    nb_tensor *xd = tu_random((int64_t[]){1000}, 1, NB_F32, 1, 2, 7);
    uint64_t off = nb_generator_offset(gen);
    double *yd = tu_values(nb_forward(dm, xd));
    ck_assert(nb_generator_offset(gen) > off);
    int zeros = 0;
    for (int i = 0; i < 1000; i++) zeros += yd[i] == 0;
    ck_assert(zeros > 400 && zeros < 600);
    free(yd);
    nb_module_train(dm, false);
    ck_assert_ptr_eq(nb_forward(dm, xd), xd);
    nb_module_free(dm);
    nb_generator_free(gen);
    nb_scope_end();
}
END_TEST

START_TEST(test_sequential) {
    nb_scope_begin();
    nb_module *seq = nb_sequential_new(nb_linear_new(4, 8, NULL), nb_relu_new(),
                                   nb_linear_new(8, 3, NULL), nb_batch_norm1d_new(3, NULL),
                                   nb_dropout_new(0.5, NULL), NULL);
    ck_assert_ptr_nonnull(seq);
    expect_params(seq, (const char *[]){"0.weight", "0.bias", "2.weight", "2.bias", "3.weight",
                                        "3.bias"},
                  (const int64_t[][4]){{8, 4}, {8}, {3, 8}, {3}, {3}, {3}},
                  (int[]){2, 1, 2, 1, 1, 1}, 6);
    const nb_params *b = nb_buffers(seq);
    ck_assert_int_eq(b->count, 3);
    ck_assert_str_eq(b->names[0], "3.running_mean");
    ck_assert_str_eq(b->names[2], "3.num_batches_tracked");
    ck_assert_ptr_eq(nb_module_find(seq, "2.bias"),
                     nb_module_param(nb_module_child(seq, "2"), "bias"));
    nb_tensor *x = tu_random((int64_t[]){6, 4}, 2, NB_F32, -1, 1, 1);
    nb_tensor *y = nb_forward(seq, x);
    ck_assert(y && nb_shape(y)[0] == 6 && nb_shape(y)[1] == 3);
    /* train/eval reaches every child; eval output is deterministic */
    nb_module_train(seq, false);
    for (int i = 0; i < nb_module_num_children(seq); i++)
        ck_assert(!nb_module_is_training(nb_module_child_at(seq, i)));
    double *e1 = tu_values(nb_forward(seq, x));
    CLOSE(nb_forward(seq, x), e1, 0);
    free(e1);
    nb_module_train(seq, true);
    ck_assert(nb_module_is_training(nb_module_child_at(seq, 4)));
    nb_module_free(seq);
    nb_scope_end();
}
END_TEST

START_TEST(test_flatten_parameters) {
    nb_scope_begin();
    nb_module *seq = nb_sequential_new(nb_linear_new(5, 7, NULL), nb_gelu_new(true),
                                   nb_layer_norm_new(7, NULL), nb_linear_new(7, 3, NULL), NULL);
    const nb_params *p = nb_parameters(seq);
    int np = p->count;
    ck_assert_int_eq(np, 6);
    nb_tensor *before[6];
    double *vals[6];
    for (int i = 0; i < np; i++) before[i] = p->tensors[i], vals[i] = tu_values(p->tensors[i]);
    ck_assert(nb_module_flatten_parameters(seq, 0) == NB_OK);
    nb_tensor *fp = nb_module_flat_params(seq), *fg = nb_module_flat_grads(seq);
    ck_assert(fp && fg && nb_ndim(fp) == 1);
    p = nb_parameters(seq);
    for (int i = 0; i < np; i++) {
        ck_assert_ptr_eq(p->tensors[i], before[i]); /* same identities */
        ck_assert(nb_shares_storage(p->tensors[i], fp));
        ck_assert(nb_offset(p->tensors[i]) % 16 == 0);
        CLOSE(p->tensors[i], vals[i], 0);
        free(vals[i]);
    }
    /* a backward accumulates into the flat gradient buffer, twice */
    nb_tensor *x = tu_random((int64_t[]){4, 5}, 2, NB_F32, -1, 1, 1);
    for (int rep = 0; rep < 2; rep++) {
        nb_scope_begin();
        nb_tensor *y = nb_forward(seq, x);
        backward_with(y, nb_ones(nb_shape(y), 2, NB_F32));
        nb_scope_end();
    }
    double *g = tu_values(fg);
    double gsum = 0;
    for (int64_t i = 0; i < nb_numel(fg); i++) gsum += fabs(g[i]);
    ck_assert(gsum > 0);
    for (int i = 0; i < np; i++) {
        nb_tensor *gi = nb_grad(p->tensors[i]);
        ck_assert(gi && nb_shares_storage(gi, fg) && nb_offset(gi) == nb_offset(p->tensors[i]));
    }
    /* the last bias's gradient is twice the batch size (ones through a linear) */
    double *gb = tu_values(nb_grad(nb_module_find(seq, "3.bias")));
    for (int j = 0; j < 3; j++) ck_assert(fabs(gb[j] - 8) < 1e-5);
    free(gb);
    free(g);
    nb_module_zero_grad(seq);
    ck_assert(nb_get_f64(nb_grad(nb_module_find(seq, "3.bias")), (int64_t[]){0}) == 0);
    nb_module_free(seq);
    nb_scope_end();
}
END_TEST

/* A misspelled member name fails with a message naming it and what exists, instead of a NULL
 * that surfaces later as "mul: argument 'b' is NULL". */
START_TEST(test_module_lookup_errors) {
    nb_scope_begin();
    nb_linear_opts lin2 = nb_linear_defaults();
    lin2.no_bias = true;
    nb_module *seq = nb_sequential_new(nb_linear_new(4, 8, NULL), nb_relu_new(),
                                       nb_linear_new(8, 3, &lin2), NULL);
    ck_assert_ptr_nonnull(seq);
    nb_module *lin = nb_module_child(seq, "0"), *nobias = nb_module_child(seq, "2");
    ck_assert(lin && nobias);
    nb_clear_error();
    tu_assert_error(nb_module_param(lin, "wieght"), NB_EINVAL,
                    "module_param: no parameter 'wieght' in this Linear (parameters: weight, "
                    "bias)");
    nb_tensor *x = tu_random((int64_t[]){2, 4}, 2, NB_F32, -1, 1, 1);
    tu_assert_error(nb_mul(x, nb_module_param(lin, "wieght")), NB_EINVAL,
                    "no parameter 'wieght'"); /* the first error is kept */
    tu_assert_error(nb_module_param(seq, "0.weight"), NB_EINVAL,
                    "no parameter '0.weight' in this Sequential (parameters: none); it looks up "
                    "direct members: use nb_module_find for dotted names");
    tu_assert_error(nb_module_child(seq, "3"), NB_EINVAL,
                    "module_child: no child '3' in this Sequential (children: 0, 1, 2)");
    tu_assert_error(nb_module_param(nb_module_child(seq, "7"), "weight"), NB_EINVAL,
                    "no child '7'");
    tu_assert_error(nb_module_buffer(lin, "running_mean"), NB_EINVAL,
                    "module_buffer: no buffer 'running_mean' in this Linear (buffers: none)");
    tu_assert_error(nb_module_find(seq, "0.wieght"), NB_EINVAL,
                    "module_find: no parameter or buffer '0.wieght' in '0' (a Linear) "
                    "(parameters: weight, bias; buffers: none)");
    tu_assert_error(nb_module_find(seq, "5.weight"), NB_EINVAL,
                    "module_find: no child '5' in the Sequential looking up '5.weight' "
                    "(children: 0, 1, 2)");
    tu_assert_error(nb_module_param(NULL, "weight"), NB_ENULL, "module_param: module is NULL");
    tu_assert_error(nb_module_child(seq, NULL), NB_ENULL, "module_child: name is NULL");
    /* absent optional members, and lookups that succeed, set no error */
    ck_assert_ptr_null(nb_module_param_opt(nobias, "bias"));
    ck_assert_ptr_null(nb_module_buffer_opt(lin, "running_mean"));
    ck_assert_ptr_nonnull(nb_module_find(seq, "2.weight"));
    ck_assert_ptr_nonnull(nb_forward(seq, x)); /* a Linear without bias */
    nb_norm_opts nmo = nb_norm_defaults();
    nmo.no_affine = true, nmo.no_running_stats = true, nmo.eps = 0, nmo.momentum = 0;
    nb_module *bn = nb_batch_norm1d_new(4, &nmo);
    ck_assert_ptr_nonnull(nb_forward(bn, x));
    nb_module_free(bn);
    ck_assert_int_eq(nb_last_status(), NB_OK);
    /* a long list of names is cut, not overflowed */
    nb_module *many[120];
    for (int i = 0; i < 120; i++) many[i] = nb_relu_new();
    nb_module *big = nb_sequential_new_n(many, 120);
    tu_assert_error(nb_module_child(big, "120"), NB_EINVAL, "(children: 0, 1, 2, 3, 4, 5,");
    nb_module_child(big, "x");
    ck_assert_msg(strstr(nb_last_error(), ", ...)") && strlen(nb_last_error()) < 400, "%s",
                  nb_last_error());
    nb_clear_error();
    nb_module_free(big);
    nb_module_free(seq);
    nb_scope_end();
}
END_TEST

/* ---- errors ---------------------------------------------------------------------------------- */
START_TEST(test_layer_errors) {
    nb_scope_begin();
    nb_tensor *x = tu_random((int64_t[]){2, 5}, 2, NB_F32, -1, 1, 1);
    nb_tensor *w = tu_random((int64_t[]){3, 4}, 2, NB_F32, -1, 1, 2);
    nb_tensor *b = tu_random((int64_t[]){3}, 1, NB_F32, -1, 1, 3);
    tu_assert_error(nb_linear(x, w, b), NB_ESHAPE,
                    "linear: input has 5 features but the weight expects 4");
    nb_tensor *x4 = tu_random((int64_t[]){2, 4}, 2, NB_F32, -1, 1, 4);
    tu_assert_error(nb_linear(x4, b, NULL), NB_ESHAPE, "weight must be 2-D");
    tu_assert_error(nb_linear(x4, w, tu_random((int64_t[]){4}, 1, NB_F32, 0, 1, 1)),
                    NB_ESHAPE, "bias must have shape [3]");
    tu_assert_error(nb_linear(nb_to_dtype(x4, NB_F64), w, b), NB_EDTYPE, "one dtype");
    tu_assert_error(nb_linear(nb_to_dtype(x4, NB_I32), nb_to_dtype(w, NB_I32), NULL),
                    NB_EDTYPE, "i32");
    tu_assert_error(nb_linear(nb_scalar(1, NB_F32), w, NULL), NB_ESHAPE, "0-dim");
    tu_assert_error(nb_linear(NULL, w, b), NB_ENULL, NULL);
    tu_assert_error(nb_linear(x4, NULL, b), NB_ENULL, NULL);
    tu_assert_error(nb_linear_new(-1, 3, NULL), NB_EINVAL, ">= 0");
    nb_linear_opts lin = nb_linear_defaults();
    lin.dtype = NB_I64;
    tu_assert_error(nb_linear_new(2, 3, &lin), NB_EDTYPE, "float");

    tu_assert_error(nb_layer_norm(x, b, NULL, 1e-5), NB_ESHAPE, "weight must have shape [5]");
    tu_assert_error(
        nb_layer_norm(x, NULL, nb_to_dtype(tu_random((int64_t[]){5}, 1, NB_F32, 0, 1, 1), NB_F64),
                      1e-5),
        NB_EDTYPE, "bias is f64");
    tu_assert_error(nb_layer_norm(nb_to_dtype(x, NB_I64), NULL, NULL, 1e-5), NB_EDTYPE, "i64");
    tu_assert_error(nb_layer_norm(nb_scalar(1, NB_F32), NULL, NULL, 1e-5), NB_ESHAPE, "at least 1");
    tu_assert_error(nb_layer_norm(x, NULL, NULL, -1), NB_EINVAL, "eps");
    tu_assert_error(nb_layer_norm(NULL, NULL, NULL, 1e-5), NB_ENULL, NULL);

    nb_tensor *rm = nb_zeros((int64_t[]){5}, 1, NB_F32), *rv = nb_ones((int64_t[]){5}, 1, NB_F32);
    tu_assert_error(nb_batch_norm(b, NULL, NULL, NULL, NULL, true, 0.1, 1e-5), NB_ESHAPE,
                    "at least 2 dims");
    tu_assert_error(nb_batch_norm(x, nb_zeros((int64_t[]){4}, 1, NB_F32), rv, NULL, NULL, true,
                                  0.1, 1e-5),
                    NB_ESHAPE, "running_mean must have shape [5]");
    tu_assert_error(nb_batch_norm(x, rm, NULL, NULL, NULL, true, 0.1, 1e-5), NB_EINVAL, "both");
    tu_assert_error(nb_batch_norm(x, NULL, NULL, NULL, NULL, false, 0.1, 1e-5), NB_EINVAL,
                    "running_mean and running_var are required");
    tu_assert_error(nb_batch_norm(tu_random((int64_t[]){1, 5}, 2, NB_F32, 0, 1, 1), rm, rv, NULL,
                                  NULL, true, 0.1, 1e-5),
                    NB_EINVAL, "more than 1 value per channel");
    tu_assert_error(nb_batch_norm(x, rm, rv, b, NULL, true, 0.1, 1e-5), NB_ESHAPE,
                    "weight must have shape [5]");
    tu_assert_error(nb_batch_norm(x, rm, rv, NULL, NULL, true, 2, 1e-5), NB_EINVAL, "momentum");
    tu_assert_error(nb_batch_norm(x, nb_zeros((int64_t[]){5}, 1, NB_I32), rv, NULL, NULL, true,
                                  0.1, 1e-5),
                    NB_EDTYPE, "float");

    tu_assert_error(nb_dropout(x, 1.5, true, NULL), NB_EINVAL, "[0, 1]");
    tu_assert_error(nb_dropout(nb_to_dtype(x, NB_I32), 0.5, true, NULL), NB_EDTYPE, "i32");
    tu_assert_error(nb_dropout(NULL, 0.5, true, NULL), NB_ENULL, NULL);
    tu_assert_error(nb_dropout_new(-0.1, NULL), NB_EINVAL, "[0, 1]");
    tu_assert_error(nb_batch_norm2d_new(-2, NULL), NB_EINVAL, ">= 0");
    nb_module *bn1 = nb_batch_norm1d_new(5, NULL);
    tu_assert_error(nb_forward(bn1, tu_random((int64_t[]){2, 5, 1, 1}, 4, NB_F32, 0, 1, 1)),
                    NB_ESHAPE, "(N, C)");
    nb_module_free(bn1);
    nb_scope_end();
}
END_TEST


/* ---- forward hooks ----------------------------------------------------------------------- */
typedef struct hook_log {
    char seq[64];
    nb_module *m;
    nb_tensor *out;
    int fail_at; /* the call (1-based) that fails, 0: none */
    int calls;
    int remove_handle;
    nb_status remove_status;
} hook_log;

static nb_status log_pre(nb_module *m, nb_tensor *x, void *ctx) {
    hook_log *l = ctx;
    (void)x;
    l->calls++;
    strcat(l->seq, m == l->m ? "P" : "p");
    if (l->remove_handle >= 0) l->remove_status = nb_module_remove_forward_hook(m, l->remove_handle);
    if (l->fail_at == l->calls) return nb__error(NB_EINVAL, "pre hook says no");
    return NB_OK;
}

static nb_status log_post(nb_module *m, nb_tensor *x, nb_tensor *out, void *ctx) {
    hook_log *l = ctx;
    (void)m;
    (void)x;
    strcat(l->seq, "o");
    l->out = out;
    return l->fail_at < 0 ? NB_EINVAL : NB_OK; /* no message: nb_forward writes one */
}

START_TEST(test_forward_hooks) {
    nb_scope_begin();
    nb_generator *g = nb_generator_new(1);
    nb_linear_opts o = nb_linear_defaults();
    o.gen = g;
    nb_module *lin = nb_linear_new(3, 2, &o);
    nb_module *m = nb_sequential_new(lin, nb_relu_new(), NULL);
    nb_generator_free(g);
    nb_tensor *x = nb_ones((int64_t[]){4, 3}, 2, NB_F32);
    hook_log l = {.m = m, .remove_handle = -1};
    int h1 = nb_module_register_forward_pre_hook(m, log_pre, &l);
    int h2 = nb_module_register_forward_hook(m, log_post, &l);
    int h3 = nb_module_register_forward_pre_hook(lin, log_pre, &l);
    ck_assert_int_ge(h1, 0);
    ck_assert_int_ne(h1, h2);
    ck_assert_int_ge(h3, 0);
    /* order: the sequential's pre hook, the child's (inside the forward), the post hook */
    nb_tensor *y = nb_forward(m, x);
    ck_assert_ptr_nonnull(y);
    ck_assert_str_eq(l.seq, "Ppo");
    ck_assert_ptr_eq(l.out, y);
    /* a failing pre hook: NULL with its error, the forward does not run */
    l.seq[0] = 0, l.calls = 0, l.fail_at = 1;
    ck_assert_ptr_null(nb_forward(m, x));
    ck_assert_int_eq(nb_last_status(), NB_EINVAL);
    ck_assert_str_eq(nb_last_error(), "pre hook says no");
    ck_assert_str_eq(l.seq, "P");
    /* a failing forward hook without a message */
    l.seq[0] = 0, l.calls = 0, l.fail_at = -1;
    nb_clear_error();
    ck_assert_ptr_null(nb_forward(m, x));
    ck_assert_str_eq(nb_last_error(), "forward: a forward hook of a Sequential failed");
    /* removal: refused while the hooks run, unknown handles, then gone */
    l.seq[0] = 0, l.calls = 0, l.fail_at = 0, l.remove_handle = h2;
    ck_assert_ptr_nonnull(nb_forward(m, x));
    ck_assert_int_eq(l.remove_status, NB_ESTATE);
    l.remove_handle = -1;
    ck_assert_int_eq(nb_module_remove_forward_hook(m, h2), NB_OK);
    ck_assert_int_eq(nb_module_remove_forward_hook(m, h2), NB_EINVAL);
    ck_assert_int_eq(nb_module_remove_forward_hook(lin, h3), NB_OK);
    l.seq[0] = 0;
    ck_assert_ptr_nonnull(nb_forward(m, x));
    ck_assert_str_eq(l.seq, "P");
    ck_assert_int_lt(nb_module_register_forward_hook(m, NULL, &l), 0);
    ck_assert_int_eq(nb_last_status(), NB_ENULL);
    ck_assert_int_lt(nb_module_register_forward_pre_hook(NULL, log_pre, &l), 0);
    /* a NULL input after a failure propagates it: no hook runs, the first error stays */
    l.seq[0] = 0;
    ck_assert_ptr_null(nb_forward(m, nb_reshape(x, (int64_t[]){5, 5}, 2)));
    ck_assert_int_eq(nb_last_status(), NB_ESHAPE);
    ck_assert_ptr_null(nb_forward(m, NULL));
    ck_assert_int_eq(nb_last_status(), NB_ESHAPE);
    ck_assert_str_eq(l.seq, "");
    /* without an earlier failure, a NULL input is NB_ENULL */
    nb_clear_error();
    ck_assert_ptr_null(nb_forward(m, NULL));
    ck_assert_int_eq(nb_last_status(), NB_ENULL);
    ck_assert_str_eq(nb_last_error(), "forward: the input of a Sequential is NULL");
    ck_assert_str_eq(l.seq, "");
    nb_clear_error();
    nb_module_free(m);
    nb_scope_end();
}
END_TEST

void nb_tests_nn_modules(Suite *s) {
    struct {
        const char *name;
        const TTest *fn;
    } cases[] = {
        {"init", test_init},
        {"modules", test_modules},
        {"sequential", test_sequential},
        {"flatten_parameters", test_flatten_parameters},
        {"errors", test_layer_errors},
        {"module_lookup_errors", test_module_lookup_errors},
        {"forward_hooks", test_forward_hooks},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_add_test(tc, cases[i].fn);
        suite_add_tcase(s, tc);
    }
}
