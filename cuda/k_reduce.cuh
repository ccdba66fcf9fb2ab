// cuda/k_reduce.cuh - private to cuda/k_reduce.cu and tests/cuda_host/reduce.cu: the math of
// the reduce family's CUDA kernels as __host__ __device__ functions, so that the host checks
// run the very functions the kernels call, in the same order. UNVERIFIED on a GPU.
//
//   rd_plan(x, reduced, &p)      the geometry: the CPU kernel's sorted, merged dims (same
//                                reduced linear index for argmax), the kernel choice and
//                                the chunks of the reduced range; depends on shapes only
//   rst, rd_init / rd_add<T> / rd_combine / rd_store
//                                the running state of one output (the CPU's rstate), one
//                                element added, two partials merged, the result stored
//   rd_row_thread<T> / rd_col_thread<T>
//                                the work of one thread of the row kernel (a block per
//                                output: thread t takes r = t, t + B, ... of its chunk) and of
//                                the column kernel (a thread per output: its chunk in order)
//   rd_tree_host(s, B, kind)     the row kernel's shared-memory tree, sequentially
//   sm_* / ce_* (softmax, cross entropy): per-row helpers, see the sections below
//
// Accumulation: float inputs (f32, f16, bf16, f64) accumulate in f64 (the CPU adds short
// f32 partial sums in f64: results agree to a few f32 ulps, not bit for bit); VAR is
// Welford per thread and Chan's merge across partials (the CPU: block mean then squared
// deviations, merged with Chan's formula); integers and bool in int64, sums wrapping.
#ifndef NABLA_CUDA_K_REDUCE_CUH
#define NABLA_CUDA_K_REDUCE_CUH

#include <math.h>
#include <stdint.h>

#include "cuda/kcommon.cuh"

// Full unrolling of the loops over the dims on the device (constant indices: no local
// memory); the host compiler does not know the pragma.
#if defined(__CUDA_ARCH__)
#define NBR_UNROLL _Pragma("unroll")
#else
#define NBR_UNROLL
#endif

