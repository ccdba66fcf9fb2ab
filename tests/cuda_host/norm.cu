// tests/cuda_host/norm.cu - host checks of the norm family's __host__ __device__ math
// (cuda/k_norm.cuh, used by cuda/k_norm.cu), compiled by nvcc and compared with the CPU
// backend. No GPU needed.
//
// Each kernel of cuda/k_norm.cu is emulated on the host with the same per-thread functions,
// the same launch geometry (ln_threads, ln_chunks, bn_chunks, kBnThreads) and the same
// reduction order: the per-thread partials of a block are added in nb_block_sum's tree
// order (block_sum below: a butterfly within each warp, then warp 0 over the warp sums),
// chunk partials in chunk order. The results must match the CPU kernels
// (cuhost_cpu()->layer_norm etc.) on the same args: statistics to 1e-12 relative (they
// differ only in the order of double sums), outputs to a few ulps of T.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <vector>

#include "cuda/k_norm.cuh"
#include "cuhost.h"
#include "tensor/backend_table.h"

namespace {

// nb_block_sum (cuda/kcommon.cuh) on the host: v holds the bs (multiple of 32) threads'
// values. lane l of a warp adds the value of lane l ^ o for o = 16, 8, 4, 2, 1; lane 0's
// result of each warp goes to scratch; warp 0 loads scratch (0 past the warps) and does the
// same; lane 0 has the sum.
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

uint32_t g_rng = 777;
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

template <typename T> nb_dtype dtype_of() { return sizeof(T) == 4 ? NB_F32 : NB_F64; }

// ---- layer norm -----------------------------------------------------------------------------
template <typename T> void emu_ln_fwd(const nb__layer_norm_args &a) {
    const T *x = (const T *)a.x, *w = (const T *)a.w, *b = (const T *)a.b;
    T *y = (T *)a.y;
    int bs = nbn::ln_threads(a.D);
    std::vector<double> part((size_t)bs);
    for (int64_t i = 0; i < a.N; i++) {
        const T *xr = x + i * a.D;
        for (int t = 0; t < bs; t++) part[t] = nbn::ln_part_sum(xr, a.D, t, bs);
        double m = nbn::ln_mean(block_sum(part), a.D);
        for (int t = 0; t < bs; t++) part[t] = nbn::ln_part_dev2(xr, a.D, m, t, bs);
        double rs = nbn::ln_rstd(block_sum(part), a.D, a.eps);
        a.mean[i] = m;
        a.rstd[i] = rs;
        for (int64_t j = 0; j < a.D; j++) y[i * a.D + j] = nbn::ln_y(xr[j], (T)m, (T)rs, w, b, j);
    }
}

template <typename T> void emu_ln_bwd(const nb__layer_norm_backward_args &a) {
    const T *g = (const T *)a.g, *x = (const T *)a.x, *w = (const T *)a.w;
    int bs = nbn::ln_threads(a.D);
    std::vector<double> p1((size_t)bs), p2((size_t)bs);
    if (a.dx)
        for (int64_t i = 0; i < a.N; i++) {
            const T *gr = g + i * a.D, *xr = x + i * a.D;
            T m = (T)a.mean[i], r = (T)a.rstd[i];
            for (int t = 0; t < bs; t++) nbn::lnb_part(gr, xr, w, m, r, a.D, t, bs, &p1[t], &p2[t]);
            double s1 = block_sum(p1), s2 = block_sum(p2);
            T c1 = (T)(s1 / (double)a.D), c2 = (T)(s2 / (double)a.D);
            for (int64_t j = 0; j < a.D; j++)
                ((T *)a.dx)[i * a.D + j] = nbn::lnb_dx(gr[j], xr[j], w, j, m, r, c1, c2);
        }
    if (a.dw || a.db) {
        int64_t nch = nbn::ln_chunks(a.N, a.D);
        std::vector<double> part((size_t)(2 * nch * a.D));
        for (int64_t ch = 0; ch < nch; ch++)
            for (int64_t j = 0; j < a.D; j++)
                nbn::lnp_col(g, x, a.mean, a.rstd, a.D, j, nbn::chunk_lo(a.N, ch, nch),
                             nbn::chunk_lo(a.N, ch + 1, nch), &part[ch * a.D + j],
                             &part[(nch + ch) * a.D + j]);
        for (int64_t j = 0; j < a.D; j++) {
            if (a.dw) ((T *)a.dw)[j] = (T)nbn::sum_chunks(part.data(), nch, a.D, j);
            if (a.db) ((T *)a.db)[j] = (T)nbn::sum_chunks(part.data() + nch * a.D, nch, a.D, j);
        }
    }
}

template <typename T>
void check_ln(cuhost *t, const char *name, int64_t N, int64_t D, bool hw, bool hb, bool want_dx,
              bool want_dw, bool want_db) {
    int64_t n = N * D;
    auto x = data<T>(n, 3.0, 2.0), w = data<T>(D, 1.0, 0.5), b = data<T>(D, 0.0, 1.0);
    auto g = data<T>(n, 0.0, 1.0);
    std::vector<T> y1(x.size()), y2(x.size());
    std::vector<double> m1((size_t)N + 1), r1((size_t)N + 1), m2((size_t)N + 1), r2((size_t)N + 1);
    nb__layer_norm_args a;
    memset(&a, 0, sizeof a);
    a.dtype = dtype_of<T>(), a.N = N, a.D = D, a.eps = 1e-5;
    a.x = x.data(), a.w = hw ? w.data() : NULL, a.b = hb ? b.data() : NULL;
    a.y = y1.data(), a.mean = m1.data(), a.rstd = r1.data();
    emu_ln_fwd<T>(a);
    a.y = y2.data(), a.mean = m2.data(), a.rstd = r2.data();
    CUHOST_CHECK(t, cuhost_cpu()->layer_norm(&a) == NB_OK, "%s: CPU layer_norm", name);
    CHECK_CLOSE(t, "mean", m1.data(), m2.data(), N, 1e-12, 1e-300);
    CHECK_CLOSE(t, "rstd", r1.data(), r2.data(), N, 1e-12, 1e-300);
    CHECK_CLOSE(t, "y", y1.data(), y2.data(), n, tol<T>(), 1.0);

    // backward from the CPU's statistics (both sides read the same)
    std::vector<T> dx1(x.size()), dx2(x.size()), dw1((size_t)D + 1), dw2((size_t)D + 1),
        db1((size_t)D + 1), db2((size_t)D + 1);
    nb__layer_norm_backward_args k;
    memset(&k, 0, sizeof k);
    k.dtype = a.dtype, k.N = N, k.D = D, k.g = g.data(), k.x = x.data(), k.w = a.w;
    k.mean = m2.data(), k.rstd = r2.data();
    k.dx = want_dx ? dx1.data() : NULL, k.dw = want_dw ? dw1.data() : NULL;
    k.db = want_db ? db1.data() : NULL;
    emu_ln_bwd<T>(k);
    k.dx = want_dx ? dx2.data() : NULL, k.dw = want_dw ? dw2.data() : NULL;
    k.db = want_db ? db2.data() : NULL;
    CUHOST_CHECK(t, cuhost_cpu()->layer_norm_backward(&k) == NB_OK, "%s: CPU backward", name);
    if (want_dx) CHECK_CLOSE(t, "dx", dx1.data(), dx2.data(), n, tol<T>() * 4, 1.0);
    if (want_dw) CHECK_CLOSE(t, "dw", dw1.data(), dw2.data(), D, tol<T>(), 1.0);
    if (want_db) CHECK_CLOSE(t, "db", db1.data(), db2.data(), D, tol<T>(), 1.0);
}

// ---- batch norm -----------------------------------------------------------------------------
// bn_partials + a combine: out[c] (and out2[c]) = the channel sums in the kernels' order.
template <typename T>
void emu_bn_sums(int kind, const T *x, const T *g, int64_t N, int64_t C, int64_t S,
                 const double *mean, double *out, double *out2) {
    int64_t M = N * S, nch = nbn::bn_chunks(M);
    int bs = nbn::kBnThreads;
    std::vector<double> part((size_t)(2 * nch * C)), p1((size_t)bs), p2((size_t)bs);
    for (int64_t ch = 0; ch < nch; ch++)
        for (int64_t c = 0; c < C; c++) {
            for (int tt = 0; tt < bs; tt++)
                nbn::bn_part(kind, x, g, C, S, c, mean ? mean[c] : 0.0, nbn::chunk_lo(M, ch, nch),
                             nbn::chunk_lo(M, ch + 1, nch), tt, bs, &p1[tt], &p2[tt]);
            part[ch * C + c] = block_sum(p1);
            if (kind == 2) part[(nch + ch) * C + c] = block_sum(p2);
        }
    for (int64_t c = 0; c < C; c++) {
        out[c] = nbn::sum_chunks(part.data(), nch, C, c);
        if (out2) out2[c] = nbn::sum_chunks(part.data() + nch * C, nch, C, c);
    }
}

template <typename T> void emu_bn_stats(const nb__batch_norm_stats_args &a) {
    int64_t M = a.N * a.S;
    if (!a.training) {
        for (int64_t c = 0; c < a.C; c++) {
            a.mean[c] = nbn::ld_any(nbn::view_at(a.running_mean, c), a.running_mean.dtype);
            double v = nbn::ld_any(nbn::view_at(a.running_var, c), a.running_var.dtype);
            a.rstd[c] = 1.0 / sqrt(nbn::add(v, a.eps));
        }
        return;
    }
    std::vector<double> s((size_t)a.C + 1);
    emu_bn_sums<T>(0, (const T *)a.x, NULL, a.N, a.C, a.S, NULL, s.data(), NULL);
    for (int64_t c = 0; c < a.C; c++) a.mean[c] = M ? s[c] / (double)M : 0.0;
    emu_bn_sums<T>(1, (const T *)a.x, NULL, a.N, a.C, a.S, a.mean, s.data(), NULL);
    for (int64_t c = 0; c < a.C; c++) {
        double v = M ? s[c] / (double)M : 0.0;
        if (a.running_mean.data) {
            nbn::bn_blend(nbn::view_at(a.running_mean, c), a.running_mean.dtype, a.mean[c],
                          a.momentum, 1.0);
            nbn::bn_blend(nbn::view_at(a.running_var, c), a.running_var.dtype, v, a.momentum,
                          (double)M / (double)(M - 1));
        }
        a.rstd[c] = 1.0 / sqrt(nbn::add(v, a.eps));
    }
}

nb__view view1(void *data, nb_dtype dt, int64_t C, int64_t stride) {
    nb__view v;
    memset(&v, 0, sizeof v);
    v.data = (char *)data, v.dtype = dt, v.ndim = 1, v.shape[0] = C, v.strides[0] = stride;
    return v;
}

template <typename T>
void check_bn(cuhost *t, const char *name, int64_t N, int64_t C, int64_t S, bool affine,
              nb_dtype run_dt, bool batch_stats) {
    int64_t n = N * C * S, M = N * S;
    auto x = data<T>(n, 2.0, 3.0), g = data<T>(n, 0.0, 1.0), w = data<T>(C, 1.0, 0.5),
         b = data<T>(C, 0.0, 1.0);
    // running statistics: stride 2 in a buffer of run_dt
    std::vector<unsigned char> rm1(16 * (size_t)(C + 1)), rv1(16 * (size_t)(C + 1));
    for (int64_t c = 0; c < C; c++) {
        nbn::st_any((char *)rm1.data() + c * 2 *
                                             (run_dt == NB_F64   ? 8
                                              : run_dt == NB_F32 ? 4
                                                                 : 2),
                    run_dt, 0.1 * (double)c);
        nbn::st_any((char *)rv1.data() + c * 2 *
                                             (run_dt == NB_F64   ? 8
                                              : run_dt == NB_F32 ? 4
                                                                 : 2),
                    run_dt, 1.0 + 0.2 * (double)c);
    }
    std::vector<unsigned char> rm2 = rm1, rv2 = rv1;
    std::vector<double> m1((size_t)C), r1((size_t)C), m2((size_t)C), r2((size_t)C);
    nb__batch_norm_stats_args a;
    memset(&a, 0, sizeof a);
    a.dtype = dtype_of<T>(), a.N = N, a.C = C, a.S = S, a.x = x.data();
    a.training = batch_stats, a.momentum = 0.1, a.eps = 1e-5;
    a.running_mean = view1(rm1.data(), run_dt, C, 2);
    a.running_var = view1(rv1.data(), run_dt, C, 2);
    a.mean = m1.data(), a.rstd = r1.data();
    emu_bn_stats<T>(a);
    a.running_mean = view1(rm2.data(), run_dt, C, 2);
    a.running_var = view1(rv2.data(), run_dt, C, 2);
    a.mean = m2.data(), a.rstd = r2.data();
    CUHOST_CHECK(t, cuhost_cpu()->batch_norm_stats(&a) == NB_OK, "%s: CPU stats", name);
    CHECK_CLOSE(t, "mean", m1.data(), m2.data(), C, 1e-12, 1e-300);
    CHECK_CLOSE(t, "rstd", r1.data(), r2.data(), C, 1e-12, 1e-300);
    std::vector<double> run1((size_t)(2 * C)), run2((size_t)(2 * C));
    for (int64_t c = 0; c < C; c++) {
        run1[c] = nbn::ld_any(nbn::view_at(view1(rm1.data(), run_dt, C, 2), c), run_dt);
        run2[c] = nbn::ld_any(nbn::view_at(view1(rm2.data(), run_dt, C, 2), c), run_dt);
        run1[C + c] = nbn::ld_any(nbn::view_at(view1(rv1.data(), run_dt, C, 2), c), run_dt);
        run2[C + c] = nbn::ld_any(nbn::view_at(view1(rv2.data(), run_dt, C, 2), c), run_dt);
    }
    CHECK_CLOSE(t, "running stats", run1.data(), run2.data(), 2 * C,
                run_dt == NB_F64   ? 1e-12
                : run_dt == NB_F32 ? 1e-6
                                   : 1e-2,
                1.0);

    // apply (elementwise: the same bits as the CPU)
    std::vector<T> y1(x.size()), y2(x.size());
    nb__batch_norm_apply_args p;
    memset(&p, 0, sizeof p);
    p.dtype = a.dtype, p.N = N, p.C = C, p.S = S, p.x = x.data();
    p.w = affine ? w.data() : NULL, p.b = affine ? b.data() : NULL;
    p.mean = m2.data(), p.rstd = r2.data();
    for (int64_t i = 0; i < n; i++)
        y1[i] = nbn::bn_y(x[i], i / S % C, p.mean, p.rstd, (const T *)p.w, (const T *)p.b);
    p.y = y2.data();
    CUHOST_CHECK(t, cuhost_cpu()->batch_norm_apply(&p) == NB_OK, "%s: CPU apply", name);
    CHECK_CLOSE(t, "y", y1.data(), y2.data(), n, 0.0, 1.0);

    // backward: the sums, dw/db, dx
    std::vector<T> dx1(x.size()), dx2(x.size()), dw1((size_t)C), dw2((size_t)C), db1((size_t)C),
        db2((size_t)C);
    std::vector<double> sg((size_t)C + 1), sgd((size_t)C + 1);
    emu_bn_sums<T>(2, x.data(), g.data(), N, C, S, m2.data(), sg.data(), sgd.data());
    for (int64_t c = 0; c < C; c++) {
        dw1[c] = (T)nbn::mul(sgd[c], r2[c]);
        db1[c] = (T)sg[c];
    }
    std::vector<double> sums((size_t)(2 * C));
    for (int64_t c = 0; c < C; c++) sums[c] = sg[c], sums[C + c] = sgd[c];
    for (int64_t i = 0; i < n; i++)
        dx1[i] = nbn::bn_dx(g[i], x[i], i / S % C, m2.data(), r2.data(),
                            affine ? (const T *)w.data() : (const T *)NULL, batch_stats,
                            sums.data(), sums.data() + C, M);
    nb__batch_norm_backward_args k;
    memset(&k, 0, sizeof k);
    k.dtype = a.dtype, k.N = N, k.C = C, k.S = S, k.g = g.data(), k.x = x.data();
    k.w = affine ? w.data() : NULL, k.mean = m2.data(), k.rstd = r2.data();
    k.batch_stats = batch_stats, k.dx = dx2.data(), k.dw = dw2.data(), k.db = db2.data();
    CUHOST_CHECK(t, cuhost_cpu()->batch_norm_backward(&k) == NB_OK, "%s: CPU backward", name);
    CHECK_CLOSE(t, "dw", dw1.data(), dw2.data(), C, tol<T>(), 1.0);
    CHECK_CLOSE(t, "db", db1.data(), db2.data(), C, tol<T>(), 1.0);
    CHECK_CLOSE(t, "dx", dx1.data(), dx2.data(), n, tol<T>() * 4, 1.0);
}

} // namespace

