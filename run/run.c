/* run.c - the run toolkit's small parts (nabla/run.h): timing, medians, durations, error
 * lines naming the rank, thread sharing, means over ranks, checked flag values and the run's
 * settings in its checkpoints. Public API only. */
#include "nabla/run.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nabla/memory.h"
#include "nabla/runtime.h"
#include "nabla/tensor.h"

double nb_time_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double nb_median(double *v, int64_t n) {
    if (n <= 0) return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

const char *nb_format_duration(double s, char *buf, size_t n) {
    if (!isfinite(s) || s < 0 || s > 1e15) s = 0;
    long long t = (long long)(s + 0.5);
    snprintf(buf, n, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
    return buf;
}

void nb_report(const char *prog, int rank, int size, const char *fmt, ...) {
    char msg[1024];
    int k = size > 1 ? snprintf(msg, sizeof msg, "%s (rank %d): ", prog, rank)
                     : snprintf(msg, sizeof msg, "%s: ", prog);
    va_list ap;
    va_start(ap, fmt);
    if (k > 0 && (size_t)k < sizeof msg) vsnprintf(msg + k, sizeof msg - (size_t)k, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", msg);
}

bool nb_under_launcher(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMIX_RANK", "PMI_SIZE",
                          "SLURM_PROCID", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return true;
    return false;
}

int nb_local_ranks(int world_size) {
    const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MPICH_LOCALNRANKS",
                          "SLURM_NTASKS_PER_NODE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 0) return atoi(v);
    }
    return world_size;
}

void nb_share_threads(nb_comm *world, int requested) {
    int size = world ? nb_comm_size(world) : 1;
    if (requested > 0 || size == 1) {
        nb_set_num_threads(requested);
        return;
    }
    nb_set_num_threads(0); /* the default (all cores) per rank would oversubscribe */
    int per = nb_get_num_threads() / nb_local_ranks(size);
    nb_set_num_threads(per > 0 ? per : 1);
}

double nb_mean_over_ranks(nb_comm *world, double v) {
    if (!world || nb_comm_size(world) == 1) return v;
    nb_scope_begin();
    nb_tensor *t = nb_from_buffer(&v, (int64_t[]){1}, 1, NB_F64);
    if (!t || nb_allreduce(world, t, NB_REDUCE_AVG) != NB_OK) v = NAN;
    else v = nb_item_f64(t);
    nb_scope_end();
    return v;
}

bool nb_parse_int(const char *prog, const char *flag, const char *s, int64_t min, int64_t max,
                   int64_t *out) {
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || errno || end == s || *end || v < min || v > max) {
        if (max == INT64_MAX)
            fprintf(stderr, "%s: %s must be an integer >= %lld, got \"%s\"\n", prog, flag,
                    (long long)min, s ? s : "");
        else
            fprintf(stderr, "%s: %s must be an integer in [%lld, %lld], got \"%s\"\n", prog, flag,
                    (long long)min, (long long)max, s ? s : "");
        return false;
    }
    *out = v;
    return true;
}

bool nb_parse_num(const char *prog, const char *flag, const char *s, double lo, bool lo_open,
                   double hi, bool hi_open, double *out) {
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : NAN;
    /* errno: ERANGE on overflow (1e999) and underflow (1e-999), neither of which is meant */
    bool ok = s && !errno && end != s && !*end && isfinite(v) && (lo_open ? v > lo : v >= lo) &&
              (hi_open ? v < hi : v <= hi);
    if (!ok) {
        if (isinf(hi))
            fprintf(stderr, "%s: %s must be a finite number %s %g, got \"%s\"\n", prog, flag,
                    lo_open ? ">" : ">=", lo, s ? s : "");
        else
            fprintf(stderr, "%s: %s must be a number in %c%g, %g%c, got \"%s\"\n", prog, flag,
                    lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']', s ? s : "");
        return false;
    }
    *out = v;
    return true;
}

/* ---- the run's identity ------------------------------------------------------------------- */
static void config_add(nb_run_config *c, const char *name, const char *text) {
    if (c->n >= NB_RUN_MAX_CONFIG) return; /* a program bug; the programs have far fewer */
    snprintf(c->text[c->n], sizeof c->text[c->n], "%s", text);
    c->names[c->n] = name;
    c->values[c->n] = c->text[c->n];
    c->n++;
}

void nb_run_config_int(nb_run_config *c, const char *name, int64_t v) {
    char b[32];
    snprintf(b, sizeof b, "%lld", (long long)v);
    config_add(c, name, b);
}

void nb_run_config_num(nb_run_config *c, const char *name, double v) {
    char b[40];
    for (int prec = 1; prec <= 17; prec++) { /* the shortest text that reads back as v */
        snprintf(b, sizeof b, "%.*g", prec, v);
        if (strtod(b, NULL) == v) break;
    }
    config_add(c, name, b);
}

void nb_run_config_str(nb_run_config *c, const char *name, const char *v) { config_add(c, name, v); }

void nb_run_config_fixed(nb_run_config *c, const char *why) {
    if (c->n > 0) c->fixed_why[c->n - 1] = why;
}

bool nb_run_config_apply(nb_run_config *c, nb_checkpoint *ck, const char *prog, const char *override) {
    c->nmay = 0;
    if (override) {
        snprintf(c->override, sizeof c->override, "%s", override);
        for (char *save = NULL, *tok = strtok_r(c->override, ",", &save); tok;
             tok = strtok_r(NULL, ",", &save)) {
            int k = 0;
            while (k < c->n && strcmp(c->names[k], tok)) k++;
            if (k == c->n) {
                char list[600] = "";
                for (int i = 0; i < c->n; i++)
                    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
                             i ? ", " : "", c->names[i]);
                fprintf(stderr, "%s: --override: no setting \"%s\" (settings: %s)\n", prog, tok,
                        list);
                return false;
            }
            if (c->fixed_why[k]) {
                fprintf(stderr, "%s: --override: %s cannot change on resume (%s)\n", prog, tok,
                        c->fixed_why[k]);
                return false;
            }
            if (c->nmay < NB_RUN_MAX_CONFIG) c->may_change[c->nmay++] = c->names[k];
        }
    }
    ck->program = prog;
    ck->config_names = c->names;
    ck->config_values = c->values;
    ck->nconfig = c->n;
    ck->may_change = c->may_change;
    ck->nmay_change = c->nmay;
    return true;
}

const char *nb_run_config_hint(const char *msg) {
    const char *p = strstr(msg, "; this run has ");
    if (!p || !strstr(msg, " was written with ")) return "";
    static _Thread_local char hint[160];
    const char *name = p + strlen("; this run has ");
    size_t n = strcspn(name, "=");
    snprintf(hint, sizeof hint, " (to change it deliberately: --override %.*s)", (int)n, name);
    return hint;
}
