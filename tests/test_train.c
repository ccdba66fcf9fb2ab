/* placeholder: the suite lands with its module */
#include "testutil.h"
Suite *nb_suite_train(void) { return suite_create("train"); }
