/* ft.c - the bundled programs' graceful stop (ft.h). */
#include "ft.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void nbm_stop_begin(const char *prog) {
    if (nb_stop_install() != NB_OK)
        fprintf(stderr, "%s: warning: %s (a signal ends the run without a checkpoint)\n", prog,
                nb_last_error());
}

double nbm_step_sync(nb_comm *world, double v, int *stop) {
    int size = world ? nb_comm_size(world) : 1;
    if (!world || size == 1) {
        *stop = nb_stop_requested();
        return v;
    }
    if (nb_stop_sync(world, &v, stop) != NB_OK) return NAN;
    return v / size;
}

void nbm_stop_fields(nb_jsonl *line, int stop) {
    if (!stop) return;
    nb_jsonl_str(line, "stopped", "signal");
    nb_jsonl_str(line, "signal", nb_stop_signal_name(stop));
}

void nbm_model_state_mib(const nb_zero *zero, nb_optim *opt, nb_module *model, double mib[4]) {
    nb_zero_memory_info mi = {0};
    if (!zero || nb_zero_memory(zero, &mi) != NB_OK) {
        double p = 0; /* parameters and, alike, their gradients */
        const nb_params *ps = nb_parameters(model);
        for (int i = 0; ps && i < ps->count; i++)
            p += (double)nb_numel(ps->tensors[i]) *
                 (double)nb_dtype_size(nb_tensor_dtype(ps->tensors[i]));
        double s = 0;
        const nb_params *st = nb_optim_state(opt);
        for (int i = 0; st && i < st->count; i++)
            if (nb_ndim(st->tensors[i]) > 0) /* not the step counters */
                s += (double)nb_numel(st->tensors[i]) *
                     (double)nb_dtype_size(nb_tensor_dtype(st->tensors[i]));
        nb_optim_state_release(opt);
        mi.params = mi.grads = (int64_t)p;
        mi.optim_state = (int64_t)s;
    }
    const double M = 1048576.0;
    mib[0] = (double)(mi.params + mi.grads + mi.optim_state) / M;
    mib[1] = (double)mi.params / M, mib[2] = (double)mi.grads / M;
    mib[3] = (double)mi.optim_state / M;
}

int nbm_stop_status(int stop) { return stop ? 128 + stop : 0; }

static bool save_async;
static bool collective; /* the last save was of several ranks together */
static nb_checkpoint_writer *writer;

void nbm_save_async(bool on) { save_async = on; }

bool nbm_save_finish(const char *prog, bool wait) {
    nb_checkpoint_writer *w = writer;
    writer = NULL;
    nb_status st = w && wait ? nb_checkpoint_writer_wait(w) : NB_OK;
    if (st != NB_OK) fprintf(stderr, "%s: %s\n", prog, nb_last_error());
    if (nb_checkpoint_writer_free(w) == NB_OK) return st == NB_OK;
    if (st == NB_OK) fprintf(stderr, "%s: %s\n", prog, nb_last_error());
    return false;
}

nb_status nbm_save(const char *path, int64_t keep, const nb_checkpoint *ck) {
    nb_checkpoint c = *ck;
    c.keep = keep <= 0 ? 0 : keep > 1000000 ? 1000000 : (int)keep;
    collective = ck->comm && nb_comm_size(ck->comm) > 1;
    if (!save_async) return nb_checkpoint_save(path, &c);
    if (!writer && !(writer = nb_checkpoint_writer_new(NULL))) return nb_last_status();
    nb_status st = nb_checkpoint_writer_save(writer, path, &c);
    /* one process about to exit: its file on disk now (several ranks: nbm_save_finish) */
    if (st == NB_OK && !collective && nb_stop_requested()) st = nb_checkpoint_writer_wait(writer);
    return st;
}

bool nbm_resume_path(const char *prog, bool main_rank, const char *resume, const char *save,
                     char *buf, size_t n, const char **out) {
    *out = resume;
    if (!resume || strcmp(resume, "auto") != 0) return true;
    int64_t step;
    if (nb_checkpoint_latest(save, buf, n, &step) != NB_OK) {
        fprintf(stderr, "%s: --resume auto: %s\n", prog, nb_last_error());
        return false;
    }
    *out = step >= 0 ? buf : NULL;
    if (step < 0 && main_rank)
        printf("%s: --resume auto: no checkpoint in %s yet: starting from step 0\n", prog, save);
    return true;
}
