/* comm_probe.c - a program linked to the shared libnabla that asks for the world
 * communicator, for tools/check-embed: under mpirun the MPI plugin (libnabla-mpi.so) must
 * load on this first use and an allreduce must sum over the ranks; without a launcher it
 * must stay a size-1 world that maps no MPI; without the plugin, an error value. Public API
 * only.
 *
 * Prints, one per line: "result: ok" or "result: <status name>", "error: <message>" (empty
 * when none), "size: <world size>", "sum: <allreduce of rank + 1 over the ranks>" and
 * "mpi_mapped: <the MPI, hwloc, libevent and plugin libraries mapped, or none>". Exit status
 * 0 unless the collective gave a wrong sum (an error value is a normal outcome). */
#include <nabla/nabla.h>
#include <stdio.h>
#include <string.h>

static void print_mapped(void) {
    static const char *const libs[] = {"libnabla-mpi.so", "libmpi.so", "libopen-pal",
                                       "libopen-rte",     "libhwloc",  "libevent"};
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096], seen[512] = "";
    while (f && fgets(line, sizeof line, f))
        for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++)
            if (strstr(line, libs[i]) && !strstr(seen, libs[i])) {
                size_t n = strlen(seen);
                snprintf(seen + n, sizeof seen - n, "%s%s", n ? " " : "", libs[i]);
            }
    if (f) fclose(f);
    printf("mpi_mapped: %s\n", seen[0] ? seen : "none");
}

int main(void) {
    int bad = 0;
    nb_comm *world = nb_comm_world();
    if (!world) {
        nb_status st = nb_last_status();
        printf("result: %s\nerror: %s\n", nb_status_name(st), nb_last_error());
    } else {
        int rank = nb_comm_rank(world), size = nb_comm_size(world);
        nb_scope_begin();
        nb_tensor *t = nb_full((int64_t[]){1}, 1, NB_F32, rank + 1);
        nb_status st = nb_allreduce(world, t, NB_REDUCE_SUM);
        double sum = st == NB_OK ? nb_item_f64(t) : -1;
        bad = st == NB_OK && sum != size * (size + 1) / 2.0;
        printf("result: %s\nerror: %s\nsize: %d\nsum: %g\n", st == NB_OK ? "ok" : nb_status_name(st),
               st == NB_OK ? "" : nb_last_error(), size, sum);
        nb_scope_end();
        nb_comm_free(world);
    }
    print_mapped();
    return bad;
}
