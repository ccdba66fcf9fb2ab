/* dcp_layouts.c - the layouts of dcp_layouts.h: one small model made data parallel, ZeRO
 * 1-3, tensor parallel by plan (with and without a fused layer in blocks), and with flat
 * shards set by hand through placements (the contract ZeRO's reducer fills in: the piece's
 * placement is its parameter's plus {NB_PLACE_SHARD, "dp", NB_PLACE_FLAT, offset, length}). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcp_layouts.h"

enum { IN = 8, HID = 16, OUT = 4, GB = 16 };

const char *const dcp_layout_names[L_COUNT] = {
    "one process", "ddp", "zero-1", "zero-2", "zero-3", "zero-3 on half the ranks",
    "tp", "tp with blocks", "flat shards by placement", "tp + flat shards by placement"};

bool dcp_layout_trains(dcp_kind_t k) { return k != L_TPB && k != L_FLAT && k != L_TPFLAT; }

static nb_module *build_mlp(uint64_t seed) {
    nb_generator *g = nb_generator_new(seed);
    nb_linear_opts o = nb_linear_defaults();
    o.gen = g;
    nb_module *m = nb_sequential_new(nb_linear_new(IN, HID, &o), nb_gelu_new(false),
                                     nb_linear_new(HID, HID, &o), nb_linear_new(HID, OUT, &o),
                                     NULL);
    nb_generator_free(g);
    MT_CHECK(m != NULL, "building the model: %s", nb_last_error());
    return m;
}

/* AdamW over (names, tensors): weights (whole ndim >= 2) with decay, the rest without. */
static nb_optim *adamw(int n, const char **names, nb_tensor **ts, const bool *decay) {
    nb_tensor **a = calloc((size_t)n + 1, sizeof *a), **b = calloc((size_t)n + 1, sizeof *b);
    const char **an = calloc((size_t)n + 1, sizeof *an), **bn = calloc((size_t)n + 1, sizeof *bn);
    nb_params d = {.tensors = a, .names = an}, nd = {.tensors = b, .names = bn};
    for (int i = 0; i < n; i++) {
        nb_params *p = decay[i] ? &d : &nd;
        p->tensors[p->count] = ts[i], p->names[p->count++] = names[i];
    }
    nb_adamw_opts ao = nb_adamw_defaults();
    ao.lr = 1e-2;
    ao.weight_decay = 0.1;
    nb_optim *o = nb_adamw_new(&d, &ao);
    nb_group_opts go = nb_group_defaults();
    go.weight_decay = 0;
    if (o && nd.count && nb_optim_add_group(o, &nd, &go) < 0) {
        nb_optim_free(o);
        o = NULL;
    }
    MT_CHECK(o != NULL, "adamw: %s", nb_last_error());
    free(a), free(b), free(an), free(bn);
    return o;
}

static nb_sched *cosine(nb_optim *o) {
    nb_sched_opts so = nb_sched_defaults(NB_SCHED_COSINE);
    so.warmup_steps = 2;
    so.total_steps = 40;
    so.min_lr = 1e-3;
    nb_sched *s = o ? nb_sched_new(o, &so) : NULL;
    MT_CHECK(s != NULL, "sched: %s", nb_last_error());
    return s;
}

static nb_optim *model_adamw(nb_module *m) {
    const nb_params *ps = nb_parameters(m);
    bool *decay = calloc((size_t)ps->count + 1, sizeof *decay);
    for (int i = 0; i < ps->count; i++) {
        nb_placement p;
        MT_OK(nb_tensor_placement(ps->tensors[i], &p));
        decay[i] = p.ndim >= 2;
    }
    nb_optim *o = adamw(ps->count, ps->names, ps->tensors, decay);
    free(decay);
    return o;
}

/* The optimizer over this rank's flat pieces (its range of each parameter's local values,
 * over the mesh's dp dimension), each placed as its parameter plus the flat shard. */
