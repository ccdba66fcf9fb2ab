/* dcp_load.c - loading a checkpoint into any layout (nabla/checkpoint.h). The source is a
 * folder (its index and the ranks' files) or one plain checkpoint file, read alike: tensors
 * by name, each made of pieces. A load builds this rank's targets from the objects' own
 * placements (the parts of each tensor it holds), reads only the stored pieces that overlap
 * them, verifies each piece it reads (checksum, run, save, rank, place) and copies the
 * overlap into host staging tensors. Everything is checked before anything changes; the ranks
 * agree; then the optimizer, schedule, scaler and loader are applied (each restored from a
 * snapshot if any rank fails there) and last the model. A consolidate step writes a source
 * as one plain file. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/xxh.h"

#include "io/dcp_impl.h"
#include "io/io_impl.h"
#include "nabla/autograd.h"
#include "nabla/optim.h"
#include "tensor/tensor_impl.h"

/* ---- sources ------------------------------------------------------------------------------- */
static char *join(const char *dir, const char *name) {
    char *s = NULL;
    return asprintf(&s, "%s/%s", dir, name) < 0 ? NULL : s;
}

/* The whole of a small text file (at most 1 GiB). */
static nb_status read_text(const char *path, char **out, size_t *n, const char *op) {
    FILE *f = fopen(path, "rb");
    if (!f) return nb__error(NB_EIO, "%s: cannot open %s: %s", op, path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    nb_status st = buf ? NB_OK : nb__error(NB_ENOMEM, "%s: out of memory", op);
    while (st == NB_OK) {
        if (len == cap) {
            char *b = cap < ((size_t)1 << 30) ? realloc(buf, cap * 2) : NULL;
            if (!b) st = nb__error(NB_EFORMAT, "%s: %s is too large for an index", op, path);
            else buf = b, cap *= 2;
            if (!b) break;
        }
        size_t r = fread(buf + len, 1, cap - len, f);
        len += r;
        if (r == 0) {
            if (ferror(f)) st = nb__error(NB_EIO, "%s: cannot read %s", op, path);
            break;
        }
    }
    fclose(f);
    if (st != NB_OK) {
        free(buf);
        return st;
    }
    *out = buf, *n = len;
    return NB_OK;
}

static bool verify_on(void) {
    const char *v = getenv("NB_TEST_NO_VERIFY"); /* test hook: the checks must be able to fail */
    return !(v && strcmp(v, "1") == 0);
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const dcp_tensor *)a)->name, ((const dcp_tensor *)b)->name);
}

/* A plain checkpoint file read as a source: every tensor one whole piece. */
static nb_status open_plain(const char *path, dcp_source *s, const char *op) {
    memset(s, 0, sizeof *s);
    nb__remove_stale_temps(path); /* a run restarted after a kill during a save */
    nb_safetensors *f = nb_safetensors_open(path);
    if (!f) return nb_last_status();
    if (!nb_safetensors_metadata(f, "nabla_checkpoint")) {
        nb_safetensors_close(f);
        return nb__error(NB_EFORMAT, "%s: %s is a safetensors file but not a nabla checkpoint "
                         "(to load weights only, use nb_module_load)", op, path);
    }
    s->files = calloc(1, sizeof *s->files);
    int n = nb_safetensors_count(f), nm = nb_safetensors_metadata_count(f);
    s->t = calloc((size_t)n + 1, sizeof *s->t);
    s->config_names = calloc((size_t)nm + 1, sizeof(char *));
    s->config_values = calloc((size_t)nm + 1, sizeof(char *));
    s->path = strdup(path);
    if (!s->files || !s->t || !s->config_names || !s->config_values || !s->path ||
        !(s->files[0].name = strdup(path))) {
        nb_safetensors_close(f);
        return nb__error(NB_ENOMEM, "%s: out of memory", op);
    }
    s->nfiles = 1;
    s->files[0].f = f;
    s->files[0].checked = true;
    s->world = 1;
    const char *v;
    if ((v = nb_safetensors_metadata(f, "run_id"))) s->run_id = strdup(v);
    if ((v = nb_safetensors_metadata(f, "program"))) s->program = strdup(v);
    s->layout = strdup("1 process");
    for (int i = 0; i < nm; i++) {
        const char *k = nb_safetensors_metadata_key(f, i);
        if (strncmp(k, "config.", 7) != 0) continue;
        s->config_names[s->nconfig] = strdup(k + 7);
        s->config_values[s->nconfig++] = strdup(nb_safetensors_metadata(f, k));
    }
    for (int i = 0; i < n; i++) {
        nb_safetensors_info in;
        nb_safetensors_info_at(f, i, &in);
        dcp_tensor *t = &s->t[s->nt++];
        t->name = strdup(in.name);
        t->p = calloc(1, sizeof *t->p);
        if (!t->name || !t->p) return nb__error(NB_ENOMEM, "%s: out of memory", op);
        if (!in.supported)
            return nb__error(NB_EDTYPE, "%s: tensor \"%s\" in %s has dtype %s, which nabla does "
                             "not support", op, in.name, path, in.dtype_name);
        t->dtype = in.dtype;
        t->ndim = in.ndim;
        t->np = 1;
        memcpy(t->shape, in.shape, sizeof t->shape);
        dcp_piece *p = &t->p[0];
        p->key = strdup(in.name);
        p->box = (dcp_box){.ndim = in.ndim, .fn = -1};
        memcpy(p->box.len, in.shape, sizeof p->box.len);
        char key[1024];
        snprintf(key, sizeof key, "checksum.%s", in.name);
        const char *sum = nb_safetensors_metadata(f, key);
        size_t l = strlen(DCP_SUM_ALGO);
        if (sum && strncmp(sum, DCP_SUM_ALGO, l) == 0) {
            char *end = NULL;
            p->sum = strtoull(sum + l, &end, 16);
            p->has_sum = end && !*end && strlen(sum + l) == 16;
        }
        if (sum && !p->has_sum)
            return nb__error(NB_EFORMAT, "%s: %s: tensor \"%s\" has a checksum of an unknown kind "
                             "(\"%.40s\"; this reader knows " DCP_SUM_ALGO ")", op, path, in.name,
                             sum);
        if (!p->key) return nb__error(NB_ENOMEM, "%s: out of memory", op);
    }
    qsort(s->t, (size_t)s->nt, sizeof *s->t, cmp_name);
    return NB_OK;
}

