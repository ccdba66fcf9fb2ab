// tests/cuda_host/matmul.cu - host checks of the CUDA gemm's row-major -> column-major
// mapping (cuda/k_matmul.h), compiled by nvcc and compared with the CPU backend. No GPU
// needed: cuBLASLt creates its descriptors and layouts without a device (only the handle,
// the heuristic and the matmul need one).
//
// For each case (dtypes, transposes, padded leading dimensions, batches that fold into
// one strided batch, broadcast operands, batches that do not fold, bias, alpha/beta):
//   1. nb__lt_plan_of and nb__lt_descs_new build the descriptors k_matmul.c would use;
//   2. the descriptors' attributes are read back from cuBLASLt and a column-major GEMM is
//      computed on the host from them alone, as cublasLtMatmul defines it (D = alpha op(A)
//      op(B) + beta C, strided batches, bias per row of D), over the host loop of the plan
//      with k_matmul.c's operand order (cuBLASLt's A = the args' b);
//   3. the result must equal the CPU backend's gemm on the same args bit for bit (the
//      operands are multiples of 1/8 in [-1, 1], so every sum is exact).
// The bias pairing cuBLASLt documents (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: the bias in the
// output's type) holds for every plan with a bias: a bf16 result takes k_matmul.c's bf16
// copy of the f32 bias (bias_bf16), never the f32 bias itself.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cuda/k_matmul.h"
#include "cuda/khelp.h"
#include "cuhost.h"
#include "tensor/backend_table.h"

namespace {

template <typename V> V attr_layout(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a) {
    V v{};
    size_t w = 0;
    (void)cublasLtMatrixLayoutGetAttribute(l, a, &v, sizeof v, &w);
    return v;
}
template <typename V> V attr_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a) {
    V v{};
    size_t w = 0;
    (void)cublasLtMatmulDescGetAttribute(d, a, &v, sizeof v, &w);
    return v;
}

struct lay {
    int32_t type;
    uint64_t rows, cols;
    int64_t ld, stride;
    int32_t batch;
};
lay read_layout(cublasLtMatrixLayout_t l) {
    lay r;
    r.type = attr_layout<int32_t>(l, CUBLASLT_MATRIX_LAYOUT_TYPE);
    r.rows = attr_layout<uint64_t>(l, CUBLASLT_MATRIX_LAYOUT_ROWS);
    r.cols = attr_layout<uint64_t>(l, CUBLASLT_MATRIX_LAYOUT_COLS);
    r.ld = attr_layout<int64_t>(l, CUBLASLT_MATRIX_LAYOUT_LD);
    r.batch = attr_layout<int32_t>(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT);
    r.stride = attr_layout<int64_t>(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET);
    return r;
}

double ld_el(const void *p, int32_t type, int64_t i) {
    switch (type) {
    case CUDA_R_32F: return ((const float *)p)[i];
    case CUDA_R_64F: return ((const double *)p)[i];
    case CUDA_R_16BF: return nb__kh_f32_from_bf16(((const uint16_t *)p)[i]);
    default: return NAN;
    }
}
void st_el(void *p, int32_t type, int64_t i, double v) {
    switch (type) {
    case CUDA_R_32F: ((float *)p)[i] = (float)v; break;
    case CUDA_R_64F: ((double *)p)[i] = v; break;
    case CUDA_R_16BF: ((uint16_t *)p)[i] = nb__kh_bf16_from_f32((float)v); break;
    default: break;
    }
}

// Element (r, c) of op(X) for a column-major stored X.
double op_el(const void *x, const lay &l, cublasOperation_t op, int64_t r, int64_t c) {
    return op == CUBLAS_OP_N ? ld_el(x, l.type, r + c * l.ld) : ld_el(x, l.type, c + r * l.ld);
}

