/* test_io.c - the "io" suite: safetensors reading and writing (every dtype, metadata, the
 * reference writer's exact layout, a file written by PyTorch's safetensors, a corpus of
 * corrupt and truncated files, atomic replacement) and module state save/load. The PyTorch
 * fixtures in tests/fixtures/io/ come from tools/make_io_fixtures.py. The module state tests
 * are in test_io_state.c. */
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

#ifndef NB_SOURCE_DIR
#define NB_SOURCE_DIR "."
#endif
#define FIXTURES NB_SOURCE_DIR "/tests/fixtures/io/"

static const nb_dtype all_dtypes[] = {NB_F32, NB_F64, NB_F16, NB_BF16,
                                      NB_I32, NB_I64, NB_U8,  NB_BOOL};
#define NDT ((int)(sizeof all_dtypes / sizeof all_dtypes[0]))

/* ---- helpers (files: tu_make_dir, tu_path_in, ... in testutil) ------------------------------ */
/* A header + data file from a JSON string (header length = strlen(json)) and data_size
 * bytes of 0x11. */
static void write_st(const char *path, const char *json, size_t data_size) {
    size_t n = strlen(json);
    unsigned char *b = calloc(1, 8 + n + data_size + 1);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(b + 8, json, n);
    memset(b + 8 + n, 0x11, data_size);
    tu_write_file(path, b, 8 + n + data_size);
    free(b);
}

/* Opening path fails with status, a message containing needle and the path. */
static void expect_open_error(const char *path, nb_status status, const char *needle,
                              const char *label) {
    nb_clear_error();
    nb_safetensors *f = nb_safetensors_open(path);
    if (f) nb_safetensors_close(f);
    ck_assert_msg(f == NULL, "%s: opened a bad file", label);
    ck_assert_msg(nb_last_status() == status, "%s: status %s, wanted %s (%s)", label,
                  nb_status_name(nb_last_status()), nb_status_name(status), nb_last_error());
    ck_assert_msg(strstr(nb_last_error(), needle), "%s: message \"%s\" lacks \"%s\"", label,
                  nb_last_error(), needle);
    ck_assert_msg(strstr(nb_last_error(), path), "%s: message \"%s\" does not name the file",
                  label, nb_last_error());
}

/* ---- round trips ------------------------------------------------------------------------------- */
START_TEST(test_roundtrip_dtypes) {
    nb_scope_begin();
    static const struct {
        int ndim;
        int64_t shape[8];
        bool noncontig;
    } shapes[] = {
        {0, {0}, false},         {1, {0}, false},      {3, {2, 0, 3}, false},
        {1, {7}, false},         {2, {3, 5}, false},   {8, {2, 1, 2, 1, 3, 1, 2, 2}, false},
        {2, {4, 5}, true},       {1, {6}, true},       {3, {2, 3, 4}, true},
    };
    enum { NS = sizeof shapes / sizeof shapes[0] };
    char *dir = tu_make_dir(), *path = tu_path_in(dir, "all.safetensors");
    char names[NDT * NS][32];
    const char *np[NDT * NS];
    nb_tensor *ts[NDT * NS];
    int n = 0;
    for (int d = 0; d < NDT; d++)
        for (int s = 0; s < NS; s++, n++) {
            snprintf(names[n], sizeof names[n], "%s.s%d", nb_dtype_name(all_dtypes[d]), s);
            np[n] = names[n];
            ts[n] = rand_of(shapes[s].shape, shapes[s].ndim, all_dtypes[d], (uint64_t)(n + 1));
            if (shapes[s].noncontig) {
                ts[n] = tu_noncontig(ts[n]);
                ck_assert(!nb_is_contiguous(ts[n]));
            }
        }
    ASSERT_OK(nb_safetensors_save(path, np, ts, n, NULL, NULL, 0));
    ck_assert_int_eq(tu_count_files(dir), 1); /* no temporary file left */

    nb_safetensors *f = nb_safetensors_open(path);
    ck_assert_msg(f, "%s", nb_last_error());
    ck_assert_int_eq(nb_safetensors_count(f), n);
    ck_assert_int_eq(nb_safetensors_metadata_count(f), 0);
    nb_tensor *keep[NDT * NS];
    for (int i = 0; i < n; i++) {
        nb_tensor *a = nb_safetensors_get(f, np[i]);
        assert_identical(a, ts[i], np[i]);
        nb_tensor *c = nb_safetensors_get_copy(f, np[i]);
        assert_identical(c, ts[i], np[i]);
        nb_safetensors_info in;
        ASSERT_OK(nb_safetensors_info_at(f, nb_safetensors_find(f, np[i]), &in));
        ck_assert_str_eq(in.name, np[i]);
        ck_assert(in.supported && in.dtype == nb_tensor_dtype(ts[i]));
        ck_assert_int_eq(in.ndim, nb_ndim(ts[i]));
        if (nb_numel(a) > 0) {
            /* zero copy: two gets share the mapped bytes, a copy has its own */
            nb_tensor *b = nb_safetensors_get(f, np[i]);
            ck_assert_ptr_eq(nb_data(a), nb_data(b));
            ck_assert_ptr_ne(nb_data(a), nb_data(c));
            ck_assert_int_eq((uintptr_t)nb_data(a) % nb_dtype_size(nb_tensor_dtype(a)), 0);
        }
        keep[i] = a;
    }
    /* Tensors outlive the handle and the file's name. */
    nb_safetensors_close(f);
    unlink(path);
    for (int i = 0; i < n; i++) assert_identical(keep[i], ts[i], np[i]);
    free(path);
    tu_rm_dir(dir);
    nb_scope_end();
}
END_TEST

