/* cuda/k_index.h - private to the CUDA plugin (C17 and nvcc): the index kernels' device
 * error record (cuda/k_index.cu).
 *
 *     nb_status st = nb__cuda_index_error(device);   // after a sync of the device's work
 *     if (st != NB_OK) ...  // NB_EINDEX, the CPU kernels' message, e.g.
 *                           // "gather: index 12 is out of range for dim 1 of size 10"
 *
 * The op definitions leave index values to the kernels (tensor/ops/index.c). On CUDA,
 * index_select/embedding, gather, scatter_add and one_hot cannot fail without a host
 * sync, so a bad value is written as zeros (gathers) or skipped (scatters) and recorded in
 * a per-device record: the first failing call's op, dim and range, and its smallest and
 * largest bad value. The record is read and cleared by nb__cuda_index_error, meant for the
 * next natural sync (a device-to-host copy, a stream synchronize). With the environment
 * variable NB_CUDA_SYNC_INDEX_CHECKS=1 each checking kernel waits for its stream and reads
 * the record itself, so the op fails at once as on the CPU (a host sync per call: for
 * debugging and for running the op tests on a GPU). Owns nothing. */
#ifndef NABLA_CUDA_K_INDEX_H
#define NABLA_CUDA_K_INDEX_H

#include "nabla/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* NB_OK when no index kernel on device saw a bad value since the last call (at once,
 * without touching the device, when none of the checking kernels ran there); else clears
 * the record and returns NB_EINDEX with the message the CPU kernel gives for that call
 * (the value named is the smallest if negative, else the largest). Reads device memory
 * synchronously: call it only where the caller syncs anyway. NB_EDEVICE if the record
 * cannot be read. */
nb_status nb__cuda_index_error(int device);

#ifdef __cplusplus
}
#endif
#endif
