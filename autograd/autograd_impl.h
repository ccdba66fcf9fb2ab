/* autograd_impl.h - private to the engine (and tests): the gradient arithmetic it uses.
 * The tape itself (nodes, recording, the backward-rule table) is tensor/tape.h. */
#ifndef NABLA_AUTOGRAD_IMPL_H
#define NABLA_AUTOGRAD_IMPL_H

#include "nabla/autograd.h"
#include "tensor/tape.h"

/* dst += src (src broadcast to dst, converted), in place (nb_add_). */
nb_status nb__add_inplace(nb_tensor *dst, const nb_tensor *src);
/* Sum g over broadcast dims so it has shape[ndim]. New reference (g itself if equal). */
nb_tensor *nb__sum_to_shape(nb_tensor *g, const int64_t *shape, int ndim);

/* ---- end-of-backward callbacks (for data parallel, parallel/ddp.c) ---------------------------
 * A gradient hook that starts work which must be finished before backward returns (bucket
 * allreduces) queues fn(ctx, status) here; it runs once, on this thread, when the outermost
 * nb_backward running on this thread ends - after the graph walk, success or not (status
 * says which: a failed backward still lets the callback finish or abandon what it started).
 * A callback's failure becomes nb_backward's status when the backward itself succeeded;
 * otherwise the backward's own error (status and message) is what the caller sees. The same
 * (fn, ctx) queued again in one backward runs once. NB_ESTATE when no backward is running
 * on this thread. */
typedef nb_status (*nb__backward_end_fn)(void *ctx, nb_status backward_status);
nb_status nb__queue_backward_end(nb__backward_end_fn fn, void *ctx);

/* ---- gradient guards (for data parallel, checked by nb_step) -------------------------------
 * A guard says whether a leaf's gradient may be consumed now: fn(leaf, ctx, who) returns
 * NB_OK, or fails with a message starting with `who` (data parallel: gradients that were
 * never averaged over the ranks). One guard per leaf: NB_ESTATE if another is set; fn NULL
 * removes the guard set with this ctx (and leaves another's). nb__check_grad runs the leaf's guard (NB_OK without one). */
typedef nb_status (*nb__grad_guard_fn)(const nb_tensor *leaf, void *ctx, const char *who);
nb_status nb__set_grad_guard(nb_tensor *leaf, nb__grad_guard_fn fn, void *ctx);
nb_status nb__check_grad(const nb_tensor *leaf, const char *who);

/* ---- pre-backward hooks (for ZeRO stage 3, parallel/zero.c) ---------------------------------
 * fn(ctx) runs just before the backward rule of the node that produced t (t->grad_fn), each
 * time a backward runs that rule (not when no gradient reaches the node), in registration
 * order; a failing hook fails that backward with its error. On a module's output it runs
 * before the rules of the ops the module's forward recorded on the way to that output (they
 * run after it: latest first), so it can make the parameters those rules read available.
 * The hook lives as long as the node; ctx must outlive it. NB_EINVAL when t has no grad_fn
 * (a leaf, or made without grad mode). */
nb_status nb__register_pre_backward_hook(nb_tensor *t, nb__pre_backward_fn fn, void *ctx);

/* ---- activation checkpointing (autograd/recompute.c) ----------------------------------------
 * nb__grad_of: the gradients of out (given gout, its shape) with respect to the leaves
 * wrt[0..n), as torch.autograd.grad: written to grads[i] (owned by the caller, NULL where no
 * gradient flowed), never into the leaves' .grad, and no hooks run. Frees the graph's saved
 * tensors as it goes (it is walked once). Every leaf requiring grad the graph reaches must
 * be in wrt (NB_ESTATE otherwise). Runs with grad mode off. */
nb_status nb__grad_of(nb_tensor *out, nb_tensor *gout, nb_tensor *const *wrt, int n,
                      nb_tensor **grads);
/* NB_EINVAL when an input a recompute node saved was written in place since. */
nb_status nb__recompute_check(const nb__node *n);

#endif
