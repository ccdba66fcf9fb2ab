/* cpu/cpu_impl.h - private to cpu/: the narrow header CPU kernels include. Kernels see
 * kernel arguments (tensor/kernels.h), never nb_tensor; this header adds the CPU's
 * threading policy (the elementwise walk, grain sizes) and the scalar helpers of the core
 * they use. */
#ifndef NABLA_CPU_IMPL_H
#define NABLA_CPU_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "nabla/status.h"
#include "tensor/backend.h"
#include "tensor/error.h"

/* Scalar load/store of any dtype (tensor/dtype.c). */
double nb__load_f64(const void *p, nb_dtype dt);
void nb__store_f64(void *p, nb_dtype dt, double v);

/* ---- threads --------------------------------------------------------------------------------
 * Number of threads a parallel region over `work` elements should use (1 below 2 * grain,
 * and inside another parallel region). */
#define NB__GRAIN 32768
int nb__threads_for(int64_t work, int64_t grain);

/* nabla's own workers (cpu/workers.c): run fn(i, ctx) for every i in [0, ntasks), on the
 * calling thread and up to nthreads - 1 workers. Tasks are claimed one at a time, so a
 * thread the scheduler runs late gets fewer tasks and never holds the others up (an
 * OpenMP region waits for its slowest thread). Inside a task, or while another thread's job
 * runs, the tasks run on the calling thread in order. A GEMM provider called from a task
 * runs single-threaded. fn must not fail by longjmp; tasks report errors through ctx. */
typedef void (*nb__task_fn)(int64_t task, void *ctx);
void nb__run_tasks(int64_t ntasks, int nthreads, nb__task_fn fn, void *ctx);
/* fn(lo, hi, ctx) over pieces [lo, hi) that cover [0, n) exactly once, on nabla's workers
 * (nb__run_tasks) with up to nthreads threads; with nthreads <= 1, one call fn(0, n, ctx) on
 * this thread. Inside fn, nb__task_slot() is in [0, nthreads) (0 for the direct call). The pieces depend on nthreads, so fn must give each index the same result
 * whichever piece holds it. This replaces `#pragma omp parallel for schedule(static)` in the
 * kernels: an OpenMP region wakes libgomp's threads, which sleep between regions (the
 * passive wait policy, cpu/ompenv.c), and that wake cost tens of microseconds per region. */
typedef void (*nb__range_fn)(int64_t lo, int64_t hi, void *ctx);
void nb__parallel_range(int64_t n, int nthreads, nb__range_fn fn, void *ctx);
/* The first failure among a job's tasks: a task cannot return a status, and its error
 * message is set on the thread that ran it. A task that fails calls nb__task_fail (which
 * keeps the status and message of the first failure only); tasks may skip their work once
 * nb__task_failed; after nb__run_tasks, nb__task_result sets the first failure's error on
 * the calling thread and returns its status (NB_OK if none failed). Zero-initialized means
 * no failure. */
typedef struct nb__task_status {
    _Atomic int failed;
    nb_status status;
    char msg[256];
} nb__task_status;
bool nb__task_failed(nb__task_status *ts);
void nb__task_fail(nb__task_status *ts, nb_status s);
nb_status nb__task_result(nb__task_status *ts);
/* True on a thread that is running a task of nb__run_tasks. */
bool nb__in_task(void);
/* Inside a task: which of the job's threads runs it, 0 .. nthreads - 1 (0 for the calling
 * thread), e.g. to pick a per-thread scratch buffer. */
int nb__task_slot(void);

/* ---- the elementwise walk -------------------------------------------------------------------
 * nb__iter_for_each splits the iterator's linear index range into chunks (one per thread
 * when numel >= grain, else one chunk) and calls fn(ptrs, inner_strides, n, ctx) for runs
 * of the innermost dim; fn processes n elements, advancing each ptrs[i] by
 * inner_strides[i] bytes. Each element is visited exactly once, so results never depend
 * on the thread count. */
typedef void (*nb__iter_fn)(char **ptrs, const int64_t *strides, int64_t n, void *ctx);
void nb__iter_for_each(const nb__iter *it, nb__iter_fn fn, void *ctx, int64_t grain);
/* True if every operand has inner stride == its element size and ndim == 1 (one flat
 * contiguous run per operand). */
bool nb__iter_is_flat(const nb__iter *it);

/* ---- half-precision bulk conversion (tensor/dtype.c) ------------------------------------- */
void nb__f16_to_f32_n(const uint16_t *src, float *dst, int64_t n);
void nb__f32_to_f16_n(const float *src, uint16_t *dst, int64_t n);
void nb__bf16_to_f32_n(const uint16_t *src, float *dst, int64_t n);
void nb__f32_to_bf16_n(const float *src, uint16_t *dst, int64_t n);

#endif
