/* device.c - the --device flag of the bundled programs (device.h). */
#include "device.h"

#include <nabla/cuda.h>

#include <stdlib.h>
#include <string.h>

bool nbm_device_args(const char *prog, int *argc, char **argv, nbm_device *d) {
    *d = (nbm_device){.flag = NULL, .dev = NB_CPU};
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--device")) {
            argv[out++] = argv[i];
            continue;
        }
        if (d->flag) { /* the same rule as every flag (guard.h, nbm_repeated) */
            fprintf(stderr, "%s: --device is given more than once; give each flag once\n", prog);
            return false;
        }
        const char *v = i + 1 < *argc ? argv[++i] : NULL;
        if (!v) {
            fprintf(stderr, "%s: --device needs a value (see --help)\n", prog);
            return false;
        }
        nb_device dev;
        bool ok = !strcmp(v, "cpu") || !strcmp(v, "cuda") ||
                  (!strncmp(v, "cuda:", 5) && nb_device_parse(v, &dev) == NB_OK);
        if (!ok) {
            fprintf(stderr, "%s: --device must be cpu, cuda or cuda:N, got \"%s\"\n", prog, v);
            return false;
        }
        d->flag = v;
    }
    argv[out] = NULL;
    *argc = out;
    return true;
}

void nbm_device_usage(FILE *out) {
    fprintf(out,
            "device:\n"
            "  --device D       cpu, cuda:N, or cuda: the GPU of the rank's local rank under\n"
            "                   mpirun (GPU 0 without a launcher); the model, optimizer state\n"
            "                   and batches live there (default cpu; docs/cuda.md)\n");
}

/* The rank's index among the processes of its machine, from the launcher's environment;
 * 0 without one. */
static int local_rank(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                       "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID",
                                       "LOCAL_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

bool nbm_device_use(const char *prog, nbm_device *d) {
    if (!d->flag || !strcmp(d->flag, "cpu")) {
        d->dev = NB_CPU;
        return true;
    }
    int n = nb_cuda_device_count();
    if (!strcmp(d->flag, "cuda")) {
        d->dev = NB_CUDA(n > 0 ? local_rank() % n : 0);
    } else {
        (void)nb_device_parse(d->flag, &d->dev);
    }
    if (n == 0) {
        (void)nb_cuda_set_device(d->dev.index); /* the reason, as the last error */
        fprintf(stderr, "%s: --device %s: no usable GPU (%s)\n", prog, d->flag, nb_last_error());
        return false;
    }
    if (d->dev.index >= n) {
        fprintf(stderr, "%s: --device %s: this machine has %d GPU%s\n", prog, d->flag, n,
                n == 1 ? "" : "s");
        return false;
    }
    if (nb_cuda_set_device(d->dev.index) != NB_OK) {
        fprintf(stderr, "%s: --device %s: %s\n", prog, d->flag, nb_last_error());
        return false;
    }
    nb_set_default_device(d->dev);
    return true;
}

nb_tensor *nbm_on_device(nb_tensor *t) {
    if (!t) return NULL;
    nb_device d = nb_default_device(), td = nb_tensor_device(t);
    if (nb_device_equal(td, d)) return t;
    return nb_to_device(t, d);
}

const char *nbm_device_name(const nbm_device *d) {
    static char buf[32];
    if (nb_device_name(d->dev, buf, sizeof buf) == NULL) return "?";
    return buf;
}
