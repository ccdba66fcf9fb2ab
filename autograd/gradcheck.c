/* autograd/gradcheck.c - compare analytic gradients with central differences in f64.
 *
 * Works on any device with data: the inputs' f64 clones stay on their device, each element
 * is perturbed through a one-element view (nb_fill_, the device's fill kernel), and values
 * and gradients are read back with nb_read. A meta input has no values: NB_EDEVICE. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd_impl.h"
#include "tensor/backend.h"
#include "nabla/random.h"

/* sum(f(x) * r) as a double, or NAN (error set) on failure. */
static double probe(nb_gradcheck_fn f, nb_tensor *const *xs, int n, void *ctx, nb_tensor *r) {
    nb_scope_begin();
    nb_tensor *y = f(xs, n, ctx);
    double v = NAN;
    if (y) {
        nb_tensor *y64 = nb_to_dtype(y, NB_F64);
        nb_tensor *s = nb_sum(nb_mul(y64, r), NULL, 0, false);
        if (s) v = nb_item_f64(s);
    }
    nb_scope_end();
    return v;
}

nb_gradcheck_opts nb_gradcheck_defaults(void) {
    return (nb_gradcheck_opts){
        ._init = NB__OPTS_MARK(nb_gradcheck_opts), .eps = 1e-6, .atol = 1e-5, .rtol = 1e-3};
}

nb_status nb_gradcheck(nb_gradcheck_fn f, nb_tensor *const *inputs, int n, void *ctx,
                       const nb_gradcheck_opts *opts) {
    if (!f) return nb__error(NB_ENULL, "gradcheck: f is NULL");
    if (n < 0 || n > 16 || (n && !inputs))
        return nb__error(NB_EINVAL, "gradcheck: between 0 and 16 inputs, got %d", n);
    if (opts && NB__OPTS_CHECK(opts, nb_gradcheck_opts, "gradcheck", "nb_gradcheck_defaults()",
                               "o.atol = 1e-4") != NB_OK)
        return nb_last_status();
    nb_gradcheck_opts o = opts ? *opts : nb_gradcheck_defaults();
    double eps = o.eps, atol = o.atol, rtol = o.rtol;
    if (!(eps > 0) || !(atol >= 0) || !(rtol >= 0))
        return nb__error(NB_EINVAL, "gradcheck: eps must be > 0 and atol, rtol >= 0, got %g, "
                         "%g, %g (nb_gradcheck_defaults() gives 1e-6, 1e-5, 1e-3)", eps, atol,
                         rtol);
    nb_status st = NB_OK;
    nb_scope_begin();
    nb_tensor *xs[16];
    bool check[16] = {0};
    for (int i = 0; i < n; i++) {
        if (!nb__arg_ok(inputs[i], "gradcheck", "input")) { st = NB_ENULL; goto out; }
        const nb__backend *be = nb__backend_of(nb__device_of(inputs[i]), "gradcheck");
        if (!be) goto fail;
        if (!be->has_storage) {
            st = nb__error(NB_EDEVICE, "gradcheck: input %d is a %s tensor, which has no values "
                           "to perturb", i, be->name);
            goto out;
        }
        check[i] = inputs[i]->requires_grad && nb_dtype_is_float(inputs[i]->dtype);
        if (check[i]) {
            NB_NO_GRAD_BEGIN
            xs[i] = nb_clone(nb_to_dtype(inputs[i], NB_F64));
            NB_NO_GRAD_END
            if (!xs[i] || (st = nb_set_requires_grad(xs[i], true)) != NB_OK) goto fail;
        } else {
            xs[i] = inputs[i];
        }
    }
    /* Analytic: backward of sum(f(x) * r). */
    nb_tensor *y = f(xs, n, ctx);
    if (!y) goto fail;
    nb_generator *gen = nb_generator_new(o.seed ? o.seed : 12345);
    nb_tensor *r = nb_uniform(y->shape, y->ndim, NB_F64, 0.5, 1.5, gen);
    nb_generator_free(gen);
    if (r) r = nb_to_device(r, nb_tensor_device(y)); /* the same values on y's device */
    nb_tensor *loss = r ? nb_sum(nb_mul(nb_to_dtype(y, NB_F64), r), NULL, 0, false) : NULL;
    if (!loss) goto fail;
    if (!loss->requires_grad) {
        st = nb__error(NB_EINVAL, "gradcheck: the output does not depend on any input that "
                       "requires grad");
        goto out;
    }
    if ((st = nb_backward(loss)) != NB_OK) goto out;
    /* Numeric: perturb each element of each checked input. */
    bool prev = nb_set_grad_enabled(false);
    for (int i = 0; i < n && st == NB_OK; i++) {
        if (!check[i]) continue;
        int64_t m = nb_numel(xs[i]);
        double *x = malloc(sizeof(double) * (size_t)(2 * m + 1)), *ana = x ? x + m : NULL;
        nb_tensor *ga = nb_grad(xs[i]), *flat = nb_view(xs[i], &m, 1);
        if (!x) st = nb__error(NB_ENOMEM, "gradcheck: out of memory");
        else if (!flat) st = nb_last_status();
        else if ((st = nb_read(xs[i], x, m, NB_F64)) == NB_OK && ga)
            st = nb_read(ga, ana, m, NB_F64);
        for (int64_t j = 0; j < m && st == NB_OK; j++) {
            double keep = x[j];
            nb_scope_begin();
            nb_tensor *e = nb_narrow(flat, 0, j, 1); /* element j, written in place */
            double fp = NAN, fm = NAN;
            if (e && nb_fill_(e, keep + eps) == NB_OK) fp = probe(f, xs, n, ctx, r);
            if (e && nb_fill_(e, keep - eps) == NB_OK) fm = probe(f, xs, n, ctx, r);
            nb_status rs = e ? nb_fill_(e, keep) : nb_last_status();
            nb_scope_end();
            if (rs != NB_OK) {
                st = rs;
                break;
            }
            if (isnan(fp) || isnan(fm)) {
                st = nb_last_status() != NB_OK ? nb_last_status()
                                               : nb__error(NB_EINVAL, "gradcheck: f is NaN near "
                                                           "input %d element %lld", i, (long long)j);
                break;
            }
            double num = (fp - fm) / (2 * eps);
            double a = ga ? ana[j] : 0.0;
            if (!(fabs(a - num) <= atol + rtol * fabs(num)))
                st = nb__error(NB_EINVAL, "gradcheck: input %d element %lld: analytic gradient "
                               "%.10g, numeric %.10g (atol %g, rtol %g)", i, (long long)j, a,
                               num, atol, rtol);
        }
        free(x);
    }
    nb_set_grad_enabled(prev);
    goto out;
fail:
    st = nb_last_status() != NB_OK ? nb_last_status() : NB_EINTERNAL;
out:
    nb_scope_end();
    return st;
}
