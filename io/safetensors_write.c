/* safetensors_write.c - the safetensors writer (nabla/io.h: nb_safetensors_save and the
 * checked variant with per-tensor checksums): the reference writer's layout (its tensor
 * order, aligned data, a compact JSON header), atomic replacement through a temporary file
 * beside the target, and the removal of temporary files a killed writer left. The reader is
 * io/safetensors.c. */
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
    if (!nb__jansson(op)) return NULL;
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
