/* common.c - the training driver shared by the bundled Fashion-MNIST classifiers: flags,
 * data loading, the training loop (live progress on a terminal, periodic lines otherwise,
 * JSON lines with --log, TensorBoard scalars with --tensorboard), evaluation, checkpoints
 * (--save / --resume) and the final JSON line. Uses the public API only (the run toolkit of
 * nabla/run.h for progress, logs and flags). The run is split into short pieces - setup,
 * one step, one epoch, evaluate, log - that a program of your own can copy.
 *
 * Data parallel: started under mpirun (`mpirun -np 2 build/models/mlp`), the same program
 * trains with nb_ddp over all ranks. --batch stays the global batch: each rank takes
 * batch / world samples of it (the loader's shard of each global batch), gradients are
 * averaged, so the run follows the 1-process one. Evaluation is split over the ranks by
 * batch and the counts summed; only rank 0 prints and logs. Checkpoints are saved and loaded
 * by every rank together (nabla/checkpoint.h): rank 0 writes DDP's one file, under ZeRO each
 * rank its shard of a folder; --resume reads either into any number of ranks and stage. */
#include "common.h"
#include "ft.h"
#include "guard.h"
#include "device.h"
#include "precision.h"

#include <nabla/parallel.h>
#include <nabla/run.h>
#include <nabla/summary.h>

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static void usage(const nbm_args *a, FILE *out) {
    fprintf(out,
            "usage: %s [flags]\n"
            "  --epochs N       training epochs (default %d)\n"
            "  --batch N        global batch size (default %lld)\n"
            "  --lr X           learning rate (default %g)\n"
            "  --seed N         seed of initialization, shuffling, dropout (default %llu)\n"
            "  --threads N      CPU threads (default: all cores)\n"
            "  --precision P    fp32, bf16 or fp16: autocast of the steps and evaluations\n"
            "                   (default fp32; docs/mixed-precision.md)\n"
            "  --data DIR       Fashion-MNIST directory (default %s)\n"
            "  --save FILE      write a checkpoint after every epoch\n"
            "  --save-every N   write it every N steps instead (and at the end)\n"
            "  --keep N         a file per checkpoint (FILE-<step>, or DIR/checkpoint-<step>.ckpt),\n"
            "                   the newest N kept\n"
            "  --async-save 0|1 1: write checkpoints in the background while training goes on\n"
            "  --resume FILE    continue from a checkpoint written with the same settings\n"
            "                   (auto: the newest intact one of --save, if any)\n"
            "  --override LIST  settings (lr, batch, limit; comma-separated) that may\n"
            "                   differ from the --resume checkpoint's, e.g. --override lr\n"
            "  --log FILE       JSON lines: one per logged step and per epoch\n"
            "  --tensorboard DIR  TensorBoard scalars (loss, lr, samples/s, test loss and\n"
            "                   accuracy, memory) in an event file in DIR\n"
            "  --eval-only      evaluate (the --resume checkpoint, or the initial model)\n"
            "  --max-steps N    stop after N training steps in total\n"
            "  --limit N        train on the first N samples only\n"
            "  --zero S         ZeRO stage 0-3 (1: optimizer state sharded over the ranks, 2:\n"
            "                   gradients too, 3: parameters too; default 0: nb_ddp); --save\n"
            "                   then writes a sharded checkpoint (a directory) that\n"
            "                   --resume reshards\n"
            "  --reduce-dtype D fp32, bf16 or fp16: the dtype the gradients travel in between\n"
            "                   the ranks (nb_ddp and --zero; summed in f32; default fp32;\n"
            "                   docs/distributed.md, \"Compressed communication\")\n",
            a->prog, a->epochs, (long long)a->batch, a->lr, (unsigned long long)a->seed,
            NB_FASHION_MNIST_DIR);
    nbm_guard_usage(out);
    nbm_device_usage(out);
}

/* --comm-timeout, --on-nonfinite, --max-skips (guard.h), and the skipped steps' count */
static nbm_guard guard;
/* --device (device.h) */
static nbm_device device;

/* The flags that take a value, and whether each still has an effect with --eval-only. */
static const struct {
    const char *name;
    bool eval_only_too;
} value_flags[] = {{"--epochs", false}, {"--batch", true},     {"--lr", false},
                   {"--seed", true},    {"--threads", true},   {"--data", true},
                   {"--save", false},   {"--resume", true},    {"--log", false},
                   {"--max-steps", false}, {"--limit", false}, {"--save-every", false},
                   {"--override", false}, {"--tensorboard", false}, {"--zero", false},
                   {"--keep", false}, {"--async-save", false}, {"--precision", true},
                   {"--reduce-dtype", false}};
enum { N_VALUE_FLAGS = sizeof value_flags / sizeof value_flags[0] };

