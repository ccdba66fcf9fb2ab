/* device.h - the --device flag of the bundled programs (gpt, mlp, cnn): where the model,
 * its optimizer state and the batches live. "cpu" (default), "cuda:N", or "cuda", which
 * under a launcher (mpirun, srun, torchrun) is the GPU of the rank's local rank (modulo
 * the GPUs present) and GPU 0 otherwise. The device becomes the library's default device
 * (nb_set_default_device), so everything the program creates is made there and each
 * batch is copied there. */
#ifndef NABLA_MODELS_DEVICE_H
#define NABLA_MODELS_DEVICE_H

#include <stdbool.h>
#include <stdio.h>

#include <nabla/nabla.h>

typedef struct nbm_device {
    const char *flag; /* the value given, NULL when --device was not given */
    nb_device dev;    /* resolved by nbm_device_use */
} nbm_device;

/* Take --device VALUE out of argv (like nbm_guard_args); false after saying why on stderr. */
bool nbm_device_args(const char *prog, int *argc, char **argv, nbm_device *d);
/* The flag's lines of --help. */
void nbm_device_usage(FILE *out);
/* Resolve the device (the local rank for "cuda") and make it the default device; false
 * after saying why on stderr ("gpt: --device cuda:0: no usable GPU (...)"). */
bool nbm_device_use(const char *prog, nbm_device *d);
/* t on the default device: t itself when it is there, else a copy there (owned by the
 * current scope); NULL passes through. For the batches of a loader, which its prefetch
 * thread makes on the CPU. */
nb_tensor *nbm_on_device(nb_tensor *t);
/* The device in words ("cpu", "cuda:1"): static storage. */
const char *nbm_device_name(const nbm_device *d);

#endif
