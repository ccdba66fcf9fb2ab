/* nabla/run.h - the run toolkit: what a training program needs around its steps. Timing
 * and medians, a live progress line with rates and ETA, JSON-lines metrics that are always
 * valid JSON, error lines naming the rank, the thread count per rank, means over ranks,
 * checked flag values, the run's settings in its checkpoints, and a print(model)-like
 * parameter summary. The bundled programs (models/) are written with it. docs/metrics.md.
 *
 * Usage:
 *     nb_comm *world = nb_comm_world();
 *     int rank = nb_comm_rank(world), size = nb_comm_size(world);
 *     nb_share_threads(world, 0);          // the cores shared out among this machine's ranks
 *     if (rank == 0) nb_module_summary(model, stdout, 0);  // the tree, shapes and counts
 *     nb_jsonl *log = rank == 0 ? nb_jsonl_open("train", "log.jsonl", "w") : NULL;
 *     nb_progress_opts po = nb_progress_defaults();
 *     po.total = 1000;                     // steps, for the ETA
 *     po.unit = "samples";
 *     po.enabled = rank == 0;              // one progress line per job
 *     nb_progress *bar = nb_progress_new(&po);
 *     for (int64_t s = 1; s <= 1000; s++) {
 *         double t0 = nb_time_s();
 *         double loss = nb_mean_over_ranks(world, 0.5);   // the step's loss, averaged
 *         nb_progress_step(bar, nb_time_s() - t0, 64);    // 64 samples in this step
 *         nb_progress_show(bar, s % 50 == 0, "step %lld/1000  loss %.4f", (long long)s, loss);
 *         nb_jsonl_begin(log);
 *         nb_jsonl_str(log, "type", "step");
 *         nb_jsonl_int(log, "step", s);
 *         nb_jsonl_num(log, "loss", loss, 6);             // NaN or infinite: null
 *         nb_jsonl_end(log);
 *     }
 *     nb_progress_free(bar);
 *     if (nb_jsonl_close(log) != NB_OK) nb_report("train", rank, size, "%s", nb_last_error());
 *
 * Ownership: nb_progress_new and nb_jsonl_open return objects the caller frees with
 * nb_progress_free / nb_jsonl_close; NULL for either makes every call on it a no-op (so
 * ranks other than 0 pass NULL). Communicators and modules passed in are borrowed. Strings
 * passed in are used during the call, except where a field says it is kept. */
#ifndef NABLA_RUN_H
#define NABLA_RUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "nabla/checkpoint.h"
#include "nabla/nn.h"
#include "nabla/parallel.h"
#include "nabla/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- time ------------------------------------------------------------------------------ */
/* Seconds on the monotonic clock (for durations). */
double nb_time_s(void);
/* Median of v[n] (sorts v in place); NAN for n <= 0. */
double nb_median(double *v, int64_t n);
/* "h:mm:ss" of s seconds into buf[n] (negative or non-finite: "0:00:00"). Returns buf. */
const char *nb_format_duration(double s, char *buf, size_t n);

/* ---- ranks and threads ------------------------------------------------------------------- */
/* Print "prog: message" to stderr, or "prog (rank r): message" when size > 1, in one write,
 * so the lines of ranks failing together do not interleave. */
