// tests/cuda_host/index.cu - host checks of the index family's __host__ __device__ math
// (cuda/k_index.cuh, used by cuda/k_index.cu), compiled by nvcc and compared with the CPU
// backend (cpu/index.c) on the same nb__*_args structs over host buffers. No GPU needed.
//
// Each kernel is emulated whole: a host loop over the positions the GPU threads take, each
// calling the per-thread body the kernel calls. index_add's two deterministic paths (scan,
// and stable sort + segment sums) are emulated with the same order as on the GPU and
// compared bit for bit with the CPU's ordered sum, on an index with many duplicates. Bad
// indices: the values the emulated kernels record (the device error record) give the same
// message as the CPU kernel's NB_EINDEX error.
#include <algorithm>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>

#include "cuda/k_index.cuh"
#include "cuhost.h"
#include "nabla/status.h"
#include "tensor/backend_table.h"

using namespace nbix;

namespace {

uint64_t g_rng = 0x9e3779b97f4a7c15ull;
uint32_t rnd() {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_rng >> 33);
}
// Floats of mixed magnitudes, so the order of a sum shows in its bits.
float rndf() {
    float m = (float)(rnd() % 100000) / 1000.0f - 50.0f;
    int e = (int)(rnd() % 5);
    return m * (e == 0 ? 1e-3f : e == 1 ? 1e3f : 1.0f);
}

nb__view mkview(void *data, nb_dtype dt, int nd, const int64_t *shape, const int64_t *strides) {
    nb__view v;
    memset(&v, 0, sizeof v);
    v.data = (char *)data;
    v.dtype = dt;
    v.ndim = nd;
    for (int d = 0; d < nd; d++) v.shape[d] = shape[d], v.strides[d] = strides[d];
    return v;
}
nb__view contig(void *data, nb_dtype dt, int nd, const int64_t *shape) {
    int64_t st[NB_MAX_DIMS], s = 1;
    for (int d = nd - 1; d >= 0; d--) st[d] = s, s *= shape[d];
    return mkview(data, dt, nd, shape, st);
}

size_t esize(nb_dtype dt) {
    return dt == NB_F64 || dt == NB_I64 ? 8 : dt == NB_F32 || dt == NB_I32 ? 4
           : dt == NB_F16 || dt == NB_BF16 ? 2 : 1;
}
std::vector<char> rnd_bytes(size_t n) {
    std::vector<char> b(n);
    for (size_t i = 0; i < n; i++) b[i] = (char)rnd();
    return b;
}
// n random elements of a float dtype (finite values of mixed magnitudes).
std::vector<char> rnd_floats(nb_dtype dt, size_t n) {
    std::vector<char> b(n * esize(dt));
    for (size_t i = 0; i < n; i++) {
        float f = rndf();
        if (dt == NB_F32) memcpy(&b[i * 4], &f, 4);
        else if (dt == NB_F64) {
            double v = (double)f * (1.0 + 1e-9 * (double)(rnd() % 1000));
            memcpy(&b[i * 8], &v, 8);
        } else {
            uint16_t h = dt == NB_BF16 ? nb__kh_bf16_from_f32(f) : nb__kh_f16_from_f32(f / 64.0f);
            memcpy(&b[i * 2], &h, 2);
        }
    }
    return b;
}
template <typename I> std::vector<I> rnd_index(size_t n, int64_t lo, int64_t hi) {
    std::vector<I> v(n);
    for (size_t i = 0; i < n; i++) v[i] = (I)(lo + (int64_t)(rnd() % (uint32_t)(hi - lo)));
    return v;
}

int es_of(nb_dtype dt) { return (int)esize(dt); }

#define IX_HOST_BY_ES(es, ES, ...)                                                         \
    switch (es) {                                                                          \
    case 1: { constexpr int ES = 1; __VA_ARGS__; } break;                                  \
    case 2: { constexpr int ES = 2; __VA_ARGS__; } break;                                  \
    case 4: { constexpr int ES = 4; __VA_ARGS__; } break;                                  \
    default: { constexpr int ES = 8; __VA_ARGS__; } break;                                 \
    }

