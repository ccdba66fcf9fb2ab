/* test_reducer.c - the one gradient reducer under nb_ddp and nb_zero (parallel/reducer.c) and
 * what the parallel layer asks of it, in nabla_mpi_tests (1, 2 and 4 ranks, and alone):
 *   - ZeRO's placements: plain nb_clip_grad_norm over the optimizer's parameters is the global
 *     norm on every rank at stages 1-3 and clips the shards (the norm of one process on the
 *     global batch, and its weights after clipped steps); the shards are recorded on the
 *     parameters and pieces; a model on a mesh must be wrapped over the mesh's "dp" group;
 *   - partial sums: parameters placed partial over tp (sequence parallelism) are summed over
 *     tp after the data-parallel reduction (DDP and ZeRO 1-3, a size-1 "dp" group included),
 *     and without a wrapper nb_step refuses them (the partial guard);
 *   - on one rank without partial parameters the gradients are bit for bit those of no wrapper;
 *   - accumulation: a parameter that got its gradient only in backward passes with sync
 *     disabled counts as ready in the synced one;
 *   - deferred parameters (a tied copy): in buckets of their own that hooks never launch,
 *     reduced by nb__reducer_sync_deferred after the caller's pre-step; nb_step refuses until
 *     then.
 * Each compares with one process on the global batch, computed by every rank itself. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_test.h"
#include "parallel/reducer.h"
#include "tensor/place.h"

enum { IN = 6, HID = 12, OUT = 4, GB = 16 /* divisible by 1, 2, 4 and 8 */ };

/* Linear(IN, HID), relu, Linear(HID, HID), tanh, Linear(HID, OUT): three units at stage 3. */
static nb_module *mlp(uint64_t seed) {
    nb_generator *g = nb_generator_new(seed);
    nb_linear_opts o = nb_linear_defaults();
    o.gen = g;
    nb_module *m = nb_sequential_new(nb_linear_new(IN, HID, &o), nb_relu_new(),
                                     nb_linear_new(HID, HID, &o), nb_tanh_new(),
                                     nb_linear_new(HID, OUT, &o), NULL);
    nb_generator_free(g);
    MT_CHECK(m != NULL, "building the model: %s", nb_last_error());
    return m;
}

static nb_optim *sgd(nb_module *m) {
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 0.1;
    nb_optim *o = nb_sgd_new(nb_parameters(m), &so);
    MT_CHECK(o != NULL, "optimizer: %s", nb_last_error());
    return o;
}

/* The global batch of step `step`, the same on every rank (current scope). */
static void batch(int step, nb_tensor **x, nb_tensor **y) {
    nb_generator *g = nb_generator_new(300 + (uint64_t)step);
    *x = nb_randn((int64_t[]){GB, IN}, 2, NB_F32, g);
    *y = nb_randint((int64_t[]){GB}, 1, NB_I64, 0, OUT, g);
    nb_generator_free(g);
}

/* Mean cross entropy of rows [start, start + n), times scale. */
static nb_tensor *loss_of(nb_module *m, nb_tensor *x, nb_tensor *y, int64_t start, int64_t n,
                          double scale) {
    nb_tensor *l = nb_cross_entropy(nb_forward(m, nb_narrow(x, 0, start, n)),
                                    nb_narrow(y, 0, start, n), NULL);
    if (l && scale != 1) l = nb_mul_scalar(l, scale);
    MT_CHECK(l != NULL, "loss: %s", nb_last_error());
    return l;
}

static double sum_over_world(double v) {
    nb_scope_begin();
    nb_tensor *t = nb_full((int64_t[]){1}, 1, NB_F64, v);
    MT_OK(nb_allreduce(mt_world, t, NB_REDUCE_SUM));
    double r = nb_item_f64(t);
    nb_scope_end();
    return r;
}

