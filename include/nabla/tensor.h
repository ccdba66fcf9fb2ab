/* nabla/tensor.h - tensors: creation, views, and the ops of the tensor core.
 *
 * Usage:
 *     nb_scope_begin();
 *     nb_tensor *x = nb_randn((int64_t[]){32, 784}, 2, NB_F32, NULL);   // NULL: default generator
 *     nb_tensor *w = nb_zeros((int64_t[]){784, 10}, 2, NB_F32);
 *     nb_tensor *y = nb_relu(nb_matmul(x, w));                          // (32, 10)
 *     nb_tensor *s = nb_keep(nb_sum(y, NULL, 0, false));                // survives the scope
 *     nb_scope_end();                                                   // frees x, w, y, temps
 *     printf("%f\n", nb_item_f64(s));
 *     nb_tensor_free(s);
 *
 * Ownership (docs/architecture.md rule 3): a tensor is a reference-counted view (shape, strides,
 * offset, dtype) over a reference-counted storage. Every function here that returns an
 * nb_tensor * returns a NEW reference:
 *   - inside nb_scope_begin()/nb_scope_end() the reference belongs to the innermost scope
 *     and is released by nb_scope_end(); nb_keep(t) moves it to the enclosing scope (or,
 *     at the outermost scope, to the caller);
 *   - outside any scope the caller owns it and releases it with nb_tensor_free().
 * nb_tensor_retain() adds a reference that the caller owns (release with nb_tensor_free).
 * Views (reshape, transpose, narrow, expand, ...) share storage with their base: writing
 * through one is visible through the other, exactly as in PyTorch.
 *
 * Errors (docs/architecture.md rule 2): functions returning a tensor return NULL on a user mistake
 * and set nb_last_error(); all ops accept NULL inputs and return NULL, keeping the first
 * error. See nabla/status.h.
 *
 * Threads: a tensor may be read from several threads at once; writing to it (or to a view
 * of it) while another thread reads it is a data race, as in PyTorch. Scopes and the last
 * error are per thread. */
#ifndef NABLA_TENSOR_H
#define NABLA_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "nabla/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NB_MAX_DIMS 8

/* Element types. Append only. Half types are stored as 16-bit values and computed in f32. */
typedef enum nb_dtype {
    NB_F32 = 0,
    NB_F64,
    NB_F16,
    NB_BF16,
    NB_I32,
    NB_I64,
    NB_U8,
    NB_BOOL,
    NB_DTYPE_COUNT
} nb_dtype;

/* Device types. Append only.
 *   NB_DEVICE_CPU   host memory, the CPU kernels.
 *   NB_DEVICE_CUDA  an NVIDIA GPU (index = the GPU); needs a CUDA build and a usable GPU.
 *   NB_DEVICE_META  shapes and dtypes without storage, as PyTorch's "meta": every op runs
 *                   its checks, shape inference and autograd recording and computes
 *                   nothing. Build a model of any size instantly to count parameters or
 *                   plan memory. Reading a meta tensor's data is an error.
 *   NB_DEVICE_GUARD for the library's own tests: host memory that is unreadable except
 *                   inside the backend's calls, computed by the CPU kernels; a host
 *                   dereference of device memory anywhere else crashes. */
typedef enum nb_device_type {
    NB_DEVICE_CPU = 0,
    NB_DEVICE_CUDA = 1,
    NB_DEVICE_META = 2,
    NB_DEVICE_GUARD = 3
} nb_device_type;

/* A device: its type and, for CUDA, the GPU index (0 for the others). */
typedef struct nb_device {
    nb_device_type type;
    int index;
} nb_device;

#define NB_CPU ((nb_device){NB_DEVICE_CPU, 0})
#define NB_META ((nb_device){NB_DEVICE_META, 0})
#define NB_CUDA(i) ((nb_device){NB_DEVICE_CUDA, (i)})

typedef struct nb_tensor nb_tensor;
typedef struct nb_generator nb_generator; /* see nabla/random.h */

/* ---- dtypes ------------------------------------------------------------------------- */
size_t nb_dtype_size(nb_dtype dt);          /* bytes per element, 0 if invalid */
const char *nb_dtype_name(nb_dtype dt);     /* "f32", "bf16", ...; "?" if invalid */
bool nb_dtype_is_float(nb_dtype dt);        /* f32, f64, f16, bf16 */
/* The dtype two operands are computed in (NumPy/PyTorch-style promotion). */
nb_dtype nb_dtype_promote(nb_dtype a, nb_dtype b);

