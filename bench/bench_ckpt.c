/* bench_ckpt.c - the training thread's stall per checkpoint save: a synchronous
 * nb_checkpoint_save next to an asynchronous nb_checkpoint_writer_save (the snapshot; the
 * file is written by the writer's thread while training steps run) of the same state, the W3
 * GPT (the gpt program's default config) with AdamW state, alternated, medians of several.
 *
 *     bench_ckpt [--dir DIR] [--rounds N] [--threads N]     (DIR default /tmp)
 *     mpirun -np N bench_ckpt [--zero S] [...]                a sharded save (ZeRO stage S,
 *                                                             default 3) on N ranks
 *
 * Sharded mode (more than one rank): the same model under nb_zero over every rank saves a
 * checkpoint folder (each rank writes its 1/N of the state, in parallel) synchronously and
 * asynchronously, alternated with rank 0 saving the same amount of state as one plain file
 * alone (the one-process save), medians over rounds of the slowest rank's time. Prints the
 * figures and a JSON line: sharded_sync_ms, one_file_ms, sharded_async_stall_ms (the
 * slowest rank's stall, including the completion of the previous save: agreeing and the
 * index), their ratios, and the bytes each rank wrote.
 *
 * Prints a line per round, a summary and a JSON line: sync_ms, async_stall_ms, ratio (stall /
 * sync, of the medians), their minimums (on a loaded machine the medians include time the
 * thread spent preempted), async_write_ms (the background thread's time per file), step_ms and step_ms_during_write
 * (training steps run while a write is in flight, the cost the background write puts on
 * training). Public API only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nabla/nabla.h"

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_dbl);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void die(const char *what) {
    fprintf(stderr, "bench_ckpt: %s: %s\n", what, nb_last_error());
    exit(1);
}

/* The largest of every rank's v. */
static double max_over(nb_comm *c, double v) {
    nb_scope_begin();
    nb_tensor *t = nb_from_buffer(&v, (int64_t[]){1}, 1, NB_F64);
    if (!t || nb_allreduce(c, t, NB_REDUCE_MAX) != NB_OK) die("allreduce");
    double r = nb_item_f64(t);
    nb_scope_end();
    return r;
}

static int64_t dir_bytes(const char *dir, int rank) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "du -sb '%s' 2>/dev/null | cut -f1", dir);
    FILE *f = popen(cmd, "r");
    long long n = 0;
    if (f && fscanf(f, "%lld", &n) != 1) n = 0;
    if (f) pclose(f);
    (void)rank;
    return (int64_t)n;
}

