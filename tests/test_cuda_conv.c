/* test_cuda_conv.c - the cuda suite's conv-family case: the CUDA backend's conv2d,
 * conv2d_backward and pool kernels (cuda/k_conv.cu) called directly through the kernel
 * table on device buffers, against the CPU backend's kernels on the same arguments, and run
 * twice to see the same bytes (determinism). Both conv paths: cuDNN (when the plugin has it)
 * and, with NB_CUDA_CONV=im2col, the im2col + GEMM / direct path. Needs a GPU: without one
 * (this machine) the case returns at once; the same math is checked on the host by
 * tests/cuda_host/conv.cu. Registered by nb_suite_cuda. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/backend.h"
#include "nabla/cuda.h"
#include "tensor/backend.h"
#include "testutil.h"

/* ---- device buffers ------------------------------------------------------------------------ */
static void *dev_copy(const void *host, size_t bytes) {
    void *d = nb_cuda_alloc(bytes ? bytes : 1, 0);
    ck_assert_msg(d, "cuda_alloc of %zu bytes: %s", bytes, nb_last_error());
    if (host && bytes)
        ck_assert_msg(nb_cuda_memcpy_h2d(d, host, bytes) == NB_OK, "h2d: %s", nb_last_error());
    return d;
}

static void *host_copy(const void *dev, size_t bytes) {
    void *h = malloc(bytes ? bytes : 1);
    ck_assert(h);
    if (bytes)
        ck_assert_msg(nb_cuda_memcpy_d2h(h, dev, bytes) == NB_OK, "d2h: %s", nb_last_error());
    return h;
}

static size_t esize(nb_dtype dt) { return dt == NB_F64 ? 8 : dt == NB_BF16 ? 2 : 4; }

/* n random values in [-1, 1) stored as dt (bf16 rounded to nearest even). */
static void *host_random(int64_t n, nb_dtype dt, uint64_t seed) {
    double *d = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    void *out = malloc(esize(dt) * (size_t)(n > 0 ? n : 1));
    ck_assert(d && out);
    tu_fill_uniform(d, n, -1, 1, seed);
    for (int64_t i = 0; i < n; i++) {
        if (dt == NB_F64) ((double *)out)[i] = d[i];
        else if (dt == NB_F32) ((float *)out)[i] = (float)d[i];
        else ((uint16_t *)out)[i] = nb_f32_to_bf16((float)d[i]);
    }
    free(d);
    return out;
}

static double value_at(const void *p, nb_dtype dt, int64_t i) {
    if (dt == NB_F64) return ((const double *)p)[i];
    if (dt == NB_F32) return ((const float *)p)[i];
    return nb_bf16_to_f32(((const uint16_t *)p)[i]);
}

/* got (from the GPU) within rel * max|ref| of ref (the CPU's), element by element. */
static void expect_close(const void *got, const void *ref, nb_dtype dt, int64_t n, double rel,
                         const char *what) {
    double scale = 1e-30;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(value_at(ref, dt, i)));
    for (int64_t i = 0; i < n; i++) {
        double a = value_at(got, dt, i), b = value_at(ref, dt, i);
        ck_assert_msg(fabs(a - b) <= rel * scale, "%s[%lld]: cuda %.9g, cpu %.9g (scale %.3g)",
                      what, (long long)i, a, b, scale);
    }
}

/* ---- convolution ----------------------------------------------------------------------------- */
typedef struct conv_case {
    int64_t N, C, H, W, O, KH, KW, sh, sw, ph, pw, dh, dw, groups;
} conv_case;

static nb__conv2d_geom conv_geom(const conv_case *k) {
    nb__conv2d_geom g = {k->N, k->C, k->H, k->W, k->O, k->KH, k->KW, 0, 0,
                         k->sh, k->sw, k->ph, k->pw, k->dh, k->dw, k->groups};
    g.OH = (k->H + 2 * k->ph - (k->dh * (k->KH - 1) + 1)) / k->sh + 1;
    g.OW = (k->W + 2 * k->pw - (k->dw * (k->KW - 1) + 1)) / k->sw + 1;
    return g;
}

