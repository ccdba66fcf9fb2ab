/* test_zero.c - ZeRO stages 1, 2 and 3 (parallel/zero.c) in nabla_mpi_tests, run with 1, 2 and 4
 * ranks (and alone).
 *
 * Equivalence (docs/architecture.md rule 8): K steps with nb_zero on W ranks, each rank
 * taking its slice of one global batch, end with the weights of 1 process on the global
 * batch and of nb_ddp on W ranks, for the MLP (SGD with momentum; AdamW with weight decay
 * on matrices only and a cosine schedule) and the GPT (gradient accumulation without sync,
 * global clipping over the shards). Memory: nb_zero_memory against the ZeRO formulas and
 * against the allocator's live bytes. Errors: bad stage, unshardable optimizers, gradients
 * never reduced. Failures are recorded with MT_CHECK and agreed on by MT_END. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <nabla/gpt.h>
#include "mpi_test.h"

enum { IN = 8, HID = 16, OUT = 4, GB = 16 };

static nb_module *build_mlp(uint64_t seed, int64_t in, int64_t hid, int64_t out) {
    nb_generator *g = nb_generator_new(seed);
    nb_linear_opts o = nb_linear_defaults();
    o.gen = g;
    nb_module *m = nb_sequential_new(nb_linear_new(in, hid, &o), nb_relu_new(),
                                     nb_linear_new(hid, hid, &o), nb_tanh_new(),
                                     nb_linear_new(hid, out, &o), NULL);
    nb_generator_free(g);
    MT_CHECK(m != NULL, "building the model: %s", nb_last_error());
    return m;
}

/* ---- equivalence on the MLP ------------------------------------------------------------------ */
typedef enum { SGD_MOMENTUM, ADAMW_GROUPS, ADAM_AMSGRAD, RMSPROP_CENTERED, ADAGRAD } opt_kind;
static const char *const opt_names[] = {"sgd", "adamw+groups", "adam amsgrad",
                                        "rmsprop centered", "adagrad"};

/* The optimizer (and for ADAMW_GROUPS its cosine schedule in *sched). */
static nb_optim *make_opt(nb_module *m, opt_kind k, nb_sched **sched) {
    *sched = NULL;
    if (k == SGD_MOMENTUM) {
        nb_sgd_opts so = nb_sgd_defaults();
        so.lr = 0.1, so.momentum = 0.9;
        return nb_sgd_new(nb_parameters(m), &so);
    }
    if (k == ADAM_AMSGRAD) {
        nb_adam_opts ao = nb_adam_defaults();
        ao.lr = 1e-2, ao.amsgrad = true, ao.weight_decay = 1e-3;
        return nb_adam_new(nb_parameters(m), &ao);
    }
    if (k == RMSPROP_CENTERED) {
        nb_rmsprop_opts ro = nb_rmsprop_defaults();
        ro.lr = 1e-3, ro.centered = true, ro.momentum = 0.9;
        return nb_rmsprop_new(nb_parameters(m), &ro);
    }
    if (k == ADAGRAD) {
        nb_adagrad_opts go = nb_adagrad_defaults();
        go.lr = 1e-2, go.lr_decay = 0.01, go.initial_accumulator_value = 0.1;
        return nb_adagrad_new(nb_parameters(m), &go);
    }
    nb_params decay, no_decay;
    if (nb_params_split_decay(nb_parameters(m), &decay, &no_decay) != NB_OK) return NULL;
    nb_adamw_opts ao = nb_adamw_defaults();
    ao.lr = 1e-2;
    ao.weight_decay = 0.1;
    nb_optim *o = nb_adamw_new(&decay, &ao);
    nb_group_opts go = nb_group_defaults();
    go.weight_decay = 0;
    if (o && nb_optim_add_group(o, &no_decay, &go) < 0) {
        nb_optim_free(o);
        o = NULL;
    }
    nb_params_deinit(&decay);
    nb_params_deinit(&no_decay);
    nb_sched_opts so = nb_sched_defaults(NB_SCHED_COSINE);
    so.warmup_steps = 2;
    so.total_steps = 6;
    so.min_lr = 1e-3;
    if (o) *sched = nb_sched_new(o, &so);
    return o;
}

/* One step on rows [start, start + n) of the batch: loss, backward, (clip), step, schedule. */
static void train(nb_module *m, nb_optim *o, nb_sched *s, nb_zero *z, nb_tensor *x, nb_tensor *y,
                  int64_t start, int64_t n, double clip) {
    (void)z; /* wrapped or not, the same calls */
    nb_scope_begin();
    nb_tensor *l = nb_cross_entropy(nb_forward(m, nb_narrow(x, 0, start, n)),
                                    nb_narrow(y, 0, start, n), NULL);
    MT_OK(nb_zero_grad(o));
    MT_OK(nb_backward(l));
    if (clip > 0) {
        /* under ZeRO the parameters' placements make it the norm over every shard */
        double norm = nb_clip_grad_norm(nb_optim_params(o), clip, 2);
        MT_CHECK(norm >= 0, "clip: %s", nb_last_error());
    }
    MT_OK(nb_step(o));
    if (s) MT_OK(nb_sched_step(s));
    nb_scope_end();
}

static void check_mlp(int stage, opt_kind k, double bucket_mb, double clip) {
    enum { K = 5 };
    nb_scope_begin();
    int rank = mt_rank, size = mt_size;
    nb_module *ref = build_mlp(7, IN, HID, OUT), *m = build_mlp(7 + (uint64_t)rank, IN, HID, OUT);
    nb_module *dm = build_mlp(7 + (uint64_t)rank, IN, HID, OUT);
    nb_sched *rs, *zs, *ds;
    nb_optim *ro = make_opt(ref, k, &rs), *o = make_opt(m, k, &zs);
    nb_ddp_opts ddo = nb_ddp_defaults();
    ddo.bucket_mb = bucket_mb;
    nb_ddp *d = nb_ddp_new(dm, mt_world, &ddo);
    nb_optim *dop = make_opt(dm, k, &ds);
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = stage, zo.bucket_mb = bucket_mb;
    nb_zero *z = o ? nb_zero_new(m, o, mt_world, &zo) : NULL;
    MT_CHECK(ro && o && dop && d && z, "setup (stage %d): %s", stage, nb_last_error());
    MT_CHECK(nb_zero_stage(z) == stage, "stage %d reported as %d", stage, nb_zero_stage(z));
    int64_t local = GB / size;
    for (int step = 0; step < K && z && d; step++) {
        nb_scope_begin();
        nb_generator *g = nb_generator_new(100 + (uint64_t)step);
        nb_tensor *x = nb_randn((int64_t[]){GB, IN}, 2, NB_F32, g);
        nb_tensor *y = nb_randint((int64_t[]){GB}, 1, NB_I64, 0, OUT, g);
        nb_generator_free(g);
        train(ref, ro, rs, NULL, x, y, 0, GB, clip);
        train(m, o, zs, z, x, y, rank * local, local, clip);
        /* DDP's clipping: every rank has the whole averaged gradient */
        train(dm, dop, ds, NULL, x, y, rank * local, local, clip);
        nb_scope_end();
    }
    char what[96];
    snprintf(what, sizeof what, "mlp, stage %d, %s, bucket_mb %g, clip %g", stage, opt_names[k],
             bucket_mb, clip);
    if (z) MT_OK(nb_zero_gather_params(z)); /* stage 3: whole parameters to compare */
    if (z) mt_expect_same_params(m, ref, 1e-5, what);
    if (z) mt_expect_same_params(m, dm, 1e-5, what);
    nb_zero_free(z);
    nb_sched_free(zs);
    nb_sched_free(rs);
    nb_sched_free(ds);
    nb_optim_free(o);
    nb_optim_free(ro);
    nb_optim_free(dop);
    nb_ddp_free(d);
    nb_module_free(m);
    nb_module_free(dm);
    nb_module_free(ref);
    nb_scope_end();
}

