/* testutil.c - helpers shared by the Check suites (see testutil.h). */
#include "testutil.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int64_t tu_numel(const int64_t *shape, int ndim) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

void tu_unravel(int64_t i, const int64_t *shape, int ndim, int64_t *idx) {
    for (int d = ndim - 1; d >= 0; d--) {
        idx[d] = shape[d] ? i % shape[d] : 0;
        i = shape[d] ? i / shape[d] : 0;
    }
}

nb_tensor *tu_tensor(const double *vals, const int64_t *shape, int ndim, nb_dtype dt) {
    int64_t n = tu_numel(shape, ndim);
    nb_tensor *t = nb_from_buffer(vals, shape, ndim, NB_F64);
    ck_assert_msg(t != NULL, "tu_tensor: %s", nb_last_error());
    (void)n;
    nb_tensor *r = nb_to_device(nb_to_dtype(t, dt), nb_default_device());
    ck_assert_msg(r != NULL, "tu_tensor: %s", nb_last_error());
    return r;
}

void tu_fill_uniform(double *out, int64_t n, double lo, double hi, uint64_t seed) {
    uint64_t s = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        double u = (double)(s >> 11) / 9007199254740992.0;
        out[i] = lo + (hi - lo) * u;
    }
}

nb_tensor *tu_random(const int64_t *shape, int ndim, nb_dtype dt, double lo, double hi,
                     uint64_t seed) {
    int64_t n = tu_numel(shape, ndim);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    tu_fill_uniform(v, n, lo, hi, seed);
    if (!nb_dtype_is_float(dt))
        for (int64_t i = 0; i < n; i++) v[i] = floor(v[i]);
    if (dt == NB_BOOL)
        for (int64_t i = 0; i < n; i++) v[i] = v[i] > 0 ? 1 : 0;
    nb_tensor *t = tu_tensor(v, shape, ndim, dt);
    free(v);
    return t;
}

nb_tensor *tu_noncontig(nb_tensor *t) {
    int nd = nb_ndim(t);
    const int64_t *sh = nb_shape(t);
    if (nd == 0) return t;
    if (nd == 1) {
        int64_t big[1] = {sh[0] * 2};
        nb_tensor *b = nb_zeros(big, 1, nb_tensor_dtype(t));
        nb_tensor *v = nb_slice(b, 0, 0, big[0], 2);
        ck_assert(nb_copy_(v, t) == NB_OK);
        return v;
    }
    int64_t tsh[NB_MAX_DIMS];
    memcpy(tsh, sh, sizeof(int64_t) * (size_t)nd);
    tsh[nd - 1] = sh[nd - 2];
    tsh[nd - 2] = sh[nd - 1];
    nb_tensor *store = nb_zeros(tsh, nd, nb_tensor_dtype(t));
    nb_tensor *v = nb_transpose(store, nd - 2, nd - 1);
    ck_assert(nb_copy_(v, t) == NB_OK);
    ck_assert(!nb_is_contiguous(v) || sh[nd - 1] <= 1 || sh[nd - 2] <= 1);
    return v;
}

double *tu_values(const nb_tensor *t) {
    int64_t n = nb_numel(t);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    ck_assert(nb_read(t, v, n, NB_F64) == NB_OK);
    return v;
}

double tu_tol(nb_dtype dt) {
    switch (dt) {
    case NB_F64: return 1e-12;
    case NB_F32: return 1e-5;
    case NB_F16: return 2e-3;
    case NB_BF16: return 1.6e-2;
    default: return 0;
    }
}

void tu_assert_close_at(const nb_tensor *t, const double *ref, const int64_t *shape, int ndim,
                        double tol, const char *file, int line) {
    ck_assert_msg(t != NULL, "%s:%d: result is NULL: %s", file, line, nb_last_error());
    ck_assert_msg(nb_ndim(t) == ndim, "%s:%d: ndim %d, expected %d", file, line, nb_ndim(t),
                  ndim);
    for (int i = 0; i < ndim; i++)
        ck_assert_msg(nb_shape(t)[i] == shape[i], "%s:%d: dim %d is %lld, expected %lld",
                      file, line, i, (long long)nb_shape(t)[i], (long long)shape[i]);
    int64_t n = nb_numel(t);
    double *v = tu_values(t);
    for (int64_t i = 0; i < n; i++) {
        double x = v[i], r = ref[i];
        bool ok;
        if (isnan(r)) ok = isnan(x);
        else if (isinf(r)) ok = x == r;
        else ok = fabs(x - r) <= tol * (1 + fabs(r));
        if (!ok) {
            free(v);
            ck_abort_msg("%s:%d: element %lld is %.9g, expected %.9g (tol %g)", file, line,
                         (long long)i, x, r, tol);
        }
    }
    free(v);
}

