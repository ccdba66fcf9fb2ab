/* state.c - state dicts: named tensor lists (nb_state_list), the checked copy of a file's
 * tensors into existing tensors (nb_state_load), and module save/load in PyTorch's
 * state_dict naming. The checkpoint code builds on the same pieces. Loading writes into
 * tensors of any device (through the copy kernels); on the meta device it checks names and
 * shapes and copies nothing. */
#include <stdlib.h>
#include <string.h>

#include "nabla/autograd.h"
#include "nabla/io.h"
#include "tensor/tensor_impl.h"

/* ---- nb_state_list ------------------------------------------------------------------------------- */
void nb_state_list_init(nb_state_list *l) {
    if (l) memset(l, 0, sizeof *l);
}

void nb_state_list_deinit(nb_state_list *l) {
    if (!l) return;
    for (int i = 0; i < l->count; i++) {
        free(nb__unconst(l->names[i]));
        nb_tensor_free(l->tensors[i]);
    }
    free((void *)l->names);
    free(l->tensors);
    memset(l, 0, sizeof *l);
}

nb_status nb_state_list_add(nb_state_list *l, const char *prefix, const char *name, nb_tensor *t) {
    if (!l || !name)
        return nb__error(NB_ENULL, "state_list_add: %s is NULL", l ? "name" : "the list");
    if (!t) {
        if (nb_last_status() == NB_OK)
            nb__error(NB_ENULL, "state_list_add: tensor \"%s\" is NULL", name);
        return nb_last_status();
    }
    if (l->count == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        const char **names = realloc((void *)l->names, sizeof(char *) * (size_t)cap);
        if (names) l->names = names;
        nb_tensor **ts = names ? realloc(l->tensors, sizeof(nb_tensor *) * (size_t)cap) : NULL;
        if (!ts) return nb__error(NB_ENOMEM, "state_list_add: out of memory");
        l->tensors = ts;
        l->cap = cap;
    }
    size_t lp = prefix ? strlen(prefix) : 0, ln = strlen(name);
    char *full = malloc(lp + ln + 1);
    if (!full) return nb__error(NB_ENOMEM, "state_list_add: out of memory");
    if (lp) memcpy(full, prefix, lp);
    memcpy(full + lp, name, ln + 1);
    l->names[l->count] = full;
    l->tensors[l->count++] = nb_tensor_retain(t);
    return NB_OK;
}

nb_status nb_state_list_add_params(nb_state_list *l, const char *prefix, const nb_params *p) {
    if (!p) {
        if (nb_last_status() == NB_OK) nb__error(NB_ENULL, "state_list_add_params: params is NULL");
        return nb_last_status();
    }
    for (int i = 0; i < p->count; i++) {
        nb_status s = nb_state_list_add(l, prefix, p->names[i], p->tensors[i]);
        if (s != NB_OK) return s;
    }
    return NB_OK;
}

nb_status nb_state_list_add_module(nb_state_list *l, const char *prefix, nb_module *m) {
    if (!m) return nb__error(NB_ENULL, "state_list_add_module: module is NULL");
    nb_status s = nb_state_list_add_params(l, prefix, nb_parameters(m));
    return s != NB_OK ? s : nb_state_list_add_params(l, prefix, nb_buffers(m));
}

nb_status nb_state_list_add_file(nb_state_list *l, nb_safetensors *f, const char *prefix) {
    if (!l || !f)
        return nb__error(NB_ENULL, "state_list_add_file: %s is NULL", l ? "f" : "the list");
    size_t lp = prefix ? strlen(prefix) : 0;
    for (int i = 0; i < nb_safetensors_count(f); i++) {
        const char *name = nb_safetensors_name(f, i);
        if (lp && strncmp(name, prefix, lp) != 0) continue;
        nb_scope_begin();
        nb_tensor *t = nb_safetensors_get(f, name);
        nb_status s = t ? nb_state_list_add(l, NULL, name + lp, t) : nb_last_status();
        nb_scope_end();
        if (s != NB_OK) return s;
    }
    return NB_OK;
}

/* ---- loading into existing tensors --------------------------------------------------------------- */
/* "prefix" + "name" into a malloc'ed string (NULL when out of memory). */
static char *joined(const char *prefix, const char *name) {
    size_t lp = prefix ? strlen(prefix) : 0, ln = strlen(name);
    char *s = malloc(lp + ln + 1);
    if (!s) return NULL;
    if (lp) memcpy(s, prefix, lp);
    memcpy(s + lp, name, ln + 1);
    return s;
}

static bool same_shape(const nb_safetensors_info *in, const nb_tensor *t) {
    if (in->ndim != nb_ndim(t)) return false;
    for (int d = 0; d < in->ndim; d++)
        if (in->shape[d] != nb_shape(t)[d]) return false;
    return true;
}

/* The shared body of nb_state_load and the module loads: op names the caller in messages and
 * holder says whose tensors they are ("the module"). */
