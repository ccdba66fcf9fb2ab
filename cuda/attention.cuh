// cuda/attention.cuh - private to cuda/k_attention.cu and tests/cuda_host/attention.cu: the
// tile geometry and the per-row math of the CUDA causal attention kernels, written once as
// __host__ __device__ functions. The kernels call them on the GPU; the host checks call the
// SAME functions in a sequential emulation of the kernels (same tiles, same loop order,
// same online-softmax updates, same lane reductions) and compare with the CPU backend.
// UNVERIFIED ON A GPU: this code has been compiled (sm_90, compute_80) and its math run on
// the host only.
//
// Algorithm (flash-attention style, plain FMA; contract in tensor/kernels/attention.h):
//   A row of q, dO, o, ... is owned by a GROUP of G adjacent lanes of a warp; lane g of the
//   group holds the DT = DMAX / G (16 for f32, 8 for f64) dimensions d = i G + g (i < DT) of it in registers, so
//   the lanes of a warp read consecutive shared-memory words (no bank conflicts). A dot
//   product of two rows is each lane's partial sum (i ascending, fma) followed by a
//   butterfly over the group (__shfl_xor_sync; group_sum below), after which every lane
//   of the group holds the same bits. DMAX is D rounded up to 16, 32, 64 or 128; the
//   padding dimensions are zero.
//   forward: one block per (b h, block of ROWS query rows); the K and V tiles of BC rows
//     up to the block's last visible key stream through shared memory; per tile and row
//     the scores, the running max m and sum l (online softmax, in the math type A), and
//     acc = acc corr + sum_j p_j v_j. o = acc / l (times 1 / (1 - p) with dropout), and
//     lse = m + log l, as the CPU writes it.
//   backward, three kernels, no atomics, fixed orders:
//     delta: per query row, delta = sum_s P'[t, s] dP[t, s] (the CPU's rowsum(P dP); the
//            op hands no o to the backward, so it is recomputed from q, k, v, lse);
//     dk/dv: one block per (b h, block of ROWS key rows), looping over the query tiles at
//            and below the diagonal, t ascending: dv += P' dO[t], dk += dS q[t];
//     dq:    one block per (b h, block of ROWS query rows), like the forward: dq += dS k[s].
//   Dropout keeps P[b, h, t, s] by the Philox word of element ((b H + h) T + t) T + s, as
//   the CPU (cpu/attention.c) and nb_bernoulli draw it.
#ifndef NABLA_CUDA_ATTENTION_CUH
#define NABLA_CUDA_ATTENTION_CUH

#include <math.h>
#include <stdint.h>

#include "cuda/khelp.h"
#include "tensor/kernels.h"
#include "tensor/philox.h"

#if defined(__CUDACC__)
#define NBA_HD __host__ __device__ __forceinline__
#else
#define NBA_HD inline
#endif
// #pragma unroll for the device pass only (the host compiler warns on it)
#if defined(__CUDA_ARCH__)
#define NBA_UNROLL _Pragma("unroll")
#define NBA_UNROLL4 _Pragma("unroll 4")
#else
#define NBA_UNROLL
#define NBA_UNROLL4
#endif

