/* tensor_only.c - the smallest program an embedder writes: a few tensor operations (an
 * elementwise op, a reduction, a small matrix product), linked to the shared libnabla as
 * `pkg-config --cflags --libs nabla` links it, no communicator, no file. Public API only.
 * tools/embed-figures measures it (shared libraries mapped, peak RSS, start-up time) for
 * docs/embedding.md, and tools/check-embed checks it maps no MPI, hwloc or libevent.
 *
 *   tensor_only           does the work; exit status 0 when the results are right
 *   tensor_only --maps    then prints, one per line, each shared library mapped
 *                         (/proc/self/maps, after the work: whatever was opened on first
 *                         use is there)
 *   tensor_only --load    returns at once, before any work: what loading libnabla and
 *                         what it links costs
 *   tensor_only --idx FILE --maps, tensor_only --safetensors FILE --maps
 *                         also writes the result to the IDX or safetensors file FILE and
 *                         reads it back (zlib is opened by the first IDX read or write,
 *                         jansson by the first safetensors header: tools/check-embed checks
 *                         each is mapped only then) */
#include <nabla/nabla.h>
#include <stdio.h>
#include <string.h>

static void print_maps(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096], seen[64][256];
    int n = 0;
    while (f && fgets(line, sizeof line, f)) {
        const char *path = strchr(line, '/');
        if (!path || !strstr(path, ".so")) continue;
        char name[256];
        snprintf(name, sizeof name, "%s", path);
        name[strcspn(name, "\n")] = '\0';
        int dup = 0;
        for (int i = 0; i < n && !dup; i++) dup = strcmp(seen[i], name) == 0;
        if (dup || n == 64) continue;
        snprintf(seen[n++], sizeof seen[0], "%s", name);
        puts(name);
    }
    if (f) fclose(f);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--load") == 0) return 0;
    nb_scope_begin();
    nb_tensor *a = nb_view(nb_arange(0, 6, 1, NB_F32), (int64_t[]){2, 3}, 2);
    nb_tensor *b = nb_view(nb_arange(0, 6, 1, NB_F32), (int64_t[]){3, 2}, 2);
    nb_tensor *c = nb_matmul(nb_mul_scalar(a, 2.0), b); /* [[20, 26], [56, 80]] */
    nb_tensor *s = nb_sum(c, NULL, 0, false);
    int ok = s && nb_item_f64(s) == 182.0;
    if (!ok) fprintf(stderr, "tensor_only: %s\n", s ? "wrong result" : nb_last_error());
    int arg = 1;
    bool idx = argc > 2 && strcmp(argv[1], "--idx") == 0;
    if (ok && (idx || (argc > 2 && strcmp(argv[1], "--safetensors") == 0))) {
        arg = 3;
        nb_tensor *r = NULL;
        if (idx) {
            r = nb_idx_write(argv[2], c) == NB_OK ? nb_idx_read(argv[2]) : NULL;
        } else {
            const char *names[] = {"c"};
            nb_safetensors *f = nb_safetensors_save(argv[2], names, &c, 1, NULL, NULL, 0) == NB_OK
                                    ? nb_safetensors_open(argv[2])
                                    : NULL;
            r = f ? nb_safetensors_get_copy(f, "c") : NULL;
            nb_safetensors_close(f);
        }
        nb_tensor *rs = r ? nb_sum(r, NULL, 0, false) : NULL;
        ok = rs && nb_item_f64(rs) == 182.0;
        if (!ok) fprintf(stderr, "tensor_only: %s\n", rs ? "wrong round trip" : nb_last_error());
    }
    nb_scope_end();
    if (argc > arg && strcmp(argv[arg], "--maps") == 0) print_maps();
    return ok ? 0 : 1;
}
