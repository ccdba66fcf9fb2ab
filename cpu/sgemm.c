/* cpu/sgemm.c - nabla's own packed f32 GEMM (cpu/sgemm.h): the BLIS scheme with an AVX-512
 * micro-kernel (8 x 32) or an AVX2 + FMA one (6 x 16), chosen when the build's -march has
 * the instructions, run on nabla's workers.
 *
 * Why: a GEMM cut into tiles that are each one single-threaded provider call (cpu/gemm.c)
 * has the same bits at any thread count, but every tile's call packs its operands again (a
 * tile of rows packs all of B). Here op(B) is packed once, by all threads, into panels that
 * every worker reads (and op(A) too when it is transposed; otherwise the micro-kernel reads
 * the rows of A in place); then C is cut into tiles that run the micro-kernel.
 * Status: the f32 path where cpu/sgemm_path.c chooses it (NB_SGEMM overrides); see
 * docs/threads.md for what it measured.
 * bf16 operands (nb__sgemm_packed_bf16, for CPUs without AVX512-BF16) are widened as they
 * are packed (a bf16 A read in place is then packed too, like a transposed one), and a bf16
 * C is summed in a per-thread f32 tile that is rounded once at the end of the tile.
 *
 * Bits: the sum over K runs in blocks of at most KC_MAX whose edges depend on K alone; within
 * a block each element of C is one chain of fused multiply-adds in k order started from 0,
 * and the block's sum is then added to C (the first block: alpha * sum, + beta * C). Every
 * element takes exactly these steps whichever tile, thread or edge of a panel it is in
 * (edges use the same vector code with masks or a narrower kernel, and the zero rows and
 * columns that pad the panels never reach C), so the result depends on M, N, K and the
 * values only. (For K <= KC_MAX with alpha 1 and beta 0 this happens to be the very sum
 * dnnl_sgemm computes.) The AVX2 and AVX-512 kernels take the same steps per element (the
 * same K blocks, the same chain, the same final multiply-add), so they give the same bits
 * too: only the shape of the micro-kernel and the tiles differ.
 *
 * Loops: pack op(B) into NR-column panels (and a transposed A into MR-row panels), each K
 * block of a panel contiguous (one job of tasks over panels); then, per tile of C (mb x nb,
 * one task), per K block, per MR rows of A (kc x MR floats: stay in L1), per NR-column panel
 * of B (the tile's B block, kc x nb: stays in L2), the micro-kernel MR x NR. The packing
 * buffer is per calling thread and kept between calls. */
#include <stdlib.h>
#include <string.h>

#include "nabla/runtime.h"

#include "cpu/cpu_impl.h"
#include "cpu/sgemm.h"
#include "tensor/error.h"

/* ---- the vector layer ---------------------------------------------------------------------
 * The code below is written once against these few operations: vf, a vector of VL floats;
 * vmask, which of a vector's lanes a partial load or store touches. */
#if defined(__AVX512F__) && defined(__FMA__)
#include <immintrin.h>
#define HAVE_KERNEL 1
#define ISA_NAME "AVX-512"
#define VL 16
typedef __m512 vf;
typedef __mmask16 vmask;
#define V_ZERO() _mm512_setzero_ps()
#define V_SET1(x) _mm512_set1_ps(x)
#define V_LOAD(p) _mm512_load_ps(p)
#define V_STORE(p, v) _mm512_store_ps((p), (v))
#define V_STOREU(p, v) _mm512_storeu_ps((p), (v))
#define V_LOADU(p) _mm512_loadu_ps(p)
#define V_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define V_MUL(a, b) _mm512_mul_ps((a), (b))
#define V_MLOAD(m, p) _mm512_maskz_loadu_ps((m), (p))
#define V_MSTORE(p, m, v) _mm512_mask_storeu_ps((p), (m), (v))
static inline vmask v_mask(int64_t left) { /* the first `left` lanes (all when >= VL) */
    return (vmask)(left >= 16 ? 0xFFFF : left <= 0 ? 0 : (1u << left) - 1);
}
/* 8 floats, the first w (< 8 allowed) of them read, the rest zero */
static inline __m256 load8_first(const float *p, int64_t w) {
    return _mm256_maskz_loadu_ps((__mmask8)(w >= 8 ? 0xFF : (1u << w) - 1), p);
}
static inline void store8_first(float *p, __m256 v, int64_t w) {
    _mm256_mask_storeu_ps(p, (__mmask8)(w >= 8 ? 0xFF : (1u << w) - 1), v);
}
/* VL bf16 at p widened to f32 (exact: the 16 bits become the high half) */
static inline vf v_widen(const uint16_t *p) {
    __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
}
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HAVE_KERNEL 1
#define ISA_NAME "AVX2"
#define VL 8
typedef __m256 vf;
typedef __m256i vmask;
#define V_ZERO() _mm256_setzero_ps()
#define V_SET1(x) _mm256_set1_ps(x)
#define V_LOAD(p) _mm256_load_ps(p)
#define V_STORE(p, v) _mm256_store_ps((p), (v))
#define V_STOREU(p, v) _mm256_storeu_ps((p), (v))
#define V_LOADU(p) _mm256_loadu_ps(p)
#define V_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define V_MUL(a, b) _mm256_mul_ps((a), (b))
#define V_MLOAD(m, p) _mm256_maskload_ps((p), (m))
#define V_MSTORE(p, m, v) _mm256_maskstore_ps((p), (m), (v))
static inline vmask v_mask(int64_t left) {
    int l = left >= 8 ? 8 : left <= 0 ? 0 : (int)left;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(l), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline __m256 load8_first(const float *p, int64_t w) {
    return w >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, v_mask(w));
}
static inline void store8_first(float *p, __m256 v, int64_t w) {
    if (w >= 8) _mm256_storeu_ps(p, v);
    else _mm256_maskstore_ps(p, v_mask(w), v);
}
static inline vf v_widen(const uint16_t *p) {
    __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
}
#else
#define HAVE_KERNEL 0
#endif

