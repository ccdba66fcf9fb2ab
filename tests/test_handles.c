/* test_handles.c - object handles used after their release (issue 31, item 5): every object
 * type of the library (checkpoint writer, module, optimizer, schedule, loss scaler, loader,
 * generator, communicator, work, safetensors file) gives an error value naming the object and
 * its free function, never a crash, when used or freed again after its release; and objects
 * that borrow others (a schedule its optimizer, a checkpoint save its model and optimizer)
 * refuse a freed one. Part of the errors suite. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "nabla/checkpoint.h"
#include "nabla/parallel.h"
#include "testutil.h"

/* The last error is NB_EFREED and says text. */
#define FREED(text)                                                                         \
    do {                                                                                    \
        ck_assert_msg(nb_last_status() == NB_EFREED && strstr(nb_last_error(), (text)),     \
                      "expected NB_EFREED with \"%s\", got %s \"%s\"", (text),              \
                      nb_status_name(nb_last_status()), nb_last_error());                   \
        nb_clear_error();                                                                   \
    } while (0)

static nb_module *small_model(void) {
    nb_module *m = nb_linear_new(4, 2, NULL);
    ck_assert_msg(m != NULL, "%s", nb_last_error());
    return m;
}

START_TEST(test_checkpoint_writer_after_free) {
    char dir[] = "/tmp/nb_handles_XXXXXX", path[64];
    ck_assert(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/a.ckpt", dir);
    nb_module *m = small_model();
    nb_checkpoint ck = {.model = m};
    nb_checkpoint_writer *w = nb_checkpoint_writer_new(NULL);
    ck_assert_ptr_nonnull(w);
    ck_assert_int_eq(nb_checkpoint_writer_save(w, path, &ck), NB_OK);
    ck_assert_int_eq(nb_checkpoint_writer_free(w), NB_OK);
    nb_clear_error();
    ck_assert_int_eq(nb_checkpoint_writer_save(w, path, &ck), NB_EFREED);
    FREED("checkpoint_writer_save: checkpoint writer used after nb_checkpoint_writer_free");
    ck_assert_int_eq(nb_checkpoint_writer_wait(w), NB_EFREED);
    FREED("checkpoint_writer_wait: checkpoint writer used after nb_checkpoint_writer_free");
    nb_checkpoint_writer_stats st;
    nb_checkpoint_writer_get_stats(w, &st);
    ck_assert_int_eq(st.saves, 0);
    FREED("checkpoint writer used after");
    ck_assert_int_eq(nb_checkpoint_writer_free(w), NB_EFREED); /* freed twice */
    FREED("checkpoint_writer_free: checkpoint writer used after nb_checkpoint_writer_free");
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 0.1;
    /* a save of a checkpoint whose model or optimizer was freed is refused */
    nb_optim *opt = nb_sgd_new(nb_parameters(m), &so);
    ck_assert_ptr_nonnull(opt);
    w = nb_checkpoint_writer_new(NULL);
    ck.optim = opt;
    nb_optim_free(opt);
    ck_assert_int_eq(nb_checkpoint_writer_save(w, path, &ck), NB_EFREED);
    FREED("checkpoint_writer_save: optimizer used after nb_optim_free");
    ck.optim = NULL;
    nb_module_free(m);
    ck_assert_int_eq(nb_checkpoint_writer_save(w, path, &ck), NB_EFREED);
    FREED("checkpoint_writer_save: module used after nb_module_free");
    ck_assert_int_eq(nb_checkpoint_writer_free(w), NB_OK);
    unlink(path);
    rmdir(dir);
}
END_TEST

START_TEST(test_module_and_optimizer_after_free) {
    nb_scope_begin();
    nb_module *m = small_model();
    nb_optim *opt = nb_adamw_new(nb_parameters(m), NULL);
    nb_sched_opts so = nb_sched_defaults(NB_SCHED_CONSTANT);
    nb_sched *s = nb_sched_new(opt, &so);
    ck_assert_msg(opt && s, "%s", nb_last_error());
    nb_module_free(m);
    ck_assert_ptr_null(nb_forward(m, nb_ones((int64_t[]){1, 4}, 2, NB_F32)));
    FREED("forward: module used after nb_module_free");
    ck_assert_ptr_null(nb_parameters(m));
    FREED("parameters: module used after nb_module_free");
    nb_module_train(m, false);
    FREED("module_train: module used after nb_module_free");
    nb_module_free(m);
    FREED("module_free: module used after nb_module_free");
    /* the schedule's optimizer freed first: the schedule refuses to step */
    nb_optim_free(opt);
    ck_assert_int_eq(nb_sched_step(s), NB_EFREED);
    FREED("sched_step: optimizer used after nb_optim_free");
    ck_assert_int_eq(nb_step(opt), NB_EFREED);
    FREED("step: optimizer used after nb_optim_free");
    ck_assert_int_eq(nb_zero_grad(opt), NB_EFREED);
    FREED("zero_grad: optimizer used after nb_optim_free");
    ck_assert_int_eq(nb_optim_set_lr(opt, 0, 0.1), NB_EFREED);
    FREED("optimizer used after nb_optim_free");
    nb_optim_free(opt);
    FREED("optim_free: optimizer used after nb_optim_free");
    nb_sched_free(s);
    ck_assert_int_eq(nb_sched_step(s), NB_EFREED);
    FREED("sched_step: schedule used after nb_sched_free");
    nb_sched_free(s);
    FREED("sched_free: schedule used after nb_sched_free");
    nb_grad_scaler *sc = nb_grad_scaler_new(NULL);
    ck_assert_ptr_nonnull(sc);
    nb_grad_scaler_free(sc);
    ck_assert_int_eq(nb_grad_scaler_update(sc), NB_EFREED);
    FREED("grad_scaler_update: grad scaler used after nb_grad_scaler_free");
    nb_scope_end();
}
END_TEST

START_TEST(test_loader_and_generator_after_free) {
    nb_scope_begin();
    nb_tensor *x = nb_ones((int64_t[]){8, 2}, 2, NB_F32), *y = nb_zeros((int64_t[]){8}, 1, NB_I64);
    nb_dataset *ds = nb_tensor_dataset_new(x, y);
    ck_assert_ptr_nonnull(ds);
    nb_loader_opts lo = nb_loader_defaults();
    lo.batch_size = 4;
    nb_loader *l = nb_loader_new(ds, &lo);
    ck_assert_ptr_nonnull(l);
    nb_loader_free(l);
    nb_batch b;
    ck_assert(!nb_loader_next(l, &b));
    FREED("loader_next: loader used after nb_loader_free");
    ck_assert_int_eq(nb_loader_error(l), NB_EFREED);
    FREED("loader used after nb_loader_free");
    nb_loader_free(l);
    FREED("loader_free: loader used after nb_loader_free");
    nb_dataset_free(ds);
    nb_generator *g = nb_generator_new(7);
    ck_assert_ptr_nonnull(g);
    nb_generator_free(g);
    ck_assert_ptr_null(nb_rand((int64_t[]){3}, 1, NB_F32, g));
    FREED("generator used after nb_generator_free");
    ck_assert_int_eq(nb_generator_set_stream(g, 2), NB_EFREED);
    FREED("generator_set_stream: generator used after nb_generator_free");
    nb_generator_free(g);
    FREED("generator_free: generator used after nb_generator_free");
    /* the thread's default generator is no handle to free */
    ck_assert_ptr_nonnull(nb_rand((int64_t[]){3}, 1, NB_F32, NULL));
    nb_scope_end();
}
END_TEST

START_TEST(test_comm_work_and_file_after_free) {
    nb_scope_begin();
    nb_comm *c = nb_comm_self();
    ck_assert_ptr_nonnull(c);
    nb_tensor *t = nb_ones((int64_t[]){4}, 1, NB_F32);
    nb_work *w = nb_allreduce_async(c, t, NB_REDUCE_SUM);
    ck_assert_int_eq(nb_work_wait(w), NB_OK);
    ck_assert_int_eq(nb_work_wait(w), NB_EFREED); /* waited twice */
    FREED("work_wait: work handle used after nb_work_wait or nb_work_free");
    nb_work_free(w);
    FREED("work_free: work handle used after");
    nb_comm_free(c);
    ck_assert_int_eq(nb_allreduce(c, t, NB_REDUCE_SUM), NB_EFREED);
    FREED("allreduce: communicator used after nb_comm_free");
    ck_assert_int_eq(nb_comm_size(c), 0);
    FREED("comm_size: communicator used after nb_comm_free");
    nb_comm_free(c);
    FREED("comm_free: communicator used after nb_comm_free");
    char dir[] = "/tmp/nb_handles_XXXXXX", path[64];
    ck_assert(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/t.safetensors", dir);
    const char *name = "t";
    ck_assert_int_eq(nb_safetensors_save(path, &name, &t, 1, NULL, NULL, 0),
                     NB_OK);
    nb_safetensors *f = nb_safetensors_open(path);
    ck_assert_ptr_nonnull(f);
    nb_safetensors_close(f);
    ck_assert_ptr_null(nb_safetensors_get(f, "t"));
    FREED("safetensors file used after nb_safetensors_close");
    ck_assert_int_eq(nb_safetensors_count(f), 0);
    FREED("safetensors_count: safetensors file used after nb_safetensors_close");
    nb_safetensors_close(f);
    FREED("safetensors_close: safetensors file used after nb_safetensors_close");
    unlink(path);
    rmdir(dir);
    nb_scope_end();
}
END_TEST

TCase *nb_tcase_handles(void) {
    TCase *tc = tcase_create("handles");
    tcase_add_test(tc, test_checkpoint_writer_after_free);
    tcase_add_test(tc, test_module_and_optimizer_after_free);
    tcase_add_test(tc, test_loader_and_generator_after_free);
    tcase_add_test(tc, test_comm_work_and_file_after_free);
    return tc;
}
