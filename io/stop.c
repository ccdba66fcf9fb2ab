/* stop.c - graceful stop (nabla/stop.h): signal handlers that record the request, and the
 * per-step agreement of the ranks on it. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "nabla/memory.h"
#include "nabla/stop.h"
#include "nabla/tensor.h"
#include "tensor/error.h"

static const int stop_signals[] = {SIGINT, SIGTERM, SIGUSR1};
enum { NSTOP = sizeof stop_signals / sizeof stop_signals[0] };
#define MAX_SIG 32 /* the standard signals 1..31 travel in nb_stop_sync's vector */

static atomic_int pending;      /* the signal received, 0: none */
static atomic_int installed;
static struct sigaction previous[NSTOP];
static sigset_t stop_set, saved_mask;
static pthread_t waiter;

/* A signal while one is pending: now, without cleanup (async-signal-safe calls only). */
static void second_signal(int sig) {
    static const char msg[] = "\nnabla: second stop signal: exiting now\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
    _exit(128 + sig);
}

static void record(int sig) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&pending, &expected, sig)) second_signal(sig);
}

/* The stop signals are blocked in the installing thread and in the threads it creates
 * afterwards; this thread takes them with sigwait, so no handler ever interrupts a compute
 * kernel. (An asynchronous handler running inside oneDNN's JIT GEMM, on this VM, was
 * followed by heap corruption in oneDNN's own free - "corrupted size vs. prev_size" - in
 * about half of the runs that tools/check-stop makes; with the signal taken here, none.) */
static void *wait_signals(void *arg) {
    (void)arg;
    for (;;) {
        int sig = 0;
        if (sigwait(&stop_set, &sig) == 0) record(sig);
    }
    return NULL;
}

/* Threads that existed before nb_stop_install and do not block the signals may still
 * receive them: there the handler records them the same way. */
static void on_signal(int sig) { record(sig); }

nb_status nb_stop_install(void) {
    if (atomic_load(&installed)) return NB_OK;
    sigemptyset(&stop_set);
    for (int i = 0; i < NSTOP; i++) sigaddset(&stop_set, stop_signals[i]);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sa.sa_mask = stop_set;
    for (int i = 0; i < NSTOP; i++)
        if (sigaction(stop_signals[i], &sa, &previous[i]) != 0) {
            for (int k = 0; k < i; k++) sigaction(stop_signals[k], &previous[k], NULL);
            return nb__error(NB_EIO, "stop_install: cannot handle %s: %s",
                             nb_stop_signal_name(stop_signals[i]), strerror(errno));
        }
    int e = pthread_sigmask(SIG_BLOCK, &stop_set, &saved_mask);
    if (e == 0) e = pthread_create(&waiter, NULL, wait_signals, NULL);
    if (e != 0) {
        pthread_sigmask(SIG_SETMASK, &saved_mask, NULL);
        for (int k = 0; k < NSTOP; k++) sigaction(stop_signals[k], &previous[k], NULL);
        return nb__error(NB_EIO, "stop_install: cannot start the signal thread: %s",
                         strerror(e));
    }
    atomic_store(&installed, 1);
    return NB_OK;
}

void nb_stop_uninstall(void) {
    if (!atomic_exchange(&installed, 0)) return;
    pthread_cancel(waiter); /* sigwait is a cancellation point */
    pthread_join(waiter, NULL);
    /* signals that arrived meanwhile stay pending until unblocked: drop them first */
    for (int i = 0; i < NSTOP; i++) {
        struct sigaction ign = {.sa_handler = SIG_IGN};
        sigaction(stop_signals[i], &ign, NULL);
    }
    pthread_sigmask(SIG_SETMASK, &saved_mask, NULL);
    for (int i = 0; i < NSTOP; i++) sigaction(stop_signals[i], &previous[i], NULL);
    atomic_store(&pending, 0);
}

int nb_stop_requested(void) { return atomic_load(&pending); }

void nb_stop_request(int sig) { atomic_store(&pending, sig > 0 && sig < MAX_SIG ? sig : 0); }

const char *nb_stop_signal_name(int sig) {
    switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGHUP: return "SIGHUP";
    default: {
        static _Thread_local char buf[32];
        snprintf(buf, sizeof buf, "signal %d", sig);
        return buf;
    }
    }
}

/* Which of the signals seen by some rank all ranks stop with: SIGTERM (the scheduler's) first,
 * then SIGINT, SIGUSR1, then the lowest other number. seen[s] > 0: some rank has s. */
static int agreed(const double *seen) {
    static const int order[] = {SIGTERM, SIGINT, SIGUSR1};
    for (int i = 0; i < 3; i++)
        if (seen[order[i]] > 0) return order[i];
    for (int s = 1; s < MAX_SIG; s++)
        if (seen[s] > 0) return s;
    return 0;
}

nb_status nb_stop_sync(nb_comm *comm, double *sum, int *sig) {
    if (!sig) return nb__error(NB_ENULL, "stop_sync: sig is NULL");
    int local = atomic_load(&pending);
    *sig = local;
    if (!comm) return nb__error(NB_ENULL, "stop_sync: comm is NULL");
    if (nb_comm_size(comm) == 1) return NB_OK;
    /* v[0]: the caller's value; v[s]: 1 on the ranks that have signal s */
    double v[MAX_SIG] = {sum ? *sum : 0};
    if (local > 0 && local < MAX_SIG) v[local] = 1;
    nb_scope_begin();
    nb_tensor *t = nb_from_buffer(v, (int64_t[]){MAX_SIG}, 1, NB_F64);
    nb_status st = t ? nb_allreduce(comm, t, NB_REDUCE_SUM) : nb_last_status();
    if (st == NB_OK) st = nb_read(t, v, MAX_SIG, NB_F64);
    nb_scope_end();
    if (st != NB_OK) return st;
    if (sum) *sum = v[0];
    *sig = agreed(v);
    return NB_OK;
}
