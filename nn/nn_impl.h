/* nn_impl.h - private: what the parallel layer needs of the module object beyond the public
 * API (nn/module.c): replacing a module's forward in place (a tensor-parallel style makes a
 * linear layer column- or row-parallel without a new module), and containers that borrow
 * modules under dotted names (a pipeline stage: the modules of a model that live on this
 * rank, named as in the whole model). Not installed. */
#ifndef NABLA_NN_IMPL_H
#define NABLA_NN_IMPL_H

#include <stdbool.h>

#include "nabla/nn.h"

/* The function nb_forward(m, x) runs instead of m's own forward (hooks and activation
 * checkpointing still apply around it). ctx is passed back; ctx_free (may be NULL) releases
 * it when the override is replaced or m is freed. fn NULL restores m's own forward. */
typedef nb_tensor *(*nb__forward_fn)(nb_module *m, nb_tensor *x, void *ctx);
nb_status nb__module_override_forward(nb_module *m, nb__forward_fn fn, void *ctx,
                                      void (*ctx_free)(void *));
/* The override's context, or NULL when m runs its own forward. */
void *nb__module_override_ctx(const nb_module *m);
/* m's vtable (its own forward, whatever the override). */
const nb_module_vtable *nb__module_vtable(const nb_module *m);
/* m's parent (NULL for a root). */
nb_module *nb__module_parent(const nb_module *m);

/* A container with no forward whose members are borrowed: modules and parameters of another
 * module tree, registered under any name (dots allowed: "transformer.h.3"), so nb_parameters
 * lists them with their names in the whole model. Freeing it frees none of them; they must
 * outlive it, and its listing is not refreshed when they change (build it once their
 * parameters are final). */
nb_module *nb__module_view_new(void);
nb_status nb__module_view_add_child(nb_module *view, const char *name, nb_module *child);
nb_status nb__module_view_add_param(nb_module *view, const char *name, nb_tensor *t);

/* nb_sequential's fusion of a ReLU followed by a MaxPool2d (nn/module.c): whether m is a
 * ReLU module (nn/layers.c) or a MaxPool2d (nn/pool.c), and a MaxPool2d's pool of relu(x),
 * as nb_relu_maxpool2d with its window. */
bool nb__relu_module(const nb_module *m);
bool nb__maxpool_module(const nb_module *m);
nb_tensor *nb__maxpool_module_relu_forward(const nb_module *m, nb_tensor *x);

#endif
