/* comm_mpi_small.c - the MPI backend's small collectives (up to NB__MPI_SMALL_BYTES): nabla's
 * own algorithms over point-to-point messages, advanced by whoever polls.
 *
 * Why not MPI's nonblocking collectives: Open MPI's (libnbc) cost about twice the blocking
 * call on small messages (7 us against 3.5 us for a 4 KiB allreduce on 2 ranks), and the
 * blocking calls cannot be used by the caller's thread because they have no timeout (a dead
 * peer would hang it). So a small collective is a short schedule of rounds: in each round a
 * rank posts one message each way at most (MPI_Irecv, MPI_Isend; up to 8 KiB in pieces that
 * Open MPI delivers eagerly), does the round's local work (a reduction of the received
 * block) once its data is in - before its own sends have completed, when that work leaves
 * their buffers alone - and posts the next round when all of it is done. Schedules:
 *   allreduce       up to NB__MPI_RD_BYTES recursive doubling (log2 p rounds exchanging the
 *                   whole buffer, plus a fold-in and a fold-out round for the ranks beyond
 *                   the largest power of two q); larger ones Rabenseifner's reduce-scatter
 *                   by recursive halving and allgather by recursive doubling (2 log2 q
 *                   rounds, each rank sends and reduces less than the buffer once)
 *   reduce          binomial tree to the root;  broadcast: binomial tree from the root
 *   allgather       ring (equal blocks or nb_comm_chunk's uneven ones)
 *   reduce_scatter  ring, every rank ending with its nb_comm_chunk
 *   all_to_all      pairwise exchange;  barrier: dissemination
 * Which schedule runs depends only on the arguments, so it is the same on every rank.
 *
 * Results are identical on every rank, bit for bit: in the reduce-scatters every element is
 * reduced by one rank and then copied to the others, and recursive doubling combines the
 * two sides of each exchange as (lower ranks' part) op (higher ranks' part) on both. The
 * order of a reduction is fixed, so results do not depend on timing either. Max and min
 * propagate NaN.
 *
 * Messages go over the communicator's private duplicate `sm` (never the user's send/recv
 * tags), tagged with the collective's number, so collectives in flight at the same time
 * never take each other's messages; inside one collective, MPI's non-overtaking order
 * matches the rounds. Above the number's low 16 bits the tag carries bits of a hash of the
 * collective's signature (its operation, count, dtype, reduce op and root; comm_check.c)
 * when MPI's tags are wide enough (MPI_TAG_UB of 2^24 or more), so that ranks whose
 * collectives differ never exchange data: their collective stalls instead, and the check of
 * a stalled collective (the peers' signatures, comm_mpi_ctl.c) names both sides.
 *
 * Progress. The communicator keeps its small collectives in flight in a list (holding a
 * reference to each work). Waiting on or testing any of them advances all of them, in
 * order - two ranks waiting on different collectives must not starve each other - and the
 * control thread advances them every 2 ms, so they also move while the caller computes,
 * and an abandoned (timed-out) one still completes if the late rank arrives. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm_mpi.h"

/* ---- reductions ---------------------------------------------------------------------------- */
/* acc = acc op in (acc_lo: acc holds the lower ranks' part) or in op acc. */
#define RED_FN(NAME, T, EXPR)                                                                   \
    static void NAME(T *restrict acc, const T *restrict in, int64_t n, bool acc_lo) {          \
        if (acc_lo)                                                                             \
            for (int64_t i = 0; i < n; i++) {                                                   \
                T x = acc[i], y = in[i];                                                        \
                acc[i] = EXPR;                                                                  \
            }                                                                                   \
        else                                                                                    \
            for (int64_t i = 0; i < n; i++) {                                                   \
                T x = in[i], y = acc[i];                                                        \
                acc[i] = EXPR;                                                                  \
            }                                                                                   \
    }
#define FMAX (x > y || x != x) ? x : y
#define FMIN (x < y || x != x) ? x : y
RED_FN(sum_f32, float, x + y)
RED_FN(max_f32, float, FMAX)
RED_FN(min_f32, float, FMIN)
RED_FN(sum_f64, double, x + y)
RED_FN(max_f64, double, FMAX)
RED_FN(min_f64, double, FMIN)
/* Integer sums wrap (computed unsigned: signed overflow is undefined in C). */
RED_FN(sum_i32, int32_t, (int32_t)((uint32_t)x + (uint32_t)y))
RED_FN(max_i32, int32_t, x > y ? x : y)
RED_FN(min_i32, int32_t, x < y ? x : y)
RED_FN(sum_i64, int64_t, (int64_t)((uint64_t)x + (uint64_t)y))
RED_FN(max_i64, int64_t, x > y ? x : y)
RED_FN(min_i64, int64_t, x < y ? x : y)
RED_FN(sum_u8, uint8_t, (uint8_t)(x + y))
RED_FN(max_u8, uint8_t, x > y ? x : y)
RED_FN(min_u8, uint8_t, x < y ? x : y)