// The CPU's error message for a call that failed, or "" when it succeeded.
std::string cpu_msg(nb_status st) { return st == NB_OK ? std::string() : nb_last_error(); }
std::string emu_msg(const ix_bad &b, int op, int dim, int64_t size) {
    if (!ix_bad_any(b)) return std::string();
    char buf[200];
    ix_err_format(buf, sizeof buf, op, dim, size, b);
    return buf;
}

// ---- index_select / embedding / gather ---------------------------------------------------------
// Emulate k_gather over every output element; the bad values as the error record keeps them.
ix_bad emu_gather(const gather_geom &g, const nb__view &out, const nb__view &x,
                  const nb__view &idx) {
    ix_bad bad = {0, 0};
    int64_t n = view_numel(&out);
    bool i64 = idx.dtype == NB_I64;
    for (int64_t i = 0; i < n; i++) {
        int64_t k;
        bool ok = true;
        IX_HOST_BY_ES(es_of(x.dtype), ES, ok = gather_elem<ES>(g, out.data, x.data, idx.data, i64,
                                                                i, &k));
        if (!ok) ix_bad_note(&bad, k);
    }
    return bad;
}

// index_select of x (shape xs, strides xst) along dim by index values vals.
template <typename I>
void check_index_select(cuhost *t, nb_dtype dt, int nd, const int64_t *xs, const int64_t *xst,
                        int dim, const std::vector<I> &vals, const char *op, int out_nd,
                        const int64_t *out_shape) {
    int64_t span = 1;
    for (int d = 0; d < nd; d++) span += (xs[d] - 1) * xst[d];
    std::vector<char> xb = rnd_bytes((size_t)span * esize(dt));
    int64_t os[NB_MAX_DIMS];
    int ond = out_nd;
    if (!out_shape) {
        ond = nd;
        for (int d = 0; d < nd; d++) os[d] = xs[d];
        os[dim] = (int64_t)vals.size();
    } else {
        for (int d = 0; d < out_nd; d++) os[d] = out_shape[d];
    }
    int64_t n = 1;
    for (int d = 0; d < ond; d++) n *= os[d];
    std::vector<char> ocpu((size_t)n * esize(dt) + 1, 0x55), oemu = ocpu;
    int64_t m = (int64_t)vals.size();
    nb_dtype idt = sizeof(I) == 8 ? NB_I64 : NB_I32;
    nb__index_select_args a;
    memset(&a, 0, sizeof a);
    a.x = mkview(xb.data(), dt, nd, xs, xst);
    a.index = contig((void *)vals.data(), idt, 1, &m);
    a.dim = dim;
    a.op = op;
    a.out = contig(ocpu.data(), dt, ond, os);
    nb_status st = cuhost_cpu()->index_select(&a);
    std::string want = cpu_msg(st);
    a.out.data = oemu.data();
    gather_geom g = gather_geom_of(&a.x, &a.out, &a.index, dim, false);
    ix_bad bad = emu_gather(g, a.out, a.x, a.index);
    int code = strcmp(op, "embedding") == 0 ? IX_OP_EMBEDDING : IX_OP_INDEX_SELECT;
    std::string got = emu_msg(bad, code, dim, g.size);
    CUHOST_CHECK(t, want == got, "%s dtype %d dim %d: CPU says \"%s\", the kernel's record \"%s\"",
                 op, (int)dt, dim, want.c_str(), got.c_str());
    if (st == NB_OK)
        CUHOST_CHECK(t, memcmp(ocpu.data(), oemu.data(), ocpu.size()) == 0,
                     "%s dtype %d dim %d: output differs from the CPU's", op, (int)dt, dim);
}