START_TEST(test_zero_equivalence_mlp) {
    for (int stage = 1; stage <= 3; stage++) {
        check_mlp(stage, SGD_MOMENTUM, 0, 0);        /* one bucket */
        check_mlp(stage, SGD_MOMENTUM, 200e-6, 0);   /* several buckets */
        check_mlp(stage, ADAMW_GROUPS, 200e-6, 0);   /* chunks cross group boundaries */
        check_mlp(stage, ADAMW_GROUPS, 1e-9, 0.05);  /* one bucket per parameter, clipping */
    }
    /* every other optimizer, sharded parameters */
    for (opt_kind k = ADAM_AMSGRAD; k <= ADAGRAD; k++) check_mlp(3, k, 0, 0.5);
    MT_END();
}
END_TEST

/* ---- compressed gradient reduction (reduce_dtype) ------------------------------------------- */
/* Two copies of the MLP under ZeRO at one stage, one reducing in f32 and one in the wire
 * dtype (bf16 or f16, summed in f32): the bytes on the wire are half (plus each bucket's
 * padding to a multiple of the ranks), the weights after the first step are within two
 * wire roundings of the gradient (times the learning rate) of the f32 ones, and after K
 * steps the training loss is within 2 % of the starting loss of the f32 run's. */
/* The step of c (from m0's weights) is f's within tol, relative to each element's step plus
 * the tensor's largest step. */
static void expect_step_close(nb_module *c, nb_module *f, nb_module *m0, double tol, int stage) {
    const nb_params *pc = nb_parameters(c), *pf = nb_parameters(f), *p0 = nb_parameters(m0);
    for (int i = 0; i < pf->count; i++) {
        double *vc = mt_values(pc->tensors[i]), *vf = mt_values(pf->tensors[i]);
        double *v0 = mt_values(p0->tensors[i]);
        int64_t n = nb_numel(pf->tensors[i]);
        double scale = 0;
        for (int64_t j = 0; j < n; j++) scale = fmax(scale, fabs(vf[j] - v0[j]));
        for (int64_t j = 0; j < n; j++)
            if (!(fabs(vc[j] - vf[j]) <= tol * (fabs(vf[j] - v0[j]) + scale))) {
                MT_CHECK(false, "stage %d, first step: %s[%lld] = %.9g, f32 reduce %.9g (from "
                         "%.9g)", stage, pf->names[i], (long long)j, vc[j], vf[j], v0[j]);
                break;
            }
        free(vc), free(vf), free(v0);
    }
}

static void check_compressed(int stage, nb_dtype wire) {
    enum { K = 60 };
    nb_scope_begin();
    int rank = mt_rank, size = mt_size;
    nb_module *mf = build_mlp(21, IN, HID, OUT), *mc = build_mlp(21, IN, HID, OUT);
    nb_module *m0 = build_mlp(21, IN, HID, OUT); /* the initial weights */
    nb_sched *sf, *sc;
    nb_optim *of = make_opt(mf, SGD_MOMENTUM, &sf), *oc = make_opt(mc, SGD_MOMENTUM, &sc);
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = stage, zo.bucket_mb = 200e-6;
    nb_zero *zf = nb_zero_new(mf, of, mt_world, &zo);
    nb_zero_opts zo2 = nb_zero_defaults();
    zo2.stage = stage, zo2.bucket_mb = 200e-6, zo2.reduce_dtype = wire;
    nb_zero *zc = nb_zero_new(mc, oc, mt_world, &zo2);
    MT_CHECK(zf && zc, "zero_new (stage %d, %s): %s", stage, nb_dtype_name(wire),
             nb_last_error());
    int64_t local = GB / size;
    double l0 = 0, lf = 0, lc = 0;
    for (int step = 0; step < K && zf && zc; step++) {
        nb_scope_begin();
        nb_generator *g = nb_generator_new(300 + (uint64_t)(step % 4));
        nb_tensor *x = nb_randn((int64_t[]){GB, IN}, 2, NB_F32, g);
        nb_tensor *y = nb_randint((int64_t[]){GB}, 1, NB_I64, 0, OUT, g);
        nb_generator_free(g);
        nb_module *ms[2] = {mf, mc};
        nb_optim *os[2] = {of, oc};
        double l[2];
        for (int i = 0; i < 2; i++) {
            nb_tensor *loss = nb_cross_entropy(nb_forward(ms[i], nb_narrow(x, 0, rank * local,
                                                                           local)),
                                               nb_narrow(y, 0, rank * local, local), NULL);
            MT_OK(nb_zero_grad(os[i]));
            MT_OK(nb_backward(loss));
            MT_OK(nb_step(os[i]));
            /* the loss on the whole batch (the same on every rank) after the step */
            bool prev = nb_set_grad_enabled(false);
            nb_tensor *all = nb_cross_entropy(nb_forward(ms[i], x), y, NULL);
            nb_set_grad_enabled(prev);
            l[i] = all ? nb_item_f64(all) : NAN;
        }
        if (step == 0) {
            l0 = l[0];
            int64_t bf = nb_zero_comm_bytes(zf), bc = nb_zero_comm_bytes(zc);
            if (size == 1) {
                MT_CHECK(bf == 0 && bc == 0, "stage %d: one rank sends nothing (%lld, %lld "
                         "bytes)", stage, (long long)bf, (long long)bc);
            } else {
                /* buckets are padded to a multiple of the ranks: at most size - 1 elements */
                int64_t pad = (int64_t)nb_zero_num_buckets(zc) * (size - 1) * 2;
                MT_CHECK(bf > 0 && bc > 0 && 2 * bc <= bf + 2 * pad,
                         "stage %d %s: %lld bytes on the wire, f32: %lld (want half)", stage,
                         nb_dtype_name(wire), (long long)bc, (long long)bf);
            }
            /* one step of lr 0.1 from the same weights: the gradients differ by the wire's
             * roundings (bf16 2^-8 relative, twice; where ranks' parts cancel, relative to
             * the parts), so the weights by a tenth of that */
            MT_OK(nb_zero_gather_params(zf));
            MT_OK(nb_zero_gather_params(zc));
            expect_step_close(mc, mf, m0, wire == NB_BF16 ? 2.0 / 256 : 2.0 / 2048, stage);
            MT_OK(nb_zero_release_params(zf));
            MT_OK(nb_zero_release_params(zc));
        }
        lf = l[0], lc = l[1];
        nb_scope_end();
    }
    MT_CHECK(lf < 0.7 * l0, "stage %d: the f32 run did not train (%g -> %g)", stage, l0, lf);
    MT_CHECK(fabs(lc - lf) <= 0.02 * l0, "stage %d %s: final loss %.6g, f32 reduce %.6g (start "
             "%.6g)", stage, nb_dtype_name(wire), lc, lf, l0);
    if (getenv("NB_ZERO_COMPRESS_REPORT") && rank == 0)
        printf("zero stage %d compression %s on %d ranks: loss %.6g -> %.6g (f32 reduce: "
               "%.6g), %lld bytes per step (f32: %lld)\n", stage, nb_dtype_name(wire), size,
               l0, lc, lf, (long long)nb_zero_comm_bytes(zc), (long long)nb_zero_comm_bytes(zf));
    nb_zero_free(zf);
    nb_zero_free(zc);
    nb_optim_free(of);
    nb_optim_free(oc);
    nb_module_free(mf);
    nb_module_free(mc);
    nb_module_free(m0);
    nb_scope_end();
}

