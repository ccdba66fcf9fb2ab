/* place.c - the memory of placement records (tensor/place.h): reference counted, released
 * with the last tensor header that carries one. What a record says is parallel/placement.c's
 * business. */
#include <stdlib.h>

#include "tensor/place.h"

nb__place *nb__place_new(void) {
    nb__place *pl = calloc(1, sizeof *pl);
    if (!pl) {
        nb__error(NB_ENOMEM, "placement: out of memory");
        return NULL;
    }
    atomic_init(&pl->refs, 1);
    return pl;
}

nb__place *nb__place_retain(nb__place *pl) {
    if (pl) atomic_fetch_add(&pl->refs, 1);
    return pl;
}

void nb__place_release(nb__place *pl) {
    if (!pl || atomic_fetch_sub(&pl->refs, 1) != 1) return;
    nb_tensor_free(pl->shard_grad);
    nb_tensor_free(pl->shard_value);
    free(pl);
}

void nb__tensor_set_place(nb_tensor *t, nb__place *pl) {
    if (!t) return;
    nb__place *old = t->place;
    t->place = nb__place_retain(pl);
    nb__place_release(old);
}
