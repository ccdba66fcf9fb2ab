/* mesh.c - the device mesh of nabla/mesh.h: named dimensions over the world in Megatron-LM's
 * rank order (tp fastest, then cp, ep, dp, pp), the agreement check every rank passes before
 * anything is split, and one communicator per set of dimensions, made once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/mesh_impl.h"
#include "tensor/tensor_impl.h"

/* Megatron's order, fastest first; the index of a name is its position here. */
static const char *const order[NB__MESH_DIMS] = {"tp", "cp", "ep", "dp", "pp"};

int nb__mesh_dim_index(const char *name, size_t len) {
    for (int i = 0; i < NB__MESH_DIMS; i++)
        if (strlen(order[i]) == len && strncmp(order[i], name, len) == 0) return i;
    return -1;
}

const char *nb__mesh_dim_name(int i) { return i >= 0 && i < NB__MESH_DIMS ? order[i] : "?"; }

/* The set of dimensions named in dims (space-separated) as a bit mask, or -1 + NB_EINVAL. */
static int parse_set(const char *dims, const char *op) {
    if (!dims) return nb__error(NB_ENULL, "%s: the dimension names are NULL", op);
    int set = 0;
    for (const char *p = dims; *p;) {
        while (*p == ' ' || *p == ',') p++;
        size_t n = strcspn(p, " ,");
        if (!n) break;
        int d = nb__mesh_dim_index(p, n);
        if (d < 0)
            return nb__error(NB_EINVAL, "%s: unknown mesh dimension \"%.*s\" (the names are dp, "
                             "pp, tp, cp and ep)", op, (int)n, p);
        set |= 1 << d;
        p += n;
    }
    return set;
}

/* The linear index of coords over the dimensions in set (Megatron's order within them), and
 * the product of their sizes. */
static int index_in(const nb_mesh *m, const int *coord, int set, int *size) {
    int idx = 0, n = 1;
    for (int d = NB__MESH_DIMS - 1; d >= 0; d--) /* slowest first */
        if (set & (1 << d)) idx = idx * m->size[d] + coord[d], n *= m->size[d];
    if (size) *size = n;
    return idx;
}

/* "dp=2 tp=2" as asked (names in the caller's order, -1 as given) into buf: what the ranks
 * compare. */
static void asked(const char *dims, const int *sizes, int n, char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = '\0';
    const char *p = dims;
    for (int i = 0; i < n && at < cap; i++) {
        while (*p == ' ' || *p == ',') p++;
        size_t len = strcspn(p, " ,");
        at += (size_t)snprintf(buf + at, cap - at, "%s%.*s=%d", i ? " " : "", (int)len, p, sizes[i]);
        p += len;
    }
}

/* Every rank's request in one buffer; an error on every rank when they differ. */
static nb_status agree(nb_comm *world, const char *mine) {
    const int W = nb_comm_size(world);
    if (W == 1) return NB_OK;
    nb_status st = NB_OK;
    nb_scope_begin();
    nb_tensor *in = nb_zeros((int64_t[]){NB__MESH_REQ}, 1, NB_U8);
    nb_tensor *all = nb_zeros((int64_t[]){(int64_t)W * NB__MESH_REQ}, 1, NB_U8);
    if (in && all) {
        memcpy(nb_data_ptr(in), mine, strlen(mine) + 1);
        st = nb_allgather(world, all, in);
    } else {
        st = nb_last_status();
    }
    if (st == NB_OK) {
        const char *req = nb_data_ptr(all);
        for (int r = 1; r < W && st == NB_OK; r++)
            if (strncmp(req, req + (size_t)r * NB__MESH_REQ, NB__MESH_REQ) != 0)
                st = nb__error(NB_EINVAL, "mesh: the ranks disagree on the layout: rank 0 asked "
                               "for \"%.*s\", rank %d for \"%.*s\"; every rank must build the "
                               "same mesh", NB__MESH_REQ, req, r, NB__MESH_REQ,
                               req + (size_t)r * NB__MESH_REQ);
    }
    nb_scope_end();
    return st;
}