/* The dtype a reduction runs in (halves in f32 staging; bool as bytes) */
static nb_dtype red_dtype(nb_dtype dt) {
    return nb__mpi_is_half(dt) ? NB_F32 : dt == NB_BOOL ? NB_U8 : dt;
}

static void reduce_into(const nb__args *a, void *acc, const void *in, int64_t n, bool acc_lo) {
    /* bool: sum and max are a logical or (max of 0/1 bytes), min a logical and. */
    nb_reduce_op op = a->op == NB_REDUCE_AVG ? NB_REDUCE_SUM : a->op;
    if (a->dtype == NB_BOOL && op == NB_REDUCE_SUM) op = NB_REDUCE_MAX;
    int k = op == NB_REDUCE_SUM ? 0 : op == NB_REDUCE_MAX ? 1 : 2;
    switch (red_dtype(a->dtype)) {
    case NB_F32: (k == 0 ? sum_f32 : k == 1 ? max_f32 : min_f32)(acc, in, n, acc_lo); break;
    case NB_F64: (k == 0 ? sum_f64 : k == 1 ? max_f64 : min_f64)(acc, in, n, acc_lo); break;
    case NB_I32: (k == 0 ? sum_i32 : k == 1 ? max_i32 : min_i32)(acc, in, n, acc_lo); break;
    case NB_I64: (k == 0 ? sum_i64 : k == 1 ? max_i64 : min_i64)(acc, in, n, acc_lo); break;
    default: (k == 0 ? sum_u8 : k == 1 ? max_u8 : min_u8)(acc, in, n, acc_lo); break;
    }
}

/* ---- schedules ----------------------------------------------------------------------------- */
enum { ALG_TRIVIAL, ALG_RD, ALG_RAB, ALG_REDUCE, ALG_BCAST, ALG_ALLGATHER, ALG_RS, ALG_A2A,
       ALG_BARRIER };

/* Allreduces up to this size use recursive doubling (every message the whole buffer, in
 * pieces: the fewest rounds), larger ones Rabenseifner's. Measured on 2 ranks: one round
 * of pieces takes 0.6-0.95 of the time of two rounds of halves at 4 KiB, about as long at
 * 8 and 16 KiB. */
#define NB__MPI_RD_BYTES 8192

typedef struct {
    nb_work *w;
    nb__mpi_ws *s;
    const nb__args *a;
    int rank, size;
    int64_t es; /* bytes per element on the wire (f32 for staged halves) */
} ctx;

static ctx ctx_of(nb_work *w) {
    ctx c = {w, nb__mpi_ws_of(w), &w->a, w->comm->rank, w->comm->size, 0};
    c.es = nb__mpi_is_half(w->a.dtype) &&
                   (w->a.kind == NB__COLL_ALLREDUCE || w->a.kind == NB__COLL_REDUCE ||
                    w->a.kind == NB__COLL_REDUCE_SCATTER)
               ? 4
               : (int64_t)nb_dtype_size(w->a.dtype);
    return c;
}

static int mod(int x, int p) { return ((x % p) + p) % p; }

/* Block j of n elements split over p ranks (nb_comm_chunk's rule): offset, length. */
static int64_t blk(int64_t n, int p, int j, int64_t *len) {
    int64_t b, e;
    nb_comm_chunk(n, p, j, &b, &e);
    *len = e - b;
    return b;
}

static int pof2_below(int p) { /* largest power of two <= p */
    int q = 1;
    while (q * 2 <= p) q *= 2;
    return q;
}
static int log2i(int q) {
    int l = 0;
    while ((1 << l) < q) l++;
    return l;
}

/* The reduction's working data: the f32 staging of halves, else the tensor's buffer. */
static char *rdata(const ctx *c) { return c->s->fa ? (char *)c->s->fa : (char *)c->a->buf; }

/* Messages up to NB__MPI_PIECED_BYTES go in pieces of at most NB__MPI_PIECE_BYTES: each
 * stays within Open MPI's shared-memory eager limit (4 KiB with its header), which delivers
 * it at once, where a larger one waits for a rendezvous handshake. Measured on 2 ranks: a
 * 4 KiB allreduce takes 2.0-2.3 us as two pieces (3.3-3.7 in some runs) against 3.3-3.5 us
 * as one message; smaller pieces are slower (more messages). Larger messages go whole (the
 * single-copy transfers of the rendezvous win there). */
#define NB__MPI_PIECE_BYTES 3968
#define NB__MPI_PIECED_BYTES 8192

/* The most requests one message of up to `bytes` needs (smaller ones may be pieced). */
static int max_pieces(int64_t bytes) {
    int64_t b = bytes < NB__MPI_PIECED_BYTES ? bytes : NB__MPI_PIECED_BYTES;
    return b > NB__MPI_PIECE_BYTES ? (int)((b - 1) / NB__MPI_PIECE_BYTES + 1) : 1;
}