int nbm_parse_args(int argc, char **argv, nbm_args *a) {
    bool given[N_VALUE_FLAGS] = {0};
    if (!nbm_guard_args(a->prog, &argc, argv, &guard)) return 2;
    if (!nbm_device_args(a->prog, &argc, argv, &device)) return 2;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t n;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            usage(a, stdout);
            return 0;
        } else if (!strcmp(f, "--eval-only")) {
            if (a->eval_only) return nbm_repeated(a->prog, f);
            a->eval_only = true;
            continue;
        } else if (strncmp(f, "-", 1)) { /* the programs take no file or other operand */
            fprintf(stderr, "%s: unexpected argument \"%s\" (every input is a flag)\n",
                    a->prog, f);
            usage(a, stderr);
            return 2;
        }
        /* Known before its value is looked at, so that a last "--bogus" is called unknown. */
        int k = 0;
        while (k < N_VALUE_FLAGS && strcmp(f, value_flags[k].name)) k++;
        if (k == N_VALUE_FLAGS) {
            fprintf(stderr, "%s: unknown flag %s\n", a->prog, f);
            usage(a, stderr);
            return 2;
        }
        if (given[k]) return nbm_repeated(a->prog, f);
        given[k] = true;
        i++; /* every other flag takes a value */
        if (!v) {
            fprintf(stderr, "%s: %s needs a value (see --help)\n", a->prog, f);
            return 2;
        }
        bool ok = true;
        if (!strcmp(f, "--epochs")) {
            if ((ok = nb_parse_int(a->prog, f, v, 0, 1000000, &n))) a->epochs = (int)n;
        } else if (!strcmp(f, "--batch")) {
            ok = nb_parse_int(a->prog, f, v, 1, NB_MAX_BATCH, &a->batch);
        } else if (!strcmp(f, "--lr")) {
            ok = nb_parse_num(a->prog, f, v, 0, true, NB_MAX_LR, false, &a->lr);
        } else if (!strcmp(f, "--seed")) {
            if ((ok = nb_parse_int(a->prog, f, v, 0, INT64_MAX, &n))) a->seed = (uint64_t)n;
        } else if (!strcmp(f, "--threads")) {
            if ((ok = nb_parse_int(a->prog, f, v, 0, NB_MAX_THREADS, &n))) a->threads = (int)n;
        } else if (!strcmp(f, "--precision")) {
            ok = nbm_parse_precision(a->prog, v, &a->precision);
        } else if (!strcmp(f, "--data")) {
            a->data = v;
        } else if (!strcmp(f, "--save")) {
            a->save = v;
        } else if (!strcmp(f, "--resume")) {
            a->resume = v;
        } else if (!strcmp(f, "--log")) {
            a->log = v;
        } else if (!strcmp(f, "--max-steps")) {
            ok = nb_parse_int(a->prog, f, v, 0, INT64_MAX, &a->max_steps);
        } else if (!strcmp(f, "--limit")) {
            ok = nb_parse_int(a->prog, f, v, 0, INT64_MAX, &a->limit);
        } else if (!strcmp(f, "--save-every")) {
            ok = nb_parse_int(a->prog, f, v, 1, INT64_MAX, &a->save_every);
        } else if (!strcmp(f, "--override")) {
            a->override = v;
        } else if (!strcmp(f, "--tensorboard")) {
            a->tensorboard = v;
        } else if (!strcmp(f, "--keep")) {
            ok = nb_parse_int(a->prog, f, v, 1, 1000000, &a->keep);
        } else if (!strcmp(f, "--async-save")) {
            ok = nb_parse_int(a->prog, f, v, 0, 1, &a->async_save);
        } else if (!strcmp(f, "--zero")) {
            ok = nb_parse_int(a->prog, f, v, 0, 3, &a->zero);
        } else if (!strcmp(f, "--reduce-dtype")) {
            ok = nbm_parse_reduce_dtype(a->prog, v, &a->reduce_dtype);
        }
        if (!ok) return 2;
    }
    /* Nothing trains with --eval-only: a training flag there is a mistake, not a no-op. */
    for (int k = 0; a->eval_only && k < N_VALUE_FLAGS; k++)
        if (given[k] && !value_flags[k].eval_only_too) {
            fprintf(stderr, "%s: %s has no effect with --eval-only (nothing is trained)\n",
                    a->prog, value_flags[k].name);
            return 2;
        }
    if (a->eval_only && guard.train_flag) {
        fprintf(stderr, "%s: %s has no effect with --eval-only (nothing is trained)\n", a->prog,
                guard.train_flag);
        return 2;
    }
    if (a->async_save && !a->save) {
        fprintf(stderr, "%s: --async-save needs --save\n", a->prog);
        return 2;
    }
    if (a->save_every && !a->save) {
        fprintf(stderr, "%s: --save-every has no effect without --save\n", a->prog);
        return 2;
    }
    if ((a->keep || (a->resume && !strcmp(a->resume, "auto"))) && !a->save) {
        fprintf(stderr, "%s: %s needs --save (the checkpoints it works on)\n", a->prog,
                a->keep ? "--keep" : "--resume auto");
        return 2;
    }
    if (a->override && !a->resume) {
        fprintf(stderr, "%s: --override has no effect without --resume\n", a->prog);
        return 2;
    }
    return NBM_RUN;
}

/* Accuracy and mean loss over a loader's epoch, in eval mode with grad mode off. With
 * several ranks, rank r evaluates the batches b with b % world == r and the sums are
 * reduced, so every rank gets the result over the whole set (exactly: no padding). */
