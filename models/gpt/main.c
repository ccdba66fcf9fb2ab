/* main.c - the `gpt` program: trains the byte-level GPT of nabla/gpt.h on a text file
 * (by default the King James Bible, as the PyTorch peer's W3 workload does) and samples
 * from a trained model. Training: AdamW with weight decay on 2-D weights only, a cosine
 * (or constant) learning-rate schedule with warmup, gradient clipping, gradient
 * accumulation, validation loss on fixed batches, checkpoints and exact resume, progress
 * with tokens/s, JSON-lines logs, and a last line that is one JSON object. docs/gpt.md.
 *
 * Under mpirun (or srun) it trains data parallel with nb_ddp: --batch stays the global
 * batch. Every rank draws the same global batches (one generator, same seed) and trains
 * on its contiguous slice of rows, so N ranks follow the 1-process run up to float
 * reassociation; dropout draws from a per-rank stream. Validation batches are shared out
 * by index and the sums reduced. Only rank 0 prints, logs and writes checkpoints. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <nabla/nabla.h>
#include <nabla/run.h>
#include <nabla/summary.h>

#include "ft.h"
#include "device.h"
#include "guard.h"
#include "pipe.h"
#include "precision.h"

/* --comm-timeout, --on-nonfinite, --max-skips (guard.h), and the skipped steps' count */
static nbm_guard guard;
/* --device (device.h) */
static nbm_device device;

#define KJV_COMMAND "bible gen1:1-rev22:21"

