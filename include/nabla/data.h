/* nabla/data.h - datasets (in-memory tensors, IDX / Fashion-MNIST, byte-level text), the
 * batch loader (shuffle, shard per rank, prefetch thread, resumable position) and batch
 * transforms for images.
 *
 * Usage:
 *     nb_dataset *train = nb_fashion_mnist_new(NULL, true, NULL);      // NULL: default dir
 *     if (!train) { fprintf(stderr, "%s\n", nb_last_error()); return 1; }
 *     nb_image_aug aug = { .crop_padding = 2, .hflip_p = 0.5,
 *                          .channels = 1, .mean = {0.2860}, .std = {0.3530} };
 *     nb_loader_opts lo = nb_loader_defaults();   // batch 1, world 1, ...: then edit
 *     lo.batch_size = 128;
 *     lo.shuffle = true;
 *     lo.seed = 42;
 *     lo.prefetch = 2;
 *     lo.transform = nb_image_aug_transform;
 *     lo.transform_ctx = &aug;
 *     nb_loader *loader = nb_loader_new(train, &lo);
 *     for (int epoch = 0; epoch < 10; epoch++) {
 *         for (nb_batch b; nb_loader_next(loader, &b); ) {      // b.x (128,1,28,28) f32
 *             nb_scope_begin();                                  // b.y (128) i64
 *             nb_tensor *loss = nb_cross_entropy(nb_forward(model, b.x), b.y, NULL);
 *             ...
 *             nb_scope_end();
 *         }
 *         if (nb_loader_error(loader)) { fprintf(stderr, "%s\n", nb_last_error()); break; }
 *     }
 *     nb_loader_state pos;
 *     nb_loader_get_state(loader, &pos);     // save with a checkpoint; nb_loader_set_state
 *                                            // later resumes at exactly the next batch
 *     nb_loader_free(loader);
 *     nb_dataset_free(train);
 *
 * Ownership:
 *   - nb_dataset objects come from the constructors here (or from your own vtable, see
 *     struct nb_dataset) and are freed with nb_dataset_free. nb_tensor_dataset_new and
 *     nb_text_dataset_new retain the tensors they are given (the caller keeps its references).
 *   - A loader borrows its dataset: the dataset must outlive the loader. The batch tensors
 *     b.x, b.y and the array b.indices belong to the loader and stay valid until the next
 *     nb_loader_next / nb_loader_set_state / nb_loader_free on that loader: the loader
 *     reuses them (no allocation per batch). Use them inside the step; nb_clone what you
 *     want to keep. Never nb_tensor_free them.
 *   - nb_idx_read and nb_read_bytes return a new tensor reference (scope rules of
 *     nabla/tensor.h).
 *
 * Determinism (docs/architecture.md rule 5): the order of an epoch depends only on (seed, epoch):
 * it is the permutation nb_randperm(n) draws from a generator with that seed, stream =
 * epoch, offset 0. Augmentation randomness depends only on (seed, epoch, dataset index of
 * the sample). Neither depends on timing, prefetch, thread count or batch size.
 *
 * Threads: a loader is used by one thread at a time. With .prefetch > 0 the loader runs
 * the dataset's get_batch and the transform on its own background thread, so both must
 * not touch state that the caller's thread changes meanwhile; the library's scopes and
 * last error are per thread, and the loader moves errors to the caller's thread. */
#ifndef NABLA_DATA_H
#define NABLA_DATA_H

#include <stdbool.h>
#include <stdint.h>

#include "nabla/random.h"
#include "nabla/status.h"
#include "nabla/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- datasets ----------------------------------------------------------------------------- */
typedef struct nb_dataset nb_dataset;

/* Shape and dtype of one sample's x or y (the batch adds a leading dim). */
typedef struct nb_sample_spec {
    nb_dtype dtype;
    int ndim; /* 0 for a scalar per sample (e.g. a class label) */
    int64_t shape[NB_MAX_DIMS];
} nb_sample_spec;

