/* cpu/pool.h - private: CPU kernels of 2-D max, average and adaptive average pooling
 * (nn/pool.c), forward and backward, f32 and f64.
 *
 * Kernels do arithmetic only: the op definitions check arguments, compute output sizes,
 * make operands contiguous in the compute dtype and allocate outputs. Every tensor is seen
 * as `planes` contiguous (H, W) planes (planes = N*C); work is split over planes with
 * OpenMP, and each plane is done by one thread in a fixed order, so results (including the
 * backward's sums over overlapping windows) do not depend on the thread count. */
#ifndef NABLA_CPU_POOL_H
#define NABLA_CPU_POOL_H

#include <stdbool.h>
#include <stdint.h>

typedef struct nb__pool2d_geom {
    int64_t planes, H, W, OH, OW;
    int64_t kh, kw, sh, sw, ph, pw; /* window geometry (not used by adaptive pooling) */
} nb__pool2d_geom;

/* Max pooling. y (planes, OH, OW); idx (same shape, may be NULL) receives the position
 * h*W + w of each maximum inside its plane. NaN wins (it propagates), ties keep the first.
 * Padding never wins: windows are clipped to the input. */
void nb__maxpool2d_fwd(const nb__pool2d_geom *g, bool f64, const void *x, void *y,
                       int32_t *idx);
/* gx (planes, H, W) = scatter-add of gy at idx (gx is fully written). */
void nb__maxpool2d_bwd(const nb__pool2d_geom *g, bool f64, const void *gy, const int32_t *idx,
                       void *gx);

/* Average pooling; count_include_pad as PyTorch (the divisor counts padded positions, but
 * not beyond the padded input). */
void nb__avgpool2d_fwd(const nb__pool2d_geom *g, bool f64, bool count_include_pad,
                       const void *x, void *y);
void nb__avgpool2d_bwd(const nb__pool2d_geom *g, bool f64, bool count_include_pad,
                       const void *gy, void *gx);

/* Adaptive average pooling: output cell i covers [floor(i*H/OH), ceil((i+1)*H/OH)). */
void nb__adaptive_avgpool2d_fwd(const nb__pool2d_geom *g, bool f64, const void *x, void *y);
void nb__adaptive_avgpool2d_bwd(const nb__pool2d_geom *g, bool f64, const void *gy, void *gx);

#endif
