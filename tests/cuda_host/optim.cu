// tests/cuda_host/optim.cu - host checks of the optim family's __host__ __device__ math
// (cuda/k_optim.cuh, used by cuda/k_optim.cu), compiled by nvcc and compared with the CPU
// backend (cpu/optim_kernels.c) on the same args structs. No GPU needed.
//
// Every check runs the CPU kernel on one copy of the buffers and the host emulation of the
// CUDA kernel (the per-element functions over every element; the reductions in the GPU's
// order: per-(chunk, lane) partials, chunk totals, the chunk sum; per-thread maxima of a
// capped grid-stride grid and the block tree) on another, and wants the same bytes.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cuda/k_optim.cuh"
#include "cuhost.h"
#include "tensor/backend_table.h"

namespace {

// Deterministic test data: an LCG, values in [-scale, scale), some exact zeros.
struct lcg {
    uint64_t s;
    double next() {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        return (double)(s >> 11) * (1.0 / 9007199254740992.0);
    }
};

template <typename T> std::vector<T> data(int64_t n, uint64_t seed, double lo, double hi) {
    lcg r{seed};
    std::vector<T> v((size_t)n);
    for (int64_t i = 0; i < n; i++) v[(size_t)i] = i % 11 == 5 ? (T)0 : (T)(lo + (hi - lo) * r.next());
    return v;
}

// Same bits, or both NaN.
template <typename T> bool same(const std::vector<T> &a, const std::vector<T> &b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); i++) {
        if (a[i] != a[i] && b[i] != b[i]) continue;
        if (memcmp(&a[i], &b[i], sizeof(T)) != 0) return false;
    }
    return true;
}

// Gradients with an inf, a NaN and a -0 (n >= 8): the NaN paths (amsgrad's sticky max,
// NaN through sqrt) must match too.
template <typename T> std::vector<T> grad(int64_t n, uint64_t seed) {
    auto g = data<T>(n, seed, -0.5, 0.5);
    if (n >= 8) g[2] = (T)INFINITY, g[4] = (T)NAN, g[6] = (T)-0.0;
    return g;
}

template <typename T> nb_dtype dtype_of();
template <> nb_dtype dtype_of<float>() { return NB_F32; }
template <> nb_dtype dtype_of<double>() { return NB_F64; }

const int64_t kSizes[] = {1, 7, 33, 1000, 8197};

// ---- SGD ----------------------------------------------------------------------------------
template <typename T> void check_sgd(cuhost *t) {
    for (int64_t n : kSizes)
        for (int cfg = 0; cfg < 32; cfg++) {
            bool mom = cfg & 1, init = cfg & 2, nest = cfg & 4, wd = cfg & 8, maxi = cfg & 16;
            auto p0 = data<T>(n, 1 + (uint64_t)cfg, -1, 1), g = grad<T>(n, 99);
            auto b0 = data<T>(n, 7, -0.1, 0.1);
            auto p1 = p0, p2 = p0, b1 = b0, b2 = b0;
            nb__sgd_step_args a = {};
            a.dtype = dtype_of<T>();
            a.n = n;
            a.grad = g.data();
            a.lr = 0.01;
            a.momentum = mom ? 0.9 : 0;
            a.dampening = mom && !nest ? 0.1 : 0;
            a.weight_decay = wd ? 0.003 : 0;
            a.nesterov = mom && nest;
            a.maximize = maxi;
            a.init_buf = init;
            a.param = p1.data();
            a.buf = mom ? b1.data() : NULL;
            nb_status st = cuhost_cpu()->sgd_step(&a);
            a.param = p2.data();
            a.buf = mom ? b2.data() : NULL;
            nbo::sgd_c<T> c = nbo::sgd_consts<T>(&a);
            for (int64_t i = 0; i < n; i++) nbo::sgd_elem(c, p2.data(), g.data(), b2.data(), i);
            CUHOST_CHECK(t, st == NB_OK && same(p1, p2) && same(b1, b2),
                         "sgd dtype %d n %lld cfg %d", (int)a.dtype, (long long)n, cfg);
        }
}