START_TEST(test_zero_compressed) {
    for (int stage = 1; stage <= 3; stage++) check_compressed(stage, NB_BF16);
    check_compressed(2, NB_F16);
    /* anything but f32, f16 or bf16 is refused, naming the option */
    nb_scope_begin();
    nb_module *m = build_mlp(3, IN, HID, OUT);
    nb_sched *s;
    nb_optim *o = make_opt(m, SGD_MOMENTUM, &s);
    for (int stage = 0; stage <= 2; stage += 2) {
        nb_zero_opts zo = nb_zero_defaults();
        zo.stage = stage, zo.bucket_mb = 0, zo.reduce_dtype = NB_F64;
        MT_EXPECT_ERROR(nb_zero_new(m, o, mt_world, &zo) ? NB_OK : nb_last_status(), NB_EINVAL,
                     "reduce_dtype must be f32");
    }
    nb_optim_free(o);
    nb_module_free(m);
    nb_scope_end();
    MT_END();
}
END_TEST

/* ---- the GPT's training step: accumulation without sync, global clipping ---------------------- */
static void check_gpt(int stage) {
    enum { K = 3, MICRO = 2, GBT = 8, TT = 8 };
    nb_scope_begin();
    int rank = mt_rank, size = mt_size;
    nb_gpt_config cfg = nb_gpt_config_defaults();
    cfg.vocab_size = 64, cfg.block_size = TT, cfg.n_layer = 2, cfg.n_head = 2, cfg.n_embd = 16;
    nb_generator *g0 = nb_generator_new(3), *g1 = nb_generator_new(3 + (uint64_t)rank);
    nb_generator *g2 = nb_generator_new(3 + (uint64_t)rank);
    nb_module *ref = nb_gpt_new(&cfg, g0), *m = nb_gpt_new(&cfg, g1), *dm = nb_gpt_new(&cfg, g2);
    nb_generator_free(g0);
    nb_generator_free(g1);
    nb_generator_free(g2);
    MT_CHECK(ref && m && dm, "nb_gpt_new: %s", nb_last_error());
    /* SGD, as test_ddp_equivalence_gpt: the key bias of attention has an exactly zero true
     * gradient, whose rounding noise Adam would blow up to steps of size lr. */
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 0.5, so.momentum = 0.9, so.weight_decay = 0.1;
    nb_optim *ro = ref ? nb_sgd_new(nb_parameters(ref), &so) : NULL;
    nb_optim *o = m ? nb_sgd_new(nb_parameters(m), &so) : NULL;
    nb_optim *dop = dm ? nb_sgd_new(nb_parameters(dm), &so) : NULL;
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = stage, zo.bucket_mb = 4e-3;
    nb_zero *z = o ? nb_zero_new(m, o, mt_world, &zo) : NULL;
    nb_ddp_opts ddo = nb_ddp_defaults();
    ddo.bucket_mb = 4e-3;
    nb_ddp *d = dm ? nb_ddp_new(dm, mt_world, &ddo) : NULL;
    MT_CHECK(ro && o && z && d && dop, "setup: %s", nb_last_error());
    int64_t local = GBT / size;
    for (int step = 0; step < K && z && d && ro && o; step++) {
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
        double rn = NAN, zn = NAN, dn = NAN;
        double rl = nb_gpt_train_step(ref, ro, NULL, xs, ys, MICRO, 0.05, &rn);
        double zl = nb_gpt_train_step_zero(m, o, z, xl, yl, MICRO, 0.05, &zn);
        double dl = nb_gpt_train_step(dm, dop, d, xl, yl, MICRO, 0.05, &dn);
        MT_CHECK(!isnan(rl) && !isnan(zl) && !isnan(dl), "step %d: %s", step, nb_last_error());
        MT_CHECK(zn > 0.05, "step %d: norm %g does not exceed the clip threshold", step, zn);
        MT_CHECK(fabs(zn - rn) <= 1e-5 * rn, "stage %d step %d: grad norm %.9g, reference %.9g",
                 stage, step, zn, rn);
        MT_CHECK(fabs(zn - dn) <= 1e-5 * dn, "stage %d step %d: grad norm %.9g, ddp %.9g",
                 stage, step, zn, dn);
        nb_scope_end();
    }
    char what[32];
    snprintf(what, sizeof what, "gpt, stage %d", stage);
    if (z) MT_OK(nb_zero_gather_params(z));
    if (z) mt_expect_same_params(m, ref, 1e-5, what);
    if (z && d) mt_expect_same_params(m, dm, 1e-5, what);
    nb_zero_free(z);
    nb_ddp_free(d);
    nb_optim_free(o);
    nb_optim_free(ro);
    nb_optim_free(dop);
    nb_module_free(m);
    nb_module_free(dm);
    nb_module_free(ref);
    nb_scope_end();
}

/* Stage 3 with a frozen layer (its unit is gathered for forward and backward but gets no
 * gradient) and an evaluation forward without grad mode between the steps. */
START_TEST(test_zero_stage3_frozen_eval) {
    nb_scope_begin();
    nb_module *ref = build_mlp(7, IN, HID, OUT), *m = build_mlp(7, IN, HID, OUT);
    nb_module *mods[2] = {ref, m};
    for (int j = 0; j < 2; j++) {
        nb_module *first = nb_module_child_at(mods[j], 0);
        MT_OK(nb_set_requires_grad(nb_module_param(first, "weight"), false));
        MT_OK(nb_set_requires_grad(nb_module_param(first, "bias"), false));
    }
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 0.1, so.momentum = 0.9;
    nb_optim *ro = nb_sgd_new(nb_parameters(ref), &so), *o = nb_sgd_new(nb_parameters(m), &so);
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = 3, zo.bucket_mb = 0;
    nb_zero *z = o ? nb_zero_new(m, o, mt_world, &zo) : NULL;
    MT_CHECK(ro && z, "setup: %s", nb_last_error());
    int64_t local = GB / mt_size;
    for (int step = 0; step < 4 && z; step++) {
        nb_scope_begin();
        nb_generator *g = nb_generator_new(300 + (uint64_t)step);
        nb_tensor *x = nb_randn((int64_t[]){GB, IN}, 2, NB_F32, g);
        nb_tensor *y = nb_randint((int64_t[]){GB}, 1, NB_I64, 0, OUT, g);
        nb_generator_free(g);
        train(ref, ro, NULL, NULL, x, y, 0, GB, 0);
        train(m, o, NULL, z, x, y, mt_rank * local, local, 0);
        bool prev = nb_set_grad_enabled(false); /* evaluation: same outputs, nothing kept */
        nb_tensor *ey = nb_forward(m, x), *ry = nb_forward(ref, x);
        nb_set_grad_enabled(prev);
        MT_CHECK(ey && ry, "eval forward: %s", nb_last_error());
        if (ey && ry) {
            double *a = mt_values(ey), *b = mt_values(ry);
            for (int64_t i = 0; i < nb_numel(ey); i++)
                if (!(fabs(a[i] - b[i]) <= 1e-5 * (fabs(b[i]) + 1e-3))) {
                    MT_CHECK(false, "step %d eval output %lld: %.9g vs %.9g", step, (long long)i,
                             a[i], b[i]);
                    break;
                }
            free(a);
            free(b);
        }
        nb_zero_memory_info mi;
        MT_OK(nb_zero_memory(z, &mi));
        MT_CHECK(mi.params * mt_size <= 4 * nb_num_parameters(m) + 4 * 64 * mt_size,
                 "step %d: %lld parameter bytes resident after the forwards", step,
                 (long long)mi.params);
        nb_scope_end();
    }
    if (z) MT_OK(nb_zero_gather_params(z));
    if (z) mt_expect_same_params(m, ref, 1e-5, "stage 3, frozen first layer");
    nb_zero_free(z);
    nb_optim_free(o);
    nb_optim_free(ro);
    nb_module_free(m);
    nb_module_free(ref);
    nb_scope_end();
    MT_END();
}
END_TEST