nb_status dcp_source_open(const char *path, dcp_source *s, const char *op) {
    memset(s, 0, sizeof *s);
    struct stat sb;
    nb_status st;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        st = open_plain(path, s, op);
    } else {
        nb__remove_stale_temps_in(path);
        char *ip = join(path, DCP_INDEX), *text = NULL;
        size_t n = 0;
        if (!ip) return nb__error(NB_ENOMEM, "%s: out of memory", op);
        if (access(ip, F_OK) != 0) {
            char *old = join(path, "index.safetensors");
            bool legacy = old && access(old, F_OK) == 0;
            free(old);
            st = legacy ? nb__error(NB_EFORMAT, "%s: %s is a checkpoint folder of an earlier "
                                    "format (index.safetensors); this version reads %s folders",
                                    op, path, DCP_INDEX)
                        : nb__error(NB_EIO, "%s: %s has no %s, so it is not a complete "
                                    "checkpoint (its save did not finish?)", op, path, DCP_INDEX);
        } else {
            st = read_text(ip, &text, &n, op);
        }
        if (st == NB_OK) st = dcp_index_parse(text, n, ip, s);
        free(text);
        free(ip);
        if (st == NB_OK && !(s->path = strdup(path))) st = nb__error(NB_ENOMEM, "%s: out of memory", op);
    }
    s->verify = verify_on();
    if (st != NB_OK) dcp_source_free(s);
    return st;
}

/* File i of s, opened, its identity checked against the index. */
static nb_status src_file(dcp_source *s, int i, nb_safetensors **out, const char *op) {
    dcp_file *df = &s->files[i];
    if (!df->f) {
        char *p = join(s->path, df->name);
        if (!p) return nb__error(NB_ENOMEM, "%s: out of memory", op);
        if (access(p, F_OK) != 0) {
            nb_status st = nb__error(NB_EIO, "%s: %s (rank %d's file of the checkpoint) is "
                                     "missing", op, p, df->rank);
            free(p);
            return st;
        }
        df->f = nb_safetensors_open(p);
        free(p);
        if (!df->f) {
            char why[1024];
            snprintf(why, sizeof why, "%s", nb_last_error());
            return nb__error(NB_EFORMAT, "%s: %s (rank %d's file, truncated or damaged?)", op,
                             why, df->rank);
        }
    }
    *out = df->f;
    if (df->checked) return NB_OK;
    nb_safetensors *f = df->f;
    const char *path = nb_safetensors_path(f);
    const char *run = nb_safetensors_metadata(f, "run_id");
    const char *sid = nb_safetensors_metadata(f, "save_id");
    const char *rank = nb_safetensors_metadata(f, "rank"), *world = nb_safetensors_metadata(f, "world");
    char want_rank[16], want_world[16];
    snprintf(want_rank, sizeof want_rank, "%d", df->rank);
    snprintf(want_world, sizeof want_world, "%d", s->world);
    if (!nb_safetensors_metadata(f, "nabla_dcp"))
        return nb__error(NB_EFORMAT, "%s: %s is not a file of a nabla checkpoint folder", op, path);
    if (!run || strcmp(run, s->run_id) != 0 || !sid || strcmp(sid, s->save_id) != 0)
        return nb__error(NB_EINVAL, "%s: %s belongs to run %s, save %s, but the index is of run "
                         "%s, save %s (a file of another run or save)", op, path,
                         run ? run : "?", sid ? sid : "?", s->run_id, s->save_id);
    if (!rank || strcmp(rank, want_rank) != 0 || !world || strcmp(world, want_world) != 0)
        return nb__error(NB_EINVAL, "%s: %s is rank %s of %s's file, but the index expects rank "
                         "%d of %d there (files swapped?)", op, path, rank ? rank : "?",
                         world ? world : "?", df->rank, s->world);
    df->checked = true;
    return NB_OK;
}

/* Piece p of t: its stored bytes (a tensor over the mapped file, in the current scope),
 * checked against the index and, once, verified. */
