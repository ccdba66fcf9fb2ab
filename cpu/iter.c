/* cpu/iter.c - the CPU's threading policy for elementwise work: nb__iter_for_each hands
 * out [begin, end) ranges of an iterator's linear index, one per OpenMP thread, and walks
 * each range row by row. */
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu/cpu_impl.h"

bool nb__iter_is_flat(const nb__iter *it) {
    if (it->ndim != 1) return false;
    for (int a = 0; a < it->nargs; a++)
        if (it->strides[a][0] != (int64_t)nb_dtype_size(it->dtype[a])) return false;
    return true;
}

int nb__threads_for(int64_t work, int64_t grain) {
#ifdef _OPENMP
    if (work < 2 * grain || omp_in_parallel() || nb__in_task()) return 1;
    int max = omp_get_max_threads();
    int64_t want = work / grain;
    return want < max ? (int)want : max;
#else
    (void)work, (void)grain;
    return 1;
#endif
}

/* Walk linear indices [begin, end) of the iterator, calling fn once per row segment. */
static void walk_range(const nb__iter *it, int64_t begin, int64_t end, nb__iter_fn fn, void *ctx) {
    int nd = it->ndim, na = it->nargs;
    int64_t idx[NB_MAX_DIMS];
    int64_t rem = begin;
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = rem % it->shape[d];
        rem /= it->shape[d];
    }
    char *ptrs[NB__ITER_MAX_ARGS];
    int64_t inner[NB__ITER_MAX_ARGS];
    for (int a = 0; a < na; a++) {
        char *p = it->data[a];
        for (int d = 0; d < nd; d++) p += idx[d] * it->strides[a][d];
        ptrs[a] = p;
        inner[a] = it->strides[a][nd - 1];
    }
    int64_t i = begin, row = it->shape[nd - 1];
    while (i < end) {
        int64_t n = row - idx[nd - 1];
        if (n > end - i) n = end - i;
        char *call[NB__ITER_MAX_ARGS];
        memcpy(call, ptrs, sizeof(char *) * (size_t)na);
        fn(call, inner, n, ctx);
        i += n;
        if (i >= end) break;
        /* advance to the start of the next row */
        idx[nd - 1] += n;
        for (int a = 0; a < na; a++) ptrs[a] += n * inner[a];
        for (int d = nd - 1; d > 0 && idx[d] == it->shape[d]; d--) {
            for (int a = 0; a < na; a++)
                ptrs[a] += it->strides[a][d - 1] - it->shape[d] * it->strides[a][d];
            idx[d] = 0;
            idx[d - 1]++;
        }
    }
}

typedef struct walk_job {
    const nb__iter *it;
    nb__iter_fn fn;
    void *ctx;
    int64_t per;
} walk_job;

static void walk_task(int64_t i, void *p) {
    const walk_job *j = p;
    int64_t b = i * j->per, e = b + j->per < j->it->numel ? b + j->per : j->it->numel;
    walk_range(j->it, b, e, j->fn, j->ctx);
}

void nb__iter_for_each(const nb__iter *it, nb__iter_fn fn, void *ctx, int64_t grain) {
    if (it->numel == 0) return;
    int nt = nb__threads_for(it->numel, grain);
    if (nt <= 1) {
        walk_range(it, 0, it->numel, fn, ctx);
        return;
    }
    /* Chunks of a fixed size (a multiple of 64 elements, so each chunk's writes stay on
     * their own cache lines), a few per thread so that a thread the scheduler runs late
     * costs little: nb__run_tasks hands them to whichever thread is free. */
    int64_t chunks = (int64_t)nt * 4;
    int64_t per = (it->numel + chunks - 1) / chunks;
    per = (per + 63) / 64 * 64;
    walk_job job = {it, fn, ctx, per};
    nb__run_tasks((it->numel + per - 1) / per, nt, walk_task, &job);
}

