// tests/cuda_host/core.cu - host checks of the core family's __host__ __device__ math
// (cuda/k_core_math.cuh, run by the kernels of cuda/k_core.cu), compiled by nvcc and compared
// with the CPU backend's kernels (cuhost_cpu()->ew / ew_backward / copy / fill) on the same
// argument structs over host buffers. No GPU needed.
//
// For every (op, dtype) the CPU accepts (nb__ew_supported, nb__ew_backward_supported), every
// dtype pair of copy and every dtype of fill, random inputs (with 0, -0, +-inf, NaN, huge and
// integer extremes) in three geometries: 1-D contiguous, 3-D with a transposed and a
// broadcast operand (and a strided output for copy/fill), and a stride-0 scalar operand. The
// per-element functions run for every element (nd offsets, as the nd kernel does), and the
// 16-byte vector chunk function where the vector kernel would run (contiguous f32/bf16).
//
// Comparison: bytes equal, except that
//   - a NaN matches any NaN (payloads not compared);
//   - sin and cos (fwd and bwd) may differ by 2 ulps of the output dtype: the CUDA code
//     reduces the argument exactly by itself (CUDA's sin/cos use local memory), glibc's
//     sinf/cosf are within 1 ulp of the true value;
//   - the ops whose f32 math is the CPU's polynomial (cpu/fastmath.h, cpu/elementwise.c:
//     exp, tanh, sigmoid, silu, gelu, gelu_tanh forward; gelu, gelu_tanh, silu backward) are
//     bit-exact when the CPU build's NB__MADD is an FMA (as on this machine: checked first),
//     else within 2 ulps (the CUDA code always uses fmaf).
// copy and fill compare every byte, NaN payloads included. The number of elements that were
// within tolerance but not bit-equal is printed.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "cuhost.h"
#include "cuda/k_core_math.cuh"
#include "tensor/backend_table.h"

extern "C" bool nb__ew_supported(nb__op op, nb_dtype dt);
extern "C" bool nb__ew_backward_supported(nb__op op, int input, nb_dtype dt);
extern "C" float nb__cpu_expf(float x); // cpu/elementwise.h (C only)

