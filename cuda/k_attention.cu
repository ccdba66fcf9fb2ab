// cuda/k_attention.cu - CUDA kernels of the attention family (tensor/kernels/attention.h):
// fused causal attention forward (o and the rows' log-sum-exp) and backward (dq, dk, dv),
// flash-attention style with plain FMA tiles: f32 and f64 operands, and bf16 operands with
// f32 math and statistics (be->attention_bf16). The bf16 forward runs on tensor cores
// (nvcuda::wmma, attn_fwd_wmma) when the device gives a block its shared memory (up to
// 110 KiB at D = 128), else on the FMA kernel; the bf16 backward is the FMA one. Head
// dimensions up to 128; larger ones return NB_EUNSUPPORTED. Deterministic: no atomics,
// every sum in a fixed order.
// The algorithm and the per-row math are in cuda/attention.cuh (checked on the host by
// tests/cuda_host/attention.cu). UNVERIFIED ON A GPU: compiled only; nothing here has run on
// a device yet.
#include <cuda_bf16.h>
#include <string.h>
#include <mma.h>

#include "cuda/attention.cuh"
#include "cuda/kcommon.cuh"

namespace {

using namespace nbattn;

// o, lse of the rows of one block of query rows of one (b, h) slice.
template <typename S, typename A, int DMAX>
__global__ void __launch_bounds__(Geo<A, DMAX>::THREADS)
    attn_fwd(nb__attn_geom g, const S *q, const S *k, const S *v, S *o, A *lse) {
    using Gm = Geo<A, DMAX>;
    constexpr int G = Gm::G, DT = Gm::DT, BC = Gm::BC, ROWS = Gm::ROWS;
    __shared__ A Ks[Gm::SMEM_TILE], Vs[Gm::SMEM_TILE];
    const int64_t T = g.T, D = g.D, bh = blockIdx.x, b = bh / g.H, h = bh % g.H;
    const int64_t r0 = row_block_of(blockIdx.y, ntiles(T, ROWS)) * ROWS;
    const int tid = threadIdx.x, lane = tid % G;
    const int64_t t = r0 + tid / G, hk = kv_head(g, h);
    const S *qs = q + row_off(g.sq, b, h, 0), *ks = k + row_off(g.sk, b, hk, 0);
    const S *vs = v + row_off(g.sv, b, hk, 0);
    A qr[1][DT], acc[1][DT], m[1] = {neg_inf<A>()}, l[1] = {0};
    load_row<G, DT>(qr[0], qs, g.sq[2], t, T, D, lane);
#pragma unroll
    for (int i = 0; i < DT; i++) acc[0][i] = 0;
    const Drop dr = drop_of(&g);
    const RowCtx rc = {bh, T, t, g.scale};
    const int64_t last = last_key_tile(r0, ROWS, T, BC);
    for (int64_t kt = 0; kt <= last; kt++) {
        const int64_t c0 = kt * BC;
        __syncthreads(); // the previous tile is no longer read
        for (int e = tid; e < Gm::SMEM_TILE; e += Gm::THREADS) {
            Ks[e] = tile_elem<DMAX>(ks, g.sk[2], c0, T, D, e);
            Vs[e] = tile_elem<DMAX>(vs, g.sv[2], c0, T, D, e);
        }
        __syncthreads();
        fwd_tile<A, DMAX, 1>(rc, dr, lane, qr, acc, m, l, Ks, Vs, c0);
    }
    store_row<G, DT>(acc[0], row_factor(l[0], dr), o + row_off(g.so, b, h, 0), g.so[2], t, T,
                     D, lane);
    if (lane == 0 && t < T) lse[bh * T + t] = row_lse(m[0], l[0]);
}

// Backward, delta[t] = sum_s P'[t, s] (dO[t] . v[s]) (times 1 / (1 - p)) of one block of
// query rows.
template <typename S, typename A, int DMAX>
__global__ void __launch_bounds__(Geo<A, DMAX>::THREADS)
    attn_delta(nb__attn_geom g, const S *q, const S *k, const S *v, const A *lse, const S *dout,
               A *delta) {
    using Gm = Geo<A, DMAX>;
    constexpr int G = Gm::G, DT = Gm::DT, BC = Gm::BC, ROWS = Gm::ROWS;
    __shared__ A Ks[Gm::SMEM_TILE], Vs[Gm::SMEM_TILE];
    const int64_t T = g.T, D = g.D, bh = blockIdx.x, b = bh / g.H, h = bh % g.H;
    const int64_t r0 = row_block_of(blockIdx.y, ntiles(T, ROWS)) * ROWS;
    const int tid = threadIdx.x, lane = tid % G;
    const int64_t t = r0 + tid / G, hk = kv_head(g, h);
    const S *ks = k + row_off(g.sk, b, hk, 0), *vs = v + row_off(g.sv, b, hk, 0);
    A qr[1][DT], dor[1][DT], dl[1] = {0};
    load_row<G, DT>(qr[0], q + row_off(g.sq, b, h, 0), g.sq[2], t, T, D, lane);
    load_row<G, DT>(dor[0], dout + row_off(g.sdo, b, h, 0), g.sdo[2], t, T, D, lane);
    const A lt = t < T ? lse[bh * T + t] : (A)0;
    const Drop dr = drop_of(&g);
    const RowCtx rc = {bh, T, t, g.scale};
    const int64_t last = last_key_tile(r0, ROWS, T, BC);
    for (int64_t kt = 0; kt <= last; kt++) {
        const int64_t c0 = kt * BC;
        __syncthreads();
        for (int e = tid; e < Gm::SMEM_TILE; e += Gm::THREADS) {
            Ks[e] = tile_elem<DMAX>(ks, g.sk[2], c0, T, D, e);
            Vs[e] = tile_elem<DMAX>(vs, g.sv[2], c0, T, D, e);
        }
        __syncthreads();
        delta_tile<A, DMAX, 1>(rc, dr, lane, qr, dor, lt, dl, Ks, Vs, c0);
    }
    if (lane == 0 && t < T) delta[bh * T + t] = dr.on ? dl[0] * (A)dr.dscale : dl[0];
}

// Backward, dq of one block of query rows.
template <typename S, typename A, int DMAX>
__global__ void __launch_bounds__(Geo<A, DMAX>::THREADS)
    attn_dq(nb__attn_geom g, const S *q, const S *k, const S *v, const A *lse, const S *dout,
            const A *delta, S *dq) {
    using Gm = Geo<A, DMAX>;
    constexpr int G = Gm::G, DT = Gm::DT, BC = Gm::BC, ROWS = Gm::ROWS;
    __shared__ A Ks[Gm::SMEM_TILE], Vs[Gm::SMEM_TILE];
    const int64_t T = g.T, D = g.D, bh = blockIdx.x, b = bh / g.H, h = bh % g.H;
    const int64_t r0 = row_block_of(blockIdx.y, ntiles(T, ROWS)) * ROWS;
    const int tid = threadIdx.x, lane = tid % G;
    const int64_t t = r0 + tid / G, hk = kv_head(g, h);
    const S *ks = k + row_off(g.sk, b, hk, 0), *vs = v + row_off(g.sv, b, hk, 0);
    A qr[1][DT], dor[1][DT], acc[1][DT];
    load_row<G, DT>(qr[0], q + row_off(g.sq, b, h, 0), g.sq[2], t, T, D, lane);
    load_row<G, DT>(dor[0], dout + row_off(g.sdo, b, h, 0), g.sdo[2], t, T, D, lane);
#pragma unroll
    for (int i = 0; i < DT; i++) acc[0][i] = 0;
    const A lt = t < T ? lse[bh * T + t] : (A)0, dt = t < T ? delta[bh * T + t] : (A)0;
    const Drop dr = drop_of(&g);
    const RowCtx rc = {bh, T, t, g.scale};
    const int64_t last = last_key_tile(r0, ROWS, T, BC);
    for (int64_t kt = 0; kt <= last; kt++) {
        const int64_t c0 = kt * BC;
        __syncthreads();
        for (int e = tid; e < Gm::SMEM_TILE; e += Gm::THREADS) {
            Ks[e] = tile_elem<DMAX>(ks, g.sk[2], c0, T, D, e);
            Vs[e] = tile_elem<DMAX>(vs, g.sv[2], c0, T, D, e);
        }
        __syncthreads();
        dq_tile<A, DMAX, 1>(rc, dr, lane, qr, dor, lt, dt, acc, Ks, Vs, c0);
    }
    store_row<G, DT>(acc[0], (A)1, dq + row_off(g.sdq, b, h, 0), g.sdq[2], t, T, D, lane);
}

// Backward, dk and dv of one block of key rows: the query tiles at and below the diagonal,
// in order. dk or dv may be NULL (not wanted); delta NULL when dk is not wanted. With grouped
// key/value heads (kv_group > 1) each query head's block reads its key/value head's rows and
// writes that head's share to dk, dv at the query head's index (O = A: per-head f32/f64
// scratch, which kv_sum then adds up per group); O = S otherwise.
template <typename S, typename A, int DMAX, typename O>
__global__ void __launch_bounds__(Geo<A, DMAX>::THREADS)
    attn_dkdv(nb__attn_geom g, const S *q, const S *k, const S *v, const A *lse, const S *dout,
              const A *delta, O *dk, O *dv) {
    using Gm = Geo<A, DMAX>;
    constexpr int G = Gm::G, DT = Gm::DT, BC = Gm::BC, ROWS = Gm::ROWS;
    __shared__ A Qs[Gm::SMEM_TILE], dOs[Gm::SMEM_TILE], ls[BC], dls[BC];
    const int64_t T = g.T, D = g.D, bh = blockIdx.x, b = bh / g.H, h = bh % g.H;
    const int64_t s0 = (int64_t)blockIdx.y * ROWS; // the first key blocks see most rows
    const int tid = threadIdx.x, lane = tid % G;
    const int64_t s = s0 + tid / G;
    const S *qs = q + row_off(g.sq, b, h, 0), *dos = dout + row_off(g.sdo, b, h, 0);
    A kr[1][DT], vr[1][DT], dka[1][DT], dva[1][DT];
    load_row<G, DT>(kr[0], k + row_off(g.sk, b, kv_head(g, h), 0), g.sk[2], s, T, D, lane);
    load_row<G, DT>(vr[0], v + row_off(g.sv, b, kv_head(g, h), 0), g.sv[2], s, T, D, lane);
#pragma unroll
    for (int i = 0; i < DT; i++) dka[0][i] = dva[0][i] = 0;
    const Drop dr = drop_of(&g);
    const RowCtx rc = {bh, T, s, g.scale};
    const int64_t nq = ntiles(T, BC);
    for (int64_t qt = first_query_tile(s0, BC); qt < nq; qt++) {
        const int64_t t0 = qt * BC;
        __syncthreads();
        for (int e = tid; e < Gm::SMEM_TILE; e += Gm::THREADS) {
            Qs[e] = tile_elem<DMAX>(qs, g.sq[2], t0, T, D, e);
            dOs[e] = tile_elem<DMAX>(dos, g.sdo[2], t0, T, D, e);
        }
        for (int e = tid; e < BC; e += Gm::THREADS) {
            const int64_t t = t0 + e;
            ls[e] = t < T ? lse[bh * T + t] : (A)0;
            dls[e] = t < T && delta ? delta[bh * T + t] : (A)0;
        }
        __syncthreads();
        dkdv_tile<A, DMAX, 1>(rc, dr, lane, kr, vr, dka, dva, Qs, dOs, ls, dls, t0);
    }
    if (dk) store_row<G, DT>(dka[0], (A)1, dk + row_off(g.sdk, b, h, 0), g.sdk[2], s, T, D, lane);
    if (dv) store_row<G, DT>(dva[0], (A)1, dv + row_off(g.sdv, b, h, 0), g.sdv[2], s, T, D, lane);
}

// Grouped key/value heads: out (B, Hkv, T, D with strides so) = the sum over each group's query
// heads, in head order, of part (B, H, T, D contiguous, one share per query head).
template <typename O, typename A>
__global__ void kv_sum(nb__attn_geom g, const A *part, O *out, int64_t so0, int64_t so1,
                       int64_t so2) {
    const int64_t rep = kv_group(g), hkv = g.H / rep, T = g.T, D = g.D;
    const int64_t n = g.B * hkv * T * D;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t d = i % D, t = i / D % T, hk = i / (D * T) % hkv, b = i / (D * T * hkv);
        const A *p = part + ((b * g.H + hk * rep) * T + t) * D + d;
        A sum = p[0];
        for (int64_t r = 1; r < rep; r++) sum = sum + p[r * T * D];
        store(out + b * so0 + hk * so1 + t * so2 + d, sum);
    }
}


