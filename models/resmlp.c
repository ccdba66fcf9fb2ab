/* resmlp.c - "make your own model parallel" (docs/distributed.md): a small residual MLP over
 * sequences, written once from nn layers with no knowledge of parallelism, then made data
 * parallel (DDP or ZeRO 1-3), tensor + sequence parallel (a plan), pipeline parallel (a split)
 * and any mix of them. The parallel-specific code is the block between the two rules below.
 * tools/check-own-model runs it in every layout under mpirun and compares the losses and the
 * first gradient norm with one process.
 *
 *     resmlp [--tp N] [--pp N] [--sp] [--zero S] [--schedule gpipe|1f1b|interleaved]
 *            [--virtual-stages V] [--micro M] [--steps K]
 * Under `mpirun -np W` the data-parallel size is W / (tp pp). The last line is one JSON object
 * with the losses and the first step's gradient norm. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nabla/nabla.h>

enum { IN = 24, WIDTH = 32, CLASSES = 16, LAYERS = 3, B = 8, T = 8 };

/* ---- the model: nn layers and two forwards ------------------------------------------------- */
static nb_tensor *block_forward(nb_module *m, nb_tensor *x) {
    nb_tensor *h = nb_forward(nb_module_child(m, "ln"), x);
    h = nb_gelu(nb_forward(nb_module_child(m, "fc1"), h));
    return nb_add(x, nb_forward(nb_module_child(m, "fc2"), h)); /* the residual */
}

static nb_tensor *model_forward(nb_module *m, nb_tensor *x) { /* (B, T, IN) -> (B, T, CLASSES) */
    x = nb_forward(nb_module_child(m, "proj_in"), x);
    nb_module *blocks = nb_module_child(m, "blocks");
    for (int i = 0; i < nb_module_num_children(blocks) && x; i++)
        x = nb_forward(nb_module_child_at(blocks, i), x);
    return nb_forward(nb_module_child(m, "head"), nb_forward(nb_module_child(m, "ln_f"), x));
}

static const nb_module_vtable block_vt = {.type_name = "Residual", .forward = block_forward};
static const nb_module_vtable model_vt = {.type_name = "ResMLP", .forward = model_forward};

static nb_module *model_new(uint64_t seed) {
    nb_generator *g = nb_generator_new(seed);
    nb_linear_opts lo = nb_linear_defaults();
    lo.gen = g;
    nb_module *m = nb_module_new(&model_vt, NULL);
    nb_module_add_child(m, "proj_in", nb_linear_new(IN, WIDTH, &lo));
    nb_module *blocks = nb_module_add_child(m, "blocks", nb_module_list_new(NULL, 0));
    for (int i = 0; i < LAYERS; i++) {
        nb_module *b = nb_module_new(&block_vt, NULL);
        nb_module_add_child(b, "ln", nb_layer_norm_new(WIDTH, NULL));
        nb_module_add_child(b, "fc1", nb_linear_new(WIDTH, 4 * WIDTH, &lo));
        nb_module_add_child(b, "fc2", nb_linear_new(4 * WIDTH, WIDTH, &lo));
        nb_module_list_append(blocks, b);
    }
    nb_module_add_child(m, "ln_f", nb_layer_norm_new(WIDTH, NULL));
    nb_module_add_child(m, "head", nb_linear_new(WIDTH, CLASSES, &lo));
    nb_generator_free(g);
    return nb_module_find(m, "head.weight") ? m : NULL;
}

static nb_tensor *loss_fn(nb_tensor *logits, nb_tensor *y, void *ctx) { /* per token */
    (void)ctx;
    return nb_cross_entropy(nb_view(logits, (int64_t[]){-1, nb_size(logits, -1)}, 2),
                            nb_reshape(y, (int64_t[]){-1}, 1), NULL);
}

/* ---- the run ---------------------------------------------------------------------------------- */
typedef struct opts {
    int tp, pp, zero, virtual_stages, micro, steps;
    bool sp;
    nb_pipe_schedule schedule;
} opts;

static int usage(const char *why) {
    fprintf(stderr, "resmlp: %s\nusage: resmlp [--tp N] [--pp N] [--sp] [--zero S] [--schedule "
            "gpipe|1f1b|interleaved] [--virtual-stages V] [--micro M] [--steps K]\n", why);
    return 2;
}