static nb_status evaluate(nb_module *m, nb_loader *l, nb_comm *world, double *acc,
                          double *loss, nb_dtype prec) {
    int64_t correct = 0, total = 0;
    double loss_sum = 0;
    int rank = nb_comm_rank(world), size = nb_comm_size(world);
    bool bad = false;
    nb_module_train(m, false);
    bool prev = nb_set_grad_enabled(false);
    for (nb_batch b; nb_loader_next(l, &b);) {
        if (b.index % size != rank) continue;
        nb_scope_begin();
        bool ac = nbm_precision_begin(prec) == NB_OK;
        nb_tensor *x = nbm_on_device(b.x), *y = nbm_on_device(b.y); /* --device */
        nb_tensor *logits = ac && x ? nb_forward(m, x) : NULL;
        nb_tensor *ok = nb_sum(nb_eq(nb_argmax(logits, 1, false), y), NULL, 0, false);
        nb_cross_entropy_opts ce = nb_cross_entropy_defaults();
        ce.reduction = NB_REDUCTION_SUM;
        nb_tensor *ls = nb_cross_entropy(logits, y, &ce);
        if (ac) nbm_precision_end(prec);
        if (ok && ls) {
            correct += nb_item_i64(ok);
            loss_sum += nb_item_f64(ls);
            total += b.n;
        }
        nb_scope_end();
        if ((bad = !ok || !ls)) break;
    }
    nb_set_grad_enabled(prev);
    nb_module_train(m, true);
    nb_status local = bad ? (nb_last_status() ? nb_last_status() : NB_EINVAL) : nb_loader_error(l);
    if (size > 1) { /* every rank takes part, even one that failed, so none waits forever */
        double sums[4] = {(double)correct, (double)total, loss_sum, local != NB_OK};
        nb_scope_begin();
        nb_tensor *t = nb_from_buffer(sums, (int64_t[]){4}, 1, NB_F64);
        nb_status s = t ? nb_allreduce(world, t, NB_REDUCE_SUM) : nb_last_status();
        if (s == NB_OK) s = nb_read(t, sums, 4, NB_F64);
        nb_scope_end();
        if (s != NB_OK) return s;
        if (local == NB_OK && sums[3] > 0)
            return NB_ECOMM; /* another rank failed (and says why) */
        correct = (int64_t)sums[0], total = (int64_t)sums[1], loss_sum = sums[2];
    }
    if (local != NB_OK || total == 0) return nb_last_status() ? nb_last_status() : NB_EINVAL;
    *acc = (double)correct / (double)total;
    *loss = loss_sum / (double)total;
    return NB_OK;
}

/* ---- one training run, in pieces ---------------------------------------------------------
 * The state of a run; setup() fills it, train_epoch() runs train_step() over the loader and
 * logs with log_step(), log_epoch() reports an epoch's evaluation, finish() prints the last
 * line, teardown() frees what setup made. Errors are reported where they happen (fail()),
 * and the piece returns false. */
typedef struct run {
    const nbm_model *spec;
    const nbm_args *a;
    nb_comm *world;
    int rank, size;
    bool main_rank; /* prints, logs and saves */
    nb_generator *init;
    nb_dataset *train_ds, *test_ds;
    nb_loader *train_l, *test_l;
    nb_module *model;
    nb_optim *opt;
    nb_ddp *ddp;
    nb_zero *zero; /* --zero 1|2|3 instead of ddp */
    nb_grad_scaler *scaler; /* --precision fp16: dynamic loss scaling; NULL otherwise */
    nb_checkpoint ck;
    nb_run_config cfg; /* the settings in the checkpoints */
    nb_jsonl *log;     /* --log (rank 0; NULL otherwise) */
    nb_summary *tb;    /* --tensorboard (rank 0; NULL otherwise) */
    bool tb_failed;    /* a TensorBoard write failed (warned once) */
    nb_progress *bar;
    int64_t step, total_steps, per_epoch;
    int stop;           /* the signal all ranks stop with (nabla/stop.h); 0: training goes on */
    int64_t saved_step; /* the step of the last checkpoint written, -1 for none */
    /* results */
    double *step_times; /* per-step seconds after 10 warm-up steps, for the median */
    int64_t n_times, max_times;
    double acc, test_loss, train_loss, train_time;
    int64_t samples, steady_allocs;
    nb_alloc_stats st0;
    /* the current epoch */
    double loss_sum, comm_sum;
    int64_t n_loss;
} run;

__attribute__((format(printf, 2, 3))) static bool fail(const run *r, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    nb_report(r->a->prog, r->rank, r->size, "%s", msg);
    return false;
}

/* Write --save, on every rank (a collective): rank 0 writes the one file of a DDP run (the
 * weights are the same on every rank), under ZeRO each rank its shard of a folder. */
static nb_status save_checkpoint(run *r) {
    r->ck.step = r->step;
    return nbm_save(r->a->save, r->a->keep, &r->ck);
}

/* One TensorBoard scalar at the current step; the first failed write warns (the run goes
 * on, and its exit status says the file is incomplete). */