namespace {

uint64_t g_rng = 0x9e3779b97f4a7c15ull;
uint64_t rnd() {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
double urand() { return (double)(rnd() >> 11) * (1.0 / 9007199254740992.0); }

long g_inexact;     // elements within tolerance but not bit-equal
int64_t g_max_ulps; // the largest such difference

bool is_float(nb_dtype dt) { return dt == NB_F32 || dt == NB_F64 || dt == NB_F16 || dt == NB_BF16; }

// A random value for dtype dt (stored with nbc_store_f64's conversion, so half types get the
// CPU's rounding). Specials one time in 8.
double rand_value(nb_dtype dt, double lo, double hi) {
    if (is_float(dt)) {
        static const double sp[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1.0, -1.0, 0.5, 2.0,
                                    1e-30, 88.5, -100.0, 20.0, 1e20, -3.0};
        if (rnd() % 8 == 0) return sp[rnd() % (sizeof sp / sizeof sp[0])];
        return lo + (hi - lo) * urand();
    }
    if (dt == NB_BOOL) return (double)(rnd() & 1);
    if (dt == NB_U8) return (double)(rnd() % 256);
    if (rnd() % 10 == 0) {
        static const double sp[] = {0, 1, -1, 2147483647.0, -2147483648.0, 1e15, -1e15};
        double v = sp[rnd() % 7];
        if (dt == NB_I32 && fabs(v) > 2147483648.0) v = 0;
        return v;
    }
    return (double)((int64_t)(rnd() % 41) - 20);
}

// ---- operands -----------------------------------------------------------------------------
struct Buf {
    char *p = nullptr;
    size_t n = 0;
    Buf() = default;
    Buf(const Buf &) = delete;
    Buf &operator=(const Buf &) = delete;
    void alloc(size_t bytes) {
        n = (bytes + 63) / 64 * 64;
        p = (char *)aligned_alloc(64, n);
        memset(p, 0xAB, n);
    }
    ~Buf() { free(p); }
};

// Geometry of one case: shape, and per operand its strides in elements.
struct Geo {
    int ndim;
    int64_t shape[3];
    int64_t st[4][3];
    const char *name;
};

// g: 0 = 1-D contiguous (n = 37, or 64 + 5 for the vector chunks), 1 = 3-D [3, 4, 5] with
// operand 1 transposed, operand 2 broadcast along dim 1 and operand 3 a broadcast scalar
// (out_strided: operand 0 every other element of the last dim), 2 = 1-D with the last
// operand a stride-0 scalar.
Geo make_geo(int g, int nargs, bool out_strided) {
    Geo geo;
    memset(&geo, 0, sizeof geo);
    if (g == 0 || g == 2) {
        geo.ndim = 1;
        geo.shape[0] = g == 0 ? 69 : 37;
        for (int k = 0; k < nargs; k++) geo.st[k][0] = 1;
        if (g == 2) geo.st[nargs - 1][0] = 0;
        if (out_strided) geo.st[0][0] = 3;
        geo.name = g == 0 ? "1d" : "1d+scalar";
        return geo;
    }
    geo.ndim = 3;
    geo.shape[0] = 3, geo.shape[1] = 4, geo.shape[2] = 5;
    int64_t c[3] = {20, 5, 1}, tr[3] = {1, 3, 12}, bc[3] = {5, 0, 1}, sc[3] = {0, 0, 0};
    int64_t os[3] = {40, 10, 2};
    for (int d = 0; d < 3; d++) {
        geo.st[0][d] = out_strided ? os[d] : c[d];
        if (nargs > 1) geo.st[1][d] = tr[d];
        if (nargs > 2) geo.st[2][d] = bc[d];
        if (nargs > 3) geo.st[3][d] = sc[d];
    }
    geo.name = "3d";
    return geo;
}

int64_t span(const Geo &g, int k) { // elements a buffer of operand k needs
    int64_t m = 0;
    for (int d = 0; d < g.ndim; d++) m += (g.shape[d] - 1) * g.st[k][d];
    return m + 1;
}

void set_iter(nb__iter *it, const Geo &g, int nargs, const nb_dtype *dts, char *const *ptrs) {
    memset(it, 0, sizeof *it);
    it->nargs = nargs;
    it->ndim = g.ndim;
    it->numel = 1;
    for (int d = 0; d < g.ndim; d++) {
        it->shape[d] = g.shape[d];
        it->numel *= g.shape[d];
    }
    for (int k = 0; k < nargs; k++) {
        int es = nb__kh_dtype_size(dts[k]);
        for (int d = 0; d < g.ndim; d++) it->strides[k][d] = g.st[k][d] * es;
        it->dtype[k] = dts[k];
        it->data[k] = ptrs[k];
    }
}

void fill_random(Buf &b, nb_dtype dt, double lo, double hi) {
    int es = nb__kh_dtype_size(dt);
    for (size_t off = 0; off + (size_t)es <= b.n; off += (size_t)es)
        nbc_store_f64(b.p + off, dt, rand_value(dt, lo, hi));
}

// Ordered integer of a float's bits, for ulp distances.
int64_t ordered(const char *p, nb_dtype dt) {
    int64_t v;
    if (dt == NB_F64) {
        int64_t x;
        memcpy(&x, p, 8);
        v = x < 0 ? INT64_MIN - x : x;
    } else if (dt == NB_F32) {
        int32_t x;
        memcpy(&x, p, 4);
        v = x < 0 ? (int64_t)INT32_MIN - x : x;
    } else {
        int16_t x;
        memcpy(&x, p, 2);
        v = x < 0 ? (int64_t)INT16_MIN - x : x;
    }
    return v;
}

bool is_nan(const char *p, nb_dtype dt) {
    if (!is_float(dt)) return false;
    return nbc_load_f64(p, dt) != nbc_load_f64(p, dt);
}

// Compare two output buffers element by element (element size of dt). ulps: the tolerance.
// Returns the number of mismatches; prints the first.
long compare(cuhost *t, const Buf &want, const Buf &got, nb_dtype dt, int ulps, const char *what) {
    int es = nb__kh_dtype_size(dt);
    long bad = 0;
    for (size_t off = 0; off + (size_t)es <= want.n; off += (size_t)es) {
        const char *w = want.p + off, *g = got.p + off;
        if (memcmp(w, g, (size_t)es) == 0) continue;
        if (is_nan(w, dt) && is_nan(g, dt)) continue;
        if (ulps > 0 && is_float(dt) && !is_nan(w, dt) && !is_nan(g, dt) &&
            llabs(ordered(w, dt) - ordered(g, dt)) <= ulps) {
            g_inexact++;
            if (llabs(ordered(w, dt) - ordered(g, dt)) > g_max_ulps)
                g_max_ulps = llabs(ordered(w, dt) - ordered(g, dt));
            continue;
        }
        if (bad++ == 0)
            fprintf(stderr, "  %s: element %zu: cpu %.9g, cuda math %.9g\n", what,
                    off / (size_t)es, nbc_load_f64(w, dt), nbc_load_f64(g, dt));
    }
    CUHOST_CHECK(t, bad == 0, "%s: %ld elements differ", what, bad);
    return bad;
}

// Whether the CPU build's NB__MADD (cpu/fastmath.h) is an FMA, as the CUDA code's always is:
// then the polynomial ops must be bit-equal, else within 2 ulps. Told by comparing the CPU's
// exp with this file's own copy of the polynomial written with fmaf (independent of the
// code under test, so a bug planted there is still caught).
float ref_expf_fma(float x) {
    float xc = x > -104.0f ? x : -104.0f;
    xc = xc < 89.0f ? xc : 89.0f;
    float fn = fmaf(xc, 1.44269504088896341f, 12582912.0f) - 12582912.0f;
    float r = fmaf(fn, 2.12194440e-4f, fmaf(fn, -0.693359375f, xc));
    const float c[8] = {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f,
                        1.0f / 6.0f,    0.5f,           1.0f,           1.0f};
    float p = c[0];
    for (int k = 1; k < 8; k++) p = fmaf(p, r, c[k]);
    int32_t n = (int32_t)fn, n1 = n / 2, n2 = n - n1;
    float y = p * nb__kh_bits_f32((uint32_t)(n1 + 127) << 23) *
              nb__kh_bits_f32((uint32_t)(n2 + 127) << 23);
    return x != x ? x : y;
}

int g_poly_ulps = -1;
int poly_ulps() {
    if (g_poly_ulps >= 0) return g_poly_ulps;
    g_poly_ulps = 0;
    for (int i = 0; i < 4000; i++) {
        float x = (float)(-30.0 + 60.0 * urand());
        if (ref_expf_fma(x) != nb__cpu_expf(x)) g_poly_ulps = 2;
    }
    printf("core: the CPU build's exp polynomial %s: polynomial ops compared %s\n",
           g_poly_ulps ? "does not use FMA" : "uses FMA",
           g_poly_ulps ? "within 2 ulps" : "bit for bit");
    return g_poly_ulps;
}

// The tolerance in ulps of the output dtype: the polynomial ops poly_ulps(); sin and cos 2
// (the CUDA code's reduction is exact and its f32 result correctly rounded; glibc's
// sinf/cosf are within 1 ulp, sin/cos within 1 ulp); everything else 0.
int tolerance(nb__op op, bool bw) {
    switch (op) {
    case NB__OP_EXP: case NB__OP_TANH: case NB__OP_SIGMOID: return bw ? 0 : poly_ulps();
    case NB__OP_SILU: case NB__OP_GELU: case NB__OP_GELU_TANH: return poly_ulps();
    case NB__OP_SIN: case NB__OP_COS: return 2;
    default: return 0;
    }
}

// ---- ew / ew_backward ---------------------------------------------------------------------
// The kernel emulated: every thread of a grid of kEmuThreads (fewer than most cases'
// elements, so the grid-stride loops stride) runs the kernel's thread body for path p.
constexpr int64_t kEmuThreads = 96;

template <typename S, bool BW> void emulate_ew(const nb__ew_args *a, nbc_path p) {
    for (int64_t t = 0; t < kEmuThreads; t++) {
        switch (p) {
        case NBC_PATH_VEC1: case NBC_PATH_VEC2: case NBC_PATH_VEC3:
            if constexpr (nbc_has_vec<S>) {
                if (p == NBC_PATH_VEC1) nbc_ew_vec_thread<S, 1, BW>(a, t, kEmuThreads);
                else if (p == NBC_PATH_VEC2) nbc_ew_vec_thread<S, 2, BW>(a, t, kEmuThreads);
                else nbc_ew_vec_thread<S, 3, BW>(a, t, kEmuThreads);
            }
            break;
        case NBC_PATH_1D: nbc_ew_1d_thread<S, BW>(a, t, kEmuThreads); break;
        case NBC_PATH_ND32: nbc_ew_nd_thread<S, BW, uint32_t>(a, t, kEmuThreads); break;
        default: nbc_ew_nd_thread<S, BW, int64_t>(a, t, kEmuThreads); break;
        }
    }
}

// Run the kernel of a's dtype on the host, on the launcher's path (force < 0) or on path
// force; returns the path taken.
template <typename S, bool BW> nbc_path emulate_ew_path(const nb__ew_args *a, int force) {
    nbc_path p = force < 0 ? nbc_ew_path<S, BW>(a) : (nbc_path)force;
    emulate_ew<S, BW>(a, p);
    return p;
}
nbc_path emulate_ew_dt(const nb__ew_args *a, bool bw, int force) {
    switch (a->dtype) {
    case NB_F32: return bw ? emulate_ew_path<float, true>(a, force) : emulate_ew_path<float, false>(a, force);
    case NB_F64: return bw ? emulate_ew_path<double, true>(a, force) : emulate_ew_path<double, false>(a, force);
    case NB_F16: return bw ? emulate_ew_path<nbc_f16, true>(a, force) : emulate_ew_path<nbc_f16, false>(a, force);
    case NB_BF16: return bw ? emulate_ew_path<nbc_bf16, true>(a, force) : emulate_ew_path<nbc_bf16, false>(a, force);
    case NB_I32: return emulate_ew_path<int32_t, false>(a, force);
    case NB_I64: return emulate_ew_path<int64_t, false>(a, force);
    case NB_U8: return emulate_ew_path<uint8_t, false>(a, force);
    default: return emulate_ew_path<nbc_bool, false>(a, force);
    }
}

// Input range per op (beyond it the specials still come).
void range_of(nb__op op, double *lo, double *hi) {
    *lo = -6, *hi = 6;
    if (op == NB__OP_LOG || op == NB__OP_SQRT || op == NB__OP_RSQRT || op == NB__OP_POW) *lo = -0.5;
    if (op == NB__OP_GELU || op == NB__OP_EXP) *lo = -20, *hi = 20;
}

void check_ew_case(cuhost *t, nb__op op, int input, nb_dtype dt, const nb__ew_ctx &ctx, int g) {
    bool bw = input >= 0;
    nbc_kind kind = nbc_op_kind(op);
    int nargs = bw ? (kind == NBC_UNARY ? 3 : 4)
                   : kind == NBC_UNARY ? 2 : kind == NBC_WHERE ? 4 : 3;
    if (kind == NBC_UNARY && !bw && g == 2) return; // a scalar input: covered by 1d
    nb_dtype dts[4] = {kind == NBC_CMP && !bw ? NB_BOOL : dt, dt, dt, dt};
    if (kind == NBC_WHERE) dts[1] = NB_BOOL;
    Geo geo = make_geo(g, nargs, false);
    Buf in[4], out_cpu, out_host;
    double lo, hi;
    range_of(op, &lo, &hi);
    for (int k = 1; k < nargs; k++) {
        in[k].alloc((size_t)span(geo, k) * (size_t)nb__kh_dtype_size(dts[k]));
        fill_random(in[k], dts[k], lo, hi);
    }
    // maximum/minimum: ties on purpose (a copy of some of a's elements into b)
    if ((op == NB__OP_MAXIMUM || op == NB__OP_MINIMUM || kind == NBC_CMP) && g == 0) {
        int es = nb__kh_dtype_size(dt);
        int ia = bw ? 2 : 1;
        for (int64_t i = 0; i < geo.shape[0]; i += 3)
            memcpy(in[ia + 1].p + i * es, in[ia].p + i * es, (size_t)es);
    }
    out_cpu.alloc((size_t)span(geo, 0) * (size_t)nb__kh_dtype_size(dts[0]));
    out_host.alloc(out_cpu.n);
    nb__ew_args a;
    memset(&a, 0, sizeof a);
    a.op = op;
    a.input = bw ? input : 0;
    a.dtype = dt;
    a.ctx = ctx;
    char *ptrs[4] = {out_cpu.p, in[1].p, in[2].p, in[3].p};
    set_iter(&a.it, geo, nargs, dts, ptrs);
    nb_status st = bw ? cuhost_cpu()->ew_backward(&a) : cuhost_cpu()->ew(&a);
    char what[160];
    snprintf(what, sizeof what, "%s%s input %d dtype %d %s p0 %g b_scalar %d",
             bw ? "ew_backward " : "ew ", nb__op_names[op], input, (int)dt, geo.name, ctx.p0,
             (int)ctx.b_scalar);
    CUHOST_CHECK(t, st == NB_OK, "%s: cpu kernel failed", what);
    nb__ew_args h = a;
    h.it.data[0] = out_host.p;
    // offsets: the decode of all four operands equals khelp's per-operand one
    for (int64_t i = 0; i < a.it.numel; i += 7) {
        int64_t o[4], p[4];
        nbc_offsets4<uint32_t>(&h.it, (uint32_t)i, &o[0], &o[1], &o[2], &o[3]);
        nbc_offsets4<int64_t>(&h.it, i, &p[0], &p[1], &p[2], &p[3]);
        bool same = true;
        for (int k = 0; k < nargs; k++)
            same = same && o[k] == nb__kh_offset(&h.it, k, i) && p[k] == o[k];
        if (!same) {
            CUHOST_CHECK(t, same, "%s: nbc_offsets4 at %lld", what, (long long)i);
            break;
        }
    }
    // the launcher's path, emulated over a small grid
    nbc_path p = emulate_ew_dt(&h, bw, -1);
    compare(t, out_cpu, out_host, dts[0], tolerance(op, bw), what);
    bool vec = g == 0 && (dt == NB_F32 || dt == NB_BF16) &&
               (bw || kind == NBC_UNARY || kind == NBC_BINARY) && !(dt == NB_BF16 && ctx.b_scalar);
    nbc_path want = vec ? (nbc_path)(NBC_PATH_VEC1 + nargs - 2)
                    : g == 1 ? NBC_PATH_ND32 : NBC_PATH_1D;
    CUHOST_CHECK(t, p == want, "%s: path %d, expected %d", what, (int)p, (int)want);
    // and the 64-bit index decode over the same case
    memset(out_host.p, 0xAB, out_host.n);
    emulate_ew_dt(&h, bw, NBC_PATH_ND64);
    compare(t, out_cpu, out_host, dts[0], tolerance(op, bw), what);
}

void check_ew(cuhost *t) {
    long cases = 0;
    for (int op = 0; op < NB__OP_COUNT; op++) {
        for (int dt = 0; dt < NB_DTYPE_COUNT; dt++) {
            nb__op o = (nb__op)op;
            nb_dtype d = (nb_dtype)dt;
            bool want = nb__ew_supported(o, d);
            CUHOST_CHECK(t, nbc_ew_supported(o, d) == want, "ew_supported(%s, %d)",
                         nb__op_names[op], dt);
            for (int in = 0; in < 2; in++)
                CUHOST_CHECK(t, nbc_bw_supported(o, in, d) == nb__ew_backward_supported(o, in, d),
                             "bw_supported(%s, %d, %d)", nb__op_names[op], in, dt);
            if (want) CUHOST_CHECK(t, nbc_op_kind(o) != NBC_NONE, "kind of %s", nb__op_names[op]);
            for (int input = -1; input < 2; input++) {
                if (input < 0 ? !want : !nb__ew_backward_supported(o, input, d)) continue;
                // the parameter sets of the op
                nb__ew_ctx ctxs[8];
                int nctx = 0;
                memset(ctxs, 0, sizeof ctxs);
                if (o == NB__OP_POW_SCALAR) {
                    if (is_float(d)) {
                        const double ex[] = {2, 0.5, 1, 3, -1.5, 0};
                        for (double e : ex) ctxs[nctx++].p0 = e;
                    } else {
                        const int64_t ex[] = {0, 3, 7};
                        for (int64_t e : ex) ctxs[nctx++].i0 = e;
                    }
                } else if (o == NB__OP_CLAMP) {
                    ctxs[0].p0 = -1, ctxs[0].p1 = 2, ctxs[0].i0 = d == NB_U8 ? 3 : -5;
                    ctxs[0].i1 = d == NB_U8 ? 200 : 20;
                    ctxs[1].p0 = 3, ctxs[1].p1 = -3, ctxs[1].i0 = d == NB_U8 ? 9 : 4;
                    ctxs[1].i1 = d == NB_U8 ? 2 : -4; // lo > hi: hi everywhere
                    nctx = 2;
                } else {
                    nctx = 1;
                    nbc_kind k = nbc_op_kind(o);
                    bool binary_like = input < 0 ? k == NBC_BINARY || k == NBC_CMP
                                                 : k == NBC_BINARY;
                    if (binary_like && (d == NB_F16 || d == NB_BF16)) {
                        ctxs[1].p0 = 0.1; // b read as the f32 scalar
                        ctxs[1].b_scalar = true;
                        nctx = 2;
                    }
                }
                for (int c = 0; c < nctx; c++)
                    for (int g = 0; g < 3; g++) {
                        check_ew_case(t, o, input, d, ctxs[c], g);
                        cases++;
                    }
            }
        }
    }
    printf("core: %ld ew/ew_backward cases; %ld elements within tolerance but not bit-equal "
           "(at most %lld ulps)\n", cases, g_inexact, (long long)g_max_ulps);
}

// ---- index decode at large indices (32-bit below 2^31 elements, 64-bit above) ---------------
void check_offsets(cuhost *t) {
    nb__iter it;
    memset(&it, 0, sizeof it);
    it.nargs = 4;
    it.ndim = 4;
    const int64_t shape[2][4] = {{3, 1 << 10, 1 << 10, 1 << 9}, {5, 1 << 12, 1 << 12, 1 << 11}};
    for (int s = 0; s < 2; s++) {
        it.numel = 1;
        for (int d = 0; d < 4; d++) {
            it.shape[d] = shape[s][d];
            it.numel *= shape[s][d];
        }
        for (int k = 0; k < 4; k++)
            for (int d = 0; d < 4; d++) it.strides[k][d] = (int64_t)(rnd() % 1000) - 300;
        long bad = 0;
        for (int r = 0; r < 20000; r++) {
            int64_t i = (int64_t)(rnd() % (uint64_t)it.numel), o[4], p[4];
            nbc_offsets4<int64_t>(&it, i, &o[0], &o[1], &o[2], &o[3]);
            if (i < ((int64_t)1 << 31))
                nbc_offsets4<uint32_t>(&it, (uint32_t)i, &p[0], &p[1], &p[2], &p[3]);
            else
                memcpy(p, o, sizeof o);
            for (int k = 0; k < 4; k++)
                bad += o[k] != nb__kh_offset(&it, k, i) || p[k] != o[k];
        }
        CUHOST_CHECK(t, bad == 0, "nbc_offsets4 on %lld elements: %ld offsets differ",
                     (long long)it.numel, bad);
    }
}

// ---- copy -----------------------------------------------------------------------------------
void check_copy(cuhost *t) {
    for (int od = 0; od < NB_DTYPE_COUNT; od++)
        for (int id = 0; id < NB_DTYPE_COUNT; id++)
            for (int g = 0; g < 4; g++) {
                Geo geo = make_geo(g == 3 ? 1 : g, 2, g == 3);
                nb_dtype dts[2] = {(nb_dtype)od, (nb_dtype)id};
                Buf bufs[2], host;
                bufs[1].alloc((size_t)span(geo, 1) * (size_t)nb__kh_dtype_size(dts[1]));
                fill_random(bufs[1], dts[1], -300, 300);
                bufs[0].alloc((size_t)span(geo, 0) * (size_t)nb__kh_dtype_size(dts[0]));
                host.alloc(bufs[0].n);
                nb__copy_args a;
                memset(&a, 0, sizeof a);
                char *ptrs[2] = {bufs[0].p, bufs[1].p};
                set_iter(&a.it, geo, 2, dts, ptrs);
                nb_status st = cuhost_cpu()->copy(&a);
                CUHOST_CHECK(t, st == NB_OK, "cpu copy failed");
                nb__copy_args h = a;
                h.it.data[0] = host.p;
                char what[96];
                snprintf(what, sizeof what, "copy %d <- %d geometry %d", od, id, g);
                // the launcher's path over a small grid, then the 64-bit decode
                nbc_path p = nbc_copy_path(&h.it);
                for (int run = 0; run < 2; run++) {
                    memset(host.p, 0xAB, host.n);
                    if (run == 1) p = NBC_PATH_ND64;
                    if (p == NBC_PATH_MEMCPY) {
                        memcpy(host.p, bufs[1].p, (size_t)(h.it.numel * nb__kh_dtype_size(dts[0])));
                    } else {
                        for (int64_t t0 = 0; t0 < kEmuThreads; t0++) {
                            if (p == NBC_PATH_VEC1) nbc_copy_vec_thread<4, 2>(&h.it, t0, kEmuThreads);
                            else if (p == NBC_PATH_VEC2) nbc_copy_vec_thread<2, 4>(&h.it, t0, kEmuThreads);
                            else if (p == NBC_PATH_1D) nbc_copy_1d_thread(&h.it, t0, kEmuThreads);
                            else if (p == NBC_PATH_ND32) nbc_copy_nd_thread<uint32_t>(&h.it, t0, kEmuThreads);
                            else nbc_copy_nd_thread<int64_t>(&h.it, t0, kEmuThreads);
                        }
                    }
                    CUHOST_CHECK(t, memcmp(bufs[0].p, host.p, host.n) == 0,
                                 "%s path %d: bytes differ", what, (int)p);
                }
                bool hf = (od == NB_F32 && (id == NB_BF16 || id == NB_F16)) ||
                          (id == NB_F32 && (od == NB_BF16 || od == NB_F16));
                nbc_path want = g == 0 && od == id ? NBC_PATH_MEMCPY
                                : g == 0 && hf     ? (id == NB_F32 ? NBC_PATH_VEC1 : NBC_PATH_VEC2)
                                : g == 1 || g == 3 ? NBC_PATH_ND32
                                                   : NBC_PATH_1D;
                CUHOST_CHECK(t, nbc_copy_path(&h.it) == want, "%s: path %d, expected %d", what,
                             (int)nbc_copy_path(&h.it), (int)want);
            }
}

// ---- fill -----------------------------------------------------------------------------------
template <typename W> void emulate_fill(const nb__iter *it, nbc_path p, uint64_t bits, int64_t t) {
    if (p == NBC_PATH_1D) nbc_fill_1d_thread<W>(it, (W)bits, t, kEmuThreads);
    else if (p == NBC_PATH_ND32) nbc_fill_nd_thread<W, uint32_t>(it, (W)bits, t, kEmuThreads);
    else nbc_fill_nd_thread<W, int64_t>(it, (W)bits, t, kEmuThreads);
}

void check_fill(cuhost *t) {
    const double values[] = {0.0, -0.0, 1.5, -3.7, 1e20, -1e20, NAN, 300.0, -1.0, 65504.0, 1e-8};
    for (int dt = 0; dt < NB_DTYPE_COUNT; dt++)
        for (double v : values)
            for (int g = 0; g < 3; g++) {
                Geo geo = make_geo(g == 2 ? 1 : 0, 1, g > 0);
                nb_dtype dts[1] = {(nb_dtype)dt};
                Buf bufs[1], host;
                bufs[0].alloc((size_t)span(geo, 0) * (size_t)nb__kh_dtype_size(dts[0]));
                host.alloc(bufs[0].n);
                nb__fill_args a;
                memset(&a, 0, sizeof a);
                char *ptrs[1] = {bufs[0].p};
                set_iter(&a.it, geo, 1, dts, ptrs);
                a.value = v;
                nb_status st = cuhost_cpu()->fill(&a);
                CUHOST_CHECK(t, st == NB_OK, "cpu fill failed");
                uint64_t bits;
                nbc_fill_bytes(dts[0], v, &bits);
                nbc_path p = nbc_fill_path(&a.it, bits);
                nb__iter h = a.it;
                h.data[0] = host.p;
                for (int run = 0; run < 2; run++) {
                    memset(host.p, 0xAB, host.n);
                    if (run == 1) p = NBC_PATH_ND64;
                    if (p == NBC_PATH_MEMSET)
                        memset(host.p, 0, (size_t)(h.numel * nb__kh_dtype_size(dts[0])));
                    for (int64_t t0 = 0; t0 < kEmuThreads && p != NBC_PATH_MEMSET; t0++) {
                        switch (nb__kh_dtype_size(dts[0])) {
                        case 1: emulate_fill<uint8_t>(&h, p, bits, t0); break;
                        case 2: emulate_fill<uint16_t>(&h, p, bits, t0); break;
                        case 4: emulate_fill<uint32_t>(&h, p, bits, t0); break;
                        default: emulate_fill<uint64_t>(&h, p, bits, t0); break;
                        }
                    }
                    CUHOST_CHECK(t, memcmp(bufs[0].p, host.p, host.n) == 0,
                                 "fill dtype %d value %g geometry %d path %d: bytes differ", dt, v,
                                 g, (int)p);
                }
                nbc_path want = g == 0 && bits == 0 ? NBC_PATH_MEMSET
                                : g == 2            ? NBC_PATH_ND32
                                                    : NBC_PATH_1D;
                CUHOST_CHECK(t, nbc_fill_path(&a.it, bits) == want, "fill path");
            }
}

}  // namespace

void cuhost_core(cuhost *t) {
    const nb__kernels *cpu = cuhost_cpu();
    CUHOST_CHECK(t, cpu && cpu->ew && cpu->ew_backward && cpu->copy && cpu->fill,
                 "CPU core kernels missing");
    if (!cpu || !cpu->ew || !cpu->ew_backward || !cpu->copy || !cpu->fill) return;
    check_offsets(t);
    check_ew(t);
    check_copy(t);
    check_fill(t);
}
