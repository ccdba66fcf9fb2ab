/* args.c - the gpt program's command line: --help's text and the parsing, with every check
 * that needs no model or ranks (a flag the mode ignores, flags that go together, a --batch
 * that does not split into its micro-batches). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nabla/nabla.h>

#include "precision.h"
#include "prog.h"

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

int parse_args(int argc, char **argv, args *a) {
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
