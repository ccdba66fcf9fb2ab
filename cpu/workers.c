/* cpu/workers.c - nabla's own worker threads for the hot parallel loops (the GEMM tiles and
 * the elementwise walk, attention): nb__run_tasks (cpu/cpu_impl.h).
 *
 * Why not an OpenMP region: a region ends in a barrier that waits for every thread of the
 * team, so when another process holds one of the cores, each region waits until the
 * scheduler gets round to the late thread (milliseconds), and libgomp's idle threads spin
 * for milliseconds on the cores the work needs. Under such contention 2 threads ran several
 * times slower than 1 (docs/threads.md has the figures). Here the calling thread takes part
 * and the tasks are claimed one at a time from a shared counter: a worker that the scheduler
 * has not run yet simply finds no task left, and the caller never waits for it. The caller
 * waits only for tasks already claimed and running. Idle workers spin for a short while
 * (about 50 microseconds) and then sleep on a futex.
 *
 * One job at a time: a caller that finds the workers busy (another application thread, or a
 * task that itself runs tasks) runs its tasks on its own thread. Which thread runs a task
 * never changes what the task computes, so results do not depend on the thread count. */
#include <errno.h>
#include <stdio.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu/cpu_impl.h"

#define MAX_WORKERS 255
/* How long an idle worker polls for the next job before it sleeps, and how long a caller
 * polls for its last tasks before it yields its core to them. */
#define SPIN_NS 50000
/* The low half of the job word while the caller rewrites the job: no task can be claimed. */
#define CLOSED 0xFFFFFFFFu

/* The current job. `state` packs the job's generation (high 32 bits) and the next unclaimed
 * task (low 32 bits), so a worker claims a task of exactly the job it read: a claim is a
 * compare-and-swap that fails once the generation moved on. fn, ctx, ntasks and limit are
 * written by the caller only while no task of the previous job is unclaimed or running, and
 * read by workers before their claim, which validates them. */
static _Atomic uint64_t g_state;
static _Atomic(nb__task_fn) g_fn;
static _Atomic(void *) g_ctx;
static atomic_int g_ntasks;
static atomic_int g_limit; /* workers with index >= limit stay out of the job */
static atomic_int g_done;  /* tasks of the current job finished */
static uint32_t g_wake; /* futex word, bumped on every job (accessed with __atomic builtins) */
static atomic_int g_sleepers;

static pthread_mutex_t g_job_lock = PTHREAD_MUTEX_INITIALIZER; /* one job at a time */
static pthread_mutex_t g_grow_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_nworkers;
static _Thread_local bool t_in_task; /* this thread is running a task of a job */
static _Thread_local int t_slot;      /* its slot: 0 for the caller, worker index + 1 */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* True once SPIN_NS have passed since *t0 (set on the first call); checks the clock every
 * 32 polls. */
