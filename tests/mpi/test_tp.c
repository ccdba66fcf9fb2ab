/* test_tp.c - the topology, the autograd-aware collectives and the tensor-parallel layers
 * of nabla/tp.h, in nabla_mpi_tests (1, 2 and 4 ranks, and alone).
 *
 * The collectives are checked as gradcheck across ranks: each rank's loss is sum(y * r_k)
 * with r_k known to every rank, so the gradient of the total loss (the sum over ranks) with
 * respect to each rank's input is known in closed form, and every rank compares its forward
 * output and its input gradient with it. The layers are checked against the 1-rank layers
 * drawn from the same seed: outputs and gradients (gathered) agree to 1e-5 relative. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpi_test.h"

static void expect_error_at(const void *got, nb_status status, const char *needle, const char *file,
                            int line) {
    if (got || nb_last_status() != status || !strstr(nb_last_error(), needle))
        mt_fail_at(file, line, "got %p %s \"%s\", expected NULL with %s and \"%s\"", got,
                   nb_status_name(nb_last_status()), nb_last_error(), nb_status_name(status),
                   needle);
    nb_clear_error();
}
#define EXPECT_NULL(got, status, needle) expect_error_at((got), (status), (needle), __FILE__, __LINE__)

/* A (A0, A1, A2) f64 tensor with element (i, j, k) = f(salt, i, j, k) for rank `salt`. */
enum { A0 = 2, A1 = 8, A2 = 4 };
static double val(int salt, int64_t i) { return (double)((salt * 37 + i * 11) % 23) - 11.0 + salt * 0.25; }
static nb_tensor *make3(int salt, const int64_t *shape) {
    int64_t n = shape[0] * shape[1] * shape[2];
    double *b = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) b[i] = val(salt, i);
    nb_tensor *t = nb_from_buffer(b, shape, 3, NB_F64);
    free(b);
    return t;
}
/* full-size tensors of rank salt (A0, A1, A2) */
static nb_tensor *full(int salt) { return make3(salt, (int64_t[]){A0, A1, A2}); }

/* Max relative difference of a and b (same shape), scaled by max |b|. */
static double rel_diff(nb_tensor *a, nb_tensor *b) {
    if (!a || !b || nb_numel(a) != nb_numel(b)) return INFINITY;
    nb_scope_begin();
    double d = nb_item_f64(nb_amax(nb_abs(nb_sub(nb_to_dtype(a, NB_F64), nb_to_dtype(b, NB_F64))),
                                   NULL, 0, false));
    double m = nb_item_f64(nb_amax(nb_abs(nb_to_dtype(b, NB_F64)), NULL, 0, false));
    nb_scope_end();
    return d / (m > 0 ? m : 1);
}
#define EXPECT_CLOSE(a, b, tol, what)                                                      \
    do {                                                                                   \
        double d_ = rel_diff((a), (b));                                                    \
        MT_CHECK(d_ <= (tol), "%s: relative difference %g > %g", (what), d_, (double)(tol)); \
    } while (0)

/* sum over ranks j of r_j */
static nb_tensor *sum_over_ranks(void) {
    nb_tensor *s = full(0);
    for (int j = 1; j < mt_size; j++) s = nb_add(s, full(j));
    return s;
}
/* chunk k of t along dim */
static nb_tensor *chunk(nb_tensor *t, int dim, int k) {
    int64_t n = nb_size(t, dim) / mt_size;
    return nb_narrow(t, dim, k * n, n);
}

/* ---- topology ------------------------------------------------------------------------------- */
START_TEST(test_topology_layouts) {
    for (int tp = 1; tp <= mt_size; tp *= 2) {
        if (mt_size % tp) continue;
        nb_topology_opts o = nb_topology_defaults();
        o.tp = tp;
        nb_topology *t = nb_topology_new(mt_world, &o);
        MT_CHECK(t, "tp %d: %s", tp, nb_last_error());
        if (!t) continue;
        const int dp = mt_size / tp;
        MT_CHECK(nb_topology_tp_size(t) == tp && nb_topology_dp_size(t) == dp &&
                     nb_topology_pp_size(t) == 1, "sizes");
        /* Megatron's order: tp ranks adjacent */
        MT_CHECK(nb_topology_tp_rank(t) == mt_rank % tp, "tp rank %d", nb_topology_tp_rank(t));
        MT_CHECK(nb_topology_dp_rank(t) == mt_rank / tp, "dp rank %d", nb_topology_dp_rank(t));
        MT_CHECK(nb_comm_size(nb_topology_tp(t)) == tp && nb_comm_size(nb_topology_dp(t)) == dp &&
                     nb_comm_size(nb_topology_pp(t)) == 1 && nb_comm_size(nb_topology_embedding(t)) == 1,
                 "group sizes");
        MT_CHECK(nb_comm_rank(nb_topology_tp(t)) == nb_topology_tp_rank(t), "tp group rank");
        MT_CHECK(nb_comm_rank(nb_topology_dp(t)) == nb_topology_dp_rank(t), "dp group rank");
        /* the tp group sums the world ranks of one replica */
        nb_scope_begin();
        nb_tensor *x = nb_full((int64_t[]){1}, 1, NB_F64, (double)mt_rank);
        MT_OK(nb_allreduce(nb_topology_tp(t), x, NB_REDUCE_SUM));
        int base = (mt_rank / tp) * tp;
        MT_CHECK(nb_item_f64(x) == (double)(tp * base + tp * (tp - 1) / 2), "tp group members");
        nb_tensor *y = nb_full((int64_t[]){1}, 1, NB_F64, (double)mt_rank);
        MT_OK(nb_allreduce(nb_topology_dp(t), y, NB_REDUCE_SUM));
        MT_CHECK(nb_item_f64(y) == (double)(dp * (mt_rank % tp) + tp * dp * (dp - 1) / 2),
                 "dp group members");
        nb_scope_end();
        char want[64];
        snprintf(want, sizeof want, "dp=%d pp=1 tp=%d", dp, tp);
        MT_CHECK(strcmp(nb_topology_describe(t), want) == 0, "describe: %s", nb_topology_describe(t));
        nb_topology_free(t);
    }
    /* pp: with 4 ranks, pp 2 x tp 2: the pp group links rank r and r + 2 */
    if (mt_size == 4) {
        nb_topology *t = nb_topology_new(mt_world, &(nb_topology_opts){.pp = 2, .tp = 2});
        MT_CHECK(t && nb_topology_pp_rank(t) == mt_rank / 2 && nb_topology_dp_size(t) == 1 &&
                     nb_comm_size(nb_topology_pp(t)) == 2 && nb_comm_size(nb_topology_embedding(t)) == 2,
                 "pp 2 x tp 2: %s", nb_last_error());
        nb_topology_free(t);
    }
    MT_END();
}
END_TEST