static void tb_scalar(run *r, const char *tag, double v) {
    if (!r->tb || nb_summary_scalar(r->tb, tag, r->step, v) == NB_OK || r->tb_failed) return;
    r->tb_failed = true;
    nb_report(r->a->prog, r->rank, r->size, "warning: %s; the TensorBoard file is incomplete "
              "(the run goes on, and exits with status 1)", nb_last_error());
}

/* Data: the training set sharded over the ranks, the test set whole. */
static bool setup_data(run *r) {
    const nbm_args *a = r->a;
    nb_mnist_opts mo = nb_mnist_defaults();
    if (a->limit > 0) mo.limit = a->limit;
    r->train_ds = nb_fashion_mnist_new(a->data, true, &mo);
    r->test_ds = r->train_ds ? nb_fashion_mnist_new(a->data, false, NULL) : NULL;
    if (!r->test_ds)
        return fail(r, "%s (install the Debian package dataset-fashion-mnist, or pass --data DIR)",
                    nb_last_error());
    /* Rank r's batch i is its shard (samples r, r + world, ...) of global batch i. */
    nb_loader_opts lo = nb_loader_defaults();
    lo.batch_size = a->batch / r->size;
    lo.shuffle = true;
    lo.seed = a->seed;
    lo.drop_last = true;
    lo.prefetch = 2;
    lo.rank = r->rank;
    lo.world_size = r->size;
    lo.device = nb_default_device(); /* --device: batches copied there by the loader thread */
    r->train_l = nb_loader_new(r->train_ds, &lo);
    lo = nb_loader_defaults();
    lo.batch_size = 1000;
    r->test_l = nb_loader_new(r->test_ds, &lo);
    if (!r->train_l || !r->test_l) return fail(r, "%s", nb_last_error());
    return true;
}

/* The model, its optimizer, the logs, the checkpoint (resumed when asked) and DDP. */
static bool setup_model(run *r) {
    const nbm_args *a = r->a;
    r->model = r->spec->build(a, r->init);
    r->opt = r->model ? r->spec->optimizer(r->model, a) : NULL;
    if (!r->opt) return fail(r, "%s", nb_last_error());
    if (r->main_rank && a->log && !(r->log = nb_jsonl_open(a->prog, a->log, "w")))
        return fail(r, "%s", nb_last_error());
    if (r->main_rank && a->tensorboard && !(r->tb = nb_summary_open(a->tensorboard)))
        return fail(r, "--tensorboard: %s", nb_last_error());
    r->ck = (nb_checkpoint){.model = r->model, .optim = r->opt, .loader = r->train_l,
                            .comm = r->size > 1 ? r->world : NULL};
    if (a->precision == NB_F16) { /* fp16 gradients underflow without loss scaling */
        if (!(r->scaler = nb_grad_scaler_new(NULL)) ||
            (r->size > 1 && nb_grad_scaler_set_comm(r->scaler, r->world) != NB_OK))
            return fail(r, "%s", nb_last_error());
        r->ck.scaler = r->scaler; /* its scale and counters resume with the run */
    }
    /* The settings that change the results travel with the checkpoint (nabla/run.h). */
    nb_run_config_num(&r->cfg, "lr", a->lr);
    nb_run_config_int(&r->cfg, "batch", a->batch);
    nb_run_config_int(&r->cfg, "seed", (int64_t)a->seed);
    nb_run_config_fixed(&r->cfg, "the checkpoint's loader continues its shuffled epoch from it");
    nb_run_config_int(&r->cfg, "limit", a->limit);
    if (!nb_run_config_apply(&r->cfg, &r->ck, a->prog, a->override)) return false;
    const char *resume; /* --resume auto: the newest valid checkpoint of --save, if any */
    char auto_path[4400];
    if (!nbm_resume_path(a->prog, r->main_rank, a->resume, a->save, auto_path,
                         sizeof auto_path, &resume))
        return false;
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = (int)a->zero;
    zo.reduce_dtype = a->reduce_dtype;
    if (a->zero > 0 && !(r->zero = nb_zero_new(r->model, r->opt, r->world, &zo)))
        return fail(r, "%s", nb_last_error());
    nb_ddp_opts dopts = nb_ddp_defaults();
    dopts.reduce_dtype = a->reduce_dtype;
    if (!r->zero && r->size > 1 && !(r->ddp = nb_ddp_new(r->model, r->world, &dopts)))
        return fail(r, "%s", nb_last_error());
    if (resume) { /* every rank loads it (optimizer state and loader position too); a
                   * checkpoint of any layout reshards to this run's ranks and stage */
        if (nb_checkpoint_load(resume, &r->ck) != NB_OK)
            return fail(r, "%s%s", nb_last_error(), nb_run_config_hint(nb_last_error()));
        r->step = r->ck.step;
        if (r->main_rank) printf("resumed from %s at step %lld\n", resume, (long long)r->step);
    }
    return true;
}

