/* ft.h - fault tolerance in the bundled programs (mlp, cnn: models/common.c; gpt): the
 * graceful stop on SIGINT / SIGTERM / SIGUSR1 (nabla/stop.h) as every program does it,
 * rotating checkpoints (--keep) and --resume auto.
 * Public API only.
 *
 *     nbm_stop_begin("gpt");                        // before training
 *     ...
 *     int stop = 0;                                 // after each step, on every rank:
 *     double loss = nbm_step_sync(world, local_loss, &stop);   // mean over ranks + agreed stop
 *     if (stop) { ...save, then break... }
 *     nbm_stop_fields(final_line, stop);        // "stopped": "signal", "signal": "SIGTERM"
 *     return stop ? 128 + stop : 0;
 *
 * The communicator is borrowed. */
#ifndef NBM_FT_H
#define NBM_FT_H

#include <stdbool.h>
#include <stdint.h>

#include <nabla/nabla.h>

/* Install the stop handlers; a failure is a warning on stderr (the run goes on, stoppable
 * by signals' default action only). */
void nbm_stop_begin(const char *prog);
/* The mean of v over the ranks (v itself on one rank) and, in *stop, the stop signal every
 * rank agrees on (0: go on), in one allreduce. NaN with the error set if it failed. */
double nbm_step_sync(nb_comm *world, double v, int *stop);
/* The final JSON line's fields for a stopped run: "stopped": "signal", "signal": "SIGTERM"
 * (nothing when stop is 0). */
void nbm_stop_fields(nb_jsonl *line, int stop);
/* The exit status of a run that went well: 128 + stop, or 0. */
int nbm_stop_status(int stop);

/* ---- the model state a rank holds ---------------------------------------------------------- */
/* In MiB: mib[0] the total, mib[1] parameters, mib[2] gradients, mib[3] optimizer state
 * tensors, resident on this rank: nb_zero_memory under ZeRO, otherwise the whole model's
 * (every rank holds it all). */
void nbm_model_state_mib(const nb_zero *zero, nb_optim *opt, nb_module *model, double mib[4]);

/* ---- --save DIR_OR_FILE --keep K, --resume auto ------------------------------------------- */
/* Save ck to --save (nb_checkpoint_save): the file or folder itself (keep 0), or its step's
 * member of the series (keep > 0, nabla/checkpoint.h: run.ckpt -> run-<step>.ckpt, DIR/ ->
 * DIR/checkpoint-<step>.ckpt) and only the newest keep of them kept. A checkpoint of several
 * ranks (ck->comm, or a parallel model: ZeRO, a mesh) is saved by every rank together (a
 * folder, or DDP's one file written by rank 0); --resume auto (nbm_resume_path) finds either
 * kind, and gpt --pp's pipeline folders. */
nb_status nbm_save(const char *save, int64_t keep, const nb_checkpoint *ck);
/* --async-save 1: from now on nbm_save snapshots the state and a
 * background writer (nb_checkpoint_writer, one per process, made by the first save) writes
 * this rank's file while training goes on; a save that finds a write in flight waits for it,
 * and a save of one process after a stop signal waits for its own write (the process is about
 * to exit; a save of several ranks is completed by nbm_save_finish). A failed write is the
 * error of the next save or of nbm_save_finish. */
void nbm_save_async(bool on);
/* Complete the last save and free the writer (nothing without one). wait: complete it (for a
 * save of several ranks a collective: every rank must call this with wait); false, after a
 * failure elsewhere: only the write in flight ends (a save of several ranks then gets no index
 * and the previous checkpoint is the newest). False after printing "prog: <why>" when a write
 * failed: the run's last checkpoint is not on disk. */
bool nbm_save_finish(const char *prog, bool wait);
/* Resolve --resume: "auto" is the newest complete, intact checkpoint of --save's series
 * (corrupt ones skipped with a line each), *out = buf; or none yet: *out = NULL, after
 * printing "prog: --resume auto: no checkpoint in SAVE yet: starting from step 0" (main_rank
 * only). Any other value is the file itself. False after printing why it failed. */
bool nbm_resume_path(const char *prog, bool main_rank, const char *resume, const char *save,
                     char *buf, size_t n, const char **out);

#endif
