/* nccl_none.c - the plugin without NCCL (-Dnccl=disabled, or NCCL not found): version 0,
 * and every other NCCL entry of the plugin table fails with NB_EUNSUPPORTED, so libnabla's
 * NCCL communicator backend (parallel/comm_nccl.c) reports why instead of crashing. */
#include "cuda/cuda_impl.h"
#include "tensor/error.h"

#define NONE(what)                                                                         \
    nb__error(NB_EUNSUPPORTED, "%s: the CUDA plugin was built without NCCL (reconfigure "  \
              "with -Dnccl=enabled where NCCL is installed)", what)

long nb__cuda_nccl_version(void) { return 0; }
const char *nb__cuda_nccl_why(void) { return "the plugin was built without NCCL"; }
nb_status nb__cuda_nccl_unique_id(void *id) {
    (void)id;
    return NONE("nccl_unique_id");
}
nb__nccl_comm *nb__cuda_nccl_comm_new(int device, int nranks, int rank, const void *id) {
    (void)device, (void)nranks, (void)rank, (void)id;
    NONE("nccl_comm_new");
    return NULL;
}
nb__nccl_comm *nb__cuda_nccl_comm_split(nb__nccl_comm *c, int color, int key) {
    (void)c, (void)color, (void)key;
    NONE("nccl_comm_split");
    return NULL;
}
int nb__cuda_nccl_comm_poll(nb__nccl_comm *c) {
    (void)c;
    return NONE("nccl_comm_poll");
}
void nb__cuda_nccl_comm_abort(nb__nccl_comm *c) { (void)c; }
void nb__cuda_nccl_comm_free(nb__nccl_comm *c, double seconds) { (void)c, (void)seconds; }
nb__nccl_op *nb__cuda_nccl_start(nb__nccl_comm *c, const nb__nccl_call *call, double seconds) {
    (void)c, (void)call, (void)seconds;
    NONE("nccl_start");
    return NULL;
}
int nb__cuda_nccl_op_poll(nb__nccl_op *op) {
    (void)op;
    return NONE("nccl_op_poll");
}
nb_status nb__cuda_nccl_op_finish(nb__nccl_op *op) {
    (void)op;
    return NONE("nccl_op_finish");
}
void nb__cuda_nccl_op_free(nb__nccl_op *op) { (void)op; }
