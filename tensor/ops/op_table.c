/* op_table.c - tables generated from the one op list in op_table.h. */
#include "tensor/op_table.h"

_Static_assert(NB__OP_COUNT == NB__OP_COUNT_EXPECTED,
               "op_table.h changed: update NB__OP_COUNT_EXPECTED and every per-op table");

const char *const nb__op_names[NB__OP_COUNT] = {
#define NB__OP_NAME(name, str, arity) str,
    NB__OPS(NB__OP_NAME)
#undef NB__OP_NAME
};
