/* test_ddp.c - distributed data parallel (parallel/ddp.c) in nabla_mpi_tests, run with 1, 2
 * and 4 ranks (and alone).
 *
 * The central check is equivalence (docs/architecture.md rule 8): K steps of DDP on W ranks, each
 * rank taking its slice of one global batch, must give the weights that 1 process gets training
 * on the whole global batch. Every rank computes that 1-process reference itself, with a
 * plain (unwrapped) copy of the model, so no extra communication is involved. The GPT of
 * models/gpt goes through its own training step (gradient accumulation, clipping after the
 * average). Also:
 * gradient accumulation, the overlap of bucket allreduces with backward, unused
 * parameters, the broadcast at wrap time, exactness on a size-1 communicator, and the
 * errors of the API. Failures are recorded with MT_CHECK and agreed on by MT_END (see
 * mpi_test.h), so a failing rank never leaves the others waiting in a collective. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <nabla/gpt.h>
#include "mpi_test.h"

/* Internal counter of parallel/ddp.c: buckets whose allreduce has started in this step. */
int nb__ddp_buckets_launched(const nb_ddp *d);

enum { IN = 8, HID = 16, OUT = 4, GB = 16 /* global batch: divisible by 1, 2, 4, 8 */ };
enum { V = 11, D = 8, T = 3 }; /* the embedding + layernorm model */

/* ---- models and data ------------------------------------------------------------------------ */
typedef enum { MLP, EMB } model_kind;

static nb_module *build(model_kind kind, uint64_t seed) {
    nb_generator *g = nb_generator_new(seed);
    nb_module *m;
    if (kind == MLP) {
        nb_linear_opts o = nb_linear_defaults();
        o.gen = g;
        m = nb_sequential_new(nb_linear_new(IN, HID, &o), nb_relu_new(),
                              nb_linear_new(HID, HID, &o), nb_tanh_new(),
                              nb_linear_new(HID, OUT, &o), NULL);
    } else { /* a miniature language model: embedding, layer norm, linear head */
        nb_linear_opts lin = nb_linear_defaults();
        lin.gen = g;
        m = nb_sequential_new(nb_embedding_new(V, D, g), nb_layer_norm_new(D, NULL),
                              nb_linear_new(D, V, &lin), NULL);
    }
    nb_generator_free(g);
    MT_CHECK(m != NULL, "building the model: %s", nb_last_error());
    return m;
}

/* The global batch, identical on every rank (in the current scope). */
static void global_batch(model_kind kind, uint64_t seed, nb_tensor **x, nb_tensor **y) {
    nb_generator *g = nb_generator_new(seed);
    if (kind == MLP) {
        *x = nb_randn((int64_t[]){GB, IN}, 2, NB_F32, g);
        *y = nb_randint((int64_t[]){GB}, 1, NB_I64, 0, OUT, g);
    } else {
        *x = nb_randint((int64_t[]){GB, T}, 2, NB_I64, 0, V, g);
        *y = nb_randint((int64_t[]){GB, T}, 2, NB_I64, 0, V, g);
    }
    nb_generator_free(g);
}

/* Mean cross-entropy of rows [start, start + n) of the batch, times scale. */
static nb_tensor *loss_of(nb_module *m, model_kind kind, nb_tensor *x, nb_tensor *y,
                          int64_t start, int64_t n, double scale) {
    nb_tensor *xs = nb_narrow(x, 0, start, n), *ys = nb_narrow(y, 0, start, n);
    nb_tensor *out = nb_forward(m, xs);
    if (kind == EMB) {
        out = nb_reshape(out, (int64_t[]){n * T, V}, 2);
        ys = nb_reshape(ys, (int64_t[]){n * T}, 1);
    }
    nb_tensor *l = nb_cross_entropy(out, ys, NULL);
    if (scale != 1) l = nb_mul_scalar(l, scale);
    MT_CHECK(l != NULL, "loss: %s", nb_last_error());
    return l;
}

static nb_optim *make_opt(nb_module *m, model_kind kind) {
    nb_adam_opts ao = nb_adam_defaults();
    ao.lr = 1e-2;
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 0.1, so.momentum = 0.9;
    nb_optim *o =
        kind == MLP ? nb_sgd_new(nb_parameters(m), &so) : nb_adam_new(nb_parameters(m), &ao);
    MT_CHECK(o != NULL, "optimizer: %s", nb_last_error());
    return o;
}

/* One plain (non-DDP) step on rows [start, start + n). */
static void plain_step(nb_module *m, nb_optim *o, model_kind kind, nb_tensor *x, nb_tensor *y,
                       int64_t start, int64_t n) {
    nb_scope_begin();
    nb_tensor *l = loss_of(m, kind, x, y, start, n, 1);
    MT_OK(nb_zero_grad(o));
    MT_OK(nb_backward(l));
    MT_OK(nb_step(o));
    nb_scope_end();
}

/* ---- equivalence: DDP on W ranks == 1 process on the global batch ----------------------------- */
static void check_equivalence(model_kind kind, double bucket_mb) {
    enum { K = 5 };
    nb_scope_begin();
    int rank = mt_rank, size = mt_size;
    nb_module *ref = build(kind, 7), *m = build(kind, 7 + (uint64_t)rank); /* broadcast fixes m */
    nb_optim *ro = make_opt(ref, kind);
    nb_ddp_opts ddo = nb_ddp_defaults();
    ddo.bucket_mb = bucket_mb;
    nb_ddp *d = nb_ddp_new(m, mt_world, &ddo);
    MT_CHECK(d != NULL, "ddp_new: %s", nb_last_error());
    nb_optim *o = make_opt(m, kind); /* made after the wrap: sees the flat views */
    int64_t local = GB / size;
    for (int step = 0; step < K && d; step++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        global_batch(kind, 100 + (uint64_t)step, &x, &y);
        plain_step(ref, ro, kind, x, y, 0, GB);
        nb_tensor *l = loss_of(m, kind, x, y, rank * local, local, 1);
        MT_OK(nb_zero_grad(o));
        MT_OK(nb_backward(l));
        MT_OK(nb_ddp_sync(d));
        MT_CHECK(nb_ddp_exposed_comm_s(d) >= 0, "negative exposed time");
        MT_OK(nb_step(o));
        nb_scope_end();
    }
    mt_expect_same_params(m, ref, 1e-5, kind == MLP ? "mlp" : "embedding/layernorm");
    nb_ddp_free(d);
    nb_optim_free(o);
    nb_optim_free(ro);
    nb_module_free(m);
    nb_module_free(ref);
    nb_scope_end();
}

