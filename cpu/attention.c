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

/* Grouped-query attention (tensor/kernels/attention.h): the query heads per key/value head,
 * and the key/value head query head h reads. */
static inline int64_t nb__attn_group(const nb__attn_geom *g) {
    return g->Hkv > 0 ? g->H / g->Hkv : 1;
}
static inline int64_t nb__attn_kv_head(const nb__attn_geom *g, int64_t h) {
    return h / nb__attn_group(g);
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
    const int64_t hk = nb__attn_kv_head(g, h);
    char *mine = j->buf + j->per * (size_t)nb__task_slot();
    float *Sm = (float *)mine, *qf = (float *)(mine + j->mat), *kf = qf + j->vec / 4;
    float *vf = kf + j->vec / 4, *of = vf + j->vec / 4;
    uint8_t *keep = (uint8_t *)(of + j->vec / 4);
    slice_widen(j->q + b * g->sq[0] + h * g->sq[1], g->sq[2], T, D, qf);
    slice_widen(j->k + b * g->sk[0] + hk * g->sk[1], g->sk[2], T, D, kf);
    slice_widen(j->v + b * g->sv[0] + hk * g->sv[1], g->sv[2], T, D, vf);
    nb_status s = fwd_core_f32(g, bh, qf, ld, kf, ld, vf, ld, of, ld, j->lse_out + bh * T, Sm,
                               keep);
    if (s == NB_OK) slice_round(of, T, D, j->o + b * g->so[0] + h * g->so[1], g->so[2]);
    else attn_bf16_fail(j, s);
}

/* Task bkv: the query heads of key/value slice bkv = (b, hk) in order, their dk and dv
 * summed in f32 and rounded once. */
static void bwd_task_bf16(int64_t bkv, void *p) {
    attn_bf16_job *j = p;
    const nb__attn_geom *g = j->g;
    const int64_t H = g->H, T = g->T, D = g->D, ld = D > 0 ? D : 1;
    const int64_t rep = nb__attn_group(g), b = bkv / (H / rep), hk = bkv % (H / rep);
    char *mine = j->buf + j->per * (size_t)nb__task_slot();
    float *P = (float *)mine, *dP = (float *)(mine + j->mat), *f = (float *)(mine + 2 * j->mat);
    const size_t v4 = j->vec / 4;
    float *qf = f, *kf = f + v4, *vf = f + 2 * v4, *dof = f + 3 * v4;
    float *dqf = j->dq ? f + 4 * v4 : NULL, *dkf = j->dk ? f + 5 * v4 : NULL;
    float *dvf = j->dv ? f + 6 * v4 : NULL;
    uint8_t *keep = (uint8_t *)(f + 7 * v4);
    slice_widen(j->k + b * g->sk[0] + hk * g->sk[1], g->sk[2], T, D, kf);
    slice_widen(j->v + b * g->sv[0] + hk * g->sv[1], g->sv[2], T, D, vf);
    const int64_t lds[7] = {ld, ld, ld, ld, ld, ld, ld};
    for (int64_t r = 0; r < rep; r++) {
        const int64_t h = hk * rep + r, bh = b * H + h;
        slice_widen(j->q + b * g->sq[0] + h * g->sq[1], g->sq[2], T, D, qf);
        slice_widen(j->dout + b * g->sdo[0] + h * g->sdo[1], g->sdo[2], T, D, dof);
        nb_status s = bwd_core_f32(g, bh, qf, kf, vf, j->lse + bh * T, dof, dqf, dkf, dvf, lds,
                                   P, dP, keep, r > 0);
        if (s != NB_OK) {
            attn_bf16_fail(j, s);
            return;
        }
        if (dqf) slice_round(dqf, T, D, j->dq + b * g->sdq[0] + h * g->sdq[1], g->sdq[2]);
    }
    if (dkf) slice_round(dkf, T, D, j->dk + b * g->sdk[0] + hk * g->sdk[1], g->sdk[2]);
    if (dvf) slice_round(dvf, T, D, j->dv + b * g->sdv[0] + hk * g->sdv[1], g->sdv[2]);
}

