/* test_index_devices.c - the index suite's device cases: every indexing and joining op on
 * the guard device (bit for bit the CPU's, forward and backward, with the same index errors),
 * on the meta device (shapes, dtypes, gradients), and with operands on two devices.
 * Registered by nb_suite_index. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* Inputs as in test_index.c: index tensors uniform in [lo, hi), data in [-8, 8). */
static nb_tensor *rand_index(const int64_t *shape, int nd, int64_t lo, int64_t hi, nb_dtype dt,
                             uint64_t seed) {
    return tu_random(shape, nd, dt, (double)lo, (double)hi, seed);
}
static nb_tensor *data(const int64_t *shape, int nd, nb_dtype dt, uint64_t seed) {
    return tu_random(shape, nd, dt, -8, 8, seed);
}

/* ---- devices: meta, guard, mixed ------------------------------------------------------------
 * Every op of the family through one function shape, so the same cases run on the CPU, the
 * meta device and the guard device (whose memory faults on any host access outside a
 * kernel: the proof that the op definitions, backward rules included, never touch data). */
#define GUARD ((nb_device){NB_DEVICE_GUARD, 0})

typedef struct {
    const char *name;
    int nin;
    int64_t shapes[4][4];
    int nds[4];
    nb_dtype dts[4];
    int64_t hi[4]; /* index inputs: values in [0, hi); data inputs: 0 */
    bool grad[4];  /* inputs that require grad */
    int64_t out_shape[5];
    int out_nd;
    nb_dtype out_dt;
} dev_case;

static nb_tensor *dev_op(int c, nb_tensor *const *in) {
    switch (c) {
    case 0: return nb_index_select(in[0], 1, in[1]); /* general path */
    case 1: return nb_index_select(in[0], 0, in[1]); /* row memcpy path */
    case 2: return nb_embedding(in[0], in[1]);
    case 3: return nb_embedding(in[0], in[1]);       /* f16 table: index_add of halves */
    case 4: return nb_gather(in[0], 2, in[1]);
    case 5: return nb_scatter_add(in[0], 0, in[1], in[2]);
    case 6: return nb_scatter_add(in[0], 1, in[1], in[2]); /* f16: accumulates in f32 */
    case 7: return nb_masked_fill(in[0], in[1], -2.5);
    case 8: return nb_one_hot(in[0], 5, NB_BF16);
    case 9: return nb_tril(in[0], -1);
    case 10: return nb_triu(nb_transpose(in[0], 0, 2), 1); /* strided input */
    case 11: return nb_cat(in, 3, 1);
    case 12: return nb_stack(in, 2, -1);
    default: return NULL;
    }
}

static const dev_case DEV[] = {
    {"index_select", 2, {{5, 4, 3}, {7}}, {3, 1}, {NB_F32, NB_I64}, {0, 4}, {true},
     {5, 7, 3}, 3, NB_F32},
    {"index_select", 2, {{6, 8}, {9}}, {2, 1}, {NB_F64, NB_I32}, {0, 6}, {true},
     {9, 8}, 2, NB_F64},
    {"embedding", 2, {{10, 6}, {2, 3}}, {2, 2}, {NB_F32, NB_I32}, {0, 10}, {true},
     {2, 3, 6}, 3, NB_F32},
    {"embedding", 2, {{10, 8}, {9}}, {2, 1}, {NB_F16, NB_I64}, {0, 10}, {true},
     {9, 8}, 2, NB_F16},
    {"gather", 2, {{5, 4, 3}, {5, 4, 2}}, {3, 3}, {NB_F32, NB_I64}, {0, 3}, {true},
     {5, 4, 2}, 3, NB_F32},
    {"scatter_add", 3, {{5, 4, 3}, {2, 4, 3}, {3, 4, 3}}, {3, 3, 3}, {NB_F32, NB_I64, NB_F32},
     {0, 5, 0}, {true, false, true}, {5, 4, 3}, 3, NB_F32},
    {"scatter_add", 3, {{3, 6}, {3, 4}, {3, 5}}, {2, 2, 2}, {NB_F16, NB_I32, NB_F16},
     {0, 6, 0}, {true, false, true}, {3, 6}, 2, NB_F16},
    {"masked_fill", 2, {{5, 4, 3}, {4, 3}}, {3, 2}, {NB_F32, NB_BOOL}, {0, 0}, {true},
     {5, 4, 3}, 3, NB_F32},
    {"one_hot", 1, {{2, 7}}, {2}, {NB_I64}, {5}, {false}, {2, 7, 5}, 3, NB_BF16},
    {"tril", 1, {{2, 5, 6}}, {3}, {NB_F32}, {0}, {true}, {2, 5, 6}, 3, NB_F32},
    {"triu", 1, {{6, 5, 2}}, {3}, {NB_F64}, {0}, {true}, {2, 5, 6}, 3, NB_F64},
    {"cat", 3, {{2, 3}, {2, 1}, {2, 4}}, {2, 2, 2}, {NB_F32, NB_F32, NB_F64}, {0, 0, 0},
     {true, false, true}, {2, 8}, 2, NB_F64},
    {"stack", 2, {{2, 3}, {2, 3}}, {2, 2}, {NB_F32, NB_F32}, {0, 0}, {true, true},
     {2, 3, 2}, 3, NB_F32},
};
#define NDEV ((int)(sizeof DEV / sizeof DEV[0]))