typedef struct args {
    /* model */
    int64_t n_layer, n_head, n_embd, block_size;
    double dropout;
    int64_t bias, gelu_tanh;
    const char *recompute; /* --checkpoint-activations */
    /* training */
    const char *data;
    int64_t steps, decay_steps, batch, warmup, grad_accum, eval_every, eval_batches, save_every;
    int64_t keep, async_save;
    double lr, weight_decay, min_lr, grad_clip, beta1, beta2;
    const char *schedule;
    const char *save, *resume, *log, *override, *tensorboard;
    int64_t threads, zero, tp;
    bool sequence_parallel;
    int64_t pp, microbatches, virtual_stages; /* --pp: pipeline parallel (models/gpt/pipe.c) */
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

static void usage(const args *a, FILE *out) {
    fprintf(out,
            "usage: gpt [flags]                      train (defaults: the W3 recipe, cosine lr)\n"
            "       gpt --sample --load FILE [flags]  generate text\n"
            "model:\n"
            "  --n-layer N --n-head N --n-embd N --block-size N   (default %lld %lld %lld %lld)\n"
            "  --dropout P      dropout probability (default %g)\n"
            "  --bias 0|1       biases in linear layers and layer norms (default %lld)\n"
            "  --gelu-tanh 0|1  tanh-approximated GELU (default %lld: exact)\n"
            "  --checkpoint-activations none|attn|full  recompute in backward instead of\n"
            "                   keeping: each block's attention core, or all but each\n"
            "                   block's input (default none; results are the same)\n"
            "training:\n"
            "  --data FILE      training text, bytes are tokens (default: `" KJV_COMMAND "`)\n"
            "  --steps N        optimizer steps (default %lld)\n"
            "  --batch N        sequences per micro-batch (default %lld)\n"
            "  --grad-accum N   micro-batches per step (default %lld)\n"
            "  --lr X           peak learning rate (default %g)\n"
            "  --schedule S     cosine (linear warmup, cosine decay to --min-lr) or constant\n"
            "                   (default %s; the W3 recipe is constant)\n"
            "  --warmup N       warmup steps of the cosine schedule (default: 5%% of it)\n"
            "  --min-lr X       final lr of the cosine schedule (default lr / 10)\n"
            "  --decay-steps N  length of the cosine schedule (default --steps)\n"
            "  --weight-decay X AdamW weight decay of 2-D weights (default %g)\n"
            "  --beta1 X --beta2 X  AdamW betas (default %g %g)\n"
            "  --grad-clip X    clip the global gradient norm to X (default %g: off)\n"
            "  --eval-every N   validation loss every N steps, and at the end (default %lld)\n"
            "  --eval-batches N fixed validation batches (default %lld)\n"
            "  --save FILE      checkpoint at every evaluation and at the end\n"
            "  --save-every N   checkpoint every N steps instead\n"
            "  --keep N         a file per checkpoint (FILE-<step>, or DIR/checkpoint-<step>.ckpt),\n"
            "                   the newest N kept\n"
            "  --async-save 0|1 1: write checkpoints in the background while training goes on\n"
            "  --resume FILE    continue from a checkpoint written with the same settings\n"
            "                   (auto: the newest intact one of --save, if any)\n"
            "  --override LIST  settings that may differ from the --resume checkpoint's\n"
            "                   (comma-separated flag names without dashes, e.g. lr,grad-clip)\n"
            "  --log FILE       JSON lines: one per step and one per evaluation\n"
            "  --tensorboard DIR  TensorBoard scalars (loss, lr, grad norm, tokens/s, step\n"
            "                   time, validation loss, memory) in an event file in DIR\n"
            "  --threads N      CPU threads (default: all cores)\n"
            "  --precision P    fp32, bf16 or fp16: autocast of the steps and evaluations\n"
            "                   (default fp32; docs/mixed-precision.md)\n"
            "  --zero S         ZeRO stage 0-3: 1 shards the optimizer state over the ranks,\n"
            "                   2 also the gradients, 3 also the parameters (default 0:\n"
            "                   nb_ddp); --save then writes a sharded checkpoint (a\n"
            "                   directory) that --resume reshards. With --tp or --pp: 1 or\n"
            "                   2, over the data-parallel group; checkpoints as without it\n"
            "  --reduce-dtype D fp32, bf16 or fp16: the dtype the gradients travel in between\n"
            "                   the data-parallel ranks (nb_ddp and --zero; summed in f32;\n"
            "                   default fp32; docs/distributed.md, \"Compressed communication\")\n"
            "  --tp N           tensor parallel over N adjacent ranks (the ranks are dp x tp,\n"
            "                   nb_ddp over dp; default 1); --save writes a sharded checkpoint\n"
            "                   (a directory: each rank its slices; DIR/model.safetensors at\n"
            "                   the end), which any layout resumes; with --pp M each\n"
            "                   stage is tensor parallel (mpirun -np dp*N*M)\n"
            "  --sequence-parallel  with --tp: layer norms and dropout on sequence shards\n"
            "  --pp M           pipeline parallel over M stages (mpirun -np dp*M); --batch is\n"
            "                   then the global batch per step (models/gpt/pipe.c, docs/distributed.md)\n"
            "  --microbatches K micro-batches per step with --pp (default 4)\n"
            "  --pp-schedule S  gpipe, 1f1b or interleaved (default 1f1b)\n"
            "  --virtual-stages V  chunks per rank with --pp-schedule interleaved (default 1)\n"
            "  --seed N         initialization, batch order, dropout (default %llu)\n"
            "sampling:\n"
            "  --load FILE      a checkpoint or model .safetensors (--n-head must match)\n"
            "  --prompt TEXT    the start of the text (default a newline)\n"
            "  --tokens N       bytes to generate (default %lld)\n"
            "  --temperature T  0 = greedy (default %g)\n"
            "  --top-k K        sample from the K most likely bytes (default 0: all)\n",
            (long long)a->n_layer, (long long)a->n_head, (long long)a->n_embd,
            (long long)a->block_size, a->dropout, (long long)a->bias, (long long)a->gelu_tanh,
            (long long)a->steps, (long long)a->batch, (long long)a->grad_accum, a->lr,
            a->schedule, a->weight_decay, a->beta1, a->beta2,
            a->grad_clip, (long long)a->eval_every, (long long)a->eval_batches,
            (unsigned long long)a->seed, (long long)a->tokens, a->temperature);
    nbm_guard_usage(out);
    nbm_device_usage(out);
}

/* Where a flag has an effect: in both modes, only when training, only with --sample. */
enum { BOTH, TRAIN, SAMPLE };

/* Returns RUN to go on, or the exit status: 0 after --help (usage on stdout), 2 after a bad
 * command line (the reason on stderr; the usage too for an unknown flag or stray argument). */
#define RUN (-1)
static int parse_args(int argc, char **argv, args *a) {
    /* every flag that takes a value; given[k]: flags[k] was on the command line */
    static const struct {
        const char *name;
        int mode;
    } flags[] = {{"--n-layer", TRAIN},     {"--n-head", BOTH},       {"--n-embd", TRAIN},
                 {"--block-size", TRAIN},  {"--dropout", TRAIN},     {"--bias", TRAIN},
                 {"--gelu-tanh", BOTH},    {"--data", TRAIN},        {"--steps", TRAIN},
                 {"--batch", TRAIN},       {"--grad-accum", TRAIN},  {"--lr", TRAIN},
                 {"--schedule", TRAIN},    {"--warmup", TRAIN},      {"--decay-steps", TRAIN},
                 {"--min-lr", TRAIN},      {"--weight-decay", TRAIN}, {"--beta1", TRAIN},
                 {"--beta2", TRAIN},       {"--grad-clip", TRAIN},   {"--eval-every", TRAIN},
                 {"--eval-batches", TRAIN}, {"--save-every", TRAIN}, {"--save", TRAIN},
                 {"--resume", TRAIN},      {"--log", TRAIN},         {"--threads", BOTH},
                 {"--seed", BOTH},         {"--load", SAMPLE},       {"--prompt", SAMPLE},
                 {"--tokens", SAMPLE},     {"--temperature", SAMPLE}, {"--top-k", SAMPLE},
                 {"--override", TRAIN},    {"--tensorboard", TRAIN}, {"--zero", TRAIN},
                 {"--keep", TRAIN},        {"--async-save", TRAIN},
                 {"--checkpoint-activations", TRAIN}, {"--tp", TRAIN},
                 {"--pp", TRAIN},          {"--microbatches", TRAIN},
                 {"--pp-schedule", TRAIN}, {"--virtual-stages", TRAIN},
                 {"--precision", TRAIN},    {"--reduce-dtype", TRAIN}};
    enum { NF = sizeof flags / sizeof flags[0] };
    bool given[NF] = {0};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            usage(a, stdout);
            return 0;
        }
        if (!strcmp(f, "--sample")) {
            if (a->sample) return nbm_repeated("gpt", f);
            a->sample = true;
            continue;
        }
        if (!strcmp(f, "--sequence-parallel")) {
            if (a->sequence_parallel) return nbm_repeated("gpt", f);
            a->sequence_parallel = true;
            continue;
        }
        if (strncmp(f, "-", 1)) { /* the program takes no file or other operand */
            fprintf(stderr, "gpt: unexpected argument \"%s\" (every input is a flag)\n", f);
            usage(a, stderr);
            return 2;
        }
        /* Known before its value is looked at, so that a last "--bogus" is called unknown. */
        int k = 0;
        while (k < NF && strcmp(f, flags[k].name)) k++;
        if (k == NF) {
            fprintf(stderr, "gpt: unknown flag %s\n", f);
            usage(a, stderr);
            return 2;
        }
        if (given[k]) return nbm_repeated("gpt", f); /* not "the last one wins" */
        given[k] = true;
        if (i + 1 >= argc) {
            fprintf(stderr, "gpt: %s needs a value (see --help)\n", f);
            return 2;
        }
        const char *v = argv[++i];
        int64_t n;
        bool ok = true;
        /* integer flags in [min, max]; number flags from lo to hi, ( or ) excluding the bound */
#define I64(name, field, min, max) \
    else if (!strcmp(f, name)) ok = nb_parse_int("gpt", f, v, min, max, &a->field)
#define F64(name, field, lo, lo_open, hi, hi_open) \
    else if (!strcmp(f, name)) ok = nb_parse_num("gpt", f, v, lo, lo_open, hi, hi_open, &a->field)
#define STR(name, field) else if (!strcmp(f, name)) a->field = v
        /* MAX_STEPS bounds --steps and --tokens, which size a buffer each */
        const int64_t BIG = INT64_MAX, MAX_STEPS = INT64_C(1) << 30;
        if (0) {
        }
        I64("--n-layer", n_layer, 1, BIG); I64("--n-head", n_head, 1, BIG);
        I64("--n-embd", n_embd, 1, BIG); I64("--block-size", block_size, 1, BIG);
        F64("--dropout", dropout, 0, false, 1, true);
        I64("--bias", bias, 0, 1); I64("--gelu-tanh", gelu_tanh, 0, 1);
        STR("--data", data); I64("--steps", steps, 0, MAX_STEPS);
        I64("--batch", batch, 1, NB_MAX_BATCH); I64("--grad-accum", grad_accum, 1, NB_MAX_BATCH);
        F64("--lr", lr, 0, true, NB_MAX_LR, false);
        STR("--schedule", schedule);
        I64("--warmup", warmup, 0, BIG); I64("--decay-steps", decay_steps, 0, BIG);
        F64("--min-lr", min_lr, 0, false, NB_MAX_LR, false);
        F64("--weight-decay", weight_decay, 0, false, NB_MAX_LR, false);
        F64("--beta1", beta1, 0, false, 1, true); F64("--beta2", beta2, 0, false, 1, true);
        F64("--grad-clip", grad_clip, 0, false, INFINITY, false);
        I64("--eval-every", eval_every, 0, BIG); I64("--eval-batches", eval_batches, 1, BIG);
        I64("--save-every", save_every, 0, BIG); I64("--keep", keep, 1, 1000000);
        I64("--async-save", async_save, 0, 1);
        STR("--save", save); STR("--resume", resume); STR("--log", log);
        STR("--override", override); STR("--tensorboard", tensorboard);
        STR("--checkpoint-activations", recompute);
        I64("--threads", threads, 0, NB_MAX_THREADS); I64("--zero", zero, 0, 3);
        I64("--tp", tp, 1, 65536);
        I64("--pp", pp, 1, 4096); I64("--microbatches", microbatches, 1, 4096);
        STR("--pp-schedule", pp_schedule); I64("--virtual-stages", virtual_stages, 1, 4096);
        else if (!strcmp(f, "--precision")) ok = nbm_parse_precision("gpt", v, &a->precision);
        else if (!strcmp(f, "--reduce-dtype"))
            ok = nbm_parse_reduce_dtype("gpt", v, &a->reduce_dtype);
        else if (!strcmp(f, "--seed")) {
            if ((ok = nb_parse_int("gpt", f, v, 0, BIG, &n))) a->seed = (uint64_t)n;
        }
        STR("--load", load); STR("--prompt", prompt); I64("--tokens", tokens, 0, MAX_STEPS);
        F64("--temperature", temperature, 0, false, INFINITY, false);
        I64("--top-k", top_k, 0, 256);
#undef I64
#undef F64
#undef STR
        if (!ok) return 2;
    }
    if (a->async_save && !a->save) {
        fprintf(stderr, "gpt: --async-save needs --save\n");
        return 2;
    }
    if (a->async_save && a->zero > 0 && a->keep) {
        fprintf(stderr, "gpt: --async-save with --zero writes one sharded checkpoint "
                        "directory; --keep does not apply to it yet\n");
        return 2;
    }
    if (strcmp(a->recompute, "none") && strcmp(a->recompute, "attn") &&
        strcmp(a->recompute, "full")) {
        fprintf(stderr, "gpt: --checkpoint-activations must be none, attn or full, got \"%s\"\n",
                a->recompute);
        return 2;
    }
    if (strcmp(a->schedule, "cosine") && strcmp(a->schedule, "constant")) {
        fprintf(stderr, "gpt: --schedule must be cosine or constant, got \"%s\"\n", a->schedule);
        return 2;
    }
    if (a->sequence_parallel && (a->sample || a->tp < 2)) {
        fprintf(stderr, "gpt: --sequence-parallel needs training with --tp 2 or more\n");
        return 2;
    }
    if ((a->tp > 1 || a->pp) && a->zero > 2) {
        fprintf(stderr, "gpt: --%s takes --zero 1 or 2 (the data-parallel group's ZeRO); stage 3 "
                        "does not combine with it yet\n", a->pp ? "pp" : "tp");
        return 2;
    }
    if ((a->tp > 1 || a->pp) && a->zero > 0 && a->precision == NB_F16) {
        fprintf(stderr, "gpt: --%s with --zero does not take --precision fp16 (loss scaling) yet; "
                        "bf16 works\n", a->pp ? "pp" : "tp");
        return 2;
    }
    /* A flag the chosen mode ignores is a mistake (a typo'd mode, a forgotten --sample),
     * not something to drop silently. */
    for (int k = 0; k < NF; k++) {
        if (!given[k] || flags[k].mode == BOTH) continue;
        if (flags[k].mode == SAMPLE && !a->sample) {
            fprintf(stderr, "gpt: %s has no effect without --sample\n", flags[k].name);
            return 2;
        }
        if (flags[k].mode == TRAIN && a->sample) {
            fprintf(stderr, "gpt: %s has no effect with --sample (it is a training flag)\n",
                    flags[k].name);
            return 2;
        }
        bool constant = !strcmp(a->schedule, "constant");
        const char *name = flags[k].name;
        if (constant && (!strcmp(name, "--warmup") || !strcmp(name, "--min-lr") ||
                         !strcmp(name, "--decay-steps"))) {
            fprintf(stderr, "gpt: %s has no effect with --schedule constant\n", name);
            return 2;
        }
        if (!a->save && (!strcmp(name, "--keep") ||
                         (!strcmp(name, "--resume") && !strcmp(a->resume, "auto")))) {
            fprintf(stderr, "gpt: %s needs --save (the checkpoints it works on)\n",
                    !strcmp(name, "--keep") ? "--keep" : "--resume auto");
            return 2;
        }
        if (!a->save && !strcmp(name, "--save-every")) {
            fprintf(stderr, "gpt: --save-every has no effect without --save\n");
            return 2;
        }
        if (!a->resume && !strcmp(name, "--override")) {
            fprintf(stderr, "gpt: --override has no effect without --resume\n");
            return 2;
        }
    }
    if (a->sample && guard.train_flag) {
        fprintf(stderr, "gpt: %s has no effect with --sample (it is a training flag)\n",
                guard.train_flag);
        return 2;
    }
    /* The pipeline's flags go together; what it does not do yet is refused, not ignored. */
    const bool pipe_flags = a->microbatches || a->pp_schedule || a->virtual_stages;
    if (!a->pp && pipe_flags) {
        fprintf(stderr, "gpt: --microbatches, --pp-schedule and --virtual-stages need --pp\n");
        return 2;
    }
    if (a->pp && (a->grad_accum != 1 || a->reduce_dtype != NB_F32)) {
        fprintf(stderr, "gpt: --pp trains with --microbatches instead of --grad-accum, and does "
                "not take --reduce-dtype yet\n");
        return 2;
    }
    if (a->sample && !a->load) {
        fprintf(stderr, "gpt: --sample needs --load FILE\n");
        return 2;
    }
    return RUN;
}

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