static nb_status src_piece(dcp_source *s, const dcp_tensor *t, dcp_piece *p, nb_tensor **out,
                           const char *op) {
    nb_safetensors *f = NULL;
    nb_status st = src_file(s, p->file, &f, op);
    if (st != NB_OK) return st;
    const char *path = nb_safetensors_path(f);
    int i = nb_safetensors_find(f, p->key);
    nb_safetensors_info in;
    if (i < 0 || nb_safetensors_info_at(f, i, &in) != NB_OK)
        return nb__error(NB_EFORMAT, "%s: %s has no piece \"%s\" of tensor \"%s\" (the index "
                         "does not match its files)", op, path, p->key, t->name);
    bool shape_ok = p->box.fn >= 0 ? in.ndim == 1 && in.shape[0] == p->box.fn : in.ndim == t->ndim;
    for (int d = 0; shape_ok && p->box.fn < 0 && d < t->ndim; d++)
        shape_ok = in.shape[d] == p->box.len[d];
    if (!in.supported || in.dtype != t->dtype || !shape_ok) {
        char where[512];
        dcp_box_str(&p->box, where, sizeof where);
        return nb__error(NB_EFORMAT, "%s: %s: piece \"%s\" of tensor \"%s\" is %s with %d "
                         "dims there, but the index says %s at [%s] (the index does not match "
                         "its files)", op, path, p->key, t->name, in.dtype_name, in.ndim,
                         dcp_dtype_name(t->dtype), where);
    }
    char key[1100], want[1200], where[512];
    if (s->folder) {
        snprintf(key, sizeof key, "piece.%s", p->key);
        dcp_box_str(&p->box, where, sizeof where);
        snprintf(want, sizeof want, "%s|%s", t->name, where);
        const char *got = nb_safetensors_metadata(f, key);
        if (!got || strcmp(got, want) != 0)
            return nb__error(NB_EFORMAT, "%s: %s: piece \"%s\" is \"%s\" there, but the index "
                             "puts it at \"%s\" (the index does not match its files)", op, path,
                             p->key, got ? got : "(none)", want);
        snprintf(key, sizeof key, "checksum.%s", p->key);
        snprintf(want, sizeof want, DCP_SUM_ALGO "%016" PRIx64, p->sum);
        got = nb_safetensors_metadata(f, key);
        if (!got || strcmp(got, want) != 0)
            return nb__error(NB_EFORMAT, "%s: %s: piece \"%s\" of tensor \"%s\" has checksum %s "
                             "there, the index %s (the index does not match its files)", op,
                             path, p->key, t->name, got ? got : "(none)", want);
    }
    nb_tensor *data = nb_safetensors_get(f, p->key);
    if (!data) return nb_last_status();
    if (s->verify && p->has_sum && !p->checked) {
        uint64_t h = XXH3_64bits(nb__ptr(data), (size_t)(in.data_end - in.data_begin));
        if (h != p->sum)
            return nb__error(NB_EFORMAT, "%s: %s is corrupt: the bytes of tensor \"%s\"%s%s%s "
                             "hash to %016" PRIx64 ", the %s recorded %016" PRIx64 " (a torn write "
                             "or a damaged disk)", op, path, t->name,
                             strcmp(p->key, t->name) ? " (piece \"" : "",
                             strcmp(p->key, t->name) ? p->key : "",
                             strcmp(p->key, t->name) ? "\")" : "", h,
                             s->folder ? "index" : "file", p->sum);
        p->checked = true;
    }
    *out = data;
    return NB_OK;
}

nb_status dcp_source_verify_all(dcp_source *s, const char *op) {
    nb_status st = NB_OK;
    bool v = s->verify;
    s->verify = true;
    for (int i = 0; st == NB_OK && i < s->nt; i++)
        for (int k = 0; st == NB_OK && k < s->t[i].np; k++) {
            nb_scope_begin();
            nb_tensor *d;
            st = src_piece(s, &s->t[i], &s->t[i].p[k], &d, op);
            nb_scope_end();
        }
    s->verify = v;
    return st;
}

/* ---- copying overlaps ----------------------------------------------------------------------- */
/* The elements of stored piece sb (data sd) that target part tb (data td, contiguous in its
 * own order) also holds are copied; returns how many. */
static int64_t copy_overlap(const dcp_box *sb, const unsigned char *sd, const dcp_box *tb,
                            unsigned char *td, size_t es) {
    int nd = sb->ndim;
    int64_t lo[NB_MAX_DIMS], len[NB_MAX_DIMS], ss[NB_MAX_DIMS], ts[NB_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        lo[d] = sb->off[d] > tb->off[d] ? sb->off[d] : tb->off[d];
        int64_t hs = sb->off[d] + sb->len[d], ht = tb->off[d] + tb->len[d];
        len[d] = (hs < ht ? hs : ht) - lo[d];
        if (len[d] <= 0) return 0;
    }
    int64_t vs = 1, vt = 1;
    for (int d = nd - 1; d >= 0; d--) ss[d] = vs, vs *= sb->len[d], ts[d] = vt, vt *= tb->len[d];
    int64_t slo = sb->fn < 0 ? 0 : sb->flo, shi = sb->fn < 0 ? vs : sb->flo + sb->fn;
    int64_t tlo = tb->fn < 0 ? 0 : tb->flo, thi = tb->fn < 0 ? vt : tb->flo + tb->fn;
    /* the innermost dims the overlap spans whole in both are one contiguous run */
    int inner = nd > 0 ? nd - 1 : 0;
    int64_t run = nd > 0 ? len[inner] : 1;
    while (inner > 0 && len[inner] == sb->len[inner] && len[inner] == tb->len[inner])
        inner--, run *= len[inner];
    int outer = nd > 0 ? inner : 0;
    int64_t idx[NB_MAX_DIMS] = {0}, copied = 0;
    for (;;) {
        int64_t si = 0, ti = 0;
        for (int d = 0; d < nd; d++) {
            int64_t c = lo[d] + (d < outer ? idx[d] : 0);
            si += (c - sb->off[d]) * ss[d];
            ti += (c - tb->off[d]) * ts[d];
        }
        int64_t j0 = 0, j1 = run;
        if (slo - si > j0) j0 = slo - si;
        if (tlo - ti > j0) j0 = tlo - ti;
        if (shi - si < j1) j1 = shi - si;
        if (thi - ti < j1) j1 = thi - ti;
        if (j0 < j1) {
            memcpy(td + (size_t)(ti + j0 - tlo) * es, sd + (size_t)(si + j0 - slo) * es,
                   (size_t)(j1 - j0) * es);
            copied += j1 - j0;
        }
        int d = outer - 1;
        while (d >= 0 && ++idx[d] == len[d]) idx[d--] = 0;
        if (d < 0) break;
    }
    return copied;
}

static bool boxes_meet(const dcp_box *a, const dcp_box *b) {
    for (int d = 0; d < a->ndim; d++)
        if ((a->off[d] > b->off[d] ? a->off[d] : b->off[d]) >=
            (a->off[d] + a->len[d] < b->off[d] + b->len[d] ? a->off[d] + a->len[d]
                                                          : b->off[d] + b->len[d]))
            return false;
    return true;
}

