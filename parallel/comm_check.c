/* comm_check.c - whether the ranks agree on their collectives (docs/distributed.md, "Ranks
 * that disagree"): every collective's signature (operation, element count, dtype, reduce op,
 * root) and the words that describe it, each communicator's record of its recent
 * collectives' signatures and its "out of step" state, what this process is waiting for
 * right now (the answer to a peer's "where are you?"), and the debug mode
 * NB_COMM_DEBUG=detail, which compares every collective's signature across the ranks before
 * it runs.
 *
 * The cheap checks that are always on live with the backend (MPI: comm_mpi*.c): a small
 * collective's messages carry a hash of its signature in their tag, so that different
 * collectives never exchange data; a rank whose collective makes no progress asks its peers
 * for the signature of that collective (their control threads answer from the record kept
 * here), and a large collective agrees on a hash of the signatures before it runs. A
 * detected disagreement fails the collective with a message naming both sides and puts the
 * communicator out of step: its later collectives fail at once with the same message (the
 * ranks' numbering of collectives no longer means the same thing). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/parallel_impl.h"

/* ---- signatures ------------------------------------------------------------------------------ */
static bool is_reduction(nb__coll k) {
    return k == NB__COLL_ALLREDUCE || k == NB__COLL_REDUCE || k == NB__COLL_REDUCE_SCATTER;
}

nb__sig nb__sig_of(nb__coll kind, nb_dtype dt, nb_reduce_op op, int root, int64_t count) {
    nb__sig s = {.kind = (int32_t)kind, .dtype = -1, .op = -1, .root = -1};
    if (kind == NB__COLL_BARRIER || kind == NB__COLL_SPLIT) return s;
    s.dtype = (int32_t)dt;
    s.count = count;
    if (is_reduction(kind)) s.op = (int32_t)op;
    if (kind == NB__COLL_BROADCAST || kind == NB__COLL_REDUCE) s.root = root;
    return s;
}

nb__sig nb__work_sig(const nb_work *w) {
    const nb__args *a = &w->a;
    /* The count every rank shares: an allgather's output (its inputs may be uneven chunks),
     * a reduce_scatter's and an all_to_all's input. */
    int64_t n = a->kind == NB__COLL_ALLGATHER ? a->out_count
                : a->kind == NB__COLL_REDUCE_SCATTER || a->kind == NB__COLL_ALL_TO_ALL
                    ? a->in_count
                    : a->count;
    nb__sig s = nb__sig_of(a->kind, a->dtype, a->op, a->peer, n);
    s.seq = w->seq;
    return s;
}

bool nb__sig_same(const nb__sig *a, const nb__sig *b) {
    return a->kind == b->kind && a->dtype == b->dtype && a->op == b->op && a->root == b->root &&
           a->count == b->count;
}

uint64_t nb__sig_hash(const nb__sig *s) {
    /* FNV-1a over the fields but seq, then a final mix */
    int64_t v[5] = {s->kind, s->dtype, s->op, s->root, s->count};
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < 5; i++)
        for (int b = 0; b < 8; b++) {
            h ^= (uint64_t)(v[i] >> (8 * b)) & 0xff;
            h *= 1099511628211ull;
        }
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
}

static const char *op_name(int32_t op) {
    switch (op) {
    case NB_REDUCE_SUM: return "sum";
    case NB_REDUCE_AVG: return "avg";
    case NB_REDUCE_MAX: return "max";
    case NB_REDUCE_MIN: return "min";
    default: return "?";
    }
}

void nb__sig_str(const nb__sig *s, char *buf, size_t n) {
    const char *k = nb__coll_name((nb__coll)s->kind);
    if (s->kind == NB__COLL_BARRIER || s->kind == NB__COLL_SPLIT) {
        snprintf(buf, n, "%s", k);
        return;
    }
    int len = snprintf(buf, n, "%s of %lld %s", k, (long long)s->count,
                       (unsigned)s->dtype < NB_DTYPE_COUNT ? nb_dtype_name((nb_dtype)s->dtype)
                                                           : "?");
    size_t used = len < 0 ? 0 : (size_t)len < n ? (size_t)len : n - 1;
    if (s->op >= 0) {
        int m = snprintf(buf + used, n - used, " (%s)", op_name(s->op));
        used += m < 0 ? 0 : (size_t)m < n - used ? (size_t)m : n - used - 1;
    }
    if (s->root >= 0)
        snprintf(buf + used, n - used, " %s rank %d",
                 s->kind == NB__COLL_BROADCAST ? "from" : "to", s->root);
}

