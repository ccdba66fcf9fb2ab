/* checkpoint.c - training checkpoints (nabla/checkpoint.h): the public calls (save, load,
 * consolidate) over the one implementation in dcp_*.c, the run id, and series of checkpoints:
 * their paths, rotation (keep) and the newest intact one (latest). */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "io/dcp_impl.h"
#include "io/io_impl.h"
#include "tensor/tensor_impl.h"
#include "tensor/trace.h"

/* This process's run id: 128 random bits as 32 hex digits, drawn once. */
static char process_run_id[33];
static void draw_run_id(void) {
    unsigned char b[16];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) { /* no entropy source: time and pid */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_sec * 1000000007u ^ (uint64_t)ts.tv_nsec ^
                     ((uint64_t)getpid() << 32);
        for (int i = 0; i < 16; i++) x = x * 6364136223846793005u + 1442695040888963407u,
                                      b[i] = (unsigned char)(x >> 56);
    }
    for (int i = 0; i < 16; i++) snprintf(process_run_id + 2 * i, 3, "%02x", b[i]);
}

const char *nb_checkpoint_run_id(const nb_checkpoint *c) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    if (c && c->run_id[0]) return c->run_id;
    pthread_once(&once, draw_run_id);
    return process_run_id;
}

static nb_status check_args(const char *path, const nb_checkpoint *c, const char *op) {
    if (!path || !c || !c->model)
        return nb__error(NB_ENULL, "%s: %s is NULL", op,
                         !path ? "path" : !c ? "the checkpoint" : "the model");
    if (c->keep < 0)
        return nb__error(NB_EINVAL, "%s: keep must be 0 (path itself) or at least 1, got %d", op,
                         c->keep);
    return NB_OK;
}

/* Spans (tensor/trace.h): "checkpoint save" around a save ("checkpoint write" inside it),
 * "checkpoint load" around a load. */
nb_status nb_checkpoint_save(const char *path, const nb_checkpoint *c) {
    const char *op = "checkpoint_save";
    nb_status st = check_args(path, c, op);
    if (st != NB_OK) return st;
    int tok = NB__SPAN_BEGIN("checkpoint save", NULL, NB__CAT_IO);
    dcp_job j;
    st = dcp_job_begin(path, c, &j, NULL, NB_OK, op);
    if (st == NB_OK) st = dcp_job_finish(&j, dcp_job_write(&j), op);
    dcp_job_free(&j);
    /* the state views own small tensors: back to the cache, not held until the next save */
    nb_optim_state_release(c->optim);
    nb_sched_state_release(c->sched);
    NB__SPAN_END(tok);
    return st;
}

nb_status nb_checkpoint_load(const char *path, nb_checkpoint *c) {
    const char *op = "checkpoint_load";
    nb_status st = check_args(path, c, op);
    if (st != NB_OK) return st;
    int tok = NB__SPAN_BEGIN("checkpoint load", NULL, NB__CAT_IO);
    st = dcp_load(path, c, op);
    NB__SPAN_END(tok);
    return st;
}

nb_status nb_checkpoint_consolidate(const char *path, const char *out, bool model_only) {
    const char *op = "checkpoint_consolidate";
    if (!path || !out) return nb__error(NB_ENULL, "%s: %s is NULL", op, !path ? "path" : "out");
    return dcp_consolidate(path, out, model_only, op);
}

/* ---- series of checkpoints: rotation and the newest valid one --------------------------------- */
/* base names a series: a directory (existing, or ending in '/': members DIR/checkpoint-<step>.ckpt)
 * or a file path whose stem and extension frame the step (run.ckpt: run-<step>.ckpt). A
 * member is a file or a checkpoint folder. */
typedef struct series {
    char dir[4096];
    char stem[1024];
    char ext[256];
    bool is_dir;
} series;

static nb_status series_of(const char *base, const char *op, series *s) {
    if (!base || !*base) return nb__error(NB_ENULL, "%s: the path is %s", op, base ? "empty" : "NULL");
    struct stat sb;
    size_t len = strlen(base);
    /* an existing checkpoint folder is a checkpoint, not a series' directory */
    s->is_dir = base[len - 1] == '/' ||
                (stat(base, &sb) == 0 && S_ISDIR(sb.st_mode) && !dcp_is_folder(base));
    if (len >= sizeof s->dir) return nb__error(NB_EINVAL, "%s: path too long: %s", op, base);
    if (s->is_dir) {
        snprintf(s->dir, sizeof s->dir, "%s", base);
        while (strlen(s->dir) > 1 && s->dir[strlen(s->dir) - 1] == '/') s->dir[strlen(s->dir) - 1] = 0;
        snprintf(s->stem, sizeof s->stem, "checkpoint");
        snprintf(s->ext, sizeof s->ext, ".ckpt");
        return NB_OK;
    }
    const char *slash = strrchr(base, '/');
    const char *file = slash ? slash + 1 : base;
    if (slash) snprintf(s->dir, sizeof s->dir, "%.*s", slash == base ? 1 : (int)(slash - base), base);
    else snprintf(s->dir, sizeof s->dir, ".");
    const char *dot = strrchr(file, '.');
    if (!dot || dot == file) dot = file + strlen(file);
    if ((size_t)(dot - file) >= sizeof s->stem || strlen(dot) >= sizeof s->ext)
        return nb__error(NB_EINVAL, "%s: file name too long: %s", op, base);
    snprintf(s->stem, sizeof s->stem, "%.*s", (int)(dot - file), file);
    snprintf(s->ext, sizeof s->ext, "%s", dot);
    return NB_OK;
}

