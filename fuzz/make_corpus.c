/* make_corpus.c - writes the seed corpus of the fuzz targets (fuzz/corpus/<target>/): valid
 * files made by the library's own writers, and truncated or corrupted copies of them.
 * Usage: make_corpus DIR (normally fuzz/corpus; the files there are committed, so rerun
 * this only when a format changes, and keep the corpus small). */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt_objects.h"
#include "fuzz.h"
#include "module_model.h"
#include "nabla/gpt.h"
#include "nabla/data.h"
#include "nabla/io.h"
#include "nabla/random.h"

static const char *g_dir;

static void fail(const char *what) {
    fprintf(stderr, "make_corpus: %s: %s\n", what, nb_last_error());
    exit(1);
}

static void path_of(char *buf, size_t cap, const char *target, const char *name) {
    snprintf(buf, cap, "%s/%s", g_dir, target);
    mkdir(buf, 0755);
    snprintf(buf, cap, "%s/%s/%s", g_dir, target, name);
}

static void write_bytes(const char *target, const char *name, const void *p, size_t n) {
    char path[512];
    path_of(path, sizeof path, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "make_corpus: cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
}

static unsigned char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) fail(path);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = malloc(*n ? *n : 1);
    if (fread(p, 1, *n, f) != *n) fail(path);
    fclose(f);
    return p;
}

/* From the valid file target/name: name.trunc (cut at 'frac') and name.flip (one byte of
 * the header region changed). */
static void damaged_copies(const char *target, const char *name, double frac, size_t flip_at) {
    char path[512], out[256];
    path_of(path, sizeof path, target, name);
    size_t n;
    unsigned char *p = read_file(path, &n);
    snprintf(out, sizeof out, "%s.trunc", name);
    write_bytes(target, out, p, (size_t)(frac * (double)n));
    if (flip_at < n) {
        p[flip_at] ^= 0x5a;
        snprintf(out, sizeof out, "%s.flip", name);
        write_bytes(target, out, p, n);
    }
    free(p);
}

static void safetensors(void) {
    nb_generator *g = nb_generator_new(1);
    nb_tensor *a = nb_randn((int64_t[]){3, 4}, 2, NB_F32, g);
    nb_tensor *b = nb_to_dtype(a, NB_BF16);
    nb_tensor *c = nb_arange(0, 6, 1, NB_I64);
    nb_tensor *d = nb_ones((int64_t[]){2, 1, 3}, 3, NB_BOOL);
    nb_tensor *e = nb_zeros((int64_t[]){0, 5}, 2, NB_F16);
    nb_tensor *s = nb_scalar(2.5, NB_F64);
    const char *names[] = {"w", "w.bf16", "idx", "mask", "empty", "scale"};
    nb_tensor *ts[] = {a, b, c, d, e, s};
    const char *keys[] = {"format", "note"}, *vals[] = {"pt", "seed corpus"};
    char path[512];
    path_of(path, sizeof path, "safetensors", "mixed.safetensors");
    if (nb_safetensors_save(path, names, ts, 6, keys, vals, 2) != NB_OK) fail("safetensors");
    path_of(path, sizeof path, "safetensors", "one.safetensors");
    if (nb_safetensors_save(path, names + 2, ts + 2, 1, NULL, NULL, 0) != NB_OK)
        fail("safetensors");
    damaged_copies("safetensors", "mixed.safetensors", 0.8, 20);
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) nb_tensor_free(ts[i]);
    nb_generator_free(g);
    /* hand-written headers: an unaligned offset (read as a copy), more than 8 dims */
    static const char unaligned[] = "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],"
                                    "\"data_offsets\":[1,5]},\"p\":{\"dtype\":\"U8\","
                                    "\"shape\":[1],\"data_offsets\":[0,1]}}";
    static const char dims9[] = "{\"x\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                                "\"data_offsets\":[0,1]}}      ";
    const char *hand[] = {unaligned, dims9};
    const char *hand_names[] = {"unaligned.safetensors", "dims9.safetensors"};
    for (int k = 0; k < 2; k++) {
        size_t hl = strlen(hand[k]), dl = 5;
        unsigned char buf[256] = {0};
        for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
        memcpy(buf + 8, hand[k], hl);
        write_bytes("safetensors", hand_names[k], buf, 8 + hl + dl);
    }
}