// ---- Adam / AdamW -------------------------------------------------------------------------
template <typename T> void check_adam(cuhost *t) {
    for (int64_t n : kSizes)
        for (int cfg = 0; cfg < 32; cfg++) {
            bool dec = cfg & 1, ams = cfg & 2, wd = cfg & 4, maxi = cfg & 8;
            double step = cfg & 16 ? 7 : 1;
            auto p0 = data<T>(n, 3 + (uint64_t)cfg, -1, 1), g = grad<T>(n, 5);
            auto m0 = data<T>(n, 11, -0.2, 0.2), v0 = data<T>(n, 13, 0, 0.05);
            auto x0 = data<T>(n, 17, 0, 0.06);
            auto p1 = p0, p2 = p0, m1 = m0, m2 = m0, v1 = v0, v2 = v0, x1 = x0, x2 = x0;
            nb__adam_step_args a = {};
            a.dtype = dtype_of<T>();
            a.n = n;
            a.grad = g.data();
            a.lr = 1e-3;
            a.beta1 = 0.9;
            a.beta2 = 0.999;
            a.eps = 1e-8;
            a.weight_decay = wd ? 0.01 : 0;
            a.step_size = a.lr / (1 - pow(a.beta1, step));
            a.bc2_sqrt = sqrt(1 - pow(a.beta2, step));
            a.decoupled = dec;
            a.maximize = maxi;
            a.param = p1.data(), a.m = m1.data(), a.v = v1.data(), a.vmax = ams ? x1.data() : NULL;
            nb_status st = cuhost_cpu()->adam_step(&a);
            a.param = p2.data(), a.m = m2.data(), a.v = v2.data(), a.vmax = ams ? x2.data() : NULL;
            nbo::adam_c<T> c = nbo::adam_consts<T>(&a);
            for (int64_t i = 0; i < n; i++)
                nbo::adam_elem(c, p2.data(), g.data(), m2.data(), v2.data(), x2.data(), i);
            CUHOST_CHECK(t, st == NB_OK && same(p1, p2) && same(m1, m2) && same(v1, v2) &&
                                same(x1, x2),
                         "adam dtype %d n %lld cfg %d", (int)a.dtype, (long long)n, cfg);
        }
}

// ---- RMSprop ------------------------------------------------------------------------------
template <typename T> void check_rmsprop(cuhost *t) {
    for (int64_t n : kSizes)
        for (int cfg = 0; cfg < 16; cfg++) {
            bool cen = cfg & 1, mom = cfg & 2, wd = cfg & 4, maxi = cfg & 8;
            auto p0 = data<T>(n, 21 + (uint64_t)cfg, -1, 1), g = grad<T>(n, 23);
            auto s0 = data<T>(n, 29, 0.01, 0.05), b0 = data<T>(n, 31, -0.1, 0.1);
            auto a0 = data<T>(n, 37, -0.01, 0.01);
            auto p1 = p0, p2 = p0, s1 = s0, s2 = s0, b1 = b0, b2 = b0, ga1 = a0, ga2 = a0;
            nb__rmsprop_step_args a = {};
            a.dtype = dtype_of<T>();
            a.n = n;
            a.grad = g.data();
            a.lr = 0.01, a.alpha = 0.99, a.eps = 1e-8;
            a.weight_decay = wd ? 0.02 : 0;
            a.momentum = mom ? 0.9 : 0;
            a.maximize = maxi;
            a.param = p1.data(), a.sq = s1.data();
            a.buf = mom ? b1.data() : NULL, a.gavg = cen ? ga1.data() : NULL;
            nb_status st = cuhost_cpu()->rmsprop_step(&a);
            a.param = p2.data(), a.sq = s2.data();
            a.buf = mom ? b2.data() : NULL, a.gavg = cen ? ga2.data() : NULL;
            nbo::rmsprop_c<T> c = nbo::rmsprop_consts<T>(&a);
            for (int64_t i = 0; i < n; i++)
                nbo::rmsprop_elem(c, p2.data(), g.data(), s2.data(), b2.data(), ga2.data(), i);
            CUHOST_CHECK(t, st == NB_OK && same(p1, p2) && same(s1, s2) && same(b1, b2) &&
                                same(ga1, ga2),
                         "rmsprop dtype %d n %lld cfg %d", (int)a.dtype, (long long)n, cfg);
        }
}

