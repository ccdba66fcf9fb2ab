/* nabla/nn.h - modules (layers with parameters), the layer library, initialization and
 * losses.
 *
 * Usage:
 *     nb_module *model = nb_sequential_new(nb_linear_new(784, 1024, NULL), nb_relu_new(),
 *                                          nb_linear_new(1024, 10, NULL), NULL);
 *     nb_scope_begin();
 *     nb_tensor *loss = nb_cross_entropy(nb_forward(model, x), y, NULL);
 *     nb_backward(loss);
 *     nb_scope_end();
 *     const nb_params *ps = nb_parameters(model);     // "0.weight", "0.bias", "2.weight", ...
 *     nb_module_free(model);
 *
 * Ownership: a module owns its parameters, buffers and children. nb_module_add_* take over
 * the reference passed in (the caller must not free it) and return the tensor (borrowed).
 * nb_parameters()/nb_buffers() return a list owned by the module, valid until the module
 * changes or is freed. nb_forward returns a new reference with the usual scope rules.
 * Constructors (nb_linear_new, nb_sequential_new, ...) return a module the caller frees with
 * nb_module_free, which frees its children too; nb_sequential_new(...) and
 * nb_module_add_child take over the modules passed in.
 *
 * Custom modules: give a vtable with a forward function, keep your state in `self`, and
 * register parameters so optimizers, state dicts and data parallel see them (docs/nn.md):
 *     static nb_tensor *scale_forward(nb_module *m, nb_tensor *x) {
 *         return nb_mul(x, nb_module_param(m, "scale"));
 *     }
 *     static const nb_module_vtable scale_vt = {.type_name = "Scale", .forward = scale_forward};
 *     nb_module *m = nb_module_new(&scale_vt, NULL);
 *     nb_module_add_parameter(m, "scale", nb_ones((int64_t[]){16}, 1, NB_F32));
 *
 * Threads: a module may run forward on one thread at a time. */
#ifndef NABLA_NN_H
#define NABLA_NN_H

#include <stdbool.h>

#include "nabla/random.h"
#include "nabla/status.h"
#include "nabla/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_module nb_module;

typedef struct nb_module_vtable {
    const char *type_name;                                  /* "Linear", ... */
    nb_tensor *(*forward)(nb_module *m, nb_tensor *x);      /* required */
    void (*free_self)(void *self);                          /* frees `self`, may be NULL */
} nb_module_vtable;

/* A named list of tensors (parameters or buffers), in registration order, depth first. */
typedef struct nb_params {
    int count;
    nb_tensor **tensors;  /* borrowed */
    const char **names;   /* dotted names: "layers.0.weight" */
} nb_params;

/* ---- the module object ------------------------------------------------------------------- */
nb_module *nb_module_new(const nb_module_vtable *vt, void *self);
void nb_module_free(nb_module *m);
void *nb_module_self(const nb_module *m);
const char *nb_module_type(const nb_module *m);
/* Register a parameter (float; requires grad is switched on). Takes over t. */
nb_tensor *nb_module_add_parameter(nb_module *m, const char *name, nb_tensor *t);
/* Register a buffer (state that is saved but not trained, e.g. running means). Takes over t. */
nb_tensor *nb_module_add_buffer(nb_module *m, const char *name, nb_tensor *t);
/* Register a child module under name. Takes over child. Returns child. */
nb_module *nb_module_add_child(nb_module *m, const char *name, nb_module *child);
/* Direct (not recursive) lookup by local name. Borrowed. A name that is not there returns
 * NULL with NB_EINVAL and a message naming it and the names that are ("module_param: no
 * parameter 'wieght' in this Linear (parameters: weight, bias)"). */
nb_tensor *nb_module_param(const nb_module *m, const char *name);
nb_tensor *nb_module_buffer(const nb_module *m, const char *name);
nb_module *nb_module_child(const nb_module *m, const char *name);
/* The same for members that may be absent (a bias, running statistics): NULL without an
 * error. */
nb_tensor *nb_module_param_opt(const nb_module *m, const char *name);
nb_tensor *nb_module_buffer_opt(const nb_module *m, const char *name);
int nb_module_num_children(const nb_module *m);
nb_module *nb_module_child_at(const nb_module *m, int i);
/* The name child i was registered under ("0", "attn"; owned by m), NULL out of range. */
const char *nb_module_child_name(const nb_module *m, int i);
/* Recursive lookup of a parameter or buffer by dotted name ("layers.0.weight"); when a part
 * is missing, NULL with NB_EINVAL naming it and what that module does have. */
