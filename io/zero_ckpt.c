/* zero_ckpt.c - sharded checkpoints of nb_zero (nabla/parallel.h) and their resharding.
 *
 * Layout of a checkpoint directory DIR written by W ranks:
 *   DIR/zero-<id>-<r>-of-<W>.safetensors  one per rank r: the optimizer state of rank r's
 *       shard as nb_optim_state names it ("optim.exp_avg.<param>", 1-D pieces of the
 *       parameter; "optim.step.<param>"; "optim.param_groups.<g>.<name>"), and in its
 *       metadata the layout: checkpoint_id, world_size, rank, stage, optimizer, buckets
 *       ("begin:end,..." of the flat buffer) and per piece "piece.<param>" = "lo n numel"
 *       (the piece is elements [lo, lo + n) of the flattened parameter of numel elements).
 *       Rank 0's file also holds everything else of an nb_checkpoint (model, schedule,
 *       loader, generators, step, program and settings): those are the same on every rank.
 *   DIR/index.safetensors  no tensors; metadata: checkpoint_id, world_size, stage, step and
 *       "shard.<r>" = file name. Written last, by rank 0, after every shard is on disk: the
 *       checkpoint exists only when the index does, and names the shards of one save (the
 *       id is fresh per save, so the previous checkpoint stays whole until the new index
 *       replaces it; then rank 0 removes the older shards).
 *
 * Loading reshards (like DeepSpeed's universal checkpoints): every rank reads every shard,
 * rebuilds each parameter's full state tensors by name from the pieces (checking that the
 * pieces tile them exactly), then takes the pieces of its own shard under the new layout,
 * whatever the new world size and stage, or gives the full tensors to a plain optimizer
 * (no nb_zero). A plain nb_checkpoint file loads the same way into an nb_zero. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "io/io_impl.h"
#include "nabla/checkpoint.h"
#include "nabla/io.h"
#include "parallel/zero_impl.h"
#include "tensor/tensor_impl.h"

#define INDEX_FILE "index.safetensors"

/* Collective: when any rank failed, every rank returns the error of the highest failing
 * rank (its message sent to all, prefixed with the rank on the others). */
static nb_status agree(nb_comm *c, nb_status local, const char *who) {
    (void)who; /* the failing rank's message names the call already */
    if (!c || nb_comm_size(c) == 1) return local;
    int32_t v[2] = {local == NB_OK ? 0 : nb_comm_rank(c) + 1, (int32_t)local};
    char msg[512];
    snprintf(msg, sizeof msg, "%s", local == NB_OK ? "" : nb_last_error());
    nb_tensor *t = nb__scope_take(nb_from_buffer(v, (int64_t[]){1}, 1, NB_I32));
    nb_status s = t ? nb_allreduce(c, t, NB_REDUCE_MAX) : nb_last_status();
    int32_t any = s == NB_OK ? *(const int32_t *)nb_data(t) : 0;
    nb_tensor_free(t);
    if (s != NB_OK) return local != NB_OK ? nb__error(local, "%s", msg) : s;
    if (!any) return NB_OK;
    int32_t info[2] = {v[1], 0};
    nb_tensor *m = nb__scope_take(nb_from_buffer(msg, (int64_t[]){512}, 1, NB_U8));
    nb_tensor *st = nb__scope_take(nb_from_buffer(info, (int64_t[]){2}, 1, NB_I32));
    s = m && st ? nb_broadcast(c, m, any - 1) : nb_last_status();
    if (s == NB_OK) s = nb_broadcast(c, st, any - 1);
    if (s == NB_OK) {
        memcpy(msg, nb_data(m), sizeof msg);
        msg[sizeof msg - 1] = '\0';
        memcpy(info, nb_data(st), sizeof info);
    }
    nb_tensor_free(m);
    nb_tensor_free(st);
    if (local != NB_OK && nb_comm_rank(c) == any - 1) return nb__error(local, "%s", msg);
    if (s != NB_OK) return local != NB_OK ? nb__error(local, "%s", msg) : s;
    return nb__error(info[0] ? (nb_status)info[0] : NB_EIO, "%s (on rank %d)", msg, any - 1);
}

static char *join(const char *dir, const char *name) {
    char *s = NULL;
    return asprintf(&s, "%s/%s", dir, name) < 0 ? NULL : s;
}

static uint64_t fresh_id(void) {
    uint64_t v = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &v, sizeof v) != (ssize_t)sizeof v) v = 0;
        close(fd);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return v ^ ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40);
}

/* A growable list of owned metadata strings. */
typedef struct meta {
    int n, cap;
    char **k, **v;
} meta;

