/* test_zero_async.c - asynchronous sharded checkpoints of nb_zero (nabla/checkpoint.h,
 * nb_zero_checkpoint_save_async): the index of a save appears only once every rank's shard is
 * durable (at the next save or at nb_zero_checkpoint_wait), until then the previous
 * checkpoint is the one that loads, a completed asynchronous checkpoint holds what the
 * synchronous nb_zero_checkpoint_save of the same state holds, and a shard that fails to be
 * written is an error on every rank and leaves no index. Any number of ranks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpi_test.h"

enum { IN = 6, HID = 16, OUT = 3, GB = 8 };

static nb_module *mlp(uint64_t seed) {
    nb_generator *g = nb_generator_new(seed);
    nb_linear_opts o = {.gen = g};
    nb_module *m = nb_sequential_new(nb_linear_new(IN, HID, &o), nb_relu_new(),
                                     nb_linear_new(HID, OUT, &o), NULL);
    nb_generator_free(g);
    MT_CHECK(m != NULL, "building the model: %s", nb_last_error());
    return m;
}

static nb_optim *adamw(nb_module *m) {
    nb_adamw_opts ao = nb_adamw_defaults();
    ao.lr = 1e-2;
    return nb_adamw_new(nb_parameters(m), &ao);
}

/* One step on this rank's rows of a global batch drawn from step. */
static void step_once(nb_module *m, nb_optim *o, int step) {
    nb_scope_begin();
    nb_generator *g = nb_generator_new(100 + (uint64_t)step);
    nb_tensor *x = nb_randn((int64_t[]){GB, IN}, 2, NB_F32, g);
    nb_tensor *y = nb_randint((int64_t[]){GB}, 1, NB_I64, 0, OUT, g);
    nb_generator_free(g);
    int64_t n = GB / mt_size > 0 ? GB / mt_size : 1, start = (mt_rank * n) % GB;
    nb_tensor *l = nb_cross_entropy(nb_forward(m, nb_narrow(x, 0, start, n)),
                                    nb_narrow(y, 0, start, n), NULL);
    MT_OK(nb_zero_grad(o));
    MT_OK(nb_backward(l));
    MT_OK(nb_step(o));
    nb_scope_end();
}

/* The step a sharded checkpoint directory loads at (-1: it does not load), into a fresh
 * plain model and optimizer (one process: z NULL); its parameters into *out if given. */
static int64_t loaded_step(const char *dir, nb_module **out) {
    nb_module *m = mlp(99);
    nb_optim *o = adamw(m);
    nb_checkpoint ck = {.model = m, .optim = o, .program = "test"};
    int64_t step = nb_zero_checkpoint_load(NULL, dir, &ck) == NB_OK ? ck.step : -1;
    nb_clear_error();
    nb_optim_free(o);
    if (out) *out = m;
    else nb_module_free(m);
    return step;
}

static void same_params(nb_module *a, nb_module *b) {
    const nb_params *pa = nb_parameters(a), *pb = nb_parameters(b);
    MT_CHECK(pa->count == pb->count, "parameter counts differ");
    for (int i = 0; i < pa->count && i < pb->count; i++) {
        int64_t n = nb_numel(pa->tensors[i]);
        float *va = malloc(sizeof(float) * (size_t)n), *vb = malloc(sizeof(float) * (size_t)n);
        MT_OK(nb_read(pa->tensors[i], va, n, NB_F32));
        MT_OK(nb_read(pb->tensors[i], vb, n, NB_F32));
        MT_CHECK(memcmp(va, vb, sizeof(float) * (size_t)n) == 0, "%s differs", pa->names[i]);
        free(va);
        free(vb);
    }
}

/* A fresh directory name, the same on every rank (rank 0 makes it). */
static void tmpdir(char out[64]) {
    memset(out, 0, 64);
    if (mt_rank == 0) {
        static const char tmpl[] = "/tmp/nb-zero-async-XXXXXX";
        memcpy(out, tmpl, sizeof tmpl);
        MT_CHECK(mkdtemp(out) != NULL, "mkdtemp failed");
    }
    nb_scope_begin();
    nb_tensor *t = nb_from_buffer(out, (int64_t[]){64}, 1, NB_U8);
    MT_OK(nb_broadcast(mt_world, t, 0));
    memcpy(out, nb_data(t), 64);
    out[63] = 0;
    nb_scope_end();
}

