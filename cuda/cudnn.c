/* cudnn.c - cuDNN in the plugin (meson feature `cudnn`): for now only its version, which
 * needs no GPU; convolution and attention through cuDNN come with the kernels that use
 * them. Built only when meson found cuDNN; cuda/cudnn_none.c answers 0 otherwise. */
#include <cudnn.h>

#include "cuda/cuda_impl.h"

long nb__cuda_cudnn_version(void) { return (long)cudnnGetVersion(); }