namespace nbr {

using nbk::nb_bf16_t;
using nbk::nb_f16_t;
struct rbool {
    uint8_t b;
}; // NB_BOOL storage (any non-zero byte is true)

constexpr int kRowThreads = 256; // row kernel block size (a power of two)
constexpr int kMaxDims = NB_MAX_DIMS;

// ---- loads ---------------------------------------------------------------------------------
NB_HD double rd_f(const float *p) { return *p; }
NB_HD double rd_f(const double *p) { return *p; }
NB_HD double rd_f(const nb_bf16_t *p) { return nb__kh_f32_from_bf16(p->bits); }
NB_HD double rd_f(const nb_f16_t *p) { return nb__kh_f32_from_f16(p->bits); }
NB_HD int64_t rd_i(const int32_t *p) { return *p; }
NB_HD int64_t rd_i(const int64_t *p) { return *p; }
NB_HD int64_t rd_i(const uint8_t *p) { return *p; }
NB_HD int64_t rd_i(const rbool *p) { return p->b != 0; }

template <typename T> struct rd_is_int { static constexpr bool v = false; };
template <> struct rd_is_int<int32_t> { static constexpr bool v = true; };
template <> struct rd_is_int<int64_t> { static constexpr bool v = true; };
template <> struct rd_is_int<uint8_t> { static constexpr bool v = true; };
template <> struct rd_is_int<rbool> { static constexpr bool v = true; };

NB_HD bool rd_isnan(double v) { return v != v; }
NB_HD bool rd_isinf(double v) { return v == (double)INFINITY || v == -(double)INFINITY; }
// The LSE shift: the max, or 0 where it is infinite (as the CPU's lse_shift).
NB_HD double rd_shift(double m) { return rd_isinf(m) ? 0.0 : m; }
NB_HD double rd_rescale(double d, double e) { return d == 0 ? 0 : d * exp(e); }

// ---- the plan --------------------------------------------------------------------------------
struct rplan {
    int nk, nr; // kept / reduced dims after merging
    int64_t kshape[kMaxDims], kin[kMaxDims], kout[kMaxDims];
    int64_t rshape[kMaxDims], rin[kMaxDims];
    int64_t nout, R;
    int col;            // 1: column kernel (a thread per output), 0: row kernel
    int64_t nch, csize; // chunks of the reduced range (nch > 1: partials, then combine)
};

// x's dims sorted by decreasing stride, size-1 dims dropped, neighbours of one kind merged:
// the CPU's plan_dims (cpu/reduce.c), so the reduced linear index is the same.
static inline void rd_plan(const nb__view *x, const bool *reduced, rplan *p) {
    struct dim {
        int64_t size, in, out;
        bool red;
    } tmp[kMaxDims], dims[kMaxDims];
    int n = 0;
    int64_t ostride = 1;
    p->nout = 1, p->R = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (reduced[d])
            p->R *= x->shape[d];
        else
            p->nout *= x->shape[d];
    }
    for (int d = x->ndim - 1; d >= 0; d--) {
        if (x->shape[d] == 1) continue;
        tmp[n] = dim{x->shape[d], x->strides[d], reduced[d] ? 0 : ostride, reduced[d]};
        if (!reduced[d]) ostride *= x->shape[d];
        n++;
    }
    for (int i = 0; i < n; i++) dims[i] = tmp[n - 1 - i];
    for (int i = 1; i < n; i++) {
        dim v = dims[i];
        int j = i;
        while (j > 0 && dims[j - 1].in < v.in) dims[j] = dims[j - 1], j--;
        dims[j] = v;
    }
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m > 0) {
            dim *q = &dims[m - 1];
            const dim *r = &dims[i];
            if (q->red == r->red && q->in == r->in * r->size &&
                (r->red || q->out == r->out * r->size)) {
                q->size *= r->size, q->in = r->in, q->out = r->out;
                continue;
            }
        }
        dims[m++] = dims[i];
    }
    p->nk = p->nr = 0;
    for (int i = 0; i < m; i++) {
        if (dims[i].red) {
            p->rshape[p->nr] = dims[i].size, p->rin[p->nr] = dims[i].in, p->nr++;
        } else {
            p->kshape[p->nk] = dims[i].size, p->kin[p->nk] = dims[i].in;
            p->kout[p->nk] = dims[i].out, p->nk++;
        }
    }
    for (int i = p->nk; i < kMaxDims; i++) p->kshape[i] = 1, p->kin[i] = p->kout[i] = 0;
    for (int i = p->nr; i < kMaxDims; i++) p->rshape[i] = 1, p->rin[i] = 0;
    // The column kernel (a thread per output, coalesced across outputs) when the innermost
    // dim is kept or the reduced rows are short; else a block per output. Then chunks of
    // the reduced range so that there is enough parallel work: the numbers depend on the
    // shape only, so the order of every sum does too.
    bool inner_kept = m > 0 && !dims[m - 1].red;
    // (64 or fewer elements per output would leave most of a block of 256 idle.)
    bool short_rows =
        !inner_kept && p->nk > 0 && p->nr > 0 && (p->rshape[p->nr - 1] < 32 || p->R <= 64);
    p->col = inner_kept || short_rows;
    int64_t R = p->R, nout = p->nout > 0 ? p->nout : 1, nch;
    if (p->col) {
        int64_t want = (131072 + nout - 1) / nout, most = (R + 127) / 128;
        nch = want < most ? want : most;
        if (nch > 65535) nch = 65535;
    } else {
        int64_t want = (1024 + nout - 1) / nout, most = (R + 8191) / 8192;
        nch = want < most ? want : most;
        if (nch > 4096) nch = 4096;
    }
    if (nch < 1) nch = 1;
    p->csize = R > 0 ? (R + nch - 1) / nch : 1;
    p->nch = R > 0 ? (R + p->csize - 1) / p->csize : 1;
}

// Input offset (elements) of the reduced linear index r; of output o: input and output.
NB_HD int64_t rd_roff(const rplan *p, int64_t r) {
    if (p->nr <= 1) return r * p->rin[0];
    int64_t off = 0;
    NBR_UNROLL
    for (int d = kMaxDims - 1; d >= 0; d--) {
        if (d < p->nr) {
            int64_t q = r / p->rshape[d];
            off += (r - q * p->rshape[d]) * p->rin[d];
            r = q;
        }
    }
    return off;
}
NB_HD void rd_ooff(const rplan *p, int64_t o, int64_t *in, int64_t *out) {
    int64_t a = 0, b = 0;
    NBR_UNROLL
    for (int d = kMaxDims - 1; d >= 0; d--) {
        if (d < p->nk) {
            int64_t q = o / p->kshape[d], k = o - q * p->kshape[d];
            a += k * p->kin[d], b += k * p->kout[d];
            o = q;
        }
    }
    *in = a, *out = b;
}

