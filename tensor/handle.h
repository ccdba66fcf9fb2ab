/* tensor/handle.h - private: live and released handles of the library's objects (modules,
 * optimizers, schedules, loss scalers, loaders, generators, communicators, works,
 * checkpoint writers, safetensors files), detected the way tensors' are (tensor_impl.h).
 *
 * Each such struct starts with an nb__obj header: allocate it with nb__obj_alloc and release
 * it with nb__obj_free (instead of calloc and free), and start each public function taking
 * one with a check:
 *
 *     struct nb_sched { nb__obj h; ... };
 *     nb_sched *s = nb__obj_alloc(sizeof *s, NB__OBJ_SCHED);        // zeroed, live
 *     nb_status nb_sched_step(nb_sched *s) {
 *         if (!nb__obj_ok(s, NB__OBJ_SCHED, "sched_step")) return nb_last_status();
 *     ...
 *     nb__obj_free(s);                                               // marked, quarantined
 *
 * A released object's memory is not given back at once: it waits in a quarantine of the last
 * NB__OBJ_QUARANTINE released objects (handle.c), marked released, so a handle used after
 * its release gets an error value ("sched_step: schedule used after nb_sched_free (a freed
 * handle)") instead of reading memory a new object may own; under ASan the rest of a waiting
 * object is poisoned, so code that skips the check is still reported. A handle released
 * longer ago than the quarantine is read as any dangling pointer is. */
#ifndef NABLA_TENSOR_HANDLE_H
#define NABLA_TENSOR_HANDLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum nb__obj_kind {
    NB__OBJ_MODULE = 1,
    NB__OBJ_OPTIM,
    NB__OBJ_SCHED,
    NB__OBJ_SCALER,
    NB__OBJ_LOADER,
    NB__OBJ_GENERATOR,
    NB__OBJ_COMM,
    NB__OBJ_WORK,
    NB__OBJ_CKPT_WRITER,
    NB__OBJ_SAFETENSORS,
    NB__OBJ_KINDS
} nb__obj_kind;

#define NB__OBJ_LIVE 0x6e626f6cu  /* "nbol" */
#define NB__OBJ_FREED 0x6e626f66u /* released */
#define NB__OBJ_QUARANTINE 256

typedef struct nb__obj {
    uint32_t magic; /* NB__OBJ_LIVE while the object lives */
    uint16_t kind;  /* nb__obj_kind */
    uint16_t pad_;
    uint32_t size;  /* of the whole object (for the quarantine's ASan poisoning) */
} nb__obj;

/* A zeroed object of size bytes whose first member is an nb__obj, marked live; NULL (no error
 * set) when out of memory. */
void *nb__obj_alloc(size_t size, nb__obj_kind kind);
/* Mark a header live (objects that are not nb__obj_alloc's: static or recycled ones). */
void nb__obj_init(nb__obj *h, nb__obj_kind kind, size_t size);
/* Mark obj released and put it in the quarantine (the oldest waiting one is freed). NULL:
 * nothing. Only for nb__obj_alloc's objects. */
void nb__obj_free(void *obj);
/* Whether obj is a live object of this kind, without an error. */
static inline bool nb__obj_live(const void *obj, nb__obj_kind kind) {
    const nb__obj *h = (const nb__obj *)obj;
    return h && h->magic == NB__OBJ_LIVE && h->kind == kind;
}
/* Whether obj is a live object of this kind; otherwise the error (NB_ENULL for NULL, keeping
 * an error already set; NB_EFREED for a released or foreign handle, naming op and the kind)
 * and false. */
bool nb__obj_ok(const void *obj, nb__obj_kind kind, const char *op);
/* "checkpoint writer", "nb_checkpoint_writer_free" */
const char *nb__obj_name(nb__obj_kind kind);

#endif