/* Fill buf (contiguous host, t's dtype) with part tb of t from the stored pieces. */
static nb_status fill_part(dcp_source *s, const dcp_tensor *t, const dcp_box *tb, nb_tensor *buf,
                           const char *op) {
    size_t es = nb_dtype_size(t->dtype);
    int64_t want = dcp_box_volume(tb), got = 0;
    nb_status st = NB_OK;
    for (int k = 0; st == NB_OK && k < t->np && got < want; k++) {
        dcp_piece *p = &t->p[k];
        if (!boxes_meet(&p->box, tb) || dcp_box_volume(&p->box) == 0) continue;
        nb_scope_begin();
        nb_tensor *d;
        st = src_piece(s, t, p, &d, op);
        if (st == NB_OK)
            got += copy_overlap(&p->box, (const unsigned char *)nb__ptr(d), tb,
                                (unsigned char *)nb__ptr(buf), es);
        nb_scope_end();
    }
    if (st == NB_OK && got != want)
        st = nb__error(NB_EFORMAT, "%s: %s: the pieces of tensor \"%s\" hold %lld of the %lld "
                       "elements this rank needs", op, s->path, t->name, (long long)got,
                       (long long)want);
    return st;
}

/* ---- targets -------------------------------------------------------------------------------- */
typedef struct target {
    char *name;            /* the checkpoint name it takes ("model.0.weight", "step", ...) */
    const dcp_tensor *src; /* where it comes from (the master copy for an f32 model) */
    dcp_kind kind;
    nb_tensor *live;       /* model: the local values it goes to */
    dcp_lay lay;
    int ndim;
    int64_t shape[NB_MAX_DIMS]; /* the local tensor's */
    nb_tensor *stage;      /* host, the stored dtype, the local shape */
} target;

typedef struct targets {
    int n, cap;
    target *t;
} targets;

static void targets_free(targets *ts) {
    for (int i = 0; i < ts->n; i++) {
        free(ts->t[i].name);
        nb_tensor_free(ts->t[i].live);
        nb_tensor_free(ts->t[i].stage);
        dcp_lay_free(&ts->t[i].lay);
    }
    free(ts->t);
    memset(ts, 0, sizeof *ts);
}

/* Add a target (takes lay and live). The local shape: live's, or shape[ndim]. */
static nb_status add_target(targets *ts, const char *prefix, const char *name, dcp_kind kind,
                            const dcp_tensor *src, nb_tensor *live, dcp_lay *lay,
                            const int64_t *shape, int ndim) {
    if (ts->n == ts->cap) {
        int cap = ts->cap ? 2 * ts->cap : 64;
        target *t = realloc(ts->t, sizeof *t * (size_t)cap);
        if (!t) {
            dcp_lay_free(lay);
            nb_tensor_free(live);
            return nb__error(NB_ENOMEM, "checkpoint_load: out of memory");
        }
        ts->t = t, ts->cap = cap;
    }
    target *t = &ts->t[ts->n++];
    memset(t, 0, sizeof *t);
    t->kind = kind, t->src = src, t->live = live, t->lay = *lay;
    memset(lay, 0, sizeof *lay);
    t->ndim = live ? nb_ndim(live) : ndim;
    for (int d = 0; d < t->ndim; d++) t->shape[d] = live ? nb_shape(live)[d] : shape[d];
    if (asprintf(&t->name, "%s%s", prefix, name) < 0) {
        t->name = NULL;
        return nb__error(NB_ENOMEM, "checkpoint_load: out of memory");
    }
    return NB_OK;
}

static bool is_half(nb_dtype dt) { return dt == NB_F16 || dt == NB_BF16; }

/* The model's parameters and buffers: every one must be in the source with its whole shape;
 * a source tensor under "model." that the model lacks is refused unless the model is one
 * pipeline stage. An f32 model takes the f32 master copies of a half-precision run. */
static nb_status model_targets(const dcp_world *w, nb_module *m, dcp_source *s, targets *ts,
                               const char *op) {
    const nb_params *lists[2] = {nb_parameters(m), nb_buffers(m)};
    nb_status st = NB_OK;
    int found = 0;
    for (int k = 0; k < 2 && st == NB_OK; k++)
        for (int i = 0; lists[k] && st == NB_OK && i < lists[k]->count; i++) {
            char name[1024];
            snprintf(name, sizeof name, "model.%s", lists[k]->names[i]);
            const dcp_tensor *src = dcp_source_find(s, name);
            if (!src) {
                st = nb__error(NB_EINVAL, "%s: %s has no tensor \"%s\"", op, s->path, name);
                break;
            }
            found++;
            dcp_lay l;
            nb_tensor *local;
            st = dcp_lay_of(w, lists[k]->tensors[i], true, &l, &local, op);
            if (st != NB_OK) break;
            bool same = l.ndim == src->ndim;
            for (int d = 0; same && d < l.ndim; d++) same = l.shape[d] == src->shape[d];
            if (!same) {
                char a[NB__SHAPE_STR], b[NB__SHAPE_STR];
                st = nb__error(NB_ESHAPE, "%s: tensor \"%s\" has shape %s in %s, but the model "
                               "expects %s", op, name, nb__shape_str(src->shape, src->ndim, a),
                               s->path, nb__shape_str(l.shape, l.ndim, b));
                dcp_lay_free(&l);
                nb_tensor_free(local);
                break;
            }
            char mk[1100];
            snprintf(mk, sizeof mk, "optim.master.%s", lists[k]->names[i]);
            const dcp_tensor *master = dcp_source_find(s, mk);
            nb_dtype dt = nb_tensor_dtype(local);
            if (master && is_half(src->dtype) && !is_half(dt) && master->ndim == src->ndim &&
                !memcmp(master->shape, src->shape, sizeof(int64_t) * (size_t)src->ndim))
                src = master; /* the f32 values, not their rounding */
            st = add_target(ts, "", name, DCP_MODEL, src, local, &l, NULL, 0);
        }
    int total = 0;
    for (int i = 0; st == NB_OK && i < s->nt; i++)
        total += strncmp(s->t[i].name, "model.", 6) == 0;
    if (st == NB_OK && total > found && !w->pp) {
        const char *extra = NULL;
        for (int i = 0; !extra && i < s->nt; i++) {
            if (strncmp(s->t[i].name, "model.", 6) != 0) continue;
            bool known = false;
            for (int k = 0; k < 2 && !known; k++)
                for (int j = 0; lists[k] && !known && j < lists[k]->count; j++)
                    known = strcmp(s->t[i].name + 6, lists[k]->names[j]) == 0;
            if (!known) extra = s->t[i].name;
        }
        st = nb__error(NB_EINVAL, "%s: %s has tensor \"%s\"%s, which the model does not have",
                       op, s->path, extra ? extra : "?",
                       total - found > 1 ? " and more" : "");
    }
    return st;
}

