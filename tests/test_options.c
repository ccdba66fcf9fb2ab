/* test_options.c - the "options" suite: every public options struct (and model config) is
 * refused unless it started from its defaults (docs/conventions.md, "Options"). For each one:
 * a zero-filled struct and a compound literal with one field set are refused (NB_EINVAL, the
 * message naming the defaults function and showing the idiom), a struct of another layout
 * (the mark of another size) is refused, the defaulted struct and a copy of it are accepted,
 * and NULL still means the defaults where the API allows it. A few explicit zeros are checked
 * to be read as zeros. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

/* ---- objects the constructors need ------------------------------------------------------ */
static nb_tensor *x_in(void) { return tu_random((int64_t[]){4, 3}, 2, NB_F32, -1, 1, 1); }
static nb_module *mlp(void) {
    return nb_sequential_new(nb_linear_new(3, 4, NULL), nb_relu_new(), nb_linear_new(4, 2, NULL),
                             NULL);
}
static nb_optim *sgd(nb_module *m) {
    nb_sgd_opts o = nb_sgd_defaults();
    o.lr = 0.1;
    return nb_sgd_new(nb_parameters(m), &o);
}
static nb_module *tiny_gpt(void) {
    nb_gpt_config c = nb_gpt_config_defaults();
    c.vocab_size = 16, c.block_size = 4, c.n_layer = 1, c.n_head = 1, c.n_embd = 8;
    return nb_gpt_new(&c, NULL);
}
static nb_comm *self(void) { /* kept for the process (meshes borrow it) */
    static nb_comm *c;
    if (!c) c = nb_comm_self();
    return c;
}
static nb_mesh *mesh1(const char *dim) { return nb_mesh_new(self(), dim, (int[]){1}); }
static nb_tensor *square(nb_tensor *const *in, int n, void *ctx) {
    (void)n, (void)ctx;
    return nb_sum(nb_mul(in[0], in[0]), NULL, 0, false);
}
static nb_tensor *pipe_stage(void *ctx, int chunk, int micro, nb_tensor *input) {
    (void)chunk, (void)micro, (void)input;
    nb_tensor *w = ctx;
    return nb_sum(nb_mul(w, w), NULL, 0, false);
}
static nb_tensor *mse(nb_tensor *out, nb_tensor *y, void *ctx) {
    (void)ctx;
    return nb_mse_loss(out, y, NB_REDUCTION_MEAN);
}
static const char *tmp_idx(char *out, size_t n, const char *what, nb_tensor *t) {
    snprintf(out, n, "/tmp/nabla_options_%d_%s.idx", (int)getpid(), what);
    ASSERT_OK(nb_idx_write(out, t));
    return out;
}

/* ---- one entry per options struct: its defaults (made usable) and a call that reads it ----
 * use(o) calls the function with options o (NULL: none) and returns its status. */
typedef struct {
    const char *type, *defaults; /* as the message names them */
    size_t size;
    void (*make)(void *out); /* the defaults, plus what a call requires (SGD's lr, ...) */
    nb_status (*use)(const void *o);
    bool null_ok; /* NULL options mean the defaults */
} entry;

#define ST(ok) ((ok) ? NB_OK : nb_last_status())
#define MAKE(T, expr)                                                                              \
    static void make_##T(void *out) {                                                              \
        T o = expr;                                                                                \
        *(T *)out = o;                                                                             \
    }
#define MAKE2(T, expr, edit)                                                                       \
    static void make_##T(void *out) {                                                              \
        T o = expr;                                                                                \
        edit;                                                                                      \
        *(T *)out = o;                                                                             \
    }