static bool meta_add(meta *m, const char *k, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool meta_add(meta *m, const char *k, const char *fmt, ...) {
    if (m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 16;
        char **nk = realloc(m->k, sizeof *nk * (size_t)cap);
        if (!nk) return false;
        m->k = nk;
        char **nv = realloc(m->v, sizeof *nv * (size_t)cap);
        if (!nv) return false;
        m->v = nv, m->cap = cap;
    }
    va_list ap;
    va_start(ap, fmt);
    char *val = NULL;
    int r = vasprintf(&val, fmt, ap);
    va_end(ap);
    char *key = strdup(k);
    if (r < 0 || !key) {
        if (r >= 0) free(val);
        free(key);
        return false;
    }
    m->k[m->n] = key, m->v[m->n++] = val;
    return true;
}

static void meta_free(meta *m) {
    for (int i = 0; i < m->n; i++) free(m->k[i]), free(m->v[i]);
    free(m->k);
    free(m->v);
}

/* The metadata of this rank's shard (layout and pieces). */
static bool shard_meta(const nb_zero *z, meta *m, const char *id) {
    const nb_params *ps = nb_parameters(z->m);
    bool ok = ps && meta_add(m, "nabla_zero_checkpoint", "1") &&
              meta_add(m, "checkpoint_id", "%s", id) &&
              meta_add(m, "world_size", "%d", z->size) && meta_add(m, "rank", "%d", z->rank) &&
              meta_add(m, "stage", "%d", z->stage) &&
              meta_add(m, "optimizer", "%s", z->user->kind->name);
    if (ok && !z->ddp) {
        size_t cap = (size_t)z->nbk * 48 + 1, len = 0;
        char *b = malloc(cap);
        ok = b != NULL;
        for (int k = 0; ok && k < z->nbk; k++)
            len += (size_t)snprintf(b + len, cap - len, "%s%" PRId64 ":%" PRId64, k ? "," : "",
                                    z->b[k].begin, z->b[k].end);
        if (ok) b[len] = '\0';
        ok = ok && meta_add(m, "buckets", "%s", b);
        free(b);
        char key[512];
        for (int j = 0; ok && j < z->npieces; j++) {
            int i = z->piece_param[j];
            snprintf(key, sizeof key, "piece.%s", ps->names[i]);
            ok = meta_add(m, key, "%" PRId64 " %" PRId64 " %" PRId64, z->piece_lo[j],
                          nb_numel(z->pieces[j]), z->p[i].n);
        }
    } else if (ok && z->rank == 0) { /* stage 0: rank 0 writes the whole state */
        char key[512];
        for (int j = 0; ok && j < z->user->nparams; j++) {
            int64_t n = nb_numel(z->user->params[j].t);
            snprintf(key, sizeof key, "piece.%s", z->user->params[j].name);
            ok = meta_add(m, key, "0 %" PRId64 " %" PRId64, n, n);
        }
    }
    return ok;
}

static nb_status meta_int(nb_safetensors *f, const char *path, const char *key, int64_t *out);

nb_status nb__zero_checkpoint_step(const char *dir, int64_t *step) {
    char *ip = join(dir, INDEX_FILE);
    if (!ip) return nb__error(NB_ENOMEM, "zero_checkpoint: out of memory");
    nb_status st = NB_OK;
    nb_safetensors *idx = NULL;
    if (access(ip, F_OK) != 0)
        st = nb__error(NB_EIO, "%s has no %s, so it is not a complete sharded checkpoint", dir,
                       INDEX_FILE);
    else if (!(idx = nb_safetensors_open(ip)))
        st = nb_last_status();
    else if (!nb_safetensors_metadata(idx, "nabla_zero_checkpoint_index"))
        st = nb__error(NB_EFORMAT, "%s is not the index of a sharded checkpoint", ip);
    if (st == NB_OK) st = meta_int(idx, ip, "step", step);
    nb_safetensors_close(idx);
    free(ip);
    return st;
}

void nb__zero_checkpoint_remove(const char *dir) {
    char *ip = join(dir, INDEX_FILE);
    if (ip) unlink(ip);
    free(ip);
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strncmp(e->d_name, "zero-", 5) != 0 && strncmp(e->d_name, INDEX_FILE, 17) != 0)
            continue; /* the shards, and temporary files of their writers */
        char *p = join(dir, e->d_name);
        if (p) unlink(p);
        free(p);
    }
    if (d) closedir(d);
    rmdir(dir);
}