START_TEST(test_file_order_and_names) {
    nb_scope_begin();
    char *dir = tu_make_dir(), *path = tu_path_in(dir, "o.safetensors");
    /* Written in the reference order: 8-byte dtypes first, then by name. */
    const char *names[] = {"u", "a64", "b", "i", "z64", "h"};
    nb_tensor *ts[] = {nb_zeros((int64_t[]){3}, 1, NB_U8), nb_zeros((int64_t[]){1}, 1, NB_F64),
                       nb_zeros((int64_t[]){2}, 1, NB_F32), nb_zeros((int64_t[]){1}, 1, NB_I64),
                       nb_zeros((int64_t[]){1}, 1, NB_I64), nb_zeros((int64_t[]){1}, 1, NB_BF16)};
    ASSERT_OK(nb_safetensors_save(path, names, ts, 6, NULL, NULL, 0));
    nb_safetensors *f = nb_safetensors_open(path);
    ck_assert(f);
    const char *want[] = {"i", "z64", "a64", "b", "h", "u"};
    uint64_t off = 0;
    for (int i = 0; i < 6; i++) {
        ck_assert_str_eq(nb_safetensors_name(f, i), want[i]);
        nb_safetensors_info in;
        ASSERT_OK(nb_safetensors_info_at(f, i, &in));
        ck_assert_int_eq(in.data_begin, off);
        off = in.data_end;
    }
    ck_assert_ptr_null(nb_safetensors_name(f, 6));
    ck_assert_ptr_null(nb_safetensors_name(f, -1));
    ck_assert_int_eq(nb_safetensors_find(f, "nope"), -1);
    ck_assert_str_eq(nb_safetensors_path(f), path);
    nb_safetensors_close(f);
    free(path);
    tu_rm_dir(dir);
    nb_scope_end();
}
END_TEST

START_TEST(test_metadata) {
    nb_scope_begin();
    char *dir = tu_make_dir(), *path = tu_path_in(dir, "m.safetensors");
    const char *keys[] = {"format", "note", "empty", "uni"};
    const char *vals[] = {"pt", "a \"quoted\"\nline\\ /", "", "\xc3\xbcn\xc3\xaf \xe2\x9c\x93"};
    nb_tensor *t = nb_ones((int64_t[]){2}, 1, NB_F32);
    const char *nm[] = {"t"};
    ASSERT_OK(nb_safetensors_save(path, nm, &t, 1, keys, vals, 4));
    nb_safetensors *f = nb_safetensors_open(path);
    ck_assert(f);
    ck_assert_int_eq(nb_safetensors_metadata_count(f), 4);
    for (int i = 0; i < 4; i++) {
        ck_assert_str_eq(nb_safetensors_metadata_key(f, i), keys[i]); /* order kept */
        ck_assert_str_eq(nb_safetensors_metadata(f, keys[i]), vals[i]);
    }
    nb_clear_error();
    ck_assert_ptr_null(nb_safetensors_metadata(f, "absent"));
    ck_assert_ptr_null(nb_safetensors_metadata_key(f, 4));
    ck_assert_int_eq(nb_last_status(), NB_OK);
    nb_safetensors_close(f);

    /* Without metadata there is no "__metadata__" entry at all. */
    ASSERT_OK(nb_safetensors_save(path, nm, &t, 1, NULL, NULL, 0));
    size_t n;
    unsigned char *b = tu_read_file(path, &n);
    ck_assert(!strstr((char *)b + 8, "__metadata__"));
    free(b);
    /* An empty file: "{}" padded to 8 bytes, as the reference writes it. */
    ASSERT_OK(nb_safetensors_save(path, NULL, NULL, 0, NULL, NULL, 0));
    b = tu_read_file(path, &n);
    ck_assert_int_eq(n, 16);
    ck_assert(memcmp(b, "\x08\0\0\0\0\0\0\0{}      ", 16) == 0);
    free(b);
    f = nb_safetensors_open(path);
    ck_assert(f && nb_safetensors_count(f) == 0);
    nb_safetensors_close(f);
    free(path);
    tu_rm_dir(dir);
    nb_scope_end();
}
END_TEST

/* The same tensors as layout() in tools/make_io_fixtures.py, given in another order and
 * partly non-contiguous: nabla must write the reference writer's bytes exactly. */
