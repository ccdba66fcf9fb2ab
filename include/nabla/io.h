/* nabla/io.h - safetensors files, and module state dicts stored in them.
 *
 * Usage:
 *     // a model's parameters and buffers under PyTorch-style names ("0.weight", "0.bias", ...)
 *     if (nb_module_save(model, "model.safetensors") != NB_OK) puts(nb_last_error());
 *     if (nb_module_load(model, "model.safetensors", true) != NB_OK)   // strict: names match
 *         puts(nb_last_error());   // module_load: model.safetensors has no tensor "2.bias"
 *
 *     // any safetensors file, e.g. one written by PyTorch's safetensors package
 *     nb_safetensors *f = nb_safetensors_open("weights.safetensors");
 *     if (!f) { puts(nb_last_error()); return; }
 *     for (int i = 0; i < nb_safetensors_count(f); i++) puts(nb_safetensors_name(f, i));
 *     nb_tensor *w = nb_safetensors_get(f, "wte.weight");  // no copy: views the mapped file
 *     nb_safetensors_close(f);                             // w stays valid
 *
 *     // writing named tensors (atomically: the old file stays until the new one is complete)
 *     const char *names[] = {"w", "b"};
 *     nb_tensor *ts[] = {w, b};
 *     nb_safetensors_save("out.safetensors", names, ts, 2, NULL, NULL, 0);
 *
 * Format: https://github.com/huggingface/safetensors ("8-byte little-endian header length N,
 * N bytes of JSON, then the data"), dtypes F64 F32 F16 BF16 I64 I32 U8 BOOL. Files written
 * here are laid out exactly as the reference writer lays them out; the reader validates the
 * whole header before anything is used and answers a bad file with NB_EFORMAT (an unreadable
 * one with NB_EIO), naming the file. docs/io.md has the details.
 *
 * Ownership: nb_safetensors_open returns a handle the caller releases with
 * nb_safetensors_close. Strings it returns (names, metadata) belong to the handle and are
 * valid until it is closed. Tensors it returns are new references with the usual scope rules
 * (nabla/tensor.h) and stay valid after the handle is closed: nb_safetensors_get returns a
 * tensor over the memory-mapped file (the mapping lives until the last such tensor and the
 * handle are gone). Such tensors are copy-on-write: writing to one never reaches the file,
 * but is seen by other tensors got for the same name from the same handle; use
 * nb_safetensors_get_copy for a tensor of your own. If another program truncates the file
 * while it is mapped, reading a mapped tensor faults (SIGBUS) - nabla's own writer replaces
 * files by rename, which never does that. An nb_state_list owns copies of its names and a
 * reference to each tensor; nb_state_list_deinit releases them.
 *
 * Threads: a handle may be used from several threads at once (it is read only after open). */
#ifndef NABLA_IO_H
#define NABLA_IO_H

#include <stdbool.h>
#include <stdint.h>

#include "nabla/nn.h"
#include "nabla/status.h"
#include "nabla/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- reading -------------------------------------------------------------------------------- */
typedef struct nb_safetensors nb_safetensors;

/* Open and validate a file (the whole header: JSON, dtypes, shapes, offsets that tile the
 * data exactly). NULL + NB_EIO / NB_EFORMAT on failure. */
nb_safetensors *nb_safetensors_open(const char *path);
/* Release the handle; tensors already obtained stay valid. NULL is a no-op. */
void nb_safetensors_close(nb_safetensors *f);
const char *nb_safetensors_path(const nb_safetensors *f);

/* Tensors, in the order of their data in the file. */
int nb_safetensors_count(const nb_safetensors *f);
const char *nb_safetensors_name(const nb_safetensors *f, int i);   /* NULL if i is out of range */
/* Index of a tensor by name, or -1 (no error is set) when the file has none of that name. */
int nb_safetensors_find(const nb_safetensors *f, const char *name);

/* What the header says about a tensor, without reading its data. */
typedef struct nb_safetensors_info {
    const char *name;         /* owned by the handle */
    const char *dtype_name;   /* as in the file: "F32", "BF16", "I8", ... */
    nb_dtype dtype;           /* the nabla dtype (meaningful when supported) */
    bool supported;           /* nabla has the dtype and the tensor has <= NB_MAX_DIMS dims */
    int ndim;                 /* may exceed NB_MAX_DIMS; shape then holds the first ones */
    int64_t shape[NB_MAX_DIMS];
    uint64_t data_begin, data_end; /* bytes, relative to the data after the header */
} nb_safetensors_info;
nb_status nb_safetensors_info_at(const nb_safetensors *f, int i, nb_safetensors_info *out);

/* The tensor of that name: a new reference over the mapped file (a copy instead when its
 * data is not aligned to its element size, or for BOOL data holding bytes other than 0/1,
 * which are read as true). NULL + error if absent (NB_EINVAL), of a dtype nabla lacks
 * (NB_EDTYPE) or with more than NB_MAX_DIMS dims (NB_EUNSUPPORTED). */
nb_tensor *nb_safetensors_get(nb_safetensors *f, const char *name);
/* The same as a tensor with its own (contiguous, 64-byte aligned) storage. */
nb_tensor *nb_safetensors_get_copy(nb_safetensors *f, const char *name);

