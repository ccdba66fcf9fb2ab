/* checkpoint.c - training checkpoints (nabla/checkpoint.h): one safetensors file holding
 * model, optimizer, schedule, loader position, generator positions and step. */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "io/io_impl.h"
#include "nabla/checkpoint.h"
#include "nabla/io.h"
#include "nabla/optim.h"
#include "tensor/tensor_impl.h"
#include "tensor/trace.h"

/* u64 state is stored bit for bit in 0-dim I64 tensors. */
static nb_status add_u64(nb_state_list *l, const char *name, uint64_t v) {
    int64_t x;
    memcpy(&x, &v, sizeof x);
    nb_tensor *t = nb_from_buffer(&x, NULL, 0, NB_I64);
    nb_status st = t ? nb_state_list_add(l, NULL, name, t) : nb_last_status();
    nb_tensor_free(nb__scope_take(t));
    return st;
}

static nb_status read_u64(nb_safetensors *f, const char *path, const char *name, uint64_t *out) {
    nb_scope_begin();
    nb_status st = NB_OK;
    nb_tensor *t = nb_safetensors_find(f, name) >= 0 ? nb_safetensors_get(f, name) : NULL;
    if (!t || t->dtype != NB_I64 || nb_numel(t) != 1)
        st = nb__error(NB_EFORMAT, "checkpoint_load: %s has no valid \"%s\" entry", path, name);
    else
        st = nb_read(t, out, 1, NB_I64); /* the 64 bits as stored */
    nb_scope_end();
    return st;
}

/* An error of the safetensors writer under the name of the call the user made
 * ("checkpoint_save: run.ckpt is a FIFO, ..."); any other error (an op's, the loader's) is
 * kept as it is. Returns st. */
static nb_status as_checkpoint_error(nb_status st) {
    static const char prefix[] = "safetensors_save: ";
    const char *msg = nb_last_error();
    if (st == NB_OK || strncmp(msg, prefix, sizeof prefix - 1) != 0) return st;
    char rest[512]; /* a copy: nb__error writes the buffer msg points into */
    snprintf(rest, sizeof rest, "%s", msg + sizeof prefix - 1);
    return nb__error(st, "checkpoint_save: %s", rest);
}

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

nb_status nb_checkpoint_save(const char *path, const nb_checkpoint *c) {
    if (!path || !c || !c->model)
        return nb__error(NB_ENULL, "checkpoint_save: %s is NULL",
                         !path ? "path" : !c ? "the checkpoint" : "the model");
    return nb__checkpoint_save_ex(path, c, NULL, NULL, 0);
}

/* Spans (tensor/trace.h): "checkpoint save" around a save (the snapshot of the state, then
 * "checkpoint write" inside it), "checkpoint load" around a load. */
static nb_status checkpoint_save(const char *path, const nb_checkpoint *c,
                                 const char *const *xkeys, const char *const *xvals, int nx);
nb_status nb__checkpoint_save_ex(const char *path, const nb_checkpoint *c,
                                 const char *const *xkeys, const char *const *xvals, int nx) {
    int tok = NB__SPAN_BEGIN("checkpoint save", NULL, NB__CAT_IO);
    nb_status st = checkpoint_save(path, c, xkeys, xvals, nx);
    NB__SPAN_END(tok);
    return st;
}

void nb__checkpoint_parts_free(nb__ckpt_parts *p, const nb_checkpoint *c) {
    for (int i = 0; p->owned && i < p->nmeta; i++) free(p->owned[i]);
    free(p->owned);
    free(p->keys);
    free(p->vals);
    nb_state_list_deinit(&p->list);
    memset(p, 0, sizeof *p);
    /* the state views own small tensors: back to the cache, not held until the next save */
    if (c) nb_optim_state_release(c->optim);
    if (c) nb_sched_state_release(c->sched);
}