START_TEST(test_topology_errors) {
    /* The same error on every rank, before any communication. */
    EXPECT_NULL(nb_topology_new(mt_world, &(nb_topology_opts){.pp = 1, .tp = 3 * mt_size}),
                NB_EINVAL, "is not dp x pp x tp");
    EXPECT_NULL(nb_topology_new(mt_world, &(nb_topology_opts){.dp = mt_size + 1, .pp = 1, .tp = 1}),
                NB_EINVAL, "is not dp x pp x tp");
    EXPECT_NULL(nb_topology_new(mt_world, &(nb_topology_opts){.pp = 0, .tp = 1}), NB_EINVAL,
                "must be >= 1");
    EXPECT_NULL(nb_topology_new(NULL, NULL), NB_ENULL, "NULL");
    MT_END();
}
END_TEST

/* ---- collectives ------------------------------------------------------------------------------ */
/* Run y = op(x) with x requiring grad and loss = sum(y * r); returns y, sets *grad. */
typedef nb_tensor *(*coll_fn)(nb_tensor *x, nb_comm *c, int dim);
static nb_tensor *copy_fn(nb_tensor *x, nb_comm *c, int dim) { (void)dim; return nb_copy_to_region(x, c); }
static nb_tensor *reduce_fn(nb_tensor *x, nb_comm *c, int dim) { (void)dim; return nb_reduce_from_region(x, c); }

static nb_tensor *run_op(coll_fn f, nb_tensor *x, int dim, nb_tensor *r, nb_tensor **grad) {
    MT_OK(nb_set_requires_grad(x, true));
    nb_tensor *y = f(x, mt_world, dim);
    MT_CHECK(y, "op failed: %s", nb_last_error());
    MT_OK(nb_backward(nb_sum(nb_mul(y, r), NULL, 0, false)));
    *grad = nb_grad(x);
    return y;
}

START_TEST(test_collectives_grad) {
    nb_scope_begin();
    const int k = mt_rank;
    nb_tensor *g;
    /* copy_to_region: y = x (replicated); dL/dx = sum_j r_j */
    nb_tensor *x = full(100), *y = run_op(copy_fn, x, 0, full(k), &g);
    EXPECT_CLOSE(y, full(100), 0, "copy_to_region forward");
    EXPECT_CLOSE(g, sum_over_ranks(), 1e-12, "copy_to_region backward");
    /* reduce_from_region: y = sum_j x_j; loss replicated (r the same): dL/dx_k = r */
    x = full(k);
    y = run_op(reduce_fn, x, 0, full(100), &g);
    EXPECT_CLOSE(y, sum_over_ranks(), 1e-12, "reduce_from_region forward");
    EXPECT_CLOSE(g, full(100), 0, "reduce_from_region backward");
    for (int dim = 0; dim < 3; dim++) {
        if ((int64_t[]){A0, A1, A2}[dim] % mt_size) continue;
        /* gather_along: x_k = chunk k of F; y = F; loss replicated: dL/dx_k = chunk k of r */
        nb_tensor *F = full(7), *R = full(100);
        x = nb_contiguous(nb_detach(chunk(F, dim, k)));
        y = run_op(nb_gather_along, x, dim, R, &g);
        EXPECT_CLOSE(y, F, 0, "gather_along forward");
        EXPECT_CLOSE(g, chunk(R, dim, k), 0, "gather_along backward");
        /* split_along: x replicated; y = chunk k; loss per rank with chunk k of r_k:
         * dL/dx = concat_j chunk j of r_j */
        x = full(7);
        y = run_op(nb_split_along, x, dim, nb_contiguous(chunk(full(k), dim, k)), &g);
        EXPECT_CLOSE(y, chunk(F, dim, k), 0, "split_along forward");
        nb_tensor *parts[4];
        for (int j = 0; j < mt_size; j++) parts[j] = chunk(full(j), dim, j);
        EXPECT_CLOSE(g, nb_cat(parts, mt_size, dim), 0, "split_along backward");
        /* reduce_scatter_along: x_k full; y = chunk k of sum_j x_j; loss with chunk k of r_k:
         * dL/dx_k = concat_j chunk j of r_j (the same on every rank) */
        x = full(k);
        y = run_op(nb_reduce_scatter_along, x, dim, nb_contiguous(chunk(full(k + 50), dim, k)), &g);
        EXPECT_CLOSE(y, chunk(sum_over_ranks(), dim, k), 1e-12, "reduce_scatter_along forward");
        for (int j = 0; j < mt_size; j++) parts[j] = chunk(full(j + 50), dim, j);
        EXPECT_CLOSE(g, nb_cat(parts, mt_size, dim), 0, "reduce_scatter_along backward");
        /* all_gather_along: x_k = chunk k of F; y = F; loss with r_k per rank:
         * dL/dx_k = chunk k of sum_j r_j */
        x = nb_contiguous(nb_detach(chunk(F, dim, k)));
        y = run_op(nb_all_gather_along, x, dim, full(k), &g);
        EXPECT_CLOSE(y, F, 0, "all_gather_along forward");
        EXPECT_CLOSE(g, chunk(sum_over_ranks(), dim, k), 1e-12, "all_gather_along backward");
    }
    nb_scope_end();
    MT_END();
}
END_TEST

