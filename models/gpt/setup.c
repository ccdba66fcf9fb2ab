/* setup.c - one training run of the gpt program set up and torn down: the mesh, the text and
 * its batches, the model made parallel and split, AdamW and its schedule, the settings kept in
 * checkpoints, the reducer, the resume, the logs (prog.h's run). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nabla/nabla.h>
#include <nabla/run.h>
#include <nabla/summary.h>

#include "ft.h"
#include "precision.h"
#include "prog.h"

/* The default text: the output of the KJV command (Debian package bible-kjv), 4.3 MB. */
static nb_tensor *read_kjv(void) {
    FILE *p = popen(KJV_COMMAND " 2>/dev/null", "r");
    if (!p) return NULL;
    size_t n = 0, cap = 1 << 23;
    unsigned char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, p)) > 0;) {
        n += got;
        if (n == cap) {
            unsigned char *b = realloc(buf, cap *= 2);
            if (!b) free(buf);
            buf = b;
        }
    }
    int rc = pclose(p);
    nb_tensor *t = NULL;
    if (buf && rc == 0 && n > 0) t = nb_from_buffer(buf, (int64_t[]){(int64_t)n}, 1, NB_U8);
    free(buf);
    return t;
}

/* MemAvailable of /proc/meminfo in bytes, or -1 where there is none. */
static double available_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    double kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

static void human(double bytes, char *buf, size_t n) {
    const char *unit[] = {"B", "KB", "MB", "GB", "TB", "PB"};
    int u = 0;
    while (bytes >= 1024 && u < 5) bytes /= 1024, u++;
    snprintf(buf, n, "%.1f %s", bytes, unit[u]);
}

/* Refuse a configuration this machine cannot train before allocating anything (a model of
 * 100000 layers used to allocate for minutes). The parameter count is the model's own, built
 * on the meta device (arch.c: shapes only, nothing allocated). Training needs 16 bytes a
 * parameter (f32 weights, gradients and AdamW's two moments) plus the activations the
 * backward keeps: about 20 f32 values per layer and token of width C, and the logits, for
 * B_local sequences of T tokens (one micro-batch of this rank). NB_OK when it fits or the
 * available memory is unknown. */
static nb_status check_fits(const nbm_arch *arch, int64_t B_local, int64_t T) {
    int64_t n_layer, n_head, n_kv_head, n_embd;
    nbm_arch_shape(arch, &n_layer, &n_head, &n_kv_head, &n_embd);
    double C = (double)n_embd, L = (double)n_layer, V = 256, Tb = (double)T;
    double params = nbm_arch_params(arch);
    if (isnan(params)) return nb_last_status(); /* a config the model refuses */
    double acts = 4.0 * (double)B_local * Tb * (20.0 * C * L + 2.0 * V);
    double need = 16.0 * params + acts, have = available_bytes();
    if (have < 0 || need <= have) return NB_OK;
    char n1[32], n2[32], n3[32];
    human(need, n1, sizeof n1), human(16.0 * params, n2, sizeof n2), human(have, n3, sizeof n3);
    return nb_set_error(NB_ENOMEM, "this configuration needs about %s to train (%.3g "
                        "parameters: %s for weights, gradients and AdamW state, plus "
                        "activations) but the machine has %s available; use a smaller "
                        "--n-layer, --n-embd or --batch, or more --microbatches", n1, params, n2, n3);
}

__attribute__((format(printf, 2, 3))) bool fail(const run *r, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    nb_report("gpt", r->rank, r->size, "%s", msg);
    return false;
}

