/* matmul.c - nb_matmul: torch.matmul semantics on top of the `gemm` kernel
 * (tensor/kernels/matmul.h).
 *
 * Shapes: 1-D @ 1-D is a dot product (0-dim result); 2-D @ 2-D a matrix product; a 1-D left
 * operand is promoted to (1, K) and a 1-D right operand to (K, 1), and the added dim is
 * removed from the result; more dims are batch dims, broadcast NumPy-style:
 *     (2,1,3,4) @ (5,4,6) -> (2,5,3,6).
 *
 * No hidden copies: each 2-D slice whose strides are row-major (stride[-1] == 1,
 * stride[-2] >= cols) or column-major (stride[-2] == 1, stride[-1] >= rows) is handed to the
 * GEMM as it is, with a transpose flag and its leading dimension, so nb_transpose views (the
 * weight of a Linear layer, dY^T in a weight gradient) cost nothing. Only other layouts (a
 * stride of 2 in both dims, an expanded inner dim) are made contiguous first.
 *
 * Batches: when the right operand is the same matrix for every batch and the left operand's
 * batch dims fold into its rows ((B,T,C) @ (C,D) with (B,T,C) contiguous), the whole thing is
 * ONE GEMM of (B*T) x C x D, which runs far better than B small ones. Otherwise one batched
 * GEMM over the broadcast batch dims (the backend decides how to spread it over threads).
 * Every case is one nb__run_gemm call.
 *
 * Autograd: nb_matmul records one MATMUL node (internal conversions and copies run with grad
 * mode off). Its rule is dA = g @ B^T and dB = A^T @ g, with 1-D operands promoted as in the
 * forward and the transposes passed as views; gradients of broadcast batch dims come back in
 * the broadcast batch shape and the engine sums them to the operand's shape. */
#include <string.h>

#include "tensor/tape.h"
#include "tensor/backend.h"
#include "tensor/autocast.h"

/* One operand seen as a batch of 2-D matrices: its own batch dims (before broadcasting),
 * and the geometry of each (rows x cols) slice in elements. */
typedef struct mm_operand {
    char *ptr;
    int nbatch;
    int64_t bshape[NB_MAX_DIMS], bstrides[NB_MAX_DIMS];
    int64_t rows, cols, srow, scol;
} mm_operand;

/* How a 2-D slice goes to the GEMM: as stored (row-major) or transposed (column-major). */
typedef struct mm_layout {
    bool ok, trans;
    int64_t ld;
} mm_layout;

static void describe(const nb_tensor *t, bool left, mm_operand *o) {
    int nd = t->ndim;
    o->ptr = nb__ptr(t);
    if (nd == 1) {
        /* Promoted vector: (1, K) on the left, (K, 1) on the right. The stride of the added
         * size-1 dim is never used. */
        o->nbatch = 0;
        if (left) {
            o->rows = 1, o->cols = t->shape[0], o->srow = 0, o->scol = t->strides[0];
        } else {
            o->rows = t->shape[0], o->cols = 1, o->srow = t->strides[0], o->scol = 0;
        }
        return;
    }
    o->nbatch = nd - 2;
    for (int d = 0; d < nd - 2; d++) o->bshape[d] = t->shape[d], o->bstrides[d] = t->strides[d];
    o->rows = t->shape[nd - 2], o->cols = t->shape[nd - 1];
    o->srow = t->strides[nd - 2], o->scol = t->strides[nd - 1];
}

/* The GEMM's view of a (rows x cols) matrix with strides (srow, scol). A size-1 dim's stride
 * does not matter; BLAS wants a leading dimension >= max(1, columns as stored). */
static mm_layout classify(int64_t rows, int64_t cols, int64_t srow, int64_t scol) {
    int64_t mr = rows > 1 ? rows : 1, mc = cols > 1 ? cols : 1;
    if ((cols <= 1 || scol == 1) && (rows <= 1 || srow >= mc))
        return (mm_layout){true, false, rows <= 1 ? mc : srow};
    if ((rows <= 1 || srow == 1) && (cols <= 1 || scol >= mr))
        return (mm_layout){true, true, cols <= 1 ? mr : scol};
    return (mm_layout){false, false, 0};
}