START_TEST(test_layout_matches_reference) {
    nb_scope_begin();
    char *dir = tu_make_dir(), *path = tu_path_in(dir, "layout.safetensors");
    const char *names[] = {"flag", "a.bias", "w64", "b.weight", "empty", "z",
                           "na\xc3\xafve \"q\"\\", "count", "emb", "bytes"};
    nb_tensor *ts[10];
    ts[0] = tu_tensor((double[]){1, 0, 1}, (int64_t[]){3}, 1, NB_BOOL);
    ts[1] = tu_noncontig(tu_tensor((double[]){1, -2, 0.5}, (int64_t[]){3}, 1, NB_F16));
    ts[2] = tu_tensor((double[]){0.25}, (int64_t[]){1}, 1, NB_F64);
    ts[3] = tu_noncontig(
        tu_tensor((double[]){-1, -0.5, 0, 0.5, 1, 1.5}, (int64_t[]){2, 3}, 2, NB_F32));
    ts[4] = nb_zeros((int64_t[]){0}, 1, NB_F32);
    ts[5] = tu_tensor((double[]){7}, NULL, 0, NB_I64);
    ts[6] = tu_tensor((double[]){1}, (int64_t[]){1}, 1, NB_F32);
    ts[7] = tu_tensor((double[]){1, -1}, (int64_t[]){2}, 1, NB_I32);
    ts[8] = tu_tensor((double[]){1, 2, 3, 4}, (int64_t[]){2, 2}, 2, NB_BF16);
    ts[9] = tu_tensor((double[]){1, 2, 255}, (int64_t[]){3}, 1, NB_U8);
    const char *k[] = {"format"}, *v[] = {"pt"};
    ASSERT_OK(nb_safetensors_save(path, names, ts, 10, k, v, 1));
    size_t n_ours, n_ref;
    unsigned char *ours = tu_read_file(path, &n_ours);
    unsigned char *ref = tu_read_file(FIXTURES "layout.safetensors", &n_ref);
    ck_assert_int_eq(n_ours, n_ref);
    for (size_t i = 0; i < n_ref; i++)
        ck_assert_msg(ours[i] == ref[i], "byte %zu differs: 0x%02x vs reference 0x%02x", i,
                      ours[i], ref[i]);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | ours[i];
    ck_assert_int_eq(hlen % 8, 0);
    free(ours);
    free(ref);
    free(path);
    tu_rm_dir(dir);
    nb_scope_end();
}
END_TEST

/* ---- a file written by PyTorch ------------------------------------------------------------------- */
static int hexval(char c) { return c <= '9' ? c - '0' : (c | 32) - 'a' + 10; }

START_TEST(test_torch_fixture) {
    nb_scope_begin();
    size_t len;
    char *text = (char *)tu_read_file(FIXTURES "torch_mixed.expected", &len);
    nb_safetensors *f = nb_safetensors_open(FIXTURES "torch_mixed.safetensors");
    ck_assert_msg(f, "%s", nb_last_error());
    int ntensors = 0, nmeta = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#') continue;
        char *field[5] = {0};
        int nf = 0;
        for (char *p = line; nf < 5;) {
            field[nf++] = p;
            char *bar = strchr(p, '|');
            if (!bar) break;
            *bar = 0;
            p = bar + 1;
        }
        if (strcmp(field[0], "meta") == 0) {
            ck_assert_int_eq(nf, 3);
            const char *v = nb_safetensors_metadata(f, field[1]);
            ck_assert_msg(v && strcmp(v, field[2]) == 0, "metadata %s", field[1]);
            nmeta++;
            continue;
        }
        ck_assert_int_eq(nf, 5);
        ntensors++;
        const char *name = field[0];
        nb_tensor *t = nb_safetensors_get(f, name);
        ck_assert_msg(t, "%s: %s", name, nb_last_error());
        nb_safetensors_info in;
        ASSERT_OK(nb_safetensors_info_at(f, nb_safetensors_find(f, name), &in));
        ck_assert_str_eq(in.dtype_name, field[1]);
        /* shape */
        int nd = 0;
        int64_t shape[NB_MAX_DIMS];
        for (char *p = field[2]; *p;) {
            shape[nd++] = strtoll(p, &p, 10);
            if (*p == ',') p++;
        }
        ck_assert_msg(nb_ndim(t) == nd, "%s: ndim", name);
        for (int d = 0; d < nd; d++) ck_assert_int_eq(nb_shape(t)[d], shape[d]);
        /* values, exactly */
        int64_t n = nb_numel(t);
        bool fl = nb_dtype_is_float(nb_tensor_dtype(t));
        double *dv = malloc(sizeof(double) * (size_t)(n + 1));
        int64_t *iv = malloc(sizeof(int64_t) * (size_t)(n + 1));
        ASSERT_OK(nb_read(t, fl ? (void *)dv : (void *)iv, n, fl ? NB_F64 : NB_I64));
        char *p = field[3];
        for (int64_t i = 0; i < n; i++) {
            if (fl) {
                double want = strtod(p, &p);
                ck_assert_msg(isnan(want) ? isnan(dv[i])
                                          : dv[i] == want && signbit(dv[i]) == signbit(want),
                              "%s[%lld] = %a, expected %a", name, (long long)i, dv[i], want);
            } else {
                long long want = strtoll(p, &p, 10);
                ck_assert_msg(iv[i] == want, "%s[%lld] = %lld, expected %lld", name, (long long)i,
                              (long long)iv[i], want);
            }
        }
        /* and the raw bytes */
        size_t nbytes;
        unsigned char *raw = raw_bytes(t, &nbytes);
        ck_assert_int_eq(strlen(field[4]), 2 * nbytes);
        for (size_t i = 0; i < nbytes; i++)
            ck_assert_int_eq(raw[i], hexval(field[4][2 * i]) * 16 + hexval(field[4][2 * i + 1]));
        free(raw);
        free(dv);
        free(iv);
    }
    ck_assert_int_eq(ntensors, nb_safetensors_count(f));
    ck_assert_int_eq(nmeta, nb_safetensors_metadata_count(f));
    ck_assert(ntensors >= 10 && nmeta == 2);
    nb_safetensors_close(f);
    free(text);
    nb_scope_end();
}
END_TEST

/* ---- bad files ----------------------------------------------------------------------------------- */
#define F32A(name, begin, end, n) \
    "\"" name "\":{\"dtype\":\"F32\",\"shape\":[" #n "],\"data_offsets\":[" #begin "," #end "]}"

