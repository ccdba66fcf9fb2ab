/* test_optim.h - what the optim suite's files (tests/test_optim.c, tests/test_optim_clip.c)
 * share: the reader of the PyTorch fixture files in tests/fixtures/optim/ (the format:
 * tools/make_optim_fixtures.py) and an optimizer case's parameters. */
#ifndef NABLA_TEST_OPTIM_H
#define NABLA_TEST_OPTIM_H

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#ifndef NB_SOURCE_DIR
#define NB_SOURCE_DIR "."
#endif

/* ---- fixtures -------------------------------------------------------------------------------- */
typedef struct fx {
    char *buf;
    char **lines;
    int n;
} fx;

static inline void fx_load(fx *f, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/tests/fixtures/optim/%s.txt", NB_SOURCE_DIR, name);
    FILE *fp = fopen(path, "rb");
    ck_assert_msg(fp != NULL, "cannot open fixture %s", path);
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    f->buf = malloc((size_t)len + 1);
    ck_assert(fread(f->buf, 1, (size_t)len, fp) == (size_t)len);
    fclose(fp);
    f->buf[len] = 0;
    f->lines = malloc(sizeof(char *) * ((size_t)len / 2 + 2));
    f->n = 0;
    for (char *s = f->buf; *s;) {
        char *e = strchr(s, '\n');
        if (e) *e = 0;
        if (*s && *s != '#') f->lines[f->n++] = s;
        if (!e) break;
        s = e + 1;
    }
}

static inline void fx_free(fx *f) {
    free(f->buf);
    free(f->lines);
}

/* The first line starting with the formatted prefix, or NULL. */
static inline const char *fx_line(const fx *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline const char *fx_line(const fx *f, const char *fmt, ...) {
    char prefix[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    size_t n = strlen(prefix);
    for (int i = 0; i < f->n; i++)
        if (strncmp(f->lines[i], prefix, n) == 0) return f->lines[i] + n;
    return NULL;
}

/* Numbers of a line (after its prefix) into out; returns the count. */
static inline int fx_nums(const char *s, double *out, int max) {
    int k = 0;
    char *end;
    while (k < max) {
        double v = strtod(s, &end);
        if (end == s) break;
        out[k++] = v;
        s = end;
    }
    return k;
}

/* key=value in a line: the value, or def when absent (PyTorch's default, which the fixture
 * leaves out). */
static inline double fx_opt_or(const char *line, const char *key, double def) {
    char pat[64];
    snprintf(pat, sizeof pat, " %s=", key);
    const char *p = strstr(line, pat);
    return p ? strtod(p + strlen(pat), NULL) : def;
}
static inline double fx_opt(const char *line, const char *key) { return fx_opt_or(line, key, 0); }

/* ---- an optimizer case's parameters ---------------------------------------------------- */
#define NP 3

typedef struct ocase {
    fx f;
    int64_t shape[NP][NB_MAX_DIMS];
    int ndim[NP];
    int steps;
} ocase;

#endif
