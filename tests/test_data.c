/* test_data.c - the data suite: IDX read/write (plain and gzip) and a corpus of corrupt
 * files, the in-memory and IDX datasets (and the real Fashion-MNIST files when installed),
 * the loader (coverage, drop_last, determinism, sharding, resume, prefetch, freeing
 * mid-epoch, no allocation per batch, errors from its thread), the image transforms and
 * the byte-level text helpers. Files are written to a fresh temporary directory. The
 * transforms, text and other-device tests are in test_data_transforms.c, the helpers both
 * files use in test_data.h. */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "test_data.h"
#include "testutil.h"

/* ---- IDX ------------------------------------------------------------------------------------ */
START_TEST(test_idx_roundtrip) {
    nb_scope_begin();
    tmp_begin();
    const nb_dtype dts[] = {NB_U8, NB_I32, NB_F32, NB_F64};
    const int64_t shapes[][3] = {{5}, {3, 4}, {2, 3, 4}, {0, 3}};
    const int ndims[] = {1, 2, 3, 2};
    char path[512];
    for (int di = 0; di < 4; di++)
        for (int si = 0; si < 4; si++)
            for (int gz = 0; gz < 2; gz++)
                for (int nc = 0; nc < 2; nc++) {
                    nb_dtype dt = dts[di];
                    double lo = dt == NB_U8 ? 0 : -1000, hi = dt == NB_U8 ? 256 : 1000;
                    nb_tensor *t = tu_random(shapes[si], ndims[si], dt, lo, hi, 11 + si);
                    if (nc) t = tu_noncontig(t);
                    tmp_path(path, gz ? "a.idx.gz" : "a.idx");
                    ck_assert_msg(nb_idx_write(path, t) == NB_OK, "%s", nb_last_error());
                    nb_tensor *r = nb_idx_read(path);
                    ck_assert_msg(r != NULL, "%s", nb_last_error());
                    ck_assert_int_eq(nb_tensor_dtype(r), dt);
                    double *ref = tu_values(t);
                    tu_assert_close(r, ref, shapes[si], ndims[si], 0.0);
                    free(ref);
                }
    /* The bytes on disk are the published big-endian layout: f32 1.0 is 3F 80 00 00. */
    nb_tensor *one = nb_full((int64_t[]){2}, 1, NB_F32, 1.0);
    ck_assert(nb_idx_write(tmp_path(path, "one.idx"), one) == NB_OK);
    size_t n;
    unsigned char *raw = slurp(path, &n);
    const unsigned char want[] = {0, 0, 0x0D, 1, 0, 0, 0, 2, 0x3F, 0x80, 0, 0, 0x3F, 0x80, 0, 0};
    ck_assert_uint_eq(n, sizeof want);
    ck_assert(memcmp(raw, want, n) == 0);
    free(raw);
    /* A .gz name really compresses (the gzip magic 1F 8B). */
    ck_assert(nb_idx_write(tmp_path(path, "one.idx.gz"), one) == NB_OK);
    raw = slurp(path, &n);
    ck_assert(n > 2 && raw[0] == 0x1F && raw[1] == 0x8B);
    free(raw);
    /* Types nabla widens: i8 and i16 (negative values keep their sign) -> I32. */
    unsigned char buf[64];
    size_t h = idx_header(buf, 0x09, (uint32_t[]){3}, 1);
    buf[h] = 0xFF, buf[h + 1] = 0x7F, buf[h + 2] = 0x80;
    write_file(tmp_path(path, "i8.idx"), buf, h + 3, false);
    nb_tensor *r = nb_idx_read(path);
    ck_assert_msg(r && nb_tensor_dtype(r) == NB_I32, "%s", nb_last_error());
    tu_assert_close(r, ((double[]){-1, 127, -128}), ((int64_t[]){3}), 1, 0.0);
    h = idx_header(buf, 0x0B, (uint32_t[]){1, 2}, 2);
    buf[h] = 0xFF, buf[h + 1] = 0xFE, buf[h + 2] = 0x01, buf[h + 3] = 0x02;
    write_file(tmp_path(path, "i16.idx.gz"), buf, h + 4, true);
    r = nb_idx_read(path);
    ck_assert_msg(r && nb_tensor_dtype(r) == NB_I32, "%s", nb_last_error());
    tu_assert_close(r, ((double[]){-2, 258}), ((int64_t[]){1, 2}), 2, 0.0);
    /* Writer errors. */
    tu_assert_error(nb_idx_write(path, nb_zeros((int64_t[]){2}, 1, NB_I64)) == NB_OK ? (void *)1
                                                                                       : NULL,
                    NB_EDTYPE, "i64");
    tu_assert_error(nb_idx_write(path, nb_scalar(1, NB_F32)) == NB_OK ? (void *)1 : NULL,
                    NB_EDIM, "0-dim");
    tu_assert_error(nb_idx_write("/nonexistent_dir/x.idx", one) == NB_OK ? (void *)1 : NULL,
                    NB_EIO, "/nonexistent_dir/x.idx");
    tu_assert_error(nb_idx_write(NULL, one) == NB_OK ? (void *)1 : NULL, NB_ENULL, "path");
    tmp_end();
    nb_scope_end();
}
END_TEST

