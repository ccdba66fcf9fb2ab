/* cudnn_none.c - the plugin without cuDNN (-Dcudnn=disabled, or cuDNN not found). */
#include "cuda/cuda_impl.h"

long nb__cuda_cudnn_version(void) { return 0; }