/* Runs fn over the slices (per_kv: over the key/value slices, as the backward does) with
 * `nmat` score matrices and `nvec` f32 (T, D) slices of scratch per thread, or `bytes` of
 * scratch per thread when not 0. */
static nb_status attn_bf16_run(attn_bf16_job *j, void (*fn)(int64_t, void *), bool per_kv,
                               int nmat, int nvec, size_t bytes) {
    const nb__attn_geom *g = j->g;
    const int64_t BH = g->B * g->H;
    if (BH == 0 || g->T == 0) return NB_OK;
    int nt = nb__attn_threads(g);
    j->mat = nb__attn_round64(NB__ATTN_BLOCK * (size_t)g->T * sizeof(float));
    j->vec = nb__attn_round64((size_t)g->T * (size_t)(g->D > 0 ? g->D : 1) * sizeof(float));
    j->per = bytes ? nb__attn_round64(bytes)
                   : (size_t)nmat * j->mat + (size_t)nvec * j->vec +
                         nb__attn_round64((size_t)g->T);
    j->buf = nb_host_alloc(j->per * (size_t)nt);
    if (!j->buf) return nb__error(NB_ENOMEM, "causal_attention: out of memory for scratch");
    atomic_init(&j->status, NB_OK);
    nb__run_tasks(per_kv ? BH / nb__attn_group(g) : BH, nt, fn, j);
    nb_host_free(j->buf);
    nb_status st = (nb_status)atomic_load(&j->status);
    return st == NB_OK ? NB_OK : nb__error(st, "causal_attention: a GEMM failed (%s)",
                                           nb_status_name(st));
}

/* ---- bf16 operands, bf16 products (AVX512-BF16) ---------------------------------------------
 * Where the compiler targets AVX512-BF16 the five products of a block run on vdpbf16ps
 * (pairs of bf16 products summed into f32 lanes) instead of widening the slice for f32
 * GEMMs: q k^T and dO v^T from the bf16 operands, and P v, P^T dO, dS k, dS^T q from the
 * f32 weights and score gradients rounded to bf16 once (as PyTorch's bf16 flash attention
 * does); softmax, its statistics, dS and the dk / dv sums stay f32. Operands are packed per
 * slice or block into "pair words" (two consecutive k of one row or column side by side),
 * the layout vdpbf16ps reads; the sums run over k in a fixed order, so the bits do not
 * depend on the thread count. */
#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define NB__ATTN_BF16_NATIVE 1

/* C (m x n f32, row stride ldc) = alpha A B, plus C when acc. A: m x K2 pair words, word
 * (i, kk) at word offset i lda + kk acs; B: K2 rows of n pair words (row stride ldb words);
 * a pair word is two bf16, the even k in the low half. Tiles of 8 rows x 32 columns, masked
 * edges. */
