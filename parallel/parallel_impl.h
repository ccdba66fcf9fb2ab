/* parallel_impl.h - private: the nb_comm and nb_work structs and the backend table that
 * every communicator dispatches through ("self", "mpi", and "nccl" for CUDA tensors), so
 * callers of the collectives never depend on which backend runs. Not installed.
 *
 * Division of labour. comm.c (the common layer) checks arguments, stages tensors that are
 * not contiguous (or that alias) into contiguous buffers, numbers the collectives, and owns
 * waiting: deadlines, the NB_ETIMEOUT message, and copying staged results back on the
 * caller's thread. A backend only moves contiguous buffers: it starts an operation
 * described by nb__args, reports progress through test/wait, and on a timeout explains who
 * did not arrive. Blocking forms are "start, then wait with the communicator's deadline",
 * so every blocking call has a timeout. */
#ifndef NABLA_PARALLEL_IMPL_H
#define NABLA_PARALLEL_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "nabla/parallel.h"
#include "nb_config.h"
#include "tensor/handle.h"
#include "tensor/tensor_impl.h"

/* The operations a backend implements (the index of its start table). */
typedef enum nb__coll {
    NB__COLL_ALLREDUCE = 0,
    NB__COLL_BROADCAST,
    NB__COLL_REDUCE,
    NB__COLL_ALLGATHER,
    NB__COLL_REDUCE_SCATTER,
    NB__COLL_ALL_TO_ALL,
    NB__COLL_BARRIER,
    NB__COLL_SEND,
    NB__COLL_RECV,
    NB__COLL_SPLIT, /* internal: nb_comm_split on a backend that queues its collectives */
    NB__COLL_COUNT
} nb__coll;

/* "allreduce", "broadcast", ... (the names used in error messages). */
const char *nb__coll_name(nb__coll k);
/* Point to point operations are not numbered with the collectives. */
static inline bool nb__coll_is_p2p(nb__coll k) { return k == NB__COLL_SEND || k == NB__COLL_RECV; }

/* One operation on contiguous host buffers. In-place operations (allreduce, broadcast,
 * reduce, send, recv) use buf/count. allgather, reduce_scatter and all_to_all read `in`
 * (in_count elements) and write `out` (out_count elements); `chunked` marks the uneven
 * forms (nb_comm_chunk's rule over out_count for allgather, over in_count for
 * reduce_scatter). NB__COLL_SPLIT: peer = color, tag = key, and the backend stores the new
 * nb_comm in out. Every pointer stays valid until the operation ends. */
typedef struct nb__args {
    nb__coll kind;
    nb_dtype dtype;
    nb_reduce_op op;
    int peer;          /* broadcast/reduce root, send destination, recv source */
    int tag;           /* send/recv */
    void *buf;
    int64_t count;
    const void *in;
    int64_t in_count;
    void *out;
    int64_t out_count;
    bool chunked;
} nb__args;

enum { NB__WORK_PENDING = 0, NB__WORK_DONE = 1, NB__WORK_FAILED = 2 };

#define NB__COMM_MSG 512

/* A collective as every rank must call it (comm_check.c): what, how many elements (the count
 * the ranks share: an allgather's output, a reduce_scatter's and an all_to_all's input),
 * which dtype, reduce op (-1: not a reduction) and root (-1: none); and its number on its
 * communicator. Two ranks' collectives #seq agree when all but seq are equal. */
typedef struct nb__sig {
    int64_t seq, count;
    int32_t kind, dtype, op, root;
} nb__sig;
#define NB__SIG_RING 64 /* signatures a communicator remembers */

