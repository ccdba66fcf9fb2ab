/* dcp_save.c - writing a checkpoint (nabla/checkpoint.h): the ranks agree whether the state
 * needs a folder (some rank holds a part of a tensor that no other rank writes) or fits one
 * plain file (one process, or DDP: rank 0 holds and writes it all); each writing rank writes
 * its pieces to its own file (checksummed, atomically), and once every rank's file is durable
 * rank 0 writes the index, which makes the checkpoint exist, then removes the files of
 * earlier saves and rotates the series. The asynchronous writer (checkpoint_writer.c) runs
 * the same job: its write on a thread, the rest at the next call. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "io/dcp_impl.h"
#include "io/io_impl.h"
#include "tensor/tensor_impl.h"
#include "tensor/trace.h"

/* ---- agreement ------------------------------------------------------------------------------ */
nb_status dcp_agree(const dcp_world *w, nb_status local) {
    if (!w->comm) return local;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", local == NB_OK ? "" : nb_last_error());
    nb_scope_begin();
    /* the lowest failing rank speaks: size - rank is largest for it */
    nb_tensor *t = nb_scalar(local == NB_OK ? 0 : w->size - w->rank, NB_I32);
    nb_status st = t ? nb_allreduce(w->comm, t, NB_REDUCE_MAX) : nb_last_status();
    int who = st == NB_OK && nb_item_i64(t) > 0 ? w->size - (int)nb_item_i64(t) : -1;
    if (st == NB_OK && who >= 0) {
        int32_t code = (int32_t)local;
        nb_tensor *m = nb_from_buffer(msg, (int64_t[]){sizeof msg}, 1, NB_U8);
        nb_tensor *c = nb_from_buffer(&code, (int64_t[]){1}, 1, NB_I32);
        st = m && c ? nb_broadcast(w->comm, m, who) : nb_last_status();
        if (st == NB_OK) st = nb_broadcast(w->comm, c, who);
        if (st == NB_OK) {
            memcpy(msg, nb_data(m), sizeof msg);
            msg[sizeof msg - 1] = '\0';
            code = *(const int32_t *)nb_data(c);
        }
        if (st == NB_OK) local = code != NB_OK ? (nb_status)code : NB_EIO;
    }
    nb_scope_end();
    if (st != NB_OK) return local != NB_OK ? nb__error(local, "%s", msg) : st;
    if (who < 0) return NB_OK;
    if (who == w->rank) return nb__error(local, "%s", msg);
    return nb__error(local, "%s (on rank %d)", msg, who);
}

/* ---- files ---------------------------------------------------------------------------------- */
static const char *errno_str(int e) {
    static _Thread_local char buf[128];
    return strerror_r(e, buf, sizeof buf);
}

static nb_status sync_dir(const char *path, const char *op) {
    const char *slash = strrchr(path, '/');
    char dir[4400];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash == path ? 1 : slash - path) : 1,
             slash ? path : ".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), err = 0;
    if (fd >= 0) {
        if (fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP && errno != EOPNOTSUPP) err = errno;
        close(fd);
    }
    return err ? nb__error(NB_EIO, "%s: wrote %s but cannot sync its directory: %s", op, path,
                           errno_str(err))
               : NB_OK;
}

nb_status dcp_write_text(const char *path, const char *text, const char *op) {
    static atomic_uint counter;
    char tmp[4500];
    int fd = -1, err = 0;
    for (int tries = 0; fd < 0 && tries < 100; tries++) {
        snprintf(tmp, sizeof tmp, "%s.tmp-%ld-%u", path, (long)getpid(),
                 atomic_fetch_add(&counter, 1u));
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        err = fd < 0 ? errno : 0;
        if (fd < 0 && err != EEXIST) break;
    }
    if (fd < 0) return nb__error(NB_EIO, "%s: cannot create %s: %s", op, tmp, errno_str(err));
    (void)flock(fd, LOCK_EX | LOCK_NB); /* a live writer (see nb__remove_stale_temps) */
    const char *what = "write";
    size_t n = strlen(text);
    for (size_t done = 0; !err && done < n;) {
        ssize_t w = write(fd, text + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) err = w < 0 ? errno : EIO;
        else done += (size_t)w;
    }
    if (!err && fsync(fd) != 0) err = errno, what = "sync";
    if (close(fd) != 0 && !err) err = errno, what = "close";
    if (!err && rename(tmp, path) != 0) err = errno, what = "rename the temporary file onto";
    if (err) {
        unlink(tmp);
        return nb__error(NB_EIO, "%s: cannot %s %s: %s", op, what, path, errno_str(err));
    }
    return sync_dir(path, op);
}