nb_mesh *nb_mesh_new(nb_comm *world, const char *dims, const int *sizes) {
    static const char op[] = "mesh";
    if (!world || !dims || !sizes) {
        nb__error(NB_ENULL, "%s: %s is NULL", op, !world ? "the world communicator"
                                                  : !dims ? "dims" : "sizes");
        return NULL;
    }
    /* Count the names first (the request compared between ranks lists them all). */
    int n = 0;
    for (const char *p = dims; *p;) {
        while (*p == ' ' || *p == ',') p++;
        size_t len = strcspn(p, " ,");
        if (!len) break;
        n++;
        p += len;
        if (n > NB__MESH_DIMS) break;
    }
    if (n > NB__MESH_DIMS) {
        nb__error(NB_EINVAL, "%s: more than %d dimensions in \"%s\"", op, NB__MESH_DIMS, dims);
        return NULL;
    }
    char req[NB__MESH_REQ];
    asked(dims, sizes, n, req, sizeof req);
    if (agree(world, req) != NB_OK) return NULL;
    /* Every rank asked the same: the checks below fail alike everywhere. */
    nb_mesh *m = calloc(1, sizeof *m);
    if (!m) {
        nb__error(NB_ENOMEM, "%s: out of memory", op);
        return NULL;
    }
    m->world = world;
    for (int d = 0; d < NB__MESH_DIMS; d++) m->size[d] = 1;
    const int W = nb_comm_size(world);
    int rest = -1, prod = 1, seen = 0;
    const char *p = dims;
    for (int i = 0; i < n; i++) {
        while (*p == ' ' || *p == ',') p++;
        size_t len = strcspn(p, " ,");
        int d = nb__mesh_dim_index(p, len);
        if (d < 0) {
            nb__error(NB_EINVAL, "%s: unknown mesh dimension \"%.*s\" (the names are dp, pp, tp, "
                      "cp and ep)", op, (int)len, p);
            goto fail;
        }
        if (seen & (1 << d)) {
            nb__error(NB_EINVAL, "%s: dimension %s is named twice in \"%s\"", op, order[d], dims);
            goto fail;
        }
        seen |= 1 << d;
        if (sizes[i] == -1 && rest < 0) {
            rest = d;
        } else if (sizes[i] < 1) {
            nb__error(NB_EINVAL, "%s: the size of %s must be >= 1 (or -1 for one dimension: the "
                      "rest of the world), got %d", op, order[d], sizes[i]);
            goto fail;
        } else {
            m->size[d] = sizes[i];
            prod *= sizes[i];
        }
        p += len;
    }
    if (rest >= 0) {
        if (W % prod) {
            nb__error(NB_EINVAL, "%s: the world size %d does not divide by the other dimensions' "
                      "product %d (%s), so %s cannot take the rest", op, W, prod, req, order[rest]);
            goto fail;
        }
        m->size[rest] = W / prod;
        prod = W;
    }
    if (prod != W) {
        nb__error(NB_EINVAL, "%s: \"%s\" makes %d ranks but the world has %d", op, req, prod, W);
        goto fail;
    }
    /* This rank's coordinates: tp varies fastest. */
    int r = nb_comm_rank(world);
    for (int d = 0; d < NB__MESH_DIMS; d++) {
        m->coord[d] = r % m->size[d];
        r /= m->size[d];
    }
    /* One communicator per set of dimensions of size > 1 (the others add nothing): color =
     * the coordinates outside the set, key = the index inside it. */
    int big = 0;
    for (int d = 0; d < NB__MESH_DIMS; d++)
        if (m->size[d] > 1) big |= 1 << d;
    for (int set = 1; set < (1 << NB__MESH_DIMS); set++) {
        if ((set & big) != set) continue;
        int gsize, key = index_in(m, m->coord, set, &gsize);
        if (gsize == W) {
            m->group[set] = world;
            continue;
        }
        int color = index_in(m, m->coord, big & ~set, NULL);
        if (!(m->group[set] = nb_comm_split(world, color, key))) goto fail;
        m->owned[set] = true;
    }
    if (!(m->self = nb_comm_self())) goto fail;
    m->group[0] = m->self;
    /* the description: dimensions of size > 1, slowest first */
    size_t at = 0;
    for (int d = NB__MESH_DIMS - 1; d >= 0; d--)
        if (m->size[d] > 1)
            at += (size_t)snprintf(m->desc + at, sizeof m->desc - at, "%s%s=%d", at ? " " : "",
                                   order[d], m->size[d]);
    if (!at) snprintf(m->desc, sizeof m->desc, "dp=1");
    return m;
fail:
    nb_mesh_free(m);
    return NULL;
}

void nb_mesh_free(nb_mesh *m) {
    if (!m) return;
    for (int s = 0; s < (1 << NB__MESH_DIMS); s++)
        if (m->owned[s]) nb_comm_free(m->group[s]);
    nb_comm_free(m->self);
    free(m);
}

/* The mask of dims restricted to the dimensions of size > 1, or -1. */
static int big_set(const nb_mesh *m, const char *dims, const char *op) {
    if (!m) return nb__error(NB_ENULL, "%s: the mesh is NULL", op);
    int set = parse_set(dims, op);
    if (set < 0) return set;
    for (int d = 0; d < NB__MESH_DIMS; d++)
        if (m->size[d] == 1) set &= ~(1 << d);
    return set;
}

int nb_mesh_size(const nb_mesh *m, const char *dims) {
    int set = big_set(m, dims, "mesh_size");
    if (set < 0) return set;
    int n;
    index_in(m, m->coord, set, &n);
    return n;
}

int nb_mesh_rank(const nb_mesh *m, const char *dims) {
    int set = big_set(m, dims, "mesh_rank");
    return set < 0 ? set : index_in(m, m->coord, set, NULL);
}

nb_comm *nb_mesh_group(const nb_mesh *m, const char *dims) {
    int set = big_set(m, dims, "mesh_group");
    return set < 0 ? NULL : m->group[set];
}

nb_comm *nb_mesh_world(const nb_mesh *m) { return m ? m->world : NULL; }
const char *nb_mesh_describe(const nb_mesh *m) { return m ? m->desc : "(null)"; }

int nb__mesh_coord(const nb_mesh *m, int d) { return m && d >= 0 && d < NB__MESH_DIMS ? m->coord[d] : 0; }
int nb__mesh_dim_size(const nb_mesh *m, int d) { return m && d >= 0 && d < NB__MESH_DIMS ? m->size[d] : 1; }