// bf16 forward on tensor cores (cuda/attention.cuh, WGeo): one block of 64 query rows.
template <int DMAX>
__global__ void __launch_bounds__(WGeo<DMAX>::THREADS)
    attn_fwd_wmma(nb__attn_geom g, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                  uint16_t *o, float *lse) {
    namespace wm = nvcuda::wmma;
    using W = WGeo<DMAX>;
    constexpr int BR = W::BR, BC = W::BC;
    extern __shared__ __align__(128) unsigned char smem[];
    uint16_t *Qs = (uint16_t *)(smem + W::Q), *Ks = (uint16_t *)(smem + W::K);
    uint16_t *Vs = (uint16_t *)(smem + W::V), *Ps = (uint16_t *)(smem + W::P);
    float *Ss = (float *)(smem + W::S), *Os = (float *)(smem + W::O), *ML = (float *)(smem + W::ML);
    const int64_t T = g.T, D = g.D, bh = blockIdx.x, b = bh / g.H, h = bh % g.H;
    const int64_t r0 = row_block_of(blockIdx.y, ntiles(T, BR)) * BR;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const uint16_t *ks = k + row_off(g.sk, b, kv_head(g, h), 0);
    const uint16_t *vs = v + row_off(g.sv, b, kv_head(g, h), 0);
    for (int e = tid; e < BR * DMAX; e += W::THREADS)
        tile_bits<DMAX, W::LDH>(Qs, q + row_off(g.sq, b, h, 0), g.sq[2], r0, T, D, e);
    for (int e = tid; e < BR * W::LDO; e += W::THREADS) Os[e] = 0;
    const Drop dr = drop_of(&g);
    const int row = warp * 16 + (lane & 15); // the row lanes 0..15 own
    float m = neg_inf<float>(), l = 0;
    const int64_t last = last_key_tile(r0, BR, T, BC);
    const __nv_bfloat16 *Qb = (const __nv_bfloat16 *)Qs + warp * 16 * W::LDH;
    const __nv_bfloat16 *Kb = (const __nv_bfloat16 *)Ks, *Vb = (const __nv_bfloat16 *)Vs;
    const __nv_bfloat16 *Pb = (const __nv_bfloat16 *)Ps + warp * 16 * W::LDP;
    float *Sw = Ss + warp * 16 * W::LDS, *Ow = Os + warp * 16 * W::LDO;
    for (int64_t kt = 0; kt <= last; kt++) {
        const int64_t c0 = kt * BC;
        __syncthreads(); // the previous K, V tiles are no longer read
        for (int e = tid; e < BC * DMAX; e += W::THREADS) {
            tile_bits<DMAX, W::LDH>(Ks, ks, g.sk[2], c0, T, D, e);
            tile_bits<DMAX, W::LDH>(Vs, vs, g.sv[2], c0, T, D, e);
        }
        __syncthreads();
        // S = q k^T for the warp's 16 rows
        for (int n = 0; n < BC / 16; n++) {
            wm::fragment<wm::accumulator, 16, 16, 16, float> c;
            wm::fill_fragment(c, 0.0f);
            for (int kk = 0; kk < DMAX / 16; kk++) {
                wm::fragment<wm::matrix_a, 16, 16, 16, __nv_bfloat16, wm::row_major> fa;
                wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, wm::col_major> fb;
                wm::load_matrix_sync(fa, Qb + kk * 16, W::LDH);
                wm::load_matrix_sync(fb, Kb + n * 16 * W::LDH + kk * 16, W::LDH);
                wm::mma_sync(c, fa, fb, c);
            }
            wm::store_matrix_sync(Sw + n * 16, c, W::LDS, wm::mem_row_major);
        }
        __syncwarp();
        if (lane < 16) {
            wmma_row_step(Ss + row * W::LDS, Ps + row * W::LDP, Os + row * W::LDO, BC, DMAX,
                          r0 + row, c0, T, (float)g.scale, dr, bh, m, l);
        }
        __syncwarp();
        // O += P v for the warp's 16 rows
        for (int n = 0; n < DMAX / 16; n++) {
            wm::fragment<wm::accumulator, 16, 16, 16, float> c;
            wm::load_matrix_sync(c, Ow + n * 16, W::LDO, wm::mem_row_major);
            for (int kk = 0; kk < BC / 16; kk++) {
                wm::fragment<wm::matrix_a, 16, 16, 16, __nv_bfloat16, wm::row_major> fa;
                wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, wm::row_major> fb;
                wm::load_matrix_sync(fa, Pb + kk * 16, W::LDP);
                wm::load_matrix_sync(fb, Vb + kk * 16 * W::LDH + n * 16, W::LDH);
                wm::mma_sync(c, fa, fb, c);
            }
            wm::store_matrix_sync(Ow + n * 16, c, W::LDO, wm::mem_row_major);
        }
        __syncwarp();
    }
    if (lane < 16) {
        ML[2 * row] = m;
        ML[2 * row + 1] = l;
    }
    __syncwarp();
    uint16_t *os = o + row_off(g.so, b, h, 0);
    for (int e = lane; e < 16 * DMAX; e += 32) {
        const int r = warp * 16 + e / DMAX, d = e % DMAX;
        const int64_t t = r0 + r;
        if (t < T && d < D) store(os + t * g.so[2] + d, Os[r * W::LDO + d] * row_factor(ML[2 * r + 1], dr));
    }
    if (lane < 16 && r0 + row < T) lse[bh * T + r0 + row] = row_lse(m, l);
}

