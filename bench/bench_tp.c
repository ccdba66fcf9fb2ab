/* bench_tp.c - the GPT made tensor parallel by its plan (nb_gpt_parallelize) per layout: parameter memory and
 * activation memory per rank next to the 1-rank model's, communication bytes per step next
 * to Megatron's formula, step time and its exposed communication. Run it under mpirun
 * (-np 1, 2, 4); every dp x tp layout of the world (with and without sequence parallelism)
 * is measured in one run, each rank 1 thread. Prints one table row per layout on rank 0.
 *     mpirun -np 2 build/bench/bench_tp [--layers 2] [--embd 256] [--batch 8] [--steps 5]
 * Megatron's count per step (fw + bw) for L layers, B sequences of T tokens per replica,
 * width C, f32: 4L + 2 allreduces of B T C 4 bytes (one per attention and MLP each way, the
 * embedding's forward and the head input's backward) and 2 of B T 4 bytes (the vocab-
 * parallel cross entropy's sums), each rank sending 2 (tp-1)/tp of each over a ring;
 * sequence parallelism replaces each allreduce by an all-gather and a reduce-scatter,
 * (tp-1)/tp each: the same volume. The row maxima of the cross entropy (one more allreduce
 * of B T numbers) are not counted. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nabla/nabla.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double max_over(nb_comm *c, double v) {
    nb_tensor *t = nb_full((int64_t[]){1}, 1, NB_F64, v);
    nb_allreduce(c, t, NB_REDUCE_MAX);
    double r = nb_item_f64(t);
    nb_tensor_free(t);
    return r;
}

int main(int argc, char **argv) {
    int64_t L = 2, C = 256, B = 8, T = 128, steps = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        int64_t v = atoll(argv[i + 1]);
        if (!strcmp(argv[i], "--layers")) L = v;
        else if (!strcmp(argv[i], "--embd")) C = v;
        else if (!strcmp(argv[i], "--batch")) B = v;
        else if (!strcmp(argv[i], "--steps")) steps = v;
    }
    nb_set_num_threads(1);
    nb_comm *world = nb_comm_world();
    const int W = nb_comm_size(world), rank = nb_comm_rank(world);
    nb_gpt_config cfg = nb_gpt_config_defaults();
    cfg.vocab_size = 256, cfg.block_size = T, cfg.n_layer = L, cfg.n_head = 4, cfg.n_embd = C;
    nb_module *ref = nb_gpt_new(&cfg, NULL);
    const double full_mib = (double)nb_num_parameters(ref) * 4 / 1048576.0;
    nb_module_free(ref);
    if (rank == 0) {
        printf("GPT L=%lld C=%lld T=%lld, global batch %lld, %d ranks x 1 thread; full model "
               "%.2f MiB of f32 parameters\n", (long long)L, (long long)C, (long long)T,
               (long long)B, W, full_mib);
        printf("| layout | params/rank MiB (x full) | activations/rank MiB | comm MiB/step "
               "(Megatron) | step ms | exposed comm ms |\n|---|---|---|---|---|---|\n");
    }
    for (int tp = 1; tp <= W; tp *= 2)
        for (int sp = 0; sp <= (tp > 1); sp++) {
            if (W % tp || B % (W / tp)) continue;
            nb_mesh *mesh = nb_mesh_new(world, "dp tp", (int[]){-1, tp});
            nb_generator *g = nb_generator_new(0);
            nb_module *m = nb_gpt_new(&cfg, g);
            nb_generator_free(g);
            nb_parallelize_opts po = nb_parallelize_defaults();
            po.sequence_parallel = sp;
            if (tp > 1 && nb_gpt_parallelize(m, mesh, &po) != NB_OK) {
                fprintf(stderr, "bench_tp: %s\n", nb_last_error());
                return 1;
            }
            const int dp = nb_mesh_size(mesh, "dp");
            /* the data-parallel reducer (also the sequence-parallel partial sums) */
            nb_ddp *ddp = dp > 1 || sp ? nb_ddp_new(m, nb_mesh_group(mesh, "dp"), NULL) : NULL;
            nb_sgd_opts so = nb_sgd_defaults();
            so.lr = 1e-3;
            nb_optim *opt = nb_sgd_new(nb_parameters(m), &so);
            const int64_t Bl = B / dp;
            nb_tensor *x = nb_randint((int64_t[]){Bl, T}, 2, NB_I64, 0, 256, NULL);
            nb_tensor *y = nb_randint((int64_t[]){Bl, T}, 2, NB_I64, 0, 256, NULL);
            double *ts = calloc((size_t)steps, sizeof(double)), act = 0, comm_s = 0;
            nb_tp_comm_stats cs = {0};
            for (int64_t s = -2; s < steps; s++) {
                nb_barrier(world);
                nb_alloc_stats a0, a1;
                nb_alloc_get_stats(&a0);
                nb_alloc_reset_peak();
                nb_tp_comm_stats_reset();
                double t0 = nb_time_s();
                nb_gpt_train_step(m, opt, ddp, &x, &y, 1, 0, NULL);
                double dt = nb_time_s() - t0;
                nb_alloc_get_stats(&a1);
                nb_tp_comm_stats_get(&cs);
                if (s >= 0) {
                    ts[s] = dt;
                    comm_s += cs.seconds / (double)steps;
                    act = (double)(a1.bytes_peak - a0.bytes_live) / 1048576.0;
                }
            }
            qsort(ts, (size_t)steps, sizeof(double), cmp);
            double med = max_over(world, ts[steps / 2]), actmax = max_over(world, act);
            double pmib = (double)nb_num_parameters(m) * 4 / 1048576.0;
            const double ring = 2.0 * (tp - 1) / tp; /* an allreduce's share each rank sends */
            double formula = ring * ((4.0 * (double)L + 2) * (double)(Bl * T * C) * 4 +
                                     2.0 * (double)(Bl * T) * 4) / 1048576.0;
            comm_s = max_over(world, comm_s);
            if (rank == 0)
                printf("| dp %d x tp %d%s | %.2f (%.2f) | %.1f | %.2f (%.2f) | %.1f | %.1f |\n", dp, tp,
                       sp ? " sp" : "", pmib, pmib / full_mib, actmax,
                       (double)cs.bytes / 1048576.0, formula, med * 1e3, comm_s * 1e3);
            fflush(stdout);
            free(ts);
            nb_tensor_free(x);
            nb_tensor_free(y);
            nb_optim_free(opt);
            nb_ddp_free(ddp);
            nb_module_free(m);
            nb_mesh_free(mesh);
        }
    nb_comm_free(world);
    return 0;
}
