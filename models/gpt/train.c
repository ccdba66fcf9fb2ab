/* train.c - the gpt program's training loop: one optimizer step in any layout, its logs
 * (JSON lines, TensorBoard, the progress line), the validation loss, the checkpoints, and the
 * last line (one JSON object). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <nabla/nabla.h>
#include <nabla/run.h>
#include <nabla/summary.h>

#include "ft.h"
#include "precision.h"
#include "prog.h"

/* Mean loss over the fixed validation batches (the generator is rewound each time, so every
 * evaluation sees the same batches), in eval mode without gradients. The data-parallel ranks
 * share the batches out; the ranks of one model (tensor-parallel, pipeline stages) work on each
 * together. Every data-parallel rank runs the same number of forwards, ceil(n / dp): with fewer
 * batches than that a rank evaluates one again without counting it, because a forward may be
 * collective over dp (ZeRO-3 gathers the parameters). */
static double evaluate(const nbm_arch *arch, nb_module *m, nb_pipeline *pipe, nb_tensor *val, nb_generator *vgen,
                       int64_t n, nb_tensor *x, nb_tensor *y, nb_comm *world, nb_comm *dp,
                       nb_dtype prec) {
    const int rank = nb_comm_rank(dp), size = nb_comm_size(dp);
    const int64_t rounds = (n + size - 1) / size;
    nb_generator_set_stream(vgen, 0);
    nb_module_train(m, false);
    bool prev = nb_set_grad_enabled(false);
    double sum = 0;
    for (int64_t k = 0; k < rounds && !isnan(sum); k++) {
        nb_scope_begin(); /* every rank draws every batch of the round (same stream) */
        nb_status st = NB_OK;
        nb_tensor *xm = NULL, *ym = NULL; /* this rank's: batch k size + rank, or a repeat */
        for (int64_t j = 0; j < size && st == NB_OK; j++) {
            if (k * size + j < n) st = nb_text_sample(val, vgen, x, y);
            if (j == rank && st == NB_OK) xm = nb_clone(x), ym = nb_clone(y);
        }
        const bool counts = k * size + rank < n;
        double l = NAN;
        if (st == NB_OK && xm && ym && nbm_precision_begin(prec) == NB_OK) {
            if (pipe) {
                if (nb_pipeline_eval(pipe, xm, ym, &l, NULL) != NB_OK) l = NAN;
            } else {
                nb_tensor *t = nbm_arch_loss(arch, m, xm, ym);
                l = t ? nb_item_f64(t) : NAN;
            }
            nbm_precision_end(prec);
        }
        if (isnan(l)) sum = NAN;
        else if (counts) sum += l;
        nb_scope_end();
    }
    nb_set_grad_enabled(prev);
    nb_module_train(m, true);
    /* Every rank takes part, even one that failed (its NaN spreads), so none waits forever.
     * The ranks of one model hold the same sum: the world's mean times dp is the dp sum. */
    return nb_mean_over_ranks(world, sum) * (double)size / (double)n;
}

/* One TensorBoard scalar at the current step; the first failed write warns (the run goes
 * on, and its exit status says the file is incomplete). */
static void tb_scalar(run *r, const char *tag, double v) {
    if (!r->tb || nb_summary_scalar(r->tb, tag, r->step, v) == NB_OK || r->tb_failed) return;
    r->tb_failed = true;
    nb_report("gpt", r->rank, r->size, "warning: %s; the TensorBoard file is incomplete (the "
              "run goes on, and exits with status 1)", nb_last_error());
}

/* The whole model's parameter count, whatever part of it this rank holds (each parameter's
 * whole shape from its placement; the pipeline's other stages keep their shapes). */
static int64_t whole_params(nb_module *m) {
    const nb_params *ps = nb_parameters(m);
    int64_t n = 0;
    for (int i = 0; ps && i < ps->count; i++) {
        nb_placement pl;
        if (nb_tensor_placement(ps->tensors[i], &pl) != NB_OK) continue;
        int64_t k = 1;
        for (int d = 0; d < pl.ndim; d++) k *= pl.shape[d];
        n += k;
    }
    return n;
}

