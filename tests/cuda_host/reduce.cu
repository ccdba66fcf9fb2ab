// tests/cuda_host/reduce.cu - host checks of the reduce family's CUDA kernels
// (cuda/k_reduce.cu): the kernels' __host__ __device__ math (cuda/k_reduce.cuh) run on the
// host in the kernels' order - every (block, thread) of the row kernel, its shared-memory
// tree, the column kernel's threads, the chunk merge, nb_block_sum's butterfly - and
// compared with the CPU backend's kernels on the same argument structs. No GPU needed.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cuda/k_reduce.cuh"
#include "cuhost.h"
#include "tensor/backend_table.h"

using namespace nbr;

namespace {

// ---- data ------------------------------------------------------------------------------------
uint64_t rng_state = 0x9e3779b97f4a7c15ull;
double urand() { // [0, 1)
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}

void put(char *p, nb_dtype dt, int64_t i, double v) {
    switch (dt) {
    case NB_F32: ((float *)p)[i] = (float)v; break;
    case NB_F64: ((double *)p)[i] = v; break;
    case NB_F16: ((uint16_t *)p)[i] = nb__kh_f16_from_f32((float)v); break;
    case NB_BF16: ((uint16_t *)p)[i] = nb__kh_bf16_from_f32((float)v); break;
    case NB_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case NB_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case NB_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    default: ((uint8_t *)p)[i] = v != 0; break;
    }
}
double get(const char *p, nb_dtype dt, int64_t i) {
    switch (dt) {
    case NB_F32: return ((const float *)p)[i];
    case NB_F64: return ((const double *)p)[i];
    case NB_F16: return nb__kh_f32_from_f16(((const uint16_t *)p)[i]);
    case NB_BF16: return nb__kh_f32_from_bf16(((const uint16_t *)p)[i]);
    case NB_I32: return ((const int32_t *)p)[i];
    case NB_I64: return (double)((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
    }
}
// Relative tolerance of a result of dtype dt computed in a different (but fixed) order.
double rel_tol(nb_dtype dt) {
    switch (dt) {
    case NB_F64: return 1e-12;
    case NB_F32: return 2e-6;
    case NB_F16: return 1.0 / 1024;
    case NB_BF16: return 1.0 / 128;
    default: return 0;
    }
}
bool close(double a, double b, double rel, double abs_tol) {
    if (a != a || b != b) return a != a && b != b;
    if (a == b) return true;
    return fabs(a - b) <= rel * fabs(b) + abs_tol;
}

// ---- reduce: the GPU's order on the host -------------------------------------------------------
template <typename T> void emulate_reduce(const nb__reduce_args *a) {
    rplan p;
    rd_plan(&a->x, a->reduced, &p);
    if (p.nout == 0) return;
    rout o = rd_out_of(a);
    const T *x = (const T *)a->x.data;
    const bool integer = rd_is_int<T>::v;
    std::vector<rst> part((size_t)(p.nout * p.nch));
    std::vector<rst> sh(kRowThreads);
    for (int64_t ch = 0; ch < p.nch; ch++)
        for (int64_t oi = 0; oi < p.nout; oi++) {
            int64_t in, out;
            rd_ooff(&p, oi, &in, &out);
            rst s;
            if (p.col) {
                s = rd_col_thread<T>(&p, o.kind, x + in, ch);
            } else {
                for (int t = 0; t < kRowThreads; t++)
                    sh[t] = rd_row_thread<T>(&p, o.kind, x + in, ch, t, kRowThreads);
                rd_tree_host(sh.data(), kRowThreads, o.kind, integer);
                s = sh[0];
            }
            if (p.nch == 1)
                rd_store(&o, out, s);
            else
                part[oi * p.nch + ch] = s;
        }
    if (p.nch == 1) return;
    for (int64_t oi = 0; oi < p.nout; oi++) {
        int64_t in, out;
        rd_ooff(&p, oi, &in, &out);
        rst s = part[oi * p.nch];
        for (int64_t ch = 1; ch < p.nch; ch++)
            s = rd_combine(o.kind, integer, s, part[oi * p.nch + ch]);
        rd_store(&o, out, s);
    }
}

void emulate_reduce_any(const nb__reduce_args *a) {
    switch (a->x.dtype) {
    case NB_F32: emulate_reduce<float>(a); break;
    case NB_F64: emulate_reduce<double>(a); break;
    case NB_F16: emulate_reduce<nb_f16_t>(a); break;
    case NB_BF16: emulate_reduce<nb_bf16_t>(a); break;
    case NB_I32: emulate_reduce<int32_t>(a); break;
    case NB_I64: emulate_reduce<int64_t>(a); break;
    case NB_U8: emulate_reduce<uint8_t>(a); break;
    default: emulate_reduce<rbool>(a); break;
    }
}

const char *kind_name(int k) {
    static const char *n[] = {"sum", "var", "lse", "max", "min", "argmax", "argmin"};
    return n[k];
}

// Data of a case: 'p' positive in [0.5, 1.5) (no cancellation: relative tolerances hold),
// 's' signed with ties (small integers), 'n' signed with NaN / +-inf sprinkled in.
struct rcase {
    nb_dtype dt;
    int ndim;
    int64_t shape[4];
    bool transpose; // x's strides those of the reversed dims (a permuted, dense tensor)
    bool reduced[4];
    int kind, post;
    char data;
};

int run_reduce_case(cuhost *t, const rcase &c) {
    nb__reduce_args a;
    memset(&a, 0, sizeof a);
    int64_t n = 1;
    for (int d = 0; d < c.ndim; d++) n *= c.shape[d];
    int es = nb__kh_dtype_size(c.dt);
    std::vector<char> xb((size_t)(n > 0 ? n : 1) * es);
    for (int64_t i = 0; i < n; i++) {
        double v;
        if (c.data == 'p')
            v = 0.5 + urand();
        else if (c.data == 's')
            v = floor(urand() * 9) - 4;
        else {
            double u = urand();
            v = u < 0.01 ? NAN : u < 0.02 ? INFINITY : u < 0.03 ? -INFINITY : urand() * 8 - 4;
        }
        if (c.dt == NB_U8 || c.dt == NB_BOOL) v = floor(urand() * 5);
        put(xb.data(), c.dt, i, v);
    }
    a.x.data = xb.data();
    a.x.dtype = c.dt;
    a.x.ndim = c.ndim;
    int64_t st = 1;
    if (!c.transpose) {
        for (int d = c.ndim - 1; d >= 0; d--)
            a.x.shape[d] = c.shape[d], a.x.strides[d] = st, st *= c.shape[d];
    } else {
        for (int d = 0; d < c.ndim; d++)
            a.x.shape[d] = c.shape[d], a.x.strides[d] = st, st *= c.shape[d];
    }
    int64_t nout = 1, R = 1;
    for (int d = 0; d < c.ndim; d++) {
        a.reduced[d] = c.reduced[d];
        if (c.reduced[d])
            R *= c.shape[d];
        else
            nout *= c.shape[d];
    }
    a.kind = (nb__rkind)c.kind;
    a.post = (nb__rpost)c.post;
    a.den = R > 1 ? (double)(R - 1) : 1;
    bool integer = rd_int_dtype(c.dt);
    bool arg = c.kind == NB__RK_ARGMAX || c.kind == NB__RK_ARGMIN;
    a.out_dtype = integer ? (c.kind == NB__RK_SUM ? NB_I64 : c.dt) : c.dt;
    if (c.kind == NB__RK_SUM && c.post != NB__RP_NONE) a.out_dtype = integer ? NB_F32 : c.dt;
    int oes = nb__kh_dtype_size(a.out_dtype);
    std::vector<char> o_cpu((size_t)nout * oes + 8), o_gpu((size_t)nout * oes + 8);
    std::vector<int64_t> i_cpu((size_t)nout + 1, -7), i_gpu((size_t)nout + 1, -7);
    nb__reduce_args ac = a, ag = a;
    ac.out = o_cpu.data(), ag.out = o_gpu.data();
    if (arg) ac.idx = i_cpu.data(), ag.idx = i_gpu.data();
    nb_status s = cuhost_cpu()->reduce(&ac);
    CUHOST_CHECK(t, s == NB_OK, "cpu reduce failed");
    emulate_reduce_any(&ag);
    rplan p;
    rd_plan(&a.x, a.reduced, &p);
    int bad = 0;
    double rel = rel_tol(a.out_dtype);
    if (c.kind == NB__RK_VAR || c.kind == NB__RK_LSE) rel *= 4;
    for (int64_t i = 0; i < nout && bad < 3; i++) {
        double vc = get(o_cpu.data(), a.out_dtype, i), vg = get(o_gpu.data(), a.out_dtype, i);
        bool exact = integer || c.kind >= NB__RK_MAX;
        bool ok = exact ? (vc == vg || (vc != vc && vg != vg)) : close(vg, vc, rel, 0);
        if (arg) ok = ok && i_cpu[i] == i_gpu[i];
        if (!ok) bad++;
        CUHOST_CHECK(t, ok,
                     "reduce %s dtype %d shape (%lld,%lld,%lld,%lld)/%d T%d post %d (plan: %s, "
                     "nch %lld): out[%lld] gpu %.9g idx %lld, cpu %.9g idx %lld",
                     kind_name(c.kind), (int)c.dt, (long long)c.shape[0], (long long)c.shape[1],
                     (long long)c.shape[2], (long long)c.shape[3], c.ndim, (int)c.transpose, c.post,
                     p.col ? "col" : "row", (long long)p.nch, (long long)i, vg, (long long)i_gpu[i],
                     vc, (long long)i_cpu[i]);
    }
    return bad;
}

void check_reduce(cuhost *t) {
    const nb_dtype fdts[] = {NB_F32, NB_F64, NB_F16, NB_BF16};
    const nb_dtype idts[] = {NB_I32, NB_I64, NB_U8, NB_BOOL};
    struct geo {
        int ndim;
        int64_t shape[4];
        bool tr;
        bool red[4];
    } geos[] = {
        {3, {3, 5, 100, 1}, false, {false, false, true, false}},   // last dim: row
        {3, {3, 5, 7, 1}, false, {false, false, true, false}},     // short rows: col
        {3, {40, 5, 70, 1}, false, {true, false, true, false}},    // row, two reduced dims
        {3, {3, 5, 7, 1}, false, {true, false, false, false}},     // first dim: col
        {3, {3, 5, 7, 1}, false, {true, false, true, false}},      // two dims, split
        {3, {4, 33, 6, 1}, true, {false, true, false, false}},     // permuted strides
        {4, {2, 3, 40, 5}, false, {false, true, true, true}},      // merged reduced dims
        {2, {2, 70000, 1, 1}, false, {false, true, false, false}}, // row, chunks
        {2, {60000, 3, 1, 1}, false, {true, false, false, false}}, // col, chunks
        {1, {300, 1, 1, 1}, false, {true, false, false, false}},   // full reduction
        {2, {37, 1000, 1, 1}, false, {true, true, false, false}},  // full, 2-d
        {0, {1, 1, 1, 1}, false, {false, false, false, false}},    // 0-dim
        {2, {5, 0, 1, 1}, false, {false, true, false, false}},     // empty reduced dim
    };
    int fails = 0;
    for (const geo &g : geos) {
        bool empty = g.ndim == 2 && g.shape[1] == 0;
        for (nb_dtype dt : fdts)
            for (int k = NB__RK_SUM; k <= NB__RK_ARGMIN; k++) {
                if (empty && k >= NB__RK_MAX) continue;
                int post = k == NB__RK_VAR   ? NB__RP_SQRT_DIV
                           : k == NB__RK_SUM ? NB__RP_DIV
                                             : NB__RP_NONE;
                for (char data : {'p', 's', 'n'}) {
                    if (data == 'n' && (dt == NB_F16 || dt == NB_BF16) && k <= NB__RK_LSE) continue;
                    rcase c = {dt,
                               g.ndim,
                               {g.shape[0], g.shape[1], g.shape[2], g.shape[3]},
                               g.tr,
                               {g.red[0], g.red[1], g.red[2], g.red[3]},
                               k,
                               post,
                               data};
                    if (k == NB__RK_VAR && data != 'p') continue; // cancellation: tested positive
                    fails += run_reduce_case(t, c);
                    if (k == NB__RK_SUM && data == 'p') {
                        c.post = NB__RP_NONE;
                        fails += run_reduce_case(t, c);
                    }
                }
            }
        for (nb_dtype dt : idts)
            for (int k : {NB__RK_SUM, NB__RK_MAX, NB__RK_MIN, NB__RK_ARGMAX, NB__RK_ARGMIN}) {
                if (empty && k != NB__RK_SUM) continue;
                rcase c = {dt,
                           g.ndim,
                           {g.shape[0], g.shape[1], g.shape[2], g.shape[3]},
                           g.tr,
                           {g.red[0], g.red[1], g.red[2], g.red[3]},
                           k,
                           NB__RP_NONE,
                           's'};
                fails += run_reduce_case(t, c);
            }
    }
    CUHOST_CHECK(t, fails == 0, "%d reduce outputs differ", fails);
}

// ---- softmax ------------------------------------------------------------------------------------
template <typename T> void emulate_softmax(const nb__softmax_args *a) {
    using A = acc_t<T>;
    const int B = 256; // the kernel's block (kSmThreads)
    const T *x = (const T *)a->x;
    T *y = (T *)a->y;
    int64_t O = a->outer, L = a->len, D = a->inner;
    if (!sm_use_rows(L, D)) {
        for (int64_t i = 0; i < O * D; i++) {
            int64_t o = i / D, j = i - o * D;
            sm_col<T>(x + o * L * D + j, y + o * L * D + j, L, D, a->log);
        }
        return;
    }
    std::vector<sm_acc<A>> acc(B);
    std::vector<double> sc(B);
    for (int64_t row = 0; row < O; row++) {
        const T *xr = x + row * L;
        T *yr = y + row * L;
        A M = (A)-INFINITY;
        for (int t = 0; t < B; t++) {
            acc[t] = sm_row_thread<T>(xr, L, t, B);
            M = acc[t].m > M ? acc[t].m : M;
        }
        for (int t = 0; t < B; t++) sc[t] = sm_scaled(acc[t], M);
        double S = sm_total(host_block_sum(sc.data(), B), M);
        A f = sm_factor<A>(S, a->log);
        for (int64_t i = 0; i < L; i++) sm_st(yr + i, sm_out(sm_ld(xr + i), M, f, a->log));
    }
}

template <typename T> void emulate_softmax_backward(const nb__softmax_backward_args *a) {
    using A = acc_t<T>;
    const int B = 256;
    const T *y = (const T *)a->y, *g = (const T *)a->g;
    T *dx = (T *)a->dx;
    int64_t O = a->outer, L = a->len, D = a->inner;
    if (!sm_use_rows(L, D)) {
        for (int64_t i = 0; i < O * D; i++) {
            int64_t o = i / D, j = i - o * D, off = o * L * D + j;
            smb_col<T>(y + off, g + off, dx + off, L, D, a->log);
        }
        return;
    }
    std::vector<double> part(B);
    for (int64_t row = 0; row < O; row++) {
        for (int t = 0; t < B; t++)
            part[t] = smb_row_thread<T>(y + row * L, g + row * L, L, t, B, a->log);
        A sf = (A)host_block_sum(part.data(), B);
        for (int64_t i = 0; i < L; i++)
            sm_st(dx + row * L + i,
                  smb_out(sm_ld(y + row * L + i), sm_ld(g + row * L + i), sf, a->log));
    }
}

// Rows: random logits (N(0, 3)-ish), big logits (+-1e4 spread 30), a row with -inf entries,
// a row of only -inf, a row with a NaN, a row with +inf; inner > 1 too.
int run_softmax_case(cuhost *t, nb_dtype dt, int64_t O, int64_t L, int64_t D, bool lg,
                     bool inplace) {
    int64_t n = O * L * D;
    int es = nb__kh_dtype_size(dt);
    std::vector<char> x((size_t)n * es), yc((size_t)n * es), yg((size_t)n * es);
    for (int64_t i = 0; i < n; i++) {
        int64_t row = i / (L * D);
        double v = (urand() - 0.5) * 6;
        if (row % 6 == 1) v = (urand() > 0.5 ? 1e4 : -1e4) + urand() * 30;
        if (row % 6 == 2 && urand() < 0.3) v = -INFINITY;
        if (row % 6 == 3) v = -INFINITY;
        if (row % 6 == 4 && i % 17 == 5) v = NAN;
        if (row % 6 == 5 && i % 23 == 3) v = INFINITY;
        put(x.data(), dt, i, v);
    }
    nb__softmax_args a = {x.data(), yc.data(), dt, O, L, D, lg};
    nb_status s = cuhost_cpu()->softmax(&a);
    CUHOST_CHECK(t, s == NB_OK, "cpu softmax failed");
    if (inplace) {
        memcpy(yg.data(), x.data(), x.size());
        a.x = a.y = yg.data();
    } else {
        a.y = yg.data();
    }
    NB_DISPATCH_FLOAT(dt, T, emulate_softmax<T>(&a));
    int bad = 0;
    double rel = rel_tol(dt);
    for (int64_t i = 0; i < n && bad < 3; i++) {
        double vc = get(yc.data(), dt, i), vg = get(yg.data(), dt, i);
        // log_softmax: errors scale with |x - max| (large logits)
        bool ok = close(vg, vc, rel, lg ? rel * 4 : 1e-30);
        if (!ok) bad++;
        CUHOST_CHECK(t, ok, "softmax%s dtype %d (%lld,%lld,%lld)%s: y[%lld] gpu %.9g cpu %.9g",
                     lg ? " (log)" : "", (int)dt, (long long)O, (long long)L, (long long)D,
                     inplace ? " in place" : "", (long long)i, vg, vc);
    }
    return bad;
}

int run_softmax_backward_case(cuhost *t, nb_dtype dt, int64_t O, int64_t L, int64_t D, bool lg) {
    int64_t n = O * L * D;
    int es = nb__kh_dtype_size(dt);
    std::vector<char> x((size_t)n * es), y((size_t)n * es), g((size_t)n * es), dc((size_t)n * es),
        dg((size_t)n * es);
    for (int64_t i = 0; i < n; i++)
        put(x.data(), dt, i, (urand() - 0.5) * 6), put(g.data(), dt, i, urand() - 0.5);
    nb__softmax_args f = {x.data(), y.data(), dt, O, L, D, lg};
    cuhost_cpu()->softmax(&f);
    nb__softmax_backward_args a = {y.data(), g.data(), dc.data(), dt, O, L, D, lg};
    nb_status s = cuhost_cpu()->softmax_backward(&a);
    CUHOST_CHECK(t, s == NB_OK, "cpu softmax_backward failed");
    a.dx = dg.data();
    NB_DISPATCH_FLOAT(dt, T, emulate_softmax_backward<T>(&a));
    int bad = 0;
    // dx is a difference: its error scales with |g| and |y|, not with dx itself
    double rel = rel_tol(dt), abs_tol = dt == NB_F64 ? 1e-15 : dt == NB_F32 ? 1e-7 : rel * 0.5;
    for (int64_t i = 0; i < n && bad < 3; i++) {
        double vc = get(dc.data(), dt, i), vg = get(dg.data(), dt, i);
        bool ok = close(vg, vc, rel, abs_tol);
        if (!ok) bad++;
        CUHOST_CHECK(t, ok,
                     "softmax_backward%s dtype %d (%lld,%lld,%lld): dx[%lld] gpu %.9g cpu %.9g",
                     lg ? " (log)" : "", (int)dt, (long long)O, (long long)L, (long long)D,
                     (long long)i, vg, vc);
    }
    return bad;
}

void check_softmax(cuhost *t) {
    const nb_dtype fdts[] = {NB_F32, NB_F64, NB_F16, NB_BF16};
    int fails = 0;
    for (nb_dtype dt : fdts)
        for (bool lg : {false, true}) {
            fails += run_softmax_case(t, dt, 12, 1000, 1, lg, false);
            fails += run_softmax_case(t, dt, 6, 50304, 1, lg, false);
            fails += run_softmax_case(t, dt, 12, 7, 1, lg, true);
            fails += run_softmax_case(t, dt, 12, 333, 1, lg, true);
            fails += run_softmax_case(t, dt, 12, 9, 5, lg, false);
            fails += run_softmax_case(t, dt, 6, 300, 3, lg, true);
            fails += run_softmax_backward_case(t, dt, 5, 1000, 1, lg);
            fails += run_softmax_backward_case(t, dt, 3, 40000, 1, lg);
            fails += run_softmax_backward_case(t, dt, 4, 9, 6, lg);
        }
    CUHOST_CHECK(t, fails == 0, "%d softmax outputs differ", fails);
}

// ---- extreme_backward ---------------------------------------------------------------------------
void check_extreme_backward(cuhost *t) {
    for (nb_dtype dt : {NB_F32, NB_F64, NB_BF16, NB_F16}) {
        int64_t O = 3, L = 7, D = 5, es = nb__kh_dtype_size(dt);
        std::vector<char> g((size_t)(O * D * es)), dc((size_t)(O * L * D * es), 1),
            dg((size_t)(O * L * D * es), 1);
        std::vector<int64_t> idx((size_t)(O * D));
        for (int64_t i = 0; i < O * D; i++)
            put(g.data(), dt, i, urand() - 0.5), idx[i] = (int64_t)(urand() * L);
        nb__extreme_backward_args a = {g.data(), idx.data(), dc.data(), dt, O, L, D};
        CUHOST_CHECK(t, cuhost_cpu()->extreme_backward(&a) == NB_OK, "cpu extreme_backward");
        for (int64_t i = 0; i < O * L * D; i++) {
            switch (es) {
            case 8:
                ((uint64_t *)dg.data())[i] =
                    eb_value((const uint64_t *)g.data(), idx.data(), i, L, D);
                break;
            case 4:
                ((uint32_t *)dg.data())[i] =
                    eb_value((const uint32_t *)g.data(), idx.data(), i, L, D);
                break;
            default:
                ((uint16_t *)dg.data())[i] =
                    eb_value((const uint16_t *)g.data(), idx.data(), i, L, D);
                break;
            }
        }
        CUHOST_CHECK(t, memcmp(dc.data(), dg.data(), dc.size()) == 0,
                     "extreme_backward dtype %d: bytes differ", (int)dt);
    }
}

} // namespace

void cuhost_reduce(cuhost *t) {
    check_reduce(t);
    check_softmax(t);
    check_extreme_backward(t);
}