#define NB__BG_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
static void bgemm(int64_t m, int64_t n, int64_t K2, float alpha, const uint16_t *A,
                  int64_t lda, int64_t acs, const uint16_t *B, int64_t ldb, bool acc, float *C,
                  int64_t ldc) {
    const __m512 va = _mm512_set1_ps(alpha);
    for (int64_t j0 = 0; j0 < n; j0 += 32) {
        const int64_t nj = n - j0 < 32 ? n - j0 : 32;
        const __mmask16 k0 = nj >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nj) - 1);
        const __mmask16 k1 = nj >= 32   ? (__mmask16)0xffff
                             : nj > 16 ? (__mmask16)((1u << (nj - 16)) - 1)
                                       : (__mmask16)0;
        for (int64_t i0 = 0; i0 < m; i0 += 8) {
            const int64_t mi = m - i0 < 8 ? m - i0 : 8;
            /* rows past the end repeat the last one (results not stored) */
#define NB__BG_INIT(r)                                                                     \
    const uint16_t *a##r = A + 2 * (i0 + ((r) < mi ? (r) : mi - 1)) * lda;                 \
    __m512 c0_##r = _mm512_setzero_ps(), c1_##r = _mm512_setzero_ps();
            NB__BG_ROWS(NB__BG_INIT)
            const uint16_t *b = B + 2 * j0;
            for (int64_t kk = 0; kk < K2; kk++, b += 2 * ldb) {
                const __m512bh b0 = (__m512bh)_mm512_maskz_loadu_epi32(k0, b);
                const __m512bh b1 = (__m512bh)_mm512_maskz_loadu_epi32(k1, b + 32);
#define NB__BG_STEP(r)                                                                     \
    {                                                                                      \
        uint32_t w;                                                                        \
        memcpy(&w, a##r + 2 * kk * acs, 4);                                                \
        const __m512bh av = (__m512bh)_mm512_set1_epi32((int)w);                          \
        c0_##r = _mm512_dpbf16_ps(c0_##r, av, b0);                                         \
        c1_##r = _mm512_dpbf16_ps(c1_##r, av, b1);                                         \
    }
                NB__BG_ROWS(NB__BG_STEP)
            }
#define NB__BG_STORE(r)                                                                    \
    if ((r) < mi) {                                                                        \
        float *c = C + (i0 + (r)) * ldc + j0;                                              \
        __m512 x0 = _mm512_mul_ps(c0_##r, va), x1 = _mm512_mul_ps(c1_##r, va);             \
        if (acc) {                                                                         \
            x0 = _mm512_add_ps(x0, _mm512_maskz_loadu_ps(k0, c));                          \
            x1 = _mm512_add_ps(x1, _mm512_maskz_loadu_ps(k1, c + 16));                     \
        }                                                                                  \
        _mm512_mask_storeu_ps(c, k0, x0);                                                  \
        _mm512_mask_storeu_ps(c + 16, k1, x1);                                             \
    }
            NB__BG_ROWS(NB__BG_STORE)
#undef NB__BG_INIT
#undef NB__BG_STEP
#undef NB__BG_STORE
        }
    }
}
#undef NB__BG_ROWS

/* A from rows x K bf16 (row stride ld): rows of ceil(K/2) pair words, the odd tail zero. */
static void pack_a_bf16(const uint16_t *src, int64_t ld, int64_t rows, int64_t K,
                        uint16_t *dst) {
    const int64_t K2 = (K + 1) / 2;
    for (int64_t i = 0; i < rows; i++) {
        memcpy(dst + 2 * i * K2, src + i * ld, sizeof(uint16_t) * (size_t)K);
        if (K & 1) dst[2 * i * K2 + K] = 0;
    }
}

/* ---- vector helpers of the packing: 16 lanes at a time, masked at the edges ----------------- */
static inline __mmask16 lanes(int64_t left) {
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
}
/* nb_f32_to_bf16 of 16 floats (round to nearest even, NaN kept quiet), each in the low half
 * of a 32-bit lane: the same bits. */