static int find_param(const nb_params *ps, const char *name) {
    for (int i = 0; ps && i < ps->count; i++)
        if (strcmp(ps->names[i], name) == 0) return i;
    return -1;
}

/* A tensor every rank holds whole (schedule, scaler, groups, scalars). */
static nb_status whole_target(targets *ts, const dcp_tensor *src, dcp_kind kind) {
    dcp_lay l;
    nb_status st = dcp_lay_whole(&l, src->shape, src->ndim, false);
    return st == NB_OK ? add_target(ts, "", src->name, kind, src, NULL, &l, src->shape, src->ndim)
                       : st;
}

/* The optimizer's state, named as the source names it: per parameter of the optimizer that
 * holds it (the shard optimizer under ZeRO) in that parameter's layout. */
static nb_status optim_targets(const dcp_world *w, nb_optim *holder, nb_module *model,
                               dcp_source *s, targets *ts, const char *op) {
    const nb_params *ps = nb_optim_params(holder);
    if (!ps) return nb_last_status();
    nb_status st = NB_OK;
    bool *has_state = calloc((size_t)ps->count + 1, sizeof *has_state);
    bool *has_master = calloc((size_t)ps->count + 1, sizeof *has_master);
    if (!has_state || !has_master) st = nb__error(NB_ENOMEM, "%s: out of memory", op);
    for (int i = 0; st == NB_OK && i < s->nt; i++) {
        const dcp_tensor *src = &s->t[i];
        if (strncmp(src->name, "optim.", 6) != 0) continue;
        const char *rest = src->name + 6, *dot = strchr(rest, '.');
        if (strncmp(rest, "param_groups.", 13) == 0) {
            st = whole_target(ts, src, DCP_OPTIM);
            continue;
        }
        int j = dot ? find_param(ps, dot + 1) : -1;
        if (j < 0) { /* another rank's (ZeRO) or another stage's parameter */
            if (dot && (w->pp || (model && nb_module_find(model, dot + 1)))) {
                nb_clear_error();
                continue;
            }
            nb_clear_error();
            st = nb__error(NB_EINVAL, "%s: %s holds optimizer state \"%s\" of a parameter the "
                           "optimizer does not have", op, s->path, src->name);
            break;
        }
        nb_tensor *param = ps->tensors[j];
        bool master = (size_t)(dot - rest) == 6 && strncmp(rest, "master", 6) == 0;
        if (master && !is_half(nb_tensor_dtype(param))) continue; /* an f32 model: no copy */
        has_state[j] = true;
        has_master[j] |= master;
        if (src->ndim == 0) { /* a step count */
            st = whole_target(ts, src, DCP_OPTIM);
            continue;
        }
        dcp_lay l;
        nb_tensor *local;
        st = dcp_lay_of(w, param, false, &l, &local, op);
        if (st != NB_OK) break;
        bool same = l.ndim == src->ndim;
        for (int d = 0; same && d < l.ndim; d++) same = l.shape[d] == src->shape[d];
        if (!same) {
            dcp_lay_free(&l);
            nb_tensor_free(local);
            st = nb__error(NB_ESHAPE, "%s: optimizer state \"%s\" in %s does not have the shape "
                           "of its parameter", op, src->name, s->path);
            break;
        }
        st = add_target(ts, "", src->name, DCP_OPTIM, src, NULL, &l, nb_shape(local),
                        nb_ndim(local));
        nb_tensor_free(local);
    }
    /* a half-precision parameter with state but no master copy in the source (an f32 run):
     * its master is the source's f32 parameter */
    for (int j = 0; st == NB_OK && j < ps->count; j++) {
        if (!has_state[j] || has_master[j] || !is_half(nb_tensor_dtype(ps->tensors[j]))) continue;
        char mk[1100], name[1100];
        snprintf(mk, sizeof mk, "model.%s", ps->names[j]);
        const dcp_tensor *src = dcp_source_find(s, mk);
        if (!src || src->dtype != NB_F32) continue;
        dcp_lay l;
        nb_tensor *local;
        st = dcp_lay_of(w, ps->tensors[j], false, &l, &local, op);
        snprintf(name, sizeof name, "optim.master.%s", ps->names[j]);
        if (st == NB_OK)
            st = add_target(ts, "", name, DCP_OPTIM, src, NULL, &l, nb_shape(local),
                            nb_ndim(local));
        nb_tensor_free(local);
    }
    free(has_state);
    free(has_master);
    return st;
}

static nb_status prefix_targets(dcp_source *s, const char *prefix, targets *ts) {
    nb_status st = NB_OK;
    for (int i = 0; st == NB_OK && i < s->nt; i++)
        if (strncmp(s->t[i].name, prefix, strlen(prefix)) == 0)
            st = whole_target(ts, &s->t[i], DCP_OTHER);
    return st;
}