int main(int argc, char **argv) {
    opts o = {.tp = 1, .pp = 1, .virtual_stages = 1, .micro = 4, .steps = 3,
              .schedule = NB_PIPE_1F1B};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--sp")) {
            o.sp = true;
            continue;
        }
        if (!v) return usage("a flag needs a value");
        i++;
        if (!strcmp(f, "--tp")) o.tp = atoi(v);
        else if (!strcmp(f, "--pp")) o.pp = atoi(v);
        else if (!strcmp(f, "--zero")) o.zero = atoi(v);
        else if (!strcmp(f, "--virtual-stages")) o.virtual_stages = atoi(v);
        else if (!strcmp(f, "--micro")) o.micro = atoi(v);
        else if (!strcmp(f, "--steps")) o.steps = atoi(v);
        else if (!strcmp(f, "--schedule")) {
            if (nb_pipe_schedule_parse(v, &o.schedule) != NB_OK) return usage(nb_last_error());
        } else return usage("unknown flag");
    }
    nb_comm *world = nb_comm_world();
    nb_module *model = model_new(1);
    int rc = 1;

    /* ======== the parallel-specific code ===================================================== */
    nb_mesh *mesh = nb_mesh_new(world, "dp pp tp", (int[]){-1, o.pp, o.tp});
    static const nb_tp_rule plan[] = {
        {"proj_in", NB_TP_ROWWISE},      {"blocks.*.ln", NB_TP_SEQUENCE},
        {"blocks.*.fc1", NB_TP_COLWISE}, {"blocks.*.fc2", NB_TP_ROWWISE},
        {"ln_f", NB_TP_SEQUENCE},        {"head", NB_TP_COLWISE}, {0}};
    nb_parallelize_opts po = nb_parallelize_defaults();
    po.sequence_parallel = o.sp;
    static const nb_pipe_layer layers[] = {{"proj_in"}, {"blocks.*"}, {"ln_f"}, {"head"}};
    nb_pipeline_opts pio = nb_pipeline_defaults();
    pio.schedule = o.schedule, pio.virtual_stages = o.virtual_stages, pio.n_micro = o.micro;
    pio.loss = loss_fn;
    nb_pipeline *pipe = NULL;
    if (mesh && nb_parallelize(model, mesh, plan, &po) == NB_OK && o.pp > 1)
        pipe = nb_pipeline_new(model, mesh, layers, 4, &pio);
    nb_module *mine = pipe ? nb_pipeline_module(pipe) : model; /* this rank's part */
    nb_comm *dp = mesh ? nb_mesh_group(mesh, "dp") : NULL;
    nb_optim *opt = (o.pp == 1 || pipe) ? nb_adam_new(nb_parameters(mine), NULL) : NULL;
    nb_zero_opts zo = nb_zero_defaults();
    zo.stage = o.zero;
    nb_ddp *ddp = opt && !o.zero && nb_comm_size(world) > 1 ? nb_ddp_new(mine, dp, NULL) : NULL;
    nb_zero *z = opt && o.zero ? nb_zero_new(mine, opt, dp, &zo) : NULL;
    const int rows = B / (dp ? nb_comm_size(dp) : 1), first = rows * (dp ? nb_comm_rank(dp) : 0);
    /* ========================================================================================== */

    if (!opt || (nb_comm_size(world) > 1 && !ddp && !z)) {
        fprintf(stderr, "resmlp: %s\n", nb_last_error());
        goto done;
    }
    double losses[64], norm0 = NAN;
    for (int s = 0; s < o.steps && s < 64; s++) {
        nb_scope_begin();
        nb_generator *g = nb_generator_new(100 + (uint64_t)s); /* the same global batch everywhere */
        nb_tensor *x = nb_narrow(nb_randn((int64_t[]){B, T, IN}, 3, NB_F32, g), 0, first, rows);
        nb_tensor *y = nb_narrow(nb_randint((int64_t[]){B, T}, 2, NB_I64, 0, CLASSES, g), 0, first, rows);
        nb_generator_free(g);
        nb_zero_grad(opt);
        double loss;
        if (pipe) {
            loss = nb_pipeline_step(pipe, x, y, NULL);
        } else {
            nb_tensor *l = loss_fn(nb_forward(model, x), y, NULL);
            loss = l && nb_backward(l) == NB_OK ? nb_item_f64(l) : NAN;
            loss = nb_mean_over_ranks(dp, loss);
        }
        double norm = nb_clip_grad_norm(nb_optim_params(opt), INFINITY, 2);
        if (s == 0) norm0 = norm;
        nb_status st = isnan(loss) || norm < 0 ? nb_last_status() : nb_step(opt);
        nb_scope_end();
        if (st != NB_OK) {
            fprintf(stderr, "resmlp: step %d: %s\n", s, nb_last_error());
            goto done;
        }
        losses[s] = loss;
    }
    if (nb_comm_rank(world) == 0) {
        printf("{\"layout\": \"%s\", \"losses\": [", nb_mesh_describe(mesh));
        for (int s = 0; s < o.steps; s++) printf("%s%.9g", s ? ", " : "", losses[s]);
        printf("], \"grad_norm0\": %.9g}\n", norm0);
    }
    rc = 0;
done:
    nb_zero_free(z);
    nb_ddp_free(ddp);
    nb_optim_free(opt);
    nb_pipeline_free(pipe);
    nb_module_free(model);
    nb_mesh_free(mesh);
    nb_comm_free(world);
    return rc;
}