START_TEST(test_corrupt_headers) {
    static const struct {
        const char *json;
        size_t data;
        const char *needle;
    } cases[] = {
        {"not json", 0, "not valid JSON"},
        {"", 0, "not valid JSON"},
        {"{\"a\":", 0, "not valid JSON"},
        {"[1,2]", 0, "not a JSON object"},
        {"{\"a\":{\"dtype\":\"F9\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         "unknown dtype \"F9\""},
        {"{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "\"dtype\""},
        {"{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "\"dtype\""},
        {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "\"shape\""},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":3,\"data_offsets\":[0,4]}}", 4, "\"shape\""},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "non-negative"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, "non-negative"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4, "non-negative"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4, "data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,\"4\"]}}", 4, "data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4, "data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":\"0,4\"}}", 4, "data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4,
         "end before they begin"},
        {"{" F32A("a", 0, 8, 2) "}", 4, "beyond the 4 bytes"},
        {"{" F32A("a", 0, 4, 2) "}", 4, "needs 8 bytes"},
        {"{" F32A("a", 0, 8, 1) "}", 8, "needs 4 bytes"},
        {"{" F32A("a", 0, 8, 2) "," F32A("b", 4, 12, 2) "}", 12, "overlap"},
        {"{" F32A("a", 0, 4, 1) "," F32A("b", 8, 12, 1) "}", 12, "gap of 4 bytes"},
        {"{" F32A("a", 4, 8, 1) "}", 8, "gap of 4 bytes"},
        {"{" F32A("a", 0, 4, 1) "}", 8, "not used by any tensor"},
        {"{" F32A("a", 0, 4, 1) "," F32A("a", 4, 8, 1) "}", 8, "duplicate"},
        {"{\"a\":5}", 0, "not a JSON object"},
        {"{\"__metadata__\":5}", 0, "\"__metadata__\" is not a JSON object"},
        {"{\"__metadata__\":{\"k\":1}}", 0, "not a string"},
        {"{\"__metadata__\":{\"k\":\"v\",\"k\":\"w\"}}", 0, "duplicate"},
        {"{\"\xff\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         "not valid JSON"},
        {"{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         "not valid JSON"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,4]}}", 4,
         "too large"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,4]}}", 4,
         "not valid JSON"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,18446744073709551620]}}", 4,
         "not valid JSON"},
    };
    char *dir = tu_make_dir(), *path = tu_path_in(dir, "bad.safetensors");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_st(path, cases[i].json, cases[i].data);
        char label[64];
        snprintf(label, sizeof label, "case %zu", i);
        expect_open_error(path, NB_EFORMAT, cases[i].needle, label);
    }
    /* A NUL byte inside the header. */
    tu_write_file(path, "\x0a\0\0\0\0\0\0\0{\"a\"\0:1}  ", 18);
    expect_open_error(path, NB_EFORMAT, "not valid JSON", "NUL");
    free(path);
    tu_rm_dir(dir);
}
END_TEST

START_TEST(test_bad_files) {
    char *dir = tu_make_dir(), *path = tu_path_in(dir, "x.safetensors");
    tu_write_file(path, "", 0);
    expect_open_error(path, NB_EFORMAT, "too short", "empty file");
    tu_write_file(path, "\x02\0\0\0\0", 5);
    expect_open_error(path, NB_EFORMAT, "too short", "5 bytes");
    tu_write_file(path, "\xe8\x03\0\0\0\0\0\0{}      ", 16);
    expect_open_error(path, NB_EFORMAT, "larger than", "length past the end");
    tu_write_file(path, "\x00\xc2\xeb\x0b\0\0\0\0{}      ", 16); /* 200,000,000 */
    expect_open_error(path, NB_EFORMAT, "exceeds the limit", "length over the bound");
    tu_write_file(path, "\xff\xff\xff\xff\xff\xff\xff\xff{}      ", 16);
    expect_open_error(path, NB_EFORMAT, "exceeds the limit", "length 2^64-1");
    char *missing = tu_path_in(dir, "missing.safetensors");
    expect_open_error(missing, NB_EIO, "cannot open", "missing file");
    expect_open_error(dir, NB_EIO, "directory", "a directory");
    nb_clear_error();
    ck_assert_ptr_null(nb_safetensors_open(NULL));
    ck_assert_int_eq(nb_last_status(), NB_ENULL);
    free(missing);
    free(path);
    tu_rm_dir(dir);
}
END_TEST

