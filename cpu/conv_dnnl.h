/* cpu/conv_dnnl.h - private to cpu/conv.c and cpu/conv_dnnl.c: oneDNN's convolution
 * primitives (f32 and bf16 forward and input gradient), where oneDNN is built in. */
#ifndef NABLA_CPU_CONV_DNNL_H
#define NABLA_CPU_CONV_DNNL_H

#include "nb_config.h"
#include "tensor/kernels.h"

#if NB_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

#include "cpu/dnnl_dl.h" /* oneDNN, opened on first use */

/* Whether oneDNN's CPU engine could be created (once). */
bool nb__conv_dnnl_engine_ok(void);
/* Whether oneDNN runs this f32/bf16 convolution (nb__conv2d_impl; NB__CONV_AUTO: where it
 * measured faster). */
bool nb__conv_dnnl_wanted(const nb__conv2d_geom *g);
/* x, w, y of type dt (f32 or bf16), b f32 (or NULL); NB_EUNSUPPORTED without an error set
 * when oneDNN has no kernel for the shape (the caller falls back to im2col). */
nb_status nb__conv_dnnl_forward(const nb__conv2d_geom *g, dnnl_data_type_t dt, const void *x,
                                const void *w, const float *b, void *y);
/* w, gy, gx of type dt (f32 or bf16); NB_EUNSUPPORTED as above. */
nb_status nb__conv_dnnl_backward_data(const nb__conv2d_geom *g, dnnl_data_type_t dt,
                                      const void *w, const void *gy, void *gx);
#endif

#endif