START_TEST(test_idx_corrupt) {
    nb_scope_begin();
    tmp_begin();
    char path[512];
    unsigned char buf[4096];
    /* Missing file, a directory, NULL. */
    expect_idx_error(tmp_path(path, "missing.idx"), NB_EIO, "cannot open");
    expect_idx_error(g_dir, NB_EIO, "directory");
    tu_assert_error(nb_idx_read(NULL), NB_ENULL, "path");
    for (int gz = 0; gz < 2; gz++) {
        const char *name = gz ? "bad.idx.gz" : "bad.idx";
        tmp_path(path, name);
        /* Empty, and a header cut inside the magic or the dims. */
        write_file(path, buf, 0, gz);
        expect_idx_error(path, NB_EFORMAT, "empty file");
        size_t h = idx_header(buf, 0x08, (uint32_t[]){2, 3, 4}, 3);
        write_file(path, buf, 2, gz);
        expect_idx_error(path, NB_EFORMAT, "truncated header");
        for (size_t cut = 5; cut < h; cut += 3) {
            write_file(path, buf, cut, gz);
            expect_idx_error(path, NB_EFORMAT, "truncated header");
        }
        /* Bad magic: nonzero leading bytes, unknown type, 0 dims or too many dims. */
        unsigned char m[][4] = {{1, 0, 8, 3}, {0, 7, 8, 3}, {0, 0, 0x0A, 1}, {0, 0, 0x07, 1}};
        for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
            memcpy(buf, m[i], 4);
            memset(buf + 4, 0, 8);
            write_file(path, buf, 12, gz);
            expect_idx_error(path, NB_EFORMAT, "bad magic");
        }
        h = idx_header(buf, 0x08, (uint32_t[]){1}, 1);
        buf[3] = 0;
        write_file(path, buf, 16, gz);
        expect_idx_error(path, NB_EFORMAT, "0 dims");
        buf[3] = 9;
        write_file(path, buf, 64, gz);
        expect_idx_error(path, NB_EFORMAT, "9 dims");
        /* Data truncated at several offsets, for u8 and f32 (2, 3, 4). */
        const int codes[] = {0x08, 0x0D};
        const int esz[] = {1, 4};
        for (int c = 0; c < 2; c++) {
            h = idx_header(buf, codes[c], (uint32_t[]){2, 3, 4}, 3);
            size_t data = 24 * (size_t)esz[c];
            for (size_t i = 0; i < data + 200; i++) buf[h + i] = (unsigned char)(i * 7 + 1);
            char want[128];
            snprintf(want, sizeof want, "truncated: expected %zu bytes of data", data);
            const size_t cuts[] = {0, 1, data / 2, data - 1};
            for (int k = 0; k < 4; k++) {
                write_file(path, buf, h + cuts[k], gz);
                expect_idx_error(path, NB_EFORMAT, want);
            }
            /* Exactly right reads; trailing bytes (1 or many) do not. */
            write_file(path, buf, h + data, gz);
            nb_tensor *ok = nb_idx_read(path);
            ck_assert_msg(ok != NULL, "%s", nb_last_error());
            write_file(path, buf, h + data + 1, gz);
            expect_idx_error(path, NB_EFORMAT, "trailing bytes");
            write_file(path, buf, h + data + 200, gz);
            expect_idx_error(path, NB_EFORMAT, "trailing bytes");
        }
        /* A header promising far more than the file holds fails before allocating. */
        h = idx_header(buf, 0x0E, (uint32_t[]){0x1000, 0x1000, 0x1000}, 3);
        write_file(path, buf, h + 100, gz);
        expect_idx_error(path, NB_EFORMAT, "truncated");
        h = idx_header(buf, 0x0E, (uint32_t[]){0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, 3);
        write_file(path, buf, h + 100, gz);
        expect_idx_error(path, NB_EFORMAT, "too large");
        /* A 0 dim makes the data empty, but the strides come from the other dims: a 16-byte
         * file whose other dims multiply past 2^63 fails, not a tensor with garbage
         * strides (issue 18, item 4). */
        h = idx_header(buf, 0x08, (uint32_t[]){0, 0xFFFFFFFF, 0xFFFFFFFF}, 3);
        ck_assert_uint_eq(h, 16);
        write_file(path, buf, h, gz);
        expect_idx_error(path, NB_EFORMAT, "too large");
        h = idx_header(buf, 0x0D, (uint32_t[]){0xFFFF, 0xFFFF, 0xFFFF, 0xFFFF, 0}, 5);
        write_file(path, buf, h, gz);
        expect_idx_error(path, NB_EFORMAT, "too large");
        /* An empty tensor whose strides fit still reads. */
        h = idx_header(buf, 0x08, (uint32_t[]){0, 0xFFFFFFFF, 3}, 3);
        write_file(path, buf, h, gz);
        nb_tensor *empty = nb_idx_read(path);
        ck_assert_msg(empty != NULL, "%s", nb_last_error());
        ck_assert_int_eq(nb_numel(empty), 0);
        ck_assert_int_eq(nb_strides(empty)[0], INT64_C(0xFFFFFFFF) * 3);
    }
    /* Damaged gzip streams: cut short at several points, or a flipped byte. */
    size_t h = idx_header(buf, 0x08, (uint32_t[]){1000}, 1);
    for (size_t i = 0; i < 1000; i++) buf[h + i] = (unsigned char)(i * 31 % 251);
    tmp_path(path, "good.idx.gz");
    write_file(path, buf, h + 1000, true);
    size_t n;
    unsigned char *gzraw = slurp(path, &n);
    char cutp[512];
    tmp_path(cutp, "cut.idx.gz");
    const size_t cuts[] = {n / 3, n / 2, n - 9, n - 4, n - 1};
    for (int k = 0; k < 5; k++) {
        write_file(cutp, gzraw, cuts[k], false);
        expect_idx_error(cutp, NB_EFORMAT, "");
    }
    /* A plain file that starts like gzip is read as gzip, and fails as such. */
    memcpy(buf, (unsigned char[]){0x1F, 0x8B, 8, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3}, 13);
    write_file(cutp, buf, 13, false);
    expect_idx_error(cutp, NB_EFORMAT, "gzip");
    gzraw[n - 6] ^= 0x55; /* inside the CRC: data decodes, the check fails */
    write_file(cutp, gzraw, n, false);
    expect_idx_error(cutp, NB_EFORMAT, "gzip");
    free(gzraw);
    tmp_end();
    nb_scope_end();
}
END_TEST