START_TEST(test_ddp_equivalence_mlp) {
    check_equivalence(MLP, 0);        /* one bucket */
    check_equivalence(MLP, 200e-6);   /* several buckets (~50 floats each) */
    MT_END();
}
END_TEST

START_TEST(test_ddp_equivalence_embedding_layernorm) {
    check_equivalence(EMB, 0);
    check_equivalence(EMB, 1e-9);     /* one bucket per parameter */
    MT_END();
}
END_TEST

/* ---- the GPT's training step: accumulation without sync, clipping after the average -------
 * The wrapped model may recompute its blocks in backward (activation checkpointing): the
 * gradient hooks nb_ddp buckets by must still run once per parameter per backward. */
static void ddp_equivalence_gpt(nb_gpt_recompute recompute) {
    enum { K = 3, MICRO = 2, GBT = 8, TT = 8 }; /* global batch 8: divisible by 1, 2, 4 */
    nb_scope_begin();
    int rank = mt_rank, size = mt_size;
    nb_gpt_config cfg = nb_gpt_config_defaults();
    cfg.vocab_size = 64, cfg.block_size = TT, cfg.n_layer = 2, cfg.n_head = 2, cfg.n_embd = 16;
    nb_generator *g0 = nb_generator_new(3), *g1 = nb_generator_new(3 + (uint64_t)rank);
    nb_module *ref = nb_gpt_new(&cfg, g0);
    cfg.recompute = recompute;
    nb_module *m = nb_gpt_new(&cfg, g1); /* the broadcast fixes m */
    nb_generator_free(g0);
    nb_generator_free(g1);
    MT_CHECK(ref && m, "nb_gpt_new: %s", nb_last_error());
    /* SGD, not the recipe's AdamW: the key bias of attention has an exactly zero gradient
     * (softmax ignores a constant added to every score), so its computed gradient is pure
     * rounding noise, which Adam's normalization would blow up to steps of size lr. */
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 0.5, so.momentum = 0.9, so.weight_decay = 0.1;
    nb_optim *ro = ref ? nb_sgd_new(nb_parameters(ref), &so) : NULL;
    nb_optim *o = m ? nb_sgd_new(nb_parameters(m), &so) : NULL; /* made before the wrap */
    nb_ddp_opts ddo = nb_ddp_defaults();
    ddo.bucket_mb = 4e-3;
    nb_ddp *d = m ? nb_ddp_new(m, mt_world, &ddo) : NULL;
    MT_CHECK(ro && o && d, "setup: %s", nb_last_error());
    int64_t local = GBT / size;
    for (int step = 0; step < K && d && ro && o; step++) {
        nb_scope_begin();
        nb_tensor *xs[MICRO], *ys[MICRO], *xl[MICRO], *yl[MICRO];
        nb_generator *g = nb_generator_new(200 + (uint64_t)step);
        for (int i = 0; i < MICRO; i++) {
            xs[i] = nb_randint((int64_t[]){GBT, TT}, 2, NB_I64, 0, cfg.vocab_size, g);
            ys[i] = nb_randint((int64_t[]){GBT, TT}, 2, NB_I64, 0, cfg.vocab_size, g);
            xl[i] = nb_narrow(xs[i], 0, rank * local, local);
            yl[i] = nb_narrow(ys[i], 0, rank * local, local);
        }
        nb_generator_free(g);
        double rn = NAN, dn = NAN;
        double rl = nb_gpt_train_step(ref, ro, NULL, xs, ys, MICRO, 0.05, &rn);
        double dl = nb_gpt_train_step(m, o, d, xl, yl, MICRO, 0.05, &dn);
        MT_CHECK(!isnan(rl) && !isnan(dl), "step %d: %s", step, nb_last_error());
        /* the clipping threshold is below the norm, so clipping acts in every step */
        MT_CHECK(dn > 0.05, "step %d: norm %g does not exceed the clip threshold", step, dn);
        MT_CHECK(fabs(dn - rn) <= 1e-5 * rn, "step %d: grad norm %.9g, reference %.9g", step,
                 dn, rn);
        nb_scope_end();
    }
    if (d) mt_expect_same_params(m, ref, 1e-5, "gpt");
    nb_ddp_free(d);
    nb_optim_free(o);
    nb_optim_free(ro);
    nb_module_free(m);
    nb_module_free(ref);
    nb_scope_end();
}

START_TEST(test_ddp_equivalence_gpt) {
    ddp_equivalence_gpt(NB_GPT_RECOMPUTE_NONE);
    MT_END();
}
END_TEST

START_TEST(test_ddp_equivalence_gpt_recompute) {
    ddp_equivalence_gpt(NB_GPT_RECOMPUTE_FULL);
    MT_END();
}
END_TEST

