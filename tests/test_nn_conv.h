/* test_nn_conv.h - what the nn_conv suite's files (tests/test_nn_conv.c, tests/test_nn_pool.c)
 * share: the float dtypes they run every case in, and a backward pass from a given output
 * gradient. */
#ifndef NABLA_TEST_NN_CONV_H
#define NABLA_TEST_NN_CONV_H

#include "testutil.h"

static const nb_dtype k_float_dtypes[] = {NB_F32, NB_F64, NB_F16, NB_BF16};

/* Backpropagate gradient g from y (the gradient of sum(y * g)). */
static inline nb_status backward_with(nb_tensor *y, nb_tensor *g) {
    nb_backward_opts bo = nb_backward_defaults();
    bo.grad_output = g;
    return nb_backward_ex(y, &bo);
}

#endif