nb_status nb_zero_checkpoint_save_keep(nb_zero *z, const char *base, const nb_checkpoint *c,
                                       int keep, char *path_out, size_t n) {
    static const char who[] = "zero_checkpoint_save";
    if (!z || !base || !c) return nb__error(NB_ENULL, "%s: %s is NULL", who,
                                            !z ? "zero" : !base ? "base" : "the checkpoint");
    if (keep < 1) return nb__error(NB_EINVAL, "%s: keep must be at least 1, got %d", who, keep);
    char path[4400];
    nb_status st = nb_checkpoint_path(base, c->step, path, sizeof path);
    size_t len = strlen(base);
    if (st == NB_OK && z->rank == 0 && len && base[len - 1] == '/' && mkdir(base, 0777) != 0 &&
        errno != EEXIST)
        st = nb__error(NB_EIO, "%s: cannot create the directory %s: %s", who, base,
                       strerror(errno));
    if ((st = agree(z->c, st, who)) != NB_OK) return st;
    if ((st = nb_zero_checkpoint_save(z, path, c)) != NB_OK) return st;
    if (z->rank == 0) nb__checkpoint_rotate(base, keep, path);
    if (path_out && n) snprintf(path_out, n, "%s", path);
    return NB_OK;
}

/* Remove the shards of earlier saves from dir (those not of checkpoint id). */
static void remove_old_shards(const char *dir, const char *id) {
    DIR *d = opendir(dir);
    if (!d) return;
    char keep[64];
    snprintf(keep, sizeof keep, "zero-%s-", id);
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name), sl = strlen(".safetensors");
        if (strncmp(e->d_name, "zero-", 5) != 0 || n < sl ||
            strcmp(e->d_name + n - sl, ".safetensors") != 0 ||
            strncmp(e->d_name, keep, strlen(keep)) == 0)
            continue;
        char *p = join(dir, e->d_name);
        if (p) unlink(p);
        free(p);
    }
    closedir(d);
}

/* Rank 0: the index of save id (every shard on disk), then the older shards go. */
static nb_status write_index(const nb_zero *z, const char *dir, const char *id, int64_t step,
                             const char *program, const char *who) {
    if (z->rank != 0) return NB_OK;
    nb_status st = NB_OK;
    meta x = {0};
    bool ok = meta_add(&x, "nabla_zero_checkpoint_index", "1") &&
              meta_add(&x, "checkpoint_id", "%s", id) &&
              meta_add(&x, "world_size", "%d", z->size) &&
              meta_add(&x, "stage", "%d", z->stage) &&
              meta_add(&x, "step", "%" PRId64, step);
    if (ok && program) ok = meta_add(&x, "program", "%s", program);
    for (int r = 0; ok && r < z->size; r++) {
        char key[32];
        snprintf(key, sizeof key, "shard.%d", r);
        ok = meta_add(&x, key, "zero-%s-%05d-of-%05d.safetensors", id, r, z->size);
    }
    char *ip = ok ? join(dir, INDEX_FILE) : NULL;
    if (!ip) st = nb__error(NB_ENOMEM, "%s: out of memory", who);
    else st = nb_safetensors_save(ip, NULL, NULL, 0, (const char *const *)x.k,
                                  (const char *const *)x.v, x.n);
    if (st != NB_OK && strncmp(nb_last_error(), "safetensors_save: ", 18) == 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", nb_last_error() + 18);
        st = nb__error(st, "%s: %s", who, why);
    }
    if (st == NB_OK) remove_old_shards(dir, id);
    free(ip);
    meta_free(&x);
    return st;
}

/* The checks of a save, the save's id (from rank 0) and dir created: collective. */
static nb_status begin_save(nb_zero *z, const char *dir, const nb_checkpoint *c, const char *who,
                            char id[20]) {
    if (c->model != z->m)
        return nb__error(NB_EINVAL, "%s: the checkpoint's model is not the one nb_zero wraps", who);
    if (c->optim && c->optim != z->user)
        return nb__error(NB_EINVAL, "%s: the checkpoint's optimizer is not the one nb_zero "
                         "wraps", who);
    /* One id for this save, from rank 0. */
    uint64_t idv = z->rank == 0 ? fresh_id() : 0;
    nb_status st = NB_OK;
    if (z->size > 1) {
        nb_tensor *t = nb_from_buffer(&idv, (int64_t[]){1}, 1, NB_I64);
        st = t ? nb_broadcast(z->c, t, 0) : nb_last_status();
        if (st == NB_OK) memcpy(&idv, nb_data(t), sizeof idv);
        nb_tensor_free(t ? nb__scope_take(t) : NULL);
        if (st != NB_OK) return st;
    }
    snprintf(id, 20, "%016" PRIx64, idv);
    if (z->rank == 0 && mkdir(dir, 0777) != 0) {
        struct stat sb;
        if (errno != EEXIST)
            st = nb__error(NB_EIO, "%s: cannot create the directory %s: %s", who, dir,
                           strerror(errno));
        else if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
            st = nb__error(NB_EIO, "%s: %s exists and is not a directory (a sharded checkpoint "
                           "is a directory); refusing to replace it", who, dir);
    }
    return agree(z->c, st, who);
}

