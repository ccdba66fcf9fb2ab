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

#endif
