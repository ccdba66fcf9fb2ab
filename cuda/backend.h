/* cuda/backend.h - private: the CUDA backend as the registry (tensor/registry.c) sees it.
 * In a build without CUDA, cuda/cuda_stub.c answers with the error that says so. */
#ifndef NABLA_CUDA_BACKEND_H
#define NABLA_CUDA_BACKEND_H

#include "tensor/backend.h"

/* The backend of CUDA device dev, or NULL and NB_EDEVICE / NB_EUNSUPPORTED ("op: nabla
 * was built without CUDA", "op: no usable GPU: ...", "op: cuda:3 does not exist"). */
const nb__backend *nb__cuda_backend(nb_device dev, const char *op);

#endif