/* This rank's shard of save id: written now, or (w given) handed to w's thread. */
static nb_status save_shard(nb_zero *z, const char *dir, const nb_checkpoint *c, const char *id,
                            nb_checkpoint_writer *w, const char *who) {
    nb_status st = NB_OK;
    char name[96];
    snprintf(name, sizeof name, "zero-%s-%05d-of-%05d.safetensors", id, z->rank, z->size);
    char *path = join(dir, name);
    meta m = {0};
    if (!path || !shard_meta(z, &m, id)) st = nb__error(NB_ENOMEM, "%s: out of memory", who);
    nb_checkpoint c2 = {.step = c->step, .program = c->program};
    if (z->rank == 0) c2 = *c;
    else c2.model = NULL;
    c2.optim = NULL;
    if (c->optim && z->inner) { /* the hyperparameters as the schedule set them */
        for (int g = 0; g < z->user->ngroups; g++) z->inner->groups[g] = z->user->groups[g];
        c2.optim = z->inner;
    } else if (c->optim && z->rank == 0) {
        c2.optim = c->optim; /* stage 0: the whole state, once */
    }
    /* stage 3: rank 0 writes the whole model (a collective, so every rank gathers) */
    nb_status gs = nb_zero_gather_params(z);
    if (st == NB_OK) st = gs;
    if (st == NB_OK)
        st = w ? nb__checkpoint_writer_save_file(w, path, &c2, (const char *const *)m.k,
                                                 (const char *const *)m.v, m.n)
               : nb__checkpoint_save_ex(path, &c2, (const char *const *)m.k,
                                        (const char *const *)m.v, m.n);
    nb_zero_release_params(z);
    meta_free(&m);
    free(path);
    return st;
}

nb_status nb_zero_checkpoint_save(nb_zero *z, const char *dir, const nb_checkpoint *c) {
    static const char who[] = "zero_checkpoint_save";
    if (!z || !dir || !c || !c->model)
        return nb__error(NB_ENULL, "%s: %s is NULL", who,
                         !z ? "zero" : !dir ? "dir" : !c ? "the checkpoint" : "the model");
    char id[20];
    nb_status st = begin_save(z, dir, c, who, id);
    if (st != NB_OK) return st;
    st = save_shard(z, dir, c, id, NULL, who);
    if ((st = agree(z->c, st, who)) != NB_OK) return st;
    /* every shard is on disk: the index makes the checkpoint */
    st = write_index(z, dir, id, c->step, c->program, who);
    return agree(z->c, st, who);
}

/* Complete w's sharded save in flight, if any: this rank's shard durable, all ranks agree,
 * rank 0 writes the index. Collective. */
static nb_status finish_async(nb_zero *z, nb_checkpoint_writer *w, const char *who) {
    nb__zero_pending *p = nb__checkpoint_writer_zero(w);
    if (!p->pending) return NB_OK; /* the same on every rank: they made the same calls */
    p->pending = false;
    nb_status st = agree(z->c, nb_checkpoint_writer_wait(w), who);
    if (st != NB_OK) return st; /* no index: the checkpoint does not exist */
    st = write_index(z, p->dir, p->id, p->step, p->has_program ? p->program : NULL, who);
    return agree(z->c, st, who);
}

nb_status nb_zero_checkpoint_save_async(nb_zero *z, nb_checkpoint_writer *w, const char *dir,
                                        const nb_checkpoint *c) {
    static const char who[] = "zero_checkpoint_save_async";
    if (!z || !w || !dir || !c || !c->model)
        return nb__error(NB_ENULL, "%s: %s is NULL", who,
                         !z ? "zero" : !w ? "the writer" : !dir ? "dir" : !c ? "the checkpoint"
                                                                          : "the model");
    if (nb__checkpoint_writer_skips(w))
        return nb__error(NB_EINVAL, "%s: the writer's policy is NB_CKPT_SKIP; a sharded save "
                         "needs NB_CKPT_WAIT (every rank must write every save)", who);
    if (strlen(dir) >= sizeof nb__checkpoint_writer_zero(w)->dir ||
        (c->program && strlen(c->program) >= sizeof nb__checkpoint_writer_zero(w)->program))
        return nb__error(NB_EINVAL, "%s: %s too long", who,
                         strlen(dir) >= 4096 ? "the directory name is" : "the program name is");
    nb_status st = finish_async(z, w, who);
    char id[20];
    if (st == NB_OK) st = begin_save(z, dir, c, who, id);
    if (st != NB_OK) return st;
    st = agree(z->c, save_shard(z, dir, c, id, w, who), who);
    if (st != NB_OK) { /* a rank's snapshot failed: no index for this save */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", nb_last_error());
        nb_checkpoint_writer_wait(w); /* this rank's shard, if it started: left to be removed */
        return nb__error(st, "%s", msg);
    }
    nb__zero_pending *p = nb__checkpoint_writer_zero(w);
    *p = (nb__zero_pending){.pending = true, .step = c->step, .size = z->size,
                            .stage = z->stage, .has_program = c->program != NULL};
    snprintf(p->dir, sizeof p->dir, "%s", dir);
    snprintf(p->id, sizeof p->id, "%s", id);
    if (c->program) snprintf(p->program, sizeof p->program, "%s", c->program);
    return NB_OK;
}