// cublasLtMatmul as its documentation defines it, from the descriptors only (sums in
// double: exact for these operands). Returns false on an inconsistent descriptor.
bool emulate_lt(const nb__lt_descs &d, double alpha, double beta, const void *A, const void *B,
                void *C, const void *bias) {
    lay la = read_layout(d.a), lb = read_layout(d.b), lc = read_layout(d.c);
    cublasOperation_t ta = attr_desc<cublasOperation_t>(d.op, CUBLASLT_MATMUL_DESC_TRANSA);
    cublasOperation_t tb = attr_desc<cublasOperation_t>(d.op, CUBLASLT_MATMUL_DESC_TRANSB);
    cublasLtEpilogue_t ep = attr_desc<cublasLtEpilogue_t>(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE);
    int32_t bias_type = attr_desc<int32_t>(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE);
    uint64_t m = lc.rows, n = lc.cols;
    uint64_t ka = ta == CUBLAS_OP_N ? la.cols : la.rows, ma = ta == CUBLAS_OP_N ? la.rows : la.cols;
    uint64_t kb = tb == CUBLAS_OP_N ? lb.rows : lb.cols, nb = tb == CUBLAS_OP_N ? lb.cols : lb.rows;
    if (ma != m || nb != n || ka != kb || la.batch != lc.batch || lb.batch != lc.batch)
        return false;
    if (lc.ld < (int64_t)m || la.ld < (int64_t)la.rows || lb.ld < (int64_t)lb.rows) return false;
    int32_t batch = lc.batch < 1 ? 1 : lc.batch;
    size_t esa = la.type == CUDA_R_16BF ? 2 : la.type == CUDA_R_64F ? 8 : 4;
    size_t esc = lc.type == CUDA_R_16BF ? 2 : lc.type == CUDA_R_64F ? 8 : 4;
    for (int32_t bi = 0; bi < batch; bi++) {
        const char *a = (const char *)A + bi * la.stride * (int64_t)esa;
        const char *b = (const char *)B + bi * lb.stride * (int64_t)esa;
        char *c = (char *)C + bi * lc.stride * (int64_t)esc;
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) {
                double s = 0;
                for (uint64_t k = 0; k < ka; k++)
                    s += op_el(a, la, ta, (int64_t)i, (int64_t)k) *
                         op_el(b, lb, tb, (int64_t)k, (int64_t)j);
                double v = alpha * s;
                if (beta != 0.0) v += beta * ld_el(c, lc.type, (int64_t)(i + j * lc.ld));
                if (ep == CUBLASLT_EPILOGUE_BIAS) v += ld_el(bias, bias_type, (int64_t)i);
                st_el(c, lc.type, (int64_t)(i + j * lc.ld), v);
            }
    }
    return true;
}

struct gcase {
    const char *name;
    nb_dtype dtype;
    bool c_bf16, ta, tb, bias;
    int64_t M, N, K, pad; // pad: extra elements per row (lda, ldb, ldc)
    double alpha, beta;
    int nd;
    int64_t shape[3];
    int bcast_a, bcast_b; // batch dim broadcast for a / b (-1: none)
    int64_t gap;          // extra elements after the inner batch dim (0: the batch folds)
    int64_t want_ncalls;  // -1: do not check
    int32_t want_batch;
};

uint32_t g_rng = 12345;
double rnd8() { // a multiple of 1/8 in [-1, 1]
    g_rng = g_rng * 1664525u + 1013904223u;
    return (double)((int)((g_rng >> 16) % 17) - 8) / 8.0;
}

void fill(std::vector<unsigned char> &buf, int32_t type, int64_t n) {
    for (int64_t i = 0; i < n; i++) st_el(buf.data(), type, i, rnd8());
}

