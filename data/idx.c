/* idx.c - IDX files (the MNIST / Fashion-MNIST array format) and whole-file byte reads,
 * through zlib so that gzip-compressed and plain files are read by the same code (zlib is
 * opened by the first of them: libnabla links no zlib).
 *
 * A bad file is a user mistake, never a crash: every read checks the header (magic,
 * type code, dims, size), that the data is all there (truncation) and that nothing
 * follows it (one byte is read past the end), and reports which file and what is wrong
 * ("idx: /data/train-images-idx3-ubyte.gz: truncated: expected 47040000 bytes of data,
 * got 1200"). */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "data/data_impl.h"
#include "nb_cuda_paths.h"
#include "tensor/dl_lib.h"

/* zlib, opened by the first IDX read or write (tensor/dl_lib.h): libnabla links no zlib. */
static struct {
    __typeof__(gzopen) *open;
    __typeof__(gzread) *read;
    __typeof__(gzwrite) *write;
    __typeof__(gzclose) *close;
    __typeof__(gzerror) *error;
    __typeof__(gzdirect) *direct;
    __typeof__(gzbuffer) *buffer;
} zl;
#define NB__STR2(x) #x
#define NB__STR(x) NB__STR2(x)
static const char *const zl_names[] = {NB__STR(gzopen) /* gzopen64 with 64-bit offsets */,
                                       "gzread", "gzwrite", "gzclose", "gzerror", "gzdirect",
                                       "gzbuffer"};
_Static_assert(sizeof zl == sizeof zl_names, "one function pointer per name");
static nb__dl_lib g_zlib = NB__DL_LIB("zlib", zl_names, &zl, NB_ZLIB_PATH, NB_ZLIB_SONAME);

/* Read up to n bytes (any size; gzread takes an unsigned int). Returns the count read
 * (< n at the end of the data) or -1 on a read or decompression error. */
static int64_t gz_read_all(gzFile f, void *buf, int64_t n) {
    int64_t got = 0;
    while (got < n) {
        int64_t want = n - got;
        if (want > (1 << 30)) want = 1 << 30;
        int r = zl.read(f, (char *)buf + got, (unsigned)want);
        if (r < 0) return -1;
        if (r == 0) break;
        got += r;
    }
    return got;
}

/* Sets an error describing why f failed (errno, or zlib's message), for file path. */
static nb_status gz_fail(gzFile f, const char *what, const char *path, const char *doing) {
    int zerr = Z_OK;
    const char *msg = f ? zl.error(f, &zerr) : NULL;
    if (zerr == Z_ERRNO || !f || !msg || !*msg)
        return nb__error(NB_EIO, "%s: %s: %s: %s", what, path, doing,
                         errno ? strerror(errno) : "read error");
    /* zlib's message starts with the path, which ours already names. */
    size_t pl = strlen(path);
    if (strncmp(msg, path, pl) == 0 && strncmp(msg + pl, ": ", 2) == 0) msg += pl + 2;
    /* Decompression errors mean a damaged file, not a failing disk. */
    nb_status s = (zerr == Z_DATA_ERROR || zerr == Z_BUF_ERROR) ? NB_EFORMAT : NB_EIO;
    return nb__error(s, "%s: %s: %s: corrupt gzip data (%s)", what, path, doing, msg);
}

/* Whether zlib saw a damaged gzip stream (cut short, bad data or check value): then a
 * short read is the stream's fault and the gzip message is the useful one. */
static bool gz_damaged(gzFile f) {
    int zerr = Z_OK;
    zl.error(f, &zerr);
    return zerr != Z_OK;
}

/* Open for reading with a clear message for a missing file or a directory. */
static gzFile gz_open_read(const char *what, const char *path, int64_t *fsize) {
    struct stat sb;
    if (stat(path, &sb) != 0) {
        nb__error(NB_EIO, "%s: %s: cannot open: %s", what, path, strerror(errno));
        return NULL;
    }
    if (S_ISDIR(sb.st_mode)) {
        nb__error(NB_EIO, "%s: %s: cannot read: is a directory", what, path);
        return NULL;
    }
    if (!nb__dl_lib_load(&g_zlib, what)) return NULL;
    errno = 0;
    gzFile f = zl.open(path, "rb");
    if (!f) {
        nb__error(NB_EIO, "%s: %s: cannot open: %s", what, path,
                  errno ? strerror(errno) : "out of memory");
        return NULL;
    }
    zl.buffer(f, 1 << 18); /* larger reads: the 47 MB training images decompress faster */
    *fsize = S_ISREG(sb.st_mode) ? (int64_t)sb.st_size : -1; /* -1: size unknown (a pipe) */
    return f;
}