void nb__sig_mismatch(const nb__sig *mine, int my_rank, const nb__sig *theirs, int their_rank,
                      char *buf, size_t n) {
    char a[128], b[128];
    nb__sig_str(mine, a, sizeof a);
    nb__sig_str(theirs, b, sizeof b);
    if (mine->seq == theirs->seq)
        snprintf(buf, n, "%s on rank %d met %s on rank %d (collective #%lld on this "
                 "communicator): the ranks' collectives differ, and every rank must make the "
                 "same collective calls in the same order", a, my_rank, b, their_rank,
                 (long long)mine->seq);
    else
        snprintf(buf, n, "%s (collective #%lld on this communicator) on rank %d met %s "
                 "(collective #%lld) on rank %d: the ranks' collectives differ, and every rank "
                 "must make the same collective calls in the same order", a,
                 (long long)mine->seq, my_rank, b, (long long)theirs->seq, their_rank);
}

/* ---- a communicator's record and its out-of-step state ----------------------------------------- */
void nb__comm_sig_record(nb_comm *c, const nb__sig *s) {
    pthread_mutex_lock(&c->sig_mu);
    c->sigs[s->seq % NB__SIG_RING] = *s;
    pthread_mutex_unlock(&c->sig_mu);
}

bool nb__comm_sig_lookup(nb_comm *c, int64_t seq, nb__sig *out) {
    pthread_mutex_lock(&c->sig_mu);
    const nb__sig *s = &c->sigs[seq % NB__SIG_RING];
    bool found = seq > 0 && s->seq == seq;
    if (found) *out = *s;
    pthread_mutex_unlock(&c->sig_mu);
    return found;
}

void nb__comm_put_out_of_step(nb_comm *c, const char *msg) {
    pthread_mutex_lock(&c->sig_mu);
    if (!c->out_of_step[0]) snprintf(c->out_of_step, sizeof c->out_of_step, "%s", msg);
    pthread_mutex_unlock(&c->sig_mu);
}

bool nb__comm_out_of_step(nb_comm *c, char *msg, size_t n) {
    pthread_mutex_lock(&c->sig_mu);
    bool oos = c->out_of_step[0] != '\0';
    if (oos && msg) snprintf(msg, n, "%s", c->out_of_step);
    pthread_mutex_unlock(&c->sig_mu);
    return oos;
}

nb_status nb__comm_refuse_out_of_step(nb_comm *c, const char *op) {
    char why[NB__COMM_MSG];
    if (!nb__comm_out_of_step(c, why, sizeof why)) return NB_OK;
    return nb__error(NB_ECOMM, "%s: this communicator's ranks are out of step since an earlier "
                     "collective, which cannot be undone (free the communicator): %s", op, why);
}

/* ---- what this process waits for ------------------------------------------------------------------
 * A few slots, one per thread in a blocking wait (more threads than slots go unrecorded). The
 * communicator pointer is only compared, never followed. */
#define NB__WAIT_SLOTS 16
static struct {
    pthread_mutex_t mu;
    struct {
        bool used;
        const nb_comm *c;
        nb__coll kind;
        int64_t seq;
        int peer, tag;
    } slot[NB__WAIT_SLOTS];
} g_wait = {.mu = PTHREAD_MUTEX_INITIALIZER};

int nb__wait_begin(const nb_work *w) {
    int k = -1;
    pthread_mutex_lock(&g_wait.mu);
    for (int i = 0; i < NB__WAIT_SLOTS && k < 0; i++)
        if (!g_wait.slot[i].used) {
            k = i;
            g_wait.slot[i].used = true;
            g_wait.slot[i].c = w->comm;
            g_wait.slot[i].kind = w->a.kind;
            g_wait.slot[i].seq = w->seq;
            g_wait.slot[i].peer = w->a.peer;
            g_wait.slot[i].tag = w->a.tag;
        }
    pthread_mutex_unlock(&g_wait.mu);
    return k;
}

void nb__wait_end(int slot) {
    if (slot < 0) return;
    pthread_mutex_lock(&g_wait.mu);
    g_wait.slot[slot].used = false;
    pthread_mutex_unlock(&g_wait.mu);
}