/* ---- datasets -------------------------------------------------------------------------------- */
START_TEST(test_tensor_dataset) {
    nb_scope_begin();
    nb_tensor *x = tu_random((int64_t[]){10, 2, 3}, 3, NB_F32, -1, 1, 3);
    nb_tensor *y = nb_arange(100, 110, 1, NB_I64);
    const nb_tensor *xs[2] = {x, tu_noncontig(x)};
    for (int v = 0; v < 2; v++) {
        nb_dataset *ds = nb_tensor_dataset_new(nb__mut(xs[v]), y);
        ck_assert_msg(ds != NULL, "%s", nb_last_error());
        ck_assert_int_eq(nb_dataset_len(ds), 10);
        ck_assert_int_eq(ds->x.ndim, 2);
        ck_assert(ds->has_y && ds->y.ndim == 0 && ds->y.dtype == NB_I64);
        nb_tensor *bx = host_empty((int64_t[]){3, 2, 3}, 3, NB_F32);
        nb_tensor *by = host_empty((int64_t[]){3}, 1, NB_I64);
        const int64_t idx[3] = {3, 0, 9};
        ck_assert(nb_dataset_get_batch(ds, idx, 3, bx, by) == NB_OK);
        double *xv = tu_values(x), ref[18];
        for (int k = 0; k < 3; k++) memcpy(ref + 6 * k, xv + 6 * idx[k], 6 * sizeof(double));
        tu_assert_close(bx, ref, ((int64_t[]){3, 2, 3}), 3, 0.0);
        tu_assert_close(by, ((double[]){103, 100, 109}), ((int64_t[]){3}), 1, 0.0);
        free(xv);
        /* Checked calls. */
        tu_assert_error(nb_dataset_get_batch(ds, (int64_t[]){10}, 1, nb_narrow(bx, 0, 0, 1),
                                             nb_narrow(by, 0, 0, 1)) ? NULL : (void *)1,
                        NB_EINDEX, "index 10");
        tu_assert_error(nb_dataset_get_batch(ds, idx, 2, bx, by) ? NULL : (void *)1, NB_ESHAPE,
                        "expected [2,2,3]");
        tu_assert_error(nb_dataset_get_batch(ds, idx, 3, nb_empty((int64_t[]){3, 2, 3}, 3,
                                                                  NB_F64), by) ? NULL : (void *)1,
                        NB_EDTYPE, "f64");
        /* tu_noncontig's layout (stored transposed in the last two dims), on the host */
        nb_tensor *bxt = nb_transpose(host_empty((int64_t[]){3, 3, 2}, 3, NB_F32), 1, 2);
        tu_assert_error(nb_dataset_get_batch(ds, idx, 3, bxt, by) ? NULL : (void *)1,
                        NB_EINVAL, "contiguous");
        nb_dataset_free(ds);
    }
    /* Unlabeled. */
    nb_dataset *ds = nb_tensor_dataset_new(x, NULL);
    ck_assert(ds && !ds->has_y);
    nb_tensor *bx = host_empty((int64_t[]){1, 2, 3}, 3, NB_F32);
    tu_assert_error(nb_dataset_get_batch(ds, (int64_t[]){0}, 1, bx, nb_empty((int64_t[]){1}, 1,
                                         NB_I64)) ? NULL : (void *)1, NB_EINVAL, "no labels");
    ck_assert(nb_dataset_get_batch(ds, (int64_t[]){0}, 1, bx, NULL) == NB_OK);
    nb_dataset_free(ds);
    /* Construction errors. */
    tu_assert_error(nb_tensor_dataset_new(x, nb_arange(0, 9, 1, NB_I64)), NB_ESHAPE, "[10,2,3]");
    tu_assert_error(nb_tensor_dataset_new(NULL, y), NB_ENULL, "x");
    tu_assert_error(nb_tensor_dataset_new(nb_scalar(1, NB_F32), NULL), NB_EDIM, "0-dim");
    ck_assert_int_eq(nb_dataset_len(NULL), -1);
    nb_dataset_free(NULL);
    nb_scope_end();
}
END_TEST

START_TEST(test_idx_dataset) {
    nb_scope_begin();
    tmp_begin();
    char ip[512], lp[512], p[512];
    nb_tensor *img = tu_random((int64_t[]){7, 4, 5}, 3, NB_U8, 0, 256, 5);
    nb_tensor *lab = tu_random((int64_t[]){7}, 1, NB_U8, 0, 10, 6);
    ck_assert(nb_idx_write(tmp_path(ip, "train-images-idx3-ubyte"), img) == NB_OK);
    ck_assert(nb_idx_write(tmp_path(lp, "train-labels-idx1-ubyte"), lab) == NB_OK);
    /* Plain files (no .gz) through nb_fashion_mnist_new's fallback. */
    nb_dataset *ds = nb_fashion_mnist_new(g_dir, true, NULL);
    ck_assert_msg(ds != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_dataset_len(ds), 7);
    ck_assert(ds->x.dtype == NB_F32 && ds->x.ndim == 3 && ds->x.shape[0] == 1 &&
              ds->x.shape[1] == 4 && ds->x.shape[2] == 5 && ds->y.dtype == NB_I64);
    nb_tensor *bx = host_empty((int64_t[]){2, 1, 4, 5}, 4, NB_F32);
    nb_tensor *by = host_empty((int64_t[]){2}, 1, NB_I64);
    ck_assert(nb_dataset_get_batch(ds, (int64_t[]){6, 1}, 2, bx, by) == NB_OK);
    uint8_t iu[7 * 20], lu[7];
    float xf[2 * 20];
    int64_t yl[2];
    ck_assert(nb_read(img, iu, 7 * 20, NB_U8) == NB_OK && nb_read(lab, lu, 7, NB_U8) == NB_OK);
    ck_assert(nb_read(bx, xf, 2 * 20, NB_F32) == NB_OK && nb_read(by, yl, 2, NB_I64) == NB_OK);
    for (int k = 0; k < 2; k++)
        for (int e = 0; e < 20; e++) {
            int s = k == 0 ? 6 : 1;
            ck_assert(xf[k * 20 + e] == (float)iu[s * 20 + e] / 255.0f); /* as ToTensor */
        }
    ck_assert_int_eq(yl[0], lu[6]);
    ck_assert_int_eq(yl[1], lu[1]);
    nb_dataset_free(ds);
    nb_mnist_opts mo2 = nb_mnist_defaults();
    mo2.limit = 3, mo2.raw_u8 = true;
    /* limit and raw_u8. */
    ds = nb_idx_dataset_new(ip, lp, &mo2);
    ck_assert(ds && nb_dataset_len(ds) == 3 && ds->x.dtype == NB_U8);
    nb_tensor *bu = host_empty((int64_t[]){1, 1, 4, 5}, 4, NB_U8);
    ck_assert(nb_dataset_get_batch(ds, (int64_t[]){2}, 1, bu, nb_narrow(by, 0, 0, 1)) == NB_OK);
    uint8_t *bu_v = raw_values(bu);
    ck_assert(memcmp(bu_v, iu + 40, 20) == 0);
    free(bu_v);
    tu_assert_error(nb_dataset_get_batch(ds, (int64_t[]){3}, 1, bu, nb_narrow(by, 0, 0, 1))
                        ? NULL : (void *)1, NB_EINDEX, "out of range");
    nb_dataset_free(ds);
    /* Count mismatch, wrong types, missing files. */
    ck_assert(nb_idx_write(tmp_path(p, "six.idx"), nb_narrow(lab, 0, 0, 6)) == NB_OK);
    tu_assert_error(nb_idx_dataset_new(ip, p, NULL), NB_EFORMAT, "has 7 images but");
    tu_assert_error(nb_idx_dataset_new(lp, lp, NULL), NB_EFORMAT, "expected u8 images");
    ck_assert(nb_idx_write(tmp_path(p, "f.idx"), nb_zeros((int64_t[]){7}, 1, NB_F32)) == NB_OK);
    tu_assert_error(nb_idx_dataset_new(ip, p, NULL), NB_EFORMAT, "expected integer labels");
    tu_assert_error(nb_fashion_mnist_new(g_dir, false, NULL), NB_EIO, "t10k-images-idx3-ubyte");
    nb_mnist_opts mo3 = nb_mnist_defaults();
    mo3.limit = -1;
    tu_assert_error(nb_idx_dataset_new(ip, lp, &mo3), NB_EINVAL, "limit");
    nb_mnist_opts mo4 = nb_mnist_defaults();
    mo4.limit = 0;
    /* options are read as written (issue 17 item 4): limit 0 is no samples, not all of them */
    ds = nb_idx_dataset_new(ip, lp, &mo4);
    ck_assert_msg(ds != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_dataset_len(ds), 0);
    nb_dataset_free(ds);
    nb_mnist_opts mo = nb_mnist_defaults();
    ck_assert(mo.limit == INT64_MAX && !mo.raw_u8);
    ds = nb_idx_dataset_new(ip, lp, &mo);
    ck_assert(ds && nb_dataset_len(ds) == 7);
    nb_dataset_free(ds);
    tu_assert_error(nb_idx_dataset_new(NULL, lp, NULL), NB_ENULL, "images_path");
    ck_assert_str_eq(nb_fashion_mnist_class(9), "Ankle boot");
    ck_assert_str_eq(nb_fashion_mnist_class(10), "?");
    tmp_end();
    nb_scope_end();
}
END_TEST