static bool setup(run *r) {
    const nbm_args *a = r->a;
    r->world = nb_comm_world(); /* size 1 without a launcher */
    if (!r->world) return fail(r, "%s", nb_last_error());
    r->rank = nb_comm_rank(r->world), r->size = nb_comm_size(r->world);
    r->main_rank = r->rank == 0;
    nbm_guard_comm(&guard, r->world); /* a dead or hung peer: an error after this long */
    nb_share_threads(r->world, a->threads);
    if (!nbm_device_use(a->prog, &device)) return false; /* said why */
    if (a->batch % r->size != 0)
        return fail(r, "--batch %lld is the global batch and must divide by the %d ranks",
                    (long long)a->batch, r->size);
    if (!setup_data(r) || !setup_model(r)) return false;
    r->per_epoch = nb_loader_num_batches(r->train_l);
    r->total_steps = r->per_epoch * a->epochs;
    if (a->max_steps && a->max_steps < r->total_steps) r->total_steps = a->max_steps;
    r->max_times = r->total_steps > 0 ? r->total_steps : 1;
    if (!(r->step_times = malloc(sizeof(double) * (size_t)r->max_times)))
        return fail(r, "out of memory");
    nb_progress_opts po = nb_progress_defaults();
    po.total = r->total_steps;
    po.start = r->step;
    po.enabled = r->main_rank;
    if (!(r->bar = nb_progress_new(&po))) return fail(r, "%s", nb_last_error());
    return true;
}

/* One training step on batch b; this rank's loss into *loss (NAN: the step was skipped). */
static bool train_step(run *r, const nb_batch *b, double *loss) {
    nb_scope_begin();
    nb_tensor *l = NULL;
    if (nbm_precision_begin(r->a->precision) == NB_OK) { /* the forward and the loss */
        nb_tensor *x = nbm_on_device(b->x); /* --device: the batch to the model's device */
        l = x ? nb_cross_entropy(nb_forward(r->model, x), nbm_on_device(b->y), NULL) : NULL;
        nbm_precision_end(r->a->precision);
    }
    double f = nbm_guard_test_factor(r->step + 1, r->rank); /* 1, but NaN in tests */
    if (l && f != 1.0) l = nb_mul_scalar(l, f);
    nb_status s = l ? nb_zero_grad(r->opt) : nb_last_status();
    /* fp16: the loss scaled up so small gradients survive in f16, unscaled before use */
    if (s == NB_OK) s = nb_backward(r->scaler ? nb_grad_scaler_scale(r->scaler, l) : l);
    if (s == NB_OK && r->ddp) s = nb_ddp_sync(r->ddp); /* DDP: buckets start in backward */
    if (s == NB_OK && r->zero) s = nb_zero_sync(r->zero);
    if (s == NB_OK && r->scaler) s = nb_grad_scaler_unscale(r->scaler, r->opt);
    /* the norm of the gradient every rank applies (averaged over the ranks: the same on
     * all); a non-finite one is never applied, it would make every weight NaN */
    double norm = 0;
    if (s == NB_OK) {
        /* under ZeRO the parameters' placements make it the norm over every shard */
        norm = nb_clip_grad_norm(nb_optim_params(r->opt), INFINITY, 2);
        if (norm < 0) s = nb_last_status();
    }
    if (s == NB_OK && r->scaler) {
        /* an inf/NaN gradient is the scaler's to handle: it skips the step and halves the
         * scale (an error naming the step once the scale falls below 1) */
        s = nb_grad_scaler_step_update(r->scaler, r->opt);
        if (!isfinite(norm)) norm = 0; /* not a diverged run: the guard does not see it */
    } else if (s == NB_OK) {
        s = isfinite(norm) ? nb_step(r->opt) : nb_zero_grad(r->opt);
    }
    double lv = s == NB_OK ? nb_item_f64(l) : NAN;
    nb_scope_end();
    if (s != NB_OK) return fail(r, "step %lld: %s", (long long)r->step + 1, nb_last_error());
    /* A NaN or infinite loss or gradient norm: stop, naming the step, or skip the step
     * (--on-nonfinite). With several ranks the check is on the mean loss and the common
     * norm, so every rank decides the same at the same step. */
    nb_clear_error();
    double lv_all = nbm_step_sync(r->world, lv, &r->stop); /* + the agreed stop flag */
    if (!isfinite(lv_all) && nb_last_status() != NB_OK)
        return fail(r, "step %lld: %s", (long long)r->step + 1, nb_last_error());
    char why[256];
    int g = nbm_guard_step(&guard, r->step + 1, lv_all, norm, why, sizeof why);
    if (g < 0) return fail(r, "%s", why);
    if (g > 0 && r->main_rank) {
        nb_progress_break(r->bar);
        fprintf(stderr, "%s: %s\n", r->a->prog, why);
    }
    *loss = g > 0 ? NAN : lv; /* this rank's loss: the logs show rank 0's, as before */
    return true;
}

/* After a step: the JSON line (every 10 steps), TensorBoard scalars and the progress line.
 * comm: the part of the step spent waiting for gradients that the backward did not hide. */