bool nb__sgemm_packed_available(void) { return HAVE_KERNEL; }

const char *nb__sgemm_packed_isa(void) {
#if HAVE_KERNEL
    return ISA_NAME;
#else
    return "none";
#endif
}

#if HAVE_KERNEL

/* Sizes (AVX-512: tried on an AMD Zen 5 against the tiles of dnnl_sgemm calls: 8 x 48
 * kernels, K blocks of 256 and tiles of 96 or 288 columns did worse on the W3 shapes; the
 * rest was within the noise of a shared machine. AVX2: the 6 x 16 kernel keeps its 12 sums,
 * two vectors of B and the broadcast of A in 15 of the 16 ymm registers; 128-column tiles
 * keep the tile's B block in a 512 KB L2). KC_MAX decides where the sum over K is cut, so it
 * is part of the bits: never make it depend on anything but K (nor on the instruction set:
 * both kernels give the same bits because it is the same). */
#if VL == 16
#define MR 8             /* rows of the micro-kernel ... */
#define NC_MAX 256       /* columns of a tile at most (its B block: 512 KB of L2) */
#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#else
#define MR 6
#define NC_MAX 128
#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#endif
#define NVM 2            /* ... and its columns in vectors: MR x 2 sums of VL */
#define NR (VL * NVM)    /* 32 or 16 columns */
#define KC_MAX 512       /* longest K block */
#define MC_MAX 192       /* rows of a tile at most (a multiple of both MRs) */
#define MIN_MB 32        /* tiles are split for more threads down to 32 rows ... */
#define MIN_NB 64        /* ... and 64 columns */
#define TASKS_PER_THREAD 4
#define PF_B 8           /* the micro-kernel prefetches B this many k steps ahead */
#define PACK_GROUP 8     /* panels of a transposed A packed together */
#define KEEP_BYTES ((size_t)64 << 20) /* per-thread packing buffers up to this stay cached */

/* ---- per-thread packing buffers ----------------------------------------------------------- */
typedef struct {
    float *p;
    size_t cap; /* floats */
} tbuf;

static _Thread_local tbuf t_pack; /* the packed A and B of the GEMM this thread called */

static float *tbuf_get(tbuf *b, size_t n) {
    if (b->cap >= n) return b->p;
    free(b->p);
    b->p = NULL, b->cap = 0;
    size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63;
    float *p = aligned_alloc(64, bytes);
    if (!p) return NULL;
    b->p = p, b->cap = bytes / sizeof(float);
    return p;
}

static void tbuf_trim(tbuf *b) {
    if (b->cap * sizeof(float) > KEEP_BYTES) {
        free(b->p);
        b->p = NULL, b->cap = 0;
    }
}