/* Case c's inputs on the default device (index values in range), fresh leaves, grads as
 * the case says. */
static void dev_inputs(int c, nb_tensor **in) {
    const dev_case *k = &DEV[c];
    for (int i = 0; i < k->nin; i++) {
        if (k->hi[i]) in[i] = rand_index(k->shapes[i], k->nds[i], 0, k->hi[i], k->dts[i],
                                         200 + (uint64_t)(10 * c + i));
        else if (k->dts[i] == NB_BOOL)
            in[i] = tu_random(k->shapes[i], k->nds[i], NB_BOOL, -1, 1, 300 + (uint64_t)c);
        else in[i] = data(k->shapes[i], k->nds[i], k->dts[i], 400 + (uint64_t)(10 * c + i));
    }
}

static bool any_grad(const dev_case *k) {
    for (int i = 0; i < k->nin; i++)
        if (k->grad[i]) return true;
    return false;
}

/* Runs case c with its inputs moved to dev; y and the input gradients (NULL where none)
 * come back on the CPU. g (y's shape) is the output gradient. */
static nb_tensor *dev_run(int c, nb_tensor *const *cpu_in, nb_device dev, nb_tensor *g,
                          nb_tensor **grads) {
    const dev_case *k = &DEV[c];
    nb_tensor *in[4];
    for (int i = 0; i < k->nin; i++) {
        in[i] = nb_detach(nb_to_device(cpu_in[i], dev)); /* a fresh leaf */
        ck_assert_msg(in[i] != NULL, "%s", nb_last_error());
        ck_assert(nb_set_requires_grad(in[i], k->grad[i]) == NB_OK);
    }
    nb_tensor *y = dev_op(c, in);
    ck_assert_msg(y != NULL, "%s on %d: %s", k->name, (int)dev.type, nb_last_error());
    ck_assert(nb_device_equal(nb_tensor_device(y), dev));
    if (any_grad(k)) {
        nb_backward_opts o = nb_backward_defaults();
        o.grad_output = nb_to_device(g, dev);
        ck_assert_msg(nb_backward_ex(y, &o) == NB_OK, "%s backward: %s", k->name,
                      nb_last_error());
    }
    for (int i = 0; i < k->nin; i++) {
        grads[i] = k->grad[i] ? nb_to_device(nb_grad(in[i]), NB_CPU) : NULL;
        ck_assert(!k->grad[i] || grads[i]);
    }
    return nb_to_device(y, NB_CPU);
}