static int post_one(const ctx *c, bool recv, void *buf, int64_t bytes, int peer) {
    nb__mpi_ws *s = c->s;
    MPI_Comm comm = nb__mpi_of(c->w->comm)->sm;
    int64_t piece = bytes <= NB__MPI_PIECED_BYTES ? NB__MPI_PIECE_BYTES : bytes;
    int64_t off = 0;
    do {
        int len = (int)(bytes - off < piece ? bytes - off : piece);
        int rc = recv ? MPI_Irecv((char *)buf + off, len, MPI_BYTE, peer, s->tag, comm,
                                  &s->rq[s->nreq])
                      : MPI_Isend((char *)buf + off, len, MPI_BYTE, peer, s->tag, comm,
                                  &s->rq[s->nreq]);
        if (rc != MPI_SUCCESS) return rc;
        s->nreq++;
        off += len;
    } while (off < bytes);
    return MPI_SUCCESS;
}

/* Post this round's messages (counts in elements; peer < 0: none). Pieces of one message
 * match in order: MPI does not let messages with the same source, tag and communicator
 * overtake each other. */
static int post(const ctx *c, const void *sbuf, int64_t scount, int dst, void *rbuf,
                int64_t rcount, int src) {
    int rc = MPI_SUCCESS;
    if (src >= 0) rc = post_one(c, true, rbuf, rcount * c->es, src);
    c->s->nrecv = c->s->nreq; /* the receives come first in rq */
    if (rc == MPI_SUCCESS && dst >= 0)
        rc = post_one(c, false, nb__unconst(sbuf), scount * c->es, dst);
    return rc;
}

/* Recursive doubling: round 0 folds ranks 2i (< 2 rem) into 2i + 1, rounds 1..L exchange
 * with the partner at distance 2^(k-1) among the remaining power of two, round L + 1 hands
 * the result back to the folded ranks. */
static int rd_newrank(int r, int rem) { return r < 2 * rem ? (r % 2 ? r / 2 : -1) : r - rem; }
static int rd_real(int nr, int rem) { return nr < rem ? 2 * nr + 1 : nr + rem; }

static int rd_post(const ctx *c, int k) {
    int p = c->size, r = c->rank, q = pof2_below(p), rem = p - q, L = log2i(q);
    int64_t n = c->a->count;
    char *d = rdata(c);
    if (k == 0 || k == L + 1) {
        if (r >= 2 * rem) return MPI_SUCCESS;
        bool even = r % 2 == 0;
        if ((k == 0) == even) return post(c, d, n, k == 0 ? r + 1 : r - 1, NULL, 0, -1);
        return post(c, NULL, 0, -1, k == 0 ? c->s->tmp : d, n, k == 0 ? r - 1 : r + 1);
    }
    int nr = rd_newrank(r, rem);
    if (nr < 0) return MPI_SUCCESS;
    int peer = rd_real(nr ^ (1 << (k - 1)), rem);
    return post(c, d, n, peer, c->s->tmp, n, peer);
}

static void rd_finish(const ctx *c, int k) {
    int p = c->size, r = c->rank, q = pof2_below(p), rem = p - q, L = log2i(q);
    if (k == L + 1) return;
    if (k == 0) {
        if (r < 2 * rem && r % 2) reduce_into(c->a, rdata(c), c->s->tmp, c->a->count, false);
        return;
    }
    int nr = rd_newrank(r, rem);
    if (nr < 0) return;
    int partner = nr ^ (1 << (k - 1));
    reduce_into(c->a, rdata(c), c->s->tmp, c->a->count, nr < partner);
}

/* Rabenseifner's allreduce: the fold rounds of recursive doubling around a reduce-scatter
 * by recursive halving (rounds 1..L: exchange half of the current range with the partner at
 * distance q/2, q/4, .., 1 and add the received half to the kept one, so that new rank i
 * ends owning block i of q) and an allgather by recursive doubling (rounds L+1..2L). Every
 * rank sends and reduces less than the whole buffer once, in 2 log2(q) rounds: on 2 ranks
 * it is the ring (each reduces one half and sends each half once). An average divides the
 * owned block only. */
static int64_t rab_start(const ctx *c, int q, int j) { /* first element of block j of q */
    int64_t len;
    return j >= q ? c->a->count : blk(c->a->count, q, j, &len);
}

static int rab_post(const ctx *c, int k) {
    int p = c->size, r = c->rank, q = pof2_below(p), rem = p - q, L = log2i(q);
    if (k == 0 || k == 2 * L + 1) return rd_post(c, k == 0 ? 0 : L + 1); /* the folds */
    int nr = rd_newrank(r, rem);
    if (nr < 0) return MPI_SUCCESS;
    char *d = rdata(c);
    int64_t es = c->es;
    if (k <= L) { /* reduce-scatter: keep the half of [base, base + 2h) with nr in it */
        int h = q >> k, partner = nr ^ h, base = nr & ~(2 * h - 1);
        int keep = nr & h ? base + h : base, give = nr & h ? base : base + h;
        int64_t ko = rab_start(c, q, keep), go = rab_start(c, q, give);
        return post(c, d + go * es, rab_start(c, q, give + h) - go, rd_real(partner, rem),
                    c->s->tmp, rab_start(c, q, keep + h) - ko, rd_real(partner, rem));
    }
    int h = 1 << (k - L - 1), partner = nr ^ h; /* allgather: swap owned ranges of h blocks */
    int mine = nr & ~(h - 1), theirs = partner & ~(h - 1);
    int64_t mo = rab_start(c, q, mine), to = rab_start(c, q, theirs);
    return post(c, d + mo * es, rab_start(c, q, mine + h) - mo, rd_real(partner, rem),
                d + to * es, rab_start(c, q, theirs + h) - to, rd_real(partner, rem));
}

