/* zero_state.c - the parts of nb_zero (parallel/zero.c) that read the shard optimizer as a
 * whole: its state gathered into and scattered from the template optimizer (for savers and
 * loaders of whole optimizer states), and the norm of a model split over other groups that
 * carries no placements yet (zoo/gpt_tp.c, zoo/gpt_pipe.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nabla/autograd.h"
#include "nabla/io.h"
#include "nabla/parallel.h"
#include "optim/optim_impl.h"
#include "parallel/zero_impl.h"
#include "tensor/tensor_impl.h"

/* ---- a model that is itself split over a second group, without placements ---------------------
 * (zoo/gpt_tp.c and zoo/gpt_pipe.c until they are placed on a mesh.) Two passes of
 * nb__clip_grad_norm_global over the shard's gradients (through aliases: headers without a
 * placement whose gradient is the piece's, so the norm is not taken over the pieces' mesh):
 * the counted ones with no clipping (its reduce step does the allreduces and keeps the global
 * sum), then all of them, its reduce step replaced by that sum. */
typedef struct clip2 {
    nb_comm *c[3];
    double total;
} clip2;

static nb_status reduce_two(double *total, bool max, void *ctx) {
    clip2 *q = ctx;
    nb_status s = NB_OK;
    for (int i = 0; i < 3 && s == NB_OK; i++) {
        if (!q->c[i] || nb_comm_size(q->c[i]) == 1) continue;
        nb_tensor *t = nb_from_buffer(total, (int64_t[]){1}, 1, NB_F64);
        s = t ? nb_allreduce(q->c[i], t, max ? NB_REDUCE_MAX : NB_REDUCE_SUM) : nb_last_status();
        if (s == NB_OK) *total = *(const double *)nb_data(t);
        nb_tensor_free(t ? nb__scope_take(t) : NULL);
    }
    q->total = *total;
    return s;
}

static nb_status reduce_fixed(double *total, bool max, void *ctx) {
    (void)max;
    *total = ((const clip2 *)ctx)->total;
    return NB_OK;
}

double nb__zero_clip_grad_norm_ex(nb_zero *z, double max_norm, double norm_type,
                                  nb_comm *model_comm, nb_comm *model_comm2, const bool *skip) {
    static const char who[] = "zero_clip_grad_norm";
    if (!z) return nb__error(NB_ENULL, "%s: zero is NULL", who);
    const nb_params *mp = nb_parameters(z->m);
    if (!mp) return nb_last_status();
    if (!z->ddp) {
        nb_status s = nb__reducer_check(z->r, who, 0);
        if (s != NB_OK) return s;
    }
    /* stage 0: the model's whole (averaged) gradients; else the shard's pieces */
    const nb_params *all = z->ddp ? mp : nb_optim_params(z->inner);
    if (!all) return nb_last_status();
    nb_tensor **ts = calloc((size_t)all->count + 1, sizeof *ts);
    nb_tensor **as = calloc((size_t)all->count + 1, sizeof *as);
    const char **ns = calloc((size_t)all->count + 1, sizeof *ns);
    nb_status s = ts && as && ns ? NB_OK : nb__error(NB_ENOMEM, "%s: out of memory", who);
    nb_params counted = {.tensors = ts, .names = ns}, every = {.tensors = as, .names = all->names};
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    for (int q = 0; q < all->count && s == NB_OK; q++) {
        nb_tensor *t = all->tensors[q];
        nb_tensor *a = nb_view(t, t->shape, t->ndim);
        s = a ? nb_set_grad(a, nb_grad(t)) : nb_last_status();
        as[every.count++] = a;
        int i = q;
        if (!z->ddp) { /* the piece's parameter */
            int j = 0;
            while (j < z->npieces && z->pieces[j] != t) j++;
            i = j < z->npieces ? z->piece_param[j] : -1;
        }
        if (skip && i >= 0 && i < mp->count && skip[i]) continue;
        ts[counted.count] = a;
        ns[counted.count++] = all->names[q];
    }
    clip2 q = {.c = {z->ddp ? NULL : z->c, model_comm, model_comm2}};
    double norm = s == NB_OK ? nb__clip_grad_norm_global(&counted, INFINITY, norm_type, who,
                                                         reduce_two, &q)
                             : (double)s;
    if (!(norm < 0)) norm = nb__clip_grad_norm_global(&every, max_norm, norm_type, who, reduce_fixed, &q);
    nb_scope_end();
    nb_set_grad_enabled(prev);
    free(ts);
    free(as);
    free((void *)ns);
    return norm;
}

