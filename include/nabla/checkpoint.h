/* nabla/checkpoint.h - training checkpoints: everything needed to continue a training run
 * exactly where it stopped, under any parallel layout, and resumed under any other.
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
 * What it holds: the model's parameters and buffers ("model.<name>"), the optimizer's state
 * ("optim.<name>", nb_optim_state: moments, step counts, f32 master weights, the groups'
 * hyperparameters), the schedule's ("sched.<name>"), the loss scaler's ("scaler.<name>"; a
 * checkpoint without them leaves the scaler as it is), the loader's position, each listed
 * generator's (seed, stream, offset), the step and, when given, the writing program's name
 * and the run's settings (checked on load, below).
 *
 * One process (or state that is whole on rank 0, as under DDP): one safetensors file, so
 * `model.*` loads into PyTorch by stripping the prefix. A parallel model (parameters with
 * placements, nabla/mesh.h: tensor parallel, pipeline stages, ZeRO shards): a folder, saved
 * by every rank of the placements' mesh together (collective, every rank gets the same
 * status): each rank that holds data no other rank writes writes one file of its pieces
 * ("shard-<save id>-<rank>-of-<world>.safetensors"; replicated data is written once, by
 * coordinate 0 of every mesh dimension it is replicated along, a piece several ranks hold by
 * its first copy, so a dp x tp x pp run writes each byte once) and rank 0 writes "index.json" last, once every file is durable: the
 * checkpoint exists only when its index does, and a save into an existing folder leaves the
 * previous checkpoint whole until its index is replaced (docs/checkpoints.md has the format).
 * Loading reads either kind into any layout: each rank reads only the stored pieces that
 * overlap the parts its own placements say it holds (resharding: ZeRO stages and world sizes,
 * tensor-parallel slices, pipeline stages, one process). A run in f16/bf16 with f32 master
 * weights loaded into an f32 model takes the masters; an f32 checkpoint loaded into a half
 * model with an optimizer gives it f32 masters from the f32 values.
 *
 * Integrity: every tensor's (every piece's) XXH3-64 checksum is recorded, and every piece is
 * verified when read; a run id and the layout are in every file and in the index. A damaged,
 * truncated or missing piece, a file of another run or save, a rank's file in another rank's
 * place, an index that does not match its files, pieces that overlap or leave a gap, and
 * dtypes or shapes that disagree are refused naming the file and the tensor (NB_EFORMAT,
 * NB_EINVAL, NB_EIO, NB_ESHAPE). All or nothing: a load checks and stages everything before
 * it changes anything, the ranks agree, and a failure on any rank leaves the model, the
 * optimizer and everything else exactly as they were. Writes are atomic (temporary file,
 * fsync, rename, directory sync), checked ("checkpoint_save: cannot write run.ckpt: No space
 * left on device"); a path that is not a regular file (a folder: a directory) is refused and
 * left alone. Temporary files of writers killed during a save are removed by the next save and
 * the next load. Training N steps, saving, loading into fresh objects and training N more
 * gives bit-identical weights to 2N steps straight (the same layout).
 *
 * Ownership: the checkpoint struct only borrows the objects it names; every field but model
 * may be NULL/0 (then that part is neither saved nor restored). Test hook: NB_TEST_NO_VERIFY=1
 * (read at each load) skips the checksum comparison, so tests can show the check matters. */
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
typedef struct nb_comm nb_comm; /* nabla/parallel.h */

