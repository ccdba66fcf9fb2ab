/* tp_ops.c - the autograd-aware collectives of nabla/tp.h: one op, "collective"
 * (tensor/op_table.h), whose node records which mapping ran, along which dim, over which
 * communicator; its backward rule runs the dual mapping (docs/architecture.md rule 1: the
 * op's checks, forward and backward rule are defined here, once). The forwards and the
 * backwards share the six plain (non-recording) mappings below. */
#include <stdint.h>
#include <time.h>

#include "nabla/tp.h"
#include "tensor/tape.h"

typedef enum kind { K_COPY, K_REDUCE, K_GATHER, K_SPLIT, K_RS, K_AG } kind;
static const char *const kind_names[] = {"copy_to_region", "reduce_from_region", "gather_along",
                                         "split_along", "reduce_scatter_along", "allgather_along"};

/* dims [d, 0, .., d-1, d+1, ..]: d first; inv puts it back. */
static void perms(int nd, int d, int *fwd, int *inv) {
    fwd[0] = d;
    for (int j = 0, k = 1; j < nd; j++)
        if (j != d) fwd[k++] = j;
    for (int j = 0; j < nd; j++) inv[fwd[j]] = j;
}

/* x with dim d moved to the front, contiguous. */
static nb_tensor *front(nb_tensor *x, int d) {
    int f[NB_MAX_DIMS], inv[NB_MAX_DIMS];
    perms(x->ndim, d, f, inv);
    return nb_contiguous(nb_permute(x, f, x->ndim));
}
/* The inverse of front (dim 0 of y goes back to d), contiguous. */
static nb_tensor *back(nb_tensor *y, int d) {
    int f[NB_MAX_DIMS], inv[NB_MAX_DIMS];
    perms(y->ndim, d, f, inv);
    return nb_contiguous(nb_permute(y, inv, y->ndim));
}

static nb_tensor *allreduce_copy(nb_tensor *x, nb_comm *c) {
    nb_tensor *y = nb_clone(x);
    return y && nb_allreduce(c, y, NB_REDUCE_SUM) == NB_OK ? y : NULL;
}

static nb_tensor *gather_dim(nb_tensor *x, nb_comm *c, int d) {
    nb_tensor *xf = front(x, d);
    if (!xf) return NULL;
    int64_t shape[NB_MAX_DIMS];
    for (int i = 0; i < xf->ndim; i++) shape[i] = xf->shape[i];
    shape[0] *= nb_comm_size(c);
    nb_tensor *out = nb_empty_on(nb_tensor_device(xf), shape, xf->ndim, xf->dtype);
    if (!out || nb_allgather(c, out, xf) != NB_OK) return NULL;
    return back(out, d);
}

static nb_tensor *split_dim(nb_tensor *x, nb_comm *c, int d) {
    const int64_t n = x->shape[d] / nb_comm_size(c);
    return nb_contiguous(nb_narrow(x, d, n * nb_comm_rank(c), n));
}