/* The real Fashion-MNIST files (Debian's dataset-fashion-mnist), read once: the training
 * set as raw u8 (pixel checksum over all 47M pixels), the test set as f32. The reference
 * numbers were computed once with Python's gzip module. */
START_TEST(test_fashion_mnist_real) {
    char p[512];
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte.gz", NB_FASHION_MNIST_DIR);
    if (access(p, R_OK) != 0) {
        printf("data: skipping the real Fashion-MNIST test: %s not found (apt-get install "
               "dataset-fashion-mnist)\n", p);
        return;
    }
    nb_scope_begin();
    nb_mnist_opts mo = nb_mnist_defaults();
    mo.limit = INT64_MAX, mo.raw_u8 = true;
    nb_dataset *tr = nb_fashion_mnist_new(NULL, true, &mo);
    ck_assert_msg(tr != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_dataset_len(tr), 60000);
    nb_loader_opts lo = nb_loader_defaults();
    lo.batch_size = 20000, lo.world_size = 1;
    nb_loader *l = nb_loader_new(tr, &lo);
    ck_assert(l != NULL);
    uint64_t pix = 0, labs = 0;
    int64_t first[10];
    int nb = 0;
    for (nb_batch b; nb_loader_next(l, &b); nb++) {
        ck_assert_int_eq(nb_shape(b.x)[1], 1);
        ck_assert_int_eq(nb_shape(b.x)[2], 28);
        uint8_t *px = raw_values(b.x);
        for (int64_t i = 0; i < nb_numel(b.x); i++) pix += px[i];
        int64_t *y = raw_values(b.y);
        for (int64_t i = 0; i < b.n; i++) labs += (uint64_t)y[i];
        if (nb == 0) memcpy(first, y, sizeof first);
        free(px);
        free(y);
    }
    ck_assert_int_eq(nb, 3);
    ck_assert_uint_eq(pix, 3431114169u);
    ck_assert_uint_eq(labs, 270000u);
    const int64_t want_tr[10] = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5};
    for (int i = 0; i < 10; i++) ck_assert_int_eq(first[i], want_tr[i]);
    nb_loader_free(l);
    nb_dataset_free(tr);

    nb_dataset *te = nb_fashion_mnist_new(NULL, false, NULL);
    ck_assert_msg(te != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_dataset_len(te), 10000);
    nb_tensor *bx = host_empty((int64_t[]){2, 1, 28, 28}, 4, NB_F32);
    nb_tensor *by = host_empty((int64_t[]){2}, 1, NB_I64);
    ck_assert(nb_dataset_get_batch(te, (int64_t[]){0, 9999}, 2, bx, by) == NB_OK);
    float *xf = raw_values(bx);
    double s0 = 0, s1 = 0;
    for (int i = 0; i < 784; i++) s0 += xf[i], s1 += xf[784 + i];
    free(xf);
    ck_assert(fabs(s0 - 33456 / 255.0) < 1e-3 && fabs(s1 - 24390 / 255.0) < 1e-3);
    ck_assert_int_eq(nb_item_i64(nb_select(by, 0, 0)), 9);
    nb_dataset_free(te);
    nb_scope_end();
}
END_TEST

/* ---- loader ---------------------------------------------------------------------------------- */
/* A dataset whose sample i is x = [i, i] (I64) and y = 1000 + i. */
static nb_dataset *index_dataset(int64_t n) {
    nb_scope_begin();
    nb_tensor *a = nb_arange(0, (double)n, 1, NB_I64);
    nb_tensor *x = nb_stack((nb_tensor *[]){a, a}, 2, 1);
    nb_dataset *ds = nb_tensor_dataset_new(x, nb_add_scalar(a, 1000));
    nb_scope_end();
    ck_assert(ds != NULL);
    return ds;
}

/* Run one epoch, appending the indices to out (returns the count), checking that x and y
 * agree with the indices and the batch positions are consecutive. */
static int64_t run_epoch(nb_loader *l, int64_t *out, int64_t *nbatches) {
    int64_t n = 0, k = 0;
    nb_loader_state st;
    nb_loader_get_state(l, &st);
    for (nb_batch b; nb_loader_next(l, &b); k++) {
        ck_assert_int_eq(b.epoch, st.epoch);
        ck_assert_int_eq(b.index, k);
        ck_assert_int_eq(nb_shape(b.x)[0], b.n);
        int64_t *x = raw_values(b.x), *y = raw_values(b.y);
        for (int64_t i = 0; i < b.n; i++) {
            ck_assert_int_eq(x[2 * i], b.indices[i]);
            ck_assert_int_eq(x[2 * i + 1], b.indices[i]);
            ck_assert_int_eq(y[i], 1000 + b.indices[i]);
            out[n++] = b.indices[i];
        }
        free(x);
        free(y);
    }
    ck_assert_int_eq(nb_loader_error(l), NB_OK);
    if (nbatches) *nbatches = k;
    return n;
}

