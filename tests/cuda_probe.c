/* cuda_probe.c - a small program linked to the shared libnabla, as users link it, for
 * tools/check-cuda-plugin. Public API only.
 *
 *   cuda_probe cpu    CPU work only (a few tensor ops)
 *   cuda_probe cuda   the same, then a tensor on cuda:0 (loads the CUDA plugin)
 *
 * Prints, one per line: "result: ok" or "result: <status name>", "error: <message>"
 * (empty when none), "libraries: <nb_cuda_libraries(): what the plugin uses, and why it
 * does without cuDNN or NCCL>" (cuda only; "none" when the plugin did not load),
 * "cuda_libraries: <mapped CUDA libraries, or none>" (from /proc/self/maps) and
 * "peak_rss_kib: <VmHWM>". tools/gpu-check's probe and tools/check-cuda-plugin read it. Exit status 0 unless the CPU work failed
 * or the CUDA request crashed (an error value is a normal outcome). */
#include <nabla/nabla.h>
#include <stdio.h>
#include <string.h>

/* The CUDA libraries a process may map: the plugin and what it links. */
static const char *const k_cuda_libs[] = {"libnabla-cuda.so", "libcudart", "libcublasLt",
                                          "libcublas.",       "libcudnn",  "libnccl"};

static void print_mapped(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096], seen[512] = "";
    while (f && fgets(line, sizeof line, f)) {
        for (size_t i = 0; i < sizeof k_cuda_libs / sizeof k_cuda_libs[0]; i++) {
            if (strstr(line, k_cuda_libs[i]) && !strstr(seen, k_cuda_libs[i])) {
                size_t n = strlen(seen);
                snprintf(seen + n, sizeof seen - n, "%s%s", n ? " " : "", k_cuda_libs[i]);
            }
        }
    }
    if (f) fclose(f);
    printf("cuda_libraries: %s\n", seen[0] ? seen : "none");
}

static void print_peak_rss(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld kB", &kib) == 1) break;
    if (f) fclose(f);
    printf("peak_rss_kib: %ld\n", kib);
}

int main(int argc, char **argv) {
    int cuda = argc > 1 && strcmp(argv[1], "cuda") == 0;
    nb_scope_begin();
    nb_tensor *a = nb_arange(0, 6, 1, NB_F32);
    nb_tensor *s = nb_sum(nb_view(a, (int64_t[]){2, 3}, 2), (int[]){1}, 1, false);
    if (!s || nb_get_f64(s, (int64_t[]){1}) != 12.0) {
        fprintf(stderr, "cuda_probe: the CPU work failed: %s\n", nb_last_error());
        return 1;
    }
    nb_clear_error();
    nb_status st = NB_OK;
    if (cuda) {
        nb_tensor *t = nb_zeros_on(NB_CUDA(0), (int64_t[]){4}, 1, NB_F32);
        st = t ? NB_OK : nb_last_status();
    }
    printf("result: %s\n", st == NB_OK ? "ok" : nb_status_name(st));
    printf("error: %s\n", st == NB_OK ? "" : nb_last_error());
    if (cuda) {
        const char *libs = nb_cuda_libraries(); /* NULL when the plugin did not load */
        printf("libraries: %s\n", libs ? libs : "none");
        nb_clear_error();
    }
    nb_scope_end();
    print_mapped();
    print_peak_rss();
    return 0;
}
