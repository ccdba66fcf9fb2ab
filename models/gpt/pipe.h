/* pipe.h - `gpt --pp M [--tp N]`: the GPT trained pipeline parallel (nabla/pipeline.h),
 * each stage optionally tensor parallel, under `mpirun -np dp*tp*pp`, as models/gpt/main.c's training but with the model split into stages.
 * Public API only. */
#ifndef NBM_GPT_PIPE_H
#define NBM_GPT_PIPE_H

#include <stdbool.h>
#include <stdint.h>

#include <nabla/nabla.h>

#include "guard.h"

/* The flags of a pipeline run (main.c's, copied). */
typedef struct gpt_pipe_args {
    nb_gpt_config cfg;           /* the model (dropout_gen: set by gpt_pipe_train) */
    int64_t steps, batch;        /* batch: the global batch per step, in sequences */
    int64_t pp, microbatches, virtual_stages;
    int64_t tp;                  /* each stage tensor parallel over tp ranks (1: none) */
    bool sequence_parallel;      /* with tp > 1 */
    const char *pp_schedule;     /* gpipe, 1f1b, interleaved */
    double lr, weight_decay, grad_clip, beta1, beta2;
    const char *schedule;        /* learning rate: cosine or constant, as main.c's */
    int64_t warmup, decay_steps; /* -1 / 0: main.c's defaults */
    double min_lr;               /* < 0: lr / 10 */
    const char *save, *resume;   /* pipeline checkpoint directories; resume may be "auto" */
    int64_t save_every, keep;    /* 0: only at the end (and at a stop); keep 0: --save itself */
    int64_t async_save;          /* 1: stage files written in the background */
    uint64_t seed;
    int64_t threads;
    int64_t zero;                /* 1 or 2: ZeRO over each stage's data-parallel group */
    int64_t eval_every, eval_batches; /* validation loss every N steps (0: only at the end) on
                                       * N fixed batches, as main.c's */
    const char *log, *tensorboard;    /* --log JSON lines, --tensorboard DIR (rank 0); NULL */
    nb_dtype precision;               /* NB_F32, NB_BF16, NB_F16: autocast around steps and
                                       * evaluations (fp16 with loss scaling) */
    const char *recompute;            /* --checkpoint-activations (cfg.recompute says it too) */
    nbm_guard *guard;                 /* --comm-timeout, --on-nonfinite, --max-skips */
} gpt_pipe_args;

/* Train on text (U8 tokens, borrowed; NULL: report that it could not be read, on rank 0).
 * SIGINT / SIGTERM / SIGUSR1 (models/ft.h) stop every rank after the same step, with a
 * checkpoint there when --save is given. Returns the exit status (128 + the signal after a
 * stop). Call before anything starts threads or MPI (the stop handlers are installed first). */
int gpt_pipe_train(const gpt_pipe_args *a, nb_tensor *text);

#endif
