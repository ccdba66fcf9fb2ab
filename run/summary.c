/* summary.c - TensorBoard event files (nabla/summary.h): TFRecord framing with masked
 * CRC-32C, and the few fields of the Event and Summary protocol buffers that scalars use,
 * encoded by hand (a generated protobuf-c encoder for five fields would be larger than the
 * encoder). Debian has no C library for CRC-32C (zlib's crc32 is the other polynomial), so
 * it is computed here from its definition. */
#include "nabla/summary.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <threads.h>
#include <time.h>
#include <unistd.h>

struct nb_summary {
    FILE *f;
    char *path;
    nb_status err; /* sticky: the first failure */
    char errmsg[512];
    unsigned char buf[512]; /* one encoded event */
};

/* ---- CRC-32C ---------------------------------------------------------------------------- */
/* The reflected Castagnoli polynomial 0x1EDC6F41, a byte at a time from a table made once
 * (C11 call_once: writers on several threads may start together). */
static uint32_t crc_table[256];
static once_flag crc_once = ONCE_FLAG_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t nb_crc32c(uint32_t crc, const void *data, size_t n) {
    call_once(&crc_once, crc_init);
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

uint32_t nb_crc32c_masked(const void *data, size_t n) {
    uint32_t c = nb_crc32c(0, data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---- protocol buffer encoding -------------------------------------------------------------- */
/* Appends to b[*n] (the caller sized b for the largest event: a tag of at most 256 bytes). */
static void put_varint(unsigned char *b, size_t *n, uint64_t v) {
    do {
        b[(*n)++] = (unsigned char)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
}

static void put_le(unsigned char *b, size_t *n, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) b[(*n)++] = (unsigned char)(v >> (8 * i));
}

static void put_bytes(unsigned char *b, size_t *n, int field, const void *p, size_t len) {
    put_varint(b, n, (uint64_t)field << 3 | 2); /* wire type 2: length-delimited */
    put_varint(b, n, len);
    memcpy(b + *n, p, len);
    *n += len;
}

/* Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5 }
 * Summary { repeated Value value = 1 }  Value { string tag = 1; float simple_value = 2 } */
static size_t encode_event(unsigned char *b, double wall_time, int64_t step, const char *version,
                           const char *tag, float value) {
    size_t n = 0;
    uint64_t bits;
    memcpy(&bits, &wall_time, sizeof bits);
    b[n++] = 1 << 3 | 1; /* wire type 1: 64-bit */
    put_le(b, &n, bits, 8);
    if (step != 0) { /* proto3 leaves a zero out */
        b[n++] = 2 << 3 | 0;
        put_varint(b, &n, (uint64_t)step);
    }
    if (version) put_bytes(b, &n, 3, version, strlen(version));
    if (tag) {
        unsigned char v[300], s[310];
        size_t nv = 0, ns = 0;
        uint32_t fb;
        memcpy(&fb, &value, sizeof fb);
        put_bytes(v, &nv, 1, tag, strlen(tag));
        v[nv++] = 2 << 3 | 5; /* wire type 5: 32-bit */
        put_le(v, &nv, fb, 4);
        put_bytes(s, &ns, 1, v, nv);
        put_bytes(b, &n, 5, s, ns);
    }
    return n;
}

/* ---- the writer -------------------------------------------------------------------------- */
static nb_status fail(nb_summary *w, const char *what) {
    if (w->err == NB_OK) {
        w->err = NB_EIO;
        snprintf(w->errmsg, sizeof w->errmsg, "summary: %s %s failed: %s", what, w->path,
                 strerror(errno ? errno : EIO));
    }
    return nb_set_error(w->err, "%s", w->errmsg);
}

/* One TFRecord: length, masked CRC of the length, data, masked CRC of the data. */
static nb_status write_record(nb_summary *w, const unsigned char *data, size_t n) {
    if (w->err != NB_OK) return nb_set_error(w->err, "%s", w->errmsg);
    unsigned char head[12], tail[4];
    size_t k = 0;
    put_le(head, &k, n, 8);
    uint32_t c = nb_crc32c_masked(head, 8);
    put_le(head, &k, c, 4);
    k = 0;
    put_le(tail, &k, nb_crc32c_masked(data, n), 4);
    errno = 0;
    if (fwrite(head, 1, 12, w->f) != 12 || fwrite(data, 1, n, w->f) != n ||
        fwrite(tail, 1, 4, w->f) != 4)
        return fail(w, "writing");
    return NB_OK;
}

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* mkdir -p: every missing folder of dir. */
static bool make_dirs(const char *dir) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) {
        errno = ENAMETOOLONG;
        return false;
    }
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s) continue;
        char c = *s;
        *s = 0;
        if (mkdir(p, 0777) != 0 && errno != EEXIST) return false;
        *s = c;
        if (!c) break;
    }
    struct stat st;
    if (stat(dir, &st) != 0) return false;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return false;
    }
    return true;
}