static nb_status series_path(const series *s, int64_t step, char *out, size_t n, const char *op) {
    int w = snprintf(out, n, "%s/%s-%08lld%s", s->dir, s->stem, (long long)step, s->ext);
    if (w < 0 || (size_t)w >= n) return nb__error(NB_EINVAL, "%s: path too long for %s", op, s->dir);
    return NB_OK;
}

nb_status nb_checkpoint_path(const char *base, int64_t step, char *out, size_t n) {
    series s;
    if (!out) return nb__error(NB_ENULL, "checkpoint_path: out is NULL");
    if (step < 0) return nb__error(NB_EINVAL, "checkpoint_path: step %lld is negative", (long long)step);
    nb_status st = series_of(base, "checkpoint_path", &s);
    return st == NB_OK ? series_path(&s, step, out, n, "checkpoint_path") : st;
}

/* The step of a series member's file name, or -1 when name is not one. */
static int64_t member_step(const series *s, const char *name) {
    size_t ls = strlen(s->stem), le = strlen(s->ext), ln = strlen(name);
    if (ln < ls + 2 + le || strncmp(name, s->stem, ls) != 0 || name[ls] != '-' ||
        strcmp(name + ln - le, s->ext) != 0)
        return -1;
    int64_t step = 0;
    for (size_t i = ls + 1; i < ln - le; i++) {
        if (name[i] < '0' || name[i] > '9' || step > INT64_MAX / 10 - 9) return -1;
        step = step * 10 + (name[i] - '0');
    }
    return step;
}

typedef struct member {
    int64_t step;
    char path[4400];
} member;

static int cmp_newest_first(const void *a, const void *b) {
    int64_t x = ((const member *)a)->step, y = ((const member *)b)->step;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The series' members, newest first, in *out (malloc'd; *n of them). */
static nb_status list_members(const series *s, member **out, int *n, const char *op) {
    *out = NULL, *n = 0;
    DIR *d = opendir(s->dir);
    if (!d) {
        if (errno == ENOENT) return NB_OK;
        return nb__error(NB_EIO, "%s: cannot read the directory %s: %s", op, s->dir, strerror(errno));
    }
    int cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        int64_t step = member_step(s, e->d_name);
        if (step < 0) continue;
        if (*n == cap) {
            member *m = realloc(*out, sizeof(member) * (size_t)(cap = cap ? 2 * cap : 16));
            if (!m) {
                closedir(d);
                free(*out);
                *out = NULL, *n = 0;
                return nb__error(NB_ENOMEM, "%s: out of memory", op);
            }
            *out = m;
        }
        (*out)[*n].step = step;
        snprintf((*out)[*n].path, sizeof(*out)[*n].path, "%s/%s", s->dir, e->d_name);
        (*n)++;
    }
    closedir(d);
    if (*n > 1) qsort(*out, (size_t)*n, sizeof(member), cmp_newest_first);
    return NB_OK;
}

nb_status nb__checkpoint_target(const char *base, int64_t step, int keep, char *path, size_t n,
                                const char *op) {
    if (keep <= 0) {
        if (!base) return nb__error(NB_ENULL, "%s: path is NULL", op);
        if (strlen(base) >= n) return nb__error(NB_EINVAL, "%s: path too long: %s", op, base);
        snprintf(path, n, "%s", base);
        return NB_OK;
    }
    series s;
    nb_status st = series_of(base, op, &s);
    if (st == NB_OK) st = series_path(&s, step, path, n, op);
    if (st != NB_OK) return st;
    if (s.is_dir && mkdir(s.dir, 0777) != 0 && errno != EEXIST)
        return nb__error(NB_EIO, "%s: cannot create the directory %s: %s", op, s.dir,
                         strerror(errno));
    return NB_OK;
}

/* Remove a member folder (its index first). */
static void remove_dir(const char *dir) { dcp_remove_folder(dir); }

