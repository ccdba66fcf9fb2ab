/* io/safetensors_impl.h - private to io/safetensors.c (the reader) and
 * io/safetensors_write.c (the writer): the format's dtypes, the checksum metadata's
 * format, and strerror for messages. */
#ifndef NABLA_IO_SAFETENSORS_IMPL_H
#define NABLA_IO_SAFETENSORS_IMPL_H

#include <stdio.h>
#include <string.h>

#include "io/xxh.h"

#include "nabla/tensor.h"

/* The format's byte order is little-endian, and both files copy tensor bytes as they are. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c and safetensors_write.c assume a little-endian host"
#endif

/* Dtypes of the format. Those nabla lacks are still understood (so a file holding them is
 * validated and its other tensors are readable); nb_safetensors_get rejects them. */
typedef struct st_dtype {
    const char *name;
    int size;
    int nb; /* nb_dtype, or -1 */
} st_dtype;

static const st_dtype st_dtypes[] = {
    {"F64", 8, NB_F64},  {"F32", 4, NB_F32},     {"F16", 2, NB_F16},     {"BF16", 2, NB_BF16},
    {"I64", 8, NB_I64},  {"I32", 4, NB_I32},     {"U8", 1, NB_U8},       {"BOOL", 1, NB_BOOL},
    {"I8", 1, -1},       {"I16", 2, -1},         {"U16", 2, -1},         {"U32", 4, -1},
    {"U64", 8, -1},      {"F8_E4M3", 1, -1},     {"F8_E5M2", 1, -1},     {"F8_E8M0", 1, -1},
    {"C64", 8, -1},
};
#define ST_NDTYPES ((int)(sizeof st_dtypes / sizeof st_dtypes[0]))

static inline const char *errno_str(int e, char *buf, size_t n) {
    return strerror_r(e, buf, n); /* GNU variant (the build defines _GNU_SOURCE) */
}
#define ERRNO_STR(e) errno_str((e), (char[128]){0}, 128)

/* Metadata "checksum.<tensor name>" = "xxh3-64:<16 hex digits>": the XXH3 64-bit hash of the
 * tensor's bytes as stored, written by nb__safetensors_save_checked. */
#define SUM_PREFIX "checksum."
#define SUM_ALGO "xxh3-64:"

static inline void format_sum(const void *p, size_t n, char out[sizeof SUM_ALGO + 16]) {
    snprintf(out, sizeof SUM_ALGO + 16, SUM_ALGO "%016llx",
             (unsigned long long)XXH3_64bits(p, n));
}

#endif
