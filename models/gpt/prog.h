/* prog.h - what the files of the gpt program share: the command line (args.c), the state of
 * one training run (setup.c fills and frees it, train.c runs and reports it), and the
 * --comm-timeout/--on-nonfinite and --device settings (main.c). main.c says what the program
 * does. */
#ifndef NBM_GPT_PROG_H
#define NBM_GPT_PROG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <nabla/nabla.h>
#include <nabla/run.h>
#include <nabla/summary.h>

#include "arch.h"
#include "device.h"
#include "guard.h"

/* --comm-timeout, --on-nonfinite, --max-skips (guard.h), and the skipped steps' count */
extern nbm_guard guard;
/* --device (device.h) */
extern nbm_device device;

#define KJV_COMMAND "bible gen1:1-rev22:21"

typedef struct args {
    /* model */
    nbm_arch_kind arch; /* --arch gpt|llama */
    bool arch_given;
    int64_t n_layer, n_head, n_kv_head, n_embd, block_size;
    double dropout;
    int64_t bias, gelu_tanh;
    const char *recompute; /* --checkpoint-activations */
    /* training */
    const char *data;
    /* batch: sequences per optimizer step over every rank and micro-batch (--batch, the
     * global batch in every layout); a micro-batch is batch / microbatches of them, of which
     * each data-parallel rank trains batch / microbatches / dp rows */
    int64_t steps, decay_steps, batch, warmup, eval_every, eval_batches, save_every;
    int64_t keep, async_save;
    double lr, weight_decay, min_lr, grad_clip, beta1, beta2;
    const char *schedule;
    const char *save, *resume, *log, *override, *tensorboard;
    int64_t threads, zero, tp;
    bool sequence_parallel;
    /* --pp; --microbatches (= --grad-accum): micro-batches per step, gradient accumulation or
     * the pipeline's; --virtual-stages */
    int64_t pp, microbatches, virtual_stages;
    const char *pp_schedule;
    nb_dtype precision; /* --precision: NB_F32 (default), NB_BF16, NB_F16 */
    nb_dtype reduce_dtype; /* --reduce-dtype: gradients over the ranks (nb_ddp, nb_zero) */
    uint64_t seed;
    /* sampling */
    bool sample;
    const char *load, *prompt;
    int64_t tokens, top_k;
    double temperature;
} args;

/* Returns RUN to go on, or the exit status: 0 after --help (usage on stdout), 2 after a bad
 * command line (the reason on stderr; the usage too for an unknown flag or stray argument). */
#define RUN (-1)
int parse_args(int argc, char **argv, args *a);

/* ---- one training run, in pieces ---------------------------------------------------------
 * The state of a run; the setup_* pieces fill it, train_step() runs one optimizer step,
 * log_step() and evaluate_and_log() report, print_result() writes the last line and
 * teardown() frees everything. Errors are reported where they happen (fail()), and the
 * piece returns false. */
typedef struct run {
    const args *a;
    nb_comm *world;
    int rank, size;
    bool main_rank; /* prints, logs and saves */
    int64_t B, T, N; /* global batch, context, micro-batches per step */
    nb_generator *init, *batch_gen, *drop_gen, *val_gen;
    nb_generator *gens[2]; /* in the checkpoint: the batch order and the dropout stream */
    /* xs, ys: the global micro-batches (B, T); xl, yl: this rank's rows of them */
    nb_tensor *text, *train, *val, *xg, *yg, **xs, **ys, **xl, **yl, *vx, *vy;
    nbm_arch arch; /* the model's architecture and (resolved) config */
    nb_module *model;
    nb_optim *opt;
    nb_sched *sched;
    nb_params decay, no_decay;
    nb_ddp *ddp;
    nb_zero *zero; /* --zero 1|2|3 instead of ddp */
    nb_grad_scaler *scaler; /* --precision fp16: dynamic loss scaling; NULL otherwise */
    nb_mesh *mesh;     /* dp x pp x tp over the world */
    nb_pipeline *pipe; /* --pp > 1: the model split into stages; NULL otherwise */
    nb_module *mine;   /* this rank's part of the model: the pipeline's module, or the model */
    nb_pipe_stats ps;  /* the last step's pipeline figures */
    double bubble_sum; /* over the steps run */
    double exposed_sum, tp_sum; /* exposed and tensor-parallel communication, seconds */
    int64_t peak_live;
    nb_comm *dp;       /* the data-parallel group (borrowed from the mesh) */
    int dp_rank, dp_size;
    nb_checkpoint ck;
    nb_run_config conf; /* the settings in the checkpoints */
    nb_jsonl *log;      /* --log (rank 0; NULL otherwise) */
    nb_summary *tb;     /* --tensorboard (rank 0; NULL otherwise) */
    bool tb_failed;     /* a TensorBoard write failed (warned once) */
    nb_progress *bar;
    double *times; /* per-step seconds */
    int64_t step, first, val_step, steady_allocs, n_last, tokens_per_step;
    int stop; /* the signal all ranks stop with (nabla/stop.h); 0: training goes on */
    bool usage; /* the failure is a usage error (a layout that cannot be): exit status 2 */
    bool diverged_val; /* stopped by a validation loss that is not finite (final line kept) */
    double val_loss, last_losses[10], flops;
} run;

/* The message on stderr (nb_report: with the rank under several); returns false. */
__attribute__((format(printf, 2, 3))) bool fail(const run *r, const char *fmt, ...);

/* setup.c: fill r (a = r->a, B, T, N set) for training; teardown() frees what it holds. */
bool setup(run *r);
void teardown(run *r);

/* train.c: the loop, the last line, the logs' closing and a parallel run's consolidated model */
bool train_loop(run *r);
void print_result(const run *r, double wall_s);
bool close_logs(run *r);
bool consolidate_end(run *r);

#endif
