// tests/cuda_host/attention.cu - host checks of the attention family (cuda/k_attention.cu):
// a sequential host emulation of the four CUDA kernels (forward, delta, dq, dk/dv) built
// from the same __host__ __device__ functions of cuda/attention.cuh - the same tile sizes,
// the same block and tile loop order, the same online-softmax updates and the same lane
// butterflies (L = G lanes at once instead of one lane per thread) - compared with the CPU
// backend's attention and attention_backward on the same nb__*_args with host buffers.
// No GPU needed; this does not show that the kernels run on one (unverified on a GPU).
//
// Tolerances, |x - ref| <= rtol |ref| + atol max(max|ref|, 1e-2) per tensor (inputs are
// O(1); the floor covers gradients that are 0 up to rounding, as dq, dk at T = 1):
//   f32  rtol 1e-5, atol 1e-5  (the CPU's GEMM order and its polynomial exp differ)
//   f64  rtol 1e-12, atol 1e-12
//   bf16 rtol 2^-7 (one bf16 rounding step of the output), atol 1e-5; the reference is the
//        CPU's widened-f32 bf16 path (nb__cpu_attention_native_bf16(false)), the math the
//        CUDA kernel does; lse (f32) at the f32 tolerance.
//   bf16 tensor-core forward (emu_fwd_wmma): rtol 2^-7, atol 2^-8, for the weights it rounds
//        to bf16 before the product with v (the CPU's AVX512-BF16 kernel does too; either
//        CPU path is within this); measured worst 0.63 of it (CUHOST_ATTN_VERBOSE=1 prints
//        each case's worst ratios).
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cuda/attention.cuh"
#include "cuhost.h"
#include "tensor/backend_table.h"
#include "tensor/kernels.h"

extern "C" bool nb__cpu_attention_native_bf16(bool on);
extern "C" void nb_philox4x32(const uint32_t counter[4], const uint32_t key[2],
                              uint32_t out[4]);