static nb_optim *piece_adamw(nb_module *m, nb_mesh *mesh) {
    const nb_params *ps = nb_parameters(m);
    int dp = nb_mesh_size(mesh, "dp"), r = nb_mesh_rank(mesh, "dp"), n = 0;
    nb_tensor **pieces = calloc((size_t)ps->count + 1, sizeof *pieces);
    const char **names = calloc((size_t)ps->count + 1, sizeof *names);
    bool *decay = calloc((size_t)ps->count + 1, sizeof *decay);
    for (int i = 0; i < ps->count; i++) {
        nb_placement p;
        MT_OK(nb_tensor_placement(ps->tensors[i], &p));
        if (!p.mesh) { /* a replicated parameter of the mesh */
            p.mesh = mesh;
            MT_OK(nb_tensor_set_placement(ps->tensors[i], &p));
        }
        int64_t numel = nb_numel(ps->tensors[i]), lo, hi;
        nb_comm_chunk(numel, dp, r, &lo, &hi);
        if (lo >= hi) continue;
        nb_scope_begin();
        nb_tensor *flat = nb_reshape(ps->tensors[i], &numel, 1);
        nb_tensor *piece = nb_tensor_retain(nb_clone(nb_narrow(flat, 0, lo, hi - lo)));
        nb_scope_end();
        /* the flat entry first (as nb_tensor_set_placement expects), then the parameter's */
        for (int k = p.n; k > 0; k--) p.places[k] = p.places[k - 1];
        p.n++;
        p.places[0] = (nb_place){.kind = NB_PLACE_SHARD, .mesh_dim = "dp",
                                 .dim = NB_PLACE_FLAT, .blocks = 1, .offset = lo,
                                 .length = hi - lo};
        MT_OK(nb_tensor_set_placement(piece, &p));
        decay[n] = p.ndim >= 2;
        names[n] = ps->names[i];
        pieces[n++] = piece;
    }
    nb_optim *o = adamw(n, names, pieces, decay);
    for (int i = 0; i < n; i++) nb_tensor_free(pieces[i]); /* the optimizer holds them */
    free(pieces), free(names), free(decay);
    return o;
}

static const nb_tp_rule tp_plan[] = {
    {"0", NB_TP_COLWISE}, {"2", NB_TP_ROWWISE}, {"3", NB_TP_COLWISE}, {0}};
static const nb_tp_rule tpb_plan[] = {
    {"0", NB_TP_COLWISE_FUSED(2)}, {"3", NB_TP_COLWISE}, {0}};

void dcp_layout_build(dcp_layout *l, dcp_kind_t k, uint64_t seed) {
    memset(l, 0, sizeof *l);
    l->k = k;
    bool half = k == L_Z3H;
    int nh = mt_size > 1 ? mt_size / 2 : 1;
    if (half) { /* collective over the world */
        l->comm = nb_comm_split(mt_world, mt_rank < nh ? 0 : 1, mt_rank);
        MT_CHECK(l->comm != NULL, "split: %s", nb_last_error());
    }
    l->active = k == L_ONE ? mt_rank == 0 : half ? mt_rank < nh : true;
    if (k == L_TP || k == L_TPB || k == L_FLAT || k == L_TPFLAT) {
        int tp = k == L_FLAT ? 1 : mt_size % 2 == 0 ? 2 : 1;
        l->mesh = nb_mesh_new(mt_world, "dp tp", (int[]){-1, tp});
        MT_CHECK(l->mesh != NULL, "mesh: %s", nb_last_error());
    }
    if (!l->active) {
        if (l->comm) nb_comm_free(l->comm), l->comm = NULL;
        return;
    }
    if (!half && k != L_ONE) l->comm = mt_world;
    l->rank = l->comm ? nb_comm_rank(l->comm) : 0;
    l->size = l->comm ? nb_comm_size(l->comm) : 1;
    l->m = build_mlp(seed);
    if (!l->m) return;
    if (k == L_TP || k == L_TPB || k == L_TPFLAT)
        MT_OK(nb_parallelize(l->m, l->mesh, k == L_TP ? tp_plan : tpb_plan, NULL));
    if (k == L_FLAT || k == L_TPFLAT) {
        l->o = l->inner = piece_adamw(l->m, l->mesh);
    } else {
        l->o = l->inner = model_adamw(l->m);
    }
    l->s = cosine(l->o);
    if (k == L_DDP) {
        l->d = nb_ddp_new(l->m, l->comm, NULL);
        MT_CHECK(l->d != NULL, "ddp: %s", nb_last_error());
    }
    if (k == L_Z1 || k == L_Z2 || k == L_Z3 || k == L_Z3H) {
        int stage = k == L_Z1 ? 1 : k == L_Z2 ? 2 : 3;
        nb_zero_opts zo = nb_zero_defaults();
        zo.stage = stage, zo.bucket_mb = 200e-6;
        l->z = nb_zero_new(l->m, l->o, l->comm, &zo);
        MT_CHECK(l->z != NULL, "zero: %s", nb_last_error());
        if (l->z) l->inner = nb_zero_optim(l->z);
    }
}

void dcp_layout_free(dcp_layout *l) {
    nb_zero_free(l->z);
    nb_ddp_free(l->d);
    nb_sched_free(l->s);
    nb_optim_free(l->o);
    nb_module_free(l->m);
    nb_mesh_free(l->mesh);
    if (l->comm && l->comm != mt_world) nb_comm_free(l->comm);
    memset(l, 0, sizeof *l);
}

nb_checkpoint dcp_layout_ck(dcp_layout *l, int64_t step) {
    return (nb_checkpoint){.model = l->m, .optim = l->o, .sched = l->s, .step = step,
                           .program = "test", .comm = l->k == L_DDP ? l->comm : NULL};
}

