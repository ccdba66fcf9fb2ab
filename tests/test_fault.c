/* test_fault.c - fault tolerance (docs/checkpoints.md): the graceful stop's signal handling
 * (nabla/stop.h); checkpoint integrity (checksums, run id); series of checkpoints (rotation,
 * the newest intact one). The programs' use of it is checked end to end by tools/check-stop. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nabla/stop.h"
#include "testutil.h"

/* A signal only records the request; the process goes on; the agreement on one rank is
 * the local request; uninstall restores the default action. */
/* Send sig to the process (as kill, Slurm and mpirun do) and wait until it is recorded: the
 * stop signals are taken by nabla's signal thread, not by a handler in this thread. */
static int send_and_wait(int sig) {
    kill(getpid(), sig);
    for (int i = 0; i < 2000 && nb_stop_requested() != sig; i++) usleep(1000);
    return nb_stop_requested();
}

START_TEST(test_stop_signal_recorded) {
    nb_stop_request(0);
    ck_assert_int_eq(nb_stop_requested(), 0);
    ck_assert_msg(nb_stop_install() == NB_OK, "%s", nb_last_error());
    ck_assert(nb_stop_install() == NB_OK); /* again: a no-op */
    ck_assert_int_eq(send_and_wait(SIGTERM), SIGTERM);
    nb_comm *world = nb_comm_world(); /* one rank in the unit tests */
    ck_assert(world && nb_comm_size(world) == 1);
    double v = 3.5;
    int sig = -1;
    ck_assert(nb_stop_sync(world, &v, &sig) == NB_OK);
    ck_assert(v == 3.5 && sig == SIGTERM);
    ck_assert_int_eq(nb_stop_sync(world, &v, NULL), NB_ENULL);
    nb_clear_error();
    nb_comm_free(world);
    ck_assert_str_eq(nb_stop_signal_name(SIGTERM), "SIGTERM");
    ck_assert_str_eq(nb_stop_signal_name(SIGUSR1), "SIGUSR1");
    ck_assert_str_eq(nb_stop_signal_name(40), "signal 40");
    nb_stop_request(0);
    ck_assert_int_eq(nb_stop_requested(), 0);
    nb_stop_request(SIGUSR1);
    ck_assert_int_eq(nb_stop_requested(), SIGUSR1);
    nb_stop_uninstall();
    ck_assert_int_eq(nb_stop_requested(), 0);
    /* the previous (default) action is back: SIGUSR1 ends a child */
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) {
        raise(SIGUSR1);
        _exit(0);
    }
    int status;
    ck_assert(waitpid(pid, &status, 0) == pid);
    ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGUSR1);
}
END_TEST

/* A second signal while the first is pending ends the process at once with 128 + signal. */
START_TEST(test_stop_second_signal_exits) {
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY); /* the handler's message */
        if (fd >= 0) dup2(fd, STDERR_FILENO);
        if (nb_stop_install() != NB_OK) _exit(1);
        if (send_and_wait(SIGINT) != SIGINT) _exit(2);
        kill(getpid(), SIGINT);
        sleep(5);
        _exit(3); /* not reached */
    }
    int status;
    ck_assert(waitpid(pid, &status, 0) == pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGINT, "status %d", status);
}
END_TEST

/* ---- integrity -------------------------------------------------------------------------- */
typedef struct {
    nb_generator *gen;
    nb_module *model;
    nb_optim *opt;
} small_run;

static void small_init(small_run *r, uint64_t seed) {
    r->gen = nb_generator_new(seed);
    nb_linear_opts lo = nb_linear_defaults();
    lo.gen = r->gen;
    r->model = nb_sequential_new(nb_linear_new(4, 8, &lo), nb_gelu_new(false),
                                 nb_linear_new(8, 3, &lo), NULL);
    nb_adamw_opts ao = nb_adamw_defaults();
    r->opt = nb_adamw_new(nb_parameters(r->model), &ao);
    ck_assert_msg(r->model && r->opt, "%s", nb_last_error());
}

/* One AdamW step on a fixed batch. */
static void small_step(small_run *r) {
    nb_scope_begin();
    nb_generator *g = nb_generator_new(7);
    nb_tensor *x = nb_randn((int64_t[]){5, 4}, 2, NB_F32, g);
    nb_tensor *y = nb_randint((int64_t[]){5}, 1, NB_I64, 0, 3, g);
    nb_tensor *loss = nb_cross_entropy(nb_forward(r->model, x), y, NULL);
    ck_assert(nb_zero_grad(r->opt) == NB_OK && nb_backward(loss) == NB_OK);
    ck_assert(nb_step(r->opt) == NB_OK);
    nb_generator_free(g);
    nb_scope_end();
}

