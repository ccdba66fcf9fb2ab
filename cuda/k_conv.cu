// cuda/k_conv.cu - CUDA kernels of the conv family (tensor/kernels/conv.h): conv2d and
// pooling, forward and backward. Registered in the backend's table by nb__cuda_reg_conv
// (cuda/kernels.h). UNVERIFIED ON A GPU: no GPU was available where this was written; the
// per-element math (cuda/k_conv.cuh) is checked on the host against the CPU backend by
// tests/cuda_host/conv.cu.
//
// conv2d / conv2d_backward
//   f32: cuDNN when the plugin has it (cuda/cudnn.c: FP32 math, deterministic algorithms),
//        else - or when cuDNN offers no qualifying algorithm - im2col (one image at a time,
//        a kernel per entry of the column matrix) + the cuBLAS GEMM of cuda/blas.c per
//        group; the input gradient is a GEMM into a column-gradient matrix and a col2im
//        GATHER (each input element sums its taps in a fixed order: no atomics). The weight
//        gradient sums the images' GEMMs in image order (beta = 1 on one stream). With 16
//        groups or more (depthwise) the fallback runs the direct kernels instead.
//        NB_CUDA_CONV=im2col skips cuDNN (to test the fallback on a GPU).
//   bf16 (conv_bf16): through cuDNN's bf16 convolution (tensor cores, f32 sums, rounded
//        once) for the forward without bias and the input gradient; otherwise (a bias, the
//        weight gradient, no cuDNN) the operands are widened to f32 in scratch memory, the f32
//        path runs and each bf16 result is rounded once - the CPU's semantics either way (f32
//        products and sums, one rounding; with a bias y = round(conv + b)).
//   f64: direct kernels (one thread per output element, fixed summation order; the weight
//        gradient one thread per weight element summing over images and positions).
//   Bias: y += b by a kernel; its gradient one block per channel, summed in double in a
//        fixed tree (nb_block_sum): the same bits on every run.
// maxpool2d / avgpool2d / adaptive_avgpool2d (+ backward), f32 and f64: one thread per
//   output element forward; the backward is a gather (one thread per input element summing
//   the windows that hold it, in increasing output order - the CPU scatter's order), so it
//   needs no atomics whether windows overlap or not. The max pool's gather takes the windows'
//   saved argmax; an argmax outside its window (never written by the forward) is ignored.
#include <stdlib.h>
#include <string.h>

#include "cuda/conv_cudnn.h"
#include "cuda/cuda_impl.h"
#include "cuda/k_conv.cuh"
#include "cuda/kcommon.cuh"

using namespace nbk;
using namespace nbconv;

#define NB_GRID_LOOP(i, n)                                                                 \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);              \
         i += (int64_t)blockDim.x * gridDim.x)

// ---- pooling kernels ---------------------------------------------------------------------------
template <typename T>
__global__ void maxpool_fwd_k(nb__pool2d_geom g, const T *x, T *y, int32_t *idx) {
    int64_t L = g.OH * g.OW;
    NB_GRID_LOOP(i, g.planes * L) {
        int64_t p = i / L, l = i - p * L, oh = l / g.OW, ow = l - oh * g.OW;
        int32_t mi;
        y[i] = maxpool_at<T>(&g, x + p * g.H * g.W, oh, ow, &mi);
        if (idx) idx[i] = mi;
    }
}

template <typename T>
__global__ void maxpool_bwd_k(nb__pool2d_geom g, const T *gy, const int32_t *idx, T *gx) {
    int64_t HW = g.H * g.W, L = g.OH * g.OW;
    NB_GRID_LOOP(i, g.planes * HW) {
        int64_t p = i / HW, r = i - p * HW, h = r / g.W, w = r - h * g.W;
        gx[i] = maxpool_grad_at<T>(&g, gy + p * L, idx + p * L, h, w);
    }
}

