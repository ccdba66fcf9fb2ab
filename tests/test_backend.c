/* test_backend.c - the backend layer: the kernel table is complete for the CPU, every op
 * name maps to real kernels, devices parse and print, the meta device computes shapes
 * only, the guard device keeps device memory away from the host, and operands on two
 * devices or devices this build lacks give clear errors. */
#include <math.h>
#include <string.h>

#include <nabla/autocast.h>
#include <nabla/gpt.h>

#include "cpu/backend.h"
#include "cpu/elementwise.h"
#include "cuda/backend.h"
#include "testutil.h"

#define GUARD ((nb_device){NB_DEVICE_GUARD, 0})

/* Every kernel of NB__KERNELS has a CPU implementation; print the ones CUDA lacks. */
START_TEST(test_table_complete) {
    const nb__backend *cpu = nb__cpu_backend();
    int missing = 0;
    for (int i = 0; i < nb__kernel_count; i++) {
        if (!nb__kernel_at(&cpu->k, &nb__kernel_infos[i])) {
            fprintf(stderr, "no cpu kernel: %s\n", nb__kernel_infos[i].name);
            missing++;
        }
    }
    ck_assert_int_eq(missing, 0);
    ck_assert_int_gt(nb__kernel_count, 10);
    /* The guard device wraps every CPU kernel. */
    const nb__backend *guard = nb__guard_backend();
    for (int i = 0; i < nb__kernel_count; i++)
        ck_assert_ptr_nonnull(nb__kernel_at(&guard->k, &nb__kernel_infos[i]));
    /* Which kernels the CUDA backend has not got yet (informational; CUDA builds). */
    const nb__kernels *cuda = nb__cuda_kernels();
    if (cuda) {
        int n = 0;
        for (int i = 0; i < nb__kernel_count; i++)
            if (!nb__kernel_at(cuda, &nb__kernel_infos[i])) {
                if (n++ == 0) fprintf(stderr, "kernels without a CUDA implementation yet:");
                fprintf(stderr, " %s", nb__kernel_infos[i].name);
            }
        fprintf(stderr, "%s(%d of %d kernels missing on CUDA)\n", n ? "\n" : "", n,
                nb__kernel_count);
    }
}
END_TEST

/* Every op's kernel list names real kernels, and every op that is not a view lists one. */
START_TEST(test_op_kernels) {
    static const char *const views[] = {"view", "permute", "narrow", "expand", "slice",
                                        "select", "to_device", "recompute"};
    for (int op = 0; op < NB__OP_COUNT; op++) {
        const char *const *ks = nb__op_kernels(nb__op_names[op]);
        ck_assert_msg(ks != NULL, "no kernel list for %s", nb__op_names[op]);
        bool is_view = false;
        for (size_t v = 0; v < sizeof views / sizeof views[0]; v++)
            is_view |= strcmp(views[v], nb__op_names[op]) == 0;
        ck_assert_msg(is_view || ks[0] != NULL, "op %s lists no kernel", nb__op_names[op]);
        for (; *ks; ks++) {
            bool found = false;
            for (int i = 0; i < nb__kernel_count && !found; i++)
                found = strcmp(nb__kernel_infos[i].name, *ks) == 0;
            ck_assert_msg(found, "op %s lists unknown kernel %s", nb__op_names[op], *ks);
        }
        ck_assert(nb_device_supports(NB_CPU, nb__op_names[op]));
        ck_assert(nb_device_supports(NB_META, nb__op_names[op]));
    }
    ck_assert(!nb_device_supports(NB_CPU, "no_such_op"));
    ck_assert(nb_device_supports(NB_CPU, "ew")); /* a kernel name */
}
END_TEST

/* The elementwise dtype rules of the op layer match what the CPU table implements. */
START_TEST(test_ew_rules_match_cpu) {
    for (int op = 0; op < NB__OP_COUNT; op++)
        for (int dt = 0; dt < NB_DTYPE_COUNT; dt++) {
            bool rule = nb__ew_supported((nb__op)op, (nb_dtype)dt);
            bool cpu = nb__cpu_ew_kernel((nb__op)op, (nb_dtype)dt) != NULL;
            ck_assert_msg(rule == cpu, "%s/%s: rule %d, cpu kernel %d", nb__op_names[op],
                          nb_dtype_name((nb_dtype)dt), rule, cpu);
            for (int in = 0; in < 2; in++) {
                bool brule = nb__ew_backward_supported((nb__op)op, in, (nb_dtype)dt);
                bool bcpu = nb__cpu_ew_bw_kernel((nb__op)op, in, (nb_dtype)dt) != NULL;
                ck_assert_msg(brule == bcpu, "%s input %d/%s backward: rule %d, cpu %d",
                              nb__op_names[op], in, nb_dtype_name((nb_dtype)dt), brule, bcpu);
            }
        }
}
END_TEST