/* Files that are valid safetensors but hold what nabla cannot (or need not) map directly. */
START_TEST(test_unusual_valid_files) {
    nb_scope_begin();
    char *dir = tu_make_dir(), *path = tu_path_in(dir, "u.safetensors");
    nb_safetensors *f;
    nb_safetensors_info in;

    /* more than NB_MAX_DIMS dims and a dtype nabla lacks: the file opens, get says why not */
    write_st(path,
             "{\"nine\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,2]},"
             "\"i8\":{\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[2,4]}}",
             4);
    f = nb_safetensors_open(path);
    ck_assert_msg(f, "%s", nb_last_error());
    ASSERT_OK(nb_safetensors_info_at(f, 0, &in));
    ck_assert(!in.supported && in.ndim == 9);
    tu_assert_error(nb_safetensors_get(f, "nine"), NB_EUNSUPPORTED, "at most 8");
    tu_assert_error(nb_safetensors_get(f, "i8"), NB_EDTYPE, "dtype I8");
    tu_assert_error(nb_safetensors_get(f, "none"), NB_EINVAL, "has no tensor \"none\"");
    tu_assert_error(nb_safetensors_get(NULL, "none"), NB_ENULL, "NULL");
    tu_assert_error(nb_safetensors_get(f, NULL), NB_ENULL, "NULL");
    ASSERT_ST(nb_safetensors_info_at(f, 2, &in), NB_EINDEX, "out of range");
    nb_safetensors_close(f);

    /* unaligned data (another writer's order), BOOL bytes other than 0/1, unpadded header,
     * null metadata and unknown fields: read correctly (copied where needed) */
    const char *json = "{\"__metadata__\":null,"
                       "\"u\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":[]},"
                       "\"f\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[1,9]},"
                       "\"b\":{\"dtype\":\"BOOL\",\"shape\":[3],\"data_offsets\":[9,12]}}";
    size_t hl = strlen(json);
    ck_assert(hl % 8 != 0 || hl % 4 != 0);
    unsigned char buf[512] = {0};
    buf[0] = (unsigned char)hl;
    memcpy(buf + 8, json, hl);
    unsigned char *data = buf + 8 + hl;
    float fv[2] = {1.5f, -2.25f};
    data[0] = 200;
    memcpy(data + 1, fv, 8);
    data[9] = 0, data[10] = 2, data[11] = 1;
    tu_write_file(path, buf, 8 + hl + 12);
    f = nb_safetensors_open(path);
    ck_assert_msg(f, "%s", nb_last_error());
    ck_assert_int_eq(nb_safetensors_metadata_count(f), 0);
    nb_tensor *t = nb_safetensors_get(f, "f");
    ck_assert(t && nb_get_f64(t, (int64_t[]){0}) == 1.5 && nb_get_f64(t, (int64_t[]){1}) == -2.25);
    ck_assert_int_eq((uintptr_t)nb_data(t) % 4, 0);
    nb_tensor *b = nb_safetensors_get(f, "b");
    unsigned char bv[3];
    ASSERT_OK(nb_read(b, bv, 3, NB_U8));
    ck_assert(bv[0] == 0 && bv[1] == 1 && bv[2] == 1);
    ck_assert_int_eq(nb_item_i64(nb_safetensors_get(f, "u")), 200);
    nb_safetensors_close(f);
    free(path);
    tu_rm_dir(dir);
    nb_scope_end();
}
END_TEST

/* Every truncation of a valid file is an error; flipped bytes never crash (run under ASan). */
START_TEST(test_truncation_and_mutation) {
    nb_scope_begin();
    char *dir = tu_make_dir(), *path = tu_path_in(dir, "v.safetensors"), *cut = tu_path_in(dir, "c");
    const char *names[] = {"w", "b", "s", "m"};
    nb_tensor *ts[] = {rand_of((int64_t[]){2, 3}, 2, NB_F32, 1),
                       rand_of((int64_t[]){3}, 1, NB_BF16, 2), rand_of(NULL, 0, NB_I64, 3),
                       rand_of((int64_t[]){4}, 1, NB_BOOL, 4)};
    const char *k[] = {"format"}, *v[] = {"pt"};
    ASSERT_OK(nb_safetensors_save(path, names, ts, 4, k, v, 1));
    size_t n;
    unsigned char *good = tu_read_file(path, &n);
    /* One file changed in place: creating a thousand files is slow on some file systems. */
    tu_write_file(cut, good, n);
    int fd = open(cut, O_RDWR);
    ck_assert(fd >= 0);
    for (size_t len = 0; len < n; len++) {
        ck_assert(ftruncate(fd, (off_t)len) == 0);
        char label[64];
        snprintf(label, sizeof label, "truncated to %zu", len);
        expect_open_error(cut, NB_EFORMAT, cut, label);
    }
    ck_assert(pwrite(fd, good, n, 0) == (ssize_t)n);
    static const unsigned char flips[] = {0x01, 0x80, 0xff};
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < sizeof flips; j++) {
            unsigned char c = good[i] ^ flips[j];
            ck_assert(pwrite(fd, &c, 1, (off_t)i) == 1);
            nb_clear_error();
            nb_safetensors *f = nb_safetensors_open(cut);
            if (f) {
                /* It parsed: then every tensor must be readable within the file. */
                nb_scope_begin();
                for (int t = 0; t < nb_safetensors_count(f); t++) {
                    nb_tensor *x = nb_safetensors_get(f, nb_safetensors_name(f, t));
                    if (x) free(tu_values(x));
                }
                nb_scope_end();
                nb_safetensors_close(f);
            } else {
                ck_assert_msg(nb_last_status() == NB_EFORMAT, "byte %zu ^ %02x: %s", i, flips[j],
                              nb_last_error());
            }
            ck_assert(pwrite(fd, &good[i], 1, (off_t)i) == 1);
        }
    close(fd);
    free(good);
    free(cut);
    free(path);
    tu_rm_dir(dir);
    nb_scope_end();
}
END_TEST