// Grid limits: (b h) on x, row blocks on y (at least 8 rows a block: f64, D > 64).
nb_status check_geom(const nb__attn_geom &g, const char *op) {
    if (dmax_for(g.D) == 0)
        return nb__error(NB_EUNSUPPORTED,
                         "%s: the cuda kernel does not handle head dimension %lld (> 128) yet",
                         op, (long long)g.D);
    if (g.B * g.H > 2147483647LL || ntiles(g.T, 8) > 65535)
        return nb__error(NB_EUNSUPPORTED,
                         "%s: the cuda kernel does not handle B*H = %lld, T = %lld (grid too "
                         "large) yet", op, (long long)(g.B * g.H), (long long)g.T);
    return NB_OK;
}

template <typename A, int DMAX> dim3 grid_of(const nb__attn_geom &g) {
    return dim3((unsigned)(g.B * g.H), (unsigned)ntiles(g.T, Geo<A, DMAX>::ROWS));
}

template <typename S, typename A, int DMAX>
void fwd_launch(const nb__attention_args *a, cudaStream_t st) {
    attn_fwd<S, A, DMAX><<<grid_of<A, DMAX>(a->g), Geo<A, DMAX>::THREADS, 0, st>>>(
        a->g, (const S *)a->q, (const S *)a->k, (const S *)a->v, (S *)a->o, (A *)a->lse);
}