nb_tensor *nb_module_find(const nb_module *m, const char *dotted_name);

/* All parameters / buffers, recursively, with dotted names (owned by the module). */
const nb_params *nb_parameters(nb_module *m);
const nb_params *nb_buffers(nb_module *m);
int64_t nb_num_parameters(nb_module *m);   /* total element count */

/* Run the module's forward (and its forward hooks, below). New reference. A NULL x (an
 * earlier call failed) returns NULL at once, keeping that error (NB_ENULL if none). */
nb_tensor *nb_forward(nb_module *m, nb_tensor *x);

/* Forward hooks (PyTorch's register_forward_pre_hook / register_forward_hook): functions
 * nb_forward(m, x) calls around m's own forward, in registration order, for that module
 * only (a child's forward runs its own hooks). They observe: a pre-forward hook gets the
 * input before the forward runs (to gather sharded parameters, start a timer, check shapes,
 * ...), a forward hook gets the input and the output after it (to record activations,
 * release parameters, ...); x and out are borrowed. A hook returning a status other than
 * NB_OK ends that nb_forward with NULL and the hook's error (the message it set, else
 * "forward: a pre-forward hook of a Linear failed"); the forward does not run after a
 * failed pre-forward hook. Registering returns a handle >= 0 (unique per module) or a
 * negative status (NB_ENULL for a NULL module or function); a hook registered during a
 * forward runs from the next one. Removing is refused (NB_ESTATE) while the module's hooks
 * run; an unknown handle is NB_EINVAL. ctx is borrowed and passed back as it is. */
typedef nb_status (*nb_forward_pre_hook_fn)(nb_module *m, nb_tensor *x, void *ctx);
typedef nb_status (*nb_forward_hook_fn)(nb_module *m, nb_tensor *x, nb_tensor *out, void *ctx);
int nb_module_register_forward_pre_hook(nb_module *m, nb_forward_pre_hook_fn fn, void *ctx);
int nb_module_register_forward_hook(nb_module *m, nb_forward_hook_fn fn, void *ctx);
nb_status nb_module_remove_forward_hook(nb_module *m, int handle);
/* Activation checkpointing (PyTorch's checkpoint_wrapper, but in place: the module tree and
 * parameter names do not change): with on, nb_forward(m, x) runs m's forward through
 * nb_recompute (nabla/autograd.h), so backward keeps only x of everything m's forward makes
 * and replays the forward (its hooks do not run again) with the thread's default generator
 * and gen (NULL: none other; borrowed, must outlive m's graphs) back at the states the
 * forward found: dropout masks are the same, and so are losses and gradients, bit for bit.
 * Off by default; NB_ENULL for a NULL module. */
nb_status nb_module_set_recompute(nb_module *m, bool on, nb_generator *gen);
bool nb_module_recompute(const nb_module *m);
/* Training mode (dropout active, batch norm uses batch statistics): on by default. */
void nb_module_train(nb_module *m, bool training);
bool nb_module_is_training(const nb_module *m);
/* Drop every parameter's gradient (set to none). */
void nb_module_zero_grad(nb_module *m);

/* Pack all parameters into one contiguous buffer (docs/architecture.md rule 10): each parameter
 * becomes a view into it, in nb_parameters order, each starting at a multiple of `align`
 * elements (0: 16). Gradients are likewise views into one flat gradient buffer, which
 * backward accumulates into in place. Parameters keep their values and identities, so
 * optimizers made before or after work. Returns NB_OK; mixed dtypes are an error. */
nb_status nb_module_flatten_parameters(nb_module *m, int64_t align);
/* The flat parameter and gradient buffers (1-D, borrowed), or NULL if not flattened. */
nb_tensor *nb_module_flat_params(const nb_module *m);
nb_tensor *nb_module_flat_grads(const nb_module *m);

/* Move the module to dev (torch.nn.Module.to(device)): every parameter, its gradient, every
 * buffer, and the flat parameter and gradient buffers, of m and all its children. The
 * tensors stay the same objects, with their names and requires_grad: pointers from
 * nb_module_param / nb_parameters stay valid and now refer to memory on dev. Tensors that
 * shared memory still do (the views of a flat buffer, tied weights). All or nothing: on an
 * error (out of memory, a meta module moved to a device with data, an unknown device) the
 * module is unchanged. Moving to NB_META drops the values and keeps the shapes, for
 * checking a model without memory; a meta module cannot be moved back.
 *
 * Optimizers: as in PyTorch, move the model before creating its optimizer. An optimizer
 * made earlier refers to the same parameter tensors, so it keeps working while it has no
 * state yet (state is created on the parameter's device at the first step), but state it
 * already holds stays on the old device and the next nb_step fails with NB_EDEVICE
 * (nb_optim_load_state moves loaded state to the parameters' devices). Views of the module's
 * memory held elsewhere (e.g. by nb_ddp) keep the old memory: move before wrapping. */