/* Scalar conversions with IEEE round-to-nearest-even (NaN stays NaN, overflow to inf). */
uint16_t nb_f32_to_f16(float x);
float nb_f16_to_f32(uint16_t h);
uint16_t nb_f32_to_bf16(float x);
float nb_bf16_to_f32(uint16_t h);

/* ---- devices -------------------------------------------------------------------------- */
/* "cpu", "cuda" (= "cuda:0"), "cuda:N", "meta" into *out; NB_EINVAL for anything else. */
nb_status nb_device_parse(const char *s, nb_device *out);
/* "cpu", "cuda:1", "meta" written into buf (n bytes, 32 is always enough); returns buf. */
const char *nb_device_name(nb_device d, char *buf, size_t n);
bool nb_device_equal(nb_device a, nb_device b);
/* Whether op_name ("gelu", "matmul", "layer_norm", ...) can run on dev: its backend has
 * every kernel the op uses. Also accepts a kernel name. False for unknown names and
 * devices this build does not have. Meta supports every op. */
bool nb_device_supports(nb_device dev, const char *op_name);

/* ---- references and metadata ---------------------------------------------------------- */
nb_tensor *nb_tensor_retain(nb_tensor *t);  /* +1 reference owned by the caller; returns t */
void nb_tensor_free(nb_tensor *t);          /* -1 reference; NULL is a no-op; a released
                                               handle sets NB_EFREED and does nothing */

int nb_ndim(const nb_tensor *t);
const int64_t *nb_shape(const nb_tensor *t);    /* NB_MAX_DIMS entries; valid while t lives */
const int64_t *nb_strides(const nb_tensor *t);  /* in elements */
int64_t nb_size(const nb_tensor *t, int dim);   /* negative dim counts from the end; -1 on error */
int64_t nb_numel(const nb_tensor *t);
int64_t nb_offset(const nb_tensor *t);          /* element offset into the storage */
nb_dtype nb_tensor_dtype(const nb_tensor *t);
nb_device nb_tensor_device(const nb_tensor *t);
bool nb_is_contiguous(const nb_tensor *t);
bool nb_shares_storage(const nb_tensor *a, const nb_tensor *b);
/* Pointer to the first element, for tensors in host memory (CPU) only: NULL and NB_EDEVICE
 * for CUDA, meta and guard tensors (copy them with nb_to_device(t, NB_CPU) first). Owned by
 * the tensor's storage. */
void *nb_data(const nb_tensor *t);
/* The address of the first element in its device's memory, for any device with storage
 * (PyTorch's data_ptr()): for a CUDA tensor a device pointer, to hand to your own kernels
 * or libraries (cuBLAS, NCCL) on the tensor's device; the host must not dereference it
 * unless the tensor is on the CPU. Owned by the tensor's storage, valid while the tensor
 * lives. NULL and NB_EDEVICE for meta tensors (they have no data). */
void *nb_data_ptr(const nb_tensor *t);
/* Mark t's memory as used by the calling thread's current stream of its device, so that
 * when another thread frees it, the memory is not reused before the work this thread has
 * enqueued on it is done (PyTorch's Tensor.record_stream). For tensors made on one thread
 * and used on another (a loader's batches). A no-op on devices without streams (the CPU). */
nb_status nb_record_stream(nb_tensor *t);

/* ---- creation ------------------------------------------------------------------------ */
nb_tensor *nb_empty(const int64_t *shape, int ndim, nb_dtype dt);
nb_tensor *nb_zeros(const int64_t *shape, int ndim, nb_dtype dt);
nb_tensor *nb_ones(const int64_t *shape, int ndim, nb_dtype dt);
nb_tensor *nb_full(const int64_t *shape, int ndim, nb_dtype dt, double value);
/* The device nb_empty/zeros/ones/full/scalar, nb_from_buffer, nb_arange, nb_linspace and
 * the random creators (nb_randn, ...) create on: NB_CPU unless set. Per thread, like
 * torch.set_default_device. Set it to NB_META around a model's constructor to build a
 * model of any size without allocating (then count its parameters, plan memory). Returns
 * the previous default. nb_wrap_buffer always wraps host memory (a CPU tensor). */
