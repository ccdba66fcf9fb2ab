/* fake_cuda_plugin.c - a stand-in for libnabla-cuda.so that the cuda suite points
 * NB_CUDA_PLUGIN at, to check that the loader refuses plugins that do not fit
 * (docs/cuda.md "The plugin"). FAKE_CUDA_PLUGIN picks how it misbehaves:
 *   "refuse"   its init refuses libnabla, with a message (as a real plugin of another
 *              version does);
 *   "version"  its init accepts but returns a table of another nabla version;
 *   "null"     its init returns NB_OK and no table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/plugin.h"

static nb__cuda_plugin g_table;

__attribute__((visibility("default"))) nb_status
nb__cuda_plugin_init(const nb__cuda_host *host, const nb__cuda_plugin **out, char *msg,
                     size_t len) {
    const char *mode = getenv("FAKE_CUDA_PLUGIN");
    *out = NULL;
    if (!mode || strcmp(mode, "refuse") == 0) {
        snprintf(msg, len, "libnabla (nabla %s) does not match the fake plugin", host->version);
        return NB_EUNSUPPORTED;
    }
    if (strcmp(mode, "version") == 0) {
        g_table = (nb__cuda_plugin){.abi = NB__CUDA_PLUGIN_ABI, .size = sizeof g_table,
                                    .version = "0.0.0-other", .kernels_size = host->kernels_size};
        *out = &g_table;
    }
    return NB_OK;
}