START_TEST(test_collectives_errors) {
    nb_scope_begin();
    nb_tensor *x = full(0);
    EXPECT_NULL(nb_split_along(x, mt_world, 3), NB_EINVAL, "dim 3 is out of range");
    EXPECT_NULL(nb_copy_to_region(x, NULL), NB_ENULL, "communicator is NULL");
    EXPECT_NULL(nb_copy_to_region(NULL, mt_world), NB_ENULL, "copy_to_region");
    if (mt_size > 1) {
        nb_tensor *odd = make3(0, (int64_t[]){A0, A1 + 1, A2});
        EXPECT_NULL(nb_reduce_scatter_along(odd, mt_world, 1), NB_ESHAPE, "does not divide");
    }
    nb_scope_end();
    MT_END();
}
END_TEST

/* ---- layers ------------------------------------------------------------------------------------ */
enum { IN = 8, HID = 32, B = 3, T = 4 };

/* The 1-rank MLP (fc, gelu, proj) and the TP one from the same seed agree: output and
 * gradients (the TP gradients are slices of the 1-rank ones). */
START_TEST(test_tp_mlp_equivalence) {
    nb_generator *g1 = nb_generator_new(5), *g2 = nb_generator_new(5);
    nb_linear_opts o = nb_linear_defaults();
    o.gen = g1;
    nb_module *fc = nb_linear_new(IN, HID, &o), *proj = nb_linear_new(HID, IN, &o);
    nb_module *tfc = nb_column_parallel_linear_new(IN, HID, mt_world, false, NULL, g2);
    nb_module *tproj = nb_row_parallel_linear_new(HID, IN, mt_world, true, NULL, g2);
    MT_CHECK(fc && proj && tfc && tproj, "build: %s", nb_last_error());
    nb_scope_begin();
    nb_tensor *x = nb_randn((int64_t[]){B, T, IN}, 3, NB_F32, g1);
    nb_tensor *y1 = nb_forward(proj, nb_gelu(nb_forward(fc, x)));
    nb_tp_comm_stats_reset();
    nb_tensor *y2 = nb_forward(tproj, nb_gelu(nb_forward(tfc, x)));
    EXPECT_CLOSE(y2, y1, 1e-5, "forward");
    nb_tensor *w = nb_randn((int64_t[]){B, T, IN}, 3, NB_F32, g2); /* same on every rank */
    MT_OK(nb_backward(nb_sum(nb_mul(y1, w), NULL, 0, false)));
    MT_OK(nb_backward(nb_sum(nb_mul(y2, w), NULL, 0, false)));
    /* one allreduce forward (row); none backward, since x needs no gradient */
    nb_tp_comm_stats cs;
    nb_tp_comm_stats_get(&cs);
    MT_CHECK(cs.calls == 1 && cs.bytes == 2 * (B * T * IN * 4 / mt_size) * (mt_size - 1) && cs.seconds >= 0,
             "comm stats: %lld calls, %lld bytes", (long long)cs.calls, (long long)cs.bytes);
    const int r = mt_rank, n = mt_size;
    EXPECT_CLOSE(nb_grad(nb_module_param(tfc, "weight")),
                 nb_tp_slice(nb_grad(nb_module_param(fc, "weight")), 0, r, n), 1e-5, "fc.weight grad");
    EXPECT_CLOSE(nb_grad(nb_module_param(tfc, "bias")),
                 nb_tp_slice(nb_grad(nb_module_param(fc, "bias")), 0, r, n), 1e-5, "fc.bias grad");
    EXPECT_CLOSE(nb_grad(nb_module_param(tproj, "weight")),
                 nb_tp_slice(nb_grad(nb_module_param(proj, "weight")), 1, r, n), 1e-5,
                 "proj.weight grad");
    EXPECT_CLOSE(nb_grad(nb_module_param(tproj, "bias")), nb_grad(nb_module_param(proj, "bias")),
                 1e-5, "proj.bias grad");
    /* gather_output / !input_is_parallel: the same function again */
    nb_module *gfc = nb_column_parallel_linear_from(nb_module_param(fc, "weight"),
                                                    nb_module_param(fc, "bias"), mt_world, true);
    nb_module *sproj = nb_row_parallel_linear_from(nb_module_param(proj, "weight"),
                                                   nb_module_param(proj, "bias"), mt_world, false);
    EXPECT_CLOSE(nb_forward(sproj, nb_gelu(nb_forward(gfc, x))), y1, 1e-5, "gathered forward");
    /* the global gradient norm equals the 1-rank one */
    nb_tensor *p1[] = {nb_module_param(fc, "weight"), nb_module_param(fc, "bias"),
                       nb_module_param(proj, "weight"), nb_module_param(proj, "bias")};
    nb_tensor *p2[] = {nb_module_param(tfc, "weight"), nb_module_param(tfc, "bias"),
                       nb_module_param(tproj, "weight"), nb_module_param(tproj, "bias")};
    nb_comm *self = nb_comm_self();
    double n1 = nb_tp_clip_grad_norm(p1, (bool[]){false, false, false, false}, 4, self, INFINITY);
    double n2 = nb_tp_clip_grad_norm(p2, (bool[]){true, true, true, false}, 4, mt_world, INFINITY);
    MT_CHECK(n1 > 0 && fabs(n1 - n2) <= 1e-5 * n1, "grad norm %g vs %g", n2, n1);
    nb_comm_free(self);
    nb_module_free(gfc);
    nb_module_free(sproj);
    nb_scope_end();
    /* errors */
    if (mt_size > 1)
        EXPECT_NULL(nb_column_parallel_linear_new(IN, 4 * mt_size + 1, mt_world, false, NULL, NULL),
                    NB_EINVAL, "does not divide");
    nb_module_free(fc);
    nb_module_free(proj);
    nb_module_free(tfc);
    nb_module_free(tproj);
    nb_generator_free(g1);
    nb_generator_free(g2);
    MT_END();
}
END_TEST

/* ---- the TP GPT ------------------------------------------------------------------------------- */
enum { GV = 16, GT = 8, GB = 4, K = 3 };
static const nb_gpt_config gcfg = {.vocab_size = GV, .block_size = GT, .n_layer = 2, .n_head = 4,
                                   .n_embd = 16};