static void checkpoint(void) {
    ckpt_objects o;
    if (!ckpt_objects_init(&o)) fail("checkpoint objects");
    for (int i = 0; i < 3; i++) { /* three steps: optimizer and schedule state, a position */
        nb_batch b;
        if (!nb_loader_next(o.loader, &b)) fail("loader");
        nb_scope_begin();
        nb_tensor *loss = nb_cross_entropy(nb_forward(o.model, b.x), b.y, NULL);
        if (nb_zero_grad(o.opt) || nb_backward(loss) || nb_step(o.opt) || nb_sched_step(o.sched))
            fail("training step");
        nb_scope_end();
    }
    char path[512];
    nb_checkpoint c = ckpt_of(&o, 3);
    path_of(path, sizeof path, "checkpoint", "step3.ckpt");
    if (nb_checkpoint_save(path, &c) != NB_OK) fail("checkpoint");
    /* only the model (the other parts absent) */
    nb_checkpoint m = {.model = o.model, .step = 7};
    path_of(path, sizeof path, "checkpoint", "model-only.ckpt");
    if (nb_checkpoint_save(path, &m) != NB_OK) fail("checkpoint");
    ckpt_objects_free(&o);
    damaged_copies("checkpoint", "step3.ckpt", 0.5, 200);
    /* the seed must load into fresh objects, or the fuzzer starts outside the loader */
    if (!ckpt_objects_init(&o)) fail("checkpoint objects");
    path_of(path, sizeof path, "checkpoint", "step3.ckpt");
    c = ckpt_of(&o, 0);
    if (nb_checkpoint_load(path, &c) != NB_OK || c.step != 3) fail("loading the seed");
    ckpt_objects_free(&o);
}

static void module(void) {
    char path[512];
    nb_module *m = fuzz_module_model(6), *other = fuzz_module_model(5);
    if (!m || !other) fail("module");
    nb_module_train(m, false); /* running statistics in the file too */
    path_of(path, sizeof path, "module", "model.safetensors");
    if (nb_module_save(m, path) != NB_OK) fail("module");
    path_of(path, sizeof path, "module", "other-shapes.safetensors");
    if (nb_module_save(other, path) != NB_OK) fail("module");
    nb_module_free(m);
    nb_module_free(other);
    damaged_copies("module", "model.safetensors", 0.7, 40);
}

static void gpt(void) {
    char path[512];
    nb_gpt_config cfg = nb_gpt_config_defaults();
    cfg.vocab_size = 32, cfg.block_size = 8, cfg.n_layer = 1, cfg.n_head = 1, cfg.n_embd = 8;
    nb_generator *g = nb_generator_new(3);
    nb_module *m = g ? nb_gpt_new(&cfg, g) : NULL;
    if (!m) fail("gpt");
    path_of(path, sizeof path, "gpt", "model.safetensors");
    if (nb_module_save(m, path) != NB_OK) fail("gpt");
    /* a checkpoint: the weights under "model." */
    nb_checkpoint c = {.model = m, .step = 1};
    path_of(path, sizeof path, "gpt", "model.ckpt");
    if (nb_checkpoint_save(path, &c) != NB_OK) fail("gpt");
    nb_module_free(m);
    nb_generator_free(g);
    damaged_copies("gpt", "model.safetensors", 0.6, 60);
}

