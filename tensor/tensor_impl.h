/* tensor_impl.h - private: the tensor and storage structs, error helpers, the elementwise
 * iterator and the shared helpers every op definition and kernel uses. Not installed. */
#ifndef NABLA_TENSOR_IMPL_H
#define NABLA_TENSOR_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "nabla/memory.h"
#include "nabla/status.h"
#include "nabla/tensor.h"
#include "tensor/error.h"
#include "tensor/kernels.h"
#include "tensor/op_table.h"

/* "[32,784]" into buf (NB__SHAPE_STR bytes is always enough). */
#define NB__SHAPE_STR 200
const char *nb__shape_str(const int64_t *shape, int ndim, char *buf);
#define NB__SHAPE(t) nb__shape_str(nb_shape(t), nb_ndim(t), (char[NB__SHAPE_STR]){0})

/* Argument check: false for NULL (setting ENULL unless an error is pending: a NULL produced
 * by a failed inner op already said why) and for a released handle (NB_EFREED naming op and
 * argname, whatever is pending). */
bool nb__arg_ok(const nb_tensor *t, const char *op, const char *argname);
/* The error for a released handle t (magic not NB__TENSOR_LIVE); returns false. */
bool nb__dead_handle(const nb_tensor *t, const char *op, const char *argname);
#define NB__CHECK_ARG(t, op, name)                                                         \
    do {                                                                                   \
        if (!nb__arg_ok((t), (op), (name))) return NULL;                                   \
    } while (0)

/* Normalize a possibly negative dim against ndim (ndim 0 accepts -1 and 0 as for PyTorch
 * scalars); sets EDIM and returns -1 when out of range. */
int nb__wrap_dim(int dim, int ndim, const char *op);

/* ---- const ----------------------------------------------------------------------------------
 * Deliberate removal of const (the build has -Wcast-qual): functions that only read a
 * tensor take it const, while the ops they call take nb_tensor *. */
static inline nb_tensor *nb__mut(const nb_tensor *t) { return (nb_tensor *)(uintptr_t)t; }
static inline void *nb__unconst(const void *p) { return (void *)(uintptr_t)p; }

/* ---- storage and tensor --------------------------------------------------------------------- */
typedef struct nb__storage {
    atomic_long refcount;
    void *data;
    size_t nbytes;
    nb_device device;
    /* Wrapped caller memory: release(data, ctx) when the last reference goes. Storage from
     * the allocator has release == NULL and owned == true. */
    void (*release)(void *data, void *ctx);
    void *release_ctx;
    bool owned;
    /* Bumped by every in-place write through the library (nb__bump_version), as PyTorch's
     * version counter: autograd records it when it saves a tensor and backward refuses a
     * saved tensor whose storage was written since. Writes through nb_data are not seen.
     * Atomic (relaxed) so that writers on different threads never lose a bump; a write
     * racing with a backward that reads the same tensor is a data race anyway. */
    atomic_ullong version;
} nb__storage;

/* A tensor header's first field says whether the handle is live. A released header is not
 * given back at once: it waits in a quarantine of recently released headers (tensor.c)
 * with its magic saying how it died, so a handle used after its release is reported as an
 * error (nb__arg_ok, nb__check_devices, the metadata getters) instead of reading memory
 * that a new tensor may already own. */
#define NB__TENSOR_LIVE 0x6e62746cu       /* "nbtl" */
#define NB__TENSOR_FREED 0x64656166u      /* released by nb_tensor_free */
#define NB__TENSOR_SCOPE_ENDED 0x64656173u /* released by nb_scope_end */

