/* test_core.c - tensor objects: creation, metadata, views, copies/conversion, printing,
 * and the elementwise iterator (against plain double-precision references). */
#include <string.h>

#include "testutil.h"
#include "cpu/cpu_impl.h"

static const nb_dtype all_dtypes[] = {NB_F32, NB_F64, NB_F16, NB_BF16,
                                      NB_I32, NB_I64, NB_U8,  NB_BOOL};
#define NDT (int)(sizeof all_dtypes / sizeof all_dtypes[0])

START_TEST(test_creation) {
    nb_scope_begin();
    for (int k = 0; k < NDT; k++) {
        nb_dtype dt = all_dtypes[k];
        int64_t sh[3] = {2, 3, 4};
        nb_tensor *z = nb_zeros(sh, 3, dt), *o = nb_ones(sh, 3, dt), *f = nb_full(sh, 3, dt, 3);
        ck_assert(z && o && f);
        ck_assert_int_eq(nb_numel(z), 24);
        ck_assert_int_eq(nb_ndim(z), 3);
        ck_assert(nb_is_contiguous(z));
        ck_assert_int_eq(nb_strides(z)[0], 12);
        ck_assert_int_eq(nb_tensor_dtype(f), dt);
        double rz[24], ro[24], rf[24];
        for (int i = 0; i < 24; i++) rz[i] = 0, ro[i] = 1, rf[i] = dt == NB_BOOL ? 1 : 3;
        tu_assert_close(z, rz, sh, 3, 0);
        tu_assert_close(o, ro, sh, 3, 0);
        tu_assert_close(f, rf, sh, 3, 0);
        /* the address only, never dereferenced: nb__ptr works for memory of any device */
        ck_assert(((uintptr_t)nb__ptr(z) & 63) == 0);
    }
    /* 0-dim and empty */
    nb_tensor *s = nb_scalar(2.5, NB_F32);
    ck_assert_int_eq(nb_ndim(s), 0);
    ck_assert_int_eq(nb_numel(s), 1);
    ck_assert(nb_item_f64(s) == 2.5);
    nb_tensor *e = nb_zeros((int64_t[]){3, 0}, 2, NB_F32);
    ck_assert_int_eq(nb_numel(e), 0);
    ck_assert(nb_is_contiguous(e));
    nb_scope_end();
}
END_TEST

START_TEST(test_arange_linspace) {
    nb_scope_begin();
    nb_tensor *a = nb_arange(0, 5, 1, NB_I64);
    tu_assert_close(a, ((double[]){0, 1, 2, 3, 4}), ((int64_t[]){5}), 1, 0);
    nb_tensor *b = nb_arange(1, 2, 0.25, NB_F32);
    tu_assert_close(b, ((double[]){1, 1.25, 1.5, 1.75}), ((int64_t[]){4}), 1, 0);
    nb_tensor *c = nb_arange(5, 0, -2, NB_F64);
    tu_assert_close(c, ((double[]){5, 3, 1}), ((int64_t[]){3}), 1, 0);
    nb_tensor *l = nb_linspace(0, 1, 5, NB_F64);
    tu_assert_close(l, ((double[]){0, .25, .5, .75, 1}), ((int64_t[]){5}), 1, 1e-15);
    nb_tensor *l1 = nb_linspace(3, 9, 1, NB_F32);
    tu_assert_close(l1, ((double[]){3}), ((int64_t[]){1}), 1, 0);
    tu_assert_error(nb_arange(0, 5, 0, NB_F32), NB_EINVAL, "arange");
    tu_assert_error(nb_arange(0, 5, -1, NB_F32), NB_EINVAL, "arange");
    tu_assert_error(nb_linspace(0, 1, -1, NB_F32), NB_EINVAL, "linspace");
    nb_scope_end();
}
END_TEST

static int release_calls;
static void count_release(void *data, void *ctx) {
    (void)data;
    release_calls += *(int *)ctx;
}

