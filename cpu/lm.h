/* cpu/lm.h - private: the CPU kernels of the language-model family (RMSNorm, rotary position
 * embeddings, the SwiGLU product) behind the kernel table's rms_norm, rms_norm_backward,
 * rotary, swiglu and swiglu_backward entries (tensor/kernels/lm.h has their arguments and
 * the exact math; cpu/lm.c registers them). The functions below are their typed bodies, on
 * dense row-major buffers in the compute type. Results do not depend on the thread count:
 * every sum has an order fixed by the shape (cpu/lm.c). The functions returning nb_status
 * need scratch memory and return NB_ENOMEM (with the last error set) without it. */
#ifndef NABLA_CPU_LM_H
#define NABLA_CPU_LM_H

#include <stdbool.h>
#include <stdint.h>

#include "cpu/cpu_impl.h"

/* x, y (N, D); rstd (N) written; w (D) or NULL. */
void nb__cpu_rms_norm_fwd_f32(const float *x, const float *w, float *y, double *rstd, int64_t N,
                              int64_t D, double eps);
void nb__cpu_rms_norm_fwd_f64(const double *x, const double *w, double *y, double *rstd,
                              int64_t N, int64_t D, double eps);
/* dx (N, D) and dw (D) may each be NULL when not wanted. */
nb_status nb__cpu_rms_norm_bwd_f32(const float *g, const float *x, const float *w,
                                   const double *rstd, float *dx, float *dw, int64_t N,
                                   int64_t D);
nb_status nb__cpu_rms_norm_bwd_f64(const double *g, const double *x, const double *w,
                                   const double *rstd, double *dx, double *dw, int64_t N,
                                   int64_t D);
/* x, y (N, T, H, D), D even, may alias. */
nb_status nb__cpu_rotary_f32(const float *x, float *y, int64_t N, int64_t T, int64_t H,
                             int64_t D, int64_t offset, double base, bool inverse);
nb_status nb__cpu_rotary_f64(const double *x, double *y, int64_t N, int64_t T, int64_t H,
                             int64_t D, int64_t offset, double base, bool inverse);
/* n elements; da, db may each be NULL. */
void nb__cpu_swiglu_f32(const float *a, const float *b, float *y, int64_t n);
void nb__cpu_swiglu_f64(const double *a, const double *b, double *y, int64_t n);
void nb__cpu_swiglu_bwd_f32(const float *g, const float *a, const float *b, float *da,
                            float *db, int64_t n);
void nb__cpu_swiglu_bwd_f64(const double *g, const double *a, const double *b, double *da,
                            double *db, int64_t n);

#endif
