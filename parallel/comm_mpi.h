/* comm_mpi.h - private to the MPI backend (comm_mpi.c: communicators, the worker thread and
 * the collectives; comm_mpi_ctl.c: the control thread and the "who did not arrive"
 * diagnosis): its per-communicator and per-work state and the process-wide MPI state.
 * Compiled only with NB_HAVE_MPI. */
#ifndef NABLA_COMM_MPI_H
#define NABLA_COMM_MPI_H

#include <mpi.h>

#include "parallel_impl.h"

/* A reply of the control thread still being sent. */
typedef struct nb__mpi_reply {
    long long buf[4]; /* query id, collectives issued, completed, world rank */
    MPI_Request req;
    struct nb__mpi_reply *next;
} nb__mpi_reply;

typedef struct nb__mpi_comm {
    nb_comm *c;           /* NULL once the nb_comm is gone */
    MPI_Comm comm, ctl;   /* data, and control (queries) */
    int *world_ranks;     /* rank here -> rank in MPI_COMM_WORLD */
    int tag_ub;
    int *counts, *displs; /* scratch for the v-collectives (worker thread only) */
    /* The worker: a FIFO of collectives it runs with blocking MPI calls. */
    pthread_t worker;
    bool worker_started, stop, self_destroy;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    nb_work *qhead, *qtail;
    nb_work *running;
    atomic_int inflight;  /* nonblocking collectives issued by callers, not yet seen done */
    /* Control thread side (under nb__mpi.mu): the posted query receive, replies in flight. */
    bool registered;
    MPI_Request q_req;
    long long q_buf[2];   /* query id, reply tag */
    nb__mpi_reply *replies;
    struct nb__mpi_comm *next_reg;
} nb__mpi_comm;

/* A work's backend state (lives in nb_work.be). */
typedef struct nb__mpi_ws {
    MPI_Request req;     /* p2p, and small collectives (issued as MPI's nonblocking ones) */
    atomic_bool has_req; /* req was issued (by the caller, or by the worker for a queued one) */
    bool queued;         /* went through the worker's queue */
    bool abandoned;   /* given up while on the worker (under the comm's mu) */
    float *fa, *fb;   /* f32 staging of a nonblocking half-precision reduction */
} nb__mpi_ws;
_Static_assert(sizeof(nb__mpi_ws) <= sizeof(((nb_work *)0)->be), "nb__mpi_ws does not fit");
static inline nb__mpi_ws *nb__mpi_ws_of(nb_work *w) { return (nb__mpi_ws *)w->be; }
static inline nb__mpi_comm *nb__mpi_of(const nb_comm *c) { return c->impl; }

/* Process-wide: MPI itself is process-wide. */
typedef struct nb__mpi_state {
    pthread_mutex_t mu;   /* the fields below except the atomics */
    bool init_by_us, finalized, threads;
    nb_comm *world;
    nb__mpi_comm *reg;    /* communicators the control thread serves */
    pthread_t ctl;
    bool ctl_running;
    atomic_bool ctl_stop;
    nb_work *zombies;     /* abandoned requests the control thread polls until they end */
    atomic_int stuck;     /* abandoned operations still inside MPI */
    atomic_llong qid;     /* query ids */
    pthread_mutex_t inline_mu; /* serializes MPI calls without MPI_THREAD_MULTIPLE */
} nb__mpi_state;
extern nb__mpi_state nb__mpi;

#define NB__MPI_TAG_QUERY 1
#define NB__MPI_TAG_REPLY0 2 /* reply tags: NB__MPI_TAG_REPLY0 + query id % NB__MPI_REPLY_TAGS */
#define NB__MPI_REPLY_TAGS 30000

void nb__mpi_sleep(double seconds);
/* comm_mpi.c: the end of a request-based work (MPI_Test said done, or failed): staging
 * freed, counters updated. keep: the caller wants the result (post-processing runs). */
void nb__mpi_req_ended(nb_work *w, int rc, const MPI_Status *s, bool keep);
/* comm_mpi_ctl.c */
void nb__mpi_ctl_register(nb__mpi_comm *m);
void nb__mpi_ctl_unregister(nb__mpi_comm *m);
void nb__mpi_ctl_stop(void);
/* Give an abandoned request to the control thread, which releases the work once MPI is done
 * with it. counted: the caller already took the reference and counted it in nb__mpi.stuck. */
void nb__mpi_zombie_add(nb_work *w, bool counted);
void nb__mpi_diagnose(nb_work *w, char *buf, size_t n);

#endif