START_TEST(test_loader_epoch) {
    nb_scope_begin();
    nb_dataset *ds = index_dataset(103);
    int64_t got[256], nbat;
    for (int pf = 0; pf < 2; pf++) {
        nb_loader_opts lo = nb_loader_defaults();
        lo.batch_size = 10, lo.shuffle = true, lo.seed = 7, lo.prefetch = pf, lo.world_size = 1;
        nb_loader *l = nb_loader_new(ds, &lo);
        ck_assert_int_eq(nb_loader_num_batches(l), 11);
        ck_assert_int_eq(run_epoch(l, got, &nbat), 103);
        ck_assert_int_eq(nbat, 11);
        int seen[103] = {0};
        for (int i = 0; i < 103; i++) seen[got[i]]++;
        for (int i = 0; i < 103; i++) ck_assert_int_eq(seen[i], 1);
        /* The order is nb_randperm of (seed, stream = epoch). */
        for (int e = 0; e < 2; e++) {
            nb_generator *g = nb_generator_new(7);
            nb_generator_set_stream(g, (uint64_t)e);
            nb_tensor *perm = nb_randperm(103, g);
            nb_generator_free(g);
            if (e == 1) ck_assert_int_eq(run_epoch(l, got, NULL), 103);
            int64_t *pv = raw_values(perm);
            ck_assert(memcmp(pv, got, 103 * sizeof(int64_t)) == 0);
            free(pv);
        }
        nb_loader_state st;
        nb_loader_get_state(l, &st);
        ck_assert(st.epoch == 2 && st.batch == 0);
        nb_loader_free(l);
        nb_loader_opts lo2 = nb_loader_defaults();
        lo2.batch_size = 10, lo2.shuffle = true, lo2.seed = 7, lo2.drop_last = true;
        lo2.prefetch = pf, lo2.world_size = 1;
        /* drop_last: 10 full batches of distinct indices. */
        l = nb_loader_new(ds, &lo2);
        ck_assert_int_eq(nb_loader_num_batches(l), 10);
        ck_assert_int_eq(run_epoch(l, got, &nbat), 100);
        ck_assert_int_eq(nbat, 10);
        int seen2[103] = {0};
        for (int i = 0; i < 100; i++) ck_assert_int_eq(seen2[got[i]]++, 0);
        nb_loader_free(l);
        /* No shuffle: dataset order; batch larger than the dataset. */
        nb_loader_opts big = nb_loader_defaults();
        big.batch_size = 500, big.prefetch = pf;
        l = nb_loader_new(ds, &big);
        ck_assert_int_eq(nb_loader_num_batches(l), 1);
        ck_assert_int_eq(run_epoch(l, got, NULL), 103);
        for (int i = 0; i < 103; i++) ck_assert_int_eq(got[i], i);
        nb_loader_free(l);
        nb_loader_opts lo3 = nb_loader_defaults();
        lo3.batch_size = 500, lo3.drop_last = true, lo3.prefetch = pf, lo3.world_size = 1;
        l = nb_loader_new(ds, &lo3);
        ck_assert_int_eq(nb_loader_num_batches(l), 0);
        ck_assert_int_eq(run_epoch(l, got, NULL), 0);
        ck_assert_int_eq(run_epoch(l, got, NULL), 0);
        nb_loader_free(l);
    }
    /* Default options: batch 1, in order. */
    nb_loader *l = nb_loader_new(ds, NULL);
    ck_assert_int_eq(nb_loader_num_batches(l), 103);
    nb_loader_free(l);
    nb_dataset_free(ds);
    nb_scope_end();
}
END_TEST

START_TEST(test_loader_determinism) {
    nb_scope_begin();
    nb_dataset *ds = index_dataset(64);
    int64_t a[3][64], b[3][64], c[64];
    nb_loader_opts lo = nb_loader_defaults();
    lo.batch_size = 8, lo.shuffle = true, lo.seed = 99, lo.world_size = 1;
    nb_loader *la = nb_loader_new(ds, &lo);
    nb_loader_opts lo2 = nb_loader_defaults();
    lo2.batch_size = 5, lo2.shuffle = true, lo2.seed = 99, lo2.prefetch = 2, lo2.world_size = 1;
    nb_loader *lb = nb_loader_new(ds, &lo2);
    nb_loader_opts lo3 = nb_loader_defaults();
    lo3.batch_size = 8, lo3.shuffle = true, lo3.seed = 100, lo3.world_size = 1;
    nb_loader *lc = nb_loader_new(ds, &lo3);
    for (int e = 0; e < 3; e++) {
        run_epoch(la, a[e], NULL);
        run_epoch(lb, b[e], NULL); /* another batch size and prefetch: the same order */
        ck_assert(memcmp(a[e], b[e], sizeof a[e]) == 0);
    }
    ck_assert(memcmp(a[0], a[1], sizeof a[0]) != 0);
    ck_assert(memcmp(a[1], a[2], sizeof a[0]) != 0);
    run_epoch(lc, c, NULL);
    ck_assert(memcmp(a[0], c, sizeof c) != 0);
    nb_loader_free(la);
    nb_loader_free(lb);
    nb_loader_free(lc);
    nb_dataset_free(ds);
    nb_scope_end();
}
END_TEST