MAKE(nb_backward_opts, nb_backward_defaults())
static nb_status use_backward(const void *o) {
    nb_tensor *x = x_in();
    nb_set_requires_grad(x, true);
    return nb_backward_ex(nb_sum(nb_mul(x, x), NULL, 0, false), o);
}
MAKE(nb_recompute_opts, nb_recompute_defaults())
static nb_status use_recompute(const void *o) {
    nb_tensor *x = x_in();
    nb_set_requires_grad(x, true);
    return ST(nb_recompute(square, &x, 1, NULL, o));
}
MAKE(nb_gradcheck_opts, nb_gradcheck_defaults())
static nb_status use_gradcheck(const void *o) {
    nb_tensor *x = tu_random((int64_t[]){3}, 1, NB_F64, -1, 1, 2);
    nb_set_requires_grad(x, true);
    return nb_gradcheck(square, &x, 1, NULL, o);
}
MAKE(nb_mnist_opts, nb_mnist_defaults())
static nb_status use_mnist(const void *o) {
    char ip[128], lp[128];
    nb_tensor *img = nb_zeros((int64_t[]){2, 3, 3}, 3, NB_U8);
    nb_tensor *lab = nb_zeros((int64_t[]){2}, 1, NB_U8);
    nb_dataset *ds = nb_idx_dataset_new(tmp_idx(ip, sizeof ip, "img", img),
                                        tmp_idx(lp, sizeof lp, "lab", lab), o);
    unlink(ip), unlink(lp);
    nb_status st = ST(ds);
    nb_dataset_free(ds);
    return st;
}
MAKE(nb_loader_opts, nb_loader_defaults())
static nb_status use_loader(const void *o) {
    nb_dataset *ds = nb_tensor_dataset_new(x_in(), NULL);
    nb_loader *l = nb_loader_new(ds, o);
    nb_status st = ST(l);
    nb_loader_free(l);
    nb_dataset_free(ds);
    return st;
}
MAKE(nb_linear_opts, nb_linear_defaults())
static nb_status use_linear(const void *o) {
    nb_module *m = nb_linear_new(3, 2, o);
    nb_status st = ST(m);
    nb_module_free(m);
    return st;
}
MAKE(nb_conv2d_opts, nb_conv2d_defaults())
static nb_status use_conv2d(const void *o) {
    nb_module *m = nb_conv2d_new(1, 2, 3, 3, o);
    nb_status st = ST(m);
    nb_module_free(m);
    return st;
}
MAKE(nb_pool2d_opts, nb_pool2d_defaults(2, 2))
static nb_status use_pool2d(const void *o) {
    nb_module *m = nb_maxpool2d_new(2, 2, o);
    nb_status st = ST(m);
    nb_module_free(m);
    return st;
}
MAKE(nb_norm_opts, nb_norm_defaults())
static nb_status use_norm(const void *o) {
    nb_module *m = nb_layer_norm_new(3, o);
    nb_status st = ST(m);
    nb_module_free(m);
    return st;
}
MAKE(nb_cross_entropy_opts, nb_cross_entropy_defaults())
static nb_status use_cross_entropy(const void *o) {
    nb_tensor *y = nb_zeros((int64_t[]){4}, 1, NB_I64);
    return ST(nb_cross_entropy(x_in(), y, o));
}
MAKE2(nb_sgd_opts, nb_sgd_defaults(), o.lr = 0.1)
#define USE_OPTIM(name)                                                                            \
    static nb_status use_##name(const void *o) {                                                   \
        nb_module *m = mlp();                                                                      \
        nb_optim *opt = nb_##name##_new(nb_parameters(m), o);                                      \
        nb_status st = ST(opt);                                                                    \
        nb_optim_free(opt);                                                                        \
        nb_module_free(m);                                                                         \
        return st;                                                                                 \
    }