static void small_free(small_run *r) {
    nb_optim_free(r->opt);
    nb_module_free(r->model);
    nb_generator_free(r->gen);
}

static float first_weight(nb_module *m) {
    float v[4 * 8]; /* the first layer's weight */
    nb_tensor *w = nb_parameters(m)->tensors[0];
    ck_assert_int_eq(nb_numel(w), 32);
    ck_assert(nb_read(w, v, 32, NB_F32) == NB_OK);
    return v[0];
}

/* Size of the file and of its header (8 + the JSON length). */
static void file_layout(const char *path, long *size, long *data_begin) {
    FILE *f = fopen(path, "rb");
    ck_assert(f);
    unsigned char h[8];
    ck_assert(fread(h, 1, 8, f) == 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | h[i];
    ck_assert(fseek(f, 0, SEEK_END) == 0);
    *size = ftell(f);
    *data_begin = 8 + (long)n;
    fclose(f);
}

static void flip_byte(const char *path, long at) {
    FILE *f = fopen(path, "r+b");
    ck_assert(f);
    ck_assert(fseek(f, at, SEEK_SET) == 0);
    int c = fgetc(f);
    ck_assert(c != EOF);
    ck_assert(fseek(f, at, SEEK_SET) == 0);
    ck_assert(fputc(c ^ 0x10, f) != EOF);
    ck_assert(fclose(f) == 0);
}

/* Checkpoints carry a checksum per tensor and the run id; a bit flip anywhere in the data
 * or a truncation is refused with a clear error before anything changes; the run id is
 * adopted on load and a file of another run refused once the run has one. */
START_TEST(test_checkpoint_integrity) {
    char *dir = tu_make_dir(), *path = tu_path_in(dir, "run.ckpt"),
         *copy = tu_path_in(dir, "copy.ckpt");
    small_run a, b;
    small_init(&a, 1);
    small_step(&a);
    nb_checkpoint ca = {.model = a.model, .optim = a.opt, .step = 1};
    ck_assert_msg(nb_checkpoint_save(path, &ca) == NB_OK, "%s", nb_last_error());
    /* every tensor checksummed, the run id recorded */
    nb_safetensors *f = nb_safetensors_open(path);
    ck_assert(f);
    int checked = -1;
    ck_assert(nb_safetensors_verify(f, &checked) == NB_OK);
    ck_assert_int_eq(checked, nb_safetensors_count(f));
    ck_assert_int_ge(checked, 4 + 2 * 4); /* 4 parameters, 2 AdamW moments each, step */
    const char *rid = nb_safetensors_metadata(f, "run_id");
    ck_assert(rid && strlen(rid) == 32);
    ck_assert_str_eq(rid, nb_checkpoint_run_id(&ca));
    nb_safetensors_close(f);

    /* a clean load adopts the run id */
    small_init(&b, 2);
    nb_checkpoint cb = {.model = b.model, .optim = b.opt};
    ck_assert_msg(nb_checkpoint_load(path, &cb) == NB_OK, "%s", nb_last_error());
    ck_assert_str_eq(cb.run_id, nb_checkpoint_run_id(&ca));
    ck_assert(first_weight(b.model) == first_weight(a.model));
    /* another run's file is refused once the run has an id */
    nb_checkpoint cother = cb;
    snprintf(cother.run_id, sizeof cother.run_id, "%s", "0123456789abcdef0123456789abcdef");
    ck_assert_int_eq(nb_checkpoint_load(path, &cother), NB_EINVAL);
    ck_assert(strstr(nb_last_error(), "belongs to run") != NULL);
    nb_clear_error();

    /* one bit flipped in each tensor's bytes (first, middle, last byte of the data) */
    long size, begin;
    file_layout(path, &size, &begin);
    long where[3] = {begin, begin + (size - begin) / 2, size - 1};
    small_step(&b); /* b's weights now differ from the file's */
    float before = first_weight(b.model);
    for (int k = 0; k < 3; k++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "cp '%s' '%s'", path, copy);
        ck_assert(system(cmd) == 0);
        flip_byte(copy, where[k]);
        nb_checkpoint cc = {.model = b.model, .optim = b.opt};
        ck_assert_int_eq(nb_checkpoint_load(copy, &cc), NB_EFORMAT);
        ck_assert_msg(strstr(nb_last_error(), "is corrupt: the bytes of tensor") &&
                          strstr(nb_last_error(), copy),
                      "%s", nb_last_error());
        nb_clear_error();
        ck_assert(first_weight(b.model) == before); /* nothing changed */
    }
    /* truncated: the reader's error names the file */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", path, copy);
    ck_assert(system(cmd) == 0);
    ck_assert(truncate(copy, size - 5) == 0);
    nb_checkpoint cc = {.model = b.model, .optim = b.opt};
    ck_assert(nb_checkpoint_load(copy, &cc) != NB_OK);
    ck_assert_msg(strstr(nb_last_error(), copy), "%s", nb_last_error());
    nb_clear_error();
    ck_assert(first_weight(b.model) == before);
    small_free(&a);
    small_free(&b);
    free(path);
    free(copy);
    tu_rm_dir(dir);
}
END_TEST

