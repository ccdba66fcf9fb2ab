/* io_impl.h - private to io/: what the checkpoint layer shares with the safetensors writer. */
#ifndef NABLA_IO_IMPL_H
#define NABLA_IO_IMPL_H

/* Remove the temporary files that writers of path killed during a save left behind
 * (path.tmp-PID-N whose PID no longer runs and that nobody locks), saying so in one line on
 * stderr. Best effort: never fails. nb_safetensors_save calls it before writing,
 * nb_checkpoint_load before reading (a run restarted after a kill cleans up at once). */
void nb__remove_stale_temps(const char *path);

#endif
