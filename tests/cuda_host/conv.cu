// tests/cuda_host/conv.cu - host checks of the conv family's __host__ __device__ math
// (cuda/k_conv.cuh, used by cuda/k_conv.cu), compiled by nvcc and compared with the CPU
// backend (cpu/conv.c, cpu/pool.c) on the same nb__*_args structs. No GPU needed.
//
// Each kernel of k_conv.cu is emulated on the host: a loop over the kernel's flat index
// decoding it as the kernel does and calling the same per-element function.
//   - pools, forward and backward, f32 and f64: the SAME BITS as the CPU (the functions add
//     in the CPU's order), argmax included; NaN, -inf and ties in the max pool's input;
//   - conv f32 (the no-cuDNN path): im2col_at + a host GEMM, col2im_at after a host GEMM,
//     the weight gradient over im2col_at, the bias gradient through the block-sum tree
//     (emulated lane by lane) - within float rounding of the CPU;
//   - conv f64 direct kernels within double rounding; bf16 (widen, f32, round once) within
//     one bf16 step;
//   - with cuDNN: its output size (cudnnGetConvolutionNdForwardOutputDim, no GPU or handle
//     needed) equals the CPU's rule for every geometry tried.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cuda/k_conv.cuh"
#include "cuda/khelp.h"
#include "cuhost.h"
#include "tensor/backend_table.h"
#if NB_CUHOST_CUDNN
#include "cuda/cudnn_desc.h"
#endif

using namespace nbconv;

namespace {

uint64_t g_rng = 0x9e3779b97f4a7c15ull;
double urand() { // [-1, 1)
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) / (double)(1ull << 52) - 1.0;
}

template <typename T> void fill(std::vector<T> &v, bool specials) {
    for (size_t i = 0; i < v.size(); i++) {
        double r = urand();
        v[i] = (T)r;
        if (specials) { // ties, -inf, NaN
            if (i % 7 == 3) v[i] = (T)0.5;
            if (i % 23 == 5) v[i] = -(T)INFINITY;
            if (i % 41 == 17) v[i] = (T)NAN;
        }
    }
}

