/* init.c - parameter initialization (torch.nn.init): uniform, normal, constants, Xavier
 * (Glorot) and Kaiming (He), with PyTorch's formulas for fans and gains.
 *
 * Fans, as PyTorch computes them for a tensor of at least 2 dims: the receptive field is
 * the product of dims 2.., fan_in = size(1) * receptive field, fan_out = size(0) * receptive
 * field (for a Linear weight (out, in): fan_in = in; for a conv weight (O, C, kh, kw):
 * fan_in = C * kh * kw).
 *
 * Every function writes in place with grad mode off (parameters require grad), draws from
 * gen (NULL: the thread's default generator) with the same Philox stream as nb_uniform /
 * nb_normal, and leaves a zero-element tensor untouched (PyTorch warns and does nothing).
 * The writes go through nb_uniform_ / nb_normal_ / nb_fill_, which bump the tensor's
 * version: a graph that saved it refuses to backpropagate (docs/autograd.md).
 *
 * The draws are the in-place fills nb_uniform_ / nb_normal_ (tensor/random.c), which run
 * the random kernel of the tensor's own device: initializing a model on the meta device
 * computes nothing (the generator still advances, so streams stay aligned), and no value
 * of any device's tensor passes through the host. */
#include <math.h>

#include "tensor/tape.h"
#include "nabla/nn.h"
#include "nabla/random.h"

static nb_status check_target(nb_tensor *t, const char *op) {
    if (!nb__arg_ok(t, op, "t")) return nb_last_status();
    if (!nb_dtype_is_float(t->dtype))
        return nb__error(NB_EDTYPE, "%s: only float tensors can be initialized this way, not %s",
                         op, nb_dtype_name(t->dtype));
    return NB_OK;
}

nb_status nb_init_uniform_(nb_tensor *t, double lo, double hi, nb_generator *gen) {
    nb_status st = check_target(t, "init_uniform_");
    if (st != NB_OK || nb_numel(t) == 0) return st;
    bool prev = nb_set_grad_enabled(false);
    st = nb_uniform_(t, lo, hi, gen);
    nb_set_grad_enabled(prev);
    return st;
}

nb_status nb_init_normal_(nb_tensor *t, double mean, double std, nb_generator *gen) {
    nb_status st = check_target(t, "init_normal_");
    if (st != NB_OK || nb_numel(t) == 0) return st;
    bool prev = nb_set_grad_enabled(false);
    st = nb_normal_(t, mean, std, gen);
    nb_set_grad_enabled(prev);
    return st;
}

/* Constants work for any dtype (e.g. zeroing an integer buffer), as PyTorch's constant_. */
nb_status nb_init_constant_(nb_tensor *t, double v) {
    if (!nb__arg_ok(t, "init_constant_", "t")) return nb_last_status();
    nb_status st;
    bool prev = nb_set_grad_enabled(false);
    st = nb_fill_(t, v);
    nb_set_grad_enabled(prev);
    return st;
}

nb_status nb_init_zeros_(nb_tensor *t) { return nb_init_constant_(t, 0.0); }
nb_status nb_init_ones_(nb_tensor *t) { return nb_init_constant_(t, 1.0); }

double nb_init_calculate_gain(nb_nonlinearity nl, double param) {
    switch (nl) {
    case NB_NONLIN_LINEAR:
    case NB_NONLIN_SIGMOID: return 1.0;
    case NB_NONLIN_TANH: return 5.0 / 3.0;
    case NB_NONLIN_RELU: return sqrt(2.0);
    /* param is the negative slope, taken as given: PyTorch's default when it is omitted
     * is 0.01, and kaiming_* pass their `a` (0 by default, which gives sqrt(2)). */
    case NB_NONLIN_LEAKY_RELU: return sqrt(2.0 / (1.0 + param * param));
    }
    nb__error(NB_EINVAL, "init_calculate_gain: unknown nonlinearity %d", (int)nl);
    return NAN;
}

static nb_status fans(const nb_tensor *t, const char *op, double *fan_in, double *fan_out) {
    if (t->ndim < 2)
        return nb__error(NB_ESHAPE, "%s: fan in and fan out need a tensor of at least 2 dims, "
                         "got shape %s", op, NB__SHAPE(t));
    double rf = 1;
    for (int d = 2; d < t->ndim; d++) rf *= (double)t->shape[d];
    *fan_in = (double)t->shape[1] * rf;
    *fan_out = (double)t->shape[0] * rf;
    return NB_OK;
}

nb_status nb_init_xavier_uniform_(nb_tensor *t, double gain, nb_generator *gen) {
    const char *op = "init_xavier_uniform_";
    double fi = 0, fo = 0;
    nb_status st = check_target(t, op);
    if (st != NB_OK || (st = fans(t, op, &fi, &fo)) != NB_OK || nb_numel(t) == 0) return st;
    double a = sqrt(3.0) * gain * sqrt(2.0 / (fi + fo));
    return nb_init_uniform_(t, -a, a, gen);
}

nb_status nb_init_xavier_normal_(nb_tensor *t, double gain, nb_generator *gen) {
    const char *op = "init_xavier_normal_";
    double fi = 0, fo = 0;
    nb_status st = check_target(t, op);
    if (st != NB_OK || (st = fans(t, op, &fi, &fo)) != NB_OK || nb_numel(t) == 0) return st;
    return nb_init_normal_(t, 0.0, gain * sqrt(2.0 / (fi + fo)), gen);
}

/* std = gain(nl, a) / sqrt(fan), fan_in or fan_out as chosen. */
static nb_status kaiming_std(nb_tensor *t, double a, bool fan_out, nb_nonlinearity nl,
                             const char *op, double *std) {
    double fi = 0, fo = 0;
    nb_status st = check_target(t, op);
    if (st != NB_OK || (st = fans(t, op, &fi, &fo)) != NB_OK) return st;
    if ((unsigned)nl > NB_NONLIN_SIGMOID)
        return nb__error(NB_EINVAL, "%s: unknown nonlinearity %d", op, (int)nl);
    double gain = nb_init_calculate_gain(nl, a), fan = fan_out ? fo : fi;
    *std = fan > 0 ? gain / sqrt(fan) : 0.0;
    return NB_OK;
}

nb_status nb_init_kaiming_uniform_(nb_tensor *t, double a, bool fan_out, nb_nonlinearity nl,
                                   nb_generator *gen) {
    double std = 0;
    nb_status st = kaiming_std(t, a, fan_out, nl, "init_kaiming_uniform_", &std);
    if (st != NB_OK || nb_numel(t) == 0) return st;
    double bound = sqrt(3.0) * std;
    return nb_init_uniform_(t, -bound, bound, gen);
}

nb_status nb_init_kaiming_normal_(nb_tensor *t, double a, bool fan_out, nb_nonlinearity nl,
                                  nb_generator *gen) {
    double std = 0;
    nb_status st = kaiming_std(t, a, fan_out, nl, "init_kaiming_normal_", &std);
    if (st != NB_OK || nb_numel(t) == 0) return st;
    return nb_init_normal_(t, 0.0, std, gen);
}
