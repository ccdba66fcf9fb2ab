/* comm_mpi_ctl.c - the MPI backend's control thread and its answer to "who did not arrive".
 *
 * One control thread per process serves every MPI communicator through a duplicate of it
 * (the "ctl" communicator, so queries never mix with the caller's messages). It answers
 * queries - "how many collectives have you called on this communicator, and how many have
 * finished?" - and polls requests that callers abandoned after a timeout, releasing them
 * (and the tensors they hold) once MPI is done with them, and advances the small collectives
 * in flight (comm_mpi_small.c) for callers that are busy computing. It wakes every 2 ms and
 * is not needed on the data path.
 *
 * When a wait times out, the waiting rank sends a query to each peer (to the one peer of a
 * send/recv) and waits a grace period (a quarter of the timeout, 0.1 to 2 s) for answers:
 *   - no answer: the peer's process is gone (exited, crashed) or frozen;
 *   - "called n collectives" with n below this call's number: alive, has not called it;
 *   - every peer called it: the data did not get through (or a peer is still busy with an
 *     earlier collective, which its "finished" count shows).
 * The answers come from the peers' control threads, so a peer that is busy computing still
 * answers; only a dead or wedged process stays silent. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm_mpi.h"

/* ---- the thread ------------------------------------------------------------------------------ */
static void post_query_recv(nb__mpi_comm *m) {
    MPI_Irecv(m->q_buf, 2, MPI_LONG_LONG, MPI_ANY_SOURCE, NB__MPI_TAG_QUERY, m->ctl, &m->q_req);
}

/* Answer the queries that arrived on m; called with nb__mpi.mu held. */
static void serve(nb__mpi_comm *m) {
    for (;;) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Test(&m->q_req, &flag, &st) != MPI_SUCCESS || !flag) break;
        nb__mpi_reply *r = malloc(sizeof *r);
        if (r && m->c) {
            r->buf[0] = m->q_buf[0];
            r->buf[1] = atomic_load(&m->c->issued);
            r->buf[2] = atomic_load(&m->c->completed);
            r->buf[3] = m->world_ranks[m->c->rank];
            if (MPI_Isend(r->buf, 4, MPI_LONG_LONG, st.MPI_SOURCE, (int)m->q_buf[1], m->ctl,
                          &r->req) == MPI_SUCCESS) {
                r->next = m->replies;
                m->replies = r;
                r = NULL;
            }
        }
        free(r);
        post_query_recv(m);
    }
    for (nb__mpi_reply **p = &m->replies; *p;) {
        int flag = 0;
        if (MPI_Test(&(*p)->req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag) {
            nb__mpi_reply *r = *p;
            *p = r->next;
            free(r);
        } else {
            p = &(*p)->next;
        }
    }
}

/* Abandoned requests that have ended; called with nb__mpi.mu held. Returns them as a list:
 * they are released after the lock is dropped (a release may free a communicator, which
 * takes the lock). */
static nb_work *reap_zombies(void) {
    nb_work *ended = NULL;
    for (nb_work **p = &nb__mpi.zombies; *p;) {
        nb_work *w = *p;
        int flag = 0;
        MPI_Status s;
        int rc = MPI_Test(&nb__mpi_ws_of(w)->req, &flag, &s);
        if (rc != MPI_SUCCESS || flag) {
            *p = w->next;
            nb__mpi_req_ended(w, rc, &s);
            w->next = ended;
            ended = w;
        } else {
            p = &w->next;
        }
    }
    return ended;
}

/* Seconds between the thread's rounds: 2 ms; NB_TEST_CTL_POLL_US=N (a test hook, read when
 * the thread starts) makes it N microseconds, so that the thread's MPI progress overlaps the
 * other threads' MPI calls as often as possible (tools/run-tsan). */