template <typename S, typename A, int DMAX>
void bwd_launch(const nb__attention_backward_args *a, A *delta, A *kv_part, cudaStream_t st) {
    const dim3 grid = grid_of<A, DMAX>(a->g);
    constexpr int TH = Geo<A, DMAX>::THREADS;
    const S *q = (const S *)a->q, *k = (const S *)a->k, *v = (const S *)a->v;
    const S *dout = (const S *)a->dout;
    const A *lse = (const A *)a->lse;
    if (delta) attn_delta<S, A, DMAX><<<grid, TH, 0, st>>>(a->g, q, k, v, lse, dout, delta);
    if (a->dq)
        attn_dq<S, A, DMAX><<<grid, TH, 0, st>>>(a->g, q, k, v, lse, dout, delta, (S *)a->dq);
    if (!a->dk && !a->dv) return;
    if (kv_group(a->g) == 1) {
        attn_dkdv<S, A, DMAX, S><<<grid, TH, 0, st>>>(a->g, q, k, v, lse, dout,
                                                      a->dk ? delta : nullptr, (S *)a->dk,
                                                      (S *)a->dv);
        return;
    }
    // grouped key/value heads: each query head's share into kv_part (B, H, T, D contiguous,
    // dk's then dv's), then each group's sum in head order
    const nb__attn_geom &g = a->g;
    const int64_t n = g.B * g.H * g.T * g.D;
    nb__attn_geom gs = g;
    const int64_t cs[3] = {g.H * g.T * g.D, g.T * g.D, g.D};
    memcpy(gs.sdk, cs, sizeof cs), memcpy(gs.sdv, cs, sizeof cs);
    A *pk = a->dk ? kv_part : nullptr, *pv = a->dv ? kv_part + n : nullptr;
    attn_dkdv<S, A, DMAX, A><<<grid, TH, 0, st>>>(gs, q, k, v, lse, dout, a->dk ? delta : nullptr,
                                                  pk, pv);
    const int64_t nkv = n / kv_group(g);
    if (pk)
        kv_sum<S, A><<<nbk::nb_blocks(nkv), nbk::kThreads, 0, st>>>(g, pk, (S *)a->dk, g.sdk[0], g.sdk[1],
                                                          g.sdk[2]);
    if (pv)
        kv_sum<S, A><<<nbk::nb_blocks(nkv), nbk::kThreads, 0, st>>>(g, pv, (S *)a->dv, g.sdv[0], g.sdv[1],
                                                          g.sdv[2]);
}