template <typename T> bool same_bits(const std::vector<T> &a, const std::vector<T> &b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <typename T> nb_dtype dtype_of();
template <> nb_dtype dtype_of<float>() { return NB_F32; }
template <> nb_dtype dtype_of<double>() { return NB_F64; }

// ---- pools -------------------------------------------------------------------------------------
struct pool_case {
    int64_t planes, H, W, kh, kw, sh, sw, ph, pw;
};

nb__pool2d_geom pool_geom(const pool_case &p) {
    nb__pool2d_geom g = {p.planes, p.H, p.W, 0, 0, p.kh, p.kw, p.sh, p.sw, p.ph, p.pw};
    g.OH = (p.H + 2 * p.ph - p.kh) / p.sh + 1; // nn/pool.c's rule
    g.OW = (p.W + 2 * p.pw - p.kw) / p.sw + 1;
    return g;
}

template <typename T> void check_maxpool(cuhost *t, const nb__pool2d_geom &g) {
    const nb__kernels *cpu = cuhost_cpu();
    int64_t HW = g.H * g.W, L = g.OH * g.OW;
    std::vector<T> x((size_t)(g.planes * HW)), y((size_t)(g.planes * L)), ye(y.size());
    std::vector<int32_t> idx(y.size()), idxe(y.size());
    fill(x, true);
    nb__pool2d_args a = {g, dtype_of<T>(), false, false, x.data(), y.data(), idx.data()};
    CUHOST_CHECK(t, cpu->maxpool2d(&a) == NB_OK, "cpu maxpool2d");
    for (int64_t i = 0; i < g.planes * L; i++) { // maxpool_fwd_k
        int64_t p = i / L, l = i - p * L, oh = l / g.OW, ow = l - oh * g.OW;
        int32_t mi;
        ye[(size_t)i] = maxpool_at<T>(&g, x.data() + p * HW, oh, ow, &mi);
        idxe[(size_t)i] = mi;
    }
    CUHOST_CHECK(t, same_bits(y, ye) && idx == idxe,
                 "maxpool2d %lldx%lld k%lldx%lld s%lld,%lld p%lld,%lld: values or argmax differ",
                 (long long)g.H, (long long)g.W, (long long)g.kh, (long long)g.kw,
                 (long long)g.sh, (long long)g.sw, (long long)g.ph, (long long)g.pw);
    std::vector<T> gy(y.size()), gx(x.size()), gxe(x.size());
    fill(gy, false);
    nb__pool2d_backward_args b = {g, dtype_of<T>(), false, gy.data(), idx.data(), gx.data()};
    CUHOST_CHECK(t, cpu->maxpool2d_backward(&b) == NB_OK, "cpu maxpool2d_backward");
    for (int64_t i = 0; i < g.planes * HW; i++) { // maxpool_bwd_k
        int64_t p = i / HW, r = i - p * HW, h = r / g.W, w = r - h * g.W;
        gxe[(size_t)i] = maxpool_grad_at<T>(&g, gy.data() + p * L, idx.data() + p * L, h, w);
    }
    CUHOST_CHECK(t, same_bits(gx, gxe), "maxpool2d_backward %lldx%lld k%lld s%lld p%lld differs",
                 (long long)g.H, (long long)g.W, (long long)g.kh, (long long)g.sh,
                 (long long)g.ph);
}

template <typename T> void check_avgpool(cuhost *t, const nb__pool2d_geom &g, bool cip) {
    const nb__kernels *cpu = cuhost_cpu();
    int64_t HW = g.H * g.W, L = g.OH * g.OW;
    std::vector<T> x((size_t)(g.planes * HW)), y((size_t)(g.planes * L)), ye(y.size());
    fill(x, false);
    nb__pool2d_args a = {g, dtype_of<T>(), cip, false, x.data(), y.data(), NULL};
    CUHOST_CHECK(t, cpu->avgpool2d(&a) == NB_OK, "cpu avgpool2d");
    for (int64_t i = 0; i < g.planes * L; i++) { // avgpool_fwd_k
        int64_t p = i / L, l = i - p * L, oh = l / g.OW, ow = l - oh * g.OW;
        ye[(size_t)i] = avgpool_at<T>(&g, cip, x.data() + p * HW, oh, ow);
    }
    CUHOST_CHECK(t, same_bits(y, ye), "avgpool2d %lldx%lld k%lld s%lld p%lld cip %d differs",
                 (long long)g.H, (long long)g.W, (long long)g.kh, (long long)g.sh,
                 (long long)g.ph, (int)cip);
    std::vector<T> gy(y.size()), gx(x.size()), gxe(x.size());
    fill(gy, false);
    nb__pool2d_backward_args b = {g, dtype_of<T>(), cip, gy.data(), NULL, gx.data()};
    CUHOST_CHECK(t, cpu->avgpool2d_backward(&b) == NB_OK, "cpu avgpool2d_backward");
    for (int64_t i = 0; i < g.planes * HW; i++) { // avgpool_bwd_k
        int64_t p = i / HW, r = i - p * HW, h = r / g.W, w = r - h * g.W;
        gxe[(size_t)i] = avgpool_grad_at<T>(&g, cip, gy.data() + p * L, h, w);
    }
    CUHOST_CHECK(t, same_bits(gx, gxe),
                 "avgpool2d_backward %lldx%lld k%lld s%lld p%lld cip %d differs",
                 (long long)g.H, (long long)g.W, (long long)g.kh, (long long)g.sh,
                 (long long)g.ph, (int)cip);
}

template <typename T> void check_adaptive(cuhost *t, const nb__pool2d_geom &g) {
    const nb__kernels *cpu = cuhost_cpu();
    int64_t HW = g.H * g.W, L = g.OH * g.OW;
    std::vector<T> x((size_t)(g.planes * HW)), y((size_t)(g.planes * L)), ye(y.size());
    fill(x, false);
    nb__pool2d_args a = {g, dtype_of<T>(), false, false, x.data(), y.data(), NULL};
    CUHOST_CHECK(t, cpu->adaptive_avgpool2d(&a) == NB_OK, "cpu adaptive_avgpool2d");
    for (int64_t i = 0; i < g.planes * L; i++) { // adaptive_fwd_k
        int64_t p = i / L, l = i - p * L, oh = l / g.OW, ow = l - oh * g.OW;
        ye[(size_t)i] = adaptive_at<T>(&g, x.data() + p * HW, oh, ow);
    }
    CUHOST_CHECK(t, same_bits(y, ye), "adaptive_avgpool2d %lldx%lld -> %lldx%lld differs",
                 (long long)g.H, (long long)g.W, (long long)g.OH, (long long)g.OW);
    std::vector<T> gy(y.size()), gx(x.size()), gxe(x.size());
    fill(gy, false);
    nb__pool2d_backward_args b = {g, dtype_of<T>(), false, gy.data(), NULL, gx.data()};
    CUHOST_CHECK(t, cpu->adaptive_avgpool2d_backward(&b) == NB_OK,
                 "cpu adaptive_avgpool2d_backward");
    for (int64_t i = 0; i < g.planes * HW; i++) { // adaptive_bwd_k
        int64_t p = i / HW, r = i - p * HW, h = r / g.W, w = r - h * g.W;
        gxe[(size_t)i] = adaptive_grad_at<T>(&g, gy.data() + p * L, h, w);
    }
    CUHOST_CHECK(t, same_bits(gx, gxe),
                 "adaptive_avgpool2d_backward %lldx%lld -> %lldx%lld differs", (long long)g.H,
                 (long long)g.W, (long long)g.OH, (long long)g.OW);
}

void check_pools(cuhost *t) {
    const pool_case cases[] = {
        {3, 8, 8, 2, 2, 2, 2, 0, 0},  {2, 7, 7, 2, 2, 2, 2, 0, 0},  {2, 5, 6, 3, 3, 2, 2, 1, 1},
        {2, 9, 7, 3, 3, 1, 1, 1, 1},  {1, 6, 6, 3, 3, 3, 3, 0, 0},  {2, 5, 5, 2, 2, 1, 1, 1, 1},
        {2, 4, 7, 3, 2, 1, 2, 1, 0},  {1, 11, 10, 5, 4, 2, 3, 2, 2}, {1, 1, 1, 1, 1, 1, 1, 0, 0},
        {2, 13, 13, 3, 3, 2, 2, 1, 1},
    };
    for (const pool_case &pc : cases) {
        nb__pool2d_geom g = pool_geom(pc);
        check_maxpool<float>(t, g);
        check_maxpool<double>(t, g);
        for (int cip = 0; cip < 2; cip++) {
            check_avgpool<float>(t, g, cip != 0);
            check_avgpool<double>(t, g, cip != 0);
        }
    }
    const int64_t ad[][4] = {{7, 5, 3, 2}, {5, 5, 7, 3}, {6, 6, 1, 1}, {13, 9, 4, 5},
                             {8, 8, 8, 8}, {1, 3, 2, 2}, {10, 7, 3, 7}};
    for (const auto &s : ad) {
        nb__pool2d_geom g = {2, s[0], s[1], s[2], s[3], 0, 0, 0, 0, 0, 0};
        check_adaptive<float>(t, g);
        check_adaptive<double>(t, g);
    }
    // the adaptive window inversion against a brute-force search
    for (int64_t in = 1; in <= 12; in++)
        for (int64_t out = 1; out <= 12; out++)
            for (int64_t i = 0; i < in; i++) {
                int64_t lo, hi, blo = out, bhi = 0;
                ad_windows_of(i, in, out, &lo, &hi);
                for (int64_t o = 0; o < out; o++)
                    if (ad_start(o, in, out) <= i && i < ad_end(o, in, out)) {
                        if (o < blo) blo = o;
                        bhi = o + 1;
                    }
                CUHOST_CHECK(t, lo == blo && hi == bhi,
                             "ad_windows_of(%lld, %lld, %lld) = [%lld, %lld), want [%lld, %lld)",
                             (long long)i, (long long)in, (long long)out, (long long)lo,
                             (long long)hi, (long long)blo, (long long)bhi);
            }
}

// ---- convolution --------------------------------------------------------------------------------
struct conv_case {
    int64_t N, C, H, W, O, KH, KW, sh, sw, ph, pw, dh, dw, groups;
};

nb__conv2d_geom conv_geom(const conv_case &k) {
    nb__conv2d_geom g = {k.N, k.C, k.H, k.W, k.O, k.KH, k.KW, 0, 0,
                         k.sh, k.sw, k.ph, k.pw, k.dh, k.dw, k.groups};
    g.OH = (k.H + 2 * k.ph - (k.dh * (k.KH - 1) + 1)) / k.sh + 1; // nn/conv.c's rule
    g.OW = (k.W + 2 * k.pw - (k.dw * (k.KW - 1) + 1)) / k.sw + 1;
    return g;
}

// nb_block_sum (cuda/kcommon.cuh) lane by lane: butterflies within each warp, then warp 0
// over the warp sums.
double emu_block_sum(const double *v, int nthreads) {
    int nwarps = (nthreads + 31) / 32;
    double sums[32] = {0};
    for (int w = 0; w < nwarps; w++) {
        double a[32], b[32];
        for (int l = 0; l < 32; l++) a[l] = w * 32 + l < nthreads ? v[w * 32 + l] : 0.0;
        for (int o = 16; o > 0; o >>= 1) {
            for (int l = 0; l < 32; l++) b[l] = a[l] + a[l ^ o];
            memcpy(a, b, sizeof a);
        }
        sums[w] = a[0];
    }
    double a[32], b[32];
    for (int l = 0; l < 32; l++) a[l] = l < nwarps ? sums[l] : 0.0;
    for (int o = 16; o > 0; o >>= 1) {
        for (int l = 0; l < 32; l++) b[l] = a[l] + a[l ^ o];
        memcpy(a, b, sizeof a);
    }
    return a[0];
}

// Row-major C (m x n) = op(A) op(B) in double, as cuBLAS would compute it in float.
void host_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda,
               const float *B, int64_t ldb, bool acc, float *C, int64_t ldc) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = acc ? C[i * ldc + j] : 0.0;
            for (int64_t p = 0; p < k; p++)
                s += (double)(ta ? A[p * lda + i] : A[i * lda + p]) *
                     (double)(tb ? B[j * ldb + p] : B[p * ldb + j]);
            C[i * ldc + j] = (float)s;
        }
}