static void print_header(const run *r) {
    if (!r->main_rank) return;
    int64_t L, H, Hkv, C;
    nbm_arch_shape(&r->arch, &L, &H, &Hkv, &C);
    printf("gpt: %s%lld parameters, %lld layers, %lld heads",
           r->arch.kind == NBM_LLAMA ? "llama, " : "", (long long)whole_params(r->model),
           (long long)L, (long long)H);
    if (r->arch.kind == NBM_LLAMA) printf(" (%lld key/value)", (long long)Hkv);
    printf(", width %lld, context %lld; %lld train / %lld val bytes; batch %lld in %lld "
           "micro-batches; ", (long long)C, (long long)r->T,
           (long long)nb_numel(r->train), (long long)nb_numel(r->val), (long long)r->B,
           (long long)r->N);
    if (r->a->tp > 1 || r->pipe)
        printf("%d ranks as %s%s (%lld sequences per replica) x %d threads", r->size,
               nb_mesh_describe(r->mesh), r->a->sequence_parallel ? " sequence parallel" : "",
               (long long)(r->B / r->dp_size), nb_get_num_threads());
    else if (r->size > 1)
        printf("%d ranks (%lld sequences each) x %d threads, %d gradient buckets", r->size,
               (long long)(r->B / r->size), nb_get_num_threads(),
               r->zero ? nb_zero_num_buckets(r->zero) : nb_ddp_num_buckets(r->ddp));
    else
        printf("%d threads", nb_get_num_threads());
    printf(", gemm %s, precision %s\n", nb_gemm_provider_name(nb_gemm_provider_current()),
           nbm_precision_name(r->a->precision));
    nbm_precision_note("gpt", r->a->precision, stdout);
    fflush(stdout);
}

/* The pipeline schedule's name (1f1b when not given). */
static const char *pp_schedule_name(const run *r) {
    nb_pipe_schedule sch = NB_PIPE_1F1B;
    if (r->a->pp_schedule) nb_pipe_schedule_parse(r->a->pp_schedule, &sch);
    return nb_pipe_schedule_name(sch);
}

/* What one step measured, for the logs. */
typedef struct step_result {
    double loss, lr, grad_norm, seconds, comm_ms, tp_ms;
} step_result;

/* One optimizer step: draw the micro-batches, forward, backward (averaged over the ranks),
 * clip, update, advance the schedule. The loss is the mean over the ranks. */
