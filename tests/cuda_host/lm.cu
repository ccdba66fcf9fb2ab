// tests/cuda_host/lm.cu - host checks of the language-model family's __host__ __device__ math
// (cuda/k_lm.cuh, used by cuda/k_lm.cu: RMSNorm, rotary embeddings, SwiGLU), compiled by nvcc
// and compared with the CPU backend. No GPU needed.
//
// Each kernel of cuda/k_lm.cu is emulated on the host with the same per-thread functions, the
// same launch geometry (ln_threads, ln_chunks) and the same reduction order (a block's
// partials added in nb_block_sum's tree order, chunk partials in chunk order). The results
// must match the CPU kernels (cuhost_cpu()->rms_norm etc.) on the same args: rstd to 1e-12
// relative (only the order of double sums differs), outputs to a few ulps of T.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <vector>

#include "cuda/k_lm.cuh"
#include "cuhost.h"
#include "tensor/backend_table.h"

namespace {

// nb_block_sum (cuda/kcommon.cuh) on the host, for bs (a multiple of 32) partials.
double warp_sum(double *lane) {
    for (int o = 16; o > 0; o >>= 1) {
        double next[32];
        for (int l = 0; l < 32; l++) next[l] = lane[l] + lane[l ^ o];
        memcpy(lane, next, sizeof next);
    }
    return lane[0];
}
double block_sum(std::vector<double> v) {
    int bs = (int)v.size(), nw = (bs + 31) / 32;
    double scratch[32];
    for (int w = 0; w < nw; w++) scratch[w] = warp_sum(&v[32 * w]);
    double lane[32];
    for (int l = 0; l < 32; l++) lane[l] = l < nw ? scratch[l] : 0.0;
    return warp_sum(lane);
}

uint32_t g_rng = 4242;
double rnd() { // uniform in [-1, 1)
    g_rng = g_rng * 1664525u + 1013904223u;
    return (double)(g_rng >> 8) / (double)(1u << 23) - 1.0;
}
template <typename T> std::vector<T> data(int64_t n, double offset, double scale) {
    std::vector<T> v((size_t)(n > 0 ? n : 1));
    for (auto &e : v) e = (T)(offset + scale * rnd());
    return v;
}
template <typename T> double tol() { return sizeof(T) == 4 ? 4e-6 : 1e-13; }
template <typename T> nb_dtype dtype_of() { return sizeof(T) == 4 ? NB_F32 : NB_F64; }

// |a - b| within rel relative to max(|b|, floor): the first bad index or -1
template <typename A>
int64_t first_bad(const A *a, const A *b, int64_t n, double rel, double floor) {
    for (int64_t i = 0; i < n; i++) {
        double x = (double)a[i], y = (double)b[i];
        double s = fabs(y) > floor ? fabs(y) : floor;
        if (!(fabs(x - y) <= rel * s)) return i;
    }
    return -1;
}
#define CHECK_CLOSE(t, what, got, want, n, rel, floor)                                             \
    do {                                                                                           \
        int64_t bad_ = first_bad((got), (want), (n), (rel), (floor));                              \
        CUHOST_CHECK(t, bad_ < 0, "%s: %s[%lld] = %.17g, CPU %.17g", name, what, (long long)bad_,  \
                     bad_ < 0 ? 0.0 : (double)(got)[bad_], bad_ < 0 ? 0.0 : (double)(want)[bad_]); \
    } while (0)

// ---- RMSNorm --------------------------------------------------------------------------------
template <typename T> void emu_rms_fwd(const nb__rms_norm_args &a) {
    const T *x = (const T *)a.x, *w = (const T *)a.w;
    T *y = (T *)a.y;
    const int bs = nbn::ln_threads(a.D);
    std::vector<double> part((size_t)bs);
    for (int64_t i = 0; i < a.N; i++) {
        const T *xr = x + i * a.D;
        for (int t = 0; t < bs; t++) part[t] = nbl::rms_part(xr, a.D, t, bs);
        const double r = nbl::rms_rstd(block_sum(part), a.D, a.eps);
        a.rstd[i] = r;
        for (int64_t j = 0; j < a.D; j++) y[i * a.D + j] = nbl::rms_y(xr[j], (T)r, w, j);
    }
}

template <typename T> void emu_rms_bwd(const nb__rms_norm_backward_args &a) {
    const T *g = (const T *)a.g, *x = (const T *)a.x, *w = (const T *)a.w;
    const int bs = nbn::ln_threads(a.D);
    std::vector<double> part((size_t)bs);
    if (a.dx)
        for (int64_t i = 0; i < a.N; i++) {
            const T *gr = g + i * a.D, *xr = x + i * a.D;
            for (int t = 0; t < bs; t++) part[t] = nbl::rmsb_part(gr, w, xr, a.D, t, bs);
            const T c = nbl::rmsb_c<T>(a.rstd[i], block_sum(part), a.D), r = (T)a.rstd[i];
            for (int64_t j = 0; j < a.D; j++)
                ((T *)a.dx)[i * a.D + j] = nbl::rmsb_dx(gr[j], xr[j], w, j, r, c);
        }
    if (a.dw) {
        const int64_t nch = nbn::ln_chunks(a.N, a.D);
        std::vector<double> cols((size_t)(nch * a.D));
        for (int64_t ch = 0; ch < nch; ch++)
            for (int64_t j = 0; j < a.D; j++)
                cols[ch * a.D + j] = nbl::rmsp_col(g, x, a.rstd, a.D, j, nbn::chunk_lo(a.N, ch, nch),
                                                   nbn::chunk_lo(a.N, ch + 1, nch));
        for (int64_t j = 0; j < a.D; j++) ((T *)a.dw)[j] = (T)nbn::sum_chunks(cols.data(), nch, a.D, j);
    }
}

template <typename T>
void check_rms(cuhost *t, const char *name, int64_t N, int64_t D, bool hw, bool want_dx,
               bool want_dw) {
    const int64_t n = N * D;
    auto x = data<T>(n, 0.5, 2.0), w = data<T>(D, 1.0, 0.5), g = data<T>(n, 0.0, 1.0);
    std::vector<T> y1(x.size()), y2(x.size());
    std::vector<double> r1((size_t)N + 1), r2((size_t)N + 1);
    nb__rms_norm_args a;
    memset(&a, 0, sizeof a);
    a.dtype = dtype_of<T>(), a.N = N, a.D = D, a.eps = 1e-6;
    a.x = x.data(), a.w = hw ? w.data() : NULL, a.y = y1.data(), a.rstd = r1.data();
    emu_rms_fwd<T>(a);
    a.y = y2.data(), a.rstd = r2.data();
    CUHOST_CHECK(t, cuhost_cpu()->rms_norm(&a) == NB_OK, "%s: CPU rms_norm", name);
    CHECK_CLOSE(t, "rstd", r1.data(), r2.data(), N, 1e-12, 1e-300);
    CHECK_CLOSE(t, "y", y1.data(), y2.data(), n, tol<T>(), 1.0);

    std::vector<T> dx1(x.size()), dx2(x.size()), dw1((size_t)D + 1), dw2((size_t)D + 1);
    nb__rms_norm_backward_args k;
    memset(&k, 0, sizeof k);
    k.dtype = a.dtype, k.N = N, k.D = D, k.g = g.data(), k.x = x.data(), k.w = a.w;
    k.rstd = r2.data();
    k.dx = want_dx ? dx1.data() : NULL, k.dw = want_dw ? dw1.data() : NULL;
    emu_rms_bwd<T>(k);
    k.dx = want_dx ? dx2.data() : NULL, k.dw = want_dw ? dw2.data() : NULL;
    CUHOST_CHECK(t, cuhost_cpu()->rms_norm_backward(&k) == NB_OK, "%s: CPU backward", name);
    if (want_dx) CHECK_CLOSE(t, "dx", dx1.data(), dx2.data(), n, tol<T>() * 4, 1.0);
    if (want_dw) CHECK_CLOSE(t, "dw", dw1.data(), dw2.data(), D, tol<T>(), 1.0);
}

// ---- rotary ---------------------------------------------------------------------------------
template <typename T> void emu_rotary(const nb__rotary_args &a) {
    const int64_t h2 = a.D / 2, n = a.N * a.T * a.H * h2;
    std::vector<T> cs((size_t)(2 * a.T * h2 + 1));
    for (int64_t p = 0; p < a.T * h2; p++) // rot_table
        nbl::rot_cs<T>(a.offset + p / h2, p % h2, a.D, a.base, &cs[p], &cs[a.T * h2 + p]);
    const T *x = (const T *)a.x;
    T *y = (T *)a.y;
    for (int64_t p = 0; p < n; p++) { // rot_apply
        const int64_t i = p % h2, row = p / h2, t = row / a.H % a.T, at = row * a.D + i;
        T y1, y2;
        nbl::rot_pair(x[at], x[at + h2], cs[t * h2 + i], cs[a.T * h2 + t * h2 + i], a.inverse,
                      &y1, &y2);
        y[at] = y1, y[at + h2] = y2;
    }
}

template <typename T>
void check_rotary(cuhost *t, const char *name, int64_t N, int64_t TT, int64_t H, int64_t D,
                  int64_t offset, double base, bool inverse) {
    const int64_t n = N * TT * H * D;
    auto x = data<T>(n, 0.0, 1.0);
    std::vector<T> y1(x.size()), y2(x.size());
    nb__rotary_args a;
    memset(&a, 0, sizeof a);
    a.dtype = dtype_of<T>(), a.N = N, a.T = TT, a.H = H, a.D = D, a.offset = offset;
    a.base = base, a.inverse = inverse, a.x = x.data(), a.y = y1.data();
    emu_rotary<T>(a);
    a.y = y2.data();
    CUHOST_CHECK(t, cuhost_cpu()->rotary(&a) == NB_OK, "%s: CPU rotary", name);
    CHECK_CLOSE(t, "y", y1.data(), y2.data(), n, tol<T>(), 1.0);
}

// ---- SwiGLU ---------------------------------------------------------------------------------
template <typename T> void check_glu(cuhost *t, const char *name, int64_t n, int want) {
    auto a = data<T>(n, 0.0, 6.0), b = data<T>(n, 0.0, 1.0), g = data<T>(n, 0.0, 1.0);
    std::vector<T> y1(a.size()), y2(a.size()), da1(a.size()), da2(a.size()), db1(a.size()),
        db2(a.size());
    for (int64_t i = 0; i < n; i++) y1[i] = nbl::glu_y(a[i], b[i]);
    nb__swiglu_args f;
    memset(&f, 0, sizeof f);
    f.dtype = dtype_of<T>(), f.n = n, f.a = a.data(), f.b = b.data(), f.y = y2.data();
    CUHOST_CHECK(t, cuhost_cpu()->swiglu(&f) == NB_OK, "%s: CPU swiglu", name);
    CHECK_CLOSE(t, "y", y1.data(), y2.data(), n, tol<T>(), 1e-3);
    for (int64_t i = 0; i < n; i++) {
        const T e = nbl::glu_e(a[i]);
        if (want & 1) da1[i] = nbl::glu_da(g[i], a[i], b[i], e);
        if (want & 2) db1[i] = nbl::glu_db(g[i], a[i], e);
    }
    nb__swiglu_backward_args k;
    memset(&k, 0, sizeof k);
    k.dtype = f.dtype, k.n = n, k.g = g.data(), k.a = a.data(), k.b = b.data();
    k.da = want & 1 ? da2.data() : NULL, k.db = want & 2 ? db2.data() : NULL;
    CUHOST_CHECK(t, cuhost_cpu()->swiglu_backward(&k) == NB_OK, "%s: CPU backward", name);
    if (want & 1) CHECK_CLOSE(t, "da", da1.data(), da2.data(), n, tol<T>(), 1e-3);
    if (want & 2) CHECK_CLOSE(t, "db", db1.data(), db2.data(), n, tol<T>(), 1e-3);
}

} // namespace