static int sharded(nb_comm *world, const char *dir, int rounds, int stage) {
    int rank = nb_comm_rank(world), size = nb_comm_size(world);
    nb_generator *init = nb_generator_new(1), *data = nb_generator_new(2);
    nb_module *model = nb_gpt_new(NULL, init);
    nb_adamw_opts ao = nb_adamw_defaults();
    nb_optim *opt = model ? nb_adamw_new(nb_parameters(model), &ao) : NULL;
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = stage, zo.bucket_mb = 25;
    nb_zero *z = opt ? nb_zero_new(model, opt, world, &zo) : NULL;
    if (!z) die("zero");
    /* rank 0's one-process copy, for the one-file save of the same state */
    nb_module *solo = rank == 0 ? nb_gpt_new(NULL, init) : NULL;
    nb_optim *solo_opt = solo ? nb_adamw_new(nb_parameters(solo), &ao) : NULL;
    const nb_gpt_config *cfg = nb_gpt_get_config(model);
    int64_t shape[2] = {2, cfg->block_size};
    nb_tensor *x = nb_randint(shape, 2, NB_I64, 0, cfg->vocab_size, data);
    nb_tensor *y = nb_randint(shape, 2, NB_I64, 0, cfg->vocab_size, data);
    if (!x || !y) die("batch");
    nb_gpt_train_step_zero(model, opt, z, &x, &y, 1, 0, NULL);
    if (solo) nb_gpt_train_step(solo, solo_opt, NULL, &x, &y, 1, 0, NULL);
    char sdir[4096], adir[4096], one[4096];
    snprintf(sdir, sizeof sdir, "%s/bench_ckpt_sharded.%d.ckpt", dir, size);
    snprintf(adir, sizeof adir, "%s/bench_ckpt_async.%d.ckpt", dir, size);
    snprintf(one, sizeof one, "%s/bench_ckpt_one.%d.ckpt", dir, size);
    nb_checkpoint_writer *w = nb_checkpoint_writer_new(NULL);
    if (!w) die("writer");
    enum { MAXR = 100 };
    double sync_ms[MAXR], one_ms[MAXR], stall_ms[MAXR];
    for (int r = -1; r < rounds; r++) {
        nb_checkpoint ck = {.model = model, .optim = opt, .step = r + 2};
        nb_barrier(world);
        double t = nb_time_s();
        if (nb_checkpoint_save(sdir, &ck) != NB_OK) die("checkpoint_save (sharded)");
        double s = max_over(world, (nb_time_s() - t) * 1e3);
        nb_barrier(world);
        double o = 0;
        if (rank == 0) {
            nb_checkpoint c1 = {.model = solo, .optim = solo_opt, .step = r + 2};
            t = nb_time_s();
            if (nb_checkpoint_save(one, &c1) != NB_OK) die("checkpoint_save (one file)");
            o = (nb_time_s() - t) * 1e3;
        }
        nb_barrier(world);
        t = nb_time_s();
        if (nb_checkpoint_writer_save(w, adir, &ck) != NB_OK) die("checkpoint_writer_save");
        double a = max_over(world, (nb_time_s() - t) * 1e3);
        /* train on while the files are written, until every rank's is (as a run whose saves
         * are further apart than a write takes) */
        for (int n = 0; n < 1000; n++) {
            nb_gpt_train_step_zero(model, opt, z, &x, &y, 1, 0, NULL);
            nb_checkpoint_writer_stats ws;
            nb_checkpoint_writer_get_stats(w, &ws);
            if (max_over(world, ws.written + ws.failed < r + 2) == 0) break;
        }
        if (r < 0) continue;
        sync_ms[r] = s, one_ms[r] = o, stall_ms[r] = a;
        if (rank == 0)
            printf("round %d: sharded save %.1f ms on %d ranks, one file %.1f ms, async stall "
                   "%.2f ms\n", r, s, size, o, a);
    }
    if (nb_checkpoint_writer_wait(w) != NB_OK) die("checkpoint_writer_wait");
    nb_checkpoint_writer_free(w);
    double ms = median(sync_ms, rounds), mo = median(one_ms, rounds), ma = median(stall_ms, rounds);
    double mins = sync_ms[0], mino = one_ms[0], mina = stall_ms[0]; /* sorted by median() */
    int64_t bytes = dir_bytes(sdir, rank);
    if (rank == 0) {
        printf("W3 GPT + AdamW, %lld parameters, ZeRO-%d on %d ranks, %d rounds: sharded save "
               "median %.1f ms (%lld bytes in the folder, about %lld per rank), one file from one "
               "process %.1f ms: %.2fx; asynchronous sharded stall median %.2f ms: %.1f%% of the "
               "sharded synchronous save\n", (long long)nb_num_parameters(model), stage, size,
               rounds, ms, (long long)bytes, (long long)(bytes / size), mo, mo / ms, ma,
               100 * ma / ms);
        printf("minimums: sharded save %.1f ms, one file %.1f ms (%.2fx), asynchronous stall "
               "%.2f ms (%.1f%%)\n", mins, mino, mino / mins, mina, 100 * mina / mins);
        printf("{\"bench\": \"ckpt_sharded\", \"ranks\": %d, \"zero\": %d, \"sharded_sync_ms\": "
               "%.2f, \"one_file_ms\": %.2f, \"speedup\": %.3f, \"sharded_async_stall_ms\": "
               "%.3f, \"stall_ratio\": %.4f, \"sharded_sync_ms_min\": %.2f, \"one_file_ms_min\": "
               "%.2f, \"sharded_async_stall_ms_min\": %.3f, \"folder_bytes\": %lld}\n", size,
               stage, ms, mo, mo / ms, ma, ma / ms, mins, mino, mina, (long long)bytes);
        char cmd[12400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' '%s'", sdir, adir, one);
        if (system(cmd) != 0) fprintf(stderr, "bench_ckpt: could not remove the files\n");
    }
    nb_tensor_free(x);
    nb_tensor_free(y);
    nb_zero_free(z);
    nb_optim_free(opt);
    nb_module_free(model);
    nb_optim_free(solo_opt);
    nb_module_free(solo);
    nb_generator_free(init);
    nb_generator_free(data);
    return 0;
}

int main(int argc, char **argv) {
    const char *dir = "/tmp";
    int rounds = 7, threads = 0, stage = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--zero")) stage = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_ckpt [--dir DIR] [--rounds N] [--threads N] "
                    "[--zero S]\n");
            return 2;
        }
    }
    if (rounds < 1 || rounds > 100) rounds = 7;
    if (threads > 0) nb_set_num_threads(threads);
    nb_comm *world = nb_comm_world();
    if (world && nb_comm_size(world) > 1) {
        if (stage < 1 || stage > 3) stage = 3;
        int rc = sharded(world, dir, rounds, stage);
        nb_comm_free(world);
        return rc;
    }
    nb_comm_free(world);
    nb_generator *init = nb_generator_new(1), *data = nb_generator_new(2);
    nb_module *model = nb_gpt_new(NULL, init); /* W3: 4 x 256, block 128 */
    if (!model) die("gpt");
    nb_adamw_opts ao = nb_adamw_defaults();
    nb_optim *opt = nb_adamw_new(nb_parameters(model), &ao);
    if (!opt) die("adamw");
    const nb_gpt_config *cfg = nb_gpt_get_config(model);
    int64_t shape[2] = {4, cfg->block_size};
    nb_tensor *x = nb_randint(shape, 2, NB_I64, 0, cfg->vocab_size, data);
    nb_tensor *y = nb_randint(shape, 2, NB_I64, 0, cfg->vocab_size, data);
    if (!x || !y) die("batch");
    char sync_path[4096], async_path[4096];
    snprintf(sync_path, sizeof sync_path, "%s/bench_ckpt_sync.%ld.ckpt", dir, (long)getpid());
    snprintf(async_path, sizeof async_path, "%s/bench_ckpt_async.%ld.ckpt", dir, (long)getpid());
    nb_checkpoint_writer *w = nb_checkpoint_writer_new(NULL);
    if (!w) die("writer");

    enum { MAXR = 100 };
    double sync_ms[MAXR], stall_ms[MAXR], write_ms[MAXR], step_ms[MAXR], busy_step_ms[MAXR];
    int64_t step = 0;
    /* round -1 warms up: the optimizer's state, the writer's buffers, the page cache */
    for (int r = -1; r < rounds; r++) {
        double t = nb_time_s();
        nb_gpt_train_step(model, opt, NULL, &x, &y, 1, 0, NULL);
        nb_gpt_train_step(model, opt, NULL, &x, &y, 1, 0, NULL);
        double quiet = (nb_time_s() - t) / 2 * 1e3;
        step += 2;
        nb_checkpoint ck = {.model = model, .optim = opt, .step = step};
        t = nb_time_s();
        if (nb_checkpoint_save(sync_path, &ck) != NB_OK) die("checkpoint_save");
        double s = (nb_time_s() - t) * 1e3;
        t = nb_time_s();
        if (nb_checkpoint_writer_save(w, async_path, &ck) != NB_OK) die("checkpoint_writer_save");
        double a = (nb_time_s() - t) * 1e3;
        /* train on while the file is written */
        int n = 0;
        nb_checkpoint_writer_stats ws;
        t = nb_time_s();
        do {
            nb_gpt_train_step(model, opt, NULL, &x, &y, 1, 0, NULL);
            n++, step++;
            nb_checkpoint_writer_get_stats(w, &ws);
        } while (ws.written + ws.failed < r + 2 && n < 1000);
        double busy = (nb_time_s() - t) / n * 1e3;
        if (nb_checkpoint_writer_wait(w) != NB_OK) die("checkpoint_writer_wait");
        if (r < 0) continue;
        sync_ms[r] = s, stall_ms[r] = a, write_ms[r] = (double)ws.write_ns_last / 1e6;
        step_ms[r] = quiet, busy_step_ms[r] = busy;
        printf("round %d: sync %.1f ms, async stall %.2f ms (write %.1f ms in the background, "
               "%d steps of %.1f ms meanwhile; %.1f ms quiet)\n", r, s, a, write_ms[r], n, busy,
               quiet);
    }
    double ms = median(sync_ms, rounds), ma = median(stall_ms, rounds);
    double mins = sync_ms[0], mina = stall_ms[0]; /* sorted by median() */
    printf("W3 GPT + AdamW, %lld parameters, %d saves: synchronous median %.1f ms (min %.1f), "
           "asynchronous stall median %.2f ms (min %.2f): %.1f%% of synchronous (min/min %.1f%%)\n",
           (long long)nb_num_parameters(model), rounds, ms, mins, ma, mina, 100 * ma / ms,
           100 * mina / mins);
    printf("{\"bench\": \"ckpt\", \"sync_ms\": %.2f, \"async_stall_ms\": %.3f, \"ratio\": %.4f, "
           "\"sync_ms_min\": %.2f, \"async_stall_ms_min\": %.3f, \"async_write_ms\": %.2f, "
           "\"step_ms\": %.2f, \"step_ms_during_write\": %.2f}\n", ms, ma, ma / ms, mins, mina,
           median(write_ms, rounds), median(step_ms, rounds), median(busy_step_ms, rounds));
    unlink(sync_path);
    unlink(async_path);
    if (nb_checkpoint_writer_free(w) != NB_OK) die("checkpoint_writer_free");
    nb_tensor_free(x);
    nb_tensor_free(y);
    nb_optim_free(opt);
    nb_module_free(model);
    nb_generator_free(init);
    nb_generator_free(data);
    return 0;
}