// ---- states ----------------------------------------------------------------------------------
// SUM d (float) / i (int); VAR n, mean m, squared deviations d; LSE max m, d = sum exp(x -
// shift(m)); MAX/MIN d / i; ARGMAX/ARGMIN d / i and idx, n = 0 while empty.
struct rst {
    double d, m;
    int64_t i, idx, n;
};

NB_HD rst rd_init(int k) {
    rst s = {0, 0, 0, 0, 0};
    if (k == NB__RK_MAX || k == NB__RK_ARGMAX) s.d = -(double)INFINITY, s.i = INT64_MIN;
    if (k == NB__RK_MIN || k == NB__RK_ARGMIN) s.d = (double)INFINITY, s.i = INT64_MAX;
    if (k == NB__RK_LSE) s.m = -(double)INFINITY;
    return s;
}

// b more extreme than a (argmax / argmin): NaN beats every number; ties go to the smaller
// index, so the merge order never changes the result (the first occurrence wins).
NB_HD bool rd_arg_better(bool mx, bool integer, const rst &a, const rst &b) {
    if (b.n == 0) return false;
    if (a.n == 0) return true;
    if (integer) {
        if (b.i != a.i) return mx ? b.i > a.i : b.i < a.i;
    } else {
        bool an = rd_isnan(a.d), bn = rd_isnan(b.d);
        if (an != bn) return bn;
        if (!an && b.d != a.d) return mx ? b.d > a.d : b.d < a.d;
    }
    return b.idx < a.idx;
}

NB_HD rst rd_combine(int k, bool integer, rst a, rst b) {
    switch (k) {
    case NB__RK_SUM:
        a.d += b.d;
        a.i = (int64_t)((uint64_t)a.i + (uint64_t)b.i);
        return a;
    case NB__RK_VAR: {
        if (b.n == 0) return a;
        if (a.n == 0) return b;
        double na = (double)a.n, nb = (double)b.n, n = na + nb, delta = b.m - a.m;
        a.m += delta * (nb / n);
        a.d += b.d + delta * delta * (na * nb / n);
        a.n += b.n;
        return a;
    }
    case NB__RK_LSE: {
        if (rd_isnan(a.m) || rd_isnan(b.m)) {
            a.d = a.m = (double)NAN;
            return a;
        }
        double m = b.m > a.m ? b.m : a.m, sh = rd_shift(m);
        a.d = rd_rescale(a.d, rd_shift(a.m) - sh) + rd_rescale(b.d, rd_shift(b.m) - sh);
        a.m = m;
        return a;
    }
    case NB__RK_MAX:
        a.d = (rd_isnan(a.d) || rd_isnan(b.d)) ? (double)NAN : (b.d > a.d ? b.d : a.d);
        a.i = b.i > a.i ? b.i : a.i;
        return a;
    case NB__RK_MIN:
        a.d = (rd_isnan(a.d) || rd_isnan(b.d)) ? (double)NAN : (b.d < a.d ? b.d : a.d);
        a.i = b.i < a.i ? b.i : a.i;
        return a;
    default: return rd_arg_better(k == NB__RK_ARGMAX, integer, a, b) ? b : a;
    }
}

