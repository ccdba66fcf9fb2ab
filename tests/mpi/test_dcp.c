/* test_dcp.c - the one checkpoint (nabla/checkpoint.h) across layouts, in nabla_mpi_tests (1,
 * 2 and 4 ranks, and alone). The layouts are a table (dcp_layouts.h): one process, DDP, ZeRO
 * 1-3 (also on half the ranks), tensor parallel by plan (with a fused layer in blocks), and
 * flat shards set through placements by hand.
 *   - exact: a trained state passed through every layout (load, save) comes back bit for bit,
 *     and each layout's checkpoint consolidates to exactly that state;
 *   - training: a chain of layouts, each resuming the last one's checkpoint and training on,
 *     ends with the weights of one process trained straight through;
 *   - asynchronous saves of several ranks: the index appears only once every rank's file is
 *     durable, the result is the synchronous save's state;
 *   - series (keep, latest) of folders, stale temporary files, precision changes. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dcp_layouts.h"

/* The reference: one process trained `steps` steps from seed 7, saved (plain) at path by
 * rank 0; *out keeps it when given (rank 0). */
static void reference(const char *path, int steps, dcp_layout *out) {
    dcp_layout l;
    dcp_layout_build(&l, L_ONE, 7);
    for (int i = 0; i < steps; i++) dcp_layout_train(&l, i);
    if (l.active && path) {
        nb_checkpoint ck = dcp_layout_ck(&l, steps);
        MT_OK(nb_checkpoint_save(path, &ck));
    }
    if (out) *out = l;
    else dcp_layout_free(&l);
}

/* ---- exact round trips ------------------------------------------------------------------- */
START_TEST(test_dcp_exact_chain) {
    static const dcp_kind_t chain[] = {L_Z3, L_TP, L_TPB, L_FLAT, L_TPFLAT, L_Z1,
                                       L_Z3H, L_DDP, L_Z2, L_ONE};
    enum { N = sizeof chain / sizeof *chain, STEPS = 3 };
    nb_scope_begin();
    char tmp[64], first[128], prev[128], path[128], cons[128], why[256];
    mt_tmpdir(tmp, "nb-dcp");
    snprintf(first, sizeof first, "%s/p0.ckpt", tmp);
    reference(first, STEPS, NULL);
    snprintf(prev, sizeof prev, "%s", first);
    for (int i = 0; i < N; i++) {
        dcp_layout l;
        dcp_layout_build(&l, chain[i], 50 + (uint64_t)i); /* other weights: the load must win */
        snprintf(path, sizeof path, "%s/%d.ckpt", tmp, i);
        if (l.active) {
            nb_checkpoint ck = dcp_layout_ck(&l, 0);
            MT_OK(nb_checkpoint_load(prev, &ck));
            MT_CHECK(ck.step == STEPS, "%s: loaded step %lld", dcp_layout_names[chain[i]],
                     (long long)ck.step);
            MT_OK(nb_checkpoint_save(path, &ck));
        }
        dcp_layout_free(&l);
        mt_barrier();
        /* what each layout wrote is the same state */
        snprintf(cons, sizeof cons, "%s/c%d.ckpt", tmp, i);
        if (mt_rank == 0) {
            MT_OK(nb_checkpoint_consolidate(path, cons, false));
            MT_CHECK(dcp_same_tensors(first, cons, why, sizeof why), "%s: %s",
                     dcp_layout_names[chain[i]], why);
        }
        snprintf(prev, sizeof prev, "%s", path);
    }
    if (mt_rank == 0) MT_CHECK(dcp_same_tensors(first, prev, why, sizeof why), "end: %s", why);
    mt_barrier();
    if (mt_rank == 0) mt_rmtree(tmp);
    nb_scope_end();
    MT_END();
}
END_TEST