template <typename T> bool close(const std::vector<T> &a, const std::vector<T> &b, double rel) {
    if (a.size() != b.size()) return false;
    double scale = 1e-30;
    for (size_t i = 0; i < a.size(); i++) scale = fmax(scale, fabs((double)b[i]));
    for (size_t i = 0; i < a.size(); i++)
        if (!(fabs((double)a[i] - (double)b[i]) <= rel * scale)) return false;
    return true;
}

struct f32_results {
    std::vector<float> y, gx, gw, gb;
};

// The no-cuDNN f32 path of k_conv.cu emulated: im2col_k + GEMM (+ bias_add_k); the backward's
// GEMM + col2im_k, im2col_k + GEMM over images, bias_grad_k through the block tree.
f32_results emu_conv_f32(const nb__conv2d_geom &g, const float *x, const float *w,
                         const float *b, const float *gy) {
    int64_t L = g.OH * g.OW, Og = g.O / g.groups, Kg = g.C / g.groups * g.KH * g.KW;
    int64_t ncol = g.C * g.KH * g.KW * L, CHW = g.C * g.H * g.W;
    f32_results r;
    r.y.assign((size_t)(g.N * g.O * L), 0.f);
    r.gx.assign((size_t)(g.N * CHW), 0.f);
    r.gw.assign((size_t)(g.O * Kg), 0.f);
    r.gb.assign((size_t)g.O, 0.f);
    std::vector<float> col((size_t)ncol), dcol((size_t)ncol);
    for (int64_t n = 0; n < g.N; n++) {
        const float *xn = x + n * CHW;
        for (int64_t i = 0; i < ncol; i++) col[(size_t)i] = im2col_at<float>(&g, xn, i / L, i % L);
        for (int64_t gi = 0; gi < g.groups; gi++) {
            host_gemm(false, false, Og, L, Kg, w + gi * Og * Kg, Kg, col.data() + gi * Kg * L, L,
                      false, r.y.data() + (n * g.O + gi * Og) * L, L);
            host_gemm(false, true, Og, Kg, L, gy + (n * g.O + gi * Og) * L, L,
                      col.data() + gi * Kg * L, L, n > 0, r.gw.data() + gi * Og * Kg, Kg);
            host_gemm(true, false, Kg, L, Og, w + gi * Og * Kg, Kg, gy + (n * g.O + gi * Og) * L,
                      L, false, dcol.data() + gi * Kg * L, L);
        }
        for (int64_t i = 0; i < CHW; i++) {
            int64_t c = i / (g.H * g.W), rr = i % (g.H * g.W);
            r.gx[(size_t)(n * CHW + i)] = col2im_at<float>(&g, dcol.data(), c, rr / g.W, rr % g.W);
        }
    }
    for (int64_t i = 0; i < g.N * g.O * L; i++) r.y[(size_t)i] += b[(i / L) % g.O];
    double part[256];
    for (int64_t o = 0; o < g.O; o++) {
        for (int th = 0; th < 256; th++) part[th] = bias_grad_part<float>(&g, gy, o, th, 256);
        r.gb[(size_t)o] = (float)emu_block_sum(part, 256);
    }
    return r;
}