// Element x (reduced index r) into s. Float types: f64 arithmetic, but the LSE's exp of an
// f32/f16/bf16 input is taken in f32 like the CPU's.
template <typename T> NB_HD void rd_add(int k, rst &s, const T *p, int64_t r) {
    if constexpr (rd_is_int<T>::v) {
        int64_t v = rd_i(p);
        switch (k) {
        case NB__RK_SUM: s.i = (int64_t)((uint64_t)s.i + (uint64_t)v); break;
        case NB__RK_MAX: s.i = v > s.i ? v : s.i; break;
        case NB__RK_MIN: s.i = v < s.i ? v : s.i; break;
        case NB__RK_ARGMAX:
        case NB__RK_ARGMIN: {
            bool mx = k == NB__RK_ARGMAX;
            if (s.n == 0 || (mx ? v > s.i : v < s.i)) s.i = v, s.idx = r;
            s.n = 1;
            break;
        }
        default: break; // VAR / LSE: float inputs only (the op's guarantee)
        }
    } else {
        double v = rd_f(p);
        switch (k) {
        case NB__RK_SUM: s.d += v; break;
        case NB__RK_VAR: {
            s.n++;
            double delta = v - s.m;
            s.m += delta / (double)s.n;
            s.d += delta * (v - s.m);
            break;
        }
        case NB__RK_LSE: {
            if (rd_isnan(s.m)) break;
            if (rd_isnan(v)) {
                s.m = s.d = (double)NAN;
                break;
            }
            if (v > s.m) {
                s.d = rd_rescale(s.d, rd_shift(s.m) - rd_shift(v));
                s.m = v;
            }
            double sh = rd_shift(s.m);
            if constexpr (sizeof(T) == sizeof(double))
                s.d += exp(v - sh);
            else
                s.d += (double)expf((float)v - (float)sh);
            break;
        }
        case NB__RK_MAX:
            s.d = (rd_isnan(s.d) || rd_isnan(v)) ? (double)NAN : (v > s.d ? v : s.d);
            break;
        case NB__RK_MIN:
            s.d = (rd_isnan(s.d) || rd_isnan(v)) ? (double)NAN : (v < s.d ? v : s.d);
            break;
        default: {
            bool mx = k == NB__RK_ARGMAX;
            bool better = s.n == 0 || (rd_isnan(v) && !rd_isnan(s.d)) || (mx ? v > s.d : v < s.d);
            if (better) s.d = v, s.idx = r;
            s.n = 1;
        }
        }
    }
}

// Where the results go (the reduce args' output half).
struct rout {
    char *out;
    int64_t *idx;
    double den;
    int odt, kind, post, integer;
};

// Store the result of output element off (the CPU's finalize).
NB_HD void rd_store(const rout *o, int64_t off, const rst &s) {
    if (o->idx) o->idx[off] = s.idx;
    if (!o->out) return;
    char *p = o->out;
    switch (o->odt) {
    case NB_I64: ((int64_t *)p)[off] = s.i; return;
    case NB_I32: ((int32_t *)p)[off] = (int32_t)s.i; return;
    case NB_U8: ((uint8_t *)p)[off] = (uint8_t)s.i; return;
    case NB_BOOL: ((uint8_t *)p)[off] = s.i != 0; return;
    default: break;
    }
    double v = o->integer ? (double)s.i : s.d;
    if (o->kind == NB__RK_LSE) v = log(s.d) + rd_shift(s.m);
    if (o->post == NB__RP_DIV)
        v = v / o->den;
    else if (o->post == NB__RP_SQRT_DIV)
        v = sqrt(v / o->den);
    switch (o->odt) {
    case NB_F32: ((float *)p)[off] = (float)v; break;
    case NB_F64: ((double *)p)[off] = v; break;
    case NB_F16: ((uint16_t *)p)[off] = nb__kh_f16_from_f32((float)v); break;
    default: ((uint16_t *)p)[off] = nb__kh_bf16_from_f32((float)v); break;
    }
}

// ---- per-thread work -------------------------------------------------------------------------
// Row kernel: thread t of B over chunk ch of the output whose input starts at x (elements of
// T): reduced indices r = r0 + t, r0 + t + B, ... below r1.
template <typename T>
NB_HD rst rd_row_thread(const rplan *p, int k, const T *x, int64_t ch, int t, int B) {
    rst s = rd_init(k);
    int64_t r0 = ch * p->csize, r1 = r0 + p->csize < p->R ? r0 + p->csize : p->R;
    for (int64_t r = r0 + t; r < r1; r += B) rd_add<T>(k, s, x + rd_roff(p, r), r);
    return s;
}