/* ---- gradient accumulation --------------------------------------------------------------------- */
START_TEST(test_ddp_grad_accumulation) {
    nb_scope_begin();
    int rank = mt_rank, size = mt_size;
    nb_module *ref = build(MLP, 3), *m = build(MLP, 3);
    nb_optim *ro = make_opt(ref, MLP);
    nb_ddp_opts ddo = nb_ddp_defaults();
    ddo.bucket_mb = 200e-6;
    nb_ddp *d = nb_ddp_new(m, mt_world, &ddo);
    MT_CHECK(d != NULL, "ddp_new: %s", nb_last_error());
    nb_optim *o = make_opt(m, MLP);
    int64_t local = GB / size, half = local / 2;
    for (int step = 0; step < 3 && d; step++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        global_batch(MLP, 200 + (uint64_t)step, &x, &y);
        plain_step(ref, ro, MLP, x, y, 0, GB);
        MT_OK(nb_zero_grad(o));
        /* micro-step 1: local accumulation only */
        nb_ddp_set_sync_enabled(d, false);
        MT_OK(nb_backward(loss_of(m, MLP, x, y, rank * local, half, 0.5)));
        MT_CHECK(nb__ddp_buckets_launched(d) == 0, "a bucket started while sync was disabled");
        /* micro-step 2: one allreduce of the accumulated gradients */
        nb_ddp_set_sync_enabled(d, true);
        MT_OK(nb_backward(loss_of(m, MLP, x, y, rank * local + half, local - half, 0.5)));
        MT_CHECK(nb__ddp_buckets_launched(d) == nb_ddp_num_buckets(d),
                 "%d of %d buckets started in backward", nb__ddp_buckets_launched(d),
                 nb_ddp_num_buckets(d));
        MT_OK(nb_step(o)); /* no nb_ddp_sync: backward averaged the accumulated gradients */
        nb_scope_end();
    }
    mt_expect_same_params(m, ref, 1e-5, "accumulated");
    nb_ddp_free(d);
    nb_optim_free(o);
    nb_optim_free(ro);
    nb_module_free(m);
    nb_module_free(ref);
    nb_scope_end();
    MT_END();
}
END_TEST

/* ---- overlap: buckets start while backward is still running ------------------------------------ */
typedef struct overlap_log {
    nb_ddp *d;
    int calls;
    int launched_at[16]; /* buckets already launched when the i-th hook ran */
} overlap_log;

static void overlap_hook(nb_tensor *leaf, void *ctx) {
    overlap_log *lg = ctx;
    (void)leaf;
    if (lg->calls < 16) lg->launched_at[lg->calls] = nb__ddp_buckets_launched(lg->d);
    lg->calls++;
}

START_TEST(test_ddp_overlap) {
    nb_scope_begin();
    int rank = mt_rank, size = mt_size;
    nb_module *m = build(MLP, 5);
    nb_ddp_opts ddo = nb_ddp_defaults();
    ddo.bucket_mb = 200e-6;
    /* 50 floats per bucket: smaller than most parameters, so several buckets. */
    nb_ddp *d = nb_ddp_new(m, mt_world, &ddo);
    MT_CHECK(d != NULL, "ddp_new: %s", nb_last_error());
    const nb_params *ps = nb_parameters(m);
    int nbk = nb_ddp_num_buckets(d);
    MT_CHECK(nbk > 2 && nbk <= ps->count, "%d buckets for %d parameters", nbk, ps->count);
    /* Hooks registered after DDP's run after them, in the engine's completion order. */
    overlap_log lg = {.d = d};
    int handles[8];
    for (int i = 0; i < ps->count; i++)
        handles[i] = nb_register_grad_hook(ps->tensors[i], overlap_hook, &lg);
    nb_tensor *x, *y;
    global_batch(MLP, 300, &x, &y);
    int64_t local = GB / size;
    MT_OK(nb_backward(loss_of(m, MLP, x, y, rank * local, local, 1)));
    int after = nb__ddp_buckets_launched(d);
    MT_CHECK(lg.calls == ps->count, "%d hook calls for %d parameters", lg.calls, ps->count);
    /* The first bucket (the last layer's weight and bias) started as soon as both were
     * complete - by the second hook of six, with backward still to go through two layers -
     * and the last one only with the last gradient; every bucket was launched by the time
     * backward returned, so sync only waits. */
    int first = 0;
    while (first < lg.calls && lg.launched_at[first] == 0) first++;
    MT_CHECK(first <= 1, "the first bucket started only at hook %d of %d", first, lg.calls);
    MT_CHECK(lg.calls >= 2 && lg.launched_at[lg.calls - 2] < nbk,
             "the last bucket started before its gradients were complete");
    MT_CHECK(after == nbk, "%d of %d buckets started by the end of backward", after, nbk);
    MT_OK(nb_ddp_sync(d)); /* finished by backward already: nothing left to launch */
    MT_CHECK(nb__ddp_buckets_launched(d) == nbk, "nb_ddp_sync launched again");
    for (int i = 0; i < ps->count; i++) MT_OK(nb_remove_grad_hook(ps->tensors[i], handles[i]));
    nb_ddp_free(d);
    nb_module_free(m);
    nb_scope_end();
    MT_END();
}
END_TEST