nb_device nb_set_default_device(nb_device dev);
nb_device nb_default_device(void);
/* Creation on a chosen device. */
nb_tensor *nb_empty_on(nb_device dev, const int64_t *shape, int ndim, nb_dtype dt);
nb_tensor *nb_zeros_on(nb_device dev, const int64_t *shape, int ndim, nb_dtype dt);
nb_tensor *nb_ones_on(nb_device dev, const int64_t *shape, int ndim, nb_dtype dt);
nb_tensor *nb_full_on(nb_device dev, const int64_t *shape, int ndim, nb_dtype dt, double value);
/* *_like: the shape, dtype and device of t. */
nb_tensor *nb_empty_like(const nb_tensor *t);
nb_tensor *nb_zeros_like(const nb_tensor *t);
nb_tensor *nb_ones_like(const nb_tensor *t);
nb_tensor *nb_full_like(const nb_tensor *t, double value);
nb_tensor *nb_scalar(double value, nb_dtype dt); /* 0-dim tensor */
/* [start, end) with step, as torch.arange: numel = ceil((end - start) / step). */
nb_tensor *nb_arange(double start, double end, double step, nb_dtype dt);
/* steps values from start to end inclusive, as torch.linspace. */
nb_tensor *nb_linspace(double start, double end, int64_t steps, nb_dtype dt);
/* Copy of a caller's buffer holding numel(shape) contiguous elements of dtype dt. */
nb_tensor *nb_from_buffer(const void *data, const int64_t *shape, int ndim, nb_dtype dt);
/* Wrap a caller's buffer without copying. The tensor (and every view of it) uses the
 * memory until its last reference goes; then release(data, ctx) is called (if non-NULL).
 * data must stay valid and 64-byte alignment is recommended (not required). */
nb_tensor *nb_wrap_buffer(void *data, const int64_t *shape, int ndim, nb_dtype dt,
                          void (*release)(void *data, void *ctx), void *ctx);

/* A copy of t on dev (t itself, as a new reference, when it is already there). Records
 * for autograd: the gradient flows back to t's device. Copying to meta keeps only shape
 * and dtype; copying from meta is an error (there is no data). */
nb_tensor *nb_to_device(nb_tensor *t, nb_device dev);

/* ---- views (no copy; share storage) --------------------------------------------------- */
/* New shape with the same numel; one entry may be -1 (inferred). Fails if the strides
 * cannot express it (then use nb_reshape). */
nb_tensor *nb_view(nb_tensor *t, const int64_t *shape, int ndim);
/* A view when possible, else a contiguous copy (torch.reshape). */
nb_tensor *nb_reshape(nb_tensor *t, const int64_t *shape, int ndim);
nb_tensor *nb_permute(nb_tensor *t, const int *dims, int ndim);
nb_tensor *nb_transpose(nb_tensor *t, int dim0, int dim1);
/* Elements [start, start + length) along dim. */
nb_tensor *nb_narrow(nb_tensor *t, int dim, int64_t start, int64_t length);
/* Python-style slice along dim: start/end may be negative, clamped like Python; step >= 1. */
nb_tensor *nb_slice(nb_tensor *t, int dim, int64_t start, int64_t end, int64_t step);
/* Index one position along dim, removing that dim (t[..., i, ...]). */
nb_tensor *nb_select(nb_tensor *t, int dim, int64_t index);
/* Broadcast size-1 dims to shape (stride 0); -1 keeps a dim; new leading dims allowed. */
nb_tensor *nb_expand(nb_tensor *t, const int64_t *shape, int ndim);
nb_tensor *nb_squeeze(nb_tensor *t, int dim);       /* dim must have size 1 */
nb_tensor *nb_squeeze_all(nb_tensor *t);            /* drop every size-1 dim */
nb_tensor *nb_unsqueeze(nb_tensor *t, int dim);
nb_tensor *nb_flatten(nb_tensor *t, int start_dim, int end_dim); /* view when possible */
/* t itself (a new reference) if already contiguous, else a contiguous copy. */
nb_tensor *nb_contiguous(nb_tensor *t);
/* Same data, no autograd history (a new tensor object sharing storage). */
nb_tensor *nb_detach(nb_tensor *t);

/* ---- copies and conversion ------------------------------------------------------------- */
nb_tensor *nb_clone(nb_tensor *t);                  /* contiguous copy, same dtype */
nb_tensor *nb_to_dtype(nb_tensor *t, nb_dtype dt);  /* converted copy (t itself if same) */
/* Copy src into dst (broadcasting src to dst's shape, converting dtype); dst may be a view. */
nb_status nb_copy_(nb_tensor *dst, const nb_tensor *src);
nb_status nb_fill_(nb_tensor *t, double value);
/* dst += src in place (src broadcast to dst's shape and converted to its dtype); refused
 * on a tensor that requires grad while grad mode is on. Not recorded for autograd. */