START_TEST(test_zero_equivalence_gpt) {
    check_gpt(1);
    check_gpt(2);
    check_gpt(3);
    MT_END();
}
END_TEST

/* ---- memory: the ZeRO formulas ---------------------------------------------------------------- */
/* Per rank, P parameters, N ranks, f32 Adam: stage 0 16P; 1: 8P + 8P/N; 2: 4P + 12P/N (plus
 * the stated comm buffers). Checked within 5% on a model of ~0.3M parameters, and against the
 * allocator's live bytes (what is really resident). */
static void check_memory(int stage) {
    enum { MIN = 64, MHID = 384, MOUT = 10, MB = 8 };
    nb_scope_begin();
    int rank = mt_rank, size = mt_size;
    nb_alloc_stats before, after;
    nb_alloc_get_stats(&before);
    nb_module *m = build_mlp(11, MIN, MHID, MOUT);
    nb_optim *o = m ? nb_adam_new(nb_parameters(m), NULL) : NULL;
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = stage, zo.bucket_mb = 0.1;
    nb_zero *z = o ? nb_zero_new(m, o, mt_world, &zo) : NULL;
    MT_CHECK(z != NULL, "setup: %s", nb_last_error());
    nb_scope_begin();
    nb_generator *g = nb_generator_new(5);
    nb_tensor *x = nb_randn((int64_t[]){MB, MIN}, 2, NB_F32, g);
    nb_tensor *y = nb_randint((int64_t[]){MB}, 1, NB_I64, 0, MOUT, g);
    nb_generator_free(g);
    if (z) train(m, o, NULL, z, x, y, 0, MB, 0);
    nb_scope_end();
    nb_alloc_get_stats(&after);
    nb_zero_memory_info mi = {0}, plan = {0};
    if (z) MT_OK(nb_zero_memory(z, &mi));
    double P = (double)nb_num_parameters(m), N = size;
    double formula = stage == 0   ? 16 * P
                     : stage == 1 ? 8 * P + 8 * P / N
                     : stage == 2 ? 4 * P + 12 * P / N
                                  : 16 * P / N;
    double model_state = (double)(mi.total - mi.comm_buffers);
    MT_CHECK(fabs(model_state - formula) <= 0.05 * formula,
             "stage %d, %d ranks: model state %.0f bytes, formula %.0f (P = %.0f)", stage, size,
             model_state, formula, P);
    MT_CHECK(mi.total == mi.params + mi.grads + mi.optim_state + mi.comm_buffers, "sum");
    /* stated constant: stage 2 keeps two staging buffers of the largest bucket (<= 0.1 MiB
     * plus one parameter); stage 3 of the largest unit (one Linear: MHID * MHID + MHID) */
    if (stage == 3)
        MT_CHECK(mi.comm_buffers == 2 * (MHID * MHID + MHID) * 4, "comm buffers %lld",
                 (long long)mi.comm_buffers);
    else if (stage == 2)
        MT_CHECK(mi.comm_buffers > 0 && mi.comm_buffers <= 2 * (104858 + MHID * MHID) * 4,
                 "comm buffers %lld", (long long)mi.comm_buffers);
    else
        MT_CHECK(mi.comm_buffers == 0, "comm buffers %lld", (long long)mi.comm_buffers);
    /* What the allocator holds after the step (model, state, buffers of nb_zero) is that,
     * rounded up to the allocator's size classes (steps of a quarter power of two: at most
     * +25% per block), plus small tensors (step counts, views' headers are not counted). */
    double live = (double)(after.bytes_live - before.bytes_live);
    MT_CHECK(live >= (double)mi.total && live <= 1.25 * (double)mi.total + 65536,
             "stage %d, %d ranks: allocator live %.0f bytes, nb_zero_memory %lld", stage, size,
             live, (long long)mi.total);
    /* The planner agrees without building anything. */
    int64_t numel = stage == 3 ? nb_num_parameters(m) : nb_numel(nb_module_flat_params(m));
    MT_OK(nb_zero_memory_plan(numel, 4, 2, size, stage, 0.1, &plan));
    MT_CHECK(fabs((double)(plan.total - plan.comm_buffers) - model_state) <= 0.05 * model_state,
             "plan %lld vs measured %.0f", (long long)(plan.total - plan.comm_buffers),
             model_state);
    if (rank == 0 && getenv("NB_ZERO_VERBOSE"))
        printf("stage %d N %d P %.0f: formula %.0f measured %.0f (params %lld grads %lld state "
               "%lld) comm %lld live %.0f\n", stage, size, P, formula, model_state,
               (long long)mi.params, (long long)mi.grads, (long long)mi.optim_state,
               (long long)mi.comm_buffers, live);
    nb_zero_free(z);
    nb_optim_free(o);
    nb_module_free(m);
    nb_scope_end();
}

START_TEST(test_zero_memory) {
    for (int stage = 0; stage <= 3; stage++) check_memory(stage);
    MT_END();
}
END_TEST

/* ---- errors ----------------------------------------------------------------------------------- */
/* An f16 model under ZeRO-2 with Adam and the loss scaler: the shard's optimizer keeps f32
 * master weights of its pieces (docs/optim.md), so each rank holds 12 bytes of state per
 * shard element (m, v and the master: the ZeRO paper's K = 12); the scaler unscales the
 * shard's gradients and agrees on the inf/NaN flag, so a step where only the last rank's
 * loss is inf is skipped on every rank; the parameters stay identical on every rank, and
 * the loss goes down. */
