/* jansson_dl.c - jansson, opened by the first safetensors header or checkpoint index that
 * is read or written (io/jansson_dl.h: nb__jansson), through tensor/dl_lib.c: from the
 * process when it links jansson (a program linked to libnabla.a, which `pkg-config --static`
 * links to it), else the library meson found, else libjansson.so.4 on the loader's search. */
#define NB__JANSSON_DL_IMPL 1
#include "io/jansson_dl.h"
#include "nb_cuda_paths.h"
#include "tensor/dl_lib.h"

nb__jansson_fns nb__jansson_table;

static const char *const names[] = {
#define NB__JANSSON_NAME(name) #name,
    NB__JANSSON_FUNCTIONS(NB__JANSSON_NAME)
#undef NB__JANSSON_NAME
};
_Static_assert(sizeof nb__jansson_table == sizeof names, "one function pointer per name");

static nb__dl_lib g_jansson =
    NB__DL_LIB("jansson", names, &nb__jansson_table, NB_JANSSON_PATH, NB_JANSSON_SONAME);

bool nb__jansson(const char *op) { return nb__dl_lib_load(&g_jansson, op); }