USE_OPTIM(sgd)
MAKE(nb_adam_opts, nb_adam_defaults())
USE_OPTIM(adam)
static void make_adamw(void *out) { *(nb_adamw_opts *)out = nb_adamw_defaults(); }
USE_OPTIM(adamw)
MAKE(nb_rmsprop_opts, nb_rmsprop_defaults())
USE_OPTIM(rmsprop)
MAKE(nb_adagrad_opts, nb_adagrad_defaults())
USE_OPTIM(adagrad)
MAKE(nb_group_opts, nb_group_defaults())
static nb_status use_group(const void *o) {
    nb_module *m = mlp();
    nb_optim *opt = sgd(m);
    nb_tensor *w = x_in();
    nb_set_requires_grad(w, true);
    int g = nb_optim_add_group(opt, &(nb_params){1, &w, (const char *[]){"extra"}}, o);
    nb_optim_free(opt);
    nb_module_free(m);
    return g < 0 ? (nb_status)g : NB_OK;
}
MAKE(nb_grad_scaler_opts, nb_grad_scaler_defaults())
static nb_status use_grad_scaler(const void *o) {
    nb_grad_scaler *s = nb_grad_scaler_new(o);
    nb_status st = ST(s);
    nb_grad_scaler_free(s);
    return st;
}
MAKE2(nb_sched_opts, nb_sched_defaults(NB_SCHED_COSINE), o.total_steps = 10)
static nb_status use_sched(const void *o) {
    nb_module *m = mlp();
    nb_optim *opt = sgd(m);
    nb_sched *s = nb_sched_new(opt, o);
    nb_status st = ST(s);
    nb_sched_free(s);
    nb_optim_free(opt);
    nb_module_free(m);
    return st;
}
static nb_status use_sched_lr_at(const void *o) {
    return isnan(nb_sched_lr_at(o, 0.1, 1)) ? nb_last_status() : NB_OK;
}
MAKE(nb_ddp_opts, nb_ddp_defaults())
static nb_status use_ddp(const void *o) {
    nb_module *m = mlp();
    nb_ddp *d = nb_ddp_new(m, self(), o);
    nb_status st = ST(d);
    nb_ddp_free(d);
    nb_module_free(m);
    return st;
}
MAKE(nb_zero_opts, nb_zero_defaults())
static nb_status use_zero(const void *o) {
    nb_module *m = mlp();
    nb_optim *opt = sgd(m);
    nb_zero *z = nb_zero_new(m, opt, self(), o);
    nb_status st = ST(z);
    nb_zero_free(z);
    nb_optim_free(opt);
    nb_module_free(m);
    return st;
}
MAKE(nb_pipe_opts, nb_pipe_defaults())
static nb_status use_pipe(const void *o) {
    nb_tensor *w = x_in();
    nb_set_requires_grad(w, true);
    return isnan(nb_pipe_run(self(), o, pipe_stage, w, NULL)) ? nb_last_status() : NB_OK;
}
MAKE2(nb_pipeline_opts, nb_pipeline_defaults(), (o.loss = mse, o.n_micro = 1))
static nb_status use_pipeline(const void *o) {
    nb_module *m = mlp();
    nb_mesh *mesh = mesh1("pp");
    nb_pipeline *p = nb_pipeline_new(m, mesh, NULL, 0, o);
    nb_status st = ST(p);
    nb_pipeline_free(p);
    nb_mesh_free(mesh);
    nb_module_free(m);
    return st;
}
static nb_status use_gpt_pipeline(const void *o) {
    nb_module *m = tiny_gpt();
    nb_mesh *mesh = mesh1("pp");
    nb_pipeline *p = nb_gpt_pipeline_new(m, mesh, o);
    nb_status st = ST(p);
    nb_pipeline_free(p);
    nb_mesh_free(mesh);
    nb_module_free(m);
    return st;
}
MAKE2(nb_progress_opts, nb_progress_defaults(), o.enabled = false)
static nb_status use_progress(const void *o) {
    nb_progress *p = nb_progress_new(o);
    nb_status st = ST(p);
    nb_progress_free(p);
    return st;
}
MAKE(nb_parallelize_opts, nb_parallelize_defaults())
static nb_status use_parallelize(const void *o) {
    nb_module *m = mlp();
    nb_mesh *mesh = mesh1("tp");
    const nb_tp_rule plan[] = {{"0", NB_TP_COLWISE}, {"2", NB_TP_ROWWISE}, {0}};
    nb_status st = nb_parallelize(m, mesh, plan, o);
    nb_mesh_free(mesh);
    nb_module_free(m);
    return st;
}
static nb_status use_gpt_parallelize(const void *o) {
    nb_module *m = tiny_gpt();
    nb_mesh *mesh = mesh1("tp");
    nb_status st = nb_gpt_parallelize(m, mesh, o);
    nb_mesh_free(mesh);
    nb_module_free(m);
    return st;
}
MAKE(nb_tp_linear_opts, nb_tp_linear_defaults())
static nb_status use_tp_linear(const void *o) {
    nb_mesh *mesh = mesh1("tp");
    nb_module *m = nb_column_parallel_linear_new(3, 4, mesh, o);
    nb_status st = ST(m);
    nb_module_free(m);
    nb_mesh_free(mesh);
    return st;
}
MAKE(nb_checkpoint_writer_opts, nb_checkpoint_writer_defaults())
static nb_status use_checkpoint_writer(const void *o) {
    nb_checkpoint_writer *w = nb_checkpoint_writer_new(o);
    nb_status st = ST(w);
    nb_checkpoint_writer_free(w);
    return st;
}
MAKE(nb_gpt_config, nb_gpt_config_defaults())
static nb_status use_gpt(const void *o) {
    nb_module *m = nb_gpt_new(o, NULL);
    nb_status st = ST(m);
    nb_module_free(m);
    return st;
}
static nb_status use_gpt_flops(const void *o) {
    return isnan(nb_gpt_train_flops(o, 1, 8)) ? nb_last_status() : NB_OK;
}
MAKE(nb_llama_config, nb_llama_config_defaults())
static nb_status use_llama(const void *o) {
    nb_module *m = nb_llama_new(o, NULL);
    nb_status st = ST(m);
    nb_module_free(m);
    return st;
}
MAKE(nb_gpt_step_opts, nb_gpt_step_defaults())
static nb_status use_gpt_step(const void *o) {
    nb_module *m = tiny_gpt();
    nb_optim *opt = sgd(m);
    nb_tensor *x = nb_zeros((int64_t[]){1, 4}, 2, NB_I64);
    double loss = nb_gpt_train_step_ex(m, opt, &x, &x, 1, o, NULL);
    nb_optim_free(opt);
    nb_module_free(m);
    return isnan(loss) ? nb_last_status() : NB_OK;
}
MAKE(nb_gpt_sample_opts, nb_gpt_sample_defaults())
static nb_status use_gpt_sample(const void *o) {
    nb_module *m = tiny_gpt();
    int64_t prompt[1] = {1}, out[2];
    nb_status st = nb_gpt_generate(m, prompt, 1, 2, o, out);
    nb_module_free(m);
    return st;
}