static bool is_ours(const char *name) {
    static const char *const prefixes[] = {"shard-", "index.json"};
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++)
        if (strncmp(name, prefixes[i], strlen(prefixes[i])) == 0) return true;
    return false;
}

void dcp_remove_folder(const char *dir) {
    char path[4800];
    snprintf(path, sizeof path, "%s/" DCP_INDEX, dir);
    unlink(path); /* first: from here on it is not a checkpoint */
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!is_ours(e->d_name)) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
    rmdir(dir);
}

bool dcp_is_folder(const char *path) {
    char ip[4600];
    struct stat sb;
    snprintf(ip, sizeof ip, "%s/" DCP_INDEX, path);
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode) && access(ip, F_OK) == 0;
}

/* Rank 0 after the index: the files of other saves go (a killed save's too), but those of
 * save_id and of next_id (a later save being written now, "" for none). */
static void remove_other_saves(const char *dir, const char *save_id, const char *next_id) {
    char keep[64], keep2[64], path[4800];
    snprintf(keep, sizeof keep, "shard-%s-", save_id);
    snprintf(keep2, sizeof keep2, "shard-%s-", next_id);
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strncmp(e->d_name, "shard-", 6) != 0 || strncmp(e->d_name, keep, strlen(keep)) == 0 ||
            (*next_id && strncmp(e->d_name, keep2, strlen(keep2)) == 0))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
}

/* ---- the job -------------------------------------------------------------------------------- */
void dcp_job_free(dcp_job *j) {
    for (int i = 0; i < j->n; i++) {
        free(j->names[i]);
        nb_tensor_free(j->tensors[i]);
        if (j->desc) free(j->desc[i].entry), free(j->desc[i].key);
    }
    free(j->names);
    free(j->tensors);
    free(j->desc);
    for (int i = 0; i < j->m; i++) free(j->keys[i]), free(j->vals[i]);
    free(j->keys);
    free(j->vals);
    for (int i = 0; i < j->nconfig; i++) free(j->config_names[i]), free(j->config_values[i]);
    free(j->config_names);
    free(j->config_values);
    free(j->program);
    dcp_index_job_free(&j->before);
    memset(j, 0, sizeof *j);
}

static nb_status add_meta(dcp_job *j, const char *k, const char *v) {
    char **nk = realloc(j->keys, sizeof *nk * (size_t)(j->m + 1));
    if (nk) j->keys = nk;
    char **nv = nk ? realloc(j->vals, sizeof *nv * (size_t)(j->m + 1)) : NULL;
    if (nv) j->vals = nv;
    char *a = nv ? strdup(k) : NULL, *b = a ? strdup(v) : NULL;
    if (!b) {
        free(a);
        return nb__error(NB_ENOMEM, "checkpoint_save: out of memory");
    }
    j->keys[j->m] = a, j->vals[j->m++] = b;
    return NB_OK;
}

static nb_status add_tensor(dcp_job *j, const char *name, nb_tensor *t, int cap) {
    if (j->n == 0) {
        j->names = calloc((size_t)cap + 1, sizeof *j->names);
        j->tensors = calloc((size_t)cap + 1, sizeof *j->tensors);
        j->desc = calloc((size_t)cap + 1, sizeof *j->desc);
        if (!j->names || !j->tensors || !j->desc)
            return nb__error(NB_ENOMEM, "checkpoint_save: out of memory");
    }
    if (!(j->names[j->n] = strdup(name))) return nb__error(NB_ENOMEM, "checkpoint_save: out of memory");
    j->tensors[j->n++] = nb_tensor_retain(t);
    return NB_OK;
}

