/* pipe.c - `gpt --pp M --microbatches K --pp-schedule gpipe|1f1b|interleaved
 * [--virtual-stages V] [--tp N [--sequence-parallel]]` under `mpirun -np dp*tp*pp` (pipe.h):
 * the ranks form nb_topology's groups (world = dp x pp x tp, the tp ranks adjacent): each
 * pipeline stage is tensor parallel over its tp group (3D with dp), ranks holding the same
 * slice of the same stage a data-parallel group. Every rank draws the same global batch and
 * its pipeline trains on its dp slice of rows, so any layout follows the 1-process run up to
 * float reassociation. The progress line and the last JSON line show the layout, the
 * measured and ideal bubble and the exposed communication. --save DIR writes a pipeline
 * checkpoint (any layout resumes it with --resume DIR) and DIR/model.safetensors, the plain
 * model `gpt --sample --load` reads; at the end, every --save-every steps and at a stop
 * signal (all ranks agree on the step, models/ft.h), as DIR itself or (--keep K) as the
 * series DIR/checkpoint-<step>.ckpt of the newest K, which --resume auto reads; --async-save 1
 * writes the stage files in the background (nb_gpt_pipe_save_async). As main.c's run: the
 * validation loss every --eval-every steps and at the end (nb_gpt_pipe_eval; the dp pipelines
 * share the fixed batches), --log JSON lines (each step's with the layout, the bubble and the
 * exposed communication), --tensorboard scalars, --precision bf16|fp16 (autocast around each
 * step and evaluation: every stage computes in it, the activation passed between stages is
 * f32; fp16 with a loss scaler over every rank, its scale not in the checkpoint),
 * --checkpoint-activations (the stages' blocks, cfg.recompute), --on-nonfinite/--max-skips
 * (models/guard.h; a non-finite step is not applied). Public API only. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nabla/nabla.h>
#include <nabla/run.h>
#include <nabla/summary.h>

#include "ft.h"
#include "pipe.h"
#include "precision.h"

/* One message for the user, from rank 0 (every rank reaches the same conclusion). */
#define SAY(rank, ...)                                                                           \
    do {                                                                                         \
        if ((rank) == 0) fprintf(stderr, "gpt: " __VA_ARGS__);                                   \
    } while (0)

/* A checkpoint of step: --save itself or its step's member of the series (--keep), written
 * now or (w) handed to the background writers. Collective. */
static nb_status save_at(nb_gpt_pipe *pipe, nb_optim *opt, nb_zero *z, nb_checkpoint_writer *w,
                         const gpt_pipe_args *a, int64_t step) {
    int keep = (int)a->keep;
    /* --zero: the whole optimizer state in opt for the save (the files of a run without it) */
    nb_status st = z ? nb_zero_gather_optim_state(z) : NB_OK;
    if (st == NB_OK)
        st = w ? nb_gpt_pipe_save_async(pipe, opt, w, a->save, keep, step)
             : keep > 0 ? nb_gpt_pipe_save_keep(pipe, opt, a->save, keep, step)
                        : nb_gpt_pipe_save(pipe, opt, a->save, step);
    nb_status zs = z ? nb_zero_scatter_optim_state(z) : NB_OK; /* back to the shards */
    return st != NB_OK ? st : zs;
}

/* The mean validation loss over n fixed batches of (B, T) (vgen rewound: the same batches
 * each time, main.c's): every rank draws every batch, pipeline d (of D) evaluates batches
 * d, d + D, ... through its stages (nb_gpt_pipe_eval), and the sums are averaged over dp, so
 * every rank gets the same value. A failure on any rank: NAN on every rank (the error set
 * where it happened). Collective over pp and dp. */
static double pipe_evaluate(nb_gpt_pipe *pipe, nb_tensor *val, nb_generator *vgen, int64_t n,
                            nb_tensor *x, nb_tensor *y, nb_comm *dp, nb_dtype prec) {
    const int d = nb_comm_rank(dp), D = nb_comm_size(dp);
    double sum = 0;
    nb_status st = nb_generator_set_stream(vgen, 0);
    for (int64_t i = 0; st == NB_OK && i < n; i++) {
        st = nb_text_sample(val, vgen, x, y);
        if (st != NB_OK || i % D != d) continue;
        double l = NAN;
        st = nbm_precision_begin(prec);
        if (st == NB_OK) {
            st = nb_gpt_pipe_eval(pipe, x, y, &l, NULL);
            nbm_precision_end(prec);
        }
        sum += l;
    }
    return nb_mean_over_ranks(dp, st == NB_OK ? sum : NAN) * (double)D / (double)n;
}