namespace nbattn {

// ---- storage and math types ----------------------------------------------------------------
// Storage: float, double, or uint16_t holding bf16 bits (math in float).
NBA_HD float to_acc(float x) { return x; }
NBA_HD double to_acc(double x) { return x; }
NBA_HD float to_acc(uint16_t x) { return nb__kh_f32_from_bf16(x); }
NBA_HD void store(float *p, float v) { *p = v; }
NBA_HD void store(double *p, double v) { *p = v; }
NBA_HD void store(uint16_t *p, float v) { *p = nb__kh_bf16_from_f32(v); }

NBA_HD float aexp(float x) { return expf(x); }
NBA_HD double aexp(double x) { return exp(x); }
NBA_HD float alog(float x) { return logf(x); }
NBA_HD double alog(double x) { return log(x); }
NBA_HD float afma(float a, float b, float c) { return fmaf(a, b, c); }
NBA_HD double afma(double a, double b, double c) { return fma(a, b, c); }
template <typename A> NBA_HD A neg_inf() { return -(A)INFINITY; }

// ---- tile geometry -----------------------------------------------------------------------------
// DMAX: the head dimension the kernel is built for (D rounded up); 0 when D is too large.
NBA_HD int dmax_for(int64_t D) {
    return D <= 16 ? 16 : D <= 32 ? 32 : D <= 64 ? 64 : D <= 128 ? 128 : 0;
}

template <typename A, int DMAX> struct Geo {
    // dimensions per lane: 16 of f32, 8 of f64 (the dk/dv pass holds four such arrays)
    static constexpr int DT = sizeof(A) == 4 ? 16 : 8;
    static constexpr int G = DMAX / DT;           // lanes per row (1 to 8; f64 2 to 16)
    static constexpr int THREADS = 128;           // per block
    static constexpr int ROWS = THREADS / G;      // rows (query or key) per block
    // rows of a streamed tile: two (BC, DMAX) tiles of A in shared memory, at most 32 KiB
    static constexpr int BC = (int)(16384 / (DMAX * sizeof(A))) < 32
                                  ? (int)(16384 / (DMAX * sizeof(A)))
                                  : 32;
    static constexpr int SMEM_TILE = BC * DMAX; // elements of one tile
    static_assert(G * DT == DMAX && THREADS % 32 == 0 && 32 % G == 0, "geometry");
};

// Tiles of n rows covering T rows.
NBA_HD int64_t ntiles(int64_t T, int64_t n) { return (T + n - 1) / n; }
// The last key tile (of BC rows) a block of query rows [r0, r0 + rows) sees: the one
// holding its last row (min(r0 + rows, T) - 1), so the strictly upper tiles are skipped.
NBA_HD int64_t last_key_tile(int64_t r0, int64_t rows, int64_t T, int64_t BC) {
    int64_t r1 = r0 + rows < T ? r0 + rows : T;
    return (r1 - 1) / BC;
}
// The first query tile (of BC rows) a block of key rows starting at s0 sees: the one
// holding row s0 (query rows t < s0 see none of these keys).
NBA_HD int64_t first_query_tile(int64_t s0, int64_t BC) { return s0 / BC; }
// The causal mask: query t sees key s (both must be real rows).
NBA_HD bool visible(int64_t t, int64_t s, int64_t T) { return s <= t && t < T; }
// Block y index -> row block, heaviest (last rows) first.
NBA_HD int64_t row_block_of(int64_t y, int64_t nblocks) { return nblocks - 1 - y; }

// Grouped-query attention (tensor/kernels/attention.h): the query heads per key/value head
// (Hkv 0 means H), and the key/value head query head h reads.
NBA_HD int64_t kv_group(const nb__attn_geom &g) { return g.Hkv > 0 ? g.H / g.Hkv : 1; }
NBA_HD int64_t kv_head(const nb__attn_geom &g, int64_t h) { return h / kv_group(g); }

// Element offset of row t of the (b, h) slice of an operand with strides st (B, H, T).
NBA_HD int64_t row_off(const int64_t st[3], int64_t b, int64_t h, int64_t t) {
    return b * st[0] + h * st[1] + t * st[2];
}

// Element e < rows * DMAX of a shared-memory tile holding rows [row0, row0 + rows) of a
// (T, D) slice (row stride ld): zero past T and D. The block's threads fill the tile with
// e = threadIdx.x, += THREADS (coalesced along d).
template <int DMAX, typename S>
NBA_HD auto tile_elem(const S *slice, int64_t ld, int64_t row0, int64_t T, int64_t D, int e)
    -> decltype(to_acc(*slice)) {
    const int r = e / DMAX, d = e % DMAX;
    const int64_t t = row0 + r;
    using A = decltype(to_acc(*slice));
    return t < T && d < D ? to_acc(slice[t * ld + d]) : (A)0;
}

// ---- dropout -------------------------------------------------------------------------------
// The CPU keeps a weight iff (double)w < (1 - p) 2^32 for its 32-bit Philox word w; for an
// integer w that is w < ceil((1 - p) 2^32), an integer compare.
NBA_HD uint64_t keep_threshold(double p) {
    double thr = ceil((1.0 - p) * 4294967296.0);
    return thr <= 0 ? 0 : thr >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)thr;
}
struct Drop {
    bool on;
    uint64_t thr, seed, stream, offset;
    double dscale; // 1 / (1 - p), 0 when p >= 1 (as the CPU)
};
NBA_HD Drop drop_of(const nb__attn_geom *g) {
    Drop d;
    d.on = g->p > 0;
    d.thr = keep_threshold(g->p);
    d.seed = g->seed;
    d.stream = g->stream;
    d.offset = g->offset;
    d.dscale = g->p < 1 ? 1.0 / (1.0 - g->p) : 0.0;
    return d;
}
// Whether element i of the virtual (B, H, T, T) mask is kept.
NBA_HD bool keep(const Drop &d, uint64_t i) {
    const uint64_t blk = d.offset + i / 4;
    uint32_t w[4];
    nb__philox_block((uint32_t)blk, (uint32_t)(blk >> 32), (uint32_t)d.stream,
                     (uint32_t)(d.stream >> 32), (uint32_t)d.seed, (uint32_t)(d.seed >> 32), w);
    const unsigned j = (unsigned)(i & 3u);
    const uint32_t x = j == 0 ? w[0] : j == 1 ? w[1] : j == 2 ? w[2] : w[3];
    return (uint64_t)x < d.thr;
}
NBA_HD uint64_t mask_index(int64_t bh, int64_t T, int64_t t, int64_t s) {
    return ((uint64_t)bh * (uint64_t)T + (uint64_t)t) * (uint64_t)T + (uint64_t)s;
}