/* The plain file: every entry whole under its name, the metadata nb_checkpoint always had. */
static nb_status fill_plain(const dcp_plan *p, const nb_checkpoint *c, dcp_job *j) {
    nb_status st = NB_OK;
    for (int i = 0; st == NB_OK && i < p->n; i++) {
        const dcp_entry *e = &p->e[i];
        if (!e->lay.write || e->lay.nparts == 0) continue;
        nb_scope_begin();
        nb_tensor *t = e->local;
        if (nb_ndim(t) != e->lay.ndim ||
            memcmp(nb_shape(t), e->lay.shape, sizeof(int64_t) * (size_t)e->lay.ndim) != 0)
            t = nb_reshape(t, e->lay.shape, e->lay.ndim); /* a 1-rank flat shard */
        st = t ? add_tensor(j, e->name, t, p->n) : nb_last_status();
        nb_scope_end();
    }
    if (st == NB_OK) st = add_meta(j, "format", "pt");
    if (st == NB_OK) st = add_meta(j, "nabla_checkpoint", "1");
    if (st == NB_OK) st = add_meta(j, "run_id", j->run_id);
    if (st == NB_OK && c->program) st = add_meta(j, "program", c->program);
    for (int i = 0; st == NB_OK && i < c->nconfig; i++) {
        char key[512];
        snprintf(key, sizeof key, "config.%s", c->config_names[i]);
        st = add_meta(j, key, c->config_values[i]);
    }
    return st;
}

/* This rank's file of a folder: its pieces under keys, each described for the index. */
static nb_status fill_sharded(const dcp_plan *p, const nb_checkpoint *c, dcp_job *j) {
    int cap = 0;
    for (int i = 0; i < p->n; i++) cap += p->e[i].lay.write ? p->e[i].lay.nparts : 0;
    nb_status st = NB_OK;
    char buf[64];
    if (cap == 0) return NB_OK;
    for (int i = 0; st == NB_OK && i < p->n; i++) {
        const dcp_entry *e = &p->e[i];
        for (int k = 0; st == NB_OK && e->lay.write && k < e->lay.nparts; k++) {
            char key[1024], where[512];
            if (k == 0) snprintf(key, sizeof key, "%s", e->name);
            else snprintf(key, sizeof key, "%s#%d", e->name, k);
            nb_scope_begin();
            nb_tensor *t = dcp_select(e->local, &e->lay.parts[k].sel);
            st = t ? add_tensor(j, key, t, cap) : nb_last_status();
            nb_scope_end();
            if (st != NB_OK) break;
            dcp_desc *d = &j->desc[j->n - 1];
            d->entry = strdup(e->name);
            d->key = strdup(key);
            d->dtype = nb_tensor_dtype(e->local);
            d->ndim = e->lay.ndim;
            memcpy(d->shape, e->lay.shape, sizeof d->shape);
            d->box = e->lay.parts[k].box;
            if (!d->entry || !d->key) st = nb__error(NB_ENOMEM, "checkpoint_save: out of memory");
            dcp_box_str(&d->box, where, sizeof where);
            snprintf(key, sizeof key, "piece.%s", d->key);
            if (st == NB_OK) st = add_meta(j, key, "");
            if (st == NB_OK) { /* "entry|box": checked against the index on load */
                size_t len = strlen(d->entry) + strlen(where) + 2;
                char *v = malloc(len);
                if (!v) st = nb__error(NB_ENOMEM, "checkpoint_save: out of memory");
                else snprintf(v, len, "%s|%s", d->entry, where), free(j->vals[j->m - 1]),
                     j->vals[j->m - 1] = v;
            }
            char shape[512] = "", sk[1100];
            for (int q = 0, at = 0; q < d->ndim && at < (int)sizeof shape; q++)
                at += snprintf(shape + at, sizeof shape - (size_t)at, "%s%" PRId64, q ? "," : "",
                               d->shape[q]);
            snprintf(sk, sizeof sk, "shape.%s", d->key); /* the whole tensor's, for the index */
            if (st == NB_OK) st = add_meta(j, sk, shape);
        }
    }
    if (st == NB_OK) st = add_meta(j, "nabla_dcp", "1");
    if (st == NB_OK) st = add_meta(j, "run_id", j->run_id);
    if (st == NB_OK) st = add_meta(j, "save_id", j->save_id);
    snprintf(buf, sizeof buf, "%d", p->w.rank);
    if (st == NB_OK) st = add_meta(j, "rank", buf);
    snprintf(buf, sizeof buf, "%d", p->w.size);
    if (st == NB_OK) st = add_meta(j, "world", buf);
    if (st == NB_OK) st = add_meta(j, "layout", p->w.layout);
    snprintf(buf, sizeof buf, "%" PRId64, c->step);
    if (st == NB_OK) st = add_meta(j, "step", buf);
    if (st == NB_OK && c->program) st = add_meta(j, "program", c->program);
    j->writes = st == NB_OK && j->n > 0;
    return st;
}