START_TEST(test_loader_shard) {
    nb_scope_begin();
    const int W = 3;
    for (int drop = 0; drop < 2; drop++)
        for (int64_t N = 30; N <= 31; N++) {
            nb_dataset *ds = index_dataset(N);
            int64_t got[3][64], cnt[3];
            for (int r = 0; r < W; r++) {
                nb_loader_opts lo2 = nb_loader_defaults();
                lo2.batch_size = 4, lo2.shuffle = true, lo2.seed = 5, lo2.drop_last = drop;
                lo2.rank = r, lo2.world_size = W, lo2.prefetch = r % 2;
                nb_loader *l = nb_loader_new(ds, &lo2);
                ck_assert_msg(l != NULL, "%s", nb_last_error());
                cnt[r] = run_epoch(l, got[r], NULL);
                ck_assert_int_eq(cnt[r], nb_loader_num_samples(l));
                nb_loader_free(l);
            }
            /* Equal sizes; 30 splits evenly, 31 pads to 33 or drops to 30. */
            int64_t per = N == 30 ? 10 : drop ? 10 : 11;
            for (int r = 0; r < W; r++) ck_assert_int_eq(cnt[r], drop ? per - per % 4 : per);
            /* Rank r holds perm[r], perm[r + 3], ... (DistributedSampler), wrapping. */
            nb_generator *g = nb_generator_new(5);
            nb_tensor *perm = nb_randperm(N, g);
            nb_generator_free(g);
            int64_t *pp = raw_values(perm);
            for (int r = 0; r < W; r++)
                for (int64_t q = 0; q < cnt[r]; q++)
                    ck_assert_int_eq(got[r][q], pp[(r + q * W) % N]);
            free(pp);
            if (!drop) {
                int seen[31] = {0};
                for (int r = 0; r < W; r++)
                    for (int64_t q = 0; q < cnt[r]; q++) seen[got[r][q]]++;
                for (int64_t i = 0; i < N; i++) ck_assert(seen[i] >= 1); /* covers the epoch */
                if (N == 30)
                    for (int64_t i = 0; i < N; i++) ck_assert_int_eq(seen[i], 1); /* disjoint */
            }
            nb_dataset_free(ds);
        }
    /* Bad shard options. */
    nb_dataset *ds = index_dataset(4);
    nb_loader_opts lo3 = nb_loader_defaults();
    lo3.rank = 3, lo3.world_size = 3, lo3.batch_size = 1;
    tu_assert_error(nb_loader_new(ds, &lo3), NB_EINVAL, "rank 3");
    nb_loader_opts lo4 = nb_loader_defaults();
    lo4.rank = 1, lo4.world_size = 1, lo4.batch_size = 1;
    tu_assert_error(nb_loader_new(ds, &lo4), NB_EINVAL, "rank 1");
    nb_loader_opts lo5 = nb_loader_defaults();
    lo5.batch_size = -2, lo5.world_size = 1;
    tu_assert_error(nb_loader_new(ds, &lo5), NB_EINVAL, "batch_size");
    nb_loader_opts lo6 = nb_loader_defaults();
    lo6.prefetch = 1000, lo6.world_size = 1, lo6.batch_size = 1;
    tu_assert_error(nb_loader_new(ds, &lo6), NB_EINVAL, "prefetch");
    /* options are read as written (issue 17 item 4): batch_size or world_size 0 is an error,
     * not 1; the constructor gives 1 and 1 */
    nb_loader_opts lo0 = nb_loader_defaults();
    lo0.batch_size = 0;
    tu_assert_error(nb_loader_new(ds, &lo0), NB_EINVAL, "batch_size must be > 0 (got 0)");
    nb_loader_opts lo7 = nb_loader_defaults();
    lo7.batch_size = 4, lo7.world_size = 0;
    tu_assert_error(nb_loader_new(ds, &lo7), NB_EINVAL, "world_size 0 must be >= 1");
    nb_loader_opts lo = nb_loader_defaults();
    ck_assert(lo.batch_size == 1 && lo.world_size == 1 && lo.rank == 0 && lo.prefetch == 0 &&
              !lo.shuffle && !lo.drop_last && !lo.transform);
    nb_loader *l1 = nb_loader_new(ds, &lo), *l2 = nb_loader_new(ds, NULL);
    ck_assert(l1 && l2 && nb_loader_num_batches(l1) == nb_loader_num_batches(l2));
    nb_loader_free(l1);
    nb_loader_free(l2);
    tu_assert_error(nb_loader_new(NULL, NULL), NB_ENULL, "dataset");
    nb_dataset_free(ds);
    nb_scope_end();
}
END_TEST

/* Compare the next k batches of two loaders (indices and data). */
static void same_batches(nb_loader *a, nb_loader *b, int k) {
    for (int i = 0; i < k; i++) {
        nb_batch ba, bb;
        bool na = nb_loader_next(a, &ba), nb = nb_loader_next(b, &bb);
        ck_assert_int_eq(na, nb);
        if (!na) continue;
        ck_assert(ba.epoch == bb.epoch && ba.index == bb.index && ba.n == bb.n);
        ck_assert(memcmp(ba.indices, bb.indices, sizeof(int64_t) * (size_t)ba.n) == 0);
        ck_assert_int_eq(nb_numel(ba.x), nb_numel(bb.x));
        ck_assert(same_raw(ba.x, bb.x));
        ck_assert(same_raw(ba.y, bb.y));
    }
}

START_TEST(test_loader_state) {
    nb_scope_begin();
    nb_dataset *ds = index_dataset(23);
    for (int pf = 0; pf < 3; pf++) {
        nb_loader_opts o = nb_loader_defaults();
        o.batch_size = 4, o.shuffle = true, o.seed = 11, o.prefetch = pf, o.world_size = 1;
        nb_loader *a = nb_loader_new(ds, &o);
        nb_batch b;
        /* 1.5 epochs in: epoch 0 (6 batches + end), then 3 batches of epoch 1. */
        for (int i = 0; i < 7 + 3; i++) nb_loader_next(a, &b);
        nb_loader_state st;
        ck_assert(nb_loader_get_state(a, &st) == NB_OK);
        ck_assert(st.epoch == 1 && st.batch == 3);
        o.prefetch = 2 - pf; /* resume with another prefetch setting */
        nb_loader *c = nb_loader_new(ds, &o);
        ck_assert(nb_loader_set_state(c, &st) == NB_OK);
        same_batches(a, c, 12); /* across the end of epoch 1 into epoch 2 */
        /* Rewind a loader mid-epoch to an earlier point and compare with a fresh one. */
        nb_loader *f = nb_loader_new(ds, &o);
        ck_assert(nb_loader_set_state(a, &(nb_loader_state){0, 0}) == NB_OK);
        same_batches(a, f, 9);
        /* batch == num_batches: the next call ends that epoch. */
        ck_assert(nb_loader_set_state(a, &(nb_loader_state){4, 6}) == NB_OK);
        ck_assert(!nb_loader_next(a, &b) && nb_loader_error(a) == NB_OK);
        ck_assert(nb_loader_next(a, &b) && b.epoch == 5 && b.index == 0);
        tu_assert_error(nb_loader_set_state(a, &(nb_loader_state){0, 7}) ? NULL : (void *)1,
                        NB_EINVAL, "batch 7");
        tu_assert_error(nb_loader_set_state(a, &(nb_loader_state){-1, 0}) ? NULL : (void *)1,
                        NB_EINVAL, "epoch -1");
        nb_loader_free(a);
        nb_loader_free(c);
        nb_loader_free(f);
    }
    nb_dataset_free(ds);
    nb_scope_end();
}
END_TEST

