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

/* ---- the kernel table's entries: the op hands in f32 or f64 (its compute dtype) ---------- */
static nb_status cpu_attention(const nb__attention_args *a) {
    if (a->dtype == NB_F64)
        return nb__cpu_attention_fwd_f64(&a->g, a->q, a->k, a->v, a->o, a->lse);
    return nb__cpu_attention_fwd_f32(&a->g, a->q, a->k, a->v, a->o, a->lse);
}

static nb_status cpu_attention_backward(const nb__attention_backward_args *a) {
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