static nb_status copy_identity(const nb_checkpoint *c, dcp_job *j) {
    j->step = c->step;
    if (c->program && !(j->program = strdup(c->program)))
        return nb__error(NB_ENOMEM, "checkpoint_save: out of memory");
    if (c->nconfig <= 0) return NB_OK;
    j->config_names = calloc((size_t)c->nconfig, sizeof(char *));
    j->config_values = calloc((size_t)c->nconfig, sizeof(char *));
    if (!j->config_names || !j->config_values)
        return nb__error(NB_ENOMEM, "checkpoint_save: out of memory");
    for (int i = 0; i < c->nconfig; i++) {
        const char *k = c->config_names ? c->config_names[i] : NULL;
        const char *v = c->config_values ? c->config_values[i] : NULL;
        if (!k || !v)
            return nb__error(NB_ENULL, "checkpoint_save: setting %d has no %s", i,
                             !k ? "name" : "value");
        j->config_names[i] = strdup(k), j->config_values[i] = strdup(v);
        j->nconfig++;
        if (!j->config_names[i] || !j->config_values[i])
            return nb__error(NB_ENOMEM, "checkpoint_save: out of memory");
    }
    return NB_OK;
}


/* The folder: made by rank 0 (a path that is not a directory is refused and left alone),
 * with the temporary files of killed writers removed. */
static nb_status make_folder(const char *dir, const char *op) {
    struct stat sb;
    if (mkdir(dir, 0777) != 0) {
        if (errno != EEXIST)
            return nb__error(NB_EIO, "%s: cannot create the directory %s: %s", op, dir,
                             errno_str(errno));
        if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
            return nb__error(NB_EIO, "%s: %s exists and is not a directory (a sharded "
                             "checkpoint is a folder); refusing to replace it", op, dir);
    }
    nb__remove_stale_temps_in(dir);
    return NB_OK;
}

/* The message of rank `who`'s error (status code), on every rank. One broadcast. */
static nb_status error_of(const dcp_world *w, int who, nb_status mine) {
    struct {
        int32_t code;
        char msg[1024];
    } v = {(int32_t)mine, ""};
    if (w->rank == who) snprintf(v.msg, sizeof v.msg, "%s", nb_last_error());
    nb_scope_begin();
    nb_tensor *t = nb_from_buffer(&v, (int64_t[]){sizeof v}, 1, NB_U8);
    nb_status st = t ? nb_broadcast(w->comm, t, who) : nb_last_status();
    if (st == NB_OK) memcpy(&v, nb_data(t), sizeof v);
    nb_scope_end();
    if (st != NB_OK) return st;
    v.msg[sizeof v.msg - 1] = '\0';
    nb_status code = v.code != NB_OK ? (nb_status)v.code : NB_EIO;
    return who == w->rank ? nb__error(code, "%s", v.msg)
                          : nb__error(code, "%s (on rank %d)", v.msg, who);
}

/* Rank 0's index of save j (every rank's file durable), built later from the files. */
static void index_job_of(dcp_job *j, dcp_index_job *x) {
    memset(x, 0, sizeof *x);
    if (!j->sharded || j->w.rank != 0) return;
    x->pending = true;
    snprintf(x->run_id, sizeof x->run_id, "%s", j->run_id);
    snprintf(x->save_id, sizeof x->save_id, "%s", j->save_id);
    snprintf(x->layout, sizeof x->layout, "%s", j->w.layout);
    x->program = j->program, j->program = NULL;
    x->nconfig = j->nconfig, j->nconfig = 0;
    x->config_names = j->config_names, x->config_values = j->config_values;
    j->config_names = j->config_values = NULL;
    x->world = j->w.size, x->step = j->step;
    snprintf(x->dir, sizeof x->dir, "%s", j->dir);
    snprintf(x->base, sizeof x->base, "%s", j->base);
    x->keep = j->keep;
}

