/* handle.c - the live/released marks and the quarantine of the library's object handles
 * (tensor/handle.h): one mechanism for every object type, as tensor.c has for tensors. */
#include "tensor/handle.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/asan.h"
#include "tensor/error.h"

static const struct {
    const char *name, *free_fn;
} kinds[NB__OBJ_KINDS] = {
    [NB__OBJ_MODULE] = {"module", "nb_module_free"},
    [NB__OBJ_OPTIM] = {"optimizer", "nb_optim_free"},
    [NB__OBJ_SCHED] = {"schedule", "nb_sched_free"},
    [NB__OBJ_SCALER] = {"grad scaler", "nb_grad_scaler_free"},
    [NB__OBJ_LOADER] = {"loader", "nb_loader_free"},
    [NB__OBJ_GENERATOR] = {"generator", "nb_generator_free"},
    [NB__OBJ_COMM] = {"communicator", "nb_comm_free"},
    [NB__OBJ_WORK] = {"work handle", "nb_work_wait or nb_work_free"},
    [NB__OBJ_CKPT_WRITER] = {"checkpoint writer", "nb_checkpoint_writer_free"},
    [NB__OBJ_SAFETENSORS] = {"safetensors file", "nb_safetensors_close"},
};

const char *nb__obj_name(nb__obj_kind kind) {
    return kind > 0 && kind < NB__OBJ_KINDS ? kinds[kind].name : "object";
}

void nb__obj_init(nb__obj *h, nb__obj_kind kind, size_t size) {
    h->magic = NB__OBJ_LIVE;
    h->kind = (uint16_t)kind;
    h->size = (uint32_t)size;
}

void *nb__obj_alloc(size_t size, nb__obj_kind kind) {
    nb__obj *h = calloc(1, size < sizeof *h ? sizeof *h : size);
    if (h) nb__obj_init(h, kind, size);
    return h;
}

/* The quarantine: a FIFO of released objects; the oldest leaves (is freed) when it is full. */
static struct {
    pthread_mutex_t mu;
    nb__obj *ring[NB__OBJ_QUARANTINE];
    int head, n;
} g_q = {.mu = PTHREAD_MUTEX_INITIALIZER};

void nb__obj_free(void *obj) {
    nb__obj *h = obj, *out = NULL;
    if (!h) return;
    h->magic = NB__OBJ_FREED;
    NB__POISON((char *)h + sizeof *h, h->size > sizeof *h ? h->size - sizeof *h : 0);
    pthread_mutex_lock(&g_q.mu);
    if (g_q.n == NB__OBJ_QUARANTINE) {
        out = g_q.ring[g_q.head];
        g_q.head = (g_q.head + 1) % NB__OBJ_QUARANTINE;
        g_q.n--;
    }
    g_q.ring[(g_q.head + g_q.n) % NB__OBJ_QUARANTINE] = h;
    g_q.n++;
    pthread_mutex_unlock(&g_q.mu);
    if (out) {
        NB__UNPOISON(out, out->size > sizeof *out ? out->size : sizeof *out);
        free(out);
    }
}

bool nb__obj_ok(const void *obj, nb__obj_kind kind, const char *op) {
    const nb__obj *h = obj;
    if (h && h->magic == NB__OBJ_LIVE && h->kind == kind) return true;
    const char *name = nb__obj_name(kind);
    if (!h) {
        if (nb_last_status() == NB_OK) nb__error(NB_ENULL, "%s: the %s is NULL", op, name);
    } else if (h->magic == NB__OBJ_FREED && h->kind == kind) {
        nb__error(NB_EFREED, "%s: %s used after %s (a freed handle)", op, name,
                  kinds[kind].free_fn);
    } else {
        nb__error(NB_EFREED, "%s: the handle is not a live %s (released long ago, or another "
                  "kind of object)", op, name);
    }
    return false;
}
