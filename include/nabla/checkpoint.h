/* nabla/checkpoint.h - training checkpoints: everything needed to continue a training run
 * exactly where it stopped.
 *
 * Usage:
 *     nb_checkpoint ck = { .model = model, .optim = opt, .sched = sched, .loader = loader,
 *                          .gens = (nb_generator *[]){dropout_gen}, .ngens = 1,
 *                          .step = step };
 *     if (nb_checkpoint_save("run.ckpt", &ck) != NB_OK) puts(nb_last_error());
 *     ...
 *     // later, after building the same model/optimizer/schedule/loader/generators:
 *     if (nb_checkpoint_load("run.ckpt", &ck) != NB_OK) puts(nb_last_error());
 *     step = ck.step;                        // and the loader resumes at the next batch
 *
 * A checkpoint holds the model's parameters and buffers ("model.<name>"), the optimizer's
 * state ("optim.<name>", nb_optim_state), the schedule's ("sched.<name>"), the loss
 * scaler's ("scaler.<name>", nb_grad_scaler_state; a file without them leaves the scaler
 * as it is, so checkpoints written before loss scaling still load), the loader's
 * position, each listed generator's (seed, stream, offset), the step count and, when given,
 * the writing program's name and the run's settings (checked on load, see below). It is a
 * safetensors file (so `model.*` loads into PyTorch by stripping the prefix) written
 * atomically: a temporary file, fsync, rename - a crash during the write leaves the previous
 * checkpoint intact. Every write, the fsync, the close, the rename and the directory sync are
 * checked: a checkpoint that cannot be written is NB_EIO with the file and the reason
 * ("checkpoint_save: cannot write run.ckpt: No space left on device"), as is a path that is
 * not a regular file ("... is a character device, not a regular file; refusing to replace
 * it"), which is left as it is. Integrity: every tensor's XXH3-64 checksum is in the file's
 * metadata ("checksum.<name>") with the run's id ("run_id", below); loading verifies every
 * checksum before it changes anything, so a torn or bit-flipped file is NB_EFORMAT ("...
 * run.ckpt is corrupt: the bytes of tensor \"model.0.weight\" hash to ..., the file
 * recorded ...") and a truncated one NB_EFORMAT from the reader. Temporary files of earlier saves of the same path whose writer
 * was killed are removed by the next save and by the next load (see nb_safetensors_save). Loading restores the exact state: training
 * N steps, saving, loading
 * into fresh objects and training N more gives bit-identical weights to 2N steps straight.
 *
 * Ownership: the checkpoint struct only borrows the objects it names; every field but model
 * may be NULL/0 (then that part is neither saved nor restored). Loading reads and checks the
 * scalar entries and the model's names and shapes before it changes anything; optimizer and
 * schedule state are checked by their own loaders just before each is applied. */
#ifndef NABLA_CHECKPOINT_H
#define NABLA_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nabla/data.h"
#include "nabla/nn.h"
#include "nabla/optim.h"
#include "nabla/random.h"
#include "nabla/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_checkpoint_writer nb_checkpoint_writer;

typedef struct nb_checkpoint {
    nb_module *model;      /* required */
    nb_optim *optim;
    nb_sched *sched;
    nb_loader *loader;
    nb_generator **gens;   /* generators whose stream positions to keep (dropout, ...) */
    int ngens;
    int64_t step;          /* saved as given; set by nb_checkpoint_load */
    /* The run's identity, saved in the file's metadata and checked by nb_checkpoint_load
     * (each NULL/0: neither saved nor checked).
     * program: the program that writes and resumes the file ("mlp"); loading a file that
     *   another program wrote is NB_EINVAL "checkpoint_load: run.ckpt was written by gpt,
     *   not by mlp".
     * config_names / config_values: nconfig settings that change the results (learning
     *   rate, batch, seed, model sizes, ...) as text. Loading compares every name the file
     *   also holds: a different value is NB_EINVAL naming the setting and both values
     *   ("checkpoint_load: run.ckpt was written with lr=0.05; this run has lr=0.1"), unless
     *   the name is one of may_change[0..nmay_change) (a deliberate change, e.g. a new
     *   learning rate). Names only one side has are not compared (older files, new
     *   settings). Compare exact text: write numbers the same way on both sides. */
    const char *program;
    const char *const *config_names;
    const char *const *config_values;
    int nconfig;
    const char *const *may_change;
    int nmay_change;
    /* The run this checkpoint belongs to, 32 hex digits, saved as metadata "run_id". Empty
     * (the default): saving writes this process's id (drawn at random once), loading accepts
     * any file and copies its id here, so the saves of a resumed run keep the run's id. Set
     * (by an earlier load, or by the caller): loading a file of another run is NB_EINVAL
     * ("checkpoint_load: run.ckpt belongs to run 9f..., not to this run (3a...)"). */
    char run_id[33];
    nb_grad_scaler *scaler; /* the fp16 loss scaler (nabla/optim.h), NULL: none */
} nb_checkpoint;