template <typename T>
__global__ void avgpool_fwd_k(nb__pool2d_geom g, bool cip, const T *x, T *y) {
    int64_t L = g.OH * g.OW;
    NB_GRID_LOOP(i, g.planes * L) {
        int64_t p = i / L, l = i - p * L, oh = l / g.OW, ow = l - oh * g.OW;
        y[i] = avgpool_at<T>(&g, cip, x + p * g.H * g.W, oh, ow);
    }
}

template <typename T>
__global__ void avgpool_bwd_k(nb__pool2d_geom g, bool cip, const T *gy, T *gx) {
    int64_t HW = g.H * g.W, L = g.OH * g.OW;
    NB_GRID_LOOP(i, g.planes * HW) {
        int64_t p = i / HW, r = i - p * HW, h = r / g.W, w = r - h * g.W;
        gx[i] = avgpool_grad_at<T>(&g, cip, gy + p * L, h, w);
    }
}

template <typename T>
__global__ void adaptive_fwd_k(nb__pool2d_geom g, const T *x, T *y) {
    int64_t L = g.OH * g.OW;
    NB_GRID_LOOP(i, g.planes * L) {
        int64_t p = i / L, l = i - p * L, oh = l / g.OW, ow = l - oh * g.OW;
        y[i] = adaptive_at<T>(&g, x + p * g.H * g.W, oh, ow);
    }
}

template <typename T>
__global__ void adaptive_bwd_k(nb__pool2d_geom g, const T *gy, T *gx) {
    int64_t HW = g.H * g.W, L = g.OH * g.OW;
    NB_GRID_LOOP(i, g.planes * HW) {
        int64_t p = i / HW, r = i - p * HW, h = r / g.W, w = r - h * g.W;
        gx[i] = adaptive_grad_at<T>(&g, gy + p * L, h, w);
    }
}

// The pools take the compute dtypes f32 and f64 (tensor/kernels/conv.h).
static nb_status pool_dtype(nb_dtype dt, const char *op) {
    if (dt == NB_F32 || dt == NB_F64) return NB_OK;
    return nb__error(NB_EUNSUPPORTED, "%s: the cuda kernel does not handle dtype %d yet", op,
                     (int)dt);
}

static nb_status cuda_maxpool2d(const nb__pool2d_args *a) {
    nb_status st = pool_dtype(a->dtype, "maxpool2d");
    if (st != NB_OK) return st;
    int64_t n = a->g.planes * a->g.OH * a->g.OW;
    if (n == 0) return NB_OK;
    nb__cuda_kctx c;
    if ((st = nb__cuda_kbegin(&c, "maxpool2d")) != NB_OK) return st;
    if (a->dtype == NB_F64)
        maxpool_fwd_k<double><<<nb_blocks(n), kThreads, 0, c.stream>>>(
            a->g, (const double *)a->x, (double *)a->y, a->idx);
    else
        maxpool_fwd_k<float><<<nb_blocks(n), kThreads, 0, c.stream>>>(
            a->g, (const float *)a->x, (float *)a->y, a->idx);
    return nb__cuda_kend(&c, cudaGetLastError());
}

static nb_status cuda_maxpool2d_backward(const nb__pool2d_backward_args *a) {
    nb_status st = pool_dtype(a->dtype, "maxpool2d_backward");
    if (st != NB_OK) return st;
    int64_t n = a->g.planes * a->g.H * a->g.W;
    if (n == 0) return NB_OK;
    nb__cuda_kctx c;
    if ((st = nb__cuda_kbegin(&c, "maxpool2d_backward")) != NB_OK) return st;
    if (a->dtype == NB_F64)
        maxpool_bwd_k<double><<<nb_blocks(n), kThreads, 0, c.stream>>>(
            a->g, (const double *)a->gy, a->idx, (double *)a->gx);
    else
        maxpool_bwd_k<float><<<nb_blocks(n), kThreads, 0, c.stream>>>(
            a->g, (const float *)a->gy, a->idx, (float *)a->gx);
    return nb__cuda_kend(&c, cudaGetLastError());
}

