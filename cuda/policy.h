/* cuda/policy.h - private: the decisions of the CUDA allocator and streams that do not need
 * a GPU, apart from the CUDA calls, so the host tests (tests/test_cuda_policy.c) check them
 * with a fake runtime. The plugin (alloc.c, copy.c) passes the real runtime (nb__cuda_rt_real
 * in device.c). Plain C, no CUDA header: error codes are cudaError_t values as int, streams
 * and events are cudaStream_t / cudaEvent_t as void *.
 *
 * What is decided here:
 *   - polling a stream or an event: "not ready" is an answer, not an error, but the CUDA
 *     runtime also records it as the thread's last error, which the next launch check
 *     (cudaGetLastError after a kernel launch) would report as that launch failing. A
 *     poll therefore reads the last error back, leaving nothing behind;
 *   - record_stream: a block used on streams other than its own gets, when it is freed, an
 *     event recorded on each of those streams, and is reused only when all have completed
 *     (the rule of PyTorch's caching allocator; before, a block freed while another
 *     thread's stream still read it could be handed out and overwritten);
 *   - cross-device copies: which copies must first wait for the source device's stream;
 *   - the out-of-memory message: the sizes and the state of the cache. */
#ifndef NABLA_CUDA_POLICY_H
#define NABLA_CUDA_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nabla/cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA calls the policy makes. */
typedef struct nb__cuda_rt {
    int success;     /* cudaSuccess */
    int not_ready;   /* cudaErrorNotReady */
    int (*stream_query)(void *stream);
    int (*event_query)(void *event);
    int (*get_last_error)(void); /* reads and clears the thread's last error */
    /* Create an event (no timing) and record it on stream; cudaSuccess or the error. */
    int (*event_record_new)(void **event, void *stream);
    void (*event_destroy)(void *event);
} nb__cuda_rt;

typedef enum { NB__POLL_DONE, NB__POLL_BUSY, NB__POLL_FAILED } nb__poll;
/* Has all work before the stream's / event's point completed? Leaves no last error. A
 * failed query (a sticky device error) is NB__POLL_FAILED; callers treat it as busy. */
nb__poll nb__cuda_poll_stream(const nb__cuda_rt *rt, void *stream);
nb__poll nb__cuda_poll_event(const nb__cuda_rt *rt, void *event);

/* ---- record_stream ---------------------------------------------------------------------- */
/* Streams besides its own that a block may be used on before it is freed. */
#define NB__CUDA_MAX_USES 8
typedef struct nb__block_uses {
    int n;                                  /* streams recorded */
    uint64_t ids[NB__CUDA_MAX_USES];
    void *streams[NB__CUDA_MAX_USES];
    int nevents;                            /* events pending after the free */
    void *events[NB__CUDA_MAX_USES];
} nb__block_uses;

/* Note that the block is used on stream (id, handle). Its own stream (own) and streams
 * already noted are ignored. False when NB__CUDA_MAX_USES streams are already noted. */
bool nb__uses_add(nb__block_uses *u, uint64_t own, uint64_t id, void *stream);
/* A stream was synchronized and destroyed: its use of the block is over. */
void nb__uses_drop_stream(nb__block_uses *u, uint64_t id);
/* At the free: record an event on each noted stream (the noted streams are then
 * forgotten). False when an event could not be recorded: the caller must then wait for
 * the device before reusing the block (the events recorded so far are destroyed). */
bool nb__uses_record(const nb__cuda_rt *rt, nb__block_uses *u);
/* Have all events recorded at the free completed? Completed events are destroyed; true
 * when none is left (the block may be reused on its own stream's terms). */
bool nb__uses_settled(const nb__cuda_rt *rt, nb__block_uses *u);
/* Destroy the pending events without waiting (after a device synchronize). */
void nb__uses_clear(const nb__cuda_rt *rt, nb__block_uses *u);

/* ---- copies ------------------------------------------------------------------------------ */
/* A device-to-device copy from GPU sdev to GPU ddev runs on a stream of ddev. True when it
 * must first wait for the current stream of sdev (an event recorded there), so it reads
 * what that stream wrote: every copy between two different GPUs. */
bool nb__copy_joins_source(int sdev, int ddev);

/* ---- out of memory ------------------------------------------------------------------------ */
typedef struct nb__oom_info {
    int device;
    size_t requested, class_size;
    nb_cuda_alloc_stats stats;  /* the device's statistics when the retry failed */
    int64_t cached_released;    /* bytes of cached blocks given back to CUDA before the retry */
    size_t gpu_free, gpu_total; /* cudaMemGetInfo; 0, 0 when unknown */
} nb__oom_info;
/* "cuda_alloc: out of memory on GPU 0: requested 1610612736 bytes (1.50 GiB, class
 * 1.50 GiB); nabla holds 70.00 GiB in use and 0 B cached (2.00 GiB of cached blocks were
 * given back to CUDA and the allocation retried); the GPU has 512.00 MiB free of
 * 140.00 GiB" into buf (truncated to len - 1 characters). */
void nb__cuda_oom_message(char *buf, size_t len, const nb__oom_info *o);
/* n bytes in words: "512 B", "1.50 KiB", "3.00 GiB". */
void nb__cuda_bytes_str(char *buf, size_t len, double n);

#ifdef __cplusplus
}
#endif
#endif