/* Step k's global batch rows [b0, b0 + nb): x (nb, GT) and its next-token targets y. */
static void batch(int k, int64_t b0, int64_t nb, nb_tensor **x, nb_tensor **y) {
    int64_t xs[GB * GT], ys[GB * GT];
    for (int64_t b = 0; b < nb; b++)
        for (int64_t t = 0; t < GT; t++) {
            int64_t s = b0 + b;
            xs[b * GT + t] = (s * 7 + t * 3 + k * 5 + (s * t) % 3) % GV;
            ys[b * GT + t] = (s * 7 + (t + 1) * 3 + k * 5 + (s * (t + 1)) % 3) % GV;
        }
    *x = nb_from_buffer(xs, (int64_t[]){nb, GT}, 2, NB_I64);
    *y = nb_from_buffer(ys, (int64_t[]){nb, GT}, 2, NB_I64);
}

static nb_optim *sgd(nb_module *m) {
    return nb_sgd_new(nb_parameters(m), &(nb_sgd_opts){.lr = 0.1, .momentum = 0.9});
}

/* K steps of every dp x tp layout (with and without sequence parallelism) give the losses
 * and, gathered, the weights of 1 process training on the whole global batch. */
START_TEST(test_gpt_tp_equivalence) {
    /* the 1-process reference, computed on every rank */
    nb_generator *g = nb_generator_new(11);
    nb_module *ref = nb_gpt_new(&gcfg, g);
    nb_generator_free(g);
    nb_optim *ropt = sgd(ref);
    double rloss[K], rnorm[K];
    for (int k = 0; k < K; k++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        batch(k, 0, GB, &x, &y);
        rloss[k] = nb_gpt_train_step(ref, ropt, NULL, &x, &y, 1, 0.5, &rnorm[k]);
        nb_scope_end();
    }
    MT_CHECK(isfinite(rloss[K - 1]), "reference: %s", nb_last_error());
    for (int tp = 1; tp <= mt_size; tp *= 2)
        for (int sp = 0; sp < 2; sp++) {
            if (mt_size % tp || GB % (mt_size / tp)) continue;
            nb_topology *topo = nb_topology_new(mt_world, &(nb_topology_opts){.pp = 1, .tp = tp});
            g = nb_generator_new(11);
            nb_module *m = nb_gpt_tp_new(&gcfg, g, nb_topology_tp(topo), &(nb_gpt_tp_opts){.sequence_parallel = sp});
            nb_generator_free(g);
            MT_CHECK(m, "tp %d: %s", tp, nb_last_error());
            if (!m) {
                nb_topology_free(topo);
                continue;
            }
            const int dp = nb_topology_dp_size(topo), dr = nb_topology_dp_rank(topo);
            nb_ddp *ddp = dp > 1 ? nb_ddp_new(m, nb_topology_dp(topo), NULL) : NULL;
            nb_optim *opt = sgd(m);
            for (int k = 0; k < K; k++) {
                nb_scope_begin();
                nb_tensor *x, *y;
                batch(k, dr * (GB / dp), GB / dp, &x, &y);
                double norm, loss = nb_gpt_tp_train_step(m, opt, ddp, &x, &y, 1, 0.5, &norm);
                nb_tensor *l = nb_full((int64_t[]){1}, 1, NB_F64, loss);
                MT_OK(nb_allreduce(nb_topology_dp(topo), l, NB_REDUCE_AVG));
                loss = nb_item_f64(l);
                MT_CHECK(fabs(loss - rloss[k]) <= 1e-5 * fabs(rloss[k]),
                         "tp %d sp %d step %d: loss %.9g, 1 process %.9g (%s)", tp, sp, k, loss,
                         rloss[k], nb_last_error());
                MT_CHECK(fabs(norm - rnorm[k]) <= 1e-5 * rnorm[k],
                         "tp %d sp %d step %d: grad norm %.9g, 1 process %.9g", tp, sp, k, norm, rnorm[k]);
                nb_scope_end();
            }
            /* the gathered weights */
            nb_module *full = nb_gpt_new(&gcfg, NULL);
            MT_OK(nb_gpt_tp_gather(m, full));
            const nb_params *ps = nb_parameters(ref);
            for (int i = 0; i < ps->count; i++) {
                char what[160];
                snprintf(what, sizeof what, "tp %d sp %d: %s", tp, sp, ps->names[i]);
                EXPECT_CLOSE(nb_module_find(full, ps->names[i]), ps->tensors[i], 1e-5, what);
            }
            nb_module_free(full);
            nb_optim_free(opt);
            nb_ddp_free(ddp);
            nb_module_free(m);
            nb_topology_free(topo);
        }
    nb_optim_free(ropt);
    nb_module_free(ref);
    MT_END();
}
END_TEST

/* With dropout, tp = world size (with and without sequence parallelism) draws the 1-process
 * run's masks: the same losses and weights. */
START_TEST(test_gpt_tp_dropout_equivalence) {
    nb_gpt_config cfg = gcfg;
    cfg.dropout = 0.2;
    nb_generator *g = nb_generator_new(11);
    cfg.dropout_gen = nb_generator_new(77);
    nb_module *ref = nb_gpt_new(&cfg, g);
    nb_generator_free(g);
    nb_optim *ropt = sgd(ref);
    double rloss[K];
    for (int k = 0; k < K; k++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        batch(k, 0, GB, &x, &y);
        rloss[k] = nb_gpt_train_step(ref, ropt, NULL, &x, &y, 1, 0.5, NULL);
        nb_scope_end();
    }
    nb_generator_free(cfg.dropout_gen);
    for (int sp = 0; sp < 2; sp++) {
        g = nb_generator_new(11);
        cfg.dropout_gen = nb_generator_new(77);
        nb_module *m = nb_gpt_tp_new(&cfg, g, mt_world, &(nb_gpt_tp_opts){.sequence_parallel = sp});
        nb_generator_free(g);
        nb_optim *opt = sgd(m);
        for (int k = 0; k < K; k++) {
            nb_scope_begin();
            nb_tensor *x, *y;
            batch(k, 0, GB, &x, &y);
            double loss = nb_gpt_tp_train_step(m, opt, NULL, &x, &y, 1, 0.5, NULL);
            MT_CHECK(fabs(loss - rloss[k]) <= 1e-5 * fabs(rloss[k]),
                     "sp %d step %d: loss %.9g, 1 process %.9g (%s)", sp, k, loss, rloss[k],
                     nb_last_error());
            nb_scope_end();
        }
        nb_module *full = nb_gpt_new(&gcfg, NULL);
        MT_OK(nb_gpt_tp_gather(m, full));
        const nb_params *ps = nb_parameters(ref);
        for (int i = 0; i < ps->count; i++) {
            char what[160];
            snprintf(what, sizeof what, "dropout, sp %d: %s", sp, ps->names[i]);
            EXPECT_CLOSE(nb_module_find(full, ps->names[i]), ps->tensors[i], 1e-5, what);
        }
        nb_module_free(full);
        nb_optim_free(opt);
        nb_module_free(m);
        nb_generator_free(cfg.dropout_gen);
    }
    nb_optim_free(ropt);
    nb_module_free(ref);
    MT_END();
}
END_TEST