/* ---- unused parameters ------------------------------------------------------------------------- */
static void unused_case(bool find_unused) {
    nb_scope_begin();
    int rank = mt_rank, size = mt_size;
    nb_module *m = build(MLP, 9), *ref = build(MLP, 9);
    nb_ddp_opts ddo = nb_ddp_defaults();
    ddo.find_unused = find_unused, ddo.bucket_mb = 200e-6;
    nb_ddp *d = nb_ddp_new(m, mt_world, &ddo);
    MT_CHECK(d != NULL, "ddp_new: %s", nb_last_error());
    nb_optim *o = make_opt(m, MLP);
    nb_tensor *x, *y;
    global_batch(MLP, 400, &x, &y);
    int64_t local = GB / size;
    /* Only the first layer and a head made of layer 2's weight are used: "2.bias",
     * "4.weight" and "4.bias" get no gradient. */
    nb_module *l0 = nb_module_child(m, "0");
    nb_tensor *w2 = nb_module_find(m, "2.weight");
    for (int step = 0; step < 2 && d; step++) {
        nb_scope_begin();
        MT_OK(nb_zero_grad(o));
        nb_tensor *h = nb_relu(nb_forward(l0, nb_narrow(x, 0, rank * local, local)));
        /* The end of backward synchronises and checks; nb_ddp_sync reports the same. */
        for (int k = 0; k < 2; k++) {
            nb_status sk = k ? nb_ddp_sync(d)
                             : nb_backward(nb_mean(nb_matmul(h, w2), NULL, 0, false));
            if (find_unused)
                MT_CHECK(sk == NB_OK, "%s with find_unused: %s", k ? "sync" : "backward",
                         nb_last_error());
            else
                MT_EXPECT_ERROR(sk, NB_EINVAL, "ddp: parameter 2.bias got no gradient in this step "
                             "(nor did 2 other parameters); pass .find_unused = true if that is "
                             "intended");
        }
        /* the buckets were reduced all the same: the ranks agree, so stepping is allowed */
        if (!find_unused) MT_OK(nb_step(o));
        nb_scope_end();
    }
    if (find_unused && d) { /* the unused gradients are reduced as zeros; the used ones averaged */
        nb_scope_begin();
        double *g = mt_values(nb_grad(nb_module_find(m, "4.weight")));
        for (int64_t j = 0; j < HID * OUT; j++)
            if (g[j] != 0) {
                MT_CHECK(false, "4.weight's gradient [%lld] = %g, not 0", (long long)j, g[j]);
                break;
            }
        free(g);
        /* reference: the same loss on the whole global batch, unwrapped */
        nb_tensor *h = nb_relu(nb_forward(nb_module_child(ref, "0"), x));
        MT_OK(nb_backward(nb_mean(nb_matmul(h, nb_module_find(ref, "2.weight")), NULL, 0, false)));
        const char *names[] = {"0.weight", "0.bias", "2.weight"};
        for (int i = 0; i < 3; i++) {
            double *a = mt_values(nb_grad(nb_module_find(m, names[i])));
            double *r = mt_values(nb_grad(nb_module_find(ref, names[i])));
            int64_t n = nb_numel(nb_module_find(m, names[i]));
            for (int64_t j = 0; j < n; j++)
                if (!(fabs(a[j] - r[j]) <= 1e-5 * (fabs(r[j]) + 1e-3))) {
                    MT_CHECK(false, "%s gradient [%lld] = %g, reference %g", names[i],
                             (long long)j, a[j], r[j]);
                    break;
                }
            free(a);
            free(r);
        }
        nb_scope_end();
    }
    nb_ddp_free(d);
    nb_optim_free(o);
    nb_module_free(m);
    nb_module_free(ref);
    nb_scope_end();
}

START_TEST(test_ddp_unused_parameter) {
    unused_case(false);
    unused_case(true);
    MT_END();
}
END_TEST

/* ---- broadcast at wrap time --------------------------------------------------------------------- */
static nb_module *build_bn(uint64_t seed) { /* with buffers: batch norm running statistics */
    nb_generator *g = nb_generator_new(seed);
    nb_linear_opts lin = nb_linear_defaults();
    lin.gen = g;
    nb_linear_opts lin2 = nb_linear_defaults();
    lin2.gen = g;
    nb_module *m = nb_sequential_new(nb_linear_new(IN, HID, &lin), nb_batch_norm1d_new(HID, NULL),
                                     nb_linear_new(HID, OUT, &lin2), NULL);
    nb_generator_free(g);
    MT_CHECK(m != NULL, "building the model: %s", nb_last_error());
    return m;
}

START_TEST(test_ddp_broadcast) {
    nb_scope_begin();
    int rank = mt_rank;
    nb_module *m = build_bn(20 + (uint64_t)rank), *mn = build_bn(20 + (uint64_t)rank);
    nb_module *ref = build_bn(20); /* what rank 0 has */
    MT_OK(nb_init_constant_(nb_module_find(m, "1.running_mean"), rank));
    nb_ddp *d = nb_ddp_new(m, mt_world, NULL);
    nb_ddp_opts nbo = nb_ddp_defaults();
    nbo.no_broadcast = true;
    nb_ddp *dn = nb_ddp_new(mn, mt_world, &nbo);
    MT_CHECK(d && dn, "ddp_new: %s", nb_last_error());
    MT_CHECK(nb_ddp_num_buckets(d) == 1, "%d buckets; 25 MiB holds the whole model",
             nb_ddp_num_buckets(d));
    mt_expect_same_params(m, ref, 0, "broadcast weights");
    double *rm = mt_values(nb_module_find(m, "1.running_mean"));
    MT_CHECK(rm[0] == 0 && rm[HID - 1] == 0, "running_mean %g is not rank 0's", rm[0]);
    free(rm);
    /* no_broadcast keeps each rank's own weights */
    double *mine = mt_values(nb_module_find(mn, "0.weight"));
    double *r0 = mt_values(nb_module_find(ref, "0.weight"));
    MT_CHECK((rank == 0) == (memcmp(mine, r0, sizeof(double) * IN * HID) == 0),
             "no_broadcast: rank %d has %s rank 0's weights", rank, rank ? "" : "not");
    free(mine);
    free(r0);
    nb_ddp_free(d);
    nb_ddp_free(dn);
    nb_module_free(m);
    nb_module_free(mn);
    nb_module_free(ref);
    nb_scope_end();
    MT_END();
}
END_TEST