/* ---- ZeRO: one clip over placements -------------------------------------------------------- */
static void clip_case(int stage) {
    enum { K = 3 };
    const double clip = 0.05; /* below the norms here: every step clips */
    nb_scope_begin();
    nb_module *ref = mlp(7), *m = mlp(7);
    nb_optim *ro = sgd(ref), *o = sgd(m);
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = stage, zo.bucket_mb = 200e-6;
    nb_zero *z = nb_zero_new(m, o, mt_world, &zo);
    MT_CHECK(z != NULL, "zero_new (stage %d): %s", stage, nb_last_error());
    const int64_t local = GB / mt_size;
    for (int step = 0; step < K && z; step++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        batch(step, &x, &y);
        MT_OK(nb_zero_grad(ro));
        MT_OK(nb_backward(loss_of(ref, x, y, 0, GB, 1)));
        double rinf = nb_clip_grad_norm(nb_optim_params(ro), INFINITY, INFINITY);
        double rn = nb_clip_grad_norm(nb_optim_params(ro), clip, 2);
        MT_OK(nb_step(ro));
        MT_OK(nb_zero_grad(o));
        MT_OK(nb_backward(loss_of(m, x, y, mt_rank * local, local, 1)));
        /* the shard optimizer's pieces measure the same; the largest element too */
        double pn = nb_clip_grad_norm(nb_optim_params(nb_zero_optim(z)), INFINITY, 2);
        double inf = nb_clip_grad_norm(nb_optim_params(o), INFINITY, INFINITY);
        double n = nb_clip_grad_norm(nb_optim_params(o), clip, 2);
        MT_CHECK(fabs(n - rn) <= 1e-5 * rn, "stage %d step %d: norm %.9g, one process %.9g",
                 stage, step, n, rn);
        MT_CHECK(fabs(pn - rn) <= 1e-5 * rn, "stage %d: the pieces' norm %.9g, one process %.9g",
                 stage, pn, rn);
        MT_CHECK(fabs(inf - rinf) <= 1e-6 * rinf, "stage %d: max norm %.9g, one process %.9g",
                 stage, inf, rinf);
        MT_OK(nb_step(o));
        nb_scope_end();
    }
    /* the shards on the parameters: this rank's piece of each, the pieces tile it */
    const nb_params *ps = nb_parameters(m);
    for (int i = 0; z && i < ps->count; i++) {
        const nb__place *pl = ps->tensors[i]->place;
        MT_CHECK(pl && pl->p.mesh && !strcmp(pl->shard_dim, "dp") && pl->counts,
                 "stage %d: %s has no flat shard over dp", stage, ps->names[i]);
        if (!pl) continue;
        MT_CHECK(pl->shard_grad && nb_numel(pl->shard_grad) == pl->shard_length,
                 "%s: shard_grad", ps->names[i]);
        MT_CHECK((stage == 3) == (pl->shard_value != NULL), "%s: shard_value at stage %d",
                 ps->names[i], stage);
        double all = sum_over_world((double)pl->shard_length);
        MT_CHECK(all == (double)nb_numel(ps->tensors[i]), "%s: the pieces hold %g of %lld",
                 ps->names[i], all, (long long)nb_numel(ps->tensors[i]));
    }
    const nb_params *pieces = z ? nb_optim_params(nb_zero_optim(z)) : NULL;
    for (int j = 0; pieces && j < pieces->count; j++) {
        nb_placement pp;
        MT_OK(nb_tensor_placement(pieces->tensors[j], &pp));
        const nb_place *e = pp.n ? &pp.places[pp.n - 1] : NULL;
        MT_CHECK(e && e->kind == NB_PLACE_SHARD && e->dim == NB_PLACE_FLAT &&
                     !strcmp(e->mesh_dim, "dp") &&
                     e->length == nb_numel(pieces->tensors[j]),
                 "piece %s: placement", pieces->names[j]);
    }
    if (z) MT_OK(nb_zero_gather_params(z));
    char what[64];
    snprintf(what, sizeof what, "clipped steps, stage %d", stage);
    mt_expect_same_params(m, ref, 1e-5, what);
    nb_zero_free(z);
    /* ZeRO's own mesh went with it, and the placements with the mesh */
    nb_placement pl;
    MT_OK(nb_tensor_placement(ps->tensors[0], &pl));
    MT_CHECK(pl.mesh == NULL && !ps->tensors[0]->place, "a placement outlived the nb_zero");
    nb_optim_free(o);
    nb_optim_free(ro);
    nb_module_free(m);
    nb_module_free(ref);
    nb_scope_end();
}

