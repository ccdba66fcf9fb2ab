/* tensor/autocast.h - private: how ops apply the autocast policy (nabla/autocast.h).
 *
 * An op of the LOW or F32 list passes each floating input through nb__autocast at its start,
 * before it records anything, so the tape holds the cast and gradients flow back through it:
 *
 *     x = nb__autocast(x, NB_AUTOCAST_LOW);    // x itself, or a cast owned by the scope
 *
 * The check costs one thread-local load when autocast is off. */
#ifndef NABLA_TENSOR_AUTOCAST_H
#define NABLA_TENSOR_AUTOCAST_H

#include "nabla/autocast.h"

/* The dtype of the innermost scope when autocast is on, NB_F32 when off. */
extern _Thread_local nb_dtype nb__ac_dtype;

nb_tensor *nb__autocast_slow(nb_tensor *t, nb_autocast_policy p);
static inline nb_tensor *nb__autocast(nb_tensor *t, nb_autocast_policy p) {
    return nb__ac_dtype == NB_F32 || !t ? t : nb__autocast_slow(t, p);
}

/* Turns autocast off on this thread until nb__autocast_resume(the returned value) (the
 * engine, around the backward rules). */
nb_dtype nb__autocast_suspend(void);
void nb__autocast_resume(nb_dtype prev);

/* For a forward replayed inside a backward (autograd/recompute.c): autocast as dt (the dtype
 * the original forward ran under; NB_F32 = off) whatever the engine suspended, until
 * nb__autocast_replay_end(the returned token). A token < 0: it failed, error set. */
int nb__autocast_replay_begin(nb_dtype dt);
void nb__autocast_replay_end(int token);

#endif