// ---- lane groups -------------------------------------------------------------------------------
// Sum over the G lanes of a group. Each function below works on L lane states: L == 1 on
// the GPU (the calling lane; the butterfly is __shfl_xor_sync), L == G on the host (all
// lanes of the group, in an array; the same butterfly: lane l adds lane l ^ o's value, for
// o = G/2, ..., 1), so both orders are the same.
template <int G, int L, typename A> NBA_HD void group_sum(A (&v)[L]) {
    static_assert(L == 1 || L == G, "one lane (device) or the whole group (host)");
    if constexpr (G == 1) {
        return;
    } else if constexpr (L == 1) {
#if defined(__CUDA_ARCH__)
NBA_UNROLL
        for (int o = G / 2; o > 0; o >>= 1) v[0] = v[0] + __shfl_xor_sync(0xffffffffu, v[0], o);
#endif
    } else {
        for (int o = G / 2; o > 0; o >>= 1) {
            A t[L];
            for (int l = 0; l < L; l++) t[l] = v[l] + v[l ^ o];
            for (int l = 0; l < L; l++) v[l] = t[l];
        }
    }
}

// Partial dot product of a lane's DT dimensions (reg) with row `row` of a shared tile.
template <int DMAX, int G, int DT, typename A>
NBA_HD A dot_part(const A (&reg)[DT], const A *tile_row, int lane) {
    A s = 0;
NBA_UNROLL
    for (int i = 0; i < DT; i++) s = afma(reg[i], tile_row[i * G + lane], s);
    return s;
}

// reg (a lane's dimensions of row t of a slice), zero past T and D.
template <int G, int DT, typename S, typename A>
NBA_HD void load_row(A (&reg)[DT], const S *slice, int64_t ld, int64_t t, int64_t T,
                     int64_t D, int lane) {
NBA_UNROLL
    for (int i = 0; i < DT; i++) {
        const int64_t d = (int64_t)i * G + lane;
        reg[i] = t < T && d < D ? to_acc(slice[t * ld + d]) : (A)0;
    }
}
template <int G, int DT, typename S, typename A>
NBA_HD void store_row(const A (&reg)[DT], A f, S *slice, int64_t ld, int64_t t, int64_t T,
                      int64_t D, int lane) {
NBA_UNROLL
    for (int i = 0; i < DT; i++) {
        const int64_t d = (int64_t)i * G + lane;
        if (t < T && d < D) store(slice + t * ld + d, reg[i] * f);
    }
}

// ---- online softmax ------------------------------------------------------------------------------
// One tile's update of a row's running max m and sum l: s holds the tile's scaled scores
// (-inf where masked) and becomes exp(s - m_new) (0 where masked); returns corr, the
// factor the row's accumulator must be multiplied by (0 before any visible score).
template <int BC, typename A> NBA_HD A online_update(A &m, A &l, A (&s)[BC]) {
    A mt = m;
NBA_UNROLL
    for (int j = 0; j < BC; j++) mt = s[j] > mt ? s[j] : mt;
    const A corr = m == neg_inf<A>() ? (A)0 : aexp(m - mt);
    A sum = 0;
NBA_UNROLL
    for (int j = 0; j < BC; j++) {
        s[j] = s[j] == neg_inf<A>() ? (A)0 : aexp(s[j] - mt);
        sum += s[j];
    }
    l = l * corr + sum;
    m = mt;
    return corr;
}
// The log-sum-exp of a finished row, as the CPU writes it (max + log(sum)).
template <typename A> NBA_HD A row_lse(A m, A l) { return m + alog(l); }
// The factor of a finished row's accumulator: 1 / l, times 1 / (1 - p) with dropout.
template <typename A> NBA_HD A row_factor(A l, const Drop &d) {
    const A inv = (A)1 / l;
    return d.on ? inv * (A)d.dscale : inv;
}

