/* test_io_state.c - the io suite's module state tests: save and load of a module's state
 * (round trips, every class of load error, state lists and prefixes); added to the suite's
 * "state" TCase by nb_tests_io_state (tests/test_io.c). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_io.h"
#include "testutil.h"

/* ---- modules --------------------------------------------------------------------------------------- */
static nb_module *make_mlp(uint64_t seed, int64_t out, bool extra) {
    nb_generator *g = nb_generator_new(seed);
    nb_linear_opts o = nb_linear_defaults();
    o.gen = g;
    nb_module *m = nb_sequential_new(nb_linear_new(4, 8, &o), nb_relu_new(),
                                     nb_batch_norm1d_new(8, NULL), nb_linear_new(8, out, &o),
                                     extra ? nb_linear_new(out, 2, &o) : NULL, NULL);
    nb_generator_free(g);
    ck_assert_msg(m, "%s", nb_last_error());
    return m;
}

/* Snapshot of every parameter and buffer value (bytes), to compare later. */
static nb_state_list snapshot(nb_module *m) {
    nb_state_list l = {0}, c = {0};
    ASSERT_OK(nb_state_list_add_module(&l, NULL, m));
    for (int i = 0; i < l.count; i++) {
        nb_scope_begin();
        ASSERT_OK(nb_state_list_add(&c, NULL, l.names[i], nb_clone(l.tensors[i])));
        nb_scope_end();
    }
    nb_state_list_deinit(&l);
    return c;
}

static nb_tensor *list_get(const nb_state_list *l, const char *name) {
    for (int i = 0; i < l->count; i++)
        if (strcmp(l->names[i], name) == 0) return l->tensors[i];
    ck_abort_msg("no %s in the list", name);
    return NULL;
}

static void assert_module_equals(nb_module *m, const nb_state_list *want) {
    nb_state_list l = {0};
    ASSERT_OK(nb_state_list_add_module(&l, NULL, m));
    ck_assert_int_eq(l.count, want->count);
    for (int i = 0; i < l.count; i++) {
        ck_assert_str_eq(l.names[i], want->names[i]);
        assert_identical(l.tensors[i], want->tensors[i], l.names[i]);
    }
    nb_state_list_deinit(&l);
}

START_TEST(test_module_roundtrip) {
    nb_scope_begin();
    char *dir = tu_make_dir(), *path = tu_path_in(dir, "model.safetensors");
    nb_module *a = make_mlp(1, 3, false);
    /* buffers with non-default values */
    ASSERT_OK(nb_copy_(nb_module_find(a, "2.running_mean"), rand_of((int64_t[]){8}, 1, NB_F32, 3)));
    ASSERT_OK(nb_fill_(nb_module_find(a, "2.num_batches_tracked"), 17));
    ASSERT_OK(nb_module_save(a, path));
    nb_state_list want = snapshot(a);

    nb_safetensors *f = nb_safetensors_open(path);
    ck_assert(f);
    ck_assert_str_eq(nb_safetensors_metadata(f, "format"), "pt");
    ck_assert_int_eq(nb_safetensors_count(f), want.count);
    for (int i = 0; i < want.count; i++) ck_assert_int_ge(nb_safetensors_find(f, want.names[i]), 0);
    ck_assert_int_ge(nb_safetensors_find(f, "0.weight"), 0);
    ck_assert_int_ge(nb_safetensors_find(f, "2.running_var"), 0);
    nb_safetensors_close(f);

    nb_module *b = make_mlp(2, 3, false);
    ck_assert(!nb_shares_storage(nb_module_find(a, "0.weight"), nb_module_find(b, "0.weight")));
    ASSERT_OK(nb_module_load(b, path, true));
    assert_module_equals(b, &want);
    /* Into flattened parameters (views of one buffer) as well. */
    nb_module *c = make_mlp(3, 3, false);
    ASSERT_OK(nb_module_flatten_parameters(c, 0));
    ASSERT_OK(nb_module_load(c, path, true));
    assert_module_equals(c, &want);
    ck_assert(nb_shares_storage(nb_module_find(c, "0.weight"), nb_module_flat_params(c)));
    /* Loaded parameters are still trainable leaves. */
    nb_tensor *y = nb_sum(nb_forward(b, nb_ones((int64_t[]){2, 4}, 2, NB_F32)), NULL, 0, false);
    ck_assert_msg(y, "%s", nb_last_error());
    ASSERT_OK(nb_backward(y));
    ck_assert(nb_grad(nb_module_find(b, "3.weight")) != NULL);
    nb_state_list_deinit(&want);
    nb_module_free(a);
    nb_module_free(b);
    nb_module_free(c);
    free(path);
    tu_rm_dir(dir);
    nb_scope_end();
}
END_TEST