template <typename I>
void check_gather(cuhost *t, nb_dtype dt, int nd, const int64_t *xs, const int64_t *xst, int dim,
                  const int64_t *is, int64_t lo, int64_t hi) {
    int64_t span = 1, n = 1;
    for (int d = 0; d < nd; d++) span += (xs[d] - 1) * xst[d], n *= is[d];
    std::vector<char> xb = rnd_bytes((size_t)span * esize(dt));
    std::vector<I> vals = rnd_index<I>((size_t)n, lo, hi);
    std::vector<char> ocpu((size_t)n * esize(dt) + 1, 0x55), oemu = ocpu;
    nb__gather_args a;
    memset(&a, 0, sizeof a);
    a.x = mkview(xb.data(), dt, nd, xs, xst);
    a.index = contig(vals.data(), sizeof(I) == 8 ? NB_I64 : NB_I32, nd, is);
    a.out = contig(ocpu.data(), dt, nd, is);
    a.dim = dim;
    a.op = "gather";
    nb_status st = cuhost_cpu()->gather(&a);
    std::string want = cpu_msg(st);
    a.out.data = oemu.data();
    gather_geom g = gather_geom_of(&a.x, &a.out, &a.index, dim, true);
    std::string got = emu_msg(emu_gather(g, a.out, a.x, a.index), IX_OP_GATHER, dim, g.size);
    CUHOST_CHECK(t, want == got, "gather dtype %d dim %d: CPU says \"%s\", the record \"%s\"",
                 (int)dt, dim, want.c_str(), got.c_str());
    if (st == NB_OK)
        CUHOST_CHECK(t, memcmp(ocpu.data(), oemu.data(), ocpu.size()) == 0,
                     "gather dtype %d dim %d: output differs from the CPU's", (int)dt, dim);
}

void check_gathers(cuhost *t) {
    // x (4, 5, 3) as a permuted view of a (3, 4, 5) buffer: strides (5, 1, 20)
    const int64_t xs[3] = {4, 5, 3}, xst[3] = {5, 1, 20};
    std::vector<int64_t> v64 = {4, 0, 4, 2, 1, 4, 3};
    std::vector<int32_t> v32 = {2, 2, 0};
    const nb_dtype dts[] = {NB_F32, NB_BF16, NB_F64, NB_U8};
    for (nb_dtype dt : dts)
        for (int dim = 0; dim < 3; dim++) {
            std::vector<int64_t> w(v64);
            for (auto &k : w) k %= xs[dim];
            check_index_select<int64_t>(t, dt, 3, xs, xst, dim, w, "index_select", 0, nullptr);
            check_index_select<int32_t>(t, dt, 3, xs, xst, dim, v32, "index_select", 0, nullptr);
        }
    // embedding: a contiguous (V, D) table, out (2, 3, D) (the CPU's row-copy path)
    const int64_t ws[2] = {10, 8}, wst[2] = {8, 1}, eo[3] = {2, 3, 8};
    std::vector<int64_t> tok = {3, 9, 0, 3, 3, 7};
    check_index_select<int64_t>(t, NB_F32, 2, ws, wst, 0, tok, "embedding", 3, eo);
    check_index_select<int64_t>(t, NB_BF16, 2, ws, wst, 0, tok, "embedding", 3, eo);
    // bad values: the message names the smallest negative one, else the largest
    std::vector<int64_t> bad1 = {3, 12, 0, 11}, bad2 = {3, -2, 12, -5};
    check_index_select<int64_t>(t, NB_F32, 2, ws, wst, 0, bad1, "embedding", 3, eo);
    check_index_select<int64_t>(t, NB_F32, 3, xs, xst, 1, bad2, "index_select", 0, nullptr);
    // an empty output with a non-empty index: the values are still checked (k_check)
    const int64_t es0[2] = {0, 5}, est0[2] = {5, 1};
    std::vector<int64_t> late = {1, 7, 2};
    for (int bad = 0; bad < 2; bad++) {
        int64_t m = 3, size = 5, k;
        nb__index_select_args a;
        memset(&a, 0, sizeof a);
        char dummy[8];
        std::vector<int64_t> vals = late;
        if (!bad) vals[1] = 4;
        a.x = mkview(dummy, NB_F32, 2, es0, est0);
        a.index = contig(vals.data(), NB_I64, 1, &m);
        const int64_t os0[2] = {0, 3};
        a.out = contig(dummy, NB_F32, 2, os0);
        a.dim = 1;
        a.op = "index_select";
        std::string want = cpu_msg(cuhost_cpu()->index_select(&a));
        ix_bad b = {0, 0};
        for (int64_t i = 0; i < m; i++)
            if (!ix_check(vals.data(), true, i, size, &k)) ix_bad_note(&b, k);
        std::string got = emu_msg(b, IX_OP_INDEX_SELECT, 1, size);
        CUHOST_CHECK(t, want == got, "index_select into an empty output: CPU says \"%s\", the "
                     "record \"%s\"", want.c_str(), got.c_str());
    }
    // a 0-dim x
    const int64_t one = 1;
    std::vector<int32_t> z = {0};
    check_index_select<int32_t>(t, NB_F32, 0, &one, &one, 0, z, "index_select", 1, &one);

    // gather: index no larger than x off dim
    const int64_t is[3] = {3, 4, 2};
    for (nb_dtype dt : dts)
        for (int dim = 0; dim < 3; dim++) {
            check_gather<int64_t>(t, dt, 3, xs, xst, dim, is, 0, xs[dim]);
            check_gather<int32_t>(t, dt, 3, xs, xst, dim, is, 0, xs[dim]);
        }
    check_gather<int64_t>(t, NB_F32, 3, xs, xst, 1, is, -3, 9);
    check_gather<int32_t>(t, NB_F32, 3, xs, xst, 2, is, 1, 6);
}