/* ---- the job -------------------------------------------------------------------------------- */
typedef struct {
    bool ta, tb;
    int64_t M, N, K;
    float alpha, beta;
    const float *A, *B;
    float *C;
    int64_t lda, ldb, ldc;
    int64_t kc;       /* K block length (the last one may be shorter) */
    int64_t nkb;      /* K blocks */
    int64_t npan;     /* NR-column panels of op(B) */
    int64_t mpan;     /* MR-row panels of op(A) */
    float *bp;        /* packed op(B): block at k0 * npan * NR, panel jp at + jp * kcb * NR */
    float *ap;        /* packed op(A): block at k0 * mpan * MR, panel ip at + ip * kcb * MR */
    int64_t a_task, b_task; /* panels per packing task */
    int64_t a_tasks;        /* the packing tasks of A come first */
    int64_t mb, nb, ncols;  /* tile height, width (multiples of MR, NR), tiles per row */
    /* bf16 operands (A / B NULL then): widened to f32 as they are packed, or, for A in
     * place, MR rows at a time into the thread's scratch; the same f32 values reach the
     * micro-kernel, so the same bits as widening first */
    const uint16_t *Ah, *Bh;
    uint16_t *Ch;           /* bf16 C: each tile summed in the thread's f32 scratch tile, */
    const float *bias;      /* which starts as bias in every row (beta 1), then rounded once */
    float *scratch;         /* per thread slot (nb__task_slot): A rows widened, the C tile */
    int64_t slot_floats, nslots;
} job;

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* K block p: first index and length. */
static inline int64_t kb_len(const job *j, int64_t p) { return min64(j->kc, j->K - p * j->kc); }

/* ---- packing ---------------------------------------------------------------------------------- */
static inline float widen1(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* n bf16 to n f32 */
static void widen_n(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + VL <= n; i += VL) V_STOREU(dst + i, v_widen(src + i));
    for (; i < n; i++) dst[i] = widen1(src[i]);
}

/* 8 floats from 8 bf16 at p, the first w (< 8 allowed) of them read, the rest zero */
static inline __m256 widen8_first(const uint16_t *p, int64_t w) {
    __m128i h;
    if (w >= 8) {
        h = _mm_loadu_si128((const __m128i *)p);
    } else {
        uint16_t t[8] = {0};
        memcpy(t, p, sizeof(uint16_t) * (size_t)(w > 0 ? w : 0));
        h = _mm_loadu_si128((const __m128i *)t);
    }
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* The 8 x 8 block r (one register per row) transposed: column t (8 floats, one per row) to
 * dst + t * dstride, for t < w; the last of them (t = w - 1) only its first lastn floats. */
static inline __attribute__((always_inline)) void tr8_regs(const __m256 *r, int64_t w,
                                                          float *dst, int64_t dstride,
                                                          int64_t lastn) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    __m256 o[8] = {_mm256_permute2f128_ps(u0, u4, 0x20), _mm256_permute2f128_ps(u1, u5, 0x20),
                   _mm256_permute2f128_ps(u2, u6, 0x20), _mm256_permute2f128_ps(u3, u7, 0x20),
                   _mm256_permute2f128_ps(u0, u4, 0x31), _mm256_permute2f128_ps(u1, u5, 0x31),
                   _mm256_permute2f128_ps(u2, u6, 0x31), _mm256_permute2f128_ps(u3, u7, 0x31)};
    if (w == 8 && lastn == 8) { /* the common case, unrolled */
        for (int t = 0; t < 8; t++) _mm256_storeu_ps(dst + t * dstride, o[t]);
        return;
    }
    for (int t = 0; t + 1 < w; t++) _mm256_storeu_ps(dst + t * dstride, o[t]);
    if (w > 0) store8_first(dst + (w - 1) * dstride, o[w - 1], lastn);
}

/* The 8 x w block at src (rows `rows` < 8 read as zero, w <= 8 columns) transposed: column
 * t (8 floats, one per row) to dst + t * dstride, for t < w. */
static inline __attribute__((always_inline)) void tr8(const float *src, int64_t ld, int64_t rows, int64_t w, float *dst,
                       int64_t dstride) {
    __m256 r[8];
    for (int i = 0; i < 8; i++)
        r[i] = i < rows ? load8_first(src + i * ld, w) : _mm256_setzero_ps();
    tr8_regs(r, w, dst, dstride, 8);
}

/* The same from bf16 rows, widened on the way. */
static inline __attribute__((always_inline)) void tr8_bf16(const uint16_t *src, int64_t ld,
                                                          int64_t rows, int64_t w, float *dst,
                                                          int64_t dstride, int64_t lastn) {
    __m256 r[8];
    if (w == 8) /* whole loads */
        for (int i = 0; i < 8; i++)
            r[i] = i < rows ? _mm256_castsi256_ps(_mm256_slli_epi32(
                                  _mm256_cvtepu16_epi32(
                                      _mm_loadu_si128((const __m128i *)(src + i * ld))),
                                  16))
                            : _mm256_setzero_ps();
    else
        for (int i = 0; i < 8; i++)
            r[i] = i < rows ? widen8_first(src + i * ld, w) : _mm256_setzero_ps();
    tr8_regs(r, w, dst, dstride, lastn);
}