/* ---- size-1 communicator: exactly the plain computation ------------------------------------------ */
START_TEST(test_ddp_self_is_plain) {
    nb_scope_begin();
    nb_comm *self = nb_comm_self();
    MT_CHECK(self && nb_comm_size(self) == 1, "comm_self: %s", nb_last_error());
    nb_module *ref = build(EMB, 4), *m = build(EMB, 4);
    nb_optim *ro = make_opt(ref, EMB);
    nb_ddp_opts ddo = nb_ddp_defaults();
    ddo.bucket_mb = 1e-9;
    nb_ddp *d = nb_ddp_new(m, self, &ddo);
    nb_optim *o = make_opt(m, EMB);
    MT_CHECK(d && o, "%s", nb_last_error());
    for (int step = 0; step < 3 && d; step++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        global_batch(EMB, 500 + (uint64_t)step, &x, &y);
        plain_step(ref, ro, EMB, x, y, 0, GB);
        MT_OK(nb_zero_grad(o));
        MT_OK(nb_backward(loss_of(m, EMB, x, y, 0, GB, 1)));
        MT_OK(nb_ddp_sync(d));
        MT_OK(nb_step(o));
        nb_scope_end();
    }
    mt_expect_same_params(m, ref, 0, "size-1 ddp"); /* bit for bit */
    nb_ddp_free(d);
    nb_optim_free(o);
    nb_optim_free(ro);
    nb_module_free(m);
    nb_module_free(ref);
    nb_comm_free(self);
    nb_scope_end();
    MT_END();
}
END_TEST

/* ---- compressed communication (reduce_dtype) ---------------------------------------------------- */
/* Two copies of a model trained on the same data, one with f32 gradient allreduces and one
 * with bf16 (or f16) compression: every gradient of the compressed one is the mean of the
 * ranks' gradients rounded to the wire dtype, summed in f32 and rounded again (within two
 * roundings of the f32 mean), the training loss follows the f32 one, and the bytes on the
 * wire are half (plus the padding of each bucket to a multiple of the ranks). */
static void compressed_case(nb_dtype wire) {
    enum { K = 100 };
    nb_scope_begin();
    int rank = mt_rank, size = mt_size;
    nb_module *mf = build(MLP, 21), *mc = build(MLP, 21);
    nb_ddp_opts ddo = nb_ddp_defaults();
    ddo.bucket_mb = 2e-3;
    nb_ddp *df = nb_ddp_new(mf, mt_world, &ddo);
    nb_ddp_opts ddo2 = nb_ddp_defaults();
    ddo2.bucket_mb = 2e-3, ddo2.reduce_dtype = wire;
    nb_ddp *dc = nb_ddp_new(mc, mt_world, &ddo2);
    MT_CHECK(df && dc, "ddp_new: %s", nb_last_error());
    nb_optim *of = make_opt(mf, MLP), *oc = make_opt(mc, MLP);
    int64_t local = GB / size;
    double lf = 0, lc = 0, l0 = 0;
    /* two roundings to the wire dtype (bf16: 2^-8 each), relative to the tensor's largest
     * gradient: each rank's contribution is rounded before the sum, so where the ranks'
     * gradients cancel the error is that of the parts, not of the mean */
    double tol = wire == NB_BF16 ? 2.0 / 256 : 2.0 / 2048;
    for (int step = 0; step < K && df && dc; step++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        global_batch(MLP, 900 + (uint64_t)(step % 4), &x, &y);
        nb_tensor *a = loss_of(mf, MLP, x, y, rank * local, local, 1);
        nb_tensor *b = loss_of(mc, MLP, x, y, rank * local, local, 1);
        MT_OK(nb_zero_grad(of));
        MT_OK(nb_zero_grad(oc));
        MT_OK(nb_backward(a));
        MT_OK(nb_backward(b));
        if (step == 0) {
            l0 = nb_item_f64(a);
            /* same weights so far: the compressed gradients are the f32 ones, rounded */
            const nb_params *pf = nb_parameters(mf), *pc = nb_parameters(mc);
            for (int i = 0; i < pf->count; i++) {
                double *gf = mt_values(nb_grad(pf->tensors[i])), *gc = mt_values(nb_grad(pc->tensors[i]));
                int64_t n = nb_numel(pf->tensors[i]);
                double scale = 0;
                for (int64_t j = 0; j < n; j++) scale = fmax(scale, fabs(gf[j]));
                for (int64_t j = 0; j < n; j++)
                    if (!(fabs(gc[j] - gf[j]) <= tol * (fabs(gf[j]) + scale))) {
                        MT_CHECK(false, "%s: grad %s[%lld] = %.9g, f32 allreduce %.9g",
                                 nb_dtype_name(wire), pf->names[i], (long long)j, gc[j], gf[j]);
                        break;
                    }
                free(gf);
                free(gc);
            }
            int64_t bf = nb_ddp_comm_bytes(df), bc = nb_ddp_comm_bytes(dc);
            if (size == 1) {
                MT_CHECK(bf == 0 && bc == 0, "one rank sends nothing (%lld, %lld bytes)",
                         (long long)bf, (long long)bc);
            } else {
                /* buckets are padded to a multiple of the ranks: at most size - 1 elements */
                int64_t pad = (int64_t)nb_ddp_num_buckets(dc) * 2 * (size - 1) * 2;
                MT_CHECK(bf > 0 && 2 * bc <= bf + 2 * pad,
                         "%s: %lld bytes on the wire, f32: %lld (want half)",
                         nb_dtype_name(wire), (long long)bc, (long long)bf);
            }
        }
        lf = nb_item_f64(a);
        lc = nb_item_f64(b);
        MT_OK(nb_step(of));
        MT_OK(nb_step(oc));
        nb_scope_end();
    }
    /* the training loss of the compressed run follows the f32 one */
    MT_CHECK(lf < 0.7 * l0, "the f32 run did not train (%g -> %g)", l0, lf);
    MT_CHECK(fabs(lc - lf) <= 0.02 * l0, "%s: final loss %.6g, f32 allreduce %.6g (start %.6g)",
             nb_dtype_name(wire), lc, lf, l0);
    if (getenv("NB_DDP_COMPRESS_REPORT") && rank == 0)
        printf("ddp compression %s on %d ranks: loss %.6g -> %.6g (f32 allreduce: %.6g), "
               "%lld bytes per step (f32: %lld)\n", nb_dtype_name(wire), size, l0, lc, lf,
               (long long)nb_ddp_comm_bytes(dc), (long long)nb_ddp_comm_bytes(df));
    nb_ddp_free(df);
    nb_ddp_free(dc);
    nb_optim_free(of);
    nb_optim_free(oc);
    nb_module_free(mf);
    nb_module_free(mc);
    nb_scope_end();
}