/* The ranks agree, in one allreduce: on the previous save's writes (prev_local: this rank's
 * result; prev NULL: none), on this save's preparation (st: this rank's; rank 0's includes
 * its folder), and they take rank 0's save id and run id. Each field is the largest over the
 * ranks: a failure is size - rank (so the lowest failing rank wins), rank 0's ids are its
 * alone (the others send 0). */
enum { F_PREV, F_PREP, F_ID, F_RUN = F_ID + 2, F_N = F_RUN + 9 };
static nb_status agree_begin(const dcp_world *w, nb_status prev_local, const char *prev_msg,
                             nb_status st, const nb_checkpoint *c, dcp_job *j, bool *prev_ok) {
    int64_t v[F_N] = {0};
    v[F_PREV] = prev_local == NB_OK ? 0 : w->size - w->rank;
    v[F_PREP] = st == NB_OK ? 0 : w->size - w->rank;
    char run[36] = "";
    if (w->rank == 0) {
        uint64_t id = 0;
        if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id) id = 0;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        id ^= (uint64_t)ts.tv_nsec << 20 ^ (uint64_t)ts.tv_sec ^ (uint64_t)getpid() << 40;
        v[F_ID] = (int64_t)(id >> 32), v[F_ID + 1] = (int64_t)(id & 0xffffffffu);
        snprintf(run, 33, "%s", nb_checkpoint_run_id(c));
        for (int k = 0; k < 9; k++) {
            uint32_t x = 0;
            memcpy(&x, run + 4 * k, 4);
            v[F_RUN + k] = (int64_t)x;
        }
    }
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", st != NB_OK ? nb_last_error() : "");
    nb_status cs = NB_OK;
    if (w->comm) {
        nb_scope_begin();
        nb_tensor *t = nb_from_buffer(v, (int64_t[]){F_N}, 1, NB_I64);
        cs = t ? nb_allreduce(w->comm, t, NB_REDUCE_MAX) : nb_last_status();
        if (cs == NB_OK) memcpy(v, nb_data(t), sizeof v);
        nb_scope_end();
    }
    *prev_ok = cs == NB_OK && v[F_PREV] == 0;
    if (cs != NB_OK) return cs;
    if (v[F_PREV] || v[F_PREP]) { /* the lowest failing rank's message, everywhere */
        bool prev = v[F_PREV] != 0;
        int who = w->size - (int)(prev ? v[F_PREV] : v[F_PREP]);
        nb_status mine = prev ? prev_local : st;
        if (who == w->rank) nb__error(mine, "%s", prev ? prev_msg : msg);
        return w->comm ? error_of(w, who, mine) : nb__error(mine, "%s", prev ? prev_msg : msg);
    }
    uint64_t id = (uint64_t)v[F_ID] << 32 | (uint64_t)v[F_ID + 1];
    for (int k = 0; k < 9; k++) {
        uint32_t x = (uint32_t)v[F_RUN + k];
        memcpy(run + 4 * k, &x, 4);
    }
    run[32] = '\0';
    snprintf(j->save_id, sizeof j->save_id, "%016" PRIx64, id);
    memcpy(j->run_id, run, sizeof j->run_id); /* 32 characters and the terminator */
    return NB_OK;
}