void nb_report(const char *prog, int rank, int size, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Ranks sharing this machine, from the launcher's environment (Open MPI, MPICH, Slurm);
 * world_size when none says. */
int nb_local_ranks(int world_size);
/* Whether the process runs under a launcher (mpirun, srun), whose pseudo-terminals make
 * isatty true for output that ends up in a file. */
bool nb_under_launcher(void);
/* Set the thread count (nb_set_num_threads): `requested` when > 0; otherwise all cores for
 * a single rank, or the cores divided among the ranks on this machine (at least 1), so
 * ranks do not oversubscribe. world may be NULL (one rank). */
void nb_share_threads(nb_comm *world, int requested);
/* The mean of v over world's ranks (v itself on one rank or a NULL world); NAN with
 * nb_last_error() set if the allreduce failed. Every rank must call it. */
double nb_mean_over_ranks(nb_comm *world, double v);

/* ---- flag values ------------------------------------------------------------------------- */
/* Bounds no run can usefully exceed, refused at parse time: a learning rate above
 * NB_MAX_LR only diverges (1e39 is not even a float), and the counts keep every size
 * computed from them (buffers, int casts) far from overflow. */
#define NB_MAX_LR 1000.0
#define NB_MAX_BATCH (INT64_C(1) << 24)
#define NB_MAX_THREADS 4096
/* Parse s, the value of `flag`, as a decimal integer in [min, max] into *out. On anything
 * else (not a number, trailing text, out of range) print "prog: FLAG must be an integer in
 * [min, max], got "S"" to stderr and return false (*out untouched). */
bool nb_parse_int(const char *prog, const char *flag, const char *s, int64_t min, int64_t max,
                  int64_t *out);
/* Parse s as a finite number between lo and hi (lo_open / hi_open: the bound itself is
 * excluded; hi = INFINITY: no upper bound) into *out. On anything else (inf, nan, overflow,
 * trailing text, out of range) print "prog: FLAG must be a number in [lo, hi), got "S""
 * (brackets as the bounds are) and return false. */
bool nb_parse_num(const char *prog, const char *flag, const char *s, double lo, bool lo_open,
                  double hi, bool hi_open, double *out);

/* ---- the run's settings in its checkpoints ------------------------------------------------
 * The settings that change a run's results (learning rate, batch, seed, model sizes, ...)
 * go into its checkpoints (nb_checkpoint's config); a resume with another value of one is
 * an error naming the setting and both values, unless --override names it:
 *     nb_run_config c = {0};
 *     nb_run_config_num(&c, "lr", lr);               // flag --lr
 *     nb_run_config_int(&c, "seed", seed);
 *     nb_run_config_fixed(&c, "the data order continues from the checkpoint");
 *     nb_run_config_apply(&c, &ck, "train", override);  // before nb_checkpoint_load / _save
 * Names are the flags without their dashes. Numbers are written as the shortest text that
 * reads back as the same double, so equal values always compare equal. */
#define NB_RUN_MAX_CONFIG 48
typedef struct nb_run_config {
    const char *names[NB_RUN_MAX_CONFIG]; /* borrowed: string literals in practice */
    const char *values[NB_RUN_MAX_CONFIG]; /* point into text */
    char text[NB_RUN_MAX_CONFIG][40];
    const char *fixed_why[NB_RUN_MAX_CONFIG]; /* non-NULL: --override may not name it */
    const char *may_change[NB_RUN_MAX_CONFIG];
    char override[512]; /* a copy of --override, split in place */
    int n, nmay;
} nb_run_config;
void nb_run_config_int(nb_run_config *c, const char *name, int64_t v);
void nb_run_config_num(nb_run_config *c, const char *name, double v);
void nb_run_config_str(nb_run_config *c, const char *name, const char *v);
/* The last setting added can never change on resume (a model size, a seed whose random
 * streams the checkpoint continues); why says so in --override's error. */
void nb_run_config_fixed(nb_run_config *c, const char *why);
/* Point ck's config at c's settings (and its program at prog), with the settings override
 * names (a comma list such as "lr,batch"; NULL: none) allowed to change on load. False
 * after printing "prog: --override: no setting "NAME" (settings: lr, batch, ...)" or
 * "prog: --override: NAME cannot change on resume (why)". c must outlive ck's use. */
bool nb_run_config_apply(nb_run_config *c, nb_checkpoint *ck, const char *prog,
                         const char *override);
/* The hint after a refused resume: " (to change it deliberately: --override NAME)" when
 * msg is a changed-setting error of nb_checkpoint_load, else "". Thread-local storage. */
const char *nb_run_config_hint(const char *msg);

/* ---- JSON lines --------------------------------------------------------------------------
 * One JSON object per line, built field by field and written whole by nb_jsonl_end: keys
 * and strings are escaped, NaN and infinities become null, so every line parses with a
 * strict JSON parser. Write errors are not lost: the first failed write or flush prints
 * one warning to stderr ("prog: warning: writing NAME failed: REASON; the log is
 * incomplete (the run goes on, and exits with status 1)"), later lines are dropped, and
 * nb_jsonl_close returns NB_EIO. Every function accepts a NULL writer and does nothing. */
typedef struct nb_jsonl nb_jsonl;
/* Open path with fopen's mode ("w", or "a" to continue a resumed run's log). prog and the
 * name "--log PATH" are used in the warning. NULL with nb_last_error() set when the file
 * cannot be opened. */
nb_jsonl *nb_jsonl_open(const char *prog, const char *path, const char *mode);
/* A writer on a stream the caller keeps (stdout for a final line): nb_jsonl_close flushes
 * it but does not close it. name is used in the warning ("standard output"). */
nb_jsonl *nb_jsonl_stream(const char *prog, FILE *f, const char *name);
/* Start a line (drops an unfinished one). */
void nb_jsonl_begin(nb_jsonl *j);
void nb_jsonl_str(nb_jsonl *j, const char *key, const char *v); /* NULL v: null */
void nb_jsonl_int(nb_jsonl *j, const char *key, int64_t v);
void nb_jsonl_bool(nb_jsonl *j, const char *key, bool v);
/* v with prec decimals (printf %.*f), or null when not finite. */
void nb_jsonl_num(nb_jsonl *j, const char *key, double v, int prec);
/* v with prec significant digits (printf %.*g, which never prints an exponent JSON
 * refuses), or null when not finite. */
void nb_jsonl_num_g(nb_jsonl *j, const char *key, double v, int prec);
/* End the line and write it in one piece. */
void nb_jsonl_end(nb_jsonl *j);
/* Flush to the file, where a full disk shows up (warns once on failure). */
void nb_jsonl_flush(nb_jsonl *j);
/* Whether every write so far succeeded (true for NULL). */
bool nb_jsonl_ok(const nb_jsonl *j);
/* Flush, close (a file) and free. NB_OK, or NB_EIO when any write failed. */
nb_status nb_jsonl_close(nb_jsonl *j);
/* v as a JSON number with prec decimals into buf[n], or "null" when not finite. Returns
 * buf. */
const char *nb_json_num(double v, int prec, char *buf, size_t n);
/* Flush stdout; false (after printing "prog: writing standard output failed: REASON" to
 * stderr) when any write to it failed. For the end of a program whose results are there. */
bool nb_stdout_ok(const char *prog);

/* ---- progress line -----------------------------------------------------------------------
 * "TEXT  R UNIT/s (recent r)  ETA h:mm:ss": the average rate since the start, the rate over
 * the last `window` steps, and the time left at the recent rate. On a live terminal the
 * line is rewritten in place (\r) at most every refresh_s; elsewhere (a file, a pipe, or
 * any output under mpirun or srun, whose pseudo-terminals would put \r into logs) a new
 * line is printed when the caller asks for one. */
typedef struct nb_progress_opts {
    uint32_t _init;    /* private: set by nb_progress_defaults() only */
    int64_t total;     /* steps of the run, for the ETA (0: no ETA) */
    int64_t start;     /* steps already done (a resumed run) (default 0) */
    const char *unit;  /* what a step's count counts: "samples", "tokens" (default "samples"; kept) */
    int window;        /* steps in the recent rate (default 20) */
    double refresh_s;  /* live line: rewritten at most this often (default 0.2) */
    bool enabled;      /* false: nothing printed, rates still kept (default true) */
    int live;          /* 1: rewrite in place, 0: lines, -1: decide (default -1: live when the
                          stream is a terminal, TERM is not "dumb" and no launcher runs it) */
    FILE *out;         /* default stdout (kept) */
} nb_progress_opts;
nb_progress_opts nb_progress_defaults(void);
typedef struct nb_progress nb_progress;
/* NULL opts: the defaults. NULL with nb_last_error() for a bad option (window <= 0, ...). */
nb_progress *nb_progress_new(const nb_progress_opts *o);
void nb_progress_free(nb_progress *p);
/* Record one finished step: its duration and what it processed (samples, tokens). */
void nb_progress_step(nb_progress *p, double seconds, double count);
/* Units per second since the start (0 before the first step), over the recent window,
 * and the seconds left at the recent rate (NAN without a total). */
double nb_progress_rate(const nb_progress *p);
double nb_progress_recent_rate(const nb_progress *p);
double nb_progress_eta_s(const nb_progress *p);
/* Whether the line is rewritten in place. */
bool nb_progress_live(const nb_progress *p);
/* Show the line with TEXT from fmt. Live: written when refresh_s has passed since the last
 * one, or at the last step; otherwise written as a new line when `line` is true. */
void nb_progress_show(nb_progress *p, bool line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* End a live line with a newline before printing something else (nothing otherwise). */
void nb_progress_break(nb_progress *p);

/* ---- parameter summary --------------------------------------------------------------------
 * The module tree as PyTorch's print(model) shows it, with each module's own parameters
 * (name and shape) and the parameter count of each subtree:
 *     Sequential  (814,090 parameters)
 *       (0): Linear  weight [1024, 784]  bias [1024]  (803,840)
 *       (1): ReLU
 *       (2): Linear  weight [10, 1024]  bias [10]  (10,250)
 * depth limits the levels shown below m (0: all). NB_OK, NB_ENULL for a NULL module, NB_EIO
 * when writing to out failed. */
nb_status nb_module_summary(nb_module *m, FILE *out, int depth);

#ifdef __cplusplus
}
#endif
#endif
