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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <nabla/gpt.h>
#include "prog.h"

#define KJV_COMMAND "bible gen1:1-rev22:21"

typedef struct args {
    /* model */
    int64_t n_layer, n_head, n_embd, block_size;
    double dropout;
    int64_t bias, gelu_tanh;
    /* training */
    const char *data;
    int64_t steps, decay_steps, batch, warmup, grad_accum, eval_every, eval_batches, save_every;
    double lr, weight_decay, min_lr, grad_clip, beta1, beta2;
    const char *schedule;
    const char *save, *resume, *log, *override;
    int64_t threads, zero;
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
            "  --resume FILE    continue from a checkpoint written with the same settings\n"
            "  --override LIST  settings that may differ from the --resume checkpoint's\n"
            "                   (comma-separated flag names without dashes, e.g. lr,grad-clip)\n"
            "  --log FILE       JSON lines: one per step and one per evaluation\n"
            "  --threads N      CPU threads (default: all cores)\n"
            "  --zero S         ZeRO stage 0-2: 1 shards the optimizer state over the ranks,\n"
            "                   2 also the gradients (default 0: nb_ddp); --save then writes\n"
            "                   a sharded checkpoint (a directory) that --resume reshards\n"
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
                 {"--override", TRAIN},    {"--zero", TRAIN}};
    enum { NF = sizeof flags / sizeof flags[0] };
    bool given[NF] = {0};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            usage(a, stdout);
            return 0;
        }
        if (!strcmp(f, "--sample")) {
            a->sample = true;
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
    else if (!strcmp(f, name)) ok = nbm_parse_int("gpt", f, v, min, max, &a->field)
#define F64(name, field, lo, lo_open, hi, hi_open) \
    else if (!strcmp(f, name)) ok = nbm_parse_num("gpt", f, v, lo, lo_open, hi, hi_open, &a->field)
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
        I64("--batch", batch, 1, NBM_MAX_BATCH); I64("--grad-accum", grad_accum, 1, NBM_MAX_BATCH);
        F64("--lr", lr, 0, true, NBM_MAX_LR, false);
        STR("--schedule", schedule);
        I64("--warmup", warmup, 0, BIG); I64("--decay-steps", decay_steps, 0, BIG);
        F64("--min-lr", min_lr, 0, false, NBM_MAX_LR, false);
        F64("--weight-decay", weight_decay, 0, false, NBM_MAX_LR, false);
        F64("--beta1", beta1, 0, false, 1, true); F64("--beta2", beta2, 0, false, 1, true);
        F64("--grad-clip", grad_clip, 0, false, INFINITY, false);
        I64("--eval-every", eval_every, 0, BIG); I64("--eval-batches", eval_batches, 1, BIG);
        I64("--save-every", save_every, 0, BIG);
        STR("--save", save); STR("--resume", resume); STR("--log", log);
        STR("--override", override);
        I64("--threads", threads, 0, NBM_MAX_THREADS); I64("--zero", zero, 0, 3);
        else if (!strcmp(f, "--seed")) {
            if ((ok = nbm_parse_int("gpt", f, v, 0, BIG, &n))) a->seed = (uint64_t)n;
        }
        STR("--load", load); STR("--prompt", prompt); I64("--tokens", tokens, 0, MAX_STEPS);
        F64("--temperature", temperature, 0, false, INFINITY, false);
        I64("--top-k", top_k, 0, 256);
#undef I64
#undef F64
#undef STR
        if (!ok) return 2;
    }
    if (strcmp(a->schedule, "cosine") && strcmp(a->schedule, "constant")) {
        fprintf(stderr, "gpt: --schedule must be cosine or constant, got \"%s\"\n", a->schedule);
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
        if (!a->save && !strcmp(name, "--save-every")) {
            fprintf(stderr, "gpt: --save-every has no effect without --save\n");
            return 2;
        }
        if (!a->resume && !strcmp(name, "--override")) {
            fprintf(stderr, "gpt: --override has no effect without --resume\n");
            return 2;
        }
    }
    if (a->sample && !a->load) {
        fprintf(stderr, "gpt: --sample needs --load FILE\n");
        return 2;
    }
    return RUN;
}