static void rab_finish(const ctx *c, int k) {
    int p = c->size, r = c->rank, q = pof2_below(p), rem = p - q, L = log2i(q);
    if (k == 0) {
        rd_finish(c, 0);
        return;
    }
    int nr = rd_newrank(r, rem);
    if (k > L || nr < 0) return;
    int h = q >> k, partner = nr ^ h, base = nr & ~(2 * h - 1), keep = nr & h ? base + h : base;
    int64_t ko = rab_start(c, q, keep), len = rab_start(c, q, keep + h) - ko;
    char *b = rdata(c) + ko * c->es;
    reduce_into(c->a, b, c->s->tmp, len, nr < partner);
    if (k == L && c->a->op == NB_REDUCE_AVG) /* b is block nr now, complete */
        nb__comm_scale(b, len, c->s->fa ? NB_F32 : c->a->dtype, 1.0 / p);
}

/* Binomial trees over ranks relative to the root, v = (r - root) mod p. Reduce: in round k
 * a rank with bit k as its lowest set bit sends its partial result to v - 2^k and is done;
 * the others receive from v + 2^k (when it exists) and add it (theirs is the lower part).
 * Broadcast: in round k ranks v < 2^k send to v + 2^k. */
static int reduce_post(const ctx *c, int k) {
    int p = c->size, root = c->a->peer, v = mod(c->rank - root, p), mask = 1 << k;
    if (v & (mask - 1)) return MPI_SUCCESS; /* sent already */
    const nb__mpi_ws *s = c->s;
    int64_t n = c->a->count;
    if (v & mask) return post(c, s->acc, n, mod(v - mask + root, p), NULL, 0, -1);
    if (v + mask < p) return post(c, NULL, 0, -1, s->tmp, n, mod(v + mask + root, p));
    return MPI_SUCCESS;
}

static void reduce_finish(const ctx *c, int k) {
    int p = c->size, v = mod(c->rank - c->a->peer, p), mask = 1 << k;
    if (!(v & (2 * mask - 1)) && v + mask < p)
        reduce_into(c->a, c->s->acc, c->s->tmp, c->a->count, true);
}

static int bcast_post(const ctx *c, int k) {
    int p = c->size, root = c->a->peer, v = mod(c->rank - root, p), mask = 1 << k;
    char *d = c->a->buf;
    int64_t n = c->a->count;
    if (v < mask && v + mask < p) return post(c, d, n, mod(v + mask + root, p), NULL, 0, -1);
    if (v >= mask && v < 2 * mask) return post(c, NULL, 0, -1, d, n, mod(v - mask + root, p));
    return MPI_SUCCESS;
}

/* Allgather ring: out's block r (copied from in at the start) travels right. */
static int64_t ag_blk(const ctx *c, int j, int64_t *len) {
    if (c->a->chunked) return blk(c->a->out_count, c->size, j, len);
    *len = c->a->in_count;
    return (int64_t)j * c->a->in_count;
}

static int ag_post(const ctx *c, int k) {
    int p = c->size, r = c->rank;
    int64_t sl, rl, so = ag_blk(c, mod(r - k, p), &sl), ro = ag_blk(c, mod(r - k - 1, p), &rl);
    char *o = c->a->out;
    return post(c, o + so * c->es, sl, mod(r + 1, p), o + ro * c->es, rl,
                mod(r - 1, p));
}

/* Reduce-scatter ring over nb_comm_chunk's blocks of in: in round k a rank sends block
 * r - k - 1 (its input's in round 0, afterwards the partial sum it made in the round
 * before) and adds the received partial of block r - k - 2 to its own input's, so that it
 * ends with block r. Partials alternate between two scratch blocks (one is being sent while
 * the other is computed); the last goes to the output. */
static const char *rs_in(const ctx *c) {
    return c->s->fa ? (const char *)c->s->fa : (const char *)c->a->in;
}
static char *rs_out(const ctx *c) { return c->s->fb ? (char *)c->s->fb : (char *)c->a->out; }
static int64_t rs_cap(const ctx *c) { /* elements of one scratch block */
    return (c->a->in_count + c->size - 1) / c->size;
}

static int rs_post(const ctx *c, int k) {
    int p = c->size, r = c->rank;
    int64_t sl, rl, so = blk(c->a->in_count, p, mod(r - k - 1, p), &sl);
    blk(c->a->in_count, p, mod(r - k - 2, p), &rl);
    const char *src = k == 0 ? rs_in(c) + so * c->es
                             : c->s->tmp + (int64_t)(1 + (k - 1) % 2) * rs_cap(c) * c->es;
    return post(c, src, sl, mod(r + 1, p), c->s->tmp, rl, mod(r - 1, p));
}

