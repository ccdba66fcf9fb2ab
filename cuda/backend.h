/* cuda/backend.h - private: the CUDA backend as the registry (tensor/registry.c) sees it.
 * In a build without CUDA (or where the plugin is not found), cuda/loader.c answers with the
 * error that says so. */
#ifndef NABLA_CUDA_BACKEND_H
#define NABLA_CUDA_BACKEND_H

#include "tensor/backend.h"

/* The backend of CUDA device dev, or NULL and NB_EDEVICE / NB_EUNSUPPORTED ("op: nabla
 * was built without CUDA", "op: no usable GPU: ...", "op: cuda:3 does not exist"). */
const nb__backend *nb__cuda_backend(nb_device dev, const char *op);

/* The CUDA kernel table of this build (no GPU needed to look at it); NULL in a build
 * without CUDA. For tests that list the kernels CUDA lacks. */
const nb__kernels *nb__cuda_kernels(void);

#endif
