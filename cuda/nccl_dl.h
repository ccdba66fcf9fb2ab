/* cuda/nccl_dl.h - private to the CUDA plugin (C17): the NCCL functions the plugin calls,
 * taken from the NCCL library found at run time (cuda/dl.h: the search, cuda/nccl_load.c:
 * the table), not linked. Include it after <nccl.h>; from then on a call such as
 * ncclGetUniqueId(&id) goes through the table, so call nb__nccl_load() first:
 *
 *     if (!nb__nccl_load()) return error("...: %s", nb__nccl_why());
 *     ncclResult_t r = ncclGetUniqueId(&id);
 *
 * Files that only fill the table define NB__NCCL_DL_NO_NAMES before including it. */
#ifndef NABLA_CUDA_NCCL_DL_H
#define NABLA_CUDA_NCCL_DL_H

#include <stdbool.h>

/* nccl.h declares a few functions with () for (void) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

/* Every NCCL function the plugin calls. */
#define NB__NCCL_FNS(X) \
    X(ncclGetVersion) X(ncclGetUniqueId) X(ncclGetErrorString) X(ncclGetLastError)         \
    X(ncclCommInitRankConfig) X(ncclCommSplit) X(ncclCommGetAsyncError)                    \
    X(ncclCommAbort) X(ncclCommFinalize) X(ncclCommDestroy) X(ncclCommCount)               \
    X(ncclCommUserRank) X(ncclGroupStart) X(ncclGroupEnd) X(ncclAllReduce)                 \
    X(ncclBroadcast) X(ncclReduce) X(ncclAllGather) X(ncclReduceScatter) X(ncclSend)       \
    X(ncclRecv)

typedef struct nb__nccl_fns {
#define NB__NCCL_MEMBER(f) __typeof__(f) *f;
    NB__NCCL_FNS(NB__NCCL_MEMBER)
#undef NB__NCCL_MEMBER
} nb__nccl_fns;

/* Filled by nb__nccl_load; all NULL before and when NCCL is missing. */
extern nb__nccl_fns nb__nccl_fn;

/* Find and open NCCL (once per process; thread-safe): libnccl.so.<the build's major>, every
 * function above, its major version the build's. False when any of that fails, with the
 * reason in nb__nccl_why(). */
bool nb__nccl_load(void);
/* Why NCCL is not used ("libnccl.so.2 not found (looked in ...)"), "" when it is. */
const char *nb__nccl_why(void);
/* The file loaded, "" when none. */
const char *nb__nccl_path(void);

#ifndef NB__NCCL_DL_NO_NAMES
#define NB__NCCL_NAME(f) nb__nccl_fn.f
#define ncclGetVersion NB__NCCL_NAME(ncclGetVersion)
#define ncclGetUniqueId NB__NCCL_NAME(ncclGetUniqueId)
#define ncclGetErrorString NB__NCCL_NAME(ncclGetErrorString)
#define ncclGetLastError NB__NCCL_NAME(ncclGetLastError)
#define ncclCommInitRankConfig NB__NCCL_NAME(ncclCommInitRankConfig)
#define ncclCommSplit NB__NCCL_NAME(ncclCommSplit)
#define ncclCommGetAsyncError NB__NCCL_NAME(ncclCommGetAsyncError)
#define ncclCommAbort NB__NCCL_NAME(ncclCommAbort)
#define ncclCommFinalize NB__NCCL_NAME(ncclCommFinalize)
#define ncclCommDestroy NB__NCCL_NAME(ncclCommDestroy)
#define ncclCommCount NB__NCCL_NAME(ncclCommCount)
#define ncclCommUserRank NB__NCCL_NAME(ncclCommUserRank)
#define ncclGroupStart NB__NCCL_NAME(ncclGroupStart)
#define ncclGroupEnd NB__NCCL_NAME(ncclGroupEnd)
#define ncclAllReduce NB__NCCL_NAME(ncclAllReduce)
#define ncclBroadcast NB__NCCL_NAME(ncclBroadcast)
#define ncclReduce NB__NCCL_NAME(ncclReduce)
#define ncclAllGather NB__NCCL_NAME(ncclAllGather)
#define ncclReduceScatter NB__NCCL_NAME(ncclReduceScatter)
#define ncclSend NB__NCCL_NAME(ncclSend)
#define ncclRecv NB__NCCL_NAME(ncclRecv)
#endif

#endif