// Column kernel: chunk ch of one output, in order.
template <typename T> NB_HD rst rd_col_thread(const rplan *p, int k, const T *x, int64_t ch) {
    rst s = rd_init(k);
    int64_t r0 = ch * p->csize, r1 = r0 + p->csize < p->R ? r0 + p->csize : p->R;
    if (p->nr <= 1) {
        for (int64_t r = r0; r < r1; r++) rd_add<T>(k, s, x + r * p->rin[0], r);
    } else {
        for (int64_t r = r0; r < r1; r++) rd_add<T>(k, s, x + rd_roff(p, r), r);
    }
    return s;
}

// The row kernel's block tree (s[0..B), B a power of two), run sequentially: the GPU runs
// each level in parallel, in the same pairs.
static inline void rd_tree_host(rst *s, int B, int k, bool integer) {
    for (int w = B / 2; w > 0; w >>= 1)
        for (int t = 0; t < w; t++) s[t] = rd_combine(k, integer, s[t], s[t + w]);
}

// ---- row helpers shared by softmax and cross entropy ------------------------------------------
// The compute type A of a storage type (f32 for f32/f16/bf16, f64 for f64) and its loads/stores
// with the CPU's rounding.
template <typename T> using acc_t = typename nbk::nb_acc<T>::type;
template <typename T> NB_HD acc_t<T> sm_ld(const T *p) { return (acc_t<T>)rd_f(p); }
NB_HD void sm_st(float *p, float v) { *p = v; }
NB_HD void sm_st(double *p, double v) { *p = v; }
NB_HD void sm_st(nb_bf16_t *p, float v) { p->bits = nb__kh_bf16_from_f32(v); }
NB_HD void sm_st(nb_f16_t *p, float v) { p->bits = nb__kh_f16_from_f32(v); }
NB_HD float sm_exp(float v) { return expf(v); }
NB_HD double sm_exp(double v) { return exp(v); }

// One thread's online max and sum of exps over its elements of a row (and the plain sum sx,
// which label smoothing needs): m the max so far (NaN ignored, as the CPU's row max), s =
// sum exp(x - m) in f64, rescaled when m grows. -inf elements add nothing here; a row whose
// max is -inf gets s = NaN in sm_total (the CPU's exp(-inf - -inf)). A NaN or a +inf
// element makes s NaN (the CPU: NaN, and exp(inf - inf)).
template <typename A> struct sm_acc {
    A m;
    double s, sx;
};
template <typename A> NB_HD sm_acc<A> sm_begin() { return sm_acc<A>{(A)-INFINITY, 0.0, 0.0}; }
template <typename A> NB_HD void sm_step(sm_acc<A> &a, A v) {
    if (v > a.m) {
        a.s = a.s == 0 ? 0 : a.s * exp((double)(a.m - v));
        a.m = v;
    }
    if (v != (A)-INFINITY) a.s += (double)sm_exp(v - a.m);
    a.sx += (double)v;
}
// A thread's s rescaled to the row max M (the block's), before the block sum.
template <typename A> NB_HD double sm_scaled(const sm_acc<A> &a, A M) {
    return a.s == 0 ? 0 : a.s * exp((double)(a.m - M));
}
// The row's sum of exps from the block sum S of the scaled partials.
template <typename A> NB_HD double sm_total(double S, A M) {
    return M == (A)-INFINITY ? (double)NAN : S;
}

// nbk::nb_block_sum's order on the host: a butterfly within each warp of 32 values, then the
// butterfly over the warp sums (zeros past the last warp); v holds B values (B % 32 == 0).
template <typename A> static inline void host_butterfly(A *l) {
    for (int o = 16; o > 0; o >>= 1) {
        A t[32];
        for (int i = 0; i < 32; i++) t[i] = l[i] + l[i ^ o];
        for (int i = 0; i < 32; i++) l[i] = t[i];
    }
}
template <typename A> static inline A host_block_sum(const A *v, int B) {
    A w[32];
    for (int i = 0; i < 32; i++) w[i] = A(0);
    for (int k = 0; k < B / 32; k++) {
        A l[32];
        for (int i = 0; i < 32; i++) l[i] = v[k * 32 + i];
        host_butterfly(l);
        w[k] = l[0];
    }
    host_butterfly(w);
    return w[0];
}