START_TEST(test_buffers) {
    float src[6] = {1, 2, 3, 4, 5, 6};
    nb_scope_begin();
    nb_tensor *t = nb_from_buffer(src, (int64_t[]){2, 3}, 2, NB_F32);
    src[0] = 100; /* a copy: unaffected */
    tu_assert_close(t, ((double[]){1, 2, 3, 4, 5, 6}), ((int64_t[]){2, 3}), 2, 0);
    int one = 1;
    release_calls = 0;
    nb_tensor *w = nb_wrap_buffer(src, (int64_t[]){3, 2}, 2, NB_F32, count_release, &one);
    nb_tensor *v = nb_transpose(w, 0, 1); /* keeps the storage alive */
    ck_assert(nb_data(w) == src);
    ck_assert(nb_fill_(nb_select(v, 0, 1), -1) == NB_OK); /* writes through to src */
    ck_assert(src[1] == -1 && src[3] == -1 && src[5] == -1 && src[0] == 100);
    nb_scope_end();
    ck_assert_int_eq(release_calls, 1);
}
END_TEST

START_TEST(test_views) {
    nb_scope_begin();
    double v24[24];
    for (int i = 0; i < 24; i++) v24[i] = i;
    nb_tensor *t = tu_tensor(v24, (int64_t[]){2, 3, 4}, 3, NB_F32);

    nb_tensor *r = nb_view(t, (int64_t[]){4, -1}, 2);
    ck_assert(nb_shares_storage(r, t));
    tu_assert_close(r, v24, ((int64_t[]){4, 6}), 2, 0);

    /* permute (2,0,1): out[i][j][k] = t[j][k][i] */
    nb_tensor *p = nb_permute(t, (int[]){2, 0, 1}, 3);
    double ref[24];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 3; k++) ref[(i * 2 + j) * 3 + k] = v24[(j * 3 + k) * 4 + i];
    tu_assert_close(p, ref, ((int64_t[]){4, 2, 3}), 3, 0);
    ck_assert(!nb_is_contiguous(p));
    tu_assert_error(nb_view(p, (int64_t[]){24}, 1), NB_ESHAPE, "nb_reshape");
    nb_tensor *pr = nb_reshape(p, (int64_t[]){24}, 1);
    tu_assert_close(pr, ref, ((int64_t[]){24}), 1, 0);
    ck_assert(!nb_shares_storage(pr, p));
    /* a permuted view can still be viewed when its dims stay contiguous chunks */
    nb_tensor *tt = nb_transpose(nb_view(t, (int64_t[]){6, 4}, 2), 0, 1); /* (4,6) */
    nb_tensor *tv = nb_view(tt, (int64_t[]){4, 2, 3}, 3);
    ck_assert(tv != NULL && nb_shares_storage(tv, t));

    /* narrow, slice, select */
    nb_tensor *n = nb_narrow(t, 2, 1, 2); /* (2,3,2): t[:, :, 1:3] */
    double rn[12];
    for (int i = 0; i < 6; i++) rn[2 * i] = v24[4 * i + 1], rn[2 * i + 1] = v24[4 * i + 2];
    tu_assert_close(n, rn, ((int64_t[]){2, 3, 2}), 3, 0);
    nb_tensor *s = nb_slice(t, -1, -3, 100, 2); /* t[..., 1::2] */
    double rs[12];
    for (int i = 0; i < 6; i++) rs[2 * i] = v24[4 * i + 1], rs[2 * i + 1] = v24[4 * i + 3];
    tu_assert_close(s, rs, ((int64_t[]){2, 3, 2}), 3, 0);
    nb_tensor *se = nb_select(t, 1, -1); /* t[:, 2, :] */
    double rse[8] = {8, 9, 10, 11, 20, 21, 22, 23};
    tu_assert_close(se, rse, ((int64_t[]){2, 4}), 2, 0);
    nb_tensor *empty = nb_slice(t, 0, 5, 9, 1);
    ck_assert_int_eq(nb_numel(empty), 0);

    /* expand, squeeze, unsqueeze, flatten */
    nb_tensor *row = tu_tensor((double[]){1, 2, 3}, (int64_t[]){1, 3}, 2, NB_I32);
    nb_tensor *ex = nb_expand(row, (int64_t[]){2, 4, -1}, 3);
    ck_assert_int_eq(nb_strides(ex)[0], 0);
    ck_assert_int_eq(nb_strides(ex)[1], 0);
    double rex[24];
    for (int i = 0; i < 8; i++) rex[3 * i] = 1, rex[3 * i + 1] = 2, rex[3 * i + 2] = 3;
    tu_assert_close(ex, rex, ((int64_t[]){2, 4, 3}), 3, 0);
    nb_tensor *u = nb_unsqueeze(t, -1);
    ck_assert_int_eq(nb_ndim(u), 4);
    ck_assert_int_eq(nb_shape(u)[3], 1);
    ck_assert(nb_is_contiguous(u));
    nb_tensor *sq = nb_squeeze(u, 3);
    tu_assert_close(sq, v24, ((int64_t[]){2, 3, 4}), 3, 0);
    nb_tensor *sqa = nb_squeeze_all(nb_view(t, (int64_t[]){1, 2, 1, 12, 1}, 5));
    tu_assert_close(sqa, v24, ((int64_t[]){2, 12}), 2, 0);
    nb_tensor *fl = nb_flatten(t, 1, -1);
    tu_assert_close(fl, v24, ((int64_t[]){2, 12}), 2, 0);
    ck_assert(nb_shares_storage(fl, t));
    nb_tensor *flp = nb_flatten(p, 0, 1); /* non-viewable: copies */
    tu_assert_close(flp, ref, ((int64_t[]){8, 3}), 2, 0);

    /* contiguous and detach */
    nb_tensor *c = nb_contiguous(p);
    ck_assert(nb_is_contiguous(c) && !nb_shares_storage(c, p));
    tu_assert_close(c, ref, ((int64_t[]){4, 2, 3}), 3, 0);
    nb_tensor *c2 = nb_contiguous(t);
    ck_assert(c2 == t);
    nb_tensor *d = nb_detach(t);
    ck_assert(d != t && nb_shares_storage(d, t));

    /* view errors */
    tu_assert_error(nb_view(t, (int64_t[]){5, -1}, 2), NB_ESHAPE, "24 elements");
    tu_assert_error(nb_view(t, (int64_t[]){-1, -1}, 2), NB_EINVAL, "only one");
    tu_assert_error(nb_permute(t, (int[]){0, 0, 1}, 3), NB_EINVAL, "twice");
    tu_assert_error(nb_transpose(t, 0, 3), NB_EDIM, "dim 3");
    tu_assert_error(nb_narrow(t, 0, 1, 2), NB_EINDEX, "outside");
    tu_assert_error(nb_select(t, 0, 2), NB_EINDEX, "out of range");
    tu_assert_error(nb_squeeze(t, 0), NB_ESHAPE, "not 1");
    tu_assert_error(nb_expand(t, (int64_t[]){2, 5, 4}, 3), NB_ESHAPE, "cannot expand");
    tu_assert_error(nb_slice(t, 0, 0, 1, 0), NB_EINVAL, "step");
    nb_scope_end();
}
END_TEST

