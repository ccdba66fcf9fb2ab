/* placeholder: the suite lands with its module */
#include "testutil.h"
Suite *nb_suite_nn_conv(void) { return suite_create("nn_conv"); }
