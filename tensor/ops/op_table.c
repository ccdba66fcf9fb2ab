/* op_table.c - tables generated from the one op list in op_table.h. */
#include <string.h>

#include "tensor/op_table.h"

_Static_assert(NB__OP_COUNT == NB__OP_COUNT_EXPECTED,
               "op_table.h changed: update NB__OP_COUNT_EXPECTED and every per-op table");

const char *const nb__op_names[NB__OP_COUNT] = {
#define NB__OP_NAME(name, str, arity, grad) str,
    NB__OPS(NB__OP_NAME)
#undef NB__OP_NAME
};

/* Which kernels each op runs (nb_device_supports). Filled per family as ops move behind
 * the kernel table; a test checks every name here is a kernel of tensor/kernels.h. */
#define NB__K0 {NULL}
static const char *const op_kernels[NB__OP_COUNT][4] = {
    [NB__OP_NEG] = {"ew", NULL},
};

const char *const *nb__op_kernels(const char *name) {
    if (!name) return NULL;
    for (int i = 0; i < NB__OP_COUNT; i++)
        if (strcmp(nb__op_names[i], name) == 0) return op_kernels[i];
    return NULL;
}