// ---- scatter_add ------------------------------------------------------------------------------------
template <typename T, typename I>
void check_scatter(cuhost *t, nb_dtype dt, int dim, int64_t lo, int64_t hi, bool strided_src) {
    const int64_t os[3] = {3, 5, 4};
    int64_t is[3] = {3, 4, 4};
    is[dim] = dim == 1 ? 9 : 5; // more entries than rows along dim: duplicates
    if (dim != 1) is[1] = 5;
    // strided: a column-major src larger than index (the CPU's general path); else a
    // contiguous one of index's shape (its fast path)
    int64_t ss[3] = {is[0] + 1, is[1] + 2, is[2]};
    int64_t sst[3] = {1, ss[0], ss[0] * ss[1]};
    if (!strided_src) {
        for (int d = 0; d < 3; d++) ss[d] = is[d];
        sst[2] = 1, sst[1] = ss[2], sst[0] = ss[1] * ss[2];
    }
    int64_t on = os[0] * os[1] * os[2], in = is[0] * is[1] * is[2], sn = ss[0] * ss[1] * ss[2];
    std::vector<char> ocpu, sb;
    if (dt == NB_F32 || dt == NB_F64) {
        ocpu = rnd_floats(dt, (size_t)on);
        sb = rnd_floats(dt, (size_t)sn);
    } else {
        ocpu = rnd_bytes((size_t)on * esize(dt));
        sb = rnd_bytes((size_t)sn * esize(dt));
        if (dt == NB_BOOL) {
            for (auto &c : ocpu) c = (char)((unsigned char)c % 2);
            for (auto &c : sb) c = (char)((unsigned char)c % 2);
        }
    }
    std::vector<char> oemu = ocpu;
    std::vector<I> vals = rnd_index<I>((size_t)in, lo, hi);
    nb__scatter_add_args a;
    memset(&a, 0, sizeof a);
    a.out = contig(ocpu.data(), dt, 3, os);
    a.index = contig(vals.data(), sizeof(I) == 8 ? NB_I64 : NB_I32, 3, is);
    a.src = mkview(sb.data(), dt, 3, ss, sst);
    a.dim = dim;
    a.op = "scatter_add";
    nb_status st = cuhost_cpu()->scatter_add(&a);
    std::string want = cpu_msg(st);
    a.out.data = oemu.data();
    scatter_geom g = scatter_geom_of(&a);
    int64_t nq = in / g.n;
    ix_bad bad = {0, 0};
    bool i64 = sizeof(I) == 8;
    for (int64_t q = 0; q < nq; q++) {
        ix_bad b = {0, 0}; // one thread's, as k_scatter reports it
        scatter_q<T>(g, (T *)oemu.data(), (const T *)sb.data(), vals.data(), i64, q, &b);
        if (b.neg < 0) ix_bad_note(&bad, b.neg);
        if (b.pos1 > 0) ix_bad_note(&bad, b.pos1 - 1);
    }
    std::string got = emu_msg(bad, IX_OP_SCATTER_ADD, dim, g.size);
    CUHOST_CHECK(t, want == got, "scatter_add dtype %d dim %d: CPU says \"%s\", the record \"%s\"",
                 (int)dt, dim, want.c_str(), got.c_str());
    if (st == NB_OK)
        CUHOST_CHECK(t, memcmp(ocpu.data(), oemu.data(), ocpu.size()) == 0,
                     "scatter_add dtype %d dim %d strided %d: output differs from the CPU's",
                     (int)dt, dim, (int)strided_src);
}

