/* nabla/autograd.h - reverse-mode automatic differentiation.
 *
 * Usage:
 *     nb_tensor *w = nb_randn((int64_t[]){784, 10}, 2, NB_F32, NULL);   // caller-owned
 *     nb_set_requires_grad(w, true);                                     // a leaf
 *     nb_scope_begin();
 *     nb_tensor *loss = nb_mean(nb_relu(nb_matmul(x, w)), NULL, 0, false);
 *     nb_backward(loss);                       // w's gradient accumulates into nb_grad(w)
 *     nb_scope_end();                          // frees the graph's tensors with the scope
 *     nb_tensor *g = nb_grad(w);               // borrowed: owned by w
 *     nb_clear_grad(w);                        // back to "no gradient"
 *
 * How it works: when grad mode is on (the default, per thread) and an op gets an input that
 * requires grad, the op attaches a node to its result recording the op, references to its
 * inputs' nodes (or leaves), and the tensors its backward rule needs. nb_backward walks the
 * nodes from the output, latest-created first, calls each op's backward rule (with grad
 * mode off) and accumulates gradients into the leaves' .grad. Gradients of broadcast inputs
 * are summed back to the input's shape, and converted to its dtype.
 *
 * Ownership: the graph is owned by the tensors: a result holds its node, a node holds its
 * inputs' nodes and the tensors it saved. So the graph lives exactly as long as the
 * outputs that reference it (typically until nb_scope_end). nb_backward frees the saved
 * tensors as it goes unless .retain_graph is set; a second backward through a freed graph
 * is an error (NB_ESTATE). A leaf's gradient (nb_grad) is owned by the leaf.
 *
 * Saved tensors are versioned (as PyTorch's version counter): every in-place write through
 * the library (nb_copy_, nb_fill_, nb_add_, nb_uniform_, nb_normal_, nb_init_*_, nb_step,
 * loading a state) bumps the written storage's version, and nb_backward fails with NB_EINVAL
 * ("a tensor saved by mul was modified in place after it was saved ...") before running any
 * rule when a tensor the graph saved was written since, rather than return a wrong gradient.
 * Writes through nb_data are NOT seen (as PyTorch's .data): don't write there while a graph
 * that saved the tensor is pending. docs/autograd.md has the details.
 *
 * Gradient hooks: nb_register_grad_hook(leaf, fn, ctx) calls fn(leaf, ctx) as soon as the
 * leaf's gradient for the running backward is complete (every contribution accumulated),
 * before nb_backward returns, on the thread that called nb_backward, in the order the engine
 * completes leaves (which, for a layered model, is roughly the reverse of the order in which
 * the forward used them). The hook may read nb_grad(leaf) and hand it to another thread
 * (e.g. start an asynchronous allreduce); the engine does not touch that gradient again
 * during this backward. Hooks must not call nb_backward. */
#ifndef NABLA_AUTOGRAD_H
#define NABLA_AUTOGRAD_H

#include <stdbool.h>

#include "nabla/status.h"
#include "nabla/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Mark a leaf (a tensor no recorded op produced) as needing gradients. Float dtypes only.
 * NB_EINVAL for a non-leaf (use nb_detach first), NB_EDTYPE for integer tensors. */
nb_status nb_set_requires_grad(nb_tensor *t, bool requires_grad);
bool nb_requires_grad(const nb_tensor *t);
/* True if no recorded op produced t (user-created tensors, parameters, detached tensors). */
bool nb_is_leaf(const nb_tensor *t);
/* The accumulated gradient of a leaf, NULL if none yet. Borrowed: owned by t. */
nb_tensor *nb_grad(const nb_tensor *t);
/* Drop t's gradient (the next backward allocates a fresh one): "set to none". */
void nb_clear_grad(nb_tensor *t);
/* Replace t's gradient with g (retained; NULL clears). Shapes must match. For optimizers
 * and data-parallel wrappers that manage gradient storage (e.g. views into a flat buffer):
 * a gradient set this way is accumulated into in place by later backward passes. */
nb_status nb_set_grad(nb_tensor *t, nb_tensor *g);

/* Options (docs/conventions.md): nb_<name>_defaults() gives the values after each field;
 * NULL means those; every field is read as written. */
typedef struct nb_backward_opts {
    uint32_t _init;          /* private: set by nb_backward_defaults() only */
    nb_tensor *grad_output;  /* NULL (ones, allowed only for one element); d(loss)/d(output) */
    bool retain_graph;       /* false; keep saved tensors so backward can run again */
} nb_backward_opts;
nb_backward_opts nb_backward_defaults(void);