// ---- Adagrad ------------------------------------------------------------------------------
template <typename T> void check_adagrad(cuhost *t) {
    for (int64_t n : kSizes)
        for (int cfg = 0; cfg < 4; cfg++) {
            auto p0 = data<T>(n, 41 + (uint64_t)cfg, -1, 1), g = grad<T>(n, 43);
            auto s0 = data<T>(n, 47, 0, 0.3);
            auto p1 = p0, p2 = p0, s1 = s0, s2 = s0;
            nb__adagrad_step_args a = {};
            a.dtype = dtype_of<T>();
            a.n = n;
            a.grad = g.data();
            a.clr = 0.01 / (1 + 4 * 0.001), a.eps = 1e-10;
            a.weight_decay = cfg & 1 ? 0.01 : 0;
            a.maximize = cfg & 2;
            a.param = p1.data(), a.sum = s1.data();
            nb_status st = cuhost_cpu()->adagrad_step(&a);
            a.param = p2.data(), a.sum = s2.data();
            nbo::adagrad_c<T> c = nbo::adagrad_consts<T>(&a);
            for (int64_t i = 0; i < n; i++) nbo::adagrad_elem(c, p2.data(), g.data(), s2.data(), i);
            CUHOST_CHECK(t, st == NB_OK && same(p1, p2) && same(s1, s2),
                         "adagrad dtype %d n %lld cfg %d", (int)a.dtype, (long long)n, cfg);
        }
}

// ---- buffers of any float dtype -------------------------------------------------------------
// n elements of dt as bytes, values in [lo, hi) (half types rounded like the CPU).
std::vector<unsigned char> bytes_of(nb_dtype dt, int64_t n, uint64_t seed, double lo, double hi) {
    auto v = data<double>(n, seed, lo, hi);
    size_t es = dt == NB_F64 ? 8 : dt == NB_F32 ? 4 : 2;
    std::vector<unsigned char> b((size_t)n * es);
    for (int64_t i = 0; i < n; i++) {
        unsigned char *p = b.data() + (size_t)i * es;
        float f = (float)v[(size_t)i];
        uint16_t h;
        switch (dt) {
        case NB_F64: memcpy(p, &v[(size_t)i], 8); break;
        case NB_F32: memcpy(p, &f, 4); break;
        case NB_F16: h = nb__kh_f16_from_f32(f), memcpy(p, &h, 2); break;
        default: h = nb__kh_bf16_from_f32(f), memcpy(p, &h, 2); break;
        }
    }
    return b;
}
// Element i of buffer b set to the double x (rounded to dt).
void put(std::vector<unsigned char> &b, nb_dtype dt, int64_t i, double x) {
    size_t es = dt == NB_F64 ? 8 : dt == NB_F32 ? 4 : 2;
    unsigned char *p = b.data() + (size_t)i * es;
    float f = (float)x;
    uint16_t h;
    switch (dt) {
    case NB_F64: memcpy(p, &x, 8); break;
    case NB_F32: memcpy(p, &f, 4); break;
    case NB_F16: h = nb__kh_f16_from_f32(f), memcpy(p, &h, 2); break;
    default: h = nb__kh_bf16_from_f32(f), memcpy(p, &h, 2); break;
    }
}

const nb_dtype kFloats[] = {NB_F32, NB_F64, NB_F16, NB_BF16};

