/* cpu/ompenv_stub.c - libnabla_ompenv: a library with no code of its own but its list of
 * needed libraries, libgomp and then libnabla_ompenv_init (cpu/ompenv.c). The dynamic
 * loader runs a later-listed library's constructor first, so this order makes
 * libnabla_ompenv_init's constructor run before libgomp reads its environment, whatever
 * order the program that links nabla names its own libraries in. */
int nb__ompenv_init_linked(void);
int nb__ompenv_linked(void);
int nb__ompenv_linked(void) { return nb__ompenv_init_linked(); }
