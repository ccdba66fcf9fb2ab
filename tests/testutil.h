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
Suite *nb_suite_cuda_host(void);
Suite *nb_suite_cuda_policy(void);
Suite *nb_suite_autograd(void);
Suite *nb_suite_grad_ops(void);
Suite *nb_suite_grad_reduce(void);
Suite *nb_suite_nn_conv(void);
Suite *nb_suite_nn_layers(void);
Suite *nb_suite_loss(void);
Suite *nb_suite_optim(void);
Suite *nb_suite_train(void);
Suite *nb_suite_checkpoint(void);
Suite *nb_suite_fault(void);
Suite *nb_suite_data(void);
Suite *nb_suite_io(void);
Suite *nb_suite_gpt(void);
Suite *nb_suite_attention(void);
Suite *nb_suite_backend(void);
Suite *nb_suite_run(void);
Suite *nb_suite_trace(void);
Suite *nb_suite_recompute(void);
Suite *nb_suite_scaler(void);
Suite *nb_suite_autocast(void);
Suite *nb_suite_lm_ops(void);
Suite *nb_suite_llama(void);
Suite *nb_suite_options(void);
/* Test cases kept in their own files, added to the suite named first. */
TCase *nb_tcase_norm_devices(void); /* nn_layers: tests/test_nn_devices.c */
TCase *nb_tcase_module_to(void);    /* nn_layers: tests/test_nn_devices.c */
TCase *nb_tcase_optim_devices(void); /* optim: tests/test_optim_devices.c */
TCase *nb_tcase_io_devices(void);    /* io: tests/test_io_devices.c */
void nb_tcases_index_devices(Suite *s); /* index: tests/test_index_devices.c */
TCase *nb_tcase_cuda_conv(void);      /* cuda: tests/test_cuda_conv.c (needs a GPU) */
TCase *nb_tcase_messages(void);       /* errors: tests/test_messages.c */
TCase *nb_tcase_handles(void);        /* errors: tests/test_handles.c */
/* Tests moved out of a long file, added to the TCase their suite gives. */
void nb_tests_data_transforms(TCase *tc); /* data: tests/test_data_transforms.c */
void nb_tests_nn_pool(TCase *tc);         /* nn_conv: tests/test_nn_pool.c */
void nb_tests_optim_clip(TCase *tc);      /* optim: tests/test_optim_clip.c */
void nb_tests_nn_modules(Suite *s);       /* nn_layers: tests/test_nn_modules.c */
void nb_tests_io_state(TCase *tc);        /* io: tests/test_io_state.c */
void nb_tests_sgemm(TCase *tc);           /* matmul: tests/test_sgemm.c */

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
/* tu_random's tensor on the CPU whatever the default device (the reference side of a
 * device-versus-CPU comparison; on the CPU, the same tensor). */
nb_tensor *tu_random_cpu(const int64_t *shape, int ndim, nb_dtype dt, double lo, double hi,
                         uint64_t seed);
/* Fail unless t is a tensor on dev of the given shape and dtype (what names it). */
void tu_expect_on(const nb_tensor *t, nb_device dev, const int64_t *shape, int ndim,
                  nb_dtype dt, const char *what);
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

/* A bad index value: the op failed with status and needle, as on the CPU, or (a device
 * whose kernels run after the op returned: CUDA, docs/cuda.md "Bad indices") it returned
 * a tensor and the next read of it fails so. */
#define tu_assert_index_error(result, status, needle) \
    tu_assert_index_error_at((result), (status), (needle), __FILE__, __LINE__)
void tu_assert_index_error_at(nb_tensor *result, nb_status status, const char *needle,
                              const char *file, int line);

/* An nb_status call failed with status and a message containing needle; succeeded. */
#define ASSERT_ST(expr, status, needle) \
    tu_assert_error_at((expr) != NB_OK, (status), (needle), __FILE__, __LINE__)
#define ASSERT_OK(expr) \
    ck_assert_msg((expr) == NB_OK, "%s failed: %s", #expr, nb_last_error())

/* Files: a fresh directory under /tmp (tu_rm_dir removes it with its files and frees the
 * name), the number of entries in a directory, "dir/name" (malloc'd), and whole-file
 * write/read (tu_read_file's buffer is malloc'd, NUL-terminated, its length in *n). */
char *tu_make_dir(void);
int tu_count_files(const char *dir);
void tu_rm_dir(char *dir);
char *tu_path_in(const char *dir, const char *name);
void tu_write_file(const char *path, const void *buf, size_t n);
unsigned char *tu_read_file(const char *path, size_t *n);

/* t's elements in row-major order in t's own dtype (a raw copy read through nb_read, so it
 * works on any device); caller frees. tu_assert_same_bytes: contiguous a and b of one dtype
 * hold the same bytes. */
void *tu_raw_values(const nb_tensor *t);
void tu_assert_same_bytes(nb_tensor *a, nb_tensor *b);

/* Row-major index helpers for reference loops. */
int64_t tu_numel(const int64_t *shape, int ndim);
/* Unravel linear index i over shape into idx[ndim]. */
void tu_unravel(int64_t i, const int64_t *shape, int ndim, int64_t *idx);

#endif