void check_scatters(cuhost *t) {
    for (int dim = 0; dim < 3; dim++)
        for (int strided = 0; strided < 2; strided++) {
            bool s = strided != 0;
            int64_t hi = dim == 1 ? 5 : dim == 0 ? 3 : 4;
            check_scatter<float, int64_t>(t, NB_F32, dim, 0, hi, s);
            check_scatter<double, int32_t>(t, NB_F64, dim, 0, hi, s);
            check_scatter<uint32_t, int64_t>(t, NB_I32, dim, 0, hi, s);
            check_scatter<uint64_t, int32_t>(t, NB_I64, dim, 0, hi, s);
            check_scatter<uint8_t, int64_t>(t, NB_U8, dim, 0, hi, s);
            check_scatter<boolean, int32_t>(t, NB_BOOL, dim, 0, hi, s);
        }
    check_scatter<float, int64_t>(t, NB_F32, 1, -2, 9, true);
    check_scatter<float, int32_t>(t, NB_F32, 2, 0, 7, false);
}

// ---- index_add ----------------------------------------------------------------------------------------
// The sort path as the GPU runs it: keys (bad values as S), a stable sort of (key, m), then
// the segment sums of every (segment start, outer slice, column).
template <typename A, typename Src, typename I>
void emu_ia_sorted(const ia_geom &g, A *out, const Src *src, const std::vector<I> &idx) {
    std::vector<uint32_t> keys_in((size_t)g.M), perm((size_t)g.M), keys((size_t)g.M);
    for (int64_t m = 0; m < g.M; m++) {
        keys_in[(size_t)m] = ia_key((int64_t)idx[(size_t)m], g.S);
        perm[(size_t)m] = (uint32_t)m;
    }
    std::stable_sort(perm.begin(), perm.end(),
                     [&](uint32_t x, uint32_t y) { return keys_in[x] < keys_in[y]; });
    for (int64_t i = 0; i < g.M; i++) keys[(size_t)i] = keys_in[perm[(size_t)i]];
    for (int64_t it = 0; it < g.M * g.O; it++) {
        int64_t i = it % g.M, o = it / g.M;
        if (!ia_is_start(keys.data(), i)) continue;
        for (int64_t j = 0; j < g.D; j++)
            ia_segment<A, Src>(g, out, src, keys.data(), perm.data(), i, o, j);
    }
}