/* Panel jp of op(B) for every K block: kcb rows of NR floats, zero past column N. */
static void pack_b_panel(const job *j, int64_t jp) {
    int64_t j0 = jp * NR, n = min64(NR, j->N - j0);
    for (int64_t p = 0; p < j->nkb; p++) {
        int64_t k0 = p * j->kc, kcb = kb_len(j, p);
        float *dst = j->bp + k0 * j->npan * NR + jp * kcb * NR;
        if (j->Bh && !j->tb) {
            const uint16_t *src = j->Bh + k0 * j->ldb + j0;
            for (int64_t k = 0; k < kcb; k++, src += j->ldb, dst += NR) {
                if (n == NR) {
                    for (int v = 0; v < NVM; v++) V_STORE(dst + VL * v, v_widen(src + VL * v));
                } else {
                    widen_n(src, dst, n);
                    memset(dst + n, 0, sizeof(float) * (size_t)(NR - n));
                }
            }
        } else if (j->Bh) { /* as the f32 code below, each 8 x 8 block widened on the way */
            if (n < NR) memset(dst, 0, sizeof(float) * (size_t)(kcb * NR));
            for (int64_t c = 0; c < n; c += 8)
                for (int64_t k = 0; k < kcb; k += 8)
                    tr8_bf16(j->Bh + (j0 + c) * j->ldb + k0 + k, j->ldb, min64(8, n - c),
                             min64(8, kcb - k), dst + k * NR + c, NR, 8);
        } else if (!j->tb) {
            const float *src = j->B + k0 * j->ldb + j0;
            if (n == NR) {
                for (int64_t k = 0; k < kcb; k++, src += j->ldb, dst += NR)
                    for (int v = 0; v < NVM; v++) V_STORE(dst + VL * v, V_LOADU(src + VL * v));
            } else {
                vmask m[NVM];
                for (int v = 0; v < NVM; v++) m[v] = v_mask(n - VL * v);
                for (int64_t k = 0; k < kcb; k++, src += j->ldb, dst += NR)
                    for (int v = 0; v < NVM; v++) V_STORE(dst + VL * v, V_MLOAD(m[v], src + VL * v));
            }
        } else {
            /* op(B)[k][j] = B[j * ldb + k]: read each row of B along k, write down a column */
            if (n < NR) memset(dst, 0, sizeof(float) * (size_t)(kcb * NR));
            for (int64_t c = 0; c < n; c += 8)
                for (int64_t k = 0; k < kcb; k += 8)
                    tr8(j->B + (j0 + c) * j->ldb + k0 + k, j->ldb, min64(8, n - c),
                        min64(8, kcb - k), dst + k * NR + c, NR);
        }
    }
}

/* Panels g0 .. g1 (at most PACK_GROUP) of a transposed bf16 A, K block at k0 (length kcb,
 * packed at dst0): as the f32 code below, 8 bf16 widened at a time. */
static void pack_at_group_bf16(const job *j, int64_t g0, int64_t g1, int64_t kcb, int64_t k0,
                               float *dst0) {
    for (int64_t k = 0; k < kcb; k++) {
        const uint16_t *src = j->Ah + (k0 + k) * j->lda;
        for (int64_t ip = g0; ip < g1; ip++) {
            int64_t r0 = ip * MR;
            float *d = dst0 + ip * kcb * MR + k * MR;
            /* the rows past M as zeros; with MR 6 the 2 extra floats land at step k + 1 */
            __m256 v = widen8_first(src + r0, min64(8, j->M - r0));
            if (MR == 8 || k + 1 < kcb) _mm256_storeu_ps(d, v);
            else store8_first(d, v, MR);
        }
    }
}

/* Panel ip of a bf16 A read in place (row i at A + i * lda), widened into the layout of a
 * transposed A's panels (kcb x MR per K block), 8 x 8 blocks at a time. */