START_TEST(test_reducer_zero_clip) {
    for (int stage = 1; stage <= 3; stage++) clip_case(stage);
    MT_END();
}
END_TEST

/* A model on a mesh is wrapped over that mesh's dp group. */
START_TEST(test_reducer_mesh_group) {
    nb_scope_begin();
    nb_mesh *mesh = nb_mesh_new(mt_world, "dp tp", (int[]){1, mt_size}); /* every rank: tp */
    MT_CHECK(mesh != NULL, "mesh: %s", nb_last_error());
    nb_module *m = mlp(3);
    const nb_params *ps = nb_parameters(m);
    for (int i = 0; mesh && i < ps->count; i++) {
        nb_placement p = {.mesh = mesh, .ndim = nb_ndim(ps->tensors[i])};
        for (int d = 0; d < p.ndim; d++) p.shape[d] = nb_size(ps->tensors[i], d);
        MT_OK(nb_tensor_set_placement(ps->tensors[i], &p));
    }
    nb_optim *o = sgd(m);
    if (mt_size > 1) {
        nb_zero_opts zo = nb_zero_defaults();
        zo.stage = 2, zo.bucket_mb = 0;
        nb_zero *bad = nb_zero_new(m, o, mt_world, &zo);
        MT_CHECK(!bad, "a communicator other than the mesh's dp group accepted");
        MT_EXPECT_ERROR(nb_last_status(), NB_EINVAL, "pass nb_mesh_group(mesh, \"dp\")");
        nb_ddp *dbad = nb_ddp_new(m, mt_world, NULL);
        MT_CHECK(!dbad, "ddp: a communicator other than the mesh's dp group accepted");
        MT_EXPECT_ERROR(nb_last_status(), NB_EINVAL, "pass nb_mesh_group(mesh, \"dp\")");
    }
    nb_zero_opts zo2 = nb_zero_defaults();
    zo2.stage = 2, zo2.bucket_mb = 0;
    nb_zero *z = mesh ? nb_zero_new(m, o, nb_mesh_group(mesh, "dp"), &zo2) : NULL;
    MT_CHECK(z != NULL, "zero_new over the dp group: %s", nb_last_error());
    /* the shards are recorded on the parameters' own mesh, which stays theirs after the free */
    MT_CHECK(!z || (ps->tensors[0]->place->p.mesh == mesh && ps->tensors[0]->place->shard_grad),
             "the flat shard is not on the parameters' mesh");
    nb_zero_free(z);
    MT_CHECK(ps->tensors[0]->place && ps->tensors[0]->place->p.mesh == mesh &&
                 !ps->tensors[0]->place->shard_grad && !ps->tensors[0]->place->shard_dim[0],
             "the flat shard outlived the nb_zero, or the mesh placement went");
    nb_optim_free(o);
    nb_module_free(m);
    nb_mesh_free(mesh);
    nb_scope_end();
    MT_END();
}
END_TEST

/* ---- partial sums (sequence parallelism) ----------------------------------------------------- */
/* Every parameter placed partial over tp, as a sequence-parallel layer's: each tp rank's
 * backward sees its half of its dp slice's rows, so its gradient is a part of the slice's. */
