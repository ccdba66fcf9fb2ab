/* bench_pipeline - pipeline parallelism (nabla/pipeline.h), run under `mpirun -np P`:
 *   1. the schedules' bubble: nb_pipe_run over stages that sleep (forward F ms, backward 2F ms
 *      per stage, split over the virtual stages), so the measurement does not depend on how
 *      many cores the machine has: measured bubble vs the ideal (p-1)/(v m + p - 1);
 *   2. the GPT split over the P ranks: parameters and activation memory per stage vs one
 *      rank holding the whole model (both measured in this run), the measured bubble and the
 *      step time per schedule;
 *   3. on 4 ranks, the 3D layout tp 2 x pp 2 (each stage tensor parallel, with and without
 *      sequence parallelism, 1F1B): the same per-rank figures against one rank.
 * Prints one table per part from rank 0. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <nabla/nabla.h>

static int rank, size;

static void sleep_ms(double ms) {
    struct timespec ts = {(time_t)(ms / 1e3), (long)(fmod(ms, 1e3) * 1e6)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* ---- 1. sleeping stages -------------------------------------------------------------------- */
typedef struct sleeper {
    nb_tensor *w; /* a leaf; its gradient hook sleeps the backward time */
    double f_ms;
} sleeper;

static void backward_sleep(nb_tensor *leaf, void *ctx) {
    (void)leaf;
    sleep_ms(2 * ((sleeper *)ctx)->f_ms);
}

/* The stage: sleep the forward time, multiply by w (so the backward reaches w's hook); the
 * last stage (chunk v-1 of rank p-1) returns a sum as the loss. */
typedef struct layout {
    sleeper s;
    int p, v;
} layout;

static nb_tensor *layout_stage(void *ctx, int chunk, int micro, nb_tensor *in) {
    layout *l = ctx;
    sleep_ms(l->s.f_ms);
    nb_tensor *x = in ? in : nb_ones((int64_t[]){4}, 1, NB_F32);
    nb_tensor *y = nb_mul(x, l->s.w);
    (void)micro;
    bool last = chunk * l->p + rank == l->p * l->v - 1;
    return last ? nb_sum(y, NULL, 0, false) : y;
}

static void bench_bubble(nb_comm *world) {
    const double F = 4.0; /* ms of forward per stage; backward 2F */
    if (rank == 0)
        printf("1. schedule bubble, %d stages sleeping %.0f ms forward + %.0f ms backward each "
               "(split over v chunks)\n%-12s %3s %3s %9s %9s %9s\n", size, F, 2 * F, "schedule",
               "v", "m", "measured", "ideal", "step ms");
    const nb_pipe_schedule scheds[] = {NB_PIPE_GPIPE, NB_PIPE_1F1B, NB_PIPE_INTERLEAVED};
    const int ms[] = {1, 4, 8, 16};
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 4; j++) {
            const int v = scheds[k] == NB_PIPE_INTERLEAVED ? 2 : 1, m = ms[j];
            if (scheds[k] == NB_PIPE_INTERLEAVED && m % size) continue;
            layout l = {.s = {.f_ms = F / v}, .p = size, .v = v};
            l.s.w = nb_ones((int64_t[]){4}, 1, NB_F32);
            nb_set_requires_grad(l.s.w, true);
            nb_register_grad_hook(l.s.w, backward_sleep, &l.s);
            nb_pipe_opts po = nb_pipe_defaults();
            po.schedule = scheds[k], po.n_micro = m, po.virtual_stages = v;
            po.act_shape = (int64_t[]){4}, po.act_ndim = 1;
            double bub[3], step[3];
            for (int rep = 0; rep < 3; rep++) {
                nb_pipe_stats st;
                nb_clear_grad(l.s.w);
                if (isnan(nb_pipe_run(world, &po, layout_stage, &l, &st))) {
                    fprintf(stderr, "bench_pipeline: %s\n", nb_last_error());
                    exit(1);
                }
                bub[rep] = st.bubble;
                step[rep] = st.step_s * 1e3;
            }
            if (rank == 0)
                printf("%-12s %3d %3d %9.3f %9.3f %9.1f\n", nb_pipe_schedule_name(scheds[k]), v, m,
                       nb_median(bub, 3), nb_pipe_bubble_theory(scheds[k], size, m, v),
                       nb_median(step, 3));
            nb_tensor_free(l.s.w);
        }
}