START_TEST(test_device_names) {
    nb_device d;
    char buf[32];
    ck_assert_int_eq(nb_device_parse("cpu", &d), NB_OK);
    ck_assert(nb_device_equal(d, NB_CPU));
    ck_assert_int_eq(nb_device_parse("cuda:3", &d), NB_OK);
    ck_assert(d.type == NB_DEVICE_CUDA && d.index == 3);
    ck_assert_str_eq(nb_device_name(d, buf, sizeof buf), "cuda:3");
    ck_assert_int_eq(nb_device_parse("cuda", &d), NB_OK);
    ck_assert(d.type == NB_DEVICE_CUDA && d.index == 0);
    ck_assert_int_eq(nb_device_parse("meta", &d), NB_OK);
    ck_assert(nb_device_equal(d, NB_META));
    ck_assert_str_eq(nb_device_name(NB_META, buf, sizeof buf), "meta");
    const char *bad[] = {"", "gpu", "cuda:", "cuda:x", "cpu:1", "cuda:1x", "metal"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(nb_device_parse(bad[i], &d), NB_EINVAL);
        ck_assert_ptr_nonnull(strstr(nb_last_error(), "is not a device"));
    }
    ck_assert_int_eq(nb_device_parse(NULL, &d), NB_ENULL);
}
END_TEST

/* Meta tensors: shapes and dtypes, no storage, ops infer shapes and record autograd. */
START_TEST(test_meta) {
    nb_scope_begin();
    int64_t shape[] = {1000000, 1000000}; /* 4 TB as f32: nothing is allocated */
    nb_alloc_stats before, after;
    nb_alloc_get_stats(&before);
    nb_tensor *x = nb_zeros_on(NB_META, shape, 2, NB_F32);
    ck_assert_ptr_nonnull(x);
    nb_tensor *y = nb_gelu(nb_add(x, nb_ones_on(NB_META, (int64_t[]){1000000}, 1, NB_F32)));
    ck_assert_ptr_nonnull(y);
    ck_assert_int_eq(nb_ndim(y), 2);
    ck_assert_int_eq(nb_shape(y)[1], 1000000);
    ck_assert(nb_device_equal(nb_tensor_device(y), NB_META));
    nb_alloc_get_stats(&after);
    ck_assert_int_lt(after.bytes_peak - before.bytes_peak, 1 << 20);
    /* Data access is an error, not a crash. */
    ck_assert_ptr_null(nb_data(y));
    ck_assert_int_eq(nb_last_status(), NB_EDEVICE);
    ck_assert(isnan(nb_item_f64(nb_sum(y, NULL, 0, false))));
    nb_tensor *c = nb_to_device(y, NB_CPU);
    tu_assert_error(c, NB_EDEVICE, "meta tensor has no data");
    /* Autograd on meta: gradients of the right shape on meta. */
    nb_tensor *w = nb_zeros_on(NB_META, (int64_t[]){3, 4}, 2, NB_F32);
    nb_set_requires_grad(w, true);
    nb_tensor *loss = nb_sum(nb_mul(nb_exp(w), w), NULL, 0, false);
    ck_assert_int_eq(nb_backward(loss), NB_OK);
    nb_tensor *g = nb_grad(w);
    ck_assert_ptr_nonnull(g);
    ck_assert(nb_device_equal(nb_tensor_device(g), NB_META));
    ck_assert_int_eq(nb_shape(g)[1], 4);
    /* A CPU tensor copied to meta keeps shape and dtype. */
    nb_tensor *m = nb_to_device(nb_ones((int64_t[]){2, 5}, 2, NB_BF16), NB_META);
    ck_assert_int_eq(nb_tensor_dtype(m), NB_BF16);
    ck_assert_int_eq(nb_shape(m)[1], 5);
    nb_scope_end();
}
END_TEST

