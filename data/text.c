/* text.c - byte-level text for language models: a dataset of next-token windows over a
 * 1-D token tensor, the train/validation split by position, and nanoGPT-style random
 * window sampling from a generator (reproducible, and without allocation for host batches).
 *
 * Windows are cut on the host: the dataset keeps a host copy of its tokens, and
 * nb_text_sample needs host tokens; its x and y may live on any device (they are filled
 * on the host, then copied in; on meta nothing is copied but the generator advances). */
#include <stdlib.h>
#include <string.h>

#include "data/data_impl.h"

typedef struct {
    nb_dataset base;
    nb_tensor *tokens; /* contiguous 1-D, owned */
    int64_t block;
} nb__text_ds;

/* Token i of a contiguous 1-D U8/I32/I64 tensor. */
static inline int64_t tok_at(const char *p, nb_dtype dt, int64_t i) {
    switch (dt) {
    case NB_U8: return ((const uint8_t *)p)[i];
    case NB_I32: return ((const int32_t *)p)[i];
    default: return ((const int64_t *)p)[i];
    }
}

/* Write tokens [s, s + T) into row (as I64 or I32). */
static void copy_window(void *row, nb_dtype out, const char *p, nb_dtype dt, int64_t s,
                        int64_t T) {
    if (out == NB_I64) {
        int64_t *r = row;
        if (dt == NB_I64) memcpy(r, (const int64_t *)p + s, sizeof(int64_t) * (size_t)T);
        else
            for (int64_t t = 0; t < T; t++) r[t] = tok_at(p, dt, s + t);
    } else {
        int32_t *r = row;
        for (int64_t t = 0; t < T; t++) r[t] = (int32_t)tok_at(p, dt, s + t);
    }
}

static int64_t text_length(nb_dataset *ds) {
    nb__text_ds *t = (nb__text_ds *)ds;
    return nb_numel(t->tokens) - t->block;
}

static nb_status text_get_batch(nb_dataset *ds, const int64_t *indices, int64_t n,
                                nb_tensor *x, nb_tensor *y) {
    nb__text_ds *t = (nb__text_ds *)ds;
    const char *p = nb__ptr(t->tokens);
    int64_t T = t->block;
    int64_t *xd = (int64_t *)nb__ptr(x), *yd = (int64_t *)nb__ptr(y);
    for (int64_t k = 0; k < n; k++) {
        copy_window(xd + k * T, NB_I64, p, t->tokens->dtype, indices[k], T);
        copy_window(yd + k * T, NB_I64, p, t->tokens->dtype, indices[k] + 1, T);
    }
    return NB_OK;
}

static void text_free(nb_dataset *ds) {
    nb__text_ds *t = (nb__text_ds *)ds;
    nb_tensor_free(t->tokens);
    free(t);
}

static const nb_dataset_vtable text_vt = {"text", text_length, text_get_batch, text_free};

static bool tokens_ok(const nb_tensor *tokens, int64_t T, const char *op) {
    if (tokens->ndim != 1) {
        nb__error(NB_EDIM, "%s: tokens must be 1-D, got shape %s", op, NB__SHAPE(tokens));
        return false;
    }
    if (tokens->dtype != NB_U8 && tokens->dtype != NB_I32 && tokens->dtype != NB_I64) {
        nb__error(NB_EDTYPE, "%s: tokens must be u8, i32 or i64, got %s", op,
                  nb_dtype_name(tokens->dtype));
        return false;
    }
    if (T < 1 || tokens->shape[0] <= T) {
        nb__error(NB_EINVAL, "%s: block size %lld needs a text of more than %lld tokens "
                  "(got %lld)", op, (long long)T, (long long)T, (long long)tokens->shape[0]);
        return false;
    }
    return true;
}

nb_dataset *nb_text_dataset_new(nb_tensor *tokens, int64_t block_size) {
    const char *op = "text_dataset";
    NB__CHECK_ARG(tokens, op, "tokens");
    if (!tokens_ok(tokens, block_size, op)) return NULL;
    nb__text_ds *t = calloc(1, sizeof *t);
    if (!t) {
        nb__error(NB_ENOMEM, "%s: out of memory", op);
        return NULL;
    }
    /* A private contiguous host copy (tokens itself, retained, when it already is one). */
    if (nb__host_accessible(tokens)) {
        t->tokens = nb__scope_take(nb_contiguous(tokens));
    } else {
        nb_tensor *h = nb_to_device(tokens, NB_CPU); /* contiguous; NULL + error for meta */
        t->tokens = h ? nb__scope_take(h) : NULL;
    }
    if (!t->tokens) {
        free(t);
        return NULL;
    }
    t->block = block_size;
    t->base.vt = &text_vt;
    t->base.x = (nb_sample_spec){.dtype = NB_I64, .ndim = 1, .shape = {block_size}};
    t->base.y = t->base.x;
    t->base.has_y = true;
    return &t->base;
}