/* Backpropagate from a one-element output (gradient 1). */
nb_status nb_backward(nb_tensor *output);
nb_status nb_backward_ex(nb_tensor *output, const nb_backward_opts *opts);

/* Grad mode (per thread, on by default). */
bool nb_grad_enabled(void);
/* Set grad mode; returns the previous value, so guards nest:
 *     bool prev = nb_set_grad_enabled(false); ... nb_set_grad_enabled(prev); */
bool nb_set_grad_enabled(bool enabled);
#define NB_NO_GRAD_BEGIN { bool nb__prev_grad_mode = nb_set_grad_enabled(false);
#define NB_NO_GRAD_END nb_set_grad_enabled(nb__prev_grad_mode); }

typedef void (*nb_grad_hook_fn)(nb_tensor *leaf, void *ctx);
/* Call fn(leaf, ctx) whenever a backward completes leaf's gradient (see above). Hooks run
 * in registration order. Returns a handle >= 0 for nb_remove_grad_hook, or a negative status. */
int nb_register_grad_hook(nb_tensor *leaf, nb_grad_hook_fn fn, void *ctx);
nb_status nb_remove_grad_hook(nb_tensor *leaf, int handle);

/* ---- activation checkpointing ---------------------------------------------------------------
 * nb_recompute(fn, inputs, n, ctx, opts) returns fn(inputs, n, ctx) but keeps only the inputs
 * for backward, not the tensors fn's ops would save (PyTorch's torch.utils.checkpoint,
 * non-reentrant): fn runs with grad mode off in a scope of its own, and backward runs it
 * again, with grad mode on and the generators set back to the states this call found (the
 * thread's default generator and opts->gen), so dropout masks are the same; gradients then
 * flow through the replayed graph to the inputs and to every tensor requiring grad that fn
 * read (its parameters, which need not be inputs). Losses and gradients are bit-identical
 * to calling fn directly. Leaf hooks run once per leaf per backward, as without it. The
 * replay draws nothing from the generators' streams (they are put back afterwards).
 *     static nb_tensor *block(nb_tensor *const *in, int n, void *ctx) {
 *         (void)n;
 *         return nb_forward(ctx, in[0]);       // any module, or any ops
 *     }
 *     nb_tensor *y = nb_recompute(block, &x, 1, mlp, NULL);
 * Rules for fn: it must do the same work both times (the same ops on the same tensors; a
 * replay that reads a tensor requiring grad the first run did not, or returns another shape,
 * fails the backward with NB_ESTATE); a tensor requiring grad that fn reads must be an input
 * or a leaf (one computed outside fn and read through ctx is NB_EINVAL: pass it as an
 * input); fn returns a new reference (scope rules) or NULL with
 * an error; its failure during the replay fails nb_backward with that error. ctx and what fn
 * reads through it are borrowed until the graph is freed. With grad mode off, nb_recompute is
 * just fn(inputs, n, ctx). nb_module_set_recompute (nabla/nn.h) does this for a module. */
typedef nb_tensor *(*nb_recompute_fn)(nb_tensor *const *inputs, int n, void *ctx);
typedef struct nb_recompute_opts {
    uint32_t _init;    /* private: set by nb_recompute_defaults() only */
    nb_generator *gen; /* NULL; a generator fn draws from besides the thread's default one */
} nb_recompute_opts;
nb_recompute_opts nb_recompute_defaults(void);
nb_tensor *nb_recompute(nb_recompute_fn fn, nb_tensor *const *inputs, int n, void *ctx,
                        const nb_recompute_opts *opts);

/* ---- gradient checking -------------------------------------------------------------------- */
/* f maps inputs to an output tensor; it is called several times. */
typedef nb_tensor *(*nb_gradcheck_fn)(nb_tensor *const *inputs, int n, void *ctx);

typedef struct nb_gradcheck_opts {
    uint32_t _init; /* private: set by nb_gradcheck_defaults() only */
    double eps;   /* central-difference step: 1e-6 (> 0) */
    double atol;  /* 1e-5 (>= 0) */
    double rtol;  /* 1e-3 (>= 0) */
    unsigned long long seed; /* 0; for the random output gradient */
} nb_gradcheck_opts;
nb_gradcheck_opts nb_gradcheck_defaults(void);

/* Compare the analytic gradient of sum(f(inputs) * r) (r a fixed random tensor) with central
 * differences, in f64: the float inputs that require grad are converted to f64 copies
 * first, so f must work in f64. Returns NB_OK, or NB_EINVAL with a message naming the input,
 * the element, and both values. */
nb_status nb_gradcheck(nb_gradcheck_fn f, nb_tensor *const *inputs, int n, void *ctx,
                       const nb_gradcheck_opts *opts);

#ifdef __cplusplus
}
#endif
#endif
