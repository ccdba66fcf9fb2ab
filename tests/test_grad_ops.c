/* placeholder: the suite lands with its module */
#include "testutil.h"
Suite *nb_suite_grad_ops(void) { return suite_create("grad_ops"); }