/* Guard tensors compute like CPU tensors through the backend, and round-trip. */
START_TEST(test_guard_roundtrip) {
    nb_scope_begin();
    int64_t shape[] = {3, 70};
    nb_tensor *a = tu_random(shape, 2, NB_F32, -2, 2, 1), *b = tu_random(shape, 2, NB_F32, -2, 2, 2);
    nb_tensor *ga = nb_to_device(a, GUARD), *gb = nb_to_device(b, GUARD);
    ck_assert_ptr_nonnull(ga);
    ck_assert_ptr_null(nb_data(ga)); /* not host memory */
    nb_tensor *ref = nb_tanh(nb_mul(nb_add_scalar(a, 0.5), nb_transpose(nb_transpose(b, 0, 1), 0, 1)));
    nb_tensor *gy = nb_tanh(nb_mul(nb_add_scalar(ga, 0.5), gb));
    ck_assert(nb_device_equal(nb_tensor_device(gy), GUARD));
    /* nb_data_ptr: the device address of any tensor with storage (a view's is offset),
     * the host pointer for the CPU, an error for meta */
    ck_assert_ptr_nonnull(nb_data_ptr(ga));
    ck_assert_ptr_eq(nb_data_ptr(a), nb_data(a));
    ck_assert_ptr_eq(nb_data_ptr(nb_narrow(ga, 1, 5, 10)), (char *)nb_data_ptr(ga) + 5 * 4);
    ck_assert_ptr_null(nb_data_ptr(nb_empty_on(NB_META, shape, 2, NB_F32)));
    ck_assert_int_eq(nb_last_status(), NB_EDEVICE);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "data_ptr: a meta tensor has no data"));
    nb_tensor *y = nb_to_device(gy, NB_CPU);
    double *r = tu_values(ref);
    tu_assert_close(y, r, shape, 2, 0);
    free(r);
    /* Reading device memory goes through the backend. */
    ck_assert(nb_item_f64(nb_sum(gy, NULL, 0, false)) == nb_item_f64(nb_sum(ref, NULL, 0, false)));
    /* Gradients flow back across nb_to_device. */
    nb_set_requires_grad(a, true);
    nb_tensor *s = nb_sum(nb_mul(nb_to_device(a, GUARD), gb), NULL, 0, false);
    ck_assert_int_eq(nb_backward(nb_to_device(s, NB_CPU)), NB_OK);
    ck_assert(nb_device_equal(nb_tensor_device(nb_grad(a)), NB_CPU));
    double *gv = tu_values(nb_grad(a)), *bv = tu_values(b);
    tu_assert_close(nb_grad(a), bv, shape, 2, 0);
    free(gv), free(bv);
    nb_scope_end();
}
END_TEST

START_TEST(test_mixed_devices) {
    nb_scope_begin();
    nb_tensor *a = nb_ones((int64_t[]){4}, 1, NB_F32);
    nb_tensor *m = nb_ones_on(NB_META, (int64_t[]){4}, 1, NB_F32);
    tu_assert_error(nb_add(a, m), NB_EDEVICE, "add: operands on cpu and meta");
    tu_assert_error(nb_where(nb_gt(a, a), a, m), NB_EDEVICE, "operands on cpu and meta");
    ck_assert_int_eq(nb_copy_(a, m), NB_EDEVICE);
    ck_assert_int_eq(nb_add_(a, m), NB_EDEVICE);
    nb_scope_end();
}
END_TEST

/* Without a usable GPU (or without CUDA), CUDA tensors are a clear error, never a crash. */
START_TEST(test_cuda_without_gpu) {
    if (nb_cuda_is_available()) return;
    nb_scope_begin();
    nb_tensor *t = nb_zeros_on(NB_CUDA(0), (int64_t[]){4}, 1, NB_F32);
    ck_assert_ptr_null(t);
    ck_assert_int_ne(nb_last_status(), NB_OK);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "cuda:0"));
    tu_assert_error(nb_to_device(nb_ones((int64_t[]){2}, 1, NB_F32), NB_CUDA(0)),
                    nb_last_status() == NB_EUNSUPPORTED ? NB_EUNSUPPORTED : NB_EDEVICE, "cuda:0");
    ck_assert(!nb_device_supports(NB_CUDA(0), "gelu"));
    nb_scope_end();
}
END_TEST

/* A GPT training step with gradient accumulation reads device memory back to the host
 * (a synchronization on a GPU) a fixed number of times, not once per micro-batch: the
 * losses are summed on the device and read once; the gradient norm is the other read. */