START_TEST(test_ddp_compressed) {
    compressed_case(NB_BF16);
    compressed_case(NB_F16);
    /* anything but f32, f16 or bf16 is refused, naming the option */
    nb_scope_begin();
    nb_module *m = build(MLP, 3);
    nb_ddp_opts ddo = nb_ddp_defaults();
    ddo.reduce_dtype = NB_F64, ddo.bucket_mb = 0;
    MT_EXPECT_ERROR(nb_ddp_new(m, mt_world, &ddo) ? NB_OK : nb_last_status(), NB_EINVAL,
                 "reduce_dtype must be f32");
    nb_module_free(m);
    nb_scope_end();
    MT_END();
}
END_TEST

/* ---- the loss scaler's global inf/NaN flag ---------------------------------------------------- */
/* Each rank steps its own parameter; only the last rank's gradient is inf. With the world
 * set (nb_grad_scaler_set_comm) every rank skips the step and halves its scale; without,
 * only the last rank does. */
START_TEST(test_grad_scaler_global_flag) {
    for (int global = 0; global < 2; global++) {
        nb_scope_begin();
        nb_tensor *p = nb_ones((int64_t[]){3}, 1, NB_F32);
        MT_OK(nb_set_requires_grad(p, true));
        nb_params lp = {.tensors = &p, .count = 1};
        nb_sgd_opts so = nb_sgd_defaults();
        so.lr = 0.1;
        nb_optim *o = nb_sgd_new(&lp, &so);
        nb_grad_scaler *gs = nb_grad_scaler_new(NULL);
        MT_CHECK(o && gs, "%s", nb_last_error());
        if (global) MT_OK(nb_grad_scaler_set_comm(gs, mt_world));
        bool bad = mt_rank == mt_size - 1;
        nb_tensor *g = nb_full((int64_t[]){3}, 1, NB_F32, bad ? INFINITY : 65536.0);
        MT_OK(nb_set_grad(p, g));
        MT_OK(nb_grad_scaler_step(gs, o));
        bool want_skip = bad || global; /* global: the last rank's inf reaches all */
        MT_CHECK(nb_grad_scaler_skipped(gs) == want_skip, "rank %d (%s flag): skipped %d",
                 mt_rank, global ? "global" : "local", nb_grad_scaler_skipped(gs));
        MT_OK(nb_grad_scaler_update(gs));
        double want_scale = want_skip ? 32768.0 : 65536.0;
        MT_CHECK(nb_grad_scaler_get_scale(gs) == want_scale, "rank %d: scale %g, want %g",
                 mt_rank, nb_grad_scaler_get_scale(gs), want_scale);
        double v[3];
        MT_OK(nb_read(p, v, 3, NB_F64));
        MT_CHECK(v[0] == (want_skip ? 1.0 : (double)(1.0f + (float)-0.1 * 1.0f)), "rank %d: p = %g", mt_rank, v[0]);
        nb_grad_scaler_free(gs);
        nb_optim_free(o);
        nb_scope_end();
    }
    MT_END();
}
END_TEST

/* ---- synchronisation at the end of backward ----------------------------------------------------- */
/* a and b hold the same bits (contiguous tensors of one dtype). */
static bool same_bits(const nb_tensor *a, const nb_tensor *b) {
    return a && b && nb_numel(a) == nb_numel(b) && nb_tensor_dtype(a) == nb_tensor_dtype(b) &&
           memcmp(nb_data(a), nb_data(b),
                  (size_t)nb_numel(a) * nb_dtype_size(nb_tensor_dtype(a))) == 0;
}

/* t holds the same bits on every rank (collective). */
static void expect_same_on_ranks(nb_tensor *t, const char *what, int step) {
    nb_scope_begin();
    nb_tensor *hi = nb_clone(t), *lo = nb_clone(t);
    MT_OK(nb_allreduce(mt_world, hi, NB_REDUCE_MAX));
    MT_OK(nb_allreduce(mt_world, lo, NB_REDUCE_MIN));
    MT_CHECK(same_bits(hi, t) && same_bits(lo, t), "step %d: %s differ between the ranks", step,
             what);
    nb_scope_end();
}

/* Forgetting nb_ddp_sync used to leave every rank on its own gradients (the ranks drifted
 * apart and the program exited 0). Backward now synchronises by itself: a model trained
 * without a single nb_ddp_sync call gets the bits of one that calls it, on every rank, and
 * nb_ddp_sync after backward is a wait that changes nothing. */
START_TEST(test_ddp_auto_sync) {
    enum { K = 4 };
    nb_scope_begin();
    int rank = mt_rank, size = mt_size;
    nb_module *a = build(MLP, 11 + (uint64_t)rank), *b = build(MLP, 11 + (uint64_t)rank);
    nb_ddp_opts dopts = nb_ddp_defaults(); /* several buckets */
    dopts.bucket_mb = 200e-6;
    nb_ddp *da = nb_ddp_new(a, mt_world, &dopts), *db = nb_ddp_new(b, mt_world, &dopts);
    MT_CHECK(da && db, "ddp_new: %s", nb_last_error());
    nb_optim *oa = make_opt(a, MLP), *ob = make_opt(b, MLP);
    int64_t local = GB / size;
    for (int step = 0; step < K && da && db; step++) {
        nb_scope_begin();
        nb_tensor *x, *y;
        global_batch(MLP, 700 + (uint64_t)step, &x, &y);
        MT_OK(nb_zero_grad(oa)); /* a: with nb_ddp_sync, as before */
        MT_OK(nb_backward(loss_of(a, MLP, x, y, rank * local, local, 1)));
        MT_OK(nb_ddp_sync(da));
        MT_OK(nb_step(oa));
        MT_OK(nb_zero_grad(ob)); /* b: never calls it */
        MT_OK(nb_backward(loss_of(b, MLP, x, y, rank * local, local, 1)));
        nb_tensor *g = nb_clone(nb_module_flat_grads(b));
        double exposed = nb_ddp_exposed_comm_s(db);
        if (step == K - 1) { /* calling it anyway, twice, changes nothing */
            MT_OK(nb_ddp_sync(db));
            MT_OK(nb_ddp_sync(db));
            MT_CHECK(same_bits(g, nb_module_flat_grads(b)),
                     "nb_ddp_sync changed gradients that backward had synchronised");
            MT_CHECK(nb_ddp_exposed_comm_s(db) == exposed, "the step's exposed time was reset");
        }
        expect_same_on_ranks(g, "the gradients after backward", step);
        MT_OK(nb_step(ob));
        MT_CHECK(same_bits(nb_module_flat_params(a), nb_module_flat_params(b)),
                 "step %d: the model without nb_ddp_sync differs from the one with it", step);
        expect_same_on_ranks(nb_module_flat_params(b), "the parameters", step);
        nb_scope_end();
    }
    nb_ddp_free(da);
    nb_ddp_free(db);
    nb_optim_free(oa);
    nb_optim_free(ob);
    nb_module_free(a);
    nb_module_free(b);
    nb_scope_end();
    MT_END();
}
END_TEST

