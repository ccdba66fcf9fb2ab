/* test_checkpoint.c - training checkpoints: 2N steps straight and N steps + save + load
 * into freshly built objects + N steps give bit-identical weights (model, AdamW state,
 * cosine schedule, shuffling loader position, dropout generator); a corrupt or mismatched
 * checkpoint is refused without changing anything; saving is atomic. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "nabla/checkpoint.h"
#include "nabla/optim.h"
#include "testutil.h"

typedef struct {
    nb_generator *init, *drop;
    nb_module *model;
    nb_optim *opt;
    nb_sched *sched;
    nb_dataset *ds;
    nb_loader *loader;
} run;

static void run_init(run *r, nb_tensor *x, nb_tensor *y) {
    r->init = nb_generator_new(11);
    r->drop = nb_generator_new(12);
    nb_linear_opts lo = nb_linear_defaults();
    lo.gen = r->init;
    r->model = nb_sequential_new(nb_linear_new(6, 16, &lo), nb_gelu_new(false),
                             nb_dropout_new(0.2, r->drop), nb_layer_norm_new(16, NULL),
                             nb_linear_new(16, 3, &lo), NULL);
    nb_adamw_opts ao = nb_adamw_defaults();
    ao.lr = 0.01;
    r->opt = nb_adamw_new(nb_parameters(r->model), &ao);
    nb_sched_opts so = nb_sched_defaults(NB_SCHED_COSINE);
    so.warmup_steps = 3;
    so.total_steps = 40;
    r->sched = nb_sched_new(r->opt, &so);
    r->ds = nb_tensor_dataset_new(x, y);
    nb_loader_opts lo2 = nb_loader_defaults();
    lo2.batch_size = 8, lo2.shuffle = true, lo2.seed = 5, lo2.prefetch = 1;
    r->loader = nb_loader_new(r->ds, &lo2);
    ck_assert_msg(r->model && r->opt && r->sched && r->ds && r->loader, "%s", nb_last_error());
}

static void run_free(run *r) {
    nb_loader_free(r->loader);
    nb_dataset_free(r->ds);
    nb_sched_free(r->sched);
    nb_optim_free(r->opt);
    nb_module_free(r->model);
    nb_generator_free(r->init);
    nb_generator_free(r->drop);
}

static void train_steps(run *r, int n) {
    for (int i = 0; i < n;) {
        nb_batch b;
        if (!nb_loader_next(r->loader, &b)) {
            ck_assert(nb_loader_error(r->loader) == NB_OK);
            continue; /* next epoch */
        }
        nb_scope_begin();
        /* batches are host tensors: bring them to the model's (the default) device */
        nb_tensor *x = nb_to_device(b.x, nb_default_device());
        nb_tensor *y = nb_to_device(b.y, nb_default_device());
        nb_tensor *loss = nb_cross_entropy(nb_forward(r->model, x), y, NULL);
        ck_assert(nb_zero_grad(r->opt) == NB_OK && nb_backward(loss) == NB_OK);
        ck_assert(nb_step(r->opt) == NB_OK && nb_sched_step(r->sched) == NB_OK);
        nb_scope_end();
        i++;
    }
}

static nb_checkpoint ck_of(run *r, int64_t step) {
    return (nb_checkpoint){.model = r->model, .optim = r->opt, .sched = r->sched,
                           .loader = r->loader, .gens = &r->drop, .ngens = 1, .step = step};
}

static void assert_same_params(nb_module *a, nb_module *b) {
    const nb_params *pa = nb_parameters(a), *pb = nb_parameters(b);
    ck_assert_int_eq(pa->count, pb->count);
    for (int i = 0; i < pa->count; i++) {
        /* the f32 bits, read on the host from any device */
        int64_t n = nb_numel(pa->tensors[i]);
        ck_assert_int_eq(nb_numel(pb->tensors[i]), n);
        float *va = malloc(sizeof(float) * (size_t)n), *vb = malloc(sizeof(float) * (size_t)n);
        ck_assert(nb_read(pa->tensors[i], va, n, NB_F32) == NB_OK);
        ck_assert(nb_read(pb->tensors[i], vb, n, NB_F32) == NB_OK);
        ck_assert_msg(memcmp(va, vb, (size_t)n * sizeof(float)) == 0,
                      "%s differs after resume", pa->names[i]);
        free(va);
        free(vb);
    }
}

