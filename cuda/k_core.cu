// cuda/k_core.cu - CUDA kernels of the core family (tensor/kernels/core.h): copy, fill, ew,
// ew_backward. Registered in the backend's table by nb__cuda_reg_core (cuda/kernels.h).
// Unverified on a GPU.
#include "cuda/kcommon.cuh"
#include "cuda/cuda_impl.h"

// fill: f32 over one contiguous run (other geometries are still to come).
static nb_status cuda_fill(const nb__fill_args *a) {
    const nb__iter *it = &a->it;
    if (it->dtype[0] != NB_F32 || it->ndim != 1 || it->strides[0][0] != 4)
        return nb__error(NB_EUNSUPPORTED, "fill: the cuda kernel handles contiguous f32 only");
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, "fill");
    if (st != NB_OK) return st;
    return nb__cuda_kend(&c, nb__cuda_launch_fill_f32((float *)it->data[0], (float)a->value,
                                                      it->numel, c.stream));
}

extern "C" void nb__cuda_reg_core(nb__backend *be) { be->k.fill = cuda_fill; }
