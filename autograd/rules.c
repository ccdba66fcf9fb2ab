/* rules.c - the backward-rule table, generated from the op list in op_table.h.
 *
 * The rule of a differentiable op NAME (grad = 1 in the list) is the function nb__bw_NAME,
 * defined next to the op's forward (docs/architecture.md rule 1: one op, one place). Each is
 * declared in tensor/tape.h with its checked prototype and referenced strongly here: a missing rule
 * fails to link.
 * Ops with grad = 0 never record a node and get NULL. */
#include "autograd/autograd_impl.h"

#define NB__BW_ENTRY_1(name) [NB__OP_##name] = nb__bw_##name,
#define NB__BW_ENTRY_0(name)
const nb__backward_fn nb__backward_rules[NB__OP_COUNT] = {
#define NB__BW_ENTRY(name, str, arity, grad) NB__BW_ENTRY_##grad(name)
    NB__OPS(NB__BW_ENTRY)
#undef NB__BW_ENTRY
};