START_TEST(test_zero_master_weights) {
    nb_scope_begin();
    nb_generator *g = nb_generator_new(3);
    nb_linear_opts lo = nb_linear_defaults();
    lo.dtype = NB_F16;
    lo.gen = g;
    nb_module *m = nb_sequential_new(nb_linear_new(8, 16, &lo), nb_tanh_new(),
                                     nb_linear_new(16, 4, &lo), NULL);
    nb_generator_free(g);
    nb_adam_opts ao = nb_adam_defaults();
    ao.lr = 1e-2;
    nb_optim *o = m ? nb_adam_new(nb_parameters(m), &ao) : NULL;
    nb_zero *z = o ? nb_zero_new(m, o, mt_world, NULL) : NULL;
    MT_CHECK(z != NULL, "zero_new on an f16 model: %s", nb_last_error());
    nb_generator *dg = nb_generator_new(9);
    nb_tensor *x = nb_to_dtype(nb_randn((int64_t[]){32, 8}, 2, NB_F32, dg), NB_F16);
    nb_tensor *y = nb_randint((int64_t[]){32}, 1, NB_I64, 0, 4, dg);
    nb_generator_free(dg);
    int64_t local = 32 / mt_size;
    double first = 0, last = 0;
    nb_grad_scaler *gs = nb_grad_scaler_new(NULL);
    if (z) {
        /* without the communicator the scaler refuses a sharded optimizer */
        nb_scope_begin();
        nb_tensor *l0 = nb_sum(nb_to_dtype(nb_forward(m, x), NB_F32), NULL, 0, false);
        MT_OK(nb_zero_grad(o));
        MT_OK(nb_backward(nb_grad_scaler_scale(gs, l0)));
        MT_EXPECT_ERROR(nb_grad_scaler_step(gs, o), NB_ESTATE, "nb_grad_scaler_set_comm");
        nb_scope_end();
    }
    MT_OK(nb_grad_scaler_set_comm(gs, mt_world));
    for (int s = 0; s < 30 && z; s++) {
        nb_scope_begin();
        nb_tensor *out = nb_to_dtype(nb_forward(m, nb_narrow(x, 0, mt_rank * local, local)), NB_F32);
        nb_tensor *l = nb_cross_entropy(out, nb_narrow(y, 0, mt_rank * local, local), NULL);
        nb_tensor *ls = s == 10 && mt_rank == mt_size - 1 ? nb_mul_scalar(l, INFINITY) : l;
        MT_OK(nb_zero_grad(o));
        MT_OK(nb_backward(nb_grad_scaler_scale(gs, ls)));
        MT_OK(nb_grad_scaler_step(gs, o));
        if (s == 10)
            MT_CHECK(nb_grad_scaler_skipped(gs), "rank %d did not skip the inf step", mt_rank);
        MT_OK(nb_grad_scaler_update(gs));
        double v = l ? nb_item_f64(l) : NAN;
        if (s == 0) first = v;
        last = v;
        nb_scope_end();
    }
    if (z) {
        double fl[2] = {first, last}; /* the mean over the ranks' batches */
        nb_tensor *ft = nb_from_buffer(fl, (int64_t[]){2}, 1, NB_F64);
        MT_OK(nb_allreduce(mt_world, ft, NB_REDUCE_AVG));
        MT_OK(nb_read(ft, fl, 2, NB_F64));
        MT_CHECK(fl[1] < 0.8 * fl[0], "the f16 model did not train under ZeRO: %g -> %g", fl[0],
                 fl[1]);
        double sc[2] = {nb_grad_scaler_get_scale(gs), (double)nb_grad_scaler_num_skipped(gs)};
        nb_tensor *st = nb_from_buffer(sc, (int64_t[]){2}, 1, NB_F64), *sm = nb_clone(st);
        MT_OK(nb_allreduce(mt_world, st, NB_REDUCE_MAX));
        MT_OK(nb_allreduce(mt_world, sm, NB_REDUCE_MIN));
        double hi[2], lw[2];
        MT_OK(nb_read(st, hi, 2, NB_F64));
        MT_OK(nb_read(sm, lw, 2, NB_F64));
        MT_CHECK(hi[0] == lw[0] && hi[1] == lw[1] && lw[1] >= 1,
                 "the ranks' scalers differ: scale %g..%g, skipped %g..%g", lw[0], hi[0], lw[1],
                 hi[1]);
        nb_zero_memory_info mi;
        MT_OK(nb_zero_memory(z, &mi));
        double tot[2] = {(double)mi.optim_state, 0};
        const nb_params *ps = nb_optim_params(nb_zero_optim(z));
        for (int i = 0; i < ps->count; i++) tot[1] += (double)nb_numel(ps->tensors[i]);
        nb_tensor *t = nb_from_buffer(tot, (int64_t[]){2}, 1, NB_F64);
        MT_OK(nb_allreduce(mt_world, t, NB_REDUCE_SUM));
        MT_OK(nb_read(t, tot, 2, NB_F64));
        MT_CHECK(tot[1] == 8 * 16 + 16 + 16 * 4 + 4 && tot[0] == 12 * tot[1],
                 "optimizer state %g bytes for %g shard elements (want 12 per element)", tot[0],
                 tot[1]);
        /* every rank holds the same (all-gathered) f16 parameters */
        const nb_params *mp = nb_parameters(m);
        for (int i = 0; i < mp->count; i++) {
            nb_tensor *a = nb_to_dtype(mp->tensors[i], NB_F64), *b = nb_clone(a);
            MT_OK(nb_allreduce(mt_world, b, NB_REDUCE_MAX));
            double *va = mt_values(a), *vb = mt_values(b);
            for (int64_t j = 0; j < nb_numel(a); j++)
                if (va[j] != vb[j]) {
                    MT_CHECK(false, "%s differs between ranks", mp->names[i]);
                    break;
                }
            free(va);
            free(vb);
        }
    }
    nb_grad_scaler_free(gs);
    nb_zero_free(z);
    nb_optim_free(o);
    nb_module_free(m);
    nb_scope_end();
    MT_END();
}
END_TEST

