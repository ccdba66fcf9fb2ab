/* blas_dl.h - private: OpenBLAS's functions, from the library opened on first use
 * (cpu/blas_dl.c), for cpu/gemm.c and cpu/runtime.c. libnabla links no BLAS. */
#ifndef NABLA_CPU_BLAS_DL_H
#define NABLA_CPU_BLAS_DL_H

#include <cblas.h>

typedef struct nb__blas_fns {
    __typeof__(cblas_sgemm) *sgemm;
    __typeof__(cblas_dgemm) *dgemm;
    void (*set_num_threads)(int); /* NULL: the BLAS found is not OpenBLAS */
} nb__blas_fns;

/* The table (loading OpenBLAS on the first call), or NULL with the error set ("<op>: OpenBLAS
 * could not be loaded: ..."). Thread safe. */
const nb__blas_fns *nb__blas(const char *op);
/* The table if OpenBLAS is already loaded, else NULL (loads nothing, sets no error). */
const nb__blas_fns *nb__blas_loaded(void);

#endif