/* Image-like dataset: (n, 2, 6, 5) f32 with distinct values, labels i. */
static nb_dataset *image_dataset(int64_t n) {
    nb_scope_begin();
    nb_tensor *x = nb_view(nb_arange(1, 1 + (double)n * 60, 1, NB_F32),
                           (int64_t[]){n, 2, 6, 5}, 4);
    nb_dataset *ds = nb_tensor_dataset_new(x, nb_arange(0, (double)n, 1, NB_I64));
    nb_scope_end();
    ck_assert(ds != NULL);
    return ds;
}

START_TEST(test_loader_prefetch) {
    nb_scope_begin();
    nb_dataset *ds = image_dataset(50);
    nb_image_aug aug = {.crop_padding = 2, .hflip_p = 0.5, .channels = 2, .mean = {10, 20},
                        .std = {2, 4}};
    nb_loader_opts o = nb_loader_defaults();
    o.batch_size = 7, o.shuffle = true, o.seed = 3, o.transform = nb_image_aug_transform;
    o.transform_ctx = &aug, o.world_size = 1;
    nb_loader *sync = nb_loader_new(ds, &o);
    o.prefetch = 1;
    nb_loader *p1 = nb_loader_new(ds, &o);
    o.prefetch = 4;
    nb_loader *p4 = nb_loader_new(ds, &o);
    /* Three epochs each (8 batches + the end), compared batch by batch. */
    for (int i = 0; i < 27; i++) {
        nb_batch a, b, c;
        bool ra = nb_loader_next(sync, &a), rb = nb_loader_next(p1, &b),
             rc = nb_loader_next(p4, &c);
        ck_assert(ra == rb && rb == rc);
        ck_assert_int_eq(ra, (i % 9) != 8);
        if (!ra) continue;
        ck_assert(same_raw(a.x, b.x));
        ck_assert(same_raw(a.x, c.x));
        ck_assert(memcmp(a.indices, c.indices, sizeof(int64_t) * (size_t)a.n) == 0);
    }
    nb_loader_free(sync);
    nb_loader_free(p1);
    nb_loader_free(p4);
    /* Freeing mid-epoch while the thread is filling or waiting; and before any batch. */
    for (int k = 0; k < 4; k++) {
        o.prefetch = 1 + k;
        nb_loader *l = nb_loader_new(ds, &o);
        nb_batch b;
        for (int i = 0; i < k; i++) ck_assert(nb_loader_next(l, &b));
        nb_loader_free(l);
    }
    /* The caller's scope is untouched by batches made on the thread. */
    int depth = nb_scope_depth();
    o.prefetch = 2;
    nb_loader *l = nb_loader_new(ds, &o);
    nb_batch b;
    while (nb_loader_next(l, &b)) ck_assert_int_eq(nb_scope_depth(), depth);
    nb_loader_free(l);
    nb_loader_free(NULL);
    nb_dataset_free(ds);
    nb_scope_end();
}
END_TEST

/* opts.device: the same batches, delivered on the device (here guard memory, which the host
 * cannot read: the copy is the loader's), synchronously and prefetched, with the tail
 * batch; the augmentation still runs on the host batch. */
START_TEST(test_loader_device) {
    nb_scope_begin();
    nb_dataset *ds = image_dataset(50);
    nb_image_aug aug = {.crop_padding = 2, .hflip_p = 0.5, .channels = 2, .mean = {10, 20},
                        .std = {2, 4}};
    nb_loader_opts o = nb_loader_defaults();
    o.batch_size = 7, o.shuffle = true, o.seed = 3, o.transform = nb_image_aug_transform;
    o.transform_ctx = &aug, o.world_size = 1;
    nb_loader *ref = nb_loader_new(ds, &o);
    o.device = GUARD;
    nb_loader *d0 = nb_loader_new(ds, &o);
    o.prefetch = 3;
    nb_loader *d3 = nb_loader_new(ds, &o);
    ck_assert_msg(ref && d0 && d3, "%s", nb_last_error());
    int depth = nb_scope_depth();
    for (int i = 0; i < 18; i++) { /* two epochs: 7 full batches, a tail of 1, the end */
        nb_batch a, b, c;
        bool ra = nb_loader_next(ref, &a), rb = nb_loader_next(d0, &b),
             rc = nb_loader_next(d3, &c);
        ck_assert_msg(ra == rb && rb == rc, "%s", nb_last_error());
        ck_assert_int_eq(nb_scope_depth(), depth);
        if (!ra) continue;
        ck_assert(nb_device_equal(nb_tensor_device(b.x), GUARD));
        ck_assert(nb_device_equal(nb_tensor_device(c.y), GUARD));
        ck_assert_int_eq(nb_shape(c.x)[0], a.n);
        ck_assert(same_raw(a.x, nb_to_device(b.x, NB_CPU)));
        ck_assert(same_raw(a.x, nb_to_device(c.x, NB_CPU)));
        ck_assert(same_raw(a.y, nb_to_device(c.y, NB_CPU)));
        ck_assert_int_eq(nb_record_stream(c.x), NB_OK); /* no streams here: a no-op */
    }
    nb_loader_free(ref);
    nb_loader_free(d0);
    nb_loader_free(d3);
    o.device = (nb_device){(nb_device_type)99, 0};
    tu_assert_error(nb_loader_new(ds, &o), NB_EDEVICE, "loader_new");
    nb_dataset_free(ds);
    nb_scope_end();
}
END_TEST