static void rs_finish(const ctx *c, int k) {
    int p = c->size, r = c->rank;
    int64_t len, off = blk(c->a->in_count, p, mod(r - k - 2, p), &len);
    char *dst = k == p - 2 ? rs_out(c) : c->s->tmp + (1 + k % 2) * rs_cap(c) * c->es;
    if (len > 0) memcpy(dst, rs_in(c) + off * c->es, (size_t)(len * c->es));
    reduce_into(c->a, dst, c->s->tmp, len, false);
}

/* All-to-all, pairwise: in round k (1..p-1 as k + 1) send to r + k + 1, receive from
 * r - k - 1. */
static int a2a_post(const ctx *c, int k) {
    int p = c->size, r = c->rank, to = mod(r + k + 1, p), from = mod(r - k - 1, p);
    int64_t b = c->a->in_count / p;
    return post(c, (const char *)c->a->in + (int64_t)to * b * c->es, b, to,
                (char *)c->a->out + (int64_t)from * b * c->es, b, from);
}

/* Dissemination barrier: round k signals r + 2^k and waits for r - 2^k. */
static int barrier_post(const ctx *c, int k) {
    static char none;
    int p = c->size, r = c->rank;
    return post(c, &none, 0, mod(r + (1 << k), p), &none, 0, mod(r - (1 << k), p));
}

static int post_round(const ctx *c, int k) {
    switch (c->s->alg) {
    case ALG_RD: return rd_post(c, k);
    case ALG_RAB: return rab_post(c, k);
    case ALG_REDUCE: return reduce_post(c, k);
    case ALG_BCAST: return bcast_post(c, k);
    case ALG_ALLGATHER: return ag_post(c, k);
    case ALG_RS: return rs_post(c, k);
    case ALG_A2A: return a2a_post(c, k);
    case ALG_BARRIER: return barrier_post(c, k);
    default: return MPI_SUCCESS;
    }
}

/* Whether round k's local work leaves the buffers that round sends alone, so that it can
 * run as soon as the round's data is in, while the sends still wait for the end of their
 * handshake (for a message above the eager size, the receiver's acknowledgement). Not in
 * recursive doubling, which reduces into the buffer it sends. */
static bool finish_early(const ctx *c, int k) {
    switch (c->s->alg) {
    case ALG_RD: return k == 0; /* the fold: the receiving rank sends nothing */
    case ALG_RAB:
    case ALG_REDUCE:
    case ALG_RS: return true;
    default: return false;
    }
}

static void finish_round(const ctx *c, int k) {
    switch (c->s->alg) {
    case ALG_RD: rd_finish(c, k); break;
    case ALG_RAB: rab_finish(c, k); break;
    case ALG_REDUCE: reduce_finish(c, k); break;
    case ALG_RS: rs_finish(c, k); break;
    default: break;
    }
}

