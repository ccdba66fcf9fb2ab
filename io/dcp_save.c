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
    free(j->sums);
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
        j->sums = calloc((size_t)cap + 1, sizeof *j->sums);
        if (!j->names || !j->tensors || !j->desc || !j->sums)
            return nb__error(NB_ENOMEM, "checkpoint_save: out of memory");
    }
    if (!(j->names[j->n] = strdup(name))) return nb__error(NB_ENOMEM, "checkpoint_save: out of memory");
    j->tensors[j->n++] = nb_tensor_retain(t);
    return NB_OK;
}

/* Whether this rank writes anything a plain file of rank 0 could not hold. On one rank every
 * tensor is whole, whatever its parts. */
static bool needs_folder(const dcp_plan *p) {
    if (p->w.size == 1) return false;
    for (int i = 0; i < p->n; i++) {
        const dcp_lay *l = &p->e[i].lay;
        if (!l->write || l->nparts == 0) continue;
        if (p->w.rank != 0 || l->nparts != 1) return true;
        const dcp_box *b = &l->parts[0].box;
        int64_t v = 1;
        for (int d = 0; d < b->ndim; d++) {
            if (b->off[d] != 0 || b->len[d] != l->shape[d]) return true;
            v *= b->len[d];
        }
        if (b->fn >= 0 && (b->flo != 0 || b->fn != v)) return true;
    }
    return false;
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

/* Collective: when any rank's st failed, every rank returns the lowest failing rank's error
 * (as dcp_agree); with it, the largest of every rank's flag in *any. One allreduce. */
static nb_status agree_any(const dcp_world *w, nb_status st, bool mine, bool *any) {
    *any = mine;
    if (!w->comm) return st;
    nb_scope_begin();
    int32_t v[2] = {st == NB_OK ? 0 : w->size - w->rank, mine};
    nb_tensor *t = nb_from_buffer(v, (int64_t[]){2}, 1, NB_I32);
    nb_status cs = t ? nb_allreduce(w->comm, t, NB_REDUCE_MAX) : nb_last_status();
    if (cs == NB_OK) memcpy(v, nb_data(t), sizeof v);
    nb_scope_end();
    if (cs != NB_OK) return cs;
    *any = v[1] != 0;
    return v[0] == 0 ? NB_OK : dcp_agree(w, st); /* the message, from the failing rank */
}

/* Rank 0's decision, sent to every rank: its status (the folder made) with its message, a
 * 16-hex-digit id fresh per save and the run id. One broadcast. */
static nb_status share_rank0(const dcp_world *w, const nb_checkpoint *c, nb_status st0,
                             dcp_job *j) {
    struct {
        int32_t code;
        char msg[512];
        uint64_t id;
        char run[33];
    } v = {0};
    if (w->rank == 0) {
        v.code = (int32_t)st0;
        if (st0 != NB_OK) snprintf(v.msg, sizeof v.msg, "%s", nb_last_error());
        if (getrandom(&v.id, sizeof v.id, 0) != (ssize_t)sizeof v.id) v.id = 0;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        v.id ^= (uint64_t)ts.tv_nsec << 20 ^ (uint64_t)ts.tv_sec ^ (uint64_t)getpid() << 40;
        snprintf(v.run, sizeof v.run, "%s", nb_checkpoint_run_id(c));
    }
    nb_status st = NB_OK;
    if (w->comm) {
        nb_scope_begin();
        nb_tensor *t = nb_from_buffer(&v, (int64_t[]){sizeof v}, 1, NB_U8);
        st = t ? nb_broadcast(w->comm, t, 0) : nb_last_status();
        if (st == NB_OK) memcpy(&v, nb_data(t), sizeof v);
        nb_scope_end();
    }
    if (st != NB_OK) return st;
    v.msg[sizeof v.msg - 1] = v.run[32] = '\0';
    if (v.code != NB_OK)
        return w->rank == 0 ? (nb_status)v.code
                            : nb__error((nb_status)v.code, "%s (on rank 0)", v.msg);
    snprintf(j->save_id, sizeof j->save_id, "%016" PRIx64, v.id);
    snprintf(j->run_id, sizeof j->run_id, "%s", v.run);
    return NB_OK;
}

nb_status dcp_job_begin(const char *path, const nb_checkpoint *c, dcp_job *j, const char *op) {
    memset(j, 0, sizeof *j);
    dcp_plan p;
    nb_status st = dcp_plan_save(c, &p, op);
    j->w = p.w;
    if (st != NB_OK && !p.w.comm) { /* before the world was known: nothing to agree with */
        dcp_plan_free(&p, c);
        return st;
    }
    char target[4400];
    if (st == NB_OK) st = copy_identity(c, j);
    if (st == NB_OK && strlen(path) >= sizeof j->base)
        st = nb__error(NB_EINVAL, "%s: path too long: %s", op, path);
    if (st == NB_OK) st = nb__checkpoint_target(path, c->step, c->keep, target, sizeof target, op);
    bool any = false;
    st = agree_any(&p.w, st, st == NB_OK && needs_folder(&p), &any); /* collective 1 */
    j->sharded = any;
    j->keep = c->keep;
    snprintf(j->base, sizeof j->base, "%s", path);
    nb_status st0 = NB_OK;
    if (st == NB_OK && p.w.rank == 0) {
        struct stat sb;
        /* a member of the series at this step of the other kind (a folder where a file goes,
         * or the reverse: the layout changed; a save that did not finish) is replaced */
        if (c->keep > 0 && stat(target, &sb) == 0 && S_ISDIR(sb.st_mode) != any)
            nb__checkpoint_remove_member(target);
        if (any) st0 = make_folder(target, op);
    }
    if (st == NB_OK) st = share_rank0(&p.w, c, st0, j); /* collective 2 */
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
    free(x->text);
    memset(x, 0, sizeof *x);
}

nb_status dcp_index_job_run(dcp_index_job *x, const char *op) {
    if (!x->text) return NB_OK;
    char ip[4600];
    snprintf(ip, sizeof ip, "%s/" DCP_INDEX, x->dir);
    nb_status st = dcp_write_text(ip, x->text, op);
    if (st == NB_OK) {
        remove_other_saves(x->dir, x->save_id, x->next_id);
        if (x->keep > 0) nb__checkpoint_rotate(x->base, x->keep, x->dir);
    }
    dcp_index_job_free(x);
    return st;
}

nb_status dcp_job_write(dcp_job *j) {
    if (j->sharded) snprintf(j->before.next_id, sizeof j->before.next_id, "%s", j->save_id);
    nb_status st = dcp_index_job_run(&j->before, "checkpoint_save");
    if (st != NB_OK) return st;
    if (j->err != NB_OK) return nb__error(j->err, "%s", j->errmsg);
    if (!j->writes) return NB_OK;
    int tok = NB__SPAN_BEGIN("checkpoint write", NULL, NB__CAT_IO);
    st = nb__safetensors_save_checked(j->path, (const char *const *)j->names, j->tensors, j->n,
                                      (const char *const *)j->keys, (const char *const *)j->vals,
                                      j->m, true, j->sums);
    NB__SPAN_END(tok);
    if (st != NB_OK && strncmp(nb_last_error(), "safetensors_save: ", 18) == 0) {
        char rest[1024];
        snprintf(rest, sizeof rest, "%s", nb_last_error() + 18);
        st = nb__error(st, "checkpoint_save: %s", rest);
    }
    for (int i = 0; st == NB_OK && j->desc && i < j->n; i++) j->desc[i].sum = j->sums[i];
    if (st == NB_OK && !j->sharded && j->keep > 0) nb__checkpoint_rotate(j->base, j->keep, j->path);
    return st;
}

/* Every rank's text and status on every rank: the lengths and statuses first (one
 * allgather), then the padded texts (another). A failed rank's text is its message. */
static nb_status gather_texts(const dcp_world *w, const char *mine, nb_status local,
                              char ***out, int32_t **codes) {
    *out = calloc((size_t)w->size, sizeof **out);
    *codes = calloc((size_t)w->size, sizeof **codes);
    if (!*out || !*codes) return nb__error(NB_ENOMEM, "checkpoint_save: out of memory");
    nb_scope_begin();
    int64_t lc[2] = {(int64_t)strlen(mine) + 1, (int64_t)local};
    nb_tensor *lt = nb_from_buffer(lc, (int64_t[]){2}, 1, NB_I64);
    nb_tensor *all = nb_empty((int64_t[]){2 * w->size}, 1, NB_I64);
    nb_status st = lt && all ? nb_allgather(w->comm, all, lt) : nb_last_status();
    int64_t max = 0;
    for (int r = 0; st == NB_OK && r < w->size; r++) {
        const int64_t *v = (const int64_t *)nb_data(all) + 2 * r;
        if (v[0] > max) max = v[0];
        (*codes)[r] = (int32_t)v[1];
    }
    nb_tensor *in = st == NB_OK ? nb_zeros((int64_t[]){max}, 1, NB_U8) : NULL;
    nb_tensor *outt = in ? nb_empty((int64_t[]){max * w->size}, 1, NB_U8) : NULL;
    if (st == NB_OK && (!in || !outt)) st = nb_last_status();
    if (st == NB_OK) {
        memcpy(nb_data(in), mine, (size_t)lc[0]);
        st = nb_allgather(w->comm, outt, in);
    }
    for (int r = 0; st == NB_OK && r < w->size; r++) {
        const char *src = (const char *)nb_data(outt) + r * max;
        if (!((*out)[r] = strndup(src, (size_t)max)))
            st = nb__error(NB_ENOMEM, "checkpoint_save: out of memory");
    }
    nb_scope_end();
    return st;
}

nb_status dcp_job_finish(dcp_job *j, nb_status local, bool defer, dcp_index_job *idx,
                         const char *op) {
    if (idx) memset(idx, 0, sizeof *idx);
    if (local == NB_OK && j->err != NB_OK) local = nb__error(j->err, "%s", j->errmsg);
    if (!j->sharded || !j->w.comm) return dcp_agree(&j->w, local);
    /* a sharded save: every rank's pieces (or its error) to every rank */
    const char *slash = strrchr(j->path, '/');
    char *mine = local == NB_OK ? dcp_desc_json(j->writes ? slash + 1 : NULL, j->w.rank, j->desc,
                                                j->writes ? j->n : 0)
                                : strdup(nb_last_error());
    if (!mine) mine = strdup(""), local = local == NB_OK ? NB_ENOMEM : local;
    char **texts = NULL;
    int32_t *codes = NULL;
    nb_status st = mine ? gather_texts(&j->w, mine, local, &texts, &codes)
                        : nb__error(NB_ENOMEM, "%s: out of memory", op);
    free(mine);
    int who = -1;
    for (int r = 0; st == NB_OK && r < j->w.size && who < 0; r++)
        if (codes[r] != NB_OK) who = r;
    if (st == NB_OK && who >= 0) /* no index: the checkpoint does not exist */
        st = who == j->w.rank ? nb__error((nb_status)codes[who], "%s", texts[who])
                              : nb__error((nb_status)codes[who], "%s (on rank %d)", texts[who], who);
    nb_status ls = NB_OK;
    dcp_index_job x = {0};
    if (st == NB_OK && j->w.rank == 0) {
        dcp_index_meta m = {.run_id = j->run_id, .save_id = j->save_id, .program = j->program,
                            .layout = j->w.layout, .world = j->w.size, .step = j->step,
                            .config_names = (const char *const *)j->config_names,
                            .config_values = (const char *const *)j->config_values,
                            .nconfig = j->nconfig};
        x.text = dcp_index_json(&m, texts, j->w.size, op);
        snprintf(x.dir, sizeof x.dir, "%s", j->dir);
        snprintf(x.base, sizeof x.base, "%s", j->base);
        snprintf(x.save_id, sizeof x.save_id, "%s", j->save_id);
        x.keep = j->keep;
        if (!x.text) ls = nb_last_status();
    }
    for (int r = 0; texts && r < j->w.size; r++) free(texts[r]);
    free(texts);
    free(codes);
    if (st != NB_OK) return st;
    if (defer && ls == NB_OK) { /* rank 0 writes it later; the others are done */
        if (idx) *idx = x;
        else dcp_index_job_free(&x);
        return NB_OK;
    }
    if (ls == NB_OK) ls = dcp_index_job_run(&x, op);
    dcp_index_job_free(&x);
    return dcp_agree(&j->w, ls);
}