static double poll_interval(void) {
    const char *s = getenv("NB_TEST_CTL_POLL_US");
    long us = s && *s ? strtol(s, NULL, 10) : 0;
    return us > 0 && us < 1000000 ? (double)us * 1e-6 : 0.002;
}

static void *ctl_main(void *arg) {
    /* Runs until the generation changes (nb__mpi_ctl_stop; a thread started later has the
     * next one), so a stopped thread never goes on next to its successor. */
    int gen = (int)(intptr_t)arg;
    double interval = poll_interval();
    while (atomic_load(&nb__mpi.ctl_gen) == gen) {
        pthread_mutex_lock(&nb__mpi.mu);
        nb_work *small_ended = NULL;
        for (nb__mpi_comm *m = nb__mpi.reg; m; m = m->next_reg) {
            serve(m);
            /* Small collectives move on while their callers compute (or after they gave
             * them up); skipped when a caller is advancing them right now. */
            if (atomic_load(&m->inflight) > 0) {
                nb_work *e = nb__mpi_small_progress(m, true);
                if (e) {
                    nb_work *t = e;
                    while (nb__mpi_ws_of(t)->sm_next) t = nb__mpi_ws_of(t)->sm_next;
                    nb__mpi_ws_of(t)->sm_next = small_ended;
                    small_ended = e;
                }
            }
        }
        nb_work *ended = reap_zombies();
        /* Nothing left to serve: end (nobody will join: detach). Only while this is the
         * current thread (the generation changes under the lock). */
        bool done = atomic_load(&nb__mpi.ctl_gen) == gen && nb__mpi.ctl_running &&
                    !nb__mpi.reg && !nb__mpi.zombies;
        if (done) {
            nb__mpi.ctl_running = false;
            pthread_detach(pthread_self());
        }
        pthread_mutex_unlock(&nb__mpi.mu);
        nb__mpi_small_release(small_ended);
        for (nb_work *w = ended, *next; w; w = next) {
            next = w->next;
            atomic_fetch_sub(&nb__mpi.stuck, 1);
            nb__work_release(w);
        }
        if (done) break;
        nb__mpi_sleep(interval);
    }
    return NULL;
}

void nb__mpi_ctl_stop(void) {
    pthread_mutex_lock(&nb__mpi.mu);
    bool running = nb__mpi.ctl_running;
    pthread_t t = nb__mpi.ctl;
    nb__mpi.ctl_running = false;
    atomic_fetch_add(&nb__mpi.ctl_gen, 1);
    pthread_mutex_unlock(&nb__mpi.mu);
    if (!running) return;
    /* On the thread itself (it released the last work of the last communicator): it ends
     * when this returns, and nobody will join it. */
    if (pthread_equal(t, pthread_self())) pthread_detach(t);
    else pthread_join(t, NULL);
}

static void ensure_thread(void) { /* with nb__mpi.mu held */
    if (nb__mpi.ctl_running) return;
    int gen = atomic_fetch_add(&nb__mpi.ctl_gen, 1) + 1;
    if (pthread_create(&nb__mpi.ctl, NULL, ctl_main, (void *)(intptr_t)gen) == 0)
        nb__mpi.ctl_running = true;
}

void nb__mpi_ctl_register(nb__mpi_comm *m) {
    if (!nb__mpi.threads) return;
    pthread_mutex_lock(&nb__mpi.mu);
    post_query_recv(m);
    m->registered = true;
    m->next_reg = nb__mpi.reg;
    nb__mpi.reg = m;
    ensure_thread();
    pthread_mutex_unlock(&nb__mpi.mu);
}