void nb__comm_where(const nb_comm *c, char *buf, size_t n) {
    pthread_mutex_lock(&g_wait.mu);
    int k = -1; /* a wait on c itself first, else any */
    for (int i = 0; i < NB__WAIT_SLOTS && k < 0; i++)
        if (g_wait.slot[i].used && g_wait.slot[i].c == c) k = i;
    for (int i = 0; i < NB__WAIT_SLOTS && k < 0; i++)
        if (g_wait.slot[i].used) k = i;
    if (k < 0) {
        snprintf(buf, n, "it is not waiting for any communication: computing, or blocked "
                 "outside nabla's collectives");
    } else {
        const char *where = g_wait.slot[k].c == c ? "this communicator" : "another communicator";
        nb__coll kind = g_wait.slot[k].kind;
        if (kind == NB__COLL_SEND || kind == NB__COLL_RECV)
            snprintf(buf, n, "it is waiting in a %s %s rank %d (tag %d) on %s", nb__coll_name(kind),
                     kind == NB__COLL_SEND ? "to" : "from", g_wait.slot[k].peer,
                     g_wait.slot[k].tag, where);
        else
            snprintf(buf, n, "it is waiting in %s #%lld on %s", nb__coll_name(kind),
                     (long long)g_wait.slot[k].seq, where);
    }
    pthread_mutex_unlock(&g_wait.mu);
}

/* ---- NB_COMM_DEBUG=detail ---------------------------------------------------------------------- */
static int debug_mode = -1; /* read once */

void nb__comm_debug_force(int on) { __atomic_store_n(&debug_mode, on ? 1 : 0, __ATOMIC_RELAXED); }

bool nb__comm_debug(void) {
    int m = __atomic_load_n(&debug_mode, __ATOMIC_RELAXED);
    if (m < 0) {
        const char *s = getenv("NB_COMM_DEBUG");
        m = s && (!strcmp(s, "detail") || !strcmp(s, "DETAIL"));
        if (s && *s && !m && strcmp(s, "off") && strcmp(s, "0"))
            fprintf(stderr, "nabla: NB_COMM_DEBUG=\"%s\" is not a mode (detail or off); off\n", s);
        __atomic_store_n(&debug_mode, m, __ATOMIC_RELAXED);
    }
    return m == 1;
}

nb_status nb__comm_debug_check(nb_comm *c, const nb__sig *sig, const char *op) {
    if (c->size < 2) return NB_OK;
    nb_status st = nb__comm_refuse_out_of_step(c, op);
    if (st != NB_OK) return st;
    /* An allgather of every rank's signature (5 int64 each) before the collective itself:
     * a collective of its own, so its number comes first. */
    int64_t mine[5] = {sig->kind, sig->dtype, sig->op, sig->root, sig->count};
    int64_t *all = malloc(sizeof(int64_t) * 5 * (size_t)c->size);
    if (!all) return nb__error(NB_ENOMEM, "%s: out of memory (NB_COMM_DEBUG)", op);
    nb_work *w = nb__work_new(c, NB__COLL_ALLGATHER);
    if (!w) {
        free(all);
        return nb_last_status();
    }
    w->a.dtype = NB_I64;
    w->a.in = mine;
    w->a.in_count = 5;
    w->a.out = all;
    w->a.out_count = 5 * (int64_t)c->size;
    w->internal = true;
    if (!(w = nb__work_launch(c, w))) {
        free(all);
        return nb_last_status();
    }
    int64_t check_seq = w->seq;
    bool gave_up = false;
    st = nb__work_wait_keep(w, &gave_up);
    if (!gave_up) nb__work_release(w);
    if (st != NB_OK) {
        if (!gave_up) free(all); /* a given-up allgather may still write it: leaked */
        return nb_wrap_error(st, "%s: NB_COMM_DEBUG's agreement on the collective", op);
    }
    nb__sig me = *sig;
    me.seq = check_seq + 1; /* the collective that follows */
    for (int r = 0; r < c->size; r++) {
        const int64_t *v = all + 5 * r;
        nb__sig t = {.seq = me.seq, .kind = (int32_t)v[0], .dtype = (int32_t)v[1],
                     .op = (int32_t)v[2], .root = (int32_t)v[3], .count = v[4]};
        if (nb__sig_same(&me, &t)) continue;
        char msg[NB__COMM_MSG];
        nb__sig_mismatch(&me, c->rank, &t, r, msg, sizeof msg);
        nb__comm_put_out_of_step(c, msg);
        free(all);
        return nb__error(NB_ECOMM, "%s (NB_COMM_DEBUG=detail)", msg);
    }
    free(all);
    return NB_OK;
}