static nb_status cuda_avgpool2d(const nb__pool2d_args *a) {
    nb_status st = pool_dtype(a->dtype, "avgpool2d");
    if (st != NB_OK) return st;
    int64_t n = a->g.planes * a->g.OH * a->g.OW;
    if (n == 0) return NB_OK;
    nb__cuda_kctx c;
    if ((st = nb__cuda_kbegin(&c, "avgpool2d")) != NB_OK) return st;
    if (a->dtype == NB_F64)
        avgpool_fwd_k<double><<<nb_blocks(n), kThreads, 0, c.stream>>>(
            a->g, a->count_include_pad, (const double *)a->x, (double *)a->y);
    else
        avgpool_fwd_k<float><<<nb_blocks(n), kThreads, 0, c.stream>>>(
            a->g, a->count_include_pad, (const float *)a->x, (float *)a->y);
    return nb__cuda_kend(&c, cudaGetLastError());
}

static nb_status cuda_avgpool2d_backward(const nb__pool2d_backward_args *a) {
    nb_status st = pool_dtype(a->dtype, "avgpool2d_backward");
    if (st != NB_OK) return st;
    int64_t n = a->g.planes * a->g.H * a->g.W;
    if (n == 0) return NB_OK;
    nb__cuda_kctx c;
    if ((st = nb__cuda_kbegin(&c, "avgpool2d_backward")) != NB_OK) return st;
    if (a->dtype == NB_F64)
        avgpool_bwd_k<double><<<nb_blocks(n), kThreads, 0, c.stream>>>(
            a->g, a->count_include_pad, (const double *)a->gy, (double *)a->gx);
    else
        avgpool_bwd_k<float><<<nb_blocks(n), kThreads, 0, c.stream>>>(
            a->g, a->count_include_pad, (const float *)a->gy, (float *)a->gx);
    return nb__cuda_kend(&c, cudaGetLastError());
}

static nb_status cuda_adaptive_avgpool2d(const nb__pool2d_args *a) {
    nb_status st = pool_dtype(a->dtype, "adaptive_avgpool2d");
    if (st != NB_OK) return st;
    int64_t n = a->g.planes * a->g.OH * a->g.OW;
    if (n == 0) return NB_OK;
    nb__cuda_kctx c;
    if ((st = nb__cuda_kbegin(&c, "adaptive_avgpool2d")) != NB_OK) return st;
    if (a->dtype == NB_F64)
        adaptive_fwd_k<double><<<nb_blocks(n), kThreads, 0, c.stream>>>(
            a->g, (const double *)a->x, (double *)a->y);
    else
        adaptive_fwd_k<float><<<nb_blocks(n), kThreads, 0, c.stream>>>(
            a->g, (const float *)a->x, (float *)a->y);
    return nb__cuda_kend(&c, cudaGetLastError());
}

static nb_status cuda_adaptive_avgpool2d_backward(const nb__pool2d_backward_args *a) {
    nb_status st = pool_dtype(a->dtype, "adaptive_avgpool2d_backward");
    if (st != NB_OK) return st;
    int64_t n = a->g.planes * a->g.H * a->g.W;
    if (n == 0) return NB_OK;
    nb__cuda_kctx c;
    if ((st = nb__cuda_kbegin(&c, "adaptive_avgpool2d_backward")) != NB_OK) return st;
    if (a->dtype == NB_F64)
        adaptive_bwd_k<double><<<nb_blocks(n), kThreads, 0, c.stream>>>(
            a->g, (const double *)a->gy, (double *)a->gx);
    else
        adaptive_bwd_k<float><<<nb_blocks(n), kThreads, 0, c.stream>>>(
            a->g, (const float *)a->gy, (float *)a->gx);
    return nb__cuda_kend(&c, cudaGetLastError());
}

// ---- convolution kernels ------------------------------------------------------------------------
template <typename T>
__global__ void im2col_k(nb__conv2d_geom g, const T *xn, T *col) {
    int64_t L = g.OH * g.OW;
    NB_GRID_LOOP(i, g.C * g.KH * g.KW * L) {
        int64_t r = i / L;
        col[i] = im2col_at<T>(&g, xn, r, i - r * L);
    }
}

