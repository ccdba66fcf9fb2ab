/* module_model.h - the small model the module fuzz target loads into, shared by
 * fuzz_module.c and make_corpus (whose seed files are saves of this model, so they load). */
#ifndef NABLA_FUZZ_MODULE_MODEL_H
#define NABLA_FUZZ_MODULE_MODEL_H

#include "nabla/nn.h"

/* linear 4->hidden, layer norm, batch norm (running buffers), linear hidden->3 */
static inline nb_module *fuzz_module_model(int64_t hidden) {
    return nb_sequential_new(nb_linear_new(4, hidden, NULL), nb_layer_norm_new(hidden, NULL),
                             nb_batch_norm1d_new(hidden, NULL), nb_linear_new(hidden, 3, NULL),
                             NULL);
}

#endif
