/* test_mesh.c - the device mesh and placements of nabla/mesh.h and tensor parallelism by plan
 * (nb_parallelize, nabla/tp.h), in nabla_mpi_tests (1, 2 and 4 ranks, and alone).
 *
 * The mesh: sizes, coordinates in Megatron's order, the groups, and a layout that the ranks
 * disagree on refused on every rank. Placements: set, read, checked against the tensor, and
 * the rule that counts each distinct part once (of a piece several ranks hold, its first
 * copy). Plans: a small model of linear layers made
 * tensor parallel by a plan equals the 1-rank model built from the same seed (outputs, loss,
 * gradients gathered back, and the global gradient norm read from the placements), a
 * column-wise rule on fewer units than ranks replicates each unit, and plan errors are the
 * same error on every rank. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_test.h"

static void expect_null_at(const void *got, nb_status status, const char *needle,
                           const char *file, int line) {
    if (got || nb_last_status() != status || !strstr(nb_last_error(), needle))
        mt_fail_at(file, line, "got %p %s \"%s\", expected NULL with %s and \"%s\"", got,
                   nb_status_name(nb_last_status()), nb_last_error(), nb_status_name(status),
                   needle);
    nb_clear_error();
}
#define EXPECT_NULL(got, status, needle) expect_null_at((got), (status), (needle), __FILE__, __LINE__)

static void expect_status_at(nb_status got, nb_status status, const char *needle,
                             const char *file, int line) {
    if (got != status || !strstr(nb_last_error(), needle))
        mt_fail_at(file, line, "got %s \"%s\", expected %s and \"%s\"", nb_status_name(got),
                   nb_last_error(), nb_status_name(status), needle);
    nb_clear_error();
}
#define EXPECT_STATUS(got, status, needle) \
    expect_status_at((got), (status), (needle), __FILE__, __LINE__)

/* ---- the mesh -------------------------------------------------------------------------------- */
START_TEST(test_mesh_layout) {
    /* tp = 2 where the world allows, dp the rest: tp ranks adjacent */
    const int tp = mt_size % 2 == 0 ? 2 : 1, dp = mt_size / tp;
    nb_mesh *m = nb_mesh_new(mt_world, "dp tp", (int[]){-1, tp});
    MT_CHECK(m != NULL, "mesh: %s", nb_last_error());
    if (m) {
        MT_CHECK(nb_mesh_size(m, "tp") == tp && nb_mesh_size(m, "dp") == dp, "sizes %d %d",
                 nb_mesh_size(m, "tp"), nb_mesh_size(m, "dp"));
        MT_CHECK(nb_mesh_size(m, "pp") == 1 && nb_mesh_rank(m, "pp") == 0, "absent pp");
        MT_CHECK(nb_mesh_rank(m, "tp") == mt_rank % tp, "tp rank %d", nb_mesh_rank(m, "tp"));
        MT_CHECK(nb_mesh_rank(m, "dp") == mt_rank / tp, "dp rank %d", nb_mesh_rank(m, "dp"));
        MT_CHECK(nb_mesh_size(m, "dp tp") == mt_size && nb_mesh_rank(m, "tp dp") == mt_rank,
                 "the whole mesh");
        nb_comm *g = nb_mesh_group(m, "tp");
        MT_CHECK(g && nb_comm_size(g) == tp && nb_comm_rank(g) == mt_rank % tp, "tp group");
        g = nb_mesh_group(m, "dp");
        MT_CHECK(g && nb_comm_size(g) == dp && nb_comm_rank(g) == mt_rank / tp, "dp group");
        /* a sum over the tp group adds exactly the tp neighbours */
        nb_scope_begin();
        nb_tensor *t = nb_full((int64_t[]){1}, 1, NB_F64, mt_rank);
        MT_OK(nb_allreduce(nb_mesh_group(m, "tp"), t, NB_REDUCE_SUM));
        double want = 0;
        for (int k = 0; k < tp; k++) want += (mt_rank / tp) * tp + k;
        MT_CHECK(nb_item_f64(t) == want, "tp sum %g, want %g", nb_item_f64(t), want);
        nb_scope_end();
        EXPECT_NULL(nb_mesh_group(m, "xp"), NB_EINVAL, "unknown mesh dimension \"xp\"");
        MT_CHECK(nb_mesh_size(m, "xp") < 0, "unknown size");
        nb_clear_error();
        char want_desc[64];
        if (dp > 1 && tp > 1) snprintf(want_desc, sizeof want_desc, "dp=%d tp=%d", dp, tp);
        else if (dp > 1) snprintf(want_desc, sizeof want_desc, "dp=%d", dp);
        else if (tp > 1) snprintf(want_desc, sizeof want_desc, "tp=%d", tp);
        else snprintf(want_desc, sizeof want_desc, "dp=1");
        MT_CHECK(!strcmp(nb_mesh_describe(m), want_desc), "describe \"%s\", want \"%s\"",
                 nb_mesh_describe(m), want_desc);
    }
    nb_mesh_free(m);
    /* the order the names are listed in does not change the rank order (Megatron's) */
    if (mt_size == 4) {
        m = nb_mesh_new(mt_world, "tp pp dp", (int[]){2, 2, 1});
        MT_CHECK(m && nb_mesh_rank(m, "tp") == mt_rank % 2 && nb_mesh_rank(m, "pp") == mt_rank / 2,
                 "pp slowest: %s", m ? nb_mesh_describe(m) : nb_last_error());
        nb_mesh_free(m);
    }
    MT_END();
}
END_TEST