template <typename T>
__global__ void col2im_k(nb__conv2d_geom g, const T *dcol, T *gxn) {
    int64_t HW = g.H * g.W;
    NB_GRID_LOOP(i, g.C * HW) {
        int64_t c = i / HW, r = i - c * HW, h = r / g.W;
        gxn[i] = col2im_at<T>(&g, dcol, c, h, r - h * g.W);
    }
}

// y (N, O, L) += b[o]
template <typename T>
__global__ void bias_add_k(nb__conv2d_geom g, const T *b, T *y) {
    int64_t L = g.OH * g.OW;
    NB_GRID_LOOP(i, g.N * g.O * L) y[i] += b[(i / L) % g.O];
}

// bf16 y = round(y32 + b) (b may be NULL): the CPU's f32 sum rounded once.
__global__ void bias_round_bf16_k(nb__conv2d_geom g, const float *y32, const float *b,
                                  uint16_t *y) {
    int64_t L = g.OH * g.OW;
    NB_GRID_LOOP(i, g.N * g.O * L) {
        float v = y32[i];
        if (b) v += b[(i / L) % g.O];
        y[i] = nb__kh_bf16_from_f32(v);
    }
}

__global__ void widen_bf16_k(const uint16_t *src, float *dst, int64_t n) {
    NB_GRID_LOOP(i, n) dst[i] = nb__kh_f32_from_bf16(src[i]);
}
__global__ void narrow_bf16_k(const float *src, uint16_t *dst, int64_t n) {
    NB_GRID_LOOP(i, n) dst[i] = nb__kh_bf16_from_f32(src[i]);
}

// gb[o] = the sum of gy[:, o, :] (one block per channel, kThreads threads, double sums).
template <typename T>
__global__ void bias_grad_k(nb__conv2d_geom g, const T *gy, T *gb) {
    __shared__ double scratch[32];
    for (int64_t o = blockIdx.x; o < g.O; o += gridDim.x) {
        double s = bias_grad_part<T>(&g, gy, o, threadIdx.x, blockDim.x);
        s = nb_block_sum<double>(s, scratch);
        if (threadIdx.x == 0) gb[o] = (T)s;
    }
}

template <typename T>
__global__ void conv_direct_k(nb__conv2d_geom g, const T *x, const T *w, const T *b, T *y) {
    int64_t L = g.OH * g.OW;
    NB_GRID_LOOP(i, g.N * g.O * L) {
        int64_t l = i % L, t = i / L, o = t % g.O, n = t / g.O, oh = l / g.OW;
        T v = conv_direct_at<T>(&g, x, w, n, o, oh, l - oh * g.OW);
        y[i] = b ? v + b[o] : v;
    }
}

template <typename T>
__global__ void conv_gx_direct_k(nb__conv2d_geom g, const T *w, const T *gy, T *gx) {
    int64_t HW = g.H * g.W;
    NB_GRID_LOOP(i, g.N * g.C * HW) {
        int64_t r = i % HW, t = i / HW, c = t % g.C, n = t / g.C, h = r / g.W;
        gx[i] = conv_gx_direct_at<T>(&g, w, gy, n, c, h, r - h * g.W);
    }
}

template <typename T>
__global__ void conv_gw_direct_k(nb__conv2d_geom g, const T *x, const T *gy, T *gw) {
    int64_t Cg = g.C / g.groups, KK = g.KH * g.KW;
    NB_GRID_LOOP(i, g.O * Cg * KK) {
        int64_t k = i % KK, t = i / KK, c = t % Cg, o = t / Cg;
        gw[i] = conv_gw_direct_at<T>(&g, x, gy, o, c, k / g.KW, k % g.KW);
    }
}

// ---- convolution drivers -----------------------------------------------------------------------
static int64_t numel_x(const nb__conv2d_geom *g) { return g->N * g->C * g->H * g->W; }
static int64_t numel_w(const nb__conv2d_geom *g) {
    return g->O * (g->C / g->groups) * g->KH * g->KW;
}
static int64_t numel_y(const nb__conv2d_geom *g) { return g->N * g->O * g->OH * g->OW; }