/* ---- sampling ------------------------------------------------------------------------------ */
static int run_sample(const args *a) {
    int rc = 1;
    nb_gpt_config cfg = {.n_head = a->n_head, .gelu_tanh = a->gelu_tanh != 0};
    nb_set_num_threads((int)a->threads);
    nb_module *model = NULL;
    nb_generator *gen = nb_generator_new(a->seed);
    const char *prompt = a->prompt ? a->prompt : "\n";
    int64_t np = (int64_t)strlen(prompt), *toks = malloc(sizeof(int64_t) * (size_t)(np + a->tokens + 1));
    if (!toks || !gen || !nbm_device_use("gpt", &device)) goto done;
    if (nb_gpt_config_from_file(a->load, &cfg) != NB_OK || !(model = nb_gpt_new(&cfg, NULL)) ||
        nb_gpt_load(model, a->load) != NB_OK) {
        fprintf(stderr, "gpt: %s\n", nb_last_error());
        goto done;
    }
    if (np == 0) { /* an empty prompt starts from a newline, as nanoGPT's sample.py */
        prompt = "\n";
        np = 1;
    }
    for (int64_t i = 0; i < np; i++) toks[i] = (unsigned char)prompt[i];
    fprintf(stderr, "gpt: %lld layers, %lld heads, width %lld, context %lld, %lld parameters\n",
            (long long)cfg.n_layer, (long long)cfg.n_head, (long long)cfg.n_embd,
            (long long)cfg.block_size, (long long)nb_num_parameters(model));
    nb_gpt_sample_opts so = {.temperature = a->temperature, .top_k = a->top_k, .gen = gen};
    if (nb_gpt_generate(model, toks, np, a->tokens, &so, toks + np) != NB_OK) {
        fprintf(stderr, "gpt: %s\n", nb_last_error());
        goto done;
    }
    for (int64_t i = 0; i < np + a->tokens; i++) putchar((int)toks[i]);
    putchar('\n');
    rc = 0;
done:
    free(toks);
    nb_module_free(model);
    nb_generator_free(gen);
    return rc;
}