START_TEST(test_mesh_errors) {
    EXPECT_NULL(nb_mesh_new(mt_world, "dp xp", (int[]){-1, 1}), NB_EINVAL,
                "unknown mesh dimension \"xp\"");
    EXPECT_NULL(nb_mesh_new(mt_world, "dp dp", (int[]){-1, 1}), NB_EINVAL, "named twice");
    EXPECT_NULL(nb_mesh_new(mt_world, "dp tp", (int[]){-1, 0}), NB_EINVAL, "must be >= 1");
    EXPECT_NULL(nb_mesh_new(mt_world, "dp tp", (int[]){mt_size + 1, 1}), NB_EINVAL,
                "but the world has");
    EXPECT_NULL(nb_mesh_new(mt_world, "dp tp", (int[]){-1, 3 * mt_size + 1}), NB_EINVAL,
                "does not divide");
    /* ranks that disagree: rank 0 thinks tp = 1, the others tp = size; all refuse */
    if (mt_size > 1) {
        int tp = mt_rank == 0 ? 1 : mt_size;
        EXPECT_NULL(nb_mesh_new(mt_world, "dp tp", (int[]){-1, tp}), NB_EINVAL,
                    "the ranks disagree on the layout");
        /* and the next collective still pairs up */
        nb_mesh *m = nb_mesh_new(mt_world, "dp", (int[]){-1});
        MT_CHECK(m != NULL, "after the refusal: %s", nb_last_error());
        nb_mesh_free(m);
    }
    MT_END();
}
END_TEST

