/* comm_mpi.h - private to the MPI backend (comm_mpi.c: communicators, the worker thread and
 * the large collectives; comm_mpi_small.c: the small collectives, nabla's own schedules over
 * point-to-point messages; comm_mpi_ctl.c: the control thread and the "who did not arrive"
 * diagnosis): its per-communicator and per-work state and the process-wide MPI state.
 * Compiled only with NB_HAVE_MPI. */
#ifndef NABLA_COMM_MPI_H
#define NABLA_COMM_MPI_H

#include <mpi.h>

#include "parallel/parallel_impl.h"

/* A question to a peer's control thread (comm_mpi_ctl.c), about the asker's operation: for a
 * collective, its signature (sig.seq its number; 0 for a send or recv). */
typedef struct nb__mpi_query {
    long long qid, tag; /* query id, the tag to answer with; tag -1: a notice (no answer) */
    uint64_t uid;       /* the communicator's (a stale query for a freed one is not answered) */
    nb__sig sig;
    char msg[384];      /* a notice's: why the ranks are out of step */
} nb__mpi_query;

/* The answer: the peer's counts of collectives on the communicator, its world rank, its own
 * collective of the asked number when it still remembers it (has_sig), and what it is
 * waiting for (nb__comm_where). */
typedef struct nb__mpi_answer {
    long long qid, issued, completed, world_rank;
    int has_sig, pad_;
    nb__sig sig;
    char where[192];
} nb__mpi_answer;

/* A reply of the control thread still being sent. */
typedef struct nb__mpi_reply {
    nb__mpi_answer a;
    MPI_Request req;
    struct nb__mpi_reply *next;
} nb__mpi_reply;

typedef struct nb__mpi_comm {
    nb_comm *c;           /* NULL once the nb_comm is gone */
    MPI_Comm comm, ctl;   /* data (MPI's collectives, the caller's send/recv), control (queries) */
    MPI_Comm sm;          /* the small collectives' messages (comm_mpi_small.c) */
    uint64_t uid;         /* the same on every rank of this communicator only (comm_mpi.c) */
    bool keep_mpi;        /* out of step: its MPI communicators are never freed */
    int *world_ranks;     /* rank here -> rank in MPI_COMM_WORLD */
    int tag_ub;
    /* A small collective's tag: the low seq_bits of its number, above them hash_bits of its
     * signature's hash (comm_mpi_small.c), so different collectives never exchange data. */
    int seq_bits, hash_bits;
    int *counts, *displs; /* scratch for the v-collectives (worker thread only) */
    /* The worker: a FIFO of collectives it runs with blocking MPI calls. */
    pthread_t worker;
    bool worker_started, stop, self_destroy;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    nb_work *qhead, *qtail;
    nb_work *running;
    atomic_int inflight;  /* small collectives issued, not ended */
    /* Small collectives in flight, in issue order (linked by nb__mpi_ws.sm_next; the list
     * holds a reference to each), and the lock of the list and of their schedules. */
    pthread_mutex_t sm_mu;
    nb_work *sm_head, *sm_tail;
    /* Control thread side (under nb__mpi.mu): the posted query receive, replies in flight. */
    bool registered;
    MPI_Request q_req;
    nb__mpi_query q_buf;
    nb__mpi_reply *replies;
    struct nb__mpi_comm *next_reg;
} nb__mpi_comm;

/* A work's backend state (lives in nb_work.be). */
typedef struct nb__mpi_ws {
    MPI_Request req;     /* p2p */
    atomic_bool has_req; /* issued: a p2p request, or a small collective's schedule (by the
                          * caller, or by the worker for a queued one) */
    bool queued;         /* went through the worker's queue */
    bool abandoned;      /* given up while on the worker (under the comm's mu) */
    bool sched;          /* a small collective (comm_mpi_small.c), fields below */
    bool fin_done;       /* this round's local work is done (its receives were complete) */
    /* A large collective on the worker (comm_mpi.c): in_op once its ranks agreed and it runs
     * in MPI (it can no longer be withdrawn); withdraw: the caller asks the worker to give it
     * up before that (the ranks disagree; the message is in the work's msg). */
    bool in_op;
    atomic_bool withdraw;
    uint64_t sig_hash;   /* a small collective's signature hash for its tag (0: its own) */
    float *fa, *fb;      /* f32 staging of a half-precision reduction */
    MPI_Request *rq;     /* this round's receives and sends: rq_in, or allocated for more */
    MPI_Request rq_in[4];
    int alg, round, nrounds, nreq, nrecv, tag; /* nrecv: the first nrecv of rq receive */
    char *tmp, *acc;     /* scratch (received blocks, partial results) */
    nb_work *sm_next;    /* the in-flight list */
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
    atomic_int ctl_gen;   /* the control thread's generation (comm_mpi_ctl.c) */
    nb_work *zombies;     /* abandoned requests the control thread polls until they end */
    atomic_int stuck;     /* abandoned operations still inside MPI */
    atomic_int teardown;  /* workers destroying their own communicator (still in MPI) */
    atomic_llong qid;     /* query ids */
    pthread_mutex_t inline_mu; /* serializes MPI calls without MPI_THREAD_MULTIPLE */
    /* This process among MPI_COMM_WORLD's processes on its node (MPI_COMM_TYPE_SHARED), set
     * when the world communicator is made (nb__comm_mpi_local_rank). */
    atomic_int local_rank, local_size;
} nb__mpi_state;
extern nb__mpi_state nb__mpi;

