/* jsonl.c - JSON-lines writers (nabla/run.h): a line is built in a buffer field by field
 * (escaped keys and strings, null for NaN and infinities) and written in one piece; the
 * first failed write warns once and makes the close return NB_EIO. */
#include "nabla/run.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

struct nb_jsonl {
    FILE *f;
    bool own;         /* opened here: closed by nb_jsonl_close */
    char prog[64];
    char name[512];   /* "--log PATH", "standard output" */
    int err;          /* errno of the first failure, 0 while every write succeeded */
    char *line;       /* the line being built */
    size_t len, cap;
    bool first, oom;  /* first: no field yet; oom: the line could not grow (dropped) */
};

static nb_jsonl *jsonl_new(const char *prog, FILE *f, bool own, const char *name) {
    nb_jsonl *j = calloc(1, sizeof *j);
    if (!j || !(j->line = malloc(j->cap = 512))) {
        free(j);
        nb_set_error(NB_ENOMEM, "jsonl: out of memory");
        return NULL;
    }
    j->f = f;
    j->own = own;
    snprintf(j->prog, sizeof j->prog, "%s", prog ? prog : "nabla");
    snprintf(j->name, sizeof j->name, "%s", name ? name : "the log");
    return j;
}

nb_jsonl *nb_jsonl_open(const char *prog, const char *path, const char *mode) {
    if (!path || !mode) {
        nb_set_error(NB_ENULL, "jsonl_open: %s is NULL", path ? "the mode" : "the path");
        return NULL;
    }
    FILE *f = fopen(path, mode);
    if (!f) {
        nb_set_error(NB_EIO, "cannot open --log %s: %s", path, strerror(errno));
        return NULL;
    }
    char name[512];
    snprintf(name, sizeof name, "--log %s", path);
    nb_jsonl *j = jsonl_new(prog, f, true, name);
    if (!j) fclose(f);
    return j;
}

nb_jsonl *nb_jsonl_stream(const char *prog, FILE *f, const char *name) {
    if (!f) {
        nb_set_error(NB_ENULL, "jsonl_stream: the stream is NULL");
        return NULL;
    }
    return jsonl_new(prog, f, false, name);
}

/* Record the first failure (errno) and warn about it once; later writes are skipped. */
static void failed(nb_jsonl *j) {
    if (j->err) return;
    j->err = errno ? errno : EIO;
    fprintf(stderr, "%s: warning: writing %s failed: %s; the log is incomplete (the run goes on, "
                    "and exits with status 1)\n", j->prog, j->name, strerror(j->err));
}

static void append(nb_jsonl *j, const char *s, size_t n) {
    if (j->oom) return;
    if (j->len + n + 3 > j->cap) { /* room for "}\n" and the terminator */
        size_t cap = j->cap;
        while (j->len + n + 3 > cap) cap *= 2;
        char *p = realloc(j->line, cap);
        if (!p) {
            j->oom = true;
            return;
        }
        j->line = p;
        j->cap = cap;
    }
    memcpy(j->line + j->len, s, n);
    j->len += n;
}

static void appendf(nb_jsonl *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void appendf(nb_jsonl *j, const char *fmt, ...) {
    char b[64];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    if (k > 0) append(j, b, (size_t)k < sizeof b ? (size_t)k : sizeof b - 1);
}

/* A JSON string: quotes, backslashes and control characters escaped. */
static void append_string(nb_jsonl *j, const char *s) {
    append(j, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            char e[2] = {'\\', (char)*p};
            append(j, e, 2);
        } else if (*p < 0x20) {
            appendf(j, "\\u%04x", *p);
        } else {
            append(j, (const char *)p, 1);
        }
    }
    append(j, "\"", 1);
}

static void key(nb_jsonl *j, const char *k) {
    if (!j->first) append(j, ", ", 2);
    j->first = false;
    append_string(j, k ? k : "");
    append(j, ": ", 2);
}

void nb_jsonl_begin(nb_jsonl *j) {
    if (!j) return;
    j->len = 0;
    j->oom = false;
    j->first = true;
    append(j, "{", 1);
}

void nb_jsonl_str(nb_jsonl *j, const char *k, const char *v) {
    if (!j) return;
    key(j, k);
    if (v) append_string(j, v);
    else append(j, "null", 4);
}

void nb_jsonl_int(nb_jsonl *j, const char *k, int64_t v) {
    if (!j) return;
    key(j, k);
    appendf(j, "%lld", (long long)v);
}

void nb_jsonl_bool(nb_jsonl *j, const char *k, bool v) {
    if (!j) return;
    key(j, k);
    append(j, v ? "true" : "false", v ? 4 : 5);
}

void nb_jsonl_num(nb_jsonl *j, const char *k, double v, int prec) {
    if (!j) return;
    key(j, k);
    char b[400]; /* %.*f of a large double has over 300 digits */
    nb_json_num(v, prec, b, sizeof b);
    append(j, b, strlen(b));
}

void nb_jsonl_num_g(nb_jsonl *j, const char *k, double v, int prec) {
    if (!j) return;
    key(j, k);
    if (isfinite(v)) appendf(j, "%.*g", prec, v);
    else append(j, "null", 4);
}

void nb_jsonl_end(nb_jsonl *j) {
    if (!j) return;
    append(j, "}\n", 2);
    if (j->err || j->oom) return; /* a line that could not be built is not written in part */
    errno = 0;
    if (fwrite(j->line, 1, j->len, j->f) != j->len || ferror(j->f)) failed(j);
}

void nb_jsonl_flush(nb_jsonl *j) {
    if (!j || j->err) return;
    errno = 0;
    if (fflush(j->f) != 0) failed(j);
}

bool nb_jsonl_ok(const nb_jsonl *j) { return !j || j->err == 0; }

nb_status nb_jsonl_close(nb_jsonl *j) {
    if (!j) return NB_OK;
    errno = 0;
    /* fclose flushes what is still buffered: that write can fail too */
    bool bad = ferror(j->f) != 0;
    if (j->own ? fclose(j->f) != 0 : fflush(j->f) != 0) bad = true;
    if (bad) failed(j);
    nb_status s = NB_OK;
    if (j->err)
        s = nb_set_error(NB_EIO, "writing %s failed: %s", j->name, strerror(j->err));
    free(j->line);
    free(j);
    return s;
}

const char *nb_json_num(double v, int prec, char *buf, size_t n) {
    if (isfinite(v)) snprintf(buf, n, "%.*f", prec, v);
    else snprintf(buf, n, "null");
    return buf;
}

bool nb_stdout_ok(const char *prog) {
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout)) return true;
    fprintf(stderr, "%s: writing standard output failed: %s\n", prog,
            strerror(errno ? errno : EIO));
    return false;
}