/* What a dataset implements. get_batch writes the samples indices[0..n) into rows 0..n of
 * the preallocated contiguous CPU tensors x (n, x_spec...) and y (n, y_spec...) (y is NULL
 * when the dataset has no labels). It is called with indices already checked to be in
 * [0, length) and tensors of the right shape and dtype. It may run on a loader's prefetch
 * thread, so it must not depend on the caller's thread; it must not keep x or y. */
typedef struct nb_dataset_vtable {
    const char *name;                    /* "tensor", "fashion-mnist", ... for messages */
    int64_t (*length)(nb_dataset *ds);
    nb_status (*get_batch)(nb_dataset *ds, const int64_t *indices, int64_t n, nb_tensor *x,
                           nb_tensor *y);
    void (*free)(nb_dataset *ds);        /* release everything, including ds itself */
} nb_dataset_vtable;

/* The base of every dataset. Your own dataset embeds it as its first member, sets vt and
 * the specs, and is then usable with every function here (has_y false: no labels). */
struct nb_dataset {
    const nb_dataset_vtable *vt;
    nb_sample_spec x;
    nb_sample_spec y;
    bool has_y;
};

int64_t nb_dataset_len(nb_dataset *ds);      /* -1 (and an error) for NULL */
/* Checked call of the dataset's get_batch (indices in range, x/y shapes and dtypes). */
nb_status nb_dataset_get_batch(nb_dataset *ds, const int64_t *indices, int64_t n,
                               nb_tensor *x, nb_tensor *y);
void nb_dataset_free(nb_dataset *ds);        /* NULL is a no-op */

/* In-memory dataset: sample i is x[i] (shape x.shape[1:]) and y[i]. x has N >= 0 rows; y is
 * NULL (no labels) or has N rows. Both are retained (non-contiguous inputs are copied once);
 * batches have the same dtypes as x and y. CPU tensors only. */
nb_dataset *nb_tensor_dataset_new(nb_tensor *x, nb_tensor *y);

/* ---- IDX files (MNIST / Fashion-MNIST format) ------------------------------------------------
 * Big-endian header: two zero bytes, a type code (0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32,
 * 0x0D f32, 0x0E f64), the number of dims, then each dim as a 32-bit big-endian count; then
 * the elements, big-endian, row-major. Files may be gzip-compressed (read transparently;
 * decided by content, not by name). The file must hold exactly the data its header
 * promises: truncation and trailing bytes are NB_EFORMAT errors naming the file. */

/* The file's array as a new tensor of its dtype: u8 -> NB_U8, i32 -> NB_I32, f32 -> NB_F32,
 * f64 -> NB_F64; i8 and i16 (which nabla has no dtype for) are widened to NB_I32.
 * NULL + NB_EIO (cannot open/read) or NB_EFORMAT (not a valid IDX file). */
nb_tensor *nb_idx_read(const char *path);
/* Write t (U8, I32, F32 or F64; any shape with 1..255 dims, each < 2^32) as an IDX file,
 * gzip-compressed when path ends in ".gz". Replaces an existing file. */
nb_status nb_idx_write(const char *path, const nb_tensor *t);

/* Options of the IDX image/label datasets: nb_mnist_defaults() gives the values after each
 * field; NULL means those; every field is read as written (docs/conventions.md). */
typedef struct nb_mnist_opts {
    uint32_t _init;  /* private: set by nb_mnist_defaults() only */
    int64_t limit;   /* INT64_MAX (all); use only the first `limit` samples (>= 0) */
    bool raw_u8;     /* false; x as U8 in 0..255 instead of F32 scaled to [0, 1] */
} nb_mnist_opts;
nb_mnist_opts nb_mnist_defaults(void);

/* Image classification dataset from an IDX image file (N, H, W) u8 and an IDX label file
 * (N) u8: x is (N, 1, H, W) F32 in [0, 1] (value / 255, converted per batch), y is I64.
 * The counts must agree (NB_EFORMAT otherwise). opts may be NULL. */
nb_dataset *nb_idx_dataset_new(const char *images_path, const char *labels_path,
                               const nb_mnist_opts *opts);