/* The text, split 9:1 into training and validation bytes, and the batch tensors. */
static bool setup_data(run *r) {
    const args *a = r->a;
    const int64_t B = r->B, T = r->T;
    r->text = a->data ? nb_read_bytes(a->data) : read_kjv();
    if (!r->text) {
        if (a->data) return fail(r, "%s", nb_last_error());
        return fail(r, "could not run `%s` (install the Debian package bible-kjv, or pass "
                    "--data FILE)", KJV_COMMAND);
    }
    if (nb_text_split(r->text, 0.9, &r->train, &r->val) != NB_OK)
        return fail(r, "%s", nb_last_error());
    /* the validation batches: (B, T) each, whichever layout evaluates them */
    if (!(r->vx = nb_empty((int64_t[]){B, T}, 2, NB_I64)) ||
        !(r->vy = nb_empty((int64_t[]){B, T}, 2, NB_I64)))
        return fail(r, "%s", nb_last_error());
    if (nb_numel(r->val) <= T || nb_numel(r->train) <= T)
        return fail(r, "the text (%lld bytes) is too short for --block-size %lld: its last 10%% "
                    "(the validation part) must be longer than a block",
                    (long long)nb_numel(r->text), (long long)T);
    /* the step's global batch, drawn at once (so the data do not depend on how it is cut), as
     * N micro-batches; this data-parallel rank's rows of each */
    if (!(r->xg = nb_empty((int64_t[]){B, T}, 2, NB_I64)) ||
        !(r->yg = nb_empty((int64_t[]){B, T}, 2, NB_I64)))
        return fail(r, "%s", nb_last_error());
    for (int64_t i = 0; i < r->N; i++) {
        r->xs[i] = nb_narrow(r->xg, 0, i * (B / r->N), B / r->N);
        r->ys[i] = nb_narrow(r->yg, 0, i * (B / r->N), B / r->N);
        if (!r->xs[i] || !r->ys[i]) return fail(r, "%s", nb_last_error());
        int64_t rows = B / r->N / r->dp_size, at = r->dp_rank * rows;
        r->xl[i] = r->dp_size > 1 ? nb_narrow(r->xs[i], 0, at, rows) : r->xs[i];
        r->yl[i] = r->dp_size > 1 ? nb_narrow(r->ys[i], 0, at, rows) : r->ys[i];
        if (!r->xl[i] || !r->yl[i]) return fail(r, "%s", nb_last_error());
    }
    return true;
}

/* AdamW with nanoGPT's grouping: weight decay on matmul and embedding weights, none on
 * biases and layer norms (decay and no_decay get the groups' lists). */
static nb_optim *make_adamw(const args *a, nb_module *m, nb_params *decay, nb_params *no_decay) {
    if (nb_params_split_decay(nb_parameters(m), decay, no_decay) != NB_OK) return NULL;
    nb_adamw_opts ao = nb_adamw_defaults();
    ao.lr = a->lr;
    ao.betas[0] = a->beta1;
    ao.betas[1] = a->beta2;
    ao.weight_decay = a->weight_decay;
    nb_optim *opt = nb_adamw_new(decay, &ao);
    nb_group_opts no_wd = nb_group_defaults();
    no_wd.weight_decay = 0;
    if (opt && nb_optim_add_group(opt, no_decay, &no_wd) < 0) {
        nb_optim_free(opt);
        return NULL;
    }
    return opt;
}

/* The model, made parallel by its plan and split over the mesh; AdamW with nanoGPT's grouping
 * over this rank's part, and the learning-rate schedule. */