START_TEST(test_copy_convert) {
    nb_scope_begin();
    const double vals[8] = {-2.75, -1, -0.5, 0, 0.5, 1.25, 3, 250.9};
    for (int a = 0; a < NDT; a++) {
        for (int b = 0; b < NDT; b++) {
            nb_tensor *x = tu_tensor(vals, (int64_t[]){2, 4}, 2, all_dtypes[a]);
            double xin[8];
            ck_assert(nb_read(x, xin, 8, NB_F64) == NB_OK);
            nb_tensor *y = nb_to_dtype(nb_transpose(x, 0, 1), all_dtypes[b]);
            double ref[8];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 2; j++) {
                    double v = xin[j * 4 + i];
                    unsigned char tmp[8];
                    nb__store_f64(tmp, all_dtypes[b], v);
                    ref[i * 2 + j] = nb__load_f64(tmp, all_dtypes[b]);
                }
            tu_assert_close(y, ref, ((int64_t[]){4, 2}), 2, 0);
        }
    }
    /* exact int64 round trip beyond 2^53 */
    int64_t big[2] = {(1LL << 62) + 1, -((1LL << 60) + 3)};
    nb_tensor *bi = nb_from_buffer(big, (int64_t[]){2}, 1, NB_I64);
    int64_t back[2];
    ck_assert(nb_read(nb_clone(bi), back, 2, NB_I64) == NB_OK);
    ck_assert(back[0] == big[0] && back[1] == big[1]);

    /* copy_ with broadcasting into a strided view, and overlapping self copy */
    nb_tensor *m = nb_zeros((int64_t[]){3, 4}, 2, NB_F32);
    nb_tensor *col = tu_tensor((double[]){1, 2, 3}, (int64_t[]){3, 1}, 2, NB_F64);
    ck_assert(nb_copy_(nb_narrow(m, 1, 1, 2), col) == NB_OK);
    tu_assert_close(m, ((double[]){0, 1, 1, 0, 0, 2, 2, 0, 0, 3, 3, 0}), ((int64_t[]){3, 4}),
                    2, 0);
    nb_tensor *ar = nb_arange(0, 6, 1, NB_F32);
    ck_assert(nb_copy_(nb_narrow(ar, 0, 1, 5), nb_narrow(ar, 0, 0, 5)) == NB_OK);
    tu_assert_close(ar, ((double[]){0, 0, 1, 2, 3, 4}), ((int64_t[]){6}), 1, 0);
    ck_assert(nb_copy_(m, nb_zeros((int64_t[]){4, 3}, 2, NB_F32)) == NB_ESHAPE);
    nb_clear_error();

    /* item / get */
    ck_assert(nb_item_i64(nb_full((int64_t[]){1, 1}, 2, NB_I64, 7)) == 7);
    ck_assert(isnan(nb_item_f64(m)));
    ck_assert_int_eq(nb_last_status(), NB_ESHAPE);
    nb_clear_error();
    ck_assert(nb_get_f64(m, (int64_t[]){2, 1}) == 3);
    ck_assert(isnan(nb_get_f64(m, (int64_t[]){3, 0})));
    ck_assert_int_eq(nb_last_status(), NB_EINDEX);
    nb_clear_error();
    nb_scope_end();
}
END_TEST

