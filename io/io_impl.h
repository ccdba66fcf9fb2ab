/* io_impl.h - private to io/: what the checkpoint layer shares with the safetensors writer. */
#ifndef NABLA_IO_IMPL_H
#define NABLA_IO_IMPL_H

#include <stdbool.h>

#include "nabla/tensor.h"

/* Remove the temporary files that writers of path killed during a save left behind
 * (path.tmp-PID-N whose PID no longer runs and that nobody locks), saying so in one line on
 * stderr. Best effort: never fails. nb_safetensors_save calls it before writing,
 * nb_checkpoint_load before reading (a run restarted after a kill cleans up at once). */
void nb__remove_stale_temps(const char *path);

/* nb_safetensors_save, and with checksums: metadata "checksum.<name>" = "xxh3-64:<hex>" per
 * tensor, the XXH3 64-bit hash of its bytes as written (nb_safetensors_verify checks them). */
nb_status nb__safetensors_save_checked(const char *path, const char *const *names,
                                       nb_tensor *const *tensors, int n,
                                       const char *const *meta_keys,
                                       const char *const *meta_values, int nmeta,
                                       bool checksums);

/* The checkpoint layer as ZeRO's sharded checkpoints use it (parallel/zero_ckpt.c).
 * nb__checkpoint_save_ex: nb_checkpoint_save with nx more metadata pairs; c->model may be
 * NULL (then no "model." entries). nb__checkpoint_load_ex: nb_checkpoint_load, but when o
 * is given the optimizer state comes from o (o->opt loads o's n entries instead of c->optim
 * the file's "optim." ones; then o->loaded(o->ctx), if set, runs before the schedule's state
 * is loaded: ZeRO copies its shard optimizer's group hyperparameters into the user's). */
#include "nabla/checkpoint.h"
typedef struct nb__ckpt_optim {
    nb_optim *opt;
    const char *const *names;
    nb_tensor *const *tensors;
    int n;
    void (*loaded)(void *ctx);
    void *ctx;
    bool no_model; /* the caller loads the model itself (zoo/gpt_tp.c): the file's "model."
                    * entries are neither read nor checked; c->model may be NULL */
} nb__ckpt_optim;
nb_status nb__checkpoint_save_ex(const char *path, const nb_checkpoint *c,
                                 const char *const *xkeys, const char *const *xvals, int nx);
nb_status nb__checkpoint_load_ex(const char *path, nb_checkpoint *c, const nb__ckpt_optim *o);

/* Series (nb_checkpoint_save_keep, nb_checkpoint_latest) whose members may be sharded
 * checkpoint directories. io/zero_ckpt.c: nb__zero_checkpoint_step says whether dir is a
 * complete sharded checkpoint (its index exists and names a step: *step); NB_EIO/NB_EFORMAT
 * saying why not otherwise. nb__zero_checkpoint_remove deletes one (the index first, so it
 * stops being a checkpoint before its shards go; best effort). io/checkpoint.c:
 * nb__checkpoint_rotate keeps the newest keep members of base's series (path, just
 * written, always stays), files, sharded or pipeline directories (the latter recognised in
 * io/checkpoint.c by their index's "format" = "nabla-pipe"; zoo/gpt_pipe.c writes them). */
nb_status nb__zero_checkpoint_step(const char *dir, int64_t *step);
void nb__zero_checkpoint_remove(const char *dir);
void nb__checkpoint_rotate(const char *base, int keep, const char *path);
/* The pieces of a checkpoint save, shared with the asynchronous writer (checkpoint_writer.c),
 * which snapshots the collected tensors and writes them on its thread: same entries, same
 * metadata, so the same file bytes. nb__checkpoint_collect fills p (state list, metadata
 * keys[0..m) / vals[0..m), borrowing c's strings); nb__checkpoint_parts_free releases it and
 * c's state views (c may be NULL). nb__checkpoint_write: the checksummed atomic write of one
 * file, errors named "checkpoint_save". */
#include "nabla/io.h"
typedef struct nb__ckpt_parts {
    nb_state_list list;
    const char **keys, **vals;
    char **owned;
    int nmeta, m;
} nb__ckpt_parts;
nb_status nb__checkpoint_collect(const nb_checkpoint *c, const char *const *xkeys,
                                 const char *const *xvals, int nx, nb__ckpt_parts *p);
void nb__checkpoint_parts_free(nb__ckpt_parts *p, const nb_checkpoint *c);
nb_status nb__checkpoint_write(const char *path, const char *const *names,
                               nb_tensor *const *tensors, int n, const char *const *keys,
                               const char *const *vals, int m);
/* The file a save of step writes: base itself (keep <= 0) or its step's file of base's
 * series, whose directory it creates. Then, after the write, nb__checkpoint_rotate removes the
 * series' files beyond the newest keep (never path; best effort). */
nb_status nb__checkpoint_target(const char *base, int64_t step, int keep, char *path, size_t n,
                                const char *op);
/* The asynchronous writer as ZeRO's sharded saves use it (zero_ckpt.c).
 * nb__checkpoint_writer_save_file: nb_checkpoint_writer_save of c to exactly path (no series,
 * no rotation) with nx more metadata pairs. nb__checkpoint_writer_zero: the writer's record of
 * the sharded save whose shard it writes (zero_ckpt.c's to fill and read; zeroed at first). */
typedef struct nb__zero_pending {
    bool pending; /* a shard was handed to the writer; its index is not written yet */
    char dir[4096];
    char id[20];
    int64_t step;
    int size, stage;
    bool has_program;
    char program[256];
} nb__zero_pending;
nb_status nb__checkpoint_writer_save_file(nb_checkpoint_writer *w, const char *path,
                                         const nb_checkpoint *c, const char *const *xkeys,
                                         const char *const *xvals, int nx);
nb__zero_pending *nb__checkpoint_writer_zero(nb_checkpoint_writer *w);
bool nb__checkpoint_writer_skips(const nb_checkpoint_writer *w);
/* Test hook (the asynchronous writer's thread sets it from NB_TEST_SLOW_WRITE_MS): the
 * safetensors writer of this thread sleeps this many milliseconds after writing the first
 * half of the tensors' data, so a test can kill the process in the middle of a write. */
extern _Thread_local int nb__slow_write_ms;

#endif
