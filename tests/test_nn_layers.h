/* test_nn_layers.h - what the nn_layers suite's files (tests/test_nn_layers.c,
 * tests/test_nn_modules.c) share: a comparison over a tensor's own shape, a backward pass from
 * a given output gradient, and a tensor made to require its gradient. */
#ifndef NABLA_TEST_NN_LAYERS_H
#define NABLA_TEST_NN_LAYERS_H

#include "testutil.h"

/* Compare t with ref over t's own shape. */
#define CLOSE(t, ref, tol) tu_assert_close((t), (ref), nb_shape(t), nb_ndim(t), (tol))

/* Backward from y with the given output gradient (no sum/mul rules needed). */
static inline void backward_with(nb_tensor *y, nb_tensor *g) {
    nb_backward_opts o = nb_backward_defaults();
    o.grad_output = g;
    ck_assert_msg(nb_backward_ex(y, &o) == NB_OK, "backward: %s", nb_last_error());
}

static inline void make_grad(nb_tensor *t) { ck_assert(nb_set_requires_grad(t, true) == NB_OK); }

#endif
