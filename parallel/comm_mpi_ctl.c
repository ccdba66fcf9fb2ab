/* comm_mpi_ctl.c - the MPI backend's control thread and its answers to "who did not arrive"
 * and "did the ranks call the same collective".
 *
 * One control thread per process serves every MPI communicator through a duplicate of it
 * (the "ctl" communicator, so queries never mix with the caller's messages). It answers
 * queries - "how many collectives have you called on this communicator, how many have
 * finished, what was collective #n, and what are you waiting for?" (the asker sends its own
 * collective #n along: an answerer whose #n differs marks the communicator out of step, so
 * that a rank whose part of a mismatched collective was done at once - a broadcast's root -
 * also fails its next collective) - and polls requests that callers abandoned after a
 * timeout, releasing them
 * (and the tensors they hold) once MPI is done with them, and advances the small collectives
 * in flight (comm_mpi_small.c) for callers that are busy computing. It wakes every 2 ms and
 * is not needed on the data path.
 *
 * When a wait times out, the waiting rank sends a query to each peer (to the one peer of a
 * send/recv) and waits a grace period (a quarter of the timeout, 0.1 to 2 s) for answers:
 *   - no answer: the peer's process is gone (exited, crashed) or frozen;
 *   - "called n collectives" with n below this call's number: alive, has not joined it (and
 *     what it is waiting for instead);
 *   - every peer called it: the data did not get through (or a peer is still busy with an
 *     earlier collective, which its "finished" count shows).
 * The answers come from the peers' control threads, so a peer that is busy computing still
 * answers; only a dead or wedged process stays silent. A collective still pending after a
 * fraction of a second asks the same question (nb__mpi_check) to find ranks whose collective
 * of that number differs. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm_mpi.h"

/* ---- the thread ------------------------------------------------------------------------------ */
static void post_query_recv(nb__mpi_comm *m) {
    MPI_Irecv(&m->q_buf, (int)sizeof m->q_buf, MPI_BYTE, MPI_ANY_SOURCE, NB__MPI_TAG_QUERY, m->ctl,
              &m->q_req);
}

/* The answer to m's query from rank `from`; marks m out of step when the asker's collective
 * of the asked number differs from this rank's. */
static void answer(nb__mpi_comm *m, int from, nb__mpi_answer *a) {
    nb_comm *c = m->c;
    const nb__mpi_query *q = &m->q_buf;
    memset(a, 0, sizeof *a);
    a->qid = q->qid;
    a->issued = atomic_load(&c->issued);
    a->completed = atomic_load(&c->completed);
    a->world_rank = m->world_ranks[c->rank];
    a->has_sig = q->sig.seq > 0 && nb__comm_sig_lookup(c, q->sig.seq, &a->sig);
    if (a->has_sig && !nb__sig_same(&a->sig, &q->sig)) {
        char msg[NB__COMM_MSG];
        nb__sig_mismatch(&a->sig, c->rank, &q->sig, from, msg, sizeof msg);
        nb__comm_put_out_of_step(c, msg);
    }
    nb__comm_where(c, a->where, sizeof a->where);
}

