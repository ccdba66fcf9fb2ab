/* matmul.c - nb_matmul: torch.matmul semantics on top of the GEMM provider layer (cpu/gemm.h).
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
 * ONE GEMM of (B*T) x C x D, which runs far better than B small ones. Otherwise one GEMM per
 * batch; when each of those is small they run in parallel over the OpenMP pool (the providers
 * parallelize big GEMMs themselves on the same pool).
 *
 * Autograd: nb_matmul records one MATMUL node (internal conversions and copies run with grad
 * mode off). Its rule is dA = g @ B^T and dB = A^T @ g, with 1-D operands promoted as in the
 * forward and the transposes passed as views; gradients of broadcast batch dims come back in
 * the broadcast batch shape and the engine sums them to the operand's shape. */
#include <stdatomic.h>
#include <string.h>

#include "autograd/autograd_impl.h"
#include "cpu/cpu_impl.h" /* transitional: moves to cpu/ with the kernels */
#include "cpu/gemm.h"

/* Per-GEMM work (multiply-adds) at or below which batches run in parallel rather than each
 * GEMM using all threads: 128x128x128. A GEMM this small parallelizes poorly inside the
 * provider (e.g. attention scores, (B*H) x T x T x head_dim). Up to MM_MID_MACS (256^3)
 * batches still go in parallel when they split evenly over the threads: measured with
 * oneDNN on 2 threads, 16 x (128x256x256) ran ~10 % faster that way, but an uneven split
 * (3 batches on 2 threads) would idle a thread for a whole GEMM. */
#define MM_SMALL_MACS ((int64_t)1 << 21)
#define MM_MID_MACS ((int64_t)1 << 24)
/* Total multiply-adds below which a batched matmul stays on one thread. */
#define MM_PAR_GRAIN ((int64_t)1 << 18)

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


static nb_status gemm(nb_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                      const char *A, int64_t lda, const char *B, int64_t ldb, char *C,
                      int64_t ldc) {
    if (dt == NB_F64)
        return nb__gemm_f64(ta, tb, M, N, K, 1.0, (const double *)A, lda, (const double *)B,
                            ldb, 0.0, (double *)C, ldc);
    return nb__gemm_f32(ta, tb, M, N, K, 1.0f, (const float *)A, lda, (const float *)B, ldb,
                        0.0f, (float *)C, ldc);
}

/* One batch of the per-batch loop: its operands' offsets from the batch index. */
typedef struct mm_batch_ctx {
    nb_dtype dt;
    mm_layout la, lb;
    int64_t M, N, K, es;
    int nbo;
    const int64_t *bshape, *as, *bs;
    const char *A, *B;
    char *C;
} mm_batch_ctx;

static nb_status mm_batch(const mm_batch_ctx *c, int64_t i) {
    int64_t r = i, oa = 0, ob = 0;
    for (int d = c->nbo - 1; d >= 0; d--) {
        int64_t idx = r % c->bshape[d];
        r /= c->bshape[d];
        oa += idx * c->as[d];
        ob += idx * c->bs[d];
    }
    return gemm(c->dt, c->la.trans, c->lb.trans, c->M, c->N, c->K, c->A + oa * c->es,
                c->la.ld, c->B + ob * c->es, c->lb.ld, c->C + i * c->M * c->N * c->es, c->N);
}

