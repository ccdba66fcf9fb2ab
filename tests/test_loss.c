/* placeholder: the suite lands with its module */
#include "testutil.h"
Suite *nb_suite_loss(void) { return suite_create("loss"); }