nb_status nb_zero_checkpoint_wait(nb_zero *z, nb_checkpoint_writer *w) {
    static const char who[] = "zero_checkpoint_wait";
    if (!z || !w) return nb__error(NB_ENULL, "%s: %s is NULL", who, !z ? "zero" : "the writer");
    return finish_async(z, w, who);
}

/* ---- load -------------------------------------------------------------------------------- */
/* Full per-parameter state rebuilt from pieces, by name ("exp_avg.<param>"). */
typedef struct full_state {
    nb_state_list l;  /* names without "optim." */
    int64_t *covered; /* per entry: elements written (slot entries), -1 for scalars */
} full_state;

static int list_find(const nb_state_list *l, const char *name) {
    for (int i = 0; i < l->count; i++)
        if (strcmp(l->names[i], name) == 0) return i;
    return -1;
}

static nb_status meta_int(nb_safetensors *f, const char *path, const char *key, int64_t *out) {
    const char *v = nb_safetensors_metadata(f, key);
    char *end = NULL;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || end == v || *end)
        return nb__error(NB_EFORMAT, "zero_checkpoint_load: %s has no valid \"%s\" in its "
                         "metadata", path, key);
    *out = x;
    return NB_OK;
}

/* Add shard f's optimizer entries to fs; shapes come from the model entries of shard0. */
static nb_status gather_shard(full_state *fs, nb_safetensors *f, const char *path,
                              nb_safetensors *shard0) {
    static const char who[] = "zero_checkpoint_load";
    nb_state_list l = {0};
    nb_status st = nb_state_list_add_file(&l, f, "optim.");
    for (int e = 0; st == NB_OK && e < l.count; e++) {
        const char *name = l.names[e];
        nb_tensor *t = l.tensors[e];
        const char *dot = strchr(name, '.');
        bool group = strncmp(name, "param_groups.", 13) == 0;
        bool scalar = group || (dot && dot - name == 4 && strncmp(name, "step", 4) == 0);
        int at = list_find(&fs->l, name);
        if (scalar) {
            if (at >= 0) continue; /* the same on every shard */
            st = nb_state_list_add(&fs->l, NULL, name, t);
            if (st == NB_OK) fs->covered[fs->l.count - 1] = -1;
            continue;
        }
        if (!dot) {
            st = nb__error(NB_EFORMAT, "%s: %s: unexpected entry \"optim.%s\"", who, path, name);
            break;
        }
        char key[512];
        snprintf(key, sizeof key, "piece.%s", dot + 1);
        const char *pv = nb_safetensors_metadata(f, key);
        long long lo, n, numel;
        if (!pv || sscanf(pv, "%lld %lld %lld", &lo, &n, &numel) != 3 || lo < 0 || n < 0 ||
            lo + n > numel || nb_numel(t) != n) {
            st = nb__error(NB_EFORMAT, "%s: %s: the piece of \"%s\" has no valid range in the "
                           "metadata (\"%s\" = \"%s\", %lld elements stored)", who, path,
                           dot + 1, key, pv ? pv : "", (long long)nb_numel(t));
            break;
        }
        if (at < 0) {
            char mk[512];
            snprintf(mk, sizeof mk, "model.%s", dot + 1);
            int mi = nb_safetensors_find(shard0, mk);
            nb_safetensors_info info;
            if (mi < 0 || nb_safetensors_info_at(shard0, mi, &info) != NB_OK) {
                st = nb__error(NB_EFORMAT, "%s: %s holds state of \"%s\", which the model in "
                               "shard 0 does not have", who, path, dot + 1);
                break;
            }
            nb_tensor *full = nb_zeros(info.shape, info.ndim, t->dtype);
            if (!full || nb_numel(full) != numel) {
                st = full ? nb__error(NB_EFORMAT, "%s: %s: \"%s\" has %lld elements in the "
                                      "model but %lld in the piece's range", who, path, dot + 1,
                                      (long long)nb_numel(full), numel)
                          : nb_last_status();
                nb_tensor_free(full ? nb__scope_take(full) : NULL);
                break;
            }
            st = nb_state_list_add(&fs->l, NULL, name, full);
            nb_tensor_free(nb__scope_take(full));
            if (st != NB_OK) break;
            at = fs->l.count - 1;
            fs->covered[at] = 0;
        }
        nb_tensor *full = fs->l.tensors[at];
        if (t->dtype != full->dtype || fs->covered[at] < 0) {
            st = nb__error(NB_EFORMAT, "%s: %s: the pieces of \"%s\" disagree in type", who,
                           path, name);
            break;
        }
        nb_scope_begin();
        nb_tensor *flat = nb_view(full, (int64_t[]){numel}, 1);
        nb_tensor *dst = flat ? nb_narrow(flat, 0, lo, n) : NULL;
        nb_tensor *src = dst ? nb_view(t, (int64_t[]){n}, 1) : NULL;
        st = src ? nb_copy_(dst, src) : nb_last_status();
        nb_scope_end();
        fs->covered[at] += n;
    }
    nb_state_list_deinit(&l);
    return st;
}