/* out (contiguous, batch... x M x N, dtype f32 or f64) = a @ b. K >= 1, numel(out) >= 1. */
static nb_status mm_compute(nb_tensor *a, nb_tensor *b, nb_tensor *out, const int64_t *bshape,
                            int nbo, int64_t M, int64_t N, int64_t K) {
    nb_dtype dt = out->dtype;
    int64_t es = (int64_t)nb_dtype_size(dt);
    mm_operand A, B;
    mm_layout la, lb;
    nb_status st;
    if ((st = prepare(&a, true, &A, &la)) != NB_OK) return st;
    if ((st = prepare(&b, false, &B, &lb)) != NB_OK) return st;
    char *C = nb__ptr(out);

    int64_t as[NB_MAX_DIMS], bs[NB_MAX_DIMS], nbatch = 1;
    batch_strides(&A, nbo, as);
    batch_strides(&B, nbo, bs);
    bool b_fixed = true;
    for (int d = 0; d < nbo; d++) {
        nbatch *= bshape[d];
        if (bs[d] != 0) b_fixed = false;
    }

    if (nbatch == 1)
        return gemm(dt, la.trans, lb.trans, M, N, K, A.ptr, la.ld, B.ptr, lb.ld, C, N);

    /* One big GEMM: the same B for every batch, and A's batch dims fold into its rows. The
     * output is contiguous, so its batch dims fold into rows the same way. */
    if (b_fixed) {
        int64_t sizes[NB_MAX_DIMS + 1], strides[NB_MAX_DIMS + 1], srow;
        memcpy(sizes, bshape, sizeof(int64_t) * (size_t)nbo);
        memcpy(strides, as, sizeof(int64_t) * (size_t)nbo);
        sizes[nbo] = M, strides[nbo] = A.srow;
        if (nb__dims_collapse(sizes, strides, nbo + 1, &srow)) {
            mm_layout lf = classify(nbatch * M, K, srow, A.scol);
            if (lf.ok && !lf.trans)
                return gemm(dt, false, lb.trans, nbatch * M, N, K, A.ptr, lf.ld, B.ptr, lb.ld,
                            C, N);
        }
    }

    /* One GEMM per batch. */
    double macs = (double)M * (double)N * (double)K; /* double: no overflow for huge dims */
    int nt = 1;
    if (macs <= (double)MM_MID_MACS) {
        nt = nb__threads_for((int64_t)macs * nbatch, MM_PAR_GRAIN);
        if (nt > nbatch) nt = (int)nbatch;
        if (macs > (double)MM_SMALL_MACS && nbatch % nt != 0) nt = 1;
    }
    mm_batch_ctx ctx = {dt, la, lb, M, N, K, es, nbo, bshape, as, bs, A.ptr, B.ptr, C};
    if (nt <= 1) {
        /* Not even an inactive OpenMP region here: the provider's own parallel region would
         * then be a nested one, for which libgomp starts fresh threads on every call. */
        for (int64_t i = 0; i < nbatch; i++)
            if ((st = mm_batch(&ctx, i)) != NB_OK) return st;
        return NB_OK;
    }
    atomic_int failed = 0;
    nb_status fail_status = NB_OK;
    char fail_msg[256] = "";
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t i = 0; i < nbatch; i++) {
        if (atomic_load_explicit(&failed, memory_order_relaxed)) continue;
        nb_status s = mm_batch(&ctx, i);
        if (s != NB_OK && !atomic_exchange(&failed, 1)) {
            /* The message was set on this worker thread; carry it back to the caller's. */
            fail_status = s;
            snprintf(fail_msg, sizeof fail_msg, "%s", nb_last_error());
        }
    }
    if (atomic_load(&failed)) return nb__error(fail_status, "%s", fail_msg);
    return NB_OK;
}

static nb_tensor *matmul_impl(nb_tensor *a, nb_tensor *b) {
    NB__CHECK_ARG(a, "matmul", "a");
    NB__CHECK_ARG(b, "matmul", "b");
    if (a->storage->device.type != NB_DEVICE_CPU || b->storage->device.type != NB_DEVICE_CPU) {
        nb__error(NB_EDEVICE, "matmul: CUDA tensors are not supported by this op yet");
        return NULL;
    }
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

    if (nb__numel_of(oshape, ndo) == 0) return nb__empty(oshape, ndo, dt, NB_CPU);

    nb_scope_begin();
    nb_tensor *ta = a, *tb = b, *out = NULL;
    nb_dtype cdt = dt;
    if (dt == NB_F16 || dt == NB_BF16) {
        /* Half inputs are computed in f32 and the result rounded back once.
         * TODO(bf16 GEMM): send bf16 to oneDNN's matmul primitive (AVX512-BF16, f32
         * accumulation) instead of converting; f16 likewise where the CPU has AVX512-FP16. */
        cdt = NB_F32;
        ta = nb_to_dtype(a, NB_F32);
        tb = nb_to_dtype(b, NB_F32);
        if (!ta || !tb) goto fail;
    }
    out = nb__empty(oshape, ndo, cdt, NB_CPU);
    if (!out) goto fail;
    if (K == 0) {
        /* An empty sum: zeros (all-zero bits is 0.0 in every float dtype). */
        memset(nb__ptr(out), 0, (size_t)nb_numel(out) * nb_dtype_size(cdt));
    } else if (mm_compute(ta, tb, out, oshape, nbo, M, N, K) != NB_OK) {
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