void run_case(cuhost *t, const gcase &cs) {
    nb__gemm_args g;
    memset(&g, 0, sizeof g);
    g.dtype = cs.dtype;
    g.c_bf16 = cs.c_bf16;
    g.trans_a = cs.ta, g.trans_b = cs.tb;
    g.M = cs.M, g.N = cs.N, g.K = cs.K;
    g.alpha = cs.alpha, g.beta = cs.beta;
    g.lda = (cs.ta ? cs.M : cs.K) + cs.pad;
    g.ldb = (cs.tb ? cs.K : cs.N) + cs.pad;
    g.ldc = cs.N + cs.pad;
    int64_t ma = (cs.ta ? cs.K : cs.M) * g.lda, mb = (cs.tb ? cs.N : cs.K) * g.ldb;
    int64_t mc = cs.M * g.ldc;
    g.batch_ndim = cs.nd;
    int64_t na = ma, nbb = mb, nc = mc;
    for (int d = cs.nd - 1; d >= 0; d--) {
        g.batch_shape[d] = cs.shape[d];
        g.batch_stride_a[d] = cs.bcast_a == d ? 0 : na;
        g.batch_stride_b[d] = cs.bcast_b == d ? 0 : nbb;
        g.batch_stride_c[d] = nc;
        if (cs.bcast_a != d) na *= cs.shape[d];
        if (cs.bcast_b != d) nbb *= cs.shape[d];
        nc *= cs.shape[d];
        if (d == cs.nd - 1) na += cs.gap, nbb += cs.gap, nc += cs.gap;
    }
    int32_t tab = cs.dtype == NB_F64 ? CUDA_R_64F : cs.dtype == NB_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    int32_t tc = cs.dtype == NB_F64 ? CUDA_R_64F : cs.c_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    size_t esab = tab == CUDA_R_64F ? 8 : tab == CUDA_R_16BF ? 2 : 4;
    size_t esc = tc == CUDA_R_64F ? 8 : tc == CUDA_R_16BF ? 2 : 4;
    int32_t tbias = cs.dtype == NB_F64 ? CUDA_R_64F : CUDA_R_32F;
    std::vector<unsigned char> A(na * esab), B(nbb * esab), C0(nc * esc), bias(cs.N * 8);
    fill(A, tab, na);
    fill(B, tab, nbb);
    fill(C0, tc, nc);
    fill(bias, tbias, cs.N);
    std::vector<unsigned char> Ccpu = C0;
    g.a = A.data(), g.b = B.data(), g.bias = cs.bias ? bias.data() : NULL;

    g.c = Ccpu.data();
    nb_status st = cuhost_cpu()->gemm(&g);
    CUHOST_CHECK(t, st == NB_OK, "%s: CPU gemm: status %d", cs.name, (int)st);
    // the plan k_matmul.c tries first, and its fallbacks where they apply
    const unsigned flag_sets[3] = {0, NB__LT_FILL_BIAS, NB__LT_NO_FOLD};
    for (unsigned flags : flag_sets) {
        if (flags == NB__LT_FILL_BIAS && (!cs.bias || cs.beta != 1.0)) continue;
        if (flags == NB__LT_NO_FOLD && cs.nd == 0) continue;
        nb__lt_plan p;
        st = nb__lt_plan_of(&g, flags, &p);
        CUHOST_CHECK(t, st == NB_OK, "%s (flags %u): plan: status %d", cs.name, flags, (int)st);
        if (st != NB_OK) continue;
        if (cs.want_ncalls >= 0 && flags == 0)
            CUHOST_CHECK(t, p.ncalls == cs.want_ncalls && p.batch == cs.want_batch,
                         "%s: %lld calls of batch %d, want %lld of %d", cs.name,
                         (long long)p.ncalls, (int)p.batch, (long long)cs.want_ncalls,
                         (int)cs.want_batch);
        if (flags == NB__LT_NO_FOLD) CUHOST_CHECK(t, p.batch == 1, "%s: no fold", cs.name);
        nb__lt_descs d;
        st = nb__lt_descs_new(&p, &d);
        CUHOST_CHECK(t, st == NB_OK, "%s (flags %u): descriptors: status %d", cs.name, flags,
                     (int)st);
        if (st != NB_OK) continue;
        CUHOST_CHECK(t,
                     attr_desc<int32_t>(d.op, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE) ==
                         (cs.dtype == NB_F64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F),
                     "%s: compute type", cs.name);
        CUHOST_CHECK(t, read_layout(d.a).type == tab && read_layout(d.c).type == tc,
                     "%s: operand types", cs.name);
        // the bias k_matmul.c hands cuBLASLt: g's, or for a bf16 C its bf16 copy (bias_for)
        CUHOST_CHECK(t, p.bias_bf16 == (cs.bias && cs.beta == 1.0 && cs.c_bf16),
                     "%s (flags %u): bias_bf16 %d", cs.name, flags, (int)p.bias_bf16);
        std::vector<unsigned char> bias16(cs.N * 2);
        for (int64_t j = 0; j < cs.N; j++)
            st_el(bias16.data(), CUDA_R_16BF, j, ld_el(bias.data(), tbias, j)); // rounds
        const void *lt_bias = p.bias_bf16 ? (const void *)bias16.data() : g.bias;
        int32_t lt_tbias = p.bias_bf16 ? (int32_t)CUDA_R_16BF : tbias;
        if (p.bias) // the documented pairing: the bias vector in the output's type
            CUHOST_CHECK(t,
                         attr_desc<int32_t>(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE) ==
                             (int32_t)read_layout(d.c).type,
                         "%s (flags %u): bias type %d, output type %d", cs.name, flags,
                         attr_desc<int32_t>(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE),
                         (int)read_layout(d.c).type);
        std::vector<unsigned char> Clt = C0;
        if (p.fill_bias) // k_matmul.c's set_c: the bias in every row of every C_i
            for (int64_t i = 0; i < p.ncalls; i++) {
                int64_t oa, ob, oc;
                nb__lt_call_offsets(&p, i, &oa, &ob, &oc);
                for (int32_t bi = 0; bi < p.batch; bi++)
                    for (int64_t r = 0; r < cs.M; r++)
                        for (int64_t j = 0; j < cs.N; j++)
                            st_el(Clt.data(), tc, oc + bi * p.stride_c + r * g.ldc + j,
                                  ld_el(lt_bias, lt_tbias, j));
            }
        // k_matmul.c's loop: cuBLASLt's A is the args' b, its B the args' a
        bool ok = true;
        for (int64_t i = 0; i < p.ncalls && ok; i++) {
            int64_t oa, ob, oc;
            nb__lt_call_offsets(&p, i, &oa, &ob, &oc);
            ok = emulate_lt(d, p.alpha, p.beta, B.data() + ob * esab, A.data() + oa * esab,
                            Clt.data() + oc * esc, lt_bias);
        }
        CUHOST_CHECK(t, ok, "%s: inconsistent descriptors", cs.name);
        int64_t bad = -1;
        for (int64_t i = 0; i < nc && bad < 0; i++)
            if (ld_el(Ccpu.data(), tc, i) != ld_el(Clt.data(), tc, i)) bad = i;
        CUHOST_CHECK(t, bad < 0, "%s (flags %u): element %lld: cuBLASLt mapping %g, CPU %g",
                     cs.name, flags, (long long)bad, bad < 0 ? 0.0 : ld_el(Clt.data(), tc, bad),
                     bad < 0 ? 0.0 : ld_el(Ccpu.data(), tc, bad));
        nb__lt_descs_free(&d);
    }
}

} // namespace