/* The pieces of z's shard cut from full state (names without "optim."), into out. */
static nb_status slice_for(const nb_zero *z, const nb_state_list *full, nb_state_list *out) {
    const nb_params *ps = nb_parameters(z->m);
    nb_status st = ps ? NB_OK : nb_last_status();
    for (int e = 0; st == NB_OK && e < full->count; e++) {
        const char *name = full->names[e];
        if (strncmp(name, "param_groups.", 13) == 0) {
            st = nb_state_list_add(out, NULL, name, full->tensors[e]);
            continue;
        }
        const char *dot = strchr(name, '.');
        int j = 0;
        while (dot && j < z->npieces && strcmp(ps->names[z->piece_param[j]], dot + 1) != 0) j++;
        if (!dot || j == z->npieces) continue; /* not in this rank's shard (or unknown: the
                                                 * optimizer's loader names what is missing) */
        nb_tensor *t = full->tensors[e];
        if (t->ndim == 0) {
            st = nb_state_list_add(out, NULL, name, t);
            continue;
        }
        int64_t n = nb_numel(z->pieces[j]);
        if (nb_numel(t) != z->p[z->piece_param[j]].n) {
            st = nb__error(NB_ESHAPE, "zero_checkpoint_load: '%s' has %lld elements but the "
                           "parameter has %lld", name, (long long)nb_numel(t),
                           (long long)z->p[z->piece_param[j]].n);
            break;
        }
        nb_scope_begin();
        nb_tensor *c = nb_contiguous(t);
        nb_tensor *flat = c ? nb_view(c, (int64_t[]){nb_numel(t)}, 1) : NULL;
        nb_tensor *piece = flat ? nb_narrow(flat, 0, z->piece_lo[j], n) : NULL;
        st = piece ? nb_state_list_add(out, NULL, name, piece) : nb_last_status();
        nb_scope_end();
    }
    return st;
}

/* Read a sharded checkpoint's optimizer state into full (whole tensors by name); *shard0
 * gets the path of the shard holding the rest. */