/* ---- writing: errors and atomic replacement ------------------------------------------------------ */
START_TEST(test_save_errors) {
    nb_scope_begin();
    char *dir = tu_make_dir(), *path = tu_path_in(dir, "e.safetensors");
    nb_tensor *a = nb_ones((int64_t[]){2}, 1, NB_F32), *b = nb_zeros((int64_t[]){2}, 1, NB_I32);
    nb_tensor *ab[] = {a, b}, *an[] = {a, NULL};
    const char *n2[] = {"a", "b"}, *dup[] = {"x", "x"}, *meta[] = {"__metadata__", "b"};
    const char *nul[] = {"a", NULL}, *badutf[] = {"a", "\xff\xfe"};
    const char *mk[] = {"k", "k"}, *mv[] = {"1", "2"}, *mbad[] = {"\xc3", "2"};
    ASSERT_ST(nb_safetensors_save(NULL, n2, ab, 2, NULL, NULL, 0), NB_ENULL, "path");
    ASSERT_ST(nb_safetensors_save(path, n2, ab, -1, NULL, NULL, 0), NB_EINVAL, "negative");
    ASSERT_ST(nb_safetensors_save(path, NULL, ab, 2, NULL, NULL, 0), NB_ENULL, "names");
    ASSERT_ST(nb_safetensors_save(path, n2, NULL, 2, NULL, NULL, 0), NB_ENULL, "tensors");
    ASSERT_ST(nb_safetensors_save(path, nul, ab, 2, NULL, NULL, 0), NB_ENULL, "names[1]");
    nb_clear_error();
    ASSERT_ST(nb_safetensors_save(path, n2, an, 2, NULL, NULL, 0), NB_ENULL, "\"b\" is NULL");
    ASSERT_ST(nb_safetensors_save(path, dup, ab, 2, NULL, NULL, 0), NB_EINVAL, "named \"x\"");
    ASSERT_ST(nb_safetensors_save(path, meta, ab, 2, NULL, NULL, 0), NB_EINVAL, "reserved");
    ASSERT_ST(nb_safetensors_save(path, badutf, ab, 2, NULL, NULL, 0), NB_EINVAL, "UTF-8");
    ASSERT_ST(nb_safetensors_save(path, n2, ab, 2, mk, mv, 2), NB_EINVAL, "\"k\" appears twice");
    ASSERT_ST(nb_safetensors_save(path, n2, ab, 2, mbad, mv, 2), NB_EINVAL, "UTF-8");
    ASSERT_ST(nb_safetensors_save(path, n2, ab, 2, NULL, mv, 1), NB_ENULL, "meta_keys");
    /* An op's failure passed straight in keeps its own error. */
    nb_tensor *bad = nb_add(a, nb_ones((int64_t[]){3}, 1, NB_F32));
    nb_tensor *withbad[] = {a, bad};
    ASSERT_ST(nb_safetensors_save(path, n2, withbad, 2, NULL, NULL, 0), NB_ESHAPE, "add");
    ck_assert_int_eq(tu_count_files(dir), 0); /* nothing was written */
    free(path);
    tu_rm_dir(dir);
    nb_scope_end();
}
END_TEST