nb_status nb_module_to(nb_module *m, nb_device dev);

/* ---- containers ------------------------------------------------------------------------------ */
/* NULL-terminated list of modules, named "0", "1", ...; takes them over. Its forward runs
 * them in turn, except that a ReLU followed by a MaxPool2d, neither with forward hooks or
 * recompute set, runs as one nb_relu_maxpool2d (the same bits, docs/nn.md). */
nb_module *nb_sequential_new(nb_module *first, ...);
nb_module *nb_sequential_new_n(nb_module *const *mods, int n);
/* A list of modules without a forward of its own (forward is an error). */
nb_module *nb_module_list_new(nb_module *const *mods, int n);
nb_status nb_module_list_append(nb_module *list, nb_module *m);

/* ---- layers ----------------------------------------------------------------------------------- */
/* Options (docs/conventions.md): nb_<layer>_defaults() gives PyTorch's defaults (noted after
 * each field), which you then edit; NULL options mean those defaults. Every field is read as
 * written, and a value out of range is an error (NB_EINVAL), never replaced by a default:
 *     nb_conv2d_opts co = nb_conv2d_defaults();  // stride 1, padding 0, dilation 1, groups 1
 *     co.padding[0] = co.padding[1] = 1;
 *     nb_module *conv = nb_conv2d_new(3, 16, 3, 3, &co); */
typedef struct nb_linear_opts {
    uint32_t _init;          /* private: set by nb_linear_defaults() only */
    bool no_bias;            /* false */
    nb_dtype dtype;          /* NB_F32 */
    nb_generator *gen;       /* initialization; NULL: default generator */
} nb_linear_opts;
nb_linear_opts nb_linear_defaults(void);
nb_module *nb_linear_new(int64_t in_features, int64_t out_features, const nb_linear_opts *o);

typedef struct nb_conv2d_opts {
    uint32_t _init;                             /* private: set by nb_conv2d_defaults() only */
    int64_t stride[2], padding[2], dilation[2]; /* {1, 1}, {0, 0}, {1, 1} */
    int64_t groups;                             /* 1 */
    bool no_bias;                               /* false */
    nb_generator *gen;                          /* NULL: default generator */
} nb_conv2d_opts;
nb_conv2d_opts nb_conv2d_defaults(void);
nb_module *nb_conv2d_new(int64_t in_channels, int64_t out_channels, int64_t kh, int64_t kw,
                         const nb_conv2d_opts *o);

typedef struct nb_pool2d_opts {
    uint32_t _init;         /* private: set by nb_pool2d_defaults(kh, kw) only */
    int64_t stride[2];      /* {kh, kw}: the kernel size, as PyTorch's stride=None */
    int64_t padding[2];     /* {0, 0} */
    bool exclude_pad;       /* false; avg pool: divide by the unpadded count (PyTorch's
                               count_include_pad=False) */
    bool relu;              /* false; max pool only: pool relu(x), a ReLU before the pool
                               fused into it (nb_relu_maxpool2d) */
} nb_pool2d_opts;
/* The defaults for a kh x kw window (the stride depends on it, as in libtorch). */
nb_pool2d_opts nb_pool2d_defaults(int64_t kh, int64_t kw);
nb_module *nb_maxpool2d_new(int64_t kh, int64_t kw, const nb_pool2d_opts *o);
nb_module *nb_avgpool2d_new(int64_t kh, int64_t kw, const nb_pool2d_opts *o);
nb_module *nb_adaptive_avgpool2d_new(int64_t out_h, int64_t out_w);

typedef struct nb_norm_opts {
    uint32_t _init;          /* private: set by nb_norm_defaults() only */
    double eps;              /* 1e-5 (>= 0) */
    double momentum;         /* 0.1 (batch norm; in [0, 1], 0 keeps the running stats) */
    bool no_affine;          /* false; true: no weight/bias */
    bool no_running_stats;   /* false */
} nb_norm_opts;
nb_norm_opts nb_norm_defaults(void);
nb_module *nb_batch_norm1d_new(int64_t features, const nb_norm_opts *o);
nb_module *nb_batch_norm2d_new(int64_t channels, const nb_norm_opts *o);
/* LayerNorm over the last dim of size `features`. */
nb_module *nb_layer_norm_new(int64_t features, const nb_norm_opts *o);
/* RMSNorm over the last dim of size `features` (Hugging Face's LlamaRMSNorm): parameter
 * "weight" (features), ones. */
