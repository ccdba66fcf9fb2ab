/* safetensors.c - the safetensors file format: a validating reader over a memory-mapped file
 * whose tensors view the mapping without copying, and an atomic writer that lays files out
 * exactly as the reference implementation (huggingface/safetensors) does.
 *
 * Format: 8-byte little-endian header length N, N bytes of UTF-8 JSON (an object mapping
 * each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} plus an optional
 * "__metadata__" string map), then the data buffer, which the tensors' byte ranges must
 * cover exactly (no gaps, no overlaps, nothing left over). The JSON goes through jansson.
 *
 * Saving takes tensors of any device with data: host tensors are written from their memory,
 * others (CUDA, guard) through a host copy, one tensor at a time. Meta tensors have no data
 * and are refused (NB_EDEVICE). Loaded tensors are host tensors (views of the mapping). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <xxhash.h>

#include "nabla/autograd.h"
#include "io/io_impl.h"
#include "nabla/io.h"
#include "tensor/backend.h"
#include "tensor/handle.h"
#include "tensor/tensor_impl.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (the format's byte order)"
#endif

/* The reference implementation refuses larger headers; so do we (a bad length must not make
 * us parse gigabytes). */
#define ST_MAX_HEADER 100000000ull

/* Dtypes of the format. Those nabla lacks are still understood (so a file holding them is
 * validated and its other tensors are readable); nb_safetensors_get rejects them. */
typedef struct st_dtype {
    const char *name;
    int size;
    int nb; /* nb_dtype, or -1 */
} st_dtype;

static const st_dtype st_dtypes[] = {
    {"F64", 8, NB_F64},  {"F32", 4, NB_F32},     {"F16", 2, NB_F16},     {"BF16", 2, NB_BF16},
    {"I64", 8, NB_I64},  {"I32", 4, NB_I32},     {"U8", 1, NB_U8},       {"BOOL", 1, NB_BOOL},
    {"I8", 1, -1},       {"I16", 2, -1},         {"U16", 2, -1},         {"U32", 4, -1},
    {"U64", 8, -1},      {"F8_E4M3", 1, -1},     {"F8_E5M2", 1, -1},     {"F8_E8M0", 1, -1},
    {"C64", 8, -1},
};
#define ST_NDTYPES ((int)(sizeof st_dtypes / sizeof st_dtypes[0]))

static int st_dtype_of_nb(nb_dtype dt) {
    for (int i = 0; i < ST_NDTYPES; i++)
        if (st_dtypes[i].nb == (int)dt) return i;
    return -1;
}

/* The reference writer orders tensors by its dtype enum, largest first, then by name; its
 * enum puts wider types later, so the data of every tensor is aligned to its element size.
 * These ranks reproduce that order for nabla's dtypes. */
static int write_rank(nb_dtype dt) {
    switch (dt) {
    case NB_I64: return 7;
    case NB_F64: return 6;
    case NB_F32: return 5;
    case NB_I32: return 4;
    case NB_BF16: return 3;
    case NB_F16: return 2;
    case NB_U8: return 1;
    default: return 0; /* NB_BOOL */
    }
}

static const char *errno_str(int e, char *buf, size_t n) {
    return strerror_r(e, buf, n); /* GNU variant (the build defines _GNU_SOURCE) */
}
#define ERRNO_STR(e) errno_str((e), (char[128]){0}, 128)

/* ---- the mapping, shared by the handle and every tensor that views it -------------------------- */
typedef struct st_map {
    atomic_long refs;
    void *base;
    size_t size;
    bool mapped; /* mmap'ed (else a malloc'ed copy, when the file cannot be mapped) */
} st_map;

static void map_unref(st_map *m) {
    if (!m || atomic_fetch_sub(&m->refs, 1) != 1) return;
    if (m->mapped) munmap(m->base, m->size);
    else free(m->base);
    free(m);
}

/* nb_wrap_buffer's release callback: the last tensor over the mapping lets it go. */
static void map_release(void *data, void *ctx) {
    (void)data;
    map_unref(ctx);
}

/* Map the whole file copy-on-write: tensors over it may be written (by accident or by an
 * optimizer) without faulting and without touching the file. MAP_NORESERVE keeps a large
 * model from being charged against the commit limit for pages that are only read. */
static st_map *map_file(int fd, size_t size, const char *path) {
    st_map *m = calloc(1, sizeof *m);
    if (!m) {
        nb__error(NB_ENOMEM, "safetensors_open: out of memory");
        return NULL;
    }
    atomic_init(&m->refs, 1);
    m->size = size;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd, 0);
    if (p != MAP_FAILED) {
        m->base = p;
        m->mapped = true;
        return m;
    }
    /* Some file systems cannot map files: read it instead. */
    m->base = malloc(size);
    if (!m->base) {
        free(m);
        nb__error(NB_ENOMEM, "safetensors_open: out of memory reading %s (%zu bytes)", path, size);
        return NULL;
    }
    size_t done = 0;
    while (done < size) {
        ssize_t r = pread(fd, (char *)m->base + done, size - done, (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            free(m->base);
            free(m);
            nb__error(NB_EIO, "safetensors_open: cannot read %s: %s", path, ERRNO_STR(e));
            return NULL;
        }
        done += (size_t)r;
    }
    return m;
}

/* ---- the handle ---------------------------------------------------------------------------------- */
typedef struct st_entry {
    const char *name; /* a key of root */
    int kind;         /* index into st_dtypes */
    int ndim;
    int64_t shape[NB_MAX_DIMS];
    uint64_t begin, end;
} st_entry;