static bool train_step(run *r, step_result *o) {
    double t0 = nb_time_s();
    nb_alloc_stats sa;
    nb_alloc_get_stats(&sa);
    if (nb_text_sample(r->train, r->batch_gen, r->xg, r->yg) != NB_OK)
        return fail(r, "%s", nb_last_error());
    o->lr = nb_optim_get_lr(r->opt, 0);
    /* The dropout masks of a step start at a position that is the step's alone (2^32 Philox
     * blocks a step): the stages of a pipeline draw different amounts, and a resumed run
     * (any stage, any rank) continues exactly where the uninterrupted one would be. */
    if (nb_generator_set_offset(r->drop_gen, (uint64_t)r->step << 32) != NB_OK)
        return fail(r, "%s", nb_last_error());
    nb_clear_error(); /* a NaN below is an error only when one is set */
    nb_tp_comm_stats_reset();
    if (nbm_precision_begin(r->a->precision) != NB_OK) return fail(r, "%s", nb_last_error());
    /* one step for every layout: the pipeline (if any) runs the micro-batches through its
     * stages, the reducer synchronises, the norm is the whole model's */
    nb_gpt_step_opts so = nb_gpt_step_defaults();
    so.ddp = r->ddp, so.zero = r->zero, so.scaler = r->scaler, so.grad_clip = r->a->grad_clip;
    so.pipeline = r->pipe, so.pipe_stats = &r->ps;
    /* --on-nonfinite's tests (NBM_TEST_NONFINITE): this rank's first parameter NaN for the
     * step, which is then not applied; the value comes back after it */
    const nb_params *mp = nb_parameters(r->mine);
    nb_tensor *p0 = mp && mp->count ? mp->tensors[0] : NULL, *p0_saved = NULL;
    if (p0 && isnan(nbm_guard_test_factor(r->step + 1, r->rank))) {
        bool prev = nb_set_grad_enabled(false);
        p0_saved = nb_clone(p0);
        nb_fill_(p0, NAN);
        nb_set_grad_enabled(prev);
    }
    double loss = nbm_arch_train_step(&r->arch, r->model, r->opt, r->xl, r->yl, (int)r->N, &so,
                                      &o->grad_norm);
    nbm_precision_end(r->a->precision);
    if (p0_saved) {
        bool prev = nb_set_grad_enabled(false);
        nb_copy_(p0, p0_saved);
        nb_set_grad_enabled(prev);
        nb_tensor_free(p0_saved);
    }
    if (r->pipe && !isnan(r->ps.bubble)) {
        r->bubble_sum += r->ps.bubble;
        if (r->ps.peak_live_micro > r->peak_live) r->peak_live = r->ps.peak_live_micro;
    }
    /* fp16: an overflowed gradient is the loss scaler's to handle (step skipped, scale
     * halved), not a diverged run */
    if (r->scaler && !isfinite(o->grad_norm) && nb_grad_scaler_skipped(r->scaler))
        o->grad_norm = 0;
    if (isnan(loss) && nb_last_status() != NB_OK)
        return fail(r, "step %lld: %s", (long long)r->step + 1, nb_last_error());
    /* exposed communication: the reducer's (not overlapped with backward), with a pipeline its
     * waits for activations and gradients and the communication after the passes */
    o->comm_ms = r->pipe  ? (r->ps.wait_s + r->ps.comm_s) * 1e3
                 : r->zero ? nb_zero_exposed_comm_s(r->zero) * 1e3
                 : r->ddp  ? nb_ddp_exposed_comm_s(r->ddp) * 1e3
                           : 0;
    nb_tp_comm_stats cs; /* tensor parallel: blocking collectives, all exposed */
    nb_tp_comm_stats_get(&cs);
    o->tp_ms = cs.seconds * 1e3;
    o->comm_ms += o->tp_ms;
    r->exposed_sum += o->comm_ms / 1e3, r->tp_sum += o->tp_ms / 1e3;
    if (isnan(loss = nbm_step_sync(r->world, loss, &r->stop)) && nb_last_status() != NB_OK)
        return fail(r, "step %lld: %s", (long long)r->step + 1, nb_last_error());
    /* A NaN or infinite loss or gradient norm (whose step nb_gpt_train_step did not apply):
     * stop, naming the step, or skip it (--on-nonfinite). With several ranks it is the mean
     * loss and the common norm, so all decide the same at this step. */
    char why[256];
    int g = nbm_guard_step(&guard, r->step + 1, loss, o->grad_norm, why, sizeof why);
    if (g < 0) return fail(r, "%s", why);
    if (g > 0 && r->main_rank) {
        nb_progress_break(r->bar);
        fprintf(stderr, "gpt: %s\n", why);
    }
    if (nb_sched_step(r->sched) != NB_OK) return fail(r, "%s", nb_last_error());
    o->loss = loss;
    o->seconds = nb_time_s() - t0;
    r->times[r->step - r->first] = o->seconds;
    r->step++;
    if (r->step - r->first > 10) { /* steady state: the training steps after the 10th (not
                                     * the evaluations and checkpoints between them) */
        nb_alloc_stats se;
        nb_alloc_get_stats(&se);
        r->steady_allocs = (r->steady_allocs < 0 ? 0 : r->steady_allocs) +
                           (se.system_allocs - sa.system_allocs);
    }
    if (g == 0) r->last_losses[r->n_last++ % 10] = loss; /* not a skipped step's */
    nb_progress_step(r->bar, o->seconds, (double)r->tokens_per_step);
    return true;
}