/* Steps [k0, k1) of a layout: tp ranks adjacent, dp over the rest. */
static void train_layout(nb_module *m, nb_optim *opt, nb_topology *topo, nb_ddp *ddp, int k0, int k1) {
    const int dp = nb_topology_dp_size(topo), dr = nb_topology_dp_rank(topo);
    for (int k = k0; k < k1; k++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        batch(k, dr * (GB / dp), GB / dp, &x, &y);
        double loss = nb_gpt_tp_train_step(m, opt, ddp, &x, &y, 1, 0.5, NULL);
        MT_CHECK(isfinite(loss), "step %d: %s", k, nb_last_error());
        nb_scope_end();
    }
}

/* A file saved under tp = world size after 2 steps resumes under tp 1 (each rank alone)
 * and under dp x tp = 2 x 2 (4 ranks): one more step gives the weights of 3 steps of 1
 * process; the file is the consolidated model nb_gpt_load reads. */
START_TEST(test_gpt_tp_checkpoint_layouts) {
    nb_generator *g = nb_generator_new(11);
    nb_module *ref = nb_gpt_new(&gcfg, g);
    nb_generator_free(g);
    nb_optim *ropt = sgd(ref);
    for (int k = 0; k < K; k++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        batch(k, 0, GB, &x, &y);
        MT_CHECK(isfinite(nb_gpt_train_step(ref, ropt, NULL, &x, &y, 1, 0.5, NULL)), "reference");
        nb_scope_end();
    }
    char path[256];
    snprintf(path, sizeof path, "/tmp/nb-test-tp-%d.safetensors", (int)getppid());
    /* save under tp = world size */
    nb_topology *topo = nb_topology_new(mt_world, &(nb_topology_opts){.pp = 1, .tp = mt_size});
    g = nb_generator_new(11);
    nb_module *m = nb_gpt_tp_new(&gcfg, g, nb_topology_tp(topo), NULL);
    nb_generator_free(g);
    nb_optim *opt = sgd(m);
    train_layout(m, opt, topo, NULL, 0, K - 1);
    MT_OK(nb_gpt_tp_save(m, opt, path, mt_rank == 0));
    MT_OK(nb_barrier(mt_world));
    nb_optim_free(opt);
    nb_module_free(m);
    nb_topology_free(topo);
    /* the file is a nanoGPT-named model */
    nb_module *plain = nb_gpt_new(&gcfg, NULL);
    MT_OK(nb_gpt_load(plain, path));
    /* resume under tp 1 (alone) and under every layout of the world */
    nb_comm *self = nb_comm_self();
    for (int tp = 0; tp <= mt_size; tp = tp ? tp * 2 : 1) {
        nb_topology *t = tp ? nb_topology_new(mt_world, &(nb_topology_opts){.pp = 1, .tp = tp})
                            : nb_topology_new(self, NULL);
        nb_module *r = nb_gpt_tp_new(&gcfg, NULL, nb_topology_tp(t), NULL);
        nb_optim *o = sgd(r);
        /* momentum state exists only after a step: make it, then overwrite everything */
        train_layout(r, o, t, NULL, 0, 1);
        MT_OK(nb_gpt_tp_load(r, o, path));
        nb_ddp *ddp = nb_topology_dp_size(t) > 1 ? nb_ddp_new(r, nb_topology_dp(t), NULL) : NULL;
        train_layout(r, o, t, ddp, K - 1, K);
        nb_module *full = nb_gpt_new(&gcfg, NULL);
        MT_OK(nb_gpt_tp_gather(r, full));
        const nb_params *ps = nb_parameters(ref);
        for (int i = 0; i < ps->count; i++) {
            char what[160];
            snprintf(what, sizeof what, "resumed under tp %d: %s", tp ? tp : 1, ps->names[i]);
            EXPECT_CLOSE(nb_module_find(full, ps->names[i]), ps->tensors[i], 1e-5, what);
        }
        nb_module_free(full);
        nb_ddp_free(ddp);
        nb_optim_free(o);
        nb_module_free(r);
        nb_topology_free(t);
    }
    /* a model of another size is refused, nothing changed */
    nb_gpt_config other = gcfg;
    other.n_embd = 32;
    nb_module *wrong = nb_gpt_tp_new(&other, NULL, self, NULL);
    nb_tensor *before = nb_clone(nb_module_find(wrong, "transformer.wte.weight"));
    MT_CHECK(nb_gpt_tp_load(wrong, NULL, path) == NB_ESHAPE, "another size: %s", nb_last_error());
    nb_clear_error();
    EXPECT_CLOSE(nb_module_find(wrong, "transformer.wte.weight"), before, 0, "unchanged");
    nb_tensor_free(before);
    nb_module_free(wrong);
    nb_comm_free(self);
    MT_OK(nb_barrier(mt_world));
    if (mt_rank == 0) remove(path);
    nb_module_free(plain);
    nb_optim_free(ropt);
    nb_module_free(ref);
    MT_END();
}
END_TEST

