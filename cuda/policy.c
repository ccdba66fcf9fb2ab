/* policy.c - the host-checkable decisions of the CUDA allocator and streams
 * (cuda/policy.h). No CUDA call is named here: they come in through nb__cuda_rt. */
#include <stdio.h>
#include <string.h>

#include "cuda/policy.h"

static nb__poll poll_result(const nb__cuda_rt *rt, int e) {
    if (e == rt->success) return NB__POLL_DONE;
    /* "not ready" (or a real error) is now also the thread's last error: read it back, or
     * the next kernel launch's cudaGetLastError() would report it as that launch failing. */
    (void)rt->get_last_error();
    return e == rt->not_ready ? NB__POLL_BUSY : NB__POLL_FAILED;
}

nb__poll nb__cuda_poll_stream(const nb__cuda_rt *rt, void *stream) {
    return poll_result(rt, rt->stream_query(stream));
}

nb__poll nb__cuda_poll_event(const nb__cuda_rt *rt, void *event) {
    return poll_result(rt, rt->event_query(event));
}

bool nb__uses_add(nb__block_uses *u, uint64_t own, uint64_t id, void *stream) {
    if (id == own) return true;
    for (int i = 0; i < u->n; i++)
        if (u->ids[i] == id) return true;
    if (u->n == NB__CUDA_MAX_USES) return false;
    u->ids[u->n] = id;
    u->streams[u->n++] = stream;
    return true;
}

void nb__uses_drop_stream(nb__block_uses *u, uint64_t id) {
    for (int i = 0; i < u->n; i++) {
        if (u->ids[i] == id) {
            u->ids[i] = u->ids[u->n - 1];
            u->streams[i] = u->streams[--u->n];
            return;
        }
    }
}

bool nb__uses_record(const nb__cuda_rt *rt, nb__block_uses *u) {
    for (int i = 0; i < u->n; i++) {
        void *ev = NULL;
        if (rt->event_record_new(&ev, u->streams[i]) != rt->success) {
            (void)rt->get_last_error();
            nb__uses_clear(rt, u);
            u->n = 0;
            return false;
        }
        u->events[u->nevents++] = ev;
    }
    u->n = 0;
    return true;
}

bool nb__uses_settled(const nb__cuda_rt *rt, nb__block_uses *u) {
    int kept = 0;
    for (int i = 0; i < u->nevents; i++) {
        if (nb__cuda_poll_event(rt, u->events[i]) == NB__POLL_DONE) rt->event_destroy(u->events[i]);
        else u->events[kept++] = u->events[i];
    }
    u->nevents = kept;
    return kept == 0;
}

void nb__uses_clear(const nb__cuda_rt *rt, nb__block_uses *u) {
    for (int i = 0; i < u->nevents; i++) rt->event_destroy(u->events[i]);
    u->nevents = 0;
}

bool nb__copy_joins_source(int sdev, int ddev) { return sdev != ddev; }

void nb__cuda_bytes_str(char *buf, size_t len, double n) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    while (n >= 1024 && u < 5) {
        n /= 1024;
        u++;
    }
    if (u == 0) snprintf(buf, len, "%.0f B", n);
    else snprintf(buf, len, "%.2f %s", n, units[u]);
}

void nb__cuda_oom_message(char *buf, size_t len, const nb__oom_info *o) {
    char req[32], cls[32], live[32], cached[32], released[32], freeb[32], total[32];
    nb__cuda_bytes_str(req, sizeof req, (double)o->requested);
    nb__cuda_bytes_str(cls, sizeof cls, (double)o->class_size);
    nb__cuda_bytes_str(live, sizeof live, (double)o->stats.bytes_live);
    nb__cuda_bytes_str(cached, sizeof cached, (double)o->stats.bytes_cached);
    nb__cuda_bytes_str(released, sizeof released, (double)o->cached_released);
    nb__cuda_bytes_str(freeb, sizeof freeb, (double)o->gpu_free);
    nb__cuda_bytes_str(total, sizeof total, (double)o->gpu_total);
    char gpu[96] = "the GPU's free memory is unknown";
    if (o->gpu_total) snprintf(gpu, sizeof gpu, "the GPU has %s free of %s", freeb, total);
    char retry[128] = "no cached block to give back";
    if (o->cached_released)
        snprintf(retry, sizeof retry,
                 "%s of cached blocks were given back to CUDA and the allocation retried",
                 released);
    snprintf(buf, len,
             "cuda_alloc: out of memory on GPU %d: requested %zu bytes (%s, class %s); nabla "
             "holds %s in use and %s cached (%s); %s",
             o->device, o->requested, req, cls, live, cached, retry, gpu);
}