/* ---- the whole optimizer state through the template ------------------------------------------
 * Gather: per state slot (and the master copies), one flat buffer of the model's size gets
 * this rank's pieces at their places (zeros elsewhere) and is summed over the ranks (the
 * shards tile the buffer); the step counts go by a max. The whole tensors are loaded into
 * the template with nb_optim_load_state. Scatter: the template's state is cut into this
 * rank's pieces (io/zero_ckpt.c's rule), loaded into the shard optimizer, and dropped. */
static int inner_index(const nb_zero *z, int j) {
    for (int q = 0; q < z->inner->nparams; q++)
        if (z->inner->params[q].t == z->pieces[j]) return q;
    return -1;
}

static char *state_name(const char *slot, const char *param) {
    size_t n = strlen(slot) + strlen(param) + 2;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s.%s", slot, param);
    return s;
}

nb_status nb_zero_gather_optim_state(nb_zero *z) {
    static const char who[] = "zero_gather_optim_state";
    if (!z) return nb__error(NB_ENULL, "%s: zero is NULL", who);
    if (z->ddp) return NB_OK; /* stage 0: the template holds the state itself */
    if (z->stage == 3 || z->offload)
        return nb__error(NB_EINVAL, "%s: stages 1 and 2 without offload_optimizer only (stage "
                         "%d%s): use nb_zero_checkpoint_save", who, z->stage,
                         z->offload ? ", offload" : "");
    const nb_params *mp = nb_parameters(z->m);
    const nb__optim_kind *k = z->inner->kind;
    const int nslot = k->nslots + 1; /* the last: master copies */
    const int64_t N = nb_numel(z->flat_p);
    const nb_dtype wdt = nb__opt_work_dtype(z->dtype);
    nb_state_list l = {0};
    /* per parameter (on some rank): has state, its step count, and which slots it has
     * (flags[(2 + sl) np + i]; a slot can be unused in some groups) */
    const int64_t nf = (int64_t)(2 + nslot) * z->np;
    double *flags = calloc((size_t)nf + 1, sizeof *flags);
    nb_status s = flags ? NB_OK : nb__error(NB_ENOMEM, "%s: out of memory", who);
    for (int j = 0; j < z->npieces && s == NB_OK; j++) {
        int q = inner_index(z, j);
        const nb__oparam *op = q >= 0 ? &z->inner->params[q] : NULL;
        if (!op || !op->has_state) continue;
        const int i = z->piece_param[j];
        flags[i] = 1;
        if ((double)op->step > flags[z->np + i]) flags[z->np + i] = (double)op->step;
        for (int sl = 0; sl < nslot; sl++)
            if (sl < k->nslots ? op->slot[sl] != NULL : op->master != NULL)
                flags[(2 + sl) * z->np + i] = 1;
    }
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_tensor *ft = s == NB_OK ? nb_from_buffer(flags, (int64_t[]){nf}, 1, NB_F64) : NULL;
    if (s == NB_OK && !ft) s = nb_last_status();
    if (s == NB_OK && z->size > 1) s = nb_allreduce(z->c, ft, NB_REDUCE_MAX);
    if (s == NB_OK) memcpy(flags, nb_data(ft), sizeof *flags * (size_t)nf);
    for (int sl = 0; sl < nslot && s == NB_OK; sl++) {
        const double *has = flags + (size_t)(2 + sl) * (size_t)z->np;
        bool any = false; /* some rank holds this slot (the same answer on every rank) */
        for (int i = 0; i < z->np; i++) any = any || has[i] > 0;
        if (!any) continue;
        nb_tensor *flat = nb_zeros_on(z->dev, (int64_t[]){N}, 1, wdt);
        if (!flat) s = nb_last_status();
        for (int j = 0; j < z->npieces && s == NB_OK; j++) {
            int q = inner_index(z, j);
            nb_tensor *src = q < 0 || !z->inner->params[q].has_state ? NULL
                             : sl < k->nslots ? z->inner->params[q].slot[sl]
                                              : z->inner->params[q].master;
            if (!src) continue;
            nb_tensor *dst = nb_narrow(flat, 0, z->p[z->piece_param[j]].off + z->piece_lo[j],
                                       nb_numel(src));
            nb_tensor *v = nb_view(src, (int64_t[]){nb_numel(src)}, 1);
            s = dst && v ? nb_copy_(dst, v) : nb_last_status();
        }
        if (s == NB_OK && z->size > 1) s = nb_allreduce(z->c, flat, NB_REDUCE_SUM);
        for (int i = 0; i < z->np && s == NB_OK; i++) {
            if (!(flags[i] > 0) || !(has[i] > 0)) continue;
            nb_tensor *w = nb_narrow(flat, 0, z->p[i].off, z->p[i].n);
            w = w ? nb_view(w, z->p[i].t->shape, z->p[i].t->ndim) : NULL;
            char *name = state_name(sl < k->nslots ? k->slot_names[sl] : "master", mp->names[i]);
            s = !w ? nb_last_status() : !name ? nb__error(NB_ENOMEM, "%s: out of memory", who)
                                               : nb_state_list_add(&l, NULL, name, w);
            free(name);
        }
    }
    for (int i = 0; i < z->np && s == NB_OK && k->has_step; i++) {
        if (!(flags[i] > 0)) continue;
        nb_tensor *t = nb_scalar(flags[z->np + i], NB_I64);
        char *name = state_name("step", mp->names[i]);
        s = !t ? nb_last_status() : !name ? nb__error(NB_ENOMEM, "%s: out of memory", who)
                                           : nb_state_list_add(&l, NULL, name, t);
        free(name);
    }
    /* the groups' hyperparameters: the template's own (nb_optim_state names them) */
    const nb_params *us = s == NB_OK ? nb_optim_state(z->user) : NULL;
    if (s == NB_OK && !us) s = nb_last_status();
    for (int e = 0; us && s == NB_OK && e < us->count; e++)
        if (strncmp(us->names[e], "param_groups.", 13) == 0)
            s = nb_state_list_add(&l, NULL, us->names[e], us->tensors[e]);
    if (s == NB_OK)
        s = nb_optim_load_state(z->user, (const char *const *)l.names, l.tensors, l.count);
    if (us) nb_optim_state_release(z->user);
    nb_scope_end();
    nb_set_grad_enabled(prev);
    nb_state_list_deinit(&l);
    free(flags);
    return s;
}