struct nb_safetensors {
    nb__obj h; /* a checked handle (tensor/handle.h) */
    char *path;
    st_map *map;
    const unsigned char *data; /* the data buffer, after the header */
    uint64_t data_size;
    json_t *root;
    int count;
    st_entry *entries;  /* in data order */
    st_entry **by_name; /* sorted by name, for lookups */
    int nmeta;
    const char **meta_keys, **meta_values;
};

static void handle_free(nb_safetensors *f) {
    if (!f) return;
    map_unref(f->map);
    if (f->root) json_decref(f->root);
    free(f->entries);
    free(f->by_name);
    free(f->meta_keys);
    free(f->meta_values);
    free(f->path);
    nb__obj_free(f);
}

/* A live handle, or quietly false for NULL (the error set for a closed one). */
#define LIVE(f, op) ((f) && nb__obj_ok((f), NB__OBJ_SAFETENSORS, (op)))
void nb_safetensors_close(nb_safetensors *f) {
    if (LIVE(f, "safetensors_close")) handle_free(f);
}

/* "[2,3]" for a shape, with "..." past NB_MAX_DIMS stored dims. */
static const char *shape_str(const st_entry *e, char *buf) {
    int n = e->ndim < NB_MAX_DIMS ? e->ndim : NB_MAX_DIMS;
    nb__shape_str(e->shape, n, buf);
    if (e->ndim > NB_MAX_DIMS) {
        size_t len = strlen(buf);
        snprintf(buf + len - 1, NB__SHAPE_STR + 32 - (len - 1), ",... (%d dims)]", e->ndim);
    }
    return buf;
}
#define ST_SHAPE(e) shape_str((e), (char[NB__SHAPE_STR + 32]){0})

/* A JSON integer that is >= 0 (false otherwise). */
static bool get_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

static nb_status parse_metadata(nb_safetensors *f, json_t *v) {
    if (json_is_null(v)) return NB_OK; /* the reference accepts null as "no metadata" */
    if (!json_is_object(v))
        return nb__error(NB_EFORMAT, "safetensors_open: %s: \"__metadata__\" is not a JSON object",
                         f->path);
    size_t n = json_object_size(v);
    f->meta_keys = calloc(n ? n : 1, sizeof(char *));
    f->meta_values = calloc(n ? n : 1, sizeof(char *));
    if (!f->meta_keys || !f->meta_values)
        return nb__error(NB_ENOMEM, "safetensors_open: out of memory");
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val) {
        if (!json_is_string(val))
            return nb__error(NB_EFORMAT,
                             "safetensors_open: %s: \"__metadata__\" must map strings to strings, "
                             "but the value of \"%s\" is not a string", f->path, key);
        f->meta_keys[f->nmeta] = key;
        f->meta_values[f->nmeta++] = json_string_value(val);
    }
    return NB_OK;
}

static nb_status parse_entry(nb_safetensors *f, const char *name, json_t *v, st_entry *e) {
    const char *p = f->path;
    e->name = name;
    if (!json_is_object(v))
        return nb__error(NB_EFORMAT, "safetensors_open: %s: the entry of tensor \"%s\" is not a "
                         "JSON object", p, name);
    json_t *jd = json_object_get(v, "dtype");
    if (!json_is_string(jd))
        return nb__error(NB_EFORMAT, "safetensors_open: %s: tensor \"%s\" has no \"dtype\" string",
                         p, name);
    e->kind = -1;
    for (int i = 0; i < ST_NDTYPES; i++)
        if (strcmp(json_string_value(jd), st_dtypes[i].name) == 0) e->kind = i;
    if (e->kind < 0)
        return nb__error(NB_EFORMAT, "safetensors_open: %s: tensor \"%s\" has unknown dtype \"%s\"",
                         p, name, json_string_value(jd));

    json_t *js = json_object_get(v, "shape");
    if (!json_is_array(js))
        return nb__error(NB_EFORMAT, "safetensors_open: %s: tensor \"%s\" has no \"shape\" list",
                         p, name);
    size_t nd = json_array_size(js);
    if (nd > 1024) /* no real tensor has this many; keeps ndim an int */
        return nb__error(NB_EFORMAT, "safetensors_open: %s: tensor \"%s\" has %zu dims", p, name, nd);
    e->ndim = (int)nd;
    /* numel gives the data's size; extent (0 dims counted as 1) bounds the strides, which
     * come from the other dims even when a 0 dim makes the tensor empty. */
    uint64_t numel = 1, extent = 1;
    bool overflow = false;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (!get_u64(json_array_get(js, i), &d) || d > INT64_MAX)
            return nb__error(NB_EFORMAT, "safetensors_open: %s: the shape of tensor \"%s\" is not a "
                             "list of non-negative integers", p, name);
        if (i < NB_MAX_DIMS) e->shape[i] = (int64_t)d;
        overflow |= __builtin_mul_overflow(numel, d, &numel);
        overflow |= __builtin_mul_overflow(extent, d > 1 ? d : 1, &extent);
    }
    uint64_t nbytes;
    if (overflow || extent > (uint64_t)INT64_MAX / NB__MAX_ELEM ||
        __builtin_mul_overflow(numel, (uint64_t)st_dtypes[e->kind].size, &nbytes))
        return nb__error(NB_EFORMAT, "safetensors_open: %s: the shape %s of tensor \"%s\" is too "
                         "large", p, ST_SHAPE(e), name);

    json_t *jo = json_object_get(v, "data_offsets");
    if (!json_is_array(jo) || json_array_size(jo) != 2 ||
        !get_u64(json_array_get(jo, 0), &e->begin) || !get_u64(json_array_get(jo, 1), &e->end))
        return nb__error(NB_EFORMAT, "safetensors_open: %s: tensor \"%s\" needs \"data_offsets\" "
                         "as two non-negative integers [begin, end]", p, name);
    if (e->begin > e->end)
        return nb__error(NB_EFORMAT, "safetensors_open: %s: tensor \"%s\" has data_offsets "
                         "[%llu, %llu] that end before they begin", p, name,
                         (unsigned long long)e->begin, (unsigned long long)e->end);
    if (e->end > f->data_size)
        return nb__error(NB_EFORMAT, "safetensors_open: %s: tensor \"%s\" has data_offsets "
                         "[%llu, %llu] beyond the %llu bytes of data in the file (truncated?)", p,
                         name, (unsigned long long)e->begin, (unsigned long long)e->end,
                         (unsigned long long)f->data_size);
    if (e->end - e->begin != nbytes)
        return nb__error(NB_EFORMAT, "safetensors_open: %s: tensor \"%s\" has data_offsets "
                         "[%llu, %llu] (%llu bytes) but shape %s of %s needs %llu bytes", p, name,
                         (unsigned long long)e->begin, (unsigned long long)e->end,
                         (unsigned long long)(e->end - e->begin), ST_SHAPE(e),
                         st_dtypes[e->kind].name, (unsigned long long)nbytes);
    return NB_OK;
}