START_TEST(test_large_parallel_copy) {
    /* Big enough for the threaded path; strided source and broadcast. */
    nb_scope_begin();
    nb_set_num_threads(2);
    int64_t r = 300, c = 700;
    nb_tensor *a = nb_arange(0, (double)(r * c), 1, NB_F64);
    nb_tensor *m = nb_view(a, (int64_t[]){r, c}, 2);
    nb_tensor *t = nb_to_dtype(nb_transpose(m, 0, 1), NB_F32); /* (c, r) */
    double *v = tu_values(t);
    for (int64_t i = 0; i < c; i++)
        for (int64_t j = 0; j < r; j++)
            ck_assert_msg(v[i * r + j] == (double)(j * c + i), "at %lld,%lld", (long long)i,
                          (long long)j);
    free(v);
    nb_tensor *h = nb_to_dtype(nb_to_dtype(m, NB_BF16), NB_F32);
    double *hv = tu_values(h);
    for (int64_t i = 0; i < r * c; i += 997)
        ck_assert(hv[i] == nb_bf16_to_f32(nb_f32_to_bf16((float)i)));
    free(hv);
    nb_scope_end();
}
END_TEST

/* got equals want, the CPU form "tensor(..., dtype=xx)", with the default device named
 * before the closing parenthesis when it is not the CPU (", device=guard"). */