START_TEST(test_zero_errors) {
    nb_scope_begin();
    nb_module *m = build_mlp(1, IN, HID, OUT), *other = build_mlp(2, IN, HID, OUT);
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 0.1, so.momentum = 0.9;
    nb_optim *o = nb_sgd_new(nb_parameters(m), &so);
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = 5, zo.bucket_mb = 0;
    nb_zero *z = nb_zero_new(m, o, mt_world, &zo);
    MT_CHECK(!z, "stage 5 accepted");
    MT_EXPECT_ERROR(nb_last_status(), NB_EINVAL, "stage must be 0, 1, 2 or 3, got 5");
    nb_zero_opts zo2 = nb_zero_defaults();
    zo2.stage = -1, zo2.bucket_mb = 0;
    z = nb_zero_new(m, o, mt_world, &zo2);
    MT_EXPECT_ERROR(nb_last_status(), NB_EINVAL, "got -1");
    z = nb_zero_new(m, NULL, mt_world, NULL);
    MT_EXPECT_ERROR(nb_last_status(), NB_ENULL, "optimizer is NULL");
    nb_sgd_opts so2 = nb_sgd_defaults();
    so2.lr = 0.1;
    /* an optimizer over tensors that are not the model's parameters cannot be sharded */
    nb_optim *oo = nb_sgd_new(nb_parameters(other), &so2);
    z = nb_zero_new(m, oo, mt_world, NULL);
    MT_CHECK(!z, "foreign optimizer accepted");
    MT_EXPECT_ERROR(nb_last_status(), NB_EINVAL, "is not a parameter of the model");
    nb_sgd_opts so3 = nb_sgd_defaults();
    so3.lr = 0.1, so3.momentum = 0.9;
    /* an optimizer that has state already */
    nb_optim *os = nb_sgd_new(nb_parameters(other), &so3);
    nb_scope_begin();
    nb_tensor *x = nb_ones((int64_t[]){2, IN}, 2, NB_F32);
    nb_tensor *y = nb_zeros((int64_t[]){2}, 1, NB_I64);
    MT_OK(nb_backward(nb_cross_entropy(nb_forward(other, x), y, NULL)));
    MT_OK(nb_step(os));
    nb_scope_end();
    z = nb_zero_new(other, os, mt_world, NULL);
    MT_CHECK(!z, "optimizer with state accepted");
    MT_EXPECT_ERROR(nb_last_status(), NB_ESTATE, "already has state");

    /* a working one: a second wrap is refused; a step on local gradients is refused */
    nb_zero_opts zo3 = nb_zero_defaults();
    zo3.stage = 2, zo3.bucket_mb = 200e-6;
    z = nb_zero_new(m, o, mt_world, &zo3);
    MT_CHECK(z != NULL, "zero_new: %s", nb_last_error());
    nb_zero *z2 = nb_zero_new(m, o, mt_world, NULL);
    MT_CHECK(!z2, "second wrap accepted");
    MT_EXPECT_ERROR(nb_last_status(), NB_ESTATE, "another nb_zero");
    nb_zero_set_sync_enabled(z, false);
    nb_scope_begin();
    x = nb_ones((int64_t[]){2, IN}, 2, NB_F32);
    y = nb_zeros((int64_t[]){2}, 1, NB_I64);
    MT_OK(nb_zero_grad(o));
    MT_OK(nb_backward(nb_cross_entropy(nb_forward(m, x), y, NULL)));
    nb_scope_end();
    MT_EXPECT_ERROR(nb_step(o), NB_ESTATE, "sync disabled");
    nb_zero_set_sync_enabled(z, true);
    MT_OK(nb_zero_sync(z)); /* reduces the accumulated gradients now */
    MT_OK(nb_step(o));
    nb_zero_free(z);
    nb_optim_free(os);
    nb_optim_free(oo);
    nb_optim_free(o);
    nb_module_free(other);
    nb_module_free(m);
    nb_scope_end();
    MT_END();
}
END_TEST


/* ---- checkpoints (the sharded and resharding tests: test_dcp.c) ------------------------------ */
/* ---- optimizer offload ------------------------------------------------------------------------ */
#define GUARD ((nb_device){NB_DEVICE_GUARD, 0})

/* Every parameter of a (any device) equals b's (CPU) bit for bit. */
static void expect_bitwise(nb_module *a, nb_module *b, const char *what) {
    const nb_params *pa = nb_parameters(a), *pb = nb_parameters(b);
    if (!pa || !pb || pa->count != pb->count) {
        MT_CHECK(false, "%s: parameter lists differ", what);
        return;
    }
    for (int i = 0; i < pa->count; i++) {
        nb_scope_begin();
        nb_tensor *ha = nb_to_device(pa->tensors[i], NB_CPU);
        MT_CHECK(ha && nb_tensor_device(pb->tensors[i]).type == NB_DEVICE_CPU, "%s: to host: %s",
                 what, nb_last_error());
        size_t n = ha ? (size_t)nb_numel(ha) * nb_dtype_size(nb_tensor_dtype(ha)) : 0;
        if (ha && memcmp(nb_data(ha), nb_data(pb->tensors[i]), n) != 0)
            MT_CHECK(false, "%s: %s differs from the reference", what, pa->names[i]);
        nb_scope_end();
    }
}

/* One step of the MLP on rank r's slice of global batch `step`, on dev. */
static void dev_train(nb_module *m, nb_optim *o, nb_sched *s, nb_device dev, int step) {
    nb_scope_begin();
    nb_generator *g = nb_generator_new(100 + (uint64_t)step);
    nb_tensor *x = nb_randn((int64_t[]){GB, IN}, 2, NB_F32, g);
    nb_tensor *y = nb_randint((int64_t[]){GB}, 1, NB_I64, 0, OUT, g);
    nb_generator_free(g);
    train(m, o, s, NULL, nb_to_device(x, dev), nb_to_device(y, dev), mt_rank * (GB / mt_size),
          GB / mt_size, 0);
    nb_scope_end();
}

/* ZeRO-Offload: a model on the guard device (memory the host cannot read outside kernels)
 * with offload_optimizer gives, bit for bit, the weights of the same model on the CPU
 * without offload, at stages 1-3, with SGD (momentum) and AdamW (groups, a schedule); the
 * shard's optimizer, its parameters and its state are on the host; nb_zero_memory puts the
 * state and the host copies under host_bytes. On the CPU the option changes nothing. */
START_TEST(test_zero_offload) {
    enum { K = 4 };
    const opt_kind kinds[] = {SGD_MOMENTUM, ADAMW_GROUPS};
    for (int stage = 1; stage <= 3; stage++)
        for (int ki = 0; ki < 2; ki++) {
            nb_scope_begin();
            char what[96];
            snprintf(what, sizeof what, "offload, stage %d, %s", stage, opt_names[kinds[ki]]);
            nb_sched *rs, *gs;
            nb_module *ref = build_mlp(7, IN, HID, OUT), *gm = build_mlp(7, IN, HID, OUT);
            MT_OK(nb_module_to(gm, GUARD));
            nb_optim *ro = make_opt(ref, kinds[ki], &rs), *go = make_opt(gm, kinds[ki], &gs);
            nb_zero_opts zo = nb_zero_defaults();
            zo.stage = stage, zo.bucket_mb = 0.0005, zo.offload_optimizer = true;
            nb_zero *zr = nb_zero_new(ref, ro, mt_world, &zo); /* CPU: offload does nothing */
            nb_zero *zg = nb_zero_new(gm, go, mt_world, &zo);
            MT_CHECK(zr && zg, "%s: setup: %s", what, nb_last_error());
            MT_CHECK(!zr || nb_zero_num_buckets(zr) > 1, "%s: one bucket only", what);
            for (int step = 0; step < K && zr && zg; step++) {
                dev_train(ref, ro, rs, NB_CPU, step);
                dev_train(gm, go, gs, GUARD, step);
            }
            if (zr && zg) {
                const nb_params *st = nb_optim_state(nb_zero_optim(zg));
                const nb_params *pp = nb_optim_params(nb_zero_optim(zg));
                MT_CHECK(st && pp, "%s: state: %s", what, nb_last_error());
                int64_t shard = 0;
                for (int i = 0; pp && i < pp->count; i++) {
                    shard += nb_numel(pp->tensors[i]);
                    MT_CHECK(nb_tensor_device(pp->tensors[i]).type == NB_DEVICE_CPU,
                             "%s: shard piece %s not on the host", what, pp->names[i]);
                }
                int nstate = 0;
                for (int i = 0; st && i < st->count; i++)
                    if (nb_ndim(st->tensors[i]) > 0) {
                        nstate++;
                        MT_CHECK(nb_tensor_device(st->tensors[i]).type == NB_DEVICE_CPU,
                                 "%s: state %s is not on the host", what, st->names[i]);
                    }
                MT_CHECK(pp->count == 0 || nstate > 0, "%s: no optimizer state", what);
                nb_zero_memory_info mg, mr;
                MT_OK(nb_zero_memory(zg, &mg));
                MT_OK(nb_zero_memory(zr, &mr));
                MT_CHECK(mg.host_buffers >= 2 * shard * 4 && mg.host_bytes ==
                         mg.optim_state + mg.host_buffers && mg.optim_state > 0 &&
                         mg.device_bytes == mg.params + mg.grads + mg.comm_buffers &&
                         mg.total == mg.device_bytes + mg.host_bytes,
                         "%s: memory: host %lld (state %lld, buffers %lld), device %lld, "
                         "total %lld", what, (long long)mg.host_bytes, (long long)mg.optim_state,
                         (long long)mg.host_buffers, (long long)mg.device_bytes,
                         (long long)mg.total);
                MT_CHECK(mr.host_buffers == 0 && mr.host_bytes == 0 &&
                         mr.device_bytes == mr.total && mr.optim_state == mg.optim_state,
                         "%s: a CPU model with offload_optimizer: host %lld, buffers %lld",
                         what, (long long)mr.host_bytes, (long long)mr.host_buffers);
                MT_OK(nb_zero_gather_params(zr));
                MT_OK(nb_zero_gather_params(zg));
                expect_bitwise(gm, ref, what);
            }
            nb_zero_free(zr);
            nb_zero_free(zg);
            nb_sched_free(rs);
            nb_sched_free(gs);
            nb_optim_free(ro);
            nb_optim_free(go);
            nb_module_free(ref);
            nb_module_free(gm);
            nb_scope_end();
        }
    /* stage 0 has no shard optimizer to offload */
    nb_module *m = build_mlp(1, IN, HID, OUT);
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 0.1;
    nb_optim *o = nb_sgd_new(nb_parameters(m), &so);
    nb_zero_opts zo2 = nb_zero_defaults();
    zo2.offload_optimizer = true, zo2.stage = 0, zo2.bucket_mb = 0;
    nb_zero *z = nb_zero_new(m, o, mt_world, &zo2);
    MT_CHECK(!z, "offload at stage 0 accepted");
    MT_EXPECT_ERROR(nb_last_status(), NB_EINVAL, "offload_optimizer needs stage 1, 2 or 3");
    nb_optim_free(o);
    nb_module_free(m);
    MT_END();
}
END_TEST