/* IDX type codes and what they load as. */
typedef struct {
    int code;
    const char *name;
    int bytes;       /* in the file */
    nb_dtype dtype;  /* in memory */
} idx_type;

static const idx_type idx_types[] = {
    {0x08, "u8", 1, NB_U8},   {0x09, "i8", 1, NB_I32},  {0x0B, "i16", 2, NB_I32},
    {0x0C, "i32", 4, NB_I32}, {0x0D, "f32", 4, NB_F32}, {0x0E, "f64", 8, NB_F64},
};

static const idx_type *idx_type_of(int code) {
    for (size_t i = 0; i < sizeof idx_types / sizeof idx_types[0]; i++)
        if (idx_types[i].code == code) return &idx_types[i];
    return NULL;
}

static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Convert n big-endian elements of type t in raw (in place, into the tensor's dtype). The
 * widening types (i8, i16 -> i32) are expanded from the end so the buffer can be shared. */
static void idx_to_host(void *data, int64_t n, const idx_type *t) {
    unsigned char *p = data;
    switch (t->code) {
    case 0x08: return;
    case 0x09: {
        int32_t *d = data;
        for (int64_t i = n - 1; i >= 0; i--) d[i] = (int8_t)p[i];
        return;
    }
    case 0x0B: {
        int32_t *d = data;
        for (int64_t i = n - 1; i >= 0; i--)
            d[i] = (int16_t)(uint16_t)((unsigned)p[2 * i] << 8 | p[2 * i + 1]);
        return;
    }
    case 0x0C: case 0x0D: {
        uint32_t *d = data;
        for (int64_t i = 0; i < n; i++) d[i] = be32(p + 4 * i);
        return;
    }
    default: { /* 0x0E */
        uint64_t *d = data;
        for (int64_t i = 0; i < n; i++)
            d[i] = (uint64_t)be32(p + 8 * i) << 32 | be32(p + 8 * i + 4);
        return;
    }
    }
}

static nb_tensor *idx_read(gzFile f, const char *path, int64_t fsize) {
    const char *w = "idx";
    unsigned char hdr[4 + 4 * 255];
    int64_t got = gz_read_all(f, hdr, 4);
    if (got < 0 || (got < 4 && gz_damaged(f))) {
        gz_fail(f, w, path, "reading the header");
        return NULL;
    }
    if (got == 0) {
        nb__error(NB_EFORMAT, "%s: %s: empty file (expected an IDX header)", w, path);
        return NULL;
    }
    if (got < 4) {
        nb__error(NB_EFORMAT, "%s: %s: truncated header: %lld of 4 magic bytes", w, path,
                  (long long)got);
        return NULL;
    }
    const idx_type *t = idx_type_of(hdr[2]);
    if (hdr[0] != 0 || hdr[1] != 0 || !t) {
        nb__error(NB_EFORMAT, "%s: %s: bad magic number 0x%08x: not an IDX file (expected "
                  "0x0000TTDD with type TT one of 08, 09, 0B, 0C, 0D, 0E and DD dims)", w,
                  path, be32(hdr));
        return NULL;
    }
    int ndim = hdr[3];
    if (ndim < 1 || ndim > NB_MAX_DIMS) {
        nb__error(NB_EFORMAT, "%s: %s: bad magic number 0x%08x: %d dims (nabla supports 1 to "
                  "%d)", w, path, be32(hdr), ndim, NB_MAX_DIMS);
        return NULL;
    }
    got = gz_read_all(f, hdr + 4, 4 * ndim);
    if (got < 0 || (got < 4 * ndim && gz_damaged(f))) {
        gz_fail(f, w, path, "reading the header");
        return NULL;
    }
    if (got < 4 * ndim) {
        nb__error(NB_EFORMAT, "%s: %s: truncated header: %lld of %d bytes of dims", w, path,
                  (long long)got, 4 * ndim);
        return NULL;
    }
    int64_t shape[NB_MAX_DIMS];
    int64_t numel = 1, extent = 1;
    for (int d = 0; d < ndim; d++) {
        shape[d] = be32(hdr + 4 + 4 * d);
        /* Every dim is < 2^32, so the product can only overflow past 8 dims' worth; stop
         * at a size no machine holds (2^48 bytes) before it does. The bound is on the
         * product with 0 dims counted as 1: a [0, 2^32-1, 2^32-1] file holds no data, but
         * the tensor's strides come from the other dims and would wrap. */
        int64_t d1 = shape[d] > 1 ? shape[d] : 1;
        if (extent > (INT64_C(1) << 48) / 8 / d1) {
            nb__error(NB_EFORMAT, "%s: %s: dims %s are too large to be real", w, path,
                      nb__shape_str(shape, d + 1, (char[NB__SHAPE_STR]){0}));
            return NULL;
        }
        extent *= d1;
        numel *= shape[d];
    }
    int64_t nbytes = numel * t->bytes;
    /* Before allocating: a header may promise far more than the file can hold (a damaged
     * or hostile file). A plain file holds exactly its size; deflate expands at most
     * 1032:1, which bounds a gzip file. */
    int64_t hdr_bytes = 4 + 4 * (int64_t)ndim;
    if (fsize >= 0 && zl.direct(f) && fsize - hdr_bytes < nbytes) {
        nb__error(NB_EFORMAT, "%s: %s: truncated: expected %lld bytes of data for %s %s, got "
                  "%lld", w, path, (long long)nbytes, t->name,
                  nb__shape_str(shape, ndim, (char[NB__SHAPE_STR]){0}),
                  (long long)(fsize - hdr_bytes));
        return NULL;
    }
    if (fsize >= 0 && !zl.direct(f) && nbytes / 1032 > fsize + 1024) {
        nb__error(NB_EFORMAT, "%s: %s: truncated: expected %lld bytes of data for %s %s, more "
                  "than a gzip file of %lld bytes can hold", w, path, (long long)nbytes,
                  t->name, nb__shape_str(shape, ndim, (char[NB__SHAPE_STR]){0}),
                  (long long)fsize);
        return NULL;
    }
    nb_tensor *out = nb__empty(shape, ndim, t->dtype, NB_CPU);
    if (!out) return NULL; /* ENOMEM from the allocator, which names the size */
    got = gz_read_all(f, nb__ptr(out), nbytes);
    if (got < 0) {
        gz_fail(f, w, path, "reading the data");
        goto fail;
    }
    if (got < nbytes && gz_damaged(f)) {
        gz_fail(f, w, path, "reading the data");
        goto fail;
    }
    if (got < nbytes) {
        nb__error(NB_EFORMAT, "%s: %s: truncated: expected %lld bytes of data for %s %s, got "
                  "%lld", w, path, (long long)nbytes, t->name,
                  nb__shape_str(shape, ndim, (char[NB__SHAPE_STR]){0}), (long long)got);
        goto fail;
    }
    unsigned char extra;
    got = gz_read_all(f, &extra, 1);
    if (got < 0) {
        gz_fail(f, w, path, "reading past the data");
        goto fail;
    }
    if (got > 0) {
        nb__error(NB_EFORMAT, "%s: %s: trailing bytes after the %lld bytes of data its "
                  "header promises (%s %s)", w, path, (long long)nbytes, t->name,
                  nb__shape_str(shape, ndim, (char[NB__SHAPE_STR]){0}));
        goto fail;
    }
    /* All data read and nothing after it; a gzip stream must also have ended cleanly (its
     * CRC and length trailer present and right). */
    if (gz_damaged(f)) {
        gz_fail(f, w, path, "reading the end of the file");
        goto fail;
    }
    idx_to_host(nb__ptr(out), numel, t);
    return out;
fail:
    nb_tensor_free(nb__scope_take(out));
    return NULL;
}

nb_tensor *nb_idx_read(const char *path) {
    if (!path) {
        nb__error(NB_ENULL, "idx_read: argument 'path' is NULL");
        return NULL;
    }
    int64_t fsize = 0;
    gzFile f = gz_open_read("idx", path, &fsize);
    if (!f) return NULL;
    nb_tensor *t = idx_read(f, path, fsize);
    zl.close(f);
    return t;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

nb_status nb_idx_write(const char *path, const nb_tensor *t) {
    const char *w = "idx_write";
    if (!path) return nb__error(NB_ENULL, "%s: argument 'path' is NULL", w);
    if (!t) return nb__error(NB_ENULL, "%s: argument 't' is NULL", w);
    int code;
    switch (t->dtype) {
    case NB_U8: code = 0x08; break;
    case NB_I32: code = 0x0C; break;
    case NB_F32: code = 0x0D; break;
    case NB_F64: code = 0x0E; break;
    default:
        return nb__error(NB_EDTYPE, "%s: %s: IDX stores u8, i32, f32 and f64, not %s "
                         "(convert with nb_to_dtype)", w, path, nb_dtype_name(t->dtype));
    }
    if (t->ndim < 1)
        return nb__error(NB_EDIM, "%s: %s: IDX needs at least one dim (got a 0-dim tensor)",
                         w, path);
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] > (int64_t)UINT32_MAX)
            return nb__error(NB_ESHAPE, "%s: %s: dim %d of %s does not fit IDX's 32 bits", w,
                             path, d, NB__SHAPE(t));
    /* The elements in order on the host: t itself or a contiguous copy (from another
     * device: a host copy; a meta tensor has no data and fails here, before any file is
     * created). */
    nb_tensor *c = nb__host_accessible(t) ? nb_contiguous(nb__mut(t))
                                          : nb_to_device(nb__mut(t), NB_CPU);
    if (!c) return nb_last_status();
    c = nb__scope_take(c);
    unsigned char hdr[4 + 4 * NB_MAX_DIMS] = {0, 0, (unsigned char)code,
                                             (unsigned char)t->ndim};
    for (int d = 0; d < t->ndim; d++) {
        uint32_t v = (uint32_t)t->shape[d];
        unsigned char *p = hdr + 4 + 4 * d;
        p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
        p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
    }
    if (!nb__dl_lib_load(&g_zlib, w)) {
        nb_tensor_free(c);
        return nb_last_status();
    }
    /* "T": a plain (transparent) file through the same gz interface. */
    errno = 0;
    gzFile f = zl.open(path, ends_with(path, ".gz") ? "wb6" : "wbT");
    if (!f) {
        nb_tensor_free(c);
        return nb__error(NB_EIO, "%s: %s: cannot create: %s", w, path,
                         errno ? strerror(errno) : "out of memory");
    }
    nb_status st = NB_OK;
    size_t es = nb_dtype_size(t->dtype);
    int64_t numel = nb_numel(t);
    /* Elements in order, big-endian, through a small buffer. */
    enum { CHUNK = 8192 };
    unsigned char buf[CHUNK * 8];
    if (zl.write(f, hdr, (unsigned)(4 + 4 * t->ndim)) != 4 + 4 * t->ndim) goto io;
    const unsigned char *src = (const unsigned char *)nb__ptr(c);
    for (int64_t i = 0; i < numel; i += CHUNK) {
        int64_t n = numel - i < CHUNK ? numel - i : CHUNK;
        const unsigned char *s = src + (size_t)i * es;
        for (int64_t k = 0; k < n; k++) {
            uint64_t v = 0;
            if (es == 1) v = s[k];
            else if (es == 4) {
                uint32_t u;
                memcpy(&u, s + 4 * k, 4);
                v = u;
            } else memcpy(&v, s + 8 * k, 8);
            for (size_t b = 0; b < es; b++)
                buf[(size_t)k * es + b] = (unsigned char)(v >> (8 * (es - 1 - b)));
        }
        if (zl.write(f, buf, (unsigned)((size_t)n * es)) != (int)((size_t)n * es)) goto io;
    }
    nb_tensor_free(c);
    if (zl.close(f) != Z_OK) return nb__error(NB_EIO, "%s: %s: write failed: %s", w, path,
                                             errno ? strerror(errno) : "zlib error");
    return NB_OK;
io:
    nb_tensor_free(c);
    st = nb__error(NB_EIO, "%s: %s: write failed: %s", w, path,
                   errno ? strerror(errno) : "zlib error");
    zl.close(f);
    return st;
}