/* ---- 2. the GPT ------------------------------------------------------------------------------ */
typedef struct mem {
    double params_mib, act_mib, step_ms, bubble;
} mem;

/* Parameters and the step's activation peak (allocator peak over the live bytes before the
 * step, gradients and optimizer state excluded by a warm-up step first). */
static mem measure(const nb_gpt_config *cfg, nb_comm *world, int pp, int tp, nb_pipe_schedule s,
                   int v, int m, int64_t B, bool sp) {
    mem r = {NAN, NAN, NAN, NAN};
    nb_mesh *mesh = nb_mesh_new(world, "pp tp", (int[]){pp, tp});
    nb_generator *g = nb_generator_new(1);
    nb_module *model = mesh ? nb_gpt_new(cfg, g) : NULL;
    nb_parallelize_opts tpo = nb_parallelize_defaults();
    tpo.sequence_parallel = sp;
    if (model && tp > 1 && nb_gpt_parallelize(model, mesh, &tpo) != NB_OK) {
        fprintf(stderr, "bench_pipeline: %s\n", nb_last_error());
        exit(1);
    }
    nb_pipeline_opts po = nb_pipeline_defaults();
    po.schedule = s;
    po.virtual_stages = v;
    po.n_micro = m;
    nb_pipeline *p = model ? nb_gpt_pipeline_new(model, mesh, &po) : NULL;
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 1e-3;
    nb_optim *opt = p ? nb_sgd_new(nb_parameters(nb_pipeline_module(p)), &so) : NULL;
    /* with sequence parallelism the reducer sums the partial gradients (one dp rank) */
    nb_ddp *ddp = opt && sp ? nb_ddp_new(nb_pipeline_module(p), nb_mesh_group(mesh, "dp"), NULL)
                            : NULL;
    if (!opt || (sp && !ddp)) {
        fprintf(stderr, "bench_pipeline: %s\n", nb_last_error());
        exit(1);
    }
    r.params_mib = (double)nb_num_parameters(nb_pipeline_module(p)) * 4 / (1 << 20);
    nb_tensor *x = nb_randint((int64_t[]){B, cfg->block_size}, 2, NB_I64, 0, cfg->vocab_size, g);
    double steps[5], bub[5];
    for (int i = 0; i < 6; i++) {
        nb_alloc_stats a, b;
        nb_alloc_get_stats(&a);
        nb_alloc_reset_peak();
        nb_pipe_stats st;
        nb_zero_grad(opt);
        if (isnan(nb_pipeline_step(p, x, x, &st)) || nb_step(opt) != NB_OK) {
            fprintf(stderr, "bench_pipeline: %s\n", nb_last_error());
            exit(1);
        }
        nb_alloc_get_stats(&b);
        if (i == 0) continue; /* the first step makes the gradients */
        steps[i - 1] = st.step_s * 1e3;
        bub[i - 1] = st.bubble;
        r.act_mib = (double)(b.bytes_peak - a.bytes_live) / (1 << 20);
    }
    r.step_ms = nb_median(steps, 5);
    r.bubble = nb_median(bub, 5);
    nb_tensor_free(x);
    nb_ddp_free(ddp);
    nb_optim_free(opt);
    nb_pipeline_free(p);
    nb_module_free(model);
    nb_generator_free(g);
    nb_mesh_free(mesh);
    return r;
}