static nb_status read_sharded(const char *dir, full_state *fs, char **shard0) {
    static const char who[] = "zero_checkpoint_load";
    char *ip = join(dir, INDEX_FILE);
    if (!ip) return nb__error(NB_ENOMEM, "%s: out of memory", who);
    if (access(ip, F_OK) != 0) {
        nb_status st = nb__error(NB_EIO, "%s: %s has no %s, so it is not a complete sharded "
                                 "checkpoint (a save that did not finish?)", who, dir,
                                 INDEX_FILE);
        free(ip);
        return st;
    }
    nb_safetensors *idx = nb_safetensors_open(ip);
    nb_status st = idx ? NB_OK : nb_last_status();
    int64_t world = 0;
    const char *id = idx ? nb_safetensors_metadata(idx, "checkpoint_id") : NULL;
    if (st == NB_OK && (!nb_safetensors_metadata(idx, "nabla_zero_checkpoint_index") || !id))
        st = nb__error(NB_EFORMAT, "%s: %s is not the index of a sharded checkpoint", who, ip);
    if (st == NB_OK) st = meta_int(idx, ip, "world_size", &world);
    if (st == NB_OK && (world < 1 || world > 1 << 20))
        st = nb__error(NB_EFORMAT, "%s: %s: bad world_size %lld", who, ip, (long long)world);
    nb_safetensors **sh = st == NB_OK ? calloc((size_t)world, sizeof *sh) : NULL;
    char **paths = st == NB_OK ? calloc((size_t)world, sizeof *paths) : NULL;
    if (st == NB_OK && (!sh || !paths)) st = nb__error(NB_ENOMEM, "%s: out of memory", who);
    for (int r = 0; st == NB_OK && r < world; r++) {
        char key[32];
        snprintf(key, sizeof key, "shard.%d", r);
        const char *fname = nb_safetensors_metadata(idx, key);
        if (!fname || strchr(fname, '/')) {
            st = nb__error(NB_EFORMAT, "%s: %s does not name shard %d", who, ip, r);
            break;
        }
        if (!(paths[r] = join(dir, fname))) {
            st = nb__error(NB_ENOMEM, "%s: out of memory", who);
            break;
        }
        if (access(paths[r], F_OK) != 0) {
            st = nb__error(NB_EIO, "%s: shard %d of %lld (%s) is missing", who, r,
                           (long long)world, paths[r]);
            break;
        }
        if (!(sh[r] = nb_safetensors_open(paths[r]))) {
            st = nb_last_status();
            break;
        }
        const char *sid = nb_safetensors_metadata(sh[r], "checkpoint_id");
        int64_t sw = -1, sr = -1;
        if (!nb_safetensors_metadata(sh[r], "nabla_zero_checkpoint") || !sid)
            st = nb__error(NB_EFORMAT, "%s: %s is not a shard of a sharded checkpoint", who,
                           paths[r]);
        else if (strcmp(sid, id) != 0)
            st = nb__error(NB_EINVAL, "%s: %s is a shard of checkpoint %s, but the index names "
                           "checkpoint %s (a shard of another run or save)", who, paths[r], sid,
                           id);
        if (st == NB_OK) st = meta_int(sh[r], paths[r], "world_size", &sw);
        if (st == NB_OK) st = meta_int(sh[r], paths[r], "rank", &sr);
        if (st == NB_OK && (sw != world || sr != r))
            st = nb__error(NB_EINVAL, "%s: %s says it is shard %lld of %lld, but the index "
                           "expects shard %d of %lld", who, paths[r], (long long)sr,
                           (long long)sw, r, (long long)world);
    }
    int64_t total = 0;
    for (int r = 0; st == NB_OK && r < world; r++) total += nb_safetensors_count(sh[r]);
    if (st == NB_OK && !(fs->covered = calloc((size_t)total + 1, sizeof *fs->covered)))
        st = nb__error(NB_ENOMEM, "%s: out of memory", who);
    for (int r = 0; st == NB_OK && r < world; r++) st = gather_shard(fs, sh[r], paths[r], sh[0]);
    for (int e = 0; st == NB_OK && e < fs->l.count; e++)
        if (fs->covered[e] >= 0 && fs->covered[e] != nb_numel(fs->l.tensors[e]))
            st = nb__error(NB_EFORMAT, "%s: the shards of %s hold %lld of the %lld elements of "
                           "'%s'", who, dir, (long long)fs->covered[e],
                           (long long)nb_numel(fs->l.tensors[e]), fs->l.names[e]);
    if (st == NB_OK) {
        *shard0 = paths[0];
        paths[0] = NULL;
    }
    for (int r = 0; sh && r < world; r++) nb_safetensors_close(sh[r]);
    for (int r = 0; paths && r < world; r++) free(paths[r]);
    free(sh);
    free(paths);
    nb_safetensors_close(idx);
    free(ip);
    return st;
}

static nb_status load_local(nb_zero *z, const char *path, nb_checkpoint *c) {
    static const char who[] = "zero_checkpoint_load";
    struct stat sb;
    if (stat(path, &sb) != 0)
        return nb__error(NB_EIO, "%s: cannot open %s: %s", who, path, strerror(errno));
    bool sharded = S_ISDIR(sb.st_mode);
    bool plain_target = !z || z->ddp || !c->optim; /* full tensors, or no optimizer */
    if (!sharded && plain_target) return nb_checkpoint_load(path, c);
    full_state fs = {0};
    char *shard0 = NULL;
    nb_status st = NB_OK;
    if (sharded) {
        st = read_sharded(path, &fs, &shard0);
    } else { /* a plain checkpoint into an nb_zero: its optimizer entries are the full state */
        nb_safetensors *f = nb_safetensors_open(path);
        st = f ? nb_state_list_add_file(&fs.l, f, "optim.") : nb_last_status();
        nb_safetensors_close(f);
        shard0 = strdup(path);
        if (st == NB_OK && !shard0) st = nb__error(NB_ENOMEM, "%s: out of memory", who);
    }
    nb_state_list mine = {0};
    nb__ckpt_optim o = {0};
    if (st == NB_OK && c->optim && !plain_target) {
        st = slice_for(z, &fs.l, &mine);
        o = (nb__ckpt_optim){.opt = z->inner, .names = (const char *const *)mine.names,
                             .tensors = mine.tensors, .n = mine.count,
                             .loaded = nb__zero_copy_groups, .ctx = z};
    } else if (st == NB_OK && c->optim) {
        o = (nb__ckpt_optim){.opt = c->optim, .names = (const char *const *)fs.l.names,
                             .tensors = fs.l.tensors, .n = fs.l.count};
    }
    if (st == NB_OK) st = nb__checkpoint_load_ex(shard0, c, &o);
    nb_state_list_deinit(&mine);
    nb_state_list_deinit(&fs.l);
    free(fs.covered);
    free(shard0);
    return st;
}

