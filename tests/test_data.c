/* test_data.c - the data suite: IDX read/write (plain and gzip) and a corpus of corrupt
 * files, the in-memory and IDX datasets (and the real Fashion-MNIST files when installed),
 * the loader (coverage, drop_last, determinism, sharding, resume, prefetch, freeing
 * mid-epoch, no allocation per batch, errors from its thread), the image transforms and
 * the byte-level text helpers. Files are written to a fresh temporary directory. */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "testutil.h"

/* ---- temporary files ---------------------------------------------------------------------- */
static char g_dir[256];

static void tmp_begin(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/nb_test_data_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static void tmp_end(void) { nftw(g_dir, rm_one, 8, FTW_DEPTH | FTW_PHYS); }

static const char *tmp_path(char *buf, const char *name) {
    snprintf(buf, 512, "%s/%s", g_dir, name);
    return buf;
}

/* Write n bytes to path, gzip-compressed when gz. */
static void write_file(const char *path, const void *data, size_t n, bool gz) {
    if (gz) {
        gzFile f = gzopen(path, "wb");
        ck_assert_ptr_nonnull(f);
        if (n) ck_assert_int_eq(gzwrite(f, data, (unsigned)n), (int)n);
        ck_assert_int_eq(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        ck_assert_ptr_nonnull(f);
        if (n) ck_assert_uint_eq(fwrite(data, 1, n, f), n);
        fclose(f);
    }
}

/* The whole (raw, not decompressed) content of a file; caller frees. */
static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)len + 1);
    ck_assert_uint_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return buf;
}

/* An IDX header for a type code and dims into h; returns its length. */
static size_t idx_header(unsigned char *h, int code, const uint32_t *dims, int ndim) {
    h[0] = 0, h[1] = 0, h[2] = (unsigned char)code, h[3] = (unsigned char)ndim;
    for (int d = 0; d < ndim; d++) {
        h[4 + 4 * d] = (unsigned char)(dims[d] >> 24);
        h[5 + 4 * d] = (unsigned char)(dims[d] >> 16);
        h[6 + 4 * d] = (unsigned char)(dims[d] >> 8);
        h[7 + 4 * d] = (unsigned char)dims[d];
    }
    return 4 + 4 * (size_t)ndim;
}

/* Expect nb_idx_read(path) to fail with status st and a message naming the file and
 * containing needle. */
static void expect_idx_error(const char *path, nb_status st, const char *needle) {
    nb_clear_error();
    nb_tensor *t = nb_idx_read(path);
    ck_assert_msg(t == NULL, "idx_read(%s) should fail (%s)", path, needle);
    ck_assert_msg(nb_last_status() == st, "idx_read(%s): status %s, expected %s: %s", path,
                  nb_status_name(nb_last_status()), nb_status_name(st), nb_last_error());
    ck_assert_msg(strstr(nb_last_error(), needle) != NULL, "message '%s' lacks '%s'",
                  nb_last_error(), needle);
    ck_assert_msg(strstr(nb_last_error(), path) != NULL, "message '%s' lacks the path",
                  nb_last_error());
}

/* ---- host batches and reads ------------------------------------------------------------------
 * Batches and the tensors of the host-only helpers (transforms, get_batch's x and y) are CPU
 * tensors by design, whatever the default device; results are read through nb_read, which
 * works for tensors of any device. */
static nb_tensor *host_empty(const int64_t *shape, int ndim, nb_dtype dt) {
    nb_tensor *t = nb_empty_on(NB_CPU, shape, ndim, dt);
    ck_assert_msg(t != NULL, "%s", nb_last_error());
    return t;
}

/* t (any device) on the CPU: t itself when it is there already. */
static nb_tensor *on_host(nb_tensor *t) {
    nb_tensor *h = nb_to_device(t, NB_CPU);
    ck_assert_msg(h != NULL, "%s", nb_last_error());
    return h;
}

/* The elements of t in its own dtype (its bytes, row-major) into a malloc'd buffer. */
static void *raw_values(const nb_tensor *t) {
    size_t n = (size_t)nb_numel(t) * nb_dtype_size(nb_tensor_dtype(t));
    void *buf = malloc(n ? n : 1);
    ck_assert(nb_read(t, buf, nb_numel(t), nb_tensor_dtype(t)) == NB_OK);
    return buf;
}