/* One geometry and dtype: forward and backward on the GPU (twice) and on the CPU. */
static void conv_case_run(const nb__kernels *gpu, const nb__conv2d_geom *g, nb_dtype dt,
                          bool bias, const char *path) {
    const nb__kernels *cpu = &nb__cpu_backend()->k;
    int64_t nx = g->N * g->C * g->H * g->W, nw = g->O * (g->C / g->groups) * g->KH * g->KW;
    int64_t ny = g->N * g->O * g->OH * g->OW;
    size_t es = esize(dt), ps = dt == NB_F64 ? 8 : 4; /* operands; f32 bias and grads of bf16 */
    nb_dtype pdt = dt == NB_F64 ? NB_F64 : NB_F32;
    void *x = host_random(nx, dt, 1), *w = host_random(nw, dt, 2), *gy = host_random(ny, dt, 3);
    void *b = host_random(g->O, pdt, 4);
    void *y = malloc(es * (size_t)ny), *gx = malloc(es * (size_t)nx);
    void *gw = malloc(ps * (size_t)nw), *gb = malloc(ps * (size_t)g->O);
    ck_assert(y && gx && gw && gb);
    nb__conv2d_args fa = {.g = *g, .dtype = dt, .x = x, .w = w, .b = bias ? b : NULL, .y = y};
    nb__conv2d_backward_args ba = {.g = *g, .dtype = dt, .x = x, .w = w, .gy = gy,
                                   .gx = gx, .gw = gw, .gb = gb};
    ck_assert(cpu->conv2d(&fa) == NB_OK && cpu->conv2d_backward(&ba) == NB_OK);

    void *dx = dev_copy(x, es * (size_t)nx), *dw = dev_copy(w, es * (size_t)nw);
    void *dgy = dev_copy(gy, es * (size_t)ny), *db = dev_copy(b, ps * (size_t)g->O);
    void *out[2][4];
    for (int run = 0; run < 2; run++) {
        void *dy = dev_copy(NULL, es * (size_t)ny), *dgx = dev_copy(NULL, es * (size_t)nx);
        void *dgw = dev_copy(NULL, ps * (size_t)nw), *dgb = dev_copy(NULL, ps * (size_t)g->O);
        nb__conv2d_args fd = {.g = *g, .dtype = dt, .x = dx, .w = dw, .b = bias ? db : NULL,
                              .y = dy};
        nb__conv2d_backward_args bd = {.g = *g, .dtype = dt, .x = dx, .w = dw, .gy = dgy,
                                       .gx = dgx, .gw = dgw, .gb = dgb};
        ck_assert(nb__backend_of(NB_CUDA(0), "conv2d") != NULL); /* notes the kernel device */
        ck_assert_msg(gpu->conv2d(&fd) == NB_OK, "%s conv2d: %s", path, nb_last_error());
        ck_assert_msg(gpu->conv2d_backward(&bd) == NB_OK, "%s conv2d_backward: %s", path,
                      nb_last_error());
        out[run][0] = host_copy(dy, es * (size_t)ny);
        out[run][1] = host_copy(dgx, es * (size_t)nx);
        out[run][2] = host_copy(dgw, ps * (size_t)nw);
        out[run][3] = host_copy(dgb, ps * (size_t)g->O);
        nb_cuda_free(dy), nb_cuda_free(dgx), nb_cuda_free(dgw), nb_cuda_free(dgb);
    }
    char what[160];
    snprintf(what, sizeof what, "%s%s dtype %d N%lld C%lld %lldx%lld O%lld k%lldx%lld s%lld p%lld "
             "d%lld g%lld", path, bias ? "" : " (no bias)", (int)dt, (long long)g->N, (long long)g->C, (long long)g->H,
             (long long)g->W, (long long)g->O, (long long)g->KH, (long long)g->KW,
             (long long)g->sh, (long long)g->ph, (long long)g->dh, (long long)g->groups);
    double rel = dt == NB_F64 ? 1e-10 : dt == NB_F32 ? 1e-4 : 1.0 / 64;
    double prel = dt == NB_F64 ? 1e-10 : 1e-4;
    expect_close(out[0][0], y, dt, ny, rel, what);
    expect_close(out[0][1], gx, dt, nx, rel, what);
    expect_close(out[0][2], gw, pdt, nw, prel, what);
    expect_close(out[0][3], gb, pdt, g->O, prel, what);
    const size_t bytes[4] = {es * (size_t)ny, es * (size_t)nx, ps * (size_t)nw,
                             ps * (size_t)g->O};
    for (int i = 0; i < 4; i++) {
        ck_assert_msg(memcmp(out[0][i], out[1][i], bytes[i]) == 0,
                      "%s: output %d differs between two runs", what, i);
        free(out[0][i]), free(out[1][i]);
    }
    nb_cuda_free(dx), nb_cuda_free(dw), nb_cuda_free(dgy), nb_cuda_free(db);
    free(x), free(w), free(gy), free(b), free(y), free(gx), free(gw), free(gb);
}

