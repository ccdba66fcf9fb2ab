// tests/cuda_host/loss.cu - host checks of the loss family's CUDA kernels (cuda/k_loss.cu):
// the kernels' __host__ __device__ math (cuda/k_loss.cuh, cuda/k_reduce.cuh) run on the host
// in the kernels' order - the row kernel's threads and nb_block_max / nb_block_sum merges, the
// one-block sum over positions, the elementwise backward - and compared with the CPU
// backend's kernels on the same argument structs. No GPU needed.
#include <math.h>
#include <string.h>

#include <vector>

#include "cuda/k_loss.cuh"
#include "cuhost.h"
#include "tensor/backend_table.h"

using namespace nbl;

namespace {

uint64_t rng_state = 0x2545f4914f6cdd1dull;
double urand() {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}
double get(const void *p, nb_dtype dt, int64_t i) {
    switch (dt) {
    case NB_F32: return ((const float *)p)[i];
    case NB_F64: return ((const double *)p)[i];
    case NB_F16: return nb__kh_f32_from_f16(((const uint16_t *)p)[i]);
    default: return nb__kh_f32_from_bf16(((const uint16_t *)p)[i]);
    }
}
double rel_tol(nb_dtype dt) {
    switch (dt) {
    case NB_F64: return 1e-12;
    case NB_F32: return 4e-6;
    case NB_F16: return 1.0 / 1024;
    default: return 1.0 / 128;
    }
}
bool close(double a, double b, double rel, double abs_tol) {
    if (a != a || b != b) return a != a && b != b;
    if (a == b) return true;
    return fabs(a - b) <= rel * fabs(b) + abs_tol;
}

// ---- the GPU's order on the host ---------------------------------------------------------------
// The per-position losses and lse (cross entropy) or losses (NLL), as the kernels write them.
template <typename T>
void emulate_positions(const nb__cls_operands *a, bool ce, double *loss, acc_t<T> *lse) {
    using A = acc_t<T>;
    const int64_t P = a->N * a->D;
    const T *x = (const T *)a->x;
    if (!ce) {
        for (int64_t p = 0; p < P; p++) loss[p] = nll_pos<T>(a, p);
        return;
    }
    std::vector<sm_acc<A>> acc(256);
    std::vector<double> sc(256), sx(256);
    for (int64_t p = 0; p < P; p++) {
        int64_t t = ce_tgt(a, p), n = p / a->D, d = p - n * a->D;
        if (!ce_valid(a, t)) {
            bool ig = ce_ignored(a, t);
            loss[p] = ig ? 0.0 : (double)NAN;
            lse[p] = ig ? (A)0 : (A)NAN;
            continue;
        }
        if (!ce_use_rows(a)) {
            ce_col<T>(a, x + n * a->C * a->D + d, t, loss + p, lse + p);
            continue;
        }
        const T *xr = x + n * a->C;
        A M = (A)-INFINITY;
        for (int th = 0; th < 256; th++) {
            acc[th] = sm_row_thread<T>(xr, a->C, th, 256);
            M = acc[th].m > M ? acc[th].m : M;
        }
        for (int th = 0; th < 256; th++) sc[th] = sm_scaled(acc[th], M), sx[th] = acc[th].sx;
        double S = sm_total(host_block_sum(sc.data(), 256), M);
        double SX = host_block_sum(sx.data(), 256);
        ce_row_result<T>(a, xr, t, M, S, SX, loss + p, lse + p);
    }
}

// cls_finish_kernel on the host.
void emulate_finish(const nb__cls_operands *a, const double *loss, nb__loss_reduce red, void *out,
                    int64_t *count) {
    const int B = kFinishThreads;
    const int64_t P = a->N * a->D;
    std::vector<double> s(B, 0.0);
    std::vector<long long> k(B, 0);
    for (int th = 0; th < B; th++)
        for (int64_t p = th; p < P; p += B) {
            s[th] += loss[p];
            k[th] += ce_ignored(a, ce_tgt(a, p)) ? 0 : 1;
        }
    double total = host_block_sum(s.data(), B);
    long long cnt = host_block_sum(k.data(), B);
    if (red != NB__LOSS_NONE)
        ls_store(out, a->xdt, 0, red == NB__LOSS_SUM ? total : total / (double)cnt);
    if (count) *count = cnt;
}

template <typename T> void emulate_cls(const nb__cls_loss_args *a, bool ce) {
    const int64_t P = a->in.N * a->in.D;
    std::vector<double> loss((size_t)(P > 0 ? P : 1));
    emulate_positions<T>(&a->in, ce, loss.data(), (acc_t<T> *)a->lse);
    if (a->reduction == NB__LOSS_NONE) // the position kernels' cls_put
        for (int64_t p = 0; p < P; p++) cls_put(loss.data(), a->out, a->in.xdt, p, loss[p]);
    if (a->reduction != NB__LOSS_NONE || a->count)
        emulate_finish(&a->in, loss.data(), a->reduction, a->out, a->count);
}

template <typename T> void emulate_cls_backward(const nb__cls_loss_backward_args *a, bool ce) {
    const int64_t n = a->in.N * a->in.C * a->in.D, gs = a->reduction == NB__LOSS_NONE ? 1 : 0;
    double factor = cls_factor(a->reduction, a->count);
    if (ce && ce_use_rows(&a->in)) { // ce_bwd_row_kernel
        for (int64_t r = 0; r < a->in.N; r++)
            for (int64_t c = 0; c < a->in.C; c++)
                ce_bwd_at<T>(&a->in, (const acc_t<T> *)a->lse, a->g, gs, factor, (T *)a->dx, r, c,
                             0);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        if (ce)
            ce_bwd_elem<T>(&a->in, (const acc_t<T> *)a->lse, a->g, gs, factor, (T *)a->dx, i);
        else
            nll_bwd_elem<T>(&a->in, a->g, gs, factor, (T *)a->dx, i);
    }
}

// ---- class-index losses -------------------------------------------------------------------------
// Scores: mostly N(0, 2)-ish; row kind by n % 5: plain, large logits (+-1e4), some -inf
// entries, an ignored target, every score -inf (a NaN loss on both sides).
int run_cls(cuhost *t, bool ce, nb_dtype xdt, nb_dtype tdt, int64_t N, int64_t C, int64_t D,
            nb__loss_reduce red, double smoothing, bool has_ignore) {
    const int64_t n = N * C * D, P = N * D;
    const int es = nb__kh_dtype_size(xdt);
    std::vector<char> x((size_t)n * es);
    std::vector<int64_t> t64((size_t)P);
    std::vector<int32_t> t32((size_t)P);
    for (int64_t i = 0; i < n; i++) {
        int64_t row = i / (C * D);
        double v = (urand() - 0.5) * 4;
        if (row % 5 == 1) v = (urand() > 0.5 ? 1e4 : -1e4) + urand() * 20;
        if (row % 5 == 2 && urand() < 0.2) v = -INFINITY;
        if (row % 5 == 4 && ce) v = -INFINITY;
        ls_store(x.data(), xdt, i, v);
    }
    for (int64_t p = 0; p < P; p++) {
        int64_t row = p / D, tv = (int64_t)(urand() * C);
        if (row % 5 == 3 && has_ignore) tv = -100;
        if (row % 5 == 2) { // the target on a finite score
            int64_t at = (row * C + tv) * D + p % D;
            if (get(x.data(), xdt, at) == -INFINITY) ls_store(x.data(), xdt, at, 1.0);
        }
        t64[p] = tv, t32[p] = (int32_t)tv;
    }
    nb__cls_operands in = {
        x.data(), xdt,        N,
        C,        D,          tdt == NB_I64 ? (const void *)t64.data() : (const void *)t32.data(),
        tdt,      has_ignore, -100,
        smoothing};
    int64_t nout = red == NB__LOSS_NONE ? P : 1;
    const int les = xdt == NB_F64 ? 8 : 4;
    std::vector<char> oc((size_t)(nout + 1) * 8), og((size_t)(nout + 1) * 8),
        lc((size_t)(P + 1) * les), lg((size_t)(P + 1) * les);
    int64_t cc = -1, cg = -1;
    nb__cls_loss_args ac = {ce ? "cross_entropy" : "nll_loss", in, red, oc.data(),
                            ce ? lc.data() : nullptr,          &cc};
    nb__cls_loss_args ag = ac;
    ag.out = og.data(), ag.lse = ce ? lg.data() : nullptr, ag.count = &cg;
    nb_status st = ce ? cuhost_cpu()->cross_entropy(&ac) : cuhost_cpu()->nll_loss(&ac);
    CUHOST_CHECK(t, st == NB_OK, "cpu %s failed", ac.op);
    NB_DISPATCH_FLOAT(xdt, T, emulate_cls<T>(&ag, ce));
    int bad = 0;
    double rel = rel_tol(xdt);
    CUHOST_CHECK(t, cc == cg, "%s: count gpu %lld cpu %lld", ac.op, (long long)cg, (long long)cc);
    for (int64_t i = 0; i < nout && bad < 3; i++) {
        double vc = get(oc.data(), xdt, i), vg = get(og.data(), xdt, i);
        bool ok = close(vg, vc, rel, rel);
        bad += !ok;
        CUHOST_CHECK(t, ok,
                     "%s dtype %d t%d (%lld,%lld,%lld) red %d s %g: out[%lld] gpu %.9g cpu %.9g",
                     ac.op, (int)xdt, (int)tdt, (long long)N, (long long)C, (long long)D, (int)red,
                     smoothing, (long long)i, vg, vc);
    }
    if (ce)
        for (int64_t p = 0; p < P && bad < 3; p++) {
            double vc = les == 8 ? ((double *)lc.data())[p] : ((float *)lc.data())[p];
            double vg = les == 8 ? ((double *)lg.data())[p] : ((float *)lg.data())[p];
            bool ok = close(vg, vc, les == 8 ? 1e-13 : 1e-6, 1e-6);
            bad += !ok;
            CUHOST_CHECK(t, ok,
                         "cross_entropy dtype %d (%lld,%lld,%lld): lse[%lld] gpu %.9g cpu %.9g",
                         (int)xdt, (long long)N, (long long)C, (long long)D, (long long)p, vg, vc);
        }
    // Backward from the CPU forward's lse and count (the GPU's were compared above).
    std::vector<double> g((size_t)P);
    for (int64_t p = 0; p < P; p++) g[p] = urand() + 0.5;
    std::vector<char> dc((size_t)n * es), dg((size_t)n * es);
    nb__cls_loss_backward_args bc = {in, red, ce ? lc.data() : nullptr, &cc, g.data(), dc.data()};
    nb__cls_loss_backward_args bg = bc;
    bg.dx = dg.data();
    st = ce ? cuhost_cpu()->cross_entropy_backward(&bc) : cuhost_cpu()->nll_loss_backward(&bc);
    CUHOST_CHECK(t, st == NB_OK, "cpu %s backward failed", ac.op);
    NB_DISPATCH_FLOAT(xdt, T, emulate_cls_backward<T>(&bg, ce));
    // dx = (p - onehot) * scale: errors scale with the scale, not with dx.
    double scale = red == NB__LOSS_MEAN && cc ? 1.5 / (double)cc : 1.5;
    for (int64_t i = 0; i < n && bad < 3; i++) {
        double vc = get(dc.data(), xdt, i), vg = get(dg.data(), xdt, i);
        bool ok = close(vg, vc, rel, rel * scale);
        bad += !ok;
        CUHOST_CHECK(
            t, ok, "%s_backward dtype %d (%lld,%lld,%lld) red %d s %g: dx[%lld] gpu %.9g cpu %.9g",
            ac.op, (int)xdt, (long long)N, (long long)C, (long long)D, (int)red, smoothing,
            (long long)i, vg, vc);
    }
    return bad;
}

// An out-of-range target: the CPU fails with NB_EINDEX; the kernels make the loss NaN
// (cuda/k_loss.cuh) and the backward's row zero.
void check_bad_target(cuhost *t) {
    float x[2 * 3] = {1, 2, 3, 4, 5, 6};
    int64_t tg[2] = {1, 7};
    nb__cls_operands in = {(const char *)x, NB_F32, 2, 3, 1, tg, NB_I64, false, -100, 0};
    float out = 0, lse[2];
    int64_t cnt = 0;
    nb__cls_loss_args a = {"cross_entropy", in, NB__LOSS_MEAN, &out, lse, &cnt};
    CUHOST_CHECK(t, cuhost_cpu()->cross_entropy(&a) == NB_EINDEX, "cpu accepts target 7 of 3");
    emulate_cls<float>(&a, true);
    CUHOST_CHECK(t, out != out && lse[1] != lse[1], "gpu loss %g for target 7 of 3", (double)out);
    float nll = 0;
    nb__cls_loss_args b = {"nll_loss", in, NB__LOSS_SUM, &nll, nullptr, nullptr};
    emulate_cls<float>(&b, false);
    CUHOST_CHECK(t, nll != nll, "gpu nll %g for target 7 of 3", (double)nll);
    // Every target ignored: a mean of NaN, a count of 0, a zero gradient.
    int64_t ig[2] = {-100, -100};
    in.target = ig, in.has_ignore = true;
    nb__cls_loss_args c = {"cross_entropy", in, NB__LOSS_MEAN, &out, lse, &cnt};
    cnt = -1;
    emulate_cls<float>(&c, true);
    CUHOST_CHECK(t, out != out && cnt == 0, "all ignored: gpu loss %g count %lld", (double)out,
                 (long long)cnt);
    double g = 1;
    float dx[6] = {1, 1, 1, 1, 1, 1};
    nb__cls_loss_backward_args d = {in, NB__LOSS_MEAN, lse, &cnt, &g, dx};
    emulate_cls_backward<float>(&d, true);
    bool zero = true;
    for (float v : dx) zero = zero && v == 0;
    CUHOST_CHECK(t, zero, "all ignored: the gradient is not zero");
}

// ---- bce ----------------------------------------------------------------------------------------
void emulate_bce(const nb__bce_args *a) {
    const nb__bce_operands *in = &a->in;
    const int64_t nb = bce_blocks(in->n);
    std::vector<double> part((size_t)nb), th(nbk::kThreads);
    for (int64_t b = 0; b < nb; b++) {
        for (int k = 0; k < nbk::kThreads; k++) {
            double s = 0;
            for (int64_t i = b * nbk::kThreads + k; i < in->n; i += nb * nbk::kThreads) {
                double v = bce_loss(in, i);
                if (a->reduction == NB__LOSS_NONE) bce_st((char *)a->out, in->ct, i, v);
                s += v;
            }
            th[k] = s;
        }
        part[b] = host_block_sum(th.data(), nbk::kThreads);
    }
    if (a->reduction == NB__LOSS_NONE) return;
    std::vector<double> v(kBcePartials, 0.0);
    for (int64_t b = 0; b < nb; b++) v[b] = part[b];
    double total = host_block_sum(v.data(), kBcePartials);
    ls_store(a->out, a->out_dt, 0, a->reduction == NB__LOSS_SUM ? total : total / (double)in->n);
}

int run_bce(cuhost *t, nb_dtype ct, int64_t n, int64_t period, nb__loss_reduce red,
            nb_dtype out_dt) {
    const int es = ct == NB_F64 ? 8 : 4;
    std::vector<char> x((size_t)n * es), y((size_t)n * es), pw((size_t)(period ? period : 1) * es),
        g((size_t)n * es);
    for (int64_t i = 0; i < n; i++) {
        double xv = (urand() - 0.5) * (i % 7 == 0 ? 80 : 8);
        bce_st(x.data(), ct, i, xv), bce_st(y.data(), ct, i, urand()),
            bce_st(g.data(), ct, i, urand() - 0.5);
    }
    for (int64_t i = 0; i < period; i++) bce_st(pw.data(), ct, i, 0.5 + urand() * 2);
    nb__bce_operands in = {x.data(), y.data(), period ? pw.data() : nullptr,
                           ct,       n,        period ? period : 1};
    int64_t nout = red == NB__LOSS_NONE ? n : 1;
    std::vector<char> oc((size_t)(nout + 1) * 8), og((size_t)(nout + 1) * 8);
    nb__bce_args ac = {in, red, oc.data(), red == NB__LOSS_NONE ? ct : out_dt};
    nb__bce_args ag = ac;
    ag.out = og.data();
    CUHOST_CHECK(t, cuhost_cpu()->bce_with_logits(&ac) == NB_OK, "cpu bce");
    emulate_bce(&ag);
    int bad = 0;
    double rel = rel_tol(ac.out_dt);
    for (int64_t i = 0; i < nout && bad < 3; i++) {
        double vc = get(oc.data(), ac.out_dt, i), vg = get(og.data(), ac.out_dt, i);
        bool ok = close(vg, vc, rel, 0);
        bad += !ok;
        CUHOST_CHECK(t, ok, "bce ct %d n %lld red %d: out[%lld] gpu %.12g cpu %.12g", (int)ct,
                     (long long)n, (int)red, (long long)i, vg, vc);
    }
    std::vector<char> b[6];
    for (auto &v : b) v.assign((size_t)n * es, 0);
    nb__bce_backward_args bc = {in,
                                g.data(),
                                red == NB__LOSS_NONE ? 1 : 0,
                                red == NB__LOSS_MEAN ? 1.0 / (double)n : 1.0,
                                b[0].data(),
                                b[1].data(),
                                period ? b[2].data() : nullptr};
    nb__bce_backward_args bg = bc;
    bg.dx = b[3].data(), bg.dy = b[4].data(), bg.dpw = period ? b[5].data() : nullptr;
    CUHOST_CHECK(t, cuhost_cpu()->bce_with_logits_backward(&bc) == NB_OK, "cpu bce backward");
    for (int64_t i = 0; i < n; i++) bce_grads(&bg, i);
    for (int k = 0; k < 3 && bad < 3; k++)
        for (int64_t i = 0; i < n && bad < 3; i++) {
            double vc = get(b[k].data(), ct, i), vg = get(b[k + 3].data(), ct, i);
            bool ok = close(vg, vc, ct == NB_F64 ? 1e-13 : 1e-7, 1e-30);
            bad += !ok;
            CUHOST_CHECK(t, ok, "bce backward ct %d grad %d [%lld]: gpu %.12g cpu %.12g", (int)ct,
                         k, (long long)i, vg, vc);
        }
    return bad;
}

} // namespace