nb_module *nb_rms_norm_new(int64_t features, double eps);
nb_module *nb_embedding_new(int64_t num_embeddings, int64_t dim, nb_generator *gen);
/* Dropout with probability p (Philox; gen NULL: default generator). */
nb_module *nb_dropout_new(double p, nb_generator *gen);
/* Flatten dims start..end; (0, 0) means PyTorch's default (1, -1). */
nb_module *nb_flatten_new(int start_dim, int end_dim);
nb_module *nb_relu_new(void);
nb_module *nb_gelu_new(bool tanh_approx);
nb_module *nb_silu_new(void);
nb_module *nb_tanh_new(void);
nb_module *nb_sigmoid_new(void);

/* ---- functional forms (differentiable ops the layers use) ------------------------------------- */
/* y = x @ w^T + b, w (out, in), b (out) or NULL; x (..., in). */
nb_tensor *nb_linear(nb_tensor *x, nb_tensor *w, nb_tensor *b);
/* x (N, C, H, W), w (O, C/groups, kh, kw), b (O) or NULL. stride, padding, dilation NULL:
 * {1, 1}, {0, 0}, {1, 1}. */
nb_tensor *nb_conv2d(nb_tensor *x, nb_tensor *w, nb_tensor *b, const int64_t stride[2],
                     const int64_t padding[2], const int64_t dilation[2], int64_t groups);
/* stride NULL: the kernel size; padding NULL: {0, 0}. */
nb_tensor *nb_maxpool2d(nb_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                        const int64_t padding[2]);
/* nb_maxpool2d(nb_relu(x), ...) in one pass, equal to it bit for bit, values and gradients
 * (max is monotone: the pool of relu(x) is relu of the pool; a window whose maximum is <= 0
 * gets gradient 0), without the ReLU's output and its own backward pass. nb_sequential runs
 * a ReLU followed by a MaxPool2d as this op (see nb_sequential_new). */
nb_tensor *nb_relu_maxpool2d(nb_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                             const int64_t padding[2]);
nb_tensor *nb_avgpool2d(nb_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                        const int64_t padding[2], bool count_include_pad);
nb_tensor *nb_adaptive_avgpool2d(nb_tensor *x, int64_t out_h, int64_t out_w);
/* Normalize over the last dim (size = w's numel); w, b may be NULL. */
nb_tensor *nb_layer_norm(nb_tensor *x, nb_tensor *w, nb_tensor *b, double eps);
/* x (N, C) or (N, C, ...); running stats updated in training mode when non-NULL. Eval mode
 * needs running stats (a module made with no_running_stats uses batch statistics). */
nb_tensor *nb_batch_norm(nb_tensor *x, nb_tensor *running_mean, nb_tensor *running_var,
                         nb_tensor *w, nb_tensor *b, bool training, double momentum,
                         double eps);
/* RMSNorm over the last dim: y = (x * rstd) * w, rstd = 1 / sqrt(mean(x^2) + eps) per row;
 * w (features) or NULL. Computed in f32 for half inputs (f32 under autocast). */
nb_tensor *nb_rms_norm(nb_tensor *x, nb_tensor *w, double eps);
/* Rotary position embeddings, Llama's half-split layout: x (..., T, H, D) with D even (the
 * heads of a projection before they are transposed), row t at position offset + t. For
 * i < D/2, theta = position / base^(2i/D): y[i] = x[i] cos theta - x[i + D/2] sin theta,
 * y[i + D/2] = x[i + D/2] cos theta + x[i] sin theta. base is the rope theta (10000 in
 * Llama 2); offset the number of positions already in a key/value cache (0 otherwise). */
nb_tensor *nb_rotary_embedding(nb_tensor *x, int64_t offset, double base);
/* The SwiGLU product silu(a) * b, fused (forward and backward); a and b of one shape. */
nb_tensor *nb_swiglu(nb_tensor *a, nb_tensor *b);
/* Causal scaled dot-product attention, one fused op: q, k, v (B, H, T, D) -> (B, H, T, D),
 * out[t] = sum_{s <= t} softmax_s(q[t] . k[s] * scale) v[s]. scale 0 means 1/sqrt(D).
 * Grouped-query attention: k and v may have Hkv heads, (B, Hkv, T, D) with Hkv dividing H;
 * query head h then reads key/value head h / (H / Hkv) (the kernels index it: k and v are
 * never repeated in memory), and k's and v's gradients have their shape.
 * dropout_p > 0 (training only) drops attention weights with a Philox mask from gen (NULL:
 * default generator). The backward recomputes the probabilities from the saved row
 * statistics instead of keeping a (T, T) tensor. */
