/* tensor/tape.h - private: the autograd tape, part of the core. An op definition records
 * itself after computing its output:
 *     nb__node *nd = nb__record(out, NB__OP_MUL, (nb_tensor *[]){a, b}, 2);
 *     if (nd) { nb__save(nd, 0, a); nb__save(nd, 1, b); }
 * nb__record returns NULL (and records nothing) when grad mode is off or no input requires
 * grad. The op's backward rule, nb__backward_rules[NB__OP_MUL] (autograd/rules.c), later
 * gets the node and d(loss)/d(out) and writes one gradient per input (NULL where an input
 * needs none); the engine then sums each gradient to its input's shape (undoing
 * broadcasting) and converts it to the input's dtype, so rules may return the broadcast
 * shape and compute dtype. */
#ifndef NABLA_TENSOR_TAPE_H
#define NABLA_TENSOR_TAPE_H

#include "nabla/autograd.h"
#include "tensor/tensor_impl.h"

#define NB__NODE_MAX_SAVED 4

typedef struct nb__node nb__node;

/* Where the gradient of one input goes. */
typedef struct nb__edge {
    nb__node *node;   /* the input's producer, or NULL */
    nb_tensor *leaf;  /* the input itself if it is a leaf that requires grad, or NULL */
    int ndim;
    nb_dtype dtype;
    int64_t shape[NB_MAX_DIMS];
} nb__edge;

/* Op attributes a backward rule may need (set by the op after nb__record). */
typedef struct nb__attrs {
    double f[4];
    int64_t i[NB_MAX_DIMS + 4];
    int ni;
    bool flag;
} nb__attrs;

/* A function run just before a node's backward rule (autograd/engine.c registers them with
 * nb__register_pre_backward_hook; nb__node_release frees the list). */
typedef nb_status (*nb__pre_backward_fn)(void *ctx);
typedef struct nb__node_hook {
    struct nb__node_hook *next;
    nb__pre_backward_fn fn;
    void *ctx;
} nb__node_hook;

struct nb__node {
    atomic_long refcount;
    nb__op op;
    uint64_t seq;        /* creation order: backward runs latest first */
    int ninputs;
    nb__edge *edges;     /* ninputs entries */
    nb_tensor *saved[NB__NODE_MAX_SAVED];
    /* the storage version of each saved tensor when it was saved: the engine refuses to run
     * the rule when a saved tensor was written in place since */
    uint64_t saved_version[NB__NODE_MAX_SAVED];
    nb__attrs attrs;
    /* op state beyond saved[] (NB__OP_RECOMPUTE: the function, its saved inputs and the
     * generators' states, autograd/recompute.c), freed by ext_free with the saved tensors;
     * NULL for every other op */
    void *ext;
    void (*ext_free)(void *ext);
    bool released;       /* saved tensors freed by a backward without retain_graph */
    /* engine scratch, valid during one backward */
    uint64_t epoch;
    int deps;
    nb_tensor *grad;
    /* output geometry (for a zero gradient when nothing flowed in) */
    int out_ndim;
    nb_dtype out_dtype;
    int64_t out_shape[NB_MAX_DIMS];
    /* pre-backward hooks (autograd/engine.c, nb__register_pre_backward_hook), or NULL */
    nb__node_hook *pre_hooks;
};

/* A backward rule: write ninputs gradients (new references in the current scope, or NULL)
 * into gin. Runs with grad mode off. Returns NB_OK or an error status. */
typedef nb_status (*nb__backward_fn)(nb__node *n, nb_tensor *gout, nb_tensor **gin);
extern const nb__backward_fn nb__backward_rules[NB__OP_COUNT];

/* Record op on out (see above). Inputs may be NULL (skipped). Sets out->requires_grad. */
nb__node *nb__record(nb_tensor *out, nb__op op, nb_tensor *const *inputs, int n);
/* Save t (a detached view sharing storage, so saving an output makes no cycle), with its
 * storage's version: backward fails if t is written in place before the rule runs. */
void nb__save(nb__node *n, int slot, nb_tensor *t);
/* Whether an op over these inputs would record (grad mode on, some input requires grad). */
bool nb__needs_grad(nb_tensor *const *inputs, int n);
/* Drop one reference to a node (tensor.c calls this when a result dies). */
void nb__node_release(nb__node *n);
/* Free a tensor's autograd metadata (hooks). */
void nb__ag_meta_free(struct nb__ag_meta *m);
/* False (and NB_EINVAL) if writing into t in place would break autograd. */
bool nb__inplace_ok(const nb_tensor *t, const char *op);
/* The backward rule of every differentiable op (grad = 1 in tensor/op_table.h), defined
 * next to the op's forward; declared here so each definition is checked against this
 * prototype, and referenced by autograd/rules.c so a missing rule fails to link. */
#define NB__BW_DECL_1(name) nb_status nb__bw_##name(nb__node *n, nb_tensor *g, nb_tensor **gin);
#define NB__BW_DECL_0(name)
#define NB__BW_DECLARE(name, str, arity, grad) NB__BW_DECL_##grad(name)
NB__OPS(NB__BW_DECLARE)
#undef NB__BW_DECLARE

/* Free a node's saved tensors and ext (a backward without retain_graph). */
void nb__node_release_saved(nb__node *n);

/* Leaf collection (activation checkpointing): while a collector is set on this thread,
 * nb__needs_grad with grad mode off adds each input that is a leaf requiring grad to it
 * (once), so a function run without recording still tells which parameters it read (and
 * notes a non-leaf requiring grad it read that is not one of set->skip).
 * nb__collect_begin returns the previous collector, to be restored by nb__collect_end. */
typedef struct nb__leaf_set {
    nb_tensor **items; /* borrowed */
    int n, cap;
    bool failed;       /* out of memory while adding */
    /* tensors not to note (the function's inputs), and the first tensor requiring grad
     * that was read but is not a leaf and not among them (NULL if none) */
    nb_tensor *const *skip;
    int nskip;
    nb_tensor *nonleaf;
} nb__leaf_set;
nb__leaf_set *nb__collect_begin(nb__leaf_set *set);
void nb__collect_end(nb__leaf_set *prev);

#endif
