/* tensor/kernels/loss.h - private: arguments of the loss kernels (cross entropy, NLL, binary
 * cross entropy with logits; forward and backward). C17 and nvcc; included through
 * tensor/kernels.h.
 *
 * The op definitions (nn/loss.c) check arguments, shapes and dtypes, make the operands
 * contiguous and allocate every output. What depends on the data is the kernels' job: they
 * validate the class-index targets (returning NB_EINDEX with the op's message before
 * computing anything), count the targets that are not ignored, reduce the losses (sums in
 * f64, in an order that depends only on the sizes) and write the reduced value into the
 * output. The host never reads any of it back. */
#ifndef NABLA_TENSOR_KERNELS_LOSS_H
#define NABLA_TENSOR_KERNELS_LOSS_H

/* The reduction of a loss (the same values as the public nb_reduction). */
typedef enum nb__loss_reduce {
    NB__LOSS_MEAN = 0, /* sum / count: a mean over nothing is NaN (0 / 0), as in PyTorch */
    NB__LOSS_SUM = 1,
    NB__LOSS_NONE = 2  /* one loss per position (element) */
} nb__loss_reduce;

/* ---- class-index losses (cross_entropy, nll_loss) -------------------------------------------
 * The scores x are a contiguous (N, C, D) array (D: the product of the dims after the class
 * dim, 1 for (N, C) input) of dtype xdt (f32, f64, f16, bf16); target is a contiguous
 * (N, D) array of NB_I32/NB_I64 class indices. Position p = n * D + d. A target must be in
 * [0, C) or, with has_ignore, equal ignore_index (that position contributes nothing and is
 * not counted). */
typedef struct nb__cls_operands {
    const char *x;
    nb_dtype xdt;
    int64_t N, C, D;
    const void *target;
    nb_dtype tdt;
    bool has_ignore;
    int64_t ignore_index;
    double smoothing; /* label smoothing in [0, 1] (cross entropy only; 0 for NLL) */
} nb__cls_operands;

/* cross_entropy / nll_loss forward. Cross entropy: loss[p] = (1 - s) * (lse - x_t) +
 * s * (lse - mean_c x_c), with lse the log-sum-exp over the C classes; NLL: loss[p] = -x_t
 * (0 at ignored positions).
 *   out: reduction NONE: (N*D) elements of xdt; SUM / MEAN: one element of xdt (the sum
 *        over positions, or the sum / count).
 *   lse: cross_entropy only: (N*D) log-sum-exps saved for the backward, NB_F32 (NB_F64
 *        for f64 scores), 0 at ignored positions.
 *   count: may be NULL; else one NB_I64 element receiving the number of positions that
 *        are not ignored (the backward of a mean divides by it).
 * An out-of-range target: NB_EINDEX "<op>: target T is out of range for C classes" (the
 * first such in position order), nothing written. */
typedef struct nb__cls_loss_args {
    const char *op; /* "cross_entropy" or "nll_loss": the prefix of the error message */
    nb__cls_operands in;
    nb__loss_reduce reduction;
    void *out;
    void *lse;
    int64_t *count;
} nb__cls_loss_args;

/* cross_entropy_backward / nll_loss_backward: dx (N, C, D) of xdt, fully written.
 * With G = factor * g[p] (g[0] for SUM / MEAN) and factor = 1 / count for MEAN (0 when
 * count is 0: every position is ignored then), 1 otherwise:
 *   cross entropy: dx = (softmax(x) - (1 - s) * onehot(t) - s / C) * G, 0 at ignored p;
 *   NLL: dx = 0 except dx[n, t, d] = -G at positions not ignored.
 * Targets are those the forward validated. */
typedef struct nb__cls_loss_backward_args {
    nb__cls_operands in;
    nb__loss_reduce reduction;
    const void *lse;      /* cross_entropy_backward: as written by the forward */
    const int64_t *count; /* MEAN: as written by the forward */
    const double *g;      /* NONE: (N*D) f64 upstream gradients; SUM / MEAN: one f64 */
    void *dx;
} nb__cls_loss_backward_args;

/* ---- binary cross entropy with logits -------------------------------------------------------
 * n elements; x, y contiguous arrays of the compute dtype ct (NB_F32 or NB_F64); pw (may be
 * NULL) is read as pw[i % pw_period]. loss_i = (1 - y) x + (1 + (pw - 1) y) softplus(-x),
 * computed without overflow. */
typedef struct nb__bce_operands {
    const char *x, *y, *pw;
    nb_dtype ct;
    int64_t n, pw_period;
} nb__bce_operands;

/* bce_with_logits forward. out: reduction NONE: n elements of ct (out_dt == ct);
 * SUM / MEAN: one element of out_dt (the sum, or sum / n). */
typedef struct nb__bce_args {
    nb__bce_operands in;
    nb__loss_reduce reduction;
    void *out;
    nb_dtype out_dt;
} nb__bce_args;

/* bce_with_logits_backward: with G = factor * g[i * gstride] (g of dtype ct), each of dx,
 * dy, dpw that is not NULL (n elements of ct) gets
 *   dx  = G ((1 - y) - (1 + (pw - 1) y) sigmoid(-x)),
 *   dy  = G (-x + (pw - 1) softplus(-x)),
 *   dpw = G y softplus(-x)  (per element; autograd sums it to pw's shape). */
typedef struct nb__bce_backward_args {
    nb__bce_operands in;
    const char *g;
    int64_t gstride; /* 1 (reduction NONE) or 0 */
    double factor;   /* 1 / n for MEAN, else 1 */
    char *dx, *dy, *dpw;
} nb__bce_backward_args;

#define NB__K_LOSS(X)                                                                      \
    X(cross_entropy, nb__cls_loss_args, "fused log-softmax + NLL, validated, reduced")     \
    X(cross_entropy_backward, nb__cls_loss_backward_args, "cross entropy input gradient")  \
    X(nll_loss, nb__cls_loss_args, "negative log likelihood, validated, reduced")          \
    X(nll_loss_backward, nb__cls_loss_backward_args, "NLL input gradient")                 \
    X(bce_with_logits, nb__bce_args, "binary cross entropy with logits, reduced")          \
    X(bce_with_logits_backward, nb__bce_backward_args, "BCE with logits gradients")

#endif