static void assert_printed(const char *got, const char *want) {
    char dev[48] = "", exp[600];
    nb_device d = nb_default_device();
    if (d.type != NB_DEVICE_CPU) {
        char name[32];
        snprintf(dev, sizeof dev, ", device=%s", nb_device_name(d, name, sizeof name));
    }
    snprintf(exp, sizeof exp, "%.*s%s)", (int)strlen(want) - 1, want, dev);
    ck_assert_str_eq(got, exp);
}

START_TEST(test_print) {
    nb_scope_begin();
    char buf[512];
    nb_tensor *t = tu_tensor((double[]){1, 2.5, -3, 4}, (int64_t[]){2, 2}, 2, NB_F32);
    nb_format(t, buf, sizeof buf);
    assert_printed(buf, "tensor([[1.0000, 2.5000],\n        [-3.0000, 4.0000]], dtype=f32)");
    nb_format(nb_arange(0, 3, 1, NB_I64), buf, sizeof buf);
    assert_printed(buf, "tensor([0, 1, 2], dtype=i64)");
    nb_format(nb_arange(0, 3, 1, NB_F64), buf, sizeof buf);
    assert_printed(buf, "tensor([0., 1., 2.], dtype=f64)");
    nb_format(nb_scalar(1, NB_BOOL), buf, sizeof buf);
    assert_printed(buf, "tensor(True, dtype=bool)");
    nb_format(nb_zeros((int64_t[]){0, 2}, 2, NB_F32), buf, sizeof buf);
    assert_printed(buf, "tensor([], size=[0,2], dtype=f32)");
    int need = nb_format(nb_arange(0, 5000, 1, NB_I32), buf, 16);
    ck_assert_int_eq((int)strlen(buf), 15); /* truncated, NUL-terminated */
    ck_assert_int_gt(need, 15);
    nb_format(nb_arange(0, 5000, 1, NB_I32), buf, sizeof buf);
    assert_printed(buf, "tensor([0, 1, 2, ..., 4997, 4998, 4999], dtype=i32)");
    nb_scope_end();
}
END_TEST

START_TEST(test_iter_coalesce) {
    nb_scope_begin();
    nb_tensor *a = nb_zeros((int64_t[]){4, 5, 6}, 3, NB_F32);
    nb_tensor *b = nb_zeros((int64_t[]){6}, 1, NB_F32);
    nb__iter it;
    nb_tensor *ts[2] = {a, a};
    nb__iter_init(&it, nb_shape(a), 3, ts, 2);
    ck_assert_int_eq(it.ndim, 1);
    ck_assert(nb__iter_is_flat(&it));
    nb_tensor *ts2[2] = {a, b};
    nb__iter_init(&it, nb_shape(a), 3, ts2, 2);
    ck_assert_int_eq(it.ndim, 2); /* (20, 6) with b broadcast over rows */
    ck_assert_int_eq(it.shape[0], 20);
    ck_assert_int_eq(it.strides[1][0], 0);
    nb_scope_end();
}
END_TEST

Suite *nb_suite_core(void) {
    Suite *s = suite_create("core");
    TCase *tc = tcase_create("tensor");
    tcase_add_test(tc, test_creation);
    tcase_add_test(tc, test_arange_linspace);
    tcase_add_test(tc, test_buffers);
    tcase_add_test(tc, test_views);
    tcase_add_test(tc, test_copy_convert);
    tcase_add_test(tc, test_large_parallel_copy);
    tcase_add_test(tc, test_print);
    tcase_add_test(tc, test_iter_coalesce);
    suite_add_tcase(s, tc);
    return s;
}