static nb_module *tiny_llama(void) {
    nb_llama_config c = nb_llama_config_defaults();
    c.vocab_size = 16, c.block_size = 4, c.n_layer = 1, c.n_head = 2, c.n_embd = 8;
    return nb_llama_new(&c, NULL);
}
static nb_status use_llama_step(const void *o) {
    nb_module *m = tiny_llama();
    nb_optim *opt = sgd(m);
    nb_tensor *x = nb_zeros((int64_t[]){1, 4}, 2, NB_I64);
    double loss = nb_llama_train_step(m, opt, &x, &x, 1, o, NULL);
    nb_optim_free(opt);
    nb_module_free(m);
    return isnan(loss) ? nb_last_status() : NB_OK;
}
static nb_status use_llama_sample(const void *o) {
    nb_module *m = tiny_llama();
    int64_t prompt[1] = {1}, out[2];
    nb_status st = nb_llama_generate(m, prompt, 1, 2, o, true, out);
    nb_module_free(m);
    return st;
}
static nb_status use_llama_parallelize(const void *o) {
    nb_module *m = tiny_llama();
    nb_mesh *mesh = mesh1("tp");
    nb_status st = nb_llama_parallelize(m, mesh, o);
    nb_mesh_free(mesh);
    nb_module_free(m);
    return st;
}
static nb_status use_llama_pipeline(const void *o) {
    nb_module *m = tiny_llama();
    nb_mesh *mesh = mesh1("pp");
    nb_pipeline *p = nb_llama_pipeline_new(m, mesh, o);
    nb_status st = ST(p);
    nb_pipeline_free(p);
    nb_mesh_free(mesh);
    nb_module_free(m);
    return st;
}
static nb_status use_llama_flops(const void *o) {
    return isnan(nb_llama_train_flops(o, 1, 8)) ? nb_last_status() : NB_OK;
}

