// tests/cuda_host/main.cu - runs every family's host checks (cuhost.h) and prints
// "<pct>%: Checks: N, Failures: F, Errors: 0"; exit status 1 on any failure. Needs no GPU.
#include <stdio.h>
#include <string.h>

#include "cuhost.h"

int main(int argc, char **argv) {
    cuhost total = {0, 0, "all"};
#define CUHOST_RUN(f)                                                                      \
    if (argc < 2 || strcmp(argv[1], #f) == 0) {                                             \
        cuhost t = {0, 0, #f};                                                             \
        cuhost_##f(&t);                                                                    \
        printf("%-10s %ld checks, %ld failures\n", #f, t.checks, t.failures);             \
        total.checks += t.checks;                                                          \
        total.failures += t.failures;                                                      \
    }
    CUHOST_FAMILIES(CUHOST_RUN)
#undef CUHOST_RUN
    long pct = total.checks ? (total.checks - total.failures) * 100 / total.checks : 100;
    printf("%ld%%: Checks: %ld, Failures: %ld, Errors: 0\n", pct, total.checks, total.failures);
    return total.failures ? 1 : 0;
}