/* Fashion-MNIST (or MNIST: same file names) from dir/{train,t10k}-{images-idx3,
 * labels-idx1}-ubyte.gz (plain files without .gz are used when the .gz are absent).
 * dir NULL: NB_FASHION_MNIST_DIR (the Debian package dataset-fashion-mnist). */
#define NB_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
nb_dataset *nb_fashion_mnist_new(const char *dir, bool train, const nb_mnist_opts *opts);
/* "T-shirt/top", "Trouser", ... "Ankle boot" for labels 0..9; "?" otherwise. */
const char *nb_fashion_mnist_class(int64_t label);

/* ---- byte-level text -------------------------------------------------------------------- */
/* The bytes of a file (gzip-compressed files are decompressed) as a new U8 tensor (size).
 * NULL + NB_EIO on failure. */
nb_tensor *nb_read_bytes(const char *path);
/* Split a 1-D token tensor by position: the first floor(train_frac * n) tokens as *train,
 * the rest as *val (views, new references; nabla/tensor.h scope rules). train_frac in
 * (0, 1); 0.9 gives the usual 90/10 split. */
nb_status nb_text_split(nb_tensor *tokens, double train_frac, nb_tensor **train,
                        nb_tensor **val);
/* Next-token windows: sample i is x = tokens[i : i+block_size], y = tokens[i+1 :
 * i+block_size+1] (both I64, shape (block_size)); length numel - block_size. tokens: 1-D U8,
 * I32 or I64, retained. With a shuffling loader this gives random windows. */
nb_dataset *nb_text_dataset_new(nb_tensor *tokens, int64_t block_size);
/* Random windows without a dataset (nanoGPT's get_batch): x and y are preallocated (B, T)
 * I64 or I32 tensors; B start positions are drawn from g (NULL: the thread's default
 * generator) exactly as nb_randint((B), 0, numel - T) would, advancing g the same way;
 * then x[b] = tokens[s_b : s_b+T], y[b] = tokens[s_b+1 : s_b+T+1]. No allocation
 * (for contiguous tokens, such as nb_text_split's views). */
nb_status nb_text_sample(nb_tensor *tokens, nb_generator *g, nb_tensor *x, nb_tensor *y);

/* ---- loader ------------------------------------------------------------------------------- */
typedef struct nb_loader nb_loader;

/* One batch. x, y and indices belong to the loader (see Ownership above). */
typedef struct nb_batch {
    nb_tensor *x;            /* (n, x_spec...) */
    nb_tensor *y;            /* (n, y_spec...), NULL if the dataset has no labels */
    const int64_t *indices;  /* the n dataset indices of the samples, in batch order */
    int64_t n;               /* samples in this batch (batch_size, or fewer in the last) */
    int64_t epoch;           /* position of this batch: epoch and batch number in it */
    int64_t index;
    uint64_t seed;           /* the loader's seed (keys the augmentation randomness) */
} nb_batch;

/* A batch transform, called on every batch after get_batch (on the prefetch thread when
 * prefetching); modifies b->x / b->y in place. Return NB_OK, or a negative status: the
 * loader then stops and reports the thread's nb_last_error() message (of the failing
 * nabla call) to the caller. Tensors it creates are freed after each batch. */
typedef nb_status (*nb_transform_fn)(nb_batch *b, void *ctx);

/* Loader options: nb_loader_defaults() gives the values after each field; NULL means those.
 * Every field is read as written (docs/conventions.md): batch_size or world_size 0 is an
 * error, not 1. */
