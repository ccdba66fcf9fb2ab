/* cpu/attention.c - CPU kernels of causal scaled dot-product attention (see cpu/attention.h
 * and tensor/kernels/attention.h for the contract), registered as the kernel table's
 * attention and attention_backward. The f32 and f64 bodies come from cpu/attention_tmpl.h;
 * this file holds what both share: the dropout mask of a row, the thread count and the
 * scratch layout.
 *
 * Per (b, h) slice and block of NB__ATTN_BLOCK query rows [i0, i1):
 *   forward:  S = scale q[i0:i1] k[0:i1]^T (GEMM), causal softmax per row in place (exp via
 *             the vectorizable nb__fast_expf for f32), lse[t] kept, o[i0:i1] = P v[0:i1] (GEMM);
 *   backward: S and P = exp(S - lse) recomputed, dP = do[i0:i1] v[0:i1]^T,
 *             dS = P (dP - rowsum(P dP)) scale, dv[0:i1] += P^T do[i0:i1],
 *             dq[i0:i1] = dS k[0:i1], dk[0:i1] += dS^T q[i0:i1] (five GEMMs).
 * Skipping the blocks above the diagonal does 5/8 of the full (T, T) work at T = 128. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-math-errno")
#if defined(__AVX512F__)
#pragma GCC target("prefer-vector-width=512")
#endif
#endif

#include "cpu/backend.h"
#include "cpu/cpu_impl.h"
#include "cpu/attention.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "cpu/elementwise.h"
#include "cpu/gemm.h"
#include "nabla/memory.h"
#include "nabla/random.h"

static inline size_t nb__attn_round64(size_t n) { return (n + 63) & ~(size_t)63; }


/* Threads for the whole op: about (T^2 / 2) D multiply-adds per slice and GEMM, at most one
 * thread per slice. */
static int nb__attn_threads(const nb__attn_geom *g) {
    int64_t BH = g->B * g->H;
    int64_t work = BH * ((g->T * (g->T + 1)) / 2) * (g->D + 1);
    int nt = nb__threads_for(work, 4 * NB__GRAIN);
    return nt > BH ? (int)BH : nt;
}

/* keep[j] for elements base + j, j < n, of the virtual (B, H, T, T) mask (the draw is in
 * tensor/kernels/attention.h). */
static void nb__attn_keep_row(const nb__attn_geom *g, int64_t base, int64_t n, uint8_t *keep) {
    const double thr = (1.0 - g->p) * 4294967296.0; /* w 2^-32 < 1 - p, exactly */
    const uint32_t key[2] = {(uint32_t)g->seed, (uint32_t)(g->seed >> 32)};
    int64_t i = base;
    const int64_t end = base + n;
    while (i < end) {
        uint64_t blk = g->offset + (uint64_t)(i / 4);
        uint32_t ctr[4] = {(uint32_t)blk, (uint32_t)(blk >> 32), (uint32_t)g->stream,
                           (uint32_t)(g->stream >> 32)};
        uint32_t w[4];
        nb_philox4x32(ctr, key, w);
        for (int j = (int)(i % 4); j < 4 && i < end; j++, i++) keep[i - base] = (double)w[j] < thr;
    }
}

#define R float
#define S f32
#define GEMM nb__gemm_f32
#define EXP nb__fast_expf
#define LOG logf
#include "cpu/attention_tmpl.h"
#undef R
#undef S
#undef GEMM
#undef EXP
#undef LOG

#define R double
#define S f64
#define GEMM nb__gemm_f64
#define EXP exp
#define LOG log
#include "cpu/attention_tmpl.h"
#undef R
#undef S
#undef GEMM
#undef EXP
#undef LOG

/* ---- bf16 operands, f32 math ------------------------------------------------------------
 * q, k, v, o, dout and the gradients in bf16 (lse in f32): each task widens its slice's
 * operands into f32 scratch ((T, D) matrices, row stride D), runs the f32 slice above on
 * them and rounds its outputs once into the bf16 tensors. Against converting whole tensors
 * before and after the kernel this saves two passes over memory per operand and the f32
 * copies; the values are those of the f32 kernel on the widened inputs. */
