/* progress.c - the progress line of nabla/run.h: average and recent rates (a ring of the
 * last `window` steps), the ETA, and in-place rewriting only on a real terminal. */
#include "nabla/run.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct nb_progress {
    nb_progress_opts o;
    bool live;
    double *dt, *count; /* ring of the last window steps */
    int64_t steps;      /* recorded here (not counting o.start) */
    double time, total_count, last_show;
    bool open_line;     /* a live line was written and not ended */
};

nb_progress_opts nb_progress_defaults(void) {
    return (nb_progress_opts){._init = NB__OPTS_MARK(nb_progress_opts),
                              .unit = "samples",
                              .window = 20,
                              .refresh_s = 0.2,
                              .enabled = true,
                              .live = -1,
                              .out = NULL};
}

nb_progress *nb_progress_new(const nb_progress_opts *o) {
    if (o && NB__OPTS_CHECK(o, nb_progress_opts, "progress_new", "nb_progress_defaults()",
                            "o.total = steps") != NB_OK)
        return NULL;
    nb_progress_opts d = o ? *o : nb_progress_defaults();
    if (d.window <= 0 || d.window > 1000000)
        return nb_set_error(NB_EINVAL, "progress_new: window must be in [1, 1000000] (got %d)",
                            d.window), NULL;
    if (d.total < 0 || d.start < 0 || !(d.refresh_s >= 0))
        return nb_set_error(NB_EINVAL, "progress_new: total, start and refresh_s must be >= 0 "
                            "(got %lld, %lld, %g)", (long long)d.total, (long long)d.start,
                            d.refresh_s), NULL;
    if (!d.unit) d.unit = "samples";
    if (!d.out) d.out = stdout;
    nb_progress *p = calloc(1, sizeof *p);
    if (p) {
        p->dt = calloc((size_t)d.window, sizeof *p->dt);
        p->count = calloc((size_t)d.window, sizeof *p->count);
    }
    if (!p || !p->dt || !p->count) {
        if (p) free(p->dt), free(p->count);
        free(p);
        return nb_set_error(NB_ENOMEM, "progress_new: out of memory"), NULL;
    }
    p->o = d;
    if (d.live >= 0) {
        p->live = d.live != 0;
    } else {
        const char *term = getenv("TERM");
        p->live = isatty(fileno(d.out)) && !(term && !strcmp(term, "dumb")) &&
                  !nb_under_launcher();
    }
    p->last_show = -1e300;
    return p;
}

void nb_progress_free(nb_progress *p) {
    if (!p) return;
    free(p->dt);
    free(p->count);
    free(p);
}

void nb_progress_step(nb_progress *p, double seconds, double count) {
    if (!p) return;
    int k = (int)(p->steps % p->o.window);
    p->dt[k] = seconds;
    p->count[k] = count;
    p->steps++;
    p->time += seconds;
    p->total_count += count;
}

double nb_progress_rate(const nb_progress *p) {
    return p && p->time > 0 ? p->total_count / p->time : 0;
}

/* The sums over the recent window. */
static void recent(const nb_progress *p, double *t, double *c, int *n) {
    *n = (int)(p->steps < p->o.window ? p->steps : p->o.window);
    *t = *c = 0;
    for (int i = 0; i < *n; i++) *t += p->dt[i], *c += p->count[i];
}

double nb_progress_recent_rate(const nb_progress *p) {
    if (!p) return 0;
    double t, c;
    int n;
    recent(p, &t, &c, &n);
    return t > 0 ? c / t : 0;
}

double nb_progress_eta_s(const nb_progress *p) {
    if (!p || p->o.total <= 0) return NAN;
    double t, c;
    int n;
    recent(p, &t, &c, &n);
    int64_t left = p->o.total - p->o.start - p->steps;
    if (left <= 0) return 0;
    return n > 0 ? (double)left * t / n : NAN;
}

bool nb_progress_live(const nb_progress *p) { return p && p->live; }

void nb_progress_show(nb_progress *p, bool line, const char *fmt, ...) {
    if (!p || !p->o.enabled) return;
    bool last = p->o.total > 0 && p->o.start + p->steps >= p->o.total;
    double now = nb_time_s();
    if (p->live ? !(last || now - p->last_show >= p->o.refresh_s) : !line) return;
    char text[512], eta[32] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (p->o.total > 0) {
        char d[24];
        snprintf(eta, sizeof eta, "  ETA %s", nb_format_duration(nb_progress_eta_s(p), d, sizeof d));
    }
    fprintf(p->o.out, "%s%s  %.0f %s/s (recent %.0f)%s%s", p->live ? "\r" : "", text,
            nb_progress_rate(p), p->o.unit, nb_progress_recent_rate(p), eta,
            p->live ? "   " : "\n");
    fflush(p->o.out);
    p->open_line = p->live;
    p->last_show = now;
}

void nb_progress_break(nb_progress *p) {
    if (!p || !p->open_line) return;
    fputc('\n', p->o.out);
    p->open_line = false;
}
