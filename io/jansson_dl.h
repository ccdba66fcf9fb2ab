/* jansson_dl.h - private: jansson's functions, from the library opened on first use
 * (io/jansson_dl.c), for io/safetensors.c, io/safetensors_write.c and io/dcp_index.c.
 * libnabla.so links no jansson (docs/embedding.md): a program that reads or writes no
 * safetensors file or checkpoint index does not map it.
 *
 * Include it instead of <jansson.h>: every jansson function those files call is then a macro
 * for the pointer in the table (json_decref an inline function calling the table's
 * json_delete), so their code reads as jansson's own. A caller first asks nb__jansson(op)
 * (the header parse or build): the pointers are only set once that succeeded. */
#ifndef NABLA_IO_JANSSON_DL_H
#define NABLA_IO_JANSSON_DL_H

#include <jansson.h>
#include <stdbool.h>

/* X(name): every jansson function libnabla calls (json_object_foreach's iterators and
 * json_decref's json_delete included). */
#define NB__JANSSON_FUNCTIONS(X)                                                                 \
    X(json_array)                                                                                \
    X(json_array_append_new)                                                                     \
    X(json_array_get)                                                                            \
    X(json_array_size)                                                                           \
    X(json_delete)                                                                               \
    X(json_dumps)                                                                                \
    X(json_integer)                                                                              \
    X(json_integer_value)                                                                        \
    X(json_loadb)                                                                                \
    X(json_object)                                                                               \
    X(json_object_get)                                                                           \
    X(json_object_iter)                                                                          \
    X(json_object_iter_key)                                                                      \
    X(json_object_iter_next)                                                                     \
    X(json_object_iter_value)                                                                    \
    X(json_object_key_to_iter)                                                                   \
    X(json_object_set_new)                                                                       \
    X(json_object_size)                                                                          \
    X(json_string)                                                                               \
    X(json_string_value)

typedef struct nb__jansson_fns {
#define NB__JANSSON_FIELD(name) __typeof__(name) *p_##name;
    NB__JANSSON_FUNCTIONS(NB__JANSSON_FIELD)
#undef NB__JANSSON_FIELD
} nb__jansson_fns;

/* Set by the first successful load; read only after nb__jansson said yes. */
extern nb__jansson_fns nb__jansson_table;

/* true when jansson is loaded (loading it on the first call); else false with the error set
 * ("<op>: jansson could not be loaded: ...", NB_EUNSUPPORTED). Thread safe. */
bool nb__jansson(const char *op);

#ifndef NB__JANSSON_DL_IMPL
#define json_array (*nb__jansson_table.p_json_array)
#define json_array_append_new (*nb__jansson_table.p_json_array_append_new)
#define json_array_get (*nb__jansson_table.p_json_array_get)
#define json_array_size (*nb__jansson_table.p_json_array_size)
#define json_delete (*nb__jansson_table.p_json_delete)
#define json_dumps (*nb__jansson_table.p_json_dumps)
#define json_integer (*nb__jansson_table.p_json_integer)
#define json_integer_value (*nb__jansson_table.p_json_integer_value)
#define json_loadb (*nb__jansson_table.p_json_loadb)
#define json_object (*nb__jansson_table.p_json_object)
#define json_object_get (*nb__jansson_table.p_json_object_get)
#define json_object_iter (*nb__jansson_table.p_json_object_iter)
#define json_object_iter_key (*nb__jansson_table.p_json_object_iter_key)
#define json_object_iter_next (*nb__jansson_table.p_json_object_iter_next)
#define json_object_iter_value (*nb__jansson_table.p_json_object_iter_value)
#define json_object_key_to_iter (*nb__jansson_table.p_json_object_key_to_iter)
#define json_object_set_new (*nb__jansson_table.p_json_object_set_new)
#define json_object_size (*nb__jansson_table.p_json_object_size)
#define json_string (*nb__jansson_table.p_json_string)
#define json_string_value (*nb__jansson_table.p_json_string_value)

/* jansson's json_decref is an inline function of its header that calls the library's
 * json_delete directly; this one takes the same steps with the table's. */
static inline void nb__json_decref(json_t *json) {
    if (json && json->refcount != (size_t)-1 && JSON_INTERNAL_DECREF(json) == 0)
        json_delete(json);
}
#define json_decref nb__json_decref
#endif

#endif