nb_status dcp_job_begin(const char *path, const nb_checkpoint *c, dcp_job *j, dcp_job *prev,
                        nb_status prev_local, const char *op) {
    memset(j, 0, sizeof *j);
    char prev_msg[1024]; /* the previous write's error, before anything else sets one */
    snprintf(prev_msg, sizeof prev_msg, "%s", prev_local != NB_OK ? nb_last_error() : "");
    dcp_plan p;
    nb_status st = dcp_plan_save(c, &p, op);
    j->w = p.w;
    if (st != NB_OK && !p.w.comm) { /* before the world was known: nothing to agree with */
        dcp_plan_free(&p, c);
        return st;
    }
    if (prev && prev->w.comm != p.w.comm) { /* another world: that save is finished first */
        if (prev_local != NB_OK) nb__error(prev_local, "%s", prev_msg);
        nb_status fs = dcp_job_finish(prev, prev_local, op);
        dcp_job_free(prev);
        prev = NULL, prev_local = NB_OK;
        if (fs != NB_OK) {
            dcp_plan_free(&p, c);
            return fs;
        }
    }
    /* a folder when the state is spread over several ranks by placements (ZeRO sets them too), the
     * same decision on every rank; one file (rank 0's) otherwise */
    bool any = p.w.size > 1 && p.w.mesh;
    j->sharded = any;
    j->keep = c->keep;
    char target[4400];
    if (st == NB_OK) st = copy_identity(c, j);
    if (st == NB_OK && strlen(path) >= sizeof j->base)
        st = nb__error(NB_EINVAL, "%s: path too long: %s", op, path);
    if (st == NB_OK) st = nb__checkpoint_target(path, c->step, c->keep, target, sizeof target, op);
    snprintf(j->base, sizeof j->base, "%s", path);
    if (st == NB_OK && p.w.rank == 0) {
        struct stat sb;
        /* a member of the series at this step of the other kind (a folder where a file goes,
         * or the reverse: the layout changed; a save that did not finish) is replaced */
        if (c->keep > 0 && stat(target, &sb) == 0 && S_ISDIR(sb.st_mode) != any)
            nb__checkpoint_remove_member(target);
        if (any) st = make_folder(target, op);
    }
    /* one allreduce: the previous save agreed, this one prepared (rank 0's folder made
     * before any rank writes into it), the save's ids */
    bool prev_ok = false;
    nb_status ag = agree_begin(&p.w, prev ? prev_local : NB_OK, prev_msg, st, c, j, &prev_ok);
    if (prev && ag == NB_OK) index_job_of(prev, &j->before); /* rank 0: written first */
    else if (prev && prev_ok && p.w.rank == 0) {
        /* this save failed to start but the previous one is complete: its index now */
        dcp_index_job x;
        index_job_of(prev, &x);
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", nb_last_error());
        if (dcp_index_job_run(&x, op) != NB_OK) fprintf(stderr, "nabla: %s\n", nb_last_error());
        nb__error(ag, "%s", msg);
    }
    st = ag;
    if (st == NB_OK && !any) {
        snprintf(j->path, sizeof j->path, "%s", target);
        j->writes = p.w.rank == 0;
        j->err = j->writes ? fill_plain(&p, c, j) : NB_OK;
    } else if (st == NB_OK) {
        snprintf(j->dir, sizeof j->dir, "%s", target);
        snprintf(j->path, sizeof j->path, "%s/shard-%s-%05d-of-%05d.safetensors", j->dir,
                 j->save_id, p.w.rank, p.w.size);
        j->err = fill_sharded(&p, c, j);
    }
    if (st == NB_OK && j->err != NB_OK) { /* kept for finish, which tells every rank */
        snprintf(j->errmsg, sizeof j->errmsg, "%s", nb_last_error());
        j->writes = false;
        nb_clear_error();
    }
    dcp_plan_free(&p, c);
    return st;
}

void dcp_index_job_free(dcp_index_job *x) {
    free(x->program);
    for (int i = 0; i < x->nconfig; i++) free(x->config_names[i]), free(x->config_values[i]);
    free(x->config_names);
    free(x->config_values);
    memset(x, 0, sizeof *x);
}

/* Parse "o+l,o+l[/flo+fn]" into a box of ndim dims. */
static bool parse_box(const char *s, int ndim, dcp_box *b) {
    memset(b, 0, sizeof *b);
    b->ndim = ndim;
    b->fn = -1;
    char *end;
    for (int d = 0; d < ndim; d++) {
        if (d && *s++ != ',') return false;
        b->off[d] = strtoll(s, &end, 10);
        if (end == s || *end != '+') return false;
        s = end + 1;
        b->len[d] = strtoll(s, &end, 10);
        if (end == s) return false;
        s = end;
    }
    if (*s == '/') {
        s++;
        b->flo = strtoll(s, &end, 10);
        if (end == s || *end != '+') return false;
        s = end + 1;
        b->fn = strtoll(s, &end, 10);
        if (end == s) return false;
        s = end;
    }
    return *s == '\0';
}

/* The metadata of a file, sorted by key for lookups (a rank file has a few entries per
 * piece). */