/* ---- setting up and ending ---------------------------------------------------------------- */
/* Choose the schedule and set up staging and scratch. false: out of memory. */
static bool setup(ctx *c) {
    nb__mpi_ws *s = c->s;
    const nb__args *a = c->a;
    int p = c->size, r = c->rank, L = log2i(p);
    bool half = nb__mpi_is_half(a->dtype);
    size_t scratch = 0; /* elements */
    switch (a->kind) {
    case NB__COLL_ALLREDUCE:
        if (p == 1) s->alg = ALG_TRIVIAL, s->nrounds = 0;
        else if (a->count * c->es <= NB__MPI_RD_BYTES || a->count < p)
            s->alg = ALG_RD, s->nrounds = log2i(pof2_below(p)) + 2, scratch = (size_t)a->count;
        else {
            int q = pof2_below(p);
            s->alg = ALG_RAB, s->nrounds = 2 * log2i(q) + 2;
            /* The largest receive: the folded rank's whole buffer, else half of it. */
            bool folded_in = r < 2 * (p - q) && r % 2;
            scratch = (size_t)(folded_in ? a->count : (a->count + q - 1) / q * (q / 2));
        }
        break;
    case NB__COLL_REDUCE: {
        s->alg = ALG_REDUCE, s->nrounds = L;
        int v = mod(r - a->peer, p);
        bool receives = v % 2 == 0 && v + 1 < p;
        scratch = receives ? (size_t)a->count * (v && !half ? 2 : 1) : 0;
        break;
    }
    case NB__COLL_BROADCAST: s->alg = ALG_BCAST, s->nrounds = L; break;
    case NB__COLL_ALLGATHER: s->alg = ALG_ALLGATHER, s->nrounds = p - 1; break;
    case NB__COLL_REDUCE_SCATTER:
        s->alg = ALG_RS, s->nrounds = p - 1;
        scratch = p > 1 ? 3 * (size_t)((a->in_count + p - 1) / p) : 0;
        break;
    case NB__COLL_ALL_TO_ALL: s->alg = ALG_A2A, s->nrounds = p - 1; break;
    case NB__COLL_BARRIER: s->alg = ALG_BARRIER, s->nrounds = L; break;
    default: NB__ASSERT(!"comm_mpi_small: not a collective");
    }
    /* Half-precision reductions run in f32: fa = the data (or reduce_scatter's input), fb =
     * reduce_scatter's f32 output. */
    if (half && (a->kind == NB__COLL_ALLREDUCE || a->kind == NB__COLL_REDUCE)) {
        if (!(s->fa = nb_host_alloc((size_t)(a->count > 0 ? a->count : 1) * 4))) return false;
        nb__mpi_to_f32(a->dtype, a->buf, s->fa, a->count);
    }
    if (half && a->kind == NB__COLL_REDUCE_SCATTER) {
        if (!(s->fa = nb_host_alloc((size_t)(a->in_count > 0 ? a->in_count : 1) * 4)) ||
            !(s->fb = nb_host_alloc((size_t)(a->out_count > 0 ? a->out_count : 1) * 4)))
            return false;
        nb__mpi_to_f32(a->dtype, a->in, s->fa, a->in_count);
    }
    if (scratch && !(s->tmp = nb_host_alloc(scratch * (size_t)c->es))) return false;
    /* Requests: a round has one message each way, in pieces when small. */
    int64_t maxmsg; /* elements of the largest message */
    switch (a->kind) {
    case NB__COLL_ALLREDUCE:
    case NB__COLL_REDUCE:
    case NB__COLL_BROADCAST: maxmsg = a->count; break;
    case NB__COLL_ALLGATHER: maxmsg = a->chunked ? (a->out_count + p - 1) / p : a->in_count; break;
    case NB__COLL_REDUCE_SCATTER: maxmsg = (a->in_count + p - 1) / p; break;
    case NB__COLL_ALL_TO_ALL: maxmsg = a->in_count / p; break;
    default: maxmsg = 0; break;
    }
    int nreq = 2 * max_pieces(maxmsg * c->es);
    s->rq = s->rq_in;
    if (nreq > (int)(sizeof s->rq_in / sizeof s->rq_in[0]) &&
        !(s->rq = nb_host_alloc(sizeof(MPI_Request) * (size_t)nreq))) {
        s->rq = s->rq_in;
        return false;
    }
    /* Starting points: reduce's accumulator (the root's data; elsewhere a copy, since only
     * the root's tensor changes), a gather's own block, an all-to-all's own block. */
    if (a->kind == NB__COLL_REDUCE) {
        int v = mod(r - a->peer, p);
        if (v == 0 || half) s->acc = rdata(c);
        else if (s->tmp && scratch > (size_t)a->count) { /* receives: tmp | acc */
            s->acc = s->tmp + a->count * c->es;
            memcpy(s->acc, a->buf, (size_t)(a->count * c->es));
        } else s->acc = a->buf; /* only sends it */
    } else if (a->kind == NB__COLL_ALLGATHER) {
        int64_t len, off = ag_blk(c, r, &len);
        if (len > 0) memcpy((char *)a->out + off * c->es, a->in, (size_t)(len * c->es));
    } else if (a->kind == NB__COLL_ALL_TO_ALL) {
        int64_t b = a->in_count / p;
        if (b > 0)
            memcpy((char *)a->out + (int64_t)r * b * c->es,
                   (const char *)a->in + (int64_t)r * b * c->es, (size_t)(b * c->es));
    } else if (a->kind == NB__COLL_REDUCE_SCATTER && p == 1) {
        memcpy(rs_out(c), rs_in(c), (size_t)(a->in_count * c->es));
    }
    return true;
}

static void free_staging(nb__mpi_ws *s) {
    if (s->rq && s->rq != s->rq_in) nb_host_free(s->rq);
    s->rq = s->rq_in;
    if (s->fa) nb_host_free(s->fa);
    if (s->fb) nb_host_free(s->fb);
    if (s->tmp) nb_host_free(s->tmp);
    s->fa = s->fb = NULL;
    s->tmp = NULL;
}

/* After the last round: averages, halves back to their dtype. */
static void finalize(const ctx *c) {
    const nb__args *a = c->a;
    nb__mpi_ws *s = c->s;
    double inv = 1.0 / c->size;
    bool avg = a->op == NB_REDUCE_AVG;
    switch (a->kind) {
    case NB__COLL_ALLREDUCE:
        if (avg && s->alg != ALG_RAB)
            nb__comm_scale(rdata(c), a->count, s->fa ? NB_F32 : a->dtype, inv);
        if (s->fa) nb__mpi_from_f32(a->dtype, s->fa, a->buf, a->count);
        break;
    case NB__COLL_REDUCE:
        if (c->rank != a->peer) break;
        if (avg) nb__comm_scale(rdata(c), a->count, s->fa ? NB_F32 : a->dtype, inv);
        if (s->fa) nb__mpi_from_f32(a->dtype, s->fa, a->buf, a->count);
        break;
    case NB__COLL_REDUCE_SCATTER:
        if (avg) nb__comm_scale(rs_out(c), a->out_count, s->fb ? NB_F32 : a->dtype, inv);
        if (s->fb) nb__mpi_from_f32(a->dtype, s->fb, a->out, a->out_count);
        break;
    default: break;
    }
}

