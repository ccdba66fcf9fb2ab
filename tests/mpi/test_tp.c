/* test_tp.c - the autograd-aware collectives and the public tensor-parallel layers of
 * nabla/tp.h, in nabla_mpi_tests (1, 2 and 4 ranks, and alone).
 *
 * The collectives are checked as gradcheck across ranks: each rank's loss is sum(y * r_k)
 * with r_k known to every rank, so the gradient of the total loss (the sum over ranks) with
 * respect to each rank's input is known in closed form, and every rank compares its forward
 * output and its input gradient with it. The layers are checked against the 1-rank layers
 * drawn from the same seed, with and without sequence parallelism: outputs and gradients
 * agree to 1e-5 relative, and so does the gradient norm read from their placements. (Plans,
 * which the layers' styles come from, are tested in test_mesh.c; the GPT's in
 * test_parallel_gpt.c.) */
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

#define EXPECT_CLOSE(a, b, tol, what)                                                      \
    do {                                                                                   \
        double d_ = mt_tensor_rel_diff((a), (b));                                                    \
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
        y = run_op(nb_allgather_along, x, dim, full(k), &g);
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

/* The 1-rank MLP (fc, gelu, proj) and the tensor-parallel one from the same seed agree: output
 * and gradients (the TP gradients are slices of the 1-rank ones), with and without sequence
 * parallelism (then each rank gives and gets its (B, T/tp, IN) shard, and the replicated
 * bias's partial gradient is summed by a reducer over the one data-parallel rank). */
static void check_mlp(bool sp) {
    nb_mesh *mesh = nb_mesh_new(mt_world, "tp", (int[]){-1});
    nb_generator *g1 = nb_generator_new(5), *g2 = nb_generator_new(5);
    nb_linear_opts o = nb_linear_defaults();
    o.gen = g1;
    nb_module *fc = nb_linear_new(IN, HID, &o), *proj = nb_linear_new(HID, IN, &o);
    nb_tp_linear_opts to = nb_tp_linear_defaults();
    to.linear.gen = g2;
    to.sequence_parallel = sp;
    nb_module *tfc = nb_column_parallel_linear_new(IN, HID, mesh, &to);
    nb_module *tproj = nb_row_parallel_linear_new(HID, IN, mesh, &to);
    MT_CHECK(fc && proj && tfc && tproj, "build: %s", nb_last_error());
    nb_module *tp_mlp = tfc && tproj ? nb_sequential_new(tfc, nb_gelu_new(false), tproj, NULL) : NULL;
    nb_ddp *red = sp && tp_mlp ? nb_ddp_new(tp_mlp, nb_mesh_group(mesh, "dp"), NULL) : NULL;
    MT_CHECK(!sp || red, "reducer: %s", nb_last_error());
    nb_scope_begin();
    nb_tensor *x = nb_randn((int64_t[]){B, T * mt_size, IN}, 3, NB_F32, g1); /* same everywhere */
    nb_tensor *y1 = nb_forward(proj, nb_gelu(nb_forward(fc, x)));
    nb_tp_comm_stats_reset();
    nb_tensor *xin = sp ? nb_narrow(x, 1, T * mt_rank, T) : x;  /* this rank's shard */
    nb_tensor *y2 = nb_forward(tp_mlp, xin);
    EXPECT_CLOSE(y2, sp ? nb_narrow(y1, 1, T * mt_rank, T) : y1, 1e-5, "forward");
    nb_tensor *w = nb_randn((int64_t[]){B, T * mt_size, IN}, 3, NB_F32, g2); /* same on every rank */
    MT_OK(nb_backward(nb_sum(nb_mul(y1, w), NULL, 0, false)));
    MT_OK(nb_backward(nb_sum(nb_mul(y2, sp ? nb_narrow(w, 1, T * mt_rank, T) : w), NULL, 0, false)));
    /* without sp: one allreduce forward (row-wise) and none backward (x needs no gradient) */
    nb_tp_comm_stats cs;
    nb_tp_comm_stats_get(&cs);
    const int64_t whole = (int64_t)B * T * mt_size * IN * 4 / mt_size * (mt_size - 1);
    MT_CHECK(sp || mt_size == 1 || (cs.calls == 1 && cs.bytes == 2 * whole),
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
    /* the global gradient norm from the placements equals the 1-rank one, on every rank */
    nb_params ps1 = {4, (nb_tensor *[]){nb_module_param(fc, "weight"), nb_module_param(fc, "bias"),
                                       nb_module_param(proj, "weight"), nb_module_param(proj, "bias")},
                     NULL};
    const double n1 = nb_clip_grad_norm(&ps1, INFINITY, 2);
    const double n2 = tp_mlp ? nb_clip_grad_norm(nb_parameters(tp_mlp), INFINITY, 2) : NAN;
    MT_CHECK(n1 > 0 && fabs(n1 - n2) <= 1e-5 * n1, "grad norm %g vs %g", n2, n1);
    /* gather_output / !input_is_parallel: the same function again, from whole activations */
    if (!sp) {
        nb_tp_linear_opts go = nb_tp_linear_defaults();
        go.linear.gen = nb_generator_new(5);
        go.gather_output = true;
        go.input_is_parallel = false;
        nb_module *gfc = nb_column_parallel_linear_new(IN, HID, mesh, &go);
        nb_module *sproj = nb_row_parallel_linear_new(HID, IN, mesh, &go);
        EXPECT_CLOSE(nb_forward(sproj, nb_gelu(nb_forward(gfc, x))), y1, 1e-5, "gathered forward");
        nb_generator_free(go.linear.gen);
        nb_module_free(gfc);
        nb_module_free(sproj);
    }
    nb_scope_end();
    /* errors */
    if (mt_size > 1)
        EXPECT_NULL(nb_column_parallel_linear_new(IN, 4 * mt_size + 1, mesh, NULL), NB_EINVAL,
                    "does not split into");
    nb_ddp_free(red);
    nb_module_free(tp_mlp);
    nb_module_free(fc);
    nb_module_free(proj);
    nb_generator_free(g1);
    nb_generator_free(g2);
    nb_mesh_free(mesh);
    MT_END();
}

START_TEST(test_tp_mlp_equivalence) { check_mlp(false); }
END_TEST

START_TEST(test_tp_mlp_sequence_parallel) { check_mlp(true); }
END_TEST

Suite *mt_suite_tp(void) {
    Suite *s = suite_create("tp");
    TCase *tc = tcase_create("tp");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_collectives_grad);
    tcase_add_test(tc, test_collectives_errors);
    tcase_add_test(tc, test_tp_mlp_equivalence);
    tcase_add_test(tc, test_tp_mlp_sequence_parallel);
    suite_add_tcase(s, tc);
    return s;
}