START_TEST(test_atomic_write) {
    nb_scope_begin();
    char *dir = tu_make_dir(), *path = tu_path_in(dir, "ckpt.safetensors");
    const char *nm[] = {"w"};
    nb_tensor *small = rand_of((int64_t[]){4}, 1, NB_F32, 5);
    nb_tensor *big = rand_of((int64_t[]){64, 256}, 2, NB_F32, 6); /* 64 KiB */
    mode_t old_mask = umask(022);
    ASSERT_OK(nb_safetensors_save(path, nm, &small, 1, NULL, NULL, 0));
    umask(old_mask);
    struct stat st;
    ck_assert(stat(path, &st) == 0);
    ck_assert_int_eq(st.st_mode & 0777, 0644); /* the umask decides, as for fopen */
    size_t n_old;
    unsigned char *old = tu_read_file(path, &n_old);

    /* A write that fails half-way (the file size limit: as a full disk would) leaves the old
     * file as it was and no temporary file. Works as root too. */
    struct rlimit saved, lim;
    ck_assert(getrlimit(RLIMIT_FSIZE, &saved) == 0);
    void (*prev_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    lim = saved;
    lim.rlim_cur = 16384;
    ck_assert(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    nb_status s = nb_safetensors_save(path, nm, &big, 1, NULL, NULL, 0);
    setrlimit(RLIMIT_FSIZE, &saved);
    signal(SIGXFSZ, prev_handler);
    ck_assert_int_eq(s, NB_EIO);
    ck_assert_msg(strstr(nb_last_error(), path), "%s", nb_last_error());
    ck_assert_int_eq(tu_count_files(dir), 1);
    size_t n_now;
    unsigned char *now = tu_read_file(path, &n_now);
    ck_assert(n_now == n_old && memcmp(now, old, n_old) == 0);
    free(now);

    /* A directory that does not exist, or (unless we are root) one we may not write. */
    char *nodir = tu_path_in(dir, "no/such.safetensors");
    ASSERT_ST(nb_safetensors_save(nodir, nm, &big, 1, NULL, NULL, 0), NB_EIO, "cannot create");
    free(nodir);
    if (geteuid() != 0) {
        ck_assert(chmod(dir, 0555) == 0);
        ASSERT_ST(nb_safetensors_save(path, nm, &big, 1, NULL, NULL, 0), NB_EIO, "ckpt");
        ck_assert(chmod(dir, 0755) == 0);
        now = tu_read_file(path, &n_now);
        ck_assert(n_now == n_old && memcmp(now, old, n_old) == 0);
        free(now);
    }
    ck_assert_int_eq(tu_count_files(dir), 1);

    /* And replacing works, even while the old file is open and its tensors in use. */
    nb_safetensors *f = nb_safetensors_open(path);
    nb_tensor *old_w = nb_safetensors_get(f, "w");
    ASSERT_OK(nb_safetensors_save(path, nm, &big, 1, NULL, NULL, 0));
    assert_identical(old_w, small, "old mapping");
    nb_safetensors_close(f);
    f = nb_safetensors_open(path);
    assert_identical(nb_safetensors_get(f, "w"), big, "new file");
    nb_safetensors_close(f);
    ck_assert_int_eq(tu_count_files(dir), 1);
    free(old);
    free(path);
    tu_rm_dir(dir);
    nb_scope_end();
}
END_TEST

/* A device node to save onto: as root a copy made in dir (so that a regression replaces the
 * copy, never the machine's own node), otherwise the real one (which we cannot replace). */
static char *device_node(const char *dir, const char *name, unsigned minor) {
    char *dev = malloc(32);
    snprintf(dev, 32, "/dev/%s", name);
    if (geteuid() != 0) return dev;
    free(dev);
    char *copy = tu_path_in(dir, name);
    ck_assert_msg(mknod(copy, S_IFCHR | 0666, makedev(1, minor)) == 0, "mknod %s", copy);
    return copy;
}

/* Saving onto anything but a regular file (or a missing path) is refused before a byte is
 * written: the rename would otherwise turn a device node or FIFO into a regular file. */
START_TEST(test_save_refuses_special_files) {
    nb_scope_begin();
    char *dir = tu_make_dir();
    const char *nm[] = {"w"};
    nb_tensor *w = rand_of((int64_t[]){4}, 1, NB_F32, 7);
    struct stat st;

    char *fifo = tu_path_in(dir, "fifo.ckpt");
    ck_assert(mkfifo(fifo, 0600) == 0);
    ck_assert_int_eq(nb_safetensors_save(fifo, nm, &w, 1, NULL, NULL, 0), NB_EIO);
    char want[600];
    snprintf(want, sizeof want, "safetensors_save: %s is a FIFO, not a regular file; refusing "
             "to replace it", fifo);
    ck_assert_str_eq(nb_last_error(), want);
    nb_clear_error();
    ck_assert(lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode));

    char *null = device_node(dir, "null", 3);
    ASSERT_ST(nb_safetensors_save(null, nm, &w, 1, NULL, NULL, 0), NB_EIO,
              "is a character device, not a regular file");
    ck_assert(lstat(null, &st) == 0 && S_ISCHR(st.st_mode));

    char *sub = tu_path_in(dir, "sub");
    ck_assert(mkdir(sub, 0755) == 0);
    ASSERT_ST(nb_safetensors_save(sub, nm, &w, 1, NULL, NULL, 0), NB_EIO, "is a directory");
    ck_assert(lstat(sub, &st) == 0 && S_ISDIR(st.st_mode));
    ck_assert(rmdir(sub) == 0);

    /* A symbolic link to a regular file is replaced (by the new file), as before; one to a
     * FIFO is refused like the FIFO. */
    char *link = tu_path_in(dir, "link.ckpt"), *target = tu_path_in(dir, "t.ckpt");
    ck_assert(symlink(fifo, link) == 0);
    ASSERT_ST(nb_safetensors_save(link, nm, &w, 1, NULL, NULL, 0), NB_EIO, "FIFO");
    ck_assert(unlink(link) == 0);
    ASSERT_OK(nb_safetensors_save(target, nm, &w, 1, NULL, NULL, 0));
    ck_assert(symlink(target, link) == 0);
    ASSERT_OK(nb_safetensors_save(link, nm, &w, 1, NULL, NULL, 0));
    ck_assert(lstat(link, &st) == 0 && S_ISREG(st.st_mode));
    /* no temporary file left: fifo, (null), t.ckpt, link.ckpt */
    ck_assert_int_eq(tu_count_files(dir), geteuid() == 0 ? 4 : 3);
    free(fifo);
    free(null);
    free(sub);
    free(link);
    free(target);
    tu_rm_dir(dir);
    nb_scope_end();
}
END_TEST

/* A PID no process has: above the kernel's pid_max (or the largest pid_max allows). */
static long dead_pid(void) {
    long max = 4194304;
    FILE *f = fopen("/proc/sys/kernel/pid_max", "r");
    if (f) {
        if (fscanf(f, "%ld", &max) != 1) max = 4194304;
        fclose(f);
    }
    return max + 1;
}

/* Temporary files left by writers that were killed (X.tmp-PID-N, PID gone) are removed by
 * the next save of X, with one line on stderr; a live writer's (this process, another
 * counter), other paths' and unrelated names stay. */
START_TEST(test_stale_temp_files) {
    nb_scope_begin();
    char *dir = tu_make_dir(), *path = tu_path_in(dir, "run.ckpt");
    const char *nm[] = {"w"};
    nb_tensor *w = rand_of((int64_t[]){4}, 1, NB_F32, 8);
    pid_t child = fork(); /* a PID that existed and is gone once reaped */
    if (child == 0) _exit(0);
    ck_assert(child > 0 && waitpid(child, NULL, 0) == child);
    char name[256];
    snprintf(name, sizeof name, "run.ckpt.tmp-%ld-3", dead_pid());
    char *stale1 = tu_path_in(dir, name);
    snprintf(name, sizeof name, "run.ckpt.tmp-%ld-0", (long)child);
    char *stale2 = tu_path_in(dir, name);
    snprintf(name, sizeof name, "run.ckpt.tmp-%ld-999999", (long)getpid());
    char *live = tu_path_in(dir, name);
    snprintf(name, sizeof name, "other.ckpt.tmp-%ld-1", dead_pid());
    char *other = tu_path_in(dir, name);
    char *odd1 = tu_path_in(dir, "run.ckpt.tmp-12x-1"), *odd2 = tu_path_in(dir, "run.ckpt.tmp-7");
    /* a dead PID, but locked: a writer on another host or in another PID namespace */
    snprintf(name, sizeof name, "run.ckpt.tmp-%ld-4", dead_pid());
    char *locked = tu_path_in(dir, name);
    char *keep[] = {live, other, odd1, odd2, locked};
    tu_write_file(stale1, "half a checkpoint", 17);
    tu_write_file(stale2, "half", 4);
    for (int i = 0; i < 5; i++) tu_write_file(keep[i], "x", 1);
    int lock_fd = open(locked, O_WRONLY);
    ck_assert(lock_fd >= 0 && flock(lock_fd, LOCK_EX) == 0);

    /* stderr to a file for the duration of the save */
    char *log = tu_path_in(dir, "stderr.txt");
    fflush(stderr);
    int saved = dup(2), fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert(saved >= 0 && fd >= 0 && dup2(fd, 2) == 2);
    close(fd);
    nb_status s = nb_safetensors_save(path, nm, &w, 1, NULL, NULL, 0);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    ck_assert_msg(s == NB_OK, "%s", nb_last_error());

    close(lock_fd);
    ck_assert(access(stale1, F_OK) != 0 && access(stale2, F_OK) != 0);
    for (int i = 0; i < 5; i++) ck_assert_msg(access(keep[i], F_OK) == 0, "%s", keep[i]);
    ck_assert(unlink(locked) == 0); /* (else the next save removes it: no longer locked) */
    size_t n;
    char *said = (char *)tu_read_file(log, &n);
    ck_assert_msg(strstr(said, "removed 2 stale temporary files") && strstr(said, path),
                  "stderr: %s", said);
    ck_assert_msg(strchr(said, '\n') == said + n - 1, "one line: %s", said);
    free(said);
    /* Nothing stale left: the next save says nothing. */
    fd = open(log, O_WRONLY | O_TRUNC);
    saved = dup(2);
    ck_assert(saved >= 0 && fd >= 0 && dup2(fd, 2) == 2);
    close(fd);
    s = nb_safetensors_save(path, nm, &w, 1, NULL, NULL, 0);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    ck_assert(s == NB_OK);
    said = (char *)tu_read_file(log, &n);
    ck_assert_msg(n == 0, "stderr: %s", said);
    free(said);
    ck_assert_int_eq(tu_count_files(dir), 6); /* run.ckpt, stderr.txt, the 4 kept */
    free(stale1);
    free(stale2);
    for (int i = 0; i < 5; i++) free(keep[i]);
    free(log);
    free(path);
    tu_rm_dir(dir);
    nb_scope_end();
}
END_TEST

/* Mapped tensors: alive after close, copy-on-write (the file never changes). */
START_TEST(test_mapping_lifetime) {
    nb_scope_begin();
    char *dir = tu_make_dir(), *path = tu_path_in(dir, "l.safetensors");
    const char *nm[] = {"w"};
    nb_tensor *w = rand_of((int64_t[]){3, 4}, 2, NB_F32, 9);
    ASSERT_OK(nb_safetensors_save(path, nm, &w, 1, NULL, NULL, 0));
    nb_safetensors *f = nb_safetensors_open(path);
    nb_tensor *t = nb_safetensors_get(f, "w");
    nb_tensor *view = nb_transpose(t, 0, 1);
    ASSERT_OK(nb_fill_(t, 5.0));
    /* the same handle shares the mapping, another sees the file */
    ck_assert(nb_get_f64(nb_safetensors_get(f, "w"), (int64_t[]){1, 1}) == 5.0);
    nb_safetensors *g = nb_safetensors_open(path);
    assert_identical(nb_safetensors_get(g, "w"), w, "file after a write to a mapped tensor");
    nb_safetensors_close(g);
    nb_safetensors_close(f);
    nb_safetensors_close(NULL);
    unlink(path);
    ck_assert(nb_get_f64(view, (int64_t[]){3, 2}) == 5.0);
    nb_scope_end();
    free(path);
    tu_rm_dir(dir);
}
END_TEST

Suite *nb_suite_io(void) {
    Suite *s = suite_create("io");
    TCase *tc = tcase_create("safetensors");
    tcase_add_test(tc, test_roundtrip_dtypes);
    tcase_add_test(tc, test_file_order_and_names);
    tcase_add_test(tc, test_metadata);
    tcase_add_test(tc, test_layout_matches_reference);
    tcase_add_test(tc, test_torch_fixture);
    tcase_add_test(tc, test_corrupt_headers);
    tcase_add_test(tc, test_bad_files);
    tcase_add_test(tc, test_unusual_valid_files);
    tcase_add_test(tc, test_truncation_and_mutation);
    tcase_add_test(tc, test_save_errors);
    tcase_add_test(tc, test_atomic_write);
    tcase_add_test(tc, test_save_refuses_special_files);
    tcase_add_test(tc, test_stale_temp_files);
    tcase_add_test(tc, test_mapping_lifetime);
    suite_add_tcase(s, tc);
    TCase *tm = tcase_create("state");
    nb_tests_io_state(tm); /* test_io_state.c */
    suite_add_tcase(s, tm);
    suite_add_tcase(s, nb_tcase_io_devices()); /* tests/test_io_devices.c */
    return s;
}