/* Remove dir's files and dir (one level: a checkpoint series of directories, two). */
static void remove_tree(const char *dir, int depth) {
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[1300];
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p) continue;
        if (unlink(p) != 0 && depth > 0) remove_tree(p, depth - 1);
    }
    if (d) closedir(d);
    rmdir(dir);
}

/* A sharded checkpoint saved asynchronously at tp 2 (dp the rest; tp 1 alone) after K - 1
 * steps: no index until the ranks agree their files are durable (at _wait), then
 * nb_checkpoint_latest finds it; it resumes under tp 1 (each rank alone) and every layout of
 * the world, one more step giving the weights of K steps of 1 process, and consolidates to
 * the nanoGPT-named model nb_gpt_load reads. */
START_TEST(test_gpt_tp_sharded_checkpoint) {
    nb_generator *g = nb_generator_new(11);
    nb_module *ref = nb_gpt_new(&gcfg, g);
    nb_generator_free(g);
    nb_optim *ropt = sgd(ref);
    for (int k = 0; k < K; k++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        batch(k, 0, GB, &x, &y);
        MT_CHECK(isfinite(nb_gpt_train_step(ref, ropt, NULL, &x, &y, 1, 0.5, NULL)), "reference");
        nb_scope_end();
    }
    char base[256], member[4096], index[4200], latest[4096], file[300];
    snprintf(base, sizeof base, "/tmp/nb-test-tpck-%d/", (int)getppid());
    snprintf(file, sizeof file, "/tmp/nb-test-tpck-%d.safetensors", (int)getppid());
    MT_OK(nb_checkpoint_path(base, K - 1, member, sizeof member));
    snprintf(index, sizeof index, "%s/index.safetensors", member);
    const int tp0 = mt_size >= 2 ? 2 : 1;
    nb_topology *topo = nb_topology_new(mt_world, &(nb_topology_opts){.pp = 1, .tp = tp0});
    g = nb_generator_new(11);
    nb_module *m = nb_gpt_tp_new(&gcfg, g, nb_topology_tp(topo), NULL);
    nb_generator_free(g);
    nb_optim *opt = sgd(m);
    nb_ddp *ddp0 = nb_topology_dp_size(topo) > 1 ? nb_ddp_new(m, nb_topology_dp(topo), NULL) : NULL;
    train_layout(m, opt, topo, ddp0, 0, K - 1);
    nb_checkpoint_writer *w = nb_checkpoint_writer_new(NULL);
    nb_checkpoint ck = {.model = m, .optim = opt, .step = K - 1};
    MT_OK(nb_gpt_tp_save_async(&ck, nb_topology_dp(topo), w, base, 2));
    MT_CHECK(access(index, F_OK) != 0, "%s exists before the ranks agreed", index);
    MT_OK(nb_gpt_tp_save_wait(m, nb_topology_dp(topo), w));
    MT_OK(nb_barrier(mt_world));
    MT_CHECK(access(index, F_OK) == 0, "no %s after nb_gpt_tp_save_wait", index);
    int64_t step = -1;
    MT_OK(nb_checkpoint_latest(base, latest, sizeof latest, &step));
    MT_CHECK(step == K - 1 && strstr(latest, "checkpoint-"), "latest: %s step %lld", latest,
             (long long)step);
    MT_OK(nb_checkpoint_writer_free(w));
    nb_ddp_free(ddp0);
    nb_optim_free(opt);
    nb_module_free(m);
    nb_topology_free(topo);
    /* consolidated: the nanoGPT-named model */
    snprintf(file + strlen(file) - 12, 40, "-%d.safetensors", mt_rank);
    step = -1;
    MT_OK(nb_gpt_tp_consolidate_dir(member, file, &step));
    MT_CHECK(step == K - 1, "consolidated step %lld", (long long)step);
    nb_module *plain = nb_gpt_new(&gcfg, NULL);
    MT_OK(nb_gpt_load(plain, file));
    remove(file);
    nb_module_free(plain);
    /* the whole checkpoint into a 1-rank GPT (one process): one more step is the reference */
    nb_module *one = nb_gpt_new(&gcfg, NULL);
    nb_optim *oo = sgd(one);
    for (int k = 0; k < K; k++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        batch(k, 0, GB, &x, &y);
        if (k == 1) { /* momentum state exists after a step: then load over everything */
            nb_checkpoint lc = {.model = one, .optim = oo};
            MT_OK(nb_gpt_tp_checkpoint_load(member, &lc));
            MT_CHECK(lc.step == K - 1 && lc.run_id[0], "loaded step %lld", (long long)lc.step);
            k = K - 1;
            batch(k, 0, GB, &x, &y);
        }
        MT_CHECK(isfinite(nb_gpt_train_step(one, oo, NULL, &x, &y, 1, 0.5, NULL)), "one");
        nb_scope_end();
    }
    const nb_params *rps = nb_parameters(ref);
    for (int i = 0; i < rps->count; i++) {
        char what[160];
        snprintf(what, sizeof what, "sharded, resumed in 1 process: %s", rps->names[i]);
        EXPECT_CLOSE(nb_module_find(one, rps->names[i]), rps->tensors[i], 1e-5, what);
    }
    nb_optim_free(oo);
    nb_module_free(one);
    /* resume under tp 1 (alone) and under every layout of the world */
    nb_comm *self = nb_comm_self();
    for (int tp = 0; tp <= mt_size; tp = tp ? tp * 2 : 1) {
        nb_topology *t = tp ? nb_topology_new(mt_world, &(nb_topology_opts){.pp = 1, .tp = tp})
                            : nb_topology_new(self, NULL);
        nb_module *r = nb_gpt_tp_new(&gcfg, NULL, nb_topology_tp(t), NULL);
        nb_optim *o = sgd(r);
        train_layout(r, o, t, NULL, 0, 1); /* momentum state exists only after a step */
        MT_OK(nb_gpt_tp_load(r, o, member)); /* sharded */
        nb_ddp *ddp = nb_topology_dp_size(t) > 1 ? nb_ddp_new(r, nb_topology_dp(t), NULL) : NULL;
        train_layout(r, o, t, ddp, K - 1, K);
        nb_module *full = nb_gpt_new(&gcfg, NULL);
        MT_OK(nb_gpt_tp_gather(r, full));
        const nb_params *ps = nb_parameters(ref);
        for (int i = 0; i < ps->count; i++) {
            char what[160];
            snprintf(what, sizeof what, "sharded, resumed under tp %d: %s", tp ? tp : 1,
                     ps->names[i]);
            EXPECT_CLOSE(nb_module_find(full, ps->names[i]), ps->tensors[i], 1e-5, what);
        }
        nb_module_free(full);
        nb_ddp_free(ddp);
        nb_optim_free(o);
        nb_module_free(r);
        nb_topology_free(t);
    }
    /* a bit flipped in one rank's file: loading refuses it, nothing changed */
    MT_OK(nb_barrier(mt_world));
    if (mt_rank == 0) {
        char shard[4400] = "";
        DIR *d = opendir(member);
        for (struct dirent *e; d && (e = readdir(d));)
            if (strstr(e->d_name, "-0-of-")) snprintf(shard, sizeof shard, "%s/%s", member, e->d_name);
        if (d) closedir(d);
        FILE *fp = fopen(shard, "r+b");
        MT_CHECK(fp && fseek(fp, -3, SEEK_END) == 0, "open %s", shard);
        int ch = fp ? fgetc(fp) : 0;
        if (fp && fseek(fp, -3, SEEK_END) == 0) fputc(ch ^ 0x10, fp);
        if (fp) fclose(fp);
    }
    MT_OK(nb_barrier(mt_world));
    nb_module *lone = nb_gpt_tp_new(&gcfg, NULL, self, NULL);
    nb_tensor *before = nb_clone(nb_module_find(lone, "transformer.wte.weight"));
    MT_CHECK(nb_gpt_tp_load(lone, NULL, member) == NB_EFORMAT && strstr(nb_last_error(), "corrupt"),
             "a flipped bit: %s", nb_last_error());
    nb_clear_error();
    EXPECT_CLOSE(nb_module_find(lone, "transformer.wte.weight"), before, 0, "unchanged");
    nb_tensor_free(before);
    nb_module_free(lone);
    nb_comm_free(self);
    MT_OK(nb_barrier(mt_world));
    if (mt_rank == 0) remove_tree(base, 1);
    nb_optim_free(ropt);
    nb_module_free(ref);
    MT_END();
}
END_TEST

