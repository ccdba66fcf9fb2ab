/* nabla/stop.h - graceful stop: finish the current step, save, and exit when the job is
 * asked to stop (Ctrl-C, `kill`, Slurm's preemption or time-limit signal).
 *
 * Usage:
 *     if (nb_stop_install() != NB_OK) puts(nb_last_error());   // SIGINT, SIGTERM, SIGUSR1
 *     nb_comm *world = nb_comm_world();
 *     for (int64_t step = 0; step < 1000; step++) {
 *         double loss = 0.5;                 // ... this rank's step: forward, backward, update
 *         int sig = 0;
 *         nb_stop_sync(world, &loss, &sig);  // loss: the sum over the ranks; sig: agreed
 *         if (sig) {                         // every rank stops after this same step
 *             // ... write a checkpoint (one rank), print the final line
 *             return 128 + sig;              // the shell's convention: 143 for SIGTERM
 *         }
 *     }
 *
 * nb_stop_install() takes SIGINT, SIGTERM and SIGUSR1 (Slurm's `--signal` can send it, and
 * Open MPI's mpirun forwards it to every rank, where it turns SIGINT and SIGTERM into a kill
 * of the job) and only records the signal: the program goes on to the end of its current
 * step and asks nb_stop_requested() or nb_stop_sync() there. The signals are blocked in the
 * calling thread (and so in every thread it creates afterwards) and taken by a thread of
 * nabla's with sigwait, so no handler interrupts a compute kernel: call it FIRST, before MPI,
 * data loaders or thread pools start their threads (threads that existed before get a
 * handler that records the signal the same way). A second of those signals while the first
 * is pending ends the process at once (a second Ctrl-C is "now"), with status 128 + that
 * signal (nothing is flushed or saved). Signals sent to the process (kill, Slurm, mpirun)
 * are taken; raise() in a thread that blocks them stays pending. Calling it again is a
 * no-op; nb_stop_uninstall() stops the thread, drops what is pending, restores the signal
 * mask and the previous handlers.
 *
 * With several ranks the signal may reach one rank only (a `kill` of one process) or the
 * ranks at different moments: nb_stop_sync() is a collective that every rank calls at each
 * step boundary. It sums one double of the caller's (the step's loss, which a data-parallel
 * program reduces anyway: the stop flag rides along for free) and agrees on the signal:
 * when any rank has one, every rank gets the same non-zero answer (SIGTERM before SIGINT
 * before SIGUSR1 when ranks saw different ones). On a communicator of one rank it costs
 * nothing. Errors: the allreduce's (NB_ECOMM ...); *sig is then the local flag.
 *
 * State is process wide; the functions are thread safe (the flag is a lock-free atomic). */
#ifndef NABLA_STOP_H
#define NABLA_STOP_H

#include "nabla/parallel.h"
#include "nabla/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Take SIGINT, SIGTERM and SIGUSR1 as described above (call it before other threads start).
 * NB_EIO if sigaction or the signal thread fails. */
nb_status nb_stop_install(void);
/* Put back the handlers nb_stop_install replaced; clears a pending request. */
void nb_stop_uninstall(void);
/* The signal received since install (or set by nb_stop_request), 0 when none. */
int nb_stop_requested(void);
/* Ask for a stop as if signal sig (> 0) had arrived, e.g. from the program's own watchdog
 * or a test; 0 clears the request. */
void nb_stop_request(int sig);
/* Collective over comm (see above): *sum (may be NULL) becomes the sum of every rank's
 * value, *sig (not NULL) the agreed stop signal, 0 to go on. */
nb_status nb_stop_sync(nb_comm *comm, double *sum, int *sig);
/* "SIGTERM", "SIGINT", "SIGUSR1" (or "signal N") for a signal number. */
const char *nb_stop_signal_name(int sig);

#ifdef __cplusplus
}
#endif
#endif
