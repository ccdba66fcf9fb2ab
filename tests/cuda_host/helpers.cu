// tests/cuda_host/helpers.cu - cuda/khelp.h compiled by nvcc's host side
// (tests/cuda_host/helpers_checks.h; tests/test_cuda_host.c runs the same checks on gcc's).
#include "helpers_checks.h"

void cuhost_helpers(cuhost *t) { helpers_checks(t); }