static bool setup_model(run *r) {
    const args *a = r->a;
    const nb_gpt_recompute rc = !strcmp(a->recompute, "full")   ? NB_GPT_RECOMPUTE_FULL
                                : !strcmp(a->recompute, "attn") ? NB_GPT_RECOMPUTE_ATTN
                                                                : NB_GPT_RECOMPUTE_NONE;
    r->arch = (nbm_arch){
        .kind = a->arch, .gpt = nb_gpt_config_defaults(), .llama = nb_llama_config_defaults()};
    nb_gpt_config *g = &r->arch.gpt;
    g->block_size = r->T, g->n_layer = a->n_layer, g->n_head = a->n_head, g->n_embd = a->n_embd;
    g->dropout = a->dropout, g->no_bias = !a->bias, g->gelu_tanh = a->gelu_tanh != 0;
    g->dropout_gen = r->drop_gen, g->recompute = rc;
    nb_llama_config *l = &r->arch.llama;
    l->block_size = r->T, l->n_layer = a->n_layer, l->n_head = a->n_head;
    l->n_kv_head = a->n_kv_head, l->n_embd = a->n_embd, l->recompute = rc;
    nb_share_threads(r->world, (int)a->threads);
    if (check_fits(&r->arch, r->B / r->dp_size / r->N, r->T) != NB_OK) /* a micro-batch */
        return fail(r, "%s", nb_last_error());
    if (!(r->model = nbm_arch_new(&r->arch, r->init))) return fail(r, "%s", nb_last_error());
    if (a->precision == NB_F16) { /* fp16 gradients underflow without loss scaling */
        if (!(r->scaler = nb_grad_scaler_new(NULL)) ||
            (r->size > 1 && nb_grad_scaler_set_comm(r->scaler, r->world) != NB_OK))
            return fail(r, "%s", nb_last_error());
    }
    /* Layout mistakes (a tp that does not divide n_head, fewer layers than stages) are usage
     * errors, found the same way on every rank: exit status 2. */
    nb_parallelize_opts po = nb_parallelize_defaults();
    po.sequence_parallel = a->sequence_parallel;
    if ((a->tp > 1 || a->sequence_parallel) &&
        nbm_arch_parallelize(&r->arch, r->model, r->mesh, &po) != NB_OK)
        return r->usage = true, fail(r, "--tp %lld: %s", (long long)a->tp, nb_last_error());
    if (a->pp > 1) {
        nb_pipeline_opts pio = nb_pipeline_defaults();
        pio.n_micro = (int)r->N;
        pio.virtual_stages = a->virtual_stages ? (int)a->virtual_stages : 1;
        pio.scaler = r->scaler;
        if (a->pp_schedule && nb_pipe_schedule_parse(a->pp_schedule, &pio.schedule) != NB_OK)
            return r->usage = true, fail(r, "--pp-schedule: %s", nb_last_error());
        if (!(r->pipe = nbm_arch_pipeline_new(&r->arch, r->model, r->mesh, &pio)))
            return r->usage = true, fail(r, "--pp %lld: %s", (long long)a->pp, nb_last_error());
    }
    r->mine = r->pipe ? nb_pipeline_module(r->pipe) : r->model;
    if (!(r->opt = make_adamw(a, r->mine, &r->decay, &r->no_decay)))
        return fail(r, "%s", nb_last_error());
    bool cosine = !strcmp(a->schedule, "cosine") && a->steps > 0; /* --steps 0: evaluate only */
    double min_lr = a->min_lr >= 0 ? a->min_lr : a->lr / 10;
    const int64_t decay_steps = a->decay_steps > 0 ? a->decay_steps : a->steps;
    const int64_t warmup = a->warmup >= 0 ? a->warmup : decay_steps / 20;
    if (cosine && warmup >= decay_steps)
        return fail(r, "--warmup (%lld) must be less than the schedule's length (%lld)",
                    (long long)warmup, (long long)decay_steps);
    nb_sched_opts co = nb_sched_defaults(cosine ? NB_SCHED_COSINE : NB_SCHED_CONSTANT);
    if (cosine) {
        co.warmup_steps = warmup;
        co.total_steps = decay_steps;
        co.min_lr = min_lr;
    }
    if (!(r->sched = nb_sched_new(r->opt, &co))) return fail(r, "%s", nb_last_error());
    return true;
}

/* The settings that change the results travel with the checkpoint (nabla/run.h); the
 * schedule's as the run uses them (a default --decay-steps is --steps). */
static void config_settings(run *r) {
    const args *a = r->a;
    nb_run_config *c = &r->conf;
    const char *shape = "the model's shape is in the checkpoint";
    /* first, so a resume with the other architecture says so (a checkpoint written before
     * --arch has none: a GPT's) */
    nb_run_config_str(c, "arch", nbm_arch_name(a->arch));
    nb_run_config_fixed(c, shape);
    if (a->arch == NBM_LLAMA) {
        nb_run_config_int(c, "n-kv-head", r->arch.llama.n_kv_head);
        nb_run_config_fixed(c, shape);
    }
    nb_run_config_int(c, "n-layer", a->n_layer);
    nb_run_config_fixed(c, shape);
    nb_run_config_int(c, "n-head", a->n_head);
    nb_run_config_fixed(c, shape);
    nb_run_config_int(c, "n-embd", a->n_embd);
    nb_run_config_fixed(c, shape);
    nb_run_config_int(c, "block-size", a->block_size);
    nb_run_config_fixed(c, shape);
    nb_run_config_num(c, "dropout", a->dropout);
    nb_run_config_int(c, "bias", a->bias);
    nb_run_config_fixed(c, shape);
    nb_run_config_int(c, "gelu-tanh", a->gelu_tanh);
    nb_run_config_int(c, "batch", a->batch);
    /* the micro-batches are not a setting: the step's batch is drawn whole, so how it is cut
     * (like the layout) changes the results by float reassociation only */
    nb_run_config_num(c, "lr", a->lr);
    nb_run_config_str(c, "schedule", a->schedule);
    if (!strcmp(a->schedule, "cosine") && a->steps > 0) {
        /* defaults that follow other flags are stored as the rule they follow */
        const int64_t decay_steps = a->decay_steps > 0 ? a->decay_steps : a->steps;
        if (a->warmup >= 0) nb_run_config_int(c, "warmup", a->warmup);
        else nb_run_config_str(c, "warmup", "decay-steps/20");
        nb_run_config_int(c, "decay-steps", decay_steps);
        if (a->min_lr >= 0) nb_run_config_num(c, "min-lr", a->min_lr);
        else nb_run_config_str(c, "min-lr", "lr/10");
    }
    nb_run_config_num(c, "weight-decay", a->weight_decay);
    nb_run_config_num(c, "beta1", a->beta1);
    nb_run_config_num(c, "beta2", a->beta2);
    nb_run_config_num(c, "grad-clip", a->grad_clip);
    nb_run_config_int(c, "seed", (int64_t)a->seed);
    nb_run_config_fixed(c, "the checkpoint's batch and dropout streams continue from it");
}