#define GUARD ((nb_device){NB_DEVICE_GUARD, 0})

/* a and b hold the same bytes (their dtype is the same: batches of one dataset). */
static bool same_raw(const nb_tensor *a, const nb_tensor *b) {
    if (nb_numel(a) != nb_numel(b)) return false;
    size_t n = (size_t)nb_numel(a) * nb_dtype_size(nb_tensor_dtype(a));
    void *va = raw_values(a), *vb = raw_values(b);
    bool same = memcmp(va, vb, n) == 0;
    free(va);
    free(vb);
    return same;
}

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

/* ---- transforms ------------------------------------------------------------------------------- */
static nb_batch make_batch(nb_tensor *x, const int64_t *ids, int64_t epoch, uint64_t seed) {
    return (nb_batch){.x = x, .indices = ids, .n = nb_shape(x)[0], .epoch = epoch,
                      .seed = seed};
}

/* (N, C, H, W) with values distinct and nonzero within every plane (exact in u8, bf16); a
 * host batch, as the loader's are (transforms run on the host). */
enum { TN = 40, TC = 3, TH = 5, TW = 7, TP = TH * TW };
static nb_tensor *plane_tensor(nb_dtype dt, double *v) {
    for (int k = 0; k < TN; k++)
        for (int c = 0; c < TC; c++)
            for (int e = 0; e < TP; e++)
                v[(k * TC + c) * TP + e] = (double)((k * 11 + c * 37 + e) % 250 + 1);
    return on_host(tu_tensor(v, (int64_t[]){TN, TC, TH, TW}, 4, dt));
}

/* Does plane q equal plane p shifted by (sy, sx) with zeros outside? */
static bool is_shift(const double *p, const double *q, int sy, int sx) {
    for (int i = 0; i < TH; i++)
        for (int j = 0; j < TW; j++) {
            int si = i + sy, sj = j + sx;
            double want = si >= 0 && si < TH && sj >= 0 && sj < TW ? p[si * TW + sj] : 0;
            if (q[i * TW + j] != want) return false;
        }
    return true;
}