static inline __m512i bf16r_v(__m512 v) {
    const __m512i x = _mm512_castps_si512(v), hi = _mm512_srli_epi32(x, 16);
    const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
}
/* Transposes the 16 x 16 matrix of 32-bit values in r (r[i] is row i). */
static inline void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    /* u[4g + c], 128-bit lane L: rows 4g .. 4g + 3 of column 4L + c */
    __m512i u[16];
    for (int g = 0; g < 16; g += 4) {
        u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
        u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
        u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
        u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
    for (int c = 0; c < 4; c++) {
        const __m512i ab01 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
        const __m512i ab23 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
        const __m512i cd01 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
        const __m512i cd23 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
        r[c] = _mm512_shuffle_i32x4(ab01, cd01, 0x88);
        r[4 + c] = _mm512_shuffle_i32x4(ab01, cd01, 0xDD);
        r[8 + c] = _mm512_shuffle_i32x4(ab23, cd23, 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(ab23, cd23, 0xDD);
    }
}

/* A from rows x K f32 (row stride ld), each value rounded to bf16. */
static void pack_a_f32(const float *src, int64_t ld, int64_t rows, int64_t K, uint16_t *dst) {
    const int64_t K2 = (K + 1) / 2;
    for (int64_t i = 0; i < rows; i++) {
        uint16_t *d = dst + 2 * i * K2;
        const float *x = src + i * ld;
        for (int64_t k = 0; k < K; k += 16) {
            const __mmask16 mk = lanes(K - k);
            const __m512i r = bf16r_v(_mm512_maskz_loadu_ps(mk, x + k));
            _mm256_mask_storeu_epi16(d + k, mk, _mm512_cvtepi32_epi16(r));
        }
        if (K & 1) d[K] = 0;
    }
}
/* B = X from X (K x n f32, row stride ld), rounded: word (kk, j) = (X[2kk][j], X[2kk+1][j]). */
static void pack_b_f32(const float *X, int64_t ld, int64_t K, int64_t n, uint16_t *dst) {
    for (int64_t kk = 0; kk < (K + 1) / 2; kk++) {
        const float *x0 = X + 2 * kk * ld, *x1 = 2 * kk + 1 < K ? x0 + ld : NULL;
        uint16_t *d = dst + 2 * kk * n;
        for (int64_t j = 0; j < n; j += 16) {
            const __mmask16 mk = lanes(n - j);
            __m512i w = bf16r_v(_mm512_maskz_loadu_ps(mk, x0 + j));
            if (x1)
                w = _mm512_or_si512(
                    w, _mm512_slli_epi32(bf16r_v(_mm512_maskz_loadu_ps(mk, x1 + j)), 16));
            _mm512_mask_storeu_epi32(d + 2 * j, mk, w);
        }
    }
}
/* B = Y^T from Y (n x K bf16, row stride ld): K2 rows of n words, word (kk, j) =
 * Y[j][2kk..2kk+1]: 16 x 16 blocks of words transposed in registers. */
static void pack_bt_bf16(const uint16_t *Y, int64_t ld, int64_t n, int64_t K, uint16_t *dst) {
    const int64_t K2 = (K + 1) / 2, Ke = K / 2;
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
        const int64_t nj = n - j0 < 16 ? n - j0 : 16;
        for (int64_t k0 = 0; k0 < Ke; k0 += 16) {
            const __mmask16 mk = lanes(Ke - k0);
            __m512i r[16];
            for (int64_t i = 0; i < 16; i++)
                r[i] = i < nj ? _mm512_maskz_loadu_epi32(mk, Y + (j0 + i) * ld + 2 * k0)
                              : _mm512_setzero_si512();
            transpose16(r);
            const int64_t nk = Ke - k0 < 16 ? Ke - k0 : 16;
            for (int64_t kk = 0; kk < nk; kk++)
                _mm512_mask_storeu_epi32(dst + 2 * ((k0 + kk) * n + j0), lanes(nj), r[kk]);
        }
    }
    if (K & 1) {
        uint16_t *d = dst + 2 * (K2 - 1) * n;
        for (int64_t j = 0; j < n; j++) d[2 * j] = Y[j * ld + K - 1], d[2 * j + 1] = 0;
    }
}
/* B = Y from Y (K x n bf16, row stride ld): word (kk, j) = (Y[2kk][j], Y[2kk+1][j]). */
static void pack_b_bf16(const uint16_t *Y, int64_t ld, int64_t K, int64_t n, uint16_t *dst) {
    for (int64_t kk = 0; kk < (K + 1) / 2; kk++) {
        const uint16_t *y0 = Y + 2 * kk * ld, *y1 = 2 * kk + 1 < K ? y0 + ld : NULL;
        uint16_t *d = dst + 2 * kk * n;
        for (int64_t j = 0; j < n; j += 16) {
            const __mmask16 mk = lanes(n - j);
            __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, y0 + j));
            if (y1) {
                const __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, y1 + j));
                w = _mm512_or_si512(w, _mm512_slli_epi32(h, 16));
            }
            _mm512_mask_storeu_epi32(d + 2 * j, mk, w);
        }
    }
}

/* dst (T x D bf16, row stride ld) = src^T rounded, src D x T f32 (row stride ls). */
static void round_t(const float *src, int64_t ls, int64_t T, int64_t D, uint16_t *dst,
                    int64_t ld) {
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
        const int64_t nd = D - d0 < 16 ? D - d0 : 16;
        for (int64_t t0 = 0; t0 < T; t0 += 16) {
            const __mmask16 mt = lanes(T - t0);
            __m512i r[16];
            for (int64_t i = 0; i < 16; i++)
                r[i] = i < nd ? bf16r_v(_mm512_maskz_loadu_ps(mt, src + (d0 + i) * ls + t0))
                              : _mm512_setzero_si512();
            transpose16(r);
            const int64_t nt = T - t0 < 16 ? T - t0 : 16;
            for (int64_t t = 0; t < nt; t++)
                _mm256_mask_storeu_epi16(dst + (t0 + t) * ld + d0, lanes(nd),
                                         _mm512_cvtepi32_epi16(r[t]));
        }
    }
}