static void log_step(run *r, const nb_batch *b, int64_t epoch, double loss, double comm) {
    const nbm_args *a = r->a;
    double sps = (double)r->samples / r->train_time;
    if (r->step % 10 == 0 || r->step == r->total_steps) {
        nb_jsonl_begin(r->log);
        nb_jsonl_str(r->log, "type", "step");
        nb_jsonl_int(r->log, "step", r->step);
        nb_jsonl_int(r->log, "epoch", epoch + 1); /* from 1, as the epoch lines */
        nb_jsonl_num(r->log, "loss", loss, 6);
        nb_jsonl_num_g(r->log, "lr", nb_optim_get_lr(r->opt, 0), 6);
        nb_jsonl_num(r->log, "samples_per_s", sps, 1);
        if (r->ddp || r->zero) nb_jsonl_num(r->log, "exposed_comm_ms", 1e3 * comm, 3);
        if (guard.skip) nb_jsonl_int(r->log, "skipped_steps", guard.skipped); /* so far */
        nb_jsonl_end(r->log);
    }
    tb_scalar(r, "train/loss", loss);
    tb_scalar(r, "train/lr", nb_optim_get_lr(r->opt, 0));
    tb_scalar(r, "train/samples_per_s", nb_progress_recent_rate(r->bar));
    if (r->ddp || r->zero) tb_scalar(r, "train/exposed_comm_ms", 1e3 * comm);
    char cm[80] = "";
    if (r->ddp || r->zero) snprintf(cm, sizeof cm, "  comm %.1f ms/step", 1e3 * r->comm_sum / r->n_loss);
    if (guard.skipped)
        snprintf(cm + strlen(cm), sizeof cm - strlen(cm), "  skipped %lld", (long long)guard.skipped);
    int64_t quarter = r->per_epoch / 4 > 0 ? r->per_epoch / 4 : 1;
    nb_progress_show(r->bar, (b->index + 1) % quarter == 0,
                     "epoch %lld/%d  step %lld/%lld  loss %.4f%s", (long long)epoch + 1, a->epochs,
                     (long long)(b->index + 1), (long long)r->per_epoch, r->loss_sum / r->n_loss,
                     cm);
}

/* Train until the end of the loader's epoch (or the last step); checkpoints with
 * --save-every. */
static bool train_epoch(run *r, int64_t epoch) {
    const nbm_args *a = r->a;
    r->loss_sum = r->comm_sum = 0;
    r->n_loss = 0;
    for (nb_batch b; r->step < r->total_steps && nb_loader_next(r->train_l, &b);) {
        double t0 = nb_time_s(), loss = NAN;
        if (!train_step(r, &b, &loss)) return false;
        double dt = nb_time_s() - t0;
        r->step++;
        if (r->step == 10) nb_alloc_get_stats(&r->st0); /* steady state from here */
        if (a->save_every &&
            (r->step % a->save_every == 0 || r->step == r->total_steps)) {
            r->ck.step = r->step; /* the loader resumes at the batch after b */
            if (save_checkpoint(r) != NB_OK) return fail(r, "%s", nb_last_error());
            r->saved_step = r->step;
        }
        /* samples: the global batch (every rank's shard) */
        double comm = r->zero  ? nb_zero_exposed_comm_s(r->zero)
                      : r->ddp ? nb_ddp_exposed_comm_s(r->ddp)
                               : 0;
        r->train_time += dt, r->samples += b.n * r->size;
        if (!isnan(loss)) r->loss_sum += loss, r->n_loss++; /* NAN: a skipped step */
        if (r->step > 10 && r->n_times < r->max_times)
            r->step_times[r->n_times++] = dt; /* after warm-up */
        r->comm_sum += comm;
        nb_progress_step(r->bar, dt, (double)(b.n * r->size));
        log_step(r, &b, epoch, loss, comm);
        if (r->stop) { /* a signal: save this step (unless just done) and end the run */
            r->ck.step = r->step;
            if (a->save && r->saved_step != r->step && save_checkpoint(r) != NB_OK)
                return fail(r, "%s", nb_last_error());
            /* also the barrier that keeps the others alive until the file is there */
            r->train_loss = nb_mean_over_ranks(r->world, r->loss_sum / (double)r->n_loss);
            r->acc = r->test_loss = NAN; /* not evaluated at this step */
            return true;
        }
    }
    if (nb_loader_error(r->train_l) != NB_OK) return fail(r, "%s", nb_last_error());
    return true;
}

