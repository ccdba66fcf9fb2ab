/* test_data.h - the helpers the data suite's files (tests/test_data.c,
 * tests/test_data_transforms.c) share: a temporary directory per test, files written plain
 * or gzip-compressed and read back raw, IDX headers and expected IDX errors, and the host
 * side of batches. Static inline: each file has its own copy (and its own directory). */
#ifndef NABLA_TEST_DATA_H
#define NABLA_TEST_DATA_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "testutil.h"

/* ---- temporary files ---------------------------------------------------------------------- */
static char g_dir[256];

static inline void tmp_begin(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/nb_test_data_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
}

static inline int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static inline void tmp_end(void) { nftw(g_dir, rm_one, 8, FTW_DEPTH | FTW_PHYS); }

static inline const char *tmp_path(char *buf, const char *name) {
    snprintf(buf, 512, "%s/%s", g_dir, name);
    return buf;
}

/* Write n bytes to path, gzip-compressed when gz. */
static inline void write_file(const char *path, const void *data, size_t n, bool gz) {
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
static inline unsigned char *slurp(const char *path, size_t *n) {
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
static inline size_t idx_header(unsigned char *h, int code, const uint32_t *dims, int ndim) {
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
static inline void expect_idx_error(const char *path, nb_status st, const char *needle) {
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
static inline nb_tensor *host_empty(const int64_t *shape, int ndim, nb_dtype dt) {
    nb_tensor *t = nb_empty_on(NB_CPU, shape, ndim, dt);
    ck_assert_msg(t != NULL, "%s", nb_last_error());
    return t;
}

/* t (any device) on the CPU: t itself when it is there already. */
static inline nb_tensor *on_host(nb_tensor *t) {
    nb_tensor *h = nb_to_device(t, NB_CPU);
    ck_assert_msg(h != NULL, "%s", nb_last_error());
    return h;
}

/* The elements of t in its own dtype (its bytes, row-major) into a malloc'd buffer. */
static inline void *raw_values(const nb_tensor *t) {
    size_t n = (size_t)nb_numel(t) * nb_dtype_size(nb_tensor_dtype(t));
    void *buf = malloc(n ? n : 1);
    ck_assert(nb_read(t, buf, nb_numel(t), nb_tensor_dtype(t)) == NB_OK);
    return buf;
}

#define GUARD ((nb_device){NB_DEVICE_GUARD, 0})

/* a and b hold the same bytes (their dtype is the same: batches of one dataset). */
static inline bool same_raw(const nb_tensor *a, const nb_tensor *b) {
    if (nb_numel(a) != nb_numel(b)) return false;
    size_t n = (size_t)nb_numel(a) * nb_dtype_size(nb_tensor_dtype(a));
    void *va = raw_values(a), *vb = raw_values(b);
    bool same = memcmp(va, vb, n) == 0;
    free(va);
    free(vb);
    return same;
}

#endif