typedef struct nb_loader_opts {
    uint32_t _init;          /* private: set by nb_loader_defaults() only */
    int64_t batch_size;      /* 1; samples per batch (>= 1) */
    bool shuffle;            /* false; a new permutation every epoch (else dataset order) */
    uint64_t seed;           /* 0; keys the shuffle and the augmentation */
    bool drop_last;          /* false; drop the last incomplete batch (and, when sharding,
                              * the tail that does not divide by world_size, instead of
                              * padding it) */
    int rank;                /* 0; this process's shard, 0 <= rank < world_size */
    int world_size;          /* 1; number of shards (>= 1) */
    int prefetch;            /* 0 (none); batches prepared ahead on a background thread */
    nb_transform_fn transform; /* NULL; optional, see nb_transform_fn */
    void *transform_ctx;     /* NULL */
    nb_device device;        /* NB_CPU; the device the batches are delivered on: each batch
                              * is made on the CPU, then copied there by the thread that
                              * produced it (the prefetch thread, so the copy overlaps the
                              * caller's compute) and marked as used by the caller's
                              * stream when handed out (nb_record_stream). b.x and b.y are
                              * then the device tensors; the transform still sees the CPU
                              * batch. */
} nb_loader_opts;
nb_loader_opts nb_loader_defaults(void);

/* Position of a loader: the next batch nb_loader_next will return is `batch` of `epoch`. */
typedef struct nb_loader_state {
    int64_t epoch;
    int64_t batch;
} nb_loader_state;

/* A loader over ds (borrowed; it must outlive the loader). opts may be NULL. Allocates the
 * batch buffers once ((prefetch + 1) batches) and starts at epoch 0, batch 0. */
nb_loader *nb_loader_new(nb_dataset *ds, const nb_loader_opts *opts);
/* Joins the prefetch thread (also mid-epoch) and frees the buffers. NULL is a no-op. */
void nb_loader_free(nb_loader *l);
/* Fill *b with the next batch and return true; at the end of an epoch return false (once)
 * and move to the next epoch, so `for (nb_batch b; nb_loader_next(l, &b); )` runs one epoch.
 * On an error return false with nb_loader_error(l) != NB_OK and nb_last_error() set on
 * this thread; the error stays until nb_loader_set_state. */
bool nb_loader_next(nb_loader *l, nb_batch *b);
/* NB_OK, or the error that made nb_loader_next return false. */
nb_status nb_loader_error(const nb_loader *l);
/* Batches per epoch for this rank. */
int64_t nb_loader_num_batches(const nb_loader *l);
/* Samples per epoch for this rank: the sum of its batch sizes (after the shard's padding
 * or dropping, and drop_last). */
int64_t nb_loader_num_samples(const nb_loader *l);
/* The position (for checkpoints) and resuming at it: after set_state the next batch is
 * exactly the one that followed when the state was read. batch may equal
 * nb_loader_num_batches (the next call then ends that epoch). Clears a loader error and
 * discards prefetched batches. */
nb_status nb_loader_get_state(const nb_loader *l, nb_loader_state *out);
nb_status nb_loader_set_state(nb_loader *l, const nb_loader_state *st);

/* ---- transforms on image batches (N, C, H, W) or (N, H, W), in place -------------------------- */
/* x[:, c] = (x[:, c] - mean[c]) / std[c]; n entries, n == C or n == 1 (the same for every
 * channel). Float dtypes. */
nb_status nb_normalize_(nb_tensor *x, const double *mean, const double *std, int n);
/* Flip each sample of b->x left-right with probability p (independently per sample). */
nb_status nb_random_hflip(nb_batch *b, double p);
/* Zero-pad each sample of b->x by `padding` on all four sides, then crop back to H x W at a
 * random offset (0..2*padding in each direction, per sample). padding 0 is the identity. */
nb_status nb_random_crop(nb_batch *b, int padding);

#define NB_AUG_MAX_CHANNELS 4
/* The usual image pipeline as one transform: random crop, random flip, then normalize. */
typedef struct nb_image_aug {
    int crop_padding;  /* 0: no crop */
    double hflip_p;    /* 0: no flip */
    int channels;      /* entries of mean/std used (1: one for all channels); 0: no normalize */
    double mean[NB_AUG_MAX_CHANNELS];
    double std[NB_AUG_MAX_CHANNELS];
} nb_image_aug;
/* An nb_transform_fn; ctx is a const nb_image_aug * that must outlive the loader. */
nb_status nb_image_aug_transform(nb_batch *b, void *ctx);

#ifdef __cplusplus
}
#endif
#endif