/* After an epoch's evaluation: the summary line, its JSON line and TensorBoard scalars. */
static void log_epoch(run *r, int64_t epoch, double seconds, const nb_alloc_stats *st) {
    if (r->main_rank) {
        nb_progress_break(r->bar);
        printf("epoch %lld: train loss %.4f  test loss %.4f  test accuracy %.4f  (%.1f s)\n",
               (long long)epoch + 1, r->train_loss, r->test_loss, r->acc, seconds);
    }
    nb_jsonl_begin(r->log);
    nb_jsonl_str(r->log, "type", "epoch");
    nb_jsonl_int(r->log, "epoch", epoch + 1);
    nb_jsonl_int(r->log, "step", r->step);
    nb_jsonl_num(r->log, "train_loss", r->train_loss, 6);
    nb_jsonl_num(r->log, "test_loss", r->test_loss, 6);
    nb_jsonl_num(r->log, "test_accuracy", r->acc, 6);
    nb_jsonl_num(r->log, "samples_per_s", (double)r->samples / r->train_time, 1);
    nb_jsonl_int(r->log, "system_allocs", st->system_allocs);
    nb_jsonl_int(r->log, "steady_system_allocs", r->steady_allocs);
    nb_jsonl_int(r->log, "bytes_peak", st->bytes_peak);
    double comm_ms = r->n_loss ? 1e3 * r->comm_sum / (double)r->n_loss : 0.0;
    if (r->ddp || r->zero) {
        nb_jsonl_int(r->log, "ranks", r->size);
        nb_jsonl_num(r->log, "exposed_comm_ms_per_step", comm_ms, 3);
    }
    nb_jsonl_end(r->log);
    nb_jsonl_flush(r->log);
    tb_scalar(r, "epoch/train_loss", r->train_loss);
    tb_scalar(r, "test/loss", r->test_loss);
    tb_scalar(r, "test/accuracy", r->acc);
    tb_scalar(r, "memory/bytes_peak", (double)st->bytes_peak);
    if (r->ddp || r->zero) tb_scalar(r, "epoch/exposed_comm_ms_per_step", comm_ms);
    if (r->tb) nb_summary_flush(r->tb); /* a failure shows at the next write or the close */
}

static void print_header(const run *r) {
    if (!r->main_rank) return;
    const char *gemm = nb_gemm_provider_name(nb_gemm_provider_current());
    if (r->size > 1)
        printf("%s: %lld parameters, %lld steps per epoch, batch %lld (%lld per rank), "
               "%d ranks x %d threads, %d gradient buckets, gemm %s\n",
               r->spec->name, (long long)nb_num_parameters(r->model), (long long)r->per_epoch,
               (long long)r->a->batch, (long long)(r->a->batch / r->size), r->size,
               nb_get_num_threads(),
               r->zero ? nb_zero_num_buckets(r->zero) : nb_ddp_num_buckets(r->ddp), gemm);
    else
        printf("%s: %lld parameters, %lld steps per epoch, batch %lld, %d threads, gemm %s\n",
               r->spec->name, (long long)nb_num_parameters(r->model), (long long)r->per_epoch,
               (long long)r->a->batch, nb_get_num_threads(), gemm);
    if (r->a->precision != NB_F32) printf("%s: precision %s\n", r->spec->name,
                                          nbm_precision_name(r->a->precision));
    nbm_precision_note(r->a->prog, r->a->precision, stdout);
    if (r->a->precision == NB_BF16 && r->spec->convolutional)
        printf("%s: --precision bf16: convolutions run as %s%s\n", r->a->prog,
               nb_conv_bf16_path(),
               nb_conv_bf16_native() ? " (small ones, like a first layer on one channel, "
                                       "widened to f32)"
                                     : ", so they gain no speed");
}

/* The training loop: epochs of steps, each followed by an evaluation and a checkpoint. */
static bool train(run *r) {
    const nbm_args *a = r->a;
    print_header(r);
    while (r->step < r->total_steps) {
        nb_loader_state pos;
        nb_loader_get_state(r->train_l, &pos);
        double t_epoch = nb_time_s();
        if (!train_epoch(r, pos.epoch)) return false;
        if (r->stop) break;
        /* Steady state = training steps only (the first evaluation allocates its own batch
         * buffers once). */
        nb_alloc_stats st;
        nb_alloc_get_stats(&st);
        if (r->step >= 10) r->steady_allocs = st.system_allocs - r->st0.system_allocs;
        /* the train loss over the global batches (the mean of the ranks' means) */
        r->train_loss = nb_mean_over_ranks(r->world, r->n_loss ? r->loss_sum / r->n_loss : NAN);
        if (evaluate(r->model, r->test_l, r->world, &r->acc, &r->test_loss, r->a->precision) != NB_OK)
            return fail(r, "evaluation: %s",
                        *nb_last_error() ? nb_last_error() : "failed on another rank");
        log_epoch(r, pos.epoch, nb_time_s() - t_epoch, &st);
        if (a->save && !a->save_every) { /* every rank: a collective */
            r->ck.step = r->step;
            if (save_checkpoint(r) != NB_OK) return fail(r, "%s", nb_last_error());
        }
    }
    if (r->stop && r->main_rank) {
        nb_progress_break(r->bar);
        printf("stopped by %s after step %lld%s%s\n", nb_stop_signal_name(r->stop),
               (long long)r->step, a->save ? "; checkpoint " : "", a->save ? a->save : "");
    }
    return true;
}

/* The last line: one JSON object. JSON has no NaN or infinity: an undefined figure (the
 * median of fewer than 11 steps, the train loss of --eval-only, a NaN test loss) is null. */