static void bench_gpt(nb_comm *world) {
    nb_gpt_config cfg = nb_gpt_config_defaults();
    cfg.vocab_size = 256, cfg.block_size = 64, cfg.n_layer = 8, cfg.n_head = 4, cfg.n_embd = 128;
    const int m = 8;
    const int64_t B = 16;
    nb_comm *self = nb_comm_self();
    /* one rank, the whole model and batch (no micro-batches): every rank measures it alone,
     * one after the other */
    mem one = {0};
    for (int r = 0; r < size; r++) {
        if (r == rank) one = measure(&cfg, self, 1, 1, NB_PIPE_GPIPE, 1, 1, B, false); /* the whole batch at once */
        nb_barrier(world);
    }
    if (rank == 0)
        printf("\n2. GPT (8 layers, width 128, context 64, batch %lld in %d micro-batches) on %d "
               "stages vs 1 rank\n   1 rank: parameters %.2f MiB, activation peak %.2f MiB, "
               "step %.0f ms\n%-12s %3s %11s %11s %9s %9s %9s\n", (long long)B, m, size,
               one.params_mib, one.act_mib, one.step_ms, "schedule", "v", "params/1rk",
               "act/1rk", "bubble", "ideal", "step ms");
    const nb_pipe_schedule scheds[] = {NB_PIPE_GPIPE, NB_PIPE_1F1B, NB_PIPE_INTERLEAVED};
    for (int k = 0; k < 3; k++) {
        const int v = scheds[k] == NB_PIPE_INTERLEAVED ? 2 : 1;
        mem r = measure(&cfg, world, size, 1, scheds[k], v, m, B, false);
        double w[3] = {r.params_mib, r.act_mib, r.step_ms};
        nb_tensor *t = nb_from_buffer(w, (int64_t[]){3}, 1, NB_F64);
        nb_allreduce(world, t, NB_REDUCE_MAX); /* the largest stage */
        nb_read(t, w, 3, NB_F64);
        nb_tensor_free(t);
        if (rank == 0)
            printf("%-12s %3d %11.3f %11.3f %9.3f %9.3f %9.0f\n", nb_pipe_schedule_name(scheds[k]),
                   v, w[0] / one.params_mib, w[1] / one.act_mib, r.bubble,
                   nb_pipe_bubble_theory(scheds[k], size, m, v), w[2]);
    }
    /* 3. tp 2 x pp 2 on 4 ranks (Megatron's order: the tp pairs adjacent) */
    const bool four = size == 4;
    if (four && rank == 0)
        printf("\n3. the same GPT as tp 2 x pp 2 (4 ranks, 1F1B, %d micro-batches) vs 1 rank\n"
               "%-22s %11s %11s %9s %9s %9s\n", m, "layout", "params/1rk", "act/1rk", "bubble",
               "ideal", "step ms");
    for (int sp = 0; four && sp <= 1; sp++) {
        mem r = measure(&cfg, world, 2, 2, NB_PIPE_1F1B, 1, m, B, sp == 1);
        double w[3] = {r.params_mib, r.act_mib, r.step_ms};
        nb_tensor *t = nb_from_buffer(w, (int64_t[]){3}, 1, NB_F64);
        nb_allreduce(world, t, NB_REDUCE_MAX); /* the largest rank */
        nb_read(t, w, 3, NB_F64);
        nb_tensor_free(t);
        if (rank == 0)
            printf("%-22s %11.3f %11.3f %9.3f %9.3f %9.0f\n",
                   sp ? "tp2 x pp2, seq-parallel" : "tp2 x pp2", w[0] / one.params_mib,
                   w[1] / one.act_mib, r.bubble, nb_pipe_bubble_theory(NB_PIPE_1F1B, 2, m, 1), w[2]);
    }
    nb_comm_free(self);
}

int main(void) {
    nb_comm *world = nb_comm_world();
    if (!world) return 1;
    rank = nb_comm_rank(world);
    size = nb_comm_size(world);
    nb_set_num_threads(1);
    bench_bubble(world);
    bench_gpt(world);
    nb_comm_free(world);
    return 0;
}