// ---- per-row tile bodies (L lanes of one group; see group_sum) ---------------------------------
// Shared arguments of a row's work in one tile.
struct RowCtx {
    int64_t bh, T, t; // the slice, its length, the row (query t or key s)
    double scale;
};

// Forward: row t (q in registers) against the key tile starting at c0 (Ks, Vs in shared
// memory, rows of DMAX).
template <typename A, int DMAX, int L>
NBA_HD void fwd_tile(const RowCtx &rc, const Drop &dr, int lane0,
                     const A (&q)[L][Geo<A, DMAX>::DT], A (&acc)[L][Geo<A, DMAX>::DT],
                     A (&m)[L], A (&l)[L], const A *Ks, const A *Vs, int64_t c0) {
    using Gm = Geo<A, DMAX>;
    constexpr int G = Gm::G, DT = Gm::DT, BC = Gm::BC;
    A s[L][BC];
NBA_UNROLL
    for (int j = 0; j < BC; j++) {
        A part[L];
NBA_UNROLL
        for (int x = 0; x < L; x++) part[x] = dot_part<DMAX, G, DT>(q[x], Ks + j * DMAX, lane0 + x);
        group_sum<G, L>(part);
        const bool vis = visible(rc.t, c0 + j, rc.T);
NBA_UNROLL
        for (int x = 0; x < L; x++) s[x][j] = vis ? part[x] * (A)rc.scale : neg_inf<A>();
    }
NBA_UNROLL
    for (int x = 0; x < L; x++) {
        const A corr = online_update<BC>(m[x], l[x], s[x]);
        if (dr.on) {
NBA_UNROLL
            for (int j = 0; j < BC; j++)
                if (s[x][j] != (A)0 && !keep(dr, mask_index(rc.bh, rc.T, rc.t, c0 + j)))
                    s[x][j] = 0;
        }
NBA_UNROLL
        for (int i = 0; i < DT; i++) {
            A a = acc[x][i] * corr;
NBA_UNROLL
            for (int j = 0; j < BC; j++) a = afma(s[x][j], Vs[j * DMAX + i * G + lane0 + x], a);
            acc[x][i] = a;
        }
    }
}

// The weights of one (t, s) pair in the backward: pd (the dropped, scaled probability the
// forward applied to v[s]) and ds (the score gradient, times scale), from the scaled score
// sc, dp = dO[t] . v[s], the row's lse and delta; as the CPU's bwd_rows.
template <typename A>
NBA_HD void pair_grads(bool vis, A sc, A dp, A lse, A delta, const Drop &dr, bool kept,
                       double scale, A &pd, A &ds) {
    if (!vis) {
        pd = 0;
        ds = 0;
        return;
    }
    const A p = aexp(sc - lse);
    if (dr.on) {
        const A dsc = (A)dr.dscale;
        ds = p * ((kept ? dp * dsc : (A)0) - delta) * (A)scale;
        pd = kept ? p * dsc : (A)0;
    } else {
        ds = p * (dp - delta) * (A)scale;
        pd = p;
    }
}

// Backward, delta pass: row t (q, dO in registers) against a key tile; delta accumulates
// P'[t, s] dP[t, s] (dP = dO . v), s ascending; the caller multiplies by 1 / (1 - p).
template <typename A, int DMAX, int L>
NBA_HD void delta_tile(const RowCtx &rc, const Drop &dr, int lane0,
                       const A (&q)[L][Geo<A, DMAX>::DT], const A (&dO)[L][Geo<A, DMAX>::DT],
                       A lse, A (&delta)[L], const A *Ks, const A *Vs, int64_t c0) {
    using Gm = Geo<A, DMAX>;
    constexpr int G = Gm::G, DT = Gm::DT, BC = Gm::BC;
NBA_UNROLL4
    for (int j = 0; j < BC; j++) {
        A sp[L], dp[L];
NBA_UNROLL
        for (int x = 0; x < L; x++) {
            sp[x] = dot_part<DMAX, G, DT>(q[x], Ks + j * DMAX, lane0 + x);
            dp[x] = dot_part<DMAX, G, DT>(dO[x], Vs + j * DMAX, lane0 + x);
        }
        group_sum<G, L>(sp);
        group_sum<G, L>(dp);
        const int64_t s = c0 + j;
        if (visible(rc.t, s, rc.T) &&
            (!dr.on || keep(dr, mask_index(rc.bh, rc.T, rc.t, s)))) {
NBA_UNROLL
            for (int x = 0; x < L; x++) {
                const A p = aexp(sp[x] * (A)rc.scale - lse);
                delta[x] = afma(p, dp[x], delta[x]);
            }
        }
    }
}