/* After a step: its JSON line, TensorBoard scalars and the progress line. */
static void log_step(run *r, const step_result *o) {
    const int64_t steps = r->a->steps;
    nb_jsonl_begin(r->log);
    nb_jsonl_str(r->log, "type", "step");
    nb_jsonl_int(r->log, "step", r->step);
    nb_jsonl_num(r->log, "loss", o->loss, 6);
    nb_jsonl_num_g(r->log, "lr", o->lr, 6);
    nb_jsonl_num(r->log, "grad_norm", o->grad_norm, 6);
    nb_jsonl_num(r->log, "step_ms", o->seconds * 1e3, 2);
    nb_jsonl_num(r->log, "tokens_per_s", nb_progress_rate(r->bar), 1);
    nb_jsonl_num(r->log, "exposed_comm_ms", o->comm_ms, 3);
    if (r->size > 1) { /* the layout */
        nb_jsonl_int(r->log, "dp", r->dp_size);
        nb_jsonl_int(r->log, "tp", r->a->tp > 1 ? r->a->tp : 1);
        nb_jsonl_int(r->log, "pp", r->pipe ? r->a->pp : 1);
    }
    if (r->a->tp > 1) nb_jsonl_num(r->log, "tp_comm_ms", o->tp_ms, 3);
    if (r->pipe) {
        nb_jsonl_str(r->log, "pp_schedule", pp_schedule_name(r));
        nb_jsonl_int(r->log, "microbatches", r->N);
        nb_jsonl_int(r->log, "virtual_stages", r->a->virtual_stages ? r->a->virtual_stages : 1);
        nb_jsonl_num(r->log, "bubble", r->ps.bubble, 4);
        nb_jsonl_num(r->log, "bubble_ideal", r->ps.bubble_theory, 4);
    }
    if (guard.skip) nb_jsonl_int(r->log, "skipped_steps", guard.skipped); /* so far */
    nb_jsonl_end(r->log);
    tb_scalar(r, "train/loss", o->loss);
    tb_scalar(r, "train/lr", o->lr);
    tb_scalar(r, "train/grad_norm", o->grad_norm);
    tb_scalar(r, "train/tokens_per_s", nb_progress_recent_rate(r->bar));
    tb_scalar(r, "train/step_ms", o->seconds * 1e3);
    const bool comm_on = r->size > 1;
    if (comm_on) tb_scalar(r, "train/exposed_comm_ms", o->comm_ms);
    if (r->pipe) tb_scalar(r, "train/bubble", r->ps.bubble);
    char comm[80] = "";
    if (comm_on) snprintf(comm, sizeof comm, "  comm %.1f ms", o->comm_ms);
    if (guard.skipped)
        snprintf(comm + strlen(comm), sizeof comm - strlen(comm), "  skipped %lld",
                 (long long)guard.skipped);
    if (r->step - r->first == 1 && r->main_rank) { /* the state exists after the first step */
        double mib[4];
        nbm_model_state_mib(r->zero, r->opt, r->mine, mib);
        nb_progress_break(r->bar);
        printf("model state per rank: %.1f MiB (parameters %.1f, gradients %.1f, optimizer "
               "%.1f)\n", mib[0], mib[1], mib[2], mib[3]);
    }
    const int64_t print_every = steps >= 20 ? steps / 20 : 1;
    nb_progress_show(r->bar, r->step % print_every == 0 || r->step == steps,
                     "step %lld/%lld  loss %.4f  lr %.2e%s", (long long)r->step,
                     (long long)steps, o->loss, o->lr, comm);
}

/* The validation loss now; with train_loss (the last step's, NAN for none) reported. */
static bool evaluate_and_log(run *r, double train_loss) {
    double te = nb_time_s();
    nb_clear_error(); /* a NaN below is an error only when one is set */
    r->val_loss = evaluate(&r->arch, r->model, r->pipe, r->val, r->val_gen, r->a->eval_batches,
                           r->vx, r->vy, r->world, r->dp, r->a->precision) *
                  nbm_guard_test_eval_factor(r->step);
    if (isnan(r->val_loss) && nb_last_status() != NB_OK)
        return fail(r, "evaluation at step %lld: %s", (long long)r->step, nb_last_error());
    if (!isfinite(r->val_loss)) { /* the model's outputs are not finite: the same on every rank */
        r->diverged_val = true;
        return fail(r, "step %lld: the validation loss is %s: the model diverged (its outputs are "
                    "not finite; --on-nonfinite skips training steps only)", (long long)r->step,
                    isnan(r->val_loss) ? "NaN" : r->val_loss > 0 ? "inf" : "-inf");
    }
    r->val_step = r->step;
    if (isnan(train_loss)) return true; /* the evaluation of a run with nothing to train */
    if (r->main_rank) {
        nb_progress_break(r->bar);
        printf("step %lld: train loss %.4f  val loss %.4f  (eval %.1f s)\n", (long long)r->step,
               train_loss, r->val_loss, nb_time_s() - te);
        fflush(stdout);
    }
    nb_jsonl_begin(r->log);
    nb_jsonl_str(r->log, "type", "eval");
    nb_jsonl_int(r->log, "step", r->step);
    nb_jsonl_num(r->log, "train_loss", train_loss, 6);
    nb_jsonl_num(r->log, "val_loss", r->val_loss, 6);
    nb_jsonl_end(r->log);
    nb_alloc_stats st;
    nb_alloc_get_stats(&st);
    tb_scalar(r, "val/loss", r->val_loss);
    tb_scalar(r, "memory/bytes_peak", (double)st.bytes_peak);
    return true;
}