void check_conv_case(cuhost *t, const nb__conv2d_geom &g) {
    const nb__kernels *cpu = cuhost_cpu();
    int64_t nx = g.N * g.C * g.H * g.W, nw = g.O * (g.C / g.groups) * g.KH * g.KW;
    int64_t ny = g.N * g.O * g.OH * g.OW;
    char what[160];
    snprintf(what, sizeof what, "N%lld C%lld %lldx%lld O%lld k%lldx%lld s%lld,%lld p%lld,%lld "
             "d%lld,%lld g%lld", (long long)g.N, (long long)g.C, (long long)g.H, (long long)g.W,
             (long long)g.O, (long long)g.KH, (long long)g.KW, (long long)g.sh, (long long)g.sw,
             (long long)g.ph, (long long)g.pw, (long long)g.dh, (long long)g.dw,
             (long long)g.groups);
    // f32: the im2col + GEMM path
    std::vector<float> x((size_t)nx), w((size_t)nw), b((size_t)g.O), gy((size_t)ny);
    fill(x, false), fill(w, false), fill(b, false), fill(gy, false);
    std::vector<float> y((size_t)ny), gx((size_t)nx), gw((size_t)nw), gb((size_t)g.O);
    nb__conv2d_args fa = {g, NB_F32, x.data(), w.data(), b.data(), y.data()};
    nb__conv2d_backward_args ba = {g, NB_F32, x.data(), w.data(), gy.data(),
                                   gx.data(), gw.data(), gb.data()};
    CUHOST_CHECK(t, cpu->conv2d(&fa) == NB_OK && cpu->conv2d_backward(&ba) == NB_OK,
                 "cpu conv2d f32 %s", what);
    f32_results e = emu_conv_f32(g, x.data(), w.data(), b.data(), gy.data());
    CUHOST_CHECK(t, close(e.y, y, 1e-5), "conv2d f32 y %s", what);
    CUHOST_CHECK(t, close(e.gx, gx, 1e-5), "conv2d f32 gx %s", what);
    CUHOST_CHECK(t, close(e.gw, gw, 1e-5), "conv2d f32 gw %s", what);
    CUHOST_CHECK(t, close(e.gb, gb, 1e-6), "conv2d f32 gb %s", what);
    {   // f32 through the direct kernels (the no-cuDNN path of depthwise convolutions)
        int64_t L = g.OH * g.OW, HW = g.H * g.W, Cg = g.C / g.groups, KK = g.KH * g.KW;
        std::vector<float> yd((size_t)ny), gxd((size_t)nx), gwd((size_t)nw);
        for (int64_t i = 0; i < ny; i++) { // conv_direct_k<float> + bias_add_k
            int64_t l = i % L, tt = i / L, o = tt % g.O, n = tt / g.O, oh = l / g.OW;
            yd[(size_t)i] = conv_direct_at<float>(&g, x.data(), w.data(), n, o, oh,
                                                  l - oh * g.OW) + b[(size_t)o];
        }
        for (int64_t i = 0; i < nx; i++) { // conv_gx_direct_k<float>
            int64_t r = i % HW, tt = i / HW, c = tt % g.C, n = tt / g.C, h = r / g.W;
            gxd[(size_t)i] = conv_gx_direct_at<float>(&g, w.data(), gy.data(), n, c, h,
                                                      r - h * g.W);
        }
        for (int64_t i = 0; i < nw; i++) { // conv_gw_direct_k<float>
            int64_t k = i % KK, tt = i / KK, c = tt % Cg, o = tt / Cg;
            gwd[(size_t)i] = conv_gw_direct_at<float>(&g, x.data(), gy.data(), o, c, k / g.KW,
                                                      k % g.KW);
        }
        CUHOST_CHECK(t, close(yd, y, 1e-5), "conv2d f32 direct y %s", what);
        CUHOST_CHECK(t, close(gxd, gx, 1e-5), "conv2d f32 direct gx %s", what);
        CUHOST_CHECK(t, close(gwd, gw, 1e-5), "conv2d f32 direct gw %s", what);
    }

    // f64: the direct kernels
    std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()), bd(b.begin(), b.end()),
        gyd(gy.begin(), gy.end());
    std::vector<double> yd((size_t)ny), gxd((size_t)nx), gwd((size_t)nw), gbd((size_t)g.O);
    nb__conv2d_args fd = {g, NB_F64, xd.data(), wd.data(), bd.data(), yd.data()};
    nb__conv2d_backward_args bdd = {g, NB_F64, xd.data(), wd.data(), gyd.data(),
                                    gxd.data(), gwd.data(), gbd.data()};
    CUHOST_CHECK(t, cpu->conv2d(&fd) == NB_OK && cpu->conv2d_backward(&bdd) == NB_OK,
                 "cpu conv2d f64 %s", what);
    std::vector<double> ye((size_t)ny), gxe((size_t)nx), gwe((size_t)nw), gbe((size_t)g.O);
    int64_t L = g.OH * g.OW, HW = g.H * g.W, Cg = g.C / g.groups, KK = g.KH * g.KW;
    for (int64_t i = 0; i < ny; i++) { // conv_direct_k
        int64_t l = i % L, tt = i / L, o = tt % g.O, n = tt / g.O, oh = l / g.OW;
        ye[(size_t)i] = conv_direct_at<double>(&g, xd.data(), wd.data(), n, o, oh,
                                               l - oh * g.OW) + bd[(size_t)o];
    }
    for (int64_t i = 0; i < nx; i++) { // conv_gx_direct_k
        int64_t r = i % HW, tt = i / HW, c = tt % g.C, n = tt / g.C, h = r / g.W;
        gxe[(size_t)i] = conv_gx_direct_at<double>(&g, wd.data(), gyd.data(), n, c, h,
                                                   r - h * g.W);
    }
    for (int64_t i = 0; i < nw; i++) { // conv_gw_direct_k
        int64_t k = i % KK, tt = i / KK, c = tt % Cg, o = tt / Cg;
        gwe[(size_t)i] = conv_gw_direct_at<double>(&g, xd.data(), gyd.data(), o, c, k / g.KW,
                                                   k % g.KW);
    }
    double part[256];
    for (int64_t o = 0; o < g.O; o++) { // bias_grad_k<double>
        for (int th = 0; th < 256; th++) part[th] = bias_grad_part<double>(&g, gyd.data(), o, th, 256);
        gbe[(size_t)o] = emu_block_sum(part, 256);
    }
    CUHOST_CHECK(t, close(ye, yd, 1e-12), "conv2d f64 y %s", what);
    CUHOST_CHECK(t, close(gxe, gxd, 1e-12), "conv2d f64 gx %s", what);
    CUHOST_CHECK(t, close(gwe, gwd, 1e-12), "conv2d f64 gw %s", what);
    CUHOST_CHECK(t, close(gbe, gbd, 1e-12), "conv2d f64 gb %s", what);

    // bf16: widen, the f32 path, round once (y, gx); gw, gb stay f32
    std::vector<uint16_t> xb((size_t)nx), wb((size_t)nw), gyb((size_t)ny), yb((size_t)ny),
        gxb((size_t)nx);
    std::vector<float> xw((size_t)nx), ww((size_t)nw), gyw((size_t)ny);
    for (int64_t i = 0; i < nx; i++)
        xw[(size_t)i] = nb__kh_f32_from_bf16(xb[(size_t)i] = nb__kh_bf16_from_f32(x[(size_t)i]));
    for (int64_t i = 0; i < nw; i++)
        ww[(size_t)i] = nb__kh_f32_from_bf16(wb[(size_t)i] = nb__kh_bf16_from_f32(w[(size_t)i]));
    for (int64_t i = 0; i < ny; i++)
        gyw[(size_t)i] = nb__kh_f32_from_bf16(gyb[(size_t)i] = nb__kh_bf16_from_f32(gy[(size_t)i]));
    std::vector<float> gwb((size_t)nw), gbb((size_t)g.O);
    nb__conv2d_args fb = {g, NB_BF16, xb.data(), wb.data(), b.data(), yb.data()};
    nb__conv2d_backward_args bb = {g, NB_BF16, xb.data(), wb.data(), gyb.data(),
                                   gxb.data(), gwb.data(), gbb.data()};
    CUHOST_CHECK(t, cpu->conv2d(&fb) == NB_OK && cpu->conv2d_backward(&bb) == NB_OK,
                 "cpu conv2d bf16 %s", what);
    f32_results eb = emu_conv_f32(g, xw.data(), ww.data(), b.data(), gyw.data());
    std::vector<float> yb_cpu((size_t)ny), yb_emu((size_t)ny), gxb_cpu((size_t)nx),
        gxb_emu((size_t)nx);
    for (int64_t i = 0; i < ny; i++) { // bias_round_bf16_k (the bias is in eb.y already)
        yb_cpu[(size_t)i] = nb__kh_f32_from_bf16(yb[(size_t)i]);
        yb_emu[(size_t)i] = nb__kh_f32_from_bf16(nb__kh_bf16_from_f32(eb.y[(size_t)i]));
    }
    for (int64_t i = 0; i < nx; i++) { // narrow_bf16_k
        gxb_cpu[(size_t)i] = nb__kh_f32_from_bf16(gxb[(size_t)i]);
        gxb_emu[(size_t)i] = nb__kh_f32_from_bf16(nb__kh_bf16_from_f32(eb.gx[(size_t)i]));
    }
    CUHOST_CHECK(t, close(yb_emu, yb_cpu, 1.0 / 128), "conv2d bf16 y %s", what);
    CUHOST_CHECK(t, close(gxb_emu, gxb_cpu, 1.0 / 128), "conv2d bf16 gx %s", what);
    CUHOST_CHECK(t, close(eb.gw, gwb, 1e-5), "conv2d bf16 gw %s", what);
    CUHOST_CHECK(t, close(eb.gb, gbb, 1e-6), "conv2d bf16 gb %s", what);