#define NB_ATTN_DMAX_SWITCH(dm, F, ...)                                                    \
    switch (dm) {                                                                          \
    case 16: F<S, A, 16>(__VA_ARGS__); break;                                              \
    case 32: F<S, A, 32>(__VA_ARGS__); break;                                              \
    case 64: F<S, A, 64>(__VA_ARGS__); break;                                              \
    default: F<S, A, 128>(__VA_ARGS__); break;                                             \
    }

template <typename S, typename A> void fwd_dispatch(const nb__attention_args *a, cudaStream_t st) {
    NB_ATTN_DMAX_SWITCH(dmax_for(a->g.D), fwd_launch, a, st)
}
template <typename S, typename A>
void bwd_dispatch(const nb__attention_backward_args *a, void *delta, void *kv_part,
                  cudaStream_t st) {
    NB_ATTN_DMAX_SWITCH(dmax_for(a->g.D), bwd_launch, a, (A *)delta, (A *)kv_part, st)
}

// The tensor-core forward of bf16 operands, when the device can give the block its shared
// memory; false when not launched (the FMA kernel then runs).
template <int DMAX> bool wmma_launch(const nb__attention_args *a, const nb__cuda_kctx &c) {
    using W = WGeo<DMAX>;
    if (W::BYTES > nb__cuda_devinfo_of(c.device)->smem_per_block_optin) return false;
    if (cudaFuncSetAttribute(attn_fwd_wmma<DMAX>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)W::BYTES) != cudaSuccess) {
        (void)cudaGetLastError(); // cleared: the FMA kernel runs instead
        return false;
    }
    const dim3 grid((unsigned)(a->g.B * a->g.H), (unsigned)ntiles(a->g.T, W::BR));
    attn_fwd_wmma<DMAX><<<grid, W::THREADS, W::BYTES, c.stream>>>(
        a->g, (const uint16_t *)a->q, (const uint16_t *)a->k, (const uint16_t *)a->v,
        (uint16_t *)a->o, (float *)a->lse);
    return true;
}
bool wmma_dispatch(const nb__attention_args *a, const nb__cuda_kctx &c) {
    switch (dmax_for(a->g.D)) {
    case 16: return wmma_launch<16>(a, c);
    case 32: return wmma_launch<32>(a, c);
    case 64: return wmma_launch<64>(a, c);
    default: return wmma_launch<128>(a, c);
    }
}