void dcp_layout_train(dcp_layout *l, int step) {
    if (!l->active || !l->m || !dcp_layout_trains(l->k)) return;
    nb_scope_begin();
    nb_generator *g = nb_generator_new(100 + (uint64_t)step);
    nb_tensor *x = nb_randn((int64_t[]){GB, IN}, 2, NB_F32, g);
    nb_tensor *y = nb_randint((int64_t[]){GB}, 1, NB_I64, 0, OUT, g);
    nb_generator_free(g);
    /* tensor parallel: every replica trains on the whole batch (the same gradients) */
    bool split = l->k != L_ONE && l->k != L_TP;
    int64_t n = split ? GB / l->size : GB, start = split ? l->rank * n : 0;
    nb_tensor *loss = nb_cross_entropy(nb_forward(l->m, nb_narrow(x, 0, start, n)),
                                       nb_narrow(y, 0, start, n), NULL);
    MT_OK(nb_zero_grad(l->o));
    MT_OK(nb_backward(loss));
    if (l->d) MT_OK(nb_ddp_sync(l->d));
    MT_OK(nb_step(l->o));
    MT_OK(nb_sched_step(l->s));
    nb_scope_end();
}

static void append(unsigned char **buf, size_t *n, size_t *cap, nb_tensor *t) {
    nb_scope_begin();
    nb_tensor *h = nb_contiguous(nb_to_device(t, NB_CPU));
    size_t bytes = h ? (size_t)nb_numel(h) * nb_dtype_size(nb_tensor_dtype(h)) : 0;
    if (*n + bytes > *cap) {
        *cap = (*n + bytes) * 2 + 64;
        *buf = realloc(*buf, *cap);
    }
    if (h && bytes) memcpy(*buf + *n, nb_data(h), bytes);
    *n += bytes;
    nb_scope_end();
}

unsigned char *dcp_layout_bytes(dcp_layout *l, size_t *n) {
    unsigned char *buf = NULL;
    size_t cap = 0;
    *n = 0;
    if (!l->active || !l->m) return malloc(1);
    bool stage3 = l->k == L_Z3 || l->k == L_Z3H; /* the parameters live in the pieces */
    const nb_params *ps = nb_parameters(l->m);
    for (int i = 0; !stage3 && i < ps->count; i++) append(&buf, n, &cap, ps->tensors[i]);
    const nb_params *ip = nb_optim_params(l->inner);
    for (int i = 0; ip && i < ip->count; i++) append(&buf, n, &cap, ip->tensors[i]);
    const nb_params *st = nb_optim_state(l->inner);
    for (int i = 0; st && i < st->count; i++) append(&buf, n, &cap, st->tensors[i]);
    if (l->o != l->inner) {
        st = nb_optim_state(l->o);
        for (int i = 0; st && i < st->count; i++) append(&buf, n, &cap, st->tensors[i]);
    }
    st = nb_sched_state(l->s);
    for (int i = 0; st && i < st->count; i++) append(&buf, n, &cap, st->tensors[i]);
    return buf ? buf : malloc(1);
}

/* ---- files -------------------------------------------------------------------------------- */
bool dcp_same_tensors(const char *a, const char *b, char *why, size_t n) {
    nb_safetensors *fa = nb_safetensors_open(a), *fb = nb_safetensors_open(b);
    bool same = fa && fb && nb_safetensors_count(fa) == nb_safetensors_count(fb);
    snprintf(why, n, "%s", !fa || !fb ? nb_last_error() : "different tensor counts");
    for (int i = 0; same && i < nb_safetensors_count(fa); i++) {
        const char *name = nb_safetensors_name(fa, i);
        int j = nb_safetensors_find(fb, name);
        nb_safetensors_info ia, ib;
        same = j >= 0 && nb_safetensors_info_at(fa, i, &ia) == NB_OK &&
               nb_safetensors_info_at(fb, j, &ib) == NB_OK && ia.dtype == ib.dtype &&
               ia.data_end - ia.data_begin == ib.data_end - ib.data_begin;
        nb_scope_begin();
        nb_tensor *ta = same ? nb_safetensors_get(fa, name) : NULL;
        nb_tensor *tb = same ? nb_safetensors_get(fb, name) : NULL;
        same = same && ta && tb &&
               memcmp(nb_data(ta), nb_data(tb), (size_t)(ia.data_end - ia.data_begin)) == 0;
        nb_scope_end();
        if (!same) snprintf(why, n, "tensor \"%s\" differs", name);
    }
    nb_safetensors_close(fa);
    nb_safetensors_close(fb);
    nb_clear_error();
    return same;
}

void dcp_expect_close(nb_module *a, nb_module *b, double rtol, const char *what) {
    mt_expect_params_close(a, b, rtol, 1e-2, what);
}