nb_status nb_add_(nb_tensor *dst, nb_tensor *src);
/* Copy the elements (in logical row-major order, converted to dt) into buf of n elements. */
nb_status nb_read(const nb_tensor *t, void *buf, int64_t n, nb_dtype dt);

/* Value of a one-element tensor (any shape with numel 1); NAN / 0 on error. */
double nb_item_f64(const nb_tensor *t);
int64_t nb_item_i64(const nb_tensor *t);
/* Element at a multi-index of ndim entries, as a double; NAN on error. */
double nb_get_f64(const nb_tensor *t, const int64_t *index);

/* Print like PyTorch: "tensor([[1.0000, 2.0000], ...], dtype=f32)"; long dims elided. */
nb_status nb_print(const nb_tensor *t, FILE *f);
/* Write the printed form into buf (truncated to n bytes, always NUL-terminated);
 * returns the length the full form needs, or a negative status. */
int nb_format(const nb_tensor *t, char *buf, size_t n);

/* ---- elementwise ops (outputs are new contiguous tensors) ------------------------------- */
/* Unary math. Integer inputs of float functions are computed in f32. */
nb_tensor *nb_neg(nb_tensor *x);
nb_tensor *nb_abs(nb_tensor *x);
nb_tensor *nb_exp(nb_tensor *x);
nb_tensor *nb_log(nb_tensor *x);
nb_tensor *nb_log1p(nb_tensor *x);
nb_tensor *nb_sqrt(nb_tensor *x);
nb_tensor *nb_rsqrt(nb_tensor *x);
nb_tensor *nb_sin(nb_tensor *x);
nb_tensor *nb_cos(nb_tensor *x);
nb_tensor *nb_tanh(nb_tensor *x);
nb_tensor *nb_sigmoid(nb_tensor *x);
nb_tensor *nb_relu(nb_tensor *x);
nb_tensor *nb_gelu(nb_tensor *x);       /* exact: x * Phi(x) with erf */
nb_tensor *nb_gelu_tanh(nb_tensor *x);  /* tanh approximation (GPT-2) */
nb_tensor *nb_silu(nb_tensor *x);
nb_tensor *nb_pow_scalar(nb_tensor *x, double exponent);
/* Clamp to [lo, hi]; pass -INFINITY / INFINITY to leave a side open. */
nb_tensor *nb_clamp(nb_tensor *x, double lo, double hi);

/* Binary with NumPy broadcasting; operands are promoted to a common dtype. */
nb_tensor *nb_add(nb_tensor *a, nb_tensor *b);
nb_tensor *nb_sub(nb_tensor *a, nb_tensor *b);
nb_tensor *nb_mul(nb_tensor *a, nb_tensor *b);
nb_tensor *nb_div(nb_tensor *a, nb_tensor *b);  /* true division: integers give f32 */
nb_tensor *nb_pow(nb_tensor *a, nb_tensor *b);
nb_tensor *nb_maximum(nb_tensor *a, nb_tensor *b);
nb_tensor *nb_minimum(nb_tensor *a, nb_tensor *b);
/* Comparisons give NB_BOOL. */
nb_tensor *nb_eq(nb_tensor *a, nb_tensor *b);
nb_tensor *nb_ne(nb_tensor *a, nb_tensor *b);
nb_tensor *nb_lt(nb_tensor *a, nb_tensor *b);
nb_tensor *nb_le(nb_tensor *a, nb_tensor *b);
nb_tensor *nb_gt(nb_tensor *a, nb_tensor *b);
nb_tensor *nb_ge(nb_tensor *a, nb_tensor *b);
/* Scalar forms: the scalar takes the tensor's dtype (as a PyTorch Python scalar does). */
nb_tensor *nb_add_scalar(nb_tensor *a, double s);
nb_tensor *nb_sub_scalar(nb_tensor *a, double s);
nb_tensor *nb_mul_scalar(nb_tensor *a, double s);
nb_tensor *nb_div_scalar(nb_tensor *a, double s);
nb_tensor *nb_maximum_scalar(nb_tensor *a, double s);
nb_tensor *nb_minimum_scalar(nb_tensor *a, double s);
nb_tensor *nb_eq_scalar(nb_tensor *a, double s);
nb_tensor *nb_lt_scalar(nb_tensor *a, double s);
nb_tensor *nb_gt_scalar(nb_tensor *a, double s);
/* cond ? a : b, all three broadcast together; cond must be NB_BOOL. */
nb_tensor *nb_where(nb_tensor *cond, nb_tensor *a, nb_tensor *b);