/* ---- placements ------------------------------------------------------------------------------ */
START_TEST(test_placement_rules) {
    const int tp = mt_size % 2 == 0 ? 2 : 1;
    nb_mesh *m = nb_mesh_new(mt_world, "dp tp", (int[]){-1, tp});
    nb_tensor *t = nb_zeros((int64_t[]){8 / tp, 3}, 2, NB_F32);
    nb_placement p = {.mesh = m, .ndim = 2, .shape = {8, 3}, .n = 1,
                      .places = {{.kind = NB_PLACE_SHARD, .mesh_dim = "tp", .dim = 0, .blocks = 1,
                                  .offset = 8 / tp * nb_mesh_rank(m, "tp"), .length = 8 / tp}}};
    MT_OK(nb_tensor_set_placement(t, &p));
    nb_placement q;
    MT_OK(nb_tensor_placement(t, &q));
    MT_CHECK(q.mesh == m && q.n == 1 && q.shape[0] == 8 && q.places[0].length == 8 / tp,
             "read back");
    /* a shard counts on every tp rank, once per dp replica */
    MT_CHECK(nb_placement_counts(&q) == (nb_mesh_rank(m, "dp") == 0), "shard counts");
    char buf[128];
    nb_placement_describe(&q, buf, sizeof buf);
    MT_CHECK(strstr(buf, "shard(dim 0 over tp") != NULL, "describe: %s", buf);
    /* a replicated tensor counts on coordinate 0 of every dimension only */
    nb_placement r = {.mesh = m, .ndim = 1, .shape = {5}};
    MT_CHECK(nb_placement_counts(&r) == (mt_rank == 0), "replicated counts");
    /* mistakes are refused and leave the tensor as it was */
    p.places[0].offset = 8;
    EXPECT_STATUS(nb_tensor_set_placement(t, &p), NB_ESHAPE, "does not fit dim");
    p.places[0].offset = 0;
    p.ndim = 1;
    EXPECT_STATUS(nb_tensor_set_placement(t, &p), NB_ESHAPE, "the whole shape has 1 dims");
    p.ndim = 2;
    p.places[0].kind = NB_PLACE_REPLICATE;
    EXPECT_STATUS(nb_tensor_set_placement(t, &p), NB_EINVAL, "pipeline copies");
    MT_OK(nb_tensor_placement(t, &q));
    MT_CHECK(q.places[0].kind == NB_PLACE_SHARD, "unchanged after a refusal");
    /* a plain tensor reads as whole */
    nb_tensor *u = nb_zeros((int64_t[]){4}, 1, NB_F32);
    MT_OK(nb_tensor_placement(u, &q));
    MT_CHECK(!q.mesh && q.n == 0 && q.shape[0] == 4 && nb_placement_counts(&q), "plain");
    nb_tensor_free(u);
    nb_tensor_free(t);
    nb_mesh_free(m);
    MT_END();
}
END_TEST

/* A piece held by several ranks (copies): set, read, described, counted once (on its first
 * copy), and the wrong uses refused. tp = the world (2 or 4 ranks) in pairs of copies; alone
 * (tp 1) only what a size-1 dimension allows. */
START_TEST(test_placement_copies) {
    const int tp = mt_size % 2 == 0 ? mt_size : 1;
    nb_mesh *m = nb_mesh_new(mt_world, "dp tp", (int[]){-1, tp});
    const int r = nb_mesh_rank(m, "tp"), c = tp > 1 ? 2 : 1, pieces = tp / c;
    const int64_t len = 8 / pieces;
    nb_tensor *t = nb_zeros((int64_t[]){len, 3}, 2, NB_F32);
    nb_placement p = {.mesh = m, .ndim = 2, .shape = {8, 3}, .n = 1,
                      .places = {{.kind = NB_PLACE_SHARD, .mesh_dim = "tp", .dim = 0, .blocks = 1,
                                  .offset = len * (r / c), .length = len, .copies = c}}};
    MT_OK(nb_tensor_set_placement(t, &p));
    nb_placement q;
    MT_OK(nb_tensor_placement(t, &q));
    MT_CHECK(q.n == 1 && q.places[0].copies == c && q.places[0].offset == len * (r / c),
             "read back: copies %d offset %lld", q.places[0].copies, (long long)q.places[0].offset);
    /* the first copy of each piece counts, once per dp replica */
    MT_CHECK(nb_placement_counts(&q) == (r % c == 0 && nb_mesh_rank(m, "dp") == 0),
             "tp rank %d of %d, %d copies: counts %d", r, tp, c, nb_placement_counts(&q));
    char buf[160];
    nb_placement_describe(&q, buf, sizeof buf);
    if (c > 1) {
        char want[96];
        snprintf(want, sizeof want, "shard(dim 0 over tp: %lld of 8 at %lld, held by 2 ranks)",
                 (long long)len, (long long)(len * (r / c)));
        MT_CHECK(!strcmp(buf, want), "describe: \"%s\", expected \"%s\"", buf, want);
    }
    /* 0 (a zero-initialised entry) and 1 are one rank: no copies in the description */
    nb_placement one = q;
    one.places[0].copies = 0, one.places[0].offset = 0, one.places[0].length = 8;
    nb_placement_describe(&one, buf, sizeof buf);
    MT_CHECK(!strcmp(buf, "shard(dim 0 over tp: 8 of 8 at 0)"), "describe: %s", buf);
    /* wrong uses, refused with the tensor unchanged */
    p.places[0].copies = -1;
    EXPECT_STATUS(nb_tensor_set_placement(t, &p), NB_EINVAL, "-1 copies over tp");
    p.places[0].copies = 3;
    EXPECT_STATUS(nb_tensor_set_placement(t, &p), NB_EINVAL, "do not split into groups of 3");
    p.places[0].copies = 2 * tp;
    EXPECT_STATUS(nb_tensor_set_placement(t, &p), NB_EINVAL, "do not split into groups");
    nb_placement part = {.mesh = m, .ndim = 2, .shape = {len, 3}, .n = 1,
                         .places = {{.kind = NB_PLACE_PARTIAL, .mesh_dim = "tp", .copies = 2}}};
    EXPECT_STATUS(nb_tensor_set_placement(t, &part), NB_EINVAL, "copies (> 1) are for the shard");
    nb_tensor *f = nb_zeros((int64_t[]){4}, 1, NB_F32);
    nb_placement flat = {.mesh = m, .ndim = 2, .shape = {len, 3}, .n = 1,
                         .places = {{.kind = NB_PLACE_SHARD, .mesh_dim = "tp",
                                     .dim = NB_PLACE_FLAT, .blocks = 1, .offset = 0, .length = 4,
                                     .copies = 2}}};
    EXPECT_STATUS(nb_tensor_set_placement(f, &flat), NB_EINVAL, "copies (> 1) are for the shard");
    MT_OK(nb_tensor_placement(t, &q));
    MT_CHECK(q.places[0].copies == c, "unchanged after a refusal");
    nb_tensor_free(f);
    nb_tensor_free(t);
    nb_mesh_free(m);
    MT_END();
}
END_TEST