/* The training loop: steps, evaluations every --eval-every and at the end, checkpoints. */
bool train_loop(run *r) {
    const args *a = r->a;
    print_header(r);
    while (r->step < a->steps) {
        step_result o;
        if (!train_step(r, &o)) return false;
        log_step(r, &o);
        bool eval_now = r->step == a->steps || (a->eval_every > 0 && r->step % a->eval_every == 0);
        if (eval_now && !evaluate_and_log(r, o.loss)) return false;
        /* every rank takes part: each writes its part of the checkpoint (or, when every
         * rank holds it all, rank 0 writes it) */
        bool save_now = a->save && (r->step == a->steps ||
                                    (a->save_every > 0 ? r->step % a->save_every == 0 : eval_now));
        if (save_now || (r->stop && a->save)) { /* a signal: save this step */
            r->ck.step = r->step;
            nb_checkpoint ck = r->ck;
            if (nbm_save(a->save, a->keep, &ck) != NB_OK) return fail(r, "%s", nb_last_error());
        }
        nb_jsonl_flush(r->log);
        if (r->tb) nb_summary_flush(r->tb); /* a failure shows at the next write or the close */
        if (r->stop) { /* all ranks agree on this step; the mean is the barrier after the save */
            nb_mean_over_ranks(r->world, 0);
            if (r->main_rank) {
                nb_progress_break(r->bar);
                printf("stopped by %s after step %lld%s%s\n", nb_stop_signal_name(r->stop),
                       (long long)r->step, a->save ? "; checkpoint " : "", a->save ? a->save : "");
            }
            if (r->val_step != r->step) r->val_loss = NAN; /* not evaluated at this step */
            r->val_step = r->step;
            return true;
        }
    }
    /* nothing trained (or resumed at the end): evaluate once */
    return r->val_step == r->step || evaluate_and_log(r, NAN);
}

/* The last line: one JSON object. Throughput as torch_ref.py reports it: the median step
 * time, after 10 warm-up steps when there are at least 20. */