/* Checkpoints with offload: a guard-device model saved after CK_A steps and resumed into
 * another (offloaded) one continues bit for bit as the straight run, stages 1-3, AdamW
 * with groups and a schedule (the host state and f32 step counts round-trip). */
START_TEST(test_zero_offload_resume) {
    enum { A = 3, B = 3 };
    for (int stage = 1; stage <= 3; stage++) {
        nb_scope_begin();
        char tmp[64], dir[96], what[64];
        mt_tmpdir(tmp, "nb-zero-ckpt");
        snprintf(dir, sizeof dir, "%s/o.ckpt", tmp);
        snprintf(what, sizeof what, "offload resume, stage %d", stage);
        nb_sched *s1, *s2, *s3;
        nb_module *m1 = build_mlp(7, IN, HID, OUT), *m2 = build_mlp(99, IN, HID, OUT);
        nb_module *ref = build_mlp(7, IN, HID, OUT);
        MT_OK(nb_module_to(m1, GUARD));
        MT_OK(nb_module_to(m2, GUARD));
        nb_optim *o1 = make_opt(m1, ADAMW_GROUPS, &s1), *o2 = make_opt(m2, ADAMW_GROUPS, &s2);
        nb_optim *o3 = make_opt(ref, ADAMW_GROUPS, &s3);
        nb_zero_opts zo = nb_zero_defaults();
        zo.stage = stage, zo.bucket_mb = 0.0005, zo.offload_optimizer = true;
        nb_zero *z1 = nb_zero_new(m1, o1, mt_world, &zo), *z2 = nb_zero_new(m2, o2, mt_world, &zo);
        zo.offload_optimizer = false;
        nb_zero *z3 = nb_zero_new(ref, o3, mt_world, &zo);
        MT_CHECK(z1 && z2 && z3, "%s: setup: %s", what, nb_last_error());
        for (int i = 0; z1 && z3 && i < A; i++) {
            dev_train(m1, o1, s1, GUARD, i);
            dev_train(ref, o3, s3, NB_CPU, i);
        }
        nb_checkpoint ck = {.model = m1, .optim = o1, .sched = s1, .step = A, .program = "test"};
        if (z1) MT_OK(nb_checkpoint_save(dir, &ck));
        nb_checkpoint ck2 = {.model = m2, .optim = o2, .sched = s2, .program = "test"};
        if (z2) MT_OK(nb_checkpoint_load(dir, &ck2));
        MT_CHECK(ck2.step == A, "%s: resumed at step %lld", what, (long long)ck2.step);
        for (int i = 0; z1 && z2 && z3 && i < B; i++) {
            dev_train(m1, o1, s1, GUARD, A + i);
            dev_train(m2, o2, s2, GUARD, A + i);
            dev_train(ref, o3, s3, NB_CPU, A + i);
        }
        if (z1 && z2 && z3) {
            MT_OK(nb_zero_gather_params(z1));
            MT_OK(nb_zero_gather_params(z2));
            MT_OK(nb_zero_gather_params(z3));
            expect_bitwise(m2, ref, what);
            expect_bitwise(m1, ref, what);
        }
        nb_zero_free(z1);
        nb_zero_free(z2);
        nb_zero_free(z3);
        nb_sched_free(s1);
        nb_sched_free(s2);
        nb_sched_free(s3);
        nb_optim_free(o1);
        nb_optim_free(o2);
        nb_optim_free(o3);
        nb_module_free(m1);
        nb_module_free(m2);
        nb_module_free(ref);
        MT_OK(nb_barrier(mt_world));
        if (mt_rank == 0) mt_rmtree(tmp);
        nb_scope_end();
    }
    MT_END();
}
END_TEST

/* Memory with bf16 parameters and Adam (f32 m, v and master weights: 12 bytes of state per
 * shard element), per rank, N ranks, P parameters: stage 1 4P + 12P/N, stage 2 2P + 14P/N,
 * stage 3 16P/N (stage 0 16P), within 5%, plus the stated constant buffers (comm_buffers:
 * stages 2 and 3 two bf16 staging buffers of the largest bucket or unit). The planner
 * (elem_size 2) agrees. With offload_optimizer on the guard device, the 12P/N of state moves
 * to host_bytes together with the host copies of the shard (4P/N), and device_bytes keeps the
 * parameters, gradients and staging buffers. */
enum { HMIN = 64, HHID = 384, HOUT = 10, HMB = 8 };

static nb_module *build_bf16_mlp(nb_device dev) {
    nb_generator *g = nb_generator_new(11);
    nb_linear_opts lo = nb_linear_defaults();
    lo.dtype = NB_BF16;
    lo.gen = g;
    nb_module *m = nb_sequential_new(nb_linear_new(HMIN, HHID, &lo), nb_relu_new(),
                                     nb_linear_new(HHID, HHID, &lo), nb_tanh_new(),
                                     nb_linear_new(HHID, HOUT, &lo), NULL);
    nb_generator_free(g);
    if (m && dev.type != NB_DEVICE_CPU) MT_OK(nb_module_to(m, dev));
    return m;
}

/* One Adam step of a bf16 model on dev (every rank the same batch; the gradient is the
 * average anyway). */
