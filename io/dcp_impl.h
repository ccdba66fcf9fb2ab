/* dcp_impl.h - private to io/: the one distributed checkpoint (nabla/checkpoint.h). A save
 * turns an nb_checkpoint into entries (every tensor of the training state under its
 * checkpoint name, with its whole shape and the parts this rank holds, read from the
 * placements: dcp_plan.c), writes the parts this rank owns (one safetensors file per writing
 * rank) and an index (index.json, written last: dcp_index.c, dcp_save.c); a load reads the
 * stored pieces that overlap what this rank needs, verifies them, stages everything and only
 * then applies it (dcp_load.c). A single process, or a run whose state is whole and written
 * by one rank (DDP), writes one plain safetensors checkpoint instead. Not installed. */
#ifndef NABLA_IO_DCP_IMPL_H
#define NABLA_IO_DCP_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "nabla/checkpoint.h"
#include "nabla/io.h"
#include "nabla/mesh.h"
#include "nabla/parallel.h"

#define DCP_INDEX "index.json"
#define DCP_FORMAT "nabla-dcp"
#define DCP_SUM_ALGO "xxh3-64:"
#define DCP_MAX_PIECES (1 << 20) /* in one index: more is not a checkpoint of ours */

/* ---- where a part of a tensor lies ---------------------------------------------------------- */
/* A piece of a whole tensor: the rectangle [off, off + len) per dim, and when fn >= 0 only the
 * elements [flo, flo + fn) of that rectangle in row-major order (a ZeRO flat shard). */
typedef struct dcp_box {
    int ndim;
    int64_t off[NB_MAX_DIMS], len[NB_MAX_DIMS];
    int64_t flo, fn;
} dcp_box;
int64_t dcp_box_volume(const dcp_box *b); /* elements held (fn, or the rectangle's) */

/* Where a part sits in its entry's local tensor: a rectangle (start, len per local dim) or
 * (flat) the elements [fs, fs + fn) of the local tensor in row-major order. */
typedef struct dcp_sel {
    bool flat;
    int64_t start[NB_MAX_DIMS], len[NB_MAX_DIMS];
    int64_t fs, fn;
} dcp_sel;

typedef struct dcp_part {
    dcp_box box;
    dcp_sel sel;
} dcp_part;

/* The layout of a local tensor: the whole shape, its parts, and whether this rank writes
 * them (`write`; `first`: this rank holds element 0 of the whole tensor among the writers,
 * so it also writes the scalars that belong to it, such as an optimizer's step count). */
typedef struct dcp_lay {
    int ndim;
    int64_t shape[NB_MAX_DIMS];
    int nparts;
    dcp_part *parts; /* owned */
    bool write, first;
} dcp_lay;
void dcp_lay_free(dcp_lay *l);
/* A whole tensor of shape[ndim] held by this rank, written when write. */
nb_status dcp_lay_whole(dcp_lay *l, const int64_t *shape, int ndim, bool write);

/* ---- the entries of a checkpoint ----------------------------------------------------------- */
typedef enum { DCP_MODEL, DCP_OPTIM, DCP_OTHER } dcp_kind;

typedef struct dcp_entry {
    char *name;     /* "model.0.weight", "optim.exp_avg.0.weight", "step", ... (owned) */
    dcp_kind kind;
    nb_tensor *local; /* this rank's values (a reference owned by the entry) */
    dcp_lay lay;
} dcp_entry;

/* The world a checkpoint is saved and loaded over. */
typedef struct dcp_world {
    nb_comm *comm;  /* NULL: this process alone */
    int rank, size;
    const nb_mesh *mesh; /* of the placements, or NULL */
    bool pp;             /* the model is one pipeline stage's part (pp > 1) */
    char layout[96];     /* "dp=2 tp=2", "zero-3 dp=4", "1 process" */
} dcp_world;

typedef struct dcp_plan {
    dcp_world w;
    int n, cap;
    dcp_entry *e;
    nb_optim *holder;   /* the optimizer holding the state (the shard optimizer under ZeRO) */
    nb_optim *groups;   /* the one whose group hyperparameters count (the user's) */
} dcp_plan;

/* The world of c: its placements' mesh, the ZeRO run of its optimizer, or c->comm. */
nb_status dcp_world_of(const nb_checkpoint *c, dcp_world *w, const char *op);
/* The entries of c as a save writes them (every tensor this rank holds). */
nb_status dcp_plan_save(const nb_checkpoint *c, dcp_plan *p, const char *op);
void dcp_plan_free(dcp_plan *p, const nb_checkpoint *c);
nb_status dcp_plan_add(dcp_plan *p, const char *prefix, const char *name, dcp_kind kind,
                       nb_tensor *local, dcp_lay *lay);