/* ---- training ------------------------------------------------------------------------------ */
/* Mean loss over the fixed validation batches (the generator is rewound each time, so
 * every evaluation sees the same batches), in eval mode without gradients. */
static double evaluate(nb_module *m, nb_tensor *val, nb_generator *vgen, int64_t n,
                       nb_tensor *x, nb_tensor *y, nb_comm *world, nb_comm *dp, nb_dtype prec) {
    /* the data-parallel ranks share the batches out; a tensor-parallel group works on each
     * together (its ranks get the same sums) */
    const int rank = nb_comm_rank(dp), size = nb_comm_size(dp);
    const bool tp = nb_gpt_tp_is_gpt_tp(m);
    nb_generator_set_stream(vgen, 0);
    nb_module_train(m, false);
    bool prev = nb_set_grad_enabled(false);
    double sum = 0;
    for (int64_t i = 0; i < n && !isnan(sum); i++) {
        nb_scope_begin(); /* every rank draws every batch (same stream), evaluates its share */
        nb_status st = nb_text_sample(val, vgen, x, y);
        nb_tensor *l = NULL;
        if (st == NB_OK && i % size == rank && nbm_precision_begin(prec) == NB_OK) {
            l = tp ? nb_gpt_tp_loss(m, x, y) : nb_gpt_loss(m, x, y);
            nbm_precision_end(prec);
        }
        if (st != NB_OK || (i % size == rank && !l)) sum = NAN;
        else if (l) sum += nb_item_f64(l);
        nb_scope_end();
    }
    nb_set_grad_enabled(prev);
    nb_module_train(m, true);
    /* Every rank takes part, even one that failed (its NaN spreads), so none waits forever. */
    return nb_mean_over_ranks(world, sum) * (double)size / (double)n;
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
 * 100000 layers used to allocate for minutes). The parameter count is exact arithmetic for
 * this architecture (gpt.h: 12 C^2 + 13 C a layer, V C + T C + 2 C outside; without biases
 * 12 C^2 + 2 C and V C + T C + C), the same number nb_num_parameters gives for the model
 * built on the meta device (tests/test_gpt.c checks it at 1.5B). Training needs 16 bytes a
 * parameter (f32 weights, gradients and AdamW's two moments) plus the activations the
 * backward keeps: about 20 f32 values per layer and token of width C, and the logits, for
 * B_local sequences of T tokens. NB_OK when it fits or the available memory is unknown. */
static nb_status check_fits(const nb_gpt_config *cfg, int64_t B_local, int64_t T) {
    double C = (double)cfg->n_embd, L = (double)cfg->n_layer, V = 256, Tb = (double)T;
    double params = cfg->no_bias ? V * C + Tb * C + C + L * (12 * C * C + 2 * C)
                                 : V * C + Tb * C + 2 * C + L * (12 * C * C + 13 * C);
    double acts = 4.0 * (double)B_local * Tb * (20.0 * C * L + 2.0 * V);
    double need = 16.0 * params + acts, have = available_bytes();
    if (have < 0 || need <= have) return NB_OK;
    char n1[32], n2[32], n3[32];
    human(need, n1, sizeof n1), human(16.0 * params, n2, sizeof n2), human(have, n3, sizeof n3);
    return nb_set_error(NB_ENOMEM, "this configuration needs about %s to train (%.3g "
                        "parameters: %s for weights, gradients and AdamW state, plus "
                        "activations) but the machine has %s available; use a smaller "
                        "--n-layer, --n-embd or --batch", n1, params, n2, n3);
}

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
    nb_tensor *text, *train, *val, **xs, **ys, **xl, **yl;
    nb_gpt_config cfg;
    nb_module *model;
    nb_optim *opt;
    nb_sched *sched;
    nb_params decay, no_decay;
    nb_ddp *ddp;
    nb_zero *zero; /* --zero 1|2|3 instead of ddp */
    nb_grad_scaler *scaler; /* --precision fp16: dynamic loss scaling; NULL otherwise */
    nb_topology *topo; /* --tp > 1; NULL otherwise */
    nb_module *full;   /* --tp resuming a consolidated file: the 1-rank model and optimizer */
    nb_optim *full_opt;
    nb_params fdecay, fno_decay;
    nb_checkpoint_writer *tpw; /* --tp --async-save 1: this rank's writer of its slices */
    nb_comm *dp;       /* the data-parallel group: the world without --tp (borrowed) */
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
    double val_loss, last_losses[10], flops;
} run;