/* Model state resident on this rank in MiB: total, parameters, gradients, optimizer state
 * (with AdamW, 16 bytes per parameter without ZeRO; nb_zero_memory with it). */
static void model_state_mib(const nb_zero *zero, nb_module *model, double mib[4]) {
    nb_zero_memory_info mi = {0};
    if (!zero || nb_zero_memory(zero, &mi) != NB_OK)
        nb_zero_memory_plan(nb_num_parameters(model), 4, 2, 1, 0, 0, &mi);
    const double M = 1048576.0;
    mib[0] = (double)(mi.params + mi.grads + mi.optim_state) / M;
    mib[1] = (double)mi.params / M, mib[2] = (double)mi.grads / M;
    mib[3] = (double)mi.optim_state / M;
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
    if (!toks || !gen) goto done;
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
                       nb_tensor *x, nb_tensor *y, nb_comm *world) {
    const int rank = nb_comm_rank(world), size = nb_comm_size(world);
    nb_generator_set_stream(vgen, 0);
    nb_module_train(m, false);
    bool prev = nb_set_grad_enabled(false);
    double sum = 0;
    for (int64_t i = 0; i < n && !isnan(sum); i++) {
        nb_scope_begin(); /* every rank draws every batch (same stream), evaluates its share */
        nb_status st = nb_text_sample(val, vgen, x, y);
        nb_tensor *l = st == NB_OK && i % size == rank ? nb_gpt_loss(m, x, y) : NULL;
        if (st != NB_OK || (i % size == rank && !l)) sum = NAN;
        else if (l) sum += nb_item_f64(l);
        nb_scope_end();
    }
    nb_set_grad_enabled(prev);
    nb_module_train(m, true);
    /* Every rank takes part, even one that failed (its NaN spreads), so none waits forever. */
    return nbm_mean_over_ranks(world, sum) * (double)size / (double)n;
}

#define FAIL(...)                                                                            \
    do {                                                                                     \
        nbm_report("gpt", rank, size, __VA_ARGS__);                                          \
        goto done;                                                                           \
    } while (0)

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