static bool spun_out(int *polls, int64_t *t0) {
    if ((++*polls & 31) != 0) return false;
    int64_t t = now_ns();
    if (*t0 == 0) *t0 = t;
    return t - *t0 > SPIN_NS;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void futex_wait(uint32_t *w, uint32_t seen) {
    syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
}

static void futex_wake_all(uint32_t *w) {
    syscall(SYS_futex, w, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

bool nb__in_task(void) { return t_in_task; }

int nb__task_slot(void) { return t_slot; }

/* libnabla_ompenv (cpu/ompenv.c) bounds libgomp's spinning from its constructor; this
 * reference keeps the linker from dropping it as unused. */
int nb__ompenv_linked(void);
int (*const nb__ompenv_ref)(void) = nb__ompenv_linked;

/* Claim and run tasks of generation gen until none is left. */
static void run_claimed(uint32_t gen) {
    uint64_t s = atomic_load_explicit(&g_state, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(s >> 32) != gen) return;
        nb__task_fn fn = atomic_load_explicit(&g_fn, memory_order_relaxed);
        void *ctx = atomic_load_explicit(&g_ctx, memory_order_relaxed);
        int64_t n = atomic_load_explicit(&g_ntasks, memory_order_relaxed);
        int64_t i = (int64_t)(uint32_t)s;
        if (i >= n) return;
        if (!atomic_compare_exchange_weak_explicit(&g_state, &s, s + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue; /* s now holds the current word */
        t_in_task = true;
        fn(i, ctx);
        t_in_task = false;
        atomic_fetch_add_explicit(&g_done, 1, memory_order_release);
        s = atomic_load_explicit(&g_state, memory_order_acquire);
    }
}

static void *worker_main(void *arg) {
    int idx = (int)(intptr_t)arg;
    t_slot = idx + 1;
#ifdef _OPENMP
    /* A provider called from a task (oneDNN, OpenBLAS) must run on this thread only. */
    omp_set_num_threads(1);
#endif
    uint32_t seen = __atomic_load_n(&g_wake, __ATOMIC_ACQUIRE);
    for (;;) {
        uint32_t w;
        int polls = 0;
        int64_t t0 = 0;
        while ((w = __atomic_load_n(&g_wake, __ATOMIC_ACQUIRE)) == seen) {
            if (!spun_out(&polls, &t0)) {
                cpu_relax();
                continue;
            }
            atomic_fetch_add(&g_sleepers, 1);
            if (__atomic_load_n(&g_wake, __ATOMIC_SEQ_CST) == seen) futex_wait(&g_wake, seen);
            atomic_fetch_sub(&g_sleepers, 1);
            polls = 0, t0 = 0;
        }
        seen = w;
        uint64_t s = atomic_load_explicit(&g_state, memory_order_acquire);
        if (idx < atomic_load_explicit(&g_limit, memory_order_relaxed)) run_claimed((uint32_t)(s >> 32));
    }
    return NULL;
}

/* Start workers until there are `want` (under g_grow_lock). Returns how many exist. */
static int grow(int want) {
    if (want > MAX_WORKERS) want = MAX_WORKERS;
    pthread_mutex_lock(&g_grow_lock);
    while (g_nworkers < want) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&th, &attr, worker_main, (void *)(intptr_t)g_nworkers);
        pthread_attr_destroy(&attr);
        if (rc != 0) break; /* fewer workers: the caller does more of the tasks */
        g_nworkers++;
    }
    int n = g_nworkers;
    pthread_mutex_unlock(&g_grow_lock);
    return n;
}

static void run_inline(int64_t ntasks, nb__task_fn fn, void *ctx) {
    bool was = t_in_task;
    int slot = t_slot;
    t_in_task = true;
    t_slot = 0;
#ifdef _OPENMP
    int omp_n = omp_get_max_threads();
    omp_set_num_threads(1);
#endif
    for (int64_t i = 0; i < ntasks; i++) fn(i, ctx);
#ifdef _OPENMP
    omp_set_num_threads(omp_n);
#endif
    t_in_task = was;
    t_slot = slot;
}

void nb__run_tasks(int64_t ntasks, int nthreads, nb__task_fn fn, void *ctx) {
    if (ntasks <= 0) return;
    bool nested = t_in_task;
#ifdef _OPENMP
    nested = nested || omp_in_parallel();
#endif
    if (nthreads <= 1 || ntasks == 1 || nested || ntasks > INT32_MAX ||
        pthread_mutex_trylock(&g_job_lock) != 0) {
        run_inline(ntasks, fn, ctx);
        return;
    }
    int nw = grow(nthreads - 1);
    /* Close the previous job's word first: a worker still holding it must not claim a task
     * of this job under the old generation while the fields change. */
    uint64_t gen = (atomic_load(&g_state) >> 32) + 1;
    atomic_store(&g_state, (gen << 32) | CLOSED);
    atomic_store_explicit(&g_fn, fn, memory_order_relaxed);
    atomic_store_explicit(&g_ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&g_ntasks, (int)ntasks, memory_order_relaxed);
    atomic_store_explicit(&g_limit, nthreads - 1 < nw ? nthreads - 1 : nw, memory_order_relaxed);
    atomic_store_explicit(&g_done, 0, memory_order_relaxed);
    atomic_store_explicit(&g_state, gen << 32, memory_order_release);
    __atomic_fetch_add(&g_wake, 1, __ATOMIC_SEQ_CST);
    if (atomic_load(&g_sleepers) > 0) futex_wake_all(&g_wake);

#ifdef _OPENMP
    /* The provider inside a task runs on this thread only, as it does on the workers. */
    int omp_n = omp_get_max_threads();
    omp_set_num_threads(1);
#endif
    run_claimed((uint32_t)gen);
#ifdef _OPENMP
    omp_set_num_threads(omp_n);
#endif
    /* Every task is claimed; wait for those still running on workers. */
    int polls = 0;
    int64_t t0 = 0;
    while (atomic_load_explicit(&g_done, memory_order_acquire) < ntasks) {
        if (!spun_out(&polls, &t0)) cpu_relax();
        else sched_yield();
    }
    pthread_mutex_unlock(&g_job_lock);
}

/* ---- ranges ------------------------------------------------------------------------------ */
typedef struct range_job {
    int64_t n, per;
    nb__range_fn fn;
    void *ctx;
} range_job;

static void range_task(int64_t t, void *p) {
    const range_job *j = p;
    int64_t lo = t * j->per, hi = j->n - lo < j->per ? j->n : lo + j->per;
    j->fn(lo, hi, j->ctx);
}

void nb__parallel_range(int64_t n, int nthreads, nb__range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (nthreads <= 1 || n == 1) { /* on this thread, as slot 0 (per-thread scratch) */
        int slot = t_slot;
        t_slot = 0;
        fn(0, n, ctx);
        t_slot = slot;
        return;
    }
    /* A few pieces per thread: a thread the scheduler runs late takes fewer of them. */
    int64_t pieces = 4 * (int64_t)nthreads < n ? 4 * (int64_t)nthreads : n;
    range_job j = {n, (n + pieces - 1) / pieces, fn, ctx};
    nb__run_tasks((n + j.per - 1) / j.per, nthreads, range_task, &j);
}

/* ---- the first failure of a job's tasks --------------------------------------------------- */
bool nb__task_failed(nb__task_status *ts) {
    return atomic_load_explicit(&ts->failed, memory_order_relaxed) != 0;
}

void nb__task_fail(nb__task_status *ts, nb_status s) {
    if (atomic_exchange(&ts->failed, 1)) return;
    ts->status = s;
    snprintf(ts->msg, sizeof ts->msg, "%s", nb_last_error());
}

nb_status nb__task_result(nb__task_status *ts) {
    if (!atomic_load(&ts->failed)) return NB_OK;
    return nb__error(ts->status, "%s", ts->msg);
}