#define E(T, defaults, use, null_ok)                                                               \
    { #T, defaults, sizeof(T), make_##T, use, null_ok }
static const entry entries[] = {
    E(nb_backward_opts, "nb_backward_defaults()", use_backward, true),
    E(nb_recompute_opts, "nb_recompute_defaults()", use_recompute, true),
    E(nb_gradcheck_opts, "nb_gradcheck_defaults()", use_gradcheck, true),
    E(nb_mnist_opts, "nb_mnist_defaults()", use_mnist, true),
    E(nb_loader_opts, "nb_loader_defaults()", use_loader, true),
    E(nb_linear_opts, "nb_linear_defaults()", use_linear, true),
    E(nb_conv2d_opts, "nb_conv2d_defaults()", use_conv2d, true),
    E(nb_pool2d_opts, "nb_pool2d_defaults(kh, kw)", use_pool2d, true),
    E(nb_norm_opts, "nb_norm_defaults()", use_norm, true),
    E(nb_cross_entropy_opts, "nb_cross_entropy_defaults()", use_cross_entropy, true),
    E(nb_sgd_opts, "nb_sgd_defaults()", use_sgd, false),
    E(nb_adam_opts, "nb_adam_defaults()", use_adam, true),
    {"nb_adamw_opts", "nb_adamw_defaults()", sizeof(nb_adamw_opts), make_adamw, use_adamw, true},
    E(nb_rmsprop_opts, "nb_rmsprop_defaults()", use_rmsprop, true),
    E(nb_adagrad_opts, "nb_adagrad_defaults()", use_adagrad, true),
    E(nb_group_opts, "nb_group_defaults()", use_group, true),
    E(nb_grad_scaler_opts, "nb_grad_scaler_defaults()", use_grad_scaler, true),
    E(nb_sched_opts, "nb_sched_defaults(NB_SCHED_COSINE)", use_sched, false),
    E(nb_sched_opts, "nb_sched_defaults(NB_SCHED_COSINE)", use_sched_lr_at, false),
    E(nb_ddp_opts, "nb_ddp_defaults()", use_ddp, true),
    E(nb_zero_opts, "nb_zero_defaults()", use_zero, true),
    E(nb_pipe_opts, "nb_pipe_defaults()", use_pipe, false),
    E(nb_pipeline_opts, "nb_pipeline_defaults()", use_pipeline, false),
    E(nb_pipeline_opts, "nb_pipeline_defaults()", use_gpt_pipeline, true),
    E(nb_progress_opts, "nb_progress_defaults()", use_progress, true),
    E(nb_parallelize_opts, "nb_parallelize_defaults()", use_parallelize, true),
    E(nb_parallelize_opts, "nb_parallelize_defaults()", use_gpt_parallelize, true),
    E(nb_tp_linear_opts, "nb_tp_linear_defaults()", use_tp_linear, true),
    E(nb_checkpoint_writer_opts, "nb_checkpoint_writer_defaults()", use_checkpoint_writer, true),
    E(nb_gpt_config, "nb_gpt_config_defaults()", use_gpt, true),
    E(nb_gpt_config, "nb_gpt_config_defaults()", use_gpt_flops, true),
    E(nb_llama_config, "nb_llama_config_defaults()", use_llama, true),
    E(nb_gpt_step_opts, "nb_gpt_step_defaults()", use_gpt_step, true),
    E(nb_gpt_sample_opts, "nb_gpt_sample_defaults()", use_gpt_sample, true),
    E(nb_gpt_step_opts, "nb_gpt_step_defaults()", use_llama_step, true),
    E(nb_gpt_sample_opts, "nb_gpt_sample_defaults()", use_llama_sample, true),
    E(nb_parallelize_opts, "nb_parallelize_defaults()", use_llama_parallelize, true),
    E(nb_pipeline_opts, "nb_pipeline_defaults()", use_llama_pipeline, true),
    E(nb_llama_config, "nb_llama_config_defaults()", use_llama_flops, true),
};
enum { N_ENTRIES = sizeof entries / sizeof entries[0] };

/* The status and message of use(o), in a scope of its own. */
static nb_status call(const entry *e, const void *o) {
    nb_clear_error();
    nb_scope_begin();
    nb_status st = e->use(o);
    nb_scope_end();
    return st;
}

static void expect_refused(const entry *e, const void *o, const char *what) {
    nb_status st = call(e, o);
    ck_assert_msg(st == NB_EINVAL, "%s %s: status %d (%s)", e->type, what, st, nb_last_error());
    char idiom[160];
    snprintf(idiom, sizeof idiom, "did not start from %s", e->defaults);
    ck_assert_msg(strstr(nb_last_error(), idiom), "%s %s: %s", e->type, what, nb_last_error());
    snprintf(idiom, sizeof idiom, "write `%s o = %s; o.", e->type, e->defaults);
    ck_assert_msg(strstr(nb_last_error(), idiom), "%s %s: %s", e->type, what, nb_last_error());
}

/* A zero-filled struct, and the same with the first field after the mark set (what a
 * compound literal `&(T){.field = v}` makes): refused, the message showing the idiom. */
START_TEST(test_zeroed_refused) {
    const entry *e = &entries[_i];
    unsigned char *buf = calloc(1, e->size);
    expect_refused(e, buf, "zero-filled");
    e->make(buf);
    memset(buf, 0, sizeof(uint32_t)); /* a literal of the same values: no mark */
    expect_refused(e, buf, "without the mark");
    free(buf);
}
END_TEST

/* The defaulted struct, a copy of it and NULL (where allowed) are accepted; the mark of
 * another size (a program built against other headers) is refused. */
START_TEST(test_defaulted_accepted) {
    const entry *e = &entries[_i];
    unsigned char *a = calloc(1, e->size), *b = calloc(1, e->size);
    e->make(a);
    nb_status st = call(e, a);
    ck_assert_msg(st == NB_OK, "%s from %s: %s", e->type, e->defaults, nb_last_error());
    memcpy(b, a, e->size);
    st = call(e, b);
    ck_assert_msg(st == NB_OK, "%s copied: %s", e->type, nb_last_error());
    if (e->null_ok) {
        st = call(e, NULL);
        ck_assert_msg(st == NB_OK, "%s NULL: %s", e->type, nb_last_error());
    }
    uint32_t mark;
    memcpy(&mark, a, sizeof mark);
    mark -= 8; /* the same magic, another size */
    memcpy(b, &mark, sizeof mark);
    st = call(e, b);
    ck_assert_msg(st == NB_EINVAL && strstr(nb_last_error(), "another version"), "%s: %d %s",
                  e->type, st, nb_last_error());
    free(a);
    free(b);
}
END_TEST

/* The idiom as a user writes it: a compound literal is refused with the message of the issue,
 * and zero written on purpose is zero. */
START_TEST(test_idiom_and_zero) {
    nb_scope_begin();
    nb_module *m = mlp();
    ck_assert_ptr_null(nb_adam_new(nb_parameters(m), &(nb_adam_opts){.lr = 1e-3}));
    ck_assert_str_eq(nb_last_error(),
                     "adam: the options did not start from nb_adam_defaults() (a compound "
                     "literal or a zeroed struct leaves every other field 0): write "
                     "`nb_adam_opts o = nb_adam_defaults(); o.lr = 1e-3;` and pass &o");
    /* sgd momentum 0 and adam weight_decay 0: read as 0 (the group's values show them) */
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 0.1, so.momentum = 0;
    nb_optim *opt = nb_sgd_new(nb_parameters(m), &so);
    nb_group_opts go = nb_group_defaults();
    ASSERT_OK(nb_optim_group_opts(opt, 0, &go));
    ck_assert_double_eq(go.momentum, 0);
    go.weight_decay = 0; /* nb_optim_group_opts' result carries the mark: usable as given */
    nb_tensor *w = x_in();
    nb_set_requires_grad(w, true);
    ck_assert_int_eq(nb_optim_add_group(opt, &(nb_params){1, &w, (const char *[]){"extra"}}, &go),
                     1);
    nb_optim_free(opt);
    nb_adamw_opts ao = nb_adamw_defaults();
    ao.weight_decay = 0;
    opt = nb_adamw_new(nb_parameters(m), &ao);
    ASSERT_OK(nb_optim_group_opts(opt, 0, &go));
    ck_assert_double_eq(go.weight_decay, 0);
    nb_optim_free(opt);
    /* batch norm momentum 0 keeps the running statistics; llama norm_eps 0 is no eps */
    nb_norm_opts no = nb_norm_defaults();
    no.momentum = 0;
    nb_module *bn = nb_batch_norm1d_new(3, &no);
    ck_assert_ptr_nonnull(bn);
    nb_module_free(bn);
    nb_llama_config lc = nb_llama_config_defaults();
    lc.vocab_size = 16, lc.block_size = 4, lc.n_layer = 1, lc.n_embd = 16, lc.norm_eps = 0;
    nb_module *ll = nb_llama_new(&lc, NULL);
    ck_assert_msg(ll, "%s", nb_last_error());
    ck_assert_double_eq(nb_llama_get_config(ll)->norm_eps, 0);
    ck_assert_int_eq(nb_llama_get_config(ll)->n_kv_head, 2); /* 0: derived, n_head / 2 */
    nb_module_free(ll);
    /* a GPT size of 0 is an error, not the default */
    nb_gpt_config gc = nb_gpt_config_defaults();
    gc.n_layer = 0;
    tu_assert_error(nb_gpt_new(&gc, NULL), NB_EINVAL, "positive");
    /* the config a model returns carries the mark: a model of the same shape from it */
    nb_module *g = tiny_gpt(), *g2 = nb_gpt_new(nb_gpt_get_config(g), NULL);
    ck_assert_msg(g2, "%s", nb_last_error());
    nb_module_free(g2);
    nb_module_free(g);
    /* the linear options inside nb_tp_linear_opts are checked too */
    nb_tp_linear_opts to = nb_tp_linear_defaults();
    to.linear = (nb_linear_opts){.no_bias = true};
    nb_mesh *mesh = mesh1("tp");
    tu_assert_error(nb_column_parallel_linear_new(3, 4, mesh, &to), NB_EINVAL,
                    "did not start from nb_linear_defaults()");
    nb_mesh_free(mesh);
    nb_module_free(m);
    nb_scope_end();
}
END_TEST

Suite *nb_suite_options(void) {
    Suite *s = suite_create("options");
    TCase *tc = tcase_create("options");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_zeroed_refused, 0, N_ENTRIES);
    tcase_add_loop_test(tc, test_defaulted_accepted, 0, N_ENTRIES);
    tcase_add_test(tc, test_idiom_and_zero);
    suite_add_tcase(s, tc);
    return s;
}