typedef struct attn_bf16_job {
    const nb__attn_geom *g;
    const uint16_t *q, *k, *v, *dout;
    const float *lse;
    uint16_t *o, *dq, *dk, *dv;
    float *lse_out;
    char *buf;
    size_t per, mat, vec;
    atomic_int status;
} attn_bf16_job;

/* (T, D) rows of stride ld between bf16 src and f32 dst (row stride D). */
static void slice_widen(const uint16_t *src, int64_t ld, int64_t T, int64_t D, float *dst) {
    for (int64_t t = 0; t < T; t++) nb__bf16_to_f32_n(src + t * ld, dst + t * D, D);
}
static void slice_round(const float *src, int64_t T, int64_t D, uint16_t *dst, int64_t ld) {
    for (int64_t t = 0; t < T; t++) nb__f32_to_bf16_n(src + t * D, dst + t * ld, D);
}

static void attn_bf16_fail(attn_bf16_job *j, nb_status s) {
    int ok = NB_OK;
    atomic_compare_exchange_strong(&j->status, &ok, (int)s);
}

static void fwd_task_bf16(int64_t bh, void *p) {
    attn_bf16_job *j = p;
    const nb__attn_geom *g = j->g;
    const int64_t H = g->H, T = g->T, D = g->D, b = bh / H, h = bh % H, ld = D > 0 ? D : 1;
    char *mine = j->buf + j->per * (size_t)nb__task_slot();
    float *Sm = (float *)mine, *qf = (float *)(mine + j->mat), *kf = qf + j->vec / 4;
    float *vf = kf + j->vec / 4, *of = vf + j->vec / 4;
    uint8_t *keep = (uint8_t *)(of + j->vec / 4);
    slice_widen(j->q + b * g->sq[0] + h * g->sq[1], g->sq[2], T, D, qf);
    slice_widen(j->k + b * g->sk[0] + h * g->sk[1], g->sk[2], T, D, kf);
    slice_widen(j->v + b * g->sv[0] + h * g->sv[1], g->sv[2], T, D, vf);
    nb_status s = fwd_core_f32(g, bh, qf, ld, kf, ld, vf, ld, of, ld, j->lse_out + bh * T, Sm,
                               keep);
    if (s == NB_OK) slice_round(of, T, D, j->o + b * g->so[0] + h * g->so[1], g->so[2]);
    else attn_bf16_fail(j, s);
}

static void bwd_task_bf16(int64_t bh, void *p) {
    attn_bf16_job *j = p;
    const nb__attn_geom *g = j->g;
    const int64_t H = g->H, T = g->T, D = g->D, b = bh / H, h = bh % H, ld = D > 0 ? D : 1;
    char *mine = j->buf + j->per * (size_t)nb__task_slot();
    float *P = (float *)mine, *dP = (float *)(mine + j->mat), *f = (float *)(mine + 2 * j->mat);
    const size_t v4 = j->vec / 4;
    float *qf = f, *kf = f + v4, *vf = f + 2 * v4, *dof = f + 3 * v4;
    float *dqf = j->dq ? f + 4 * v4 : NULL, *dkf = j->dk ? f + 5 * v4 : NULL;
    float *dvf = j->dv ? f + 6 * v4 : NULL;
    uint8_t *keep = (uint8_t *)(f + 7 * v4);
    slice_widen(j->q + b * g->sq[0] + h * g->sq[1], g->sq[2], T, D, qf);
    slice_widen(j->k + b * g->sk[0] + h * g->sk[1], g->sk[2], T, D, kf);
    slice_widen(j->v + b * g->sv[0] + h * g->sv[1], g->sv[2], T, D, vf);
    slice_widen(j->dout + b * g->sdo[0] + h * g->sdo[1], g->sdo[2], T, D, dof);
    const int64_t lds[7] = {ld, ld, ld, ld, ld, ld, ld};
    nb_status s = bwd_core_f32(g, bh, qf, kf, vf, j->lse + bh * T, dof, dqf, dkf, dvf, lds, P,
                               dP, keep);
    if (s != NB_OK) {
        attn_bf16_fail(j, s);
        return;
    }
    if (dqf) slice_round(dqf, T, D, j->dq + b * g->sdq[0] + h * g->sdq[1], g->sdq[2]);
    if (dkf) slice_round(dkf, T, D, j->dk + b * g->sdk[0] + h * g->sdk[1], g->sdk[2]);
    if (dvf) slice_round(dvf, T, D, j->dv + b * g->sdv[0] + h * g->sdv[1], g->sdv[2]);
}