typedef struct kv {
    const char *k, *v;
} kv;
static int cmp_kv(const void *a, const void *b) {
    return strcmp(((const kv *)a)->k, ((const kv *)b)->k);
}
static const char *lookup(const kv *m, int n, const char *fmt, const char *name) {
    char key[1100];
    snprintf(key, sizeof key, fmt, name);
    kv want = {key, NULL}, *hit = bsearch(&want, m, (size_t)n, sizeof *m, cmp_kv);
    return hit ? hit->v : NULL;
}

/* Append the pieces of rank file `file` (index fi of the index's list) to *d, from its
 * header: their places, whole shapes and checksums. Its rank into *rank. */
static nb_status file_desc(const char *dir, const char *name, int fi, const dcp_index_job *x,
                           dcp_desc **d, int *nd, int *cap, int *rank, const char *op) {
    char path[4800];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    nb_safetensors *f = nb_safetensors_open(path);
    if (!f) return nb_last_status();
    int nm = nb_safetensors_metadata_count(f), n = nb_safetensors_count(f);
    kv *m = calloc((size_t)nm + 1, sizeof *m);
    for (int i = 0; m && i < nm; i++) {
        m[i].k = nb_safetensors_metadata_key(f, i);
        m[i].v = nb_safetensors_metadata(f, m[i].k);
    }
    if (m) qsort(m, (size_t)nm, sizeof *m, cmp_kv);
    const char *sid = m ? lookup(m, nm, "%s", "save_id") : NULL;
    const char *rk = m ? lookup(m, nm, "%s", "rank") : NULL;
    nb_status st = !m ? nb__error(NB_ENOMEM, "%s: out of memory", op)
                   : sid && !strcmp(sid, x->save_id) && rk ? NB_OK
                   : nb__error(NB_EFORMAT, "%s: %s is not a file of save %s", op, path,
                               x->save_id);
    if (st == NB_OK) *rank = atoi(rk);
    if (st == NB_OK && *nd + n > *cap) {
        int c = (*nd + n) * 2;
        dcp_desc *nd2 = realloc(*d, sizeof **d * (size_t)c);
        if (!nd2) st = nb__error(NB_ENOMEM, "%s: out of memory", op);
        else *d = nd2, *cap = c;
    }
    for (int i = 0; st == NB_OK && i < n; i++) {
        nb_safetensors_info in;
        nb_safetensors_info_at(f, i, &in);
        const char *pv = lookup(m, nm, "piece.%s", in.name);
        const char *sv = lookup(m, nm, "shape.%s", in.name);
        const char *cv = lookup(m, nm, "checksum.%s", in.name);
        const char *bar = pv ? strrchr(pv, '|') : NULL;
        dcp_desc *q = &(*d)[(*nd)++];
        memset(q, 0, sizeof *q);
        q->file = fi;
        q->dtype = in.dtype;
        int dims = 0;
        for (const char *c = sv; c && *c; c++) dims += *c == ',';
        dims += sv && *sv ? 1 : 0;
        char *end = NULL;
        for (int k = 0, at = 0; sv && k < dims && k < NB_MAX_DIMS; k++) {
            q->shape[k] = strtoll(sv + at, &end, 10);
            at = (int)(end - sv) + 1;
        }
        q->ndim = dims;
        q->key = strdup(in.name);
        q->entry = bar ? strndup(pv, (size_t)(bar - pv)) : NULL;
        size_t l = strlen(DCP_SUM_ALGO);
        if (!pv || !sv || !cv || !bar || dims > NB_MAX_DIMS || !parse_box(bar + 1, dims, &q->box) ||
            strncmp(cv, DCP_SUM_ALGO, l) != 0 || !q->key || !q->entry)
            st = nb__error(NB_EFORMAT, "%s: %s: piece \"%s\" has no valid place, shape or "
                           "checksum in its metadata", op, path, in.name);
        else q->sum = strtoull(cv + l, NULL, 16);
    }
    free(m);
    nb_safetensors_close(f);
    return st;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

nb_status dcp_index_job_run(dcp_index_job *x, const char *op) {
    if (!x->pending) return NB_OK;
    /* the save's files: every rank that wrote one */
    char prefix[64];
    snprintf(prefix, sizeof prefix, "shard-%s-", x->save_id);
    int n = 0, cap = 0, nd = 0, dcap = 0;
    char **names = NULL;
    int *ranks = NULL;
    dcp_desc *d = NULL;
    nb_status st = NB_OK;
    DIR *dh = opendir(x->dir);
    if (!dh) st = nb__error(NB_EIO, "%s: cannot read %s: %s", op, x->dir, errno_str(errno));
    for (struct dirent *e; st == NB_OK && (e = readdir(dh));) {
        size_t l = strlen(e->d_name), sl = strlen(".safetensors");
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0 || l < sl ||
            strcmp(e->d_name + l - sl, ".safetensors") != 0)
            continue;
        if (n == cap) {
            char **nn = realloc(names, sizeof *nn * (size_t)(cap = cap ? 2 * cap : 16));
            if (!nn) st = nb__error(NB_ENOMEM, "%s: out of memory", op);
            else names = nn;
        }
        if (st == NB_OK && !(names[n++] = strdup(e->d_name)))
            st = nb__error(NB_ENOMEM, "%s: out of memory", op);
    }
    if (dh) closedir(dh);
    if (st == NB_OK && n > 1) qsort(names, (size_t)n, sizeof *names, cmp_str);
    if (st == NB_OK && !(ranks = calloc((size_t)n + 1, sizeof *ranks)))
        st = nb__error(NB_ENOMEM, "%s: out of memory", op);
    for (int i = 0; st == NB_OK && i < n; i++)
        st = file_desc(x->dir, names[i], i, x, &d, &nd, &dcap, &ranks[i], op);
    char *text = NULL;
    if (st == NB_OK) {
        dcp_index_meta m = {.run_id = x->run_id, .save_id = x->save_id, .program = x->program,
                            .layout = x->layout, .world = x->world, .step = x->step,
                            .config_names = (const char *const *)x->config_names,
                            .config_values = (const char *const *)x->config_values,
                            .nconfig = x->nconfig};
        text = dcp_index_text(&m, names, ranks, n, d, nd, op);
        if (!text) st = nb_last_status();
    }
    char ip[4600];
    snprintf(ip, sizeof ip, "%s/" DCP_INDEX, x->dir);
    if (st == NB_OK) st = dcp_write_text(ip, text, op);
    if (st == NB_OK) {
        remove_other_saves(x->dir, x->save_id, x->next_id);
        if (x->keep > 0) nb__checkpoint_rotate(x->base, x->keep, x->dir, x->next_dir);
    }
    free(text);
    for (int i = 0; i < nd; i++) free(d[i].entry), free(d[i].key);
    free(d);
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    free(ranks);
    dcp_index_job_free(x);
    return st;
}

