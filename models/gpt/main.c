/* main.c - the `gpt` program: trains the byte-level GPT of nabla/gpt.h (or, with --arch
 * llama, the Llama of nabla/llama.h; arch.h) on a text file (by default the King James Bible,
 * as the PyTorch peer's W3 workload does) and samples from a trained model. Training: AdamW with weight decay on 2-D weights only, a cosine
 * (or constant) learning-rate schedule with warmup, gradient clipping, gradient
 * accumulation, validation loss on fixed batches, checkpoints and exact resume, progress
 * with tokens/s, JSON-lines logs, and a last line that is one JSON object. docs/gpt.md.
 *
 * Under mpirun (or srun) the ranks form a device mesh dp x pp x tp (--pp, --tp; nabla/mesh.h):
 * the one GPT of nabla/gpt.h (or Llama) is made tensor parallel by its plan (nb_gpt_parallelize)
 * and split into pipeline stages (nb_gpt_pipeline_new), and nb_ddp or nb_zero (--zero) reduce
 * the gradients over dp; the same training loop and step (nb_gpt_train_step_ex) run every
 * layout.
 * --batch is the global batch per step in every layout, cut into --microbatches (gradient
 * accumulation, or the pipeline's micro-batches). Every rank draws the same global batches
 * (one generator, same seed) and trains on its data-parallel rank's contiguous rows, so every
 * layout follows the 1-process run up to float reassociation; dropout draws from a stream
 * per data-parallel rank. Validation batches are shared out by index and the sums reduced.
 * Checkpoints are nabla/checkpoint.h's: one file, or a folder every rank writes its part of,
 * which any layout resumes. Only rank 0 prints and logs. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nabla/nabla.h>
#include <nabla/run.h>
#include <nabla/summary.h>

#include "arch.h"
#include "ft.h"
#include "device.h"
#include "guard.h"
#include "precision.h"

/* --comm-timeout, --on-nonfinite, --max-skips (guard.h), and the skipped steps' count */
static nbm_guard guard;
/* --device (device.h) */
static nbm_device device;

#define KJV_COMMAND "bible gen1:1-rev22:21"