/* The thread stops with the last communicator (nothing left to poll then). */
void nb__mpi_ctl_unregister(nb__mpi_comm *m) {
    if (!m->registered) return;
    pthread_mutex_lock(&nb__mpi.mu);
    for (nb__mpi_comm **p = &nb__mpi.reg; *p; p = &(*p)->next_reg)
        if (*p == m) {
            *p = m->next_reg;
            break;
        }
    m->registered = false;
    if (!nb__mpi.finalized) {
        MPI_Cancel(&m->q_req);
        MPI_Wait(&m->q_req, MPI_STATUS_IGNORE);
        for (nb__mpi_reply *r = m->replies, *next; r; r = next) {
            next = r->next;
            int flag = 0;
            MPI_Test(&r->req, &flag, MPI_STATUS_IGNORE);
            if (flag) free(r);
            else MPI_Request_free(&r->req); /* its 48 bytes stay with MPI */
        }
    }
    m->replies = NULL;
    bool last = nb__mpi.reg == NULL && nb__mpi.zombies == NULL;
    pthread_mutex_unlock(&nb__mpi.mu);
    if (last) nb__mpi_ctl_stop();
}

void nb__mpi_zombie_add(nb_work *w, bool counted) {
    if (!counted) {
        atomic_fetch_add(&w->refs, 1); /* released by the control thread when MPI is done */
        atomic_fetch_add(&nb__mpi.stuck, 1);
    }
    pthread_mutex_lock(&nb__mpi.mu);
    w->next = nb__mpi.zombies;
    nb__mpi.zombies = w;
    if (nb__mpi.threads) ensure_thread();
    pthread_mutex_unlock(&nb__mpi.mu);
}

/* ---- diagnosis --------------------------------------------------------------------------------- */
static void append(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t n, const char *fmt, ...) {
    size_t used = strlen(buf);
    if (used + 1 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, n - used, fmt, ap);
    va_end(ap);
}

static void rank_name(const nb__mpi_comm *m, int r, char *buf, size_t n) {
    if (m->c->is_world || m->world_ranks[r] == r) snprintf(buf, n, "%d", r);
    else snprintf(buf, n, "%d (world rank %d)", r, m->world_ranks[r]);
}

/* "1, 3 (world rank 7)": at most 8 ranks, then a count. */
static void list_ranks(const nb__mpi_comm *m, const int *list, int k, char *buf, size_t n) {
    buf[0] = 0;
    for (int i = 0; i < k && i < 8; i++) {
        char r[48];
        rank_name(m, list[i], r, sizeof r);
        append(buf, n, "%s%s", i ? ", " : "", r);
    }
    if (k > 8) append(buf, n, " and %d more", k - 8);
}

