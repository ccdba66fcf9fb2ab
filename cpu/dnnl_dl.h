/* dnnl_dl.h - private: oneDNN's functions, from the library opened on first use
 * (cpu/dnnl_dl.c), for cpu/gemm.c, cpu/conv.c, cpu/conv_dnnl.c and cpu/sgemm_path.c.
 * libnabla.so links no oneDNN (docs/embedding.md): a program that runs no oneDNN GEMM or
 * convolution maps neither libdnnl nor what it links (libOpenCL, libstdc++, libgcc_s).
 *
 * Include it after <oneapi/dnnl/dnnl.h>: every oneDNN function those files call is then a
 * macro for the pointer in the table, so their calls read as oneDNN's own. A caller first
 * asks nb__dnnl(op) (or nb__dnnl_ok()): the pointers are only set once that succeeded. */
#ifndef NABLA_CPU_DNNL_DL_H
#define NABLA_CPU_DNNL_DL_H

#include <stdbool.h>

#include <oneapi/dnnl/dnnl.h>

/* X(name): every oneDNN function libnabla calls. */
#define NB__DNNL_FUNCTIONS(X)                                                                    \
    X(dnnl_dilated_convolution_backward_data_desc_init)                                          \
    X(dnnl_dilated_convolution_forward_desc_init)                                                \
    X(dnnl_engine_create)                                                                        \
    X(dnnl_get_effective_cpu_isa)                                                                \
    X(dnnl_matmul_desc_init)                                                                     \
    X(dnnl_memory_create)                                                                        \
    X(dnnl_memory_desc_equal)                                                                    \
    X(dnnl_memory_desc_get_size)                                                                 \
    X(dnnl_memory_desc_init_by_strides)                                                          \
    X(dnnl_memory_desc_init_by_tag)                                                              \
    X(dnnl_memory_destroy)                                                                       \
    X(dnnl_post_ops_append_sum)                                                                  \
    X(dnnl_post_ops_create)                                                                      \
    X(dnnl_post_ops_destroy)                                                                     \
    X(dnnl_primitive_attr_create)                                                                \
    X(dnnl_primitive_attr_destroy)                                                               \
    X(dnnl_primitive_attr_set_output_scales)                                                     \
    X(dnnl_primitive_attr_set_post_ops)                                                          \
    X(dnnl_primitive_attr_set_scratchpad_mode)                                                   \
    X(dnnl_primitive_create)                                                                     \
    X(dnnl_primitive_desc_create)                                                                \
    X(dnnl_primitive_desc_destroy)                                                               \
    X(dnnl_primitive_desc_query_md)                                                              \
    X(dnnl_primitive_destroy)                                                                    \
    X(dnnl_primitive_execute)                                                                    \
    X(dnnl_reorder_primitive_desc_create)                                                        \
    X(dnnl_sgemm)                                                                                \
    X(dnnl_stream_create)                                                                        \
    X(dnnl_stream_destroy)                                                                       \
    X(dnnl_stream_wait)

typedef struct nb__dnnl_fns {
#define NB__DNNL_FIELD(name) __typeof__(name) *p_##name;
    NB__DNNL_FUNCTIONS(NB__DNNL_FIELD)
#undef NB__DNNL_FIELD
} nb__dnnl_fns;

/* Set by the first successful load; read only after nb__dnnl / nb__dnnl_ok said yes. */
extern nb__dnnl_fns nb__dnnl_table;

/* true when oneDNN is loaded (loading it on the first call); else false with the error set
 * ("<op>: oneDNN could not be loaded: ...", NB_EUNSUPPORTED). Thread safe. */
bool nb__dnnl(const char *op);
/* The same without setting an error (for questions such as "is bf16 native here?"). */
bool nb__dnnl_ok(void);

#ifndef NB__DNNL_DL_IMPL
#define dnnl_dilated_convolution_backward_data_desc_init \
    (*nb__dnnl_table.p_dnnl_dilated_convolution_backward_data_desc_init)
#define dnnl_dilated_convolution_forward_desc_init \
    (*nb__dnnl_table.p_dnnl_dilated_convolution_forward_desc_init)
#define dnnl_engine_create (*nb__dnnl_table.p_dnnl_engine_create)
#define dnnl_get_effective_cpu_isa (*nb__dnnl_table.p_dnnl_get_effective_cpu_isa)
#define dnnl_matmul_desc_init (*nb__dnnl_table.p_dnnl_matmul_desc_init)
#define dnnl_memory_create (*nb__dnnl_table.p_dnnl_memory_create)
#define dnnl_memory_desc_equal (*nb__dnnl_table.p_dnnl_memory_desc_equal)
#define dnnl_memory_desc_get_size (*nb__dnnl_table.p_dnnl_memory_desc_get_size)
#define dnnl_memory_desc_init_by_strides (*nb__dnnl_table.p_dnnl_memory_desc_init_by_strides)
#define dnnl_memory_desc_init_by_tag (*nb__dnnl_table.p_dnnl_memory_desc_init_by_tag)
#define dnnl_memory_destroy (*nb__dnnl_table.p_dnnl_memory_destroy)
#define dnnl_post_ops_append_sum (*nb__dnnl_table.p_dnnl_post_ops_append_sum)
#define dnnl_post_ops_create (*nb__dnnl_table.p_dnnl_post_ops_create)
#define dnnl_post_ops_destroy (*nb__dnnl_table.p_dnnl_post_ops_destroy)
#define dnnl_primitive_attr_create (*nb__dnnl_table.p_dnnl_primitive_attr_create)
#define dnnl_primitive_attr_destroy (*nb__dnnl_table.p_dnnl_primitive_attr_destroy)
#define dnnl_primitive_attr_set_output_scales \
    (*nb__dnnl_table.p_dnnl_primitive_attr_set_output_scales)
#define dnnl_primitive_attr_set_post_ops (*nb__dnnl_table.p_dnnl_primitive_attr_set_post_ops)
#define dnnl_primitive_attr_set_scratchpad_mode \
    (*nb__dnnl_table.p_dnnl_primitive_attr_set_scratchpad_mode)
#define dnnl_primitive_create (*nb__dnnl_table.p_dnnl_primitive_create)
#define dnnl_primitive_desc_create (*nb__dnnl_table.p_dnnl_primitive_desc_create)
#define dnnl_primitive_desc_destroy (*nb__dnnl_table.p_dnnl_primitive_desc_destroy)
#define dnnl_primitive_desc_query_md (*nb__dnnl_table.p_dnnl_primitive_desc_query_md)
#define dnnl_primitive_destroy (*nb__dnnl_table.p_dnnl_primitive_destroy)
#define dnnl_primitive_execute (*nb__dnnl_table.p_dnnl_primitive_execute)
#define dnnl_reorder_primitive_desc_create (*nb__dnnl_table.p_dnnl_reorder_primitive_desc_create)
#define dnnl_sgemm (*nb__dnnl_table.p_dnnl_sgemm)
#define dnnl_stream_create (*nb__dnnl_table.p_dnnl_stream_create)
#define dnnl_stream_destroy (*nb__dnnl_table.p_dnnl_stream_destroy)
#define dnnl_stream_wait (*nb__dnnl_table.p_dnnl_stream_wait)
#endif

#endif
