/* nabla/autocast.h - mixed precision by scope: the GEMM-heavy ops (matmul, linear, attention,
 * convolution) compute in bf16 (or f16) with f32 sums, the precision-sensitive ones in f32,
 * while the parameters and the optimizer stay f32. PyTorch's torch.autocast, as C.
 *
 * Usage:
 *     nb_autocast_begin(NB_BF16);                      // this thread, until the matching end
 *     nb_tensor *logits = nb_forward(model, x);        // linear layers: bf16 out
 *     nb_tensor *loss = nb_cross_entropy(logits, y, NULL);   // computed in f32
 *     nb_autocast_end();
 *     nb_backward(loss);                               // gradients of the f32 parameters: f32
 *
 * The policy (docs/mixed-precision.md has the table; nb_autocast_policy_of tells an op's):
 *   - NB_AUTOCAST_LOW: matmul, linear, causal_attention(_qkv), conv2d cast their f32, f16 or
 *     bf16 inputs to the autocast dtype (f64 stays f64) and return that dtype. bf16 GEMMs
 *     run on oneDNN's AVX512-BF16 kernels where nb_gemm_bf16_native(), bf16 convolutions
 *     where nb_conv_bf16_native() (nabla/runtime.h); elsewhere, and for f16 on every CPU, the half operands are widened to f32 inside the
 *     kernel: the results are the same, the speed is not.
 *   - NB_AUTOCAST_F32: softmax, log_softmax, layer_norm, batch_norm, the losses, sum, mean,
 *     var, std and logsumexp cast half inputs to f32 and return f32.
 *   - NB_AUTOCAST_PROMOTE: every other op runs as it does without autocast (elementwise ops
 *     promote mixed operands to the wider dtype: bf16 + f32 is f32).
 * Casts are ops: they are recorded on the tape, so gradients flow back through them and
 * arrive at each tensor in its own dtype (an f32 parameter gets an f32 .grad).
 *
 * The cast cache: a parameter (a leaf that requires grad) is cast once per outermost scope,
 * however often it is used (a tied embedding, a weight used by several micro-batches); the
 * cast is reused while the parameter is unchanged (an in-place write makes a new cast, and so
 * does a backward that freed the cast's graph: each micro-batch of an accumulated step) and
 * dropped at the outermost nb_autocast_end. So open the scope around each training step
 * (or each forward), not around the whole run.
 *
 * Scopes nest (at most 16 deep) and are per thread: nb_autocast_begin(NB_F32) opens a scope
 * with autocast off, e.g. around a part of the model that must stay f32. nb_backward runs
 * its rules with autocast off (they compute in the dtypes the forward saved).
 * Ownership: nothing here returns a tensor; the cache holds its own references. */
#ifndef NABLA_AUTOCAST_H
#define NABLA_AUTOCAST_H

#include <stdbool.h>

#include "nabla/status.h"
#include "nabla/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Opens a scope computing the low-precision ops in dt: NB_BF16, NB_F16, or NB_F32 (off).
 * NB_EDTYPE for another dtype, NB_ESTATE when 16 scopes are already open. */
nb_status nb_autocast_begin(nb_dtype dt);
/* Closes the innermost scope; the outermost one also empties the cast cache. NB_ESTATE
 * without an open scope. */
nb_status nb_autocast_end(void);
/* The dtype low-precision ops compute in now: NB_BF16 or NB_F16, or NB_F32 when autocast is
 * off (no scope, an NB_F32 scope, or inside nb_backward). */
nb_dtype nb_autocast_dtype(void);
static inline bool nb_autocast_active(void) { return nb_autocast_dtype() != NB_F32; }

typedef enum nb_autocast_policy {
    NB_AUTOCAST_PROMOTE = 0, /* runs as without autocast */
    NB_AUTOCAST_LOW = 1,     /* inputs cast to the autocast dtype */
    NB_AUTOCAST_F32 = 2,     /* half inputs cast to f32 */
} nb_autocast_policy;
/* The policy of an op by its name ("linear", "softmax", ...); PROMOTE for any other. */
nb_autocast_policy nb_autocast_policy_of(const char *op);

/* How many casts the cache holds now (this thread); and empties it. */
int nb_autocast_cache_size(void);
void nb_autocast_clear_cache(void);

#ifdef __cplusplus
}
#endif
#endif