/* A contiguous copy of an operand whose slices the GEMM cannot read as they are. Batch dims
 * that are expanded (stride 0) are copied once, as size 1, and broadcast again later. */
static nb_tensor *compact_copy(nb_tensor *t) {
    int nd = t->ndim, nbt = nd >= 2 ? nd - 2 : 0;
    int64_t shape[NB_MAX_DIMS], strides[NB_MAX_DIMS];
    memcpy(shape, t->shape, sizeof(int64_t) * (size_t)nd);
    memcpy(strides, t->strides, sizeof(int64_t) * (size_t)nd);
    for (int d = 0; d < nbt; d++)
        if (strides[d] == 0) shape[d] = 1;
    nb_tensor *v = nb__view_of(t, shape, strides, nd, t->offset);
    return v ? nb_contiguous(v) : NULL;
}

/* Classify an operand's slices, copying it first when needed. */
static nb_status prepare(nb_tensor **t, bool left, mm_operand *o, mm_layout *lay) {
    describe(*t, left, o);
    *lay = classify(o->rows, o->cols, o->srow, o->scol);
    if (lay->ok) return NB_OK;
    nb_tensor *c = compact_copy(*t);
    if (!c) return nb_last_status();
    *t = c;
    describe(c, left, o);
    *lay = classify(o->rows, o->cols, o->srow, o->scol);
    NB__ASSERT(lay->ok);
    return NB_OK;
}

/* Operand batch strides broadcast to the output's batch shape (0 where it repeats). */
static void batch_strides(const mm_operand *o, int nbo, int64_t *out) {
    int lead = nbo - o->nbatch;
    for (int d = 0; d < nbo; d++) {
        out[d] = 0;
        if (d >= lead && o->bshape[d - lead] != 1) out[d] = o->bstrides[d - lead];
    }
}

/* out (contiguous, batch... x M x N, dtype f32 or f64, on dev) = a @ b. K >= 1,
 * numel(out) >= 1. a and b have out's dtype (f32, f64, or bf16 where the device's GEMM
 * takes it). */
static nb_status mm_compute(nb_device dev, nb_tensor *a, nb_tensor *b, nb_tensor *out,
                            const int64_t *bshape, int nbo, int64_t M, int64_t N, int64_t K) {
    mm_operand A, B;
    mm_layout la, lb;
    nb_status st;
    if ((st = prepare(&a, true, &A, &la)) != NB_OK) return st;
    if ((st = prepare(&b, false, &B, &lb)) != NB_OK) return st;
    nb__gemm_args g = {.dtype = a->dtype, .c_bf16 = out->dtype == NB_BF16, .trans_a = la.trans, .trans_b = lb.trans,
                       .M = M, .N = N, .K = K, .alpha = 1.0, .beta = 0.0,
                       .a = A.ptr, .lda = la.ld, .b = B.ptr, .ldb = lb.ld,
                       .c = nb__ptr(out), .ldc = N};

    int64_t nbatch = 1;
    batch_strides(&A, nbo, g.batch_stride_a);
    batch_strides(&B, nbo, g.batch_stride_b);
    bool b_fixed = true;
    for (int d = 0; d < nbo; d++) {
        nbatch *= bshape[d];
        if (g.batch_stride_b[d] != 0) b_fixed = false;
    }
    if (nbatch == 1) return nb__run_gemm(dev, "matmul", &g);

    /* One big GEMM: the same B for every batch, and A's batch dims fold into its rows. The
     * output is contiguous, so its batch dims fold into rows the same way. */
    if (b_fixed) {
        int64_t sizes[NB_MAX_DIMS + 1], strides[NB_MAX_DIMS + 1], srow;
        memcpy(sizes, bshape, sizeof(int64_t) * (size_t)nbo);
        memcpy(strides, g.batch_stride_a, sizeof(int64_t) * (size_t)nbo);
        sizes[nbo] = M, strides[nbo] = A.srow;
        if (nb__dims_collapse(sizes, strides, nbo + 1, &srow)) {
            mm_layout lf = classify(nbatch * M, K, srow, A.scol);
            if (lf.ok && !lf.trans) {
                g.trans_a = false, g.M = nbatch * M, g.lda = lf.ld;
                return nb__run_gemm(dev, "matmul", &g);
            }
        }
    }

    /* One GEMM per batch; the output's batches are contiguous. */
    g.batch_ndim = nbo;
    int64_t sc = M * N;
    for (int d = nbo - 1; d >= 0; d--) {
        g.batch_shape[d] = bshape[d];
        g.batch_stride_c[d] = sc;
        sc *= bshape[d];
    }
    return nb__run_gemm(dev, "matmul", &g);
}