START_TEST(test_module_load_errors) {
    nb_scope_begin();
    char *dir = tu_make_dir(), *path = tu_path_in(dir, "model.safetensors");
    nb_module *src = make_mlp(1, 3, false);
    ASSERT_OK(nb_module_save(src, path));

    /* a mis-shaped tensor, strict or not: both shapes named, nothing changed */
    nb_module *wrong = make_mlp(2, 5, false);
    nb_state_list before = snapshot(wrong);
    for (int strict = 0; strict < 2; strict++) {
        ck_assert_int_eq(nb_module_load(wrong, path, strict), NB_ESHAPE);
        ck_assert_msg(strstr(nb_last_error(), "module_load: tensor \"3.weight\"") &&
                          strstr(nb_last_error(), "[3,8]") && strstr(nb_last_error(), "[5,8]") &&
                          strstr(nb_last_error(), path), "%s", nb_last_error());
        assert_module_equals(wrong, &before);
    }
    nb_state_list_deinit(&before);

    /* missing tensors: strict fails naming the first, non-strict loads the rest */
    nb_module *more = make_mlp(2, 3, true);
    before = snapshot(more);
    ASSERT_ST(nb_module_load(more, path, true), NB_EINVAL,
              "has no tensor \"4.weight\" (and 1 more");
    assert_module_equals(more, &before);
    ASSERT_OK(nb_module_load(more, path, false));
    assert_identical(nb_module_find(more, "3.weight"), nb_module_find(src, "3.weight"), "3.weight");
    assert_identical(nb_module_find(more, "4.bias"), list_get(&before, "4.bias"), "4.bias");
    nb_state_list_deinit(&before);

    nb_linear_opts lin = nb_linear_defaults();
    lin.no_bias = true;
    /* the exact message for one missing tensor */
    nb_module *nobias = nb_linear_new(4, 8, &lin);
    nb_module *bias = nb_linear_new(4, 8, NULL);
    char *p2 = tu_path_in(dir, "nobias.safetensors");
    ASSERT_OK(nb_module_save(nobias, p2));
    ck_assert_int_ne(nb_module_load(bias, p2, true), NB_OK);
    char want[600];
    snprintf(want, sizeof want, "module_load: %s has no tensor \"bias\"", p2);
    ck_assert_str_eq(nb_last_error(), want);

    /* unexpected tensors: strict fails, non-strict ignores them */
    char *p3 = tu_path_in(dir, "bias.safetensors");
    ASSERT_OK(nb_module_save(bias, p3));
    ASSERT_ST(nb_module_load(nobias, p3, true), NB_EINVAL,
              "has tensor \"bias\", which the module does not have");
    ASSERT_OK(nb_module_load(nobias, p3, false));
    free(p3);
    nb_module *fewer = nb_sequential_new(nb_linear_new(4, 8, NULL), NULL);
    ASSERT_ST(nb_module_load(fewer, path, true), NB_EINVAL, "more that the module does not have");
    ASSERT_OK(nb_module_load(fewer, path, false));
    assert_identical(nb_module_find(fewer, "0.bias"), nb_module_find(src, "0.bias"), "0.bias");

    /* a bf16 file loads into f32 parameters, converted */
    nb_tensor *w16 = nb_to_dtype(rand_of((int64_t[]){8, 4}, 2, NB_F32, 4), NB_BF16);
    nb_tensor *b16 = nb_to_dtype(rand_of((int64_t[]){8}, 1, NB_F32, 5), NB_BF16);
    const char *nm[] = {"weight", "bias"};
    nb_tensor *ts[] = {w16, b16};
    ASSERT_OK(nb_safetensors_save(p2, nm, ts, 2, NULL, NULL, 0));
    ASSERT_OK(nb_module_load(bias, p2, true));
    assert_identical(nb_module_param(bias, "weight"), nb_to_dtype(w16, NB_F32), "bf16 weight");
    assert_identical(nb_module_param(bias, "bias"), nb_to_dtype(b16, NB_F32), "bf16 bias");

    /* bad arguments and bad files */
    ASSERT_ST(nb_module_load(NULL, path, true), NB_ENULL, "module");
    ASSERT_ST(nb_module_load(src, NULL, true), NB_ENULL, "path");
    ASSERT_ST(nb_module_save(NULL, path), NB_ENULL, "module");
    ASSERT_ST(nb_module_save(src, NULL), NB_ENULL, "path");
    char *nofile = tu_path_in(dir, "none.safetensors");
    ASSERT_ST(nb_module_load(src, nofile, false), NB_EIO, "none.safetensors");
    tu_write_file(nofile, "\x04\0\0\0\0\0\0\0[]  ", 12);
    ASSERT_ST(nb_module_load(src, nofile, false), NB_EFORMAT, "not a JSON object");
    free(nofile);

    nb_module_free(src);
    nb_module_free(wrong);
    nb_module_free(more);
    nb_module_free(nobias);
    nb_module_free(bias);
    nb_module_free(fewer);
    free(p2);
    free(path);
    tu_rm_dir(dir);
    nb_scope_end();
}
END_TEST