/* Collectives up to this many bytes (the larger of input and output) are small: nabla's own
 * schedules, advanced by polling (comm_mpi_small.c); larger ones run on the worker. The
 * measured crossover of allreduce on 2 ranks: at 512 KiB the schedule takes 0.85 of the
 * worker's time, at 2 MiB they are even. Broadcast and reduce (binomial trees) stop at
 * NB__MPI_TREE_BYTES. */
#define NB__MPI_SMALL_BYTES (2 << 20)
#define NB__MPI_TREE_BYTES (256 << 10)

static inline bool nb__mpi_is_half(nb_dtype dt) { return dt == NB_F16 || dt == NB_BF16; }
static inline void nb__mpi_to_f32(nb_dtype dt, const void *src, float *dst, int64_t n) {
    if (dt == NB_F16) nb__f16_to_f32_n(src, dst, n);
    else nb__bf16_to_f32_n(src, dst, n);
}
static inline void nb__mpi_from_f32(nb_dtype dt, const float *src, void *dst, int64_t n) {
    if (dt == NB_F16) nb__f32_to_f16_n(src, dst, n);
    else nb__f32_to_bf16_n(src, dst, n);
}

#define NB__MPI_TAG_QUERY 1
#define NB__MPI_TAG_REPLY0 2 /* reply tags: NB__MPI_TAG_REPLY0 + query id % NB__MPI_REPLY_TAGS */
#define NB__MPI_REPLY_TAGS 30000

void nb__mpi_sleep(double seconds);
/* comm_mpi.c: the end of a send or recv (MPI_Test said done, or failed). */
void nb__mpi_req_ended(nb_work *w, int rc, const MPI_Status *s);
/* Fail w with NB_ECOMM and MPI's text for rc. */
void nb__mpi_fail(nb_work *w, int rc);
/* comm_mpi_small.c */
bool nb__mpi_small_ok(const nb_work *w); /* a collective small enough for a schedule */
/* Start w's schedule (posting its first messages) and put it on m's in-flight list. false:
 * it could not start (w failed, counted as completed). */
bool nb__mpi_small_issue(nb__mpi_comm *m, nb_work *w);
/* Withdraw w, a small collective whose ranks disagree (it can never complete): off the
 * in-flight list, its receives cancelled, failed with NB_ECOMM and msg. Its buffers stay with
 * MPI (and the work is kept) while one of its sends is still unmatched. */
void nb__mpi_small_cancel(nb__mpi_comm *m, nb_work *w, const char *msg);
/* Advance m's small collectives; returns those that ended, for nb__mpi_small_release once
 * no lock is held (a release may free the communicator). try_only: skip if m is busy. */
nb_work *nb__mpi_small_progress(nb__mpi_comm *m, bool try_only);
void nb__mpi_small_release(nb_work *ended);
/* Advance (all of w's communicator's small collectives) and return w's state. */
int nb__mpi_small_poll(nb_work *w);
/* comm_mpi_ctl.c */
void nb__mpi_ctl_register(nb__mpi_comm *m);
void nb__mpi_ctl_unregister(nb__mpi_comm *m);
void nb__mpi_ctl_stop(void);
/* Give an abandoned request to the control thread, which releases the work once MPI is done
 * with it. counted: the caller already took the reference and counted it in nb__mpi.stuck. */
void nb__mpi_zombie_add(nb_work *w, bool counted);
void nb__mpi_diagnose(nb_work *w, char *buf, size_t n);
/* nb__comm_backend.check: ask the peers for their collective of w's number. */
/* When it finds a difference, it tells the peers that cannot know yet (those whose collective
 * is this rank's, or that did not answer) that the ranks are out of step, so that a rank
 * whose peers already gave the collective up fails too. */
int nb__mpi_check(nb_work *w, char *buf, size_t n);

#endif
