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
 * which any layout resumes. Only rank 0 prints and logs.
 * This file: sampling, one training run from start to end, main(); args.c: the command line;
 * setup.c: a run's setup and teardown; train.c: its loop and reports (prog.h: what they share);
 * arch.c: GPT or Llama. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nabla/nabla.h>

#include "ft.h"
#include "prog.h"

/* --comm-timeout, --on-nonfinite, --max-skips (guard.h), and the skipped steps' count */
nbm_guard guard;
/* --device (device.h) */
nbm_device device;

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