namespace {

using namespace nbattn;

// the tensor-core forward (weights rounded to bf16 before the product with v)
constexpr double WMMA_RTOL = 1.0 / 128, WMMA_ATOL = 1.0 / 256;

// ---- the emulation: one function per kernel, the kernels' loops with the thread loop
// inside the phases between barriers -------------------------------------------------------
template <typename S, typename A, int DMAX> struct Emu {
    using Gm = Geo<A, DMAX>;
    static constexpr int G = Gm::G, DT = Gm::DT, BC = Gm::BC, ROWS = Gm::ROWS;
    struct Row { // one row's group: G lanes of registers
        A x[G][DT], y[G][DT], acc[G][DT], acc2[G][DT], m[G], l[G];
    };

    static void fill(std::vector<A> &tile, const S *slice, int64_t ld, int64_t row0,
                     const nb__attn_geom &g) {
        for (int e = 0; e < Gm::SMEM_TILE; e++)
            tile[e] = tile_elem<DMAX>(slice, ld, row0, g.T, g.D, e);
    }

    static void fwd(const nb__attn_geom &g, const S *q, const S *k, const S *v, S *o, A *lse) {
        const int64_t T = g.T, D = g.D, nrb = ntiles(T, ROWS);
        const Drop dr = drop_of(&g);
        std::vector<A> Ks(Gm::SMEM_TILE), Vs(Gm::SMEM_TILE);
        std::vector<Row> rows(ROWS);
        for (int64_t bh = 0; bh < g.B * g.H; bh++) {
            const int64_t b = bh / g.H, h = bh % g.H;
            for (int64_t y = 0; y < nrb; y++) {
                const int64_t r0 = row_block_of(y, nrb) * ROWS;
                for (int r = 0; r < ROWS; r++)
                    for (int ln = 0; ln < G; ln++) {
                        load_row<G, DT>(rows[r].x[ln], q + row_off(g.sq, b, h, 0), g.sq[2],
                                        r0 + r, T, D, ln);
                        for (int i = 0; i < DT; i++) rows[r].acc[ln][i] = 0;
                        rows[r].m[ln] = neg_inf<A>();
                        rows[r].l[ln] = 0;
                    }
                const int64_t last = last_key_tile(r0, ROWS, T, BC);
                for (int64_t kt = 0; kt <= last; kt++) {
                    const int64_t c0 = kt * BC;
                    fill(Ks, k + row_off(g.sk, b, kv_head(g, h), 0), g.sk[2], c0, g);
                    fill(Vs, v + row_off(g.sv, b, kv_head(g, h), 0), g.sv[2], c0, g);
                    for (int r = 0; r < ROWS; r++) {
                        const RowCtx rc = {bh, T, r0 + r, g.scale};
                        fwd_tile<A, DMAX, G>(rc, dr, 0, rows[r].x, rows[r].acc, rows[r].m,
                                             rows[r].l, Ks.data(), Vs.data(), c0);
                    }
                }
                for (int r = 0; r < ROWS; r++) {
                    const int64_t t = r0 + r;
                    for (int ln = 0; ln < G; ln++)
                        store_row<G, DT>(rows[r].acc[ln], row_factor(rows[r].l[ln], dr),
                                         o + row_off(g.so, b, h, 0), g.so[2], t, T, D, ln);
                    if (t < T) lse[bh * T + t] = row_lse(rows[r].m[0], rows[r].l[0]);
                }
            }
        }
    }

    static void bwd(const nb__attn_geom &g, const S *q, const S *k, const S *v, const A *lse,
                    const S *dout, S *dq, S *dk, S *dv) {
        const int64_t T = g.T, D = g.D, nrb = ntiles(T, ROWS), BH = g.B * g.H;
        const Drop dr = drop_of(&g);
        std::vector<A> Ks(Gm::SMEM_TILE), Vs(Gm::SMEM_TILE), delta((size_t)(BH * T));
        std::vector<A> ls(BC), dls(BC);
        std::vector<Row> rows(ROWS);
        const bool want_delta = dq || dk;
        // delta kernel, then dq kernel (same grid)
        for (int pass = 0; pass < 2; pass++) {
            if (pass == 0 && !want_delta) continue;
            if (pass == 1 && !dq) continue;
            for (int64_t bh = 0; bh < BH; bh++) {
                const int64_t b = bh / g.H, h = bh % g.H;
                for (int64_t y = 0; y < nrb; y++) {
                    const int64_t r0 = row_block_of(y, nrb) * ROWS;
                    for (int r = 0; r < ROWS; r++)
                        for (int ln = 0; ln < G; ln++) {
                            load_row<G, DT>(rows[r].x[ln], q + row_off(g.sq, b, h, 0),
                                            g.sq[2], r0 + r, T, D, ln);
                            load_row<G, DT>(rows[r].y[ln], dout + row_off(g.sdo, b, h, 0),
                                            g.sdo[2], r0 + r, T, D, ln);
                            for (int i = 0; i < DT; i++) rows[r].acc[ln][i] = 0;
                            rows[r].l[ln] = 0;
                        }
                    const int64_t last = last_key_tile(r0, ROWS, T, BC);
                    for (int64_t kt = 0; kt <= last; kt++) {
                        const int64_t c0 = kt * BC;
                        fill(Ks, k + row_off(g.sk, b, kv_head(g, h), 0), g.sk[2], c0, g);
                        fill(Vs, v + row_off(g.sv, b, kv_head(g, h), 0), g.sv[2], c0, g);
                        for (int r = 0; r < ROWS; r++) {
                            const int64_t t = r0 + r;
                            const RowCtx rc = {bh, T, t, g.scale};
                            const A lt = t < T ? lse[bh * T + t] : (A)0;
                            if (pass == 0) {
                                delta_tile<A, DMAX, G>(rc, dr, 0, rows[r].x, rows[r].y, lt,
                                                       rows[r].l, Ks.data(), Vs.data(), c0);
                            } else {
                                const A dt = t < T ? delta[bh * T + t] : (A)0;
                                dq_tile<A, DMAX, G>(rc, dr, 0, rows[r].x, rows[r].y, lt, dt,
                                                    rows[r].acc, Ks.data(), Vs.data(), c0);
                            }
                        }
                    }
                    for (int r = 0; r < ROWS; r++) {
                        const int64_t t = r0 + r;
                        if (pass == 0 && t < T)
                            delta[bh * T + t] =
                                dr.on ? rows[r].l[0] * (A)dr.dscale : rows[r].l[0];
                        if (pass == 1)
                            for (int ln = 0; ln < G; ln++)
                                store_row<G, DT>(rows[r].acc[ln], (A)1,
                                                 dq + row_off(g.sdq, b, h, 0), g.sdq[2], t, T,
                                                 D, ln);
                    }
                }
            }
        }
        if (!dk && !dv) return;
        // dk/dv kernel: key blocks, query tiles from the diagonal down, per query head; with
        // grouped key/value heads each head's share into part (A), then kv_sum per group
        const int64_t rep = kv_group(g), hkv = g.H / rep, n = BH * T * D;
        std::vector<A> part(rep > 1 ? (size_t)(2 * n) : 0);
        for (int64_t bh = 0; bh < BH; bh++) {
            const int64_t b = bh / g.H, h = bh % g.H, hk = kv_head(g, h);
            for (int64_t y = 0; y < nrb; y++) {
                const int64_t s0 = y * ROWS;
                for (int r = 0; r < ROWS; r++)
                    for (int ln = 0; ln < G; ln++) {
                        load_row<G, DT>(rows[r].x[ln], k + row_off(g.sk, b, hk, 0), g.sk[2],
                                        s0 + r, T, D, ln);
                        load_row<G, DT>(rows[r].y[ln], v + row_off(g.sv, b, hk, 0), g.sv[2],
                                        s0 + r, T, D, ln);
                        for (int i = 0; i < DT; i++) rows[r].acc[ln][i] = rows[r].acc2[ln][i] = 0;
                    }
                for (int64_t qt = first_query_tile(s0, BC); qt < ntiles(T, BC); qt++) {
                    const int64_t t0 = qt * BC;
                    fill(Ks, q + row_off(g.sq, b, h, 0), g.sq[2], t0, g);     // Qs
                    fill(Vs, dout + row_off(g.sdo, b, h, 0), g.sdo[2], t0, g); // dOs
                    for (int e = 0; e < BC; e++) {
                        const int64_t t = t0 + e;
                        ls[e] = t < T ? lse[bh * T + t] : (A)0;
                        dls[e] = t < T && dk ? delta[bh * T + t] : (A)0;
                    }
                    for (int r = 0; r < ROWS; r++) {
                        const RowCtx rc = {bh, T, s0 + r, g.scale};
                        dkdv_tile<A, DMAX, G>(rc, dr, 0, rows[r].x, rows[r].y, rows[r].acc,
                                              rows[r].acc2, Ks.data(), Vs.data(), ls.data(),
                                              dls.data(), t0);
                    }
                }
                const int64_t ps[3] = {g.H * T * D, T * D, D};
                for (int r = 0; r < ROWS; r++)
                    for (int ln = 0; ln < G; ln++) {
                        if (rep > 1) {
                            store_row<G, DT>(rows[r].acc[ln], (A)1,
                                             part.data() + row_off(ps, b, h, 0), D, s0 + r, T,
                                             D, ln);
                            store_row<G, DT>(rows[r].acc2[ln], (A)1,
                                             part.data() + n + row_off(ps, b, h, 0), D, s0 + r,
                                             T, D, ln);
                            continue;
                        }
                        if (dk)
                            store_row<G, DT>(rows[r].acc[ln], (A)1, dk + row_off(g.sdk, b, h, 0),
                                             g.sdk[2], s0 + r, T, D, ln);
                        if (dv)
                            store_row<G, DT>(rows[r].acc2[ln], (A)1,
                                             dv + row_off(g.sdv, b, h, 0), g.sdv[2], s0 + r, T,
                                             D, ln);
                    }
            }
        }
        if (rep == 1) return;
        // kv_sum: each group's shares in head order
        for (int64_t b = 0; b < g.B; b++)
            for (int64_t hk = 0; hk < hkv; hk++)
                for (int64_t t = 0; t < T; t++)
                    for (int64_t d = 0; d < D; d++) {
                        const A *p = part.data() + ((b * g.H + hk * rep) * T + t) * D + d;
                        A sk = p[0], sv = p[n];
                        for (int64_t r = 1; r < rep; r++) {
                            sk = sk + p[r * T * D];
                            sv = sv + p[n + r * T * D];
                        }
                        if (dk) store(dk + row_off(g.sdk, b, hk, t) + d, sk);
                        if (dv) store(dv + row_off(g.sdv, b, hk, t) + d, sv);
                    }
    }
};


// The tensor-core bf16 forward (attn_fwd_wmma): the same tiles, loops and row updates; the
// 16x16x16 products as f32 sums of the exact bf16 products in k order (the hardware's
// order and rounding inside an mma are its own, so this emulates the math, not the bits).
template <int DMAX>
void emu_fwd_wmma(const nb__attn_geom &g, const uint16_t *q, const uint16_t *k,
                  const uint16_t *v, uint16_t *o, float *lse) {
    using W = WGeo<DMAX>;
    constexpr int BR = W::BR, BC = W::BC;
    const int64_t T = g.T, D = g.D, nrb = ntiles(T, BR);
    const Drop dr = drop_of(&g);
    std::vector<uint16_t> Qs(BR * W::LDH), Ks(BC * W::LDH), Vs(BC * W::LDH), Ps(BR * W::LDP);
    std::vector<float> Ss(BR * W::LDS), Os(BR * W::LDO), m(BR), l(BR);
    for (int64_t bh = 0; bh < g.B * g.H; bh++) {
        const int64_t b = bh / g.H, h = bh % g.H;
        for (int64_t y = 0; y < nrb; y++) {
            const int64_t r0 = row_block_of(y, nrb) * BR;
            for (int e = 0; e < BR * DMAX; e++)
                tile_bits<DMAX, W::LDH>(Qs.data(), q + row_off(g.sq, b, h, 0), g.sq[2], r0, T,
                                        D, e);
            for (float &x : Os) x = 0;
            for (int r = 0; r < BR; r++) m[r] = neg_inf<float>(), l[r] = 0;
            const int64_t last = last_key_tile(r0, BR, T, BC);
            for (int64_t kt = 0; kt <= last; kt++) {
                const int64_t c0 = kt * BC;
                for (int e = 0; e < BC * DMAX; e++) {
                    tile_bits<DMAX, W::LDH>(Ks.data(), k + row_off(g.sk, b, kv_head(g, h), 0),
                                            g.sk[2], c0, T, D, e);
                    tile_bits<DMAX, W::LDH>(Vs.data(), v + row_off(g.sv, b, kv_head(g, h), 0),
                                            g.sv[2], c0, T, D, e);
                }
                for (int r = 0; r < BR; r++)
                    for (int n = 0; n < BC; n++) {
                        float acc = 0;
                        for (int kk = 0; kk < DMAX; kk++)
                            acc = fmaf(nb__kh_f32_from_bf16(Qs[r * W::LDH + kk]),
                                       nb__kh_f32_from_bf16(Ks[n * W::LDH + kk]), acc);
                        Ss[r * W::LDS + n] = acc;
                    }
                for (int r = 0; r < BR; r++) {
                    wmma_row_step(&Ss[r * W::LDS], &Ps[r * W::LDP], &Os[r * W::LDO], BC, DMAX,
                                  r0 + r, c0, T, (float)g.scale, dr, bh, m[r], l[r]);
                }
                for (int r = 0; r < BR; r++)
                    for (int d = 0; d < DMAX; d++) {
                        float acc = Os[r * W::LDO + d];
                        for (int j = 0; j < BC; j++)
                            acc = fmaf(nb__kh_f32_from_bf16(Ps[r * W::LDP + j]),
                                       nb__kh_f32_from_bf16(Vs[j * W::LDH + d]), acc);
                        Os[r * W::LDO + d] = acc;
                    }
            }
            uint16_t *os = o + row_off(g.so, b, h, 0);
            for (int r = 0; r < BR; r++) {
                const int64_t t = r0 + r;
                if (t >= T) continue;
                for (int d = 0; d < D; d++)
                    store(os + t * g.so[2] + d, Os[r * W::LDO + d] * row_factor(l[r], dr));
                lse[bh * T + t] = row_lse(m[r], l[r]);
            }
        }
    }
}

void emu_fwd_wmma_any(const nb__attn_geom &g, const uint16_t *q, const uint16_t *k,
                      const uint16_t *v, uint16_t *o, float *lse) {
    switch (dmax_for(g.D)) {
    case 16: emu_fwd_wmma<16>(g, q, k, v, o, lse); break;
    case 32: emu_fwd_wmma<32>(g, q, k, v, o, lse); break;
    case 64: emu_fwd_wmma<64>(g, q, k, v, o, lse); break;
    default: emu_fwd_wmma<128>(g, q, k, v, o, lse); break;
    }
}

template <typename S, typename A> struct Dispatch {
    static void fwd(const nb__attn_geom &g, const S *q, const S *k, const S *v, S *o, A *lse) {
        switch (dmax_for(g.D)) {
        case 16: Emu<S, A, 16>::fwd(g, q, k, v, o, lse); break;
        case 32: Emu<S, A, 32>::fwd(g, q, k, v, o, lse); break;
        case 64: Emu<S, A, 64>::fwd(g, q, k, v, o, lse); break;
        default: Emu<S, A, 128>::fwd(g, q, k, v, o, lse); break;
        }
    }
    static void bwd(const nb__attn_geom &g, const S *q, const S *k, const S *v, const A *lse,
                    const S *dout, S *dq, S *dk, S *dv) {
        switch (dmax_for(g.D)) {
        case 16: Emu<S, A, 16>::bwd(g, q, k, v, lse, dout, dq, dk, dv); break;
        case 32: Emu<S, A, 32>::bwd(g, q, k, v, lse, dout, dq, dk, dv); break;
        case 64: Emu<S, A, 64>::bwd(g, q, k, v, lse, dout, dq, dk, dv); break;
        default: Emu<S, A, 128>::bwd(g, q, k, v, lse, dout, dq, dk, dv); break;
        }
    }
};

// ---- data and comparison -------------------------------------------------------------------
double val(float x) { return x; }
double val(double x) { return x; }
double val(uint16_t x) { return nb__kh_f32_from_bf16(x); }
void put(float *p, double x) { *p = (float)x; }
void put(double *p, double x) { *p = x; }
void put(uint16_t *p, double x) { *p = nb__kh_bf16_from_f32((float)x); }

uint64_t g_rng = 0x9e3779b97f4a7c15ull;
double rnd() { // uniform in [-1, 1)
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

// Worst |x - ref| / (rtol |ref| + atol max|ref|) over the elements of a tensor (<= 1 passes);
// only the elements idx(i) of a strided layout.
template <typename X>
double worst(const std::vector<X> &x, const std::vector<X> &ref, const std::vector<int64_t> &idx,
             double rtol, double atol) {
    double mx = 0, w = 0;
    for (int64_t i : idx) mx = fmax(mx, fabs(val(ref[(size_t)i])));
    mx = fmax(mx, 1e-2); // gradients that are exactly 0 (T = 1) come out as rounding noise
    for (int64_t i : idx) {
        const double a = val(x[(size_t)i]), r = val(ref[(size_t)i]);
        const double e = fabs(a - r) / (rtol * fabs(r) + atol * mx + 1e-300);
        if (!(e <= w)) w = e; // NaN counts as a failure
    }
    return w;
}

struct Case {
    int64_t B, H, T, D;
    double p;       // dropout
    bool bthd;      // (B, T, H, D) layout (strided (B, H, T, D) views) instead of contiguous
    int want;       // bit 0 dq, 1 dk, 2 dv
    int64_t Hkv;    // key/value heads (grouped-query attention); 0: H
};

template <typename S, typename A>
void run_case(cuhost *t, const Case &cs, nb_dtype dtype, bool bf16, double rtol, double atol,
              double lse_tol) {
    const int64_t B = cs.B, H = cs.H, T = cs.T, D = cs.D, Hk = cs.Hkv ? cs.Hkv : cs.H;
    nb__attn_geom g;
    memset(&g, 0, sizeof g);
    g.B = B, g.H = H, g.T = T, g.D = D, g.Hkv = cs.Hkv;
    g.scale = 1.0 / sqrt((double)(D > 0 ? D : 1));
    g.p = cs.p;
    g.seed = 0x123456789abcull, g.stream = 7, g.offset = 1000;
    int64_t st[3], sk[3]; // q-shaped operands; k, v, dk, dv (Hk heads)
    if (cs.bthd) st[0] = T * H * D, st[1] = D, st[2] = H * D;
    else st[0] = H * T * D, st[1] = T * D, st[2] = D;
    if (cs.bthd) sk[0] = T * Hk * D, sk[1] = D, sk[2] = Hk * D;
    else sk[0] = Hk * T * D, sk[1] = T * D, sk[2] = D;
    int64_t *all[8] = {g.sq, g.sk, g.sv, g.so, g.sdo, g.sdq, g.sdk, g.sdv};
    for (int i = 0; i < 8; i++) memcpy(all[i], i == 1 || i == 2 || i >= 6 ? sk : st, sizeof st);
    const size_t n = (size_t)(B * H * T * D), nk = (size_t)(B * Hk * T * D);
    std::vector<int64_t> idx, kidx;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t tt = 0; tt < T; tt++)
                for (int64_t d = 0; d < D; d++) {
                    idx.push_back(row_off(st, b, h, tt) + d);
                    if (h < Hk) kidx.push_back(row_off(sk, b, h, tt) + d);
                }
    std::vector<S> q(n), k(nk), v(nk), dout(n);
    for (size_t i = 0; i < n; i++) {
        put(&q[i], 2 * rnd()); // the order of the draws of the cases without grouping
        if (i < nk) put(&k[i], 2 * rnd()), put(&v[i], rnd());
        put(&dout[i], rnd());
    }
    const size_t nl = (size_t)(B * H * T);
    std::vector<S> o(n), o_ref(n), dq(n), dk(nk), dv(nk), dq_ref(n), dk_ref(nk), dv_ref(nk);
    std::vector<A> lse(nl), lse_ref(nl);
    // reference
    nb__attention_args fa;
    memset(&fa, 0, sizeof fa);
    fa.g = g, fa.dtype = dtype, fa.bf16 = bf16;
    fa.q = q.data(), fa.k = k.data(), fa.v = v.data(), fa.o = o_ref.data(), fa.lse = lse_ref.data();
    CUHOST_CHECK(t, cuhost_cpu()->attention(&fa) == NB_OK, "cpu attention failed");
    const bool wq = cs.want & 1, wk = cs.want & 2, wv = cs.want & 4;
    nb__attention_backward_args ba;
    memset(&ba, 0, sizeof ba);
    ba.g = g, ba.dtype = dtype, ba.bf16 = bf16;
    ba.q = q.data(), ba.k = k.data(), ba.v = v.data(), ba.lse = lse_ref.data();
    ba.dout = dout.data();
    ba.dq = wq ? dq_ref.data() : NULL, ba.dk = wk ? dk_ref.data() : NULL;
    ba.dv = wv ? dv_ref.data() : NULL;
    CUHOST_CHECK(t, cuhost_cpu()->attention_backward(&ba) == NB_OK, "cpu backward failed");
    // emulation (its backward from the CPU's lse, so that only the backward is compared)
    Dispatch<S, A>::fwd(g, q.data(), k.data(), v.data(), o.data(), lse.data());
    Dispatch<S, A>::bwd(g, q.data(), k.data(), v.data(), lse_ref.data(), dout.data(),
                        wq ? dq.data() : nullptr, wk ? dk.data() : nullptr,
                        wv ? dv.data() : nullptr);
    std::vector<int64_t> lidx(nl);
    for (size_t i = 0; i < nl; i++) lidx[i] = (int64_t)i;
    const double wo = worst(o, o_ref, idx, rtol, atol), wl = worst(lse, lse_ref, lidx, lse_tol, lse_tol);
    const double wdq = wq ? worst(dq, dq_ref, idx, rtol, atol) : 0;
    const double wdk = wk ? worst(dk, dk_ref, kidx, rtol, atol) : 0;
    const double wdv = wv ? worst(dv, dv_ref, kidx, rtol, atol) : 0;
    const char *dn = bf16 ? "bf16" : dtype == NB_F64 ? "f64" : "f32";
    double wow = 0, wowl = 0;
    if constexpr (sizeof(S) == 2) { // the tensor-core forward against the CPU's
        std::vector<S> ow(n);
        std::vector<A> lw(nl);
        emu_fwd_wmma_any(g, q.data(), k.data(), v.data(), ow.data(), lw.data());
        wow = worst(ow, o_ref, idx, WMMA_RTOL, WMMA_ATOL);
        wowl = worst(lw, lse_ref, lidx, lse_tol, lse_tol);
    }
#define CASE_FMT "%s B=%lld H=%lld Hkv=%lld T=%lld D=%lld p=%g %s want=%d"
#define CASE_ARGS dn, (long long)B, (long long)H, (long long)Hk, (long long)T, (long long)D,  \
                  cs.p, cs.bthd ? "bthd" : "bhtd", cs.want
    CUHOST_CHECK(t, wo <= 1, CASE_FMT ": o off by %.3g tolerances", CASE_ARGS, wo);
    CUHOST_CHECK(t, wl <= 1, CASE_FMT ": lse off by %.3g tolerances", CASE_ARGS, wl);
    CUHOST_CHECK(t, wow <= 1, CASE_FMT ": tensor-core o off by %.3g tolerances", CASE_ARGS, wow);
    CUHOST_CHECK(t, wowl <= 1, CASE_FMT ": tensor-core lse off by %.3g tolerances", CASE_ARGS,
                 wowl);
    if (getenv("CUHOST_ATTN_VERBOSE"))
        printf(CASE_FMT ": worst o %.3g lse %.3g dq %.3g dk %.3g dv %.3g wmma o %.3g lse %.3g\n",
               CASE_ARGS, wo, wl, wdq, wdk, wdv, wow, wowl);
    CUHOST_CHECK(t, wdq <= 1, CASE_FMT ": dq off by %.3g tolerances", CASE_ARGS, wdq);
    CUHOST_CHECK(t, wdk <= 1, CASE_FMT ": dk off by %.3g tolerances", CASE_ARGS, wdk);
    CUHOST_CHECK(t, wdv <= 1, CASE_FMT ": dv off by %.3g tolerances", CASE_ARGS, wdv);
#undef CASE_FMT
#undef CASE_ARGS
}

// keep() against the CPU's rule: (double)w < (1 - p) 2^32 for nb_philox4x32's word.
void check_keep(cuhost *t) {
    const double ps[] = {0.1, 0.5, 0.25, 1.0 / 3.0, 0.999, 1.0};
    long bad = 0;
    for (double p : ps) {
        nb__attn_geom g;
        memset(&g, 0, sizeof g);
        g.p = p, g.seed = 0xfedcba9876543210ull, g.stream = 0x1234567890ull, g.offset = 5;
        const Drop d = drop_of(&g);
        for (uint64_t i = 0; i < 4000; i++) {
            const uint64_t blk = g.offset + i / 4;
            const uint32_t ctr[4] = {(uint32_t)blk, (uint32_t)(blk >> 32), (uint32_t)g.stream,
                                     (uint32_t)(g.stream >> 32)};
            const uint32_t key[2] = {(uint32_t)g.seed, (uint32_t)(g.seed >> 32)};
            uint32_t w[4];
            nb_philox4x32(ctr, key, w);
            const bool want = (double)w[i % 4] < (1.0 - p) * 4294967296.0;
            bad += keep(d, i) != want;
        }
    }
    CUHOST_CHECK(t, bad == 0, "keep() disagrees with the CPU's draw %ld times", bad);
    // the integer threshold at exact boundaries: (1 - 0.5) 2^32 = 2^31
    CUHOST_CHECK(t, keep_threshold(0.5) == 2147483648ull && keep_threshold(0.0) == 4294967296ull &&
                        keep_threshold(1.0) == 0 && keep_threshold(0.75) == 1073741824ull,
                 "keep_threshold");
}

void check_geometry(cuhost *t) {
    // the causal tile bounds: every visible (t, s) pair is in a tile the kernels visit
    long bad = 0;
    for (int64_t T = 1; T <= 130; T++)
        for (int64_t rows : {16, 32, 64, 128})
            for (int64_t bc : {16, 32}) {
                for (int64_t r0 = 0; r0 < T; r0 += rows) {
                    const int64_t last = last_key_tile(r0, rows, T, bc);
                    const int64_t r1 = r0 + rows < T ? r0 + rows : T;
                    bad += last * bc > r1 - 1 || (last + 1) * bc <= r1 - 1; // holds row r1 - 1
                }
                for (int64_t s0 = 0; s0 < T; s0 += rows) {
                    const int64_t f = first_query_tile(s0, bc);
                    bad += f * bc > s0 || (f + 1) * bc <= s0;
                }
            }
    CUHOST_CHECK(t, bad == 0, "tile bounds wrong %ld times", bad);
    CUHOST_CHECK(t, dmax_for(0) == 16 && dmax_for(16) == 16 && dmax_for(17) == 32 &&
                        dmax_for(64) == 64 && dmax_for(100) == 128 && dmax_for(129) == 0,
                 "dmax_for");
}

} // namespace