typedef struct nb_checkpoint {
    nb_module *model;      /* required */
    nb_optim *optim;       /* under nb_zero: the optimizer given to nb_zero_new */
    nb_sched *sched;
    nb_loader *loader;
    nb_generator **gens;   /* generators whose stream positions to keep (dropout, ...) */
    int ngens;
    int64_t step;          /* saved as given; set by nb_checkpoint_load */
    /* The run's identity, saved with the checkpoint and checked by nb_checkpoint_load
     * (each NULL/0: neither saved nor checked).
     * program: the program that writes and resumes it ("mlp"); loading one that another
     *   program wrote is NB_EINVAL "checkpoint_load: run.ckpt was written by gpt, not by mlp".
     * config_names / config_values: nconfig settings that change the results (learning
     *   rate, batch, seed, model sizes, ...) as text. Loading compares every name the
     *   checkpoint also holds: a different value is NB_EINVAL naming the setting and both
     *   values ("checkpoint_load: run.ckpt was written with lr=0.05; this run has lr=0.1"),
     *   unless the name is one of may_change[0..nmay_change) (a deliberate change, e.g. a new
     *   learning rate). Names only one side has are not compared. Compare exact text. */
    const char *program;
    const char *const *config_names;
    const char *const *config_values;
    int nconfig;
    const char *const *may_change;
    int nmay_change;
    /* The run this checkpoint belongs to, 32 hex digits. Empty (the default): saving writes
     * this process's id (rank 0's, drawn at random once), loading accepts any checkpoint and
     * copies its id here, so the saves of a resumed run keep the run's id. Set: loading a
     * checkpoint of another run is NB_EINVAL ("checkpoint_load: run.ckpt belongs to run
     * 9f..., not to this run (3a...)"). */
    char run_id[33];
    nb_grad_scaler *scaler; /* the fp16 loss scaler (nabla/optim.h), NULL: none */
    /* The ranks that save and load this checkpoint together. NULL: those of the model's
     * placements (the mesh's world; a ZeRO run's communicator), or this process alone. A
     * data-parallel run without placements (nb_ddp) sets its world here and calls save and
     * load on every rank: rank 0 writes the one file, every rank gets the same status. */
    nb_comm *comm;
    /* 0: path is the checkpoint (replaced by each save). >= 1: path names a series, one
     * member per step (below), of which the newest keep stay after each save. */
    int keep;
} nb_checkpoint;

/* Save c at path (keep 0) or at c->step's member of path's series (keep >= 1, then rotated).
 * Collective over c's ranks (above). */
nb_status nb_checkpoint_save(const char *path, const nb_checkpoint *c);
/* Load a checkpoint file or folder into c's objects, whatever layout wrote it (see above).
 * Collective over c's ranks. */
nb_status nb_checkpoint_load(const char *path, nb_checkpoint *c);
/* The run id c's next save writes (c->run_id, or this process's). */
const char *nb_checkpoint_run_id(const nb_checkpoint *c);
/* Write any checkpoint (a folder of any layout, or a file) as one plain file: the whole
 * nb_checkpoint (every tensor whole; nb_checkpoint_load reads it into any layout) or, with
 * model_only, the model's parameters and buffers under their own names as nb_module_save
 * writes them (for nb_gpt: nanoGPT's names, which nb_gpt_load and PyTorch read). Every piece
 * read is verified. Written atomically; local (no communication, no model needed). The
 * bundled program zero-consolidate calls it. out may be "<folder>/model.safetensors" inside
 * the folder itself: that file then belongs to the folder (rotation and replacement remove
 * it with the folder's own files). */
nb_status nb_checkpoint_consolidate(const char *path, const char *out, bool model_only);

/* ---- series: rotation and resuming from the newest ---------------------------------------
 *     ck.keep = 3;
 *     nb_checkpoint_save("out/", &ck);                           // out/checkpoint-00000100.ckpt
 *     char path[4096];
 *     int64_t step;
 *     nb_checkpoint_latest("out/", path, sizeof path, &step);    // "" and -1: none yet
 * base names a series of checkpoints, one per step: a directory (one that exists and is not a
 * checkpoint folder itself, or a path ending in '/', created by the first save):
 * DIR/checkpoint-<step>.ckpt; or a path whose name frames the step: run.ckpt -> run-<step>.ckpt
 * (steps zero-padded to 8 digits). A member is a file or a folder, as the save needs. */
/* The member of step in base's series into out[n]. */
nb_status nb_checkpoint_path(const char *base, int64_t step, char *out, size_t n);
/* The newest complete, intact checkpoint of base's series, base itself included when it is a
 * checkpoint: the candidates from the highest step down are opened and every checksum of
 * every piece verified; one that fails (no index, torn, truncated, bit-flipped, a file of
 * another save) is skipped with a line on stderr ("nabla: checkpoint_latest: skipping
 * run-00000200.ckpt: ... is corrupt: ..."). Its path in out[n] and its step in *step (may be
 * NULL); none at all is not an error: out is "" and *step -1. Local (each rank may call it;
 * they see the same files). */
nb_status nb_checkpoint_latest(const char *base, char *out, size_t n, int64_t *step);

