/* placeholder: the suite lands with its module */
#include "testutil.h"
Suite *nb_suite_optim(void) { return suite_create("optim"); }