/* ---- continued training ---------------------------------------------------------------- */
START_TEST(test_dcp_training_chain) {
    static const dcp_kind_t chain[] = {L_ONE, L_Z3, L_TP, L_DDP, L_Z1, L_Z3H, L_Z2, L_ONE};
    enum { N = sizeof chain / sizeof *chain, K = 2 };
    nb_scope_begin();
    char tmp[64], prev[128] = "", path[128];
    mt_tmpdir(tmp, "nb-dcp");
    int step = 0;
    for (int i = 0; i < N; i++) {
        dcp_layout l;
        dcp_layout_build(&l, chain[i], i == 0 ? 7 : 60 + (uint64_t)i);
        snprintf(path, sizeof path, "%s/t%d.ckpt", tmp, i);
        if (l.active) {
            nb_checkpoint ck = dcp_layout_ck(&l, 0);
            if (prev[0]) {
                MT_OK(nb_checkpoint_load(prev, &ck));
                MT_CHECK(ck.step == step, "%s resumed at %lld, not %d", dcp_layout_names[chain[i]],
                         (long long)ck.step, step);
            }
            for (int s = 0; s < K; s++) dcp_layout_train(&l, step + s);
            ck.step = step + K;
            MT_OK(nb_checkpoint_save(path, &ck));
        }
        if (i == N - 1 && l.active) { /* one process at the end: against the straight run */
            dcp_layout ref;
            dcp_layout_build(&ref, L_ONE, 7);
            for (int s = 0; s < step + K; s++) dcp_layout_train(&ref, s);
            dcp_expect_close(l.m, ref.m, 1e-5, "the chain of layouts vs one process");
            dcp_layout_free(&ref);
        }
        dcp_layout_free(&l);
        mt_barrier();
        step += K;
        snprintf(prev, sizeof prev, "%s", path);
    }
    mt_barrier();
    if (mt_rank == 0) mt_rmtree(tmp);
    nb_scope_end();
    MT_END();
}
END_TEST

/* ---- asynchronous saves of several ranks ---------------------------------------------------- */
/* The step a checkpoint loads at in one process (-1: it does not load). */
static int64_t loaded_step(const char *path) {
    nb_generator *g = nb_generator_new(3);
    nb_linear_opts o = nb_linear_defaults();
    o.gen = g;
    nb_module *m = nb_sequential_new(nb_linear_new(8, 16, &o), nb_gelu_new(false),
                                     nb_linear_new(16, 16, &o), nb_linear_new(16, 4, &o), NULL);
    nb_generator_free(g);
    nb_checkpoint ck = {.model = m, .program = "test"};
    int64_t step = nb_checkpoint_load(path, &ck) == NB_OK ? ck.step : -1;
    nb_clear_error();
    nb_module_free(m);
    return step;
}

static int count_entries(const char *dir, const char *prefix) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls '%s' 2>/dev/null | grep -c '^%s' > '%s/.count'", dir, prefix,
             dir);
    if (system(cmd) < 0) return -1;
    snprintf(cmd, sizeof cmd, "%s/.count", dir);
    FILE *f = fopen(cmd, "r");
    int n = -1;
    if (f && fscanf(f, "%d", &n) != 1) n = -1;
    if (f) fclose(f);
    unlink(cmd);
    return n;
}