/* The layout of t (a model parameter or buffer, an optimizer parameter) from its placement
 * or the ZeRO bridge; *local gets the tensor holding the values (a new reference: t itself,
 * or a ZeRO-3 parameter's shard). values: the layout of t's values (stage 3: the shard);
 * false: of the whole local tensor (what the optimizer's full-size state follows). */
nb_status dcp_lay_of(const dcp_world *w, nb_tensor *t, bool values, dcp_lay *l,
                     nb_tensor **local, const char *op);
/* The sub-tensor of local that part sel selects (a view, in the current scope). */
nb_tensor *dcp_select(nb_tensor *local, const dcp_sel *s);

/* ---- ZeRO (zero_bridge.c) ----------------------------------------------------------------- */
/* The shard optimizer holding the state of user's (a ZeRO run's optimizer), or NULL. */
nb_optim *dcp_zero_inner(nb_optim *user);

/* ---- agreement ------------------------------------------------------------------------------ */
/* Collective over w->comm: when any rank failed, every rank returns the error of the lowest
 * failing rank (its message, "(on rank r)" added on the others). Local without a comm. */
nb_status dcp_agree(const dcp_world *w, nb_status local);

/* ---- the index (dcp_index.c) --------------------------------------------------------------- */
typedef struct dcp_piece {
    int file;          /* index into the source's files */
    char *key;         /* the tensor's name in that file (owned) */
    dcp_box box;
    uint64_t sum;      /* XXH3-64 of its bytes */
    bool has_sum;
    bool checked;      /* its bytes were verified */
} dcp_piece;

typedef struct dcp_tensor {
    char *name;        /* owned */
    nb_dtype dtype;
    int ndim;
    int64_t shape[NB_MAX_DIMS];
    int np;
    dcp_piece *p;      /* owned */
} dcp_tensor;

typedef struct dcp_file {
    char *name;        /* owned: relative to the folder (the plain file: its path) */
    int rank;
    nb_safetensors *f; /* opened on first use */
    bool checked;      /* its metadata were checked */
} dcp_file;

/* What a checkpoint holds: a folder's index, or a plain file read as one. */
typedef struct dcp_source {
    char *path;        /* the folder or the file (owned) */
    bool folder;
    char *run_id, *save_id, *program, *layout; /* owned; NULL when absent */
    int world;
    int64_t step;
    int nconfig;
    char **config_names, **config_values; /* owned */
    int nfiles;
    dcp_file *files;
    int nt;
    dcp_tensor *t;     /* sorted by name */
    bool verify;       /* check checksums (NB_TEST_NO_VERIFY=1 turns it off: tests) */
} dcp_source;

/* Parse and validate index text (from path, named in messages) into s (zeroed first):
 * format, fields, every piece within its tensor, and the pieces of every tensor tiling it
 * exactly (no overlap, no gap). NB_EFORMAT naming the path and the tensor. */
nb_status dcp_index_parse(const char *text, size_t n, const char *path, dcp_source *s);
void dcp_source_free(dcp_source *s);
const dcp_tensor *dcp_source_find(const dcp_source *s, const char *name);
/* "0,0+16,16" style text of a box ("off+len" per dim, "/flo+fn"), for file metadata. */
void dcp_box_str(const dcp_box *b, char *out, size_t n);
/* safetensors dtype names */
const char *dcp_dtype_name(nb_dtype dt);
int dcp_dtype_of_name(const char *s); /* -1 if unknown */

/* A piece of one rank's file as the index lists it (rank 0 reads them from the files'
 * metadata: piece.<key>, shape.<key>, checksum.<key>). */
typedef struct dcp_desc {
    char *entry;       /* the tensor's name (owned) */
    char *key;         /* its key in the file (owned) */
    int file;          /* index in the index's file list */
    nb_dtype dtype;
    int ndim;
    int64_t shape[NB_MAX_DIMS];
    dcp_box box;
    uint64_t sum;
} dcp_desc;
typedef struct dcp_index_meta {
    const char *run_id, *save_id, *program, *layout;
    int world;
    int64_t step;
    const char *const *config_names, *const *config_values;
    int nconfig;
} dcp_index_meta;
/* The index text: files[i] written by ranks[i], the pieces d (sorted here, by tensor). NULL
 * + NB_EFORMAT when two pieces of a tensor disagree on its dtype or shape. */