template <typename A, typename Src, typename I>
void check_index_add(cuhost *t, nb_dtype odt, nb_dtype sdt, int nd, const int64_t *os, int dim,
                     int64_t M, int64_t rows_used) {
    int64_t on = 1, sn = 1, ss[NB_MAX_DIMS];
    for (int d = 0; d < nd; d++) ss[d] = d == dim ? M : os[d], on *= os[d], sn *= ss[d];
    std::vector<char> ocpu = rnd_floats(odt, (size_t)on), sb = rnd_floats(sdt, (size_t)sn);
    std::vector<char> oscan = ocpu, osort = ocpu;
    std::vector<I> vals = rnd_index<I>((size_t)M, 0, rows_used); // many duplicates
    nb__index_add_args a;
    memset(&a, 0, sizeof a);
    a.out = contig(ocpu.data(), odt, nd, os);
    a.src = contig(sb.data(), sdt, nd, ss);
    a.index = contig(vals.data(), sizeof(I) == 8 ? NB_I64 : NB_I32, 1, &M);
    a.dim = dim;
    nb_status st = cuhost_cpu()->index_add(&a);
    CUHOST_CHECK(t, st == NB_OK, "index_add: the CPU kernel failed");
    ia_geom g = ia_geom_of(&a);
    bool i64 = sizeof(I) == 8;
    for (int64_t e = 0; e < on; e++)
        ia_scan<A, Src>(g, (A *)oscan.data(), (const Src *)sb.data(), vals.data(), i64, e);
    emu_ia_sorted<A, Src, I>(g, (A *)osort.data(), (const Src *)sb.data(), vals);
    CUHOST_CHECK(t, memcmp(ocpu.data(), oscan.data(), ocpu.size()) == 0,
                 "index_add %d<-%d dim %d M %lld: the scan path differs from the CPU's bits",
                 (int)odt, (int)sdt, dim, (long long)M);
    CUHOST_CHECK(t, memcmp(ocpu.data(), osort.data(), ocpu.size()) == 0,
                 "index_add %d<-%d dim %d M %lld: the sort path differs from the CPU's bits",
                 (int)odt, (int)sdt, dim, (long long)M);
}

void check_index_adds(cuhost *t) {
    // embedding backward: (V, D) with many repeated tokens
    const int64_t emb[2] = {50, 24};
    check_index_add<float, float, int64_t>(t, NB_F32, NB_F32, 2, emb, 0, 3000, 7);
    check_index_add<float, bf16s, int64_t>(t, NB_F32, NB_BF16, 2, emb, 0, 700, 50);
    check_index_add<float, f16s, int32_t>(t, NB_F32, NB_F16, 2, emb, 0, 500, 3);
    check_index_add<double, double, int64_t>(t, NB_F64, NB_F64, 2, emb, 0, 600, 5);
    check_index_add<double, float, int32_t>(t, NB_F64, NB_F32, 2, emb, 0, 100, 50);
    // index_select backward along a middle dim: O = 3 slices
    const int64_t mid[3] = {3, 6, 5};
    check_index_add<float, float, int32_t>(t, NB_F32, NB_F32, 3, mid, 1, 40, 6);
    check_index_add<float, bf16s, int64_t>(t, NB_F32, NB_BF16, 3, mid, 2, 33, 2);
    check_index_add<double, f16s, int64_t>(t, NB_F64, NB_F16, 3, mid, 0, 9, 3);
    // the choice between the paths
    ia_geom small = {1, 50, 24, 300}, big = {1, 50304, 768, 16384}, wide = {64, 8, 4096, 64};
    CUHOST_CHECK(t, ia_use_scan(small) && !ia_use_scan(big) && !ia_use_scan(wide),
                 "index_add path choice");
    CUHOST_CHECK(t, ia_key_bits(1) == 1 && ia_key_bits(50304) == 16 && ia_key_bits(65535) == 16 &&
                        ia_key_bits(65536) == 17,
                 "radix bits for the keys 0 .. S");
}

