/* cuda/cudnn_desc.h - private to the CUDA plugin: cuDNN descriptors of a 2-D convolution
 * (cuda/cudnn_desc.c), which need neither a GPU nor a cuDNN handle, so tests/cuda_host
 * checks them on a machine without a GPU. Only built when the plugin has cuDNN.
 * Unverified on a GPU. */
#ifndef NABLA_CUDA_CUDNN_DESC_H
#define NABLA_CUDA_CUDNN_DESC_H

#include <cudnn.h>

#include "nabla/status.h"
#include "tensor/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The descriptors of one convolution: x (N, C, H, W) and y (N, O, OH, OW) NCHW-packed,
 * w (O, C/groups, KH, KW), cross-correlation (PyTorch's conv) with g's padding, stride,
 * dilation and groups. dt NB_F32: f32 data, FP32 math (CUDNN_FMA_MATH: no TF32); NB_BF16:
 * bf16 data, f32 compute type, tensor-op math allowed (bf16 products are exact in f32, the
 * sums f32: cuDNN's PSEUDO_BFLOAT16 configuration). */
typedef struct nb__cudnn_conv_desc {
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
} nb__cudnn_conv_desc;

/* Create d for g and dt (NB_F32 or NB_BF16). NB_EUNSUPPORTED (no error set) when a size does not fit cuDNN's int or
 * cuDNN's output size differs from g's OH, OW; another status with the error set when cuDNN
 * fails. d is fully released on failure; release it with nb__cudnn_desc_free otherwise. */
nb_status nb__cudnn_desc_make(nb__cudnn_conv_desc *d, const nb__conv2d_geom *g, nb_dtype dt);
void nb__cudnn_desc_free(nb__cudnn_conv_desc *d);
/* cuDNN's output size (N, O, OH, OW) for the input, weight and convolution of g (g's own
 * OH, OW are not used). */
nb_status nb__cudnn_out_dims(const nb__conv2d_geom *g, nb_dtype dt, int64_t out[4]);
/* A failed cuDNN call as a status and message "what: cuDNN: <cuDNN's text>"; NB_OK for
 * CUDNN_STATUS_SUCCESS. */
nb_status nb__cudnn_status(cudnnStatus_t s, const char *what);

#ifdef __cplusplus
}
#endif
#endif