static nb_status state_load(nb_safetensors *f, const char *prefix, const char *const *names,
                            nb_tensor *const *tensors, int n, bool strict, const char *op,
                            const char *holder) {
    if (!f) return nb__error(NB_ENULL, "%s: the file handle is NULL", op);
    if (n < 0) return nb__error(NB_EINVAL, "%s: negative count %d", op, n);
    if (n > 0 && (!names || !tensors))
        return nb__error(NB_ENULL, "%s: %s is NULL", op, names ? "tensors" : "names");
    const char *path = nb_safetensors_path(f);
    int count = nb_safetensors_count(f);
    int *src = malloc(sizeof(int) * (size_t)(n ? n : 1));       /* file index per tensor, or -1 */
    bool *used = calloc((size_t)(count ? count : 1), sizeof(bool)); /* file tensors matched */
    nb_status st = NB_OK;
    if (!src || !used) st = nb__error(NB_ENOMEM, "%s: out of memory", op);

    /* First check everything, so a failed load leaves every tensor as it was. */
    int missing = 0;
    char *first_missing = NULL;
    for (int i = 0; st == NB_OK && i < n; i++) {
        if (!names[i] || !tensors[i]) {
            st = nb__error(NB_ENULL, "%s: %s[%d] is NULL", op, names[i] ? "tensors" : "names", i);
            break;
        }
        char *full = joined(prefix, names[i]);
        if (!full) {
            st = nb__error(NB_ENOMEM, "%s: out of memory", op);
            break;
        }
        src[i] = nb_safetensors_find(f, full);
        if (src[i] < 0) {
            if (missing++ == 0) first_missing = full;
            else free(full);
            continue;
        }
        used[src[i]] = true;
        nb_safetensors_info in;
        nb_safetensors_info_at(f, src[i], &in);
        if (!same_shape(&in, tensors[i])) {
            char fs[NB__SHAPE_STR];
            nb__shape_str(in.shape, in.ndim < NB_MAX_DIMS ? in.ndim : NB_MAX_DIMS, fs);
            st = nb__error(NB_ESHAPE, "%s: tensor \"%s\" has shape %s%s in %s, but %s expects %s",
                           op, full, fs, in.ndim > NB_MAX_DIMS ? " (and more dims)" : "", path,
                           holder, NB__SHAPE(tensors[i]));
        } else if (!in.supported) {
            st = nb__error(NB_EDTYPE, "%s: tensor \"%s\" in %s has dtype %s, which nabla does not "
                           "support", op, full, path, in.dtype_name);
        }
        free(full);
    }
    if (st == NB_OK && strict && missing > 0) {
        if (missing == 1)
            st = nb__error(NB_EINVAL, "%s: %s has no tensor \"%s\"", op, path, first_missing);
        else
            st = nb__error(NB_EINVAL, "%s: %s has no tensor \"%s\" (and %d more are missing)", op,
                           path, first_missing, missing - 1);
    }
    if (st == NB_OK && strict) {
        size_t lp = prefix ? strlen(prefix) : 0;
        int unexpected = 0;
        const char *first = NULL;
        for (int j = 0; j < count; j++) {
            const char *name = nb_safetensors_name(f, j);
            if (used[j] || (lp && strncmp(name, prefix, lp) != 0)) continue;
            if (unexpected++ == 0) first = name;
        }
        if (unexpected == 1)
            st = nb__error(NB_EINVAL, "%s: %s has tensor \"%s\", which %s does not have (strict "
                           "load)", op, path, first, holder);
        else if (unexpected > 1)
            st = nb__error(NB_EINVAL, "%s: %s has tensor \"%s\" and %d more that %s does not have "
                           "(strict load)", op, path, first, unexpected - 1, holder);
    }
    free(first_missing);

    /* Then copy, converting dtypes, with grad mode off (the tensors may be parameters).
     * nb_copy_ bumps each tensor's version: a graph that saved one refuses to backpropagate
     * through the loaded values. */
    if (st == NB_OK) {
        bool prev = nb_set_grad_enabled(false);
        for (int i = 0; st == NB_OK && i < n; i++) {
            if (src[i] < 0) continue;
            nb_scope_begin();
            nb_tensor *t = nb_safetensors_get(f, nb_safetensors_name(f, src[i]));
            /* The file's tensor is a host tensor: bring it to the target's device first (on
             * meta that keeps only its shape, so loading a meta model checks shapes). */
            if (t) t = nb_to_device(t, nb__device_of(tensors[i]));
            st = t ? nb_copy_(tensors[i], t) : nb_last_status();
            nb_scope_end();
        }
        nb_set_grad_enabled(prev);
    }
    free(src);
    free(used);
    return st;
}

nb_status nb_state_load(nb_safetensors *f, const char *prefix, const char *const *names,
                        nb_tensor *const *tensors, int n, bool strict) {
    return state_load(f, prefix, names, tensors, n, strict, "state_load", "the destination");
}

/* ---- modules ------------------------------------------------------------------------------------- */
nb_status nb_module_save(nb_module *m, const char *path) {
    if (!m) return nb__error(NB_ENULL, "module_save: module is NULL");
    if (!path) return nb__error(NB_ENULL, "module_save: path is NULL");
    nb_state_list l = {0};
    nb_status st = nb_state_list_add_module(&l, NULL, m);
    /* safetensors.torch.save_model writes this, and Hugging Face loaders look for it. */
    const char *keys[] = {"format"}, *values[] = {"pt"};
    if (st == NB_OK) st = nb_safetensors_save(path, l.names, l.tensors, l.count, keys, values, 1);
    nb_state_list_deinit(&l);
    return st;
}

nb_status nb_module_load_from(nb_module *m, nb_safetensors *f, const char *prefix, bool strict) {
    if (!m) return nb__error(NB_ENULL, "module_load: module is NULL");
    nb_state_list l = {0};
    nb_status st = nb_state_list_add_module(&l, NULL, m);
    if (st == NB_OK)
        st = state_load(f, prefix, l.names, l.tensors, l.count, strict, "module_load", "the module");
    nb_state_list_deinit(&l);
    return st;
}

nb_status nb_module_load(nb_module *m, const char *path, bool strict) {
    if (!m) return nb__error(NB_ENULL, "module_load: module is NULL");
    if (!path) return nb__error(NB_ENULL, "module_load: path is NULL");
    nb_safetensors *f = nb_safetensors_open(path);
    if (!f) return nb_last_status();
    nb_status st = nb_module_load_from(m, f, NULL, strict);
    nb_safetensors_close(f);
    return st;
}
