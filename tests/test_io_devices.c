/* test_io_devices.c - the io suite's device cases: saving, printing, gradient checks and the
 * size-1 communicator with tensors of devices other than the CPU (guard, meta). Registered
 * by nb_suite_io. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* ---- other devices ---------------------------------------------------------------------------
 * The host-only layers (files, printing, gradcheck, the size-1 communicator) take tensors of
 * any device with data through host copies, and refuse meta tensors with NB_EDEVICE. The
 * guard device faults on any host access to its memory, so passing here proves the copies
 * go through the backend. */
#define GUARD ((nb_device){NB_DEVICE_GUARD, 0})

/* Element-wise equality of two tensors of any devices, through host copies. */
static void assert_same_values(nb_tensor *a, nb_tensor *b) {
    ck_assert_int_eq(nb_tensor_dtype(a), nb_tensor_dtype(b));
    ck_assert_int_eq(nb_numel(a), nb_numel(b));
    nb_tensor *ha = nb_contiguous(nb_to_device(a, NB_CPU));
    nb_tensor *hb = nb_contiguous(nb_to_device(b, NB_CPU));
    ck_assert(ha && hb);
    ck_assert(memcmp(nb_data(ha), nb_data(hb),
                     (size_t)nb_numel(a) * nb_dtype_size(nb_tensor_dtype(a))) == 0);
}

START_TEST(test_save_other_devices) {
    nb_scope_begin();
    char *dir = tu_make_dir();
    char *p = tu_path_in(dir, "g.safetensors"), *q = tu_path_in(dir, "c.safetensors");
    nb_tensor *a = tu_random_cpu((int64_t[]){3, 4}, 2, NB_F32, -2, 2, 1);
    nb_tensor *b = tu_random_cpu((int64_t[]){5}, 1, NB_I64, -100, 100, 2);
    nb_tensor *c = tu_random_cpu((int64_t[]){4, 3}, 2, NB_BF16, -1, 1, 3);
    nb_tensor *ga = nb_to_device(a, GUARD), *gb = nb_to_device(b, GUARD);
    nb_tensor *gc = nb_transpose(nb_to_device(c, GUARD), 0, 1); /* a strided guard view */
    ck_assert(ga && gb && gc);
    const char *names[3] = {"a", "b", "c"};
    nb_tensor *gts[3] = {ga, gb, gc};
    nb_tensor *cts[3] = {a, b, nb_transpose(c, 0, 1)};
    ASSERT_OK(nb_safetensors_save(p, names, gts, 3, NULL, NULL, 0));
    ASSERT_OK(nb_safetensors_save(q, names, cts, 3, NULL, NULL, 0));
    /* The same bytes as the CPU tensors give, and the values round-trip. */
    size_t np = 0, nq = 0;
    unsigned char *bp = tu_read_file(p, &np), *bq = tu_read_file(q, &nq);
    ck_assert_uint_eq(np, nq);
    ck_assert(memcmp(bp, bq, np) == 0);
    free(bp);
    free(bq);
    nb_safetensors *f = nb_safetensors_open(p);
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 3; i++) assert_same_values(nb_safetensors_get(f, names[i]), gts[i]);

    /* Loading into guard tensors (and into meta tensors, which checks shapes only). */
    nb_tensor *da = nb_zeros_on(GUARD, (int64_t[]){3, 4}, 2, NB_F32);
    nb_tensor *db = nb_zeros_on(GUARD, (int64_t[]){5}, 1, NB_F64); /* converted on load */
    nb_tensor *ma = nb_empty_on(NB_META, (int64_t[]){3, 4}, 2, NB_F32);
    ASSERT_OK(nb_state_load(f, NULL, (const char *[]){"a", "b"}, (nb_tensor *[]){da, db}, 2,
                            false));
    assert_same_values(da, a);
    assert_same_values(db, nb_to_dtype(b, NB_F64));
    ASSERT_OK(nb_state_load(f, NULL, (const char *[]){"a"}, &ma, 1, false));
    nb_tensor *mbad = nb_empty_on(NB_META, (int64_t[]){4, 3}, 2, NB_F32);
    ASSERT_ST(nb_state_load(f, NULL, (const char *[]){"a"}, &mbad, 1, false), NB_ESHAPE,
              "[4,3]");
    nb_safetensors_close(f);

    /* A meta tensor holds no data to save: NB_EDEVICE, and no file is left behind. */
    int before = tu_count_files(dir);
    char *r = tu_path_in(dir, "m.safetensors");
    ASSERT_ST(nb_safetensors_save(r, (const char *[]){"a", "m"}, (nb_tensor *[]){a, ma}, 2, NULL,
                                  NULL, 0), NB_EDEVICE, "\"m\" is on the meta device");
    ck_assert_int_eq(tu_count_files(dir), before);
    free(r);
    free(p);
    free(q);
    tu_rm_dir(dir);
    nb_scope_end();
}
END_TEST

