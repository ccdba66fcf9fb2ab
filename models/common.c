/* common.c - the training driver shared by the bundled Fashion-MNIST classifiers: flags,
 * data loading, the training loop (live progress on a terminal, periodic lines otherwise,
 * JSON lines with --log), evaluation, checkpoints (--save / --resume) and the final JSON
 * line. Uses the public API only.
 *
 * Data parallel: started under mpirun (`mpirun -np 2 build/models/mlp`), the same program
 * trains with nb_ddp over all ranks. --batch stays the global batch: each rank takes
 * batch / world samples of it (the loader's shard of each global batch), gradients are
 * averaged, so the run follows the 1-process one. Evaluation is split over the ranks by
 * batch and the counts summed; only rank 0 prints, logs and writes checkpoints. */
#include "common.h"
#include "prog.h"

#include <nabla/parallel.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(const nbm_args *a, FILE *out) {
    fprintf(out,
            "usage: %s [flags]\n"
            "  --epochs N       training epochs (default %d)\n"
            "  --batch N        global batch size (default %lld)\n"
            "  --lr X           learning rate (default %g)\n"
            "  --seed N         seed of initialization, shuffling, dropout (default %llu)\n"
            "  --threads N      CPU threads (default: all cores)\n"
            "  --data DIR       Fashion-MNIST directory (default %s)\n"
            "  --save FILE      write a checkpoint after every epoch\n"
            "  --save-every N   write it every N steps instead (and at the end)\n"
            "  --resume FILE    continue from a checkpoint written with the same settings\n"
            "  --override LIST  settings (lr, batch, limit; comma-separated) that may\n"
            "                   differ from the --resume checkpoint's, e.g. --override lr\n"
            "  --log FILE       JSON lines: one per logged step and per epoch\n"
            "  --eval-only      evaluate (the --resume checkpoint, or the initial model)\n"
            "  --max-steps N    stop after N training steps in total\n"
            "  --limit N        train on the first N samples only\n"
            "  --zero S         ZeRO stage 0-2 (1: optimizer state sharded over the ranks, 2:\n"
            "                   gradients too; default 0: nb_ddp); --save then writes a\n"
            "                   sharded checkpoint (a directory) that --resume reshards\n",
            a->prog, a->epochs, (long long)a->batch, a->lr, (unsigned long long)a->seed,
            NB_FASHION_MNIST_DIR);
}

/* The flags that take a value, and whether each still has an effect with --eval-only. */
static const struct {
    const char *name;
    bool eval_only_too;
} value_flags[] = {{"--epochs", false}, {"--batch", true},     {"--lr", false},
                   {"--seed", true},    {"--threads", true},   {"--data", true},
                   {"--save", false},   {"--resume", true},    {"--log", false},
                   {"--max-steps", false}, {"--limit", false}, {"--save-every", false},
                   {"--override", false}, {"--zero", false}};
enum { N_VALUE_FLAGS = sizeof value_flags / sizeof value_flags[0] };

/* Model state resident on this rank in MiB: parameters, gradients and optimizer state
 * (nb_zero_memory under ZeRO; otherwise every rank holds them whole). */
static double model_state_mib(const nb_zero *zero, nb_optim *opt, nb_module *model) {
    nb_zero_memory_info mi = {0};
    if (zero && nb_zero_memory(zero, &mi) == NB_OK)
        return (double)(mi.params + mi.grads + mi.optim_state) / 1048576.0;
    double bytes = 8.0 * (double)nb_num_parameters(model); /* parameters and gradients */
    const nb_params *st = nb_optim_state(opt);
    for (int i = 0; st && i < st->count; i++)
        if (nb_ndim(st->tensors[i]) > 0) bytes += (double)nb_numel(st->tensors[i]) *
                     (double)nb_dtype_size(nb_tensor_dtype(st->tensors[i]));
    nb_optim_state_release(opt);
    return bytes / 1048576.0;
}