void tu_assert_error_at(bool failed, nb_status status, const char *needle, const char *file,
                        int line) {
    ck_assert_msg(failed, "%s:%d: expected an error, got a result", file, line);
    ck_assert_msg(nb_last_status() == status, "%s:%d: status %s, expected %s (%s)", file,
                  line, nb_status_name(nb_last_status()), nb_status_name(status),
                  nb_last_error());
    if (needle)
        ck_assert_msg(strstr(nb_last_error(), needle) != NULL,
                      "%s:%d: message \"%s\" lacks \"%s\"", file, line, nb_last_error(),
                      needle);
    nb_clear_error();
}

void tu_assert_index_error_at(nb_tensor *result, nb_status status, const char *needle,
                              const char *file, int line) {
    if (result) { /* a deferred report: the read of the result is the synchronization */
        nb_tensor *h = nb_to_device(result, NB_CPU);
        ck_assert_msg(h == NULL, "%s:%d: expected an error, got a result (also when read)",
                      file, line);
    }
    tu_assert_error_at(true, status, needle, file, line);
}

nb_tensor *tu_random_cpu(const int64_t *shape, int ndim, nb_dtype dt, double lo, double hi,
                         uint64_t seed) {
    return nb_to_device(tu_random(shape, ndim, dt, lo, hi, seed), NB_CPU);
}

void tu_expect_on(const nb_tensor *t, nb_device dev, const int64_t *shape, int ndim,
                  nb_dtype dt, const char *what) {
    ck_assert_msg(t, "%s: %s", what, nb_last_error());
    ck_assert_msg(nb_device_equal(nb_tensor_device(t), dev), "%s: on the wrong device", what);
    ck_assert_msg(nb_tensor_dtype(t) == dt, "%s: dtype %s", what,
                  nb_dtype_name(nb_tensor_dtype(t)));
    ck_assert_msg(nb_ndim(t) == ndim, "%s: %d dims", what, nb_ndim(t));
    for (int d = 0; d < ndim; d++)
        ck_assert_msg(nb_shape(t)[d] == shape[d], "%s: dim %d is %lld", what, d,
                      (long long)nb_shape(t)[d]);
}

/* ---- files -------------------------------------------------------------------------------- */
/* A fresh directory under /tmp, removed (with its files) by tu_rm_dir. */
char *tu_make_dir(void) {
    char *d = strdup("/tmp/nb_test_XXXXXX");
    ck_assert(d && mkdtemp(d));
    return d;
}

int tu_count_files(const char *dir) {
    DIR *d = opendir(dir);
    ck_assert(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}


void tu_rm_dir(char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        char p[512];
        for (struct dirent *e; (e = readdir(d));) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
    free(dir);
}


char *tu_path_in(const char *dir, const char *name) {
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}


void tu_write_file(const char *path, const void *buf, size_t n) {
    FILE *fp = fopen(path, "wb");
    ck_assert(fp);
    ck_assert(n == 0 || fwrite(buf, 1, n, fp) == n);
    ck_assert(fclose(fp) == 0);
}


unsigned char *tu_read_file(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    ck_assert_msg(fp != NULL, "cannot open %s", path);
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    ck_assert(len == 0 || fread(b, 1, (size_t)len, fp) == (size_t)len);
    fclose(fp);
    b[len] = 0;
    *n = (size_t)len;
    return b;
}

/* ---- raw values ----------------------------------------------------------------------------- */
void *tu_raw_values(const nb_tensor *t) {
    int64_t n = nb_numel(t);
    void *v = malloc(nb_dtype_size(nb_tensor_dtype(t)) * (size_t)(n ? n : 1));
    ck_assert_msg(nb_read(t, v, n, nb_tensor_dtype(t)) == NB_OK, "%s", nb_last_error());
    return v;
}

void tu_assert_same_bytes(nb_tensor *a, nb_tensor *b) {
    ck_assert_msg(a && b, "%s", nb_last_error());
    ck_assert_int_eq(nb_numel(a), nb_numel(b));
    size_t bytes = (size_t)nb_numel(a) * nb_dtype_size(nb_tensor_dtype(a));
    ck_assert(nb_is_contiguous(a) && nb_is_contiguous(b));
    ck_assert_int_eq(nb_tensor_dtype(a), nb_tensor_dtype(b)); /* same bytes per element */
    void *ra = tu_raw_values(a), *rb = tu_raw_values(b);
    ck_assert(memcmp(ra, rb, bytes) == 0);
    free(ra), free(rb);
}