void cuhost_lm(cuhost *t) {
    // RMSNorm: rows of 1 to 4099 (more elements than a block's threads), with and without w
    const int64_t shapes[][2] = {{1, 1}, {7, 24}, {3, 130}, {40, 256}, {2, 4099}, {300, 16}};
    for (const auto &s : shapes) {
        check_rms<float>(t, "rms f32", s[0], s[1], true, true, true);
        check_rms<double>(t, "rms f64", s[0], s[1], true, true, true);
        check_rms<float>(t, "rms f32 no weight", s[0], s[1], false, true, false);
        check_rms<float>(t, "rms f32 dw only", s[0], s[1], true, false, true);
    }
    // rotary: offsets, bases, the inverse
    check_rotary<float>(t, "rotary f32", 2, 7, 3, 8, 0, 10000.0, false);
    check_rotary<float>(t, "rotary f32 offset", 1, 33, 4, 64, 500, 10000.0, false);
    check_rotary<float>(t, "rotary f32 inverse", 3, 5, 2, 16, 9, 500000.0, true);
    check_rotary<double>(t, "rotary f64", 2, 9, 2, 32, 17, 10000.0, false);
    check_rotary<double>(t, "rotary f64 inverse", 2, 9, 2, 32, 17, 10000.0, true);
    // SwiGLU
    for (int want = 1; want <= 3; want++) {
        check_glu<float>(t, "swiglu f32", 1001, want);
        check_glu<double>(t, "swiglu f64", 333, want);
    }
}