/* ---- the row work, on score rows padded to whole vectors ---------------------------------------
 * The native kernels' score blocks have rows of ldS = T rounded up to 16 floats. Before the
 * exps, the lanes past a row's visible count get -inf (and 0 in dP), so every loop runs over
 * whole 16-lane vectors, with no scalar tail, and those lanes contribute exact zeros
 * (nb__fast_expf(-inf) is 0). Sums run in a fixed lane order: no thread-count dependence. */
static inline int64_t up16(int64_t n) { return (n + 15) & ~(int64_t)15; }

static inline void exp_rows16(float *p, int64_t c16, float sub) {
    for (int64_t s = 0; s < c16; s += 16) {
        float *q = p + s;
        for (int l = 0; l < 16; l++) q[l] = nb__fast_expf(q[l] - sub);
    }
}

/* softmax_row_f32 on a padded row: the same values but for the order of the sum. */
static float softmax_row_v(float *row, int64_t cnt, int64_t n, const uint8_t *keep,
                           float dscale) {
    const int64_t c16 = up16(cnt);
    for (int64_t s = cnt; s < c16; s++) row[s] = -INFINITY;
    __m512 vm = _mm512_set1_ps(-INFINITY);
    for (int64_t s = 0; s < c16; s += 16) /* NaN lanes lose (the operand order) */
        vm = _mm512_max_ps(_mm512_loadu_ps(row + s), vm);
    const float mx = _mm512_reduce_max_ps(vm);
    exp_rows16(row, c16, mx);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t s = 0; s < c16; s += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(row + s));
    const float sum = _mm512_reduce_add_ps(acc), inv = 1 / sum;
    if (keep) {
        const float f = inv * dscale;
        for (int64_t s = 0; s < cnt; s++) row[s] = keep[s] ? row[s] * f : 0;
    } else {
        const __m512 vi = _mm512_set1_ps(inv);
        for (int64_t s = 0; s < c16; s += 16)
            _mm512_storeu_ps(row + s, _mm512_mul_ps(_mm512_loadu_ps(row + s), vi));
    }
    for (int64_t s = cnt; s < n; s++) row[s] = 0;
    return mx + logf(sum);
}

/* bwd_rows_f32 on padded rows (row stride ldS): the same values but for the order of the
 * row sum of P dP. */
static void bwd_rows_v(const nb__attn_geom *g, int64_t bh, int64_t i0, int64_t m, int64_t n,
                       const float *ls, float *P, float *dP, int64_t ldS, bool want_s,
                       uint8_t *keep) {
    const int64_t Tn = g->T;
    const bool drop = g->p > 0;
    const float dscale = g->p < 1 ? (float)(1.0 / (1.0 - g->p)) : 0, scale = (float)g->scale;
    for (int64_t r = 0; r < m; r++) {
        const int64_t t = i0 + r, cnt = t + 1, c16 = up16(cnt);
        float *pr = P + r * ldS, *dpr = dP + r * ldS;
        for (int64_t s = cnt; s < c16; s++) pr[s] = -INFINITY;
        exp_rows16(pr, c16, ls[t]);
        for (int64_t s = cnt; s < n; s++) pr[s] = 0;
        if (drop) nb__attn_keep_row(g, (bh * Tn + t) * Tn, cnt, keep);
        if (want_s) {
            float dsum = 0;
            if (drop) {
                for (int64_t s = 0; s < cnt; s++) dsum += keep[s] ? pr[s] * dpr[s] : 0;
                dsum *= dscale;
                for (int64_t s = 0; s < cnt; s++)
                    dpr[s] = pr[s] * ((keep[s] ? dpr[s] * dscale : 0) - dsum) * scale;
            } else {
                for (int64_t s = cnt; s < c16; s++) dpr[s] = 0;
                __m512 acc = _mm512_setzero_ps();
                for (int64_t s = 0; s < c16; s += 16)
                    acc = _mm512_fmadd_ps(_mm512_loadu_ps(pr + s), _mm512_loadu_ps(dpr + s), acc);
                dsum = _mm512_reduce_add_ps(acc);
                const __m512 vd = _mm512_set1_ps(dsum), vs = _mm512_set1_ps(scale);
                for (int64_t s = 0; s < c16; s += 16) {
                    const __m512 x = _mm512_sub_ps(_mm512_loadu_ps(dpr + s), vd);
                    _mm512_storeu_ps(dpr + s,
                                     _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(pr + s), x), vs));
                }
            }
            for (int64_t s = cnt; s < n; s++) dpr[s] = 0;
        }
        if (drop)
            for (int64_t s = 0; s < cnt; s++) pr[s] = keep[s] ? pr[s] * dscale : 0;
    }
}

