/* cpu/random.c - the CPU kernels of the random family (Philox streams into tensors). */
#include "cpu/backend.h"
#include "cpu/cpu_impl.h"

void nb__cpu_register_random(nb__kernels *k) { (void)k; }