/* ---- series: rotation and the newest valid checkpoint ------------------------------------------ */
START_TEST(test_checkpoint_series) {
    char *dir = tu_make_dir(), *sub = tu_path_in(dir, "ckpts/"), *base = tu_path_in(dir, "run.ckpt");
    char path[4096];
    int64_t step = 0;
    ck_assert(nb_checkpoint_path(base, 120, path, sizeof path) == NB_OK);
    ck_assert(strstr(path, "/run-00000120.ckpt") != NULL);
    ck_assert(nb_checkpoint_path(sub, 7, path, sizeof path) == NB_OK);
    ck_assert(strstr(path, "/ckpts/checkpoint-00000007.ckpt") != NULL);
    /* nothing yet: not an error */
    ck_assert(nb_checkpoint_latest(sub, path, sizeof path, &step) == NB_OK);
    ck_assert(path[0] == 0 && step == -1);

    small_run a;
    small_init(&a, 1);
    nb_checkpoint c = {.model = a.model, .optim = a.opt};
    for (int k = 1; k <= 5; k++) { /* the directory is created by the first save */
        small_step(&a);
        c.step = 10 * k;
        c.keep = 3;
        ck_assert_msg(nb_checkpoint_save(sub, &c) == NB_OK, "%s", nb_last_error());
        ck_assert(nb_checkpoint_path(sub, c.step, path, sizeof path) == NB_OK);
        ck_assert_int_eq(access(path, F_OK), 0);
    }
    ck_assert_int_eq(tu_count_files(sub), 3); /* 30, 40, 50 */
    ck_assert(nb_checkpoint_latest(sub, path, sizeof path, &step) == NB_OK);
    ck_assert_int_eq(step, 50);
    ck_assert(strstr(path, "checkpoint-00000050.ckpt") != NULL);
    /* the newest bit-flipped, the next truncated: the third is used */
    char p50[4096], p40[4096], p30[4096];
    nb_checkpoint_path(sub, 50, p50, sizeof p50);
    nb_checkpoint_path(sub, 40, p40, sizeof p40);
    nb_checkpoint_path(sub, 30, p30, sizeof p30);
    long size, begin;
    file_layout(p50, &size, &begin);
    flip_byte(p50, size - 2);
    ck_assert(truncate(p40, size / 2) == 0);
    ck_assert(nb_checkpoint_latest(sub, path, sizeof path, &step) == NB_OK);
    ck_assert_int_eq(step, 30);
    ck_assert_str_eq(path, p30);
    /* rotation counts files, not good ones: the next save keeps 40, 50 and itself */
    c.step = 60;
    ck_assert(nb_checkpoint_save(sub, &c) == NB_OK);
    ck_assert_int_eq(tu_count_files(sub), 3);
    ck_assert(nb_checkpoint_latest(sub, path, sizeof path, &step) == NB_OK && step == 60);
    /* a plain file competes by its step */
    c.step = 70;
    c.keep = 0;
    ck_assert(nb_checkpoint_save(base, &c) == NB_OK);
    c.step = 20;
    c.keep = 1;
    ck_assert(nb_checkpoint_save(base, &c) == NB_OK);
    ck_assert(nb_checkpoint_latest(base, path, sizeof path, &step) == NB_OK);
    ck_assert_int_eq(step, 70);
    ck_assert_str_eq(path, base);
    c.keep = -1;
    ck_assert_int_eq(nb_checkpoint_save(base, &c), NB_EINVAL);
    nb_clear_error();
    small_free(&a);
    /* tu_rm_dir removes files, not subdirectories */
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert(system(cmd) == 0);
    free(sub);
    free(base);
    free(dir);
}
END_TEST

Suite *nb_suite_fault(void) {
    Suite *s = suite_create("fault");
    TCase *tc = tcase_create("stop");
    tcase_add_test(tc, test_stop_signal_recorded);
    tcase_add_test(tc, test_stop_second_signal_exits);
    suite_add_tcase(s, tc);
    tc = tcase_create("integrity");
    tcase_add_test(tc, test_checkpoint_integrity);
    tcase_add_test(tc, test_checkpoint_series);
    suite_add_tcase(s, tc);
    return s;
}