/* Bump allocation of scratch: n elements of size es, 64-byte aligned. */
static void *take(char **p, size_t n, size_t es) {
    void *r = *p;
    *p += nb__attn_round64(n * es);
    return r;
}
/* Scratch bytes per thread of the native bf16 kernels (generous upper bound). */
static size_t native_scratch(const nb__attn_geom *g) {
    const size_t T = (size_t)g->T, D = (size_t)(g->D > 0 ? g->D : 1), B = NB__ATTN_BLOCK;
    const size_t D2 = (D + 1) / 2, T2 = (T + 1) / 2, T16 = (size_t)up16(g->T);
    return 4 * (2 * B * T16 + 2 * D2 * T + T2 * D + 2 * B * D2 + B * T2 + 2 * T * (B / 2) +
                2 * (B / 2) * D + B * D + 2 * T * D) + nb__attn_round64(T) + 20 * 64;
}

static void fwd_task_native(int64_t bh, void *p) {
    attn_bf16_job *j = p;
    const nb__attn_geom *g = j->g;
    const int64_t H = g->H, T = g->T, D = g->D, b = bh / H, h = bh % H;
    const int64_t D2 = (D + 1) / 2, BLK = NB__ATTN_BLOCK, hk = nb__attn_kv_head(g, h);
    const uint16_t *qs = j->q + b * g->sq[0] + h * g->sq[1], *ks = j->k + b * g->sk[0] + hk * g->sk[1];
    const uint16_t *vs = j->v + b * g->sv[0] + hk * g->sv[1];
    uint16_t *os = j->o + b * g->so[0] + h * g->so[1];
    const int64_t ldq = g->sq[2], ldk = g->sk[2], ldv = g->sv[2], ldo = g->so[2];
    float *ls = j->lse_out + bh * T;
    char *mine = j->buf + j->per * (size_t)nb__task_slot();
    const int64_t ldS = up16(T); /* score rows padded to whole vectors */
    float *S = take(&mine, (size_t)(BLK * ldS), 4), *O = take(&mine, (size_t)(BLK * D), 4);
    uint16_t *Kt = take(&mine, (size_t)(2 * D2 * T), 2);
    uint16_t *Vp = take(&mine, (size_t)(2 * ((T + 1) / 2) * D), 2);
    uint16_t *Qa = take(&mine, (size_t)(2 * BLK * D2), 2);
    uint16_t *Pa = take(&mine, (size_t)(2 * BLK * ((T + 1) / 2)), 2);
    uint8_t *keep = take(&mine, (size_t)T, 1);
    const bool drop = g->p > 0;
    const float dscale = g->p < 1 ? (float)(1.0 / (1.0 - g->p)) : 0;
    pack_bt_bf16(ks, ldk, T, D, Kt);
    pack_b_bf16(vs, ldv, T, D, Vp);
    for (int64_t i0 = 0; i0 < T; i0 += BLK) {
        const int64_t i1 = i0 + BLK < T ? i0 + BLK : T, m = i1 - i0, n = i1, n2 = (n + 1) / 2;
        pack_a_bf16(qs + i0 * ldq, ldq, m, D, Qa);
        bgemm(m, n, D2, (float)g->scale, Qa, D2, 1, Kt, T, false, S, ldS);
        for (int64_t r = 0; r < m; r++) {
            const int64_t t = i0 + r;
            if (drop) nb__attn_keep_row(g, (bh * T + t) * T, t + 1, keep);
            ls[t] = softmax_row_v(S + r * ldS, t + 1, n, drop ? keep : NULL, dscale);
        }
        pack_a_f32(S, ldS, m, n, Pa);
        bgemm(m, D, n2, 1.0f, Pa, n2, 1, Vp, D, false, O, D);
        for (int64_t r = 0; r < m; r++) nb__f32_to_bf16_n(O + r * D, os + (i0 + r) * ldo, D);
    }
}