START_TEST(test_print_other_devices) {
    nb_scope_begin();
    char buf[256];
    nb_tensor *m = nb_empty_on(NB_META, (int64_t[]){2, 3}, 2, NB_F32);
    ck_assert_int_gt(nb_format(m, buf, sizeof buf), 0);
    ck_assert_str_eq(buf, "tensor(..., size=[2,3], dtype=f32, device=meta)");
    /* The length is reported as for host tensors (room for the terminator is the caller's). */
    ck_assert_int_eq(nb_format(m, NULL, 0), (int)strlen(buf));
    char small[8];
    ck_assert_int_eq(nb_format(m, small, sizeof small), (int)strlen(buf));
    ck_assert_str_eq(small, "tensor(");
    /* A guard tensor prints its values (copied to the host) and its device. */
    nb_tensor *c = nb_to_device(tu_tensor((double[]){1, 2.5, -3, 4}, (int64_t[]){2, 2}, 2, NB_F32),
                                NB_CPU); /* the host print the guard one is compared with */
    char cbuf[256];
    ck_assert_int_gt(nb_format(c, cbuf, sizeof cbuf), 0);
    ck_assert_str_eq(cbuf, "tensor([[1.0000, 2.5000],\n        [-3.0000, 4.0000]], dtype=f32)");
    nb_tensor *g = nb_to_device(c, GUARD);
    ck_assert_int_gt(nb_format(g, buf, sizeof buf), 0);
    char want[300];
    snprintf(want, sizeof want, "%.*s, device=guard)", (int)strlen(cbuf) - 1, cbuf);
    ck_assert_str_eq(buf, want);
    /* nb_print of a meta tensor works too. */
    FILE *fp = tmpfile();
    ck_assert_ptr_nonnull(fp);
    ASSERT_OK(nb_print(m, fp));
    fclose(fp);
    nb_scope_end();
}
END_TEST

static nb_tensor *square_fn(nb_tensor *const *xs, int n, void *ctx) {
    (void)n, (void)ctx;
    return nb_mul(xs[0], xs[0]);
}

START_TEST(test_gradcheck_other_devices) {
    nb_scope_begin();
    nb_tensor *x = tu_random((int64_t[]){2, 3}, 2, NB_F64, -1, 1, 5);
    nb_set_requires_grad(x, true);
    ASSERT_OK(nb_gradcheck(square_fn, &x, 1, NULL, NULL));
    /* Meta inputs have no values to perturb. */
    nb_tensor *m = nb_empty_on(NB_META, (int64_t[]){2, 3}, 2, NB_F64);
    nb_set_requires_grad(m, true);
    ASSERT_ST(nb_gradcheck(square_fn, &m, 1, NULL, NULL), NB_EDEVICE, "input 0 is a meta tensor");
    /* On the guard device the same check passes once every op it uses (mul, sum and their
     * backward) runs there; until then it fails cleanly instead of faulting. */
    nb_tensor *g = nb_to_device(nb_detach(x), GUARD);
    nb_set_requires_grad(g, true);
    nb_status st = nb_gradcheck(square_fn, &g, 1, NULL, NULL);
    bool sum_on_guard = nb_sum(nb_to_device(x, GUARD), NULL, 0, false) != NULL;
    if (sum_on_guard) ASSERT_OK(st);
    else ck_assert_int_eq(st, NB_EDEVICE);
    nb_scope_end();
}
END_TEST

/* The size-1 communicator stages tensors of other devices through host copies. */
START_TEST(test_comm_other_devices) {
    nb_scope_begin();
    nb_comm *c = nb_comm_self();
    ck_assert_ptr_nonnull(c);
    nb_tensor *x = tu_random_cpu((int64_t[]){4, 5}, 2, NB_F32, -1, 1, 7);
    nb_tensor *g = nb_to_device(x, GUARD);
    ASSERT_OK(nb_allreduce(c, g, NB_REDUCE_SUM));
    assert_same_values(g, x);
    ASSERT_OK(nb_broadcast(c, nb_transpose(g, 0, 1), 0));
    assert_same_values(g, x);
    /* allgather from a guard tensor into a guard tensor, and send / recv between them. */
    nb_tensor *out = nb_zeros_on(GUARD, (int64_t[]){4, 5}, 2, NB_F32);
    ASSERT_OK(nb_allgather(c, out, g));
    assert_same_values(out, x);
    nb_tensor *rcv = nb_zeros_on(GUARD, (int64_t[]){5, 4}, 2, NB_F32);
    ASSERT_OK(nb_send(c, nb_transpose(g, 0, 1), 0, 3));
    ASSERT_OK(nb_recv(c, rcv, 0, 3));
    assert_same_values(rcv, nb_contiguous(nb_transpose(x, 0, 1)));
    /* Meta tensors hold nothing to communicate. */
    nb_tensor *m = nb_empty_on(NB_META, (int64_t[]){3}, 1, NB_F32);
    ASSERT_ST(nb_allreduce(c, m, NB_REDUCE_SUM), NB_EDEVICE, "t is a meta tensor");
    ASSERT_ST(nb_send(c, m, 0, 1), NB_EDEVICE, "meta");
    nb_comm_free(c);
    nb_scope_end();
}
END_TEST

TCase *nb_tcase_io_devices(void) {
    TCase *tc = tcase_create("devices");
    tcase_add_test(tc, test_save_other_devices);
    tcase_add_test(tc, test_print_other_devices);
    tcase_add_test(tc, test_gradcheck_other_devices);
    tcase_add_test(tc, test_comm_other_devices);
    return tc;
}