START_TEST(test_gpt_step_host_reads) {
    nb_device prev = nb_set_default_device(GUARD);
    nb_scope_begin();
    nb_generator *g = nb_generator_new(5);
    nb_gpt_config cfg = nb_gpt_config_defaults();
    cfg.block_size = 8, cfg.n_layer = 1, cfg.n_head = 2, cfg.n_embd = 16;
    nb_module *m = nb_gpt_new(&cfg, g);
    nb_adamw_opts wo = nb_adamw_defaults();
    nb_optim *opt = m ? nb_adamw_new(nb_parameters(m), &wo) : NULL;
    ck_assert_msg(opt != NULL, "%s", nb_last_error());
    nb_tensor *x[8], *y[8];
    for (int i = 0; i < 8; i++) {
        x[i] = nb_randint((int64_t[]){2, 8}, 2, NB_I64, 0, 256, g);
        y[i] = nb_randint((int64_t[]){2, 8}, 2, NB_I64, 0, 256, g);
    }
    unsigned long reads[2];
    for (int k = 0; k < 2; k++) { /* 2, then 8 micro-batches: the same count */
        nb_gpt_step_opts so = nb_gpt_step_defaults();
        so.grad_clip = 1.0;
        double norm = 0;
        unsigned long r0 = nb__guard_host_reads();
        double loss = nb_gpt_train_step_ex(m, opt, x, y, k ? 8 : 2, &so, &norm);
        reads[k] = nb__guard_host_reads() - r0;
        ck_assert_msg(isfinite(loss), "%s", nb_last_error());
    }
    fprintf(stderr, "gpt step: %lu host reads with 2 micro-batches, %lu with 8\n", reads[0],
            reads[1]);
    ck_assert_int_eq(reads[0], reads[1]);
    ck_assert_int_le(reads[1], 3);
    nb_optim_free(opt);
    nb_module_free(m);
    nb_generator_free(g);
    nb_scope_end();
    nb_set_default_device(prev);
}
END_TEST

/* ---- the CUDA backend covers the bundled models ---------------------------------------------
 * Every kernel the bundled programs run has a CUDA entry. The set is not a hand-written list:
 * the models' training steps run on the guard device, which counts its kernel calls
 * (nb__guard_kernel_calls). What runs: the MLP (SGD with momentum) and the CNN (Adam) of
 * models/mlp.c and models/cnn.c with their evaluation (argmax, eq, sum); the GPT with
 * dropout, AdamW, gradient clipping, in f32, under bf16 autocast and in fp16 with the loss
 * scaler; and sampling from it (softmax, top-k, multinomial). */
static void cover_classifier(nb_module *m, nb_optim *opt, nb_tensor *x, nb_tensor *y) {
    nb_scope_begin();
    nb_tensor *loss = nb_cross_entropy(nb_forward(m, x), y, NULL);
    ck_assert_msg(loss != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_zero_grad(opt), NB_OK);
    ck_assert_int_eq(nb_backward(loss), NB_OK);
    ck_assert(nb_clip_grad_norm(nb_optim_params(opt), INFINITY, 2) >= 0);
    ck_assert_int_eq(nb_step(opt), NB_OK);
    bool prev = nb_set_grad_enabled(false);
    nb_tensor *ok = nb_sum(nb_eq(nb_argmax(nb_forward(m, x), 1, false), y), NULL, 0, false);
    ck_assert_msg(ok != NULL, "%s", nb_last_error());
    ck_assert_int_ge(nb_item_i64(ok), 0);
    nb_set_grad_enabled(prev);
    nb_scope_end();
}

