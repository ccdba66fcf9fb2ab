/* dcp_index.c - the index of a checkpoint folder (index.json, docs/checkpoints.md): built by
 * rank 0 from every rank's pieces once their files are durable, and read back, validated
 * before anything is used: its fields, every piece inside its tensor, and the pieces of each
 * tensor tiling it exactly (no overlap, no gap), so a load that reads the pieces overlapping
 * its part always finds every element exactly once. It is read through jansson and written
 * by hand (the writer is on a save's path, and building jansson objects costs milliseconds). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/jansson_dl.h" /* jansson, opened on first use */

#include "io/dcp_impl.h"
#include "tensor/tensor_impl.h"

static const struct {
    const char *name;
    nb_dtype dt;
} dtypes[] = {{"F64", NB_F64}, {"F32", NB_F32}, {"F16", NB_F16}, {"BF16", NB_BF16},
              {"I64", NB_I64}, {"I32", NB_I32}, {"U8", NB_U8},   {"BOOL", NB_BOOL}};

const char *dcp_dtype_name(nb_dtype dt) {
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
        if (dtypes[i].dt == dt) return dtypes[i].name;
    return "?";
}

int dcp_dtype_of_name(const char *s) {
    for (size_t i = 0; s && i < sizeof dtypes / sizeof *dtypes; i++)
        if (strcmp(dtypes[i].name, s) == 0) return (int)dtypes[i].dt;
    return -1;
}

void dcp_box_str(const dcp_box *b, char *out, size_t n) {
    size_t at = 0;
    out[0] = '\0';
    for (int d = 0; d < b->ndim && at < n; d++)
        at += (size_t)snprintf(out + at, n - at, "%s%" PRId64 "+%" PRId64, d ? "," : "",
                               b->off[d], b->len[d]);
    if (b->fn >= 0 && at < n)
        snprintf(out + at, n - at, "/%" PRId64 "+%" PRId64, b->flo, b->fn);
}

/* ---- writing ------------------------------------------------------------------------------- */
/* A growable text buffer. */
typedef struct tbuf {
    char *s;
    size_t n, cap;
    bool bad;
} tbuf;

static void tput(tbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tput(tbuf *b, const char *fmt, ...) {
    for (int tries = 0; !b->bad && tries < 2; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (w < 0) {
            b->bad = true;
            return;
        }
        if (b->s && b->n + (size_t)w < b->cap) {
            b->n += (size_t)w;
            return;
        }
        size_t cap = (b->cap + (size_t)w + 1) * 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->bad = true;
            return;
        }
        b->s = s, b->cap = cap;
    }
}

/* s as a JSON string (quotes and escapes). */
static void tstr(tbuf *b, const char *s) {
    tput(b, "\"");
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') tput(b, "\\%c", *c);
        else if (*c < 0x20) tput(b, "\\u%04x", *c);
        else tput(b, "%c", *c);
    }
    tput(b, "\"");
}

static void tints(tbuf *b, const int64_t *v, int n) {
    tput(b, "[");
    for (int i = 0; i < n; i++) tput(b, "%s%" PRId64, i ? "," : "", v[i]);
    tput(b, "]");
}

static int cmp_desc(const void *a, const void *b) {
    const dcp_desc *x = a, *y = b;
    int c = strcmp(x->entry, y->entry);
    if (c) return c;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    return strcmp(x->key, y->key);
}

