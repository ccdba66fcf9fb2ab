/* cpu/ompenv.c - libnabla_ompenv: bounds how long the OpenMP runtime's idle threads spin.
 *
 * libgomp reads OMP_WAIT_POLICY and GOMP_SPINCOUNT once, in its own constructor, and has no
 * call to change them later. Left unset, an idle libgomp thread spins for about 300000
 * polls (milliseconds) after every parallel region, taking a core from whatever else runs:
 * with another process busy on one of 2 cores, 2 threads then ran several times slower
 * than 1 (docs/threads.md). This tiny library has one constructor that sets
 * OMP_WAIT_POLICY=PASSIVE (idle threads sleep at once) unless the user set OMP_WAIT_POLICY
 * or GOMP_SPINCOUNT themselves. (Measured with a core busy: GOMP_SPINCOUNT=10000 still
 * cost 2-4x, 100 about 1.2-1.7x, passive none; nabla's own hot loops run on its own
 * workers, cpu/workers.c, which spin briefly themselves.) libnabla (and every program linked with it) lists it after libgomp among its
 * needed libraries, and the dynamic loader runs the constructors of later-listed libraries
 * first, so this one runs before libgomp reads the environment. tools/check-threads checks
 * that it does, on the bundled programs. */
#include <stdlib.h>

__attribute__((constructor)) static void nb_ompenv_init(void) {
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT"))
        setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
}

/* Referenced by the stub library so that linkers which drop unused libraries keep it. */
int nb__ompenv_init_linked(void);
int nb__ompenv_init_linked(void) { return 1; }
