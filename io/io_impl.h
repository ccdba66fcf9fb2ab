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
 * written, always stays), files or sharded directories. */
nb_status nb__zero_checkpoint_step(const char *dir, int64_t *step);
void nb__zero_checkpoint_remove(const char *dir);
void nb__checkpoint_rotate(const char *base, int keep, const char *path);

#endif