/* Runs fn over the slices with `nmat` score matrices and `nvec` f32 (T, D) slices of
 * scratch per thread. */
static nb_status attn_bf16_run(attn_bf16_job *j, void (*fn)(int64_t, void *), int nmat,
                               int nvec) {
    const nb__attn_geom *g = j->g;
    const int64_t BH = g->B * g->H;
    if (BH == 0 || g->T == 0) return NB_OK;
    int nt = nb__attn_threads(g);
    j->mat = nb__attn_round64(NB__ATTN_BLOCK * (size_t)g->T * sizeof(float));
    j->vec = nb__attn_round64((size_t)g->T * (size_t)(g->D > 0 ? g->D : 1) * sizeof(float));
    j->per = (size_t)nmat * j->mat + (size_t)nvec * j->vec + nb__attn_round64((size_t)g->T);
    j->buf = nb_host_alloc(j->per * (size_t)nt);
    if (!j->buf) return nb__error(NB_ENOMEM, "causal_attention: out of memory for scratch");
    atomic_init(&j->status, NB_OK);
    nb__run_tasks(BH, nt, fn, j);
    nb_host_free(j->buf);
    nb_status st = (nb_status)atomic_load(&j->status);
    return st == NB_OK ? NB_OK : nb__error(st, "causal_attention: a GEMM failed (%s)",
                                           nb_status_name(st));
}

/* ---- the kernel table's entries: the op hands in f32 or f64 (its compute dtype), or bf16
 * operands with f32 statistics (a->bf16) ---------------------------------------------------- */
static nb_status cpu_attention(const nb__attention_args *a) {
    if (a->bf16) {
        attn_bf16_job j = {.g = &a->g, .q = a->q, .k = a->k, .v = a->v, .o = a->o,
                           .lse_out = a->lse};
        return attn_bf16_run(&j, fwd_task_bf16, 1, 4);
    }
    if (a->dtype == NB_F64)
        return nb__cpu_attention_fwd_f64(&a->g, a->q, a->k, a->v, a->o, a->lse);
    return nb__cpu_attention_fwd_f32(&a->g, a->q, a->k, a->v, a->o, a->lse);
}

static nb_status cpu_attention_backward(const nb__attention_backward_args *a) {
    if (a->bf16) {
        attn_bf16_job j = {.g = &a->g, .q = a->q, .k = a->k, .v = a->v, .lse = a->lse,
                           .dout = a->dout, .dq = a->dq, .dk = a->dk, .dv = a->dv};
        return attn_bf16_run(&j, bwd_task_bf16, 2, 7);
    }
    if (a->dtype == NB_F64)
        return nb__cpu_attention_bwd_f64(&a->g, a->q, a->k, a->v, a->lse, a->dout, a->dq, a->dk,
                                         a->dv);
    return nb__cpu_attention_bwd_f32(&a->g, a->q, a->k, a->v, a->lse, a->dout, a->dq, a->dk,
                                     a->dv);
}

void nb__cpu_register_attention(nb__kernels *k) {
    k->attention = cpu_attention;
    k->attention_backward = cpu_attention_backward;
}
