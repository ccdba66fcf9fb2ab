/* pipeline_impl.h - private: the schedule engine's entry with hooks (parallel/pipeline.c), for
 * the pipeline split (parallel/pipe_split.c), which enables the gradient reducer's
 * synchronisation for a rank's last backward of a step only; and whether a module is a
 * pipeline's (for nb_zero). Not installed. */
#ifndef NABLA_PARALLEL_PIPELINE_IMPL_H
#define NABLA_PARALLEL_PIPELINE_IMPL_H

#include <stdbool.h>

#include "nabla/pipeline.h"

typedef struct nb__pipe_hooks {
    /* Before each backward operation of this rank (last: the last one of the step). */
    nb_status (*before_backward)(void *ctx, int chunk, int micro, bool last);
    void *ctx;
} nb__pipe_hooks;

/* Whether m is a live pipeline's module or one of its chunks (nb_pipeline_module): nb_zero_new
 * refuses stage 3 over it. */
bool nb__is_pipeline_module(const nb_module *m);

/* nb_pipe_run with hooks (NULL: none). */
double nb__pipe_run(nb_comm *pp, const nb_pipe_opts *o, nb_pipe_stage_fn fn, void *ctx,
                    nb_pipe_stats *stats, const nb__pipe_hooks *hooks);

#endif