nb_status nb_zero_checkpoint_load(nb_zero *z, const char *path, nb_checkpoint *c) {
    static const char who[] = "zero_checkpoint_load";
    if (!path || !c || !c->model)
        return nb__error(NB_ENULL, "%s: %s is NULL", who,
                         !path ? "path" : !c ? "the checkpoint" : "the model");
    if (z && c->model != z->m)
        return nb__error(NB_EINVAL, "%s: the checkpoint's model is not the one nb_zero wraps", who);
    if (z && c->optim && c->optim != z->user)
        return nb__error(NB_EINVAL, "%s: the checkpoint's optimizer is not the one nb_zero "
                         "wraps", who);
    nb_scope_begin();
    nb_status st = z ? nb_zero_gather_params(z) : NB_OK; /* stage 3: load into whole ones */
    if (st == NB_OK) st = load_local(z, path, c);
    if (z) nb_zero_release_params(z); /* keeps this rank's part */
    nb_scope_end();
    return z ? agree(z->c, st, who) : st;
}

/* ---- consolidation ------------------------------------------------------------------------- */
static bool zero_meta_key(const char *k) {
    static const char *const keys[] = {"nabla_zero_checkpoint", "checkpoint_id", "world_size",
                                       "rank", "stage", "optimizer", "buckets"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (strcmp(k, keys[i]) == 0) return true;
    return strncmp(k, "piece.", 6) == 0;
}

nb_status nb_zero_checkpoint_consolidate(const char *dir, const char *out, bool model_only) {
    static const char who[] = "zero_checkpoint_consolidate";
    if (!dir || !out) return nb__error(NB_ENULL, "%s: %s is NULL", who, !dir ? "dir" : "out");
    nb_scope_begin();
    full_state fs = {0};
    char *shard0 = NULL;
    nb_state_list l = {0};
    nb_safetensors *f = NULL;
    const char **keys = NULL, **vals = NULL;
    int nmeta = 0;
    nb_status st = read_sharded(dir, &fs, &shard0);
    if (st == NB_OK && !(f = nb_safetensors_open(shard0))) st = nb_last_status();
    if (st == NB_OK && model_only) {
        st = nb_state_list_add_file(&l, f, "model.");
        static const char *const fk[] = {"format"}, *const fv[] = {"pt"};
        if (st == NB_OK) st = nb_safetensors_save(out, l.names, l.tensors, l.count, fk, fv, 1);
    } else if (st == NB_OK) {
        for (int i = 0; st == NB_OK && i < nb_safetensors_count(f); i++) {
            const char *name = nb_safetensors_name(f, i);
            if (strncmp(name, "optim.", 6) == 0) continue;
            nb_tensor *t = nb_safetensors_get(f, name);
            st = t ? nb_state_list_add(&l, NULL, name, t) : nb_last_status();
        }
        if (st == NB_OK) st = nb_state_list_add_params(&l, "optim.", &(nb_params){
                                  .count = fs.l.count, .names = fs.l.names,
                                  .tensors = fs.l.tensors});
        int nm = nb_safetensors_metadata_count(f);
        keys = calloc((size_t)nm + 1, sizeof *keys);
        vals = calloc((size_t)nm + 1, sizeof *vals);
        if (st == NB_OK && (!keys || !vals)) st = nb__error(NB_ENOMEM, "%s: out of memory", who);
        for (int i = 0; st == NB_OK && i < nm; i++) {
            const char *k = nb_safetensors_metadata_key(f, i);
            /* the shard's own checksums do not describe the whole tensors: fresh ones */
            if (zero_meta_key(k) || strncmp(k, "checksum.", 9) == 0) continue;
            keys[nmeta] = k, vals[nmeta++] = nb_safetensors_metadata(f, k);
        }
        if (st == NB_OK)
            st = nb__safetensors_save_checked(out, l.names, l.tensors, l.count, keys, vals,
                                              nmeta, true);
    }
    if (st != NB_OK && strncmp(nb_last_error(), "safetensors_save: ", 18) == 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", nb_last_error() + 18);
        st = nb__error(st, "%s: %s", who, why);
    }
    free(keys);
    free(vals);
    nb_safetensors_close(f);
    nb_state_list_deinit(&l);
    nb_state_list_deinit(&fs.l);
    free(fs.covered);
    free(shard0);
    nb_scope_end();
    return st;
}