/* The logs, the gradient reducer over dp (nb_ddp or nb_zero), the checkpoint (resumed when
 * asked) and the progress line. */
static bool setup_run(run *r) {
    const args *a = r->a;
    if (r->main_rank && a->log && !(r->log = nb_jsonl_open("gpt", a->log, a->resume ? "a" : "w")))
        return fail(r, "%s", nb_last_error());
    if (r->main_rank && a->tensorboard && !(r->tb = nb_summary_open(a->tensorboard)))
        return fail(r, "--tensorboard: %s", nb_last_error());
    /* every rank saves and loads the checkpoint together, whatever the layout */
    r->ck = (nb_checkpoint){.model = r->mine, .optim = r->opt, .sched = r->sched,
                            .gens = r->gens, .ngens = 2, .scaler = r->scaler,
                            .comm = r->size > 1 ? r->world : NULL};
    config_settings(r);
    if (!nb_run_config_apply(&r->conf, &r->ck, "gpt", a->override)) return false;
    const char *resume; /* --resume auto: the newest valid checkpoint of --save, if any */
    char auto_path[4400];
    if (!nbm_resume_path("gpt", r->main_rank, a->resume, a->save, auto_path,
                         sizeof auto_path, &resume))
        return false;
    /* The reducer: averages over dp, and sums the sequence-parallel partial gradients over tp
     * (so with --sequence-parallel it runs on one data-parallel rank too). */
    const bool reduce = r->size > 1;
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = (int)a->zero;
    zo.reduce_dtype = a->reduce_dtype;
    if (reduce && a->zero > 0 && !(r->zero = nb_zero_new(r->mine, r->opt, r->dp, &zo)))
        return fail(r, "%s", nb_last_error());
    nb_ddp_opts dopts = nb_ddp_defaults();
    dopts.reduce_dtype = a->reduce_dtype;
    if (reduce && !r->zero && !(r->ddp = nb_ddp_new(r->mine, r->dp, &dopts)))
        return fail(r, "%s", nb_last_error());
    if (resume) { /* any layout's checkpoint: a file, or a folder of parts */
        if (nb_checkpoint_load(resume, &r->ck) != NB_OK)
            return fail(r, "%s%s", nb_last_error(), nb_run_config_hint(nb_last_error()));
        r->first = r->step = r->ck.step;
        /* The checkpoint holds rank 0's dropout stream; each data-parallel rank takes its own
         * again (the position is the step's: train_step) */
        if (nb_generator_set_stream(r->drop_gen, (uint64_t)r->dp_rank) != NB_OK)
            return fail(r, "%s", nb_last_error());
        if (r->main_rank) printf("resumed from %s at step %lld\n", resume, (long long)r->step);
    }
    r->flops = nbm_arch_flops(&r->arch, r->B, r->T); /* B: the whole step's sequences */
    r->tokens_per_step = r->B * r->T;
    nb_progress_opts po = nb_progress_defaults();
    po.total = a->steps;
    po.start = r->step;
    po.unit = "tokens";
    po.enabled = r->main_rank;
    if (!(r->bar = nb_progress_new(&po))) return fail(r, "%s", nb_last_error());
    return true;
}