void nb__checkpoint_remove_member(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return;
    if (S_ISDIR(sb.st_mode)) remove_dir(path);
    else if (S_ISREG(sb.st_mode)) unlink(path);
}

/* Rotation after the new member is durable: the newest keep stay. A folder without an index
 * (a save that never finished) is not a checkpoint: it does not count, and goes, except busy
 * (when not NULL: the folder a later save is writing into right now, whose index comes after
 * this rotation). One that cannot be removed stays (the next save tries again). */
void nb__checkpoint_rotate(const char *base, int keep, const char *path, const char *busy) {
    series s;
    member *m;
    int count;
    if (series_of(base, "checkpoint_save", &s) != NB_OK ||
        list_members(&s, &m, &count, "checkpoint_save") != NB_OK) {
        nb_clear_error();
        return;
    }
    int kept = 0;
    for (int i = 0; i < count; i++) {
        if (strcmp(m[i].path, path) == 0) {
            kept++;
            continue;
        }
        if (busy && busy[0] && strcmp(m[i].path, busy) == 0) continue;
        struct stat sb;
        bool dir = stat(m[i].path, &sb) == 0 && S_ISDIR(sb.st_mode);
        bool junk = dir && !dcp_is_folder(m[i].path);
        if (!junk && kept < keep) {
            kept++;
            continue;
        }
        if (dir) remove_dir(m[i].path);
        else unlink(m[i].path);
    }
    free(m);
}

/* The error without the call's name ("checkpoint_latest: "), for the skip lines. */
static const char *why(void) {
    const char *e = nb_last_error();
    return strncmp(e, "checkpoint_latest: ", 19) == 0 ? e + 19 : e;
}

/* Whether path is a complete, intact checkpoint (every piece's checksum verified); its step in
 * *step. On failure the error says why. */
static nb_status check_candidate(const char *path, int64_t *step) {
    const char *op = "checkpoint_latest";
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode) && !dcp_is_folder(path)) {
        return nb__error(NB_EIO, "%s has no %s, so it is not a complete checkpoint folder (its "
                         "save did not finish)", path, DCP_INDEX);
    }
    dcp_source s;
    nb_status st = dcp_source_open(path, &s, op);
    if (st == NB_OK) st = dcp_source_verify_all(&s, op);
    if (st == NB_OK && !s.folder) { /* a file's step is its "step" entry */
        const dcp_tensor *t = dcp_source_find(&s, "step");
        nb_scope_begin();
        nb_tensor *v = t && t->dtype == NB_I64 && t->ndim == 0
                           ? nb_safetensors_get(s.files[0].f, "step") : NULL;
        if (v) memcpy(&s.step, nb__ptr(v), sizeof s.step);
        else st = nb__error(NB_EFORMAT, "%s: %s has no valid \"step\" entry", op, path);
        nb_scope_end();
    }
    if (st == NB_OK) *step = s.step;
    dcp_source_free(&s);
    return st;
}

nb_status nb_checkpoint_latest(const char *base, char *out, size_t n, int64_t *step) {
    const char *op = "checkpoint_latest";
    if (!out || !n) return nb__error(NB_ENULL, "%s: out is NULL", op);
    out[0] = 0;
    if (step) *step = -1;
    series s;
    nb_status st = series_of(base, op, &s);
    member *m = NULL;
    int count = 0;
    if (st == NB_OK) st = list_members(&s, &m, &count, op);
    if (st != NB_OK) return st;
    /* base itself, a checkpoint saved without rotation (a file or a folder), competes by its
     * step */
    struct stat sb;
    int64_t best = -1;
    char best_path[4400] = "";
    if (!s.is_dir && stat(base, &sb) == 0) {
        int64_t k;
        if (check_candidate(base, &k) == NB_OK) {
            best = k;
            snprintf(best_path, sizeof best_path, "%s", base);
        } else {
            fprintf(stderr, "nabla: checkpoint_latest: skipping %s: %s\n", base, why());
        }
        nb_clear_error();
    }
    for (int i = 0; i < count && m[i].step > best; i++) {
        int64_t k;
        if (check_candidate(m[i].path, &k) == NB_OK) {
            best = k;
            snprintf(best_path, sizeof best_path, "%s", m[i].path);
            break;
        }
        fprintf(stderr, "nabla: checkpoint_latest: skipping %s: %s\n", m[i].path, why());
        nb_clear_error();
    }
    free(m);
    if (best < 0) return NB_OK;
    if (strlen(best_path) >= n) return nb__error(NB_EINVAL, "%s: out is too short for %s", op, best_path);
    snprintf(out, n, "%s", best_path);
    if (step) *step = best;
    return NB_OK;
}