/* The end of w (done or failed): counters, and off the in-flight list by the caller. A
 * failure with messages still posted leaves the buffers to MPI (they leak: MPI may still
 * write into them). */
static void count_end(nb__mpi_comm *m, nb_work *w) {
    if (!w->internal) atomic_fetch_add(&w->comm->completed, 1); /* internal: not numbered */
    atomic_fetch_sub(&m->inflight, 1);
}

static void ended(nb__mpi_comm *m, nb_work *w, int rc) {
    nb__mpi_ws *s = nb__mpi_ws_of(w);
    if (rc != MPI_SUCCESS) {
        for (int i = 0; i < s->nreq; i++)
            if (s->rq[i] != MPI_REQUEST_NULL) MPI_Request_free(&s->rq[i]);
        if (s->nreq) s->fa = s->fb = NULL, s->tmp = NULL;
        s->nreq = 0;
        nb__mpi_fail(w, rc);
    } else {
        ctx c = ctx_of(w);
        finalize(&c);
        nb__work_done(w);
    }
    free_staging(s);
    count_end(m, w);
}

/* Run w's rounds as far as its messages allow. Returns true when it ended. */
static bool advance(nb__mpi_comm *m, nb_work *w) {
    nb__mpi_ws *s = nb__mpi_ws_of(w);
    ctx c = ctx_of(w);
    for (;;) {
        if (s->nreq) {
            int flag = 0, rc;
            if (!s->fin_done && s->nrecv > 0 && finish_early(&c, s->round)) {
                rc = MPI_Testall(s->nrecv, s->rq, &flag, MPI_STATUSES_IGNORE);
                if (rc != MPI_SUCCESS) {
                    ended(m, w, rc);
                    return true;
                }
                if (!flag) return false;
                finish_round(&c, s->round);
                s->fin_done = true;
            }
            rc = MPI_Testall(s->nreq, s->rq, &flag, MPI_STATUSES_IGNORE);
            if (rc != MPI_SUCCESS) {
                ended(m, w, rc);
                return true;
            }
            if (!flag) return false;
            s->nreq = 0;
        }
        if (s->round >= s->nrounds) {
            ended(m, w, MPI_SUCCESS);
            return true;
        }
        if (!s->fin_done) finish_round(&c, s->round);
        s->fin_done = false;
        if (++s->round < s->nrounds) {
            int rc = post_round(&c, s->round);
            if (rc != MPI_SUCCESS) {
                ended(m, w, rc);
                return true;
            }
        }
    }
}

/* ---- the in-flight list ---------------------------------------------------------------------- */
bool nb__mpi_small_ok(const nb_work *w) {
    const nb__args *a = &w->a;
    if (a->kind == NB__COLL_SPLIT || nb__coll_is_p2p(a->kind)) return false;
    int64_t n = a->kind == NB__COLL_ALLGATHER ? a->out_count
                : a->kind == NB__COLL_REDUCE_SCATTER || a->kind == NB__COLL_ALL_TO_ALL
                    ? a->in_count
                    : a->count;
    /* Trees send the whole buffer log2(p) times where MPI pipelines it: a smaller limit. */
    bool tree = a->kind == NB__COLL_BROADCAST || a->kind == NB__COLL_REDUCE;
    int64_t limit = tree ? NB__MPI_TREE_BYTES : NB__MPI_SMALL_BYTES;
    return n * (int64_t)nb_dtype_size(a->dtype) <= limit;
}

bool nb__mpi_small_issue(nb__mpi_comm *m, nb_work *w) {
    nb__mpi_ws *s = nb__mpi_ws_of(w);
    ctx c = ctx_of(w);
    s->sched = true;
    s->fin_done = false;
    s->nreq = s->nrecv = 0;
    s->round = 0;
    uint64_t h = s->sig_hash;
    if (!h) {
        nb__sig sig = nb__work_sig(w);
        h = nb__sig_hash(&sig);
    }
    s->tag = (int)(((uint64_t)w->seq & ((1ull << m->seq_bits) - 1)) |
                   ((h & ((1ull << m->hash_bits) - 1)) << m->seq_bits));
    if (!setup(&c)) {
        free_staging(s);
        nb__work_fail_wrap(w, NB_ENOMEM, "%s on rank %d", nb__coll_name(w->a.kind),
                           w->comm->rank);
        if (!w->internal) atomic_fetch_add(&w->comm->completed, 1);
        return false;
    }
    atomic_fetch_add(&m->inflight, 1);
    atomic_fetch_add(&w->refs, 1); /* the list's */
    pthread_mutex_lock(&m->sm_mu);
    s->sm_next = NULL;
    bool done;
    int rc = s->nrounds > 0 ? post_round(&c, 0) : MPI_SUCCESS;
    if (rc != MPI_SUCCESS) {
        ended(m, w, rc);
        done = true;
    } else {
        done = advance(m, w); /* a schedule without messages (1 rank) ends here */
    }
    if (!done) {
        if (m->sm_tail) nb__mpi_ws_of(m->sm_tail)->sm_next = w;
        else m->sm_head = w;
        m->sm_tail = w;
    }
    pthread_mutex_unlock(&m->sm_mu);
    if (done) nb__work_release(w);
    return true;
}