int nbm_parse_args(int argc, char **argv, nbm_args *a) {
    bool given[N_VALUE_FLAGS] = {0};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t n;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            usage(a, stdout);
            return 0;
        } else if (!strcmp(f, "--eval-only")) {
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
        given[k] = true;
        i++; /* every other flag takes a value */
        if (!v) {
            fprintf(stderr, "%s: %s needs a value (see --help)\n", a->prog, f);
            return 2;
        }
        bool ok = true;
        if (!strcmp(f, "--epochs")) {
            if ((ok = nbm_parse_int(a->prog, f, v, 0, 1000000, &n))) a->epochs = (int)n;
        } else if (!strcmp(f, "--batch")) {
            ok = nbm_parse_int(a->prog, f, v, 1, NBM_MAX_BATCH, &a->batch);
        } else if (!strcmp(f, "--lr")) {
            ok = nbm_parse_num(a->prog, f, v, 0, true, NBM_MAX_LR, false, &a->lr);
        } else if (!strcmp(f, "--seed")) {
            if ((ok = nbm_parse_int(a->prog, f, v, 0, INT64_MAX, &n))) a->seed = (uint64_t)n;
        } else if (!strcmp(f, "--threads")) {
            if ((ok = nbm_parse_int(a->prog, f, v, 0, NBM_MAX_THREADS, &n))) a->threads = (int)n;
        } else if (!strcmp(f, "--data")) {
            a->data = v;
        } else if (!strcmp(f, "--save")) {
            a->save = v;
        } else if (!strcmp(f, "--resume")) {
            a->resume = v;
        } else if (!strcmp(f, "--log")) {
            a->log = v;
        } else if (!strcmp(f, "--max-steps")) {
            ok = nbm_parse_int(a->prog, f, v, 0, INT64_MAX, &a->max_steps);
        } else if (!strcmp(f, "--limit")) {
            ok = nbm_parse_int(a->prog, f, v, 0, INT64_MAX, &a->limit);
        } else if (!strcmp(f, "--save-every")) {
            ok = nbm_parse_int(a->prog, f, v, 1, INT64_MAX, &a->save_every);
        } else if (!strcmp(f, "--override")) {
            a->override = v;
        } else if (!strcmp(f, "--zero")) {
            ok = nbm_parse_int(a->prog, f, v, 0, 3, &a->zero);
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
    if (a->save_every && !a->save) {
        fprintf(stderr, "%s: --save-every has no effect without --save\n", a->prog);
        return 2;
    }
    if (a->override && !a->resume) {
        fprintf(stderr, "%s: --override has no effect without --resume\n", a->prog);
        return 2;
    }
    return NBM_RUN;
}

/* Rank 0 writes a plain checkpoint; under ZeRO every rank writes its shard (collective). */
static nb_status save_checkpoint(nb_zero *zero, const char *path, const nb_checkpoint *ck) {
    return zero ? nb_zero_checkpoint_save(zero, path, ck) : nb_checkpoint_save(path, ck);
}

/* Accuracy and mean loss over a loader's epoch, in eval mode with grad mode off. With
 * several ranks, rank r evaluates the batches b with b % world == r and the sums are
 * reduced, so every rank gets the result over the whole set (exactly: no padding). */
static nb_status evaluate(nb_module *m, nb_loader *l, nb_comm *world, double *acc,
                          double *loss) {
    int64_t correct = 0, total = 0;
    double loss_sum = 0;
    int rank = nb_comm_rank(world), size = nb_comm_size(world);
    bool bad = false;
    nb_module_train(m, false);
    bool prev = nb_set_grad_enabled(false);
    for (nb_batch b; nb_loader_next(l, &b);) {
        if (b.index % size != rank) continue;
        nb_scope_begin();
        nb_tensor *logits = nb_forward(m, b.x);
        nb_tensor *ok = nb_sum(nb_eq(nb_argmax(logits, 1, false), b.y), NULL, 0, false);
        nb_tensor *ls = nb_cross_entropy(logits, b.y,
                                         &(nb_cross_entropy_opts){.reduction = NB_REDUCTION_SUM});
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

#define FAIL(...)                                                                    \
    do {                                                                             \
        nbm_report(a->prog, rank, size, __VA_ARGS__);                                \
        goto done;                                                                   \
    } while (0)

int nbm_run_classifier(const nbm_model *spec, const nbm_args *a) {
    int rc = 1;
    double t_start = nbm_now_s();
    nb_comm *world = nb_comm_world(); /* size 1 without a launcher */
    int rank = world ? nb_comm_rank(world) : 0, size = world ? nb_comm_size(world) : 1;
    const bool main_rank = rank == 0; /* prints, logs and saves */
    nb_generator *init = nb_generator_new(a->seed);
    nb_dataset *train_ds = NULL, *test_ds = NULL;
    nb_loader *train_l = NULL, *test_l = NULL;
    nb_module *model = NULL;
    double *step_times = NULL; /* per-step seconds after 10 warm-up steps, for the median */
    nb_optim *opt = NULL;
    nb_ddp *ddp = NULL;
    nb_zero *zero = NULL;
    nbm_log log = {0}; /* --log: reports its own write errors */

    if (!world) FAIL("%s", nb_last_error());
    nbm_set_threads(world, a->threads);
    if (a->batch % size != 0)
        FAIL("--batch %lld is the global batch and must divide by the %d ranks",
             (long long)a->batch, size);

    nb_mnist_opts mo = nb_mnist_defaults();
    if (a->limit > 0) mo.limit = a->limit;
    train_ds = nb_fashion_mnist_new(a->data, true, &mo);
    test_ds = train_ds ? nb_fashion_mnist_new(a->data, false, NULL) : NULL;
    if (!test_ds) FAIL("%s (install the Debian package dataset-fashion-mnist, or pass --data DIR)",
                       nb_last_error());
    /* Rank r's batch i is its shard (samples r, r + world, ...) of global batch i. */
    nb_loader_opts lo = nb_loader_defaults();
    lo.batch_size = a->batch / size;
    lo.shuffle = true;
    lo.seed = a->seed;
    lo.drop_last = true;
    lo.prefetch = 2;
    lo.rank = rank;
    lo.world_size = size;
    train_l = nb_loader_new(train_ds, &lo);
    lo = nb_loader_defaults();
    lo.batch_size = 1000;
    test_l = nb_loader_new(test_ds, &lo);
    if (!train_l || !test_l) FAIL("%s", nb_last_error());
    model = spec->build(a, init);
    opt = model ? spec->optimizer(model, a) : NULL;
    if (!opt) FAIL("%s", nb_last_error());
    if (main_rank && a->log && !nbm_log_open(&log, a->prog, a->log, "w"))
        FAIL("cannot open --log %s: %s", a->log, strerror(errno));

    nb_checkpoint ck = {.model = model, .optim = opt, .loader = train_l};
    /* The settings that change the results travel with the checkpoint (prog.h). */
    nbm_config cfg = {0};
    nbm_config_num(&cfg, "lr", a->lr);
    nbm_config_int(&cfg, "batch", a->batch);
    nbm_config_int(&cfg, "seed", (int64_t)a->seed);
    nbm_config_fixed(&cfg, "the checkpoint's loader continues its shuffled epoch from it");
    nbm_config_int(&cfg, "limit", a->limit);
    if (!nbm_config_apply(&cfg, &ck, a->prog, a->override)) goto done;
    int64_t step = 0;
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = (int)a->zero;
    if (a->zero > 0 && !(zero = nb_zero_new(model, opt, world, &zo))) FAIL("%s", nb_last_error());
    if (!zero && size > 1 && !(ddp = nb_ddp_new(model, world, NULL))) FAIL("%s", nb_last_error());
    if (a->resume) { /* every rank loads it (optimizer state and loader position too); a
                      * sharded checkpoint (a directory) reshards to this run's ranks */
        if (nb_zero_checkpoint_load(zero, a->resume, &ck) != NB_OK)
            FAIL("%s%s", nb_last_error(), nbm_config_hint(nb_last_error()));
        step = ck.step;
        if (main_rank) printf("resumed from %s at step %lld\n", a->resume, (long long)step);
    }
    const int64_t per_epoch = nb_loader_num_batches(train_l);
    const bool tty = isatty(STDOUT_FILENO);
    double acc = NAN, test_loss = NAN, train_loss = NAN, train_time = 0;
    int64_t samples = 0, steady_allocs = -1, n_times = 0, max_times = 0;
    nb_alloc_stats st0 = {0};

    if (!a->eval_only) {
        if (main_rank && size > 1)
            printf("%s: %lld parameters, %lld steps per epoch, batch %lld (%lld per rank), "
                   "%d ranks x %d threads, %d gradient buckets, gemm %s\n",
                   spec->name, (long long)nb_num_parameters(model), (long long)per_epoch,
                   (long long)a->batch, (long long)(a->batch / size), size,
                   nb_get_num_threads(), zero ? nb_zero_num_buckets(zero) : nb_ddp_num_buckets(ddp),
                   nb_gemm_provider_name(nb_gemm_provider_current()));
        else if (main_rank)
            printf("%s: %lld parameters, %lld steps per epoch, batch %lld, %d threads, gemm %s\n",
                   spec->name, (long long)nb_num_parameters(model), (long long)per_epoch,
                   (long long)a->batch, nb_get_num_threads(),
                   nb_gemm_provider_name(nb_gemm_provider_current()));
        int64_t total_steps = per_epoch * a->epochs;
        if (a->max_steps && a->max_steps < total_steps) total_steps = a->max_steps;
        double last_print = 0;
        max_times = total_steps > 0 ? total_steps : 1;
        step_times = malloc(sizeof(double) * (size_t)max_times);
        if (!step_times) FAIL("out of memory");
        while (step < total_steps) {
            nb_loader_state pos;
            nb_loader_get_state(train_l, &pos);
            int64_t epoch = pos.epoch;
            double loss_sum = 0, t_epoch = nbm_now_s(), comm_sum = 0;
            int64_t n_loss = 0;
            for (nb_batch b; step < total_steps && nb_loader_next(train_l, &b);) {
                double t0 = nbm_now_s();
                nb_scope_begin();
                nb_tensor *loss = nb_cross_entropy(nb_forward(model, b.x), b.y, NULL);
                nb_status s = loss ? nb_zero_grad(opt) : nb_last_status();
                if (s == NB_OK) s = nb_backward(loss); /* DDP: buckets start in here */
                if (s == NB_OK && ddp) s = nb_ddp_sync(ddp);
                if (s == NB_OK && zero) s = nb_zero_sync(zero);
                if (s == NB_OK) s = nb_step(opt);
                double lv = s == NB_OK ? nb_item_f64(loss) : NAN;
                nb_scope_end();
                if (s != NB_OK) FAIL("step %lld: %s", (long long)step + 1, nb_last_error());
                /* A NaN or infinite loss never recovers (the weights are NaN from here):
                 * stop, naming the step. With several ranks the check is on the mean, so
                 * every rank stops at the same step instead of waiting for the others. */
                nb_clear_error();
                double lv_all = size > 1 ? nbm_mean_over_ranks(world, lv) : lv;
                if (!isfinite(lv_all) && nb_last_status() != NB_OK)
                    FAIL("step %lld: %s", (long long)step + 1, nb_last_error());
                if (!isfinite(lv_all))
                    FAIL("step %lld: the loss is %s: training diverged (a smaller --lr?)",
                         (long long)step + 1, isnan(lv_all) ? "NaN" : "infinite");
                double dt = nbm_now_s() - t0;
                step++;
                if (step == 10) nb_alloc_get_stats(&st0); /* steady state from here */
                if ((main_rank || zero) && a->save_every &&
                    (step % a->save_every == 0 || step == total_steps)) {
                    ck.step = step; /* the loader resumes at the batch after b */
                    if (save_checkpoint(zero, a->save, &ck) != NB_OK) FAIL("%s", nb_last_error());
                }
                /* samples: the global batch (every rank's shard); comm: the part of the
                 * step spent waiting for gradients that backward did not hide. */
                double comm = zero ? nb_zero_exposed_comm_s(zero) : ddp ? nb_ddp_exposed_comm_s(ddp) : 0;
                train_time += dt, samples += b.n * size, loss_sum += lv, n_loss++;
                if (step > 10 && n_times < max_times) step_times[n_times++] = dt; /* after warm-up */
                comm_sum += comm;
                double sps = samples / train_time;
                double eta = (double)(total_steps - step) * b.n * size / sps;
                char cm[48] = "";
                if (ddp || zero) snprintf(cm, sizeof cm, "  comm %.1f ms/step", 1e3 * comm_sum / n_loss);
                if (log.f && (step % 10 == 0 || step == total_steps)) {
                    char j[3][32]; /* JSON has no NaN or infinity: those become null */
                    nbm_log_printf(&log, "{\"type\": \"step\", \"step\": %lld, \"epoch\": %lld, "
                            "\"loss\": %s, \"lr\": %g, \"samples_per_s\": %s",
                            (long long)step, (long long)epoch, nbm_jnum(lv, 6, j[0], 32),
                            nb_optim_get_lr(opt, 0), nbm_jnum(sps, 1, j[1], 32));
                    if (ddp)
                        nbm_log_printf(&log, ", \"exposed_comm_ms\": %s",
                                       nbm_jnum(1e3 * comm, 3, j[2], 32));
                    nbm_log_printf(&log, "}\n");
                }
                double t = nbm_now_s();
                if (main_rank && tty && (t - last_print > 0.2 || step == total_steps)) {
                    char e[32];
                    nbm_fmt_eta(eta, e, sizeof e);
                    printf("\repoch %lld/%d  step %lld/%lld  loss %.4f  %.0f samples/s%s  ETA %s   ",
                           (long long)epoch + 1, a->epochs, (long long)(b.index + 1),
                           (long long)per_epoch, loss_sum / n_loss, sps, cm, e);
                    fflush(stdout);
                    last_print = t;
                } else if (main_rank && !tty && (b.index + 1) % (per_epoch / 4 > 0 ? per_epoch / 4 : 1) == 0) {
                    char e[32];
                    nbm_fmt_eta(eta, e, sizeof e);
                    printf("epoch %lld/%d step %lld/%lld loss %.4f samples/s %.0f%s ETA %s\n",
                           (long long)epoch + 1, a->epochs, (long long)(b.index + 1),
                           (long long)per_epoch, loss_sum / n_loss, sps, cm, e);
                }
            }
            if (nb_loader_error(train_l) != NB_OK) FAIL("%s", nb_last_error());
            /* Steady state = training steps only (the first evaluation allocates its own
             * batch buffers once). */
            nb_alloc_stats st;
            nb_alloc_get_stats(&st);
            if (step >= 10) steady_allocs = st.system_allocs - st0.system_allocs;
            /* the train loss over the global batches (the mean of the ranks' means) */
            train_loss = nbm_mean_over_ranks(world, n_loss ? loss_sum / n_loss : NAN);
            if (evaluate(model, test_l, world, &acc, &test_loss) != NB_OK)
                FAIL("evaluation: %s",
                     *nb_last_error() ? nb_last_error() : "failed on another rank");
            if (main_rank) {
                if (tty) printf("\n");
                printf("epoch %lld: train loss %.4f  test loss %.4f  test accuracy %.4f  (%.1f s)\n",
                       (long long)epoch + 1, train_loss, test_loss, acc, nbm_now_s() - t_epoch);
            }
            if (log.f) {
                char j[5][32];
                nbm_log_printf(&log, "{\"type\": \"epoch\", \"epoch\": %lld, \"step\": %lld, "
                        "\"train_loss\": %s, \"test_loss\": %s, \"test_accuracy\": %s, "
                        "\"samples_per_s\": %s, \"system_allocs\": %lld, "
                        "\"steady_system_allocs\": %lld, \"bytes_peak\": %lld",
                        (long long)epoch + 1, (long long)step, nbm_jnum(train_loss, 6, j[0], 32),
                        nbm_jnum(test_loss, 6, j[1], 32), nbm_jnum(acc, 6, j[2], 32),
                        nbm_jnum(samples / train_time, 1, j[3], 32), (long long)st.system_allocs,
                        (long long)steady_allocs, (long long)st.bytes_peak);
                if (ddp)
                    nbm_log_printf(&log, ", \"ranks\": %d, \"exposed_comm_ms_per_step\": %s",
                                   size,
                            nbm_jnum(n_loss ? 1e3 * comm_sum / n_loss : 0.0, 3, j[4], 32));
                nbm_log_printf(&log, "}\n");
                nbm_log_flush(&log);
            }
            if ((main_rank || zero) && a->save && !a->save_every) { /* the weights are the
                                                                      same on every rank */
                ck.step = step;
                if (save_checkpoint(zero, a->save, &ck) != NB_OK) FAIL("%s", nb_last_error());
            }
        }
    }
    if (isnan(acc) && evaluate(model, test_l, world, &acc, &test_loss) != NB_OK)
        FAIL("evaluation: %s", *nb_last_error() ? nb_last_error() : "failed on another rank");
    /* JSON has no NaN or infinity: an undefined figure (the median of fewer than 11 steps,
     * the train loss of --eval-only, a NaN test loss) is null. */
    char j[5][32];
    if (main_rank)
        printf("{\"model\": \"%s\", \"test_accuracy\": %s, \"test_loss\": %s, "
               "\"train_loss\": %s, \"samples_per_s\": %s, \"steps\": %lld, \"wall_s\": %.2f, "
               "\"median_step_ms\": %s, \"threads\": %d, \"ranks\": %d, "
               "\"steady_system_allocs\": %lld, \"zero\": %lld, \"model_state_mib\": %.2f}\n",
               spec->name, nbm_jnum(acc, 4, j[0], 32), nbm_jnum(test_loss, 4, j[1], 32),
               nbm_jnum(train_loss, 4, j[2], 32),
               nbm_jnum(train_time > 0 ? samples / train_time : 0.0, 1, j[3], 32),
               (long long)step, nbm_now_s() - t_start,
               nbm_jnum(1e3 * nbm_median(step_times, n_times), 3, j[4], 32),
               nb_get_num_threads(), size, (long long)steady_allocs, (long long)a->zero,
               model_state_mib(zero, opt, model));
    /* The run itself succeeded; a lost log or final line still makes the exit non-zero,
     * so that a script never takes an incomplete record for a complete one. */
    rc = 0;
    if (!nbm_log_close(&log)) {
        nbm_report(a->prog, rank, size, "the run finished, but --log %s is incomplete (see the "
                   "warning above): exit status 1", a->log);
        rc = 1;
    }
    if (main_rank && !nbm_stdout_ok(a->prog)) rc = 1;
done:
    free(step_times);
    nbm_log_close(&log); /* after an error: the warning, if any, is all */
    nb_ddp_free(ddp);
    nb_zero_free(zero); /* before the optimizer and the model */
    nb_optim_free(opt);
    nb_module_free(model);
    nb_loader_free(train_l);
    nb_loader_free(test_l);
    nb_dataset_free(train_ds);
    nb_dataset_free(test_ds);
    nb_comm_free(world);
    nb_generator_free(init);
    return rc;
}