// Backward, dq pass: row t against a key tile: dq += dS[t, s] k[s].
template <typename A, int DMAX, int L>
NBA_HD void dq_tile(const RowCtx &rc, const Drop &dr, int lane0,
                    const A (&q)[L][Geo<A, DMAX>::DT], const A (&dO)[L][Geo<A, DMAX>::DT],
                    A lse, A delta, A (&dq)[L][Geo<A, DMAX>::DT], const A *Ks, const A *Vs,
                    int64_t c0) {
    using Gm = Geo<A, DMAX>;
    constexpr int G = Gm::G, DT = Gm::DT, BC = Gm::BC;
NBA_UNROLL4
    for (int j = 0; j < BC; j++) {
        A sp[L], dp[L];
NBA_UNROLL
        for (int x = 0; x < L; x++) {
            sp[x] = dot_part<DMAX, G, DT>(q[x], Ks + j * DMAX, lane0 + x);
            dp[x] = dot_part<DMAX, G, DT>(dO[x], Vs + j * DMAX, lane0 + x);
        }
        group_sum<G, L>(sp);
        group_sum<G, L>(dp);
        const int64_t s = c0 + j;
        const bool vis = visible(rc.t, s, rc.T);
        const bool kept = vis && (!dr.on || keep(dr, mask_index(rc.bh, rc.T, rc.t, s)));
NBA_UNROLL
        for (int x = 0; x < L; x++) {
            A pd, ds;
            pair_grads(vis, sp[x] * (A)rc.scale, dp[x], lse, delta, dr, kept, rc.scale, pd, ds);
NBA_UNROLL
            for (int i = 0; i < DT; i++)
                dq[x][i] = afma(ds, Ks[j * DMAX + i * G + lane0 + x], dq[x][i]);
        }
    }
}

// Backward, dk/dv pass: key row s (k, v in registers; rc.t = s) against a query tile
// starting at t0 (Qs, dOs in shared memory, with the rows' lse and delta):
// dv += P'[t, s] dO[t], dk += dS[t, s] q[t], t ascending.
template <typename A, int DMAX, int L>
NBA_HD void dkdv_tile(const RowCtx &rc, const Drop &dr, int lane0,
                      const A (&k)[L][Geo<A, DMAX>::DT], const A (&v)[L][Geo<A, DMAX>::DT],
                      A (&dk)[L][Geo<A, DMAX>::DT], A (&dv)[L][Geo<A, DMAX>::DT],
                      const A *Qs, const A *dOs, const A *lse_s, const A *delta_s, int64_t t0) {
    using Gm = Geo<A, DMAX>;
    constexpr int G = Gm::G, DT = Gm::DT, BC = Gm::BC;
    const int64_t s = rc.t;
NBA_UNROLL4
    for (int j = 0; j < BC; j++) {
        A sp[L], dp[L];
NBA_UNROLL
        for (int x = 0; x < L; x++) {
            sp[x] = dot_part<DMAX, G, DT>(k[x], Qs + j * DMAX, lane0 + x);
            dp[x] = dot_part<DMAX, G, DT>(v[x], dOs + j * DMAX, lane0 + x);
        }
        group_sum<G, L>(sp);
        group_sum<G, L>(dp);
        const int64_t t = t0 + j;
        const bool vis = s < rc.T && visible(t, s, rc.T);
        const bool kept = vis && (!dr.on || keep(dr, mask_index(rc.bh, rc.T, t, s)));
NBA_UNROLL
        for (int x = 0; x < L; x++) {
            A pd, ds;
            pair_grads(vis, sp[x] * (A)rc.scale, dp[x], lse_s[j], delta_s[j], dr, kept,
                       rc.scale, pd, ds);
NBA_UNROLL
            for (int i = 0; i < DT; i++) {
                dv[x][i] = afma(pd, dOs[j * DMAX + i * G + lane0 + x], dv[x][i]);
                dk[x][i] = afma(ds, Qs[j * DMAX + i * G + lane0 + x], dk[x][i]);
            }
        }
    }
}