nb_work *nb__mpi_small_progress(nb__mpi_comm *m, bool try_only) {
    if (try_only) {
        if (pthread_mutex_trylock(&m->sm_mu) != 0) return NULL;
    } else {
        pthread_mutex_lock(&m->sm_mu);
    }
    nb_work *done = NULL, *prev = NULL;
    for (nb_work *w = m->sm_head, *next; w; w = next) {
        next = nb__mpi_ws_of(w)->sm_next;
        if (advance(m, w)) {
            if (prev) nb__mpi_ws_of(prev)->sm_next = next;
            else m->sm_head = next;
            if (m->sm_tail == w) m->sm_tail = prev;
            nb__mpi_ws_of(w)->sm_next = done;
            done = w;
        } else {
            prev = w;
        }
    }
    pthread_mutex_unlock(&m->sm_mu);
    return done;
}

void nb__mpi_small_release(nb_work *done) {
    for (nb_work *w = done, *next; w; w = next) {
        next = nb__mpi_ws_of(w)->sm_next;
        nb__work_release(w);
    }
}

/* Receive and drop the messages of w's collective (by its number's bits in their tags) that
 * the peers sent, whatever their signature; with m->sm_mu held. */
static void drain(nb__mpi_comm *m, nb_work *w) {
    unsigned long long mask = (1ull << m->seq_bits) - 1;
    for (int r = 0; r < w->comm->size; r++) {
        for (;;) {
            int flag = 0, bytes = 0;
            MPI_Status st;
            if (MPI_Iprobe(r, MPI_ANY_TAG, m->sm, &flag, &st) != MPI_SUCCESS || !flag ||
                ((unsigned long long)st.MPI_TAG & mask) != ((unsigned long long)w->seq & mask))
                break; /* none, or the next collective's: stays */
            MPI_Get_count(&st, MPI_BYTE, &bytes);
            void *buf = malloc(bytes > 0 ? (size_t)bytes : 1);
            if (!buf) break;
            MPI_Recv(buf, bytes, MPI_BYTE, r, st.MPI_TAG, m->sm, MPI_STATUS_IGNORE);
            free(buf);
        }
    }
}

void nb__mpi_small_cancel(nb__mpi_comm *m, nb_work *w, const char *msg) {
    pthread_mutex_lock(&m->sm_mu);
    nb_work *prev = NULL, *p = m->sm_head;
    while (p && p != w) prev = p, p = nb__mpi_ws_of(p)->sm_next;
    if (!p) { /* ended meanwhile */
        pthread_mutex_unlock(&m->sm_mu);
        return;
    }
    nb__mpi_ws *s = nb__mpi_ws_of(w);
    if (prev) nb__mpi_ws_of(prev)->sm_next = s->sm_next;
    else m->sm_head = s->sm_next;
    if (m->sm_tail == w) m->sm_tail = prev;
    /* A receive that nothing matched can be cancelled; the wait ends at once either way. The
     * peers' messages of this collective (their tags: its number's bits, their signature's
     * hash) are received and dropped, and they drop this rank's, so that sends too large to
     * go out at once (a rendezvous) complete; a send still pending after a second stays with
     * MPI, with its buffer: the work keeps a reference forever then (its buffers and tensors
     * are never released). */
    for (int i = 0; i < s->nrecv; i++)
        if (s->rq[i] != MPI_REQUEST_NULL) {
            MPI_Cancel(&s->rq[i]);
            MPI_Wait(&s->rq[i], MPI_STATUS_IGNORE);
        }
    int nsend = s->nreq - s->nrecv, done = nsend == 0;
    for (double until = nb__now() + 1.0; !done;) {
        drain(m, w);
        if (MPI_Testall(nsend, s->rq + s->nrecv, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS ||
            done || nb__now() > until)
            break;
        nb__mpi_sleep(0.001);
    }
    drain(m, w);
    bool kept = false;
    for (int i = s->nrecv; !done && i < s->nreq; i++)
        if (s->rq[i] != MPI_REQUEST_NULL) {
            MPI_Request_free(&s->rq[i]);
            kept = true;
        }
    s->nreq = 0;
    if (kept) {
        s->fa = s->fb = NULL, s->tmp = NULL; /* MPI may still read them */
        atomic_fetch_add(&w->refs, 1);
    }
    free_staging(s);
    nb__work_fail(w, NB_ECOMM, "%s", msg);
    count_end(m, w);
    pthread_mutex_unlock(&m->sm_mu);
    nb__work_release(w); /* the list's reference */
}

int nb__mpi_small_poll(nb_work *w) {
    nb__mpi_comm *m = nb__mpi_of(w->comm);
    if (atomic_load(&w->state) == NB__WORK_PENDING)
        nb__mpi_small_release(nb__mpi_small_progress(m, false));
    return atomic_load(&w->state);
}