struct nb_work {
    nb__obj h;         /* a checked handle (tensor/handle.h): released once refs reach 0 */
    nb_comm *comm;
    nb__args a;
    /* NB__WORK_*: written once by whoever completes the operation (a backend thread or
     * the caller), read by the caller. status/msg are valid once it is FAILED. */
    atomic_int state;
    nb_status status;
    char msg[NB__COMM_MSG];
    /* References: the caller's handle and the backend's while the operation is in flight.
     * The last one returns the work to its communicator's free list. */
    atomic_int refs;
    int64_t seq;       /* collective number on the communicator (1-based), 0 for p2p */
    double t_start;    /* nb__now() at start */
    double next_check; /* nb__now() when nb_work_test next asks the peers (comm_check.c) */
    bool internal;     /* the library's own (NB_COMM_DEBUG's agreement): no checks of its own */
    bool abandoned;    /* timed out: the caller gave it up, the backend still holds it */
    bool finished;     /* the caller's side is done: results copied back, holds released */
    nb_status test_failed; /* nb_work_test reported this (NB_ETIMEOUT, or NB_ECOMM: the
                            * ranks disagree) and the work is still pending */
    /* Tensors kept alive while in flight (retained references), and staging: on success the
     * caller's thread copies `stage` back into `user_out` (a non-contiguous output). */
    nb_tensor *hold[3];
    nb_tensor *user_out, *stage;
    /* Backend state (requests, half-precision staging buffers); zeroed at start. */
    _Alignas(16) unsigned char be[160];
    nb_work *next;     /* free list / backend queue link */
};

typedef struct nb__comm_backend nb__comm_backend;

struct nb_comm {
    nb__obj h;               /* a checked handle (tensor/handle.h): released with its last
                              * reference */
    const nb__comm_backend *be;
    int rank, size;
    /* Handles: nb_comm_world() hands out references to one object; each in-flight work
     * holds one too, so a communicator outlives operations that were abandoned. */
    atomic_int refs;
    _Atomic double timeout;  /* seconds, 0: wait forever */
    atomic_bool stalled;     /* a collective timed out or failed, and none has completed
                              * since (nb__comm_stalled; after a timeout, none issued
                              * after the one that timed out) */
    /* While stalled by a timeout (0 otherwise): the number of the collective that timed out,
     * when (nb__now()) and what its peers answered (under mu). A collective started
     * before then is waited for only until a timeout after its start (nb__work_wait_keep). */
    atomic_llong stall_seq;
    double stall_at;
    char stall_why[NB__COMM_MSG];
    /* The same for a send or recv that timed out (p2p_stalled; under mu: when, its peer and
     * the diagnosis), until a send or recv started after it completes: a send or recv to
     * that peer started before then shares its diagnosis, and every operation started
     * before then waits only until a timeout after its start. */
    atomic_bool p2p_stalled;
    double p2p_stall_at;
    int p2p_stall_peer;
    char p2p_stall_why[NB__COMM_MSG];
    atomic_llong issued;     /* collectives started on this communicator */
    atomic_llong completed;  /* collectives finished (by the backend) */
    pthread_mutex_t mu;      /* the free list of works (first in, first out: a released
                              * handle stays marked released for a while) */
    nb_work *free_works, *free_tail;
    int free_count;
    bool is_world;
    void *impl;              /* the backend's private state */
    /* The NCCL communicator over the same ranks that moves this one's CUDA tensors, made on
     * the first collective of a CUDA tensor (comm_nccl.c); NULL until then. */
    struct nb__comm_dev *dev;
    /* Agreement (comm_check.c), under sig_mu: the signatures of the last NB__SIG_RING
     * collectives (by number), and why the ranks are out of step ("" while they are not). */
    pthread_mutex_t sig_mu;
    nb__sig sigs[NB__SIG_RING];
    char out_of_step[NB__COMM_MSG];
};

