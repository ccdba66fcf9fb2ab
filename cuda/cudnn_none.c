/* cudnn_none.c - the plugin without cuDNN (-Dcudnn=disabled, or cuDNN not found): version
 * 0, and the convolutions of cuda/conv_cudnn.h answer NB_EUNSUPPORTED without setting an
 * error, so the conv kernels run their im2col + GEMM fallback. */
#include "cuda/conv_cudnn.h"
#include "cuda/cuda_impl.h"

long nb__cuda_cudnn_version(void) { return 0; }
const char *nb__cuda_cudnn_why(void) { return "the plugin was built without cuDNN"; }

nb_status nb__cudnn_conv2d_fwd(nb__cuda_kctx *c, const nb__conv2d_geom *g, nb_dtype dt,
                               const void *x, const void *w, void *y) {
    (void)c, (void)g, (void)dt, (void)x, (void)w, (void)y;
    return NB_EUNSUPPORTED;
}

nb_status nb__cudnn_conv2d_bwd_data(nb__cuda_kctx *c, const nb__conv2d_geom *g, nb_dtype dt,
                                    const void *w, const void *gy, void *gx) {
    (void)c, (void)g, (void)dt, (void)w, (void)gy, (void)gx;
    return NB_EUNSUPPORTED;
}

nb_status nb__cudnn_conv2d_bwd_filter(nb__cuda_kctx *c, const nb__conv2d_geom *g, nb_dtype dt,
                                      const void *x, const void *gy, void *gw) {
    (void)c, (void)g, (void)dt, (void)x, (void)gy, (void)gw;
    return NB_EUNSUPPORTED;
}