void print_result(const run *r, double wall_s) {
    int64_t ran = r->step - r->first, skip = ran >= 20 ? 10 : 0;
    double median = nb_median(r->times + skip, ran - skip), train_loss = NAN;
    if (ran > skip) {
        int64_t nl = r->n_last < 10 ? r->n_last : 10;
        train_loss = 0;
        for (int64_t i = 0; i < nl; i++) train_loss += r->last_losses[i];
        train_loss /= (double)nl;
    }
    struct rusage ru; /* peak resident memory, as torch_ref.py's peak_rss_mib */
    double rss_mib = getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss / 1024.0 : NAN;
    if (!r->main_rank) return;
    nb_jsonl *out = nb_jsonl_stream("gpt", stdout, "standard output");
    nb_jsonl_begin(out);
    nb_jsonl_str(out, "model", nbm_arch_name(r->arch.kind));
    nb_jsonl_num(out, "val_loss", r->val_loss, 4);
    nb_jsonl_num(out, "train_loss", train_loss, 4);
    nb_jsonl_num(out, "tokens_per_s", ran > skip ? (double)r->tokens_per_step / median : 0.0, 1);
    nb_jsonl_num(out, "wall_s", wall_s, 2);
    nb_jsonl_int(out, "steps", r->step);
    nb_jsonl_int(out, "params", whole_params(r->model));
    nb_jsonl_num(out, "step_ms_median", ran > skip ? median * 1e3 : 0.0, 2);
    nb_jsonl_num(out, "gflop_per_step", r->flops / 1e9, 3);
    nb_jsonl_num(out, "gflops", ran > skip ? r->flops / 1e9 / median : 0.0, 1);
    nb_jsonl_int(out, "threads", nb_get_num_threads());
    nb_jsonl_str(out, "device", nbm_device_name(&device));
    nb_jsonl_int(out, "ranks", r->size);
    nb_jsonl_int(out, "steady_system_allocs", r->steady_allocs);
    nb_jsonl_num(out, "peak_rss_mib", rss_mib, 0);
    nb_jsonl_str(out, "checkpoint_activations", r->a->recompute);
    nb_jsonl_str(out, "precision", nbm_precision_name(r->a->precision));
    nb_jsonl_str(out, "precision_path", nbm_precision_path(r->a->precision));
    double state_mib[4];
    nbm_model_state_mib(r->zero, r->opt, r->mine, state_mib);
    nb_jsonl_int(out, "zero", r->a->zero);
    nb_jsonl_str(out, "reduce_dtype", nbm_precision_name(r->a->reduce_dtype));
    nb_jsonl_int(out, "grad_comm_bytes", r->zero ? nb_zero_comm_bytes(r->zero)
                                                 : nb_ddp_comm_bytes(r->ddp));
    nb_jsonl_int(out, "dp", r->dp_size);
    nb_jsonl_int(out, "tp", r->a->tp > 1 ? r->a->tp : 1);
    nb_jsonl_int(out, "sequence_parallel", r->a->sequence_parallel);
    nb_jsonl_int(out, "microbatches", r->N);
    if (r->a->tp > 1) nb_jsonl_num(out, "tp_comm_ms", ran ? r->tp_sum / (double)ran * 1e3 : NAN, 3);
    if (r->pipe) { /* the pipeline's figures */
        int S;
        nb_pipeline_boundaries(r->pipe, &S);
        const int v = r->a->virtual_stages ? (int)r->a->virtual_stages : 1;
        nb_pipe_schedule sch = NB_PIPE_1F1B;
        if (r->a->pp_schedule) nb_pipe_schedule_parse(r->a->pp_schedule, &sch);
        nb_jsonl_int(out, "pp", r->a->pp);
        nb_jsonl_str(out, "pp_schedule", pp_schedule_name(r));
        nb_jsonl_int(out, "virtual_stages", v);
        nb_jsonl_num(out, "bubble", ran ? r->bubble_sum / (double)ran : NAN, 4);
        nb_jsonl_num(out, "bubble_ideal", nb_pipe_bubble_theory(sch, (int)r->a->pp, (int)r->N, v), 4);
        nb_jsonl_int(out, "peak_live_microbatches", r->peak_live);
        nb_jsonl_num(out, "exposed_comm_ms", ran ? r->exposed_sum / (double)ran * 1e3 : NAN, 3);
    } else {
        nb_jsonl_int(out, "pp", 1);
    }
    nb_jsonl_num(out, "model_state_mib", state_mib[0], 2);
    if (guard.skip) nb_jsonl_int(out, "skipped_steps", guard.skipped);
    nbm_save_fields(out);
    if (r->diverged_val) nb_jsonl_str(out, "stopped", "nonfinite_val_loss");
    nbm_stop_fields(out, r->stop);
    nb_jsonl_end(out);
    nb_jsonl_close(out); /* a failed write shows in nb_stdout_ok */
}

/* Close the logs: false when one of them lost lines (after saying so). */
bool close_logs(run *r) {
    bool ok = true;
    if (nb_jsonl_close(r->log) != NB_OK) {
        nb_report("gpt", r->rank, r->size, "the run finished, but --log %s is incomplete (see "
                  "the warning above): exit status 1", r->a->log);
        ok = false;
    }
    r->log = NULL;
    if (nb_summary_close(r->tb) != NB_OK) {
        nb_report("gpt", r->rank, r->size, "the run finished, but --tensorboard %s is "
                  "incomplete (%s): exit status 1", r->a->tensorboard, nb_last_error());
        ok = false;
    }
    r->tb = NULL;
    return ok;
}

/* --save of a parallel run: rank 0 writes the last checkpoint's model as one plain file,
 * <checkpoint>/model.safetensors (nanoGPT's names; gpt --sample --load reads it). */
bool consolidate_end(run *r) {
    const args *a = r->a;
    if (!a->save || r->size == 1 || !r->main_rank || r->step == r->first) return true;
    char path[4400], out[4500];
    nb_status st = a->keep > 0 ? nb_checkpoint_path(a->save, r->step, path, sizeof path) : NB_OK;
    if (a->keep <= 0) snprintf(path, sizeof path, "%s", a->save);
    struct stat sb;
    if (st == NB_OK && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(out, sizeof out, "%s/model.safetensors", path);
        st = nb_checkpoint_consolidate(path, out, true);
    }
    return st == NB_OK || fail(r, "--save %s: %s", a->save, nb_last_error());
}
