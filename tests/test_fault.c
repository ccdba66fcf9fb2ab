/* test_fault.c - fault tolerance (docs/checkpoints.md): the graceful stop's signal handling
 * (nabla/stop.h). The programs' use of it is checked end to end by tools/check-stop. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nabla/stop.h"
#include "testutil.h"

/* A signal only records the request; the process goes on; the agreement on one rank is
 * the local request; uninstall restores the default action. */
START_TEST(test_stop_signal_recorded) {
    nb_stop_request(0);
    ck_assert_int_eq(nb_stop_requested(), 0);
    ck_assert_msg(nb_stop_install() == NB_OK, "%s", nb_last_error());
    ck_assert(nb_stop_install() == NB_OK); /* again: a no-op */
    raise(SIGTERM);
    ck_assert_int_eq(nb_stop_requested(), SIGTERM);
    nb_comm *world = nb_comm_world(); /* one rank in the unit tests */
    ck_assert(world && nb_comm_size(world) == 1);
    double v = 3.5;
    int sig = -1;
    ck_assert(nb_stop_sync(world, &v, &sig) == NB_OK);
    ck_assert(v == 3.5 && sig == SIGTERM);
    ck_assert_int_eq(nb_stop_sync(world, &v, NULL), NB_ENULL);
    nb_clear_error();
    nb_comm_free(world);
    ck_assert_str_eq(nb_stop_signal_name(SIGTERM), "SIGTERM");
    ck_assert_str_eq(nb_stop_signal_name(SIGUSR1), "SIGUSR1");
    ck_assert_str_eq(nb_stop_signal_name(40), "signal 40");
    nb_stop_request(0);
    ck_assert_int_eq(nb_stop_requested(), 0);
    nb_stop_request(SIGUSR1);
    ck_assert_int_eq(nb_stop_requested(), SIGUSR1);
    nb_stop_uninstall();
    ck_assert_int_eq(nb_stop_requested(), 0);
    /* the previous (default) action is back: SIGUSR1 ends a child */
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) {
        raise(SIGUSR1);
        _exit(0);
    }
    int status;
    ck_assert(waitpid(pid, &status, 0) == pid);
    ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGUSR1);
}
END_TEST

/* A second signal while the first is pending ends the process at once with 128 + signal. */
START_TEST(test_stop_second_signal_exits) {
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY); /* the handler's message */
        if (fd >= 0) dup2(fd, STDERR_FILENO);
        if (nb_stop_install() != NB_OK) _exit(1);
        raise(SIGINT);
        if (nb_stop_requested() != SIGINT) _exit(2);
        raise(SIGINT);
        _exit(3); /* not reached */
    }
    int status;
    ck_assert(waitpid(pid, &status, 0) == pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGINT, "status %d", status);
}
END_TEST

Suite *nb_suite_fault(void) {
    Suite *s = suite_create("fault");
    TCase *tc = tcase_create("stop");
    tcase_add_test(tc, test_stop_signal_recorded);
    tcase_add_test(tc, test_stop_second_signal_exits);
    suite_add_tcase(s, tc);
    return s;
}
