/* bench_ckpt.c - the training thread's stall per checkpoint save: a synchronous
 * nb_checkpoint_save next to an asynchronous nb_checkpoint_writer_save (the snapshot; the
 * file is written by the writer's thread while training steps run) of the same state, the W3
 * GPT (the gpt program's default config) with AdamW state, alternated, medians of several.
 *
 *     bench_ckpt [--dir DIR] [--rounds N] [--threads N]     (DIR default /tmp)
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

int main(int argc, char **argv) {
    const char *dir = "/tmp";
    int rounds = 7, threads = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_ckpt [--dir DIR] [--rounds N] [--threads N]\n");
            return 2;
        }
    }
    if (rounds < 1 || rounds > 100) rounds = 7;
    if (threads > 0) nb_set_num_threads(threads);
    nb_generator *init = nb_generator_new(1), *data = nb_generator_new(2);
    nb_module *model = nb_gpt_new(&(nb_gpt_config){0}, init); /* W3: 4 x 256, block 128 */
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
