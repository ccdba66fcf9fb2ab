/* precision.h - the --precision flag of the bundled programs (gpt, mlp, cnn): fp32, bf16 or
 * fp16, run through nabla/autocast.h around each training step and evaluation. */
#ifndef NABLA_MODELS_PRECISION_H
#define NABLA_MODELS_PRECISION_H

#include <stdbool.h>
#include <stdio.h>

#include <nabla/nabla.h>

/* "fp32" | "bf16" | "fp16" into *dt (NB_F32, NB_BF16, NB_F16); false after saying why on
 * stderr ("PROG: --precision ..."). */
bool nbm_parse_precision(const char *prog, const char *v, nb_dtype *dt);
/* --reduce-dtype: "fp32" | "bf16" | "fp16" into *dt, the dtype gradients are reduced in
 * over the ranks (nb_ddp_opts / nb_zero_opts .reduce_dtype); false after saying why. */
bool nbm_parse_reduce_dtype(const char *prog, const char *v, nb_dtype *dt);
/* The flag's name of dt ("fp32", "bf16", "fp16"). */
const char *nbm_precision_name(nb_dtype dt);
/* How dt runs here, in words (static): "native bf16 GEMM (...)", or the fallback. */
const char *nbm_precision_path(nb_dtype dt);
/* Prints, for bf16 and fp16, how the precision runs on this machine to f ("PROG: ..."),
 * saying plainly when it gains no speed (never a silent f32). */
void nbm_precision_note(const char *prog, nb_dtype dt, FILE *f);
/* Around each step / evaluation: autocast to dt (nothing for fp32). */
nb_status nbm_precision_begin(nb_dtype dt);
nb_status nbm_precision_end(nb_dtype dt);

#endif