nb_status nb__checkpoint_collect(const nb_checkpoint *c, const char *const *xkeys,
                                 const char *const *xvals, int nx, nb__ckpt_parts *p) {
    memset(p, 0, sizeof *p);
    nb_state_list *l = &p->list;
    nb_status st = c->model ? nb_state_list_add_module(l, "model.", c->model) : NB_OK;
    if (st == NB_OK && c->optim) st = nb_state_list_add_params(l, "optim.", nb_optim_state(c->optim));
    if (st == NB_OK && c->sched) st = nb_state_list_add_params(l, "sched.", nb_sched_state(c->sched));
    if (st == NB_OK && c->scaler)
        st = nb_state_list_add_params(l, "scaler.", nb_grad_scaler_state(c->scaler));
    if (st == NB_OK && c->loader) {
        nb_loader_state pos;
        st = nb_loader_get_state(c->loader, &pos);
        if (st == NB_OK) st = add_u64(l, "loader.epoch", (uint64_t)pos.epoch);
        if (st == NB_OK) st = add_u64(l, "loader.batch", (uint64_t)pos.batch);
    }
    for (int i = 0; st == NB_OK && i < c->ngens; i++) {
        char name[64];
        nb_generator *g = c->gens[i];
        snprintf(name, sizeof name, "rng.%d.seed", i);
        st = add_u64(l, name, nb_generator_seed(g));
        snprintf(name, sizeof name, "rng.%d.stream", i);
        if (st == NB_OK) st = add_u64(l, name, nb_generator_stream(g));
        snprintf(name, sizeof name, "rng.%d.offset", i);
        if (st == NB_OK) st = add_u64(l, name, nb_generator_offset(g));
    }
    if (st == NB_OK) st = add_u64(l, "step", (uint64_t)c->step);
    /* metadata: the format, the program and "config.<name>" = value per setting */
    int nmeta = 3 + (c->program ? 1 : 0) + (c->nconfig > 0 ? c->nconfig : 0) + nx;
    const char **keys = p->keys = calloc((size_t)nmeta, sizeof *keys);
    const char **vals = p->vals = calloc((size_t)nmeta, sizeof *vals);
    char **owned = p->owned = calloc((size_t)nmeta, sizeof *owned);
    p->nmeta = nmeta;
    if (st == NB_OK && (!keys || !vals || !owned))
        st = nb__error(NB_ENOMEM, "checkpoint_save: out of memory");
    int m = 0;
    if (st == NB_OK) {
        keys[m] = "format", vals[m++] = "pt";
        keys[m] = "nabla_checkpoint", vals[m++] = "1";
        keys[m] = "run_id", vals[m++] = nb_checkpoint_run_id(c);
        if (c->program) keys[m] = "program", vals[m++] = c->program;
    }
    for (int i = 0; st == NB_OK && i < c->nconfig; i++) {
        const char *name = c->config_names ? c->config_names[i] : NULL;
        const char *val = c->config_values ? c->config_values[i] : NULL;
        if (!name || !val) {
            st = nb__error(NB_ENULL, "checkpoint_save: setting %d has no %s", i,
                           !name ? "name" : "value");
            break;
        }
        size_t n = strlen(name) + sizeof "config.";
        if (!(owned[m] = malloc(n))) {
            st = nb__error(NB_ENOMEM, "checkpoint_save: out of memory");
            break;
        }
        snprintf(owned[m], n, "config.%s", name);
        keys[m] = owned[m], vals[m++] = val;
    }
    for (int i = 0; st == NB_OK && i < nx; i++) keys[m] = xkeys[i], vals[m++] = xvals[i];
    p->m = m;
    return st;
}

nb_status nb__checkpoint_write(const char *path, const char *const *names,
                               nb_tensor *const *tensors, int n, const char *const *keys,
                               const char *const *vals, int m) {
    int tok = NB__SPAN_BEGIN("checkpoint write", NULL, NB__CAT_IO);
    nb_status st = as_checkpoint_error(
        nb__safetensors_save_checked(path, names, tensors, n, keys, vals, m, true));
    NB__SPAN_END(tok);
    return st;
}