static void pack_a_panel_bf16(const job *j, int64_t ip) {
    int64_t r0 = ip * MR, rows = min64(MR, j->M - r0);
    for (int64_t p = 0; p < j->nkb; p++) {
        int64_t k0 = p * j->kc, kcb = kb_len(j, p);
        float *d = j->ap + k0 * j->mpan * MR + ip * kcb * MR;
        for (int64_t k = 0; k < kcb; k += 8) {
            int64_t w = min64(8, kcb - k);
            /* column k + t to d + (k + t) MR: 8 floats, whose 2 past MR (6) land on the next
             * column, written next; the block's last column gets MR */
            tr8_bf16(j->Ah + r0 * j->lda + k0 + k, j->lda, rows, w, d + k * MR, MR,
                     k + w == kcb ? MR : 8);
        }
    }
}

/* Panels ip0 .. ip1 of a transposed A (op(A)[i][k] = A[k * lda + i]) together: row k of A
 * holds MR consecutive floats of each panel, so walking the rows once reads A in order. */
static void pack_at_panels(const job *j, int64_t ip0, int64_t ip1) {
    for (int64_t p = 0; p < j->nkb; p++) {
        int64_t k0 = p * j->kc, kcb = kb_len(j, p);
        float *dst0 = j->ap + k0 * j->mpan * MR;
        /* PACK_GROUP panels at a time, so that many write streams (writing to every panel
         * at once measured 1.5x slower: too many lines in flight) */
        for (int64_t g0 = ip0; g0 < ip1; g0 += PACK_GROUP) {
            int64_t g1 = min64(ip1, g0 + PACK_GROUP);
            if (j->Ah) { /* bf16: the group's part of each row widened first */
                pack_at_group_bf16(j, g0, g1, kcb, k0, dst0);
                continue;
            }
            for (int64_t k = 0; k < kcb; k++) {
                const float *src = j->A + (k0 + k) * j->lda;
                for (int64_t ip = g0; ip < g1; ip++) {
                    int64_t r0 = ip * MR, rows = min64(MR, j->M - r0);
                    float *d = dst0 + ip * kcb * MR + k * MR;
                    /* MR floats (8 or 6), the rows past M as zeros. With MR 6, whole
                     * 8-float loads and stores where they stay inside A and the panel: the
                     * 2 extra floats land at the start of step k + 1, which is written next
                     * (partial loads and stores are slow on AMD's AVX2 cores). */
                    bool whole = r0 + 8 <= j->M;
                    if (MR == 8 || (whole && k + 1 < kcb))
                        _mm256_storeu_ps(d, rows == MR && whole ? _mm256_loadu_ps(src + r0)
                                                                : load8_first(src + r0, rows));
                    else
                        store8_first(d, load8_first(src + r0, rows), MR);
                }
            }
        }
    }
}

static void pack_task(int64_t t, void *ctx) {
    const job *j = ctx;
    if (t < j->a_tasks) { /* A is packed when transposed or bf16 */
        int64_t p1 = min64(j->mpan, (t + 1) * j->a_task);
        if (j->ta) pack_at_panels(j, t * j->a_task, p1);
        else
            for (int64_t ip = t * j->a_task; ip < p1; ip++) pack_a_panel_bf16(j, ip);
    } else {
        t -= j->a_tasks;
        int64_t p1 = min64(j->npan, (t + 1) * j->b_task);
        for (int64_t jp = t * j->b_task; jp < p1; jp++) pack_b_panel(j, jp);
    }
}

/* ---- the micro-kernel ---------------------------------------------------------------------- */

/* One row of the tile into C (nv vectors, masks m): mode 0 C = alpha s, 1 C = alpha s +
 * beta C, 2 C += alpha s. */
static inline __attribute__((always_inline)) void store_row(float *c, const vf *s,
                                                           const vmask *m, bool full, int nv,
                                                           vf va, vf vb, int mode) {
    for (int v = 0; v < nv; v++) {
        vf r;
        if (mode == 2) {
            r = V_FMA(s[v], va, full ? V_LOADU(c + VL * v) : V_MLOAD(m[v], c + VL * v));
        } else {
            r = V_MUL(s[v], va);
            if (mode == 1)
                r = V_FMA(full ? V_LOADU(c + VL * v) : V_MLOAD(m[v], c + VL * v), vb, r);
        }
        if (full) V_STOREU(c + VL * v, r);
        else V_MSTORE(c + VL * v, m[v], r);
    }
}

/* C[0 .. rows, 0 .. cols] (row stride ldc) gets the MR x (16 nv) product of MR rows of A,
 * element (i, k) at a[i * ars + k * aks] (a packed panel: ars 1, aks MR; A in place: ars lda,
 * aks 1), and the panel b (kc x NR, of which the first 16 nv columns are used). The same
 * steps for every element whatever nv or the layout of A, so a narrow kernel at the right
 * edge gives the same bits. */