START_TEST(test_transforms) {
    nb_scope_begin();
    const nb_dtype dts[] = {NB_F32, NB_F64, NB_U8, NB_BF16};
    const int64_t shape[4] = {TN, TC, TH, TW};
    static double v[TN * TC * TP], ref[TN * TC * TP];
    int64_t ids[TN], rev[TN];
    for (int i = 0; i < TN; i++) ids[i] = 100 + i, rev[i] = 100 + TN - 1 - i;
    for (int di = 0; di < 4; di++) {
        nb_dtype dt = dts[di];
        /* Flip with p = 1 reverses every row; twice is the identity; p = 0 does nothing. */
        nb_tensor *x = plane_tensor(dt, v);
        nb_batch b = make_batch(x, ids, 0, 1);
        ck_assert(nb_random_hflip(&b, 1.0) == NB_OK);
        for (int r = 0; r < TN * TC * TH; r++)
            for (int j = 0; j < TW; j++) ref[r * TW + j] = v[r * TW + TW - 1 - j];
        tu_assert_close(x, ref, shape, 4, 0.0);
        ck_assert(nb_random_hflip(&b, 1.0) == NB_OK);
        tu_assert_close(x, v, shape, 4, 0.0);
        ck_assert(nb_random_hflip(&b, 0.0) == NB_OK);
        tu_assert_close(x, v, shape, 4, 0.0);
        /* p = 0.5: some samples flip, chosen by (seed, epoch, index) alone. */
        ck_assert(nb_random_hflip(&b, 0.5) == NB_OK);
        double *out = tu_values(x);
        int flipped = 0;
        bool fl[TN];
        for (int k = 0; k < TN; k++) {
            fl[k] = out[k * TC * TP] != v[k * TC * TP];
            flipped += fl[k];
        }
        ck_assert(flipped > 5 && flipped < 35);
        nb_tensor *xr = plane_tensor(dt, v); /* the same samples in reverse batch order */
        nb_tensor *xrr = nb_contiguous(nb_index_select(xr, 0, on_host(nb_arange(TN - 1, -1, -1,
                                                                                NB_I64))));
        nb_batch br = make_batch(xrr, rev, 0, 1);
        ck_assert(nb_random_hflip(&br, 0.5) == NB_OK);
        double *outr = tu_values(xrr);
        for (int k = 0; k < TN; k++)
            ck_assert(memcmp(outr + (TN - 1 - k) * TC * TP, out + k * TC * TP,
                             sizeof(double) * TC * TP) == 0);
        free(outr);
        nb_tensor *xe = plane_tensor(dt, v);
        nb_batch be = make_batch(xe, ids, 1, 1); /* another epoch: another pattern */
        ck_assert(nb_random_hflip(&be, 0.5) == NB_OK);
        double *oute = tu_values(xe);
        int diff = 0;
        for (int k = 0; k < TN; k++) diff += (oute[k * TC * TP] != v[k * TC * TP]) != fl[k];
        ck_assert(diff > 0);
        free(oute);
        free(out);

        /* Crop: padding 0 is the identity; padding 2 shifts each sample (all channels
         * alike) by some (sy, sx) in [-2, 2]^2 with zeros coming in. */
        x = plane_tensor(dt, v);
        b = make_batch(x, ids, 3, 9);
        ck_assert(nb_random_crop(&b, 0) == NB_OK);
        tu_assert_close(x, v, shape, 4, 0.0);
        ck_assert(nb_random_crop(&b, 2) == NB_OK);
        out = tu_values(x);
        int used[5][5] = {{0}};
        for (int k = 0; k < TN; k++) {
            int matches = 0;
            for (int sy = -2; sy <= 2; sy++)
                for (int sx = -2; sx <= 2; sx++) {
                    bool all = true;
                    for (int c = 0; c < TC; c++)
                        all = all && is_shift(v + (k * TC + c) * TP, out + (k * TC + c) * TP,
                                              sy, sx);
                    if (all) matches++, used[sy + 2][sx + 2]++;
                }
            ck_assert_msg(matches == 1, "sample %d matches %d shifts", k, matches);
        }
        int kinds = 0;
        for (int i = 0; i < 25; i++) kinds += used[i / 5][i % 5] > 0;
        ck_assert(kinds >= 8);
        free(out);
        /* Padding larger than the image: still some shift, possibly all zeros. */
        x = plane_tensor(dt, v);
        b = make_batch(x, ids, 0, 2);
        ck_assert(nb_random_crop(&b, 9) == NB_OK);
        /* (N, H, W) batches work too. */
        nb_tensor *x3 = nb_view(plane_tensor(dt, v), (int64_t[]){TN * TC, TH, TW}, 3);
        int64_t ids3[TN * TC];
        for (int i = 0; i < TN * TC; i++) ids3[i] = i;
        nb_batch b3 = make_batch(x3, ids3, 0, 2);
        ck_assert(nb_random_hflip(&b3, 1.0) == NB_OK && nb_random_crop(&b3, 1) == NB_OK);
    }
    /* Normalize per channel, and with one value for all channels. */
    const nb_dtype fdts[] = {NB_F32, NB_F64, NB_BF16};
    for (int di = 0; di < 3; di++) {
        for (int one = 0; one < 2; one++) {
            nb_tensor *x = plane_tensor(fdts[di], v);
            const double mean[3] = {1, 2, 3}, std[3] = {2, 4, 8};
            ck_assert(nb_normalize_(x, mean, std, one ? 1 : 3) == NB_OK);
            for (int i = 0; i < TN * TC * TP; i++) {
                int c = one ? 0 : (i / TP) % TC;
                ref[i] = (v[i] - mean[c]) / std[c];
            }
            tu_assert_close(x, ref, shape, 4, tu_tol(fdts[di]));
        }
    }
    nb_tensor *x = plane_tensor(NB_F32, v);
    const double m3[3] = {0, 0, 0}, s3[3] = {1, 0, 1};
    tu_assert_error(nb_normalize_(x, m3, s3, 2) ? NULL : (void *)1, NB_ESHAPE, "3 channels");
    tu_assert_error(nb_normalize_(x, m3, s3, 3) ? NULL : (void *)1, NB_EINVAL, "std[1]");
    tu_assert_error(nb_normalize_(plane_tensor(NB_U8, v), m3, m3, 1) ? NULL : (void *)1,
                    NB_EDTYPE, "u8");
    tu_assert_error(nb_normalize_(nb_transpose(x, 2, 3), m3, s3, 1) ? NULL : (void *)1,
                    NB_EINVAL, "contiguous");
    tu_assert_error(nb_normalize_(nb_zeros_on(NB_CPU, (int64_t[]){3}, 1, NB_F32), m3, s3, 1)
                        ? NULL : (void *)1, NB_EDIM, "[3]");
    tu_assert_error(nb_normalize_(NULL, m3, s3, 1) ? NULL : (void *)1, NB_ENULL, "x");
    /* Batch errors. */
    nb_batch b = make_batch(x, ids, 0, 0);
    tu_assert_error(nb_random_hflip(&b, 1.5) ? NULL : (void *)1, NB_EINVAL, "1.5");
    tu_assert_error(nb_random_crop(&b, -1) ? NULL : (void *)1, NB_EINVAL, "padding");
    b.n = 3;
    tu_assert_error(nb_random_crop(&b, 1) ? NULL : (void *)1, NB_EINVAL, "indices");
    nb_batch b2 = make_batch(nb_zeros_on(NB_CPU, (int64_t[]){4, 4}, 2, NB_F32), ids, 0, 0);
    tu_assert_error(nb_random_hflip(&b2, 0.5) ? NULL : (void *)1, NB_EDIM, "[4,4]");
    tu_assert_error(nb_random_hflip(NULL, 0.5) ? NULL : (void *)1, NB_ENULL, "batch");
    nb_image_aug bad = {.channels = 9};
    b = make_batch(x, ids, 0, 0);
    tu_assert_error(nb_image_aug_transform(&b, &bad) ? NULL : (void *)1, NB_EINVAL, "channels");
    nb_scope_end();
}
END_TEST