void cuhost_attention(cuhost *t) {
    check_keep(t);
    check_geometry(t);
    const bool native = nb__cpu_attention_native_bf16(false); // the widened-f32 reference
    const Case cases[] = {
        {1, 1, 1, 16, 0, false, 7, 0}, {2, 3, 7, 16, 0, true, 7, 0}, {1, 2, 64, 64, 0, false, 7, 0},
        {2, 2, 100, 64, 0, true, 7, 0}, {1, 1, 100, 16, 0, false, 7, 0}, {1, 2, 7, 64, 0, false, 7, 0},
        {1, 1, 64, 16, 0, true, 7, 0}, {1, 1, 1, 64, 0, true, 7, 0},
        // head dims between the built sizes (zero padding), D = 0
        {1, 2, 37, 40, 0, false, 7, 0}, {1, 1, 33, 100, 0, true, 7, 0}, {1, 1, 9, 0, 0, false, 7, 0},
        // dropout
        {2, 2, 100, 64, 0.1, true, 7, 0}, {1, 1, 7, 16, 0.5, false, 7, 0}, {1, 1, 64, 16, 1.0, false, 7, 0},
        // several key tiles of every kernel (BC 16 to 64)
        {1, 1, 200, 32, 0, false, 7, 0}, {1, 1, 150, 128, 0.1, true, 7, 0},
        // gradients not wanted
        {1, 2, 50, 16, 0, false, 1, 0}, {1, 2, 50, 16, 0.2, false, 2, 0}, {1, 2, 50, 16, 0, false, 4, 0},
        {1, 2, 50, 16, 0.2, false, 6, 0},
        // grouped-query attention: 2 and 4 query heads per key/value head
        {2, 4, 37, 16, 0, false, 7, 2}, {1, 4, 100, 64, 0.1, true, 7, 1},
        {1, 6, 70, 32, 0, true, 6, 3},
    };
    for (const Case &cs : cases) {
        run_case<float, float>(t, cs, NB_F32, false, 1e-5, 1e-5, 1e-5);
        run_case<double, double>(t, cs, NB_F64, false, 1e-12, 1e-12, 1e-12);
        if (cs.D > 0) run_case<uint16_t, float>(t, cs, NB_F32, true, 1.0 / 128, 1e-5, 1e-5);
    }
    nb__cpu_attention_native_bf16(native);
}
