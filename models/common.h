/* common.h - shared driver of the bundled image classifiers (models/mlp.c, models/cnn.c):
 * flags, data, training loop with progress, JSON-lines logs and TensorBoard scalars,
 * evaluation, checkpoints. */
#ifndef NABLA_MODELS_COMMON_H
#define NABLA_MODELS_COMMON_H

#include <nabla/checkpoint.h>
#include <nabla/nabla.h>

typedef struct nbm_args {
    const char *prog;
    int epochs;
    int64_t batch;
    double lr;
    uint64_t seed;
    int threads;
    const char *data;
    const char *save, *resume, *log;
    const char *tensorboard; /* --tensorboard: folder of the TensorBoard event file */
    const char *override;   /* --override: settings allowed to differ from the --resume file */
    int64_t save_every;     /* checkpoint every N steps (0: after every epoch) */
    int64_t keep;           /* --keep: keep the newest N checkpoints of a series (0: one file) */
    int64_t async_save;     /* --async-save 1: checkpoints written in the background (ft.h) */
    bool eval_only;
    int64_t max_steps;      /* stop after this many steps in total (0: run all epochs) */
    int64_t limit;          /* use only the first N training samples (0: all) */
    int64_t zero;           /* --zero: ZeRO stage (0: nb_ddp over the ranks) */
    nb_dtype precision;     /* --precision: NB_F32 (default), NB_BF16, NB_F16 */
    nb_dtype reduce_dtype;  /* --reduce-dtype: gradients over the ranks in NB_F32 (default),
                             * NB_BF16 or NB_F16 (nb_ddp / nb_zero) */
} nbm_args;

/* Parse the common flags into a (pre-filled with defaults). Returns NBM_RUN to go on, or
 * the exit status: 0 after --help (usage on stdout), 2 after a bad command line (the reason
 * on stderr; the usage too for an unknown flag or a stray argument). */
#define NBM_RUN (-1)
int nbm_parse_args(int argc, char **argv, nbm_args *a);

/* Builds the model and its optimizer for the given args (the model-specific part). */
typedef struct nbm_model {
    const char *name;
    nb_module *(*build)(const nbm_args *a, nb_generator *init);
    nb_optim *(*optimizer)(nb_module *m, const nbm_args *a);
    bool convolutional; /* has convolutions: under bf16, say how they run */
} nbm_model;

/* Train and evaluate; the last line printed is a JSON object. Returns the exit status. */
int nbm_run_classifier(const nbm_model *spec, const nbm_args *a);

#endif