static nb_status scalar_target(dcp_source *s, const char *name, targets *ts, const char *op) {
    const dcp_tensor *src = dcp_source_find(s, name);
    if (!src || src->dtype != NB_I64 || src->ndim != 0)
        return nb__error(NB_EFORMAT, "%s: %s has no valid \"%s\" entry", op, s->path, name);
    return whole_target(ts, src, DCP_OTHER);
}

/* Stage target t: read and verify what it needs into a host tensor of its local shape. */
static nb_status stage_target(dcp_source *s, target *t, const char *op) {
    if (t->lay.nparts == 0) return NB_OK;
    nb_tensor *stage = nb__scope_take(nb_empty_on(NB_CPU, t->shape, t->ndim, t->src->dtype));
    if (!stage) return nb_last_status();
    t->stage = stage;
    nb_status st = NB_OK;
    for (int k = 0; st == NB_OK && k < t->lay.nparts; k++) {
        const dcp_part *p = &t->lay.parts[k];
        bool all = !p->sel.flat || (p->sel.fs == 0 && p->sel.fn == nb_numel(stage));
        for (int d = 0; all && !p->sel.flat && d < t->ndim; d++)
            all = p->sel.start[d] == 0 && p->sel.len[d] == t->shape[d];
        if (all) { /* the part is the whole local tensor */
            st = fill_part(s, t->src, &p->box, stage, op);
            continue;
        }
        nb_scope_begin();
        int64_t one = p->box.fn;
        nb_tensor *buf = p->sel.flat ? nb_empty_on(NB_CPU, &one, 1, t->src->dtype)
                                     : nb_empty_on(NB_CPU, p->box.len, p->box.ndim, t->src->dtype);
        st = buf ? fill_part(s, t->src, &p->box, buf, op) : nb_last_status();
        nb_tensor *dst = st == NB_OK ? dcp_select(stage, &p->sel) : NULL;
        if (st == NB_OK) st = dst ? nb_copy_(dst, buf) : nb_last_status();
        nb_scope_end();
    }
    return st;
}

static const target *find_target(const targets *ts, const char *name) {
    for (int i = 0; i < ts->n; i++)
        if (strcmp(ts->t[i].name, name) == 0) return &ts->t[i];
    return NULL;
}

static uint64_t u64_of(const targets *ts, const char *name) {
    const target *t = find_target(ts, name);
    uint64_t v = 0;
    if (t && t->stage) memcpy(&v, nb__ptr(t->stage), sizeof v);
    return v;
}

/* ---- identity ------------------------------------------------------------------------------- */
static nb_status check_identity(const dcp_source *s, const nb_checkpoint *c, const char *op) {
    if (c->run_id[0] && s->run_id && strcmp(s->run_id, c->run_id) != 0)
        return nb__error(NB_EINVAL, "%s: %s belongs to run %s, not to this run (%s)", op, s->path,
                         s->run_id, c->run_id);
    if (c->program && s->program && strcmp(s->program, c->program) != 0)
        return nb__error(NB_EINVAL, "%s: %s was written by %s, not by %s", op, s->path,
                         s->program, c->program);
    for (int i = 0; i < c->nconfig; i++) {
        const char *name = c->config_names ? c->config_names[i] : NULL;
        const char *val = c->config_values ? c->config_values[i] : NULL;
        if (!name || !val)
            return nb__error(NB_ENULL, "%s: setting %d has no %s", op, i, !name ? "name" : "value");
        const char *saved = NULL;
        for (int k = 0; k < s->nconfig && !saved; k++)
            if (strcmp(s->config_names[k], name) == 0) saved = s->config_values[k];
        if (!saved || strcmp(saved, val) == 0) continue;
        bool allowed = false;
        for (int k = 0; k < c->nmay_change && c->may_change && !allowed; k++)
            allowed = c->may_change[k] && strcmp(c->may_change[k], name) == 0;
        if (!allowed)
            return nb__error(NB_EINVAL, "%s: %s was written with %s=%s; this run has %s=%s", op,
                             s->path, name, saved, name, val);
    }
    return NB_OK;
}

/* ---- applying ------------------------------------------------------------------------------- */
/* Host copies of a state list (to restore it if the load fails after it was applied). */
static nb_status snapshot(const nb_params *l, nb_state_list *out) {
    nb_state_list_init(out);
    if (!l) return nb_last_status();
    nb_status st = NB_OK;
    for (int i = 0; st == NB_OK && i < l->count; i++) {
        nb_scope_begin();
        nb_tensor *t = l->tensors[i];
        nb_tensor *h = nb__host_accessible(t) ? nb_clone(t) : nb_to_device(t, NB_CPU);
        st = h ? nb_state_list_add(out, NULL, l->names[i], h) : nb_last_status();
        nb_scope_end();
    }
    return st;
}

/* The names (without prefix) and staged tensors of the targets of a kind starting with prefix. */
static nb_status staged_list(const targets *ts, dcp_kind kind, const char *prefix, bool groups_only,
                             nb_state_list *out) {
    nb_state_list_init(out);
    size_t lp = strlen(prefix);
    nb_status st = NB_OK;
    for (int i = 0; st == NB_OK && i < ts->n; i++) {
        const target *t = &ts->t[i];
        if (t->kind != kind || strncmp(t->name, prefix, lp) != 0 || !t->stage) continue;
        if (groups_only && strncmp(t->name + lp, "param_groups.", 13) != 0) continue;
        st = nb_state_list_add(out, NULL, t->name + lp, t->stage);
    }
    return st;
}

typedef struct applied {
    nb_optim *opt[2];
    nb_state_list osnap[2];
    bool sched, scaler, loader;
    nb_state_list ssnap, gsnap;
    nb_loader_state lpos;
} applied;