/* ---- plans ----------------------------------------------------------------------------------- */
/* A two-layer MLP and a classifier head: (B, 16) -> 32 -> 16 -> logits (B, 8). */
static nb_module *mlp(uint64_t seed) {
    nb_generator *g = nb_generator_new(seed);
    nb_linear_opts o = nb_linear_defaults();
    o.gen = g;
    nb_module *m = nb_sequential_new(nb_linear_new(16, 32, &o), nb_gelu_new(false),
                                     nb_linear_new(32, 16, &o), nb_linear_new(16, 8, &o), NULL);
    nb_generator_free(g);
    return m;
}

static const nb_tp_rule mlp_plan[] = {
    {"0", NB_TP_COLWISE}, {"2", NB_TP_ROWWISE}, {"3", NB_TP_COLWISE}, {0}};

/* loss of model on a fixed batch; gradients accumulated into the parameters */
static double run_loss(nb_module *m) {
    nb_scope_begin();
    nb_generator *g = nb_generator_new(5);
    nb_tensor *x = nb_randn((int64_t[]){6, 16}, 2, NB_F32, g);
    nb_tensor *y = nb_randint((int64_t[]){6}, 1, NB_I64, 0, 8, g);
    nb_generator_free(g);
    nb_tensor *loss = nb_cross_entropy(nb_forward(m, x), y, NULL);
    double v = loss ? nb_item_f64(loss) : NAN;
    if (loss && nb_backward(loss) != NB_OK) v = NAN;
    nb_scope_end();
    return v;
}