static inline __attribute__((always_inline)) void
micro_kernel(int nv, int64_t kc, const float *a, int64_t ars, int64_t aks,
             const float *restrict b, float *c, int64_t ldc, int64_t rows, int64_t cols,
             vf va, vf vb, int mode) {
    /* row i of the A panel; rows past `rows` (not stored) read row 0 again */
#define DECL(i)                                                                            \
    vf s##i[NVM];                                                                          \
    for (int v = 0; v < NVM; v++) s##i[v] = V_ZERO();                                      \
    const float *restrict a##i = a + (i < rows ? i : 0) * ars;
    ROWS(DECL)
#undef DECL
    if (mode != 0) { /* C is read at the end: start bringing it in now */
#define PREF(i)                                                                            \
    for (int v = 0; v < nv; v++) _mm_prefetch((const char *)(c + i * ldc + VL * v), _MM_HINT_T1);
        ROWS(PREF)
#undef PREF
    }
#pragma GCC unroll 4
    for (int64_t k = 0, ka = 0; k < kc; k++, ka += aks, b += NR) {
        vf bv[NVM];
        for (int v = 0; v < nv; v++) {
            _mm_prefetch((const char *)(b + PF_B * NR + VL * v), _MM_HINT_T0);
            bv[v] = V_LOAD(b + VL * v);
        }
#define FMA(i)                                                                             \
    {                                                                                      \
        vf ai = V_SET1(a##i[ka]);                                                          \
        for (int v = 0; v < nv; v++) s##i[v] = V_FMA(ai, bv[v], s##i[v]);                  \
    }
        ROWS(FMA)
#undef FMA
    }
    vmask m[NVM];
    const bool full = cols == (int64_t)VL * nv;
    for (int v = 0; v < NVM; v++) m[v] = v_mask(cols - VL * v);
#define STORE(i)                                                                           \
    if (i < rows) store_row(c + i * ldc, s##i, m, full, nv, va, vb, mode);
    ROWS(STORE)
#undef STORE
}

#define KERNEL_NV(nv)                                                                      \
    static void micro_kernel_##nv(int64_t kc, const float *a, int64_t ars, int64_t aks,    \
                                  const float *b, float *c, int64_t ldc, int64_t rows,     \
                                  int64_t cols, vf va, vf vb, int mode) {                  \
        micro_kernel(nv, kc, a, ars, aks, b, c, ldc, rows, cols, va, vb, mode);            \
    }
KERNEL_NV(1)
#if NVM >= 2
KERNEL_NV(2)
#endif
#if NVM >= 3
KERNEL_NV(3)
#endif
#if NVM >= 4
KERNEL_NV(4)
#endif
#if NVM >= 5
KERNEL_NV(5)
#endif
#if NVM >= 6
KERNEL_NV(6)
#endif

/* The micro-kernel for the 16 nv columns that cover cols. */
static void micro_kernel_any(int64_t kc, const float *a, int64_t ars, int64_t aks,
                             const float *b, float *c, int64_t ldc, int64_t rows, int64_t cols,
                             vf va, vf vb, int mode) {
    switch ((cols + VL - 1) / VL) {
#if NVM >= 6
    case 6: micro_kernel_6(kc, a, ars, aks, b, c, ldc, rows, cols, va, vb, mode); break;
#endif
#if NVM >= 5
    case 5: micro_kernel_5(kc, a, ars, aks, b, c, ldc, rows, cols, va, vb, mode); break;
#endif
#if NVM >= 4
    case 4: micro_kernel_4(kc, a, ars, aks, b, c, ldc, rows, cols, va, vb, mode); break;
#endif
#if NVM >= 3
    case 3: micro_kernel_3(kc, a, ars, aks, b, c, ldc, rows, cols, va, vb, mode); break;
#endif
#if NVM >= 2
    case 2: micro_kernel_2(kc, a, ars, aks, b, c, ldc, rows, cols, va, vb, mode); break;
#endif
    default: micro_kernel_1(kc, a, ars, aks, b, c, ldc, rows, cols, va, vb, mode); break;
    }
}

/* ---- tiles --------------------------------------------------------------------------------- */
static void tile_task(int64_t t, void *ctx) {
    job *j = ctx;
    int64_t m0 = t / j->ncols * j->mb, n0 = t % j->ncols * j->nb;
    int64_t m = min64(j->mb, j->M - m0), n = min64(j->nb, j->N - n0);
    int64_t mpan = (m + MR - 1) / MR;
    vf va = V_SET1(j->alpha), vb = V_SET1(j->beta);
    float *ctile = NULL;
    if (j->scratch) {
        int slot = nb__task_slot();
        NB__ASSERT(slot >= 0 && slot < j->nslots);
        ctile = j->scratch + slot * j->slot_floats;
    }
    /* C itself, or (bf16 C) the f32 tile, row stride nb, that starts as the bias */
    float *cbase = ctile ? ctile : j->C + m0 * j->ldc + n0;
    int64_t ldc = ctile ? j->nb : j->ldc;
    if (ctile && j->bias)
        for (int64_t r = 0; r < m; r++)
            memcpy(ctile + r * ldc, j->bias + n0, sizeof(float) * (size_t)n);
    for (int64_t p = 0; p < j->nkb; p++) {
        int64_t k0 = p * j->kc, kcb = kb_len(j, p);
        int mode = p > 0 ? 2 : j->beta != 0.0f ? 1 : 0;
        const float *bblk = j->bp + k0 * j->npan * NR + n0 / NR * kcb * NR;
        /* A: packed (transposed or bf16), or read in place (row i at stride lda, k at
         * stride 1) */
        bool apk = j->ta || j->Ah;
        const float *ablk = apk ? j->ap + k0 * j->mpan * MR + m0 / MR * kcb * MR
                                : j->A + m0 * j->lda + k0;
        int64_t ars = apk ? 1 : j->lda, aks = apk ? MR : 1, astep = apk ? kcb * MR : MR * j->lda;
        for (int64_t ip = 0; ip < mpan; ip++) {
            int64_t rows = min64(MR, m - ip * MR);
            const float *ab = ablk + ip * astep;
            float *c = cbase + ip * MR * ldc;
            for (int64_t jn = 0; jn < n; jn += NR) {
                int64_t cols = min64(NR, n - jn);
                const float *bpan = bblk + jn * kcb;
                micro_kernel_any(kcb, ab, ars, aks, bpan, c + jn, ldc, rows, cols, va, vb,
                                 mode);
            }
        }
    }
    if (ctile) /* rounded once, as nb__f32_to_bf16_n rounds a widened-path result */
        for (int64_t r = 0; r < m; r++)
            nb__f32_to_bf16_n(ctile + r * ldc, j->Ch + (m0 + r) * j->ldc + n0, n);
}

/* Tile sizes: at most MC_MAX x NC_MAX; with several threads, halved (the longer side first,
 * not below MIN_MB x MIN_NB) until there are TASKS_PER_THREAD tiles per thread, so that a
 * thread the scheduler runs late leaves its share to the others. The cut never changes the
 * bits (see the top of the file), so it may depend on the thread count. */
static void tile_grid(job *j, int nthreads) {
    int64_t mb = min64(MC_MAX, (j->M + MR - 1) / MR * MR);
    int64_t nb = min64(NC_MAX, (j->N + NR - 1) / NR * NR);
    for (;;) {
        int64_t tiles = ((j->M + mb - 1) / mb) * ((j->N + nb - 1) / nb);
        if (nthreads <= 1 || tiles >= (int64_t)TASKS_PER_THREAD * nthreads) break;
        bool m_ok = mb / 2 >= MIN_MB, n_ok = nb / 2 >= MIN_NB;
        if (n_ok && (nb >= mb || !m_ok)) nb = (nb / 2 + NR - 1) / NR * NR;
        else if (m_ok) mb = (mb / 2 + MR - 1) / MR * MR;
        else break;
    }
    j->mb = mb, j->nb = nb;
    j->ncols = (j->N + nb - 1) / nb;
}

/* Packs, then runs the tiles; j holds the operands, sizes, alpha and beta. */
static nb_status run_job(job *j) {
    int64_t M = j->M, N = j->N, K = j->K;
    j->nkb = (K + KC_MAX - 1) / KC_MAX;
    j->kc = (K + j->nkb - 1) / j->nkb; /* blocks of equal length, the last one shorter, */
    j->nkb = (K + j->kc - 1) / j->kc;  /* and none empty */
    j->npan = (N + NR - 1) / NR;
    j->mpan = (M + MR - 1) / MR;
    int nthreads = nb_get_num_threads();
    tile_grid(j, nthreads);
    /* A is packed only when transposed (in place, a row of A is the k run the kernel wants);
     * every part starts at a multiple of 16 floats (64 bytes) */
    bool apk = j->ta || j->Ah;
    size_t nbp = (size_t)(j->npan * NR * K), nap = apk ? (size_t)(j->mpan * MR * K) : 0;
    nbp = (nbp + 15) & ~(size_t)15, nap = (nap + 15) & ~(size_t)15;
    j->nslots = nthreads < 1 ? 1 : nthreads;
    j->slot_floats = j->Ch ? (j->mb * j->nb + 15) & ~(int64_t)15 : 0;
    size_t nsc = (size_t)(j->slot_floats * j->nslots);
    j->bp = tbuf_get(&t_pack, nbp + nap + nsc);
    if (!j->bp)
        return nb__error(NB_ENOMEM, "matmul: no memory to pack the operands (%lld floats)",
                         (long long)(nbp + nap + nsc));
    j->ap = j->bp + nbp;
    j->scratch = nsc ? j->bp + nbp + nap : NULL;
    /* packing tasks of at least 64K floats, some per thread */
    int64_t want = (int64_t)TASKS_PER_THREAD * nthreads;
    int64_t per_b = (65536 + NR * K - 1) / (NR * K), per_a = (65536 + MR * K - 1) / (MR * K);
    j->b_task = (j->npan + want - 1) / want;
    if (j->b_task < per_b) j->b_task = per_b;
    j->a_task = (j->mpan + want - 1) / want;
    if (j->a_task < per_a) j->a_task = per_a;
    j->a_tasks = apk ? (j->mpan + j->a_task - 1) / j->a_task : 0;
    nb__run_tasks(j->a_tasks + (j->npan + j->b_task - 1) / j->b_task, nthreads, pack_task, j);
    nb__run_tasks((M + j->mb - 1) / j->mb * j->ncols, nthreads, tile_task, j);
    tbuf_trim(&t_pack);
    return NB_OK;
}

nb_status nb__sgemm_packed(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                           float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                           float beta, float *C, int64_t ldc) {
    job j = {.ta = transA, .tb = transB, .M = M, .N = N, .K = K, .alpha = alpha, .beta = beta,
             .A = A, .B = B, .C = C, .lda = lda, .ldb = ldb, .ldc = ldc};
    return run_job(&j);
}

nb_status nb__sgemm_packed_bf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                                float alpha, const uint16_t *A, int64_t lda, const uint16_t *B,
                                int64_t ldb, float beta, float *C, int64_t ldc) {
    job j = {.ta = transA, .tb = transB, .M = M, .N = N, .K = K, .alpha = alpha, .beta = beta,
             .Ah = A, .Bh = B, .C = C, .lda = lda, .ldb = ldb, .ldc = ldc};
    return run_job(&j);
}

