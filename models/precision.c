/* precision.c - the --precision flag of the bundled programs (models/precision.h). */
#include <string.h>

#include "precision.h"

bool nbm_parse_precision(const char *prog, const char *v, nb_dtype *dt) {
    if (!strcmp(v, "fp32")) *dt = NB_F32;
    else if (!strcmp(v, "bf16")) *dt = NB_BF16;
    else if (!strcmp(v, "fp16")) *dt = NB_F16;
    else {
        fprintf(stderr, "%s: --precision must be fp32, bf16 or fp16, got \"%s\"\n", prog, v);
        return false;
    }
    return true;
}

bool nbm_parse_reduce_dtype(const char *prog, const char *v, nb_dtype *dt) {
    if (!strcmp(v, "fp32")) *dt = NB_F32;
    else if (!strcmp(v, "bf16")) *dt = NB_BF16;
    else if (!strcmp(v, "fp16")) *dt = NB_F16;
    else {
        fprintf(stderr, "%s: --reduce-dtype must be fp32, bf16 or fp16, got \"%s\"\n", prog, v);
        return false;
    }
    return true;
}

const char *nbm_precision_name(nb_dtype dt) {
    return dt == NB_BF16 ? "bf16" : dt == NB_F16 ? "fp16" : "fp32";
}

const char *nbm_precision_path(nb_dtype dt) {
    if (dt == NB_BF16) return nb_gemm_bf16_path();
    if (dt == NB_F16) return "f16 storage, f32 math (no fast f16 GEMM on this CPU)";
    return "f32";
}

void nbm_precision_note(const char *prog, nb_dtype dt, FILE *f) {
    if (dt == NB_BF16 && !nb_gemm_bf16_native())
        fprintf(f, "%s: --precision bf16: no native bf16 GEMM here; matmuls run as %s, so "
                   "bf16 gains no speed (NB_GEMM=dnnl on a CPU with AVX512-BF16 has one)\n",
                prog, nb_gemm_bf16_path());
    else if (dt == NB_F16)
        fprintf(f, "%s: --precision fp16: f16 storage with f32 math (this CPU has no fast f16 "
                   "GEMM, so it is slower than fp32)%s\n",
                prog, ", dynamic loss scaling");
}

nb_status nbm_precision_begin(nb_dtype dt) {
    return dt == NB_F32 ? NB_OK : nb_autocast_begin(dt);
}

nb_status nbm_precision_end(nb_dtype dt) { return dt == NB_F32 ? NB_OK : nb_autocast_end(); }