nb_tensor *nb_causal_attention(nb_tensor *q, nb_tensor *k, nb_tensor *v, double scale,
                               double dropout_p, bool training, nb_generator *gen);
/* The same on a fused projection, as GPT's c_attn makes it: qkv (B, T, 3C) holds q, k and v
 * side by side, each split into n_head heads of C / n_head -> (B, T, C), the heads merged
 * back. Equal to splitting, permuting to (B, H, T, D), nb_causal_attention (the same dropout
 * mask for the same generator state) and merging, but q, k, v are read in place and the
 * gradient of qkv is written as one (B, T, 3C) tensor: no split, no copies. */
nb_tensor *nb_causal_attention_qkv(nb_tensor *qkv, int64_t n_head, double scale,
                                   double dropout_p, bool training, nb_generator *gen);
/* Zero elements with probability p and scale the rest by 1/(1-p) (training only). */
nb_tensor *nb_dropout(nb_tensor *x, double p, bool training, nb_generator *gen);

/* ---- initialization (in place, grad mode off; gen NULL: default generator) --------------------- */
typedef enum nb_nonlinearity {
    NB_NONLIN_LINEAR = 0, NB_NONLIN_RELU, NB_NONLIN_LEAKY_RELU, NB_NONLIN_TANH,
    NB_NONLIN_SIGMOID,
} nb_nonlinearity;
nb_status nb_init_uniform_(nb_tensor *t, double lo, double hi, nb_generator *gen);
nb_status nb_init_normal_(nb_tensor *t, double mean, double std, nb_generator *gen);
nb_status nb_init_zeros_(nb_tensor *t);
nb_status nb_init_ones_(nb_tensor *t);
nb_status nb_init_constant_(nb_tensor *t, double v);
nb_status nb_init_xavier_uniform_(nb_tensor *t, double gain, nb_generator *gen);
nb_status nb_init_xavier_normal_(nb_tensor *t, double gain, nb_generator *gen);
/* a: negative slope for leaky relu; fan_out false uses fan_in (PyTorch's default mode). */
nb_status nb_init_kaiming_uniform_(nb_tensor *t, double a, bool fan_out, nb_nonlinearity nl,
                                   nb_generator *gen);
nb_status nb_init_kaiming_normal_(nb_tensor *t, double a, bool fan_out, nb_nonlinearity nl,
                                  nb_generator *gen);
/* PyTorch's gains; for leaky relu `param` is the negative slope as given (PyTorch's
 * default slope is 0.01: pass it). */
double nb_init_calculate_gain(nb_nonlinearity nl, double param);

/* ---- losses --------------------------------------------------------------------------------- */
typedef enum nb_reduction { NB_REDUCTION_MEAN = 0, NB_REDUCTION_SUM, NB_REDUCTION_NONE } nb_reduction;

/* nb_cross_entropy_defaults(): the values after each field (NULL options: the same). */
typedef struct nb_cross_entropy_opts {
    uint32_t _init;          /* private: set by nb_cross_entropy_defaults() only */
    nb_reduction reduction;  /* NB_REDUCTION_MEAN */
    int64_t ignore_index;    /* -100, used when has_ignore_index */
    bool has_ignore_index;   /* false */
    double label_smoothing;  /* 0 */
} nb_cross_entropy_opts;
nb_cross_entropy_opts nb_cross_entropy_defaults(void);
/* logits (N, C) or (N, C, d1, ...); target class indices (N) or (N, d1, ...) (I32/I64).
 * Fused log-softmax + NLL forward and backward. */
nb_tensor *nb_cross_entropy(nb_tensor *logits, nb_tensor *target, const nb_cross_entropy_opts *o);
/* log_probs (N, C); target (N). */
nb_tensor *nb_nll_loss(nb_tensor *log_probs, nb_tensor *target, const nb_cross_entropy_opts *o);
nb_tensor *nb_mse_loss(nb_tensor *pred, nb_tensor *target, nb_reduction r);
nb_tensor *nb_l1_loss(nb_tensor *pred, nb_tensor *target, nb_reduction r);
/* pos_weight may be NULL. */
nb_tensor *nb_bce_with_logits(nb_tensor *logits, nb_tensor *target, nb_tensor *pos_weight,
                              nb_reduction r);

#ifdef __cplusplus
}
#endif
#endif