static bool same_shape(const dcp_desc *a, const dcp_desc *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

char *dcp_index_text(const dcp_index_meta *m, char *const *files, const int *ranks, int nfiles,
                     dcp_desc *d, int nd, const char *op) {
    qsort(d, (size_t)nd, sizeof *d, cmp_desc);
    tbuf b = {0};
    tput(&b, "{\"config\":{");
    for (int i = 0; i < m->nconfig; i++) {
        tput(&b, "%s", i ? "," : "");
        tstr(&b, m->config_names[i]);
        tput(&b, ":");
        tstr(&b, m->config_values[i]);
    }
    tput(&b, "},\"files\":[");
    for (int i = 0; i < nfiles; i++) {
        tput(&b, "%s{\"name\":", i ? "," : "");
        tstr(&b, files[i]);
        tput(&b, ",\"rank\":%d}", ranks[i]);
    }
    tput(&b, "],\"format\":\"" DCP_FORMAT "\",\"layout\":{\"mesh\":");
    tstr(&b, m->layout);
    tput(&b, ",\"world\":%d}", m->world);
    if (m->program) {
        tput(&b, ",\"program\":");
        tstr(&b, m->program);
    }
    tput(&b, ",\"run_id\":");
    tstr(&b, m->run_id);
    tput(&b, ",\"save_id\":");
    tstr(&b, m->save_id);
    tput(&b, ",\"step\":%" PRId64 ",\"tensors\":{", m->step);
    for (int i = 0; i < nd; i++) {
        bool first = i == 0 || strcmp(d[i].entry, d[i - 1].entry) != 0;
        if (!first && !same_shape(&d[i], &d[i - 1])) {
            free(b.s);
            nb__error(NB_EFORMAT, "%s: the ranks' files disagree on the dtype or shape of "
                      "tensor \"%s\"", op, d[i].entry);
            return NULL;
        }
        if (first) {
            tput(&b, "%s\n", i ? "]}," : "");
            tstr(&b, d[i].entry);
            tput(&b, ":{\"dtype\":\"%s\",\"shape\":", dcp_dtype_name(d[i].dtype));
            tints(&b, d[i].shape, d[i].ndim);
            tput(&b, ",\"pieces\":[");
        } else {
            tput(&b, ",");
        }
        tput(&b, "{\"file\":%d,\"key\":", d[i].file);
        tstr(&b, d[i].key);
        tput(&b, ",\"offset\":");
        tints(&b, d[i].box.off, d[i].box.ndim);
        tput(&b, ",\"size\":");
        tints(&b, d[i].box.len, d[i].box.ndim);
        if (d[i].box.fn >= 0) tput(&b, ",\"flat\":[%" PRId64 ",%" PRId64 "]", d[i].box.flo, d[i].box.fn);
        tput(&b, ",\"checksum\":\"" DCP_SUM_ALGO "%016" PRIx64 "\"}", d[i].sum);
    }
    tput(&b, "%s},\"version\":1}\n", nd ? "]}" : "");
    if (b.bad) {
        free(b.s);
        nb__error(NB_ENOMEM, "%s: out of memory building the index", op);
        return NULL;
    }
    return b.s;
}

/* ---- reading -------------------------------------------------------------------------------- */
void dcp_source_free(dcp_source *s) {
    for (int i = 0; i < s->nt; i++) {
        for (int k = 0; k < s->t[i].np; k++) free(s->t[i].p[k].key);
        free(s->t[i].p);
        free(s->t[i].name);
    }
    free(s->t);
    for (int i = 0; i < s->nfiles; i++) {
        free(s->files[i].name);
        nb_safetensors_close(s->files[i].f);
    }
    free(s->files);
    for (int i = 0; i < s->nconfig; i++) free(s->config_names[i]), free(s->config_values[i]);
    free(s->config_names);
    free(s->config_values);
    free(s->run_id);
    free(s->save_id);
    free(s->program);
    free(s->layout);
    free(s->path);
    memset(s, 0, sizeof *s);
}

static int cmp_tensor(const void *a, const void *b) {
    return strcmp(((const dcp_tensor *)a)->name, ((const dcp_tensor *)b)->name);
}

const dcp_tensor *dcp_source_find(const dcp_source *s, const char *name) {
    dcp_tensor key = {.name = (char *)(uintptr_t)name};
    return s->nt ? bsearch(&key, s->t, (size_t)s->nt, sizeof key, cmp_tensor) : NULL;
}

static char *dup_str(json_t *v) {
    return json_is_string(v) ? strdup(json_string_value(v)) : NULL;
}

/* A JSON integer in [lo, hi] into *out. */
static bool get_int(json_t *v, int64_t lo, int64_t hi, int64_t *out) {
    if (!json_is_integer(v)) return false;
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) return false;
    *out = (int64_t)x;
    return true;
}

/* An array of n integers in [0, limit[i]] (limit NULL: [0, 2^62]). */
static bool get_ints(json_t *a, int n, const int64_t *limit, int64_t *out) {
    if (!json_is_array(a) || (int)json_array_size(a) != n) return false;
    for (int i = 0; i < n; i++)
        if (!get_int(json_array_get(a, (size_t)i), 0, limit ? limit[i] : (INT64_C(1) << 62),
                     &out[i]))
            return false;
    return true;
}