nb_status cuda_attention(const nb__attention_args *a) {
    const nb__attn_geom &g = a->g;
    if (g.B * g.H == 0 || g.T == 0) return NB_OK;
    nb_status st = check_geom(g, "attention");
    if (st != NB_OK) return st;
    if (!a->bf16 && a->dtype != NB_F32 && a->dtype != NB_F64)
        return nb__error(NB_EUNSUPPORTED, "attention: the cuda kernel does not handle dtype %d",
                         (int)a->dtype);
    nb__cuda_kctx c;
    st = nb__cuda_kbegin(&c, "attention");
    if (st != NB_OK) return st;
    if (a->bf16) {
        if (!wmma_dispatch(a, c)) fwd_dispatch<uint16_t, float>(a, c.stream);
    } else if (a->dtype == NB_F64) {
        fwd_dispatch<double, double>(a, c.stream);
    } else {
        fwd_dispatch<float, float>(a, c.stream);
    }
    return nb__cuda_kend(&c, cudaGetLastError());
}

nb_status cuda_attention_backward(const nb__attention_backward_args *a) {
    const nb__attn_geom &g = a->g;
    if (g.B * g.H == 0 || g.T == 0 || (!a->dq && !a->dk && !a->dv)) return NB_OK;
    nb_status st = check_geom(g, "attention_backward");
    if (st != NB_OK) return st;
    if (!a->bf16 && a->dtype != NB_F32 && a->dtype != NB_F64)
        return nb__error(NB_EUNSUPPORTED,
                         "attention_backward: the cuda kernel does not handle dtype %d",
                         (int)a->dtype);
    nb__cuda_kctx c;
    st = nb__cuda_kbegin(&c, "attention_backward");
    if (st != NB_OK) return st;
    // delta (B, H, T) in the math type: needed for dq and dk only
    const size_t es = !a->bf16 && a->dtype == NB_F64 ? sizeof(double) : sizeof(float);
    void *delta = NULL;
    if (a->dq || a->dk) {
        delta = nb__cuda_kscratch(&c, (size_t)(g.B * g.H * g.T) * es);
        if (!delta) {
            (void)nb__cuda_kend(&c, cudaSuccess);
            return nb__error(NB_ENOMEM, "attention_backward: no device memory for %zu bytes of "
                             "scratch", (size_t)(g.B * g.H * g.T) * es);
        }
    }
    // grouped key/value heads: each query head's share of dk and dv, in the math type
    void *kv_part = NULL;
    const size_t kv_bytes = 2 * (size_t)(g.B * g.H * g.T * g.D) * es;
    if (kv_group(g) > 1 && (a->dk || a->dv) && !(kv_part = nb__cuda_kscratch(&c, kv_bytes))) {
        if (delta) nb__cuda_kfree(delta);
        (void)nb__cuda_kend(&c, cudaSuccess);
        return nb__error(NB_ENOMEM, "attention_backward: no device memory for %zu bytes of "
                         "scratch", kv_bytes);
    }
    if (a->bf16) {
        bwd_dispatch<uint16_t, float>(a, delta, kv_part, c.stream);
    } else if (a->dtype == NB_F64) {
        bwd_dispatch<double, double>(a, delta, kv_part, c.stream);
    } else {
        bwd_dispatch<float, float>(a, delta, kv_part, c.stream);
    }
    cudaError_t e = cudaGetLastError();
    if (kv_part) nb__cuda_kfree(kv_part);
    if (delta) nb__cuda_kfree(delta); // stream-ordered: after the kernels above
    return nb__cuda_kend(&c, e);
}

static_assert(sizeof(nb__attn_geom) == 5 * 8 + 24 * 8 + 8 + 8 + 3 * 8,
              "nb__attn_geom changed: review the kernels' use of it");

} // namespace

extern "C" void nb__cuda_reg_attention(nb__backend *be) {
    be->k.attention = cuda_attention;
    be->k.attention_backward = cuda_attention_backward;
    be->attention_bf16 = true;
}