/* ---- reductions -------------------------------------------------------------------------- */
/* dims: ndims entries (negative allowed), or dims == NULL / ndims == 0 for all dims.
 * keepdim keeps reduced dims with size 1. Float sums accumulate in f64 (f32 inputs) in a
 * fixed order, so results do not depend on the thread count. */
nb_tensor *nb_sum(nb_tensor *x, const int *dims, int ndims, bool keepdim);
nb_tensor *nb_mean(nb_tensor *x, const int *dims, int ndims, bool keepdim);
/* correction: 1 for the unbiased estimate (PyTorch's default), 0 for the population one. */
nb_tensor *nb_var(nb_tensor *x, const int *dims, int ndims, int correction, bool keepdim);
nb_tensor *nb_std(nb_tensor *x, const int *dims, int ndims, int correction, bool keepdim);
nb_tensor *nb_logsumexp(nb_tensor *x, const int *dims, int ndims, bool keepdim);
nb_tensor *nb_amax(nb_tensor *x, const int *dims, int ndims, bool keepdim);
nb_tensor *nb_amin(nb_tensor *x, const int *dims, int ndims, bool keepdim);
/* Max/min over one dim with the (first) index of the extreme; *indices is a new I64
 * reference with the same ownership rules as the return value (may be NULL if unwanted). */
nb_tensor *nb_max_dim(nb_tensor *x, int dim, bool keepdim, nb_tensor **indices);
nb_tensor *nb_min_dim(nb_tensor *x, int dim, bool keepdim, nb_tensor **indices);
nb_tensor *nb_argmax(nb_tensor *x, int dim, bool keepdim); /* I64 */
nb_tensor *nb_argmin(nb_tensor *x, int dim, bool keepdim); /* I64 */
nb_tensor *nb_softmax(nb_tensor *x, int dim);
nb_tensor *nb_log_softmax(nb_tensor *x, int dim);

/* ---- linear algebra ------------------------------------------------------------------------ */
/* torch.matmul semantics: 1-D x 1-D dot, 2-D x 2-D, 1-D promoted and removed, batched with
 * broadcast batch dims. Transposed (and other strided 2-D) views are passed to the GEMM
 * provider as transposes, without copies. Float dtypes only. */
nb_tensor *nb_matmul(nb_tensor *a, nb_tensor *b);

/* ---- indexing ------------------------------------------------------------------------------ */
/* Rows of x along dim picked by a 1-D integer index (I32/I64). */
nb_tensor *nb_index_select(nb_tensor *x, int dim, nb_tensor *index);
/* out[i][j] = x[index[i][j]][j] (dim 0), etc. as torch.gather. */
nb_tensor *nb_gather(nb_tensor *x, int dim, nb_tensor *index);
/* A copy of x with src added at index positions along dim (torch.scatter_add). */
nb_tensor *nb_scatter_add(nb_tensor *x, int dim, nb_tensor *index, nb_tensor *src);
/* Embedding lookup: weight (V, D), indices of any shape -> shape + (D). */
nb_tensor *nb_embedding(nb_tensor *weight, nb_tensor *indices);
/* A copy of x with value where mask (bool, broadcast to x) is true. */
nb_tensor *nb_masked_fill(nb_tensor *x, nb_tensor *mask, double value);
/* Integer class indices -> (..., num_classes) of dtype dt. */
nb_tensor *nb_one_hot(nb_tensor *indices, int64_t num_classes, nb_dtype dt);
/* Lower / upper triangle of the last two dims (others zeroed); diagonal offset k. */
nb_tensor *nb_tril(nb_tensor *x, int64_t k);
nb_tensor *nb_triu(nb_tensor *x, int64_t k);

/* ---- joining and splitting ----------------------------------------------------------------- */
/* Concatenate along dim. dtypes promote (nb_dtype_promote); shapes must match except along
 * dim; 1-D tensors of shape [0] are skipped, as in PyTorch. */
nb_tensor *nb_cat(nb_tensor *const *ts, int n, int dim);
nb_tensor *nb_stack(nb_tensor *const *ts, int n, int dim);
/* Split into views of split_size along dim (the last may be smaller); writes the new
 * references into out and returns the count, or a negative status (NB_EINVAL, with nothing
 * written or allocated, when more than max_out pieces would result). */
int nb_split(nb_tensor *t, int64_t split_size, int dim, nb_tensor **out, int max_out);
/* Split into `chunks` views as torch.chunk; returns the count or a negative status. */
int nb_chunk(nb_tensor *t, int chunks, int dim, nb_tensor **out, int max_out);

#ifdef __cplusplus
}
#endif
#endif