static void bf16_step(nb_module *m, nb_optim *o, nb_device dev, int step) {
    nb_scope_begin();
    nb_generator *dg = nb_generator_new(5 + (uint64_t)step);
    nb_tensor *x = nb_to_dtype(nb_randn((int64_t[]){HMB, HMIN}, 2, NB_F32, dg), NB_BF16);
    nb_tensor *y = nb_randint((int64_t[]){HMB}, 1, NB_I64, 0, HOUT, dg);
    nb_generator_free(dg);
    nb_tensor *out = nb_to_dtype(nb_forward(m, nb_to_device(x, dev)), NB_F32);
    MT_OK(nb_zero_grad(o));
    MT_OK(nb_backward(nb_cross_entropy(out, nb_to_device(y, dev), NULL)));
    MT_OK(nb_step(o));
    nb_scope_end();
}

static void check_memory_half(int stage, bool offload) {
    enum { MHID = HHID };
    nb_scope_begin();
    nb_device dev = offload ? GUARD : NB_CPU;
    nb_module *m = build_bf16_mlp(dev);
    nb_optim *o = m ? nb_adam_new(nb_parameters(m), NULL) : NULL;
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = stage, zo.bucket_mb = 0.1, zo.offload_optimizer = offload;
    nb_zero *z = o ? nb_zero_new(m, o, mt_world, &zo) : NULL;
    MT_CHECK(z != NULL, "setup: %s", nb_last_error());
    if (z) bf16_step(m, o, dev, 0);
    nb_zero_memory_info mi = {0}, plan = {0};
    if (z) MT_OK(nb_zero_memory(z, &mi));
    double P = (double)nb_num_parameters(m), N = mt_size;
    double formula = stage == 0   ? 16 * P
                     : stage == 1 ? 4 * P + 12 * P / N
                     : stage == 2 ? 2 * P + 14 * P / N
                                  : 16 * P / N;
    double model_state = (double)(mi.total - mi.comm_buffers - mi.host_buffers);
    MT_CHECK(fabs(model_state - formula) <= 0.05 * formula,
             "bf16, stage %d, %d ranks%s: model state %.0f bytes, formula %.0f (P = %.0f; params "
             "%lld grads %lld state %lld)", stage, mt_size, offload ? ", offload" : "",
             model_state, formula, P, (long long)mi.params, (long long)mi.grads,
             (long long)mi.optim_state);
    double state = stage == 0 ? 12 * P : 12 * P / N; /* stage 0 is plain DDP */
    MT_CHECK(fabs((double)mi.optim_state - state) <= 0.05 * state,
             "bf16, stage %d: optimizer state %lld, want %.0f", stage, (long long)mi.optim_state,
             state);
    if (stage >= 2) /* the stated constant: two bf16 staging buffers of the largest bucket */
        MT_CHECK(mi.comm_buffers > 0 && mi.comm_buffers <= 2 * (52429 + MHID * MHID + MHID) * 2,
                 "comm buffers %lld", (long long)mi.comm_buffers);
    if (offload) {
        double host = 12 * P / N + 4 * P / N;
        MT_CHECK(fabs((double)mi.host_bytes - host) <= 0.05 * host &&
                 fabs((double)(mi.device_bytes - mi.comm_buffers) - (formula - 12 * P / N)) <=
                     0.05 * formula,
                 "bf16 offload, stage %d, %d ranks: host %lld (want %.0f), device %lld",
                 stage, mt_size, (long long)mi.host_bytes, host, (long long)mi.device_bytes);
    }
    int64_t numel = stage == 3 ? nb_num_parameters(m) : nb_numel(nb_module_flat_params(m));
    MT_OK(nb_zero_memory_plan(numel, 2, 2, mt_size, stage, 0.1, &plan));
    MT_CHECK(fabs((double)(plan.total - plan.comm_buffers) - formula) <= 0.05 * formula,
             "bf16, stage %d: plan %lld (state %lld) vs formula %.0f", stage,
             (long long)(plan.total - plan.comm_buffers), (long long)plan.optim_state, formula);
    if (mt_rank == 0 && getenv("NB_ZERO_VERBOSE"))
        printf("bf16 stage %d N %d%s P %.0f: formula %.0f measured %.0f (params %lld grads %lld "
               "state %lld) comm %lld host %lld device %lld plan %lld\n", stage, mt_size,
               offload ? " offload" : "", P, formula, model_state, (long long)mi.params,
               (long long)mi.grads, (long long)mi.optim_state, (long long)mi.comm_buffers,
               (long long)mi.host_bytes, (long long)mi.device_bytes,
               (long long)(plan.total - plan.comm_buffers));
    nb_zero_free(z);
    nb_optim_free(o);
    nb_module_free(m);
    nb_scope_end();
}

/* bf16 parameters with offload: the host optimizer's f32 masters give, bit for bit, the
 * weights of the same model on the CPU without offload (three Adam steps, stages 1-3). */
static void check_offload_half(int stage) {
    nb_scope_begin();
    nb_module *gm = build_bf16_mlp(GUARD), *ref = build_bf16_mlp(NB_CPU);
    nb_optim *go = gm ? nb_adam_new(nb_parameters(gm), NULL) : NULL;
    nb_optim *ro = ref ? nb_adam_new(nb_parameters(ref), NULL) : NULL;
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = stage, zo.bucket_mb = 0.1, zo.offload_optimizer = true;
    nb_zero *zg = go ? nb_zero_new(gm, go, mt_world, &zo) : NULL;
    zo.offload_optimizer = false;
    nb_zero *zr = ro ? nb_zero_new(ref, ro, mt_world, &zo) : NULL;
    MT_CHECK(zg && zr, "bf16 offload, stage %d: setup: %s", stage, nb_last_error());
    for (int step = 0; step < 3 && zg && zr; step++) {
        bf16_step(gm, go, GUARD, step);
        bf16_step(ref, ro, NB_CPU, step);
    }
    if (zg && zr) {
        MT_OK(nb_zero_gather_params(zg));
        MT_OK(nb_zero_gather_params(zr));
        char what[64];
        snprintf(what, sizeof what, "bf16 offload, stage %d", stage);
        expect_bitwise(gm, ref, what);
    }
    nb_zero_free(zg);
    nb_zero_free(zr);
    nb_optim_free(go);
    nb_optim_free(ro);
    nb_module_free(gm);
    nb_module_free(ref);
    nb_scope_end();
}

START_TEST(test_zero_memory_half) {
    for (int stage = 0; stage <= 3; stage++) check_memory_half(stage, false);
    for (int stage = 1; stage <= 3; stage++) check_memory_half(stage, true);
    for (int stage = 1; stage <= 3; stage++) check_offload_half(stage);
    MT_END();
}
END_TEST

Suite *mt_suite_zero(void) {
    Suite *s = suite_create("zero");
    TCase *tc = tcase_create("zero");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_zero_equivalence_mlp);
    tcase_add_test(tc, test_zero_equivalence_gpt);
    tcase_add_test(tc, test_zero_stage3_frozen_eval);
    tcase_add_test(tc, test_zero_memory);
    tcase_add_test(tc, test_zero_master_weights);
    tcase_add_test(tc, test_zero_errors);
    tcase_add_test(tc, test_zero_offload);
    tcase_add_test(tc, test_zero_offload_resume);
    tcase_add_test(tc, test_zero_memory_half);
    tcase_add_test(tc, test_zero_compressed);
    suite_add_tcase(s, tc);
    return s;
}