nb_status dcp_job_write(dcp_job *j) {
    if (j->sharded) {
        snprintf(j->before.next_id, sizeof j->before.next_id, "%s", j->save_id);
        snprintf(j->before.next_dir, sizeof j->before.next_dir, "%s", j->dir);
    }
    nb_status st = dcp_index_job_run(&j->before, "checkpoint_save");
    if (st != NB_OK) return st;
    if (j->err != NB_OK) return nb__error(j->err, "%s", j->errmsg);
    if (!j->writes) return NB_OK;
    int tok = NB__SPAN_BEGIN("checkpoint write", NULL, NB__CAT_IO);
    st = nb__safetensors_save_checked(j->path, (const char *const *)j->names, j->tensors, j->n,
                                      (const char *const *)j->keys, (const char *const *)j->vals,
                                      j->m, true, NULL);
    NB__SPAN_END(tok);
    if (st != NB_OK && strncmp(nb_last_error(), "safetensors_save: ", 18) == 0) {
        char rest[1024];
        snprintf(rest, sizeof rest, "%s", nb_last_error() + 18);
        st = nb__error(st, "checkpoint_save: %s", rest);
    }
    if (st == NB_OK && !j->sharded && j->keep > 0) nb__checkpoint_rotate(j->base, j->keep, j->path, NULL);
    return st;
}

nb_status dcp_job_finish(dcp_job *j, nb_status local, const char *op) {
    if (local == NB_OK && j->err != NB_OK) local = nb__error(j->err, "%s", j->errmsg);
    nb_status st = dcp_agree(&j->w, local); /* every rank's file durable */
    if (st != NB_OK || !j->sharded) return st;
    dcp_index_job x;
    index_job_of(j, &x);
    nb_status ls = dcp_index_job_run(&x, op); /* rank 0: the index makes the checkpoint */
    return dcp_agree(&j->w, ls);
}