/* Task bkv: the query heads of key/value slice bkv = (b, hk) in order, adding to one dk^T
 * and dv^T, rounded once at the end. */
static void bwd_task_native(int64_t bkv, void *p) {
    attn_bf16_job *j = p;
    const nb__attn_geom *g = j->g;
    const int64_t H = g->H, T = g->T, D = g->D, rep = nb__attn_group(g);
    const int64_t b = bkv / (H / rep), hk = bkv % (H / rep);
    const int64_t D2 = (D + 1) / 2, BLK = NB__ATTN_BLOCK;
    const uint16_t *ks = j->k + b * g->sk[0] + hk * g->sk[1];
    const uint16_t *vs = j->v + b * g->sv[0] + hk * g->sv[1];
    const int64_t ldq = g->sq[2], ldk = g->sk[2], ldv = g->sv[2], lddo = g->sdo[2];
    const bool want_dq = j->dq != NULL, want_dk = j->dk != NULL, want_dv = j->dv != NULL;
    const bool want_s = want_dq || want_dk;
    char *mine = j->buf + j->per * (size_t)nb__task_slot();
    const int64_t ldS = up16(T); /* score rows padded to whole vectors */
    float *P = take(&mine, (size_t)(BLK * ldS), 4), *dP = take(&mine, (size_t)(BLK * ldS), 4);
    uint16_t *Kt = take(&mine, (size_t)(2 * D2 * T), 2), *Vt = take(&mine, (size_t)(2 * D2 * T), 2);
    uint16_t *Kr = take(&mine, (size_t)(2 * ((T + 1) / 2) * D), 2);
    uint16_t *Qa = take(&mine, (size_t)(2 * BLK * D2), 2), *dOa = take(&mine, (size_t)(2 * BLK * D2), 2);
    uint16_t *Bp = take(&mine, (size_t)(2 * T * (BLK / 2)), 2);
    uint16_t *Br = take(&mine, (size_t)(2 * (BLK / 2) * D), 2);
    uint16_t *dSa = take(&mine, (size_t)(2 * BLK * ((T + 1) / 2)), 2);
    float *dQ = take(&mine, (size_t)(BLK * D), 4);
    /* dk^T and dv^T (D x T): their products then have the weights as the B operand, packed
     * from rows of P and dS; transposed once at the end */
    float *dKt = take(&mine, (size_t)(T * D), 4), *dVt = take(&mine, (size_t)(T * D), 4);
    uint8_t *keep = take(&mine, (size_t)T, 1);
    pack_bt_bf16(ks, ldk, T, D, Kt);
    if (want_s) pack_bt_bf16(vs, ldv, T, D, Vt);
    if (want_dq) pack_b_bf16(ks, ldk, T, D, Kr);
    const int64_t nblk = (T + BLK - 1) / BLK;
    for (int64_t hr = 0; hr < rep; hr++) {
        const int64_t h = hk * rep + hr, bh = b * H + h;
        const uint16_t *qs = j->q + b * g->sq[0] + h * g->sq[1];
        const uint16_t *dos = j->dout + b * g->sdo[0] + h * g->sdo[1];
        const float *ls = j->lse + bh * T;
        for (int64_t ib = nblk - 1; ib >= 0; ib--) {
            const int64_t i0 = ib * BLK, i1 = i0 + BLK < T ? i0 + BLK : T;
            const int64_t m = i1 - i0, n = i1, m2 = (m + 1) / 2, n2 = (n + 1) / 2;
            /* the last block sees every key: the first head's initializes dk^T and dv^T */
            const bool acc = ib != nblk - 1 || hr > 0;
            pack_a_bf16(qs + i0 * ldq, ldq, m, D, Qa);
            bgemm(m, n, D2, (float)g->scale, Qa, D2, 1, Kt, T, false, P, ldS);
            if (want_s) {
                pack_a_bf16(dos + i0 * lddo, lddo, m, D, dOa);
                bgemm(m, n, D2, 1.0f, dOa, D2, 1, Vt, T, false, dP, ldS);
            }
            bwd_rows_v(g, bh, i0, m, n, ls, P, dP, ldS, want_s, keep);
            if (want_dv) { /* dv[0:n]^T += dO[i0:i1]^T P (Br as A: word (d, kk) at kk D + d) */
                pack_b_bf16(dos + i0 * lddo, lddo, m, D, Br);
                pack_b_f32(P, ldS, m, n, Bp);
                bgemm(D, n, m2, 1.0f, Br, 1, D, Bp, n, acc, dVt, T);
            }
            if (want_dq) { /* dq[i0:i1] = dS k[0:n] */
                pack_a_f32(dP, ldS, m, n, dSa);
                bgemm(m, D, n2, 1.0f, dSa, n2, 1, Kr, D, false, dQ, D);
                uint16_t *dqs = j->dq + b * g->sdq[0] + h * g->sdq[1];
                for (int64_t r = 0; r < m; r++)
                    nb__f32_to_bf16_n(dQ + r * D, dqs + (i0 + r) * g->sdq[2], D);
            }
            if (want_dk) { /* dk[0:n]^T += q[i0:i1]^T dS */
                pack_b_bf16(qs + i0 * ldq, ldq, m, D, Br);
                pack_b_f32(dP, ldS, m, n, Bp);
                bgemm(D, n, m2, 1.0f, Br, 1, D, Bp, n, acc, dKt, T);
            }
        }
    }
    if (want_dk) round_t(dKt, T, T, D, j->dk + b * g->sdk[0] + hk * g->sdk[1], g->sdk[2]);
    if (want_dv) round_t(dVt, T, T, D, j->dv + b * g->sdv[0] + hk * g->sdv[1], g->sdv[2]);
}
#endif

