/* comm_self.c - the size-1 backend ("self"): every collective is a copy or nothing, and
 * send/recv to rank 0 go through a message queue inside the communicator (a send is
 * buffered, so a process can send to itself and receive later, from any thread). Used by
 * nb_comm_self(), and by nb_comm_world() when nabla runs without a launcher or was built
 * without MPI.
 *
 * Like every comm backend it sees buffers, never tensors: comm.c hands it host memory only
 * (a host tensor's own memory, or a host staging copy of a tensor of another device), so
 * the memcpy/memmove here never touch device memory. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "parallel/parallel_impl.h"

typedef struct self_msg {
    int tag;
    size_t nbytes;
    void *data; /* nb_host_alloc, NULL when nbytes == 0 */
    struct self_msg *next;
} self_msg;

typedef struct self_impl {
    pthread_mutex_t mu;
    self_msg *head, *tail;
} self_impl;

/* The impl is created on first use, so nb_comm_self() stays a plain allocation. */
static pthread_mutex_t g_impl_mu = PTHREAD_MUTEX_INITIALIZER;
static self_impl *impl_of(nb_comm *c) {
    pthread_mutex_lock(&g_impl_mu);
    if (!c->impl) {
        self_impl *s = calloc(1, sizeof *s);
        if (s) {
            pthread_mutex_init(&s->mu, NULL);
            c->impl = s;
        }
    }
    pthread_mutex_unlock(&g_impl_mu);
    return c->impl;
}

static nb_status done(nb_work *w) {
    nb__work_done(w);
    atomic_fetch_add(&w->comm->completed, 1);
    return NB_OK;
}

static nb_status self_allreduce(nb_comm *c, nb_work *w) { return done(w); }
static nb_status self_broadcast(nb_comm *c, nb_work *w) { return done(w); }
static nb_status self_reduce(nb_comm *c, nb_work *w) { return done(w); }
static nb_status self_barrier(nb_comm *c, nb_work *w) { return done(w); }

/* allgather, reduce_scatter, all_to_all of one rank: out = in (in may already be out). */
static nb_status self_copy(nb_comm *c, nb_work *w) {
    size_t nbytes = (size_t)w->a.out_count * nb_dtype_size(w->a.dtype);
    if (nbytes && w->a.out != w->a.in) memmove(w->a.out, w->a.in, nbytes);
    return done(w);
}

static nb_status self_send(nb_comm *c, nb_work *w) {
    self_impl *s = impl_of(c);
    self_msg *m = s ? calloc(1, sizeof *m) : NULL;
    if (!m) return nb__error(NB_ENOMEM, "send: out of memory");
    m->tag = w->a.tag;
    m->nbytes = (size_t)w->a.count * nb_dtype_size(w->a.dtype);
    if (m->nbytes) {
        if (!(m->data = nb_host_alloc(m->nbytes))) {
            free(m);
            return nb_last_status();
        }
        memcpy(m->data, w->a.buf, m->nbytes);
    }
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = m;
    else s->head = m;
    s->tail = m;
    pthread_mutex_unlock(&s->mu);
    nb__work_done(w);
    return NB_OK;
}

/* Take the first queued message with w's tag into w's buffer; 1 if one was there. */
static int try_recv(nb_work *w) {
    self_impl *s = impl_of(w->comm);
    if (!s) return 0;
    pthread_mutex_lock(&s->mu);
    self_msg *m = s->head, *prev = NULL;
    while (m && m->tag != w->a.tag) {
        prev = m;
        m = m->next;
    }
    if (m) {
        if (prev) prev->next = m->next;
        else s->head = m->next;
        if (s->tail == m) s->tail = prev;
    }
    pthread_mutex_unlock(&s->mu);
    if (!m) return 0;
    size_t want = (size_t)w->a.count * nb_dtype_size(w->a.dtype);
    if (m->nbytes != want) {
        nb__work_fail(w, NB_ECOMM, "recv from rank 0 (tag %d): expected %zu bytes (%lld %s), the "
                      "message has %zu", w->a.tag, want, (long long)w->a.count,
                      nb_dtype_name(w->a.dtype), m->nbytes);
    } else {
        if (want) memcpy(w->a.buf, m->data, want);
        nb__work_done(w);
    }
    if (m->data) nb_host_free(m->data);
    free(m);
    return 1;
}

static nb_status self_recv(nb_comm *c, nb_work *w) {
    try_recv(w);
    return NB_OK;
}

static int self_test(nb_work *w) {
    int st = atomic_load(&w->state);
    if (st == NB__WORK_PENDING && w->a.kind == NB__COLL_RECV && try_recv(w))
        st = atomic_load(&w->state);
    return st;
}

static int self_wait(nb_work *w, double deadline) {
    /* Only a pending recv can wait: another thread of this process may still send. */
    for (;;) {
        int st = self_test(w);
        if (st != NB__WORK_PENDING) return st;
        if (deadline > 0 && nb__now() >= deadline) return 0;
        nanosleep(&(struct timespec){0, 200000}, NULL);
    }
}

static void self_diagnose(nb_work *w, char *buf, size_t n) {
    snprintf(buf, n, "no message with tag %d was sent to this rank by rank 0 (this process)",
             w->a.tag);
}

static void self_abandon(nb_work *w) { (void)w; /* a pending recv holds nothing else */ }

static nb_comm *self_split(nb_comm *c, int color, int key) {
    return nb_comm_self();
}

static void self_destroy(nb_comm *c) {
    self_impl *s = c->impl;
    if (!s) return;
    for (self_msg *m = s->head, *next; m; m = next) {
        next = m->next;
        if (m->data) nb_host_free(m->data);
        free(m);
    }
    pthread_mutex_destroy(&s->mu);
    free(s);
}

const nb__comm_backend nb__comm_self_backend = {
    .name = "self",
    .start =
        {
            [NB__COLL_ALLREDUCE] = self_allreduce,
            [NB__COLL_BROADCAST] = self_broadcast,
            [NB__COLL_REDUCE] = self_reduce,
            [NB__COLL_ALLGATHER] = self_copy,
            [NB__COLL_REDUCE_SCATTER] = self_copy,
            [NB__COLL_ALL_TO_ALL] = self_copy,
            [NB__COLL_BARRIER] = self_barrier,
            [NB__COLL_SEND] = self_send,
            [NB__COLL_RECV] = self_recv,
        },
    .test = self_test,
    .wait = self_wait,
    .diagnose = self_diagnose,
    .abandon = self_abandon,
    .split = self_split,
    .destroy = self_destroy,
};