nb_status nb_checkpoint_save(const char *path, const nb_checkpoint *c);
nb_status nb_checkpoint_load(const char *path, nb_checkpoint *c);
/* The run id c's next save writes (c->run_id, or this process's). */
const char *nb_checkpoint_run_id(const nb_checkpoint *c);

/* ---- series: rotation and resuming from the newest ---------------------------------------
 *     nb_checkpoint_save_keep("out/", &ck, 3, NULL, 0);     // out/checkpoint-00000100.ckpt
 *     char path[4096];
 *     int64_t step;
 *     nb_checkpoint_latest("out/", path, sizeof path, &step); // "" and -1: none yet
 * base names a series of files, one per step: a directory (one that exists, or a path ending
 * in '/', created by the first save): DIR/checkpoint-<step>.ckpt; or a file path, whose name
 * frames the step: run.ckpt -> run-<step>.ckpt (steps zero-padded to 8 digits). */
/* The file of step in base's series into out[n]. */
nb_status nb_checkpoint_path(const char *base, int64_t step, char *out, size_t n);
/* Save c at its step's file in base's series (atomically, as nb_checkpoint_save), then
 * remove the series' older files beyond the newest keep (>= 1). path_out (may be NULL) gets
 * the file written. */
nb_status nb_checkpoint_save_keep(const char *base, const nb_checkpoint *c, int keep,
                                  char *path_out, size_t n);
/* The newest complete, intact checkpoint of base's series, base itself included when it is a
 * file: the candidates from the highest step down are opened and every checksum verified;
 * one that fails (torn, truncated, bit-flipped, not a checkpoint) is skipped with a line on
 * stderr ("nabla: checkpoint_latest: skipping run-00000200.ckpt: ... is corrupt: ..."). Its
 * path in out[n] and its step in *step (may be NULL); none at all is not an error: out is
 * "" and *step -1. A member (or base) that is a sharded checkpoint directory (ZeRO,
 * nabla/parallel.h), a pipeline checkpoint directory (nabla/pipeline.h) or a sharded
 * tensor-parallel one (nabla/gpt_tp.h) counts when its index exists; rotation removes such directories too. */
nb_status nb_checkpoint_latest(const char *base, char *out, size_t n, int64_t *step);

/* For checkpoints of your own layout in a series (a directory per save with an index, as
 * the pipeline and tensor-parallel GPTs write): nb_checkpoint_target gives the path a save
 * of step writes, base itself when keep <= 0, else step's member of base's series (creating
 * base's directory when base ends in '/'); after that save is complete, nb_checkpoint_rotate
 * removes the series' members beyond the newest keep, never path (best effort: a member that
 * cannot be removed stays, and the next save tries again). */
nb_status nb_checkpoint_target(const char *base, int64_t step, int keep, char *out, size_t n);
void nb_checkpoint_rotate(const char *base, int keep, const char *path);

/* nb_checkpoint_load for programs that restore parts of the state themselves (a sharded run
 * that assembles its slices). Zero/NULL options: nb_checkpoint_load.
 * skip_model: the file's "model." entries are neither read nor checked; c->model may be NULL.
 * optim (with optim_n named tensors): loaded from those tensors (nb_optim_load_state) instead
 *   of c->optim from the file's "optim." entries. */
typedef struct nb_checkpoint_load_opts {
    bool skip_model;                 /* false */
    nb_optim *optim;                 /* NULL */
    const char *const *optim_names;  /* optim's state as named tensors (borrowed) */
    nb_tensor *const *optim_tensors;
    int optim_n;
} nb_checkpoint_load_opts;
nb_checkpoint_load_opts nb_checkpoint_load_defaults(void);
nb_status nb_checkpoint_load_ex(const char *path, nb_checkpoint *c,
                                const nb_checkpoint_load_opts *o);