static nb_status checkpoint_save(const char *path, const nb_checkpoint *c,
                                 const char *const *xkeys, const char *const *xvals, int nx) {
    nb__ckpt_parts p;
    nb_status st = nb__checkpoint_collect(c, xkeys, xvals, nx, &p);
    if (st == NB_OK)
        st = nb__checkpoint_write(path, p.list.names, p.list.tensors, p.list.count, p.keys,
                                  p.vals, p.m);
    nb__checkpoint_parts_free(&p, c);
    return st;
}

nb_status nb_checkpoint_load(const char *path, nb_checkpoint *c) {
    if (!path || !c || !c->model)
        return nb__error(NB_ENULL, "checkpoint_load: %s is NULL",
                         !path ? "path" : !c ? "the checkpoint" : "the model");
    return nb__checkpoint_load_ex(path, c, NULL);
}

static nb_status checkpoint_load(const char *path, nb_checkpoint *c, const nb__ckpt_optim *o);
nb_status nb__checkpoint_load_ex(const char *path, nb_checkpoint *c, const nb__ckpt_optim *o) {
    int tok = NB__SPAN_BEGIN("checkpoint load", NULL, NB__CAT_IO);
    nb_status st = checkpoint_load(path, c, o);
    NB__SPAN_END(tok);
    return st;
}

nb_checkpoint_load_opts nb_checkpoint_load_defaults(void) { return (nb_checkpoint_load_opts){0}; }

nb_status nb_checkpoint_load_ex(const char *path, nb_checkpoint *c,
                                const nb_checkpoint_load_opts *lo) {
    nb_checkpoint_load_opts d = nb_checkpoint_load_defaults();
    if (!lo) lo = &d;
    if (!path || !c || (!c->model && !lo->skip_model))
        return nb__error(NB_ENULL, "checkpoint_load: %s is NULL",
                         !path ? "path" : !c ? "the checkpoint" : "the model");
    if (lo->optim_n < 0 || (lo->optim_n > 0 && (!lo->optim_names || !lo->optim_tensors)))
        return nb__error(NB_EINVAL, "checkpoint_load: optim_n is %d with %s", lo->optim_n,
                         lo->optim_n < 0 ? "a negative count" : "no names or tensors");
    nb__ckpt_optim o = {.opt = lo->optim, .names = lo->optim_names,
                        .tensors = lo->optim_tensors, .n = lo->optim_n,
                        .no_model = lo->skip_model};
    return nb__checkpoint_load_ex(path, c, &o);
}

nb_status nb_checkpoint_target(const char *base, int64_t step, int keep, char *out, size_t n) {
    if (!base || !out)
        return nb__error(NB_ENULL, "checkpoint_target: %s is NULL", !base ? "base" : "out");
    return nb__checkpoint_target(base, step, keep, out, n, "checkpoint_save");
}

void nb_checkpoint_rotate(const char *base, int keep, const char *path) {
    if (base && path && keep > 0) nb__checkpoint_rotate(base, keep, path);
}