struct nb_tensor {
    uint32_t magic; /* NB__TENSOR_LIVE while the header lives */
    atomic_long refcount;
    nb__storage *storage;
    int64_t offset; /* elements */
    int ndim;
    nb_dtype dtype;
    int64_t shape[NB_MAX_DIMS];
    int64_t strides[NB_MAX_DIMS]; /* elements */
    /* Autograd (filled in by autograd/): whether gradients flow to this tensor, its
     * accumulated gradient (leaves), and the tape node that produced it. */
    bool requires_grad;
    nb_tensor *grad;
    struct nb__node *grad_fn;
    struct nb__ag_meta *ag; /* gradient hooks of a leaf, or NULL */
    /* Where this tensor lives on a device mesh (a parameter's placement) or an activation
     * tag (tensor/place.h), or NULL: a plain tensor. */
    struct nb__place *place;
};
static inline bool nb__live(const nb_tensor *t) { return t->magic == NB__TENSOR_LIVE; }
void nb__node_release(struct nb__node *n);
void nb__ag_meta_free(struct nb__ag_meta *m);
void nb__place_release(struct nb__place *pl);

/* Record an in-place write into t's storage (see nb__storage.version). Every library
 * function that writes into an existing tensor calls it before writing. */
static inline void nb__bump_version(const nb_tensor *t) {
    atomic_fetch_add_explicit(&t->storage->version, 1, memory_order_relaxed);
}
static inline uint64_t nb__version_of(const nb_tensor *t) {
    return atomic_load_explicit(&t->storage->version, memory_order_relaxed);
}

/* Drop one reference to a storage (freeing it, or calling its release, at zero). */
void nb__storage_release(nb__storage *s);

/* A new contiguous tensor with fresh storage from the allocator (registered in the current
 * scope) on dev (no storage on the meta device). NULL + ENOMEM/EINVAL/EDEVICE on failure. */
nb_tensor *nb__empty(const int64_t *shape, int ndim, nb_dtype dt, nb_device dev);
/* A new tensor header over base's storage with the given geometry (registered in the
 * current scope). The caller guarantees the geometry stays inside the storage. */
nb_tensor *nb__view_of(const nb_tensor *base, const int64_t *shape, const int64_t *strides,
                       int ndim, int64_t offset);
/* Make t's header describe src's data instead of its own: t takes src's storage, offset,
 * shape, strides and dtype (and drops its gradient), keeping its identity, name in modules,
 * requires_grad and placement. For replacing a parameter by its part (nb_parallelize) without
 * changing who holds it. */
void nb__tensor_assume(nb_tensor *t, const nb_tensor *src);
/* Register a fresh reference in the innermost scope (no-op outside scopes). */
nb_tensor *nb__scope_add(nb_tensor *t);
/* Remove t's reference from the innermost scope (if there) and give it to the caller, who
 * must nb_tensor_free it. For library code that owns a tensor privately. */
nb_tensor *nb__scope_take(nb_tensor *t);
/* scope.c tells tensor.c that the releases in progress on this thread come from
 * nb_scope_end (a header dying there is marked NB__TENSOR_SCOPE_ENDED). */
void nb__scope_releasing(bool on);

/* The address of t's first element in its device's memory (NULL on the meta device). */
static inline char *nb__ptr(const nb_tensor *t) {
    char *d = (char *)t->storage->data;
    return d ? d + t->offset * (int64_t)nb_dtype_size(t->dtype) : NULL;
}
int64_t nb__numel_of(const int64_t *shape, int ndim);
void nb__contiguous_strides(const int64_t *shape, int ndim, int64_t *strides);

/* ---- checked shape arithmetic ---------------------------------------------------------------
 * The sizes of shape[ndim] (non-negative; sizes below 1 count as 1) multiplied together and
 * by elem_size, into *bytes; false when that overflows int64. Every tensor's shape passes
 * this with elem_size NB__MAX_ELEM (tensor.c, view.c), so its numel, contiguous strides,
 * byte size and element offsets are all representable. The 0-sized dims count as 1 because
 * a shape like [0, 2^40, 2^40] holds no elements, yet its contiguous strides are products
 * of the other sizes and would wrap. */