/* ---- asynchronous ("flash") saves ----------------------------------------------------------
 *     nb_checkpoint_writer *w = nb_checkpoint_writer_new(&(nb_checkpoint_writer_opts){.keep = 3});
 *     for (...) {                                        // training
 *         ck.step = step;
 *         if (nb_checkpoint_writer_save(w, "out/", &ck) != NB_OK) puts(nb_last_error());
 *     }                                                  // returns once the state is copied
 *     if (nb_checkpoint_writer_free(w) != NB_OK) puts(nb_last_error()); // waits for the write
 * A writer copies the checkpoint's state (model, optimizer, schedule, loader, generators,
 * step, run identity) into host snapshot buffers it keeps, and a background thread writes the
 * file from them while training goes on: the same file, byte for byte, as nb_checkpoint_save
 * (keep 0: base itself) or nb_checkpoint_save_keep (keep >= 1: base's series, rotated after
 * the new file is durable), written as atomically. The buffers are reused while the state
 * keeps its names, shapes and dtypes, so saves after the first allocate no tensor memory
 * (nb_alloc_stats). At most one write is in flight: a save that finds one waits for it
 * (NB_CKPT_WAIT) or is skipped (NB_CKPT_SKIP, counted in the stats). A write that failed is
 * reported by the next call on the writer (_save, _wait or _free; a _save that waited for it
 * included) with the write's own message ("checkpoint_save: cannot write run.ckpt: No space
 * left on device"); a _save that reports one saves nothing (the caller decides; the next
 * _save saves again). Tensors of other devices (CUDA) are copied through the host caching
 * allocator; pinned snapshot buffers are not there yet. A process killed during
 * a write leaves the previous checkpoint intact (nb_checkpoint_latest finds it).
 * Ownership: the writer owns its thread and buffers; _save borrows c and base only for the
 * call. One thread at a time calls a writer. Test hook: NB_TEST_SLOW_WRITE_MS=N (read when the
 * writer is made) makes each of its writes sleep N ms after half the data. */
typedef enum nb_checkpoint_policy {
    NB_CKPT_WAIT = 0, /* a save during a write waits for it, then snapshots */
    NB_CKPT_SKIP = 1, /* a save during a write does nothing (stats.skipped counts it) */
} nb_checkpoint_policy;

typedef struct nb_checkpoint_writer_opts {
    int keep;                    /* 0: write base itself; >= 1: base's series, newest keep kept */
    nb_checkpoint_policy policy;
} nb_checkpoint_writer_opts;

typedef struct nb_checkpoint_writer_stats {
    int64_t saves;           /* snapshots taken */
    int64_t written;         /* files written successfully */
    int64_t skipped;         /* saves skipped (NB_CKPT_SKIP) */
    int64_t failed;          /* writes that failed */
    int64_t stall_ns_last;   /* the caller's time in the last _save (waiting + copying) */
    int64_t stall_ns_total;
    int64_t write_ns_last;   /* the background thread's time for the last write */
    int64_t write_ns_total;
} nb_checkpoint_writer_stats;

/* NULL opts: keep 0, NB_CKPT_WAIT. NULL (and the error) when opts are invalid or the thread
 * cannot start. */
nb_checkpoint_writer *nb_checkpoint_writer_new(const nb_checkpoint_writer_opts *opts);
/* Snapshot c and start writing it (see above); base as in nb_checkpoint_save(_keep). */
nb_status nb_checkpoint_writer_save(nb_checkpoint_writer *w, const char *base,
                                    const nb_checkpoint *c);
/* Wait until no write is in flight; the error of a failed write not yet reported. */
nb_status nb_checkpoint_writer_wait(nb_checkpoint_writer *w);
/* The writer's counters so far (all zero for a NULL writer). */
void nb_checkpoint_writer_get_stats(nb_checkpoint_writer *w, nb_checkpoint_writer_stats *out);
/* Wait for the write in flight, stop the thread, free everything (NULL: nothing); the error
 * of a failed write not yet reported. */
nb_status nb_checkpoint_writer_free(nb_checkpoint_writer *w);

/* ---- asynchronous sharded saves of ZeRO runs (nabla/parallel.h) ---------------------------
 *     nb_checkpoint_writer *w = nb_checkpoint_writer_new(NULL);     // one per rank
 *     ...  nb_zero_checkpoint_save_async(z, w, "run.ckpt", &ck);    // collective, every rank
 *     nb_zero_checkpoint_wait(z, w);                               // collective, at the end
 *     nb_checkpoint_writer_free(w);
 * The directory nb_zero_checkpoint_save writes, but each rank's shard is written by its
 * writer's thread while training goes on. The index, which makes the checkpoint exist, is
 * written by rank 0 only once every rank's shard is durable: the ranks agree on that at the
 * next save_async or at _wait (collectives over z's communicator). Until then the previous
 * checkpoint (its index and shards) stays whole, so a kill at any moment leaves either the
 * new checkpoint complete or the previous one, which nb_zero_checkpoint_load reads. A shard
 * that failed on any rank: no index for that save, the error on every rank at that call.
 * Call nb_zero_checkpoint_wait before freeing the writer (without it the last save has no
 * index and is ignored). w must use NB_CKPT_WAIT (NB_EINVAL otherwise) and serve one
 * nb_zero at a time. */
typedef struct nb_zero nb_zero;
nb_status nb_zero_checkpoint_save_async(nb_zero *z, nb_checkpoint_writer *w, const char *dir,
                                        const nb_checkpoint *c);
nb_status nb_zero_checkpoint_wait(nb_zero *z, nb_checkpoint_writer *w);

#ifdef __cplusplus
}
#endif
#endif