void nb__mpi_diagnose(nb_work *w, char *buf, size_t n) {
    nb_comm *c = w->comm;
    nb__mpi_comm *m = nb__mpi_of(c);
    bool p2p = nb__coll_is_p2p(w->a.kind);
    buf[0] = 0;
    if (!m->registered) {
        snprintf(buf, n, "rank(s) unknown (MPI runs without MPI_THREAD_MULTIPLE, so nabla cannot "
                 "ask the peers)");
        return;
    }
    if (!p2p) { /* this rank's own earlier collective, still running, holds this one up */
        pthread_mutex_lock(&m->mu);
        nb_work *r = m->running;
        if (r && r != w)
            append(buf, n, "this rank is still inside an earlier %s (collective #%lld); ",
                   nb__coll_name(r->a.kind), (long long)r->seq);
        pthread_mutex_unlock(&m->mu);
    }
    int np = p2p ? (w->a.peer == c->rank ? 0 : 1) : c->size - 1;
    if (np == 0) {
        append(buf, n, "the peer is this rank itself, and no matching message was posted");
        return;
    }
    int *peer = malloc(sizeof(int) * (size_t)np * 3);
    long long(*rb)[4] = calloc((size_t)np, sizeof *rb);
    MPI_Request *rr = malloc(sizeof(MPI_Request) * (size_t)np * 2);
    long long *q = malloc(2 * sizeof(long long));
    bool *got = calloc((size_t)np, 1);
    if (!peer || !rb || !rr || !q || !got) {
        free(peer), free(rb), free(rr), free(q), free(got);
        append(buf, n, "rank(s) unknown (out of memory)");
        return;
    }
    int *silent = peer + np, *late = peer + 2 * np, nsilent = 0, nlate = 0, nbusy = 0;
    MPI_Request *sr = rr + np;
    long long qid = atomic_fetch_add(&nb__mpi.qid, 1);
    q[0] = qid;
    q[1] = NB__MPI_TAG_REPLY0 + qid % NB__MPI_REPLY_TAGS;
    if (p2p) peer[0] = w->a.peer;
    else
        for (int r = 0, i = 0; r < c->size; r++)
            if (r != c->rank) peer[i++] = r;
    for (int i = 0; i < np; i++) {
        MPI_Irecv(rb[i], 4, MPI_LONG_LONG, peer[i], (int)q[1], m->ctl, &rr[i]);
        MPI_Isend(q, 2, MPI_LONG_LONG, peer[i], NB__MPI_TAG_QUERY, m->ctl, &sr[i]);
    }
    double grace = atomic_load(&c->timeout) / 4;
    grace = grace < 0.1 ? 0.1 : grace > 2.0 ? 2.0 : grace;
    double until = nb__now() + grace;
    for (int ngot = 0; ngot < np && nb__now() < until;) {
        for (int i = 0; i < np; i++) {
            int flag = 0;
            if (!got[i] && MPI_Test(&rr[i], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) {
                got[i] = true;
                ngot++;
            }
        }
        if (ngot < np) nb__mpi_sleep(0.001);
    }
    bool sent = true;
    for (int i = 0; i < np; i++) {
        int flag = 0;
        if (!got[i]) {
            MPI_Cancel(&rr[i]);
            MPI_Request_free(&rr[i]);
        }
        MPI_Test(&sr[i], &flag, MPI_STATUS_IGNORE);
        if (!flag) {
            MPI_Request_free(&sr[i]);
            sent = false; /* q stays with MPI */
        }
    }
    long long busy_at = 0, late_at = 0;
    for (int i = 0; i < np; i++) {
        if (!got[i]) {
            silent[nsilent++] = peer[i];
        } else if (!p2p && rb[i][1] < w->seq) {
            if (!nlate) late_at = rb[i][1];
            late[nlate++] = peer[i];
        } else if (!p2p && rb[i][2] < w->seq - 1) {
            nbusy++;
            busy_at = rb[i][2] + 1;
        }
    }
    char list[256];
    if (nsilent) {
        list_ranks(m, silent, nsilent, list, sizeof list);
        append(buf, n, "%s %s did not answer within %.2g s (%s exited, crashed or hangs)",
               nsilent > 1 ? "ranks" : "rank", list, grace,
               nsilent > 1 ? "their processes" : "its process");
    }
    if (nlate) {
        char first[48];
        list_ranks(m, late, nlate, list, sizeof list);
        rank_name(m, late[0], first, sizeof first);
        append(buf, n, "%s%s %s %s alive but %s not called it yet (rank %s has made %lld "
               "collective calls on this communicator, this is call #%lld)", nsilent ? "; " : "",
               nlate > 1 ? "ranks" : "rank", list, nlate > 1 ? "are" : "is",
               nlate > 1 ? "have" : "has", first, late_at, (long long)w->seq);
    }
    if (!nsilent && !nlate) {
        char pn[48];
        if (p2p) {
            rank_name(m, w->a.peer, pn, sizeof pn);
            append(buf, n, "rank %s is alive but the matching %s has not arrived", pn,
                   w->a.kind == NB__COLL_RECV ? "send" : "receive");
        } else if (nbusy)
            append(buf, n, "every rank called it, but %d rank(s) are still busy with an earlier "
                   "collective (#%lld)", nbusy, busy_at);
        else
            append(buf, n, "every rank called it and answers, but the data did not get through "
                   "in time (a slow or broken network?)");
    }
    if (sent) free(q);
    free(got);
    free(peer);
    free(rb);
    free(rr);
}