START_TEST(test_cuda_conv_kernels) {
    if (nb_cuda_device_count() == 0) return; /* no GPU: tests/cuda_host/conv.cu checks the math */
    const nb__backend *be = nb__backend_of(NB_CUDA(0), "conv2d");
    ck_assert_msg(be, "%s", nb_last_error());
    static const conv_case cases[] = {
        {2, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1},   {2, 4, 7, 9, 6, 3, 3, 2, 2, 1, 1, 1, 1, 1},
        {1, 4, 6, 6, 4, 1, 1, 1, 1, 0, 0, 1, 1, 1},   {3, 6, 7, 7, 6, 3, 3, 1, 1, 1, 1, 1, 1, 6},
        {2, 4, 9, 8, 6, 3, 2, 1, 2, 2, 1, 2, 1, 2},   {1, 3, 11, 11, 5, 5, 5, 3, 3, 2, 2, 1, 1, 1},
        {2, 16, 6, 6, 32, 3, 3, 2, 2, 1, 1, 1, 1, 16}, {4, 32, 28, 28, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1},
    };
    static const nb_dtype dts[] = {NB_F32, NB_BF16, NB_F64};
    for (int path = 0; path < 2; path++) {
        if (path == 1) setenv("NB_CUDA_CONV", "im2col", 1);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            nb__conv2d_geom g = conv_geom(&cases[i]);
            for (int d = 0; d < 3; d++)
                conv_case_run(&be->k, &g, dts[d], true, path ? "im2col" : "default");
            /* bf16 without bias: cuDNN's bf16 convolution where the plugin has cuDNN */
            conv_case_run(&be->k, &g, NB_BF16, false, path ? "im2col" : "default");
        }
    }
    unsetenv("NB_CUDA_CONV");
    ck_assert(be->conv_bf16);
}
END_TEST

