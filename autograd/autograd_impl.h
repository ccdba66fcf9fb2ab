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

#endif
