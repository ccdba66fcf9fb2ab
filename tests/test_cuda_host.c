/* test_cuda_host.c - the CUDA backend's shared index and number math (cuda/khelp.h) as gcc
 * compiles it, checked on the host like tests/cuda_host/ checks nvcc's build of it: the
 * same checks (tests/cuda_host/helpers_checks.h), so both compilers' versions agree with
 * the CPU backend. Runs in every build, with or without CUDA. */
#include <check.h>

#include "testutil.h"

#include "cuda_host/helpers_checks.h"

START_TEST(test_khelp) {
    cuhost t = {0, 0, "helpers"};
    helpers_checks(&t);
    ck_assert_int_gt(t.checks, 5);
    ck_assert_int_eq(t.failures, 0);
}
END_TEST

Suite *nb_suite_cuda_host(void) {
    Suite *s = suite_create("cuda_host");
    TCase *tc = tcase_create("khelp");
    tcase_add_test(tc, test_khelp);
    suite_add_tcase(s, tc);
    return s;
}