/* Slicing a model and gathering it back is the identity; the init equals the 1-rank init
 * sliced; bad splits are refused on every rank. */
START_TEST(test_gpt_tp_init_and_errors) {
    nb_generator *g = nb_generator_new(3), *g2 = nb_generator_new(3);
    nb_module *ref = nb_gpt_new(&gcfg, g);
    nb_module *m = nb_gpt_tp_new(&gcfg, g2, mt_world, NULL);
    nb_module *full = nb_gpt_new(&gcfg, NULL);
    MT_CHECK(ref && m && full, "%s", nb_last_error());
    MT_OK(nb_gpt_tp_gather(m, full));
    const nb_params *ps = nb_parameters(ref);
    for (int i = 0; i < ps->count; i++)
        EXPECT_CLOSE(nb_module_find(full, ps->names[i]), ps->tensors[i], 0, ps->names[i]);
    MT_CHECK(nb_gpt_tp_get_config(m) && nb_gpt_tp_get_config(m)->n_head == gcfg.n_head &&
                 !nb_gpt_tp_get_config(ref) && nb_gpt_tp_is_gpt_tp(m) && !nb_gpt_tp_is_gpt_tp(ref),
             "config and type");
    /* sharded: wte, and per block c_attn (weight, bias), c_fc (2), both c_proj weights */
    int nsh = 0;
    for (int i = 0; i < nb_parameters(m)->count; i++) nsh += nb_gpt_tp_param_is_sharded(m, i);
    MT_CHECK(nsh == 1 + 6 * (int)gcfg.n_layer, "%d sharded parameters", nsh);
    /* c_attn holds q, k and v of this rank's heads */
    nb_scope_begin();
    const int64_t C = gcfg.n_embd, n = C / mt_size;
    nb_tensor *w = nb_module_find(ref, "transformer.h.0.attn.c_attn.weight");
    nb_tensor *wl = nb_module_find(m, "transformer.h.0.attn.c_attn.weight");
    MT_CHECK(nb_size(wl, 0) == 3 * n, "c_attn slice rows %lld", (long long)nb_size(wl, 0));
    EXPECT_CLOSE(nb_narrow(wl, 0, n, n), nb_narrow(w, 0, C + mt_rank * n, n), 0, "k rows");
    nb_scope_end();
    if (mt_size > 1) {
        nb_gpt_config bad = gcfg;
        bad.n_head = 2 * mt_size + 1;
        bad.n_embd = bad.n_head * 2;
        EXPECT_NULL(nb_gpt_tp_new(&bad, NULL, mt_world, NULL), NB_EINVAL, "must divide n_head");
        bad = gcfg;
        bad.vocab_size = GV + 1;
        EXPECT_NULL(nb_gpt_tp_new(&bad, NULL, mt_world, NULL), NB_EINVAL, "vocab_size");
        /* sequence parallel needs T divisible by tp */
        nb_module *s = nb_gpt_tp_new(&gcfg, NULL, mt_world, &(nb_gpt_tp_opts){.sequence_parallel = true});
        nb_scope_begin();
        nb_tensor *x = nb_zeros((int64_t[]){1, mt_size + 1}, 2, NB_I64);
        EXPECT_NULL(nb_forward(s, x), NB_ESHAPE, "must divide by the tensor-parallel size");
        nb_scope_end();
        nb_module_free(s);
    }
    nb_module_free(full);
    nb_module_free(m);
    nb_module_free(ref);
    nb_generator_free(g);
    nb_generator_free(g2);
    MT_END();
}
END_TEST

/* K steps of the TP GPT over the whole world (tp = world size; dropout 0.2) with cfg.recompute
 * rc and, when prec is not f32, under autocast (fp16: with a loss scaler over the world, its
 * first scale 2^19 so that the first steps overflow). Returns the last loss; *w_sum gets the
 * sum of squares of this rank's weights, *skipped the scaler's skipped steps. */