// ---- masked_fill ----------------------------------------------------------------------------------------
void check_masked_fill(cuhost *t, nb_dtype dt) {
    // out (3, 4) contiguous; x its transpose view (strides 1, 3 elements); mask (1, 4) broadcast
    size_t es = esize(dt);
    std::vector<char> xb = rnd_bytes(12 * es), ocpu(12 * es, 0), oemu(12 * es, 0);
    std::vector<char> mask = {1, 0, 0, 1};
    nb__masked_fill_args a;
    memset(&a, 0, sizeof a);
    a.it.nargs = 3;
    a.it.ndim = 2;
    a.it.numel = 12;
    a.it.shape[0] = 3;
    a.it.shape[1] = 4;
    a.it.strides[0][0] = 4 * (int64_t)es, a.it.strides[0][1] = (int64_t)es;
    a.it.strides[1][0] = (int64_t)es, a.it.strides[1][1] = 3 * (int64_t)es;
    a.it.strides[2][0] = 0, a.it.strides[2][1] = 1;
    a.it.data[0] = ocpu.data();
    a.it.data[1] = xb.data();
    a.it.data[2] = mask.data();
    a.it.dtype[0] = a.it.dtype[1] = dt;
    a.it.dtype[2] = NB_BOOL;
    a.value = 0x0123456789abcdefull;
    cuhost_cpu()->masked_fill(&a);
    a.it.data[0] = oemu.data();
    for (int64_t i = 0; i < 12; i++) IX_HOST_BY_ES(es_of(dt), ES, mf_elem<ES>(a.it, a.value, i));
    CUHOST_CHECK(t, memcmp(ocpu.data(), oemu.data(), ocpu.size()) == 0,
                 "masked_fill dtype %d: output differs from the CPU's", (int)dt);
}

// ---- one_hot -----------------------------------------------------------------------------------------------
template <typename I>
void check_one_hot(cuhost *t, nb_dtype dt, int64_t C, int64_t lo, int64_t hi) {
    const int64_t is[2] = {2, 3};
    std::vector<I> vals = rnd_index<I>(6, lo, hi);
    int64_t os[3] = {2, 3, C}, n = 6 * C;
    std::vector<char> ocpu((size_t)n * esize(dt), 0x55), oemu = ocpu;
    nb__one_hot_args a;
    memset(&a, 0, sizeof a);
    a.out = contig(ocpu.data(), dt, 3, os);
    a.index = contig(vals.data(), sizeof(I) == 8 ? NB_I64 : NB_I32, 2, is);
    a.one = dt == NB_F32 ? 0x3f800000u : dt == NB_BF16 ? 0x3f80u : 1u;
    nb_status st = cuhost_cpu()->one_hot(&a);
    std::string want = cpu_msg(st);
    ix_bad bad = {0, 0};
    for (int64_t e = 0; e < n; e++) {
        int64_t k;
        bool ok = true;
        IX_HOST_BY_ES(es_of(dt), ES, ok = oh_elem<ES>(oemu.data(), vals.data(), sizeof(I) == 8, C,
                                                     a.one, e, &k));
        if (!ok) ix_bad_note(&bad, k);
    }
    std::string got = emu_msg(bad, IX_OP_ONE_HOT, 0, C);
    CUHOST_CHECK(t, want == got, "one_hot: CPU says \"%s\", the record \"%s\"", want.c_str(),
                 got.c_str());
    if (st == NB_OK)
        CUHOST_CHECK(t, memcmp(ocpu.data(), oemu.data(), ocpu.size()) == 0,
                     "one_hot dtype %d: output differs from the CPU's", (int)dt);
}

// ---- index_minmax --------------------------------------------------------------------------------------------
template <typename I> void check_minmax(cuhost *t, size_t n) {
    std::vector<I> vals = rnd_index<I>(n, -1000, 100000);
    int64_t m = (int64_t)n, clo, chi, lo = INT64_MAX, hi = INT64_MIN;
    nb__index_minmax_args a;
    memset(&a, 0, sizeof a);
    a.index = contig(vals.data(), sizeof(I) == 8 ? NB_I64 : NB_I32, 1, &m);
    a.out_min = &clo;
    a.out_max = &chi;
    cuhost_cpu()->index_minmax(&a);
    // the GPU's order: per-thread grid-stride partials, then any tree: min/max are exact
    for (int64_t tid = 0; tid < 37; tid++) {
        int64_t l = INT64_MAX, h = INT64_MIN;
        for (int64_t i = tid; i < m; i += 37) mm_note(vals.data(), sizeof(I) == 8, i, &l, &h);
        lo = l < lo ? l : lo;
        hi = h > hi ? h : hi;
    }
    CUHOST_CHECK(t, lo == clo && hi == chi, "index_minmax of %zu: [%lld, %lld] vs CPU [%lld, %lld]",
                 n, (long long)lo, (long long)hi, (long long)clo, (long long)chi);
}