/* Answer the queries that arrived on m; called with nb__mpi.mu held. */
static void serve(nb__mpi_comm *m) {
    for (;;) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Test(&m->q_req, &flag, &st) != MPI_SUCCESS || !flag) break;
        /* a query for an earlier communicator whose MPI context id this one reuses: stale */
        bool ours = m->q_buf.uid == m->uid;
        if (ours && m->q_buf.tag < 0) { /* a notice: the ranks are out of step, no answer */
            m->q_buf.msg[sizeof m->q_buf.msg - 1] = '\0';
            if (m->c) nb__comm_put_out_of_step(m->c, m->q_buf.msg);
            ours = false;
        }
        nb__mpi_reply *r = ours ? malloc(sizeof *r) : NULL;
        if (r && m->c) {
            answer(m, st.MPI_SOURCE, &r->a);
            if (MPI_Isend(&r->a, (int)sizeof r->a, MPI_BYTE, st.MPI_SOURCE, (int)m->q_buf.tag,
                          m->ctl, &r->req) == MPI_SUCCESS) {
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
        /* A reply goes out at once (small: MPI's eager protocol) once MPI progresses it. */
        for (nb__mpi_reply *r = m->replies, *next; r; r = next) {
            next = r->next;
            int flag = 0;
            for (double until = nb__now() + 0.05; !flag && nb__now() < until;)
                if (MPI_Test(&r->req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
            if (flag) free(r);
            else MPI_Request_free(&r->req); /* it and its 48 bytes stay with MPI */
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

/* Ask peer[0..np) about w, waiting up to `grace` seconds: got[i] and ans[i] for those that
 * answered. */
static void ask(nb_work *w, const int *peer, int np, double grace, nb__mpi_answer *ans,
                bool *got) {
    nb__mpi_comm *m = nb__mpi_of(w->comm);
    MPI_Request *rr = malloc(sizeof(MPI_Request) * (size_t)np * 2);
    nb__mpi_query *q = malloc(sizeof *q);
    if (!rr || !q) {
        free(rr), free(q);
        return;
    }
    MPI_Request *sr = rr + np;
    long long qid = atomic_fetch_add(&nb__mpi.qid, 1);
    q->qid = qid;
    q->tag = NB__MPI_TAG_REPLY0 + qid % NB__MPI_REPLY_TAGS;
    q->uid = m->uid;
    q->sig = nb__coll_is_p2p(w->a.kind) ? (nb__sig){0} : nb__work_sig(w);
    for (int i = 0; i < np; i++) {
        MPI_Irecv(&ans[i], (int)sizeof ans[i], MPI_BYTE, peer[i], (int)q->tag, m->ctl, &rr[i]);
        MPI_Isend(q, (int)sizeof *q, MPI_BYTE, peer[i], NB__MPI_TAG_QUERY, m->ctl, &sr[i]);
    }
    double until = nb__now() + grace;
    for (int ngot = 0; ngot < np && nb__now() < until;) {
        for (int i = 0; i < np; i++) {
            int flag = 0;
            if (!got[i] && MPI_Test(&rr[i], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) {
                got[i] = ans[i].qid == qid;
                ngot++;
            }
        }
        if (ngot < np) nb__mpi_sleep(0.001);
    }
    bool sent = true;
    for (int i = 0; i < np; i++) {
        int flag = 0;
        if (!got[i] && rr[i] != MPI_REQUEST_NULL) { /* cancelled, or it arrives right now */
            MPI_Cancel(&rr[i]);
            MPI_Wait(&rr[i], MPI_STATUS_IGNORE);
        }
        MPI_Test(&sr[i], &flag, MPI_STATUS_IGNORE);
        if (!flag) {
            MPI_Request_free(&sr[i]);
            sent = false; /* q stays with MPI */
        }
    }
    if (sent) free(q);
    free(rr);
}

/* Tell the peers whose flag is set (their rank in to[]) that the ranks are out of step. */
static void notify(nb_work *w, const bool *to, const char *msg) {
    nb_comm *c = w->comm;
    nb__mpi_comm *m = nb__mpi_of(c);
    int np = c->size - 1;
    if (!m->registered || np < 1) return;
    nb__mpi_query *q = calloc(1, sizeof *q);
    MPI_Request *rq = malloc(sizeof(MPI_Request) * (size_t)np);
    if (!q || !rq) {
        free(q), free(rq);
        return;
    }
    q->tag = -1;
    q->uid = m->uid;
    q->sig = nb__work_sig(w);
    snprintf(q->msg, sizeof q->msg, "%s", msg);
    int k = 0;
    for (int r = 0; r < c->size; r++)
        if (r != c->rank && to[r] &&
            MPI_Isend(q, (int)sizeof *q, MPI_BYTE, r, NB__MPI_TAG_QUERY, m->ctl, &rq[k]) ==
                MPI_SUCCESS)
            k++;
    int done = 0;
    for (double until = nb__now() + 0.05; !done && nb__now() < until;)
        if (MPI_Testall(k, rq, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) break;
    if (!done) { /* q stays with MPI */
        for (int i = 0; i < k; i++)
            if (rq[i] != MPI_REQUEST_NULL) MPI_Request_free(&rq[i]);
    } else {
        free(q);
    }
    free(rq);
}

int nb__mpi_check(nb_work *w, char *buf, size_t n) {
    nb_comm *c = w->comm;
    nb__mpi_comm *m = nb__mpi_of(c);
    int np = c->size - 1;
    if (!m->registered || np < 1 || nb__coll_is_p2p(w->a.kind)) return 0;
    int *peer = malloc(sizeof(int) * (size_t)np);
    nb__mpi_answer *ans = calloc((size_t)np, sizeof *ans);
    bool *got = calloc((size_t)np, 1);
    int found = 0;
    if (peer && ans && got) {
        for (int r = 0, i = 0; r < c->size; r++)
            if (r != c->rank) peer[i++] = r;
        /* a live peer's control thread answers within a few milliseconds */
        ask(w, peer, np, 0.2, ans, got);
        nb__sig me = nb__work_sig(w);
        for (int i = 0; i < np && !found; i++)
            if (got[i] && ans[i].has_sig && !nb__sig_same(&me, &ans[i].sig)) {
                nb__sig_mismatch(&me, c->rank, &ans[i].sig, peer[i], buf, n);
                found = 1;
            }
        /* A peer whose collective differs learned it from the question (answer()); the
         * others, whose collective is this rank's or who did not answer, are told. */
        bool *to = found ? calloc((size_t)c->size, 1) : NULL;
        bool any = false;
        for (int i = 0; to && i < np; i++)
            if (!got[i] || !ans[i].has_sig || nb__sig_same(&me, &ans[i].sig))
                any = to[peer[i]] = true;
        if (any) notify(w, to, buf);
        free(to);
    }
    free(peer), free(ans), free(got);
    return found;
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
    int *peer = calloc((size_t)np * 3, sizeof(int));
    nb__mpi_answer *ans = calloc((size_t)np, sizeof *ans);
    bool *got = calloc((size_t)np, 1);
    if (!peer || !ans || !got) {
        free(peer), free(ans), free(got);
        append(buf, n, "rank(s) unknown (out of memory)");
        return;
    }
    int *silent = peer + np, *late = peer + 2 * np, nsilent = 0, nlate = 0, nbusy = 0;
    if (p2p) peer[0] = w->a.peer;
    else
        for (int r = 0, i = 0; r < c->size; r++)
            if (r != c->rank) peer[i++] = r;
    double grace = atomic_load(&c->timeout) / 4;
    grace = grace < 0.1 ? 0.1 : grace > 2.0 ? 2.0 : grace;
    ask(w, peer, np, grace, ans, got);
    long long busy_at = 0;
    const nb__mpi_answer *first_late = NULL;
    nb__sig me = p2p ? (nb__sig){0} : nb__work_sig(w);
    for (int i = 0; i < np; i++) {
        if (!got[i]) {
            silent[nsilent++] = peer[i];
        } else if (!p2p && ans[i].has_sig && !nb__sig_same(&me, &ans[i].sig)) {
            char msg[NB__COMM_MSG];
            nb__sig_mismatch(&me, c->rank, &ans[i].sig, peer[i], msg, sizeof msg);
            append(buf, n, "%s; ", msg);
        } else if (!p2p && ans[i].issued < w->seq) {
            if (!nlate) first_late = &ans[i];
            late[nlate++] = peer[i];
        } else if (!p2p && ans[i].completed < w->seq - 1) {
            nbusy++;
            busy_at = ans[i].completed + 1;
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
        append(buf, n, "%s%s %s %s alive but did not join collective #%lld (", nsilent ? "; " : "",
               nlate > 1 ? "ranks" : "rank", list, nlate > 1 ? "are" : "is", (long long)w->seq);
        if (nlate > 1) append(buf, n, "rank %s: ", first);
        append(buf, n, "%s; it has made %lld collective calls on this communicator)",
               first_late->where, first_late->issued);
    }
    if (!nsilent && !nlate && !strstr(buf, " met ")) {
        char pn[48];
        if (p2p) {
            rank_name(m, w->a.peer, pn, sizeof pn);
            append(buf, n, "rank %s is alive but the matching %s has not arrived (%s)", pn,
                   w->a.kind == NB__COLL_RECV ? "send" : "receive", ans[0].where);
        } else if (nbusy)
            append(buf, n, "every rank called it, but %d rank(s) are still busy with an earlier "
                   "collective (#%lld)", nbusy, busy_at);
        else
            append(buf, n, "every rank called it and answers, but the data did not get through "
                   "in time (a slow or broken network?)");
    }
    size_t len = strlen(buf); /* a mismatch's "; " before nothing else */
    if (len >= 2 && !strcmp(buf + len - 2, "; ")) buf[len - 2] = '\0';
    free(got);
    free(peer);
    free(ans);
}