static void mark_partial(nb_module *m, const nb_mesh *mesh) {
    const nb_params *ps = nb_parameters(m);
    for (int i = 0; i < ps->count; i++) {
        nb_placement p = {.mesh = mesh, .ndim = nb_ndim(ps->tensors[i]), .n = 1,
                          .places = {{.kind = NB_PLACE_PARTIAL, .mesh_dim = "tp"}}};
        for (int d = 0; d < p.ndim; d++) p.shape[d] = nb_size(ps->tensors[i], d);
        MT_OK(nb_tensor_set_placement(ps->tensors[i], &p));
        MT_OK(nb__partial_guard_set(ps->tensors[i])); /* as nb_parallelize marks them */
    }
}

/* This rank's loss: the mean over its dp slice, of which it holds the tp-th part. */
static nb_tensor *partial_loss(nb_module *m, const nb_mesh *mesh, nb_tensor *x, nb_tensor *y) {
    const int dp = nb_mesh_size(mesh, "dp"), tp = nb_mesh_size(mesh, "tp");
    const int64_t slice = GB / dp, part = slice / tp;
    const int64_t start = nb_mesh_rank(mesh, "dp") * slice + nb_mesh_rank(mesh, "tp") * part;
    return loss_of(m, x, y, start, part, 1.0 / tp);
}

/* wrapper: 0 DDP, 1-3 the ZeRO stage, -1 none (nb_step refuses the partial gradients). */
static void partial_case(int wrapper) {
    enum { K = 2 };
    nb_scope_begin();
    const int tp = mt_size % 2 == 0 ? 2 : 1;
    nb_mesh *mesh = nb_mesh_new(mt_world, "dp tp", (int[]){-1, tp});
    nb_module *ref = mlp(11), *m = mlp(11);
    mark_partial(m, mesh);
    nb_optim *ro = sgd(ref), *o = sgd(m);
    nb_comm *dp = nb_mesh_group(mesh, "dp");
    nb_ddp_opts ddo = nb_ddp_defaults();
    ddo.bucket_mb = 200e-6;
    nb_ddp *d = wrapper == 0 ? nb_ddp_new(m, dp, &ddo) : NULL;
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = wrapper, zo.bucket_mb = 200e-6;
    nb_zero *z = wrapper > 0 ? nb_zero_new(m, o, dp, &zo) : NULL;
    MT_CHECK(wrapper < 0 || d || z, "wrap %d: %s", wrapper, nb_last_error());
    for (int step = 0; step < K; step++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        batch(10 + step, &x, &y);
        MT_OK(nb_zero_grad(ro));
        MT_OK(nb_backward(loss_of(ref, x, y, 0, GB, 1)));
        double rn = nb_clip_grad_norm(nb_optim_params(ro), INFINITY, 2);
        MT_OK(nb_step(ro));
        MT_OK(nb_zero_grad(o));
        MT_OK(nb_backward(partial_loss(m, mesh, x, y)));
        if (wrapper < 0) {
            MT_EXPECT_ERROR(nb_step(o), NB_ESTATE, "is a partial sum over tp (sequence parallelism)");
            nb_scope_end();
            break;
        }
        double n = nb_clip_grad_norm(nb_optim_params(o), INFINITY, 2);
        MT_CHECK(fabs(n - rn) <= 1e-5 * rn, "wrapper %d: norm %.9g, one process %.9g", wrapper,
                 n, rn);
        MT_OK(nb_step(o));
        nb_scope_end();
    }
    if (wrapper >= 0) {
        if (z) MT_OK(nb_zero_gather_params(z));
        char what[64];
        snprintf(what, sizeof what, "partial over tp, %s %d", wrapper ? "zero stage" : "ddp",
                 wrapper);
        mt_expect_same_params(m, ref, 1e-5, what);
    }
    nb_zero_free(z);
    nb_ddp_free(d);
    if (wrapper >= 0) { /* unwrapped: partial again, refused again */
        nb_scope_begin();
        nb_tensor *x, *y;
        batch(20, &x, &y);
        MT_OK(nb_zero_grad(o));
        MT_OK(nb_backward(partial_loss(m, mesh, x, y)));
        MT_EXPECT_ERROR(nb_step(o), NB_ESTATE, "wrap the model with nb_ddp_new");
        nb_scope_end();
    }
    nb_optim_free(o);
    nb_optim_free(ro);
    nb_module_free(m);
    nb_module_free(ref);
    nb_mesh_free(mesh);
    nb_scope_end();
}