static void print_result(const run *r, double wall_s) {
    if (!r->main_rank) return;
    nb_jsonl *out = nb_jsonl_stream(r->a->prog, stdout, "standard output");
    nb_jsonl_begin(out);
    nb_jsonl_str(out, "model", r->spec->name);
    nb_jsonl_num(out, "test_accuracy", r->acc, 4);
    nb_jsonl_num(out, "test_loss", r->test_loss, 4);
    nb_jsonl_num(out, "train_loss", r->train_loss, 4);
    nb_jsonl_num(out, "samples_per_s", r->train_time > 0 ? (double)r->samples / r->train_time : 0.0, 1);
    nb_jsonl_int(out, "steps", r->step);
    nb_jsonl_num(out, "wall_s", wall_s, 2);
    nb_jsonl_num(out, "median_step_ms", 1e3 * nb_median(r->step_times, r->n_times), 3);
    nb_jsonl_int(out, "threads", nb_get_num_threads());
    nb_jsonl_str(out, "device", nbm_device_name(&device));
    nb_jsonl_int(out, "ranks", r->size);
    nb_jsonl_int(out, "steady_system_allocs", r->steady_allocs);
    nb_jsonl_int(out, "zero", r->a->zero);
    struct rusage ru; /* peak resident memory, as the gpt program reports it */
    getrusage(RUSAGE_SELF, &ru);
    nb_jsonl_num(out, "peak_rss_mib", (double)ru.ru_maxrss / 1024.0, 0);
    nb_jsonl_str(out, "precision", nbm_precision_name(r->a->precision));
    nb_jsonl_str(out, "precision_path", nbm_precision_path(r->a->precision));
    if (r->a->precision == NB_BF16) nb_jsonl_str(out, "precision_conv_path", nb_conv_bf16_path());
    nb_jsonl_str(out, "reduce_dtype", nbm_precision_name(r->a->reduce_dtype));
    /* gradient bytes this rank sent in the last step (nb_ddp_comm_bytes / nb_zero_...) */
    nb_jsonl_int(out, "grad_comm_bytes", r->zero ? nb_zero_comm_bytes(r->zero)
                                                 : nb_ddp_comm_bytes(r->ddp));
    double state_mib[4];
    nbm_model_state_mib(r->zero, r->opt, r->model, state_mib);
    nb_jsonl_num(out, "model_state_mib", state_mib[0], 2);
    if (guard.skip) nb_jsonl_int(out, "skipped_steps", guard.skipped);
    nbm_save_fields(out);
    nbm_stop_fields(out, r->stop);
    nb_jsonl_end(out);
    nb_jsonl_close(out); /* a failed write shows in nb_stdout_ok */
}

/* Close the logs: false when one of them lost lines (after saying so). */
static bool close_logs(run *r) {
    bool ok = true;
    if (nb_jsonl_close(r->log) != NB_OK) {
        nb_report(r->a->prog, r->rank, r->size, "the run finished, but --log %s is incomplete "
                  "(see the warning above): exit status 1", r->a->log);
        ok = false;
    }
    r->log = NULL;
    if (nb_summary_close(r->tb) != NB_OK) {
        nb_report(r->a->prog, r->rank, r->size, "the run finished, but --tensorboard %s is "
                  "incomplete (%s): exit status 1", r->a->tensorboard, nb_last_error());
        ok = false;
    }
    r->tb = NULL;
    return ok;
}

static void teardown(run *r) {
    nbm_save_finish(r->a->prog, false); /* after a failure: the write in flight ends first */
    free(r->step_times);
    nb_progress_free(r->bar);
    nb_jsonl_close(r->log); /* after an error: the warning, if any, is all */
    nb_summary_close(r->tb);
    nb_ddp_free(r->ddp);
    nb_zero_free(r->zero); /* before the optimizer and the model */
    nb_grad_scaler_free(r->scaler);
    nb_optim_free(r->opt);
    nb_module_free(r->model);
    nb_loader_free(r->train_l);
    nb_loader_free(r->test_l);
    nb_dataset_free(r->train_ds);
    nb_dataset_free(r->test_ds);
    nb_comm_free(r->world);
    nb_generator_free(r->init);
}

int nbm_run_classifier(const nbm_model *spec, const nbm_args *a) {
    double t_start = nb_time_s();
    /* First, before MPI, the loader and the thread pools start threads: the stop signals are
     * then blocked in all of them and taken by nabla's signal thread (nabla/stop.h). A stop
     * acts at step boundaries. */
    if (!a->eval_only) nbm_stop_begin(a->prog);
    run r = {.spec = spec, .a = a, .size = 1, .acc = NAN, .test_loss = NAN, .train_loss = NAN,
             .steady_allocs = -1, .saved_step = -1, .init = nb_generator_new(a->seed)};
    nbm_save_async(a->async_save != 0);
    bool ok = setup(&r) && (a->eval_only || (train(&r) && nbm_save_finish(a->prog, true)));
    if (ok && isnan(r.acc) && !r.stop && evaluate(r.model, r.test_l, r.world, &r.acc, &r.test_loss, r.a->precision) != NB_OK)
        ok = fail(&r, "evaluation: %s",
                  *nb_last_error() ? nb_last_error() : "failed on another rank");
    int rc = 1;
    if (ok) {
        print_result(&r, nb_time_s() - t_start);
        /* The run itself succeeded; a lost log or final line still makes the exit non-zero,
         * so that a script never takes an incomplete record for a complete one. */
        rc = close_logs(&r) ? nbm_stop_status(r.stop) : 1;
        if (r.main_rank && !nb_stdout_ok(a->prog)) rc = 1;
    }
    teardown(&r);
    return rc;
}