START_TEST(test_loader_no_alloc) {
    nb_scope_begin();
    nb_dataset *ds = image_dataset(64);
    nb_image_aug aug = {.crop_padding = 1, .hflip_p = 0.5, .channels = 1, .mean = {1},
                        .std = {3}};
    for (int pf = 0; pf < 3; pf += 2) {
        nb_loader_opts lo = nb_loader_defaults();
        lo.batch_size = 10, lo.shuffle = true, lo.seed = 1, lo.prefetch = pf;
        lo.transform = nb_image_aug_transform, lo.transform_ctx = &aug, lo.world_size = 1;
        nb_loader *l = nb_loader_new(ds, &lo);
        nb_batch b;
        while (nb_loader_next(l, &b)) {} /* warm-up epoch */
        nb_alloc_stats s0, s1;
        nb_alloc_get_stats(&s0);
        for (int e = 0; e < 3; e++)
            while (nb_loader_next(l, &b)) {}
        nb_alloc_get_stats(&s1);
        ck_assert_int_eq(s1.system_allocs, s0.system_allocs);
        ck_assert_int_eq(s1.allocs, s0.allocs); /* not even a cached block per batch */
        nb_loader_free(l);
    }
    nb_dataset_free(ds);
    nb_scope_end();
}
END_TEST

/* A dataset that fails at one index and makes (and leaks into its scope) a temporary. */
typedef struct {
    nb_dataset base;
    int64_t n, bad;
    bool silent; /* fail without setting an error message */
} flaky_ds;

static int64_t flaky_len(nb_dataset *d) { return ((flaky_ds *)d)->n; }
static nb_status flaky_get(nb_dataset *d, const int64_t *idx, int64_t n, nb_tensor *x,
                           nb_tensor *y) {
    (void)y;
    nb_tensor *tmp = nb_zeros((int64_t[]){1000}, 1, NB_F32); /* freed by the loader's scope */
    (void)tmp;
    for (int64_t i = 0; i < n; i++) {
        if (idx[i] == ((flaky_ds *)d)->bad && ((flaky_ds *)d)->silent) return NB_EIO;
        if (idx[i] == ((flaky_ds *)d)->bad)
            return nb__error(NB_EIO, "flaky: sample %lld is on a disk that is gone",
                             (long long)idx[i]);
        ((float *)nb_data(x))[i] = (float)idx[i];
    }
    return NB_OK;
}
static void flaky_free(nb_dataset *d) { free(d); }
static const nb_dataset_vtable flaky_vt = {"flaky", flaky_len, flaky_get, flaky_free};

static nb_status failing_transform(nb_batch *b, void *ctx) {
    return b->index == *(int *)ctx ? nb__error(NB_EINVAL, "transform: batch %lld is cursed",
                                               (long long)b->index)
                                   : NB_OK;
}

START_TEST(test_loader_errors) {
    nb_scope_begin();
    for (int pf = 0; pf < 3; pf++) {
        flaky_ds *fd = calloc(1, sizeof *fd);
        fd->base = (nb_dataset){.vt = &flaky_vt, .x = {.dtype = NB_F32, .ndim = 0}};
        fd->n = 20;
        fd->bad = 13;
        nb_loader_opts lo = nb_loader_defaults();
        lo.batch_size = 4, lo.prefetch = pf, lo.world_size = 1;
        nb_loader *l = nb_loader_new(&fd->base, &lo);
        nb_batch b;
        int ok = 0;
        while (nb_loader_next(l, &b)) {
            ck_assert_ptr_null(b.y);
            ok++;
        }
        ck_assert_int_eq(ok, 3); /* batches 0..2; batch 3 holds index 13 */
        ck_assert_int_eq(nb_loader_error(l), NB_EIO);
        ck_assert_int_eq(nb_last_status(), NB_EIO);
        ck_assert(strstr(nb_last_error(), "sample 13 is on a disk") != NULL);
        nb_clear_error();
        ck_assert(!nb_loader_next(l, &b)); /* sticky */
        ck_assert(strstr(nb_last_error(), "sample 13") != NULL);
        ck_assert(nb_loader_set_state(l, &(nb_loader_state){0, 4}) == NB_OK);
        ck_assert_int_eq(nb_loader_error(l), NB_OK);
        ck_assert(nb_loader_next(l, &b) && b.index == 4);
        nb_loader_free(l);
        /* A failing transform. */
        int cursed = 1;
        nb_loader_opts lo2 = nb_loader_defaults();
        lo2.batch_size = 4, lo2.prefetch = pf, lo2.transform = failing_transform;
        lo2.transform_ctx = &cursed, lo2.world_size = 1;
        l = nb_loader_new(&fd->base, &lo2);
        ck_assert(nb_loader_next(l, &b));
        ck_assert(!nb_loader_next(l, &b));
        ck_assert_int_eq(nb_loader_error(l), NB_EINVAL);
        ck_assert(strstr(nb_last_error(), "batch 1 is cursed") != NULL);
        nb_loader_free(l);
        /* A dataset failing without a message still gets a useful one. */
        fd->silent = true;
        nb_loader_opts lo3 = nb_loader_defaults();
        lo3.batch_size = 4, lo3.prefetch = pf, lo3.world_size = 1;
        l = nb_loader_new(&fd->base, &lo3);
        nb_clear_error();
        while (nb_loader_next(l, &b)) {}
        ck_assert_int_eq(nb_loader_error(l), NB_EIO);
        ck_assert_msg(strstr(nb_last_error(), "get_batch of the flaky dataset failed") != NULL,
                      "%s", nb_last_error());
        nb_loader_free(l);
        nb_dataset_free(&fd->base);
    }
    ck_assert(!nb_loader_next(NULL, &(nb_batch){0}));
    ck_assert_int_eq(nb_last_status(), NB_ENULL);
    ck_assert_int_eq(nb_loader_num_batches(NULL), -1);
    nb_scope_end();
}
END_TEST

Suite *nb_suite_data(void) {
    Suite *s = suite_create("data");
    TCase *tc = tcase_create("data");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_idx_roundtrip);
    tcase_add_test(tc, test_idx_corrupt);
    tcase_add_test(tc, test_tensor_dataset);
    tcase_add_test(tc, test_idx_dataset);
    tcase_add_test(tc, test_fashion_mnist_real);
    tcase_add_test(tc, test_loader_epoch);
    tcase_add_test(tc, test_loader_determinism);
    tcase_add_test(tc, test_loader_shard);
    tcase_add_test(tc, test_loader_state);
    tcase_add_test(tc, test_loader_prefetch);
    tcase_add_test(tc, test_loader_device);
    tcase_add_test(tc, test_loader_no_alloc);
    tcase_add_test(tc, test_loader_errors);
    nb_tests_data_transforms(tc); /* test_data_transforms.c */
    suite_add_tcase(s, tc);
    return s;
}