// ---- softmax and its backward -------------------------------------------------------------------
// A block per row for rows (inner == 1) longer than a warp; else a thread per row or column
// (the column kernel with D == 1), so short rows do not leave most of a block idle.
NB_HD bool sm_use_rows(int64_t L, int64_t D) { return D == 1 && L > 32; }
// Thread t of B: its elements t, t + B, ... of a dense row of L.
template <typename T> NB_HD sm_acc<acc_t<T>> sm_row_thread(const T *x, int64_t L, int t, int B) {
    sm_acc<acc_t<T>> a = sm_begin<acc_t<T>>();
    for (int64_t i = t; i < L; i += B) sm_step(a, sm_ld(x + i));
    return a;
}
// The write pass's factor (1 / S, or log S for log_softmax) and an output, as the CPU.
template <typename A> NB_HD A sm_factor(double S, bool lg) { return lg ? (A)log(S) : (A)(1.0 / S); }
template <typename A> NB_HD A sm_out(A v, A M, A f, bool lg) {
    return lg ? (v - M) - f : sm_exp(v - M) * f;
}
// One column (inner > 1) of L elements D apart, the CPU's three passes.
template <typename T> NB_HD void sm_col(const T *x, T *y, int64_t L, int64_t D, bool lg) {
    using A = acc_t<T>;
    A m = (A)-INFINITY;
    for (int64_t l = 0; l < L; l++) {
        A v = sm_ld(x + l * D);
        m = (v > m || v != v) ? v : m;
    }
    double s = 0;
    for (int64_t l = 0; l < L; l++) s += (double)sm_exp(sm_ld(x + l * D) - m);
    A f = sm_factor<A>(s, lg);
    for (int64_t l = 0; l < L; l++) sm_st(y + l * D, sm_out(sm_ld(x + l * D), m, f, lg));
}

// Backward: thread t's part of sum(g * y) (log_softmax: sum g), in f64.
template <typename T>
NB_HD double smb_row_thread(const T *y, const T *g, int64_t L, int t, int B, bool lg) {
    double s = 0;
    for (int64_t i = t; i < L; i += B)
        s += lg ? (double)sm_ld(g + i) : (double)sm_ld(g + i) * (double)sm_ld(y + i);
    return s;
}
template <typename A> NB_HD A smb_out(A y, A g, A sf, bool lg) {
    return lg ? g - sm_exp(y) * sf : y * (g - sf);
}
template <typename T>
NB_HD void smb_col(const T *y, const T *g, T *dx, int64_t L, int64_t D, bool lg) {
    using A = acc_t<T>;
    double s = 0;
    for (int64_t l = 0; l < L; l++) {
        A gv = sm_ld(g + l * D);
        s += lg ? (double)gv : (double)gv * (double)sm_ld(y + l * D);
    }
    A sf = (A)s;
    for (int64_t l = 0; l < L; l++)
        sm_st(dx + l * D, smb_out(sm_ld(y + l * D), sm_ld(g + l * D), sf, lg));
}

// ---- extreme_backward ---------------------------------------------------------------------------
// Element i of dx (O, L, D): g[o, d] where idx[o, d] == l, else 0 (U: an unsigned integer of
// the element's size; zero bits are 0.0 in every float dtype).
template <typename U>
NB_HD U eb_value(const U *g, const int64_t *idx, int64_t i, int64_t L, int64_t D) {
    int64_t o = i / (L * D), rem = i - o * L * D, l = rem / D, d = rem - l * D;
    return idx[o * D + d] == l ? g[o * D + d] : (U)0;
}

// ---- arguments ----------------------------------------------------------------------------------
NB_HD bool rd_int_dtype(nb_dtype dt) {
    return dt == NB_I32 || dt == NB_I64 || dt == NB_U8 || dt == NB_BOOL;
}
NB_HD bool rd_float_dtype(nb_dtype dt) {
    return dt == NB_F32 || dt == NB_F64 || dt == NB_F16 || dt == NB_BF16;
}
static inline rout rd_out_of(const nb__reduce_args *a) {
    rout o;
    o.out = a->out, o.idx = a->idx, o.den = a->den;
    o.odt = (int)a->out_dtype, o.kind = (int)a->kind, o.post = (int)a->post;
    o.integer = rd_int_dtype(a->x.dtype);
    return o;
}

} // namespace nbr

#endif