void cuhost_loss(cuhost *t) {
    int fails = 0;
    const nb_dtype fdts[] = {NB_F32, NB_F64, NB_F16, NB_BF16};
    const nb__loss_reduce reds[] = {NB__LOSS_MEAN, NB__LOSS_SUM, NB__LOSS_NONE};
    for (nb_dtype xdt : fdts)
        for (nb__loss_reduce red : reds) {
            nb_dtype tdt = red == NB__LOSS_SUM ? NB_I32 : NB_I64;
            for (double s : {0.0, 0.1}) {
                fails += run_cls(t, true, xdt, tdt, 23, 1000, 1, red, s, true);
                fails += run_cls(t, true, xdt, tdt, 7, 5, 9, red, s, true);
            }
            fails += run_cls(t, true, xdt, tdt, 5, 50304, 1, red, 0.0, false);
            fails += run_cls(t, true, xdt, tdt, 2100, 3, 1, red, 0.0, true); // > 1024 positions
            fails += run_cls(t, false, xdt, tdt, 23, 100, 1, red, 0.0, true);
            fails += run_cls(t, false, xdt, tdt, 4, 6, 11, red, 0.0, false);
        }
    check_bad_target(t);
    for (nb_dtype ct : {NB_F32, NB_F64})
        for (nb__loss_reduce red : reds) {
            fails += run_bce(t, ct, 1000, 0, red, ct);
            fails += run_bce(t, ct, 300000, 10, red, red == NB__LOSS_NONE ? ct : NB_F32);
        }
    CUHOST_CHECK(t, fails == 0, "%d loss outputs differ", fails);
}