START_TEST(test_dcp_async) {
    static const dcp_kind_t kinds[] = {L_Z3, L_TP, L_DDP};
    nb_scope_begin();
    char tmp[64], dir[128], sync_dir[128], a[128], b[128], why[256];
    mt_tmpdir(tmp, "nb-dcp");
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        const char *name = dcp_layout_names[kinds[k]];
        snprintf(dir, sizeof dir, "%s/async%zu.ckpt", tmp, k);
        snprintf(sync_dir, sizeof sync_dir, "%s/sync%zu.ckpt", tmp, k);
        dcp_layout l;
        dcp_layout_build(&l, kinds[k], 7);
        setenv("NB_TEST_SLOW_WRITE_MS", "150", 1);
        nb_checkpoint_writer *w = nb_checkpoint_writer_new(NULL);
        unsetenv("NB_TEST_SLOW_WRITE_MS");
        MT_CHECK(w != NULL, "writer: %s", nb_last_error());
        nb_checkpoint_writer_opts wo = nb_checkpoint_writer_defaults();
        wo.policy = NB_CKPT_SKIP;
        /* a writer of NB_CKPT_SKIP cannot serve a save of several ranks */
        nb_checkpoint_writer *ws = nb_checkpoint_writer_new(&wo);
        nb_checkpoint ck = dcp_layout_ck(&l, 1);
        if (mt_size > 1) {
            nb_status st = nb_checkpoint_writer_save(ws, dir, &ck);
            MT_CHECK(st == NB_EINVAL && strstr(nb_last_error(), "NB_CKPT_WAIT"), "%s: skip: %s",
                     name, nb_last_error());
            nb_clear_error();
        }
        MT_OK(nb_checkpoint_writer_free(ws));
        bool folder = kinds[k] != L_DDP;
        for (int s = 1; s <= 2 && w; s++) {
            dcp_layout_train(&l, s);
            ck.step = s;
            MT_OK(nb_checkpoint_writer_save(w, dir, &ck));
            mt_barrier();
            /* the index of this save is not there yet: an earlier one (or none) loads */
            if (mt_rank == 0 && folder)
                MT_CHECK(loaded_step(dir) < s, "%s: before the save completes, %s loads at "
                         "step %lld", name, dir, (long long)loaded_step(dir));
            mt_barrier();
        }
        MT_OK(nb_checkpoint_writer_wait(w)); /* collective: the last index */
        MT_CHECK(mt_rank != 0 || loaded_step(dir) == 2, "%s: after the wait: step %lld", name,
                 (long long)loaded_step(dir));
        nb_checkpoint_writer_stats st;
        nb_checkpoint_writer_get_stats(w, &st);
        MT_CHECK(st.saves == 2 && st.failed == 0, "%s: stats %lld saves, %lld failed", name,
                 (long long)st.saves, (long long)st.failed);
        /* a series (keep 2): each save's index is written, and the series rotated, while the
         * next save's folder (no index yet) is being written: that folder must stay */
        char series[128], latest[4400];
        snprintf(series, sizeof series, "%s/aseries%zu/", tmp, k);
        nb_checkpoint cs = ck;
        cs.keep = 2;
        for (int s = 3; s <= 5 && w; s++) {
            cs.step = s;
            MT_OK(nb_checkpoint_writer_save(w, series, &cs));
        }
        MT_OK(nb_checkpoint_writer_wait(w));
        int64_t last = -1;
        MT_OK(nb_checkpoint_latest(series, latest, sizeof latest, &last));
        MT_CHECK(last == 5, "%s: async series: latest step %lld (%s)", name, (long long)last,
                 latest);
        if (mt_rank == 0) {
            snprintf(a, sizeof a, "%s/aseries%zu", tmp, k);
            MT_CHECK(count_entries(a, "checkpoint-") == 2, "%s: async keep 2 left %d members",
                     name, count_entries(a, "checkpoint-"));
        }
        mt_barrier();
        MT_OK(nb_checkpoint_writer_free(w));
        MT_OK(nb_checkpoint_save(sync_dir, &ck)); /* the same state, synchronously */
        mt_barrier();
        snprintf(a, sizeof a, "%s/a%zu.ckpt", tmp, k);
        snprintf(b, sizeof b, "%s/b%zu.ckpt", tmp, k);
        if (mt_rank == 0) {
            MT_OK(nb_checkpoint_consolidate(dir, a, false));
            MT_OK(nb_checkpoint_consolidate(sync_dir, b, false));
            MT_CHECK(dcp_same_tensors(a, b, why, sizeof why), "%s: async vs sync: %s", name, why);
        }
        dcp_layout_free(&l);
        mt_barrier();
    }
    if (mt_rank == 0) mt_rmtree(tmp);
    nb_scope_end();
    MT_END();
}
END_TEST

