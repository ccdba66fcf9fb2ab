/* rules.c - the backward-rule table, generated from the op list in op_table.h.
 *
 * The rule of op NAME is the function nb__bw_NAME, defined next to the op's forward in
 * tensor/ops/ (DESIGN.md rule 1: one op, one place). The references are weak: an op whose
 * rule is not defined (comparisons, argmax, ... which are not differentiable) gets NULL,
 * and never records a node. Because every rule lives in the same object file as its op's
 * public function, linking the op always links its rule too. */
#include "autograd/autograd_impl.h"

#define NB__BW_DECLARE(name, str, arity) \
    extern nb_status nb__bw_##name(nb__node *, nb_tensor *, nb_tensor **) __attribute__((weak));
NB__OPS(NB__BW_DECLARE)
#undef NB__BW_DECLARE

const nb__backward_fn nb__backward_rules[NB__OP_COUNT] = {
#define NB__BW_ENTRY(name, str, arity) [NB__OP_##name] = nb__bw_##name,
    NB__OPS(NB__BW_ENTRY)
#undef NB__BW_ENTRY
};