/* ---- text -------------------------------------------------------------------------------------- */
START_TEST(test_text) {
    nb_scope_begin();
    tmp_begin();
    char text[1000], p[512], pz[512];
    const char *src = "The quick brown fox jumps over the lazy dog. ";
    for (int i = 0; i < 1000; i++) text[i] = src[i % strlen(src)];
    write_file(tmp_path(p, "t.txt"), text, 1000, false);
    write_file(tmp_path(pz, "t.txt.gz"), text, 1000, true);
    nb_tensor *tok = nb_read_bytes(p);
    nb_tensor *tokz = nb_read_bytes(pz);
    ck_assert_msg(tok && tokz, "%s", nb_last_error());
    ck_assert(nb_tensor_dtype(tok) == NB_U8 && nb_numel(tok) == 1000 && nb_numel(tokz) == 1000);
    char *tv = raw_values(tok), *tzv = raw_values(tokz);
    ck_assert(memcmp(tv, text, 1000) == 0 && memcmp(tzv, text, 1000) == 0);
    free(tv);
    free(tzv);
    write_file(tmp_path(pz, "empty"), text, 0, false);
    nb_tensor *e = nb_read_bytes(pz);
    ck_assert(e && nb_numel(e) == 0);
    tu_assert_error(nb_read_bytes(tmp_path(pz, "missing")), NB_EIO, "missing");
    tu_assert_error(nb_read_bytes(NULL), NB_ENULL, "path");

    /* 90/10 split by position. */
    nb_tensor *tr, *va;
    ck_assert(nb_text_split(tok, 0.9, &tr, &va) == NB_OK);
    ck_assert(nb_numel(tr) == 900 && nb_numel(va) == 100);
    char *vv = raw_values(va);
    ck_assert(memcmp(vv, text + 900, 100) == 0);
    free(vv);
    tu_assert_error(nb_text_split(tok, 1.0, &tr, &va) ? NULL : (void *)1, NB_EINVAL, "(0, 1)");
    tu_assert_error(nb_text_split(nb_zeros((int64_t[]){2, 2}, 2, NB_U8), 0.5, &tr, &va)
                        ? NULL : (void *)1, NB_EDIM, "1-D");
    ck_assert(nb_text_split(tok, 0.9, &tr, &va) == NB_OK);

    /* Windows dataset: sample i is (tokens[i:i+8], tokens[i+1:i+9]). */
    nb_dataset *ds = nb_text_dataset_new(tr, 8);
    ck_assert_msg(ds != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_dataset_len(ds), 892);
    nb_loader_opts lo = nb_loader_defaults();
    lo.batch_size = 64, lo.shuffle = true, lo.seed = 1, lo.prefetch = 1, lo.world_size = 1;
    nb_loader *l = nb_loader_new(ds, &lo);
    int64_t seen = 0;
    for (nb_batch b; nb_loader_next(l, &b); ) {
        ck_assert(nb_ndim(b.x) == 2 && nb_shape(b.x)[1] == 8 && nb_tensor_dtype(b.y) == NB_I64);
        int64_t *x = raw_values(b.x), *y = raw_values(b.y);
        for (int64_t k = 0; k < b.n; k++)
            for (int t = 0; t < 8; t++) {
                ck_assert_int_eq(x[k * 8 + t], (unsigned char)text[b.indices[k] + t]);
                ck_assert_int_eq(y[k * 8 + t], (unsigned char)text[b.indices[k] + t + 1]);
            }
        free(x);
        free(y);
        seen += b.n;
    }
    ck_assert_int_eq(seen, 892);
    nb_loader_free(l);
    nb_dataset_free(ds);
    tu_assert_error(nb_text_dataset_new(va, 100), NB_EINVAL, "block size 100");
    tu_assert_error(nb_text_dataset_new(nb_zeros((int64_t[]){50}, 1, NB_F32), 8), NB_EDTYPE,
                    "f32");
    tu_assert_error(nb_text_dataset_new(NULL, 8), NB_ENULL, "tokens");

    /* Random windows from a generator, drawn as nb_randint would (into default-device x and
     * y). */
    for (int i32 = 0; i32 < 2; i32++) {
        nb_dtype dt = i32 ? NB_I32 : NB_I64;
        nb_generator *g1 = nb_generator_new(42), *g2 = nb_generator_new(42);
        nb_generator_set_offset(g1, 5);
        nb_generator_set_offset(g2, 5);
        nb_tensor *x = nb_empty((int64_t[]){6, 16}, 2, dt);
        nb_tensor *y = nb_empty((int64_t[]){6, 16}, 2, dt);
        for (int rep = 0; rep < 2; rep++) {
            ck_assert(nb_text_sample(tr, g1, x, y) == NB_OK);
            nb_tensor *starts = nb_randint((int64_t[]){6}, 1, NB_I64, 0, 900 - 16, g2);
            ck_assert_uint_eq(nb_generator_offset(g1), nb_generator_offset(g2));
            double *xv = tu_values(x), *yv = tu_values(y);
            int64_t *s = raw_values(starts);
            for (int b = 0; b < 6; b++)
                for (int t = 0; t < 16; t++) {
                    ck_assert(xv[b * 16 + t] == (unsigned char)text[s[b] + t]);
                    ck_assert(yv[b * 16 + t] == (unsigned char)text[s[b] + t + 1]);
                }
            free(s);
            free(xv);
            free(yv);
        }
        nb_generator_free(g1);
        nb_generator_free(g2);
    }
    nb_tensor *x = nb_empty((int64_t[]){2, 8}, 2, NB_I64);
    tu_assert_error(nb_text_sample(tr, NULL, x, nb_empty((int64_t[]){2, 9}, 2, NB_I64))
                        ? NULL : (void *)1, NB_ESHAPE, "(B, T)");
    tu_assert_error(nb_text_sample(tr, NULL, x, nb_empty((int64_t[]){2, 8}, 2, NB_I32))
                        ? NULL : (void *)1, NB_EDTYPE, "i64");
    tu_assert_error(nb_text_sample(nb_narrow(tr, 0, 0, 8), NULL, x, x) ? NULL : (void *)1,
                    NB_EINVAL, "more than 8 tokens");
    ck_assert(nb_text_sample(tr, NULL, x, nb_empty_like(x)) == NB_OK); /* default generator */
    tmp_end();
    nb_scope_end();
}
END_TEST