typedef struct args {
    /* model */
    nbm_arch_kind arch; /* --arch gpt|llama */
    bool arch_given;
    int64_t n_layer, n_head, n_kv_head, n_embd, block_size;
    double dropout;
    int64_t bias, gelu_tanh;
    const char *recompute; /* --checkpoint-activations */
    /* training */
    const char *data;
    int64_t steps, decay_steps, batch, warmup, eval_every, eval_batches, save_every;
    int64_t keep, async_save;
    double lr, weight_decay, min_lr, grad_clip, beta1, beta2;
    const char *schedule;
    const char *save, *resume, *log, *override, *tensorboard;
    int64_t threads, zero, tp;
    bool sequence_parallel;
    int64_t pp, microbatches, virtual_stages; /* --pp: pipeline parallel; micro-batches */
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
            "  --arch A         gpt (GPT-2's architecture) or llama (RMSNorm, rotary, SwiGLU,\n"
            "                   grouped-query attention; docs/llama.md) (default gpt; with\n"
            "                   --sample: what the --load file holds)\n"
            "  --n-layer N --n-head N --n-embd N --block-size N   (default %lld %lld %lld %lld;\n"
            "                   with --sample --block-size is the Llama's context)\n"
            "  --n-kv-head N    llama: key/value heads (default n-head / 2)\n"
            "  --dropout P      gpt: dropout probability (default %g)\n"
            "  --bias 0|1       gpt: biases in linear layers and layer norms (default %lld)\n"
            "  --gelu-tanh 0|1  gpt: tanh-approximated GELU (default %lld: exact)\n"
            "  --checkpoint-activations none|attn|full  recompute in backward instead of\n"
            "                   keeping: each block's attention core, or all but each\n"
            "                   block's input (default none; results are the same)\n"
            "training:\n"
            "  --data FILE      training text, bytes are tokens (default: `" KJV_COMMAND "`)\n"
            "  --steps N        optimizer steps (default %lld)\n"
            "  --batch N        sequences per optimizer step, over all ranks (default %lld)\n"
            "  --microbatches K the step's batch in K micro-batches: gradient accumulation,\n"
            "                   or with --pp the pipeline's micro-batches (default 1; 4 with\n"
            "                   --pp); --grad-accum K is the same flag\n"
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
            "                   nb_ddp), over the data-parallel group; with --pp 1 or 2\n"
            "  --reduce-dtype D fp32, bf16 or fp16: the dtype the gradients travel in between\n"
            "                   the data-parallel ranks (nb_ddp and --zero; summed in f32;\n"
            "                   default fp32; docs/distributed.md, \"Compressed communication\")\n"
            "  --tp N           tensor parallel over N adjacent ranks (default 1); with --pp\n"
            "                   each stage is tensor parallel (mpirun -np dp*pp*tp). Under\n"
            "                   several ranks --save writes a checkpoint folder each rank\n"
            "                   writes its part of (DIR/model.safetensors at the end), which\n"
            "                   any layout (or one process) resumes\n"
            "  --sequence-parallel  with --tp: layer norms and dropout on sequence shards\n"
            "  --pp M           pipeline parallel over M stages (mpirun -np dp*M*tp;\n"
            "                   docs/distributed.md)\n"
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
            (long long)a->steps, (long long)a->batch, a->lr,
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
                 {"--arch", BOTH},         {"--n-kv-head", TRAIN},   {"--block-size", BOTH},  {"--dropout", TRAIN},     {"--bias", TRAIN},
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
        I64("--n-kv-head", n_kv_head, 1, BIG);
        else if (!strcmp(f, "--arch")) a->arch_given = ok = nbm_arch_parse("gpt", v, &a->arch);
        F64("--dropout", dropout, 0, false, 1, true);
        I64("--bias", bias, 0, 1); I64("--gelu-tanh", gelu_tanh, 0, 1);
        STR("--data", data); I64("--steps", steps, 0, MAX_STEPS);
        I64("--batch", batch, 1, NB_MAX_BATCH);
        I64("--grad-accum", microbatches, 1, NB_MAX_BATCH);
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
    if (a->pp > 1 && a->zero > 2) {
        fprintf(stderr, "gpt: --pp takes --zero 1 or 2 (the data-parallel group's ZeRO); stage 3 "
                        "gathers each layer's parameters for its forward, which a pipeline stage "
                        "already holds\n");
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
        /* each architecture's own flags */
        const bool gpt_only = !strcmp(name, "--dropout") || !strcmp(name, "--bias") ||
                              !strcmp(name, "--gelu-tanh");
        if ((gpt_only && a->arch == NBM_LLAMA) ||
            (!strcmp(name, "--n-kv-head") && a->arch == NBM_GPT)) {
            fprintf(stderr, "gpt: %s has no effect with --arch %s\n", name,
                    nbm_arch_name(a->arch));
            return 2;
        }
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
    /* The pipeline's flags go together; what it does not do is refused, not ignored. */
    if (!a->pp && (a->pp_schedule || a->virtual_stages)) {
        fprintf(stderr, "gpt: --pp-schedule and --virtual-stages need --pp\n");
        return 2;
    }
    for (int k = 0; k < NF; k++) /* --grad-accum and --microbatches are one setting */
        if (given[k] && !strcmp(flags[k].name, "--grad-accum"))
            for (int j = 0; j < NF; j++)
                if (given[j] && !strcmp(flags[j].name, "--microbatches")) {
                    fprintf(stderr, "gpt: --grad-accum and --microbatches are the same setting; "
                            "give one\n");
                    return 2;
                }
    if (!a->microbatches) a->microbatches = a->pp ? 4 : 1;
    if (a->batch % a->microbatches) {
        fprintf(stderr, "gpt: --batch %lld does not split into %lld micro-batches\n",
                (long long)a->batch, (long long)a->microbatches);
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
    nbm_arch arch = {
        .kind = a->arch, .gpt = nb_gpt_config_defaults(), .llama = nb_llama_config_defaults()};
    arch.gpt.n_head = a->n_head, arch.gpt.gelu_tanh = a->gelu_tanh != 0;
    arch.llama.n_head = a->n_head, arch.llama.block_size = a->block_size;
    nb_set_num_threads((int)a->threads);
    nb_module *model = NULL;
    nb_generator *gen = nb_generator_new(a->seed);
    const char *prompt = a->prompt ? a->prompt : "\n";
    int64_t np = (int64_t)strlen(prompt), *toks = malloc(sizeof(int64_t) * (size_t)(np + a->tokens + 1));
    if (!toks || !gen || !nbm_device_use("gpt", &device)) goto done;
    if (!(model = nbm_arch_load(&arch, !a->arch_given, a->load))) {
        fprintf(stderr, "gpt: %s\n", nb_last_error());
        goto done;
    }
    if (np == 0) { /* an empty prompt starts from a newline, as nanoGPT's sample.py */
        prompt = "\n";
        np = 1;
    }
    for (int64_t i = 0; i < np; i++) toks[i] = (unsigned char)prompt[i];
    int64_t L, H, Hkv, C;
    nbm_arch_shape(&arch, &L, &H, &Hkv, &C);
    fprintf(stderr, "gpt: %s, %lld layers, %lld heads (%lld key/value), width %lld, context "
            "%lld, %lld parameters\n", nbm_arch_name(arch.kind), (long long)L, (long long)H,
            (long long)Hkv, (long long)C,
            (long long)(arch.kind == NBM_LLAMA ? arch.llama.block_size : arch.gpt.block_size),
            (long long)nb_num_parameters(model));
    nb_gpt_sample_opts so = nb_gpt_sample_defaults();
    so.temperature = a->temperature, so.top_k = a->top_k, so.gen = gen;
    if (nbm_arch_generate(&arch, model, toks, np, a->tokens, &so, toks + np) != NB_OK) {
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
 * B_local sequences of T tokens. NB_OK when it fits or the available memory is unknown. */
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
    nb_tensor *text, *train, *val, *xg, *yg, **xs, **ys, **xl, **yl, *vx, *vy;
    nbm_arch arch; /* the model's architecture and (resolved) config */
    nb_module *model;
    nb_optim *opt;
    nb_sched *sched;
    nb_params decay, no_decay;
    nb_ddp *ddp;
    nb_zero *zero; /* --zero 1|2|3 instead of ddp */
    nb_grad_scaler *scaler; /* --precision fp16: dynamic loss scaling; NULL otherwise */
    nb_mesh *mesh;     /* dp x pp x tp over the world */
    nb_pipeline *pipe; /* --pp > 1: the model split into stages; NULL otherwise */
    nb_module *mine;   /* this rank's part of the model: the pipeline's module, or the model */
    nb_pipe_stats ps;  /* the last step's pipeline figures */
    double bubble_sum; /* over the steps run */
    double exposed_sum, tp_sum; /* exposed and tensor-parallel communication, seconds */
    int64_t peak_live;
    nb_comm *dp;       /* the data-parallel group (borrowed from the mesh) */
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
    bool usage; /* the failure is a usage error (a layout that cannot be): exit status 2 */
    bool diverged_val; /* stopped by a validation loss that is not finite (final line kept) */
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
    if (check_fits(&r->arch, r->B / r->dp_size, r->T) != NB_OK)
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
    r->flops = nbm_arch_flops(&r->arch, r->B * r->N, r->T);
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
    printf(", width %lld, context %lld; %lld train / %lld val bytes; batch %lld x %lld "
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
static bool train_loop(run *r) {
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

/* --save of a parallel run: rank 0 writes the last checkpoint's model as one plain file,
 * <checkpoint>/model.safetensors (nanoGPT's names; gpt --sample --load reads it). */
static bool consolidate_end(run *r) {
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

static int run_train(const args *a) {
    const double t_start = nb_time_s();
    /* First, before MPI, the loader and the thread pools start threads: the stop signals are
     * then blocked in all of them and taken by nabla's signal thread (nabla/stop.h). A stop
     * acts at step boundaries. */
    nbm_stop_begin("gpt");
    run r = {.a = a, .size = 1, .B = a->batch, .T = a->block_size, .N = a->microbatches,
             .val_loss = NAN, .val_step = -1, .steady_allocs = -1};
    int rc = 1;
    nbm_save_async(a->async_save != 0);
    if (setup(&r) && train_loop(&r) && nbm_save_finish("gpt", true) && consolidate_end(&r)) {
        print_result(&r, nb_time_s() - t_start);
        /* The run itself succeeded; a lost log or final line still makes the exit non-zero,
         * so that a script never takes an incomplete record for a complete one. */
        rc = close_logs(&r) ? nbm_stop_status(r.stop) : 1;
        if (r.main_rank && !nb_stdout_ok("gpt")) rc = 1;
    } else if (r.usage) {
        rc = 2; /* a layout that cannot be: a usage error, which a restart does not mend */
    } else if (r.diverged_val) { /* the final line says why the run ended */
        nbm_save_finish("gpt", false);
        print_result(&r, nb_time_s() - t_start);
    }
    teardown(&r);
    return rc;
}

int main(int argc, char **argv) {
    args a = {.n_layer = 4, .n_head = 4, .n_embd = 256, .block_size = 128, .bias = 1,
              .steps = 200, .batch = 16, .warmup = -1, .eval_every = 100,
              .eval_batches = 20, .lr = 3e-4, .weight_decay = 0.1, .min_lr = -1, .beta1 = 0.9,
              .beta2 = 0.999, .schedule = "cosine", .recompute = "none", .tokens = 500,
              .temperature = 0.8};
    if (!nbm_guard_args("gpt", &argc, argv, &guard)) return 2;
    if (!nbm_device_args("gpt", &argc, argv, &device)) return 2;
    int rc = parse_args(argc, argv, &a);
    if (rc != RUN) return rc;
    return a.sample ? run_sample(&a) : run_train(&a);
}