char *dcp_index_text(const dcp_index_meta *m, char *const *files, const int *ranks, int nfiles,
                     dcp_desc *d, int nd, const char *op);

/* ---- saving (dcp_save.c) ------------------------------------------------------------------- */
/* One save's work for this rank: the file it writes (names, tensors, metadata) and, for a
 * sharded save, what the index needs. The tensors are the live views (a synchronous save) or
 * the asynchronous writer's snapshot. */
/* Rank 0's index of a sharded save, to build (from the save's rank files: their pieces'
 * places, shapes and checksums) and write once every rank's file is durable; then the older
 * files of the folder go and the series is rotated. It can run on the asynchronous writer's
 * thread, off the training thread. */
typedef struct dcp_index_job {
    bool pending;       /* something to write */
    char run_id[33], save_id[17], layout[96];
    char *program;      /* owned; NULL when none */
    int nconfig;
    char **config_names, **config_values; /* owned */
    int world;
    int64_t step;
    char dir[4400];
    char base[4096];
    char next_id[17];   /* a later save whose files are being written: kept too */
    char next_dir[4400];/* its folder (a member without an index yet): not rotated away */
    int keep;
} dcp_index_job;
void dcp_index_job_free(dcp_index_job *x);
/* Build and write it (rank 0; local); x is freed. */
nb_status dcp_index_job_run(dcp_index_job *x, const char *op);

typedef struct dcp_job {
    dcp_world w;
    bool sharded;       /* a folder (else one plain file, written by rank 0) */
    bool writes;        /* this rank writes a file */
    nb_status err;      /* this rank could not prepare its file (reported by finish) */
    char errmsg[1024];
    char path[4600];    /* the file this rank writes */
    char dir[4400];     /* sharded: the folder */
    char base[4096];    /* keep > 0: the series */
    int keep;
    int64_t step;
    char save_id[17], run_id[33];
    char *program;      /* owned copies */
    int nconfig;
    char **config_names, **config_values;
    /* the file */
    int n;
    char **names;       /* owned */
    nb_tensor **tensors;/* references (owned) */
    int m;
    char **keys, **vals;/* owned metadata */
    dcp_desc *desc;     /* sharded: per tensor of the file */
    /* an earlier save's index to write before this file (the asynchronous writer, rank 0) */
    dcp_index_job before;
} dcp_job;
void dcp_job_free(dcp_job *j);
/* Collective (one allreduce): plan c, pick the target path (keep > 0: base's series), make
 * the folder (rank 0), agree and take the save's ids, and fill j with this rank's file. With
 * prev (the asynchronous writer's previous save of the same ranks, its write done here with
 * result prev_local) the same allreduce agrees on that save: a failure on any rank is this
 * call's error on every rank (no new save); else rank 0 gets its index in j->before, to
 * write before its next file. A rank that cannot prepare its file after the agreement
 * records it in j->err (dcp_job_write returns it, dcp_job_finish reports it everywhere). */
nb_status dcp_job_begin(const char *path, const nb_checkpoint *c, dcp_job *j, dcp_job *prev,
                        nb_status prev_local, const char *op);
/* Local: j->before's index first, then this rank's file from j's tensors (checksums into the
 * file's metadata; a plain save with keep rotates the series). */
nb_status dcp_job_write(dcp_job *j);
/* Collective: agree on every rank's write (local: this rank's result), then for a sharded
 * save rank 0 builds and writes the index (older files removed, series rotated) and the
 * ranks agree on that. */
nb_status dcp_job_finish(dcp_job *j, nb_status local, const char *op);

/* Remove a checkpoint folder (the index first, then its files and the folder). */
void dcp_remove_folder(const char *dir);
/* Write text to path atomically (temporary file, fsync, rename, directory sync). */
nb_status dcp_write_text(const char *path, const char *text, const char *op);

/* ---- loading (dcp_load.c) ------------------------------------------------------------------ */
/* Open path (a folder with its index, or a plain checkpoint file) as a source. */
nb_status dcp_source_open(const char *path, dcp_source *s, const char *op);
/* Verify every piece of s (latest). */
nb_status dcp_source_verify_all(dcp_source *s, const char *op);
/* The load itself: everything checked and staged first, then applied (collective). */
nb_status dcp_load(const char *path, nb_checkpoint *c, const char *op);
/* A plain checkpoint file (or the model alone) from any source. */
nb_status dcp_consolidate(const char *path, const char *out, bool model_only, const char *op);
/* Whether path is a folder of this format (its index exists). */
bool dcp_is_folder(const char *path);

#endif