// ---- clip_scale, clip_clamp -----------------------------------------------------------------
void check_inplace(cuhost *t) {
    for (nb_dtype dt : kFloats)
        for (int64_t n : kSizes)
            for (int clamp = 0; clamp < 2; clamp++) {
                auto x0 = bytes_of(dt, n, 51 + (uint64_t)n, -3, 3);
                if (n > 3) put(x0, dt, 3, INFINITY), put(x0, dt, 2, -INFINITY);
                auto x1 = x0, x2 = x0;
                nb__clip_inplace_args a = {};
                a.dtype = dt, a.n = n, a.s = 0.3183098861837907, a.lo = -1.1, a.hi = 0.7;
                a.x = x1.data();
                nb_status st = clamp ? cuhost_cpu()->clip_clamp(&a) : cuhost_cpu()->clip_scale(&a);
                for (int64_t i = 0; i < n; i++) {
                    if (clamp) nbo::clamp_elem(x2.data(), dt, i, a.lo, a.hi);
                    else nbo::scale_elem(x2.data(), dt, i, a.s);
                }
                CUHOST_CHECK(t, st == NB_OK && x1 == x2, "clip_%s dtype %d n %lld",
                             clamp ? "clamp" : "scale", (int)dt, (long long)n);
            }
}

// ---- amp_unscale ----------------------------------------------------------------------------
void check_unscale(cuhost *t) {
    for (nb_dtype dt : kFloats)
        for (int64_t n : kSizes)
            for (int bad = 0; bad < 3; bad++) {
                bool half = dt == NB_F16 || dt == NB_BF16;
                for (int to32 = 0; to32 < (half ? 2 : 1); to32++) {
                    nb_dtype ot = to32 ? NB_F32 : dt;
                    auto x = bytes_of(dt, n, 61 + (uint64_t)n, -7e3, 7e3);
                    if (bad == 1) put(x, dt, n / 2, INFINITY);
                    if (bad == 2) put(x, dt, n - 1, NAN);
                    size_t oes = ot == NB_F64 ? 8 : ot == NB_F32 ? 4 : 2;
                    std::vector<unsigned char> o1((size_t)n * oes, 0), o2 = o1;
                    double f1 = 0, f2 = 0;
                    nb__amp_unscale_args a = {};
                    a.dtype = dt, a.out_dtype = ot, a.n = n, a.x = x.data();
                    a.inv_scale = 1.0 / 65536.0 * 3;
                    a.out = o1.data(), a.found_inf = &f1;
                    nb_status st = cuhost_cpu()->amp_unscale(&a);
                    bool any = false;
                    for (int64_t i = 0; i < n; i++)
                        any |= nbo::unscale_elem(x.data(), o2.data(), dt, ot, i,
                                                 (float)a.inv_scale);
                    if (any) f2 = 1;
                    CUHOST_CHECK(t, st == NB_OK && o1 == o2 && f1 == f2 && f2 == (bad ? 1 : 0),
                                 "amp_unscale dtype %d -> %d n %lld bad %d", (int)dt, (int)ot,
                                 (long long)n, bad);
                }
            }
}