void cuhost_matmul(cuhost *t) {
    // clang-format off
    const gcase cases[] = {
        // name, dtype, c_bf16, ta, tb, bias (bools as 0/1), M, N, K, pad, alpha, beta, nd,
        // shape, bcast_a, bcast_b, gap, want_ncalls, want_batch
        {"nn", NB_F32, 0, 0, 0, 0, 5, 7, 3, 0, 1, 0, 0, {0}, -1, -1, 0, 1, 1},
        {"nt", NB_F32, 0, 0, 1, 0, 5, 7, 3, 2, 1, 0, 0, {0}, -1, -1, 0, 1, 1},
        {"tn", NB_F32, 0, 1, 0, 0, 4, 6, 9, 1, 0.5, 0, 0, {0}, -1, -1, 0, 1, 1},
        {"tt", NB_F32, 0, 1, 1, 0, 6, 3, 5, 3, 2, 0.5, 0, {0}, -1, -1, 0, 1, 1},
        {"beta1", NB_F32, 0, 0, 1, 0, 3, 4, 2, 0, 1, 1, 0, {0}, -1, -1, 0, 1, 1},
        {"f64 tn", NB_F64, 0, 1, 0, 0, 4, 5, 6, 2, -1, 0.25, 0, {0}, -1, -1, 0, 1, 1},
        {"bias (linear)", NB_F32, 0, 0, 1, 1, 6, 5, 4, 1, 1, 1, 0, {0}, -1, -1, 0, 1, 1},
        {"bias beta0", NB_F32, 0, 0, 1, 1, 3, 5, 4, 0, 1, 0, 0, {0}, -1, -1, 0, 1, 1},
        {"f64 bias", NB_F64, 0, 0, 1, 1, 3, 5, 4, 0, 1, 1, 0, {0}, -1, -1, 0, 1, 1},
        {"bf16", NB_BF16, 0, 0, 1, 0, 5, 6, 7, 0, 1, 0, 0, {0}, -1, -1, 0, 1, 1},
        {"bf16 bias", NB_BF16, 0, 1, 0, 1, 5, 6, 7, 2, 1, 1, 0, {0}, -1, -1, 0, 1, 1},
        {"bf16 -> bf16", NB_BF16, 1, 0, 0, 0, 4, 5, 6, 0, 1, 0, 0, {0}, -1, -1, 0, 1, 1},
        {"bf16 -> bf16 bias", NB_BF16, 1, 0, 1, 1, 4, 5, 6, 1, 1, 1, 0, {0}, -1, -1, 0, 1, 1},
        // batches
        {"batch 1-d", NB_F32, 0, 0, 0, 0, 3, 4, 5, 0, 1, 0, 1, {3}, -1, -1, 0, 1, 3},
        {"batch 2-d folds", NB_F32, 0, 1, 1, 0, 3, 4, 5, 1, 1, 0, 2, {2, 3}, -1, -1, 0, 1, 6},
        {"batch 3-d folds", NB_F64, 0, 0, 1, 0, 2, 3, 4, 0, 1, 0.5, 3, {2, 2, 3}, -1, -1, 0, 1, 12},
        {"batch gap", NB_F32, 0, 0, 0, 0, 3, 4, 5, 0, 1, 0, 2, {2, 3}, -1, -1, 7, 2, 3},
        {"broadcast b (inner)", NB_F32, 0, 0, 1, 0, 3, 4, 5, 0, 1, 0, 2, {2, 3}, -1, 1, 0, 2, 3},
        {"broadcast a (outer)", NB_F32, 0, 1, 0, 0, 3, 4, 5, 0, 1, 0, 2, {2, 3}, 0, -1, 0, 2, 3},
        {"size-1 dims", NB_F32, 0, 0, 0, 0, 3, 4, 5, 0, 1, 0, 3, {1, 4, 1}, -1, -1, 0, 1, 4},
        {"bf16 batch bias", NB_BF16, 0, 0, 1, 1, 3, 4, 5, 0, 1, 1, 1, {3}, -1, -1, 0, 1, 3},
        {"bf16 -> bf16 batch", NB_BF16, 1, 1, 0, 0, 3, 4, 5, 2, 1, 0, 2, {2, 2}, 1, -1, 0, 2, 2},
    };
    // clang-format on
    for (const gcase &c : cases) run_case(t, c);

    // a batch whose C does not move (stride 0) never folds: the GEMMs run one by one
    nb__gemm_args g;
    memset(&g, 0, sizeof g);
    g.dtype = NB_F32, g.M = 2, g.N = 2, g.K = 2, g.lda = 2, g.ldb = 2, g.ldc = 2, g.alpha = 1;
    g.batch_ndim = 1, g.batch_shape[0] = 4, g.batch_stride_a[0] = 4;
    nb__lt_plan p;
    CUHOST_CHECK(t, nb__lt_plan_of(&g, 0, &p) == NB_OK && p.ncalls == 4 && p.batch == 1,
                 "C stride 0: %lld calls of batch %d", (long long)p.ncalls, (int)p.batch);
    // TF32 only when asked, and for f32 only
    CUHOST_CHECK(t,
                 nb__lt_plan_of(&g, NB__LT_TF32, &p) == NB_OK &&
                     p.compute == CUBLAS_COMPUTE_32F_FAST_TF32,
                 "tf32 compute type");
    // refused: a bias with another beta, f16 (the op converts it), a bf16 C with alpha
    g.bias = &g, g.beta = 0.5;
    CUHOST_CHECK(t, nb__lt_plan_of(&g, 0, &p) == NB_EUNSUPPORTED, "bias with beta 0.5");
    g.bias = NULL, g.beta = 0, g.dtype = NB_F16;
    CUHOST_CHECK(t, nb__lt_plan_of(&g, 0, &p) == NB_EDTYPE, "f16 refused");
    g.dtype = NB_BF16, g.c_bf16 = true, g.alpha = 2;
    CUHOST_CHECK(t, nb__lt_plan_of(&g, 0, &p) == NB_EINTERNAL, "bf16 C with alpha 2");
    // a bf16 C takes a bf16 copy of its f32 bias (cuBLASLt's documented bias type for a
    // bf16 output), through the epilogue or by copies; an f32 C takes the f32 bias as it is
    g.alpha = 1, g.beta = 1, g.bias = &g;
    CUHOST_CHECK(t,
                 nb__lt_plan_of(&g, 0, &p) == NB_OK && p.bias && p.bias_bf16 &&
                     p.bias_type == CUDA_R_16BF && p.c_type == CUDA_R_16BF,
                 "bf16 C with a bias: a bf16 bias");
    CUHOST_CHECK(t,
                 nb__lt_plan_of(&g, NB__LT_FILL_BIAS, &p) == NB_OK && p.fill_bias && p.bias_bf16,
                 "bf16 C: bias rows from the bf16 copy");
    g.c_bf16 = false;
    CUHOST_CHECK(t,
                 nb__lt_plan_of(&g, 0, &p) == NB_OK && p.bias && !p.bias_bf16 &&
                     p.bias_type == CUDA_R_32F && p.c_type == CUDA_R_32F,
                 "bf16 operands, f32 C: the f32 bias");
}