static nb_tensor *matmul_impl(nb_tensor *a, nb_tensor *b) {
    NB__CHECK_ARG(a, "matmul", "a");
    NB__CHECK_ARG(b, "matmul", "b");
    nb_device dev;
    if (!nb__check_devices("matmul", (nb_tensor *[]){a, b}, 2, &dev)) return NULL;
    int na = a->ndim, nbd = b->ndim;
    if (na == 0 || nbd == 0) {
        nb__error(NB_ESHAPE, "matmul: both operands need at least 1 dimension, got %s @ %s "
                             "(use nb_mul for scalars)",
                  NB__SHAPE(a), NB__SHAPE(b));
        return NULL;
    }
    if (a->dtype != b->dtype) {
        nb__error(NB_EDTYPE, "matmul: operands have different dtypes: %s @ %s (convert one "
                             "with nb_to_dtype)",
                  nb_dtype_name(a->dtype), nb_dtype_name(b->dtype));
        return NULL;
    }
    nb_dtype dt = a->dtype;
    if (!nb_dtype_is_float(dt)) {
        nb__error(NB_EDTYPE, "matmul: dtype %s is not supported (f32, f64, f16 or bf16 only)",
                  nb_dtype_name(dt));
        return NULL;
    }
    int64_t K = a->shape[na - 1];
    int64_t Kb = nbd == 1 ? b->shape[0] : b->shape[nbd - 2];
    if (K != Kb) {
        nb__error(NB_ESHAPE, "matmul: inner dimensions differ: %s @ %s", NB__SHAPE(a),
                  NB__SHAPE(b));
        return NULL;
    }
    int64_t M = na >= 2 ? a->shape[na - 2] : 1;
    int64_t N = nbd >= 2 ? b->shape[nbd - 1] : 1;

    /* Batch dims, broadcast right-aligned. */
    int nba = na > 2 ? na - 2 : 0, nbb = nbd > 2 ? nbd - 2 : 0;
    int nbo = nba > nbb ? nba : nbb;
    int64_t oshape[NB_MAX_DIMS];
    for (int d = 0; d < nbo; d++) {
        int da = d - (nbo - nba), db = d - (nbo - nbb);
        int64_t sa = da >= 0 ? a->shape[da] : 1, sb = db >= 0 ? b->shape[db] : 1;
        if (sa != sb && sa != 1 && sb != 1) {
            nb__error(NB_ESHAPE, "matmul: batch dimensions do not broadcast: %s @ %s",
                      NB__SHAPE(a), NB__SHAPE(b));
            return NULL;
        }
        oshape[d] = sa == 1 ? sb : sa;
    }
    int ndo = nbo;
    if (na >= 2) oshape[ndo++] = M;
    if (nbd >= 2) oshape[ndo++] = N;

    int64_t numel = nb__numel_of(oshape, ndo);
    if (numel == 0) return nb__empty(oshape, ndo, dt, dev);

    nb_scope_begin();
    nb_tensor *ta = a, *tb = b, *out = NULL;
    nb_dtype cdt = dt;
    if (dt == NB_BF16 && nb__gemm_takes_bf16(dev)) {
        /* bf16 operands go to the GEMM as they are (oneDNN's bf16 matmul where the CPU has
         * AVX512-BF16: cpu/gemm.c); it sums in f32 and writes each result rounded once. */
    } else if (dt == NB_F16 || dt == NB_BF16) {
        /* Other half inputs are computed in f32 and the result rounded back once. f16 has no
         * fast GEMM on the CPUs nabla targets (that would need AVX512-FP16). */
        cdt = NB_F32;
        ta = nb_to_dtype(a, NB_F32);
        tb = nb_to_dtype(b, NB_F32);
        if (!ta || !tb) goto fail;
    }
    out = nb__empty(oshape, ndo, cdt, dev);
    if (!out) goto fail;
    if (K == 0) {
        /* An empty sum: zeros, as one (numel / N) x N GEMM with K = 0 and beta = 0. */
        nb__gemm_args z = {.dtype = cdt, .c_bf16 = cdt == NB_BF16, .M = numel / N, .N = N, .K = 0, .alpha = 1.0,
                           .beta = 0.0, .c = nb__ptr(out), .ldc = N};
        if (nb__run_gemm(dev, "matmul", &z) != NB_OK) goto fail;
    } else if (mm_compute(dev, ta, tb, out, oshape, nbo, M, N, K) != NB_OK) {
        goto fail;
    }
    if (cdt != dt && !(out = nb_to_dtype(out, dt))) goto fail;
    nb_keep(out);
    nb_scope_end();
    return out;
fail:
    nb_scope_end();
    return NULL;
}