nb_status nb_text_split(nb_tensor *tokens, double train_frac, nb_tensor **train,
                        nb_tensor **val) {
    const char *op = "text_split";
    if (!tokens || !train || !val)
        return nb__error(NB_ENULL, "%s: argument '%s' is NULL", op,
                         !tokens ? "tokens" : !train ? "train" : "val");
    *train = *val = NULL;
    if (tokens->ndim != 1)
        return nb__error(NB_EDIM, "%s: tokens must be 1-D, got shape %s", op,
                         NB__SHAPE(tokens));
    if (!(train_frac > 0.0 && train_frac < 1.0))
        return nb__error(NB_EINVAL, "%s: train_frac must be in (0, 1) (got %g)", op,
                         train_frac);
    int64_t n = tokens->shape[0];
    int64_t cut = (int64_t)(train_frac * (double)n);
    nb_tensor *a = nb_narrow(tokens, 0, 0, cut);
    nb_tensor *b = a ? nb_narrow(tokens, 0, cut, n - cut) : NULL;
    if (!b) {
        nb_tensor_free(nb__scope_take(a));
        return nb_last_status();
    }
    *train = a;
    *val = b;
    return NB_OK;
}

nb_status nb_text_sample(nb_tensor *tokens, nb_generator *g, nb_tensor *x, nb_tensor *y) {
    const char *op = "text_sample";
    if (!tokens || !x || !y)
        return nb__error(NB_ENULL, "%s: argument '%s' is NULL", op,
                         !tokens ? "tokens" : !x ? "x" : "y");
    if (x->ndim != 2 || y->ndim != 2 || x->shape[0] != y->shape[0] ||
        x->shape[1] != y->shape[1])
        return nb__error(NB_ESHAPE, "%s: x %s and y %s must both be (B, T)", op,
                         NB__SHAPE(x), NB__SHAPE(y));
    if ((x->dtype != NB_I64 && x->dtype != NB_I32) || y->dtype != x->dtype)
        return nb__error(NB_EDTYPE, "%s: x and y must both be i64 or both i32 (got %s, %s)",
                         op, nb_dtype_name(x->dtype), nb_dtype_name(y->dtype));
    bool xh = nb__host_accessible(x), yh = nb__host_accessible(y);
    if ((xh && !nb_is_contiguous(x)) || (yh && !nb_is_contiguous(y)))
        return nb__error(NB_EINVAL, "%s: x and y must be contiguous CPU tensors", op);
    int64_t B = x->shape[0], T = x->shape[1];
    if (!tokens_ok(tokens, T, op)) return nb_last_status();
    if (!nb__require_host(tokens, op)) return NB_EDEVICE;
    if (!xh || !yh) { /* fill host batches, then copy them to x's and y's devices */
        nb_scope_begin();
        nb_tensor *hx = nb_empty_on(NB_CPU, x->shape, 2, x->dtype);
        nb_tensor *hy = nb_empty_on(NB_CPU, y->shape, 2, y->dtype);
        nb_status st = hx && hy ? nb_text_sample(tokens, g, hx, hy) : nb_last_status();
        nb_tensor *dx = st == NB_OK ? nb_to_device(hx, nb__device_of(x)) : NULL;
        nb_tensor *dy = dx ? nb_to_device(hy, nb__device_of(y)) : NULL;
        if (st == NB_OK) st = dx && dy ? nb_copy_(x, dx) : nb_last_status();
        if (st == NB_OK) st = nb_copy_(y, dy);
        nb_scope_end();
        return st;
    }
    if (!g) g = nb_default_generator();
    /* Starts uniform in [0, range), drawn exactly as nb_randint((B), lo 0, hi range) with
     * this generator (tensor/random.c): one 32-bit word per value (4 per Philox block) and
     * multiply-shift when the range fits 32 bits, else a 64-bit word (2 per block). */
    uint64_t range = (uint64_t)(tokens->shape[0] - T);
    uint64_t seed = nb_generator_seed(g), stream = nb_generator_stream(g);
    uint64_t off = nb_generator_offset(g);
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    int per = range <= (UINT64_C(1) << 32) ? 4 : 2;
    int64_t tstride = tokens->strides[0];
    nb_tensor *tc = tokens;
    if (tstride != 1) { /* windows need contiguous tokens; views of a view are rare here */
        tc = nb__scope_take(nb_contiguous(tokens));
        if (!tc) return nb_last_status();
    }
    const char *p = nb__ptr(tc);
    size_t row = nb_dtype_size(x->dtype) * (size_t)T;
    char *xd = nb__ptr(x), *yd = nb__ptr(y);
    uint32_t w[4];
    for (int64_t b = 0; b < B; b++) {
        if (b % per == 0) {
            uint64_t c = off + (uint64_t)(b / per);
            uint32_t ctr[4] = {(uint32_t)c, (uint32_t)(c >> 32), (uint32_t)stream,
                               (uint32_t)(stream >> 32)};
            nb_philox4x32(ctr, key, w);
        }
        int k = (int)(b % per);
        int64_t s;
        if (per == 4) {
            s = (int64_t)(((uint64_t)w[k] * range) >> 32);
        } else {
            uint64_t v = (uint64_t)w[2 * k] << 32 | w[2 * k + 1];
            s = (int64_t)(((unsigned __int128)v * range) >> 64);
        }
        copy_window(xd + (size_t)b * row, x->dtype, p, tc->dtype, s, T);
        copy_window(yd + (size_t)b * row, x->dtype, p, tc->dtype, s + 1, T);
    }
    if (tc != tokens) nb_tensor_free(tc);
    nb_generator_set_offset(g, off + (uint64_t)((B + per - 1) / per));
    return NB_OK;
}