bool setup(run *r) {
    const args *a = r->a;
    const int64_t N = r->N;
    r->world = nb_comm_world(); /* size 1 without a launcher */
    if (!r->world) return fail(r, "%s", nb_last_error());
    r->rank = nb_comm_rank(r->world), r->size = nb_comm_size(r->world);
    r->main_rank = r->rank == 0;
    nbm_guard_comm(&guard, r->world); /* a dead or hung peer: an error after this long */
    if (!nbm_device_use("gpt", &device)) return false; /* said why */
    /* the mesh: the same error on every rank when the world is not dp x pp x tp */
    const int pp = a->pp > 1 ? (int)a->pp : 1, tp = a->tp > 1 ? (int)a->tp : 1;
    if (!(r->mesh = nb_mesh_new(r->world, "dp pp tp", (int[]){-1, pp, tp})))
        return r->usage = true, fail(r, "--tp %d --pp %d: %s", tp, pp, nb_last_error());
    r->dp = nb_mesh_group(r->mesh, "dp");
    r->dp_rank = nb_mesh_rank(r->mesh, "dp"), r->dp_size = nb_mesh_size(r->mesh, "dp");
    r->init = nb_generator_new(a->seed), r->batch_gen = nb_generator_new(a->seed + 1234);
    r->drop_gen = nb_generator_new(a->seed + 4321), r->val_gen = nb_generator_new(999);
    r->gens[0] = r->batch_gen, r->gens[1] = r->drop_gen;
    r->xs = calloc((size_t)N, sizeof *r->xs), r->ys = calloc((size_t)N, sizeof *r->ys);
    r->xl = calloc((size_t)N, sizeof *r->xl), r->yl = calloc((size_t)N, sizeof *r->yl);
    r->times = calloc((size_t)a->steps + 1, sizeof(double));
    if (!r->init || !r->batch_gen || !r->drop_gen || !r->val_gen || !r->xs || !r->ys ||
        !r->xl || !r->yl || !r->times)
        return fail(r, "out of memory");
    if (r->B % (r->dp_size * N) != 0)
        return r->usage = true,
               fail(r, "--batch %lld is the global batch: it must divide by the %d data-parallel "
                    "ranks x %lld micro-batches", (long long)r->B, r->dp_size, (long long)N);
    /* the ranks of one model (tensor parallel, pipeline stages) share a dropout stream */
    if (nb_generator_set_stream(r->drop_gen, (uint64_t)r->dp_rank) != NB_OK)
        return fail(r, "%s", nb_last_error());
    return setup_data(r) && setup_model(r) && setup_run(r);
}

void teardown(run *r) {
    nbm_save_finish("gpt", false); /* after a failure: the write in flight ends first */
    nb_progress_free(r->bar);
    nb_jsonl_close(r->log); /* after an error: the warning, if any, is all */
    nb_summary_close(r->tb);
    nb_ddp_free(r->ddp); /* before the model it hooks into */
    nb_zero_free(r->zero); /* before the optimizer and the model */
    nb_grad_scaler_free(r->scaler);
    nb_sched_free(r->sched);
    nb_optim_free(r->opt);
    nb_params_deinit(&r->decay);
    nb_params_deinit(&r->no_decay);
    nb_pipeline_free(r->pipe); /* before the model it borrows */
    nb_module_free(r->model);
    nb_mesh_free(r->mesh); /* after the model, whose parts borrow its groups */
    for (int64_t i = 0; r->xs && r->ys && r->xl && r->yl && i < r->N; i++) {
        if (r->xl[i] != r->xs[i]) nb_tensor_free(r->xl[i]);
        if (r->yl[i] != r->ys[i]) nb_tensor_free(r->yl[i]);
        nb_tensor_free(r->xs[i]);
        nb_tensor_free(r->ys[i]);
    }
    free(r->xs);
    free(r->ys);
    free(r->xl);
    free(r->yl);
    free(r->times);
    nb_tensor_free(r->vx);
    nb_tensor_free(r->vy);
    nb_tensor_free(r->xg);
    nb_tensor_free(r->yg);
    nb_tensor_free(r->train);
    nb_tensor_free(r->val);
    nb_tensor_free(r->text);
    nb_generator_free(r->init);
    nb_generator_free(r->batch_gen);
    nb_generator_free(r->drop_gen);
    nb_generator_free(r->val_gen);
    nb_comm_free(r->world);
}
