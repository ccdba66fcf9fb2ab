/* shard_ckpt.c - pieces the sharded checkpoints of zoo/gpt_pipe.c and zoo/gpt_tp.c share
 * (declared in zoo/gpt_impl.h). */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "nabla/nabla.h"
#include "zoo/gpt_impl.h"

nb_status nb__zoo_agree(nb_comm *c, nb_status st, const char *what) {
    if (!c || nb_comm_size(c) < 2) return st;
    nb_scope_begin();
    nb_tensor *t = nb_scalar(st == NB_OK ? 0 : 1, NB_I32);
    nb_status cs = t ? nb_allreduce(c, t, NB_REDUCE_MAX) : nb_last_status();
    bool bad = cs != NB_OK || nb_item_i64(t) != 0;
    nb_scope_end();
    if (cs != NB_OK) return cs;
    if (bad && st == NB_OK)
        st = nb_set_error(NB_EIO, "%s: another rank failed (see its message)", what);
    return st;
}

uint64_t nb__zoo_fresh_id(void) {
    uint64_t v = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &v, sizeof v) != (ssize_t)sizeof v) v = 0;
        close(fd);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return v ^ ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40);
}

void nb__zoo_remove_old_files(const char *dir, const char *prefix, const char *id) {
    DIR *d = opendir(dir);
    if (!d) return;
    char keep[96];
    snprintf(keep, sizeof keep, "%s%s-", prefix, id);
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0 ||
            strncmp(e->d_name, keep, strlen(keep)) == 0)
            continue;
        char path[4600];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
}