// ---- bf16 forward on tensor cores (k_attention.cu: attn_fwd_wmma) -------------------------------
// Four warps, BR = 64 query rows (16 a warp), key tiles of BC = 64. Per tile, warp w:
//   S = q[16 rows] k^T (nvcuda::wmma 16x16x16, bf16 in, f32 out) into shared memory;
//   lanes 0..15 each take a row: wmma_row_step (below) updates the running max and sum,
//   writes the weights exp(s - m) rounded to bf16 (0 where masked or dropped) and scales
//   the row of the f32 accumulator O (shared memory) by corr;
//   O += P v (wmma).
// At the end o = O / l (times 1 / (1 - p)), lse = m + log l. The weights are rounded to bf16
// before the product with v, as the CPU's AVX512-BF16 kernel and PyTorch's bf16 flash
// attention do; the statistics stay f32.
template <int DMAX> struct WGeo {
    static constexpr int BR = 64, BC = 64, WARPS = 4, THREADS = 128;
    static constexpr int LDH = DMAX + 8; // bf16 tiles q, k, v: row stride (elements)
    static constexpr int LDS = BC + 4;   // f32 scores
    static constexpr int LDP = BC + 8;   // bf16 weights
    static constexpr int LDO = DMAX + 4; // f32 accumulator
    // byte offsets in dynamic shared memory (each a multiple of 32: wmma's alignment)
    static constexpr size_t Q = 0, K = Q + (size_t)BR * LDH * 2, V = K + (size_t)BC * LDH * 2;
    static constexpr size_t S = V + (size_t)BC * LDH * 2, P = S + (size_t)BR * LDS * 4;
    static constexpr size_t O = P + (size_t)BR * LDP * 2, ML = O + (size_t)BR * LDO * 4;
    static constexpr size_t BYTES = ML + (size_t)BR * 2 * 4; // + m, l of each row
    static_assert(K % 32 == 0 && V % 32 == 0 && S % 32 == 0 && P % 32 == 0 && O % 32 == 0 &&
                      ML % 32 == 0 && (16 * LDH * 2) % 32 == 0 && (16 * LDS * 4) % 32 == 0 &&
                      (16 * LDP * 2) % 32 == 0 && (16 * LDO * 4) % 32 == 0,
                  "wmma pointers must be 32-byte aligned");
};

// Element e < rows * DMAX of a bf16 tile (row stride LD elements) holding rows [row0, ...)
// of a (T, D) slice: the bits, zero past T and D.
template <int DMAX, int LD>
NBA_HD void tile_bits(uint16_t *tile, const uint16_t *slice, int64_t ld, int64_t row0,
                      int64_t T, int64_t D, int e) {
    const int r = e / DMAX, d = e % DMAX;
    const int64_t t = row0 + r;
    tile[r * LD + d] = t < T && d < D ? slice[t * ld + d] : (uint16_t)0;
}

// One row's online-softmax step on a tile of raw scores S[0, bc) (q . k, not yet scaled):
// P[j] = bf16(exp(S[j] scale - m_new)) where visible and kept (else 0); the sum takes the
// unrounded values of every visible weight (dropped ones too, as the CPU); the row's
// accumulator O[0, dmax) is multiplied by corr.
NBA_HD void wmma_row_step(const float *S, uint16_t *P, float *O, int bc, int dmax, int64_t t,
                          int64_t c0, int64_t T, float scale, const Drop &dr, int64_t bh,
                          float &m, float &l) {
    float mt = m;
    for (int j = 0; j < bc; j++)
        if (visible(t, c0 + j, T)) {
            const float s = S[j] * scale;
            mt = s > mt ? s : mt;
        }
    const float corr = m == neg_inf<float>() ? 0.0f : aexp(m - mt);
    float sum = 0;
    for (int j = 0; j < bc; j++) {
        float p = 0;
        if (visible(t, c0 + j, T)) {
            p = aexp(S[j] * scale - mt);
            sum += p;
        }
        const bool kept = p != 0 && (!dr.on || keep(dr, mask_index(bh, T, t, c0 + j)));
        P[j] = kept ? nb__kh_bf16_from_f32(p) : (uint16_t)0;
    }
    l = l * corr + sum;
    m = mt;
    for (int d = 0; d < dmax; d++) O[d] *= corr;
}

} // namespace nbattn

#endif
