/* guard.h - failure detection in the bundled programs (mlp, cnn: models/common.c; gpt):
 * the communicator's deadline, which finds a dead or hung peer (--comm-timeout), and what a
 * non-finite loss or gradient norm does (--on-nonfinite stop|skip, --max-skips).
 * Public API only. docs/checkpoints.md, "Failure detection".
 *
 *     static nbm_guard guard;                               // the program's settings
 *     if (!nbm_guard_args("gpt", &argc, argv, &guard)) return 2;   // before its own flags
 *     ...
 *     nbm_guard_comm(&guard, world);                        // after nb_comm_world()
 *     ...                                                   // each step, on every rank:
 *     char why[256];
 *     int g = nbm_guard_step(&guard, step, mean_loss, grad_norm, why, sizeof why);
 *     if (g < 0) { ...report why, exit 1... }               // stop
 *     if (g > 0) { ...report why; the step was not applied... }   // skipped
 *
 * The communicator is borrowed. */
#ifndef NBM_GUARD_H
#define NBM_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <nabla/nabla.h>
#include <nabla/parallel.h>

/* The programs' deadline for a collective (seconds) unless --comm-timeout or the
 * NB_COMM_TIMEOUT environment variable says otherwise: the library's own default. */
#define NBM_COMM_TIMEOUT NB_COMM_TIMEOUT_DEFAULT

typedef struct nbm_guard {
    double comm_timeout; /* --comm-timeout S; < 0: not given */
    bool skip;           /* --on-nonfinite skip (false: stop) */
    int64_t max_skips;   /* --max-skips N: this many skipped steps in a row stop the run */
    const char *train_flag; /* the first of --on-nonfinite, --max-skips given (NULL: none):
                             * training flags, a mistake with --eval-only or --sample */
    int64_t skipped;     /* steps skipped so far (this process) */
    int64_t in_row;      /* of which the last ones in a row */
} nbm_guard;

/* A flag given twice on the command line ("gpt --zero 1 --zero 2"): every program refuses
 * it (exit status 2) rather than letting the last one win silently. Prints why; returns 2. */
static inline int nbm_repeated(const char *prog, const char *flag) {
    fprintf(stderr, "%s: %s is given more than once; give each flag once\n", prog, flag);
    return 2;
}

/* Take --comm-timeout, --on-nonfinite and --max-skips with their values out of argv
 * (*argc shrinks; the rest keep their order), filling g (defaults first), so the program's
 * own parser never sees them. False after printing why to stderr (exit status 2): a bad
 * value, or --max-skips without --on-nonfinite skip. */
bool nbm_guard_args(const char *prog, int *argc, char **argv, nbm_guard *g);
/* The flags' lines for a program's --help. */
void nbm_guard_usage(FILE *out);
/* Set world's timeout: --comm-timeout, else NB_COMM_TIMEOUT when set, else
 * NBM_COMM_TIMEOUT. NULL world: nothing. */
void nbm_guard_comm(const nbm_guard *g, nb_comm *world);
/* After step `step` (counted from 1) with loss (the mean over the ranks) and grad_norm (the
 * global gradient norm, the same on every rank): 0 when both are finite; otherwise why (a
 * message naming the step) and -1 to stop, or 1 when the step was skipped (the caller did
 * not apply a non-finite gradient) and the run goes on. A non-finite loss with a finite
 * gradient norm always stops (that step was applied), and so does the --max-skips-th
 * skipped step in a row. */
int nbm_guard_step(nbm_guard *g, int64_t step, double loss, double grad_norm, char *why,
                   size_t n);

/* For tests only: NaN when the environment variable NBM_TEST_NONFINITE lists step (counted
 * from 1) for this rank - "3,4" (every rank), "3@1" (rank 1 only) - else 1. A program
 * multiplies its loss by it before the backward pass to fake a step that overflows. */
double nbm_guard_test_factor(int64_t step, int rank);

#endif