static atomic_bool g_native_bf16 = true;
bool nb__cpu_attention_native_bf16(bool on) { return atomic_exchange(&g_native_bf16, on); }

/* ---- the kernel table's entries: the op hands in f32 or f64 (its compute dtype), or bf16
 * operands with f32 statistics (a->bf16) ---------------------------------------------------- */
static nb_status cpu_attention(const nb__attention_args *a) {
    if (a->bf16) {
        attn_bf16_job j = {.g = &a->g, .q = a->q, .k = a->k, .v = a->v, .o = a->o,
                           .lse_out = a->lse};
#ifdef NB__ATTN_BF16_NATIVE
        if (a->g.D > 0 && atomic_load(&g_native_bf16))
            return attn_bf16_run(&j, fwd_task_native, false, 0, 0, native_scratch(&a->g));
#endif
        return attn_bf16_run(&j, fwd_task_bf16, false, 1, 4, 0);
    }
    if (a->dtype == NB_F64)
        return nb__cpu_attention_fwd_f64(&a->g, a->q, a->k, a->v, a->o, a->lse);
    return nb__cpu_attention_fwd_f32(&a->g, a->q, a->k, a->v, a->o, a->lse);
}

static nb_status cpu_attention_backward(const nb__attention_backward_args *a) {
    if (a->bf16) {
        attn_bf16_job j = {.g = &a->g, .q = a->q, .k = a->k, .v = a->v, .lse = a->lse,
                           .dout = a->dout, .dq = a->dq, .dk = a->dk, .dv = a->dv};
#ifdef NB__ATTN_BF16_NATIVE
        if (a->g.D > 0 && atomic_load(&g_native_bf16))
            return attn_bf16_run(&j, bwd_task_native, true, 0, 0, native_scratch(&a->g));
#endif
        return attn_bf16_run(&j, bwd_task_bf16, true, 2, 7, 0);
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
