/* safetensors.c - the safetensors file format: a validating reader over a memory-mapped file
 * whose tensors view the mapping without copying, and (io/safetensors_write.c) an atomic
 * writer that lays files out exactly as the reference implementation (huggingface/safetensors)
 * does.
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

#include "io/jansson_dl.h" /* jansson, opened on first use */
#include "io/xxh.h"

#include "nabla/autograd.h"
#include "io/io_impl.h"
#include "io/safetensors_impl.h"
#include "nabla/io.h"
#include "tensor/backend.h"
#include "tensor/handle.h"
#include "tensor/tensor_impl.h"

/* The reference implementation refuses larger headers; so do we (a bad length must not make
 * us parse gigabytes). */
#define ST_MAX_HEADER 100000000ull

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
    if (!nb__jansson("safetensors_open")) return nb_last_status();
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