/* ---- asynchronous ("flash") saves ----------------------------------------------------------
 *     nb_checkpoint_writer *w = nb_checkpoint_writer_new(NULL);  // one per process
 *     for (...) {                                        // training
 *         ck.step = step;
 *         if (nb_checkpoint_writer_save(w, "out/", &ck) != NB_OK) puts(nb_last_error());
 *     }                                                  // returns once the state is copied
 *     if (nb_checkpoint_writer_wait(w) != NB_OK) puts(nb_last_error()); // the last save done
 *     nb_checkpoint_writer_free(w);
 * A writer copies this rank's part of the checkpoint (what nb_checkpoint_save would write)
 * into host snapshot buffers it keeps, and a background thread writes the file from them while
 * training goes on: the same file, byte for byte, as nb_checkpoint_save, written as
 * atomically (c->keep as there: a series rotated after the new member is complete). For a
 * checkpoint of several ranks, the rest (the ranks agree that every file is durable; rank 0
 * writes the index; rotation) happens at the next _save or at _wait: until then the previous
 * checkpoint stays whole, so a kill at any moment leaves either the new checkpoint complete or
 * the previous one. _save and _wait are then collective (every rank calls them the same
 * number of times). The buffers are reused while the state keeps its names, shapes and dtypes,
 * so saves after the first allocate no tensor memory (nb_alloc_stats). At most one write is in
 * flight: a save that finds one waits for it (NB_CKPT_WAIT) or is skipped (NB_CKPT_SKIP,
 * counted in the stats; one process only: a save of several ranks with NB_CKPT_SKIP is
 * NB_EINVAL). A write that failed is reported by the next call on the writer (_save, _wait or
 * _free) with the write's own message ("checkpoint_save: cannot write run.ckpt: No space left
 * on device"), on every rank of a save of several ranks; a _save that reports one saves
 * nothing. Tensors of other devices (CUDA) are copied through the host caching allocator.
 * Ownership: the writer owns its thread and buffers; _save borrows c and base only for the
 * call. One thread at a time calls a writer. _free waits for the write in flight but never
 * communicates: call _wait first on every rank, or the last save of several ranks gets no
 * index (and the previous checkpoint is the newest). Test hook: NB_TEST_SLOW_WRITE_MS=N (read
 * when the writer is made) makes each of its writes sleep N ms after half the data. */
typedef enum nb_checkpoint_policy {
    NB_CKPT_WAIT = 0, /* a save during a write waits for it, then snapshots */
    NB_CKPT_SKIP = 1, /* a save during a write does nothing (stats.skipped counts it) */
} nb_checkpoint_policy;

typedef struct nb_checkpoint_writer_opts {
    uint32_t _init; /* private: set by nb_checkpoint_writer_defaults() only */
    nb_checkpoint_policy policy;
} nb_checkpoint_writer_opts;
/* policy NB_CKPT_WAIT; NULL options mean these. */
nb_checkpoint_writer_opts nb_checkpoint_writer_defaults(void);

typedef struct nb_checkpoint_writer_stats {
    int64_t saves;           /* snapshots taken */
    int64_t written;         /* files this rank wrote successfully */
    int64_t skipped;         /* saves skipped (NB_CKPT_SKIP) */
    int64_t failed;          /* writes that failed */
    int64_t stall_ns_last;   /* the caller's time in the last _save (waiting + copying) */
    int64_t stall_ns_total;
    int64_t write_ns_last;   /* the background thread's time for the last write */
    int64_t write_ns_total;
} nb_checkpoint_writer_stats;

/* NULL opts: NB_CKPT_WAIT. NULL (and the error) when opts are invalid or the thread cannot
 * start. */
nb_checkpoint_writer *nb_checkpoint_writer_new(const nb_checkpoint_writer_opts *opts);
/* Snapshot c and start writing it (see above); path as in nb_checkpoint_save. */
nb_status nb_checkpoint_writer_save(nb_checkpoint_writer *w, const char *path,
                                    const nb_checkpoint *c);
/* Wait until the last save is complete (collective for a save of several ranks: its index
 * written); the error of a failed write not yet reported. */
nb_status nb_checkpoint_writer_wait(nb_checkpoint_writer *w);
/* The writer's counters so far (all zero for a NULL writer). */
void nb_checkpoint_writer_get_stats(nb_checkpoint_writer *w, nb_checkpoint_writer_stats *out);
/* Wait for the write in flight, stop the thread, free everything (NULL: nothing); the error
 * of a failed write not yet reported. Local (see above). */
nb_status nb_checkpoint_writer_free(nb_checkpoint_writer *w);

#ifdef __cplusplus
}
#endif
#endif