struct nb__comm_backend {
    const char *name;
    /* The buffers in nb__args are device memory of the communicator's GPU (nccl), not
     * host memory: comm.c then stages non-contiguous tensors on that device. */
    bool device_buffers;
    /* Start one operation on w->a (one entry per collective, indexed by nb__coll). Returns
     * NB_OK once started (the backend may complete it at once by setting w->state), or a
     * negative status with the error set on this thread (nothing is in flight then). A
     * backend that keeps the work in flight past start takes a reference (w->refs) and
     * drops it with nb__work_release when the operation ends. */
    nb_status (*start[NB__COLL_COUNT])(nb_comm *c, nb_work *w);
    /* Progress and check: 1 done, 0 pending, 2 failed (status/msg filled; a backend never
     * fails a work with NB_ETIMEOUT, which is the common layer's). */
    int (*test)(nb_work *w);
    /* Block until w ends or until the absolute nb__now() deadline (<= 0: no deadline).
     * Returns 1 done, 0 deadline passed, 2 failed. */
    int (*wait)(nb_work *w, double deadline);
    /* After a missed deadline: describe in buf which ranks did not arrive (may take a
     * short grace period to ask the peers). */
    void (*diagnose)(nb_work *w, char *buf, size_t n);
    /* A collective that is taking a while: ask the peers for their collective of the same
     * number; 1 with the message in buf when one's signature differs (the ranks disagree),
     * else 0. NULL: no such check. */
    int (*check)(nb_work *w, char *buf, size_t n);
    /* End a pending w that can never complete (the ranks disagree) with NB_ECOMM and msg,
     * withdrawing what it posted; false when it cannot be withdrawn (then it is abandoned).
     * NULL: never. */
    bool (*cancel)(nb_work *w, const char *msg);
    /* The caller gives w up after a timeout: cancel what can be cancelled. The backend
     * keeps its reference until the operation has really ended (or forever). */
    void (*abandon)(nb_work *w);
    /* Collective over c: the new communicator (backend-specific) or NULL + error. */
    nb_comm *(*split)(nb_comm *c, int color, int key);
    /* Release backend state; called once, when the last reference goes. */
    void (*destroy)(nb_comm *c);
};

extern const nb__comm_backend nb__comm_self_backend;
#if NB_HAVE_MPI
/* The MPI backend: in libnabla.a, and in libnabla-mpi.so behind comm_mpi_load.c's
 * forwarding functions of the same names in libnabla.so (parallel/mpi_plugin.h). */
extern const nb__comm_backend nb__comm_mpi_backend;
/* MPI_COMM_WORLD as an nb_comm (initializing MPI if needed), or NULL + error. */
nb_comm *nb__comm_mpi_world(void);
/* Whether MPI was initialized (or finalized) in this process, by nabla or the program.
 * Through the plugin (parallel/mpi_plugin.h) this loads no MPI: before the plugin is
 * loaded it asks only an MPI the program itself linked. comm_registry.c decides from it and
 * the launcher's environment whether nb_comm_world uses MPI. */
bool nb__comm_mpi_initialized(void);
/* This process's rank among the processes of MPI_COMM_WORLD on its node
 * (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), computed when the world communicator was made)
 * and their number; 0 and 1 before that. */
int nb__comm_mpi_local_rank(int *local_size);
#endif

/* ---- CUDA tensors: the NCCL backend (comm_nccl.c) ------------------------------------------- */
extern const nb__comm_backend nb__comm_nccl_backend;
/* The communicator that moves t (and u, the other tensor of a two-tensor collective, or NULL)
 * for the collective `kind` started on c (comm_registry.c): c itself, or for CUDA tensors on a
 * communicator of more than one rank, c's NCCL communicator (made on first use, collectively
 * over c). NULL + error when NCCL should serve but cannot. */
nb_comm *nb__comm_route(nb_comm *c, nb__coll kind, const nb_tensor *t, const nb_tensor *u,
                        const char *op);
/* c's NCCL communicator for CUDA device `device` (made on first use, collectively over c),
 * or NULL + error. */
nb_comm *nb__comm_nccl_of(nb_comm *c, int device, const char *op);
/* Bootstrap steps 1-2 (collective over c): rank 0's ncclUniqueId, broadcast over c, into id
 * (NB__NCCL_ID_BYTES) on every rank. An error on every rank alike when rank 0 cannot make
 * one, or when the plugin does not load or lacks NCCL. Tests call it directly. */
nb_status nb__comm_nccl_share_id(nb_comm *c, unsigned char *id);
/* Whether the CUDA plugin has NCCL (0: no; -1: the plugin does not load, error set). */
int nb__comm_nccl_available(void);
/* After nb_comm_split(parent) made child: split parent's NCCL communicator (ncclCommSplit,
 * collective over parent) if it has one, so child's CUDA collectives need no new bootstrap.
 * A failure is kept for child's first CUDA collective to report. */
void nb__comm_dev_split(nb_comm *parent, nb_comm *child, int color, int key);
/* Release c->dev (when c's last reference goes). */
void nb__comm_dev_free(nb_comm *c);

