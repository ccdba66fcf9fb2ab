/* io_impl.h - private to io/: what the checkpoint layer shares with the safetensors writer. */
#ifndef NABLA_IO_IMPL_H
#define NABLA_IO_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "nabla/tensor.h"

/* Remove the temporary files that writers of path killed during a save left behind
 * (path.tmp-PID-N whose PID no longer runs and that nobody locks), saying so in one line on
 * stderr. Best effort: never fails. nb_safetensors_save calls it before writing,
 * checkpoint loads before reading (a run restarted after a kill cleans up at once). */
void nb__remove_stale_temps(const char *path);
/* The same for every file of directory dir (any NAME.tmp-PID-N): a checkpoint folder, whose
 * rank files have fresh names at every save. */
void nb__remove_stale_temps_in(const char *dir);

/* nb_safetensors_save, and with checksums: metadata "checksum.<name>" = "xxh3-64:<hex>" per
 * tensor, the XXH3 64-bit hash of its bytes as written (nb_safetensors_verify checks them);
 * sums (may be NULL; n entries) gets each tensor's hash, in the order of names. */
nb_status nb__safetensors_save_checked(const char *path, const char *const *names,
                                       nb_tensor *const *tensors, int n,
                                       const char *const *meta_keys,
                                       const char *const *meta_values, int nmeta,
                                       bool checksums, uint64_t *sums);

/* Series (nabla/checkpoint.h, io/checkpoint.c). nb__checkpoint_target: the path a save of
 * step writes: base itself (keep <= 0) or its step's member of base's series, whose
 * directory it creates. nb__checkpoint_rotate, after that save is complete: the series'
 * members beyond the newest keep are removed (files and checkpoint folders; folders without an
 * index, saves that never finished, whatever their age), never path nor busy (a later save's
 * folder being written; NULL for none) (best effort). */
nb_status nb__checkpoint_target(const char *base, int64_t step, int keep, char *path, size_t n,
                                const char *op);
void nb__checkpoint_rotate(const char *base, int keep, const char *path, const char *busy);
/* Remove one member of a series (a file or a folder of any kind). */
void nb__checkpoint_remove_member(const char *path);

/* Test hook (the asynchronous writer's thread sets it from NB_TEST_SLOW_WRITE_MS): the
 * safetensors writer of this thread sleeps this many milliseconds after writing the first
 * half of the tensors' data, so a test can kill the process in the middle of a write. */
extern _Thread_local int nb__slow_write_ms;

#endif