__attribute__((format(printf, 2, 3))) static bool fail(const run *r, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    nb_report("gpt", r->rank, r->size, "%s", msg);
    return false;
}

/* One TensorBoard scalar at the current step; the first failed write warns (the run goes
 * on, and its exit status says the file is incomplete). */
static void tb_scalar(run *r, const char *tag, double v) {
    if (!r->tb || nb_summary_scalar(r->tb, tag, r->step, v) == NB_OK || r->tb_failed) return;
    r->tb_failed = true;
    nb_report("gpt", r->rank, r->size, "warning: %s; the TensorBoard file is incomplete (the "
              "run goes on, and exits with status 1)", nb_last_error());
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
    if (nb_numel(r->val) <= T || nb_numel(r->train) <= T)
        return fail(r, "the text (%lld bytes) is too short for --block-size %lld: its last 10%% "
                    "(the validation part) must be longer than a block",
                    (long long)nb_numel(r->text), (long long)T);
    for (int64_t i = 0; i < r->N; i++) {
        r->xs[i] = nb_empty((int64_t[]){B, T}, 2, NB_I64);
        r->ys[i] = nb_empty((int64_t[]){B, T}, 2, NB_I64);
        if (!r->xs[i] || !r->ys[i]) return fail(r, "%s", nb_last_error());
        int64_t rows = B / r->dp_size, at = r->dp_rank * rows;
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

/* The model, AdamW with nanoGPT's grouping and the learning-rate schedule. */
static bool setup_model(run *r) {
    const args *a = r->a;
    r->cfg = (nb_gpt_config){.block_size = r->T, .n_layer = a->n_layer, .n_head = a->n_head,
                             .n_embd = a->n_embd, .dropout = a->dropout, .no_bias = !a->bias,
                             .gelu_tanh = a->gelu_tanh != 0, .dropout_gen = r->drop_gen,
                             .recompute = !strcmp(a->recompute, "full")   ? NB_GPT_RECOMPUTE_FULL
                                          : !strcmp(a->recompute, "attn") ? NB_GPT_RECOMPUTE_ATTN
                                                                          : NB_GPT_RECOMPUTE_NONE};
    nb_share_threads(r->world, (int)a->threads);
    if (check_fits(&r->cfg, r->B / r->dp_size, r->T) != NB_OK) return fail(r, "%s", nb_last_error());
    nb_gpt_tp_opts to = {.sequence_parallel = a->sequence_parallel};
    r->model = r->topo ? nb_gpt_tp_new(&r->cfg, r->init, nb_topology_tp(r->topo), &to)
                       : nb_gpt_new(&r->cfg, r->init);
    if (!r->model) return fail(r, "%s", nb_last_error());
    if (!(r->opt = make_adamw(a, r->model, &r->decay, &r->no_decay)))
        return fail(r, "%s", nb_last_error());
    /* --tp saves sharded checkpoints (each rank its slices, nabla/gpt_tp.h), which any
     * layout resumes; resuming a consolidated file (written before them, or by 1 process)
     * loads into the 1-rank model and optimizer, then slices */
    if (r->topo && a->resume) {
        nb_generator *g = nb_generator_new(0); /* overwritten: the draws do not matter */
        r->full = g ? nb_gpt_new(&r->cfg, g) : NULL;
        nb_generator_free(g);
        if (!r->full || !(r->full_opt = make_adamw(a, r->full, &r->fdecay, &r->fno_decay)))
            return fail(r, "%s", nb_last_error());
    }
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
    nb_run_config_int(c, "grad-accum", a->grad_accum);
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

/* The logs, the checkpoint (resumed when asked), DDP and the progress line. */
static bool setup_run(run *r) {
    const args *a = r->a;
    if (r->main_rank && a->log && !(r->log = nb_jsonl_open("gpt", a->log, a->resume ? "a" : "w")))
        return fail(r, "%s", nb_last_error());
    if (r->main_rank && a->tensorboard && !(r->tb = nb_summary_open(a->tensorboard)))
        return fail(r, "--tensorboard: %s", nb_last_error());
    r->ck = (nb_checkpoint){.model = r->model, .optim = r->opt, .sched = r->sched,
                            .gens = r->gens, .ngens = 2};
    if (a->precision == NB_F16) { /* fp16 gradients underflow without loss scaling */
        if (!(r->scaler = nb_grad_scaler_new(NULL)) ||
            (r->size > 1 && nb_grad_scaler_set_comm(r->scaler, r->world) != NB_OK))
            return fail(r, "%s", nb_last_error());
        r->ck.scaler = r->scaler; /* its scale and counters resume with the run */
    }
    config_settings(r);
    if (!nb_run_config_apply(&r->conf, &r->ck, "gpt", a->override)) return false;
    const char *resume; /* --resume auto: the newest valid checkpoint of --save, if any */
    char auto_path[4400];
    if (!nbm_resume_path("gpt", r->main_rank, a->resume, a->save, auto_path,
                         sizeof auto_path, &resume))
        return false;
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = (int)r->a->zero;
    zo.reduce_dtype = r->a->reduce_dtype;
    if (r->a->zero > 0 && !(r->zero = nb_zero_new(r->model, r->opt, r->dp, &zo)))
        return fail(r, "%s", nb_last_error());
    nb_ddp_opts dopts = nb_ddp_defaults();
    dopts.reduce_dtype = r->a->reduce_dtype;
    if (!r->zero && r->dp_size > 1 && !(r->ddp = nb_ddp_new(r->model, r->dp, &dopts)))
        return fail(r, "%s", nb_last_error());
    if (resume && nb_gpt_tp_is_checkpoint(resume)) { /* sharded by --tp: any layout reads it */
        /* under --zero the whole optimizer state goes into the template, then the shards */
        if (nb_gpt_tp_checkpoint_load(resume, &r->ck) != NB_OK ||
            (r->zero && nb_zero_scatter_optim_state(r->zero) != NB_OK))
            return fail(r, "%s%s", nb_last_error(), nb_run_config_hint(nb_last_error()));
        r->first = r->step = r->ck.step;
        uint64_t pos = nb_generator_offset(r->drop_gen);
        if (nb_generator_set_stream(r->drop_gen, (uint64_t)r->dp_rank) != NB_OK ||
            nb_generator_set_offset(r->drop_gen, pos) != NB_OK)
            return fail(r, "%s", nb_last_error());
        if (r->main_rank) printf("resumed from %s at step %lld\n", resume, (long long)r->step);
    } else if (resume) { /* every rank loads it; a sharded one (a directory) reshards */
        /* with --tp: into the 1-rank objects (the rest - step, run id - into r->ck as
         * always), then sliced */
        if (r->topo) r->ck.model = r->full, r->ck.optim = r->full_opt;
        nb_status ls = nb_zero_checkpoint_load(r->topo ? NULL : r->zero, resume, &r->ck);
        r->ck.model = r->model, r->ck.optim = r->opt;
        if (ls != NB_OK || (r->topo && nb_gpt_tp_load(r->model, r->opt, resume) != NB_OK) ||
            (r->topo && r->zero && nb_zero_scatter_optim_state(r->zero) != NB_OK))
            return fail(r, "%s%s", nb_last_error(), nb_run_config_hint(nb_last_error()));
        r->first = r->step = r->ck.step;
        /* The file holds rank 0's dropout stream; the ranks draw the same amount per step,
         * so rank r continues its own stream at the same position. */
        uint64_t pos = nb_generator_offset(r->drop_gen);
        if (nb_generator_set_stream(r->drop_gen, (uint64_t)r->dp_rank) != NB_OK ||
            nb_generator_set_offset(r->drop_gen, pos) != NB_OK)
            return fail(r, "%s", nb_last_error());
        if (r->main_rank) printf("resumed from %s at step %lld\n", resume, (long long)r->step);
    }
    r->flops = nb_gpt_train_flops(&r->cfg, r->B * r->N, r->T);
    r->tokens_per_step = r->B * r->T * r->N;
    nb_progress_opts po = nb_progress_defaults();
    po.total = a->steps;
    po.start = r->step;
    po.unit = "tokens";
    po.enabled = r->main_rank;
    if (!(r->bar = nb_progress_new(&po))) return fail(r, "%s", nb_last_error());
    return true;
}

static bool setup(run *r) {
    const args *a = r->a;
    const int64_t N = r->N;
    r->world = nb_comm_world(); /* size 1 without a launcher */
    if (!r->world) return fail(r, "%s", nb_last_error());
    r->rank = nb_comm_rank(r->world), r->size = nb_comm_size(r->world);
    r->main_rank = r->rank == 0;
    nbm_guard_comm(&guard, r->world); /* a dead or hung peer: an error after this long */
    if (!nbm_device_use("gpt", &device)) return false; /* said why */
    r->dp = r->world, r->dp_rank = r->rank, r->dp_size = r->size;
    if (a->tp > 1) { /* the same error on every rank when the world is not dp x tp */
        nb_topology_opts to = nb_topology_defaults();
        to.tp = (int)a->tp;
        if (!(r->topo = nb_topology_new(r->world, &to))) return fail(r, "--tp: %s", nb_last_error());
        r->dp = nb_topology_dp(r->topo);
        r->dp_rank = nb_topology_dp_rank(r->topo), r->dp_size = nb_topology_dp_size(r->topo);
    }
    r->init = nb_generator_new(a->seed), r->batch_gen = nb_generator_new(a->seed + 1234);
    r->drop_gen = nb_generator_new(a->seed + 4321), r->val_gen = nb_generator_new(999);
    r->gens[0] = r->batch_gen, r->gens[1] = r->drop_gen;
    r->xs = calloc((size_t)N, sizeof *r->xs), r->ys = calloc((size_t)N, sizeof *r->ys);
    r->xl = calloc((size_t)N, sizeof *r->xl), r->yl = calloc((size_t)N, sizeof *r->yl);
    r->times = calloc((size_t)a->steps + 1, sizeof(double));
    if (!r->init || !r->batch_gen || !r->drop_gen || !r->val_gen || !r->xs || !r->ys ||
        !r->xl || !r->yl || !r->times)
        return fail(r, "out of memory");
    if (r->B % r->dp_size != 0)
        return fail(r, "--batch %lld is the global batch and must divide by the %d "
                    "data-parallel ranks", (long long)r->B, r->dp_size);
    /* the ranks of a tensor-parallel group share a dropout stream */
    if (nb_generator_set_stream(r->drop_gen, (uint64_t)r->dp_rank) != NB_OK)
        return fail(r, "%s", nb_last_error());
    return setup_data(r) && setup_model(r) && setup_run(r);
}

static void print_header(const run *r) {
    if (!r->main_rank) return;
    printf("gpt: %lld parameters, %lld layers, %lld heads, width %lld, context %lld; "
           "%lld train / %lld val bytes; batch %lld x %lld micro-batches; ",
           (long long)nb_num_parameters(r->model), (long long)r->cfg.n_layer,
           (long long)r->cfg.n_head, (long long)r->cfg.n_embd, (long long)r->T,
           (long long)nb_numel(r->train), (long long)nb_numel(r->val), (long long)r->B,
           (long long)r->N);
    if (r->topo)
        printf("%d ranks as %s%s (%lld sequences per replica) x %d threads; ", r->size,
               nb_topology_describe(r->topo), r->a->sequence_parallel ? " sequence parallel" : "",
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

/* What one step measured, for the logs. */
typedef struct step_result {
    double loss, lr, grad_norm, seconds, comm_ms;
} step_result;

/* One optimizer step: draw the micro-batches, forward, backward (averaged over the ranks),
 * clip, update, advance the schedule. The loss is the mean over the ranks. */
static bool train_step(run *r, step_result *o) {
    double t0 = nb_time_s();
    nb_alloc_stats sa;
    nb_alloc_get_stats(&sa);
    for (int64_t i = 0; i < r->N; i++)
        if (nb_text_sample(r->train, r->batch_gen, r->xs[i], r->ys[i]) != NB_OK)
            return fail(r, "%s", nb_last_error());
    o->lr = nb_optim_get_lr(r->opt, 0);
    nb_clear_error(); /* a NaN below is an error only when one is set */
    nb_tp_comm_stats_reset();
    if (nbm_precision_begin(r->a->precision) != NB_OK) return fail(r, "%s", nb_last_error());
    double loss = r->topo ? nb_gpt_tp_train_step_ex(r->model, r->opt, r->xl, r->yl, (int)r->N,
                                                    &(nb_gpt_tp_step_opts){.ddp = r->ddp,
                                                                           .zero = r->zero,
                                                                           .scaler = r->scaler,
                                                                           .grad_clip = r->a->grad_clip},
                                                    &o->grad_norm)
                : nb_gpt_train_step_ex(r->model, r->opt, r->xl, r->yl, (int)r->N,
                                       &(nb_gpt_step_opts){.ddp = r->ddp, .zero = r->zero,
                                                           .scaler = r->scaler,
                                                           .grad_clip = r->a->grad_clip},
                                       &o->grad_norm);
    nbm_precision_end(r->a->precision);
    /* fp16: an overflowed gradient is the loss scaler's to handle (step skipped, scale
     * halved), not a diverged run */
    if (r->scaler && !isfinite(o->grad_norm) && nb_grad_scaler_skipped(r->scaler))
        o->grad_norm = 0;
    if (isnan(loss) && nb_last_status() != NB_OK)
        return fail(r, "step %lld: %s", (long long)r->step + 1, nb_last_error());
    o->comm_ms = r->zero  ? nb_zero_exposed_comm_s(r->zero) * 1e3
                 : r->ddp ? nb_ddp_exposed_comm_s(r->ddp) * 1e3
                          : 0;
    nb_tp_comm_stats cs; /* tensor parallel: blocking collectives, all exposed */
    nb_tp_comm_stats_get(&cs);
    o->comm_ms += cs.seconds * 1e3;
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
    if (guard.skip) nb_jsonl_int(r->log, "skipped_steps", guard.skipped); /* so far */
    nb_jsonl_end(r->log);
    tb_scalar(r, "train/loss", o->loss);
    tb_scalar(r, "train/lr", o->lr);
    tb_scalar(r, "train/grad_norm", o->grad_norm);
    tb_scalar(r, "train/tokens_per_s", nb_progress_recent_rate(r->bar));
    tb_scalar(r, "train/step_ms", o->seconds * 1e3);
    if (r->ddp || r->zero || r->topo) tb_scalar(r, "train/exposed_comm_ms", o->comm_ms);
    char comm[80] = "";
    if (r->ddp || r->zero || r->topo) snprintf(comm, sizeof comm, "  comm %.1f ms", o->comm_ms);
    if (guard.skipped)
        snprintf(comm + strlen(comm), sizeof comm - strlen(comm), "  skipped %lld",
                 (long long)guard.skipped);
    if (r->step - r->first == 1 && r->main_rank) { /* the state exists after the first step */
        double mib[4];
        nbm_model_state_mib(r->zero, r->opt, r->model, mib);
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
    r->val_loss = evaluate(r->model, r->val, r->val_gen, r->a->eval_batches, r->xs[0],
                           r->ys[0], r->world, r->dp, r->a->precision);
    if (isnan(r->val_loss)) return fail(r, "evaluation: %s", nb_last_error());
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

/* --tp: the sharded checkpoint of this step (collective); with --async-save 1 written in the
 * background, its index at the next save or at tp_save_end (at once after a stop signal). */
static nb_status tp_save(run *r, const nb_checkpoint *ck) {
    const args *a = r->a;
    const int keep = a->keep <= 0 ? 0 : a->keep > 1000000 ? 1000000 : (int)a->keep;
    /* --zero: the files of a DDP run (the whole optimizer state gathered for the save) */
    nb_status st = r->zero ? nb_zero_gather_optim_state(r->zero) : NB_OK;
    if (st == NB_OK && !a->async_save) st = nb_gpt_tp_save_sharded(ck, r->dp, a->save, keep);
    if (st == NB_OK && a->async_save && !r->tpw && !(r->tpw = nb_checkpoint_writer_new(NULL)))
        st = nb_last_status();
    if (st == NB_OK && a->async_save) st = nb_gpt_tp_save_async(ck, r->dp, r->tpw, a->save, keep);
    if (st == NB_OK && a->async_save && r->stop) st = nb_gpt_tp_save_wait(r->model, r->dp, r->tpw);
    nb_status zs = r->zero ? nb_zero_scatter_optim_state(r->zero) : NB_OK; /* back to shards */
    return st != NB_OK ? st : zs;
}

/* --tp --save at the end: with --async-save 1 the last save's index once every rank's file
 * is durable; then rank 0 consolidates that checkpoint into DIR/model.safetensors (the
 * nanoGPT-named model gpt --sample --load reads). */
static bool tp_save_end(run *r) {
    const args *a = r->a;
    if (!r->topo || !a->save) return true;
    nb_status st = r->tpw ? nb_gpt_tp_save_wait(r->model, r->dp, r->tpw) : NB_OK;
    nb_status fs = nb_checkpoint_writer_free(r->tpw);
    r->tpw = NULL;
    if (st == NB_OK) st = fs;
    char dir[4400], model[4500];
    if (st == NB_OK && a->keep > 0) st = nb_checkpoint_path(a->save, r->step, dir, sizeof dir);
    else snprintf(dir, sizeof dir, "%s", a->save);
    snprintf(model, sizeof model, "%s/model.safetensors", dir);
    if (st == NB_OK && r->main_rank && nb_gpt_tp_is_checkpoint(dir))
        st = nb_gpt_tp_consolidate_dir(dir, model, NULL);
    if (st == NB_OK) return true;
    return fail(r, "--save %s: %s", a->save, nb_last_error());
}

/* The training loop: steps, evaluations every --eval-every and at the end, checkpoints. */
static bool train_loop(run *r) {
    const args *a = r->a;
    print_header(r);
    while (r->step < a->steps) {
        step_result o;
        if (!train_step(r, &o)) return false;
        log_step(r, &o);
        bool eval_now = r->step == a->steps || (a->eval_every > 0 && r->step % a->eval_every == 0);
        if (eval_now && !evaluate_and_log(r, o.loss)) return false;
        /* with --tp every rank takes part: each writes its slices (dp rank 0) */
        bool save_now = (r->main_rank || r->zero || r->topo) && a->save &&
                        (r->step == a->steps ||
                         (a->save_every > 0 ? r->step % a->save_every == 0 : eval_now));
        if (save_now || (r->stop && (r->main_rank || r->zero || r->topo) && a->save)) { /* a
                                                                     signal: save this step */
            r->ck.step = r->step;
            nb_checkpoint ck = r->ck;
            nb_status ss = r->topo ? tp_save(r, &ck) : NB_OK;
            if (ss == NB_OK && !r->topo && (r->main_rank || r->zero))
                ss = r->zero ? nbm_save_sharded(r->zero, a->save, a->keep, &ck)
                             : nbm_save(a->save, a->keep, &ck);
            if (ss != NB_OK) return fail(r, "%s", nb_last_error());
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
static void print_result(const run *r, double wall_s) {
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
    nb_jsonl_str(out, "model", "gpt");
    nb_jsonl_num(out, "val_loss", r->val_loss, 4);
    nb_jsonl_num(out, "train_loss", train_loss, 4);
    nb_jsonl_num(out, "tokens_per_s", ran > skip ? (double)r->tokens_per_step / median : 0.0, 1);
    nb_jsonl_num(out, "wall_s", wall_s, 2);
    nb_jsonl_int(out, "steps", r->step);
    nb_jsonl_int(out, "params", nb_num_parameters(r->model));
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
    nbm_model_state_mib(r->zero, r->opt, r->model, state_mib);
    nb_jsonl_int(out, "zero", r->a->zero);
    nb_jsonl_str(out, "reduce_dtype", nbm_precision_name(r->a->reduce_dtype));
    nb_jsonl_int(out, "grad_comm_bytes", r->zero ? nb_zero_comm_bytes(r->zero)
                                                 : nb_ddp_comm_bytes(r->ddp));
    nb_jsonl_int(out, "dp", r->dp_size);
    nb_jsonl_int(out, "tp", r->topo ? nb_topology_tp_size(r->topo) : 1);
    nb_jsonl_int(out, "sequence_parallel", r->a->sequence_parallel);
    nb_jsonl_num(out, "model_state_mib", state_mib[0], 2);
    if (guard.skip) nb_jsonl_int(out, "skipped_steps", guard.skipped);
    nbm_stop_fields(out, r->stop);
    nb_jsonl_end(out);
    nb_jsonl_close(out); /* a failed write shows in nb_stdout_ok */
}

/* Close the logs: false when one of them lost lines (after saying so). */
static bool close_logs(run *r) {
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

static void teardown(run *r) {
    nbm_save_end("gpt", NULL); /* after a failure: the write in flight ends first */
    nb_checkpoint_writer_free(r->tpw); /* the same (that save gets no index) */
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
    nb_module_free(r->model);
    nb_optim_free(r->full_opt);
    nb_params_deinit(&r->fdecay);
    nb_params_deinit(&r->fno_decay);
    nb_module_free(r->full);
    nb_topology_free(r->topo); /* after the model, which borrows its tp group */
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
    nb_tensor_free(r->train);
    nb_tensor_free(r->val);
    nb_tensor_free(r->text);
    nb_generator_free(r->init);
    nb_generator_free(r->batch_gen);
    nb_generator_free(r->drop_gen);
    nb_generator_free(r->val_gen);
    nb_comm_free(r->world);
}

/* --pp: the pipeline driver (models/gpt/pipe.c) with this program's flags. */
static int run_pipe(const args *a) {
    gpt_pipe_args p = {
        .cfg = {.block_size = a->block_size, .n_layer = a->n_layer, .n_head = a->n_head,
                .n_embd = a->n_embd, .dropout = a->dropout, .no_bias = !a->bias,
                .gelu_tanh = a->gelu_tanh != 0,
                .recompute = !strcmp(a->recompute, "full")   ? NB_GPT_RECOMPUTE_FULL
                             : !strcmp(a->recompute, "attn") ? NB_GPT_RECOMPUTE_ATTN
                                                             : NB_GPT_RECOMPUTE_NONE},
        .steps = a->steps, .batch = a->batch, .pp = a->pp, .tp = a->tp,
        .sequence_parallel = a->sequence_parallel,
        .microbatches = a->microbatches ? a->microbatches : 4,
        .virtual_stages = a->virtual_stages ? a->virtual_stages : 1,
        .pp_schedule = a->pp_schedule ? a->pp_schedule : "1f1b", .lr = a->lr,
        .weight_decay = a->weight_decay, .grad_clip = a->grad_clip, .beta1 = a->beta1,
        .beta2 = a->beta2, .schedule = a->schedule, .warmup = a->warmup,
        .decay_steps = a->decay_steps, .min_lr = a->min_lr, .save = a->save,
        .resume = a->resume, .save_every = a->save_every, .keep = a->keep,
        .async_save = a->async_save, .seed = a->seed, .threads = a->threads, .zero = a->zero,
        .eval_every = a->eval_every, .eval_batches = a->eval_batches, .log = a->log,
        .tensorboard = a->tensorboard, .precision = a->precision, .recompute = a->recompute,
        .guard = &guard};
    nb_tensor *text = a->data ? nb_read_bytes(a->data) : read_kjv();
    int rc = gpt_pipe_train(&p, text);
    nb_tensor_free(text);
    return rc;
}

static int run_train(const args *a) {
    if (a->pp) return run_pipe(a);
    const double t_start = nb_time_s();
    /* First, before MPI, the loader and the thread pools start threads: the stop signals are
     * then blocked in all of them and taken by nabla's signal thread (nabla/stop.h). A stop
     * acts at step boundaries. */
    nbm_stop_begin("gpt");
    run r = {.a = a, .size = 1, .B = a->batch, .T = a->block_size, .N = a->grad_accum,
             .val_loss = NAN, .val_step = -1, .steady_allocs = -1};
    int rc = 1;
    nbm_save_async(a->async_save != 0);
    if (setup(&r) && train_loop(&r) && tp_save_end(&r) && nbm_save_end("gpt", r.zero)) {
        print_result(&r, nb_time_s() - t_start);
        /* The run itself succeeded; a lost log or final line still makes the exit non-zero,
         * so that a script never takes an incomplete record for a complete one. */
        rc = close_logs(&r) ? nbm_stop_status(r.stop) : 1;
        if (r.main_rank && !nb_stdout_ok("gpt")) rc = 1;
    }
    teardown(&r);
    return rc;
}

int main(int argc, char **argv) {
    args a = {.n_layer = 4, .n_head = 4, .n_embd = 256, .block_size = 128, .bias = 1,
              .steps = 200, .batch = 16, .warmup = -1, .grad_accum = 1, .eval_every = 100,
              .eval_batches = 20, .lr = 3e-4, .weight_decay = 0.1, .min_lr = -1, .beta1 = 0.9,
              .beta2 = 0.999, .schedule = "cosine", .recompute = "none", .tokens = 500,
              .temperature = 0.8};
    if (!nbm_guard_args("gpt", &argc, argv, &guard)) return 2;
    if (!nbm_device_args("gpt", &argc, argv, &device)) return 2;
    int rc = parse_args(argc, argv, &a);
    if (rc != RUN) return rc;
    return a.sample ? run_sample(&a) : run_train(&a);
}