static bool parse_sum(const char *s, uint64_t *out) {
    size_t l = strlen(DCP_SUM_ALGO);
    if (!s || strncmp(s, DCP_SUM_ALGO, l) != 0 || strlen(s + l) != 16) return false;
    uint64_t v = 0;
    for (const char *c = s + l; *c; c++) {
        int d = *c >= '0' && *c <= '9' ? *c - '0' : *c >= 'a' && *c <= 'f' ? *c - 'a' + 10 : -1;
        if (d < 0) return false;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return true;
}

/* Whether pieces a and b of one tensor share an element. Pieces whose rectangles intersect
 * must be the same rectangle with disjoint flat ranges (what a ZeRO save writes); any other
 * intersection counts as an overlap. */
static bool overlap(const dcp_box *a, const dcp_box *b) {
    if (dcp_box_volume(a) == 0 || dcp_box_volume(b) == 0) return false;
    bool same = true;
    for (int d = 0; d < a->ndim; d++) {
        int64_t lo = a->off[d] > b->off[d] ? a->off[d] : b->off[d];
        int64_t ea = a->off[d] + a->len[d], eb = b->off[d] + b->len[d];
        if (lo >= (ea < eb ? ea : eb)) return false;
        same &= a->off[d] == b->off[d] && a->len[d] == b->len[d];
    }
    if ((a->fn < 0 && b->fn < 0) || !same) return true;
    int64_t v = 1;
    for (int d = 0; d < a->ndim; d++) v *= a->len[d];
    int64_t alo = a->fn < 0 ? 0 : a->flo, ahi = a->fn < 0 ? v : a->flo + a->fn;
    int64_t blo = b->fn < 0 ? 0 : b->flo, bhi = b->fn < 0 ? v : b->flo + b->fn;
    return (alo > blo ? alo : blo) < (ahi < bhi ? ahi : bhi);
}

static int sweep_dim;
static int cmp_piece(const void *a, const void *b) {
    int64_t x = ((const dcp_piece *)a)->box.off[sweep_dim];
    int64_t y = ((const dcp_piece *)b)->box.off[sweep_dim];
    return x < y ? -1 : x > y;
}
static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* The pieces of t tile it exactly: pairwise disjoint (a sweep along the dimension with the
 * most distinct offsets) and as many elements as the tensor has. */
static nb_status check_tiling(dcp_tensor *t, const dcp_source *s, const char *path) {
    int64_t numel = 1, sum = 0;
    for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
    for (int k = 0; k < t->np; k++) sum += dcp_box_volume(&t->p[k].box);
    if (t->ndim > 0 && t->np > 1) {
        int64_t *offs = malloc(sizeof *offs * (size_t)t->np);
        if (!offs) return nb__error(NB_ENOMEM, "checkpoint: out of memory");
        int best = 0, best_n = 0;
        for (int d = 0; d < t->ndim; d++) {
            for (int k = 0; k < t->np; k++) offs[k] = t->p[k].box.off[d];
            qsort(offs, (size_t)t->np, sizeof *offs, cmp_i64);
            int distinct = 1;
            for (int k = 1; k < t->np; k++) distinct += offs[k] != offs[k - 1];
            if (distinct > best_n) best_n = distinct, best = d;
        }
        free(offs);
        sweep_dim = best;
        qsort(t->p, (size_t)t->np, sizeof *t->p, cmp_piece);
        int64_t budget = 100000000;
        for (int i = 0; i < t->np; i++) {
            const dcp_box *a = &t->p[i].box;
            for (int j = i + 1; j < t->np && t->p[j].box.off[best] < a->off[best] + a->len[best];
                 j++) {
                if (--budget < 0)
                    return nb__error(NB_EFORMAT, "checkpoint: %s: tensor \"%s\" has too many "
                                     "pieces on top of each other to check", path, t->name);
                if (overlap(a, &t->p[j].box)) {
                    char x[256], y[256];
                    dcp_box_str(a, x, sizeof x);
                    dcp_box_str(&t->p[j].box, y, sizeof y);
                    return nb__error(NB_EFORMAT, "checkpoint: %s: the pieces of tensor \"%s\" "
                                     "overlap: [%s] in %s and [%s] in %s", path, t->name, x,
                                     s->files[t->p[i].file].name, y, s->files[t->p[j].file].name);
                }
            }
        }
    } else if (t->ndim == 0 && t->np > 1) {
        int full = 0;
        for (int k = 0; k < t->np; k++) full += dcp_box_volume(&t->p[k].box) > 0;
        if (full > 1)
            return nb__error(NB_EFORMAT, "checkpoint: %s: scalar \"%s\" is stored %d times", path,
                             t->name, full);
    }
    if (sum != numel)
        return nb__error(NB_EFORMAT, "checkpoint: %s: the pieces of tensor \"%s\" hold %lld of "
                         "its %lld elements (%s)", path, t->name, (long long)sum,
                         (long long)numel, sum < numel ? "a gap" : "an overlap");
    return NB_OK;
}

static nb_status parse_piece(json_t *q, dcp_tensor *t, const dcp_source *s, dcp_piece *p,
                             const char *path) {
    int64_t file;
    p->box.ndim = t->ndim;
    p->box.fn = -1;
    json_t *flat = json_object_get(q, "flat");
    int64_t fl[2];
    bool ok = json_is_object(q) && get_int(json_object_get(q, "file"), 0, s->nfiles - 1, &file) &&
              (p->key = dup_str(json_object_get(q, "key"))) != NULL &&
              get_ints(json_object_get(q, "offset"), t->ndim, t->shape, p->box.off) &&
              get_ints(json_object_get(q, "size"), t->ndim, t->shape, p->box.len) &&
              parse_sum(json_string_value(json_object_get(q, "checksum")), &p->sum) &&
              (!flat || get_ints(flat, 2, NULL, fl));
    if (!ok)
        return nb__error(NB_EFORMAT, "checkpoint: %s: a piece of tensor \"%s\" lacks a valid "
                         "file, key, offset, size, flat range or checksum", path, t->name);
    p->file = (int)file;
    p->has_sum = true;
    int64_t vol = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (p->box.off[d] + p->box.len[d] > t->shape[d])
            return nb__error(NB_EFORMAT, "checkpoint: %s: a piece of tensor \"%s\" (key \"%s\") "
                             "reaches past its dim %d of size %lld", path, t->name, p->key, d,
                             (long long)t->shape[d]);
        vol *= p->box.len[d];
    }
    if (flat) {
        if (fl[0] + fl[1] > vol)
            return nb__error(NB_EFORMAT, "checkpoint: %s: the flat range of a piece of tensor "
                             "\"%s\" (key \"%s\") reaches past its %lld elements", path, t->name,
                             p->key, (long long)vol);
        p->box.flo = fl[0], p->box.fn = fl[1];
    }
    return NB_OK;
}