#if NB_CUHOST_CUDNN
    static const nb_dtype cudnn_dts[2] = {NB_F32, NB_BF16};
    for (int di = 0; di < 2; di++) {
        int64_t out[4] = {0, 0, 0, 0};
        nb_status st = nb__cudnn_out_dims(&g, cudnn_dts[di], out);
        CUHOST_CHECK(t, st == NB_OK && out[0] == g.N && out[1] == g.O && out[2] == g.OH &&
                            out[3] == g.OW,
                     "cuDNN output dims %lld %lld %lld %lld (status %d, dtype %d), the CPU's "
                     "rule says %lld %lld %lld %lld: %s", (long long)out[0], (long long)out[1],
                     (long long)out[2], (long long)out[3], (int)st, (int)cudnn_dts[di],
                     (long long)g.N, (long long)g.O, (long long)g.OH, (long long)g.OW, what);
        nb__cudnn_conv_desc d;
        st = nb__cudnn_desc_make(&d, &g, cudnn_dts[di]);
        CUHOST_CHECK(t, st == NB_OK, "cuDNN descriptors (status %d, dtype %d): %s", (int)st,
                     (int)cudnn_dts[di], what);
        if (st == NB_OK) nb__cudnn_desc_free(&d);
    }
#endif
}

void check_conv(cuhost *t) {
    const conv_case cases[] = {
        // N  C  H  W  O KH KW sh sw ph pw dh dw groups
        {2, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1},  // the common 3x3 same conv
        {2, 4, 7, 9, 6, 3, 3, 2, 2, 1, 1, 1, 1, 1},  // stride 2
        {1, 4, 6, 6, 4, 1, 1, 1, 1, 0, 0, 1, 1, 1},  // pointwise
        {3, 6, 7, 7, 6, 3, 3, 1, 1, 1, 1, 1, 1, 6},  // depthwise
        {2, 4, 9, 8, 6, 3, 2, 1, 2, 2, 1, 2, 1, 2},  // groups, dilation, asymmetric
        {1, 3, 11, 11, 5, 5, 5, 3, 3, 2, 2, 1, 1, 1}, // stride 3, 5x5
        {2, 2, 5, 5, 3, 2, 2, 2, 2, 0, 0, 1, 1, 1},  // windows that do not overlap
        {1, 2, 4, 4, 2, 4, 4, 1, 1, 0, 0, 1, 1, 1},  // 1x1 output
        {2, 2, 6, 5, 4, 3, 3, 1, 2, 0, 2, 2, 1, 2},  // dilation 2, padding past the taps
        {2, 16, 6, 6, 32, 3, 3, 2, 2, 1, 1, 1, 1, 16}, // 16 groups (direct without cuDNN)
    };
    for (const conv_case &k : cases) check_conv_case(t, conv_geom(k));
#if NB_CUHOST_CUDNN
    // the output-size rule over a sweep (descriptors only)
    for (int64_t H = 1; H <= 9; H++)
        for (int64_t K = 1; K <= 4; K++)
            for (int64_t s = 1; s <= 3; s++)
                for (int64_t p = 0; p <= 2; p++)
                    for (int64_t dl = 1; dl <= 2; dl++) {
                        conv_case k = {1, 2, H, H + 1, 2, K, K, s, s, p, p, dl, dl, 1};
                        nb__conv2d_geom g = conv_geom(k);
                        if (g.OH < 1 || g.OW < 1 || H + 2 * p < dl * (K - 1) + 1) continue;
                        int64_t out[4] = {0, 0, 0, 0};
                        nb_status st = nb__cudnn_out_dims(&g, NB_F32, out);
                        CUHOST_CHECK(t, st == NB_OK && out[2] == g.OH && out[3] == g.OW,
                                     "cuDNN output %lldx%lld, the CPU's rule %lldx%lld (H %lld "
                                     "k %lld s %lld p %lld d %lld)", (long long)out[2],
                                     (long long)out[3], (long long)g.OH, (long long)g.OW,
                                     (long long)H, (long long)K, (long long)s, (long long)p,
                                     (long long)dl);
                    }
#endif
}

} // namespace

void cuhost_conv(cuhost *t) {
    const nb__kernels *cpu = cuhost_cpu();
    CUHOST_CHECK(t, cpu && cpu->conv2d && cpu->maxpool2d, "CPU conv kernels missing");
    if (!cpu || !cpu->conv2d || !cpu->maxpool2d) return;
    check_pools(t);
    check_conv(t);
}