static nb_tensor *reduce_scatter_dim(nb_tensor *x, nb_comm *c, int d) {
    nb_tensor *xf = front(x, d);
    if (!xf) return NULL;
    int64_t shape[NB_MAX_DIMS];
    for (int i = 0; i < xf->ndim; i++) shape[i] = xf->shape[i];
    shape[0] /= nb_comm_size(c);
    nb_tensor *out = nb_empty_on(nb_tensor_device(xf), shape, xf->ndim, xf->dtype);
    if (!out || nb_reduce_scatter(c, out, xf, NB_REDUCE_SUM) != NB_OK) return NULL;
    return back(out, d);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* What this thread's collectives moved (nb_tp_comm_stats). */
static _Thread_local nb_tp_comm_stats stats;

void nb_tp_comm_stats_get(nb_tp_comm_stats *out) {
    if (out) *out = stats;
}
void nb_tp_comm_stats_reset(void) { stats = (nb_tp_comm_stats){0}; }

/* Run mapping k without recording. */
static nb_tensor *run(kind k, nb_tensor *x, nb_comm *c, int d) {
    const double t0 = now_s();
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin(); /* the staging copies go at once, not with the caller's scope */
    nb_tensor *y = NULL;
    switch (k) {
    case K_COPY: y = nb_detach(x); break;
    case K_REDUCE: y = allreduce_copy(x, c); break;
    case K_GATHER:
    case K_AG: y = gather_dim(x, c, d); break;
    case K_SPLIT: y = split_dim(x, c, d); break;
    case K_RS: y = reduce_scatter_dim(x, c, d); break;
    }
    nb_keep(y);
    nb_scope_end();
    nb_set_grad_enabled(prev);
    if (y && k != K_COPY && k != K_SPLIT) { /* the others communicate */
        const nb_tensor *whole = k == K_GATHER || k == K_AG ? y : x;
        const int p = nb_comm_size(c);
        /* what each rank sends over a ring: 2 (p-1)/p of the whole for an allreduce,
         * (p-1)/p for an all-gather or a reduce-scatter */
        const int64_t n = nb_numel(whole) * (int64_t)nb_dtype_size(x->dtype) / p * (p - 1);
        stats.calls++;
        stats.bytes += k == K_REDUCE ? 2 * n : n;
        stats.seconds += now_s() - t0;
    }
    return y;
}

static const kind dual[] = {[K_COPY] = K_REDUCE, [K_REDUCE] = K_COPY, [K_GATHER] = K_SPLIT,
                            [K_SPLIT] = K_AG, [K_RS] = K_AG, [K_AG] = K_RS};

static nb_tensor *collective(kind k, nb_tensor *x, nb_comm *c, int dim) {
    const char *op = kind_names[k];
    NB__CHECK_ARG(x, op, "x");
    if (!c) {
        nb__error(NB_ENULL, "%s: communicator is NULL", op);
        return NULL;
    }
    int d = 0;
    if (k >= K_GATHER) {
        d = dim < 0 ? dim + x->ndim : dim;
        if (d < 0 || d >= x->ndim) {
            nb__error(NB_EINVAL, "%s: dim %d is out of range for a %d-D tensor", op, dim, x->ndim);
            return NULL;
        }
        if ((k == K_SPLIT || k == K_RS) && x->shape[d] % nb_comm_size(c) != 0) {
            nb__error(NB_ESHAPE, "%s: size %lld along dim %d does not divide by the group size %d",
                      op, (long long)x->shape[d], d, nb_comm_size(c));
            return NULL;
        }
    }
    nb_tensor *y = run(k, x, c, d);
    nb__node *nd = y ? nb__record(y, NB__OP_COLLECTIVE, &x, 1) : NULL;
    if (nd) {
        nd->attrs.i[0] = dual[k];
        nd->attrs.i[1] = d;
        nd->attrs.i[2] = (int64_t)(intptr_t)c; /* borrowed: must outlive the graph */
        nd->attrs.ni = 3;
    }
    return y;
}

nb_status nb__bw_COLLECTIVE(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    nb_comm *c = (nb_comm *)(intptr_t)n->attrs.i[2];
    gin[0] = run((kind)n->attrs.i[0], g, c, (int)n->attrs.i[1]);
    return gin[0] ? NB_OK : nb_last_status();
}

nb_tensor *nb_copy_to_region(nb_tensor *x, nb_comm *c) { return collective(K_COPY, x, c, 0); }
nb_tensor *nb_reduce_from_region(nb_tensor *x, nb_comm *c) { return collective(K_REDUCE, x, c, 0); }
nb_tensor *nb_gather_along(nb_tensor *x, nb_comm *c, int dim) { return collective(K_GATHER, x, c, dim); }
nb_tensor *nb_split_along(nb_tensor *x, nb_comm *c, int dim) { return collective(K_SPLIT, x, c, dim); }
nb_tensor *nb_reduce_scatter_along(nb_tensor *x, nb_comm *c, int dim) {
    return collective(K_RS, x, c, dim);
}
nb_tensor *nb_allgather_along(nb_tensor *x, nb_comm *c, int dim) {
    return collective(K_AG, x, c, dim);
}

nb_tensor *nb_tp_slice(nb_tensor *t, int dim, int rank, int size) {
    NB__CHECK_ARG(t, "tp_slice", "t");
    int d = dim < 0 ? dim + t->ndim : dim;
    if (d < 0 || d >= t->ndim || size < 1 || rank < 0 || rank >= size) {
        nb__error(NB_EINVAL, "tp_slice: dim %d, rank %d of %d do not fit a %d-D tensor", dim,
                  rank, size, t->ndim);
        return NULL;
    }
    if (t->shape[d] % size) {
        nb__error(NB_ESHAPE, "tp_slice: size %lld along dim %d does not divide by %d",
                  (long long)t->shape[d], d, size);
        return NULL;
    }
    const int64_t n = t->shape[d] / size;
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin(); /* the view goes with it, also for a caller without a scope */
    nb_tensor *y = nb_keep(nb_clone(nb_narrow(t, d, n * rank, n)));
    nb_scope_end();
    nb_set_grad_enabled(prev);
    return y;
}
