/* testutil.h - shared helpers for the Check suites: building tensors from double arrays,
 * comparing against double-precision references, non-contiguous and broadcast inputs. */
#ifndef NABLA_TESTUTIL_H
#define NABLA_TESTUTIL_H

#include <check.h>
#include <math.h>

#include "nabla/nabla.h"
#include "tensor/tensor_impl.h"

/* Suites, one per module (tests/main.c runs them all; NB_SUITE=name runs one). */
Suite *nb_suite_core(void);
Suite *nb_suite_memory(void);
Suite *nb_suite_errors(void);
Suite *nb_suite_dtype(void);
Suite *nb_suite_random(void);
Suite *nb_suite_elementwise(void);
Suite *nb_suite_reduce(void);
Suite *nb_suite_matmul(void);
Suite *nb_suite_index(void);
Suite *nb_suite_cuda(void);
Suite *nb_suite_autograd(void);
Suite *nb_suite_grad_ops(void);
Suite *nb_suite_grad_reduce(void);
Suite *nb_suite_nn_conv(void);
Suite *nb_suite_nn_layers(void);
Suite *nb_suite_loss(void);
Suite *nb_suite_optim(void);
Suite *nb_suite_train(void);
Suite *nb_suite_checkpoint(void);
Suite *nb_suite_data(void);
Suite *nb_suite_io(void);
Suite *nb_suite_gpt(void);
Suite *nb_suite_attention(void);
Suite *nb_suite_backend(void);

/* A tensor of dtype dt holding vals (converted), shape[ndim]; registered in the scope. */
nb_tensor *tu_tensor(const double *vals, const int64_t *shape, int ndim, nb_dtype dt);
/* Deterministic pseudo-random doubles in [lo, hi) into out[n] (seeded LCG; test data). */
void tu_fill_uniform(double *out, int64_t n, double lo, double hi, uint64_t seed);
/* A random tensor of shape and dtype (uniform [lo, hi), integers rounded for int dtypes). */
nb_tensor *tu_random(const int64_t *shape, int ndim, nb_dtype dt, double lo, double hi,
                     uint64_t seed);
/* The same values as a non-contiguous tensor: stored transposed in its last two dims (for
 * ndim >= 2) or with stride 2 (ndim 1), then viewed back to shape. */
nb_tensor *tu_noncontig(nb_tensor *t);
/* Elements of t in logical row-major order as doubles; caller frees with free(). */
double *tu_values(const nb_tensor *t);
/* Tolerance for comparing a result of dtype dt with a double reference. */
double tu_tol(nb_dtype dt);
/* Check t has shape[ndim] and matches ref within |x - r| <= tol * (1 + |r|); NaN matches
 * NaN, infinities must match exactly. Fails the current test with the first bad index. */
#define tu_assert_close(t, ref, shape, ndim, tol) \
    tu_assert_close_at((t), (ref), (shape), (ndim), (tol), __FILE__, __LINE__)
void tu_assert_close_at(const nb_tensor *t, const double *ref, const int64_t *shape,
                        int ndim, double tol, const char *file, int line);
/* Check that an op failed: result NULL, the given status, and the message contains needle. */
#define tu_assert_error(result, status, needle) \
    tu_assert_error_at((result) == NULL, (status), (needle), __FILE__, __LINE__)
void tu_assert_error_at(bool failed, nb_status status, const char *needle,
                        const char *file, int line);

/* Row-major index helpers for reference loops. */
int64_t tu_numel(const int64_t *shape, int ndim);
/* Unravel linear index i over shape into idx[ndim]. */
void tu_unravel(int64_t i, const int64_t *shape, int ndim, int64_t *idx);

#endif