static void idx(void) {
    char path[512];
    nb_tensor *img = nb_arange(0, 48, 1, NB_U8);
    nb_tensor *img3 = nb_reshape(img, (int64_t[]){3, 4, 4}, 3);
    nb_tensor *lab = nb_arange(0, 3, 1, NB_U8);
    nb_tensor *f = nb_full((int64_t[]){2, 3}, 2, NB_F32, -1.5);
    nb_tensor *i32 = nb_arange(-3, 3, 1, NB_I32);
    struct { const char *name; nb_tensor *t; } files[] = {
        {"images.idx3", img3}, {"labels.idx1", lab}, {"f32.idx2", f}, {"i32.idx1", i32},
        {"images.idx3.gz", img3}};
    for (size_t k = 0; k < sizeof files / sizeof *files; k++) {
        path_of(path, sizeof path, "idx", files[k].name);
        if (nb_idx_write(path, files[k].t) != NB_OK) fail("idx");
    }
    damaged_copies("idx", "images.idx3", 0.7, 3);
    damaged_copies("idx", "images.idx3.gz", 0.7, 30);
    /* a dataset pair for the second half of the target: cut byte, images, labels */
    size_t ni, nl;
    path_of(path, sizeof path, "idx", "images.idx3");
    unsigned char *pi = read_file(path, &ni);
    path_of(path, sizeof path, "idx", "labels.idx1");
    unsigned char *pl = read_file(path, &nl);
    unsigned char *pair = malloc(1 + ni + nl);
    pair[0] = (unsigned char)(ni / 4); /* 64 bytes of images */
    memcpy(pair + 1, pi, ni);
    memcpy(pair + 1 + ni, pl, nl);
    write_bytes("idx", "pair", pair, 1 + ni + nl);
    free(pi);
    free(pl);
    free(pair);
    nb_tensor *ts[] = {img, img3, lab, f, i32};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) nb_tensor_free(ts[i]);
}

static void text(void) {
    static const char verse[] =
        "In the beginning God created the heaven and the earth.\n"
        "And the earth was without form, and void; and darkness was upon the face of the "
        "deep.\n";
    write_bytes("text", "verse.txt", verse, sizeof verse - 1);
    write_bytes("text", "short.txt", "\x05" "abcdef", 7); /* block 6: one window */
    write_bytes("text", "empty.txt", "", 0);
    /* gzip of the verse (nb_idx_write's gzip writer is for IDX; a text seed is made from
     * an IDX u8 file's gzip stream holding the verse bytes after its header) */
    char path[512];
    nb_tensor *t = nb_from_buffer(verse, (int64_t[]){sizeof verse - 1}, 1, NB_U8);
    path_of(path, sizeof path, "text", "verse.idx1.gz");
    if (nb_idx_write(path, t) != NB_OK) fail("text gz");
    nb_tensor_free(t);
    damaged_copies("text", "verse.idx1.gz", 0.6, 12);
}

static void shape(void) {
    /* ndim byte = ndim + 1, dtype byte, sizes (< 0x80 literal, else 8 raw bytes) */
    static const unsigned char seeds[][40] = {
        {3, 0, 2, 3, 3, 6, 1, 0, 0, 0, 2},                      /* (2,3) f32 -> (6), narrow */
        {4, 5, 2, 3, 4, 3, 4, 0x7f, 6, 1, 1, 1, 2},            /* (2,3,4) i64 -> (4,-1..) */
        {2, 0, 0x80, 0x40, 0, 0, 0, 0, 0, 0, 0, 1, 0},         /* 2^62 elements of f32 */
        {3, 1, 0x80, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 3, 2, 0},  /* -1 */
        {3, 2, 0, 5, 2, 5, 0},                                  /* empty */
        {1, 0, 1, 0},                                           /* a scalar */
        {10, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1},                     /* 9 dims */
    };
    static const size_t lens[] = {11, 13, 13, 14, 7, 4, 11};
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
        char name[32];
        snprintf(name, sizeof name, "seed%zu", i);
        write_bytes("shape", name, seeds[i], lens[i]);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: make_corpus DIR\n");
        return 2;
    }
    g_dir = argv[1];
    mkdir(g_dir, 0755);
    safetensors();
    checkpoint();
    module();
    gpt();
    idx();
    text();
    shape();
    return 0;
}