/* ---- pooling: the same bytes as the CPU ---------------------------------------------------- */
static void pool_case_run(const nb__kernels *gpu, const nb__pool2d_geom *g, nb_dtype dt,
                          int kind, bool cip) {
    const nb__kernels *cpu = &nb__cpu_backend()->k;
    size_t es = esize(dt);
    int64_t nx = g->planes * g->H * g->W, ny = g->planes * g->OH * g->OW;
    void *x = host_random(nx, dt, 5), *gy = host_random(ny, dt, 6);
    void *y = malloc(es * (size_t)ny), *gx = malloc(es * (size_t)nx);
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)ny);
    ck_assert(y && gx && idx);
    nb__pool2d_args fa = {.g = *g, .dtype = dt, .count_include_pad = cip, .x = x, .y = y,
                          .idx = kind == 0 ? idx : NULL};
    nb__pool2d_backward_args ba = {.g = *g, .dtype = dt, .count_include_pad = cip, .gy = gy,
                                   .idx = kind == 0 ? idx : NULL, .gx = gx};
    nb_status (*fwd[3])(const nb__pool2d_args *) = {cpu->maxpool2d, cpu->avgpool2d,
                                                     cpu->adaptive_avgpool2d};
    nb_status (*bwd[3])(const nb__pool2d_backward_args *) = {
        cpu->maxpool2d_backward, cpu->avgpool2d_backward, cpu->adaptive_avgpool2d_backward};
    ck_assert(fwd[kind](&fa) == NB_OK && bwd[kind](&ba) == NB_OK);
    nb_status (*gfwd[3])(const nb__pool2d_args *) = {gpu->maxpool2d, gpu->avgpool2d,
                                                      gpu->adaptive_avgpool2d};
    nb_status (*gbwd[3])(const nb__pool2d_backward_args *) = {
        gpu->maxpool2d_backward, gpu->avgpool2d_backward, gpu->adaptive_avgpool2d_backward};
    void *dx = dev_copy(x, es * (size_t)nx), *dgy = dev_copy(gy, es * (size_t)ny);
    void *dy = dev_copy(NULL, es * (size_t)ny), *dgx = dev_copy(NULL, es * (size_t)nx);
    int32_t *didx = dev_copy(NULL, sizeof(int32_t) * (size_t)ny);
    nb__pool2d_args fd = {.g = *g, .dtype = dt, .count_include_pad = cip, .x = dx, .y = dy,
                          .idx = kind == 0 ? didx : NULL};
    nb__pool2d_backward_args bd = {.g = *g, .dtype = dt, .count_include_pad = cip, .gy = dgy,
                                   .idx = kind == 0 ? didx : NULL, .gx = dgx};
    ck_assert(nb__backend_of(NB_CUDA(0), "pool") != NULL);
    ck_assert_msg(gfwd[kind](&fd) == NB_OK && gbwd[kind](&bd) == NB_OK, "pool %d: %s", kind,
                  nb_last_error());
    void *hy = host_copy(dy, es * (size_t)ny), *hgx = host_copy(dgx, es * (size_t)nx);
    int32_t *hidx = host_copy(didx, sizeof(int32_t) * (size_t)ny);
    ck_assert_msg(memcmp(hy, y, es * (size_t)ny) == 0, "pool %d dtype %d: forward differs from "
                  "the CPU (%lldx%lld k%lld s%lld p%lld)", kind, (int)dt, (long long)g->H,
                  (long long)g->W, (long long)g->kh, (long long)g->sh, (long long)g->ph);
    ck_assert_msg(kind != 0 || memcmp(hidx, idx, sizeof(int32_t) * (size_t)ny) == 0,
                  "maxpool argmax differs from the CPU");
    ck_assert_msg(memcmp(hgx, gx, es * (size_t)nx) == 0, "pool %d dtype %d: backward differs "
                  "from the CPU (%lldx%lld k%lld s%lld p%lld)", kind, (int)dt, (long long)g->H,
                  (long long)g->W, (long long)g->kh, (long long)g->sh, (long long)g->ph);
    nb_cuda_free(dx), nb_cuda_free(dgy), nb_cuda_free(dy), nb_cuda_free(dgx), nb_cuda_free(didx);
    free(x), free(gy), free(y), free(gx), free(idx), free(hy), free(hgx), free(hidx);
}

START_TEST(test_cuda_pool_kernels) {
    if (nb_cuda_device_count() == 0) return;
    const nb__backend *be = nb__backend_of(NB_CUDA(0), "pool");
    ck_assert_msg(be, "%s", nb_last_error());
    static const int64_t cases[][9] = {
        /* planes H W kh kw sh sw ph pw */
        {6, 8, 8, 2, 2, 2, 2, 0, 0}, {4, 9, 7, 3, 3, 1, 1, 1, 1}, {4, 5, 6, 3, 3, 2, 2, 1, 1},
        {64, 56, 56, 3, 3, 2, 2, 1, 1}, {2, 11, 10, 5, 4, 2, 3, 2, 2},
    };
    static const nb_dtype dts[] = {NB_F32, NB_F64};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int d = 0; d < 2; d++) {
            const int64_t *c = cases[i];
            nb__pool2d_geom g = {c[0], c[1], c[2], 0, 0, c[3], c[4], c[5], c[6], c[7], c[8]};
            g.OH = (g.H + 2 * g.ph - g.kh) / g.sh + 1;
            g.OW = (g.W + 2 * g.pw - g.kw) / g.sw + 1;
            pool_case_run(&be->k, &g, dts[d], 0, false);
            pool_case_run(&be->k, &g, dts[d], 1, false);
            pool_case_run(&be->k, &g, dts[d], 1, true);
            nb__pool2d_geom a = {c[0], c[1], c[2], 3, 5, 0, 0, 0, 0, 0, 0};
            pool_case_run(&be->k, &a, dts[d], 2, false);
        }
}
END_TEST

TCase *nb_tcase_cuda_conv(void) {
    TCase *tc = tcase_create("cuda_conv");
    tcase_add_test(tc, test_cuda_conv_kernels);
    tcase_add_test(tc, test_cuda_pool_kernels);
    return tc;
}