START_TEST(test_index_guard) {
    for (int c = 0; c < NDEV; c++) {
        nb_scope_begin();
        const dev_case *k = &DEV[c];
        nb_tensor *in[4], *gc[4], *gg[4];
        dev_inputs(c, in);
        nb_tensor *g = data(k->out_shape, k->out_nd, nb_dtype_is_float(k->out_dt) ? k->out_dt
                            : NB_F32, 500 + (uint64_t)c);
        nb_tensor *yc = dev_run(c, in, NB_CPU, g, gc);
        nb_tensor *yg = dev_run(c, in, GUARD, g, gg);
        ck_assert_int_eq(nb_ndim(yc), k->out_nd);
        ck_assert(memcmp(nb_shape(yc), k->out_shape, sizeof(int64_t) * (size_t)k->out_nd) == 0);
        tu_assert_same_bytes(yc, yg);
        for (int i = 0; i < k->nin; i++) {
            if (!k->grad[i]) continue;
            ck_assert_msg(memcmp(nb_shape(gc[i]), k->shapes[i],
                                 sizeof(int64_t) * (size_t)k->nds[i]) == 0, "%s", k->name);
            tu_assert_same_bytes(nb_contiguous(gc[i]), nb_contiguous(gg[i]));
        }
        nb_scope_end();
    }
    /* one_hot inferring its classes reads them through the index_minmax kernel */
    nb_scope_begin();
    nb_tensor *idx = tu_tensor((double[]){3, 0, 5, 1}, (int64_t[]){4}, 1, NB_I32);
    nb_tensor *oh = nb_to_device(nb_one_hot(nb_to_device(idx, GUARD), -1, NB_F32), NB_CPU);
    tu_assert_same_bytes(nb_one_hot(idx, -1, NB_F32), oh);
    ck_assert_int_eq(nb_shape(oh)[1], 6);
    /* the kernels check index values on the device, with the messages of the CPU */
    nb_tensor *x = nb_to_device(data((int64_t[]){10, 4}, 2, NB_F32, 1), GUARD);
    nb_tensor *bad = nb_to_device(tu_tensor((double[]){1, 12, 3}, (int64_t[]){3}, 1, NB_I64),
                                  GUARD);
    nb_tensor *neg = nb_to_device(tu_tensor((double[]){0, -2}, (int64_t[]){2, 1}, 2, NB_I32),
                                  GUARD);
    tu_assert_index_error(nb_index_select(x, 0, bad), NB_EINDEX,
                    "index_select: index 12 is out of range for dim 0 of size 10");
    tu_assert_index_error(nb_embedding(x, bad), NB_EINDEX,
                    "embedding: index 12 is out of range for dim 0 of size 10");
    tu_assert_index_error(nb_gather(x, 0, neg), NB_EINDEX,
                    "gather: index -2 is out of range for dim 0 of size 10");
    tu_assert_index_error(nb_scatter_add(x, 1, neg, x), NB_EINDEX,
                    "scatter_add: index -2 is out of range for dim 1 of size 4");
    tu_assert_index_error(nb_one_hot(bad, 5, NB_F32), NB_EINDEX, "index 12 is out of range for 5");
    tu_assert_index_error(nb_one_hot(neg, -1, NB_F32), NB_EINDEX, "class index -2 is negative");
    tu_assert_index_error(nb_one_hot(neg, 4, NB_F32), NB_EINDEX, "class index -2 is negative");
    nb_clear_error();
    nb_scope_end();
}
END_TEST

START_TEST(test_index_meta) {
    for (int c = 0; c < NDEV; c++) {
        nb_scope_begin();
        const dev_case *k = &DEV[c];
        nb_tensor *in[4];
        for (int i = 0; i < k->nin; i++) {
            in[i] = nb_empty_on(NB_META, k->shapes[i], k->nds[i], k->dts[i]);
            ck_assert(in[i] && nb_set_requires_grad(in[i], k->grad[i]) == NB_OK);
        }
        nb_tensor *y = dev_op(c, in);
        ck_assert_msg(y != NULL, "%s on meta: %s", k->name, nb_last_error());
        ck_assert(nb_device_equal(nb_tensor_device(y), NB_META));
        ck_assert_int_eq(nb_tensor_dtype(y), k->out_dt);
        ck_assert_int_eq(nb_ndim(y), k->out_nd);
        ck_assert(memcmp(nb_shape(y), k->out_shape, sizeof(int64_t) * (size_t)k->out_nd) == 0);
        ck_assert(nb_data(y) == NULL);
        nb_clear_error();
        if (any_grad(k)) {
            nb_tensor *g = nb_empty_on(NB_META, k->out_shape, k->out_nd, k->out_dt);
            nb_backward_opts o = nb_backward_defaults();
            o.grad_output = g;
            ck_assert_msg(nb_backward_ex(y, &o) == NB_OK, "%s backward on meta: %s", k->name,
                          nb_last_error());
        }
        for (int i = 0; i < k->nin; i++) {
            if (!k->grad[i]) continue;
            nb_tensor *gi = nb_grad(in[i]);
            ck_assert_msg(gi != NULL, "%s: no gradient for input %d", k->name, i);
            ck_assert(nb_device_equal(nb_tensor_device(gi), NB_META));
            ck_assert_int_eq(nb_tensor_dtype(gi), k->dts[i]);
            ck_assert_int_eq(nb_ndim(gi), k->nds[i]);
            ck_assert(memcmp(nb_shape(gi), k->shapes[i], sizeof(int64_t) * (size_t)k->nds[i])
                      == 0);
        }
        nb_scope_end();
    }
    /* one_hot cannot infer its classes without data */
    nb_scope_begin();
    nb_tensor *idx = nb_empty_on(NB_META, (int64_t[]){4}, 1, NB_I64);
    tu_assert_error(nb_one_hot(idx, -1, NB_F32), NB_EINVAL,
                    "one_hot: num_classes must be given for meta tensors");
    /* a meta GPT-sized embedding: instant, no memory */
    nb_tensor *w = nb_empty_on(NB_META, (int64_t[]){50304, 768}, 2, NB_F32);
    nb_tensor *tok = nb_empty_on(NB_META, (int64_t[]){8, 1024}, 2, NB_I64);
    nb_tensor *e = nb_embedding(w, tok);
    ck_assert(e && nb_shape(e)[2] == 768 && nb_shape(e)[0] == 8);
    nb_scope_end();
}
END_TEST

