/* reducer_link.h - private: what the pipeline split (parallel/pipe_split.c) asks of the gradient
 * reducer wrapping a module (nb_ddp / nb_zero over the data-parallel group), found from the
 * module: synchronise during the last backward of a step only, and finish what was held back
 * for the tied parameters. A module no reducer wraps: both are no-ops. Not installed. */
#ifndef NABLA_PARALLEL_REDUCER_LINK_H
#define NABLA_PARALLEL_REDUCER_LINK_H

#include <stdbool.h>

#include "nabla/nn.h"
#include "nabla/status.h"

/* Enable or disable the synchronisation of the reducer wrapping m (its backward hooks then
 * reduce, or only accumulate). */
nb_status nb__reducer_link_set_sync(nb_module *m, bool enabled);
/* After the pipeline summed the tied parameters: reduce them and wait for everything of the
 * step, so the gradients are final. */
nb_status nb__reducer_link_finish(nb_module *m);

#endif