START_TEST(test_reducer_partial_sums) {
    for (int w = -1; w <= 3; w++) partial_case(w);
    MT_END();
}
END_TEST

/* On one rank without partial parameters a wrapper changes no gradient bit. */
START_TEST(test_reducer_self_is_plain) {
    nb_scope_begin();
    nb_comm *self = nb_comm_self();
    for (int stage = 0; stage <= 3; stage++) {
        nb_module *ref = mlp(5), *m = mlp(5);
        nb_optim *ro = sgd(ref), *o = sgd(m);
        nb_zero_opts zo = nb_zero_defaults();
        zo.stage = stage, zo.bucket_mb = 200e-6;
        nb_zero *z = nb_zero_new(m, o, self, &zo);
        MT_CHECK(z != NULL, "zero_new on self: %s", nb_last_error());
        nb_scope_begin();
        nb_tensor *x, *y;
        batch(30, &x, &y);
        MT_OK(nb_backward(loss_of(ref, x, y, 0, GB, 1)));
        MT_OK(nb_backward(loss_of(m, x, y, 0, GB, 1)));
        const nb_params *pr = nb_parameters(ref), *pm = nb_parameters(m);
        for (int i = 0; z && i < pr->count; i++) {
            const nb__place *pl = pm->tensors[i]->place;
            nb_tensor *g = pl && pl->shard_grad ? pl->shard_grad : nb_grad(pm->tensors[i]);
            int64_t n = nb_numel(pr->tensors[i]);
            float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
            MT_CHECK(g && nb_numel(g) == n, "stage %d: %s's gradient", stage, pr->names[i]);
            if (g && nb_numel(g) == n) {
                MT_OK(nb_read(nb_grad(pr->tensors[i]), a, n, NB_F32));
                MT_OK(nb_read(g, b, n, NB_F32));
                MT_CHECK(!memcmp(a, b, sizeof(float) * (size_t)n),
                         "stage %d: %s's gradient is not bit for bit the plain one", stage,
                         pr->names[i]);
            }
            free(a);
            free(b);
        }
        nb_scope_end();
        nb_zero_free(z);
        nb_optim_free(o);
        nb_optim_free(ro);
        nb_module_free(m);
        nb_module_free(ref);
    }
    nb_comm_free(self);
    nb_scope_end();
    MT_END();
}
END_TEST

/* ---- accumulation readiness ------------------------------------------------------------------- */
/* Linear A and B (IN -> HID) into a head H: micro-batch 1 runs A -> H, micro-batch 2 B -> H,
 * so A's gradient comes only from the backward with sync disabled. */
static nb_module *two_paths(uint64_t seed) {
    nb_generator *g = nb_generator_new(seed);
    nb_linear_opts o = nb_linear_defaults();
    o.gen = g;
    nb_module *m = nb_sequential_new(nb_linear_new(IN, HID, &o), nb_linear_new(IN, HID, &o),
                                     nb_linear_new(HID, OUT, &o), NULL);
    nb_generator_free(g);
    return m;
}

static nb_tensor *path_loss(nb_module *m, int path, nb_tensor *x, nb_tensor *y, int64_t start,
                            int64_t n) {
    nb_tensor *h = nb_relu(nb_forward(nb_module_child_at(m, path), nb_narrow(x, 0, start, n)));
    nb_tensor *l = nb_cross_entropy(nb_forward(nb_module_child_at(m, 2), h),
                                    nb_narrow(y, 0, start, n), NULL);
    MT_CHECK(l != NULL, "loss: %s", nb_last_error());
    return l;
}