nb_tensor *nb_matmul(nb_tensor *a, nb_tensor *b) {
    a = nb__autocast(a, NB_AUTOCAST_LOW); /* nabla/autocast.h: the cast is on the tape */
    b = nb__autocast(b, NB_AUTOCAST_LOW);
    bool prev = nb_set_grad_enabled(false);
    nb_tensor *out = matmul_impl(a, b);
    nb_set_grad_enabled(prev);
    nb__node *nd = nb__record(out, NB__OP_MATMUL, (nb_tensor *[]){a, b}, 2);
    if (nd) { /* dA needs B and dB needs A: save only what a needed gradient uses */
        if (b->requires_grad) nb__save(nd, 0, a);
        if (a->requires_grad) nb__save(nd, 1, b);
    }
    return out;
}

static bool needs(const nb__node *n, int i) { return n->edges[i].node || n->edges[i].leaf; }

nb_status nb__bw_MATMUL(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    int na = n->edges[0].ndim, nbd = n->edges[1].ndim;
    /* g with the dims removed for 1-D operands put back: (batch..., M, N). */
    nb_tensor *g2 = nb_to_dtype(g, n->out_dtype);
    if (nbd == 1) g2 = nb_unsqueeze(g2, g2 ? g2->ndim : 0);
    if (na == 1) g2 = nb_unsqueeze(g2, g2 ? g2->ndim - 1 : 0);
    if (!g2) return nb_last_status();
    if (needs(n, 0)) {
        nb_tensor *b = n->saved[1];
        nb_tensor *b2 = nbd == 1 ? nb_unsqueeze(b, 1) : b;
        nb_tensor *da = nb_matmul(g2, nb_transpose(b2, -1, -2)); /* (batch..., M, K) */
        if (na == 1) da = nb_squeeze(da, -2);
        if (!(gin[0] = da)) return nb_last_status();
    }
    if (needs(n, 1)) {
        nb_tensor *a = n->saved[0], *db;
        if (na > 2 && nbd <= 2) {
            /* One operand's batch dims fold into the GEMM's inner dim: A^T (K, batch*M) @
             * g (batch*M, N) is already summed over the batch, with no (batch, K, N)
             * temporary. */
            int64_t K = a->shape[na - 1], N = g2->shape[g2->ndim - 1];
            int64_t rows = nb__numel_of(a->shape, na - 1); /* not -1: K or N may be 0 */
            nb_tensor *af = nb_reshape(a, (int64_t[]){rows, K}, 2);
            nb_tensor *gf = nb_reshape(g2, (int64_t[]){rows, N}, 2);
            db = nb_matmul(nb_transpose(af, 0, 1), gf);
        } else {
            nb_tensor *a2 = na == 1 ? nb_unsqueeze(a, 0) : a;
            db = nb_matmul(nb_transpose(a2, -1, -2), g2); /* (batch..., K, N) */
        }
        if (nbd == 1) db = nb_squeeze(db, -1);
        if (!(gin[1] = db)) return nb_last_status();
    }
    return NB_OK;
}