/* ---- series of folders, stale temporary files ------------------------------------------------ */
START_TEST(test_dcp_series) {
    nb_scope_begin();
    char tmp[64], base[128], path[4400], p4[4400], p3[4400];
    mt_tmpdir(tmp, "nb-dcp");
    snprintf(base, sizeof base, "%s/series/", tmp);
    dcp_layout l;
    dcp_layout_build(&l, L_Z2, 7);
    for (int s = 1; s <= 3; s++) {
        dcp_layout_train(&l, s);
        nb_checkpoint ck = dcp_layout_ck(&l, s);
        ck.keep = 2;
        MT_OK(nb_checkpoint_save(base, &ck));
    }
    mt_barrier();
    int64_t step = -1;
    MT_OK(nb_checkpoint_latest(base, path, sizeof path, &step));
    MT_CHECK(step == 3, "latest step %lld (%s)", (long long)step, path);
    if (mt_rank == 0) {
        char sub[160];
        snprintf(sub, sizeof sub, "%s/series", tmp);
        MT_CHECK(count_entries(sub, "checkpoint-") == 2, "keep 2 left %d members",
                 count_entries(sub, "checkpoint-"));
        /* an unfinished save of step 4 (a folder without index) and a damaged step 3 */
        MT_OK(nb_checkpoint_path(base, 4, p4, sizeof p4));
        MT_CHECK(mkdir(p4, 0777) == 0, "mkdir %s", p4);
        MT_OK(nb_checkpoint_path(base, 3, p3, sizeof p3));
        char cmd[9000]; /* a folder's first file (one rank: the file itself) */
        snprintf(cmd, sizeof cmd, "f=$(ls -d %s/shard-*.safetensors %s 2>/dev/null | head -1) && "
                 "python3 -c 'import sys; p=sys.argv[1]; b=bytearray(open(p,\"rb\").read()); "
                 "b[-5]^=1; open(p,\"wb\").write(b)' \"$f\"", p3, mt_size > 1 ? "" : p3);
        MT_CHECK(system(cmd) == 0, "flipping a byte failed");
    }
    mt_barrier();
    MT_OK(nb_checkpoint_latest(base, path, sizeof path, &step));
    MT_CHECK(step == 2, "latest with an unfinished 4 and a damaged 3: step %lld (%s)",
             (long long)step, path);
    /* stale temporary files of a killed writer: the next save and a load remove them */
    mt_barrier();
    char stale[4600];
    pid_t dead = 0;
    if (mt_rank == 0) {
        dead = fork();
        if (dead == 0) _exit(0);
        MT_CHECK(dead > 0, "fork");
        int status;
        waitpid(dead, &status, 0);
        if (mt_size > 1)
            snprintf(stale, sizeof stale, "%s/shard-0123456789abcdef-00000-of-00002.safetensors"
                     ".tmp-%d-0", path, (int)dead);
        else /* one rank: a plain file */
            snprintf(stale, sizeof stale, "%s.tmp-%d-0", path, (int)dead);
        FILE *f = fopen(stale, "w");
        if (f) fputs("half a file", f), fclose(f);
        MT_CHECK(f != NULL, "planting %s", stale);
    }
    mt_barrier();
    nb_checkpoint ck = dcp_layout_ck(&l, 0);
    MT_OK(nb_checkpoint_load(path, &ck));
    MT_CHECK(ck.step == 2, "loaded step %lld", (long long)ck.step);
    mt_barrier();
    if (mt_rank == 0) MT_CHECK(access(stale, F_OK) != 0, "a load left %s", stale);
    if (mt_rank == 0) { /* again, for the save */
        FILE *f = fopen(stale, "w");
        if (f) fclose(f);
    }
    mt_barrier();
    ck.keep = 0;
    MT_OK(nb_checkpoint_save(path, &ck)); /* into the same folder: the old files go */
    mt_barrier();
    if (mt_rank == 0) {
        MT_CHECK(access(stale, F_OK) != 0, "a save left %s", stale);
        int files = mt_size > 1 ? count_entries(path, "shard-") : 1;
        MT_CHECK(mt_size == 1 || files == mt_size, "%d shard files after a save into the "
                 "folder, %d ranks", files, mt_size);
    }
    dcp_layout_free(&l);
    mt_barrier();
    if (mt_rank == 0) mt_rmtree(tmp);
    nb_scope_end();
    MT_END();
}
END_TEST

/* ---- precision ----------------------------------------------------------------------------- */
static nb_module *mlp_of(uint64_t seed, nb_dtype dt) {
    nb_generator *g = nb_generator_new(seed);
    nb_linear_opts lo = nb_linear_defaults();
    lo.gen = g, lo.dtype = dt;
    nb_module *m = nb_sequential_new(nb_linear_new(8, 16, &lo), nb_gelu_new(false),
                                     nb_linear_new(16, 16, &lo), nb_linear_new(16, 4, &lo), NULL);
    nb_generator_free(g);
    MT_CHECK(m != NULL, "model: %s", nb_last_error());
    return m;
}

static nb_optim *plain_adamw(nb_module *m) {
    nb_adamw_opts ao = nb_adamw_defaults();
    ao.lr = 1e-2;
    return nb_adamw_new(nb_parameters(m), &ao);
}

/* bf16 parameters trained with AdamW (f32 masters) under ZeRO-1, saved; loaded into an f32
 * model in one process: its parameters are the masters, bit for bit (not their rounding).
 * And back: that f32 checkpoint into a bf16 model with an optimizer gives masters that equal
 * the f32 values. */