/* wrapper: 0 DDP, 1-3 the ZeRO stage */
static void accumulation_case(int wrapper) {
    enum { K = 2 };
    nb_scope_begin();
    nb_module *ref = two_paths(13), *m = two_paths(13);
    nb_optim *ro = sgd(ref), *o = sgd(m);
    nb_ddp_opts ddo = nb_ddp_defaults();
    ddo.bucket_mb = 200e-6;
    nb_ddp *d = wrapper == 0 ? nb_ddp_new(m, mt_world, &ddo) : NULL;
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = wrapper, zo.bucket_mb = 200e-6;
    nb_zero *z = wrapper > 0 ? nb_zero_new(m, o, mt_world, &zo) : NULL;
    MT_CHECK(d || z, "wrap %d: %s", wrapper, nb_last_error());
    nb__reducer *r = nb__reducer_of(m);
    MT_CHECK(r != NULL, "no reducer found for the wrapped model");
    const int64_t local = GB / mt_size;
    for (int step = 0; step < K && r; step++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        batch(40 + step, &x, &y);
        MT_OK(nb_zero_grad(ro));
        MT_OK(nb_backward(path_loss(ref, 0, x, y, 0, GB)));
        MT_OK(nb_backward(path_loss(ref, 1, x, y, 0, GB)));
        MT_OK(nb_step(ro));
        MT_OK(nb_zero_grad(o));
        nb__reducer_set_sync(r, false);
        MT_OK(nb_backward(path_loss(m, 0, x, y, mt_rank * local, local)));
        nb__reducer_set_sync(r, true);
        /* A's hooks do not fire here: its accumulated gradient counts as ready */
        MT_OK(nb_backward(path_loss(m, 1, x, y, mt_rank * local, local)));
        MT_CHECK(nb__reducer_launched(r) == nb__reducer_num_buckets(r),
                 "%d of %d buckets launched by the synced backward", nb__reducer_launched(r),
                 nb__reducer_num_buckets(r));
        MT_OK(nb_step(o));
        nb_scope_end();
    }
    if (z) MT_OK(nb_zero_gather_params(z));
    char what[64];
    snprintf(what, sizeof what, "accumulated, wrapper %d", wrapper);
    mt_expect_same_params(m, ref, 1e-5, what);
    nb_zero_free(z);
    nb_ddp_free(d);
    MT_CHECK(nb__reducer_of(m) == NULL, "the reducer outlived its wrapper");
    nb_optim_free(o);
    nb_optim_free(ro);
    nb_module_free(m);
    nb_module_free(ref);
    nb_scope_end();
}

START_TEST(test_reducer_accumulation) {
    for (int w = 0; w <= 3; w++) accumulation_case(w);
    MT_END();
}
END_TEST

/* ---- deferred parameters -------------------------------------------------------------------- */
/* The middle layer's weight stands for a tied copy: the caller's pre-step doubles its local
 * gradient (as summing two copies would) before its reduction. how: 0 placed as pipeline
 * copy 0 of 2 (deferred when wrapped), 1 named to nb__reducer_defer after the wrap.
 * wrapper: 0 DDP, 1-2 the ZeRO stage. */