START_TEST(test_plan_equals_one_rank) {
    const int tp = mt_size % 2 == 0 ? 2 : 1;
    nb_mesh *mesh = nb_mesh_new(mt_world, "dp tp", (int[]){-1, tp});
    nb_module *ref = mlp(11), *m = mlp(11);
    MT_OK(nb_parallelize(m, mesh, mlp_plan, NULL));
    double l1 = run_loss(ref), lp = run_loss(m);
    MT_CHECK(fabs(l1 - lp) <= 1e-5 * fabs(l1), "loss %.8g vs 1 rank %.8g (%s)", lp, l1,
             nb_last_error());
    /* every parameter: its part of the 1-rank parameter and gradient */
    const nb_params *pr = nb_parameters(ref), *pp = nb_parameters(m);
    MT_CHECK(pr->count == pp->count, "parameter count");
    for (int i = 0; i < pr->count && i < pp->count; i++) {
        nb_placement pl;
        MT_OK(nb_tensor_placement(pp->tensors[i], &pl));
        nb_scope_begin();
        nb_tensor *w = pr->tensors[i], *gw = nb_grad(pr->tensors[i]);
        for (int k = 0; k < pl.n; k++) {
            const nb_place *e = &pl.places[k];
            if (e->kind != NB_PLACE_SHARD) continue;
            w = nb_narrow(w, e->dim, e->offset, e->length);
            gw = nb_narrow(gw, e->dim, e->offset, e->length);
        }
        nb_tensor *dv = nb_amax(nb_abs(nb_sub(w, pp->tensors[i])), NULL, 0, false);
        nb_tensor *dg = nb_amax(nb_abs(nb_sub(gw, nb_grad(pp->tensors[i]))), NULL, 0, false);
        MT_CHECK(dv && nb_item_f64(dv) == 0, "%s: not the 1-rank slice", pp->names[i]);
        MT_CHECK(dg && nb_item_f64(dg) <= 1e-5, "%s: gradient differs by %g", pp->names[i],
                 dg ? nb_item_f64(dg) : NAN);
        MT_CHECK(!strcmp(pp->names[i], pr->names[i]), "names %s %s", pp->names[i], pr->names[i]);
        nb_scope_end();
    }
    /* the norm over placements is the 1-rank norm, on every rank */
    double n1 = nb_clip_grad_norm(pr, INFINITY, 2), np = nb_clip_grad_norm(pp, INFINITY, 2);
    MT_CHECK(fabs(n1 - np) <= 1e-6 * n1, "norm %.10g vs 1 rank %.10g", np, n1);
    /* a placement set by the plan is visible: layer 0's weight is split by rows over tp */
    nb_placement pl;
    MT_OK(nb_tensor_placement(nb_module_find(m, "0.weight"), &pl));
    MT_CHECK(tp == 1 || (pl.n == 1 && pl.places[0].kind == NB_PLACE_SHARD &&
                         pl.places[0].dim == 0 && pl.shape[0] == 32),
             "0.weight's placement");
    MT_OK(nb_tensor_placement(nb_module_find(m, "2.bias"), &pl));
    MT_CHECK(pl.mesh == mesh && pl.n == 0 && pl.shape[0] == 16, "the row-wise bias is replicated");
    nb_module_free(ref);
    nb_module_free(m);
    nb_mesh_free(mesh);
    MT_END();
}
END_TEST

/* A column-wise rule with a unit on fewer units than ranks: each unit is held by tp / units
 * consecutive ranks (2 units of 4 rows on tp = the world), the weight and bias are the 1-rank
 * slices, the placement says which, and the rank's output is its unit's columns. Split evenly
 * (units a multiple of tp) when they divide. */
START_TEST(test_plan_copies) {
    const int tp = mt_size % 2 == 0 ? mt_size : 1;
    nb_mesh *mesh = nb_mesh_new(mt_world, "dp tp", (int[]){-1, tp});
    nb_generator *g = nb_generator_new(4);
    nb_linear_opts o = nb_linear_defaults();
    o.gen = g;
    nb_module *ref = nb_sequential_new(nb_linear_new(16, 8, &o), NULL);
    nb_generator_free(g);
    g = nb_generator_new(4);
    o.gen = g;
    nb_module *m = nb_sequential_new(nb_linear_new(16, 8, &o), NULL);
    nb_generator_free(g);
    MT_OK(nb_parallelize(m, mesh, (nb_tp_rule[]){{"0", NB_TP_COLWISE, 1, 4}, {0}}, NULL));
    const int r = nb_mesh_rank(mesh, "tp"), c = tp > 2 ? tp / 2 : 1;
    const int64_t len = tp > 2 ? 4 : 8 / tp, off = tp > 2 ? 4 * (r / c) : len * r;
    const char *names[2] = {"0.weight", "0.bias"};
    for (int i = 0; i < 2; i++) {
        nb_placement pl;
        MT_OK(nb_tensor_placement(nb_module_find(m, names[i]), &pl));
        MT_CHECK(tp == 1 || (pl.n == 1 && pl.places[0].offset == off &&
                             pl.places[0].length == len &&
                             (pl.places[0].copies > 1 ? pl.places[0].copies : 1) == c),
                 "%s at tp %d: %s", names[i], tp, nb_placement_describe(&pl, (char[160]){0}, 160));
        nb_scope_begin();
        nb_tensor *d = nb_amax(nb_abs(nb_sub(nb_narrow(nb_module_find(ref, names[i]), 0, off, len),
                                             nb_module_find(m, names[i]))), NULL, 0, false);
        MT_CHECK(d && nb_item_f64(d) == 0, "%s: not the 1-rank slice", names[i]);
        nb_scope_end();
    }
    nb_scope_begin();
    nb_generator *xg = nb_generator_new(9);
    nb_tensor *x = nb_randn((int64_t[]){3, 16}, 2, NB_F32, xg);
    nb_generator_free(xg);
    nb_tensor *d = nb_amax(nb_abs(nb_sub(nb_narrow(nb_forward(ref, x), 1, off, len),
                                         nb_forward(m, x))), NULL, 0, false);
    MT_CHECK(d && nb_item_f64(d) <= 1e-6, "the output is not the unit's columns: %s",
             nb_last_error());
    nb_scope_end();
    nb_module_free(ref);
    nb_module_free(m);
    nb_mesh_free(mesh);
    MT_END();
}
END_TEST