static nb_status checkpoint_load(const char *path, nb_checkpoint *c, const nb__ckpt_optim *o) {
    nb__remove_stale_temps(path); /* a run restarted after a kill during a save */
    nb_safetensors *f = nb_safetensors_open(path);
    if (!f) return nb_last_status();
    nb_status st = NB_OK;
    if (!nb_safetensors_metadata(f, "nabla_checkpoint"))
        st = nb__error(NB_EFORMAT, "checkpoint_load: %s is a safetensors file but not a nabla "
                       "checkpoint (to load weights only, use nb_module_load)", path);
    /* Every tensor's checksum before anything is used: a torn or damaged file changes
     * nothing. (Files of older versions have none and pass.) */
    if (st == NB_OK && nb_safetensors_verify(f, NULL) != NB_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", nb_last_error() + strlen("safetensors_verify: "));
        st = nb__error(NB_EFORMAT, "checkpoint_load: %s", msg);
    }
    const char *run = nb_safetensors_metadata(f, "run_id");
    if (st == NB_OK && c->run_id[0] && run && strcmp(run, c->run_id) != 0)
        st = nb__error(NB_EINVAL, "checkpoint_load: %s belongs to run %s, not to this run (%s)",
                       path, run, c->run_id);
    /* The run's identity before anything else: another program's file, or settings that
     * differ, change nothing. */
    const char *writer = nb_safetensors_metadata(f, "program");
    if (st == NB_OK && c->program && writer && strcmp(writer, c->program) != 0)
        st = nb__error(NB_EINVAL, "checkpoint_load: %s was written by %s, not by %s", path,
                       writer, c->program);
    for (int i = 0; st == NB_OK && i < c->nconfig; i++) {
        const char *name = c->config_names ? c->config_names[i] : NULL;
        const char *val = c->config_values ? c->config_values[i] : NULL;
        if (!name || !val) {
            st = nb__error(NB_ENULL, "checkpoint_load: setting %d has no %s", i,
                           !name ? "name" : "value");
            break;
        }
        char key[256];
        snprintf(key, sizeof key, "config.%s", name);
        const char *saved = nb_safetensors_metadata(f, key);
        if (!saved || strcmp(saved, val) == 0) continue;
        bool allowed = false;
        for (int k = 0; k < c->nmay_change && c->may_change && !allowed; k++)
            allowed = c->may_change[k] && strcmp(c->may_change[k], name) == 0;
        if (!allowed)
            st = nb__error(NB_EINVAL, "checkpoint_load: %s was written with %s=%s; this run has "
                           "%s=%s", path, name, saved, name, val);
    }
    /* Read every scalar first, so a bad file changes nothing. */
    uint64_t step = 0, epoch = 0, batch = 0;
    uint64_t rng[64][3];
    if (c->ngens > 64) st = nb__error(NB_EINVAL, "checkpoint_load: at most 64 generators");
    if (st == NB_OK) st = read_u64(f, path, "step", &step);
    if (st == NB_OK && c->loader) st = read_u64(f, path, "loader.epoch", &epoch);
    if (st == NB_OK && c->loader) st = read_u64(f, path, "loader.batch", &batch);
    for (int i = 0; st == NB_OK && i < c->ngens; i++) {
        const char *part[3] = {"seed", "stream", "offset"};
        for (int k = 0; st == NB_OK && k < 3; k++) {
            char name[64];
            snprintf(name, sizeof name, "rng.%d.%s", i, part[k]);
            st = read_u64(f, path, name, &rng[i][k]);
        }
    }
    /* Optimizer and schedule state are validated by their loaders before they change
     * anything; the model is loaded first only after both lists were read. */
    nb_state_list ol = {0}, sl = {0}, gl = {0};
    if (st == NB_OK && c->optim && !o) st = nb_state_list_add_file(&ol, f, "optim.");
    if (st == NB_OK && c->sched) st = nb_state_list_add_file(&sl, f, "sched.");
    if (st == NB_OK && c->scaler) st = nb_state_list_add_file(&gl, f, "scaler.");
    if (st == NB_OK && !(o && o->no_model)) st = nb_module_load_from(c->model, f, "model.", true);
    if (st == NB_OK && o && o->opt) {
        st = nb_optim_load_state(o->opt, o->names, o->tensors, o->n);
        if (st == NB_OK && o->loaded) o->loaded(o->ctx);
    } else if (st == NB_OK && c->optim && !o) {
        st = nb_optim_load_state(c->optim, ol.names, ol.tensors, ol.count);
    }
    if (st == NB_OK && c->sched) st = nb_sched_load_state(c->sched, sl.names, sl.tensors, sl.count);
    /* A file written before loss scaling existed has no "scaler." entries: the scaler keeps
     * its state (a fresh scaler's, as PyTorch's GradScaler without a saved state_dict). */
    if (st == NB_OK && c->scaler && gl.count > 0)
        st = nb_grad_scaler_load_state(c->scaler, gl.names, gl.tensors, gl.count);
    if (st == NB_OK && c->loader)
        st = nb_loader_set_state(c->loader, &(nb_loader_state){(int64_t)epoch, (int64_t)batch});
    for (int i = 0; st == NB_OK && i < c->ngens; i++) {
        nb_generator *g = c->gens[i];
        if (rng[i][0] != nb_generator_seed(g)) {
            st = nb__error(NB_EINVAL, "checkpoint_load: generator %d was seeded with %llu, the "
                           "checkpoint's with %llu", i, (unsigned long long)nb_generator_seed(g),
                           (unsigned long long)rng[i][0]);
            break;
        }
        st = nb_generator_set_stream(g, rng[i][1]);
        if (st == NB_OK) st = nb_generator_set_offset(g, rng[i][2]);
    }
    if (st == NB_OK) c->step = (int64_t)step;
    if (st == NB_OK && run) snprintf(c->run_id, sizeof c->run_id, "%s", run);
    nb_state_list_deinit(&ol);
    nb_state_list_deinit(&sl);
    nb_state_list_deinit(&gl);
    nb_safetensors_close(f);
    return st;
}