/* Gradients a backward produced with sync disabled, never averaged: nb_step refuses them
 * (changing nothing) rather than let the ranks drift; enabling sync and calling nb_ddp_sync
 * averages them. */
START_TEST(test_ddp_step_refuses_unsynced) {
    nb_scope_begin();
    int rank = mt_rank, size = mt_size;
    nb_module *m = build(MLP, 13), *ref = build(MLP, 13);
    nb_ddp_opts ddo = nb_ddp_defaults();
    ddo.bucket_mb = 200e-6;
    nb_ddp *d = nb_ddp_new(m, mt_world, &ddo);
    MT_CHECK(d != NULL, "ddp_new: %s", nb_last_error());
    nb_optim *o = make_opt(m, MLP), *ro = make_opt(ref, MLP);
    nb_tensor *x, *y;
    global_batch(MLP, 800, &x, &y);
    int64_t local = GB / size, half = local / 2;
    if (d) {
        MT_OK(nb_zero_grad(o));
        nb_ddp_set_sync_enabled(d, false); /* ... and never enabled again */
        MT_OK(nb_backward(loss_of(m, MLP, x, y, rank * local, half, 0.5)));
        MT_OK(nb_backward(loss_of(m, MLP, x, y, rank * local + half, local - half, 0.5)));
        nb_tensor *before = nb_clone(nb_module_flat_params(m));
        MT_EXPECT_ERROR(nb_step(o), NB_ESTATE, "step: the gradient of '0.weight' (an nb_ddp model) "
                     "comes from a backward with sync disabled and was never averaged over the "
                     "ranks; enable sync");
        MT_CHECK(same_bits(before, nb_module_flat_params(m)), "a refused step changed weights");
        MT_OK(nb_ddp_sync(d)); /* sync disabled: nothing to do, still refused */
        MT_EXPECT_ERROR(nb_step(o), NB_ESTATE, "never averaged");
        nb_ddp_set_sync_enabled(d, true);
        MT_OK(nb_ddp_sync(d)); /* averages what was accumulated */
        MT_OK(nb_step(o));
        plain_step(ref, ro, MLP, x, y, 0, GB);
        mt_expect_same_params(m, ref, 1e-5, "synchronised by nb_ddp_sync");
        expect_same_on_ranks(nb_module_flat_params(m), "the parameters", 0);
    }
    nb_ddp_free(d);
    nb_optim_free(o);
    nb_optim_free(ro);
    nb_module_free(m);
    nb_module_free(ref);
    nb_scope_end();
    MT_END();
}
END_TEST

/* A user hook that writes a tensor the first layer saved: backward fails part-way, after
 * DDP started the last layers' buckets. Backward reports its own error, waits for what it
 * started (no rank is left in a collective), and the step refuses the gradients; the next
 * clean step works. */
static void spoil_hook(nb_tensor *leaf, void *ctx) {
    (void)leaf;
    nb_fill_(ctx, 0);
}

START_TEST(test_ddp_backward_failure) {
    nb_scope_begin();
    int rank = mt_rank, size = mt_size;
    nb_module *m = build(MLP, 15);
    nb_ddp_opts ddo = nb_ddp_defaults();
    ddo.bucket_mb = 200e-6;
    nb_ddp *d = nb_ddp_new(m, mt_world, &ddo);
    MT_CHECK(d != NULL, "ddp_new: %s", nb_last_error());
    nb_optim *o = make_opt(m, MLP);
    nb_tensor *x, *y;
    global_batch(MLP, 900, &x, &y);
    int64_t local = GB / size;
    nb_tensor *xs = nb_clone(nb_narrow(x, 0, rank * local, local));
    nb_tensor *ys = nb_narrow(y, 0, rank * local, local);
    nb_tensor *b4 = nb_module_find(m, "4.bias");
    int h = d ? nb_register_grad_hook(b4, spoil_hook, xs) : -1;
    if (d && h >= 0) {
        MT_OK(nb_zero_grad(o));
        MT_EXPECT_ERROR(nb_backward(loss_of(m, MLP, xs, ys, 0, local, 1)), NB_EINVAL,
                     "modified in place after it was saved");
        int started = nb__ddp_buckets_launched(d);
        MT_CHECK(started > 0 && started < nb_ddp_num_buckets(d),
                 "%d of %d buckets started before the failure", started, nb_ddp_num_buckets(d));
        MT_EXPECT_ERROR(nb_ddp_sync(d), NB_EINVAL, "ddp: the gradients were not synchronised: "
                     "backward failed (backward: a tensor saved by");
        MT_EXPECT_ERROR(nb_step(o), NB_ESTATE, "step: the gradient of '0.weight' (an nb_ddp model) "
                     "was not averaged over the ranks, so the ranks would drift apart: backward "
                     "failed before they were");
        MT_OK(nb_remove_grad_hook(b4, h));
        MT_OK(nb_zero_grad(o));
        MT_OK(nb_backward(loss_of(m, MLP, x, y, rank * local, local, 1)));
        MT_OK(nb_step(o));
        expect_same_on_ranks(nb_module_flat_params(m), "the parameters after a clean step", 1);
    } else {
        MT_CHECK(false, "setup: %s", nb_last_error());
    }
    nb_ddp_free(d);
    nb_optim_free(o);
    nb_module_free(m);
    nb_scope_end();
    MT_END();
}
END_TEST