/* One TensorBoard scalar (rank 0); the first failed write warns, and the run's exit status
 * says the file is incomplete. */
static void tb_scalar(nb_summary *tb, bool *failed, const char *tag, int64_t step, double v) {
    if (!tb || nb_summary_scalar(tb, tag, step, v) == NB_OK || *failed) return;
    *failed = true;
    fprintf(stderr, "gpt: warning: %s; the TensorBoard file is incomplete (the run goes on, and "
            "exits with status 1)\n", nb_last_error());
}

int gpt_pipe_train(const gpt_pipe_args *a, nb_tensor *text) {
    nbm_stop_begin("gpt"); /* before MPI and the thread pools start threads */
    nb_comm *world = nb_comm_world();
    if (!world) {
        fprintf(stderr, "gpt: %s\n", nb_last_error());
        return 1;
    }
    if (a->guard) nbm_guard_comm(a->guard, world); /* a dead or hung peer: an error in time */
    const int rank = nb_comm_rank(world), size = nb_comm_size(world);
    const int P = (int)a->pp, K = (int)a->microbatches, TP = a->tp > 1 ? (int)a->tp : 1;
    int rc = 1;
    nb_topology *topo = NULL;
    nb_comm *pp = NULL, *dp = NULL; /* borrowed from topo */
    nb_gpt_pipe *pipe = NULL;
    nb_optim *opt = NULL;
    nb_zero *zero = NULL;
    nb_sched *sched = NULL;
    nb_params decay = {0}, no_decay = {0};
    nb_generator *init = NULL, *batch_gen = NULL, *drop_gen = NULL, *val_gen = NULL;
    nb_jsonl *log = NULL;
    nb_summary *tb = NULL;
    nb_grad_scaler *scaler = NULL; /* --precision fp16: dynamic loss scaling over every rank */
    bool tb_failed = false;
    nbm_guard no_guard = {.max_skips = 10};
    nbm_guard *guard = a->guard ? a->guard : &no_guard;
    nb_tensor *train = NULL, *val = NULL, *X = NULL, *Y = NULL;
    double *times = NULL;
    nb_checkpoint_writer *w = NULL;
    int stop = 0;
    nb_pipe_schedule ps;
    /* Bad layouts: the same message on every rank's exit status, before any work. */
    if (nb_pipe_schedule_parse(a->pp_schedule, &ps) != NB_OK) {
        SAY(rank, "--pp-schedule: %s\n", nb_last_error());
        goto done;
    }
    if (size % P && TP == 1) {
        SAY(rank, "the world size %d is not divisible by --pp %d (run mpirun -np dp*pp)\n", size,
            P);
        goto done;
    }
    if (size % (P * TP)) {
        SAY(rank, "the world size %d is not divisible by --tp %d x --pp %d (run mpirun -np "
            "dp*tp*pp)\n", size, TP, P);
        goto done;
    }
    if (a->sequence_parallel && a->cfg.block_size % TP) {
        SAY(rank, "--sequence-parallel splits the context (--block-size %lld) over --tp %d: it "
            "must divide\n", (long long)a->cfg.block_size, TP);
        goto done;
    }
    const int D = size / (P * TP);
    if (a->batch % ((int64_t)D * K)) {
        SAY(rank, "--batch %lld (the global batch) must divide into %d data-parallel ranks x %d "
            "micro-batches\n", (long long)a->batch, D, K);
        goto done;
    }
    if (!text) {
        SAY(rank, "could not read the training text\n");
        goto done;
    }
    nb_share_threads(world, (int)a->threads);
    nb_topology_opts to = nb_topology_defaults();
    to.pp = P;
    to.tp = TP;
    if ((topo = nb_topology_new(world, &to))) {
        pp = nb_topology_pp(topo);
        dp = nb_topology_dp(topo);
    }
    init = nb_generator_new(a->seed);
    batch_gen = nb_generator_new(a->seed + 1234);
    /* dropout: one stream (main.c's seed), positioned by the pipeline as one process's */
    drop_gen = nb_generator_new(a->seed + 4321);
    val_gen = nb_generator_new(999); /* the validation batches: main.c's */
    nb_gpt_config cfg = a->cfg;
    cfg.dropout_gen = drop_gen;
    nb_gpt_pipe_opts po = nb_gpt_pipe_defaults();
    po.schedule = ps;
    po.n_micro = K;
    po.virtual_stages = (int)a->virtual_stages;
    po.tp = topo && TP > 1 ? nb_topology_tp(topo) : NULL;
    po.sequence_parallel = a->sequence_parallel;
    if (!pp || !dp || !init || !batch_gen || !drop_gen || !val_gen ||
        !(pipe = nb_gpt_pipe_new(&cfg, init, pp, dp, &po))) {
        SAY(rank, "%s\n", nb_last_error());
        goto done;
    }
    nb_module *stage = nb_gpt_pipe_module(pipe);
    nb_adamw_opts ao = nb_adamw_defaults();
    ao.lr = a->lr;
    ao.betas[0] = a->beta1;
    ao.betas[1] = a->beta2;
    ao.weight_decay = a->weight_decay;
    nb_group_opts no_wd = nb_group_defaults();
    no_wd.weight_decay = 0;
    const bool cosine = !strcmp(a->schedule, "cosine") && a->steps > 0;
    const int64_t decay_steps = a->decay_steps > 0 ? a->decay_steps : a->steps;
    nb_sched_opts co = nb_sched_defaults(cosine ? NB_SCHED_COSINE : NB_SCHED_CONSTANT);
    if (cosine) { /* as main.c: warmup 5% of the schedule, decay to lr / 10 */
        co.warmup_steps = a->warmup >= 0 ? a->warmup : decay_steps / 20;
        co.total_steps = decay_steps;
        co.min_lr = a->min_lr >= 0 ? a->min_lr : a->lr / 10;
    }
    const int64_t T = a->cfg.block_size, B = a->batch;
    if (nb_params_split_decay(nb_parameters(stage), &decay, &no_decay) != NB_OK ||
        !(opt = nb_adamw_new(&decay, &ao)) || nb_optim_add_group(opt, &no_decay, &no_wd) < 0 ||
        !(sched = nb_sched_new(opt, &co)) || nb_text_split(text, 0.9, &train, &val) != NB_OK ||
        !(X = nb_empty((int64_t[]){B, T}, 2, NB_I64)) ||
        !(Y = nb_empty((int64_t[]){B, T}, 2, NB_I64)) ||
        !(times = calloc((size_t)a->steps + 1, sizeof *times)) ||
        (a->precision == NB_F16 &&
         (!(scaler = nb_grad_scaler_new(NULL)) ||
          (size > 1 && nb_grad_scaler_set_comm(scaler, world) != NB_OK)))) {
        fprintf(stderr, "gpt: rank %d: %s\n", rank, nb_last_error());
        goto done;
    }
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = (int)a->zero;
    if (a->zero && (!(zero = nb_zero_new(stage, opt, dp, &zo)) ||
                    nb_gpt_pipe_set_zero(pipe, zero) != NB_OK)) {
        fprintf(stderr, "gpt: rank %d: --zero: %s\n", rank, nb_last_error());
        goto done;
    }
    int64_t step = 0;
    char auto_path[4400];
    const char *resume; /* --resume auto: the newest complete checkpoint of --save, if any */
    if (!nbm_resume_path("gpt", rank == 0, a->resume, a->save, auto_path, sizeof auto_path,
                         &resume))
        goto done;
    if (resume) {
        if (nb_gpt_pipe_load(pipe, opt, resume, &step) != NB_OK ||
            (zero && nb_zero_scatter_optim_state(zero) != NB_OK)) {
            SAY(rank, "--resume %s: %s\n", resume, nb_last_error());
            goto done;
        }
        /* the batch stream continues where the saved run left it (one draw of B rows each),
         * the learning-rate schedule from the saved step (it is a function of the step) */
        for (int64_t s = 0; s < step; s++)
            if (nb_text_sample(train, batch_gen, X, Y) != NB_OK || nb_sched_step(sched) != NB_OK)
                goto done;
        if (rank == 0) printf("resumed from %s at step %lld\n", resume, (long long)step);
    }
    if (rank == 0 && a->log && !(log = nb_jsonl_open("gpt", a->log, resume ? "a" : "w")))
        fprintf(stderr, "gpt: %s\n", nb_last_error());
    else if (rank == 0 && a->tensorboard && !(tb = nb_summary_open(a->tensorboard)))
        fprintf(stderr, "gpt: --tensorboard: %s\n", nb_last_error());
    if (isnan(nb_mean_over_ranks(world, rank == 0 && ((a->log && !log) ||
                                                      (a->tensorboard && !tb)) ? NAN : 0)))
        goto done; /* every rank stops with rank 0's message */
    if (a->save && a->async_save &&
        !(w = nb_checkpoint_writer_new(NULL))) { /* one per rank: its stage file */
        fprintf(stderr, "gpt: rank %d: --async-save: %s\n", rank, nb_last_error());
        goto done;
    }
    int nst;
    const int64_t *bounds = nb_gpt_pipe_boundaries(pipe, &nst);
    if (rank == 0) {
        printf("gpt: %lld layers, width %lld, context %lld; pipeline: %d stages x %d data "
               "parallel, %s, %d micro-batches of %lld, %lld virtual stages; each stage tensor "
               "parallel over %d%s; layers per stage:",
               (long long)a->cfg.n_layer, (long long)a->cfg.n_embd, (long long)T, P, D,
               a->pp_schedule, K, (long long)(B / D / K), (long long)a->virtual_stages, TP,
               a->sequence_parallel ? " (sequence parallel)" : "");
        for (int s = 0; s < nst; s++) printf(" %lld", (long long)(bounds[s + 1] - bounds[s]));
        printf("; precision %s, checkpoint activations %s\n", nbm_precision_name(a->precision),
               a->recompute ? a->recompute : "none");
        nbm_precision_note("gpt", a->precision, stdout);
        fflush(stdout);
    }
    const int64_t rows = B / D, first = step, d = nb_comm_rank(dp);
    double bubble_sum = 0, wait_sum = 0, comm_sum = 0, tp_sum = 0, last_loss = NAN, theory = NAN;
    double val_loss = NAN;
    int64_t peak = 0, saved = -1, val_step = -1;
    for (; step < a->steps && !stop; step++) {
        double t0 = nb_time_s();
        nb_pipe_stats st;
        double norm = NAN;
        if (nb_text_sample(train, batch_gen, X, Y) != NB_OK) {
            fprintf(stderr, "gpt: %s\n", nb_last_error());
            goto done;
        }
        nb_tp_comm_stats_reset(); /* the stages' tensor-parallel collectives: blocking */
        const double lr = nb_optim_get_lr(opt, 0);
        /* --on-nonfinite's tests: this rank's first parameter NaN for the step (the step is
         * then not applied; the value comes back after it) */
        nb_tensor *p0 = nb_parameters(stage)->count ? nb_parameters(stage)->tensors[0] : NULL;
        nb_tensor *p0_saved = NULL;
        if (p0 && isnan(nbm_guard_test_factor(step + 1, rank))) {
            bool prev = nb_set_grad_enabled(false);
            p0_saved = nb_clone(p0);
            nb_fill_(p0, NAN);
            nb_set_grad_enabled(prev);
        }
        nb_clear_error(); /* a NaN below is an error only when one is set */
        nb_scope_begin();
        double loss = NAN;
        if (nbm_precision_begin(a->precision) == NB_OK) {
            loss = nb_gpt_pipe_train_step_ex(pipe, opt, nb_narrow(X, 0, d * rows, rows),
                                             nb_narrow(Y, 0, d * rows, rows),
                                             &(nb_gpt_pipe_step_opts){.grad_clip = a->grad_clip,
                                                                      .scaler = scaler},
                                             &norm, &st);
            nbm_precision_end(a->precision);
        }
        nb_scope_end();
        if (p0_saved) {
            bool prev = nb_set_grad_enabled(false);
            nb_copy_(p0, p0_saved);
            nb_set_grad_enabled(prev);
            nb_tensor_free(p0_saved);
        }
        /* fp16: an overflowed gradient is the loss scaler's to handle (step skipped, scale
         * halved), not a diverged run */
        if (scaler && !isfinite(norm) && nb_grad_scaler_skipped(scaler)) norm = 0;
        if ((isnan(loss) && nb_last_status() != NB_OK) || nb_sched_step(sched) != NB_OK) {
            fprintf(stderr, "gpt: rank %d, step %lld: %s\n", rank, (long long)step + 1,
                    nb_last_error());
            goto done;
        }
        /* A NaN or infinite loss or gradient norm (the same on every rank: the loss is the
         * mean over dp, the norm global); nb_gpt_pipe_train_step did not apply a non-finite
         * gradient: stop, naming the step, or skip it (--on-nonfinite skip). */
        char why[256];
        int g = nbm_guard_step(guard, step + 1, loss, norm, why, sizeof why);
        if (g < 0) {
            SAY(rank, "%s\n", why);
            goto done;
        }
        if (g > 0) SAY(rank, "%s\n", why);
        times[step - first] = nb_time_s() - t0;
        nb_tp_comm_stats tc;
        nb_tp_comm_stats_get(&tc);
        tp_sum += tc.seconds;
        bubble_sum += st.bubble;
        wait_sum += st.wait_s;
        comm_sum += st.comm_s;
        theory = st.bubble_theory;
        if (st.peak_live_micro > peak) peak = st.peak_live_micro;
        if (g == 0) last_loss = loss;
        /* the stop signal every rank agrees on (the loss is the same on every rank already) */
        if (isnan(nbm_step_sync(world, 0.0, &stop))) {
            fprintf(stderr, "gpt: rank %d: %s\n", rank, nb_last_error());
            goto done;
        }
        /* pipeline waits, the gradient communication after the passes, and the stages' tp
         * collectives (blocking: all exposed) */
        const double step_s = times[step - first],
                     exposed_ms = (st.wait_s + st.comm_s + tc.seconds) * 1e3;
        if (log) { /* rank 0: the step, with the layout, the bubble and the exposed comm */
            nb_jsonl_begin(log);
            nb_jsonl_str(log, "type", "step");
            nb_jsonl_int(log, "step", step + 1);
            nb_jsonl_num(log, "loss", loss, 6);
            nb_jsonl_num_g(log, "lr", lr, 6);
            nb_jsonl_num(log, "grad_norm", norm, 6);
            nb_jsonl_num(log, "step_ms", step_s * 1e3, 2);
            nb_jsonl_num(log, "tokens_per_s", (double)(B * T) / step_s, 1);
            nb_jsonl_num(log, "exposed_comm_ms", exposed_ms, 3);
            nb_jsonl_num(log, "bubble", st.bubble, 4);
            nb_jsonl_num(log, "bubble_ideal", st.bubble_theory, 4);
            nb_jsonl_num(log, "tp_comm_ms", tc.seconds * 1e3, 3);
            nb_jsonl_int(log, "pp", P);
            nb_jsonl_int(log, "tp", TP);
            nb_jsonl_int(log, "dp", D);
            nb_jsonl_str(log, "pp_schedule", a->pp_schedule);
            nb_jsonl_int(log, "microbatches", K);
            nb_jsonl_int(log, "virtual_stages", a->virtual_stages);
            if (guard->skip) nb_jsonl_int(log, "skipped_steps", guard->skipped);
            nb_jsonl_end(log);
        }
        tb_scalar(tb, &tb_failed, "train/loss", step + 1, loss);
        tb_scalar(tb, &tb_failed, "train/lr", step + 1, lr);
        tb_scalar(tb, &tb_failed, "train/grad_norm", step + 1, norm);
        tb_scalar(tb, &tb_failed, "train/tokens_per_s", step + 1, (double)(B * T) / step_s);
        tb_scalar(tb, &tb_failed, "train/step_ms", step + 1, step_s * 1e3);
        tb_scalar(tb, &tb_failed, "train/exposed_comm_ms", step + 1, exposed_ms);
        tb_scalar(tb, &tb_failed, "train/bubble", step + 1, st.bubble);
        const int64_t every = a->steps >= 20 ? a->steps / 20 : 1;
        if (rank == 0 && ((step + 1) % every == 0 || step + 1 == a->steps || stop)) {
            printf("step %lld/%lld  loss %.4f  norm %.3f  %.0f ms  bubble %.3f (ideal %.3f)  "
                   "exposed comm %.1f ms (tp %.1f ms)  [dp %d x tp %d x pp %d, %s]",
                   (long long)step + 1, (long long)a->steps, loss, norm, step_s * 1e3,
                   st.bubble, st.bubble_theory, exposed_ms, tc.seconds * 1e3, D, TP, P,
                   a->pp_schedule);
            if (guard->skipped) printf("  skipped %lld", (long long)guard->skipped);
            printf("\n");
            fflush(stdout);
        }
        if (step + 1 == a->steps || (a->eval_every > 0 && (step + 1) % a->eval_every == 0)) {
            const double te = nb_time_s();
            val_loss = pipe_evaluate(pipe, val, val_gen, a->eval_batches, X, Y, dp, a->precision);
            if (isnan(val_loss)) {
                fprintf(stderr, "gpt: rank %d: evaluation: %s\n", rank, nb_last_error());
                goto done;
            }
            val_step = step + 1;
            if (rank == 0) {
                printf("step %lld: train loss %.4f  val loss %.4f  (eval %.1f s)\n",
                       (long long)step + 1, loss, val_loss, nb_time_s() - te);
                fflush(stdout);
            }
            if (log) {
                nb_jsonl_begin(log);
                nb_jsonl_str(log, "type", "eval");
                nb_jsonl_int(log, "step", step + 1);
                nb_jsonl_num(log, "train_loss", loss, 6);
                nb_jsonl_num(log, "val_loss", val_loss, 6);
                nb_jsonl_end(log);
            }
            tb_scalar(tb, &tb_failed, "val/loss", step + 1, val_loss);
        }
        nb_jsonl_flush(log);
        if (tb) nb_summary_flush(tb); /* a failure shows at the next write or the close */
        if (a->save && (stop || (a->save_every > 0 && (step + 1) % a->save_every == 0))) {
            if (save_at(pipe, opt, zero, w, a, step + 1) != NB_OK) {
                fprintf(stderr, "gpt: rank %d: --save %s: %s\n", rank, a->save, nb_last_error());
                goto done;
            }
            saved = step + 1;
        }
    }
    if (stop && val_step != step) val_loss = NAN; /* not evaluated at the step it stopped */
    if (!stop && val_step != step) { /* nothing trained (or resumed at the end): evaluate once */
        val_loss = pipe_evaluate(pipe, val, val_gen, a->eval_batches, X, Y, dp, a->precision);
        if (isnan(val_loss)) {
            fprintf(stderr, "gpt: rank %d: evaluation: %s\n", rank, nb_last_error());
            goto done;
        }
    }
    if (a->save) { /* the last step's checkpoint, complete (the index after every file) */
        char dir[4400], model[4500];
        nb_status st = saved == step ? NB_OK : save_at(pipe, opt, zero, w, a, step);
        if (st == NB_OK && w) st = nb_gpt_pipe_save_wait(pipe, w);
        if (st == NB_OK && a->keep > 0) st = nb_checkpoint_path(a->save, step, dir, sizeof dir);
        else snprintf(dir, sizeof dir, "%s", a->save);
        snprintf(model, sizeof model, "%s/model.safetensors", dir);
        if (st == NB_OK && rank == 0) st = nb_gpt_pipe_consolidate(dir, model);
        if (st != NB_OK) {
            fprintf(stderr, "gpt: --save %s: %s\n", a->save, nb_last_error());
            goto done;
        }
        if (rank == 0) printf("saved %s (a pipeline checkpoint) and %s\n", dir, model);
    }
    if (stop && rank == 0)
        printf("stopped by %s after step %lld%s%s\n", nb_stop_signal_name(stop), (long long)step,
               a->save ? "; checkpoint " : "", a->save ? a->save : "");
    /* The stage's share: parameters on this rank, the largest over the ranks. */
    nb_scope_begin();
    nb_tensor *mx = nb_scalar((double)nb_num_parameters(stage), NB_F64);
    nb_allreduce(world, mx, NB_REDUCE_MAX);
    double stage_params = nb_item_f64(mx);
    nb_scope_end();
    double state_mib[4]; /* this rank's model state (parameters, gradients, optimizer) */
    nbm_model_state_mib(zero, opt, stage, state_mib);
    const int64_t ran = step - first;
    if (rank == 0) {
        double med = nb_median(times, ran);
        nb_jsonl *out = nb_jsonl_stream("gpt", stdout, "standard output");
        nb_jsonl_begin(out);
        nb_jsonl_str(out, "model", "gpt");
        nb_jsonl_num(out, "val_loss", val_loss, 4);
        nb_jsonl_num(out, "train_loss", last_loss, 4);
        nb_jsonl_int(out, "steps", step);
        nb_jsonl_int(out, "ranks", size);
        nb_jsonl_int(out, "pp", P);
        nb_jsonl_int(out, "dp", D);
        nb_jsonl_int(out, "tp", TP);
        nb_jsonl_int(out, "sequence_parallel", a->sequence_parallel);
        nb_jsonl_str(out, "pp_schedule", a->pp_schedule);
        nb_jsonl_int(out, "microbatches", K);
        nb_jsonl_int(out, "virtual_stages", a->virtual_stages);
        nb_jsonl_num(out, "bubble", ran ? bubble_sum / (double)ran : NAN, 4);
        nb_jsonl_num(out, "bubble_ideal", theory, 4);
        /* pipeline waits, the gradient communication after the passes, the tp collectives
         * (blocking: all exposed) */
        nb_jsonl_num(out, "exposed_comm_ms",
                     ran ? (wait_sum + comm_sum + tp_sum) / (double)ran * 1e3 : NAN, 3);
        nb_jsonl_num(out, "tp_comm_ms", ran ? tp_sum / (double)ran * 1e3 : NAN, 3);
        nb_jsonl_int(out, "peak_live_microbatches", peak);
        nb_jsonl_num(out, "stage_params_max", stage_params, 0);
        nb_jsonl_int(out, "zero", a->zero);
        nb_jsonl_num(out, "model_state_mib", state_mib[0], 2);
        nb_jsonl_num(out, "step_ms_median", ran ? med * 1e3 : 0.0, 2);
        nb_jsonl_num(out, "tokens_per_s", ran ? (double)(B * T) / med : 0.0, 1);
        nb_jsonl_str(out, "precision", nbm_precision_name(a->precision));
        nb_jsonl_str(out, "precision_path", nbm_precision_path(a->precision));
        nb_jsonl_str(out, "checkpoint_activations", a->recompute ? a->recompute : "none");
        if (guard->skip) nb_jsonl_int(out, "skipped_steps", guard->skipped);
        if (w) { /* the training time the background saves cost (snapshots, waits) */
            nb_checkpoint_writer_stats ws;
            nb_checkpoint_writer_get_stats(w, &ws);
            nb_jsonl_int(out, "checkpoint_saves", ws.saves);
            nb_jsonl_num(out, "checkpoint_stall_ms", (double)ws.stall_ns_total / 1e6, 3);
        }
        nbm_stop_fields(out, stop);
        nb_jsonl_end(out);
        nb_jsonl_close(out);
    }
    rc = nbm_stop_status(stop);
    /* a lost log line makes the exit non-zero, so no script takes an incomplete record for a
     * complete one */
    if (nb_jsonl_close(log) != NB_OK) {
        fprintf(stderr, "gpt: the run finished, but --log %s is incomplete (see the warning "
                "above): exit status 1\n", a->log);
        rc = 1;
    }
    log = NULL;
    if (nb_summary_close(tb) != NB_OK) {
        fprintf(stderr, "gpt: the run finished, but --tensorboard %s is incomplete (%s): exit "
                "status 1\n", a->tensorboard, nb_last_error());
        rc = 1;
    }
    tb = NULL;
done:
    nb_jsonl_close(log); /* after an error: the warning, if any, is all */
    nb_summary_close(tb);
    if (w && nb_checkpoint_writer_free(w) != NB_OK) { /* after a failure: the write ends first */
        fprintf(stderr, "gpt: rank %d: %s\n", rank, nb_last_error());
        rc = 1;
    }
    nb_zero_free(zero); /* before the optimizer and the pipeline */
    free(times);
    nb_tensor_free(X);
    nb_tensor_free(Y);
    nb_tensor_free(train);
    nb_tensor_free(val);
    nb_grad_scaler_free(scaler);
    nb_sched_free(sched);
    nb_optim_free(opt);
    nb_params_deinit(&decay);
    nb_params_deinit(&no_decay);
    nb_gpt_pipe_free(pipe);
    nb_generator_free(init);
    nb_generator_free(batch_gen);
    nb_generator_free(drop_gen);
    nb_generator_free(val_gen);
    nb_topology_free(topo); /* after the pipeline, which borrows its groups */
    nb_comm_free(world);
    return rc;
}