nb_status nb__sgemm_packed_bf16_out(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                                    const uint16_t *A, int64_t lda, const uint16_t *B,
                                    int64_t ldb, const float *bias, uint16_t *C, int64_t ldc) {
    job j = {.ta = transA, .tb = transB, .M = M, .N = N, .K = K, .alpha = 1.0f,
             .beta = bias ? 1.0f : 0.0f, .Ah = A, .Bh = B, .Ch = C, .bias = bias, .lda = lda,
             .ldb = ldb, .ldc = ldc};
    return run_job(&j);
}

#else /* neither AVX-512 nor AVX2 + FMA: cpu/gemm.c never calls this */

nb_status nb__sgemm_packed(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                           float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                           float beta, float *C, int64_t ldc) {
    (void)transA, (void)transB, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda;
    (void)B, (void)ldb, (void)beta, (void)C, (void)ldc;
    return nb__error(NB_EUNSUPPORTED, "matmul: nabla's packed sgemm needs AVX2 and FMA, or "
                                      "AVX-512 (this build was compiled without them)");
}

nb_status nb__sgemm_packed_bf16(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                                float alpha, const uint16_t *A, int64_t lda, const uint16_t *B,
                                int64_t ldb, float beta, float *C, int64_t ldc) {
    (void)transA, (void)transB, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda;
    (void)B, (void)ldb, (void)beta, (void)C, (void)ldc;
    return nb__error(NB_EUNSUPPORTED, "matmul: nabla's packed sgemm needs AVX2 and FMA, or "
                                      "AVX-512 (this build was compiled without them)");
}

nb_status nb__sgemm_packed_bf16_out(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                                    const uint16_t *A, int64_t lda, const uint16_t *B,
                                    int64_t ldb, const float *bias, uint16_t *C, int64_t ldc) {
    (void)transA, (void)transB, (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B;
    (void)ldb, (void)bias, (void)C, (void)ldc;
    return nb__error(NB_EUNSUPPORTED, "matmul: nabla's packed sgemm needs AVX2 and FMA, or "
                                      "AVX-512 (this build was compiled without them)");
}

#endif