static void rollback(nb_checkpoint *c, applied *a) {
    for (int k = 0; k < 2; k++)
        if (a->opt[k])
            nb_optim_load_state(a->opt[k], a->osnap[k].names, a->osnap[k].tensors, a->osnap[k].count);
    if (a->sched) nb_sched_load_state(c->sched, a->ssnap.names, a->ssnap.tensors, a->ssnap.count);
    if (a->scaler)
        nb_grad_scaler_load_state(c->scaler, a->gsnap.names, a->gsnap.tensors, a->gsnap.count);
    if (a->loader) nb_loader_set_state(c->loader, &a->lpos);
}

static void applied_free(applied *a) {
    for (int k = 0; k < 2; k++) nb_state_list_deinit(&a->osnap[k]);
    nb_state_list_deinit(&a->ssnap);
    nb_state_list_deinit(&a->gsnap);
}

/* Load an optimizer from the staged state, after a snapshot of its own. */
static nb_status apply_optim(nb_optim *o, const targets *ts, bool groups_only, applied *a, int k) {
    nb_state_list l, snap;
    nb_status st = staged_list(ts, DCP_OPTIM, "optim.", groups_only, &l);
    if (st == NB_OK) st = snapshot(nb_optim_state(o), &snap);
    nb_optim_state_release(o);
    if (st == NB_OK) st = nb_optim_load_state(o, l.names, l.tensors, l.count);
    if (st == NB_OK) a->opt[k] = o, a->osnap[k] = snap;
    else nb_state_list_deinit(&snap);
    nb_state_list_deinit(&l);
    return st;
}

static nb_status apply_rest(nb_checkpoint *c, const targets *ts, nb_optim *holder, applied *a) {
    nb_status st = NB_OK;
    if (c->optim) st = apply_optim(holder, ts, false, a, 0);
    if (st == NB_OK && c->optim && holder != c->optim) st = apply_optim(c->optim, ts, true, a, 1);
    nb_state_list l;
    if (st == NB_OK && c->sched) {
        st = staged_list(ts, DCP_OTHER, "sched.", false, &l);
        if (st == NB_OK) st = snapshot(nb_sched_state(c->sched), &a->ssnap);
        nb_sched_state_release(c->sched);
        if (st == NB_OK) st = nb_sched_load_state(c->sched, l.names, l.tensors, l.count);
        a->sched = st == NB_OK;
        nb_state_list_deinit(&l);
    }
    /* A file written before loss scaling existed has no "scaler." entries: the scaler keeps
     * its state (a fresh scaler's, as PyTorch's GradScaler without a saved state_dict). */
    if (st == NB_OK && c->scaler) {
        st = staged_list(ts, DCP_OTHER, "scaler.", false, &l);
        if (st == NB_OK && l.count > 0) {
            st = snapshot(nb_grad_scaler_state(c->scaler), &a->gsnap);
            if (st == NB_OK) st = nb_grad_scaler_load_state(c->scaler, l.names, l.tensors, l.count);
            a->scaler = st == NB_OK;
        }
        nb_state_list_deinit(&l);
    }
    if (st == NB_OK && c->loader) {
        st = nb_loader_get_state(c->loader, &a->lpos);
        nb_loader_state pos = {(int64_t)u64_of(ts, "loader.epoch"),
                               (int64_t)u64_of(ts, "loader.batch")};
        if (st == NB_OK) st = nb_loader_set_state(c->loader, &pos);
        a->loader = st == NB_OK;
    }
    return st;
}

static nb_status apply_model(const targets *ts) {
    nb_status st = NB_OK;
    bool grad = nb_set_grad_enabled(false);
    for (int i = 0; st == NB_OK && i < ts->n; i++) {
        const target *t = &ts->t[i];
        if (t->kind != DCP_MODEL || !t->stage) continue;
        nb_scope_begin();
        nb_tensor *src = nb_to_device(t->stage, nb__device_of(t->live));
        st = src ? nb_copy_(t->live, src) : nb_last_status();
        nb_scope_end();
    }
    nb_set_grad_enabled(grad);
    return st;
}

/* ---- the load ------------------------------------------------------------------------------- */
static nb_status build_and_stage(const dcp_world *w, nb_checkpoint *c, dcp_source *s,
                                 targets *ts, nb_optim **holder, const char *op) {
    nb_status st = check_identity(s, c, op);
    if (st == NB_OK && c->ngens > 64) st = nb__error(NB_EINVAL, "%s: at most 64 generators", op);
    bool grad = nb_set_grad_enabled(false);
    if (st == NB_OK && c->model) st = model_targets(w, c->model, s, ts, op);
    nb_optim *inner = c->optim ? dcp_zero_inner(c->optim) : NULL;
    *holder = inner ? inner : c->optim;
    if (st == NB_OK && c->optim) st = optim_targets(w, *holder, c->model, s, ts, op);
    if (st == NB_OK && c->sched) st = prefix_targets(s, "sched.", ts);
    if (st == NB_OK && c->scaler) st = prefix_targets(s, "scaler.", ts);
    if (st == NB_OK) st = scalar_target(s, "step", ts, op);
    if (st == NB_OK && c->loader) st = scalar_target(s, "loader.epoch", ts, op);
    if (st == NB_OK && c->loader) st = scalar_target(s, "loader.batch", ts, op);
    for (int i = 0; st == NB_OK && i < c->ngens; i++) {
        const char *part[3] = {"seed", "stream", "offset"};
        for (int k = 0; st == NB_OK && k < 3; k++) {
            char name[64];
            snprintf(name, sizeof name, "rng.%d.%s", i, part[k]);
            st = scalar_target(s, name, ts, op);
        }
    }
    for (int i = 0; st == NB_OK && i < ts->n; i++) st = stage_target(s, &ts->t[i], op);
    nb_set_grad_enabled(grad);
    if (st == NB_OK && s->folder && (int64_t)u64_of(ts, "step") != s->step)
        st = nb__error(NB_EFORMAT, "%s: %s: the index says step %lld, its files %lld (the index "
                       "does not match its files)", op, s->path, (long long)s->step,
                       (long long)u64_of(ts, "step"));
    for (int i = 0; st == NB_OK && i < c->ngens; i++) {
        char name[64];
        snprintf(name, sizeof name, "rng.%d.seed", i);
        uint64_t seed = u64_of(ts, name);
        if (seed != nb_generator_seed(c->gens[i]))
            st = nb__error(NB_EINVAL, "%s: generator %d was seeded with %llu, the checkpoint's "
                           "with %llu", op, i, (unsigned long long)nb_generator_seed(c->gens[i]),
                           (unsigned long long)seed);
    }
    if (st == NB_OK && c->loader) {
        int64_t e = (int64_t)u64_of(ts, "loader.epoch"), b = (int64_t)u64_of(ts, "loader.batch");
        if (e < 0 || b < 0 || b > nb_loader_num_batches(c->loader))
            st = nb__error(NB_EINVAL, "%s: %s resumes the loader at epoch %lld, batch %lld, "
                           "outside this loader's %lld batches", op, s->path, (long long)e,
                           (long long)b, (long long)nb_loader_num_batches(c->loader));
    }
    return st;
}