/* The "__metadata__" string map: value of key, or NULL (no error is set) if absent. */
const char *nb_safetensors_metadata(const nb_safetensors *f, const char *key);
int nb_safetensors_metadata_count(const nb_safetensors *f);
const char *nb_safetensors_metadata_key(const nb_safetensors *f, int i); /* NULL if out of range */
/* Check the tensors' checksums: every tensor with a metadata entry "checksum.<name>" =
 * "xxh3-64:<16 hex digits>" (nb_checkpoint_save writes one per tensor) is hashed (XXH3,
 * 64 bits, over its bytes as stored) and compared. NB_EFORMAT naming the file, the tensor
 * and both hashes on a mismatch ("... is corrupt: the bytes of tensor \"model.w\" hash to
 * ..."); *checked (may be NULL) is the number of tensors checked (0: a file without
 * checksums, which passes). Reads every checksummed byte of the file. */
nb_status nb_safetensors_verify(nb_safetensors *f, int *checked);

/* ---- writing -------------------------------------------------------------------------------- */
/* Write n named CPU tensors (any dtype, any strides) and nmeta metadata pairs (meta_keys /
 * meta_values may be NULL when nmeta is 0) to path. Names must be distinct, valid UTF-8 and
 * not "__metadata__". The layout is the reference writer's: tensors ordered by dtype (8-byte
 * types first, so every tensor is aligned to its element size) and then by name, the JSON
 * header compact and padded with spaces to a multiple of 8 bytes, metadata keys in the order
 * given. Atomic: the data goes to a temporary file in the same directory, which is synced
 * and then renamed over path, so a failure (NB_EIO) leaves any old file untouched and no
 * temporary file behind. path must be a regular file or missing (a symbolic link counts as
 * its target): a directory, device node, FIFO or socket is refused (NB_EIO) and left as it
 * is, since the rename would replace it with a regular file. Temporary files of path that
 * writers killed during a save left behind (path.tmp-PID-N whose process no longer runs and
 * which no one holds locked) are removed first, with one line on stderr saying how many. */
nb_status nb_safetensors_save(const char *path, const char *const *names,
                              nb_tensor *const *tensors, int n, const char *const *meta_keys,
                              const char *const *meta_values, int nmeta);

/* ---- named tensor lists (state dicts) ------------------------------------------------------- */
/* A growable list of (name, tensor) pairs for building and reading state dicts, e.g. for a
 * checkpoint holding a model under "model." and an optimizer under "optim.":
 *     nb_state_list l = {0};
 *     nb_state_list_add_module(&l, "model.", model);
 *     nb_state_list_add_params(&l, "optim.", nb_optim_state(opt));
 *     nb_safetensors_save(path, l.names, l.tensors, l.count, NULL, NULL, 0);
 *     nb_state_list_deinit(&l);
 * and back:
 *     nb_module_load_from(model, f, "model.", true);
 *     nb_state_list_add_file(&l, f, "optim.");     // names with the prefix stripped
 *     nb_optim_load_state(opt, l.names, l.tensors, l.count);
 * Zero-initialize it (or nb_state_list_init); release it with nb_state_list_deinit. */
typedef struct nb_state_list {
    int count, cap;
    const char **names;  /* owned copies */
    nb_tensor **tensors; /* references owned by the list */
} nb_state_list;

void nb_state_list_init(nb_state_list *l);
void nb_state_list_deinit(nb_state_list *l);
/* Append prefix + name (prefix may be NULL) with a new reference to t. */
nb_status nb_state_list_add(nb_state_list *l, const char *prefix, const char *name, nb_tensor *t);
/* Append every tensor of a named list (e.g. nb_optim_state), names prefixed. */
nb_status nb_state_list_add_params(nb_state_list *l, const char *prefix, const nb_params *p);
/* Append a module's parameters, then its buffers, under their dotted names, prefixed. */
nb_status nb_state_list_add_module(nb_state_list *l, const char *prefix, nb_module *m);
/* Append every tensor of the file whose name starts with prefix (NULL or "": all of them),
 * with the prefix stripped, as nb_safetensors_get gives them (views of the mapped file). */
nb_status nb_state_list_add_file(nb_state_list *l, nb_safetensors *f, const char *prefix);

/* Copy values from a file into n existing tensors: tensors[i] gets the file's tensor
 * prefix + names[i] (prefix may be NULL). Shapes must match (NB_ESHAPE, naming both); the
 * dtype is converted as needed (a BF16 file loads into F32 tensors, as PyTorch's
 * load_state_dict converts). strict: every name must be in the file, and the file must hold
 * no other tensor starting with prefix (NB_EINVAL); not strict: missing and unexpected
 * names are ignored. Everything is checked before anything is written, so on error no
 * tensor has changed. Runs with grad mode off (the tensors may be parameters). */
nb_status nb_state_load(nb_safetensors *f, const char *prefix, const char *const *names,
                        nb_tensor *const *tensors, int n, bool strict);

/* ---- modules -------------------------------------------------------------------------------- */
/* Save a module's parameters and buffers under their dotted names ("layers.0.weight"), as
 * PyTorch's state_dict does, with metadata {"format": "pt"} as safetensors.torch writes. */
nb_status nb_module_save(nb_module *m, const char *path);
/* Load values into the module's existing parameters and buffers (nb_state_load's rules:
 * shapes checked, dtypes converted, strict or not, nothing changed on error). */
nb_status nb_module_load(nb_module *m, const char *path, bool strict);
/* The same from an open file, for tensors named prefix + dotted name (prefix may be NULL). */
nb_status nb_module_load_from(nb_module *m, nb_safetensors *f, const char *prefix, bool strict);

#ifdef __cplusplus
}
#endif
#endif