static nb_status parse_tensor(const char *name, json_t *v, const dcp_source *s, dcp_tensor *t,
                              const char *path) {
    t->name = strdup(name);
    if (!t->name) return nb__error(NB_ENOMEM, "checkpoint: out of memory");
    json_t *shape = json_object_get(v, "shape"), *pieces = json_object_get(v, "pieces");
    int dt = dcp_dtype_of_name(json_string_value(json_object_get(v, "dtype")));
    size_t nd = json_array_size(shape);
    if (!json_is_object(v) || dt < 0 || !json_is_array(shape) || nd > NB_MAX_DIMS ||
        !get_ints(shape, (int)nd, NULL, t->shape) || !json_is_array(pieces) ||
        json_array_size(pieces) > DCP_MAX_PIECES)
        return nb__error(NB_EFORMAT, "checkpoint: %s: tensor \"%s\" lacks a valid dtype, shape "
                         "or piece list", path, name);
    t->dtype = (nb_dtype)dt;
    t->ndim = (int)nd;
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; d++)
        if (__builtin_mul_overflow(numel, t->shape[d] > 0 ? t->shape[d] : 1, &numel) ||
            numel > (INT64_C(1) << 58))
            return nb__error(NB_EFORMAT, "checkpoint: %s: tensor \"%s\" is too large", path, name);
    t->np = (int)json_array_size(pieces);
    t->p = calloc((size_t)t->np + 1, sizeof *t->p);
    if (!t->p) return nb__error(NB_ENOMEM, "checkpoint: out of memory");
    for (int k = 0; k < t->np; k++) {
        nb_status st = parse_piece(json_array_get(pieces, (size_t)k), t, s, &t->p[k], path);
        if (st != NB_OK) return st;
    }
    return check_tiling(t, s, path);
}

