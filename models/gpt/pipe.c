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
 * writes the stage files in the background (nb_gpt_pipe_save_async). Public API only. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nabla/nabla.h>
#include <nabla/run.h>

#include "ft.h"
#include "pipe.h"

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

int gpt_pipe_train(const gpt_pipe_args *a, nb_tensor *text) {
    nbm_stop_begin("gpt"); /* before MPI and the thread pools start threads */
    nb_comm *world = nb_comm_world();
    if (!world) {
        fprintf(stderr, "gpt: %s\n", nb_last_error());
        return 1;
    }
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
    nb_generator *init = NULL, *batch_gen = NULL, *drop_gen = NULL;
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
    nb_gpt_config cfg = a->cfg;
    cfg.dropout_gen = drop_gen;
    nb_gpt_pipe_opts po = nb_gpt_pipe_defaults();
    po.schedule = ps;
    po.n_micro = K;
    po.virtual_stages = (int)a->virtual_stages;
    po.tp = topo && TP > 1 ? nb_topology_tp(topo) : NULL;
    po.sequence_parallel = a->sequence_parallel;
    if (!pp || !dp || !init || !batch_gen || !drop_gen ||
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
        !(times = calloc((size_t)a->steps + 1, sizeof *times))) {
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
        printf("\n");
        fflush(stdout);
    }
    const int64_t rows = B / D, first = step, d = nb_comm_rank(dp);
    double bubble_sum = 0, wait_sum = 0, comm_sum = 0, tp_sum = 0, last_loss = NAN, theory = NAN;
    int64_t peak = 0, saved = -1;
    for (; step < a->steps && !stop; step++) {
        double t0 = nb_time_s();
        nb_pipe_stats st;
        double norm = NAN;
        if (nb_text_sample(train, batch_gen, X, Y) != NB_OK) {
            fprintf(stderr, "gpt: %s\n", nb_last_error());
            goto done;
        }
        nb_tp_comm_stats_reset(); /* the stages' tensor-parallel collectives: blocking */
        nb_scope_begin();
        double loss = nb_gpt_pipe_train_step(pipe, opt, nb_narrow(X, 0, d * rows, rows),
                                             nb_narrow(Y, 0, d * rows, rows), a->grad_clip,
                                             &norm, &st);
        nb_scope_end();
        if (isnan(loss) || nb_sched_step(sched) != NB_OK) {
            fprintf(stderr, "gpt: rank %d, step %lld: %s\n", rank, (long long)step + 1,
                    nb_last_error());
            goto done;
        }
        times[step - first] = nb_time_s() - t0;
        nb_tp_comm_stats tc;
        nb_tp_comm_stats_get(&tc);
        tp_sum += tc.seconds;
        bubble_sum += st.bubble;
        wait_sum += st.wait_s;
        comm_sum += st.comm_s;
        theory = st.bubble_theory;
        if (st.peak_live_micro > peak) peak = st.peak_live_micro;
        last_loss = loss;
        /* the stop signal every rank agrees on (the loss is the same on every rank already) */
        if (isnan(nbm_step_sync(world, 0.0, &stop))) {
            fprintf(stderr, "gpt: rank %d: %s\n", rank, nb_last_error());
            goto done;
        }
        if (a->save && (stop || (a->save_every > 0 && (step + 1) % a->save_every == 0))) {
            if (save_at(pipe, opt, zero, w, a, step + 1) != NB_OK) {
                fprintf(stderr, "gpt: rank %d: --save %s: %s\n", rank, a->save, nb_last_error());
                goto done;
            }
            saved = step + 1;
        }
        const int64_t every = a->steps >= 20 ? a->steps / 20 : 1;
        if (rank == 0 && ((step + 1) % every == 0 || step + 1 == a->steps || stop)) {
            printf("step %lld/%lld  loss %.4f  norm %.3f  %.0f ms  bubble %.3f (ideal %.3f)  "
                   "exposed comm %.1f ms (tp %.1f ms)  [dp %d x tp %d x pp %d, %s]\n",
                   (long long)step + 1, (long long)a->steps, loss, norm, times[step - first] * 1e3,
                   st.bubble, st.bubble_theory, (st.wait_s + st.comm_s + tc.seconds) * 1e3,
                   tc.seconds * 1e3, D, TP, P, a->pp_schedule);
            fflush(stdout);
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
done:
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
    nb_sched_free(sched);
    nb_optim_free(opt);
    nb_params_deinit(&decay);
    nb_params_deinit(&no_decay);
    nb_gpt_pipe_free(pipe);
    nb_generator_free(init);
    nb_generator_free(batch_gen);
    nb_generator_free(drop_gen);
    nb_topology_free(topo); /* after the pipeline, which borrows its groups */
    nb_comm_free(world);
    return rc;
}