#define NB__MAX_ELEM 16
static inline bool nb__shape_bytes(const int64_t *shape, int ndim, int64_t elem_size,
                                   int64_t *bytes) {
    int64_t n = elem_size;
    for (int i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(n, shape[i] > 1 ? shape[i] : 1, &n)) return false;
    if (bytes) *bytes = n;
    return true;
}

/* Broadcast two shapes (NumPy rules) into out (ndim in *out_ndim); false + ESHAPE error
 * mentioning op on mismatch. */
bool nb__broadcast_shapes(const int64_t *a, int na, const int64_t *b, int nb,
                          int64_t *out, int *out_ndim, const char *op);
/* Strides (elements) that read t broadcast to shape[ndim] (0 for broadcast dims). t's
 * shape must be broadcastable to shape. */
void nb__broadcast_strides(const nb_tensor *t, const int64_t *shape, int ndim,
                           int64_t *strides);

/* Can dims (sizes, strides), outermost first, be walked as ONE strided dim? Size-1 dims are
 * ignored. On success *stride is that dim's stride (matmul and linear fold batch dims). */
bool nb__dims_collapse(const int64_t *sizes, const int64_t *strides, int n, int64_t *stride);


/* ---- scalar load/store (slow, general; for strided fallbacks, printing, tests) ------------ */
double nb__load_f64(const void *p, nb_dtype dt);
void nb__store_f64(void *p, nb_dtype dt, double v);

/* ---- half-precision bulk conversion (tensor/dtype.c) ------------------------------------- */
void nb__f16_to_f32_n(const uint16_t *src, float *dst, int64_t n);
void nb__f32_to_f16_n(const float *src, uint16_t *dst, int64_t n);
void nb__bf16_to_f32_n(const uint16_t *src, float *dst, int64_t n);
void nb__f32_to_bf16_n(const float *src, uint16_t *dst, int64_t n);

/* ---- devices -------------------------------------------------------------------------------- */
static inline nb_device nb__device_of(const nb_tensor *t) { return t->storage->device; }
/* "cpu", "cuda:0", "meta" into buf (NB__DEVICE_STR bytes). */
#define NB__DEVICE_STR 32
const char *nb__device_str(nb_device d, char *buf);
#define NB__DEVSTR(d) nb__device_str((d), (char[NB__DEVICE_STR]){0})
/* The common device of ts[0..n) (NULL entries skipped) in *dev; false + NB_EDEVICE
 * ("op: operands on cpu and cuda:0") when they differ. n >= 1, ts[0] non-NULL. */
bool nb__check_devices(const char *op, nb_tensor *const *ts, int n, nb_device *dev);
/* Whether the host may dereference t's memory (CPU tensors; not CUDA, meta or guard). */
bool nb__host_accessible(const nb_tensor *t);
/* NB_EDEVICE "op: <what> must be in host memory, got a cuda:0 tensor" unless t is. */
bool nb__require_host(const nb_tensor *t, const char *op);

/* ---- elementwise iteration -----------------------------------------------------------------
 * The iterator geometry (nb__iter, tensor/kernels.h) walks several operands of one shape
 * (operand 0 is usually the output) with per-operand byte strides; dims are coalesced where
 * every operand is contiguous across them, so a contiguous or simply broadcast op becomes
 * a loop over few long rows. Backends walk it (cpu/: nb__iter_for_each). */
/* Set up an iterator over shape[ndim] for tensors ts[0..n) (each broadcastable to shape). */
void nb__iter_init(nb__iter *it, const int64_t *shape, int ndim, nb_tensor *const *ts, int n);
/* The (op, compute dtype) pairs the elementwise ops accept, and the fused elementwise
 * backward kernels (tensor/ops/elementwise.c); every backend implements all of them. */
bool nb__ew_supported(nb__op op, nb_dtype dt);
bool nb__ew_backward_supported(nb__op op, int input, nb_dtype dt);
/* A strided view of t for kernel args. */
void nb__view_init(nb__view *v, const nb_tensor *t);

#endif