nb_summary *nb_summary_open(const char *dir) {
    if (!dir || !*dir) {
        nb_set_error(NB_EINVAL, "summary_open: the folder name is empty");
        return NULL;
    }
    if (!make_dirs(dir)) {
        nb_set_error(NB_EIO, "summary_open: cannot create the folder %s: %s", dir,
                     strerror(errno));
        return NULL;
    }
    char host[256] = "localhost";
    if (gethostname(host, sizeof host) != 0 || !*host) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    for (char *h = host; *h; h++)
        if (*h == '/') *h = '_';
    nb_summary *w = calloc(1, sizeof *w);
    size_t len = strlen(dir) + strlen(host) + 96;
    if (!w || !(w->path = malloc(len))) {
        free(w);
        nb_set_error(NB_ENOMEM, "summary_open: out of memory");
        return NULL;
    }
    double now = wall_now();
    /* O_EXCL: two writers started in the same second never share a file */
    int fd = -1;
    for (int k = 0; fd < 0 && k < 1000; k++) {
        if (k == 0)
            snprintf(w->path, len, "%s/events.out.tfevents.%010lld.%s.%ld", dir, (long long)now,
                     host, (long)getpid());
        else
            snprintf(w->path, len, "%s/events.out.tfevents.%010lld.%s.%ld.%d", dir,
                     (long long)now, host, (long)getpid(), k);
        fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0 || !(w->f = fdopen(fd, "wb"))) {
        nb_set_error(NB_EIO, "summary_open: cannot create %s: %s", w->path, strerror(errno));
        if (fd >= 0) close(fd);
        free(w->path);
        free(w);
        return NULL;
    }
    size_t n = encode_event(w->buf, now, 0, "brain.Event:2", NULL, 0);
    if (write_record(w, w->buf, n) != NB_OK) {
        nb_summary_close(w);
        return NULL;
    }
    return w;
}

nb_status nb_summary_scalar_at(nb_summary *w, const char *tag, int64_t step, double value,
                               double wall_time) {
    if (!w) return nb_set_error(NB_ENULL, "summary_scalar: the writer is NULL");
    if (!tag || !*tag || strlen(tag) > 256)
        return nb_set_error(NB_EINVAL, "summary_scalar: the tag must have 1 to 256 characters "
                            "(got %zu)", tag ? strlen(tag) : (size_t)0);
    size_t n = encode_event(w->buf, wall_time, step, NULL, tag, (float)value);
    return write_record(w, w->buf, n);
}

nb_status nb_summary_scalar(nb_summary *w, const char *tag, int64_t step, double value) {
    return nb_summary_scalar_at(w, tag, step, value, wall_now());
}

nb_status nb_summary_flush(nb_summary *w) {
    if (!w) return nb_set_error(NB_ENULL, "summary_flush: the writer is NULL");
    if (w->err != NB_OK) return nb_set_error(w->err, "%s", w->errmsg);
    errno = 0;
    if (fflush(w->f) != 0) return fail(w, "writing");
    return NB_OK;
}

const char *nb_summary_path(const nb_summary *w) { return w ? w->path : NULL; }

nb_status nb_summary_close(nb_summary *w) {
    if (!w) return NB_OK;
    errno = 0;
    bool bad = ferror(w->f) != 0;
    if (fclose(w->f) != 0 || bad) fail(w, "writing");
    nb_status s = w->err;
    if (s != NB_OK) nb_set_error(s, "%s", w->errmsg);
    free(w->path);
    free(w);
    return s;
}