static int cmp_offsets(const void *a, const void *b) {
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp((*(st_entry *const *)a)->name, (*(st_entry *const *)b)->name);
}

/* The data ranges must tile [0, data_size) exactly, as the reference validation demands:
 * otherwise bytes would be shared by two tensors or belong to none. */
static nb_status check_tiling(nb_safetensors *f) {
    qsort(f->entries, (size_t)f->count, sizeof(st_entry), cmp_offsets);
    uint64_t cursor = 0;
    const st_entry *prev = NULL;
    for (int i = 0; i < f->count; i++) {
        const st_entry *e = &f->entries[i];
        if (e->begin < cursor)
            return nb__error(NB_EFORMAT, "safetensors_open: %s: the data of tensors \"%s\" "
                             "[%llu, %llu] and \"%s\" [%llu, %llu] overlap", f->path, prev->name,
                             (unsigned long long)prev->begin, (unsigned long long)prev->end,
                             e->name, (unsigned long long)e->begin, (unsigned long long)e->end);
        if (e->begin > cursor)
            return nb__error(NB_EFORMAT, "safetensors_open: %s: a gap of %llu bytes not used by "
                             "any tensor lies before tensor \"%s\" (data_offsets [%llu, %llu])",
                             f->path, (unsigned long long)(e->begin - cursor), e->name,
                             (unsigned long long)e->begin, (unsigned long long)e->end);
        cursor = e->end;
        prev = e;
    }
    if (cursor != f->data_size)
        return nb__error(NB_EFORMAT, "safetensors_open: %s: the last %llu of its %llu bytes of "
                         "data are not used by any tensor", f->path,
                         (unsigned long long)(f->data_size - cursor),
                         (unsigned long long)f->data_size);
    return NB_OK;
}

static nb_status parse_header(nb_safetensors *f) {
    const unsigned char *base = f->map->base;
    uint64_t size = f->map->size, n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | base[i];
    if (n > ST_MAX_HEADER)
        return nb__error(NB_EFORMAT, "safetensors_open: %s: header length %llu exceeds the "
                         "limit of %llu bytes (not a safetensors file?)", f->path,
                         (unsigned long long)n, ST_MAX_HEADER);
    if (n > size - 8)
        return nb__error(NB_EFORMAT, "safetensors_open: %s: header length %llu is larger than "
                         "the %llu bytes that follow it (truncated or not a safetensors file?)",
                         f->path, (unsigned long long)n, (unsigned long long)(size - 8));
    f->data = base + 8 + n;
    f->data_size = size - 8 - n;

    json_error_t err;
    f->root = json_loadb((const char *)base + 8, (size_t)n, JSON_REJECT_DUPLICATES, &err);
    if (!f->root)
        return nb__error(NB_EFORMAT, "safetensors_open: %s: the header is not valid JSON: %s "
                         "(header byte %d)", f->path, err.text, err.position);
    if (!json_is_object(f->root))
        return nb__error(NB_EFORMAT, "safetensors_open: %s: the header is not a JSON object",
                         f->path);

    size_t nkeys = json_object_size(f->root);
    f->entries = calloc(nkeys ? nkeys : 1, sizeof(st_entry));
    f->by_name = calloc(nkeys ? nkeys : 1, sizeof(st_entry *));
    if (!f->entries || !f->by_name) return nb__error(NB_ENOMEM, "safetensors_open: out of memory");
    const char *key;
    json_t *val;
    json_object_foreach(f->root, key, val) {
        nb_status s = strcmp(key, "__metadata__") == 0
                          ? parse_metadata(f, val)
                          : parse_entry(f, key, val, &f->entries[f->count++]);
        if (s != NB_OK) return s;
    }
    nb_status s = check_tiling(f);
    if (s != NB_OK) return s;
    for (int i = 0; i < f->count; i++) f->by_name[i] = &f->entries[i];
    qsort(f->by_name, (size_t)f->count, sizeof(st_entry *), cmp_names);
    return NB_OK;
}