/* ---- series of checkpoints: rotation and the newest valid one --------------------------------- */
/* base names a series: a directory (existing, or ending in '/': files DIR/checkpoint-<step>.ckpt)
 * or a file path whose stem and extension frame the step (run.ckpt: run-<step>.ckpt). */
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
    s->is_dir = base[len - 1] == '/' || (stat(base, &sb) == 0 && S_ISDIR(sb.st_mode));
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

/* The series' files, newest first, in *out (malloc'd; *n of them). */
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

nb_status nb_checkpoint_save_keep(const char *base, const nb_checkpoint *c, int keep,
                                  char *path_out, size_t n) {
    const char *op = "checkpoint_save";
    if (!c) return nb__error(NB_ENULL, "%s: the checkpoint is NULL", op);
    if (keep < 1) return nb__error(NB_EINVAL, "%s: keep must be at least 1, got %d", op, keep);
    char path[4400];
    nb_status st = nb__checkpoint_target(base, c->step, keep, path, sizeof path, op);
    if (st != NB_OK) return st;
    if ((st = nb_checkpoint_save(path, c)) != NB_OK) return st;
    if (path_out && n) snprintf(path_out, n, "%s", path);
    nb__checkpoint_rotate(base, keep, path);
    return NB_OK;
}

/* Rotation after the new member is durable: the newest keep stay. One that cannot be
 * removed stays too (the next save tries again). Sharded checkpoints are directories. */
static void remove_dir(const char *dir);
void nb__checkpoint_rotate(const char *base, int keep, const char *path) {
    series s;
    member *m;
    int count;
    if (series_of(base, "checkpoint_save", &s) != NB_OK ||
        list_members(&s, &m, &count, "checkpoint_save") != NB_OK) {
        nb_clear_error();
        return;
    }
    for (int i = keep; i < count; i++) {
        if (strcmp(m[i].path, path) == 0) continue;
        struct stat sb;
        if (stat(m[i].path, &sb) == 0 && S_ISDIR(sb.st_mode)) remove_dir(m[i].path);
        else unlink(m[i].path);
    }
    free(m);
}

/* Pipeline checkpoints (nabla/pipeline.h, zoo/gpt_pipe.c) and sharded tensor-parallel ones
 * (nabla/gpt_tp.h, zoo/gpt_tp.c) are directories too: index.safetensors with "format" =
 * "nabla-pipe" or "nabla-tp" and the step, written last. */
static bool pipe_index(const char *dir, int64_t *step) {
    char path[4600];
    snprintf(path, sizeof path, "%s/index.safetensors", dir);
    if (access(path, F_OK) != 0) return false;
    nb_safetensors *f = nb_safetensors_open(path);
    if (!f) {
        nb_clear_error();
        return false;
    }
    const char *fmt = nb_safetensors_metadata(f, "format"), *k = nb_safetensors_metadata(f, "step");
    char *end = NULL;
    long long v = k ? strtoll(k, &end, 10) : -1;
    bool ok = fmt && (strcmp(fmt, "nabla-pipe") == 0 || strcmp(fmt, "nabla-tp") == 0) && k && *k && end && !*end && v >= 0;
    nb_safetensors_close(f);
    if (ok) *step = v;
    return ok;
}