START_TEST(test_resume_bit_exact) {
    nb_scope_begin();
    char path[] = "/tmp/nabla_ckpt_XXXXXX";
    int fd = mkstemp(path);
    ck_assert(fd >= 0);
    close(fd);
    nb_generator *dg = nb_generator_new(3);
    nb_tensor *x = nb_randn((int64_t[]){44, 6}, 2, NB_F32, dg); /* 5.5 batches: crosses epochs */
    nb_tensor *y = nb_randint((int64_t[]){44}, 1, NB_I64, 0, 3, dg);
    enum { N = 9 };
    run straight, first, second;
    run_init(&straight, x, y);
    train_steps(&straight, 2 * N);

    run_init(&first, x, y);
    train_steps(&first, N);
    nb_checkpoint c = ck_of(&first, N);
    ck_assert_msg(nb_checkpoint_save(path, &c) == NB_OK, "%s", nb_last_error());
    run_free(&first);

    run_init(&second, x, y); /* fresh objects, different state until loaded */
    train_steps(&second, 2);
    nb_checkpoint c2 = ck_of(&second, 0);
    ck_assert_msg(nb_checkpoint_load(path, &c2) == NB_OK, "%s", nb_last_error());
    ck_assert_int_eq(c2.step, N);
    train_steps(&second, N);
    assert_same_params(straight.model, second.model);
    ck_assert(nb_optim_get_lr(straight.opt, 0) == nb_optim_get_lr(second.opt, 0));
    ck_assert(nb_generator_offset(straight.drop) == nb_generator_offset(second.drop));
    run_free(&straight);
    run_free(&second);
    nb_generator_free(dg);
    unlink(path);
    nb_scope_end();
}
END_TEST

START_TEST(test_bad_checkpoints) {
    nb_scope_begin();
    char path[] = "/tmp/nabla_ckpt_XXXXXX";
    int fd = mkstemp(path);
    ck_assert(fd >= 0);
    close(fd);
    nb_generator *dg = nb_generator_new(4);
    nb_tensor *x = nb_randn((int64_t[]){16, 6}, 2, NB_F32, dg);
    nb_tensor *y = nb_randint((int64_t[]){16}, 1, NB_I64, 0, 3, dg);
    run r;
    run_init(&r, x, y);
    train_steps(&r, 3);
    nb_checkpoint c = ck_of(&r, 3);
    ck_assert(nb_checkpoint_save(path, &c) == NB_OK);
    /* a weights-only file is not a checkpoint */
    char wpath[64];
    snprintf(wpath, sizeof wpath, "%s.w", path);
    ck_assert(nb_module_save(r.model, wpath) == NB_OK);
    ck_assert_int_eq(nb_checkpoint_load(wpath, &c), NB_EFORMAT);
    ck_assert(strstr(nb_last_error(), "not a nabla checkpoint") != NULL);
    nb_clear_error();
    /* a different architecture is refused before anything changes */
    nb_module *other = nb_sequential_new(nb_linear_new(6, 8, NULL), NULL);
    nb_tensor *w = nb_module_find(other, "0.weight");
    const int64_t w00[2] = {0, 0};
    double before = nb_get_f64(w, w00);
    nb_checkpoint bad = {.model = other};
    ck_assert(nb_checkpoint_load(path, &bad) != NB_OK);
    nb_clear_error();
    ck_assert(nb_get_f64(w, w00) == before);
    nb_module_free(other);
    /* a truncated file: a clear error, no crash */
    ck_assert(truncate(path, 100) == 0);
    ck_assert(nb_checkpoint_load(path, &c) != NB_OK);
    ck_assert(strstr(nb_last_error(), path) != NULL);
    nb_clear_error();
    /* saving into a missing directory fails cleanly */
    nb_checkpoint c3 = ck_of(&r, 3);
    ck_assert_int_eq(nb_checkpoint_save("/nonexistent-dir/x.ckpt", &c3), NB_EIO);
    nb_clear_error();
    run_free(&r);
    nb_generator_free(dg);
    unlink(path);
    unlink(wpath);
    nb_scope_end();
}
END_TEST