void cuhost_norm(cuhost *t) {
    // geometry: warps per row block, chunk counts (shape only)
    CUHOST_CHECK(
        t, nbn::ln_threads(1) == 32 && nbn::ln_threads(129) == 64 && nbn::ln_threads(100000) == 256,
        "ln_threads");
    CUHOST_CHECK(t,
                 nbn::ln_chunks(1, 10) == 1 && nbn::ln_chunks(40, 10) == 3 &&
                     nbn::ln_chunks(100000, 8192) == 256 && nbn::ln_chunks(100000, 65536) == 32 &&
                     nbn::ln_chunks(100000, (int64_t)1 << 30) == 1,
                 "ln_chunks");
    CUHOST_CHECK(t,
                 nbn::bn_chunks(0) == 1 && nbn::bn_chunks(9000) == 3 &&
                     nbn::bn_chunks((int64_t)1 << 40) == 64,
                 "bn_chunks");
    CUHOST_CHECK(t, block_sum(std::vector<double>(96, 0.5)) == 48.0, "block_sum");

    // layer norm: one warp, several warps, strided threads (D > 256), no affine, D 0
    check_ln<float>(t, "ln f32 5x1", 5, 1, true, true, true, true, true);
    check_ln<float>(t, "ln f32 3x7", 3, 7, true, true, true, true, true);
    check_ln<float>(t, "ln f32 4x100 no b", 4, 100, true, false, true, true, false);
    check_ln<float>(t, "ln f32 3x300 plain", 3, 300, false, false, true, false, false);
    check_ln<float>(t, "ln f32 2x1030", 2, 1030, true, true, true, true, true);
    check_ln<float>(t, "ln f32 40x33 dw db only", 40, 33, true, true, false, true, true);
    check_ln<float>(t, "ln f32 2x0", 2, 0, true, true, true, true, true);
    check_ln<double>(t, "ln f64 6x200", 6, 200, true, true, true, true, true);
    check_ln<double>(t, "ln f64 3x65 no w", 3, 65, false, true, true, false, true);

    // batch norm: spatial, (N, C) vectors, several chunks per channel, eval statistics
    check_bn<float>(t, "bn f32 4x3x5", 4, 3, 5, true, NB_F32, true);
    check_bn<float>(t, "bn f32 6x5x1", 6, 5, 1, true, NB_F32, true);
    check_bn<float>(t, "bn f32 3x2x3000 (3 chunks)", 3, 2, 3000, true, NB_F32, true);
    check_bn<float>(t, "bn f32 1x2x9000 bf16 running", 1, 2, 9000, false, NB_BF16, true);
    check_bn<float>(t, "bn f32 eval", 2, 3, 4, true, NB_F32, false);
    check_bn<double>(t, "bn f64 5x4x7", 5, 4, 7, true, NB_F64, true);
    check_bn<double>(t, "bn f64 eval no affine", 2, 3, 5, false, NB_F64, false);

    // dropout: every float dtype, the CPU's bits
    const nb_dtype dts[4] = {NB_F32, NB_F64, NB_F16, NB_BF16};
    for (nb_dtype dt : dts) {
        const int64_t n = 257;
        size_t es = dt == NB_F64 ? 8 : dt == NB_F32 ? 4 : 2;
        std::vector<unsigned char> x(n * es), o1(n * es), o2(n * es);
        std::vector<uint8_t> mask(n);
        for (int64_t i = 0; i < n; i++) {
            nbn::st_any((char *)x.data() + i * es, dt, 4.0 * rnd());
            mask[i] = rnd() > -0.2 ? 1 : 0;
        }
        nb__dropout_args d;
        memset(&d, 0, sizeof d);
        d.dtype = dt, d.n = n, d.x = x.data(), d.mask = mask.data(), d.scale = 1.0 / 0.6;
        for (int64_t i = 0; i < n; i++) nbn::dropout_el(d.x, d.mask, o1.data(), i, dt, d.scale);
        d.out = o2.data();
        CUHOST_CHECK(t, cuhost_cpu()->dropout(&d) == NB_OK, "CPU dropout");
        CUHOST_CHECK(t, memcmp(o1.data(), o2.data(), n * es) == 0, "dropout dtype %d: bits differ",
                     (int)dt);
    }
}