nb_status dcp_load(const char *path, nb_checkpoint *c, const char *op) {
    dcp_world w;
    nb_status st = dcp_world_of(c, &w, op);
    if (st != NB_OK) return st;
    dcp_source s = {0};
    targets ts = {0};
    nb_optim *holder = NULL;
    nb_scope_begin();
    st = dcp_source_open(path, &s, op);
    if (st == NB_OK) st = build_and_stage(&w, c, &s, &ts, &holder, op);
    st = dcp_agree(&w, st); /* everything read and checked, on every rank */
    applied a = {0};
    if (st == NB_OK) {
        nb_status ls = apply_rest(c, &ts, holder, &a);
        st = dcp_agree(&w, ls);
        if (st != NB_OK) rollback(c, &a);
    }
    if (st == NB_OK) st = dcp_agree(&w, apply_model(&ts));
    if (st == NB_OK) {
        for (int i = 0; i < c->ngens; i++) {
            char name[64];
            snprintf(name, sizeof name, "rng.%d.stream", i);
            nb_generator_set_stream(c->gens[i], u64_of(&ts, name));
            snprintf(name, sizeof name, "rng.%d.offset", i);
            nb_generator_set_offset(c->gens[i], u64_of(&ts, name));
        }
        c->step = (int64_t)u64_of(&ts, "step");
        if (s.run_id) snprintf(c->run_id, sizeof c->run_id, "%s", s.run_id);
    }
    applied_free(&a);
    targets_free(&ts);
    dcp_source_free(&s);
    nb_scope_end();
    return st;
}

/* ---- consolidation ---------------------------------------------------------------------------- */
nb_status dcp_consolidate(const char *path, const char *out, bool model_only, const char *op) {
    dcp_source s;
    nb_status st = dcp_source_open(path, &s, op);
    if (st != NB_OK) return st;
    nb_scope_begin();
    nb_state_list l = {0};
    for (int i = 0; st == NB_OK && i < s.nt; i++) {
        const dcp_tensor *t = &s.t[i];
        if (model_only && strncmp(t->name, "model.", 6) != 0) continue;
        nb_tensor *whole = nb_empty_on(NB_CPU, t->shape, t->ndim, t->dtype);
        dcp_box all = {.ndim = t->ndim, .fn = -1};
        memcpy(all.len, t->shape, sizeof all.len);
        st = whole ? fill_part(&s, t, &all, whole, op) : nb_last_status();
        if (st == NB_OK) st = nb_state_list_add(&l, NULL, model_only ? t->name + 6 : t->name, whole);
    }
    const char **keys = calloc((size_t)s.nconfig + 8, sizeof *keys);
    const char **vals = calloc((size_t)s.nconfig + 8, sizeof *vals);
    char **owned = calloc((size_t)s.nconfig + 1, sizeof *owned);
    int m = 0;
    if (st == NB_OK && (!keys || !vals || !owned)) st = nb__error(NB_ENOMEM, "%s: out of memory", op);
    if (st == NB_OK) {
        keys[m] = "format", vals[m++] = "pt";
        if (!model_only) {
            keys[m] = "nabla_checkpoint", vals[m++] = "1";
            if (s.run_id) keys[m] = "run_id", vals[m++] = s.run_id;
            if (s.program) keys[m] = "program", vals[m++] = s.program;
            for (int i = 0; st == NB_OK && i < s.nconfig; i++) {
                if (asprintf(&owned[i], "config.%s", s.config_names[i]) < 0) {
                    owned[i] = NULL;
                    st = nb__error(NB_ENOMEM, "%s: out of memory", op);
                    break;
                }
                keys[m] = owned[i], vals[m++] = s.config_values[i];
            }
        }
    }
    if (st == NB_OK)
        st = nb__safetensors_save_checked(out, l.names, l.tensors, l.count, keys, vals, m,
                                          !model_only, NULL);
    if (st != NB_OK && strncmp(nb_last_error(), "safetensors_save: ", 18) == 0) {
        char why[1024];
        snprintf(why, sizeof why, "%s", nb_last_error() + 18);
        st = nb__error(st, "%s: %s", op, why);
    }
    for (int i = 0; owned && i < s.nconfig; i++) free(owned[i]);
    free(owned);
    free(keys);
    free(vals);
    nb_state_list_deinit(&l);
    nb_scope_end();
    dcp_source_free(&s);
    return st;
}
