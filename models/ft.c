/* ft.c - the bundled programs' graceful stop (ft.h). */
#include "ft.h"

#include <math.h>
#include <stdio.h>

void nbm_stop_begin(const char *prog) {
    if (nb_stop_install() != NB_OK)
        fprintf(stderr, "%s: warning: %s (a signal ends the run without a checkpoint)\n", prog,
                nb_last_error());
}

double nbm_step_sync(nb_comm *world, double v, int *stop) {
    int size = world ? nb_comm_size(world) : 1;
    if (!world || size == 1) {
        *stop = nb_stop_requested();
        return v;
    }
    if (nb_stop_sync(world, &v, stop) != NB_OK) return NAN;
    return v / size;
}

const char *nbm_stop_json(int stop) {
    static char buf[96];
    if (!stop) return "";
    snprintf(buf, sizeof buf, ", \"stopped\": \"signal\", \"signal\": \"%s\"",
             nb_stop_signal_name(stop));
    return buf;
}

int nbm_stop_status(int stop) { return stop ? 128 + stop : 0; }