/* ---- user errors ----------------------------------------------------------------------------- */
START_TEST(test_ddp_errors) {
    nb_scope_begin();
    nb_comm *self = nb_comm_self();
    nb_module *m = build(MLP, 1);
    MT_CHECK(!nb_ddp_new(NULL, self, NULL), "NULL model accepted");
    MT_EXPECT_ERROR(nb_last_status(), NB_ENULL, "ddp_new: model is NULL");
    MT_CHECK(!nb_ddp_new(m, NULL, NULL), "NULL communicator accepted");
    MT_EXPECT_ERROR(nb_last_status(), NB_ENULL, "ddp_new: communicator is NULL");
    nb_ddp_opts ddo = nb_ddp_defaults();
    ddo.bucket_mb = -1;
    MT_CHECK(!nb_ddp_new(m, self, &ddo), "negative bucket accepted");
    MT_EXPECT_ERROR(nb_last_status(), NB_EINVAL, "bucket_mb must be >= 0");
    /* options are read as written (issue 17 item 4): bucket_mb 0 is the smallest buckets (one
     * parameter each), not 25 MiB; the constructor gives 25 */
    MT_CHECK(nb_ddp_defaults().bucket_mb == 25 && !nb_ddp_defaults().find_unused &&
             !nb_ddp_defaults().no_broadcast, "nb_ddp_defaults");
    nb_module *m0 = build(MLP, 1);
    nb_ddp_opts ddo2 = nb_ddp_defaults();
    ddo2.bucket_mb = 0;
    nb_ddp *d0 = nb_ddp_new(m0, self, &ddo2);
    MT_CHECK(d0 && nb_ddp_num_buckets(d0) == nb_parameters(m0)->count,
             "bucket_mb 0: %d buckets for %d parameters", d0 ? nb_ddp_num_buckets(d0) : -1,
             nb_parameters(m0)->count);
    nb_ddp_free(d0);
    nb_module_free(m0);
    MT_EXPECT_ERROR(nb_ddp_sync(NULL), NB_ENULL, "ddp_sync: ddp is NULL");
    MT_CHECK(nb_ddp_num_buckets(NULL) == 0 && nb_ddp_exposed_comm_s(NULL) == 0, "NULL ddp");
    nb_ddp_free(NULL);
    nb_module *act = nb_relu_new();
    MT_CHECK(!nb_ddp_new(act, self, NULL), "a module without parameters accepted");
    MT_EXPECT_ERROR(nb_last_status(), NB_EINVAL, "no parameters");
    nb_module_free(act);

    nb_ddp *d = nb_ddp_new(m, self, NULL);
    MT_CHECK(d != NULL, "ddp_new: %s", nb_last_error());
    if (d) {
        MT_CHECK(!nb_ddp_new(m, self, NULL), "a model wrapped twice");
        MT_EXPECT_ERROR(nb_last_status(), NB_ESTATE, "is already wrapped by another nb_ddp");
        nb_tensor *x, *y;
        global_batch(MLP, 600, &x, &y);
        /* two backward passes in a row: each synchronises at its end; sync is a no-op */
        MT_OK(nb_backward(loss_of(m, MLP, x, y, 0, GB, 1)));
        MT_OK(nb_backward(loss_of(m, MLP, x, y, 0, GB, 1)));
        MT_OK(nb_ddp_sync(d));
        MT_OK(nb_ddp_sync(d));
        /* a gradient dropped behind DDP's back is put back into the flat buffer */
        nb_module_zero_grad(m);
        nb_tensor *b4 = nb_module_find(m, "4.bias");
        nb_clear_grad(b4);
        MT_OK(nb_backward(loss_of(m, MLP, x, y, 0, GB, 1)));
        MT_OK(nb_ddp_sync(d));
        MT_CHECK(nb_grad(b4) && nb_shares_storage(nb_grad(b4), nb_module_flat_grads(m)),
                 "4.bias's gradient is not in the flat buffer");
        nb_ddp_free(d);
    }
    nb_module_free(m);
    nb_comm_free(self);
    nb_scope_end();
    MT_END();
}
END_TEST

Suite *mt_suite_ddp(void) {
    Suite *s = suite_create("ddp");
    TCase *tc = tcase_create("ddp");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_ddp_equivalence_mlp);
    tcase_add_test(tc, test_ddp_equivalence_embedding_layernorm);
    tcase_add_test(tc, test_ddp_equivalence_gpt);
    tcase_add_test(tc, test_ddp_equivalence_gpt_recompute);
    tcase_add_test(tc, test_ddp_grad_accumulation);
    tcase_add_test(tc, test_ddp_overlap);
    tcase_add_test(tc, test_ddp_unused_parameter);
    tcase_add_test(tc, test_ddp_broadcast);
    tcase_add_test(tc, test_ddp_self_is_plain);
    tcase_add_test(tc, test_ddp_errors);
    tcase_add_test(tc, test_ddp_auto_sync);
    tcase_add_test(tc, test_ddp_step_refuses_unsynced);
    tcase_add_test(tc, test_ddp_backward_failure);
    tcase_add_test(tc, test_ddp_compressed);
    tcase_add_test(tc, test_grad_scaler_global_flag);
    suite_add_tcase(s, tc);
    return s;
}
