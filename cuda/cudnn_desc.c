/* cudnn_desc.c - cuDNN descriptors of a 2-D convolution (cuda/cudnn_desc.h). Creating and
 * setting descriptors needs no GPU and no handle: tests/cuda_host links this file to check
 * cuDNN's output size against the CPU's rule. cuDNN itself is opened at run time
 * (cuda/cudnn_dl.h): without it both makers answer NB_EUNSUPPORTED with no error set, as
 * for a size cuDNN cannot take, and the conv kernels run their fallback. Unverified on a
 * GPU. */
#include <limits.h>
#include <string.h>

#include "cuda/cudnn_desc.h"
#include "cuda/cudnn_dl.h"
#include "tensor/error.h"

nb_status nb__cudnn_status(cudnnStatus_t s, const char *what) {
    if (s == CUDNN_STATUS_SUCCESS) return NB_OK;
    nb_status st = s == CUDNN_STATUS_ALLOC_FAILED      ? NB_ENOMEM
                   : s == CUDNN_STATUS_BAD_PARAM       ? NB_EINVAL
                   : s == CUDNN_STATUS_NOT_SUPPORTED   ? NB_EUNSUPPORTED
                                                       : NB_EDEVICE;
    return nb__error(st, "%s: cuDNN: %s", what, cudnnGetErrorString(s));
}

void nb__cudnn_desc_free(nb__cudnn_conv_desc *d) {
    if (d->conv) (void)cudnnDestroyConvolutionDescriptor(d->conv);
    if (d->w) (void)cudnnDestroyFilterDescriptor(d->w);
    if (d->y) (void)cudnnDestroyTensorDescriptor(d->y);
    if (d->x) (void)cudnnDestroyTensorDescriptor(d->x);
    memset(d, 0, sizeof *d);
}

static bool fits_int(const nb__conv2d_geom *g) {
    const int64_t v[] = {g->N * g->C * g->H * g->W, g->N * g->O * g->OH * g->OW,
                         g->O * g->C * g->KH * g->KW, g->sh, g->sw, g->ph, g->pw, g->dh, g->dw};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (v[i] > INT_MAX) return false;
    return true;
}

static cudnnDataType_t data_type(nb_dtype dt) {
    return dt == NB_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

static nb_status set_tensor(cudnnTensorDescriptor_t t, nb_dtype dt, int64_t n, int64_t c,
                            int64_t h, int64_t w, const char *what) {
    int dims[4] = {(int)n, (int)c, (int)h, (int)w};
    int strides[4] = {(int)(c * h * w), (int)(h * w), (int)w, 1};
    return nb__cudnn_status(cudnnSetTensorNdDescriptor(t, data_type(dt), 4, dims, strides),
                            what);
}

/* d's x, w and conv (not y). */
static nb_status make_xwc(nb__cudnn_conv_desc *d, const nb__conv2d_geom *g, nb_dtype dt,
                         const char *what) {
    memset(d, 0, sizeof *d);
    nb_status st = nb__cudnn_status(cudnnCreateTensorDescriptor(&d->x), what);
    if (st == NB_OK) st = nb__cudnn_status(cudnnCreateFilterDescriptor(&d->w), what);
    if (st == NB_OK) st = nb__cudnn_status(cudnnCreateConvolutionDescriptor(&d->conv), what);
    if (st == NB_OK) st = set_tensor(d->x, dt, g->N, g->C, g->H, g->W, what);
    if (st == NB_OK) {
        int fd[4] = {(int)g->O, (int)(g->C / g->groups), (int)g->KH, (int)g->KW};
        st = nb__cudnn_status(
            cudnnSetFilterNdDescriptor(d->w, data_type(dt), CUDNN_TENSOR_NCHW, 4, fd), what);
    }
    if (st == NB_OK) {
        int pad[2] = {(int)g->ph, (int)g->pw}, str[2] = {(int)g->sh, (int)g->sw},
            dil[2] = {(int)g->dh, (int)g->dw};
        st = nb__cudnn_status(cudnnSetConvolutionNdDescriptor(d->conv, 2, pad, str, dil,
                                                              CUDNN_CROSS_CORRELATION,
                                                              CUDNN_DATA_FLOAT),
                              what);
    }
    if (st == NB_OK)
        st = nb__cudnn_status(cudnnSetConvolutionGroupCount(d->conv, (int)g->groups), what);
    if (st == NB_OK)
        st = nb__cudnn_status(cudnnSetConvolutionMathType(
                                  d->conv, dt == NB_BF16 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH),
                              what);
    if (st != NB_OK) nb__cudnn_desc_free(d);
    return st;
}

static nb_status out_dims(const nb__cudnn_conv_desc *d, int out[4], const char *what) {
    return nb__cudnn_status(cudnnGetConvolutionNdForwardOutputDim(d->conv, d->x, d->w, 4, out),
                            what);
}

nb_status nb__cudnn_out_dims(const nb__conv2d_geom *g, nb_dtype dt, int64_t out[4]) {
    const char *what = "conv2d: cuDNN descriptors";
    if (!fits_int(g) || !nb__cudnn_load()) return NB_EUNSUPPORTED;
    nb__cudnn_conv_desc d;
    nb_status st = make_xwc(&d, g, dt, what);
    if (st != NB_OK) return st;
    int o[4] = {0, 0, 0, 0};
    st = out_dims(&d, o, what);
    for (int i = 0; i < 4; i++) out[i] = o[i];
    nb__cudnn_desc_free(&d);
    return st;
}

nb_status nb__cudnn_desc_make(nb__cudnn_conv_desc *d, const nb__conv2d_geom *g, nb_dtype dt) {
    const char *what = "conv2d: cuDNN descriptors";
    memset(d, 0, sizeof *d);
    if (!fits_int(g) || !nb__cudnn_load()) return NB_EUNSUPPORTED;
    nb_status st = make_xwc(d, g, dt, what);
    if (st != NB_OK) return st;
    int o[4] = {0, 0, 0, 0};
    if ((st = out_dims(d, o, what)) == NB_OK &&
        (o[0] != g->N || o[1] != g->O || o[2] != g->OH || o[3] != g->OW))
        st = NB_EUNSUPPORTED; /* never expected: the test checks cuDNN's rule is the CPU's */
    if (st == NB_OK) st = nb__cudnn_status(cudnnCreateTensorDescriptor(&d->y), what);
    if (st == NB_OK) st = set_tensor(d->y, dt, g->N, g->O, g->OH, g->OW, what);
    if (st != NB_OK) nb__cudnn_desc_free(d);
    return st;
}
