/* dnnl_dl.c - oneDNN, opened on the first GEMM or convolution that runs on it (cpu/dnnl_dl.h:
 * nb__dnnl): libnabla.so links no oneDNN, so a program that never runs a oneDNN kernel maps
 * neither libdnnl nor what it links (libOpenCL, libstdc++, libgcc_s) (docs/embedding.md).
 *
 * Where the functions come from, first hit wins (tensor/dl_lib.c, the loader zlib and
 * jansson share):
 *   1. the process itself, when something it links already has dnnl_sgemm (a program linked
 *      to libnabla.a, which `pkg-config --static` links to oneDNN, or to oneDNN itself);
 *   2. NB_DNNL_PATH, the library meson found (its folder and the header's major version);
 *   3. libdnnl.so.<major> through the loader's usual search.
 * Failure is an error value ("matmul: oneDNN could not be loaded: ..."), kept for the
 * process; the library is never unloaded. */
#define NB__DNNL_DL_IMPL 1
#include "nb_config.h"

#if NB_HAVE_DNNL
#include "cpu/dnnl_dl.h"
#include "nb_cuda_paths.h"
#include "tensor/dl_lib.h"
#include "tensor/error.h"

nb__dnnl_fns nb__dnnl_table;

/* nb__dnnl_fns's fields are these functions' pointers, in this order (one X-macro list) */
#define NB__DNNL_NAME(name) #name,
static const char *const g_names[] = {NB__DNNL_FUNCTIONS(NB__DNNL_NAME)};
#undef NB__DNNL_NAME
_Static_assert(sizeof(nb__dnnl_fns) == sizeof g_names / sizeof g_names[0] * sizeof(void *),
               "nb__dnnl_fns holds one function pointer per name");
static nb__dl_lib g_lib = NB__DL_LIB("oneDNN", g_names, &nb__dnnl_table, NB_DNNL_PATH,
                                     NB_DNNL_SONAME);

bool nb__dnnl_ok(void) { return nb__dl_lib_ok(&g_lib); }

bool nb__dnnl(const char *op) { return nb__dl_lib_load(&g_lib, op); }
#endif