static int run_train(const args *a) {
    int rc = 1;
    const double t_start = nbm_now_s();
    const int64_t B = a->batch, T = a->block_size, N = a->grad_accum;
    nb_comm *world = nb_comm_world(); /* size 1 without a launcher */
    const int rank = world ? nb_comm_rank(world) : 0, size = world ? nb_comm_size(world) : 1;
    const bool main_rank = rank == 0; /* prints, logs and saves */
    nb_ddp *ddp = NULL;
    nb_zero *zero = NULL;
    nb_generator *init = nb_generator_new(a->seed), *batch_gen = nb_generator_new(a->seed + 1234),
                 *drop_gen = nb_generator_new(a->seed + 4321), *val_gen = nb_generator_new(999);
    /* xs, ys: the global micro-batches (B, T); xl, yl: this rank's rows of them */
    nb_tensor *text = NULL, *train = NULL, *val = NULL, **xs = calloc((size_t)N, sizeof *xs),
              **ys = calloc((size_t)N, sizeof *ys), **xl = calloc((size_t)N, sizeof *xl),
              **yl = calloc((size_t)N, sizeof *yl);
    nb_module *model = NULL;
    nb_optim *opt = NULL;
    nb_sched *sched = NULL;
    nb_params decay = {0}, no_decay = {0};
    double *times = calloc((size_t)a->steps + 1, sizeof(double));
    nbm_log log = {0}; /* --log: reports its own write errors */
    if (!world) FAIL("%s", nb_last_error());
    if (!init || !batch_gen || !drop_gen || !val_gen || !xs || !ys || !xl || !yl || !times)
        FAIL("out of memory");
    if (B % size != 0)
        FAIL("--batch %lld is the global batch and must divide by the %d ranks", (long long)B,
             size);
    if (nb_generator_set_stream(drop_gen, (uint64_t)rank) != NB_OK) FAIL("%s", nb_last_error());

    text = a->data ? nb_read_bytes(a->data) : read_kjv();
    if (!text) {
        if (a->data) FAIL("%s", nb_last_error());
        FAIL("could not run `%s` (install the Debian package bible-kjv, or pass --data FILE)",
             KJV_COMMAND);
    }
    if (nb_text_split(text, 0.9, &train, &val) != NB_OK) FAIL("%s", nb_last_error());
    if (nb_numel(val) <= T || nb_numel(train) <= T)
        FAIL("the text (%lld bytes) is too short for --block-size %lld: its last 10%% (the "
             "validation part) must be longer than a block", (long long)nb_numel(text),
             (long long)T);
    for (int64_t i = 0; i < N; i++) {
        xs[i] = nb_empty((int64_t[]){B, T}, 2, NB_I64);
        ys[i] = nb_empty((int64_t[]){B, T}, 2, NB_I64);
        if (!xs[i] || !ys[i]) FAIL("%s", nb_last_error());
        xl[i] = size > 1 ? nb_narrow(xs[i], 0, rank * (B / size), B / size) : xs[i];
        yl[i] = size > 1 ? nb_narrow(ys[i], 0, rank * (B / size), B / size) : ys[i];
        if (!xl[i] || !yl[i]) FAIL("%s", nb_last_error());
    }

    nb_gpt_config cfg = {.block_size = T, .n_layer = a->n_layer, .n_head = a->n_head,
                      .n_embd = a->n_embd, .dropout = a->dropout, .no_bias = !a->bias,
                      .gelu_tanh = a->gelu_tanh != 0, .dropout_gen = drop_gen};
    nbm_set_threads(world, (int)a->threads);
    if (check_fits(&cfg, B / size, T) != NB_OK) FAIL("%s", nb_last_error());
    if (!(model = nb_gpt_new(&cfg, init))) FAIL("%s", nb_last_error());
    /* nanoGPT's grouping: weight decay on matmul and embedding weights, none on biases
     * and layer norms. */
    if (nb_params_split_decay(nb_parameters(model), &decay, &no_decay) != NB_OK)
        FAIL("%s", nb_last_error());
    nb_adamw_opts ao = nb_adamw_defaults();
    ao.lr = a->lr;
    ao.betas[0] = a->beta1;
    ao.betas[1] = a->beta2;
    ao.weight_decay = a->weight_decay;
    opt = nb_adamw_new(&decay, &ao);
    nb_group_opts no_wd = nb_group_defaults();
    no_wd.weight_decay = 0;
    if (!opt || nb_optim_add_group(opt, &no_decay, &no_wd) < 0) FAIL("%s", nb_last_error());
    bool cosine = !strcmp(a->schedule, "cosine") && a->steps > 0; /* --steps 0: evaluate only */
    double min_lr = a->min_lr >= 0 ? a->min_lr : a->lr / 10;
    const int64_t decay_steps = a->decay_steps > 0 ? a->decay_steps : a->steps;
    const int64_t warmup = a->warmup >= 0 ? a->warmup : decay_steps / 20;
    if (cosine && warmup >= decay_steps)
        FAIL("--warmup (%lld) must be less than the schedule's length (%lld)",
             (long long)warmup, (long long)decay_steps);
    nb_sched_opts co = nb_sched_defaults(cosine ? NB_SCHED_COSINE : NB_SCHED_CONSTANT);
    if (cosine) {
        co.warmup_steps = warmup;
        co.total_steps = decay_steps;
        co.min_lr = min_lr;
    }
    sched = nb_sched_new(opt, &co);
    if (!sched) FAIL("%s", nb_last_error());
    if (main_rank && a->log && !nbm_log_open(&log, "gpt", a->log, a->resume ? "a" : "w"))
        FAIL("cannot open --log %s: %s", a->log, strerror(errno));

    nb_checkpoint ck = {.model = model, .optim = opt, .sched = sched,
                        .gens = (nb_generator *[]){batch_gen, drop_gen}, .ngens = 2};
    /* The settings that change the results travel with the checkpoint (prog.h); the
     * schedule's as the run uses them (a default --decay-steps is --steps). */
    nbm_config conf = {0};
    nbm_config_int(&conf, "n-layer", a->n_layer);
    nbm_config_fixed(&conf, "the model's shape is in the checkpoint");
    nbm_config_int(&conf, "n-head", a->n_head);
    nbm_config_fixed(&conf, "the model's shape is in the checkpoint");
    nbm_config_int(&conf, "n-embd", a->n_embd);
    nbm_config_fixed(&conf, "the model's shape is in the checkpoint");
    nbm_config_int(&conf, "block-size", a->block_size);
    nbm_config_fixed(&conf, "the model's shape is in the checkpoint");
    nbm_config_num(&conf, "dropout", a->dropout);
    nbm_config_int(&conf, "bias", a->bias);
    nbm_config_fixed(&conf, "the model's shape is in the checkpoint");
    nbm_config_int(&conf, "gelu-tanh", a->gelu_tanh);
    nbm_config_int(&conf, "batch", a->batch);
    nbm_config_int(&conf, "grad-accum", a->grad_accum);
    nbm_config_num(&conf, "lr", a->lr);
    nbm_config_str(&conf, "schedule", a->schedule);
    if (cosine) { /* defaults that follow other flags are stored as the rule they follow */
        if (a->warmup >= 0) nbm_config_int(&conf, "warmup", warmup);
        else nbm_config_str(&conf, "warmup", "decay-steps/20");
        nbm_config_int(&conf, "decay-steps", decay_steps);
        if (a->min_lr >= 0) nbm_config_num(&conf, "min-lr", min_lr);
        else nbm_config_str(&conf, "min-lr", "lr/10");
    }
    nbm_config_num(&conf, "weight-decay", a->weight_decay);
    nbm_config_num(&conf, "beta1", a->beta1);
    nbm_config_num(&conf, "beta2", a->beta2);
    nbm_config_num(&conf, "grad-clip", a->grad_clip);
    nbm_config_int(&conf, "seed", (int64_t)a->seed);
    nbm_config_fixed(&conf, "the checkpoint's batch and dropout streams continue from it");
    if (!nbm_config_apply(&conf, &ck, "gpt", a->override)) goto done;
    int64_t step = 0, first = 0;
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = (int)a->zero;
    if (a->zero > 0 && !(zero = nb_zero_new(model, opt, world, &zo))) FAIL("%s", nb_last_error());
    if (!zero && size > 1 && !(ddp = nb_ddp_new(model, world, NULL))) FAIL("%s", nb_last_error());
    if (a->resume) { /* every rank loads it; a sharded one (a directory) reshards */
        if (nb_zero_checkpoint_load(zero, a->resume, &ck) != NB_OK)
            FAIL("%s%s", nb_last_error(), nbm_config_hint(nb_last_error()));
        first = step = ck.step;
        /* The file holds rank 0's dropout stream; the ranks draw the same amount per step,
         * so rank r continues its own stream at the same position. */
        uint64_t pos = nb_generator_offset(drop_gen);
        if (nb_generator_set_stream(drop_gen, (uint64_t)rank) != NB_OK ||
            nb_generator_set_offset(drop_gen, pos) != NB_OK)
            FAIL("%s", nb_last_error());
        if (main_rank) printf("resumed from %s at step %lld\n", a->resume, (long long)step);
    }
    const double flops = nb_gpt_train_flops(&cfg, B * N, T);
    const int64_t tokens_per_step = B * T * N;
    const bool tty = isatty(STDOUT_FILENO);
    if (main_rank) {
        printf("gpt: %lld parameters, %lld layers, %lld heads, width %lld, context %lld; "
               "%lld train / %lld val bytes; batch %lld x %lld micro-batches; ",
               (long long)nb_num_parameters(model), (long long)cfg.n_layer,
               (long long)cfg.n_head, (long long)cfg.n_embd, (long long)T,
               (long long)nb_numel(train), (long long)nb_numel(val), (long long)B, (long long)N);
        if (size > 1)
            printf("%d ranks (%lld sequences each) x %d threads, %d gradient buckets",
                   size, (long long)(B / size), nb_get_num_threads(),
                   zero ? nb_zero_num_buckets(zero) : nb_ddp_num_buckets(ddp));
        else
            printf("%d threads", nb_get_num_threads());
        printf(", gemm %s\n", nb_gemm_provider_name(nb_gemm_provider_current()));
        fflush(stdout);
    }

    double val_loss = NAN, last_losses[10], train_time = 0, last_print = 0;
    int64_t n_last = 0, val_step = -1, steady_allocs = -1;
    nb_alloc_stats se; /* at the end of a step */
    const int64_t print_every = a->steps >= 20 ? a->steps / 20 : 1;
    while (step < a->steps) {
        double t0 = nbm_now_s(), norm;
        nb_alloc_stats sa;
        nb_alloc_get_stats(&sa);
        for (int64_t i = 0; i < N; i++)
            if (nb_text_sample(train, batch_gen, xs[i], ys[i]) != NB_OK) FAIL("%s", nb_last_error());
        double lr = nb_optim_get_lr(opt, 0);
        nb_clear_error(); /* a NaN below is an error only when one is set */
        double loss = zero ? nb_gpt_train_step_zero(model, opt, zero, xl, yl, (int)N,
                                                    a->grad_clip, &norm)
                           : nb_gpt_train_step(model, opt, ddp, xl, yl, (int)N, a->grad_clip, &norm);
        if (isnan(loss) && nb_last_status() != NB_OK)
            FAIL("step %lld: %s", (long long)step + 1, nb_last_error());
        const double comm_ms = zero ? nb_zero_exposed_comm_s(zero) * 1e3
                             : ddp ? nb_ddp_exposed_comm_s(ddp) * 1e3 : 0;
        if (size > 1 && isnan(loss = nbm_mean_over_ranks(world, loss)) &&
            nb_last_status() != NB_OK)
            FAIL("step %lld: %s", (long long)step + 1, nb_last_error());
        /* A NaN or infinite loss never recovers (the weights are NaN from here): stop,
         * naming the step. With several ranks it is the mean, so all stop at this step. */
        if (!isfinite(loss))
            FAIL("step %lld: the loss is %s: training diverged (a smaller --lr?)",
                 (long long)step + 1, isnan(loss) ? "NaN" : "infinite");
        if (nb_sched_step(sched) != NB_OK) FAIL("%s", nb_last_error());
        double dt = nbm_now_s() - t0;
        times[step - first] = dt;
        train_time += dt;
        step++;
        if (step - first > 10) { /* steady state: the training steps after the 10th (not
                                   * the evaluations and checkpoints between them) */
            nb_alloc_get_stats(&se);
            steady_allocs = (steady_allocs < 0 ? 0 : steady_allocs) +
                            (se.system_allocs - sa.system_allocs);
        }
        last_losses[n_last++ % 10] = loss;
        const double tps = (double)tokens_per_step * (double)(step - first) / train_time;
        if (log.f) {
            char ls[32], gn[32], ts[32];
            nbm_log_printf(&log, "{\"type\": \"step\", \"step\": %lld, \"loss\": %s, \"lr\": %.6g, "
                    "\"grad_norm\": %s, \"step_ms\": %.2f, \"tokens_per_s\": %s, "
                    "\"exposed_comm_ms\": %.3f}\n",
                    (long long)step, nbm_jnum(loss, 6, ls, sizeof ls), lr,
                    nbm_jnum(norm, 6, gn, sizeof gn), dt * 1e3, nbm_jnum(tps, 1, ts, sizeof ts),
                    comm_ms);
        }
        char comm[48] = "";
        if (ddp || zero) snprintf(comm, sizeof comm, "  comm %.1f ms", comm_ms);
        if (step - first == 1 && main_rank) { /* the state exists after the first step */
            double mib[4];
            model_state_mib(zero, model, mib);
            printf("%smodel state per rank: %.1f MiB (parameters %.1f, gradients %.1f, "
                   "optimizer %.1f)\n", tty ? "\n" : "", mib[0], mib[1], mib[2], mib[3]);
        }
        char eta[32];
        nbm_fmt_eta((double)(a->steps - step) * tokens_per_step / tps, eta, sizeof eta);
        double t = nbm_now_s();
        if (!main_rank) {
        } else if (tty && (t - last_print > 0.2 || step == a->steps)) {
            printf("\rstep %lld/%lld  loss %.4f  lr %.2e  %.0f tokens/s%s  ETA %s   ",
                   (long long)step, (long long)a->steps, loss, lr, tps, comm, eta);
            fflush(stdout);
            last_print = t;
        } else if (!tty && (step % print_every == 0 || step == a->steps)) {
            printf("step %lld/%lld loss %.4f lr %.2e tokens/s %.0f%s ETA %s\n", (long long)step,
                   (long long)a->steps, loss, lr, tps, comm, eta);
            fflush(stdout);
        }
        bool eval_now = step == a->steps || (a->eval_every > 0 && step % a->eval_every == 0);
        if (eval_now) {
            double te = nbm_now_s();
            val_loss = evaluate(model, val, val_gen, a->eval_batches, xs[0], ys[0], world);
            if (isnan(val_loss)) FAIL("evaluation: %s", nb_last_error());
            val_step = step;
            if (main_rank) {
                if (tty) printf("\n");
                printf("step %lld: train loss %.4f  val loss %.4f  (eval %.1f s)\n",
                       (long long)step, loss, val_loss, nbm_now_s() - te);
                fflush(stdout);
            }
            char ls[32], vs[32];
            if (log.f)
                nbm_log_printf(&log, "{\"type\": \"eval\", \"step\": %lld, \"train_loss\": %s, "
                        "\"val_loss\": %s}\n", (long long)step, nbm_jnum(loss, 6, ls, sizeof ls),
                        nbm_jnum(val_loss, 6, vs, sizeof vs));
        }
        bool save_now = (main_rank || zero) && a->save && (step == a->steps || (a->save_every > 0
                                                             ? step % a->save_every == 0
                                                             : eval_now));
        if (save_now) {
            ck.step = step;
            nb_status ss = zero ? nb_zero_checkpoint_save(zero, a->save, &ck)
                                : nb_checkpoint_save(a->save, &ck);
            if (ss != NB_OK) FAIL("%s", nb_last_error());
        }
        if (log.f) nbm_log_flush(&log);
    }
    if (val_step != step) { /* nothing trained (or resumed at the end): evaluate once */
        val_loss = evaluate(model, val, val_gen, a->eval_batches, xs[0], ys[0], world);
        if (isnan(val_loss)) FAIL("evaluation: %s", nb_last_error());
    }
    /* Throughput as torch_ref.py reports it: the median step time, after 10 warm-up steps
     * when there are at least 20. */
    int64_t ran = step - first, skip = ran >= 20 ? 10 : 0;
    double median = nbm_median(times + skip, ran - skip), train_loss = NAN;
    if (ran > skip) {
        int64_t nl = n_last < 10 ? n_last : 10;
        train_loss = 0;
        for (int64_t i = 0; i < nl; i++) train_loss += last_losses[i];
        train_loss /= (double)nl;
    }
    char vl[32], tl[32], rs[32];
    double state_mib[4];
    model_state_mib(zero, model, state_mib);
    struct rusage ru; /* peak resident memory, as torch_ref.py's peak_rss_mib */
    double rss_mib = getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss / 1024.0 : NAN;
    if (main_rank)
        printf("{\"model\": \"gpt\", \"val_loss\": %s, \"train_loss\": %s, \"tokens_per_s\": %.1f, "
               "\"wall_s\": %.2f, \"steps\": %lld, \"params\": %lld, \"step_ms_median\": %.2f, "
               "\"gflop_per_step\": %.3f, \"gflops\": %.1f, \"threads\": %d, "
               "\"ranks\": %d, \"steady_system_allocs\": %lld, \"peak_rss_mib\": %s, "
               "\"zero\": %lld, \"model_state_mib\": %.2f}\n",
               nbm_jnum(val_loss, 4, vl, sizeof vl), nbm_jnum(train_loss, 4, tl, sizeof tl),
               ran > skip ? (double)tokens_per_step / median : 0.0,
               nbm_now_s() - t_start, (long long)step, (long long)nb_num_parameters(model),
               ran > skip ? median * 1e3 : 0.0, flops / 1e9,
               ran > skip ? flops / 1e9 / median : 0.0,
               nb_get_num_threads(), size, (long long)steady_allocs,
               nbm_jnum(rss_mib, 0, rs, sizeof rs), (long long)a->zero, state_mib[0]);
    /* The run itself succeeded; a lost log or final line still makes the exit non-zero,
     * so that a script never takes an incomplete record for a complete one. */
    rc = 0;
    if (!nbm_log_close(&log)) {
        nbm_report("gpt", rank, size, "the run finished, but --log %s is incomplete (see the "
                   "warning above): exit status 1", a->log);
        rc = 1;
    }
    if (main_rank && !nbm_stdout_ok("gpt")) rc = 1;
done:
    nbm_log_close(&log); /* after an error: the warning, if any, is all */
    nb_ddp_free(ddp); /* before the model it hooks into */
    nb_zero_free(zero); /* before the optimizer and the model */
    nb_sched_free(sched);
    nb_optim_free(opt);
    nb_params_deinit(&decay);
    nb_params_deinit(&no_decay);
    nb_module_free(model);
    for (int64_t i = 0; xs && ys && xl && yl && i < N; i++) {
        if (xl[i] != xs[i]) nb_tensor_free(xl[i]);
        if (yl[i] != ys[i]) nb_tensor_free(yl[i]);
        nb_tensor_free(xs[i]);
        nb_tensor_free(ys[i]);
    }
    free(xs);
    free(ys);
    free(xl);
    free(yl);
    free(times);
    nb_tensor_free(train);
    nb_tensor_free(val);
    nb_tensor_free(text);
    nb_generator_free(init);
    nb_generator_free(batch_gen);
    nb_generator_free(drop_gen);
    nb_generator_free(val_gen);
    nb_comm_free(world);
    return rc;
}

int main(int argc, char **argv) {
    args a = {.n_layer = 4, .n_head = 4, .n_embd = 256, .block_size = 128, .bias = 1,
              .steps = 200, .batch = 16, .warmup = -1, .grad_accum = 1, .eval_every = 100,
              .eval_batches = 20, .lr = 3e-4, .weight_decay = 0.1, .min_lr = -1, .beta1 = 0.9,
              .beta2 = 0.999, .schedule = "cosine", .tokens = 500, .temperature = 0.8};
    int rc = parse_args(argc, argv, &a);
    if (rc != RUN) return rc;
    return a.sample ? run_sample(&a) : run_train(&a);
}