nb_status dcp_index_parse(const char *text, size_t n, const char *path, dcp_source *s) {
    memset(s, 0, sizeof *s);
    s->folder = true;
    if (!nb__jansson("checkpoint")) return nb_last_status();
    json_error_t err;
    json_t *root = json_loadb(text, n, JSON_REJECT_DUPLICATES, &err);
    nb_status st = NB_OK;
    if (!root)
        return nb__error(NB_EFORMAT, "checkpoint: %s is not valid JSON: %s (line %d)", path,
                         err.text, err.line);
    json_t *layout = json_object_get(root, "layout"), *files = json_object_get(root, "files");
    json_t *tensors = json_object_get(root, "tensors"), *config = json_object_get(root, "config");
    int64_t version = 0, world = 0;
    const char *fmt = json_string_value(json_object_get(root, "format"));
    if (!json_is_object(root) || !fmt || strcmp(fmt, DCP_FORMAT) != 0)
        st = nb__error(NB_EFORMAT, "checkpoint: %s is not the index of a nabla checkpoint "
                       "(no \"format\": \"" DCP_FORMAT "\")", path);
    else if (!get_int(json_object_get(root, "version"), 1, 1, &version))
        st = nb__error(NB_EFORMAT, "checkpoint: %s has index version %s; this reader knows "
                       "version 1", path, json_is_integer(json_object_get(root, "version"))
                                              ? "another" : "none");
    else if (!(s->run_id = dup_str(json_object_get(root, "run_id"))) ||
             !(s->save_id = dup_str(json_object_get(root, "save_id"))) ||
             !get_int(json_object_get(root, "step"), 0, INT64_MAX, &s->step) ||
             !json_is_object(layout) ||
             !get_int(json_object_get(layout, "world"), 1, 1 << 24, &world) ||
             !(s->layout = dup_str(json_object_get(layout, "mesh"))) || !json_is_array(files) ||
             !json_is_object(tensors) || (config && !json_is_object(config)) ||
             (json_object_get(root, "program") &&
              !(s->program = dup_str(json_object_get(root, "program")))))
        st = nb__error(NB_EFORMAT, "checkpoint: %s lacks a valid run_id, save_id, step, layout, "
                       "program, config, file list or tensor list", path);
    s->world = (int)world;
    size_t nf = st == NB_OK ? json_array_size(files) : 0;
    if (st == NB_OK && nf > (size_t)world)
        st = nb__error(NB_EFORMAT, "checkpoint: %s names %zu files for %d ranks", path, nf,
                       s->world);
    if (st == NB_OK && !(s->files = calloc(nf + 1, sizeof *s->files)))
        st = nb__error(NB_ENOMEM, "checkpoint: out of memory");
    for (size_t i = 0; st == NB_OK && i < nf; i++) {
        json_t *f = json_array_get(files, i);
        int64_t rank;
        dcp_file *df = &s->files[s->nfiles++];
        df->name = dup_str(json_object_get(f, "name"));
        if (!df->name || !get_int(json_object_get(f, "rank"), 0, world - 1, &rank) ||
            !*df->name || strchr(df->name, '/') || !strcmp(df->name, "..") ||
            !strcmp(df->name, "."))
            st = nb__error(NB_EFORMAT, "checkpoint: %s: file %zu has no valid name or rank", path,
                           i);
        else df->rank = (int)rank;
        for (size_t k = 0; st == NB_OK && k < i; k++)
            if (s->files[k].rank == df->rank || !strcmp(s->files[k].name, df->name))
                st = nb__error(NB_EFORMAT, "checkpoint: %s names rank %d's file (or the file %s) "
                               "twice", path, df->rank, df->name);
    }
    size_t nc = st == NB_OK && config ? json_object_size(config) : 0;
    if (st == NB_OK && (!(s->config_names = calloc(nc + 1, sizeof(char *))) ||
                        !(s->config_values = calloc(nc + 1, sizeof(char *)))))
        st = nb__error(NB_ENOMEM, "checkpoint: out of memory");
    const char *key;
    json_t *v;
    if (st == NB_OK && config) json_object_foreach(config, key, v) {
        if (!json_is_string(v)) {
            st = nb__error(NB_EFORMAT, "checkpoint: %s: setting \"%s\" is not a string", path, key);
            break;
        }
        s->config_names[s->nconfig] = strdup(key);
        s->config_values[s->nconfig] = strdup(json_string_value(v));
        if (!s->config_names[s->nconfig++] || !s->config_values[s->nconfig - 1]) {
            st = nb__error(NB_ENOMEM, "checkpoint: out of memory");
            break;
        }
    }
    size_t nt = st == NB_OK ? json_object_size(tensors) : 0;
    if (st == NB_OK && !(s->t = calloc(nt + 1, sizeof *s->t)))
        st = nb__error(NB_ENOMEM, "checkpoint: out of memory");
    size_t total = 0;
    if (st == NB_OK) json_object_foreach(tensors, key, v) {
        total += json_array_size(json_object_get(v, "pieces"));
        if (total > DCP_MAX_PIECES) {
            st = nb__error(NB_EFORMAT, "checkpoint: %s has more than %d pieces", path,
                           DCP_MAX_PIECES);
            break;
        }
        st = parse_tensor(key, v, s, &s->t[s->nt++], path);
        if (st != NB_OK) break;
    }
    if (st == NB_OK) qsort(s->t, (size_t)s->nt, sizeof *s->t, cmp_tensor);
    json_decref(root);
    if (st != NB_OK) dcp_source_free(s);
    return st;
}