static double tp_run(nb_gpt_recompute rc, bool sp, nb_dtype prec, double *w_sum, int64_t *skipped,
                     double *scale) {
    nb_gpt_config cfg = gcfg;
    cfg.dropout = 0.2;
    cfg.recompute = rc;
    nb_generator *g = nb_generator_new(11);
    cfg.dropout_gen = nb_generator_new(77);
    nb_module *m = nb_gpt_tp_new(&cfg, g, mt_world, &(nb_gpt_tp_opts){.sequence_parallel = sp});
    nb_generator_free(g);
    MT_CHECK(m, "build: %s", nb_last_error());
    nb_optim *opt = m ? sgd(m) : NULL;
    nb_grad_scaler_opts so = nb_grad_scaler_defaults();
    so.init_scale = 524288.0;
    nb_grad_scaler *sc = prec == NB_F16 ? nb_grad_scaler_new(&so) : NULL;
    if (sc) MT_OK(nb_grad_scaler_set_comm(sc, mt_world));
    double loss = NAN;
    for (int k = 0; k < 2 * K && opt; k++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        batch(k % K, 0, GB, &x, &y);
        if (prec != NB_F32) MT_OK(nb_autocast_begin(prec));
        double norm;
        loss = nb_gpt_tp_train_step_ex(m, opt, &x, &y, 1,
                                       &(nb_gpt_tp_step_opts){.scaler = sc, .grad_clip = 0.5},
                                       &norm);
        if (prec != NB_F32) MT_OK(nb_autocast_end());
        MT_CHECK(isfinite(loss), "step %d: %s", k, nb_last_error());
        nb_scope_end();
    }
    *w_sum = 0;
    const nb_params *ps = m ? nb_parameters(m) : NULL;
    for (int i = 0; ps && i < ps->count; i++) {
        nb_scope_begin();
        *w_sum += nb_item_f64(nb_sum(nb_mul(ps->tensors[i], ps->tensors[i]), NULL, 0, false));
        nb_scope_end();
    }
    *skipped = sc ? nb_grad_scaler_num_skipped(sc) : 0;
    *scale = sc ? nb_grad_scaler_get_scale(sc) : 0;
    nb_grad_scaler_free(sc);
    nb_optim_free(opt);
    nb_module_free(m);
    nb_generator_free(cfg.dropout_gen);
    return loss;
}

/* Activation checkpointing of the TP GPT (FULL: each block with its collectives replayed;
 * ATTN: this rank's attention core) gives bit-identical losses and weights, with dropout and
 * with sequence parallelism; bf16 and fp16 (loss scaling, the overflow check global over the
 * world) end within 2% of f32, every rank skipping the same overflowed steps. */
START_TEST(test_gpt_tp_recompute_precision) {
    for (int sp = 0; sp < 2; sp++) {
        double w0, w1, w2;
        int64_t sk;
        double sc;
        const double l0 = tp_run(NB_GPT_RECOMPUTE_NONE, sp, NB_F32, &w0, &sk, &sc);
        const double l1 = tp_run(NB_GPT_RECOMPUTE_FULL, sp, NB_F32, &w1, &sk, &sc);
        const double l2 = tp_run(NB_GPT_RECOMPUTE_ATTN, sp, NB_F32, &w2, &sk, &sc);
        MT_CHECK(l1 == l0 && w1 == w0, "sp %d recompute full: loss %.17g vs %.17g, weights "
                 "%.17g vs %.17g", sp, l1, l0, w1, w0);
        MT_CHECK(l2 == l0 && w2 == w0, "sp %d recompute attn: loss %.17g vs %.17g, weights "
                 "%.17g vs %.17g", sp, l2, l0, w2, w0);
        if (sp) continue;
        double wb, wh;
        const double lb = tp_run(NB_GPT_RECOMPUTE_NONE, false, NB_BF16, &wb, &sk, &sc);
        MT_CHECK(fabs(lb - l0) <= 0.02 * l0 && lb != l0, "bf16 loss %.6g vs f32 %.6g", lb, l0);
        const double lh = tp_run(NB_GPT_RECOMPUTE_FULL, false, NB_F16, &wh, &sk, &sc);
        MT_CHECK(fabs(lh - l0) <= 0.02 * l0, "fp16 loss %.6g vs f32 %.6g", lh, l0);
        MT_CHECK(sk >= 1 && sk < 2 * K && sc < 524288.0,
                 "fp16: %lld steps skipped, scale %g (2^19 at first)", (long long)sk, sc);
        /* every rank skipped the same steps and holds the same scale */
        nb_scope_begin();
        nb_tensor *t = nb_from_buffer((double[]){(double)sk, sc, -(double)sk, -sc},
                                      (int64_t[]){4}, 1, NB_F64);
        MT_OK(nb_allreduce(mt_world, t, NB_REDUCE_MAX));
        double v[4] = {0};
        MT_OK(nb_read(t, v, 4, NB_F64));
        MT_CHECK(v[0] == -v[2] && v[1] == -v[3], "the ranks disagree: skipped %g..%g, scale "
                 "%g..%g", -v[2], v[0], -v[3], v[1]);
        nb_scope_end();
    }
    MT_END();
}
END_TEST

Suite *mt_suite_tp(void) {
    Suite *s = suite_create("tp");
    TCase *tc = tcase_create("tp");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_topology_layouts);
    tcase_add_test(tc, test_topology_errors);
    tcase_add_test(tc, test_collectives_grad);
    tcase_add_test(tc, test_collectives_errors);
    tcase_add_test(tc, test_tp_mlp_equivalence);
    tcase_add_test(tc, test_gpt_tp_init_and_errors);
    tcase_add_test(tc, test_gpt_tp_equivalence);
    tcase_add_test(tc, test_gpt_tp_checkpoint_layouts);
    tcase_add_test(tc, test_gpt_tp_sharded_checkpoint);
    tcase_add_test(tc, test_gpt_tp_dropout_equivalence);
    tcase_add_test(tc, test_gpt_tp_recompute_precision);
    suite_add_tcase(s, tc);
    return s;
}