/* ---- helpers shared by comm.c and the backends (comm.c) ----------------------------------- */
double nb__now(void);  /* monotonic seconds */
/* NB_COMM_TIMEOUT from the environment, else 300 (seconds). */
double nb__comm_default_timeout(void);
/* A new communicator object for a backend (refs 1, timeout from the environment). */
nb_comm *nb__comm_alloc(const nb__comm_backend *be, int rank, int size, void *impl);
void nb__comm_retain(nb_comm *c);
void nb__comm_release(nb_comm *c);
/* A new work of kind on c (refs 1: the caller's), or NULL + error. */
nb_work *nb__work_new(nb_comm *c, nb__coll kind);
/* Number w (collectives) and start it; NULL + error (w released) if it did not start. */
nb_work *nb__work_launch(nb_comm *c, nb_work *w);
/* Wait for w with its communicator's timeout. *gave_up: w was given up (abandoned and
 * released: a timeout, or ranks that disagree on a collective that cannot be withdrawn),
 * with the error set; otherwise w stays the caller's (nb__work_release). */
nb_status nb__work_wait_keep(nb_work *w, bool *gave_up);
/* Drop one reference to w (returning it to its communicator at zero). Thread safe. */
void nb__work_release(nb_work *w);
/* Mark w finished (from any thread). fail: status + printf-style message. */
void nb__work_done(nb_work *w);
void nb__work_fail(nb_work *w, nb_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Fail w with "<context>: <this thread's last error>" (the wrapping rules of nb_wrap_error,
 * docs/errors.md); fmt gives the context. */
void nb__work_fail_wrap(nb_work *w, nb_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* ---- agreement between ranks (comm_check.c) ------------------------------------------------ */
nb__sig nb__sig_of(nb__coll kind, nb_dtype dt, nb_reduce_op op, int root, int64_t count);
nb__sig nb__work_sig(const nb_work *w);
bool nb__sig_same(const nb__sig *a, const nb__sig *b);
uint64_t nb__sig_hash(const nb__sig *s); /* of all but seq */
/* "allreduce of 10 f32 (sum)", "broadcast of 3 i64 from rank 0", "barrier" */
void nb__sig_str(const nb__sig *s, char *buf, size_t n);
/* "allreduce of 10 f32 (sum) on rank 0 met allreduce of 20 f32 (sum) on rank 1 (...)" */
void nb__sig_mismatch(const nb__sig *mine, int my_rank, const nb__sig *theirs, int their_rank,
                      char *buf, size_t n);
/* c's record of its collectives (thread safe): the signature of collective s->seq, and the
 * one of collective seq if it is still in the record. */
void nb__comm_sig_record(nb_comm *c, const nb__sig *s);
bool nb__comm_sig_lookup(nb_comm *c, int64_t seq, nb__sig *out);
/* Mark c's ranks out of step (the first reason is kept); whether they are (why into msg). */
/* Whether c's last collective to end timed out or failed (none has completed since): a
 * teardown then does not communicate on it (nb_zero_free leaves a ZeRO-3 model sharded). */
bool nb__comm_stalled(nb_comm *c);
void nb__comm_put_out_of_step(nb_comm *c, const char *msg);
bool nb__comm_out_of_step(nb_comm *c, char *msg, size_t n);
/* NB_ECOMM naming op and the reason when c is out of step, else NB_OK. */
nb_status nb__comm_refuse_out_of_step(nb_comm *c, const char *op);
/* This thread waits for w from begin to end (returns a slot for end, -1 if none was free);
 * nb__comm_where describes this process's waits for a peer asking on c: "it is waiting in
 * allreduce #5 on this communicator", "it is not waiting for any communication: ...". */
int nb__wait_begin(const nb_work *w);
void nb__wait_end(int slot);
void nb__comm_where(const nb_comm *c, char *buf, size_t n);
/* NB_COMM_DEBUG=detail (read once): every collective's signature is compared across the
 * ranks first, by nb__comm_debug_check (collective over c): NB_OK, or NB_ECOMM naming both
 * sides (c is then out of step). */
bool nb__comm_debug(void);
void nb__comm_debug_force(int on); /* tests: the mode whatever NB_COMM_DEBUG says */
nb_status nb__comm_debug_check(nb_comm *c, const nb__sig *sig, const char *op);

/* buf[i] *= factor for a float dtype (f32, f64, f16, bf16): the division of an average. */
void nb__comm_scale(void *buf, int64_t n, nb_dtype dt, double factor);

#endif
