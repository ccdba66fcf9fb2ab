// tests/cuda_host/main.cu - runs every family's host checks (cuhost.h), prints each
// family's count of checks and failures, then "<pct>%: Checks: N, Failures: F, Errors: 0"
// with N the families run and F those with a failure; exit status 1 on any failure.
// Needs no GPU.
#include <stdio.h>
#include <string.h>

#include "cuhost.h"

int main(int argc, char **argv) {
    cuhost total = {0, 0, "all"};
    long families = 0, failed = 0;
#define CUHOST_RUN(f)                                                                      \
    if (argc < 2 || strcmp(argv[1], #f) == 0) {                                             \
        cuhost t = {0, 0, #f};                                                             \
        cuhost_##f(&t);                                                                    \
        printf("%-10s %ld checks, %ld failures\n", #f, t.checks, t.failures);             \
        total.checks += t.checks;                                                          \
        total.failures += t.failures;                                                      \
        families++;                                                                        \
        failed += t.failures > 0;                                                          \
    }
    CUHOST_FAMILIES(CUHOST_RUN)
#undef CUHOST_RUN
    // The summary counts families (one test each, as a Check test with many assertions),
    // so make test's total stays a count of tests, not of compared elements.
    printf("all        %ld checks, %ld failures\n", total.checks, total.failures);
    long pct = families ? (families - failed) * 100 / families : 100;
    printf("%ld%%: Checks: %ld, Failures: %ld, Errors: 0\n", pct, families, failed);
    return total.failures ? 1 : 0;
}
