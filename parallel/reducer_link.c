/* reducer_link.c - the pipeline's link to the gradient reducer (parallel/reducer_link.h). */
#include "parallel/reducer_link.h"

nb_status nb__reducer_link_set_sync(nb_module *m, bool enabled) {
    (void)m, (void)enabled;
    return NB_OK;
}

nb_status nb__reducer_link_finish(nb_module *m) {
    (void)m;
    return NB_OK;
}
