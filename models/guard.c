/* guard.c - failure detection in the bundled programs (guard.h). */
#include "guard.h"

#include <nabla/run.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

bool nbm_guard_args(const char *prog, int *argc, char **argv, nbm_guard *g) {
    *g = (nbm_guard){.comm_timeout = -1, .max_skips = 10};
    bool max_skips_given = false, seen[3] = {false, false, false};
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        const char *f = argv[i];
        bool ours = !strcmp(f, "--comm-timeout") || !strcmp(f, "--on-nonfinite") ||
                    !strcmp(f, "--max-skips");
        if (!ours) {
            argv[out++] = argv[i];
            continue;
        }
        int k = !strcmp(f, "--comm-timeout") ? 0 : !strcmp(f, "--on-nonfinite") ? 1 : 2;
        if (seen[k]) {
            nbm_repeated(prog, f);
            return false;
        }
        seen[k] = true;
        if (strcmp(f, "--comm-timeout") && !g->train_flag) g->train_flag = f;
        const char *v = i + 1 < *argc ? argv[++i] : NULL;
        if (!v) {
            fprintf(stderr, "%s: %s needs a value (see --help)\n", prog, f);
            return false;
        }
        if (!strcmp(f, "--max-skips")) max_skips_given = true;
        if (!strcmp(f, "--comm-timeout")) {
            if (!nb_parse_num(prog, f, v, 0, false, INFINITY, false, &g->comm_timeout))
                return false;
        } else if (!strcmp(f, "--max-skips")) {
            if (!nb_parse_int(prog, f, v, 1, 1000000, &g->max_skips)) return false;
        } else if (!strcmp(v, "stop") || !strcmp(v, "skip")) {
            g->skip = !strcmp(v, "skip");
        } else {
            fprintf(stderr, "%s: --on-nonfinite must be stop or skip, got \"%s\"\n", prog, v);
            return false;
        }
    }
    if (max_skips_given && !g->skip) {
        fprintf(stderr, "%s: --max-skips has no effect without --on-nonfinite skip\n", prog);
        return false;
    }
    argv[out] = NULL; /* argv[argc] is NULL, as it was */
    *argc = out;
    return true;
}

void nbm_guard_usage(FILE *out) {
    fprintf(out,
            "failures:\n"
            "  --comm-timeout S how long a rank waits for the others in a collective before\n"
            "                   the run fails: a dead or hung rank (default %g; 0: forever;\n"
            "                   NB_COMM_TIMEOUT in the environment when not given)\n"
            "  --on-nonfinite A a NaN or infinite loss or gradient norm: stop (the run fails\n"
            "                   naming the step), or skip (the step is not applied, the run\n"
            "                   goes on; default stop)\n"
            "  --max-skips N    with skip: this many skipped steps in a row stop the run\n"
            "                   (default 10)\n",
            NBM_COMM_TIMEOUT);
}

void nbm_guard_comm(const nbm_guard *g, nb_comm *world) {
    if (!world) return;
    double t = g->comm_timeout;
    const char *env = getenv("NB_COMM_TIMEOUT");
    if (t < 0) t = env && *env ? nb_comm_timeout(world) : NBM_COMM_TIMEOUT;
    nb_comm_set_timeout(world, t);
}

/* "NaN" or "infinite" */
static const char *what(double v) { return isnan(v) ? "NaN" : "infinite"; }

int nbm_guard_step(nbm_guard *g, int64_t step, double loss, double grad_norm, char *why,
                   size_t n) {
    if (isfinite(loss) && isfinite(grad_norm)) {
        g->in_row = 0;
        return 0;
    }
    char which[64];
    if (!isfinite(loss))
        snprintf(which, sizeof which, "the loss is %s", what(loss));
    else
        snprintf(which, sizeof which, "the gradient norm is %s", what(grad_norm));
    if (!g->skip || isfinite(grad_norm)) { /* stop; a finite norm: the step was applied */
        snprintf(why, n, "step %lld: %s: training diverged (a smaller --lr?%s)", (long long)step,
                 which, g->skip ? "" : " --on-nonfinite skip goes on without such steps");
        return -1;
    }
    g->skipped++, g->in_row++;
    if (g->in_row >= g->max_skips) {
        snprintf(why, n, "step %lld: %s, the %lld%s skipped step in a row: training diverged "
                 "(--max-skips %lld)", (long long)step, which, (long long)g->in_row,
                 g->in_row % 10 == 1 && g->in_row % 100 != 11   ? "st"
                 : g->in_row % 10 == 2 && g->in_row % 100 != 12 ? "nd"
                 : g->in_row % 10 == 3 && g->in_row % 100 != 13 ? "rd"
                                                                 : "th",
                 (long long)g->max_skips);
        return -1;
    }
    snprintf(why, n, "step %lld: %s: skipped, not applied (%lld in a row, %lld in all)",
             (long long)step, which, (long long)g->in_row, (long long)g->skipped);
    return 1;
}

double nbm_guard_test_factor(int64_t step, int rank) {
    const char *s = getenv("NBM_TEST_NONFINITE");
    while (s && *s) {
        char *end;
        long long st = strtoll(s, &end, 10), rk = -1;
        if (end == s) break;
        if (*end == '@') rk = strtoll(end + 1, &end, 10);
        if (st == step && (rk < 0 || rk == rank)) return NAN;
        s = *end == ',' ? end + 1 : NULL;
    }
    return 1.0;
}