/* The run's identity: a file written by another program, or with a setting that changes the
 * results, is refused before anything changes (naming the setting and both values) unless
 * the setting may change; names only one side has are not compared. */
START_TEST(test_checkpoint_identity) {
    nb_scope_begin();
    char *dir = tu_make_dir(), *path = tu_path_in(dir, "run.ckpt");
    nb_generator *dg = nb_generator_new(4);
    nb_tensor *x = nb_randn((int64_t[]){16, 6}, 2, NB_F32, dg);
    nb_tensor *y = nb_randint((int64_t[]){16}, 1, NB_I64, 0, 3, dg);
    run r;
    run_init(&r, x, y);
    train_steps(&r, 2);
    nb_checkpoint c = ck_of(&r, 2);
    c.program = "mlp";
    c.config_names = (const char *[]){"lr", "batch", "seed"};
    c.config_values = (const char *[]){"0.05", "256", "0"};
    c.nconfig = 3;
    ASSERT_OK(nb_checkpoint_save(path, &c));
    nb_safetensors *f = nb_safetensors_open(path);
    ck_assert_ptr_nonnull(f);
    ck_assert_str_eq(nb_safetensors_metadata(f, "program"), "mlp");
    ck_assert_str_eq(nb_safetensors_metadata(f, "config.lr"), "0.05");
    nb_safetensors_close(f);
    train_steps(&r, 1);
    const int64_t w00[2] = {0, 0};
    nb_tensor *w = nb_module_find(r.model, "0.weight");
    double before = nb_get_f64(w, w00);

    nb_checkpoint other = c;
    other.program = "cnn";
    ASSERT_ST(nb_checkpoint_load(path, &other), NB_EINVAL, "was written by mlp, not by cnn");
    nb_checkpoint lr = c;
    lr.config_values = (const char *[]){"0.1", "256", "0"};
    ASSERT_ST(nb_checkpoint_load(path, &lr), NB_EINVAL,
              "run.ckpt was written with lr=0.05; this run has lr=0.1");
    nb_checkpoint seed = c;
    seed.config_values = (const char *[]){"0.05", "256", "7"};
    seed.may_change = (const char *[]){"lr"};
    seed.nmay_change = 1;
    ASSERT_ST(nb_checkpoint_load(path, &seed), NB_EINVAL, "seed=0; this run has seed=7");
    ck_assert(nb_get_f64(w, w00) == before); /* nothing was loaded */
    /* a deliberate change of lr; a setting the file does not know */
    nb_checkpoint ok = c;
    ok.config_names = (const char *[]){"lr", "batch", "seed", "new_flag"};
    ok.config_values = (const char *[]){"0.1", "256", "0", "x"};
    ok.nconfig = 4;
    ok.may_change = (const char *[]){"lr"};
    ok.nmay_change = 1;
    ASSERT_OK(nb_checkpoint_load(path, &ok));
    ck_assert_int_eq(ok.step, 2);
    ck_assert(nb_get_f64(w, w00) != before);
    /* a temporary file of a writer killed during a save is removed by the next load too
     * (PID above pid_max: never a running process) */
    char stale_name[64];
    snprintf(stale_name, sizeof stale_name, "run.ckpt.tmp-%d-0", 1 << 23);
    char *stale = tu_path_in(dir, stale_name), *errlog = tu_path_in(dir, "stderr.txt");
    tu_write_file(stale, "half a checkpoint", 17);
    fflush(stderr);
    int saved = dup(2), fd = open(errlog, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert(saved >= 0 && fd >= 0 && dup2(fd, 2) == 2);
    close(fd);
    nb_status ls = nb_checkpoint_load(path, &ok);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    ASSERT_OK(ls);
    ck_assert_msg(access(stale, F_OK) != 0, "the stale temporary file is still there");
    size_t n;
    char *said = (char *)tu_read_file(errlog, &n);
    ck_assert_msg(strstr(said, "removed 1 stale temporary file"), "stderr: %s", said);
    free(said);
    unlink(errlog);
    free(stale);
    free(errlog);
    /* a file without identity (older, or a library user's) loads under any identity */
    nb_checkpoint plain = ck_of(&r, 2);
    ASSERT_OK(nb_checkpoint_save(path, &plain));
    ASSERT_OK(nb_checkpoint_load(path, &lr));
    run_free(&r);
    nb_generator_free(dg);
    free(path);
    tu_rm_dir(dir);
    nb_scope_end();
}
END_TEST

/* A checkpoint that cannot be written is an error naming the call, the file and the reason:
 * /dev/full (refused and left as it is; as root a copy made in a temporary directory, so that
 * a regression cannot replace the machine's own), and a write that fails half-way (the file
 * size limit, as a full disk would), which leaves the previous checkpoint as it was and no
 * temporary file. */
START_TEST(test_save_failures) {
    nb_scope_begin();
    char *dir = tu_make_dir(), *path = tu_path_in(dir, "run.ckpt");
    nb_generator *dg = nb_generator_new(5);
    nb_tensor *x = nb_randn((int64_t[]){16, 6}, 2, NB_F32, dg);
    nb_tensor *y = nb_randint((int64_t[]){16}, 1, NB_I64, 0, 3, dg);
    run r;
    run_init(&r, x, y);
    train_steps(&r, 1);
    nb_checkpoint c = ck_of(&r, 1);
    ck_assert_msg(nb_checkpoint_save(path, &c) == NB_OK, "%s", nb_last_error());
    size_t n_old, n_now;
    unsigned char *old = tu_read_file(path, &n_old);

    char *full = geteuid() == 0 ? tu_path_in(dir, "full") : strdup("/dev/full");
    if (geteuid() == 0) ck_assert(mknod(full, S_IFCHR | 0666, makedev(1, 7)) == 0);
    ck_assert_int_eq(nb_checkpoint_save(full, &c), NB_EIO);
    char want[600];
    snprintf(want, sizeof want, "checkpoint_save: %s is a character device, not a regular "
             "file; refusing to replace it", full);
    ck_assert_str_eq(nb_last_error(), want);
    nb_clear_error();
    struct stat st;
    ck_assert(lstat(full, &st) == 0 && S_ISCHR(st.st_mode));

    train_steps(&r, 1);
    c.step = 2;
    struct rlimit saved, lim;
    ck_assert(getrlimit(RLIMIT_FSIZE, &saved) == 0);
    void (*prev_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    lim = saved;
    lim.rlim_cur = n_old / 2;
    ck_assert(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    nb_status s = nb_checkpoint_save(path, &c);
    setrlimit(RLIMIT_FSIZE, &saved);
    signal(SIGXFSZ, prev_handler);
    ck_assert_int_eq(s, NB_EIO);
    snprintf(want, sizeof want, "checkpoint_save: cannot write %s: File too large", path);
    ck_assert_str_eq(nb_last_error(), want);
    nb_clear_error();
    unsigned char *now = tu_read_file(path, &n_now);
    ck_assert(n_now == n_old && memcmp(now, old, n_old) == 0);
    ck_assert_int_eq(tu_count_files(dir), geteuid() == 0 ? 2 : 1); /* no temporary file */
    free(now);
    free(old);
    free(full);
    free(path);
    run_free(&r);
    nb_generator_free(dg);
    tu_rm_dir(dir);
    nb_scope_end();
}
END_TEST

/* ---- asynchronous saves (nb_checkpoint_writer) ----------------------------------------------- */
static void same_file_bytes(const char *a, const char *b) {
    size_t na, nb;
    unsigned char *x = tu_read_file(a, &na), *y = tu_read_file(b, &nb);
    ck_assert_msg(x && y, "cannot read %s or %s", a, b);
    ck_assert_msg(na == nb && memcmp(x, y, na) == 0, "%s (%zu bytes) and %s (%zu bytes) differ",
                  a, na, b, nb);
    free(x);
    free(y);
}

/* The file of an asynchronous save has the bytes of the synchronous save of the same state,
 * taken at the snapshot: training on while the (slowed) write runs changes nothing in it. */
START_TEST(test_writer_same_bytes) {
    nb_scope_begin();
    char *dir = tu_make_dir();
    char *sync_path = tu_path_in(dir, "sync.ckpt"), *async_path = tu_path_in(dir, "async.ckpt");
    nb_generator *dg = nb_generator_new(3);
    nb_tensor *x = nb_randn((int64_t[]){44, 6}, 2, NB_F32, dg);
    nb_tensor *y = nb_randint((int64_t[]){44}, 1, NB_I64, 0, 3, dg);
    run r;
    run_init(&r, x, y);
    setenv("NB_TEST_SLOW_WRITE_MS", "200", 1); /* read by the writer's thread as it starts */
    nb_checkpoint_writer *w = nb_checkpoint_writer_new(NULL);
    unsetenv("NB_TEST_SLOW_WRITE_MS");
    ck_assert_msg(w, "%s", nb_last_error());
    for (int round = 0; round < 2; round++) { /* the second reuses the snapshot buffers */
        train_steps(&r, 3);
        nb_checkpoint c = ck_of(&r, 3 * (round + 1));
        c.program = "test";
        c.config_names = (const char *[]){"lr"}, c.config_values = (const char *[]){"0.01"};
        c.nconfig = 1;
        ck_assert_msg(nb_checkpoint_save(sync_path, &c) == NB_OK, "%s", nb_last_error());
        ck_assert_msg(nb_checkpoint_writer_save(w, async_path, &c) == NB_OK, "%s", nb_last_error());
        train_steps(&r, 2); /* while the file is written */
        ck_assert_msg(nb_checkpoint_writer_wait(w) == NB_OK, "%s", nb_last_error());
        same_file_bytes(sync_path, async_path);
    }
    nb_checkpoint_writer_stats st;
    nb_checkpoint_writer_get_stats(w, &st);
    ck_assert_int_eq(st.saves, 2);
    ck_assert_int_eq(st.written, 2);
    ck_assert_int_eq(st.skipped, 0);
    ck_assert_int_eq(st.failed, 0);
    ck_assert(st.write_ns_last >= 200000000); /* the hook's sleep is in the write, ... */
    ck_assert(st.stall_ns_last < st.write_ns_last); /* ... not in the caller's stall */
    ck_assert(nb_checkpoint_writer_free(w) == NB_OK);
    run_free(&r);
    nb_generator_free(dg);
    free(sync_path);
    free(async_path);
    tu_rm_dir(dir);
    nb_scope_end();
}
END_TEST

/* Saves after the first take no memory from the system: the snapshot buffers are reused. */
START_TEST(test_writer_no_alloc_steady) {
    nb_scope_begin();
    char *dir = tu_make_dir();
    nb_generator *dg = nb_generator_new(3);
    nb_tensor *x = nb_randn((int64_t[]){44, 6}, 2, NB_F32, dg);
    nb_tensor *y = nb_randint((int64_t[]){44}, 1, NB_I64, 0, 3, dg);
    run r;
    run_init(&r, x, y);
    train_steps(&r, 2);
    nb_checkpoint_writer *w = nb_checkpoint_writer_new(NULL);
    ck_assert_msg(w, "%s", nb_last_error());
    for (int i = 0; i < 2; i++) { /* warm-up: the buffers and the state views' cache */
        nb_checkpoint c = ck_of(&r, i);
        c.keep = 2;
        ck_assert_msg(nb_checkpoint_writer_save(w, dir, &c) == NB_OK, "%s", nb_last_error());
        ck_assert(nb_checkpoint_writer_wait(w) == NB_OK);
    }
    nb_alloc_stats a, b;
    nb_alloc_get_stats(&a);
    for (int i = 2; i < 6; i++) {
        nb_checkpoint c = ck_of(&r, i);
        c.keep = 2;
        ck_assert_msg(nb_checkpoint_writer_save(w, dir, &c) == NB_OK, "%s", nb_last_error());
        ck_assert(nb_checkpoint_writer_wait(w) == NB_OK);
    }
    nb_alloc_get_stats(&b);
    ck_assert_msg(b.system_allocs == a.system_allocs, "%lld system allocations in 4 saves",
                  (long long)(b.system_allocs - a.system_allocs));
    ck_assert_int_eq(tu_count_files(dir), 2); /* keep 2: rotated */
    char path[4096];
    int64_t step;
    ck_assert(nb_checkpoint_latest(dir, path, sizeof path, &step) == NB_OK);
    ck_assert_int_eq(step, 5);
    ck_assert(nb_checkpoint_writer_free(w) == NB_OK);
    run_free(&r);
    nb_generator_free(dg);
    tu_rm_dir(dir);
    nb_scope_end();
}
END_TEST

/* A save during a write waits for it (NB_CKPT_WAIT) or is skipped (NB_CKPT_SKIP). */
START_TEST(test_writer_policy) {
    nb_scope_begin();
    nb_generator *dg = nb_generator_new(3);
    nb_tensor *x = nb_randn((int64_t[]){44, 6}, 2, NB_F32, dg);
    nb_tensor *y = nb_randint((int64_t[]){44}, 1, NB_I64, 0, 3, dg);
    run r;
    run_init(&r, x, y);
    for (int skip = 0; skip < 2; skip++) {
        char *dir = tu_make_dir();
        setenv("NB_TEST_SLOW_WRITE_MS", "300", 1);
        nb_checkpoint_writer_opts wo = nb_checkpoint_writer_defaults();
        wo.policy = skip ? NB_CKPT_SKIP : NB_CKPT_WAIT;
        nb_checkpoint_writer *w = nb_checkpoint_writer_new(&wo);
        unsetenv("NB_TEST_SLOW_WRITE_MS");
        ck_assert_msg(w, "%s", nb_last_error());
        nb_checkpoint c1 = ck_of(&r, 1), c2 = ck_of(&r, 2);
        c1.keep = c2.keep = 5;
        ck_assert(nb_checkpoint_writer_save(w, dir, &c1) == NB_OK);
        ck_assert(nb_checkpoint_writer_save(w, dir, &c2) == NB_OK); /* during the first write */
        nb_checkpoint_writer_stats st;
        nb_checkpoint_writer_get_stats(w, &st);
        ck_assert_int_eq(st.skipped, skip);
        ck_assert_int_eq(st.saves, 2 - skip);
        if (!skip) ck_assert(st.stall_ns_last >= 100000000); /* it waited for the first */
        ck_assert(nb_checkpoint_writer_free(w) == NB_OK); /* waits for the last write */
        ck_assert_int_eq(tu_count_files(dir), 2 - skip);
        char path[4096];
        int64_t step;
        ck_assert(nb_checkpoint_latest(dir, path, sizeof path, &step) == NB_OK);
        ck_assert_int_eq(step, skip ? 1 : 2);
        tu_rm_dir(dir);
    }
    run_free(&r);
    nb_generator_free(dg);
    nb_scope_end();
}
END_TEST

/* A failed write is an error value on the next call (once), with the write's message. */
START_TEST(test_writer_errors) {
    nb_scope_begin();
    char *dir = tu_make_dir();
    char *good = tu_path_in(dir, "good.ckpt");
    char *bad = tu_path_in(dir, "missing/sub/run.ckpt"); /* its directory does not exist */
    nb_generator *dg = nb_generator_new(3);
    nb_tensor *x = nb_randn((int64_t[]){44, 6}, 2, NB_F32, dg);
    nb_tensor *y = nb_randint((int64_t[]){44}, 1, NB_I64, 0, 3, dg);
    run r;
    run_init(&r, x, y);
    nb_checkpoint c = ck_of(&r, 1);
    ASSERT_ST(nb_checkpoint_writer_save(NULL, good, &c), NB_ENULL, "the writer is NULL");
    nb_checkpoint_writer_opts wo = nb_checkpoint_writer_defaults();
    wo.policy = 7;
    tu_assert_error(nb_checkpoint_writer_new(&wo), NB_EINVAL, "unknown policy 7");
    nb_checkpoint_writer *w = nb_checkpoint_writer_new(NULL);
    ck_assert_msg(w, "%s", nb_last_error());
    ASSERT_ST(nb_checkpoint_writer_save(w, good, &(nb_checkpoint){0}), NB_ENULL,
              "the model is NULL");
    nb_checkpoint neg = c;
    neg.keep = -1;
    ASSERT_ST(nb_checkpoint_writer_save(w, good, &neg), NB_EINVAL,
              "keep must be 0 (path itself) or at least 1, got -1");

    /* reported by _wait, once */
    ASSERT_OK(nb_checkpoint_writer_save(w, bad, &c)); /* the snapshot is fine */
    ASSERT_ST(nb_checkpoint_writer_wait(w), NB_EIO, "checkpoint_save: cannot create");
    ASSERT_OK(nb_checkpoint_writer_save(w, bad, &c));
    ASSERT_ST(nb_checkpoint_writer_wait(w), NB_EIO, "missing/sub/run.ckpt");
    ASSERT_OK(nb_checkpoint_writer_wait(w));
    /* reported by the next _save (after waiting for that write), which saves nothing; the
     * one after saves */
    ASSERT_OK(nb_checkpoint_writer_save(w, bad, &c));
    ASSERT_ST(nb_checkpoint_writer_save(w, good, &c), NB_EIO, "checkpoint_save: cannot create");
    ck_assert(access(good, F_OK) != 0);
    ASSERT_OK(nb_checkpoint_writer_save(w, good, &c));
    ASSERT_OK(nb_checkpoint_writer_wait(w));
    ck_assert(access(good, F_OK) == 0);
    nb_checkpoint_writer_stats s0;
    nb_checkpoint_writer_get_stats(w, &s0);
    ck_assert_int_eq(s0.failed, 3);
    ck_assert_int_eq(s0.written, 1);
    /* reported by _free */
    ASSERT_OK(nb_checkpoint_writer_save(w, bad, &c));
    ASSERT_ST(nb_checkpoint_writer_free(w), NB_EIO, "checkpoint_save: cannot create");
    ASSERT_OK(nb_checkpoint_writer_free(NULL));
    run_free(&r);
    nb_generator_free(dg);
    free(good);
    free(bad);
    tu_rm_dir(dir);
    nb_scope_end();
}
END_TEST

Suite *nb_suite_checkpoint(void) {
    Suite *s = suite_create("checkpoint");
    TCase *tc = tcase_create("checkpoint");
    tcase_add_test(tc, test_resume_bit_exact);
    tcase_add_test(tc, test_bad_checkpoints);
    tcase_add_test(tc, test_checkpoint_identity);
    tcase_add_test(tc, test_save_failures);
    suite_add_tcase(s, tc);
    TCase *tw = tcase_create("writer");
    tcase_add_test(tw, test_writer_same_bytes);
    tcase_add_test(tw, test_writer_no_alloc_steady);
    tcase_add_test(tw, test_writer_policy);
    tcase_add_test(tw, test_writer_errors);
    suite_add_tcase(s, tw);
    return s;
}