nb_status nb_zero_scatter_optim_state(nb_zero *z) {
    static const char who[] = "zero_scatter_optim_state";
    if (!z) return nb__error(NB_ENULL, "%s: zero is NULL", who);
    if (z->ddp) return NB_OK;
    if (z->stage == 3 || z->offload)
        return nb__error(NB_EINVAL, "%s: stages 1 and 2 without offload_optimizer only (stage "
                         "%d%s)", who, z->stage, z->offload ? ", offload" : "");
    const nb_params *mp = nb_parameters(z->m);
    const nb_params *us = nb_optim_state(z->user);
    if (!us || !mp) return nb_last_status();
    nb_state_list mine = {0};
    nb_status s = NB_OK;
    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    for (int e = 0; s == NB_OK && e < us->count; e++) {
        const char *name = us->names[e];
        nb_tensor *t = us->tensors[e];
        if (strncmp(name, "param_groups.", 13) == 0) {
            s = nb_state_list_add(&mine, NULL, name, t);
            continue;
        }
        const char *dot = strchr(name, '.');
        for (int j = 0; dot && s == NB_OK && j < z->npieces; j++) {
            if (strcmp(mp->names[z->piece_param[j]], dot + 1) != 0) continue;
            if (t->ndim == 0) {
                s = nb_state_list_add(&mine, NULL, name, t);
                break;
            }
            nb_tensor *c = nb_contiguous(t);
            nb_tensor *flat = c ? nb_view(c, (int64_t[]){nb_numel(t)}, 1) : NULL;
            nb_tensor *piece = flat ? nb_narrow(flat, 0, z->piece_lo[j], nb_numel(z->pieces[j])) : NULL;
            s = piece ? nb_state_list_add(&mine, NULL, name, piece) : nb_last_status();
            break;
        }
    }
    if (s == NB_OK)
        s = nb_optim_load_state(z->inner, (const char *const *)mine.names, mine.tensors, mine.count);
    nb_optim_state_release(z->user);
    nb_scope_end();
    nb_set_grad_enabled(prev);
    nb_state_list_deinit(&mine);
    if (s == NB_OK) {
        nb__zero_copy_groups(z);
        for (int i = 0; i < z->user->nparams; i++) nb__oparam_reset(&z->user->params[i]);
    }
    return s;
}