// ---- clip_abs_pow_sum / clip_abs_max in the kernels' order ----------------------------------
// k_optim.cu: pow_lanes_kernel (one value per (chunk, lane)), then pow_finish_kernel.
double emulate_pow_sum(nb_dtype dt, const void *x, int64_t n, double p) {
    int64_t nch = (n + nbo::kChunk - 1) / nbo::kChunk, nlanes = nch * nbo::kLanes;
    std::vector<double> lanes((size_t)nlanes);
    for (int64_t tt = nlanes - 1; tt >= 0; tt--) { // any thread order: independent
        int64_t chunk = tt / nbo::kLanes, s = chunk * nbo::kChunk;
        int64_t l = n - s < nbo::kChunk ? n - s : nbo::kChunk;
        lanes[(size_t)tt] = nbo::lane_pow_sum(x, dt, s, l, (int)(tt % nbo::kLanes), p);
    }
    for (int64_t c = 0; c < nch; c++) lanes[(size_t)(c * nbo::kLanes)] = nbo::chunk_total(&lanes[(size_t)(c * nbo::kLanes)]);
    double tot = 0;
    for (int64_t c = 0; c < nch; c++) tot = nbo::add(tot, lanes[(size_t)(c * nbo::kLanes)]);
    return tot;
}
// block_max_nan over kThreads values (the shared-memory tree of k_optim.cu).
double tree_max(std::vector<double> sh) {
    for (size_t w = sh.size() / 2; w > 0; w >>= 1)
        for (size_t i = 0; i < w; i++) sh[i] = nbo::max_nan(sh[i], sh[i + w]);
    return sh[0];
}
// max_partial_kernel on a grid of nb blocks of 256 threads, then max_finish_kernel.
double emulate_abs_max(nb_dtype dt, const void *x, int64_t n, int64_t nb) {
    const int64_t th = 256;
    std::vector<double> part((size_t)nb);
    for (int64_t b = 0; b < nb; b++) {
        std::vector<double> sh((size_t)th);
        for (int64_t tx = 0; tx < th; tx++) {
            double m = 0;
            for (int64_t i = b * th + tx; i < n; i += nb * th)
                m = nbo::max_nan(m, fabs(nbo::load_d(x, dt, i)));
            sh[(size_t)tx] = m;
        }
        part[(size_t)b] = tree_max(sh);
    }
    std::vector<double> sh((size_t)th);
    for (int64_t tx = 0; tx < th; tx++) {
        double m = 0;
        for (int64_t i = tx; i < nb; i += th) m = nbo::max_nan(m, part[(size_t)i]);
        sh[(size_t)tx] = m;
    }
    return tree_max(sh);
}

bool same_double(double a, double b) {
    return (a != a && b != b) || memcmp(&a, &b, sizeof a) == 0;
}

void check_reduce(cuhost *t) {
    const int64_t sizes[] = {1, 5, 16384, 16385, 40007};
    const double ps[] = {2, 1, 3, 0.5};
    for (nb_dtype dt : kFloats)
        for (int64_t n : sizes) {
            auto x = bytes_of(dt, n, 71 + (uint64_t)n, -2, 2);
            for (double p : ps) {
                double r = -1;
                nb__clip_reduce_args a = {};
                a.dtype = dt, a.n = n, a.x = x.data(), a.p = p, a.result = &r;
                nb_status st = cuhost_cpu()->clip_abs_pow_sum(&a);
                double e = emulate_pow_sum(dt, x.data(), n, p);
                CUHOST_CHECK(t, st == NB_OK && same_double(r, e),
                             "clip_abs_pow_sum dtype %d n %lld p %g: cpu %.17g emulated %.17g",
                             (int)dt, (long long)n, p, r, e);
            }
            // max: on the grid the kernel would use and on a tiny grid (grid-stride loops)
            for (int nan = 0; nan < 2; nan++) {
                auto y = x;
                if (nan && n < nbo::kChunk) put(y, dt, n / 3, NAN); // one CPU chunk: NaN wins
                if (nan && n >= nbo::kChunk) continue;
                double r = -1;
                nb__clip_reduce_args a = {};
                a.dtype = dt, a.n = n, a.x = y.data(), a.result = &r;
                nb_status st = cuhost_cpu()->clip_abs_max(&a);
                int64_t full = (n + 255) / 256;
                double e1 = emulate_abs_max(dt, y.data(), n, full), e2 = emulate_abs_max(dt, y.data(), n, 3);
                CUHOST_CHECK(t, st == NB_OK && same_double(r, e1) && same_double(r, e2),
                             "clip_abs_max dtype %d n %lld nan %d: cpu %g emulated %g %g",
                             (int)dt, (long long)n, nan, r, e1, e2);
            }
        }
}

}  // namespace

void cuhost_optim(cuhost *t) {
    check_sgd<float>(t);
    check_sgd<double>(t);
    check_adam<float>(t);
    check_adam<double>(t);
    check_rmsprop<float>(t);
    check_rmsprop<double>(t);
    check_adagrad<float>(t);
    check_adagrad<double>(t);
    check_inplace(t);
    check_unscale(t);
    check_reduce(t);
}