/* Operands on two devices: a clear NB_EDEVICE naming the op, never a crash. x, i1, i2, m
 * are on the default device, whose name the messages give. */
START_TEST(test_index_mixed_devices) {
    nb_scope_begin();
    nb_clear_error();
    char dev[32], sel_msg[64], cat_msg[64];
    nb_device_name(nb_default_device(), dev, sizeof dev);
    snprintf(sel_msg, sizeof sel_msg, "index_select: operands on %s", dev);
    snprintf(cat_msg, sizeof cat_msg, "cat: operands on %s", dev);
    /* a second device with data, other than the default one */
    nb_device other = nb_device_equal(nb_default_device(), GUARD) ? NB_CPU : GUARD;
    nb_tensor *x = data((int64_t[]){5, 4}, 2, NB_F32, 1);
    nb_tensor *mx = nb_empty_on(NB_META, (int64_t[]){5, 4}, 2, NB_F32);
    nb_tensor *i1 = tu_tensor((double[]){1, 2}, (int64_t[]){2}, 1, NB_I64);
    nb_tensor *mi1 = nb_empty_on(NB_META, (int64_t[]){2}, 1, NB_I64);
    nb_tensor *i2 = tu_tensor((double[]){1, 2, 0, 3}, (int64_t[]){2, 2}, 2, NB_I64);
    nb_tensor *mi2 = nb_empty_on(NB_META, (int64_t[]){2, 2}, 2, NB_I64);
    nb_tensor *m = nb_zeros((int64_t[]){4}, 1, NB_BOOL);
    nb_tensor *mm = nb_empty_on(NB_META, (int64_t[]){4}, 1, NB_BOOL);
    tu_assert_error(nb_index_select(x, 0, mi1), NB_EDEVICE, sel_msg);
    tu_assert_error(nb_index_select(mx, 0, i1), NB_EDEVICE, "index_select: operands on meta");
    tu_assert_error(nb_embedding(x, mi1), NB_EDEVICE, "embedding");
    tu_assert_error(nb_embedding(mx, i1), NB_EDEVICE, "embedding");
    tu_assert_error(nb_gather(x, 1, mi2), NB_EDEVICE, "gather");
    tu_assert_error(nb_scatter_add(x, 1, i2, nb_empty_on(NB_META, (int64_t[]){2, 2}, 2, NB_F32)),
                    NB_EDEVICE, "scatter_add");
    tu_assert_error(nb_scatter_add(mx, 1, i2, x), NB_EDEVICE, "scatter_add");
    tu_assert_error(nb_masked_fill(x, mm, 1), NB_EDEVICE, "masked_fill");
    tu_assert_error(nb_masked_fill(mx, m, 1), NB_EDEVICE, "masked_fill");
    tu_assert_error(nb_cat((nb_tensor *[]){x, mx}, 2, 0), NB_EDEVICE, cat_msg);
    tu_assert_error(nb_stack((nb_tensor *[]){mx, x}, 2, 0), NB_EDEVICE, "stack");
    tu_assert_error(nb_cat((nb_tensor *[]){x, nb_to_device(x, other)}, 2, 0), NB_EDEVICE, "cat");
    nb_clear_error();
    nb_scope_end();
}
END_TEST

void nb_tcases_index_devices(Suite *s) {
    const char *names[] = {"guard", "meta", "mixed_devices"};
    const TTest *tests[] = {test_index_guard, test_index_meta, test_index_mixed_devices};
    for (int i = 0; i < 3; i++) {
        TCase *tc = tcase_create(names[i]);
        tcase_add_test(tc, tests[i]);
        suite_add_tcase(s, tc);
    }
}