/* ---- other devices ------------------------------------------------------------------------
 * Data lives on the host: tensors of another device are copied to the host where that is
 * cheap (a dataset's samples, an IDX file's elements, text_sample's x and y); batch
 * transforms need host batches. Meta tensors have no data: NB_EDEVICE. The guard device
 * faults on any host access to its memory, so passing proves the copies go through the
 * backend. */

static bool same_host_values(nb_tensor *a, nb_tensor *b) {
    nb_tensor *ha = nb_contiguous(nb_to_device(a, NB_CPU));
    nb_tensor *hb = nb_contiguous(nb_to_device(b, NB_CPU));
    return ha && hb && nb_tensor_dtype(ha) == nb_tensor_dtype(hb) &&
           nb_numel(ha) == nb_numel(hb) &&
           memcmp(nb_data(ha), nb_data(hb),
                  (size_t)nb_numel(ha) * nb_dtype_size(nb_tensor_dtype(ha))) == 0;
}

START_TEST(test_data_other_devices) {
    nb_scope_begin();
    tmp_begin();
    char p[512], q[512];
    /* the CPU side of the comparisons is on the CPU whatever the default device */
    nb_tensor *x = on_host(tu_random((int64_t[]){10, 2, 3}, 3, NB_F32, -1, 1, 11));
    nb_tensor *y = on_host(tu_random((int64_t[]){10}, 1, NB_I64, 0, 9, 12));
    nb_tensor *gx = nb_to_device(x, GUARD), *gy = nb_to_device(y, GUARD);
    nb_tensor *mx = nb_empty_on(NB_META, (int64_t[]){10, 2, 3}, 3, NB_F32);

    /* IDX: a guard tensor (also a strided view of one) writes the CPU tensor's file. */
    ck_assert_msg(nb_idx_write(tmp_path(p, "c.idx"), x) == NB_OK, "%s", nb_last_error());
    ck_assert_msg(nb_idx_write(tmp_path(q, "g.idx"), gx) == NB_OK, "%s", nb_last_error());
    size_t np = 0, nq = 0;
    unsigned char *bp = slurp(p, &np), *bq = slurp(q, &nq);
    ck_assert(np == nq && memcmp(bp, bq, np) == 0);
    free(bp);
    free(bq);
    nb_tensor *xt = nb_transpose(x, 1, 2), *gxt = nb_transpose(gx, 1, 2);
    ck_assert(nb_idx_write(tmp_path(p, "ct.idx"), xt) == NB_OK);
    ck_assert(nb_idx_write(tmp_path(q, "gt.idx.gz"), gxt) == NB_OK);
    ck_assert(same_host_values(nb_idx_read(p), nb_idx_read(q)));
    tu_assert_error(nb_idx_write(tmp_path(p, "m.idx"), mx) == NB_OK ? (void *)1 : NULL,
                    NB_EDEVICE, "meta");
    ck_assert_int_eq(access(p, F_OK), -1); /* refused before creating the file */

    /* A dataset of guard tensors holds host copies: its batches are the CPU dataset's. */
    nb_dataset *dc = nb_tensor_dataset_new(x, y), *dg = nb_tensor_dataset_new(gx, gy);
    ck_assert_msg(dc && dg, "%s", nb_last_error());
    const int64_t idx[4] = {7, 0, 3, 3};
    const int64_t bsh[3] = {4, 2, 3};
    nb_tensor *bx1 = host_empty(bsh, 3, NB_F32), *by1 = host_empty(bsh, 1, NB_I64);
    nb_tensor *bx2 = host_empty(bsh, 3, NB_F32), *by2 = host_empty(bsh, 1, NB_I64);
    ck_assert(nb_dataset_get_batch(dc, idx, 4, bx1, by1) == NB_OK);
    ck_assert(nb_dataset_get_batch(dg, idx, 4, bx2, by2) == NB_OK);
    ck_assert(same_host_values(bx1, bx2) && same_host_values(by1, by2));
    /* Batches are written on the host: a guard batch tensor is refused, clearly. */
    nb_tensor *gb = nb_empty_on(GUARD, (int64_t[]){4, 2, 3}, 3, NB_F32);
    tu_assert_error(nb_dataset_get_batch(dc, idx, 4, gb, by1) == NB_OK ? (void *)1 : NULL,
                    NB_EDEVICE, "got a guard tensor");
    nb_dataset_free(dc);
    nb_dataset_free(dg);
    tu_assert_error(nb_tensor_dataset_new(mx, NULL), NB_EDEVICE, "meta");
    tu_assert_error(nb_tensor_dataset_new(x, nb_empty_on(NB_META, &(int64_t){10}, 1, NB_I64)),
                    NB_EDEVICE, "y cannot be copied to the host");

    /* Transforms run on host batches: a meta (or guard) batch is refused with NB_EDEVICE. */
    tu_assert_error(nb_normalize_(mx, (double[]){0.5}, (double[]){0.2}, 1) == NB_OK ? (void *)1
                                                                                  : NULL,
                    NB_EDEVICE, "normalize: needs a tensor in host memory, got a meta tensor");
    tu_assert_error(nb_normalize_(gx, (double[]){0.5}, (double[]){0.2}, 1) == NB_OK ? (void *)1
                                                                                  : NULL,
                    NB_EDEVICE, "guard");

    /* Text: a dataset over guard tokens; text_sample into guard (and meta) x and y draws
     * the same windows as into CPU ones and advances the generator the same. */
    char text[300];
    for (int i = 0; i < 300; i++) text[i] = (char)('a' + (i * 7) % 26);
    nb_tensor *tok = on_host(nb_from_buffer(text, &(int64_t){300}, 1, NB_U8));
    nb_tensor *gtok = nb_to_device(tok, GUARD);
    nb_dataset *tg = nb_text_dataset_new(gtok, 8);
    ck_assert_msg(tg != NULL, "%s", nb_last_error());
    ck_assert_int_eq(nb_dataset_len(tg), 292);
    const int64_t wsh[2] = {4, 8};
    nb_tensor *wx = host_empty(wsh, 2, NB_I64), *wy = host_empty(wsh, 2, NB_I64);
    ck_assert(nb_dataset_get_batch(tg, idx, 4, wx, wy) == NB_OK);
    int64_t *wxd = raw_values(wx);
    for (int k = 0; k < 4; k++)
        for (int t = 0; t < 8; t++)
            ck_assert_int_eq(wxd[k * 8 + t], (unsigned char)text[idx[k] + t]);
    free(wxd);
    nb_dataset_free(tg);
    tu_assert_error(nb_text_dataset_new(nb_empty_on(NB_META, &(int64_t){300}, 1, NB_U8), 8),
                    NB_EDEVICE, "meta");
    for (int i32 = 0; i32 < 2; i32++) {
        nb_dtype dt = i32 ? NB_I32 : NB_I64;
        nb_generator *g1 = nb_generator_new(3), *g2 = nb_generator_new(3);
        nb_generator *g3 = nb_generator_new(3);
        const int64_t sh[2] = {5, 16};
        nb_tensor *cx = host_empty(sh, 2, dt), *cy = host_empty(sh, 2, dt);
        nb_tensor *dx = nb_empty_on(GUARD, sh, 2, dt), *dy = nb_empty_on(GUARD, sh, 2, dt);
        nb_tensor *ex = nb_empty_on(NB_META, sh, 2, dt), *ey = nb_empty_on(NB_META, sh, 2, dt);
        ck_assert(nb_text_sample(tok, g1, cx, cy) == NB_OK);
        ck_assert_msg(nb_text_sample(tok, g2, dx, dy) == NB_OK, "%s", nb_last_error());
        ck_assert_msg(nb_text_sample(tok, g3, ex, ey) == NB_OK, "%s", nb_last_error());
        ck_assert(same_host_values(cx, dx) && same_host_values(cy, dy));
        ck_assert_uint_eq(nb_generator_offset(g2), nb_generator_offset(g1));
        ck_assert_uint_eq(nb_generator_offset(g3), nb_generator_offset(g1));
        /* Tokens must be on the host (they are read for every sample). */
        tu_assert_error(nb_text_sample(gtok, g1, cx, cy) == NB_OK ? (void *)1 : NULL,
                        NB_EDEVICE, "text_sample: needs a tensor in host memory, got a guard");
        nb_generator_free(g1);
        nb_generator_free(g2);
        nb_generator_free(g3);
    }
    tmp_end();
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
    tcase_add_test(tc, test_transforms);
    tcase_add_test(tc, test_text);
    tcase_add_test(tc, test_data_other_devices);
    suite_add_tcase(s, tc);
    return s;
}
