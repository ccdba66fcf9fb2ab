/* common.h - shared driver of the bundled image classifiers (models/mlp.c, models/cnn.c):
 * flags, data, training loop with progress and JSON-lines logs, evaluation, checkpoints. */
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
    bool eval_only;
    int64_t max_steps;      /* stop after this many steps in total (0: run all epochs) */
    int64_t limit;          /* use only the first N training samples (0: all) */
} nbm_args;

/* Parse the common flags into a (pre-filled with defaults); returns false after printing
 * usage or an error. */
bool nbm_parse_args(int argc, char **argv, nbm_args *a);

/* Builds the model and its optimizer for the given args (the model-specific part). */
typedef struct nbm_model {
    const char *name;
    nb_module *(*build)(const nbm_args *a, nb_generator *init);
    nb_optim *(*optimizer)(nb_module *m, const nbm_args *a);
} nbm_model;

/* Train and evaluate; the last line printed is a JSON object. Returns the exit status. */
int nbm_run_classifier(const nbm_model *spec, const nbm_args *a);

#endif