// ---- tril / triu -----------------------------------------------------------------------------------------------
void check_tri(cuhost *t, nb_dtype dt, int64_t k, bool lower) {
    // x (2, 4, 5) as a view of a (5, 4, 2) buffer: strides (1, 2, 8)
    const int64_t xs[3] = {2, 4, 5}, xst[3] = {1, 2, 8};
    size_t es = esize(dt);
    std::vector<char> xb = rnd_bytes(40 * es), ocpu(40 * es, 0x55), oemu = ocpu;
    nb__tri_args a;
    memset(&a, 0, sizeof a);
    a.x = mkview(xb.data(), dt, 3, xs, xst);
    a.out = contig(ocpu.data(), dt, 3, xs);
    a.k = k;
    a.lower = lower;
    cuhost_cpu()->tri(&a);
    tri_geom g = tri_geom_of(&a);
    for (int64_t e = 0; e < 40; e++)
        IX_HOST_BY_ES(es_of(dt), ES, tri_elem<ES>(g, oemu.data(), xb.data(), e));
    CUHOST_CHECK(t, memcmp(ocpu.data(), oemu.data(), ocpu.size()) == 0,
                 "%s k %lld dtype %d: output differs from the CPU's", lower ? "tril" : "triu",
                 (long long)k, (int)dt);
}

} // namespace

void cuhost_index(cuhost *t) {
    const nb__kernels *cpu = cuhost_cpu();
    CUHOST_CHECK(t, cpu && cpu->index_select && cpu->gather && cpu->scatter_add &&
                        cpu->index_add && cpu->masked_fill && cpu->one_hot &&
                        cpu->index_minmax && cpu->tri,
                 "CPU index kernels missing");
    check_gathers(t);
    check_scatters(t);
    check_index_adds(t);
    const nb_dtype dts[] = {NB_F32, NB_F64, NB_BF16, NB_BOOL};
    for (nb_dtype dt : dts) check_masked_fill(t, dt);
    check_one_hot<int64_t>(t, NB_F32, 5, 0, 5);
    check_one_hot<int32_t>(t, NB_BF16, 4, 0, 4);
    check_one_hot<int64_t>(t, NB_I64, 3, 0, 3);
    check_one_hot<int64_t>(t, NB_F32, 5, 0, 9);  // too large: named as the CPU does
    check_one_hot<int32_t>(t, NB_F32, 5, -3, 5); // negative
    {   // zero classes: every value is out of range (k_check)
        std::vector<int32_t> vals = {0, 2};
        int64_t m = 2, os[2] = {2, 0}, k;
        char dummy[4];
        nb__one_hot_args a;
        memset(&a, 0, sizeof a);
        a.out = contig(dummy, NB_F32, 2, os);
        a.index = contig(vals.data(), NB_I32, 1, &m);
        std::string want = cpu_msg(cuhost_cpu()->one_hot(&a));
        ix_bad b = {0, 0};
        for (int64_t i = 0; i < m; i++)
            if (!ix_check(vals.data(), false, i, 0, &k)) ix_bad_note(&b, k);
        std::string got = emu_msg(b, IX_OP_ONE_HOT, 0, 0);
        CUHOST_CHECK(t, want == got && !want.empty(), "one_hot with 0 classes: CPU says \"%s\", "
                     "the record \"%s\"", want.c_str(), got.c_str());
    }
    check_minmax<int64_t>(t, 1000);
    check_minmax<int32_t>(t, 77);
    const int64_t ks[] = {-2, 0, 1, 7, -9, INT64_MAX, INT64_MIN};
    for (int64_t k : ks)
        for (int lower = 0; lower < 2; lower++) {
            check_tri(t, NB_F32, k, lower != 0);
            check_tri(t, NB_BF16, k, lower != 0);
            check_tri(t, NB_F64, k, lower != 0);
        }
}