nb_safetensors *nb_safetensors_open(const char *path) {
    if (!path) {
        nb__error(NB_ENULL, "safetensors_open: path is NULL");
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        nb__error(NB_EIO, "safetensors_open: cannot open %s: %s", path, ERRNO_STR(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        nb__error(NB_EIO, "safetensors_open: cannot stat %s: %s", path, ERRNO_STR(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        nb__error(NB_EIO, "safetensors_open: %s is %s, not a regular file", path,
                  S_ISDIR(st.st_mode) ? "a directory" : "a special file");
        close(fd);
        return NULL;
    }
    if (st.st_size < 8) {
        nb__error(NB_EFORMAT, "safetensors_open: %s is %lld bytes long, too short for a "
                  "safetensors file (which starts with an 8-byte header length)", path,
                  (long long)st.st_size);
        close(fd);
        return NULL;
    }
    nb_safetensors *f = nb__obj_alloc(sizeof *f, NB__OBJ_SAFETENSORS);
    if (f) f->path = strdup(path);
    if (!f || !f->path) {
        nb__obj_free(f);
        close(fd);
        nb__error(NB_ENOMEM, "safetensors_open: out of memory");
        return NULL;
    }
    f->map = map_file(fd, (size_t)st.st_size, path);
    close(fd);
    if (!f->map || parse_header(f) != NB_OK) {
        handle_free(f);
        return NULL;
    }
    return f;
}

/* ---- queries ------------------------------------------------------------------------------------- */
const char *nb_safetensors_path(const nb_safetensors *f) {
    return LIVE(f, "safetensors_path") ? f->path : NULL;
}
int nb_safetensors_count(const nb_safetensors *f) {
    return LIVE(f, "safetensors_count") ? f->count : 0;
}

const char *nb_safetensors_name(const nb_safetensors *f, int i) {
    return LIVE(f, "safetensors_name") && i >= 0 && i < f->count ? f->entries[i].name : NULL;
}

static const st_entry *find_entry(const nb_safetensors *f, const char *name) {
    if (!LIVE(f, "safetensors_find") || !name) return NULL;
    st_entry key = {.name = name}, *kp = &key;
    st_entry **hit = bsearch(&kp, f->by_name, (size_t)f->count, sizeof(st_entry *), cmp_names);
    return hit ? *hit : NULL;
}

int nb_safetensors_find(const nb_safetensors *f, const char *name) {
    const st_entry *e = find_entry(f, name);
    return e ? (int)(e - f->entries) : -1;
}

nb_status nb_safetensors_info_at(const nb_safetensors *f, int i, nb_safetensors_info *out) {
    if (!f || !out) return nb__error(NB_ENULL, "safetensors_info: %s is NULL", f ? "out" : "f");
    if (!LIVE(f, "safetensors_info")) return nb_last_status();
    if (i < 0 || i >= f->count)
        return nb__error(NB_EINDEX, "safetensors_info: index %d is out of range for %s, which "
                         "holds %d tensors", i, f->path, f->count);
    const st_entry *e = &f->entries[i];
    memset(out, 0, sizeof *out);
    out->name = e->name;
    out->dtype_name = st_dtypes[e->kind].name;
    out->dtype = st_dtypes[e->kind].nb >= 0 ? (nb_dtype)st_dtypes[e->kind].nb : NB_DTYPE_COUNT;
    out->supported = st_dtypes[e->kind].nb >= 0 && e->ndim <= NB_MAX_DIMS;
    out->ndim = e->ndim;
    memcpy(out->shape, e->shape, sizeof out->shape);
    out->data_begin = e->begin;
    out->data_end = e->end;
    return NB_OK;
}

const char *nb_safetensors_metadata(const nb_safetensors *f, const char *key) {
    if (!LIVE(f, "safetensors_metadata") || !key) return NULL;
    for (int i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

int nb_safetensors_metadata_count(const nb_safetensors *f) {
    return LIVE(f, "safetensors_metadata_count") ? f->nmeta : 0;
}

const char *nb_safetensors_metadata_key(const nb_safetensors *f, int i) {
    return LIVE(f, "safetensors_metadata_key") && i >= 0 && i < f->nmeta ? f->meta_keys[i]
                                                                         : NULL;
}

/* ---- tensors ------------------------------------------------------------------------------------- */
static const st_entry *get_checked(nb_safetensors *f, const char *name, const char *op) {
    if (!f || !name) {
        nb__error(NB_ENULL, "%s: %s is NULL", op, f ? "name" : "f");
        return NULL;
    }
    if (!LIVE(f, op)) return NULL;
    const st_entry *e = find_entry(f, name);
    if (!e) {
        nb__error(NB_EINVAL, "%s: %s has no tensor \"%s\"", op, f->path, name);
        return NULL;
    }
    if (st_dtypes[e->kind].nb < 0) {
        nb__error(NB_EDTYPE, "%s: tensor \"%s\" in %s has dtype %s, which nabla does not support",
                  op, name, f->path, st_dtypes[e->kind].name);
        return NULL;
    }
    if (e->ndim > NB_MAX_DIMS) {
        nb__error(NB_EUNSUPPORTED, "%s: tensor \"%s\" in %s has %d dims; nabla tensors have at "
                  "most %d", op, name, f->path, e->ndim, NB_MAX_DIMS);
        return NULL;
    }
    return e;
}

/* ---- checksums ------------------------------------------------------------------------------ */
/* Metadata "checksum.<tensor name>" = "xxh3-64:<16 hex digits>": the XXH3 64-bit hash of the
 * tensor's bytes as stored, written by nb__safetensors_save_checked. */
#define SUM_PREFIX "checksum."
#define SUM_ALGO "xxh3-64:"

static void format_sum(const void *p, size_t n, char out[sizeof SUM_ALGO + 16]) {
    snprintf(out, sizeof SUM_ALGO + 16, SUM_ALGO "%016llx",
             (unsigned long long)XXH3_64bits(p, n));
}

nb_status nb_safetensors_verify(nb_safetensors *f, int *checked) {
    const char *op = "safetensors_verify";
    if (checked) *checked = 0;
    if (!f) return nb__error(NB_ENULL, "%s: f is NULL", op);
    if (!LIVE(f, op)) return nb_last_status();
    int n = 0;
    for (int i = 0; i < f->count; i++) {
        const st_entry *e = &f->entries[i];
        char key[512], sum[sizeof SUM_ALGO + 16];
        snprintf(key, sizeof key, SUM_PREFIX "%s", e->name);
        const char *want = nb_safetensors_metadata(f, key);
        if (!want) continue;
        if (strncmp(want, SUM_ALGO, sizeof SUM_ALGO - 1) != 0)
            return nb__error(NB_EFORMAT, "%s: %s: tensor \"%s\" has a checksum of an unknown kind "
                             "(\"%.40s\"; this reader knows " SUM_ALGO ")", op, f->path, e->name,
                             want);
        format_sum(f->data + e->begin, (size_t)(e->end - e->begin), sum);
        if (strcmp(sum, want) != 0)
            return nb__error(NB_EFORMAT, "%s: %s is corrupt: the bytes of tensor \"%s\" hash to %s, "
                             "the file recorded %s (a torn write or a damaged disk)", op, f->path,
                             e->name, sum + sizeof SUM_ALGO - 1, want + sizeof SUM_ALGO - 1);
        n++;
    }
    if (checked) *checked = n;
    return NB_OK;
}

/* True when BOOL data holds only 0 and 1 (nabla's bool representation). */
static bool bool_bytes_ok(const unsigned char *p, uint64_t n) {
    unsigned char any = 0;
    for (uint64_t i = 0; i < n; i++) any |= p[i];
    return any <= 1;
}

static nb_tensor *get_tensor(nb_safetensors *f, const char *name, bool copy, const char *op) {
    const st_entry *e = get_checked(f, name, op);
    if (!e) return NULL;
    nb_dtype dt = (nb_dtype)st_dtypes[e->kind].nb;
    const unsigned char *src = f->data + e->begin;
    uint64_t nbytes = e->end - e->begin;
    bool bad_bool = dt == NB_BOOL && !bool_bytes_ok(src, nbytes);
    /* Zero copy needs element alignment: kernels load whole elements through typed pointers.
     * Files from the reference writer (and ours) are aligned; others may not be. */
    bool aligned = ((uintptr_t)src % (uintptr_t)st_dtypes[e->kind].size) == 0;
    if (!copy && !bad_bool && aligned && nbytes > 0) {
        atomic_fetch_add(&f->map->refs, 1);
        nb_tensor *t = nb_wrap_buffer(nb__unconst(src), e->shape, e->ndim, dt, map_release, f->map);
        if (!t) map_unref(f->map);
        return t;
    }
    nb_tensor *t = nb_empty_on(NB_CPU, e->shape, e->ndim, dt);
    if (!t) return NULL;
    unsigned char *dst = nb_data(t);
    if (bad_bool)
        for (uint64_t i = 0; i < nbytes; i++) dst[i] = src[i] != 0;
    else if (nbytes)
        memcpy(dst, src, (size_t)nbytes);
    return t;
}

nb_tensor *nb_safetensors_get(nb_safetensors *f, const char *name) {
    return get_tensor(f, name, false, "safetensors_get");
}

nb_tensor *nb_safetensors_get_copy(nb_safetensors *f, const char *name) {
    return get_tensor(f, name, true, "safetensors_get_copy");
}

/* ---- writing ------------------------------------------------------------------------------------- */
typedef struct w_item {
    const char *name;
    nb_tensor *t;
    int rank;
    int index; /* in the caller's list */
} w_item;

static int cmp_write_order(const void *a, const void *b) {
    const w_item *x = a, *y = b;
    if (x->rank != y->rank) return y->rank - x->rank;
    return strcmp(x->name, y->name);
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* NULL, or the first string that appears twice in strs[0..n). */
static const char *first_duplicate(const char *const *strs, int n, nb_status *st) {
    *st = NB_OK;
    if (n < 2) return NULL;
    const char **s = malloc(sizeof(char *) * (size_t)n);
    if (!s) {
        *st = nb__error(NB_ENOMEM, "safetensors_save: out of memory");
        return NULL;
    }
    memcpy(s, strs, sizeof(char *) * (size_t)n);
    qsort(s, (size_t)n, sizeof(char *), cmp_str_ptr);
    const char *dup = NULL;
    for (int i = 1; i < n && !dup; i++)
        if (strcmp(s[i - 1], s[i]) == 0) dup = s[i];
    free(s);
    return dup;
}

static nb_status check_save_args(const char *path, const char *const *names,
                                 nb_tensor *const *tensors, int n, const char *const *meta_keys,
                                 const char *const *meta_values, int nmeta) {
    const char *op = "safetensors_save";
    if (!path) return nb__error(NB_ENULL, "%s: path is NULL", op);
    if (n < 0 || nmeta < 0)
        return nb__error(NB_EINVAL, "%s: negative count (n = %d, nmeta = %d)", op, n, nmeta);
    if (n > 0 && (!names || !tensors))
        return nb__error(NB_ENULL, "%s: %s is NULL", op, names ? "tensors" : "names");
    if (nmeta > 0 && (!meta_keys || !meta_values))
        return nb__error(NB_ENULL, "%s: %s is NULL", op, meta_keys ? "meta_values" : "meta_keys");
    for (int i = 0; i < n; i++) {
        if (!names[i]) return nb__error(NB_ENULL, "%s: names[%d] is NULL", op, i);
        if (strcmp(names[i], "__metadata__") == 0)
            return nb__error(NB_EINVAL, "%s: \"__metadata__\" is reserved and cannot name a tensor",
                             op);
        if (!tensors[i]) {
            if (nb_last_status() == NB_OK)
                nb__error(NB_ENULL, "%s: tensor \"%s\" is NULL", op, names[i]);
            return nb_last_status();
        }
        const nb__backend *be = nb__backend_of(nb__device_of(tensors[i]), op);
        if (!be) return nb_last_status();
        if (!be->has_storage)
            return nb__error(NB_EDEVICE, "%s: tensor \"%s\" is on the %s device, which holds no "
                             "data to save", op, names[i], be->name);
    }
    for (int i = 0; i < nmeta; i++)
        if (!meta_keys[i] || !meta_values[i])
            return nb__error(NB_ENULL, "%s: metadata %s %d is NULL", op,
                             meta_keys[i] ? "value" : "key", i);
    nb_status st;
    const char *dup = first_duplicate(names, n, &st);
    if (st != NB_OK) return st;
    if (dup) return nb__error(NB_EINVAL, "%s: two tensors are named \"%s\"", op, dup);
    dup = first_duplicate(meta_keys, nmeta, &st);
    if (st != NB_OK) return st;
    if (dup) return nb__error(NB_EINVAL, "%s: metadata key \"%s\" appears twice", op, dup);
    return NB_OK;
}

/* Build the compact JSON header (tensor entries in write order). NULL + error on failure. */
static char *build_header(const w_item *items, int n, const char *const *meta_keys,
                          const char *const *meta_values, int nmeta) {
    const char *op = "safetensors_save";
    json_t *root = json_object();
    bool ok = root != NULL;
    if (ok && nmeta > 0) {
        json_t *meta = json_object();
        ok = meta && json_object_set_new(root, "__metadata__", meta) == 0;
        for (int i = 0; ok && i < nmeta; i++) {
            json_t *v = json_string(meta_values[i]);
            if (!v || json_object_set_new(meta, meta_keys[i], v) != 0) {
                json_decref(root);
                nb__error(NB_EINVAL, "%s: metadata \"%s\" is not valid UTF-8", op, meta_keys[i]);
                return NULL;
            }
        }
    }
    uint64_t offset = 0;
    for (int i = 0; ok && i < n; i++) {
        const nb_tensor *t = items[i].t;
        uint64_t nbytes = (uint64_t)nb_numel(t) * nb_dtype_size(t->dtype);
        json_t *e = json_object(), *shape = json_array(), *offs = json_array();
        ok = e && shape && offs;
        ok = ok && json_object_set_new(e, "dtype",
                                       json_string(st_dtypes[st_dtype_of_nb(t->dtype)].name)) == 0;
        for (int d = 0; ok && d < t->ndim; d++)
            ok = json_array_append_new(shape, json_integer(t->shape[d])) == 0;
        ok = ok && json_array_append_new(offs, json_integer((json_int_t)offset)) == 0 &&
             json_array_append_new(offs, json_integer((json_int_t)(offset + nbytes))) == 0;
        ok = ok && json_object_set_new(e, "shape", shape) == 0;
        shape = NULL;
        ok = ok && json_object_set_new(e, "data_offsets", offs) == 0;
        offs = NULL;
        if (ok && json_object_set_new(root, items[i].name, e) != 0) {
            json_decref(root);
            nb__error(NB_EINVAL, "%s: tensor name \"%s\" is not valid UTF-8", op, items[i].name);
            return NULL;
        }
        if (!ok) {
            json_decref(e);
            json_decref(shape);
            json_decref(offs);
        }
        offset += nbytes;
    }
    char *s = ok ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (!s) nb__error(NB_ENOMEM, "%s: out of memory building the header", op);
    return s;
}

static int write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return errno;
        if (w == 0) return EIO;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

_Thread_local int nb__slow_write_ms; /* test hook, io_impl.h */

/* Write the header and the tensors' bytes to fd; an errno value, or -1 for a nabla error
 * (already set), or 0. */
static int write_contents(int fd, const char *json, const w_item *items, int n) {
    size_t len = strlen(json), padded = (len + 7) / 8 * 8;
    unsigned char *head = malloc(8 + padded);
    if (!head) {
        nb__error(NB_ENOMEM, "safetensors_save: out of memory");
        return -1;
    }
    for (int i = 0; i < 8; i++) head[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(head + 8, json, len);
    memset(head + 8 + len, ' ', padded - len);
    int err = write_all(fd, head, 8 + padded);
    free(head);
    for (int i = 0; !err && i < n; i++) {
        nb_tensor *t = items[i].t;
        size_t nbytes = (size_t)nb_numel(t) * nb_dtype_size(t->dtype);
        if (i == n / 2 && nb__slow_write_ms > 0) /* half the file is out: a test's moment */
            nanosleep(&(struct timespec){nb__slow_write_ms / 1000,
                                         (long)(nb__slow_write_ms % 1000) * 1000000L}, NULL);
        if (nbytes == 0) continue;
        bool host = nb__host_accessible(t);
        if (host && nb_is_contiguous(t)) {
            err = write_all(fd, nb__ptr(t), nbytes);
            continue;
        }
        nb_scope_begin();
        bool prev = nb_set_grad_enabled(false); /* a plain copy, not a step of a graph */
        /* A contiguous host copy: nb_to_device gives one for a tensor of another device. */
        nb_tensor *c = host ? nb_contiguous(t) : nb_to_device(t, NB_CPU);
        nb_set_grad_enabled(prev);
        err = c ? write_all(fd, nb__ptr(c), nbytes) : -1;
        nb_scope_end();
    }
    return err;
}

/* Make the rename durable: sync the directory that holds path. Until that succeeds a crash
 * may bring back the old file, so a failure is an error (NB_EIO; the new file is in place).
 * File systems that cannot sync a directory (EINVAL, ENOTSUP) or a directory we may not open
 * lose nothing but that guarantee: those count as success. */
static nb_status sync_dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dir) return NB_OK;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), err = 0;
    if (fd >= 0) {
        if (fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP && errno != EOPNOTSUPP)
            err = errno;
        close(fd);
    }
    nb_status st = err ? nb__error(NB_EIO, "safetensors_save: wrote %s but cannot sync its "
                                   "directory %s: %s (after a crash the old file may be back)",
                                   path, dir, ERRNO_STR(err))
                       : NB_OK;
    free(dir);
    return st;
}

/* What a non-regular file is, for messages ("a FIFO"). */
static const char *file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    return "a special file";
}

/* The rename that ends a save replaces whatever path names, so refuse anything but a regular
 * file or a missing path: renaming over a device node, FIFO or socket would turn it into a
 * regular file (as root, saving to /dev/full replaced the device). A symbolic link counts as
 * what it points to (a dangling one as missing); the rename replaces the link itself, as it
 * always did. NB_OK, or NB_EIO with the reason. */
static nb_status check_replaceable(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        int e = errno;
        if (e == ENOENT) return NB_OK;
        return nb__error(NB_EIO, "safetensors_save: cannot check %s: %s", path, ERRNO_STR(e));
    }
    if (S_ISREG(st.st_mode)) return NB_OK;
    return nb__error(NB_EIO, "safetensors_save: %s is %s, not a regular file; refusing to "
                     "replace it", path, file_kind(st.st_mode));
}

/* Is s "PID-N" (decimal digits, a dash, decimal digits, nothing more), the tail of the name
 * of a temporary file nb_safetensors_save makes? The PID goes to *pid. */
static bool parse_temp_tail(const char *s, long *pid) {
    char *end;
    if (*s < '0' || *s > '9') return false;
    errno = 0;
    long p = strtol(s, &end, 10);
    if (errno || *end != '-' || p <= 0 || p > INT_MAX) return false;
    s = end + 1;
    if (*s < '0' || *s > '9') return false;
    errno = 0;
    (void)strtoul(s, &end, 10);
    if (errno || *end) return false;
    *pid = p;
    return true;
}

/* Remove the temporary files that writers killed during a save left behind (NAME.tmp-PID-N
 * in dir whose PID no longer runs; with base, only those of dir/base), so that repeated kills
 * do not fill the disk, and say so in one line on stderr (naming what). A file is kept when
 * its PID is ours (another thread may be writing it) or still runs (a reused PID only keeps a
 * stale file, never removes a live one), and when someone holds a lock on it: writers lock
 * their temporary file, which protects a live writer whose PID means nothing here (another
 * host, or another PID namespace sharing the directory). Best effort: it never fails. */
static void remove_stale(const char *dir, const char *base, const char *what) {
    size_t blen = base ? strlen(base) : 0;
    DIR *d = opendir(dir);
    int removed = 0;
    unsigned long long bytes = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        long pid;
        struct stat st;
        const char *tail = base ? e->d_name + blen : strstr(e->d_name, ".tmp-");
        if (base && strncmp(e->d_name, base, blen) != 0) continue;
        if (!tail || strncmp(tail, ".tmp-", 5) != 0) continue;
        while (!base && strstr(tail + 1, ".tmp-")) tail = strstr(tail + 1, ".tmp-");
        if (!parse_temp_tail(tail + 5, &pid)) continue;
        if (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        /* Only regular files are opened (opening a device can do things); read-write, as
         * NFS emulates flock with POSIX locks, which need it for an exclusive lock. */
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        int fd = openat(dirfd(d), e->d_name, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) continue;
        if (flock(fd, LOCK_EX | LOCK_NB) == 0 && unlinkat(dirfd(d), e->d_name, 0) == 0) {
            removed++;
            bytes += (unsigned long long)st.st_size;
        }
        close(fd);
    }
    if (d) closedir(d);
    if (removed)
        fprintf(stderr, "nabla: removed %d stale temporary file%s (%.1f MB) left %s %s by "
                "writers that no longer run\n", removed, removed == 1 ? "" : "s",
                (double)bytes / 1e6, base ? "next to" : "in", what);
}

void nb__remove_stale_temps(const char *path) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!*base) return;
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (dir) remove_stale(dir, base, path);
    free(dir);
}

void nb__remove_stale_temps_in(const char *dir) { remove_stale(dir, NULL, dir); }

/* The checksum metadata of the n tensors (keys "checksum.<name>", values "xxh3-64:..."), after
 * the caller's nmeta entries in keys / vals (arrays of nmeta + n), the strings in text. */
static nb_status add_checksums(const w_item *items, int n, const char **keys, const char **vals,
                               int nmeta, char **text, uint64_t *sums) {
    size_t need = 0;
    for (int i = 0; i < n; i++) need += sizeof SUM_PREFIX + strlen(items[i].name) + sizeof SUM_ALGO + 16;
    char *p = *text = malloc(need ? need : 1);
    if (!p) return nb__error(NB_ENOMEM, "safetensors_save: out of memory");
    for (int i = 0; i < n; i++) {
        nb_tensor *t = items[i].t;
        size_t nbytes = (size_t)nb_numel(t) * nb_dtype_size(t->dtype);
        keys[nmeta + i] = p;
        p += sprintf(p, SUM_PREFIX "%s", items[i].name) + 1;
        vals[nmeta + i] = p;
        uint64_t h = 0;
        if (nb__host_accessible(t) && nb_is_contiguous(t)) {
            h = XXH3_64bits(nbytes ? nb__ptr(t) : "", nbytes);
        } else { /* as write_contents does: a contiguous host copy */
            nb_scope_begin();
            bool prev = nb_set_grad_enabled(false);
            nb_tensor *c = nb__host_accessible(t) ? nb_contiguous(t) : nb_to_device(t, NB_CPU);
            nb_set_grad_enabled(prev);
            if (c) h = XXH3_64bits(nb__ptr(c), nbytes);
            nb_scope_end();
            if (!c) return nb_last_status();
        }
        snprintf(p, sizeof SUM_ALGO + 16, SUM_ALGO "%016llx", (unsigned long long)h);
        if (sums) sums[items[i].index] = h;
        p += strlen(p) + 1;
    }
    return NB_OK;
}

nb_status nb_safetensors_save(const char *path, const char *const *names,
                              nb_tensor *const *tensors, int n, const char *const *meta_keys,
                              const char *const *meta_values, int nmeta) {
    return nb__safetensors_save_checked(path, names, tensors, n, meta_keys, meta_values, nmeta,
                                        false, NULL);
}

nb_status nb__safetensors_save_checked(const char *path, const char *const *names,
                                       nb_tensor *const *tensors, int n,
                                       const char *const *meta_keys,
                                       const char *const *meta_values, int nmeta,
                                       bool checksums, uint64_t *sums) {
    nb_status st = check_save_args(path, names, tensors, n, meta_keys, meta_values, nmeta);
    if (st == NB_OK) st = check_replaceable(path);
    if (st != NB_OK) return st;
    w_item *items = malloc(sizeof(w_item) * (size_t)(n ? n : 1));
    if (!items) return nb__error(NB_ENOMEM, "safetensors_save: out of memory");
    for (int i = 0; i < n; i++)
        items[i] = (w_item){names[i], tensors[i], write_rank(tensors[i]->dtype), i};
    qsort(items, (size_t)n, sizeof(w_item), cmp_write_order);
    char *json = NULL;
    if (checksums) {
        const char **keys = malloc(sizeof(char *) * (size_t)(nmeta + n + 1));
        const char **vals = malloc(sizeof(char *) * (size_t)(nmeta + n + 1));
        char *text = NULL;
        st = keys && vals ? NB_OK : nb__error(NB_ENOMEM, "safetensors_save: out of memory");
        if (st == NB_OK) {
            for (int i = 0; i < nmeta; i++) keys[i] = meta_keys[i], vals[i] = meta_values[i];
            st = add_checksums(items, n, keys, vals, nmeta, &text, sums);
        }
        if (st == NB_OK) json = build_header(items, n, keys, vals, nmeta + n);
        free(keys);
        free(vals);
        free(text);
    } else {
        json = build_header(items, n, meta_keys, meta_values, nmeta);
    }
    if (!json) {
        free(items);
        return nb_last_status();
    }

    nb__remove_stale_temps(path); /* before writing: a disk full of them may need the space */
    /* A fresh name in the same directory (so rename is atomic); O_EXCL never reuses a file
     * someone else is writing, and mode 0666 lets the umask decide, as for a plain fopen. */
    static atomic_uint counter;
    size_t tlen = strlen(path) + 64;
    char *tmp = malloc(tlen);
    int fd = -1, err = 0;
    for (int tries = 0; tmp && fd < 0 && tries < 100; tries++) {
        snprintf(tmp, tlen, "%s.tmp-%ld-%u", path, (long)getpid(),
                 atomic_fetch_add(&counter, 1u));
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        err = fd < 0 ? errno : 0;
        if (fd < 0 && err != EEXIST) break;
    }
    /* Held until the file is closed (or the process dies): tells remove_stale_temps of other
     * processes that this file is being written. Some file systems have no locks: then the
     * PID in the name is the only protection, which is enough on one host. */
    if (fd >= 0) (void)flock(fd, LOCK_EX | LOCK_NB);
    if (fd < 0) {
        st = tmp ? nb__error(NB_EIO, "safetensors_save: cannot create %s: %s", tmp, ERRNO_STR(err))
                 : nb__error(NB_ENOMEM, "safetensors_save: out of memory");
        free(tmp);
        free(json);
        free(items);
        return st;
    }

    err = write_contents(fd, json, items, n);
    const char *what = "write";
    if (!err && fsync(fd) != 0) err = errno, what = "sync";
    if (close(fd) != 0 && !err) err = errno, what = "close";
    /* again: something may have appeared at path while we wrote */
    if (!err && check_replaceable(path) != NB_OK) err = -1;
    if (!err && rename(tmp, path) != 0) err = errno, what = "rename the temporary file onto";
    if (err) {
        unlink(tmp);
        st = err > 0 ? nb__error(NB_EIO, "safetensors_save: cannot %s %s: %s", what, path,
                                 ERRNO_STR(err))
                     : nb_last_status();
    } else {
        st = sync_dir_of(path);
    }
    free(tmp);
    free(json);
    free(items);
    return st;
}
