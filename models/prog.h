/* prog.h - small helpers the bundled programs (mlp, cnn: models/common.c; gpt) share:
 * timing, medians, ETA text, error lines that name the rank, how many threads each rank
 * gets, scalar means over ranks, flag values checked against their range, numbers for JSON
 * lines (null for NaN and infinities) and log files whose write errors are reported.
 * Public API only.
 *
 *     nb_comm *world = nb_comm_world();
 *     nbm_set_threads(world, requested);          // 0: the cores shared out among local ranks
 *     double loss = nbm_mean_over_ranks(world, local_loss);
 *     nbm_report("gpt", rank, size, "step %d: %s", step, nb_last_error());
 *
 * The communicator is borrowed. */
#ifndef NBM_PROG_H
#define NBM_PROG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <nabla/checkpoint.h>
#include <nabla/nabla.h>

/* Seconds on the monotonic clock. */
double nbm_now_s(void);
/* Median of v[n] (sorts v); NAN for n == 0. */
double nbm_median(double *v, int64_t n);
/* "h:mm:ss" of s seconds (negative or non-finite: 0). */
void nbm_fmt_eta(double s, char *buf, size_t n);
/* Print "prog: message" to stderr, or "prog (rank r): message" when size > 1, in one write,
 * so the lines of ranks failing together do not interleave. */
void nbm_report(const char *prog, int rank, int size, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Ranks sharing this machine, from the launcher's environment (Open MPI, MPICH, Slurm);
 * world_size when none says. */
int nbm_local_ranks(int world_size);
/* Set the thread count: `requested` when > 0; otherwise all cores alone, or the cores
 * divided among the ranks on this machine (at least 1), so ranks do not oversubscribe. */
void nbm_set_threads(nb_comm *world, int requested);
/* The mean of v over the ranks (v itself on one rank); NAN if the allreduce failed. */
double nbm_mean_over_ranks(nb_comm *world, double v);

/* Bounds of flag values that no run can usefully exceed, refused at parse time: a learning
 * rate above NBM_MAX_LR only diverges (1e39 is not even a float), and the counts below keep
 * every size computed from them (buffers, int casts) far from overflow. */
#define NBM_MAX_LR 1000.0
#define NBM_MAX_BATCH (INT64_C(1) << 24)
#define NBM_MAX_THREADS 4096

/* Parse s, the value of `flag`, as a decimal integer in [min, max] into *out. On anything
 * else (not a number, trailing text, out of range) print "prog: FLAG must be an integer in
 * [min, max], got S" to stderr and return false (*out untouched). */
bool nbm_parse_int(const char *prog, const char *flag, const char *s, int64_t min, int64_t max,
                   int64_t *out);
/* Parse s, the value of `flag`, as a finite number in the interval from lo to hi (lo_open /
 * hi_open: the bound itself is excluded; hi = INFINITY: no upper bound) into *out. On
 * anything else (inf, nan, overflow, trailing text, out of range) print "prog: FLAG must be
 * a number in [lo, hi), got S" (the brackets as the bounds are) and return false. */
bool nbm_parse_num(const char *prog, const char *flag, const char *s, double lo, bool lo_open,
                   double hi, bool hi_open, double *out);

/* ---- the run's identity in its checkpoints ---------------------------------------------------
 * The settings that change a run's results (learning rate, batch, seed, model sizes, ...)
 * go into its checkpoints (nb_checkpoint's config); --resume with another value of one is
 * an error naming the flag and both values, unless --override names it. The same rule in
 * every program:
 *     nbm_config c = {0};
 *     nbm_config_num(&c, "lr", a.lr);            // flag --lr
 *     nbm_config_int(&c, "batch", a.batch);
 *     nbm_config_apply(&c, &ck, a.override);     // before nb_checkpoint_load / _save
 * Names are the flags without their dashes. Numbers are written as the shortest text that
 * reads back as the same double, so equal values always compare equal. */
#define NBM_MAX_CONFIG 48
typedef struct nbm_config {
    const char *names[NBM_MAX_CONFIG];
    const char *values[NBM_MAX_CONFIG]; /* point into text */
    char text[NBM_MAX_CONFIG][40];
    const char *fixed_why[NBM_MAX_CONFIG]; /* non-NULL: --override may not name it */
    const char *may_change[NBM_MAX_CONFIG];
    char override[512]; /* a copy of --override, split in place */
    int n, nmay;
} nbm_config;
void nbm_config_int(nbm_config *c, const char *name, int64_t v);
void nbm_config_num(nbm_config *c, const char *name, double v);
void nbm_config_str(nbm_config *c, const char *name, const char *v);
/* The last setting added can never change on resume (a model size, a seed whose random
 * streams the checkpoint continues); why says so in --override's error. */
void nbm_config_fixed(nbm_config *c, const char *why);
/* Point ck's config at c's settings (and program at prog), with the settings --override
 * names (a comma list such as "lr,batch"; NULL: none) allowed to change on load. False
 * after printing "prog: --override: no setting NAME (settings: lr, batch, ...)" when a name
 * is not one of c's, or "prog: --override: NAME cannot change on resume (why)". c must outlive ck's use. */
bool nbm_config_apply(nbm_config *c, nb_checkpoint *ck, const char *prog, const char *override);
/* The hint a program adds after a refused --resume: " (to change a setting deliberately,
 * name it in --override, e.g. --override lr)" when msg is a changed-setting error, else "". */
const char *nbm_config_hint(const char *msg);

/* v as a JSON number with prec decimals into buf[n], or "null" when v is NaN or infinite
 * (JSON has neither). Returns buf. */
const char *nbm_jnum(double v, int prec, char *buf, size_t n);

/* A log file (JSON lines) whose write errors are not lost: the first failed write, flush or
 * close prints one warning naming the file and the reason; later lines are dropped. */
typedef struct nbm_log {
    FILE *f;          /* NULL: no log (every call is a no-op) */
    const char *prog; /* borrowed, for the warning */
    const char *path; /* borrowed */
    int err;          /* errno of the first failure, 0 while every write succeeded */
} nbm_log;
/* Open path with fopen's mode into *l. False (errno set, nothing printed) when it cannot. */
bool nbm_log_open(nbm_log *l, const char *prog, const char *path, const char *mode);
/* printf one piece of a line into the log; on failure warn once (see nbm_log). */
void nbm_log_printf(nbm_log *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Flush the log to the file (where a full disk shows up); on failure warn once. */
void nbm_log_flush(nbm_log *l);
/* Close the log (l->f becomes NULL). Returns false when any write of it failed, so the
 * caller can say the log is incomplete and exit non-zero; true for no log. */
bool nbm_log_close(nbm_log *l);
/* Flush stdout, where the final JSON line goes; false (after printing why to stderr) when
 * any write to it failed. */
bool nbm_stdout_ok(const char *prog);

#endif