START_TEST(test_plan_errors) {
    const int tp = mt_size % 2 == 0 ? 2 : 1;
    nb_mesh *mesh = nb_mesh_new(mt_world, "dp tp", (int[]){-1, tp});
    nb_module *m = mlp(3);
    EXPECT_STATUS(nb_parallelize(m, mesh, (nb_tp_rule[]){{"0", NB_TP_COLWISE}, {"7", NB_TP_ROWWISE},
                                                         {0}}, NULL),
                  NB_EINVAL, "the plan's rule \"7\" names no module");
    EXPECT_STATUS(nb_parallelize(m, mesh, (nb_tp_rule[]){{"0", NB_TP_COLWISE}, {"*", NB_TP_ROWWISE},
                                                         {0}}, NULL),
                  NB_EINVAL, "'0' is matched by");
    EXPECT_STATUS(nb_parallelize(m, mesh, (nb_tp_rule[]){{"1", NB_TP_COLWISE}, {0}}, NULL),
                  NB_EINVAL, "cannot be column-wise");
    if (tp > 1)
        EXPECT_STATUS(nb_parallelize(m, mesh, (nb_tp_rule[]){{"3", NB_TP_COLWISE, 1, 3}, {0}},
                                     NULL),
                      NB_EINVAL, "does not split into");
    if (tp > 1) { /* 3 units of 8 on 2 ranks: neither splits nor replicates */
        nb_module *w = nb_sequential_new(nb_linear_new(16, 24, NULL), NULL);
        EXPECT_STATUS(nb_parallelize(w, mesh, (nb_tp_rule[]){{"0", NB_TP_COLWISE, 1, 8}, {0}},
                                     NULL),
                      NB_EINVAL, "'0': out_features 24 is 3 units of 8 (the rule's unit), which "
                                 "neither split into 2 equal parts nor divide 2");
        nb_module_free(w);
    }
    /* nothing changed: the model still equals the 1-rank one */
    nb_module *ref = mlp(3);
    const nb_params *a = nb_parameters(m), *b = nb_parameters(ref);
    for (int i = 0; i < a->count; i++)
        MT_CHECK(nb_numel(a->tensors[i]) == nb_numel(b->tensors[i]), "%s changed", a->names[i]);
    nb_module_free(ref);
    nb_module_free(m);
    nb_mesh_free(mesh);
    MT_END();
}
END_TEST

Suite *mt_suite_mesh(void) {
    Suite *s = suite_create("mesh");
    TCase *tc = tcase_create("mesh");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_mesh_layout);
    tcase_add_test(tc, test_mesh_errors);
    tcase_add_test(tc, test_placement_rules);
    tcase_add_test(tc, test_placement_copies);
    tcase_add_test(tc, test_plan_copies);
    tcase_add_test(tc, test_plan_equals_one_rank);
    tcase_add_test(tc, test_plan_errors);
    suite_add_tcase(s, tc);
    return s;
}