START_TEST(test_dcp_precision) {
    nb_scope_begin();
    char tmp[64], dir[128], plain[128], cons[160];
    mt_tmpdir(tmp, "nb-dcp");
    snprintf(dir, sizeof dir, "%s/bf16.ckpt", tmp);
    snprintf(plain, sizeof plain, "%s/f32.ckpt", tmp);
    snprintf(cons, sizeof cons, "%s/cons.ckpt", tmp);
    nb_module *hm = mlp_of(7, NB_BF16);
    nb_optim *ho = plain_adamw(hm);
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = 1, zo.bucket_mb = 200e-6;
    nb_zero *z = nb_zero_new(hm, ho, mt_world, &zo);
    MT_CHECK(ho && z, "bf16 zero: %s", nb_last_error());
    for (int s = 0; s < 2 && z; s++) {
        nb_scope_begin();
        nb_generator *g = nb_generator_new(100 + (uint64_t)s);
        nb_tensor *x = nb_to_dtype(nb_randn((int64_t[]){16, 8}, 2, NB_F32, g), NB_BF16);
        nb_tensor *y = nb_randint((int64_t[]){16}, 1, NB_I64, 0, 4, g);
        nb_generator_free(g);
        int64_t n = 16 / mt_size;
        nb_tensor *loss = nb_cross_entropy(nb_forward(hm, nb_narrow(x, 0, mt_rank * n, n)),
                                           nb_narrow(y, 0, mt_rank * n, n), NULL);
        MT_OK(nb_zero_grad(ho));
        MT_OK(nb_backward(loss));
        MT_OK(nb_step(ho));
        nb_scope_end();
    }
    nb_checkpoint ck = {.model = hm, .optim = ho, .step = 2};
    if (z) MT_OK(nb_checkpoint_save(dir, &ck));
    mt_barrier();
    if (mt_rank == 0) {
        MT_OK(nb_checkpoint_consolidate(dir, cons, false));
        nb_safetensors *f = nb_safetensors_open(cons);
        MT_CHECK(f != NULL, "open %s: %s", cons, nb_last_error());
        nb_module *m1 = mlp_of(3, NB_F32);
        nb_optim *o1 = plain_adamw(m1);
        nb_checkpoint c1 = {.model = m1, .optim = o1};
        MT_OK(nb_checkpoint_load(dir, &c1));
        const nb_params *ps = nb_parameters(m1);
        for (int i = 0; f && i < ps->count; i++) {
            char name[128];
            snprintf(name, sizeof name, "optim.master.%s", ps->names[i]);
            nb_scope_begin();
            nb_tensor *mst = nb_safetensors_get(f, name);
            nb_tensor *d = mst ? nb_amax(nb_abs(nb_sub(mst, ps->tensors[i])), NULL, 0, false)
                               : NULL;
            MT_CHECK(d && nb_item_f64(d) == 0, "%s: the f32 model is not the master (%s)",
                     ps->names[i], d ? "differs" : nb_last_error());
            nb_scope_end();
        }
        nb_safetensors_close(f);
        /* f32 -> bf16 with an optimizer: the masters come from the f32 values */
        c1.step = 2;
        MT_OK(nb_checkpoint_save(plain, &c1));
        nb_module *m2 = mlp_of(5, NB_BF16);
        nb_optim *o2 = plain_adamw(m2);
        nb_checkpoint c2 = {.model = m2, .optim = o2};
        MT_OK(nb_checkpoint_load(plain, &c2));
        const nb_params *st = nb_optim_state(o2);
        int masters = 0;
        for (int i = 0; st && i < st->count; i++) {
            if (strncmp(st->names[i], "master.", 7) != 0) continue;
            masters++;
            nb_tensor *want = nb_module_find(m1, st->names[i] + 7);
            nb_scope_begin();
            nb_tensor *d = want ? nb_amax(nb_abs(nb_sub(st->tensors[i], want)), NULL, 0, false)
                                : NULL;
            MT_CHECK(d && nb_item_f64(d) == 0, "%s is not the f32 value", st->names[i]);
            nb_scope_end();
        }
        MT_CHECK(masters == ps->count, "%d masters after loading f32 into bf16", masters);
        nb_optim_free(o2);
        nb_module_free(m2);
        nb_optim_free(o1);
        nb_module_free(m1);
    }
    nb_zero_free(z);
    nb_optim_free(ho);
    nb_module_free(hm);
    mt_barrier();
    if (mt_rank == 0) mt_rmtree(tmp);
    nb_scope_end();
    MT_END();
}
END_TEST

Suite *mt_suite_dcp(void) {
    Suite *s = suite_create("dcp");
    TCase *tc = tcase_create("dcp");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_dcp_exact_chain);
    tcase_add_test(tc, test_dcp_training_chain);
    tcase_add_test(tc, test_dcp_async);
    tcase_add_test(tc, test_dcp_series);
    tcase_add_test(tc, test_dcp_precision);
    suite_add_tcase(s, tc);
    return s;
}