/* Several objects in one file under prefixes, as a checkpoint stores them. */
START_TEST(test_state_lists_and_prefixes) {
    nb_scope_begin();
    char *dir = tu_make_dir(), *path = tu_path_in(dir, "ckpt.safetensors");
    nb_module *m = make_mlp(1, 3, false);
    nb_state_list l;
    nb_state_list_init(&l);
    ASSERT_OK(nb_state_list_add_module(&l, "model.", m));
    ASSERT_OK(nb_state_list_add(&l, "optim.", "step", nb_scalar(42, NB_I64)));
    ASSERT_OK(
        nb_state_list_add(&l, "optim.", "exp_avg.0.weight", nb_ones((int64_t[]){8, 4}, 2, NB_F32)));
    ck_assert_str_eq(l.names[0], "model.0.weight");
    nb_clear_error();
    ASSERT_ST(nb_state_list_add(&l, NULL, "x", NULL), NB_ENULL, "\"x\" is NULL");
    ASSERT_OK(nb_safetensors_save(path, l.names, l.tensors, l.count, NULL, NULL, 0));
    nb_state_list_deinit(&l);
    ck_assert_int_eq(l.count, 0);

    nb_safetensors *f = nb_safetensors_open(path);
    ck_assert(f);
    nb_module *m2 = make_mlp(2, 3, false);
    ASSERT_OK(nb_module_load_from(m2, f, "model.", true)); /* "optim.*" lies outside the prefix */
    nb_state_list want = snapshot(m);
    assert_module_equals(m2, &want);
    nb_state_list_deinit(&want);

    nb_state_list o = {0};
    ASSERT_OK(nb_state_list_add_file(&o, f, "optim."));
    ck_assert_int_eq(o.count, 2);
    int step = strcmp(o.names[0], "step") == 0 ? 0 : 1;
    ck_assert_str_eq(o.names[step], "step");
    ck_assert_str_eq(o.names[1 - step], "exp_avg.0.weight");
    ck_assert_int_eq(nb_item_i64(o.tensors[step]), 42);
    nb_state_list_deinit(&o);
    ASSERT_OK(nb_state_list_add_file(&o, f, NULL));
    ck_assert_int_eq(o.count, nb_safetensors_count(f));
    nb_state_list_deinit(&o);

    /* nb_state_load on an explicit list; strict sees unexpected names under the prefix only */
    nb_tensor *dst = nb_zeros(NULL, 0, NB_F64);
    const char *nm[] = {"step"};
    ASSERT_ST(nb_state_load(f, "optim.", nm, &dst, 1, true), NB_EINVAL, "optim.exp_avg.0.weight");
    ck_assert(nb_item_f64(dst) == 0);
    ASSERT_OK(nb_state_load(f, "optim.", nm, &dst, 1, false));
    ck_assert(nb_item_f64(dst) == 42); /* i64 -> f64 */
    nb_tensor *wrong = nb_zeros((int64_t[]){1}, 1, NB_I64);
    ASSERT_ST(nb_state_load(f, "optim.", nm, &wrong, 1, false), NB_ESHAPE,
              "the destination expects [1]");
    ASSERT_ST(nb_state_load(NULL, NULL, nm, &dst, 1, false), NB_ENULL, "NULL");
    ASSERT_ST(nb_state_load(f, NULL, NULL, &dst, 1, false), NB_ENULL, "names");
    nb_safetensors_close(f);
    nb_module_free(m);
    nb_module_free(m2);
    free(path);
    tu_rm_dir(dir);
    nb_scope_end();
}
END_TEST

void nb_tests_io_state(TCase *tc) {
    tcase_add_test(tc, test_module_roundtrip);
    tcase_add_test(tc, test_module_load_errors);
    tcase_add_test(tc, test_state_lists_and_prefixes);
}