static bool is_pointwise(const nb__conv2d_geom *g) {
    return g->KH == 1 && g->KW == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

// NB_CUDA_CONV=im2col skips cuDNN (read at each call): the path of a plugin without cuDNN,
// so that one GPU run can test both (tests/test_cuda_conv.c).
static bool cudnn_skipped() {
    const char *e = getenv("NB_CUDA_CONV");
    return e && strcmp(e, "im2col") == 0;
}

// Without cuDNN, convolutions with this many groups or more (depthwise ones) run the direct
// kernels: im2col + GEMM would launch groups tiny GEMMs per image.
constexpr int64_t kDirectGroups = 16;

// The nabla stream behind c.stream (the thread's current stream on c's device), for the
// cuBLAS GEMMs of cuda/blas.c, so that they queue behind and before this call's kernels.
static nb_cuda_stream *gemm_stream(nb__cuda_kctx *c) {
    return nb__cuda_stream_for(c->device, c->what);
}

// f32 scratch of n elements (NULL + error when out of device memory).
static float *scratch_f32(nb__cuda_kctx *c, int64_t n) {
    return (float *)nb__cuda_kscratch(c, sizeof(float) * (size_t)(n > 0 ? n : 1));
}

// y = conv(x, w) without bias, every operand f32: cuDNN, else im2col + GEMM.
static nb_status conv_fwd_f32(nb__cuda_kctx *c, const nb__conv2d_geom *g, const float *x,
                              const float *w, float *y) {
    nb_status st =
        cudnn_skipped() ? NB_EUNSUPPORTED : nb__cudnn_conv2d_fwd(c, g, NB_F32, x, w, y);
    if (st != NB_EUNSUPPORTED) return st;
    if (g->groups >= kDirectGroups) {
        conv_direct_k<float><<<nb_blocks(numel_y(g)), kThreads, 0, c->stream>>>(*g, x, w, NULL,
                                                                               y);
        return NB_OK;
    }
    nb_cuda_stream *s = gemm_stream(c);
    if (!s) return nb_last_status();
    int64_t L = g->OH * g->OW, Og = g->O / g->groups, Kg = g->C / g->groups * g->KH * g->KW;
    bool pw = is_pointwise(g);
    float *col = pw ? NULL : scratch_f32(c, g->C * g->KH * g->KW * L);
    if (!pw && !col) return nb_last_status();
    st = NB_OK;
    for (int64_t n = 0; n < g->N && st == NB_OK; n++) {
        const float *xn = x + n * g->C * g->H * g->W, *B = xn;
        if (!pw) {
            im2col_k<float><<<nb_blocks(g->C * g->KH * g->KW * L), kThreads, 0, c->stream>>>(
                *g, xn, col);
            B = col;
        }
        for (int64_t gi = 0; gi < g->groups && st == NB_OK; gi++)
            st = nb__cuda_gemm_f32(false, false, Og, L, Kg, 1.0f, w + gi * Og * Kg, Kg,
                                   B + gi * Kg * L, L, 0.0f, y + (n * g->O + gi * Og) * L, L,
                                   s);
    }
    nb__cuda_kfree(col);
    return st;
}

// gx and/or gw (each NULL when not wanted), every operand f32.
static nb_status conv_bwd_f32(nb__cuda_kctx *c, const nb__conv2d_geom *g, const float *x,
                              const float *w, const float *gy, float *gx, float *gw) {
    nb_status st;
    bool cudnn = !cudnn_skipped();
    if (gx && cudnn) {
        st = nb__cudnn_conv2d_bwd_data(c, g, NB_F32, w, gy, gx);
        if (st == NB_OK) gx = NULL;
        else if (st != NB_EUNSUPPORTED) return st;
    }
    if (gw && cudnn) {
        st = nb__cudnn_conv2d_bwd_filter(c, g, NB_F32, x, gy, gw);
        if (st == NB_OK) gw = NULL;
        else if (st != NB_EUNSUPPORTED) return st;
    }
    if (!gx && !gw) return NB_OK;
    if (g->groups >= kDirectGroups) {
        if (gx)
            conv_gx_direct_k<float><<<nb_blocks(numel_x(g)), kThreads, 0, c->stream>>>(*g, w, gy,
                                                                                      gx);
        if (gw)
            conv_gw_direct_k<float><<<nb_blocks(numel_w(g)), kThreads, 0, c->stream>>>(*g, x, gy,
                                                                                      gw);
        return NB_OK;
    }
    nb_cuda_stream *s = gemm_stream(c);
    if (!s) return nb_last_status();
    int64_t L = g->OH * g->OW, Og = g->O / g->groups, Kg = g->C / g->groups * g->KH * g->KW;
    int64_t ncol = g->C * g->KH * g->KW * L;
    bool pw = is_pointwise(g);
    float *col = pw ? NULL : scratch_f32(c, ncol);
    if (!pw && !col) return nb_last_status();
    st = NB_OK;
    for (int64_t n = 0; n < g->N && st == NB_OK; n++) {
        const float *gyn = gy + n * g->O * L;
        if (gw) {
            // gw_g (Og x Kg) += gy_g (Og x L) @ col_g^T (L x Kg), images in order
            const float *B = x + n * g->C * g->H * g->W;
            if (!pw) {
                im2col_k<float><<<nb_blocks(ncol), kThreads, 0, c->stream>>>(*g, B, col);
                B = col;
            }
            for (int64_t gi = 0; gi < g->groups && st == NB_OK; gi++)
                st = nb__cuda_gemm_f32(false, true, Og, Kg, L, 1.0f, gyn + gi * Og * L, L,
                                       B + gi * Kg * L, L, n > 0 ? 1.0f : 0.0f,
                                       gw + gi * Og * Kg, Kg, s);
        }
        if (gx && st == NB_OK) {
            // dcol_g (Kg x L) = w_g^T (Kg x Og) @ gy_g (Og x L); pointwise: dcol is gx
            float *gxn = gx + n * g->C * g->H * g->W, *D = pw ? gxn : col;
            for (int64_t gi = 0; gi < g->groups && st == NB_OK; gi++)
                st = nb__cuda_gemm_f32(true, false, Kg, L, Og, 1.0f, w + gi * Og * Kg, Kg,
                                       gyn + gi * Og * L, L, 0.0f, D + gi * Kg * L, L, s);
            if (!pw && st == NB_OK)
                col2im_k<float><<<nb_blocks(numel_x(g) / (g->N > 0 ? g->N : 1)), kThreads, 0,
                                  c->stream>>>(*g, col, gxn);
        }
    }
    nb__cuda_kfree(col);
    return st;
}

static nb_status conv_dtype(nb_dtype dt, const char *op) {
    if (dt == NB_F32 || dt == NB_F64 || dt == NB_BF16) return NB_OK;
    return nb__error(NB_EUNSUPPORTED, "%s: the cuda kernel does not handle dtype %d yet", op,
                     (int)dt);
}

static nb_status cuda_conv2d(const nb__conv2d_args *a) {
    const nb__conv2d_geom *g = &a->g;
    nb_status st = conv_dtype(a->dtype, "conv2d");
    if (st != NB_OK) return st;
    int64_t ny = numel_y(g);
    if (ny == 0) return NB_OK;
    nb__cuda_kctx c;
    if ((st = nb__cuda_kbegin(&c, "conv2d")) != NB_OK) return st;
    if (a->dtype == NB_F64) {
        conv_direct_k<double><<<nb_blocks(ny), kThreads, 0, c.stream>>>(
            *g, (const double *)a->x, (const double *)a->w, (const double *)a->b,
            (double *)a->y);
    } else if (a->dtype == NB_F32) {
        st = conv_fwd_f32(&c, g, (const float *)a->x, (const float *)a->w, (float *)a->y);
        if (st == NB_OK && a->b)
            bias_add_k<float><<<nb_blocks(ny), kThreads, 0, c.stream>>>(*g, (const float *)a->b,
                                                                         (float *)a->y);
    } else if (!a->b && !cudnn_skipped() &&
               (st = nb__cudnn_conv2d_fwd(&c, g, NB_BF16, a->x, a->w, a->y)) !=
                   NB_EUNSUPPORTED) {
        // bf16 without bias through cuDNN's bf16 convolution (f32 sums, rounded once); st
        // says how it went
    } else { // bf16: widen, run f32, round once (with a bias: y = round(conv + b))
        st = NB_OK;
        int64_t nx = numel_x(g), nw = numel_w(g);
        float *x32 = scratch_f32(&c, nx), *w32 = x32 ? scratch_f32(&c, nw) : NULL;
        float *y32 = w32 ? scratch_f32(&c, ny) : NULL;
        if (!y32) {
            st = nb_last_status();
        } else {
            widen_bf16_k<<<nb_blocks(nx), kThreads, 0, c.stream>>>((const uint16_t *)a->x, x32,
                                                                   nx);
            widen_bf16_k<<<nb_blocks(nw), kThreads, 0, c.stream>>>((const uint16_t *)a->w, w32,
                                                                   nw);
            st = conv_fwd_f32(&c, g, x32, w32, y32);
            if (st == NB_OK)
                bias_round_bf16_k<<<nb_blocks(ny), kThreads, 0, c.stream>>>(
                    *g, y32, (const float *)a->b, (uint16_t *)a->y);
        }
        nb__cuda_kfree(y32);
        nb__cuda_kfree(w32);
        nb__cuda_kfree(x32);
    }
    cudaError_t e = cudaGetLastError();
    if (st != NB_OK) {
        nb__cuda_kend(&c, cudaSuccess);
        return st;
    }
    return nb__cuda_kend(&c, e);
}

static nb_status cuda_conv2d_backward(const nb__conv2d_backward_args *a) {
    const nb__conv2d_geom *g = &a->g;
    nb_status st = conv_dtype(a->dtype, "conv2d_backward");
    if (st != NB_OK) return st;
    if (!a->gx && !a->gw && !a->gb) return NB_OK;
    nb__cuda_kctx c;
    if ((st = nb__cuda_kbegin(&c, "conv2d_backward")) != NB_OK) return st;
    int64_t nx = numel_x(g), nw = numel_w(g), ny = numel_y(g);
    size_t es = a->dtype == NB_F64 ? sizeof(double) : sizeof(float); // of gw and gb
    cudaError_t e = cudaSuccess;
    if (g->N == 0 || ny == 0) {
        // nothing flows back: every wanted gradient is zero (gx is empty when N == 0)
        if (a->gw && e == cudaSuccess) e = cudaMemsetAsync(a->gw, 0, es * (size_t)nw, c.stream);
        if (a->gb && e == cudaSuccess) e = cudaMemsetAsync(a->gb, 0, es * (size_t)g->O, c.stream);
        if (a->gx && nx > 0 && e == cudaSuccess)
            e = cudaMemsetAsync(a->gx, 0, (a->dtype == NB_BF16 ? 2 : es) * (size_t)nx, c.stream);
        return nb__cuda_kend(&c, e);
    }
    unsigned bias_blocks = (unsigned)(g->O < 65535 ? g->O : 65535);
    if (a->dtype == NB_F64) {
        const double *x = (const double *)a->x, *w = (const double *)a->w,
                     *gy = (const double *)a->gy;
        if (a->gx)
            conv_gx_direct_k<double><<<nb_blocks(nx), kThreads, 0, c.stream>>>(*g, w, gy,
                                                                                (double *)a->gx);
        if (a->gw)
            conv_gw_direct_k<double><<<nb_blocks(nw), kThreads, 0, c.stream>>>(*g, x, gy,
                                                                                (double *)a->gw);
        if (a->gb)
            bias_grad_k<double><<<bias_blocks, kThreads, 0, c.stream>>>(*g, gy, (double *)a->gb);
    } else if (a->dtype == NB_F32) {
        st = conv_bwd_f32(&c, g, (const float *)a->x, (const float *)a->w,
                          (const float *)a->gy, (float *)a->gx, (float *)a->gw);
        if (st == NB_OK && a->gb)
            bias_grad_k<float><<<bias_blocks, kThreads, 0, c.stream>>>(*g, (const float *)a->gy,
                                                                        (float *)a->gb);
    } else { // bf16 x, w, gy, gx; f32 gw, gb
        void *gx = a->gx; // still to compute
        if (gx && !cudnn_skipped()) {
            // the input gradient through cuDNN's bf16 convolution (f32 sums, rounded once)
            st = nb__cudnn_conv2d_bwd_data(&c, g, NB_BF16, a->w, a->gy, gx);
            if (st == NB_OK) gx = NULL;
            else if (st == NB_EUNSUPPORTED) st = NB_OK;
        }
        bool need = st == NB_OK && (gx || a->gw || a->gb);
        float *gy32 = need ? scratch_f32(&c, ny) : NULL;
        float *x32 = gy32 && a->gw ? scratch_f32(&c, nx) : NULL;
        float *w32 = gy32 && gx ? scratch_f32(&c, nw) : NULL;
        float *gx32 = gy32 && gx ? scratch_f32(&c, nx) : NULL;
        if (!need) {
            // done (or failed: st)
        } else if (!gy32 || (a->gw && !x32) || (gx && (!w32 || !gx32))) {
            st = nb_last_status();
        } else {
            widen_bf16_k<<<nb_blocks(ny), kThreads, 0, c.stream>>>((const uint16_t *)a->gy,
                                                                   gy32, ny);
            if (x32)
                widen_bf16_k<<<nb_blocks(nx), kThreads, 0, c.stream>>>((const uint16_t *)a->x,
                                                                       x32, nx);
            if (w32)
                widen_bf16_k<<<nb_blocks(nw), kThreads, 0, c.stream>>>((const uint16_t *)a->w,
                                                                       w32, nw);
            st = conv_bwd_f32(&c, g, x32, w32, gy32, gx32, (float *)a->gw);
            if (st == NB_OK && gx32)
                narrow_bf16_k<<<nb_blocks(nx), kThreads, 0, c.stream>>>(gx32, (uint16_t *)gx,
                                                                        nx);
            if (st == NB_OK && a->gb)
                bias_grad_k<float><<<bias_blocks, kThreads, 0, c.stream>>>(*g, gy32,
                                                                            (float *)a->gb);
        }
        nb__cuda_kfree(gx32);
        nb__cuda_kfree(w32);
        nb__cuda_kfree(x32);
        nb__cuda_kfree(gy32);
    }
    e = cudaGetLastError();
    if (st != NB_OK) {
        nb__cuda_kend(&c, cudaSuccess);
        return st;
    }
    return nb__cuda_kend(&c, e);
}

// The argument structs this file reads field by field (tensor/kernels/conv.h).
static_assert(sizeof(nb__conv2d_geom) == 16 * sizeof(int64_t), "nb__conv2d_geom changed");
static_assert(sizeof(nb__pool2d_geom) == 11 * sizeof(int64_t), "nb__pool2d_geom changed");
static_assert(offsetof(nb__pool2d_args, x) == sizeof(nb__pool2d_geom) + 8,
              "nb__pool2d_args changed");

extern "C" void nb__cuda_reg_conv(nb__backend *be) {
    be->k.conv2d = cuda_conv2d;
    be->k.conv2d_backward = cuda_conv2d_backward;
    be->k.maxpool2d = cuda_maxpool2d;
    be->k.maxpool2d_backward = cuda_maxpool2d_backward;
    be->k.avgpool2d = cuda_avgpool2d;
    be->k.avgpool2d_backward = cuda_avgpool2d_backward;
    be->k.adaptive_avgpool2d = cuda_adaptive_avgpool2d;
    be->k.adaptive_avgpool2d_backward = cuda_adaptive_avgpool2d_backward;
    // bf16 runs in both paths (cuDNN and im2col + GEMM) with the CPU's semantics: the
    // operands widened to f32 on the device, each bf16 result rounded once.
    be->conv_bf16 = true;
}
