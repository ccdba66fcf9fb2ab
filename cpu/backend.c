/* cpu/backend.c - the CPU backend: host memory from the caching allocator, byte copies
 * that are memcpy, and the kernel table assembled from the families' registrations. */
#include <pthread.h>
#include <string.h>

#include "cpu/backend.h"
#include "nabla/memory.h"

static void *cpu_alloc(nb_device dev, size_t nbytes) {
    (void)dev;
    return nb_host_alloc(nbytes);
}
static void cpu_free(nb_device dev, void *p) {
    (void)dev;
    nb_host_free(p);
}
static nb_status cpu_copy_bytes(nb_device dev, void *dst, const void *src, size_t nbytes) {
    (void)dev;
    if (nbytes) memcpy(dst, src, nbytes);
    return NB_OK;
}

static nb__backend g_cpu = {
    .name = "cpu",
    .has_storage = true,
    .host_accessible = true,
    .gemm_bf16 = true,
    .conv_bf16 = true,
    .attention_bf16 = true,
    .ew_half_in_f32 = true,
    .pool_relu = true,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_host = cpu_copy_bytes,
    .from_host = cpu_copy_bytes,
};
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void cpu_init(void) {
    nb__cpu_register_core(&g_cpu.k);
    nb__cpu_register_reduce(&g_cpu.k);
    nb__cpu_register_index(&g_cpu.k);
    nb__cpu_register_matmul(&g_cpu.k);
    nb__cpu_register_norm(&g_cpu.k);
    nb__cpu_register_attention(&g_cpu.k);
    nb__cpu_register_conv(&g_cpu.k);
    nb__cpu_register_loss(&g_cpu.k);
    nb__cpu_register_optim(&g_cpu.k);
    nb__cpu_register_random(&g_cpu.k);
    nb__cpu_register_lm(&g_cpu.k);
}

const nb__backend *nb__cpu_backend(void) {
    pthread_once(&g_once, cpu_init);
    return &g_cpu;
}