static void free_buffer(void *data, void *ctx) {
    (void)ctx;
    free(data);
}

nb_tensor *nb_read_bytes(const char *path) {
    const char *w = "read_bytes";
    if (!path) {
        nb__error(NB_ENULL, "%s: argument 'path' is NULL", w);
        return NULL;
    }
    int64_t fsize = 0;
    gzFile f = gz_open_read(w, path, &fsize);
    if (!f) return NULL;
    /* The decompressed size is not known up front: grow a buffer, then hand it to a tensor
     * without a copy. */
    int64_t cap = fsize > 0 ? fsize : 4096;
    int64_t len = 0;
    unsigned char *buf = malloc((size_t)cap);
    if (!buf) goto nomem;
    for (;;) {
        int64_t got = gz_read_all(f, buf + len, cap - len);
        if (got < 0) {
            gz_fail(f, w, path, "reading");
            free(buf);
            zl.close(f);
            return NULL;
        }
        len += got;
        if (len < cap) break;
        unsigned char *nbuf = realloc(buf, (size_t)cap * 2);
        if (!nbuf) goto nomem;
        buf = nbuf;
        cap *= 2;
    }
    if (gz_damaged(f)) { /* e.g. a .gz cut short: its data would be silently incomplete */
        gz_fail(f, w, path, "reading the end of the file");
        free(buf);
        zl.close(f);
        return NULL;
    }
    zl.close(f);
    nb_tensor *t = nb_wrap_buffer(buf, (int64_t[]){len}, 1, NB_U8, free_buffer, NULL);
    if (!t) free(buf);
    return t;
nomem:
    free(buf);
    zl.close(f);
    nb__error(NB_ENOMEM, "%s: %s: out of memory", w, path);
    return NULL;
}