START_TEST(test_zero_async_index_last) {
    nb_scope_begin();
    char tmp[64], dir[96], sync_dir[96], idx[128];
    tmpdir(tmp);
    snprintf(dir, sizeof dir, "%s/a.ckpt", tmp);
    snprintf(sync_dir, sizeof sync_dir, "%s/s.ckpt", tmp);
    snprintf(idx, sizeof idx, "%s/index.safetensors", dir);
    nb_module *m = mlp(7);
    nb_optim *o = adamw(m);
    nb_zero *z = nb_zero_new(m, o, mt_world, &(nb_zero_opts){.stage = 1, .bucket_mb = 200e-6});
    MT_CHECK(z != NULL, "%s", nb_last_error());
    nb_checkpoint_writer *w = nb_checkpoint_writer_new(NULL);
    MT_CHECK(w != NULL, "%s", nb_last_error());
    if (z && w) {
        nb_checkpoint_writer *skip = nb_checkpoint_writer_new(
            &(nb_checkpoint_writer_opts){.policy = NB_CKPT_SKIP});
        nb_checkpoint ck = {.model = m, .optim = o, .program = "test"};
        nb_status st = nb_zero_checkpoint_save_async(z, skip, dir, &ck);
        MT_CHECK(st == NB_EINVAL && strstr(nb_last_error(), "NB_CKPT_SKIP"), "skip writer: %s",
                 nb_last_error());
        nb_clear_error();
        MT_OK(nb_checkpoint_writer_free(skip));
        st = nb_zero_checkpoint_save_async(z, NULL, dir, &ck);
        MT_CHECK(st == NB_ENULL && strstr(nb_last_error(), "the writer is NULL"), "%s",
                 nb_last_error());
        nb_clear_error();

        step_once(m, o, 0);
        step_once(m, o, 1);
        ck.step = 2;
        MT_OK(nb_zero_checkpoint_save_async(z, w, dir, &ck));
        /* the shards may be on disk already, but no index: no checkpoint yet */
        MT_CHECK(access(idx, F_OK) != 0, "an index before the ranks agreed");
        if (mt_rank == 0) MT_CHECK(loaded_step(dir, NULL) == -1, "loads before its index");
        MT_OK(nb_barrier(mt_world));
        step_once(m, o, 2);
        step_once(m, o, 3);
        ck.step = 4;
        MT_OK(nb_zero_checkpoint_save(z, sync_dir, &ck)); /* the same state, synchronously */
        MT_OK(nb_zero_checkpoint_save_async(z, w, dir, &ck)); /* completes step 2's */
        if (mt_rank == 0) MT_CHECK(loaded_step(dir, NULL) == 2, "the previous checkpoint");
        MT_OK(nb_barrier(mt_world));
        step_once(m, o, 4); /* changes nothing in the step 4 snapshot */
        MT_OK(nb_zero_checkpoint_wait(z, w));
        MT_OK(nb_zero_checkpoint_wait(z, w)); /* nothing in flight: a no-op */
        if (mt_rank == 0) {
            nb_module *a = NULL, *s = NULL;
            MT_CHECK(loaded_step(dir, &a) == 4, "the asynchronous checkpoint after wait");
            MT_CHECK(loaded_step(sync_dir, &s) == 4, "the synchronous checkpoint");
            same_params(a, s);
            nb_module_free(a);
            nb_module_free(s);
            /* the shards of step 2's save were removed with the new index */
            char cmd[256];
            snprintf(cmd, sizeof cmd, "test $(ls '%s' | grep -c '^zero-') -eq %d", dir, mt_size);
            MT_CHECK(system(cmd) == 0, "old shards left in %s", dir);
        }
        MT_OK(nb_barrier(mt_world));

        /* a shard that cannot be written (its directory removed during the slowed write):
         * the error on every rank at _wait, and no index */
        char gone[96];
        snprintf(gone, sizeof gone, "%s/gone.ckpt", tmp);
        setenv("NB_TEST_SLOW_WRITE_MS", "1000", 1);
        nb_checkpoint_writer *slow = nb_checkpoint_writer_new(NULL);
        unsetenv("NB_TEST_SLOW_WRITE_MS");
        MT_CHECK(slow != NULL, "%s", nb_last_error());
        if (slow) {
            MT_OK(nb_zero_checkpoint_save_async(z, slow, gone, &ck));
            MT_OK(nb_barrier(mt_world));
            if (mt_rank == 0) {
                char cmd[160];
                snprintf(cmd, sizeof cmd, "rm -rf '%s'", gone);
                MT_CHECK(system(cmd) == 0, "rm failed");
            }
            MT_OK(nb_barrier(mt_world));
            nb_status ws = nb_zero_checkpoint_wait(z, slow);
            MT_CHECK(ws == NB_EIO && strstr(nb_last_error(), "gone.ckpt"),
                     "a failed shard write: %s: %s", nb_status_name(ws), nb_last_error());
            nb_clear_error();
            char gidx[128];
            snprintf(gidx, sizeof gidx, "%s/index.safetensors", gone);
            MT_CHECK(access(gidx, F_OK) != 0, "an index for a failed save");
            MT_OK(nb_checkpoint_writer_free(slow));
        }
    }
    MT_OK(nb_checkpoint_writer_free(w));
    nb_zero_free(z);
    nb_optim_free(o);
    nb_module_free(m);
    if (mt_rank == 0) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    }
    nb_scope_end();
    MT_END();
}
END_TEST

Suite *mt_suite_zero_async(void) {
    Suite *s = suite_create("zero_async");
    TCase *tc = tcase_create("zero_async");
    tcase_add_test(tc, test_zero_async_index_last);
    suite_add_tcase(s, tc);
    return s;
}