START_TEST(test_cuda_covers_the_models) {
    const nb__kernels *cuda = nb__cuda_kernels();
    if (!cuda) return; /* a build without CUDA */
    unsigned long before[256] = {0}, after[256] = {0};
    ck_assert_int_le(nb__kernel_count, 256);
    nb_device prev_dev = nb_set_default_device(GUARD);
    nb__guard_kernel_calls(before, nb__kernel_count);
    nb_scope_begin();
    nb_generator *g = nb_generator_new(3);
    /* the MLP and the CNN, as models/mlp.c and models/cnn.c build them */
    nb_tensor *img = nb_randn((int64_t[]){4, 1, 28, 28}, 4, NB_F32, g);
    nb_tensor *lab = nb_randint((int64_t[]){4}, 1, NB_I64, 0, 10, g);
    nb_linear_opts lo = nb_linear_defaults();
    lo.gen = g;
    nb_module *mlp = nb_sequential_new(nb_flatten_new(0, 0), nb_linear_new(784, 32, &lo),
                                       nb_relu_new(), nb_linear_new(32, 10, &lo), NULL);
    nb_sgd_opts so2 = nb_sgd_defaults();
    so2.lr = 0.05, so2.momentum = 0.9;
    nb_optim *sgd = nb_sgd_new(nb_parameters(mlp), &so2);
    ck_assert_msg(mlp && sgd, "%s", nb_last_error());
    cover_classifier(mlp, sgd, img, lab);
    nb_conv2d_opts c = nb_conv2d_defaults();
    c.padding[0] = c.padding[1] = 1;
    c.gen = g;
    nb_module *cnn = nb_sequential_new(nb_conv2d_new(1, 4, 3, 3, &c), nb_relu_new(),
                                       nb_maxpool2d_new(2, 2, NULL), nb_flatten_new(0, 0),
                                       nb_linear_new(4 * 14 * 14, 10, &lo), NULL);
    nb_adam_opts ao = nb_adam_defaults();
    nb_optim *adam = nb_adam_new(nb_parameters(cnn), &ao);
    ck_assert_msg(cnn && adam, "%s", nb_last_error());
    cover_classifier(cnn, adam, img, lab);
    /* the GPT: f32, bf16 autocast, fp16 with the scaler, then sampling */
    nb_gpt_config cfg = nb_gpt_config_defaults();
    cfg.block_size = 8, cfg.n_layer = 1, cfg.n_head = 2, cfg.n_embd = 16, cfg.dropout = 0.1;
    nb_module *gpt = nb_gpt_new(&cfg, g);
    nb_adamw_opts wo = nb_adamw_defaults();
    nb_optim *adamw = gpt ? nb_adamw_new(nb_parameters(gpt), &wo) : NULL;
    ck_assert_msg(gpt && adamw, "%s", nb_last_error());
    nb_tensor *tx = nb_randint((int64_t[]){2, 8}, 2, NB_I64, 0, 256, g);
    nb_tensor *ty = nb_randint((int64_t[]){2, 8}, 2, NB_I64, 0, 256, g);
    nb_grad_scaler *scaler = nb_grad_scaler_new(NULL);
    for (int prec = 0; prec < 3; prec++) {
        nb_gpt_step_opts so = nb_gpt_step_defaults();
        so.grad_clip = 1.0;
        if (prec == 2) so.scaler = scaler;
        if (prec) ck_assert_int_eq(nb_autocast_begin(prec == 1 ? NB_BF16 : NB_F16), NB_OK);
        double norm = 0, loss = nb_gpt_train_step_ex(gpt, adamw, &tx, &ty, 1, &so, &norm);
        if (prec) nb_autocast_end();
        ck_assert_msg(isfinite(loss), "precision %d: %s", prec, nb_last_error());
    }
    int64_t prompt[] = {'a', 'b'}, out[4];
    nb_gpt_sample_opts sp = nb_gpt_sample_defaults();
    sp.temperature = 0.8, sp.top_k = 5, sp.gen = g;
    ck_assert_int_eq(nb_gpt_generate(gpt, prompt, 2, 4, &sp, out), NB_OK);
    nb_grad_scaler_free(scaler);
    nb_optim_free(sgd), nb_optim_free(adam), nb_optim_free(adamw);
    nb_module_free(mlp), nb_module_free(cnn), nb_module_free(gpt);
    nb_generator_free(g);
    nb_scope_end();
    nb__guard_kernel_calls(after, nb__kernel_count);
    nb_set_default_device(prev_dev);
    int used = 0, missing = 0;
    char list[2048] = "";
    for (int i = 0; i < nb__kernel_count; i++) {
        if (after[i] == before[i]) continue;
        used++;
        if (!nb__kernel_at(cuda, &nb__kernel_infos[i])) {
            missing++;
            size_t n = strlen(list);
            snprintf(list + n, sizeof list - n, " %s", nb__kernel_infos[i].name);
        }
    }
    fprintf(stderr, "the bundled models run %d kernels; %d without a CUDA entry%s\n", used,
            missing, list);
    ck_assert_int_gt(used, 15);
    ck_assert_msg(missing == 0, "kernels the models use that CUDA lacks:%s", list);
}
END_TEST

Suite *nb_suite_backend(void) {
    Suite *s = suite_create("backend");
    TCase *tc = tcase_create("backend");
    tcase_add_test(tc, test_table_complete);
    tcase_add_test(tc, test_op_kernels);
    tcase_add_test(tc, test_ew_rules_match_cpu);
    tcase_add_test(tc, test_device_names);
    tcase_add_test(tc, test_meta);
    tcase_add_test(tc, test_guard_roundtrip);
    tcase_add_test(tc, test_mixed_devices);
    tcase_add_test(tc, test_cuda_without_gpu);
    tcase_add_test(tc, test_cuda_covers_the_models);
    tcase_add_test(tc, test_gpt_step_host_reads);
    suite_add_tcase(s, tc);
    return s;
}