static void deferred_case(int how, int wrapper) {
    enum { K = 2 };
    nb_scope_begin();
    nb_mesh *mesh = nb_mesh_new(mt_world, "dp", (int[]){-1});
    nb_module *ref = mlp(17), *m = mlp(17);
    const nb_params *ps = nb_parameters(m);
    const int tied = 2; /* "2.weight": between 0.* and 2.bias, 4.* */
    nb_tensor *w = ps->tensors[tied];
    for (int i = 0; how == 0 && i < ps->count; i++) {
        nb_placement p = {.mesh = mesh, .ndim = nb_ndim(ps->tensors[i])};
        for (int d = 0; d < p.ndim; d++) p.shape[d] = nb_size(ps->tensors[i], d);
        if (i == tied)
            p.n = 1, p.places[0] = (nb_place){.kind = NB_PLACE_REPLICATE, .mesh_dim = "pp",
                                              .offset = 0, .length = 2};
        MT_OK(nb_tensor_set_placement(ps->tensors[i], &p));
    }
    nb_optim *ro = sgd(ref), *o = sgd(m);
    nb_comm *dp = nb_mesh_group(mesh, "dp");
    /* one bucket of everything, but for the deferred parameter */
    nb_ddp *d = wrapper == 0 ? nb_ddp_new(m, dp, NULL) : NULL;
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = wrapper;
    nb_zero *z = wrapper > 0 ? nb_zero_new(m, o, dp, &zo) : NULL;
    MT_CHECK(d || z, "wrap: %s", nb_last_error());
    nb__reducer *r = nb__reducer_of(m);
    MT_CHECK(r != NULL, "no reducer found");
    if (r && how == 1) MT_OK(nb__reducer_defer(r, &w, 1));
    if (r) {
        MT_CHECK(nb__reducer_num_buckets(r) == 3, "%d buckets, not 3 (the deferred one alone)",
                 nb__reducer_num_buckets(r));
        int b = nb__reducer_param_bucket(r, tied);
        MT_CHECK(b != nb__reducer_param_bucket(r, tied - 1) &&
                     b != nb__reducer_param_bucket(r, tied + 1) &&
                     nb__reducer_param_deferred(r, tied),
                 "the deferred parameter shares a bucket");
    }
    const int64_t local = GB / mt_size;
    for (int step = 0; step < K && r; step++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        batch(50 + step, &x, &y);
        MT_OK(nb_zero_grad(ro));
        MT_OK(nb_backward(loss_of(ref, x, y, 0, GB, 1)));
        nb_tensor *rg = nb_grad(nb_parameters(ref)->tensors[tied]);
        MT_OK(nb_copy_(rg, nb_mul_scalar(rg, 2)));
        MT_OK(nb_step(ro));
        MT_OK(nb_zero_grad(o));
        MT_OK(nb_backward(loss_of(m, x, y, mt_rank * local, local, 1)));
        MT_CHECK(nb__reducer_launched(r) == nb__reducer_num_buckets(r) - 1,
                 "%d buckets launched in backward", nb__reducer_launched(r));
        MT_EXPECT_ERROR(nb_step(o), NB_ESTATE, "deferred");
        nb_tensor *g = nb_grad(w); /* the local gradient, as the pipeline would sum it */
        MT_CHECK(g != NULL, "the deferred parameter's local gradient is gone");
        if (g) MT_OK(nb_copy_(g, nb_mul_scalar(g, 2)));
        MT_OK(nb__reducer_sync_deferred(r));
        MT_OK(nb_step(o));
        nb_scope_end();
    }
    char what[64];
    snprintf(what, sizeof what, "deferred (%d), wrapper %d", how, wrapper);
    mt_expect_same_params(m, ref, 1e-5, what);
    nb_zero_free(z);
    nb_ddp_free(d);
    nb_optim_free(o);
    nb_optim_free(ro);
    nb_module_free(m);
    nb_module_free(ref);
    nb_mesh_free(mesh);
    nb_scope_end();
}

START_TEST(test_reducer_deferred) {
    for (int how = 0; how <= 1; how++)
        for (int w = 0; w <= 2; w++) deferred_case(how, w);
    MT_END();
}
END_TEST

Suite *mt_suite_reducer(void) {
    Suite *s = suite_create("reducer");
    TCase *tc = tcase_create("reducer");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_reducer_zero_clip);
    tcase_add_test(tc, test_reducer_mesh_group);
    tcase_add_test(tc, test_reducer_partial_sums);
    tcase_add_test(tc, test_reducer_self_is_plain);
    tcase_add_test(tc, test_reducer_accumulation);
    tcase_add_test(tc, test_reducer_deferred);
    suite_add_tcase(s, tc);
    return s;
}
