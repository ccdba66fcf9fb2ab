/* placeholder: the suite lands with its module */
#include "testutil.h"
Suite *nb_suite_nn_layers(void) { return suite_create("nn_layers"); }