/* Whether dir is a complete sharded (ZeRO) or pipeline checkpoint; its step in *step. */
static nb_status dir_step(const char *dir, int64_t *step) {
    nb_status st = nb__zero_checkpoint_step(dir, step);
    if (st == NB_OK) return st;
    char why[512];
    snprintf(why, sizeof why, "%s", nb_last_error());
    if (pipe_index(dir, step)) {
        nb_clear_error();
        return NB_OK;
    }
    char ip[4600];
    snprintf(ip, sizeof ip, "%s/index.safetensors", dir);
    if (access(ip, F_OK) != 0) /* neither kind: say so without naming one */
        return nb__error(NB_EIO, "%s has no index.safetensors, so it is not a complete "
                         "checkpoint directory (its save did not finish)", dir);
    return nb__error(st, "%s", why);
}

/* Remove a checkpoint directory, the index first so it stops being a checkpoint: a pipeline
 * one's stage files, a tensor-parallel one's tp- files (also those of a save that never got its index, and their writers'
 * temporary files) and consolidated model.safetensors, then a sharded one's shards and the
 * directory itself (nb__zero_checkpoint_remove). */
static void remove_dir(const char *dir) {
    int64_t k;
    const bool pipe = pipe_index(dir, &k);
    char path[4700];
    snprintf(path, sizeof path, "%s/index.safetensors", dir);
    unlink(path);
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strncmp(e->d_name, "stage-", 6) != 0 && strncmp(e->d_name, "tp-", 3) != 0 &&
            !(pipe && strncmp(e->d_name, "model.safetensors", 17) == 0))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
    nb__zero_checkpoint_remove(dir);
}

/* Whether path is a complete, intact checkpoint; its step in *step. On failure the error
 * says why. */
static nb_status check_candidate(const char *path, int64_t *step) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) return dir_step(path, step);
    nb_safetensors *f = nb_safetensors_open(path);
    if (!f) return nb_last_status();
    nb_status st = NB_OK;
    if (!nb_safetensors_metadata(f, "nabla_checkpoint"))
        st = nb__error(NB_EFORMAT, "%s is not a nabla checkpoint", path);
    if (st == NB_OK) st = nb_safetensors_verify(f, NULL);
    uint64_t v = 0;
    nb_scope_begin();
    if (st == NB_OK) st = read_u64(f, path, "step", &v);
    nb_scope_end();
    nb_safetensors_close(f);
    *step = (int64_t)v;
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
    /* base itself, a single file saved without rotation, competes by its step */
    struct stat sb;
    int64_t best = -1;
    char best_path[4400] = "";
    if (!s.is_dir && stat(base, &sb) == 0 && S_ISREG(sb.st_mode)) {
        nb__remove_stale_temps(base);
        int64_t k;
        if (check_candidate(base, &k) == NB_OK) {
            best = k;
            snprintf(best_path, sizeof best_path, "%s", base);
        } else {
            fprintf(stderr, "nabla: checkpoint_latest: skipping %s: %s\n", base, nb_last_error());
        }
        nb_clear_error();
    }
    int64_t k0; /* base itself, a sharded checkpoint directory saved without rotation */
    if (s.is_dir && dir_step(base, &k0) == NB_OK) {
        best = k0;
        snprintf(best_path, sizeof best_path, "%s", base);
    }
    nb_clear_error();
    for (int i = 0; i < count && m[i].step > best; i++) {
        int64_t k;
        nb__remove_stale_temps(m[i].path);
        if (check_candidate(m[i].path, &k) == NB_OK) {
            best = k;
            snprintf(best_path, sizeof best_path, "%s", m[i].path);
            break;
        }
        fprintf(stderr, "nabla: checkpoint_latest: skipping %s: %s\n", m[i].path, nb_last_error());
        nb_clear_error();
    }
    free(m);
    if (best < 0) return NB_OK;
    if (strlen(best_path) >= n) return nb__error(NB_EINVAL, "%s: out is too short for %s", op, best_path);
    snprintf(out, n, "%s", best_path);
    if (step) *step = best;
    return NB_OK;
}
