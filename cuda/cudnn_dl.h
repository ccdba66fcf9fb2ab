/* cuda/cudnn_dl.h - private to the CUDA plugin (C17): the cuDNN functions the plugin calls,
 * taken from the cuDNN library found at run time (cuda/dl.h: the search, cuda/cudnn_load.c:
 * the table), not linked. Include it after <cudnn.h>; from then on a call such as
 * cudnnCreate(&h) goes through the table, so call nb__cudnn_load() first:
 *
 *     if (!nb__cudnn_load()) return NB_EUNSUPPORTED;  // no cuDNN: nb__cudnn_why() says why
 *     cudnnStatus_t s = cudnnCreate(&h);
 *
 * Files that only fill the table define NB__CUDNN_DL_NO_NAMES before including it. */
#ifndef NABLA_CUDA_CUDNN_DL_H
#define NABLA_CUDA_CUDNN_DL_H

#include <stdbool.h>

#include <cudnn.h>

/* Every cuDNN function the plugin and its host checks call. */
#define NB__CUDNN_FNS(X)                                                                   \
    X(cudnnGetVersion) X(cudnnGetCudartVersion) X(cudnnGetErrorString) X(cudnnCreate)      \
    X(cudnnDestroy) X(cudnnSetStream) X(cudnnCreateTensorDescriptor)                       \
    X(cudnnDestroyTensorDescriptor) X(cudnnSetTensorNdDescriptor)                          \
    X(cudnnCreateFilterDescriptor) X(cudnnDestroyFilterDescriptor)                         \
    X(cudnnSetFilterNdDescriptor) X(cudnnCreateConvolutionDescriptor)                      \
    X(cudnnDestroyConvolutionDescriptor) X(cudnnSetConvolutionNdDescriptor)                \
    X(cudnnSetConvolutionGroupCount) X(cudnnSetConvolutionMathType)                        \
    X(cudnnGetConvolutionNdForwardOutputDim) X(cudnnGetConvolutionForwardAlgorithm_v7)     \
    X(cudnnGetConvolutionForwardWorkspaceSize) X(cudnnConvolutionForward)                  \
    X(cudnnGetConvolutionBackwardDataAlgorithm_v7)                                         \
    X(cudnnGetConvolutionBackwardDataWorkspaceSize) X(cudnnConvolutionBackwardData)        \
    X(cudnnGetConvolutionBackwardFilterAlgorithm_v7)                                       \
    X(cudnnGetConvolutionBackwardFilterWorkspaceSize) X(cudnnConvolutionBackwardFilter)

typedef struct nb__cudnn_fns {
#define NB__CUDNN_MEMBER(f) __typeof__(f) *f;
    NB__CUDNN_FNS(NB__CUDNN_MEMBER)
#undef NB__CUDNN_MEMBER
} nb__cudnn_fns;

/* Filled by nb__cudnn_load; all NULL before and when cuDNN is missing. */
extern nb__cudnn_fns nb__cudnn_fn;

/* Find and open cuDNN (once per process; thread-safe): libcudnn.so.<the build's major>,
 * every function above, its major version the build's and its CUDA runtime's major
 * version the plugin's. False when any of that fails, with the reason in nb__cudnn_why(). */
bool nb__cudnn_load(void);
/* Why cuDNN is not used ("libcudnn.so.9 not found (looked in ...)"), "" when it is. */
const char *nb__cudnn_why(void);
/* The file loaded, "" when none. */
const char *nb__cudnn_path(void);

#ifndef NB__CUDNN_DL_NO_NAMES
#define NB__CUDNN_NAME(f) nb__cudnn_fn.f
#define cudnnGetVersion NB__CUDNN_NAME(cudnnGetVersion)
#define cudnnGetCudartVersion NB__CUDNN_NAME(cudnnGetCudartVersion)
#define cudnnGetErrorString NB__CUDNN_NAME(cudnnGetErrorString)
#define cudnnCreate NB__CUDNN_NAME(cudnnCreate)
#define cudnnDestroy NB__CUDNN_NAME(cudnnDestroy)
#define cudnnSetStream NB__CUDNN_NAME(cudnnSetStream)
#define cudnnCreateTensorDescriptor NB__CUDNN_NAME(cudnnCreateTensorDescriptor)
#define cudnnDestroyTensorDescriptor NB__CUDNN_NAME(cudnnDestroyTensorDescriptor)
#define cudnnSetTensorNdDescriptor NB__CUDNN_NAME(cudnnSetTensorNdDescriptor)
#define cudnnCreateFilterDescriptor NB__CUDNN_NAME(cudnnCreateFilterDescriptor)
#define cudnnDestroyFilterDescriptor NB__CUDNN_NAME(cudnnDestroyFilterDescriptor)
#define cudnnSetFilterNdDescriptor NB__CUDNN_NAME(cudnnSetFilterNdDescriptor)
#define cudnnCreateConvolutionDescriptor NB__CUDNN_NAME(cudnnCreateConvolutionDescriptor)
#define cudnnDestroyConvolutionDescriptor NB__CUDNN_NAME(cudnnDestroyConvolutionDescriptor)
#define cudnnSetConvolutionNdDescriptor NB__CUDNN_NAME(cudnnSetConvolutionNdDescriptor)
#define cudnnSetConvolutionGroupCount NB__CUDNN_NAME(cudnnSetConvolutionGroupCount)
#define cudnnSetConvolutionMathType NB__CUDNN_NAME(cudnnSetConvolutionMathType)
#define cudnnGetConvolutionNdForwardOutputDim                                              \
    NB__CUDNN_NAME(cudnnGetConvolutionNdForwardOutputDim)
#define cudnnGetConvolutionForwardAlgorithm_v7                                             \
    NB__CUDNN_NAME(cudnnGetConvolutionForwardAlgorithm_v7)
#define cudnnGetConvolutionForwardWorkspaceSize                                            \
    NB__CUDNN_NAME(cudnnGetConvolutionForwardWorkspaceSize)
#define cudnnConvolutionForward NB__CUDNN_NAME(cudnnConvolutionForward)
#define cudnnGetConvolutionBackwardDataAlgorithm_v7                                        \
    NB__CUDNN_NAME(cudnnGetConvolutionBackwardDataAlgorithm_v7)
#define cudnnGetConvolutionBackwardDataWorkspaceSize                                       \
    NB__CUDNN_NAME(cudnnGetConvolutionBackwardDataWorkspaceSize)
#define cudnnConvolutionBackwardData NB__CUDNN_NAME(cudnnConvolutionBackwardData)
#define cudnnGetConvolutionBackwardFilterAlgorithm_v7                                      \
    NB__CUDNN_NAME(cudnnGetConvolutionBackwardFilterAlgorithm_v7)
#define cudnnGetConvolutionBackwardFilterWorkspaceSize                                     \
    NB__CUDNN_NAME(cudnnGetConvolutionBackwardFilterWorkspaceSize)
#define cudnnConvolutionBackwardFilter NB__CUDNN_NAME(cudnnConvolutionBackwardFilter)
#endif

#endif
